//! One TCP-transport connection: its state under one lock (the sequence's striping and
//! reassembly, the send and receive buffers, the links), and the application's calls on it.
//! Link threads (`super::link`) move bytes between this state and the TCP connections; the
//! application's calls wait on `app` (or its readiness descriptors), each link's writer on
//! its own condition variable in `writers`.
//!
//! The byte stream and the messages travel in one striped sequence, as chunks
//! (`ri2n_proto::tcp::chunk`): what the application writes collects in an open stream chunk
//! whose header is filled in when a link writer takes it, so many small writes cost one
//! header; a message is one chunk of its own. The receiver splits the in-order sequence
//! back into stream bytes and whole messages as the application asks for them.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use ri2n_proto::tcp::chunk::{self, ChunkError, Demux, Kind, Piece};
use ri2n_proto::tcp::frame::CLOSE_APP_BASE;
use ri2n_proto::tcp::{Reassembly, SlowLinkWatch, StripeConfig, Striper};
use ri2n_proto::{
    reclaim, Cipher, ConnectionConfig, ConnectionError, ConnectionState, ConnectionStats,
    EndpointConfig, Event, Key, LinkId, LinkState, LinkStats, MAX_LINKS,
};

use super::signal::Signal;
use crate::connection::TimedEvent;
use crate::readiness::{Caller, Interest, Waiting, Watchers};

/// Writes smaller than this are copied into the send buffer's open tail; larger buffers
/// handed over with `write_buf` are kept whole (no copy).
const WHOLE_BUFFER: usize = 16 << 10;
/// The most a write copies before the links are told of it (see `TcpConnection::write`),
/// and the most an open stream chunk holds (see `State::append_stream`).
const WRITE_PIECE: usize = 256 << 10;
/// What a piece of the send buffer costs besides its bytes, near enough: its queue entry and
/// its allocation's bookkeeping (see `State::charged`).
const PIECE_OVERHEAD: u64 = 64;
/// The application thread sends for itself (see `TcpConnection::send_or_wake`) while no
/// more than this is buffered: a message of up to two runs, as `StripeConfig` cuts them.
const DIRECT_SEND_MAX: u64 = 512 << 10;

/// Received pieces shorter than this are appended to a short piece they continue (see
/// [`append_short`]).
const SHORT_PIECE: usize = 4 << 10;

/// Appends `piece` to `kept`, the bytes just before it, when both are shorter than
/// [`SHORT_PIECE`]: `true` if it did. Received bytes wait to be read as pieces, each a map or
/// queue entry and an allocation of its own: a peer sending its sequence a byte per run (or
/// its stream a byte per chunk) would otherwise make this side hold many times its window
/// while the application does not read.
fn append_short(kept: &mut Bytes, piece: &[u8]) -> bool {
    if kept.len() >= SHORT_PIECE || piece.len() >= SHORT_PIECE {
        return false;
    }
    // the piece's own memory when nothing else holds it, so that appends grow it as a vector
    // grows, not by a copy of all it holds each time
    let mut joined = std::mem::take(kept)
        .try_into_mut()
        .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
    joined.extend_from_slice(piece);
    *kept = joined.freeze();
    true
}

/// How a connection behaves, from its `ConnectionConfig`.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub connection_id: u64,
    pub application: Option<String>,
    pub window: u64,
    pub send_buffer: u64,
    pub stripe: StripeConfig,
    /// A link sends a PING after this long without sending anything.
    pub keepalive: Duration,
    /// A link is dead after this long without receiving anything (at least; more on links
    /// with a longer round trip, see `dead_after`).
    pub min_dead: Duration,
    /// Pace of the attempts to replace a dead link's TCP connection.
    pub probe_interval: Duration,
    /// The timeouts the connection starts with ([`State::timeouts`] holds those in force).
    pub timeouts: Timeouts,
    /// The cluster key: every TCP connection of a link handshakes and seals its frames.
    pub key: Option<Key>,
    /// This side reads messages.
    pub takes_messages: bool,
    /// How long the endpoint waits for delivery as it closes; once the application let go
    /// of the connection, a silence of the peer this long ends it (`IdleTimeout`).
    pub close_linger: Duration,
    /// The peer reads messages, and its receive window (both said in the hello exchange).
    pub peer_takes_messages: bool,
    pub peer_window: u64,
}

impl Settings {
    pub fn new(cfg: &ConnectionConfig, endpoint: &EndpointConfig, connection_id: u64) -> Self {
        Self {
            connection_id,
            application: cfg.application.clone(),
            window: cfg.stream_receive_window,
            send_buffer: cfg.send_buffer,
            stripe: StripeConfig::default(),
            keepalive: Duration::from_millis(5),
            min_dead: cfg.probe_interval,
            probe_interval: cfg.probe_interval,
            timeouts: Timeouts {
                all_links_down: cfg.all_links_down_timeout,
                idle: cfg.idle_timeout,
            },
            key: endpoint.key.clone(),
            takes_messages: cfg.accept_messages,
            close_linger: endpoint.close_linger,
            peer_takes_messages: false,
            peer_window: 0,
        }
    }

    /// The longest message: one whole message must fit this side's send buffer and the
    /// peer's receive window (less room for its header, as the UDP transport leaves), and one
    /// chunk, whose header holds its length in 32 bits.
    pub fn max_message(&self) -> u64 {
        (self.send_buffer.min(self.peer_window).saturating_sub(8)).min(chunk::MAX_CHUNK as u64)
    }

    /// How long a link may stay silent before it is declared dead: a few of its round
    /// trips, never less than `min_dead` (every end PINGs each link every `keepalive`).
    pub fn dead_after(&self, srtt: Duration) -> Duration {
        (srtt * 3 + self.keepalive).max(self.min_dead)
    }
}

/// Which side opened the connection: the client replaces dead links' TCP connections.
#[derive(Debug, Clone)]
pub(crate) enum Role {
    /// Local and remote address of each link, by link number.
    Client {
        pairs: Vec<(SocketAddr, SocketAddr)>,
    },
    Server,
}

/// One link of the connection.
#[derive(Debug)]
pub(crate) struct Link {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// Bumped for each new TCP connection: the threads of an older one stop.
    pub incarnation: u64,
    pub stream: Option<Arc<TcpStream>>,
    pub state: LinkState,
    pub ack_due: bool,
    /// Run and repair bytes that arrived since the link's last ACK.
    pub rx_unacked: u64,
    pub ping_due: bool,
    /// A CLOSE record is still to go out on this link.
    pub close_due: bool,
    /// A CLOSE record went into this link's TCP connection (it may still wait there behind
    /// what the link held).
    pub close_written: bool,
    pub last_rx: Instant,
    pub last_tx: Instant,
    /// A dialer is trying to replace the TCP connection.
    pub dialing: bool,
    /// Since when the peer's host has been saying nothing is there: its side of the TCP
    /// connection was closed or reset without a CLOSE (its process died), and new ones are
    /// refused. `None` while the link works or only fell silent (a network outage).
    pub refused_since: Option<Instant>,
    /// The TCP connection whose peer's side ended without a CLOSE, shut by this side since:
    /// the link counts as refused once the peer's host answers that (`link::watch`).
    pub awaiting_answer: Option<Arc<TcpStream>>,
    /// Why the server last turned the link's hello away (another server at its address, or
    /// this one full): warned of once per reason, not at each dial.
    pub turned_away: Option<String>,
    /// Hellos turned away in a row: the next dial waits the longer (see `dial`).
    pub turned_away_times: u32,
    pub next_dial: Instant,
    pub srtt: Duration,
    pub min_rtt: Duration,
    pub cwnd: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub stream_bytes_sent: u64,
    pub stream_bytes_acked: u64,
    /// Link byte count of the last acknowledgement, to count what it delivered.
    pub acked_link_bytes: u64,
    /// When an acknowledgement last counted more of this link's bytes.
    pub last_ack_progress: Instant,
    /// Set aside as slow until then (state `Degraded`, see `Striper::hedge`).
    pub paused_until: Option<Instant>,
    /// How long it was set aside the last time, and when that ended: a link slow again soon
    /// after is set aside twice as long.
    pub last_pause: (Duration, Instant),
    /// A UDP socket on the local address, to keep the next hop confirmed through outages
    /// (made on first use; `None` if it cannot be bound).
    pub confirmer: Option<std::net::UdpSocket>,
}

