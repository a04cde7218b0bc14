//! What a running tunnel tells: every peer and every link with its state, rate, round trip
//! and losses. The daemon samples its connections every second and serves the snapshot as
//! JSON on a Unix socket (`ri2n tunnel status`) and, with `--metrics`, as Prometheus text
//! over HTTP.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::report::current_rtt;

use super::Peers;

/// Directory of the daemons' status sockets.
const SOCKET_DIR: &str = "/run/ri2n";
/// How often the daemon samples its connections (the rates are over this period).
const SAMPLE_PERIOD: Duration = Duration::from_secs(1);

/// The socket of the daemon of host `name` (one per host: several daemons of one cluster
/// may share a machine's file system, as in the namespace lab).
pub fn socket_path(name: &str) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("tunnel-{name}.sock"))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub host: String,
    pub address: String,
    pub interface: String,
    pub peers: Vec<PeerStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerStatus {
    pub name: String,
    pub address: String,
    /// `connected` or `waiting`.
    pub state: String,
    /// While waiting: why (the last attempt's failure, on the connecting side).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// IP packets handed to the peer's connections, and received from them.
    pub packets_sent: u64,
    pub packets_received: u64,
    /// Dropped unsent (queue full or too old) and dropped on arrival (not read in time).
    pub packets_dropped: u64,
    pub links: Vec<LinkStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinkStatus {
    pub local: String,
    pub remote: String,
    /// `validating`, `up`, `degraded` or `down`.
    pub state: String,
    /// Smoothed round-trip time; none before the link's first measurement or while it is
    /// down (the last one is stale).
    pub rtt_us: Option<u64>,
    /// Over the last sampling period.
    pub send_mbit: f64,
    pub receive_mbit: f64,
    /// Packets declared lost over the last period, per packet sent in it (at most 1: with
    /// every link down, what was sent before the period is declared lost in it).
    pub loss: f64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub packets_lost: u64,
}

/// Counters of one link at the previous sample.
#[derive(Clone, Copy, Default)]
struct Previous {
    at: Option<Instant>,
    sent: u64,
    received: u64,
    packets_sent: u64,
    lost: u64,
}

/// Samples every peer's connection each [`SAMPLE_PERIOD`] into `latest`, forever.
pub fn sample_loop(peers: Arc<Peers>, latest: Arc<Mutex<Status>>) {
    // by peer name: the cluster file may be read again meanwhile
    let mut previous: HashMap<String, Vec<Previous>> = HashMap::new();
    loop {
        let now = Instant::now();
        let table = peers.table();
        let me = table.me();
        let mut status = Status {
            host: me.name.clone(),
            address: me.address.to_string(),
            interface: table.cluster.interface.clone(),
            peers: Vec::new(),
        };
        previous.retain(|name, _| table.peers.iter().any(|p| p.name() == name));
        for peer in &table.peers {
            let host = &peer.host;
            let mut p = PeerStatus {
                name: host.name.clone(),
                address: host.address.to_string(),
                state: "waiting".into(),
                waiting_for: None,
                packets_sent: peer.sent.load(Ordering::Relaxed),
                packets_received: peer.received.load(Ordering::Relaxed),
                packets_dropped: 0,
                links: Vec::new(),
            };
            let previous = previous.entry(host.name.clone()).or_default();
            let Some(conn) = peer.conn() else {
                previous.clear();
                p.waiting_for = Some(peer.waiting_for());
                status.peers.push(p);
                continue;
            };
            let s = conn.stats();
            log_link_changes(&host.name, &conn, &s);
            p.state = "connected".into();
            p.packets_dropped = s.datagrams_send_dropped + s.datagrams_receive_dropped;
            previous.resize(s.links.len(), Previous::default());
            for (l, prev) in s.links.iter().zip(previous.iter_mut()) {
                let secs = prev.at.map_or(0.0, |t| now.duration_since(t).as_secs_f64());
                let per_second = |now: u64, then: u64| {
                    if secs > 0.0 {
                        now.saturating_sub(then) as f64 * 8.0 / secs / 1e6
                    } else {
                        0.0
                    }
                };
                let sent = l.packets_sent.saturating_sub(prev.packets_sent);
                let lost = l.packets_lost.saturating_sub(prev.lost);
                p.links.push(LinkStatus {
                    local: l.local.ip().to_string(),
                    remote: l.remote.ip().to_string(),
                    state: l.state.to_string(),
                    rtt_us: current_rtt(l).map(|d| d.as_micros() as u64),
                    send_mbit: per_second(l.bytes_sent, prev.sent),
                    receive_mbit: per_second(l.bytes_received, prev.received),
                    loss: if lost > 0 {
                        lost as f64 / sent.max(lost) as f64
                    } else {
                        0.0
                    },
                    bytes_sent: l.bytes_sent,
                    bytes_received: l.bytes_received,
                    packets_lost: l.packets_lost,
                });
                *prev = Previous {
                    at: Some(now),
                    sent: l.bytes_sent,
                    received: l.bytes_received,
                    packets_sent: l.packets_sent,
                    lost: l.packets_lost,
                };
            }
            status.peers.push(p);
        }
        *latest.lock().unwrap_or_else(|e| e.into_inner()) = status;
        thread::sleep(SAMPLE_PERIOD);
    }
}

/// Logs the link state changes of the connection to peer `name` since the last call (the
/// operator learns of a link going down or coming back from the log, not only from the
/// status), each with its time: up to one sampling period late.
fn log_link_changes(name: &str, conn: &ri2n::Connection, stats: &ri2n::ConnectionStats) {
    for e in conn.poll_events() {
        let ri2n::Event::LinkStateChanged { link, to, .. } = e.event else {
            continue;
        };
        let Some(l) = stats.links.iter().find(|l| l.id == link) else {
            continue;
        };
        eprintln!(
            "ri2n tunnel: {name}: link {} -> {} {to} ({:.1} s ago)",
            l.local.ip(),
            l.remote.ip(),
            e.at.elapsed().as_secs_f64()
        );
    }
}

/// Serves the latest snapshot as JSON to everyone who connects to `path`.
pub fn serve_socket(path: &Path, latest: Arc<Mutex<Status>>) -> io::Result<()> {
    std::fs::create_dir_all(SOCKET_DIR)?;
    // a socket left by a daemon that was killed; a live daemon of the same host answers
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("a tunnel daemon already serves {}", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    // counters and addresses only: readable by every local user, like `ip -s link`
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let snapshot = latest.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Ok(text) = serde_json::to_string(&snapshot) {
                let _ = stream.write_all(text.as_bytes());
            }
        }
    });
    Ok(())
}

