//! What a running tunnel tells: every peer and every link with its state, rate, round trip
//! and losses. The daemon samples its connections every second and serves the snapshot as
//! JSON on a Unix socket (`ri2n tunnel status`) and, with `--metrics`, as Prometheus metrics
//! over HTTP (`prometheus-client` writes them, [`crate::metrics`] serves them).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use prometheus_client::encoding::{text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicU64;

use crate::clients::{write_by, Places};
use crate::peers::{link_key, LinkCounts, LinkKey, LinkTotals, Peers, Reload};

/// How long a status or metrics listener waits after a failed accept: a client gone before
/// it was taken, a signal, or no descriptor or memory left for a moment never ends the
/// service, and the pause keeps a lasting shortage from spinning (the clients waiting stay
/// queued meanwhile).
pub(crate) const FAILED_ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// Directory of the daemons' status sockets.
const SOCKET_DIR: &str = "/run/ri2n";
/// How often the daemon samples its connections (the rates are over this period).
const SAMPLE_PERIOD: Duration = Duration::from_secs(1);

/// The socket of the daemon of host `name` (one per host: several daemons of one cluster
/// may share a machine's file system, as in the namespace lab).
pub fn socket_path(name: &str) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("tunnel-{name}.sock"))
}

/// Whether a daemon answers on the status socket at `path` (a socket file that nothing
/// answers is one a killed daemon left).
pub fn answers(path: &Path) -> bool {
    UnixStream::connect(path).is_ok()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub host: String,
    pub address: String,
    pub interface: String,
    /// This host's link addresses (`IP:port`) the daemon has not bound: missing at its start
    /// (not addresses of this machine, or their port held by another socket), it runs
    /// without them and looks for them every second. While all are missing no link is up,
    /// and the peers wait for this host.
    #[serde(default)]
    pub links_missing: Vec<String>,
    /// Packets read from each of the interface's queues (how the flows spread over them).
    #[serde(default)]
    pub queue_packets_read: Vec<u64>,
    /// IPv4 packets read from the interface for an address no host of the cluster owns:
    /// not carried, and their senders told the host is unreachable.
    #[serde(default)]
    pub packets_unrouted: u64,
    /// Packets read from the interface that are not IPv4 (IPv6, or no valid IP packet):
    /// not carried, since the tunnel carries IPv4 only.
    #[serde(default)]
    pub packets_not_ipv4: u64,
    /// IPv4 TCP packets read from the interface whose IP header or TCP checksum was wrong,
    /// where the kernel had not left it to the device (a raw socket's packet): not carried,
    /// as the peer's kernel would not have taken them.
    #[serde(default)]
    pub packets_bad_checksum: u64,
    /// The cluster file the daemon reads (as given to it).
    #[serde(default)]
    pub config: String,
    /// Times the cluster file was read again since the start (SIGHUP, `ri2n tunnel reload`),
    /// taken up or refused, before this sample began: its peers are those of the file then
    /// in use (a reading starts a new sample at once).
    #[serde(default)]
    pub reloads: u64,
    /// What the last of them did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reload: Option<Reload>,
    /// How long before it was served the daemon began this sample (a new one every second):
    /// a script that needs readings from after some moment waits until a sample is younger.
    /// Absent before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_ms_ago: Option<u64>,
    /// When the sample began, for `sampled_ms_ago`.
    #[serde(skip)]
    pub sampled_at: Option<Instant>,
    pub peers: Vec<PeerStatus>,
}

impl Status {
    /// Sets `sampled_ms_ago` for serving now, from `sampled_at` (kept as it is without one).
    pub fn stamp_age(&mut self) {
        if let Some(t) = self.sampled_at {
            self.sampled_ms_ago = Some(t.elapsed().as_millis() as u64);
        }
    }
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
    /// While connected: the AEAD that seals the connection's packets (`AEGIS-256X4`,
    /// `AES-256-GCM`, `ChaCha20-Poly1305`), or `none` in a cluster without a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<String>,
    /// IP packets handed to the peer's connections, and received from them and written to
    /// the interface.
    pub packets_sent: u64,
    pub packets_received: u64,
    /// Dropped unsent (no connection up, queue full or too old) and dropped on arrival (not
    /// read in time, a piece of a large segment lost, not from the peer's own tunnel address
    /// or not to this host's, a large segment this host does not take, or refused by the
    /// interface), over every connection to the peer: their sum, then each.
    pub packets_dropped: u64,
    #[serde(default)]
    pub packets_dropped_sending: u64,
    #[serde(default)]
    pub packets_dropped_receiving: u64,
    /// While connected: IP packets (datagrams) queued in the connection and not sent yet,
    /// and their bytes (of one partly sent, what is left): what a packet read from the
    /// interface now waits behind in this daemon, besides the links' windows.
    #[serde(default)]
    pub queued_packets: usize,
    #[serde(default)]
    pub queued_bytes: u64,
    /// While connected: of the seconds the connection to the peer was busy sending, those
    /// it sent at its own pace and those it waited, and for what (since it was made; see
    /// [`ri2n::SendLimits`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_limits: Option<SendLimitsSeconds>,
    pub links: Vec<LinkStatus>,
}

/// [`ri2n::SendLimits`] in seconds, as `tunnel status --json` prints them per peer (and
/// `ri2n send --json` for its connection).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendLimitsSeconds {
    pub sending: f64,
    pub congestion_window: f64,
    pub pacing: f64,
    pub peer_window: f64,
    pub send_buffer: f64,
    pub no_link: f64,
}

impl From<&ri2n::SendLimits> for SendLimitsSeconds {
    fn from(l: &ri2n::SendLimits) -> Self {
        Self {
            sending: l.sending.as_secs_f64(),
            congestion_window: l.congestion_window.as_secs_f64(),
            pacing: l.pacing.as_secs_f64(),
            peer_window: l.peer_window.as_secs_f64(),
            send_buffer: l.send_buffer.as_secs_f64(),
            no_link: l.no_link.as_secs_f64(),
        }
    }
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
    /// Over the last sampling period; null in a connection's first sample, which has no
    /// period behind it yet.
    pub send_mbit: Option<f64>,
    pub receive_mbit: Option<f64>,
    /// Packets declared lost over the last period, per packet sent in it (at most 1: with
    /// every link down, what was sent before the period is declared lost in it); null in a
    /// connection's first sample, and for a link not up that declared nothing lost in the
    /// period (it sends only probes, which loss detection does not count).
    pub loss: Option<f64>,
    /// Totals since the daemon started: the connection's, and what the peer's connections
    /// before it moved between the same two addresses.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub packets_lost: u64,
    /// The link's congestion window, and its bytes in flight (sent, neither acknowledged
    /// nor declared lost), at the sample.
    #[serde(default)]
    pub window_bytes: u64,
    #[serde(default)]
    pub in_flight_bytes: u64,
}

/// Counters of one link at the start of the period its next rates are taken over, and the
/// rates and loss of the period before.
#[derive(Clone, Copy)]
struct Previous {
    at: Instant,
    sent: u64,
    received: u64,
    packets_sent: u64,
    lost: u64,
    shown: Rates,
}

/// A link's rates and loss over one period.
#[derive(Clone, Copy, Default)]
struct Rates {
    send_mbit: Option<f64>,
    receive_mbit: Option<f64>,
    loss: Option<f64>,
}

