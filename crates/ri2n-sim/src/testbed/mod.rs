//! A client and a server `Endpoint` joined by K links of the simulator's network model, for
//! tests that step the two engines by hand: they advance simulated time event by event, until a
//! condition holds or for a while, act on either endpoint in between, read the datagrams the
//! hosts sent, hand either endpoint datagrams of their own making, and change the links with
//! the scenario's [`Action`]s.
//!
//! The links are ideal by default (a fixed delay, nothing lost, no rate limit, see
//! [`LinkConfig::ideal`]), and any [`LinkConfig`] may replace them. Endpoint timers are polled
//! rather than scheduled: every step hands both endpoints the current time, as a driver that
//! wakes for either would. Everything is seeded; only the base `Instant` is taken from the
//! clock, and the engine sees nothing but time relative to it.

mod transfer;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ri2n_proto::wire::{self, packet_type, VERSION};
use ri2n_proto::{
    Connection, ConnectionConfig, ConnectionHandle, ConnectionState, Endpoint, EndpointConfig, Key,
    Openers, Transmit,
};

use crate::derive_seed;
use crate::events::EventQueue;
use crate::net::{host_addr, Arrival, Dir, HostId, LinkConfig, NetEvent, Network, MAX_DATAGRAM};
use crate::outgoing::Outgoing;
use crate::scenario::Action;

pub use transfer::{message, pattern, Transfer};

/// One-way delay of the default links.
pub const DEFAULT_DELAY: Duration = Duration::from_micros(500);

/// Steps at one simulated instant after which the engine is declared stuck (its timer stays
/// due however often it is handled).
const MAX_STEPS_WITHOUT_PROGRESS: u32 = 1_000;

/// Which of one direction's datagrams a [`Testbed`] keeps, as [`Captured`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capture {
    /// The first `keep` datagrams are kept for good.
    pub keep: usize,
    /// After them, the latest `rolling` ones (each new one replaces the oldest).
    pub rolling: usize,
}

impl Capture {
    /// None at all.
    pub const NONE: Capture = Capture {
        keep: 0,
        rolling: 0,
    };

    /// The first `n`, in the order they were sent.
    pub fn first(n: usize) -> Self {
        Self {
            keep: n,
            rolling: 0,
        }
    }

    /// Every datagram, in the order they were sent.
    pub fn all() -> Self {
        Self::first(usize::MAX)
    }

    /// The latest `n`.
    pub fn last(n: usize) -> Self {
        Self {
            keep: 0,
            rolling: n,
        }
    }
}

/// A datagram one host sent, as its receiver would see it, captured as it was sent: the
/// network may yet drop it (a dead link, loss, a full queue, a too small MTU). Datagrams a
/// test injects are not captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// The receiver's address it went to.
    pub local: SocketAddr,
    /// The sender's address it came from.
    pub remote: SocketAddr,
    /// When it was sent.
    pub at: Duration,
    /// The datagram.
    pub bytes: Vec<u8>,
}

/// Settings of a [`Testbed`].
#[derive(Debug, Clone)]
pub struct TestbedConfig {
    /// Each link's addresses: the client's and the server's. The client connects to the first
    /// link's server address.
    pub addrs: Vec<(SocketAddr, SocketAddr)>,
    /// Each link's characteristics (one per address pair).
    pub links: Vec<LinkConfig>,
    /// The connection's configuration, on both sides unless `server_connection` is set.
    pub connection: ConnectionConfig,
    /// The server's connection configuration, where it differs from the client's.
    pub server_connection: Option<ConnectionConfig>,
    /// The client's key (none: in clear).
    pub client_key: Option<Key>,
    /// The server's key (none: in clear).
    pub server_key: Option<Key>,
    /// Seed of the client's random numbers; the server's is the next one, the network's and a
    /// restarted server's are derived from it.
    pub seed: u64,
    /// Which datagrams are kept, per direction (indexed by [`Dir::index`]).
    pub capture: [Capture; 2],
    /// The endpoints build bursts (many datagrams per `poll_transmit_into` call, as into the
    /// driver's batches) rather than one datagram per `poll_transmit` call.
    pub bursts: bool,
    /// Largest datagram either endpoint may build: a larger one is a bug, and panics.
    pub max_datagram: usize,
    /// Packets are sealed and opened outside the engine, as the driver does: the sealing of
    /// each datagram of a burst is handed out and applied after it was built, and received
    /// datagrams are opened by [`Openers`] before the engine gets them (with `bursts`).
    pub opens_outside: bool,
    /// The client connects with every server address given, as `--to` repeated does, not
    /// with the first alone (the others then learned from the server).
    pub all_remotes_given: bool,
}

