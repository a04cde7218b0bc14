//! `ri2n bench`: measures a connection to `ri2n serve`.
//!
//! Throughput (either direction) for a fixed time, with a timeline at the chosen interval:
//! application goodput, each link's traffic and state per interval, and link state changes as
//! they happen; then a summary (goodput, per-link share, repairs and losses, the server's
//! view). Latency: ping-pong of whole messages, median and p99 round trip; with `--sweep`, the
//! fit t = alpha + beta * n over message sizes and the half-bandwidth size n_1/2 = alpha/beta.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ri2n::{Connection, ConnectionStats, Event};
use serde::Serialize;

use crate::checksum::RandomBytes;
use crate::control::{Request, ServerReport, Test, VERSION};
use crate::error::Failure;
use crate::fault::FaultPlan;
use crate::monitor;
use crate::net;
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
/// A round trip that takes longer than this ends the latency test (exit 4) instead of
/// hanging the benchmark.
const STALL_LIMIT: Duration = Duration::from_secs(10);
/// How often the sampling thread of a throughput test looks for link events between rows.
const EVENT_TICK: Duration = Duration::from_millis(20);

pub fn run(args: &BenchArgs) -> Result<(), Failure> {
    let say = Say { json: args.json };
    let endpoint = net::client_endpoint(&args.connect, &args.key, false)?;
    let faults = FaultPlan::new(&endpoint, &args.link.fault)?;
    let config = net::connection_config(&args.connect, &args.link, net::Application::Bench);
    let conn = net::connect(&endpoint, &args.connect, config)?;
    let start = Instant::now();
    faults.start(start, true);
    let mut events = EventLog::new(start, say);

    let doc = if args.latency {
        serde_json::to_value(latency(&conn, args, &mut events, say)?)
    } else if args.reverse {
        serde_json::to_value(throughput_reverse(&conn, args, start, &mut events, say)?)
    } else {
        serde_json::to_value(throughput(&conn, args, start, &mut events, say)?)
    }
    .expect("the report serialises");
    net::linger(&conn, net::LINGER);
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
            eprintln!("{}", s.as_ref());
        } else {
            println!("{}", s.as_ref());
        }
    }
}

/// A link event, timed from the test's start.
#[derive(Debug, Clone, Serialize)]
struct EventRecord {
    t: f64,
    link: u8,
    event: String,
}

/// How often the latency test looks for link events between round trips: each event carries
/// its own time, and looking after every round trip (a lock and a lookup) was part of what
/// the test measured.
const EVENT_POLL_PERIOD: Duration = Duration::from_millis(20);

/// Collects the connection's link events (each with the time the engine reported it) and
/// prints each as it comes, or, while `hold` is set (inside a table whose rows must stay
/// together), at the next [`flush`](Self::flush).
struct EventLog {
    start: Instant,
    say: Say,
    records: Vec<EventRecord>,
    hold: bool,
    /// Lines not printed yet (while holding).
    held: Vec<String>,
}

