//! One link of a connection: a (local address, remote address) path with its own packet-number
//! space in each direction, RTT estimate, loss detection, congestion window, pacer and health.
//!
//! Loss is judged per link, so data that overtakes on a faster link never looks lost. Health
//! follows a small state machine (see `docs/PROTOCOL.md`, §6 "Link health"):
//!
//! - `Validating` → `Up` once a probe is acknowledged;
//! - `Up` → `Down` after `failure_ptos` probe timeouts with no acknowledgement at all;
//! - `Up` → `Degraded` when the receiver reports the link's share of arrivals collapsed;
//! - `Degraded` → `Down` when its probes go unanswered;
//! - `Down`/`Degraded` → `Up` after `recovery_probes` acknowledged probes, sent every
//!   `probe_interval` however long the outage: recovery time does not grow with the outage.
//!   A link that fails again soon after coming back needs twice as many probes (flap damping).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::ack::AckState;
use crate::congestion::{Congestion, Pacer};
use crate::connection::{ShareDetector, SlowLinkCheck};
use crate::pmtu::PathMtu;
use crate::sent::SentPackets;
use crate::streams::Chunk;
use crate::{ConnectionConfig, LinkId};

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
}

/// What a sent packet carried that matters if it is acknowledged or lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SentFrame {
    Stream { stream: u8, chunk: Chunk },
    MaxStreamData { stream: u8 },
    LinkStatus { link: LinkId, status: u8 },
}

#[derive(Debug, Clone)]
pub(crate) struct SentPacket {
    pub time: Instant,
    pub size: u16,
    /// Counted in `bytes_in_flight` (data packets, not probes of a link that is not up).
    pub in_flight: bool,
    pub ack_eliciting: bool,
    /// A probe of a link that is not up.
    pub probe: bool,
    /// A path MTU probe (its size is the size probed).
    pub mtu_probe: bool,
    pub frames: SmallVec<[SentFrame; 2]>,
}

/// RFC 9002 round-trip estimator.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rtt {
    pub srtt: Duration,
    pub rttvar: Duration,
    pub min: Duration,
    pub latest: Duration,
    has_sample: bool,
}

/// RTT assumed before the first sample.
const INITIAL_RTT: Duration = Duration::from_millis(100);
const GRANULARITY: Duration = Duration::from_millis(1);
/// Probes a link that was never up gets at the normal pace before it is probed slowly.
const UNPROVEN_FAST_PROBES: u32 = 10;
/// Probe interval of a link that was never up and has not answered [`UNPROVEN_FAST_PROBES`].
const UNPROVEN_PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// The peer counts as silent on a link after this many of its usual gaps between arrivals.
const SILENCE_GAPS: u32 = 8;
/// How long a link must have been silent to be declared down while no other link shows that
/// the peer is answering. A dead peer or every link gone is then declared a little later,
/// which costs nothing (there is nowhere to fail over to), and a peer or network that did not
/// run for tens of milliseconds on a busy host does not take down a working link.
const SILENT_PEER_PATIENCE: Duration = Duration::from_millis(150);

impl Rtt {
    fn new() -> Self {
        Self {
            srtt: INITIAL_RTT,
            rttvar: INITIAL_RTT / 2,
            min: Duration::MAX,
            latest: INITIAL_RTT,
            has_sample: false,
        }
    }

    fn update(&mut self, sample: Duration, ack_delay: Duration) {
        self.latest = sample;
        self.min = self.min.min(sample);
        let adjusted = if sample >= self.min + ack_delay {
            sample - ack_delay
        } else {
            sample
        };
        if !self.has_sample {
            self.has_sample = true;
            self.srtt = adjusted;
            self.rttvar = adjusted / 2;
        } else {
            let diff = self.srtt.abs_diff(adjusted);
            self.rttvar = (self.rttvar * 3 + diff) / 4;
            self.srtt = (self.srtt * 7 + adjusted) / 8;
        }
    }
}

/// Packets declared lost (data packets and probes) that a link remembers, so that a late
/// acknowledgement of one still counts.
const LOST_MEMORY: usize = 1024;

