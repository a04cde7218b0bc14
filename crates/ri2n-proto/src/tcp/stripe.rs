//! The sending side of the TCP transport: which stream bytes each link's writer sends next.
//!
//! The stream is cut into *partitions* (stretches of at most `max_round` bytes, as much as
//! the application had written and the receiver's window allows). A partition is taken from
//! both ends, as Enhanced MuniSocket takes a message: one link claims runs from its front,
//! moving forward, another from its back, moving backward, until they meet; each writer
//! claims its next run only when its TCP connection took the previous one, so a faster link
//! takes more (the connections' own back-pressure balances the load). A link starting on a
//! partition sends one [`Round`] record (where it starts, which way it goes); its runs then
//! carry only their length, and the receiver places each by the link's order alone. A link
//! with nothing left in its partition helps another: it takes the end that has no taker, or
//! splits the largest unclaimed range in two and takes the back of the first half. A
//! partition smaller than `stripe_threshold` is not split at all: it goes whole on one link,
//! the idle one with the lowest round-trip time; one of at most two runs (a message) is cut
//! into one piece per usable link, as MuniSocket cuts a message among its channels.
//!
//! Where two links share a partition, they should also finish it together: bytes a link's TCP
//! connection already holds (sent and not yet acknowledged by the peer's kernel, or not sent
//! yet) must drain before the link's next run arrives, and behind a switch's queue that can be
//! milliseconds, more on one link than on the other. The driver tells the striper what each
//! connection holds before each claim ([`Striper::note_held`]); from it the striper learns how
//! fast each connection drains, and a link whose connection holds more than its share of the
//! partition's time stops taking from it, leaving the rest to the other link, which finishes
//! the partition alone. Without those notes (the simulator, the unit tests) links take until
//! they meet.
//!
//! Every run stays *in flight* on its link until the receiver acknowledges the link's bytes
//! up to its end. When a link dies, its in-flight runs become repairs, which the surviving
//! links send first, each with its offset (the receiver discards bytes it already has).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::ranges::RangeSet;

/// Sizes of the striping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripeConfig {
    /// The largest partition.
    pub max_round: u64,
    /// Partitions smaller than this go whole on one link.
    pub stripe_threshold: u64,
    /// The smallest run a link claims from a partition shared with another link (the last
    /// one of a partition may be smaller).
    pub min_run: u64,
    /// The largest run.
    pub max_run: u64,
}

impl Default for StripeConfig {
    fn default() -> Self {
        Self {
            max_round: 8 << 20,
            stripe_threshold: 16 << 10,
            min_run: 8 << 10,
            max_run: 256 << 10,
        }
    }
}

/// A link's new start: from stream position `pos`, forward, or backward when `backward`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    /// Where the link's first run starts (forward) or ends (backward).
    pub pos: u64,
    /// The link's runs go backward from `pos`.
    pub backward: bool,
}

/// What a link's writer sends next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Stream bytes `offset..offset + len` as a run, after a ROUND record if `round` is set.
    Run {
        /// The link starts on a partition: a ROUND record first.
        round: Option<Round>,
        /// The first stream byte.
        offset: u64,
        /// How many.
        len: u64,
    },
    /// Stream bytes `offset..offset + len` again, with their offset.
    Repair {
        /// The first stream byte.
        offset: u64,
        /// How many.
        len: u64,
    },
    /// The end of the stream.
    Fin {
        /// The stream's length.
        end: u64,
    },
}

/// The shortest stretch over which a link's drain rate is measured: the kernel sends a TCP
/// connection's bytes in bursts, and a shorter window would see the bursts.
const RATE_WINDOW: Duration = Duration::from_millis(2);

#[derive(Debug, Clone, Copy)]
struct Partition {
    /// Unclaimed bytes: `lo..hi`.
    lo: u64,
    hi: u64,
    front: Option<usize>,
    back: Option<usize>,
    /// Too small to split: one taker only.
    whole: bool,
    /// One of its two takers stepped away so that the other finishes it alone: no link joins
    /// it while that one holds it.
    solo: bool,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    /// The link's byte count once this run arrived.
    end: u64,
    range: (u64, u64),
}

impl InFlight {
    /// Whether stream byte `at` is in this run.
    fn holds(&self, at: u64) -> bool {
        self.range.0 <= at && at < self.range.1
    }
}

/// What a link's TCP connection holds, as the driver last saw it (see [`Striper::note_held`]).
#[derive(Debug, Default, Clone, Copy)]
struct Held {
    /// When the driver last looked, and the bytes the connection held then, the run claimed
    /// right after included.
    at: Option<Instant>,
    bytes: u64,
    /// Bytes per second the connection drains, once measured.
    rate: Option<f64>,
    /// Where the current measurement began: when, the link's `sent` and the bytes held then.
    window: Option<(Instant, u64, u64)>,
}

