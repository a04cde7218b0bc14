//! The driver: runs the sans-IO engine on real sockets, with one communication thread per
//! shard of an endpoint (see `shards.rs`) beside the application's threads.
//!
//! All of a shard's engine state sits behind one mutex, held for bookkeeping only: no system
//! call is made under it, packets are sealed after it is released (the engine hands out each
//! datagram's [`Seal`](ri2n_proto::Seal)) and opened before it is taken (`open_ahead.rs`), so
//! application and communication threads work on different cores at once. The library
//! reaches that state through methods of [`Shared`] and [`State`] only.
//!
//! Data moves one way, a turn of the pump at a time, whichever thread turns it
//! ([`Shared::receive`]): receive, hand to the engine, send what the engine then has to send
//! (or, with lanes, hand it to the link sockets' own sending threads: `outgoing.rs`), wake the
//! calls concerned. An application call's turn starts at the engine
//! ([`Shared::after_app_call`]). A long sending streak takes in what arrived between its
//! rounds ([`Shared::take_in`]) and wakes whom it concerns, without starting a turn of its
//! own inside it.
//!
//! Which thread turns the pump: application calls send what their writes produce from their
//! own thread and, while blocked, watch the sockets and receive for themselves, so neither
//! direction waits for a thread hop; so does an application's event loop that waits through
//! [`Shared::wait_receiving`] on its own epoll set. The communication thread (RI2N's "RI2N
//! thread") runs timers, retransmissions and probes without the application calling in, and
//! keeps a connected socket per path in use ([`Shared::update_path_sockets`]). Three devices
//! keep threads from waking for nothing, each with a test that fails without it:
//! - the poller turn ([`PollerTurn`]; `tests/wakeups.rs`): a call woken only for another
//!   connection's call leaves the sockets to that one;
//! - the step-back in a process confined to one CPU ([`STEP_BACK`],
//!   [`yield_to_busy_threads`]; `tests/one_cpu.rs`), and after an event loop's wait on any
//!   number of CPUs (`tests/wakeups.rs`);
//! - single takes ([`Receiver::take_for`]; `tests.rs`): one datagram at a time is taken
//!   with one `recvmsg`.
//!
//! Where the process may use many CPUs ([`LinkThreads`](ri2n_proto::LinkThreads)), each link
//! socket also has a thread that receives ([`RecvLane`]): it watches that socket and the
//! link's path sockets in an epoll instance of its own and turns the pump for what arrives
//! there, into receive buffers of that link's own, so that one connection's links are
//! received and opened on a core each. A blocked application call still receives for itself:
//! its instance is woken first.
//!
//! What a driver owes the protocol (unreachable paths, MTU ceilings, next-hop confirmation):
//! docs/PROTOCOL.md §6.7–§6.9.
//!
//! Each stage of the pump has a file: `receive.rs` (receive and hand to the engine; the
//! receiving lanes), `transmit.rs` (build, seal and send; the sending lanes), `wake.rs` (the
//! engine's events to the calls they concern). `wait.rs` holds the calls that wait; this file
//! the shared state, the driver thread ([`run`]), and starting and stopping.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use ri2n_proto::{ConnectionHandle, ConnectionState, Endpoint as ProtoEndpoint};

use crate::connection::TimedEvent;
use crate::outgoing::{lanes_wanted, Backlog, Lane, Outgoing};
use crate::readiness::Watchers;
use crate::sched::yield_to_busy_threads;
use crate::shards::{AcceptQueue, Router};
use crate::socket::{LinkSocket, Received};

mod receive;
mod transmit;
mod wait;
mod wake;

use receive::{recv_lane, Receiver, RecvLane};
use transmit::lane;
use wait::{CallerPoll, PollerTurn, Signal};

