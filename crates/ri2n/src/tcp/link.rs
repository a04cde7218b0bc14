//! The threads that run a TCP-transport connection's links:
//!
//! - a **writer** per link: takes the link's next run (or repair, ACK, PING, FIN, CLOSE)
//!   under the lock, then writes it without the lock; its TCP connection's back-pressure
//!   decides how much the link takes;
//! - a **reader** per link: parses records, reads each run straight into a buffer of its
//!   own and hands it to the reassembly, which places it by the link's order; it writes the
//!   ACKs it owes itself while no one else writes on the link ([`ack_now`]);
//! - a **watch** thread per connection: declares a link dead when it has received nothing
//!   for a few round trips (both ends PING idle links), asks for PINGs, samples TCP_INFO,
//!   and on the client starts a **dialer** for each dead link (`super::dial`), which opens a
//!   new TCP connection as soon as the path works again; after the connection ended it goes
//!   on so until this side's CLOSE is known to have arrived (`State::lingering`).
//!
//! A link's threads belong to one TCP connection (its *incarnation*): when the link dies or
//! is replaced they find a newer incarnation and stop.
//!
//! Readers run under `SCHED_BATCH` ([`yield_to_busy_threads`]): woken for what arrived, a
//! reader waits for the thread running on its CPU to finish its call instead of preempting
//! it, and then finds more to read at once; what waits meanwhile waits in the TCP
//! connection's receive buffer. Writers keep the default policy: the kernel holds little
//! unsent data for them (`TCP_NOTSENT_LOWAT`), so a writer that waited behind a busy thread
//! would leave its link idle.

