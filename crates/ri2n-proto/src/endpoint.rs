//! The endpoint: every connection of one host process, the routing of datagrams to them by
//! connection ID, and the stateless parts of the protocol.
//!
//! Stateless means: a server answers a first INITIAL with a RETRY carrying a cookie (a keyed
//! hash of the client's address, connection ID and the time) and keeps nothing; only an INITIAL
//! that echoes a valid cookie creates a connection, so a spoofed source address costs the
//! server no memory and gets back less than it sent. Such a connection reaches the application
//! only once the client's first short packet confirms it; until then it reports nothing and
//! the endpoint forgets it on its own when it expires. A short packet for an unknown
//! connection is answered with a RESET, which is how a peer learns that we restarted. Every
//! packet finds its connection through an index (local connection ID, peer connection ID,
//! client address and ID), never by visiting connections: docs/PROTOCOL.md §11 says why.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::hash::Hasher;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use siphasher::sip::SipHasher13;
use smallvec::SmallVec;

use crate::addr::pick_local;
use crate::attention::{Attention, TimerIndex};
use crate::crypto::{Cipher, Opened, Opener, PacketProtection, ResetKind, ServerHandshake};
use crate::dropped::{DropCounts, DropReason};
use crate::transmit::SliceBuffer;
use crate::wire::{self, handshake_mode, refuse_reason, Header, Quoted};
use crate::{
    ConnectError, Connection, ConnectionConfig, ConnectionError, ConnectionHandle, ConnectionState,
    EndpointConfig, Event, KeyMismatch, Transmit, TransmitBuffer,
};

/// Most connections [`Endpoint::timeout_before`] asks for their deadline rather than
/// bringing the timer index up to date.
const ASK_AT_MOST: usize = 8;

/// Connections that may share the connection ID their client chose. A client picks a random
/// one per connection, so two alike are a rare accident; RESETs and ICMP errors are matched
/// by it, and without a cap a stranger (at an unkeyed server) opening thousands of
/// connections under one ID would make each such packet cost a walk over all of them.
const MAX_SHARING_CLIENT_ID: usize = 4;

/// Stateless answers waiting to be sent; beyond this many, new ones are dropped, so a flood
/// of junk cannot grow memory.
const MAX_STATELESS_QUEUE: usize = 64;
/// Smallest short packet answered with a RESET (a RESET is never larger than what triggered it);
/// every short packet but a CLOSE (which needs no answer) is built at least this large, so that
/// each can trigger one.
pub(crate) const MIN_RESET_TRIGGER: usize = 16;
/// RESETs an endpoint sends per second at most, and in one burst. A peer that lost its
/// connection (we restarted) needs one, and keeps sending until it gets it; a flood of short
/// packets with made-up connection IDs from spoofed sources must not cost one send per
/// datagram: the flooder would then spend our CPU, and our links, at its own rate, taken
/// from the connections we hold.
const RESETS_PER_SECOND: f64 = 1000.0;
const RESET_BURST: f64 = 100.0;
/// Refused handshakes reported to the application (to log) per second at most, and in one
/// burst; the others are only counted.
const REFUSAL_REPORTS_PER_SECOND: f64 = 1.0;
const REFUSAL_REPORT_BURST: f64 = 5.0;
/// Refused handshakes waiting for the application to collect them.
const MAX_REFUSAL_REPORTS: usize = 16;

/// A handshake the server refused: the two sides' keys differ, or the client speaks another
/// application. The server keeps no state for it; these reports are rate-limited (see
/// [`Endpoint::poll_refused_handshake`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedHandshake {
    /// Where the INITIAL came from.
    pub remote: SocketAddr,
    /// Why it was refused, seen from the server.
    pub reason: RefusalReason,
}

/// Why a server refused a handshake.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RefusalReason {
    /// The keys differ.
    #[error("authentication failed: {0}")]
    Key(KeyMismatch),
    /// The client speaks another application than this server serves.
    #[error("the client speaks {client:?}, this server serves {ours:?}")]
    WrongApplication {
        /// The application the client named.
        client: String,
        /// The application this server serves.
        ours: String,
    },
}

/// Refused handshakes kept for the application to log, rate-limited (one per second on
/// average, in bursts of five; at most sixteen waiting): a stranger sending handshakes
/// with the wrong key must not fill the log, nor memory. The TCP transport's endpoint keeps
/// its own.
#[derive(Debug)]
pub struct RefusalReports {
    waiting: VecDeque<RefusedHandshake>,
    budget: TokenBucket,
}

impl RefusalReports {
    /// None reported yet, the budget full at `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            waiting: VecDeque::new(),
            budget: TokenBucket::new(REFUSAL_REPORTS_PER_SECOND, REFUSAL_REPORT_BURST, now),
        }
    }

    /// Keeps `refused` for the application, within the rate limit; returns whether it was.
    pub fn report(&mut self, now: Instant, refused: RefusedHandshake) -> bool {
        let kept = self.waiting.len() < MAX_REFUSAL_REPORTS && self.budget.take(now);
        if kept {
            self.waiting.push_back(refused);
        }
        kept
    }

    /// The oldest report not yet taken.
    pub fn pop(&mut self) -> Option<RefusedHandshake> {
        self.waiting.pop_front()
    }
}

/// Hashes a connection ID as itself. Our IDs are random numbers we chose, so they spread
/// over the table as they are, without SipHash's cost on the lookup every datagram makes; a
/// sender chooses only which IDs to look up, never which are stored, so it cannot crowd a
/// bucket.
#[derive(Default)]
pub(crate) struct CidHasher(u64);

impl Hasher for CidHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// All connections of one host process.
#[derive(Debug)]
pub struct Endpoint {
    cfg: EndpointConfig,
    rng: ChaCha8Rng,
    /// Identifies this run of the endpoint; a peer seeing it change knows we restarted.
    instance: u64,
    cookie_key: (u64, u64),
    epoch: Instant,
    connections: BTreeMap<ConnectionHandle, Connection>,
    by_cid: HashMap<u64, ConnectionHandle, BuildHasherDefault<CidHasher>>,
    /// Connections by the connection ID their peer chose (known from the handshake on): how a
    /// RESET or an ICMP error, which name the peer's ID, find theirs. Peers choose these, so
    /// they may repeat across connections, and they are hashed with SipHash.
    by_peer_cid: HashMap<u64, SmallVec<[ConnectionHandle; 1]>>,
    /// Server side: (client address, client connection ID) of connections being set up, so a
    /// repeated INITIAL finds its connection.
    by_initial: HashMap<(SocketAddr, u64), ConnectionHandle>,
    next_handle: u64,
    stateless: VecDeque<(SocketAddr, SocketAddr, Vec<u8>)>,
    accept_queue: VecDeque<ConnectionHandle>,
    /// The connections something happened to (a datagram, a timer, an application call):
    /// `poll_transmit` visits only those that may have something to send, `poll_event` only
    /// those that may have an event, and `poll_timeout` recomputes only their deadlines, so
    /// these costs do not grow with the connections that are idle.
    attention: Attention,
    /// Every connection's next deadline, as of its last refresh.
    timers: TimerIndex,
    /// Round-robin position of `poll_transmit` among the ready connections.
    cursor: u64,
    /// Datagrams dropped without effect, by reason.
    dropped: DropCounts,
    /// Refused handshakes for the application to log.
    refusals: RefusalReports,
    /// The client address each open server connection is counted under in
    /// [`EndpointConfig::connection_counts`], until it closes or goes.
    counted: HashMap<ConnectionHandle, IpAddr>,
    /// Connections that ended cleanly and that the application let go of, oldest first, with
    /// the instant each is forgotten: kept so that a peer that missed their last
    /// acknowledgements is still told that everything it sent arrived (PROTOCOL.md §8.2),
    /// as TCP keeps a closed connection in TIME-WAIT. They count against no limit of the
    /// live connections, and have one of their own ([`Self::release`]).
    released: VecDeque<(Instant, ConnectionHandle)>,
}

