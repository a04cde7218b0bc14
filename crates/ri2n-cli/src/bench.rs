//! `ri2n bench`: measures connections to `ri2n serve`.
//!
//! Throughput (either direction) for the time the server grants (what was asked, at most its
//! `--max-time`), over one connection or several at once (`-P`), as fast as possible or
//! paced to a target rate (`-b`), with a timeline at the chosen interval: application
//! goodput, what each link delivered and its state per interval, and link state changes and
//! injected faults as they happen; then a summary (goodput, per-link share, repairs and
//! losses, the server's view) per connection and their sum. Latency: ping-pong of whole
//! messages, median and p99 round trip; with `--sweep`, the fit t = alpha + beta * n over
//! message sizes and the half-bandwidth size n_1/2 = alpha/beta.
//!
//! Every line of a throughput test is printed by one thread at a time (the sampling thread
//! while data moves, the main thread before and after), whole: the fault thread hands its
//! notices over instead of printing them between the pieces of a row.

use std::cell::Cell;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ri2n::{Bytes, Connection, ConnectionStats, Endpoint, Event};
use serde::Serialize;

use crate::checksum::RandomBytes;
use crate::control::{Grant, Request, ServerReport, Test, VERSION};
use crate::error::Failure;
use crate::fault::FaultPlan;
use crate::net;
use crate::pace::Pacer;
use crate::report::{
    bps, fmt_bytes, fmt_rate, fmt_rtt_us, state_name, LinkDelta, LinkMeter, LinkSummary,
};
use crate::BenchArgs;

/// Bytes per write in a throughput test.
const CHUNK: usize = 64 * 1024;
/// Most bytes moved per message size in a latency sweep (large sizes do fewer round trips).
const SWEEP_BYTES_PER_SIZE: usize = 32 << 20;
/// Fewest round trips per size in a sweep.
const SWEEP_MIN_COUNT: usize = 16;
/// Round trips before measuring, per size.
const WARMUP: usize = 10;
/// A round trip that takes longer than this ends the latency test (exit 4), its connection
/// aborted with the reason, instead of hanging the benchmark.
const STALL_LIMIT: Duration = Duration::from_secs(10);
/// How often the sampling thread of a throughput test looks for link events between rows.
const EVENT_TICK: Duration = Duration::from_millis(20);

pub fn run(args: &BenchArgs) -> Result<(), Failure> {
    let connected = Cell::new(false);
    let result = test(args, &connected);
    match crate::interrupt::caught() {
        // the connections ended because the interrupt aborted them: say so, not "lost"
        Some(signal) if result.is_err() && connected.get() => {
            Err(crate::interrupt::failure(signal, "during the test"))
        }
        Some(signal) if result.is_err() => Err(crate::interrupt::failure_while_connecting(signal)),
        _ => result,
    }
}

/// The test itself (see [`run`]); `connected` is set once its connections are made.
fn test(args: &BenchArgs, connected: &Cell<bool>) -> Result<(), Failure> {
    // its output is a report: a reader that went away (`| head`) ends the test, as it ends
    // ping or iperf3; Rust ignores SIGPIPE, and the next line printed would panic
    // SAFETY: signal(2) with the default action; no handler of this process is replaced.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let say = Say { json: args.json };
    let endpoint = net::client_endpoint(&args.connect, &args.key, false)?;
    // interrupted, the test's connections are aborted so the server learns why it ended
    crate::interrupt::abort_endpoint_on_interrupt(endpoint.clone(), crate::interrupt::End::Client);
    let result = test_on(&endpoint, args, say, connected);
    net::close_after_failure(&endpoint, &result);
    result
}

/// [`test`] on `endpoint`.
fn test_on(
    endpoint: &Endpoint,
    args: &BenchArgs,
    say: Say,
    connected: &Cell<bool>,
) -> Result<(), Failure> {
    let faults = FaultPlan::new(endpoint, &args.link.fault)?;
    let config = net::connection_config(&args.connect, &args.link, net::Application::Bench);
    let count = if args.latency {
        1
    } else {
        args.parallel as usize
    };
    // one endpoint for all: the faults, which act on its sockets, reach every connection
    let mut conns = Vec::with_capacity(count);
    for _ in 0..count {
        match net::connect(endpoint, &args.connect, config.clone()) {
            Ok(conn) => conns.push(conn),
            Err(refused) => {
                // each made holds a slot of the server's until it learns that it ended: told
                // now, not when it finds them gone, they do not hold off a retry
                for conn in &conns {
                    conn.abort(1, "another connection of the test could not be made");
                }
                return Err(refused);
            }
        }
    }
    connected.set(true);
    let start = Instant::now();
    let (notices, faults_seen) = mpsc::channel();
    faults.start_with(start, move |t, local, action| {
        // the receiving end is gone once the test is over: nothing left to tell
        let _ = notices.send(FaultRecord { t, local, action });
    });
    let mut events = EventLog::new(start, say, faults_seen, count > 1);

    let doc = if args.latency {
        serde_json::to_value(latency(&conns[0], args, &mut events, say)?)
    } else {
        serde_json::to_value(throughput(&conns, args, start, &mut events, say)?)
    }
    .expect("the report serialises");
    let linger_end = Instant::now() + net::LINGER;
    for conn in &conns {
        net::linger(conn, linger_end.saturating_duration_since(Instant::now()));
    }
    if let Some(e) = STDOUT_FAILED.get() {
        return Err(Failure::io("cannot write to stdout", e));
    }
    if args.json {
        let mut out = io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &doc)
            .map_err(io::Error::from)
            .and_then(|()| writeln!(out))
            .map_err(|e| Failure::io("cannot write to stdout", &e))?;
    }
    Ok(())
}

/// Where human-readable text goes: stdout, or stderr when stdout carries JSON.
#[derive(Debug, Clone, Copy)]
struct Say {
    json: bool,
}

