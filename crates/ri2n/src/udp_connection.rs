//! A UDP-transport connection's calls: each runs on the shard's engine under its lock, and
//! blocking ones wait for the driver. [`crate::Connection`] hands its calls here.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use ri2n_proto::{
    Connection as ProtoConnection, ConnectionError, ConnectionHandle, ConnectionState,
    ConnectionStats, ReadError, WriteError,
};

use crate::connection::TimedEvent;
use crate::driver::{Driver, State};
use crate::readiness::{Caller, Interest, Waiting, Watchers};
use crate::shards::Drivers;

/// A connection of the UDP transport: its shard's driver and its handle in that engine.
#[derive(Debug)]
pub(crate) struct UdpConnection {
    driver: Arc<Driver>,
    /// Every shard of the endpoint: they stay until its last connection goes (dropped after
    /// `driver`, so that the last of these drops the drivers, see `shards::Drivers`).
    _shards: Arc<Drivers>,
    handle: ConnectionHandle,
    /// The readiness descriptors, made on first request.
    watchers: Arc<Watchers>,
    /// `watchers` was handed to the driver (on the first descriptor request).
    watched: AtomicBool,
}

/// The error an application sees when the connection ended, as an `io::Error` of a fitting
/// kind: the peer's end is `ConnectionReset` (gone, restarted, or closed before it took
/// everything: what the C library reports as `ECONNRESET` and Python as `PeerGone`), its
/// abort or error `ConnectionAborted`.
pub(crate) fn lost(e: ConnectionError) -> io::Error {
    let kind = match e {
        ConnectionError::PeerRestarted
        | ConnectionError::PeerGone
        | ConnectionError::ClosedEarly => io::ErrorKind::ConnectionReset,
        ConnectionError::AllLinksDown
        | ConnectionError::IdleTimeout
        | ConnectionError::TimedOut(_) => io::ErrorKind::TimedOut,
        ConnectionError::PeerAborted { .. }
        | ConnectionError::PeerError { .. }
        | ConnectionError::LocallyAborted => io::ErrorKind::ConnectionAborted,
        ConnectionError::ProtocolViolation(_) => io::ErrorKind::InvalidData,
        ConnectionError::Refused
        | ConnectionError::ServerFull
        | ConnectionError::NotAccepting
        | ConnectionError::WrongApplication { .. }
        | ConnectionError::KeyMismatch(_) => io::ErrorKind::ConnectionRefused,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

impl UdpConnection {
    pub(crate) fn new(driver: Arc<Driver>, shards: Arc<Drivers>, handle: ConnectionHandle) -> Self {
        Self {
            driver,
            _shards: shards,
            handle,
            watchers: Arc::default(),
            watched: AtomicBool::new(false),
        }
    }

    /// Which of its endpoint's shards (an engine with its driver thread, see
    /// [`Endpoint::shards`](crate::Endpoint::shards)) serves this connection.
    pub(crate) fn shard(&self) -> usize {
        self.driver.shared().shard()
    }

    /// Runs `f` on the engine's connection; then sends what it produced.
    fn with<T>(&self, f: impl FnOnce(&mut ProtoConnection) -> T) -> T {
        let shared = self.driver.shared();
        let mut st = shared.lock();
        let r = f(conn(&mut st, self.handle));
        drop(shared.after_app_call(st));
        r
    }

    /// [`with`](Self::with) for a call that queues datagrams: paced behind the lanes
    /// ([`Shared::pace_datagrams`](crate::driver::Shared::pace_datagrams)).
    fn with_datagrams<T>(&self, f: impl FnOnce(&mut ProtoConnection) -> T) -> T {
        let shared = self.driver.shared();
        let mut st = shared.lock();
        let r = f(conn(&mut st, self.handle));
        st = shared.after_app_call(st);
        drop(shared.pace_datagrams(st, self.handle));
        r
    }

    /// A non-blocking call of kind `interest`: clears its readiness descriptors, then runs `f`
    /// on the engine's connection (both under the lock, so an event after `f` looked signals
    /// them again). What is still there to read, and room a blocked writer was told of, keep
    /// the descriptors of their callers signalled (`Watchers::signal_waiting`), and what is
    /// left of the call's own kind its kind's own (`Watchers::signal_own_kind`).
    fn try_with<T>(&self, caller: Caller, f: impl FnOnce(&mut ProtoConnection) -> T) -> T {
        let shared = self.driver.shared();
        let mut st = shared.lock();
        self.watchers.clear(caller);
        let c = conn(&mut st, self.handle);
        let out = f(c);
        let waiting = Waiting {
            readable: c.has_readable(),
            writer_may_retry: c.writer_may_retry(),
        };
        self.watchers.signal_waiting(caller, waiting);
        let own_left = match caller {
            Caller::ReadStream => c.has_stream_bytes(),
            Caller::ReadMessage => c.has_message(),
            Caller::ReadDatagram => c.has_datagram(),
            Caller::WriteStream | Caller::WriteMessage => false,
        };
        if own_left {
            self.watchers.signal_own_kind(caller);
        }
        drop(shared.after_app_call(st));
        out
    }

    /// The readiness descriptor for `interest` (see [`readiness_fd`](Self::readiness_fd)).
    pub(crate) fn readiness_fd_for(&self, interest: Interest) -> io::Result<BorrowedFd<'_>> {
        let mut st = self.driver.shared().lock();
        if !self.watched.swap(true, Ordering::Relaxed) {
            st.watch(self.handle, self.watchers.clone());
        }
        self.watchers.fd(interest)
    }

    /// Retries `f` until it stops saying "blocked", waiting for the driver in between.
    fn blocking<T, E>(
        &self,
        deadline: Option<Instant>,
        f: impl FnMut(&mut ProtoConnection) -> Result<T, E>,
        is_blocked: impl Fn(&E) -> bool,
    ) -> Result<Result<T, E>, io::Error> {
        self.blocking_then(deadline, f, is_blocked, |_, _| false)
    }

    /// [`blocking`](Self::blocking) for a read of a stream. A read that returned data and
    /// freed no window to announce (the usual case) left the engine nothing to send, no timer
    /// and no event, so the call returns without the pass over the engine other calls end
    /// with: one fewer per message of a request-response exchange.
    fn blocking_read<T>(
        &self,
        deadline: Option<Instant>,
        f: impl FnMut(&mut ProtoConnection) -> Result<T, ReadError>,
    ) -> io::Result<T> {
        let settled =
            |c: &ProtoConnection, r: &Result<T, ReadError>| r.is_ok() && !c.window_update_pending();
        match self.blocking_then(deadline, f, |e| *e == ReadError::Blocked, settled)? {
            Ok(r) => Ok(r),
            Err(e) => Err(read_error(e)),
        }
    }

    /// [`blocking`](Self::blocking), skipping the pass over the engine after the call when
    /// `settled` says the call left nothing for it.
    fn blocking_then<T, E>(
        &self,
        deadline: Option<Instant>,
        mut f: impl FnMut(&mut ProtoConnection) -> Result<T, E>,
        is_blocked: impl Fn(&E) -> bool,
        settled: impl Fn(&ProtoConnection, &Result<T, E>) -> bool,
    ) -> Result<Result<T, E>, io::Error> {
        let shared = self.driver.shared();
        let mut st = shared.lock();
        // whether this wait's window update was sent already (see below)
        let mut granted = false;
        loop {
            match f(conn(&mut st, self.handle)) {
                // A blocked message read may have granted the peer the window the whole
                // message needs: that goes out before waiting for it. The lock is let go
                // while sending, so look again after (once per wait: an update that cannot
                // go out, with no link up, waits for the driver thread).
                Err(e)
                    if is_blocked(&e)
                        && !granted
                        && look(&st, self.handle).window_update_pending() =>
                {
                    granted = true;
                    st = shared.after_app_call(st);
                }
                // Otherwise a blocked call only looked: it left nothing to send and no timer
                // to arm, so it goes straight to waiting. The lock is held from the look to
                // the wait, so no event for this connection can slip in between unseen (the
                // engine signals readability once until a read finds nothing).
                Err(e) if is_blocked(&e) => {
                    granted = false;
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"));
                    }
                    st = shared.wait_connection(st, self.handle, deadline);
                }
                r => {
                    if !settled(look(&st, self.handle), &r) {
                        drop(shared.after_app_call(st));
                    }
                    return Ok(r);
                }
            }
        }
    }

    /// Largest message [`send_message`](Self::send_message) accepts, in bytes: the smaller of
    /// this side's send buffer and the peer's receive window, less 8 bytes of framing (just
    /// under 8 MiB with the default configuration). A larger message fails with an error of
    /// kind [`io::ErrorKind::InvalidInput`]; larger data belongs on the byte stream.
    pub(crate) fn max_message_size(&self) -> usize {
        self.with(|c| c.max_message_size())
    }

    /// Sends one whole message (the peer receives it whole and in order with
    /// [`recv_message`](Self::recv_message)); waits for buffer space. At most
    /// [`max_message_size`](Self::max_message_size) bytes.
    pub(crate) fn send_message(&self, msg: &[u8]) -> io::Result<()> {
        self.send_message_until(msg, None)
    }

    /// [`Self::send_message`], waiting for room until `deadline` (`None`: for ever): an error
    /// of kind [`io::ErrorKind::TimedOut`] after it.
    pub(crate) fn send_message_until(
        &self,
        msg: &[u8],
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        let blocked = |e: &WriteError| *e == WriteError::Blocked;
        match self.blocking(deadline, |c| c.send_message(msg), blocked)? {
            Ok(()) => Ok(()),
            Err(e) => Err(write_error(e)),
        }
    }

    /// Largest datagram [`send_datagram`](Self::send_datagram) accepts, in bytes: 64 KiB and
    /// 1 KiB ([`MAX_DATAGRAM_LEN`](crate::MAX_DATAGRAM_LEN)). One larger than
    /// [`unsplit_datagram_size`](Self::unsplit_datagram_size) travels in pieces that fill the
    /// packets and arrives whole or not at all: losing any piece loses it.
    pub(crate) fn max_datagram_size(&self) -> usize {
        self.with(|c| c.max_datagram_size())
    }

    /// Largest datagram that travels in one packet, never in pieces: what one packet carries
    /// on every link at its base size (1426 bytes on IPv4 links of a 1500-byte MTU with a key,
    /// 1442 without). Traffic that wants each datagram lost on its own keeps below it.
    pub(crate) fn unsplit_datagram_size(&self) -> usize {
        self.with(|c| c.unsplit_datagram_size())
    }

    /// Sends `data` as one unreliable datagram: the peer receives it whole with
    /// [`recv_datagram`](Self::recv_datagram), or not at all; it is sent once, never
    /// repaired, and may overtake or be overtaken by others. Does not wait for the links:
    /// datagrams wait in a bounded queue (the oldest is dropped when it is full, and one that
    /// waited too long while others were sent is dropped unsent; while none can be sent they
    /// wait). With lanes that fall behind, a call that finds the queue half full waits for
    /// them (`Shared::pace_datagrams`). A
    /// datagram larger than [`max_datagram_size`](Self::max_datagram_size) fails with an
    /// error of kind [`io::ErrorKind::InvalidInput`].
    pub(crate) fn send_datagram(&self, data: &[u8]) -> io::Result<()> {
        self.with_datagrams(|c| c.send_datagram(Instant::now(), data))
            .map_err(write_error)
    }

    /// Sends each of `datagrams` like [`send_datagram`](Self::send_datagram), at the cost
    /// of one call: the engine is entered once and the packets go out in one batch. Stops at
    /// the first that fails (the earlier ones are sent).
    pub(crate) fn send_datagrams<'d>(
        &self,
        datagrams: impl IntoIterator<Item = &'d [u8]>,
    ) -> io::Result<()> {
        let now = Instant::now();
        self.with_datagrams(|c| {
            datagrams
                .into_iter()
                .try_for_each(|d| c.send_datagram(now, d))
        })
        .map_err(write_error)
    }

    /// Sends the datagram in each of `bufs` like [`send_datagrams`](Self::send_datagrams),
    /// without copying them: the connection keeps each buffer's memory and leaves an empty
    /// buffer in its place (once it has buffers to spare, one with room for a datagram), so a
    /// loop that fills the same buffers again allocates and copies nothing per datagram. Stops
    /// at the first that fails (the earlier ones are sent; that one is left as it was).
    pub(crate) fn send_datagram_bufs<'b>(
        &self,
        bufs: impl IntoIterator<Item = &'b mut Vec<u8>>,
    ) -> io::Result<()> {
        let now = Instant::now();
        self.with_datagrams(|c| {
            bufs.into_iter()
                .try_for_each(|b| c.send_datagram_buf(now, b))
        })
        .map_err(write_error)
    }

    /// Receives the datagrams waiting, at most `max` (at least one: waits for it); empty once
    /// the connection closed cleanly and every datagram that arrived was read.
    pub(crate) fn recv_datagrams(&self, max: usize) -> io::Result<Vec<Vec<u8>>> {
        let mut got = Vec::new();
        let r = self.blocking(
            None,
            |c| loop {
                match c.recv_datagram() {
                    Ok(Some(d)) => {
                        got.push(d);
                        if got.len() >= max {
                            return Ok(());
                        }
                    }
                    Ok(None) => return Ok(()),
                    // what was taken is handed over first; the next call sees the error
                    Err(_) if !got.is_empty() => return Ok(()),
                    Err(e) => return Err(e),
                }
            },
            |e| *e == ReadError::Blocked,
        )?;
        r.map_err(read_error)?;
        Ok(got)
    }

    /// [`recv_datagrams`](Self::recv_datagrams) into `bufs`: afterwards it holds exactly the
    /// datagrams received, oldest first (none once the connection closed cleanly and every
    /// datagram that arrived was read). The memory of the buffers it held is used for them,
    /// and what is left over goes back to the connection for later arrivals: a loop that
    /// passes the same `bufs` each time allocates nothing per datagram.
    pub(crate) fn recv_datagrams_into(
        &self,
        bufs: &mut Vec<Vec<u8>>,
        max: usize,
    ) -> io::Result<()> {
        let r = self.blocking(
            None,
            |c| take_datagrams(c, bufs, max),
            |e| *e == ReadError::Blocked,
        )?;
        r.map_err(read_error)
    }

    /// Waits until the handshake ended or `deadline` (`None`: no deadline) passed: `Ok(true)`
    /// when the connection is established (or was, and closed cleanly since), `Ok(false)`
    /// when it is still connecting at the deadline, and why it failed or ended otherwise.
    pub(crate) fn wait_handshake(
        &self,
        deadline: Option<Instant>,
    ) -> Result<bool, ConnectionError> {
        let shared = self.driver.shared();
        let mut st = shared.lock();
        loop {
            let c = look(&st, self.handle);
            match c.state() {
                ConnectionState::Connecting => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(false);
                    }
                    st = shared.wait_connection(st, self.handle, deadline);
                }
                ConnectionState::Closed => {
                    return match c.close_reason() {
                        Some(why) => Err(why.clone()),
                        // its exchange done and closed cleanly, before this looked
                        None if c.handshake_completed() => Ok(true),
                        None => Err(ConnectionError::Refused),
                    };
                }
                _ => return Ok(true),
            }
        }
    }

    /// See [`crate::Connection::look_without_receiving`].
    pub(crate) fn look_without_receiving(&self, caller: Caller) {
        self.try_with(caller, ProtoConnection::reader_looked);
    }

    /// [`Self::wait_handshake`] without waiting, for a caller that waits on the readiness
    /// descriptors of `caller`: they are cleared before the look, so that the handshake's
    /// end after it signals them again.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn try_handshake(&self, caller: Caller) -> Result<bool, ConnectionError> {
        self.watchers.clear(caller);
        self.wait_handshake(Some(Instant::now()))
    }

    pub(crate) fn try_recv_datagrams_into(
        &self,
        bufs: &mut Vec<Vec<u8>>,
        max: usize,
    ) -> io::Result<()> {
        match self.try_with(Caller::ReadDatagram, |c| take_datagrams(c, bufs, max)) {
            Ok(()) => Ok(()),
            Err(ReadError::Blocked) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(read_error(e)),
        }
    }

    /// Receives one datagram, waiting for one; `Ok(None)` once the connection closed cleanly
    /// and every datagram that arrived was read.
    pub(crate) fn recv_datagram(&self) -> io::Result<Option<Vec<u8>>> {
        match self.blocking(None, |c| c.recv_datagram(), |e| *e == ReadError::Blocked)? {
            Ok(d) => Ok(d),
            Err(e) => Err(read_error(e)),
        }
    }

    /// [`recv_datagram`](Self::recv_datagram), waiting at most `timeout` (`None`: as long as
    /// it takes): an error of kind [`io::ErrorKind::TimedOut`] when none arrived in time.
    pub(crate) fn recv_datagram_timeout(
        &self,
        timeout: Option<Duration>,
    ) -> io::Result<Option<Vec<u8>>> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        match self.blocking(
            deadline,
            |c| c.recv_datagram(),
            |e| *e == ReadError::Blocked,
        )? {
            Ok(d) => Ok(d),
            Err(e) => Err(read_error(e)),
        }
    }

    /// Receives one datagram if one is waiting; an error of kind
    /// [`io::ErrorKind::WouldBlock`] otherwise. Never blocks.
    pub(crate) fn try_recv_datagram(&self) -> io::Result<Option<Vec<u8>>> {
        match self.try_with(Caller::ReadDatagram, |c| c.recv_datagram()) {
            Ok(d) => Ok(d),
            Err(ReadError::Blocked) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(read_error(e)),
        }
    }

    /// Receives one whole message; `Ok(None)` once the peer finished its message stream.
    pub(crate) fn recv_message(&self) -> io::Result<Option<Vec<u8>>> {
        self.blocking_read(None, |c| c.recv_message())
    }

    /// [`recv_message`](Self::recv_message), waiting at most `timeout` (`None`: as long as it
    /// takes): an error of kind [`io::ErrorKind::TimedOut`] when no whole message arrived in
    /// time.
    pub(crate) fn recv_message_timeout(
        &self,
        timeout: Option<Duration>,
    ) -> io::Result<Option<Vec<u8>>> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        self.blocking_read(deadline, |c| c.recv_message())
    }

    /// Receives one whole message if one has fully arrived; `Ok(None)` once the peer finished
    /// its message stream; an error of kind [`io::ErrorKind::WouldBlock`] when no whole
    /// message is waiting. Never blocks.
    pub(crate) fn try_recv_message(&self) -> io::Result<Option<Vec<u8>>> {
        match self.try_with(Caller::ReadMessage, |c| c.recv_message()) {
            Ok(m) => Ok(m),
            Err(ReadError::Blocked) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(read_error(e)),
        }
    }

    /// Takes the whole messages that have arrived, at most `max`, into `bufs` (see
    /// [`Connection::try_recv_messages_into`](crate::Connection::try_recv_messages_into)).
    pub(crate) fn try_recv_messages_into(
        &self,
        bufs: &mut Vec<Vec<u8>>,
        max: usize,
    ) -> io::Result<()> {
        match self.try_with(Caller::ReadMessage, |c| take_messages(c, bufs, max)) {
            Ok(()) => Ok(()),
            Err(ReadError::Blocked) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(read_error(e)),
        }
    }

    /// Sends the messages of `msgs` in order while the buffer has room, under one lock, so
    /// their packets leave together (see
    /// [`Connection::try_send_messages`](crate::Connection::try_send_messages)).
    pub(crate) fn try_send_messages<'m>(
        &self,
        msgs: impl IntoIterator<Item = &'m [u8]>,
    ) -> io::Result<usize> {
        let mut sent = 0;
        let r = self.try_with(Caller::WriteMessage, |c| {
            msgs.into_iter()
                .try_for_each(|m| c.send_message(m).map(|()| sent += 1))
        });
        match r {
            Ok(()) => Ok(sent),
            // those taken are reported; the next call meets what stopped it
            Err(_) if sent > 0 => Ok(sent),
            Err(WriteError::Blocked) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(write_error(e)),
        }
    }

    /// Sends one whole message if the buffer has room for it now; an error of kind
    /// [`io::ErrorKind::WouldBlock`] otherwise (the readiness descriptor is signalled when
    /// there is room). Never blocks.
    pub(crate) fn try_send_message(&self, msg: &[u8]) -> io::Result<()> {
        match self.try_with(Caller::WriteMessage, |c| c.send_message(msg)) {
            Ok(()) => Ok(()),
            Err(WriteError::Blocked) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(write_error(e)),
        }
    }

    /// Reads what has arrived of the byte stream: `Ok(0)` at its end (for a non-empty
    /// `buf`), an error of kind [`io::ErrorKind::WouldBlock`] when nothing is waiting. Never
    /// blocks.
    pub(crate) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self.try_with(Caller::ReadStream, |c| c.read(buf)) {
            Ok(n) => Ok(n),
            Err(ReadError::Blocked) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(read_error(e)),
        }
    }

    /// Reads from the byte stream, waiting until `deadline` (`None`: for ever) for the first
    /// byte: an error of kind [`io::ErrorKind::TimedOut`] after it.
    pub(crate) fn read_until(
        &self,
        buf: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        self.blocking_read(deadline, |c| c.read(buf))
    }

    /// [`Self::read_buf`] without waiting: an error of kind [`io::ErrorKind::WouldBlock`]
    /// when nothing is waiting.
    pub(crate) fn try_read_buf(&self, buf: &mut Vec<u8>) -> io::Result<usize> {
        match self.try_with(Caller::ReadStream, |c| c.read_buf(buf)) {
            Ok(n) => Ok(n),
            Err(ReadError::Blocked) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(read_error(e)),
        }
    }

    /// Writes as much of `buf` to the byte stream as the send buffer takes now; an error of
    /// kind [`io::ErrorKind::WouldBlock`] when it is full. Never blocks.
    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self.try_with(Caller::WriteStream, |c| c.write(buf)) {
            Ok(n) => Ok(n),
            Err(WriteError::Blocked) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(write_error(e)),
        }
    }

    /// A file descriptor that becomes readable when this connection may have progressed
    /// (data or a whole message arrived, buffer space was freed, a link changed state, the
    /// connection closed), for `poll`/`epoll`/mio/tokio. Register it for reading, never read
    /// it yourself: the non-blocking calls ([`try_read`](Self::try_read),
    /// [`try_write`](Self::try_write), [`try_recv_message`](Self::try_recv_message),
    /// [`try_send_message`](Self::try_send_message)) clear it before they look, so after one
    /// of them returned `WouldBlock` it becomes readable as soon as retrying may succeed.
    /// Call them until `WouldBlock` after each wake-up (the descriptor is edge-like). Lives
    /// as long as this handle.
    pub(crate) fn readiness_fd(&self) -> io::Result<BorrowedFd<'_>> {
        self.readiness_fd_for(Interest::Any)
    }

    /// See [`crate::Connection::set_loop_token`].
    pub(crate) fn set_loop_token(&self, token: Option<u64>) {
        let mut st = self.driver.shared().lock();
        if !self.watched.swap(true, Ordering::Relaxed) {
            st.watch(self.handle, self.watchers.clone());
        }
        self.watchers.set_loop_token(token);
    }

    /// A readiness descriptor for reading alone: readable when a retry of
    /// [`try_read`](Self::try_read), [`try_recv_message`](Self::try_recv_message) or
    /// [`try_recv_datagram`](Self::try_recv_datagram) may succeed, and cleared only by them.
    /// With [`write_readiness_fd`](Self::write_readiness_fd) a reader and a writer that wait
    /// apart (an asyncio transport, tokio's split halves) never clear each other's wake-ups,
    /// as they would sharing [`readiness_fd`](Self::readiness_fd). Lives as long as this
    /// handle.
    pub(crate) fn read_readiness_fd(&self) -> io::Result<BorrowedFd<'_>> {
        self.readiness_fd_for(Interest::Read)
    }

    /// A readiness descriptor for writing alone: readable when a retry of
    /// [`try_write`](Self::try_write) or [`try_send_message`](Self::try_send_message) may
    /// succeed (buffer space was freed, or the connection changed state), and cleared only by
    /// them. See [`read_readiness_fd`](Self::read_readiness_fd).
    /// See [`crate::Connection::signal_again`].
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn signal_again(&self, interest: Interest) {
        self.watchers.signal_again(interest);
    }

    pub(crate) fn write_readiness_fd(&self) -> io::Result<BorrowedFd<'_>> {
        self.readiness_fd_for(Interest::Write)
    }

    /// Ends both outgoing streams: the peer reads end-of-stream after what was written. Fails
    /// with the connection's error once it ended on one: nothing will carry the end.
    pub(crate) fn finish(&self) -> io::Result<()> {
        self.with(|c| match c.close_reason() {
            Some(e) => Err(lost(e.clone())),
            None => {
                c.finish();
                Ok(())
            }
        })
    }

    /// Waits until the peer has acknowledged everything written and the end of both streams
    /// (call [`finish`](Self::finish) first), or until `timeout`.
    pub(crate) fn wait_acknowledged(&self, timeout: Option<Duration>) -> io::Result<()> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        self.blocking(
            deadline,
            |c| {
                if c.is_send_complete() {
                    Ok(())
                } else if let Some(e) = c.close_reason() {
                    Err(Some(e.clone()))
                } else {
                    Err(None)
                }
            },
            |e: &Option<ConnectionError>| e.is_none(),
        )?
        .map_err(|e| lost(e.expect("only blocked errors are None")))
    }

    /// Whether the peer has acknowledged everything written and the end of both streams: what
    /// [`wait_acknowledged`](Self::wait_acknowledged) waits for, without waiting.
    pub(crate) fn is_acknowledged(&self) -> bool {
        self.with(|c| c.is_send_complete())
    }

    /// Writes all of `buf` to the stream, waiting for room, without copying a large buffer
    /// (16 KiB or more): the connection keeps it until the peer acknowledged it and leaves
    /// `buf` empty, with the memory of a buffer it no longer needs when it has one: fill it
    /// with the next data and write it again, and nothing is allocated per write. So
    /// the data is copied once in user space, into the datagrams (as they are built, under
    /// the engine's lock). Smaller buffers are copied, as by `write`.
    pub(crate) fn write_buf(&self, buf: &mut Vec<u8>) -> io::Result<()> {
        while !buf.is_empty() {
            match self.blocking(None, |c| c.write_buf(buf), |e| *e == WriteError::Blocked)? {
                Ok(_) => {}
                Err(e) => return Err(write_error(e)),
            }
        }
        Ok(())
    }

    /// Writes to the byte stream what the send buffer takes of `buf`, waiting for room until
    /// `deadline` (`None`: for ever): an error of kind [`io::ErrorKind::TimedOut`] after it.
    pub(crate) fn write_until(&self, buf: &[u8], deadline: Option<Instant>) -> io::Result<usize> {
        match self.blocking(deadline, |c| c.write(buf), |e| *e == WriteError::Blocked)? {
            Ok(n) => Ok(n),
            Err(e) => Err(write_error(e)),
        }
    }

    /// What [`Self::write_buf`] takes of `buf` in one go (see [`Self::try_write_buf`]),
    /// waiting for room until `deadline`: an error of kind [`io::ErrorKind::TimedOut`] after
    /// it.
    pub(crate) fn take_buf_until(
        &self,
        buf: &mut Vec<u8>,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        match self.blocking(
            deadline,
            |c| c.write_buf(buf),
            |e| *e == WriteError::Blocked,
        )? {
            Ok(n) => Ok(n),
            Err(e) => Err(write_error(e)),
        }
    }

    /// [`Self::write_buf`] without waiting: takes a large `buf` whole (leaving it empty) and a
    /// small one as far as there is room (the bytes taken leave its front); returns how many
    /// bytes, an error of kind [`io::ErrorKind::WouldBlock`] when it took none.
    pub(crate) fn try_write_buf(&self, buf: &mut Vec<u8>) -> io::Result<usize> {
        match self.try_with(Caller::WriteStream, |c| c.write_buf(buf)) {
            Ok(n) => Ok(n),
            Err(WriteError::Blocked) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(write_error(e)),
        }
    }

    /// Takes `data` as [`Self::write_buf`] takes a buffer, a large one shared rather than
    /// copied (whole); returns how many bytes were taken, waiting for room.
    pub(crate) fn write_bytes(&self, data: &Bytes) -> io::Result<usize> {
        match self.blocking(None, |c| c.write_bytes(data), |e| *e == WriteError::Blocked)? {
            Ok(n) => Ok(n),
            Err(e) => Err(write_error(e)),
        }
    }

    /// [`Self::write_bytes`] without waiting: an error of kind
    /// [`io::ErrorKind::WouldBlock`] when the send buffer has no room for it.
    pub(crate) fn try_write_bytes(&self, data: &Bytes) -> io::Result<usize> {
        match self.try_with(Caller::WriteStream, |c| c.write_bytes(data)) {
            Ok(n) => Ok(n),
            Err(WriteError::Blocked) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(write_error(e)),
        }
    }

    /// Reads the next bytes of the stream into `buf`, replacing its contents and waiting until
    /// some are there; returns how many (0: the peer finished). When a whole block of the
    /// receive buffer (64 KiB; less for a smaller `stream_receive_window`) is ready it is handed over as `buf` without copying, and the memory
    /// `buf` had is kept for a later block: reuse the same `buf` for every call.
    pub(crate) fn read_buf(&self, buf: &mut Vec<u8>) -> io::Result<usize> {
        self.blocking_read(None, |c| c.read_buf(buf))
    }

    /// Aborts the connection at once; the peer sees `PeerAborted` with `code` and `reason`.
    pub(crate) fn abort(&self, code: u64, reason: &str) {
        self.with(|c| c.abort(code, reason));
    }

    /// See [`crate::Connection::set_timeouts`].
    pub(crate) fn set_timeouts(&self, all_links_down: Option<Duration>, idle: Option<Duration>) {
        self.with(|c| c.set_timeouts(all_links_down, idle));
    }

    /// The connection's state.
    pub(crate) fn state(&self) -> ConnectionState {
        self.with(|c| c.state())
    }

    /// Per-link and buffer statistics.
    pub(crate) fn stats(&self) -> ConnectionStats {
        self.with(|c| c.stats())
    }

    /// State changes since the last call (connected, link added, link state changes, all
    /// acknowledged, closed), oldest first, each with when the engine reported it: an
    /// application that polls rarely, e.g. because its writes block while every link is
    /// down, still learns when a link went down. Data readiness
    /// ([`Event::Readable`](crate::Event::Readable),
    /// [`Event::Writable`](crate::Event::Writable)) is not queued here: it is a level, seen
    /// through the calls themselves and [`readiness_fd`](Self::readiness_fd).
    pub(crate) fn poll_events(&self) -> Vec<TimedEvent> {
        self.driver.shared().lock().take_events(self.handle)
    }

    /// Why the connection ended, if it did with an error.
    pub(crate) fn close_reason(&self) -> Option<ConnectionError> {
        self.with(|c| c.close_reason().cloned())
    }
}