/// The connections of an endpoint whose driver runs several engines (shards), counted for
/// all of them, so that its limits
/// ([`max_connections`](crate::EndpointConfig::max_connections),
/// [`max_connections_per_address`](crate::EndpointConfig::max_connections_per_address)) hold
/// for the endpoint as a whole: every connection held, and the open server connections per
/// client IP address (each under the address of its handshake, until it closes).
///
/// The rate limits of what a flood can make the endpoint do are kept here too, for the same
/// reason: RESETs and REFUSEs sent, and keyed handshake messages read. Per shard, a flood
/// spread over connection IDs (or client addresses) drew on every shard's.
#[derive(Debug, Default)]
pub struct ConnectionCounts {
    held: std::sync::atomic::AtomicUsize,
    /// Connections released after a clean end and kept to confirm it ([`Endpoint::release`]).
    lingering: std::sync::atomic::AtomicUsize,
    open_by_address: std::sync::Mutex<HashMap<IpAddr, usize>>,
    limits: std::sync::Mutex<SharedLimits>,
}

/// Adds one to `counter` unless it is at `limit` already; whether it did.
fn count_below(counter: &std::sync::atomic::AtomicUsize, limit: usize) -> bool {
    use std::sync::atomic::Ordering;
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < limit).then_some(n + 1)
        })
        .is_ok()
}

/// The endpoint-wide rate limits of [`ConnectionCounts`], each made at its first use.
#[derive(Debug, Default)]
struct SharedLimits {
    resets: Option<TokenBucket>,
    handshakes: Option<TokenBucket>,
}

impl ConnectionCounts {
    fn limits(&self) -> std::sync::MutexGuard<'_, SharedLimits> {
        self.limits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the endpoint may send one more RESET (or REFUSE) now.
    fn take_reset(&self, now: Instant) -> bool {
        (self.limits().resets)
            .get_or_insert_with(|| TokenBucket::new(RESETS_PER_SECOND, RESET_BURST, now))
            .take(now)
    }

    /// Whether the endpoint may read one more keyed handshake message now, at most `rate`
    /// per second in bursts of a fiftieth of that.
    fn take_handshake(&self, rate: u32, now: Instant) -> bool {
        let rate = f64::from(rate.max(1));
        (self.limits().handshakes)
            .get_or_insert_with(|| TokenBucket::new(rate, (rate / 50.0).max(1.0), now))
            .take(now)
    }