impl Say {
    fn line(&self, s: impl AsRef<str>) {
        if self.json {
            say!("{}", s.as_ref());
        } else if let Err(e) = writeln!(io::stdout(), "{}", s.as_ref()) {
            // a reader gone ended the process (SIGPIPE, see `test`); any other failure ends
            // the test as a failure once it is over (the sampling thread prints too)
            let _ = STDOUT_FAILED.set(e);
        }
    }
}

/// The first failure to write the text report to stdout.
static STDOUT_FAILED: OnceLock<io::Error> = OnceLock::new();

/// A link event, timed from the test's start.
#[derive(Debug, Clone, Serialize)]
struct EventRecord {
    t: f64,
    /// Which connection (1, 2, ... as the text's `[  1]`; always 1 without -P).
    connection: usize,
    link: u8,
    event: String,
}

/// A fault injected with `--fault`, timed from the test's start.
#[derive(Debug, Clone, Serialize)]
struct FaultRecord {
    t: f64,
    /// The local socket it acted on.
    local: SocketAddr,
    action: String,
}

/// How often the latency test looks for link events between round trips: each event carries
/// its own time, and looking after every round trip (a lock and a lookup) was part of what
/// the test measured.
const EVENT_POLL_PERIOD: Duration = Duration::from_millis(20);

/// Collects the connections' link events (each with the time the engine reported it) and
/// the faults applied, and prints each as it comes, or, while `hold` is set (inside a table
/// whose rows must stay together), at the next [`flush`](Self::flush).
struct EventLog {
    start: Instant,
    say: Say,
    records: Vec<EventRecord>,
    faults: Vec<FaultRecord>,
    /// Faults applied by the fault thread, not printed yet.
    fault_notices: mpsc::Receiver<FaultRecord>,
    /// Several connections: each line names its own.
    tagged: bool,
    hold: bool,
    /// Lines not printed yet (while holding).
    held: Vec<String>,
}

impl EventLog {
    fn new(
        start: Instant,
        say: Say,
        fault_notices: mpsc::Receiver<FaultRecord>,
        tagged: bool,
    ) -> Self {
        Self {
            start,
            say,
            records: Vec::new(),
            faults: Vec::new(),
            fault_notices,
            tagged,
            hold: false,
            held: Vec::new(),
        }
    }

    /// Prints the held lines.
    fn flush(&mut self) {
        for line in self.held.drain(..) {
            self.say.line(line);
        }
    }

    fn emit(&mut self, line: String) {
        if self.hold {
            self.held.push(line);
        } else {
            self.say.line(line);
        }
    }

    /// Takes the faults applied and the events of `conns` (connection 1, 2, ...) since the
    /// last call.
    fn poll(&mut self, conns: &[Connection]) {
        // the lines of this call in time order: a fault before the events it causes
        let mut lines = Vec::new();
        while let Ok(f) = self.fault_notices.try_recv() {
            lines.push((
                f.t,
                format!("{:10.3} s   fault: {} {}", f.t, f.local, f.action),
            ));
            self.faults.push(f);
        }
        for (i, conn) in conns.iter().enumerate() {
            for e in conn.poll_events() {
                let (link, event) = match e.event {
                    Event::LinkAdded { link } => (link, "added".to_owned()),
                    Event::LinkStateChanged { link, from, to } => {
                        (link, format!("{} -> {}", state_name(from), state_name(to)))
                    }
                    _ => continue,
                };
                let t = e.at.saturating_duration_since(self.start).as_secs_f64();
                let tag = tag(self.tagged, i);
                lines.push((t, format!("{t:10.3} s   {tag}L{link} {event}")));
                self.records.push(EventRecord {
                    t,
                    connection: i + 1,
                    link: link.0,
                    event,
                });
            }
        }
        lines.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (_, line) in lines {
            self.emit(line);
        }
    }
}

/// One interval of the timeline.
#[derive(Debug, Clone, Serialize)]
struct IntervalRow {
    /// Seconds since the test started.
    start: f64,
    end: f64,
    /// Application bytes acknowledged (sending) or read (receiving) in the interval.
    bytes: u64,
    goodput_bps: f64,
    /// Each link's activity in the interval (none in a row that sums several connections).
    links: Vec<LinkDelta>,
}

/// One connection's part of the timeline.
#[derive(Default)]
struct Track {
    meter: LinkMeter,
    prev_bytes: u64,
    rows: Vec<IntervalRow>,
    /// Links named so far.
    links_named: usize,
}

/// The per-interval timeline of a throughput test: at the end of every interval a row per
/// connection, and with several connections a row of their sum.
struct Timeline {
    start: Instant,
    interval: Duration,
    next: Instant,
    prev_t: Instant,
    tracks: Vec<Track>,
    sum_rows: Vec<IntervalRow>,
    /// Rate the links by what arrived on them (reverse test) rather than what they delivered.
    incoming: bool,
    /// Link columns in the last header printed (none before the first).
    columns: Option<usize>,
    say: Say,
}

/// How a connection's lines start: nothing with one connection, `[  1] ` (as iperf3) with
/// several.
fn tag(tagged: bool, i: usize) -> String {
    if tagged {
        format!("[{:>3}] ", i + 1)
    } else {
        String::new()
    }
}

impl Timeline {
    fn new(
        start: Instant,
        interval: Duration,
        connections: usize,
        incoming: bool,
        say: Say,
    ) -> Self {
        let tracks = (0..connections)
            .map(|_| {
                let mut t = Track::default();
                t.meter.sample(start, &[]);
                t
            })
            .collect();
        Self {
            start,
            interval,
            next: start + interval,
            prev_t: start,
            tracks,
            sum_rows: Vec::new(),
            incoming,
            columns: None,
            say,
        }
    }

    fn due(&self) -> bool {
        Instant::now() >= self.next
    }

    /// Time until the current interval closes.
    fn until_due(&self) -> Duration {
        self.next.saturating_duration_since(Instant::now())
    }