impl Link {
    /// It has a working TCP connection (up, or set aside as slow).
    pub fn connected(&self) -> bool {
        matches!(self.state, LinkState::Up | LinkState::Degraded)
    }

    pub fn new(local: SocketAddr, remote: SocketAddr, now: Instant) -> Self {
        Self {
            local,
            remote,
            incarnation: 0,
            stream: None,
            state: LinkState::Validating,
            ack_due: false,
            rx_unacked: 0,
            ping_due: false,
            close_due: false,
            close_written: false,
            last_rx: now,
            last_tx: now,
            dialing: false,
            refused_since: None,
            awaiting_answer: None,
            turned_away: None,
            turned_away_times: 0,
            next_dial: now,
            srtt: Duration::ZERO,
            min_rtt: Duration::ZERO,
            cwnd: 0,
            bytes_sent: 0,
            bytes_received: 0,
            stream_bytes_sent: 0,
            stream_bytes_acked: 0,
            acked_link_bytes: 0,
            last_ack_progress: now,
            paused_until: None,
            last_pause: (Duration::ZERO, now),
            confirmer: None,
        }
    }
}

/// A piece of the send sequence, and whether its memory is the connection's: kept for reuse
/// once acknowledged. Memory the application shares ([`TcpConnection::write_bytes`]) is not:
/// the application may hold it for as long as it likes, and the connection lets go of it as
/// soon as it is acknowledged.
#[derive(Debug)]
pub(crate) struct Sequenced {
    pub bytes: Bytes,
    pub ours: bool,
}

impl Sequenced {
    fn ours(bytes: Bytes) -> Self {
        Self { bytes, ours: true }
    }
}

/// What ends a connection whose peer is not heard from (the application may change them).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// No link up for this long ends the connection (`AllLinksDown`).
    pub all_links_down: Option<Duration>,
    /// Nothing received on any link for this long ends the connection (`IdleTimeout`).
    pub idle: Option<Duration>,
}

/// Everything the connection's threads share.
#[derive(Debug)]
pub(crate) struct State {
    pub striper: Striper,
    pub reasm: Reassembly,
    /// Sequence bytes not yet acknowledged, from `send_base` on.
    pub send_buf: VecDeque<Sequenced>,
    pub send_base: u64,
    /// The chunks of the sequence not yet wholly acknowledged, in order: where each ends,
    /// and the stream bytes it holds (none: a message's). What the peer acknowledged of the
    /// application's stream, framing left out ([`State::stream_acknowledged`]), is read off
    /// them.
    chunk_ends: VecDeque<(u64, u64)>,
    /// The stream bytes of the chunks wholly acknowledged.
    stream_acked_whole: u64,
    /// The open stream chunk: a header to fill in, then stream bytes written since the last
    /// chunk was sealed (empty when there are none). Not in the sequence yet.
    pub tail: BytesMut,
    /// Received sequence bytes not yet split into the streams, by offset (never
    /// overlapping).
    pub recv: BTreeMap<u64, Bytes>,
    /// Splits the in-order sequence into the two streams.
    pub demux: Demux,
    /// Stream bytes that arrived and were not read yet.
    pub stream_in: VecDeque<Bytes>,
    /// Whole messages that arrived and were not read yet; the message arriving.
    pub messages: VecDeque<Vec<u8>>,
    pub message_part: Vec<u8>,
    /// Per kind of write (stream bytes, messages; [`kind_slot`]): the least room that a
    /// non-blocking one found missing (at least 1), until a write of that kind looks with the
    /// room there. Once there is room, other calls keep the combined descriptor signalled for
    /// it.
    writers_blocked: [Option<u64>; 2],
    /// The window end last sent to the peer; a new one is sent when reading moved it by
    /// `ack_step`.
    pub advertised: u64,
    pub ack_step: u64,
    /// Reading opened the window: the link writers have ACKs to send.
    pub acks_queued: bool,
    pub links: Vec<Link>,
    pub events: VecDeque<TimedEvent>,
    /// [`Event::AllAcknowledged`] was told.
    pub all_acknowledged_told: bool,
    /// `Some` once ended: `None` inside for a clean close.
    pub end: Option<Option<ConnectionError>>,
    pub ended_at: Option<Instant>,
    /// After a clean end: the peer ended too (its CLOSE came), or the wait for it is over.
    /// Until then the end's ACK and CLOSE may not have reached the peer, which then waits for
    /// them: the connection keeps its links (see [`Self::lingering`]).
    pub close_settled: bool,
    /// When a link's TCP first acknowledged the CLOSE of an error end of this side's (see
    /// [`Self::close_arrived`]).
    pub close_arrived_at: Option<Instant>,
    pub all_down_since: Option<Instant>,
    pub timeouts: Timeouts,
    /// Which link the stream waits on, since when (see `link::soft_failure`).
    pub slow_links: SlowLinkWatch,
    /// The code and reason a CLOSE record carries (code 0: a clean close).
    pub close_record: (u64, String),
    /// The AEAD of the latest keyed link (`None`: no key).
    pub cipher: Option<Cipher>,
    /// Memory of acknowledged buffers `write_buf` took, handed back by later `write_buf`
    /// calls, and of buffers `read_buf` got back, for the link readers' next runs: reused
    /// memory is not faulted in and zeroed by the kernel again for every buffer.
    pub spare_send: Spares,
    pub spare_recv: Spares,
    /// The application let go of its handle: nothing here reads any more.
    pub released: bool,
}

/// Most buffers [`Spares`] waits for others to let go of.
const MAX_SHARED: usize = 64;

/// Empty buffers kept for reuse, and the memory they hold.
#[derive(Debug)]
pub(crate) struct Spares {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
    /// Buffers done with that a link writer still shares (an acknowledgement can arrive
    /// before the writer that sent the bytes drops its slices): taken in once it has.
    shared: Vec<Bytes>,
    /// The bound on the buffered bytes (send buffer or receive window) that the spares
    /// share with them.
    limit: u64,
}

impl Spares {
    fn new(limit: u64) -> Self {
        Self {
            bufs: Vec::new(),
            bytes: 0,
            shared: Vec::new(),
            limit,
        }
    }

    /// Keeps the memory of `done` (a buffer nothing will read again) as [`Spares::keep`]
    /// does, once no one else shares it; and of earlier ones no longer shared.
    fn keep_bytes(&mut self, done: Bytes, in_use: u64) {
        let mut waiting = std::mem::take(&mut self.shared);
        waiting.push(done);
        for b in waiting {
            match reclaim(b) {
                Ok(free) => self.keep(free, in_use),
                Err(still) => self.shared.push(still),
            }
        }
        // writers hold a few slices each at most; beyond, the oldest buffers' memory goes
        // back to the allocator when their last holder lets go
        let excess = self.shared.len().saturating_sub(MAX_SHARED);
        self.shared.drain(..excess);
    }

    /// Keeps `v`'s memory if it is worth it and the spares, with it, fit in what the
    /// `in_use` buffered bytes leave of the limit: a connection's memory stays within its
    /// buffer or window, yet every buffer a sender refills is kept. (One acknowledgement
    /// often frees many buffers at once; a pool bounded by a count dropped the rest, and
    /// their successors were faulted in and zeroed afresh.)
    fn keep(&mut self, mut v: Vec<u8>, in_use: u64) {
        let bytes = self.bytes + v.capacity();
        if v.capacity() >= WHOLE_BUFFER && in_use + bytes as u64 <= self.limit {
            v.clear();
            self.bytes = bytes;
            self.bufs.push(v);
        }
    }

    /// A kept buffer (empty), or a new one without memory.
    pub fn take(&mut self) -> Vec<u8> {
        let v = self.bufs.pop().unwrap_or_default();
        self.bytes -= v.capacity();
        v
    }
}

impl State {
    pub fn event(&mut self, event: Event) {
        if self.events.len() >= crate::connection::MAX_QUEUED_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(TimedEvent {
            at: Instant::now(),
            event,
        });
    }

    /// Tells [`Event::AllAcknowledged`] once everything written, and the end of the stream,
    /// is acknowledged (as the UDP transport does); returns whether it told it now.
    pub fn tell_if_all_acknowledged(&mut self) -> bool {
        let tell = !self.all_acknowledged_told && self.striper.all_acknowledged();
        if tell {
            self.all_acknowledged_told = true;
            self.event(Event::AllAcknowledged);
        }
        tell
    }

