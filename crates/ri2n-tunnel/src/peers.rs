//! The cluster as the daemon sees it: every other host with its connection, found by tunnel
//! address (routing) and by link address (accepting). Reading the cluster file again
//! (SIGHUP) replaces the whole table, keeping each host whose entry and role did not change,
//! with its connection and its loop; a removed or changed host's loop stops and its
//! connection ends.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::time::Duration;

use ri2n::Connection;
use serde::{Deserialize, Serialize};

use crate::config::{Cluster, Host};
use crate::links;
use crate::Carry;

/// One other host of the cluster.
pub struct Peer {
    pub host: Host,
    /// This host connects to it (it is listed after this host); otherwise it connects here.
    pub connects: bool,
    conn: RwLock<Option<Arc<Connection>>>,
    /// Its counts since the daemon started.
    counts: Arc<PeerCounts>,
    /// Connections a newer one replaced, still running until their end is found, with what
    /// each had dropped and moved when replaced (counted then): what they do later counts at
    /// their end.
    replaced: Mutex<Vec<(Weak<Connection>, Counted)>>,
    /// Packets from it with another host's source address were refused and logged: the
    /// log says so once.
    refusal_logged: AtomicBool,
    /// A failed write to the interface of a packet from it was logged.
    write_failure_logged: AtomicBool,
    /// No longer in the cluster file as it was: its loop stops, its connection ends.
    removed: AtomicBool,
    /// Why it is not connected: the last attempt to connect failed (connecting side), or its
    /// last connection was lost; for the status.
    waiting_for: Mutex<Option<String>>,
    /// Which of its link addresses the next handshake goes to (connecting side; see
    /// [`Peer::remotes`]).
    first_remote: AtomicUsize,
}

/// A peer's counts since the daemon started, shared by the [`Peer`]s that reloads made for
/// the same host name: a changed entry (its link addresses, say), or a host taken out of the
/// file and put back, does not start its counters again, and what its old connection does
/// until its end still counts. The status
/// shows them, each with the current connection's own added (they do not start again at
/// each reconnection: Prometheus counters go back only when the daemon restarts).
#[derive(Default)]
struct PeerCounts {
    /// IP packets handed to its connections, and received from them, whatever carried them
    /// (datagrams or messages).
    sent: AtomicU64,
    received: AtomicU64,
    /// IP packets for it that no connection took (none was up, its send queue was full),
    /// and those its ended connections dropped unsent.
    dropped_sending: AtomicU64,
    /// IP packets from it dropped on arrival: by its ended connections, or not written to
    /// the interface.
    dropped_receiving: AtomicU64,
    /// What its ended connections moved on each link, by the link's addresses.
    ended_links: Mutex<LinkTotals>,
}

impl Peer {
    fn new(host: Host, connects: bool, counts: Arc<PeerCounts>) -> Peer {
        Peer {
            host,
            connects,
            conn: RwLock::new(None),
            counts,
            replaced: Mutex::new(Vec::new()),
            refusal_logged: AtomicBool::new(false),
            write_failure_logged: AtomicBool::new(false),
            removed: AtomicBool::new(false),
            waiting_for: Mutex::new(None),
            first_remote: AtomicUsize::new(0),
        }
    }

    /// Why it is not connected, as far as this side knows.
    pub fn waiting_for(&self) -> String {
        let reason = self.waiting_for.lock().unwrap_or_else(|e| e.into_inner());
        match (&*reason, self.connects) {
            (Some(r), _) => r.clone(),
            (None, true) => "not tried yet".into(),
            (None, false) => "it connects to this host, and has not yet".into(),
        }
    }

