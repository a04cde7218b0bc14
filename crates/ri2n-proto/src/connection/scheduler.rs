//! Where data goes: the striping scheduler (each packet on the up link where it would arrive
//! first, within a budget the receive window can bridge, a burst's packets in runs per link)
//! and the choice of link for acknowledgements and control frames.

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
/// Within a burst, the link that took the last data packet keeps taking them while its
/// arrival is at most this many of its packets later than the best link's: a burst goes out
/// in runs of consecutive packets per link rather than alternating packet by packet, so each
/// link carries stretches of the stream that land in order at the receiver. Alternating, every
/// packet of one link opened a gap in the receiver's stream that a packet of the other then
/// closed, a range inserted and removed per packet. Runs continue only at one instant (a
/// burst, or calls for one datagram each at the same time): a packet alone at its instant (a
/// sparse flow) still goes where it arrives first.
const RUN_PACKETS: f64 = 16.0;
/// A run's lead over the best link is at most this long (seconds), so a slow link does not
/// hold up the packets behind its run: 16 packets of 1472 bytes take 0.19 ms at 1 Gbit/s.
const MAX_RUN_LEAD: f64 = 0.0005;

/// What the scheduler knows about the links at one instant: each up link's delivery rate,
/// the arrival it promises for a packet placed on it now, and what its window and pacer
/// said. Built once per burst of data packets and updated for the link each packet went on:
/// at one instant nothing else changes (the other links' queues, windows and pacers are as
/// they were).
#[derive(Debug, Clone)]
pub(super) struct Schedule {
    /// Bytes per second; 0 for a link that is not up.
    rates: [f64; MAX_LINKS],
    /// Seconds from now ([`Link::eta`](crate::link::Link::eta)); infinite for a link that is
    /// not up.
    etas: [f64; MAX_LINKS],
    /// What the link's window and pacer said at this instant, if asked since it last sent.
    allowance: [Option<Result<(), Option<Instant>>>; MAX_LINKS],
    /// Failover striping's primary link.
    primary: Option<usize>,
    /// What the receive window can bridge: bytes.
    window: f64,
}

impl Schedule {
    /// The schedule of `c`'s links at `now`, built in `slot` (not moved there: see
    /// [`Connection::pick_data_link`]).
    fn measure_into<'s>(
        slot: &'s mut Option<Schedule>,
        c: &Connection,
        now: Instant,
    ) -> &'s mut Schedule {
        let s = slot.insert(Schedule {
            rates: [0.0; MAX_LINKS],
            etas: [f64::INFINITY; MAX_LINKS],
            allowance: [None; MAX_LINKS],
            primary: match c.cfg.striping {
                Striping::Weighted => None,
                Striping::Failover => c.primary_link(),
            },
            window: c.handshake.peer_window.min(c.cfg.send_buffer) as f64,
        });
        for i in 0..c.links.len() {
            s.measure(i, &c.links[i], now);
        }
        s
    }

    fn measure(&mut self, i: usize, link: &crate::link::Link, now: Instant) {
        if link.is_up() {
            self.rates[i] = link.delivery_rate(now);
            self.etas[i] = link.eta_at(self.rates[i]);
        }
    }

    /// Link `i` took a packet: its queue grew, and its window and pacer must be asked again.
    pub(super) fn sent_on(&mut self, i: usize, link: &crate::link::Link, now: Instant) {
        self.measure(i, link, now);
        self.allowance[i] = None;
    }

    /// The earliest arrival any up link promises, and the latest a link may promise and still
    /// take data: what the receive window can bridge (half of it at the links' combined
    /// rate), and not much later than the fastest link would deliver after its own queue.
    /// Both in seconds from now.
    fn budget(&self) -> (f64, f64) {
        let fastest = self.etas.iter().copied().fold(f64::INFINITY, f64::min);
        let total_rate: f64 = self.rates.iter().sum();
        let window_budget = (self.window / 2.0 / total_rate.max(1.0)).min(3600.0);
        (fastest, window_budget.min(fastest * ETA_FACTOR + ETA_SLACK))
    }

    /// The link for the next data packet: among the up links whose window and pacer let a
    /// packet out now, the one where it would arrive first, or `previous` (the link of the
    /// last packet, if sent at this instant) while it would arrive at most its run lead later
    /// ([`RUN_PACKETS`]).
    /// A link whose packets would arrive later than the receive window can bridge (half the
    /// window at the links' combined rate), or much later than via the fastest link, is left
    /// alone unless it is the fastest: its data would hold up everything behind it. `Err`
    /// carries when pacing next allows a packet, if that is what blocks.
    fn pick(
        &mut self,
        links: &mut [crate::link::Link],
        striping: Striping,
        previous: Option<usize>,
        now: Instant,
    ) -> Result<usize, Option<Instant>> {
        let (fastest, budget) = self.budget();
        let allowed = |s: &Self, i: usize| {
            let eta = s.etas[i];
            eta != f64::INFINITY // up
                && match striping {
                    Striping::Weighted => eta <= budget || eta <= fastest,
                    Striping::Failover => Some(i) == s.primary,
                }
        };
        let mut best: Option<(usize, f64)> = None;
        let mut wake: Option<Instant> = None;
        for (i, link) in links.iter_mut().enumerate() {
            let eta = self.etas[i];
            if !allowed(self, i) || best.is_some_and(|(_, b)| eta >= b) {
                continue;
            }
            match *self.allowance[i].get_or_insert_with(|| link.send_allowance(now)) {
                Ok(()) => best = Some((i, eta)),
                Err(Some(t)) => wake = Some(wake.map_or(t, |w| w.min(t))),
                Err(None) => {}
            }
        }
        let (best, best_eta) = best.ok_or(wake)?;
        if let Some(p) = previous.filter(|&p| p != best) {
            // the time a run of the link's packets takes at its rate
            let run_lead = RUN_PACKETS * links[p].mss() as f64 / self.rates[p].max(1.0);
            if allowed(self, p)
                && self.etas[p] <= best_eta + run_lead.min(MAX_RUN_LEAD)
                && self.allowance[p]
                    .get_or_insert_with(|| links[p].send_allowance(now))
                    .is_ok()
            {
                return Ok(p);
            }
        }
        Ok(best)
    }
}

