//! One link's receive side: which of the peer's packet numbers arrived (what ACK frames say),
//! and when an acknowledgement is due (PROTOCOL.md §5.2).

use std::time::{Duration, Instant};

use crate::ranges::RangeSet;
use crate::ConnectionConfig;

/// Ranges of received packet numbers remembered per link (older ones are forgotten; a peer
/// that missed their acknowledgement re-sends the data, which the streams de-duplicate).
const MAX_RECEIVED_RANGES: usize = 64;
/// Furthest a packet number may run ahead of the largest received on its link, besides what
/// the peer may have sent since that one arrived ([`MAX_PACKETS_PER_SECOND`]).
const MAX_PN_JUMP: u64 = 1 << 20;
/// More packets than a sender puts on one link in a second (100 Gbit/s of full-size packets
/// is under a tenth of it). A link that was up and died is probed every probe interval for as
/// long as it is down, each probe with a number of its own: after hours, its first packet
/// at the heal runs that far ahead, and a fixed bound dropped every one of them, so the link
/// (and, after an outage of every link, the connection) never came back.
const MAX_PACKETS_PER_SECOND: u64 = 10_000_000;
/// At high rates, about this many ACK frames per `max_ack_delay` (PROTOCOL.md §5.2): the
/// ack-eliciting count that makes an ACK due grows with the arrival rate.
const ACKS_PER_DELAY: u32 = 4;
/// The most ack-eliciting packets one ACK waits for (about one receive batch).
const MAX_ACK_THRESHOLD: u32 = 32;

/// What an accepted packet asks of the acknowledgements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Eliciting {
    /// Nothing (ACK frames, padding, CLOSE): recorded, never acknowledged by itself.
    No,
    /// A PING and nothing else that asks for an ACK: a keepalive or a probe. Acknowledged at
    /// once: the peer is timing the round trip or watching the link, and nothing more of
    /// it is coming to share the ACK with.
    PingOnly,
    /// Data or control frames: acknowledged after the delay or the threshold.
    Yes,
}

/// The acknowledgement state of one link.
#[derive(Debug, Default)]
pub(crate) struct AckState {
    /// Packet numbers received from the peer on this link (a bounded window of ranges).
    received: RangeSet,
    /// Packet numbers below it were forgotten: they count as received (replays, or packets
    /// so late that the sender has long declared them lost).
    floor: u64,
    /// The largest one, and when it arrived (for the reported delay).
    largest: Option<(u64, Instant)>,
    /// Ack-eliciting packets since the last ACK frame was sent.
    eliciting_since_ack: u32,
    /// An ACK frame for this link should be sent (something new arrived).
    pending: bool,
    /// The ACK must go out now (threshold or reordering), not after the delay.
    immediate: bool,
    /// Latest time the ACK may be delayed to.
    deadline: Option<Instant>,
    /// Ack-eliciting arrivals counted since `period_start`, and in the last whole period of
    /// `max_ack_delay`: the arrival rate the ACK threshold scales with.
    period_start: Option<Instant>,
    period_count: u32,
    last_period_count: u32,
}

impl AckState {
    /// Whether packet number `pn`, arriving `now`, is new: not received before, not below
    /// what this side can still tell apart (the anti-replay floor), and not further ahead of
    /// the largest than a window holds plus what the peer can have sent since that one came
    /// (beyond, it is forged or broken: remembering it would poison every later ACK).
    pub fn is_new(&self, now: Instant, pn: u64) -> bool {
        let largest = self.largest.map(|(l, _)| l);
        let since = self
            .largest
            .map_or(Duration::ZERO, |(_, at)| now.saturating_duration_since(at));
        let sent_since = u64::try_from(since.as_micros())
            .unwrap_or(u64::MAX)
            .saturating_mul(MAX_PACKETS_PER_SECOND / 1_000_000);
        let furthest = (largest.unwrap_or(0) + MAX_PN_JUMP).saturating_add(sent_since);
        if pn > furthest || pn < self.floor {
            return false;
        }
        largest.is_none_or(|l| pn > l) || !self.received.contains(pn)
    }

