//! Unreliable datagrams (DATAGRAM and DATAGRAM_PART frames): whole messages that travel once,
//! under each link's congestion window and pacing like stream data, striped by the same
//! scheduler, and never re-sent when congestion loses them. They suit traffic that recovers by
//! itself, such as the IP packets a tunnel carries (a second retransmission loop under inner
//! TCP only adds delay and duplicates). A link failure is not congestion: what was in flight
//! on a failed link goes once more on another, or at the heal. Both queues are bounded in
//! bytes, the receiver restores the sending order ([`HoldRule`]) and delivers each datagram
//! at most once. docs/PROTOCOL.md §5.9 gives the rules and why each is needed.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::ranges::RangeSet;
use crate::wire::{self, DatagramPart};

/// The largest datagram one packet of `datagram_size` UDP payload bytes carries: less the
/// largest SHORT header, the AEAD tag when `keyed`, and a DATAGRAM frame's type, number (up
/// to 8 bytes) and 2-byte length (datagrams stay below 16 KiB). 1426 bytes for a keyed
/// 1472-byte packet (IPv4 on a 1500-byte MTU).
pub fn datagram_capacity(datagram_size: usize, keyed: bool) -> usize {
    let tag = if keyed { crate::crypto::TAG_LEN } else { 0 };
    datagram_size.saturating_sub(wire::SHORT_HEADER_FIXED + 8 + tag + 1 + 8 + 2)
}

/// Buffers kept for reuse, so a steady flow allocates none per datagram (buffers come back
/// when the packet carrying them is acknowledged, up to a window's worth at once).
const SPARES: usize = 256;

/// Largest buffer kept for reuse: what one packet carries at most. The buffer of a datagram
/// larger than a packet is let go: kept, it would come back to hold a copy of a small
/// datagram, and a window of those in flight would hold 64 KiB each.
const MAX_SPARE_CAPACITY: usize = wire::MAX_DATAGRAM_SIZE;

/// Smallest piece a datagram too large for one packet is cut into, unless less of it is left:
/// a packet with less room left carries no piece of it (each piece costs a frame header).
const MIN_PIECE: usize = 64;

/// Frames `first..=last` in a row, of which the first is a `starts` and the last an `ends`:
/// one frame as it arrives, or pieces of one datagram held together (see [`Held`]).
#[derive(Debug, Clone, Copy)]
struct Span {
    first: u64,
    last: u64,
    starts: DatagramPart,
    ends: DatagramPart,
}

impl Span {
    fn one(seq: u64, part: DatagramPart) -> Self {
        Span {
            first: seq,
            last: seq,
            starts: part,
            ends: part,
        }
    }

    /// Whether piece `part`, numbered `seq`, continues the datagram these frames belong to.
    fn continued_by(&self, seq: u64, part: DatagramPart) -> bool {
        self.continued() == Some(seq) && matches!(part, DatagramPart::Middle | DatagramPart::Last)
    }

    /// The number of the piece that continues their datagram, if it goes on after them.
    fn continued(&self) -> Option<u64> {
        matches!(self.ends, DatagramPart::First | DatagramPart::Middle).then_some(self.last + 1)
    }
}

/// Frames that arrived ahead of a missing one, in one buffer: a piece that continues the
/// pieces held before it joins their buffer as it arrives, so a datagram whose pieces wait
/// costs one buffer and one entry, not one per piece, and is handed over without a second
/// copy when its first piece is among them.
#[derive(Debug)]
struct Held {
    span: Span,
    data: Vec<u8>,
}

/// A frame's bytes on their way to the application: still in the packet when the frame
/// arrived in order, a copy when it was held for an earlier one.
enum Payload<'a> {
    Arrived(&'a [u8]),
    Held(Vec<u8>),
}

impl Payload<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Payload::Arrived(d) => d,
            Payload::Held(d) => d,
        }
    }

    fn len(&self) -> usize {
        self.bytes().len()
    }
}

/// Datagram buffers kept for reuse (up to [`SPARES`]). A new buffer gets room for the largest
/// datagram seen so far (up to [`MAX_SPARE_CAPACITY`]): a buffer sized for a small datagram
/// (a TCP acknowledgement in a tunnel) would otherwise be reallocated when it is reused for a
/// full-sized one, and a flow of mixed sizes would allocate on every few datagrams.
#[derive(Debug, Default)]
struct Spares {
    bufs: Vec<Vec<u8>>,
    largest: usize,
}

impl Spares {
    /// A copy of `data`, in a spare buffer when one has room.
    fn copy_of(&mut self, data: &[u8]) -> Vec<u8> {
        self.note_size(data.len());
        let mut buf = match self.bufs.pop() {
            Some(buf) if buf.capacity() >= data.len() => buf,
            _ => Vec::with_capacity(self.largest.max(data.len())),
        };
        buf.clear();
        buf.extend_from_slice(data);
        buf
    }

    /// An empty buffer for the caller to fill, in place of one holding a datagram of
    /// `replaced` bytes: a spare, or a new one with room for the largest datagram seen so far.
    fn take(&mut self, replaced: usize) -> Vec<u8> {
        self.note_size(replaced);
        let mut buf = self
            .bufs
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(self.largest));
        buf.clear();
        buf
    }

    /// Remembers a datagram's size for the buffers made from now on, up to what is kept.
    fn note_size(&mut self, len: usize) {
        self.largest = self.largest.max(len.min(MAX_SPARE_CAPACITY));
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        if self.bufs.len() < SPARES && (1..=MAX_SPARE_CAPACITY).contains(&buf.capacity()) {
            self.bufs.push(buf);
        }
    }
}

/// What one DATAGRAM or DATAGRAM_PART frame carries: a whole datagram or a piece of one, with
/// its number. A sent packet keeps it until the packet is acknowledged, so that it can go
/// again, unchanged, if the packet's link fails. A piece shares its datagram's buffer (no
/// copy), which is freed when the last packet holding a piece of it lets go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    pub seq: u64,
    pub part: DatagramPart,
    pub data: Bytes,
}

impl Piece {
    /// Writes its frame into `w`, which has `room` bytes left for frames, as
    /// [`OutgoingDatagrams::pop`] made sure it fits: with its length if that fits, else (a
    /// piece) running to the packet's end, behind padding when it is shorter than the room
    /// (a piece sent again may have been cut for a packet with less room).
    pub fn write(&self, w: &mut wire::Writer<'_>, room: usize) {
        let len = self.data.len();
        let to_end =
            self.part != DatagramPart::Whole && wire::datagram_frame_len(self.seq, len) > room;
        if to_end {
            w.zeros(room - wire::datagram_frame_len_to_end(self.seq, len));
        }
        wire::write_datagram(w, self.seq, self.part, &self.data, to_end);
    }
}

/// A datagram waiting to be sent.
#[derive(Debug)]
struct Waiting {
    /// When it was queued.
    since: Instant,
    /// Set when it goes again after a link failure: a whole datagram or a piece, which keeps
    /// its number and its place in its datagram.
    again: Option<(u64, DatagramPart)>,
    /// Sent whatever its age: stranded by a link failure, waiting when the queue stood still
    /// (see [`OutgoingDatagrams::drop_stale`]), or partly sent already.
    kept: bool,
    /// Of a datagram sent in pieces: the bytes already sent.
    sent_bytes: usize,
    data: Bytes,
}

/// Datagrams waiting to be sent.
///
/// A datagram larger than what one packet carries on every link ([`Bounds::unsplit`]) goes in
/// pieces, each cut to the room left in the packet being built, in DATAGRAM_PART frames
/// numbered in order; a piece that fills its packet goes without a length field. The packets
/// carrying it are then full, and the next datagram starts in the room the last piece leaves.
/// No piece is larger than an empty packet of the smallest link carries ([`Bounds::piece_room`]),
/// so that one sent again after a link failure fits any link.
#[derive(Debug)]
pub(crate) struct OutgoingDatagrams {
    /// Oldest first.
    queue: VecDeque<Waiting>,
    /// What the queue holds, each datagram (or piece) counted with [`DATAGRAM_OVERHEAD`]:
    /// counted by their bytes alone, empty datagrams would grow it without bound while the
    /// links stall. What `limit` bounds.
    bytes: usize,
    limit: usize,
    max_age: Duration,
    /// When a datagram last left the queue.
    last_sent: Option<Instant>,
    spares: Spares,
    /// DATAGRAM and DATAGRAM_PART frames sent so far: the next one's number.
    next_seq: u64,
    /// Datagrams sent, whole or in all their pieces.
    pub sent: u64,
    /// Datagrams and pieces sent again because the link carrying them failed.
    pub resent: u64,
    /// Dropped unsent: the queue was full, or they waited too long; or sent, and dropped
    /// when they came back from a failed link (once per datagram, not per piece).
    pub dropped: u64,
    /// The number of the last frame dropped after it came back from a failed link.
    last_piece_dropped: Option<u64>,
}