const WAKE_TOKEN: Token = Token(usize::MAX);
/// The kernel's link-change notifications (see `carrier.rs`).
const CARRIER_TOKEN: Token = Token(usize::MAX - 1);
/// The descriptor a call of [`Shared::wait_receiving`] waits on besides the sockets.
const READY_TOKEN: Token = Token(usize::MAX - 2);
/// Longest the driver thread sleeps while a timer that traffic arms is due within
/// [`BUSY_HORIZON`].
const TICK: Duration = Duration::from_millis(1);
const BUSY_HORIZON: Duration = Duration::from_millis(50);
/// How long the driver thread leaves the sockets to the application after a call waited on
/// them, in a process confined to one CPU. There the driver thread shares that CPU with the
/// application's threads and can work in parallel with none of them: an arrival that found
/// the application thread between two calls (a request-response exchange whose reply woke
/// the peer, which then ran first) woke the driver thread only to receive what the
/// application thread was about to receive itself, one more context switch per message
/// (item 14 of "What looked wrong" in docs/BENCHMARKS.md at commit 085a7a3).
/// An arrival that no call takes waits at most this long, as it could already wait for a
/// driver thread under `SCHED_BATCH` behind a busy application thread on that CPU (up to a
/// scheduler tick). A call that blocks without watching the sockets gives them back at once.
///
/// After an event loop's wait ([`Shared::wait_receiving`]) it steps back on any number of
/// CPUs: the loop handles every arrival itself (a tunnel writes it to its device), so a batch
/// the driver thread took in while the loop was busy only reached the loop through a wake-up,
/// one more thread and one more hand-over of the engine's lock per batch, and the loop is
/// back at the sockets as soon as it is done (`tests/wakeups.rs`).
const STEP_BACK: Duration = TICK;
/// How many receives of a waiting call take one datagram alone from a source whose last
/// batch receive found exactly one, before a batch receive looks again (see
/// [`Receiver::take_for`]): traffic that turns busy is received in batches again within this
/// many receives.
const SINGLE_TAKES: u8 = 16;
/// Longest [`Shared::abort_all`] waits for the second round of the CLOSEs (the engine sends it
/// at most 100 ms after the first): a driver thread that never comes to it cannot hold a
/// process that is exiting.
const CLOSE_REPEAT_WAIT: Duration = Duration::from_millis(250);
/// Most path sockets open at once (one bit each in [`Shared::open_paths`]); the paths beyond
/// use their link socket, as all did before path sockets.
const MAX_PATH_SOCKETS: usize = 64;
/// How often the next hops of the paths in use are confirmed to the OS (see
/// [`LinkSocket::confirm_next_hop`]): well within Linux's 5 s before an unconfirmed neighbour
/// entry is probed.
const CONFIRM_PERIOD: Duration = Duration::from_millis(500);
/// Batches the driver thread takes from one socket before its other work (the engine's
/// timers, refusals, path sockets) and then comes back: a socket that stays full (a flood, a
/// peer faster than this thread) must not hold every timer of the shard back.
const BATCHES_PER_ROUND: usize = 64;
/// How long after the peer was last heard on a path its next hop is still confirmed: outages
/// up to this long end without address resolution. After it the OS resolves the address
/// again, in case the peer's interface was replaced meanwhile.
const NEXT_HOP_HOLD: Duration = Duration::from_secs(15 * 60);

/// Engine state shared between the driver thread and application threads.
#[derive(Debug)]
pub(crate) struct State {
    endpoint: ProtoEndpoint,
    /// Events per connection, for `Connection::poll_events`.
    events: HashMap<ConnectionHandle, VecDeque<TimedEvent>>,
    /// Connections whose application handle was dropped: released once closed.
    dropped: HashSet<ConnectionHandle>,
    /// What callers waiting on a connection wait on, by connection.
    signals: HashMap<ConnectionHandle, Signal>,
    /// Calls waiting on any connection's condition variable (the sum of the `waiting` counts
    /// of `signals`, kept apart so that it is known without visiting every connection).
    signal_waiters: usize,
    /// Readiness descriptors of connections whose application asked for one.
    readiness: HashMap<ConnectionHandle, Arc<Watchers>>,

    /// When the driver thread will next wake up by itself.
    driver_deadline: Option<Instant>,
    /// Until when the driver thread leaves the sockets to application calls ([`STEP_BACK`]).
    callers_watch_until: Option<Instant>,
    /// Which blocked call watches the sockets (see [`Shared::wait_connection`]).
    turn: PollerTurn,
    /// A connection was established or a link came up: the driver thread confirms next hops
    /// and opens path sockets at once, not at its next round (a short exchange would be over
    /// by then).
    paths_changed: bool,
    /// Datagrams built and not yet sent.
    out: Outgoing,
    /// The endpoint lives, so its application may still accept the connections the engine
    /// hands over; once it is gone they are aborted ([`Shared::stop_accepting`]).
    accepting: bool,
    /// Closes under way ([`Shared::close_all`]): until they end, dropped connections that
    /// close are not released, so that each close counts what they left undelivered.
    closes: usize,
    /// Application calls waiting on `lanes_caught_up`.
    paced: usize,
}

impl State {
    /// Ends connection `h`, which the application will never accept, and lets go of it once
    /// closed.
    fn abort_unaccepted(&mut self, h: ConnectionHandle) {
        if let Some(c) = self.endpoint.connection_mut(h) {
            c.abort(0, crate::connection::UNACCEPTED);
        }
        self.dropped.insert(h);
    }

    /// The engine, to look at.
    pub fn engine(&self) -> &ProtoEndpoint {
        &self.endpoint
    }

    /// The engine, for an application call (the caller then hands the guard back through
    /// [`Shared::after_app_call`], which sends what the call produced).
    pub fn engine_mut(&mut self) -> &mut ProtoEndpoint {
        &mut self.endpoint
    }

    /// Signals `watchers` at each of connection `h`'s events from now on.
    pub fn watch(&mut self, h: ConnectionHandle, watchers: Arc<Watchers>) {
        self.readiness.insert(h, watchers);
    }

