//! `ri2n tunnel` as a library: every IP application of a cluster gets ri2n's links,
//! unchanged. The `ri2n` command is its front (options, key file, exit codes); this crate is
//! the daemon.
//!
//! Each host runs one daemon with the same cluster file (`config`): a TUN interface holding
//! the host's tunnel address (`device`), one ri2n endpoint on the host's address on every
//! network (`links`: an address missing at start is taken up later), and one connection to
//! every other host (`peers`; the one listed first connects, again and again while the other
//! is away). Each IP packet read from the interface travels to the host owning its
//! destination as one unreliable datagram (docs/PROTOCOL.md §5.9): inner TCP keeps the only
//! recovery loop for congestion loss, and sees a link failure or an outage as delay, not
//! loss. Threads, however many peers: one per queue of the interface reads it and routes
//! (`route`; the flows are spread over the queues, see `device`); one connects to the peers,
//! accepts them and writes what every connection receives to the interface (`peer_loop`),
//! all with the interface's TCP offloads (`offload`); on fewer than 4 CPUs that one also
//! reads the interface's one queue, in place of a route thread without a core of its own;
//! one samples the status that a Unix socket and Prometheus serve (`status`); on 8 CPUs or
//! more, the endpoint's one per link that seals and sends (`--send-threads`). With a
//! busy-poll window (by default where the peer loop receives on the links itself) the route
//! loops and the peer loop look for the next packet a while before they sleep, as long as
//! packets come that quickly (`busy_poll`): latency for CPU.
//!
//! Written here rather than taken from a crate: the TUN set-up (`device`: a few ioctls for
//! the virtio-net header and the TSO flags) and the offloads (`offload`, whose header
//! parsing is `etherparse`'s). This daemon carries a large TCP segment whole, as one
//! datagram, and writes it whole on the other side; `tun-rs`'s offload reads split each one
//! into MTU-sized packets and coalesce them again on write (the wireguard-go scheme), which
//! is the per-packet work carrying it whole avoids, and its offload switch also turns on
//! IPv6 TSO and UDP segmentation, whose segments this daemon does not cut.

mod busy_poll;
mod clients;
mod config;
mod device;
mod here;
mod links;
mod metrics;
mod offload;
mod peer_loop;
mod peers;
mod route;
mod status;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use ri2n::{ConnectionConfig, Endpoint, EndpointConfig, Key, LinkThreads, RefusedHandshake};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

pub use config::{Cluster, ConfigError, Host, DEFAULT_INTERFACE, DEFAULT_PORT, DEFAULT_PREFIX};
pub use here::check as check_machine;
pub use peers::Reload;
pub use status::{
    daemon_reads, daemons_in_this_network, query as query_status, request_reload,
    table as status_table, LinkStatus, PeerStatus, ReloadError, SendLimitsSeconds, Status,
};

use device::Tun;
use peers::Peers;

/// How long a connecting host waits for a peer's answer before trying again.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Received packets a connection keeps for the interface (the engine's default, 1 MiB, is
/// 4 ms of two 1 Gbit/s links: a writer that misses a few milliseconds of CPU would drop).
/// The thread that writes them to the interface also takes them in from the link sockets,
/// and after a few milliseconds off its CPU it takes in what the sockets gathered
/// meanwhile before it writes: several inner TCP flows fill that faster than one, and a
/// smaller bound dropped what they sent in such bursts (BENCHMARKS.md §6). A bound, not an
/// allocation: a peer that sends little holds little.
const RECEIVE_BUFFER: usize = 16 << 20;

/// How IP packets ride between the hosts; every host of a cluster must use the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carry {
    /// Each packet as one unreliable datagram: inner TCP recovers what is lost.
    Datagrams,
    /// Each packet as one reliable message (a large TCP segment whole, as one message).
    Messages,
}

impl Carry {
    /// The application name in the handshake: the carry is part of it, so two hosts that
    /// disagree are refused in the handshake and both say why, instead of connecting and
    /// losing every packet.
    pub const fn application(self) -> &'static str {
        match self {
            Carry::Datagrams => "ri2n tunnel",
            Carry::Messages => "ri2n tunnel, messages",
        }
    }
}

