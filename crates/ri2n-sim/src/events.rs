//! The time-ordered event queue both event loops (the scenario runner and the [`Testbed`])
//! schedule into: the earliest event first, and events due at the same instant in the order
//! they were scheduled, so that a run depends only on its inputs.
//!
//! [`Testbed`]: crate::testbed::Testbed

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Duration;

/// Events of kind `K`, each due at a simulated time.
#[derive(Debug)]
pub(crate) struct EventQueue<K> {
    heap: BinaryHeap<Scheduled<K>>,
    seq: u64,
}

#[derive(Debug)]
struct Scheduled<K> {
    at: Duration,
    seq: u64,
    kind: K,
}

impl<K> PartialEq for Scheduled<K> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<K> Eq for Scheduled<K> {}
impl<K> PartialOrd for Scheduled<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Scheduled<K> {
    /// Reversed: the heap pops the earliest (time, sequence number) first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl<K> Default for EventQueue<K> {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }
}

impl<K> EventQueue<K> {
    /// Adds an event due at `at`, after every event already due then.
    pub(crate) fn schedule(&mut self, at: Duration, kind: K) {
        self.seq += 1;
        self.heap.push(Scheduled {
            at,
            seq: self.seq,
            kind,
        });
    }

    /// The next event, without taking it.
    pub(crate) fn peek(&self) -> Option<(Duration, &K)> {
        self.heap.peek().map(|s| (s.at, &s.kind))
    }

    /// Takes the next event.
    pub(crate) fn pop(&mut self) -> Option<(Duration, K)> {
        self.heap.pop().map(|s| (s.at, s.kind))
    }

    /// Takes the next event if it is due by `now`.
    pub(crate) fn pop_due(&mut self, now: Duration) -> Option<K> {
        if self.heap.peek()?.at > now {
            return None;
        }
        self.pop().map(|(_, k)| k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_pop_in_time_then_sequence_order() {
        let mut q = EventQueue::default();
        for (at, name) in [(5, 'a'), (3, 'b'), (5, 'c'), (1, 'd'), (3, 'e')] {
            q.schedule(Duration::from_nanos(at), name);
        }
        assert_eq!(q.peek(), Some((Duration::from_nanos(1), &'d')));
        assert_eq!(q.pop_due(Duration::ZERO), None);
        let order: Vec<_> = std::iter::from_fn(|| q.pop())
            .map(|(at, k)| (at.as_nanos(), k))
            .collect();
        assert_eq!(
            order,
            vec![(1, 'd'), (3, 'b'), (3, 'e'), (5, 'a'), (5, 'c')]
        );
    }
}
