//! The per-link state of a connection's two health detectors, run every
//! `share_check_interval` by the connection (which compares the links with each other): the
//! receiver side's arrival-share detector ([`ShareDetector`]: a link whose share of arrivals
//! collapses is reported to the sender, RI2N/UDP) and the sender side's slow-link check
//! ([`SlowLinkCheck`]: a link whose in-flight data cannot drain within the scheduling budget).
//! Each decides from its own link's history when a finding has lasted long enough to act on.

/// Ack-eliciting arrivals a share-check period needs before its shares mean anything.
const MIN_PERIOD_ARRIVALS: u64 = 32;
/// Periods a link's usual share is learned over before the detector judges it.
const SHARE_WARMUP_PERIODS: u32 = 3;
/// A link whose usual share is below this is too small to judge.
const MIN_JUDGED_SHARE: f64 = 0.05;
/// Consecutive checks (of `share_check_interval` each) that must find a link slow, or its
/// share of arrivals collapsed, before it is reported or demoted: one period can be skewed by
/// a scheduling stall of either host at high rates, a slow switch stays slow.
const CHECKS_TO_JUDGE: u8 = 2;

/// The receiver side's view of one link for the arrival-share detector.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShareDetector {
    /// Ack-eliciting arrivals in the current period.
    arrivals: u64,
    /// The link's usual share of arrivals, learned over healthy periods.
    expected: f64,
    /// Healthy periods learned from since the last verdict.
    periods: u32,
    /// Consecutive periods in which the share collapsed.
    collapsed: u8,
}

impl ShareDetector {
    pub fn on_arrival(&mut self) {
        self.arrivals += 1;
    }

    /// Ack-eliciting arrivals in the current period.
    pub fn arrivals(&self) -> u64 {
        self.arrivals
    }

    /// Whether the detector has anything to judge at the end of the period: arrivals, or a
    /// collapse it has begun to count.
    pub fn is_pending(&self) -> bool {
        self.arrivals > 0 || self.collapsed > 0
    }

    /// Ends a period in which every link together had `total` arrivals; returns true when
    /// this link's share has collapsed for long enough to be reported.
    pub fn end_period(&mut self, total: u64, collapse_ratio: f64) -> bool {
        let arrivals = std::mem::take(&mut self.arrivals);
        if total < MIN_PERIOD_ARRIVALS {
            // too quiet to judge: a collapse counts consecutive periods, so it starts over
            // (and an idle connection has nothing left to check)
            self.collapsed = 0;
            return false;
        }
        let share = arrivals as f64 / total as f64;
        let collapsed = self.periods >= SHARE_WARMUP_PERIODS
            && self.expected >= MIN_JUDGED_SHARE
            && share < collapse_ratio * self.expected;
        if !collapsed {
            self.collapsed = 0;
            self.expected = if self.periods == 0 {
                share
            } else {
                0.75 * self.expected + 0.25 * share
            };
            self.periods = self.periods.saturating_add(1);
            return false;
        }
        // a single skewed period may be a scheduling stall: keep the expected share and let
        // the next period decide
        self.collapsed += 1;
        if self.collapsed < CHECKS_TO_JUDGE {
            return false;
        }
        tracing::debug!(share, expected = self.expected, "share collapsed");
        // learn the link's share afresh once the sender has dealt with it
        *self = Self::default();
        true
    }
}

/// The sender side's view of one link for the slow-link check.
#[derive(Debug, Clone, Default)]
pub(crate) struct SlowLinkCheck {
    /// Consecutive checks that found the link too slow for its data.
    slow_checks: u8,
}

impl SlowLinkCheck {
    /// Whether a verdict is in the making (the last check found the link slow).
    pub fn is_pending(&self) -> bool {
        self.slow_checks > 0
    }

    /// Records one check's finding; returns true when the link has been slow long enough.
    pub fn judge(&mut self, slow: bool) -> bool {
        self.slow_checks = if slow { self.slow_checks + 1 } else { 0 };
        if self.slow_checks >= CHECKS_TO_JUDGE {
            self.slow_checks = 0;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One period in which this link had `arrivals` of all links' `total`; whether the
    /// collapse is reported.
    fn period(d: &mut ShareDetector, arrivals: u64, total: u64) -> bool {
        for _ in 0..arrivals {
            d.on_arrival();
        }
        d.end_period(total, 0.25)
    }

    /// A collapse is reported after consecutive collapsed periods only, and one begun before
    /// the traffic stopped leaves nothing to check while the connection idles. Before, a
    /// quiet period kept the count: the connection's health check stayed armed (a wake-up
    /// every period for as long as it idled), and a collapsed period long after counted as
    /// the second in a row.
    #[test]
    fn a_quiet_period_ends_a_collapse_being_counted() {
        let mut d = ShareDetector::default();
        for _ in 0..SHARE_WARMUP_PERIODS {
            assert!(!period(&mut d, 50, 100));
        }
        assert!(
            !period(&mut d, 1, 100),
            "one collapsed period is not enough"
        );
        assert!(d.is_pending(), "the premise: a collapse is being counted");
        assert!(!period(&mut d, 0, 0));
        assert!(!d.is_pending(), "an idle connection has nothing to check");
        assert!(!period(&mut d, 1, 100), "not two in a row");
        assert!(period(&mut d, 1, 100), "two in a row");
    }
}
