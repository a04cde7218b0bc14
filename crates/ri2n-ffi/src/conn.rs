//! A connection's data calls: the byte stream (`ri2n_read`, `ri2n_write`, `ri2n_finish`),
//! whole messages, unreliable datagrams, their non-blocking `ri2n_try_*` forms, and the
//! readiness descriptor.
//!
//! A message or datagram larger than the caller's buffer is not cut: the call fails with
//! `-EMSGSIZE` and the connection holds it for the next call with a large enough buffer.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::Mutex;

use ri2n::{Connection, TimedEvent};

use crate::endpoint::timeout;
use crate::error::{guard, guard_int, guard_len, reason_text, Failure};

/// One ri2n connection.
pub struct ri2n_conn {
    conn: Connection,
    /// Messages that did not fit the buffer of the call that took them.
    held_message: Held,
    /// Datagrams that did not fit the buffer of the call that took them.
    held_datagram: Held,
    /// Events taken from the library that the caller's array had no room for.
    pub(crate) events: Mutex<VecDeque<TimedEvent>>,
}

impl ri2n_conn {
    pub(crate) fn new(conn: Connection) -> Self {
        Self {
            conn,
            held_message: Held::default(),
            held_datagram: Held::default(),
            events: Mutex::default(),
        }
    }

    pub(crate) fn connection(&self) -> &Connection {
        &self.conn
    }
}

/// # Safety
/// `c` is NULL or a live connection from this library.
pub(crate) unsafe fn conn<'a>(c: *const ri2n_conn) -> Result<&'a ri2n_conn, Failure> {
    // SAFETY: the caller promises NULL or a live connection
    unsafe { c.as_ref() }.ok_or_else(|| Failure::invalid("the connection is NULL"))
}

/// The bytes C passed in.
///
/// # Safety
/// `buf` is NULL or points to `len` readable bytes that live for `'a`.
unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> Result<&'a [u8], Failure> {
    match (buf.is_null(), len) {
        (_, 0) => Ok(&[]),
        (true, _) => Err(Failure::invalid("the buffer is NULL")),
        // SAFETY: non-NULL; the caller promises `len` bytes; a slice never exceeds isize::MAX
        _ => Ok(unsafe { std::slice::from_raw_parts(buf.cast(), len.min(isize::MAX as usize)) }),
    }
}

/// The buffer C passed in to be filled.
///
/// # Safety
/// `buf` is NULL or points to `len` writable bytes that live for `'a`, used by nobody else.
unsafe fn bytes_mut<'a>(buf: *mut c_void, len: usize) -> Result<&'a mut [u8], Failure> {
    match (buf.is_null(), len) {
        (_, 0) => Ok(&mut []),
        (true, _) => Err(Failure::invalid("the buffer is NULL")),
        // SAFETY: as in `bytes`, and the caller lends the bytes for writing
        _ => {
            Ok(unsafe { std::slice::from_raw_parts_mut(buf.cast(), len.min(isize::MAX as usize)) })
        }
    }
}

/// Messages (or datagrams) taken from the connection that did not fit the buffer of the call
/// that took them, oldest first; each receiving call looks here before it waits. More than one
/// is held only where threads receive at once: the item a second thread could not take then
/// waits behind the first's, not over it.
#[derive(Default)]
struct Held(Mutex<VecDeque<Vec<u8>>>);

impl Held {
    /// The oldest item held, and that it was held; else `None`.
    fn take(&self) -> Option<(Vec<u8>, bool)> {
        lock(&self.0).pop_front().map(|item| (item, true))
    }

    /// Keeps `item` for a later call: first again if it was taken from here (it is still the
    /// oldest), else behind those held.
    fn keep(&self, item: Vec<u8>, was_held: bool) {
        let mut q = lock(&self.0);
        match was_held {
            true => q.push_front(item),
            false => q.push_back(item),
        }
    }
}