use std::io::{self, IoSlice, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use ri2n_proto::tcp::frame::{close_reason, CLOSE_APP_BASE, MAX_REASON};
use ri2n_proto::tcp::keys::{ClientLinkHandshake, FrameKey, FrameKeys, MAX_FRAME};
use ri2n_proto::tcp::{Hello, HelloReply, HelloStatus, LinkView, PlacementError, Record, Work};
use ri2n_proto::Key;
use ri2n_proto::{ConnectionError, Event, LinkId, LinkState};
use smallvec::SmallVec;

use super::conn::{Link, Role, State, TcpConnection};
use super::sys;
use crate::sched::yield_to_busy_threads;

/// Bytes a reader asks the kernel for at once: a few records, or a run's header and the first
/// of its bytes, which are copied into the run's buffer; the rest of a run goes straight into
/// that buffer, however long. The same for sealed frames: a few short ones, or the start of a
/// long one (a run's), whose rest goes straight into the memory it is opened in.
const RECORD_READ: usize = 4 << 10;
/// How often the watch thread looks at the links (and sends the ACKs still owed).
const WATCH_TICK: Duration = Duration::from_millis(2);
/// Run bytes a link receives before it owes an ACK at once: one ACK per run would wake both
/// ends' threads for every run.
const ACK_EVERY: u64 = 256 << 10;
/// How often it samples each link's round trip from TCP_INFO.
const RTT_SAMPLE: Duration = Duration::from_millis(20);
/// How long the peer's host must have refused every link before the peer counts as gone.
const PEER_GONE: Duration = Duration::from_millis(500);
/// How long the threads of an ended connection keep going, to let a CLOSE record out.
const CLOSE_LINGER: Duration = Duration::from_millis(200);
/// How often the next hop of each link is confirmed (see [`sys::confirm_next_hop`]).
const CONFIRM_EVERY: Duration = Duration::from_millis(500);
/// Confirmation stops on a link not heard from for this long: the peer's interface may have
/// been replaced, and the OS should resolve its address again.
const CONFIRM_FOR: Duration = Duration::from_secs(15 * 60);

/// Makes `stream` link `l`'s TCP connection (a new one, or the replacement of a dead one)
/// and starts its threads.
pub(crate) fn attach(
    conn: &Arc<TcpConnection>,
    l: usize,
    stream: TcpStream,
    leftover: BytesMut,
    keys: Option<FrameKeys>,
) -> io::Result<()> {
    let stream = Arc::new(stream);
    let (local, remote) = (stream.local_addr()?, stream.peer_addr()?);
    let rtt = sys::rtt_and_cwnd(&stream).map_or(Duration::ZERO, |r| r.0);
    let mut st = conn.lock();
    if !st.takes_links() {
        let _ = stream.shutdown(Shutdown::Both);
        return Ok(());
    }
    // a lingering connection's ACK and CLOSE go again on the link that came back
    let again = st.end.is_some();
    while st.links.len() <= l {
        // a link number the server had not seen: a placeholder until it opens
        st.links
            .push(super::conn::Link::new(local, remote, Instant::now()));
        let added = st.links.len() - 1;
        if added > 0 {
            st.event(Event::LinkAdded {
                link: LinkId(added as u8),
            });
        }
    }
    let now = Instant::now();
    let link = &mut st.links[l];
    if let Some(old) = link.stream.take() {
        let _ = old.shutdown(Shutdown::Both);
    }
    link.incarnation += 1;
    link.stream = Some(stream.clone());
    (link.local, link.remote) = (local, remote);
    (link.last_rx, link.last_tx) = (now, now);
    link.srtt = rtt;
    if link.min_rtt.is_zero() || rtt < link.min_rtt {
        link.min_rtt = rtt;
    }
    (link.dialing, link.ack_due, link.acked_link_bytes) = (false, true, 0);
    // a CLOSE written into the TCP connection this one replaces is not in this one
    (link.close_due, link.close_written) = (again, false);
    (link.last_ack_progress, link.paused_until) = (now, None);
    (link.refused_since, link.awaiting_answer) = (None, None);
    let incarnation = link.incarnation;
    st.cipher = keys.as_ref().map(|k| k.cipher);
    st.striper.link_up(l, rtt);
    st.reasm.link_up(l);
    st.set_link_state(l, LinkState::Up);
    st.all_down_since = None;
    drop(st);
    let (seal, open) = keys.map(|k| (k.seal, k.open)).unzip();
    {
        // after the state's lock: whoever holds a link's `tx` may take the state's lock
        let mut tx = conn.tx[l].lock().unwrap_or_else(|e| e.into_inner());
        if tx.incarnation > incarnation {
            // a newer TCP connection of the link was attached between the state's lock and
            // this one, and it replaced (and shut down) this one: its writer stays
            return Ok(());
        }
        *tx = Tx {
            incarnation,
            stream: Some(stream.clone()),
            seal,
            ..Tx::default()
        };
    }
    conn.wake();
    let (c, s) = (conn.clone(), stream.clone());
    std::thread::Builder::new()
        .name(format!("ri2n-tcp-w{l}"))
        .spawn(move || writer(&c, l, incarnation, &s))?;
    let c = conn.clone();
    std::thread::Builder::new()
        .name(format!("ri2n-tcp-r{l}"))
        .spawn(move || {
            yield_to_busy_threads();
            reader(&c, l, incarnation, &stream, leftover, open)
        })?;
    Ok(())
}

/// Declares link `l` dead (if `incarnation` is still its TCP connection): what it had in
/// flight goes to the other links, and its TCP connection is closed. `refused`: the peer's
/// side closed or reset it (see `Link::refused_since`).
pub(crate) fn fail(
    conn: &TcpConnection,
    st: &mut State,
    l: usize,
    incarnation: u64,
    refused: bool,
) {
    let link = &mut st.links[l];
    if link.incarnation != incarnation || link.state == LinkState::Down {
        return;
    }
    link.refused_since = refused.then(Instant::now);
    if let Some(s) = link.stream.take() {
        let _ = s.shutdown(Shutdown::Both);
    }
    link.next_dial = Instant::now();
    st.striper.link_down(l);
    st.set_link_state(l, LinkState::Down);
    if st.links.iter().all(|l| !l.connected()) {
        st.all_down_since.get_or_insert_with(Instant::now);
    }
    conn.wake();
}

/// Whether an I/O error says the peer's side of the TCP connection is gone (closed or reset)
/// rather than silent.
pub(super) fn closed_by_peer(kind: io::ErrorKind) -> bool {
    matches!(
        kind,
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionRefused
    )
}

/// The most slices one `sendmsg` takes.
const MAX_SLICES: usize = libc::UIO_MAXIOV as usize;

/// Writes `bufs` from byte `written` on, with `MSG_NOSIGNAL`: a peer that closed the
/// connection is an error here, never a SIGPIPE that ends the process (`writev`, which
/// `TcpStream::write_vectored` makes, raises one, and a C program, unlike a Rust or Python
/// one, does not ignore it). Unless `wait`, it writes only what the socket takes at once, and
/// returns how far it got when the socket is full. Returns the bytes written in all.
fn write_from(
    s: &TcpStream,
    mut bufs: &mut [IoSlice<'_>],
    mut written: usize,
    wait: bool,
) -> io::Result<usize> {
    let s = socket2::SockRef::from(s);
    let flags = libc::MSG_NOSIGNAL | if wait { 0 } else { libc::MSG_DONTWAIT };
    IoSlice::advance_slices(&mut bufs, written);
    while !bufs.is_empty() {
        // a run of small messages has more slices than one call takes (EMSGSIZE beyond)
        let some = bufs.len().min(MAX_SLICES);
        match s.send_vectored_with_flags(&bufs[..some], flags) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                IoSlice::advance_slices(&mut bufs, n);
                written += n;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && !wait => return Ok(written),
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

/// A link's sending side, held by whoever writes on its TCP connection: the link's writer
/// thread, or an application thread that found the link able to take data at once (see
/// [`send_now`]), so that one batch of records is never interleaved with another.
#[derive(Default)]
pub(crate) struct Tx {
    /// The TCP connection it sends on (`Link::incarnation`), and that connection's sealing
    /// key.
    incarnation: u64,
    stream: Option<Arc<TcpStream>>,
    seal: Option<FrameKey>,
    head: Vec<u8>,
    payload: Vec<Bytes>,
    /// The batch sealed as one frame, its first `sealed` bytes (keyed links).
    frame: Vec<u8>,
    sealed: usize,
    /// The batch ends with the CLOSE.
    closing: bool,
    /// How much of the batch a write that did not wait left behind it: whoever holds the
    /// link's sending side next writes the rest before anything else.
    unsent: Option<usize>,
}

impl Tx {
    /// Writes the composed records (`head`) and the run's bytes (`payload`) on `s`, sealed as
    /// one frame on a keyed link; or the rest of them, after a write that did not wait.
    /// Unless `wait`, only what the socket takes at once: `Ok(false)` when some is left
    /// ([`Tx::unsent`]).
    fn write(&mut self, s: &TcpStream, wait: bool) -> io::Result<bool> {
        let written = match self.unsent.take() {
            Some(written) => written,
            None => {
                // keyed: the records and the run's bytes sealed as one frame, in place
                if let Some(key) = &mut self.seal {
                    let mut records: Vec<&[u8]> = Vec::with_capacity(1 + self.payload.len());
                    records.push(&self.head);
                    records.extend(self.payload.iter().map(|b| &b[..]));
                    self.sealed = key.seal(&records, &mut self.frame).len();
                }
                0
            }
        };
        let res = match &self.seal {
            None => {
                let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(1 + self.payload.len());
                slices.push(IoSlice::new(&self.head));
                slices.extend(self.payload.iter().map(|b| IoSlice::new(b)));
                let total = slices.iter().map(|b| b.len()).sum::<usize>();
                write_from(s, &mut slices, written, wait).map(|n| (n, total))
            }
            Some(_) => {
                let frame = &self.frame[..self.sealed];
                write_from(s, &mut [IoSlice::new(frame)], written, wait).map(|n| (n, frame.len()))
            }
        };
        if let Ok((n, total)) = res {
            if n < total {
                self.unsent = Some(n);
                return Ok(false);
            }
        }
        // the run's slices go now: while they live, the send buffer's memory they point into
        // cannot be reused once acknowledged
        self.payload.clear();
        res?;
        // a key that sealed its share: a new TCP connection brings fresh keys
        match self.seal.as_ref().is_some_and(FrameKey::worn_out) {
            true => Err(io::ErrorKind::Other.into()),
            false => Ok(true),
        }
    }
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tx {{ incarnation: {} }}", self.incarnation)
    }
}

/// The ACK link `l` sends: what arrived on it, and of the whole sequence.
fn ack_record(st: &State, l: usize) -> Record {
    Record::Ack {
        link_bytes: st.reasm.link_bytes(l),
        delivered: st.reasm.contiguous(),
        window_end: st.reasm.window_end(),
        eof: st.reasm.complete(),
    }
}

/// Sends link `l`'s due ACK from the calling reader thread, when no one else is writing on
/// the link and its TCP connection takes a few bytes at once: on a link that mostly
/// receives, an ACK is nearly all its writer sends, and waking that thread for each one
/// cost more than the write. Returns `false` when the writer must send it instead (a reader
/// never waits to write: its peer may be waiting for it to read). Whoever holds the link's
/// sending side composes again once it let go of it (the writer's loop, [`send_now`]), so
/// the ACK then goes with it: waking the writer as well cost a wake-up per message.
pub(crate) fn ack_now(conn: &TcpConnection, l: usize) -> bool {
    let Ok(mut tx) = conn.tx[l].try_lock() else {
        return true;
    };
    let Some(s) = tx.stream.clone() else {
        return false;
    };
    // a batch partly written goes on first, whole
    if tx.unsent.is_some() || !matches!(sys::wait_writable(&s, Duration::ZERO), Ok(true)) {
        return false;
    }
    let mut st = conn.lock();
    let link = &mut st.links[l];
    if link.incarnation != tx.incarnation || !link.connected() || link.close_due {
        return false;
    }
    if !std::mem::take(&mut link.ack_due) {
        return true;
    }
    link.rx_unacked = 0;
    link.last_tx = Instant::now();
    tx.head.clear();
    tx.payload.clear();
    ack_record(&st, l).encode(&mut tx.head);
    st.links[l].bytes_sent += tx.head.len() as u64;
    drop(st);
    tx.closing = false;
    match tx.write(&s, false) {
        Ok(all) => all, // else the writer writes the rest
        Err(e) => {
            let mut st = conn.lock();
            fail(conn, &mut st, l, tx.incarnation, closed_by_peer(e.kind()));
            true
        }
    }
}

/// What one look at the connection gave a link's sender.
enum Compose {
    /// Records (and a run's bytes) to write; `true`: a CLOSE, the last.
    Send(bool),
    /// Nothing due now.
    Idle,
    /// The connection ended and nothing is left to say on this link.
    Stop,
}

/// Encodes what link `l` sends next into `head` (records) and `payload` (the run's bytes,
/// after the last record), claiming its run; `held`: the bytes its TCP connection holds.
fn compose(
    st: &mut State,
    l: usize,
    held: u64,
    head: &mut Vec<u8>,
    payload: &mut Vec<Bytes>,
) -> Compose {
    head.clear();
    payload.clear();
    let mut closing = false;
    let link = &mut st.links[l];
    let ack_due = std::mem::take(&mut link.ack_due);
    let ping_due = std::mem::take(&mut link.ping_due);
    // cleared by the writer once the CLOSE is written (`TcpConnection::close` waits)
    let close_due = link.close_due;
    if ack_due || close_due {
        link.rx_unacked = 0;
        ack_record(st, l).encode(head);
    }
    if close_due {
        let (code, reason) = &st.close_record;
        let reason = close_reason(reason).as_bytes();
        Record::Close {
            code: *code,
            reason_len: reason.len() as u16,
        }
        .encode(head);
        head.extend_from_slice(reason);
        closing = true;
    } else if st.end.is_none() {
        // an idle link's silence is not slowness: its stall clock starts with its next run
        if st.striper.in_flight(l) == 0 {
            st.links[l].last_ack_progress = Instant::now();
        }
        st.seal_tail();
        st.striper.note_held(l, Instant::now(), held);
        match st.striper.next(l) {
            Some(Work::Run { round, offset, len }) => {
                if let Some(r) = round {
                    Record::Round {
                        pos: r.pos,
                        backward: r.backward,
                    }
                    .encode(head);
                }
                Record::Run { len: len as u32 }.encode(head);
                st.send_slices(offset, len, payload);
                st.links[l].stream_bytes_sent += len;
            }
            Some(Work::Repair { offset, len }) => {
                Record::Repair {
                    offset,
                    len: len as u32,
                }
                .encode(head);
                st.send_slices(offset, len, payload);
                st.links[l].stream_bytes_sent += len;
            }
            Some(Work::Fin { end }) => Record::Fin { end }.encode(head),
            None => {}
        }
    }
    if head.is_empty() && ping_due {
        Record::Ping.encode(head);
    }
    if !head.is_empty() {
        let link = &mut st.links[l];
        link.last_tx = Instant::now();
        link.bytes_sent += head.len() as u64 + payload.iter().map(|b| b.len() as u64).sum::<u64>();
        return Compose::Send(closing);
    }
    match st.end {
        Some(_) => Compose::Stop,
        None => Compose::Idle,
    }
}

/// What one batch came to.
enum Batch<'a> {
    /// Written.
    Sent,
    /// Written in part: the socket was full, and the caller did not wait. The rest waits in
    /// the link's `Tx` for the writer thread.
    Partly,
    /// Nothing was due: the state, still locked, to wait on.
    Idle(MutexGuard<'a, State>),
    /// The link's sending is over: its TCP connection failed or was replaced, or the
    /// connection ended.
    Over,
}

/// Composes and writes one batch on link `l` for the holder of its `tx`, or the rest of the
/// one a write left partly unwritten; waits for room in the socket if `wait`.
fn send_batch<'a>(conn: &'a TcpConnection, l: usize, tx: &mut Tx, wait: bool) -> Batch<'a> {
    let Some(s) = tx.stream.clone() else {
        return Batch::Over;
    };
    if tx.unsent.is_none() {
        let held = sys::held(&s);
        let mut st = conn.lock();
        let link = &st.links[l];
        if link.incarnation != tx.incarnation || !link.connected() {
            return Batch::Over;
        }
        tx.closing = match compose(&mut st, l, held, &mut tx.head, &mut tx.payload) {
            Compose::Send(closing) => closing,
            Compose::Idle => return Batch::Idle(st),
            Compose::Stop => return Batch::Over,
        };
    }
    let res = tx.write(&s, wait);
    if matches!(res, Ok(false)) {
        return Batch::Partly;
    }
    if tx.closing {
        let _ = s.shutdown(Shutdown::Write);
        let mut st = conn.lock();
        // a replacement since carries its own CLOSE (`attach`)
        if st.links[l].incarnation == tx.incarnation {
            st.links[l].close_due = false;
            st.links[l].close_written = res.is_ok();
        }
        drop(st);
        conn.notify_app();
        return Batch::Over;
    }
    if let Err(e) = res {
        let mut st = conn.lock();
        fail(conn, &mut st, l, tx.incarnation, closed_by_peer(e.kind()));
        return Batch::Over;
    }
    Batch::Sent
}

/// Sends what is due on every link whose TCP connection takes data at once and whose writer
/// is not sending, from the calling (application) thread: a message goes out without
/// waking a writer thread first. It never waits for room in a socket: what a full one does
/// not take is left to the link's writer. `links`: how many the connection has. Returns
/// whether work is left for the writers.
pub(crate) fn send_now(conn: &TcpConnection, links: usize) -> bool {
    let mut partly = false;
    for (l, tx) in conn.tx.iter().enumerate().take(links) {
        // again when an ACK fell due while this thread held the link (see [`ack_now`])
        loop {
            let Ok(mut tx) = tx.try_lock() else {
                break;
            };
            let writable = tx
                .stream
                .as_deref()
                .map(|s| sys::wait_writable(s, Duration::ZERO));
            if !matches!(writable, Some(Ok(true))) {
                break;
            }
            // never waiting for room: this is the application's thread, perhaps an async
            // runtime's, and the writer thread takes over what the socket leaves
            let batch = send_batch(conn, l, &mut tx, false);
            drop(tx);
            match batch {
                Batch::Partly => {
                    partly = true;
                    break;
                }
                Batch::Sent if conn.lock().links[l].ack_due => {}
                _ => break,
            }
        }
    }
    let st = conn.lock();
    partly || st.striper.has_work() || !st.tail.is_empty()
}

/// Link `l`'s writer thread, for its TCP connection `incarnation`.
fn writer(conn: &Arc<TcpConnection>, l: usize, incarnation: u64, s: &TcpStream) {
    loop {
        // claim work only once the TCP connection can take it: a run claimed while the last
        // one still waits in the unsent queue is committed to this link early, and the links
        // end a message unevenly
        match sys::wait_writable(s, conn.settings.keepalive) {
            Ok(true) => {}
            Ok(false) => {
                let st = conn.lock();
                let link = &st.links[l];
                // an ended connection's CLOSE still waits for room behind what the link
                // holds (until the watch shuts the link, `CLOSE_LINGER` after the end)
                let ended = st.end.is_some() && !link.close_due;
                if link.incarnation != incarnation || !link.connected() || ended {
                    return;
                }
                continue;
            }
            Err(e) => {
                let mut st = conn.lock();
                fail(conn, &mut st, l, incarnation, closed_by_peer(e.kind()));
                return;
            }
        }
        let mut tx = conn.tx[l].lock().unwrap_or_else(|e| e.into_inner());
        if tx.incarnation != incarnation {
            return;
        }
        match send_batch(conn, l, &mut tx, true) {
            Batch::Sent | Batch::Partly => {}
            Batch::Over => return,
            Batch::Idle(st) => {
                // let an application thread send meanwhile; wait under the same lock, so no
                // wake-up falls between the look and the wait
                drop(tx);
                drop(conn.writers[l].wait(st, Some(conn.settings.keepalive)));
            }
        }
    }
}

/// Reads records from a link, buffering what arrives beyond the current record. On a keyed
/// link the socket's bytes are sealed frames: `raw` holds them until a whole one arrived,
/// and `buf` its opened records. Every read marks the link heard from, as its bytes come:
/// a long frame on a slow link takes longer than the silence that declares a link dead.
struct RecordReader<'a> {
    s: &'a TcpStream,
    /// Whose link this is, and whose spare receive buffers a long frame is opened in.
    conn: &'a TcpConnection,
    link: usize,
    /// The link's TCP connection this reader reads.
    incarnation: u64,
    buf: BytesMut,
    open: Option<FrameKey>,
    raw: BytesMut,
    /// The kind of the last I/O error, which ended the link.
    failed: Option<io::ErrorKind>,
}

