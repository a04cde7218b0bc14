//! The network model: the two hosts' addresses, the K links between them, and each link's two
//! independent directions with their transmit queue, serialization, propagation and impairments.
//!
//! Nothing here knows about the engine. A [`Direction`] is a small state machine driven by the
//! caller's clock: [`Direction::send`] offers a datagram and may start a serialization, the caller
//! schedules the returned [`TxDone`] and hands it back to [`Direction::tx_done`], which decides
//! the datagram's fate (lost, corrupted, duplicated, delayed, reordered) and yields
//! [`Delivery`]s for the caller to schedule. A delivery is only real if
//! [`Direction::accept_delivery`] still agrees when its time comes (a link that went down in
//! between loses what was on the wire).
//!
//! A [`Network`] holds the K links and routes address pairs onto them; its [`Network::send`],
//! [`Network::handle`] and [`Network::apply`] do that scheduling for an event loop, which only
//! keeps [`NetEvent`]s in its queue and hands each one back when it comes due. Both event loops
//! of this crate (the scenario runner and the [`Testbed`](crate::testbed::Testbed)) move their
//! datagrams this way, so they share one network model.

use std::collections::VecDeque;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::derive_seed;
use crate::scenario::Action;

/// Bytes of IPv4 + UDP header counted on the wire for every datagram (serialization and queue).
pub const HEADER_BYTES: usize = 28;

/// UDP payload of a 1500-byte MTU (less the IPv4 and UDP headers): the default of links and hosts.
pub const MAX_DATAGRAM: usize = 1472;

/// Most links the simulated network has (the engine's limit).
pub const MAX_LINKS: usize = ri2n_proto::MAX_LINKS;

/// A rate at which serialization takes no time at all. A direction at this rate still has its
/// queue limit: datagrams sent at one instant wait behind each other there, so give it an
/// unlimited queue too (as [`DirectionConfig::ideal`] does) for delay and impairments alone to
/// shape its traffic.
pub const UNLIMITED_RATE: u64 = u64::MAX;

/// One of the two simulated hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostId {
    /// The client: opens the connection.
    A,
    /// The server: accepts it.
    B,
}

impl HostId {
    /// 0 for A, 1 for B (index into per-host arrays).
    pub fn index(self) -> usize {
        match self {
            HostId::A => 0,
            HostId::B => 1,
        }
    }

    /// The other host.
    pub fn peer(self) -> HostId {
        match self {
            HostId::A => HostId::B,
            HostId::B => HostId::A,
        }
    }
}

impl fmt::Display for HostId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HostId::A => "A",
            HostId::B => "B",
        })
    }
}

/// A direction of travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dir {
    /// From the client A to the server B.
    AToB,
    /// From the server B to the client A.
    BToA,
}

impl Dir {
    /// 0 for A→B, 1 for B→A (index into per-direction arrays).
    pub fn index(self) -> usize {
        match self {
            Dir::AToB => 0,
            Dir::BToA => 1,
        }
    }

    /// The direction in which `host` sends.
    pub fn from_sender(host: HostId) -> Dir {
        match host {
            HostId::A => Dir::AToB,
            HostId::B => Dir::BToA,
        }
    }

    /// The opposite direction.
    pub fn reverse(self) -> Dir {
        match self {
            Dir::AToB => Dir::BToA,
            Dir::BToA => Dir::AToB,
        }
    }

    /// The sending host.
    pub fn sender(self) -> HostId {
        match self {
            Dir::AToB => HostId::A,
            Dir::BToA => HostId::B,
        }
    }

    /// The receiving host.
    pub fn receiver(self) -> HostId {
        self.sender().peer()
    }
}

impl fmt::Display for Dir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dir::AToB => "A→B",
            Dir::BToA => "B→A",
        })
    }
}

/// The address of `host` on link `link`: A is `10.{link}.0.1:5000`, B is `10.{link}.0.2:6000`,
/// so the two ends of a link share a /24.
pub fn host_addr(host: HostId, link: usize) -> SocketAddr {
    assert!(link < 256, "link index {link} out of range");
    let (last, port) = match host {
        HostId::A => (1, 5000),
        HostId::B => (2, 6000),
    };
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, link as u8, 0, last)), port)
}

/// Administrative state of one direction of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkStatus {
    /// Carries traffic.
    Up,
    /// Cable pulled: datagrams vanish at the sender (the engine gets no error).
    Down,
    /// Path dead but carrier up (e.g. a dead switch): datagrams vanish as well.
    Blackhole,
}

/// Characteristics of one direction of a link.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectionConfig {
    /// Bits per second on the wire (must be > 0). Serialization of a datagram takes
    /// `(len + HEADER_BYTES) * 8 / rate_bps` seconds.
    pub rate_bps: u64,
    /// One-way propagation delay.
    pub delay: Duration,
    /// Extra delay drawn uniformly from `0..=jitter` per datagram. Without reordering the
    /// direction stays FIFO (a datagram is never delivered before the one sent ahead of it).
    pub jitter: Duration,
    /// Drop-tail limit: wire bytes (`len + HEADER_BYTES`) that may wait for serialization,
    /// not counting the datagram being serialized.
    pub queue_limit: usize,
    /// Probability that a serialized datagram is lost.
    pub loss: f64,
    /// Probability that a delivered datagram is delivered twice.
    pub duplicate: f64,
    /// Probability that a datagram is damaged on the wire; the receiving host's UDP checksum
    /// then discards it.
    pub corrupt: f64,
    /// Probability that a datagram is held back by `1..=3 × delay + 1 ms` (later ones overtake it).
    pub reorder: f64,
    /// Largest UDP payload the direction carries (its MTU less the headers): larger datagrams
    /// vanish, as at a switch port with a smaller MTU (default 1472, a 1500-byte MTU).
    pub mtu: usize,
}

