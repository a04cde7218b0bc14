//! The peer loop: one thread, whatever the size of the cluster, keeps a connection to every
//! peer and writes what they carry to the interface.
//!
//! It connects to the hosts listed after this one (every handshake started at once with
//! [`ri2n::Endpoint::start_connect`], each retried after a pause while its host is away),
//! accepts the hosts listed before, and waits on the readiness descriptors of the endpoint and
//! of every connection in one `epoll` set (mio). A peer costs its connection and a slot here,
//! not a thread. While it waits, this thread receives on the endpoint's sockets itself
//! ([`ri2n::Endpoint::wait_receiving`]): an arriving packet wakes it alone, the call names
//! the connections it made readable (each connection's token is its slot), and the thread
//! writes the packets to the interface. Where each link has a receiving thread of its own
//! (`Options::recv_threads`), those receive and open what arrives while this thread writes,
//! and wake it through the connections' readiness descriptors. Busy (a connection left with
//! packets, the interface's queue with more), it looks at the sockets without waiting, so
//! that what arrives meanwhile is still its own to take in, not the driver thread's.
//!
//! Sending passes through here only where this loop reads the interface's one queue itself
//! (few CPUs, see `peer_loop_routes`): its descriptor is in the set, and a batch of what
//! it holds goes out between the deliveries ([`Router`]). Elsewhere the route threads hand
//! each packet read from the interface to its peer's connection.

use std::collections::{HashMap, VecDeque};
use std::io::ErrorKind;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etherparse::Ipv4HeaderSlice;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use ri2n::{Connection, ConnectionState, Endpoint};
use smallvec::SmallVec;

use crate::busy_poll::BusyPoll;
use crate::device::{Queues, Tun};
use crate::offload;
use crate::peers::{Peer, Peers};
use crate::route::{Router, BATCH};
use crate::{connection_config, summary, Carry, Stop};

/// Pause between a lost or failed connection and the next attempt; the first after a refusal.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// How long a connection the peer aborted must have been up for its end to be taken as a
/// loss, not as a refusal (the peer's daemon aborts at once connections its cluster file
/// does not expect yet, while the operator reloads the hosts in turn).
const STABLE: Duration = Duration::from_secs(5);
/// Longest pause after refusals in a row, each pause twice the last: each refusal costs a
/// handshake and a log line on both hosts.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(5);
/// Longest the loop sleeps before it looks at the endpoint in use (made again when a link
/// address appears), the refused handshakes to log and the peers removed from the file.
const HOUSEKEEPING: Duration = Duration::from_millis(200);
/// How long the connection to a peer this host connects to has had no link up before a new
/// handshake looks at what answers there, and the pause between such handshakes (see
/// [`Loop::probe_dark_connections`]).
const DARK_PROBE: Duration = Duration::from_secs(3);
/// How long a connection a newer one to its peer replaced may take to deliver the packets
/// its two ends held through the outage, its links back, and close cleanly, before it is
/// aborted and what it still holds counts as dropped (see [`Loop::drain_replaced`]).
const DRAIN: Duration = Duration::from_secs(5);
/// Batches taken from one connection before the others get a turn.
const TURN: usize = 4;
const ENDPOINT: Token = Token(usize::MAX);
const WAKER: Token = Token(usize::MAX - 1);
const INTERFACE: Token = Token(usize::MAX - 2);

/// How the rest of the daemon reaches the loop: peers added to the cluster file (SIGHUP).
pub struct Handle {
    added: Mutex<Vec<Arc<Peer>>>,
    waker: Waker,
}

impl Handle {
    /// Has the loop connect to `peer` (listed after this host) from now on.
    pub fn connect_to(&self, peer: Arc<Peer>) {
        self.added
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(peer);
        let _ = self.waker.wake();
    }
}

/// A connection the loop waits on.
struct Slot {
    peer: Arc<Peer>,
    conn: Arc<Connection>,
    /// The endpoint generation it was made on (see `links::Current`).
    generation: u64,
    /// Its handshake is still under way (a connection this host started).
    handshaking: bool,
    /// When it came up (`None` while handshaking).
    up_since: Option<Instant>,
    /// A handshake started beside the peer's connection, which had no link up
    /// ([`Loop::probe_dark_connections`]); it becomes an ordinary slot once up.
    probe: bool,
    /// Since when no link of its connection was up, as far as housekeeping saw, and when the
    /// last handshake beside it started.
    dark_since: Option<Instant>,
    probed_at: Option<Instant>,
    /// When a newer connection to its peer replaced it: it takes no new packets, delivers
    /// what it holds once its links are back, and closes cleanly ([`Loop::drain_replaced`]).
    replaced_at: Option<Instant>,
    /// Its streams were finished: it had been replaced and held nothing more to send.
    finished: bool,
}

/// What a connection holds that its peer has not acknowledged: datagrams queued (packets
/// carried as datagrams), or bytes of its stream (packets carried as messages, whose
/// number it does not keep).
#[derive(Clone, Copy)]
struct Held {
    packets: u64,
    bytes: u64,
}

impl Held {
    /// `None` when it holds nothing.
    fn of(conn: &Connection) -> Option<Held> {
        let s = conn.stats();
        let held = Held {
            packets: s.datagrams_queued.0 as u64,
            bytes: s.datagrams_queued.1.max(s.send_buffered),
        };
        (held.packets > 0 || held.bytes > 0).then_some(held)
    }
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.packets {
            0 => write!(f, "{} bytes of packets", self.bytes),
            n => write!(f, "{n} packets"),
        }
    }
}

