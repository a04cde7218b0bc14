//! A model of the TCP transport (docs/PROTOCOL.md §12) driving its sans-IO core: the sender's
//! [`Striper`], the receiver's [`Reassembly`] and [`Demux`], the records of [`frame`] and the
//! chunks of [`chunk`], over links modelled as TCP connections would look to them: each
//! direction a byte pipe in order, at a rate and with a delay, whose unsent queue a writer
//! keeps below a low-water mark. A link that dies loses what its pipes held (a TCP
//! connection's buffers go with it) and its connection carries nothing more, even if the
//! network heals before the ends notice; both ends learn it `detect` later, and a healed
//! link comes back as a new TCP connection after `reconnect`. A link gone slow is set aside as the
//! real transport does (its in-flight runs hedged on the others, no new runs for a while).
//!
//! What it checks is what the core must guarantee whatever the faults: every stream byte
//! and every message arrives once, in order, and the transfer completes. When a link is
//! declared dead and how fast a new TCP connection opens are the I/O layer's (`ri2n::tcp`)
//! and are measured in the namespace lab; here they are parameters.
//!
//! [`frame`]: ri2n_proto::tcp::frame
//! [`chunk`]: ri2n_proto::tcp::chunk

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ri2n_proto::tcp::chunk::{self, Demux, Kind, Piece};
use ri2n_proto::tcp::{LinkView, Reassembly, Record, SlowLinkWatch, StripeConfig, Striper, Work};

/// One simulation step.
const STEP: Duration = Duration::from_micros(50);
/// The unsent bytes a writer lets its link's pipe hold before it waits (TCP_NOTSENT_LOWAT).
const LOWAT: usize = 64 << 10;
/// Run bytes after which the receiver owes an ACK at once (else when it is caught up, or
/// within [`ACK_DELAY`]).
const ACK_EVERY: u64 = 256 << 10;
const ACK_DELAY: Duration = Duration::from_millis(2);
/// How long a slow link is set aside (`ri2n_proto::tcp::soft` says when it is slow; the
/// transport sets it aside longer each time it is slow again, which no scenario here needs).
const SET_ASIDE: Duration = Duration::from_millis(500);

/// What happens to a link at a given time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TcpAction {
    /// The link dies (its pipes lose what they held).
    Down(usize),
    /// It heals.
    Up(usize),
    /// Its rate changes (bytes per second).
    Rate(usize, f64),
}

/// A TCP-transport scenario: links, a workload, timed actions.
#[derive(Debug, Clone)]
pub struct TcpScenario {
    /// Seeds the workload.
    pub seed: u64,
    /// Each link's rate (bytes per second) and one-way delay.
    pub links: Vec<(f64, Duration)>,
    /// The receiver's window.
    pub window: u64,
    /// What the application writes, in order: a message (`true`) or a stream write, of so
    /// many bytes (random content); one every `write_every`.
    pub workload: Vec<(bool, usize)>,
    /// Time between two writes.
    pub write_every: Duration,
    /// The receiving application reads at most this many bytes per second.
    pub read_rate: f64,
    /// How long after a link dies both ends declare it dead.
    pub detect: Duration,
    /// How long after a link heals its new TCP connection is up.
    pub reconnect: Duration,
    /// The actions, by time.
    pub actions: Vec<(Duration, TcpAction)>,
    /// The run fails if it has not completed by then.
    pub limit: Duration,
}

