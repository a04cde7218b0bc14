//! `ri2n tunnel`: every IP application of a cluster gets ri2n's links, unchanged.
//!
//! Each host runs one daemon with the same cluster file: a TUN interface holding the host's
//! tunnel address, one ri2n endpoint on the host's address on every network, and one
//! connection to every other host (the one listed first connects, again and again while the
//! other is away). Each IP packet read from the interface travels to the host owning its
//! destination as one unreliable datagram (docs/PROTOCOL.md §5.9): inner TCP keeps the only
//! recovery loop for congestion loss, and sees a link failure or an outage as delay, not
//! loss. Threads, however many peers: one reads the interface and routes; one connects to
//! the peers, accepts them and writes what every connection receives to the interface, with
//! the interface's TCP offloads (`peer_loop`, `offload`); one samples the status. A link
//! address missing at start is taken up later (`links`).

mod config;
mod device;
mod links;
mod offload;
mod peer_loop;
mod peers;
mod status;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use ri2n::{ConnectionConfig, Endpoint, EndpointConfig};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

use crate::error::{Failure, BIND, GENERIC, USAGE};
use crate::{Carry, TunnelArgs, TunnelStatusArgs};
use config::Cluster;
use device::Tun;
use peers::Peers;

/// How long a connecting host waits for a peer's answer before trying again.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Received packets a connection keeps for the interface (the engine's default, 1 MiB, is
/// 4 ms of two 1 Gbit/s links: a writer that misses a few milliseconds of CPU would drop).
const RECEIVE_BUFFER: usize = 4 << 20;

/// Every connection of the tunnel, named by its carry in the handshake: no deadline on an
/// outage (a host away for minutes is taken back when it returns, and packets wait for a
/// link meanwhile).
fn connection_config(carry: Carry) -> ConnectionConfig {
    let application = match carry {
        Carry::Datagrams => crate::net::Application::Tunnel,
        Carry::Messages => crate::net::Application::TunnelMessages,
    };
    application
        .configure(ConnectionConfig::default())
        .with_handshake_timeout(CONNECT_TIMEOUT)
        .with_datagram_receive_buffer(RECEIVE_BUFFER)
}

/// `ri2n tunnel --config FILE [--name HOST]`: runs until SIGINT or SIGTERM; SIGHUP reads the
/// cluster file again.
pub fn run(args: &TunnelArgs) -> Result<(), Failure> {
    let (cluster, me) = load(&args.config, args.name.as_deref())?;
    let key = crate::key::load(&crate::ChannelOpts::with_key(Some(cluster.key.clone())))?
        .expect("a key path was given");
    let host = cluster.hosts[me].clone();
    let port = cluster.port;
    let locals: Vec<SocketAddr> = host
        .links
        .iter()
        .map(|&ip| SocketAddr::new(ip, port))
        .collect();
    let carry = args.carry;
    let endpoint_config = move |addrs: Vec<SocketAddr>| {
        // one shard: the peer loop receives on its sockets itself (`peer_loop`)
        EndpointConfig::new(addrs)
            .server()
            .with_shards(Some(1))
            .with_key(Some(key.clone()))
            .with_server_connection(connection_config(carry))
    };
    let (endpoint, missing) = links::bind_present(&locals, &endpoint_config)?;
    let present: Vec<SocketAddr> = (locals.iter().copied())
        .filter(|a| !missing.contains(a))
        .collect();

    // the interface's MTU is what one packet carries on every link: an inner packet that is
    // not a large TCP segment goes unsplit (and is lost alone)
    let ipv6 = cluster
        .hosts
        .iter()
        .flat_map(|h| &h.links)
        .any(IpAddr::is_ipv6);
    let base = ConnectionConfig::default().max_datagram_size - if ipv6 { 20 } else { 0 };
    let mtu = ri2n::datagram_capacity(base, true);
    let tun = Tun::create(&cluster.interface, host.address, cluster.prefix, mtu)
        .map_err(|e| Failure::new(GENERIC, e))?;
    eprintln!(
        "ri2n tunnel: {} is {}/{} on {} (MTU {mtu}); links {}; {} peers",
        host.name,
        host.address,
        cluster.prefix,
        cluster.interface,
        crate::error::list(&present),
        cluster.hosts.len() - 1
    );

    let interface = cluster.interface.clone();
    let peers = Arc::new(Peers::new(cluster, me, args.carry, endpoint));
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .map_err(|e| Failure::io("cannot watch SIGINT, SIGTERM and SIGHUP", &e))?;

    let latest = Arc::new(Mutex::new(status::Status {
        host: host.name.clone(),
        address: host.address.to_string(),
        interface: interface.clone(),
        peers: Vec::new(),
    }));
    {
        let (peers, latest) = (peers.clone(), latest.clone());
        thread::spawn(move || status::sample_loop(peers, latest));
    }
    let socket = status::socket_path(&host.name);
    status::serve_socket(&socket, latest.clone()).map_err(|e| {
        Failure::io(
            format!("cannot serve the status on {}", socket.display()),
            &e,
        )
    })?;
    if let Some(addr) = args.metrics {
        status::serve_metrics(addr, latest)
            .map_err(|e| Failure::new(BIND, format!("cannot serve metrics on {addr}: {e}")))?;
    }

    let peer_loop = peer_loop::start(peers.clone(), tun_handle(&tun)?)
        .map_err(|e| Failure::io("cannot start the peer loop", &e))?;
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
    {
        let (peers, tun) = (peers.clone(), tun_handle(&tun)?);
        thread::spawn(move || route_loop(&peers, &tun));
    }

    let signal = loop {
        match signals.forever().next().unwrap_or(SIGTERM) {
            SIGHUP => reload(&peers, args, &peer_loop),
            other => break other,
        }
    };
    eprintln!(
        "ri2n tunnel: {}: closing the connections and removing {interface}",
        if signal == SIGINT {
            "SIGINT"
        } else {
            "SIGTERM"
        },
    );
    for peer in &peers.table().peers {
        if let Some(c) = peer.conn() {
            eprintln!("ri2n tunnel: {}: {}", peer.name(), summary(&c.stats()));
            c.abort(0, "the tunnel on the peer stopped");
        }
    }
    let _ = std::fs::remove_file(&socket);
    if let Some((_, endpoint)) = peers.endpoint.get() {
        let _ = endpoint.close(Some(Duration::from_millis(500)));
    }
    // returning ends the process, which closes the interface: the kernel removes it
    Ok(())
}