/// Shortest period a link's rates and loss are taken over: half the sampling period. A
/// sample taken sooner (a reload wakes the sampler at once) shows those of the period before
/// and lets the period run on: over a few milliseconds a burst would read as a rate many
/// times the link's, and one packet declared lost as 100 % loss, shown for a whole period.
const SHORTEST_RATE_PERIOD: Duration = Duration::from_millis(500);

/// Which connection a sample is of. It holds the connection's allocation (a `Weak`), not the
/// connection: a connection made after the last one ended cannot get its address while the
/// status remembers the old one, and be taken for it (its counters compared with the old).
struct Identity<T = ri2n::Connection>(std::sync::Weak<T>);

impl<T> Identity<T> {
    fn of(conn: &Arc<T>) -> Self {
        Self(Arc::downgrade(conn))
    }
}

impl<T> Default for Identity<T> {
    fn default() -> Self {
        Self(std::sync::Weak::new())
    }
}

impl<T> PartialEq for Identity<T> {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Weak::ptr_eq(&self.0, &other.0)
    }
}

/// A peer's connection at the previous sample and each of its links' counters then: a
/// connection that replaced it starts its counters from zero.
#[derive(Default)]
struct PreviousConnection<K = Identity> {
    conn: K,
    links: Vec<Option<Previous>>,
}

impl<K: PartialEq> PreviousConnection<K> {
    /// The status of connection `conn`'s `links` at `now`, with rates and loss over the period
    /// since the previous sample of the same connection that began one (none in its first; a
    /// sample sooner than [`SHORTEST_RATE_PERIOD`] shows the period's before), and counts
    /// that take in what the peer's `ended` connections moved between the same addresses.
    fn sample(
        &mut self,
        conn: K,
        links: &[ri2n::LinkStats],
        ended: &LinkTotals,
        now: Instant,
    ) -> Vec<LinkStatus> {
        if self.conn != conn {
            *self = PreviousConnection {
                conn,
                links: Vec::new(),
            };
        }
        self.links.resize(links.len(), None);
        let mut out = Vec::with_capacity(links.len());
        // the ended connections' counts go to one link of their addresses only
        let mut credited: Vec<LinkKey> = Vec::new();
        for (l, prev) in links.iter().zip(self.links.iter_mut()) {
            let key = link_key(l);
            let mut total = LinkCounts::default();
            if !credited.contains(&key) {
                credited.push(key);
                total = ended.get(&key).copied().unwrap_or_default();
            }
            total.add(&LinkCounts::of(l));
            let rates = match *prev {
                Some(p) if now.saturating_duration_since(p.at) < SHORTEST_RATE_PERIOD => p.shown,
                Some(p) => {
                    let rates = Rates::over(&p, l, now);
                    *prev = Some(Previous::of(l, now, rates));
                    rates
                }
                None => {
                    *prev = Some(Previous::of(l, now, Rates::default()));
                    Rates::default()
                }
            };
            out.push(LinkStatus {
                local: l.local.ip().to_string(),
                remote: l.remote.ip().to_string(),
                state: l.state.to_string(),
                rtt_us: l.current_rtt().map(|d| d.as_micros() as u64),
                send_mbit: rates.send_mbit,
                receive_mbit: rates.receive_mbit,
                loss: rates.loss,
                bytes_sent: total.bytes_sent,
                bytes_received: total.bytes_received,
                packets_lost: total.packets_lost,
                window_bytes: l.cwnd,
                in_flight_bytes: l.bytes_in_flight,
            });
        }
        out
    }
}

impl Previous {
    fn of(l: &ri2n::LinkStats, at: Instant, shown: Rates) -> Self {
        Self {
            at,
            sent: l.bytes_sent,
            received: l.bytes_received,
            packets_sent: l.packets_sent,
            lost: l.packets_lost,
            shown,
        }
    }
}

impl Rates {
    /// Link `l`'s rates and loss from `p` to `now`.
    fn over(p: &Previous, l: &ri2n::LinkStats, now: Instant) -> Self {
        let secs = now.duration_since(p.at).as_secs_f64();
        let per_second =
            |count: u64, then: u64| count.saturating_sub(then) as f64 * 8.0 / secs / 1e6;
        let sent = l.packets_sent.saturating_sub(p.packets_sent);
        let lost = l.packets_lost.saturating_sub(p.lost);
        let loss = if lost > 0 {
            Some(lost as f64 / sent.max(lost) as f64)
        } else if l.state == ri2n::LinkState::Up {
            Some(0.0)
        } else {
            // it sends only probes, whose fate loss detection does not count: an unanswered
            // one would read as no loss
            None
        };
        Self {
            send_mbit: Some(per_second(l.bytes_sent, p.sent)),
            receive_mbit: Some(per_second(l.bytes_received, p.received)),
            loss,
        }
    }
}

/// Samples every peer's connection each [`SAMPLE_PERIOD`], and at once after each reading of
/// the cluster file, into `latest`, forever.
pub fn sample_loop(peers: Arc<Peers>, latest: Arc<Mutex<Status>>, config: String) {
    // by peer name: the cluster file may be read again meanwhile
    let mut previous: HashMap<String, PreviousConnection> = HashMap::new();
    loop {
        let now = Instant::now();
        // before the table: a reading counted here has put its table in use already, so
        // that a caller who sees the count (`ri2n tunnel reload`, then `status`) sees its peers
        let (reloads, last_reload) = peers.reloads();
        let table = peers.table();
        let me = table.me();
        let mut status = Status {
            host: me.name.clone(),
            address: me.address.to_string(),
            interface: table.cluster.interface.clone(),
            links_missing: (peers.endpoint.missing().iter())
                .map(ToString::to_string)
                .collect(),
            queue_packets_read: (peers.queue_reads.iter())
                .map(|n| n.load(Ordering::Relaxed))
                .collect(),
            packets_unrouted: peers.unrouted.load(Ordering::Relaxed),
            packets_not_ipv4: peers.not_ipv4.load(Ordering::Relaxed),
            packets_bad_checksum: peers.bad_checksum.load(Ordering::Relaxed),
            config: config.clone(),
            reloads,
            last_reload,
            sampled_ms_ago: None,
            sampled_at: Some(now),
            peers: Vec::new(),
        };
        previous.retain(|name, _| table.peers.iter().any(|p| p.name() == name));
        for peer in &table.peers {
            let host = &peer.host;
            let sample = peer.sample();
            let mut p = PeerStatus {
                name: host.name.clone(),
                address: host.address.to_string(),
                state: "waiting".into(),
                waiting_for: None,
                encryption: None,
                packets_sent: sample.sent,
                packets_received: sample.received,
                packets_dropped: sample.dropped.total(),
                packets_dropped_sending: sample.dropped.sending,
                packets_dropped_receiving: sample.dropped.receiving,
                queued_packets: 0,
                queued_bytes: 0,
                send_limits: None,
                links: Vec::new(),
            };
            let previous = previous.entry(host.name.clone()).or_default();
            let Some((conn, s)) = sample.current else {
                *previous = PreviousConnection::default();
                p.waiting_for = Some(peer.waiting_for());
                status.peers.push(p);
                continue;
            };
            log_link_changes(&host.name, &conn, &s);
            p.state = "connected".into();
            p.encryption = Some(s.cipher.map_or("none", |c| c.name()).into());
            (p.queued_packets, p.queued_bytes) = s.datagrams_queued;
            p.send_limits = Some((&s.send_limits).into());
            p.links = previous.sample(Identity::of(&conn), &s.links, &sample.ended_links, now);
            status.peers.push(p);
        }
        *latest.lock().unwrap_or_else(|e| e.into_inner()) = status;
        peers.wait_reload(reloads, SAMPLE_PERIOD);
    }
}

