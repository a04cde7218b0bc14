//! Busy polling (`ri2n tunnel --busy-poll`): a packet thread that has just handled packets
//! keeps looking for the next ones for a while before it goes to sleep, so that a packet
//! arriving meanwhile is taken without a thread wake-up. A wake-up is the largest part of
//! what the tunnel adds to a small packet's round trip where waking a sleeping CPU is dear
//! (virtual machines: docs/BENCHMARKS.md §6); a request-response exchange whose round trip is
//! shorter than the window then crosses the tunnel without any.
//!
//! The price is CPU, so the window adapts, as the kernel's guest halt-polling does: it grows
//! (up to the `--busy-poll` setting) each time the thread was woken soon after its last packet,
//! where a longer spin would have caught the packet, and shrinks to nothing when the next
//! packet came later than the longest spin would have waited, where spinning was waste. A
//! thread yields between looks, so that an application thread waiting for that CPU (the one
//! about to answer) runs first, and it never spins at rest: the window counts from the last
//! packet handled, not from the start of a wait, and the keepalives that wake it at rest
//! are not packets it handled.

use std::time::{Duration, Instant};

/// One packet thread's window.
#[derive(Debug)]
pub(crate) struct BusyPoll {
    /// The longest window (`--busy-poll`); zero: the thread sleeps at once, always.
    max: Duration,
    /// How long after the last packet the thread keeps looking now (see the module doc).
    window: Duration,
    last_packet: Instant,
}

impl BusyPoll {
    /// A thread's window, starting at its longest.
    pub(crate) fn new(max: Duration) -> Self {
        Self {
            max,
            window: max,
            last_packet: Instant::now(),
        }
    }

    /// The thread handled packets just now: the window opens again.
    pub(crate) fn handled(&mut self) {
        if !self.max.is_zero() {
            self.last_packet = Instant::now();
        }
    }

    /// Calls `look` (a look that does not wait) until it finds something or the window since
    /// the last packet has closed; whether it found something. False at once without a
    /// window: the caller then waits as it would anyway.
    pub(crate) fn spin(&self, mut look: impl FnMut() -> bool) -> bool {
        if self.window.is_zero() {
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

    /// The thread was woken from a wait (after its spin found nothing): the window adapts to
    /// how long after the last packet that was.
    pub(crate) fn woke(&mut self) {
        self.adapt(self.last_packet.elapsed());
    }

    /// Grows the window (doubling, from an eighth of the longest) if `since_packet` is within
    /// the longest window, else closes it.
    fn adapt(&mut self, since_packet: Duration) {
        self.window = if since_packet <= self.max {
            (self.window * 2).max(self.max / 8).min(self.max)
        } else {
            Duration::ZERO
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_window_nothing_is_looked_at() {
        let mut looks = 0;
        assert!(!BusyPoll::new(Duration::ZERO).spin(|| {
            looks += 1;
            true
        }));
        assert_eq!(looks, 0);
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
        let mut poll = BusyPoll::new(window);
        let start = Instant::now();
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
    fn the_window_grows_while_packets_come_soon_and_closes_when_they_come_late() {
        let max = Duration::from_micros(200);
        let mut poll = BusyPoll::new(max);
        assert_eq!(poll.window, max, "it starts at its longest");
        // the next packet came 300 µs after the last: a spin of 200 would not have caught it
        poll.adapt(Duration::from_micros(300));
        assert_eq!(poll.window, Duration::ZERO);
        assert!(!poll.spin(|| panic!("looked with a closed window")));
        // packets 60 µs apart: the window grows back, doubling from an eighth of the longest
        let mut grown = Vec::new();
        for _ in 0..4 {
            poll.adapt(Duration::from_micros(60));
            grown.push(poll.window.as_micros());
        }
        assert_eq!(grown, [25, 50, 100, 200]);
        // at most the longest, and never with `--busy-poll 0`
        poll.adapt(Duration::ZERO);
        assert_eq!(poll.window, max);
        let mut off = BusyPoll::new(Duration::ZERO);
        off.adapt(Duration::ZERO);
        assert_eq!(off.window, Duration::ZERO);
    }
}
