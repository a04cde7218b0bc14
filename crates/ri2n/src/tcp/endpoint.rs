//! The TCP transport's endpoint: a listening socket per local address (on a server), the
//! hello exchange that makes a TCP connection a link of a connection, and connecting.
//!
//! A client opens its first link from its first local address to the first server address
//! it was given; the server's answer lists all its addresses, and the client pairs each of
//! its local addresses with the server address most like it (the longest common prefix: the
//! same network), opening one link per pair.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ri2n_proto::addr;
use ri2n_proto::crypto::TAG_LEN;
use ri2n_proto::tcp::keys::{server_handshake, FrameKey};
use ri2n_proto::tcp::{Hello, HelloReply, HelloStatus};
use ri2n_proto::{
    ConnectionConfig, ConnectionError, EndpointConfig, KeyMismatch, RefusalReason, RefusalReports,
    RefusedHandshake,
};

use super::conn::{Link, Role, Settings, TcpConnection};
use super::dial::{self, Race, Step};
use super::link;
use super::sys;
use crate::readiness::Readiness;
use crate::Error;

/// What a timeout beyond the clock's range waits for: as good as for ever.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// A link's addresses: (local, remote).
type Pair = (SocketAddr, SocketAddr);
/// When a connect tries the other given addresses' pairs too, if the first has not opened
/// (the UDP transport's first INITIAL retransmission).
const OTHER_PAIRS_AFTER: Duration = Duration::from_millis(200);
/// How long a server waits for a new TCP connection's hello, all of it (with a key, the
/// handshake message too).
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// The least a connect waits for the answer to its hello at one address while other given
/// addresses are left to try (at the last, until the handshake's deadline).
const HELLO_ANSWER_AT_LEAST: Duration = Duration::from_secs(1);
/// New TCP connections a listening address reads hellos from at once, each on a thread (with
/// a key, until the link's first frame confirms it). One more lets the oldest go: a client's
/// hello takes a round trip, so the oldest are strangers that connected and say nothing, or
/// replay a recorded hello and cannot confirm it, who cost at most this many threads and
/// descriptors, and shut no client out unless they come faster than this many per round
/// trip.
const MAX_HELLOS: usize = 64;

/// A connection the endpoint knows of; a server's with the client IP address of its first
/// hello (`max_connections_per_address`).
type Known = (Weak<TcpConnection>, Option<IpAddr>);

/// A TCP-transport endpoint.
#[derive(Debug)]
pub(crate) struct TcpEndpoint {
    locals: Vec<SocketAddr>,
    listeners: Vec<Arc<TcpListener>>,
    config: EndpointConfig,
    /// Connections by ID, for the hellos of their further links.
    conns: Mutex<HashMap<u64, Known>>,
    accepted: Mutex<VecDeque<Arc<TcpConnection>>>,
    accept_cv: Condvar,
    /// Readable while a connection may be waiting in `accepted` (made on first request).
    accept_ready: OnceLock<Readiness>,
    /// Closing: new connections are refused; the links of those still delivering are not.
    closing: AtomicBool,
    closed: AtomicBool,
    /// Hellos refused for their key or application, for the application to log.
    refusals: Mutex<RefusalReports>,
}