impl TestbedConfig {
    /// `links` ideal links of [`DEFAULT_DELAY`] between the addresses [`host_addr`] gives,
    /// the default connection configuration, no keys, seed 1; the first 32 and then the latest
    /// 224 client datagrams kept, and the latest server datagram.
    pub fn new(links: usize) -> Self {
        Self {
            addrs: (0..links)
                .map(|i| (host_addr(HostId::A, i), host_addr(HostId::B, i)))
                .collect(),
            links: vec![LinkConfig::ideal(DEFAULT_DELAY); links],
            connection: ConnectionConfig::default(),
            server_connection: None,
            client_key: None,
            server_key: None,
            seed: 1,
            capture: [
                Capture {
                    keep: 32,
                    rolling: 224,
                },
                Capture::last(1),
            ],
            bursts: false,
            max_datagram: MAX_DATAGRAM,
            opens_outside: false,
            all_remotes_given: false,
        }
    }

    /// The same with links between these (client, server) address pairs, ideal ones of
    /// [`DEFAULT_DELAY`] where there were fewer links before.
    pub fn with_addrs(mut self, addrs: Vec<(SocketAddr, SocketAddr)>) -> Self {
        self.links
            .resize(addrs.len(), LinkConfig::ideal(DEFAULT_DELAY));
        self.addrs = addrs;
        self
    }

    /// The same with every link of these characteristics.
    pub fn with_links(mut self, link: LinkConfig) -> Self {
        self.links = vec![link; self.addrs.len()];
        self
    }

    /// The same with another connection configuration.
    pub fn with_connection(mut self, connection: ConnectionConfig) -> Self {
        self.connection = connection;
        self
    }

    /// The same with another connection configuration on the server alone (the peers of a
    /// real cluster need not be configured alike); the methods that change the connection's
    /// configuration then change the client's alone.
    pub fn with_server_connection(mut self, connection: ConnectionConfig) -> Self {
        self.server_connection = Some(connection);
        self
    }

    /// The same with this receive window and send buffer for each stream, on both sides.
    pub fn with_buffers(mut self, window: u64, send_buffer: u64) -> Self {
        self.connection.stream_receive_window = window;
        self.connection.send_buffer = send_buffer;
        self
    }

    /// The same with these keys (none: in clear).
    pub fn with_keys(mut self, client: Option<Key>, server: Option<Key>) -> Self {
        self.client_key = client;
        self.server_key = server;
        self
    }

    /// The same with another seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The same keeping other datagrams of direction `dir`.
    pub fn with_capture(mut self, dir: Dir, capture: Capture) -> Self {
        self.capture[dir.index()] = capture;
        self
    }

    /// The same with packets sealed and opened outside the engine (see
    /// [`TestbedConfig::opens_outside`]), which implies bursts.
    pub fn with_opening_outside(mut self) -> Self {
        self.bursts = true;
        self.opens_outside = true;
        self
    }

    /// The same with the client given every server address (see
    /// [`TestbedConfig::all_remotes_given`]).
    pub fn with_all_remotes_given(mut self) -> Self {
        self.all_remotes_given = true;
        self
    }

    /// The same with bursts on or off (see [`TestbedConfig::bursts`]).
    pub fn with_bursts(mut self, bursts: bool) -> Self {
        self.bursts = bursts;
        self
    }

    fn client_config(&self) -> EndpointConfig {
        let mut c = EndpointConfig::new(self.addrs.iter().map(|a| a.0).collect());
        c.key = self.client_key.clone();
        c
    }