impl Held {
    /// Seconds the connection needs to send what it held at the last look, counted from
    /// `now`; `None` before its rate is known.
    fn drain_time(&self, now: Instant) -> Option<f64> {
        let since = now.saturating_duration_since(self.at?).as_secs_f64();
        Some((self.bytes as f64 / self.rate? - since).max(0.0))
    }
}

#[derive(Debug, Default)]
struct LinkTx {
    up: bool,
    /// Payload bytes handed to the link since it opened.
    sent: u64,
    /// ... and acknowledged by the receiver.
    acked: u64,
    in_flight: VecDeque<InFlight>,
    srtt: Duration,
    /// Its writer found nothing to send and waits.
    idle: bool,
    /// The FIN went on this link and is not acknowledged yet.
    fin_in_flight: bool,
    /// A slow link set aside: it takes no new runs (see [`Striper::hedge`]).
    paused: bool,
    held: Held,
}

/// The sending side of one connection's stream (see the module documentation).
#[derive(Debug)]
pub struct Striper {
    cfg: StripeConfig,
    /// The end of what the application wrote.
    written: u64,
    /// The end of the stream, once the application finished it.
    fin: Option<u64>,
    fin_acked: bool,
    /// Every byte below this arrived (the receiver said so).
    delivered: u64,
    /// The receiver's window: nothing at or beyond it is sent.
    window_end: u64,
    /// The start of the bytes no partition holds yet.
    frontier: u64,
    parts: Vec<Partition>,
    repairs: RangeSet,
    links: Vec<LinkTx>,
}

impl Striper {
    /// A stream with nothing written; the receiver's initial `window` bytes may be sent.
    pub fn new(cfg: StripeConfig, window: u64) -> Self {
        Self {
            cfg,
            written: 0,
            fin: None,
            fin_acked: false,
            delivered: 0,
            window_end: window,
            frontier: 0,
            parts: Vec::new(),
            repairs: RangeSet::new(),
            links: Vec::new(),
        }
    }

    /// The application wrote `len` more bytes.
    pub fn push(&mut self, len: u64) {
        debug_assert!(self.fin.is_none(), "written after the end of the stream");
        self.written += len;
    }

    /// The application ended the stream.
    pub fn finish(&mut self) {
        self.fin.get_or_insert(self.written);
    }

    /// The application ended the stream.
    pub fn finished(&self) -> bool {
        self.fin.is_some()
    }

    /// The end of what was written.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Every byte below this arrived: the send buffer may drop them.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Everything written, and the end of the stream, arrived.
    pub fn all_acknowledged(&self) -> bool {
        self.fin.is_some() && self.fin_acked && self.delivered == self.written
    }

    /// Link `link` (re)opened: a new TCP connection, counting its bytes from zero.
    pub fn link_up(&mut self, link: usize, srtt: Duration) {
        if self.links.len() <= link {
            self.links.resize_with(link + 1, LinkTx::default);
        }
        self.link_down(link);
        let l = &mut self.links[link];
        *l = LinkTx {
            up: true,
            srtt,
            ..LinkTx::default()
        };
    }

    /// Link `link` died: what it had in flight is sent again on the others. Returns the
    /// bytes re-queued.
    pub fn link_down(&mut self, link: usize) -> u64 {
        let Some(l) = self.links.get_mut(link) else {
            return 0;
        };
        l.up = false;
        l.idle = false;
        // a FIN it carried is sent again by whichever link asks next (see `fin_due`)
        l.fin_in_flight = false;
        let requeued = self.hand_off(link);
        self.links[link].in_flight.clear();
        requeued
    }

    /// Queues what `link` has in flight (and not yet delivered) as repairs for the other
    /// links, and takes it off the partitions it was taking; returns the bytes queued.
    fn hand_off(&mut self, link: usize) -> u64 {
        let mut requeued = 0;
        for f in &self.links[link].in_flight {
            let (s, e) = (f.range.0.max(self.delivered), f.range.1);
            if s < e {
                requeued += e - s;
                self.repairs.insert(s..e);
            }
        }
        for p in &mut self.parts {
            if p.front == Some(link) {
                p.front = None;
            }
            if p.back == Some(link) {
                p.back = None;
            }
        }
        requeued
    }

    /// Sends what link `link` has in flight again on the others, keeping it in flight there
    /// too (whichever copy arrives first counts), and gives the link no new runs until
    /// [`resume`](Self::resume): for a link gone slow that holds the stream's next bytes
    /// while the others deliver (a soft failure). Returns the bytes re-queued.
    pub fn hedge(&mut self, link: usize) -> u64 {
        let Some(l) = self.links.get_mut(link).filter(|l| l.up) else {
            return 0;
        };
        l.paused = true;
        // a FIN it carried is sent again too: behind its crawling runs it may arrive last
        l.fin_in_flight = false;
        self.hand_off(link)
    }

    /// A link [`hedge`](Self::hedge) set aside takes runs again.
    pub fn resume(&mut self, link: usize) {
        if let Some(l) = self.links.get_mut(link) {
            l.paused = false;
        }
    }