impl OutgoingDatagrams {
    pub fn new(limit: usize, max_age: Duration) -> Self {
        Self {
            queue: VecDeque::new(),
            bytes: 0,
            limit,
            max_age,
            last_sent: None,
            spares: Spares::default(),
            next_seq: 0,
            sent: 0,
            resent: 0,
            dropped: 0,
            last_piece_dropped: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Datagrams waiting to be sent (one partly sent counts), and their bytes not sent yet.
    pub fn queued(&self) -> (usize, u64) {
        let bytes = (self.queue.iter())
            .map(|w| (w.data.len() - w.sent_bytes) as u64)
            .sum();
        (self.queue.len(), bytes)
    }

    /// Whether it holds more than half its bound.
    pub fn over_half(&self) -> bool {
        self.bytes > self.limit / 2
    }

    /// How long a datagram may wait while the queue moves (see [`Self::drop_stale`]).
    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    /// Queues a copy of `data`, dropping the oldest datagrams if the queue would exceed its
    /// bound. The caller checked that `data` is at most [`wire::MAX_DATAGRAM_LEN`] bytes.
    pub fn push(&mut self, now: Instant, data: &[u8]) {
        let buf = self.spares.copy_of(data);
        self.enqueue(now, Bytes::from(buf));
    }

    /// Queues the datagram in `buf` itself, without a copy, and leaves an empty buffer in its
    /// place (a spare one, emptied), for the caller's next datagram.
    pub fn push_owned(&mut self, now: Instant, buf: &mut Vec<u8>) {
        let next = self.spares.take(buf.len());
        let data = std::mem::replace(buf, next);
        self.enqueue(now, Bytes::from(data));
    }

    fn enqueue(&mut self, now: Instant, buf: Bytes) {
        self.make_room(buf.len() + DATAGRAM_OVERHEAD);
        self.bytes += buf.len() + DATAGRAM_OVERHEAD;
        self.queue.push_back(Waiting {
            since: now,
            again: None,
            kept: false,
            sent_bytes: 0,
            data: buf,
        });
    }

    /// Queues again, ahead of the others, what was in flight on a failed link (`stranded`, in
    /// sending order), each with its number and place.
    pub fn requeue(&mut self, now: Instant, stranded: &mut Vec<Piece>) {
        tracing::debug!(
            count = stranded.len(),
            first = stranded.first().map(|s| s.seq),
            "datagrams stranded on a failed link queued again"
        );
        for piece in stranded.drain(..).rev() {
            self.bytes += piece.data.len() + DATAGRAM_OVERHEAD;
            self.queue.push_front(Waiting {
                since: now,
                again: Some((piece.seq, piece.part)),
                kept: true,
                sent_bytes: 0,
                data: piece.data,
            });
        }
        self.make_room(0);
    }

    /// Drops the oldest datagrams until `extra` more bytes fit the bound. One partly sent
    /// stays, and the one behind it goes: dropping its rest would waste the pieces that went
    /// and leave the receiver a datagram it can never complete. (So the queue may hold the
    /// rest of that one datagram beyond the bound.)
    fn make_room(&mut self, extra: usize) {
        while self.bytes + extra > self.limit {
            let partly_sent = (self.queue.front()).is_some_and(|w| w.sent_bytes > 0);
            let at = usize::from(partly_sent);
            if at >= self.queue.len() {
                break;
            }
            self.drop_at(at, "send queue full");
        }
    }

    /// Drops the datagrams that waited longer than the maximum age while the queue moved, up
    /// to the first one kept whatever its age:
    /// - one sent again after a link failure: it was sent in time once;
    /// - one that was waiting when the queue stood still: the links carried nothing then, so
    ///   its wait was no queueing delay, and it holds what the flow inside sent last (inner
    ///   TCP's retransmissions during an outage);
    /// - one partly sent: dropping its rest would waste the pieces that went.
    ///
    /// After an outage the links' windows open from small again, so draining what waited can
    /// take longer than the age allowed; dropping its tail would lose what the failure is meant
    /// to hide (only the queue's bound drops these). With only the re-sent ones exempt, a
    /// drain longer than the age dropped inner TCP's last retransmission behind them, and after
    /// a long outage the flow would then stand still until its next, backed-off, timeout.
    ///
    /// A queue that stands still drops nothing for age. A datagram waiting behind links that
    /// have just failed is not stale: dropping it before the failure is detected (tens of
    /// milliseconds) loses the flow's last data, which only reaches the peer at the heal if it
    /// is kept.
    pub fn drop_stale(&mut self, now: Instant) {
        if !self.is_moving(now) {
            return;
        }
        while self
            .queue
            .front()
            .is_some_and(|w| !w.kept && now.saturating_duration_since(w.since) > self.max_age)
        {
            self.drop_front("waited too long");
        }
    }

    /// Whether a datagram left the queue within the last half of the maximum age. Datagrams
    /// leave many times per millisecond on a loaded link; a pause of half the age means the
    /// links stopped carrying them.
    fn is_moving(&self, now: Instant) -> bool {
        self.last_sent
            .is_some_and(|t| now.saturating_duration_since(t) <= self.max_age / 2)
    }

    /// The least room the next frame needs: the whole next datagram's frame, or, for one that
    /// goes in pieces, a frame with its smallest piece.
    pub fn front_frame_len(&self, bounds: Bounds) -> Option<usize> {
        let w = self.queue.front()?;
        Some(match w.again {
            Some((seq, DatagramPart::Whole)) => wire::datagram_frame_len(seq, w.data.len()),
            Some((seq, _)) => wire::datagram_frame_len_to_end(seq, w.data.len()),
            None if w.sent_bytes == 0 && w.data.len() <= bounds.unsplit => {
                wire::datagram_frame_len(self.next_seq, w.data.len())
            }
            None => {
                let smallest = MIN_PIECE.min(w.data.len() - w.sent_bytes);
                piece_header_len(self.next_seq) + smallest
            }
        })
    }

    /// Takes the next frame's content, if it fits in `room` bytes: the next datagram whole,
    /// or the next piece of one larger than `bounds.unsplit`, cut to the room (it fills the
    /// room exactly when it can, in a frame without a length). Numbers go to frames as they
    /// are first sent, so a datagram dropped unsent leaves no gap for the receiver to wait on.
    /// Hand the buffer back with [`Self::recycle`] once the packet carrying it is
    /// acknowledged.
    pub fn pop(&mut self, now: Instant, room: usize, bounds: Bounds) -> Option<Piece> {
        let w = self.queue.front()?;
        let piece = match w.again {
            Some((seq, part)) => {
                let len = w.data.len();
                let whole = part == DatagramPart::Whole;
                // what an empty packet of the smallest link must take: a whole datagram with
                // its length, a piece running to the packet's end (behind padding if it is
                // shorter than the room)
                let least = if whole {
                    wire::datagram_frame_len(seq, len)
                } else {
                    wire::datagram_frame_len_to_end(seq, len)
                };
                if least > bounds.piece_room {
                    // made for packets that no longer come: a piece cut for packet numbers of
                    // 4 bytes (a link passed 2^30 packets meanwhile), a datagram sent whole
                    // before a link with smaller packets joined. Its datagram is lost; kept,
                    // it would stand at the head of the queue for ever.
                    self.drop_front("sent again, no longer fits a packet");
                    return self.pop(now, room, bounds);
                }
                if least > room {
                    return None;
                }
                let w = self.pop_front();
                self.resent += 1;
                Piece {
                    seq,
                    part,
                    data: w.data,
                }
            }
            None if w.sent_bytes == 0 && w.data.len() <= bounds.unsplit => {
                let len = wire::datagram_frame_len(self.next_seq, w.data.len());
                if len > room {
                    return None;
                }
                let w = self.pop_front();
                Piece {
                    seq: self.number(DatagramPart::Whole),
                    part: DatagramPart::Whole,
                    data: w.data,
                }
            }
            None => {
                let left = w.data.len() - w.sent_bytes;
                // a first piece leaves some for a last one: one that took all would leave its
                // datagram at the head of the queue with nothing left to send, and the
                // receiver waiting for a last piece that never comes
                let most = if w.sent_bytes == 0 { left - 1 } else { left };
                let header = wire::datagram_frame_len_to_end(self.next_seq, 0);
                let most = most.min(bounds.piece_room.saturating_sub(header));
                // a piece fills the packet if it can, in a frame without a length; else it
                // goes with its length
                let to_end = room.saturating_sub(header);
                let n = if to_end <= most {
                    to_end
                } else {
                    most.min(room.saturating_sub(piece_header_len(self.next_seq)))
                };
                if n < left.min(MIN_PIECE) || n == 0 {
                    return None;
                }
                let part = if w.sent_bytes == 0 {
                    DatagramPart::First
                } else if n == left {
                    DatagramPart::Last
                } else {
                    DatagramPart::Middle
                };
                let from = w.sent_bytes;
                let data = w.data.slice(from..from + n);
                if part == DatagramPart::Last {
                    // its memory goes when the last packet holding a piece of it lets go
                    self.pop_front();
                } else {
                    let w = self.queue.front_mut().expect("the front datagram");
                    w.sent_bytes += n;
                    w.kept = true;
                }
                Piece {
                    seq: self.number(part),
                    part,
                    data,
                }
            }
        };
        if !self.is_moving(now) {
            // moving again after standing still: what waited through it goes whatever its age
            for waiting in &mut self.queue {
                waiting.kept = true;
            }
        }
        self.last_sent = Some(now);
        Some(piece)
    }

    /// The next frame's number; `part` counts a datagram sent when it is the last of it.
    fn number(&mut self, part: DatagramPart) -> u64 {
        if matches!(part, DatagramPart::Whole | DatagramPart::Last) {
            self.sent += 1;
        }
        self.next_seq += 1;
        self.next_seq - 1
    }

    fn pop_front(&mut self) -> Waiting {
        let w = self.queue.pop_front().expect("a datagram is queued");
        self.bytes -= w.data.len() + DATAGRAM_OVERHEAD;
        w
    }

    /// Keeps the memory of a datagram (or piece) done with, if nothing else holds it and it
    /// is small enough to keep: the last piece of a large datagram is let go as it is (made a
    /// `Vec`, its bytes would first move to the start of the datagram's buffer).
    pub fn recycle(&mut self, data: Bytes) {
        if let Ok(buf) = data.try_into_mut() {
            if buf.capacity() <= MAX_SPARE_CAPACITY {
                self.spares.recycle(buf.into());
            }
        }
    }

    /// Drops every datagram queued (counted as dropped unsent).
    pub fn drop_all(&mut self, reason: &'static str) {
        while !self.queue.is_empty() {
            self.drop_front(reason);
        }
    }

    fn drop_front(&mut self, reason: &'static str) {
        self.drop_at(0, reason);
    }

    /// Drops the datagram (or piece) at place `at` of the queue, if there is one.
    fn drop_at(&mut self, at: usize, reason: &'static str) {
        let Some(w) = self.queue.remove(at) else {
            return;
        };
        self.bytes -= w.data.len() + DATAGRAM_OVERHEAD;
        tracing::trace!(
            reason,
            len = w.data.len(),
            resent = w.again.is_some(),
            queued = self.bytes,
            "datagram dropped unsent"
        );
        // a datagram counts once, however many of its pieces stranded on a failed link are
        // dropped: those after the first follow it in the queue, numbered on
        let continues = match w.again {
            Some((seq, DatagramPart::Middle | DatagramPart::Last)) => {
                self.last_piece_dropped == Some(seq.wrapping_sub(1))
            }
            _ => false,
        };
        self.last_piece_dropped = w.again.map(|(seq, _)| seq);
        if !continues {
            self.dropped += 1;
        }
        self.recycle(w.data);
    }
}

/// What decides how a datagram is sent: whole or in pieces, and how large a piece may be.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// Largest datagram sent whole: what one packet carries on every link, whatever its
    /// packet and datagram numbers ([`datagram_capacity`]).
    pub unsplit: usize,
    /// Room for frames in an empty data packet of the smallest link: no piece's frame (without
    /// its length) is larger.
    pub piece_room: usize,
}

/// Bytes a DATAGRAM_PART frame numbered `seq` with a length takes besides its piece (pieces are
/// below 16 KiB, so their length takes 2 bytes at most).
fn piece_header_len(seq: u64) -> usize {
    wire::datagram_frame_len(seq, 0) + 1
}

/// How long a datagram that arrived ahead of a missing one is held for it.
///
/// Normally `base`. But each link delivers in sending order, so the missing datagrams may
/// still be in flight on a link that has not delivered anything sent after them. If that link
/// has just failed they are stranded on it: the sender sends them again over another link
/// once it has declared the failure, up to the link's `failure_wait` after the link's last
/// delivery. The hold lasts that long. A link that delivers a later datagram, or one whose
/// last delivery is older than its `failure_wait`, is not waited for. A repair goes in
/// sending order too, possibly over several round trips of a slow link: while the last
/// datagram a link delivered below its largest number (one sent again) is below the first
/// missing one, and nothing sent after the repair has come on that link, the hold also lasts
/// until that arrival plus the link's `failure_wait`.
///
/// Every link can fail before the missing ones come again: sent again over a link that died
/// too, they come only at the heal. A hold that runs out while every link is failing, or
/// while the peer is silent and does not answer PINGs, is therefore not acted on (the
/// connection waits for the peer to be heard again, see `HoldOver`), and then the datagrams
/// held before that moment wait `resumed`'s time from it: the peer's links come back after a
/// few probes, and what was stranded on them comes first.
#[derive(Debug, Clone, Default)]
pub(crate) struct HoldRule {
    pub base: Duration,
    /// Per link: how long its failure takes to repair.
    pub failure_waits: smallvec::SmallVec<[Duration; crate::MAX_LINKS]>,
    /// When the peer was heard again after an outage of every link, or answered the PINGs
    /// of a hold that ran out while it was silent, and how long datagrams held before then
    /// still wait.
    pub resumed: Option<(Instant, Duration)>,
}

/// The datagrams one link has delivered.
#[derive(Debug, Clone, Copy, Default)]
struct LinkDeliveries {
    /// The largest datagram number it delivered.
    largest: Option<u64>,
    /// When it last delivered a datagram.
    last: Option<Instant>,
    /// The last datagram it delivered below its largest, and when: one sent again after
    /// another link failed (a link delivers what is sent on it for the first time in order).
    /// Cleared when a datagram sent after them arrives.
    last_resent: Option<(u64, Instant)>,
}

/// What a received datagram costs beyond its buffer's capacity, as the receive limit counts
/// it: its place in a queue and the allocator's bookkeeping. Empty datagrams cost memory
/// too: counted by their bytes alone, a peer sending them could grow the queue without end.
const DATAGRAM_OVERHEAD: usize = 64;

/// The memory datagram buffer `d` holds, as the receive limit counts it: its capacity (a
/// copy may get a larger buffer than its bytes, for reuse), and [`DATAGRAM_OVERHEAD`].
fn charge(d: &Vec<u8>) -> usize {
    d.capacity() + DATAGRAM_OVERHEAD
}

/// How many runs of given-up datagram numbers the receiver remembers, so that one arriving
/// late (sent again after a link failure) is still delivered once and a second copy is not.
/// A run costs the same however many numbers it holds: a peer's jump of the numbers costs
/// one, and so does each late arrival inside a run.
const SKIPPED_RUNS: usize = 4096;

/// Entries of [`IncomingDatagrams::held_since`] for datagrams delivered already that may
/// wait behind a held one before they are dropped (besides twice the held ones).
const HELD_SINCE_SLACK: usize = 64;

/// How long the pieces of a datagram that lost others to a hold that ran out wait for them
/// (see [`Unfinished`]), on the arrival clock: the sender sends the pieces stranded on a
/// failed link again once it has declared the failure, `failure_ptos` of that link's probe
/// timeouts after the loss, which may be longer than the receiver's hold reckoned.
const UNFINISHED_PATIENCE: Duration = Duration::from_secs(1);

/// The most the arrival clock moves from one arrival to the next. A silence (every link down
/// until a heal minutes later) ages the unfinished datagrams by this much only: what was
/// stranded comes first at the heal, and must find the rest of its datagram still there.
const ARRIVAL_CLOCK_STEP: Duration = Duration::from_millis(100);

/// Pieces of a datagram whose other pieces were given up on when a hold ran out, kept in
/// case those come after all: pieces in flight on a link that failed come again once the
/// sender has declared it down, and that can be later than the hold waited (the sender's
/// probe timeout, or its host, slower than the receiver reckoned), or only at the heal of an
/// outage. A datagram completed so is delivered late, as a whole one that arrives after it
/// was given up on is. Else it is let go after [`UNFINISHED_PATIENCE`], or sooner for room.
#[derive(Debug)]
struct Unfinished {
    pieces: Held,
    /// The arrival clock when a piece last joined them.
    touched: Duration,
}

/// Datagrams received and not yet read, and those held until the ones before them arrive.
///
/// The pieces of a datagram sent in pieces are joined as they are delivered in order, so a
/// datagram is handed over whole or not at all. One that lost a piece to a hold that ran out
/// keeps the pieces it has for a while ([`Unfinished`]): the missing one may come late, sent
/// again after a link failure, and complete it. (Without a hold, frames are delivered as they
/// arrive, and pieces that come after their successors wait so too.)
#[derive(Debug)]
pub(crate) struct IncomingDatagrams {
    /// In order, for the application.
    ready: VecDeque<Vec<u8>>,
    /// Arrived ahead of a missing one: the number of the first frame held together -> them.
    held: BTreeMap<u64, Held>,
    /// The datagram whose pieces are being joined: its pieces so far.
    joining: Option<Held>,
    /// The number the next piece of a datagram dropped for the limit (and counted then)
    /// carries: that piece is dropped too when it comes. Only that number: a piece after a
    /// gap may belong to the next datagram, whose first piece came late or was given up on.
    orphaned: Option<u64>,
    /// Pieces of datagrams that lost others to a hold, by their first number (see
    /// [`Unfinished`]).
    unfinished: BTreeMap<u64, Unfinished>,
    /// Time that passes while frames arrive (at most [`ARRIVAL_CLOCK_STEP`] from one arrival
    /// to the next), and the last arrival: what [`Unfinished`] pieces wait in.
    arrival_clock: Duration,
    last_arrival: Option<Instant>,
    /// The number that would continue the datagram of the unfinished pieces let go last,
    /// where they did not end it (moved on by its orphans, see [`Self::takes_orphan`]):
    /// pieces let go next that do not start a datagram, and start there or after numbers
    /// that all never came, are its rest (counted with it).
    let_go_open: Option<u64>,
    /// The largest datagram joined so far: the room a new one starts with.
    largest_joined: usize,
    /// When each held datagram arrived, in arrival order, so the one held longest is at the
    /// front (entries of datagrams delivered since are dropped when they reach the front, or
    /// when they outnumber the held ones; see [`Self::release_in_order`]).
    held_since: VecDeque<(Instant, u64)>,
    /// Per link, what it delivered: where the missing ones may still be in flight.
    links: smallvec::SmallVec<[LinkDeliveries; crate::MAX_LINKS]>,
    /// Numbers below `next` given up on and not arrived since (the newest `SKIPPED_RUNS`
    /// runs of them): the only ones below `next` still delivered.
    skipped: RangeSet,
    /// Numbers above `next` of whole datagrams dropped for the limit as they arrived, counted
    /// then (the newest `SKIPPED_RUNS` runs of them): `next` passes them as delivered ones,
    /// not given up on, so a second copy is a duplicate, as for one dropped in order.
    dropped_ahead: RangeSet,
    /// Memory `ready`, `held`, `joining` and `unfinished` hold: each buffer's capacity and
    /// [`DATAGRAM_OVERHEAD`] (see [`charge`]). What `limit` bounds.
    bytes: usize,
    limit: usize,
    /// The number of the next datagram to deliver.
    next: u64,
    /// Longest a datagram is held for a missing one (zero: delivered as they arrive).
    hold: Duration,
    /// Datagrams received, whole or in part (those handed over plus those dropped), counted
    /// once their fate is known: an unfinished one counts when it is completed or let go.
    pub received: u64,
    /// Dropped on arrival (the application had not read enough of the earlier ones), or
    /// incomplete (a piece of it was lost, and not sent again in time).
    pub dropped: u64,
    /// Datagrams that arrived ahead of a missing one.
    pub reordered: u64,
    /// Second copies (of datagrams sent again after a link failure), not delivered.
    pub duplicates: u64,
    /// Buffers the application handed back (see [`Self::pop_into`]), for the next arrivals.
    spares: Spares,
}

impl IncomingDatagrams {
    pub fn new(limit: usize, hold: Duration) -> Self {
        Self {
            ready: VecDeque::new(),
            held: BTreeMap::new(),
            joining: None,
            orphaned: None,
            unfinished: BTreeMap::new(),
            arrival_clock: Duration::ZERO,
            last_arrival: None,
            let_go_open: None,
            largest_joined: 0,
            held_since: VecDeque::new(),
            links: smallvec::SmallVec::new(),
            skipped: RangeSet::new(),
            dropped_ahead: RangeSet::new(),
            bytes: 0,
            limit,
            next: 0,
            hold,
            received: 0,
            dropped: 0,
            reordered: 0,
            duplicates: 0,
            spares: Spares::default(),
        }
    }

    fn copy_of(&mut self, data: &[u8]) -> Vec<u8> {
        self.spares.copy_of(data)
    }

    /// Keeps `buf`'s memory for a later arrival (up to [`SPARES`] buffers).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        self.spares.recycle(buf);
    }

    /// Takes a copy of whole datagram `seq`, arrived `now` on link `link`; returns whether
    /// datagrams became ready for the application.
    #[cfg(test)]
    pub fn push(&mut self, now: Instant, link: usize, seq: u64, data: &[u8]) -> bool {
        self.push_piece(now, link, seq, DatagramPart::Whole, data)
    }