    /// Whether a non-blocking write that found the send buffer full may retry now, and has
    /// not: room came back for what it needed.
    pub fn writer_may_retry(&self, send_buffer: u64) -> bool {
        let room = send_buffer.saturating_sub(self.charged());
        (self.writers_blocked.iter()).any(|b| b.is_some_and(|need| room >= need))
    }

    pub fn set_link_state(&mut self, l: usize, to: LinkState) {
        let from = self.links[l].state;
        if from != to {
            self.links[l].state = to;
            self.event(Event::LinkStateChanged {
                link: LinkId(l as u8),
                from,
                to,
            });
        }
    }

    /// Ends the connection (once): `why` is `None` for a clean close.
    pub fn end(&mut self, why: Option<ConnectionError>) {
        if self.end.is_none() {
            self.end = Some(why.clone());
            self.ended_at = Some(Instant::now());
            self.event(Event::Closed(why));
        }
    }

    /// The bytes `offset..offset + len` of the send buffer, as slices of its pieces.
    pub fn send_slices(&self, offset: u64, len: u64, out: &mut Vec<Bytes>) {
        let mut at = self.send_base;
        let (mut from, end) = (offset, offset + len);
        for Sequenced { bytes: b, .. } in &self.send_buf {
            let b_end = at + b.len() as u64;
            if b_end > from && at < end {
                let s = (from - at) as usize;
                let e = (end.min(b_end) - at) as usize;
                out.push(b.slice(s..e));
                from = at + e as u64;
            }
            if b_end >= end {
                break;
            }
            at = b_end;
        }
        debug_assert_eq!(out.iter().map(|b| b.len() as u64).sum::<u64>(), len);
    }

    /// Closes the open stream chunk: fills in its header and appends it to the sequence (its
    /// bytes can then be sent). Link writers call it before they look for work.
    pub fn seal_tail(&mut self) {
        if self.tail.is_empty() {
            return;
        }
        let len = self.tail.len() - chunk::HEADER_LEN;
        self.tail[..chunk::HEADER_LEN].copy_from_slice(&chunk::header(Kind::Stream, len));
        let b = self.tail.split().freeze();
        self.striper.push(b.len() as u64);
        self.chunk_ends
            .push_back((self.striper.written(), len as u64));
        self.send_buf.push_back(Sequenced::ours(b));
    }

    /// Appends `data` (at most `WRITE_PIECE` bytes) to the open stream chunk, opening one if
    /// needed: a chunk holds at most `WRITE_PIECE` bytes, so that the tail never grows by
    /// reallocating (a copy of what it holds, into memory faulted in afresh) and links learn
    /// of the bytes of consecutive writes a piece at a time.
    fn append_stream(&mut self, data: &[u8]) {
        debug_assert!(data.len() <= WRITE_PIECE);
        if self.tail.len() + data.len() > chunk::HEADER_LEN + WRITE_PIECE {
            self.seal_tail();
        }
        if self.tail.is_empty() {
            self.tail.extend_from_slice(&[0; chunk::HEADER_LEN]);
        }
        self.tail.extend_from_slice(data);
    }

    /// Appends a whole chunk (its header, then `payload`) to the sequence, after the open
    /// stream chunk.
    fn append_chunk(&mut self, kind: Kind, payload: Sequenced) {
        self.seal_tail();
        let header = chunk::header(kind, payload.bytes.len());
        let header = Sequenced::ours(Bytes::copy_from_slice(&header));
        self.striper
            .push((header.bytes.len() + payload.bytes.len()) as u64);
        let stream = if kind == Kind::Stream {
            payload.bytes.len() as u64
        } else {
            0
        };
        self.chunk_ends.push_back((self.striper.written(), stream));
        self.send_buf.push_back(header);
        self.send_buf.push_back(payload);
    }

    /// Splits the in-order received sequence into stream bytes and whole messages, until
    /// [`Self::max_queued_messages`] wait unread: a message's chunk header is taken from the
    /// window when it is split out, so unread messages of few or no bytes would otherwise
    /// pile up in memory without holding the sender back.
    fn pump(&mut self) -> Result<(), ChunkError> {
        let most = self.max_queued_messages();
        while self.demux.position() < self.reasm.contiguous() && self.messages.len() < most {
            let at = self.demux.position();
            let mut piece = (self.recv.remove(&at)).expect("the contiguous data starts a piece");
            // what the piece's memory holds, near enough (it is a copy, or a slice of at
            // least half a run: see the link reader's `kept`)
            let whole = piece.len();
            while !piece.is_empty() {
                if self.messages.len() >= most {
                    // the limit falls inside the piece (one run may hold many thousands of
                    // small messages): the rest waits, from where the split stopped
                    self.recv.insert(self.demux.position(), piece);
                    break;
                }
                let step = self.demux.step(&piece);
                let Ok(step) = step else {
                    // kept, so a later look finds the piece where it was
                    self.recv.insert(self.demux.position(), piece);
                    return step.map(|_| ());
                };
                match step {
                    Piece::Header { n, empty_message } => {
                        piece.advance(n);
                        self.consume(n as u64);
                        if empty_message {
                            self.messages.push_back(Vec::new());
                        }
                        // room for the whole message at once: grown piece by piece, a large
                        // one was copied again at every doubling, and kept up to twice its
                        // length once read
                        if let Some(len) = self.demux.message_left() {
                            let len = usize::try_from(len).expect("at most the window");
                            self.message_part.reserve_exact(len);
                        }
                    }
                    Piece::Stream(n) => {
                        let last = self.stream_in.back_mut();
                        if last.is_some_and(|last| append_short(last, &piece[..n])) {
                            piece.advance(n);
                        } else if n * 2 < whole {
                            // a slice keeps the whole piece's memory until it is read: stream
                            // bytes much shorter than the piece are copied, else a peer
                            // sending runs of one stream byte among empty chunks would make
                            // this side hold a run's memory per byte of its window
                            self.stream_in
                                .push_back(Bytes::copy_from_slice(&piece[..n]));
                            piece.advance(n);
                        } else {
                            self.stream_in.push_back(piece.split_to(n));
                        }
                    }
                    Piece::Message { n, last } => {
                        self.message_part.extend_from_slice(&piece[..n]);
                        piece.advance(n);
                        if last {
                            let m = std::mem::take(&mut self.message_part);
                            self.messages.push_back(m);
                        }
                    }
                }
            }
        }
        // the end is judged once everything before it was split out: a stop at the limit
        // of unread messages may fall inside a chunk
        if self.peer_finished() {
            self.demux.check_end()?;
        }
        Ok(())
    }

    /// Splits what arrived into the streams (also after the connection ended: what arrived
    /// is still read); a peer that broke the chunk framing ends the connection (and is told
    /// why). Found only after a clean end (the streams' end judged once the application read
    /// up to it), the violation still becomes the connection's end, so that the reads fail
    /// instead of ending as if all had come.
    pub(super) fn pump_or_end(&mut self) {
        const VIOLATION: ConnectionError =
            ConnectionError::ProtocolViolation("malformed chunk in the peer's streams");
        if let Err(e) = self.pump() {
            if self.end == Some(None) {
                tracing::warn!("the connection's end was a violation: {e}");
                self.end = Some(Some(VIOLATION));
            }
            if self.end.is_some() {
                return;
            }
            tracing::warn!("ending the connection: {e}");
            self.close_record = (1, e.to_string());
            for l in &mut self.links {
                l.close_due = l.connected();
            }
            self.end(Some(VIOLATION));
        }
    }

    /// The most whole messages [`Self::pump`] splits out for the application to read: as many
    /// as the receive window holds of 256-byte messages, and never fewer than 4096.
    fn max_queued_messages(&self) -> usize {
        let window = self.reasm.window_end() - self.reasm.consumed();
        usize::try_from(window / 256)
            .unwrap_or(usize::MAX)
            .max(4096)
    }

