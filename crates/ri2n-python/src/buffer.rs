//! The buffer protocol, for writes from and reads into the caller's own memory (`bytes`,
//! `bytearray`, `memoryview`, `array`, numpy arrays...) without a copy.
//!
//! PyO3 offers it only where the limited API has it, from Python 3.11 on, and this module is
//! one abi3 wheel for 3.9 and later. The two functions used, `PyObject_GetBuffer` and
//! `PyBuffer_Release`, joined the stable ABI in 3.11 as they were (bpo-45459: the `Py_buffer`
//! layout below has not changed since Python 3.3), and every CPython exports them, so they
//! are declared here and resolved from the interpreter when the module loads.

use std::ffi::{c_char, c_int, c_void};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi::{PyObject, Py_ssize_t};
use pyo3::prelude::*;

/// `Py_buffer` of `Include/pybuffer.h`.
#[repr(C)]
struct PyBuffer {
    buf: *mut c_void,
    obj: *mut PyObject,
    len: Py_ssize_t,
    itemsize: Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut Py_ssize_t,
    strides: *mut Py_ssize_t,
    suboffsets: *mut Py_ssize_t,
    internal: *mut c_void,
}

/// Contiguous bytes, read-only: what `socket.send` asks for (`y*`).
const PYBUF_SIMPLE: c_int = 0;
/// Contiguous bytes, writable: what `socket.recv_into` asks for (`w*`).
const PYBUF_WRITABLE: c_int = 1;

extern "C" {
    fn PyObject_GetBuffer(obj: *mut PyObject, view: *mut PyBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut PyBuffer);
}

/// An object's memory, exported through the buffer protocol and held until dropped: holding
/// the export keeps the object alive and its memory in place (a `bytearray` refuses to be
/// resized meanwhile), so the memory can be used with the GIL released.
pub(crate) struct Held {
    view: Box<PyBuffer>,
}

// SAFETY: the export is a pointer and a length into memory that stays valid and in place
// until `PyBuffer_Release`, whichever thread uses it; `Drop` releases it holding the GIL.
unsafe impl Send for Held {}
unsafe impl Sync for Held {}

impl Held {
    fn get(obj: &Bound<'_, PyAny>, flags: c_int) -> PyResult<Self> {
        // boxed: exporters may point into the struct itself, so it must not move
        let mut view = Box::new(PyBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        // SAFETY: a live object and a writable Py_buffer; the GIL is held (`obj` is bound).
        // On failure the exporter raised (TypeError for no buffer, BufferError for one
        // that is not contiguous or not writable) and filled nothing to release.
        if unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) } != 0 {
            return Err(PyErr::take(obj.py()).unwrap_or_else(|| {
                PyBufferError::new_err("the object exported no buffer and said not why")
            }));
        }
        Ok(Self { view })
    }

    /// The contiguous bytes of `obj`, to send from (`bytes`, `bytearray`, a contiguous
    /// `memoryview`...): `TypeError` for an object without them.
    pub(crate) fn readable(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::get(obj, PYBUF_SIMPLE)
    }

    /// The contiguous writable bytes of `obj`, to receive into (`bytearray`, a `memoryview`
    /// of one...): `TypeError`/`BufferError` for read-only ones such as `bytes`.
    pub(crate) fn writable(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::get(obj, PYBUF_WRITABLE)
    }

    pub(crate) fn len(&self) -> usize {
        usize::try_from(self.view.len).unwrap_or(0)
    }

    /// The bytes, to read while the GIL is released. Another Python thread could write to a
    /// mutable buffer meanwhile: as with CPython's own `socket.send`, what goes out then is
    /// that thread's business; the memory itself stays valid (the export pins it).
    pub(crate) fn bytes(&self) -> &[u8] {
        if self.len() == 0 || self.view.buf.is_null() {
            return &[];
        }
        // SAFETY: a contiguous export of `len` bytes at `buf`, valid while `self` holds it.
        unsafe { std::slice::from_raw_parts(self.view.buf as *const u8, self.len()) }
    }

    /// The bytes, to fill while the GIL is released (a `writable` export only).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len() == 0 || self.view.buf.is_null() || self.view.readonly != 0 {
            return &mut [];
        }
        // SAFETY: a writable contiguous export of `len` bytes at `buf`, valid while `self`
        // holds it; `&mut self` makes this the only slice made from it meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.view.buf as *mut u8, self.len()) }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // SAFETY: the export made in `get`, released once, with the GIL held (attaching
        // costs nothing where the caller already holds it, as every user here does).
        Python::attach(|_| unsafe { PyBuffer_Release(&mut *self.view) });
    }
}