    /// Closes the current interval at `now`: `done[i]` is connection i's bytes done
    /// (acknowledged or read) and its statistics.
    fn sample(&mut self, done: &[(u64, ConnectionStats)], now: Instant) {
        let tagged = self.tracks.len() > 1;
        let pad = if tagged { "      " } else { "" };
        for (i, (track, (_, stats))) in self.tracks.iter_mut().zip(done).enumerate() {
            if stats.links.len() > track.links_named {
                track.links_named = stats.links.len();
                let names: Vec<String> = stats
                    .links
                    .iter()
                    .map(|l| format!("L{} {} -> {}", l.id, l.local, l.remote))
                    .collect();
                self.say
                    .line(format!("{}links: {}", tag(tagged, i), names.join(", ")));
            }
        }
        let columns = done.iter().map(|(_, s)| s.links.len()).max().unwrap_or(0);
        if self.columns.is_none_or(|c| columns > c) {
            self.columns = Some(columns);
            let what = if self.incoming {
                "arrived"
            } else {
                "delivered"
            };
            let mut h = format!("{pad}{:>17} {:>14}", "interval (s)", "goodput");
            for l in 0..columns {
                h += &format!("   {:<34}", format!("L{l} state, {what}, rtt"));
            }
            self.say.line(h.trim_end());
        }
        let (t0, t1) = (
            self.prev_t.duration_since(self.start).as_secs_f64(),
            now.duration_since(self.start).as_secs_f64(),
        );
        let mut sum = 0u64;
        for (i, (track, (bytes, stats))) in self.tracks.iter_mut().zip(done).enumerate() {
            let links = track.meter.sample(now, &stats.links);
            let delta = bytes.saturating_sub(track.prev_bytes);
            sum += delta;
            let row = IntervalRow {
                start: t0,
                end: t1,
                bytes: delta,
                goodput_bps: bps(delta, t1 - t0),
                links,
            };
            let mut line = format!(
                "{}{:>8.2}-{:<8.2} {:>14}",
                tag(tagged, i),
                t0,
                t1,
                fmt_rate(row.goodput_bps)
            );
            for l in &row.links {
                // what the link delivered (or what arrived on it), not what it sent: datagrams
                // a policer or a failed link dropped would add up to more than the goodput
                let rate = if self.incoming {
                    l.recv_bps
                } else {
                    l.delivered_bps
                };
                line += &format!(
                    "   {:<10} {:>13} {:>9}",
                    l.state,
                    fmt_rate(rate),
                    fmt_rtt_us(l.srtt_us)
                );
            }
            self.say.line(line);
            track.rows.push(row);
            track.prev_bytes = *bytes;
        }
        let row = IntervalRow {
            start: t0,
            end: t1,
            bytes: sum,
            goodput_bps: bps(sum, t1 - t0),
            links: Vec::new(),
        };
        if tagged {
            self.say.line(format!(
                "[SUM] {:>8.2}-{:<8.2} {:>14}",
                t0,
                t1,
                fmt_rate(row.goodput_bps)
            ));
        }
        self.sum_rows.push(row);
        self.prev_t = now;
        while self.next <= now {
            self.next += self.interval;
        }
    }

    /// The last, partial interval, ending at `end` (when the transfers ended: nothing moved
    /// after), unless it is shorter than a quarter of an interval and follows others: a rate
    /// over a few milliseconds (in which the last acknowledgements arrive at once) says
    /// nothing. The summary counts its bytes either way.
    fn close(&mut self, done: &[(u64, ConnectionStats)], end: Instant) {
        let end = end.max(self.prev_t);
        if end - self.prev_t >= self.interval / 4 || self.sum_rows.is_empty() {
            self.sample(done, end);
        }
    }
}

/// The JSON document of a throughput test.
#[derive(Debug, Serialize)]
struct ThroughputDoc {
    command: &'static str,
    test: &'static str,
    /// The --time asked for (also as `requested_s`; this name came first).
    seconds_requested: f64,
    requested_s: f64,
    /// The time the server granted: `requested_s`, or less where its --max-time cut it.
    granted_s: f64,
    cut_by_server: bool,
    /// Connections at once (-P).
    parallel: usize,
    /// The target rate in all (-b), bits per second; null: as fast as possible.
    target_bps: Option<f64>,
    interval: f64,
    /// One connection: its timeline; several: the timeline of their sum (rows without links).
    intervals: Vec<IntervalRow>,
    events: Vec<EventRecord>,
    faults: Vec<FaultRecord>,
    /// One connection: its summary; several: their sum (no links).
    summary: ThroughputSummary,
    /// One connection: what the server reported (its view: bytes it read or wrote, its
    /// per-link counters); several: null (see `connections`).
    server: Option<ServerReport>,
    /// Each connection's results.
    connections: Vec<ConnectionDoc>,
    /// The connections' total.
    sum: Sum,
}

/// One connection of a throughput test.
#[derive(Debug, Serialize)]
struct ConnectionDoc {
    /// 1, 2, ... as the text's `[  1]`.
    connection: usize,
    granted_s: f64,
    cut_by_server: bool,
    intervals: Vec<IntervalRow>,
    events: Vec<EventRecord>,
    summary: ThroughputSummary,
    server: Option<ServerReport>,
}

#[derive(Debug, Clone, Serialize)]
struct ThroughputSummary {
    /// Application bytes moved (acknowledged when sending, read when receiving).
    bytes: u64,
    seconds: f64,
    goodput_bps: f64,
    /// Stream bytes the sending side sent beyond the application's: repairs of packets
    /// declared lost (late ones included), and early second copies of the oldest
    /// unacknowledged bytes, sent when the window filled up behind them (usually a slower
    /// link still holding them: late, not lost, so not counted in `packets_lost`).
    retransmitted_bytes: Option<u64>,
    /// Packets the sending side declared lost (no acknowledgement in time, or in flight on a
    /// link that failed); their data was sent again. Null on the TCP transport (which counts
    /// no packets) and, reverse, without the server's report.
    packets_lost: Option<u64>,
    links: Vec<BenchLink>,
}

