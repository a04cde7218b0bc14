//! `ri2n serve`: the long-running counterpart of `ri2n bench`. Each client is a task on a
//! small tokio runtime (a worker per CPU), not a thread, so thousands of idle or slow clients
//! cost memory, not threads. Its first message names the test: throughput (grant a time, at
//! most `--max-time`; read and discard, then report), reverse (grant a time, write for it,
//! at the rate asked if any, then report) or latency (echo every
//! message; the first [`MAX_LATENCY_THREADS`] latency clients at a time echo on a thread of
//! their own, see [`LatencyThread`]). Every wait on a client is bounded ([`REQUEST_WAIT`],
//! [`OVERRUN`], [`IDLE`]): one that holds its test up is cut off and told why, so no client
//! keeps a task, a thread or a slot for ever.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ri2n::tokio::AsyncConnection;
use ri2n::{Connection, ConnectionState, Endpoint};
use tokio::io::AsyncWriteExt;

use crate::checksum::RandomBytes;
use crate::control::{Grant, Request, ServerLink, ServerReport, Test, Versioned, VERSION};
use crate::error::{self, Failure};
use crate::net;
use crate::pace::Pacer;
use crate::report::{bps, fmt_bytes, fmt_rate, LinkSummary};
use crate::ServeArgs;

/// Finest timeline a client may ask for (as `ri2n bench --interval`).
const MIN_INTERVAL: Duration = Duration::from_millis(10);
/// Most rows of a timeline: with its other fields the report must fit in one message (8 MiB;
/// a row takes some 30 bytes of JSON), or a long test at a fine interval would get none.
const MAX_TIMELINE_ROWS: u32 = 100_000;
/// Longest a reverse test's report waits for what the server wrote to be acknowledged.
const ACKNOWLEDGED_WAIT: Duration = Duration::from_secs(10);
/// How long a client may take to name its test after connecting (`ri2n bench` does at once).
const REQUEST_WAIT: Duration = Duration::from_secs(10);
/// How long after its granted time a throughput test's client has to end its stream (what
/// its send buffer held is still arriving), or a reverse test's client to take what the
/// server wrote, beyond the time its links may all be down, before it is cut off.
const OVERRUN: Duration = Duration::from_secs(10);
/// How long a latency client may send nothing and take none of the echoes, beyond the time
/// its links may all be down, before it is cut off: it would hold its task (or one of the
/// [`MAX_LATENCY_THREADS`]) and a client slot for ever.
const IDLE: Duration = Duration::from_secs(60);

/// What each client's test may take.
#[derive(Clone, Copy)]
struct Limits {
    /// Longest throughput test granted (--max-time).
    max_time: Duration,
    /// How long past its grant a throughput or reverse test's client may go on before it is
    /// cut off: [`OVERRUN`], and the time every link may be down without the connection
    /// ending.
    overrun: Duration,
    /// How long a latency client may stay idle: [`IDLE`] and that time too.
    idle: Duration,
}
/// The pause after a client that could not be taken, before the next accept.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

pub fn run(args: &ServeArgs) -> Result<(), Failure> {
    let endpoint = net::server_endpoint_with(
        &args.listen,
        &args.key,
        Some(args.all_links_down_timeout),
        net::Application::Bench,
        |cfg| {
            cfg.with_max_connections(args.max_clients as usize)
                .with_max_connections_per_address(args.max_clients_per_address as usize)
                .with_shards(args.shards.map(|n| n as usize))
        },
    )?;
    if !args.quiet {
        say!(
            "ri2n serve: listening on {} ({} shard{})",
            error::list(&endpoint.local_addrs()),
            endpoint.shards(),
            if endpoint.shards() == 1 { "" } else { "s" }
        );
    }
    crate::interrupt::abort_endpoint_on_interrupt(endpoint.clone(), crate::interrupt::End::Server);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
        .thread_name("ri2n-serve")
        .enable_all()
        .build()
        .map_err(|e| Failure::io("starting the runtime", &e))?;
    let limits = Limits {
        max_time: args.max_time,
        overrun: OVERRUN.saturating_add(args.all_links_down_timeout),
        idle: IDLE.saturating_add(args.all_links_down_timeout),
    };
    runtime.block_on(serve(endpoint, args.quiet, limits))
}

