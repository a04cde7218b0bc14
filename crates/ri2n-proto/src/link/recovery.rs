//! What a link sent and has not resolved yet, and loss detection over it (RFC 9002 §6,
//! within one link): packet numbers, the outstanding packets, bytes in flight, the packets
//! lately declared lost, the loss timer and the probe timeout.
//!
//! Loss is judged per link, so data that overtakes on a faster link never looks lost. The
//! link applies what the outcome means for its congestion window, path MTU and counters, and
//! hands the connection the packets acknowledged and lost ([`AckOutcome`]).

use std::collections::VecDeque;
use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::datagrams::Piece;

use super::rtt::Rtt;
use super::sent::{Frames, SentFrame, SentPacket, SentPackets};

/// Packets declared lost (data packets and probes) that a link remembers, so that a late
/// acknowledgement of one still counts.
const LOST_MEMORY: usize = 1024;

/// Outcome of processing an ACK frame for one link.
#[derive(Debug, Default)]
pub(crate) struct AckOutcome {
    pub acked: Vec<SentPacket>,
    pub lost: Vec<SentPacket>,
    /// Stream frames of packets acknowledged after they had been declared lost.
    pub acked_late: Vec<Frames>,
    /// Probes acknowledged with their round-trip times.
    pub probes_acked: u32,
    /// Datagrams (number, bytes) that were in flight on a link that failed, in sending order:
    /// to be sent again on another.
    pub stranded: Vec<Piece>,
    /// The highest number the last ACK frame acknowledged among packets the link sent and
    /// still remembered (in flight or declared lost), if any: proof that the peer opened it.
    pub newest_acked: Option<u64>,
}

/// How long a link must have been silent to be declared down while no other link shows that
/// the peer is answering. A dead peer or every link gone is then declared a little later,
/// which costs nothing (there is nowhere to fail over to), and a peer or network that did not
/// run for tens of milliseconds on a busy host does not take down a working link.
const SILENT_PEER_PATIENCE: Duration = Duration::from_millis(150);

/// A packet declared lost, remembered in case its acknowledgement was only late.
#[derive(Debug)]
struct LostPacket {
    pn: u64,
    sent: Instant,
    probe: bool,
    /// Its stream frames.
    frames: Frames,
}

/// What an ACK frame newly acknowledged on a link (see [`Recovery::on_ack`]).
#[derive(Debug)]
pub(crate) struct NewlyAcked {
    /// Bytes in flight when the acknowledgement arrived.
    pub in_flight_before: u64,
    /// The largest packet number acknowledged (never beyond what the link sent).
    pub largest: u64,
    /// The newest outstanding packet it acknowledged: number, send time, ack-eliciting.
    pub newest: Option<(u64, Instant, bool)>,
    /// `newest` is numbered above every packet acknowledged before (not an old one whose
    /// acknowledgement was lost or reordered).
    pub newest_is_new: bool,
    /// The newest packet it acknowledged after it had been declared lost: number, send time.
    pub newest_late: Option<(u64, Instant)>,
    /// Only acknowledgement-only packets (not kept, so never in `newest`) were newly
    /// acknowledged, and they raised the largest number acknowledged: losses may show.
    pub ack_only_raised_largest: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Recovery {
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
    /// Bytes of data packets outstanding (probes of a link that is not up do not count).
    pub bytes_in_flight: u64,
    largest_acked: Option<u64>,
    /// Time threshold loss timer.
    loss_time: Option<Instant>,
    /// When an acknowledgement last newly acknowledged something sent on this link.
    pub last_ack_time: Option<Instant>,
    /// When the newest packet acknowledged so far was sent: the peer was alive and heard
    /// this link at least until then.
    newest_acked_sent: Option<Instant>,
    pub last_ack_eliciting_sent: Option<Instant>,
    /// Probe timeouts in a row without any acknowledgement.
    pub pto_count: u32,
    last_pto: Option<Instant>,
    /// A PTO fired: ack-eliciting packets to send on this link (two, so that one lost
    /// datagram does not make the whole timeout count as silence).
    pub pto_probes_pending: u8,
}

impl Recovery {
    /// The number the next packet sent gets.
    /// Whether a packet in flight carries application data (stream bytes or datagrams), not
    /// just probes, keepalives or control frames.
    pub fn data_in_flight(&self) -> bool {
        self.sent.iter().any(|(_, p)| {
            p.in_flight
                && p.frames
                    .iter()
                    .any(|f| matches!(f, SentFrame::Stream { .. } | SentFrame::Datagram(_)))
        })
    }