/// Logs the link state changes of the connection to peer `name` since the last call (the
/// operator learns of a link going down or coming back from the log, not only from the
/// status), each with its time: up to one sampling period late.
fn log_link_changes(name: &str, conn: &ri2n::Connection, stats: &ri2n::ConnectionStats) {
    let changes: Vec<_> = (conn.poll_events().into_iter())
        .filter_map(|e| match e.event {
            ri2n::Event::LinkStateChanged { link, to, .. } => Some((link, to, e.at)),
            _ => None,
        })
        .collect();
    // a link added since `stats` was taken is named by the statistics of now
    let newer;
    let known = |s: &ri2n::ConnectionStats, link| s.links.iter().any(|l| l.id == link);
    let stats = if changes.iter().all(|&(link, ..)| known(stats, link)) {
        stats
    } else {
        newer = conn.stats();
        &newer
    };
    for (link, to, at) in changes {
        let Some(l) = stats.links.iter().find(|l| l.id == link) else {
            continue;
        };
        eprintln!(
            "ri2n tunnel: {name}: link {} -> {} {to} ({:.1} s ago)",
            l.local.ip(),
            l.remote.ip(),
            at.elapsed().as_secs_f64()
        );
    }
}

/// Longest a caller of the status socket may take to read the whole snapshot.
const STATUS_DEADLINE: Duration = Duration::from_secs(2);
/// Callers of the status socket served at once, of the daemon's own user and of the others
/// each (one more is closed at once; `query` asks again).
const STATUS_CLIENTS: usize = 8;

/// Serves the latest snapshot as JSON to everyone who connects to `path` (`ri2n tunnel
/// reload` waits for one that counts its reading of the cluster file). The socket is open
/// to every local user: each caller is served on a thread of its own, within
/// [`STATUS_DEADLINE`] ([`crate::clients`]), so one that does not read, or reads slowly,
/// holds the others off for no time at all.
pub fn serve_socket(path: &Path, latest: Arc<Mutex<Status>>) -> io::Result<()> {
    std::fs::create_dir_all(SOCKET_DIR)?;
    // a socket left by a daemon that was killed; a live daemon of the same host answers
    if path.exists() {
        if answers(path) {
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
    serve_callers(listener, STATUS_DEADLINE, move || {
        let mut snapshot = latest.lock().unwrap_or_else(|e| e.into_inner()).clone();
        snapshot.stamp_age();
        serde_json::to_string(&snapshot).ok()
    })
}

/// Writes what `answer` makes to every caller of `listener`, each on a thread of its own and
/// within `deadline`, from a thread of its own.
fn serve_callers(
    listener: UnixListener,
    deadline: Duration,
    answer: impl Fn() -> Option<String> + Send + Sync + 'static,
) -> io::Result<()> {
    let answer = Arc::new(answer);
    // callers of the daemon's own user (root: `tunnel status` and `reload` as the operator
    // runs them) have places of their own: the other local users, to whom the socket is
    // open, cannot take every place from them by calling without pause or never reading
    let (own, others) = (Places::new(STATUS_CLIENTS), Places::new(STATUS_CLIENTS));
    // SAFETY: geteuid has no preconditions
    let me = unsafe { libc::geteuid() };
    thread::Builder::new()
        .name("ri2n-status".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else {
                    thread::sleep(FAILED_ACCEPT_PAUSE);
                    continue;
                };
                let by = Instant::now() + deadline;
                let answer = answer.clone();
                let places = match peer_credentials(&stream) {
                    Some(c) if c.uid == me => &own,
                    _ => &others,
                };
                places.serve("ri2n-status-client", move || {
                    if let Some(text) = answer() {
                        let _ = write_by(&mut stream, by, text.as_bytes());
                    }
                });
            }
        })?;
    Ok(())
}

/// The labels of a peer's metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabels {
    host: String,
    peer: String,
}

/// The labels of the host's own metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabels {
    host: String,
}

/// The labels of a queue's metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    host: String,
    queue: String,
}

/// The labels of a link's metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LinkLabels {
    host: String,
    peer: String,
    local: String,
    remote: String,
}

/// A counter or gauge of the snapshot: its name (a counter's without `_total`), help, unit,
/// and its value in a peer's or a link's status.
struct MetricOf<T> {
    name: &'static str,
    /// Without a final period: the registry adds one.
    help: &'static str,
    unit: Option<Unit>,
    value: fn(&T) -> u64,
}

/// Registers each of `counters` with a row per peer or link.
fn register_counters<L, T>(registry: &mut Registry, rows: &[(L, &T)], counters: &[MetricOf<T>])
where
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
{
    for c in counters {
        let family = Family::<L, Counter>::default();
        for (labels, row) in rows {
            family.get_or_create(labels).inc_by((c.value)(row));
        }
        register(registry, c, family);
    }
}

/// Registers each of `gauges` with a row per peer or link.
fn register_gauges<L, T>(registry: &mut Registry, rows: &[(L, &T)], gauges: &[MetricOf<T>])
where
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
{
    for g in gauges {
        let family = Family::<L, Gauge>::default();
        for (labels, row) in rows {
            let value = i64::try_from((g.value)(row)).unwrap_or(i64::MAX);
            family.get_or_create(labels).set(value);
        }
        register(registry, g, family);
    }
}

/// Registers `family` under `m`'s name, help and unit.
fn register<T, M: prometheus_client::registry::Metric>(
    registry: &mut Registry,
    m: &MetricOf<T>,
    family: M,
) {
    match m.unit.clone() {
        Some(unit) => registry.register_with_unit(m.name, m.help, unit, family),
        None => registry.register(m.name, m.help, family),
    }
}