impl TcpEndpoint {
    /// Binds a listening socket per local address when the endpoint is a server (port 0: a
    /// free port, the same on every address where possible).
    pub fn bind(config: EndpointConfig) -> Result<Arc<Self>, Error> {
        let mut listeners = Vec::new();
        let mut locals = Vec::new();
        let mut port = 0;
        for &a in &config.local_addrs {
            if !config.accept_incoming {
                locals.push(a);
                continue;
            }
            // the port of the first listener where none is given (its scope kept)
            let mut want = a;
            if a.port() == 0 && port != 0 {
                want.set_port(port);
            }
            let l = TcpListener::bind(want)
                .or_else(|_| TcpListener::bind(a))
                .map_err(|source| Error::Bind { addr: a, source })?;
            let bound = l
                .local_addr()
                .map_err(|source| Error::Bind { addr: a, source })?;
            port = bound.port();
            locals.push(bound);
            listeners.push(Arc::new(l));
        }
        let ep = Arc::new(Self {
            locals,
            listeners: listeners.clone(),
            config,
            conns: Mutex::new(HashMap::new()),
            accepted: Mutex::new(VecDeque::new()),
            accept_cv: Condvar::new(),
            accept_ready: OnceLock::new(),
            closing: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            refusals: Mutex::new(RefusalReports::new(Instant::now())),
        });
        for l in listeners {
            let weak = Arc::downgrade(&ep);
            std::thread::Builder::new()
                .name("ri2n-tcp-listen".into())
                .spawn(move || listen(&weak, &l))
                .map_err(Error::Io)?;
        }
        Ok(ep)
    }

    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.locals.clone()
    }

    /// Connects to a server given one or more of its addresses.
    pub fn connect(
        &self,
        remotes: &[SocketAddr],
        config: ConnectionConfig,
    ) -> Result<Arc<TcpConnection>, Error> {
        let (&first_remote, &first_local) = remotes
            .first()
            .zip(self.locals.first())
            .ok_or(Error::Connect(ri2n_proto::ConnectError::NoRemoteAddress))?;
        // as the UDP transport's engine picks it: of the local addresses that reach the
        // first remote, the one in its subnet
        let local =
            addr::pick_local(&self.locals, first_remote, first_local).unwrap_or(first_local);
        let id = rand::random::<u64>();
        let key = self.config.key.clone();
        let mut settings = Settings::new(&config, &self.config, id);
        let hello = Hello {
            connection_id: id,
            link: 0,
            new_connection: true,
            keyed: key.is_some(),
            takes_messages: config.accept_messages,
            window: config.stream_receive_window,
            application: config.application.clone(),
        };
        // the checks the UDP transport's engine makes (a zero window or buffer would wait
        // for ever)
        config.validate().map_err(Error::Connect)?;
        let timeout = config.handshake_timeout;
        // a timeout beyond the clock's range (`Duration::MAX`) waits as long as it takes
        let now = Instant::now();
        let deadline = (now.checked_add(timeout)).unwrap_or(now + FOREVER);
        let timed_out = || Error::Connection(ConnectionError::TimedOut(timeout));
        // the pairs the connection's links would have, and from the first local address to
        // each given address they leave out (a client with fewer addresses than the server)
        let mut pairs = pair_links(local, first_remote, &self.locals, remotes, crate::MAX_LINKS);
        for &r in remotes {
            if addr::reaches(local, r) && !pairs.iter().any(|p| p.1 == r) {
                pairs.push((local, r));
            }
        }
        // a given address need not be the server's: an endpoint there that takes no
        // connections, or a service that is no ri2n server, leaves the connection to the other
        // addresses and becomes no link (as the UDP transport's handshake, docs/PROTOCOL.md
        // §4.1, §12.1); a hello that fails otherwise (the TCP connection closed) leaves it to
        // the other pairs. The answer is the error once none is left, or at the deadline.
        let (mut turned_away, mut not_the_server) = (None, Vec::new());
        let (x, (local, first_remote)) = loop {
            let (stream, pair) = match dial_first(pairs.clone(), config.probe_interval, deadline) {
                Ok(Some(won)) => won,
                Ok(None) => return Err(turned_away.unwrap_or_else(timed_out)),
                Err(e) => return Err(turned_away.unwrap_or(e)),
            };
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            // a host that took the TCP connection but whose server never answers (hung, or a
            // proxy with nothing behind it) holds the other addresses off only for a while
            let others = pairs.iter().any(|&p| p != pair);
            let wait = match others {
                true => {
                    let rtt = sys::rtt_and_cwnd(&stream).map_or(Duration::ZERO, |r| r.0);
                    (dial::hello_timeout(rtt, config.probe_interval))
                        .max(HELLO_ANSWER_AT_LEAST)
                        .min(left)
                }
                false => left,
            };
            let (error, no_server) = match link::hello_exchange(stream, &hello, wait, key.as_ref())
            {
                Ok(x) if x.reply.status != HelloStatus::NotAccepting => break (x, pair),
                Ok(_) => (ConnectionError::NotAccepting.into(), true),
                Err(e) => match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut if !others => {
                        return Err(turned_away.unwrap_or_else(timed_out))
                    }
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => (timed_out(), false),
                    kind => (
                        Error::Connection(ConnectionError::ProtocolViolation(
                            "the peer did not answer as a ri2n TCP server",
                        )),
                        kind == io::ErrorKind::InvalidData,
                    ),
                },
            };
            tracing::debug!(remote = %pair.1, %error, "handshake turned away at one address");
            match no_server {
                true => {
                    pairs.retain(|p| p.1 != pair.1);
                    not_the_server.push(pair.1);
                }
                false => pairs.retain(|&p| p != pair),
            }
            if pairs.is_empty() {
                return Err(error);
            }
            turned_away = Some(error);
        };
        let (stream, reply, leftover, keys) = (x.stream, x.reply, x.leftover, x.keys);
        if let Some(refused) = refusal(&reply, config.application.as_deref()) {
            return Err(refused.into());
        }
        // the addresses given, then (unless discovery is off) those the server announced
        let mut candidates: Vec<SocketAddr> = (remotes.iter())
            .filter(|r| !not_the_server.contains(r))
            .copied()
            .collect();
        if config.discover {
            let announced =
                (reply.addrs.iter()).map(|&a| addr::as_known(a, remotes.iter().copied()));
            candidates.extend(announced.filter(|a| !remotes.contains(a)));
        }
        let pairs = pair_links(
            local,
            first_remote,
            &self.locals,
            &candidates,
            config.max_links,
        );
        settings.peer_takes_messages = reply.takes_messages;
        settings.peer_window = reply.window;
        let now = Instant::now();
        let links = pairs.iter().map(|&(l, r)| Link::new(l, r, now)).collect();
        let conn = TcpConnection::new(settings, Role::Client { pairs }, links);
        link::attach(&conn, 0, stream, leftover, keys).map_err(Error::Io)?;
        // known to the endpoint, whose closing waits for it to deliver
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|_, (w, _)| w.strong_count() > 0);
        conns.insert(id, (Arc::downgrade(&conn), None));
        drop(conns);
        spawn_watch(&conn)?;
        Ok(conn)
    }

    /// Waits at most `timeout` (`None`: forever) for the next incoming connection.
    pub fn accept_timeout(&self, timeout: Option<Duration>) -> Option<Arc<TcpConnection>> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut q = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(c) = q.pop_front() {
                self.clear_if_none_waits(&q);
                return Some(c);
            }
            let left = match deadline {
                Some(d) => d.checked_duration_since(Instant::now())?,
                None => Duration::from_secs(3600),
            };
            q = self
                .accept_cv
                .wait_timeout(q, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The next incoming connection if one waits. The readiness descriptor stays readable
    /// while more wait (as on UDP).
    pub fn try_accept(&self) -> Option<Arc<TcpConnection>> {
        let mut q = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
        let next = q.pop_front();
        self.clear_if_none_waits(&q);
        next
    }

    /// Clears the readiness descriptor if queue `q` (held locked) is empty: whichever call
    /// took the last connection (a loop that accepts with a timeout on each wake-up would
    /// spin on a descriptor left readable).
    fn clear_if_none_waits(&self, q: &VecDeque<Arc<TcpConnection>>) {
        if q.is_empty() {
            if let Some(r) = self.accept_ready.get() {
                r.clear();
            }
        }
    }

    /// The hellos refused for their key or application since the last call (rate-limited
    /// as the UDP transport's, see [`RefusalReports`]).
    pub fn refused_handshakes(&self) -> Vec<RefusedHandshake> {
        let mut reports = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        std::iter::from_fn(|| reports.pop()).collect()
    }

    /// The descriptor readable while a connection may wait for `try_accept`.
    pub fn readiness(&self) -> io::Result<&Readiness> {
        let q = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
        if self.accept_ready.get().is_none() {
            let r = Readiness::new()?;
            if !q.is_empty() {
                r.signal();
            }
            let _ = self.accept_ready.set(r);
        }
        Ok(self.accept_ready.get().expect("set above"))
    }

    /// Every live connection.
    pub fn connections(&self) -> Vec<Arc<TcpConnection>> {
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.values().filter_map(|(w, _)| w.upgrade()).collect()
    }

    /// Refuses new connections from now on (NotAccepting), and aborts those waiting to be
    /// accepted: nobody will take them, and closed gracefully with the rest their clients
    /// would take the end for a delivery. The listening sockets stay open: a link of a
    /// connection still delivering that fails meanwhile is opened again. The queue is emptied
    /// under its lock, under which a hello looks at the flag before it queues: none slips in
    /// after.
    pub fn stop_accepting(&self) {
        let mut q = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
        self.closing.store(true, Ordering::SeqCst);
        let waiting: Vec<Arc<TcpConnection>> = q.drain(..).collect();
        drop(q);
        for c in waiting {
            c.abort(0, crate::connection::UNACCEPTED);
        }
        // an event loop waiting on `accept`'s readiness descriptor wakes, and finds nothing
        // to accept any more
        self.accept_cv.notify_all();
        if let Some(r) = self.accept_ready.get() {
            r.signal();
        }
    }

    /// Stops listening.
    pub fn shut(&self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            for l in &self.listeners {
                // SAFETY: shutdown(2) on a descriptor the listener owns; it wakes `accept`.
                unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) };
            }
        }
    }

    /// A server's answer to a new TCP connection's hello (and its handshake message, on a
    /// keyed link).
    /// `settled` is called once the TCP connection is the link's (with a key, confirmed):
    /// its hello no longer counts against [`MAX_HELLOS`].
    fn on_hello(
        &self,
        hello: &Hello,
        handshake: Option<Vec<u8>>,
        stream: TcpStream,
        leftover: BytesMut,
        settled: &dyn Fn(),
    ) {
        let refuse = |status, application: Option<String>| {
            // seen from this side, as the UDP transport reports them
            let reason = match status {
                HelloStatus::WrongKey => Some(RefusalReason::Key(KeyMismatch::WrongKey)),
                HelloStatus::KeyRequired => Some(RefusalReason::Key(KeyMismatch::NoKey)),
                HelloStatus::NoKey => Some(RefusalReason::Key(KeyMismatch::KeyRequired)),
                HelloStatus::WrongApplication => Some(RefusalReason::WrongApplication {
                    client: hello.application.clone().unwrap_or_default(),
                    ours: application.clone().unwrap_or_default(),
                }),
                _ => None,
            };
            if let (Some(reason), Ok(remote)) = (reason, stream.peer_addr()) {
                let refused = RefusedHandshake { remote, reason };
                (self.refusals.lock().unwrap_or_else(|e| e.into_inner()))
                    .report(Instant::now(), refused);
            }
            let mut out = Vec::new();
            HelloReply {
                status,
                takes_messages: false,
                window: 0,
                application,
                addrs: Vec::new(),
            }
            .encode(&mut out);
            let _ = io::Write::write_all(&mut &stream, &out);
            let _ = stream.shutdown(Shutdown::Both);
        };
        let cfg = &self.config.server_connection;
        let closing = hello.new_connection && self.closing.load(Ordering::SeqCst);
        if !self.config.accept_incoming || closing {
            return refuse(HelloStatus::NotAccepting, None);
        }
        // the key first: nothing about the server's connections is said to a stranger
        let (answer, keys) = match (&self.config.key, handshake) {
            (None, None) => (None, None),
            (Some(_), None) => return refuse(HelloStatus::KeyRequired, None),
            (None, Some(_)) => return refuse(HelloStatus::NoKey, None),
            (Some(key), Some(msg)) => {
                match server_handshake(key, hello.connection_id, hello.link, &msg) {
                    Ok((answer, keys)) => (Some(answer), Some(keys)),
                    Err(_) => return refuse(HelloStatus::WrongKey, None),
                }
            }
        };
        if let (Some(theirs), Some(ours)) = (&hello.application, &cfg.application) {
            if theirs != ours {
                return refuse(HelloStatus::WrongApplication, Some(ours.clone()));
            }
        }
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|_, (w, _)| w.strong_count() > 0);
        let open = |c: &Arc<TcpConnection>| c.lock().end.is_none();
        let conn = if hello.new_connection {
            let live = (conns.get(&hello.connection_id))
                .and_then(|(w, _)| w.upgrade())
                .is_some_and(|c| open(&c));
            if live {
                // a client draws a new ID for each connection: this is a replay of a live
                // connection's first hello, which must not take its place (its later links
                // would join the impostor), and it is not answered
                drop(conns);
                let _ = stream.shutdown(Shutdown::Both);
                return;
            }
            // as the UDP transport counts them: every connection held, and the open ones of
            // each client address
            let client = stream.peer_addr().ok().map(|a| a.ip());
            let from_client = || {
                (conns.values())
                    .filter(|(_, ip)| ip.is_some() && *ip == client)
                    .filter(|(w, _)| w.upgrade().is_some_and(|c| open(&c)))
                    .count()
            };
            if conns.len() >= self.config.max_connections
                || from_client() >= self.config.max_connections_per_address
            {
                drop(conns);
                return refuse(HelloStatus::ServerFull, None);
            }
            let mut settings = Settings::new(cfg, &self.config, hello.connection_id);
            settings.peer_takes_messages = hello.takes_messages;
            settings.peer_window = hello.window;
            let conn = TcpConnection::new(settings, Role::Server, Vec::new());
            conns.insert(hello.connection_id, (Arc::downgrade(&conn), client));
            conn
        } else {
            // a link beyond those this server's connections use (a client given more of its
            // addresses than that): turned away as by a full server, and tried again later
            if usize::from(hello.link) >= cfg.max_links {
                drop(conns);
                return refuse(HelloStatus::ServerFull, None);
            }
            match conns
                .get(&hello.connection_id)
                .and_then(|(w, _)| w.upgrade())
            {
                Some(c) if c.lock().takes_links() => c,
                _ => {
                    drop(conns);
                    return refuse(HelloStatus::UnknownConnection, None);
                }
            }
        };
        drop(conns);
        let mut out = Vec::new();
        HelloReply {
            status: HelloStatus::Accepted,
            takes_messages: cfg.accept_messages,
            window: cfg.stream_receive_window,
            application: cfg.application.clone(),
            // all of them, as the UDP transport's ACCEPT: the client pairs each of its
            // addresses with the one most like it (links beyond `max_links` are turned away)
            addrs: if hello.new_connection {
                self.locals.clone()
            } else {
                Vec::new()
            },
        }
        .encode(&mut out);
        if let Some(answer) = answer {
            out.extend_from_slice(&(answer.len() as u16).to_be_bytes());
            out.extend_from_slice(&answer);
        }
        if io::Write::write_all(&mut &stream, &out).is_err() || sys::tune(&stream).is_err() {
            return;
        }
        let mut leftover = leftover;
        if let Some(k) = &keys {
            if !confirmed(&stream, &mut leftover, &k.open) {
                // a replayed hello (or a client gone): it neither replaces the link's TCP
                // connection nor makes a connection to accept
                tracing::debug!(
                    id = hello.connection_id,
                    link = hello.link,
                    "link not confirmed"
                );
                let _ = stream.shutdown(Shutdown::Both);
                return;
            }
        }
        // let go before the link runs: a new hello must never shut a link at work
        settled();
        if link::attach(&conn, usize::from(hello.link), stream, leftover, keys).is_err() {
            return;
        }
        if hello.new_connection && spawn_watch(&conn).is_ok() {
            let mut q = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
            if self.closing.load(Ordering::SeqCst) {
                drop(q);
                conn.abort(0, crate::connection::UNACCEPTED);
                return;
            }
            q.push_back(conn);
            self.accept_cv.notify_all();
            if let Some(r) = self.accept_ready.get() {
                r.signal();
            }
        }
    }
}