    /// Connection `h`'s state-change events queued so far, oldest first.
    pub fn take_events(&mut self, h: ConnectionHandle) -> Vec<TimedEvent> {
        (self.events.get_mut(&h)).map_or_else(Vec::new, |q| q.drain(..).collect())
    }

    /// Connection `h`'s application handle is gone: the engine releases it once closed.
    pub fn release_when_closed(&mut self, h: ConnectionHandle) {
        self.dropped.insert(h);
    }
}

/// What the driver thread and the application handles share.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<State>,
    sockets: Vec<LinkSocket>,
    /// This driver's number among its endpoint's shards (see `shards.rs`).
    shard: usize,
    /// Where this shard forwards what arrived for another one, and finds what others
    /// forwarded to it.
    router: Arc<Router>,
    /// Where this shard's engine hands the connections it accepted.
    accepts: Arc<AcceptQueue>,
    /// The receive buffers, each for one thread at a time: holding them from `recvmmsg` until
    /// the engine has the datagrams keeps each socket's arrivals in order (two threads
    /// receiving from one socket at once could hand the engine a later batch first, which
    /// looks like loss). Without receiving lanes, one for every socket: what is received is
    /// handed to the engine under its one lock anyway, and on few CPUs two threads receiving
    /// from two links at once only waited on that lock in turn, with the engine's and the
    /// stream's memory moving between their cores (item 12 of "What looked wrong" in
    /// docs/BENCHMARKS.md at commit 085a7a3). With them, one per link socket, for the link's
    /// sources ([`Shared::receiver_of`]): receiving and opening then run on a core per link,
    /// and only the hand-over to the engine takes turns.
    receivers: Vec<Mutex<Receiver>>,
    /// Per receive source (the link sockets, then the path-socket slots: see
    /// [`Shared::sources`]): how many threads announced that they want to receive from it
    /// since the buffers' holder last looked (a count, not a flag: the holder tells its own
    /// announcement from one of a thread it turned away).
    receive_wanted: Vec<AtomicU32>,
    /// Per path-socket slot (see [`crate::socket::PathSocket`]; receive source and epoll
    /// token `sockets.len() + slot`): the link socket that holds it, `usize::MAX` when empty.
    /// Opened and closed by the driver thread only.
    path_links: Vec<AtomicUsize>,
    /// Which slots hold a path socket, one bit each.
    open_paths: AtomicU64,
    /// The epoll instance of [`CallerPoll`] (its lock may be held by a waiting call when the
    /// driver thread registers a path socket there).
    caller_epoll: RawFd,
    /// Wakes the driver thread (shared with the router, for forwarded datagrams).
    waker: Arc<Waker>,
    shutdown: AtomicBool,
    caller_poll: Mutex<CallerPoll>,
    /// An application thread waits in [`CallerPoll`]: events for it are signalled through
    /// `caller_waker`. Set under the engine's lock; cleared without it as soon as the thread
    /// is awake, so what it then receives itself does not write its waker (one more pass
    /// through `poll` for nothing). A wake-up racing with the clearing is a spurious one.
    caller_polling: AtomicBool,
    /// Wakes the thread waiting in `caller_poll` for events that are not arrivals (timers).
    caller_waker: Waker,
    /// The process may run on one CPU only: the driver thread steps back ([`STEP_BACK`]).
    one_cpu: bool,
    /// Per link socket, its lane (see `outgoing`); none: the thread that builds sends.
    lanes: Vec<Lane>,
    /// Per link socket, its receiving thread's; none: the threads that watch all sockets
    /// receive.
    recv_lanes: Vec<RecvLane>,
    /// What the lanes, or threads sending a short transmission themselves, have not sent.
    backlog: Arc<Backlog>,
    /// Signalled when a lane had the engine build again after the backlog had stopped it:
    /// what application calls paced behind the lanes wait on ([`Shared::pace_datagrams`]).
    lanes_caught_up: Condvar,
    /// Batches of several datagrams sent gathered from the send buffer, and from one buffer.
    #[cfg(test)]
    pub(crate) sent_gathered: AtomicUsize,
    #[cfg(test)]
    pub(crate) sent_whole: AtomicUsize,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This shard's number among its endpoint's shards.
    pub fn shard(&self) -> usize {
        self.shard
    }

    /// Whether each link socket has a lane (see `outgoing`).
    pub fn has_lanes(&self) -> bool {
        !self.lanes.is_empty()
    }

    /// Whether each link socket has a receiving thread ([`RecvLane`]).
    pub fn has_recv_lanes(&self) -> bool {
        !self.recv_lanes.is_empty()
    }

    /// The receive buffers ([`Self::receivers`]) that source `i` is received into: its link
    /// socket's with receiving lanes, else the only ones (also for an empty path slot, which
    /// receives nothing).
    fn receiver_of(&self, i: usize) -> usize {
        if self.receivers.len() == 1 {
            return 0;
        }
        let n = self.sockets.len();
        if i < n {
            return i;
        }
        let link = self.path_links[i - n].load(Ordering::Acquire);
        if link < n {
            link
        } else {
            0
        }
    }

    /// The link sockets' local addresses.
    pub fn local_addrs(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.sockets.iter().map(|s| s.local)
    }

    /// The impairment switch of the link socket bound to `local`.
    pub fn impairment(&self, local: SocketAddr) -> Option<Arc<crate::Impairment>> {
        (self.sockets.iter())
            .find(|s| s.local == local)
            .map(|s| s.impairment.clone())
    }

    /// Every receive source that has a socket: the link sockets (`0..sockets.len()`), then
    /// the open path sockets (`sockets.len() + slot`).
    fn sources(&self) -> impl Iterator<Item = usize> + '_ {
        let n = self.sockets.len();
        let mut open = self.open_paths.load(Ordering::Acquire);
        (0..n).chain(std::iter::from_fn(move || {
            let slot = (open != 0).then(|| open.trailing_zeros() as usize)?;
            open &= open - 1;
            Some(n + slot)
        }))
    }

    /// The link socket of receive source `source` (itself, or the one a path socket shares
    /// its address and port with), and the path socket's slot; `None` for an empty slot.
    fn link_of(&self, source: usize) -> Option<(&LinkSocket, Option<usize>)> {
        let n = self.sockets.len();
        if source < n {
            return Some((&self.sockets[source], None));
        }
        let slot = source - n;
        let link = self.path_links.get(slot)?.load(Ordering::Acquire);
        Some((self.sockets.get(link)?, Some(slot)))
    }

    /// After the application changed the engine: send what it produced, publish events, and
    /// wake the driver if the engine now needs it earlier than planned. The lock is released
    /// while sending, and held again when this returns.
    pub fn after_app_call<'a>(&'a self, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        let mut st = self.transmit(st, None);
        self.dispatch(&mut st, None).notify();
        self.arm_driver(&mut st);
        st
    }

    /// The kernel said some interface changed: each socket reads its interface's carrier and
    /// MTU again, and the engine learns of an MTU that changed (its links search their path
    /// MTU again).
    fn interfaces_changed(&self) {
        let mut mtus = Vec::new();
        for s in &self.sockets {
            s.refresh_carrier();
            if let Some(max) = s.refresh_max_datagram() {
                tracing::debug!(local = %s.local, max_datagram = ?max, "interface MTU changed");
                mtus.push((s.local, max));
            }
        }
        if !mtus.is_empty() {
            let mut st = self.lock();
            for (local, max) in mtus {
                st.engine_mut().set_local_max_datagram(local, max);
            }
            drop(self.after_app_call(st));
        }
    }

    /// Wakes the driver thread if the engine's next timer is earlier than the driver planned
    /// to wake up: after an application thread changed the engine (its call, or datagrams it
    /// received while waiting).
    fn arm_driver(&self, st: &mut State) {
        // the engine's timer index is brought up to date by the driver thread
        if let Some(next) = st.endpoint.timeout_before(st.driver_deadline) {
            st.driver_deadline = Some(next);
            let _ = self.waker.wake();
        }
    }
}