/// The interface's queues when none are asked for: one per `CPUS_PER_QUEUE` CPUs this process
/// may use, at least 1 and at most `MAX_DEFAULT_QUEUES`. A queue's thread gains only with a
/// core of its own: beside it run the peer loop, the endpoint's driver, inner TCP and the
/// applications, and on a host whose CPUs those keep busy a second route loop costs more
/// than it gives (docs/BENCHMARKS.md §6).
pub fn default_queues() -> usize {
    thread::available_parallelism().map_or(1, |n| {
        (n.get() / CPUS_PER_QUEUE).clamp(1, MAX_DEFAULT_QUEUES)
    })
}

const CPUS_PER_QUEUE: usize = 4;

/// Whether the peer loop reads the interface's queue itself, between its deliveries, with no
/// route thread: with one queue on fewer than [`CPUS_PER_QUEUE`] CPUs, where a route thread
/// would have no core of its own. There, a packet sent wakes the route thread and what comes
/// back for it (inner TCP's acknowledgement, a reply) the peer loop: two threads taking
/// turns, and each waking the other's CPU, where one thread does both (docs/BENCHMARKS.md
/// §6).
fn peer_loop_routes(queues: usize) -> bool {
    queues == 1 && thread::available_parallelism().map_or(1, usize::from) < CPUS_PER_QUEUE
}

/// Beyond this many, the connections the route loops hand their packets to are the limit
/// before the queues are.
const MAX_DEFAULT_QUEUES: usize = 8;

/// The busy-poll window when none is asked for: [`AUTO_BUSY_POLL`] where the peer loop
/// receives on the link sockets itself, none where each link has a receiving thread
/// (`recv_threads`, as it resolves on this host): such a thread takes each packet first and
/// wakes the loop anyway, so a loop spinning beside it would burn a core for little.
pub fn default_busy_poll(recv_threads: LinkThreads) -> Duration {
    if ri2n::link_threads_wanted(recv_threads) {
        Duration::ZERO
    } else {
        AUTO_BUSY_POLL
    }
}

/// The default busy-poll window: long enough for a local application's answer to a request,
/// and, once the tunnel has no wake-ups left in it, for a whole small round trip in the lab
/// (docs/BENCHMARKS.md §6). Where packets come further apart the threads stop spinning
/// (`busy_poll`).
pub const AUTO_BUSY_POLL: Duration = Duration::from_micros(50);

/// What the daemon is told besides the cluster file.
#[derive(Debug, Clone)]
pub struct Options {
    /// The cluster file, read again on SIGHUP.
    pub config: PathBuf,
    /// The host was named (`--name`), not found by its link addresses.
    pub named: bool,
    pub carry: Carry,
    /// Also serve the status as Prometheus metrics over HTTP on this address.
    pub metrics: Option<SocketAddr>,
    /// The interface's queues, each read by a thread of its own (see `device`; one queue on
    /// fewer than 4 CPUs by the peer loop): flows are spread over them, a flow's packets
    /// staying on one.
    pub queues: usize,
    /// How long the packet threads keep looking for more after their last packet before they
    /// sleep, while packets come that quickly (`busy_poll`); zero: they sleep at once. See
    /// [`default_busy_poll`].
    pub busy_poll: Duration,
    /// Whether each link gets a thread that seals and sends ([`ri2n::LinkThreads`]).
    pub send_threads: LinkThreads,
    /// Whether each link gets a thread that receives and opens ([`ri2n::LinkThreads`]);
    /// `Auto` means off with `busy_poll`.
    pub recv_threads: LinkThreads,
    /// How a refused handshake is put in the log (the front knows the other side's commands
    /// by their application names).
    pub describe_refusal: fn(&RefusedHandshake) -> String,
}

/// SIGHUP, SIGINT and SIGTERM, caught from before the cluster file is first read: one that
/// comes while the daemon starts (`systemctl reload` or `stop` right after a start, a slow
/// key file) would otherwise end the process at once, as they do by default (killed by the
/// signal, not the exit the help promises). It waits: once the daemon runs, a SIGHUP reads
/// the file again, and a SIGINT or SIGTERM stops it as at any other time.
pub struct StartSignals(signal_hook::iterator::Signals);

