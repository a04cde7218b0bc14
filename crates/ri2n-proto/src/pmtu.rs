//! Path MTU discovery for one link, after RFC 8899 (datagram packetization-layer PMTUD).
//!
//! A link starts at the base size (the configured `max_datagram_size`, which every path is
//! assumed to carry) and, once up, probes upward to its ceiling, the largest datagram its local
//! interface can send: first the ceiling itself (two jumbo-frame hosts are done after one round
//! trip), then a binary search between the largest size known to work and the smallest that
//! failed. A probe is a PING padded to the size and sent outside the congestion window; it is
//! acknowledged (the size works) or lost [`MAX_PROBES`] times in a row (it does not, RFC 8899
//! §5.1.2 MAX_PROBES). Data then uses the largest confirmed size.
//!
//! A black hole (large datagrams stop arriving while small ones still do, say after a route
//! change to a smaller MTU) shows as a run of lost large packets with none acknowledged (losses
//! that an acknowledgement of large packets reveals are congestion, and do not count): the
//! link falls back to the base size at once, what was lost is re-sent in smaller packets (the
//! streams do not care how their bytes are cut), and the search starts over. A search that ended
//! below the ceiling is tried again after [`RAISE_INTERVAL`] (RFC 8899 PMTU_RAISE_TIMER).
//!
//! A path that no longer carries even the base size (which no link goes below: every path is
//! assumed to carry it) shows the same way at the base size: a run of lost full packets while
//! smaller ones (a write's tail, PINGs) are acknowledged and no full one is. Such a link looks
//! alive to every probe of its liveness, which is small, while each full packet sent on it is
//! lost. So does a link whose rate a policer caps, for a while: over the rate it drops every
//! full packet, and the small ones fit the tokens left. The run is therefore only a doubt,
//! and probes of the base size settle it: one acknowledged clears it (the size passes), and
//! [`MAX_PROBES`] lost in a row confirm it: [`PathMtu::below_base`] says so, and the
//! connection takes the link down, to come back once a probe of the base size gets through
//! (RFC 8899 §4.4: a path whose base fails is unusable).

use std::time::{Duration, Instant};

/// Unanswered probes of one size that rule it out.
pub(crate) const MAX_PROBES: u8 = 3;
/// The search ends when the sizes still in doubt span less than this many bytes.
const SEARCH_GRANULARITY: usize = 32;
/// Lost packets larger than the base size, in a row with none of them acknowledged, that
/// count as a black hole.
pub(crate) const BLACK_HOLE_LOSSES: u32 = 8;
/// Smaller packets acknowledged during a run of lost base-size ones that show the path alive
/// but too small for the base size (a burst of congestion losses is revealed by full packets).
const SMALL_ACKS_BELOW_BASE: u32 = 2;
/// How long a search that ended below the ceiling waits before it tries again.
pub(crate) const RAISE_INTERVAL: Duration = Duration::from_secs(600);

/// One link's discovered datagram size.
#[derive(Debug, Clone)]
pub(crate) struct PathMtu {
    base: usize,
    ceiling: usize,
    /// Size data packets use now: `base` or a size a probe confirmed.
    current: usize,
    /// Largest size not yet ruled out.
    hi: usize,
    /// Size the next probe tries; `None` once the search has ended.
    target: Option<usize>,
    /// A probe of `target` is in flight.
    outstanding: bool,
    /// Probes of `target` lost so far.
    attempts: u8,
    /// When an ended search below the ceiling starts again.
    raise_at: Option<Instant>,
    /// Large packets lost in a row (see the module docs).
    large_losses: u32,
    /// Full packets of the base size lost in a row while the link sends that size, and
    /// smaller packets acknowledged meanwhile (see [`Self::below_base`]).
    base_losses: u32,
    small_acks: u32,
    /// Probes of the base size lost in a row since such a run put the base size in doubt;
    /// `None` while it is not (see the module docs).
    base_doubt: Option<u8>,
}

impl PathMtu {
    /// A link that starts at `base` and may grow to `ceiling`.
    pub fn new(base: usize, ceiling: usize) -> Self {
        let mut m = Self {
            base,
            ceiling: ceiling.max(base),
            current: base,
            hi: base,
            target: None,
            outstanding: false,
            attempts: 0,
            raise_at: None,
            large_losses: 0,
            base_losses: 0,
            small_acks: 0,
            base_doubt: None,
        };
        m.restart();
        m
    }

    /// The size data packets may use.
    pub fn current(&self) -> usize {
        self.current
    }