/// What closing an endpoint left undelivered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Undelivered {
    /// Connections whose peer had not acknowledged everything written to them.
    pub connections: usize,
    /// Bytes written to them and not acknowledged.
    pub bytes: u64,
}

impl Shared {
    /// Closes every connection: finishes its outgoing streams and waits until `deadline`
    /// (`None`: as long as it takes) for each to be closed or, if its peer is still sending,
    /// for everything written to be acknowledged; then aborts what remains, so no peer is left
    /// waiting. Reports what was not delivered.
    pub fn close_all(&self, deadline: Option<Instant>) -> Undelivered {
        // how often the waiting thread looks again (nothing signals "acknowledged")
        const RECHECK: Duration = Duration::from_millis(10);
        let mut st = self.lock();
        st.closes += 1;
        let handles: Vec<ConnectionHandle> = st.endpoint.connection_handles().collect();
        for &h in &handles {
            if let Some(c) = st.endpoint.connection_mut(h) {
                c.finish();
            }
        }
        st = self.after_app_call(st);
        loop {
            // still worth waiting for: open, and either our data is not delivered yet or
            // the peer is done too (then the clean end follows shortly); not a handshake
            // with nothing written, which has nothing to deliver, nor a connection that
            // ended cleanly and lingers for the peer's retransmissions (below)
            let waiting = handles.iter().copied().find(|&h| {
                st.endpoint.connection(h).is_some_and(|c| match c.state() {
                    ConnectionState::Closed | ConnectionState::Draining => false,
                    ConnectionState::Connecting => c.stats().send_buffered > 0,
                    _ => !c.is_send_complete() || c.is_receive_complete(),
                })
            });
            let Some(h) = waiting else { break };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            let until = deadline.map_or(now + RECHECK, |d| d.min(now + RECHECK));
            st = self.wait_connection(st, h, Some(until));
        }
        let mut undelivered = Undelivered::default();
        for &h in &handles {
            let Some(c) = st.endpoint.connection(h) else {
                continue;
            };
            let clean = c.state() == ConnectionState::Closed && c.close_reason().is_none();
            let buffered = c.stats().send_buffered;
            // a connection never set up (its handshake going on, or failed), or one that
            // ended (the peer aborted it), with nothing written unacknowledged, had nothing
            // to deliver: only the end of its stream, which no peer is waiting for
            let settled = matches!(
                c.state(),
                ConnectionState::Connecting | ConnectionState::Closed
            );
            let nothing_to_deliver = settled && buffered == 0;
            if !(clean || c.is_send_complete() || nothing_to_deliver) {
                undelivered.connections += 1;
                undelivered.bytes += buffered;
            }
        }
        st.closes -= 1;
        // Those that ended cleanly end their linger, telling the peer that all it sent
        // arrived: aborted, their peers took a complete exchange for a failure.
        for &h in &handles {
            if let Some(c) = st.endpoint.connection_mut(h) {
                c.end_drain();
            }
        }
        // the rest are still open: their peers are not left waiting (connections that came
        // in meanwhile are not this close's: a server goes on accepting)
        self.abort_each(st, &handles, 0, "the peer's endpoint was closed");
        undelivered
    }