impl StartSignals {
    /// Catches the daemon's signals from now on: call it before reading the cluster file,
    /// then hand it to [`run`].
    pub fn watch() -> Result<StartSignals, Error> {
        signal_hook::iterator::Signals::new([SIGHUP, SIGINT, SIGTERM])
            .map(StartSignals)
            .map_err(|e| Error::io("cannot watch SIGHUP, SIGINT and SIGTERM", e))
    }
}

/// Why the daemon could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cluster file cannot be used, or does not name this host.
    #[error("{0}")]
    Config(String),
    /// The endpoint could not be made on this host's link addresses.
    #[error(transparent)]
    Endpoint(ri2n::Error),
    /// The metrics address could not be bound.
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics { addr: SocketAddr, source: io::Error },
    /// A daemon of this host already runs on this machine: its status socket answers.
    #[error(
        "a tunnel daemon of host {name} already runs on this machine (its status socket {} \
         answers): stop it first, or have it read a changed cluster file with `ri2n tunnel \
         reload`",
        socket.display()
    )]
    Running { name: String, socket: PathBuf },
    /// A resource the daemon needs: the interface, the status socket, a thread.
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
    /// The interface or the connections could no longer be served; the daemon stopped.
    #[error("{0}")]
    Failed(String),
}

impl Error {
    fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// That no daemon of host `name` runs on this machine: one that does holds the host's
/// interface, link addresses and status socket (checked before any is taken, and by
/// `--check`).
pub fn check_not_running(name: &str) -> Result<(), Error> {
    let socket = status::socket_path(name);
    match status::answers(&socket) {
        true => Err(Error::Running {
            name: name.to_owned(),
            socket,
        }),
        false => Ok(()),
    }
}

/// Whether host `me`'s link addresses that this machine has now can be bound on the
/// cluster's port, as the daemon binds them first (for `--check`): the error the daemon
/// would stop with (a port in use), else the addresses this machine lacks. Those are no
/// error: the daemon starts without them and takes them up when they come (the caller
/// warns); nor is a port below 1024 refused to a caller without the privilege the daemon has.
pub fn check_links_free(cluster: &Cluster, me: usize) -> Result<Vec<SocketAddr>, Error> {
    let locals: Vec<SocketAddr> = (cluster.hosts[me].links.iter())
        .map(|&ip| SocketAddr::new(ip, cluster.port))
        .collect();
    let config = |addrs: Vec<SocketAddr>| EndpointConfig::new(addrs).server();
    match links::bind_available(&locals, &config) {
        Ok((_, missing)) => Ok(missing),
        Err(ri2n::Error::Bind { source, .. })
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            let here = here::Addresses::now();
            Ok(locals.into_iter().filter(|a| !here.has(a.ip())).collect())
        }
        Err(e) => Err(Error::Endpoint(e)),
    }
}

/// The cluster file at `path` and this host's position in it (named `name`, else found by
/// its link addresses).
pub fn load(path: &Path, name: Option<&str>) -> Result<(Cluster, usize), Error> {
    let cluster = Cluster::load(path).map_err(|e| Error::Config(e.to_string()))?;
    let me = cluster
        .find_self(name)
        .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    Ok((cluster, me))
}

/// The MTU of the interface of `host`: what one packet carries on each of its links, so that
/// an inner packet that is not a large TCP segment goes unsplit (and is lost alone). Its own
/// links decide: every path it has starts at one of them (a host of IPv4 links only sends
/// over IPv4 to every peer), and a reload cannot change them, so the MTU set at the start
/// holds for every cluster file it takes up.
fn interface_mtu(host: &Host) -> usize {
    let ipv6 = host.links.iter().any(IpAddr::is_ipv6);
    let ip_header_growth = if ipv6 { 20 } else { 0 };
    ri2n::datagram_capacity(
        ConnectionConfig::default().max_datagram_size - ip_header_growth,
        true,
    )
}

/// Every connection of the tunnel, named by its carry in the handshake: no deadline on an
/// outage (a host away for minutes is taken back when it returns, and packets wait for a
/// link meanwhile).
fn connection_config(carry: Carry) -> ConnectionConfig {
    ConnectionConfig::default()
        .with_application(carry.application())
        .with_accept_messages(true)
        .with_accept_datagrams(true)
        .with_handshake_timeout(CONNECT_TIMEOUT)
        .with_datagram_receive_buffer(RECEIVE_BUFFER)
}