    /// When the oldest packet still waiting for its acknowledgement was sent.
    pub fn oldest_outstanding_sent(&self) -> Option<Instant> {
        self.sent.oldest().map(|p| p.time)
    }

    pub fn next_pn(&self) -> u64 {
        self.next_pn
    }

    pub fn largest_acked(&self) -> Option<u64> {
        self.largest_acked
    }

    /// Records a packet sent now; returns its number.
    pub fn on_sent(&mut self, now: Instant, pkt: SentPacket) -> u64 {
        let pn = self.next_pn;
        self.next_pn += 1;
        // only kept packets leave bytes in flight again (acknowledged or lost): one in flight
        // and not kept would hold its bytes for good
        debug_assert!(!pkt.in_flight || pkt.ack_eliciting, "in flight, not kept");
        if pkt.in_flight {
            self.bytes_in_flight += u64::from(pkt.size);
        }
        if pkt.ack_eliciting {
            self.last_ack_eliciting_sent = Some(now);
            self.sent.insert(pn, pkt);
        }
        pn
    }

    /// Takes the packets the ranges `(lo, hi)` of an ACK frame acknowledge into `out.acked`
    /// (and `out.acked_late`, `out.probes_acked`). None if the link never sent anything.
    pub fn on_ack(
        &mut self,
        now: Instant,
        ranges: impl Iterator<Item = (u64, u64)>,
        largest: u64,
        out: &mut AckOutcome,
    ) -> Option<NewlyAcked> {
        // Numbers this link never sent cannot be acknowledged: a peer that received a forged
        // packet numbered far ahead acknowledges it, and taken as the largest acknowledged it
        // would have every packet sent since declared lost at once, for good. The largest is
        // that of the ranges that remain: neither the frame's own, nor the last packet sent,
        // which a range of numbers never sent does not prove received either.
        let last_sent = self.next_pn.checked_sub(1)?;
        let mut acked = NewlyAcked {
            in_flight_before: self.bytes_in_flight,
            largest: largest.min(last_sent),
            newest: None,
            newest_is_new: false,
            newest_late: None,
            ack_only_raised_largest: false,
        };
        let mut largest_real = None;
        for (lo, hi) in ranges.filter(|&(lo, _)| lo <= last_sent) {
            let hi = hi.min(last_sent);
            largest_real = largest_real.max(Some(hi));
            if let Some(late) = self.take_acked_late(lo..=hi, out) {
                acked.newest_late = acked.newest_late.max(Some(late));
            }
            for pn in self.sent.clamp(lo..=hi) {
                let Some(pkt) = self.sent.remove(pn) else {
                    continue;
                };
                if acked.newest.is_none_or(|(newest, _, _)| pn > newest) {
                    acked.newest = Some((pn, pkt.time, pkt.ack_eliciting));
                }
                if pkt.in_flight {
                    self.bytes_in_flight -= u64::from(pkt.size);
                }
                out.probes_acked += u32::from(pkt.probe);
                out.acked.push(pkt);
            }
        }
        if let Some(real) = largest_real {
            acked.largest = real;
        }
        out.newest_acked = acked
            .newest
            .map(|(pn, ..)| pn)
            .max(acked.newest_late.map(|l| l.0));
        if let Some((pn, sent, _)) = acked.newest {
            acked.newest_is_new = self.largest_acked.is_none_or(|l| pn > l);
            self.largest_acked = Some(
                self.largest_acked
                    .map_or(acked.largest, |l| l.max(acked.largest)),
            );
            self.last_ack_time = Some(now);
            self.newest_acked_sent = self.newest_acked_sent.max(Some(sent));
            self.pto_count = 0;
            self.pto_probes_pending = 0;
        } else if let Some(real) =
            largest_real.filter(|&r| self.largest_acked.is_none_or(|l| r > l))
        {
            // Only acknowledgement-only packets are newly acknowledged: they were sent after
            // every packet still outstanding below them, so they count for the packet
            // threshold as any packet does (RFC 9002 §6.1 keeps them for this). On a link that
            // mostly acknowledges the peer's data, a lost window update would otherwise wait
            // for the probe timeout.
            acked.ack_only_raised_largest = true;
            self.largest_acked = Some(real);
        }
        Some(acked)
    }