    fn server_config(&self) -> EndpointConfig {
        let mut c = EndpointConfig::new(self.addrs.iter().map(|a| a.1).collect()).server();
        c.server_connection = (self.server_connection.as_ref())
            .unwrap_or(&self.connection)
            .clone();
        c.key = self.server_key.clone();
        c
    }
}

impl Default for TestbedConfig {
    /// Two links (see [`TestbedConfig::new`]).
    fn default() -> Self {
        Self::new(2)
    }
}

/// A client and a server endpoint joined by the simulated network, and the client's
/// connection to the server.
///
/// The client and server endpoints and connection handles are public fields: a test calls the
/// engine directly between steps, as an application or an attacker would.
pub struct Testbed {
    cfg: TestbedConfig,
    base: Instant,
    now: Duration,
    net: Network,
    queue: EventQueue<NetEvent>,
    /// The client (host A).
    pub client: Endpoint,
    /// The server (host B).
    pub server: Endpoint,
    /// The client's connection, started when the testbed was made.
    pub ch: ConnectionHandle,
    /// The server's connection, once accepted (every flush accepts it).
    pub sh: Option<ConnectionHandle>,
    server_cid: Option<u64>,
    link_ids: HashMap<(SocketAddr, SocketAddr), u8>,
    captured: [Vec<Captured>; 2],
    sent: [u64; 2],
    unrouted: [u64; 2],
    largest_burst: usize,
    restarts: u64,
    tx: Outgoing,
    buf: Vec<u8>,
    /// The client's and the server's openers (with `opens_outside`).
    openers: [Openers; 2],
    opened_outside: u64,
    /// Per host (client, server): until when it does not run (see [`Testbed::stall`]), and
    /// the datagrams that arrived for it meanwhile.
    stalls: [Option<(Duration, Vec<Arrival>)>; 2],
}

impl Testbed {
    /// Endpoints and network set up, the client's connection started (not yet established),
    /// the clock at 0 on a base instant taken now.
    pub fn new(cfg: TestbedConfig) -> Self {
        Self::new_at(cfg, Instant::now())
    }

    /// [`Testbed::new`] on the base instant `base`: testbeds made with the same configuration
    /// and base behave alike in every respect.
    pub fn new_at(cfg: TestbedConfig, base: Instant) -> Self {
        assert!(!cfg.addrs.is_empty(), "a testbed needs a link");
        let net = Network::with_addrs(&cfg.links, &cfg.addrs, derive_seed(cfg.seed, 0x7E57));
        let mut client = Endpoint::new(cfg.client_config(), cfg.seed, base);
        let server = Endpoint::new(cfg.server_config(), cfg.seed.wrapping_add(1), base);
        let remotes: Vec<SocketAddr> = match cfg.all_remotes_given {
            true => cfg.addrs.iter().map(|a| a.1).collect(),
            false => vec![cfg.addrs[0].1],
        };
        let ch = client
            .connect(base, &remotes, cfg.connection.clone())
            .expect("the client connects");
        Self {
            base,
            now: Duration::ZERO,
            net,
            queue: EventQueue::default(),
            client,
            server,
            ch,
            sh: None,
            server_cid: None,
            link_ids: HashMap::new(),
            captured: [Vec::new(), Vec::new()],
            sent: [0; 2],
            unrouted: [0; 2],
            largest_burst: 0,
            restarts: 0,
            tx: Outgoing::new(cfg.opens_outside),
            buf: vec![0; wire::MAX_DATAGRAM_SIZE],
            openers: Default::default(),
            opened_outside: 0,
            stalls: [None, None],
            cfg,
        }
    }