/// How a thread of the daemon that can no longer work stops it: the signal wait returns,
/// and the daemon shuts down as on SIGTERM, then reports why. Also how the other threads
/// learn that the daemon is closing its connections.
pub(crate) struct Stop {
    signals: signal_hook::iterator::Handle,
    why: Mutex<Option<String>>,
    closing: AtomicBool,
}

impl Stop {
    /// The daemon closes its connections now: their ends are its own doing, logged by it,
    /// and no peer is connected again.
    fn closing(&self) {
        self.closing.store(true, Ordering::Release);
    }

    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    pub(crate) fn fail(&self, why: String) {
        eprintln!("ri2n tunnel: {why}");
        self.why
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(why);
        self.signals.close();
    }
}

/// Runs the daemon of host `me` of `cluster` with `key` (the cluster's, loaded by the
/// front) until SIGINT or SIGTERM; SIGHUP reads the cluster file again (each caught since
/// `signals` was made). Returns once the connections are closed; the interface goes with the
/// process.
pub fn run(
    options: &Options,
    signals: StartSignals,
    cluster: Cluster,
    me: usize,
    key: Key,
) -> Result<(), Error> {
    let host = cluster.hosts[me].clone();
    // first: a daemon of this host running is what its interface and links are in use by
    check_not_running(&host.name)?;
    here::check(&cluster)
        .map_err(|e| Error::Config(format!("{}: {e}", options.config.display())))?;
    // found by its link addresses alone (no --name): a reload must keep it so, or the next
    // start would fail (or take this machine for another host)
    let found_by_addresses = !options.named && cluster.hosts_here() == [me];
    let port = cluster.port;
    let locals: Vec<SocketAddr> = host
        .links
        .iter()
        .map(|&ip| SocketAddr::new(ip, port))
        .collect();
    let (carry, send_threads) = (options.carry, options.send_threads);
    let key_in_use = key.clone();
    // A busy-polling peer loop takes each packet from the sockets itself, awake; a receiving
    // thread per link would sleep and be woken for every packet it got to first.
    let recv_threads = match options.recv_threads {
        LinkThreads::Auto if !options.busy_poll.is_zero() => LinkThreads::Off,
        chosen => chosen,
    };
    let endpoint_config = move |addrs: Vec<SocketAddr>| {
        // one shard: the peer loop receives on its sockets itself (`peer_loop`)
        EndpointConfig::new(addrs)
            .server()
            .with_shards(Some(1))
            .with_send_threads(send_threads)
            .with_recv_threads(recv_threads)
            .with_key(Some(key.clone()))
            .with_server_connection(connection_config(carry))
    };
    let (endpoint, missing) = links::bind_present(&locals, &endpoint_config)?;
    let mut present: Vec<String> = (locals.iter())
        .filter(|a| !missing.contains(a))
        .map(ToString::to_string)
        .collect();
    if present.is_empty() {
        present.push("none yet".into());
    }

    let mtu = interface_mtu(&host);
    let queues = Tun::create(
        &cluster.interface,
        host.address,
        cluster.prefix,
        mtu,
        options.queues,
    )
    .map_err(Error::Failed)?;
    let busy_poll = match options.busy_poll.as_micros() {
        0 => String::new(),
        us => format!(", busy-poll {us} µs"),
    };
    eprintln!(
        "ri2n tunnel: {} is {}/{} on {} (MTU {mtu}, {} queue{}{busy_poll}); links {}; {} peer{}",
        host.name,
        host.address,
        cluster.prefix,
        cluster.interface,
        queues.len(),
        if queues.len() == 1 { "" } else { "s" },
        present.join(", "),
        cluster.hosts.len() - 1,
        if cluster.hosts.len() == 2 { "" } else { "s" },
    );

    let interface = cluster.interface.clone();
    let peers = Arc::new(Peers::new(cluster, me, carry, endpoint, queues.len()));
    peers.endpoint.set_missing(&missing);
    let StartSignals(mut signals) = signals;
    let stop = Arc::new(Stop {
        signals: signals.handle(),
        why: Mutex::new(None),
        closing: AtomicBool::new(false),
    });

    // absolute, so that `tunnel reload --config FILE` can tell whether FILE is this one
    let config = std::path::absolute(&options.config)
        .unwrap_or_else(|_| options.config.clone())
        .display()
        .to_string();
    let latest = Arc::new(Mutex::new(status::Status {
        host: host.name.clone(),
        address: host.address.to_string(),
        interface: interface.clone(),
        links_missing: peers
            .endpoint
            .missing()
            .iter()
            .map(ToString::to_string)
            .collect(),
        queue_packets_read: Vec::new(),
        packets_unrouted: 0,
        packets_not_ipv4: 0,
        packets_bad_checksum: 0,
        config: config.clone(),
        reloads: 0,
        last_reload: None,
        sampled_ms_ago: None,
        sampled_at: None,
        peers: Vec::new(),
    }));
    {
        let (peers, latest) = (peers.clone(), latest.clone());
        thread::spawn(move || status::sample_loop(peers, latest, config));
    }
    let socket = status::socket_path(&host.name);
    status::serve_socket(&socket, latest.clone()).map_err(|e| {
        Error::io(
            format!("cannot serve the status on {}", socket.display()),
            e,
        )
    })?;
    // removed however `run` returns: a start that fails after this (the metrics address
    // taken) must not leave a socket that nothing answers
    let socket_file = RemoveOnDrop(socket);
    if let Some(addr) = options.metrics {
        metrics::serve(addr, latest).map_err(|source| Error::Metrics { addr, source })?;
    }

    // the route loops hold the interface's queues: it goes when the process does
    let mut route_queues = queues
        .try_clone()
        .map_err(|e| Error::io("cannot duplicate the TUN descriptors", e))?
        .into_vec();
    let peer_loop_route = match peer_loop_routes(route_queues.len()) {
        true => route_queues.pop(),
        false => None,
    };
    let peer_loop = peer_loop::start(
        peers.clone(),
        queues,
        options.describe_refusal,
        stop.clone(),
        options.busy_poll,
        peer_loop_route,
    )
    .map_err(|e| Error::io("cannot start the peer loop", e))?;
    if !missing.is_empty() {
        let peers = peers.clone();
        thread::spawn(move || {
            let end_connections = |_: &Endpoint| {
                for c in peers.table().peers.iter().filter_map(|p| p.conn()) {
                    c.abort(0, "the peer's link addresses changed: connecting again");
                }
            };
            links::bind_late(
                &peers.endpoint,
                &locals,
                missing,
                &endpoint_config,
                &end_connections,
            );
        });
    }
    for (queue, tun) in route_queues.into_iter().enumerate() {
        let (peers, stop, busy) = (peers.clone(), stop.clone(), options.busy_poll);
        thread::Builder::new()
            .name(format!("ri2n-route-{queue}"))
            .spawn(move || route::route_loop(&peers, &tun, queue, &stop, busy))
            .map_err(|e| Error::io("cannot start a route loop", e))?;
    }

    // none: a thread failed (`Stop::fail` closed the wait)
    let signal = loop {
        match signals.forever().next() {
            Some(SIGHUP) => reload(
                &peers,
                &options.config,
                &peer_loop,
                &key_in_use,
                found_by_addresses,
            ),
            other => break other,
        }
    };
    eprintln!(
        "ri2n tunnel: {}: closing the connections and removing {interface}",
        match signal {
            Some(SIGINT) => "SIGINT",
            Some(_) => "SIGTERM",
            None => "stopping",
        },
    );
    stop.closing();
    for peer in &peers.table().peers {
        if let Some(c) = peer.conn() {
            eprintln!("ri2n tunnel: {}: {}", peer.name(), summary(&c.stats()));
            c.abort(0, "the tunnel on the peer stopped");
        }
    }
    drop(socket_file);
    if let Some((_, endpoint)) = peers.endpoint.get() {
        let _ = endpoint.close(Some(Duration::from_millis(500)));
    }
    // returning ends the process, which closes the interface: the kernel removes it
    let failed = stop.why.lock().unwrap_or_else(|e| e.into_inner()).take();
    failed.map_or(Ok(()), |why| Err(Error::Failed(why)))
}

