//! The event loop: a time-ordered queue of deliveries, serialization completions, host timers,
//! reader wakeups and scenario actions; the two hosts (engine endpoint + application model); and
//! the driving of a host after anything happened to it.

use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use ri2n_proto::{ConnectionHandle, Endpoint, EndpointConfig, Event, LinkId};

use crate::app::{Receiver, Sender, Workload};
use crate::derive_seed;
use crate::error::{FailureKind, SimError};
use crate::events::EventQueue;
use crate::net::{host_addr, Dir, HostId, NetEvent, Network};
use crate::outgoing::Outgoing;
use crate::report::{BufferPeaks, CloseRecord, LinkChange, LinkReport, Report, BUCKET};
use crate::scenario::{Action, AppMode, Scenario};

/// Timer firings at one instant after which a host is declared livelocked.
const SAME_INSTANT_LIMIT: u32 = 1000;
/// Datagrams one `poll_transmit` loop may produce at one instant before it is declared endless.
const FLUSH_LIMIT: usize = 1_000_000;
/// Rounds of (events, application, transmit) per drive before giving up on quiescence.
const DRIVE_ROUNDS: usize = 64;

/// Runs a scenario to completion (or failure) and returns what was measured.
///
/// Success: every direction's receiver read exactly what was sent, then the end of both streams,
/// and every sender's connection reported `is_send_complete()`; or, when a close is expected
/// (`Scenario::end_on_close`, or after [`Action::RestartServer`]), A's connection closed.
/// Engine panics are caught and reported as [`FailureKind::Panic`] with the seed.
pub fn run(scenario: &Scenario) -> Result<Report, SimError> {
    let fail = |kind, report: Report| SimError {
        kind,
        at: report.end_time,
        scenario: Box::new(scenario.clone()),
        report: Box::new(report),
    };
    let empty = Report {
        seed: scenario.seed,
        ..Report::default()
    };
    if let Err(e) = scenario.validate() {
        return Err(fail(FailureKind::InvalidScenario(e), empty));
    }
    let base = Instant::now();
    let endpoints = panic::catch_unwind(|| {
        [HostId::A, HostId::B].map(|h| {
            Endpoint::new(
                endpoint_config(scenario, h),
                derive_seed(scenario.seed, 0xE0 + h.index() as u64),
                base,
            )
        })
    });
    let endpoints = match endpoints {
        Ok(e) => e,
        Err(p) => return Err(fail(FailureKind::Panic(panic_message(&*p)), empty)),
    };
    let mut sim = Sim::new(scenario, base, endpoints);
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| sim.run_loop()));
    let kind = match outcome {
        Ok(Ok(())) => return Ok(sim.report()),
        Ok(Err(kind)) => kind,
        Err(p) => FailureKind::Panic(panic_message(&*p)),
    };
    Err(fail(kind, sim.report()))
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_owned()
    }
}

fn endpoint_config(sc: &Scenario, h: HostId) -> EndpointConfig {
    let addrs: Vec<_> = (0..sc.links.len()).map(|i| host_addr(h, i)).collect();
    let mut c = EndpointConfig::new(addrs.clone());
    c.local_max_datagram = addrs.iter().map(|&a| (a, sc.max_datagram)).collect();
    c.key = sc.key.clone();
    if h == HostId::B {
        c = c.server();
        c.server_connection = sc.server.clone();
    }
    c
}

/// The seed of what direction `dir` of the scenario of seed `scenario_seed` carries.
pub(crate) fn workload_seed(scenario_seed: u64, dir: Dir) -> u64 {
    derive_seed(scenario_seed, 0xDA7A + dir.index() as u64)
}

/// What a direction carries in this scenario.
fn workload(sc: &Scenario, dir: Dir) -> Workload {
    let active = dir == Dir::AToB || sc.app.bidirectional;
    let seed = workload_seed(sc.seed, dir);
    let (bytes, messages, max_message) = match (&sc.app.mode, active) {
        (_, false) => (0, 0, 1),
        (AppMode::Bytes, true) => (sc.app.total_bytes, 0, 1),
        (AppMode::Messages { count, max_size }, true) => (0, *count, *max_size),
    };
    Workload {
        seed,
        bytes,
        messages,
        max_message,
    }
}