/// The snapshot as metrics: a registry made for each scrape, its values the snapshot's.
pub fn prometheus(s: &Status) -> String {
    let mut registry = Registry::default();
    let peer_rows: Vec<_> = (s.peers.iter())
        .map(|p| {
            let labels = PeerLabels {
                host: s.host.clone(),
                peer: p.name.clone(),
            };
            (labels, p)
        })
        .collect();
    let link_rows: Vec<_> = (peer_rows.iter())
        .flat_map(|(peer, p)| {
            p.links.iter().map(move |l| {
                let labels = LinkLabels {
                    host: peer.host.clone(),
                    peer: peer.peer.clone(),
                    local: l.local.clone(),
                    remote: l.remote.clone(),
                };
                (labels, l)
            })
        })
        .collect();

    let connected = Family::<PeerLabels, Gauge>::default();
    for (labels, p) in &peer_rows {
        connected
            .get_or_create(labels)
            .set(i64::from(p.state == "connected"));
    }
    registry.register(
        "ri2n_tunnel_peer_connected",
        "Whether a connection to the peer is established (0: waiting for one, when its links \
         have no ri2n_tunnel_link_up rows). It stays 1 while every link is down (the \
         connection is held through outages): alert on it and on ri2n_tunnel_link_up",
        connected,
    );
    register_gauges(
        &mut registry,
        &peer_rows,
        &[MetricOf {
            name: "ri2n_tunnel_queued",
            help: "Bytes of IP packets queued for the peer and not sent yet: what a packet \
                   read from the interface now waits behind in this daemon, besides the \
                   links' windows",
            unit: Some(Unit::Bytes),
            value: |p: &PeerStatus| p.queued_bytes,
        }],
    );
    register_counters(
        &mut registry,
        &peer_rows,
        &[
            MetricOf {
                name: "ri2n_tunnel_packets_sent",
                help: "IP packets sent to the peer",
                unit: None,
                value: |p: &PeerStatus| p.packets_sent,
            },
            MetricOf {
                name: "ri2n_tunnel_packets_received",
                help: "IP packets received from the peer and written to the interface",
                unit: None,
                value: |p| p.packets_received,
            },
            MetricOf {
                name: "ri2n_tunnel_packets_dropped",
                help: "IP packets dropped: no connection up, send queue full or too old, not \
                       written in time, received from another source than the peer's tunnel \
                       address or for another destination than this host's, or refused by \
                       the interface",
                unit: None,
                value: |p| p.packets_dropped,
            },
        ],
    );
    let reads = Family::<QueueLabels, Counter>::default();
    for (i, n) in s.queue_packets_read.iter().enumerate() {
        let labels = QueueLabels {
            host: s.host.clone(),
            queue: i.to_string(),
        };
        reads.get_or_create(&labels).inc_by(*n);
    }
    registry.register(
        "ri2n_tunnel_queue_packets_read",
        "IP packets read from the interface's queue (each flow is read from one queue)",
        reads,
    );
    // the host's own counters of what it read and did not carry
    for (name, help, value) in [
        (
            "ri2n_tunnel_packets_unrouted",
            "IPv4 packets read from the interface for an address no host of the cluster owns \
             (not carried; their senders are told the host is unreachable)",
            s.packets_unrouted,
        ),
        (
            "ri2n_tunnel_packets_not_ipv4",
            "Packets read from the interface that are not IPv4 (IPv6, or no valid IP packet): \
             not carried, since the tunnel carries IPv4 only",
            s.packets_not_ipv4,
        ),
        (
            "ri2n_tunnel_packets_bad_checksum",
            "IPv4 TCP packets read from the interface with a wrong IP header or TCP checksum \
             that the kernel had not left to the device (a raw socket's): not carried",
            s.packets_bad_checksum,
        ),
    ] {
        let family = Family::<HostLabels, Counter>::default();
        (family.get_or_create(&HostLabels {
            host: s.host.clone(),
        }))
        .inc_by(value);
        registry.register(name, help, family);
    }
    let missing = Family::<HostLabels, Gauge>::default();
    (missing.get_or_create(&HostLabels {
        host: s.host.clone(),
    }))
    .set(s.links_missing.len() as i64);
    registry.register(
        "ri2n_tunnel_links_missing",
        "This host's link addresses the daemon has not bound, missing at its start (its links \
         wait for them)",
        missing,
    );
    if let Some(ms) = s.sampled_ms_ago {
        let age = Family::<HostLabels, Gauge<f64, AtomicU64>>::default();
        (age.get_or_create(&HostLabels {
            host: s.host.clone(),
        }))
        .set(ms as f64 / 1e3);
        registry.register_with_unit(
            "ri2n_tunnel_sample_age",
            "How long before this scrape the daemon began the sample these values are from (a \
             new one every second): a value that keeps growing means the sampling stopped",
            Unit::Seconds,
            age,
        );
    }
    let up = Family::<LinkLabels, Gauge>::default();
    let rtt = Family::<LinkLabels, Gauge<f64, AtomicU64>>::default();
    for (labels, l) in &link_rows {
        up.get_or_create(labels).set(i64::from(l.state == "up"));
        if let Some(us) = l.rtt_us {
            rtt.get_or_create(labels).set(us as f64 / 1e6);
        }
    }
    registry.register(
        "ri2n_tunnel_link_up",
        "Whether the link is up (carries data)",
        up,
    );
    registry.register_with_unit(
        "ri2n_tunnel_link_rtt",
        "Smoothed round-trip time of the link (absent while it is down, and after, until a probe measured it again)",
        Unit::Seconds,
        rtt,
    );
    register_gauges(
        &mut registry,
        &link_rows,
        &[
            MetricOf {
                name: "ri2n_tunnel_link_window",
                help: "Congestion window of the link",
                unit: Some(Unit::Bytes),
                value: |l: &LinkStatus| l.window_bytes,
            },
            MetricOf {
                name: "ri2n_tunnel_link_in_flight",
                help: "Bytes sent on the link, neither acknowledged nor declared lost",
                unit: Some(Unit::Bytes),
                value: |l| l.in_flight_bytes,
            },
        ],
    );
    register_counters(
        &mut registry,
        &link_rows,
        &[
            MetricOf {
                name: "ri2n_tunnel_link_sent",
                help: "Bytes sent on the link (datagrams), by every connection to the peer",
                unit: Some(Unit::Bytes),
                value: |l: &LinkStatus| l.bytes_sent,
            },
            MetricOf {
                name: "ri2n_tunnel_link_received",
                help: "Bytes received on the link (datagrams), by every connection to the peer",
                unit: Some(Unit::Bytes),
                value: |l| l.bytes_received,
            },
            MetricOf {
                name: "ri2n_tunnel_link_lost_packets",
                help: "Packets the link's loss detection declared lost, in every connection \
                       to the peer",
                unit: None,
                value: |l| l.packets_lost,
            },
        ],
    );
    let mut out = String::new();
    // writing into a String cannot fail
    let _ = text::encode(&mut out, &registry);
    out
}

/// Reads the snapshot of the daemon of host `name`.
pub fn query(name: &str) -> Result<Status, String> {
    query_daemon(name).map(|(status, _)| status)
}

/// Reads the snapshot of the daemon of host `name`, and that daemon's process ID (the
/// credentials of the socket's listener; none where its process is not visible from here).
fn query_daemon(name: &str) -> Result<(Status, Option<u32>), String> {
    let path = socket_path(name);
    let mut stream = UnixStream::connect(&path).map_err(|e| {
        // a daemon of this machine that runs under another name: this host's entry renamed
        // in the cluster file since it started
        let others = answering_daemons();
        let hint = match others.is_empty() {
            true => String::new(),
            false => format!(
                "; daemons answer here as host {}: if this host's entry was renamed, its \
                 daemon keeps the name it started with until it is restarted",
                others.join(", ")
            ),
        };
        format!(
            "no tunnel daemon of host {name} answers on {} ({e}): is `ri2n tunnel` \
             running?{hint}",
            path.display()
        )
    })?;
    // a daemon serving as many callers as it takes closes the next at once: asked again a
    // few times, as one of them is done
    let mut closed_unanswered = 0;
    loop {
        let pid = listener_pid(&stream);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let mut text = String::new();
        stream
            .read_to_string(&mut text)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        if !text.is_empty() {
            let status = serde_json::from_str(&text)
                .map_err(|e| format!("{}: not a status: {e}", path.display()))?;
            return Ok((status, pid));
        }
        closed_unanswered += 1;
        if closed_unanswered == BUSY_TRIES {
            return Err(format!(
                "the daemon of host {name} closed {} {BUSY_TRIES} times without answering: \
                 it serves {STATUS_CLIENTS} callers of this user at once, and others took \
                 every place",
                path.display()
            ));
        }
        thread::sleep(BUSY_PAUSE);
        stream = UnixStream::connect(&path)
            .map_err(|e| format!("connecting to {} again: {e}", path.display()))?;
    }
}

