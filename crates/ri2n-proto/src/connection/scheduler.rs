//! Where data goes: the striping scheduler (each packet on the up link where it would arrive
//! first, within a budget the receive window can bridge) and the choice of link for
//! acknowledgements and control frames.

use std::time::Instant;

use crate::{LinkState, Striping, MAX_LINKS};

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
        let (etas, fastest, budget) = self.etas(now);
        let primary = match self.cfg.striping {
            Striping::Weighted => None,
            Striping::Failover => self.primary_link(),
        };
        for (i, &eta) in etas.iter().enumerate().take(self.links.len()) {
            if eta == f64::INFINITY {
                continue; // not up
            }
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

    /// Failover striping's one stable primary: the first up link whose base RTT is within a
    /// tolerance of the lowest, so links that are about as fast do not take turns as their
    /// RTT samples wobble (a small probe's round trip is a little shorter than a full one's).
    fn primary_link(&self) -> Option<usize> {
        let lowest = (0..self.links.len())
            .filter(|&i| self.links[i].is_up())
            .map(|i| self.links[i].base_rtt())
            .min()?;
        let tolerance = (lowest / 10).max(PRIMARY_RTT_TOLERANCE);
        (0..self.links.len())
            .find(|&i| self.links[i].is_up() && self.links[i].base_rtt() <= lowest + tolerance)
    }

    /// The earliest arrival any up link promises, and the latest a link may promise and still
    /// take data: what the receive window can bridge (half of it at the links' combined
    /// rate), and not much later than the fastest link would deliver after its own queue.
    /// Both in seconds from now.
    pub(super) fn eta_budget(&self, now: Instant) -> (f64, f64) {
        let (_, fastest, budget) = self.etas(now);
        (fastest, budget)
    }

    /// Each link's [`Link::eta`](crate::link::Link::eta) (infinite for a link that is not
    /// up), with the [`Self::eta_budget`]: computed once per packet placed.
    fn etas(&self, now: Instant) -> ([f64; MAX_LINKS], f64, f64) {
        let mut etas = [f64::INFINITY; MAX_LINKS];
        let mut fastest = f64::INFINITY;
        let mut total_rate = 0.0;
        for (eta, l) in etas.iter_mut().zip(&self.links) {
            if l.is_up() {
                let rate = l.delivery_rate(now);
                *eta = l.eta_at(rate);
                fastest = fastest.min(*eta);
                total_rate += rate;
            }
        }
        let window = self.peer_window.min(self.cfg.send_buffer) as f64;
        let window_budget = (window / 2.0 / total_rate.max(1.0)).min(3600.0);
        let budget = window_budget.min(fastest * ETA_FACTOR + ETA_SLACK);
        (etas, fastest, budget)
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