    /// Why it is not connected, if known.
    pub fn waiting_reason(&self) -> Option<String> {
        self.waiting_for
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// It is not connected, for `reason` (`None`: it is).
    pub fn set_waiting_for(&self, reason: Option<String>) {
        *self.waiting_for.lock().unwrap_or_else(|e| e.into_inner()) = reason;
    }

    pub fn name(&self) -> &str {
        &self.host.name
    }

    /// Its link addresses on `port`, for a handshake, which goes to the first of them first
    /// and, while that one does not answer, to the others in turn (the rest become links once
    /// it is done: docs/PROTOCOL.md §4.1). After a handshake that failed the next address
    /// comes first: one the connect call itself cannot start with (no local address of its
    /// family) costs one attempt, not every one.
    pub fn remotes(&self, port: u16) -> Vec<SocketAddr> {
        let links = &self.host.links;
        let first = self.first_remote.load(Ordering::Relaxed) % links.len().max(1);
        (links[first..].iter().chain(&links[..first]))
            .map(|&ip| SocketAddr::new(ip, port))
            .collect()
    }

    /// A handshake with it failed: the next one goes to its next link address.
    pub fn handshake_failed(&self) {
        self.first_remote.fetch_add(1, Ordering::Relaxed);
    }

    /// Its connection, if one is up.
    pub fn conn(&self) -> Option<Arc<Connection>> {
        self.conn.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Its connection now, if one is up, with the connection's statistics, its packet
    /// counts (those dropped take in that connection's) and what its ended connections moved
    /// on each link, read together: a connection replaced or ended meanwhile hands its
    /// counts over under the same lock ([`Self::set`], [`Self::clear`]), so they are counted
    /// once and no count goes back.
    pub fn sample(&self) -> PeerSample {
        let slot = self.conn.read().unwrap_or_else(|e| e.into_inner());
        let current = slot.as_ref().map(|c| (c.clone(), c.stats()));
        let dropped = self.packets_dropped(current.as_ref().map(|(_, s)| s));
        let ended_links = (self.counts.ended_links.lock()).unwrap_or_else(|e| e.into_inner());
        PeerSample {
            current,
            sent: self.counts.sent.load(Ordering::Relaxed),
            received: self.counts.received.load(Ordering::Relaxed),
            dropped,
            ended_links: ended_links.clone(),
        }
    }

    /// Makes `conn` the way to it (a newer connection replaces an older one).
    pub fn set(&self, conn: Arc<Connection>) {
        let mut slot = self.conn.write().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = slot.replace(conn) {
            self.retire(&old);
        }
    }

    /// `old` is no longer its connection and runs on until its end is found: what it
    /// dropped and moved so far counts now, the rest at its end ([`Self::clear`]). Call with
    /// the connection's slot locked for writing.
    fn retire(&self, old: &Arc<Connection>) {
        let so_far = self.count_ended(old, &Counted::default());
        let mut replaced = self.replaced.lock().unwrap_or_else(|e| e.into_inner());
        replaced.retain(|(c, _)| c.strong_count() > 0);
        replaced.push((Arc::downgrade(old), so_far));
    }

    /// `conn` ended: forgotten, unless a newer one replaced it meanwhile.
    pub fn clear(&self, conn: &Arc<Connection>) {
        let mut slot = self.conn.write().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *slot = None;
            self.count_ended(conn, &Counted::default());
            return;
        }
        let mut replaced = self.replaced.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = replaced
            .iter()
            .position(|(c, _)| c.as_ptr() == Arc::as_ptr(conn))
        {
            let (_, counted) = replaced.swap_remove(i);
            self.count_ended(conn, &counted);
        }
    }

    /// `n` IP packets were handed to its connection.
    pub fn count_sent(&self, n: u64) {
        self.counts.sent.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` IP packets from it were written to the interface.
    pub fn count_received(&self, n: u64) {
        self.counts.received.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` IP packets for it were dropped before a connection took them.
    pub fn drop_packets(&self, n: u64) {
        self.counts.dropped_sending.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` IP packets from it were received and not written to the interface.
    fn drop_received(&self, n: u64) {
        self.counts
            .dropped_receiving
            .fetch_add(n, Ordering::Relaxed);
    }

    /// `n` IP packets from it were not written to the interface (`first` says why for one of
    /// them): a host of the cluster sends only its own packets (from its tunnel address) to
    /// this host's tunnel address. They count as dropped, and the first refusal is logged.
    pub fn refuse_packets(&self, n: u64, first: crate::peer_loop::Refusal) {
        self.drop_received(n);
        if !self.refusal_logged.swap(true, Ordering::Relaxed) {
            eprintln!(
                "ri2n tunnel: {}: dropped IP packets {first}: a host sends only from its own \
                 tunnel address ({}) to this host's; counted in its dropped packets, said once",
                self.name(),
                self.host.address
            );
        }
    }

    /// `n` IP packets from it were not written: the interface refused the writes (it is
    /// down or gone, or would not take a segment; `e` says why for the first). They count as
    /// dropped, and the first failure is logged.
    pub fn fail_writes(&self, n: u64, e: &std::io::Error) {
        self.drop_received(n);
        if !self.write_failure_logged.swap(true, Ordering::Relaxed) {
            eprintln!(
                "ri2n tunnel: {}: dropped IP packets from it: writing them to the interface \
                 failed ({e}); counted in its dropped packets, said once",
                self.name()
            );
        }
    }

    /// IP packets for it dropped so far: by the tunnel, by its ended connections and by
    /// `current` (its connection now, if any).
    fn packets_dropped(&self, current: Option<&ri2n::ConnectionStats>) -> Dropped {
        let now = current.map_or_else(Dropped::default, Dropped::by);
        Dropped {
            sending: self.counts.dropped_sending.load(Ordering::Relaxed) + now.sending,
            receiving: self.counts.dropped_receiving.load(Ordering::Relaxed) + now.receiving,
        }
    }

    /// What `conn`, no longer its connection, dropped and moved beyond what was `counted` of
    /// it before counts on as the peer's; returns all it dropped and moved so far. Called
    /// with the connection slot's lock held.
    fn count_ended(&self, conn: &Connection, counted: &Counted) -> Counted {
        let s = conn.stats();
        let now = Counted {
            dropped: Dropped::by(&s),
            links: link_totals(&s.links),
        };
        self.drop_packets(now.dropped.sending.saturating_sub(counted.dropped.sending));
        self.drop_received(
            now.dropped
                .receiving
                .saturating_sub(counted.dropped.receiving),
        );
        let mut ended = (self.counts.ended_links.lock()).unwrap_or_else(|e| e.into_inner());
        for (key, n) in &now.links {
            let before = counted.links.get(key).copied().unwrap_or_default();
            ended.entry(*key).or_default().add(&n.since(&before));
        }
        now
    }

    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    fn remove(&self) {
        self.removed.store(true, Ordering::Release);
        // A changed entry's new peer shares its counts: what the connection moved so far
        // counts there now, as for a connection replaced. Left in the slot until the loop
        // finds its end, it was missing from the new peer's counts meanwhile, and a counter
        // that goes back reads as a restart to Prometheus.
        let mut slot = self.conn.write().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = slot.take() {
            self.retire(&c);
            drop(slot);
            c.abort(
                0,
                "the peer's cluster file no longer lists this host as it was",
            );
        }
    }
}

/// A link of a peer, by its local and remote address: what a connection moved on it counts
/// on in the next connection's link between the same two addresses.
pub type LinkKey = (IpAddr, IpAddr);

/// The key of link `l`.
pub fn link_key(l: &ri2n::LinkStats) -> LinkKey {
    (l.local.ip(), l.remote.ip())
}

/// The counts of a link that are totals since the daemon started.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LinkCounts {
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub packets_lost: u64,
}

impl LinkCounts {
    pub fn of(l: &ri2n::LinkStats) -> Self {
        Self {
            bytes_sent: l.bytes_sent,
            bytes_received: l.bytes_received,
            packets_lost: l.packets_lost,
        }
    }

    pub fn add(&mut self, other: &LinkCounts) {
        self.bytes_sent += other.bytes_sent;
        self.bytes_received += other.bytes_received;
        self.packets_lost += other.packets_lost;
    }

    /// What was counted after `before` (a count read earlier of the same links).
    fn since(&self, before: &LinkCounts) -> LinkCounts {
        LinkCounts {
            bytes_sent: self.bytes_sent.saturating_sub(before.bytes_sent),
            bytes_received: self.bytes_received.saturating_sub(before.bytes_received),
            packets_lost: self.packets_lost.saturating_sub(before.packets_lost),
        }
    }
}

pub type LinkTotals = HashMap<LinkKey, LinkCounts>;

/// The counts of `links` (one connection's), by link addresses.
pub fn link_totals(links: &[ri2n::LinkStats]) -> LinkTotals {
    let mut totals = LinkTotals::new();
    for l in links {
        totals
            .entry(link_key(l))
            .or_default()
            .add(&LinkCounts::of(l));
    }
    totals
}

/// IP packets of a peer dropped on the way out (unsent) and on the way in (received, not
/// written to the interface).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    pub sending: u64,
    pub receiving: u64,
}

impl Dropped {
    /// What connection statistics `s` count.
    fn by(s: &ri2n::ConnectionStats) -> Self {
        Dropped {
            sending: s.datagrams_send_dropped,
            receiving: s.datagrams_receive_dropped,
        }
    }

    pub fn total(&self) -> u64 {
        self.sending + self.receiving
    }
}

/// What was counted of a connection when it stopped being the peer's.
#[derive(Default)]
struct Counted {
    dropped: Dropped,
    links: LinkTotals,
}

/// A peer's connection and counts at one moment ([`Peer::sample`]).
pub struct PeerSample {
    /// Its connection, if one is up, with the connection's statistics.
    pub current: Option<(Arc<Connection>, ri2n::ConnectionStats)>,
    /// IP packets handed to its connections, and received from them, since the daemon
    /// started.
    pub sent: u64,
    pub received: u64,
    /// IP packets dropped for it, and from it, since the daemon started.
    pub dropped: Dropped,
    /// What its ended connections moved on each link.
    pub ended_links: LinkTotals,
}

/// The cluster file as read last, with a [`Peer`] for every host but this one.
pub struct Table {
    pub cluster: Cluster,
    pub me: usize,
    /// In the file's order.
    pub peers: Vec<Arc<Peer>>,
    by_tunnel_address: HashMap<Ipv4Addr, usize>,
    by_link_address: HashMap<IpAddr, usize>,
}

impl Table {
    /// Host `me` of `cluster`; a host keeps its [`Peer`] from `old` when its entry and its
    /// role are unchanged, and a new one takes its name's `counts`.
    fn new(cluster: Cluster, me: usize, old: Option<&Table>, counts: &mut CountsByName) -> Table {
        let peers: Vec<Arc<Peer>> = (cluster.hosts.iter().enumerate())
            .filter(|&(i, _)| i != me)
            .map(|(i, h)| {
                let connects = i > me;
                let kept = old.and_then(|t| {
                    (t.peers.iter())
                        .find(|p| p.host == *h && p.connects == connects && !p.is_removed())
                });
                kept.cloned().unwrap_or_else(|| {
                    let counts = counts.entry(h.name.clone()).or_default().clone();
                    Arc::new(Peer::new(h.clone(), connects, counts))
                })
            })
            .collect();
        let by_tunnel_address = (peers.iter().enumerate())
            .map(|(k, p)| (p.host.address, k))
            .collect();
        let by_link_address = (peers.iter().enumerate())
            .flat_map(|(k, p)| p.host.links.iter().map(move |&ip| (ip, k)))
            .collect();
        Table {
            cluster,
            me,
            peers,
            by_tunnel_address,
            by_link_address,
        }
    }

    pub fn me(&self) -> &Host {
        &self.cluster.hosts[self.me]
    }

    /// The peer owning tunnel address `dst`, by position.
    pub fn by_tunnel_address(&self, dst: Ipv4Addr) -> Option<usize> {
        self.by_tunnel_address.get(&dst).copied()
    }

    /// The host a connection accepted from `remote` comes from, if it is one this host
    /// accepts (listed before it) and it comes from the cluster's port, where that host's
    /// daemon is bound.
    pub fn accepted_from(&self, remote: SocketAddr) -> Option<&Arc<Peer>> {
        let p = &self.peers[*self.by_link_address.get(&remote.ip())?];
        (remote.port() == self.cluster.port && !p.connects).then_some(p)
    }
}

/// Everything the daemon's threads share.
/// The counts of every host the cluster file listed since the daemon started, by name (a
/// few counters each, kept for a host taken out of the file in case it comes back).
type CountsByName = HashMap<String, Arc<PeerCounts>>;

pub struct Peers {
    table: RwLock<Arc<Table>>,
    counts: Mutex<CountsByName>,
    pub carry: Carry,
    /// This host's endpoint (made again when a missing link address appears).
    pub endpoint: links::Current,
    /// Packets read from each of the interface's queues (how evenly the flows spread).
    pub queue_reads: Box<[AtomicU64]>,
    /// IPv4 packets read from the interface for an address no host of the cluster owns
    /// (each answered as a router without a route answers: see `route.rs`).
    pub unrouted: AtomicU64,
    /// Packets read from the interface that are not IPv4 (IPv6, which the kernel sends on
    /// the interface too, or no valid IP packet): the tunnel carries IPv4 only.
    pub not_ipv4: AtomicU64,
    /// IPv4 TCP packets read from the interface with a wrong IP header or TCP checksum that
    /// the kernel did not leave to the device (a raw socket's): not carried
    /// ([`crate::offload::checksums_hold`]).
    pub bad_checksum: AtomicU64,
    /// The readings of the cluster file after the start: how many, and what the last did;
    /// signalled at each (see [`Peers::wait_reload`]).
    reloads: Mutex<(u64, Option<Reload>)>,
    reloaded: Condvar,
}

/// What a reading of the cluster file after the start (SIGHUP, `ri2n tunnel reload`) did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reload {
    /// The hosts it added and removed, by name (a changed host is both).
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Why it was refused (the file in use was kept); none if it was taken up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Reload {
    /// What it did, in the words `ri2n tunnel reload` and `ri2n tunnel status` print:
    /// `added c, d; removed none`, or `refused: REASON`.
    pub fn changes(&self) -> String {
        if let Some(e) = &self.error {
            return format!("refused: {e}");
        }
        let list = |names: &[String]| {
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        };
        format!(
            "added {}; removed {}",
            list(&self.added),
            list(&self.removed)
        )
    }
}

impl Peers {
    pub fn new(
        cluster: Cluster,
        me: usize,
        carry: Carry,
        endpoint: Option<ri2n::Endpoint>,
        queues: usize,
    ) -> Peers {
        let mut counts = CountsByName::new();
        Peers {
            table: RwLock::new(Arc::new(Table::new(cluster, me, None, &mut counts))),
            counts: Mutex::new(counts),
            carry,
            endpoint: links::Current::new(endpoint),
            queue_reads: (0..queues).map(|_| AtomicU64::new(0)).collect(),
            unrouted: AtomicU64::new(0),
            not_ipv4: AtomicU64::new(0),
            bad_checksum: AtomicU64::new(0),
            reloads: Mutex::default(),
            reloaded: Condvar::new(),
        }
    }

    /// Records what a reading of the cluster file did, once it was put in use (or refused).
    pub fn reloaded(&self, what: Reload) {
        let mut r = self.reloads.lock().unwrap_or_else(|e| e.into_inner());
        *r = (r.0 + 1, Some(what));
        self.reloaded.notify_all();
    }

    /// Waits until there were more than `seen` readings of the cluster file, at most `limit`.
    pub fn wait_reload(&self, seen: u64, limit: Duration) {
        let r = self.reloads.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self
            .reloaded
            .wait_timeout_while(r, limit, |r| r.0 <= seen)
            .unwrap_or_else(|e| e.into_inner());
    }

    /// How many readings of the cluster file there were, and what the last did.
    pub fn reloads(&self) -> (u64, Option<Reload>) {
        self.reloads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The table in use.
    pub fn table(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts the cluster file read again in use, host `me` of it. Refused (with the reason)
    /// where it changes what this host is or what its endpoint and interface are: that takes
    /// a restart. Returns the peers that are new (this host is to connect to those that
    /// `connects`) and the names of those removed, and says in the log what changed.
    pub fn reload(
        &self,
        cluster: Cluster,
        me: usize,
    ) -> Result<(Vec<Arc<Peer>>, Vec<String>), String> {
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        let (old, new) = (&table.cluster, &cluster);
        if new.hosts[me] != old.hosts[table.me] {
            return Err("this host's own entry changed: restart the daemon for that".into());
        }
        // (the key is compared by its contents, not its path: see `same_key` in lib.rs)
        let changed: Vec<&str> = [
            ("port", new.port != old.port),
            ("interface", new.interface != old.interface),
            ("prefix", new.prefix != old.prefix),
        ]
        .into_iter()
        .filter_map(|(what, changed)| changed.then_some(what))
        .collect();
        if !changed.is_empty() {
            return Err(format!(
                "the {} changed: restart the daemon for that",
                changed.join(" and ")
            ));
        }
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let next = Table::new(cluster, me, Some(&table), &mut counts);
        let kept = |p: &Arc<Peer>, t: &Table| t.peers.iter().any(|q| Arc::ptr_eq(p, q));
        let mut removed = Vec::new();
        for p in table.peers.iter().filter(|p| !kept(p, &next)) {
            eprintln!(
                "ri2n tunnel: {} removed or changed in the cluster file",
                p.name()
            );
            p.remove();
            removed.push(p.name().to_owned());
        }
        let added: Vec<Arc<Peer>> = (next.peers.iter())
            .filter(|p| !kept(p, &table))
            .cloned()
            .collect();
        for p in &added {
            eprintln!("ri2n tunnel: {} added to the cluster file", p.name());
        }
        *table = Arc::new(next);
        Ok((added, removed))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn cluster(extra: &str) -> Cluster {
        let text = format!("{}{extra}", crate::config::tests::GOOD);
        Cluster::parse(Path::new("/etc/ri2n/cluster.toml"), &text).unwrap()
    }

    const NODE3: &str = "\n[[host]]\nname = \"node3\"\naddress = \"10.99.0.3\"\n\
                         links = [\"10.0.1.3\", \"10.0.2.3\"]\n";

    /// A connection a newer one replaced still runs until its end is found: the datagrams it
    /// drops, and the bytes it receives, meanwhile count as the peer's at that end, so the
    /// counts miss none.
    #[test]
    fn what_a_replaced_connection_drops_and_moves_counts_at_its_end() {
        use ri2n::{ConnectionConfig, Endpoint, EndpointConfig};
        let local = vec!["127.0.0.1:0".parse().unwrap()];
        // one shard: connections confirmed on two could be accepted in the other order, and
        // the far end taken for `old`'s be `new`'s (both come from one client address)
        let server_config = EndpointConfig::new(local.clone()).with_shards(Some(1));
        let server = Endpoint::bind(server_config.server()).unwrap();
        let client = Endpoint::bind(EndpointConfig::new(local)).unwrap();
        // room for a few datagrams only, and nobody reads them
        let config = ConnectionConfig::default().with_datagram_receive_buffer(4096);
        let connect = || {
            Arc::new(
                client
                    .connect(&server.local_addrs(), config.clone())
                    .unwrap(),
            )
        };
        let (old, new) = (connect(), connect());
        let (old_far, _new_far) = (server.accept().unwrap(), server.accept().unwrap());
        let peer = Peer::new(cluster("").hosts[0].clone(), false, Arc::default());
        peer.set(old.clone());
        peer.set(new);
        let received = |t: &LinkTotals| t.values().map(|n| n.bytes_received).sum::<u64>();
        let at_replacement = received(&peer.sample().ended_links);
        for _ in 0..64 {
            old_far.send_datagram(&[7; 1000]).unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let (dropped, arrived) = loop {
            let (s, far) = (old.stats(), old_far.stats());
            // the premise: what the far side sent has arrived (the count takes in those
            // dropped) or was dropped there unsent, and the arrivals overflowed
            if s.datagrams_received + far.datagrams_send_dropped >= 64 {
                break (s.datagrams_receive_dropped, s.datagrams_received);
            }
            assert!(std::time::Instant::now() < deadline, "{s:?}\n{far:?}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert!(dropped > 0);
        assert_eq!(
            peer.sample().dropped.total(),
            0,
            "nothing dropped before the old one ends"
        );
        peer.clear(&old);
        let sample = peer.sample();
        assert_eq!(
            sample.dropped,
            Dropped {
                sending: 0,
                receiving: dropped
            }
        );
        // what arrived after the replacement counts, and nothing twice: the counts are the
        // old connection's own (it still runs: its keepalives may add to them later)
        assert!(
            received(&sample.ended_links) >= at_replacement + arrived * 1000,
            "{:?}",
            sample.ended_links
        );
        let own = link_totals(&old.stats().links);
        for (key, n) in &sample.ended_links {
            let o = own[key];
            assert!(n.bytes_sent <= o.bytes_sent && n.bytes_received <= o.bytes_received);
        }
    }

    /// A changed host's connection runs on after the reload until its loop finds its end:
    /// what it moved counts in the new peer's counts from the reload on, once. Before, they
    /// went back by all it had moved until that end (up to 200 ms later), which Prometheus
    /// reads as a restart of the daemon.
    #[test]
    fn a_changed_hosts_counts_do_not_go_back_while_its_old_connection_ends() {
        use ri2n::{Endpoint, EndpointConfig};
        let local = vec!["127.0.0.1:0".parse().unwrap()];
        let server = Endpoint::bind(EndpointConfig::new(local.clone()).server()).unwrap();
        let client = Endpoint::bind(EndpointConfig::new(local)).unwrap();
        let conn = Arc::new(
            client
                .connect(&server.local_addrs(), Default::default())
                .unwrap(),
        );
        let far = server.accept().unwrap();
        let endpoint = ri2n::Endpoint::server(&["127.0.0.1:0".parse().unwrap()]).unwrap();
        let peers = Peers::new(cluster(NODE3), 0, Carry::Datagrams, Some(endpoint), 1);
        let node3 = peers.table().peers[1].clone();
        node3.set(conn.clone());
        // the premise: the connection moved bytes
        far.send_message(&[7; 20_000]).unwrap();
        assert_eq!(conn.recv_message().unwrap().map(|m| m.len()), Some(20_000));
        let received = |s: &PeerSample| {
            let ended: u64 = s.ended_links.values().map(|n| n.bytes_received).sum();
            let current = s.current.as_ref().map_or(0, |(_, st)| {
                st.links.iter().map(|l| l.bytes_received).sum::<u64>()
            });
            ended + current
        };
        let before = received(&node3.sample());
        assert!(before >= 20_000, "{before}");

        let changed = NODE3.replace("10.0.2.3", "10.0.2.33");
        peers.reload(cluster(&changed), 0).unwrap();
        let new_node3 = peers.table().peers[1].clone();
        assert!(!Arc::ptr_eq(&new_node3, &node3));
        let after_reload = received(&new_node3.sample());
        assert!(after_reload >= before, "{after_reload} after {before}");
        // the loop finds the old connection's end: counted once
        node3.clear(&conn);
        let at_end = received(&new_node3.sample());
        let own: u64 = conn.stats().links.iter().map(|l| l.bytes_received).sum();
        assert!(
            after_reload <= at_end && at_end <= own,
            "{after_reload}, then {at_end}; the connection's own {own}"
        );
    }

    /// A newly accepted connection replaces a host's current one, so only one from a host
    /// listed before this one, on one of its link addresses and from the cluster's port
    /// (where that host's daemon is bound), is taken for it.
    #[test]
    fn a_connection_is_taken_for_a_peer_only_from_its_address_and_the_cluster_port() {
        let table = Table::new(cluster(NODE3), 1, None, &mut CountsByName::new());
        let from = |s: &str| {
            table
                .accepted_from(s.parse().unwrap())
                .map(|p| p.name().to_owned())
        };
        assert_eq!(from("10.0.1.1:7500").as_deref(), Some("node1"));
        assert_eq!(from("10.0.2.1:7500").as_deref(), Some("node1"));
        // another port of that host: not its daemon
        assert_eq!(from("10.0.1.1:7501"), None);
        assert_eq!(from("10.0.1.1:40000"), None);
        // a host listed after this one connects to us, never the other way round
        assert_eq!(from("10.0.1.3:7500"), None);
        // an address of no host, and this host's own
        assert_eq!(from("10.0.1.9:7500"), None);
        assert_eq!(from("10.0.1.2:7500"), None);
    }

    /// Reading the file again keeps each host whose entry and role are unchanged (its peer,
    /// so its connection and its loop), drops a changed one and adds a new one, whose counts
    /// go on from the changed one's; it refuses a change of this host's own entry.
    #[test]
    fn a_reload_keeps_the_unchanged_hosts_and_refuses_a_change_of_this_one() {
        let endpoint = ri2n::Endpoint::server(&["127.0.0.1:0".parse().unwrap()]).unwrap();
        let peers = Peers::new(cluster(NODE3), 0, Carry::Datagrams, Some(endpoint), 1);
        let before = peers.table();
        let (node2, node3) = (before.peers[0].clone(), before.peers[1].clone());
        assert_eq!((node2.name(), node2.connects), ("node2", true));
        node3.count_sent(5);
        node3.drop_packets(2);

        // node3 moves to another address, node4 joins
        let changed = NODE3.replace("10.0.2.3", "10.0.2.33")
            + "\n[[host]]\nname = \"node4\"\naddress = \"10.99.0.4\"\nlinks = [\"10.0.1.4\"]\n";
        let (added, removed) = peers.reload(cluster(&changed), 0).unwrap();
        assert_eq!(removed, ["node3"]);
        let after = peers.table();
        assert!(Arc::ptr_eq(&after.peers[0], &node2), "node2 is kept");
        assert!(node3.is_removed() && !node2.is_removed());
        let names: Vec<&str> = added.iter().map(|p| p.name()).collect();
        assert_eq!(names, ["node3", "node4"]);
        assert_eq!(
            after.by_tunnel_address("10.99.0.4".parse().unwrap()),
            Some(2)
        );
        // the changed node3's counts go on, also what the old one counts until its end
        // (before, they started again from zero); the new node4's start from zero
        let new_node3 = &after.peers[1];
        assert!(!Arc::ptr_eq(new_node3, &node3));
        node3.count_received(1);
        let counts = |p: &Peer| {
            let s = p.sample();
            (s.sent, s.received, s.dropped.sending)
        };
        assert_eq!(counts(new_node3), (5, 1, 2));
        assert_eq!(counts(&after.peers[2]), (0, 0, 0));

        // this host's own links changed: refused, the table in use stays
        let mine = cluster(&changed).hosts[0].clone();
        let mut other = cluster(&changed);
        other.hosts[0].links = vec!["10.0.1.9".parse().unwrap()];
        assert_ne!(other.hosts[0], mine);
        let Err(refused) = peers.reload(other, 0) else {
            panic!("a change of this host's own entry was taken");
        };
        assert!(
            refused.contains("this host's own entry changed"),
            "{refused}"
        );
        assert!(Arc::ptr_eq(&peers.table(), &after));
    }

    /// A host taken out of the file and put back (an edit undone, two reloads) takes its
    /// counts up where they were: the status's and Prometheus' counters go back only when the
    /// daemon restarts. Before, they started again from zero.
    #[test]
    fn a_host_removed_and_added_again_keeps_its_counts() {
        let peers = Peers::new(cluster(NODE3), 0, Carry::Datagrams, None, 1);
        let node3 = peers.table().peers[1].clone();
        node3.count_sent(5);
        node3.count_received(7);
        node3.drop_packets(2);
        peers.reload(cluster(""), 0).unwrap();
        assert_eq!(peers.table().peers.len(), 1, "node3 was taken out");
        peers.reload(cluster(NODE3), 0).unwrap();
        let again = peers.table().peers[1].clone();
        assert_eq!(again.name(), "node3");
        assert!(!Arc::ptr_eq(&again, &node3));
        let s = again.sample();
        assert_eq!((s.sent, s.received, s.dropped.sending), (5, 7, 2));
    }

    /// The daemon holds the key itself, and `same_key` (lib.rs) compares the key the new
    /// file names with it: a file that names the same key file by another spelling (or the
    /// key moved to another path, unchanged) is no change of key, and needs no restart.
    /// Before, the paths were compared, and such a reload refused.
    #[test]
    fn a_reload_that_names_the_same_key_file_otherwise_is_taken() {
        let peers = Peers::new(cluster(NODE3), 0, Carry::Datagrams, None, 1);
        let text = format!("{}{NODE3}", crate::config::tests::GOOD)
            .replace("\"cluster.key\"", "\"../ri2n/cluster.key\"");
        let same = Cluster::parse(Path::new("/etc/ri2n/cluster.toml"), &text).unwrap();
        let r = peers.reload(same, 0);
        assert!(r.is_ok(), "{:?}", r.err());
    }
}