/// The connections' total.
#[derive(Debug, Clone, Serialize)]
struct Sum {
    bytes: u64,
    /// The longest connection's.
    seconds: f64,
    goodput_bps: f64,
    retransmitted_bytes: Option<u64>,
    packets_lost: Option<u64>,
}

/// A link's totals in a throughput test: [`LinkSummary`] and what the link delivered.
#[derive(Debug, Clone, Serialize)]
struct BenchLink {
    #[serde(flatten)]
    totals: LinkSummary,
    /// Stream bytes this link delivered: acknowledged by the peer (sending), or by this
    /// client as the server counted them (--reverse; null without the server's report).
    /// Repairs count on the link that carried them, so the links add up to the goodput, but
    /// for bytes that arrived twice (an early copy and a late original), which count on both,
    /// and the control message and framing of the sending end, which count too.
    delivered_bytes: Option<u64>,
    delivered_bps: Option<f64>,
    /// This link's part of what the links delivered, 0 to 1.
    delivered_share: Option<f64>,
}

/// Sends the request for `test`; `interval` asks the server for its timeline of what it read,
/// `rate_bps` (reverse) for its pace.
fn request(
    conn: &Connection,
    test: Test,
    seconds: f64,
    interval: f64,
    rate_bps: Option<f64>,
) -> Result<(), Failure> {
    let msg = serde_json::to_vec(&Request {
        version: VERSION,
        test,
        seconds,
        interval,
        rate_bps,
    })
    .expect("a request serialises");
    conn.send_message(&msg).map_err(|e| Failure::lost(&e))
}

/// The server's answer to a throughput request: how long the test runs.
fn grant(conn: &Connection) -> Result<Grant, Failure> {
    let m = conn
        .recv_message()
        .map_err(|e| Failure::lost(&e))?
        .ok_or_else(|| {
            Failure::new(
                crate::error::LOST,
                "the server ended the test without answering its request",
            )
        })?;
    let g: Grant = serde_json::from_slice(&m).map_err(|e| {
        Failure::new(
            crate::error::GENERIC,
            format!("the server's answer to the request is not a grant ({e})"),
        )
    })?;
    // the time becomes an instant: one the clock cannot hold would panic there
    if !(0.0..=crate::MAX_SECS).contains(&g.seconds) {
        return Err(Failure::new(
            crate::error::GENERIC,
            format!("the server granted a test of {} s", g.seconds),
        ));
    }
    Ok(g)
}

/// The server's report, the next message after a throughput test.
fn server_report(conn: &Connection) -> Option<ServerReport> {
    let m = conn.recv_message().ok()??;
    serde_json::from_slice(&m).ok()
}

/// " (4 s asked, cut to 2 s by the server's --max-time)", or nothing.
fn cut_note(requested: f64, granted: f64, cut: bool) -> String {
    if cut {
        format!(" ({requested} s asked, cut to {granted} s by the server's --max-time)")
    } else {
        String::new()
    }
}

/// Writes to `conn` until `end` (paced by `pacer`, if any), then finishes and waits until
/// the server acknowledged everything; returns the bytes written. (The timeline reads what
/// was delivered from the connection itself.)
fn send_until(
    conn: &Connection,
    data: &Bytes,
    end: Instant,
    pacer: Option<Pacer>,
) -> Result<u64, Failure> {
    let size = pacer.map_or(CHUNK, |p| p.write_size(CHUNK));
    let mut written = 0u64;
    let mut off = 0;
    while Instant::now() < end {
        if let Some(p) = pacer {
            let wait = p.wait(written, end);
            if !wait.is_zero() {
                std::thread::sleep(wait);
                continue;
            }
        }
        let chunk = data.slice(off..off + size);
        if pacer.is_none() {
            // as fast as it goes: the same memory again and again, shared with the connection
            // rather than copied into it, as iperf3 sends its one buffer
            conn.write_bytes(chunk).map_err(|e| Failure::lost(&e))?;
        } else {
            // paced chunks may be small: copied
            let mut writer = conn;
            writer.write_all(&chunk).map_err(|e| Failure::lost(&e))?;
        }
        written += size as u64;
        off += size;
        if off + size > data.len() {
            off = 0;
        }
    }
    conn.finish().map_err(|e| Failure::lost(&e))?;
    net::wait_acknowledged(conn, Duration::from_millis(5), || {})?;
    Ok(written)
}

/// Reads `conn` to its end; returns the bytes read, keeping the count in `counter`.
fn receive_all(conn: &Connection, counter: &AtomicU64) -> Result<u64, Failure> {
    // as received, without a copy (iperf3 reads into its one buffer: the kernel's copy)
    let mut chunk = Bytes::new();
    let mut got = 0u64;
    loop {
        match conn.read_chunk(&mut chunk) {
            Ok(0) => return Ok(got),
            Ok(n) => got += n as u64,
            Err(e) => return Err(Failure::lost(&e)),
        }
        counter.store(got, Ordering::Relaxed);
    }
}