async fn serve(endpoint: Endpoint, quiet: bool, limits: Limits) -> Result<(), Failure> {
    let _refusals = net::RefusalLog::start(&endpoint, "ri2n serve");
    loop {
        let conn = match ri2n::tokio::accept(&endpoint).await {
            Ok(conn) => conn,
            // one client that cannot be taken (no descriptor left: EMFILE) is told so and
            // refused; the others go on, and so does the server once some have left
            Err(e) => {
                say!("ri2n serve: cannot take a client: {e}");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        tokio::spawn(async move {
            let peer = net::peer_addr(conn.get_ref())
                .map(|a| a.to_string())
                .unwrap_or_else(|| "?".into());
            match serve_client(conn, limits).await {
                Ok(line) if !quiet => say!("ri2n serve: {peer}: {line}"),
                Ok(_) => {}
                // the interrupt aborted this client's connection, and serve says so once
                Err(_) if crate::interrupt::caught().is_some() => {}
                Err(f) => say!("ri2n serve: {peer}: {}", f.message),
            }
        });
    }
}

/// Runs one client's test; returns the line to log.
async fn serve_client(mut conn: AsyncConnection, limits: Limits) -> Result<String, Failure> {
    let lost = |e: std::io::Error| Failure::lost(&e);
    let Ok(first) = tokio::time::timeout(REQUEST_WAIT, conn.recv_message()).await else {
        // a client that names no test would hold its task and a client slot for ever
        let why = format!(
            "no test request within {} s: this is `ri2n serve`, a benchmark server",
            REQUEST_WAIT.as_secs()
        );
        return Err(let_go(conn.get_ref(), why));
    };
    let Some(first) = first.map_err(lost)? else {
        // e.g. `ri2n send` pointed at a bench server: tell it its data went nowhere
        conn.get_ref().abort(
            2,
            "this is `ri2n serve`, a benchmark server: it takes `ri2n bench` clients only \
             (send data to `ri2n recv`)",
        );
        return Err(Failure::usage(
            "the client ended without naming a test (not `ri2n bench`?); it was told",
        ));
    };
    // the version first: a client of another version may ask in another form, and is to
    // learn that versions differ, not that its request is bad
    let version = serde_json::from_slice::<Versioned>(&first).ok();
    if let Some(version) = version.map(|v| v.version).filter(|&v| v != VERSION) {
        conn.get_ref()
            .abort(2, "unsupported bench protocol version");
        return Err(Failure::usage(format!(
            "client speaks bench protocol version {version}, this server {VERSION}"
        )));
    }
    let req: Request = match serde_json::from_slice(&first) {
        Ok(r) => r,
        Err(e) => {
            conn.get_ref().abort(2, "bad request");
            return Err(Failure::usage(format!("bad request: {e}")));
        }
    };
    let start = Instant::now();
    let line = match req.test {
        Test::Throughput => {
            let (time, cut) = grant(&conn, &req, limits.max_time).await?;
            let longest = time.saturating_add(limits.overrun);
            let interval = timeline_interval(req.interval, longest);
            let until = start + longest;
            let (got, timeline) = read_all(&mut conn, start, interval, until).await?;
            let secs = start.elapsed().as_secs_f64();
            report(&conn, got, secs, timeline, limits.overrun).await?;
            format!(
                "throughput: received {} in {secs:.2} s, {}{cut}",
                fmt_bytes(got),
                fmt_rate(bps(got, secs))
            )
        }
        Test::Reverse => {
            let (time, cut) = grant(&conn, &req, limits.max_time).await?;
            let end = start + time;
            let pacer = Pacer::new(start, req.rate_bps);
            let mut buf = vec![0u8; 64 * 1024];
            RandomBytes::new(0x5EED).fill(&mut buf);
            let size = pacer.map_or(buf.len(), |p| p.write_size(buf.len()));
            // the same memory again and again, shared with the connection rather than
            // copied into it (small paced writes are copied)
            let buf = ri2n::Bytes::from(buf);
            let mut sent = 0u64;
            // a client that stops taking the data would hold its task, its slot and our
            // send buffer for ever
            let until = end + limits.overrun;
            while Instant::now() < end {
                if let Some(p) = pacer {
                    let wait = p.wait(sent, end);
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                }
                let write = conn.write_bytes(buf.slice(..size));
                match tokio::time::timeout_at(until.into(), write).await {
                    Ok(written) => written.map_err(lost)?,
                    Err(_) => return Err(cut_off(&conn, "took none of the data", start, until)),
                }
                sent += size as u64;
            }
            let secs = start.elapsed().as_secs_f64();
            // the links' counters are final only once what the send buffer held is
            // acknowledged: what each delivered, what was sent again, what was lost
            acknowledged(&conn).await;
            report(&conn, sent, secs, Vec::new(), limits.overrun).await?;
            format!(
                "reverse: sent {} in {secs:.2} s, {}{cut}",
                fmt_bytes(sent),
                fmt_rate(bps(sent, secs))
            )
        }
        Test::Latency => {
            let n;
            (conn, n) = match LatencyThread::take() {
                Some(thread) => {
                    let blocking = Arc::new(conn.into_inner());
                    // the thread's calls block: a task of its own watches for an idle client
                    let watch = tokio::spawn(cut_off_when_idle(blocking.clone(), limits.idle));
                    let echo = blocking.clone();
                    let n = tokio::task::spawn_blocking(move || {
                        let _thread = thread;
                        echo_blocking(&echo)
                    })
                    .await
                    .map_err(|e| Failure::new(error::GENERIC, format!("echo thread: {e}")))?;
                    watch.abort();
                    let idle = watch.await.ok();
                    let blocking = Arc::into_inner(blocking).expect("the watch has ended");
                    let conn = AsyncConnection::new(blocking)
                        .map_err(|e| Failure::io("watching the connection", &e))?;
                    match (n, idle) {
                        (_, Some(why)) => return Err(why),
                        (n, None) => (conn, n.map_err(lost)?),
                    }
                }
                None => {
                    let n = echo_async(&mut conn, limits.idle).await?;
                    (conn, n)
                }
            };
            format!("latency: echoed {n} messages")
        }
    };
    conn.shutdown().await.map_err(lost)?;
    finish(conn.get_ref(), limits.overrun).await?;
    Ok(line)
}

/// Lets a client go that holds its test up: its connection is aborted with `why`, and the
/// failure to log says so.
fn let_go(conn: &Connection, why: String) -> Failure {
    conn.abort(2, &why);
    Failure::usage(format!("{why}; the client was told"))
}

/// [`let_go`] for a client that `what` for too long: at `at`, past its grant and the time its
/// links may all be down.
fn cut_off(conn: &AsyncConnection, what: &str, start: Instant, at: Instant) -> Failure {
    let why = format!(
        "the client {what} for too long ({:.1} s into the test: more than its grant and \
         the time its links may all be down)",
        at.duration_since(start).as_secs_f64()
    );
    let_go(conn.get_ref(), why)
}

/// Ends the connection of a latency client echoed on a thread once it has been idle for
/// `idle`: nothing arrived from it, and it acknowledged nothing of ours. The blocked calls
/// of the echo thread then return. Runs until aborted, or returns the failure to log.
async fn cut_off_when_idle(conn: Arc<Connection>, idle: Duration) -> Failure {
    const LOOK: Duration = Duration::from_secs(1);
    let progress = |c: &Connection| {
        let s = c.stats();
        (s.bytes_received, s.bytes_acknowledged)
    };
    let (mut last, mut since) = (progress(&conn), Instant::now());
    loop {
        tokio::time::sleep(LOOK).await;
        let now = progress(&conn);
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= idle {
            return let_go(&conn, idle_reason(idle));
        }
    }
}

fn idle_reason(idle: Duration) -> String {
    format!(
        "the latency client sent nothing and took no echo for {} s",
        idle.as_secs()
    )
}

/// Latency clients echoed on a thread of their own at most (see [`LatencyThread`]).
const MAX_LATENCY_THREADS: usize = 16;
static LATENCY_THREADS: AtomicUsize = AtomicUsize::new(0);

/// A latency client's claim on a thread of its own. There a blocked call receives for
/// itself, while a task waits for the driver thread to receive and then for the runtime to
/// wake it: two more thread switches per message, which the latency test would measure along
/// with the transport. Beyond [`MAX_LATENCY_THREADS`] clients, tasks echo (slower, but
/// thousands of clients still cost no threads).
struct LatencyThread;

impl LatencyThread {
    fn take() -> Option<Self> {
        LATENCY_THREADS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_LATENCY_THREADS).then_some(n + 1)
            })
            .ok()
            .map(|_| Self)
    }
}