impl Default for DirectionConfig {
    /// 1 Gbit/s, 0.1 ms, 256 KiB queue, no impairments.
    fn default() -> Self {
        Self {
            rate_bps: 1_000_000_000,
            delay: Duration::from_micros(100),
            jitter: Duration::ZERO,
            queue_limit: 256 << 10,
            loss: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            reorder: 0.0,
            mtu: MAX_DATAGRAM,
        }
    }
}

impl DirectionConfig {
    /// An ideal direction: every datagram arrives exactly `delay` after it was sent, in order,
    /// whatever the load ([`UNLIMITED_RATE`], no queue limit, no impairments).
    pub fn ideal(delay: Duration) -> Self {
        Self {
            rate_bps: UNLIMITED_RATE,
            delay,
            jitter: Duration::ZERO,
            queue_limit: usize::MAX,
            loss: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            reorder: 0.0,
            mtu: MAX_DATAGRAM,
        }
    }

    /// The same, with another rate (bits/s).
    pub fn with_rate(mut self, rate_bps: u64) -> Self {
        self.rate_bps = rate_bps;
        self
    }
    /// The same, with another propagation delay.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
    /// The same, with another jitter.
    pub fn with_jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }
    /// The same, with another queue limit (bytes).
    pub fn with_queue_limit(mut self, bytes: usize) -> Self {
        self.queue_limit = bytes;
        self
    }
    /// The same, with another loss probability.
    pub fn with_loss(mut self, p: f64) -> Self {
        self.loss = p;
        self
    }
    /// The same, with another duplication probability.
    pub fn with_duplicate(mut self, p: f64) -> Self {
        self.duplicate = p;
        self
    }
    /// The same, with another corruption probability.
    pub fn with_corrupt(mut self, p: f64) -> Self {
        self.corrupt = p;
        self
    }
    /// The same, with another largest datagram (bytes of UDP payload).
    pub fn with_mtu(mut self, mtu: usize) -> Self {
        self.mtu = mtu;
        self
    }
    /// The same, with another reordering probability.
    pub fn with_reorder(mut self, p: f64) -> Self {
        self.reorder = p;
        self
    }

    /// Checks rates and probabilities; the error says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.rate_bps == 0 {
            return Err("rate_bps must be > 0".into());
        }
        for (name, p) in [
            ("loss", self.loss),
            ("duplicate", self.duplicate),
            ("corrupt", self.corrupt),
            ("reorder", self.reorder),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{name} probability {p} outside 0..=1"));
            }
        }
        Ok(())
    }
}

/// Both directions of one link.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// Direction A→B.
    pub a_to_b: DirectionConfig,
    /// Direction B→A.
    pub b_to_a: DirectionConfig,
}

impl LinkConfig {
    /// An ideal link both ways (see [`DirectionConfig::ideal`]).
    pub fn ideal(delay: Duration) -> Self {
        Self::symmetric(DirectionConfig::ideal(delay))
    }

    /// A link with the same characteristics both ways.
    pub fn symmetric(config: DirectionConfig) -> Self {
        Self {
            a_to_b: config.clone(),
            b_to_a: config,
        }
    }

    /// The configuration of one direction.
    pub fn dir(&self, dir: Dir) -> &DirectionConfig {
        match dir {
            Dir::AToB => &self.a_to_b,
            Dir::BToA => &self.b_to_a,
        }
    }
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self::symmetric(DirectionConfig::default())
    }
}

/// What happened to the datagrams offered to one direction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirectionCounters {
    /// Datagrams offered by the sending host.
    pub offered: u64,
    /// Their bytes (UDP payload).
    pub offered_bytes: u64,
    /// Dropped because the direction was down or blackholed, when sent or while queued.
    pub dropped_down: u64,
    /// Dropped by the drop-tail queue.
    pub dropped_queue: u64,
    /// Dropped by random loss.
    pub dropped_loss: u64,
    /// On the wire when the direction went down (lost at delivery time).
    pub dropped_in_flight: u64,
    /// Damaged on the wire and discarded by the receiver's UDP checksum.
    pub corrupted: u64,
    /// Dropped for being larger than the direction's MTU.
    pub dropped_too_big: u64,
    /// Duplicated (delivered twice).
    pub duplicated: u64,
    /// Held back for reordering.
    pub reordered: u64,
    /// Datagrams handed to the receiving host (duplicates count twice).
    pub delivered: u64,
    /// Their bytes.
    pub delivered_bytes: u64,
}

/// A serialization completion the caller must schedule and hand back to [`Direction::tx_done`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxDone {
    /// When serialization of the head datagram completes.
    pub at: Duration,
    /// Generation: a `TxDone` superseded by a rate change or a link failure is ignored.
    pub gen: u64,
}

/// A datagram that leaves the wire at `at`, if the direction's epoch still is `epoch` by then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Arrival time at the receiving host.
    pub at: Duration,
    /// Epoch of the direction when the datagram was put on the wire.
    pub epoch: u32,
    /// The datagram as sent (a corrupted one never arrives: see `corrupt`).
    pub data: Vec<u8>,
}

