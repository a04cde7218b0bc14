//! `ri2n._ri2n`: the Python binding of ri2n, the extension module under the `ri2n` package
//! (`python/ri2n/__init__.py` re-exports it, `python/ri2n/aio.py` adds asyncio streams).
//!
//! It is a thin layer over the `ri2n` crate: `key.rs` makes `ri2n.Key`, `endpoint.rs`
//! `ri2n.Endpoint`, `connection.rs` `ri2n.Connection`, `errors.rs` the exceptions and
//! `buffer.rs` the buffer protocol. Three rules hold throughout:
//! - every call that can wait (connect, accept, reads, writes, close) releases the GIL while it
//!   waits, so other Python threads run meanwhile;
//! - data moves through the buffer protocol: a write holds the caller's buffer and the
//!   library copies straight from it, `recv_into` lets the library copy straight into the
//!   caller's buffer (only `recv(n)`, which must make a `bytes`, reads into a `Vec` first);
//! - errors become exceptions (`errors.rs`), never a panic: nothing here unwraps what a user
//!   can influence.

mod buffer;
mod connection;
mod endpoint;
mod errors;
mod key;

use ri2n::fork::Generation;
use std::net::SocketAddr;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// How long a wait runs with the GIL released before it comes back to let Python handle
/// signals (Ctrl-C): reads, `connect`, `accept` and `wait_acknowledged` wake this often,
/// with a timeout or without.
pub(crate) const SIGNAL_CHECK: Duration = Duration::from_millis(200);

/// Addresses as Python passes them: one address or a sequence of them, each an `"ip:port"`
/// string or an `(ip, port)` tuple, as `socket` takes it.
pub(crate) struct Addrs(Vec<String>);

impl<'a, 'py> FromPyObject<'a, 'py> for Addrs {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Some(one) = address(&obj) {
            return Ok(Addrs(vec![one]));
        }
        let wrong = || {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "addresses are \"ip:port\" strings or (ip, port) tuples, one or a list of \
                 them; got {}",
                obj.repr()
                    .map_or_else(|_| "?".to_owned(), |r| r.to_string())
            ))
        };
        let seq = (obj.cast::<pyo3::types::PySequence>()).map_err(|_| wrong())?;
        let mut all = Vec::new();
        for item in seq.try_iter()? {
            all.push(address(&item?.as_borrowed()).ok_or_else(wrong)?);
        }
        Ok(Addrs(all))
    }
}

/// One address: an `"ip:port"` string, or an `(ip, port)` tuple made one.
fn address(obj: &Borrowed<'_, '_, PyAny>) -> Option<String> {
    if let Ok(text) = obj.cast::<pyo3::types::PyString>() {
        return Some(text.to_string_lossy().into_owned());
    }
    let pair = obj.cast::<pyo3::types::PyTuple>().ok()?;
    if pair.len() != 2 {
        return None;
    }
    let host: String = pair.get_item(0).ok()?.extract().ok()?;
    let port: u16 = pair.get_item(1).ok()?.extract().ok()?;
    Some(match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    })
}

impl Addrs {
    /// The socket addresses; `ValueError` naming the first string that is not one.
    pub(crate) fn parse(self) -> PyResult<Vec<SocketAddr>> {
        (self.0.iter())
            .map(|a| {
                a.trim().parse().map_err(|_| {
                    PyValueError::new_err(format!(
                        "not a socket address: {a:?} (expected \"ip:port\", e.g. \
                         \"10.0.1.2:7000\" or \"[fd00::2]:7000\"; names are not resolved)"
                    ))
                })
            })
            .collect()
    }
}

/// A timeout argument: `None` waits for ever (so does infinity); otherwise seconds, at least
/// 0. `ValueError` for a negative or NaN one.
pub(crate) fn timeout_arg(seconds: Option<f64>) -> PyResult<Option<Duration>> {
    match seconds {
        None => Ok(None),
        Some(s) if s.is_nan() || s < 0.0 => Err(PyValueError::new_err(format!(
            "timeout must be None or a number of seconds >= 0, not {s}"
        ))),
        // beyond what a Duration holds (infinity included) is for ever
        Some(s) => Ok(Duration::try_from_secs_f64(s).ok()),
    }
}

