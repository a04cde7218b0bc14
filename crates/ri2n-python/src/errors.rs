//! From ri2n's errors to Python exceptions.
//!
//! The mapping follows what Python programs already catch for sockets: a handshake nobody
//! answered or a wait that ran out is the built-in `TimeoutError`, nothing listening is
//! `ConnectionRefusedError`, a would-block is `BlockingIOError`, an operating-system failure is
//! the `OSError` subclass its errno selects (`FileNotFoundError`, ...), a bad argument is
//! `ValueError`. What only ri2n knows gets a class of `ri2n/_errors.py`: `KeyMismatch` (a
//! `ConnectionError`), `PeerGone` (a `ConnectionResetError`), `NotDelivered`, and `Error` (their
//! base, also raised itself for the rest). A connection's end carries the errno the C
//! interface returns for it ([`ri2n::errno_of`]), as a socket's exception carries one.

use std::io;
use std::path::Path;

use pyo3::exceptions::PyBaseException;
use pyo3::exceptions::{
    PyConnectionAbortedError, PyConnectionRefusedError, PyOSError, PyTimeoutError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use pyo3::PyErrArguments;
use ri2n::{ConnectionError, KeyMismatch};

/// The classes of `ri2n/_errors.py`, imported once.
static ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static KEY_MISMATCH: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static PEER_GONE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static NOT_DELIVERED: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// An exception of the class `name` of `ri2n._errors` (held in `cell`) made with `args` (a
/// message, or an errno and a message), its attributes set by `attrs`. Should that fail (a
/// broken installation), that error is raised.
fn ri2n_exception<A: PyErrArguments + Send + Sync + 'static>(
    py: Python<'_>,
    cell: &PyOnceLock<Py<PyType>>,
    name: &str,
    args: A,
    attrs: impl FnOnce(&Bound<'_, PyBaseException>) -> PyResult<()>,
) -> PyErr {
    let made = cell.import(py, "ri2n._errors", name).and_then(|ty| {
        let err = PyErr::from_type(ty.clone(), args);
        attrs(err.value(py))?;
        Ok(err)
    });
    made.unwrap_or_else(|e| e)
}

/// `ri2n.Error(message)`.
pub(crate) fn error(py: Python<'_>, message: impl Into<String>) -> PyErr {
    ri2n_exception(py, &ERROR, "Error", message.into(), |_| Ok(()))
}

/// The exception for a connection that ended (or never started) with `e`, with the errno
/// a socket's exception would carry (the C interface's: [`ri2n::errno_of`]), for code that
/// checks `e.errno`. `key_file` is the file this side's key came from, named by a
/// `KeyMismatch`.
pub(crate) fn connection_error(
    py: Python<'_>,
    e: &ConnectionError,
    key_file: Option<&Path>,
) -> PyErr {
    let args = (ri2n::errno_of(e), e.to_string());
    match e {
        ConnectionError::KeyMismatch(m) => key_mismatch(py, *m, key_file),
        ConnectionError::PeerGone
        | ConnectionError::PeerRestarted
        | ConnectionError::PeerAborted { .. }
        | ConnectionError::PeerError { .. }
        | ConnectionError::ClosedEarly => {
            ri2n_exception(py, &PEER_GONE, "PeerGone", args, |_| Ok(()))
        }
        ConnectionError::Refused
        | ConnectionError::NotAccepting
        | ConnectionError::ServerFull
        | ConnectionError::WrongApplication { .. } => PyConnectionRefusedError::new_err(args),
        ConnectionError::TimedOut(_)
        | ConnectionError::AllLinksDown
        | ConnectionError::IdleTimeout => PyTimeoutError::new_err(args),
        ConnectionError::LocallyAborted => PyConnectionAbortedError::new_err(args),
        _ => ri2n_exception(py, &ERROR, "Error", args, |_| Ok(())),
    }
}

fn key_mismatch(py: Python<'_>, m: KeyMismatch, key_file: Option<&Path>) -> PyErr {
    let mismatch = match m {
        KeyMismatch::WrongKey => "wrong_key",
        KeyMismatch::KeyRequired => "key_required",
        KeyMismatch::NoKey => "no_key",
        _ => "other",
    };
    // "the peer requires a key (this side has none)" names no file: there is none
    let key_file = key_file.filter(|_| m != KeyMismatch::KeyRequired);
    let mut message = format!("authentication failed: {m}");
    if let Some(f) = key_file {
        message.push_str(&format!(" (this side's key is from {})", f.display()));
    }
    let key_file = key_file.map(|f| f.display().to_string());
    ri2n_exception(
        py,
        &KEY_MISMATCH,
        "KeyMismatch",
        (libc::EACCES, message),
        |e| {
            e.setattr("mismatch", mismatch)?;
            e.setattr("key_file", key_file)
        },
    )
}

/// The exception for an `io::Error` of a connection's calls: a lost connection is told apart
/// by the [`ConnectionError`] inside it.
pub(crate) fn io_error(py: Python<'_>, e: io::Error) -> PyErr {
    if let Some(lost) = e
        .get_ref()
        .and_then(|r| r.downcast_ref::<ConnectionError>())
    {
        return connection_error(py, lost, None);
    }
    if e.raw_os_error().is_some() {
        return os_error(py, &e, None, None);
    }
    match e.kind() {
        // a message or datagram larger than the connection carries
        io::ErrorKind::InvalidInput => PyValueError::new_err(e.to_string()),
        // the peer takes no messages or datagrams; a read error with no kind of its own
        io::ErrorKind::Unsupported | io::ErrorKind::Other => error(py, e.to_string()),
        // with the errno a socket's exception carries, for code that checks `e.errno`
        io::ErrorKind::WouldBlock => PyOSError::new_err((libc::EAGAIN, e.to_string())),
        // written after finish
        io::ErrorKind::BrokenPipe => PyOSError::new_err((libc::EPIPE, e.to_string())),
        // TimedOut -> TimeoutError, without an errno, as a socket's timeout; ...
        _ => PyErr::from(e),
    }
}

/// `OSError(errno, strerror[, filename])` for an operating-system error, so Python picks the
/// subclass the errno names (`FileNotFoundError`, `PermissionError`, `OSError` for
/// EADDRINUSE, ...) and sets `errno` and `filename`; `message` replaces the system's text.
pub(crate) fn os_error(
    py: Python<'_>,
    e: &io::Error,
    message: Option<String>,
    filename: Option<&Path>,
) -> PyErr {
    let Some(errno) = e.raw_os_error() else {
        return PyErr::from(io::Error::new(
            e.kind(),
            message.unwrap_or_else(|| e.to_string()),
        ));
    };
    let message = message.unwrap_or_else(|| strerror(py, errno));
    match filename {
        Some(f) => PyOSError::new_err((errno, message, f.as_os_str().to_os_string())),
        None => PyOSError::new_err((errno, message)),
    }
}

/// The system's text for `errno` as Python words it (`os.strerror`), without the
/// " (os error N)" that Rust's `io::Error` adds.
fn strerror(py: Python<'_>, errno: i32) -> String {
    py.import("os")
        .and_then(|os| os.call_method1("strerror", (errno,)))
        .and_then(|s| s.extract())
        .unwrap_or_else(|_| io::Error::from_raw_os_error(errno).to_string())
}

/// The exception for an endpoint's error. `key_file`: as for [`connection_error`].
pub(crate) fn endpoint_error(py: Python<'_>, e: ri2n::Error, key_file: Option<&Path>) -> PyErr {
    match e {
        ri2n::Error::Bind { addr, source } => {
            let message = match source.raw_os_error() {
                Some(errno) => format!("cannot bind {addr}: {}", strerror(py, errno)),
                None => format!("cannot bind {addr}: {source}"),
            };
            os_error(py, &source, Some(message), None)
        }
        // no remote address, none of the local addresses' family, too many links
        ri2n::Error::Connect(e) => PyValueError::new_err(e.to_string()),
        ri2n::Error::Connection(e) => connection_error(py, &e, key_file),
        ri2n::Error::TimedOut => PyTimeoutError::new_err("timed out"),
        ri2n::Error::NotDelivered { connections, bytes } => ri2n_exception(
            py,
            &NOT_DELIVERED,
            "NotDelivered",
            format!(
                "{connections} connection(s) closed with {bytes} written bytes never acknowledged"
            ),
            |e| {
                e.setattr("connections", connections)?;
                e.setattr("bytes", bytes)
            },
        ),
        ri2n::Error::Io(e) => io_error(py, e),
        other => error(py, other.to_string()),
    }
}