fn conn(st: &mut State, h: ConnectionHandle) -> &mut ProtoConnection {
    st.engine_mut()
        .connection_mut(h)
        .expect("a connection stays in the engine while its handle lives")
}

/// [`conn`] to look at only: the engine does not count it as something that happened to the
/// connection.
fn look(st: &State, h: ConnectionHandle) -> &ProtoConnection {
    st.engine()
        .connection(h)
        .expect("a connection stays in the engine while its handle lives")
}

fn write_error(e: WriteError) -> io::Error {
    match e {
        WriteError::ConnectionLost(e) => lost(e),
        WriteError::Finished => io::Error::new(io::ErrorKind::BrokenPipe, e),
        WriteError::MessagesRefused | WriteError::DatagramsRefused => {
            io::Error::new(io::ErrorKind::Unsupported, e)
        }
        other => io::Error::new(io::ErrorKind::InvalidInput, other),
    }
}

fn read_error(e: ReadError) -> io::Error {
    match e {
        ReadError::ConnectionLost(e) => lost(e),
        other => io::Error::other(other),
    }
}

impl io::Read for &UdpConnection {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_until(buf, None)
    }
}

impl io::Write for &UdpConnection {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_until(buf, None)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for UdpConnection {
    fn drop(&mut self) {
        let shared = self.driver.shared();
        let mut st = shared.lock();
        let linger = st.engine().config().close_linger;
        if let Some(c) = st.engine_mut().connection_mut(self.handle) {
            if c.state() != ConnectionState::Closed {
                c.finish();
            }
            let keepalive = c.config().keepalive_interval;
            c.let_go(crate::connection::let_go_silence(linger, keepalive));
        }
        st.release_when_closed(self.handle);
        drop(shared.after_app_call(st));
    }
}

/// Moves up to `max` (at least one) waiting datagrams into `bufs`, which afterwards holds
/// exactly them; the memory of the buffers left over goes back to the connection.
/// `Err(ReadError::Blocked)` when none is waiting.
fn take_datagrams(
    c: &mut ProtoConnection,
    bufs: &mut Vec<Vec<u8>>,
    max: usize,
) -> Result<(), ReadError> {
    let (n, r) = take_into(c, bufs, max, ProtoConnection::recv_datagram_into);
    for spare in bufs.drain(n..) {
        c.recycle_datagram_buffer(spare);
    }
    r
}

/// Moves up to `max` (at least one) whole messages into `bufs`, reusing the memory of the
/// buffers it held; none left in it at the end of the message stream.
fn take_messages(
    c: &mut ProtoConnection,
    bufs: &mut Vec<Vec<u8>>,
    max: usize,
) -> Result<(), ReadError> {
    let (n, r) = take_into(c, bufs, max, ProtoConnection::recv_message_into);
    bufs.truncate(n);
    r
}

/// Fills the buffers of `bufs` in turn with `recv_into` (`Ok(true)`: one taken; `Ok(false)`:
/// no more will come), adding buffers as needed, until `max` (at least one) are taken or
/// nothing more waits: how many were, and the outcome. What was taken is handed over before
/// an error, which the next call meets again.
fn take_into(
    c: &mut ProtoConnection,
    bufs: &mut Vec<Vec<u8>>,
    max: usize,
    mut recv_into: impl FnMut(&mut ProtoConnection, &mut Vec<u8>) -> Result<bool, ReadError>,
) -> (usize, Result<(), ReadError>) {
    let max = max.max(1);
    let mut n = 0;
    let r = loop {
        if n == bufs.len() {
            bufs.push(Vec::new());
        }
        match recv_into(c, &mut bufs[n]) {
            Ok(true) => {
                n += 1;
                if n >= max {
                    break Ok(());
                }
            }
            Ok(false) => break Ok(()),
            Err(_) if n > 0 => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    (n, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kinds an application matches on: each way the peer ended the connection is a
    /// reset or an abort (as the C library's `ECONNRESET` and Python's `PeerGone`), never
    /// `Other`.
    #[test]
    fn each_end_of_a_connection_has_its_error_kind() {
        use io::ErrorKind::*;
        let aborted = || ConnectionError::PeerAborted {
            code: 1,
            reason: "x".into(),
        };
        let failed = || ConnectionError::PeerError {
            code: 1,
            reason: "x".into(),
        };
        let cases = [
            (ConnectionError::PeerGone, ConnectionReset),
            (ConnectionError::PeerRestarted, ConnectionReset),
            (ConnectionError::ClosedEarly, ConnectionReset),
            (aborted(), ConnectionAborted),
            (failed(), ConnectionAborted),
            (ConnectionError::LocallyAborted, ConnectionAborted),
            (ConnectionError::AllLinksDown, TimedOut),
            (ConnectionError::IdleTimeout, TimedOut),
            (ConnectionError::Refused, ConnectionRefused),
            (ConnectionError::NotAccepting, ConnectionRefused),
            (ConnectionError::ServerFull, ConnectionRefused),
            (ConnectionError::ProtocolViolation("x"), InvalidData),
        ];
        for (e, kind) in cases {
            let text = e.to_string();
            let err = lost(e);
            assert_eq!(err.kind(), kind, "{text}");
            // the reason stays readable behind the kind
            assert_eq!(err.to_string(), text);
        }
    }
}
