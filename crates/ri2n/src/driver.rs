//! The driver: runs the sans-IO engine on real sockets, with one communication thread per
//! shard of an endpoint (see `shards.rs`) beside the application's threads.
//!
//! All of a shard's engine state sits behind one mutex, held for bookkeeping only: no system
//! call is made under it, packets are sealed after it is released (the engine hands out each
//! datagram's [`Seal`]) and opened before it is taken (`open_ahead.rs`), so application and
//! communication threads work on different cores at once. The library reaches that state
//! through methods of [`Shared`] and [`State`] only.
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
//! keeps a connected socket per path in use ([`Shared::update_path_sockets`]). Three devices keep
//! threads from waking for nothing, each with a test that fails without it:
//! - the poller turn ([`PollerTurn`]; `tests/wakeups.rs`): a call woken only for another
//!   connection's call leaves the sockets to that one;
//! - the step-back in a process confined to one CPU ([`STEP_BACK`],
//!   [`yield_to_busy_threads`]; `tests/one_cpu.rs`), and after an event loop's wait on any
//!   number of CPUs (`tests/wakeups.rs`);
//! - single takes ([`Receiver::take_for`]; `tests` below): one datagram at a time is taken
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

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use ri2n_proto::{
    wire, ConnectionHandle, ConnectionState, Endpoint as ProtoEndpoint, Event, LinkState,
    TransmitBuffer,
};
use smallvec::SmallVec;

use crate::connection::TimedEvent;
use crate::open_ahead::OpenAhead;
use crate::outgoing::{lanes_wanted, Backlog, Batch, Lane, Outgoing, BATCH_BYTES, SHORT_BATCH};
use crate::readiness::Watchers;
use crate::sched::yield_to_busy_threads;
use crate::shards::{AcceptQueue, Forwarded, ForwardedKind, Router};

use crate::socket::{LinkSocket, Received, RecvBatch, SendOutcome, Take};

/// State-change events kept per connection for the application (oldest dropped beyond: a
/// link flapping for hours while nobody polls must not grow memory without bound).
const MAX_QUEUED_EVENTS: usize = 4096;
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
/// Most path sockets open at once (one bit each in [`Shared::open_paths`]); the paths beyond
/// use their link socket, as all did before path sockets.
const MAX_PATH_SOCKETS: usize = 64;
/// How often the next hops of the paths in use are confirmed to the OS (see
/// [`LinkSocket::confirm_next_hop`]): well within Linux's 5 s before an unconfirmed neighbour
/// entry is probed.
const CONFIRM_PERIOD: Duration = Duration::from_millis(500);
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
}

impl State {
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

/// The condition variable of one connection's waiting calls, and how many wait on it (only
/// then is it worth a wake-up).
#[derive(Debug, Default)]
struct Signal {
    condvar: Arc<Condvar>,
    waiting: usize,
}

/// Which blocked application call watches the sockets. One call at a time does (the first to
/// wait); an arrival for another connection it then receives and hands over, waking that
/// connection's call: two thread wake-ups per arrival instead of one. So a call that was woken
/// only for others leaves the sockets to them on its next wait, and the call it woke takes
/// them over when it waits again (the driver thread watches meanwhile). A daemon with a thread
/// per peer (`ri2n tunnel`) keeps the call of the busy peer watching, not an idle one.
#[derive(Debug, Default)]
struct PollerTurn {
    /// The connection whose call watches now.
    watching: Option<ConnectionHandle>,
    /// Since it started watching: an event for its own connection came.
    served: bool,
    /// Since it started watching: it woke a call waiting on another connection.
    woke_others: bool,
    /// A connection whose call watched for others only, or found the receive buffers taken:
    /// its next wait is on its condition variable.
    yielding: Option<ConnectionHandle>,
    /// A call of [`Shared::wait_receiving`] found the receive buffers taken: the next one
    /// waits on its descriptor alone.
    receiving_yields: bool,
}

/// The receive buffers, and what the last receives from each source found.
#[derive(Debug)]
struct Receiver {
    batch: RecvBatch,
    /// Per receive source: how many more receives of a waiting call take one datagram alone.
    single_takes: Vec<u8>,
    /// With a key: opens what was received before the engine's lock is taken.
    open_ahead: Option<OpenAhead>,
    /// Receives that took one datagram alone.
    #[cfg(test)]
    taken_alone: u64,
}

impl Receiver {
    /// How a receive from source `i` asks. A waiting call takes one datagram alone from a
    /// source whose last batch receive found exactly one (not a GRO buffer of several), for
    /// [`SINGLE_TAKES`] receives; then a batch receive looks again. So a source that carries
    /// one datagram at a time (a request-response exchange) is mostly received with one
    /// `recvmsg`, which does not ask whether more wait, and a busy one in batches. Only a
    /// waiting call may take one alone: its epoll instance is level-triggered and reports the
    /// socket again while anything is left; the driver thread's is edge-triggered, and tells
    /// of each arrival once.
    fn take_for(&mut self, i: usize, waiting_call: bool) -> Take {
        match self.single_takes.get_mut(i) {
            Some(left) if waiting_call && *left > 0 => {
                *left -= 1;
                Take::One
            }
            _ => Take::Batch,
        }
    }

    /// Notes what a receive from source `i` found.
    fn note(&mut self, i: usize, take: Take, r: Received) {
        if take == Take::Batch && r != Received::Nothing {
            let sparse = r == Received::Drained && self.batch.one_datagram();
            if let Some(left) = self.single_takes.get_mut(i) {
                *left = if sparse { SINGLE_TAKES } else { 0 };
            }
        }
    }
}

/// A link socket's receiving thread ([`ri2n_proto::LinkThreads`]): it waits in an epoll
/// instance of its own that watches the link socket and the link's path sockets
/// (edge-triggered, after the callers' instance), and receives what arrives there into the
/// link's own receive buffers.
#[derive(Debug)]
struct RecvLane {
    /// Its epoll instance (the thread's `Poll` owns it), where the driver thread registers
    /// the link's path sockets.
    epoll: RawFd,
    /// Wakes the thread to stop.
    waker: Waker,
    /// Batches its thread received.
    #[cfg(test)]
    received_by_thread: AtomicUsize,
}

/// The sockets' second watcher, for the blocked application call that receives for itself.
#[derive(Debug)]
struct CallerPoll {
    poll: Poll,
    events: Events,
    /// The descriptor [`Shared::wait_receiving`] last waited on, still registered: a loop
    /// that waits on the same one again and again costs no `epoll_ctl` per wait.
    ready: Option<RawFd>,
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
    /// [`Shared::sources`]): a thread wanted to receive from it while another held the buffers.
    receive_wanted: Vec<AtomicBool>,
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