#[derive(Debug)]
enum EventKind {
    /// What the network asked for: a serialization completes or a datagram leaves a link.
    Net(NetEvent),
    /// A host's engine timer.
    Timer { host: HostId, gen: u64 },
    /// A rate-limited reader may read again.
    ReaderWake { host: HostId, gen: u64 },
    /// `scenario.actions[i]`.
    Action(usize),
}

/// The application's view of one host.
struct Host {
    id: HostId,
    endpoint: Endpoint,
    conn: Option<ConnectionHandle>,
    sender: Sender,
    receiver: Receiver,
    closed: bool,
    /// Pending timer: its deadline and generation (older generations are stale).
    timer_at: Option<Duration>,
    timer_gen: u64,
    last_fire: Duration,
    same_instant_fires: u32,
    wake_at: Option<Duration>,
    wake_gen: u64,
    /// Engine link index → network link, learnt from `stats()`.
    link_map: Vec<(LinkId, Option<usize>)>,
    /// The most its streams may hold: a workload uses one stream each way (bytes or
    /// messages), so the configured buffer and window of one stream.
    send_limit: u64,
    recv_limit: u64,
}

impl Host {
    fn new(sc: &Scenario, id: HostId, endpoint: Endpoint) -> Self {
        let cfg = match id {
            HostId::A => &sc.client,
            HostId::B => &sc.server,
        };
        let out = Dir::from_sender(id);
        Self {
            id,
            endpoint,
            conn: None,
            sender: Sender::new(id, workload(sc, out)),
            receiver: Receiver::new(
                out.reverse(),
                workload(sc, out.reverse()),
                sc.app.reader_rate,
            ),
            closed: false,
            timer_at: None,
            timer_gen: 0,
            last_fire: Duration::MAX,
            same_instant_fires: 0,
            wake_at: None,
            wake_gen: 0,
            link_map: Vec::new(),
            send_limit: cfg.send_buffer,
            recv_limit: cfg.stream_receive_window,
        }
    }

    fn is_complete(&self) -> bool {
        self.sender.is_complete() && self.receiver.is_done()
    }
}

struct Sim<'a> {
    sc: &'a Scenario,
    base: Instant,
    now: Duration,
    queue: EventQueue<EventKind>,
    net: Network,
    hosts: [Host; 2],
    report: Report,
    /// Scratch space, reused.
    tx: Outgoing,
    rx_buf: Vec<u8>,
}

impl<'a> Sim<'a> {
    fn new(sc: &'a Scenario, base: Instant, endpoints: [Endpoint; 2]) -> Self {
        let [a, b] = endpoints;
        Self {
            sc,
            base,
            now: Duration::ZERO,
            queue: EventQueue::default(),
            net: Network::new(&sc.links, derive_seed(sc.seed, 0x7E7)),
            hosts: [Host::new(sc, HostId::A, a), Host::new(sc, HostId::B, b)],
            report: Report {
                seed: sc.seed,
                links: vec![LinkReport::default(); sc.links.len()],
                ..Report::default()
            },
            tx: Outgoing::default(),
            rx_buf: vec![0; 64 << 10],
        }
    }

    fn instant(&self) -> Instant {
        self.base + self.now
    }

    fn schedule(&mut self, at: Duration, kind: EventKind) {
        self.queue.schedule(at, kind);
    }

    /// The report as of now, with the network's and applications' final numbers.
    fn report(&self) -> Report {
        let mut r = self.report.clone();
        r.end_time = self.now;
        for (i, l) in r.links.iter_mut().enumerate() {
            l.a_to_b = self.net.direction(i, Dir::AToB).counters().clone();
            l.b_to_a = self.net.direction(i, Dir::BToA).counters().clone();
        }
        for h in &self.hosts {
            let out = &mut r.transfers[Dir::from_sender(h.id).index()];
            out.written = h.sender.written;
            out.sent_hash = h.sender.hash.0;
            out.send_complete_at = h.sender.complete_at;
            let inb = &mut r.transfers[Dir::from_sender(h.id).reverse().index()];
            inb.received_hash = h.receiver.hash.0;
            inb.messages = h.receiver.messages_received as u64;
            inb.received_all_at = h.receiver.done_at;
        }
        r
    }

    fn close_acceptable(&self) -> bool {
        self.sc.end_on_close || !self.report.restarts.is_empty()
    }

