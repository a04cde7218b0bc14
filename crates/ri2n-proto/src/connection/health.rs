//! The two link-health detectors of a connection, run every `share_check_interval`:
//! the receiver side's arrival-share check (RI2N/UDP: a link whose share of arrivals collapses
//! is reported to the sender) and the sender side's slow-link check (a link whose in-flight
//! data cannot drain within the scheduling budget). Each keeps its per-link state in the
//! link's [`ShareDetector`] or slow-check counter.

use std::time::Instant;

use crate::wire;
use crate::LinkState;

use super::Connection;

/// Ack-eliciting arrivals a share-check period needs before its shares mean anything.
const MIN_PERIOD_ARRIVALS: u64 = 32;
/// Periods a link's usual share is learned over before the detector judges it.
const SHARE_WARMUP_PERIODS: u32 = 3;
/// A link whose usual share is below this is too small to judge.
const MIN_JUDGED_SHARE: f64 = 0.05;
/// A link whose in-flight data needs this many scheduling budgets to drain is degraded.
const SLOW_LINK_FACTOR: f64 = 4.0;
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

    /// Ends a period in which every link together had `total` arrivals; returns true when
    /// this link's share has collapsed for long enough to be reported.
    fn end_period(&mut self, total: u64, collapse_ratio: f64) -> bool {
        let arrivals = std::mem::take(&mut self.arrivals);
        if total < MIN_PERIOD_ARRIVALS {
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
    /// Records one check's finding; returns true when the link has been slow long enough.
    fn judge(&mut self, slow: bool) -> bool {
        self.slow_checks = if slow { self.slow_checks + 1 } else { 0 };
        if self.slow_checks >= CHECKS_TO_JUDGE {
            self.slow_checks = 0;
            return true;
        }
        false
    }
}

impl Connection {
    /// Whether the health checks have anything to look at: arrivals in the current period,
    /// data in flight, or a verdict in the making. The check timer is armed only then: checks
    /// of an idle connection find nothing, and a timer every `share_check_interval` kept
    /// the driver of every idle endpoint awake about a thousand times a second.
    pub(super) fn health_checks_pending(&self) -> bool {
        self.links.iter().any(|l| {
            l.share.arrivals > 0
                || l.share.collapsed > 0
                || l.slow_check.slow_checks > 0
                || l.bytes_in_flight() > 0
        })
    }

    /// RI2N's receiver-side detector: a link whose share of arrivals collapses relative to its
    /// usual share is reported to the sender, which catches a switch that still forwards but
    /// has become very slow (the sender alone would see only slowly growing delays).
    pub(super) fn check_arrival_shares(&mut self) {
        let total: u64 = self.links.iter().map(|l| l.share.arrivals).sum();
        let ratio = self.cfg.share_collapse_ratio;
        for l in &mut self.links {
            if l.share.end_period(total, ratio) {
                tracing::debug!(link = %l.id, "reporting the link degraded");
                self.link_status_pending
                    .push((l.id, wire::link_status::DEGRADED));
            }
        }
    }

    /// Sender-side soft-failure check: the scheduler never lets a link's promised arrival
    /// run far past the budget, so a link whose in-flight data now needs several budgets to
    /// drain has collapsed under it (a switch gone slow). Demote it; its data is re-sent on
    /// the others. The receiver's share check catches the same at high rates; this one also
    /// works when too few packets arrive for shares to mean anything.
    pub(super) fn check_slow_links(&mut self, now: Instant) {
        if self.links.iter().filter(|l| l.is_up()).count() < 2 {
            return;
        }
        let (fastest, budget) = self.eta_budget(now);
        let limit = budget * SLOW_LINK_FACTOR;
        for i in 0..self.links.len() {
            let eta = self.links[i].eta(now);
            // only a measured link can be judged: before its first samples the ETA rests on
            // assumed values; and one with nothing in flight holds no data up
            let slow = self.links[i].is_up()
                && self.links[i].is_measured()
                && self.links[i].bytes_in_flight() > 0
                && eta > limit
                && eta > fastest;
            if self.links[i].slow_check.judge(slow) {
                tracing::debug!(link = i, eta, budget, "link too slow for its data");
                self.set_link_state(i, now, LinkState::Degraded);
            }
        }
    }
}
