//! A connection's data calls: the byte stream (`ri2n_read`, `ri2n_write`, `ri2n_finish`),
//! whole messages, unreliable datagrams, their non-blocking `ri2n_try_*` forms, and the
//! readiness descriptor.
//!
//! A message or datagram larger than the caller's buffer is not cut: the call fails with
//! `-EMSGSIZE` and the connection holds it for the next call with a large enough buffer.
//! Threads receiving messages (or datagrams) from one connection take turns ([`Receiving`]),
//! so that the one held is the next for whichever call comes, in order.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use ri2n::fork::Generation;
use ri2n::{Connection, TimedEvent};

use crate::endpoint::timeout;
use crate::error::{guard, guard_int, guard_len, reason_text, Failure};

/// One ri2n connection.
pub struct ri2n_conn {
    conn: Connection,
    /// The calls receiving messages, and the message that did not fit the buffer of one.
    messages: Receiving,
    /// The same for datagrams.
    datagrams: Receiving,
    /// Events taken from the library that the caller's array had no room for.
    pub(crate) events: Mutex<VecDeque<TimedEvent>>,
    /// The process it was made in: a forked child may not use it (see `ri2n::fork`).
    made: Generation,
}

impl ri2n_conn {
    pub(crate) fn new(conn: Connection) -> Self {
        Self {
            conn,
            messages: Receiving::default(),
            datagrams: Receiving::default(),
            events: Mutex::default(),
            made: Generation::now(),
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
    let c = unsafe { c.as_ref() }.ok_or_else(|| Failure::invalid("the connection is NULL"))?;
    match c.made.inherited() {
        false => Ok(c),
        true => Err(Failure::made_before_fork("connection")),
    }
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

/// The calls of C threads receiving one kind of item (messages or datagrams) from a
/// connection, one at a time, and the item that did not fit the buffer of the call that took
/// it, kept for the next. One at a time, the item kept is always the oldest taken, and a call
/// waiting for its turn while another waits for the connection gets the item that other call
/// kept; calls at once would keep items in the order they came back, not the order taken, and
/// one waiting in the connection would not see an item kept meanwhile.
#[derive(Default)]
struct Receiving {
    turn: Mutex<Turn>,
    /// Signalled when a call ends its turn.
    turn_ended: Condvar,
}

#[derive(Default)]
struct Turn {
    /// A call is receiving from the connection (without the lock: it may wait there).
    busy: bool,
    kept: Option<Vec<u8>>,
}

/// How long a receiving call may wait.
#[derive(Clone, Copy)]
enum Wait {
    /// Not at all: `-EAGAIN` where it would.
    Never,
    /// Until the instant (`None`: as long as it takes); `-ETIMEDOUT` at it.
    Until(Option<Instant>),
}

impl Wait {
    fn from_timeout_ms(ms: c_int) -> Self {
        match timeout(ms) {
            Some(Duration::ZERO) => Wait::Never,
            t => Wait::Until(t.and_then(|t| Instant::now().checked_add(t))),
        }
    }
}

impl Receiving {
    /// Delivers the next item into `out`: the one kept, else what `take` receives from the
    /// connection (`None` at its end), waiting at most as `wait` says, first for the turn of
    /// the calls before. An item larger than `out` is kept (`-EMSGSIZE`); `what` names the
    /// kind in errors. `take` is given the time left. A call that does not wait, turned away
    /// by another's turn, runs `turned_away` (`Connection::look_without_receiving`): its
    /// `-EAGAIN` must clear the readiness descriptors as the connection's own would.
    fn receive(
        &self,
        wait: Wait,
        out: &mut [u8],
        what: &str,
        take: impl FnOnce(Wait) -> Result<Option<Vec<u8>>, Failure>,
        turned_away: impl FnOnce(),
    ) -> Result<Option<usize>, Failure> {
        let mut turn = lock(&self.turn);
        while turn.busy {
            turn = match wait {
                Wait::Never => {
                    drop(turn);
                    turned_away();
                    return Err(would_block(what));
                }
                Wait::Until(None) => {
                    (self.turn_ended.wait(turn)).unwrap_or_else(|e| e.into_inner())
                }
                Wait::Until(Some(deadline)) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(Failure::new(
                            libc::ETIMEDOUT,
                            format!("no {what} came within the timeout"),
                        ));
                    }
                    let waited = self.turn_ended.wait_timeout(turn, left);
                    waited.unwrap_or_else(|e| e.into_inner()).0
                }
            };
        }
        if let Some(item) = turn.kept.take() {
            return deliver(item, out, &mut turn, what).map(Some);
        }
        turn.busy = true;
        drop(turn);
        // the turn ends however the call does (a panic, caught at the boundary, included),
        // and an item that does not fit is kept before the next call can take one
        let taken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| take(wait)));
        let mut turn = lock(&self.turn);
        turn.busy = false;
        self.turn_ended.notify_all();
        let taken = taken.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        match taken? {
            Some(item) => deliver(item, out, &mut turn, what).map(Some),
            None => Ok(None),
        }
    }
}

/// `-EAGAIN`: nothing to take now.
fn would_block(what: &str) -> Failure {
    Failure::new(libc::EAGAIN, format!("no whole {what} is there now"))
}