    /// The size every path is assumed to carry.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Forgets what was learned (the link was down: the path may have changed) and searches
    /// again from the base size.
    pub fn restart(&mut self) {
        self.current = self.base;
        self.hi = self.ceiling;
        self.outstanding = false;
        self.attempts = 0;
        self.raise_at = None;
        self.large_losses = 0;
        (self.base_losses, self.small_acks) = (0, 0);
        self.base_doubt = None;
        self.target = (self.ceiling > self.base).then_some(self.ceiling);
    }

    /// The local interface's MTU changed: the link's sizes are `base` and `ceiling` from now
    /// on. The size in use stays where it still fits between them, and the search runs again
    /// up to the new ceiling (a raised MTU is used, not only one found at the start); one that
    /// no longer fits falls back to the base size. Returns whether anything changed.
    pub fn set_limits(&mut self, base: usize, ceiling: usize) -> bool {
        let ceiling = ceiling.max(base);
        if (base, ceiling) == (self.base, self.ceiling) {
            return false;
        }
        let current = self.current;
        (self.base, self.ceiling) = (base, ceiling);
        self.restart();
        if (base..=ceiling).contains(&current) {
            self.current = current;
        }
        true
    }

    /// The driver cannot hand out more than `room` bytes: nothing larger is tried.
    pub fn limit_ceiling(&mut self, room: usize) {
        if room < self.ceiling {
            self.ceiling = room.max(self.base);
            self.restart();
        }
    }

    /// The size of the probe to send now, if one is due.
    pub fn probe_due(&mut self, now: Instant) -> Option<usize> {
        if self.target.is_none() && self.raise_at.is_some_and(|t| t <= now) {
            let current = self.current;
            self.restart();
            self.current = current;
        }
        if self.outstanding {
            return None;
        }
        match self.base_doubt {
            Some(lost) if lost < MAX_PROBES => Some(self.base),
            _ => self.target,
        }
    }

    pub fn on_probe_sent(&mut self) {
        self.outstanding = true;
    }

    /// A probe of `size` was acknowledged: datagrams of that size get through (unless larger
    /// than the ceiling: sent before the interface's MTU was lowered, it says nothing of what
    /// the interface sends now).
    pub fn on_probe_acked(&mut self, size: usize, now: Instant) {
        if size > self.ceiling {
            return;
        }
        if size == self.base {
            // the probe of a doubt (a search never tries the base size): the base size
            // passes, and the run of losses was congestion, or a policer
            self.outstanding = false;
            self.clear_base_doubt();
            return;
        }
        self.outstanding = false;
        self.attempts = 0;
        if size > self.current {
            self.current = size;
            self.large_losses = 0;
        }
        self.advance(now);
    }

    /// A probe of `size` was lost.
    pub fn on_probe_lost(&mut self, size: usize, now: Instant) {
        if size == self.base {
            // the probe of a doubt (which an acknowledged full packet may have cleared since)
            self.outstanding = false;
            if let Some(lost) = &mut self.base_doubt {
                *lost = lost.saturating_add(1);
            }
            return;
        }
        if self.target != Some(size) {
            // from a search that has moved on (or started again: the probe now in flight,
            // if any, is another)
            return;
        }
        self.outstanding = false;
        self.attempts += 1;
        if self.attempts >= MAX_PROBES {
            self.attempts = 0;
            self.hi = size - 1;
            self.advance(now);
        }
    }

    fn advance(&mut self, now: Instant) {
        if self.hi < self.current + SEARCH_GRANULARITY {
            self.target = None;
            self.raise_at = (self.current < self.ceiling).then(|| now + RAISE_INTERVAL);
        } else {
            self.target = Some((self.current + self.hi).div_ceil(2));
        }
    }

    /// A data packet of `size` bytes was acknowledged: one of the current size ends a run of
    /// large losses (a smaller one says nothing of whether packets of the current size pass).
    /// Of the current size within the search's granularity: a full data packet falls a few
    /// bytes short of it, the room its frames' headers leave unused, and counted as smaller
    /// it let every congestion loss on a healthy jumbo link add to a black hole.
    pub fn on_packet_acked(&mut self, size: usize) {
        if size + SEARCH_GRANULARITY > self.current {
            self.large_losses = 0;
            self.clear_base_doubt();
        } else if self.base_losses > 0 {
            self.small_acks += 1;
            self.doubt_base();
        }
    }

    /// Whether the path no longer carries the base size: [`BLACK_HOLE_LOSSES`] full packets
    /// of that size lost in a row, none acknowledged, while [`SMALL_ACKS_BELOW_BASE`] smaller
    /// ones were, and then [`MAX_PROBES`] probes of the base size lost in a row (see the
    /// module docs).
    pub fn below_base(&self) -> bool {
        self.base_doubt.is_some_and(|lost| lost >= MAX_PROBES)
    }

