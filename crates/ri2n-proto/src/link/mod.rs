//! One link of a connection: a (local address, remote address) path with its own packet-number
//! space in each direction, RTT estimate, loss detection, congestion window, pacer and health.
//! Loss is judged per link, so data that overtakes on a faster link never looks lost.
//!
//! Each part owns its state ([`recovery`], [`probing`], [`arrivals`], [`AckState`], the RTT
//! estimate, delivery rate, congestion control, path MTU discovery, and the link's side of the
//! connection's health detectors in [`health`]); `Link` ties them together in the health state
//! machine of docs/PROTOCOL.md §6 (transitions: §6.1) and in the handling of a sent,
//! acknowledged or lost packet.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::ack::{AckState, Eliciting};
use crate::congestion::{Congestion, Pacer};
use crate::pmtu::PathMtu;
use crate::{ConnectionConfig, LinkId};

mod arrivals;
mod health;
mod probing;
mod rate;
mod recovery;
mod rtt;
mod sent;

use arrivals::Arrivals;
pub(crate) use health::{ShareDetector, SlowLinkCheck};
use probing::Probing;
use rate::DeliveryRate;
pub(crate) use recovery::AckOutcome;
use recovery::Recovery;
pub(crate) use rtt::Rtt;
use rtt::GRANULARITY;
pub(crate) use sent::{SentFrame, SentPacket};

/// A round trip longer than twice the path's base by this much, with at least
/// [`QUEUE_BYTES`] in flight, shows a standing queue at the path's bottleneck: the link
/// delivers all it can (see [`Link::on_ack`]).
const QUEUE_MARGIN: Duration = Duration::from_millis(1);
/// See [`QUEUE_MARGIN`]: a lone packet behind another flow's queue says nothing of the rate.
const QUEUE_BYTES: u64 = 64 << 10;

/// Least time a measured delivery rate is trusted without a new sample, for a link that
/// holds none of our data (see [`Link::delivery_rate`]).
const RATE_TRUST: Duration = Duration::from_millis(20);

/// Health of a link as the sender judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkState {
    /// Newly opened; waiting for its first acknowledgements. Carries only probes.
    Validating,
    /// Healthy: carries data.
    Up,
    /// Alive but far slower than it was (a soft failure). Carries only probes.
    Degraded,
    /// Nothing gets through. Probed every `probe_interval`.
    Down,
}

impl std::fmt::Display for LinkState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LinkState::Validating => "validating",
            LinkState::Up => "up",
            LinkState::Degraded => "degraded",
            LinkState::Down => "down",
        })
    }
}

/// Statistics of one link.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LinkStats {
    /// The link's ID in its connection.
    pub id: LinkId,
    /// Local address.
    pub local: SocketAddr,
    /// Remote address.
    pub remote: SocketAddr,
    /// Current state.
    pub state: LinkState,
    /// Smoothed round-trip time.
    pub srtt: Duration,
    /// Smallest round-trip time seen.
    pub min_rtt: Duration,
    /// Congestion window in bytes.
    pub cwnd: u64,
    /// Bytes in flight (sent, neither acknowledged nor lost).
    pub bytes_in_flight: u64,
    /// Datagram bytes sent on the link.
    pub bytes_sent: u64,
    /// Datagram bytes received on the link.
    pub bytes_received: u64,
    /// Packets sent.
    pub packets_sent: u64,
    /// Packets received.
    pub packets_received: u64,
    /// Packets declared lost (including those re-sent elsewhere when the link failed).
    pub packets_lost: u64,
    /// Stream bytes sent on this link (first transmissions and repairs).
    pub stream_bytes_sent: u64,
    /// Stream bytes the peer acknowledged in packets sent on this link: what this link
    /// delivered. A repair counts on the link that delivered it; a byte that arrived twice
    /// (a repair of a packet only late, not lost) counts on both links.
    pub stream_bytes_acked: u64,
    /// Size of a full data packet now (UDP payload bytes; grows with path MTU discovery).
    pub max_datagram: usize,
    /// ICMP "port unreachable" answers to this link's packets (ones that quoted a packet the
    /// link sent): each made the connection ask whether the peer is still there.
    pub refusals: u32,
    /// Whether the packet counts, `max_datagram` and `refusals` are kept. False on a transport
    /// outside this engine (the TCP transport: the kernel's TCP packs the bytes), where they
    /// stay 0 and a report should show them as unknown rather than as none.
    pub counts_packets: bool,
}

impl LinkStats {
    /// A link's statistics with every count zero, for a transport outside this engine (the
    /// TCP transport) to fill in.
    pub fn new(id: LinkId, local: SocketAddr, remote: SocketAddr, state: LinkState) -> Self {
        Self {
            id,
            local,
            remote,
            state,
            srtt: Duration::ZERO,
            min_rtt: Duration::ZERO,
            cwnd: 0,
            bytes_in_flight: 0,
            bytes_sent: 0,
            bytes_received: 0,
            packets_sent: 0,
            packets_received: 0,
            packets_lost: 0,
            stream_bytes_sent: 0,
            stream_bytes_acked: 0,
            max_datagram: 0,
            refusals: 0,
            counts_packets: false,
        }
    }

    /// The smoothed round-trip time, if it means something now: not for a link that is down
    /// (its last estimate is stale) nor before the first sample.
    pub fn current_rtt(&self) -> Option<Duration> {
        (self.state != LinkState::Down && !self.min_rtt.is_zero()).then_some(self.srtt)
    }

    /// The smallest round-trip time, once there is one.
    pub fn measured_min_rtt(&self) -> Option<Duration> {
        (!self.min_rtt.is_zero()).then_some(self.min_rtt)
    }
}

/// What a packet that arrived on a link carried, for its bookkeeping.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrival {
    /// It asks for an acknowledgement.
    pub ack_eliciting: bool,
    /// It carried more than a PING (data, datagrams, control frames): the peer is sending,
    /// and its falling silent afterwards is worth a PING (PROTOCOL.md §6.3). A bare PING
    /// does not count: two idle ends would otherwise answer each other's PINGs for ever.
    pub sending: bool,
    /// Its datagram's length.
    pub size: usize,
}

/// What a link carried, for [`LinkStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub packets_sent: u64,
    pub packets_received: u64,
    pub packets_lost: u64,
    pub stream_bytes_sent: u64,
    pub stream_bytes_acked: u64,
}