/// Starts the loop on a thread of its own; the returned handle feeds it. With `route`, it also
/// reads that queue of the interface and routes its packets, which no route thread then does.
pub fn start(
    peers: Arc<Peers>,
    queues: Queues,
    describe_refusal: fn(&ri2n::RefusedHandshake) -> String,
    stop: Arc<Stop>,
    busy_poll: Duration,
    route: Option<Tun>,
) -> std::io::Result<Arc<Handle>> {
    let poll = Poll::new()?;
    if let Some(tun) = &route {
        let fd = tun.as_raw_fd();
        (poll.registry()).register(&mut SourceFd(&fd), INTERFACE, Interest::READABLE)?;
    }
    let handle = Arc::new(Handle {
        added: Mutex::new(Vec::new()),
        waker: Waker::new(poll.registry(), WAKER)?,
    });
    let mut l = Loop {
        poll,
        peers,
        queues,
        handle: handle.clone(),
        slots: Vec::new(),
        retries: Vec::new(),
        refusals: HashMap::new(),
        ready: VecDeque::new(),
        endpoint: None,
        out: Delivery::default(),
        describe_refusal,
        stop,
        busy: BusyPoll::new(busy_poll),
        route: route.map(|tun| (tun, Router::new(0))),
    };
    let table = l.peers.table();
    let now = Instant::now();
    l.retries.extend(
        table
            .peers
            .iter()
            .filter(|p| p.connects)
            .map(|p| (now, p.clone())),
    );
    std::thread::Builder::new()
        .name("ri2n-peers".into())
        .spawn(move || l.run())?;
    Ok(handle)
}

struct Loop {
    poll: Poll,
    peers: Arc<Peers>,
    /// Written to by flow (see `device`).
    queues: Queues,
    handle: Arc<Handle>,
    /// By token; `None`: free.
    slots: Vec<Option<Slot>>,
    /// Peers to connect to, each from when.
    retries: Vec<(Instant, Arc<Peer>)>,
    /// By peer name: how many connections in a row it refused (see [`Loop::retry_pause`]).
    refusals: HashMap<String, u32>,
    /// Slots to serve: those whose descriptor reported, and those left with datagrams
    /// after their turn.
    ready: VecDeque<usize>,
    /// The endpoint whose descriptor is registered, with its generation.
    endpoint: Option<(u64, Endpoint)>,
    out: Delivery,
    describe_refusal: fn(&ri2n::RefusedHandshake) -> String,
    /// Stops the daemon when waiting fails.
    stop: Arc<Stop>,
    /// Looks again and again for a while after the last arrival before it waits.
    busy: BusyPoll,
    /// The interface's queue this loop reads between its deliveries, with what routes its
    /// packets (`None`: route threads read the queues).
    route: Option<(Tun, Router)>,
}

impl Loop {
    fn run(mut self) {
        let mut events = Events::with_capacity(256);
        // slots whose connection the endpoint reported readable (their token is the slot)
        let mut readable = Vec::new();
        let mut next_housekeeping = Instant::now();
        loop {
            // an endpoint made again is followed at once: a connection made or accepted on
            // the old one would keep its sockets, and the new one could not bind
            if self.peers.endpoint.generation() != self.endpoint.as_ref().map(|e| e.0) {
                self.follow_endpoint();
            }
            let now = Instant::now();
            if now >= next_housekeeping {
                self.housekeeping();
                next_housekeeping = now + HOUSEKEEPING;
            }
            self.start_due_connects(now);
            let wake_at = (self.retries.iter().map(|r| r.0))
                .chain([next_housekeeping])
                .min()
                .unwrap_or(next_housekeeping);
            // busy: connections left with datagrams, or the interface's queue with packets
            let busy =
                !self.ready.is_empty() || self.route.as_ref().is_some_and(|(_, r)| !r.drained());
            let look_at_set = match &self.endpoint {
                // This thread receives what arrives itself and returns with the connections
                // the arrival made readable (or when a descriptor of the set is ready): no
                // other thread wakes, and no descriptor is signalled and read. Busy, it
                // looks without waiting: a loop that stayed away from the sockets would
                // leave them to the endpoint's driver thread, woken for every arrival.
                Some((_, endpoint)) => {
                    // SAFETY: the descriptor of `self.poll`, which outlives the calls
                    let set = unsafe { BorrowedFd::borrow_raw(self.poll.as_raw_fd()) };
                    // whether the set may be readable, and whether anything was received
                    let mut look = |timeout| {
                        let seen = endpoint.wait_receiving(0, set, timeout, &mut readable);
                        (seen, !readable.is_empty())
                    };
                    if busy {
                        look(Some(Duration::ZERO)).0
                    } else {
                        let mut seen = false;
                        let found = self.busy.spin(|| {
                            let (set_ready, received) = look(Some(Duration::ZERO));
                            seen = set_ready;
                            set_ready || received
                        });
                        if found {
                            seen
                        } else {
                            look(Some(wake_at.saturating_duration_since(Instant::now()))).0
                        }
                    }
                }
                // the endpoint is being made again: connections wait for it (their retries
                // may be due already)
                None => {
                    if !busy {
                        std::thread::sleep(RETRY_PAUSE);
                    }
                    true
                }
            };
            for k in readable.drain(..) {
                let k = usize::try_from(k).unwrap_or(usize::MAX);
                if self.slots.get(k).is_some_and(Option::is_some) && !self.ready.contains(&k) {
                    self.ready.push_back(k);
                }
            }
            if look_at_set {
                if let Err(e) = self.poll.poll(&mut events, Some(Duration::ZERO)) {
                    if e.kind() != ErrorKind::Interrupted {
                        return self
                            .stop
                            .fail(format!("waiting on the connections failed: {e}"));
                    }
                }
            } else {
                events.clear();
            }
            let mut interface_ready = false;
            for ev in events.iter() {
                match ev.token() {
                    ENDPOINT => {
                        self.accept_all();
                    }
                    INTERFACE => interface_ready = true,
                    WAKER => {
                        let added = std::mem::take(
                            &mut *self.handle.added.lock().unwrap_or_else(|e| e.into_inner()),
                        );
                        let now = Instant::now();
                        self.retries.extend(added.into_iter().map(|p| (now, p)));
                    }
                    Token(k) => {
                        if !self.ready.contains(&k) {
                            self.ready.push_back(k);
                        }
                    }
                }
            }
            // one turn each for the connections ready now; those with more go round again
            for _ in 0..self.ready.len() {
                let Some(k) = self.ready.pop_front() else {
                    break;
                };
                if self.serve(k) {
                    self.ready.push_back(k);
                }
            }
            // the interface's queue: packets came (its descriptor reports new ones only), or
            // the last batch left some
            if let Some((tun, router)) = &mut self.route {
                if interface_ready || !router.drained() {
                    match router.batch(&self.peers, tun) {
                        Ok(0) => {}
                        Ok(_) => self.busy.handled(),
                        Err(why) => return self.stop.fail(why),
                    }
                }
            }
        }
    }