/// An abort's code argument: an int from 0 up, of any size (the engine caps what the wire
/// cannot carry, so any larger one is taken as the largest), or what `operator.index` takes.
/// `ValueError` for a negative one, as for other arguments out of range: an integer of fixed
/// width would raise `OverflowError` beyond it, which `except ValueError` misses.
pub(crate) struct AbortCode(pub u64);

impl<'a, 'py> FromPyObject<'a, 'py> for AbortCode {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let index = obj.py().import("operator")?.getattr("index")?;
        let code = index.call1((obj,))?;
        if code.lt(0)? {
            return Err(PyValueError::new_err(format!(
                "code must be >= 0, not {code}"
            )));
        }
        Ok(AbortCode(code.extract::<u64>().unwrap_or(u64::MAX)))
    }
}

/// An abort's reason: any `str`, what does not encode as UTF-8 (a file name `os.fsdecode`
/// escaped) replaced, not refused: refusing it would leave the connection unaborted and its
/// peer untold.
#[derive(Default)]
pub(crate) struct AbortReason(pub String);

impl<'a, 'py> FromPyObject<'a, 'py> for AbortReason {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let text = obj.cast::<pyo3::types::PyString>()?;
        Ok(AbortReason(text.to_string_lossy().into_owned()))
    }
}

/// Drops `value` with the GIL released: the last handle of an endpoint (or its last
/// connection) waits there, up to the endpoint's `close_linger`, for what was written to be
/// delivered, and other Python threads must not stall meanwhile. It runs where no exception
/// can be raised (an object's deallocation), so Ctrl-C is looked for without running
/// Python's handler: it stops the wait (the delivery goes on on its thread while the
/// process lives), and is signalled again for Python to raise `KeyboardInterrupt` after.
/// It waited out the whole linger, and the interrupt with it.
pub(crate) fn drop_detached<T: Send + 'static>(value: T) {
    Python::attach(|py| {
        let dropped = wait_on_thread(
            py,
            "ri2n-drop",
            move || drop(value),
            |()| {},
            // SAFETY (both calls): the GIL is held; they read and clear SIGINT's flag, and
            // set it again
            |_| match unsafe { pyo3::ffi::PyOS_InterruptOccurred() } {
                0 => Ok(()),
                _ => Err(pyo3::exceptions::PyKeyboardInterrupt::new_err(())),
            },
        );
        if dropped.is_err() {
            unsafe { pyo3::ffi::PyErr_SetInterrupt() };
        }
    });
}

/// [`drop_detached`] where Python can take an exception: the wait for delivery runs on a
/// thread of its own, and Ctrl-C stops waiting for it (the delivery goes on there while the
/// process lives).
pub(crate) fn drop_interruptible<T: Send + 'static>(py: Python<'_>, value: T) -> PyResult<()> {
    wait_on_thread(
        py,
        "ri2n-close",
        move || drop(value),
        |()| {},
        |py| py.check_signals(),
    )
}

/// Runs `work` on a thread of its own and waits for what it returns with the GIL released,
/// in slices of [`SIGNAL_CHECK`], calling `check` after each: a library call that cannot
/// wait in slices itself (the TCP transport's handshake, an endpoint's graceful close) is so
/// still given up on Ctrl-C, a cancel or a closed endpoint, whichever `check` raises. Given
/// up, the call runs on to its end on its thread, and what it returns then (or had returned
/// just before) goes to `abandoned`, which undoes it. Where no thread can be started (the
/// process is at its limit), the call runs here, with the GIL released, to its end.
pub(crate) fn wait_on_thread<T: Send + 'static, W: FnOnce() -> T + Send + 'static>(
    py: Python<'_>,
    name: &str,
    work: W,
    abandoned: fn(T),
    mut check: impl FnMut(Python<'_>) -> PyResult<()>,
) -> PyResult<T> {
    let (tx, rx) = mpsc::channel();
    // shared with the thread, so that the work is still at hand when the thread cannot start
    let slot = Arc::new(Mutex::new(Some(work)));
    let theirs = Arc::clone(&slot);
    let started = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let work = theirs.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(work) = work {
                if let Err(mpsc::SendError(late)) = tx.send(work()) {
                    abandoned(late);
                }
            }
        });
    if started.is_err() {
        let work = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(work) = work {
            return Ok(py.detach(work));
        }
    }
    let mut rx = rx;
    loop {
        // the receiver goes to the detached wait and back (it may not be shared)
        let waited;
        (waited, rx) = py.detach(move || (rx.recv_timeout(SIGNAL_CHECK), rx));
        match waited {
            Ok(done) => return Ok(done),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Err(e) = check(py) {
                    // returned between the wait and the check: nobody takes it now
                    if let Ok(late) = rx.try_recv() {
                        abandoned(late);
                    }
                    return Err(e);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err(format!(
                    "{name} ended without an outcome (a panic in the library)"
                )))
            }
        }
    }
}

