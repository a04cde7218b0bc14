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
//! retransmission timeout. Every drop is counted.
//!
//! Datagrams are numbered in sending order, and the receiver restores that order: one that
//! arrives ahead of a missing one (it took a faster link) is held until the missing one comes
//! or a short hold time passes (then the missing one counts as lost). Striping over links of
//! different delays would otherwise reorder inner TCP's segments by more than a millisecond,
//! which it takes for loss (fast retransmits, halved windows), and beyond its timestamps'
//! 1 ms granularity, which its PAWS check drops as old duplicates.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::wire;

/// The largest datagram one packet of `datagram_size` UDP payload bytes carries: less the
/// largest SHORT header, the AEAD tag when `keyed`, and a DATAGRAM frame's type, number (up
/// to 8 bytes) and 2-byte length (datagrams stay below 16 KiB). 1426 bytes for a keyed
/// 1472-byte packet (IPv4 on a 1500-byte MTU).
pub fn datagram_capacity(datagram_size: usize, keyed: bool) -> usize {
    let tag = if keyed { crate::crypto::TAG_LEN } else { 0 };
    datagram_size.saturating_sub(wire::SHORT_HEADER_FIXED + 8 + tag + 1 + 8 + 2)
}

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
    /// Datagrams sent so far: the next one's number.
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

    /// Bytes the DATAGRAM frame of the next datagram takes.
    pub fn front_frame_len(&self) -> Option<usize> {
        let (_, d) = self.queue.front()?;
        Some(wire::datagram_frame_len(self.sent, d.len()))
    }

    /// Takes the next datagram with its number (numbers go to datagrams as they are sent, so
    /// one dropped unsent leaves no gap for the receiver to wait on); hand the buffer back
    /// with [`Self::recycle`] once written.
    pub fn pop(&mut self) -> Option<(u64, Vec<u8>)> {
        let (_, d) = self.queue.pop_front()?;
        self.bytes -= d.len();
        self.sent += 1;
        Some((self.sent - 1, d))
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

/// Datagrams received and not yet read, and those held until the ones before them arrive.
#[derive(Debug)]
pub(crate) struct IncomingDatagrams {
    /// In order, for the application.
    ready: VecDeque<Vec<u8>>,
    /// Arrived ahead of a missing one: number -> (arrival, bytes).
    held: BTreeMap<u64, (Instant, Vec<u8>)>,
    /// Bytes in `ready` and `held`.
    bytes: usize,
    limit: usize,
    /// The number of the next datagram to deliver.
    next: u64,
    /// Longest a datagram is held for a missing one (zero: delivered as they arrive).
    hold: Duration,
    pub received: u64,
    /// Dropped on arrival: the application had not read enough of the earlier ones.
    pub dropped: u64,
    /// Datagrams that arrived ahead of a missing one.
    pub reordered: u64,
}

impl IncomingDatagrams {
    pub fn new(limit: usize, hold: Duration) -> Self {
        Self {
            ready: VecDeque::new(),
            held: BTreeMap::new(),
            bytes: 0,
            limit,
            next: 0,
            hold,
            received: 0,
            dropped: 0,
            reordered: 0,
        }
    }

    /// Takes a copy of datagram `seq`, arrived `now`; returns whether datagrams became ready
    /// for the application.
    pub fn push(&mut self, now: Instant, seq: u64, data: &[u8]) -> bool {
        self.received += 1;
        if self.bytes + data.len() > self.limit {
            // make room by giving up on the missing ones the held datagrams wait for
            while self.bytes + data.len() > self.limit && self.release_first_held() {}
            if self.bytes + data.len() > self.limit {
                self.dropped += 1;
                if seq == self.next {
                    // it came: nothing is missing here
                    let before = self.ready.len();
                    self.next += 1;
                    self.release_in_order();
                    return self.ready.len() > before;
                }
                return false;
            }
        }
        self.bytes += data.len();
        if seq > self.next && !self.hold.is_zero() {
            self.reordered += 1;
            self.held.insert(seq, (now, data.to_vec()));
            return false;
        }
        // the next one, or one that arrived after it was given up on (late, but delivered:
        // dropping it would not make it any less late)
        self.ready.push_back(data.to_vec());
        if seq >= self.next {
            self.next = seq + 1;
            self.release_in_order();
        }
        true
    }

    /// When the oldest held datagram stops waiting for the missing ones before it.
    pub fn release_deadline(&self) -> Option<Instant> {
        self.held
            .values()
            .map(|(t, _)| *t)
            .min()
            .map(|t| t + self.hold)
    }

    /// Delivers the held datagrams whose hold is over, giving up on the missing ones before
    /// them; returns whether datagrams became ready.
    pub fn release_due(&mut self, now: Instant) -> bool {
        let mut released = false;
        while self.release_deadline().is_some_and(|t| t <= now) {
            released |= self.release_first_held();
        }
        released
    }

    /// Gives up on the datagrams missing before the first held one and delivers it (and
    /// those right after it); false if none is held.
    fn release_first_held(&mut self) -> bool {
        let Some((&seq, _)) = self.held.first_key_value() else {
            return false;
        };
        self.next = seq;
        self.release_in_order();
        true
    }

    fn release_in_order(&mut self) {
        while let Some((_, d)) = self.held.remove(&self.next) {
            self.ready.push_back(d);
            self.next += 1;
        }
    }

    /// Datagrams held for an earlier one, and datagrams ready for the application.
    pub fn waiting(&self) -> (usize, usize) {
        (self.held.len(), self.ready.len())
    }

    pub fn pop(&mut self) -> Option<Vec<u8>> {
        let d = self.ready.pop_front()?;
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
        // numbered as sent: the drop leaves no gap
        assert_eq!(q.pop().unwrap(), (0, vec![1; 100]));
        assert_eq!(q.pop().unwrap(), (1, vec![2; 100]));
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
        assert_eq!(q.front_frame_len(), Some(1 + 1 + 1 + 5));
        // no link up for a minute, then one comes back: the datagram still goes
        q.restart_clock(t0 + ms(60_000));
        q.drop_stale(t0 + ms(60_010));
        assert_eq!(q.pop().unwrap(), (0, b"newer".to_vec()));
    }

    #[test]
    fn the_receive_queue_drops_what_does_not_fit() {
        let now = Instant::now();
        let mut q = IncomingDatagrams::new(150, Duration::from_millis(5));
        assert!(q.push(now, 0, &[1; 100]));
        assert!(!q.push(now, 1, &[2; 100]));
        assert_eq!((q.received, q.dropped), (2, 1));
        assert_eq!(q.pop().unwrap(), [1; 100]);
        assert!(
            q.push(now, 2, &[3; 100]),
            "1 was dropped here: it is not waited for"
        );
        assert_eq!(q.pop().unwrap(), [3; 100]);
        assert!(q.pop().is_none());
    }

    #[test]
    fn datagrams_are_delivered_in_sending_order_and_a_missing_one_is_waited_for_briefly() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut q = IncomingDatagrams::new(1 << 20, ms(5));
        let take = |q: &mut IncomingDatagrams| {
            std::iter::from_fn(|| q.pop())
                .map(|d| d[0])
                .collect::<Vec<u8>>()
        };
        assert!(q.push(t0, 0, &[0]));
        assert!(!q.push(t0, 2, &[2]), "held for 1");
        assert!(!q.push(t0 + ms(1), 3, &[3]));
        assert_eq!(take(&mut q), [0]);
        assert!(q.push(t0 + ms(2), 1, &[1]), "1 arrives: 1, 2, 3 go");
        assert_eq!(take(&mut q), [1, 2, 3]);
        assert_eq!(q.release_deadline(), None);
        // 4 is lost: 5 and 6 wait 5 ms for it, then go
        assert!(!q.push(t0 + ms(10), 5, &[5]));
        assert!(!q.push(t0 + ms(11), 6, &[6]));
        assert_eq!(q.release_deadline(), Some(t0 + ms(15)));
        assert!(!q.release_due(t0 + ms(14)));
        assert!(q.release_due(t0 + ms(15)));
        assert_eq!(take(&mut q), [5, 6]);
        // 4 arrives after all: late, but delivered
        assert!(q.push(t0 + ms(20), 4, &[4]));
        assert_eq!(take(&mut q), [4]);
        assert!(q.push(t0 + ms(21), 7, &[7]));
        assert_eq!(take(&mut q), [7]);
        assert_eq!((q.received, q.reordered), (8, 4));
    }

    #[test]
    fn without_a_hold_datagrams_go_as_they_arrive() {
        let now = Instant::now();
        let mut q = IncomingDatagrams::new(1 << 20, Duration::ZERO);
        assert!(q.push(now, 2, &[2]));
        assert!(q.push(now, 0, &[0]));
        assert_eq!(
            std::iter::from_fn(|| q.pop())
                .map(|d| d[0])
                .collect::<Vec<_>>(),
            [2, 0]
        );
    }
}