    /// Records a packet number from the peer. Returns false if it is not new ([`is_new`]).
    ///
    /// [`is_new`]: Self::is_new
    pub fn on_received(
        &mut self,
        now: Instant,
        pn: u64,
        eliciting: Eliciting,
        cfg: &ConnectionConfig,
    ) -> bool {
        if !self.is_new(now, pn) {
            return false;
        }
        let largest = self.largest.map(|(l, _)| l);
        let newest = largest.is_none_or(|l| pn > l);
        let in_order = largest.is_none_or(|l| pn == l + 1);
        self.received.insert(pn..pn + 1);
        if self.received.range_count() > MAX_RECEIVED_RANGES {
            // what falls out of the window can no longer be told apart from a replay
            self.received.keep_highest(MAX_RECEIVED_RANGES);
            self.floor = self.received.min().unwrap_or(0);
        }
        if newest {
            self.largest = Some((pn, now));
        }
        if eliciting != Eliciting::No {
            self.pending = true;
            self.eliciting_since_ack += 1;
            self.count_arrival(now, cfg.max_ack_delay);
            let ping = eliciting == Eliciting::PingOnly;
            if !in_order || ping || self.eliciting_since_ack >= self.threshold(cfg) {
                self.immediate = true;
            }
            if self.deadline.is_none() {
                self.deadline = Some(now + cfg.max_ack_delay);
            }
        }
        true
    }

    /// Counts an ack-eliciting arrival in the current period of `period` (a period with no
    /// arrivals for longer than itself counts as empty).
    fn count_arrival(&mut self, now: Instant, period: Duration) {
        match self.period_start {
            Some(start) if now.saturating_duration_since(start) < period => {}
            Some(start) => {
                let idle = now.saturating_duration_since(start) >= 2 * period;
                self.last_period_count = if idle { 0 } else { self.period_count };
                self.period_start = Some(now);
                self.period_count = 0;
            }
            None => self.period_start = Some(now),
        }
        self.period_count = self.period_count.saturating_add(1);
    }

    /// How many ack-eliciting packets make an ACK due at once: `ack_frequency` at low rates,
    /// more as the rate grows, so that about [`ACKS_PER_DELAY`] ACKs go back per
    /// `max_ack_delay` (at 10 Gbit/s, one per two packets would be over 400 000 ACKs a second
    /// for the sender to process).
    fn threshold(&self, cfg: &ConnectionConfig) -> u32 {
        (self.last_period_count / ACKS_PER_DELAY)
            .clamp(cfg.ack_frequency, MAX_ACK_THRESHOLD.max(cfg.ack_frequency))
    }

    /// Whether an ACK frame for this link waits to be sent.
    pub fn is_pending(&self) -> bool {
        self.pending
    }

    /// Whether this link's ACK must be sent at `now`.
    pub fn is_due(&self, now: Instant) -> bool {
        self.pending && (self.immediate || self.deadline.is_some_and(|d| d <= now))
    }

    /// When the delayed acknowledgement is due.
    pub fn timer(&self) -> Option<Instant> {
        self.deadline.filter(|_| self.pending)
    }

    /// Delay to report for the largest received packet.
    pub fn delay(&self, now: Instant) -> Duration {
        self.largest
            .map_or(Duration::ZERO, |(_, t)| now.saturating_duration_since(t))
    }