impl TcpScenario {
    /// A random scenario from `seed`: 2 or 3 links of 10 Mbit/s to 2 Gbit/s, a mixed
    /// workload, and up to four deaths, heals, partitions or slowdowns.
    pub fn random(seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(crate::derive_seed(seed, 0x7c9));
        let n = rng.gen_range(2..=3);
        let links: Vec<_> = (0..n)
            .map(|_| {
                let rate = 10f64.powf(rng.gen_range(6.1..8.4));
                (rate, Duration::from_micros(rng.gen_range(20..3000)))
            })
            .collect();
        let mut actions = Vec::new();
        let mut t = Duration::from_millis(rng.gen_range(1..40));
        for _ in 0..rng.gen_range(0..=4) {
            let l = rng.gen_range(0..n);
            let last = Duration::from_millis(rng.gen_range(5..300));
            match rng.gen_range(0..4) {
                0 | 1 => {
                    actions.push((t, TcpAction::Down(l)));
                    actions.push((t + last, TcpAction::Up(l)));
                }
                2 => {
                    (0..n).for_each(|l| actions.push((t, TcpAction::Down(l))));
                    (0..n).for_each(|l| actions.push((t + last, TcpAction::Up(l))));
                }
                _ => {
                    let rate = links[l].0;
                    actions.push((t, TcpAction::Rate(l, rate / 200.0)));
                    actions.push((t + last, TcpAction::Rate(l, rate)));
                }
            }
            t += last + Duration::from_millis(rng.gen_range(1..50));
        }
        actions.sort_by_key(|a| a.0);
        let window: u64 = 1 << rng.gen_range(17..24);
        let max_item: usize = 1 << rng.gen_range(4..21);
        let workload = (0..rng.gen_range(1..60))
            .map(|_| {
                let len = rng.gen_range(0..=max_item);
                (rng.gen_bool(0.4) && len as u64 + 8 <= window, len)
            })
            .collect();
        Self {
            seed,
            links,
            window,
            workload,
            write_every: Duration::from_micros(rng.gen_range(0..2000)),
            read_rate: 10f64.powf(rng.gen_range(7.0..9.5)),
            detect: Duration::from_millis(rng.gen_range(5..40)),
            reconnect: Duration::from_millis(rng.gen_range(1..30)),
            actions,
            limit: Duration::from_secs(120),
        }
    }

    /// Checks what the model needs to play the scenario: at least one link, every rate a
    /// finite number of bytes per second, at least 1 (a segment's time on the wire must be a
    /// `Duration`), a window, and actions on links that exist.
    pub fn validate(&self) -> Result<(), String> {
        let rate_ok = |r: f64| r.is_finite() && r >= 1.0;
        if self.links.is_empty() {
            return Err("no link".into());
        }
        if let Some((i, (rate, _))) = (self.links.iter().enumerate()).find(|(_, l)| !rate_ok(l.0)) {
            return Err(format!("link {i}: rate {rate}"));
        }
        if !rate_ok(self.read_rate) {
            return Err(format!("read_rate {}", self.read_rate));
        }
        if self.window == 0 {
            return Err("window 0".into());
        }
        for (t, action) in &self.actions {
            let (TcpAction::Down(l) | TcpAction::Up(l) | TcpAction::Rate(l, _)) = *action;
            if l >= self.links.len() {
                return Err(format!(
                    "action at {t:?} targets link {l} of {}",
                    self.links.len()
                ));
            }
            if let TcpAction::Rate(_, rate) = *action {
                if !rate_ok(rate) {
                    return Err(format!("action at {t:?}: rate {rate}"));
                }
            }
        }
        Ok(())
    }
}

/// What a completed run saw.
#[derive(Debug, Clone, PartialEq)]
pub struct TcpReport {
    /// When the last byte and the end of the streams were acknowledged.
    pub completed_at: Duration,
    /// Stream bytes and messages delivered (each checked against what was written).
    pub stream_bytes: usize,
    /// Messages delivered.
    pub messages: usize,
    /// Payload bytes sent again as repairs or hedges (the sequence counted once).
    pub resent: u64,
    /// The most out-of-order ranges the receiver held at once.
    pub max_holes: usize,
}

/// One direction of a link: bytes in order, each segment leaving once the ones before it
/// left, then arriving after the delay.
#[derive(Debug, Default)]
struct Pipe {
    /// (departure end, arrival, bytes)
    segments: VecDeque<(Duration, Duration, Vec<u8>)>,
    free_at: Duration,
    /// What arrived and was not parsed yet.
    arrived: Vec<u8>,
}

impl Pipe {
    fn push(&mut self, now: Duration, rate: f64, delay: Duration, bytes: Vec<u8>) {
        let start = self.free_at.max(now);
        let done = start + Duration::from_secs_f64(bytes.len() as f64 / rate);
        self.free_at = done;
        self.segments.push_back((done, done + delay, bytes));
    }

    /// Bytes that have not arrived yet, on the wire or not: what the sender's TCP connection
    /// holds (a real one holds them a little longer, until their acknowledgement is back).
    fn held(&self, now: Duration) -> usize {
        (self.segments.iter())
            .filter(|s| s.1 > now)
            .map(|s| s.2.len())
            .sum()
    }

    /// Bytes not yet on the wire.
    fn unsent(&self, now: Duration) -> usize {
        (self.segments.iter())
            .filter(|s| s.0 > now)
            .map(|s| s.2.len())
            .sum()
    }

    fn deliver(&mut self, now: Duration) {
        while self.segments.front().is_some_and(|s| s.1 <= now) {
            let (_, _, b) = self.segments.pop_front().expect("checked");
            self.arrived.extend_from_slice(&b);
        }
    }