fn spawn_watch(conn: &Arc<TcpConnection>) -> Result<(), Error> {
    let c = conn.clone();
    std::thread::Builder::new()
        .name("ri2n-tcp-watch".into())
        .spawn(move || link::watch(&c))
        .map(drop)
        .map_err(Error::Io)
}

/// Accepts TCP connections until the endpoint closes; each says hello on its own thread
/// (at most [`MAX_HELLOS`] at once, a keyed link's until it is confirmed).
fn listen(ep: &Weak<TcpEndpoint>, l: &TcpListener) {
    let hellos = Arc::new(Hellos::default());
    loop {
        let Ok((stream, _)) = l.accept() else {
            match ep.upgrade() {
                Some(e) if !e.closed.load(Ordering::SeqCst) => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                _ => return,
            }
        };
        let Some(id) = hellos.take(&stream) else {
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        };
        let (ep, count) = (ep.clone(), hellos.clone());
        let spawned = std::thread::Builder::new()
            .name("ri2n-tcp-hello".into())
            .spawn(move || {
                let read = read_hello(&stream);
                if let Some((hello, handshake, leftover)) = read {
                    if let Some(ep) = ep.upgrade() {
                        let settled = || count.give_back(id);
                        ep.on_hello(&hello, handshake, stream, leftover, &settled);
                    }
                }
                count.give_back(id);
            });
        if spawned.is_err() {
            hellos.give_back(id);
        }
    }
}