/// Hands `item` (a message or datagram; `was_held`: taken from `held`) over in `out`, or keeps
/// it in `held` when it does not fit.
fn deliver(
    (item, was_held): (Vec<u8>, bool),
    out: &mut [u8],
    held: &Held,
    what: &str,
) -> Result<usize, Failure> {
    if item.len() > out.len() {
        let failure = Failure::new(
            libc::EMSGSIZE,
            format!(
                "the next {what} has {} bytes, more than the {}-byte buffer: it is kept for a \
                 call with a larger buffer",
                item.len(),
                out.len()
            ),
        );
        held.keep(item, was_held);
        return Err(failure);
    }
    out[..item.len()].copy_from_slice(&item);
    Ok(item.len())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A message for `ri2n_recv_message`: an empty one cannot be told from the end of the stream.
fn message(msg: (Vec<u8>, bool), out: &mut [u8], c: &ri2n_conn) -> Result<usize, Failure> {
    if msg.0.is_empty() {
        return Err(Failure::new(
            libc::EBADMSG,
            "the peer sent an empty message, which ri2n_recv_message cannot return apart from \
             the end of the stream (0); it was taken: call again for the next",
        ));
    }
    deliver(msg, out, &c.held_message, "message")
}

/// Writes at most `len` bytes of `buf` to the byte stream, waiting until the send buffer takes
/// some (while every link is down too); returns how many it took. `-EPIPE` after
/// [`ri2n_finish`], `-ECONNRESET` when the peer is gone or aborted, `-ETIMEDOUT` when the
/// connection timed out; for `len` 0 too (0 while the stream is open).
///
/// # Safety
/// `c` is a live connection; `buf` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn ri2n_write(
    c: *mut ri2n_conn,
    buf: *const c_void,
    len: usize,
) -> libc::ssize_t {
    guard_len(|| {
        // SAFETY: passed on from the caller
        let (c, data) = unsafe { (conn(c)?, bytes(buf, len)?) };
        // an empty write is a write all the same: it fails where any would (after finish,
        // on a connection that ended), as write(2) of 0 bytes on a socket does
        Ok((&c.conn).write(data)?)
    })
}

/// Reads at most `len` bytes of the byte stream into `buf`, waiting until some are there;
/// returns how many, 0 at the end of the peer's stream (after its [`ri2n_finish`]).
///
/// # Safety
/// `c` is a live connection; `buf` points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ri2n_read(
    c: *mut ri2n_conn,
    buf: *mut c_void,
    len: usize,
) -> libc::ssize_t {
    guard_len(|| {
        // SAFETY: passed on from the caller
        let (c, out) = unsafe { (conn(c)?, bytes_mut(buf, len)?) };
        if out.is_empty() {
            return Ok(0);
        }
        Ok((&c.conn).read(out)?)
    })
}

/// [`ri2n_write`] without waiting: `-EAGAIN` when the send buffer is full.
///
/// # Safety
/// As for [`ri2n_write`].
#[no_mangle]
pub unsafe extern "C" fn ri2n_try_write(
    c: *mut ri2n_conn,
    buf: *const c_void,
    len: usize,
) -> libc::ssize_t {
    guard_len(|| {
        // SAFETY: passed on from the caller
        let (c, data) = unsafe { (conn(c)?, bytes(buf, len)?) };
        Ok(c.conn.try_write(data)?)
    })
}

/// [`ri2n_read`] without waiting: `-EAGAIN` when nothing is there to read.
///
/// # Safety
/// As for [`ri2n_read`].
#[no_mangle]
pub unsafe extern "C" fn ri2n_try_read(
    c: *mut ri2n_conn,
    buf: *mut c_void,
    len: usize,
) -> libc::ssize_t {
    guard_len(|| {
        // SAFETY: passed on from the caller
        let (c, out) = unsafe { (conn(c)?, bytes_mut(buf, len)?) };
        Ok(c.conn.try_read(out)?)
    })
}

/// Sends `len` bytes as one whole message (the peer receives it whole and in order with
/// [`ri2n_recv_message`]), waiting for buffer space; returns `len`. `-EMSGSIZE` above
/// [`ri2n_max_message_size`]; `-EINVAL` for an empty message, which a C receiver could not
/// tell from the end of the stream; `-EOPNOTSUPP` when the peer said it takes no messages
/// (`ri2n recv`, a byte-stream reader, takes none).
///
/// # Safety
/// `c` is a live connection; `buf` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn ri2n_send_message(
    c: *mut ri2n_conn,
    buf: *const c_void,
    len: usize,
) -> libc::ssize_t {
    guard_len(|| {
        // SAFETY: passed on from the caller
        let (c, msg) = unsafe { (conn(c)?, bytes(buf, len)?) };
        check_message(msg)?;
        c.conn.send_message(msg)?;
        Ok(msg.len())
    })
}

fn check_message(msg: &[u8]) -> Result<(), Failure> {
    match msg.is_empty() {
        true => Err(Failure::invalid(
            "an empty message cannot be told from the end of the stream by ri2n_recv_message",
        )),
        false => Ok(()),
    }
}

