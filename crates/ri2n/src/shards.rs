//! One endpoint on several cores: shards, each an engine with a driver thread and sockets of
//! its own on the endpoint's addresses, its connections spread over them.
//!
//! A connection lives on one shard from its first packet to its end, and no lock is shared
//! by the shards on the data path. The engine of shard `i` of `n` picks its connection IDs
//! from share `i` ([`ri2n_proto::Shard`]), and every ri2n packet but RESET and INITIAL
//! carries a connection ID that tells its shard. A client's INITIAL with a valid cookie goes
//! to the shard with the fewest connections (counting those placed there and not made yet),
//! and its repeats after it: the router remembers where the first went ([`Router::place`]).
//!
//! The kernel steers: the shards' sockets of one address form one `SO_REUSEPORT` group,
//! socket `i` of it shard `i`'s, and a classic BPF program picks the socket by the packet's
//! ID ([`LinkSocket::steer_by_connection_id`]). What still lands on the wrong shard is
//! forwarded by the one that received it ([`Router`]): an INITIAL placed elsewhere, a RESET
//! or an ICMP error that names the peer's ID (each shard in turn is asked whether it knows
//! the ID), a GSO or GRO batch or a path socket shared by connections of two shards, a kernel
//! that refused the program. Handshakes, timers and link events stay each shard's own.
//!
//! The shards of an endpoint share its instance and cookie key (peers see one endpoint), the
//! counts its connection limits apply to ([`ri2n_proto::ConnectionCounts`]) and the queue of
//! accepted connections ([`AcceptQueue`]).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use mio::Waker;
use ri2n_proto::wire::{self, Steering};
use ri2n_proto::{ConnectionHandle, Endpoint as ProtoEndpoint, EndpointConfig, Shard};

use crate::driver::{Driver, Undelivered};
use crate::readiness::Readiness;
use crate::socket::LinkSocket;

/// A datagram, or the quote of an ICMP error, that arrived on a shard other than its own.
#[derive(Debug)]
pub(crate) struct Forwarded {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub kind: ForwardedKind,
    /// For a [`Steering::Ask`]: how many more shards may be asked after the one it is sent to.
    pub asks_left: usize,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ForwardedKind {
    Datagram,
    /// The quote of a "port unreachable" for a datagram sent to `remote`.
    Refusal,
}

/// Most datagrams waiting in one shard's inbox, and most bytes: beyond, more are dropped, as
/// a full socket buffer drops them (their senders' loss recovery repairs it).
const MAX_FORWARDED: usize = 4096;
const MAX_FORWARDED_BYTES: usize = 4 << 20;

/// How long a client's INITIAL is sent on to the shard chosen for its first one: longer than
/// a client keeps retransmitting it (its `handshake_timeout`, 10 s by default).
const PLACEMENT_HOLD: Duration = Duration::from_secs(60);
/// Most placements remembered at once (the oldest go first beyond).
const MAX_PLACEMENTS: usize = 1 << 16;

/// What one shard forwarded to another and that one has not taken yet.
#[derive(Debug, Default)]
struct Inbox {
    items: Mutex<Waiting>,
    /// `items` may hold something: spares its lock on every round of the driver thread.
    pending: AtomicBool,
    /// The shard stopped (its last handle was dropped while others live on): what would be
    /// forwarded to it is dropped, not kept.
    closed: AtomicBool,
    /// Connections its engine holds, as of its last round, and clients placed on it whose
    /// connection is not made yet (a handshake takes a RETRY and a second INITIAL; clients
    /// connecting at once must not all see an empty shard): the load new connections are
    /// placed by.
    connections: AtomicUsize,
    placed: AtomicUsize,
    /// Wakes the shard's driver thread (set once it runs).
    waker: OnceLock<Arc<Waker>>,
}

/// What waits in an inbox.
#[derive(Debug, Default)]
struct Waiting {
    items: Vec<Forwarded>,
    /// The bytes of `items`' datagrams.
    bytes: usize,
}

/// How the shards of an endpoint hand each other what arrived on the wrong one, and which
/// shard takes each new connection.
#[derive(Debug)]
pub(crate) struct Router {
    inboxes: Vec<Inbox>,
    /// The shard each recent client INITIAL (by its source address and the client's
    /// connection ID) was placed on, and when: its repeats go there too.
    placements: Mutex<Placements>,
}

/// Where recent client INITIALs were placed ([`Router::place`]).
#[derive(Debug, Default)]
struct Placements {
    /// By the client's address and connection ID: its shard, and whether the connection is
    /// still to be made (counted in that shard's `placed`).
    by_initial: HashMap<(SocketAddr, u64), (usize, bool)>,
    /// The same keys, oldest first, with the time each was placed.
    order: VecDeque<(Instant, SocketAddr, u64)>,
}

impl Router {
    pub fn new(shards: usize) -> Self {
        Self {
            inboxes: (0..shards).map(|_| Inbox::default()).collect(),
            placements: Mutex::default(),
        }
    }

