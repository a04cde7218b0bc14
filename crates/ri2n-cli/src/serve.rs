//! `ri2n serve`: the long-running counterpart of `ri2n bench`. Each client gets a thread; its
//! first message names the test: throughput (read and discard, then report), reverse (write
//! for the asked time, then report) or latency (echo every message).

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ri2n::Connection;

use crate::checksum::RandomBytes;
use crate::control::{Request, ServerLink, ServerReport, Test, VERSION};
use crate::error::{self, Failure};
use crate::monitor;
use crate::net;
use crate::report::{bps, fmt_bytes, fmt_rate, LinkSummary};
use crate::ServeArgs;

/// Finest timeline a client may ask for (as `ri2n bench --interval`).
const MIN_INTERVAL: Duration = Duration::from_millis(10);

pub fn run(args: &ServeArgs) -> Result<(), Failure> {
    let endpoint = net::server_endpoint_with(
        &args.listen,
        &args.key,
        Some(args.all_links_down_timeout),
        |cfg| {
            cfg.with_max_connections(args.max_clients as usize)
                .with_max_connections_per_address(args.max_clients_per_address as usize)
        },
    )?;
    if !args.quiet {
        eprintln!(
            "ri2n serve: listening on {}",
            error::list(&endpoint.local_addrs())
        );
    }
    loop {
        let Some(conn) = net::accept_logging_refusals(&endpoint, None, "ri2n serve")? else {
            continue;
        };
        let quiet = args.quiet;
        let max_time = args.max_time;
        let spawned = std::thread::Builder::new()
            .name("ri2n-serve-client".into())
            .spawn(move || {
                let peer = net::peer_addr(&conn)
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| "?".into());
                match serve_client(conn, max_time) {
                    Ok(line) if !quiet => eprintln!("ri2n serve: {peer}: {line}"),
                    Ok(_) => {}
                    Err(f) => eprintln!("ri2n serve: {peer}: {}", f.message),
                }
            });
        if let Err(e) = spawned {
            eprintln!("ri2n serve: cannot start a thread for a client: {e}");
        }
    }
}

/// Runs one client's test; returns the line to log.
fn serve_client(mut conn: Connection, max_time: Duration) -> Result<String, Failure> {
    let Some(first) = conn.recv_message().map_err(|e| Failure::lost(&e))? else {
        // e.g. `ri2n send` pointed at a bench server: tell it its data went nowhere
        conn.abort(
            2,
            "this is `ri2n serve`, a benchmark server: it takes `ri2n bench` clients only \
             (send data to `ri2n recv`)",
        );
        return Err(Failure::usage(
            "the client ended without naming a test (not `ri2n bench`?); it was told",
        ));
    };
    let req: Request = match serde_json::from_slice(&first) {
        Ok(r) => r,
        Err(e) => {
            conn.abort(2, "bad request");
            return Err(Failure::usage(format!("bad request: {e}")));
        }
    };
    if req.version != VERSION {
        conn.abort(2, "unsupported bench protocol version");
        return Err(Failure::usage(format!(
            "client speaks bench protocol version {}, this server {VERSION}",
            req.version
        )));
    }
    let start = Instant::now();
    let line = match req.test {
        Test::Throughput => {
            let interval = Duration::try_from_secs_f64(req.interval)
                .ok()
                .filter(|i| *i >= MIN_INTERVAL);
            let (got, timeline) = read_all(&conn, start, interval)?;
            let secs = start.elapsed().as_secs_f64();
            report(&conn, got, secs, timeline)?;
            format!(
                "throughput: received {} in {secs:.2} s, {}",
                fmt_bytes(got),
                fmt_rate(bps(got, secs))
            )
        }
        Test::Reverse => {
            let time = Duration::try_from_secs_f64(req.seconds)
                .unwrap_or_default()
                .min(max_time);
            let mut buf = vec![0u8; 64 * 1024];
            RandomBytes::new(0x5EED).fill(&mut buf);
            let mut sent = 0u64;
            while start.elapsed() < time {
                conn.write_all(&buf).map_err(|e| Failure::lost(&e))?;
                sent += buf.len() as u64;
            }
            let secs = start.elapsed().as_secs_f64();
            report(&conn, sent, secs, Vec::new())?;
            format!(
                "reverse: sent {} in {secs:.2} s, {}",
                fmt_bytes(sent),
                fmt_rate(bps(sent, secs))
            )
        }
        Test::Latency => {
            let mut n = 0u64;
            while let Some(m) = conn.recv_message().map_err(|e| Failure::lost(&e))? {
                conn.send_message(&m).map_err(|e| Failure::lost(&e))?;
                n += 1;
            }
            format!("latency: echoed {n} messages")
        }
    };
    conn.finish().map_err(|e| Failure::lost(&e))?;
    net::wait_acknowledged(&conn, Duration::from_millis(500), || {})?;
    net::linger(&conn, net::LINGER);
    Ok(line)
}

/// Reads the client's stream to its end; returns the bytes read and, with an `interval`, the
/// timeline of bytes read at the end of every interval since `start`, sampled by a thread of
/// its own so that it keeps its rows while a read blocks (every link down).
fn read_all(
    conn: &Connection,
    start: Instant,
    interval: Option<Duration>,
) -> Result<(u64, Vec<(f64, u64)>), Failure> {
    let read = |got: &AtomicU64| {
        let mut reader = conn;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => return Ok(got.load(Ordering::Relaxed)),
                Ok(n) => got.fetch_add(n as u64, Ordering::Relaxed),
                Err(e) => return Err(Failure::lost(&e)),
            };
        }
    };
    let Some(interval) = interval else {
        return read(&AtomicU64::new(0)).map(|got| (got, Vec::new()));
    };
    let mut timeline = Vec::new();
    let mut next = start + interval;
    let got = monitor::with_ticker(
        |got| {
            let now = Instant::now();
            if now >= next {
                timeline.push((now.duration_since(start).as_secs_f64(), got));
                while next <= now {
                    next += interval;
                }
            }
            next.saturating_duration_since(now)
        },
        read,
    )?;
    Ok((got, timeline))
}

/// Sends the server's report of a throughput test.
fn report(
    conn: &Connection,
    bytes: u64,
    seconds: f64,
    timeline: Vec<(f64, u64)>,
) -> Result<(), Failure> {
    let links = LinkSummary::all(&conn.stats().links, false)
        .iter()
        .map(ServerLink::from)
        .collect();
    let msg = serde_json::to_vec(&ServerReport {
        bytes,
        seconds,
        links,
        timeline,
    })
    .expect("a report serialises");
    conn.send_message(&msg).map_err(|e| Failure::lost(&e))
}