    fn by_address(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        (self.open_by_address.lock()).unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one more connection held, unless `limit` are held already.
    fn try_hold(&self, limit: usize) -> bool {
        count_below(&self.held, limit)
    }

    fn hold(&self) {
        (self.held).fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    fn release(&self) {
        (self.held).fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Counts one more connection kept after its release, unless `limit` are kept already.
    fn try_linger(&self, limit: usize) -> bool {
        count_below(&self.lingering, limit)
    }

    fn end_linger(&self) {
        (self.lingering).fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Counts one more open connection from `ip`, unless `limit` are counted already.
    fn try_open(&self, ip: IpAddr, limit: usize) -> bool {
        let mut counts = self.by_address();
        let n = counts.entry(ip).or_default();
        if *n >= limit {
            return false;
        }
        *n += 1;
        true
    }

    fn close(&self, ip: IpAddr) {
        let mut counts = self.by_address();
        if let Some(n) = counts.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&ip);
            }
        }
    }
}

/// A token bucket: `rate` tokens per second, holding at most `burst`.
#[derive(Debug)]
struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    fn new(rate: f64, burst: f64, now: Instant) -> Self {
        Self {
            rate,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes a token if there is one.
    fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = self.last.max(now);
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}

impl Endpoint {
    /// A new endpoint whose random numbers (connection IDs, instance, cookie key) come from
    /// a 64-bit `seed`: runs repeat exactly (the simulator, tests). A real driver uses
    /// [`from_seed`](Self::from_seed).
    pub fn new(cfg: EndpointConfig, seed: u64, now: Instant) -> Self {
        Self::with_rng(cfg, ChaCha8Rng::seed_from_u64(seed), now)
    }

    /// A new endpoint whose random numbers come from 32 bytes of the operating system's
    /// random source: its cookie key (§4.2) is then as hard to guess as its 128 bits, which
    /// a 64-bit seed would not make it.
    pub fn from_seed(cfg: EndpointConfig, seed: [u8; 32], now: Instant) -> Self {
        Self::with_rng(cfg, ChaCha8Rng::from_seed(seed), now)
    }

    fn with_rng(mut cfg: EndpointConfig, mut rng: ChaCha8Rng, now: Instant) -> Self {
        // counted alone as with other shards: per client address in a map, not by a walk
        // over every connection at each INITIAL, and under its handshake's address only (the
        // links a peer opens from other addresses must not count against those)
        cfg.connection_counts.get_or_insert_with(Default::default);
        // The shards of one endpoint share its instance and cookie key (peers and clients
        // holding a cookie see one endpoint): drawn first, from the common seed. Their other
        // random numbers come from a stream of each shard's own.
        let instance = rng.gen();
        let cookie_key = (rng.gen(), rng.gen());
        if cfg.shard.index > 0 {
            rng.set_stream(u64::from(cfg.shard.index));
        }
        Self {
            instance,
            cookie_key,
            rng,
            cfg,
            epoch: now,
            connections: BTreeMap::new(),
            by_cid: HashMap::default(),
            by_peer_cid: HashMap::new(),
            by_initial: HashMap::new(),
            next_handle: 0,
            stateless: VecDeque::new(),
            refusals: RefusalReports::new(now),
            accept_queue: VecDeque::new(),
            counted: HashMap::new(),
            released: VecDeque::new(),
            attention: Attention::default(),
            timers: TimerIndex::default(),
            cursor: 0,
            dropped: DropCounts::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    fn new_cid(&mut self) -> u64 {
        loop {
            let cid = self.cfg.shard.claim(self.rng.gen());
            if cid != 0 && !self.by_cid.contains_key(&cid) {
                return cid;
            }
        }
    }

    fn insert(&mut self, cid: u64, conn: Connection) -> ConnectionHandle {
        let h = ConnectionHandle(self.next_handle);
        self.next_handle += 1;
        self.by_cid.insert(cid, h);
        if conn.peer_cid() != 0 {
            self.by_peer_cid.entry(conn.peer_cid()).or_default().push(h);
        }
        self.connections.insert(h, conn);
        self.attention.touch(h);
        h
    }

    /// Removes connection `h` and every trace of it in the indexes.
    fn remove(&mut self, h: ConnectionHandle) {
        let Some(mut c) = self.connections.remove(&h) else {
            return;
        };
        self.uncount(h);
        if let Some(counts) = &self.cfg.connection_counts {
            // a released connection stopped counting as held when it was released
            match c.released {
                true => counts.end_linger(),
                false => counts.release(),
            }
        }
        self.timers.set(h, &mut c.indexed_deadline, None);
        self.timers
            .set_traffic(h, &mut c.indexed_traffic_deadline, None);
        self.attention.forget(h);
        self.by_cid.remove(&c.local_cid());
        if let Some(hs) = self.by_peer_cid.get_mut(&c.peer_cid()) {
            hs.retain(|x| *x != h);
            if hs.is_empty() {
                self.by_peer_cid.remove(&c.peer_cid());
            }
        }
        let initial = (c.handshake_path().1, c.peer_cid());
        if self.by_initial.get(&initial) == Some(&h) {
            self.by_initial.remove(&initial);
        }
    }

    /// Whether a connection of this endpoint that talks to `remote` goes by connection ID
    /// `cid`: its peer's, or its own while it connects. These are the connections a RESET
    /// from `remote` (or an ICMP error quoting a packet to it) may be for; a driver with
    /// several shards asks each in turn ([`wire::Steering::Ask`]). Not the ID alone: a
    /// stranger may open connections under another client's ID on other shards, and the
    /// first shard asked would keep what was meant for the next.
    pub fn has_connection_with(&self, cid: u64, remote: SocketAddr) -> bool {
        let connecting = (self.by_cid.get(&cid))
            .filter(|h| self.connections[*h].is_connecting_as(cid))
            .into_iter();
        connecting
            .chain(self.with_peer_cid(cid))
            .any(|h| self.connections[h].has_remote(remote))
    }

    /// Whether `datagram`, from `remote`, is a client's INITIAL with a cookie this endpoint
    /// (or any shard of it: they share the cookie key) issued to that address and still
    /// honours: one that may make a connection. A driver with several shards places only
    /// these on a shard of their own (a first INITIAL draws its RETRY, stateless, where it
    /// landed), so INITIALs nobody answered cannot push real ones out of its record.
    pub fn initial_with_cookie(&self, now: Instant, remote: SocketAddr, datagram: &[u8]) -> bool {
        matches!(
            wire::decode_packet(datagram),
            Ok((Header::Initial { scid, token, .. }, _)) if self.cookie_valid(now, remote, scid, token)
        )
    }

    /// What this engine shares with the other shards of its endpoint (its own alone
    /// without shards).
    fn counts(&self) -> &ConnectionCounts {
        (self.cfg.connection_counts.as_deref()).expect("set by Endpoint::new")
    }

    /// Connections whose peer chose connection ID `cid`.
    fn with_peer_cid(&self, cid: u64) -> &[ConnectionHandle] {
        self.by_peer_cid.get(&cid).map_or(&[], |hs| &hs[..])
    }

    /// A server connection the client has just confirmed: other connections to the same
    /// client address from another run of its endpoint are dead (docs/PROTOCOL.md §8.4), and
    /// this one goes to the application. Only now: a confirmed client has proven that it
    /// holds this handshake's secrets (with a key) and received our ACCEPT, which no replay
    /// of an old INITIAL can (§11).
    fn on_confirmed(&mut self, h: ConnectionHandle) {
        let Some(c) = self.connections.get(&h) else {
            return;
        };
        let (remote, instance) = (c.handshake_path().1, c.peer_instance());
        let mut forget = SmallVec::<[ConnectionHandle; 1]>::new();
        for (&other, c) in self.connections.iter_mut() {
            if other != h
                && c.state() != ConnectionState::Closed
                && c.state() != ConnectionState::Connecting
                && c.peer_instance() != instance
                && c.has_proven_remote(remote)
            {
                c.peer_restarted();
                self.attention.touch(other);
                if c.is_unconfirmed_server() {
                    forget.push(other); // the application never had it
                }
            }
        }
        for other in forget {
            self.remove(other);
        }
        self.accept_queue.push_back(h);
    }

    /// Starts a connection to a peer given one or more of its addresses. The handshake goes
    /// to the first and, while that one does not answer, to the others in turn
    /// (docs/PROTOCOL.md §4.1); with more than one, a link is opened to each (up to the
    /// connection's `max_links`), else (unless discovery is off) to each address the server
    /// announces.
    pub fn connect(
        &mut self,
        now: Instant,
        remotes: &[SocketAddr],
        config: ConnectionConfig,
    ) -> Result<ConnectionHandle, ConnectError> {
        config.validate()?;
        // any number of addresses: the handshake may take each, and links are opened to
        // the first `MAX_LINKS` that answer (as to a server's announced ones)
        let first = *remotes.first().ok_or(ConnectError::NoRemoteAddress)?;
        let fallback = self
            .cfg
            .local_addrs
            .iter()
            .copied()
            .find(|a| a.is_ipv4() == first.is_ipv4())
            .ok_or(ConnectError::NoLocalAddress(first))?;
        let local = pick_local(&self.cfg.local_addrs, first, fallback).unwrap_or(fallback);
        // the pairs the handshake may take: each given address with the local address a
        // link to it would have (docs/PROTOCOL.md §4.5)
        let mut paths = vec![(local, first)];
        for &remote in &remotes[1..] {
            if let Some(l) = pick_local(&self.cfg.local_addrs, remote, local) {
                if !paths.contains(&(l, remote)) {
                    paths.push((l, remote));
                }
            }
        }
        let cid = self.new_cid();
        let conn = Connection::new_client(
            config,
            now,
            cid,
            self.instance,
            &paths,
            remotes.to_vec(),
            self.cfg.local_max_datagram.clone(),
            self.cfg.key.as_ref(),
        );
        if let Some(counts) = &self.cfg.connection_counts {
            counts.hold();
        }
        Ok(self.insert(cid, conn))
    }

    fn cookie_mac(&self, remote: SocketAddr, scid: u64, issued_ms: u64) -> u64 {
        let mut h = SipHasher13::new_with_keys(self.cookie_key.0, self.cookie_key.1);
        match remote.ip() {
            std::net::IpAddr::V4(ip) => h.write(&ip.octets()),
            std::net::IpAddr::V6(ip) => h.write(&ip.octets()),
        }
        h.write_u16(remote.port());
        h.write_u64(scid);
        h.write_u64(issued_ms);
        h.finish()
    }

    fn make_cookie(&self, now: Instant, remote: SocketAddr, scid: u64) -> [u8; 16] {
        let issued = (now - self.epoch).as_millis() as u64;
        let mut token = [0u8; 16];
        token[..8].copy_from_slice(&issued.to_be_bytes());
        token[8..].copy_from_slice(&self.cookie_mac(remote, scid, issued).to_be_bytes());
        token
    }

    fn cookie_valid(&self, now: Instant, remote: SocketAddr, scid: u64, token: &[u8]) -> bool {
        let Ok(token) = <&[u8; 16]>::try_from(token) else {
            return false;
        };
        let issued = u64::from_be_bytes(token[..8].try_into().unwrap());
        let mac = u64::from_be_bytes(token[8..].try_into().unwrap());
        let now_ms = (now - self.epoch).as_millis() as u64;
        now_ms >= issued
            && now_ms - issued <= self.cfg.cookie_lifetime.as_millis() as u64
            && mac == self.cookie_mac(remote, scid, issued)
    }

    fn queue_stateless(&mut self, local: SocketAddr, remote: SocketAddr, header: &Header<'_>) {
        if self.stateless.len() >= MAX_STATELESS_QUEUE {
            return;
        }
        self.stateless
            .push_back((local, remote, wire::control_packet(header)));
    }

    /// Handles one received datagram that travelled from `remote` to our `local` address.
    /// Anything malformed, corrupted, forged or unexpected is dropped without effect. A sealed
    /// packet is opened in place, so `data` is changed.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        data: &mut [u8],
    ) {
        let len = data.len();
        if let Err(reason) = self.handle_datagram_inner(now, local, remote, data, None) {
            self.dropped.record(reason, remote, len);
        }
    }

    /// Handles a datagram an [`Opener`] already opened (`opened` is its proof), as
    /// [`Self::handle_datagram`] handles one it opens itself. A driver opens what it received
    /// before it takes the lock around the engine, so opening runs in parallel with the
    /// engine's work for other threads.
    pub fn handle_opened_datagram(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        data: &mut [u8],
        opened: Opened,
    ) {
        let len = data.len();
        if let Err(reason) = self.handle_datagram_inner(now, local, remote, data, Some(&opened)) {
            self.dropped.record(reason, remote, len);
        }
    }

    /// What opens connection `cid`'s packets outside the engine, for
    /// [`Self::handle_opened_datagram`]; `None` while there is none to give (no such
    /// connection, or its handshake is not done). Ask again when a packet of the connection
    /// arrives that the opener did not open: the peer may have moved to its next key.
    pub fn opener(&self, cid: u64) -> Option<Opener> {
        let conn = &self.connections[self.by_cid.get(&cid)?];
        if conn.state() == ConnectionState::Connecting {
            return None;
        }
        match conn.protection() {
            Some(p) => Some(Opener::new(cid, Some(p.opening_key()))),
            None if self.cfg.key.is_none() => Some(Opener::new(cid, None)),
            None => None,
        }
    }

    /// Datagrams dropped without effect so far, by reason.
    pub fn dropped(&self) -> &DropCounts {
        &self.dropped
    }

    fn handle_datagram_inner(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        data: &mut [u8],
        opened: Option<&Opened>,
    ) -> Result<(), DropReason> {
        let Ok((header, rest)) = wire::decode_packet(data) else {
            return Err(DropReason::Undecodable);
        };
        let header_len = data.len() - rest.len();
        match header {
            Header::Short {
                dcid,
                link,
                pn,
                phase,
            } => match self.by_cid.get(&dcid) {
                _ if opened.is_some_and(|o| !o.is_for(dcid, link, pn)) => {
                    Err(DropReason::Unauthenticated)
                }
                Some(&h) => {
                    self.attention.touch(h);
                    let conn = self.connections.get_mut(&h).expect("mapped handle");
                    let r = conn.handle_short(
                        now, local, remote, link, pn, phase, header_len, data, opened,
                    );
                    if conn.take_confirmed() {
                        self.on_confirmed(h);
                    } else if conn.state() == ConnectionState::Closed
                        && conn.is_unconfirmed_server()
                    {
                        // ended before the client confirmed it (a frame it may not send): the
                        // application never had it, and a closed connection's handshake never
                        // expires, so nothing else would free it
                        self.remove(h);
                    }
                    r
                }
                None => {
                    self.queue_reset(now, local, remote, dcid, ResetKind::Unknown, data.len());
                    Err(DropReason::UnknownConnection)
                }
            },
            _ if opened.is_some() => Err(DropReason::Unauthenticated),
            control => self.handle_control_packet(now, local, remote, control),
        }
    }

    /// A packet of the handshake or a RESET. Kept out of line: opening a connection builds
    /// one on the stack, which inlined into [`Self::handle_datagram`] made every data packet
    /// reserve (and probe) several kilobytes of stack.
    #[inline(never)]
    fn handle_control_packet(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        header: Header<'_>,
    ) -> Result<(), DropReason> {
        match header {
            Header::Short { .. } => unreachable!("short packets are handled by the caller"),
            Header::Initial {
                scid,
                token,
                mode,
                hello,
            } => self.handle_initial(now, local, remote, scid, token, mode, hello),
            Header::Retry { dcid, token } => {
                self.client_conn(dcid, remote, true)
                    .ok_or(DropReason::UnexpectedHandshake)?
                    .handle_retry(now, remote, token);
                Ok(())
            }
            Header::Accept { dcid, mode, hello } => {
                let locals = self.cfg.local_addrs.clone();
                let h = *self
                    .by_cid
                    .get(&dcid)
                    .ok_or(DropReason::UnexpectedHandshake)?;
                let conn = self
                    .client_conn(dcid, remote, false)
                    .ok_or(DropReason::UnexpectedHandshake)?;
                conn.handle_accept(now, mode, hello, &locals)?;
                let peer_cid = conn.peer_cid();
                self.by_peer_cid.entry(peer_cid).or_default().push(h);
                Ok(())
            }
            Header::Refuse {
                dcid,
                reason,
                detail,
            } => {
                let conn = self
                    .client_conn(dcid, remote, true)
                    .ok_or(DropReason::UnexpectedHandshake)?;
                let e = match reason {
                    refuse_reason::WRONG_KEY => ConnectionError::KeyMismatch(KeyMismatch::WrongKey),
                    refuse_reason::KEY_REQUIRED => {
                        ConnectionError::KeyMismatch(KeyMismatch::KeyRequired)
                    }
                    refuse_reason::NO_KEY => ConnectionError::KeyMismatch(KeyMismatch::NoKey),
                    refuse_reason::NOT_ACCEPTING => ConnectionError::NotAccepting,
                    refuse_reason::WRONG_APPLICATION => ConnectionError::WrongApplication {
                        ours: conn.application().unwrap_or_default().to_owned(),
                        theirs: String::from_utf8_lossy(detail).into_owned(),
                    },
                    _ => return Err(DropReason::Undecodable),
                };
                conn.refused_by_server(remote, e);
                Ok(())
            }
            Header::Reset { dcid, token } => self.handle_reset(local, remote, dcid, token),
        }
    }

    /// A RESET: the peer at `remote` no longer knows the connection with peer connection ID
    /// `dcid` (it restarted), or refuses the connection a client of ours is opening with
    /// its own ID `dcid` (the server is full). It counts only from an address the connection
    /// talks to and, at a keyed endpoint, with the token of its ID and of this very pair of
    /// addresses (docs/PROTOCOL.md §9.6).
    fn handle_reset(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        dcid: u64,
        token: Option<&[u8]>,
    ) -> Result<(), DropReason> {
        if dcid == 0 {
            return Err(DropReason::UnknownConnection);
        }
        // a client's own connection ID: only a refusal of its INITIAL counts (with a key, the
        // token says which: §9.6); the peer's ID: the peer no longer has the connection
        let connecting = self
            .by_cid
            .get(&dcid)
            .copied()
            .filter(|h| self.connections[h].is_connecting_as(dcid))
            .map(|h| (h, ResetKind::Refusal));
        // IDs are the peers' choice and may collide: the RESET is for the first candidate
        // talking to `remote` whose token it carries, not merely the first one
        let authentic = |h: &ConnectionHandle, kind: ResetKind| {
            !self.connections[h].is_keyed() || {
                let key = self.cfg.key.as_ref().expect("keyed connections need a key");
                token.is_some_and(|t| key.reset_token_valid(kind, dcid, remote, local, t))
            }
        };
        let mut candidates = connecting
            .into_iter()
            .chain((self.with_peer_cid(dcid).iter()).map(|&h| (h, ResetKind::Unknown)))
            .filter(|(h, _)| self.connections[h].has_remote(remote))
            .peekable();
        if candidates.peek().is_none() {
            return Err(DropReason::UnknownConnection);
        }
        let (h, _) = candidates
            .find(|(h, kind)| authentic(h, *kind))
            .ok_or(DropReason::Unauthenticated)?;
        let conn = self.connections.get_mut(&h).expect("indexed handle");
        if conn.state() == ConnectionState::Connecting {
            conn.refused_by_server(remote, ConnectionError::ServerFull);
        } else if conn.heard_from(remote) {
            conn.peer_restarted();
        } else {
            // an address the peer never answered from: another endpoint's (a given address
            // that is not the peer's), which knows nothing of the connection
            return Err(DropReason::UnknownLink);
        }
        self.attention.touch(h);
        if conn.is_unconfirmed_server() {
            self.remove(h);
        }
        Ok(())
    }

    /// Answers a packet for connection ID `dcid`, which this endpoint does not have (or
    /// refuses to open), with a RESET: within the RESET budget, and never larger than what
    /// triggered it. A keyed endpoint authenticates it with the token of the cluster key.
    fn queue_reset(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        dcid: u64,
        kind: ResetKind,
        trigger_len: usize,
    ) {
        // size and budget first: the token costs a keyed hash, which a flood of made-up
        // connection IDs must not get for nothing
        let blank = [0u8; crate::crypto::RESET_TOKEN_LEN];
        let len = wire::control_packet_len(&Header::Reset {
            dcid,
            token: self.cfg.key.is_some().then_some(&blank[..]),
        });
        if trigger_len < MIN_RESET_TRIGGER.max(len) || !self.counts().take_reset(now) {
            return;
        }
        let token = (self.cfg.key.as_ref()).map(|k| k.reset_token(kind, dcid, local, remote));
        let reset = Header::Reset {
            dcid,
            token: token.as_ref().map(|t| &t[..]),
        };
        self.queue_stateless(local, remote, &reset);
    }

    /// The operating system refused to send from `local` to `remote` (`ENETUNREACH`,
    /// `EHOSTUNREACH`, `EADDRNOTAVAIL`, …): every link over that pair is down now, without
    /// waiting for timeouts.
    pub fn handle_unreachable(&mut self, now: Instant, local: SocketAddr, remote: SocketAddr) {
        for (&h, c) in self.connections.iter_mut() {
            if c.has_remote(remote) {
                c.link_unreachable(now, local, remote);
                self.attention.touch(h);
            }
        }
    }

    /// The operating system refused to send datagrams of `size` bytes from `local` to
    /// `remote` as larger than the interface takes (`EMSGSIZE`). A size above a link's base is
    /// the path MTU search's to handle (the datagram counts as lost, PROTOCOL.md §6.8); at or
    /// below it, no datagram of full size leaves over that pair at all (the interface's MTU
    /// was lowered under a running link): the link is down until its padded probes get
    /// through again.
    pub fn handle_too_big(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        size: usize,
    ) {
        for (&h, c) in self.connections.iter_mut() {
            if c.has_remote(remote) && c.link_too_big(now, local, remote, size) {
                self.attention.touch(h);
            }
        }
    }

    /// The peer's host answered a datagram from `local` to `remote` with "port unreachable"
    /// (ICMP type 3 code 3, ICMPv6 type 1 code 4): nothing listens there. `quote` is what the
    /// ICMP message quotes of that datagram (the start of the UDP payload). ICMP is not
    /// authenticated, so it is believed only as far as it proves: it must quote a packet a
    /// connection sent on that very path (its peer's connection ID, link and a packet number
    /// it used, or a client's INITIAL), which an attacker off the path cannot guess; and
    /// then it only makes the connection ask its peer whether it is still there. A connection
    /// whose peer stays silent ends with [`crate::ConnectionError::PeerGone`], instead of
    /// waiting as if the network were down; a handshake after three refusals
    /// (docs/PROTOCOL.md §6.7). Returns whether the report matched a connection.
    pub fn handle_port_unreachable(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        quote: &[u8],
    ) -> bool {
        let found = match wire::decode_quoted(quote) {
            Some(Quoted::Short { dcid, link, pn }) => {
                self.with_peer_cid(dcid).iter().find_map(|&h| {
                    let i = self.connections[&h].link_that_sent(local, remote, link, pn)?;
                    Some((h, i))
                })
            }
            Some(Quoted::Initial { scid }) => {
                let h = self.by_cid.get(&scid).copied();
                let refused = h.and_then(|h| {
                    let c = self.connections.get_mut(&h)?;
                    (c.is_connecting_as(scid) && c.initial_refused(local, remote)).then_some(h)
                });
                if let Some(h) = refused {
                    self.attention.touch(h);
                    return true;
                }
                None
            }
            None => None,
        };
        let Some((h, i)) = found else {
            tracing::debug!(%local, %remote, "port unreachable quoting no packet of ours: ignored");
            self.dropped
                .record(DropReason::UnmatchedRefusal, remote, quote.len());
            return false;
        };
        if let Some(c) = self.connections.get_mut(&h) {
            c.port_unreachable(now, i);
            self.attention.touch(h);
        }
        true
    }

    /// A connecting client connection, if `remote` is where its handshake went: link 0's
    /// address, or for an answer any INITIAL may draw (`any_initial`: a RETRY, a REFUSE),
    /// any address its INITIALs went to while it holds no cookie.
    fn client_conn(
        &mut self,
        cid: u64,
        remote: SocketAddr,
        any_initial: bool,
    ) -> Option<&mut Connection> {
        let h = *self.by_cid.get(&cid)?;
        let conn = self.connections.get_mut(&h).filter(|c| {
            c.state() == ConnectionState::Connecting
                && match any_initial {
                    true => c.answers_initial_from(remote),
                    false => c.has_remote(remote),
                }
        })?;
        self.attention.touch(h);
        Some(conn)
    }

    #[allow(clippy::too_many_arguments)]
    fn handle_initial(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        scid: u64,
        token: &[u8],
        mode: u8,
        hello: &[u8],
    ) -> Result<(), DropReason> {
        if scid == 0 {
            return Err(DropReason::UnexpectedHandshake);
        }
        if !self.cfg.accept_incoming {
            // said at once, so the client does not wait out its handshake timeout; the
            // REFUSE is far smaller than the INITIAL and within the RESET budget
            if self.counts().take_reset(now) {
                let refuse = Header::Refuse {
                    dcid: scid,
                    reason: refuse_reason::NOT_ACCEPTING,
                    detail: &[],
                };
                self.queue_stateless(local, remote, &refuse);
            }
            return Err(DropReason::UnexpectedHandshake);
        }
        if let Some(&h) = self.by_initial.get(&(remote, scid)) {
            if let Some(c) = self.connections.get_mut(&h) {
                c.handle_initial_again();
                self.attention.touch(h);
                return Ok(());
            }
        }
        if !self.cookie_valid(now, remote, scid, token) {
            let cookie = self.make_cookie(now, remote, scid);
            self.queue_stateless(
                local,
                remote,
                &Header::Retry {
                    dcid: scid,
                    token: &cookie,
                },
            );
            return Ok(());
        }
        // A client sends its hello with the cookie only: with a key, its Noise message is
        // bound to that cookie, so it is fresh and from the address the cookie names.
        if hello.is_empty() {
            return Err(DropReason::Undecodable);
        }
        // The client's parameters: in clear, or read from its Noise message under our key.
        let (params, noise) = match (&self.cfg.key, mode) {
            (None, handshake_mode::PLAIN) => (wire::ClientParams::decode(hello), None),
            (Some(key), handshake_mode::NOISE_NNPSK0) => {
                // reading it is the costly part of a stranger's INITIAL: within the budget only
                let rate = self.cfg.max_keyed_handshakes_per_second;
                if !rate.is_none_or(|r| self.counts().take_handshake(r, now)) {
                    return Err(DropReason::HandshakeBudget);
                }
                match ServerHandshake::read(key, scid, token, hello) {
                    Ok((noise, payload)) => (wire::ClientParams::decode(&payload), Some(noise)),
                    Err(_) => {
                        return self.refuse_key(now, local, remote, scid, KeyMismatch::WrongKey)
                    }
                }
            }
            (Some(_), handshake_mode::PLAIN) => {
                return self.refuse_key(now, local, remote, scid, KeyMismatch::NoKey)
            }
            (None, handshake_mode::NOISE_NNPSK0) => {
                return self.refuse_key(now, local, remote, scid, KeyMismatch::KeyRequired)
            }
            _ => return Err(DropReason::Undecodable),
        };
        let params = params.map_err(|_| DropReason::Undecodable)?;
        if let Some(ours) = &self.cfg.server_connection.application {
            if !params.application.is_empty() && params.application != ours.as_bytes() {
                let reason = RefusalReason::WrongApplication {
                    client: String::from_utf8_lossy(&params.application).into_owned(),
                    ours: ours.clone(),
                };
                return self.refuse(now, local, remote, scid, reason);
            }
        }
        // (whether this is a new run of a peer we have connections with is decided when the
        // client confirms: until then this may be a replay, see `on_confirmed`)
        let limit = if self.with_peer_cid(scid).len() >= MAX_SHARING_CLIENT_ID {
            Some("connections under one client connection ID")
        } else {
            self.connection_limit_reached(remote)
        };
        if let Some(limit) = limit {
            // the client proved its address (the cookie), so a RESET to it amplifies nothing;
            // it tells the client at once instead of letting it wait out its handshake
            tracing::debug!(%remote, limit, "connection refused");
            self.queue_reset(now, local, remote, scid, ResetKind::Refusal, usize::MAX);
            return Err(DropReason::ConnectionLimit);
        }
        let cid = self.new_cid();
        let advertised = if self.cfg.advertised_addrs.is_empty() {
            self.cfg.local_addrs.clone()
        } else {
            self.cfg.advertised_addrs.clone()
        };
        // the address the client used goes first, so link 0 matches on both sides
        let mut advertised: Vec<SocketAddr> =
            advertised.into_iter().filter(|&a| a != local).collect();
        advertised.insert(0, local);
        let cipher = Cipher::agree(Cipher::from_code(params.cipher), Cipher::preferred());
        let server_params = wire::ServerParams {
            scid: cid,
            instance: self.instance,
            window: self.cfg.server_connection.stream_receive_window,
            cipher: cipher.code(),
            accepts: self.cfg.server_connection.accepts(),
            addrs: advertised,
        }
        .encode();
        let (mode, hello, protection) = match noise {
            Some(noise) => {
                let (msg, secrets) = noise.answer(&server_params);
                let protection = PacketProtection::new(cipher, secrets, false, now);
                (handshake_mode::NOISE_NNPSK0, msg, Some(protection))
            }
            None => (handshake_mode::PLAIN, server_params, None),
        };
        let accept = Header::Accept {
            dcid: scid,
            mode,
            hello: &hello,
        };
        let mut datagram = vec![0u8; wire::control_packet_len(&accept)];
        wire::encode_control_packet(&accept, &mut datagram);
        let conn = Connection::new_server(
            self.cfg.server_connection.clone(),
            now,
            cid,
            scid,
            &params,
            local,
            remote,
            datagram,
            protection,
            self.cfg.local_max_datagram.clone(),
        );
        let h = self.insert(cid, conn);
        self.by_initial.insert((remote, scid), h);
        // counted by `connection_limit_reached`
        self.counted.insert(h, remote.ip());
        Ok(())
    }

    /// Connection `h` closed or went: it no longer counts under its client's address.
    fn uncount(&mut self, h: ConnectionHandle) {
        if let (Some(ip), Some(counts)) = (self.counted.remove(&h), &self.cfg.connection_counts) {
            counts.close(ip);
        }
    }

    /// Refuses a handshake whose keys do not match ([`Self::refuse`]).
    fn refuse_key(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        scid: u64,
        mismatch: KeyMismatch,
    ) -> Result<(), DropReason> {
        self.refuse(now, local, remote, scid, RefusalReason::Key(mismatch))
    }

    /// Refuses a handshake: a REFUSE to the client (which proved its address with the cookie,
    /// and the REFUSE is far smaller than the INITIAL), within the RESET budget, and a report
    /// for the application to log, rate-limited. No state is kept.
    fn refuse(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        scid: u64,
        reason: RefusalReason,
    ) -> Result<(), DropReason> {
        let (code, detail, dropped) = match &reason {
            RefusalReason::Key(KeyMismatch::WrongKey) => {
                (refuse_reason::WRONG_KEY, &[][..], DropReason::KeyMismatch)
            }
            // seen from the client: the server requires a key, or has none
            RefusalReason::Key(KeyMismatch::NoKey) => (
                refuse_reason::KEY_REQUIRED,
                &[][..],
                DropReason::KeyMismatch,
            ),
            RefusalReason::Key(KeyMismatch::KeyRequired) => {
                (refuse_reason::NO_KEY, &[][..], DropReason::KeyMismatch)
            }
            RefusalReason::WrongApplication { ours, .. } => (
                refuse_reason::WRONG_APPLICATION,
                ours.as_bytes(),
                DropReason::WrongApplication,
            ),
        };
        if self.counts().take_reset(now) {
            let refuse = Header::Refuse {
                dcid: scid,
                reason: code,
                detail,
            };
            self.queue_stateless(local, remote, &refuse);
        }
        tracing::debug!(%remote, %reason, "handshake refused");
        self.refusals
            .report(now, RefusedHandshake { remote, reason });
        Err(dropped)
    }

    /// The next handshake refused (the keys differ, or the client speaks another
    /// application), for the application to log: at most one per second on average (bursts
    /// of 5); the others are counted in [`dropped`](Self::dropped) as
    /// [`DropReason::KeyMismatch`] or [`DropReason::WrongApplication`].
    pub fn poll_refused_handshake(&mut self) -> Option<RefusedHandshake> {
        self.refusals.pop()
    }

    /// The next datagram to send, written into `buf` (at least `max_datagram_size` bytes, and
    /// 1200 for a client's first packets). Call until it returns `None`.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let mut out = SliceBuffer { buf, built: None };
        self.poll_transmit_into(now, &mut out);
        out.built
    }

    /// Whether [`poll_transmit_into`](Self::poll_transmit_into) may build something: false
    /// when every connection had nothing to send since anything last happened to it (lets a
    /// caller skip reading the clock for a build that would find nothing).
    pub fn may_transmit(&self) -> bool {
        !self.stateless.is_empty() || !self.attention.send.is_empty()
    }

    /// Builds what is ready to send into `out` (see [`TransmitBuffer`]): one stateless answer,
    /// or the next datagram of one connection and, while `out` wants more, the rest of its
    /// burst of data. Returns how many datagrams it built; call until it returns 0. Only
    /// connections that something happened to since they last had nothing to send are asked:
    /// what becomes due with time alone (retransmissions, probes, paced data) goes out after
    /// [`handle_timeout`](Self::handle_timeout) ran for it.
    pub fn poll_transmit_into(&mut self, now: Instant, out: &mut dyn TransmitBuffer) -> usize {
        if let Some((local, remote, data)) = self.stateless.pop_front() {
            out.buffer(local, remote)[..data.len()].copy_from_slice(&data);
            out.commit(&Transmit {
                local,
                remote,
                len: data.len(),
            });
            return 1;
        }
        // round robin over the ready connections, so one busy connection cannot starve the
        // others; one that has nothing to send leaves the ready set
        let mut wrapped = false;
        loop {
            let next = self
                .attention
                .send
                .first_from(ConnectionHandle(self.cursor));
            let h = match next {
                Some(h) => h,
                None if !wrapped && self.cursor > 0 => {
                    wrapped = true;
                    self.cursor = 0;
                    continue;
                }
                None => return 0,
            };
            let built = self
                .connections
                .get_mut(&h)
                .map(|c| c.poll_transmit(now, out));
            self.attention.looked_at(h);
            self.cursor = h.0 + 1;
            let Some(built) = built.filter(|b| b.datagrams > 0) else {
                self.attention.send.remove(h);
                continue;
            };
            if !built.more {
                self.attention.send.remove(h);
            }
            return built.datagrams;
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next be called.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        self.refresh_timers();
        let next = self.timers.first();
        debug_assert_eq!(
            next,
            self.connections
                .values()
                .filter_map(Connection::poll_timeout)
                .min(),
            "the timer index missed a connection's change"
        );
        earliest(next, self.released_expiry())
    }

    /// When the oldest released connection is to be forgotten.
    fn released_expiry(&self) -> Option<Instant> {
        self.released.front().map(|r| r.0)
    }

    /// The earliest timer that traffic arms, of any connection: loss detection, a probe
    /// timeout, a delayed acknowledgement, pacing, a held datagram, a CLOSE to send. An
    /// application call that sends or reads may set such a timer earlier still; the others
    /// (keepalives, probes of links that are not up, limits) move with the clock alone. A
    /// driver can keep its wake-ups near while these are, and sleep until the next deadline
    /// while its connections only keep their links alive.
    pub fn traffic_timeout(&mut self) -> Option<Instant> {
        self.refresh_timers();
        let next = self.timers.first_traffic();
        debug_assert_eq!(
            next,
            self.connections
                .values()
                .filter_map(|c| c.poll_timeouts().1)
                .min(),
            "the traffic timer index missed a connection's change"
        );
        next
    }

    /// The engine's next deadline, as [`poll_timeout`](Self::poll_timeout) would return it,
    /// if it is earlier than `limit` (`None`: than never). Unlike `poll_timeout` it leaves
    /// the timer index as it is while few connections had something happen to them since it
    /// was last brought up to date: those are asked, and the index answers for the others.
    /// For a thread that only needs to know whether the one running the timers must wake up
    /// sooner: keeping the ordered index up to date after every message is what cost. With
    /// more marked connections than `ASK_AT_MOST` (8), the index is brought up to date first,
    /// so that they are not asked again at every call until it is.
    pub fn timeout_before(&mut self, limit: Option<Instant>) -> Option<Instant> {
        if self.attention.timers.len() > ASK_AT_MOST {
            self.refresh_timers();
        }
        let marked = &self.attention.timers;
        let asked = marked
            .iter()
            .filter_map(|h| self.connections.get(&h)?.poll_timeout())
            .min();
        let indexed = self.timers.first_but(|h| marked.contains(h));
        let next = earliest(earliest(asked, indexed), self.released_expiry());
        next.filter(|&t| limit.is_none_or(|l| t < l))
    }

    /// Runs every timer that is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.forget_released(now);
        self.refresh_timers();
        // each connection due runs once; it is then marked, and indexed again at the next
        // refresh
        while let Some(h) = self.timers.pop_due(now) {
            if let Some(c) = self.connections.get_mut(&h) {
                c.indexed_deadline = None;
                c.handle_timeout(now);
                self.attention.touch(h);
                // the client never confirmed: the application never had it
                if c.state() == ConnectionState::Closed && c.is_unconfirmed_server() {
                    self.remove(h);
                }
            }
        }
    }

    /// Computes again the deadlines of the connections something happened to.
    fn refresh_timers(&mut self) {
        if self.attention.timers.is_empty() {
            return;
        }
        let mut marked = self.attention.timers.take();
        for h in marked.drain(..) {
            // a connection gone was taken out of the index as it went
            if let Some(c) = self.connections.get_mut(&h) {
                let (deadline, traffic) = c.poll_timeouts();
                self.timers.set(h, &mut c.indexed_deadline, deadline);
                self.timers
                    .set_traffic(h, &mut c.indexed_traffic_deadline, traffic);
            }
        }
        self.attention.timers.restore(marked);
    }

    /// The next application event of any connection.
    pub fn poll_event(&mut self) -> Option<(ConnectionHandle, Event)> {
        while let Some(h) = self.attention.events.first_from(ConnectionHandle(0)) {
            if let Some(e) = (self.connections.get_mut(&h))
                .filter(|c| !c.released)
                .and_then(Connection::poll_event)
            {
                if matches!(e, Event::Closed(_)) {
                    self.uncount(h);
                }
                return Some((h, e));
            }
            self.attention.events.remove(h);
        }
        None
    }

    /// The application takes no more connections (its server endpoint is gone): a new
    /// handshake is refused as by an endpoint that is not a server (`NotAccepting`), at once.
    /// Connections already set up still come out of [`accept`](Self::accept), for the driver
    /// to end.
    pub fn stop_accepting(&mut self) {
        self.cfg.accept_incoming = false;
    }

    /// The next accepted incoming connection: one whose client has confirmed the handshake
    /// (its first short packet arrived), so never one a replayed INITIAL started.
    pub fn accept(&mut self) -> Option<ConnectionHandle> {
        self.accept_queue.pop_front()
    }

    /// Every connection the endpoint holds (closed ones not yet released included).
    pub fn connection_handles(&self) -> impl Iterator<Item = ConnectionHandle> + '_ {
        (self.connections.iter())
            .filter(|(_, c)| !c.released)
            .map(|(h, _)| *h)
    }

    /// Every path (local, remote address) on which an open connection heard its peer within
    /// `hold`, each once. The peer's host was there then, and a network outage does not
    /// change its link-layer address: a driver confirms these paths' next hops to the OS
    /// (Linux: `MSG_CONFIRM`) so that the OS does not forget them during an outage, which
    /// would delay the first datagrams after the heal by up to a second of address
    /// resolution retries (docs/PROTOCOL.md §6.9).
    pub fn heard_paths(&self, now: Instant, hold: Duration) -> Vec<(SocketAddr, SocketAddr)> {
        let mut paths: Vec<(SocketAddr, SocketAddr)> = self
            .connections
            .values()
            .flat_map(|c| c.heard_paths(now, hold))
            .collect();
        paths.sort_unstable();
        paths.dedup();
        paths
    }

    /// The largest datagram the interface of local address `local` can send is `max` from now
    /// on (its MTU changed; `None`: not known any more): the ceiling of path MTU discovery of
    /// every link from there, for connections to come and those running, which search again
    /// (a raised MTU is used: an endpoint bound before the interface was set up is not held to
    /// the MTU it had then).
    pub fn set_local_max_datagram(&mut self, local: SocketAddr, max: Option<usize>) {
        if !crate::link::set_local_max(&mut self.cfg.local_max_datagram, local, max) {
            return;
        }
        for (&h, c) in &mut self.connections {
            if c.interface_changed(local, max) {
                // its next probe is due now
                self.attention.touch(h);
            }
        }
    }

    /// A connection, for application calls.
    pub fn connection_mut(&mut self, h: ConnectionHandle) -> Option<&mut Connection> {
        // an application call may give the connection something to send
        self.attention.touch(h);
        self.connections.get_mut(&h)
    }

    /// A connection, read-only.
    pub fn connection(&self, h: ConnectionHandle) -> Option<&Connection> {
        self.connections.get(&h)
    }

    /// Whether some connection still has a CLOSE to send, now or in its second round
    /// (PROTOCOL.md §8.3): a process that exits after aborting its connections waits for it.
    pub fn closes_pending(&self) -> bool {
        self.connections.values().any(Connection::close_pending)
    }

    /// Lets go of a closed connection (the application has collected what it needed); returns
    /// false if it is still open, or still has a CLOSE to send.
    ///
    /// One that ended with an error is forgotten at once: later packets for it are answered
    /// with a RESET. One that ended cleanly is kept for the endpoint's `close_linger` from
    /// `now`, to confirm its clean end to a peer that missed its last acknowledgements (every
    /// link may have been dark then): a RESET would tell that peer that its data may be lost
    /// when all of it arrived. Kept so, it counts no more among the connections the endpoint
    /// holds (`max_connections`, [`connection_count`](Self::connection_count)), no event of
    /// it is reported, and only its own connection ID finds it. The endpoint (all its
    /// shards) keeps `max_connections` of them at most: at that limit this shard's oldest
    /// goes, or with none here the connection is forgotten at once. Only the links' state
    /// and the keys are kept, not what the application left unread.
    pub fn release(&mut self, h: ConnectionHandle, now: Instant) -> bool {
        let Some(c) = self.connections.get_mut(&h) else {
            return false;
        };
        if c.released {
            return true;
        }
        if c.state() != ConnectionState::Closed || c.close_pending() {
            return false;
        }
        let linger = self.cfg.close_linger;
        if c.close_reason().is_some() || linger.is_zero() {
            self.remove(h);
            return true;
        }
        let counts = (self.cfg.connection_counts.clone()).expect("set by Endpoint::new");
        let most = self.cfg.max_connections;
        // at the limit (of the whole endpoint: shards share it) this shard's oldest makes
        // room; with none here, this one is not kept
        if !counts.try_linger(most) {
            if let Some((_, oldest)) = self.released.pop_front() {
                self.remove(oldest);
            }
            if !counts.try_linger(most) {
                self.remove(h);
                return true;
            }
        }
        let c = self.connections.get_mut(&h).expect("looked up above");
        c.release();
        counts.release();
        let (initial, peer_cid) = ((c.handshake_path().1, c.peer_cid()), c.peer_cid());
        self.uncount(h);
        self.attention.events.remove(h);
        // Taken out of the indexes that RESETs, ICMP errors and new handshakes search: it
        // ended, and must neither take what is meant for a live connection of the same
        // client ID nor count among them. Its own ID still finds it.
        if self.by_initial.get(&initial) == Some(&h) {
            self.by_initial.remove(&initial);
        }
        if let Some(hs) = self.by_peer_cid.get_mut(&peer_cid) {
            hs.retain(|x| *x != h);
            if hs.is_empty() {
                self.by_peer_cid.remove(&peer_cid);
            }
        }
        self.released.push_back((now + linger, h));
        true
    }

    /// Forgets the released connections whose linger is over.
    fn forget_released(&mut self, now: Instant) {
        while let Some(&(_, h)) = self.released.front().filter(|r| r.0 <= now) {
            self.released.pop_front();
            self.remove(h);
        }
    }

    /// Number of connections held (open or not yet released).
    pub fn connection_count(&self) -> usize {
        self.connections.len() - self.released.len()
    }

    /// Which connection limit a new connection from `remote` would exceed, if any. The total
    /// counts every connection held: open, unconfirmed, or closed and not yet released by the
    /// application (so connections nobody accepts or releases cannot grow memory without
    /// end); the limit per address counts the open ones, so a client whose connections ended
    /// may connect again.
    ///
    /// A server connection from `remote` is about to be made if this returns `None`: it is
    /// counted in [`ConnectionCounts`] already, under its handshake's address.
    fn connection_limit_reached(&self, remote: SocketAddr) -> Option<&'static str> {
        const TOTAL: &str = "max_connections";
        const PER_ADDRESS: &str = "max_connections_per_address";
        let (total, per_address) = (
            self.cfg.max_connections,
            self.cfg.max_connections_per_address,
        );
        let counts = (self.cfg.connection_counts.as_ref()).expect("set by Endpoint::new");
        if !counts.try_hold(total) {
            return Some(TOTAL);
        }
        if !counts.try_open(remote.ip(), per_address) {
            counts.release();
            return Some(PER_ADDRESS);
        }
        None
    }
}