/// The cluster file at `path` and this host's position in it (named `name`, else found by
/// its link addresses); errors exit 2.
fn load(path: &Path, name: Option<&str>) -> Result<(Cluster, usize), Failure> {
    let cluster = Cluster::load(path).map_err(|e| Failure::new(USAGE, e.to_string()))?;
    let me = cluster
        .find_self(name)
        .map_err(|e| Failure::new(USAGE, format!("{}: {e}", path.display())))?;
    Ok((cluster, me))
}

/// SIGHUP: reads the cluster file again and puts it in use (see [`Peers::reload`]); a file
/// that cannot be used is logged and the one in use kept.
fn reload(peers: &Arc<Peers>, args: &TunnelArgs, peer_loop: &peer_loop::Handle) {
    let me = peers.table().me().name.clone();
    let loaded = load(&args.config, Some(&me))
        .map_err(|f| f.message)
        .and_then(|(cluster, me)| peers.reload(cluster, me));
    match loaded {
        Ok(added) => {
            eprintln!("ri2n tunnel: SIGHUP: {} read again", args.config.display());
            for peer in added.into_iter().filter(|p| p.connects) {
                peer_loop.connect_to(peer);
            }
        }
        Err(e) => eprintln!("ri2n tunnel: SIGHUP: the cluster file in use is kept: {e}"),
    }
}