    /// The shard of the INITIAL with client ID `scid` from `remote`: the one its first went
    /// to, or now the least loaded. Placements older than [`PLACEMENT_HOLD`] are forgotten.
    fn placement(&self, here: usize, remote: SocketAddr, scid: u64) -> usize {
        let mut p = self.placements.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while let Some(&(at, r, c)) = p.order.front() {
            if now.duration_since(at) < PLACEMENT_HOLD && p.order.len() < MAX_PLACEMENTS {
                break;
            }
            p.order.pop_front();
            if let Some((shard, true)) = p.by_initial.remove(&(r, c)) {
                self.inboxes[shard].placed.fetch_sub(1, Ordering::Relaxed);
            }
        }
        if let Some(&(shard, _)) = p.by_initial.get(&(remote, scid)) {
            return shard;
        }
        let shard = self.least_loaded(here);
        self.inboxes[shard].placed.fetch_add(1, Ordering::Relaxed);
        p.by_initial.insert((remote, scid), (shard, true));
        p.order.push_back((now, remote, scid));
        shard
    }

    /// Shard `shard`'s engine holds `n` connections now.
    pub fn set_load(&self, shard: usize, n: usize) {
        self.inboxes[shard].connections.store(n, Ordering::Relaxed);
    }

    /// The client connection ID of `datagram` if it is a client's INITIAL to place (with
    /// several shards).
    pub fn initial(&self, datagram: &[u8]) -> Option<u64> {
        if self.inboxes.len() == 1 {
            return None;
        }
        match wire::steering(datagram)? {
            Steering::Initial(scid) => Some(scid),
            _ => None,
        }
    }