/// SIGHUP: reads the cluster file again and puts it in use (see [`Peers::reload`]); a file
/// that cannot be used is logged and the one in use kept. The status tells how it went
/// (`ri2n tunnel reload` waits for that).
/// With `by_addresses` (this host was found by its link addresses), a file in which other
/// hosts list addresses of this machine is refused too: a start without `--name` would fail
/// on it.
fn reload(
    peers: &Arc<Peers>,
    config: &Path,
    peer_loop: &peer_loop::Handle,
    key: &Key,
    by_addresses: bool,
) {
    let me = peers.table().me().name.clone();
    let loaded = load(config, Some(&me))
        .map_err(|e| e.to_string())
        .and_then(|(cluster, me)| {
            let others: Vec<&str> = (cluster.hosts_here().into_iter())
                .filter(|&i| by_addresses && i != me)
                .map(|i| cluster.hosts[i].name.as_str())
                .collect();
            if !others.is_empty() {
                return Err(format!(
                    "{}: {} also list(s) link addresses of this machine: a start without \
                     --name could not tell which host it is",
                    config.display(),
                    others.join(", ")
                ));
            }
            same_key(&cluster.key, key)?;
            peers.reload(cluster, me)
        });
    match loaded {
        Ok((added, removed)) => {
            eprintln!("ri2n tunnel: SIGHUP: {} read again", config.display());
            let added_names = added.iter().map(|p| p.name().to_owned()).collect();
            for peer in added.into_iter().filter(|p| p.connects) {
                peer_loop.connect_to(peer);
            }
            peers.reloaded(Reload {
                added: added_names,
                removed,
                error: None,
            });
        }
        Err(e) => {
            eprintln!("ri2n tunnel: SIGHUP: the cluster file in use is kept: {e}");
            peers.reloaded(Reload {
                error: Some(e),
                ..Reload::default()
            });
        }
    }
}