impl RecordReader<'_> {
    /// Marks the link heard from, `n` bytes just read; `false` if it runs on another TCP
    /// connection now (this reader's threads should stop).
    fn heard(&self, n: usize) -> bool {
        heard(&mut self.conn.lock(), self.link, self.incarnation, n)
    }

    /// Reads more into the buffer (on a keyed link: one whole frame, opened); returns
    /// whether the link still runs on this reader's TCP connection. `Err` at the peer's
    /// close, and for a frame that does not open.
    fn fill(&mut self) -> io::Result<bool> {
        let Some(key) = &mut self.open else {
            if self.buf.capacity() - self.buf.len() < 512 {
                self.buf.reserve(RECORD_READ);
            }
            return match sys::read_into(self.s, &mut self.buf, RECORD_READ)? {
                0 => Err(io::ErrorKind::UnexpectedEof.into()),
                n => Ok(self.heard(n)),
            };
        };
        let mut current = true;
        // a little at first: the length, and whole any short frames after it (ACKs); the
        // rest of a long one goes straight into its own memory
        while self.raw.len() < 4 {
            match sys::read_into(self.s, &mut self.raw, RECORD_READ)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => current = heard(&mut self.conn.lock(), self.link, self.incarnation, n),
            }
        }
        let len = [self.raw[0], self.raw[1], self.raw[2], self.raw[3]];
        let body = u32::from_be_bytes(len) as usize;
        if !(ri2n_proto::crypto::TAG_LEN..=MAX_FRAME).contains(&body) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "frame length"));
        }
        let mut frame = if self.raw.len() >= 4 + body {
            let mut frame = self.raw.split_to(4 + body);
            let _ = frame.split_to(4);
            frame
        } else {
            // A frame longer than what came with its length (a run's) is opened in memory of
            // its own, the rest of it read straight into it: the chunks of it the application
            // holds then pin no buffer later frames are read into, and that memory comes back
            // to the spares once the application lets go.
            let spare = self.conn.lock().spare_recv.take();
            // a spare too small is dropped, not grown: growing copies its old capacity
            let mut v = match spare.capacity() >= body {
                true => spare,
                false => Vec::with_capacity(body),
            };
            v.extend_from_slice(&self.raw[4..]);
            self.raw.clear();
            while v.len() < body {
                let want = body - v.len();
                match sys::read_into_vec(self.s, &mut v, want)? {
                    0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                    n => current = heard(&mut self.conn.lock(), self.link, self.incarnation, n),
                }
            }
            BytesMut::from(Bytes::from(v))
        };
        let n = key
            .open(len, &mut frame)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        frame.truncate(n);
        if self.buf.is_empty() {
            self.buf = frame;
        } else {
            self.buf.extend_from_slice(&frame);
        }
        Ok(current)
    }

    /// The next `len` bytes, whole: what is buffered, then straight from the socket into
    /// `spare`'s memory (on a keyed link, from the opened frames).
    fn payload(&mut self, len: usize, spare: Vec<u8>) -> io::Result<Bytes> {
        if self.open.is_some() {
            while self.buf.len() < len {
                self.fill()?;
            }
        }
        if self.buf.len() >= len {
            if len < RECORD_READ {
                // a short payload is copied out: a slice would keep the memory of the whole
                // read (or frame) alive while its bytes wait to be read, and a peer sending
                // tiny pieces, a read each, would hold far more memory than its window
                let piece = Bytes::copy_from_slice(&self.buf[..len]);
                self.buf.advance(len);
                return Ok(piece);
            }
            return Ok(self.buf.split_to(len).freeze());
        }
        // a spare too small is dropped, not grown: growing copies its old capacity
        let mut out = if spare.capacity() >= len {
            spare
        } else {
            Vec::with_capacity(len)
        };
        out.clear();
        out.extend_from_slice(&self.buf.split());
        while out.len() < len {
            let want = len - out.len();
            match sys::read_into_vec(self.s, &mut out, want)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => {
                    self.heard(n);
                }
            }
        }
        Ok(Bytes::from(out))
    }
}