/// [`ri2n_send_message`] without waiting: `-EAGAIN` when the send buffer has no room for it.
///
/// # Safety
/// As for [`ri2n_send_message`].
#[no_mangle]
pub unsafe extern "C" fn ri2n_try_send_message(
    c: *mut ri2n_conn,
    buf: *const c_void,
    len: usize,
) -> libc::ssize_t {
    guard_len(|| {
        // SAFETY: passed on from the caller
        let (c, msg) = unsafe { (conn(c)?, bytes(buf, len)?) };
        check_message(msg)?;
        c.conn.try_send_message(msg)?;
        Ok(msg.len())
    })
}

/// Receives the next whole message into `buf`, waiting for it; returns its length, 0 at the
/// end of the peer's stream. `-EMSGSIZE` when it is longer than `len`: it is kept for the
/// next call, and [`ri2n_last_error`](crate::ri2n_last_error) names its size (a message is
/// at most this side's stream receive window less 8 bytes: 8 MiB less 8 for the endpoints
/// this library makes, whatever the peer's own [`ri2n_max_message_size`], which bounds what
/// this side sends; where threads receive at once, each message kept waits behind those kept
/// before it).
/// `-EBADMSG` for an empty message from a peer in another language, which is skipped.
///
/// # Safety
/// `c` is a live connection; `buf` points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ri2n_recv_message(
    c: *mut ri2n_conn,
    buf: *mut c_void,
    len: usize,
) -> libc::ssize_t {
    guard_len(|| {
        // SAFETY: passed on from the caller
        let (c, out) = unsafe { (conn(c)?, bytes_mut(buf, len)?) };
        // taken before the call: the lock is not held while it waits
        let next = match c.held_message.take() {
            Some(held) => Some(held),
            None => c.conn.recv_message()?.map(|msg| (msg, false)),
        };
        match next {
            Some(msg) => message(msg, out, c),
            None => Ok(0),
        }
    })
}

/// [`ri2n_recv_message`] without waiting: `-EAGAIN` when no whole message is there.
///
/// # Safety
/// As for [`ri2n_recv_message`].
#[no_mangle]
pub unsafe extern "C" fn ri2n_try_recv_message(
    c: *mut ri2n_conn,
    buf: *mut c_void,
    len: usize,
) -> libc::ssize_t {
    guard_len(|| {
        // SAFETY: passed on from the caller
        let (c, out) = unsafe { (conn(c)?, bytes_mut(buf, len)?) };
        // taken before the call: the lock is not held while it waits
        let next = match c.held_message.take() {
            Some(held) => Some(held),
            None => c.conn.try_recv_message()?.map(|msg| (msg, false)),
        };
        match next {
            Some(msg) => message(msg, out, c),
            None => Ok(0),
        }
    })
}

/// Largest message [`ri2n_send_message`] accepts, in bytes (negative errno on failure).
///
/// # Safety
/// `c` is a live connection.
#[no_mangle]
pub unsafe extern "C" fn ri2n_max_message_size(c: *const ri2n_conn) -> libc::ssize_t {
    // SAFETY: passed on from the caller
    guard_len(|| Ok(unsafe { conn(c) }?.conn.max_message_size()))
}

/// Sends `len` bytes as one unreliable datagram: the peer receives it whole or not at all,
/// at most once, in sending order (after a short wait for a missing one; a late one is still
/// delivered); it is sent once, never repaired after a loss (only one a failing link held is
/// sent once more on another). Does not wait for the links (datagrams wait in a bounded
/// queue, the oldest dropped when it is full); with a sending thread per link that falls
/// behind, it waits for those once the queue is half full (at most the datagram age limit,
/// 20 ms). Returns `len`; `-EMSGSIZE` above
/// [`ri2n_max_datagram_size`]; `-EOPNOTSUPP` when the peer said it takes no datagrams.
///
/// # Safety
/// `c` is a live connection; `buf` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn ri2n_send_datagram(
    c: *mut ri2n_conn,
    buf: *const c_void,
    len: usize,
) -> libc::ssize_t {
    guard_len(|| {
        // SAFETY: passed on from the caller
        let (c, data) = unsafe { (conn(c)?, bytes(buf, len)?) };
        c.conn.send_datagram(data)?;
        Ok(data.len())
    })
}