    fn run_loop(&mut self) -> Result<(), FailureKind> {
        for i in 0..self.sc.actions.len() {
            let at = self.sc.actions[i].0;
            self.schedule(at, EventKind::Action(i));
        }
        let remotes: Vec<_> = if self.sc.app.explicit_addrs {
            (0..self.sc.links.len())
                .map(|i| host_addr(HostId::B, i))
                .collect()
        } else {
            vec![host_addr(HostId::B, 0)]
        };
        let now = self.instant();
        let a = &mut self.hosts[0];
        let h = a
            .endpoint
            .connect(now, &remotes, self.sc.client.clone())
            .map_err(FailureKind::Connect)?;
        a.conn = Some(h);
        self.drive(HostId::A)?;
        self.drive(HostId::B)?;

        while let Some((at, kind)) = self.queue.pop() {
            if at > self.sc.time_limit {
                self.now = self.sc.time_limit;
                return Err(FailureKind::Timeout {
                    limit: self.sc.time_limit,
                });
            }
            debug_assert!(at >= self.now, "time went backwards");
            self.now = at;
            self.report.events += 1;
            match kind {
                EventKind::Net(ev) => {
                    let queue = &mut self.queue;
                    let arrival = self
                        .net
                        .handle(ev, &mut |at, e| queue.schedule(at, EventKind::Net(e)));
                    if let Some(mut a) = arrival {
                        // sealed packets hide their frames from the network, and from this
                        // observer of it
                        let stream = match self.sc.key {
                            None => crate::report::stream_payload(&a.data),
                            Some(_) => 0,
                        };
                        if stream > 0 {
                            let tl = &mut self.report.links[a.link].stream_timeline[a.dir.index()];
                            let bucket = (self.now.as_nanos() / BUCKET.as_nanos()) as usize;
                            if tl.len() <= bucket {
                                tl.resize(bucket + 1, 0);
                            }
                            tl[bucket] += stream;
                        }
                        let to = a.dir.receiver();
                        let now = self.instant();
                        self.hosts[to.index()].endpoint.handle_datagram(
                            now,
                            a.local,
                            a.remote,
                            &mut a.data,
                        );
                        self.drive(to)?;
                    }
                }
                EventKind::Timer { host, gen } => {
                    let now = self.now;
                    let instant = self.instant();
                    let hs = &mut self.hosts[host.index()];
                    if gen != hs.timer_gen {
                        continue;
                    }
                    hs.timer_at = None;
                    if hs.last_fire == now {
                        hs.same_instant_fires += 1;
                        if hs.same_instant_fires > SAME_INSTANT_LIMIT {
                            let raw = hs.endpoint.poll_timeout().map(|t| {
                                t.checked_duration_since(self.base)
                                    .map_or("before the start".into(), |d| format!("{d:?}"))
                            });
                            let conn = hs.conn.and_then(|c| hs.endpoint.connection(c));
                            let state = conn.map(|c| (c.state(), c.stats()));
                            return Err(FailureKind::Livelock {
                                host,
                                what: format!(
                                    "the engine asked for a timer at t = {now:?} more than \
                                     {SAME_INSTANT_LIMIT} times (seed {}); poll_timeout() now \
                                     returns {raw:?}; connection: {state:?}",
                                    self.sc.seed
                                ),
                            });
                        }
                    } else {
                        hs.last_fire = now;
                        hs.same_instant_fires = 1;
                    }
                    hs.endpoint.handle_timeout(instant);
                    self.drive(host)?;
                }
                EventKind::ReaderWake { host, gen } => {
                    let hs = &mut self.hosts[host.index()];
                    if gen != hs.wake_gen {
                        continue;
                    }
                    hs.wake_at = None;
                    self.drive(host)?;
                }
                EventKind::Action(i) => self.apply(i)?,
            }
            if self.hosts.iter().all(Host::is_complete) {
                self.report.completed_at = Some(self.now);
                return Ok(());
            }
            if self.hosts[0].closed && self.close_acceptable() {
                return Ok(());
            }
        }
        Err(FailureKind::Stalled)
    }