/// Serialization time of `wire_bytes` at `rate_bps`, rounded up to the nanosecond (none at
/// [`UNLIMITED_RATE`]).
pub fn serialization_time(wire_bytes: usize, rate_bps: u64) -> Duration {
    if rate_bps == UNLIMITED_RATE {
        return Duration::ZERO;
    }
    let bits = wire_bytes as u128 * 8;
    let rate = rate_bps.max(1) as u128;
    let ns = (bits * 1_000_000_000).div_ceil(rate);
    Duration::from_nanos(ns.min(u64::MAX as u128) as u64)
}

/// One direction of a link: a FIFO transmitter with a drop-tail queue and random impairments.
#[derive(Debug)]
pub struct Direction {
    config: DirectionConfig,
    status: LinkStatus,
    rng: ChaCha8Rng,
    /// Datagrams awaiting serialization; the front one is being serialized when `head_end` is set.
    queue: VecDeque<Vec<u8>>,
    /// Wire bytes in `queue` not counting the one being serialized.
    queued_bytes: usize,
    /// When the datagram at the front of `queue` finishes serialization.
    head_end: Option<Duration>,
    tx_gen: u64,
    epoch: u32,
    /// Latest delivery time handed out for a non-reordered datagram (keeps the direction FIFO).
    last_delivery: Duration,
    counters: DirectionCounters,
}

impl Direction {
    /// A direction that is up, with its own random stream seeded from `seed`.
    pub fn new(config: DirectionConfig, seed: u64) -> Self {
        Self {
            config,
            status: LinkStatus::Up,
            rng: ChaCha8Rng::seed_from_u64(seed),
            queue: VecDeque::new(),
            queued_bytes: 0,
            head_end: None,
            tx_gen: 0,
            epoch: 0,
            last_delivery: Duration::ZERO,
            counters: DirectionCounters::default(),
        }
    }

    /// Current configuration.
    pub fn config(&self) -> &DirectionConfig {
        &self.config
    }

    /// Current state.
    pub fn status(&self) -> LinkStatus {
        self.status
    }

    /// What happened so far.
    pub fn counters(&self) -> &DirectionCounters {
        &self.counters
    }

    /// Wire bytes waiting for serialization (not counting the datagram being serialized).
    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    /// Datagrams held by the transmitter, including the one being serialized.
    pub fn queued_datagrams(&self) -> usize {
        self.queue.len()
    }

    /// Offers a datagram at `now`. Returns the serialization completion to schedule if the
    /// transmitter was idle; `None` if the datagram was queued behind others or dropped.
    pub fn send(&mut self, now: Duration, data: Vec<u8>) -> Option<TxDone> {
        self.counters.offered += 1;
        self.counters.offered_bytes += data.len() as u64;
        if self.status != LinkStatus::Up {
            self.counters.dropped_down += 1;
            return None;
        }
        let wire = data.len() + HEADER_BYTES;
        if self.head_end.is_none() {
            debug_assert!(self.queue.is_empty());
            self.queue.push_back(data);
            return Some(self.start_head(now, wire));
        }
        if self.queued_bytes + wire > self.config.queue_limit {
            self.counters.dropped_queue += 1;
            return None;
        }
        self.queued_bytes += wire;
        self.queue.push_back(data);
        None
    }

    fn start_head(&mut self, now: Duration, wire: usize) -> TxDone {
        let at = now + serialization_time(wire, self.config.rate_bps);
        self.head_end = Some(at);
        self.tx_gen += 1;
        TxDone {
            at,
            gen: self.tx_gen,
        }
    }

    /// Serialization of the head datagram completed (`gen` from its [`TxDone`]; stale ones do
    /// nothing). Pushes 0, 1 or 2 deliveries into `out` and returns the next completion to
    /// schedule, if another datagram is waiting.
    pub fn tx_done(&mut self, gen: u64, out: &mut Vec<Delivery>) -> Option<TxDone> {
        let end = self.head_end?;
        if gen != self.tx_gen {
            return None;
        }
        self.head_end = None;
        let data = self
            .queue
            .pop_front()
            .expect("a datagram is being serialized");
        self.fate(end, data, out);
        let next_wire = self.queue.front().map(|d| d.len() + HEADER_BYTES)?;
        self.queued_bytes -= next_wire;
        Some(self.start_head(end, next_wire))
    }

    /// Decides what becomes of a datagram that left the transmitter at `t`.
    fn fate(&mut self, t: Duration, data: Vec<u8>, out: &mut Vec<Delivery>) {
        let c = &self.config;
        if data.len() > c.mtu {
            self.counters.dropped_too_big += 1;
            return;
        }
        if c.loss > 0.0 && self.rng.gen::<f64>() < c.loss {
            self.counters.dropped_loss += 1;
            return;
        }
        if c.corrupt > 0.0 && !data.is_empty() && self.rng.gen::<f64>() < c.corrupt {
            // 1-3 bytes damaged on the wire: the receiving host's UDP checksum catches it and
            // its kernel discards the datagram (ri2n packets carry no checksum of their own)
            self.counters.corrupted += 1;
            return;
        }
        let mut at = t + c.delay;
        if !c.jitter.is_zero() {
            at += Duration::from_nanos(self.rng.gen_range(0..=c.jitter.as_nanos() as u64));
        }
        if c.reorder > 0.0 && self.rng.gen::<f64>() < c.reorder {
            at += c.delay.mul_f64(self.rng.gen_range(1.0..=3.0)) + Duration::from_millis(1);
            self.counters.reordered += 1;
        } else {
            at = at.max(self.last_delivery);
            self.last_delivery = at;
        }
        if c.duplicate > 0.0 && self.rng.gen::<f64>() < c.duplicate {
            self.counters.duplicated += 1;
            out.push(Delivery {
                at,
                epoch: self.epoch,
                data: data.clone(),
            });
        }
        out.push(Delivery {
            at,
            epoch: self.epoch,
            data,
        });
    }