    /// The endpoint's last handle is gone, though connections of this shard may live on:
    /// new handshakes are refused, and each connection that nobody can accept any more (in
    /// the accept queue, and those the engine hands over from now on) is aborted, so that its
    /// client learns that nothing read what it sent. (Closed gracefully with the rest, their
    /// clients took the end for a delivery.) The queue is emptied under the engine's lock,
    /// which the driver holds when it fills it: none slips in after.
    pub fn stop_accepting(&self) {
        let mut st = self.lock();
        st.accepting = false;
        st.endpoint.stop_accepting();
        let queued = self.accepts.take_shard(self.shard);
        let pending: Vec<ConnectionHandle> = std::iter::from_fn(|| st.endpoint.accept())
            .chain(queued)
            .collect();
        for h in pending {
            st.abort_unaccepted(h);
        }
        drop(self.after_app_call(st));
    }

    /// Aborts every connection of this shard that is still open, telling each peer `code`
    /// and `reason`, and returns once their CLOSE packets have left, the second round's too
    /// (PROTOCOL.md §8.3: the driver thread sends it a few milliseconds later).
    pub fn abort_all(&self, code: u64, reason: &str) {
        let st = self.lock();
        let handles: Vec<ConnectionHandle> = st.endpoint.connection_handles().collect();
        self.abort_each(st, &handles, code, reason);
    }

    /// [`Self::abort_all`] of the connections `handles` only.
    fn abort_each(
        &self,
        mut st: MutexGuard<'_, State>,
        handles: &[ConnectionHandle],
        code: u64,
        reason: &str,
    ) {
        for &h in handles {
            if let Some(c) = st.endpoint.connection_mut(h) {
                if c.state() != ConnectionState::Closed {
                    c.abort(code, reason);
                }
            }
        }
        let mut st = self.wait_until_sent(self.after_app_call(st));
        let until = Instant::now() + CLOSE_REPEAT_WAIT;
        while st.endpoint.closes_pending() && Instant::now() < until {
            drop(st);
            std::thread::sleep(Duration::from_millis(1));
            st = self.lock();
        }
        drop(self.wait_until_sent(st));
    }

    /// Waits until the thread sending the queue, if another one is, and the lanes have sent
    /// everything:
    /// what a close queued behind it (the CLOSE of a connection aborted a moment ago) would
    /// otherwise be lost when the process ends right after, and the peer would keep waiting
    /// for a host that is gone. Sending never blocks (the sockets are non-blocking) and
    /// nothing new is written to closed connections, so the wait is short.
    fn wait_until_sent<'a>(&'a self, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        const RECHECK: Duration = Duration::from_micros(200);
        while st.out.sending || !st.out.queue.is_empty() || self.backlog.any_unsent() {
            if !st.out.sending && !st.out.queue.is_empty() {
                st = self.transmit(st, None);
                continue;
            }
            drop(st);
            std::thread::sleep(RECHECK);
            st = self.lock();
        }
        st
    }
}

/// Owns the driver thread; the last owner (endpoint or connection) stops it.
#[derive(Debug)]
pub(crate) struct Driver {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The lanes' threads, sending and receiving.
    lane_threads: Mutex<Vec<JoinHandle<()>>>,
}

