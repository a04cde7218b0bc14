//! The application's handle on a connection: a blocking byte stream (`Read` + `Write`),
//! whole messages, unreliable datagrams, end of stream, statistics and link events, on
//! either transport (UDP: `udp_connection`; TCP: `tcp::conn`).

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use ri2n_proto::{reclaim, ConnectionError, ConnectionState, ConnectionStats, Event};

use crate::readiness::{Caller, Interest};
use crate::tcp::TcpConnection;
use crate::udp_connection::UdpConnection;

/// One ri2n connection. Reads and writes block: while every link is down they simply wait
/// (unless the configuration sets an all-links-down deadline). Dropping the handle finishes
/// the outgoing streams and lets the connection complete in the background while the
/// endpoint lives, as long as the peer is heard from: once the peer was silent for the
/// endpoint's `close_linger` (at least a second and three keepalive intervals), the
/// connection ends; dropping the endpoint's last handle waits (up to its `close_linger`) for
/// what was written to be delivered (see [`Endpoint::close`](crate::Endpoint::close)). What
/// the peer had sent unread, or sends after the drop, nobody reads: once what was written is
/// delivered, the connection is aborted (on either transport), so the peer's writes fail
/// instead of blocking on a full window, as TCP resets a connection closed with data unread.
///
/// On the TCP transport ([`Transport::Tcp`](crate::Transport::Tcp)) a connection carries the
/// byte stream and whole messages, in one striped sequence: a message waits behind stream
/// bytes written before it (and stream bytes the application does not read hold back the
/// messages after them once they fill the receive window). Unreliable datagrams are not
/// carried: their calls fail with an error of kind [`io::ErrorKind::Unsupported`] that says
/// so.
#[derive(Debug)]
pub struct Connection {
    inner: Inner,
    /// A TCP-transport connection keeps its endpoint open, as a UDP one keeps its shard
    /// running; the endpoint closes once its last handle and connection are gone. Declared
    /// after `inner`, so it is dropped after the connection was released.
    _endpoint: Option<Arc<crate::TcpLife>>,
}

#[derive(Debug)]
enum Inner {
    Udp(UdpConnection),
    Tcp(TcpHandle),
}

/// State-change events kept per connection for the application, on either transport (oldest
/// dropped beyond: a link flapping for hours while nobody polls must not grow memory without
/// bound).
pub(crate) const MAX_QUEUED_EVENTS: usize = 4096;

/// Why a connection whose application let go of it with data unread is aborted, on either
/// transport (as TCP resets a connection closed with data unread).
pub(crate) const UNREAD: &str =
    "the peer's application closed the connection without reading all it was sent";

/// How long the peer of a connection whose application let go of it may stay silent before
/// the connection is ended (`IdleTimeout`), on either transport: the endpoint's
/// `close_linger`, but never less than a second nor three keepalive intervals (`keepalive`,
/// this side's: a live peer with the same setting is heard from that often), so that neither
/// a `close_linger` of 0 nor a live peer's quiet spell cuts off what is still being
/// delivered. Without it, a connection whose peer vanished without a
/// word would be kept as long as the endpoint lives, when no deadline of its configuration
/// (the default) gives up on it.
pub(crate) fn let_go_silence(close_linger: Duration, keepalive: Duration) -> Duration {
    close_linger
        .max(Duration::from_secs(1))
        .max(keepalive.saturating_mul(3))
}

/// Why a connection that a server's application can no longer accept (its endpoint was
/// dropped) is aborted, on either transport.
pub(crate) const UNACCEPTED: &str = "the server stopped accepting before it took this connection";

/// The application's handle on a TCP-transport connection: dropping it finishes the stream
/// (and, should the peer's data then go unread, aborts it: see `link::watch`).
#[derive(Debug)]
struct TcpHandle(Arc<TcpConnection>);

impl Drop for TcpHandle {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// An [`Event`] and when it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedEvent {
    /// When the engine reported the event (to within the driver's reaction time).
    pub at: Instant,
    /// What happened.
    pub event: Event,
}

/// What a TCP-transport connection answers a call it does not carry.
fn tcp_refuses(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("the TCP transport does not carry {what}: use the UDP transport"),
    )
}

impl Connection {
    pub(crate) fn udp(c: UdpConnection) -> Self {
        Self {
            inner: Inner::Udp(c),
            _endpoint: None,
        }
    }

    pub(crate) fn tcp(c: Arc<TcpConnection>, endpoint: Arc<crate::TcpLife>) -> Self {
        Self {
            inner: Inner::Tcp(TcpHandle(c)),
            _endpoint: Some(endpoint),
        }
    }

    /// Which of its endpoint's shards (an engine with its driver thread, see
    /// [`Endpoint::shards`](crate::Endpoint::shards)) serves this connection.
    pub fn shard(&self) -> usize {
        match &self.inner {
            Inner::Udp(c) => c.shard(),
            Inner::Tcp(_) => 0,
        }
    }