/// A throughput test over `conns` (each a test of its own, at once), either direction.
fn throughput(
    conns: &[Connection],
    args: &BenchArgs,
    start: Instant,
    events: &mut EventLog,
    say: Say,
) -> Result<ThroughputDoc, Failure> {
    let reverse = args.reverse;
    let n = conns.len();
    let requested = args.time.as_secs_f64();
    let target = args.bitrate.filter(|&b| b > 0).map(|b| b as f64);
    let each_rate = target.map(|t| t / n as f64);
    for conn in conns {
        if reverse {
            request(conn, Test::Reverse, requested, 0.0, each_rate)?;
            // nothing more to send: our end of stream goes with the request
            conn.finish().map_err(|e| Failure::lost(&e))?;
        } else {
            request(
                conn,
                Test::Throughput,
                requested,
                args.interval.as_secs_f64(),
                None,
            )?;
        }
    }
    let grants = conns.iter().map(grant).collect::<Result<Vec<_>, _>>()?;
    let granted = grants.iter().map(|g| g.seconds).fold(0.0, f64::max);
    let cut = grants.iter().any(|g| g.cut);
    say.line(format!(
        "throughput test, {granted} s{}{}, {}{}; timeline every {} s",
        cut_note(requested, granted, cut),
        if n > 1 {
            format!(", {n} connections")
        } else {
            String::new()
        },
        if reverse {
            "receiving (reverse)"
        } else {
            "sending"
        },
        match target {
            Some(t) => format!(" at {}{}", fmt_rate(t), if n > 1 { " in all" } else { "" }),
            None => String::new(),
        },
        args.interval.as_secs_f64()
    ));
    let mut data = vec![0u8; 16 * CHUNK];
    RandomBytes::new(1).fill(&mut data);
    let data = Bytes::from(data);
    let mut tl = Timeline::new(start, args.interval, n, reverse, say);
    // receiving: what each connection's thread has read so far
    let read_counts: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    // bytes done: what the server acknowledged of the stream (sending; the request went on
    // the message stream) or what was read. Sending, the connection's own count, in one
    // snapshot with its links' counts: the writer's count less what is buffered was a chunk
    // short between the connection taking it and the writer counting it (more, were the
    // writer's thread held off its CPU meanwhile), and the chunk showed in a later row (one
    // of an outage, say). The stream's own bytes: on the TCP transport the acknowledged
    // sequence holds each chunk's 5-byte header too, a third of a row of 10-byte writes.
    let sample = |conns: &[Connection]| -> Vec<(u64, ConnectionStats)> {
        conns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let stats = c.stats();
                let done = match reverse {
                    true => read_counts[i].load(Ordering::Relaxed),
                    false => stats.stream_acknowledged,
                };
                (done, stats)
            })
            .collect()
    };
    // transfers that ended: the sampling stops at once, not a row after the test's end
    let ended = AtomicUsize::new(0);
    // each connection moves its data on a thread of its own while this one samples the
    // timeline and prints the events, so that rows and event lines keep coming while the
    // data path blocks (every link down: the writer waits for window, the reader for data)
    let results: Vec<Result<(u64, f64), Failure>> = std::thread::scope(|scope| {
        let me = std::thread::current();
        let transfers: Vec<_> = conns
            .iter()
            .zip(&grants)
            .zip(&read_counts)
            .map(|((conn, g), read_count)| {
                let (data, me, ended) = (&data, me.clone(), &ended);
                let end = start + Duration::from_secs_f64(g.seconds);
                scope.spawn(move || {
                    let result = if reverse {
                        receive_all(conn, read_count)
                    } else {
                        let pacer = Pacer::new(Instant::now(), each_rate);
                        send_until(conn, data, end, pacer)
                    };
                    let seconds = start.elapsed().as_secs_f64();
                    ended.fetch_add(1, Ordering::SeqCst);
                    me.unpark();
                    result.map(|bytes| (bytes, seconds))
                })
            })
            .collect();
        while ended.load(Ordering::SeqCst) < n {
            events.poll(conns);
            if tl.due() {
                tl.sample(&sample(conns), Instant::now());
            }
            std::thread::park_timeout(tl.until_due().min(EVENT_TICK));
        }
        transfers
            .into_iter()
            .map(|t| t.join().expect("a transfer thread does not panic"))
            .collect()
    });
    let results = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    events.poll(conns);
    let last = sample(conns);
    let seconds = (results.iter()).map(|&(_, s)| s).fold(0.0, f64::max);
    tl.close(&last, start + Duration::from_secs_f64(seconds));
    let mut connections = Vec::with_capacity(n);
    let mut tracks = std::mem::take(&mut tl.tracks).into_iter();
    for (i, (((conn, (bytes, seconds)), (_, stats)), g)) in
        conns.iter().zip(results).zip(last).zip(&grants).enumerate()
    {
        let server = server_report(conn);
        let summary = summarise(bytes, seconds, &stats, server.as_ref(), reverse);
        connections.push(ConnectionDoc {
            connection: i + 1,
            granted_s: g.seconds,
            cut_by_server: g.cut,
            intervals: tracks.next().expect("a track per connection").rows,
            events: events
                .records
                .iter()
                .filter(|e| e.connection == i + 1)
                .cloned()
                .collect(),
            summary,
            server,
        });
    }
    // an interrupt while the reports were awaited left them missing: no report of a test
    // that looks whole (exit 0, `server: null`)
    if let Some(signal) = crate::interrupt::caught() {
        return Err(crate::interrupt::failure(signal, "during the test"));
    }
    let bytes = connections.iter().map(|c| c.summary.bytes).sum();
    // the connections ran side by side: their sum took as long as the longest
    let seconds = connections
        .iter()
        .map(|c| c.summary.seconds)
        .fold(0.0, f64::max);
    let sum = Sum {
        bytes,
        seconds,
        goodput_bps: bps(bytes, seconds),
        retransmitted_bytes: connections
            .iter()
            .map(|c| c.summary.retransmitted_bytes)
            .sum(),
        packets_lost: connections.iter().map(|c| c.summary.packets_lost).sum(),
    };
    let tagged = n > 1;
    let tcp = args.key.transport() == ri2n::Transport::Tcp;
    for c in &connections {
        print_summary(
            say,
            tcp,
            &tag(tagged, c.connection - 1),
            &c.summary,
            c.server.as_ref(),
            reverse,
            if tagged {
                String::new()
            } else {
                cut_note(requested, c.granted_s, c.cut_by_server)
            },
        );
    }
    if tagged {
        print_sum(say, &sum, reverse, cut_note(requested, granted, cut));
    }
    let (intervals, summary, server) = if tagged {
        let summary = ThroughputSummary {
            bytes: sum.bytes,
            seconds: sum.seconds,
            goodput_bps: sum.goodput_bps,
            retransmitted_bytes: sum.retransmitted_bytes,
            packets_lost: sum.packets_lost,
            links: Vec::new(),
        };
        (tl.sum_rows, summary, None)
    } else {
        let c = &connections[0];
        (c.intervals.clone(), c.summary.clone(), c.server.clone())
    };
    Ok(ThroughputDoc {
        command: "bench",
        test: if reverse { "reverse" } else { "throughput" },
        seconds_requested: requested,
        requested_s: requested,
        granted_s: granted,
        cut_by_server: cut,
        parallel: n,
        target_bps: target,
        interval: args.interval.as_secs_f64(),
        intervals,
        events: std::mem::take(&mut events.records),
        faults: std::mem::take(&mut events.faults),
        summary,
        server,
        connections,
        sum,
    })
}