    fn apply(&mut self, i: usize) -> Result<(), FailureKind> {
        let action = &self.sc.actions[i].1;
        let now = self.now;
        self.report.actions.push((now, action.clone()));
        let queue = &mut self.queue;
        if self.net.apply(now, action, &mut |at, e| {
            queue.schedule(at, EventKind::Net(e))
        }) {
            return Ok(());
        }
        // the one action that is no change to the network
        debug_assert!(matches!(action, Action::RestartServer));
        let n = self.report.restarts.len() as u64 + 1;
        self.report.restarts.push(now);
        let seed = derive_seed(self.sc.seed, 0xE0_0000 + n);
        let endpoint = Endpoint::new(endpoint_config(self.sc, HostId::B), seed, self.instant());
        let old = &self.hosts[1];
        let (timer_gen, wake_gen) = (old.timer_gen + 1, old.wake_gen + 1);
        let mut fresh = Host::new(self.sc, HostId::B, endpoint);
        fresh.timer_gen = timer_gen;
        fresh.wake_gen = wake_gen;
        self.hosts[1] = fresh;
        self.drive(HostId::B)
    }

    /// After anything happened to host `h`: sample its buffers (what arrived, before the
    /// application reads it), send what it has, let its application react to events and data
    /// until nothing changes, sample its buffers again and re-arm its timer.
    fn drive(&mut self, h: HostId) -> Result<(), FailureKind> {
        self.sample(h)?;
        self.flush(h)?;
        for _ in 0..DRIVE_ROUNDS {
            let events = self.poll_events(h)?;
            let app = self.app_step(h)?;
            self.flush(h)?;
            if !events && !app {
                break;
            }
        }
        self.sample(h)?;
        self.rearm(h);
        Ok(())
    }

    /// `poll_transmit_into` until it builds nothing, putting every datagram on its link. It
    /// builds into a buffer that takes bursts, as the driver's batches do.
    fn flush(&mut self, h: HostId) -> Result<(), FailureKind> {
        let now = self.now;
        let instant = self.instant();
        let mut flushed = 0;
        while flushed < FLUSH_LIMIT {
            if self.hosts[h.index()]
                .endpoint
                .poll_transmit_into(instant, &mut self.tx)
                == 0
            {
                return Ok(());
            }
            let mut built = std::mem::take(&mut self.tx.built);
            for (t, data) in built.drain(..) {
                flushed += 1;
                if t.len > self.sc.max_datagram {
                    return Err(FailureKind::OversizeDatagram {
                        host: h,
                        len: t.len,
                        max: self.sc.max_datagram,
                    });
                }
                let queue = &mut self.queue;
                let sent = self
                    .net
                    .send(now, h, t.local, t.remote, data, &mut |at, e| {
                        queue.schedule(at, EventKind::Net(e))
                    });
                if sent.is_none() {
                    self.report.no_route[h.index()] += 1;
                }
            }
            self.tx.built = built; // empty, its memory kept
        }
        Err(FailureKind::Livelock {
            host: h,
            what: format!(
                "poll_transmit() produced more than {FLUSH_LIMIT} datagrams at t = {:?}",
                self.now
            ),
        })
    }

    /// Accepts connections and handles application events. Returns whether there were any.
    fn poll_events(&mut self, h: HostId) -> Result<bool, FailureKind> {
        let now = self.now;
        let acceptable = self.close_acceptable();
        let host = &mut self.hosts[h.index()];
        let mut any = false;
        while let Some(c) = host.endpoint.accept() {
            any = true;
            if host.conn.is_some() {
                return Err(FailureKind::UnexpectedConnection { host: h });
            }
            host.conn = Some(c);
        }
        while let Some((c, ev)) = host.endpoint.poll_event() {
            any = true;
            if host.conn != Some(c) {
                continue;
            }
            match ev {
                Event::Connected => {
                    self.report.connected_at[h.index()].get_or_insert(now);
                }
                Event::LinkAdded { link } => {
                    map_link(host, &self.net, link);
                }
                Event::LinkStateChanged { link, from, to } => {
                    let net_link = map_link(host, &self.net, link);
                    self.report.link_changes.push(LinkChange {
                        at: now,
                        host: h,
                        link: net_link,
                        engine_link: link,
                        from,
                        to,
                    });
                }
                Event::Closed(reason) => {
                    host.closed = true;
                    self.report.closes.push(CloseRecord {
                        at: now,
                        host: h,
                        reason: reason.clone(),
                    });
                    match reason {
                        // A clean close means everything was delivered and acknowledged.
                        None => {
                            host.sender.complete_at.get_or_insert(now);
                        }
                        Some(reason) if !acceptable => {
                            return Err(FailureKind::UnexpectedClose { host: h, reason })
                        }
                        Some(_) => {}
                    }
                }
                _ => {}
            }
        }
        Ok(any)
    }