    /// The application took `n` bytes of the sequence (stream bytes, a message, a header):
    /// the window moves, and the peer hears of it when it moved by `ack_step`, or at once
    /// when it is stalled: it sent all the window allowed, the application read all there
    /// is, and a message waits for the rest of its bytes. (A message of more than three
    /// quarters of the window after a small one read would otherwise wait forever: the room
    /// the small one gave back stays below the step, and nothing else is read.)
    fn consume(&mut self, n: u64) {
        self.reasm.consume(n);
        let stalled = self.reasm.contiguous() >= self.advertised
            && self.demux.message_left().is_some()
            && self.messages.is_empty()
            && self.stream_in.is_empty();
        let moved = self.reasm.window_end() - self.advertised;
        if moved >= self.ack_step || (stalled && moved > 0) {
            self.advertised = self.reasm.window_end();
            self.ack_all();
            self.acks_queued = true;
        }
    }

    /// The peer's streams ended and everything in them was split out.
    fn peer_finished(&self) -> bool {
        self.reasm.complete() && self.demux.position() == self.reasm.contiguous()
    }

    /// Drops acknowledged bytes from the send buffer. A piece of no bytes (a message's
    /// empty payload) is let go as soon as it is at the front: stopping at it would keep all
    /// after it.
    pub fn release(&mut self) {
        let delivered = self.striper.delivered();
        while let Some(&(end, stream)) = self.chunk_ends.front() {
            if end > delivered {
                break;
            }
            self.stream_acked_whole += stream;
            self.chunk_ends.pop_front();
        }
        while let Some(front) = self.send_buf.front_mut() {
            let drop = (delivered - self.send_base).min(front.bytes.len() as u64);
            front.bytes.advance(drop as usize);
            self.send_base += drop;
            if !front.bytes.is_empty() {
                break;
            }
            if let Some(done) = self.send_buf.pop_front() {
                if done.ours {
                    let in_use = self.buffered();
                    self.spare_send.keep_bytes(done.bytes, in_use);
                }
            }
        }
    }

    /// The stream bytes the peer acknowledged: those of the chunks wholly acknowledged, and
    /// of the one partly acknowledged, those past its header (the chunks wholly acknowledged
    /// since the last [`release`](Self::release) are still listed).
    fn stream_acknowledged(&self) -> u64 {
        let delivered = self.striper.delivered();
        let mut acked = self.stream_acked_whole;
        for &(end, stream) in &self.chunk_ends {
            // a chunk's stream bytes end it, after its header
            acked += delivered.min(end).saturating_sub(end - stream);
            if end >= delivered {
                break;
            }
        }
        acked
    }

    /// Written bytes (in the sequence or the open chunk) not acknowledged yet.
    fn buffered(&self) -> u64 {
        self.striper.written() - self.striper.delivered() + self.tail.len() as u64
    }

    /// What the send buffer's limit counts: the bytes not acknowledged yet, and for each
    /// piece held [`PIECE_OVERHEAD`]. Empty messages or 1-byte writes are pieces of their own
    /// (two for a message: its header and its bytes), each its allocation and queue entry:
    /// counted by their bytes alone, they held many times the limit in memory. (A write
    /// needs room for its bytes only: an empty buffer takes the largest message.)
    fn charged(&self) -> u64 {
        self.buffered() + self.send_buf.len() as u64 * PIECE_OVERHEAD
    }

    /// Whether the CLOSE waits no longer: on some link its TCP connection holds nothing the
    /// peer has not acknowledged, CLOSE and all, or no link that took one still has its
    /// TCP connection (or none took one).
    fn close_delivered(&self) -> bool {
        let written = (self.links.iter()).any(|l| l.close_written && l.stream.is_some());
        !written || self.close_arrived()
    }

    /// Keeps `piece`, the received sequence bytes from `at` on, until [`Self::pump`] splits
    /// them into the streams: appended to the piece before it where that is short and ends at
    /// `at` ([`append_short`]).
    pub fn keep_received(&mut self, at: u64, piece: Bytes) {
        if let Some((&start, before)) = self.recv.range_mut(..at).next_back() {
            if start + before.len() as u64 == at && append_short(before, &piece) {
                return;
            }
        }
        self.recv.insert(at, piece);
    }

    /// Sequence bytes that arrived and were not read (or not yet split into the streams).
    pub fn holds_unread(&self) -> bool {
        !(self.recv.is_empty()
            && self.stream_in.is_empty()
            && self.messages.is_empty()
            && self.message_part.is_empty())
    }

    /// Ends the connection now, the links telling the peer `code` and `reason` (the CLOSE
    /// carries the code plus `CLOSE_APP_BASE`: 0 reads as a clean close, and the codes
    /// below the base are the transport's own). A code above `MAX_ABORT_CODE` is sent as
    /// that, as on the UDP transport.
    pub fn abort(&mut self, code: u64, reason: &str) {
        if self.end.is_none() {
            let sent = code.min(crate::MAX_ABORT_CODE) + CLOSE_APP_BASE;
            self.close_record = (sent, reason.to_owned());
            for l in &mut self.links {
                l.close_due = l.connected();
            }
            self.end(Some(ConnectionError::LocallyAborted));
        }
    }

    /// Ended, with a CLOSE of this side's own to tell (a clean end's, an abort's, a
    /// violation's), and not settled: the CLOSE (and a clean end's last ACK) may have been
    /// lost with every link, or found no link up to go on, and the peer would then wait for
    /// it for ever. A connection lingering so keeps its links watched, a client dials those
    /// that die, a server takes their hellos, and each link that comes back sends the ACK
    /// and the CLOSE again (docs/PROTOCOL.md §12.5). Settled by the peer's CLOSE, shortly
    /// after its TCP acknowledged an error end's CLOSE ([`Self::close_arrived`]: no CLOSE
    /// answers that), by a hello turned away, or at the endpoint's close linger.
    pub fn lingering(&self) -> bool {
        let tells = match &self.end {
            None => false,
            Some(None) => true,
            // an end this side's CLOSE did not say (the peer's CLOSE, a silence) tells nothing
            Some(Some(_)) => self.close_record.0 != 0,
        };
        tells && !self.close_settled
    }

    /// Some link's peer acknowledged a CLOSE of this side's, the whole of it: its TCP
    /// connection holds nothing unacknowledged since the CLOSE went into it.
    pub fn close_arrived(&self) -> bool {
        let closed = self.links.iter().filter(|l| l.close_written);
        closed
            .filter_map(|l| l.stream.as_deref())
            .any(|s| super::sys::held(s) == 0)
    }

    /// Whether a link may join the connection: while it is open, and while it lingers.
    pub fn takes_links(&self) -> bool {
        self.end.is_none() || self.lingering()
    }

    /// Both streams are complete: everything this side wrote was acknowledged, and the
    /// peer's whole stream arrived.
    pub fn done(&self) -> bool {
        self.striper.all_acknowledged() && self.reasm.complete()
    }

    /// Asks every up link for an ACK (the window opened, or the stream completed).
    pub fn ack_all(&mut self) {
        for l in &mut self.links {
            if l.connected() {
                l.ack_due = true;
            }
        }
    }

    fn error(&self) -> io::Error {
        match &self.end {
            Some(Some(e)) => crate::udp_connection::lost(e.clone()),
            _ => io::Error::new(io::ErrorKind::NotConnected, "the connection is closed"),
        }
    }
}

/// One connection of the TCP transport.
#[derive(Debug)]
pub(crate) struct TcpConnection {
    pub state: Mutex<State>,
    /// The application waits here (data, room, acknowledgements, the end).
    pub app: Signal,
    /// ... or on these descriptors, signalled at the same moments.
    pub watchers: Watchers,
    /// Each link's writer waits on its own condition variable for something to send, so
    /// that waking one (an ACK due on its link) does not wake them all.
    pub writers: [Signal; MAX_LINKS],
    /// Each link's sending side, held while a batch is written on its TCP connection (lock
    /// order: a `tx`, then `state`).
    pub tx: [Mutex<super::link::Tx>; MAX_LINKS],
    pub settings: Settings,
    pub role: Role,
}

/// Which of the peer's streams a read takes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Incoming {
    Stream,
    Messages,
}

/// What a call looks for: room in the send buffer for a kind of write, or something of the
/// peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Looks {
    Room(Kind),
    Incoming(Incoming),
}

/// The kind of non-blocking call that `looks`.
fn caller_of(looks: Looks) -> Caller {
    match looks {
        Looks::Room(Kind::Stream) => Caller::WriteStream,
        Looks::Room(Kind::Message) => Caller::WriteMessage,
        Looks::Incoming(Incoming::Stream) => Caller::ReadStream,
        Looks::Incoming(Incoming::Messages) => Caller::ReadMessage,
    }
}