/// Serves the latest snapshot as Prometheus text on `addr` (any path).
pub fn serve_metrics(addr: SocketAddr, latest: Arc<Mutex<Status>>) -> io::Result<()> {
    let listener = TcpListener::bind(addr)?;
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            // the request line and headers are read and ignored: every path gets the metrics
            let mut reader = BufReader::new(&mut stream);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let body = prometheus(&latest.lock().unwrap_or_else(|e| e.into_inner()));
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok(())
}

/// The snapshot in the Prometheus text exposition format.
pub fn prometheus(s: &Status) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, f64)>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in rows {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    };
    let peer = |p: &PeerStatus| format!("host=\"{}\",peer=\"{}\"", esc(&s.host), esc(&p.name));
    let link = |p: &PeerStatus, l: &LinkStatus| {
        format!("{},local=\"{}\",remote=\"{}\"", peer(p), l.local, l.remote)
    };
    let links = || {
        s.peers
            .iter()
            .flat_map(|p| p.links.iter().map(move |l| (p, l)))
    };
    family(
        "ri2n_tunnel_peer_connected",
        "gauge",
        "Whether a connection to the peer is established.",
        s.peers
            .iter()
            .map(|p| (peer(p), f64::from(u8::from(p.state == "connected"))))
            .collect(),
    );
    family(
        "ri2n_tunnel_packets_sent_total",
        "counter",
        "IP packets sent to the peer.",
        s.peers
            .iter()
            .map(|p| (peer(p), p.packets_sent as f64))
            .collect(),
    );
    family(
        "ri2n_tunnel_packets_received_total",
        "counter",
        "IP packets received from the peer.",
        s.peers
            .iter()
            .map(|p| (peer(p), p.packets_received as f64))
            .collect(),
    );
    family(
        "ri2n_tunnel_packets_dropped_total",
        "counter",
        "IP packets dropped: send queue full or too old, or not written in time.",
        s.peers
            .iter()
            .map(|p| (peer(p), p.packets_dropped as f64))
            .collect(),
    );
    family(
        "ri2n_tunnel_link_up",
        "gauge",
        "Whether the link is up (carries data).",
        links()
            .map(|(p, l)| (link(p, l), f64::from(u8::from(l.state == "up"))))
            .collect(),
    );
    family(
        "ri2n_tunnel_link_rtt_seconds",
        "gauge",
        "Smoothed round-trip time of the link (absent while it validates or is down).",
        links()
            .filter_map(|(p, l)| Some((link(p, l), l.rtt_us? as f64 / 1e6)))
            .collect(),
    );
    family(
        "ri2n_tunnel_link_sent_bytes_total",
        "counter",
        "Bytes sent on the link (datagrams).",
        links()
            .map(|(p, l)| (link(p, l), l.bytes_sent as f64))
            .collect(),
    );
    family(
        "ri2n_tunnel_link_received_bytes_total",
        "counter",
        "Bytes received on the link (datagrams).",
        links()
            .map(|(p, l)| (link(p, l), l.bytes_received as f64))
            .collect(),
    );
    family(
        "ri2n_tunnel_link_lost_packets_total",
        "counter",
        "Packets the link's loss detection declared lost.",
        links()
            .map(|(p, l)| (link(p, l), l.packets_lost as f64))
            .collect(),
    );
    out
}

/// A label value with `\`, `"` and newlines escaped.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Reads the snapshot of the daemon of host `name`.
pub fn query(name: &str) -> Result<Status, String> {
    let path = socket_path(name);
    let mut stream = UnixStream::connect(&path).map_err(|e| {
        format!(
            "no tunnel daemon of host {name} answers on {} ({e}): is `ri2n tunnel` running?",
            path.display()
        )
    })?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: not a status: {e}", path.display()))
}

/// The snapshot as a table for a terminal.
pub fn table(s: &Status) -> String {
    let mut out = format!("{} {} on {}\n", s.host, s.address, s.interface);
    for p in &s.peers {
        let _ = writeln!(
            out,
            "  {} {} {}{}: packets sent {}, received {}, dropped {}",
            p.name,
            p.address,
            p.state,
            p.waiting_for
                .as_ref()
                .map_or(String::new(), |r| format!(" ({r})")),
            p.packets_sent,
            p.packets_received,
            p.packets_dropped
        );
        for l in &p.links {
            let _ = writeln!(
                out,
                "    {} -> {} {:<10} rtt {:>6} us  send {:>7.1} Mbit/s  receive {:>7.1} Mbit/s  loss {:.2} %",
                l.local,
                l.remote,
                l.state,
                l.rtt_us.map_or("-".to_owned(), |r| r.to_string()),
                l.send_mbit,
                l.receive_mbit,
                l.loss * 100.0
            );
        }
    }
    out
}