    /// Runs the host's application: write, read, check. Returns whether anything changed.
    fn app_step(&mut self, h: HostId) -> Result<bool, FailureKind> {
        let now = self.now;
        let host = &mut self.hosts[h.index()];
        let Some(c) = host.conn else {
            return Ok(false);
        };
        let Some(conn) = host.endpoint.connection_mut(c) else {
            return Ok(false);
        };
        let wrote = host.sender.step(now, conn)?;
        let read = host.receiver.step(now, conn, &mut self.rx_buf)?;
        if read.bytes > 0 {
            let t = &mut self.report.transfers[Dir::from_sender(h).reverse().index()];
            t.delivered += read.bytes;
            let bucket = (now.as_nanos() / BUCKET.as_nanos()) as usize;
            if t.timeline.len() <= bucket {
                t.timeline.resize(bucket + 1, 0);
            }
            t.timeline[bucket] += read.bytes;
        }
        if let Some(at) = read.wake_at {
            if host.wake_at != Some(at) {
                host.wake_gen += 1;
                host.wake_at = Some(at);
                let gen = host.wake_gen;
                self.schedule(at, EventKind::ReaderWake { host: h, gen });
            }
        }
        Ok(wrote || read.progress)
    }

    /// Records buffer peaks and checks them against the configured bounds.
    fn sample(&mut self, h: HostId) -> Result<(), FailureKind> {
        let host = &self.hosts[h.index()];
        let Some(conn) = host.conn.and_then(|c| host.endpoint.connection(c)) else {
            return Ok(());
        };
        let stats = conn.stats();
        self.report.ciphers[h.index()] = stats.cipher;
        let peaks: &mut BufferPeaks = &mut self.report.buffers[h.index()];
        peaks.send_buffered = peaks.send_buffered.max(stats.send_buffered);
        peaks.recv_buffered = peaks.recv_buffered.max(stats.recv_buffered);
        for (what, value, limit) in [
            ("send_buffered", stats.send_buffered, host.send_limit),
            ("recv_buffered", stats.recv_buffered, host.recv_limit),
        ] {
            if value > limit {
                return Err(FailureKind::MemoryBound {
                    host: h,
                    what,
                    value,
                    limit,
                });
            }
        }
        Ok(())
    }

    /// Schedules the host's timer at `poll_timeout()` (never before now) unless already pending.
    fn rearm(&mut self, h: HostId) {
        let (now, base) = (self.now, self.base);
        let host = &mut self.hosts[h.index()];
        let at = host
            .endpoint
            .poll_timeout()
            .map(|t| t.saturating_duration_since(base).max(now));
        if at == host.timer_at {
            return;
        }
        host.timer_gen += 1;
        host.timer_at = at;
        if let Some(at) = at {
            let gen = host.timer_gen;
            self.schedule(at, EventKind::Timer { host: h, gen });
        }
    }
}

/// The network link of the engine's link `link`, from the connection's statistics (cached).
fn map_link(host: &mut Host, net: &Network, link: LinkId) -> Option<usize> {
    if let Some((_, m)) = host.link_map.iter().find(|(l, _)| *l == link) {
        if m.is_some() {
            return *m;
        }
    }
    let conn = host.endpoint.connection(host.conn?)?;
    let stats = conn.stats();
    let m = stats
        .links
        .iter()
        .find(|l| l.id == link)
        .and_then(|l| net.route(host.id, l.local, l.remote));
    host.link_map.retain(|(l, _)| *l != link);
    host.link_map.push((link, m));
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads() {
        let mut sc = Scenario::default();
        let w = workload(&sc, Dir::BToA);
        assert_eq!((w.bytes, w.messages), (0, 0));
        sc.app.bidirectional = true;
        sc.app.mode = AppMode::Messages {
            count: 5,
            max_size: 100,
        };
        let (a, b) = (workload(&sc, Dir::AToB), workload(&sc, Dir::BToA));
        assert_eq!((a.bytes, a.messages, b.messages), (0, 5, 5));
        assert_ne!(a.seed, b.seed);
    }

    #[test]
    fn invalid_scenario_is_reported_with_seed() {
        let sc = Scenario {
            links: Vec::new(),
            seed: 1234,
            ..Scenario::default()
        };
        let e = run(&sc).unwrap_err();
        assert!(matches!(e.kind, FailureKind::InvalidScenario(_)));
        let msg = e.to_string();
        assert!(msg.contains("seed 1234"), "{msg}");
        assert!(msg.contains("links: []"), "{msg}");
    }
}