/// The slot of a kind of write in `State::writers_blocked`.
fn kind_slot(kind: Kind) -> usize {
    match kind {
        Kind::Stream => 0,
        Kind::Message => 1,
    }
}

impl TcpConnection {
    pub fn new(settings: Settings, role: Role, links: Vec<Link>) -> Arc<Self> {
        let added = links.len().saturating_sub(1);
        let st = State {
            striper: Striper::new(settings.stripe, settings.peer_window),
            reasm: Reassembly::new(settings.window),
            send_buf: VecDeque::new(),
            send_base: 0,
            chunk_ends: VecDeque::new(),
            stream_acked_whole: 0,
            tail: BytesMut::new(),
            recv: BTreeMap::new(),
            // a message as long as the window can still be held whole
            demux: Demux::new(settings.takes_messages.then_some(settings.window)),
            stream_in: VecDeque::new(),
            messages: VecDeque::new(),
            writers_blocked: [None; 2],
            message_part: Vec::new(),
            advertised: settings.window,
            ack_step: settings.window / 4,
            acks_queued: false,
            links,
            // the links besides the first are added with the connection (the UDP transport
            // adds the peer's other addresses once connected)
            events: std::iter::once(Event::Connected)
                .chain((1..=added).map(|i| Event::LinkAdded {
                    link: LinkId(i as u8),
                }))
                .map(|event| TimedEvent {
                    at: Instant::now(),
                    event,
                })
                .collect(),
            all_acknowledged_told: false,
            end: None,
            ended_at: None,
            close_settled: false,
            close_arrived_at: None,
            all_down_since: None,
            timeouts: settings.timeouts,
            slow_links: SlowLinkWatch::default(),
            close_record: (0, String::new()),
            cipher: None,
            spare_send: Spares::new(settings.send_buffer),
            spare_recv: Spares::new(settings.window),
            released: false,
        };
        Arc::new(Self {
            state: Mutex::new(st),
            app: Signal::default(),
            watchers: Watchers::default(),
            writers: std::array::from_fn(|_| Signal::default()),
            tx: std::array::from_fn(|_| Mutex::default()),
            settings,
            role,
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes everyone after a change.
    pub fn wake(&self) {
        self.wake_writers();
        self.notify_app();
    }

    /// Wakes every link's writer (new data, an opened window, a link that went down).
    pub fn wake_writers(&self) {
        // all on each: a writer of the link's previous TCP connection may still wait there
        self.writers.iter().for_each(Signal::notify_all);
    }

    /// After the application wrote: when little is buffered (a message, a request), sends at
    /// once on the links that can take it from this thread, and wakes the writers only for
    /// what is left: a hand-off to a writer thread would add its wake-up to every small
    /// message's delivery. A stream that keeps the buffer full is left to the writers, so
    /// the application's next read or computation runs beside their sending. Releases
    /// `st` first.
    fn send_or_wake(&self, st: MutexGuard<'_, State>) {
        let direct = st.buffered() <= DIRECT_SEND_MAX;
        let links = st.links.len();
        drop(st);
        if !direct || super::link::send_now(self, links) {
            self.wake_writers();
        }
    }

    /// Wakes link `l`'s writer (something is due on its link alone).
    pub fn wake_writer(&self, l: usize) {
        if let Some(w) = self.writers.get(l) {
            w.notify_all();
        }
    }

    /// Wakes the application: its waiting calls and its readiness descriptors. Called after
    /// the change is made, so a non-blocking call that clears a descriptor and then looks
    /// (under the lock) never misses it.
    pub fn notify_app(&self) {
        self.app.notify_all();
        self.watchers.signal_all();
    }

    /// [`Self::notify_app`] for a change that concerns only the callers `event` names, as
    /// the UDP transport's engine reports it: bytes or a message to read
    /// ([`Event::Readable`]), or room for a writer that found none ([`Event::Writable`]).
    /// The other side's descriptors stay as they are: an event loop waiting for an answer
    /// is not woken by the acknowledgement of its request. (The waiting calls share one
    /// condition variable and look again.)
    pub fn notify_app_of(&self, event: &Event) {
        self.app.notify_all();
        self.watchers.signal(event);
    }

    /// The readiness descriptor for `interest` (made under the lock, so no signal races it).
    /// See [`crate::Connection::signal_again`].
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub fn signal_again(&self, interest: Interest) {
        self.watchers.signal_again(interest);
    }

    pub fn readiness_fd(&self, interest: Interest) -> io::Result<std::os::fd::BorrowedFd<'_>> {
        let _st = self.lock();
        self.watchers.fd(interest)
    }

    /// See [`crate::Connection::look_without_receiving`] (no datagrams here: nothing to do).
    pub fn look_without_receiving(&self, caller: Caller) {
        if caller == Caller::ReadMessage {
            drop(self.lock_for(Looks::Incoming(Incoming::Messages), false));
        }
    }

    /// Locks the state for a call that `looks` for something. A non-blocking one clears its
    /// readiness descriptors first, and signals them again for what waits for callers of
    /// another kind (`Watchers::signal_waiting`): a reader at once, a writer once it knows
    /// whether it found room ([`Self::room_for`]).
    fn lock_for(&self, looks: Looks, block: bool) -> MutexGuard<'_, State> {
        let mut st = self.lock();
        if block {
            return st;
        }
        self.watchers.clear(caller_of(looks));
        // split what arrived into the streams, to see what waits there
        let reads = match looks {
            Looks::Incoming(kind) => Some(kind),
            Looks::Room(_) => None,
        };
        self.pump_for(&mut st, reads);
        self.send_queued_acks(&mut st);
        if let Looks::Incoming(_) = looks {
            self.signal_waiting(&st, looks);
        }
        st
    }

    /// What a non-blocking call that `looks` leaves waiting for callers of other kinds
    /// (`Watchers::signal_waiting`): what there is to read, and room a blocked writer's need
    /// fits and no writer took yet.
    fn signal_waiting(&self, st: &State, looks: Looks) {
        let other = |kind| looks != Looks::Incoming(kind);
        let waiting = Waiting {
            readable: (other(Incoming::Stream) && !st.stream_in.is_empty())
                || (other(Incoming::Messages) && !st.messages.is_empty()),
            writer_may_retry: st.writer_may_retry(self.settings.send_buffer),
        };
        self.watchers.signal_waiting(caller_of(looks), waiting);
    }

    /// Splits what arrived into the streams ([`State::pump_or_end`]) for a call that reads
    /// `reads` (none: a writer). What the split made readable for the other kind of read (for
    /// a writer, either) is told to the calls of that kind waiting on other threads: no
    /// arrival will wake them, these bytes came before, held back while the unread messages
    /// were at their limit.
    fn pump_for(&self, st: &mut State, reads: Option<Incoming>) {
        // the pump only adds: new pieces, or bytes appended to the last stream piece
        let stream_mark = |st: &State| {
            (
                st.stream_in.len(),
                st.stream_in.back().map_or(0, Bytes::len),
            )
        };
        let (stream, messages) = (stream_mark(st), st.messages.len());
        st.pump_or_end();
        let more_stream = stream_mark(st) != stream;
        let more_messages = st.messages.len() > messages;
        let for_other = match reads {
            Some(Incoming::Stream) => more_messages,
            Some(Incoming::Messages) => more_stream,
            None => more_stream || more_messages,
        };
        if for_other {
            self.notify_app_of(&Event::Readable);
        }
    }

    /// Wakes the link writers if reading queued ACKs.
    fn send_queued_acks(&self, st: &mut State) {
        if std::mem::take(&mut st.acks_queued) {
            self.wake_writers();
        }
    }

    fn wait<'a>(
        &self,
        st: MutexGuard<'a, State>,
        deadline: Option<Instant>,
    ) -> MutexGuard<'a, State> {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        self.app.wait(st, left)
    }

    /// Locks the state for a write of `kind` and waits (when `block`, until `deadline`) until
    /// the send buffer has room for `need` bytes (any room when `need` is 0); the error that
    /// ended the connection, `WouldBlock` when not blocking, `TimedOut` after the deadline.
    fn room_for(
        &self,
        kind: Kind,
        need: u64,
        block: bool,
        deadline: Option<Instant>,
    ) -> io::Result<MutexGuard<'_, State>> {
        let mut st = self.lock_for(Looks::Room(kind), block);
        loop {
            let open = writable(&st);
            let room = self.settings.send_buffer.saturating_sub(st.charged());
            let fits = open.is_ok() && room > 0 && room >= need;
            let blocked = &mut st.writers_blocked[kind_slot(kind)];
            if fits {
                // a need the buffer has room for was told (the descriptor was signalled when
                // the room came): this writer takes the room, and the need's own writer, if
                // another, was woken with it and looks again
                if blocked.is_some_and(|need| room >= need) {
                    *blocked = None;
                }
            } else if open.is_ok() && !block {
                // several writers may wait (tasks sharing the descriptor): the least need
                // wakes them, the one it fits writes, the others wait again for theirs. A need
                // that fits stays told: this look cleared the descriptor its writer waits on,
                // which is signalled again for it
                *blocked = Some(blocked.map_or(need, |b| b.min(need)).max(1));
            }
            if !block {
                self.signal_waiting(&st, Looks::Room(kind));
            }
            open?;
            if fits {
                return Ok(st);
            }
            if !block {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(io::ErrorKind::TimedOut.into());
            }
            st = self.wait(st, deadline);
        }
    }

    /// Takes as much of `data` as the send buffer has room for, copying it into the open
    /// tail a piece of at most `WRITE_PIECE` bytes at a time: each piece is sealed and the
    /// links woken before the next is copied, so that a large write is on the wire while
    /// the rest of it is still being copied. Waits for room until `deadline` when `block`.
    pub fn write(&self, data: &[u8], block: bool, deadline: Option<Instant>) -> io::Result<usize> {
        if data.is_empty() {
            // nothing to take, but a write after the end fails, as on the UDP transport
            return writable(&self.lock()).map(|()| 0);
        }
        let mut st = self.room_for(Kind::Stream, 0, block, deadline)?;
        let mut n = 0;
        loop {
            let room = self.settings.send_buffer.saturating_sub(st.charged());
            let piece = (data.len() - n).min(room as usize).min(WRITE_PIECE);
            if piece == 0 {
                // the buffer filled (on the first round `room` saw to it that it had not)
                break;
            }
            st.append_stream(&data[n..n + piece]);
            n += piece;
            if n == data.len() {
                break;
            }
            st.seal_tail();
            self.send_or_wake(st);
            st = self.lock();
            if st.end.is_some() || st.striper.finished() {
                // what was taken stands; the next call reports why no more is
                return Ok(n);
            }
        }
        self.send_or_wake(st);
        Ok(n)
    }

    /// Takes `buf` whole when it is large (no copy), leaving it empty (with the memory of a
    /// buffer already acknowledged, when there is one).
    pub fn write_buf(&self, buf: &mut Vec<u8>) -> io::Result<()> {
        while !buf.is_empty() {
            self.take_buf(buf, true, None)?;
        }
        Ok(())
    }

    /// What [`Self::write_buf`] takes of `buf` in one go: a large one whole (leaving it empty,
    /// with the memory of a buffer already acknowledged when there is one), a small one as far
    /// as there is room (the bytes taken leave its front). Returns how many bytes; waits for
    /// room when `block` (until `deadline`), else says `WouldBlock`.
    pub fn take_buf(
        &self,
        buf: &mut Vec<u8>,
        block: bool,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        if buf.len() < WHOLE_BUFFER {
            let n = self.write(buf, block, deadline)?;
            buf.drain(..n);
            return Ok(n);
        }
        let mut st = self.room_for(Kind::Stream, 0, block, deadline)?;
        let spare = st.spare_send.take();
        let data = Bytes::from(std::mem::replace(buf, spare));
        let n = data.len();
        if n <= chunk::MAX_CHUNK {
            st.append_chunk(Kind::Stream, Sequenced::ours(data));
        } else {
            // A chunk's length has 32 bits: a larger buffer goes as several sharing its
            // memory, none copied. Their memory goes back to the allocator once the last is
            // acknowledged (no single piece could be reclaimed as a spare while the others
            // hold it, and none so large would be kept).
            let mut at = 0;
            while at < data.len() {
                let end = data.len().min(at + chunk::MAX_CHUNK);
                let piece = Sequenced {
                    bytes: data.slice(at..end),
                    ours: false,
                };
                st.append_chunk(Kind::Stream, piece);
                at = end;
            }
        }
        self.send_or_wake(st);
        Ok(n)
    }

    /// Takes `data` as [`Self::write_buf`] takes a buffer, a large one shared rather than
    /// copied (whole); a small or very large one is copied as by [`Self::write`]. Returns how
    /// many bytes were taken; waits for room when `block`, else says `WouldBlock`.
    pub fn write_bytes(&self, data: &Bytes, block: bool) -> io::Result<usize> {
        if data.len() < WHOLE_BUFFER || data.len() > chunk::MAX_CHUNK {
            return self.write(data, block, None);
        }
        let mut st = self.room_for(Kind::Stream, 0, block, None)?;
        let shared = Sequenced {
            bytes: data.clone(),
            ours: false,
        };
        st.append_chunk(Kind::Stream, shared);
        self.send_or_wake(st);
        Ok(data.len())
    }

    /// Sends `msg` as one chunk, waiting for room for all of it (until `deadline`) unless
    /// `block` is false.
    pub fn send_message(
        &self,
        msg: &[u8],
        block: bool,
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        if !self.settings.peer_takes_messages {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                ri2n_proto::WriteError::MessagesRefused,
            ));
        }
        let max = self.settings.max_message();
        if msg.len() as u64 > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                ri2n_proto::WriteError::MessageTooLarge {
                    size: msg.len(),
                    limit: usize::try_from(max).unwrap_or(usize::MAX),
                },
            ));
        }
        let need = (chunk::HEADER_LEN + msg.len()) as u64;
        let mut st = self.room_for(Kind::Message, need, block, deadline)?;
        st.append_chunk(Kind::Message, Sequenced::ours(Bytes::copy_from_slice(msg)));
        self.send_or_wake(st);
        Ok(())
    }

    pub fn finish(&self) -> io::Result<()> {
        let mut st = self.lock();
        if let Some(Some(e)) = &st.end {
            return Err(crate::udp_connection::lost(e.clone()));
        }
        st.seal_tail();
        st.striper.finish();
        // a writer waiting for room (another thread's, or task's) retries now and meets the
        // end; none waits after it
        st.writers_blocked = [None; 2];
        drop(st);
        self.wake_writers();
        self.notify_app_of(&Event::Writable);
        Ok(())
    }

    /// Waits until `from` has something to read; `Ok(None)` at the end of the peer's
    /// streams.
    fn readable<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        from: Incoming,
        block: bool,
        deadline: Option<Instant>,
    ) -> io::Result<Option<MutexGuard<'a, State>>> {
        loop {
            self.pump_for(&mut st, Some(from));
            // headers taken may have moved the window
            self.send_queued_acks(&mut st);
            let ready = match from {
                Incoming::Stream => !st.stream_in.is_empty(),
                Incoming::Messages => !st.messages.is_empty(),
            };
            if ready {
                return Ok(Some(st));
            }
            // the end of the streams, unless it fell inside a chunk (the end is then why)
            if st.peer_finished() && st.demux.check_end().is_ok() {
                return Ok(None);
            }
            if st.end.is_some() {
                return Err(st.error());
            }
            if !block || deadline.is_some_and(|d| Instant::now() >= d) {
                let kind = match block {
                    true => io::ErrorKind::TimedOut,
                    false => io::ErrorKind::WouldBlock,
                };
                return Err(kind.into());
            }
            st = self.wait(st, deadline);
        }
    }

    /// Takes up to `max` bytes of the next received stream piece.
    fn take_piece(&self, st: &mut State, max: usize) -> Bytes {
        let mut piece = st.stream_in.pop_front().expect("a piece is waiting");
        let out = if piece.len() > max {
            let head = piece.split_to(max);
            st.stream_in.push_front(piece);
            head
        } else {
            piece
        };
        st.consume(out.len() as u64);
        self.send_queued_acks(st);
        out
    }

    /// Reads what the stream holds; waits for it until `deadline` when `block` (an error of
    /// kind `TimedOut` after it), else not at all (`WouldBlock`).
    pub fn read(
        &self,
        buf: &mut [u8],
        block: bool,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let st = self.lock_for(Looks::Incoming(Incoming::Stream), block);
        let Some(mut st) = self.readable(st, Incoming::Stream, block, deadline)? else {
            return Ok(0);
        };
        let mut n = 0;
        while n < buf.len() && !st.stream_in.is_empty() {
            let piece = self.take_piece(&mut st, buf.len() - n);
            buf[n..n + piece.len()].copy_from_slice(&piece);
            n += piece.len();
        }
        self.signal_own_left(&st, Incoming::Stream, block);
        Ok(n)
    }

    /// After a non-blocking read of `from`: what is left of its kind keeps that kind's own
    /// descriptor signalled (`Watchers::signal_own_kind`).
    fn signal_own_left(&self, st: &State, from: Incoming, block: bool) {
        let (left, caller) = match from {
            Incoming::Stream => (!st.stream_in.is_empty(), Caller::ReadStream),
            Incoming::Messages => (!st.messages.is_empty(), Caller::ReadMessage),
        };
        if left && !block {
            self.watchers.signal_own_kind(caller);
        }
    }

    /// Replaces `buf` with the next received piece, whole (without a copy when nothing else
    /// holds the piece's memory). Returns its length (0: the end of the stream).
    pub fn read_buf(&self, buf: &mut Vec<u8>) -> io::Result<usize> {
        let Some(mut st) = self.readable(self.lock(), Incoming::Stream, true, None)? else {
            buf.clear();
            return Ok(0);
        };
        let piece = self.take_piece(&mut st, usize::MAX);
        let unread = st.reasm.contiguous() - st.reasm.consumed();
        st.spare_recv.keep(std::mem::take(buf), unread);
        drop(st);
        let n = piece.len();
        *buf = Vec::from(piece);
        Ok(n)
    }

    /// Replaces `chunk` with the next received piece, as it is (no copy); its old memory
    /// goes to the link readers' spares if nothing else holds it. (Not when something does:
    /// the other holder is often a piece of the same buffer still to be read, and two pieces
    /// of one buffer waiting in the spares for each other would keep it forever.) Returns
    /// its length (0: the end of the stream). Waits for it when `block`, else says
    /// `WouldBlock` when there is none yet.
    pub fn read_chunk(&self, chunk: &mut Bytes, block: bool) -> io::Result<usize> {
        let st = self.lock_for(Looks::Incoming(Incoming::Stream), block);
        let Some(mut st) = self.readable(st, Incoming::Stream, block, None)? else {
            *chunk = Bytes::new();
            return Ok(0);
        };
        let piece = self.take_piece(&mut st, usize::MAX);
        let unread = st.reasm.contiguous() - st.reasm.consumed();
        let done = std::mem::replace(chunk, piece);
        st.spare_recv
            .keep(reclaim(done).unwrap_or_default(), unread);
        self.signal_own_left(&st, Incoming::Stream, block);
        Ok(chunk.len())
    }

    /// The next whole message; `Ok(None)` at the end of the peer's streams. Waits until
    /// `deadline` when `block` (an error of kind `TimedOut` after it), else not at all
    /// (`WouldBlock`).
    pub fn recv_message(
        &self,
        block: bool,
        deadline: Option<Instant>,
    ) -> io::Result<Option<Vec<u8>>> {
        if !self.settings.takes_messages {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this connection takes no messages (its configuration says so)",
            ));
        }
        let st = self.lock_for(Looks::Incoming(Incoming::Messages), block);
        let Some(mut st) = self.readable(st, Incoming::Messages, block, deadline)? else {
            return Ok(None);
        };
        let m = st.messages.pop_front().expect("a message is waiting");
        st.consume(m.len() as u64);
        self.send_queued_acks(&mut st);
        self.signal_own_left(&st, Incoming::Messages, block);
        Ok(Some(m))
    }
    pub fn wait_acknowledged(&self, timeout: Option<Duration>) -> io::Result<()> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut st = self.lock();
        loop {
            if st.striper.all_acknowledged() {
                return Ok(());
            }
            if st.end.is_some() {
                return Err(st.error());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(io::ErrorKind::TimedOut.into());
            }
            st = self.wait(st, deadline);
        }
    }

    pub fn is_acknowledged(&self) -> bool {
        self.lock().striper.all_acknowledged()
    }

    /// The peer's whole stream arrived, its end included.
    pub fn peer_stream_complete(&self) -> bool {
        self.lock().reasm.complete()
    }

    /// Written bytes the peer has not acknowledged.
    pub fn unacknowledged(&self) -> u64 {
        self.lock().buffered()
    }

    /// Ends the connection now, telling the peer why.
    pub fn abort(&self, code: u64, reason: &str) {
        self.lock().abort(code, reason);
        self.wake();
    }

    /// The application let go of its handle: the stream is finished, and the watch aborts
    /// the connection once what this side wrote is delivered if the peer's data then goes
    /// unread, as the UDP transport does (its writes would otherwise be taken until the
    /// window is full, then wait for ever).
    pub fn release(&self) {
        self.lock().released = true;
        let _ = self.finish();
    }

    /// Ends the connection as its endpoint closes: the peer gets a CLOSE (code 0: it reads a
    /// clean close if everything both ways was delivered, `ClosedEarly` otherwise). Waits at
    /// most `max` for the CLOSE to be written and for one link's peer to acknowledge it: it
    /// waits in the TCP connection behind what the link held, and a process that exited
    /// before would lose it (its host resets a connection on which data still arrives).
    pub fn close(&self, max: Duration) {
        let deadline = Instant::now() + max;
        let mut st = self.lock();
        if st.end.is_none() {
            for l in &mut st.links {
                l.close_due = l.connected();
            }
            st.end(None);
        }
        self.wake();
        while st.links.iter().any(|l| l.close_due) && Instant::now() < deadline {
            st = self.wait(
                st,
                Some(deadline.min(Instant::now() + Duration::from_millis(5))),
            );
        }
        // the peer's acknowledgements are not signalled: looked at every millisecond
        while !st.close_delivered() && Instant::now() < deadline {
            st = self.wait(
                st,
                Some(deadline.min(Instant::now() + Duration::from_millis(1))),
            );
        }
    }

    pub fn state(&self) -> ConnectionState {
        if self.lock().end.is_some() {
            ConnectionState::Closed
        } else {
            ConnectionState::Established
        }
    }

    /// Puts `timeouts` in force from now on (the link watch looks at them every round).
    pub fn set_timeouts(&self, timeouts: Timeouts) {
        self.lock().timeouts = timeouts;
    }

    pub fn close_reason(&self) -> Option<ConnectionError> {
        self.lock().end.clone().flatten()
    }

    pub fn poll_events(&self) -> Vec<TimedEvent> {
        std::mem::take(&mut self.lock().events).into()
    }

    pub fn stats(&self) -> ConnectionStats {
        let st = self.lock();
        let links = (st.links.iter().enumerate())
            .map(|(i, l)| {
                let mut s = LinkStats::new(LinkId(i as u8), l.local, l.remote, l.state);
                s.srtt = l.srtt;
                s.min_rtt = l.min_rtt;
                s.cwnd = l.cwnd;
                s.bytes_sent = l.bytes_sent;
                s.bytes_received = l.bytes_received;
                s.stream_bytes_sent = l.stream_bytes_sent;
                s.stream_bytes_acked = l.stream_bytes_acked;
                s
            })
            .collect();
        let mut s = ConnectionStats::new(links);
        s.send_buffered = st.buffered();
        s.recv_buffered = st.reasm.buffered();
        s.recv_fragments = st.reasm.holes();
        s.bytes_acknowledged = st.striper.delivered();
        s.stream_acknowledged = st.stream_acknowledged();
        s.bytes_received = st.reasm.contiguous();
        s.cipher = st.cipher;
        s
    }
}

