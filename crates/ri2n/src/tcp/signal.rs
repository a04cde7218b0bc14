//! A condition variable that counts its waiters, so that a notification nobody waits for
//! costs no system call: `std`'s `Condvar::notify_all` makes a `futex` call every time, and
//! the TCP transport's threads notify each other for every run written and received, most
//! often with nobody waiting.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, MutexGuard};
use std::time::Duration;

/// A `Condvar` and how many threads wait on it. As with a `Condvar`, a waiter looks at the
/// state and waits under one mutex, and a notifier changes that state under the same mutex
/// before it notifies: a waiter counted itself before its wait released the mutex, so a
/// notifier that took the mutex afterwards sees it.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    cv: Condvar,
    waiting: AtomicUsize,
}

impl Signal {
    /// Waits until notified (or a spurious wake-up), at most `timeout` if given.
    pub fn wait<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Option<Duration>,
    ) -> MutexGuard<'a, T> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let guard = match timeout {
            None => self.cv.wait(guard).unwrap_or_else(|e| e.into_inner()),
            Some(t) => {
                (self.cv.wait_timeout(guard, t))
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
        };
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        guard
    }

    /// Wakes every waiter, if there is one.
    pub fn notify_all(&self) {
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::thread;

    /// A waiter that counted itself is woken by a change made under the mutex, every time:
    /// 10000 hand-overs back and forth between two threads, none lost (a lost one would
    /// stall the exchange for the 10 s of a wait and fail the test).
    #[test]
    fn no_notification_is_lost_between_two_threads() {
        const TURNS: u64 = 10_000;
        let shared = Arc::new((Mutex::new(0u64), Signal::default()));
        // each thread takes the turns of its parity: it adds one and notifies the other
        let take_turns = |shared: Arc<(Mutex<u64>, Signal)>, parity: u64| {
            let (m, s) = &*shared;
            let mut n = m.lock().unwrap();
            while *n < TURNS {
                if *n % 2 == parity {
                    *n += 1;
                    s.notify_all();
                } else {
                    n = s.wait(n, Some(Duration::from_secs(10)));
                }
            }
        };
        let other = shared.clone();
        let started = std::time::Instant::now();
        let odd = thread::spawn(move || take_turns(other, 1));
        take_turns(shared, 0);
        odd.join().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{TURNS} turns took {:?}",
            started.elapsed()
        );
    }
}