    /// Datagrams the endpoints were handed opened already (with `opens_outside`).
    pub fn opened_outside(&self) -> u64 {
        self.opened_outside
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &TestbedConfig {
        &self.cfg
    }

    /// The instant simulated time 0 stands for.
    pub fn base(&self) -> Instant {
        self.base
    }

    /// Simulated time.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// Simulated time as the instant the endpoints are handed.
    pub fn instant(&self) -> Instant {
        self.base + self.now
    }

    /// The client's address on each link.
    pub fn client_addrs(&self) -> Vec<SocketAddr> {
        self.cfg.addrs.iter().map(|a| a.0).collect()
    }

    /// The server's address on each link.
    pub fn server_addrs(&self) -> Vec<SocketAddr> {
        self.cfg.addrs.iter().map(|a| a.1).collect()
    }

    /// The links, with their state and counters.
    pub fn network(&self) -> &Network {
        &self.net
    }

    /// The client's connection.
    pub fn client_conn(&self) -> &Connection {
        self.client
            .connection(self.ch)
            .expect("client connection exists")
    }

    /// The server's connection.
    pub fn server_conn(&self) -> &Connection {
        self.server
            .connection(self.sh.expect("accepted"))
            .expect("server connection exists")
    }

    /// The server connection's ID, once the client has sent a short packet (what it writes in
    /// bytes 2..10 of one).
    pub fn server_cid(&self) -> Option<u64> {
        self.server_cid
    }

    /// The link byte of the client's short packets to `server` from `client`, once it sent one.
    pub fn link_id(&self, server: SocketAddr, client: SocketAddr) -> Option<u8> {
        self.link_ids.get(&(server, client)).copied()
    }

    /// The address pairs (server address, client address) of the client's short packets, in
    /// order.
    pub fn pairs(&self) -> Vec<(SocketAddr, SocketAddr)> {
        let mut v: Vec<_> = self.link_ids.keys().copied().collect();
        v.sort();
        v
    }

    /// The datagrams of direction `dir` kept (see [`Capture`]): those kept for good in the
    /// order they were sent, then the rolling ones, in the order of their slots.
    pub fn captured(&self, dir: Dir) -> &[Captured] {
        &self.captured[dir.index()]
    }

    /// The latest datagram sent in direction `dir`, if it was kept.
    pub fn last_captured(&self, dir: Dir) -> Option<&Captured> {
        let c = self.cfg.capture[dir.index()];
        let sent = self.sent[dir.index()] as usize;
        let kept = &self.captured[dir.index()];
        if sent == 0 || kept.is_empty() {
            return None;
        }
        if sent <= kept.len() {
            return kept.last();
        }
        if c.rolling == 0 {
            return None;
        }
        kept.get(c.keep + (sent - 1 - c.keep) % c.rolling)
    }

    /// Datagrams `host` sent between addresses no link joins (they were lost).
    pub fn unrouted(&self, host: HostId) -> u64 {
        self.unrouted[host.index()]
    }

    /// Most datagrams one call built (1 without bursts).
    pub fn largest_burst(&self) -> usize {
        self.largest_burst
    }

    /// Puts everything both endpoints want to send on the network, client first, and accepts
    /// the server's connection if it has come.
    pub fn flush(&mut self) {
        for host in [HostId::A, HostId::B] {
            if !self.is_stalled(host) {
                self.transmit(host);
            }
        }
        if self.sh.is_none() {
            self.sh = self.server.accept();
        }
        self.settle();
    }

    fn transmit(&mut self, host: HostId) {
        let now = self.instant();
        loop {
            let ep = match host {
                HostId::A => &mut self.client,
                HostId::B => &mut self.server,
            };
            if self.cfg.bursts {
                ep.poll_transmit_into(now, &mut self.tx);
            } else if let Some(t) = ep.poll_transmit(now, &mut self.buf) {
                self.tx.built.push((t, self.buf[..t.len].to_vec()));
            }
            if self.tx.built.is_empty() {
                return;
            }
            self.largest_burst = self.largest_burst.max(self.tx.built.len());
            let mut built = std::mem::take(&mut self.tx.built);
            for (t, data) in built.drain(..) {
                self.put(host, t.local, t.remote, data);
            }
            self.tx.built = built; // empty, its memory kept
        }
    }

    /// Puts a datagram `host` sent from `local` to `remote` on the network.
    fn put(&mut self, host: HostId, local: SocketAddr, remote: SocketAddr, data: Vec<u8>) {
        assert!(
            data.len() <= self.cfg.max_datagram,
            "{} datagram of {} bytes",
            match host {
                HostId::A => "client",
                HostId::B => "server",
            },
            data.len()
        );
        if host == HostId::A {
            self.learn(remote, local, &data);
        }
        let dir = Dir::from_sender(host);
        self.capture(dir, remote, local, &data);
        let queue = &mut self.queue;
        let now = self.now;
        let sent = self.net.send(now, host, local, remote, data, &mut |at, e| {
            queue.schedule(at, e)
        });
        if sent.is_none() {
            self.unrouted[host.index()] += 1;
        }
    }

    /// Notes the server's connection ID and the link byte of the pair from a client datagram.
    fn learn(&mut self, server: SocketAddr, client: SocketAddr, bytes: &[u8]) {
        if bytes.len() > wire::SHORT_HEADER_FIXED
            && bytes[0] == VERSION
            && (bytes[1] == packet_type::SHORT || bytes[1] == packet_type::SHORT_PHASE1)
        {
            let cid = u64::from_be_bytes(bytes[2..10].try_into().expect("8 bytes"));
            self.server_cid.get_or_insert(cid);
            self.link_ids.entry((server, client)).or_insert(bytes[10]);
        }
    }

    fn capture(&mut self, dir: Dir, local: SocketAddr, remote: SocketAddr, bytes: &[u8]) {
        let Capture { keep, rolling } = self.cfg.capture[dir.index()];
        let i = self.sent[dir.index()] as usize;
        self.sent[dir.index()] += 1;
        let slot = if i < keep {
            i
        } else if rolling > 0 {
            keep + (i - keep) % rolling
        } else {
            return;
        };
        let c = Captured {
            local,
            remote,
            at: self.now,
            bytes: bytes.to_vec(),
        };
        let kept = &mut self.captured[dir.index()];
        if slot < kept.len() {
            kept[slot] = c;
        } else {
            kept.push(c);
        }
    }

    /// Lets the transmitters finish what they finish now: what the hosts sent is then on the
    /// wire, and the next event is something that happens to a host.
    fn settle(&mut self) {
        while matches!(
            self.queue.peek(),
            Some((at, NetEvent::TxDone { .. })) if at <= self.now
        ) {
            let (_, ev) = self.queue.pop().expect("peeked");
            let queue = &mut self.queue;
            self.net.handle(ev, &mut |at, e| queue.schedule(at, e));
        }
    }

    /// When the next timer of either endpoint expires or the network next acts; `None` if
    /// nothing is left to happen.
    pub fn next_event(&mut self) -> Option<Duration> {
        let base = self.base;
        // a stalled host's timers wait for its stall's end
        let timer = |ep: &mut Endpoint, stall: &Option<(Duration, Vec<Arrival>)>| match stall {
            Some((until, _)) => Some(*until),
            None => ep.poll_timeout().map(|t| t.saturating_duration_since(base)),
        };
        let timers = [
            timer(&mut self.client, &self.stalls[0]),
            timer(&mut self.server, &self.stalls[1]),
        ];
        let net = self.queue.peek().map(|(at, _)| at);
        timers.into_iter().chain([net]).flatten().min()
    }

    /// Host `host` does not run until `until` (as on a busy machine): what arrives for it
    /// meanwhile waits, in order, and it neither runs its timers nor sends; at `until` it
    /// takes in what waited, then goes on.
    pub fn stall(&mut self, host: HostId, until: Duration) {
        let i = host_index(host);
        let held = self.stalls[i]
            .take()
            .map(|(_, held)| held)
            .unwrap_or_default();
        self.stalls[i] = Some((until.max(self.now), held));
    }

    fn is_stalled(&self, host: HostId) -> bool {
        self.stalls[host_index(host)].is_some()
    }

    /// Moves the clock to `t` (if later), hands the endpoints the datagrams that arrive by
    /// then and runs both endpoints' timers. Sends nothing: see [`Testbed::flush`].
    pub fn advance_to(&mut self, t: Duration) {
        self.now = self.now.max(t);
        let now = self.instant();
        // stalls that are over: what waited arrives now, before anything later
        let mut waited = Vec::new();
        for stall in &mut self.stalls {
            if stall.as_ref().is_some_and(|(until, _)| *until <= self.now) {
                waited.extend(stall.take().expect("checked").1);
            }
        }
        let mut arrivals = waited.into_iter();
        loop {
            let mut a = match arrivals.next() {
                Some(a) => a,
                None => {
                    let Some(ev) = self.queue.pop_due(self.now) else {
                        break;
                    };
                    let queue = &mut self.queue;
                    let Some(a) = self.net.handle(ev, &mut |at, e| queue.schedule(at, e)) else {
                        continue;
                    };
                    a
                }
            };
            if let Some((_, held)) = &mut self.stalls[host_index(a.dir.receiver())] {
                held.push(a);
                continue;
            }
            let (ep, openers) = match a.dir.receiver() {
                HostId::A => (&mut self.client, &mut self.openers[0]),
                HostId::B => (&mut self.server, &mut self.openers[1]),
            };
            if !self.cfg.opens_outside {
                ep.handle_datagram(now, a.local, a.remote, &mut a.data);
            } else if let Some(opened) = openers.open(&mut a.data) {
                self.opened_outside += 1;
                ep.handle_opened_datagram(now, a.local, a.remote, &mut a.data, opened);
            } else {
                ep.handle_datagram(now, a.local, a.remote, &mut a.data);
                openers.learn(ep, &a.data);
            }
        }
        if !self.is_stalled(HostId::A) {
            self.client.handle_timeout(now);
        }
        if !self.is_stalled(HostId::B) {
            self.server.handle_timeout(now);
        }
    }

    /// Flushes, then moves to the next event (at most to `limit`) and flushes again. Returns
    /// false when nothing was left to happen before `limit` (the clock is then at `limit`).
    fn step(&mut self, limit: Duration, stuck: &mut u32) -> bool {
        self.flush();
        let Some(next) = self.next_event() else {
            self.now = self.now.max(limit);
            return false;
        };
        if next > limit {
            self.advance_to(limit);
            self.flush();
            return false;
        }
        if next <= self.now {
            *stuck += 1;
            assert!(
                *stuck < MAX_STEPS_WITHOUT_PROGRESS,
                "engine stuck at t={:?}: poll_timeout stays due (client {:?}, server {:?}) \
                 though handle_timeout and poll_transmit ran {} times",
                self.now,
                self.client
                    .poll_timeout()
                    .map(|t| t.saturating_duration_since(self.base)),
                self.server
                    .poll_timeout()
                    .map(|t| t.saturating_duration_since(self.base)),
                *stuck
            );
        } else {
            *stuck = 0;
        }
        self.advance_to(next);
        self.flush();
        true
    }

    /// Runs for `d` of simulated time, calling `app` before every step and once at the end.
    /// Panics if the engine stays due at one instant (a timer it never clears).
    pub fn advance(&mut self, d: Duration, mut app: impl FnMut(&mut Testbed)) {
        let limit = self.now + d;
        let mut stuck = 0;
        loop {
            app(self);
            if !self.step(limit, &mut stuck) || self.now >= limit {
                break;
            }
        }
        app(self);
        self.flush();
    }

    /// Runs until `done` returns true, calling it before every step; panics when simulated
    /// time reaches `limit`, or if the engine stays due at one instant.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Testbed) -> bool) {
        let mut stuck = 0;
        loop {
            if done(self) {
                self.flush();
                return;
            }
            self.step(limit, &mut stuck);
            assert!(
                self.now < limit,
                "simulated time limit {limit:?} reached at {:?}",
                self.now
            );
        }
    }