    /// The next whole record (and its payload) that arrived, if one did.
    fn record(&mut self) -> Option<(Record, Vec<u8>)> {
        let (rec, n) = Record::parse(&self.arrived).expect("the model sends valid records")?;
        let payload = match rec {
            Record::Run { len } | Record::Repair { len, .. } => len as usize,
            _ => 0,
        };
        if self.arrived.len() < n + payload {
            return None;
        }
        let body = self.arrived[n..n + payload].to_vec();
        self.arrived.drain(..n + payload);
        Some((rec, body))
    }
}

#[derive(Debug)]
struct LinkModel {
    rate: f64,
    delay: Duration,
    /// The network carries it.
    alive: bool,
    /// The ends' view: its TCP connection works (until `detect` after a death).
    connected: bool,
    /// Its TCP connection lost what its pipes held in an outage: it carries nothing more
    /// until the ends replace it (a TCP connection delivers its bytes in order or not at
    /// all: it never skips lost ones, even if the network heals first).
    broken: bool,
    /// When the ends change their view (declared dead, or reconnected).
    change_at: Option<Duration>,
    forward: Pipe,
    back: Pipe,
    rx_unacked: u64,
    ack_due_at: Option<Duration>,
    /// The receiver's ACKs last counted more of this link's bytes then.
    last_progress: Duration,
    acked: u64,
    paused_until: Option<Duration>,
}

