//! Unreliable datagrams (DATAGRAM frames, docs/PROTOCOL.md §5.9): whole messages that travel
//! once, under each link's congestion window and pacing like stream data, striped by the same
//! scheduler, and never re-sent when lost. They suit traffic that recovers by itself, such as
//! the IP packets a tunnel carries: a second retransmission loop under inner TCP only adds
//! delay and duplicates (TCP-over-TCP meltdown).
//!
//! Both queues are bounded in bytes. Outgoing, a full queue drops its oldest datagram (a flow
//! that recovers by itself gains more from the newest), and a datagram that waited longer than
//! the configured age while a link was up is dropped unsent: it would only add queueing
//! delay. While no link is up, datagrams wait (within the bound) and their age starts again
//! when a link comes back, so the last packets of a stalled flow reach the peer at the heal:
//! an inner TCP connection then moves again at once instead of at its next, backed-off,
//! retransmission timeout. Incoming, datagrams the application does not read in time are
//! dropped on arrival. Every drop is counted.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Buffers kept for reuse, so a steady flow allocates none per datagram.
const SPARES: usize = 64;

/// Datagrams waiting to be sent.
#[derive(Debug)]
pub(crate) struct OutgoingDatagrams {
    /// (queued or last restarted, bytes), oldest first.
    queue: VecDeque<(Instant, Vec<u8>)>,
    bytes: usize,
    limit: usize,
    max_age: Duration,
    spare: Vec<Vec<u8>>,
    pub sent: u64,
    /// Dropped unsent: the queue was full, or they waited too long.
    pub dropped: u64,
}

impl OutgoingDatagrams {
    pub fn new(limit: usize, max_age: Duration) -> Self {
        Self {
            queue: VecDeque::new(),
            bytes: 0,
            limit,
            max_age,
            spare: Vec::new(),
            sent: 0,
            dropped: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Queues a copy of `data`, dropping the oldest datagrams if the queue would exceed its
    /// bound. The caller checked that `data` fits a packet.
    pub fn push(&mut self, now: Instant, data: &[u8]) {
        while !self.queue.is_empty() && self.bytes + data.len() > self.limit {
            self.drop_front();
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(data);
        self.bytes += buf.len();
        self.queue.push_back((now, buf));
    }

    /// Drops the datagrams that waited longer than the maximum age.
    pub fn drop_stale(&mut self, now: Instant) {
        while self
            .queue
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > self.max_age)
        {
            self.drop_front();
        }
    }

    /// Links are back after none was up: what waited starts its age again.
    pub fn restart_clock(&mut self, now: Instant) {
        for (t, _) in &mut self.queue {
            *t = now;
        }
    }

    /// Length of the next datagram to send.
    pub fn front_len(&self) -> Option<usize> {
        self.queue.front().map(|(_, d)| d.len())
    }

    /// Takes the next datagram; hand it back with [`Self::recycle`] once written.
    pub fn pop(&mut self) -> Option<Vec<u8>> {
        let (_, d) = self.queue.pop_front()?;
        self.bytes -= d.len();
        self.sent += 1;
        Some(d)
    }

    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < SPARES {
            self.spare.push(buf);
        }
    }

    fn drop_front(&mut self) {
        if let Some((_, d)) = self.queue.pop_front() {
            self.bytes -= d.len();
            self.dropped += 1;
            self.recycle(d);
        }
    }
}

/// Datagrams received and not yet read.
#[derive(Debug)]
pub(crate) struct IncomingDatagrams {
    queue: VecDeque<Vec<u8>>,
    bytes: usize,
    limit: usize,
    pub received: u64,
    /// Dropped on arrival: the application had not read enough of the earlier ones.
    pub dropped: u64,
}

impl IncomingDatagrams {
    pub fn new(limit: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            bytes: 0,
            limit,
            received: 0,
            dropped: 0,
        }
    }

    /// Takes a copy of an arrived datagram; returns false if it was dropped.
    pub fn push(&mut self, data: &[u8]) -> bool {
        self.received += 1;
        if self.bytes + data.len() > self.limit {
            self.dropped += 1;
            return false;
        }
        self.bytes += data.len();
        self.queue.push_back(data.to_vec());
        true
    }

    pub fn pop(&mut self) -> Option<Vec<u8>> {
        let d = self.queue.pop_front()?;
        self.bytes -= d.len();
        Some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_send_queue_drops_the_oldest() {
        let now = Instant::now();
        let mut q = OutgoingDatagrams::new(250, Duration::from_millis(20));
        for i in 0..3u8 {
            q.push(now, &[i; 100]);
        }
        assert_eq!(q.dropped, 1);
        assert_eq!(q.pop().unwrap(), [1; 100]);
        assert_eq!(q.pop().unwrap(), [2; 100]);
        assert!(q.pop().is_none());
    }

    #[test]
    fn stale_datagrams_are_dropped_and_a_heal_restarts_their_age() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut q = OutgoingDatagrams::new(10_000, ms(20));
        q.push(t0, b"old");
        q.push(t0 + ms(15), b"newer");
        q.drop_stale(t0 + ms(25));
        assert_eq!(q.dropped, 1);
        assert_eq!(q.front_len(), Some(5));
        // no link up for a minute, then one comes back: the datagram still goes
        q.restart_clock(t0 + ms(60_000));
        q.drop_stale(t0 + ms(60_010));
        assert_eq!(q.pop().unwrap(), b"newer");
    }

    #[test]
    fn the_receive_queue_drops_what_does_not_fit() {
        let mut q = IncomingDatagrams::new(150);
        assert!(q.push(&[1; 100]));
        assert!(!q.push(&[2; 100]));
        assert_eq!((q.received, q.dropped), (2, 1));
        assert_eq!(q.pop().unwrap(), [1; 100]);
        assert!(q.push(&[3; 100]));
        assert_eq!(q.pop().unwrap(), [3; 100]);
        assert!(q.pop().is_none());
    }
}