#[derive(Debug)]
pub(crate) struct Link {
    pub id: LinkId,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub state: LinkState,
    /// Path MTU discovery on this link: its current size is the size of a full data packet.
    pub pmtu: PathMtu,
    /// Opened by the peer's packets from an address pair we never chose: until it is
    /// validated, it may send at most three times the bytes it received (so a spoofed source
    /// address cannot turn us into a traffic reflector).
    pub peer_opened: bool,
    /// Leads to an address only the peer's word (its ACCEPT) vouches for, and no probe was
    /// answered there yet: every probe stays small until one is (a peer listing someone
    /// else's address must not turn us into a sender of full datagrams to it).
    pub unproven_address: bool,
    /// "Port unreachable" answers from the peer's host to this link's datagrams (ICMP that
    /// quotes one of them): counted towards giving up a handshake.
    pub port_unreachable: u32,

    // --- sending ---
    pub recovery: Recovery,
    pub rtt: Rtt,
    rate: DeliveryRate,
    pub cc: Congestion,
    pub pacer: Pacer,
    /// Probing while not up.
    pub probing: Probing,

    // --- receiving ---
    pub arrivals: Arrivals,
    /// What arrived from the peer on this link, and the acknowledgement owed for it.
    pub ack: AckState,
    /// The receiver-side arrival-share detector's view of this link.
    pub share: ShareDetector,
    /// The sender-side slow-link check's view of this link.
    pub slow_check: SlowLinkCheck,

    pub counters: Counters,
}