    /// Runs without an application for just under `span`, stopping at the last event before
    /// its end (not at the end); returns how many events (timer expiries and arrivals, each
    /// step of the clock counted once) there were.
    pub fn events_within(&mut self, span: Duration) -> usize {
        let end = self.now + span;
        let mut events = 0;
        loop {
            self.flush();
            match self.next_event() {
                Some(next) if next < end => self.advance_to(next),
                _ => return events,
            }
            events += 1;
        }
    }

    /// Completes the handshake and waits until the client has sent a short packet (so the
    /// server's connection ID is known); panics after 5 s of simulated time.
    pub fn establish(&mut self) {
        let limit = self.now + Duration::from_secs(5);
        self.run_until(limit, |s| {
            s.sh.is_some()
                && s.server_cid.is_some()
                && s.client.connection(s.ch).map(|c| c.state())
                    == Some(ConnectionState::Established)
        });
    }

    /// Runs `t` to completion, exact and with nothing lost (panics after 60 s of simulated
    /// time).
    pub fn complete_transfer(&mut self, t: &mut Transfer) {
        let limit = self.now + Duration::from_secs(60);
        self.run_until(limit, |s| {
            t.pump(s);
            t.complete(s)
        });
        assert_eq!(t.corrupted, 0);
        assert_eq!(t.lost, None);
    }

