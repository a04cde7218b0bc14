//! Failures as C sees them: a negative errno value (or NULL) from the call, `errno` set, and
//! the words of the last failure on this thread for [`ri2n_last_error`].
//!
//! Every exported function runs its body through [`guard`], which catches a Rust panic before
//! it can cross into C (unwinding into C is undefined behaviour) and reports it as `EIO`.

use std::borrow::Cow;
use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};

use ri2n::{ConnectionError, Error};

/// One failed call: the errno value it returns (positive here, negated for C) and what to say.
#[derive(Debug)]
pub(crate) struct Failure {
    pub errno: i32,
    pub message: Cow<'static, str>,
}

impl Failure {
    pub fn new(errno: i32, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            errno,
            message: message.into(),
        }
    }

    /// An argument C got wrong.
    pub fn invalid(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(libc::EINVAL, message)
    }

    /// An endpoint or connection (`what`) used in a child forked after it was made: `EBADF`,
    /// as for a descriptor that is not open in this process.
    pub fn made_before_fork(what: &str) -> Self {
        Self::new(
            libc::EBADF,
            format!(
                "this {what} was made before fork(): its threads stayed in the parent, and a \
                 forked child may only free it; make a new one in the child"
            ),
        )
    }

    /// The same failure, its message prefixed with what was being done.
    pub fn context(self, doing: impl std::fmt::Display) -> Self {
        Self::new(self.errno, format!("{doing}: {}", self.message))
    }

    /// A non-blocking call found nothing to do.
    pub fn would_block() -> Self {
        Self::new(
            libc::EAGAIN,
            "not ready now: wait for the descriptor, then retry",
        )
    }

    /// Keeps the message for [`ri2n_last_error`] and sets `errno`, in that order (keeping the
    /// message may allocate, which may touch `errno`).
    fn record(self) -> i32 {
        let text = CString::new(self.message.replace('\0', " "))
            .unwrap_or_else(|_| CString::from(c"(unprintable error)"));
        // (not once this thread's locals are gone: at its exit, or in an `atexit` handler of
        // the main thread; a panic here would cross into C and abort)
        let _ = LAST_ERROR.try_with(|last| *last.borrow_mut() = text);
        // SAFETY: `__errno_location` returns this thread's errno, valid for the thread's life.
        unsafe { *libc::__errno_location() = self.errno };
        self.errno
    }
}

/// A failure of the library's endpoint calls (binding, connecting, accepting, closing).
impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match e {
            Error::Bind { addr, source } => {
                Failure::from(source).context(format_args!("cannot bind {addr}"))
            }
            Error::Connect(e) => Failure::invalid(e.to_string()),
            Error::Connection(e) => Failure::new(ri2n::errno_of(&e), e.to_string()),
            Error::TimedOut => Failure::new(libc::ETIMEDOUT, "timed out"),
            Error::NotDelivered { .. } => Failure::new(libc::ETIMEDOUT, e.to_string()),
            Error::Io(e) => Failure::from(e),
            other => Failure::new(libc::EIO, other.to_string()),
        }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        let errno = errno_of_io(&e);
        let message = match e.kind() {
            io::ErrorKind::WouldBlock => return Failure::would_block(),
            _ => e.to_string(),
        };
        Failure::new(errno, message)
    }
}