    /// Waits until something may have changed for connection `h` (or `deadline`); the caller
    /// re-checks. The first waiting thread watches the sockets itself and processes what
    /// arrives; others wait for the connection's condition variable (see [`PollerTurn`]).
    pub fn wait_connection<'a>(
        &'a self,
        mut guard: MutexGuard<'a, State>,
        h: ConnectionHandle,
        deadline: Option<Instant>,
    ) -> MutexGuard<'a, State> {
        if guard.turn.yielding == Some(h) {
            guard.turn.yielding = None;
            self.take_sockets_back(&mut guard);
            return wait_signal(guard, h, deadline);
        }
        let Ok(mut cp) = self.caller_poll.try_lock() else {
            self.take_sockets_back(&mut guard);
            return wait_signal(guard, h, deadline);
        };
        self.caller_polling.store(true, Ordering::Release);
        guard.turn.watching = Some(h);
        guard.turn.served = false;
        guard.turn.woke_others = false;
        drop(guard);
        let CallerPoll { poll, events, .. } = &mut *cp;
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        // an error (EINTR) just means: look again
        let _ = poll.poll(events, timeout);
        self.caller_polling.store(false, Ordering::Release);
        let (received, turned_away) = self.receive_reported(events, None);
        let mut st = self.lock();
        st.turn.watching = None;
        // Turned away, this call's next wait is on its condition variable: its
        // level-triggered instance would report the socket at once again until the thread
        // that holds the receive buffers has emptied it.
        if turned_away || (st.turn.woke_others && !st.turn.served) {
            st.turn.yielding = Some(h);
        }
        // this call is likely to wait here again soon; a call of another connection waiting
        // on its condition variable is not (it relies on a thread watching)
        if self.one_cpu && st.signal_waiters == 0 {
            st.callers_watch_until = Some(Instant::now() + STEP_BACK);
        }
        // what was received is answered already (`receive` sends and dispatches); the
        // timers it set are the driver thread's to run
        if received {
            self.arm_driver(&mut st);
        }
        st
    }

    /// Waits until descriptor `ready` is readable or `deadline` passes, watching the sockets
    /// meanwhile as a blocked call does (see [`Self::wait_connection`]): what arrives is
    /// received and handled on this thread, which signals the readiness descriptors of the
    /// connections concerned, or, for those with a loop token, appends the token to
    /// `readable` instead. An event loop that waits on those descriptors in its own epoll set
    /// passes that set as `ready`: an arrival then reaches it with no other thread woken, and
    /// with tokens with no system call besides the receive. Returns early after handling
    /// arrivals (the caller serves `readable`, looks at its set if told so, and waits again),
    /// telling whether `ready` may be readable. While another call watches the sockets, it
    /// waits on `ready` alone.
    pub fn wait_receiving(
        &self,
        ready: RawFd,
        deadline: Option<Instant>,
        readable: &mut Vec<u64>,
    ) -> bool {
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let yields = std::mem::take(&mut self.lock().turn.receiving_yields);
        let cp = if yields {
            None
        } else {
            self.caller_poll.try_lock().ok()
        };
        let Some(mut cp) = cp else {
            self.take_sockets_back(&mut self.lock());
            poll_readable(ready, timeout);
            return true;
        };
        let CallerPoll {
            poll,
            events,
            ready: registered,
        } = &mut *cp;
        let mut readable_now = false;
        if *registered != Some(ready) {
            if let Some(old) = registered.take() {
                // gone already if the caller closed it
                let _ = poll.registry().deregister(&mut SourceFd(&old));
            }
            let added =
                (poll.registry()).register(&mut SourceFd(&ready), READY_TOKEN, Interest::READABLE);
            if let Err(e) = added {
                tracing::error!(error = %e, "epoll_ctl failed");
                drop(cp);
                poll_readable(ready, timeout);
                return true;
            }
            *registered = Some(ready);
            // registered edge-triggered: what was pending before is not reported
            readable_now = true;
        }
        self.caller_polling.store(true, Ordering::Release);
        // an error (EINTR) just means: look again
        let _ = poll.poll(events, timeout);
        self.caller_polling.store(false, Ordering::Release);
        let (received, turned_away) = self.receive_reported(events, Some(readable));
        readable_now |= events.iter().any(|e| e.token() == READY_TOKEN);
        drop(cp);
        let mut st = self.lock();
        // the level-triggered instance would report the socket at once again until the
        // thread holding the receive buffers has emptied it (see `wait_connection`)
        st.turn.receiving_yields = turned_away;
        // the loop is back at the sockets as soon as it has served what it received
        st.callers_watch_until = Some(Instant::now() + STEP_BACK);
        if received {
            self.arm_driver(&mut st);
        }
        readable_now
    }

    /// Receives, for a call that watched the sockets, from each socket its `events` report:
    /// whether anything was received, and whether another thread held the receive buffers.
    /// `readable`: see [`Self::dispatch`].
    fn receive_reported(
        &self,
        events: &Events,
        mut readable: Option<&mut Vec<u64>>,
    ) -> (bool, bool) {
        let (mut received, mut turned_away) = (false, false);
        for ev in events.iter() {
            if ev.token().0 < self.receive_wanted.len() {
                self.socket_event(ev.token().0, ev);
                // a full batch: more may wait, and they are taken now rather than at the
                // next wait
                loop {
                    let r = self.receive(ev.token().0, true, readable.as_deref_mut(), false);
                    received |= !matches!(r, Received::Nothing | Received::TurnedAway);
                    turned_away |= r == Received::TurnedAway;
                    if r != Received::MoreMayWait {
                        break;
                    }
                }
            }
        }
        (received, turned_away)
    }

    /// A call is about to block without watching the sockets: the driver thread watches them
    /// again now, not at the end of its [`STEP_BACK`] (with receiving lanes it never does:
    /// they watch).
    fn take_sockets_back(&self, st: &mut State) {
        if self.has_recv_lanes() {
            return;
        }
        // past its time the driver thread is taking them back by itself
        if st
            .callers_watch_until
            .take()
            .is_some_and(|t| t > Instant::now())
        {
            let _ = self.waker.wake();
        }
    }

    /// One turn of the pump from source `i`: receives (without the engine's lock), hands
    /// what came to the engine, sends what the engine has to send, and wakes the calls it
    /// concerns; with `arm`, also the driver thread for the timers that set (a receiving lane
    /// does: the driver thread's are its own, and a waiting call arms it once it is done).
    /// See [`Self::take_in`] for what it returns.
    fn receive(
        &self,
        i: usize,
        waiting_call: bool,
        readable: Option<&mut Vec<u64>>,
        arm: bool,
    ) -> Received {
        let (received, taken) = self.take_in(i, waiting_call);
        if taken {
            let st = self.lock();
            let mut st = self.transmit(st, None);
            let wakeups = self.dispatch(&mut st, readable);
            if arm {
                self.arm_driver(&mut st);
            }
            drop(st);
            wakeups.notify();
        }
        received
    }

    /// Receives from source `i` (without the engine's lock) and hands what came to the
    /// engine; also whether anything was handed over (from `i` or another source).
    /// `TurnedAway` when another thread is receiving: that thread then receives from every
    /// source it was wanted for (`receive_wanted`) before it is done, so an arrival it did
    /// not see is not left in the queue until the next one comes. A `waiting_call` (one whose
    /// level-triggered instance reported the source) may take a datagram alone
    /// ([`Receiver::take_for`]).
    fn take_in(&self, i: usize, waiting_call: bool) -> (Received, bool) {
        let mut received = Received::TurnedAway;
        let mut taken = false;
        let group = self.receiver_of(i);
        // the other sources received into the same buffers
        let others = || {
            self.sources()
                .filter(move |&j| j != i && self.receiver_of(j) == group)
        };
        loop {
            // announce first, then try: a holder that lets go after a failed try sees it
            self.receive_wanted[i].store(true, Ordering::SeqCst);
            let Ok(mut rx) = self.receivers[group].try_lock() else {
                return (received, taken);
            };
            self.receive_wanted[i].store(false, Ordering::SeqCst);
            let take = rx.take_for(i, waiting_call);
            let r = self.take_in_batch(i, &mut rx, take);
            rx.note(i, take, r);
            #[cfg(test)]
            if take == Take::One && r != Received::Nothing {
                rx.taken_alone += 1;
            }
            taken |= r != Received::Nothing;
            if r != Received::Nothing || received == Received::TurnedAway {
                received = r;
            }
            // the sources other threads were turned away from, drained
            for j in others() {
                if self.receive_wanted[j].swap(false, Ordering::SeqCst) {
                    loop {
                        let r = self.take_in_batch(j, &mut rx, Take::Batch);
                        taken |= r != Received::Nothing;
                        if r != Received::MoreMayWait {
                            break;
                        }
                    }
                }
            }
            drop(rx);
            let wanted = |j: usize| self.receive_wanted[j].load(Ordering::SeqCst);
            let others_wanted = others().any(wanted);
            if !others_wanted && (received == Received::MoreMayWait || !wanted(i)) {
                return (received, taken);
            }
        }
    }

    /// One receive call on source `i` into `rx`'s buffers, opened there (with a key) and
    /// handed to the engine.
    fn take_in_batch(&self, i: usize, rx: &mut Receiver, take: Take) -> Received {
        let Receiver {
            batch, open_ahead, ..
        } = rx;
        let result = match self.link_of(i) {
            Some((sock, None)) => Some((sock, sock.recv(batch, take))),
            Some((sock, Some(slot))) => sock.recv_path(slot, batch, take).map(|r| (sock, r)),
            None => None,
        };
        // a path socket closed meanwhile
        let Some((sock, result)) = result else {
            return Received::Nothing;
        };
        let received = match result {
            Ok(Received::Nothing) => return Received::Nothing,
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, socket = %sock.local, "receive failed");
                return Received::Nothing;
            }
        };
        if let Some(o) = open_ahead.as_mut() {
            o.open(batch);
        }
        let mut st = self.lock();
        let now = Instant::now();
        let endpoint = &mut st.endpoint;
        let mut forwarded = 0u64;
        sock.deliver(batch, &mut |n, remote, d| {
            let kind = ForwardedKind::Datagram;
            if !self.keep_or_forward(endpoint, kind, sock.local, remote, d, &mut forwarded) {
                return;
            }
            if let Some(opened) = open_ahead.as_mut().and_then(|o| o.take(n)) {
                endpoint.handle_opened_datagram(now, sock.local, remote, d, opened);
                return;
            }
            let initial = self.router.initial(d);
            let before = endpoint.connection_count();
            endpoint.handle_datagram(now, sock.local, remote, d);
            if let Some(scid) = initial {
                let made = endpoint.connection_count() > before;
                (self.router).initial_handled(self.shard, endpoint, remote, scid, made);
            }
            if let Some(o) = open_ahead.as_mut() {
                o.learn(endpoint, d);
            }
        });
        forwarded |= self.hand_over_refusals(&mut st, Some(now));
        drop(st);
        self.router.wake(forwarded);
        received
    }

    /// Tells the engine which datagrams the peers' hosts answered with "port unreachable"
    /// (`now`, if the caller has it: the clock is read only when there is something to tell),
    /// or forwards them to the shard they concern; returns the shards forwarded to (bit `i`:
    /// shard `i`), for [`Router::wake`].
    fn hand_over_refusals(&self, st: &mut State, now: Option<Instant>) -> u64 {
        let mut forwarded = 0;
        for sock in &self.sockets {
            for r in sock.take_refused() {
                let (kind, quote) = (ForwardedKind::Refusal, r.quote());
                if self.keep_or_forward(
                    &st.endpoint,
                    kind,
                    sock.local,
                    r.dest,
                    quote,
                    &mut forwarded,
                ) {
                    let now = now.unwrap_or_else(Instant::now);
                    (st.endpoint).handle_port_unreachable(now, sock.local, r.dest, quote);
                }
            }
        }
        forwarded
    }

    /// Whether what this shard received (a datagram, or an ICMP error's quote) is for its own
    /// engine ([`Router::place`]); if not, it is forwarded and `forwarded` gains the shard's
    /// bit, for [`Router::wake`].
    fn keep_or_forward(
        &self,
        engine: &ProtoEndpoint,
        kind: ForwardedKind,
        local: SocketAddr,
        remote: SocketAddr,
        bytes: &[u8],
        forwarded: &mut u64,
    ) -> bool {
        if self.router.shards() == 1 {
            return true;
        }
        let steering = match kind {
            ForwardedKind::Datagram => wire::steering(bytes),
            ForwardedKind::Refusal => wire::quote_steering(bytes),
        };
        let asks = self.router.first_asks();
        let placed = self
            .router
            .place(self.shard, engine, remote, steering, asks);
        let Some((to, asks_left)) = placed else {
            return true;
        };
        *forwarded |= 1 << to;
        let bytes = bytes.to_vec();
        let item = Forwarded {
            local,
            remote,
            kind,
            asks_left,
            bytes,
        };
        self.router.forward(to, item);
        false
    }

    /// Hands the engine what other shards forwarded to this one (driver thread), or passes
    /// it on to the next shard to ask; returns the shards passed on to, for [`Router::wake`].
    fn take_forwarded(&self, st: &mut State, now: Instant, items: &mut Vec<Forwarded>) -> u64 {
        let mut passed_on = 0;
        for mut f in items.drain(..) {
            let steering = match f.kind {
                ForwardedKind::Datagram => wire::steering(&f.bytes),
                ForwardedKind::Refusal => wire::quote_steering(&f.bytes),
            };
            match self
                .router
                .place(self.shard, &st.endpoint, f.remote, steering, f.asks_left)
            {
                // a connection ID of this share, or the last shard to ask
                None => match f.kind {
                    ForwardedKind::Datagram => {
                        let initial = self.router.initial(&f.bytes);
                        let before = st.endpoint.connection_count();
                        (st.endpoint).handle_datagram(now, f.local, f.remote, &mut f.bytes);
                        if let Some(scid) = initial {
                            let made = st.endpoint.connection_count() > before;
                            (self.router).initial_handled(
                                self.shard,
                                &st.endpoint,
                                f.remote,
                                scid,
                                made,
                            );
                        }
                    }
                    ForwardedKind::Refusal => {
                        (st.endpoint).handle_port_unreachable(now, f.local, f.remote, &f.bytes);
                    }
                },
                Some((to, asks_left)) => {
                    passed_on |= 1 << to;
                    f.asks_left = asks_left;
                    self.router.forward(to, f);
                }
            }
        }
        passed_on
    }

    /// An epoll event on receive source `i`: an error event means the kernel queued an ICMP
    /// error (read the queue, or its level-triggered error keeps failing sends and receives).
    fn socket_event(&self, i: usize, ev: &mio::event::Event) {
        if ev.is_error() {
            if let Some((sock, _)) = self.link_of(i) {
                sock.take_errors();
            }
        }
    }

    /// Gives each path in `heard` (the paths open connections heard their peer on lately,
    /// sorted) a path socket, while slots are free, and closes those of paths no longer
    /// heard. Driver thread only; `poll` is its epoll instance, which watches the sockets
    /// when `watching` (never with receiving lanes: the link's lane watches its path sockets).
    fn update_path_sockets(&self, heard: &[(SocketAddr, SocketAddr)], poll: &Poll, watching: bool) {
        let n = self.sockets.len();
        for (link, sock) in self.sockets.iter().enumerate() {
            // Datagrams that peer sends from now on go to the link socket; the few queued in
            // the path socket, if any, are lost with it (the path was not heard for minutes).
            sock.close_paths(
                |remote| heard.binary_search(&(sock.local, remote)).is_ok(),
                |slot, fd| {
                    let _ = deregister(self.caller_epoll, fd);
                    if let Some(lane) = self.recv_lanes.get(link) {
                        let _ = deregister(lane.epoll, fd);
                    } else if watching {
                        let _ = deregister(poll.as_raw_fd(), fd);
                    }
                    self.forget_slot(slot);
                    tracing::debug!(local = %sock.local, slot, "path socket closed");
                },
            );
        }
        for &(local, remote) in heard {
            let Some(link) = self.sockets.iter().position(|s| s.local == local) else {
                continue;
            };
            let sock = &self.sockets[link];
            if sock.has_path(remote) {
                continue;
            }
            let open = self.open_paths.load(Ordering::Acquire);
            if open == u64::MAX {
                return;
            }
            let slot = open.trailing_ones() as usize;
            let path = match sock.open_path(slot, remote) {
                Ok(p) => p,
                Err(e) => {
                    tracing::debug!(error = %e, local = %local, remote = %remote, "no path socket");
                    continue;
                }
            };
            // held by its link socket before it is watched, so that its first event finds
            // it; the callers' instance first, as for the link sockets
            self.path_links[slot].store(link, Ordering::Release);
            self.open_paths.fetch_or(1u64 << slot, Ordering::AcqRel);
            let fd = sock.add_path(path);
            let token = Token(n + slot);
            let registered =
                register_exclusive(self.caller_epoll, fd, token, false).and_then(|()| {
                    if let Some(lane) = self.recv_lanes.get(link) {
                        register_exclusive(lane.epoll, fd, token, true)
                    } else if watching {
                        register_exclusive(poll.as_raw_fd(), fd, token, true)
                    } else {
                        Ok(())
                    }
                });
            match registered {
                Ok(()) => {
                    tracing::debug!(local = %local, remote = %remote, slot, "path socket opened")
                }
                Err(e) => {
                    tracing::error!(error = %e, "epoll_ctl failed for a path socket");
                    sock.close_paths(
                        |r| r != remote,
                        |_, fd| {
                            let _ = deregister(self.caller_epoll, fd);
                            if let Some(lane) = self.recv_lanes.get(link) {
                                let _ = deregister(lane.epoll, fd);
                            }
                        },
                    );
                    self.forget_slot(slot);
                }
            }
        }
    }

    /// Marks path-socket slot `slot` empty.
    fn forget_slot(&self, slot: usize) {
        self.open_paths.fetch_and(!(1u64 << slot), Ordering::AcqRel);
        self.path_links[slot].store(usize::MAX, Ordering::Release);
    }

    /// A call (`accept`) is about to block without watching this shard's sockets.
    pub fn before_blocking(&self) {
        self.take_sockets_back(&mut self.lock());
    }

    /// Has the engine build every datagram it has ready, in place in the per-socket batches.
    /// The clock is read (`now` is `None`) only when the engine may have something to build:
    /// most builds of a request-response exchange find nothing, and a clock read is a good
    /// part of their cost.
    fn build(st: &mut State, now: Option<Instant>) {
        let State { endpoint, out, .. } = st;
        if endpoint.may_transmit() {
            let now = now.unwrap_or_else(Instant::now);
            while out.wants_more() && endpoint.poll_transmit_into(now, out) > 0 {}
            if !out.wants_more() {
                out.backlog.throttle();
            }
        }
        out.close_all();
    }

    /// Seals batch `b` of socket `i` and sends it.
    fn send_batch(&self, i: usize, b: &mut Batch) -> SendOutcome {
        b.seal();
        let segment = Some(b.segment).filter(|&s| s < b.len);
        self.sockets[i].send(b.dest, &b.buf[..b.len], segment)
    }

    /// [`Self::transmit`] with lanes (see `outgoing`): hands each socket's new batches to
    /// its lane, except a short transmission to an idle lane, which this thread sends itself
    /// at once, without the lock.
    fn hand_to_lanes<'a>(&'a self, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        if st.out.queue.is_empty() {
            return st;
        }
        let mut own: SmallVec<[(usize, Batch); 2]> = SmallVec::new();
        let mut wake: SmallVec<[usize; 4]> = SmallVec::new();
        let Outgoing {
            queue,
            spare,
            backlog,
            by_lane,
            ..
        } = &mut st.out;
        for (i, b) in queue.drain(..) {
            by_lane[i].push(b);
        }
        for (i, lane) in self.lanes.iter().enumerate() {
            let batches = &mut by_lane[i];
            if batches.is_empty() {
                continue;
            }
            let short = batches.len() == 1 && batches[0].len <= SHORT_BATCH;
            backlog.left_queue(batches.len());
            let mut woken = false;
            match lane.hand_over(batches, short, spare, &mut woken) {
                Some(b) => own.push((i, b)),
                None if woken => wake.push(i),
                None => {}
            }
        }
        if own.is_empty() && wake.is_empty() {
            return st;
        }
        drop(st);
        for &i in &wake {
            self.lanes[i].wake();
        }
        let mut unreachable: SmallVec<[(usize, SocketAddr); 2]> = SmallVec::new();
        for (i, b) in &mut own {
            if self.send_batch(*i, b) == SendOutcome::Unreachable {
                unreachable.push((*i, b.dest));
            }
            self.backlog.sent();
            #[cfg(test)]
            self.lanes[*i]
                .sent_by_caller
                .fetch_add(1, Ordering::Relaxed);
            if self.lanes[*i].release() {
                self.lanes[*i].wake();
            }
        }
        let mut st = self.lock();
        self.handle_unreachable(&mut st, &unreachable);
        st.out.spare.extend(own.into_iter().map(|(_, mut b)| {
            b.len = 0;
            b
        }));
        st
    }

    /// Tells the engine of the sends that found their destination unreachable.
    fn handle_unreachable(&self, st: &mut State, unreachable: &[(usize, SocketAddr)]) {
        if unreachable.is_empty() {
            return;
        }
        let now = Instant::now();
        for &(i, dest) in unreachable {
            st.endpoint
                .handle_unreachable(now, self.sockets[i].local, dest);
        }
    }

    /// Builds what the engine has ready and sends it; `now` is the instant the caller read
    /// last, if it just did (see [`Self::build`]). Sending happens without the lock; a
    /// thread that finds another one sending leaves its batches in the queue for that one,
    /// which sends until the queue is empty (so each socket's datagrams keep their order).
    fn transmit<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        now: Option<Instant>,
    ) -> MutexGuard<'a, State> {
        Self::build(&mut st, now);
        if !self.lanes.is_empty() {
            return self.hand_to_lanes(st);
        }
        if st.out.sending {
            return st;
        }
        st.out.sending = true;
        let mut unreachable: Vec<(usize, SocketAddr)> = Vec::new();
        loop {
            let next_queue = std::mem::take(&mut st.out.taken_queue);
            let mut batches = std::mem::replace(&mut st.out.queue, next_queue);
            if batches.is_empty() {
                st.out.taken_queue = batches;
                break;
            }
            drop(st);
            let mut sent_bytes = 0;
            for (i, b) in &mut batches {
                if self.send_batch(*i, b) == SendOutcome::Unreachable {
                    unreachable.push((*i, b.dest));
                }
                sent_bytes += b.len;
            }
            // Take in what arrived meanwhile before building more: while the application
            // writes and this thread sends, nobody else may be receiving, and acknowledgements
            // left waiting through a long sending streak expire probe timeouts (links were
            // declared down under load). Not after a round shorter than one full batch: that
            // took microseconds, and a message of a request-response exchange would pay an
            // empty receive call per socket. Nor with receiving lanes: they are receiving.
            let mut taken = false;
            if sent_bytes >= BATCH_BYTES && self.recv_lanes.is_empty() {
                for i in self.sources() {
                    loop {
                        let (r, t) = self.take_in(i, false);
                        taken |= t;
                        if r != Received::MoreMayWait {
                            break;
                        }
                    }
                }
            }
            st = self.lock();
            if taken {
                // what came may concern a waiting call: wake it now, not after the streak
                let wakeups = self.dispatch(&mut st, None);
                drop(st);
                wakeups.notify();
                st = self.lock();
            }
            self.handle_unreachable(&mut st, &unreachable);
            unreachable.clear();
            // rare, and woken at once: the forwarding shard holds no lock of the other's
            self.router.wake(self.hand_over_refusals(&mut st, None));
            st.out.spare.extend(batches.drain(..).map(|(_, mut b)| {
                b.len = 0;
                b
            }));
            st.out.taken_queue = batches;
            // acknowledgements that arrived meanwhile may have opened windows
            Self::build(&mut st, None);
        }
        st.out.sending = false;
        st
    }

    /// Moves engine events to the per-connection queues; returns whom to wake (the caller
    /// does so, preferably after releasing the lock). With `readable` (a thread that will
    /// return to its event loop at once, [`Self::wait_receiving`]), data readiness of a
    /// connection with a loop token is told by appending the token there, not by signalling
    /// its readiness descriptors.
    fn dispatch(&self, st: &mut State, mut readable: Option<&mut Vec<u64>>) -> Wakeups<'_> {
        let mut wake = Wakeups {
            connections: SmallVec::new(),
            caller_poll: None,
            driver: None,
        };
        while let Some((h, e)) = st.endpoint.poll_event() {
            if matches!(
                e,
                Event::Connected
                    | Event::LinkStateChanged {
                        to: LinkState::Up,
                        ..
                    }
            ) && !st.paths_changed
            {
                st.paths_changed = true;
                wake.driver = Some(&self.waker);
            }
            if let Some(w) = st.readiness.get(&h) {
                let token = w.loop_token().filter(|_| e == Event::Readable);
                match (token, readable.as_deref_mut()) {
                    (Some(t), Some(r)) => {
                        if !r.contains(&t) {
                            r.push(t);
                        }
                    }
                    _ => w.signal(&e),
                }
            }
            // Data readiness is a level the application reads with its calls (and the
            // readiness descriptor), not an event to keep: queued, it would crowd out the
            // state changes an application that polls rarely must still learn about.
            if !matches!(e, Event::Readable | Event::Writable) {
                let q = st.events.entry(h).or_default();
                if q.len() >= MAX_QUEUED_EVENTS {
                    q.pop_front();
                }
                q.push_back(TimedEvent {
                    at: Instant::now(),
                    event: e,
                });
            }
            // the call watching the sockets, for its own connection's events only: a call
            // blocked on another connection is woken through its condition variable, and one
            // in `wait_receiving` through the readiness descriptors in its set
            if st.turn.watching == Some(h) {
                st.turn.served = true;
                if self.caller_polling.load(Ordering::Acquire) {
                    wake.caller_poll = Some(&self.caller_waker);
                }
            }
            if let Some(signal) = st.signals.get(&h).filter(|s| s.waiting > 0) {
                if st.turn.watching.is_some_and(|w| w != h) {
                    st.turn.woke_others = true;
                }
                if !wake
                    .connections
                    .iter()
                    .any(|c| Arc::ptr_eq(c, &signal.condvar))
                {
                    wake.connections.push(signal.condvar.clone());
                }
            }
        }
        while let Some(h) = st.endpoint.accept() {
            self.accepts.push(self.shard, h);
        }
        let State {
            endpoint,
            dropped,
            events,
            signals,
            readiness,
            ..
        } = st;
        dropped.retain(|&h| {
            if endpoint.release(h) {
                events.remove(&h);
                signals.remove(&h);
                readiness.remove(&h);
                false
            } else {
                true
            }
        });
        self.router
            .set_load(self.shard, endpoint.connection_count());
        wake
    }
}