    /// Hands the server a datagram from `remote` to its `local` address, now, and flushes.
    pub fn inject(&mut self, local: SocketAddr, remote: SocketAddr, data: &[u8]) {
        let now = self.instant();
        self.server
            .handle_datagram(now, local, remote, &mut data.to_vec());
        self.flush();
    }

    /// Hands the client a datagram from `remote` to its `local` address, now, and flushes.
    pub fn inject_client(&mut self, local: SocketAddr, remote: SocketAddr, data: &[u8]) {
        let now = self.instant();
        self.client
            .handle_datagram(now, local, remote, &mut data.to_vec());
        self.flush();
    }

    /// Changes the links now, as a scenario's action would. [`Action::RestartServer`] replaces
    /// the server by a fresh endpoint (same configuration, a seed of its own), which holds no
    /// connection.
    pub fn apply(&mut self, action: Action) {
        let now = self.now;
        let queue = &mut self.queue;
        if self
            .net
            .apply(now, &action, &mut |at, e| queue.schedule(at, e))
        {
            return;
        }
        self.restarts += 1;
        let seed = derive_seed(self.cfg.seed, 0xE0_0000 + self.restarts);
        self.server = Endpoint::new(self.cfg.server_config(), seed, self.instant());
        self.sh = None;
    }