    /// Largest message [`send_message`](Self::send_message) accepts, in bytes: the smaller of
    /// this side's send buffer and the peer's receive window, less 8 bytes of framing (just
    /// under 8 MiB with the default configuration). A larger message fails with an error of
    /// kind [`io::ErrorKind::InvalidInput`]; larger data belongs on the byte stream. While the
    /// handshake of [`Endpoint::start_connect`](crate::Endpoint::start_connect) is under way
    /// the peer's window is not known: this is 0, and a message sent meanwhile waits for the
    /// handshake's end (`WouldBlock` from the non-blocking calls).
    pub fn max_message_size(&self) -> usize {
        match &self.inner {
            Inner::Udp(c) => c.max_message_size(),
            Inner::Tcp(TcpHandle(c)) => c.settings.max_message() as usize,
        }
    }

    /// Sends one whole message (the peer receives it whole and in order with
    /// [`recv_message`](Self::recv_message)); waits for buffer space. At most
    /// [`max_message_size`](Self::max_message_size) bytes.
    pub fn send_message(&self, msg: &[u8]) -> io::Result<()> {
        match &self.inner {
            Inner::Udp(c) => c.send_message(msg),
            Inner::Tcp(TcpHandle(c)) => c.send_message(msg, true, None),
        }
    }

