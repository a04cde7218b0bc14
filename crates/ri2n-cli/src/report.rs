//! What the commands report: number formatting, per-link rates between two samples of the
//! connection's statistics, and the JSON summaries.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ri2n::{LinkState, LinkStats};
use serde::Serialize;

/// `512 B`, `1.50 KiB`, `3.20 GiB`.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// `950.3 Mbit/s`, `1.87 Gbit/s`.
pub fn fmt_rate(bits_per_second: f64) -> String {
    let b = bits_per_second;
    if b >= 1e9 {
        format!("{:.2} Gbit/s", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} Mbit/s", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kbit/s", b / 1e3)
    } else {
        format!("{b:.0} bit/s")
    }
}

/// `42s`, `3m07s`, `2h05m`.
pub fn fmt_duration_short(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}

/// A round-trip time in milliseconds with sensible precision; `-` for none.
pub fn fmt_rtt(d: Option<Duration>) -> String {
    let Some(d) = d else { return "-".into() };
    let ms = d.as_secs_f64() * 1e3;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

/// [`fmt_rtt`] of microseconds.
pub fn fmt_rtt_us(us: Option<u64>) -> String {
    fmt_rtt(us.map(Duration::from_micros))
}

fn micros(d: Option<Duration>) -> Option<u64> {
    d.map(|d| d.as_micros() as u64)
}

/// Bits per second of `bytes` over `secs`.
pub fn bps(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs
    } else {
        0.0
    }
}

pub fn state_name(s: LinkState) -> &'static str {
    match s {
        LinkState::Validating => "validating",
        LinkState::Up => "up",
        LinkState::Degraded => "degraded",
        LinkState::Down => "down",
    }
}

/// One link's activity between two samples.
#[derive(Debug, Clone, Serialize)]
pub struct LinkDelta {
    pub id: u8,
    pub state: &'static str,
    /// Datagram bytes sent in the interval (headers included).
    pub bytes_sent: u64,
    /// Datagram bytes received in the interval.
    pub bytes_received: u64,
    /// Stream bytes sent in the interval (first transmissions and repairs).
    pub stream_bytes_sent: u64,
    /// Stream bytes this link delivered (acknowledged) in the interval.
    pub stream_bytes_acked: u64,
    /// Packets declared lost in the interval (null on the TCP transport, which counts none).
    pub packets_lost: Option<u64>,
    /// Stream bits per second sent in the interval (the link's share of the payload).
    pub stream_bps: f64,
    /// Stream bits per second delivered in the interval (what arrived of `stream_bps`).
    pub delivered_bps: f64,
    /// Datagram bits per second sent in the interval.
    pub sent_bps: f64,
    /// Datagram bits per second received in the interval.
    pub recv_bps: f64,
    /// Smoothed round-trip time at the end of the interval (null while the link is down or
    /// before its first sample).
    pub srtt_us: Option<u64>,
}

/// Remembers the previous statistics of each link to turn counters into per-interval deltas.
#[derive(Debug, Default)]
pub struct LinkMeter {
    prev: HashMap<ri2n::LinkId, LinkStats>,
    prev_time: Option<Instant>,
}

impl LinkMeter {
    /// Deltas since the previous sample (since zero for the first), by link id.
    pub fn sample(&mut self, now: Instant, links: &[LinkStats]) -> Vec<LinkDelta> {
        let dt = self
            .prev_time
            .map(|t| now.duration_since(t).as_secs_f64())
            .unwrap_or(0.0);
        let out = links
            .iter()
            .map(|l| {
                let p = self.prev.get(&l.id);
                let d = |f: fn(&LinkStats) -> u64| f(l) - p.map(f).unwrap_or(0).min(f(l));
                let (sent, recv) = (d(|s| s.bytes_sent), d(|s| s.bytes_received));
                let stream = d(|s| s.stream_bytes_sent);
                let delivered = d(|s| s.stream_bytes_acked);
                LinkDelta {
                    id: l.id.0,
                    state: state_name(l.state),
                    bytes_sent: sent,
                    bytes_received: recv,
                    stream_bytes_sent: stream,
                    stream_bytes_acked: delivered,
                    packets_lost: l.counts_packets.then(|| d(|s| s.packets_lost)),
                    stream_bps: bps(stream, dt),
                    delivered_bps: bps(delivered, dt),
                    sent_bps: bps(sent, dt),
                    recv_bps: bps(recv, dt),
                    srtt_us: micros(l.current_rtt()),
                }
            })
            .collect();
        self.prev = links.iter().map(|l| (l.id, l.clone())).collect();
        self.prev_time = Some(now);
        out
    }
}