    /// Checks the memory bounds both connections must keep, whatever they are sent: buffers
    /// within twice the configured window and send buffer, at most `MAX_LINKS` links, one
    /// client connection, and at most `max_connections` on the server (1, plus one per
    /// INITIAL with a valid cookie a test may have handed it).
    pub fn check_bounds(&self, max_connections: usize) {
        assert!(
            self.server.connection_count() <= max_connections,
            "the server holds {} connections, at most {max_connections} expected",
            self.server.connection_count()
        );
        assert!(self.client.connection_count() <= 1);
        let server_cfg = (self.cfg.server_connection.as_ref()).unwrap_or(&self.cfg.connection);
        for (who, ep, h, cfg) in [
            ("server", &self.server, self.sh, server_cfg),
            ("client", &self.client, Some(self.ch), &self.cfg.connection),
        ] {
            let Some(c) = h.and_then(|h| ep.connection(h)) else {
                continue;
            };
            // each against its own configuration
            let (window, send_buffer) = (cfg.stream_receive_window, cfg.send_buffer);
            let st = c.stats();
            assert!(
                st.recv_buffered <= 2 * window,
                "{who} buffers {} received bytes, more than 2 x window {window}",
                st.recv_buffered,
            );
            assert!(
                st.send_buffered <= 2 * send_buffer,
                "{who} buffers {} bytes to send, more than 2 x send buffer {send_buffer}",
                st.send_buffered,
            );
            assert!(st.links.len() <= ri2n_proto::MAX_LINKS);
        }
    }
}

/// Every datagram `ep` wants to send at `now`, each with its path: for tests that hand
/// datagrams between endpoints themselves (in another order, or some withheld).
pub fn drain(ep: &mut Endpoint, now: Instant) -> Vec<(Transmit, Vec<u8>)> {
    let mut buf = vec![0u8; wire::MAX_DATAGRAM_SIZE];
    let mut out = Vec::new();
    while let Some(t) = ep.poll_transmit(now, &mut buf) {
        out.push((t, buf[..t.len].to_vec()));
    }
    out
}