fn reader(
    conn: &Arc<TcpConnection>,
    l: usize,
    incarnation: u64,
    s: &Arc<TcpStream>,
    leftover: BytesMut,
    open: Option<FrameKey>,
) {
    // what came after the hello: records, or on a keyed link sealed frames
    let (buf, raw) = match open {
        None => (leftover, BytesMut::new()),
        Some(_) => (BytesMut::new(), leftover),
    };
    let mut r = RecordReader {
        s,
        conn,
        link: l,
        incarnation,
        buf,
        open,
        raw,
        failed: None,
    };
    r.buf.reserve(RECORD_READ);
    let res = read_records(conn, l, incarnation, &mut r);
    let mut st = conn.lock();
    match res {
        Ok(()) => {}
        // the peer broke the protocol: it is told why, on every link (this one too: it is
        // not failed here, the watch shuts the links `CLOSE_LINGER` after the end), as for a
        // violation found in its streams (`State::pump_or_end`)
        Err(Some(why)) => {
            if st.end.is_none() {
                st.close_record = (1, why.to_string());
                for l in &mut st.links {
                    l.close_due = l.connected();
                }
            }
            st.end(Some(why));
            conn.wake();
        }
        Err(None) if r.failed == Some(io::ErrorKind::UnexpectedEof) => {
            // the peer's host ended its side without a CLOSE: the peer's process is gone, or
            // the peer replaced a link it found silent, maybe as the path went dark one way
            // only. A refusal once the host answers this side's end too (`fail` shuts the TCP
            // connection, unless a silence failed the link first; the watch looks for the
            // answer): through a path dark this way none comes, and the peer, alive and
            // dialling, is not taken for gone.
            fail(conn, &mut st, l, incarnation, false);
            if st.links[l].incarnation == incarnation {
                st.links[l].awaiting_answer = Some(s.clone());
            }
        }
        Err(None) => {
            let refused = r.failed.is_some_and(closed_by_peer);
            fail(conn, &mut st, l, incarnation, refused);
        }
    }
}

/// The new bytes `range` of a run's `data`, to keep until they are read: a slice of it, or
/// a copy when they are less than half of it. A slice keeps the whole run's memory alive,
/// and a peer repairing long runs that each bring one new byte would otherwise make the
/// receiver hold a run's memory per byte of its window.
fn kept(data: &Bytes, range: std::ops::Range<usize>) -> Bytes {
    if range.len() * 2 < data.len() {
        Bytes::copy_from_slice(&data[range])
    } else {
        data.slice(range)
    }
}

/// Marks link `l` as heard from now; `false` if its threads should stop.
fn heard(st: &mut State, l: usize, incarnation: u64, bytes: usize) -> bool {
    let Some(link) = st.links.get_mut(l) else {
        return false;
    };
    link.last_rx = Instant::now();
    link.bytes_received += bytes as u64;
    link.incarnation == incarnation
}