    /// Follows the endpoint in use, logs refused handshakes, and drops the connections of
    /// peers removed from the cluster file.
    fn housekeeping(&mut self) {
        self.follow_endpoint();
        if let Some((_, endpoint)) = &self.endpoint {
            for r in endpoint.refused_handshakes() {
                eprintln!("ri2n tunnel: {}", (self.describe_refusal)(&r));
                self.refused(&r);
            }
        }
        self.accept_all();
        self.probe_dark_connections(Instant::now());
        self.drain_replaced(Instant::now());
        for k in 0..self.slots.len() {
            if self.slots[k].as_ref().is_some_and(|s| s.peer.is_removed()) {
                self.end(k, "removed from the cluster file");
            }
        }
        self.retries.retain(|(_, p)| !p.is_removed());
    }

    /// A peer this host connects to whose connection has had no link up for [`DARK_PROBE`]
    /// gets a handshake beside it, and another every [`DARK_PROBE`] while it stays so. A
    /// network that is down answers neither, and the connection waits on for its links to
    /// come back. But its peer's daemon may have been killed and started again with another
    /// key or carry: nothing would end the connection then (that daemon's resets cannot be
    /// verified under another key), and the status would call the peer connected for good.
    /// That daemon refuses the handshake, and the connection ends with the refusal as the
    /// reason this host waits ([`Loop::probe_failed`]). A handshake that succeeds replaces
    /// the connection ([`Loop::established`]), as a restarted peer's new connection does at
    /// the accepting side.
    fn probe_dark_connections(&mut self, now: Instant) {
        let Some((generation, endpoint)) = self.endpoint.clone() else {
            return;
        };
        let mut due = Vec::new();
        for s in self.slots.iter_mut().flatten() {
            if s.handshaking || !s.peer.connects || s.replaced_at.is_some() {
                continue;
            }
            let dark = (s.conn.stats().links.iter())
                .all(|l| !matches!(l.state, ri2n::LinkState::Up | ri2n::LinkState::Degraded));
            if !dark {
                (s.dark_since, s.probed_at) = (None, None);
                continue;
            }
            let since = *s.dark_since.get_or_insert(now);
            let last = s.probed_at.unwrap_or(since);
            if now.duration_since(last) >= DARK_PROBE {
                s.probed_at = Some(now);
                due.push(s.peer.clone());
            }
        }
        let port = self.peers.table().cluster.port;
        for peer in due {
            let probing =
                (self.slots.iter().flatten()).any(|s| s.probe && Arc::ptr_eq(&s.peer, &peer));
            if probing {
                continue;
            }
            let config = connection_config(self.peers.carry);
            if let Ok(conn) = endpoint.start_connect(&peer.remotes(port), config) {
                let conn = Arc::new(conn);
                self.add(peer, conn.clone(), generation, true);
                let slot = (self.slots.iter_mut().flatten()).find(|s| Arc::ptr_eq(&s.conn, &conn));
                if let Some(slot) = slot {
                    slot.probe = true;
                }
            }
        }
    }

    /// The handshake in slot `k`, started beside a connection with no link up, failed. One
    /// the peer's daemon refused (another key, another carry) says that the daemon that held
    /// the connection is gone: the connection ends, and the refusal is why this host waits.
    /// Any other failure (no answer) leaves the connection to wait for its links.
    fn probe_failed(&mut self, k: usize) {
        let Some(slot) = self.slots[k].as_ref() else {
            return;
        };
        let peer = slot.peer.clone();
        use ri2n::ConnectionError as E;
        let reason = match slot.conn.close_reason() {
            Some(r @ (E::KeyMismatch(_) | E::WrongApplication { .. })) => r.to_string(),
            _ => return,
        };
        if let Some(dark) = self.connection_beside(k, &peer, true) {
            eprintln!(
                "ri2n tunnel: {}: no link of its connection is up and its host refused a new \
                 one: the connection ends",
                peer.name()
            );
            self.end(dark, "its host refused a new connection");
            note_waiting(&peer, reason);
        }
    }

    /// The connection in slot `k` was replaced by a newer one to its peer: a handshake beside
    /// it (this host connects), which reached the peer's daemon while no link of its own was
    /// up yet, or the peer's new connection (it connects). Its two ends may each hold packets
    /// through the outage, and an abort from either would throw away the other's: each end
    /// instead delivers what it holds, its links back, then finishes the connection's streams,
    /// and goes on reading until the peer's end has done the same and the connection closed
    /// cleanly ([`Self::drain_replaced`]).
    fn replace(&mut self, k: usize) {
        let Some(slot) = self.slots[k].as_mut() else {
            return;
        };
        slot.replaced_at = Some(Instant::now());
        if let Some(held) = Held::of(&slot.conn) {
            eprintln!(
                "ri2n tunnel: {}: the connection it replaces delivers what it holds ({held}) \
                 once its links are back",
                slot.peer.name()
            );
        }
        self.finish_delivered(k);
    }

    /// Finishes the streams of the replaced connection in slot `k` once it holds nothing more
    /// to send: its peer's end then reads the end of them after the last packet.
    fn finish_delivered(&mut self, k: usize) {
        let Some(slot) = self.slots[k].as_mut() else {
            return;
        };
        if slot.finished || Held::of(&slot.conn).is_some() {
            return;
        }
        slot.finished = true;
        // an error says the connection ended already: `serve` finds that end
        let _ = slot.conn.finish();
    }