/// How often a caller the daemon closed without answering (every place taken) asks again,
/// and how long it waits before each time.
const BUSY_TRIES: u32 = 10;
const BUSY_PAUSE: Duration = Duration::from_millis(100);

/// The hosts whose daemons answer on this machine's status sockets and run in this
/// process's network namespace: the daemon of the host this is, where the cluster file cannot
/// tell (its link addresses not up, the daemon started with `--name`). Daemons of other
/// namespaces (a namespace lab's other hosts) share the socket directory, not the network.
pub fn daemons_in_this_network() -> Vec<String> {
    let namespace = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
    let Some(ours) = namespace(std::process::id()) else {
        return Vec::new();
    };
    let Ok(dir) = std::fs::read_dir(SOCKET_DIR) else {
        return Vec::new();
    };
    let mut names: Vec<String> = (dir.flatten())
        .filter_map(|e| {
            let file = e.file_name().into_string().ok()?;
            let name = file.strip_prefix("tunnel-")?.strip_suffix(".sock")?;
            let pid = listener_pid(&UnixStream::connect(e.path()).ok()?)?;
            (namespace(pid)? == ours).then(|| name.to_owned())
        })
        .collect();
    names.sort();
    names
}

/// The hosts whose daemons answer on this machine's status sockets (a few at most).
fn answering_daemons() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(SOCKET_DIR) else {
        return Vec::new();
    };
    let mut names: Vec<String> = (dir.flatten())
        .filter_map(|e| {
            let file = e.file_name().into_string().ok()?;
            let name = file
                .strip_prefix("tunnel-")?
                .strip_suffix(".sock")?
                .to_owned();
            UnixStream::connect(e.path()).ok().map(|_| name)
        })
        .take(4)
        .collect();
    names.sort();
    names
}

/// The process ID of the process that listens on the other end of `stream` (`SO_PEERCRED`).
fn listener_pid(stream: &UnixStream) -> Option<u32> {
    // 0: the listener is in a PID namespace this process does not see
    let cred = peer_credentials(stream).filter(|c| c.pid > 0)?;
    Some(cred.pid as u32)
}

/// The process, user and group at the other end of `stream` (`SO_PEERCRED`): as they were
/// when it connected, or listened.
fn peer_credentials(stream: &UnixStream) -> Option<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the descriptor of a connected socket, and a ucred with its length
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred)
}

/// How asking a daemon to read its cluster file again can fail.
#[derive(Debug)]
pub enum ReloadError {
    /// No daemon answered, it could not be signalled, or it did not read the file in time.
    Unreached(String),
    /// The daemon read the file and kept the one in use: the reason.
    Refused(String),
    /// The daemon reads another cluster file than the one checked: that one.
    OtherFile(String),
}

/// Whether the daemon of host `name` answers and reads cluster file `config` (the same file,
/// by any path to it).
pub fn daemon_reads(name: &str, config: &Path) -> bool {
    query_daemon(name).is_ok_and(|(s, _)| same_file(&s.config, config))
}

/// Whether the file a daemon names (`theirs`, absolute; a daemon older than the field names
/// none) is `config`.
fn same_file(theirs: &str, config: &Path) -> bool {
    let theirs = Path::new(theirs);
    theirs.is_absolute() && theirs.canonicalize().ok() == config.canonicalize().ok()
}

/// Has the daemon of host `name`, which is to read cluster file `config`, read it again
/// (SIGHUP) and waits, at most `limit`, until its status shows the outcome: what it changed.
/// A daemon that reads another file is left alone: checking `config` said nothing of it.
pub fn request_reload(name: &str, config: &Path, limit: Duration) -> Result<Reload, ReloadError> {
    let (before, pid) = query_daemon(name).map_err(ReloadError::Unreached)?;
    if Path::new(&before.config).is_absolute() && !same_file(&before.config, config) {
        return Err(ReloadError::OtherFile(before.config));
    }
    let pid = pid.ok_or_else(|| {
        ReloadError::Unreached(format!(
            "the daemon of host {name} runs where this process cannot see it (another PID \
             namespace): send it SIGHUP there"
        ))
    })?;
    // SAFETY: kill(2) with a process ID and a signal number
    if unsafe { libc::kill(pid as libc::pid_t, libc::SIGHUP) } != 0 {
        let e = io::Error::last_os_error();
        return Err(ReloadError::Unreached(format!(
            "cannot signal the daemon of host {name} (process {pid}): {e}"
        )));
    }
    let deadline = Instant::now() + limit;
    loop {
        thread::sleep(Duration::from_millis(20));
        // the daemon read the file, or will: a look that fails (every place taken) is
        // tried again until the deadline
        let after = match query(name) {
            Ok(after) => after,
            Err(e) if Instant::now() >= deadline => return Err(ReloadError::Unreached(e)),
            Err(_) => continue,
        };
        if after.reloads > before.reloads {
            let last = after.last_reload.unwrap_or_default();
            return match last.error {
                Some(why) => Err(ReloadError::Refused(why)),
                None => Ok(last),
            };
        }
        if Instant::now() >= deadline {
            return Err(ReloadError::Unreached(format!(
                "the daemon of host {name} (process {pid}) did not read its cluster file \
                 within {limit:?}"
            )));
        }
    }
}