/// Receives one datagram into `buf`, waiting at most `timeout_ms` (negative: as long as it
/// takes; 0: only looks); returns its length (an empty datagram gives 0). `-ETIMEDOUT` (or
/// `-EAGAIN` with 0) when none came, `-ENOTCONN` once the connection closed cleanly and every
/// datagram was read, `-EMSGSIZE` when it is longer than `len` (kept for the next call). A
/// connection that itself timed out gives `-ETIMEDOUT` at once, every time: a loop that
/// retries on `-ETIMEDOUT` asks [`ri2n_conn_error`] whether the connection still lives.
///
/// # Safety
/// `c` is a live connection; `buf` points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ri2n_recv_datagram(
    c: *mut ri2n_conn,
    buf: *mut c_void,
    len: usize,
    timeout_ms: c_int,
) -> libc::ssize_t {
    guard_len(|| {
        // SAFETY: passed on from the caller
        let (c, out) = unsafe { (conn(c)?, bytes_mut(buf, len)?) };
        let received = match c.held_datagram.take() {
            Some(held) => Some(held),
            None if timeout_ms == 0 => c.conn.try_recv_datagram()?.map(|d| (d, false)),
            None => (c.conn.recv_datagram_timeout(timeout(timeout_ms))?).map(|d| (d, false)),
        };
        match received {
            Some(d) => deliver(d, out, &c.held_datagram, "datagram"),
            None => Err(Failure::new(
                libc::ENOTCONN,
                "the connection closed and every datagram was read",
            )),
        }
    })
}

/// Largest datagram [`ri2n_send_datagram`] accepts, in bytes (negative errno on failure).
///
/// # Safety
/// `c` is a live connection.
#[no_mangle]
pub unsafe extern "C" fn ri2n_max_datagram_size(c: *const ri2n_conn) -> libc::ssize_t {
    // SAFETY: passed on from the caller
    guard_len(|| Ok(unsafe { conn(c) }?.conn.max_datagram_size()))
}

/// Ends this side's streams: no more writes or messages; the peer reads 0 after the last
/// byte. Returns 0, or the negative errno of the connection's end once it ended on an error
/// (nothing will carry this end then).
///
/// # Safety
/// `c` is a live connection.
#[no_mangle]
pub unsafe extern "C" fn ri2n_finish(c: *mut ri2n_conn) -> c_int {
    // SAFETY: passed on from the caller
    guard_int(|| Ok(unsafe { conn(c) }?.conn.finish()?))
}

/// Waits at most `timeout_ms` (negative: as long as it takes) until the peer acknowledged
/// everything written and the end of the streams (call [`ri2n_finish`] first). 0, or
/// `-ETIMEDOUT`, or the errno of the connection's end (`-ETIMEDOUT` too for a connection that
/// timed out: [`ri2n_conn_error`] tells them apart).
///
/// # Safety
/// `c` is a live connection.
#[no_mangle]
pub unsafe extern "C" fn ri2n_wait_acknowledged(c: *mut ri2n_conn, timeout_ms: c_int) -> c_int {
    guard_int(|| {
        // SAFETY: passed on from the caller
        let c = unsafe { conn(c) }?;
        c.conn
            .wait_acknowledged(timeout(timeout_ms))
            .map_err(|e| match e.kind() {
                io::ErrorKind::TimedOut if c.conn.close_reason().is_none() => Failure::new(
                    libc::ETIMEDOUT,
                    format!("not everything was acknowledged within {timeout_ms} ms"),
                ),
                _ => Failure::from(e),
            })
    })
}

/// Whether the connection has ended, and how, as `SO_ERROR` tells of a socket: 0 while it has
/// not (connecting, carrying data, or with every link down but not given up), `-ENOTCONN`
/// once it closed cleanly, else the negative errno its calls now fail with (`-ETIMEDOUT`: it
/// timed out, every link down too long or idle; `-ECONNRESET`: the peer ended it;
/// `-ECONNABORTED`: this side aborted it; `-EPROTO`: a side broke the protocol), with
/// `ri2n_last_error()` naming the reason. A
/// timed call's `-ETIMEDOUT` says either that nothing came in time or that the connection
/// itself timed out: this tells which.
///
/// # Safety
/// `c` is a live connection.
#[no_mangle]
pub unsafe extern "C" fn ri2n_conn_error(c: *const ri2n_conn) -> c_int {
    guard_int(|| {
        // SAFETY: passed on from the caller
        let c = unsafe { conn(c) }?;
        let conn = c.connection();
        if conn.state() != ri2n::ConnectionState::Closed {
            return Ok(());
        }
        Err(match conn.close_reason() {
            Some(reason) => Failure::new(ri2n::errno_of(&reason), reason.to_string()),
            None => Failure::new(libc::ENOTCONN, "the connection closed cleanly"),
        })
    })
}