/// The connection's state if link `l` still runs on TCP connection `incarnation`: records
/// an older one had buffered must not touch the link's newer connection (its cursor, its
/// byte counts).
fn current(conn: &TcpConnection, l: usize, incarnation: u64) -> Option<MutexGuard<'_, State>> {
    let st = conn.lock();
    (st.links[l].incarnation == incarnation).then_some(st)
}

/// Reads the link's records until it fails (`Err(None)`) or the peer breaks the protocol
/// or ends the connection (`Err(Some(why))`); `Ok` once the link runs on another TCP
/// connection.
fn read_records(
    conn: &Arc<TcpConnection>,
    l: usize,
    incarnation: u64,
    r: &mut RecordReader<'_>,
) -> Result<(), Option<ConnectionError>> {
    let violation = |what: &'static str| Some(ConnectionError::ProtocolViolation(what));
    loop {
        let (record, n) = loop {
            match Record::parse(&r.buf) {
                Ok(Some(x)) => break x,
                Ok(None) => {
                    let current = r.fill().map_err(|e| {
                        r.failed = Some(e.kind());
                        None
                    })?;
                    if !current {
                        return Ok(());
                    }
                }
                Err(_) => return Err(violation("malformed record on a TCP link")),
            }
        };
        let _ = r.buf.split_to(n);
        match record {
            Record::Run { len } | Record::Repair { len, .. } => {
                let len = u64::from(len);
                let Some(mut st) = current(conn, l, incarnation) else {
                    return Ok(());
                };
                let offset = match record {
                    Record::Repair { offset, .. } => offset,
                    _ => (st.reasm.place_run(l, len))
                        .map_err(|_| violation("a run outside its round or window"))?,
                };
                let spare = st.spare_recv.take();
                drop(st);
                let data = r.payload(len as usize, spare).map_err(|e| {
                    r.failed = Some(e.kind());
                    None
                })?;
                let Some(mut st) = current(conn, l, incarnation) else {
                    return Ok(());
                };
                let contiguous = st.reasm.contiguous();
                let new = (st.reasm.accept(l, offset, len)).map_err(|e| {
                    violation(match e {
                        PlacementError::TooScattered(_) => "stream bytes in too many pieces",
                        PlacementError::BadFin(_) => "stream bytes past the end of the stream",
                        PlacementError::OutsideWindow(_) | PlacementError::NoRound => {
                            "stream bytes outside the receive window"
                        }
                    })
                })?;
                for g in new {
                    let (s, e) = ((g.start - offset) as usize, (g.end - offset) as usize);
                    st.keep_received(g.start, kept(&data, s..e));
                }
                // an ACK when everything so far arrived (a message's or a burst's end), else
                // every ACK_EVERY bytes; the watch thread sends what is left within a tick
                let caught_up = st.reasm.holes() == 0;
                let link = &mut st.links[l];
                link.rx_unacked += len;
                let ack = link.rx_unacked >= ACK_EVERY || caught_up;
                link.ack_due |= ack;
                let readable = st.reasm.contiguous() > contiguous;
                drop(st);
                // the application first: the ACK's system calls are not on the path of a
                // message to the thread waiting for it
                if readable {
                    conn.notify_app_of(&Event::Readable);
                }
                if ack && !ack_now(conn, l) {
                    conn.wake_writer(l);
                }
            }
            Record::Round { pos, backward } => {
                let Some(mut st) = current(conn, l, incarnation) else {
                    return Ok(());
                };
                (st.reasm.round(l, pos, backward))
                    .map_err(|_| violation("a round outside the receive window"))?;
            }
            Record::Ack {
                link_bytes,
                delivered,
                window_end,
                eof,
            } => {
                let Some(mut st) = current(conn, l, incarnation) else {
                    return Ok(());
                };
                let before = st.striper.delivered();
                if st.striper.on_ack(l, link_bytes, delivered, window_end, eof) {
                    // as the striper took it: no more than the link sent (the peer's word)
                    let link_bytes = st.striper.link_acked(l);
                    let link = &mut st.links[l];
                    let gained = link_bytes.saturating_sub(link.acked_link_bytes);
                    if gained > 0 {
                        link.last_ack_progress = Instant::now();
                    }
                    link.acked_link_bytes = link.acked_link_bytes.max(link_bytes);
                    link.stream_bytes_acked += gained;
                    let freed = st.striper.delivered() > before;
                    if freed {
                        st.release();
                    }
                    let told = st.tell_if_all_acknowledged();
                    let done = st.done();
                    if done {
                        // both streams complete: say so, then end (the peer does too)
                        st.ack_all();
                    }
                    // only who has a reason to look: the ACK of a message's last bytes would
                    // otherwise wake the application waiting for the answer, and every idle
                    // writer, for nothing. The writers look while bytes are in flight: what
                    // their TCP connections hold then is how the next partition is shared
                    // (`Striper::note_held` measures their drain rates).
                    let work = st.striper.has_work() || st.striper.any_in_flight() || done;
                    let settled = freed || done || st.striper.all_acknowledged();
                    // the descriptors only for whom it concerns, as the UDP transport's
                    // events do: an event, the end, or room for a writer that found none
                    let everyone = told || done;
                    let writer = freed && st.writer_may_retry(conn.settings.send_buffer);
                    drop(st);
                    if work {
                        conn.wake_writers();
                    }
                    if everyone {
                        conn.notify_app();
                    } else if writer {
                        conn.notify_app_of(&Event::Writable);
                    } else if settled {
                        // a call blocked for room or for the acknowledgements looks again
                        conn.app.notify_all();
                    }
                }
            }
            Record::Fin { end } => {
                let Some(mut st) = current(conn, l, incarnation) else {
                    return Ok(());
                };
                (st.reasm.fin(end)).map_err(|_| {
                    violation("an end of stream that moved, or before bytes already received")
                })?;
                st.links[l].ack_due = true;
                drop(st);
                conn.wake();
            }
            Record::Ping => {}
            Record::Close { code, reason_len } => {
                let reason = (r.payload(usize::from(reason_len), Vec::new())).unwrap_or_default();
                let reason = String::from_utf8_lossy(&reason[..reason.len().min(MAX_REASON)]);
                let st = conn.lock();
                let reason = reason.into_owned();
                let why = match code.checked_sub(CLOSE_APP_BASE) {
                    Some(code) => Some(ConnectionError::PeerAborted { code, reason }),
                    None if code != 0 => Some(ConnectionError::PeerError { code, reason }),
                    None if st.done() => None,
                    None => Some(ConnectionError::ClosedEarly),
                };
                drop(st);
                let mut st = conn.lock();
                // the peer ended: nothing more to linger for. A clean CLOSE that ends this
                // side is answered with its own, which tells the peer its end arrived.
                st.close_settled = true;
                if st.end.is_none() && why.is_none() {
                    st.links[l].close_due = true;
                }
                st.end(why);
                drop(st);
                conn.wake();
                return Ok(());
            }
        }
    }
}

