//! Busy polling (`ri2n tunnel --busy-poll`): a packet thread that has just handled packets
//! keeps looking for the next ones for a while before it goes to sleep, so that a packet
//! arriving meanwhile is taken without a thread wake-up. A wake-up is the largest part of
//! what the tunnel adds to a small packet's round trip where waking a sleeping CPU is dear
//! (virtual machines: docs/BENCHMARKS.md §6); a request-response exchange whose round trip is
//! shorter than the window then crosses the tunnel without any.
//!
//! The price is CPU: a thread spins for up to the window after each burst of traffic. It
//! yields between looks, so that an application thread waiting for that CPU (the one about
//! to answer) runs first, and it never spins at rest: the window counts from the last packet
//! handled, not from the start of a wait.

use std::time::{Duration, Instant};

/// One packet thread's window.
#[derive(Debug)]
pub(crate) struct BusyPoll {
    /// How long after the last packet the thread keeps looking; zero: it sleeps at once.
    window: Duration,
    last_packet: Instant,
}

impl BusyPoll {
    pub(crate) fn new(window: Duration) -> Self {
        Self {
            window,
            last_packet: Instant::now(),
        }
    }

    /// The thread handled packets just now: the window opens again.
    pub(crate) fn handled(&mut self) {
        if !self.window.is_zero() {
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
}
