//! ri2n: one reliable connection striped over several network links, over plain UDP.
//!
//! An [`Endpoint`] binds one UDP socket per local address; each (local, remote) address pair
//! a connection uses is a link. Data is striped over every healthy link, a failed or degraded
//! link is detected within milliseconds and its data re-sent on the others, and a connection
//! survives every link being down: reads and writes just wait until a link works again.
//!
//! ```no_run
//! use std::io::{Read, Write};
//! use ri2n::{ConnectionConfig, Endpoint};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = Endpoint::server(&["127.0.0.1:7000".parse()?, "127.0.0.2:7000".parse()?])?;
//! let client = Endpoint::client(&["127.0.0.1:0".parse()?, "127.0.0.2:0".parse()?])?;
//! // one address is enough: the server tells the client its others
//! let mut conn = client.connect(&["127.0.0.1:7000".parse()?], ConnectionConfig::default())?;
//! conn.write_all(b"hello")?;
//! conn.finish()?;
//! let mut peer = server.accept()?;
//! let mut got = String::new();
//! peer.read_to_string(&mut got)?;
//! assert_eq!(got, "hello");
//! # Ok(()) }
//! ```
//!
//! The protocol engine is the sans-IO crate [`ri2n_proto`]; this crate is its driver.

#![warn(missing_docs)]

mod carrier;
mod connection;
mod driver;
pub mod fork;
mod impair;
mod key_file;
#[cfg(test)]
mod netns_test;
mod open_ahead;
mod outgoing;
mod pages;
mod readiness;
mod sched;
mod shards;
mod socket;
mod tcp;
#[cfg(feature = "tokio")]
pub mod tokio;
mod udp_connection;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The chunks [`Connection::read_chunk`] hands over, and the shared memory
/// [`Connection::write_bytes`] takes.
pub use bytes::Bytes;
pub use connection::{Connection, TimedEvent};
pub use impair::Impairment;
pub use key_file::{follow_links, write_key_file};
pub use ri2n_proto::{
    datagram_capacity, Cipher, ConnectError, ConnectionConfig, ConnectionError, ConnectionState,
    ConnectionStats, DropCounts, DropReason, EndpointConfig, Event, Key, KeyError, KeyMismatch,
    KeyReadError, LinkId, LinkState, LinkStats, LinkThreads, ReadError, RefusalReason,
    RefusedHandshake, SendLimits, SendThreads, Shard, Striping, Transport, WriteError,
    KEY_FILE_MAX, MAX_ABORT_CODE, MAX_DATAGRAM_LEN, MAX_LINKS, MAX_SHARDS, SHARDS_LIMIT,
};

use shards::Shards;
use udp_connection::UdpConnection;

/// The errno a socket call fails with for a connection that ended (or never started) with
/// `e`, as the C interface returns it and Python's exceptions carry it: `ETIMEDOUT` (no
/// answer, every link down too long, idle), `ECONNREFUSED` (nothing listens, not a server,
/// full, another application), `EACCES` (the keys differ), `ECONNRESET` (the peer's end,
/// whatever it was), `ECONNABORTED` (this side aborted it), `EPROTO` (a side broke the
/// protocol), else `EIO`.
pub fn errno_of(e: &ConnectionError) -> i32 {
    match e {
        ConnectionError::TimedOut(_)
        | ConnectionError::AllLinksDown
        | ConnectionError::IdleTimeout => libc::ETIMEDOUT,
        ConnectionError::Refused
        | ConnectionError::NotAccepting
        | ConnectionError::ServerFull
        | ConnectionError::WrongApplication { .. } => libc::ECONNREFUSED,
        ConnectionError::KeyMismatch(_) => libc::EACCES,
        // the peer's end, whatever it was: gone, restarted, aborted, its error, or closed
        // before it took everything
        ConnectionError::PeerRestarted
        | ConnectionError::PeerAborted { .. }
        | ConnectionError::PeerGone
        | ConnectionError::PeerError { .. }
        | ConnectionError::ClosedEarly => libc::ECONNRESET,
        ConnectionError::LocallyAborted => libc::ECONNABORTED,
        ConnectionError::ProtocolViolation(_) => libc::EPROTO,
        _ => libc::EIO,
    }
}

/// Whether `setting` gives each link socket a thread of its own in an endpoint made in this
/// process: [`LinkThreads::Auto`] decided by the CPUs the process may use.
pub fn link_threads_wanted(setting: LinkThreads) -> bool {
    outgoing::lanes_wanted(setting)
}