/// The snapshot as a table for a terminal.
pub fn table(s: &Status) -> String {
    let reads: Vec<String> = s.queue_packets_read.iter().map(u64::to_string).collect();
    let not_carried = match s.packets_unrouted {
        0 => String::new(),
        n => format!("; {n} for addresses no host owns"),
    } + &match s.packets_not_ipv4 {
        0 => String::new(),
        n => format!("; {n} not IPv4, not carried"),
    } + &match s.packets_bad_checksum {
        0 => String::new(),
        n => format!("; {n} with a wrong checksum, not carried"),
    };
    let queues = match reads.len() {
        // the status served before the first sample (or a daemon's older than the field)
        // has no counts: an interface has a queue at least
        0 => String::new(),
        n => format!(
            ", {n} queue{} (packets read {}{not_carried})",
            if n == 1 { "" } else { "s" },
            reads.join(" / "),
        ),
    };
    let mut out = format!("{} {} on {}{queues}\n", s.host, s.address, s.interface);
    if !s.links_missing.is_empty() {
        let _ = writeln!(
            out,
            "  this host's link address{} {} not bound (not on this machine, or the port \
             held): its links wait for {} (looked for every second)",
            if s.links_missing.len() == 1 { "" } else { "es" },
            s.links_missing.join(", "),
            if s.links_missing.len() == 1 {
                "it"
            } else {
                "them"
            },
        );
    }
    // which file a reload must edit, and whether the last one was taken up (a daemon older
    // than the `config` field names no file)
    if !s.config.is_empty() {
        let _ = match &s.last_reload {
            Some(last) => writeln!(
                out,
                "  cluster file {}, read again {} time{} since the start; last: {}",
                s.config,
                s.reloads,
                if s.reloads == 1 { "" } else { "s" },
                last.changes()
            ),
            None => writeln!(
                out,
                "  cluster file {}, not read again since the start",
                s.config
            ),
        };
    }
    for p in &s.peers {
        let _ = writeln!(
            out,
            "  {} {} {}{}{}: packets sent {}, received {}, dropped {}{}{}",
            p.name,
            p.address,
            p.state,
            p.waiting_for
                .as_ref()
                .map_or(String::new(), |r| format!(" ({r})")),
            p.encryption
                .as_ref()
                .map_or(String::new(), |e| format!(", sealed with {e}")),
            p.packets_sent,
            p.packets_received,
            p.packets_dropped,
            match p.packets_dropped {
                0 => String::new(),
                _ => format!(
                    " ({} sending, {} receiving)",
                    p.packets_dropped_sending, p.packets_dropped_receiving
                ),
            },
            if p.state == "connected" {
                format!(
                    ", queued {} ({} KiB)",
                    p.queued_packets,
                    p.queued_bytes / 1024
                )
            } else {
                String::new()
            }
        );
        for l in &p.links {
            let _ = writeln!(
                out,
                "    {} -> {} {:<10} rtt {:>6} us  send {:>7} Mbit/s  receive {:>7} Mbit/s  loss {} %  in flight {}/{} KiB",
                l.local,
                l.remote,
                l.state,
                l.rtt_us.map_or("-".to_owned(), |r| r.to_string()),
                fixed(l.send_mbit, 1),
                fixed(l.receive_mbit, 1),
                fixed(l.loss.map(|f| f * 100.0), 2),
                l.in_flight_bytes / 1024,
                l.window_bytes / 1024,
            );
        }
    }
    out
}

