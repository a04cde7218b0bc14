//! The two ordered streams of a connection: their send buffers (with acknowledgement and
//! retransmission bookkeeping) and receive buffers (reassembly and flow control).
//!
//! Stream 0 carries the byte stream; stream 1 carries whole messages, each prefixed by its
//! length as a varint. Both are reliable and ordered; loss is repaired by re-sending byte
//! ranges, on whichever link is healthy, so the streams know nothing of links.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::ranges::RangeSet;

/// Size of the pieces small writes are gathered in (and of the receive side's blocks).
pub const BLOCK: usize = 64 * 1024;
/// Smallest buffer [`SendStream::write_buf`] takes over whole instead of copying.
const MIN_TAKEN: usize = 16 * 1024;

/// The memory of `b`, emptied, if nothing else holds it (else `b` back): a buffer handed
/// out whole can be filled again without a new allocation, and emptying it first means
/// nothing is moved to the start of its memory.
pub fn reclaim(b: Bytes) -> Result<Vec<u8>, Bytes> {
    // (emptied as a `BytesMut`: emptying a `Bytes` that holds a whole `Vec` lets go of it)
    b.try_into_mut().map(|mut m| {
        m.clear();
        Vec::from(m)
    })
}

/// Send side of one stream.
///
/// The bytes wait in the pieces the application handed over: [`write_buf`] takes a whole
/// buffer without copying it (and gives back a spare one), [`write_bytes`] shares one, and
/// [`write`] copies small writes into a piece of [`BLOCK`] bytes. The only copy of the payload
/// in user space is then the one into the outgoing datagram. A piece does not change once
/// bytes of it are sent, so a driver whose other threads send can take the datagrams' bytes
/// from it instead ([`payload`]).
///
/// [`write_buf`]: Self::write_buf
/// [`write_bytes`]: Self::write_bytes
/// [`write`]: Self::write
/// [`payload`]: Self::payload
#[derive(Debug)]
pub(crate) struct SendStream {
    /// The bytes from `base` (or a little below: the front piece is freed once all of it is
    /// acknowledged) to `open_start`, each piece with its stream offset.
    pieces: VecDeque<(u64, Bytes)>,
    /// The bytes from `open_start` to `written`: small writes, in memory with room for more.
    /// They join `pieces` (staying where they are) once a chunk takes some of them, or before
    /// a buffer taken whole.
    open: BytesMut,
    open_start: u64,
    /// Freed pieces kept for the next exchanges or small writes, as long as they and the
    /// buffered bytes fit the send buffer's capacity: a writer that filled the buffer and saw
    /// it acknowledged in one go gets its memory back for the next fill instead of the
    /// allocator mapping (and the kernel zeroing) fresh pages for most of it.
    spares: Vec<Vec<u8>>,
    /// Memory the spares hold (their capacities).
    spare_bytes: usize,
    /// Every byte below it is acknowledged.
    base: u64,
    /// Offset one past the last byte the application wrote.
    written: u64,
    /// Lowest offset never sent.
    next_new: u64,
    /// Acknowledged ranges above `base`.
    acked: RangeSet,
    /// Ranges lost and waiting to be sent again.
    retransmit: RangeSet,
    /// The peer's flow-control limit.
    pub max_data: u64,
    /// Bytes the application may have outstanding.
    capacity: u64,
    finished: bool,
    /// Opportunistic retransmission's watch on the head (see [`SendStream::rescue_head`]).
    head: HeadWatch,
    /// The FIN must be (re)sent.
    fin_pending: bool,
    fin_acked: bool,
}

/// Where the head of a send stream was seen, since when, and whether its bytes were queued
/// again by opportunistic retransmission.
#[derive(Debug, Default)]
struct HeadWatch {
    base: u64,
    since: Option<Instant>,
    rescued: bool,
}

/// A piece of stream to put in a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub offset: u64,
    pub len: usize,
    pub fin: bool,
}

impl SendStream {
    pub fn new(capacity: u64, max_data: u64) -> Self {
        Self {
            pieces: VecDeque::new(),
            open: BytesMut::new(),
            open_start: 0,
            spares: Vec::new(),
            spare_bytes: 0,
            base: 0,
            written: 0,
            next_new: 0,
            acked: RangeSet::new(),
            retransmit: RangeSet::new(),
            max_data,
            capacity,
            finished: false,
            head: HeadWatch::default(),
            fin_pending: false,
            fin_acked: false,
        }
    }

    pub fn buffered(&self) -> u64 {
        self.written - self.base
    }

    /// Bytes the peer acknowledged: every offset below this one.
    pub fn acknowledged(&self) -> u64 {
        self.base
    }