/// A link's totals, for summaries.
#[derive(Debug, Clone, Serialize)]
pub struct LinkSummary {
    pub id: u8,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub state: &'static str,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub stream_bytes_sent: u64,
    /// Stream bytes this link delivered (acknowledged by the peer).
    pub stream_bytes_acked: u64,
    /// Packet counts: null on the TCP transport, which counts no packets (the kernel's TCP
    /// packs the bytes).
    pub packets_sent: Option<u64>,
    pub packets_received: Option<u64>,
    pub packets_lost: Option<u64>,
    /// Smoothed round-trip time at the end (null if the link is down or never had a sample).
    pub srtt_us: Option<u64>,
    /// Smallest round-trip time seen (null if the link never had a sample).
    pub min_rtt_us: Option<u64>,
    /// Size of the link's full data packets at the end (UDP payload bytes: path MTU discovery;
    /// null on the TCP transport).
    pub max_datagram: Option<usize>,
    /// This link's part of all stream bytes sent (of all bytes received, on a receiver), 0 to 1.
    pub share: f64,
    /// ICMP "port unreachable" answers to this link's packets that the connection checked
    /// with its peer (forged ones change nothing while the peer answers; null on the TCP
    /// transport).
    pub refusals: Option<u32>,
    /// Whether the peer was ever heard on this link (false: it never came up).
    pub came_up: bool,
}

impl LinkSummary {
    /// Summaries of `links`; `incoming`: shares by bytes received rather than stream bytes sent.
    pub fn all(links: &[LinkStats], incoming: bool) -> Vec<Self> {
        let part = |l: &LinkStats| {
            if incoming {
                l.bytes_received
            } else {
                l.stream_bytes_sent
            }
        };
        let total: u64 = links.iter().map(part).sum();
        links
            .iter()
            .map(|l| Self {
                id: l.id.0,
                local: l.local,
                remote: l.remote,
                state: state_name(l.state),
                bytes_sent: l.bytes_sent,
                bytes_received: l.bytes_received,
                stream_bytes_sent: l.stream_bytes_sent,
                stream_bytes_acked: l.stream_bytes_acked,
                packets_sent: l.counts_packets.then_some(l.packets_sent),
                packets_received: l.counts_packets.then_some(l.packets_received),
                packets_lost: l.counts_packets.then_some(l.packets_lost),
                srtt_us: micros(l.current_rtt()),
                min_rtt_us: micros(l.measured_min_rtt()),
                max_datagram: l.counts_packets.then_some(l.max_datagram),
                share: if total > 0 {
                    part(l) as f64 / total as f64
                } else {
                    0.0
                },
                refusals: l.counts_packets.then_some(l.refusals),
                came_up: heard_on(l),
            })
            .collect()
    }
}

/// Whether the peer was ever heard on link `l`: a packet on the UDP transport, a record's
/// bytes on the TCP transport (which counts no packets).
fn heard_on(l: &LinkStats) -> bool {
    l.packets_received > 0 || l.bytes_received > 0
}

/// Warns, unless `quiet`, of each link on which nothing ever came back: the data went over
/// the others, so the command still succeeds, but the user asked for that link.
pub fn warn_links_never_up(links: &[LinkStats], quiet: bool) {
    for l in links.iter().filter(|l| !heard_on(l)) {
        if quiet {
            return;
        }
        let why = if l.refusals > 0 {
            format!(
                "its host answered \"port unreachable\" {} time(s): nothing listens at {}",
                l.refusals, l.remote
            )
        } else {
            format!("no answer from {}", l.remote)
        };
        crate::progress::clear_line();
        say!(
            "ri2n: warning: link {} ({} → {}) never came up ({why}); the others carried \
             everything",
            l.id,
            l.local,
            l.remote
        );
    }
}

/// The end-of-transfer summary of `send` and `recv`.
#[derive(Debug, Serialize)]
pub struct TransferSummary {
    pub command: &'static str,
    /// Application bytes moved.
    pub bytes: u64,
    /// From the connection's start to the last byte acknowledged (send) or read (recv).
    pub seconds: f64,
    pub goodput_bps: f64,
    /// The tool's 64-bit checksum of the bytes (equal on both sides of a good transfer);
    /// `None` with `--no-checksum`.
    pub checksum: Option<String>,
    /// The AEAD that sealed the connection's packets (`AEGIS-256X4`, `AES-256-GCM`,
    /// `ChaCha20-Poly1305`), or `none`: no key, nothing authenticated or encrypted.
    pub encryption: &'static str,
    /// Whether each link had a thread of its own that sent (`--send-threads`).
    pub send_threads: bool,
    /// Whether each link had a thread of its own that received (`--recv-threads`).
    pub recv_threads: bool,
    pub links: Vec<LinkSummary>,
    /// Every link state change during the transfer, oldest first.
    pub link_events: Vec<LinkEvent>,
    /// Datagrams (and ICMP errors) the endpoint dropped without effect, by reason
    /// (`undecodable`, `unauthenticated`, `unmatched_refusal`, ...; reasons with none left
    /// out): what strangers and attackers sent.
    pub dropped: BTreeMap<String, u64>,
    /// What held the sender back (`send` over the UDP transport; null otherwise).
    pub send_limits: Option<ri2n_tunnel::SendLimitsSeconds>,
}