    /// Finishes each replaced connection that delivered what it held, and aborts each that
    /// has not closed within [`DRAIN`]: what it still holds then counts as dropped (its links
    /// did not come back, or its peer's daemon is not the one it knew). A clean close is
    /// found by `serve`, which reads what the peer's end delivered up to it.
    fn drain_replaced(&mut self, now: Instant) {
        for k in 0..self.slots.len() {
            let Some(at) = self.slots[k].as_ref().and_then(|s| s.replaced_at) else {
                continue;
            };
            self.finish_delivered(k);
            if now.duration_since(at) < DRAIN {
                continue;
            }
            let Some(slot) = self.slots[k].as_ref() else {
                continue;
            };
            if let Some(held) = Held::of(&slot.conn) {
                slot.peer.drop_packets(held.packets);
                eprintln!(
                    "ri2n tunnel: {}: the connection it replaced did not deliver what it still \
                     held ({held}) within {} s: dropped",
                    slot.peer.name(),
                    DRAIN.as_secs()
                );
            }
            self.end(k, "replaced by a new connection");
        }
    }

    /// The slot of `peer`'s established connection other than slot `k` (`dark`: only one
    /// that had no link up when housekeeping last looked).
    fn connection_beside(&self, k: usize, peer: &Arc<Peer>, dark: bool) -> Option<usize> {
        (self.slots.iter().enumerate()).find_map(|(i, s)| {
            let s = s.as_ref()?;
            let theirs = i != k
                && Arc::ptr_eq(&s.peer, peer)
                && !s.handshaking
                && !s.probe
                && s.replaced_at.is_none();
            (theirs && (!dark || s.dark_since.is_some())).then_some(i)
        })
    }

    /// This host refused a handshake (another key, another carry) from where the daemon of
    /// a peer that connects here is bound: that daemon started again, configured apart from
    /// this one. The status says so while this side waits for it. A connection of that peer
    /// with no link up ends: its daemon was killed (a clean stop would have closed it), and
    /// nothing else would end it, for the new daemon's resets cannot be verified under
    /// another key. One with a link up is left alone: a refusal can come from anyone who
    /// can send from that address, and a working connection is not theirs to end.
    fn refused(&mut self, r: &ri2n::RefusedHandshake) {
        let table = self.peers.table();
        let Some(peer) = table.accepted_from(r.remote) else {
            return;
        };
        let reason = format!("refused its handshake: {}", r.reason);
        let dead = self.slots.iter().position(|s| {
            s.as_ref().is_some_and(|s| {
                Arc::ptr_eq(&s.peer, peer)
                    && !s.handshaking
                    && (s.conn.stats().links.iter()).all(|l| {
                        !matches!(l.state, ri2n::LinkState::Up | ri2n::LinkState::Degraded)
                    })
            })
        });
        if let Some(k) = dead {
            eprintln!(
                "ri2n tunnel: {}: no link of its connection is up and its host was refused a \
                 new one: the connection ends",
                peer.name()
            );
            let peer = peer.clone();
            self.end(k, "its host was refused a new connection");
            note_waiting(&peer, reason);
        } else if peer.conn().is_none() {
            note_waiting(peer, reason);
        }
    }

    /// Takes the endpoint in use, if it changed: its descriptor registered, the old one's
    /// handle dropped so that its sockets can go.
    fn follow_endpoint(&mut self) {
        let current = self.peers.endpoint.get();
        let mine = self.endpoint.as_ref().map(|e| e.0);
        if current.as_ref().map(|c| c.0) != mine {
            if let Some((_, old)) = self.endpoint.take() {
                if let Ok(fd) = old.readiness_fd() {
                    let _ = self
                        .poll
                        .registry()
                        .deregister(&mut SourceFd(&fd.as_raw_fd()));
                }
            }
            if let Some((generation, endpoint)) = current {
                match endpoint.readiness_fd() {
                    Ok(fd) => {
                        let fd = fd.as_raw_fd();
                        if let Err(e) = self.poll.registry().register(
                            &mut SourceFd(&fd),
                            ENDPOINT,
                            Interest::READABLE,
                        ) {
                            eprintln!("ri2n tunnel: cannot wait for connections: {e}");
                        }
                    }
                    Err(e) => eprintln!("ri2n tunnel: cannot wait for connections: {e}"),
                }
                self.endpoint = Some((generation, endpoint));
                // connections that came while no descriptor was registered
                self.accept_all();
            }
        }
    }

    /// Starts the handshakes whose time came.
    fn start_due_connects(&mut self, now: Instant) {
        let Some((generation, endpoint)) = self.endpoint.clone() else {
            return;
        };
        let port = self.peers.table().cluster.port;
        let config = connection_config(self.peers.carry);
        let mut i = 0;
        while i < self.retries.len() {
            if self.retries[i].0 > now {
                i += 1;
                continue;
            }
            let (_, peer) = self.retries.swap_remove(i);
            match endpoint.start_connect(&peer.remotes(port), config.clone()) {
                Ok(conn) => {
                    self.add(peer, Arc::new(conn), generation, true);
                }
                Err(e) => {
                    peer.handshake_failed();
                    note_waiting(&peer, e.to_string());
                    self.retries.push((now + RETRY_PAUSE, peer));
                }
            }
        }
    }

    /// Takes every connection waiting on the endpoint.
    fn accept_all(&mut self) {
        let Some((generation, endpoint)) = self.endpoint.clone() else {
            return;
        };
        // `try_accept` fails only when none is waiting
        while let Ok(conn) = endpoint.try_accept() {
            self.accepted(conn, generation);
        }
    }

    /// A connection from a host listed before this one. A new connection replaces a host's
    /// current one (the host restarted, or its connection was lost), so only a proven one
    /// may: the endpoint hands over a connection only once the client has confirmed the
    /// handshake (it holds the cluster key and the handshake's fresh secrets, which a
    /// replayed INITIAL cannot give, docs/PROTOCOL.md §11), and it must come from that
    /// host's address on one of its networks and from the cluster's port, where the host's
    /// daemon is bound.
    fn accepted(&mut self, conn: Connection, generation: u64) {
        let from = conn.stats().links.first().map(|l| l.remote);
        let table = self.peers.table();
        match from.and_then(|a| table.accepted_from(a)) {
            Some(peer) => self.add(peer.clone(), Arc::new(conn), generation, false),
            None => {
                let who = from.map_or("an unknown address".to_owned(), |a| a.to_string());
                eprintln!(
                    "ri2n tunnel: refused a connection from {who}: not the port of the \
                     cluster file on the address of a host listed before this one"
                );
                conn.abort(1, "not expected by this host's configuration");
            }
        }
    }