/// Watches socket `fd` for arrivals with `EPOLLEXCLUSIVE`: of the epoll instances watching
/// it, an arrival wakes only the first one with a waiting thread (the next ones if none
/// waits). Edge-triggered (`edge`, as mio does) for the driver thread, which drains each
/// socket it is told of; level-triggered for the waiting calls, which may take one datagram
/// and leave the rest to their next wait (see [`Receiver::take_for`]). mio has no such
/// options, so the raw `epoll_ctl`; mio reads the token back from the event's data as usual.
fn register_exclusive(epoll: RawFd, fd: RawFd, token: Token, edge: bool) -> std::io::Result<()> {
    let et = if edge { libc::EPOLLET } else { 0 };
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | et | libc::EPOLLEXCLUSIVE) as u32,
        u64: token.0 as u64,
    };
    // SAFETY: both descriptors are open (the poll and the socket outlive the registration)
    // and `ev` is a valid epoll_event for the duration of the call.
    let rc = unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, fd, &mut ev) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Stops watching socket `fd` on epoll instance `epoll` (see [`register_exclusive`]).
fn deregister(epoll: RawFd, fd: RawFd) -> std::io::Result<()> {
    // SAFETY: both descriptors are open; EPOLL_CTL_DEL ignores the event argument.
    let rc = unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl Driver {
    /// What the driver thread shares with the application's calls.
    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Starts shard `shard` of an endpoint: its engine on its sockets.
    pub fn start(
        endpoint: ProtoEndpoint,
        sockets: Vec<LinkSocket>,
        shard: usize,
        router: Arc<Router>,
        accepts: Arc<AcceptQueue>,
    ) -> std::io::Result<Arc<Self>> {
        let keyed = endpoint.config().key.is_some();
        let lanes: Vec<Lane> = if lanes_wanted(endpoint.config().send_threads) {
            sockets.iter().map(|_| Lane::default()).collect()
        } else {
            Vec::new()
        };
        // a receiving lane's epoll instance, to be moved to its thread
        let recv_polls: Vec<Poll> = if lanes_wanted(endpoint.config().recv_threads) {
            sockets
                .iter()
                .map(|_| Poll::new())
                .collect::<Result<_, _>>()?
        } else {
            Vec::new()
        };
        let recv_lanes: Vec<RecvLane> = (recv_polls.iter())
            .map(RecvLane::new)
            .collect::<std::io::Result<_>>()?;
        let backlog = Arc::new(Backlog::default());
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE_TOKEN)?);
        router.set_waker(shard, waker.clone());
        let caller_poll = Poll::new()?;
        let caller_waker = Waker::new(caller_poll.registry(), WAKE_TOKEN)?;
        for (i, s) in sockets.iter().enumerate() {
            let fd = s.io.as_raw_fd();
            // the caller's instance first: an arrival wakes the first exclusive watcher that
            // has a thread waiting, so a blocked application call receives for itself and the
            // driver thread sleeps on (on one CPU that saves two context switches per datagram)
            register_exclusive(caller_poll.as_raw_fd(), fd, Token(i), false)?;
            let watcher = recv_polls.get(i).unwrap_or(&poll);
            register_exclusive(watcher.as_raw_fd(), fd, Token(i), true)?;
        }
        // best effort: without notifications a pulled cable is found by the engine's own
        // failure detection, and the link may take up to a second longer to come back
        let link_changes = match crate::carrier::LinkChanges::open() {
            Ok(l) => {
                poll.registry().register(
                    &mut SourceFd(&l.as_raw_fd()),
                    CARRIER_TOKEN,
                    Interest::READABLE,
                )?;
                Some(l)
            }
            Err(e) => {
                tracing::warn!(error = %e, "no link-change notifications: carrier not tracked");
                None
            }
        };
        for s in &sockets {
            if link_changes.is_some() {
                // read again now that changes are heard: one since the socket was bound
                // would otherwise be missed until the next change
                s.refresh_carrier();
            } else {
                // nothing would read it again: a link without carrier at start would never
                // send, so the engine's failure detection judges every link instead
                s.assume_carrier();
            }
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                endpoint,
                events: HashMap::new(),
                dropped: HashSet::new(),
                signals: HashMap::new(),
                signal_waiters: 0,
                readiness: HashMap::new(),
                driver_deadline: None,
                callers_watch_until: None,
                turn: PollerTurn::default(),
                paths_changed: false,
                out: Outgoing::new(&sockets, !lanes.is_empty(), backlog.clone()),
                accepting: true,
                closes: 0,
                paced: 0,
            }),
            shard,
            router,
            accepts,
            receivers: (0..recv_lanes.len().max(1))
                .map(|_| Receiver::new(&sockets, keyed).map(Mutex::new))
                .collect::<std::io::Result<_>>()?,
            receive_wanted: (0..sockets.len() + MAX_PATH_SOCKETS)
                .map(|_| AtomicU32::new(0))
                .collect(),
            path_links: (0..MAX_PATH_SOCKETS)
                .map(|_| AtomicUsize::new(usize::MAX))
                .collect(),
            open_paths: AtomicU64::new(0),
            caller_epoll: caller_poll.as_raw_fd(),
            sockets,
            waker,
            shutdown: AtomicBool::new(false),
            caller_poll: Mutex::new(CallerPoll::new(caller_poll)),
            caller_polling: AtomicBool::new(false),
            caller_waker,
            one_cpu: confined_to_one_cpu(),
            lanes,
            recv_lanes,
            backlog,
            lanes_caught_up: Condvar::new(),
            #[cfg(test)]
            sent_gathered: AtomicUsize::new(0),
            #[cfg(test)]
            sent_whole: AtomicUsize::new(0),
        });
        // Held from here on: a thread that cannot be started (no thread left to the process)
        // drops it, and the drop stops and joins what was started, so no thread keeps the
        // sockets bound after the error.
        let driver = Arc::new(Self {
            shared,
            thread: Mutex::new(None),
            lane_threads: Mutex::new(Vec::new()),
        });
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            let t = std::thread::Builder::new().name(name).spawn(f)?;
            driver.lane_threads.lock().unwrap().push(t);
            std::io::Result::Ok(())
        };
        for i in 0..driver.shared.lanes.len() {
            let lane_shared = driver.shared.clone();
            spawn(
                format!("ri2n-send-{shard}.{i}"),
                Box::new(move || lane(&lane_shared, i)),
            )?;
        }
        for (i, recv_poll) in recv_polls.into_iter().enumerate() {
            let lane_shared = driver.shared.clone();
            spawn(
                format!("ri2n-recv-{shard}.{i}"),
                Box::new(move || recv_lane(&lane_shared, i, recv_poll)),
            )?;
        }
        let thread_shared = driver.shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ri2n-driver-{shard}"))
            .spawn(move || run(thread_shared, poll, link_changes))?;
        *driver.thread.lock().unwrap() = Some(thread);
        Ok(driver)
    }
}