    /// Whether a delivery put on the wire in `epoch` arrives (counted as delivered) or was lost
    /// because the direction went down meanwhile.
    pub fn accept_delivery(&mut self, epoch: u32, len: usize) -> bool {
        if epoch != self.epoch {
            self.counters.dropped_in_flight += 1;
            return false;
        }
        self.counters.delivered += 1;
        self.counters.delivered_bytes += len as u64;
        true
    }

    /// Changes the state. Leaving `Up` drops everything queued and everything on the wire.
    pub fn set_status(&mut self, status: LinkStatus) {
        if status == self.status {
            return;
        }
        if self.status == LinkStatus::Up {
            self.counters.dropped_down += self.queue.len() as u64;
            self.queue.clear();
            self.queued_bytes = 0;
            self.head_end = None;
            self.tx_gen += 1;
            self.epoch += 1;
            // what was on the wire is lost: it holds back nothing sent after the link is back
            self.last_delivery = Duration::ZERO;
        }
        self.status = status;
    }

    /// Changes the rate at `now`. Datagrams not yet serialized use the new rate; the rest of the
    /// one being serialized is rescaled. Returns a new completion to schedule if it moved.
    pub fn set_rate(&mut self, now: Duration, rate_bps: u64) -> Option<TxDone> {
        assert!(rate_bps > 0, "link rate must be > 0");
        let old = self.config.rate_bps;
        self.config.rate_bps = rate_bps;
        let end = self.head_end?;
        if end <= now || old == rate_bps {
            return None;
        }
        let rest = (end - now).as_nanos() * old as u128 / rate_bps as u128;
        let at = now + Duration::from_nanos(rest.min(u64::MAX as u128) as u64);
        self.head_end = Some(at);
        self.tx_gen += 1;
        Some(TxDone {
            at,
            gen: self.tx_gen,
        })
    }

    /// Replaces the whole configuration at `now` (the rate change as in [`Direction::set_rate`]).
    pub fn set_config(&mut self, now: Duration, config: DirectionConfig) -> Option<TxDone> {
        let rate = config.rate_bps;
        self.config = DirectionConfig {
            rate_bps: self.config.rate_bps,
            ..config
        };
        self.set_rate(now, rate)
    }

    /// Changes the largest datagram carried from now on.
    pub fn set_mtu(&mut self, mtu: usize) {
        self.config.mtu = mtu;
    }

    /// Changes the loss probability from now on.
    pub fn set_loss(&mut self, loss: f64) {
        self.config.loss = loss;
    }
}

/// Something a [`Network`] asked its event loop to hand back at a given time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetEvent {
    /// Serialization completes on a link direction.
    TxDone {
        /// Link index.
        link: usize,
        /// Direction.
        dir: Dir,
        /// Generation, from the [`TxDone`].
        gen: u64,
    },
    /// A datagram leaves the wire of a link direction.
    Deliver {
        /// Link index.
        link: usize,
        /// Direction.
        dir: Dir,
        /// Epoch of the direction when the datagram was put on the wire.
        epoch: u32,
        /// The datagram.
        data: Vec<u8>,
    },
}

/// A datagram that reached its receiving host, `dir.receiver()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// The link it travelled on.
    pub link: usize,
    /// Its direction.
    pub dir: Dir,
    /// The receiver's address it arrived at.
    pub local: SocketAddr,
    /// The sender's address it came from.
    pub remote: SocketAddr,
    /// The datagram.
    pub data: Vec<u8>,
}

/// The K links between A and B, and the routing of (local, remote) address pairs onto them.
#[derive(Debug)]
pub struct Network {
    links: Vec<[Direction; 2]>,
    /// A's and B's address on each link.
    addrs: Vec<(SocketAddr, SocketAddr)>,
    /// Scratch space for deliveries, reused.
    deliveries: Vec<Delivery>,
}

impl Network {
    /// A network of `links.len()` links, every direction with its own random stream from `seed`,
    /// the hosts' addresses on link `i` being [`host_addr`]`(A, i)` and [`host_addr`]`(B, i)`.
    pub fn new(links: &[LinkConfig], seed: u64) -> Self {
        let addrs: Vec<_> = (0..links.len())
            .map(|i| (host_addr(HostId::A, i), host_addr(HostId::B, i)))
            .collect();
        Self::with_addrs(links, &addrs, seed)
    }