/// Rewrites `data` into a short packet for the server connection `cid`: version, type and
/// connection ID replaced (the datagram is extended to hold a header), the link byte replaced
/// when given.
pub fn make_valid(data: &[u8], cid: u64, link: Option<u8>) -> Vec<u8> {
    let mut b = data.to_vec();
    if b.len() < wire::SHORT_HEADER_FIXED + 1 {
        b.resize(wire::SHORT_HEADER_FIXED + 1, 0);
    }
    b[0] = VERSION;
    b[1] = packet_type::SHORT;
    b[2..10].copy_from_slice(&cid.to_be_bytes());
    if let Some(l) = link {
        b[10] = l;
    }
    b
}

/// An INITIAL datagram (padded to the minimum size), as a client or an attacker sends it.
pub fn initial_packet(scid: u64, token: &[u8], mode: u8, hello: &[u8]) -> Vec<u8> {
    wire::control_packet(&wire::Header::Initial {
        scid,
        token,
        mode,
        hello,
    })
}

/// The index of `host` in per-host arrays: the client (A) first.
fn host_index(host: HostId) -> usize {
    match host {
        HostId::A => 0,
        HostId::B => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::LinkStatus;

    /// The server's buffers are held to the server's own configuration: against the
    /// client's, a server within its larger send buffer failed, and one over a smaller own
    /// bound would have passed.
    #[test]
    fn bounds_are_checked_against_each_sides_own_configuration() {
        let (small, big) = (64 << 10, 4 << 20);
        let cfg = TestbedConfig::new(1)
            .with_buffers(1 << 20, small)
            .with_server_connection(ConnectionConfig::default().with_send_buffer(big));
        let mut tb = Testbed::new(cfg);
        tb.establish();
        let sh = tb.sh.expect("accepted");
        // the server writes what its own send buffer takes; the client does not read
        let data = vec![7u8; 64 << 10];
        while tb
            .server
            .connection_mut(sh)
            .unwrap()
            .write(&data)
            .unwrap_or(0)
            > 0
        {}
        let buffered = tb.server_conn().stats().send_buffered;
        assert!(
            buffered > 2 * small,
            "premise: more than twice the client's bound"
        );
        tb.check_bounds(1);
    }

    #[test]
    fn a_message_crosses_in_one_delay_and_a_dead_link_carries_nothing() {
        let mut tb = Testbed::new(TestbedConfig::new(1));
        tb.establish();
        let sh = tb.sh.expect("accepted");
        tb.client
            .connection_mut(tb.ch)
            .unwrap()
            .send_message(b"hello")
            .unwrap();
        let sent = tb.now();
        let limit = sent + Duration::from_secs(1);
        tb.run_until(limit, |tb| {
            tb.server
                .connection_mut(sh)
                .unwrap()
                .recv_message()
                .is_ok_and(|m| m.is_some())
        });
        assert_eq!(tb.now() - sent, DEFAULT_DELAY);
        let delivered = tb.network().direction(0, Dir::AToB).counters().delivered;
        tb.apply(Action::down(0));
        tb.advance(Duration::from_millis(50), |_| {});
        let d = tb.network().direction(0, Dir::AToB).counters();
        assert_eq!(d.delivered, delivered, "nothing crossed a dead link");
        assert!(d.dropped_down > 0, "the client kept sending");
        assert_eq!(
            tb.network().direction(0, Dir::AToB).status(),
            LinkStatus::Down
        );
    }

    #[test]
    fn the_latest_captured_datagram_is_found_in_the_rolling_window() {
        let cfg = TestbedConfig::new(1).with_capture(
            Dir::AToB,
            Capture {
                keep: 2,
                rolling: 3,
            },
        );
        let mut tb = Testbed::new(cfg);
        let (a, b) = tb.config().addrs[0];
        for i in 0..9u8 {
            tb.capture(Dir::AToB, b, a, &[i]);
            assert_eq!(tb.last_captured(Dir::AToB).unwrap().bytes, [i]);
        }
        let kept: Vec<u8> = tb.captured(Dir::AToB).iter().map(|c| c.bytes[0]).collect();
        assert_eq!(kept, [0, 1, 8, 6, 7]);
    }
}