    /// The link the receiver waits for: the one holding the stream's first undelivered byte
    /// in flight or, when no link sent it yet, the one its partition waits for (a link left
    /// to finish a partition alone claims its next run only once its TCP connection takes
    /// it, which a link gone slow does late).
    pub fn head_link(&self) -> Option<usize> {
        let d = self.delivered;
        (self.links.iter())
            .position(|l| l.up && l.in_flight.iter().any(|f| f.holds(d)))
            .or_else(|| {
                (self.parts.iter())
                    .find(|p| p.lo <= d && d < p.hi)
                    .and_then(|p| p.front.or(p.back))
                    .filter(|&l| self.is_up(l))
            })
    }

    /// Whether link `link`, holding the stream's first undelivered byte, must first deliver
    /// runs the receiver already has (sent again on another link by
    /// [`hedge`](Self::hedge)): its acknowledgements then show progress, but not the stream's.
    pub fn head_behind_duplicates(&self, link: usize) -> bool {
        let d = self.delivered;
        self.links.get(link).is_some_and(|l| {
            (l.in_flight.iter())
                .take_while(|f| !f.holds(d))
                .any(|f| f.range.1 <= d)
        })
    }

    /// Whether link `link` is up.
    pub fn is_up(&self, link: usize) -> bool {
        self.links.get(link).is_some_and(|l| l.up)
    }

    /// The link's latest round-trip time, which picks the link for small partitions.
    pub fn set_srtt(&mut self, link: usize, srtt: Duration) {
        if let Some(l) = self.links.get_mut(link) {
            l.srtt = srtt;
        }
    }

    /// Payload bytes the link has in flight (handed over, not acknowledged).
    pub fn in_flight(&self, link: usize) -> u64 {
        self.links.get(link).map_or(0, |l| l.sent - l.acked)
    }

    /// Payload bytes the link carried since it opened that the peer acknowledged: its ACKs'
    /// word, but never more than the link sent.
    pub fn link_acked(&self, link: usize) -> u64 {
        self.links.get(link).map_or(0, |l| l.acked)
    }

    /// Whether some link has payload bytes in flight.
    pub fn any_in_flight(&self) -> bool {
        self.links.iter().any(|l| l.sent > l.acked)
    }

    /// Link `link`'s TCP connection holds `bytes` (not yet acknowledged by the peer's kernel,
    /// sent or not) at `now`: the driver says so just before it asks [`next`](Self::next) for
    /// the link's work, so that links sharing a partition finish it together.
    pub fn note_held(&mut self, link: usize, now: Instant, bytes: u64) {
        let Some(l) = self.links.get_mut(link) else {
            return;
        };
        let h = &mut l.held;
        match h.window {
            // a connection that emptied may have stood idle: its drain says nothing of its rate
            Some((start, sent, held)) if bytes > 0 => {
                let span = now.saturating_duration_since(start);
                let drained = (l.sent - sent + held).saturating_sub(bytes);
                // nothing drained: a stalled or failing link, which the failure detection
                // handles; its rate is what it was
                if span >= RATE_WINDOW && drained > 0 {
                    let sample = drained as f64 / span.as_secs_f64();
                    h.rate = Some(h.rate.map_or(sample, |r| r + (sample - r) / 8.0));
                    h.window = Some((now, l.sent, bytes));
                }
            }
            _ => h.window = Some((now, l.sent, bytes)),
        }
        h.at = Some(now);
        h.bytes = bytes;
    }

    /// An acknowledgement arrived on `link`. Returns whether it released anything (bytes
    /// delivered, window opened, FIN acknowledged).
    pub fn on_ack(
        &mut self,
        link: usize,
        link_bytes: u64,
        delivered: u64,
        window_end: u64,
        eof: bool,
    ) -> bool {
        let mut progress = false;
        if let Some(l) = self.links.get_mut(link).filter(|l| l.up) {
            let link_bytes = link_bytes.min(l.sent);
            if link_bytes > l.acked {
                l.acked = link_bytes;
                progress = true;
            }
            while l.in_flight.front().is_some_and(|f| f.end <= l.acked) {
                l.in_flight.pop_front();
            }
            if eof && l.fin_in_flight {
                l.fin_in_flight = false;
            }
        }
        // `delivered` is the receiver's: never beyond the first byte not yet sent (the rest
        // of a partition is claimed from its lowest unsent byte on, which the buffer must
        // still hold)
        let delivered = delivered.min(self.written).min(self.first_unsent());
        if delivered > self.delivered {
            self.delivered = delivered;
            self.repairs.remove_below(delivered);
            progress = true;
        }
        if window_end > self.window_end {
            self.window_end = window_end;
            progress = true;
        }
        if eof && self.fin.is_some() && !self.fin_acked {
            self.fin_acked = true;
            progress = true;
        }
        progress
    }

    /// Whether some link has something to send (data, repairs or the FIN).
    pub fn has_work(&self) -> bool {
        !self.repairs.is_empty()
            || self.parts.iter().any(|p| p.lo < p.hi)
            || self.frontier < self.limit()
            || self.fin_due()
    }