/// The connection's watch thread (see the module documentation). Returns once the
/// connection ended and its links were closed.
pub(crate) fn watch(conn: &Arc<TcpConnection>) {
    let origin = Instant::now();
    let (mut last_sample, mut last_confirm) = (origin, origin);
    loop {
        std::thread::sleep(WATCH_TICK);
        let now = Instant::now();
        let sample = now - last_sample >= RTT_SAMPLE;
        if sample {
            last_sample = now;
        }
        let confirm = now - last_confirm >= CONFIRM_EVERY;
        if confirm {
            last_confirm = now;
        }
        let mut st = conn.lock();
        if let Some(at) = st.ended_at {
            // an end the peer did not confirm is waited on for the endpoint's linger; an
            // error end's CLOSE, which no CLOSE answers, until `CLOSE_LINGER` after the peer's
            // TCP acknowledged it: the hellos of the peer's other dials, which may be on their
            // way meanwhile, still find the connection and carry the CLOSE, where being told
            // it is unknown would make the peer take this side for restarted
            if matches!(st.end, Some(Some(_)))
                && st.close_arrived_at.is_none()
                && st.close_arrived()
            {
                st.close_arrived_at = Some(now);
            }
            let told = st.close_arrived_at.is_some_and(|t| now - t >= CLOSE_LINGER);
            if st.lingering() && (told || now - at >= conn.settings.close_linger.max(CLOSE_LINGER))
            {
                st.close_settled = true;
            }
            if !st.lingering() {
                if now - at >= CLOSE_LINGER || st.links.iter().all(|l| l.stream.is_none()) {
                    for link in &mut st.links {
                        if let Some(s) = link.stream.take() {
                            let _ = s.shutdown(Shutdown::Both);
                        }
                    }
                    drop(st);
                    conn.wake();
                    return;
                }
                continue;
            }
        }
        // past here once ended only while lingering: its links are watched and dialled as an
        // open connection's, nothing else is done for it
        let open = st.end.is_none();
        // let go of by its application with the peer's data unread, once all it wrote is
        // delivered (the reader still acknowledges what arrives)
        if open && st.released && st.striper.all_acknowledged() && st.holds_unread() {
            st.abort(0, crate::connection::UNREAD);
            drop(st);
            conn.wake();
            continue;
        }
        // both streams complete and acknowledged: one CLOSE, unless the peer's streams ended
        // inside a chunk (a violation, told as one: its reader may never look)
        if open && st.done() && !st.links.iter().any(|l| l.ack_due) {
            st.pump_or_end();
            if st.end.is_none() {
                if let Some(i) = close_link(&st.links) {
                    st.links[i].close_due = true;
                }
                st.end(None);
            }
            drop(st);
            conn.wake();
            continue;
        }
        for i in 0..st.links.len() {
            let link = &mut st.links[i];
            if confirm && now - link.last_rx < CONFIRM_FOR {
                if link.confirmer.is_none() {
                    let mut from = link.local;
                    from.set_port(0);
                    link.confirmer = std::net::UdpSocket::bind(from).ok();
                }
                if let Some(via) = &link.confirmer {
                    sys::confirm_next_hop(via, link.remote);
                }
            }
            if let Some(answer) = link
                .awaiting_answer
                .as_deref()
                .and_then(sys::close_answered)
            {
                if answer {
                    link.refused_since.get_or_insert(now);
                }
                link.awaiting_answer = None;
            }
            if !link.connected() {
                continue;
            }
            // an ACK owed: due now, and the writer woken again if nothing went out on the link
            // for a tick (the thread that held the link when it fell due did not see it, see
            // `ack_now`)
            if link.rx_unacked > 0 && (!link.ack_due || now - link.last_tx >= WATCH_TICK) {
                link.ack_due = true;
                conn.wake_writer(i);
            }
            if sample {
                if let Some((rtt, cwnd)) = link.stream.as_deref().and_then(sys::rtt_and_cwnd) {
                    link.srtt = rtt;
                    link.cwnd = cwnd;
                    if link.min_rtt.is_zero() || rtt < link.min_rtt {
                        link.min_rtt = rtt;
                    }
                    st.striper.set_srtt(i, rtt);
                }
            }
            let link = &mut st.links[i];
            let dead_after = conn.settings.dead_after(link.min_rtt.max(link.srtt / 2));
            if now - link.last_rx > dead_after {
                // the reader may only be behind (a busy host leaves its SCHED_BATCH thread off
                // the CPU): what the kernel received is heard
                let arrived = (link.stream.as_deref())
                    .and_then(sys::since_data_arrived)
                    .and_then(|ago| now.checked_sub(ago));
                link.last_rx = link.last_rx.max(arrived.unwrap_or(link.last_rx));
            }
            if now - link.last_rx > dead_after {
                let inc = link.incarnation;
                fail(conn, &mut st, i, inc, false);
            } else if now - link.last_tx >= conn.settings.keepalive {
                link.ping_due = true;
                conn.wake_writer(i);
            }
        }
        if !open {
            dial_dead_links(conn, &mut st, now);
            continue;
        }
        soft_failure(conn, &mut st, now, origin);
        // every link the peer ever had was closed or refused by its host for a while: its
        // process is gone (a network outage only silences links)
        let opened = st
            .links
            .iter()
            .filter(|l| l.incarnation > 0 || l.refused_since.is_some());
        if opened.clone().count() > 0
            && opened.clone().all(|l| !l.connected())
            && opened
                .clone()
                .all(|l| l.refused_since.is_some_and(|t| now - t >= PEER_GONE))
        {
            st.end(Some(ConnectionError::PeerGone));
            conn.wake();
            continue;
        }
        if let (Some(since), Some(limit)) = (st.all_down_since, st.timeouts.all_links_down) {
            if now - since > limit {
                st.end(Some(ConnectionError::AllLinksDown));
                conn.wake();
                continue;
            }
        }
        // nothing from the peer on any link (its PINGs included) for the idle timeout: its
        // host is gone without a word, or every path to it (once the application let go of
        // the connection, for the endpoint's close_linger too: nobody else would end it)
        let heard = st.links.iter().map(|l| l.last_rx).max().unwrap_or(origin);
        let let_go = (st.released).then(|| {
            crate::connection::let_go_silence(conn.settings.close_linger, conn.settings.keepalive)
        });
        let silence = match (st.timeouts.idle, let_go) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if silence.is_some_and(|limit| now - heard > limit) {
            st.end(Some(ConnectionError::IdleTimeout));
            conn.wake();
            continue;
        }
        dial_dead_links(conn, &mut st, now);
    }
}

/// A client's links that are not connected are dialled again, each at most once at a time
/// and not before its `next_dial`.
fn dial_dead_links(conn: &Arc<TcpConnection>, st: &mut State, now: Instant) {
    let Role::Client { pairs } = &conn.role else {
        return;
    };
    for (i, &(local, remote)) in pairs.iter().enumerate() {
        let link = &mut st.links[i];
        if !link.connected() && !link.dialing && now >= link.next_dial {
            link.dialing = true;
            let c = conn.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("ri2n-tcp-d{i}"))
                .spawn(move || super::dial::dial(&c, i, local, remote));
            if spawned.is_err() {
                st.links[i].dialing = false;
            }
        }
    }
}