impl Drop for LatencyThread {
    fn drop(&mut self) {
        LATENCY_THREADS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Echoes every message until the client's end of stream; returns how many.
fn echo_blocking(conn: &Connection) -> std::io::Result<u64> {
    let mut n = 0u64;
    while let Some(m) = conn.recv_message()? {
        conn.send_message(&m)?;
        n += 1;
    }
    Ok(n)
}

/// [`echo_blocking`] as a task; a client that sends nothing, or takes no echo, for `idle`
/// is cut off (and told).
async fn echo_async(conn: &mut AsyncConnection, idle: Duration) -> Result<u64, Failure> {
    let lost = |e: std::io::Error| Failure::lost(&e);
    let cut_off = |conn: &AsyncConnection| let_go(conn.get_ref(), idle_reason(idle));
    let mut n = 0u64;
    loop {
        let Ok(m) = tokio::time::timeout(idle, conn.recv_message()).await else {
            return Err(cut_off(conn));
        };
        let Some(m) = m.map_err(lost)? else {
            return Ok(n);
        };
        let Ok(sent) = tokio::time::timeout(idle, conn.send_message(&m)).await else {
            return Err(cut_off(conn));
        };
        sent.map_err(lost)?;
        n += 1;
    }
}

/// After our end of stream: waits until the client acknowledged everything (at most
/// `limit`, or it is cut off), then (at most [`net::LINGER`]) until the connection closed
/// cleanly, looking every few milliseconds.
async fn finish(conn: &Connection, limit: Duration) -> Result<(), Failure> {
    const LOOK: Duration = Duration::from_millis(5);
    let until = Instant::now() + limit;
    while !conn.is_acknowledged() {
        if let Some(reason) = conn.close_reason() {
            return Err(Failure::lost_because(&reason));
        }
        if Instant::now() >= until {
            let why = format!(
                "the client did not acknowledge the end of the test within {} s",
                limit.as_secs()
            );
            return Err(let_go(conn, why));
        }
        tokio::time::sleep(LOOK).await;
    }
    let deadline = Instant::now() + net::LINGER;
    while conn.state() != ConnectionState::Closed && Instant::now() < deadline {
        tokio::time::sleep(LOOK).await;
    }
    Ok(())
}

/// Reads the client's stream to its end; returns the bytes read and, with an `interval`, the
/// timeline of bytes read at the end of every interval since `start`, sampled by a task of
/// its own so that it keeps its rows while a read waits (every link down).
async fn read_all(
    conn: &mut AsyncConnection,
    start: Instant,
    interval: Option<Duration>,
    deadline: Instant,
) -> Result<(u64, Vec<(f64, u64)>), Failure> {
    let got = Arc::new(AtomicU64::new(0));
    let timeline = Arc::new(Mutex::new(Vec::new()));
    let sampler = interval.map(|interval| {
        let (got, timeline) = (got.clone(), timeline.clone());
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at((start + interval).into(), interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                ticks.tick().await;
                let row = (start.elapsed().as_secs_f64(), got.load(Ordering::Relaxed));
                timeline.lock().unwrap().push(row);
            }
        })
    });
    // as received, without a copy (iperf3 reads into its one buffer: the kernel's copy)
    let mut chunk = ri2n::Bytes::new();
    let result = loop {
        match tokio::time::timeout_at(deadline.into(), conn.read_chunk(&mut chunk)).await {
            Ok(Ok(0)) => break Ok(()),
            Ok(Ok(n)) => got.fetch_add(n as u64, Ordering::Relaxed),
            Ok(Err(e)) => break Err(Failure::lost(&e)),
            Err(_) => {
                let why = format!(
                    "the test had not ended {:.1} s after it began: more than its grant and \
                     the time its links may all be down",
                    deadline.duration_since(start).as_secs_f64()
                );
                break Err(let_go(conn.get_ref(), why));
            }
        };
    };
    if let Some(s) = sampler {
        s.abort();
    }
    result?;
    let timeline = std::mem::take(&mut *timeline.lock().unwrap());
    Ok((got.load(Ordering::Relaxed), timeline))
}