    /// Shard `shard`'s engine just handled the INITIAL with client ID `scid` from `remote`:
    /// its load is published at once, so that the next INITIAL (of the same batch, or at
    /// another shard) sees it, and if it `made` the connection, the placement is settled.
    pub fn initial_handled(
        &self,
        shard: usize,
        engine: &ProtoEndpoint,
        remote: SocketAddr,
        scid: u64,
        made: bool,
    ) {
        let inbox = &self.inboxes[shard];
        inbox
            .connections
            .store(engine.connection_count(), Ordering::Relaxed);
        if made {
            let mut p = self.placements.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((placed_on, pending)) = p.by_initial.get_mut(&(remote, scid)) {
                if std::mem::take(pending) {
                    self.inboxes[*placed_on]
                        .placed
                        .fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// The running shard with the fewest connections, `here` among those.
    fn least_loaded(&self, here: usize) -> usize {
        let load = |i: usize| {
            let inbox = &self.inboxes[i];
            if inbox.closed.load(Ordering::Acquire) {
                return usize::MAX;
            }
            inbox.connections.load(Ordering::Relaxed) + inbox.placed.load(Ordering::Relaxed)
        };
        (0..self.inboxes.len()).fold(here, |best, i| if load(i) < load(best) { i } else { best })
    }

    pub fn shards(&self) -> usize {
        self.inboxes.len()
    }

    /// How many shards besides the receiving one may be asked about a [`Steering::Ask`].
    pub fn first_asks(&self) -> usize {
        self.inboxes.len() - 1
    }

    pub fn set_waker(&self, shard: usize, waker: Arc<Waker>) {
        let _ = self.inboxes[shard].waker.set(waker);
    }

    /// Where what shard `here` received from `remote` goes: `None` to its own engine, else
    /// the shard to forward it to and how many more may be asked after that one. A connection
    /// ID of another share goes to its shard; a client's INITIAL with a valid cookie to the
    /// shard with the fewest connections (this one when it has no more than any), and its
    /// repeats after it; an ID to ask about stays where an engine has a connection by that
    /// ID with `remote`, and with the last shard asked when none has (which counts the drop).
    pub fn place(
        &self,
        here: usize,
        engine: &ProtoEndpoint,
        remote: SocketAddr,
        datagram: &[u8],
        steering: Option<Steering>,
        asks_left: usize,
    ) -> Option<(usize, usize)> {
        let n = self.inboxes.len();
        if n == 1 {
            return None;
        }
        match steering? {
            Steering::Initial(scid) => {
                // only one that may make a connection is placed: one without a valid cookie
                // draws a RETRY here, and INITIALs made up by the thousand do not push the
                // real ones out of the record (a repeat sent elsewhere could make a second
                // connection for one client)
                if !engine.initial_with_cookie(Instant::now(), remote, datagram) {
                    return None;
                }
                let shard = self.placement(here, remote, scid);
                (shard != here).then_some((shard, 0))
            }
            Steering::Shard(cid) => {
                let owner = Shard::of(cid, n as u32) as usize;
                (owner != here).then_some((owner, 0))
            }
            Steering::Ask(cid) => {
                if engine.has_connection_with(cid, remote) {
                    return None;
                }
                // the next shard that runs: a stopped one holds no connection to ask about
                let mut next = here;
                for left in (0..asks_left).rev() {
                    next = (next + 1) % n;
                    if !self.inboxes[next].closed.load(Ordering::Acquire) {
                        return Some((next, left));
                    }
                }
                None
            }
        }
    }

    /// Queues `item` for shard `to`; its driver thread is woken by [`wake`](Self::wake).
    /// Dropped when that shard has stopped or has [`MAX_FORWARDED`] datagrams or
    /// [`MAX_FORWARDED_BYTES`] waiting.
    pub fn forward(&self, to: usize, item: Forwarded) {
        let inbox = &self.inboxes[to];
        let mut waiting = inbox.items.lock().unwrap_or_else(|e| e.into_inner());
        if inbox.closed.load(Ordering::Acquire)
            || waiting.items.len() >= MAX_FORWARDED
            || waiting.bytes + item.bytes.len() > MAX_FORWARDED_BYTES
        {
            tracing::trace!(shard = to, remote = %item.remote, "forwarded datagram dropped");
            return;
        }
        waiting.bytes += item.bytes.len();
        waiting.items.push(item);
        inbox.pending.store(true, Ordering::Release);
    }

    /// Shard `shard` stopped: nothing is forwarded to it any more.
    pub fn close(&self, shard: usize) {
        let inbox = &self.inboxes[shard];
        let mut waiting = inbox.items.lock().unwrap_or_else(|e| e.into_inner());
        inbox.closed.store(true, Ordering::Release);
        *waiting = Waiting::default();
    }

    /// Wakes the driver threads of the shards in `mask` (bit `i`: shard `i`), after
    /// [`forward`](Self::forward)ing to them.
    pub fn wake(&self, mut mask: u64) {
        while mask != 0 {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if let Some(w) = self.inboxes.get(i).and_then(|b| b.waker.get()) {
                let _ = w.wake();
            }
        }
    }

    /// What was forwarded to shard `shard` since the last call, oldest first, into `into`.
    pub fn take(&self, shard: usize, into: &mut Vec<Forwarded>) {
        let inbox = &self.inboxes[shard];
        if inbox.pending.load(Ordering::Acquire) && inbox.pending.swap(false, Ordering::AcqRel) {
            let mut waiting = inbox.items.lock().unwrap_or_else(|e| e.into_inner());
            into.append(&mut waiting.items);
            waiting.bytes = 0;
        }
    }
}

/// Connections accepted by any shard and not yet taken by `accept`.
#[derive(Debug, Default)]
pub(crate) struct AcceptQueue {
    queue: Mutex<VecDeque<(usize, ConnectionHandle)>>,
    arrived: Condvar,
    /// The readiness descriptor of `accept`, once asked for (signalled and cleared under the
    /// queue's lock).
    pub readiness: OnceLock<Readiness>,
}

impl AcceptQueue {
    fn lock(&self) -> MutexGuard<'_, VecDeque<(usize, ConnectionHandle)>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Shard `shard`'s engine accepted connection `h`.
    pub fn push(&self, shard: usize, h: ConnectionHandle) {
        let mut q = self.lock();
        q.push_back((shard, h));
        if let Some(r) = self.readiness.get() {
            r.signal();
        }
        drop(q);
        self.arrived.notify_all();
    }

    /// The oldest accepted connection, if any. The readiness descriptor stays readable while
    /// more wait: an event loop that accepts one connection per wake-up still gets them all.
    fn pop(&self) -> Option<(usize, ConnectionHandle)> {
        let mut q = self.lock();
        let next = q.pop_front();
        if q.is_empty() {
            if let Some(r) = self.readiness.get() {
                r.clear();
            }
        }
        next
    }

    /// Takes the connections of shard `shard` waiting to be accepted.
    pub fn take_shard(&self, shard: usize) -> Vec<ConnectionHandle> {
        let mut q = self.lock();
        let mut taken = Vec::new();
        q.retain(|&(s, h)| {
            if s == shard {
                taken.push(h);
            }
            s != shard
        });
        if q.is_empty() {
            if let Some(r) = self.readiness.get() {
                r.clear();
            }
        }
        taken
    }

    /// Waits until a connection is queued or `deadline` passes; the caller looks again.
    fn wait(&self, deadline: Option<Instant>) {
        let q = self.lock();
        if !q.is_empty() {
            return;
        }
        match deadline {
            None => drop(self.arrived.wait(q)),
            Some(d) => {
                let timeout = d.saturating_duration_since(Instant::now());
                drop(self.arrived.wait_timeout(q, timeout));
            }
        }
    }

    /// Makes the readiness descriptor, readable at once if a connection waits.
    pub fn readiness(&self) -> std::io::Result<&Readiness> {
        if self.readiness.get().is_none() {
            let r = Readiness::new()?;
            let q = self.lock();
            if !q.is_empty() {
                r.signal();
            }
            let _ = self.readiness.set(r);
        }
        Ok(self.readiness.get().expect("set above"))
    }
}

/// An endpoint's shards.
#[derive(Debug)]
pub(crate) struct Shards {
    pub drivers: Arc<Drivers>,
    pub accepts: Arc<AcceptQueue>,
    /// The shard the next outgoing connection is opened on (round robin).
    next: AtomicUsize,
}

impl Shards {
    /// Starts the engines of `config` (its addresses resolved) on `first`, the sockets bound
    /// to them, and on as many more sockets per address as further shards are wanted.
    pub fn start(
        config: EndpointConfig,
        first: Vec<LinkSocket>,
        seed: [u8; 32],
    ) -> std::io::Result<Self> {
        let wanted = config.shards.unwrap_or_else(|| default_shards(&config));
        let mut sockets = vec![first];
        for _ in 1..wanted {
            match sockets[0].iter().map(LinkSocket::bind_beside).collect() {
                Ok(more) => sockets.push(more),
                Err(e) => {
                    tracing::warn!(error = %e, shards = sockets.len(), "cannot bind more shards");
                    break;
                }
            }
        }
        let count = sockets.len();
        if count > 1 {
            for s in &sockets[0] {
                if let Err(e) = s.steer_by_connection_id(count as u32) {
                    tracing::warn!(error = %e, local = %s.local,
                        "no steering program: the shards forward what lands on the wrong one");
                }
            }
        }
        let router = Arc::new(Router::new(count));
        let mut config = config;
        if count > 1 {
            config.connection_counts = Some(Arc::default());
        }
        let accepts = Arc::new(AcceptQueue::default());
        let now = Instant::now();
        let drivers = sockets
            .into_iter()
            .enumerate()
            .map(|(i, sockets)| {
                let engine = ProtoEndpoint::from_seed(shard_config(&config, i, count), seed, now);
                Driver::start(engine, sockets, i, router.clone(), accepts.clone())
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self {
            drivers: Arc::new(Drivers(drivers)),
            accepts,
            next: AtomicUsize::new(0),
        })
    }

    /// The shard to open the next outgoing connection on.
    pub fn for_connect(&self) -> &Arc<Driver> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.drivers.len();
        &self.drivers[i]
    }

    /// The next accepted connection, with its shard.
    pub fn pop_accepted(&self) -> Option<(Arc<Driver>, ConnectionHandle)> {
        let (shard, h) = self.accepts.pop()?;
        Some((self.drivers[shard].clone(), h))
    }

    /// Waits until a connection may have been accepted or `deadline` passes.
    pub fn wait_accept(&self, deadline: Option<Instant>) {
        for d in self.drivers.iter() {
            d.shared().before_blocking();
        }
        self.accepts.wait(deadline);
    }

    /// Aborts every shard's connections at once (see `Shared::abort_all`): each waits for its
    /// CLOSEs to be repeated, so one after another the last shard's peers would learn of the
    /// abort a wait per shard later.
    pub fn abort_all(&self, code: u64, reason: &str) {
        if let [only] = &self.drivers[..] {
            return only.shared().abort_all(code, reason);
        }
        std::thread::scope(|s| {
            for d in self.drivers.iter() {
                s.spawn(move || d.shared().abort_all(code, reason));
            }
        });
    }

    /// Closes every shard's connections at once (see `Shared::close_all`).
    pub fn close_all(&self, deadline: Option<Instant>) -> Undelivered {
        if let [only] = &self.drivers[..] {
            return only.shared().close_all(deadline);
        }
        std::thread::scope(|s| {
            let closing: Vec<_> = (self.drivers.iter())
                .map(|d| s.spawn(move || d.shared().close_all(deadline)))
                .collect();
            closing
                .into_iter()
                .map(|c| c.join().unwrap_or_default())
                .fold(Undelivered::default(), |a, b| Undelivered {
                    connections: a.connections + b.connections,
                    bytes: a.bytes + b.bytes,
                })
        })
    }
}

impl Drop for Shards {
    /// No connection can be accepted from now on: each shard refuses new ones and aborts
    /// those waiting (a connection the application holds keeps the shards running, see
    /// [`Drivers`]), and a watcher of `accept`'s readiness descriptor is woken.
    fn drop(&mut self) {
        for d in self.drivers.iter() {
            d.shared().stop_accepting();
        }
        // an event loop waiting on `accept`'s readiness descriptor wakes, and finds no
        // endpoint to accept from any more
        if let Some(r) = self.accepts.readiness.get() {
            r.signal();
        }
    }
}

/// The shards' drivers, held by the endpoint and by each of its connections. When the last
/// of them goes, the shards close in parallel, each lingering for its own connections
/// (`Driver::drop`). Held by each connection for its own shard alone, a shard lingered as
/// its last connection went, on the thread that dropped it, though the endpoint's other
/// connections lived on, and one shard after another.
#[derive(Debug)]
pub(crate) struct Drivers(Vec<Arc<Driver>>);

impl std::ops::Deref for Drivers {
    type Target = [Arc<Driver>];

    fn deref(&self) -> &[Arc<Driver>] {
        &self.0
    }
}

impl Drop for Drivers {
    fn drop(&mut self) {
        let drivers = std::mem::take(&mut self.0);
        if drivers.len() > 1 && !std::thread::panicking() {
            std::thread::scope(|s| {
                for d in drivers {
                    s.spawn(move || drop(d));
                }
            });
        }
    }
}

/// A server runs a shard per CPU the process may use (at most [`ri2n_proto::MAX_SHARDS`]);
/// a client, which mostly holds one connection, one.
fn default_shards(config: &EndpointConfig) -> usize {
    if !config.accept_incoming {
        return 1;
    }
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(ri2n_proto::MAX_SHARDS)
}

/// Shard `index` of `count`'s engine configuration: its share of connection IDs, and an even
/// share of the endpoint's rate of keyed handshakes. (A handshake is read on the shard that
/// placement chooses, the least loaded: new ones spread evenly over shards of even load, but
/// while one shard holds far fewer connections than the others it takes them all, at its
/// share of the rate.) The limits on connections hold for the endpoint through the counts
/// the shards share.
fn shard_config(config: &EndpointConfig, index: usize, count: usize) -> EndpointConfig {
    let mut c = config.clone();
    c.shard = Shard {
        index: index as u32,
        count: count as u32,
    };
    c.max_keyed_handshakes_per_second = config
        .max_keyed_handshakes_per_second
        .map(|r| r.div_ceil(count as u32));
    c
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ri2n_proto::wire::{packet_type, VERSION};

    use super::*;

    /// A short packet for connection ID `cid` (header only: the socket filter and the
    /// steering program read no further).
    fn short_packet(cid: u64) -> Vec<u8> {
        let mut d = vec![VERSION, packet_type::SHORT];
        d.extend_from_slice(&cid.to_be_bytes());
        d.extend_from_slice(&[0, 0, 0, 0]);
        d
    }

    #[test]
    fn the_kernel_hands_each_connection_id_to_its_shards_socket() {
        const SHARDS: u32 = 4;
        let first = LinkSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut group = vec![first];
        for _ in 1..SHARDS {
            group.push(LinkSocket::bind_beside(&group[0]).unwrap());
        }
        group[0].steer_by_connection_id(SHARDS).unwrap();
        let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let cids: Vec<u64> = (0..64u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        for &cid in &cids {
            sender.send_to(&short_packet(cid), group[0].local).unwrap();
        }
        let mut received = 0;
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut buf = [0u8; 64];
        while received < cids.len() && Instant::now() < deadline {
            for (i, s) in group.iter().enumerate() {
                while let Ok((n, _)) = s.io.recv_from(&mut buf) {
                    let cid = u64::from_be_bytes(buf[2..10].try_into().unwrap());
                    assert_eq!(n, 14);
                    assert_eq!(
                        Shard::of(cid, SHARDS) as usize,
                        i,
                        "connection ID {cid:#x} reached the socket of shard {i}"
                    );
                    received += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(received, cids.len(), "every datagram arrived");
    }

    /// An inbox holds at most `MAX_FORWARDED_BYTES` of datagrams: large ones forwarded
    /// faster than their shard takes them are dropped beyond (as a full socket buffer drops
    /// them), and room comes back once the shard took what waited.
    #[test]
    fn an_inbox_holds_a_bounded_number_of_bytes() {
        let router = Router::new(2);
        let addr: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let big = |n: u8| Forwarded {
            local: addr,
            remote: addr,
            kind: ForwardedKind::Datagram,
            asks_left: 0,
            bytes: vec![n; 64 << 10],
        };
        for n in 0..100 {
            router.forward(1, big(n));
        }
        let mut taken = Vec::new();
        router.take(1, &mut taken);
        assert_eq!(taken.len(), MAX_FORWARDED_BYTES / (64 << 10));
        assert!(taken.iter().enumerate().all(|(i, f)| f.bytes[0] == i as u8));
        router.forward(1, big(200));
        taken.clear();
        router.take(1, &mut taken);
        assert_eq!(taken.len(), 1, "room again once taken");
    }

    /// A RESET (or an ICMP error) whose connection ID no engine asked so far has a
    /// connection by passes a stopped shard and reaches the ones after it; it used to be
    /// forwarded to the stopped one, which drops what it is sent.
    #[test]
    fn a_question_about_a_connection_id_passes_a_stopped_shard() {
        let router = Router::new(3);
        router.close(1);
        let config = EndpointConfig::new(vec!["127.0.0.1:0".parse().unwrap()]);
        let engine = ProtoEndpoint::new(config, 1, Instant::now());
        let remote: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let ask = Some(Steering::Ask(0x1234));
        assert_eq!(
            router.place(0, &engine, remote, &[], ask, router.first_asks()),
            Some((2, 0))
        );
        // the last shard asked keeps it (and counts the drop)
        assert_eq!(router.place(2, &engine, remote, &[], ask, 0), None);
        // the others stopped too: the receiving shard keeps it
        router.close(2);
        assert_eq!(router.place(0, &engine, remote, &[], ask, 2), None);
    }

    /// INITIALs without a valid cookie (first ones, or made up by the thousand) draw their
    /// RETRY where they landed and leave no placement behind. Before, each took a place in
    /// the record of at most `MAX_PLACEMENTS`, pushing out a real client's, whose repeated
    /// INITIAL then went to another shard and made a second connection there.
    #[test]
    fn initials_without_a_valid_cookie_are_not_placed() {
        let router = Router::new(2);
        let config = EndpointConfig::new(vec!["127.0.0.1:0".parse().unwrap()]).server();
        let engine = ProtoEndpoint::new(config, 1, Instant::now());
        let remote: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let hello = [0u8; 8];
        for scid in 1..=1000u64 {
            for token in [&[][..], &[7u8; 16][..]] {
                let d = wire::control_packet(&wire::Header::Initial {
                    scid,
                    token,
                    mode: wire::handshake_mode::PLAIN,
                    hello: &hello,
                });
                let steering = wire::steering(&d);
                assert_eq!(steering, Some(Steering::Initial(scid)));
                assert_eq!(router.place(0, &engine, remote, &d, steering, 1), None);
            }
        }
        let placements = router.placements.lock().unwrap();
        assert!(placements.by_initial.is_empty() && placements.order.is_empty());
        assert_eq!(router.inboxes[1].placed.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn claimed_ids_are_in_their_share_and_stay_random_below() {
        for count in [1, 2, 3, 7, 16] {
            for index in 0..count {
                let shard = Shard { index, count };
                for r in [0, 1, u64::MAX, u64::MAX - 5, 0x1234_5678_9abc_def0] {
                    let cid = shard.claim(r);
                    assert!(shard.owns(cid), "{r:#x} claimed by {shard:?} as {cid:#x}");
                    assert_eq!(cid & 0xffff_ffff, r & 0xffff_ffff);
                    assert!(cid.abs_diff(r) < u64::from(count) << 32);
                }
            }
        }
    }
}
