//! `ri2n bench` against `ri2n serve` on loopback: a test cut by the server's --max-time says
//! so, per-link figures add up to the goodput, the timeline's rows hold what was delivered in
//! them, parallel connections (-P) and a target rate (-b) as iperf3 users know them, and a
//! zero-length test is refused.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

fn serve(extra: &[&str]) -> (Proc, String) {
    spawn_serve(extra)
}

/// Runs `ri2n bench --to TO --json ARGS`; returns the document and the text (on stderr).
fn bench(to: &str, args: &[&str]) -> (serde_json::Value, String) {
    let (s, o) = Proc::spawn(
        "ri2n bench",
        Command::new(bin())
            .args(["bench", "--to", to, "--json"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .wait(Duration::from_secs(30));
    let text = stderr_of(&o);
    assert!(s.success(), "bench {args:?} failed: {s}: {text}");
    let doc = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "bench --json output is not JSON ({e}): {}",
            String::from_utf8_lossy(&o.stdout)
        )
    });
    (doc, text)
}

fn f64_of(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// `ri2n serve` on a free port of 127.0.0.1 with its log kept (see [`stop_serve`]); returns
/// it and its address.
fn logged_serve() -> (Proc, String) {
    logged_serve_with(&[])
}

/// [`logged_serve`] with `extra` options; returns once it listens.
fn logged_serve_with(extra: &[&str]) -> (Proc, String) {
    let port = free_port();
    let to = format!("127.0.0.1:{port}");
    let server = Proc::spawn(
        "ri2n serve",
        Command::new(bin())
            .args(["serve", "--listen", &to])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    wait_udp_bound(port, Duration::from_secs(10));
    (server, to)
}

/// A client made by hand, not `ri2n bench`, that connects to the server at `to` and sends
/// `request` as its test request; the endpoint must outlive the connection.
fn bench_request(to: &str, request: serde_json::Value) -> (ri2n::Endpoint, ri2n::Connection) {
    let client = ri2n::Endpoint::client(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    let config = ri2n::ConnectionConfig::default()
        .with_application("ri2n bench")
        .with_accept_messages(true);
    let conn = client.connect(&[to.parse().unwrap()], config).unwrap();
    conn.send_message(&serde_json::to_vec(&request).unwrap())
        .unwrap();
    (client, conn)
}

/// SIGTERM to a [`logged_serve`] once it has logged `expected` (a client hears of an abort
/// before the server logs why). Panics with the log if that line does not come.
fn stop_serve(mut server: Proc, expected: &str) {
    server.wait_for_stderr(expected, Duration::from_secs(10));
    server.signal(libc::SIGTERM);
    server.wait(Duration::from_secs(10));
}

/// `ri2n bench --to TO ARGS`, started, its output kept.
fn start_bench(to: &str, args: &[&str]) -> Proc {
    Proc::spawn(
        "ri2n bench",
        Command::new(bin())
            .args(["bench", "--to", to])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
}

/// `serve --max-time 1` cuts a 3 s test in either direction: the client sends (or receives)
/// for 1 s only, and the text and the document say the test was cut.
#[test]
fn a_test_cut_by_the_server_says_so_in_both_directions() {
    let _g = heavy();
    let (_server, to) = serve(&["--max-time", "1"]);
    for reverse in [false, true] {
        let mut args = vec!["--time", "3"];
        if reverse {
            args.push("-R");
        }
        let (doc, text) = bench(&to, &args);
        assert_eq!(doc["cut_by_server"], true, "{args:?}: {doc}");
        assert_eq!(f64_of(&doc["requested_s"]), 3.0, "{doc}");
        assert_eq!(f64_of(&doc["granted_s"]), 1.0, "{doc}");
        assert_eq!(f64_of(&doc["seconds_requested"]), 3.0, "kept: {doc}");
        let seconds = f64_of(&doc["summary"]["seconds"]);
        assert!(
            (0.9..2.0).contains(&seconds),
            "{args:?}: the test ran {seconds} s, not the 1 s granted"
        );
        assert!(doc["summary"]["bytes"].as_u64().unwrap() > 0, "{doc}");
        let said = text
            .lines()
            .filter(|l| l.contains("cut to 1 s by the server's --max-time"))
            .count();
        assert!(
            said >= 2,
            "{args:?}: the header and the summary say so:\n{text}"
        );
    }
}

/// The rate of `950.3 Mbit/s` or `1.87 Gbit/s` in bits per second.
fn rate(value: &str, unit: &str) -> Option<f64> {
    let v: f64 = value.parse().ok()?;
    let mult = match unit {
        "bit/s" => 1.0,
        "kbit/s" => 1e3,
        "Mbit/s" => 1e6,
        "Gbit/s" => 1e9,
        _ => return None,
    };
    Some(v * mult)
}

/// A timeline row of the text: (goodput, each link's rate), in bits per second.
fn row_rates(line: &str) -> Option<(f64, Vec<f64>)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let first = words.first()?;
    // rows start with the interval, `0.00-1.00`
    let (a, b) = first.split_once('-')?;
    a.parse::<f64>().ok()?;
    b.parse::<f64>().ok()?;
    let rates: Vec<f64> = words.windows(2).filter_map(|w| rate(w[0], w[1])).collect();
    let (goodput, links) = rates.split_first()?;
    Some((*goodput, links.to_vec()))
}

/// With both links policed, what each link delivered adds up to the goodput, in the
/// summary and in every timeline row: the datagrams the policer dropped are not counted as
/// the link's rate (they were, and the links added up to far more than the goodput).
#[test]
fn per_link_figures_add_up_to_the_goodput() {
    let _g = heavy();
    let (_server, to) = serve(&[]);
    let (doc, text) = bench(
        &to,
        &[
            "--time",
            "2",
            "--interval",
            "0.5",
            "--fault",
            "0:127.0.0.1:rate=150M",
            "--fault",
            "0:127.0.0.2:rate=150M",
        ],
    );
    // the text's rows, weighted alike (all but the last are an interval long)
    let rows: Vec<(f64, Vec<f64>)> = text.lines().filter_map(row_rates).collect();
    assert!(rows.len() >= 3, "timeline rows:\n{text}");
    let goodput: f64 = rows.iter().map(|r| r.0).sum();
    let links: f64 = rows.iter().map(|r| r.1.iter().sum::<f64>()).sum();
    assert!(
        rows.iter().all(|r| r.1.len() == 2),
        "two links in every row:\n{text}"
    );
    assert!(
        (links / goodput - 1.0).abs() < 0.05,
        "the links' column adds up to {links}, the goodput to {goodput}:\n{text}"
    );
    let summary = &doc["summary"];
    let bytes = summary["bytes"].as_u64().unwrap() as f64;
    let delivered: f64 = summary["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| f64_of(&l["delivered_bytes"]))
        .sum();
    assert!(
        (delivered / bytes - 1.0).abs() < 0.05,
        "links delivered {delivered} bytes, the goodput is {bytes}: {summary}"
    );
    // the premise: the policers dropped datagrams (else there was nothing to leave out)
    let lost: u64 = (summary["links"].as_array().unwrap().iter())
        .map(|l| l["packets_lost"].as_u64().unwrap_or(0))
        .sum();
    assert!(lost > 0, "no datagram lost to the policers: {summary}");
    assert!(
        text.contains("state, delivered, rtt"),
        "the column names what it shows:\n{text}"
    );
}

/// The timeline's rows: a row in which no link delivered anything (every link down) shows no
/// goodput, and the last row ends with the test. Before, a 64 KiB chunk the connection had
/// taken but the writer had not counted yet was missing from the row it was delivered in
/// and showed in a later one, also in a row of an outage (1 Mbit/s where nothing moved);
/// and the sampling could close a row after the test's end, diluted over time that was not
/// the test's.
#[test]
fn timeline_rows_hold_what_was_delivered_in_them_and_end_with_the_test() {
    let _g = heavy();
    let (_server, to) = serve(&[]);
    // every link down from a row's start (where a chunk is likely in the writer's hands)
    let (doc, _) = bench(
        &to,
        &[
            "--time",
            "1.5",
            "--interval",
            "0.25",
            "--fault",
            "0.5:127.0.0.1:down",
            "--fault",
            "0.5:127.0.0.2:down",
            "--fault",
            "1.1:127.0.0.1:up",
        ],
    );
    let mut idle = 0;
    for row in doc["intervals"].as_array().expect("rows") {
        let delivered: u64 = (row["links"].as_array().unwrap().iter())
            .map(|l| l["stream_bytes_acked"].as_u64().unwrap())
            .sum();
        if delivered == 0 {
            idle += 1;
            assert_eq!(row["bytes"], 0, "goodput where no link delivered: {row}");
        }
    }
    // the premise: rows of the outage
    assert!(idle >= 1, "no row without deliveries: {doc}");
    for run in 0..5 {
        let (doc, _) = bench(&to, &["--time", "0.3", "--interval", "0.01"]);
        let seconds = f64_of(&doc["summary"]["seconds"]);
        let last = doc["intervals"].as_array().unwrap().last().unwrap().clone();
        assert!(
            f64_of(&last["end"]) <= seconds + 0.001,
            "run {run}: the last row {last} ends after the test's {seconds} s"
        );
    }
}

/// What the header says holds: a test shorter than 0.1 s says its length, not 0.1 s or 0.0 s;
/// a sweep whose round trips per size all move less than its bytes per size does not say
/// that the large sizes take fewer round trips ("fewer above 6.40 MiB, at least 16" for 5,
/// while every size took 5).
#[test]
fn the_header_says_the_length_and_round_trips_the_test_has() {
    let _g = heavy();
    let (_server, to) = serve(&[]);
    let (_, text) = bench(&to, &["--time", "0.05"]);
    assert!(text.contains("throughput test, 0.05 s"), "{text}");
    let (doc, text) = bench(&to, &["--latency", "--sweep", "--count", "5"]);
    assert!(!text.contains("fewer above"), "{text}");
    // the premise: every size took the 5 round trips asked
    for size in doc["results"].as_array().expect("results") {
        assert_eq!(size["count"], 5, "{size}");
    }
}

/// An interrupt while the client still connects (nothing answers) says so, not that it came
/// "during the test" and "the peer was told": there was no test, and no peer.
#[test]
fn an_interrupt_while_connecting_says_so() {
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = silent.local_addr().unwrap().to_string();
    let client = start_bench(&to, &["--connect-timeout", "20"]);
    std::thread::sleep(Duration::from_millis(500));
    // the premise: the handshake is under way, unanswered
    let mut buf = [0u8; 2048];
    silent
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    silent.recv(&mut buf).expect("a handshake packet");
    client.signal(libc::SIGINT);
    let (c, co) = client.wait(Duration::from_secs(10));
    let text = stderr_of(&co);
    assert_eq!(c.code(), Some(130), "{text}");
    assert!(
        text.contains("interrupted by SIGINT while connecting"),
        "{text}"
    );
    assert!(!text.contains("the peer was told"), "{text}");
}

/// A fault injected during the test is told on the timeline's own output, as a whole line
/// between rows (it was printed on stderr by the fault thread, where it could land in the
/// middle of a row on a terminal), and no row is broken.
#[test]
fn fault_notices_are_whole_lines_of_the_timeline() {
    let _g = heavy();
    let (_server, to) = serve(&[]);
    let (s, o) = ri2n(
        [
            "bench",
            "--to",
            &to,
            "--time",
            "1.5",
            "--interval",
            "0.1",
            "--fault",
            "0.5:127.0.0.2:down",
        ],
        Duration::from_secs(30),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(s.success(), "{s}: {}", stderr_of(&o));
    let fault = out
        .lines()
        .position(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() == 5
                && w[0].parse::<f64>().is_ok()
                && w[1] == "s"
                && w[2] == "fault:"
                && w[3].starts_with("127.0.0.2:")
                && w[4] == "down"
        })
        .unwrap_or_else(|| panic!("the fault, as a line of its own, on stdout:\n{out}"));
    let rows: Vec<usize> = out
        .lines()
        .enumerate()
        .filter(|(_, l)| row_rates(l).is_some())
        .map(|(i, _)| i)
        .collect();
    assert!(
        rows.first() < Some(&fault) && rows.last() > Some(&fault),
        "between the rows:\n{out}"
    );
    for i in &rows {
        let line = out.lines().nth(*i).unwrap();
        assert_eq!(row_rates(line).unwrap().1.len(), 2, "a whole row: {line}");
    }
}

/// `-P 2`: two connections at once, each with its results, and a sum equal to the parts.
#[test]
fn parallel_connections_and_their_sum() {
    let _g = heavy();
    let (_server, to) = serve(&[]);
    let (doc, text) = bench(&to, &["--time", "1", "-P", "2"]);
    let conns = doc["connections"].as_array().expect("connections");
    assert_eq!(conns.len(), 2, "{doc}");
    assert_eq!(doc["parallel"], 2, "{doc}");
    let parts: Vec<u64> = conns
        .iter()
        .map(|c| c["summary"]["bytes"].as_u64().unwrap())
        .collect();
    assert!(
        parts.iter().all(|&b| b > 0),
        "each connection moved data: {doc}"
    );
    let sum = doc["sum"]["bytes"].as_u64().expect("sum.bytes");
    assert_eq!(sum, parts.iter().sum::<u64>(), "{doc}");
    assert_eq!(doc["summary"]["bytes"].as_u64(), Some(sum), "{doc}");
    let goodputs: f64 = conns
        .iter()
        .map(|c| f64_of(&c["summary"]["goodput_bps"]))
        .sum();
    let total = f64_of(&doc["sum"]["goodput_bps"]);
    assert!(
        (total / goodputs - 1.0).abs() < 0.05,
        "sum {total} against parts {goodputs}"
    );
    for (i, c) in conns.iter().enumerate() {
        assert_eq!(c["connection"], i + 1, "{c}");
        assert!(c["server"]["bytes"].as_u64().is_some(), "{c}");
    }
    assert!(text.contains("[SUM] summary:"), "{text}");
    assert!(text.contains("[  2] summary:"), "{text}");
}

/// `-b 50M`: the sending end paces to 50 Mbit/s, this client or (--reverse) the server, the
/// rate split over -P connections. Low rates too, where each write is a few bytes: every
/// write used to be at least 1 KiB, the first at once, and 1 kbit/s for 2 s moved 4 times
/// the target.
#[test]
fn a_target_rate_is_kept() {
    let _g = heavy();
    let (_server, to) = serve(&[]);
    for (args, target) in [
        (&["--time", "2", "-b", "50M"][..], 50e6),
        (&["--time", "2", "-b", "50M", "-R", "-P", "2"][..], 50e6),
        (&["--time", "2", "-b", "1K"][..], 1e3),
        (&["--time", "2", "-b", "1K", "-R"][..], 1e3),
        (&["--time", "2", "-b", "16K", "-P", "16"][..], 16e3),
    ] {
        let (doc, _) = bench(&to, args);
        let goodput = f64_of(&doc["sum"]["goodput_bps"]);
        assert!(
            (0.8 * target..1.2 * target).contains(&goodput),
            "{args:?}: {goodput:.0} bit/s, not {target}"
        );
        assert_eq!(f64_of(&doc["target_bps"]), target, "{doc}");
    }
}

/// The timeline's goodput counts the test's bytes alone, on both transports: at 8 kbit/s
/// each paced write is 10 bytes, and over TCP each rode in a chunk with a 5-byte header,
/// which the rows counted (12 kbit/s each, adding up to 1.5 times the summary).
#[test]
fn goodput_rows_count_the_test_s_bytes_alone() {
    let _g = heavy();
    for transport in ["udp", "tcp"] {
        let (_server, to) = serve(&["--transport", transport]);
        let args = [
            "--transport",
            transport,
            "--time",
            "2",
            "-b",
            "8k",
            "-i",
            "0.5",
        ];
        let (doc, _) = bench(&to, &args);
        let rows = doc["intervals"].as_array().expect("rows");
        let mut bytes = 0;
        for row in rows {
            let rate = f64_of(&row["goodput_bps"]);
            assert!(
                (0.8 * 8e3..1.2 * 8e3).contains(&rate),
                "{transport}: a row at {rate} bit/s: {row}"
            );
            bytes += row["bytes"].as_u64().unwrap();
        }
        let summary = doc["summary"]["bytes"].as_u64().unwrap();
        // the rows end with the test (a tail shorter than a quarter row left out)
        assert!(
            bytes <= summary && bytes + 250 >= summary,
            "{transport}: rows {bytes} bytes, summary {summary}"
        );
    }
}

/// `retransmitted_bytes` ("sent again") of a test on which nothing was lost or sent early is
/// 0, in both directions and on both transports: it was what the links sent less the test's
/// bytes, so the request (or, with --reverse, the server's grant) and the framing counted as
/// sent again, and over TCP every chunk's header. The text says what the figure counts: over
/// TCP it said "and 5 bytes of framing per chunk", which the figure leaves out.
#[test]
fn a_clean_test_sent_nothing_again() {
    let _g = heavy();
    for transport in ["udp", "tcp"] {
        let (_server, to) = serve(&["--transport", transport]);
        for extra in [&[][..], &["-R"][..]] {
            let mut args = vec!["--transport", transport, "--time", "1", "-b", "10M"];
            args.extend(extra);
            let (doc, text) = bench(&to, &args);
            let sum = &doc["summary"];
            assert!(sum["bytes"].as_u64().unwrap() > 1_000_000, "{text}");
            // the premise: nothing was lost (TCP counts no packets)
            assert!(
                sum["packets_lost"].is_null() || sum["packets_lost"] == 0,
                "{text}"
            );
            assert_eq!(
                sum["retransmitted_bytes"], 0,
                "{transport} {extra:?}: {text}"
            );
            let line = (text.lines().find(|l| l.contains("sent again")))
                .unwrap_or_else(|| panic!("{transport} {extra:?}: no \"sent again\": {text}"));
            assert!(!line.contains("framing"), "{transport} {extra:?}: {line}");
        }
    }
}

/// `--latency --count` takes up to 2^32 - 1 round trips. Room for all their times was made
/// before the first: 32 GB for 4e9, and the process aborted at once (SIGABRT, no JSON). It
/// measures instead, and a SIGINT ends it as any other test (130, the JSON failure).
#[test]
fn a_latency_test_of_a_huge_count_measures() {
    let (_server, to) = serve(&[]);
    let mut p = Proc::spawn(
        "ri2n bench --latency --count 4000000000",
        Command::new(bin())
            .args(["bench", "--to", &to, "--json", "--latency"])
            .args(["--count", "4000000000"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    p.wait_for_stderr("median", Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(1));
    let running = p.child.as_mut().unwrap().try_wait().unwrap();
    assert_eq!(running, None, "it ended: {}", p.stderr_text());
    p.signal(libc::SIGINT);
    let (s, o) = p.wait(Duration::from_secs(10));
    assert_eq!(s.code(), Some(130), "{}", stderr_of(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["exit_code"], 130, "{doc}");
}

#[test]
fn a_zero_length_test_is_a_usage_error() {
    for args in [
        ["bench", "--to", "127.0.0.1:9", "--time", "0"],
        ["bench", "--to", "127.0.0.1:9", "-P", "0"],
        ["bench", "--to", "127.0.0.1:9", "-b", "fast"],
        // under 1 bit/s would round to 0, which means no limit at all
        ["bench", "--to", "127.0.0.1:9", "-b", "0.4"],
        [
            "bench",
            "--to",
            "127.0.0.1:9",
            "--fault",
            "0:127.0.0.1:rate=0.0001K",
        ],
    ] {
        let (s, o) = ri2n(args, Duration::from_secs(10));
        assert_eq!(s.code(), Some(2), "{args:?}: {}", stderr_of(&o));
    }
    let (_, o) = ri2n(
        ["bench", "--to", "127.0.0.1:9", "-b", "0.4"],
        Duration::from_secs(10),
    );
    let err = stderr_of(&o);
    assert!(err.contains("less than 1 bit/s (0 means no limit"), "{err}");
}

/// The goodput of a row of the timeline (`  0.20-0.40   6.15 Gbit/s ...`), if `line` is one.
fn interval_row(line: &str) -> Option<f64> {
    let mut words = line.split_whitespace();
    let span = words.next()?;
    if !(span.contains('-') && span.starts_with(char::is_numeric)) {
        return None;
    }
    words.next()?.parse().ok()
}

/// SIGTERM to `ri2n serve` in the middle of a test, on either transport: the server aborts
/// every client's connection with the reason before it exits 143, so the client reports why
/// its test ended (exit 4) instead of finding the server gone.
#[test]
fn a_client_learns_that_the_server_was_interrupted() {
    let _g = heavy();
    for transport in ["udp", "tcp"] {
        let port = free_port();
        let to = format!("127.0.0.1:{port}");
        let server = Proc::spawn(
            "ri2n serve",
            Command::new(bin())
                .args(["serve", "--transport", transport, "--listen", &to])
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
        );
        if transport == "tcp" {
            wait_tcp_listening(&to, Duration::from_secs(10));
        }
        let mut client = Proc::spawn(
            "ri2n bench",
            Command::new(bin())
                .args(["bench", "--transport", transport, "--to", &to])
                .args(["--time", "30", "--interval", "0.2", "--json"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        );
        // the test under way: its second interval's row is out (a row starts where the last
        // ended, which a late timer moves: 0.21 as well as 0.20)
        client.wait_for_stderr_that("a second interval", Duration::from_secs(10), |text| {
            text.lines().filter(|l| interval_row(l).is_some()).count() >= 2
        });
        server.signal(libc::SIGTERM);
        let (s, so) = server.wait(Duration::from_secs(10));
        let (c, co) = client.wait(Duration::from_secs(10));
        let (server_err, text) = (stderr_of(&so), stderr_of(&co));
        assert_eq!(s.code(), Some(143), "{transport}: {server_err}");
        assert!(
            server_err.contains("interrupted by SIGTERM; its clients were told"),
            "{transport}: {server_err}"
        );
        // the connections it aborted itself are not reported as lost
        assert!(
            !server_err.contains("connection lost"),
            "{transport}: {server_err}"
        );
        // the premise: the test was moving data when the server was stopped
        let moved = text
            .lines()
            .any(|l| interval_row(l).is_some_and(|goodput| goodput > 0.0));
        assert!(
            moved,
            "{transport}: no data moved before the signal: {text}"
        );
        assert_eq!(c.code(), Some(4), "{transport}: {text}");
        let doc: serde_json::Value = serde_json::from_slice(&co.stdout).unwrap_or_default();
        let error = doc["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("the peer aborted the connection (code 15)")
                && error.contains("the server was interrupted by SIGTERM"),
            "{transport}: {doc} {text}"
        );
    }
}

/// `ri2n bench | head -n 3`: once the reader has gone, the test ends at the next line, as
/// ping or iperf3 would (SIGPIPE), instead of running out its time and then panicking on the
/// closed stdout (exit 101).
#[test]
fn a_reader_that_goes_away_ends_the_test() {
    let (server, to) = serve(&[]);
    let started = std::time::Instant::now();
    let script = format!(
        "{} bench --to {to} --time 30 --interval 0.1 | head -n 3; echo \"bench: ${{PIPESTATUS[0]}}\" >&2",
        bin()
    );
    let (s, o) = Proc::spawn(
        "ri2n bench | head",
        Command::new("bash")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .wait(Duration::from_secs(40));
    let (took, err) = (started.elapsed(), stderr_of(&o));
    assert!(s.success(), "{err}");
    // the premise: head read the first lines of the report
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).lines().count(),
        3,
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // 128 + SIGPIPE: ended by the signal, as the shell reports it
    assert!(err.contains("bench: 141"), "{err}");
    assert!(
        took < Duration::from_secs(20),
        "bench ran on for {took:?}: {err}"
    );
    drop(server);
}

/// A text report to a stdout that cannot take it (a full disk: `/dev/full`) ends the test
/// with exit 1 ("writing a file or stdout", --help) and says why, for the latency test and
/// the throughput test alike. The first line printed used to panic (exit 101).
#[test]
fn a_stdout_that_cannot_be_written_is_a_failure() {
    let (server, to) = serve(&[]);
    for args in [&["--latency", "--count", "10"][..], &["--time", "1"][..]] {
        let (s, o) = Proc::spawn(
            "ri2n bench > /dev/full",
            Command::new(bin())
                .args(["bench", "--to", &to])
                .args(args)
                .stdin(Stdio::null())
                .stdout(dev_full())
                .stderr(Stdio::piped()),
        )
        .wait(Duration::from_secs(30));
        let err = stderr_of(&o);
        assert_eq!(s.code(), Some(1), "{args:?}: {s}: {err}");
        assert!(err.contains("cannot write to stdout"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    drop(server);
}

/// SIGINT to `ri2n bench` in the middle of a test: it aborts its connection with the reason
/// before it exits 130, so the server reports why the test ended (it used to die by the
/// signal, and the server found its client gone). The client sends at a rate the server takes
/// in with room to spare: the CLOSE goes once on each link (PROTOCOL.md §8), and unpaced, the
/// client keeps the server's socket queues full up to the abort, so now and then both copies
/// met full queues and the server learned only that its client was gone.
#[test]
fn the_server_learns_that_the_client_was_interrupted() {
    let _g = heavy();
    let (server, to) = logged_serve();
    let mut client = start_bench(&to, &["--time", "30", "--bitrate", "2G", "--json"]);
    // in the middle of the test: its first interval's row is out
    client.wait_for_stderr("0.00-", Duration::from_secs(10));
    client.signal(libc::SIGINT);
    let (c, co) = client.wait(Duration::from_secs(10));
    let text = stderr_of(&co);
    assert_eq!(c.code(), Some(130), "{text}");
    assert!(
        text.contains("interrupted by SIGINT") && text.contains("was told"),
        "{text}"
    );
    let doc: serde_json::Value = serde_json::from_slice(&co.stdout).expect("a JSON failure");
    assert_eq!(doc["exit_code"], 130, "{doc}");
    // the server logs the client's reason (its line comes as the connection ends)
    stop_serve(server, "the client was interrupted by SIGINT");
}

/// A server out of file descriptors (its limit lowered to a few more than it holds) cannot
/// take every client of a burst: those it cannot take are refused with the reason, and it
/// keeps serving; once they are gone it takes the next. It used to exit at the first one
/// ("accepting a client: Too many open files"), ending the tests of every client.
#[test]
fn a_server_out_of_descriptors_refuses_clients_and_goes_on() {
    let _g = heavy();
    let (mut server, to) = logged_serve();
    // its descriptors are counted once its runtime holds its own: its threads are there
    server.wait_thread_named("ri2n-serve", Duration::from_secs(10));
    let pid = server.pid();
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let limit = (open + 12).to_string();
    let lowered = Command::new("prlimit")
        .args([
            "--pid",
            &pid.to_string(),
            &format!("--nofile={limit}:{limit}"),
        ])
        .status()
        .unwrap();
    assert!(lowered.success(), "prlimit");
    let burst: Vec<Proc> = (0..8)
        .map(|_| start_bench(&to, &["--time", "2", "--json"]))
        .collect();
    let ended: Vec<_> = burst
        .into_iter()
        .map(|b| b.wait(Duration::from_secs(30)))
        .collect();
    let refused = ended.iter().filter(|(s, _)| !s.success()).count();
    assert!(
        server.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "serve exited"
    );
    let (s, o) = start_bench(&to, &["--time", "1"]).wait(Duration::from_secs(30));
    assert!(s.success(), "a client after the burst: {}", stderr_of(&o));
    // the premise: the limit was reached during the burst
    stop_serve(server, "cannot take a client");
    assert!(refused > 0, "{refused} of 8 refused");
}

/// A client that connects as `ri2n bench` would and then names no test is aborted with the
/// reason after 10 s; it used to hold its task and a client slot for as long as it stayed.
#[test]
fn a_client_that_names_no_test_is_let_go() {
    let (server, to) = logged_serve();
    let client = ri2n::Endpoint::client(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    let config = ri2n::ConnectionConfig::default().with_application("ri2n bench");
    let conn = client.connect(&[to.parse().unwrap()], config).unwrap();
    let start = std::time::Instant::now();
    while conn.close_reason().is_none() && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let waited = start.elapsed();
    match conn.close_reason() {
        Some(ri2n::ConnectionError::PeerAborted { reason, .. }) => {
            assert!(reason.contains("no test request within 10 s"), "{reason}")
        }
        other => panic!("after {waited:?}: {other:?}"),
    }
    assert!(waited >= Duration::from_secs(9), "let go after {waited:?}");
    stop_serve(server, "no test request");
}

/// An endpoint that speaks to `ri2n bench` as `ri2n serve` would (the library in its place,
/// for a server that misbehaves on purpose), on a port of the system's choice (one noted
/// free and bound later may be taken meanwhile), and its address.
fn library_server() -> (ri2n::Endpoint, String) {
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut config = ri2n::EndpointConfig::new(vec![any]).server();
    config.server_connection = config
        .server_connection
        .with_application("ri2n bench")
        .with_accept_messages(true);
    let endpoint = ri2n::Endpoint::bind(config).unwrap();
    let to = endpoint.local_addrs()[0].to_string();
    (endpoint, to)
}

/// The next client of a [`library_server`] and its request, which must be for `test`.
fn accept_request(endpoint: &ri2n::Endpoint, test: &str) -> (ri2n::Connection, serde_json::Value) {
    let conn = endpoint.accept().unwrap();
    let request = conn.recv_message().unwrap().expect("a request");
    let request: serde_json::Value = serde_json::from_slice(&request).unwrap();
    assert_eq!(request["test"], test, "{request}");
    (conn, request)
}

/// A client interrupted while it waits for the server's report after a throughput test exits
/// 130 saying so. Before, it printed the test as if whole (exit 0, `server: null`). The server
/// here is the library speaking `ri2n serve`'s requests: it grants the test, reads it to the
/// end, and never reports, so the client is sure to be waiting when the signal comes.
#[test]
fn a_client_interrupted_while_awaiting_the_report_says_so() {
    let (endpoint, to) = library_server();
    let (read_all, got_all) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let (conn, request) = accept_request(&endpoint, "throughput");
        let grant = serde_json::json!({ "seconds": request["seconds"], "cut": false });
        conn.send_message(&serde_json::to_vec(&grant).unwrap())
            .unwrap();
        let mut read = 0u64;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match std::io::Read::read(&mut &conn, &mut buf) {
                Ok(0) => break,
                Ok(n) => read += n as u64,
                Err(e) => panic!("the server's read: {e}"),
            }
        }
        read_all.send(read).unwrap();
        // no report: the connection stays until the client ends it
        while conn.close_reason().is_none() {
            std::thread::sleep(Duration::from_millis(20));
        }
        conn.close_reason()
    });
    // an interval longer than the test: its one row is printed when the test closes, after
    // the wait for the acknowledgement of its end of stream, before the wait for the report
    let mut client = start_bench(&to, &["--time", "0.5", "--interval", "10", "--json"]);
    let read = got_all
        .recv_timeout(Duration::from_secs(20))
        .expect("the test's end of stream");
    assert!(read > 0, "the premise: data moved");
    client.wait_for_stderr("0.00-", Duration::from_secs(10));
    client.signal(libc::SIGINT);
    let (c, co) = client.wait(Duration::from_secs(10));
    let text = stderr_of(&co);
    assert_eq!(c.code(), Some(130), "{text}");
    assert!(text.contains("interrupted by SIGINT"), "{text}");
    let doc: serde_json::Value = serde_json::from_slice(&co.stdout).expect("a JSON failure");
    assert_eq!(doc["exit_code"], 130, "{doc}");
    match server.join().unwrap() {
        Some(ri2n::ConnectionError::PeerAborted { reason, .. }) => {
            assert!(reason.contains("interrupted by SIGINT"), "{reason}")
        }
        other => panic!("the server saw its client end with {other:?}"),
    }
}

/// A latency test whose echo never comes ends after 10 s with exit 4, and aborts its
/// connection with the reason, so the server learns why its client went. Before, a watchdog
/// thread ended the process without a word to the server, which waited for its idle limit.
/// The server here is the library speaking `ri2n serve`'s requests: it echoes the warm-up's
/// messages and a few more, then stops echoing.
#[test]
fn a_latency_test_whose_echo_stalls_tells_the_server() {
    const ECHOED: usize = 15;
    let (endpoint, to) = library_server();
    let server = std::thread::spawn(move || {
        let (conn, _) = accept_request(&endpoint, "latency");
        for _ in 0..ECHOED {
            let m = conn.recv_message().unwrap().expect("a message");
            conn.send_message(&m).unwrap();
        }
        // the next message is taken and never echoed
        let unanswered = conn.recv_message().unwrap().expect("a message");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while conn.close_reason().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        (unanswered.len(), conn.close_reason())
    });
    let started = std::time::Instant::now();
    let client = start_bench(&to, &["--latency", "--size", "100", "--json"]);
    let (c, co) = client.wait(Duration::from_secs(30));
    let text = stderr_of(&co);
    assert_eq!(c.code(), Some(4), "{text}");
    assert!(
        text.contains("no echo of a 100-byte message within 10 s"),
        "{text}"
    );
    assert!(started.elapsed() >= Duration::from_secs(10), "{text}");
    let doc: serde_json::Value = serde_json::from_slice(&co.stdout).expect("a JSON failure");
    assert_eq!(doc["exit_code"], 4, "{doc}");
    let (unanswered, end) = server.join().unwrap();
    // the premise: the stall came in the middle of the test, after echoes that worked
    assert_eq!(unanswered, 100);
    match end {
        Some(ri2n::ConnectionError::PeerAborted { reason, .. }) => {
            assert!(reason.contains("no echo"), "{reason}")
        }
        other => panic!("the server saw its client end with {other:?}"),
    }
}

/// A client of another protocol version learns that the versions differ, whatever form its
/// request has (here a test this server does not know); before, it was told "bad request".
/// And `serve --max-time 0` is a usage error: before, the server ran and cut every test to
/// 0 s, each reported as a success of 0 bit/s.
#[test]
fn serve_tells_another_version_so_and_refuses_a_max_time_of_0() {
    let (server, to) = logged_serve_with(&[]);
    let request = serde_json::json!({ "version": 3, "test": "bidir" });
    let (_client, conn) = bench_request(&to, request);
    let _ = conn.recv_message_timeout(Some(Duration::from_secs(10)));
    match conn.close_reason() {
        Some(ri2n::ConnectionError::PeerAborted { reason, .. }) => {
            assert_eq!(reason, "unsupported bench protocol version")
        }
        other => panic!("the client's connection ended with {other:?}"),
    }
    stop_serve(
        server,
        "client speaks bench protocol version 3, this server 2",
    );

    let (status, out) = ri2n(
        ["serve", "--listen", "127.0.0.1:0", "--max-time", "0"],
        Duration::from_secs(10),
    );
    assert_eq!(status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("must be more than 0 seconds"),
        "{}",
        stderr_of(&out)
    );
}

/// A throughput client that goes on writing past its grant is cut off by the server once the
/// grant, the time its links may all be down (`--all-links-down-timeout`) and 10 s more are
/// over, and told why; before, it held its task and a client slot for as long as it wrote,
/// and `--max-time` capped only the clients that kept to it.
#[test]
fn a_client_that_writes_past_its_grant_is_cut_off() {
    let (server, to) = logged_serve_with(&["--max-time", "1", "--all-links-down-timeout", "1"]);
    let request = serde_json::json!({ "version": 2, "test": "throughput", "seconds": 30.0 });
    let (_client, conn) = bench_request(&to, request);
    let grant: serde_json::Value =
        serde_json::from_slice(&conn.recv_message().unwrap().expect("a grant")).unwrap();
    assert_eq!(grant["seconds"], 1.0, "{grant}");
    let start = std::time::Instant::now();
    let chunk = vec![0u8; 16 << 10];
    let ended = loop {
        if let Err(e) = std::io::Write::write_all(&mut &conn, &chunk) {
            break e;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "still writing after 30 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = start.elapsed();
    // the grant (1 s), the links' allowance (1 s) and 10 s: 12 s (11.5 s at least: without
    // the allowance it would be 11)
    assert!(
        took > Duration::from_millis(11_500) && took < Duration::from_secs(15),
        "cut off after {took:?}"
    );
    match conn.close_reason() {
        Some(ri2n::ConnectionError::PeerAborted { reason, .. }) => {
            assert!(reason.contains("had not ended"), "{reason}: {ended}")
        }
        other => panic!("the client's connection ended with {other:?}: {ended}"),
    }
    stop_serve(server, "had not ended");
}

/// A reverse-test client that never reads what the server writes is cut off once its grant,
/// --all-links-down-timeout and 10 s are over, and told why; the server logs it. Before, the
/// server's write waited for room for ever, holding the client's task, its slot and a full
/// send buffer.
#[test]
fn a_reverse_client_that_stops_reading_is_cut_off() {
    let (server, to) = logged_serve_with(&["--all-links-down-timeout", "1"]);
    let request = serde_json::json!({ "version": 2, "test": "reverse", "seconds": 1 });
    let (_client, conn) = bench_request(&to, request);
    let started = std::time::Instant::now();
    // its grant, then nothing read: the server fills our window and its send buffer
    let grant = conn
        .recv_message_timeout(Some(Duration::from_secs(10)))
        .unwrap()
        .expect("a grant");
    assert!(String::from_utf8_lossy(&grant).contains("\"seconds\":1"));
    let deadline = started + Duration::from_secs(30);
    while conn.close_reason().is_none() {
        assert!(std::time::Instant::now() < deadline, "never cut off");
        std::thread::sleep(Duration::from_millis(100));
    }
    let waited = started.elapsed();
    let reason = conn.close_reason().unwrap().to_string();
    assert!(reason.contains("took none of the data"), "{reason}");
    // 1 s granted, 1 s for all links down, 10 s more: 12 s (11.5 s at least: without the
    // links' allowance it would be 11)
    assert!(
        waited >= Duration::from_millis(11_500),
        "cut off after {waited:?}"
    );
    assert!(
        conn.stats().recv_buffered > 0,
        "the premise: the server's data waited unread"
    );
    stop_serve(server, "took none of the data");
}

/// A `bench -P 2` refused by a server with `--max-clients-per-address 1` (exit 3) lets go of
/// the connection it made first at once: the next `bench`, started right after, is served.
/// Before, that connection was dropped unaborted as the bench exited, and held the server's
/// only slot for the address until the server found it gone (an ICMP error on loopback, its
/// request wait elsewhere): the retry was refused, "reached its connection limit".
#[test]
fn a_refused_parallel_bench_leaves_no_slot_taken() {
    let (server, to) = logged_serve_with(&["--max-clients-per-address", "1"]);
    for round in 0..3 {
        let (s, o) = start_bench(&to, &["-t", "0.3", "-P", "2"]).wait(Duration::from_secs(30));
        assert_eq!(s.code(), Some(3), "round {round}: {}", stderr_of(&o));
        // at once, as a script retrying with fewer connections would
        let (doc, _) = bench(&to, &["-t", "0.3"]);
        assert!(
            doc["summary"]["bytes"].as_u64() > Some(0),
            "round {round}: {doc}"
        );
    }
    stop_serve(server, "listening");
}

/// A client asking for a timeline interval past what a time can be moved by (1.8e19 s) gets
/// its test, and the server no panic. Before, its sampler task panicked ("overflow when
/// adding duration to instant").
#[test]
fn a_timeline_interval_past_the_clock_s_range_is_taken_as_the_test_s_length() {
    let (mut server, to) = logged_serve();
    let request = serde_json::json!({
        "version": 2, "test": "throughput", "seconds": 0.2, "interval": 1.8e19
    });
    let (_client, conn) = bench_request(&to, request);
    let grant = conn.recv_message().unwrap().expect("a grant");
    assert!(String::from_utf8_lossy(&grant).contains("seconds"));
    std::io::Write::write_all(&mut &conn, &[7u8; 4096]).unwrap();
    conn.finish().unwrap();
    let report = conn.recv_message().unwrap().expect("a report");
    assert!(String::from_utf8_lossy(&report).contains("bytes"));
    server.wait_for_stderr("throughput: received", Duration::from_secs(10));
    server.signal(libc::SIGTERM);
    let (_, so) = server.wait(Duration::from_secs(10));
    let log = stderr_of(&so);
    assert!(!log.contains("panicked"), "server log:\n{log}");
}