impl Connection {
    /// The link for the next data packet ([`Schedule::pick`]). `slot` then holds the
    /// schedule that chose it, for the rest of a burst (and is left empty when none was
    /// chosen). A slot rather than a return value: a schedule is a few hundred bytes, which
    /// each move would copy, for every data packet.
    pub(super) fn pick_data_link(
        &mut self,
        now: Instant,
        slot: &mut Option<Schedule>,
    ) -> Result<usize, Option<Instant>> {
        let schedule = Schedule::measure_into(slot, self, now);
        let picked = self.pick_with(schedule, now);
        if picked.is_err() {
            *slot = None;
        }
        picked
    }

    /// The next link of a burst at the instant `schedule` describes.
    pub(super) fn pick_next_data_link(
        &mut self,
        schedule: &mut Schedule,
        now: Instant,
    ) -> Result<usize, Option<Instant>> {
        self.pick_with(schedule, now)
    }

    /// [`Schedule::pick`], with the link of the last data packet if it was sent at `now` (a
    /// run on it may go on); records the choice.
    fn pick_with(
        &mut self,
        schedule: &mut Schedule,
        now: Instant,
    ) -> Result<usize, Option<Instant>> {
        let previous = self
            .scheduling
            .last_data_packet
            .filter(|&(_, at)| at == now)
            .map(|(i, _)| i);
        let i = schedule.pick(&mut self.links, self.cfg.striping, previous, now)?;
        self.scheduling.last_data_packet = Some((i, now));
        Ok(i)
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

    /// See [`Schedule::budget`].
    pub(super) fn eta_budget(&self, now: Instant) -> (f64, f64) {
        Schedule::measure_into(&mut None, self, now).budget()
    }

    pub(super) fn best_up_link(&self) -> Option<usize> {
        (0..self.links.len())
            .filter(|&i| self.links[i].is_up())
            .min_by_key(|&i| self.links[i].rtt.srtt)
    }

    /// Acknowledgements go back on the link the data came in on, which just proved to work,
    /// unless we know that link's return path is down, or its address is unproven (a link
    /// the peer opened and has not answered on yet): packets from a spoofed address there,
    /// each drawing an acknowledgement of many ranges, would make us send its owner far more
    /// than the spoofer sent. An acknowledgement names the link it acknowledges, so any up
    /// link carries it. With none up, the arrival link does, an unproven one only within
    /// three times what came from its address (§4.4); beyond that, none (None).
    pub(super) fn ack_link(&self) -> Option<usize> {
        let i = self.scheduling.last_arrival_link;
        let l = &self.links[i];
        if l.state != LinkState::Down && !l.address_unproven() {
            return Some(i);
        }
        (self.best_up_link())
            .or((!l.address_unproven() || l.within_amplification_limit()).then_some(i))
    }
}
