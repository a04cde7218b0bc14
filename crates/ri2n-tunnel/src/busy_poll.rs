//! Busy polling (`ri2n tunnel --busy-poll`): a packet thread that has just handled packets
//! keeps looking for the next ones for a while before it goes to sleep, so that a packet
//! arriving meanwhile is taken without a thread wake-up. A wake-up is the largest part of
//! what the tunnel adds to a small packet's round trip where waking a sleeping CPU is dear
//! (virtual machines: docs/BENCHMARKS.md §6); a request-response exchange whose turns come
//! quicker than the window then crosses the tunnel without any.
//!
//! The price is CPU, kept to where it buys something. The window counts from the last packet
//! handled, not from the start of a wait, so the thread never spins at rest. And it spins only
//! while the traffic is such that spinning catches packets: each idle spell (from the last
//! packet handled to the next) longer than the window is a miss, one that spinning spent in
//! vain, and after [`MISSES`] in a row the thread sleeps at once until a quick spell shows
//! that the packets come quickly again (kernel halt-polling adapts its window to the same
//! evidence). A spell the thread sleeps through holds its own wake-up, which spinning would
//! have saved, so there a spell of up to twice the window counts as quick: a request-response
//! exchange slowed by its wake-ups finds the spinning again. So the thread spins in vain for
//! at most [`MISSES`] windows after a packet that came within twice the window, and not at
//! all once packets come further apart, one-way or both ways; a ping-pong or a stream whose
//! packets come quicker than the window crosses without wake-ups. The thread yields between
//! looks, so that an application thread waiting for that CPU (the one about to answer) runs
//! first.

use std::time::{Duration, Instant};

/// Idle spells in a row longer than the window after which the thread stops spinning. More
/// than one: a request-response exchange alternates a short spell (the local application
/// answering) with a longer one (the round trip), and the short ones are the ones to catch.
pub(crate) const MISSES: u32 = 2;

/// One packet thread's window.
#[derive(Debug)]
pub(crate) struct BusyPoll {
    /// How long after the last packet the thread keeps looking; zero: it sleeps at once.
    window: Duration,
    last_packet: Instant,
    /// Whether the thread has gone idle since the last packet (`spin` was called): the next
    /// packet ends an idle spell.
    idle: bool,
    /// Idle spells in a row longer than the window.
    misses: u32,
}

impl BusyPoll {
    pub(crate) fn new(window: Duration) -> Self {
        Self {
            window,
            last_packet: Instant::now(),
            idle: false,
            misses: 0,
        }
    }

    /// The thread handled packets just now: the window opens again, and an idle spell that
    /// ended with these packets counts as caught or missed.
    pub(crate) fn handled(&mut self) {
        if self.window.is_zero() {
            return;
        }
        let now = Instant::now();
        if std::mem::take(&mut self.idle) {
            // while spinning, a spell longer than the window was a spin in vain; while
            // sleeping at once, the spell holds the wake-up
            let quick = if self.spinning() {
                self.window
            } else {
                self.window.saturating_mul(2)
            };
            if now.duration_since(self.last_packet) <= quick {
                self.misses = 0;
            } else {
                self.misses = self.misses.saturating_add(1);
            }
        }
        self.last_packet = now;
    }

    /// Whether the thread spins when it next runs out of work.
    pub(crate) fn spinning(&self) -> bool {
        !self.window.is_zero() && self.misses < MISSES
    }