fn tun_handle(tun: &Tun) -> Result<Tun, Failure> {
    tun.try_clone()
        .map_err(|e| Failure::io("cannot duplicate the TUN descriptor", &e))
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
                crate::report::current_rtt(l).map_or("-".to_owned(), |d| d.as_micros().to_string())
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

/// Packets read from the interface, or received from a peer, handled in one go.
const BATCH: usize = 64;
/// Bytes read from the interface in one go, at most (and one more read).
const BATCH_BYTES: usize = 128 * 1024;

/// Reads the interface and sends each IPv4 packet to the host owning its destination. The
/// packets waiting are read in a batch and handed to each peer's connection in one call, so
/// the connection's lock is taken and its packets are sent once per batch, not per packet.
/// A large TCP segment goes as one datagram, which the connection carries in pieces that
/// fill its packets: inner TCP's headers then cost 52 bytes per 64 KB instead of per 1.4 KB,
/// and the peer writes it to its interface as it came. (Carried as messages, a segment is
/// cut to the MTU.)
fn route_loop(peers: &Peers, tun: &Tun) {
    // a read may return a TCP segment of up to 64 KB (TSO)
    let mut buf = vec![0u8; 1 << 16];
    let mut packets = offload::Packets::default();
    let mut dests: Vec<usize> = Vec::new();
    let mut batch_peers: Vec<usize> = Vec::new();
    loop {
        if let Err(e) = tun.wait_readable() {
            eprintln!("ri2n tunnel: waiting for the interface failed: {e}");
            std::process::exit(i32::from(GENERIC));
        }
        packets.clear();
        dests.clear();
        // the peers as the cluster file says now, by position
        let table = peers.table();
        // about BATCH packets or BATCH_BYTES: a batch of 64 large segments would be 4 MB,
        // more than a connection queues (it would drop the oldest)
        let mut bytes = 0;
        while packets.len() < BATCH && bytes < BATCH_BYTES {
            match tun.read(&mut buf) {
                Ok((header, len)) => {
                    let dest = destination(&table, &buf[..len]).unwrap_or(usize::MAX);
                    let packet = &buf[..len];
                    let added = match peers.carry {
                        // large TCP segments whole: their headers once per 64 KB
                        Carry::Datagrams => offload::carry_whole(&header, packet, &mut packets),
                        Carry::Messages => offload::split(&header, packet, &mut packets),
                    };
                    dests.extend(std::iter::repeat_n(dest, added));
                    bytes += len;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    eprintln!("ri2n tunnel: reading the interface failed: {e}");
                    std::process::exit(i32::from(GENERIC));
                }
            }
        }
        // the peers this batch goes to, each once (not every host of the cluster in turn)
        batch_peers.clear();
        batch_peers.extend(dests.iter().copied().filter(|&d| d != usize::MAX));
        batch_peers.sort_unstable();
        batch_peers.dedup();
        for &k in &batch_peers {
            let peer = &table.peers[k];
            if let Some(conn) = peer.conn() {
                // a connection just lost, or (messages) a full send buffer: the packets are
                // dropped, as on a dead cable or a full NIC queue
                match peers.carry {
                    Carry::Datagrams => {
                        // the buffers themselves: the connection sends them without a copy
                        // and leaves spare ones for the next reads
                        let batch = packets
                            .bufs_mut()
                            .iter_mut()
                            .zip(&dests)
                            .filter(|(_, &d)| d == k)
                            .map(|(b, _)| b);
                        let mut n = 0;
                        let _ = conn.send_datagram_bufs(batch.inspect(|_| n += 1));
                        peer.sent.fetch_add(n, Ordering::Relaxed);
                    }
                    Carry::Messages => {
                        for j in (0..packets.len()).filter(|&j| dests[j] == k) {
                            if conn.try_send_message(packets.get(j)).is_ok() {
                                peer.sent.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The peer owning an IPv4 packet's destination; None for anything else (IPv6, an address
/// no host owns): dropped, as a router without a route would.
fn destination(table: &peers::Table, packet: &[u8]) -> Option<usize> {
    if packet.len() < 20 || packet[0] >> 4 != 4 {
        return None;
    }
    table.by_tunnel_address(Ipv4Addr::new(
        packet[16], packet[17], packet[18], packet[19],
    ))
}

/// `ri2n tunnel status`: the running daemon's view of every peer and link.
pub fn status(args: &TunnelStatusArgs) -> Result<(), Failure> {
    let (cluster, me) = load(&args.config, args.name.as_deref())?;
    let s = status::query(&cluster.hosts[me].name).map_err(|e| Failure::new(GENERIC, e))?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&s).map_err(|e| Failure::new(GENERIC, e.to_string()))?
        );
    } else {
        print!("{}", status::table(&s));
    }
    Ok(())
}

/// Checks a cluster file and prints what this host would be (used by `--check`).
pub fn describe(path: &Path, name: Option<&str>) -> Result<String, Failure> {
    let (cluster, me) = load(path, name)?;
    // the daemon would fail on it at once: the key file is part of the configuration
    crate::key::load(&crate::ChannelOpts::with_key(Some(cluster.key.clone())))?;
    let h = &cluster.hosts[me];
    Ok(format!(
        "{}: {} hosts; this host is {} ({}/{} on {})",
        path.display(),
        cluster.hosts.len(),
        h.name,
        h.address,
        cluster.prefix,
        cluster.interface
    ))
}