impl EventLog {
    fn new(start: Instant, say: Say) -> Self {
        Self {
            start,
            say,
            records: Vec::new(),
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

    fn poll(&mut self, conn: &Connection) {
        for e in conn.poll_events() {
            let (link, event) = match e.event {
                Event::LinkAdded { link } => (link, "added".to_owned()),
                Event::LinkStateChanged { link, from, to } => {
                    (link, format!("{} -> {}", state_name(from), state_name(to)))
                }
                _ => continue,
            };
            let t = e.at.saturating_duration_since(self.start).as_secs_f64();
            let line = format!("{t:10.3} s   L{link} {event}");
            if self.hold {
                self.held.push(line);
            } else {
                self.say.line(line);
            }
            self.records.push(EventRecord {
                t,
                link: link.0,
                event,
            });
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
    links: Vec<LinkDelta>,
}

/// The per-interval timeline of a throughput test.
struct Timeline {
    start: Instant,
    interval: Duration,
    next: Instant,
    prev_t: Instant,
    prev_bytes: u64,
    meter: LinkMeter,
    rows: Vec<IntervalRow>,
    /// Rate the links by bytes received (reverse test) rather than sent.
    incoming: bool,
    links_in_header: usize,
    say: Say,
}

impl Timeline {
    fn new(start: Instant, interval: Duration, incoming: bool, say: Say) -> Self {
        let mut meter = LinkMeter::default();
        meter.sample(start, &[]);
        Self {
            start,
            interval,
            next: start + interval,
            prev_t: start,
            prev_bytes: 0,
            meter,
            rows: Vec::new(),
            incoming,
            links_in_header: 0,
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

    /// Closes the current interval at `bytes` done.
    fn sample(&mut self, bytes: u64, stats: &ConnectionStats) {
        let now = Instant::now();
        let links = self.meter.sample(now, &stats.links);
        if stats.links.len() > self.links_in_header {
            self.links_in_header = stats.links.len();
            let names: Vec<String> = stats
                .links
                .iter()
                .map(|l| format!("L{} {} -> {}", l.id, l.local, l.remote))
                .collect();
            self.say.line(format!("links: {}", names.join(", ")));
            let mut h = format!("{:>17} {:>14}", "interval (s)", "goodput");
            for l in &stats.links {
                h += &format!("   {:<24}", format!("L{} state, rate, rtt", l.id));
            }
            self.say.line(h);
        }
        let (t0, t1) = (
            self.prev_t.duration_since(self.start).as_secs_f64(),
            now.duration_since(self.start).as_secs_f64(),
        );
        let delta = bytes.saturating_sub(self.prev_bytes);
        let row = IntervalRow {
            start: t0,
            end: t1,
            bytes: delta,
            goodput_bps: bps(delta, t1 - t0),
            links,
        };
        let mut line = format!("{:>8.2}-{:<8.2} {:>14}", t0, t1, fmt_rate(row.goodput_bps));
        for l in &row.links {
            let rate = if self.incoming {
                l.recv_bps
            } else {
                l.sent_bps
            };
            line += &format!(
                "   {:<10} {:>13} {:>9}",
                l.state,
                fmt_rate(rate),
                fmt_rtt_us(l.srtt_us)
            );
        }
        self.say.line(line);
        self.rows.push(row);
        self.prev_t = now;
        self.prev_bytes = bytes;
        while self.next <= now {
            self.next += self.interval;
        }
    }

    /// The last, partial interval, unless it is shorter than a quarter of an interval and
    /// follows others: a rate over a few milliseconds (in which the last acknowledgements
    /// arrive at once) says nothing. The summary counts its bytes either way.
    fn close(&mut self, bytes: u64, stats: &ConnectionStats) {
        if self.prev_t.elapsed() >= self.interval / 4 || self.rows.is_empty() {
            self.sample(bytes, stats);
        }
    }
}

/// The JSON document of a throughput test.
#[derive(Debug, Serialize)]
struct ThroughputDoc {
    command: &'static str,
    test: &'static str,
    seconds_requested: f64,
    interval: f64,
    intervals: Vec<IntervalRow>,
    events: Vec<EventRecord>,
    summary: ThroughputSummary,
    /// What the server reported (its view: bytes it read or wrote, its per-link counters).
    server: Option<ServerReport>,
}

#[derive(Debug, Serialize)]
struct ThroughputSummary {
    /// Application bytes moved (acknowledged when sending, read when receiving).
    bytes: u64,
    seconds: f64,
    goodput_bps: f64,
    /// Stream bytes sent beyond the application's (repairs after loss or a link failure), by
    /// the sending side.
    retransmitted_bytes: Option<u64>,
    /// Packets the sending side declared lost.
    packets_lost: Option<u64>,
    links: Vec<LinkSummary>,
}

/// Sends the request for `test`; `interval` asks the server for its timeline of what it read.
fn request(conn: &Connection, test: Test, seconds: f64, interval: f64) -> Result<(), Failure> {
    let msg = serde_json::to_vec(&Request {
        version: VERSION,
        test,
        seconds,
        interval,
    })
    .expect("a request serialises");
    conn.send_message(&msg).map_err(|e| Failure::lost(&e))
}

/// The server's report, the next message after a throughput test.
fn server_report(conn: &Connection) -> Option<ServerReport> {
    let m = conn.recv_message().ok()??;
    serde_json::from_slice(&m).ok()
}

/// Samples the timeline and collects the link events from a thread of its own while
/// `transfer` moves the data, so that the timeline keeps its rows and the events their lines
/// while the data path blocks (every link down: the writer waits for window, the reader for
/// data). `transfer` keeps its byte count in the counter it is given; `done` turns that count
/// and the connection's statistics into the bytes the timeline counts.
fn sampled<R>(
    conn: &Connection,
    tl: &mut Timeline,
    events: &mut EventLog,
    done: impl Fn(u64, &ConnectionStats) -> u64 + Send,
    transfer: impl FnOnce(&AtomicU64) -> Result<R, Failure>,
) -> Result<R, Failure> {
    monitor::with_ticker(
        move |count| {
            events.poll(conn);
            if tl.due() {
                let stats = conn.stats();
                tl.sample(done(count, &stats), &stats);
            }
            tl.until_due().min(EVENT_TICK)
        },
        transfer,
    )
}

fn throughput(
    conn: &Connection,
    args: &BenchArgs,
    start: Instant,
    events: &mut EventLog,
    say: Say,
) -> Result<ThroughputDoc, Failure> {
    request(
        conn,
        Test::Throughput,
        args.time.as_secs_f64(),
        args.interval.as_secs_f64(),
    )?;
    say.line(format!(
        "throughput test, {:.1} s, sending; timeline every {} s",
        args.time.as_secs_f64(),
        args.interval.as_secs_f64()
    ));
    let mut data = vec![0u8; 16 * CHUNK];
    RandomBytes::new(1).fill(&mut data);
    let mut tl = Timeline::new(start, args.interval, false, say);
    let acked = |written: u64, s: &ConnectionStats| written - s.send_buffered.min(written);
    let end = start + args.time;
    let written = sampled(conn, &mut tl, events, acked, |counter| {
        let mut writer = conn;
        let mut written = 0u64;
        let mut off = 0;
        while Instant::now() < end {
            // count every accepted part, not whole chunks: the timeline subtracts what is
            // still buffered, which includes a chunk's accepted part while the rest waits
            let mut chunk = &data[off..off + CHUNK];
            while !chunk.is_empty() {
                let n = writer.write(chunk).map_err(|e| Failure::lost(&e))?;
                written += n as u64;
                counter.store(written, Ordering::Relaxed);
                chunk = &chunk[n..];
            }
            off = (off + CHUNK) % data.len();
        }
        conn.finish().map_err(|e| Failure::lost(&e))?;
        net::wait_acknowledged(conn, Duration::from_millis(5), || {})?;
        Ok(written)
    })?;
    let seconds = start.elapsed().as_secs_f64();
    events.poll(conn);
    let stats = conn.stats();
    tl.close(written, &stats);
    let server = server_report(conn);
    let stream_sent: u64 = stats.links.iter().map(|l| l.stream_bytes_sent).sum();
    let summary = ThroughputSummary {
        bytes: written,
        seconds,
        goodput_bps: bps(written, seconds),
        retransmitted_bytes: Some(stream_sent.saturating_sub(written)),
        packets_lost: Some(stats.links.iter().map(|l| l.packets_lost).sum()),
        links: LinkSummary::all(&stats.links, false),
    };
    Ok(throughput_doc(
        args, say, tl, events, summary, server, false,
    ))
}

fn throughput_reverse(
    conn: &Connection,
    args: &BenchArgs,
    start: Instant,
    events: &mut EventLog,
    say: Say,
) -> Result<ThroughputDoc, Failure> {
    request(conn, Test::Reverse, args.time.as_secs_f64(), 0.0)?;
    // nothing more to send: our end of stream goes with the request
    conn.finish().map_err(|e| Failure::lost(&e))?;
    say.line(format!(
        "throughput test, {:.1} s, receiving (reverse); timeline every {} s",
        args.time.as_secs_f64(),
        args.interval.as_secs_f64()
    ));
    let mut tl = Timeline::new(start, args.interval, true, say);
    let got = sampled(
        conn,
        &mut tl,
        events,
        |got, _| got,
        |counter| {
            let mut reader = conn;
            let mut buf = vec![0u8; 256 * 1024];
            let mut got = 0u64;
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => return Ok(got),
                    Ok(n) => got += n as u64,
                    Err(e) => return Err(Failure::lost(&e)),
                }
                counter.store(got, Ordering::Relaxed);
            }
        },
    )?;
    let seconds = start.elapsed().as_secs_f64();
    events.poll(conn);
    let stats = conn.stats();
    tl.close(got, &stats);
    let server = server_report(conn);
    let (retransmitted_bytes, packets_lost) = match &server {
        Some(r) => (
            Some(
                r.links
                    .iter()
                    .map(|l| l.stream_bytes_sent)
                    .sum::<u64>()
                    .saturating_sub(r.bytes),
            ),
            Some(r.links.iter().map(|l| l.packets_lost).sum()),
        ),
        None => (None, None),
    };
    let summary = ThroughputSummary {
        bytes: got,
        seconds,
        goodput_bps: bps(got, seconds),
        retransmitted_bytes,
        packets_lost,
        links: LinkSummary::all(&stats.links, true),
    };
    Ok(throughput_doc(args, say, tl, events, summary, server, true))
}

/// Prints the summary of a throughput test (either direction) and assembles its document.
fn throughput_doc(
    args: &BenchArgs,
    say: Say,
    tl: Timeline,
    events: &mut EventLog,
    summary: ThroughputSummary,
    server: Option<ServerReport>,
    reverse: bool,
) -> ThroughputDoc {
    print_summary(say, &summary, server.as_ref(), reverse);
    ThroughputDoc {
        command: "bench",
        test: if reverse { "reverse" } else { "throughput" },
        seconds_requested: args.time.as_secs_f64(),
        interval: args.interval.as_secs_f64(),
        intervals: tl.rows,
        events: std::mem::take(&mut events.records),
        summary,
        server,
    }
}

fn print_summary(say: Say, s: &ThroughputSummary, server: Option<&ServerReport>, reverse: bool) {
    say.line(format!(
        "summary: {} {} in {:.2} s: {} goodput",
        if reverse { "received" } else { "sent" },
        fmt_bytes(s.bytes),
        s.seconds,
        fmt_rate(s.goodput_bps)
    ));
    for l in &s.links {
        say.line(format!(
            "  L{} {} -> {}: {}, {:.1} % of the {}, {} packets lost, rtt {} (min {})",
            l.id,
            l.local,
            l.remote,
            l.state,
            l.share * 100.0,
            if reverse {
                "bytes received"
            } else {
                "stream bytes sent"
            },
            l.packets_lost,
            fmt_rtt_us(l.srtt_us),
            fmt_rtt_us(l.min_rtt_us),
        ));
    }
    if let (Some(r), Some(p)) = (s.retransmitted_bytes, s.packets_lost) {
        say.line(format!(
            "  {} re-sent ({:.2} % of the data), {p} packets declared lost{}",
            fmt_bytes(r),
            if s.bytes > 0 {
                r as f64 * 100.0 / s.bytes as f64
            } else {
                0.0
            },
            if reverse { " (server's count)" } else { "" }
        ));
    }
    if let Some(r) = server {
        say.line(format!(
            "  server: {} {} in {:.2} s: {}",
            if reverse { "sent" } else { "received" },
            fmt_bytes(r.bytes),
            r.seconds,
            fmt_rate(bps(r.bytes, r.seconds))
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
    request(conn, Test::Latency, 0.0, 0.0)?;
    let count = args.count as usize;
    say.line(format!(
        "latency test: ping-pong of whole messages, {} round trips per size{}",
        count,
        if args.sweep {
            format!(
                " (fewer above {}, at least {SWEEP_MIN_COUNT})",
                fmt_bytes((SWEEP_BYTES_PER_SIZE / count.max(1)) as u64)
            )
        } else {
            String::new()
        }
    ));
    say.line(format!(
        "{:>10} {:>7} {:>12} {:>12} {:>12} {:>12}",
        "size", "count", "median", "p99", "min", "mean"
    ));
    let watchdog = Watchdog::start(STALL_LIMIT);
    // link events go below the row of the size during which they happened
    events.hold = true;
    let mut results = Vec::new();
    let mut payload = vec![0u8; *sizes.iter().max().unwrap()];
    RandomBytes::new(3).fill(&mut payload);
    for &size in &sizes {
        let reps = if args.sweep {
            count.min((SWEEP_BYTES_PER_SIZE / size).max(SWEEP_MIN_COUNT))
        } else {
            count
        };
        let msg = &payload[..size];
        let mut rtts = Vec::with_capacity(reps);
        let mut next_event_poll = Instant::now();
        for i in 0..WARMUP.min(reps) + reps {
            watchdog.arm(size);
            let t0 = Instant::now();
            conn.send_message(msg).map_err(|e| Failure::lost(&e))?;
            let echo = conn
                .recv_message()
                .map_err(|e| Failure::lost(&e))?
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
                events.poll(conn);
                next_event_poll = t0 + EVENT_POLL_PERIOD;
            }
        }
        events.poll(conn);
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
    watchdog.disarm();
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
    })
}

/// Ends the process with a clear error if a round trip stalls: the library's blocking calls
/// have no timeout of their own.
struct Watchdog {
    origin: Instant,
    /// Start of the current round trip in ms since `origin` (0: disarmed), and its size.
    state: Arc<(AtomicU64, AtomicU64)>,
}

impl Watchdog {
    fn start(limit: Duration) -> Self {
        let state = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let origin = Instant::now();
        let s = state.clone();
        let _ = std::thread::Builder::new()
            .name("ri2n-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(200));
                let since = s.0.load(Ordering::Relaxed);
                if since == 0 {
                    continue;
                }
                let now = origin.elapsed().as_millis() as u64;
                if now.saturating_sub(since) > limit.as_millis() as u64 {
                    crate::progress::clear_line();
                    eprintln!(
                        "ri2n: error: no echo of a {}-byte message within {} s: the connection \
                         stalled",
                        s.1.load(Ordering::Relaxed),
                        limit.as_secs()
                    );
                    std::process::exit(crate::error::LOST.into());
                }
            });
        Self { origin, state }
    }

    fn arm(&self, size: usize) {
        let now = self.origin_ms();
        self.state.1.store(size as u64, Ordering::Relaxed);
        self.state.0.store(now.max(1), Ordering::Relaxed);
    }

    fn disarm(&self) {
        self.state.0.store(0, Ordering::Relaxed);
    }

    fn origin_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }
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