    /// The thread has nothing to do: calls `look` (a look that does not wait) until it finds
    /// something or the window since the last packet has closed; whether it found something.
    /// False at once where the thread does not spin: the caller then waits as it would
    /// anyway.
    pub(crate) fn spin(&mut self, mut look: impl FnMut() -> bool) -> bool {
        self.idle = true;
        if !self.spinning() {
            return false;
        }
        while self.last_packet.elapsed() < self.window {
            if look() {
                return true;
            }
            std::thread::yield_now();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle spell of `spell` for `poll`: the thread runs out of work `spell` after its
    /// last packet (no spin, to keep the test's time short) and a packet ends the spell.
    fn spell(poll: &mut BusyPoll, spell: Duration) {
        poll.idle = true;
        poll.last_packet = Instant::now() - spell;
        poll.handled();
    }

    #[test]
    fn without_a_window_nothing_is_looked_at() {
        let mut looks = 0;
        let mut poll = BusyPoll::new(Duration::ZERO);
        assert!(!poll.spin(|| {
            looks += 1;
            true
        }));
        assert_eq!(looks, 0);
        assert!(!poll.spinning());
    }

    #[test]
    fn a_look_that_finds_something_ends_the_spin() {
        let mut looks = 0;
        let found = BusyPoll::new(Duration::from_secs(60)).spin(|| {
            looks += 1;
            looks == 3
        });
        assert!(found);
        assert_eq!(looks, 3);
    }

    #[test]
    fn the_window_counts_from_the_last_packet_handled() {
        let window = Duration::from_millis(20);
        // taken before the window opens (at `new`): the spin ends a window after that
        let start = Instant::now();
        let mut poll = BusyPoll::new(window);
        assert!(!poll.spin(|| false));
        // it spun the window out, once: the next wait finds it closed and does not spin
        let spun = start.elapsed();
        assert!(spun >= window, "spun {spun:?}");
        let again = Instant::now();
        let mut looks = 0;
        assert!(!poll.spin(|| {
            looks += 1;
            false
        }));
        assert_eq!(
            looks,
            0,
            "spun again {:?} after the window closed",
            again.elapsed()
        );
        // packets reopen it
        poll.handled();
        let mut looks = 0;
        assert!(poll.spin(|| {
            looks += 1;
            true
        }));
        assert_eq!(looks, 1);
    }

    #[test]
    fn sparse_packets_stop_the_spinning_and_quick_ones_start_it_again() {
        let window = Duration::from_millis(1);
        let mut poll = BusyPoll::new(window);
        assert!(poll.spinning());
        // packets a second apart: spinning would catch none of them
        for _ in 0..MISSES {
            assert!(poll.spinning());
            spell(&mut poll, Duration::from_secs(1));
        }
        assert!(!poll.spinning());
        let mut looks = 0;
        let start = Instant::now();
        assert!(!poll.spin(|| {
            looks += 1;
            false
        }));
        assert_eq!(looks, 0, "looked for {:?}", start.elapsed());
        // more sparse packets keep it off; one within the window turns it on
        spell(&mut poll, Duration::from_secs(1));
        assert!(!poll.spinning());
        spell(&mut poll, Duration::from_micros(100));
        assert!(poll.spinning());
    }

    #[test]
    fn spells_slept_through_count_their_wake_up() {
        let window = Duration::from_millis(10);
        let mut poll = BusyPoll::new(window);
        // spinning: a spell longer than the window is a miss, however close
        for _ in 0..MISSES {
            spell(&mut poll, Duration::from_millis(15));
        }
        assert!(!poll.spinning());
        // sleeping at once: the same spell holds a wake-up, and counts as quick
        spell(&mut poll, Duration::from_millis(15));
        assert!(poll.spinning());
        for _ in 0..MISSES {
            spell(&mut poll, Duration::from_millis(15));
        }
        // past twice the window it stays off
        spell(&mut poll, Duration::from_millis(25));
        assert!(!poll.spinning());
    }

    #[test]
    fn a_ping_pong_alternating_short_and_long_spells_keeps_it_spinning() {
        let mut poll = BusyPoll::new(Duration::from_millis(1));
        for _ in 0..10 {
            spell(&mut poll, Duration::from_micros(100));
            spell(&mut poll, Duration::from_secs(1));
            assert!(poll.spinning());
        }
    }

    #[test]
    fn packets_of_one_burst_are_not_idle_spells() {
        let mut poll = BusyPoll::new(Duration::from_millis(1));
        for _ in 0..MISSES {
            spell(&mut poll, Duration::from_secs(1));
        }
        assert!(!poll.spinning());
        // packets handled back to back, with no wait between them, leave it off
        for _ in 0..10 {
            poll.handled();
        }
        assert!(!poll.spinning());
    }
}