impl Link {
    /// A new link: datagrams of the configured size, or what the local address's interface
    /// can send if that is less (IPv6 headers are 20 bytes larger than IPv4's: on a 1500-byte
    /// MTU an IPv6 link carries 1452 bytes, not the default 1472), growing (path MTU discovery)
    /// up to what the interface can send.
    pub fn open(
        cfg: &ConnectionConfig,
        local_mtus: &[(SocketAddr, usize)],
        id: LinkId,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Self {
        let (base, ceiling) = datagram_limits(cfg, local_mtus, local);
        Self::new(id, local, remote, PathMtu::new(base, ceiling))
    }

    /// The MTU of the link's local interface changed (`local_mtus` holds the new one, or none):
    /// its path MTU discovery searches again within the limits that gives.
    pub fn interface_changed(
        &mut self,
        cfg: &ConnectionConfig,
        local_mtus: &[(SocketAddr, usize)],
    ) {
        let (base, ceiling) = datagram_limits(cfg, local_mtus, self.local);
        if self.pmtu.set_limits(base, ceiling) {
            tracing::debug!(link = %self.id, base, ceiling, "interface MTU changed");
            self.mss_changed();
        }
    }

    /// A link whose datagrams start at `pmtu`'s base size (not probed until told when).
    pub fn new(id: LinkId, local: SocketAddr, remote: SocketAddr, pmtu: PathMtu) -> Self {
        let mss = pmtu.current();
        Self {
            id,
            local,
            remote,
            state: LinkState::Validating,
            pmtu,
            peer_opened: false,
            unproven_address: false,
            port_unreachable: 0,
            recovery: Recovery::default(),
            rtt: Rtt::new(),
            rate: DeliveryRate::default(),
            cc: Congestion::new(mss),
            pacer: Pacer::new(mss),
            probing: Probing::default(),
            arrivals: Arrivals::default(),
            ack: AckState::default(),
            share: ShareDetector::default(),
            slow_check: SlowLinkCheck::default(),
            counters: Counters::default(),
        }
    }

    /// Moves a link the peer opened, and no answer has validated yet, to another address
    /// pair (see `Connection::handle_short`): what it measured of the old path goes, and it
    /// probes the new one at once; its packet numbers and what it received stay (numbers
    /// are never reused, and packets seen before stay duplicates).
    pub fn rebind(
        &mut self,
        now: Instant,
        cfg: &ConnectionConfig,
        local_mtus: &[(SocketAddr, usize)],
        local: SocketAddr,
        remote: SocketAddr,
    ) {
        let fresh = Link::open(cfg, local_mtus, self.id, local, remote);
        (self.local, self.remote, self.pmtu) = (local, remote, fresh.pmtu);
        self.mss_changed();
        (self.rtt, self.arrivals, self.port_unreachable) = (fresh.rtt, fresh.arrivals, 0);
        self.probing.next = Some(now);
    }

    /// Path MTU discovery may have changed the datagram size: the congestion controller
    /// counts in full packets of the new size from now on.
    fn mss_changed(&mut self) {
        let mss = self.mss();
        if self.cc.mss() != mss {
            tracing::debug!(link = %self.id, mss, "datagram size");
            self.cc.set_mss(mss);
        }
    }

    /// Size of a full data packet now.
    pub fn mss(&self) -> usize {
        self.pmtu.current()
    }

    /// The size of a path MTU probe to send now, if one is due (up links only).
    pub fn mtu_probe_due(&mut self, now: Instant) -> Option<usize> {
        if !self.is_up() {
            return None;
        }
        self.pmtu.probe_due(now)
    }

    pub fn is_up(&self) -> bool {
        self.state == LinkState::Up
    }

    pub fn bytes_in_flight(&self) -> u64 {
        self.recovery.bytes_in_flight
    }

    /// Probe timeout: how long to wait for any acknowledgement before probing.
    pub fn pto(&self, cfg: &ConnectionConfig) -> Duration {
        (self.rtt.pto_span() + cfg.max_ack_delay).max(cfg.min_pto)
    }

    /// Whether a full-size data packet fits the window and the pacer allows it now;
    /// otherwise when it may (None: window full, wait for acknowledgements).
    pub fn send_allowance(&mut self, now: Instant) -> Result<(), Option<Instant>> {
        if self.bytes_in_flight() + self.mss() as u64 > self.cc.window() {
            return Err(None);
        }
        let slow_start = self.cc.in_slow_start();
        match self.pacer.delay(
            now,
            self.mss(),
            self.mss(),
            self.cc.window(),
            self.rtt.srtt,
            slow_start,
        ) {
            None => Ok(()),
            Some(t) => Err(Some(t)),
        }
    }

    /// Records a packet of `size` datagram bytes sent on this link; returns its number.
    pub fn on_sent(&mut self, now: Instant, size: usize, pkt: SentPacket) -> u64 {
        self.counters.packets_sent += 1;
        self.counters.bytes_sent += size as u64;
        if pkt.in_flight {
            self.pacer.on_sent(size);
            if self.bytes_in_flight() == 0 {
                // the link was idle: the time it had nothing to deliver is no part of its rate
                self.rate.restart(now);
            }
        }
        self.recovery.on_sent(now, pkt)
    }

    /// Processes the ranges of an ACK frame for this link.
    pub fn on_ack(
        &mut self,
        now: Instant,
        ranges: impl Iterator<Item = (u64, u64)>,
        largest: u64,
        ack_delay: Duration,
        out: &mut AckOutcome,
    ) {
        let (acked_from, late_from) = (out.acked.len(), out.acked_late.len());
        let Some(acked) = self.recovery.on_ack(now, ranges, largest, out) else {
            return;
        };
        let mut largest_acked = 0;
        for pkt in &out.acked[acked_from..] {
            let size = u64::from(pkt.size);
            if pkt.in_flight {
                self.rate.on_delivered(size);
                // whether the window was in use is judged once for the frame, by what was in
                // flight when it came (PROTOCOL.md §7.1): counted down packet by packet, the
                // later packets of a frame acknowledging most of the window would not let it
                // grow, and slow start would not double it
                self.cc.on_ack(size, pkt.time, acked.in_flight_before);
            }
            if pkt.probe && usize::from(pkt.size) >= self.pmtu.base() {
                self.probing.on_full_probe_acked();
            }
            if pkt.mtu_probe {
                self.pmtu.on_probe_acked(usize::from(pkt.size), now);
                self.mss_changed();
            } else if pkt.in_flight {
                self.pmtu.on_packet_acked(usize::from(pkt.size));
                largest_acked = largest_acked.max(usize::from(pkt.size));
            }
            self.counters.stream_bytes_acked += stream_bytes(&pkt.frames);
        }
        for frames in &out.acked_late[late_from..] {
            self.counters.stream_bytes_acked += stream_bytes(frames);
        }
        let regular_sample = matches!(acked.newest, Some((pn, _, true)) if pn == acked.largest);
        match (regular_sample, acked.newest_late) {
            // the round trip grew beyond what the estimate allowed for: learn it. Only from
            // the frame's largest: a late packet below it may have been acknowledged long
            // after it arrived (after an outage, the first ACK lists again what the outage
            // had us write off, and its age is the outage's)
            (false, Some((pn, sent))) if pn == acked.largest => {
                self.rtt
                    .update(now.saturating_duration_since(sent), ack_delay);
            }
            _ => {}
        }
        let Some((_, sent_time, _)) = acked.newest else {
            if acked.ack_only_raised_largest {
                self.detect_lost(now, out, 0);
            }
            return;
        };
        if regular_sample {
            self.rtt.update(now - sent_time, ack_delay);
        } else if !self.rtt.has_sample() && acked.newest_is_new {
            // The largest number acknowledged was an acknowledgement-only packet, which is not
            // kept, so it cannot be timed (RFC 9002 §5.1 would). On a link that mostly
            // acknowledges the peer's data, probes and PINGs are acknowledged that way: time
            // the newest of them instead, for a first sample at least. The frame's delay is
            // the largest's, so none is subtracted: the sample may be up to the peer's
            // acknowledgement delay long. (Without it the link came up counting 100 ms, and
            // the scheduler left it alone beside a measured one.)
            self.rtt.update(now - sent_time, Duration::ZERO);
        }
        // Not using its window when the acknowledgement came: it delivered what it was given.
        // (Judged on what was in flight before it, not after: a window of two large datagrams,
        // as on loopback, would otherwise never look unused, and a ping-pong's rate of a
        // message per round trip was taken for all the link can do.) Nor does a window still
        // in slow start say what the link can do: it is what the window allowed so far, and
        // taken for the link's rate, it kept the scheduler from giving the link the data
        // that would have grown the window (a server's link carried a trickle of its 1 MiB
        // replies for a whole ping-pong).
        let app_limited = acked.in_flight_before < self.cc.window() / 2 || self.cc.in_slow_start();
        // Unless a standing queue shows the bottleneck busy (see `DeliveryRate::sample`): the
        // link then delivers what it can, however little of its window it uses. A loss-based
        // window grows to fill a deep queue (a token-bucket shaper's) far beyond what a
        // message puts in flight; judged by the window alone, such a link was never measured,
        // and its window's rate, a multiple of the real one, split each message unevenly
        // between the links.
        let queued = self.rtt.latest > self.base_rtt() * 2 + QUEUE_MARGIN
            && acked.in_flight_before >= QUEUE_BYTES;
        self.rate
            .sample(now, self.rtt.srtt.max(GRANULARITY), app_limited, queued);
        self.detect_lost(now, out, largest_acked);
    }

    /// Delivery rate in bytes per second: measured while the link used its window, else what
    /// the window allows per round trip. Samples of a link that never had to use its window
    /// (it was given little: a faster link took most) say what it was given, not what it can
    /// deliver: they may raise the window's estimate but not lower it, or a link once given a
    /// trickle would look too slow to be given more, for good.
    ///
    /// A measurement is trusted only while it is renewed: a link that holds none of our data
    /// and took no sample for [`RATE_TRUST`] (or 8 round trips) counts its window's rate again.
    /// The scheduler gives data only to links whose rate promises an early arrival, and only
    /// data brings samples: one low measurement (a window acknowledged across a stall of the
    /// receiver) would otherwise shut a healthy link out for the rest of the connection.
    pub fn delivery_rate(&self, now: Instant) -> f64 {
        let window_rate = self.cc.window() as f64 / self.rtt.srtt.as_secs_f64().max(1e-6);
        match self.rate.measured() {
            Some(rate) if self.rate.measured_busy() && !self.rate_is_stale(now) => rate,
            Some(rate) => rate.max(window_rate),
            None => window_rate,
        }
    }

    /// See [`Self::delivery_rate`].
    fn rate_is_stale(&self, now: Instant) -> bool {
        let trust = (self.rtt.srtt * 8).max(RATE_TRUST);
        !self.recovery.data_in_flight()
            && self
                .rate
                .sampled_at()
                .is_none_or(|t| now.saturating_duration_since(t) > trust)
    }

    /// When the acknowledgement of the oldest packet in flight was due at the latest, queueing
    /// aside: its sending, the path's round trip without queueing and the peer's longest
    /// acknowledgement delay (`ack_delay`) later.
    pub fn ack_due(&self, ack_delay: Duration) -> Option<Instant> {
        (self.recovery.oldest_outstanding_sent()).map(|sent| sent + self.base_rtt() + ack_delay)
    }

    /// When an acknowledgement last came for one of its packets.
    pub fn last_acked(&self) -> Option<Instant> {
        self.recovery.last_ack_time
    }

    /// Whether RTT and delivery rate rest on measurements rather than initial assumptions.
    pub fn is_measured(&self) -> bool {
        self.rtt.has_sample() && self.rate.measured_busy()
    }

    /// The path's round-trip time without queueing: the smallest seen (smoothed before any).
    pub fn base_rtt(&self) -> Duration {
        self.rtt.base()
    }

    /// When a full-size packet sent now would arrive, in seconds from now: the path's base
    /// latency plus the time to deliver what is already in flight ahead of it. (Plain seconds:
    /// the scheduler compares these for every packet it places.)
    pub fn eta(&self, now: Instant) -> f64 {
        self.eta_at(self.delivery_rate(now))
    }

    /// [`Self::eta`] given the link's [`Self::delivery_rate`].
    pub fn eta_at(&self, delivery_rate: f64) -> f64 {
        let base = self.base_rtt().as_secs_f64();
        let queued = (self.bytes_in_flight() + self.mss() as u64) as f64 / delivery_rate;
        base / 2.0 + queued.min(3600.0)
    }

    /// Loss detection; applies each loss to the window, the path MTU and the counters. A loss
    /// that an acknowledgement of a packet at least as large reveals (`largest_acked`, in
    /// bytes) says nothing of the path MTU: packets of its size get through, and a burst of
    /// them lost is congestion (a slow start overshooting a queue), not a black hole.
    fn detect_lost(&mut self, now: Instant, out: &mut AckOutcome, largest_acked: usize) {
        let from = out.lost.len();
        self.recovery.detect_lost(now, &self.rtt, out);
        if out.lost.len() > from {
            tracing::debug!(
                link = %self.id,
                lost = out.lost.len() - from,
                largest_acked = self.recovery.largest_acked(),
                "packets lost"
            );
        }
        for pkt in &out.lost[from..] {
            if pkt.mtu_probe {
                // not a congestion signal: the size may just be too large for the path
                self.pmtu.on_probe_lost(usize::from(pkt.size), now);
                continue;
            }
            self.counters.packets_lost += 1;
            if pkt.in_flight {
                self.cc.on_loss(pkt.time, now);
                let size = usize::from(pkt.size);
                if size > largest_acked && self.pmtu.on_packet_lost(size) {
                    self.mss_changed();
                }
            }
        }
    }

    /// Declares everything in flight lost (the link failed): it will be re-sent elsewhere,
    /// its datagrams included (`out.stranded`).
    pub fn drain_in_flight(&mut self, out: &mut AckOutcome) {
        let from = out.lost.len();
        self.recovery.drain(out);
        for pkt in &mut out.lost[from..] {
            if !pkt.mtu_probe {
                self.counters.packets_lost += 1;
            }
            for f in std::mem::take(&mut pkt.frames) {
                match f {
                    SentFrame::Datagram(piece) => out.stranded.push(piece),
                    f => pkt.frames.push(f),
                }
            }
        }
    }

    /// When loss detection's time threshold declares the oldest waiting packet lost.
    pub fn loss_deadline(&self) -> Option<Instant> {
        self.recovery.loss_deadline()
    }

    /// When the next probe of this link (not up) is due, if it may be sent.
    pub fn probe_deadline(&self) -> Option<Instant> {
        if self.state != LinkState::Up && self.within_amplification_limit() {
            self.probing.next
        } else {
            None
        }
    }

    /// When the probe timeout fires (up links with packets in flight).
    pub fn pto_deadline(&self, cfg: &ConnectionConfig) -> Option<Instant> {
        if self.state != LinkState::Up {
            return None;
        }
        self.recovery.pto_deadline(self.pto(cfg))
    }

    /// Whether `other` got an acknowledgement for something sent after this link's oldest
    /// unacknowledged packet: the peer is alive and answering, just not on this link. Then
    /// this link's silence is its own, and a few probe timeouts declare it down. Without such
    /// proof the silence may be the whole peer's or the network's (a process not scheduled
    /// for tens of milliseconds on a busy machine, every link gone at once): the link must
    /// then also have been silent for a while (see [`Recovery::on_pto`]).
    pub fn heard_after_silence(&self, other: &Link) -> bool {
        self.recovery.heard_after_silence(&other.recovery)
    }

    /// Runs the loss timer. Lost packets are appended to `out`.
    pub fn on_loss_timer(&mut self, now: Instant, out: &mut AckOutcome) {
        if self.loss_deadline().is_some_and(|t| t <= now) {
            self.detect_lost(now, out, 0);
        }
    }

    /// Runs the probe timeout. Returns true when the link must be declared down (see
    /// [`Recovery::on_pto`]).
    pub fn on_pto_timer(
        &mut self,
        now: Instant,
        cfg: &ConnectionConfig,
        peer_silent: bool,
    ) -> bool {
        if self.pto_deadline(cfg).is_none_or(|d| d > now) {
            return false;
        }
        let down = self.recovery.on_pto(now, cfg.failure_ptos, peer_silent);
        tracing::debug!(
            link = %self.id,
            count = self.recovery.pto_count,
            peer_silent,
            down,
            pto_us = self.pto(cfg).as_micros() as u64,
            srtt_us = self.rtt.srtt.as_micros() as u64,
            rttvar_us = self.rtt.rttvar.as_micros() as u64,
            in_flight = self.bytes_in_flight(),
            since_ack_us = self
                .recovery
                .last_ack_time
                .map(|t| now.saturating_duration_since(t).as_micros() as u64),
            "probe timeout"
        );
        down
    }

    /// Leaves `Up` (or `Validating`) for `to`; the caller re-sends what was in flight.
    pub fn demote(&mut self, now: Instant, to: LinkState, cfg: &ConnectionConfig) {
        debug_assert!(to == LinkState::Down || to == LinkState::Degraded);
        self.state = to;
        self.probing.on_demoted(now, cfg);
        self.recovery.on_demoted();
        // the path may change while the link is away: find its size and its shortest round
        // trip again once it is back (a stale shortest one makes the link look queued on a
        // longer route, and look faster than it is to the scheduler)
        self.pmtu.restart();
        self.rtt.forget_min();
        self.mss_changed();
        self.restart_sending();
    }

    pub fn promote(&mut self, now: Instant, out: &mut AckOutcome) {
        self.state = LinkState::Up;
        self.probing.on_promoted(now);
        self.recovery.on_promoted(out);
        self.restart_sending();
    }

    /// Window, pacing and rate start over: what they knew may not hold for the path now.
    fn restart_sending(&mut self) {
        self.cc.reset();
        self.pacer.reset(self.mss());
        self.rate.reset();
    }

    /// Whether a probe is due on this (not up) link.
    pub fn probe_due(&self, now: Instant) -> bool {
        self.probe_deadline().is_some_and(|t| t <= now)
    }

    /// Whether this link may send a full datagram under the anti-amplification rule.
    pub fn within_amplification_limit(&self) -> bool {
        !self.address_unproven()
            || self.counters.bytes_sent + self.mss() as u64 <= 3 * self.counters.bytes_received
    }

    /// Whether the peer opened this link and has not yet shown that it answers at the
    /// link's address: the address may be another host's, spoofed (§4.4).
    pub fn address_unproven(&self) -> bool {
        self.peer_opened && !self.was_up()
    }

    /// Whether the link was ever up: validated by answered probes (or link 0 by the
    /// handshake). One never up stays unproven, and is probed slowly, also once it is down.
    pub fn was_up(&self) -> bool {
        self.probing.last_promotion().is_some()
    }

    /// A probe is about to be sent. Probes unanswered for longer than a round trip could take
    /// (at least a probe interval) count as failed and break the run of successes; probes keep
    /// going out every interval meanwhile, so a long round trip does not slow detection down.
    /// Expired probes' control frames are handed back in `out` to be sent again. Returns true
    /// when the probes of a degraded link, or of one still validating (its path dead from the
    /// start), have failed often enough for it to count as down.
    pub fn on_probe_sending(
        &mut self,
        now: Instant,
        cfg: &ConnectionConfig,
        out: &mut AckOutcome,
    ) -> bool {
        self.probing.on_sending(now, !self.was_up(), cfg);
        let patience =
            (self.rtt.srtt * 2 + self.rtt.rttvar * 4 + cfg.max_ack_delay).max(cfg.probe_interval);
        let expired = self.recovery.expire_probes(now, patience, out);
        self.probing.on_expired(expired);
        let probed = matches!(self.state, LinkState::Degraded | LinkState::Validating);
        probed && self.probing.failures() >= cfg.failure_ptos
    }

    /// Whether the probe just counted by [`Self::on_probe_sending`] is padded to full size.
    pub fn probe_is_full(&self) -> bool {
        self.probing.is_full(self.unproven_address)
    }

    /// Probes acknowledged; returns true when the link should come (back) up: enough of them,
    /// one of them full size.
    pub fn on_probes_acked(&mut self, now: Instant, n: u32) -> bool {
        if std::mem::take(&mut self.unproven_address) && self.state != LinkState::Up {
            // the address answered: the full-size probe its promotion needs goes out at once
            self.probing.next = Some(now);
        }
        self.probing.on_acked(n) && self.state != LinkState::Up
    }

    /// Seeds the RTT estimate from the handshake round trip.
    pub fn seed_rtt(&mut self, rtt: Duration) {
        self.rtt.seed(rtt);
    }

    /// When an up link needs a keepalive PING: after `keepalive_interval` without sending
    /// anything ack-eliciting, or sooner once the peer fell silent on it (see
    /// [`Arrivals::silence_deadline`]); at once on a link that came up without a round-trip
    /// sample and never carried anything ack-eliciting.
    pub fn keepalive_deadline(&self, cfg: &ConnectionConfig) -> Option<Instant> {
        let sent = self.recovery.last_ack_eliciting_sent;
        let last = sent.max(self.probing.last_promotion())?;
        if sent.is_none() && !self.rtt.has_sample() {
            // The server's first link comes up with the handshake, which gives only the
            // client a round trip. Unmeasured, the link's RTT is the initial 100 ms, so the
            // scheduler would place no data on it beside a measured link, and nothing would
            // ever measure it (the peer's data and PINGs there only draw acknowledgements).
            return Some(last);
        }
        // an interval beyond the clock's range (`Duration::MAX`): no keepalives
        let idle = last.checked_add(cfg.keepalive_interval);
        let silence = self.arrivals.silence_deadline(sent, || self.pto(cfg));
        silence.into_iter().chain(idle).min()
    }

    // --- receiving ---

    /// Records a packet from the peer. Returns false for a duplicate (see
    /// [`AckState::on_received`]).
    pub fn on_received(
        &mut self,
        now: Instant,
        pn: u64,
        arrival: Arrival,
        cfg: &ConnectionConfig,
    ) -> bool {
        let eliciting = match (arrival.ack_eliciting, arrival.sending) {
            (false, _) => Eliciting::No,
            (true, false) => Eliciting::PingOnly,
            (true, true) => Eliciting::Yes,
        };
        if !self.ack.on_received(now, pn, eliciting, cfg) {
            return false;
        }
        self.counters.packets_received += 1;
        self.counters.bytes_received += arrival.size as u64;
        self.arrivals.on_arrival(now, arrival.sending);
        if arrival.ack_eliciting {
            self.share.on_arrival();
        }
        true
    }

    pub fn stats(&self) -> LinkStats {
        let c = &self.counters;
        LinkStats {
            id: self.id,
            local: self.local,
            remote: self.remote,
            state: self.state,
            srtt: self.rtt.srtt,
            min_rtt: if self.rtt.min == Duration::MAX {
                Duration::ZERO
            } else {
                self.rtt.min
            },
            cwnd: self.cc.window(),
            bytes_in_flight: self.bytes_in_flight(),
            bytes_sent: c.bytes_sent,
            bytes_received: c.bytes_received,
            packets_sent: c.packets_sent,
            packets_received: c.packets_received,
            packets_lost: c.packets_lost,
            stream_bytes_sent: c.stream_bytes_sent,
            stream_bytes_acked: c.stream_bytes_acked,
            max_datagram: self.mss(),
            refusals: self.port_unreachable,
            counts_packets: true,
        }
    }
}

/// Stream bytes among `frames`.
fn stream_bytes(frames: &[SentFrame]) -> u64 {
    frames
        .iter()
        .map(|f| match f {
            SentFrame::Stream { chunk, .. } => chunk.len as u64,
            _ => 0,
        })
        .sum()
}

/// A link's datagram sizes from `local`: the base (the configured size, or less where the
/// interface cannot send it) and the ceiling of path MTU discovery (what the interface can
/// send, the base where discovery is off or the interface's MTU is not known).
fn datagram_limits(
    cfg: &ConnectionConfig,
    local_mtus: &[(SocketAddr, usize)],
    local: SocketAddr,
) -> (usize, usize) {
    let interface = local_max(local_mtus, local);
    let base = interface.map_or(cfg.max_datagram_size, |max| cfg.max_datagram_size.min(max));
    let ceiling = interface
        .unwrap_or(base)
        .min(crate::wire::MAX_DATAGRAM_SIZE);
    (base, if cfg.mtu_discovery { ceiling } else { base })
}

/// The largest datagram `local` sends, if `local_mtus` knows it.
fn local_max(local_mtus: &[(SocketAddr, usize)], local: SocketAddr) -> Option<usize> {
    (local_mtus.iter().find(|(a, _)| *a == local)).map(|&(_, max)| max)
}

/// Records in `local_mtus` that `local` sends datagrams of at most `max` bytes (`None`: not
/// known); returns whether that changed what it held.
pub(crate) fn set_local_max(
    local_mtus: &mut Vec<(SocketAddr, usize)>,
    local: SocketAddr,
    max: Option<usize>,
) -> bool {
    if local_max(local_mtus, local) == max {
        return false;
    }
    local_mtus.retain(|(a, _)| *a != local);
    local_mtus.extend(max.map(|m| (local, m)));
    true
}

/// A data packet of `size` bytes sent at `time`, for tests.
#[cfg(test)]
pub(crate) fn data_packet(time: Instant, size: u16) -> SentPacket {
    SentPacket {
        time,
        size,
        in_flight: true,
        ack_eliciting: true,
        probe: false,
        mtu_probe: false,
        frames: smallvec::SmallVec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::streams::Chunk;

    /// A link that is up, with datagrams of up to `ceiling` bytes once path MTU discovery
    /// confirms them.
    fn up_link(ceiling: usize) -> (Link, Instant) {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let mut link = Link::new(LinkId(1), addr, addr, PathMtu::new(1472, ceiling));
        let t0 = Instant::now();
        link.promote(t0, &mut AckOutcome::default());
        (link, t0)
    }

    /// Sends one data packet of `size` bytes at `sent`, acknowledged one `rtt` later.
    fn send_and_ack(link: &mut Link, sent: Instant, size: u16, rtt: Duration) {
        let pn = link.on_sent(sent, size.into(), data_packet(sent, size));
        let mut out = AckOutcome::default();
        link.on_ack(
            sent + rtt,
            [(pn, pn)].into_iter(),
            pn,
            Duration::ZERO,
            &mut out,
        );
        assert_eq!(out.acked.len(), 1);
    }

    /// A link that comes back over a longer route: its smallest round trip is learned anew,
    /// not kept from the old one, under which every sample would look like a standing queue.
    #[test]
    fn the_shortest_round_trip_is_learned_again_after_the_link_was_down() {
        let (mut link, t0) = up_link(1500);
        let ms = Duration::from_millis;
        send_and_ack(&mut link, t0, 1200, ms(1));
        assert_eq!(link.base_rtt(), ms(1));
        let t1 = t0 + ms(100);
        link.demote(t1, LinkState::Down, &ConnectionConfig::default());
        link.promote(t1 + ms(10), &mut AckOutcome::default());
        send_and_ack(&mut link, t1 + ms(20), 1200, ms(8));
        assert_eq!(link.base_rtt(), ms(8), "the new route's");
    }

    /// What an ACK frame proves the peer opened (the key update's confirmation) is the newest
    /// packet the link sent that the frame covers, not the frame's largest number, which a
    /// faulty peer may set beyond anything sent.
    #[test]
    fn an_ack_proves_receipt_of_sent_packets_only() {
        let (mut link, t0) = up_link(1500);
        let sent: Vec<u64> = (0..5)
            .map(|_| link.on_sent(t0, 1200, data_packet(t0, 1200)))
            .collect();
        let last = *sent.last().unwrap();
        let ack = |link: &mut Link, ranges: &[(u64, u64)]| {
            let mut out = AckOutcome::default();
            let later = t0 + Duration::from_millis(1);
            link.on_ack(
                later,
                ranges.iter().copied(),
                1000,
                Duration::ZERO,
                &mut out,
            );
            out.newest_acked
        };
        assert_eq!(
            ack(&mut link, &[(last + 100, 1000)]),
            None,
            "numbers never sent"
        );
        assert_eq!(ack(&mut link, &[(sent[1], 1000)]), Some(last));
    }

    /// A peer that received a forged packet numbered far ahead lists it in its ACK frames
    /// besides the real ranges. The largest number acknowledged is the largest of the real
    /// ones: before, it was taken as the last packet sent, so each such ACK declared lost
    /// every packet sent three or more before the last, none of which was.
    #[test]
    fn a_number_never_sent_among_the_ranges_declares_nothing_lost() {
        let (mut link, t0) = up_link(1500);
        let sent: Vec<u64> = (0..10)
            .map(|_| link.on_sent(t0, 1200, data_packet(t0, 1200)))
            .collect();
        let mut out = AckOutcome::default();
        let later = t0 + Duration::from_millis(1);
        let ranges = [(1_000_000, 1_000_000), (sent[0], sent[0])];
        link.on_ack(
            later,
            ranges.into_iter(),
            1_000_000,
            Duration::ZERO,
            &mut out,
        );
        assert_eq!(out.acked.len(), 1);
        assert!(out.lost.is_empty(), "{} declared lost", out.lost.len());
    }

    #[test]
    fn a_ping_followed_by_acknowledgements_only_is_timed() {
        // A link that mostly carries acknowledgements of the peer's data: a PING, then two
        // acknowledgement-only packets 100 µs later, all acknowledged by one frame 300 µs
        // after those.
        let (mut link, t0) = up_link(1472);
        assert!(!link.rtt.has_sample());
        link.on_sent(t0, 40, data_packet(t0, 40));
        let ack_only = |time| SentPacket {
            in_flight: false,
            ack_eliciting: false,
            ..data_packet(time, 50)
        };
        let t1 = t0 + Duration::from_micros(100);
        link.on_sent(t1, 50, ack_only(t1));
        let last = link.on_sent(t1, 50, ack_only(t1));
        let now = t1 + Duration::from_micros(300);
        link.on_ack(
            now,
            [(0, last)].into_iter(),
            last,
            Duration::ZERO,
            &mut AckOutcome::default(),
        );
        // the PING is timed: 400 µs, an upper bound (the peer may have held its answer)
        assert!(link.rtt.has_sample());
        assert_eq!(link.base_rtt(), Duration::from_micros(400));
    }

    /// A link that mostly acknowledges the peer's data: its one data packet (a window update)
    /// is lost, and the peer acknowledges the acknowledgement-only packets sent after it.
    /// Those count for the packet threshold as any packet does: the loss is declared at once,
    /// not after a probe timeout.
    #[test]
    fn acknowledgement_only_packets_acknowledged_reveal_a_loss_before_them() {
        let (mut link, t0) = up_link(1472);
        link.seed_rtt(Duration::from_millis(1));
        let lost = link.on_sent(t0, 60, data_packet(t0, 60));
        let mut last = lost;
        for _ in 0..3 {
            let mut ack_only = data_packet(t0, 50);
            (ack_only.in_flight, ack_only.ack_eliciting) = (false, false);
            last = link.on_sent(t0, 50, ack_only);
        }
        let mut out = AckOutcome::default();
        link.on_ack(
            t0 + Duration::from_micros(1100),
            [(lost + 1, last)].into_iter(),
            last,
            Duration::ZERO,
            &mut out,
        );
        assert!(out.acked.is_empty(), "nothing kept was acknowledged");
        assert_eq!(out.lost.len(), 1, "the data packet three numbers below");
        assert_eq!(link.bytes_in_flight(), 0);
    }

    #[test]
    fn a_link_given_a_trickle_keeps_its_window_rate() {
        let (mut link, t0) = up_link(1472);
        let rtt = Duration::from_micros(200);
        link.seed_rtt(rtt);
        let window_rate = link.cc.window() as f64 / rtt.as_secs_f64();
        // one packet per millisecond for 20 ms: far below what the window allows
        for k in 0..20u32 {
            send_and_ack(&mut link, t0 + Duration::from_millis(k.into()), 1472, rtt);
        }
        // what it delivered (1.5 MB/s) is what it was given, not what it can deliver
        let now = t0 + Duration::from_millis(19) + rtt;
        assert!(
            link.delivery_rate(now) >= window_rate * 0.9,
            "{} B/s, window rate {window_rate} B/s",
            link.delivery_rate(now)
        );
        assert!(!link.is_measured());
    }

    /// After an outage, the first acknowledgement may list again packets that the outage
    /// had us write off, below a newer largest that cannot be timed (an acknowledgement-only
    /// packet): their send time is the outage's start, no round trip. Only a late packet that
    /// is the frame's largest gives a sample, as a newly acknowledged one does.
    #[test]
    fn packets_written_off_in_an_outage_and_acknowledged_after_it_give_no_sample() {
        let ms = Duration::from_millis;
        let (mut link, t0) = up_link(1472);
        link.seed_rtt(ms(1));
        for i in 0..10u64 {
            let mut pkt = data_packet(t0, 1000);
            pkt.frames.push(SentFrame::Stream {
                stream: 0,
                chunk: Chunk {
                    offset: i * 960,
                    len: 960,
                    fin: false,
                },
            });
            link.on_sent(t0, 1000, pkt);
        }
        link.demote(t0 + ms(20), LinkState::Down, &ConnectionConfig::default());
        link.drain_in_flight(&mut AckOutcome::default());
        let healed = t0 + Duration::from_secs(5);
        let mut probe = data_packet(healed, 1200);
        probe.in_flight = false;
        probe.probe = true;
        let pn = link.on_sent(healed, 1200, probe);
        let mut ack_only = data_packet(healed, 60);
        (ack_only.in_flight, ack_only.ack_eliciting) = (false, false);
        let largest = link.on_sent(healed, 60, ack_only);
        assert_eq!((pn, largest), (10, 11));
        let mut out = AckOutcome::default();
        link.on_ack(
            healed + ms(1),
            [(10, 11), (0, 9)].into_iter(),
            largest,
            Duration::ZERO,
            &mut out,
        );
        assert_eq!(
            out.acked_late.len(),
            10,
            "the premise: the written-off data came"
        );
        assert!(link.rtt.srtt < ms(10), "srtt {:?}", link.rtt.srtt);
    }

    #[test]
    fn a_keepalive_in_flight_is_no_data_in_flight() {
        // the peer's report of a collapsed share is ignored for a link holding none of our data
        let (mut link, t0) = up_link(1472);
        link.on_sent(t0, 40, data_packet(t0, 40)); // a PING: no frames to keep
        assert!(link.bytes_in_flight() > 0);
        assert!(!link.recovery.data_in_flight());
        let mut pkt = data_packet(t0, 1000);
        pkt.frames.push(SentFrame::Stream {
            stream: 0,
            chunk: Chunk {
                offset: 0,
                len: 960,
                fin: false,
            },
        });
        link.on_sent(t0, 1000, pkt);
        assert!(link.recovery.data_in_flight());
    }

    /// A burst of large packets lost among large ones acknowledged (a slow start overshooting
    /// a queue) keeps the discovered size; large packets lost while only small ones get
    /// through (a black hole) take the link back to the base size. Before, any 8 large
    /// losses in one acknowledgement did.
    #[test]
    fn a_burst_of_congestion_losses_is_no_black_hole() {
        for black_hole in [false, true] {
            let (mut link, t0) = up_link(16_384);
            link.pmtu.on_probe_acked(16_384, t0);
            link.mss_changed();
            link.seed_rtt(Duration::from_micros(100));
            let large: Vec<u64> = (0..20)
                .map(|_| link.on_sent(t0, 16_384, data_packet(t0, 16_384)))
                .collect();
            // the acknowledgement: the last 11 large ones, or 3 smaller ones sent after them
            // (mid-size: larger than the base, yet no proof that the current size passes)
            let acked = if black_hole {
                let small: Vec<u64> = (0..3)
                    .map(|_| link.on_sent(t0, 4000, data_packet(t0, 4000)))
                    .collect();
                (small[0], small[2])
            } else {
                (large[9], large[19])
            };
            let mut out = AckOutcome::default();
            link.on_ack(
                t0 + Duration::from_micros(200),
                [acked].into_iter(),
                acked.1,
                Duration::ZERO,
                &mut out,
            );
            assert!(out.lost.len() >= 8, "the premise: {} lost", out.lost.len());
            let size = link.pmtu.current();
            assert_eq!(size == 1472, black_hole, "black hole {black_hole}: {size}");
        }
    }

    #[test]
    fn small_messages_with_pauses_are_not_taken_for_a_slow_link() {
        // loopback-sized datagrams in a window of two (path MTU discovery raised the size from
        // 1472 to 16 KiB: the window kept its bytes, at least two datagrams) and a
        // request-response flow: a 64-byte message now and then, acknowledged within a round
        // trip
        let (mut link, t0) = up_link(16_384);
        link.pmtu.on_probe_acked(16_384, t0);
        link.mss_changed();
        assert!(link.mss() > 16_000);
        assert_eq!(link.cc.window(), 2 * link.mss() as u64);
        let rtt = Duration::from_micros(100);
        link.seed_rtt(rtt);
        for k in 0..50u32 {
            send_and_ack(
                &mut link,
                t0 + Duration::from_millis(20 * u64::from(k)),
                64,
                rtt,
            );
        }
        // 64 bytes per 20 ms is what it was given: a full-size packet must not look seconds
        // away (the slow-link check demoted such links, and the scheduler shunned them)
        let now = t0 + Duration::from_millis(20 * 49) + rtt;
        assert!(
            link.eta(now) < 0.001,
            "a packet would arrive in {} s at {} B/s",
            link.eta(now),
            link.delivery_rate(now)
        );
    }

    #[test]
    fn a_window_in_slow_start_is_not_taken_for_what_the_link_can_deliver() {
        // The first window goes out on a 200 µs path and comes back acknowledged after 2 ms
        // (the peer was busy): 7 MB/s, while the link could take far more if given it.
        let (mut link, t0) = up_link(1472);
        let rtt = Duration::from_micros(200);
        link.seed_rtt(rtt);
        let window = link.cc.window() / 1472;
        let pns: Vec<u64> = (0..window)
            .map(|_| link.on_sent(t0, 1472, data_packet(t0, 1472)))
            .collect();
        let late = t0 + Duration::from_millis(2);
        let last = *pns.last().unwrap();
        link.on_ack(
            late,
            [(pns[0], last)].into_iter(),
            last,
            Duration::ZERO,
            &mut AckOutcome::default(),
        );
        assert!(link.cc.in_slow_start());
        // the window doubled; what it allows per round trip is what the link is worth until
        // a window that stopped growing measures it
        assert!(!link.is_measured());
        let window_rate = link.cc.window() as f64 / link.rtt.srtt.as_secs_f64();
        assert!(link.delivery_rate(late) >= window_rate);
    }

    /// One acknowledgement of a whole window in slow start doubles it: every packet it
    /// acknowledges is judged by what was in flight when it came (PROTOCOL.md §7.1), not by
    /// what is left as the frame's packets are counted off one by one.
    #[test]
    fn a_window_acknowledged_in_one_frame_doubles_in_slow_start() {
        let (mut link, t0) = up_link(1472);
        link.seed_rtt(Duration::from_micros(200));
        let before = link.cc.window();
        let pns: Vec<u64> = (0..before / 1472)
            .map(|_| link.on_sent(t0, 1472, data_packet(t0, 1472)))
            .collect();
        let last = *pns.last().unwrap();
        link.on_ack(
            t0 + Duration::from_micros(200),
            [(pns[0], last)].into_iter(),
            last,
            Duration::ZERO,
            &mut AckOutcome::default(),
        );
        assert!(link.cc.in_slow_start());
        assert_eq!(link.cc.window(), 2 * before);
    }

    #[test]
    fn a_rate_measured_across_a_stall_shuts_the_link_out_only_for_a_while() {
        // Past slow start (a loss ended it), a window goes out; the peer stalls, and 30 ms
        // later it acknowledges one packet of it while the window is still in use: a busy
        // sample of under 100 kB/s on a path of a 200 µs round trip (the window allows
        // 50 MB/s).
        let (mut link, t0) = up_link(1472);
        let rtt = Duration::from_micros(200);
        link.seed_rtt(rtt);
        link.cc.on_loss(t0, t0);
        assert!(!link.cc.in_slow_start());
        let window = link.cc.window() / 1472;
        let pns: Vec<u64> = (0..window)
            .map(|_| link.on_sent(t0, 1472, data_packet(t0, 1472)))
            .collect();
        let mut ack = |now: Instant, pn: u64| {
            link.on_ack(
                now,
                [(pn, pn)].into_iter(),
                pn,
                Duration::ZERO,
                &mut AckOutcome::default(),
            )
        };
        ack(t0 + rtt, pns[0]);
        let stalled = t0 + rtt + Duration::from_millis(30);
        ack(stalled, pns[1]);
        assert!(link.is_measured());
        let slow = link.delivery_rate(stalled);
        assert!(slow < 100_000.0, "{slow} B/s");
        // the rest is acknowledged: nothing of ours is in flight
        let last = *pns.last().unwrap();
        link.on_ack(
            stalled,
            [(pns[2], last)].into_iter(),
            last,
            Duration::ZERO,
            &mut AckOutcome::default(),
        );
        // For a while the measurement stands: a full-size packet looks far away, so the
        // scheduler gives the link nothing, and nothing can correct the estimate ...
        let trust = (link.rtt.srtt * 8).max(RATE_TRUST);
        let meanwhile = stalled + trust - Duration::from_millis(1);
        assert!(link.eta(meanwhile) > 0.01, "{} s", link.eta(meanwhile));
        // ... until it is too old to trust: the link counts its window's rate again (a packet
        // arrives within about a millisecond) and gets data, whose acknowledgements measure
        // it anew.
        let later = stalled + trust + Duration::from_millis(1);
        assert!(link.eta(later) < 0.002, "{} s", link.eta(later));
    }
}