    /// [`send_message`](Self::send_message), waiting for room at most `timeout` (`None`: as
    /// long as it takes): an error of kind [`io::ErrorKind::TimedOut`] when there was none in
    /// time (nothing was sent), or at once when the connection ended on a timeout of its own
    /// (see [`recv_message_timeout`](Self::recv_message_timeout)). Like the other timed
    /// calls, it clears no readiness descriptor (see [`read_timeout`](Self::read_timeout)).
    pub fn send_message_timeout(&self, msg: &[u8], timeout: Option<Duration>) -> io::Result<()> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        match &self.inner {
            Inner::Udp(c) => c.send_message_until(msg, deadline),
            Inner::Tcp(TcpHandle(c)) => c.send_message(msg, true, deadline),
        }
    }

    /// Largest datagram [`send_datagram`](Self::send_datagram) accepts, in bytes: 64 KiB and
    /// 1 KiB ([`MAX_DATAGRAM_LEN`](crate::MAX_DATAGRAM_LEN)). One larger than
    /// [`unsplit_datagram_size`](Self::unsplit_datagram_size) travels in pieces that fill the
    /// packets and arrives whole or not at all: losing any piece loses it. 0 on the TCP
    /// transport, which carries no datagrams.
    pub fn max_datagram_size(&self) -> usize {
        match &self.inner {
            Inner::Udp(c) => c.max_datagram_size(),
            Inner::Tcp(_) => 0,
        }
    }

    /// Largest datagram that travels in one packet, never in pieces: what one packet carries
    /// on every link at its base size (1426 bytes on IPv4 links of a 1500-byte MTU with a key,
    /// 1442 without). Traffic that wants each datagram lost on its own keeps below it.
    pub fn unsplit_datagram_size(&self) -> usize {
        match &self.inner {
            Inner::Udp(c) => c.unsplit_datagram_size(),
            Inner::Tcp(_) => 0,
        }
    }

    /// Sends `data` as one unreliable datagram: the peer receives it whole with
    /// [`recv_datagram`](Self::recv_datagram), or not at all, at most once, in sending order
    /// (the receiver waits briefly for a missing one, and still delivers one that comes
    /// later, PROTOCOL.md §5.9); it is sent once, never repaired after a loss (only one a
    /// failing link held is sent once more on another). Does not wait for the links:
    /// datagrams wait in a bounded queue (the oldest is dropped when it is full, and one that
    /// waited too long while others were sent is dropped unsent; while none can be sent they
    /// wait). Where each link has a sending thread
    /// ([`EndpointConfig::send_threads`](crate::EndpointConfig::send_threads)) and those
    /// fall behind, a call that finds the queue half full waits for them to send (at most
    /// [`ConnectionConfig::datagram_max_age`](crate::ConnectionConfig::datagram_max_age)), as
    /// a thread sending its own datagrams spends that time sending them. A
    /// datagram larger than [`max_datagram_size`](Self::max_datagram_size) fails with an
    /// error of kind [`io::ErrorKind::InvalidInput`].
    pub fn send_datagram(&self, data: &[u8]) -> io::Result<()> {
        match &self.inner {
            Inner::Udp(c) => c.send_datagram(data),
            Inner::Tcp(_) => Err(tcp_refuses("unreliable datagrams")),
        }
    }

    /// Sends each of `datagrams` like [`send_datagram`](Self::send_datagram), at the cost
    /// of one call: the engine is entered once and the packets go out in one batch. Stops at
    /// the first that fails (the earlier ones are sent).
    pub fn send_datagrams<'d>(
        &self,
        datagrams: impl IntoIterator<Item = &'d [u8]>,
    ) -> io::Result<()> {
        match &self.inner {
            Inner::Udp(c) => c.send_datagrams(datagrams),
            Inner::Tcp(_) => Err(tcp_refuses("unreliable datagrams")),
        }
    }

    /// Sends the datagram in each of `bufs` like [`send_datagrams`](Self::send_datagrams),
    /// without copying them: the connection keeps each buffer's memory and leaves an empty
    /// buffer in its place (once it has buffers to spare, one with room for a datagram), so a
    /// loop that fills the same buffers again allocates and copies nothing per datagram. Stops
    /// at the first that fails (the earlier ones are sent; that one is left as it was).
    pub fn send_datagram_bufs<'b>(
        &self,
        bufs: impl IntoIterator<Item = &'b mut Vec<u8>>,
    ) -> io::Result<()> {
        match &self.inner {
            Inner::Udp(c) => c.send_datagram_bufs(bufs),
            Inner::Tcp(_) => Err(tcp_refuses("unreliable datagrams")),
        }
    }

    /// Receives the datagrams waiting, at most `max` (at least one: waits for it); empty once
    /// the connection closed cleanly and every datagram that arrived was read.
    pub fn recv_datagrams(&self, max: usize) -> io::Result<Vec<Vec<u8>>> {
        match &self.inner {
            Inner::Udp(c) => c.recv_datagrams(max),
            Inner::Tcp(_) => Err(tcp_refuses("unreliable datagrams")),
        }
    }

    /// [`recv_datagrams`](Self::recv_datagrams) into `bufs`: afterwards it holds exactly the
    /// datagrams received, oldest first (none once the connection closed cleanly and every
    /// datagram that arrived was read). The memory of the buffers it held is used for them,
    /// and what is left over goes back to the connection for later arrivals: a loop that
    /// passes the same `bufs` each time allocates nothing per datagram.
    pub fn recv_datagrams_into(&self, bufs: &mut Vec<Vec<u8>>, max: usize) -> io::Result<()> {
        match &self.inner {
            Inner::Udp(c) => c.recv_datagrams_into(bufs, max),
            Inner::Tcp(_) => Err(tcp_refuses("unreliable datagrams")),
        }
    }

    /// Waits until the handshake ended; why it failed, if it did (see
    /// [`Endpoint::connect`](crate::Endpoint::connect)).
    pub(crate) fn wait_handshake(&self) -> Result<(), ConnectionError> {
        self.wait_connected(None).map(drop)
    }

    /// Waits at most `timeout` (`None`: as long as it takes) for the handshake of a
    /// connection from [`Endpoint::start_connect`](crate::Endpoint::start_connect) to end:
    /// `Ok(true)` once the connection is established (also after it closed cleanly since),
    /// `Ok(false)` while the handshake still goes on after `timeout`, and why it failed, or
    /// ended since, if it did (the error [`Endpoint::connect`](crate::Endpoint::connect)
    /// would return). A program that must
    /// stay responsive while a handshake lasts (a signal to handle, a cancellation) waits in
    /// slices; the handshake itself runs on, for its own `handshake_timeout`.
    pub fn wait_connected(&self, timeout: Option<Duration>) -> Result<bool, ConnectionError> {
        match &self.inner {
            Inner::Udp(c) => c.wait_handshake(timeout.and_then(|t| Instant::now().checked_add(t))),
            // a TCP-transport connection is handed out established
            Inner::Tcp(_) => Ok(true),
        }
    }

    /// [`wait_connected`](Self::wait_connected) without waiting, for a caller that waits on
    /// the readiness descriptors of `caller` (cleared before the look, as by a `try_` call).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn try_connected(&self, caller: Caller) -> Result<bool, ConnectionError> {
        match &self.inner {
            Inner::Udp(c) => c.try_handshake(caller),
            Inner::Tcp(_) => Ok(true),
        }
    }

    /// [`recv_datagrams_into`](Self::recv_datagrams_into) without waiting: an error of kind
    /// [`io::ErrorKind::WouldBlock`] when no datagram is waiting (`bufs` then holds none).
    /// Clears the read readiness before it looks, as the other non-blocking calls do.
    pub fn try_recv_datagrams_into(&self, bufs: &mut Vec<Vec<u8>>, max: usize) -> io::Result<()> {
        match &self.inner {
            Inner::Udp(c) => c.try_recv_datagrams_into(bufs, max),
            Inner::Tcp(_) => Err(tcp_refuses("unreliable datagrams")),
        }
    }

    /// Receives one datagram, waiting for one; `Ok(None)` once the connection closed cleanly
    /// and every datagram that arrived was read.
    pub fn recv_datagram(&self) -> io::Result<Option<Vec<u8>>> {
        match &self.inner {
            Inner::Udp(c) => c.recv_datagram(),
            Inner::Tcp(_) => Err(tcp_refuses("unreliable datagrams")),
        }
    }

    /// [`recv_datagram`](Self::recv_datagram), waiting at most `timeout` (`None`: as long as
    /// it takes): an error of kind [`io::ErrorKind::TimedOut`] when none arrived in time. A
    /// connection that ended on a timeout of its own (all links down too long, idle) fails
    /// every call with that kind too, at once: its error carries the [`ConnectionError`]
    /// (`e.get_ref()`), and [`close_reason`](Self::close_reason) tells the two apart, so a
    /// loop that retries on `TimedOut` should look there.
    pub fn recv_datagram_timeout(&self, timeout: Option<Duration>) -> io::Result<Option<Vec<u8>>> {
        match &self.inner {
            Inner::Udp(c) => c.recv_datagram_timeout(timeout),
            Inner::Tcp(_) => Err(tcp_refuses("unreliable datagrams")),
        }
    }

    /// Receives one datagram if one is waiting; an error of kind
    /// [`io::ErrorKind::WouldBlock`] otherwise. Never blocks.
    pub fn try_recv_datagram(&self) -> io::Result<Option<Vec<u8>>> {
        match &self.inner {
            Inner::Udp(c) => c.try_recv_datagram(),
            Inner::Tcp(_) => Err(tcp_refuses("unreliable datagrams")),
        }
    }

    /// Receives one whole message; `Ok(None)` once the peer finished its message stream.
    pub fn recv_message(&self) -> io::Result<Option<Vec<u8>>> {
        match &self.inner {
            Inner::Udp(c) => c.recv_message(),
            Inner::Tcp(TcpHandle(c)) => c.recv_message(true, None),
        }
    }

    /// [`recv_message`](Self::recv_message), waiting at most `timeout` (`None`: as long as it
    /// takes): an error of kind [`io::ErrorKind::TimedOut`] when no whole message arrived in
    /// time, or at once when the connection ended on a timeout of its own (see
    /// [`recv_datagram_timeout`](Self::recv_datagram_timeout)): retry only while
    /// [`close_reason`](Self::close_reason) is `None`.
    pub fn recv_message_timeout(&self, timeout: Option<Duration>) -> io::Result<Option<Vec<u8>>> {
        match &self.inner {
            Inner::Udp(c) => c.recv_message_timeout(timeout),
            Inner::Tcp(TcpHandle(c)) => {
                c.recv_message(true, timeout.and_then(|t| Instant::now().checked_add(t)))
            }
        }
    }

    /// What [`try_recv_message`](Self::try_recv_message) (`datagrams`: `try_recv_datagram`)
    /// does to the readiness descriptors, without taking anything: clears those it clears,
    /// then signals them again for what waits for callers of other kinds. For a caller that
    /// answers a non-blocking receive itself (`WouldBlock` while another of its threads
    /// receives: the C library's turns): an edge-triggered loop is woken only by a signal
    /// after a clear, and a `WouldBlock` that cleared nothing left the descriptor signalled
    /// for good (a level-triggered loop spun; later arrivals did not signal it again).
    pub fn look_without_receiving(&self, datagrams: bool) {
        let kind = match datagrams {
            true => Caller::ReadDatagram,
            false => Caller::ReadMessage,
        };
        match &self.inner {
            Inner::Udp(c) => c.look_without_receiving(kind),
            Inner::Tcp(TcpHandle(c)) => c.look_without_receiving(kind),
        }
    }

    /// Receives one whole message if one has fully arrived; `Ok(None)` once the peer finished
    /// its message stream; an error of kind [`io::ErrorKind::WouldBlock`] when no whole
    /// message is waiting. Never blocks.
    pub fn try_recv_message(&self) -> io::Result<Option<Vec<u8>>> {
        match &self.inner {
            Inner::Udp(c) => c.try_recv_message(),
            Inner::Tcp(TcpHandle(c)) => c.recv_message(false, None),
        }
    }

    /// Takes the whole messages that have arrived, oldest first and at most `max` (at least
    /// one), into `bufs`, without waiting: afterwards `bufs` holds exactly those (none once
    /// the peer finished its message stream and every message was read). On the UDP
    /// transport they are copied into the memory of the buffers it held, so a loop passing
    /// the same `bufs` allocates little; the TCP transport hands over the buffers its
    /// messages were joined in (each of its message's length) instead, and lets go of those
    /// `bufs` held. An error of kind [`io::ErrorKind::WouldBlock`] when no whole message is
    /// waiting. Never blocks.
    pub fn try_recv_messages_into(&self, bufs: &mut Vec<Vec<u8>>, max: usize) -> io::Result<()> {
        match &self.inner {
            Inner::Udp(c) => c.try_recv_messages_into(bufs, max),
            Inner::Tcp(TcpHandle(c)) => {
                bufs.clear();
                while bufs.len() < max.max(1) {
                    match c.recv_message(false, None) {
                        Ok(Some(m)) => bufs.push(m),
                        Ok(None) => break,
                        // what was taken is handed over first; the next call sees the error
                        Err(_) if !bufs.is_empty() => break,
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
        }
    }

    /// Sends the messages of `msgs` in order, each whole, while the send buffer has room for
    /// the next, without waiting: how many it took (the first not taken and those after it
    /// were not sent). Their packets leave together, as full as they can be, where one
    /// [`try_send_message`](Self::try_send_message) per message may send each at once. An
    /// error when not even the first was taken: of kind [`io::ErrorKind::WouldBlock`] when
    /// the buffer has no room for it now (the readiness descriptor is signalled when there
    /// is), or what `try_send_message` would have returned. Never blocks.
    pub fn try_send_messages<'m>(
        &self,
        msgs: impl IntoIterator<Item = &'m [u8]>,
    ) -> io::Result<usize> {
        match &self.inner {
            Inner::Udp(c) => c.try_send_messages(msgs),
            Inner::Tcp(TcpHandle(c)) => {
                let mut sent = 0;
                for m in msgs {
                    match c.send_message(m, false, None) {
                        Ok(()) => sent += 1,
                        Err(_) if sent > 0 => break,
                        Err(e) => return Err(e),
                    }
                }
                Ok(sent)
            }
        }
    }

    /// Sends one whole message if the buffer has room for it now; an error of kind
    /// [`io::ErrorKind::WouldBlock`] otherwise (the readiness descriptor is signalled when
    /// there is room). Never blocks.
    pub fn try_send_message(&self, msg: &[u8]) -> io::Result<()> {
        match &self.inner {
            Inner::Udp(c) => c.try_send_message(msg),
            Inner::Tcp(TcpHandle(c)) => c.send_message(msg, false, None),
        }
    }

    /// Writes to the byte stream as [`Write::write`](io::Write::write) does (as much of `buf`
    /// as the send buffer takes), waiting at most `timeout` for room (`None`: as long as it
    /// takes): an error of kind [`io::ErrorKind::TimedOut`] when there was none in time, or at
    /// once when the connection ended on a timeout of its own. It clears no readiness
    /// descriptor (see [`read_timeout`](Self::read_timeout)).
    pub fn write_timeout(&self, buf: &[u8], timeout: Option<Duration>) -> io::Result<usize> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        match &self.inner {
            Inner::Udp(c) => c.write_until(buf, deadline),
            Inner::Tcp(TcpHandle(c)) => c.write(buf, true, deadline),
        }
    }

    /// What [`try_write_buf`](Self::try_write_buf) takes of `buf`, waiting at most `timeout`
    /// for the room it needs (`None`: as long as it takes): an error of kind
    /// [`io::ErrorKind::TimedOut`] when there was none in time (`buf` is left as it was), or
    /// at once when the connection ended on a timeout of its own. It clears no readiness
    /// descriptor (see [`read_timeout`](Self::read_timeout)).
    pub fn write_buf_timeout(
        &self,
        buf: &mut Vec<u8>,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        match &self.inner {
            Inner::Udp(c) => c.take_buf_until(buf, deadline),
            Inner::Tcp(TcpHandle(c)) => c.take_buf(buf, true, deadline),
        }
    }

    /// Reads from the byte stream as [`Read::read`](io::Read::read) does, waiting at most
    /// `timeout` for the first byte (`None`: as long as it takes): an error of kind
    /// [`io::ErrorKind::TimedOut`] when none arrived in time, or at once when the connection
    /// ended on a timeout of its own (see [`recv_message_timeout`](Self::recv_message_timeout)).
    /// Unlike a loop of [`try_read`](Self::try_read) and a wait on a readiness descriptor, it
    /// clears no descriptor: a thread waiting here never takes a wake-up meant for an event
    /// loop that watches the same connection.
    pub fn read_timeout(&self, buf: &mut [u8], timeout: Option<Duration>) -> io::Result<usize> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        match &self.inner {
            Inner::Udp(c) => c.read_until(buf, deadline),
            Inner::Tcp(TcpHandle(c)) => c.read(buf, true, deadline),
        }
    }

    /// Reads what has arrived of the byte stream: `Ok(0)` at its end (for a non-empty
    /// `buf`), an error of kind [`io::ErrorKind::WouldBlock`] when nothing is waiting. Never
    /// blocks.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.inner {
            Inner::Udp(c) => c.try_read(buf),
            Inner::Tcp(TcpHandle(c)) => c.read(buf, false, None),
        }
    }

    /// Writes as much of `buf` to the byte stream as the send buffer takes now; an error of
    /// kind [`io::ErrorKind::WouldBlock`] when it is full. Never blocks.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match &self.inner {
            Inner::Udp(c) => c.try_write(buf),
            Inner::Tcp(TcpHandle(c)) => c.write(buf, false, None),
        }
    }

    /// A file descriptor that becomes readable when this connection may have progressed
    /// (data or a whole message arrived, buffer space was freed, a link changed state, the
    /// connection closed), for `poll`/`epoll`/mio/tokio. Register it for reading, never read
    /// it yourself: the non-blocking calls ([`try_read`](Self::try_read),
    /// [`try_write`](Self::try_write), [`try_recv_message`](Self::try_recv_message),
    /// [`try_send_message`](Self::try_send_message)) clear it before they look, so after one
    /// of them returned `WouldBlock` it becomes readable as soon as retrying may succeed.
    /// A call of one kind does not hide what waits for another: a call that clears the
    /// descriptor signals it again if a read of another kind would return data, or a writer
    /// that was told of room has not retried; each kind of call does so once for each signal
    /// of the connection's own, so a loop that leaves one kind unread is not woken for it
    /// over and over. Call them until `WouldBlock` after each wake-up (the descriptor is
    /// edge-like). Lives as long as this handle.
    pub fn readiness_fd(&self) -> io::Result<BorrowedFd<'_>> {
        match &self.inner {
            Inner::Udp(c) => c.readiness_fd(),
            Inner::Tcp(TcpHandle(c)) => c.readiness_fd(Interest::Any),
        }
    }

    /// A readiness descriptor for reading alone: readable when a retry of
    /// [`try_read`](Self::try_read), [`try_recv_message`](Self::try_recv_message) or
    /// [`try_recv_datagram`](Self::try_recv_datagram) may succeed, and cleared only by them.
    /// With [`write_readiness_fd`](Self::write_readiness_fd) a reader and a writer that wait
    /// apart (an asyncio transport, tokio's split halves) never clear each other's wake-ups,
    /// as they would sharing [`readiness_fd`](Self::readiness_fd). Lives as long as this
    /// handle.
    pub fn read_readiness_fd(&self) -> io::Result<BorrowedFd<'_>> {
        match &self.inner {
            Inner::Udp(c) => c.read_readiness_fd(),
            Inner::Tcp(TcpHandle(c)) => c.readiness_fd(Interest::Read),
        }
    }

    /// A readiness descriptor for the calls of one kind alone (reading stream bytes,
    /// messages or datagrams; writing stream bytes or messages), cleared only by them:
    /// callers of different kinds that wait apart (the tokio adapter's tasks) never clear
    /// each other's wake-ups.
    pub(crate) fn kind_fd(&self, kind: Caller) -> io::Result<BorrowedFd<'_>> {
        match &self.inner {
            Inner::Udp(c) => c.readiness_fd_for(Interest::Kind(kind)),
            Inner::Tcp(TcpHandle(c)) => c.readiness_fd(Interest::Kind(kind)),
        }
    }

    /// Readiness descriptors for the byte stream's calls alone: readable when a retry of
    /// [`try_read`](Self::try_read) (`stream_read_readiness_fd`) or
    /// [`try_write`](Self::try_write) (`stream_write_readiness_fd`) may succeed, and cleared
    /// only by the stream's own calls. For a stream reader and writer that wait beside code
    /// making message or datagram calls on the same connection (an asyncio transport whose
    /// application also sends messages): those calls clear
    /// [`read_readiness_fd`](Self::read_readiness_fd) and
    /// [`write_readiness_fd`](Self::write_readiness_fd), and may take a wake-up meant for
    /// the stream, never these. Live as long as this handle.
    pub fn stream_read_readiness_fd(&self) -> io::Result<BorrowedFd<'_>> {
        self.kind_fd(Caller::ReadStream)
    }

    /// See [`stream_read_readiness_fd`](Self::stream_read_readiness_fd).
    pub fn stream_write_readiness_fd(&self) -> io::Result<BorrowedFd<'_>> {
        self.kind_fd(Caller::WriteStream)
    }

    /// Has [`Endpoint::wait_receiving`](crate::Endpoint::wait_receiving) report the
    /// connection by `token` when data that call received makes it readable, instead of
    /// signalling its readiness descriptors (`None`: signal them again; `u64::MAX` counts as
    /// none). The event loop then learns of an arrival without a system call. Everything
    /// else still signals the descriptors: data another thread received, writability, state
    /// changes. On the TCP transport it changes nothing.
    pub fn set_loop_token(&self, token: Option<u64>) {
        if let Inner::Udp(c) = &self.inner {
            c.set_loop_token(token);
        }
    }

    /// Makes the descriptor of `interest` readable again, if it was made: a caller that may
    /// have cleared a signal meant for others waiting on the same descriptor gives it back.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn signal_again(&self, interest: Interest) {
        match &self.inner {
            Inner::Udp(c) => c.signal_again(interest),
            Inner::Tcp(TcpHandle(c)) => c.signal_again(interest),
        }
    }

    /// A readiness descriptor for writing alone: readable when a retry of
    /// [`try_write`](Self::try_write) or [`try_send_message`](Self::try_send_message) may
    /// succeed (buffer space was freed, or the connection changed state), and cleared only by
    /// them. See [`read_readiness_fd`](Self::read_readiness_fd).
    pub fn write_readiness_fd(&self) -> io::Result<BorrowedFd<'_>> {
        match &self.inner {
            Inner::Udp(c) => c.write_readiness_fd(),
            Inner::Tcp(TcpHandle(c)) => c.readiness_fd(Interest::Write),
        }
    }

    /// Ends both outgoing streams: the peer reads end-of-stream after what was written. Fails
    /// with the connection's error (as a read would) once it ended on one: nothing will
    /// carry the end then.
    pub fn finish(&self) -> io::Result<()> {
        match &self.inner {
            Inner::Udp(c) => c.finish(),
            Inner::Tcp(TcpHandle(c)) => c.finish(),
        }
    }

    /// Waits until the peer has acknowledged everything written and the end of both streams
    /// (call [`finish`](Self::finish) first), or until `timeout`.
    pub fn wait_acknowledged(&self, timeout: Option<Duration>) -> io::Result<()> {
        match &self.inner {
            Inner::Udp(c) => c.wait_acknowledged(timeout),
            Inner::Tcp(TcpHandle(c)) => c.wait_acknowledged(timeout),
        }
    }

    /// Whether the peer has acknowledged everything written and the end of both streams: what
    /// [`wait_acknowledged`](Self::wait_acknowledged) waits for, without waiting.
    pub fn is_acknowledged(&self) -> bool {
        match &self.inner {
            Inner::Udp(c) => c.is_acknowledged(),
            Inner::Tcp(TcpHandle(c)) => c.is_acknowledged(),
        }
    }

    /// Writes all of `buf` to the stream, waiting for room, without copying a large buffer
    /// (16 KiB or more): the connection keeps it until the peer acknowledged it and leaves
    /// `buf` empty, with the memory of a buffer it no longer needs when it has one: fill it
    /// with the next data and write it again, and nothing is allocated per write. So
    /// the data is copied once in user space, into the datagrams (as they are built, under
    /// the engine's lock). Smaller buffers are copied, as by `write`.
    pub fn write_buf(&self, buf: &mut Vec<u8>) -> io::Result<()> {
        match &self.inner {
            Inner::Udp(c) => c.write_buf(buf),
            Inner::Tcp(TcpHandle(c)) => c.write_buf(buf),
        }
    }

    /// [`write_buf`](Self::write_buf) without waiting: takes a large `buf` (16 KiB or more)
    /// whole or not at all, leaving it empty as `write_buf` does, and a small one as far as
    /// there is room (the bytes taken leave its front); returns how many bytes it took, an
    /// error of kind [`io::ErrorKind::WouldBlock`] when it took none (the readiness
    /// descriptors are then signalled when there is room). A large buffer is taken, as by
    /// `write_buf`, once the send buffer has room for all of it or is empty on the UDP
    /// transport, and once it has any room on the TCP transport (which may then hold more
    /// than its size). Never blocks.
    pub fn try_write_buf(&self, buf: &mut Vec<u8>) -> io::Result<usize> {
        match &self.inner {
            Inner::Udp(c) => c.try_write_buf(buf),
            Inner::Tcp(TcpHandle(c)) => c.take_buf(buf, false, None),
        }
    }

    /// Writes all of `data` to the byte stream, waiting for room, as
    /// [`write_buf`](Self::write_buf) writes a buffer, but a large `data` (16 KiB or more) is
    /// shared rather than taken: the connection keeps a clone of it (no copy) until the peer
    /// acknowledged it. An application that holds its data as [`Bytes`] already, or sends the
    /// same memory again and again (a benchmark), copies nothing in user space but into the
    /// datagrams. Smaller `data` is copied, as by `write`.
    pub fn write_bytes(&self, mut data: Bytes) -> io::Result<()> {
        while !data.is_empty() {
            let n = match &self.inner {
                Inner::Udp(c) => c.write_bytes(&data)?,
                Inner::Tcp(TcpHandle(c)) => c.write_bytes(&data, true)?,
            };
            data.advance(n);
        }
        Ok(())
    }

    /// [`write_bytes`](Self::write_bytes) without waiting: takes a large `data` whole, a
    /// small one as far as there is room, and returns how many bytes it took; an error of
    /// kind [`io::ErrorKind::WouldBlock`] when the send buffer has no room for it. Never
    /// blocks.
    pub fn try_write_bytes(&self, data: &Bytes) -> io::Result<usize> {
        match &self.inner {
            Inner::Udp(c) => c.try_write_bytes(data),
            Inner::Tcp(TcpHandle(c)) => c.write_bytes(data, false),
        }
    }

    /// Reads the next bytes of the stream into `buf`, replacing its contents and waiting until
    /// some are there; returns how many (0: the peer finished). When a whole block of the
    /// receive buffer (64 KiB; less for a smaller `stream_receive_window`) is ready it is handed over as `buf` without copying, and the memory
    /// `buf` had is kept for a later block: reuse the same `buf` for every call.
    pub fn read_buf(&self, buf: &mut Vec<u8>) -> io::Result<usize> {
        match &self.inner {
            Inner::Udp(c) => c.read_buf(buf),
            Inner::Tcp(TcpHandle(c)) => c.read_buf(buf),
        }
    }

    /// Replaces `chunk` with the next bytes of the stream, waiting until some are there;
    /// returns how many (0: the peer finished). Nothing is copied: the chunk is the memory
    /// the bytes were received (or, with a key, opened) into, which on the TCP transport need
    /// not start a buffer of its own, so [`read_buf`](Self::read_buf) would have to copy it.
    /// The memory of the chunk replaced is kept for later ones if nothing else holds it:
    /// reuse the same `chunk` for every call.
    pub fn read_chunk(&self, chunk: &mut Bytes) -> io::Result<usize> {
        self.read_chunk_now(chunk, true)
    }

    /// [`read_chunk`](Self::read_chunk) without waiting: an error of kind
    /// [`io::ErrorKind::WouldBlock`] when nothing is waiting. Never blocks. (What `chunk`
    /// held counts as read either way: do not look at it after the call.)
    pub fn try_read_chunk(&self, chunk: &mut Bytes) -> io::Result<usize> {
        self.read_chunk_now(chunk, false)
    }

    fn read_chunk_now(&self, chunk: &mut Bytes, block: bool) -> io::Result<usize> {
        match &self.inner {
            Inner::Udp(c) => {
                let mut buf = reclaim_filled(std::mem::take(chunk));
                let read = if block {
                    c.read_buf(&mut buf)
                } else {
                    c.try_read_buf(&mut buf)
                };
                *chunk = Bytes::from(buf);
                read
            }
            Inner::Tcp(TcpHandle(c)) => c.read_chunk(chunk, block),
        }
    }

    /// Aborts the connection at once; the peer sees `PeerAborted` with `code` and `reason`
    /// (a code above [`MAX_ABORT_CODE`](crate::MAX_ABORT_CODE) as that).
    pub fn abort(&self, code: u64, reason: &str) {
        match &self.inner {
            Inner::Udp(c) => c.abort(code, reason),
            Inner::Tcp(TcpHandle(c)) => c.abort(code, reason),
        }
    }

    /// The connection's state.
    pub fn state(&self) -> ConnectionState {
        match &self.inner {
            Inner::Udp(c) => c.state(),
            Inner::Tcp(TcpHandle(c)) => c.state(),
        }
    }

    /// Per-link and buffer statistics.
    pub fn stats(&self) -> ConnectionStats {
        match &self.inner {
            Inner::Udp(c) => c.stats(),
            Inner::Tcp(TcpHandle(c)) => c.stats(),
        }
    }

    /// State changes since the last call (connected, link added, link state changes, all
    /// acknowledged, closed), oldest first, each with when the engine reported it: an
    /// application that polls rarely, e.g. because its writes block while every link is
    /// down, still learns when a link went down. Data readiness ([`Event::Readable`],
    /// [`Event::Writable`]) is not queued here: it is a level, seen through the calls
    /// themselves and [`readiness_fd`](Self::readiness_fd).
    pub fn poll_events(&self) -> Vec<TimedEvent> {
        match &self.inner {
            Inner::Udp(c) => c.poll_events(),
            Inner::Tcp(TcpHandle(c)) => c.poll_events(),
        }
    }

    /// Ends the connection when no link has been up for `all_links_down`
    /// ([`ConnectionError::AllLinksDown`]), or nothing at all was received for `idle`
    /// ([`ConnectionError::IdleTimeout`]): in place of the
    /// [`ConnectionConfig`](crate::ConnectionConfig)'s
    /// [`all_links_down_timeout`](crate::ConnectionConfig::all_links_down_timeout) and
    /// [`idle_timeout`](crate::ConnectionConfig::idle_timeout) it started with (`None`:
    /// never, the default: the connection waits out any outage). The calls waiting on it then
    /// fail with [`std::io::ErrorKind::TimedOut`]. For a server's accepted connections, and
    /// for bindings whose connections are made with the default configuration. An idle limit
    /// shorter than a few keepalive intervals ends healthy connections that have nothing to
    /// say: a quiet peer is heard about once per keepalive interval.
    pub fn set_timeouts(&self, all_links_down: Option<Duration>, idle: Option<Duration>) {
        match &self.inner {
            Inner::Udp(c) => c.set_timeouts(all_links_down, idle),
            Inner::Tcp(TcpHandle(c)) => c.set_timeouts(crate::tcp::conn::Timeouts {
                all_links_down,
                idle,
            }),
        }
    }

    /// Why the connection ended, if it did with an error.
    pub fn close_reason(&self) -> Option<ConnectionError> {
        match &self.inner {
            Inner::Udp(c) => c.close_reason(),
            Inner::Tcp(TcpHandle(c)) => c.close_reason(),
        }
    }
}