/// The errno of an I/O error from a connection call: the connection's own reason where it
/// carries one, the system's errno where there is one, else one for its kind.
fn errno_of_io(e: &io::Error) -> i32 {
    if let Some(inner) = e.get_ref() {
        if let Some(c) = inner.downcast_ref::<ConnectionError>() {
            return ri2n::errno_of(c);
        }
        if let Some(w) = inner.downcast_ref::<ri2n::WriteError>() {
            return match w {
                ri2n::WriteError::ConnectionLost(c) => ri2n::errno_of(c),
                ri2n::WriteError::Finished => libc::EPIPE,
                ri2n::WriteError::MessageTooLarge { .. }
                | ri2n::WriteError::DatagramTooLarge { .. } => libc::EMSGSIZE,
                ri2n::WriteError::MessagesRefused | ri2n::WriteError::DatagramsRefused => {
                    libc::EOPNOTSUPP
                }
                _ => libc::EINVAL,
            };
        }
    }
    if let Some(os) = e.raw_os_error() {
        return os;
    }
    match e.kind() {
        io::ErrorKind::WouldBlock => libc::EAGAIN,
        io::ErrorKind::TimedOut => libc::ETIMEDOUT,
        io::ErrorKind::ConnectionRefused => libc::ECONNREFUSED,
        io::ErrorKind::ConnectionReset => libc::ECONNRESET,
        io::ErrorKind::ConnectionAborted => libc::ECONNABORTED,
        io::ErrorKind::NotConnected => libc::ENOTCONN,
        // a wildcard listen address that no interface address of its family matches
        io::ErrorKind::AddrNotAvailable => libc::EADDRNOTAVAIL,
        io::ErrorKind::AddrInUse => libc::EADDRINUSE,
        io::ErrorKind::NetworkUnreachable => libc::ENETUNREACH,
        io::ErrorKind::HostUnreachable => libc::EHOSTUNREACH,
        io::ErrorKind::BrokenPipe => libc::EPIPE,
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => libc::EINVAL,
        io::ErrorKind::NotFound => libc::ENOENT,
        io::ErrorKind::PermissionDenied => libc::EACCES,
        io::ErrorKind::AlreadyExists => libc::EEXIST,
        io::ErrorKind::Unsupported => libc::EOPNOTSUPP,
        io::ErrorKind::OutOfMemory => libc::ENOMEM,
        _ => libc::EIO,
    }
}

thread_local! {
    /// The words of this thread's last failure; empty before the first.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// This thread's last failure, in words (an empty string before the first). The text stays
/// valid until this thread's next failing ri2n call; successful calls leave it alone.
#[no_mangle]
pub extern "C" fn ri2n_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|last| last.borrow().as_ptr())
        .unwrap_or(c"(not kept: this thread is ending)".as_ptr())
}

/// Runs an exported function's body: its failure, or a panic, is recorded and turned into
/// `on_failure(errno)`.
pub(crate) fn guard<T>(
    on_failure: impl FnOnce(i32) -> T,
    body: impl FnOnce() -> Result<T, Failure>,
) -> T {
    let failure = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => return value,
        Ok(Err(failure)) => failure,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Failure::new(
                libc::EIO,
                format!("internal error in ri2n (a bug, please report): {what}"),
            )
        }
    };
    on_failure(failure.record())
}

/// [`guard`] for a call returning a count: `-errno` on failure.
pub(crate) fn guard_len(body: impl FnOnce() -> Result<usize, Failure>) -> libc::ssize_t {
    guard(
        |e| -(e as libc::ssize_t),
        || body().map(|n| n as libc::ssize_t),
    )
}

/// [`guard`] for a call returning 0 or `-errno`.
pub(crate) fn guard_int(body: impl FnOnce() -> Result<(), Failure>) -> libc::c_int {
    guard(|e| -e, || body().map(|()| 0))
}

/// [`guard`] for a call returning a new object: NULL on failure.
pub(crate) fn guard_ptr<T>(body: impl FnOnce() -> Result<Box<T>, Failure>) -> *mut T {
    guard(|_| std::ptr::null_mut(), || body().map(Box::into_raw))
}

/// A NUL-terminated C string as UTF-8.
///
/// # Safety
/// `s` is NULL or points to a NUL-terminated string that lives for `'a`.
pub(crate) unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if s.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and the caller promises a NUL-terminated string
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

/// An abort's reason: NULL is the empty string, and bytes that are not UTF-8 (text in the
/// locale's encoding, from `strerror`) are replaced, not refused: refusing them would leave
/// the connection unaborted and its peer untold.
///
/// # Safety
/// `s` is NULL or points to a NUL-terminated string that lives for `'a`.
pub(crate) unsafe fn reason_text<'a>(s: *const c_char) -> std::borrow::Cow<'a, str> {
    if s.is_null() {
        return "".into();
    }
    // SAFETY: non-NULL, and the caller promises a NUL-terminated string
    unsafe { CStr::from_ptr(s) }.to_string_lossy()
}