/// Hands `item` over in `out`, or keeps it in `turn` when it does not fit.
fn deliver(item: Vec<u8>, out: &mut [u8], turn: &mut Turn, what: &str) -> Result<usize, Failure> {
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
        turn.kept = Some(item);
        return Err(failure);
    }
    out[..item.len()].copy_from_slice(&item);
    Ok(item.len())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A message's length for `ri2n_recv_message` (0 at the end of the stream): an empty message
/// cannot be told from that end.
fn message_length(received: Option<usize>) -> Result<usize, Failure> {
    match received {
        Some(0) => Err(Failure::new(
            libc::EBADMSG,
            "the peer sent an empty message, which ri2n_recv_message cannot return apart from \
             the end of the stream (0); it was taken: call again for the next",
        )),
        Some(n) => Ok(n),
        None => Ok(0),
    }
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
/// this side sends). Threads receiving messages at once take turns: the message one kept is
/// the next for whichever call comes, in order. `-EBADMSG` for an empty message from a peer
/// in another language, which is skipped.
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
        let wait = Wait::Until(None);
        let received =
            c.messages
                .receive(wait, out, "message", |_| Ok(c.conn.recv_message()?), || {});
        message_length(received?)
    })
}

/// [`ri2n_recv_message`] without waiting: `-EAGAIN` when no whole message is there, or while
/// another thread's call is receiving one (what comes goes to that call).
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
        let received = c.messages.receive(
            Wait::Never,
            out,
            "message",
            |_| Ok(c.conn.try_recv_message()?),
            || c.conn.look_without_receiving(false),
        );
        message_length(received?)
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
/// Threads receiving datagrams at once take turns, as for messages (the wait for the turn
/// counts in `timeout_ms`; with 0, another thread's call receiving gives `-EAGAIN`).
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
        let received = c.datagrams.receive(
            Wait::from_timeout_ms(timeout_ms),
            out,
            "datagram",
            |wait| match wait {
                Wait::Never => Ok(c.conn.try_recv_datagram()?),
                // what is left of the caller's time after its turn came
                Wait::Until(deadline) => {
                    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                    Ok(c.conn.recv_datagram_timeout(left)?)
                }
            },
            || c.conn.look_without_receiving(true),
        );
        received?.ok_or_else(|| {
            Failure::new(
                libc::ENOTCONN,
                "the connection closed and every datagram was read",
            )
        })
    })
}

/// Largest datagram [`ri2n_send_datagram`] accepts, in bytes (negative errno on failure); 0
/// on the TCP transport, which carries none (`ri2n_send_datagram` fails with `EOPNOTSUPP`).
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

/// Ends the connection when no link has been up for `all_links_down_ms` milliseconds, or
/// nothing at all was received from the peer for `idle_ms` (a host gone without a word, its
/// power cut): each negative for never, the default, with which the connection waits out any
/// outage. Its calls then fail with `-ETIMEDOUT`, as does [`ri2n_conn_error`]. Counted from
/// what already happened: links down longer than the new limit end it at once. An idle
/// limit of less than a second may end a healthy connection that has nothing to say (a
/// quiet peer is heard from about every 200 ms). Each call sets both. Returns 0, or `-EINVAL`
/// for a limit of 0 or a NULL connection.
///
/// # Safety
/// `c` is a live connection.
#[no_mangle]
pub unsafe extern "C" fn ri2n_conn_set_timeouts(
    c: *mut ri2n_conn,
    all_links_down_ms: c_int,
    idle_ms: c_int,
) -> c_int {
    guard_int(|| {
        // SAFETY: passed on from the caller
        let c = unsafe { conn(c) }?;
        let limit = |ms: c_int, what: &str| match ms {
            0 => Err(Failure::invalid(format!(
                "{what} 0: a negative limit is none, a positive one milliseconds"
            ))),
            ms => Ok(u64::try_from(ms).ok().map(Duration::from_millis)),
        };
        let all_links_down = limit(all_links_down_ms, "all_links_down_ms")?;
        let idle = limit(idle_ms, "idle_ms")?;
        c.connection().set_timeouts(all_links_down, idle);
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
/// delivered. NULL is ignored. Its sockets and threads may outlive the call by as long
/// (on the TCP transport a socket and a thread per link, until the end is delivered).
///
/// Never free a connection while another thread is in a call on it, or may still start
/// one: as with `close(2)` on a socket, the call is not woken, and it would go on with the
/// freed memory. Wake such calls first with [`ri2n_abort`] (they return `-ECONNABORTED`),
/// wait for them to return, then free.
///
/// # Safety
/// `c` is NULL or a live connection, not used again (by any thread).
#[no_mangle]
pub unsafe extern "C" fn ri2n_conn_free(c: *mut ri2n_conn) {
    if !c.is_null() {
        guard(
            |_| (),
            || {
                // SAFETY: the caller gives up its live connection, made by `Box::into_raw`
                let c = unsafe { Box::from_raw(c) };
                if c.made.inherited() {
                    // the parent's: its memory is let go with this process
                    std::mem::forget(c);
                }
                Ok(())
            },
        )
    }
}