/// Like `TcpStream`, a shared reference reads and writes too, so one thread may read while
/// another writes or watches the statistics.
impl io::Read for &Connection {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.inner {
            Inner::Udp(c) => io::Read::read(&mut &*c, buf),
            Inner::Tcp(TcpHandle(c)) => c.read(buf, true, None),
        }
    }
}

impl io::Write for &Connection {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &self.inner {
            Inner::Udp(c) => io::Write::write(&mut &*c, buf),
            Inner::Tcp(TcpHandle(c)) => c.write(buf, true, None),
        }
    }

    /// Data is on its way once written; flushing has nothing to wait for. Use
    /// [`Connection::wait_acknowledged`] to know the peer has it.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl io::Read for Connection {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl io::Write for Connection {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The memory of `b` for the UDP transport's receive stream: with its bytes still in it where
/// they run to the end of that memory (a whole block handed out, the usual chunk), else
/// emptied as [`reclaim`] gives it, or none if something else holds it. The stream reuses a
/// block-sized buffer as it is, but must zero an emptied one to a block's length before
/// reuse: a pass over the memory for every block received.
fn reclaim_filled(b: Bytes) -> Vec<u8> {
    match b.try_into_mut() {
        // (at the start of the memory too unless the application advanced the chunk, and
        // then moved there by the conversion)
        Ok(m) if m.len() == m.capacity() => Vec::from(m),
        Ok(m) => reclaim(m.freeze()).unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole block goes back with its bytes and at the start of its memory, ready to be
    /// reused without zeroing; a part of one goes back emptied, one still shared not at all.
    #[test]
    fn a_whole_chunk_gives_back_its_memory_still_filled() {
        let len = 64 << 10;
        let b = Bytes::from(vec![7u8; len]);
        let memory = b.as_ptr();
        let back = reclaim_filled(b);
        assert_eq!((back.len(), back.as_ptr()), (len, memory));
        assert!(back.iter().all(|&x| x == 7));

        let mut roomy = vec![7u8; 1000];
        roomy.reserve_exact(500);
        let back = reclaim_filled(Bytes::from(roomy));
        assert!(back.is_empty() && back.capacity() >= 1000);

        let b = Bytes::from(vec![7u8; len]);
        let other = b.clone();
        assert_eq!(reclaim_filled(b).capacity(), 0);
        assert_eq!(reclaim_filled(other).len(), len, "alone now");
    }
}