    fn limit(&self) -> u64 {
        self.written.min(self.window_end)
    }

    fn fin_due(&self) -> bool {
        self.fin.is_some_and(|f| f == self.frontier)
            && !self.fin_acked
            && self.parts.iter().all(|p| p.lo >= p.hi)
            && self.repairs.is_empty()
            && !self.links.iter().any(|l| l.fin_in_flight)
    }

    /// What link `link`'s writer sends next; `None`: nothing for it now (it waits).
    pub fn next(&mut self, link: usize) -> Option<Work> {
        if !self.is_up(link) {
            return None;
        }
        let work = self.pick(link);
        let l = &mut self.links[link];
        l.idle = work.is_none();
        match work {
            Some(Work::Run { offset, len, .. }) | Some(Work::Repair { offset, len }) => {
                l.sent += len;
                l.held.bytes += len;
                l.in_flight.push_back(InFlight {
                    end: l.sent,
                    range: (offset, offset + len),
                });
            }
            Some(Work::Fin { .. }) => l.fin_in_flight = true,
            None => {}
        }
        work
    }

    fn pick(&mut self, link: usize) -> Option<Work> {
        if self.links[link].paused {
            return None;
        }
        if let Some(r) = self.repairs.pop_front(self.cfg.max_run) {
            return Some(Work::Repair {
                offset: r.start,
                len: r.end - r.start,
            });
        }
        // the partition this link works on, if it has bytes left and the link its share
        if let Some(i) = self.parts.iter().position(|p| p.front == Some(link)) {
            if let Some(w) = self.continue_on(i, link, false) {
                return Some(w);
            }
            self.parts[i].front = None;
        }
        if let Some(i) = self.parts.iter().position(|p| p.back == Some(link)) {
            if let Some(w) = self.continue_on(i, link, true) {
                return Some(w);
            }
            self.parts[i].back = None;
        }
        self.parts.retain(|p| p.lo < p.hi);
        if let Some(w) = self.help(link) {
            return Some(w);
        }
        if let Some(w) = self.open(link) {
            return Some(w);
        }
        self.fin_due().then_some(Work::Fin { end: self.frontier })
    }

    /// The next run of partition `i` for `link`, which holds its front (or its back when
    /// `backward`); `None` when nothing is left, or when the link leaves the rest to the
    /// partition's other taker (marking it `solo`).
    fn continue_on(&mut self, i: usize, link: usize, backward: bool) -> Option<Work> {
        let left = self.parts[i].hi - self.parts[i].lo;
        if left == 0 {
            return None;
        }
        let share = self.share(i, link);
        if share < left.min(self.cfg.min_run) {
            self.parts[i].solo = true;
            return None;
        }
        Some(self.claim(i, backward, None, share))
    }

    /// The bytes of shared partition `i` that `link` may still take so that it and the other
    /// taker finish at the same time, each after draining what its TCP connection holds;
    /// unbounded for a partition with one taker, and until both takers' drain rates are known.
    fn share(&self, i: usize, link: usize) -> u64 {
        let p = &self.parts[i];
        let other = if p.front == Some(link) {
            p.back
        } else {
            p.front
        };
        let (Some(other), false) = (other, p.whole) else {
            return u64::MAX;
        };
        let (me, them) = (&self.links[link].held, &self.links[other].held);
        let (Some(now), Some(r_me), Some(r_them)) = (me.at, me.rate, them.rate) else {
            return u64::MAX;
        };
        let (Some(t_me), Some(t_them)) = (me.drain_time(now), them.drain_time(now)) else {
            return u64::MAX;
        };
        // this link takes x and the other the rest: t_me + x / r_me = t_them + (left - x) / r_them
        let left = (p.hi - p.lo) as f64;
        let x = (t_them - t_me + left / r_them) / (1.0 / r_me + 1.0 / r_them);
        x.max(0.0) as u64
    }

    /// Claims the next run of partition `i` from its front or back, for a link that starts
    /// there (`round`) or continues, taking at most `share` bytes.
    fn claim(&mut self, i: usize, backward: bool, round: Option<Round>, share: u64) -> Work {
        let p = &mut self.parts[i];
        let left = p.hi - p.lo;
        let len = if p.whole || (p.front.is_none() || p.back.is_none()) && left <= self.cfg.max_run
        {
            left.min(self.cfg.max_run)
        } else {
            (left / 4)
                .clamp(self.cfg.min_run, self.cfg.max_run)
                .min(left)
                .min(share)
        };
        let offset = if backward {
            p.hi -= len;
            p.hi
        } else {
            p.lo += len;
            p.lo - len
        };
        Work::Run { round, offset, len }
    }