impl Drop for Driver {
    /// The last handle is gone: deliver what was written before stopping (at most the
    /// endpoint's `close_linger`), or the process could exit with it unsent.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let linger = self.shared.lock().endpoint.config().close_linger;
            let lost = self.shared.close_all(Instant::now().checked_add(linger));
            if lost.connections > 0 {
                tracing::warn!(
                    connections = lost.connections,
                    bytes = lost.bytes,
                    local = ?self.shared.local_addrs().collect::<Vec<_>>(),
                    "endpoint dropped with data its peers never acknowledged"
                );
            }
        }
        self.shared.shutdown.store(true, Ordering::Release);
        let _ = self.shared.waker.wake();
        if let Some(t) = self.thread.lock().unwrap().take() {
            let _ = t.join();
        }
        for lane in &self.shared.lanes {
            lane.stop();
        }
        for lane in &self.shared.recv_lanes {
            lane.stop();
        }
        for t in self.lane_threads.lock().unwrap().drain(..) {
            let _ = t.join();
        }
        self.shared.router.close(self.shared.shard);
    }
}

/// The driver thread.
fn run(shared: Arc<Shared>, mut poll: Poll, link_changes: Option<crate::carrier::LinkChanges>) {
    yield_to_busy_threads();
    let mut events = Events::with_capacity(64);
    // with receiving lanes, the sockets are theirs to watch
    let lanes_receive = shared.has_recv_lanes();
    let mut readable = vec![!lanes_receive; shared.receive_wanted.len()];
    let mut next_confirm = Instant::now();
    let mut forwarded = Vec::new();
    // the last confirmation round found paths to confirm: wake up for the next one
    let mut confirming = false;
    // the sockets are registered with `poll` (not while application calls watch them)
    let mut watching = !lanes_receive;
    while !shared.shutdown.load(Ordering::Acquire) {
        // receive what is waiting (mio is edge-triggered: drain until empty, over as many
        // rounds as it takes; a socket left readable is come back to without sleeping)
        for (i, r) in readable.iter_mut().enumerate() {
            for _ in 0..BATCHES_PER_ROUND {
                if !*r {
                    break;
                }
                *r = shared.receive(i, false, None, false).0 == Received::MoreMayWait;
            }
        }
        let more_waiting = readable.iter().any(|&r| r);
        let (timeout, wakeups, confirm, watch, passed_on) = {
            shared.router.take(shared.shard, &mut forwarded);
            let mut st = shared.lock();
            let now = Instant::now();
            let mut passed_on = shared.take_forwarded(&mut st, now, &mut forwarded);
            passed_on |= shared.hand_over_refusals(&mut st, Some(now));
            if st.endpoint.poll_timeout().is_some_and(|t| t <= now) {
                st.endpoint.handle_timeout(now);
            }
            let confirm = if now >= next_confirm || std::mem::take(&mut st.paths_changed) {
                next_confirm = now + CONFIRM_PERIOD;
                let paths = st.endpoint.heard_paths(now, NEXT_HOP_HOLD);
                confirming = !paths.is_empty();
                Some(paths)
            } else {
                None
            };
            let mut st = shared.transmit(st, Some(now));
            let wakeups = shared.dispatch(&mut st, None);
            // While traffic's timers are near (data in flight, acknowledgements owed), wake at
            // least every TICK: then a timer an application call sets at least a tick ahead
            // (the next probe timeout, a delayed acknowledgement) needs no wake-up of this
            // thread. A request-response exchange would otherwise wake it on every message.
            // Timers that only the clock moves (keepalives) are slept until: with many links,
            // one is always near, and ticking for them woke an idle endpoint a thousand times
            // a second.
            let now = Instant::now();
            let traffic = st.endpoint.traffic_timeout();
            let near = traffic.is_some_and(|t| t.saturating_duration_since(now) < BUSY_HORIZON);
            let next = st.endpoint.poll_timeout();
            let next = next.map(|t| if near { t.min(now + TICK) } else { t });
            st.driver_deadline = next;
            let mut timeout = next.map(|t| t.saturating_duration_since(now));
            if confirming {
                let until_confirm = next_confirm.saturating_duration_since(now);
                timeout = Some(timeout.map_or(until_confirm, |t| t.min(until_confirm)));
            }
            let callers_watch = (st.callers_watch_until).filter(|&t| t > now && !lanes_receive);
            if let Some(until) = callers_watch {
                let left = until - now;
                timeout = Some(timeout.map_or(left, |t| t.min(left)));
            }
            (
                timeout,
                wakeups,
                confirm,
                callers_watch.is_none(),
                passed_on,
            )
        };
        if watch != watching && !lanes_receive {
            // What arrived meanwhile is reported at once when the sockets are registered
            // again; registered again, this instance comes after the callers' one in each
            // socket's wait queue, as before.
            watching = watch;
            let n = shared.sockets.len();
            let paths = shared.sockets.iter().flat_map(|s| s.path_fds());
            let fds: Vec<(usize, RawFd)> = (shared.sockets.iter().enumerate())
                .map(|(i, s)| (i, s.io.as_raw_fd()))
                .chain(paths.map(|(slot, fd)| (n + slot, fd)))
                .collect();
            for (i, fd) in fds {
                let result = if watch {
                    register_exclusive(poll.as_raw_fd(), fd, Token(i), true)
                } else {
                    deregister(poll.as_raw_fd(), fd)
                };
                if let Err(e) = result {
                    tracing::error!(error = %e, source = i, "epoll_ctl failed");
                }
            }
        }
        // after unlocking, so that a woken caller does not at once block on the lock
        wakeups.notify();
        shared.router.wake(passed_on);
        if let Some(heard) = confirm {
            for &(local, remote) in &heard {
                if let Some(sock) = shared.sockets.iter().find(|s| s.local == local) {
                    sock.confirm_next_hop(remote);
                }
            }
            shared.update_path_sockets(&heard, &poll, watching);
        }
        // the engine's timers have 1 ms granularity at best; sleeping less only spins
        let timeout = match more_waiting {
            true => Some(Duration::ZERO),
            false => timeout.map(|t| t.max(Duration::from_micros(50))),
        };
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!(error = %e, "poll failed");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        for ev in events.iter() {
            if ev.token() == CARRIER_TOKEN {
                if link_changes.as_ref().is_some_and(|l| l.drain()) {
                    shared.interfaces_changed();
                }
                continue;
            }
            if let Some(r) = readable.get_mut(ev.token().0) {
                shared.socket_event(ev.token().0, ev);
                *r = true;
            }
        }
    }
}