/// The earlier of two instants, either of which may be none.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every datagram `ep` has to send at `now`.
    fn drain(ep: &mut Endpoint, now: Instant) -> Vec<(Transmit, Vec<u8>)> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 2048];
        while let Some(t) = ep.poll_transmit(now, &mut buf) {
            out.push((t, buf[..t.len].to_vec()));
        }
        out
    }

    /// A client and a server endpoint holding `key`, and their addresses.
    fn keyed_pair(key: &crate::Key, now: Instant) -> (Endpoint, Endpoint, SocketAddr, SocketAddr) {
        let (client_addr, server_addr): (SocketAddr, SocketAddr) = (
            "10.0.0.1:5000".parse().unwrap(),
            "10.0.0.2:6000".parse().unwrap(),
        );
        let keyed = |local| {
            let mut cfg = EndpointConfig::new(vec![local]);
            cfg.key = Some(key.clone());
            cfg
        };
        let client = Endpoint::new(keyed(client_addr), 1, now);
        let server = Endpoint::new(keyed(server_addr).server(), 2, now);
        (client, server, client_addr, server_addr)
    }

    /// One round of what `client` and `server` have to send each other at `now`.
    fn exchange(client: &mut Endpoint, server: &mut Endpoint, now: Instant) {
        for (t, mut d) in drain(client, now) {
            server.handle_datagram(now, t.remote, t.local, &mut d);
        }
        for (t, mut d) in drain(server, now) {
            client.handle_datagram(now, t.remote, t.local, &mut d);
        }
    }

    /// A message written and sent in one burst leaves nothing to send at that instant: the
    /// connection leaves the set the endpoint asks, so the next call (and the driver's look
    /// for work) costs nothing, where it asked the connection again and found nothing.
    #[test]
    fn a_burst_that_sent_everything_leaves_nothing_to_ask() {
        let now = Instant::now();
        let (client_addr, server_addr): (SocketAddr, SocketAddr) = (
            "10.0.0.1:5000".parse().unwrap(),
            "10.0.0.2:6000".parse().unwrap(),
        );
        let mut client = Endpoint::new(EndpointConfig::new(vec![client_addr]), 1, now);
        let mut server = Endpoint::new(EndpointConfig::new(vec![server_addr]).server(), 2, now);
        let h = client
            .connect(now, &[server_addr], Default::default())
            .unwrap();
        for _ in 0..4 {
            exchange(&mut client, &mut server, now);
        }
        assert_eq!(
            client.connection(h).unwrap().state(),
            ConnectionState::Established
        );
        assert!(
            !client.may_transmit(),
            "the handshake left something to send"
        );
        client.connection_mut(h).unwrap().write(&[7; 64]).unwrap();
        assert!(client.may_transmit());
        let mut buf = vec![0u8; 2048];
        assert!(client.poll_transmit(now, &mut buf).is_some(), "the message");
        assert!(!client.may_transmit(), "asked again for nothing");
        assert!(client.poll_transmit(now, &mut buf).is_none());
    }

    /// Packets to a server connection on a link the peer "opens" from a spoofed address,
    /// each a PING numbered far past the last (so that its acknowledgement lists many
    /// ranges), draw no more to that address than three times what came from it: their
    /// acknowledgements go on the link that is up, and once none is, only within that share.
    /// Before, each went back to the spoofed address, about 14 times the bytes that came from
    /// it here.
    #[test]
    fn acknowledgements_are_not_sent_to_a_spoofed_link_s_address() {
        let mut now = Instant::now();
        let (client_addr, server_addr, victim): (SocketAddr, SocketAddr, SocketAddr) = (
            "10.0.0.1:5000".parse().unwrap(),
            "10.0.0.2:6000".parse().unwrap(),
            "10.9.9.9:4444".parse().unwrap(),
        );
        let mut client = Endpoint::new(EndpointConfig::new(vec![client_addr]), 1, now);
        let mut server = Endpoint::new(EndpointConfig::new(vec![server_addr]).server(), 2, now);
        let h = (client.connect(now, &[server_addr], Default::default())).unwrap();
        for _ in 0..4 {
            exchange(&mut client, &mut server, now);
        }
        assert!(server.accept().is_some(), "the handshake completed");
        let server_cid = client.connection(h).unwrap().peer_cid();
        let (mut from_victim, mut to_victim, mut acks_to_client) = (0, 0, 0);
        for k in 0..500u64 {
            let mut pkt = vec![0u8; 64];
            let mut w = wire::Writer::new(&mut pkt);
            wire::write_short_header(&mut w, server_cid, crate::LinkId(1), k * 40_000, 0);
            w.u8(wire::frame_type::PING);
            let n = w.finish();
            pkt.truncate(n);
            from_victim += n;
            server.handle_datagram(now, server_addr, victim, &mut pkt);
            server.handle_timeout(now);
            for (t, _) in drain(&mut server, now) {
                if t.remote == victim {
                    to_victim += t.len;
                } else if t.remote == client_addr {
                    acks_to_client += 1;
                }
            }
            now += Duration::from_millis(2);
        }
        // the premise: the PINGs were taken and acknowledged (on the client's link, until it
        // was declared down: the client, which this test does not run, never answers)
        assert!(
            acks_to_client >= 100,
            "{acks_to_client} acknowledgements sent"
        );
        assert!(
            to_victim <= 3 * from_victim,
            "{to_victim} bytes to the spoofed address for {from_victim} from it"
        );
    }

    /// Connection IDs are drawn at random by each side, so a client's own ID for a connection
    /// it is opening may equal the ID its peer chose for another of its connections. A RESET
    /// for that ID from the peer, saying it no longer knows the established connection, ends
    /// that connection, and leaves the one still opening alone. Before, only the first
    /// candidate (the one opening) was tried: its token did not fit a refusal, and the
    /// RESET was dropped as unauthenticated.
    #[test]
    fn a_reset_for_an_id_two_connections_share_reaches_the_one_its_token_names() {
        let now = Instant::now();
        let key = crate::Key::from_bytes([5; 32]);
        let (mut client, mut server, client_addr, server_addr) = keyed_pair(&key, now);
        let established = client
            .connect(now, &[server_addr], Default::default())
            .unwrap();
        for _ in 0..6 {
            exchange(&mut client, &mut server, now);
        }
        assert_eq!(
            client.connection(established).unwrap().state(),
            ConnectionState::Established
        );
        let opening = client
            .connect(now, &[server_addr], Default::default())
            .unwrap();
        // the collision: the server's ID for the established connection is the one the
        // client drew for the connection it is opening, as the index holds it then
        let shared = client.connection(opening).unwrap().local_cid();
        (client.by_peer_cid.entry(shared).or_default()).push(established);

        let token = key.reset_token(ResetKind::Unknown, shared, server_addr, client_addr);
        let mut reset = vec![0u8; 64];
        let n = wire::encode_control_packet(
            &Header::Reset {
                dcid: shared,
                token: Some(&token),
            },
            &mut reset,
        );
        reset.truncate(n);
        client.handle_datagram(now, client_addr, server_addr, &mut reset);

        assert_eq!(
            client.connection(established).unwrap().close_reason(),
            Some(&ConnectionError::PeerRestarted)
        );
        let still = client.connection(opening).unwrap();
        assert_eq!(still.state(), ConnectionState::Connecting);
        assert_eq!(still.close_reason(), None);
    }

    /// An ACCEPT made with the key whose server parameters do not decode ends the client's
    /// connection at once, as a protocol violation: its handshake has read the server's
    /// message and can read no repeat of it. Before, the client dropped it and waited, until
    /// the handshake timed out (10 s), for an answer it could no longer take.
    #[test]
    fn an_authenticated_accept_that_does_not_decode_ends_the_connection() {
        let now = Instant::now();
        let key = crate::Key::from_bytes([3; 32]);
        let (mut client, mut server, client_addr, server_addr) = keyed_pair(&key, now);
        let h = client
            .connect(now, &[server_addr], Default::default())
            .unwrap();
        // the first INITIAL draws the cookie; the second carries the Noise message
        exchange(&mut client, &mut server, now);
        let initial = drain(&mut client, now)
            .into_iter()
            .find_map(|(_, d)| match wire::decode_packet(&d) {
                Ok((
                    Header::Initial {
                        scid, token, hello, ..
                    },
                    _,
                )) if !token.is_empty() => Some((scid, token.to_vec(), hello.to_vec())),
                _ => None,
            })
            .expect("an INITIAL with the cookie");
        let (scid, cookie, msg) = initial;
        let (server_hs, _) =
            ServerHandshake::read(&key, scid, &cookie, &msg).expect("the client's message");
        let (answer, _) = server_hs.answer(b"not server parameters");
        let mut accept = vec![0u8; 1500];
        let n = wire::encode_control_packet(
            &Header::Accept {
                dcid: scid,
                mode: wire::handshake_mode::NOISE_NNPSK0,
                hello: &answer,
            },
            &mut accept,
        );
        accept.truncate(n);
        client.handle_datagram(now, client_addr, server_addr, &mut accept);
        let conn = client.connection(h).unwrap();
        assert_eq!(conn.state(), ConnectionState::Closed);
        assert!(
            matches!(
                conn.close_reason(),
                Some(ConnectionError::ProtocolViolation(_))
            ),
            "{:?}",
            conn.close_reason()
        );
    }
}