/// The first shard, whose sockets resolved the ports (the others share its addresses, ports
/// and impairment switches).
fn first(shards: &Shards) -> &driver::Shared {
    shards.drivers[0].shared()
}

/// What can go wrong setting up endpoints and connections.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A local address could not be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The connection could not be started (bad address list or configuration).
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The connection ended.
    #[error(transparent)]
    Connection(#[from] ConnectionError),
    /// Waiting timed out.
    #[error("timed out")]
    TimedOut,
    /// Closing the endpoint: some peers never acknowledged everything written to them.
    #[error("{connections} connection(s) closed with {bytes} written bytes never acknowledged")]
    NotDelivered {
        /// Connections concerned.
        connections: usize,
        /// Bytes written to them that their peers did not acknowledge.
        bytes: u64,
    },
    /// Another I/O failure.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Replaces each wildcard address by the host's interface addresses of its family (IPv6
/// link-local ones left out: they need a scope), keeping its port; drops repeats.
fn expand_wildcards(addrs: &[SocketAddr]) -> Result<Vec<SocketAddr>, Error> {
    let mut out: Vec<SocketAddr> = Vec::new();
    let mut interfaces: Option<Vec<if_addrs::Interface>> = None;
    for &wanted in addrs {
        let expanded: Vec<SocketAddr> = if wanted.ip().is_unspecified() {
            let interfaces = match &mut interfaces {
                Some(i) => i,
                None => {
                    interfaces.insert(if_addrs::get_if_addrs().map_err(|source| Error::Bind {
                        addr: wanted,
                        source,
                    })?)
                }
            };
            let found: Vec<SocketAddr> = interfaces
                .iter()
                .map(|i| i.ip())
                .filter(|ip| ip.is_ipv4() == wanted.is_ipv4() && !is_ipv6_link_local(ip))
                .map(|ip| SocketAddr::new(ip, wanted.port()))
                .collect();
            if found.is_empty() {
                return Err(Error::Bind {
                    addr: wanted,
                    source: std::io::Error::new(
                        std::io::ErrorKind::AddrNotAvailable,
                        "no interface has an address of this family",
                    ),
                });
            }
            found
        } else {
            vec![wanted]
        };
        for a in expanded {
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    Ok(out)
}

fn is_ipv6_link_local(ip: &std::net::IpAddr) -> bool {
    matches!(ip, std::net::IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
}

/// Seeds an endpoint's engine from the operating system's random source.
fn os_seed() -> [u8; 32] {
    use rand::RngCore;
    let mut seed = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut seed);
    seed
}

/// A host's ri2n endpoint: its sockets, its driver threads and its connections. A server's
/// connections are spread over one engine and driver thread per core (its shards, see
/// [`EndpointConfig::shards`]); each connection stays on one.
#[derive(Debug, Clone)]
pub struct Endpoint {
    inner: Transports,
}

/// An endpoint of either transport.
#[derive(Debug, Clone)]
enum Transports {
    Udp(Arc<Shards>),
    Tcp(Arc<TcpHandle>),
}

/// The application's handle on a TCP-transport endpoint. When the last one goes nothing can
/// accept a connection any more: the endpoint refuses new ones and aborts those waiting, as a
/// UDP endpoint's shards do. The connections the application holds live on.
#[derive(Debug)]
struct TcpHandle {
    life: Arc<TcpLife>,
}

impl TcpHandle {
    fn endpoint(&self) -> &tcp::TcpEndpoint {
        &self.life.endpoint
    }

    /// A connection for the application, which keeps the endpoint alive while it lives.
    fn connection(&self, c: Arc<tcp::TcpConnection>) -> Connection {
        Connection::tcp(c, self.life.clone())
    }
}

impl Drop for TcpHandle {
    fn drop(&mut self) {
        self.life.endpoint.stop_accepting();
    }
}

/// A TCP-transport endpoint, held by the application's handles on it and on its
/// connections: dropping the last closes it like a UDP endpoint's driver (waiting up to
/// `close_linger` for delivery), so returning from `main` right after writing loses nothing.
#[derive(Debug)]
pub(crate) struct TcpLife {
    endpoint: Arc<tcp::TcpEndpoint>,
    linger: Duration,
}

impl Drop for TcpLife {
    fn drop(&mut self) {
        // a thread unwinding does not linger (as the UDP driver's drop)
        let linger = match std::thread::panicking() {
            true => Duration::ZERO,
            false => self.linger,
        };
        let (connections, bytes) = tcp_close(&self.endpoint, Instant::now().checked_add(linger));
        if connections > 0 {
            tracing::warn!(
                connections,
                bytes,
                local = ?self.endpoint.local_addrs(),
                "endpoint dropped with data its peers never acknowledged"
            );
        }
    }
}

/// How long closing TCP-transport connections waits for their links' writers to send the
/// CLOSE records, and for the peers to acknowledge them.
const TCP_CLOSE_WRITE: Duration = Duration::from_millis(200);

/// Waits until each of `connections`, ended already (closed or aborted: their writers are
/// sending the CLOSE records), has written its records and its peer acknowledged one, at most
/// [`TCP_CLOSE_WRITE`] for them all: peers too slow to take theirs hold up the rest no longer
/// than that.
fn tcp_closes_written(connections: &[Arc<tcp::TcpConnection>]) {
    let deadline = Instant::now() + TCP_CLOSE_WRITE;
    for c in connections {
        c.close(deadline.saturating_duration_since(Instant::now()));
    }
}

/// Ends a TCP endpoint whose application let it go: it refuses new connections, closes
/// those it has ([`tcp_close_connections`]) and stops listening. It listens on during the
/// close, for the links of those connections only: a link that fails during the wait is
/// opened again, as the UDP transport's sockets stay open until its close is done.
fn tcp_close(ep: &tcp::TcpEndpoint, deadline: Option<Instant>) -> (usize, u64) {
    ep.stop_accepting();
    let lost = tcp_close_connections(ep, deadline);
    ep.shut();
    lost
}

/// Finishes every connection of a TCP endpoint and waits until `deadline` for each to be
/// acknowledged; returns (connections, bytes) never acknowledged.
fn tcp_close_connections(ep: &tcp::TcpEndpoint, deadline: Option<Instant>) -> (usize, u64) {
    let mut lost = (0, 0);
    let connections = ep.connections();
    // every stream ends now: a peer that stops reading then holds up its own connection's
    // wait, not the ends of those after it
    for c in &connections {
        let _ = c.finish();
    }
    for c in &connections {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if c.wait_acknowledged(left).is_err() {
            // one that ended (the peer aborted it) with every byte written acknowledged
            // delivered all it had: only the end of its stream was not, which nobody awaits
            let bytes = c.unacknowledged();
            if bytes > 0 || c.state() != ConnectionState::Closed {
                lost.0 += 1;
                lost.1 += bytes;
            }
            c.abort(1, "the endpoint closed");
        } else if !c.peer_stream_complete() {
            // delivered, and the peer still sending: told so, not left waiting for a reader
            // (a clean CLOSE would read as one that came too early)
            c.abort(0, "the peer's endpoint was closed");
        }
        // its CLOSE goes now; the writes are waited for below, all together
        c.close(Duration::ZERO);
    }
    tcp_closes_written(&connections);
    lost
}

impl Endpoint {
    /// Binds `config.local_addrs` (port 0 picks a free port, for each address its own) and
    /// starts the driver. A wildcard address (`0.0.0.0`, `::`) stands for every address of
    /// that family the host's interfaces have now, each bound with its port (port 0: each a
    /// free port of its own): one socket per local address, so that each is a link of its
    /// own and replies leave from the address the peer used, and a server announces real
    /// addresses. Interfaces that appear later are not picked up.
    pub fn bind(mut config: EndpointConfig) -> Result<Self, Error> {
        config.validate()?;
        config.local_addrs = expand_wildcards(&config.local_addrs)?;
        if config.transport == Transport::Tcp {
            let linger = config.close_linger;
            return Ok(Self {
                inner: Transports::Tcp(Arc::new(TcpHandle {
                    life: Arc::new(TcpLife {
                        endpoint: tcp::TcpEndpoint::bind(config)?,
                        linger,
                    }),
                })),
            });
        }
        let sockets = driver::bind_all(&config.local_addrs)
            .map_err(|(addr, source)| Error::Bind { addr, source })?;
        config.local_addrs = sockets.iter().map(|s| s.local).collect();
        // as the sockets read it, which tell the engine when it changes
        config.local_max_datagram = (sockets.iter())
            .filter_map(|s| Some((s.local, s.max_datagram()?)))
            .collect();
        Ok(Self {
            inner: Transports::Udp(Arc::new(Shards::start(config, sockets, os_seed())?)),
        })
    }

    /// An endpoint that only makes outgoing connections, from these local addresses.
    pub fn client(local_addrs: &[SocketAddr]) -> Result<Self, Error> {
        Self::bind(EndpointConfig::new(local_addrs.to_vec()))
    }

    /// An endpoint that accepts connections on these addresses (and tells clients about all
    /// of them, so a client given one address opens a link to each).
    pub fn server(local_addrs: &[SocketAddr]) -> Result<Self, Error> {
        Self::bind(EndpointConfig::new(local_addrs.to_vec()).server())
    }

    /// How many shards (engines, each with its driver thread and sockets) the endpoint runs.
    pub fn shards(&self) -> usize {
        match &self.inner {
            Transports::Udp(s) => s.drivers.len(),
            Transports::Tcp(_) => 1,
        }
    }

    /// Waits until `ready` is readable or `timeout` passes (`None`: as long as it takes),
    /// receiving meanwhile on the calling thread what arrives on the sockets of shard `shard`
    /// (see [`Connection::shard`]), as a blocked call of one of its connections does. For an
    /// event loop that waits on many connections' readiness descriptors: pass its own epoll
    /// descriptor as `ready`, and an arrival wakes no thread but this one, which receives it,
    /// signals the descriptor of the connection concerned and returns. A connection given a
    /// token with [`Connection::set_loop_token`] is not signalled for what this call received
    /// for it: its token is appended to `readable` instead, and the loop serves it (read until
    /// `WouldBlock`) with no system call to learn of it. Returns whether `ready` may be
    /// readable: only then need the loop look at its set. It may return early (after
    /// handling arrivals): serve `readable`, look at your set if told, then wait again. While
    /// another call watches the shard's sockets, it waits on `ready` alone (and returns
    /// true); so does it on the TCP transport and for a shard the endpoint does not have.
    /// `ready` stays registered with the shard between calls: a call that looks without
    /// waiting costs no system call for it, one that is about to sleep one, which also finds
    /// a descriptor the caller closed and made again under the same number. The first call
    /// with a descriptor (or with such a new one) returns at once, telling that it may be
    /// readable: what it held before it was registered is not reported.
    pub fn wait_receiving(
        &self,
        shard: usize,
        ready: std::os::fd::BorrowedFd<'_>,
        timeout: Option<Duration>,
        readable: &mut Vec<u64>,
    ) -> bool {
        use std::os::fd::AsRawFd;
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        match &self.inner {
            Transports::Udp(s) if shard < s.drivers.len() => s.drivers[shard]
                .shared()
                .wait_receiving(ready.as_raw_fd(), deadline, readable),
            _ => {
                driver::poll_readable(ready.as_raw_fd(), timeout);
                true
            }
        }
    }

    /// The transport the endpoint's connections use.
    pub fn transport(&self) -> Transport {
        match &self.inner {
            Transports::Udp(_) => Transport::Udp,
            Transports::Tcp(_) => Transport::Tcp,
        }
    }

    /// Closes every connection of the endpoint gracefully: finishes their outgoing streams
    /// and waits, at most `timeout` (`None`: as long as it takes), until each peer has
    /// acknowledged everything written to it; a connection whose peer is still sending is
    /// aborted once our side is delivered, so the peer is not left waiting. Returns
    /// [`Error::NotDelivered`] if some data was never acknowledged.
    ///
    /// The endpoint itself stays open: a server accepts the connections that come in after
    /// `close` returned, and it may connect again.
    ///
    /// Dropping the last handle of an endpoint (the endpoint and all its connections) does the
    /// same with `EndpointConfig::close_linger` (default 10 s) as the timeout, so returning
    /// from `main` right after writing does not lose the data, and then ends the endpoint;
    /// call `close` to choose the time and learn the outcome.
    pub fn close(&self, timeout: Option<Duration>) -> Result<(), Error> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let (connections, bytes) = match &self.inner {
            Transports::Udp(s) => {
                let lost = s.close_all(deadline);
                (lost.connections, lost.bytes)
            }
            Transports::Tcp(t) => tcp_close_connections(t.endpoint(), deadline),
        };
        if connections == 0 {
            Ok(())
        } else {
            Err(Error::NotDelivered { connections, bytes })
        }
    }

    /// Aborts every connection of the endpoint now, as [`Connection::abort`] aborts one:
    /// each peer is told `code` and `reason` (its calls fail with
    /// [`ConnectionError::PeerAborted`]), nothing more is sent or delivered, and what was
    /// written but not acknowledged is dropped. Returns once the CLOSE packets (or records)
    /// have left, so a process may exit right after: the clients of a server that is stopped
    /// (`ri2n serve` on SIGTERM) learn why at once instead of finding it gone. Connections
    /// accepted afterwards are not affected.
    pub fn abort(&self, code: u64, reason: &str) {
        match &self.inner {
            Transports::Udp(s) => s.abort_all(code, reason),
            Transports::Tcp(t) => {
                let connections = t.endpoint().connections();
                for c in &connections {
                    c.abort(code, reason);
                }
                tcp_closes_written(&connections);
            }
        }
    }

    /// The bound local addresses, ports resolved. A TCP client's ports stay as given (0:
    /// each connection binds sockets of its own).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        match &self.inner {
            Transports::Udp(s) => first(s).local_addrs().collect(),
            Transports::Tcp(t) => t.endpoint().local_addrs(),
        }
    }

    /// Whether each link has a thread of its own that sends ([`EndpointConfig::send_threads`]
    /// as it turned out on this host): the UDP transport's lanes, or the TCP transport's
    /// writers (always).
    pub fn send_threads(&self) -> bool {
        match &self.inner {
            Transports::Udp(s) => first(s).has_lanes(),
            Transports::Tcp(_) => true,
        }
    }

    /// Whether each link has a thread of its own that receives ([`EndpointConfig::recv_threads`]
    /// as it turned out on this host): the UDP transport's receiving lanes, or the TCP
    /// transport's readers (always).
    pub fn recv_threads(&self) -> bool {
        match &self.inner {
            Transports::Udp(s) => first(s).has_recv_lanes(),
            Transports::Tcp(_) => true,
        }
    }

    /// The UDP shards; `None` on the TCP transport.
    fn udp(&self) -> Option<&Shards> {
        match &self.inner {
            Transports::Udp(s) => Some(s),
            Transports::Tcp(_) => None,
        }
    }

    /// Received datagrams the engine dropped without acting on them, by reason (garbage,
    /// strangers, duplicates, packets for connections already gone, forged ICMP errors).
    pub fn dropped_datagrams(&self) -> DropCounts {
        let Some(shards) = self.udp() else {
            return DropCounts::default();
        };
        (shards.drivers.iter())
            .map(|d| d.shared().lock().engine().dropped().clone())
            .reduce(|a, b| a + &b)
            .unwrap_or_default()
    }

    /// Handshakes refused since the last call because the client holds another key (or one
    /// side has none) or speaks another application, for a server to log: at most about one
    /// per second is reported (per shard), the others only counted in
    /// [`dropped_datagrams`](Self::dropped_datagrams) (on the UDP transport).
    pub fn refused_handshakes(&self) -> Vec<RefusedHandshake> {
        let shards = match &self.inner {
            Transports::Udp(s) => s,
            Transports::Tcp(t) => return t.endpoint().refused_handshakes(),
        };
        let mut refused = Vec::new();
        for d in &shards.drivers[..] {
            let mut st = d.shared().lock();
            let engine = st.engine_mut();
            refused.extend(std::iter::from_fn(|| engine.poll_refused_handshake()));
        }
        refused
    }

    /// The impairment switch of the socket bound to `local`, to break that link on purpose.
    pub fn impairment(&self, local: SocketAddr) -> Option<Arc<Impairment>> {
        self.udp().and_then(|s| first(s).impairment(local))
    }

    /// Connects to a peer given one or more of its addresses, waiting until the handshake
    /// completes or fails. The handshake goes to the first address and, while that one does
    /// not answer, to the others in turn (each becomes a link once it is done, as many as a
    /// connection carries; any number may be given), so a peer
    /// whose first address is down or refuses is reached on another; an address where an
    /// endpoint that is not a server answers (or a service that is no ri2n server, on the
    /// TCP transport) is left out, and what it answers later does not end the connection. It
    /// fails with
    /// [`ConnectionError::TimedOut`] without an answer within the configuration's
    /// `handshake_timeout` (10 s by default), [`ConnectionError::Refused`] when nothing
    /// listens at any of them, [`ConnectionError::NotAccepting`] when the endpoints there are
    /// not servers (or no longer are: their `Endpoint` was dropped; also at the timeout when
    /// the others stay silent; on the TCP transport, where only a server listens, and a
    /// dropped one stops listening once its connections ended, such an address answers as
    /// one where nothing listens: `Refused`),
    /// [`ConnectionError::WrongApplication`], [`ConnectionError::KeyMismatch`],
    /// [`ConnectionError::ServerFull`].
    pub fn connect(
        &self,
        remotes: &[SocketAddr],
        config: ConnectionConfig,
    ) -> Result<Connection, Error> {
        let conn = self.start_connect(remotes, config)?;
        conn.wait_handshake().map_err(Error::Connection)?;
        Ok(conn)
    }

    /// Starts connecting to a peer and returns at once, with the handshake under way: the
    /// connection's [`state`](Connection::state) is [`ConnectionState::Connecting`] until it
    /// ends, then established or [`ConnectionState::Closed`] (with the same
    /// [`close_reason`](Connection::close_reason) as [`connect`](Self::connect) would
    /// return). Its readiness descriptors become readable when the handshake ends. As for
    /// any wake-up, a non-blocking call clears them before it looks (while the handshake
    /// lasts, [`try_recv_datagram`](Connection::try_recv_datagram) and the other `try_`
    /// reads return [`std::io::ErrorKind::WouldBlock`]); look at the state after it, and
    /// once after registering (the handshake may have ended before). One thread can so wait
    /// on many handshakes, e.g. in an event loop with a connection per peer of a cluster.
    /// On the TCP transport the handshake completes before this returns.
    pub fn start_connect(
        &self,
        remotes: &[SocketAddr],
        config: ConnectionConfig,
    ) -> Result<Connection, Error> {
        let shards = match &self.inner {
            Transports::Udp(s) => s,
            Transports::Tcp(t) => return Ok(t.connection(t.endpoint().connect(remotes, config)?)),
        };
        let driver = shards.for_connect();
        let shared = driver.shared();
        let mut st = shared.lock();
        let h = st.engine_mut().connect(Instant::now(), remotes, config)?;
        // sends the first handshake packet
        drop(shared.after_app_call(st));
        Ok(Connection::udp(UdpConnection::new(
            driver.clone(),
            shards.drivers.clone(),
            h,
        )))
    }

    /// The next incoming connection if one is waiting; an [`Error::Io`] of kind
    /// [`std::io::ErrorKind::WouldBlock`] otherwise. Never blocks; clears
    /// [`readiness_fd`](Self::readiness_fd) once no connection is left waiting.
    pub fn try_accept(&self) -> Result<Connection, Error> {
        let accepted = match &self.inner {
            Transports::Udp(s) => (s.pop_accepted()).map(|(driver, h)| {
                Connection::udp(UdpConnection::new(driver, s.drivers.clone(), h))
            }),
            Transports::Tcp(t) => t.endpoint().try_accept().map(|c| t.connection(c)),
        };
        accepted.ok_or_else(|| Error::Io(std::io::ErrorKind::WouldBlock.into()))
    }

    /// A file descriptor that becomes readable when a connection may be waiting for
    /// [`try_accept`](Self::try_accept), for `poll`/`epoll`/mio/tokio (register it for
    /// reading, never read it yourself). It stays readable while connections wait, so a
    /// level-triggered loop may accept one per wake-up; with edge-triggered readiness call
    /// `try_accept` until `WouldBlock` after each wake-up.
    pub fn readiness_fd(&self) -> std::io::Result<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        match &self.inner {
            Transports::Udp(s) => Ok(s.accepts.readiness()?.as_fd()),
            Transports::Tcp(t) => Ok(t.endpoint().readiness()?.as_fd()),
        }
    }

    /// Waits for the next incoming connection. A connection is handed over once its client
    /// has confirmed the handshake (its first packet after the server's answer arrived: it
    /// received that answer and, with a key, holds the handshake's fresh secrets), so never
    /// one that a replayed or forged handshake started (docs/PROTOCOL.md §4.3, §11).
    pub fn accept(&self) -> Result<Connection, Error> {
        self.accept_timeout(None)?.ok_or(Error::TimedOut)
    }

    /// Waits at most `timeout` (`None`: forever) for the next incoming connection.
    pub fn accept_timeout(&self, timeout: Option<Duration>) -> Result<Option<Connection>, Error> {
        let shards = match &self.inner {
            Transports::Udp(s) => s,
            Transports::Tcp(t) => {
                return Ok(t
                    .endpoint()
                    .accept_timeout(timeout)
                    .map(|c| t.connection(c)))
            }
        };
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            if let Some((driver, h)) = shards.pop_accepted() {
                let shared = shards.drivers.clone();
                return Ok(Some(Connection::udp(UdpConnection::new(driver, shared, h))));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            shards.wait_accept(deadline);
        }
    }
}