    /// Takes a copy of frame `seq` (a whole datagram or a piece of one), arrived `now` on
    /// link `link`; returns whether datagrams became ready for the application.
    pub fn push_piece(
        &mut self,
        now: Instant,
        link: usize,
        seq: u64,
        part: DatagramPart,
        data: &[u8],
    ) -> bool {
        self.tick(now);
        if self.links.len() <= link {
            self.links.resize(link + 1, LinkDeliveries::default());
        }
        let l = &mut self.links[link];
        match l.largest {
            Some(n) if seq < n => l.last_resent = Some((seq, now)),
            // sent after what came again on this link: that repair is over
            Some(n) if seq > n => l.last_resent = None,
            _ => {}
        }
        l.largest = l.largest.max(Some(seq));
        l.last = Some(now);
        let new = if seq < self.next {
            let late = self.skipped.contains(seq);
            if late {
                self.forget_skipped(seq);
                tracing::debug!(seq, next = self.next, "datagram given up on arrived late");
            }
            late
        } else {
            !self.held_covers(seq) && !self.dropped_ahead.contains(seq)
        };
        if !new {
            self.duplicates += 1;
            return false;
        }
        if seq < self.next && self.takes_orphan(seq, part) {
            return false;
        }
        let before = self.ready.len();
        // delivered now (in order, or without a hold), a frame that does not continue the
        // datagram being joined ends it: that one lost its next piece, and waits as
        // unfinished, which room is made from first (else it took room until a datagram
        // started with room enough for it)
        let delivered_now = seq == self.next || (seq > self.next && self.hold.is_zero());
        if delivered_now && !(self.joining.as_ref()).is_some_and(|j| j.span.continued_by(seq, part))
        {
            self.keep_joining();
        }
        // what it will cost at least (its copy may get a larger buffer); a piece that
        // continues the datagram being joined costs only what does not fit the room that
        // datagram was charged for already
        let cost = |r: &Self| match &r.joining {
            Some(j) if delivered_now && j.span.continued_by(seq, part) => {
                (j.data.len() + data.len()).saturating_sub(j.data.capacity())
            }
            _ => data.len() + DATAGRAM_OVERHEAD,
        };
        if self.bytes + cost(self) > self.limit {
            // make room: by letting go of unfinished datagrams, then by giving up on the
            // missing ones the held datagrams wait for, and last on the rest of the datagram
            // being joined (which then waits as unfinished, and is let go next)
            while self.bytes + cost(self) > self.limit
                && (self.let_go_unfinished()
                    || self.release_first_held()
                    || self.joining.is_some() && {
                        self.keep_joining();
                        true
                    })
            {}
            if seq < self.next {
                // given up on by that, with the held ones before which it was missing: it
                // arrived late, once
                self.forget_skipped(seq);
            }
            if self.bytes + cost(self) > self.limit {
                if part == DatagramPart::Whole {
                    self.count_dropped();
                    if seq > self.next {
                        self.dropped_ahead.insert(seq..seq + 1);
                        self.dropped_ahead.keep_highest(SKIPPED_RUNS);
                    }
                } else if seq == self.next {
                    self.lose_piece(Span::one(seq, part));
                }
                // (a piece held ahead is counted when its datagram turns out incomplete)
                if seq == self.next {
                    // it came: nothing is missing here
                    self.next += 1;
                    self.release_in_order();
                }
                return self.ready.len() > before;
            }
        }
        if seq > self.next && !self.hold.is_zero() {
            self.reordered += 1;
            self.hold_frame(now, seq, part, data);
            return self.ready.len() > before;
        }
        if seq < self.next {
            // making room may have let go of the pieces before it
            if self.takes_orphan(seq, part) {
                return self.ready.len() > before;
            }
            // arrived after it was given up on: late, but delivered (dropping it would not
            // make it any less late), or its datagram's unfinished pieces joined by it
            let copy = self.owned(Payload::Arrived(data));
            if part == DatagramPart::Whole {
                self.received += 1;
                self.ready.push_back(copy);
            } else {
                self.keep_unfinished(Span::one(seq, part), copy);
            }
        } else {
            self.skip_to(seq);
            self.deliver(Span::one(seq, part), Payload::Arrived(data));
            self.next = seq + 1;
            self.release_in_order();
        }
        self.ready.len() > before
    }

    /// Whether piece `seq` is the next of a datagram let go of (dropped for the limit, or its
    /// unfinished pieces let go) and counted then: it goes too, and the piece after it is
    /// the next such.
    fn takes_orphan(&mut self, seq: u64, part: DatagramPart) -> bool {
        let orphan =
            self.orphaned == Some(seq) && matches!(part, DatagramPart::Middle | DatagramPart::Last);
        if orphan {
            self.orphaned = Span::one(seq, part).continued();
            if self.let_go_open == Some(seq) {
                // the datagram let go goes on after it
                self.let_go_open = self.orphaned;
            }
        }
        orphan
    }

    /// Whether frame `seq`, ahead of the next one, is held already.
    fn held_covers(&self, seq: u64) -> bool {
        (self.held.range(..=seq).next_back()).is_some_and(|(_, h)| h.span.last >= seq)
    }

    /// Holds frame `seq`, arrived `now` ahead of a missing one: with the frames held right
    /// before it when it continues their datagram, else on its own.
    fn hold_frame(&mut self, now: Instant, seq: u64, part: DatagramPart, data: &[u8]) {
        let left = self.limit.saturating_sub(self.bytes);
        let room = self.largest_joined.min(left);
        if let Some((_, h)) = self.held.range_mut(..seq).next_back() {
            let len = h.data.len() + data.len();
            if h.span.continued_by(seq, part) && len <= wire::MAX_DATAGRAM_LEN {
                let before = charge(&h.data);
                if h.data.capacity() < len {
                    // its pieces come in a row: room for as large a datagram as joined so far
                    h.data.reserve_exact(room.max(len) - h.data.len());
                }
                h.data.extend_from_slice(data);
                (h.span.last, h.span.ends) = (seq, part);
                self.bytes += charge(&h.data) - before;
                return;
            }
        }
        let data = self.copy_of(data);
        self.bytes += charge(&data);
        let span = Span::one(seq, part);
        self.held.insert(seq, Held { span, data });
        self.held_since.push_back((now, seq));
    }

    /// Hands frames `span`, the next in order, to the application: a whole datagram at once,
    /// pieces to the datagram being joined (copied there straight from the packet when they
    /// arrived in order; held pieces that start a datagram become its buffer). Pieces that
    /// cannot join it because one before them was given up on wait as [`Unfinished`].
    fn deliver(&mut self, span: Span, data: Payload<'_>) {
        if matches!(span.starts, DatagramPart::Whole | DatagramPart::First) {
            // a new datagram: one still being joined lost its end to a hold
            self.keep_joining();
        }
        match span.starts {
            DatagramPart::Whole => {
                let data = self.owned(data);
                self.received += 1;
                self.ready.push_back(data);
                return;
            }
            DatagramPart::First => {
                // room for the whole, as large as the largest joined so far, as far as the
                // limit leaves room (the room is charged for at once)
                let left = self.limit.saturating_sub(self.bytes + DATAGRAM_OVERHEAD);
                let room = self.largest_joined.min(left).max(data.len());
                let data = match data {
                    Payload::Held(mut d) => {
                        self.bytes -= charge(&d);
                        d.reserve_exact(room - d.len());
                        self.bytes += charge(&d);
                        d
                    }
                    Payload::Arrived(d) => {
                        let mut joined = Vec::with_capacity(room);
                        joined.extend_from_slice(d);
                        self.bytes += charge(&joined);
                        joined
                    }
                };
                self.joining = Some(Held { span, data });
            }
            DatagramPart::Middle | DatagramPart::Last => {
                let continues = self.joining.as_ref().is_some_and(|j| {
                    j.span.continued_by(span.first, span.starts)
                        && j.data.len() + data.len() <= wire::MAX_DATAGRAM_LEN
                });
                if continues {
                    let left = self.limit.saturating_sub(self.bytes);
                    let j = self.joining.as_mut().expect("a datagram being joined");
                    (j.span.last, j.span.ends) = (span.last, span.ends);
                    let before = charge(&j.data);
                    let needed = j.data.len() + data.bytes().len();
                    if j.data.capacity() < needed {
                        // doubled as a Vec grows, but only as far as the limit leaves room:
                        // charged by its capacity, a datagram that fits would else go over
                        // the limit, and be dropped at its next piece
                        let cap = j.data.capacity();
                        let grown = (2 * cap).min(cap + left).max(needed);
                        j.data.reserve_exact(grown - j.data.len());
                    }
                    j.data.extend_from_slice(data.bytes());
                    self.bytes += charge(&j.data) - before;
                    self.free(data);
                } else if self.orphaned == Some(span.first) {
                    // its datagram lost a piece for the limit, and was counted then
                    self.orphaned = span.continued();
                    self.free(data);
                    return;
                } else {
                    // a piece before them was given up on
                    self.keep_joining();
                    let data = self.owned(data);
                    self.keep_unfinished(span, data);
                    return;
                }
            }
        }
        if span.ends == DatagramPart::Last {
            let joined = self.joining.take().expect("a datagram being joined");
            self.hand_over_joined(joined.data);
        }
    }

    /// A frame's bytes in a buffer of their own, charged.
    fn owned(&mut self, data: Payload<'_>) -> Vec<u8> {
        match data {
            Payload::Held(d) => d,
            Payload::Arrived(d) => {
                let copy = self.copy_of(d);
                self.bytes += charge(&copy);
                copy
            }
        }
    }

    /// Lets go of a frame's bytes, done with: a held buffer is uncharged and kept for reuse.
    fn free(&mut self, data: Payload<'_>) {
        if let Payload::Held(d) = data {
            self.bytes -= charge(&d);
            self.recycle(d);
        }
    }

    /// Hands a datagram joined from its pieces to the application.
    fn hand_over_joined(&mut self, mut joined: Vec<u8>) {
        self.largest_joined = self.largest_joined.max(joined.len());
        if joined.capacity() > joined.len() {
            // joined in room for the largest datagram so far, it gives back what it does
            // not use: else each one waiting for the reader would cost, against the limit,
            // as much as the largest
            let before = charge(&joined);
            joined.shrink_to_fit();
            self.bytes -= before - charge(&joined);
        }
        self.received += 1;
        self.ready.push_back(joined);
    }

    fn count_dropped(&mut self) {
        self.received += 1;
        self.dropped += 1;
    }

    /// Pieces `span` of a datagram, next in order, are dropped for the limit: the datagram
    /// counts as dropped once, with the part joined so far, or with its first piece that
    /// arrives orphaned; its later pieces are then orphans counted already.
    fn lose_piece(&mut self, span: Span) {
        let joined_some = self.joining.is_some();
        self.drop_joining();
        if span.starts == DatagramPart::First || (!joined_some && self.orphaned != Some(span.first))
        {
            self.count_dropped();
        }
        self.orphaned = span.continued();
    }

    /// Drops the datagram being joined: a piece of it was dropped for the limit.
    fn drop_joining(&mut self) {
        if let Some(Held { span, data }) = self.joining.take() {
            tracing::debug!(
                last = span.last,
                len = data.len(),
                "incomplete datagram dropped"
            );
            self.bytes -= charge(&data);
            self.count_dropped();
            self.recycle(data);
        }
    }

    /// The datagram being joined lost its next piece to a hold: what it has waits as
    /// [`Unfinished`].
    fn keep_joining(&mut self) {
        if let Some(Held { span, data }) = self.joining.take() {
            self.keep_unfinished(span, data);
        }
    }

    /// Keeps pieces `span` (`data`, charged already) of a datagram that lost others to a
    /// hold, joined to the unfinished pieces right before and after them; a datagram they
    /// complete is handed over.
    fn keep_unfinished(&mut self, span: Span, data: Vec<u8>) {
        let mut pieces = Held { span, data };
        let joins = |a: &Held, b: &Held| {
            a.span.continued_by(b.span.first, b.span.starts)
                && a.data.len() + b.data.len() <= wire::MAX_DATAGRAM_LEN
        };
        if let Some((&first, u)) = self.unfinished.range(..span.first).next_back() {
            if joins(&u.pieces, &pieces) {
                let before = self.unfinished.remove(&first).expect("just seen");
                pieces = self.join(before.pieces, pieces);
            }
        }
        if let Some(u) = self.unfinished.get(&(pieces.span.last + 1)) {
            if joins(&pieces, &u.pieces) {
                let after = self.unfinished.remove(&(pieces.span.last + 1));
                pieces = self.join(pieces, after.expect("just seen").pieces);
            }
        }
        let Span { first, last, .. } = pieces.span;
        if pieces.span.starts == DatagramPart::First && pieces.span.ends == DatagramPart::Last {
            tracing::debug!(first, last, "datagram completed by pieces that came late");
            self.hand_over_joined(pieces.data);
            return;
        }
        let touched = self.arrival_clock;
        self.unfinished
            .insert(first, Unfinished { pieces, touched });
    }

    /// Pieces `b` appended to pieces `a`, which they continue.
    fn join(&mut self, mut a: Held, b: Held) -> Held {
        let before = charge(&a.data) + charge(&b.data);
        a.data.reserve_exact(b.data.len());
        a.data.extend_from_slice(&b.data);
        self.bytes = self.bytes - before + charge(&a.data);
        (a.span.last, a.span.ends) = (b.span.last, b.span.ends);
        self.recycle(b.data);
        a
    }

    /// Lets go of the unfinished pieces numbered lowest; false if none wait. Their datagram
    /// counts as dropped, once: pieces that do not start a datagram, let go right after
    /// pieces that did not end theirs, are taken for its rest.
    fn let_go_unfinished(&mut self) -> bool {
        let Some((_, u)) = self.unfinished.pop_first() else {
            return false;
        };
        let Held { span, data } = u.pieces;
        tracing::debug!(
            first = span.first,
            last = span.last,
            len = data.len(),
            "incomplete datagram dropped"
        );
        // the rest of the datagram let go before: nothing between them came (each number
        // there was given up on, or is still awaited), as another datagram's frame there
        // would part them
        let rest = self.let_go_open.is_some_and(|from| {
            span.starts != DatagramPart::First
                && from <= span.first
                && (self.skipped.gaps_in(from..span.first.min(self.next))).is_empty()
        });
        if !rest {
            self.count_dropped();
        }
        self.let_go_open = span.continued();
        if self.let_go_open.is_some() {
            // its datagram is counted: its next piece, when it comes, goes too, and is not
            // kept (or dropped for the limit) as the start of another
            self.orphaned = self.let_go_open;
        }
        self.bytes -= charge(&data);
        self.recycle(data);
        true
    }

    /// Moves the arrival clock to `now`, and lets go of the unfinished pieces that waited
    /// [`UNFINISHED_PATIENCE`] on it.
    fn tick(&mut self, now: Instant) {
        if let Some(last) = self.last_arrival {
            let step = now.saturating_duration_since(last).min(ARRIVAL_CLOCK_STEP);
            self.arrival_clock += step;
        }
        self.last_arrival = Some(now);
        while (self.unfinished.first_key_value())
            .is_some_and(|(_, u)| self.arrival_clock - u.touched >= UNFINISHED_PATIENCE)
        {
            self.let_go_unfinished();
        }
    }

    /// Whether datagrams are held for missing ones.
    pub fn holds_any(&self) -> bool {
        !self.held_since.is_empty()
    }

    /// When the datagram held longest stops waiting for the missing ones before it (see
    /// [`HoldRule`]).
    pub fn release_deadline(&self, rule: &HoldRule) -> Option<Instant> {
        let &(t, _) = self.held_since.front()?;
        if let Some((at, wait)) = rule.resumed {
            if t <= at {
                return Some(at + wait);
            }
        }
        // a link that delivered nothing after the first missing one may still carry it, and
        // so may the rest of a repair under way on a link, which goes in sending order too
        let repaired = self
            .links
            .iter()
            .zip(&rule.failure_waits)
            .flat_map(|(l, &wait)| {
                let in_flight = l.largest.is_some_and(|n| n < self.next).then_some(l.last);
                let repairing = l
                    .last_resent
                    .filter(|&(n, _)| n < self.next)
                    .map(|(_, at)| at);
                [in_flight.flatten(), repairing]
                    .into_iter()
                    .flatten()
                    .map(move |at| at + wait)
            });
        Some(repaired.fold(t + rule.base, Instant::max))
    }

    /// Delivers the held datagrams whose hold is over, giving up on the missing ones before
    /// them; returns whether datagrams became ready.
    pub fn release_due(&mut self, now: Instant, rule: &HoldRule) -> bool {
        let before = self.ready.len();
        while self.release_deadline(rule).is_some_and(|t| t <= now) {
            self.release_first_held();
        }
        self.ready.len() > before
    }