    /// Joins a partition that needs another taker: one that lost its front taker (a dead
    /// link), one large enough to be taken from its back too, or the largest one, split.
    fn help(&mut self, link: usize) -> Option<Work> {
        let t = self.cfg.stripe_threshold;
        // a partition left `solo` is joined only once its last taker is gone too (a dead link)
        let open_to_help = |p: &Partition| !p.solo || p.front.is_none() && p.back.is_none();
        if let Some(i) =
            (self.parts.iter()).position(|p| p.front.is_none() && p.lo < p.hi && open_to_help(p))
        {
            let p = &mut self.parts[i];
            p.front = Some(link);
            let round = Round {
                pos: p.lo,
                backward: false,
            };
            return Some(self.claim(i, false, Some(round), u64::MAX));
        }
        if let Some(i) = (self.parts.iter())
            .position(|p| !p.whole && !p.solo && p.back.is_none() && p.hi - p.lo >= t)
        {
            let p = &mut self.parts[i];
            p.back = Some(link);
            let round = Round {
                pos: p.hi,
                backward: true,
            };
            return Some(self.claim(i, true, Some(round), u64::MAX));
        }
        let (i, p) = (self.parts.iter().enumerate())
            .filter(|(_, p)| !p.whole && !p.solo && p.hi - p.lo >= 2 * t)
            .max_by_key(|(_, p)| p.hi - p.lo)?;
        // the back half keeps its back taker and waits for a front one; this link takes the
        // front half from its new end
        let mid = p.lo + (p.hi - p.lo) / 2;
        let upper = Partition {
            lo: mid,
            hi: p.hi,
            front: None,
            back: p.back,
            whole: false,
            solo: false,
        };
        let p = &mut self.parts[i];
        p.hi = mid;
        p.back = Some(link);
        self.parts.insert(i + 1, upper);
        let round = Round {
            pos: mid,
            backward: true,
        };
        Some(self.claim(i, true, Some(round), u64::MAX))
    }

    /// The first stream byte no link has been given yet.
    fn first_unsent(&self) -> u64 {
        (self.parts.iter().filter(|p| p.lo < p.hi))
            .map(|p| p.lo)
            .min()
            .unwrap_or(self.frontier)
    }