/// A packet declared lost, remembered in case its acknowledgement was only late.
#[derive(Debug)]
struct LostPacket {
    pn: u64,
    sent: Instant,
    probe: bool,
    /// Its stream frames.
    frames: Frames,
}

/// Frames of a sent packet.
pub(crate) type Frames = SmallVec<[SentFrame; 2]>;

/// Outcome of processing an ACK frame for one link.
#[derive(Debug, Default)]
pub(crate) struct AckOutcome {
    pub acked: Vec<SentPacket>,
    pub lost: Vec<SentPacket>,
    /// Stream frames of packets acknowledged after they had been declared lost.
    pub acked_late: Vec<Frames>,
    /// Probes acknowledged with their round-trip times.
    pub probes_acked: u32,
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
    /// "Port unreachable" answers from the peer's host to this link's datagrams since the
    /// connection last received anything: proof that nothing listens there any more.
    pub port_unreachable: u32,
    /// When the peer's last packet arrived on this link.
    pub last_heard: Option<Instant>,
    /// When the peer's last ack-eliciting packet arrived on this link, and the usual gap
    /// between such arrivals (moving average): a link that only receives notices by these
    /// that the peer fell silent on it.
    last_eliciting_heard: Option<Instant>,
    arrival_gap: Duration,

    // --- sending ---
    next_pn: u64,
    sent: SentPackets,
    /// The last data packets and probes declared lost, by packet number in ascending order
    /// (at most [`LOST_MEMORY`]). A loss declared on a link that was only slow (its queue
    /// grew, it was declared down with packets still queued, or its round trip grew during an
    /// outage) is spurious: the acknowledgement arrives later, and must still count. Else the
    /// data waits for a repair, which after the peer's clean close might never be
    /// acknowledged; and probes that always expire before their answers arrive would keep
    /// the link down for good, the round-trip estimate never learning the longer time.
    lost_recently: VecDeque<LostPacket>,
    pub bytes_in_flight: u64,
    /// Bytes acknowledged so far (data packets), for the delivery-rate estimate.
    delivered: u64,
    /// Start of the current delivery-rate sample: (time, `delivered` then).
    rate_sample_start: Option<(Instant, u64)>,
    /// Recent delivery rate in bytes per second (0 until measured).
    delivery_rate: f64,
    /// A rate sample was taken while the link used its window: the rate says what the link
    /// can deliver, not just what it was given.
    rate_measured_busy: bool,
    pub cc: Congestion,
    pub pacer: Pacer,
    pub rtt: Rtt,
    largest_acked: Option<u64>,
    /// Time threshold loss timer.
    loss_time: Option<Instant>,
    /// When an acknowledgement last newly acknowledged something sent on this link.
    last_ack_time: Option<Instant>,
    /// When the newest packet acknowledged so far was sent: the peer was alive and heard
    /// this link at least until then.
    newest_acked_sent: Option<Instant>,
    last_ack_eliciting_sent: Option<Instant>,
    /// Probe timeouts in a row without any acknowledgement.
    pub pto_count: u32,
    last_pto: Option<Instant>,
    /// A PTO fired: ack-eliciting packets to send on this link (two, so that one lost
    /// datagram does not make the whole timeout count as silence).
    pub pto_probes_pending: u8,

    // --- probing while not up ---
    pub next_probe: Option<Instant>,
    probe_successes: u32,
    probe_failures: u32,
    probes_needed: u32,
    /// Probes sent since the link was created or demoted.
    probes_sent: u32,
    /// A full-size probe was acknowledged since the link was created or demoted: the path
    /// carries datagrams of the base size.
    full_probe_acked: bool,
    last_promotion: Option<Instant>,

    // --- receiving ---
    /// What arrived from the peer on this link, and the acknowledgement owed for it.
    pub ack: AckState,
    /// The receiver-side arrival-share detector's view of this link.
    pub share: ShareDetector,
    /// The sender-side slow-link check's view of this link.
    pub slow_check: SlowLinkCheck,