    /// The received ranges, highest first, as `(smallest, largest)` (an ACK frame's order).
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + Clone + '_ {
        self.received.iter().rev().map(|r| (r.start, r.end - 1))
    }

    /// An ACK frame for this link was sent.
    pub fn on_sent(&mut self) {
        self.pending = false;
        self.immediate = false;
        self.deadline = None;
        self.eliciting_since_ack = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A number far ahead of the largest is taken when it comes long enough after it: the
    /// first probe at the heal of a link down for hours (a probe every 20 ms, each with its
    /// own number) runs more than 2^20 ahead. A number as far ahead right after is refused.
    #[test]
    fn a_jump_is_measured_against_the_time_since_the_largest() {
        let cfg = ConnectionConfig::default();
        let t0 = Instant::now();
        let mut a = AckState::default();
        assert!(a.on_received(t0, 10, Eliciting::Yes, &cfg));
        let six_hours = Duration::from_secs(6 * 3600);
        // the probes sent meanwhile, one per 20 ms
        let after_outage = 10 + six_hours.as_millis() as u64 / 20;
        assert!(
            after_outage > 10 + MAX_PN_JUMP,
            "the premise: beyond the fixed bound"
        );
        assert!(
            !a.is_new(t0 + Duration::from_millis(1), after_outage),
            "at once: forged"
        );
        assert!(a.on_received(t0 + six_hours, after_outage, Eliciting::PingOnly, &cfg));
        assert_eq!(a.ranges().next(), Some((after_outage, after_outage)));
    }

    #[test]
    fn duplicates_jumps_and_reordering() {
        let cfg = ConnectionConfig::default();
        let now = Instant::now();
        let mut a = AckState::default();
        assert!(a.on_received(now, 0, Eliciting::Yes, &cfg));
        assert!(!a.is_due(now), "one packet waits for the delay");
        assert_eq!(a.timer(), Some(now + cfg.max_ack_delay));
        assert!(a.on_received(now, 1, Eliciting::Yes, &cfg));
        assert!(a.is_due(now), "the second is the ack frequency");
        assert!(!a.on_received(now, 1, Eliciting::Yes, &cfg), "duplicate");
        assert!(
            !a.on_received(now, 2 + MAX_PN_JUMP, Eliciting::Yes, &cfg),
            "jump"
        );
        a.on_sent();
        assert!(!a.is_pending());
        assert!(a.on_received(now, 5, Eliciting::Yes, &cfg));
        assert!(a.is_due(now), "a gap is acknowledged at once");
        assert_eq!(a.ranges().collect::<Vec<_>>(), [(5, 5), (0, 1)]);
        // not ack-eliciting: recorded, no acknowledgement owed
        a.on_sent();
        assert!(a.on_received(now, 6, Eliciting::No, &cfg));
        assert!(!a.is_pending());
        assert_eq!(a.ranges().next(), Some((5, 6)));
    }

    #[test]
    fn a_bare_ping_is_acknowledged_at_once() {
        let cfg = ConnectionConfig::default();
        let now = Instant::now();
        let mut a = AckState::default();
        a.on_received(now, 0, Eliciting::Yes, &cfg);
        a.on_sent();
        assert!(a.on_received(now, 1, Eliciting::PingOnly, &cfg));
        assert!(
            a.is_due(now),
            "a keepalive's answer does not wait for the delay"
        );
    }

    #[test]
    fn forgotten_numbers_stay_rejected() {
        let cfg = ConnectionConfig::default();
        let now = Instant::now();
        let mut a = AckState::default();
        // every other number: one range each, more than the window keeps
        for pn in (0..2 * (MAX_RECEIVED_RANGES as u64 + 10)).step_by(2) {
            assert!(a.on_received(now, pn, Eliciting::Yes, &cfg));
        }
        assert!(!a.is_new(now, 0), "forgotten, so possibly a replay");
        assert!(
            !a.is_new(now, 3),
            "a gap below the window cannot be told from a replay"
        );
        // the gaps fill in: fewer ranges than the window, and still no replay of the old ones
        let top = 2 * (MAX_RECEIVED_RANGES as u64 + 10);
        for pn in (21..top).step_by(2) {
            a.on_received(now, pn, Eliciting::Yes, &cfg);
        }
        assert!(a.received.range_count() < MAX_RECEIVED_RANGES);
        for pn in 0..20 {
            assert!(
                !a.on_received(now, pn, Eliciting::Yes, &cfg),
                "replay of {pn} accepted"
            );
        }
    }

    #[test]
    fn acknowledgements_thin_out_as_the_rate_grows() {
        let cfg = ConnectionConfig::default();
        let mut a = AckState::default();
        let start = Instant::now();
        // 1 packet per 100 µs (10 per ms): below the scaling, an ACK every 2 packets
        let mut acks = 0;
        for pn in 0..100u64 {
            a.on_received(
                start + Duration::from_micros(100 * pn),
                pn,
                Eliciting::Yes,
                &cfg,
            );
            if a.is_due(start) {
                acks += 1;
                a.on_sent();
            }
        }
        assert_eq!(acks, 50);
        // then 400 packets per ms: after one period at the old rate, an ACK per 32 packets
        // (the cap; 400 / 4 per period would be 100)
        let t0 = start + Duration::from_millis(20);
        let (mut acks, mut since) = (0, 0);
        for i in 0..4000u64 {
            let pn = 100 + i;
            a.on_received(
                t0 + Duration::from_nanos(2500 * i),
                pn,
                Eliciting::Yes,
                &cfg,
            );
            since += 1;
            if a.is_due(t0) {
                assert!(since <= 32);
                if i >= 1000 {
                    acks += 1;
                }
                since = 0;
                a.on_sent();
            }
        }
        assert!(
            (90..=100).contains(&acks),
            "{acks} ACKs for the last 3000 packets"
        );
        // reordering still makes one due at once
        a.on_received(t0 + Duration::from_millis(11), 4200, Eliciting::Yes, &cfg);
        assert!(a.is_due(t0));
    }
}
