//! Datagrams on their way out of a shard (see `driver/transmit.rs`). The engine builds each
//! one in place at the end of its socket's open batch, one GSO send each; full batches wait in
//! a queue that one thread at a time sends, so the datagrams of a link leave in the order
//! they were numbered.
//!
//! Where the process may use many CPUs ([`LinkThreads`]), each link socket also has a *lane*:
//! a thread of its own that seals and sends that socket's batches, while the thread that
//! built them goes back to the engine. Then one connection that fills its links keeps a core
//! per link busy beside the one that builds: sealing, the copies and the kernel's UDP and IP
//! path leave the building thread, which a single application thread otherwise runs alone.
//! The engine then leaves the stream's bytes out of the datagrams ([`Batch::holes`]), and a
//! lane's system call gathers them from the send buffer (or the lane copies them in, to
//! seal). A short transmission (a message of a request-response exchange, an
//! acknowledgement: [`SHORT_BATCH`]) is still sent by the thread that built it when its lane
//! is idle: a hop to another thread would add a wake-up to its latency. On few CPUs the lanes
//! only move the batches between cores for nothing: the other threads keep those CPUs busy
//! already (docs/BENCHMARKS.md §8).

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use bytes::Bytes;
use ri2n_proto::{LinkThreads, Seal, Transmit, TransmitBuffer};

use crate::socket::LinkSocket;

/// Room for one datagram: the largest the engine builds.
const MAX_DATAGRAM: usize = ri2n_proto::wire::MAX_DATAGRAM_SIZE;
/// Most bytes one GSO send carries: below the 65 507-byte limit of one UDP send over IPv4.
pub(crate) const BATCH_BYTES: usize = 60 * 1024;
/// A batch of at most this many bytes, alone for its socket, is a short transmission (a
/// message of a request-response exchange, acknowledgements): its builder sends it itself
/// when the lane is idle. Larger ones, the batches of a stream, go to the lane's thread.
pub(crate) const SHORT_BATCH: usize = BATCH_BYTES / 4;
/// Batches built ahead of the sender before the engine is asked for no more: bounds the
/// memory of a round and the time datagrams wait between being built and sent.
const MAX_QUEUED_BATCHES: usize = 64;
/// Batches per lane built ahead of its thread. Few: the engine dates a datagram when it
/// builds it, so what waits in a lane counts as time on the path (its round trip grows, and
/// probe timeouts send data again that was only waiting), and a lane that falls behind has
/// the engine build more as it catches up ([`Backlog::take_throttled`]).
pub(crate) const LANE_BATCHES: usize = 4;
/// Where [`LinkThreads::Auto`] gives each link socket a lane (and a receiving thread, see
/// `driver/receive.rs`): the CPUs the process may use.
const LANES_FROM_CPUS: usize = 8;

/// Whether an endpoint's sockets get lanes (or receiving threads), as `setting` asks.
pub(crate) fn lanes_wanted(setting: LinkThreads) -> bool {
    match setting {
        LinkThreads::On => true,
        LinkThreads::Off => false,
        LinkThreads::Auto => {
            std::thread::available_parallelism().map_or(1, usize::from) >= LANES_FROM_CPUS
        }
    }
}

/// Datagrams for one socket that leave together in one GSO send: all to `dest`, all
/// `segment` bytes long except perhaps the last. The buffer has a fixed size, so handing out
/// room for the next datagram never zero-fills or reallocates.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(crate) dest: SocketAddr,
    pub(crate) segment: usize,
    pub(crate) buf: Box<[u8]>,
    pub(crate) len: usize,
    /// The datagrams still to seal before the batch leaves (start, length, sealing): the
    /// sending thread seals them without the lock ([`TransmitBuffer::seals_later`]).
    seals: Vec<(usize, usize, Seal)>,
    /// The stream bytes the engine left out of `buf` ([`TransmitBuffer::takes_payload`]), in
    /// the order of their places: they go straight from the send buffer into the system call
    /// ([`Batch::parts`]), or are copied in first where the batch is sealed or sent another
    /// way ([`Batch::fill_holes`]).
    holes: Vec<Hole>,
    /// The memory the holes' bytes are in, each piece once (consecutive datagrams take their
    /// bytes from the same piece): it lives until the batch has left.
    pieces: Vec<Bytes>,
}