/// The hellos a listening address is reading, oldest first.
#[derive(Default)]
struct Hellos(Mutex<(u64, VecDeque<(u64, TcpStream)>)>);

impl Hellos {
    /// A slot for the hello of `stream`, under a number for [`Self::give_back`]: with
    /// [`MAX_HELLOS`] taken, the oldest's connection is shut (its reader then gives it back);
    /// `None` if the stream cannot be watched so.
    fn take(&self, stream: &TcpStream) -> Option<u64> {
        let watched = stream.try_clone().ok()?;
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (next, reading) = &mut *inner;
        if reading.len() >= MAX_HELLOS {
            if let Some((_, oldest)) = reading.pop_front() {
                let _ = oldest.shutdown(Shutdown::Both);
            }
        }
        *next += 1;
        reading.push_back((*next, watched));
        Some(*next)
    }

    fn give_back(&self, id: u64) {
        let mut inner = self.0.lock().unwrap_or_else(|e| e.into_inner());
        inner.1.retain(|(i, _)| *i != id);
    }
}

/// The client's hello, its handshake message (a keyed hello) and what followed them; `None`
/// (the TCP connection closed) for anything else, or for what is not whole within
/// [`HELLO_TIMEOUT`] (counted from the connection, not from its last byte: a stranger
/// sending a byte now and then would otherwise hold its thread for hours).
fn read_hello(s: &TcpStream) -> Option<(Hello, Option<Vec<u8>>, BytesMut)> {
    let deadline = Instant::now() + HELLO_TIMEOUT;
    let read = |buf: &mut BytesMut| -> Option<usize> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        s.set_read_timeout(Some(left)).ok()?;
        sys::read_into(s, buf, 512).ok().filter(|&n| n > 0)
    };
    let mut buf = BytesMut::with_capacity(512);
    let hello = loop {
        match Hello::parse(&buf) {
            Ok(Some((h, n))) => {
                let _ = buf.split_to(n);
                break h;
            }
            Ok(None) if buf.len() < 1024 => {
                read(&mut buf)?;
            }
            _ => {
                let _ = s.shutdown(Shutdown::Both);
                return None;
            }
        }
    };
    let handshake = if hello.keyed {
        loop {
            if let Some(m) = link::take_handshake(&mut buf) {
                break Some(m);
            }
            read(&mut buf)?;
            if buf.len() >= 4096 {
                return None;
            }
        }
    } else {
        None
    };
    s.set_read_timeout(None).ok()?;
    Some((hello, handshake, buf))
}