/// Sets aside a link gone slow (a soft failure, by the rule of
/// `ri2n_proto::tcp::soft`): what it has in flight goes again on the others and it takes no
/// new runs for a while (state `Degraded`): half a second, twice as long each time it is slow
/// again within 10 s of coming back, at most 8 s. Its TCP connection stays open; it then
/// takes runs again. `origin`: the watch thread's start, which the rule counts time from.
fn soft_failure(conn: &TcpConnection, st: &mut State, now: Instant, origin: Instant) {
    for l in 0..st.links.len() {
        if pause_ends(&st.links, l, now) {
            st.links[l].paused_until = None;
            st.links[l].last_pause.1 = now;
            st.links[l].last_ack_progress = now;
            st.striper.resume(l);
            if st.links[l].state == LinkState::Degraded {
                st.set_link_state(l, LinkState::Up);
            }
            conn.wake_writers();
        }
    }
    let views: SmallVec<[LinkView; 4]> = (st.links.iter())
        .map(|l| LinkView {
            usable: l.state == LinkState::Up && l.paused_until.is_none(),
            srtt: l.srtt,
            since_progress: now - l.last_ack_progress,
        })
        .collect();
    let Some(h) = (st.slow_links).check(&st.striper, &views, now - origin) else {
        return;
    };
    let head = &st.links[h];
    let (last, ended) = head.last_pause;
    let pause = if now - ended < Duration::from_secs(10) && !last.is_zero() {
        (last * 2).min(Duration::from_secs(8))
    } else {
        Duration::from_millis(500)
    };
    st.striper.hedge(h);
    st.links[h].paused_until = Some(now + pause);
    st.links[h].last_pause = (pause, now);
    st.set_link_state(h, LinkState::Degraded);
    conn.wake();
}

/// Whether link `l`, set aside as slow, takes runs again at `now`: once its pause is over, or
/// at once when no other link takes any (they died meanwhile: a slow link is better than
/// none, and its pause may have seconds to go).
fn pause_ends(links: &[Link], l: usize, now: Instant) -> bool {
    let Some(until) = links[l].paused_until else {
        return false;
    };
    let others_take_runs = (links.iter().enumerate())
        .any(|(o, k)| o != l && k.state == LinkState::Up && k.paused_until.is_none());
    now >= until || (links[l].state == LinkState::Degraded && !others_take_runs)
}

/// The link to send the one clean CLOSE on: a connected link not set aside as slow if there
/// is one, the one heard from last among them (the likeliest to carry it at once).
fn close_link(links: &[Link]) -> Option<usize> {
    (links.iter().enumerate())
        .filter(|(_, l)| l.connected())
        .max_by_key(|(_, l)| (l.state == LinkState::Up, l.last_rx))
        .map(|(i, _)| i)
}

/// A TCP connection the server answered.
pub(crate) struct Exchanged {
    pub stream: TcpStream,
    /// The server's reply; [`HelloStatus::WrongKey`] too when its handshake message did not
    /// authenticate.
    pub reply: HelloReply,
    /// What came after the reply (the link's first records or frames).
    pub leftover: BytesMut,
    /// The link's keys, on a keyed link the server accepted.
    pub keys: Option<FrameKeys>,
}

/// The 2-byte length and a Noise message at the start of `buf`, if all there.
pub(crate) fn take_handshake(buf: &mut BytesMut) -> Option<Vec<u8>> {
    let len = usize::from(u16::from_be_bytes([*buf.first()?, *buf.get(1)?]));
    (buf.len() >= 2 + len).then(|| buf.split_to(2 + len)[2..].to_vec())
}