    /// Opens a partition of new data, taken from its front by this link. A small one goes
    /// only to the idle link with the lowest round-trip time. One of at most two runs (a
    /// message) is cut into equal pieces, one per usable link, as MuniSocket cuts a message:
    /// this link takes the first, each other piece waits for a link to take it whole (this
    /// one, once done with its own, if no other comes).
    fn open(&mut self, link: usize) -> Option<Work> {
        let limit = self.limit();
        if self.frontier >= limit {
            return None;
        }
        let size = (limit - self.frontier).min(self.cfg.max_round);
        let whole = size < self.cfg.stripe_threshold;
        if whole {
            let me = self.links[link].srtt;
            let better = (self.links.iter().enumerate())
                .any(|(j, l)| j != link && l.up && !l.paused && l.idle && l.srtt < me);
            if better {
                return None;
            }
        }
        let lo = self.frontier;
        self.frontier += size;
        let usable = self.links.iter().filter(|l| l.up && !l.paused).count() as u64;
        let pieces = if whole || size > 2 * self.cfg.max_run {
            1
        } else {
            usable.clamp(1, (size / self.cfg.min_run).max(1))
        };
        let i = self.parts.len();
        for k in 0..pieces {
            self.parts.push(Partition {
                lo: lo + size * k / pieces,
                hi: lo + size * (k + 1) / pieces,
                front: (k == 0).then_some(link),
                back: None,
                whole: whole || pieces > 1,
                solo: false,
            });
        }
        let round = Round {
            pos: lo,
            backward: false,
        };
        Some(self.claim(i, false, Some(round), u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::Reassembly;

    const MS: Duration = Duration::from_millis(1);

    fn striper(links: usize) -> Striper {
        let mut s = Striper::new(StripeConfig::default(), 64 << 20);
        for l in 0..links {
            s.link_up(l, MS * (l as u32 + 1));
        }
        s
    }

    /// Feeds `work` for `link` into the receiver, as the link would carry it.
    fn deliver(r: &mut Reassembly, link: usize, w: Work) {
        match w {
            Work::Run { round, len, .. } => {
                if let Some(round) = round {
                    r.round(link, round.pos, round.backward).unwrap();
                }
                let at = r.place_run(link, len).unwrap();
                r.accept(link, at, len).unwrap();
            }
            Work::Repair { offset, len } => {
                r.accept(link, offset, len).unwrap();
            }
            Work::Fin { end } => r.fin(end).unwrap(),
        }
    }

    /// A small write while the link with the lowest round trip is set aside (hedged) goes
    /// on another: the one set aside takes nothing, and must not stop the others taking it.
    #[test]
    fn a_small_write_goes_on_another_link_while_the_fastest_is_set_aside() {
        let mut s = striper(2); // link 0's round trip 1 ms, link 1's 2 ms
        s.hedge(0);
        assert_eq!(s.next(0), None, "the premise: link 0 takes nothing");
        s.push(1000);
        assert!(matches!(s.next(1), Some(Work::Run { len: 1000, .. })));
    }

    /// A link set aside with the FIN behind its runs: the other link sends the runs again,
    /// and the FIN too. Before, the FIN counted as in flight on the slow link, so no other
    /// link sent it, and the stream's end waited for the slow link to drain.
    #[test]
    fn the_fin_on_a_link_set_aside_is_sent_again_on_another() {
        let mut s = striper(2);
        s.push(1000);
        s.finish();
        let mut r = Reassembly::new(64 << 20);
        let run = s.next(0).unwrap();
        assert!(matches!(run, Work::Run { len: 1000, .. }), "{run:?}");
        assert_eq!(s.next(0), Some(Work::Fin { end: 1000 }), "the premise");
        assert_eq!(s.next(1), None, "the FIN is in flight on link 0");
        s.hedge(0);
        let again: Vec<Work> = std::iter::from_fn(|| s.next(1)).collect();
        assert_eq!(
            again,
            [
                Work::Repair {
                    offset: 0,
                    len: 1000
                },
                Work::Fin { end: 1000 }
            ]
        );
        for w in again {
            deliver(&mut r, 1, w);
        }
        assert!(r.complete(), "the stream ended on link 1 alone");
    }

    /// An acknowledgement that claims delivery beyond what was sent (a faulty or hostile
    /// peer) moves the delivered mark no further than the first byte not yet sent: the
    /// next run still starts at or above it, so the buffer still holds its bytes.
    #[test]
    fn a_delivery_claimed_beyond_what_was_sent_is_cut_to_it() {
        let mut s = striper(1);
        s.push(1 << 20);
        let Some(Work::Run { offset: 0, len, .. }) = s.next(0) else {
            panic!("a first run");
        };
        assert!(
            len < 300 << 10,
            "the premise: the claim goes beyond the run"
        );
        s.on_ack(0, 0, 300 << 10, 64 << 20, false);
        assert_eq!(s.delivered(), len);
        let Some(Work::Run { offset, .. }) = s.next(0) else {
            panic!("a second run");
        };
        assert!(
            offset >= s.delivered(),
            "run at {offset}, delivered {}",
            s.delivered()
        );
    }

    #[test]
    fn a_message_of_two_runs_or_less_is_cut_in_one_piece_per_link() {
        let mut s = striper(2);
        s.push(64 << 10);
        let run = |round: u64, offset: u64| Work::Run {
            round: Some(Round {
                pos: round,
                backward: false,
            }),
            offset,
            len: 32 << 10,
        };
        assert_eq!(s.next(0), Some(run(0, 0)));
        assert_eq!(s.next(1), Some(run(32 << 10, 32 << 10)));
        assert_eq!(s.next(0), None);
        // a link alone takes the other piece too, once done with its own
        let mut s = striper(2);
        s.push(64 << 10);
        assert_eq!(s.next(0), Some(run(0, 0)));
        assert_eq!(s.next(0), Some(run(32 << 10, 32 << 10)));
        // what only one link can take is not cut
        let mut s = striper(2);
        s.link_down(1);
        s.push(64 << 10);
        let Some(Work::Run { len, .. }) = s.next(0) else {
            panic!("a run")
        };
        assert_eq!(len, 64 << 10);
    }

    /// Two links of the same rate take an 8 MiB message, each claiming while its TCP
    /// connection holds less than its cap (link 0's window grew over a deep switch queue,
    /// link 1's did not); returns when each finishes sending its share, in seconds, after
    /// checking that the receiver got every byte once.
    fn finish_times(note_held: bool) -> [f64; 2] {
        const RATE: f64 = 125e6;
        const STEP: Duration = Duration::from_micros(100);
        let caps = [900u64 << 10, 200 << 10];
        let mut s = striper(2);
        let mut r = Reassembly::new(64 << 20);
        s.push(8 << 20);
        let (start, mut held, mut finish) = (Instant::now(), [0u64; 2], [0f64; 2]);
        for step in 0..2000u32 {
            let now = start + STEP * step;
            for l in 0..2 {
                held[l] = held[l].saturating_sub((RATE * STEP.as_secs_f64()) as u64);
                while held[l] < caps[l] {
                    if note_held {
                        s.note_held(l, now, held[l]);
                    }
                    let Some(w) = s.next(l) else { break };
                    let Work::Run { len, .. } = w else {
                        panic!("{w:?}")
                    };
                    held[l] += len;
                    finish[l] = (STEP * step).as_secs_f64() + held[l] as f64 / RATE;
                    deliver(&mut r, l, w);
                }
            }
        }
        assert_eq!(r.contiguous(), 8 << 20, "every byte arrived");
        finish
    }

    #[test]
    fn links_holding_different_backlogs_finish_a_shared_partition_together() {
        let [a, b] = finish_times(false);
        assert!(
            a - b > 3e-3,
            "premise: meeting in the middle, link 0 ends {a} s, link 1 {b} s"
        );
        let [a, b] = finish_times(true);
        assert!((a - b).abs() < 0.5e-3, "link 0 ends {a} s, link 1 {b} s");
    }

    #[test]
    fn two_links_take_a_message_from_its_two_ends() {
        let mut s = striper(2);
        s.push(1 << 20);
        let a = s.next(0).unwrap();
        let b = s.next(1).unwrap();
        assert_eq!(
            a,
            Work::Run {
                round: Some(Round {
                    pos: 0,
                    backward: false
                }),
                offset: 0,
                len: 256 << 10
            }
        );
        let Work::Run { round, offset, len } = b else {
            panic!("{b:?}")
        };
        assert_eq!(
            round,
            Some(Round {
                pos: 1 << 20,
                backward: true
            })
        );
        assert_eq!(offset + len, 1 << 20);
        // the rest goes to whichever asks, until the two meet
        let mut r = Reassembly::new(64 << 20);
        deliver(&mut r, 0, a);
        deliver(&mut r, 1, b);
        let mut runs = [1usize, 1];
        let mut rounds = 2;
        for i in 0.. {
            let link = if i % 3 == 0 { 1 } else { 0 };
            let Some(w) = s.next(link) else { break };
            if let Work::Run { round: Some(_), .. } = w {
                rounds += 1;
            }
            runs[link] += 1;
            deliver(&mut r, link, w);
        }
        assert!(s.next(0).is_none() && s.next(1).is_none());
        assert_eq!(r.contiguous(), 1 << 20, "every byte placed once");
        assert_eq!(rounds, 2, "one ROUND per link for the whole message");
        assert!(
            runs[0] > runs[1],
            "the link asking more often took more: {runs:?}"
        );
    }

    #[test]
    fn a_small_message_goes_whole_on_the_idle_link_with_the_lowest_rtt() {
        let mut s = striper(2);
        // both idle
        assert!(s.next(0).is_none() && s.next(1).is_none());
        s.push(1000);
        assert_eq!(s.next(1), None, "link 1 has the higher RTT");
        assert_eq!(
            s.next(0),
            Some(Work::Run {
                round: Some(Round {
                    pos: 0,
                    backward: false
                }),
                offset: 0,
                len: 1000
            })
        );
        assert_eq!(s.next(1), None, "not split");
    }

    #[test]
    fn a_free_link_splits_the_largest_partition() {
        let mut s = striper(3);
        s.push(4 << 20);
        let _ = s.next(0).unwrap(); // front of 0..4M
        let _ = s.next(1).unwrap(); // back
        let c = s.next(2).unwrap(); // splits what is left
        let Work::Run {
            round: Some(Round {
                pos,
                backward: true,
            }),
            offset,
            len,
        } = c
        else {
            panic!("{c:?}")
        };
        assert_eq!(offset + len, pos);
        assert!(pos > 256 << 10 && pos < (4 << 20) - (256 << 10));
        let mut r = Reassembly::new(64 << 20);
        // replay it all to the receiver in a fixed order and check the placement
        let mut s2 = striper(3);
        s2.push(4 << 20);
        for i in 0..10_000 {
            let link = [0, 1, 2, 0, 2][i % 5];
            if let Some(w) = s2.next(link) {
                deliver(&mut r, link, w);
            }
            if !s2.has_work() {
                break;
            }
        }
        assert_eq!(r.contiguous(), 4 << 20);
    }

    #[test]
    fn a_dead_links_unacknowledged_runs_are_sent_again_by_the_others() {
        let mut s = striper(2);
        s.push(1 << 20);
        let mut r = Reassembly::new(64 << 20);
        let a1 = s.next(0).unwrap();
        let b1 = s.next(1).unwrap();
        let a2 = s.next(0).unwrap();
        // link 0's first run arrived and was acknowledged; its second was lost with it
        deliver(&mut r, 0, a1);
        deliver(&mut r, 1, b1);
        let Work::Run { len: a1_len, .. } = a1 else {
            unreachable!()
        };
        s.on_ack(0, a1_len, r.contiguous(), r.window_end(), false);
        let Work::Run {
            offset: a2_off,
            len: a2_len,
            ..
        } = a2
        else {
            unreachable!()
        };
        assert_eq!(s.link_down(0), a2_len);
        assert_eq!(
            s.next(1),
            Some(Work::Repair {
                offset: a2_off,
                len: a2_len
            })
        );
        deliver(
            &mut r,
            1,
            Work::Repair {
                offset: a2_off,
                len: a2_len,
            },
        );
        // link 1 then takes the partition's front too
        while let Some(w) = s.next(1) {
            deliver(&mut r, 1, w);
        }
        assert_eq!(r.contiguous(), 1 << 20);
    }

    #[test]
    fn the_window_bounds_what_is_sent_and_the_fin_comes_last() {
        let mut s = Striper::new(StripeConfig::default(), 100_000);
        s.link_up(0, MS);
        s.push(300_000);
        s.finish();
        let mut sent = 0;
        while let Some(w) = s.next(0) {
            let Work::Run { offset, len, .. } = w else {
                panic!("{w:?}")
            };
            assert!(offset + len <= 100_000);
            sent += len;
        }
        assert_eq!(sent, 100_000);
        s.on_ack(0, sent, 100_000, 400_000, false);
        let mut last = None;
        while let Some(w) = s.next(0) {
            last = Some(w);
        }
        assert_eq!(last, Some(Work::Fin { end: 300_000 }));
        assert!(!s.all_acknowledged());
        s.on_ack(0, 300_000, 300_000, 400_000, true);
        assert!(s.all_acknowledged());
    }

    /// 1 MiB striped over two links, link 1's first run arrived and acknowledged, link 0's
    /// (the stream's first bytes, returned with the striper and the receiver) not yet.
    fn link_0_late() -> (Striper, Reassembly, Work) {
        let mut s = striper(2);
        s.push(1 << 20);
        let mut r = Reassembly::new(64 << 20);
        let a = s.next(0).unwrap();
        let b = s.next(1).unwrap();
        deliver(&mut r, 1, b);
        s.on_ack(1, u64::MAX, r.contiguous(), r.window_end(), false);
        assert_eq!(s.head_link(), Some(0));
        (s, r, a)
    }

    #[test]
    fn a_slow_link_holding_the_next_bytes_is_hedged_and_set_aside() {
        let (mut s, mut r, a) = link_0_late();
        let Work::Run { offset, len, .. } = a else {
            unreachable!()
        };
        assert_eq!(s.hedge(0), len);
        assert_eq!(s.next(0), None, "set aside");
        assert_eq!(s.next(1), Some(Work::Repair { offset, len }));
        deliver(&mut r, 1, Work::Repair { offset, len });
        while let Some(w) = s.next(1) {
            deliver(&mut r, 1, w);
        }
        assert_eq!(r.contiguous(), 1 << 20, "link 1 carried it all");
        // the slow copy arriving after all is a duplicate, dropped
        r.round(0, 0, false).unwrap();
        let at = r.place_run(0, len).unwrap();
        assert!(r.accept(0, at, len).unwrap().is_empty());
        s.resume(0);
        s.push(1000);
        assert!(s.next(0).is_some(), "taken back");
    }

    #[test]
    fn the_head_link_is_the_one_to_send_the_next_bytes_when_none_sent_them_yet() {
        let mut s = striper(2);
        s.push(4 << 20);
        let mut r = Reassembly::new(64 << 20);
        let front = s.next(0).unwrap();
        let back = s.next(1).unwrap();
        assert_eq!(s.head_link(), Some(0), "in flight on link 0");
        deliver(&mut r, 0, front);
        deliver(&mut r, 1, back);
        s.on_ack(0, u64::MAX, r.contiguous(), r.window_end(), false);
        s.on_ack(1, u64::MAX, r.contiguous(), r.window_end(), false);
        // the next bytes are in no run yet: link 0, the partition's front, is to send them
        assert!(s.delivered() > 0 && s.in_flight(0) == 0 && s.in_flight(1) == 0);
        assert_eq!(s.head_link(), Some(0));
        // set aside, it leaves the partition to link 1, which comes to the next bytes too
        s.hedge(0);
        assert_eq!(s.head_link(), Some(1));
        let d = s.delivered();
        let sends_them =
            |w: Work| matches!(w, Work::Run { offset, len, .. } if offset <= d && d < offset + len);
        assert!(std::iter::from_fn(|| s.next(1)).any(sends_them));
        assert_eq!(s.head_link(), Some(1));
    }

    #[test]
    fn a_link_taken_back_behind_its_duplicates_is_seen_to_hold_up_the_stream() {
        let (mut s, mut r, a) = link_0_late();
        assert!(
            !s.head_behind_duplicates(0),
            "link 0 is late with new bytes"
        );
        let Work::Run { len, .. } = a else {
            unreachable!()
        };
        s.hedge(0);
        while let Some(w) = s.next(1) {
            deliver(&mut r, 1, w);
        }
        s.on_ack(1, u64::MAX, r.contiguous(), r.window_end(), false);
        assert_eq!(s.delivered(), 1 << 20, "link 1 delivered it all");
        // taken back, link 0 holds the next bytes behind its first run, which still crawls
        s.resume(0);
        s.push(1000);
        assert!(matches!(s.next(0), Some(Work::Run { offset, .. }) if offset == 1 << 20));
        assert_eq!(s.head_link(), Some(0));
        assert!(s.head_behind_duplicates(0));
        // the old run through at last: only new bytes ahead
        s.on_ack(0, len, r.contiguous(), r.window_end(), false);
        assert_eq!(s.head_link(), Some(0));
        assert!(!s.head_behind_duplicates(0));
    }

    #[test]
    fn a_fin_lost_with_its_link_is_sent_again() {
        let mut s = striper(2);
        s.finish();
        assert_eq!(s.next(0), Some(Work::Fin { end: 0 }));
        assert_eq!(s.next(1), None, "one FIN in flight");
        s.link_down(0);
        assert_eq!(s.next(1), Some(Work::Fin { end: 0 }));
    }
}
