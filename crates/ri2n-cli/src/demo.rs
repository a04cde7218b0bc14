//! `ri2n demo`: the README's first command. In one process, a server and a client endpoint
//! each bind 127.0.0.1 and 127.0.0.2 (two links over loopback, no root needed); the client
//! sends random data while a per-link view (state, rate, RTT) is printed every 0.5 s. At a
//! third of the run link 1 is cut (both of its sockets drop everything), at two thirds it is
//! restored. At the end the received bytes are checked against the sent ones and the
//! failover and recovery times, taken from the connection's link events, are shown. Exit 0
//! only if the data arrived intact and the link went down and came back.

use std::cell::Cell;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ri2n::{ConnectionConfig, Endpoint, Event, LinkState};

use crate::checksum::{Checksum, RandomBytes};
use crate::error::{self, Failure};
use crate::net;
use crate::progress::stderr_is_terminal;
use crate::report::{bps, fmt_bytes, fmt_rate, fmt_rtt, state_name, LinkMeter};
use crate::DemoArgs;

const CHUNK: usize = 64 * 1024;
const VIEW_PERIOD: Duration = Duration::from_millis(500);

/// Prints to stderr, with colours when it is a terminal.
struct Screen {
    color: bool,
    start: Instant,
    /// The first line that could not be written: the demo shows nothing, and fails (exit 1)
    /// once it is over.
    unwritten: Cell<Option<std::io::Error>>,
}

impl Screen {
    fn say(&self, s: impl AsRef<str>) {
        if let Err(e) = writeln!(std::io::stderr(), "{}", s.as_ref()) {
            let first = self.unwritten.take().unwrap_or(e);
            self.unwritten.set(Some(first));
        }
    }

    /// A timestamped line.
    fn at(&self, s: impl AsRef<str>) {
        self.at_time(Instant::now(), s);
    }

    /// A line stamped with when `t` happened: an event is printed a moment after it came
    /// (the writer was busy), and its line says when it came.
    fn at_time(&self, t: Instant, s: impl AsRef<str>) {
        self.say(format!(
            "  {:>6.2} s  {}",
            t.saturating_duration_since(self.start).as_secs_f64(),
            s.as_ref()
        ));
    }