/// Whether the client's first sealed frame on a keyed TCP connection arrives within
/// [`HELLO_TIMEOUT`] and opens with the handshake's keys (`key`); it stays in `buf` (with
/// what followed it) for the link's reader. A hello and handshake message replayed from a
/// recording pass the handshake, as nothing in them is fresh, but its keys are not the
/// replayer's: without this proof a replay would take a live link's place or make a
/// connection to accept (docs/PROTOCOL.md §12.6).
fn confirmed(s: &TcpStream, buf: &mut BytesMut, key: &FrameKey) -> bool {
    enum First<'a> {
        Partial,
        /// Its length field and body.
        Whole([u8; 4], &'a [u8]),
        /// A length the confirmation does not have.
        Bad,
    }
    fn first_frame(buf: &[u8]) -> First<'_> {
        let Some(len) = buf.get(..4) else {
            return First::Partial;
        };
        let len: [u8; 4] = len.try_into().expect("4 bytes");
        // the confirmation holds no records: a replayer announcing a longer first frame
        // would otherwise have the server buffer up to a whole frame per TCP connection
        if u32::from_be_bytes(len) as usize != TAG_LEN {
            return First::Bad;
        }
        buf.get(4..4 + TAG_LEN)
            .map_or(First::Partial, |b| First::Whole(len, b))
    }
    let deadline = Instant::now() + HELLO_TIMEOUT;
    loop {
        match first_frame(buf) {
            First::Whole(len, body) => return key.would_open(len, body),
            First::Bad => return false,
            First::Partial => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            return false;
        }
        let read = sys::read_into(s, buf, 4096);
        if !matches!(read, Ok(n) if n > 0) || s.set_read_timeout(None).is_err() {
            return false;
        }
    }
}