    // --- statistics ---
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub packets_sent: u64,
    pub packets_received: u64,
    pub packets_lost: u64,
    pub stream_bytes_sent: u64,
    pub stream_bytes_acked: u64,
}

impl Link {
    /// A link whose datagrams start at `pmtu`'s base size.
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
            last_heard: None,
            last_eliciting_heard: None,
            arrival_gap: Duration::ZERO,
            next_pn: 0,
            sent: SentPackets::default(),
            lost_recently: VecDeque::new(),
            bytes_in_flight: 0,
            delivered: 0,
            rate_sample_start: None,
            delivery_rate: 0.0,
            rate_measured_busy: false,
            cc: Congestion::new(mss),
            pacer: Pacer::new(mss),
            rtt: Rtt::new(),
            largest_acked: None,
            loss_time: None,
            last_ack_time: None,
            newest_acked_sent: None,
            last_ack_eliciting_sent: None,
            pto_count: 0,
            last_pto: None,
            pto_probes_pending: 0,
            next_probe: None,
            probe_successes: 0,
            probes_sent: 0,
            full_probe_acked: false,
            probe_failures: 0,
            // one round trip validates a new link; recovering from a failure takes more
            probes_needed: 1,
            last_promotion: None,
            ack: AckState::default(),
            share: ShareDetector::default(),
            slow_check: SlowLinkCheck::default(),
            bytes_sent: 0,
            bytes_received: 0,
            packets_sent: 0,
            packets_received: 0,
            packets_lost: 0,
            stream_bytes_sent: 0,
            stream_bytes_acked: 0,
        }
    }

    /// Path MTU discovery may have changed the datagram size: the congestion controller
    /// counts in full packets of the new size from now on.
    fn mss_changed(&mut self) {
        let mss = self.mss();
        if self.cc.mss() != mss {
            tracing::debug!(link = self.id, mss, "datagram size");
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

    pub fn next_pn(&self) -> u64 {
        self.next_pn
    }

    /// Probe timeout: how long to wait for any acknowledgement before probing.
    pub fn pto(&self, cfg: &ConnectionConfig) -> Duration {
        (self.rtt.srtt + (self.rtt.rttvar * 4).max(GRANULARITY) + cfg.max_ack_delay)
            .max(cfg.min_pto)
    }

    /// Whether a full-size data packet fits the window and the pacer allows it now;
    /// otherwise when it may (None: window full, wait for acknowledgements).
    pub fn send_allowance(&mut self, now: Instant) -> Result<(), Option<Instant>> {
        if self.bytes_in_flight + self.mss() as u64 > self.cc.window() {
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

    /// Records a packet sent on this link.
    pub fn on_sent(&mut self, now: Instant, size: usize, pkt: SentPacket) -> u64 {
        let pn = self.next_pn;
        self.next_pn += 1;
        self.packets_sent += 1;
        self.bytes_sent += size as u64;
        if pkt.in_flight {
            self.bytes_in_flight += u64::from(pkt.size);
            self.pacer.on_sent(size);
        }
        if pkt.ack_eliciting {
            self.last_ack_eliciting_sent = Some(now);
            self.sent.insert(pn, pkt);
        }
        pn
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
        // Numbers this link never sent cannot be acknowledged: a peer that received a forged
        // packet numbered far ahead acknowledges it, and taken as the largest acknowledged it
        // would have every packet sent since declared lost at once, for good.
        let Some(last_sent) = self.next_pn.checked_sub(1) else {
            return;
        };
        let largest = largest.min(last_sent);
        let ranges = ranges.filter(|&(lo, _)| lo <= last_sent);
        let mut largest_newly_acked: Option<(u64, Instant, bool)> = None;
        let mut newest_late: Option<(u64, Instant)> = None;
        for (lo, hi) in ranges {
            let hi = hi.min(last_sent);
            if let Some(late) = self.take_acked_late(lo..=hi, out) {
                newest_late = newest_late.max(Some(late));
            }
            for pn in self.sent.clamp(lo..=hi) {
                let Some(pkt) = self.sent.remove(pn) else {
                    continue;
                };
                if largest_newly_acked.is_none_or(|(l, _, _)| pn > l) {
                    largest_newly_acked = Some((pn, pkt.time, pkt.ack_eliciting));
                }
                if pkt.in_flight {
                    let before = self.bytes_in_flight;
                    self.bytes_in_flight -= u64::from(pkt.size);
                    self.delivered += u64::from(pkt.size);
                    self.cc.on_ack(u64::from(pkt.size), pkt.time, before);
                }
                if pkt.probe {
                    out.probes_acked += 1;
                    self.full_probe_acked |= usize::from(pkt.size) >= self.pmtu.base();
                }
                if pkt.mtu_probe {
                    self.pmtu.on_probe_acked(usize::from(pkt.size), now);
                    self.mss_changed();
                } else if pkt.in_flight {
                    self.pmtu.on_packet_acked(usize::from(pkt.size));
                }
                self.stream_bytes_acked += stream_bytes(&pkt.frames);
                out.acked.push(pkt);
            }
        }
        let regular_sample = matches!(largest_newly_acked, Some((pn, _, true)) if pn == largest);
        if let (false, Some((_, sent))) = (regular_sample, newest_late) {
            // the round trip grew beyond what the estimate allowed for: learn it
            self.rtt
                .update(now.saturating_duration_since(sent), ack_delay);
        }
        let Some((pn, sent_time, eliciting)) = largest_newly_acked else {
            return;
        };
        self.largest_acked = Some(self.largest_acked.map_or(largest, |l| l.max(largest)));
        self.last_ack_time = Some(now);
        self.newest_acked_sent = self.newest_acked_sent.max(Some(sent_time));
        self.pto_count = 0;
        self.pto_probes_pending = 0;
        if pn == largest && eliciting {
            self.rtt.update(now - sent_time, ack_delay);
        }
        self.sample_delivery_rate(now);
        self.detect_lost(now, out);
    }

    /// Measures the delivery rate over intervals of at least a round trip; the estimate follows
    /// increases at once and decreases gradually (a few samples), like a decaying max filter,
    /// and only when the link was busy.
    fn sample_delivery_rate(&mut self, now: Instant) {
        let Some((start, d0)) = self.rate_sample_start else {
            self.rate_sample_start = Some((now, self.delivered));
            return;
        };
        let elapsed = now.saturating_duration_since(start);
        if elapsed < self.rtt.srtt.max(GRANULARITY) {
            return;
        }
        let sample = (self.delivered - d0) as f64 / elapsed.as_secs_f64();
        // A link that is not using its window delivers what it is given, not what it can:
        // such a sample may raise the estimate but not lower it.
        let app_limited = self.bytes_in_flight + 2 * self.mss() as u64 <= self.cc.window() / 2;
        self.delivery_rate = if app_limited {
            sample.max(self.delivery_rate)
        } else {
            self.rate_measured_busy = true;
            sample.max(self.delivery_rate * 0.75)
        };
        self.rate_sample_start = Some((now, self.delivered));
    }

    /// Delivery rate in bytes per second: measured, or before any measurement what the window
    /// allows per round trip.
    pub fn delivery_rate(&self) -> f64 {
        if self.delivery_rate > 0.0 {
            self.delivery_rate
        } else {
            self.cc.window() as f64 / self.rtt.srtt.as_secs_f64().max(1e-6)
        }
    }

    /// Whether RTT and delivery rate rest on measurements rather than initial assumptions.
    pub fn is_measured(&self) -> bool {
        self.rtt.has_sample && self.rate_measured_busy
    }

    /// The path's round-trip time without queueing: the smallest seen (smoothed before any).
    pub fn base_rtt(&self) -> Duration {
        if self.rtt.min == Duration::MAX {
            self.rtt.srtt
        } else {
            self.rtt.min
        }
    }

    /// When a full-size packet sent now would arrive, in seconds from now: the path's base
    /// latency plus the time to deliver what is already in flight ahead of it. (Plain seconds:
    /// the scheduler compares these for every packet it places.)
    pub fn eta(&self) -> f64 {
        let base = self.base_rtt().as_secs_f64();
        let queued = (self.bytes_in_flight + self.mss() as u64) as f64 / self.delivery_rate();
        base / 2.0 + queued.min(3600.0)
    }

    /// RFC 9002 packet- and time-threshold loss detection within this link.
    fn detect_lost(&mut self, now: Instant, out: &mut AckOutcome) {
        self.loss_time = None;
        let Some(largest) = self.largest_acked else {
            return;
        };
        let delay = (self.rtt.srtt.max(self.rtt.latest) * 9 / 8).max(GRANULARITY);
        let lost_before = now.checked_sub(delay);
        let mut loss_time = None;
        let mut lost_pns: SmallVec<[u64; 16]> = SmallVec::new();
        for (pn, pkt) in self.sent.iter().take_while(|&(pn, _)| pn < largest) {
            if pn + 3 <= largest || lost_before.is_some_and(|t| pkt.time <= t) {
                lost_pns.push(pn);
            } else {
                let t = pkt.time + delay;
                loss_time = Some(loss_time.map_or(t, |l: Instant| l.min(t)));
            }
        }
        self.loss_time = loss_time;
        if !lost_pns.is_empty() {
            tracing::debug!(
                link = self.id,
                lost = lost_pns.len(),
                first = lost_pns[0],
                largest_acked = largest,
                "packets lost"
            );
        }
        for pn in lost_pns {
            let pkt = self.sent.remove(pn).expect("listed just now");
            if pkt.mtu_probe {
                // not a congestion signal: the size may just be too large for the path
                self.pmtu.on_probe_lost(usize::from(pkt.size), now);
                out.lost.push(pkt);
                continue;
            }
            self.packets_lost += 1;
            if pkt.in_flight {
                self.bytes_in_flight -= u64::from(pkt.size);
                self.cc.on_loss(pkt.time, now);
                if self.pmtu.on_packet_lost(usize::from(pkt.size)) {
                    self.mss_changed();
                }
            }
            self.remember_lost(pn, &pkt);
            out.lost.push(pkt);
        }
    }

    /// Declares everything in flight lost (the link failed): it will be re-sent elsewhere.
    pub fn drain_in_flight(&mut self, out: &mut AckOutcome) {
        let mut sent = std::mem::take(&mut self.sent);
        for (pn, pkt) in sent.drain() {
            self.packets_lost += u64::from(!pkt.mtu_probe);
            self.remember_lost(pn, &pkt);
            out.lost.push(pkt);
        }
        self.sent = sent;
        self.bytes_in_flight = 0;
        self.loss_time = None;
        self.pto_count = 0;
        self.pto_probes_pending = 0;
    }

    /// Remembers lost packet `pn` if it was a probe or carried stream data (see
    /// `lost_recently`).
    fn remember_lost(&mut self, pn: u64, pkt: &SentPacket) {
        let frames: Frames = pkt
            .frames
            .iter()
            .filter(|f| matches!(f, SentFrame::Stream { .. }))
            .copied()
            .collect();
        if frames.is_empty() && !pkt.probe {
            return;
        }
        if self.lost_recently.len() >= LOST_MEMORY {
            self.lost_recently.pop_front();
        }
        // losses are declared oldest first, so this is nearly always an append
        let at = self.lost_recently.partition_point(|l| l.pn < pn);
        self.lost_recently.insert(
            at,
            LostPacket {
                pn,
                sent: pkt.time,
                probe: pkt.probe,
                frames,
            },
        );
    }

    /// Hands the remembered lost packets that `acked` acknowledges on: stream frames to
    /// `out.acked_late`, probes to `out.probes_acked`. Returns the newest one's number and
    /// send time.
    fn take_acked_late(
        &mut self,
        acked: RangeInclusive<u64>,
        out: &mut AckOutcome,
    ) -> Option<(u64, Instant)> {
        let from = self
            .lost_recently
            .partition_point(|l| l.pn < *acked.start());
        let to = self.lost_recently.partition_point(|l| l.pn <= *acked.end());
        let mut newest = None;
        for l in self.lost_recently.drain(from..to.max(from)) {
            newest = Some((l.pn, l.sent));
            out.probes_acked += u32::from(l.probe);
            if !l.frames.is_empty() {
                self.stream_bytes_acked += stream_bytes(&l.frames);
                out.acked_late.push(l.frames);
            }
        }
        newest
    }

    /// When loss detection's time threshold declares the oldest waiting packet lost.
    pub fn loss_deadline(&self) -> Option<Instant> {
        self.loss_time
    }

    /// When the next probe of this link (not up) is due, if it may be sent.
    pub fn probe_deadline(&self) -> Option<Instant> {
        if self.state != LinkState::Up && self.within_amplification_limit() {
            self.next_probe
        } else {
            None
        }
    }

    /// When the probe timeout fires (up links with packets in flight).
    pub fn pto_deadline(&self, cfg: &ConnectionConfig) -> Option<Instant> {
        if self.state != LinkState::Up || self.sent.is_empty() || self.pto_probes_pending > 0 {
            return None;
        }
        let oldest = self.sent.oldest().map(|p| p.time);
        let base = [oldest, self.last_ack_time, self.last_pto]
            .into_iter()
            .flatten()
            .max()?;
        Some(base + self.pto(cfg))
    }

    /// Whether `other` got an acknowledgement for something sent after this link's oldest
    /// unacknowledged packet: the peer is alive and answering, just not on this link. Then
    /// this link's silence is its own, and a few probe timeouts declare it down. Without such
    /// proof the silence may be the whole peer's or the network's (a process not scheduled
    /// for tens of milliseconds on a busy machine, every link gone at once): the link must
    /// then also have been silent for [`SILENT_PEER_PATIENCE`].
    pub fn heard_after_silence(&self, other: &Link) -> bool {
        match (self.sent.oldest(), other.newest_acked_sent) {
            (Some(oldest), Some(acked)) => acked > oldest.time,
            _ => false,
        }
    }

    /// Runs the loss timer. Lost packets are appended to `out`.
    pub fn on_loss_timer(&mut self, now: Instant, out: &mut AckOutcome) {
        if self.loss_time.is_some_and(|t| t <= now) {
            self.detect_lost(now, out);
        }
    }

    /// Runs the probe timeout. Returns true when the link must be declared down: after
    /// `failure_ptos` timeouts in a row, and, if `peer_silent` (no other link shows the peer
    /// answering), once it has been silent for [`SILENT_PEER_PATIENCE`].
    pub fn on_pto_timer(
        &mut self,
        now: Instant,
        cfg: &ConnectionConfig,
        peer_silent: bool,
    ) -> bool {
        if self.pto_deadline(cfg).is_none_or(|d| d > now) {
            return false;
        }
        self.pto_count += 1;
        tracing::debug!(
            link = self.id,
            count = self.pto_count,
            peer_silent,
            pto_us = self.pto(cfg).as_micros() as u64,
            srtt_us = self.rtt.srtt.as_micros() as u64,
            rttvar_us = self.rtt.rttvar.as_micros() as u64,
            in_flight = self.bytes_in_flight,
            since_ack_us = self
                .last_ack_time
                .map(|t| now.saturating_duration_since(t).as_micros() as u64),
            "probe timeout"
        );
        self.last_pto = Some(now);
        let silent_since = [self.sent.oldest().map(|p| p.time), self.last_ack_time]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(now);
        let patient =
            !peer_silent || now.saturating_duration_since(silent_since) >= SILENT_PEER_PATIENCE;
        if self.pto_count >= cfg.failure_ptos && patient {
            return true;
        }
        self.pto_probes_pending = 2;
        false
    }

    /// Leaves `Up` (or `Validating`) for `to`; the caller re-sends what was in flight.
    pub fn demote(&mut self, now: Instant, to: LinkState, cfg: &ConnectionConfig) {
        debug_assert!(to == LinkState::Down || to == LinkState::Degraded);
        // flap damping: failing again soon after recovering doubles the probes needed
        let recent = self
            .last_promotion
            .is_some_and(|p| now.saturating_duration_since(p) < Duration::from_secs(1));
        self.probes_needed = if recent {
            (self.probes_needed * 2).min(32)
        } else {
            cfg.recovery_probes
        };
        self.state = to;
        // the path may change while the link is away: find its size again once it is back
        self.pmtu.restart();
        self.mss_changed();
        self.cc.reset();
        self.pacer.reset(self.mss());
        self.delivery_rate = 0.0;
        self.rate_measured_busy = false;
        self.rate_sample_start = None;
        self.probe_successes = 0;
        self.probe_failures = 0;
        self.probes_sent = 0;
        self.full_probe_acked = false;
        self.next_probe = Some(now + cfg.probe_interval);
        self.last_pto = None;
    }

    /// Whether a probe is due on this (not up) link.
    pub fn probe_due(&self, now: Instant) -> bool {
        self.state != LinkState::Up
            && self.next_probe.is_some_and(|t| t <= now)
            && self.within_amplification_limit()
    }

    /// Whether this link may send a full datagram under the anti-amplification rule.
    pub fn within_amplification_limit(&self) -> bool {
        !(self.peer_opened && self.state == LinkState::Validating)
            || self.bytes_sent + self.mss() as u64 <= 3 * self.bytes_received
    }

    /// A probe is about to be sent. Probes unanswered for longer than a round trip could take
    /// (at least a probe interval) count as failed and break the run of successes; probes keep
    /// going out every interval meanwhile, so a long round trip does not slow detection down.
    /// Returns true when a degraded link's probes have failed often enough for it to count
    /// as down.
    pub fn on_probe_sending(
        &mut self,
        now: Instant,
        cfg: &ConnectionConfig,
        out: &mut AckOutcome,
    ) -> bool {
        self.probes_sent = self.probes_sent.saturating_add(1);
        // A link that was never up (an address the peer announced, or one we were given)
        // and has not answered its first probes is probed slowly: it may not exist at all.
        // A link that worked keeps the fast pace for as long as it is down, so a heal is
        // noticed within a probe interval however long the outage lasted.
        let interval = if self.state == LinkState::Validating
            && self.probes_sent > UNPROVEN_FAST_PROBES
            && self.probe_successes == 0
        {
            UNPROVEN_PROBE_INTERVAL.max(cfg.probe_interval)
        } else {
            cfg.probe_interval
        };
        self.next_probe = Some(now + interval);
        let patience =
            (self.rtt.srtt * 2 + self.rtt.rttvar * 4 + cfg.max_ack_delay).max(cfg.probe_interval);
        // An expired probe's loss is not a congestion signal (probes are outside the window),
        // and it does not reset the acknowledged count: a lossy link must still be able to
        // come back. Control frames it carried are handed back to be sent again.
        let mut expired = SmallVec::<[(u64, SentPacket); 4]>::new();
        self.sent.remove_where(
            |_, p| p.probe && now.saturating_duration_since(p.time) > patience,
            |pn, p| expired.push((pn, p)),
        );
        self.probe_failures += expired.len() as u32;
        for (pn, p) in expired {
            self.remember_lost(pn, &p);
            out.lost.push(p);
        }
        self.state == LinkState::Degraded && self.probe_failures >= cfg.failure_ptos
    }

    /// Whether the probe just counted by [`Self::on_probe_sending`] is padded to the base size:
    /// the first since the link was created or demoted (unless its address is unproven), and
    /// those after an answer (the promotion must see one pass). Probing a dead link, or an
    /// address a peer announced that never answers, costs a few dozen bytes per interval
    /// instead of a full datagram.
    pub fn probe_is_full(&self) -> bool {
        (self.probes_sent <= 1 && !self.unproven_address) || self.probe_successes > 0
    }

    /// Probes acknowledged; returns true when the link should come (back) up: enough of them,
    /// one of them full size.
    pub fn on_probes_acked(&mut self, now: Instant, n: u32) -> bool {
        self.probe_successes += n;
        if std::mem::take(&mut self.unproven_address) && self.state != LinkState::Up {
            // the address answered: the full-size probe its promotion needs goes out at once
            self.next_probe = Some(now);
        }
        self.probe_failures = 0;
        self.state != LinkState::Up
            && self.probe_successes >= self.probes_needed
            && self.full_probe_acked
    }

    /// Seeds the RTT estimate from the handshake round trip.
    pub fn seed_rtt(&mut self, rtt: Duration) {
        self.rtt.update(rtt, Duration::ZERO);
    }

    /// When an up link needs a keepalive PING: after `keepalive_interval` without sending
    /// anything ack-eliciting, or sooner once the peer fell silent on it (see
    /// [`Self::silence_deadline`]).
    pub fn keepalive_deadline(&self, cfg: &ConnectionConfig) -> Option<Instant> {
        let last = self.last_ack_eliciting_sent.max(self.last_promotion)?;
        let idle = last + cfg.keepalive_interval;
        Some(self.silence_deadline(cfg).map_or(idle, |s| s.min(idle)))
    }

    /// A link that only receives (the peer sends, this side acknowledges) has nothing in
    /// flight, so no probe timeout would notice it fail, and it would stay up until the next
    /// keepalive. When the peer's ack-eliciting packets stop arriving for much longer than
    /// their usual gap (and at least a PTO), one PING puts the link under the probe timeout.
    /// Armed again only by a new arrival, so a peer that just stopped sending costs one PING.
    fn silence_deadline(&self, cfg: &ConnectionConfig) -> Option<Instant> {
        let heard = self.last_eliciting_heard?;
        if self
            .last_ack_eliciting_sent
            .is_some_and(|sent| sent >= heard)
        {
            return None; // the probe timeout watches what was sent since
        }
        Some(heard + (self.arrival_gap * SILENCE_GAPS).max(self.pto(cfg)))
    }

    pub fn promote(&mut self, now: Instant, out: &mut AckOutcome) {
        self.state = LinkState::Up;
        self.last_promotion = Some(now);
        self.next_probe = None;
        self.pto_count = 0;
        self.last_pto = None;
        self.cc.reset();
        self.pacer.reset(self.mss());
        self.delivery_rate = 0.0;
        self.rate_measured_busy = false;
        self.rate_sample_start = None;
        // probes still outstanding must not trigger a PTO: count them lost (their control
        // frames are sent again)
        self.sent
            .remove_where(|_, p| p.probe, |_, p| out.lost.push(p));
    }

    // --- receiving ---

    /// Records a packet from the peer. Returns false for a duplicate (see
    /// [`AckState::on_received`]).
    pub fn on_received(
        &mut self,
        now: Instant,
        pn: u64,
        ack_eliciting: bool,
        size: usize,
        cfg: &ConnectionConfig,
    ) -> bool {
        if !self.ack.on_received(now, pn, ack_eliciting, cfg) {
            return false;
        }
        self.last_heard = Some(now);
        self.packets_received += 1;
        self.bytes_received += size as u64;
        if ack_eliciting {
            if let Some(prev) = self.last_eliciting_heard {
                let gap = now.saturating_duration_since(prev);
                self.arrival_gap = (self.arrival_gap * 7 + gap) / 8;
            }
            self.last_eliciting_heard = Some(now);
            self.share.on_arrival();
        }
        true
    }

    pub fn stats(&self) -> LinkStats {
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
            bytes_in_flight: self.bytes_in_flight,
            bytes_sent: self.bytes_sent,
            bytes_received: self.bytes_received,
            packets_sent: self.packets_sent,
            packets_received: self.packets_received,
            packets_lost: self.packets_lost,
            stream_bytes_sent: self.stream_bytes_sent,
            stream_bytes_acked: self.stream_bytes_acked,
            max_datagram: self.mss(),
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