    /// Waits on `conn` from now on.
    fn add(&mut self, peer: Arc<Peer>, conn: Arc<Connection>, generation: u64, handshaking: bool) {
        let k = match self.slots.iter().position(Option::is_none) {
            Some(k) => k,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        let registered = conn.read_readiness_fd().and_then(|fd| {
            let fd = fd.as_raw_fd();
            (self.poll.registry()).register(&mut SourceFd(&fd), Token(k), Interest::READABLE)
        });
        if let Err(e) = registered {
            eprintln!(
                "ri2n tunnel: cannot wait on the connection to {}: {e}",
                peer.name()
            );
            conn.abort(1, "the tunnel could not wait on this connection");
            if peer.connects {
                self.retries.push((Instant::now() + RETRY_PAUSE, peer));
            }
            return;
        }
        // what this thread receives for it is reported by slot, not through the descriptor
        conn.set_loop_token(Some(k as u64));
        let accepted = !handshaking;
        self.slots[k] = Some(Slot {
            peer,
            conn,
            generation,
            handshaking,
            up_since: None,
            probe: false,
            dark_since: None,
            probed_at: None,
            replaced_at: None,
            finished: false,
        });
        if accepted {
            self.established(k);
        }
        // the handshake may have ended, or datagrams come, before the registration
        self.ready.push_back(k);
    }

    /// The connection in slot `k` is up: it becomes the way to its peer.
    fn established(&mut self, k: usize) {
        let Some(slot) = self.slots[k].as_mut() else {
            return;
        };
        slot.handshaking = false;
        let (peer, conn, generation) = (slot.peer.clone(), slot.conn.clone(), slot.generation);
        if self.peers.endpoint.generation() != Some(generation) {
            // made on an endpoint taken out meanwhile: it would keep the old sockets alive
            self.end(k, "the peer's link addresses changed: connecting again");
            return;
        }
        if peer.is_removed() {
            self.end(
                k,
                "the peer's cluster file no longer lists this host as it was",
            );
            return;
        }
        let mut was_probe = false;
        if let Some(slot) = self.slots[k].as_mut() {
            slot.up_since = Some(Instant::now());
            was_probe = std::mem::take(&mut slot.probe);
        }
        peer.set_waiting_for(None);
        peer.set(conn);
        // the connection this one replaces (one with no link up that a handshake beside it
        // replaced, one whose end a handshake raced, one of a daemon that started again)
        // ends at both sides: kept, it would run on for good
        if let Some(old) = self.connection_beside(k, &peer, false) {
            if peer.connects {
                let why = if was_probe {
                    "no link of its connection was up; a new one replaces it"
                } else {
                    "a new connection replaces the one before it"
                };
                eprintln!("ri2n tunnel: {}: {why}", peer.name());
            }
            self.replace(old);
        }
        // its links are logged as they come up (`status::sample_loop`): the accepting side
        // has only the first one yet
        eprintln!("ri2n tunnel: {} connected", peer.name());
    }

    /// One turn of the connection in slot `k`: its handshake's end, or up to [`TURN`]
    /// batches of what it received, written to the interface. True when it may have more.
    fn serve(&mut self, k: usize) -> bool {
        let Some(slot) = self.slots[k].as_ref() else {
            return false;
        };
        let (conn, peer) = (slot.conn.clone(), slot.peer.clone());
        for _ in 0..TURN {
            // a non-blocking call first: it clears the descriptor before it looks
            let received = self.out.receive(&conn, self.peers.carry);
            if self.slots[k].as_ref().is_some_and(|s| s.handshaking) {
                match conn.state() {
                    ConnectionState::Connecting => return false,
                    ConnectionState::Closed => {
                        // closing: the daemon aborted the handshake itself, and waits for
                        // no one
                        let probe = self.slots[k].as_ref().is_some_and(|s| s.probe);
                        if probe {
                            self.probe_failed(k);
                        } else if !self.stop.is_closing() {
                            let reason = (conn.close_reason())
                                .map_or_else(|| "closed".to_owned(), |r| r.to_string());
                            peer.handshake_failed();
                            note_waiting(&peer, reason);
                        }
                        self.end(k, "");
                        return false;
                    }
                    _ => {
                        self.established(k);
                        if self.slots[k].is_none() {
                            return false;
                        }
                    }
                }
            }
            match received {
                Ok(0) => {
                    // the peer finishes a connection a newer one replaced, which may be up
                    // here without this loop having taken it up yet
                    self.take_up_newer(&peer);
                    // the peer's end of a replaced connection finished first: this end's
                    // packets still go, and the connection closes once they are delivered
                    let delivering = (self.slots[k].as_ref())
                        .is_some_and(|s| s.replaced_at.is_some() && Held::of(&s.conn).is_some());
                    if !delivering {
                        self.lost(k, "closed".to_owned());
                    }
                    return false;
                }
                Ok(n) => {
                    let me = self.peers.table().me().address.octets();
                    let lost = self
                        .out
                        .write(&self.queues, &peer.host.address.octets(), &me);
                    // the window opens when the packets are out, as the route loops' does
                    self.busy.handled();
                    peer.count_received((n - lost.refused - lost.failed) as u64);
                    if let Some(why) = lost.first_refusal {
                        peer.refuse_packets(lost.refused as u64, why);
                    }
                    if let Some(e) = &lost.failure {
                        peer.fail_writes(lost.failed as u64, e);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
                Err(e) => {
                    self.lost(k, e.to_string());
                    return false;
                }
            }
        }
        true
    }

    /// Takes up a newer connection to `peer` that is up but not yet taken up by this loop: a
    /// handshake of this host's that ended, or one the endpoint holds for `accept`. Its
    /// readiness may come after the end of the connection it replaces, whose peer finished
    /// it at once: taken for lost, that one would be logged as such, and its end would
    /// start another connection beside the new one.
    fn take_up_newer(&mut self, peer: &Arc<Peer>) {
        if !peer.connects {
            self.accept_all();
            return;
        }
        for j in 0..self.slots.len() {
            let done = self.slots[j].as_ref().is_some_and(|s| {
                s.handshaking
                    && Arc::ptr_eq(&s.peer, peer)
                    && s.conn.state() != ConnectionState::Connecting
            });
            if done {
                self.serve(j);
            }
        }
    }

    /// The established connection in slot `k` ended; the status says why until the next one.
    /// One that a newer connection had replaced (the peer restarted without a word, and
    /// connected again before this one's end was found) lost nothing: the peer is connected.
    fn lost(&mut self, k: usize, reason: String) {
        // closing: the daemon ended it, and logged its summary
        let closing = self.stop.is_closing();
        if let Some(slot) = self.slots[k].as_ref().filter(|_| !closing) {
            let replaced = slot.replaced_at.is_some()
                || (slot.peer.conn()).is_some_and(|c| !Arc::ptr_eq(&c, &slot.conn));
            if replaced {
                // what it held for delivery (see `drain_replaced`) is lost with it
                let held = Held::of(&slot.conn);
                slot.peer.drop_packets(held.map_or(0, |h| h.packets));
                let undelivered = held.map_or(String::new(), |h| format!(", {h} undelivered"));
                // (the new one may have ended first: its end said so, and connects again)
                let then = match slot.peer.conn() {
                    Some(_) => "the new one carries the traffic",
                    None => "the one that replaced it ended too",
                };
                eprintln!(
                    "ri2n tunnel: {}: its replaced connection ended ({reason}{undelivered}); \
                     {then}",
                    slot.peer.name()
                );
            } else {
                eprintln!(
                    "ri2n tunnel: {} lost ({reason}); {}",
                    slot.peer.name(),
                    summary(&slot.conn.stats())
                );
                slot.peer
                    .set_waiting_for(Some(format!("its last connection was lost: {reason}")));
            }
        }
        self.end(k, "");
    }

    /// Stops waiting on slot `k` (aborting its connection with `why`, unless empty), and
    /// connects again after a pause if this host is the one that connects and no other
    /// connection or handshake to the peer carries on ([`carried_on`]).
    fn end(&mut self, k: usize, why: &str) {
        let Some(slot) = self.slots[k].take() else {
            return;
        };
        if let Ok(fd) = slot.conn.read_readiness_fd() {
            let _ = self
                .poll
                .registry()
                .deregister(&mut SourceFd(&fd.as_raw_fd()));
        }
        if !why.is_empty() {
            slot.conn.abort(0, why);
        }
        // a newer connection to the same peer may have replaced this one meanwhile
        slot.peer.clear(&slot.conn);
        self.ready.retain(|&r| r != k);
        let others = (self.slots.iter().flatten())
            .filter(|s| Arc::ptr_eq(&s.peer, &slot.peer))
            .map(|s| s.replaced_at.is_some());
        let carried_on = carried_on(slot.replaced_at.is_some(), others);
        if slot.peer.connects && !carried_on && !slot.peer.is_removed() && !self.stop.is_closing() {
            let pause = self.retry_pause(&slot);
            self.retries.push((Instant::now() + pause, slot.peer));
        } else {
            self.refusals.remove(slot.peer.name());
        }
    }

    /// How long to wait before connecting again to the peer of `slot`, which ended (see
    /// [`pause_after`]).
    fn retry_pause(&mut self, slot: &Slot) -> Duration {
        let name = slot.peer.name();
        let young = slot.up_since.is_none_or(|t| t.elapsed() < STABLE);
        let refusals = self.refusals.entry(name.to_owned()).or_default();
        let pause = pause_after(slot.conn.close_reason().as_ref(), young, refusals);
        if *refusals == 0 {
            self.refusals.remove(name);
        }
        pause
    }
}

/// Whether the peer of a slot that ended is left to another connection or handshake, whose
/// end, whenever it comes, connects again: `replaced`, the slot had been replaced by a newer
/// connection; `others`, whether each other slot of the peer was replaced. A handshake beside
/// a dark connection leaves that one to carry on, and the dark connection a handshake beside
/// it; a replaced connection leaves the newer one. So a peer has one handshake under way at
/// a time: two at once may complete in one order at this end and in the other at the peer's,
/// and each end would then take as current the connection the other replaces. A replaced
/// connection still draining does not carry on for its peer: the newer one ended first, and
/// waiting for the drain would hold up the next connection.
fn carried_on(replaced: bool, mut others: impl Iterator<Item = bool>) -> bool {
    replaced || others.any(|other_replaced| !other_replaced)
}

/// How long to wait before connecting again to a peer whose connection ended for `reason`
/// (`young`: within [`STABLE`] of its start), given the `refusals` in a row before, which it
/// counts on. After a refusal (the peer's endpoint refused the handshake: another key,
/// another carry, no room; or its daemon aborted the connection in its handshake or soon
/// after) twice as long each time, up to [`MAX_RETRY_PAUSE`]: each costs a handshake and a
/// log line on both hosts, and a misconfigured host would otherwise be tried ten times a
/// second for as long as it stays so. After anything else (a connection lost or aborted
/// here, a handshake that found nobody) [`RETRY_PAUSE`].
fn pause_after(
    reason: Option<&ri2n::ConnectionError>,
    young: bool,
    refusals: &mut u32,
) -> Duration {
    use ri2n::ConnectionError as E;
    let refused = match reason {
        Some(E::PeerAborted { .. }) => young,
        Some(E::KeyMismatch(_) | E::WrongApplication { .. } | E::NotAccepting | E::ServerFull) => {
            true
        }
        _ => false,
    };
    if !refused {
        *refusals = 0;
        return RETRY_PAUSE;
    }
    *refusals = refusals.saturating_add(1);
    (RETRY_PAUSE * 2u32.pow((*refusals - 1).min(16))).min(MAX_RETRY_PAUSE)
}

/// Why a connection to `peer` could not be made, logged whenever it changes (a peer that
/// comes back with another key is named as such, not left at "nothing listens").
fn note_waiting(peer: &Peer, reason: String) {
    if peer.waiting_reason().as_ref() != Some(&reason) {
        eprintln!("ri2n tunnel: waiting for {} ({reason})", peer.name());
        peer.set_waiting_for(Some(reason));
    }
}

/// What one connection received, on its way to the interface, and the buffers for it (their
/// memory goes round between here and the connections).
#[derive(Default)]
struct Delivery {
    packets: Vec<Vec<u8>>,
    header: Vec<u8>,
    runs: Vec<std::ops::Range<usize>>,
    segments: Vec<Option<([u8; offload::VNET_HDR_LEN], usize)>>,
}

impl Delivery {
    /// Takes what `conn` has received, without waiting: how many packets (0: the
    /// connection ended cleanly), or `WouldBlock`.
    fn receive(&mut self, conn: &Connection, carry: Carry) -> std::io::Result<usize> {
        match carry {
            Carry::Datagrams => conn.try_recv_datagrams_into(&mut self.packets, BATCH)?,
            // a batch too, so that a flow's consecutive packets are written to the interface
            // as one
            Carry::Messages => conn.try_recv_messages_into(&mut self.packets, BATCH)?,
        }
        Ok(self.packets.len())
    }

    /// Writes the packets received to the interface, in the order they came: plain packets
    /// in coalesced runs, large segments whole as they are; a full or vanished interface
    /// drops the packet, as a NIC would. Only packets from the peer's own tunnel address
    /// (`source`) to this host's (`me`) go: a host of the cluster cannot speak for another,
    /// nor reach through this one addresses it would not route to the tunnel (this host's
    /// other addresses, a broadcast, networks it forwards to). Returns what was not written.
    fn write(&mut self, queues: &Queues, source: &[u8; 4], me: &[u8; 4]) -> NotWritten {
        let Delivery {
            packets,
            header,
            runs,
            segments,
        } = self;
        segments.clear();
        segments.extend(packets.iter_mut().map(|p| offload::segment_for_write(p)));
        let mut lost = NotWritten::default();
        let mut plain: SmallVec<[&[u8]; BATCH]> = SmallVec::new();
        for (p, segment) in packets.iter().zip(segments.iter()) {
            let ip = match segment {
                Some((_, start)) => Ipv4HeaderSlice::from_slice(&p[*start..]).ok(),
                None if offload::is_segment(p) => {
                    lost.refuse(Refusal::Segment);
                    continue;
                }
                None => Ipv4HeaderSlice::from_slice(p).ok(),
            };
            let refusal = match ip {
                None => Some(Refusal::NotIpv4),
                Some(ip) if ip.source() != *source => Some(Refusal::From(ip.source_addr())),
                Some(ip) if ip.destination() != *me => Some(Refusal::To(ip.destination_addr())),
                Some(_) => None,
            };
            if let Some(why) = refusal {
                lost.refuse(why);
                continue;
            }
            let Some((vnet, start)) = segment else {
                plain.push(p);
                continue;
            };
            write_plain(queues, &mut plain, runs, header, &mut lost);
            let packet = &p[*start..];
            let written = queues
                .for_packet(packet)
                .write_merged(vnet, std::iter::once(packet));
            lost.failed_write(written, 1);
        }
        write_plain(queues, &mut plain, runs, header, &mut lost);
        lost
    }
}

/// Why a packet from a peer was not written to the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// From another source than the peer's tunnel address.
    From(Ipv4Addr),
    /// To another destination than this host's tunnel address.
    To(Ipv4Addr),
    /// Not an IPv4 packet.
    NotIpv4,
    /// A large TCP segment this host does not take (of another kind, or cut too small).
    Segment,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::From(a) => write!(f, "from {a}"),
            Refusal::To(a) => write!(f, "to {a}"),
            Refusal::NotIpv4 => write!(f, "not IPv4"),
            Refusal::Segment => write!(f, "large TCP segments of a kind this host does not take"),
        }
    }
}