/// The core object (an endpoint, a connection) a Python object holds until it is closed,
/// and the fork it was made in. A forked child has none of its threads (the driver's, the
/// links'), and locks they held stay held: there it is closed, and let go without a word
/// to the peer (the connection is the parent's), a join or a lock (`os.fork()` after
/// connecting, a child that then exits, panicked or hung waiting on them).
pub(crate) struct Kept<T: Send + Sync> {
    /// `None` once closed. Shared with the calls running without the GIL, so that closing
    /// while another thread waits in a call takes effect when that call returns.
    slot: Mutex<Option<Arc<T>>>,
    made: Generation,
    what: &'static str,
}

impl<T: Send + Sync> Kept<T> {
    /// `what` names it in errors ("endpoint", "connection").
    pub(crate) fn new(value: T, what: &'static str) -> Self {
        Self {
            slot: Mutex::new(Some(Arc::new(value))),
            made: Generation::now(),
            what,
        }
    }

    /// In a child forked after it was made.
    fn left_in_the_parent(&self) -> bool {
        self.made.inherited()
    }

    /// The object for a call, or `ValueError` once closed (or in a forked child).
    pub(crate) fn get(&self) -> PyResult<Shared<T>> {
        if self.left_in_the_parent() {
            return Err(PyValueError::new_err(format!(
                "this {} was made before os.fork(): its threads stayed in the parent, and \
                 here it is closed; make a new one in the child",
                self.what
            )));
        }
        // a poisoned lock still holds a valid Option
        let held = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        (held.clone())
            .map(Shared::new)
            .ok_or_else(|| PyValueError::new_err(format!("the {} is closed", self.what)))
    }

    /// The object, to close it; `None` if it is closed (or in a forked child).
    pub(crate) fn take(&self) -> Option<Arc<T>> {
        if self.left_in_the_parent() {
            return None;
        }
        self.slot.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Whether it is closed (in a forked child it is).
    pub(crate) fn is_closed(&self) -> bool {
        self.left_in_the_parent()
            || self
                .slot
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_none()
    }
}

impl<T: Send + Sync> Drop for Kept<T> {
    fn drop(&mut self) {
        if self.left_in_the_parent() {
            let slot = self.slot.get_mut().unwrap_or_else(|p| p.into_inner());
            std::mem::forget(slot.take());
        }
    }
}

/// What a call holds of a connection (or an endpoint) while it runs. Where it was closed
/// meanwhile (from another thread), the call's handle is the last one, and it lets go as
/// `close()` does: with the GIL released ([`drop_detached`]).
pub(crate) struct Shared<T: Send + Sync + 'static>(Option<Arc<T>>);

impl<T: Send + Sync + 'static> Shared<T> {
    pub(crate) fn new(value: Arc<T>) -> Self {
        Self(Some(value))
    }

    /// Another handle, for a thread that outlives the call ([`wait_on_thread`]).
    pub(crate) fn arc(&self) -> Arc<T> {
        Arc::clone(self.0.as_ref().expect("held until dropped"))
    }
}

impl<T: Send + Sync + 'static> std::ops::Deref for Shared<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.0.as_deref().expect("held until dropped")
    }
}

impl<T: Send + Sync + 'static> Drop for Shared<T> {
    fn drop(&mut self) {
        // only the last of the handles dropping at once gets the value
        if let Some(last) = self.0.take().and_then(Arc::into_inner) {
            drop_detached(last);
        }
    }
}

/// The extension module: `ri2n/__init__.py` re-exports what it defines.
#[pymodule]
fn _ri2n(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<key::PyKey>()?;
    m.add_class::<endpoint::PyEndpoint>()?;
    m.add_class::<connection::PyConnection>()?;
    m.add("MAX_LINKS", ri2n::MAX_LINKS)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