/// Whether the key file at `path` still holds `in_use`: a new key in the same file is a
/// change of key, which takes a restart (the endpoint and every connection use the key).
/// A key that is no regular file (a FIFO its writer fed once) cannot be read again: the
/// one in use stays, unchecked.
fn same_key(path: &Path, in_use: &Key) -> Result<(), String> {
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read the key file {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Ok(());
    }
    let key = std::fs::File::open(path)
        .map_err(ri2n::KeyReadError::Io)
        .and_then(Key::read_from)
        .map_err(|e| match e {
            ri2n::KeyReadError::Io(e) => {
                format!("cannot read the key file {}: {e}", path.display())
            }
            e => format!("{}: {e}", path.display()),
        })?;
    if key != *in_use {
        return Err(format!(
            "the key in {} changed: restart the daemon for that",
            path.display()
        ));
    }
    Ok(())
}

/// What a connection to a peer carried, on one line.
fn summary(s: &ri2n::ConnectionStats) -> String {
    let links: Vec<String> = s
        .links
        .iter()
        .map(|l| {
            format!(
                "{}->{} {} {:.1} MB sent, {} lost, srtt {} us",
                l.local.ip(),
                l.remote.ip(),
                l.state,
                l.bytes_sent as f64 / 1e6,
                l.packets_lost,
                l.current_rtt()
                    .map_or("-".to_owned(), |d| d.as_micros().to_string())
            )
        })
        .collect();
    format!(
        "datagrams sent {} (again after a link failure {}, dropped unsent {}), received {} \
         (dropped {}, duplicate {}; pieces held for their order {}); links: {}",
        s.datagrams_sent,
        s.datagrams_resent,
        s.datagrams_send_dropped,
        s.datagrams_received,
        s.datagrams_receive_dropped,
        s.datagrams_duplicate,
        s.datagrams_reordered,
        links.join("; ")
    )
}

/// A file removed when this is dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(links: &[&str]) -> Host {
        Host {
            name: "node1".into(),
            address: "10.99.0.1".parse().unwrap(),
            links: links.iter().map(|a| a.parse().unwrap()).collect(),
        }
    }

    /// A host's own links set its MTU: 1426 bytes (a keyed datagram in a 1472-byte UDP
    /// payload) over IPv4, 20 less where one of its links is IPv6, whatever the other hosts
    /// of the cluster have (they may come and go on a reload; its own links cannot).
    #[test]
    fn the_interface_mtu_follows_the_hosts_own_links() {
        assert_eq!(interface_mtu(&host(&["10.0.1.1", "10.0.2.1"])), 1426);
        assert_eq!(interface_mtu(&host(&["10.0.1.1", "fd00:2::1"])), 1406);
        assert_eq!(interface_mtu(&host(&["fd00:1::1"])), 1406);
    }
}