/// The packets of a delivery that did not reach the interface.
#[derive(Debug, Default)]
struct NotWritten {
    /// Not the peer's to send ([`Refusal`]).
    refused: usize,
    /// Why the first of those was refused.
    first_refusal: Option<Refusal>,
    /// Packets whose write the interface refused (down, gone, a segment it would not take).
    failed: usize,
    /// Why the first of those writes failed.
    failure: Option<std::io::Error>,
}

impl NotWritten {
    /// Counts a packet refused, and why if it is the first.
    fn refuse(&mut self, why: Refusal) {
        self.refused += 1;
        self.first_refusal.get_or_insert(why);
    }

    /// Counts the `packets` of a write that failed.
    fn failed_write(&mut self, written: std::io::Result<()>, packets: usize) {
        if let Err(e) = written {
            self.failed += packets;
            self.failure.get_or_insert(e);
        }
    }
}

/// Writes plain packets to the interface, consecutive TCP segments of one flow coalesced
/// into one write, and empties `packets`.
fn write_plain(
    queues: &Queues,
    packets: &mut SmallVec<[&[u8]; BATCH]>,
    runs: &mut Vec<std::ops::Range<usize>>,
    header: &mut Vec<u8>,
    lost: &mut NotWritten,
) {
    offload::runs(packets, runs);
    for run in runs.drain(..) {
        let run = &packets[run];
        // a run is one flow's
        let queue = queues.for_packet(run[0]);
        let written = if let [packet] = run {
            queue.write(packet)
        } else {
            let skip = offload::merged_header(run, header);
            queue.write_merged(header, run.iter().map(|p| &p[skip..]))
        };
        lost.failed_write(written, run.len());
    }
    packets.clear();
}