/// One connection's summary: `bytes` moved in `seconds`, its final statistics and the
/// server's report. The sending side's counters say what was sent again and lost: ours, or
/// with `reverse` the server's.
fn summarise(
    bytes: u64,
    seconds: f64,
    stats: &ConnectionStats,
    server: Option<&ServerReport>,
    reverse: bool,
) -> ThroughputSummary {
    // the TCP transport counts no packets, at either end
    let counted = stats.links.iter().all(|l| l.counts_packets);
    // sent again: what the links sent less what was acknowledged, each once; both count the
    // control messages and the framing, which the test's `bytes` leave out
    let (retransmitted_bytes, packets_lost) = if reverse {
        match server {
            Some(r) => (
                Some(
                    r.links
                        .iter()
                        .map(|l| l.stream_bytes_sent)
                        .sum::<u64>()
                        .saturating_sub(r.bytes_acknowledged.unwrap_or(r.bytes)),
                ),
                counted.then(|| r.links.iter().map(|l| l.packets_lost).sum()),
            ),
            None => (None, None),
        }
    } else {
        let stream_sent: u64 = stats.links.iter().map(|l| l.stream_bytes_sent).sum();
        (
            Some(stream_sent.saturating_sub(stats.bytes_acknowledged)),
            counted.then(|| stats.links.iter().map(|l| l.packets_lost).sum()),
        )
    };
    // what each link delivered: acknowledged to us, or (reverse) to the server, by link id
    // (both ends number the links alike)
    let delivered: Vec<Option<u64>> = stats
        .links
        .iter()
        .map(|l| {
            if reverse {
                server.and_then(|r| {
                    r.links
                        .iter()
                        .find(|s| s.id == l.id.0)
                        .map(|s| s.stream_bytes_acked)
                })
            } else {
                Some(l.stream_bytes_acked)
            }
        })
        .collect();
    let total: u64 = delivered.iter().flatten().sum();
    let links = LinkSummary::all(&stats.links, reverse)
        .into_iter()
        .zip(delivered)
        .map(|(totals, d)| BenchLink {
            totals,
            delivered_bytes: d,
            delivered_bps: d.map(|d| bps(d, seconds)),
            delivered_share: d.map(|d| {
                if total > 0 {
                    d as f64 / total as f64
                } else {
                    0.0
                }
            }),
        })
        .collect();
    ThroughputSummary {
        bytes,
        seconds,
        goodput_bps: bps(bytes, seconds),
        retransmitted_bytes,
        packets_lost,
        links,
    }
}

/// The line that says what "sent again" counts, so that many bytes sent again beside no
/// packet lost does not read as a contradiction; `lost`: packets declared lost, none on the
/// TCP transport.
fn resent_line(bytes: u64, resent: u64, lost: Option<u64>, reverse: bool) -> String {
    let share = if bytes > 0 {
        resent as f64 * 100.0 / bytes as f64
    } else {
        0.0
    };
    let Some(lost) = lost else {
        // TCP repairs its own losses; ri2n sends again only what a failed or stalled link held
        return format!(
            "{} sent again ({share:.2} % of the data{}): what a link that died or stalled had \
             taken, sent on another link",
            fmt_bytes(resent),
            if reverse { ", the server's count" } else { "" }
        );
    };
    format!(
        "{} sent again ({share:.2} % of the data): repairs of the {lost} packets declared \
         lost{}, and early copies of the oldest unacknowledged bytes, sent when the window \
         filled up behind them (late, not lost)",
        fmt_bytes(resent),
        if reverse { " (the server's count)" } else { "" }
    )
}

fn print_summary(
    say: Say,
    tcp: bool,
    tag: &str,
    s: &ThroughputSummary,
    server: Option<&ServerReport>,
    reverse: bool,
    cut: String,
) {
    say.line(format!(
        "{tag}summary: {} {} in {:.2} s: {} goodput{cut}",
        if reverse { "received" } else { "sent" },
        fmt_bytes(s.bytes),
        s.seconds,
        fmt_rate(s.goodput_bps)
    ));
    for l in &s.links {
        let t = &l.totals;
        let delivered = match (l.delivered_bytes, l.delivered_bps, l.delivered_share) {
            (Some(b), Some(r), Some(share)) => format!(
                "delivered {} at {} ({:.1} %)",
                fmt_bytes(b),
                fmt_rate(r),
                share * 100.0
            ),
            _ => "delivered: unknown (no server report)".to_owned(),
        };
        let other = if reverse {
            let what = if tcp { "bytes" } else { "datagrams" };
            format!("{} of {what} arrived", fmt_bytes(t.bytes_received))
        } else {
            format!("{} of stream bytes sent", fmt_bytes(t.stream_bytes_sent))
        };
        // the sending side's losses: ours, or the server's on the same link; none on TCP,
        // which counts no packets of its own
        let lost = match t.packets_lost {
            None => String::new(),
            Some(_) if reverse => server
                .and_then(|r| r.links.iter().find(|s| s.id == t.id))
                .map_or(", ? packets lost".to_owned(), |s| {
                    format!(", {} packets lost", s.packets_lost)
                }),
            Some(ours) => format!(", {ours} packets lost"),
        };
        say.line(format!(
            "{tag}  L{} {} -> {}: {}, {delivered}, {other}{lost}, rtt {} (min {})",
            t.id,
            t.local,
            t.remote,
            t.state,
            fmt_rtt_us(t.srtt_us),
            fmt_rtt_us(t.min_rtt_us),
        ));
    }
    if let Some(r) = s.retransmitted_bytes {
        say.line(format!(
            "{tag}  {}",
            resent_line(s.bytes, r, s.packets_lost, reverse)
        ));
    }
    if let Some(r) = server {
        say.line(format!(
            "{tag}  server: {} {} in {:.2} s: {}",
            if reverse { "sent" } else { "received" },
            fmt_bytes(r.bytes),
            r.seconds,
            fmt_rate(bps(r.bytes, r.seconds))
        ));
    }
}

