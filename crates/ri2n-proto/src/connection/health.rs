//! The two link-health detectors of a connection, run every `share_check_interval`:
//! the receiver side's arrival-share check (RI2N/UDP: a link whose share of arrivals collapses
//! is reported to the sender) and the sender side's slow-link check (a link whose in-flight
//! data cannot drain within the scheduling budget). Here is what compares the links with each
//! other and acts on a verdict; each link's own state and verdicts are its
//! [`ShareDetector`](crate::link::ShareDetector) and
//! [`SlowLinkCheck`](crate::link::SlowLinkCheck) (in `link/health.rs`).

use std::time::Instant;

use crate::wire;
use crate::LinkState;

use super::Connection;

/// A link whose in-flight data needs this many scheduling budgets to drain is degraded.
const SLOW_LINK_FACTOR: f64 = 4.0;
/// ... and at least this long (seconds). On paths of a few microseconds the budget itself can
/// shrink to microseconds for a moment: one delivery-rate sample taken across a stall of the
/// receiver, or the window's rate of a link with nothing in flight (its window over a round
/// trip of microseconds), and a link then looks slow whose data drains in a millisecond.
/// Data that drains that soon holds nothing up; a link gone soft holds its data for far longer.
const MIN_SLOW_ETA: f64 = 0.010;

impl Connection {
    /// Whether the health checks have anything to look at: arrivals in the current period,
    /// data in flight, or a verdict in the making. The check timer is armed only then: checks
    /// of an idle connection find nothing, and a timer every `share_check_interval` kept
    /// the driver of every idle endpoint awake about a thousand times a second.
    pub(super) fn health_checks_pending(&self) -> bool {
        self.links
            .iter()
            .any(|l| l.share.is_pending() || l.slow_check.is_pending() || l.bytes_in_flight() > 0)
    }

    /// RI2N's receiver-side detector: a link whose share of arrivals collapses relative to its
    /// usual share is reported to the sender, which catches a switch that still forwards but
    /// has become very slow (the sender alone would see only slowly growing delays).
    pub(super) fn check_arrival_shares(&mut self) {
        let total: u64 = self.links.iter().map(|l| l.share.arrivals()).sum();
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
    ///
    /// A link whose delivery rate was never measured (it was given little, and its queue
    /// never held enough to show the bottleneck busy) has no trustworthy drain time: it is
    /// judged by how long the acknowledgement of its oldest packet is overdue instead, once
    /// the peer acknowledged something on another link meanwhile (a peer that stalls holds
    /// every link's acknowledgements alike). Before, it was not judged at all, and a lightly
    /// used link gone soft under a stream's next bytes held the whole transfer (its
    /// round-trip estimate growing with its queue, no timeout fired), the other links idle.
    pub(super) fn check_slow_links(&mut self, now: Instant) {
        if self.links.iter().filter(|l| l.is_up()).count() < 2 {
            // nothing to judge against: a slowness being counted starts over (its checks
            // must be consecutive), and an idle connection has nothing left to check
            for l in &mut self.links {
                l.slow_check.judge(false);
            }
            return;
        }
        let (fastest, budget) = self.eta_budget(now);
        let limit = (budget * SLOW_LINK_FACTOR).max(MIN_SLOW_ETA);
        for i in 0..self.links.len() {
            let l = &self.links[i];
            // a measured link's drain time; else how long its data is overdue (an ETA resting
            // on assumed values says nothing); one with nothing in flight holds no data up
            let eta = match (l.is_measured(), l.ack_due(self.cfg.max_ack_delay)) {
                (true, _) => l.eta(now),
                (false, Some(due)) => {
                    let answered_elsewhere = (self.links.iter().enumerate())
                        .any(|(j, o)| j != i && o.is_up() && o.last_acked() > Some(due));
                    match answered_elsewhere {
                        true => now.saturating_duration_since(due).as_secs_f64(),
                        false => 0.0,
                    }
                }
                (false, None) => 0.0,
            };
            let slow = l.is_up() && l.bytes_in_flight() > 0 && eta > limit && eta > fastest;
            if self.links[i].slow_check.judge(slow) {
                tracing::debug!(link = i, eta, budget, "link too slow for its data");
                self.set_link_state(i, now, LinkState::Degraded);
            }
        }
    }
}