#[cfg(test)]
mod tests {
    use std::fs::{File, OpenOptions};

    use super::*;

    /// A peer that refuses the handshake (another key, another carry, a full or closing
    /// server) is tried again at a slowing pace, as one whose daemon aborts at once. Before,
    /// a host with another key was tried every 100 ms for as long as it kept it.
    #[test]
    fn a_refused_handshake_is_tried_again_at_a_slowing_pace() {
        use ri2n::ConnectionError as E;
        let refusals_in_a_row = |reason: E| {
            let mut n = 0;
            let pauses: Vec<Duration> = (0..7)
                .map(|_| pause_after(Some(&reason), true, &mut n))
                .collect();
            (pauses, n)
        };
        let ms = Duration::from_millis;
        let growing = vec![
            ms(100),
            ms(200),
            ms(400),
            ms(800),
            ms(1600),
            ms(3200),
            ms(5000),
        ];
        let key = E::KeyMismatch(ri2n::KeyMismatch::WrongKey);
        assert_eq!(refusals_in_a_row(key), (growing.clone(), 7));
        assert_eq!(refusals_in_a_row(E::ServerFull), (growing.clone(), 7));
        let aborted = E::PeerAborted {
            code: 0,
            reason: "not expected".into(),
        };
        assert_eq!(refusals_in_a_row(aborted.clone()), (growing, 7));
        // a connection that ran a while, or was lost: at once again, and the count starts over
        let mut n = 3;
        assert_eq!(pause_after(Some(&aborted), false, &mut n), RETRY_PAUSE);
        assert_eq!(n, 0);
        let mut n = 3;
        assert_eq!(pause_after(Some(&E::PeerGone), true, &mut n), RETRY_PAUSE);
        assert_eq!((pause_after(None, true, &mut n), n), (RETRY_PAUSE, 0));
    }