/// The attempts to open a connection's first link: raced attempts on the first of `pairs`
/// (as the dialer's: a lost SYN is made up for at once, not in a second), and from
/// [`OTHER_PAIRS_AFTER`] on the others too, so that a first path down at the start does not
/// keep the connection from the others (as the UDP transport's handshake, docs/PROTOCOL.md
/// §4.1). The first stream to open wins, with its pair; `None` at `deadline`. A pair refused
/// (nothing listens there), or failing otherwise (no route) while another is still tried, is
/// tried no more; with none left, its error ends the connect.
fn dial_first(
    pairs: Vec<Pair>,
    pace: Duration,
    deadline: Instant,
) -> Result<Option<(TcpStream, Pair)>, Error> {
    /// How long one race waits per turn while several take turns.
    const TURN: Duration = Duration::from_millis(2);
    let others_at = Instant::now() + OTHER_PAIRS_AFTER;
    let mut races = vec![(pairs[0], Race::new(pairs[0].0, pairs[0].1, pace))];
    let mut started = 1;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        // the others start early when the first pair failed already
        if started < pairs.len() && (now >= others_at || races.is_empty()) {
            races.extend(
                pairs[started..]
                    .iter()
                    .map(|&p| (p, Race::new(p.0, p.1, pace))),
            );
            started = pairs.len();
        }
        let until = match races.len() > 1 || started < pairs.len() {
            true => deadline.min(now + TURN),
            false => deadline,
        };
        let mut j = 0;
        while j < races.len() {
            match races[j].1.step(until) {
                Step::Open(stream, _) => return Ok(Some((stream, races[j].0))),
                Step::Failed(e, _) => {
                    races.remove(j);
                    if races.is_empty() && started == pairs.len() {
                        return Err(match e.kind() {
                            io::ErrorKind::ConnectionRefused => {
                                Error::Connection(ConnectionError::Refused)
                            }
                            _ => Error::Io(e),
                        });
                    }
                }
                Step::Unanswered | Step::Waiting => j += 1,
            }
        }
    }
}

