//! Where data goes: the striping scheduler (each packet on the up link where it would arrive
//! first, within a budget the receive window can bridge) and the choice of link for
//! acknowledgements and control frames.

use std::time::Instant;

use crate::{LinkState, Striping};

use super::Connection;

/// A link may take data whose arrival it promises within this multiple of the fastest
/// link's (plus [`ETA_SLACK`]).
const ETA_FACTOR: f64 = 4.0;
/// Seconds.
const ETA_SLACK: f64 = 0.010;
/// Failover striping: base RTTs within this much (or 10 %) of the lowest count as equal.
const PRIMARY_RTT_TOLERANCE: std::time::Duration = std::time::Duration::from_micros(100);

impl Connection {
    /// The link for the next data packet: among the up links whose window and pacer let a
    /// packet out now, the one where it would arrive first. A link whose packets would arrive
    /// later than the receive window can bridge (half the window at the links' combined rate),
    /// or much later than via the fastest link, is left alone unless it is the fastest: its
    /// data would hold up everything behind it.
    /// `Err` carries when pacing next allows a packet, if that is what blocks.
    pub(super) fn pick_data_link(&mut self, now: Instant) -> Result<usize, Option<Instant>> {
        let mut best: Option<(usize, f64)> = None;
        let mut wake: Option<Instant> = None;
        let (fastest, budget) = self.eta_budget();
        // failover striping: one stable primary, the first up link whose base RTT is within
        // a tolerance of the lowest: links that are about as fast do not take turns as their
        // RTT samples wobble (a small probe's round trip is a little shorter than a full one's)
        let lowest = (0..self.links.len())
            .filter(|&i| self.links[i].is_up())
            .map(|i| self.links[i].base_rtt())
            .min();
        let primary = lowest.and_then(|lowest| {
            let tolerance = (lowest / 10).max(PRIMARY_RTT_TOLERANCE);
            (0..self.links.len())
                .find(|&i| self.links[i].is_up() && self.links[i].base_rtt() <= lowest + tolerance)
        });
        for i in 0..self.links.len() {
            if !self.links[i].is_up() {
                continue;
            }
            let eta = self.links[i].eta();
            let allowed = match self.cfg.striping {
                Striping::Weighted => eta <= budget || eta <= fastest,
                Striping::Failover => Some(i) == primary,
            };
            if !allowed {
                continue;
            }
            match self.links[i].send_allowance(now) {
                Ok(()) => {
                    if best.is_none_or(|(_, b)| eta < b) {
                        best = Some((i, eta));
                    }
                }
                Err(Some(t)) => wake = Some(wake.map_or(t, |w| w.min(t))),
                Err(None) => {}
            }
        }
        best.map(|(i, _)| i).ok_or(wake)
    }

    /// The earliest arrival any up link promises, and the latest a link may promise and still
    /// take data: what the receive window can bridge (half of it at the links' combined
    /// rate), and not much later than the fastest link would deliver after its own queue.
    /// Both in seconds from now.
    pub(super) fn eta_budget(&self) -> (f64, f64) {
        let mut fastest = f64::INFINITY;
        let mut total_rate = 0.0;
        for l in self.links.iter().filter(|l| l.is_up()) {
            fastest = fastest.min(l.eta());
            total_rate += l.delivery_rate();
        }
        let window = self.peer_window.min(self.cfg.send_buffer) as f64;
        let window_budget = (window / 2.0 / total_rate.max(1.0)).min(3600.0);
        let budget = window_budget.min(fastest * ETA_FACTOR + ETA_SLACK);
        (fastest, budget)
    }

    pub(super) fn best_up_link(&self) -> Option<usize> {
        (0..self.links.len())
            .filter(|&i| self.links[i].is_up())
            .min_by_key(|&i| self.links[i].rtt.srtt)
    }

    /// Acknowledgements go back on the link the data came in on, which just proved to work,
    /// unless we know that link's return path is down.
    pub(super) fn ack_link(&self) -> usize {
        let i = self.last_arrival_link;
        if self.links[i].state != LinkState::Down {
            return i;
        }
        self.best_up_link().unwrap_or(i)
    }
}