/// The waiting callers to wake after the engine reported events.
struct Wakeups<'a> {
    connections: SmallVec<[Arc<Condvar>; 4]>,
    caller_poll: Option<&'a Waker>,
    driver: Option<&'a Waker>,
}

impl Wakeups<'_> {
    fn notify(self) {
        if let Some(w) = self.driver {
            let _ = w.wake();
        }
        if let Some(w) = self.caller_poll {
            let _ = w.wake();
        }
        for c in self.connections {
            c.notify_all();
        }
    }
}

/// Waits on connection `h`'s condition variable, counted as waiting meanwhile.
fn wait_signal<'a>(
    mut guard: MutexGuard<'a, State>,
    h: ConnectionHandle,
    deadline: Option<Instant>,
) -> MutexGuard<'a, State> {
    let signal = guard.signals.entry(h).or_default();
    signal.waiting += 1;
    let condvar = signal.condvar.clone();
    guard.signal_waiters += 1;
    let mut guard = wait_on(&condvar, guard, deadline);
    guard.signal_waiters -= 1;
    if let Some(signal) = guard.signals.get_mut(&h) {
        signal.waiting -= 1;
    }
    guard
}

fn wait_on<'a>(
    signal: &Condvar,
    guard: MutexGuard<'a, State>,
    deadline: Option<Instant>,
) -> MutexGuard<'a, State> {
    match deadline {
        None => signal.wait(guard).unwrap_or_else(|e| e.into_inner()),
        Some(d) => {
            let timeout = d.saturating_duration_since(Instant::now());
            signal
                .wait_timeout(guard, timeout)
                .unwrap_or_else(|e| e.into_inner())
                .0
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
        let handles: Vec<ConnectionHandle> = st.endpoint.connection_handles().collect();
        for &h in &handles {
            if let Some(c) = st.endpoint.connection_mut(h) {
                c.finish();
            }
        }
        st = self.after_app_call(st);
        loop {
            // still worth waiting for: open, and either our data is not delivered yet or
            // the peer is done too (then the clean close follows shortly)
            let waiting = handles.iter().copied().find(|&h| {
                st.endpoint.connection(h).is_some_and(|c| {
                    c.state() != ConnectionState::Closed
                        && (!c.is_send_complete() || c.is_receive_complete())
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
            let Some(c) = st.endpoint.connection_mut(h) else {
                continue;
            };
            let clean = c.state() == ConnectionState::Closed && c.close_reason().is_none();
            if !clean && !c.is_send_complete() {
                undelivered.connections += 1;
                undelivered.bytes += c.stats().send_buffered;
            }
            if c.state() != ConnectionState::Closed {
                c.abort(0, "the peer's endpoint was closed");
            }
        }
        let st = self.after_app_call(st);
        drop(self.wait_until_sent(st));
        undelivered
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
            .map(|p| {
                Ok(RecvLane {
                    epoll: p.as_raw_fd(),
                    waker: Waker::new(p.registry(), WAKE_TOKEN)?,
                    #[cfg(test)]
                    received_by_thread: AtomicUsize::new(0),
                })
            })
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
            }),
            shard,
            router,
            accepts,
            receivers: (0..recv_lanes.len().max(1))
                .map(|_| {
                    Ok(Mutex::new(Receiver {
                        batch: RecvBatch::for_sockets(&sockets)?,
                        single_takes: vec![0; sockets.len() + MAX_PATH_SOCKETS],
                        open_ahead: keyed.then(OpenAhead::default),
                        #[cfg(test)]
                        taken_alone: 0,
                    }))
                })
                .collect::<std::io::Result<_>>()?,
            receive_wanted: (0..sockets.len() + MAX_PATH_SOCKETS)
                .map(|_| AtomicBool::new(false))
                .collect(),
            path_links: (0..MAX_PATH_SOCKETS)
                .map(|_| AtomicUsize::new(usize::MAX))
                .collect(),
            open_paths: AtomicU64::new(0),
            caller_epoll: caller_poll.as_raw_fd(),
            sockets,
            waker,
            shutdown: AtomicBool::new(false),
            caller_poll: Mutex::new(CallerPoll {
                poll: caller_poll,
                events: Events::with_capacity(64),
                ready: None,
            }),
            caller_polling: AtomicBool::new(false),
            caller_waker,
            one_cpu: confined_to_one_cpu(),
            lanes,
            recv_lanes,
            backlog,
        });
        let mut lane_threads = Vec::new();
        for i in 0..shared.lanes.len() {
            let lane_shared = shared.clone();
            lane_threads.push(
                std::thread::Builder::new()
                    .name(format!("ri2n-send-{shard}.{i}"))
                    .spawn(move || lane(&lane_shared, i))?,
            );
        }
        for (i, recv_poll) in recv_polls.into_iter().enumerate() {
            let lane_shared = shared.clone();
            lane_threads.push(
                std::thread::Builder::new()
                    .name(format!("ri2n-recv-{shard}.{i}"))
                    .spawn(move || recv_lane(&lane_shared, i, recv_poll))?,
            );
        }
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ri2n-driver-{shard}"))
            .spawn(move || run(thread_shared, poll, link_changes))?;
        Ok(Arc::new(Self {
            shared,
            thread: Mutex::new(Some(thread)),
            lane_threads: Mutex::new(lane_threads),
        }))
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
            let _ = lane.waker.wake();
        }
        for t in self.lane_threads.lock().unwrap().drain(..) {
            let _ = t.join();
        }
        self.shared.router.close(self.shared.shard);
    }
}