    /// A network whose link `i` joins A's address `addrs[i].0` and B's address `addrs[i].1`
    /// (one address pair per link, no pair twice).
    pub fn with_addrs(links: &[LinkConfig], addrs: &[(SocketAddr, SocketAddr)], seed: u64) -> Self {
        assert_eq!(links.len(), addrs.len(), "one address pair per link");
        for (i, pair) in addrs.iter().enumerate() {
            assert!(
                !addrs[..i].contains(pair),
                "address pair {pair:?} used by two links"
            );
        }
        let links = links
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let s = |d: Dir| derive_seed(seed, 0x11_0000 + (i * 2 + d.index()) as u64);
                [
                    Direction::new(l.a_to_b.clone(), s(Dir::AToB)),
                    Direction::new(l.b_to_a.clone(), s(Dir::BToA)),
                ]
            })
            .collect();
        Self {
            links,
            addrs: addrs.to_vec(),
            deliveries: Vec::new(),
        }
    }

    /// Number of links.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// Whether there is no link at all.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// The address of `host` on link `link`.
    pub fn addr(&self, host: HostId, link: usize) -> SocketAddr {
        let (a, b) = self.addrs[link];
        match host {
            HostId::A => a,
            HostId::B => b,
        }
    }

    /// The link a datagram sent by `from` from `local` to `remote` travels on, if any.
    pub fn route(&self, from: HostId, local: SocketAddr, remote: SocketAddr) -> Option<usize> {
        let pair = match from {
            HostId::A => (local, remote),
            HostId::B => (remote, local),
        };
        self.addrs.iter().position(|&p| p == pair)
    }

    /// One direction of one link.
    pub fn direction(&self, link: usize, dir: Dir) -> &Direction {
        &self.links[link][dir.index()]
    }

    /// One direction of one link, mutable.
    pub fn direction_mut(&mut self, link: usize, dir: Dir) -> &mut Direction {
        &mut self.links[link][dir.index()]
    }

    /// Host `from` sends `data` from `local` to `remote` at `now`: it goes onto the link that
    /// joins the pair, whose transmitter may ask for an event. Returns that link, or `None`
    /// when no link joins the pair (the datagram is lost, as to an unreachable address).
    pub fn send(
        &mut self,
        now: Duration,
        from: HostId,
        local: SocketAddr,
        remote: SocketAddr,
        data: Vec<u8>,
        schedule: &mut impl FnMut(Duration, NetEvent),
    ) -> Option<usize> {
        let link = self.route(from, local, remote)?;
        let dir = Dir::from_sender(from);
        let tx = self.direction_mut(link, dir).send(now, data);
        schedule_tx(link, dir, tx, schedule);
        Some(link)
    }

    /// Handles an event this network asked for, now that it is due. A datagram that leaves the
    /// wire and is still wanted (its direction did not go down meanwhile) is returned for the
    /// caller to hand to its receiving host.
    pub fn handle(
        &mut self,
        ev: NetEvent,
        schedule: &mut impl FnMut(Duration, NetEvent),
    ) -> Option<Arrival> {
        match ev {
            NetEvent::TxDone { link, dir, gen } => {
                let mut out = std::mem::take(&mut self.deliveries);
                let next = self.direction_mut(link, dir).tx_done(gen, &mut out);
                for d in out.drain(..) {
                    schedule(
                        d.at,
                        NetEvent::Deliver {
                            link,
                            dir,
                            epoch: d.epoch,
                            data: d.data,
                        },
                    );
                }
                self.deliveries = out;
                schedule_tx(link, dir, next, schedule);
                None
            }
            NetEvent::Deliver {
                link,
                dir,
                epoch,
                data,
            } => {
                if !self
                    .direction_mut(link, dir)
                    .accept_delivery(epoch, data.len())
                {
                    return None;
                }
                let to = dir.receiver();
                Some(Arrival {
                    link,
                    dir,
                    local: self.addr(to, link),
                    remote: self.addr(to.peer(), link),
                    data,
                })
            }
        }
    }

    /// Applies a change to the links at `now` ([`Action::RestartServer`] is no change to the
    /// network: returns false for it and true for every other action).
    pub fn apply(
        &mut self,
        now: Duration,
        action: &Action,
        schedule: &mut impl FnMut(Duration, NetEvent),
    ) -> bool {
        let dirs = |d: Option<Dir>| match d {
            Some(d) => vec![d],
            None => vec![Dir::AToB, Dir::BToA],
        };
        match action {
            Action::SetStatus { link, dir, status } => {
                for d in dirs(*dir) {
                    self.direction_mut(*link, d).set_status(*status);
                }
            }
            Action::SetRate {
                link,
                dir,
                rate_bps,
            } => {
                for d in dirs(*dir) {
                    let tx = self.direction_mut(*link, d).set_rate(now, *rate_bps);
                    schedule_tx(*link, d, tx, schedule);
                }
            }
            Action::SetLoss { link, dir, loss } => {
                for d in dirs(*dir) {
                    self.direction_mut(*link, d).set_loss(*loss);
                }
            }
            Action::Configure { link, dir, config } => {
                for d in dirs(*dir) {
                    let tx = self.direction_mut(*link, d).set_config(now, config.clone());
                    schedule_tx(*link, d, tx, schedule);
                }
            }
            Action::SetMtu { link, dir, mtu } => {
                for d in dirs(*dir) {
                    self.direction_mut(*link, d).set_mtu(*mtu);
                }
            }
            Action::RestartServer => return false,
        }
        true
    }
}

