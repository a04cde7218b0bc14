//! Soft failure: when a link gone slow is set aside. The TCP transport's watch thread
//! (`ri2n::tcp::link`) and the simulator's TCP model both ask [`SlowLinkWatch`], so the
//! simulator plays the rule the transport runs.
//!
//! A link is slow when the receiver has waited [`MIN_STALL`] (or 8 of another link's round
//! trips, if longer) for the stream's next bytes, which that link is to deliver
//! ([`Striper::head_link`]), while another link could deliver: it did meanwhile, or it has
//! nothing left in flight (the receive window, full behind the missing bytes, holds it
//! back). The wait counts from when the watch first saw the stream wait on that byte and
//! that link; and the slow link must have delivered nothing for as long, or be delivering
//! only runs the receiver already has ([`Striper::head_behind_duplicates`]): a link taken
//! back after being set aside still acknowledges, slowly, what its TCP connection held from
//! before.

use std::time::Duration;

use super::Striper;

/// The shortest wait for a link's bytes before it counts as slow.
pub const MIN_STALL: Duration = Duration::from_millis(50);

/// A link as the rule sees it.
#[derive(Debug, Clone, Copy)]
pub struct LinkView {
    /// Up, and not set aside.
    pub usable: bool,
    /// Its latest round-trip time.
    pub srtt: Duration,
    /// How long since the receiver's acknowledgements last counted more of its bytes.
    pub since_progress: Duration,
}

/// What the rule remembers between two looks: which byte the stream waits for, on which
/// link, since when.
#[derive(Debug, Default)]
pub struct SlowLinkWatch {
    waiting: Option<(u64, usize, Duration)>,
}

impl SlowLinkWatch {
    /// The link to set aside now, if one is slow. `now` counts from any fixed origin; `links`
    /// are by link number, as the striper numbers them.
    pub fn check(&mut self, striper: &Striper, links: &[LinkView], now: Duration) -> Option<usize> {
        let Some(h) = striper.head_link() else {
            self.waiting = None;
            return None;
        };
        let next = striper.delivered();
        let since = match self.waiting {
            Some((at, link, since)) if at == next && link == h => since,
            _ => {
                self.waiting = Some((next, h, now));
                now
            }
        };
        let others = (links.iter().enumerate()).filter(|&(j, l)| j != h && l.usable);
        let fastest = others.clone().map(|(_, l)| l.srtt).min()?;
        let stall = (fastest * 8).max(MIN_STALL);
        let could_deliver =
            { others }.any(|(j, l)| l.since_progress < stall || striper.in_flight(j) == 0);
        let head = links.get(h)?;
        let silent = head.since_progress >= stall || striper.head_behind_duplicates(h);
        if !head.usable || now.saturating_sub(since) < stall || !silent || !could_deliver {
            return None;
        }
        self.waiting = None;
        Some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::StripeConfig;

    const MS: Duration = Duration::from_millis(1);

    fn view(usable: bool, since_progress: Duration) -> LinkView {
        LinkView {
            usable,
            srtt: MS,
            since_progress,
        }
    }

    #[test]
    fn a_link_holding_the_next_bytes_is_slow_once_the_stream_waited_the_stall_time() {
        let mut s = Striper::new(StripeConfig::default(), 64 << 20);
        s.link_up(0, MS);
        s.link_up(1, MS);
        s.push(1 << 20);
        s.next(0).unwrap();
        s.next(1).unwrap();
        assert_eq!(s.head_link(), Some(0));
        let mut w = SlowLinkWatch::default();
        let silent = [view(true, MS * 100), view(true, MS)];
        // the wait counts from the first look
        assert_eq!(w.check(&s, &silent, MS * 1000), None);
        assert_eq!(w.check(&s, &silent, MS * 1049), None);
        assert_eq!(w.check(&s, &silent, MS * 1050), Some(0));
        // a link that delivers is not slow, nor one whose peers cannot deliver either
        let mut w = SlowLinkWatch::default();
        let delivering = [view(true, MS), view(true, MS)];
        assert_eq!(w.check(&s, &delivering, Duration::ZERO), None);
        assert_eq!(w.check(&s, &delivering, MS * 500), None);
        let mut w = SlowLinkWatch::default();
        let all_silent = [view(true, MS * 100), view(true, MS * 100)];
        assert_eq!(w.check(&s, &all_silent, Duration::ZERO), None);
        assert_eq!(
            w.check(&s, &all_silent, MS * 500),
            None,
            "link 1 has bytes in flight"
        );
        // nor a link already set aside
        let mut w = SlowLinkWatch::default();
        let aside = [view(false, MS * 100), view(true, MS)];
        assert_eq!(w.check(&s, &aside, Duration::ZERO), None);
        assert_eq!(w.check(&s, &aside, MS * 500), None);
    }
}