    /// Bytes written that the peer has not acknowledged: [`Self::buffered`] less the ranges
    /// acknowledged above a gap.
    pub fn unacknowledged(&self) -> u64 {
        let above: u64 = self.acked.iter().map(|r| r.end - r.start).sum();
        self.buffered() - above
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn room(&self) -> u64 {
        self.capacity.saturating_sub(self.buffered())
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Appends as much of `data` as the buffer allows (copying it); returns how much.
    pub fn write(&mut self, data: &[u8]) -> usize {
        let n = (self.room() as usize).min(data.len());
        let mut rest = &data[..n];
        while !rest.is_empty() {
            // fill the open piece's spare capacity (never growing it: the start of its memory
            // may be sent already), else start a new one
            if self.open.len() == self.open.capacity() {
                self.close_open();
                let mut memory = self.take_spare();
                memory.reserve_exact(BLOCK);
                self.open = BytesMut::from(Bytes::from(memory));
            }
            let take = rest.len().min(self.open.capacity() - self.open.len());
            self.open.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            self.written += take as u64;
        }
        n
    }

    /// Makes the open piece's bytes a piece like the others, which no write changes again;
    /// the open piece keeps the rest of their memory.
    fn close_open(&mut self) {
        if !self.open.is_empty() {
            let bytes = self.open.split().freeze();
            self.pieces.push_back((self.open_start, bytes));
            self.open_start = self.written;
        }
    }

    /// Takes the bytes of `buf`: a buffer of at least [`MIN_TAKEN`] bytes is kept whole, with
    /// no copy, and `buf` receives an empty spare buffer in exchange (the memory of a piece
    /// already acknowledged, when there is one); a smaller one is copied and drained. Returns
    /// how many bytes were taken: 0 when the send buffer has no room for all of a large `buf`
    /// (it is taken whole or not at all, except into an empty buffer, so that a buffer larger
    /// than the capacity goes too).
    pub fn write_buf(&mut self, buf: &mut Vec<u8>) -> usize {
        if buf.len() < MIN_TAKEN {
            let n = self.write(buf);
            buf.drain(..n);
            return n;
        }
        let n = buf.len();
        if !self.takes_whole(n) {
            return 0;
        }
        let spare = self.take_spare();
        self.push_piece(Bytes::from(std::mem::replace(buf, spare)));
        n
    }

    /// Takes the bytes of `data` as [`Self::write_buf`] takes a buffer's, a large one (at
    /// least [`MIN_TAKEN`] bytes) shared rather than copied: a `Bytes` never changes, so the
    /// datagrams read it where it is until the peer acknowledged it. A caller sending the same
    /// memory over and over (a benchmark) or holding its data as `Bytes` already copies
    /// nothing.
    pub fn write_bytes(&mut self, data: &Bytes) -> usize {
        if data.len() < MIN_TAKEN {
            return self.write(data);
        }
        if !self.takes_whole(data.len()) {
            return 0;
        }
        self.push_piece(data.clone());
        data.len()
    }

    /// Whether a large buffer of `n` bytes is taken now: whole, so only when there is room for
    /// all of it, except into an empty send buffer (so that one larger than the capacity goes
    /// too).
    fn takes_whole(&self, n: usize) -> bool {
        n as u64 <= self.room() || self.buffered() == 0
    }

    /// Appends `piece` as it is, after the bytes written so far.
    fn push_piece(&mut self, piece: Bytes) {
        self.close_open();
        let n = piece.len() as u64;
        self.pieces.push_back((self.written, piece));
        self.written += n;
        self.open_start = self.written;
    }

    /// An empty buffer: a spare one if there is one.
    fn take_spare(&mut self) -> Vec<u8> {
        let mut spare = self.spares.pop().unwrap_or_default();
        self.spare_bytes -= spare.capacity();
        spare.clear();
        spare
    }

    /// Frees the pieces wholly below `base`, keeping for reuse those the send buffer's
    /// capacity has room for (see `spares`).
    fn free_acknowledged(&mut self) {
        while let Some((start, piece)) = self.pieces.front() {
            if start + piece.len() as u64 > self.base {
                break;
            }
            let (_, piece) = self.pieces.pop_front().expect("front exists");
            // (a datagram on its way may still refer to it: its memory goes when that does)
            let Ok(piece) = reclaim(piece) else {
                continue;
            };
            let kept = self.buffered() as usize + self.spare_bytes + piece.capacity();
            if kept <= self.capacity as usize {
                self.spare_bytes += piece.capacity();
                self.spares.push(piece);
            }
        }
    }

    pub fn finish(&mut self) {
        if !self.finished {
            self.finished = true;
            self.fin_pending = true;
        }
    }

    /// Everything written, and the end of stream, acknowledged.
    pub fn is_complete(&self) -> bool {
        self.finished && self.fin_acked && self.base == self.written
    }

    /// Whether a frame could be sent now (lost data, new data within the peer's limit, or FIN).
    pub fn wants_to_send(&self) -> bool {
        !self.retransmit.is_empty()
            || (self.next_new < self.written && self.next_new < self.max_data)
            || (self.fin_pending && self.next_new == self.written)
    }

    /// Whether data written waits for the peer's receive window alone: none of it is lost,
    /// and the window lets no more of it out.
    pub fn waits_for_peer_window(&self) -> bool {
        self.retransmit.is_empty() && self.next_new < self.written && self.next_new >= self.max_data
    }

    /// Whether no new data can go out because the peer's window or our send buffer is used
    /// up, and nothing lost waits to be sent again: both limits are held by the lowest
    /// unacknowledged bytes. Not while everything sent is acknowledged (a peer that reads
    /// slowly holds the window): no byte is stuck then. The buffer is used up when it has no
    /// room, or less than a waiting writer asked for (`writer_wants`: a message, or a large
    /// buffer taken only whole).
    fn head_blocks(&self, writer_wants: Option<u64>) -> bool {
        let flow_blocked = self.next_new < self.written && self.next_new >= self.max_data;
        let buffer_full =
            self.next_new == self.written && self.room() < writer_wants.unwrap_or(1).max(1);
        (flow_blocked || buffer_full) && self.retransmit.is_empty() && self.base < self.next_new
    }

    /// Opportunistic retransmission: when the head blocks the stream ([`Self::head_blocks`])
    /// and has not moved for `patience` (the time the quickest link takes to answer), its
    /// bytes are stuck behind a slow link. Queue up to `max` of them to be sent again (on the
    /// best link), once per position of the head. Returns whether anything was queued.
    ///
    /// A head that keeps moving is not stuck: with a window smaller than the links' bandwidth-
    /// delay product the stream is blocked most of the time while its bytes are merely in
    /// transit, and re-sending them at each acknowledgement sent most bytes twice.
    pub fn rescue_head(
        &mut self,
        max: u64,
        now: Instant,
        patience: Duration,
        writer_wants: Option<u64>,
    ) -> bool {
        if !self.head_blocks(writer_wants) {
            return false;
        }
        if self.head.base != self.base || self.head.since.is_none() {
            self.head = HeadWatch {
                base: self.base,
                since: Some(now),
                rescued: false,
            };
        }
        if self.head.rescued || self.head.since.is_some_and(|t| now < t + patience) {
            return false;
        }
        self.head.rescued = true;
        let end = self.next_new.min(self.base + max);
        let mut any = false;
        for gap in self.acked.gaps_in(self.base..end) {
            any |= self.retransmit.insert(gap);
        }
        any
    }

    /// When [`Self::rescue_head`] would queue the head, given `patience`: the stream is
    /// blocked by a head seen at its place and not re-sent yet.
    pub fn rescue_deadline(
        &self,
        patience: Duration,
        writer_wants: Option<u64>,
    ) -> Option<Instant> {
        let watched = self.head.base == self.base && !self.head.rescued;
        (watched && self.head_blocks(writer_wants))
            .then_some(self.head.since)
            .flatten()
            .map(|t| t + patience)
    }

    /// Takes the next piece to send, at most `max_len` bytes: lost data first, then new data.
    pub fn next_chunk(&mut self, max_len: usize) -> Option<Chunk> {
        while let Some(r) = self.retransmit.pop_front(max_len as u64) {
            // a late acknowledgement may have covered it meanwhile
            if r.end <= self.base || self.acked.contains_range(r.clone()) {
                continue;
            }
            let start = r.start.max(self.base);
            let fin = self.finished && r.end == self.written && self.fin_pending;
            if fin {
                self.fin_pending = false;
            }
            return Some(Chunk {
                offset: start,
                len: (r.end - start) as usize,
                fin,
            });
        }
        let limit = self.written.min(self.max_data);
        if self.next_new < limit || (self.fin_pending && self.next_new == self.written) {
            let len = (limit.saturating_sub(self.next_new)).min(max_len as u64);
            let offset = self.next_new;
            self.next_new += len;
            if self.next_new > self.open_start {
                self.close_open();
            }
            let fin = self.fin_pending && self.next_new == self.written;
            if fin {
                self.fin_pending = false;
            }
            if len == 0 && !fin {
                return None;
            }
            return Some(Chunk {
                offset,
                len: len as usize,
                fin,
            });
        }
        None
    }

    /// Copies the bytes of a chunk ([`next_chunk`](Self::next_chunk)) from `offset` on into
    /// `out` (they were written and not yet acknowledged).
    pub fn copy_out(&self, offset: u64, out: &mut [u8]) {
        self.payload(offset, out.len(), |at, piece, r| {
            out[at..at + r.len()].copy_from_slice(&piece[r]);
        });
    }

    /// Where the `len` bytes of a chunk from `offset` on are, without copying them: calls
    /// `f(at, piece, range)` for each piece they span, in order, with `at` the position in the
    /// chunk of `piece[range]`. A piece never changes, so a datagram can hold on to it (a
    /// clone of the `Bytes`) until it has left.
    pub fn payload(&self, offset: u64, len: usize, mut f: impl FnMut(usize, &Bytes, Range<usize>)) {
        if len == 0 {
            // a bare FIN: there may be no piece at all
            return;
        }
        // the piece holding `offset`: the last one starting at or below it (new data, the
        // usual case, is in the last piece, so look there before searching)
        let last = self.pieces.len() - 1;
        let mut i = if self.pieces[last].0 <= offset {
            last
        } else {
            self.pieces.partition_point(|(start, _)| *start <= offset) - 1
        };
        let mut at = (offset - self.pieces[i].0) as usize;
        let mut done = 0;
        while done < len {
            let piece = &self.pieces[i].1;
            let n = (piece.len() - at).min(len - done);
            f(done, piece, at..at + n);
            done += n;
            i += 1;
            at = 0;
        }
    }

    pub fn on_ack(&mut self, chunk: Chunk) {
        let end = chunk.offset + chunk.len as u64;
        if chunk.fin {
            self.fin_acked = true;
            self.fin_pending = false;
        }
        if end <= self.base {
            return;
        }
        self.retransmit.remove(chunk.offset..end);
        if chunk.offset > self.base {
            // ahead of a gap (striping: another link's packet is still on its way)
            self.acked.insert(chunk.offset..end);
            return;
        }
        // The oldest bytes: the acknowledged prefix grows by this chunk and by the ranges
        // acknowledged ahead that it now reaches (without entering the chunk into `acked`
        // first: with two links striped, every other chunk is such a gap filler).
        self.base = end;
        while self.acked.min().is_some_and(|s| s <= self.base) {
            let r = self.acked.pop_front(u64::MAX).expect("non-empty");
            self.base = self.base.max(r.end);
        }
        self.free_acknowledged();
    }

    pub fn on_lost(&mut self, chunk: Chunk) {
        let end = chunk.offset + chunk.len as u64;
        if chunk.fin && !self.fin_acked {
            // re-sent with the last data range, or alone when that range is not lost
            self.fin_pending = true;
        }
        for gap in self
            .acked
            .gaps_in(chunk.offset.max(self.base)..end.max(self.base))
        {
            self.retransmit.insert(gap);
        }
    }
}

/// The size of a stream's receive blocks, a power of two, so that an offset is split into a
/// block and a place in it by shifts, not divisions (on the path of every packet).
#[derive(Debug, Clone, Copy)]
struct BlockSize {
    shift: u32,
}

impl BlockSize {
    /// For a stream of receive window `window`: [`BLOCK`], or the largest power of two within
    /// a smaller window (at least 4 KiB). Blocks and spares never exceed what the window can
    /// fill plus one block, so a block larger than the window would make the memory a small
    /// window promises to bound several times the window.
    fn for_window(window: u64) -> Self {
        let window = usize::try_from(window).unwrap_or(usize::MAX);
        let within: usize = 1 << (usize::BITS - 1 - window.max(1).leading_zeros());
        Self {
            shift: within.clamp(4 << 10, BLOCK).trailing_zeros(),
        }
    }

    fn len(self) -> usize {
        1 << self.shift
    }

    /// The block holding relative offset `rel`, and the place in it.
    fn split(self, rel: usize) -> (usize, usize) {
        (rel >> self.shift, rel & (self.len() - 1))
    }

    /// The place of stream offset `offset` in its block.
    fn within(self, offset: u64) -> usize {
        (offset & (self.len() as u64 - 1)) as usize
    }

    /// Blocks that `n` bytes fill, the last one in part too.
    fn count(self, n: u64) -> usize {
        (n.div_ceil(self.len() as u64)) as usize
    }
}

/// Receive side of one stream.
///
/// Data is copied once, from the datagram straight to its place in a block ([`BLOCK`] bytes,
/// less for a window smaller than that: see [`BlockSize::for_window`]): block `i` holds the
/// offsets from `first() + i * block` on, where `first()` is the read offset rounded down to a
/// block. A block's memory is taken when the first bytes for it arrive, so the blocks that
/// hold memory are at most those the window spans (flow control keeps the peer within it)
/// however the peer fragments its data, nothing is allocated per frame, and a few bytes far
/// ahead of the reader cost a block each, not every block between. A reader using
/// [`read_buf`](Self::read_buf) takes whole blocks, without copying them, and gives a spare
/// buffer back.
#[derive(Debug)]
pub(crate) struct RecvStream {
    /// Blocks from `first()` on, each `block` bytes long, or empty (no memory) while no
    /// byte of it has arrived. Positions of offsets not received yet hold stale bytes.
    blocks: VecDeque<Vec<u8>>,
    /// Block-sized buffers kept for the next blocks, as long as blocks and spares together
    /// stay within what the window can fill (see [`Self::window_blocks`]): blocks the reader
    /// freed are reused instead of going back to the allocator and being allocated (and
    /// zeroed) again. A reader that falls behind by more than a few blocks and catches up
    /// would otherwise have the allocator zero a block for about every third one received.
    spares: Vec<Vec<u8>>,
    block: BlockSize,
    /// Blocks taken from the allocator so far (tests check that reading reuses them).
    #[cfg(test)]
    allocated: usize,
    /// Bytes the application has read.
    read: u64,
    /// Every offset below this has arrived (`contiguous - read` bytes are readable).
    contiguous: u64,
    /// Offsets received above `contiguous` (out of order), none touching it.
    ahead: RangeSet,
    /// Final size, once the FIN arrived.
    fin: Option<u64>,
    window: u64,
    /// Limit last advertised to the peer.
    pub max_data_sent: u64,
    buffered: u64,
}

/// The peer broke flow control or changed the stream's final size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamViolation(pub &'static str);

/// Out-of-order fragments a receiving stream holds at most. Each costs a map entry (about 50
/// bytes) on top of the blocks, which the window bounds: without this, 1-byte frames at
/// scattered offsets would cost an entry per byte of the window, many times the window
/// itself. Full-size packets with scattered losses need one fragment per lost run, far fewer.
pub(crate) const MAX_FRAGMENTS: usize = 4096;

impl RecvStream {
    pub fn new(window: u64) -> Self {
        Self {
            blocks: VecDeque::new(),
            spares: Vec::new(),
            block: BlockSize::for_window(window),
            #[cfg(test)]
            allocated: 0,
            read: 0,
            contiguous: 0,
            ahead: RangeSet::new(),
            fin: None,
            window,
            max_data_sent: window,
            buffered: 0,
        }
    }

    /// Bytes held (in order or not) and not yet read.
    pub fn buffered(&self) -> u64 {
        self.buffered
    }

    /// Out-of-order fragments held (ranges of received bytes not touching the in-order data).
    pub fn fragments(&self) -> usize {
        self.ahead.range_count()
    }

    /// Whether a STREAM frame's `len` bytes at `offset`, stored, would add an out-of-order
    /// fragment: new bytes that neither continue the in-order data nor touch a fragment held.
    /// A packet whose frames would take a stream past [`MAX_FRAGMENTS`] is dropped
    /// unacknowledged, so the sender sends it again; a packet that adds none is always taken
    /// (the data at the head of the stream among them), so the gaps fill and the stream goes
    /// on.
    pub fn adds_fragment(&self, offset: u64, len: u64) -> bool {
        let start = offset.max(self.contiguous);
        let end = offset.saturating_add(len);
        start < end && start != self.contiguous && self.ahead.would_add_range(start..end)
    }

    /// Bytes of memory the reassembly blocks hold.
    #[cfg(test)]
    pub fn memory(&self) -> usize {
        let held = self.blocks.iter().filter(|b| !b.is_empty()).count();
        (held + self.spares.len()) * self.block.len()
    }

    /// Stream offset of the first block's first byte.
    fn first(&self) -> u64 {
        self.read - self.block.within(self.read) as u64
    }

    /// Makes the blocks cover the offsets below `end` (flow control keeps `end - read` within
    /// the window), those not reached before without memory yet.
    fn reserve_to(&mut self, end: u64) {
        let needed = self.block.count(end - self.first());
        if self.blocks.len() < needed {
            self.blocks.resize_with(needed, Vec::new);
        }
    }

    /// Memory for a block bytes arrived for: a spare, or a new one.
    fn new_block(&mut self) -> Vec<u8> {
        self.spares.pop().unwrap_or_else(|| {
            #[cfg(test)]
            {
                self.allocated += 1;
            }
            vec![0u8; self.block.len()]
        })
    }

    /// The `len` bytes from offset `offset` on (arrived, within the blocks), a slice per block.
    fn slices_from(&self, offset: u64, len: usize) -> impl Iterator<Item = &[u8]> {
        let rel = (offset - self.first()) as usize;
        let (size, (first, at)) = (self.block.len(), self.block.split(rel));
        let (mut at, mut left) = (at, len);
        self.blocks.range(first..).map_while(move |block| {
            let n = (size - at).min(left);
            let slice = (n > 0).then(|| &block[at..at + n]);
            (at, left) = (0, left - n);
            slice
        })
    }

    /// Copies the bytes from offset `offset` on into `out`.
    fn copy_from_blocks(&self, offset: u64, out: &mut [u8]) {
        let mut done = 0;
        for slice in self.slices_from(offset, out.len()) {
            out[done..done + slice.len()].copy_from_slice(slice);
            done += slice.len();
        }
    }

    /// Copies `data` to the place of offset `offset` (within the blocks).
    fn copy_to_blocks(&mut self, offset: u64, data: &[u8]) {
        let rel = (offset - self.first()) as usize;
        let (mut i, mut at) = self.block.split(rel);
        let mut done = 0;
        while done < data.len() {
            let n = (self.block.len() - at).min(data.len() - done);
            if self.blocks[i].is_empty() {
                self.blocks[i] = self.new_block();
            }
            self.blocks[i][at..at + n].copy_from_slice(&data[done..done + n]);
            done += n;
            (i, at) = (i + 1, 0);
        }
    }

    /// One past the highest offset received.
    fn highest(&self) -> u64 {
        self.ahead.max_end().unwrap_or(self.contiguous)
    }

    /// Stores a STREAM frame's data. Returns whether anything new became readable.
    pub fn on_data(
        &mut self,
        offset: u64,
        data: &[u8],
        fin: bool,
    ) -> Result<bool, StreamViolation> {
        let end = offset + data.len() as u64;
        if end > self.max_data_sent {
            return Err(StreamViolation("flow control limit exceeded"));
        }
        let new_fin = fin && self.fin.is_none();
        if let Some(f) = self.fin {
            if end > f || (fin && end != f) {
                return Err(StreamViolation("final size changed"));
            }
        }
        if fin {
            if self.highest() > end {
                return Err(StreamViolation("final size below received data"));
            }
            self.fin = Some(end);
        }
        let start = offset.max(self.contiguous);
        if start >= end {
            // Nothing to store. A FIN that completes the stream is news all the same: a
            // reader learns of the end (on the message stream, maybe inside a message), and
            // the memory goes back if everything was read already.
            self.release_if_finished();
            return Ok(new_fin && self.is_all_received());
        }
        self.reserve_to(end);
        if self.ahead.is_empty() {
            // the usual case: nothing out of order, copy it all
            self.copy_to_blocks(start, &data[(start - offset) as usize..]);
            self.buffered += end - start;
        } else {
            for gap in self.ahead.gaps_in(start..end) {
                let lo = (gap.start - offset) as usize;
                let hi = (gap.end - offset) as usize;
                self.copy_to_blocks(gap.start, &data[lo..hi]);
                self.buffered += gap.end - gap.start;
            }
        }
        if start > self.contiguous {
            self.ahead.insert(start..end);
            return Ok(false);
        }
        // "readable" news is growth of the contiguous prefix, which need not start at the read
        // offset: a partly arrived message stays unread until its last byte comes
        self.contiguous = end;
        loop {
            let next = self.ahead.iter().next();
            match next {
                Some(r) if r.start <= self.contiguous => {
                    self.contiguous = self.contiguous.max(r.end);
                    self.ahead.remove_below(r.end);
                }
                _ => break,
            }
        }
        Ok(true)
    }

    /// Bytes that arrived in order: every offset below this one.
    pub fn received(&self) -> u64 {
        self.contiguous
    }

    /// Offset of the next byte the application reads.
    pub fn read_offset(&self) -> u64 {
        self.read
    }

    /// Bytes readable in order right now.
    pub fn readable(&self) -> u64 {
        self.contiguous - self.read
    }

    /// The peer finished and everything was read.
    pub fn is_finished(&self) -> bool {
        self.fin == Some(self.read)
    }

    /// Everything up to the FIN has arrived (not necessarily read).
    pub fn is_all_received(&self) -> bool {
        self.fin.is_some_and(|f| self.read + self.readable() == f)
    }

    /// Copies readable bytes into `out` without consuming them; returns how many.
    pub fn peek(&self, out: &mut [u8]) -> usize {
        let n = (self.readable() as usize).min(out.len());
        if n > 0 {
            self.copy_from_blocks(self.read, &mut out[..n]);
        }
        n
    }

    /// Reads in-order bytes into `out`; returns how many.
    pub fn read(&mut self, out: &mut [u8]) -> usize {
        let n = self.peek(out);
        self.consume(n);
        n
    }

    /// Appends the next `len` in-order bytes to `buf`, all of them or none: false when fewer
    /// are readable. Unlike [`read`](Self::read) into a slice, `buf` need not be filled (with
    /// zeros) first.
    pub fn read_append(&mut self, buf: &mut Vec<u8>, len: usize) -> bool {
        if (self.readable() as usize) < len {
            return false;
        }
        buf.reserve(len);
        for slice in self.slices_from(self.read, len) {
            buf.extend_from_slice(slice);
        }
        self.consume(len);
        true
    }

    /// Replaces the contents of `buf` with the next in-order bytes; returns how many (0 when
    /// none are readable). A whole block that arrived is handed over as it is, with no copy,
    /// and a block-sized `buf` is kept in exchange for the next block; otherwise the bytes up
    /// to the end of the current block are copied into `buf`.
    pub fn read_buf(&mut self, buf: &mut Vec<u8>) -> usize {
        let (at, size) = (self.block.within(self.read), self.block.len());
        let n = (self.readable() as usize).min(size - at);
        if n == size {
            // the reader's buffer takes the block's place, and `consume` frees it as it would
            // the block
            std::mem::swap(buf, &mut self.blocks[0]);
        } else {
            buf.clear();
            if n > 0 {
                buf.extend_from_slice(&self.blocks[0][at..at + n]);
            }
        }
        self.consume(n);
        n
    }

    /// Keeps a freed block for reuse, if it has a block's memory (a reader's buffer may not)
    /// and the window could need it.
    fn keep_spare(&mut self, mut block: Vec<u8>) {
        if block.capacity() >= self.block.len()
            && self.blocks.len() + self.spares.len() < self.window_blocks()
        {
            // a reader's buffer comes back holding its last read, which may have been shorter
            // than a block (`read_buf` copies what is readable up to the block's end): dropping
            // it for that made the allocator map, and the kernel zero, a fresh block every time
            // a short read was followed by a whole block
            block.resize(self.block.len(), 0);
            self.spares.push(block);
        }
    }

    /// Most blocks the window can fill at once: the peer sends at most `window` bytes past the
    /// read offset, which may sit inside a block. Blocks and spares never exceed it.
    fn window_blocks(&self) -> usize {
        self.block.count(self.window) + 1
    }

    /// Moves the read offset `n` bytes on, freeing the blocks left behind (some are kept).
    fn consume(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let done_blocks = self.block.split(self.block.within(self.read) + n).0;
        self.read += n as u64;
        self.buffered -= n as u64;
        for _ in 0..done_blocks.min(self.blocks.len()) {
            let block = self.blocks.pop_front().expect("counted");
            self.keep_spare(block);
        }
        self.release_if_finished();
    }

    /// Gives the memory back once nothing more can arrive.
    fn release_if_finished(&mut self) {
        if self.is_finished() {
            self.blocks = VecDeque::new();
            self.spares = Vec::new();
        }
    }

    /// A new limit to advertise, once reading has freed a quarter of the window.
    pub fn window_update(&mut self) -> Option<u64> {
        let limit = self.read + self.window;
        if self.fin.is_none() && limit - self.max_data_sent >= self.window / 4 {
            self.max_data_sent = limit;
            Some(limit)
        } else {
            None
        }
    }

    /// Advertises the whole window at once if the peer may not yet send up to offset `end`.
    /// A reader that needs bytes up to `end` before it can consume anything (a whole message)
    /// would otherwise wait forever for the quarter-window that [`window_update`] waits for.
    ///
    /// [`window_update`]: Self::window_update
    pub fn grant_up_to(&mut self, end: u64) -> Option<u64> {
        let limit = self.read + self.window;
        if self.fin.is_none() && self.max_data_sent < end && limit > self.max_data_sent {
            self.max_data_sent = limit;
            Some(limit)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `len` bytes whose values repeat only every 251 (a prime): a byte out of place shows.
    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    /// A chunk handed back whole gives its memory for the next one, at its start, whatever
    /// part of it the chunk was; a chunk something else still holds gives none.
    #[test]
    fn a_chunk_nothing_else_holds_gives_back_its_memory() {
        for len in [64 << 10, 100_000] {
            // a `Vec` with room to spare, and one without (held differently by `Bytes`)
            let mut roomy = vec![7u8; len];
            roomy.reserve_exact(len / 2);
            for b in [Bytes::from(roomy), Bytes::from(vec![7u8; len])] {
                let memory = b.as_ptr();
                let back = reclaim(b).expect("nothing else holds it");
                assert!(back.is_empty());
                assert!(back.capacity() >= len, "{} < {len}", back.capacity());
                assert_eq!(back.as_ptr(), memory);
            }
        }
        let mut b = Bytes::from(vec![1u8; 1000]);
        let tail = b.split_off(10);
        assert!(reclaim(b).is_err(), "shared with `tail`");
        let back = reclaim(tail).expect("`tail` alone now");
        assert!(back.capacity() >= 990, "{}", back.capacity());
    }

    #[test]
    fn send_stream_retransmits_lost_ranges_and_frees_acked_prefix() {
        let mut s = SendStream::new(100, 1000);
        assert_eq!(s.write(&[7u8; 150]), 100);
        let a = s.next_chunk(60).unwrap();
        let b = s.next_chunk(60).unwrap();
        assert_eq!((a.offset, a.len, b.offset, b.len), (0, 60, 60, 40));
        s.on_lost(a);
        s.on_ack(b);
        assert_eq!(s.buffered(), 100);
        let again = s.next_chunk(100).unwrap();
        assert_eq!((again.offset, again.len), (0, 60));
        s.on_ack(again);
        assert_eq!(s.buffered(), 0);
        s.finish();
        let fin = s.next_chunk(100).unwrap();
        assert!(fin.fin && fin.len == 0);
        s.on_lost(fin);
        let fin2 = s.next_chunk(100).unwrap();
        assert!(fin2.fin);
        s.on_ack(fin2);
        assert!(s.is_complete());
    }

    /// Opportunistic retransmission waits for the head to stay put: a head that moves within
    /// the patience is in transit, not stuck, and is not sent again; one that stays put that
    /// long is queued again once, and the deadline says when.
    #[test]
    fn only_a_head_that_stays_put_is_sent_again() {
        let patience = Duration::from_millis(5);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // the peer's limit (100) blocks the rest of what was written
        let mut s = SendStream::new(1000, 100);
        s.write(&[3u8; 200]);
        let chunks: Vec<Chunk> = (0..10).map(|_| s.next_chunk(10).unwrap()).collect();
        assert!(
            s.next_chunk(10).is_none(),
            "the premise: blocked by the limit"
        );
        assert!(!s.rescue_head(64, at(0), patience, None), "just seen");
        assert_eq!(s.rescue_deadline(patience, None), Some(at(5)));
        // acknowledged in order within the patience: the head keeps moving
        for (i, c) in chunks.iter().take(5).enumerate() {
            s.on_ack(*c);
            assert!(
                !s.rescue_head(64, at(4 * i as u64 + 4), patience, None),
                "moving"
            );
        }
        assert_eq!(s.acknowledged(), 50);
        // then it stays at 50 while later bytes are acknowledged around it
        s.on_ack(chunks[7]);
        assert!(!s.rescue_head(64, at(23), patience, None), "not yet");
        assert_eq!(s.rescue_deadline(patience, None), Some(at(25)));
        assert!(
            s.rescue_head(64, at(25), patience, None),
            "stuck: queued again"
        );
        assert_eq!(s.rescue_deadline(patience, None), None, "once per head");
        let again: Vec<(u64, usize)> = std::iter::from_fn(|| s.next_chunk(100))
            .map(|c| (c.offset, c.len))
            .collect();
        // the unacknowledged parts of the head's bytes sent so far, nothing new
        assert_eq!(again, [(50, 20), (80, 20)]);
        assert!(!s.rescue_head(64, at(100), patience, None), "not twice");
    }

    /// A writer that waits for more room than is free (a message, or a large buffer taken
    /// only whole) is blocked as surely as by a full buffer: a head that stays put is sent
    /// again. Before, only a buffer with no room at all counted, and after one rescue freed a
    /// little room the next stuck head was never re-sent.
    #[test]
    fn a_head_that_keeps_a_waiting_writer_out_is_sent_again() {
        let patience = Duration::from_millis(5);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut s = SendStream::new(100, 1000);
        s.write(&[3u8; 100]);
        let chunks: Vec<Chunk> = (0..10).map(|_| s.next_chunk(10).unwrap()).collect();
        // the first 10 bytes are acknowledged: 10 bytes of room, a writer waits for 50
        s.on_ack(chunks[0]);
        s.on_ack(chunks[5]);
        assert_eq!(s.room(), 10, "the premise");
        assert!(!s.rescue_head(64, at(0), patience, None), "nobody waits");
        assert!(!s.rescue_head(64, at(0), patience, Some(50)), "just seen");
        assert_eq!(s.rescue_deadline(patience, Some(50)), Some(at(5)));
        assert!(
            s.rescue_head(64, at(5), patience, Some(50)),
            "stuck: queued again"
        );
        assert_eq!(s.next_chunk(100).map(|c| (c.offset, c.len)), Some((10, 40)));
    }

    /// A stream blocked by a peer that reads slowly, with everything sent acknowledged, has no
    /// head in transit: none is watched, so the head that leaves once the window opens gets
    /// its full patience and its one rescue. Before, the watch began with the stall: the
    /// rescue came and went with nothing to send, and the head after it was never re-sent.
    #[test]
    fn a_stall_with_nothing_in_flight_is_not_watched() {
        let patience = Duration::from_millis(5);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut s = SendStream::new(1000, 100);
        s.write(&[3u8; 300]);
        while let Some(c) = s.next_chunk(10) {
            s.on_ack(c);
        }
        assert_eq!(
            s.acknowledged(),
            100,
            "the premise: all sent is acknowledged"
        );
        for ms in [0, 50, 100] {
            assert!(!s.rescue_head(64, at(ms), patience, None));
            assert_eq!(s.rescue_deadline(patience, None), None, "at {ms} ms");
        }
        // the window opens: the head that leaves now is watched from now on
        s.max_data = 200;
        let sent = std::iter::from_fn(|| s.next_chunk(10)).count();
        assert_eq!(sent, 10);
        assert!(!s.rescue_head(64, at(100), patience, None), "just seen");
        assert_eq!(s.rescue_deadline(patience, None), Some(at(105)));
        assert!(
            s.rescue_head(64, at(105), patience, None),
            "stuck: queued again"
        );
    }

    #[test]
    fn striped_acknowledgements_free_exactly_the_acknowledged_prefix() {
        // ten chunks of 10 bytes; link 1 carried the even ones, link 2 the odd ones
        let mut s = SendStream::new(1000, 1000);
        assert_eq!(s.write(&[1u8; 100]), 100);
        let chunks: Vec<Chunk> = (0..10).map(|_| s.next_chunk(10).unwrap()).collect();
        // link 1's acknowledgement first: only chunk 0 joins the prefix
        for c in chunks.iter().step_by(2) {
            s.on_ack(*c);
        }
        assert_eq!(s.acknowledged(), 10);
        assert_eq!(s.buffered(), 90);
        // link 2's: each odd chunk fills the gap before the next even one
        s.on_ack(chunks[1]);
        assert_eq!(s.acknowledged(), 30);
        s.on_ack(chunks[5]);
        assert_eq!(s.acknowledged(), 30, "chunk 3 is still missing");
        s.on_ack(chunks[3]);
        assert_eq!(s.acknowledged(), 70);
        // chunk 7 lost, its bytes sent again as part of one larger chunk (60..100), acked
        // before chunk 9's: it covers an acknowledged range and reaches the end
        s.on_lost(chunks[7]);
        s.on_lost(chunks[9]);
        let again = s.next_chunk(100).unwrap();
        assert_eq!((again.offset, again.len), (70, 10));
        s.on_ack(Chunk {
            offset: 60,
            len: 40,
            fin: false,
        });
        assert_eq!(s.acknowledged(), 100);
        assert_eq!(s.buffered(), 0);
        // late acknowledgements of what was freed change nothing
        s.on_ack(chunks[9]);
        s.on_ack(again);
        assert_eq!((s.acknowledged(), s.buffered()), (100, 0));
    }

    #[test]
    fn data_extending_an_unread_prefix_is_news() {
        let mut r = RecvStream::new(1000);
        assert!(r.on_data(0, b"abc", false).unwrap());
        // nothing read: the next in-order piece still makes more readable
        assert!(r.on_data(3, b"def", false).unwrap());
        assert!(
            !r.on_data(3, b"def", false).unwrap(),
            "a duplicate is no news"
        );
        assert!(
            !r.on_data(10, b"xyz", false).unwrap(),
            "beyond a gap is no news"
        );
        assert!(r.on_data(6, b"ghij", false).unwrap());
        assert_eq!(r.readable(), 13);
    }

    #[test]
    fn recv_ring_wraps_and_grows_keeping_unread_data() {
        // three windows of data, every pair of frames swapped, read in odd-sized pieces: the
        // ring grows from its first size to the window and wraps many times
        let window = 4 * BLOCK as u64;
        let mut r = RecvStream::new(window);
        let data: Vec<u8> = (0..window as usize * 3)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let frames: Vec<_> = (0..data.len())
            .step_by(3000)
            .map(|s| s..(s + 3000).min(data.len()))
            .collect();
        let order: Vec<_> = frames
            .chunks(2)
            .flat_map(|pair| pair.iter().rev().cloned())
            .collect();
        let (mut got, mut next, mut buf) = (Vec::new(), 0, vec![0u8; 5000]);
        while got.len() < data.len() {
            while next < order.len() && order[next].end as u64 <= r.max_data_sent {
                let f = order[next].clone();
                r.on_data(f.start as u64, &data[f], false).unwrap();
                next += 1;
            }
            assert!(
                r.memory() <= window as usize + BLOCK,
                "memory stays within the window (one block more: reading stops mid-block), \
                 spares included"
            );
            let n = r.read(&mut buf[..7 + got.len() % 4093]);
            got.extend_from_slice(&buf[..n]);
            r.window_update();
        }
        assert_eq!(got, data);
    }

    #[test]
    fn a_window_under_a_block_bounds_the_memory_with_blocks_of_its_size() {
        // the smallest window a connection takes (16 KiB) and others around a block: the
        // unread bytes fill the window across a block boundary, then all are read (the freed
        // blocks stay as spares). With 64 KiB blocks whatever the window, a 16 KiB window held
        // 128 KiB, eight times itself.
        for (window, most) in [
            (16 << 10, 32 << 10),
            (20_000, 48 << 10),
            (40_000, 96 << 10),
            (BLOCK as u64, 2 * BLOCK),
            (100_000, 3 * BLOCK),
        ] {
            let mut r = RecvStream::new(window);
            let data = pattern(BLOCK + window as usize);
            // read up to just before a block boundary (of every block size), in pieces the
            // window allows
            let lead = BLOCK - 100;
            let mut at = 0;
            while at < lead {
                let n = (lead - at).min(window as usize / 2);
                r.on_data(at as u64, &data[at..at + n], false).unwrap();
                assert_eq!(r.read(&mut vec![0; n]), n);
                r.window_update();
                at += n;
            }
            let end = r.max_data_sent as usize;
            r.on_data(lead as u64, &data[lead..end], false).unwrap();
            // the premise: what the window allows is unread, across the block boundary
            assert!(end > BLOCK && r.buffered() as usize == end - lead);
            assert!(r.memory() <= most, "window {window}: {} bytes", r.memory());
            let mut rest = vec![0; end - lead];
            assert_eq!(r.read(&mut rest), end - lead);
            assert_eq!(rest, data[lead..end], "window {window}");
            assert!(r.memory() <= most, "window {window}: {} bytes", r.memory());
        }
    }

    #[test]
    fn a_reader_that_catches_up_keeps_the_blocks_for_the_next_window() {
        let window = 32 * BLOCK as u64;
        let mut r = RecvStream::new(window);
        let frame = [7u8; 1400];
        let (mut offset, mut buf) = (0u64, Vec::new());
        for _ in 0..3 {
            // the peer fills the whole window before the reader runs
            while offset + frame.len() as u64 <= r.max_data_sent {
                r.on_data(offset, &frame, false).unwrap();
                offset += frame.len() as u64;
            }
            while r.read_buf(&mut buf) > 0 {}
            // every block it freed (but the one it holds) waits for the next window: none is
            // allocated (and zeroed) again
            assert!(
                r.memory() + BLOCK >= window as usize,
                "{} bytes kept",
                r.memory()
            );
            assert!(r.memory() <= window as usize + BLOCK);
            r.window_update();
        }
    }

    #[test]
    fn a_short_read_before_whole_blocks_loses_no_block() {
        // the reader looks in as the first frame of each window arrives (a short read), then
        // drains the window: the buffer it then gives back for a whole block holds only its
        // last short read, and must be kept like any other block
        let window = 8 * BLOCK as u64;
        let mut r = RecvStream::new(window);
        let frame = [7u8; 1400];
        let (mut offset, mut buf) = (0u64, Vec::new());
        let mut allocated = Vec::new();
        for _ in 0..12 {
            r.on_data(offset, &frame, false).unwrap();
            offset += frame.len() as u64;
            assert!(r.read_buf(&mut buf) > 0);
            while offset + frame.len() as u64 <= r.max_data_sent {
                r.on_data(offset, &frame, false).unwrap();
                offset += frame.len() as u64;
            }
            while r.read_buf(&mut buf) > 0 {}
            allocated.push(r.allocated);
            r.window_update();
        }
        // the blocks ever allocated are those a window spans (one more than it holds: it
        // starts mid-block) and the one the reader holds: every other one was reused
        assert!(
            allocated.iter().all(|&a| a <= r.window_blocks() + 1),
            "blocks allocated after each window: {allocated:?}"
        );
    }

    /// A byte far ahead of the reader costs the block it lands in, not every block up to it:
    /// before, two one-byte frames at the far end of both streams' windows held the memory
    /// of both windows.
    #[test]
    fn a_byte_far_ahead_holds_one_block() {
        let window = 8 << 20;
        let mut r = RecvStream::new(window);
        r.on_data(window - 1, &[9], false).unwrap();
        assert_eq!(r.memory(), BLOCK);
        r.on_data(window / 2, &[8], false).unwrap();
        assert_eq!(r.memory(), 2 * BLOCK);
        // the bytes between arrive: every block is there and the two bytes are in place
        let data = pattern(window as usize);
        r.on_data(0, &data[..window as usize / 2], false).unwrap();
        r.on_data(
            window / 2 + 1,
            &data[window as usize / 2 + 1..window as usize - 1],
            false,
        )
        .unwrap();
        assert_eq!(r.readable(), window);
        let mut got = vec![0u8; window as usize];
        assert_eq!(r.read(&mut got), window as usize);
        let mut sent = data;
        sent[window as usize / 2] = 8;
        sent[window as usize - 1] = 9;
        assert!(got == sent);
    }

    #[test]
    fn tiny_scattered_frames_use_no_more_than_the_window() {
        let window = 1 << 20;
        let mut r = RecvStream::new(window);
        for off in (1..window).step_by(2) {
            r.on_data(off, &[1], false).unwrap();
        }
        assert!(r.memory() <= window as usize + BLOCK);
        assert_eq!(r.readable(), 0);
    }

    #[test]
    fn recv_stream_reassembles_out_of_order_data() {
        let mut r = RecvStream::new(1000);
        assert!(!r.on_data(5, b"fghij", true).unwrap());
        assert!(r.on_data(0, b"abcdefg", false).unwrap());
        let mut out = [0u8; 20];
        assert_eq!(r.read(&mut out[..3]), 3);
        assert_eq!(r.read(&mut out[3..]), 7);
        assert_eq!(&out[..10], b"abcdefghij");
        assert!(r.is_finished());
        assert!(r.on_data(0, &[0; 2000], false).is_err());
    }

    #[test]
    fn large_writes_are_taken_whole_and_sent_exact() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut s = SendStream::new(1 << 20, u64::MAX);
        // a small write, then large buffers taken whole, then a small one again
        assert_eq!(s.write(&data[..1000]), 1000);
        let mut big = data[1000..101_000].to_vec();
        let ptr = big.as_ptr();
        assert_eq!(s.write_buf(&mut big), 100_000);
        assert!(
            s.pieces.iter().any(|(_, p)| p.as_ptr() == ptr),
            "kept, not copied"
        );
        let mut big2 = data[101_000..299_000].to_vec();
        assert_eq!(s.write_buf(&mut big2), 198_000);
        assert_eq!(s.write(&data[299_000..]), 1000);
        // every byte comes out where it belongs, across piece boundaries
        let mut out = vec![0u8; data.len()];
        let mut off = 0;
        while let Some(c) = s.next_chunk(1400) {
            s.copy_out(c.offset, &mut out[c.offset as usize..][..c.len]);
            off += c.len;
            s.on_ack(c);
        }
        assert_eq!(off, data.len());
        assert_eq!(out, data);
        assert_eq!(s.buffered(), 0);
        assert!(s.pieces.len() <= 1, "acknowledged pieces freed");
        // the freed piece comes back in exchange for the next large buffer
        let mut again = vec![5u8; 20_000];
        assert_eq!(s.write_buf(&mut again), 20_000);
        assert!(
            again.is_empty() && again.capacity() > 0,
            "an empty spare buffer in exchange"
        );
    }

    #[test]
    fn a_writer_that_filled_the_buffer_gets_its_memory_back_for_the_next_fill() {
        const PIECE: usize = 256 * 1024;
        let mut s = SendStream::new(8 * PIECE as u64, u64::MAX);
        let mut buf = Vec::with_capacity(PIECE);
        for round in 0..3 {
            // fill the buffer with whole pieces; after the first fill every exchange hands
            // back a spare with the memory of one acknowledged (nothing allocated)
            for i in 0..8 {
                buf.resize(PIECE, round as u8);
                assert_eq!(s.write_buf(&mut buf), PIECE);
                if round > 0 {
                    assert!(buf.capacity() >= PIECE, "round {round}, piece {i}: a spare");
                } else {
                    assert_eq!(buf.capacity(), 0, "nothing acknowledged yet");
                }
            }
            assert_eq!(s.room(), 0);
            // all of it acknowledged at once
            while let Some(c) = s.next_chunk(64 * 1024) {
                s.on_ack(c);
            }
            assert_eq!(s.buffered(), 0);
            assert!(
                s.spare_bytes <= 8 * PIECE,
                "no more than the capacity is kept"
            );
        }
    }

    #[test]
    fn a_large_write_waits_for_room_unless_the_buffer_is_empty() {
        let mut s = SendStream::new(50_000, u64::MAX);
        let mut big = vec![1u8; 80_000];
        assert_eq!(s.write_buf(&mut big), 80_000, "an empty buffer takes it");
        let mut more = vec![2u8; 20_000];
        assert_eq!(s.write_buf(&mut more), 0, "no room: not taken");
        assert_eq!(more, vec![2u8; 20_000], "left untouched");
        let c = s.next_chunk(80_000).unwrap();
        s.on_ack(c);
        assert_eq!(s.write_buf(&mut more), 20_000);
    }

    /// `write_bytes` shares a large `Bytes` (the datagrams read the caller's memory), copies
    /// a small one, waits for room as `write_buf` does, and lets go of the caller's memory
    /// once it is acknowledged.
    #[test]
    fn large_bytes_are_shared_until_acknowledged_and_small_ones_copied() {
        let mut s = SendStream::new(100_000, u64::MAX);
        let data = Bytes::from(pattern(80_000));
        let small = Bytes::from_static(b"small write");
        assert_eq!(s.write_bytes(&data), 80_000);
        assert_eq!(s.write_bytes(&small), small.len());
        assert_eq!(
            s.write_bytes(&data.slice(..30_000)),
            0,
            "no room: not taken"
        );
        // what the datagrams read: the caller's memory for the large write, a copy of the
        // small one
        let mut chunks = Vec::new();
        while let Some(c) = s.next_chunk(64 * 1024) {
            chunks.push(c);
        }
        let mut out = Vec::new();
        for c in &chunks {
            s.payload(c.offset, c.len, |pos, piece, range| {
                let at = c.offset + pos as u64;
                let shared = data.as_ptr_range().contains(&piece[range.clone()].as_ptr());
                assert_eq!(shared, at < 80_000, "stream bytes from {at}");
                out.extend_from_slice(&piece[range]);
            });
        }
        assert_eq!(out, [&data[..], &small[..]].concat());
        assert!(!data.is_unique(), "held until acknowledged");
        for c in chunks {
            s.on_ack(c);
        }
        assert!(data.is_unique(), "let go once acknowledged");
        assert_eq!(s.write_bytes(&data.slice(..30_000)), 30_000);
    }

    /// `read_append` adds exactly the next bytes, across block boundaries, after what `buf`
    /// held; it takes nothing when fewer than asked are readable.
    #[test]
    fn read_append_adds_the_next_bytes_across_blocks() {
        let data = pattern(2 * BLOCK + 300);
        let mut r = RecvStream::new(1 << 20);
        r.on_data(0, &data, true).unwrap();
        let mut buf = b"kept".to_vec();
        assert!(
            !r.read_append(&mut buf, data.len() + 1),
            "more than is readable"
        );
        assert_eq!(
            (buf.as_slice(), r.readable()),
            (&b"kept"[..], data.len() as u64)
        );
        assert!(r.read_append(&mut buf, BLOCK - 10));
        assert!(
            r.read_append(&mut buf, BLOCK + 20),
            "from inside block 0 into block 2"
        );
        assert!(r.read_append(&mut buf, 290));
        assert_eq!(&buf[..4], b"kept");
        assert_eq!(&buf[4..], &data[..]);
        assert!(r.is_finished());
        assert_eq!(r.memory(), 0);
    }

    #[test]
    fn whole_blocks_are_handed_over_and_partial_ones_copied() {
        let data = pattern(3 * BLOCK + 500);
        let mut r = RecvStream::new(1 << 20);
        // out of order: the second half first
        let half = data.len() / 2;
        r.on_data(half as u64, &data[half..], true).unwrap();
        assert_eq!(r.readable(), 0);
        r.on_data(0, &data[..half], false).unwrap();
        let mut got = Vec::new();
        let mut buf = Vec::new();
        // a small read first: the next read_buf copies up to the block's end
        let mut head = [0u8; 10];
        assert_eq!(r.read(&mut head), 10);
        got.extend_from_slice(&head);
        let mut whole = 0;
        loop {
            let n = r.read_buf(&mut buf);
            if n == 0 {
                break;
            }
            assert_eq!(buf.len(), n);
            whole += usize::from(n == BLOCK);
            got.extend_from_slice(&buf);
        }
        assert_eq!(got, data);
        assert_eq!(whole, 2, "blocks 1 and 2 went over whole");
        assert!(r.is_finished());
        assert_eq!(r.memory(), 0);
    }

    /// The peer's FIN alone, after everything was read, gives the memory back and is news
    /// (a reader learns of the end); a repeat of it is not. Before, the blocks stayed until
    /// the connection was dropped, and nothing was told.
    #[test]
    fn a_bare_fin_after_everything_was_read_ends_the_stream_and_frees_it() {
        let mut r = RecvStream::new(1 << 20);
        let data = vec![5u8; 3 * BLOCK];
        assert_eq!(r.on_data(0, &data, false), Ok(true));
        let mut out = vec![0u8; data.len()];
        assert_eq!(r.read(&mut out), data.len());
        assert!(r.memory() > 0, "blocks kept for the next data");
        assert_eq!(r.on_data(data.len() as u64, &[], true), Ok(true));
        assert!(r.is_finished());
        assert_eq!(r.memory(), 0);
        assert_eq!(
            r.on_data(data.len() as u64, &[], true),
            Ok(false),
            "a repeat"
        );
    }

    /// A bare FIN after bytes that arrived but cannot be read yet (a message's start) is news
    /// too: the reader looks, and finds the stream ended inside the message.
    #[test]
    fn a_bare_fin_behind_unread_bytes_is_news() {
        let mut r = RecvStream::new(1 << 20);
        assert_eq!(r.on_data(0, &[9; 50], false), Ok(true));
        assert_eq!(r.on_data(50, &[], true), Ok(true));
        assert!(r.is_all_received() && !r.is_finished());
        // a FIN that arrives before the data it ends is no news until the data comes
        let mut r = RecvStream::new(1 << 20);
        assert_eq!(r.on_data(50, &[], true), Ok(false));
        assert_eq!(r.on_data(0, &[9; 50], false), Ok(true));
    }
}