/// The interval of a throughput test's timeline for a test that may last `longest`: the
/// `asked` seconds (none below [`MIN_INTERVAL`], or not a number), made coarser where the
/// test would give more than [`MAX_TIMELINE_ROWS`] rows, and no longer than the test (a
/// longer one gives no row, and one past the clock's range could not be added to a time).
/// Each row carries its own time.
fn timeline_interval(asked: f64, longest: Duration) -> Option<Duration> {
    let asked = Duration::try_from_secs_f64(asked)
        .ok()
        .filter(|i| *i >= MIN_INTERVAL)?;
    Some((asked.max(longest / MAX_TIMELINE_ROWS)).min(longest.max(MIN_INTERVAL)))
}

/// Tells the client of a throughput test how long it runs: what it asked for, at most
/// `max_time`. Returns that time and, if it was cut, a note for the log line.
async fn grant(
    conn: &AsyncConnection,
    req: &Request,
    max_time: Duration,
) -> Result<(Duration, String), Failure> {
    // a negative or NaN time asks for nothing; one beyond the clock's range for the most
    let asked = Duration::try_from_secs_f64(req.seconds.max(0.0)).unwrap_or(Duration::MAX);
    let time = asked.min(max_time);
    let cut = time < asked;
    let msg = serde_json::to_vec(&Grant {
        seconds: time.as_secs_f64(),
        cut,
    })
    .expect("a grant serialises");
    conn.send_message(&msg)
        .await
        .map_err(|e| Failure::lost(&e))?;
    let note = if cut {
        format!(" (cut from {:.1} s by --max-time)", req.seconds)
    } else {
        String::new()
    };
    Ok((time, note))
}