    /// Gives up on the datagrams missing before the first held one and delivers it (and
    /// those right after it); false if none is held.
    fn release_first_held(&mut self) -> bool {
        let Some((&seq, _)) = self.held.first_key_value() else {
            return false;
        };
        tracing::debug!(from = self.next, to = seq, "gave up on missing datagrams");
        self.skip_to(seq);
        self.release_in_order();
        true
    }

    /// Datagram `seq`, given up on, arrived late: it is no longer awaited. Taking it out of
    /// a run splits the run in two, so the bound on the runs remembered holds here too: a
    /// peer that sends the odd numbers below a jump would otherwise add a run with each.
    fn forget_skipped(&mut self, seq: u64) {
        self.skipped.remove(seq..seq + 1);
        self.skipped.keep_highest(SKIPPED_RUNS);
    }

    /// Gives up on the datagrams from `next` to before `seq`, remembering their numbers.
    fn skip_to(&mut self, seq: u64) {
        if seq > self.next {
            for gap in self.dropped_ahead.gaps_in(self.next..seq) {
                self.skipped.insert(gap);
            }
            self.dropped_ahead.remove_below(seq);
            self.skipped.keep_highest(SKIPPED_RUNS);
        }
        self.next = seq;
    }

    fn release_in_order(&mut self) {
        loop {
            if let Some(Held { span, data }) = self.held.remove(&self.next) {
                self.deliver(span, Payload::Held(data));
                self.next = span.last + 1;
            } else if self.dropped_ahead.contains(self.next) {
                // it came, and was counted as dropped: nothing is missing here
                self.dropped_ahead.remove_below(self.next + 1);
                self.next += 1;
            } else {
                break;
            }
        }
        // held datagrams leave only here, as `next` passes them
        while self
            .held_since
            .front()
            .is_some_and(|&(_, seq)| seq < self.next)
        {
            self.held_since.pop_front();
        }
        // Those delivered behind one still held stay in the queue until it goes; a peer that
        // keeps the front one waiting (sending ahead, then pairs in reverse order) would
        // grow it with every pair. Past twice the held ones, they are dropped at once.
        if self.held_since.len() > 2 * self.held.len() + HELD_SINCE_SLACK {
            let next = self.next;
            self.held_since.retain(|&(_, seq)| seq >= next);
        }
    }

    /// Gives up on every missing datagram, delivering all the held ones and letting go of
    /// the unfinished ones: the connection closed, and nothing missing can arrive any more.
    pub fn release_all(&mut self) -> bool {
        let before = self.ready.len();
        while self.release_first_held() {}
        self.keep_joining();
        while self.let_go_unfinished() {}
        self.ready.len() > before
    }

    /// Datagrams held for an earlier one, and datagrams ready for the application.
    pub fn waiting(&self) -> (usize, usize) {
        (self.held.len(), self.ready.len())
    }

    pub fn pop(&mut self) -> Option<Vec<u8>> {
        let d = self.ready.pop_front()?;
        self.bytes -= charge(&d);
        Some(d)
    }