fn schedule_tx(
    link: usize,
    dir: Dir,
    tx: Option<TxDone>,
    schedule: &mut impl FnMut(Duration, NetEvent),
) {
    if let Some(tx) = tx {
        schedule(
            tx.at,
            NetEvent::TxDone {
                link,
                dir,
                gen: tx.gen,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    fn us(x: u64) -> Duration {
        Duration::from_micros(x)
    }

    /// Feeds `sends` (sorted by time) through `d` and returns every delivery, in the order a
    /// FIFO event loop would produce them (completions before sends at the same instant).
    fn run(d: &mut Direction, sends: Vec<(Duration, Vec<u8>)>) -> Vec<Delivery> {
        let mut out = Vec::new();
        let mut pending: Option<TxDone> = None;
        for (t, data) in sends {
            while let Some(tx) = pending.filter(|tx| tx.at <= t) {
                pending = d.tx_done(tx.gen, &mut out);
            }
            if let Some(tx) = d.send(t, data) {
                pending = Some(tx);
            }
        }
        while let Some(tx) = pending {
            pending = d.tx_done(tx.gen, &mut out);
        }
        out
    }

    fn packets(n: usize, len: usize, at: impl Fn(usize) -> Duration) -> Vec<(Duration, Vec<u8>)> {
        (0..n)
            .map(|i| (at(i), vec![(i % 251) as u8 + 1; len]))
            .collect()
    }

    #[test]
    fn serialization_time_is_exact() {
        // 1000 + 28 bytes at 10 Mbit/s: 8224 bits = 822.4 µs.
        assert_eq!(
            serialization_time(1028, 10_000_000),
            Duration::from_nanos(822_400)
        );
        // Rounded up to the nanosecond.
        assert_eq!(
            serialization_time(1, 3_000_000_000),
            Duration::from_nanos(3)
        );
    }

    #[test]
    fn back_to_back_datagrams_are_spaced_by_serialization() {
        let cfg = DirectionConfig::default()
            .with_rate(10_000_000)
            .with_delay(ms(1));
        let mut d = Direction::new(cfg, 1);
        let out = run(&mut d, packets(10, 1000, |_| Duration::ZERO));
        assert_eq!(out.len(), 10);
        for (k, del) in out.iter().enumerate() {
            let expect = ms(1) + Duration::from_nanos(822_400 * (k as u64 + 1));
            assert_eq!(del.at, expect, "datagram {k}");
            assert_eq!(del.data[0], (k % 251) as u8 + 1, "FIFO order");
        }
        assert_eq!(d.counters().delivered, 0, "counted only when accepted");
        assert!(out.iter().all(|o| d.accept_delivery(o.epoch, o.data.len())));
        assert_eq!(d.counters().delivered, 10);
        assert_eq!(d.counters().delivered_bytes, 10_000);
    }

    #[test]
    fn idle_link_delivers_after_serialization_plus_delay() {
        let cfg = DirectionConfig::default()
            .with_rate(1_000_000)
            .with_delay(ms(5));
        let mut d = Direction::new(cfg, 1);
        // Far apart: no queueing.
        let out = run(&mut d, packets(3, 97, |i| ms(100 * i as u64)));
        let ser = Duration::from_micros(1000); // 125 bytes at 1 Mbit/s
        let got: Vec<_> = out.iter().map(|o| o.at).collect();
        assert_eq!(
            got,
            vec![ser + ms(5), ms(100) + ser + ms(5), ms(200) + ser + ms(5)]
        );
    }

    /// A slow route's datagram lost in flight when the link went down holds back nothing sent
    /// after the link came back over a fast one.
    #[test]
    fn what_was_lost_on_the_wire_holds_back_nothing_after_the_link_is_back() {
        let mut d = Direction::new(DirectionConfig::ideal(ms(200)), 1);
        let before = run(&mut d, packets(1, 100, |_| ms(0)));
        assert_eq!(before[0].at, ms(200));
        d.set_status(LinkStatus::Down);
        assert!(d
            .set_config(ms(10), DirectionConfig::ideal(ms(1)))
            .is_none());
        d.set_status(LinkStatus::Up);
        let after = run(&mut d, packets(1, 100, |_| ms(20)));
        assert_eq!(after[0].at, ms(21));
        assert!(!d.accept_delivery(before[0].epoch, 100), "lost in flight");
    }

    #[test]
    fn drop_tail_queue_drops_beyond_limit() {
        let cfg = DirectionConfig::default()
            .with_rate(1_000_000)
            .with_queue_limit(10 * 1028);
        let mut d = Direction::new(cfg, 1);
        let out = run(&mut d, packets(20, 1000, |_| Duration::ZERO));
        // One is serialized at once, ten wait, nine find the queue full.
        assert_eq!(out.len(), 11);
        assert_eq!(d.counters().dropped_queue, 9);
        assert_eq!(d.counters().offered, 20);
        let firsts: Vec<u8> = out.iter().map(|o| o.data[0]).collect();
        assert_eq!(firsts, (1..=11).collect::<Vec<u8>>(), "the tail is dropped");
    }

    #[test]
    fn queue_frees_as_it_drains() {
        let cfg = DirectionConfig::default()
            .with_rate(8_000_000) // 1028 bytes = 1028 µs
            .with_queue_limit(2 * 1028);
        let mut d = Direction::new(cfg, 1);
        // One datagram every 1028 µs at exactly the drain rate never overflows a queue of 2.
        let out = run(&mut d, packets(100, 1000, |i| us(1028 * i as u64)));
        assert_eq!(out.len(), 100);
        assert_eq!(d.counters().dropped_queue, 0);
    }

    #[test]
    fn loss_probability_matches() {
        let cfg = DirectionConfig::default().with_loss(0.1);
        let mut d = Direction::new(cfg, 42);
        let out = run(&mut d, packets(10_000, 100, |i| us(10 * i as u64)));
        let lost = 10_000 - out.len();
        // Binomial(10000, 0.1): sd = 30; allow 4 sd.
        assert!((880..=1120).contains(&lost), "lost {lost}");
        assert_eq!(d.counters().dropped_loss, lost as u64);
    }

    #[test]
    fn duplication_rate_matches() {
        let cfg = DirectionConfig::default().with_duplicate(0.05);
        let mut d = Direction::new(cfg, 7);
        let out = run(&mut d, packets(10_000, 200, |i| us(10 * i as u64)));
        let dups = out.len() - 10_000;
        // Binomial(10000, 0.05): sd = 22.
        assert!((410..=590).contains(&dups), "duplicates {dups}");
        assert_eq!(d.counters().duplicated, dups as u64);
    }

    #[test]
    fn corrupted_datagrams_are_discarded_by_the_udp_checksum() {
        let cfg = DirectionConfig::default().with_corrupt(0.02);
        let mut d = Direction::new(cfg, 8);
        let sends = packets(10_000, 200, |i| us(10 * i as u64));
        let originals: Vec<Vec<u8>> = sends.iter().map(|s| s.1.clone()).collect();
        let out = run(&mut d, sends);
        // Binomial(10000, 0.02): sd = 14
        let corrupted = d.counters().corrupted;
        assert!((140..=260).contains(&corrupted), "corrupted {corrupted}");
        assert_eq!(out.len() as u64, 10_000 - corrupted);
        assert!(
            out.iter().all(|o| originals.contains(&o.data)),
            "none damaged"
        );
    }

    #[test]
    fn jitter_never_reorders_without_reordering() {
        let cfg = DirectionConfig::default()
            .with_delay(ms(10))
            .with_jitter(ms(5));
        let mut d = Direction::new(cfg, 3);
        let out = run(&mut d, packets(2000, 100, |i| us(50 * i as u64)));
        assert_eq!(out.len(), 2000);
        assert!(out.windows(2).all(|w| w[0].at <= w[1].at));
        let firsts: Vec<u8> = out.iter().map(|o| o.data[0]).collect();
        let expect: Vec<u8> = (0..2000).map(|i| (i % 251) as u8 + 1).collect();
        assert_eq!(firsts, expect);
        // The jitter is actually applied.
        let spread =
            out.iter().map(|o| o.at).max().unwrap() - out.iter().map(|o| o.at).min().unwrap();
        assert!(spread > us(50 * 1999));
    }

    #[test]
    fn reordering_lets_later_datagrams_overtake() {
        let cfg = DirectionConfig::default()
            .with_delay(ms(2))
            .with_reorder(0.05);
        let mut d = Direction::new(cfg, 5);
        let out = run(&mut d, packets(2000, 100, |i| us(100 * i as u64)));
        assert_eq!(out.len(), 2000);
        let inversions = out.windows(2).filter(|w| w[0].at > w[1].at).count();
        let reordered = d.counters().reordered as usize;
        assert!((60..=140).contains(&reordered), "reordered {reordered}");
        assert!(
            inversions > 20 && inversions <= reordered,
            "inversions {inversions}"
        );
    }

    #[test]
    fn down_drops_queued_and_in_flight_and_new_datagrams() {
        let cfg = DirectionConfig::default()
            .with_rate(1_000_000)
            .with_delay(ms(50));
        let mut d = Direction::new(cfg, 1);
        let mut out = Vec::new();
        let tx = d.send(Duration::ZERO, vec![1; 1000]).unwrap();
        for _ in 0..4 {
            assert!(d.send(Duration::ZERO, vec![2; 1000]).is_none());
        }
        // The first one is serialized and on the wire; four wait.
        let next = d.tx_done(tx.gen, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        d.set_status(LinkStatus::Down);
        assert_eq!(d.queued_bytes(), 0);
        assert_eq!(d.queued_datagrams(), 0);
        // The pending completion is stale now.
        assert!(d.tx_done(next.gen, &mut out).is_none());
        assert_eq!(out.len(), 1);
        // What was on the wire is lost.
        assert!(!d.accept_delivery(out[0].epoch, out[0].data.len()));
        // Sending while down vanishes.
        assert!(d.send(ms(10), vec![3; 10]).is_none());
        assert_eq!(d.counters().dropped_down, 5);
        assert_eq!(d.counters().dropped_in_flight, 1);
        // Back up: traffic flows again.
        d.set_status(LinkStatus::Up);
        let tx = d.send(ms(20), vec![4; 10]).unwrap();
        out.clear();
        assert!(d.tx_done(tx.gen, &mut out).is_none());
        assert_eq!(out.len(), 1);
        assert!(d.accept_delivery(out[0].epoch, 10));
    }

    #[test]
    fn blackhole_drops_like_down() {
        let mut d = Direction::new(DirectionConfig::default(), 1);
        d.set_status(LinkStatus::Blackhole);
        assert!(d.send(Duration::ZERO, vec![1; 10]).is_none());
        assert_eq!(d.counters().dropped_down, 1);
        d.set_status(LinkStatus::Down);
        d.set_status(LinkStatus::Up);
        assert!(d.send(Duration::ZERO, vec![1; 10]).is_some());
    }

    #[test]
    fn rate_change_applies_to_unserialized_datagrams() {
        // 1000 + 28 bytes at 8.224 Mbit/s = 1 ms each.
        let cfg = DirectionConfig::default()
            .with_rate(8_224_000)
            .with_delay(Duration::ZERO);
        let mut d = Direction::new(cfg, 1);
        let mut out = Vec::new();
        let tx = d.send(Duration::ZERO, vec![1; 1000]).unwrap();
        assert_eq!(tx.at, ms(1));
        for _ in 0..3 {
            d.send(Duration::ZERO, vec![2; 1000]);
        }
        // Half way through the first datagram, the rate falls to 1 %: the rest of it takes 50 ms.
        let tx2 = d.set_rate(us(500), 82_240).unwrap();
        assert_eq!(tx2.at, us(500) + ms(50));
        assert!(
            d.tx_done(tx.gen, &mut out).is_none(),
            "old completion is stale"
        );
        let mut pending = Some(tx2);
        while let Some(tx) = pending {
            pending = d.tx_done(tx.gen, &mut out);
        }
        let got: Vec<_> = out.iter().map(|o| o.at).collect();
        assert_eq!(got, vec![us(50_500), us(150_500), us(250_500), us(350_500)]);
    }

    #[test]
    fn same_seed_same_deliveries() {
        let cfg = DirectionConfig::default()
            .with_rate(50_000_000)
            .with_delay(ms(3))
            .with_jitter(ms(1))
            .with_loss(0.05)
            .with_duplicate(0.02)
            .with_corrupt(0.02)
            .with_reorder(0.03)
            .with_queue_limit(20_000);
        let sends = || packets(5000, 1200, |i| us(150 * i as u64));
        let a = run(&mut Direction::new(cfg.clone(), 99), sends());
        let b = run(&mut Direction::new(cfg.clone(), 99), sends());
        assert_eq!(a, b);
        let c = run(&mut Direction::new(cfg, 100), sends());
        assert_ne!(a, c);
    }

    #[test]
    fn network_routes_only_matching_pairs() {
        let net = Network::new(
            &[
                LinkConfig::default(),
                LinkConfig::default(),
                LinkConfig::default(),
            ],
            1,
        );
        assert_eq!(net.len(), 3);
        for i in 0..3 {
            let (a, b) = (host_addr(HostId::A, i), host_addr(HostId::B, i));
            assert_eq!(net.route(HostId::A, a, b), Some(i));
            assert_eq!(net.route(HostId::B, b, a), Some(i));
            assert_eq!(net.route(HostId::B, a, b), None);
        }
        let a0 = host_addr(HostId::A, 0);
        assert_eq!(net.route(HostId::A, a0, host_addr(HostId::B, 1)), None);
        assert_eq!(
            net.route(HostId::A, host_addr(HostId::A, 3), host_addr(HostId::B, 3)),
            None
        );
        assert_eq!(a0.to_string(), "10.0.0.1:5000");
        assert_eq!(host_addr(HostId::B, 2).to_string(), "10.2.0.2:6000");
    }

    #[test]
    fn an_ideal_direction_delivers_everything_after_exactly_its_delay() {
        let mut d = Direction::new(DirectionConfig::ideal(us(500)), 1);
        // a burst far beyond any queue, all at one instant, then one more later
        let mut sends = packets(10_000, MAX_DATAGRAM, |_| Duration::ZERO);
        sends.push((ms(3), vec![9; 10]));
        let out = run(&mut d, sends);
        assert_eq!(out.len(), 10_001);
        assert!(out[..10_000].iter().all(|o| o.at == us(500)));
        assert_eq!(out[10_000].at, ms(3) + us(500));
        let firsts: Vec<u8> = out[..10_000].iter().map(|o| o.data[0]).collect();
        let expect: Vec<u8> = (0..10_000).map(|i| (i % 251) as u8 + 1).collect();
        assert_eq!(firsts, expect, "in order");
    }

    #[test]
    fn a_network_carries_a_datagram_between_the_addresses_of_its_link() {
        let (a, b): (SocketAddr, SocketAddr) = (
            "127.0.0.1:5000".parse().unwrap(),
            "127.0.0.1:6000".parse().unwrap(),
        );
        let links = [LinkConfig::ideal(ms(1)), LinkConfig::ideal(ms(2))];
        let addrs = [(host_addr(HostId::A, 0), host_addr(HostId::B, 0)), (a, b)];
        let mut net = Network::with_addrs(&links, &addrs, 1);
        let mut events = Vec::new();
        let mut schedule = |at, ev| events.push((at, ev));
        assert_eq!(
            net.send(ms(1), HostId::B, b, a, vec![7; 10], &mut schedule),
            Some(1)
        );
        assert_eq!(
            net.send(ms(1), HostId::B, a, b, vec![7; 10], &mut schedule),
            None
        );
        let mut arrivals = Vec::new();
        while let Some((at, ev)) = events.pop() {
            let mut later = Vec::new();
            if let Some(arrival) = net.handle(ev, &mut |t, e| later.push((t, e))) {
                arrivals.push((at, arrival));
            }
            events.extend(later);
        }
        let expect = Arrival {
            link: 1,
            dir: Dir::BToA,
            local: a,
            remote: b,
            data: vec![7; 10],
        };
        assert_eq!(arrivals, vec![(ms(3), expect)]);
    }

    #[test]
    fn network_directions_are_independent() {
        let cfg = DirectionConfig::default().with_loss(0.5);
        let mut net = Network::new(&[LinkConfig::symmetric(cfg)], 9);
        let mut fates = [Vec::new(), Vec::new()];
        for dir in [Dir::AToB, Dir::BToA] {
            let d = net.direction_mut(0, dir);
            for i in 0..64u64 {
                let mut out = Vec::new();
                let tx = d.send(ms(i), vec![1; 10]).unwrap();
                d.tx_done(tx.gen, &mut out);
                fates[dir.index()].push(out.len());
            }
        }
        assert_ne!(fates[0], fates[1]);
    }
}