/// `x` with `decimals` digits after the point; `-` for none (not measured yet).
fn fixed(x: Option<f64>, decimals: usize) -> String {
    x.map_or("-".to_owned(), |x| format!("{x:.decimals$}"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A caller of the status socket that does not read (or reads slowly) holds nobody off:
    /// the next one gets the whole snapshot at once. One thread served every caller in turn,
    /// with a timeout per write, so a snapshot larger than the socket's buffer held the next
    /// caller for at least that timeout, and one read a little at a time, for ever.
    #[test]
    fn a_caller_that_does_not_read_holds_no_other_off() {
        let dir = std::env::temp_dir().join(format!("ri2n-status-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let text = "x".repeat(8 << 20);
        let answer = text.clone();
        serve_callers(listener, Duration::from_secs(10), move || {
            Some(answer.clone())
        })
        .unwrap();

        let stalled = UnixStream::connect(&path).unwrap();
        // the premise: it is being served, and the answer does not fit its socket
        thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        let mut got = String::new();
        let mut next = UnixStream::connect(&path).unwrap();
        next.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        next.read_to_string(&mut got).unwrap();
        let took = started.elapsed();
        assert_eq!(got.len(), text.len());
        assert!(
            took < Duration::from_secs(5),
            "the next caller waited {took:?}"
        );
        drop(stalled);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Other local users, to whom the status socket is open, cannot keep the daemon's own
    /// user (root, the operator) from it: with every place of theirs held by callers that
    /// do not read (as nobody, through `setpriv`; the premise: another caller of theirs is
    /// closed unanswered), root's caller gets the whole snapshot. Before, all callers shared
    /// the places, and root's was closed at once ("not a status: EOF").
    #[test]
    fn other_users_cannot_take_the_operator_s_places() {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid has no preconditions
        if unsafe { libc::geteuid() } != 0 {
            assert!(std::env::var_os("CI").is_none(), "needs root (setpriv)");
            eprintln!("skipped: needs root (setpriv to another user)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("ri2n-status-users-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        // larger than a socket's buffer: a caller that does not read holds its place
        let text = "x".repeat(8 << 20);
        let answer = text.clone();
        serve_callers(listener, Duration::from_secs(10), move || {
            Some(answer.clone())
        })
        .unwrap();
        let script = format!(
            "import socket, sys, time\n\
             held = []\n\
             for _ in range({STATUS_CLIENTS}):\n\
             \x20   s = socket.socket(socket.AF_UNIX)\n\
             \x20   s.connect(sys.argv[1])\n\
             \x20   held.append(s)\n\
             time.sleep(0.5)\n\
             late = socket.socket(socket.AF_UNIX)\n\
             late.connect(sys.argv[1])\n\
             late.settimeout(5)\n\
             print('late caller got', len(late.recv(65536)), flush=True)\n\
             time.sleep(8)\n"
        );
        let mut nobody = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            // not a python3 of root's own PATH (pyenv), which nobody may not run
            .args(["/usr/bin/python3", "-c", &script])
            .arg(&path)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut said = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(nobody.stdout.take().unwrap()),
            &mut said,
        )
        .unwrap();
        assert_eq!(said.trim(), "late caller got 0", "the premise");
        let mut root = UnixStream::connect(&path).unwrap();
        root.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = String::new();
        let read = root.read_to_string(&mut got);
        let _ = nobody.kill();
        let _ = nobody.wait();
        let _ = std::fs::remove_dir_all(&dir);
        read.unwrap();
        assert_eq!(got.len(), text.len());
    }

    /// A status of one peer with two links, one up and one down.
    pub(crate) fn snapshot() -> Status {
        let link = |state: &str, rtt_us: Option<u64>| LinkStatus {
            local: "10.0.1.1:7400".into(),
            remote: format!("10.0.{}.2:7400", if rtt_us.is_some() { 1 } else { 2 }),
            state: state.into(),
            rtt_us,
            send_mbit: rtt_us.map(|_| 12.5),
            receive_mbit: rtt_us.map(|_| 0.0),
            loss: rtt_us.map(|_| 0.0),
            bytes_sent: 1500,
            bytes_received: 3000,
            packets_lost: 2,
            window_bytes: 30 << 10,
            in_flight_bytes: if rtt_us.is_some() { 12 << 10 } else { 0 },
        };
        Status {
            host: "a".into(),
            address: "10.99.0.1".into(),
            interface: "ri2n0".into(),
            links_missing: vec!["10.0.2.1:7400".into()],
            queue_packets_read: vec![11, 13],
            packets_unrouted: 3,
            packets_not_ipv4: 2,
            packets_bad_checksum: 1,
            config: "/etc/ri2n/cluster.toml".into(),
            reloads: 0,
            last_reload: None,
            sampled_ms_ago: Some(400),
            sampled_at: None,
            peers: vec![PeerStatus {
                // a name the exposition must escape
                name: "b \"east\"".into(),
                address: "10.99.0.2".into(),
                state: "connected".into(),
                waiting_for: None,
                encryption: Some("AEGIS-256X4".into()),
                packets_sent: 7,
                packets_received: 9,
                packets_dropped: 0,
                packets_dropped_sending: 0,
                packets_dropped_receiving: 0,
                queued_packets: 3,
                queued_bytes: 70_000,
                send_limits: None,
                links: vec![link("up", Some(250)), link("down", None)],
            }],
        }
    }

    #[test]
    fn the_metrics_are_the_snapshot_in_the_openmetrics_text_format() {
        let text = prometheus(&snapshot());
        let peer = r#"host="a",peer="b \"east\"""#;
        let up = format!(r#"{peer},local="10.0.1.1:7400",remote="10.0.1.2:7400""#);
        let down = format!(r#"{peer},local="10.0.1.1:7400",remote="10.0.2.2:7400""#);
        for line in [
            "# TYPE ri2n_tunnel_peer_connected gauge".to_owned(),
            format!("ri2n_tunnel_peer_connected{{{peer}}} 1"),
            "# TYPE ri2n_tunnel_packets_sent counter".to_owned(),
            format!("ri2n_tunnel_packets_sent_total{{{peer}}} 7"),
            format!("ri2n_tunnel_packets_received_total{{{peer}}} 9"),
            format!("ri2n_tunnel_packets_dropped_total{{{peer}}} 0"),
            format!("ri2n_tunnel_link_up{{{up}}} 1"),
            format!("ri2n_tunnel_link_up{{{down}}} 0"),
            "# UNIT ri2n_tunnel_link_rtt_seconds seconds".to_owned(),
            format!("ri2n_tunnel_link_rtt_seconds{{{up}}} 0.00025"),
            format!("ri2n_tunnel_link_sent_bytes_total{{{up}}} 1500"),
            format!("ri2n_tunnel_link_received_bytes_total{{{down}}} 3000"),
            format!("ri2n_tunnel_link_lost_packets_total{{{up}}} 2"),
            "# UNIT ri2n_tunnel_queued_bytes bytes".to_owned(),
            format!("ri2n_tunnel_queued_bytes{{{peer}}} 70000"),
            format!("ri2n_tunnel_link_window_bytes{{{up}}} 30720"),
            format!("ri2n_tunnel_link_in_flight_bytes{{{up}}} 12288"),
            format!("ri2n_tunnel_link_in_flight_bytes{{{down}}} 0"),
            r#"ri2n_tunnel_queue_packets_read_total{host="a",queue="0"} 11"#.to_owned(),
            r#"ri2n_tunnel_queue_packets_read_total{host="a",queue="1"} 13"#.to_owned(),
            r#"ri2n_tunnel_packets_unrouted_total{host="a"} 3"#.to_owned(),
            r#"ri2n_tunnel_packets_not_ipv4_total{host="a"} 2"#.to_owned(),
            r#"ri2n_tunnel_packets_bad_checksum_total{host="a"} 1"#.to_owned(),
            r#"ri2n_tunnel_links_missing{host="a"} 1"#.to_owned(),
            "# UNIT ri2n_tunnel_sample_age_seconds seconds".to_owned(),
            r#"ri2n_tunnel_sample_age_seconds{host="a"} 0.4"#.to_owned(),
            "# EOF".to_owned(),
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        // a link that is down has no round trip, not a stale or made-up one
        assert!(!text.contains(&format!("ri2n_tunnel_link_rtt_seconds{{{down}}}")));
        // each help text ends with the one period the registry adds (it showed two)
        let help: Vec<_> = text.lines().filter(|l| l.starts_with("# HELP")).collect();
        assert_eq!(help.len(), 18, "{text}");
        for l in help {
            assert!(l.ends_with('.') && !l.ends_with(".."), "{l}");
        }
    }

    #[test]
    fn the_table_names_each_peer_s_cipher_and_each_link() {
        let text = table(&snapshot());
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some(
                "a 10.99.0.1 on ri2n0, 2 queues (packets read 11 / 13; 3 for addresses no host \
                 owns; 2 not IPv4, not carried; 1 with a wrong checksum, not carried)"
            )
        );
        assert_eq!(
            lines.next(),
            Some(
                "  this host's link address 10.0.2.1:7400 not bound (not on this machine, or \
                 the port held): its links wait for it (looked for every second)"
            )
        );
        assert_eq!(
            lines.next(),
            Some("  cluster file /etc/ri2n/cluster.toml, not read again since the start")
        );
        assert_eq!(
            lines.next(),
            Some(
                "  b \"east\" 10.99.0.2 connected, sealed with AEGIS-256X4: packets sent 7, \
                 received 9, dropped 0, queued 3 (68 KiB)"
            )
        );
        let up = lines.next().unwrap();
        assert!(up.contains("up         rtt    250 us"), "{up}");
        assert!(
            up.contains("send    12.5 Mbit/s") && up.contains("loss 0.00 %"),
            "{up}"
        );
        assert!(up.ends_with("in flight 12/30 KiB"), "{up}");
        // not measured yet: no figure, rather than a 0 that reads as one
        let down = lines.next().unwrap();
        assert!(down.contains("down       rtt      - us"), "{down}");
        assert!(
            down.contains("send       - Mbit/s") && down.contains("loss - %"),
            "{down}"
        );
        assert_eq!(lines.next(), None);
    }

    /// A link's counters at one sample.
    fn counted(bytes_sent: u64, packets_sent: u64, packets_lost: u64) -> ri2n::LinkStats {
        let addr = "10.0.1.1:7400".parse().unwrap();
        let mut l = ri2n::LinkStats::new(ri2n::LinkId(0), addr, addr, ri2n::LinkState::Up);
        (l.bytes_sent, l.packets_sent, l.packets_lost) = (bytes_sent, packets_sent, packets_lost);
        l
    }

    /// A connection made after the one sampled last ended is never taken for it. Before, the
    /// key was the connection's address, which the allocator may give the next connection
    /// of the same size: its first rates were then taken against the old one's counters
    /// (0.0 Mbit/s, loss 0 %), instead of none.
    #[test]
    fn a_connection_that_replaced_another_is_never_taken_for_it() {
        let old = Arc::new([1u64; 16]);
        let remembered = Identity::of(&old);
        assert!(remembered == Identity::of(&old));
        let address = Arc::as_ptr(&old) as usize;
        drop(old);
        let new = Arc::new([2u64; 16]);
        assert!(remembered != Identity::of(&new));
        assert_ne!(
            Arc::as_ptr(&new) as usize,
            address,
            "the old allocation is held"
        );
    }

    #[test]
    fn rates_and_loss_cover_one_period_of_one_connection() {
        let mut previous = PreviousConnection::<u32>::default();
        let none = LinkTotals::new();
        let t0 = Instant::now();
        // the first sample has no period behind it: nothing measured, whatever came before
        let first = previous.sample(1, &[counted(1_000_000, 1000, 400)], &none, t0);
        assert_eq!(first[0].send_mbit, None);
        assert_eq!(first[0].loss, None);
        let t1 = t0 + Duration::from_secs(1);
        let second = previous.sample(1, &[counted(2_250_000, 2000, 410)], &none, t1);
        assert_eq!(second[0].send_mbit, Some(10.0));
        assert_eq!(second[0].loss, Some(0.01));
        // a connection that replaced it (its counters from zero) starts over
        let t2 = t1 + Duration::from_secs(1);
        let replaced = previous.sample(2, &[counted(50_000, 40, 0)], &none, t2);
        assert_eq!(replaced[0].send_mbit, None);
        assert_eq!(replaced[0].loss, None);
        let t3 = t2 + Duration::from_secs(1);
        let next = previous.sample(2, &[counted(175_000, 140, 0)], &none, t3);
        assert_eq!(next[0].send_mbit, Some(1.0));
        assert_eq!(next[0].loss, Some(0.0));
    }

    /// The status served before the first sample has no queue counts: the table does not
    /// make them "0 queues (packets read )", which no interface has.
    #[test]
    fn a_status_without_queue_counts_names_no_queues() {
        let mut s = snapshot();
        s.queue_packets_read.clear();
        (
            s.packets_unrouted,
            s.packets_not_ipv4,
            s.packets_bad_checksum,
        ) = (0, 0, 0);
        let text = table(&s);
        assert_eq!(text.lines().next(), Some("a 10.99.0.1 on ri2n0"));
    }

    /// A sample taken soon after the last (a reload wakes the sampler at once) shows the rates
    /// and loss of the period before, and the period runs on to the next sample. Before, a
    /// burst in the 20 ms before a reload read as 50 times the link's rate over a second, and
    /// one packet lost in them as 100 % loss.
    #[test]
    fn a_sample_soon_after_the_last_keeps_the_rates_of_a_whole_period() {
        let mut previous = PreviousConnection::<u32>::default();
        let none = LinkTotals::new();
        let t0 = Instant::now();
        let _ = previous.sample(1, &[counted(0, 0, 0)], &none, t0);
        let t1 = t0 + Duration::from_secs(1);
        let whole = previous.sample(1, &[counted(125_000, 100, 0)], &none, t1);
        assert_eq!((whole[0].send_mbit, whole[0].loss), (Some(1.0), Some(0.0)));
        // 20 ms later, after a burst of 125 kB with a packet lost
        let soon = t1 + Duration::from_millis(20);
        let early = previous.sample(1, &[counted(250_000, 101, 1)], &none, soon);
        assert_eq!((early[0].send_mbit, early[0].loss), (Some(1.0), Some(0.0)));
        assert_eq!(early[0].bytes_sent, 250_000, "the counts are of now");
        // the next sample takes the period from t1: the burst is in it, over its length
        let t2 = soon + Duration::from_secs(1);
        let next = previous.sample(1, &[counted(375_000, 200, 1)], &none, t2);
        let mbit = next[0].send_mbit.expect("a rate");
        assert!((mbit - 2.0 / 1.02).abs() < 1e-9, "{mbit}");
        assert_eq!(next[0].loss, Some(0.01));
    }

    /// A link that is not up sends only probes, and an unanswered probe is not declared lost:
    /// its loss is not measured, rather than a 0 that reads as a healthy link. What it
    /// declared lost in the period (its data in flight when it went down) is still told.
    /// Before, a link down for seconds showed `loss 0.00 %`.
    #[test]
    fn a_link_that_carries_only_probes_has_no_loss_figure() {
        let mut previous = PreviousConnection::<u32>::default();
        let none = LinkTotals::new();
        let t0 = Instant::now();
        let _ = previous.sample(1, &[counted(1_000_000, 1000, 0)], &none, t0);
        let mut down = counted(1_100_000, 1100, 40);
        down.state = ri2n::LinkState::Down;
        let t1 = t0 + Duration::from_secs(1);
        let went_down = previous.sample(1, &[down.clone()], &none, t1);
        assert_eq!(went_down[0].loss, Some(0.4));
        // a second down: a few probes sent, none answered, none declared lost
        down.packets_sent += 5;
        down.bytes_sent += 5 * 50;
        let t2 = t1 + Duration::from_secs(1);
        let still_down = previous.sample(1, &[down.clone()], &none, t2);
        assert_eq!(still_down[0].loss, None);
        assert_eq!(still_down[0].send_mbit, Some(0.002));
        for state in [ri2n::LinkState::Validating, ri2n::LinkState::Degraded] {
            down.state = state;
            let t = t2 + Duration::from_secs(1);
            assert_eq!(previous.sample(1, &[down.clone()], &none, t)[0].loss, None);
        }
    }

    /// A link's byte and loss counts take in what the peer's ended connections moved between
    /// the same two addresses, once; its rates and loss stay the connection's own. Before,
    /// every reconnection started them again from zero.
    #[test]
    fn link_counts_go_on_across_connections_and_rates_stay_their_own() {
        let mut previous = PreviousConnection::<u32>::default();
        let key: LinkKey = ("10.0.1.1".parse().unwrap(), "10.0.1.1".parse().unwrap());
        let other: LinkKey = ("10.0.2.1".parse().unwrap(), "10.0.2.2".parse().unwrap());
        let ended = LinkTotals::from([
            (
                key,
                LinkCounts {
                    bytes_sent: 5_000_000,
                    bytes_received: 7_000,
                    packets_lost: 3,
                },
            ),
            (
                other,
                LinkCounts {
                    bytes_sent: 1,
                    bytes_received: 1,
                    packets_lost: 1,
                },
            ),
        ]);
        let t0 = Instant::now();
        let first = previous.sample(1, &[counted(1_000, 10, 1)], &ended, t0);
        assert_eq!(first[0].bytes_sent, 5_001_000);
        assert_eq!(first[0].packets_lost, 4);
        assert_eq!(first[0].bytes_received, 7_000);
        let t1 = t0 + Duration::from_secs(1);
        // two links between the same addresses: the ended counts go to the first alone
        let links = [counted(126_000, 110, 1), counted(500, 5, 0)];
        let second = previous.sample(1, &links, &ended, t1);
        assert_eq!(second[0].bytes_sent, 5_126_000);
        assert_eq!(second[1].bytes_sent, 500);
        assert_eq!(second[0].send_mbit, Some(1.0));
        assert_eq!(second[0].loss, Some(0.0));
    }

    /// Dropped packets are told apart by where they were dropped, on the way out or in, so
    /// that a flow that stood still can be traced to one side.
    #[test]
    fn the_table_says_on_which_way_packets_were_dropped() {
        let mut s = snapshot();
        let p = &mut s.peers[0];
        (
            p.packets_dropped,
            p.packets_dropped_sending,
            p.packets_dropped_receiving,
        ) = (5, 2, 3);
        let text = table(&s);
        assert!(
            text.contains("dropped 5 (2 sending, 3 receiving), queued 3"),
            "{text}"
        );
    }

    #[test]
    fn the_table_says_what_the_last_reload_did() {
        let mut s = snapshot();
        s.links_missing.clear();
        s.reloads = 1;
        s.last_reload = Some(Reload {
            added: vec!["c".into(), "d".into()],
            removed: vec![],
            error: None,
        });
        assert_eq!(
            table(&s).lines().nth(1),
            Some(
                "  cluster file /etc/ri2n/cluster.toml, read again 1 time since the start; \
                 last: added c, d; removed none"
            )
        );
        s.reloads = 2;
        s.last_reload = Some(Reload {
            error: Some("the port changed (7400 to 7401)".into()),
            ..Reload::default()
        });
        assert_eq!(
            table(&s).lines().nth(1),
            Some(
                "  cluster file /etc/ri2n/cluster.toml, read again 2 times since the start; \
                 last: refused: the port changed (7400 to 7401)"
            )
        );
        // a daemon older than the `config` field names no file: no such line
        s.config = String::new();
        let text = table(&s);
        assert!(
            text.lines().nth(1).unwrap().starts_with("  b \"east\""),
            "{text}"
        );
    }
}