fn print_sum(say: Say, s: &Sum, reverse: bool, cut: String) {
    say.line(format!(
        "[SUM] summary: {} {} in {:.2} s: {} goodput{cut}",
        if reverse { "received" } else { "sent" },
        fmt_bytes(s.bytes),
        s.seconds,
        fmt_rate(s.goodput_bps)
    ));
    if let Some(r) = s.retransmitted_bytes {
        say.line(format!(
            "[SUM]   {}",
            resent_line(s.bytes, r, s.packets_lost, reverse)
        ));
    }
}

/// Round-trip statistics of one message size.
#[derive(Debug, Clone, Serialize)]
struct LatencyResult {
    size: usize,
    count: usize,
    median_us: f64,
    p99_us: f64,
    min_us: f64,
    mean_us: f64,
}

/// The fit t = alpha + beta * n of the one-way time (half the median round trip).
#[derive(Debug, Clone, Serialize)]
struct Fit {
    alpha_us: f64,
    beta_us_per_byte: f64,
    /// 1/beta, in bits per second.
    bandwidth_bps: f64,
    /// alpha/beta: the message size that reaches half the asymptotic bandwidth (`None` when
    /// the fit has a non-positive alpha or beta).
    n_half_bytes: Option<f64>,
}

#[derive(Debug, Serialize)]
struct LatencyDoc {
    command: &'static str,
    test: &'static str,
    results: Vec<LatencyResult>,
    /// With a single size: its median and p99 round trip, for convenience.
    #[serde(skip_serializing_if = "Option::is_none")]
    median_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    p99_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fit: Option<Fit>,
    events: Vec<EventRecord>,
    faults: Vec<FaultRecord>,
}

fn latency(
    conn: &Connection,
    args: &BenchArgs,
    events: &mut EventLog,
    say: Say,
) -> Result<LatencyDoc, Failure> {
    let sizes: Vec<usize> = if args.sweep {
        (0..=20).map(|k| 1usize << k).collect()
    } else {
        vec![args.size]
    };
    let limit = conn.max_message_size();
    if args.size > limit {
        conn.abort(2, "message size too large");
        return Err(Failure::usage(format!(
            "--size {}: a message carries at most {limit} bytes",
            args.size
        )));
    }
    request(conn, Test::Latency, 0.0, 0.0, None)?;
    let count = args.count as usize;
    // a sweep's large sizes take fewer round trips, as many as move its bytes per size
    let reps_of = |size: usize| match args.sweep {
        true => count.min((SWEEP_BYTES_PER_SIZE / size).max(SWEEP_MIN_COUNT)),
        false => count,
    };
    say.line(format!(
        "latency test: ping-pong of whole messages, {} round trips per size{}",
        count,
        if sizes.iter().any(|&size| reps_of(size) < count) {
            format!(
                " (fewer above {}, at least {SWEEP_MIN_COUNT})",
                fmt_bytes((SWEEP_BYTES_PER_SIZE / count) as u64)
            )
        } else {
            String::new()
        }
    ));
    say.line(format!(
        "{:>10} {:>7} {:>12} {:>12} {:>12} {:>12}",
        "size", "count", "median", "p99", "min", "mean"
    ));
    // link events go below the row of the size during which they happened
    events.hold = true;
    let mut results = Vec::new();
    let mut payload = vec![0u8; *sizes.iter().max().unwrap()];
    RandomBytes::new(3).fill(&mut payload);
    for &size in &sizes {
        let reps = reps_of(size);
        let msg = &payload[..size];
        // room made as they come beyond a first share: --count may ask for more round
        // trips than memory holds times (the test's own clock ends it first)
        let mut rtts = Vec::with_capacity(reps.min(1 << 16));
        let mut next_event_poll = Instant::now();
        for i in 0..WARMUP.min(reps) + reps {
            let t0 = Instant::now();
            let stalled = |e: io::Error| stalled_or_lost(conn, e, size);
            let left = || (t0 + STALL_LIMIT).saturating_duration_since(Instant::now());
            (conn.send_message_timeout(msg, Some(left()))).map_err(stalled)?;
            let echo = (conn.recv_message_timeout(Some(left())))
                .map_err(stalled)?
                .ok_or_else(|| {
                    Failure::new(crate::error::LOST, "the server ended the test early")
                })?;
            let rtt = t0.elapsed();
            if echo != msg {
                return Err(Failure::new(
                    crate::error::GENERIC,
                    format!("the echo of a {size}-byte message differs from the message"),
                ));
            }
            if i >= WARMUP.min(reps) {
                rtts.push(rtt.as_secs_f64() * 1e6);
            }
            if t0 >= next_event_poll {
                events.poll(std::slice::from_ref(conn));
                next_event_poll = t0 + EVENT_POLL_PERIOD;
            }
        }
        events.poll(std::slice::from_ref(conn));
        let r = stats_of(size, &mut rtts);
        say.line(format!(
            "{:>10} {:>7} {:>9.1} µs {:>9.1} µs {:>9.1} µs {:>9.1} µs",
            fmt_bytes(size as u64),
            r.count,
            r.median_us,
            r.p99_us,
            r.min_us,
            r.mean_us
        ));
        events.flush();
        results.push(r);
    }
    events.hold = false;
    conn.finish().map_err(|e| Failure::lost(&e))?;
    net::wait_acknowledged(conn, Duration::from_millis(100), || {})?;
    let fit = args.sweep.then(|| fit(&results));
    if let Some(f) = &fit {
        say.line(format!(
            "fit of the one-way time t = RTT/2 = alpha + beta * n: alpha = {:.1} µs, \
             1/beta = {}, n_1/2 = alpha/beta = {}",
            f.alpha_us,
            fmt_rate(f.bandwidth_bps),
            f.n_half_bytes
                .map(|n| fmt_bytes(n.round() as u64))
                .unwrap_or_else(|| "undefined (alpha <= 0)".into())
        ));
    }
    let single = (!args.sweep).then(|| results[0].clone());
    Ok(LatencyDoc {
        command: "bench",
        test: "latency",
        median_us: single.as_ref().map(|r| r.median_us),
        p99_us: single.as_ref().map(|r| r.p99_us),
        results,
        fit,
        events: std::mem::take(&mut events.records),
        faults: std::mem::take(&mut events.faults),
    })
}

