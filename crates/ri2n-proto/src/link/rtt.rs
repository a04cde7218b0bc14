//! The RFC 9002 round-trip estimator of one link (§5).

use std::time::Duration;

/// RTT assumed before the first sample.
const INITIAL_RTT: Duration = Duration::from_millis(100);
/// Timer granularity: no timer is shorter (RFC 9002 §6.1.2 `kGranularity`).
pub(crate) const GRANULARITY: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Copy)]
pub(crate) struct Rtt {
    pub srtt: Duration,
    pub rttvar: Duration,
    pub min: Duration,
    pub latest: Duration,
    has_sample: bool,
    /// The estimate is a seed ([`Self::seed`]) that may be much too long: the first sample
    /// replaces it rather than being averaged in.
    seeded: bool,
    /// `srtt + max(4 × rttvar, granularity)`, the round-trip part of the probe timeout (RFC
    /// 9002 §6.2.1): kept with the estimate, as the timers ask for it several times a packet.
    pto_span: Duration,
}

impl Rtt {
    pub fn new() -> Self {
        Self {
            srtt: INITIAL_RTT,
            rttvar: INITIAL_RTT / 2,
            min: Duration::MAX,
            latest: INITIAL_RTT,
            has_sample: false,
            seeded: false,
            pto_span: INITIAL_RTT + (INITIAL_RTT / 2 * 4).max(GRANULARITY),
        }
    }

    /// Whether the estimate rests on a measurement rather than the initial assumption.
    pub fn has_sample(&self) -> bool {
        self.has_sample
    }

    /// Takes `rtt`, a round trip at least as long as the path's (the handshake's, which may
    /// include the wait before an INITIAL was sent again), as the estimate until the first
    /// sample, which then replaces it: averaged in, a seed of a lost INITIAL's retransmission
    /// interval would take dozens of samples to wear off, with probe timeouts that long.
    pub fn seed(&mut self, rtt: Duration) {
        self.update(rtt, Duration::ZERO);
        self.seeded = true;
    }

    pub fn update(&mut self, sample: Duration, ack_delay: Duration) {
        if std::mem::take(&mut self.seeded) {
            *self = Self::new();
        }
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
        self.pto_span = self.srtt + (self.rttvar * 4).max(GRANULARITY);
    }

    /// Forgets the smallest round trip seen: the path may have changed (a link that went down
    /// may come back over a longer route). The next sample, a probe's while the link is not
    /// up, sets it again; the smoothed estimate stands in until then.
    pub fn forget_min(&mut self) {
        self.min = Duration::MAX;
    }

    /// `srtt + max(4 × rttvar, granularity)` (RFC 9002 §6.2.1).
    pub fn pto_span(&self) -> Duration {
        self.pto_span
    }

    /// The path's round-trip time without queueing: the smallest seen (smoothed before any).
    pub fn base(&self) -> Duration {
        if self.min == Duration::MAX {
            self.srtt
        } else {
            self.min
        }
    }

    /// How long after a packet was sent it counts as lost if later ones were acknowledged
    /// (RFC 9002 §6.1.2, time threshold 9/8).
    pub fn loss_delay(&self) -> Duration {
        (self.srtt.max(self.latest) * 9 / 8).max(GRANULARITY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seed from a handshake whose first INITIAL was lost is a retransmission interval too
    /// long: the first sample replaces it.
    #[test]
    fn the_first_sample_replaces_a_seed() {
        let ms = Duration::from_millis;
        let mut rtt = Rtt::new();
        rtt.seed(ms(201));
        assert_eq!(rtt.srtt, ms(201));
        assert!(rtt.has_sample());
        rtt.update(ms(1), Duration::ZERO);
        assert_eq!(
            (rtt.srtt, rtt.rttvar, rtt.min),
            (ms(1), Duration::from_micros(500), ms(1))
        );
        rtt.update(ms(9), Duration::ZERO);
        assert_eq!(rtt.srtt, ms(2), "later samples are averaged in");
    }

    /// The kept probe-timeout span always equals `srtt + max(4 × rttvar, granularity)` of the
    /// current estimate: before any sample, after the first and through later ones.
    #[test]
    fn pto_span_follows_the_estimate() {
        let span = |r: &Rtt| r.srtt + (r.rttvar * 4).max(GRANULARITY);
        let mut rtt = Rtt::new();
        assert_eq!(rtt.pto_span(), span(&rtt));
        assert_eq!(rtt.pto_span(), Duration::from_millis(300));
        let samples_us = [800, 120, 95, 5000, 100, 100, 100, 90];
        for (k, us) in samples_us.into_iter().enumerate() {
            rtt.update(
                Duration::from_micros(us),
                Duration::from_micros(10 * k as u64),
            );
            assert_eq!(rtt.pto_span(), span(&rtt), "after sample {k}");
        }
        // a steady short path: the variance shrinks below the granularity, which then rules
        for _ in 0..200 {
            rtt.update(Duration::from_micros(50), Duration::ZERO);
        }
        assert_eq!(rtt.pto_span(), rtt.srtt + GRANULARITY);
    }
}
