//! The threads that run a TCP-transport connection's links:
//!
//! - a **writer** per link: takes the link's next run (or repair, ACK, PING, FIN, CLOSE)
//!   under the lock, then writes it without the lock; its TCP connection's back-pressure
//!   decides how much the link takes;
//! - a **reader** per link: parses records, reads each run straight into a buffer of its
//!   own and hands it to the reassembly, which places it by the link's order;
//! - a **watch** thread per connection: declares a link dead when it has received nothing
//!   for a few round trips (both ends PING idle links), asks for PINGs, samples TCP_INFO,
//!   and on the client starts a **dialer** for each dead link, which opens a new TCP
//!   connection at the probe pace until the path works again.
//!
//! A link's threads belong to one TCP connection (its *incarnation*): when the link dies or
//! is replaced they find a newer incarnation and stop.

use std::io::{self, IoSlice, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ri2n_proto::tcp::frame::MAX_REASON;
use ri2n_proto::tcp::{Hello, HelloReply, HelloStatus, Record, Work};
use ri2n_proto::{ConnectionError, LinkState};

use super::conn::{Role, State, TcpConnection};
use super::sys;

/// Bytes a reader asks the kernel for at once when it reads records (a run's payload goes
/// straight into its own buffer, however long).
const READ_CHUNK: usize = 64 << 10;
/// How often the watch thread looks at the links.
const WATCH_TICK: Duration = Duration::from_millis(2);
/// How often it samples each link's round trip from TCP_INFO.
const RTT_SAMPLE: Duration = Duration::from_millis(20);
/// How long a dialer waits for one connection attempt before starting a fresh one: a SYN
/// lost during an outage is not retried by the kernel soon enough (its back-off doubles).
const DIAL_ATTEMPT: Duration = Duration::from_millis(50);
/// How long the threads of an ended connection keep going, to let a CLOSE record out.
const CLOSE_LINGER: Duration = Duration::from_millis(200);

/// Makes `stream` link `l`'s TCP connection (a new one, or the replacement of a dead one)
/// and starts its threads.
pub(crate) fn attach(
    conn: &Arc<TcpConnection>,
    l: usize,
    stream: TcpStream,
    leftover: BytesMut,
) -> io::Result<()> {
    let stream = Arc::new(stream);
    let (local, remote) = (stream.local_addr()?, stream.peer_addr()?);
    let rtt = sys::rtt_and_cwnd(&stream).map_or(Duration::ZERO, |r| r.0);
    let mut st = conn.lock();
    if st.end.is_some() {
        let _ = stream.shutdown(Shutdown::Both);
        return Ok(());
    }
    while st.links.len() <= l {
        // a link number the server had not seen: a placeholder until it opens
        st.links
            .push(super::conn::Link::new(local, remote, Instant::now()));
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
    let incarnation = link.incarnation;
    st.striper.link_up(l, rtt);
    st.reasm.link_up(l);
    st.set_link_state(l, LinkState::Up);
    st.all_down_since = None;
    drop(st);
    conn.wake();
    let (c, s) = (conn.clone(), stream.clone());
    std::thread::Builder::new()
        .name(format!("ri2n-tcp-w{l}"))
        .spawn(move || writer(&c, l, incarnation, &s))?;
    let c = conn.clone();
    std::thread::Builder::new()
        .name(format!("ri2n-tcp-r{l}"))
        .spawn(move || reader(&c, l, incarnation, &stream, leftover))?;
    Ok(())
}

/// Declares link `l` dead (if `incarnation` is still its TCP connection): what it had in
/// flight goes to the other links, and its TCP connection is closed.
pub(crate) fn fail(conn: &TcpConnection, st: &mut State, l: usize, incarnation: u64) {
    let link = &mut st.links[l];
    if link.incarnation != incarnation || link.state == LinkState::Down {
        return;
    }
    if let Some(s) = link.stream.take() {
        let _ = s.shutdown(Shutdown::Both);
    }
    link.next_dial = Instant::now();
    st.striper.link_down(l);
    st.set_link_state(l, LinkState::Down);
    if st.links.iter().all(|l| l.state != LinkState::Up) {
        st.all_down_since.get_or_insert_with(Instant::now);
    }
    conn.wake();
}

/// Writes all of `bufs`.
fn write_all(mut s: &TcpStream, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    while !bufs.is_empty() {
        match s.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What the writer sends next, encoded into `head` (records) and `payload` (the run's
/// bytes, after the last record); `None` when the link's threads should stop.
fn next_send(
    conn: &TcpConnection,
    l: usize,
    incarnation: u64,
    head: &mut Vec<u8>,
    payload: &mut Vec<Bytes>,
) -> Option<bool> {
    let mut st = conn.lock();
    loop {
        if st.links[l].incarnation != incarnation || st.links[l].state != LinkState::Up {
            return None;
        }
        head.clear();
        payload.clear();
        let mut closing = false;
        let link = &mut st.links[l];
        let ack_due = std::mem::take(&mut link.ack_due);
        let ping_due = std::mem::take(&mut link.ping_due);
        let close_due = std::mem::take(&mut link.close_due);
        if ack_due || close_due {
            Record::Ack {
                link_bytes: st.reasm.link_bytes(l),
                delivered: st.reasm.contiguous(),
                window_end: st.reasm.window_end(),
                eof: st.reasm.complete(),
            }
            .encode(head);
        }
        if close_due {
            let (code, reason) = &st.close_record;
            let reason = &reason.as_bytes()[..reason.len().min(MAX_REASON)];
            Record::Close {
                code: *code,
                reason_len: reason.len() as u16,
            }
            .encode(head);
            head.extend_from_slice(reason);
            closing = true;
        } else if st.end.is_none() {
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
            link.bytes_sent +=
                head.len() as u64 + payload.iter().map(|b| b.len() as u64).sum::<u64>();
            return Some(closing);
        }
        if st.end.is_some() {
            return None;
        }
        st = conn
            .work
            .wait_timeout(st, conn.settings.keepalive)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

fn writer(conn: &Arc<TcpConnection>, l: usize, incarnation: u64, s: &TcpStream) {
    let mut head = Vec::with_capacity(64);
    let mut payload = Vec::new();
    while let Some(closing) = next_send(conn, l, incarnation, &mut head, &mut payload) {
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(1 + payload.len());
        slices.push(IoSlice::new(&head));
        slices.extend(payload.iter().map(|b| IoSlice::new(b)));
        let res = write_all(s, &mut slices);
        if closing {
            let _ = s.shutdown(Shutdown::Write);
            return;
        }
        if res.is_err() {
            let mut st = conn.lock();
            fail(conn, &mut st, l, incarnation);
            return;
        }
    }
}

/// Reads records from a link, buffering what arrives beyond the current record.
struct RecordReader<'a> {
    s: &'a TcpStream,
    buf: BytesMut,
}

impl RecordReader<'_> {
    /// Reads more into the buffer; `Err` at the peer's close too.
    fn fill(&mut self) -> io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < 512 {
            self.buf.reserve(READ_CHUNK);
        }
        match sys::read_into(self.s, &mut self.buf, READ_CHUNK)? {
            0 => Err(io::ErrorKind::UnexpectedEof.into()),
            n => Ok(n),
        }
    }

    /// The next `len` bytes, whole: what is buffered, then straight from the socket.
    fn payload(&mut self, len: usize, mut on_read: impl FnMut(usize)) -> io::Result<Bytes> {
        if self.buf.len() >= len {
            return Ok(self.buf.split_to(len).freeze());
        }
        let mut out = BytesMut::with_capacity(len);
        out.extend_from_slice(&self.buf.split());
        while out.len() < len {
            let want = len - out.len();
            match sys::read_into(self.s, &mut out, want)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => on_read(n),
            }
        }
        Ok(out.freeze())
    }
}

fn reader(conn: &Arc<TcpConnection>, l: usize, incarnation: u64, s: &TcpStream, mut buf: BytesMut) {
    buf.reserve(READ_CHUNK);
    let mut r = RecordReader { s, buf };
    let res = read_records(conn, l, incarnation, &mut r);
    let mut st = conn.lock();
    if let Err(e) = res {
        if let Some(why) = e {
            st.end(Some(why));
            conn.wake();
        }
        fail(conn, &mut st, l, incarnation);
    }
}

/// Marks link `l` as heard from now; `false` if its threads should stop.
fn heard(st: &mut State, l: usize, incarnation: u64, bytes: usize) -> bool {
    let link = &mut st.links[l];
    link.last_rx = Instant::now();
    link.bytes_received += bytes as u64;
    link.incarnation == incarnation
}

/// Reads the link's records until it fails (`Err(None)`) or the peer breaks the protocol
/// or ends the connection (`Err(Some(why))`).
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
                    let n = r.fill().map_err(|_| None)?;
                    if !heard(&mut conn.lock(), l, incarnation, n) {
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
                let offset = match record {
                    Record::Repair { offset, .. } => offset,
                    _ => conn
                        .lock()
                        .reasm
                        .place_run(l, len)
                        .map_err(|_| violation("a run outside its round or window"))?,
                };
                let data = r
                    .payload(len as usize, |n| {
                        let _ = heard(&mut conn.lock(), l, incarnation, n);
                    })
                    .map_err(|_| None)?;
                let mut st = conn.lock();
                if st.links[l].incarnation != incarnation {
                    return Ok(());
                }
                let new = (st.reasm.accept(l, offset, len))
                    .map_err(|_| violation("stream bytes outside the receive window"))?;
                for g in new {
                    let (s, e) = ((g.start - offset) as usize, (g.end - offset) as usize);
                    st.recv.insert(g.start, data.slice(s..e));
                }
                st.links[l].ack_due = true;
                drop(st);
                conn.wake();
            }
            Record::Round { pos, backward } => {
                (conn.lock().reasm.round(l, pos, backward))
                    .map_err(|_| violation("a round outside the receive window"))?;
            }
            Record::Ack {
                link_bytes,
                delivered,
                window_end,
                eof,
            } => {
                let mut st = conn.lock();
                let before = st.striper.delivered();
                if st.striper.on_ack(l, link_bytes, delivered, window_end, eof) {
                    let link = &mut st.links[l];
                    let gained = link_bytes.saturating_sub(link.acked_link_bytes);
                    link.acked_link_bytes = link.acked_link_bytes.max(link_bytes);
                    link.stream_bytes_acked += gained;
                    if st.striper.delivered() > before {
                        st.release();
                    }
                    if st.done() {
                        // both streams complete: say so, then end (the peer does too)
                        st.ack_all();
                    }
                    drop(st);
                    conn.wake();
                }
            }
            Record::Fin { end } => {
                let mut st = conn.lock();
                (st.reasm.fin(end)).map_err(|_| violation("an end of stream that moved"))?;
                st.links[l].ack_due = true;
                drop(st);
                conn.wake();
            }
            Record::Ping => {}
            Record::Close { code, reason_len } => {
                let reason = r
                    .payload(usize::from(reason_len), |_| {})
                    .unwrap_or_default();
                let reason = String::from_utf8_lossy(&reason[..reason.len().min(MAX_REASON)]);
                let st = conn.lock();
                let why = if code != 0 {
                    Some(ConnectionError::PeerAborted {
                        code,
                        reason: reason.into_owned(),
                    })
                } else if st.done() {
                    None
                } else {
                    Some(ConnectionError::ClosedEarly)
                };
                drop(st);
                let mut st = conn.lock();
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
    let mut last_sample = Instant::now();
    loop {
        std::thread::sleep(WATCH_TICK);
        let now = Instant::now();
        let sample = now - last_sample >= RTT_SAMPLE;
        if sample {
            last_sample = now;
        }
        let mut st = conn.lock();
        if let Some(at) = st.ended_at {
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
        // both streams complete and acknowledged: one CLOSE, on the first up link
        if st.done() && !st.links.iter().any(|l| l.ack_due) {
            if let Some(i) = st.links.iter().position(|l| l.state == LinkState::Up) {
                st.links[i].close_due = true;
            }
            st.end(None);
            drop(st);
            conn.wake();
            continue;
        }
        for i in 0..st.links.len() {
            let link = &mut st.links[i];
            if link.state != LinkState::Up {
                continue;
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
            if now - link.last_rx > conn.settings.dead_after(link.min_rtt.max(link.srtt / 2)) {
                let inc = link.incarnation;
                fail(conn, &mut st, i, inc);
            } else if now - link.last_tx >= conn.settings.keepalive {
                link.ping_due = true;
                conn.work.notify_all();
            }
        }
        if let (Some(since), Some(limit)) =
            (st.all_down_since, conn.settings.all_links_down_timeout)
        {
            if now - since > limit {
                st.end(Some(ConnectionError::AllLinksDown));
                conn.wake();
                continue;
            }
        }
        if let Role::Client { pairs } = &conn.role {
            for (i, &(local, remote)) in pairs.iter().enumerate() {
                let link = &mut st.links[i];
                if link.state != LinkState::Up && !link.dialing && now >= link.next_dial {
                    link.dialing = true;
                    let c = conn.clone();
                    let spawned = std::thread::Builder::new()
                        .name(format!("ri2n-tcp-d{i}"))
                        .spawn(move || dial(&c, i, local, remote));
                    if spawned.is_err() {
                        st.links[i].dialing = false;
                    }
                }
            }
        }
    }
}

/// Opens the TCP connection of a client's link `l` and says hello on it; the first link of
/// a connection uses [`hello`] directly.
fn dial(conn: &Arc<TcpConnection>, l: usize, local: SocketAddr, remote: SocketAddr) {
    let hello = Hello {
        connection_id: conn.settings.connection_id,
        link: l as u8,
        new_connection: false,
        application: conn.settings.application.clone(),
    };
    let started = Instant::now();
    let res = sys::connect_from(local, remote, DIAL_ATTEMPT).and_then(|s| {
        hello_exchange(
            s,
            &hello,
            DIAL_ATTEMPT.max(conn.settings.probe_interval * 5),
        )
    });
    let mut st = conn.lock();
    st.links[l].dialing = false;
    st.links[l].next_dial = started + conn.settings.probe_interval;
    match res {
        Ok((s, reply, leftover)) if reply.status == HelloStatus::Accepted => {
            drop(st);
            let _ = attach(conn, l, s, leftover);
        }
        Ok((_, reply, _)) if reply.status == HelloStatus::UnknownConnection => {
            st.end(Some(ConnectionError::PeerRestarted));
            drop(st);
            conn.wake();
        }
        _ => {}
    }
}

/// Sends `hello` on a new TCP connection and reads the server's reply, waiting at most
/// `timeout` for it. Returns the reply and the bytes that came after it (the link's first
/// records).
pub(crate) fn hello_exchange(
    s: TcpStream,
    hello: &Hello,
    timeout: Duration,
) -> io::Result<(TcpStream, HelloReply, BytesMut)> {
    let mut out = Vec::new();
    hello.encode(&mut out);
    (&s).write_all(&out)?;
    s.set_read_timeout(Some(timeout))?;
    let mut buf = BytesMut::with_capacity(512);
    let reply = loop {
        match HelloReply::parse(&buf) {
            Ok(Some((reply, n))) => {
                let _ = buf.split_to(n);
                break reply;
            }
            Ok(None) => {
                if sys::read_into(&s, &mut buf, 512)? == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the peer closed the TCP connection during the hello",
                    ));
                }
            }
            Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
        }
    };
    s.set_read_timeout(None)?;
    Ok((s, reply, buf))
}