/// Stream bytes that belong at `buf[at..]`: `range` of piece number `piece`.
#[derive(Debug)]
struct Hole {
    at: usize,
    piece: usize,
    range: Range<usize>,
}

impl Batch {
    pub(crate) fn new() -> Self {
        Self {
            dest: SocketAddr::from(([0, 0, 0, 0], 0)),
            segment: 0,
            buf: vec![0u8; BATCH_BYTES + MAX_DATAGRAM].into_boxed_slice(),
            len: 0,
            seals: Vec::new(),
            holes: Vec::new(),
            pieces: Vec::new(),
        }
    }

    /// Whether stream bytes are still to be put in ([`Batch::parts`], [`Batch::fill_holes`]).
    pub(crate) fn has_holes(&self) -> bool {
        !self.holes.is_empty()
    }

    /// The batch's bytes as the slices to gather them from: its own buffer up to each hole,
    /// the hole's bytes where they are.
    pub(crate) fn parts(&self) -> Vec<IoSlice<'_>> {
        let mut parts = Vec::with_capacity(2 * self.holes.len() + 1);
        let mut pos = 0;
        for h in &self.holes {
            if h.at > pos {
                parts.push(IoSlice::new(&self.buf[pos..h.at]));
            }
            parts.push(IoSlice::new(&self.pieces[h.piece][h.range.clone()]));
            pos = h.at + h.range.len();
        }
        if self.len > pos {
            parts.push(IoSlice::new(&self.buf[pos..self.len]));
        }
        parts
    }

    /// Copies the bytes of the holes from number `first` on into the buffer.
    fn fill_holes_from(&mut self, first: usize) {
        for h in self.holes.drain(first..) {
            let bytes = &self.pieces[h.piece][h.range];
            self.buf[h.at..h.at + bytes.len()].copy_from_slice(bytes);
        }
        if self.holes.is_empty() {
            self.pieces.clear();
        }
    }

    /// Copies every hole's bytes into the buffer, which then holds the whole batch.
    pub(crate) fn fill_holes(&mut self) {
        self.fill_holes_from(0);
    }

    /// Lets go of the memory the holes refer to, once the batch has left.
    pub(crate) fn clear_holes(&mut self) {
        self.holes.clear();
        self.pieces.clear();
    }

    /// Seals the datagrams whose sealing was left to the sender (their bytes copied in
    /// first: sealing covers them).
    pub(crate) fn seal(&mut self) {
        if !self.seals.is_empty() {
            self.fill_holes();
        }
        for (start, len, seal) in self.seals.drain(..) {
            seal.apply(&mut self.buf[start..start + len]);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the next datagram, to `dest`, may be built at the end of this batch. (It joins
    /// only if it is no larger than the segment size, so the batch stays within
    /// [`BATCH_BYTES`]; a larger one is moved to a batch of its own.)
    fn takes(&self, dest: SocketAddr, max_segments: usize) -> bool {
        self.is_empty()
            || (self.dest == dest
                && self.len.is_multiple_of(self.segment)
                && self.len / self.segment < max_segments
                && self.len + self.segment <= BATCH_BYTES)
    }
}

/// Datagrams on their way out. The engine builds each one in place at the end of its
/// socket's open batch ([`TransmitBuffer`]); a batch is queued when the next datagram cannot
/// join it (another destination, a larger size, a full batch). One thread at a time sends
/// the queue, in order, so the datagrams of a link leave in the order they were numbered;
/// with lanes, the queue is handed to them instead ([`Lane`]).
#[derive(Debug)]
pub(crate) struct Outgoing {
    locals: Vec<SocketAddr>,
    max_segments: Vec<usize>,
    /// The batch being filled, per socket.
    open: Vec<Batch>,
    /// Batches ready to send, with their socket, oldest first.
    pub(crate) queue: VecDeque<(usize, Batch)>,
    /// The memory of the queue the sending thread took last (one thread sends at a time): it
    /// becomes the next queue, so a round of sending allocates nothing.
    pub(crate) taken_queue: VecDeque<(usize, Batch)>,
    /// Empty batches for reuse.
    pub(crate) spare: Vec<Batch>,
    /// A thread is sending the queue (without the lock).
    pub(crate) sending: bool,
    /// Room was handed out in this socket's open batch at this position, and the batch had
    /// this many holes then.
    pending: Option<(usize, usize, usize)>,
    /// The sealing the datagram in that room still needs.
    pending_seal: Option<Seal>,
    /// Room for a datagram from an address that has no socket (it is dropped).
    discard: Vec<u8>,
    /// What left the queue for the lanes and is not sent yet.
    pub(crate) backlog: Arc<Backlog>,
    /// Per socket, its batches of the queue on their way to its lane (kept for its memory).
    pub(crate) by_lane: Vec<Vec<Batch>>,
    /// Batches queued or unsent beyond which the engine builds no more.
    max_batches: usize,
    /// The engine leaves the stream bytes out of the datagrams ([`Batch::holes`]): with
    /// lanes, whose threads then take them from the send buffer themselves. Without, the
    /// thread that builds also sends, and copying the bytes in as it builds costs it least:
    /// later, the batch and the bytes are no longer in its cache (docs/BENCHMARKS.md §2b).
    by_reference: bool,
}

impl Outgoing {
    /// The outgoing datagrams of `sockets`, with a lane each if `lanes`.
    pub(crate) fn new(sockets: &[LinkSocket], lanes: bool, backlog: Arc<Backlog>) -> Self {
        Self {
            locals: sockets.iter().map(|s| s.local).collect(),
            max_segments: sockets.iter().map(LinkSocket::max_segments).collect(),
            open: sockets.iter().map(|_| Batch::new()).collect(),
            queue: VecDeque::new(),
            taken_queue: VecDeque::new(),
            spare: Vec::new(),
            sending: false,
            pending: None,
            pending_seal: None,
            discard: vec![0u8; MAX_DATAGRAM],
            backlog,
            by_lane: sockets.iter().map(|_| Vec::new()).collect(),
            max_batches: if lanes {
                LANE_BATCHES * sockets.len()
            } else {
                MAX_QUEUED_BATCHES
            },
            by_reference: lanes,
        }
    }

    /// Takes again how many datagrams each socket's GSO sends may carry: one, from the
    /// first batch the kernel would not segment on. An open batch already larger goes as
    /// it is (its send falls back to single datagrams).
    pub(crate) fn refresh_max_segments(&mut self, sockets: &[LinkSocket]) {
        for (max, s) in self.max_segments.iter_mut().zip(sockets) {
            *max = s.max_segments();
        }
    }

    /// Queues socket `i`'s open batch, if it holds anything.
    fn close(&mut self, i: usize) {
        if !self.open[i].is_empty() {
            let fresh = self.spare.pop().unwrap_or_else(Batch::new);
            let full = std::mem::replace(&mut self.open[i], fresh);
            self.queue.push_back((i, full));
        }
    }

    pub(crate) fn close_all(&mut self) {
        for i in 0..self.open.len() {
            self.close(i);
        }
    }
}

impl TransmitBuffer for Outgoing {
    fn buffer(&mut self, local: SocketAddr, remote: SocketAddr) -> &mut [u8] {
        // the holes of room handed out and never committed (a datagram not built after all)
        if let Some((i, _, holes)) = self.pending.take() {
            self.open[i].holes.truncate(holes);
        }
        let Some(i) = self.locals.iter().position(|&a| a == local) else {
            return &mut self.discard;
        };
        if !self.open[i].takes(remote, self.max_segments[i]) {
            self.close(i);
        }
        let batch = &mut self.open[i];
        self.pending = Some((i, batch.len, batch.holes.len()));
        &mut batch.buf[batch.len..]
    }

    /// Records the datagram the engine just built in the room last handed out.
    fn commit(&mut self, t: &Transmit) {
        let seal = self.pending_seal.take();
        let Some((i, start, holes)) = self.pending.take() else {
            return;
        };
        let batch = &mut self.open[i];
        if start == 0 {
            batch.dest = t.remote;
            batch.segment = t.len;
        } else if t.len > batch.segment {
            // GSO segments cannot grow: the datagram starts a batch of its own (rare: data
            // after a smaller packet to the same address ends a batch anyway), whole
            batch.fill_holes_from(holes);
            let mut own = self.spare.pop().unwrap_or_else(Batch::new);
            own.buf[..t.len].copy_from_slice(&batch.buf[start..start + t.len]);
            own.dest = t.remote;
            own.segment = t.len;
            own.len = t.len;
            own.seals.extend(seal.map(|s| (0, t.len, s)));
            let previous = std::mem::replace(batch, own);
            self.queue.push_back((i, previous));
            return;
        }
        batch.seals.extend(seal.map(|s| (start, t.len, s)));
        batch.len = start + t.len;
        if t.len < batch.segment {
            self.close(i); // a shorter datagram can only end a batch
        }
    }

    fn wants_more(&self) -> bool {
        // SeqCst, as the mark's store (`Backlog::throttle`): a builder that marks and then
        // looks, and a lane that sends and then takes the mark, cannot both miss the other
        self.queue.len() + self.backlog.unsent.load(Ordering::SeqCst) < self.max_batches
    }

    fn seals_later(&self) -> bool {
        true
    }

    fn defer_seal(&mut self, seal: Seal) {
        self.pending_seal = Some(seal);
    }

    fn takes_payload(&self) -> bool {
        self.by_reference
    }

    fn defer_payload(&mut self, at: usize, piece: &Bytes, range: Range<usize>) {
        let Some((i, start, _)) = self.pending else {
            return; // room from the discard buffer: the datagram is dropped
        };
        let batch = &mut self.open[i];
        let same = |p: &Bytes| p.as_ptr() == piece.as_ptr() && p.len() == piece.len();
        if !batch.pieces.last().is_some_and(same) {
            batch.pieces.push(piece.clone());
        }
        batch.holes.push(Hole {
            at: start + at,
            piece: batch.pieces.len() - 1,
            range,
        });
    }
}

/// The batches that left a shard's queue and are not sent yet, counted where the engine
/// asks whether to build more ([`TransmitBuffer::wants_more`]).
#[derive(Debug, Default)]
pub(crate) struct Backlog {
    /// Batches handed to a lane, or taken by a thread that sends them itself, and not sent.
    unsent: AtomicUsize,
    /// The engine stopped building because too many batches were unsent: the lane that
    /// sends some next has it build more (no other thread may be coming to).
    throttled: AtomicBool,
}

impl Backlog {
    /// Whether batches are still on their way (a close waits for them).
    pub(crate) fn any_unsent(&self) -> bool {
        self.unsent.load(Ordering::Acquire) > 0
    }

    /// `n` more batches left the queue.
    pub(crate) fn left_queue(&self, n: usize) {
        self.unsent.fetch_add(n, Ordering::AcqRel);
    }

    /// One batch was sent.
    pub(crate) fn sent(&self) {
        self.unsent.fetch_sub(1, Ordering::SeqCst);
    }

    /// The engine stopped building at [`Outgoing`]'s limit on batches.
    pub(crate) fn throttle(&self) {
        self.throttled.store(true, Ordering::SeqCst);
    }

    /// Whether the engine is stopped at the limit now (no lane has taken the mark since).
    pub(crate) fn is_throttled(&self) -> bool {
        self.throttled.load(Ordering::SeqCst)
    }

    /// Whether the engine was stopped since the last call (and is to build again).
    pub(crate) fn take_throttled(&self) -> bool {
        self.throttled.swap(false, Ordering::SeqCst)
    }
}

/// One link socket's lane: its batches, sent in order by one thread at a time, the lane's
/// own or one that sends a short transmission itself while the lane is idle.
#[derive(Debug, Default)]
pub(crate) struct Lane {
    state: Mutex<LaneState>,
    wake: Condvar,
    /// Batches sent by the lane's thread, and by the threads that built them.
    #[cfg(test)]
    pub(crate) sent_by_thread: AtomicUsize,
    #[cfg(test)]
    pub(crate) sent_by_caller: AtomicUsize,
}

#[derive(Debug, Default)]
struct LaneState {
    /// Handed over, not yet taken by the lane's thread, oldest first.
    batches: VecDeque<Batch>,
    /// A thread is sending this socket's batches.
    sending: bool,
    /// The lane's thread waits for batches: one handed over must wake it.
    idle: bool,
    /// The endpoint is gone: the thread stops once the lane is empty.
    stop: bool,
    /// Sent batches, for the engine to build in again.
    spent: Vec<Batch>,
}

impl Lane {
    fn state(&self) -> MutexGuard<'_, LaneState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands this socket's new `batches` (in order) to the lane, and the lane's sent batches
    /// back to `spare`. If `short` (one batch of at most [`SHORT_BATCH`]) and the lane is idle with
    /// nothing waiting, it claims the lane for the calling thread instead and returns the
    /// batch, for it to send ([`Self::release`] after). Otherwise returns `None`, and in
    /// `wake` whether the lane's thread sleeps and must be woken ([`Self::wake`]).
    pub(crate) fn hand_over(
        &self,
        batches: &mut Vec<Batch>,
        short: bool,
        spare: &mut Vec<Batch>,
        wake: &mut bool,
    ) -> Option<Batch> {
        let mut s = self.state();
        spare.append(&mut s.spent);
        if short && !s.sending && s.batches.is_empty() {
            s.sending = true;
            return batches.pop();
        }
        s.batches.extend(batches.drain(..));
        *wake = s.idle && !s.sending;
        None
    }

    /// The calling thread sent the batch [`Self::hand_over`] let it keep; returns whether
    /// the lane's thread must now be woken for batches handed over meanwhile.
    pub(crate) fn release(&self) -> bool {
        let mut s = self.state();
        s.sending = false;
        s.idle && !s.batches.is_empty()
    }

    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// For the lane's thread: ends its round, if `round` (its batches, sent, are in
    /// `spent`, returned for reuse), and waits for the next batches, which it moves into
    /// `next`. `false`: the endpoint is gone and the lane empty.
    pub(crate) fn next(
        &self,
        round: bool,
        next: &mut VecDeque<Batch>,
        spent: &mut Vec<Batch>,
    ) -> bool {
        debug_assert!(next.is_empty(), "a lane's thread sends all it takes");
        let mut s = self.state();
        s.spent.append(spent);
        if round {
            s.sending = false;
        }
        loop {
            if !s.sending && !s.batches.is_empty() {
                s.sending = true;
                std::mem::swap(&mut s.batches, next);
                return true;
            }
            if s.stop && s.batches.is_empty() {
                return false;
            }
            s.idle = true;
            s = self.wake.wait(s).unwrap_or_else(|e| e.into_inner());
            s.idle = false;
        }
    }

    /// Claims the lane for the calling thread if it is free, as [`Self::hand_over`] does for
    /// a short transmission (a test holds a lane up this way).
    #[cfg(test)]
    pub(crate) fn hold(&self) -> bool {
        let mut s = self.state();
        !std::mem::replace(&mut s.sending, true)
    }

    /// Stops the lane's thread once it has sent what it holds.
    pub(crate) fn stop(&self) {
        self.state().stop = true;
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch's bytes are the same gathered from its parts as copied into its buffer: its
    /// own bytes up to each hole, then the hole's.
    #[test]
    fn a_batch_gathered_is_the_batch_filled() {
        let piece = Bytes::from_static(b"abcdefgh");
        let mut b = Batch::new();
        b.buf[..4].copy_from_slice(b"HHHH");
        b.buf[9..12].copy_from_slice(b"TTT");
        b.len = 15;
        b.pieces.push(piece.clone());
        b.holes.push(Hole {
            at: 4,
            piece: 0,
            range: 2..7,
        });
        b.holes.push(Hole {
            at: 12,
            piece: 0,
            range: 0..3,
        });
        let expected = b"HHHHcdefgTTTabc";
        let gathered: Vec<u8> = b.parts().iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(gathered, expected);
        b.fill_holes();
        assert!(!b.has_holes() && b.pieces.is_empty());
        assert_eq!(&b.buf[..b.len], expected);
    }
}