/// What held a connection's sender back ([`ri2n::SendLimits`]), for summaries: a transfer
/// slower than its links with most of its time `sending` was held back by the sender's own
/// speed (its CPU); one waiting for `congestion_window` or `pacing` by the links, for
/// `peer_window` by the receiver's reading, for `send_buffer` by acknowledgements. `None` on
/// the TCP transport, whose sending the kernel does (it counts no packets, and no time).
pub fn send_limits(stats: &ri2n::ConnectionStats) -> Option<ri2n_tunnel::SendLimitsSeconds> {
    let udp = stats.links.iter().any(|l| l.counts_packets);
    udp.then(|| (&stats.send_limits).into())
}

/// The endpoint's drop counts by reason, for summaries (reasons with none left out).
pub fn dropped(counts: &ri2n::DropCounts) -> BTreeMap<String, u64> {
    counts
        .iter()
        .filter(|&(_, n)| n > 0)
        .map(|(reason, n)| (reason.name().to_owned(), n))
        .collect()
}

/// How a connection's packets were protected, for summaries.
pub fn encryption(stats: &ri2n::ConnectionStats) -> &'static str {
    match stats.cipher {
        None => "none",
        Some(cipher) => cipher.name(),
    }
}

/// A link changed state.
#[derive(Debug, Clone, Serialize)]
pub struct LinkEvent {
    /// Seconds since the transfer started.
    pub at_s: f64,
    pub link: u8,
    pub from: String,
    pub to: String,
}

/// Collects a connection's link state changes and, unless quiet, prints each on stderr as it
/// is seen (an outage must show even without a progress display).
pub struct EventLog {
    start: std::time::Instant,
    print: bool,
    pub events: Vec<LinkEvent>,
}

impl EventLog {
    pub fn new(start: std::time::Instant, print: bool) -> Self {
        Self {
            start,
            print,
            events: Vec::new(),
        }
    }

    /// Takes the connection's new events.
    pub fn collect(&mut self, conn: &ri2n::Connection) {
        for e in conn.poll_events() {
            if let ri2n::Event::LinkStateChanged { link, from, to } = e.event {
                let at_s = e.at.saturating_duration_since(self.start).as_secs_f64();
                if self.print {
                    crate::progress::clear_line();
                    say!("ri2n: {at_s:8.3} s  link {link} {from} -> {to}");
                }
                self.events.push(LinkEvent {
                    at_s,
                    link: link.0,
                    from: from.to_string(),
                    to: to.to_string(),
                });
            }
        }
    }
}

impl TransferSummary {
    /// Prints the summary: the line on stderr unless `quiet`, the JSON document on stdout
    /// with `json`.
    pub fn emit(&self, quiet: bool, json: bool) -> Result<(), crate::error::Failure> {
        use std::io::Write;
        if !quiet {
            say!("ri2n: {}", self.line());
        }
        if json {
            let mut out = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut out, self)
                .map_err(std::io::Error::from)
                .and_then(|()| writeln!(out))
                .map_err(|e| crate::error::Failure::io("cannot write to stdout", &e))?;
        }
        Ok(())
    }

    /// The human-readable one-line form.
    pub fn line(&self) -> String {
        let verb = if self.command == "send" {
            "sent"
        } else {
            "received"
        };
        let links = self
            .links
            .iter()
            .map(|l| {
                let lost = l
                    .packets_lost
                    .map_or(String::new(), |n| format!(" lost {n}"));
                format!(
                    "L{} {}→{} {} {:.0}%{lost}",
                    l.id,
                    l.local,
                    l.remote,
                    l.state,
                    l.share * 100.0,
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        let links = format!(" [{links}]");
        format!(
            "{verb} {} ({} bytes) in {:.2} s: {}, checksum {}{links}",
            fmt_bytes(self.bytes),
            self.bytes,
            self.seconds,
            fmt_rate(self.goodput_bps),
            self.checksum.as_deref().unwrap_or("off")
        )
    }
}