/// Aborts the connection at once; the peer's calls fail with `ECONNRESET` and see `code` (up
/// to 2^62 - 17; a larger one as that) and `reason` (may be NULL; bytes that are not UTF-8
/// are replaced) in their error text. Returns 0 (or a negative errno).
///
/// # Safety
/// `c` is a live connection; `reason` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ri2n_abort(c: *mut ri2n_conn, code: u64, reason: *const c_char) -> c_int {
    guard_int(|| {
        // SAFETY: passed on from the caller
        let c = unsafe { conn(c) }?;
        // SAFETY: passed on from the caller
        let reason = unsafe { reason_text(reason) };
        c.conn.abort(code, &reason);
        Ok(())
    })
}

/// A descriptor that becomes readable when a retry of a read, receive or write call may
/// succeed (data, a message or a datagram arrived, buffer space was freed, a link changed
/// state, the connection ended). Register it with `poll`/`epoll` for reading; never read or
/// close it. The `ri2n_try_*` calls clear it before they look, so after one returned
/// `-EAGAIN` it becomes readable as soon as retrying may succeed: call them until `-EAGAIN`
/// after each wake-up (it is edge-like). `-EMSGSIZE` is no `-EAGAIN`: the message or
/// datagram kept waits for the next call, with a larger buffer, not for the descriptor,
/// which stays quiet until something else arrives. Valid while `c` lives; remove it from
/// `epoll` (or `poll`) before [`ri2n_conn_free`]: it stays open, and may still signal, until
/// the connection's end, after the free.
///
/// # Safety
/// `c` is a live connection.
#[no_mangle]
pub unsafe extern "C" fn ri2n_conn_fd(c: *const ri2n_conn) -> c_int {
    guard(
        |e| -e,
        // SAFETY: passed on from the caller
        || Ok(unsafe { conn(c) }?.conn.readiness_fd()?.as_raw_fd()),
    )
}

/// A descriptor for the reading calls alone (`ri2n_read`'s and the receiving calls'
/// `ri2n_try_*` forms): readable when a retry may succeed, cleared only by them. With
/// [`ri2n_conn_write_fd`], a reader and a writer that wait apart (two threads, or callbacks
/// per direction) never clear each other's wake-ups, as they could sharing [`ri2n_conn_fd`].
///
/// # Safety
/// `c` is a live connection.
#[no_mangle]
pub unsafe extern "C" fn ri2n_conn_read_fd(c: *const ri2n_conn) -> c_int {
    guard(
        |e| -e,
        // SAFETY: passed on from the caller
        || Ok(unsafe { conn(c) }?.conn.read_readiness_fd()?.as_raw_fd()),
    )
}

/// A descriptor for the writing calls alone (`ri2n_try_write`, `ri2n_try_send_message`):
/// readable when a retry may succeed (room was freed, or the connection changed state),
/// cleared only by them. Call them until `-EAGAIN`: only a refused write makes the connection
/// signal room.
///
/// # Safety
/// `c` is a live connection.
#[no_mangle]
pub unsafe extern "C" fn ri2n_conn_write_fd(c: *const ri2n_conn) -> c_int {
    guard(
        |e| -e,
        // SAFETY: passed on from the caller
        || Ok(unsafe { conn(c) }?.conn.write_readiness_fd()?.as_raw_fd()),
    )
}

/// Frees the connection. Like dropping a Rust connection: the streams are finished and what
/// was written is still delivered in the background while the endpoint lives and the peer
/// is heard from (a peer silent for the endpoint's linger, at least a second and three
/// keepalive intervals, ends it;
/// freeing the endpoint waits for it). Freed after its endpoint, the last connection of the endpoint
/// waits here instead, at most the endpoint's linger (10 s), for what it holds to be
/// delivered. NULL is ignored.
///
/// # Safety
/// `c` is NULL or a live connection, not used again.
#[no_mangle]
pub unsafe extern "C" fn ri2n_conn_free(c: *mut ri2n_conn) {
    if !c.is_null() {
        guard(
            |_| (),
            || {
                // SAFETY: the caller gives up its live connection, made by `Box::into_raw`
                drop(unsafe { Box::from_raw(c) });
                Ok(())
            },
        )
    }
}