    /// Packet- and time-threshold loss detection: appends the packets now deemed lost to
    /// `out.lost`. Path MTU probes among them stay out of bytes in flight and memory: their
    /// loss may only mean the size was too large.
    pub fn detect_lost(&mut self, now: Instant, rtt: &Rtt, out: &mut AckOutcome) {
        self.loss_time = None;
        let Some(largest) = self.largest_acked else {
            return;
        };
        let delay = rtt.loss_delay();
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
        for pn in lost_pns {
            let pkt = self.sent.remove(pn).expect("listed just now");
            if !pkt.mtu_probe {
                if pkt.in_flight {
                    self.bytes_in_flight -= u64::from(pkt.size);
                }
                self.remember_lost(pn, &pkt);
            }
            out.lost.push(pkt);
        }
    }

    /// Declares everything outstanding lost (the link failed): it will be re-sent elsewhere.
    pub fn drain(&mut self, out: &mut AckOutcome) {
        let mut sent = std::mem::take(&mut self.sent);
        for (pn, pkt) in sent.drain() {
            self.remember_lost(pn, &pkt);
            out.lost.push(pkt);
        }
        self.sent = sent;
        self.bytes_in_flight = 0;
        self.loss_time = None;
        self.pto_count = 0;
        self.pto_probes_pending = 0;
    }

    /// Declares lost the probes outstanding for longer than `patience`; returns how many.
    pub fn expire_probes(&mut self, now: Instant, patience: Duration, out: &mut AckOutcome) -> u32 {
        let mut expired = SmallVec::<[(u64, SentPacket); 4]>::new();
        self.sent.remove_where(
            |_, p| p.probe && now.saturating_duration_since(p.time) > patience,
            |pn, p| expired.push((pn, p)),
        );
        let count = expired.len() as u32;
        for (pn, p) in expired {
            self.remember_lost(pn, &p);
            out.lost.push(p);
        }
        count
    }

    /// The link came up: probes still outstanding must not trigger a probe timeout, so they
    /// count as lost (their control frames are sent again).
    pub fn on_promoted(&mut self, out: &mut AckOutcome) {
        self.sent
            .remove_where(|_, p| p.probe, |_, p| out.lost.push(p));
        self.pto_count = 0;
        self.last_pto = None;
    }

    pub fn on_demoted(&mut self) {
        self.last_pto = None;
    }

    /// Remembers lost packet `pn` if it was a probe or carried stream data (see
    /// `lost_recently`).
    fn remember_lost(&mut self, pn: u64, pkt: &SentPacket) {
        let frames: Frames = pkt
            .frames
            .iter()
            .filter(|f| matches!(f, SentFrame::Stream { .. }))
            .cloned()
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
                out.acked_late.push(l.frames);
            }
        }
        newest
    }

    /// When loss detection's time threshold declares the oldest waiting packet lost.
    pub fn loss_deadline(&self) -> Option<Instant> {
        self.loss_time
    }

    /// When the probe timeout `pto` fires, if something is outstanding and no timeout's
    /// probes are still waiting to go out.
    pub fn pto_deadline(&self, pto: Duration) -> Option<Instant> {
        if self.sent.is_empty() || self.pto_probes_pending > 0 {
            return None;
        }
        let oldest = self.sent.oldest().map(|p| p.time);
        let base = [oldest, self.last_ack_time, self.last_pto]
            .into_iter()
            .flatten()
            .max()?;
        Some(base + pto)
    }

    /// A probe timeout fired. Returns true when the link must be declared down: after
    /// `failure_ptos` timeouts in a row, and, if `peer_silent` (no other link shows the peer
    /// answering), once it has been silent for [`SILENT_PEER_PATIENCE`]. Else two probes are
    /// due.
    pub fn on_pto(&mut self, now: Instant, failure_ptos: u32, peer_silent: bool) -> bool {
        self.pto_count += 1;
        self.last_pto = Some(now);
        let silent_since = [self.sent.oldest().map(|p| p.time), self.last_ack_time]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(now);
        let patient =
            !peer_silent || now.saturating_duration_since(silent_since) >= SILENT_PEER_PATIENCE;
        if self.pto_count >= failure_ptos && patient {
            return true;
        }
        self.pto_probes_pending = 2;
        false
    }

    /// Whether `other` got an acknowledgement for something sent after this link's oldest
    /// unacknowledged packet (see [`super::Link::heard_after_silence`]).
    pub fn heard_after_silence(&self, other: &Recovery) -> bool {
        match (self.sent.oldest(), other.newest_acked_sent) {
            (Some(oldest), Some(acked)) => acked > oldest.time,
            _ => false,
        }
    }
}