    /// A run of lost full packets with small ones acknowledged puts the base size in doubt:
    /// probes of it are due ([`Self::probe_due`]).
    fn doubt_base(&mut self) {
        if self.base_losses >= BLACK_HOLE_LOSSES
            && self.small_acks >= SMALL_ACKS_BELOW_BASE
            && self.base_doubt.is_none()
        {
            tracing::debug!(
                base = self.base,
                "full packets lost in a row while small ones pass: probing the base size"
            );
            self.base_doubt = Some(0);
        }
    }

    fn clear_base_doubt(&mut self) {
        (self.base_losses, self.small_acks) = (0, 0);
        self.base_doubt = None;
    }

    /// A data packet of `size` bytes was lost. Returns true when that made the link fall
    /// back to the base size (a black hole).
    pub fn on_packet_lost(&mut self, size: usize) -> bool {
        if self.current == self.base && size + SEARCH_GRANULARITY > self.base {
            self.base_losses = self.base_losses.saturating_add(1);
            self.doubt_base();
        }
        if size <= self.base || self.current == self.base {
            return false;
        }
        self.large_losses += 1;
        if self.large_losses < BLACK_HOLE_LOSSES {
            return false;
        }
        tracing::debug!(size, "path MTU black hole: back to the base size");
        self.restart();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumbo_path_is_found_with_one_probe() {
        let now = Instant::now();
        let mut m = PathMtu::new(1472, 8972);
        assert_eq!(m.probe_due(now), Some(8972));
        m.on_probe_sent();
        assert_eq!(m.probe_due(now), None, "one probe at a time");
        m.on_probe_acked(8972, now);
        assert_eq!(m.current(), 8972);
        assert_eq!(
            m.probe_due(now + RAISE_INTERVAL * 2),
            None,
            "at the ceiling: done"
        );
    }

    #[test]
    fn search_converges_on_the_path_limit_and_retries_later() {
        let now = Instant::now();
        let path = 4000; // largest datagram the path carries
        let mut m = PathMtu::new(1472, 8972);
        let mut probes = 0;
        while let Some(size) = m.probe_due(now) {
            probes += 1;
            assert!(probes < 100);
            m.on_probe_sent();
            if size <= path {
                m.on_probe_acked(size, now);
            } else {
                m.on_probe_lost(size, now);
            }
        }
        assert!(m.current() <= path && m.current() > path - SEARCH_GRANULARITY);
        assert!(probes < 40, "{probes} probes");
        assert_eq!(m.probe_due(now + RAISE_INTERVAL), Some(8972));
        assert!(
            m.current() > path - SEARCH_GRANULARITY,
            "data keeps its size meanwhile"
        );
    }

    /// The interface's MTU changed: raised, the size in use stays and the new ceiling is
    /// probed at once; lowered below the size in use, the link falls back to the base size
    /// and searches within the new ceiling.
    #[test]
    fn a_changed_interface_mtu_is_searched_again() {
        let now = Instant::now();
        let mut m = PathMtu::new(1472, 1472);
        assert_eq!(m.probe_due(now), None);
        assert!(!m.set_limits(1472, 1472), "nothing changed");
        assert!(m.set_limits(1472, 8972));
        assert_eq!(m.current(), 1472);
        assert_eq!(m.probe_due(now), Some(8972));
        m.on_probe_sent();
        m.on_probe_acked(8972, now);
        assert_eq!((m.current(), m.probe_due(now)), (8972, None));
        // lowered while a probe of the old ceiling is out: its acknowledgement, when it
        // comes, does not take the link back above the new one
        assert!(m.set_limits(1472, 16000));
        assert_eq!(m.probe_due(now), Some(16000));
        m.on_probe_sent();
        assert!(m.set_limits(1472, 3972));
        assert_eq!((m.current(), m.probe_due(now)), (1472, Some(3972)));
        m.on_probe_sent();
        m.on_probe_acked(16000, now);
        m.on_probe_lost(16000, now);
        assert_eq!(
            (m.current(), m.probe_due(now)),
            (1472, None),
            "3972's probe is out"
        );
        m.on_probe_acked(3972, now);
        assert_eq!((m.current(), m.probe_due(now)), (3972, None));
        assert!(m.set_limits(1472, 3972 - 100));
        assert_eq!((m.current(), m.probe_due(now)), (1472, Some(3872)));
        // a base the interface cannot send any more is lowered with it
        assert!(m.set_limits(1372, 1372));
        assert_eq!(
            (m.current(), m.base(), m.probe_due(now)),
            (1372, 1372, None)
        );
    }

    /// Full packets of the base size lost in a row while smaller ones are acknowledged put
    /// the base size in doubt (not while full ones are acknowledged too: congestion; nor for
    /// losses alone: a dead link, which its probe timeouts judge). Probes of the base size
    /// settle it: lost [`MAX_PROBES`] times in a row, the path is below the base size.
    #[test]
    fn a_path_below_the_base_size_is_told() {
        let now = Instant::now();
        let mut m = PathMtu::new(1472, 1472);
        let probe_lost = |m: &mut PathMtu| {
            assert_eq!(m.probe_due(now), Some(1472), "a probe of the base size");
            m.on_probe_sent();
            assert_eq!(m.probe_due(now), None, "one at a time");
            m.on_probe_lost(1472, now);
        };
        for _ in 0..BLACK_HOLE_LOSSES {
            m.on_packet_lost(1460);
        }
        assert_eq!(m.probe_due(now), None, "losses alone");
        m.on_packet_acked(120);
        assert_eq!(m.probe_due(now), None, "one small packet through");
        m.on_packet_acked(60);
        for _ in 0..MAX_PROBES {
            assert!(!m.below_base());
            probe_lost(&mut m);
        }
        assert!(m.below_base());
        assert_eq!(m.probe_due(now), None, "told: no more probes");
        // a full packet through: the path carries the base size
        m.on_packet_acked(1460);
        assert!(!m.below_base());
        for _ in 0..BLACK_HOLE_LOSSES - 1 {
            m.on_packet_lost(1472);
            m.on_packet_acked(100);
        }
        assert_eq!(m.probe_due(now), None, "one loss short");
        m.on_packet_lost(1472);
        for _ in 0..MAX_PROBES {
            probe_lost(&mut m);
        }
        assert!(m.below_base());
        m.restart();
        assert!(!m.below_base(), "forgotten once the link was down");
    }

    /// A policer over its rate drops every full packet while small ones fit its tokens: the
    /// same run of losses. A probe of the base size that gets through (the sender slowed
    /// down, the tokens came back) clears the doubt, and the link stays up.
    #[test]
    fn a_probe_of_the_base_size_acknowledged_clears_the_doubt() {
        let now = Instant::now();
        let mut m = PathMtu::new(1472, 1472);
        for _ in 0..BLACK_HOLE_LOSSES {
            m.on_packet_lost(1472);
            m.on_packet_acked(60);
        }
        assert_eq!(m.probe_due(now), Some(1472));
        m.on_probe_sent();
        m.on_probe_lost(1472, now);
        assert_eq!(m.probe_due(now), Some(1472));
        m.on_probe_sent();
        m.on_probe_acked(1472, now);
        assert!(!m.below_base());
        assert_eq!(m.probe_due(now), None, "no doubt left");
        // a new run starts from nothing: probes again, as many as before
        for _ in 0..BLACK_HOLE_LOSSES {
            m.on_packet_lost(1472);
            m.on_packet_acked(60);
        }
        for _ in 0..MAX_PROBES - 1 {
            assert_eq!(m.probe_due(now), Some(1472));
            m.on_probe_sent();
            m.on_probe_lost(1472, now);
        }
        assert!(!m.below_base(), "one probe short");
    }

    #[test]
    fn black_hole_falls_back_to_base_and_searches_again() {
        let now = Instant::now();
        let mut m = PathMtu::new(1472, 8972);
        m.probe_due(now);
        m.on_probe_sent();
        m.on_probe_acked(8972, now);
        for i in 1..BLACK_HOLE_LOSSES {
            assert!(!m.on_packet_lost(8972), "loss {i}");
        }
        m.on_packet_acked(4000); // a smaller one says nothing of the current size
        assert!(m.on_packet_lost(8972), "the 8th loss in a row");
        m.probe_due(now);
        m.on_probe_sent();
        m.on_probe_acked(8972, now);
        for i in 1..BLACK_HOLE_LOSSES {
            assert!(!m.on_packet_lost(8972), "loss {i}");
        }
        m.on_packet_acked(8972); // one got through: not a black hole
        for _ in 1..BLACK_HOLE_LOSSES {
            assert!(!m.on_packet_lost(8972));
        }
        // a full data packet, a few bytes short of the size (its frames' headers): the same
        m.on_packet_acked(8968);
        for _ in 1..BLACK_HOLE_LOSSES {
            assert!(!m.on_packet_lost(8972));
        }
        assert!(m.on_packet_lost(8972));
        assert_eq!(m.current(), 1472);
        assert_eq!(m.probe_due(now), Some(8972));
        assert!(!m.on_packet_lost(1472), "base-size losses are congestion");
    }
}