/// The links of a connection: the first pair as connected, then each further local address
/// with the unused server address most like it (among those it reaches; an announced
/// link-local one on its interface).
fn pair_links(
    first_local: SocketAddr,
    first_remote: SocketAddr,
    locals: &[SocketAddr],
    remotes: &[SocketAddr],
    max_links: usize,
) -> Vec<(SocketAddr, SocketAddr)> {
    let mut pairs = vec![(first_local, first_remote)];
    let mut used = vec![first_remote];
    for &l in locals.iter().filter(|&&l| l != first_local) {
        if pairs.len() >= max_links {
            break;
        }
        let best = (remotes.iter())
            .filter(|&&r| !used.contains(&r) && addr::reaches(l, r))
            .max_by_key(|r| addr::common_prefix(l.ip(), r.ip()));
        if let Some(&r) = best {
            used.push(r);
            pairs.push((l, addr::scoped_like(r, l)));
        }
    }
    pairs
}

/// Why a server did not take a hello, as the client's error; `None` when it did. `ours` is
/// the application the client expects.
pub(super) fn refusal(reply: &HelloReply, ours: Option<&str>) -> Option<ConnectionError> {
    Some(match reply.status {
        HelloStatus::Accepted => return None,
        HelloStatus::KeyRequired => ConnectionError::KeyMismatch(KeyMismatch::KeyRequired),
        HelloStatus::NoKey => ConnectionError::KeyMismatch(KeyMismatch::NoKey),
        HelloStatus::WrongKey => ConnectionError::KeyMismatch(KeyMismatch::WrongKey),
        HelloStatus::ServerFull => ConnectionError::ServerFull,
        HelloStatus::NotAccepting => ConnectionError::NotAccepting,
        HelloStatus::UnknownConnection => ConnectionError::Refused,
        HelloStatus::WrongApplication => ConnectionError::WrongApplication {
            ours: ours.unwrap_or_default().to_owned(),
            theirs: reply.application.clone().unwrap_or_default(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link that fails while its server closes is opened again, and what the server wrote
    /// still arrives: the endpoint keeps listening for its connections' links until they are
    /// delivered, and refuses only new connections meanwhile. (Until the close shut its
    /// listeners at once, the client's new attempts were refused, it gave the server up as
    /// gone and the data was lost: the tokio echo test failed so now and then, its links
    /// declared dead by CPU-starved watch threads.)
    #[test]
    fn a_link_lost_while_the_server_closes_is_opened_again() {
        use ri2n_proto::{Event, LinkState, Transport};
        let config = |server: bool| {
            let lo = |ip: &str| SocketAddr::new(ip.parse().unwrap(), 0);
            let c = EndpointConfig::new(vec![lo("127.0.0.1"), lo("127.0.0.2")])
                .with_transport(Transport::Tcp);
            if server {
                c.server()
            } else {
                c
            }
        };
        let server = TcpEndpoint::bind(config(true)).unwrap();
        let client = TcpEndpoint::bind(config(false)).unwrap();
        let to = server.local_addrs();
        // a small window: what the server writes beyond it waits there, unacknowledged, until
        // the client reads (the default window would take a whole send buffer at once, and
        // the close would end the connection cleanly before its links are failed)
        let window = ConnectionConfig::default().with_stream_receive_window(64 << 10);
        let conn = client.connect(&to, window).unwrap();
        let accepted = server.accept_timeout(Some(Duration::from_secs(5))).unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        while accepted
            .lock()
            .links
            .iter()
            .filter(|l| l.connected())
            .count()
            < 2
        {
            assert!(Instant::now() < until, "the second link never came up");
            std::thread::sleep(Duration::from_millis(5));
        }
        // more than the client takes unread: the rest waits at the server, unacknowledged
        let data: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8).collect();
        let mut written = 0;
        while let Ok(n @ 1..) = accepted.write(&data[written..], false, None) {
            written += n;
        }
        assert!(written > 0 && !accepted.is_acknowledged());
        let closer = std::thread::spawn({
            let server = server.clone();
            move || crate::tcp_close(&server, Some(Instant::now() + Duration::from_secs(20)))
        });
        // the close has begun once a new connection is refused
        let other = TcpEndpoint::bind(config(false)).unwrap();
        let refused = loop {
            match other.connect(&to, ConnectionConfig::default()) {
                Ok(_) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => break e,
            }
        };
        assert!(
            format!("{refused:?}").contains("NotAccepting"),
            "{refused:?}"
        );
        {
            let mut st = accepted.lock();
            assert!(
                st.end.is_none(),
                "the connection ended before its links failed"
            );
            for l in 0..2 {
                assert!(
                    st.links[l].connected(),
                    "link {l} was down before it failed"
                );
                let incarnation = st.links[l].incarnation;
                super::link::fail(&accepted, &mut st, l, incarnation, false);
            }
        }
        // longer than a client waits on links its peer's host refuses before it gives up
        std::thread::sleep(Duration::from_millis(800));
        let mut got = Vec::with_capacity(written);
        let mut buf = vec![0u8; 1 << 16];
        while got.len() < written {
            let n = conn.read(&mut buf, true, None).unwrap();
            assert!(
                n > 0,
                "the stream ended after {} of {written} bytes",
                got.len()
            );
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got[..] == data[..written], "the bytes differ");
        assert_eq!(closer.join().unwrap(), (0, 0), "not all was delivered");
        let downs = (conn.poll_events().iter())
            .filter(|e| {
                matches!(
                    e.event,
                    Event::LinkStateChanged {
                        to: LinkState::Down,
                        ..
                    }
                )
            })
            .count();
        assert!(downs >= 2, "the client saw {downs} links go down");
    }

    /// The first address a client is given leads to a server that takes no more connections
    /// (it is closing): the connection is made at the second, a server that does. With no
    /// such server left, the client is told `NotAccepting`.
    /// A message too large for what a small one read before it gave back still comes: the
    /// sender, stalled at the window's end, hears of the room at once. Before, the room stayed
    /// below the step at which the window is advertised, and the reader waited forever.
    #[test]
    fn a_large_message_after_a_small_one_is_not_stalled_by_the_window() {
        use ri2n_proto::Transport;
        let lo = SocketAddr::new("127.0.0.1".parse().unwrap(), 0);
        let config = EndpointConfig::new(vec![lo]).with_transport(Transport::Tcp);
        let server = TcpEndpoint::bind(config.clone().server()).unwrap();
        let client = TcpEndpoint::bind(config).unwrap();
        let conn = (client.connect(&server.local_addrs(), ConnectionConfig::default())).unwrap();
        let accepted = server.accept_timeout(Some(Duration::from_secs(5))).unwrap();
        let big = usize::try_from(conn.settings.max_message()).unwrap();
        conn.send_message(&[1; 100], true, None).unwrap();
        conn.send_message(&vec![2; big], true, None).unwrap();
        // what the window allows arrives before the small one is read
        let until = Instant::now() + Duration::from_secs(5);
        let stalled = || {
            let st = accepted.lock();
            st.reasm.contiguous() >= st.advertised
        };
        while !stalled() {
            assert!(Instant::now() < until, "the window's worth never arrived");
            std::thread::sleep(Duration::from_millis(5));
        }
        let first = accepted.recv_message(true, None).unwrap().unwrap();
        assert_eq!(first, [1; 100]);
        let deadline = Instant::now() + Duration::from_secs(5);
        let second = accepted.recv_message(true, Some(deadline));
        assert_eq!(second.expect("it arrives").map(|m| m.len()), Some(big));
    }

    #[test]
    fn an_address_whose_server_takes_no_connections_leaves_the_connect_to_the_others() {
        use ri2n_proto::Transport;
        let on = |ip: &str, server: bool| {
            let c = EndpointConfig::new(vec![SocketAddr::new(ip.parse().unwrap(), 0)])
                .with_transport(Transport::Tcp);
            TcpEndpoint::bind(if server { c.server() } else { c }).unwrap()
        };
        let closing = on("127.0.0.1", true);
        closing.stop_accepting();
        let open = on("127.0.0.2", true);
        let to = [closing.local_addrs()[0], open.local_addrs()[0]];
        let client = on("127.0.0.1", false);
        let conn = client.connect(&to, ConnectionConfig::default()).unwrap();
        assert_eq!(conn.lock().links[0].remote, to[1]);
        assert!(open.accept_timeout(Some(Duration::from_secs(5))).is_some());

        open.stop_accepting();
        let e = client
            .connect(&to, ConnectionConfig::default())
            .unwrap_err();
        assert!(
            matches!(e, Error::Connection(ConnectionError::NotAccepting)),
            "{e:?}"
        );
    }

    #[test]
    fn each_local_address_pairs_with_the_server_address_on_its_network() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let pairs = pair_links(
            a("10.0.1.1:0"),
            a("10.0.1.2:7000"),
            &[a("10.0.1.1:0"), a("10.0.3.1:0"), a("10.0.2.1:0")],
            &[a("10.0.1.2:7000"), a("10.0.2.2:7000"), a("10.0.3.2:7000")],
            8,
        );
        assert_eq!(
            pairs,
            vec![
                (a("10.0.1.1:0"), a("10.0.1.2:7000")),
                (a("10.0.3.1:0"), a("10.0.3.2:7000")),
                (a("10.0.2.1:0"), a("10.0.2.2:7000")),
            ]
        );
    }
}