/// Waits, at most [`ACKNOWLEDGED_WAIT`], until everything written on `conn` was acknowledged
/// (or the connection ended).
async fn acknowledged(conn: &AsyncConnection) {
    let deadline = Instant::now() + ACKNOWLEDGED_WAIT;
    let c = conn.get_ref();
    while c.stats().send_buffered > 0
        && c.state() != ConnectionState::Closed
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Sends the server's report of a throughput or reverse test; a client that leaves it no
/// room within `limit` is cut off.
async fn report(
    conn: &AsyncConnection,
    bytes: u64,
    seconds: f64,
    timeline: Vec<(f64, u64)>,
    limit: Duration,
) -> Result<(), Failure> {
    let stats = conn.get_ref().stats();
    let links = LinkSummary::all(&stats.links, false)
        .iter()
        .map(ServerLink::from)
        .collect();
    let msg = serde_json::to_vec(&ServerReport {
        bytes,
        seconds,
        links,
        bytes_acknowledged: Some(stats.bytes_acknowledged),
        timeline,
    })
    .expect("a report serialises");
    // a reverse test's client that stopped reading leaves no room for it
    match tokio::time::timeout(limit, conn.send_message(&msg)).await {
        Ok(sent) => sent.map_err(|e| Failure::lost(&e)),
        Err(_) => {
            let why = format!(
                "the client took no room for the report within {} s",
                limit.as_secs()
            );
            Err(let_go(conn.get_ref(), why))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fine interval over a long test is made coarser, so that the report still fits in
    /// a message: `-t 3600 -i 0.01` (as --max-time allows) gave 360 000 rows, some 11 MB.
    #[test]
    fn a_timeline_never_has_more_rows_than_a_report_holds() {
        let hour = Duration::from_secs(3600);
        assert_eq!(timeline_interval(0.0, hour), None);
        assert_eq!(timeline_interval(f64::NAN, hour), None);
        assert_eq!(timeline_interval(0.001, hour), None, "below the finest");
        let secs = Duration::from_secs;
        assert_eq!(timeline_interval(1.0, hour), Some(secs(1)));
        assert_eq!(timeline_interval(0.01, secs(20)), Some(MIN_INTERVAL));
        let i = timeline_interval(0.01, hour).unwrap();
        assert_eq!(i, hour / MAX_TIMELINE_ROWS);
        // a row as the report writes it, at its widest for an hour's test
        let row = serde_json::to_string(&(3_599.990_123_456_f64, 4_499_999_999_999_u64)).unwrap();
        let rows = hour.as_nanos() / i.as_nanos();
        assert!(rows as usize * (row.len() + 1) < 7 << 20, "{rows} rows");
    }

    #[test]
    fn latency_clients_get_threads_up_to_the_bound_and_tasks_beyond() {
        let threads: Vec<_> = std::iter::from_fn(LatencyThread::take).take(100).collect();
        assert_eq!(threads.len(), MAX_LATENCY_THREADS);
        assert!(LatencyThread::take().is_none());
        drop(threads);
        assert!(LatencyThread::take().is_some());
    }
}