/// Waits until `fd` is readable or `timeout` passes (`None`: as long as it takes).
pub(crate) fn poll_readable(fd: RawFd, timeout: Option<Duration>) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.map_or(-1, |t| {
        // rounded up: a wait of a few microseconds is not a busy loop
        i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
    });
    // SAFETY: one valid pollfd for the call's duration; an error (EINTR) means: look again
    unsafe { libc::poll(&mut p, 1, ms) };
}

/// The calling thread may run on one CPU only (`taskset -c 0`, an MPI rank bound to a core):
/// threads it starts inherit that.
fn confined_to_one_cpu() -> bool {
    // SAFETY: an all-zero `cpu_set_t` is a valid empty set; `sched_getaffinity` writes at most
    // `size_of::<cpu_set_t>()` bytes into it, and `CPU_COUNT` only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0
            && libc::CPU_COUNT(&set) == 1
    }
}

/// Binds one socket per address; the addresses of port 0 get their real port.
pub(crate) fn bind_all(
    addrs: &[SocketAddr],
) -> Result<Vec<LinkSocket>, (SocketAddr, std::io::Error)> {
    addrs
        .iter()
        .map(|&a| LinkSocket::bind(a).map_err(|e| (a, e)))
        .collect()
}

#[cfg(test)]
mod tests;