/// The error of a latency round trip that failed: one that took longer than [`STALL_LIMIT`]
/// aborts the connection with the reason, so the server learns why its client went.
fn stalled_or_lost(conn: &Connection, e: io::Error, size: usize) -> Failure {
    // a connection that ended on a timeout of its own fails with the same kind
    if e.kind() != io::ErrorKind::TimedOut || conn.close_reason().is_some() {
        return Failure::lost(&e);
    }
    let why = format!(
        "no echo of a {size}-byte message within {} s: the connection stalled",
        STALL_LIMIT.as_secs()
    );
    conn.abort(1, &why);
    Failure::new(crate::error::LOST, why)
}

fn stats_of(size: usize, rtts: &mut [f64]) -> LatencyResult {
    rtts.sort_by(f64::total_cmp);
    let n = rtts.len();
    let median = if n % 2 == 1 {
        rtts[n / 2]
    } else {
        (rtts[n / 2 - 1] + rtts[n / 2]) / 2.0
    };
    let p99 = rtts[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1];
    LatencyResult {
        size,
        count: n,
        median_us: median,
        p99_us: p99,
        min_us: rtts[0],
        mean_us: rtts.iter().sum::<f64>() / n as f64,
    }
}

/// Least squares of t = median/2 against the size, each point weighted by 1/t^2: the sizes
/// span six decades, and unweighted the few largest ones (milliseconds, noisy) would set alpha
/// too, which then swings to large negative values from one run to the next.
fn fit(results: &[LatencyResult]) -> Fit {
    let points: Vec<(f64, f64, f64)> = results
        .iter()
        .map(|r| {
            let t = r.median_us / 2.0;
            (r.size as f64, t, 1.0 / (t * t).max(f64::MIN_POSITIVE))
        })
        .collect();
    let w: f64 = points.iter().map(|p| p.2).sum();
    let mx = points.iter().map(|p| p.2 * p.0).sum::<f64>() / w;
    let my = points.iter().map(|p| p.2 * p.1).sum::<f64>() / w;
    let sxy: f64 = points.iter().map(|p| p.2 * (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| p.2 * (p.0 - mx) * (p.0 - mx)).sum();
    let beta = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let alpha = my - beta * mx;
    Fit {
        alpha_us: alpha,
        beta_us_per_byte: beta,
        bandwidth_bps: if beta > 0.0 { 8e6 / beta } else { 0.0 },
        n_half_bytes: (alpha > 0.0 && beta > 0.0).then(|| alpha / beta),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sweep results for every power of two from 1 B to 1 MiB with one-way time `t(size)`.
    fn sweep(t: impl Fn(usize) -> f64) -> Vec<LatencyResult> {
        (0..=20)
            .map(|k| {
                let size = 1usize << k;
                LatencyResult {
                    size,
                    count: 1,
                    median_us: 2.0 * t(size),
                    p99_us: 0.0,
                    min_us: 0.0,
                    mean_us: 0.0,
                }
            })
            .collect()
    }

    #[test]
    fn fit_recovers_a_line() {
        // t = 50 µs + n / (100 bytes/µs): alpha 50, 1/beta = 800 Mbit/s, n_1/2 = 5000 bytes
        let f = fit(&sweep(|size| 50.0 + size as f64 / 100.0));
        assert!((f.alpha_us - 50.0).abs() < 1e-6, "{f:?}");
        assert!((f.bandwidth_bps - 800e6).abs() < 1.0, "{f:?}");
        assert!((f.n_half_bytes.unwrap() - 5000.0).abs() < 1e-3, "{f:?}");
    }

    /// Large messages slower than the line (as when a big message is not striped well) must
    /// not drag the start-up latency below zero.
    #[test]
    fn fit_keeps_alpha_when_the_largest_sizes_bend_away() {
        let f = fit(&sweep(|size| {
            let slowdown = if size > 65536 { 1.5 } else { 1.0 };
            50.0 + slowdown * size as f64 / 100.0
        }));
        assert!((f.alpha_us - 50.0).abs() < 10.0, "{f:?}");
        assert!(f.n_half_bytes.is_some(), "{f:?}");
    }

    #[test]
    fn median_and_p99() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        let r = stats_of(1, &mut v);
        assert_eq!(r.median_us, 50.5);
        assert_eq!(r.p99_us, 99.0);
        assert_eq!(r.min_us, 1.0);
    }
}