/// Lane `i`'s thread (see `outgoing`): seals and sends the batches handed to it, in order.
/// After a round it tells the engine of unreachable destinations, and has it build more if
/// the lanes' backlog had stopped it.
fn lane(shared: &Shared, i: usize) {
    let lane = &shared.lanes[i];
    let (mut next, mut spent) = (VecDeque::new(), Vec::new());
    let mut round = false;
    while lane.next(round, &mut next, &mut spent) {
        round = true;
        let mut unreachable: SmallVec<[(usize, SocketAddr); 2]> = SmallVec::new();
        for mut b in next.drain(..) {
            if shared.send_batch(i, &mut b) == SendOutcome::Unreachable {
                unreachable.push((i, b.dest));
            }
            b.len = 0;
            spent.push(b);
            shared.backlog.sent();
            #[cfg(test)]
            lane.sent_by_thread.fetch_add(1, Ordering::Relaxed);
        }
        if shared.backlog.take_throttled() || !unreachable.is_empty() {
            let mut st = shared.lock();
            shared.handle_unreachable(&mut st, &unreachable);
            drop(shared.after_app_call(st));
        }
    }
}

/// Receiving lane `i`'s thread ([`RecvLane`]): turns the pump for what arrives on link socket
/// `i` and its path sockets, which `poll` watches edge-triggered.
fn recv_lane(shared: &Shared, i: usize, mut poll: Poll) {
    let mut events = Events::with_capacity(64);
    // what arrived before the thread started
    let mut readable = vec![i];
    while !shared.shutdown.load(Ordering::Acquire) {
        for &source in &readable {
            loop {
                // what is received is answered at once (`receive` sends and dispatches); the
                // timers it sets (an acknowledgement held back, a probe timeout) are the
                // driver thread's
                let r = shared.receive(source, false, None, true);
                #[cfg(test)]
                if !matches!(r, Received::Nothing | Received::TurnedAway) {
                    (shared.recv_lanes[i].received_by_thread).fetch_add(1, Ordering::Relaxed);
                }
                if r != Received::MoreMayWait {
                    break;
                }
            }
        }
        readable.clear();
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!(error = %e, "poll failed");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        for ev in events.iter().filter(|e| e.token() != WAKE_TOKEN) {
            shared.socket_event(ev.token().0, ev);
            readable.push(ev.token().0);
        }
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
        // receive everything waiting (mio is edge-triggered: drain until empty)
        for (i, r) in readable.iter_mut().enumerate() {
            while *r {
                *r = shared.receive(i, false, None, false) == Received::MoreMayWait;
            }
        }
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
        let timeout = timeout.map(|t| t.max(Duration::from_micros(50)));
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!(error = %e, "poll failed");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        for ev in events.iter() {
            if ev.token() == CARRIER_TOKEN {
                if link_changes.as_ref().is_some_and(|l| l.drain()) {
                    for s in &shared.sockets {
                        s.refresh_carrier();
                    }
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
mod tests {
    use std::io::{Read, Write};
    use std::net::SocketAddr;

    use crate::{ConnectionConfig, Endpoint};

    fn taken_alone(e: &Endpoint) -> u64 {
        (e.udp().expect("a UDP endpoint").drivers.iter())
            .flat_map(|d| d.shared().receivers.iter())
            .map(|r| r.lock().unwrap().taken_alone)
            .sum()
    }

    /// `rounds` 64-byte messages from `client`, each echoed by `server` (on a thread of its
    /// own) before the next, every echo checked; then `measure` of the server, taken there.
    fn echo_exchange<T: Send + 'static>(
        server: Endpoint,
        client: &Endpoint,
        rounds: usize,
        measure: fn(&Endpoint) -> T,
    ) -> T {
        let to = server.local_addrs();
        let echo = std::thread::spawn(move || {
            let mut conn = server.accept().unwrap();
            let mut buf = [0u8; 64];
            for _ in 0..rounds {
                conn.read_exact(&mut buf).unwrap();
                conn.write_all(&buf).unwrap();
            }
            measure(&server)
        });
        let mut conn = client.connect(&to, ConnectionConfig::default()).unwrap();
        let mut reply = [0u8; 64];
        for i in 0..rounds {
            let msg = [i as u8; 64];
            conn.write_all(&msg).unwrap();
            conn.read_exact(&mut reply).unwrap();
            assert_eq!(reply, msg);
        }
        echo.join().unwrap()
    }

    /// A call that waits for one message at a time takes each arrival alone, with a plain
    /// `recvmsg` ([`SINGLE_TAKES`](super::SINGLE_TAKES)), not with a `recvmmsg` that then
    /// looks for more in vain.
    #[test]
    fn a_request_response_exchange_is_received_one_datagram_at_a_time() {
        const ROUNDS: u64 = 2000;
        let addrs = one_link();
        let server = Endpoint::server(&addrs).unwrap();
        let client = Endpoint::client(&addrs).unwrap();
        let at_server = echo_exchange(server, &client, ROUNDS as usize, taken_alone);
        let alone = taken_alone(&client) + at_server;
        // two arrivals per round trip, one at each end
        assert!(
            alone > ROUNDS,
            "{alone} of the {} arrivals were taken alone",
            2 * ROUNDS
        );
    }

    /// A client endpoint of one shard (so its connection is on the driver a test holds up),
    /// with `send_threads`, connected to a server: (server, client, the client's connection,
    /// the server's).
    fn one_shard_pair(
        send_threads: crate::SendThreads,
    ) -> (Endpoint, Endpoint, crate::Connection, crate::Connection) {
        use crate::EndpointConfig;
        let addrs = one_link();
        let server = Endpoint::server(&addrs).unwrap();
        let client = Endpoint::bind(
            EndpointConfig::new(addrs)
                .with_shards(Some(1))
                .with_send_threads(send_threads),
        )
        .unwrap();
        let conn = client
            .connect(&server.local_addrs(), ConnectionConfig::default())
            .unwrap();
        let accepted = server.accept().unwrap();
        (server, client, conn, accepted)
    }

    /// The peer learned of the abort (code 7) and reads nothing more.
    fn assert_aborted_by_peer(accepted: &crate::Connection) {
        let mut buf = [0u8; 16];
        let read = std::io::Read::read(&mut &*accepted, &mut buf);
        assert!(!matches!(read, Ok(n) if n > 0), "{read:?}");
        assert!(
            matches!(
                accepted.close_reason(),
                Some(crate::ConnectionError::PeerAborted { code: 7, .. })
            ),
            "{:?}",
            accepted.close_reason()
        );
    }

    /// `Endpoint::close` returns only once the CLOSE of each connection it aborted was sent,
    /// also when another thread was sending at that moment and so sends it: a process that
    /// ends right after the close (the tunnel daemon on SIGTERM) must not take it along.
    #[test]
    fn close_returns_after_the_close_queued_behind_another_sender_is_sent() {
        use std::time::{Duration, Instant};

        const OTHER_SENDS_FOR: Duration = Duration::from_millis(300);
        // no lanes: the thread that finds the queue free sends it (lanes: the next test)
        let (_server, client, conn, accepted) = one_shard_pair(crate::SendThreads::Off);
        // another thread takes the sending role and keeps it for a while, as a sending
        // streak of the driver thread or of a writer does (taken once free: a round of the
        // driver thread still under way would send the CLOSE itself)
        let driver = std::sync::Arc::clone(&client.udp().unwrap().drivers[0]);
        loop {
            let mut st = driver.shared().lock();
            if !st.out.sending {
                st.out.sending = true;
                break;
            }
            drop(st);
            std::thread::sleep(Duration::from_millis(1));
        }
        let other_sender = std::sync::Arc::clone(&driver);
        let other = std::thread::spawn(move || {
            std::thread::sleep(OTHER_SENDS_FOR);
            let shared = other_sender.shared();
            let mut st = shared.lock();
            st.out.sending = false;
            drop(shared.transmit(st, None));
        });
        let started = Instant::now();
        conn.abort(7, "going away");
        // the abort's CLOSE waits in the queue for the sending thread
        assert!(!driver.shared().lock().out.queue.is_empty());
        // (it reports the aborted connection as not delivered: not what this test is about)
        let _ = client.close(Some(Duration::from_millis(10)));
        let waited = started.elapsed();
        {
            let st = driver.shared().lock();
            assert!(st.out.queue.is_empty() && !st.out.sending);
        }
        assert!(
            waited >= OTHER_SENDS_FOR,
            "close returned after {waited:?}, before the other thread sent"
        );
        other.join().unwrap();
        // and the peer learned of the abort from it
        assert_aborted_by_peer(&accepted);
    }

    /// The same with lanes: the CLOSE of an aborted connection waits in a lane whose socket
    /// another thread holds, and `Endpoint::close` returns only once the lane sent it.
    #[test]
    fn close_returns_after_a_held_up_lane_has_sent_the_close() {
        use std::time::{Duration, Instant};

        const HELD_FOR: Duration = Duration::from_millis(300);
        let (_server, client, conn, accepted) = one_shard_pair(crate::SendThreads::On);
        let driver = std::sync::Arc::clone(&client.udp().unwrap().drivers[0]);
        // held once free (a send under way finishes first)
        while !driver.shared().lanes[0].hold() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let holder = std::sync::Arc::clone(&driver);
        let other = std::thread::spawn(move || {
            std::thread::sleep(HELD_FOR);
            let lane = &holder.shared().lanes[0];
            lane.release();
            lane.wake();
        });
        let started = Instant::now();
        conn.abort(7, "going away");
        // the abort's CLOSE waits in the lane
        assert!(driver.shared().backlog.any_unsent());
        let _ = client.close(Some(Duration::from_millis(10)));
        let waited = started.elapsed();
        assert!(!driver.shared().backlog.any_unsent());
        assert!(
            waited >= HELD_FOR,
            "close returned after {waited:?}, before the lane sent"
        );
        other.join().unwrap();
        assert_aborted_by_peer(&accepted);
    }

    /// Batches each lane's thread sent and threads that built them sent themselves, summed
    /// over an endpoint's shards, per link socket.
    fn lane_sends(e: &Endpoint) -> Vec<(usize, usize)> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut per = Vec::new();
        for d in &e.udp().expect("a UDP endpoint").drivers {
            for (i, l) in d.shared().lanes.iter().enumerate() {
                if per.len() <= i {
                    per.push((0, 0));
                }
                per[i].0 += l.sent_by_thread.load(Relaxed);
                per[i].1 += l.sent_by_caller.load(Relaxed);
            }
        }
        per
    }

    /// A server and a client on `addrs`, each with a sending lane per link socket, and with
    /// a receiving one if `receiving`; both hold `key`, if any.
    fn lane_endpoints(
        addrs: &[SocketAddr],
        receiving: bool,
        key: Option<crate::Key>,
    ) -> (Endpoint, Endpoint) {
        use crate::{EndpointConfig, LinkThreads};
        let recv = if receiving {
            LinkThreads::On
        } else {
            LinkThreads::Off
        };
        let config = || {
            EndpointConfig::new(addrs.to_vec())
                .with_send_threads(LinkThreads::On)
                .with_recv_threads(recv)
                .with_key(key.clone())
        };
        let server = Endpoint::bind(config().server()).unwrap();
        let client = Endpoint::bind(config()).unwrap();
        (server, client)
    }

    /// Batches each receiving lane's thread received, summed over an endpoint's shards, per
    /// link socket.
    fn lane_receives(e: &Endpoint) -> Vec<usize> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut per = Vec::new();
        for d in &e.udp().expect("a UDP endpoint").drivers {
            for (i, l) in d.shared().recv_lanes.iter().enumerate() {
                if per.len() <= i {
                    per.push(0);
                }
                per[i] += l.received_by_thread.load(Relaxed);
            }
        }
        per
    }

    /// One loopback link, for the request-response tests.
    fn one_link() -> Vec<SocketAddr> {
        vec!["127.0.0.1:0".parse().unwrap()]
    }

    /// The two loopback links of the stream tests.
    fn two_links() -> Vec<SocketAddr> {
        vec![
            "127.0.0.1:0".parse().unwrap(),
            "127.0.0.2:0".parse().unwrap(),
        ]
    }

    /// `bytes` that differ from position to position, so that a piece out of place shows.
    fn patterned(bytes: usize) -> Vec<u8> {
        (0..bytes as u64)
            .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
            .collect()
    }

    /// Streams `data` from `client` to `server`; returns what the server read, and the
    /// server.
    fn stream_through(server: Endpoint, client: &Endpoint, data: &[u8]) -> (Vec<u8>, Endpoint) {
        let to = server.local_addrs();
        let reader = std::thread::spawn(move || {
            let mut conn = server.accept().unwrap();
            let mut got = Vec::new();
            conn.read_to_end(&mut got).unwrap();
            drop(conn);
            (got, server)
        });
        let mut conn = client.connect(&to, ConnectionConfig::default()).unwrap();
        conn.write_all(data).unwrap();
        conn.finish().unwrap();
        conn.wait_acknowledged(None).unwrap();
        reader.join().unwrap()
    }

    /// With lanes a stream over two links arrives intact, and the lanes' threads, not the
    /// writing thread, sent most of it on each link.
    #[test]
    fn lanes_carry_a_stream_intact_and_their_threads_send_most_of_it() {
        let (server, client) = lane_endpoints(&two_links(), false, None);
        let data = patterned(32 << 20);
        let (got, _) = stream_through(server, &client, &data);
        assert!(
            got == data,
            "{} of {} bytes arrived, or others",
            got.len(),
            data.len()
        );
        let sends = lane_sends(&client);
        assert_eq!(sends.len(), 2, "a lane per link socket");
        let by_thread: usize = sends.iter().map(|s| s.0).sum();
        let by_caller: usize = sends.iter().map(|s| s.1).sum();
        assert!(
            sends.iter().all(|s| s.0 > 0) && by_thread > by_caller,
            "batches sent by each lane's thread and by the builders: {sends:?}"
        );
    }

    /// A message of a request-response exchange leaves from the thread that wrote it: the
    /// lanes' threads, woken for it, would add a wake-up to every round trip.
    #[test]
    fn a_short_message_to_an_idle_lane_leaves_from_the_calling_thread() {
        const ROUNDS: usize = 500;
        let addrs = one_link();
        let (server, client) = lane_endpoints(&addrs, false, None);
        let at_server = echo_exchange(server, &client, ROUNDS, lane_sends);
        for (side, sends) in [("client", lane_sends(&client)), ("server", at_server)] {
            let (by_thread, by_caller) = sends[0];
            assert!(
                by_caller >= ROUNDS && by_thread <= ROUNDS / 20,
                "{side}: {by_thread} batches sent by the lane's thread, {by_caller} by callers"
            );
        }
    }

    /// With receiving lanes a stream over two links arrives intact, without a key and with
    /// one (each lane opens what it receives), and each link's lane received some of it on its
    /// own thread (the reading thread receives for itself only while it waits).
    #[test]
    fn receiving_lanes_carry_a_stream_intact_and_each_receives_on_its_link() {
        let data = patterned(32 << 20);
        for key in [None, Some(crate::Key::from_bytes([9; 32]))] {
            let keyed = key.is_some();
            let (server, client) = lane_endpoints(&two_links(), true, key);
            assert!(server.recv_threads() && client.recv_threads());
            let (got, server) = stream_through(server, &client, &data);
            assert!(
                got == data,
                "keyed {keyed}: {} bytes arrived, or others",
                got.len()
            );
            let received = lane_receives(&server);
            assert_eq!(received.len(), 2, "a receiving lane per link socket");
            assert!(
                received.iter().all(|&n| n > 0),
                "keyed {keyed}: batches each receiving lane's thread received: {received:?}"
            );
        }
    }

    /// With receiving lanes, a request-response exchange is still received by the calls that
    /// wait for it (their epoll instance is woken first, and they take one datagram alone): a
    /// lane's thread receiving it would add a wake-up to every round trip.
    #[test]
    fn a_waiting_call_receives_its_reply_before_a_receiving_lane() {
        const ROUNDS: u64 = 2000;
        let addrs = one_link();
        let (server, client) = lane_endpoints(&addrs, true, None);
        let (at_server, by_lane) = echo_exchange(server, &client, ROUNDS as usize, |e| {
            (taken_alone(e), lane_receives(e))
        });
        let alone = taken_alone(&client) + at_server;
        // two arrivals per round trip, one at each end
        assert!(
            alone > ROUNDS,
            "{alone} of the {} arrivals were taken alone by waiting calls (batches received by \
             the lanes' threads: client {:?}, server {by_lane:?})",
            2 * ROUNDS,
            lane_receives(&client)
        );
    }
}