/// Sends `hello` (and with `key` the first handshake message) on a new TCP connection and
/// reads the server's reply (and handshake answer), waiting at most `timeout` for all of it:
/// a server that trickles its reply a byte at a time cannot stretch the wait.
pub(crate) fn hello_exchange(
    s: TcpStream,
    hello: &Hello,
    timeout: Duration,
    key: Option<&Key>,
) -> io::Result<Exchanged> {
    let mut out = Vec::new();
    hello.encode(&mut out);
    let handshake = key.map(|k| {
        let (h, msg) = ClientLinkHandshake::start(k, hello.connection_id, hello.link);
        out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        out.extend_from_slice(&msg);
        h
    });
    (&s).write_all(&out)?;
    let deadline = Instant::now() + timeout;
    let mut buf = BytesMut::with_capacity(512);
    let more = |buf: &mut BytesMut| -> io::Result<()> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the server's hello reply did not arrive in time",
            ));
        }
        s.set_read_timeout(Some(left))?;
        match sys::read_into(&s, buf, 512)? {
            0 => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the peer closed the TCP connection during the hello",
            )),
            _ => Ok(()),
        }
    };
    let mut reply = loop {
        match HelloReply::parse(&buf) {
            Ok(Some((reply, n))) => {
                let _ = buf.split_to(n);
                break reply;
            }
            Ok(None) => more(&mut buf)?,
            Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
        }
    };
    let mut keys = None;
    if let (Some(h), HelloStatus::Accepted) = (handshake, reply.status) {
        let answer = loop {
            match take_handshake(&mut buf) {
                Some(m) => break m,
                None => more(&mut buf)?,
            }
        };
        match h.finish(&answer) {
            Ok(mut k) => {
                // the confirmation: a frame of no records, which only the holder of this
                // handshake's keys can seal; the server takes the link once it opened it
                (&s).write_all(k.seal.seal(&[], &mut Vec::new()))?;
                keys = Some(k);
            }
            Err(_) => reply.status = HelloStatus::WrongKey,
        }
    }
    s.set_read_timeout(None)?;
    Ok(Exchanged {
        stream: s,
        reply,
        leftover: buf,
        keys,
    })
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::process::Command;

    use super::*;

    /// A server that trickles its hello reply a byte at a time does not stretch the client's
    /// wait past its timeout: the read timeout counts from the hello, not from the last
    /// byte. Before, each byte started the timeout again and the whole reply was taken.
    #[test]
    fn a_trickled_hello_reply_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut reply = Vec::new();
        HelloReply {
            status: HelloStatus::ServerFull,
            takes_messages: false,
            window: 0,
            application: None,
            addrs: Vec::new(),
        }
        .encode(&mut reply);
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            // every byte but the last, each within the client's timeout of the one before
            for b in &reply[..reply.len() - 1] {
                std::thread::sleep(Duration::from_millis(60));
                if s.write_all(&[*b]).is_err() {
                    return reply.len();
                }
            }
            let _ = s.write_all(&reply[reply.len() - 1..]);
            reply.len()
        });
        let hello = Hello {
            connection_id: 1,
            link: 0,
            new_connection: true,
            keyed: false,
            takes_messages: false,
            window: 1 << 20,
            application: None,
        };
        let stream = TcpStream::connect(addr).unwrap();
        let got = hello_exchange(stream, &hello, Duration::from_millis(300), None);
        let len = server.join().unwrap();
        assert!(len > 6, "the reply takes {len} bytes: several reads");
        match got {
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
                ),
                "{e}"
            ),
            Ok(x) => panic!("the trickled reply was taken: {:?}", x.reply.status),
        }
    }

    /// A link set aside as slow waits out its pause while another link takes the runs, and
    /// takes them again at once when none does: before, a transfer whose other links died
    /// stood still for the rest of the pause (up to 8 s) beside a working TCP connection.
    #[test]
    fn a_link_set_aside_takes_runs_again_once_no_other_does() {
        let now = Instant::now();
        let a: std::net::SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let mut links = vec![Link::new(a, a, now), Link::new(a, a, now)];
        links[0].state = LinkState::Degraded;
        links[0].paused_until = Some(now + Duration::from_secs(8));
        links[1].state = LinkState::Up;
        assert!(!pause_ends(&links, 0, now), "the other link takes the runs");
        assert!(
            pause_ends(&links, 0, now + Duration::from_secs(8)),
            "the pause is over"
        );
        assert!(!pause_ends(&links, 1, now), "not set aside");
        for other in [LinkState::Down, LinkState::Validating] {
            links[1].state = other;
            assert!(pause_ends(&links, 0, now), "the other link is {other:?}");
        }
        // the other set aside too: one of them goes back to work, then the other waits
        links[1].state = LinkState::Degraded;
        links[1].paused_until = Some(now + Duration::from_secs(4));
        assert!(pause_ends(&links, 0, now));
        links[0].state = LinkState::Up;
        links[0].paused_until = None;
        assert!(!pause_ends(&links, 1, now));
    }

    #[test]
    fn the_close_goes_on_a_link_up_and_heard_last() {
        let now = Instant::now();
        let a: std::net::SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let mut links = vec![
            Link::new(a, a, now),
            Link::new(a, a, now),
            Link::new(a, a, now),
        ];
        assert_eq!(close_link(&links), None, "none connected");
        links[0].state = LinkState::Degraded;
        links[0].last_rx = now + Duration::from_millis(3);
        assert_eq!(close_link(&links), Some(0), "set aside, but the only one");
        links[1].state = LinkState::Up;
        links[2].state = LinkState::Up;
        links[2].last_rx = now + Duration::from_millis(1);
        assert_eq!(close_link(&links), Some(2), "up, and heard after link 1");
        links[2].state = LinkState::Down;
        assert_eq!(close_link(&links), Some(1));
    }

    /// A write to a connection the peer closed returns an error instead of ending the process
    /// with SIGPIPE. It runs in a child process of this test binary that gives SIGPIPE its
    /// default action back, as a C program has it (Rust's runtime ignores SIGPIPE).
    #[test]
    fn a_write_to_a_closed_connection_raises_no_sigpipe() {
        const CHILD: &str = "RI2N_TEST_SIGPIPE_CHILD";
        const NAME: &str = "tcp::link::tests::a_write_to_a_closed_connection_raises_no_sigpipe";
        if std::env::var_os(CHILD).is_none() {
            let exe = std::env::current_exe().expect("the test binary");
            let out = Command::new(exe)
                .args(["--exact", NAME, "--nocapture", "--test-threads", "1"])
                .env(CHILD, "1")
                .output()
                .expect("running the child");
            assert!(
                out.status.success(),
                "the child ended with {}:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout)
            );
            return;
        }
        // SAFETY: sets the default action of SIGPIPE in this (child) process
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (peer, _) = listener.accept().unwrap();
        // the peer closes: what is written next makes it answer with a reset, and the write
        // after that fails with EPIPE, which is what raises SIGPIPE
        drop(peer);
        let data = [0u8; 4096];
        for _ in 0..100 {
            if write_from(&s, &mut [IoSlice::new(&data)], 0, true).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("writes to a closed connection kept succeeding");
    }

    /// A short payload does not keep the memory it was read into: its bytes may wait long in
    /// the receive buffer (behind a hole), and a peer that sends a tiny piece per read would
    /// otherwise hold a read buffer per piece, far more memory than its window allows.
    #[test]
    fn a_short_payload_is_not_a_slice_of_the_read_buffer() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        let settings = super::super::conn::Settings::new(
            &ri2n_proto::ConnectionConfig::default(),
            &ri2n_proto::EndpointConfig::new(Vec::new()),
            1,
        );
        let conn = TcpConnection::new(settings, Role::Server, Vec::new());
        let mut r = RecordReader {
            s: &s,
            conn: &conn,
            link: 0,
            incarnation: 0,
            buf: BytesMut::new(),
            open: None,
            raw: BytesMut::new(),
            failed: None,
        };
        std::io::Write::write_all(&mut peer, &[7u8; 16 << 10]).unwrap();
        for len in [1, 100, RECORD_READ - 1, RECORD_READ] {
            while r.buf.len() < len {
                r.fill().unwrap();
            }
            let start = r.buf.as_ptr() as usize;
            let read = start..start + r.buf.len();
            let piece = r.payload(len, Vec::new()).unwrap();
            assert_eq!(&piece[..], &vec![7u8; len][..]);
            let shares = read.contains(&(piece.as_ptr() as usize));
            assert_eq!(shares, len >= RECORD_READ, "a payload of {len} bytes");
        }
    }

    /// What is kept of a run pins the run's memory only when it is most of it.
    #[test]
    fn a_few_new_bytes_of_a_long_run_are_kept_in_memory_of_their_own() {
        let data = Bytes::from(vec![5u8; 4 << 20]);
        let run = data.as_ptr() as usize..data.as_ptr() as usize + data.len();
        let one = kept(&data, 1000..1001);
        assert_eq!(&one[..], &[5]);
        assert!(!run.contains(&(one.as_ptr() as usize)), "a byte pins 4 MiB");
        let most = kept(&data, 0..3 << 20);
        assert_eq!(most.len(), 3 << 20);
        assert_eq!(most.as_ptr(), data.as_ptr(), "most of the run is copied");
    }

    /// A keyed link is heard from as a frame's bytes arrive, not only once the frame is
    /// whole: a long frame trickling in over a slow link (here a run of 256 KiB over about a
    /// second, against 100 ms of silence that declares a link dead) keeps its link up, and
    /// its bytes are read.
    #[test]
    fn a_keyed_link_is_heard_from_while_a_long_frame_trickles_in() {
        use ri2n_proto::tcp::chunk::{header, Kind};
        use ri2n_proto::tcp::keys::server_handshake;
        use ri2n_proto::ConnectionConfig;
        use std::net::TcpListener;

        let key = Key::from_bytes([3; 32]);
        let (client, first) = ClientLinkHandshake::start(&key, 1, 0);
        let (answer, server_keys) = server_handshake(&key, 1, 0, &first).unwrap();
        let mut client_keys = client.finish(&answer).unwrap();
        let cfg = ConnectionConfig::default().with_probe_interval(Duration::from_millis(100));
        let settings = super::super::conn::Settings::new(
            &cfg,
            &ri2n_proto::EndpointConfig::new(Vec::new()).with_key(Some(key)),
            1,
        );
        let conn = TcpConnection::new(settings, Role::Server, Vec::new());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (s, _) = listener.accept().unwrap();
        attach(&conn, 0, s, BytesMut::new(), Some(server_keys)).unwrap();
        let watching = conn.clone();
        std::thread::spawn(move || watch(&watching));
        // one frame: a round, a run of 256 KiB, and the run's bytes (one stream chunk)
        const RUN: usize = 256 << 10;
        let mut records = Vec::new();
        Record::Round {
            pos: 0,
            backward: false,
        }
        .encode(&mut records);
        Record::Run { len: RUN as u32 }.encode(&mut records);
        let mut run = header(Kind::Stream, RUN - 5).to_vec();
        run.resize(RUN, 7);
        let mut frame = Vec::new();
        let frame = client_keys
            .seal
            .seal(&[&records, &run], &mut frame)
            .to_vec();
        let up = || conn.lock().links[0].connected();
        for piece in frame.chunks(frame.len() / 100 + 1) {
            assert!(up(), "the link was declared dead while its frame came");
            peer.write_all(piece).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut got = vec![0u8; RUN];
        let mut n = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while n < RUN - 5 && Instant::now() < deadline {
            match conn.read(&mut got[n..], false, None) {
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("reading: {e}"),
            }
        }
        assert_eq!(n, RUN - 5, "the run's bytes were read");
        assert!(got[..n].iter().all(|&b| b == 7));
        assert!(up());
        conn.lock().end(None);
    }
}