    /// Puts the next datagram in `buf`, whose memory is kept for a later arrival; false if
    /// none is ready.
    pub fn pop_into(&mut self, buf: &mut Vec<u8>) -> bool {
        let Some(d) = self.pop() else {
            return false;
        };
        let old = std::mem::replace(buf, d);
        self.recycle(old);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packets of 1472 bytes: 1426 bytes sent whole, pieces in 1437 bytes of frames.
    const BOUNDS: Bounds = Bounds {
        unsplit: 1426,
        piece_room: 1437,
    };

    /// The next frame of a queue whose datagrams each fit a packet: (number, bytes).
    fn next(q: &mut OutgoingDatagrams, now: Instant) -> Option<(u64, Vec<u8>)> {
        let piece = q.pop(now, 1437, BOUNDS)?;
        assert_eq!(piece.part, DatagramPart::Whole);
        Some((piece.seq, piece.data.to_vec()))
    }

    /// What a failed link had in flight: the given frames as whole datagrams.
    fn stranded(sent: &[(u64, Vec<u8>)]) -> Vec<Piece> {
        sent.iter()
            .map(|(seq, data)| Piece {
                seq: *seq,
                part: DatagramPart::Whole,
                data: Bytes::from(data.clone()),
            })
            .collect()
    }

    /// The base hold alone (no link looks failed).
    fn only(base: Duration) -> HoldRule {
        HoldRule {
            base,
            failure_waits: Default::default(),
            resumed: None,
        }
    }

    #[test]
    fn a_datagram_larger_than_a_packet_goes_in_pieces_that_fill_the_packets() {
        let now = Instant::now();
        let mut q = OutgoingDatagrams::new(1 << 20, Duration::from_millis(20));
        let big: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        q.push(now, &big);
        q.push(now, &[7; 1300]);
        assert_eq!(q.queued(), (2, 6300));
        // room left after other frames, then empty packets; then a packet of a larger link,
        // which takes no larger piece than the smallest link's packets do
        let mut pieces = Vec::new();
        let mut sent = 0;
        for room in [500, 1437, 1437, 1437, 1437] {
            let piece = q.pop(now, room, BOUNDS).expect("a piece fits");
            // what is queued is the rest of the large one and the small one behind it
            sent += piece.data.len();
            let left = if sent < big.len() { 2 } else { 1 };
            assert_eq!(q.queued(), (left, (6300 - sent) as u64));
            assert!(wire::datagram_frame_len_to_end(piece.seq, piece.data.len()) <= 1437);
            if piece.part == DatagramPart::Last {
                assert!(wire::datagram_frame_len(piece.seq, piece.data.len()) <= room);
            } else {
                let frame = wire::datagram_frame_len_to_end(piece.seq, piece.data.len());
                assert_eq!(
                    frame, room,
                    "the packet is full, the piece running to its end"
                );
            }
            pieces.push(piece);
        }
        let parts: Vec<DatagramPart> = pieces.iter().map(|p| p.part).collect();
        use DatagramPart::*;
        assert_eq!(parts, [First, Middle, Middle, Middle, Last]);
        assert_eq!(
            pieces.iter().map(|p| p.seq).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
        assert_eq!(
            pieces
                .iter()
                .flat_map(|p| p.data.clone())
                .collect::<Vec<_>>(),
            big
        );
        // the next datagram is small: it goes whole, in the room the last piece left
        let left = 1437 - wire::datagram_frame_len(4, pieces[4].data.len());
        assert!(left < 1300, "too little room for it");
        assert!(
            q.pop(now, left, BOUNDS).is_none(),
            "a small datagram is never cut"
        );
        let whole = q.pop(now, 1437, BOUNDS).unwrap();
        assert_eq!((whole.seq, whole.part, whole.data.len()), (5, Whole, 1300));
        assert_eq!(q.queued(), (0, 0));
        // a packet with room for less than the smallest piece takes none
        q.push(now, &big);
        let short = wire::datagram_frame_len_to_end(6, MIN_PIECE - 1);
        assert!(q.pop(now, short, BOUNDS).is_none());
        // a jumbo link's packet takes pieces of the smallest link's size, with their lengths
        let piece = q.pop(now, 8900, BOUNDS).unwrap();
        assert_eq!((piece.part, piece.data.len()), (First, 1437 - 2));
        assert!(q.pop(now, 8900 - 1437 - 2, BOUNDS).is_some());
    }

    /// A datagram just too large to go whole, which one piece could carry all of: it still
    /// goes as a first and a last piece, and the queue moves on to the next one (a first
    /// piece that took it all left it at the head of the queue for ever, with nothing left to
    /// send and no last piece for the receiver).
    #[test]
    fn a_datagram_one_piece_could_hold_still_ends_with_a_last_piece() {
        let now = Instant::now();
        for size in BOUNDS.unsplit + 1..BOUNDS.piece_room {
            let mut q = OutgoingDatagrams::new(1 << 20, Duration::from_millis(20));
            let mut rx = IncomingDatagrams::new(1 << 20, Duration::from_millis(5));
            let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            q.push(now, &data);
            q.push(now, b"next");
            let mut pieces = Vec::new();
            for room in [size + 2, 1437, 1437] {
                let Some(piece) = q.pop(now, room, BOUNDS) else {
                    continue;
                };
                pieces.push(piece);
            }
            let parts: Vec<DatagramPart> = pieces.iter().map(|p| p.part).collect();
            use DatagramPart::*;
            assert_eq!(parts, [First, Last, Whole], "a datagram of {size} bytes");
            assert!(q.is_empty());
            for p in &pieces {
                rx.push_piece(now, 0, p.seq, p.part, &p.data);
            }
            assert_eq!(rx.pop(), Some(data));
            assert_eq!(rx.pop(), Some(b"next".to_vec()));
        }
    }

    #[test]
    fn pieces_are_joined_in_order_and_a_lost_piece_loses_its_datagram_only() {
        // (a piece given up on that comes late after all completes its datagram: see
        // `a_datagram_that_lost_pieces_to_a_hold_is_completed_by_them_late`)
        use DatagramPart::*;
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut q = IncomingDatagrams::new(1 << 20, ms(5));
        let rule = only(ms(5));
        // datagram A in three pieces, the middle one overtaken on another link
        assert!(!q.push_piece(t0, 0, 0, First, b"aa"));
        assert!(!q.push_piece(t0, 1, 2, Last, b"cc"));
        assert!(q.push_piece(t0, 0, 1, Middle, b"bb"), "A is complete");
        assert_eq!(q.pop().unwrap(), b"aabbcc");
        // datagram B loses its middle piece; C, whole, follows
        assert!(!q.push_piece(t0, 0, 3, First, b"dd"));
        assert!(!q.push_piece(t0, 0, 5, Last, b"ff"));
        assert!(!q.push_piece(t0, 0, 6, Whole, b"C"));
        assert!(q.release_due(t0 + ms(5), &rule));
        assert_eq!(q.pop().unwrap(), b"C", "B is lost, not handed over in part");
        assert!(q.pop().is_none());
        // D loses its first piece: the rest of it is dropped as one datagram, B's first
        // and last pieces as another
        assert!(!q.push_piece(t0 + ms(7), 0, 8, Middle, b"hh"));
        assert!(!q.push_piece(t0 + ms(7), 0, 9, Last, b"ii"));
        assert!(!q.release_due(t0 + ms(12), &rule));
        assert!(q.push_piece(t0 + ms(13), 0, 10, Whole, b"E"));
        assert_eq!(q.pop().unwrap(), b"E");
        assert_eq!(q.dropped, 0, "not yet: their pieces wait a while");
        let later = arrivals_for(&mut q, t0 + ms(13), UNFINISHED_PATIENCE / 2);
        assert_eq!(q.dropped, 0, "not until they waited their patience");
        arrivals_for(&mut q, later, UNFINISHED_PATIENCE / 2);
        assert!(q.pop().is_none());
        assert_eq!(q.dropped, 2, "B and D");
        assert_eq!(q.received, 5, "A, B, C, D and E");
        assert_eq!(q.waiting(), (0, 0));
        assert_eq!(q.bytes, 0, "nothing held for the lost ones");
    }

    proptest::proptest! {
        /// Datagrams cut into pieces, some frames lost, some twice, the rest in any order (all
        /// before any hold runs out): exactly the datagrams whose every frame arrived are
        /// handed over, whole, once, in sending order; every other one that left a trace is
        /// counted as dropped, once; nothing stays behind.
        #[test]
        fn pieces_join_into_exactly_the_datagrams_that_arrived_whole(
            cuts in proptest::collection::vec(1..5usize, 1..40),
            fate in proptest::collection::vec(0..10u8, 200),
            order in proptest::collection::vec(proptest::prelude::any::<u16>(), 200),
        ) {
            use DatagramPart::*;
            // datagram k in cuts[k] pieces of 3 bytes each, then a whole one nothing loses
            let mut frames = Vec::new();
            for (k, &n) in cuts.iter().enumerate() {
                for i in 0..n {
                    let part = match (i, n) {
                        (_, 1) => Whole,
                        (0, _) => First,
                        (i, n) if i + 1 == n => Last,
                        _ => Middle,
                    };
                    frames.push((k, part, vec![k as u8, i as u8, 0xee]));
                }
            }
            frames.push((cuts.len(), Whole, vec![0xff]));
            let t0 = Instant::now();
            let mut q = IncomingDatagrams::new(1 << 20, Duration::from_millis(5));
            let mut sent: Vec<(u64, usize, DatagramPart, Vec<u8>)> = frames
                .into_iter()
                .enumerate()
                .map(|(seq, (k, part, data))| (seq as u64, k, part, data))
                .collect();
            let last = sent.len() - 1;
            // lost (fate 0), arriving twice (fate 1), shuffled
            let mut arriving = Vec::new();
            let mut whole = vec![true; cuts.len() + 1];
            let mut traced = vec![false; cuts.len() + 1];
            for (j, f) in sent.drain(..).enumerate() {
                if fate[j % fate.len()] == 0 && j != last {
                    whole[f.1] = false;
                    continue;
                }
                traced[f.1] = true;
                if fate[j % fate.len()] == 1 {
                    arriving.push(f.clone());
                }
                arriving.push(f);
            }
            let mut keyed: Vec<(u16, _)> = arriving
                .into_iter()
                .enumerate()
                .map(|(j, f)| (order[j % order.len()], f))
                .collect();
            keyed.sort_by_key(|(key, f)| (*key, f.0));
            for (_, (seq, _, part, data)) in &keyed {
                q.push_piece(t0, 0, *seq, *part, data);
            }
            q.release_due(t0 + Duration::from_secs(1), &only(Duration::from_millis(5)));
            // nothing can complete the unfinished ones any more (as at the close)
            q.release_all();
            let got: Vec<Vec<u8>> = std::iter::from_fn(|| q.pop()).collect();
            let got_len = got.len();
            let expected: Vec<Vec<u8>> = (0..=cuts.len())
                .filter(|&k| whole[k])
                .map(|k| {
                    if k == cuts.len() {
                        return vec![0xff];
                    }
                    (0..cuts[k]).flat_map(|i| [k as u8, i as u8, 0xee]).collect()
                })
                .collect();
            proptest::prop_assert_eq!(got, expected);
            // each incomplete one is counted once, but one whose first piece was lost after a
            // gap in the one before may count with it
            let lost_with_trace = (0..=cuts.len()).filter(|&k| traced[k] && !whole[k]).count();
            proptest::prop_assert!(q.dropped <= lost_with_trace as u64);
            proptest::prop_assert_eq!(q.dropped > 0, lost_with_trace > 0);
            proptest::prop_assert_eq!(q.received - q.dropped, got_len as u64);
            proptest::prop_assert_eq!(q.waiting(), (0, 0));
            proptest::prop_assert_eq!(q.bytes, 0);
        }
    }

    proptest::proptest! {
        /// Datagrams of any size up to the largest, cut by whatever room the packets have, some
        /// pieces written off with a failed link and sent again, reach a receiver that gets
        /// every frame (in sending order, the copies sent again late): each datagram arrives
        /// whole and once, in order, and no piece's frame is larger than an empty packet.
        #[test]
        fn pieces_cut_to_any_room_and_sent_again_join_into_the_datagrams_sent(
            sizes in proptest::collection::vec(1..wire::MAX_DATAGRAM_LEN, 1..12),
            rooms in proptest::collection::vec(0..1600usize, 64),
            failures in proptest::collection::vec(0..40u8, 64),
        ) {
            let now = Instant::now();
            let mut q = OutgoingDatagrams::new(1 << 30, Duration::from_secs(60));
            let sent: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(k, &n)| (0..n).map(|i| (i * 7 + k) as u8).collect())
                .collect();
            for d in &sent {
                q.push(now, d);
            }
            let mut rx = IncomingDatagrams::new(1 << 30, Duration::from_millis(5));
            let mut in_flight: Vec<Piece> = Vec::new();
            let (mut step, mut failed) = (0, 0);
            while !q.is_empty() || !in_flight.is_empty() {
                let room = rooms[step % rooms.len()].min(BOUNDS.piece_room);
                // a few link failures, not one before every delivery
                let fail = failures[step % failures.len()] == 0 && failed < 5;
                step += 1;
                proptest::prop_assert!(step < 100_000, "the queue does not drain");
                if fail && !in_flight.is_empty() {
                    // the link failed: what it had in flight goes again
                    q.requeue(now, &mut in_flight);
                    failed += 1;
                    continue;
                }
                match q.pop(now, room.max(BOUNDS.piece_room * usize::from(step % 3 == 0)), BOUNDS) {
                    Some(piece) => {
                        let to_end = wire::datagram_frame_len_to_end(piece.seq, piece.data.len());
                        proptest::prop_assert!(to_end <= BOUNDS.piece_room);
                        in_flight.push(piece);
                    }
                    None => {
                        // acknowledged: the receiver gets what was in flight
                        for p in in_flight.drain(..) {
                            rx.push_piece(now, 0, p.seq, p.part, &p.data);
                        }
                    }
                }
                if in_flight.len() > 8 {
                    for p in in_flight.drain(..) {
                        rx.push_piece(now, 0, p.seq, p.part, &p.data);
                    }
                }
            }
            rx.release_due(now + Duration::from_secs(1), &only(Duration::from_millis(5)));
            let got: Vec<Vec<u8>> = std::iter::from_fn(|| rx.pop()).collect();
            proptest::prop_assert_eq!(got, sent);
            proptest::prop_assert_eq!(rx.dropped, 0);
        }
    }

    /// The frame `piece` makes in a packet with `room` bytes left, and what that packet's
    /// frames read as (each piece is written as the last frame of its packet here, as it is
    /// when it fills the packet).
    fn written(piece: &Piece, room: usize) -> Vec<(u64, DatagramPart, Vec<u8>)> {
        let mut buf = vec![0xEEu8; room];
        let mut w = wire::Writer::new(&mut buf);
        piece.write(&mut w, room);
        let n = w.len();
        wire::Frames::new(&buf[..n])
            .map(|f| match f.expect("a well-formed frame") {
                wire::Frame::Datagram { seq, part, data } => (seq, part, data.to_vec()),
                wire::Frame::Padding => (u64::MAX, DatagramPart::Whole, vec![]),
                other => panic!("unexpected frame {other:?}"),
            })
            .filter(|f| f.0 != u64::MAX)
            .collect()
    }

    /// Every piece a datagram is cut into is written within the room it was cut for, at any
    /// room and with numbers of 1 and 4 bytes. Before, a first piece that would have filled
    /// the room exactly was cut a byte short for the last piece, and then written with its
    /// length, a byte past the room: the writer panicked (a keyed 1472-byte packet, numbers
    /// past 16 383, a datagram of 1436 bytes).
    #[test]
    fn every_piece_is_written_within_the_room_it_was_cut_for() {
        let now = Instant::now();
        let sizes = (BOUNDS.unsplit + 1..BOUNDS.unsplit + 16).chain([2000, 2872, 2873, 5000]);
        for size in sizes {
            for first_seq in [0, 20_000] {
                for room in 8..=BOUNDS.piece_room {
                    let mut q = OutgoingDatagrams::new(1 << 20, Duration::from_millis(20));
                    q.next_seq = first_seq;
                    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
                    q.push(now, &data);
                    let mut got = Vec::new();
                    // the first piece in `room`, the others in empty packets
                    let mut r = room;
                    while let Some(piece) = q.pop(now, r, BOUNDS) {
                        let frames = written(&piece, r);
                        assert_eq!(
                            frames,
                            [(piece.seq, piece.part, piece.data.to_vec())],
                            "size {size}, room {r}"
                        );
                        got.extend_from_slice(&piece.data);
                        r = BOUNDS.piece_room;
                    }
                    if !got.is_empty() {
                        assert_eq!(got, data, "size {size}, first room {room}");
                    }
                }
            }
        }
    }

    /// A piece cut to fill a packet of one link, stranded when that link failed, goes again
    /// in an empty packet with a byte more room (behind one byte of padding). Before, it fit
    /// no packet at all: too long to carry its length, too short to run to the end. It stood
    /// at the head of the queue, and every data packet left without a datagram.
    #[test]
    fn a_piece_cut_for_a_smaller_packet_goes_again_in_a_larger_one() {
        let now = Instant::now();
        let mut q = OutgoingDatagrams::new(1 << 20, Duration::from_millis(20));
        q.push(now, &[1; 3000]);
        let first = q.pop(now, BOUNDS.piece_room - 1, BOUNDS).unwrap();
        assert_eq!(
            wire::datagram_frame_len_to_end(first.seq, first.data.len()),
            BOUNDS.piece_room - 1,
            "the premise: it filled its packet"
        );
        q.requeue(now, &mut vec![first.clone()]);
        let again = q
            .pop(now, BOUNDS.piece_room, BOUNDS)
            .expect("it goes again");
        assert_eq!(again, first);
        assert_eq!(
            written(&again, BOUNDS.piece_room),
            [(first.seq, first.part, first.data.to_vec())]
        );
    }

    /// A datagram sent whole, stranded, that no longer fits a packet (a link with smaller
    /// packets joined meanwhile) is dropped, and the next one goes. Before, it stood at the
    /// head of the queue for good.
    #[test]
    fn a_datagram_stranded_too_large_for_the_packets_now_is_dropped() {
        let now = Instant::now();
        let mut q = OutgoingDatagrams::new(1 << 20, Duration::from_millis(20));
        q.push(now, &[1; 1400]);
        q.push(now, b"next");
        let big = q.pop(now, BOUNDS.piece_room, BOUNDS).unwrap();
        assert_eq!(big.part, DatagramPart::Whole);
        q.requeue(now, &mut vec![big]);
        let smaller = Bounds {
            unsplit: 1300,
            piece_room: 1311,
        };
        let next = q
            .pop(now, smaller.piece_room, smaller)
            .expect("the next one goes");
        assert_eq!(&next.data[..], b"next");
        assert_eq!(q.dropped, 1);
        assert!(q.is_empty());
    }

    /// A datagram whose pieces all come back from a failed link and are dropped (the queue is
    /// full) counts as one dropped, not one per piece.
    #[test]
    fn a_datagram_dropped_in_pieces_counts_once() {
        let now = Instant::now();
        let mut q = OutgoingDatagrams::new(1 << 20, Duration::from_millis(20));
        let data = vec![5u8; 5000];
        q.push(now, &data);
        let mut pieces = Vec::new();
        while let Some(p) = q.pop(now, BOUNDS.piece_room, BOUNDS) {
            pieces.push(p);
        }
        assert!(pieces.len() >= 4, "{} pieces", pieces.len());
        assert_eq!(q.sent, 1);
        q.requeue(now, &mut pieces);
        // a new datagram as large as the bound pushes every piece out
        q.push(now, &vec![6u8; (1 << 20) - DATAGRAM_OVERHEAD]);
        assert_eq!(q.queue.len(), 1, "only the new one is left");
        assert_eq!(q.dropped, 1);
    }

    /// Frames keep arriving from `from` for `span` (as the arrival clock sees them, one every
    /// 10 ms); returns when they stop.
    fn arrivals_for(rx: &mut IncomingDatagrams, from: Instant, span: Duration) -> Instant {
        let mut t = from;
        while t < from + span {
            t += Duration::from_millis(10);
            rx.tick(t);
        }
        t
    }

    /// Pushes `data` as pieces of 1400 bytes numbered from `seq` on; returns the next number.
    fn push_in_pieces(rx: &mut IncomingDatagrams, now: Instant, seq: u64, data: &[u8]) -> u64 {
        let chunks: Vec<&[u8]> = data.chunks(1400).collect();
        for (i, c) in chunks.iter().enumerate() {
            let part = match i {
                0 => DatagramPart::First,
                i if i + 1 == chunks.len() => DatagramPart::Last,
                _ => DatagramPart::Middle,
            };
            rx.push_piece(now, 0, seq + i as u64, part, c);
        }
        seq + chunks.len() as u64
    }

    /// A datagram joined from its pieces that fits the limit is not dropped, read as each
    /// completes. Before, the buffer it was joined in doubled as it grew, and charged by its
    /// capacity it went over the limit: with a limit under about 1.4 times the datagram's
    /// size, every one was dropped at a piece.
    #[test]
    fn a_datagram_in_pieces_that_fits_the_limit_is_joined_whole() {
        let now = Instant::now();
        let mut rx = IncomingDatagrams::new(46_024, Duration::ZERO);
        let mut seq = 0;
        for i in 0..3u8 {
            seq = push_in_pieces(&mut rx, now, seq, &[i; 30_000]);
            assert_eq!(rx.pop().as_deref(), Some(&[i; 30_000][..]), "datagram {i}");
        }
        assert_eq!((rx.received, rx.dropped), (3, 0));
        assert_eq!(rx.bytes, 0, "nothing kept");
    }

    /// A datagram larger than the limit, whose pieces come over two links (its last held
    /// ahead, with the datagram after it, while the rest is on the way), counts as dropped
    /// once. Before, making room let go of its first piece (counted) and then of its held
    /// last; the middle pieces that came next were kept as another unfinished datagram and
    /// counted again when let go: 4 received and 2 dropped of 3 sent.
    #[test]
    fn a_datagram_too_large_whose_pieces_come_out_of_order_counts_once() {
        use DatagramPart::*;
        let t0 = Instant::now();
        let mut q = IncomingDatagrams::new(4096, Duration::from_millis(5));
        q.push_piece(t0, 1, 0, Whole, b"a");
        q.push_piece(t0, 1, 1, First, &[1; 1454]);
        q.push_piece(t0, 0, 7, Last, &[7; 1271]);
        q.push_piece(t0, 0, 8, Whole, b"b");
        for seq in 2..=6 {
            q.push_piece(t0, 1, seq, Middle, &[seq as u8; 1455]);
        }
        let got: Vec<Vec<u8>> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(got, [b"a".to_vec(), b"b".to_vec()]);
        assert_eq!((q.received, q.dropped), (3, 1));
        assert_eq!(q.bytes, 0, "nothing kept");
    }

    /// Small datagrams in pieces, waiting for the reader after a large one, cost what they
    /// hold against the limit. Before, each was joined in room for the largest so far and
    /// charged for all of it: after one of 60 000 bytes, a 1 MiB limit held 17 datagrams of
    /// 1500 bytes and dropped the rest.
    #[test]
    fn small_datagrams_joined_after_a_large_one_cost_their_size() {
        let now = Instant::now();
        let mut rx = IncomingDatagrams::new(1 << 20, Duration::ZERO);
        let large: Vec<u8> = (0..60_000u32).map(|i| (i % 251) as u8).collect();
        let mut seq = push_in_pieces(&mut rx, now, 0, &large);
        assert_eq!(rx.pop(), Some(large));
        let small: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 1500]).collect();
        for d in &small {
            seq = push_in_pieces(&mut rx, now, seq, d);
        }
        let got: Vec<Vec<u8>> = std::iter::from_fn(|| rx.pop()).collect();
        assert_eq!(got.len(), small.len(), "{} dropped", rx.dropped);
        assert!(got == small);
        assert_eq!(rx.bytes, 0, "everything read, nothing charged");
    }

    /// Datagrams of more than half the largest so far, waiting for the reader, fit the limit
    /// as their sizes say: two of 35 000 bytes (70 128 with the overhead charged each) after
    /// one of 66 559, under a limit of 100 000. Before, each was joined in room for the
    /// largest and kept it (only room of more than twice its size was given back), that room
    /// was charged at once and each piece again, and the second datagram was dropped.
    #[test]
    fn datagrams_over_half_the_largest_so_far_cost_their_size() {
        let now = Instant::now();
        let mut rx = IncomingDatagrams::new(100_000, Duration::ZERO);
        let large: Vec<u8> = (0..66_559u32).map(|i| (i % 251) as u8).collect();
        let mut seq = push_in_pieces(&mut rx, now, 0, &large);
        assert_eq!(rx.pop(), Some(large));
        let two = [vec![1u8; 35_000], vec![2u8; 35_000]];
        for d in &two {
            seq = push_in_pieces(&mut rx, now, seq, d);
        }
        let got: Vec<Vec<u8>> = std::iter::from_fn(|| rx.pop()).collect();
        assert_eq!((got.len(), rx.dropped), (2, 0));
        assert!(got == two);
        assert_eq!(rx.bytes, 0, "everything read, nothing charged");
    }

    /// The pieces of a datagram that wait behind a missing one share one buffer and one
    /// entry, charged about the datagram's size, and the datagram is handed over whole when
    /// the missing one comes. Before, each piece took a buffer and an entry of its own, and
    /// was copied a second time when released (in the tunnel about half the pieces wait, the
    /// links drained one after the other).
    #[test]
    fn pieces_waiting_for_an_earlier_datagram_share_one_buffer() {
        let now = Instant::now();
        let mut rx = IncomingDatagrams::new(16 << 20, Duration::from_millis(5));
        let datagram = |k: u32| -> Vec<u8> { (0..65_536u32).map(|i| (i + k) as u8).collect() };
        // a steady flow read into reused buffers, as the tunnel reads it
        let (mut seq, mut buf) = (0, Vec::new());
        for k in 0..8 {
            seq = push_in_pieces(&mut rx, now, seq, &datagram(k));
            assert!(rx.pop_into(&mut buf));
            assert_eq!(buf, datagram(k));
        }
        // one whole datagram goes missing; the next one's pieces (47 of them) wait for it
        let missing = seq;
        let behind = push_in_pieces(&mut rx, now, missing + 1, &datagram(9)) - (missing + 1);
        assert_eq!(behind, 47);
        assert_eq!(rx.reordered, 47, "every piece waited");
        assert_eq!(rx.waiting(), (1, 0), "in one entry");
        assert!(
            rx.bytes <= 65_536 + 1024 + DATAGRAM_OVERHEAD,
            "{} bytes charged for one datagram's pieces",
            rx.bytes
        );
        assert!(rx.push(now, 0, missing, b"late"));
        assert_eq!(rx.pop().unwrap(), b"late");
        assert_eq!(
            rx.pop().unwrap(),
            datagram(9),
            "whole, after the missing one"
        );
        assert_eq!((rx.dropped, rx.waiting()), (0, (0, 0)));
    }

    /// Datagrams in pieces dropped on arrival for the limit (the reader behind) count as
    /// dropped, once each. Before, one whose every piece was dropped counted nowhere.
    #[test]
    fn datagrams_dropped_in_pieces_for_the_limit_are_counted() {
        let now = Instant::now();
        let mut rx = IncomingDatagrams::new(8 << 10, Duration::ZERO);
        let mut seq = 0;
        for i in 0..20u8 {
            seq = push_in_pieces(&mut rx, now, seq, &[i; 1500]);
            seq = push_in_pieces(&mut rx, now, seq, &[i; 3000]);
        }
        let got = std::iter::from_fn(|| rx.pop()).count() as u64;
        assert!(
            got > 0 && rx.dropped > 0,
            "the premise: some fit, some did not"
        );
        assert_eq!((rx.received, got + rx.dropped), (40, 40));
    }

    #[test]
    fn pieces_stranded_on_a_failed_link_go_again_unchanged() {
        let now = Instant::now();
        let mut q = OutgoingDatagrams::new(1 << 20, Duration::from_millis(20));
        q.push(now, &[1; 3000]);
        let first = q.pop(now, 1437, BOUNDS).unwrap();
        let middle = q.pop(now, 1437, BOUNDS).unwrap();
        // the link carrying the middle piece fails: it goes again with its number and place,
        // ahead of the rest of its datagram, and fits an empty packet (with no room to spare:
        // not one with an acknowledgement in it)
        q.requeue(now, &mut vec![middle.clone()]);
        assert!(q.pop(now, 1437 - 10, BOUNDS).is_none());
        assert_eq!(q.pop(now, 1437, BOUNDS).unwrap(), middle);
        let last = q.pop(now, 1437, BOUNDS).unwrap();
        assert_eq!((first.seq, last.seq, last.part), (0, 2, DatagramPart::Last));
        assert_eq!(first.data.len() + middle.data.len() + last.data.len(), 3000);
        assert_eq!((q.sent, q.next_seq, q.resent), (1, 3, 1));
        assert!(q.is_empty());
    }

    #[test]
    fn a_full_send_queue_drops_the_oldest() {
        let now = Instant::now();
        // each 100-byte datagram costs 164 bytes of the 400
        let mut q = OutgoingDatagrams::new(400, Duration::from_millis(20));
        for i in 0..3u8 {
            q.push(now, &[i; 100]);
        }
        assert_eq!(q.dropped, 1);
        // numbered as sent: the drop leaves no gap
        assert_eq!(next(&mut q, now).unwrap(), (0, vec![1; 100]));
        assert_eq!(next(&mut q, now).unwrap(), (1, vec![2; 100]));
        assert!(next(&mut q, now).is_none());
    }

    /// A full queue whose oldest datagram is partly sent drops the one behind it: the rest
    /// still goes, and the receiver joins the whole datagram.
    #[test]
    fn a_full_send_queue_keeps_a_datagram_partly_sent() {
        let now = Instant::now();
        let big: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        // room for the large one and one small one (3064 + 164 of 3300)
        let mut q = OutgoingDatagrams::new(3300, Duration::from_millis(20));
        let mut rx = IncomingDatagrams::new(1 << 20, Duration::from_millis(5));
        q.push(now, &big);
        let first = q.pop(now, 1437, BOUNDS).unwrap();
        assert_eq!(first.part, DatagramPart::First);
        q.push(now, &[1; 100]);
        // no room for this one: the small one behind the partly sent datagram goes
        q.push(now, &[2; 100]);
        assert_eq!(q.dropped, 1);
        let mut frames = vec![first];
        while let Some(piece) = q.pop(now, 1437, BOUNDS) {
            frames.push(piece);
        }
        for f in &frames {
            rx.push_piece(now, 0, f.seq, f.part, &f.data);
        }
        assert_eq!(rx.pop(), Some(big));
        assert_eq!(rx.pop(), Some(vec![2; 100]));
        assert_eq!(rx.pop(), None);
        assert_eq!((rx.dropped, q.sent), (0, 2));
    }

    #[test]
    fn empty_datagrams_count_against_the_send_queue_bound() {
        // the links stall (nothing is sent, so nothing is too old either): the queue stays
        // within its bound however many empty datagrams the application sends
        let now = Instant::now();
        let mut q = OutgoingDatagrams::new(64 * 10, Duration::from_millis(20));
        for _ in 0..100_000 {
            q.push(now, &[]);
        }
        assert_eq!(q.queue.len(), 10);
        assert_eq!(q.dropped, 100_000 - 10);
    }

    #[test]
    fn datagrams_stranded_on_a_failed_link_go_again_first_with_their_numbers() {
        let now = Instant::now();
        let mut q = OutgoingDatagrams::new(10_000, Duration::from_millis(20));
        for i in 0..4u8 {
            q.push(now, &[i]);
        }
        let sent: Vec<(u64, Vec<u8>)> = (0..3).map(|_| next(&mut q, now).unwrap()).collect();
        assert_eq!(sent[2], (2, vec![2]));
        // the link carrying 1 and 2 fails
        q.requeue(now, &mut stranded(&sent[1..]));
        assert_eq!(q.front_frame_len(BOUNDS), Some(1 + 1 + 1 + 1));
        assert_eq!(next(&mut q, now).unwrap(), (1, vec![1]));
        assert_eq!(next(&mut q, now).unwrap(), (2, vec![2]));
        assert_eq!(
            next(&mut q, now).unwrap(),
            (3, vec![3]),
            "new ones number on"
        );
        assert_eq!((q.sent, q.resent, q.dropped), (4, 2, 0));
        // and they are never too old to go
        let mut q = OutgoingDatagrams::new(10_000, Duration::from_millis(20));
        q.requeue(now, &mut stranded(&[(7, vec![7])]));
        q.drop_stale(now + Duration::from_secs(1));
        assert_eq!(next(&mut q, now).unwrap(), (7, vec![7]));
    }

    #[test]
    fn stale_datagrams_are_dropped_only_while_the_queue_moves() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut q = OutgoingDatagrams::new(10_000, ms(20));
        q.push(t0, b"a");
        assert_eq!(next(&mut q, t0).unwrap().1, b"a");
        // the links carry datagrams one every 8 ms
        for (at, data) in [(0, "b"), (0, "c"), (1, "old"), (15, "newer"), (30, "late")] {
            q.push(t0 + ms(at), data.as_bytes());
        }
        for (at, data) in [(8, "b"), (16, "c")] {
            assert_eq!(next(&mut q, t0 + ms(at)).unwrap().1, data.as_bytes());
        }
        q.drop_stale(t0 + ms(22));
        assert_eq!(q.dropped, 1, "\"old\" waited 21 ms while the queue moved");
        // then nothing leaves (every link failing, detected or not): nothing is stale
        q.drop_stale(t0 + ms(40));
        q.drop_stale(t0 + ms(60_000));
        assert_eq!(q.dropped, 1);
        // a minute later a link carries again: what waited goes, however slowly it drains
        assert_eq!(next(&mut q, t0 + ms(60_000)).unwrap().1, b"newer");
        q.push(t0 + ms(60_001), b"next");
        q.push(t0 + ms(60_002), b"fresh");
        q.drop_stale(t0 + ms(60_008));
        assert_eq!(next(&mut q, t0 + ms(60_008)).unwrap().1, b"late");
        assert_eq!(q.dropped, 1);
        // those queued after the queue moved again age as usual
        assert_eq!(next(&mut q, t0 + ms(60_016)).unwrap().1, b"next");
        q.drop_stale(t0 + ms(60_024));
        assert_eq!(q.dropped, 2, "\"fresh\" waited 22 ms while the queue moved");
        assert!(next(&mut q, t0 + ms(60_024)).is_none());
    }

    #[test]
    fn what_inner_tcp_sent_during_an_outage_goes_at_the_heal_behind_the_stranded_ones() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut q = OutgoingDatagrams::new(1 << 20, ms(20));
        for i in 0..10u8 {
            q.push(t0, &[i]);
        }
        let sent: Vec<(u64, Vec<u8>)> = (0..10).map(|_| next(&mut q, t0).unwrap()).collect();
        // every link dies; the failure is detected 20 ms later
        q.requeue(t0 + ms(20), &mut stranded(&sent));
        // inner TCP's retransmission timeouts during the outage
        for at in [200, 600, 1_400, 3_000, 6_200, 12_600, 25_400, 51_000] {
            q.push(t0 + ms(at), b"rto");
        }
        // the heal at 60 s: the links' windows open from small, and the stranded ones take
        // 45 ms to drain, longer than the maximum age
        let heal = t0 + ms(60_000);
        for i in 0..10u8 {
            let at = heal + ms(5 * u64::from(i));
            q.drop_stale(at);
            assert_eq!(next(&mut q, at).unwrap(), (u64::from(i), vec![i]));
        }
        q.drop_stale(heal + ms(50));
        for _ in 0..8 {
            assert_eq!(next(&mut q, heal + ms(50)).unwrap().1, b"rto");
        }
        assert_eq!(q.dropped, 0);
    }

    #[test]
    fn buffers_handed_back_carry_the_next_datagrams() {
        let now = Instant::now();
        let mut q = IncomingDatagrams::new(1 << 20, Duration::ZERO);
        let mut buf = Vec::with_capacity(1500);
        let memory = buf.as_ptr();
        assert!(q.push(now, 0, 0, b"first"));
        assert!(q.pop_into(&mut buf));
        assert_eq!(buf, b"first");
        // the application's buffer now waits in the queue for the next arrival
        assert!(q.push(now, 0, 1, b"second"));
        assert!(q.pop_into(&mut buf));
        assert_eq!(buf, b"second");
        assert_eq!(
            buf.as_ptr(),
            memory,
            "the second arrived in the first buffer"
        );
        assert!(!q.pop_into(&mut buf), "nothing ready");
        assert_eq!(buf, b"second", "left alone when nothing is ready");
        // an empty buffer or a huge one is not kept
        q.recycle(Vec::new());
        q.recycle(Vec::with_capacity(MAX_SPARE_CAPACITY + 1));
        assert_eq!(q.spares.bufs.len(), 1, "only the first datagram's buffer");
    }

    #[test]
    fn a_datagram_handed_over_whole_is_sent_from_the_callers_memory() {
        let now = Instant::now();
        let mut q = OutgoingDatagrams::new(1 << 20, Duration::from_millis(20));
        let mut buf = vec![5u8; 1000];
        let memory = buf.as_ptr();
        q.push_owned(now, &mut buf);
        assert!(
            buf.is_empty() && buf.capacity() >= 1000,
            "an empty buffer with room back"
        );
        let sent = q.pop(now, 1437, BOUNDS).unwrap();
        assert_eq!(
            (sent.seq, sent.data.as_ptr(), sent.data.len()),
            (0, memory, 1000)
        );
        let sent = sent.data;
        // acknowledged: that memory is the next buffer handed back
        q.recycle(sent);
        let mut again = vec![6u8; 10];
        q.push_owned(now, &mut again);
        assert_eq!(again.as_ptr(), memory);
        assert!(again.is_empty());
        assert_eq!(next(&mut q, now).unwrap().1, [6u8; 10]);
    }

    #[test]
    fn spare_buffers_are_sized_for_the_largest_datagram_so_mixed_sizes_reuse_them() {
        let mut s = Spares::default();
        // a small datagram first: its buffer cannot take a full-sized one, which gets a new
        let small = s.copy_of(&[1; 60]);
        s.recycle(small);
        let big = s.copy_of(&[2; 1400]);
        assert_eq!(s.bufs.len(), 0, "the small buffer was let go");
        let small = s.copy_of(&[3; 60]);
        assert!(small.capacity() >= 1400, "new buffers fit the largest seen");
        let kept = [small.as_ptr(), big.as_ptr()];
        s.recycle(small);
        s.recycle(big);
        // from now on a mix of sizes goes round the same two buffers
        for round in 0..10u8 {
            let a = s.copy_of(&[round; 1400]);
            let b = s.copy_of(&[round; 60]);
            assert_eq!(
                (a.as_slice(), b.as_slice()),
                (&[round; 1400][..], &[round; 60][..])
            );
            assert!(kept.contains(&a.as_ptr()) && kept.contains(&b.as_ptr()));
            s.recycle(b);
            s.recycle(a);
        }
    }

    /// The receive limit counts the memory received datagrams hold, not only their bytes:
    /// empty ones fill it too, and so do small ones copied into buffers sized for the
    /// larger ones seen before.
    #[test]
    fn the_receive_limit_counts_memory_not_only_bytes() {
        let now = Instant::now();
        let limit = 64 << 10;
        let mut q = IncomingDatagrams::new(limit, Duration::ZERO);
        for seq in 0..100_000u64 {
            q.push(now, 0, seq, &[]);
        }
        assert_eq!(q.waiting().1, limit / DATAGRAM_OVERHEAD);
        assert_eq!(q.dropped, 100_000 - (limit / DATAGRAM_OVERHEAD) as u64);
        let mut q = IncomingDatagrams::new(limit, Duration::ZERO);
        q.push(now, 0, 0, &[0; 1400]);
        q.pop();
        for seq in 1..10_000u64 {
            q.push(now, 0, seq, &[1]);
        }
        let held: usize = std::iter::from_fn(|| q.pop())
            .map(|d| d.capacity() + DATAGRAM_OVERHEAD)
            .sum();
        // (the last one taken may pass the limit by its buffer: what a copy costs is known
        // once it is made)
        assert!(
            held <= limit + 1400 + DATAGRAM_OVERHEAD,
            "{held} bytes held"
        );
        assert!(
            held > limit / 2,
            "the premise: the limit was reached ({held})"
        );
    }

    #[test]
    fn the_receive_queue_drops_what_does_not_fit() {
        let now = Instant::now();
        // a 100-byte datagram costs 164 bytes (its buffer and the overhead)
        let mut q = IncomingDatagrams::new(300, Duration::from_millis(5));
        assert!(q.push(now, 0, 0, &[1; 100]));
        assert!(!q.push(now, 0, 1, &[2; 100]));
        assert_eq!((q.received, q.dropped), (2, 1));
        assert_eq!(q.pop().unwrap(), [1; 100]);
        assert!(
            q.push(now, 0, 2, &[3; 100]),
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
        assert!(q.push(t0, 0, 0, &[0]));
        assert!(!q.push(t0, 0, 2, &[2]), "held for 1");
        assert!(!q.push(t0 + ms(1), 0, 3, &[3]));
        assert_eq!(take(&mut q), [0]);
        assert!(q.push(t0 + ms(2), 0, 1, &[1]), "1 arrives: 1, 2, 3 go");
        assert_eq!(take(&mut q), [1, 2, 3]);
        assert_eq!(q.release_deadline(&only(ms(5))), None);
        // 4 is lost: 5 and 6 wait 5 ms for it, then go
        assert!(!q.push(t0 + ms(10), 0, 5, &[5]));
        assert!(!q.push(t0 + ms(11), 0, 6, &[6]));
        assert_eq!(q.release_deadline(&only(ms(5))), Some(t0 + ms(15)));
        assert!(!q.release_due(t0 + ms(14), &only(ms(5))));
        assert!(q.release_due(t0 + ms(15), &only(ms(5))));
        assert_eq!(take(&mut q), [5, 6]);
        // 4 arrives after all: late, but delivered
        assert!(q.push(t0 + ms(20), 0, 4, &[4]));
        assert_eq!(take(&mut q), [4]);
        assert!(q.push(t0 + ms(21), 0, 7, &[7]));
        assert_eq!(take(&mut q), [7]);
        assert_eq!((q.received, q.reordered), (8, 4));
    }

    #[test]
    fn a_datagram_missing_on_a_quiet_link_is_waited_for_until_the_failure_is_repaired() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let rule = HoldRule {
            base: ms(5),
            failure_waits: [ms(25), ms(25)].into_iter().collect(),
            resumed: None,
        };
        let order = |q: &mut IncomingDatagrams| -> Vec<u8> {
            std::iter::from_fn(|| q.pop()).map(|d| d[0]).collect()
        };
        let mut q = IncomingDatagrams::new(1 << 20, ms(5));
        assert!(q.push(t0, 0, 0, &[0]));
        // 1 and 2 went on link 0, 3 on the faster link 1; link 0's switch died after it
        // delivered 1, with 2 on it
        assert!(!q.push(t0 + ms(1), 1, 3, &[3]));
        assert!(q.push(t0 + ms(2), 0, 1, &[1]));
        // link 0 delivered nothing sent after 2: it may be stranded there, and comes again
        // once the sender declared the failure, 25 ms after link 0's last delivery
        assert_eq!(q.release_deadline(&rule), Some(t0 + ms(27)));
        assert!(!q.push(t0 + ms(2), 1, 5, &[5]), "link 1 goes on");
        assert!(
            !q.release_due(t0 + ms(26), &rule),
            "held past the base hold"
        );
        assert!(q.push(t0 + ms(20), 1, 2, &[2]), "2 comes again over link 1");
        assert_eq!(order(&mut q), [0, 1, 2, 3]);
        // 4 is missing: had it been stranded on link 0 with 2, it would come after 2 in the
        // repair over link 1, so 5 waits while that repair may go on
        assert_eq!(q.release_deadline(&rule), Some(t0 + ms(45)));
        // link 1 delivers 7, sent after the repair, and link 0 (alive after all) 6: 4 is in
        // flight nowhere, and 5 waits only the base hold from its arrival
        assert!(!q.push(t0 + ms(21), 1, 7, &[7]));
        assert!(!q.push(t0 + ms(21), 0, 6, &[6]));
        assert_eq!(q.release_deadline(&rule), Some(t0 + ms(7)));
        assert!(q.release_due(t0 + ms(21), &rule));
        assert_eq!(order(&mut q), [5, 6, 7]);
        // a link quiet for longer than its repair time is not waited for
        assert!(!q.push(t0 + ms(100), 1, 9, &[9]));
        assert_eq!(q.release_deadline(&rule), Some(t0 + ms(105)));
        assert!(q.release_due(t0 + ms(105), &rule));
        assert_eq!(order(&mut q), [9]);

        // an outage of every link: the peer is heard again at t1, and what was held before
        // waits for its links to come back and send what was stranded on them
        assert!(!q.push(t0 + ms(130), 1, 11, &[11]));
        let t1 = t0 + ms(60_000);
        let resumed = HoldRule {
            resumed: Some((t1, ms(65))),
            ..rule.clone()
        };
        assert_eq!(q.release_deadline(&resumed), Some(t1 + ms(65)));
        assert!(
            q.push(t1 + ms(40), 0, 10, &[10]),
            "the stranded one comes first"
        );
        assert_eq!(order(&mut q), [10, 11]);
        // one held after the peer was heard again has the usual hold
        assert!(!q.push(t1 + ms(50), 0, 13, &[13]));
        assert_eq!(q.release_deadline(&resumed), Some(t1 + ms(55)));
    }

    #[test]
    fn the_datagram_held_longest_sets_the_deadline_whatever_its_number() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut q = IncomingDatagrams::new(1 << 20, ms(5));
        assert!(q.push(t0, 0, 0, &[0]));
        // 5 arrives first, then 3 (over another link); 1, 2 and 4 are missing
        assert!(!q.push(t0 + ms(1), 0, 5, &[5]));
        assert!(!q.push(t0 + ms(3), 0, 3, &[3]));
        assert_eq!(
            q.release_deadline(&only(ms(5))),
            Some(t0 + ms(6)),
            "5's hold"
        );
        // 1 and 2 arrive: 3 goes with them; 5 still waits for 4, since its own arrival
        assert!(!q.push(t0 + ms(4), 0, 2, &[2]));
        assert!(q.push(t0 + ms(4), 0, 1, &[1]));
        assert_eq!(q.release_deadline(&only(ms(5))), Some(t0 + ms(6)));
        assert!(q.release_due(t0 + ms(6), &only(ms(5))), "4 given up on");
        assert_eq!(q.release_deadline(&only(ms(5))), None);
        let order: Vec<u8> = std::iter::from_fn(|| q.pop()).map(|d| d[0]).collect();
        assert_eq!(order, [0, 1, 2, 3, 5]);
    }

    #[test]
    fn pairs_in_reverse_order_behind_one_held_far_ahead_leave_no_trace() {
        // a peer holds the front back (one datagram far ahead, never its predecessors) and
        // sends pairs the wrong way round: each pair's first is held and delivered with the
        // second; what recorded its hold must not stay behind the front one
        let t0 = Instant::now();
        let mut q = IncomingDatagrams::new(1 << 20, Duration::from_millis(5));
        assert!(!q.push(t0, 0, 1_000_000, &[1]));
        let pairs = 20_000;
        for i in 0..pairs {
            let now = t0 + Duration::from_micros(i);
            assert!(!q.push(now, 0, 2 * i + 1, &[2]));
            assert!(q.push(now, 0, 2 * i, &[3]));
            while q.pop().is_some() {}
        }
        assert_eq!(q.waiting(), (1, 0), "the one far ahead alone is held");
        assert_eq!(q.received, 2 * pairs);
        assert!(
            q.held_since.len() <= 2 + HELD_SINCE_SLACK,
            "{} hold records for 1 datagram held",
            q.held_since.len()
        );
        assert_eq!(q.held_since.front().map(|&(_, seq)| seq), Some(1_000_000));
    }

    #[test]
    fn a_datagram_is_delivered_at_most_once_and_a_late_one_once() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        for hold in [ms(5), Duration::ZERO] {
            let mut q = IncomingDatagrams::new(1 << 20, hold);
            assert!(q.push(t0, 0, 0, &[0]));
            assert!(!q.push(t0, 0, 0, &[0]), "a second copy of the next one");
            q.push(t0, 0, 3, &[3]);
            assert!(!q.push(t0, 0, 3, &[3]), "a second copy of a held one");
            q.release_due(t0 + ms(10), &only(hold));
            // 1 and 2 were given up on; sent again after a link failure, each comes once
            assert!(q.push(t0 + ms(20), 0, 2, &[2]));
            assert!(!q.push(t0 + ms(20), 0, 2, &[2]));
            assert!(q.push(t0 + ms(21), 0, 1, &[1]));
            assert!(!q.push(t0 + ms(21), 0, 0, &[0]), "long delivered");
            let got: Vec<u8> = std::iter::from_fn(|| q.pop()).map(|d| d[0]).collect();
            assert_eq!(got, [0, 3, 2, 1], "hold {hold:?}");
            assert_eq!(q.duplicates, 4);
        }
    }

    /// Pieces in flight on a link that failed come again once the sender has declared the
    /// failure, which can be after the receiver's hold ran out (the sender's probe timeout
    /// longer than the receiver reckoned). Before, the datagrams they belonged to were lost
    /// (a 64 KB inner TCP segment each in a tunnel, whose flow then waited for its timeout);
    /// now the late pieces complete them, once, and they are handed over late, as a whole
    /// datagram given up on is when it comes.
    #[test]
    fn a_datagram_that_lost_pieces_to_a_hold_is_completed_by_them_late() {
        use DatagramPart::*;
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut q = IncomingDatagrams::new(1 << 20, ms(5));
        // A in pieces 0..=5 and B in 6..=8; 2, 4 (A's) and 6 (B's first) were on the link
        // that failed, and C (9, whole) came after them
        for (seq, part) in [(0, First), (1, Middle), (3, Middle), (5, Last), (7, Middle)] {
            q.push_piece(t0, 0, seq, part, &[seq as u8; 100]);
        }
        q.push_piece(t0, 0, 8, Last, &[8; 100]);
        q.push_piece(t0, 0, 9, Whole, b"C");
        assert!(q.release_due(t0 + ms(5), &only(ms(5))));
        assert_eq!(q.pop().unwrap(), b"C");
        assert_eq!(q.pop(), None, "A and B are incomplete");
        // the sender declares the failure and sends them again, in order
        assert!(!q.push_piece(t0 + ms(30), 1, 2, Middle, &[2; 100]));
        assert!(
            q.push_piece(t0 + ms(30), 1, 4, Middle, &[4; 100]),
            "A is complete"
        );
        let a: Vec<u8> = (0..=5).flat_map(|k| [k as u8; 100]).collect();
        assert_eq!(q.pop().unwrap(), a);
        assert!(q.push_piece(t0 + ms(30), 1, 6, First, &[6; 100]), "B too");
        let b: Vec<u8> = (6..=8).flat_map(|k| [k as u8; 100]).collect();
        assert_eq!(q.pop().unwrap(), b);
        // second copies of the late pieces complete nothing again
        assert!(!q.push_piece(t0 + ms(31), 0, 4, Middle, &[4; 100]));
        assert!(!q.push_piece(t0 + ms(31), 0, 6, First, &[6; 100]));
        assert_eq!(q.pop(), None);
        assert_eq!((q.received, q.dropped, q.duplicates), (3, 0, 2));
        assert_eq!(q.bytes, 0, "nothing kept");
    }

    /// After a piece dropped for the limit, only the piece that continues its datagram is
    /// dropped with it: the pieces after a gap may be another datagram's, whose earlier
    /// pieces come late. Before, every piece up to the next datagram's start was dropped, and
    /// that datagram was lost although each of its pieces arrived.
    #[test]
    fn after_a_piece_dropped_for_the_limit_the_next_datagram_s_pieces_are_kept() {
        use DatagramPart::*;
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        for hold in [ms(5), Duration::ZERO] {
            // room for two 100-byte frames
            let mut q = IncomingDatagrams::new(400, hold);
            assert!(q.push(t0, 0, 0, &[0; 100]));
            assert!(q.push(t0, 0, 1, &[1; 100]));
            q.push_piece(t0, 0, 2, First, &[2; 100]);
            assert_eq!((q.received, q.dropped), (3, 1), "2 dropped for the limit");
            while q.pop().is_some() {}
            // 2's datagram is 2..=3; the next one, 4..=5, comes out of order
            q.push_piece(t0, 1, 5, Last, &[5; 100]);
            q.release_due(t0 + ms(10), &only(hold));
            assert!(!q.push_piece(t0 + ms(20), 0, 3, Last, &[3; 100]));
            assert!(
                q.push_piece(t0 + ms(20), 0, 4, First, &[4; 100]),
                "{hold:?}"
            );
            assert_eq!(q.pop().unwrap(), [[4u8; 100], [5; 100]].concat());
            assert_eq!(q.pop(), None);
            assert_eq!((q.received, q.dropped), (4, 1), "{hold:?}");
        }
    }

    /// A datagram being joined that loses its next piece is over once a frame that does not
    /// continue it is delivered: it waits as unfinished, and room is made from it first.
    /// Before, it kept its memory until a datagram started, and where that memory and one
    /// datagram exceeded the bound, every whole datagram after it was dropped; nor was it
    /// let go at the close.
    #[test]
    fn a_datagram_that_lost_its_next_piece_gives_up_its_room() {
        use DatagramPart::*;
        let t0 = Instant::now();
        let mut q = IncomingDatagrams::new(4096, Duration::from_millis(5));
        q.push_piece(t0, 0, 0, First, &[0; 1400]);
        q.push_piece(t0, 0, 1, Middle, &[1; 1400]);
        // 2, its last piece, is lost; whole datagrams follow, each read at once
        let mut delivered = 0;
        for seq in 3..50 {
            q.push_piece(t0, 0, seq, Whole, &[seq as u8; 1400]);
            while q.pop().is_some() {
                delivered += 1;
            }
        }
        // the last ones wait for 2 until the hold runs out
        q.release_due(
            t0 + Duration::from_millis(5),
            &only(Duration::from_millis(5)),
        );
        while q.pop().is_some() {
            delivered += 1;
        }
        // 5 came while 3 and 4 waited for 2, and the bound holds two of them: it alone is
        // dropped, with the incomplete one (before, all 47 were)
        assert_eq!(delivered, 46);
        assert_eq!((q.received, q.dropped), (48, 2));
        assert_eq!(q.bytes, 0);

        // at the close, a datagram still being joined is let go and counted
        let mut q = IncomingDatagrams::new(1 << 20, Duration::from_millis(5));
        q.push_piece(t0, 0, 0, First, &[0; 1400]);
        q.push_piece(t0, 0, 1, Middle, &[1; 1400]);
        assert!(!q.release_all());
        assert_eq!((q.received, q.dropped, q.bytes), (1, 1, 0));
    }

    /// Unfinished pieces wait through a silence of any length (what was stranded on the
    /// links of an outage comes first at the heal), but not past their patience while frames
    /// go on arriving: then their datagram counts as dropped, once, and their memory is free.
    #[test]
    fn unfinished_pieces_wait_through_a_silence_but_not_past_their_patience() {
        use DatagramPart::*;
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let given_up_on_3 = |q: &mut IncomingDatagrams| {
            for seq in [0, 1, 2] {
                let part = [First, Middle, Middle][seq as usize];
                q.push_piece(t0, 0, seq, part, &[seq as u8; 100]);
            }
            q.push_piece(t0, 0, 4, Last, &[4; 100]);
            q.push_piece(t0, 0, 5, Whole, b"next");
            assert!(q.release_due(t0 + ms(5), &only(ms(5))));
            assert_eq!(q.pop().unwrap(), b"next");
        };
        // every link down for a minute: the missing piece comes first at the heal
        let mut q = IncomingDatagrams::new(1 << 20, ms(5));
        given_up_on_3(&mut q);
        assert!(q.push_piece(t0 + Duration::from_secs(60), 1, 3, Middle, &[3; 100]));
        assert_eq!(q.pop().unwrap().len(), 500);
        // frames arriving all the while: the pieces are let go after their patience
        let mut q = IncomingDatagrams::new(1 << 20, ms(5));
        given_up_on_3(&mut q);
        let mut t = t0 + ms(5);
        let mut seq = 6;
        while t < t0 + UNFINISHED_PATIENCE + ms(20) {
            t += ms(10);
            assert!(q.push_piece(t, 0, seq, Whole, b"on"));
            seq += 1;
        }
        // "next", those that went on arriving, and the one let go
        let on = seq - 6;
        assert_eq!(
            (q.dropped, q.received),
            (1, 1 + on + 1),
            "one datagram let go"
        );
        // the missing piece, too late: its datagram was counted already, and it is not
        // kept (before, it waited alone and was counted again at the close)
        let kept = q.bytes;
        assert!(!q.push_piece(t, 1, 3, Middle, &[3; 100]), "too late");
        assert_eq!(q.bytes, kept, "the late piece is not kept");
        while q.pop().is_some() {}
        q.release_all();
        assert_eq!(q.bytes, 0);
        assert_eq!((q.dropped, q.received), (1, 1 + on + 1), "counted once");
    }

    /// Unfinished pieces count against the receive limit, and are let go first when an
    /// arrival needs room: a stream of datagrams that lose pieces does not push out the
    /// datagrams that arrive whole.
    #[test]
    fn unfinished_pieces_make_room_for_arrivals_first() {
        use DatagramPart::*;
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let limit = 16 << 10;
        let mut q = IncomingDatagrams::new(limit, ms(5));
        let mut seq = 0;
        let mut whole = 0;
        for k in 0..200u32 {
            let t = t0 + ms(k as u64);
            // a datagram of 4 pieces of 1000 bytes whose third piece is missing, then a
            // whole one
            for (i, part) in [First, Middle, Middle, Last].into_iter().enumerate() {
                if i != 2 {
                    q.push_piece(t, 0, seq + i as u64, part, &[k as u8; 1000]);
                }
            }
            q.push_piece(t, 0, seq + 4, Whole, &k.to_le_bytes());
            seq += 5;
            q.release_due(t + ms(5), &only(ms(5)));
            while let Some(d) = q.pop() {
                assert_eq!(d, k.to_le_bytes(), "only the whole ones are handed over");
                whole += 1;
            }
            assert!(q.bytes <= limit, "{} bytes charged", q.bytes);
        }
        assert_eq!(whole, 200);
        assert!(q.dropped > 150, "{} let go for room", q.dropped);
        q.release_all();
        assert_eq!((q.received, q.dropped, q.bytes), (400, 200, 0));
    }

    /// A datagram whose arrival finds the receive buffer full makes room by giving up on
    /// what the held pieces after it wait for: it is then delivered once (a second copy is
    /// a duplicate), and a first piece arriving so becomes no datagram of its own.
    #[test]
    fn a_frame_that_makes_room_by_giving_up_on_held_pieces_is_delivered_once_and_whole() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // pieces 2 and 3 of a datagram whose first piece (1) is missing wait for it; each
        // 100-byte frame costs 164 bytes of the 400
        let mut q = IncomingDatagrams::new(400, ms(5));
        q.push_piece(t0, 1, 2, DatagramPart::Middle, &[2; 100]);
        q.push_piece(t0, 1, 3, DatagramPart::Last, &[3; 100]);
        assert!(q.push(t0, 0, 0, &[9; 100]));
        assert_eq!(q.pop().as_deref(), Some(&[9; 100][..]));
        assert_eq!(q.pop(), None);
        assert!(
            !q.push(t0 + ms(20), 1, 0, &[9; 100]),
            "a second copy delivered"
        );
        assert_eq!(q.pop(), None);
        // the same with a datagram in pieces: its first piece arrives last
        let mut q = IncomingDatagrams::new(400, ms(5));
        q.push_piece(t0, 1, 1, DatagramPart::Middle, &[2; 100]);
        q.push_piece(t0, 1, 2, DatagramPart::Last, &[3; 100]);
        q.push_piece(t0, 0, 0, DatagramPart::First, &[1; 100]);
        assert_eq!(q.pop(), None, "a piece handed over as a datagram");
        assert_eq!((q.received, q.dropped), (1, 1));
    }

    /// Late datagrams taken out of one long run given up on, every other number (a faulty or
    /// hostile peer's), leave at most `SKIPPED_RUNS` runs remembered: before, each split the
    /// run and added one, for the connection's life.
    #[test]
    fn late_datagrams_below_a_jump_do_not_grow_what_is_remembered() {
        let t0 = Instant::now();
        let mut q = IncomingDatagrams::new(1 << 20, Duration::ZERO);
        assert!(q.push(t0, 0, 1 << 30, &[]));
        assert_eq!(
            q.skipped.range_count(),
            1,
            "the premise: one run below the jump"
        );
        for k in 0..3 * SKIPPED_RUNS as u64 {
            assert!(q.push(t0, 0, 2 * k + 1, &[]), "late datagram {}", 2 * k + 1);
            assert!(q.pop().is_some());
        }
        assert!(
            q.skipped.range_count() <= SKIPPED_RUNS,
            "{} runs remembered",
            q.skipped.range_count()
        );
    }

    /// Numbers that jump far ahead (a faulty peer's, or a long run lost) are remembered as
    /// one run, however many they skip: the datagrams below still arrive late, once.
    #[test]
    fn a_jump_of_the_numbers_is_remembered_as_one_run() {
        let t0 = Instant::now();
        let mut q = IncomingDatagrams::new(1 << 20, Duration::ZERO);
        for k in 1..=240u64 {
            q.push(t0, 0, k << 14, &[]);
        }
        assert!(q.push(t0, 0, 1 << 62, &[1]));
        assert!(
            q.skipped.range_count() <= 241,
            "{}",
            q.skipped.range_count()
        );
        assert!(
            q.push(t0, 0, 5, &[5]),
            "a datagram below the jump was black-holed"
        );
        assert!(!q.push(t0, 0, 5, &[5]));
        assert_eq!(q.duplicates, 1);
    }

    #[test]
    fn without_a_hold_datagrams_go_as_they_arrive() {
        let now = Instant::now();
        let mut q = IncomingDatagrams::new(1 << 20, Duration::ZERO);
        assert!(q.push(now, 0, 2, &[2]));
        assert!(q.push(now, 0, 0, &[0]));
        assert_eq!(
            std::iter::from_fn(|| q.pop())
                .map(|d| d[0])
                .collect::<Vec<_>>(),
            [2, 0]
        );
        // a datagram whose pieces come out of order is joined all the same
        use DatagramPart::*;
        assert!(!q.push_piece(now, 0, 3, First, b"a"));
        assert!(!q.push_piece(now, 1, 5, Last, b"c"));
        assert!(q.push_piece(now, 0, 4, Middle, b"b"));
        assert_eq!(q.pop().unwrap(), b"abc");
        assert_eq!((q.received, q.dropped, q.bytes), (3, 0, 0));
    }

    /// The next number of a xorshift sequence: the random tests' scenarios, each from its seed.
    fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    fn numbered_datagram(id: u32, len: usize) -> Vec<u8> {
        let mut d: Vec<u8> = (0..len)
            .map(|i| (i as u32).wrapping_mul(31).wrapping_add(id) as u8)
            .collect();
        for (i, b) in id.to_le_bytes().iter().enumerate() {
            if i < d.len() {
                d[i] = *b;
            }
        }
        d
    }

    /// Random sender output, reordered, lost and duplicated: every datagram delivered is one
    /// sent, unaltered, at most once; the memory charged stays within the limit and is zero
    /// at the end; received == delivered + dropped.
    #[test]
    fn random_pieces_over_three_links_are_delivered_unaltered_once() {
        let t0 = Instant::now();
        for seed in 1..300u64 {
            let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
            let mut tx = OutgoingDatagrams::new(1 << 24, Duration::from_secs(100));
            let mut sent = Vec::new();
            let n = 30 + xorshift(&mut s) % 50;
            for id in 0..n as u32 {
                let len = match xorshift(&mut s) % 4 {
                    0 => (xorshift(&mut s) % 100) as usize,
                    1 => (xorshift(&mut s) % 3000) as usize,
                    2 => (xorshift(&mut s) % 20000) as usize,
                    _ => wire::MAX_DATAGRAM_LEN - (xorshift(&mut s) % 3) as usize,
                };
                let len = len.max(4);
                let d = numbered_datagram(id, len);
                tx.push(t0, &d);
                sent.push(d);
            }
            let mut frames = Vec::new();
            while !tx.is_empty() {
                let room = 8 + (xorshift(&mut s) % 1430) as usize;
                while let Some(p) = tx.pop(t0, room.min(BOUNDS.piece_room), BOUNDS) {
                    frames.push(p);
                    if xorshift(&mut s).is_multiple_of(2) {
                        break;
                    }
                }
            }
            // deliver: shuffle within a window, lose some, duplicate some
            let mut order: Vec<(u64, usize)> = frames
                .iter()
                .enumerate()
                .map(|(i, _)| (i as u64 * 10 + xorshift(&mut s) % 40, i))
                .collect();
            let mut dups: Vec<(u64, usize)> = Vec::new();
            for i in 0..frames.len() {
                if xorshift(&mut s).is_multiple_of(20) {
                    dups.push((i as u64 * 10 + xorshift(&mut s) % 400, i));
                }
            }
            order.extend(dups);
            order.sort();
            let lossy = seed % 3 != 0;
            let limit = if seed % 5 == 0 { 200_000 } else { 4 << 20 };
            let hold = if seed % 2 == 0 {
                Duration::ZERO
            } else {
                Duration::from_millis(5)
            };
            let mut rx = IncomingDatagrams::new(limit, hold);
            let mut got: Vec<Vec<u8>> = Vec::new();
            for (k, &(at, i)) in order.iter().enumerate() {
                if lossy && xorshift(&mut s).is_multiple_of(25) {
                    continue;
                }
                let now = t0 + Duration::from_micros(at * 20);
                let p = &frames[i];
                let link = (xorshift(&mut s) % 3) as usize;
                rx.push_piece(now, link, p.seq, p.part, &p.data);
                assert!(
                    rx.bytes <= limit + 70_000,
                    "seed {seed}: {} charged",
                    rx.bytes
                );
                rx.release_due(now, &only(hold));
                if k % 7 == 0 {
                    got.extend(std::iter::from_fn(|| rx.pop()));
                }
            }
            rx.release_all();
            got.extend(std::iter::from_fn(|| rx.pop()));
            assert_eq!(rx.bytes, 0, "seed {seed}");
            let mut seen = std::collections::HashSet::new();
            for d in &got {
                assert!(d.len() >= 4, "seed {seed}: short datagram {}", d.len());
                let id = u32::from_le_bytes(d[..4].try_into().unwrap());
                assert!((id as usize) < sent.len(), "seed {seed}: unknown id {id}");
                assert!(
                    d == &sent[id as usize],
                    "seed {seed}: datagram {id} altered (len {} vs {})",
                    d.len(),
                    sent[id as usize].len()
                );
                assert!(
                    seen.insert(id),
                    "seed {seed}: datagram {id} delivered twice"
                );
            }
            if seed % 3 == 0 {
                // nothing lost: only the limit drops
                if limit > 1 << 20 {
                    assert_eq!(
                        got.len(),
                        sent.len(),
                        "seed {seed}: {} of {}",
                        got.len(),
                        sent.len()
                    );
                    if !hold.is_zero() {
                        let ids: Vec<u32> = got
                            .iter()
                            .map(|d| u32::from_le_bytes(d[..4].try_into().unwrap()))
                            .collect();
                        assert!(
                            ids.windows(2).all(|w| w[0] < w[1]),
                            "seed {seed}: order {ids:?}"
                        );
                    }
                }
            }
            assert_eq!(
                rx.received,
                got.len() as u64 + rx.dropped,
                "seed {seed}: received {} got {} dropped {}",
                rx.received,
                got.len(),
                rx.dropped
            );
            assert!(
                rx.received <= sent.len() as u64,
                "seed {seed}: received {} of {} sent",
                rx.received,
                sent.len()
            );
        }
    }

    /// Hostile frames (any number near `next`, any part, sizes up to a packet): no panic, the
    /// memory charged stays near the limit, nothing is held at the end.
    #[test]
    fn hostile_frames_are_bounded() {
        use DatagramPart::*;
        let t0 = Instant::now();
        let mut worst = (0usize, 0u64, 0usize, 0usize, Whole);
        for seed in 1..400u64 {
            let mut s = seed.wrapping_mul(0x2545F4914F6CDD1D) | 1;
            let limit = [4096usize, 50_000, 1 << 20][(seed % 3) as usize];
            let hold = if seed % 2 == 0 {
                Duration::ZERO
            } else {
                Duration::from_millis(5)
            };
            let mut rx = IncomingDatagrams::new(limit, hold);
            let mut base = 0u64;
            let mut t = t0;
            let mut peak = 0;
            for _ in 0..3000 {
                t += Duration::from_micros(xorshift(&mut s) % 3000);
                let r = xorshift(&mut s);
                let seq = match r % 8 {
                    0 => xorshift(&mut s) % (1 << 62),
                    1 => base.saturating_sub(xorshift(&mut s) % 50),
                    _ => base + xorshift(&mut s) % 30,
                };
                if r.is_multiple_of(11) {
                    base += 1 + xorshift(&mut s) % 5;
                }
                let part = [Whole, First, Middle, Last][(xorshift(&mut s) % 4) as usize];
                let len = match xorshift(&mut s) % 3 {
                    0 => 0,
                    1 => (xorshift(&mut s) % 100) as usize,
                    _ => (xorshift(&mut s) % 16000) as usize,
                };
                let data = vec![7u8; len];
                rx.push_piece(t, (xorshift(&mut s) % 4) as usize, seq, part, &data);
                rx.release_due(t, &only(hold));
                peak = peak.max(rx.bytes);
                if rx.bytes > limit + worst.0 {
                    worst = (rx.bytes - limit, seed, limit, len, part);
                }
                if xorshift(&mut s).is_multiple_of(5) {
                    while rx.pop().is_some() {}
                }
                assert!(rx.held_since.len() <= 2 * rx.held.len() + HELD_SINCE_SLACK + 1);
                assert!(rx.skipped.range_count() <= SKIPPED_RUNS);
            }
            rx.release_all();
            while let Some(d) = rx.pop() {
                assert!(
                    d.len() <= wire::MAX_DATAGRAM_LEN,
                    "seed {seed}: {} bytes",
                    d.len()
                );
            }
            assert_eq!(rx.bytes, 0, "seed {seed}");
            assert!(rx.held.is_empty() && rx.unfinished.is_empty() && rx.joining.is_none());
        }
        assert!(worst.0 <= 16 << 10, "worst overshoot {worst:?}");
    }

    /// A receiver holding 5 ms: datagram A (frames 0..=2) lost its last piece, C (3) came
    /// whole; at `t0` + 5 ms the hold gave up on 2 and delivered C.
    fn a_without_its_last_piece_then_c(t0: Instant) -> IncomingDatagrams {
        use DatagramPart::*;
        let ms = Duration::from_millis;
        let mut q = IncomingDatagrams::new(1 << 20, ms(5));
        q.push_piece(t0, 0, 0, First, &[0; 100]);
        q.push_piece(t0, 0, 1, Middle, &[1; 100]);
        q.push_piece(t0, 0, 3, Whole, b"C");
        q.release_due(t0 + ms(5), &only(ms(5)));
        q
    }

    /// Two datagrams in pieces that each lose a piece, with a whole datagram delivered
    /// between them (so the second's pieces cannot be the first's rest): both count as
    /// dropped. Before, pieces let go after others that did not end their datagram were
    /// always taken for its rest: only the first counted.
    #[test]
    fn two_datagrams_that_lose_pieces_both_count_as_dropped() {
        use DatagramPart::*;
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut q = a_without_its_last_piece_then_c(t0);
        assert_eq!(q.pop().unwrap(), b"C");
        // B = 4..=5, its first piece (4) lost; D = 6, whole
        q.push_piece(t0 + ms(6), 0, 5, Last, &[5; 100]);
        q.push_piece(t0 + ms(6), 0, 6, Whole, b"D");
        q.release_due(t0 + ms(11), &only(ms(5)));
        assert_eq!(q.pop().unwrap(), b"D");
        q.release_all();
        assert_eq!(q.pop(), None);
        // C and D delivered, A and B dropped
        assert_eq!((q.received, q.dropped), (4, 2), "(received, dropped)");
    }

    /// The same with the two let go far apart in time (A for its patience, B at the close),
    /// whole datagrams arriving between them.
    #[test]
    fn a_loss_long_after_another_is_counted_on_its_own() {
        use DatagramPart::*;
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut q = a_without_its_last_piece_then_c(t0);
        // whole datagrams go on arriving for 2 s: A is let go for its patience
        let mut seq = 4;
        let mut t = t0 + ms(5);
        while t < t0 + Duration::from_secs(2) {
            t += ms(10);
            q.push_piece(t, 0, seq, Whole, b"x");
            seq += 1;
        }
        while q.pop().is_some() {}
        let (r, d) = (q.received, q.dropped);
        assert_eq!(d, 1, "A let go");
        // B = seq..=seq+1, its first piece lost; then E, whole
        q.push_piece(t, 0, seq + 1, Last, &[5; 100]);
        q.push_piece(t, 0, seq + 2, Whole, b"E");
        q.release_due(t + ms(5), &only(ms(5)));
        assert_eq!(q.pop().unwrap(), b"E");
        q.release_all();
        assert_eq!(
            (q.received - r, q.dropped - d),
            (2, 1),
            "E received, B dropped"
        );
    }

    /// A whole datagram dropped for the limit while held ahead of a missing one, whose
    /// second copy (sent again after a link failure) then arrives: as when it is dropped in
    /// order, it is counted once, and a second copy is a duplicate. Before, `next` passing it
    /// took it for given up on: the copy was delivered and counted again.
    #[test]
    fn a_datagram_dropped_ahead_for_the_limit_is_counted_once() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // room for two 100-byte frames
        let mut q = IncomingDatagrams::new(400, ms(5));
        assert!(q.push(t0, 0, 0, &[0; 100]));
        assert!(q.push(t0, 0, 1, &[1; 100]));
        // 2 missing; 3 arrives ahead and finds no room
        assert!(!q.push(t0, 1, 3, &[3; 100]));
        assert_eq!((q.received, q.dropped), (3, 1));
        while q.pop().is_some() {}
        q.push(t0, 0, 4, &[4; 100]);
        q.release_due(t0 + ms(5), &only(ms(5)));
        while q.pop().is_some() {}
        // a second copy of 3
        q.push(t0 + ms(30), 1, 3, &[3; 100]);
        assert_eq!(q.pop(), None, "the second copy of 3 was delivered");
        assert_eq!(
            q.received, 4,
            "received for 4 datagrams (dropped {}, duplicates {})",
            q.dropped, q.duplicates
        );
    }
}