/// Whether the streams still take writes: the error that ended the connection (a connection
/// lost says why; one closed cleanly was finished here first: a write after it is one after
/// the end of the stream, EPIPE, as on the UDP transport).
fn writable(st: &State) -> io::Result<()> {
    if matches!(st.end, Some(Some(_))) {
        return Err(st.error());
    }
    if st.striper.finished() {
        return Err(io::Error::new(
            io::ErrorKind::BrokenPipe,
            ri2n_proto::WriteError::Finished,
        ));
    }
    if st.end.is_some() {
        return Err(st.error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spares_hold_no_more_than_the_buffered_bytes_leave_of_the_limit() {
        let mut spares = Spares::new(4 * WHOLE_BUFFER as u64);
        for _ in 0..8 {
            spares.keep(Vec::with_capacity(WHOLE_BUFFER), WHOLE_BUFFER as u64);
        }
        assert_eq!(spares.bufs.len(), 3);
        assert_eq!(spares.bytes, 3 * WHOLE_BUFFER);
        // too small to be worth keeping
        spares.keep(Vec::with_capacity(64), 0);
        assert_eq!(spares.bufs.len(), 3);
        let v = spares.take();
        assert!(v.is_empty() && v.capacity() == WHOLE_BUFFER);
        assert_eq!(spares.bytes, 2 * WHOLE_BUFFER);
    }

    /// The payload length of each chunk the connection has sequenced so far, the open one
    /// sealed first.
    fn chunk_lengths(conn: &TcpConnection) -> Vec<usize> {
        let mut st = conn.lock();
        st.seal_tail();
        (st.send_buf.iter())
            .map(|b| b.bytes.len() - chunk::HEADER_LEN)
            .collect()
    }

    /// Stream bytes much shorter than the run they came in are read from a copy: unread, a
    /// slice would keep the whole run's memory for them. (A peer sending 4 MiB runs of one
    /// stream byte among empty chunks grew the receiver by 4 MiB per byte of its window.)
    #[test]
    fn a_few_stream_bytes_do_not_keep_their_run_s_memory() {
        let settings = Settings::new(
            &ConnectionConfig::default(),
            &EndpointConfig::new(Vec::new()),
            1,
        );
        let conn = TcpConnection::new(settings, Role::Server, Vec::new());
        let mut st = conn.lock();
        let run_of = |stream: usize| {
            let mut run = chunk::header(Kind::Stream, stream).to_vec();
            run.extend(std::iter::repeat_n(b'x', stream));
            while run.len() + chunk::HEADER_LEN <= 64 << 10 {
                run.extend_from_slice(&chunk::header(Kind::Stream, 0));
            }
            Bytes::from(run)
        };
        for stream in [1, 60 << 10] {
            let run = run_of(stream);
            let at = st.reasm.contiguous();
            st.reasm.accept(0, at, run.len() as u64).unwrap();
            st.recv.insert(at, run.clone());
            st.pump().unwrap();
            let piece = st.stream_in.pop_back().expect("the stream bytes");
            assert_eq!(piece.len(), stream);
            let inside = run.as_ptr_range().contains(&piece.as_ptr());
            // one byte: a copy; most of the run: a slice, not copied again
            assert_eq!(inside, stream > 1, "{stream} bytes");
        }
    }

    /// What the peer acknowledged of the stream leaves out the chunks' headers and the
    /// messages, wherever the acknowledgement falls (in a header, a message, a stream
    /// chunk's bytes), before and after the chunks wholly acknowledged are let go.
    #[test]
    fn the_stream_acknowledged_counts_the_stream_s_own_bytes() {
        let settings = Settings::new(
            &ConnectionConfig::default(),
            &EndpointConfig::new(Vec::new()),
            1,
        );
        let conn = TcpConnection::new(settings, Role::Server, Vec::new());
        let mut st = conn.lock();
        // stream 10 bytes (sequence 0..15), a 7-byte message (15..27), stream 20 (27..52)
        st.append_stream(&[1; 10]);
        st.append_chunk(Kind::Message, Sequenced::ours(Bytes::from_static(&[2; 7])));
        st.append_stream(&[3; 20]);
        st.seal_tail();
        assert_eq!(st.striper.written(), 52);
        st.striper.link_up(0, Duration::from_millis(1));
        // the peer's window, then the link sends it all
        st.striper.on_ack(0, 0, 0, 1 << 20, false);
        while st.striper.next(0).is_some() {}
        for (delivered, stream, release) in [
            (0, 0, false),
            (3, 0, true),
            (12, 7, false),
            (15, 10, false),
            (20, 10, true),
            (30, 10, false),
            (40, 18, true),
            (52, 30, false),
            (52, 30, true),
        ] {
            st.striper.on_ack(0, delivered, delivered, u64::MAX, false);
            if release {
                st.release();
            }
            assert_eq!(st.stream_acknowledged(), stream, "{delivered} delivered");
        }
        assert!(st.chunk_ends.is_empty());
    }

    #[test]
    fn writes_are_sequenced_in_chunks_of_at_most_a_piece() {
        let settings = Settings::new(
            &ConnectionConfig::default(),
            &EndpointConfig::new(Vec::new()),
            1,
        );
        // no links: what is written stays in the sequence
        let conn = TcpConnection::new(settings.clone(), Role::Server, Vec::new());
        assert_eq!(
            conn.write(&vec![1; 4 * WRITE_PIECE + 10], false, None)
                .unwrap(),
            4 * WRITE_PIECE + 10
        );
        assert_eq!(
            chunk_lengths(&conn),
            [WRITE_PIECE, WRITE_PIECE, WRITE_PIECE, WRITE_PIECE, 10]
        );

        // consecutive writes fill a chunk up to a piece, then start the next: the open chunk
        // never grows beyond one
        let conn = TcpConnection::new(settings, Role::Server, Vec::new());
        for _ in 0..10 {
            conn.write(&[2; 100 << 10], false, None).unwrap();
        }
        assert_eq!(
            chunk_lengths(&conn),
            [200 << 10, 200 << 10, 200 << 10, 200 << 10, 200 << 10]
        );
    }

    #[test]
    fn a_message_longer_than_a_chunk_can_hold_is_refused() {
        // buffers and windows larger than a chunk header can describe
        let mut big = ConnectionConfig::default();
        big.send_buffer = 8 << 30;
        big.stream_receive_window = 8 << 30;
        let mut settings = Settings::new(&big, &EndpointConfig::new(Vec::new()), 1);
        settings.peer_takes_messages = true;
        settings.peer_window = 8 << 30;
        // `send_message` refuses what is longer (a message of 2^32 + 10 bytes had its length
        // cut to 10 in its chunk's header, and the rest read as more chunks)
        assert_eq!(settings.max_message(), chunk::MAX_CHUNK as u64);
    }

    /// One run holding far more empty messages than may wait unread is split up to that
    /// limit only, and the rest as the application reads: before, the whole run was split
    /// at once (a 4 MiB run of headers is some 840 000 messages in memory).
    #[test]
    fn a_run_of_many_messages_is_split_only_up_to_the_limit() {
        let mut cfg = ConnectionConfig::default();
        cfg.stream_receive_window = 1 << 20;
        let conn = TcpConnection::new(
            Settings::new(&cfg, &EndpointConfig::new(Vec::new()), 1),
            Role::Server,
            Vec::new(),
        );
        let mut st = conn.lock();
        let most = st.max_queued_messages();
        let count = 5 * most;
        let run: Vec<u8> = (0..count)
            .flat_map(|_| chunk::header(Kind::Message, 0))
            .collect();
        let new = st.reasm.accept(0, 0, run.len() as u64).unwrap();
        assert_eq!(new.len(), 1, "the premise: one piece, all of it new");
        st.recv.insert(0, Bytes::from(run));
        let mut read = 0;
        while read < count {
            st.pump().unwrap();
            assert!(st.messages.len() <= most, "{} split out", st.messages.len());
            assert!(!st.messages.is_empty(), "stuck after {read}");
            while let Some(m) = st.messages.pop_front() {
                assert!(m.is_empty());
                read += 1;
            }
        }
        st.pump().unwrap();
        assert_eq!((read, st.messages.len()), (count, 0));
    }

    #[test]
    fn a_buffer_a_writer_still_shares_is_kept_once_the_writer_lets_go() {
        let mut spares = Spares::new(u64::MAX);
        let done = Bytes::from(vec![7u8; WHOLE_BUFFER]);
        let writer_slice = done.slice(100..200);
        spares.keep_bytes(done, 0);
        assert!(spares.bufs.is_empty(), "kept while shared");
        drop(writer_slice);
        spares.keep_bytes(Bytes::from(vec![1u8; 5]), 0);
        assert_eq!(spares.bufs.len(), 1);
        assert!(spares.shared.is_empty());
        assert_eq!(spares.take().capacity(), WHOLE_BUFFER);
    }
}