/// Plays `s`; `Err` describes what went wrong (with the seed, to replay it), or why the
/// scenario cannot be played ([`TcpScenario::validate`]).
pub fn run_tcp(s: &TcpScenario) -> Result<TcpReport, String> {
    let fail = |why: String| Err(format!("seed {}: {why}\n{s:#?}", s.seed));
    if let Err(why) = s.validate() {
        return fail(why);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(crate::derive_seed(s.seed, 0xda7a));
    // the workload, and the sequence it makes (chunks as the real sender frames them)
    let items: Vec<(bool, Vec<u8>)> = (s.workload.iter())
        .map(|&(message, len)| (message, (0..len).map(|_| rng.gen()).collect()))
        .collect();
    if let Some(&(_, len)) = (s.workload.iter()).find(|(m, len)| *m && *len as u64 + 8 > s.window) {
        return fail(format!("a message of {len} bytes cannot fit the window"));
    }
    let (mut expect_stream, mut expect_msgs) = (Vec::new(), Vec::new());
    let mut sequence = Vec::new();
    let mut written = Vec::new(); // sequence end after each item
    for (message, data) in &items {
        let kind = if *message {
            Kind::Message
        } else {
            Kind::Stream
        };
        if data.is_empty() && !message {
            written.push(sequence.len());
            continue;
        }
        sequence.extend_from_slice(&chunk::header(kind, data.len()));
        sequence.extend_from_slice(data);
        written.push(sequence.len());
        match message {
            true => expect_msgs.push(data.clone()),
            false => expect_stream.extend_from_slice(data),
        }
    }

    let mut striper = Striper::new(StripeConfig::default(), s.window);
    let mut slow_links = SlowLinkWatch::default();
    let mut reasm = Reassembly::new(s.window);
    let mut demux = Demux::new(Some(s.window));
    let mut links: Vec<LinkModel> = (s.links.iter())
        .map(|&(rate, delay)| LinkModel {
            rate,
            delay,
            alive: true,
            connected: true,
            broken: false,
            change_at: None,
            forward: Pipe::default(),
            back: Pipe::default(),
            rx_unacked: 0,
            ack_due_at: None,
            last_progress: Duration::ZERO,
            acked: 0,
            paused_until: None,
        })
        .collect();
    for (l, link) in links.iter().enumerate() {
        striper.link_up(l, link.delay * 2);
        reasm.link_up(l);
    }
    let mut received = vec![0u8; sequence.len()];
    let (mut got_stream, mut got_msgs, mut part) = (Vec::new(), Vec::new(), Vec::new());
    let (mut pushed_items, mut actions) = (0, s.actions.iter().peekable());
    let (mut resent, mut max_holes, mut read_credit) = (0u64, 0, 0f64);
    let mut now = Duration::ZERO;
    // the striper counts time in instants: the run's start stands for its time zero
    let start = Instant::now();
    let mut fin_sent = false;
    // the window end last told to the sender: told again on every link once reading moved it
    // by a quarter of the window (an ACK otherwise goes only with data)
    let mut advertised = s.window;
    loop {
        now += STEP;
        if now > s.limit {
            return fail(format!(
                "not complete after {:?}: {} of {} sequence bytes delivered",
                s.limit,
                reasm.contiguous(),
                sequence.len()
            ));
        }
        // the application writes
        while pushed_items < items.len() && s.write_every * pushed_items as u32 <= now {
            let before = if pushed_items == 0 {
                0
            } else {
                written[pushed_items - 1]
            };
            striper.push((written[pushed_items] - before) as u64);
            pushed_items += 1;
        }
        if pushed_items == items.len() && !fin_sent {
            striper.finish();
            fin_sent = true;
        }
        // the network, and what the ends make of it
        while let Some(&&(t, a)) = actions.peek().filter(|a| a.0 <= now) {
            actions.next();
            let _ = t;
            match a {
                TcpAction::Down(l) if links[l].alive => {
                    let link = &mut links[l];
                    link.alive = false;
                    link.broken = true;
                    link.forward = Pipe::default();
                    link.back = Pipe::default();
                    link.change_at = link.connected.then_some(now + s.detect);
                }
                TcpAction::Up(l) if !links[l].alive => {
                    let link = &mut links[l];
                    link.alive = true;
                    // up `reconnect` after the heal; a death the ends have not noticed yet
                    // is declared first, when it is due
                    let back = now + s.reconnect;
                    link.change_at = Some(match link.change_at {
                        Some(pending) if link.connected => pending.max(back),
                        _ => back,
                    });
                }
                TcpAction::Rate(l, r) => links[l].rate = r,
                _ => {}
            }
        }
        for (l, link) in links.iter_mut().enumerate() {
            if link.change_at.is_some_and(|t| t <= now) {
                link.change_at = None;
                if link.connected {
                    // declared dead: what it had in flight goes on the others
                    link.connected = false;
                    resent += striper.link_down(l);
                }
                if link.alive {
                    link.connected = true;
                    link.broken = false;
                    link.forward = Pipe::default();
                    link.back = Pipe::default();
                    link.rx_unacked = 0;
                    link.acked = 0;
                    link.ack_due_at = None;
                    link.last_progress = now;
                    striper.link_up(l, link.delay * 2);
                    reasm.link_up(l);
                }
            }
        }
        // slow links set aside, as the transport's watch thread does
        for (l, link) in links.iter_mut().enumerate() {
            if link.paused_until.is_some_and(|t| t <= now) {
                link.paused_until = None;
                striper.resume(l);
            }
        }
        let views: Vec<LinkView> = (links.iter())
            .map(|l| LinkView {
                usable: l.connected && l.paused_until.is_none(),
                srtt: l.delay * 2,
                since_progress: now.saturating_sub(l.last_progress),
            })
            .collect();
        if let Some(h) = slow_links.check(&striper, &views, now) {
            resent += striper.hedge(h);
            links[h].paused_until = Some(now + SET_ASIDE);
        }
        // the sender's writers
        for (l, link) in links.iter_mut().enumerate() {
            if !link.connected {
                continue;
            }
            while link.forward.unsent(now) < LOWAT {
                if striper.in_flight(l) == 0 {
                    link.last_progress = now;
                }
                striper.note_held(l, start + now, link.forward.held(now) as u64);
                let Some(work) = striper.next(l) else { break };
                let mut out = Vec::new();
                match work {
                    Work::Run { round, offset, len } => {
                        if let Some(r) = round {
                            (Record::Round {
                                pos: r.pos,
                                backward: r.backward,
                            })
                            .encode(&mut out);
                        }
                        Record::Run { len: len as u32 }.encode(&mut out);
                        out.extend_from_slice(&sequence[offset as usize..(offset + len) as usize]);
                    }
                    Work::Repair { offset, len } => {
                        (Record::Repair {
                            offset,
                            len: len as u32,
                        })
                        .encode(&mut out);
                        out.extend_from_slice(&sequence[offset as usize..(offset + len) as usize]);
                    }
                    Work::Fin { end } => Record::Fin { end }.encode(&mut out),
                }
                if link.alive && !link.broken {
                    link.forward.push(now, link.rate, link.delay, out);
                }
            }
        }
        // the receiver
        for (l, link) in links.iter_mut().enumerate() {
            if !link.connected {
                continue;
            }
            link.forward.deliver(now);
            while let Some((rec, body)) = link.forward.record() {
                match rec {
                    Record::Round { pos, backward } => {
                        if let Err(e) = reasm.round(l, pos, backward) {
                            return fail(format!("link {l}: {e}"));
                        }
                    }
                    Record::Run { len } | Record::Repair { len, .. } => {
                        let offset = match rec {
                            Record::Repair { offset, .. } => offset,
                            _ => match reasm.place_run(l, u64::from(len)) {
                                Ok(at) => at,
                                Err(e) => return fail(format!("link {l}: {e}")),
                            },
                        };
                        let new = match reasm.accept(l, offset, u64::from(len)) {
                            Ok(new) => new,
                            Err(e) => return fail(format!("link {l}: {e}")),
                        };
                        for g in new {
                            let (a, b) = ((g.start - offset) as usize, (g.end - offset) as usize);
                            received[g.start as usize..g.end as usize].copy_from_slice(&body[a..b]);
                        }
                        link.rx_unacked += u64::from(len);
                        max_holes = max_holes.max(reasm.holes());
                        if link.rx_unacked >= ACK_EVERY || reasm.holes() == 0 {
                            link.ack_due_at = Some(now);
                        } else {
                            link.ack_due_at.get_or_insert(now + ACK_DELAY);
                        }
                    }
                    Record::Fin { end } => {
                        if let Err(e) = reasm.fin(end) {
                            return fail(format!("link {l}: {e}"));
                        }
                        link.ack_due_at = Some(now);
                    }
                    other => return fail(format!("link {l}: unexpected {other:?}")),
                }
            }
        }
        // the receiving application reads what is in order, at its pace
        read_credit = (read_credit + s.read_rate * STEP.as_secs_f64()).min(s.window as f64);
        while demux.position() < reasm.contiguous() && read_credit >= 1.0 {
            let at = demux.position() as usize;
            let end = reasm.contiguous().min(at as u64 + read_credit as u64) as usize;
            let piece = match demux.step(&received[at..end]) {
                Ok(p) => p,
                Err(e) => return fail(format!("chunks at {at}: {e}")),
            };
            let n = match piece {
                Piece::Header { n, empty_message } => {
                    if empty_message {
                        got_msgs.push(Vec::new());
                    }
                    n
                }
                Piece::Stream(n) => {
                    got_stream.extend_from_slice(&received[at..at + n]);
                    n
                }
                Piece::Message { n, last } => {
                    part.extend_from_slice(&received[at..at + n]);
                    if last {
                        got_msgs.push(std::mem::take(&mut part));
                    }
                    n
                }
            };
            reasm.consume(n as u64);
            read_credit -= n as f64;
        }
        let window_moved = reasm.window_end() - advertised >= s.window / 4;
        if window_moved {
            advertised = reasm.window_end();
        }
        for (l, link) in links.iter_mut().enumerate() {
            if !link.connected {
                continue;
            }
            if window_moved || link.ack_due_at.is_some_and(|t| t <= now) {
                link.ack_due_at = None;
                link.rx_unacked = 0;
                let mut out = Vec::new();
                (Record::Ack {
                    link_bytes: reasm.link_bytes(l),
                    delivered: reasm.contiguous(),
                    window_end: reasm.window_end(),
                    eof: reasm.complete(),
                })
                .encode(&mut out);
                if link.alive && !link.broken {
                    link.back.push(now, link.rate, link.delay, out);
                }
            }
            // the sender reads the ACKs
            link.back.deliver(now);
            while let Some((rec, _)) = link.back.record() {
                let Record::Ack {
                    link_bytes,
                    delivered,
                    window_end,
                    eof,
                } = rec
                else {
                    return fail(format!("link {l}: the receiver sent {rec:?}"));
                };
                striper.on_ack(l, link_bytes, delivered, window_end, eof);
                if link_bytes > link.acked {
                    link.acked = link_bytes;
                    link.last_progress = now;
                }
            }
        }
        if striper.all_acknowledged() && demux.position() == sequence.len() as u64 {
            break;
        }
    }
    if let Err(e) = demux.check_end() {
        return fail(format!("at the end: {e}"));
    }
    if got_stream != expect_stream {
        return fail(format!(
            "stream bytes differ: {} received, {} written",
            got_stream.len(),
            expect_stream.len()
        ));
    }
    if got_msgs != expect_msgs {
        return fail(format!(
            "messages differ: {} received, {} sent",
            got_msgs.len(),
            expect_msgs.len()
        ));
    }
    Ok(TcpReport {
        completed_at: now,
        stream_bytes: got_stream.len(),
        messages: got_msgs.len(),
        resent,
        max_holes,
    })
}