    /// This host's tunnel address.
    const ME: [u8; 4] = [10, 99, 0, 1];

    /// Only the peer's own packets to this host are written: not one from another source,
    /// nor one to another of this host's addresses (or to an address behind it), nor what is
    /// not IPv4, nor a large segment this host does not take; each counted as refused, the
    /// first with its reason. Before, a packet from the peer to any destination was written.
    #[test]
    fn only_the_peer_s_own_packets_to_this_host_are_written() {
        let source = [10, 99, 0, 2];
        let with = |at: usize, bytes: [u8; 4]| {
            let mut p = udp_packet();
            p[at..at + 4].copy_from_slice(&bytes);
            p
        };
        // marked as a segment carried whole, but no TCP segment inside (offload.rs tests the
        // other segments refused: sizes below any kernel's least MSS, GSO_BY_FRAGS)
        let mut not_a_segment = vec![0, 1, 5, 0x5c];
        not_a_segment.extend_from_slice(&udp_packet());
        for (packet, why) in [
            (with(16, [10, 0, 1, 1]), Refusal::To([10, 0, 1, 1].into())),
            (
                with(16, [10, 99, 0, 255]),
                Refusal::To([10, 99, 0, 255].into()),
            ),
            (
                with(12, [10, 99, 0, 7]),
                Refusal::From([10, 99, 0, 7].into()),
            ),
            (vec![0x60; 40], Refusal::NotIpv4),
            (not_a_segment, Refusal::Segment),
        ] {
            let mut delivery = Delivery::default();
            let writable = OpenOptions::new().write(true).open("/dev/null").unwrap();
            delivery.packets = vec![udp_packet(), packet, udp_packet()];
            let lost = delivery.write(&Queues::of_files(vec![writable]), &source, &ME);
            assert_eq!((lost.refused, lost.failed), (1, 0), "{why}: {lost:?}");
            assert_eq!(lost.first_refusal, Some(why));
        }
    }

    /// A peer has one handshake under way at a time. A connection with no link up that ends
    /// while a handshake beside it is under way (the peer's daemon started again and answered
    /// the old connection with a reset) leaves the peer to that handshake. Before, it started
    /// another beside it: the two could complete in different orders at the two ends, each
    /// end then finishing the connection the other took as current.
    #[test]
    fn one_handshake_at_a_time_and_one_connection_again_after_an_end() {
        // (the slot that ended was replaced, whether each other slot of its peer was) and
        // whether the peer is left to another
        let cases: [(&str, bool, &[bool], bool); 5] = [
            (
                "a dark connection beside a handshake, or the reverse",
                false,
                &[false],
                true,
            ),
            ("the peer's last connection or handshake", false, &[], false),
            (
                "a replaced connection beside the newer one",
                true,
                &[false],
                true,
            ),
            ("a replaced connection after the newer one", true, &[], true),
            (
                "the newer connection while the one it replaced drains",
                false,
                &[true],
                false,
            ),
        ];
        for (what, replaced, others, expected) in cases {
            let left = carried_on(replaced, others.iter().copied());
            assert_eq!(left, expected, "{what} ended");
        }
    }

    /// A UDP packet from 10.99.0.2 to 10.99.0.1.
    fn udp_packet() -> Vec<u8> {
        let mut p = vec![
            0x45, 0, 0, 28, 0, 1, 0x40, 0, 64, 17, 0, 0, 10, 99, 0, 2, 10, 99, 0, 1,
        ];
        p.extend_from_slice(&[0x13, 0x88, 0x13, 0x89, 0, 8, 0, 0]);
        p
    }

    /// A packet the interface refuses is not counted as written: the caller counts it as
    /// dropped, with the reason.
    #[test]
    fn a_packet_the_interface_refuses_is_not_counted_as_written() {
        let source = [10, 99, 0, 2];
        let mut delivery = Delivery::default();
        let writable = OpenOptions::new().write(true).open("/dev/null").unwrap();
        delivery.packets = vec![udp_packet(), udp_packet()];
        let lost = delivery.write(&Queues::of_files(vec![writable]), &source, &ME);
        assert_eq!((lost.refused, lost.failed), (0, 0), "{lost:?}");
        // read-only: every write fails (EBADF), as on an interface that is down (EIO)
        let read_only = File::open("/dev/null").unwrap();
        delivery.packets = vec![udp_packet(), udp_packet()];
        let lost = delivery.write(&Queues::of_files(vec![read_only]), &source, &ME);
        assert_eq!((lost.refused, lost.failed), (0, 2), "{lost:?}");
        assert_eq!(
            lost.failure.map(|e| e.raw_os_error()),
            Some(Some(libc::EBADF))
        );
    }
}