    fn paint(&self, text: &str, code: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    /// A link state padded to a column, coloured by health.
    fn state(&self, s: &str) -> String {
        let padded = format!("{s:<10}");
        match s {
            "up" => self.paint(&padded, "32"),
            "down" => self.paint(&padded, "1;31"),
            _ => self.paint(&padded, "33"),
        }
    }
}

/// The cut link, when it was cut and restored, and what the connection reported about it.
#[derive(Default)]
struct Watch {
    link1: Option<ri2n::LinkId>,
    cut: Option<Instant>,
    restored: Option<Instant>,
    /// Time from the cut to the link's first state change away from up, and that state.
    failover: Option<(Duration, LinkState)>,
    /// Time from the cut to the link being declared down.
    down_at: Option<Duration>,
    /// Time from the restore to the link being up again.
    recovery: Option<Duration>,
}

impl Watch {
    /// Prints the connection's link state changes and times those of the cut link.
    fn poll(&mut self, conn: &ri2n::Connection, screen: &Screen) {
        for e in conn.poll_events() {
            let Event::LinkStateChanged { link, from, to } = e.event else {
                continue;
            };
            let now = e.at;
            let mut note = String::new();
            if Some(link) == self.link1 {
                if let (Some(c), None) = (self.cut, self.restored) {
                    if from == LinkState::Up && self.failover.is_none() {
                        self.failover = Some((now - c, to));
                        note = format!(
                            "   <- {:.0} ms after the cut",
                            (now - c).as_secs_f64() * 1e3
                        );
                    }
                    if to == LinkState::Down && self.down_at.is_none() {
                        self.down_at = Some(now - c);
                    }
                }
                if let Some(r) = self.restored {
                    if to == LinkState::Up && self.recovery.is_none() {
                        self.recovery = Some(now - r);
                        note = format!(
                            "   <- {:.0} ms after the restore",
                            (now - r).as_secs_f64() * 1e3
                        );
                    }
                }
            }
            screen.at_time(
                now,
                format!(
                    "link {link}: {} -> {}{note}",
                    state_name(from),
                    state_name(to)
                ),
            );
        }
    }
}

/// What the receiving side saw.
struct Received {
    bytes: u64,
    checksum: String,
}

pub fn run(args: &DemoArgs) -> Result<(), Failure> {
    // both ends are in this process: an interrupt has no peer to tell, only its exit status
    // and message to give, as every command's (it died of the signal, saying nothing)
    crate::interrupt::install();
    let rate = writer_rate(args);
    let screen = Screen {
        color: stderr_is_terminal(),
        start: Instant::now(),
        unwritten: Cell::new(None),
    };
    let loopback: Vec<SocketAddr> = vec![
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.2:0".parse().unwrap(),
    ];
    let hint = |f: Failure| {
        Failure::new(
            f.code,
            format!(
                "{} (the demo needs 127.0.0.1 and 127.0.0.2, which Linux routes to loopback)",
                f.message
            ),
        )
    };
    let server = net::server_endpoint(
        &loopback,
        &crate::ChannelOpts::with_key(None),
        None,
        net::Application::File,
    )
    .map_err(hint)?;
    let client =
        Endpoint::client(&loopback).map_err(|e| hint(Failure::endpoint(e, &[], Duration::ZERO)))?;
    let (saddr, caddr) = (server.local_addrs(), client.local_addrs());

    let total = args.seconds;
    let (cut_at, restore_at) = (total / 3, total * 2 / 3);
    // whatever happens, the demo ends: a stuck transfer is a failure, not a hang
    let limit = total + Duration::from_secs(15);
    let _ = thread::Builder::new()
        .name("demo-deadline".into())
        .spawn(move || {
            thread::sleep(limit);
            crate::progress::clear_line();
            say!(
                "ri2n: error: the demo did not finish within {} s",
                limit.as_secs()
            );
            std::process::exit(error::GENERIC.into());
        });
    screen.say(format!(
        "ri2n demo: one connection over two links on loopback, in this process\n  \
         server {}  client {}\n  \
         link 0: {} <-> {}   link 1: {} <-> {}\n  \
         sending random data for {:.0} s{}{}; link 1 is cut at {:.1} s and restored at {:.1} s",
        error::list(&saddr),
        error::list(&caddr),
        caddr[0],
        saddr[0],
        caddr[1],
        saddr[1],
        total.as_secs_f64(),
        if rate > 0.0 {
            format!(" at up to {}", fmt_rate(rate * 1e6))
        } else {
            String::new()
        },
        if args.link_rate > 0.0 {
            format!(
                " over links capped at {} each",
                fmt_rate(args.link_rate * 1e6)
            )
        } else {
            String::new()
        },
        cut_at.as_secs_f64(),
        restore_at.as_secs_f64(),
    ));

    // the receiving side: read everything, count and checksum it
    let received = Arc::new(AtomicU64::new(0));
    let receiver = {
        let server = server.clone();
        let received = received.clone();
        thread::Builder::new()
            .name("demo-receiver".into())
            .spawn(move || -> Result<Received, Failure> {
                let mut conn = server
                    .accept()
                    .map_err(|e| Failure::endpoint(e, &[], Duration::ZERO))?;
                conn.finish().map_err(|e| Failure::lost(&e))?;
                let mut sum = Checksum::default();
                let mut buf = vec![0u8; 256 * 1024];
                let mut bytes = 0u64;
                loop {
                    let n = conn.read(&mut buf).map_err(|e| Failure::lost(&e))?;
                    if n == 0 {
                        break;
                    }
                    sum.update(&buf[..n]);
                    bytes += n as u64;
                    received.store(bytes, Ordering::Relaxed);
                }
                net::linger(&conn, Duration::from_secs(2));
                Ok(Received {
                    bytes,
                    checksum: sum.hex(),
                })
            })
            .map_err(|e| Failure::io("cannot start a thread", &e))?
    };

    let mut conn = client
        .connect(
            &saddr[..1],
            net::Application::File.configure(ConnectionConfig::default()),
        )
        .map_err(|e| Failure::endpoint(e, &saddr[..1], Duration::from_secs(10)))?;
    let start = Instant::now();
    let screen = Screen { start, ..screen };
    if args.link_rate > 0.0 {
        for a in &caddr {
            client
                .impairment(*a)
                .expect("client socket")
                .set_rate(Some((args.link_rate * 1e6) as u64));
        }
    }
    let cut_switches = [
        client.impairment(caddr[1]).expect("client socket"),
        server.impairment(saddr[1]).expect("server socket"),
    ];

    let mut rng = RandomBytes::new(start.elapsed().as_nanos() as u64 ^ 0xD3E0);
    let mut chunk = vec![0u8; CHUNK];
    let mut sum = Checksum::default();
    let mut sent = 0u64;
    let mut meter = LinkMeter::default();
    meter.sample(start, &[]);
    let mut next_view = start + VIEW_PERIOD;
    let mut last_view = (start, 0u64);
    let mut w = Watch::default();
    let mut link1_bytes_at_recovery: Option<u64> = None;
    let rate_bytes_per_s = rate * 1e6 / 8.0;

    while start.elapsed() < total {
        let now = Instant::now();
        // the writer's rate cap
        if rate_bytes_per_s > 0.0 {
            let allowed = rate_bytes_per_s * now.duration_since(start).as_secs_f64();
            if sent as f64 > allowed {
                thread::sleep(Duration::from_micros(500));
            } else {
                rng.fill(&mut chunk);
                conn.write_all(&chunk).map_err(|e| Failure::lost(&e))?;
                sum.update(&chunk);
                sent += CHUNK as u64;
            }
        } else {
            rng.fill(&mut chunk);
            conn.write_all(&chunk).map_err(|e| Failure::lost(&e))?;
            sum.update(&chunk);
            sent += CHUNK as u64;
        }
        w.poll(&conn, &screen);
        let elapsed = start.elapsed();
        if w.cut.is_none() && elapsed >= cut_at {
            let stats = conn.stats();
            w.link1 = stats
                .links
                .iter()
                .find(|l| l.local == caddr[1])
                .map(|l| l.id);
            for s in &cut_switches {
                s.set_down(true);
            }
            w.cut = Some(Instant::now());
            screen.at(screen.paint(
                &format!(
                    ">>> cutting link {} ({} <-> {}): both sockets now drop every datagram",
                    w.link1.map_or("1".into(), |l| l.to_string()),
                    caddr[1],
                    saddr[1]
                ),
                "1",
            ));
        }
        if w.cut.is_some() && w.restored.is_none() && elapsed >= restore_at {
            for s in &cut_switches {
                s.set_down(false);
            }
            w.restored = Some(Instant::now());
            screen.at(screen.paint(">>> restoring link 1", "1"));
        }
        if w.recovery.is_some() && link1_bytes_at_recovery.is_none() {
            link1_bytes_at_recovery = conn
                .stats()
                .links
                .iter()
                .find(|l| Some(l.id) == w.link1)
                .map(|l| l.stream_bytes_acked);
        }
        if Instant::now() >= next_view {
            let now = Instant::now();
            let stats = conn.stats();
            let deltas = meter.sample(now, &stats.links);
            let got = received.load(Ordering::Relaxed);
            let dt = now.duration_since(last_view.0).as_secs_f64();
            let got_rate = bps(got - last_view.1.min(got), dt);
            let mut line = format!("received {:>12}  |", fmt_rate(got_rate));
            for (d, l) in deltas.iter().zip(&stats.links) {
                line += &format!(
                    " link {} {} {:>13} rtt {:>8} |",
                    d.id,
                    screen.state(d.state),
                    fmt_rate(d.delivered_bps),
                    fmt_rtt((l.state == LinkState::Up).then_some(l.srtt))
                );
            }
            if rate > 0.0 && got_rate > rate * 1e6 * 1.03 {
                // the writer kept writing during the outage; what one link could not carry
                // then waited in the send buffer
                line += " catching up";
            }
            screen.at(line);
            last_view = (now, got);
            while next_view <= now {
                next_view += VIEW_PERIOD;
            }
        }
    }

    conn.finish().map_err(|e| Failure::lost(&e))?;
    // what the send buffer holds drains at the links' rate: 5 s more than that
    let drain = match args.link_rate > 0.0 {
        true => conn.stats().send_buffered as f64 * 8.0 / (2.0 * args.link_rate * 1e6),
        false => 0.0,
    };
    let patience = Duration::from_secs(5) + Duration::from_secs_f64(drain);
    let deadline = Instant::now() + patience;
    loop {
        match conn.wait_acknowledged(Some(Duration::from_millis(20))) {
            Ok(()) => break,
            Err(e) => {
                if let Some(r) = conn.close_reason() {
                    return Err(Failure::lost_because(&r));
                }
                if e.kind() != std::io::ErrorKind::TimedOut || Instant::now() >= deadline {
                    return Err(Failure::new(
                        error::GENERIC,
                        format!(
                            "the receiver did not acknowledge everything within {:.0} s of the end",
                            patience.as_secs_f64()
                        ),
                    ));
                }
            }
        }
        w.poll(&conn, &screen);
    }
    let seconds = start.elapsed().as_secs_f64();
    w.poll(&conn, &screen);
    let stats = conn.stats();
    let rx = receiver
        .join()
        .map_err(|_| Failure::new(error::GENERIC, "the receiving thread panicked"))??;
    net::linger(&conn, Duration::from_secs(1));

    let link1_after = match (w.link1, link1_bytes_at_recovery) {
        (Some(id), Some(at)) => stats
            .links
            .iter()
            .find(|l| l.id == id)
            .map(|l| l.stream_bytes_acked.saturating_sub(at)),
        _ => None,
    };
    let sent_sum = sum.hex();
    screen.say("summary:");
    screen.say(format!(
        "  sent     {} ({sent} bytes), checksum {sent_sum}\n  \
         received {} ({} bytes), checksum {}\n  \
         mean goodput {} over {seconds:.2} s",
        fmt_bytes(sent),
        fmt_bytes(rx.bytes),
        rx.bytes,
        rx.checksum,
        fmt_rate(bps(rx.bytes, seconds)),
    ));
    for l in &stats.links {
        screen.say(format!(
            "  link {} {} -> {}: delivered {} of stream data ({} sent), {} packets declared lost",
            l.id,
            l.local,
            l.remote,
            fmt_bytes(l.stream_bytes_acked),
            fmt_bytes(l.stream_bytes_sent),
            l.packets_lost
        ));
    }
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
    match w.failover {
        Some((d, to)) => screen.say(format!(
            "  failover: link 1 left service {} after the cut (up -> {}){}",
            ms(d),
            state_name(to),
            w.down_at
                .filter(|_| to != LinkState::Down)
                .map(|d| format!(", declared down after {}", ms(d)))
                .unwrap_or_default()
        )),
        None => screen.say("  failover: link 1 was never seen leaving service"),
    }
    match w.recovery {
        Some(d) => screen.say(format!(
            "  recovery: link 1 back up {} after the restore{}",
            ms(d),
            link1_after
                .map(|b| format!(", then delivered {}", fmt_bytes(b)))
                .unwrap_or_default()
        )),
        None => screen.say("  recovery: link 1 was not seen coming back"),
    }

    let intact = rx.bytes == sent && rx.checksum == sent_sum;
    let came_back = w.failover.is_some() && w.recovery.is_some();
    if intact && came_back {
        screen.say(screen.paint(
            "OK: every byte arrived intact; the link failed over and came back without a restart",
            "1;32",
        ));
        match screen.unwritten.take() {
            Some(e) => Err(Failure::io("cannot write to the terminal (stderr)", &e)),
            None => Ok(()),
        }
    } else if !intact {
        Err(Failure::new(
            error::GENERIC,
            format!(
                "received data differs from the sent data ({} of {sent} bytes, checksum {} vs {sent_sum})",
                rx.bytes, rx.checksum
            ),
        ))
    } else {
        Err(Failure::new(
            error::GENERIC,
            "the cut link was not seen going down and coming back",
        ))
    }
}

/// The writer's rate cap, Mbit/s (0: none): `--rate`, and with capped links at most 80 % of
/// the two together, as the defaults are (400 of 2 × 250). A writer faster than its links
/// only fills the send buffer, which then drains long after the end, and drives them into
/// their caps' losses.
fn writer_rate(args: &DemoArgs) -> f64 {
    let links = 1.6 * args.link_rate;
    match (args.rate > 0.0, args.link_rate > 0.0) {
        (true, true) => args.rate.min(links),
        (false, true) => links,
        _ => args.rate,
    }
}
