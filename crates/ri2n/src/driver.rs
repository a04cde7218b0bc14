//! The driver: runs the sans-IO engine on real sockets.
//!
//! All engine state sits behind one mutex. A communication thread (RI2N's "RI2N thread")
//! waits on the sockets and the engine's next timer, receives in batches and runs timers, so
//! retransmissions and link probes happen without the application calling in. Application
//! threads call the engine directly under the same mutex and send what results from their own
//! thread: a write reaches the wire without a thread hop. The receive path avoids the hop too:
//! one blocked application call at a time waits on a second epoll instance watching the same
//! sockets and receives for itself when a datagram arrives, so a reply does not wait for the
//! driver thread to wake the application (RI2N/UDP measured that hop as most of its latency
//! above TCP's). Other blocked calls wait on a condition variable of their connection (or of
//! `accept`), signalled when the engine reports an event for it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use ri2n_proto::{ConnectionHandle, Endpoint as ProtoEndpoint};

use crate::connection::TimedEvent;

use crate::socket::{LinkSocket, SendOutcome};

/// Events kept per connection for the application (oldest dropped beyond).
const MAX_QUEUED_EVENTS: usize = 256;
const WAKE_TOKEN: Token = Token(usize::MAX);
/// Room for one datagram the engine may build (its configured maximum is at most 16 KiB).
const MAX_DATAGRAM: usize = 16 * 1024;
/// Most bytes one GSO send carries: below the 65 507-byte limit of one UDP send over IPv4.
const BATCH_BYTES: usize = 60 * 1024;

/// Engine state shared between the driver thread and application threads.
#[derive(Debug)]
pub(crate) struct State {
    pub endpoint: ProtoEndpoint,
    /// Incoming connections not yet taken by `accept`.
    pub accepted: VecDeque<ConnectionHandle>,
    /// Events per connection, for `Connection::poll_events`.
    pub events: HashMap<ConnectionHandle, VecDeque<TimedEvent>>,
    /// Connections whose application handle was dropped: released once closed.
    pub dropped: HashSet<ConnectionHandle>,
    /// What callers waiting on a connection wait on, by connection.
    signals: HashMap<ConnectionHandle, Arc<Condvar>>,
    /// When the driver thread will next wake up by itself.
    driver_deadline: Option<Instant>,
    /// An application thread waits in [`CallerPoll`].
    caller_polling: bool,
    /// A datagram is built here, then copied into its socket's batch.
    scratch: Vec<u8>,
    /// Datagrams waiting to leave, per socket.
    batches: Vec<Batch>,
    /// Receive buffers, per socket (whoever receives holds the lock).
    recv_bufs: Vec<Vec<Vec<u8>>>,
}

/// Datagrams for one socket that leave together: all to `dest`, all `segment` bytes long
/// except perhaps the last.
#[derive(Debug, Default)]
struct Batch {
    dest: Option<SocketAddr>,
    segment: usize,
    data: Vec<u8>,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Whether a datagram of `len` bytes to `dest` may join.
    fn takes(&self, dest: SocketAddr, len: usize, max_segments: usize) -> bool {
        self.dest == Some(dest)
            && len <= self.segment
            && !self.is_closed()
            && self.data.len() / self.segment < max_segments
    }

    fn push(&mut self, dest: SocketAddr, datagram: &[u8]) {
        if self.data.is_empty() {
            self.dest = Some(dest);
            self.segment = datagram.len();
        }
        self.data.extend_from_slice(datagram);
    }

    /// A datagram shorter than the segment size ended the batch.
    fn is_closed(&self) -> bool {
        self.segment != 0 && self.data.len() % self.segment != 0
    }
}

/// The sockets' second watcher, for the blocked application call that receives for itself.
#[derive(Debug)]
struct CallerPoll {
    poll: Poll,
    events: Events,
}

/// What the driver thread and the application handles share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub state: Mutex<State>,
    /// Signalled when a connection is ready for `accept`.
    accepted: Condvar,
    pub sockets: Vec<LinkSocket>,
    waker: Waker,
    shutdown: AtomicBool,
    caller_poll: Mutex<CallerPoll>,
    /// Wakes the thread waiting in `caller_poll` for events that are not arrivals (timers).
    caller_waker: Waker,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// After the application changed the engine: send what it produced, publish events, and
    /// wake the driver if the engine now needs it earlier than planned.
    pub fn after_app_call(&self, st: &mut State) {
        let now = Instant::now();
        self.flush(st, now);
        self.dispatch(st).notify();
        let next = st.endpoint.poll_timeout();
        if next.is_some_and(|t| st.driver_deadline.is_none_or(|d| t < d)) {
            st.driver_deadline = next;
            let _ = self.waker.wake();
        }
    }

    /// Waits until something may have changed for connection `h` (or `deadline`); the caller
    /// re-checks. The first waiting thread watches the sockets itself and processes what
    /// arrives; others wait for the connection's condition variable.
    pub fn wait_connection<'a>(
        &'a self,
        mut guard: MutexGuard<'a, State>,
        h: ConnectionHandle,
        deadline: Option<Instant>,
    ) -> MutexGuard<'a, State> {
        let Ok(mut cp) = self.caller_poll.try_lock() else {
            let signal = guard.signals.entry(h).or_default().clone();
            return wait_on(&signal, guard, deadline);
        };
        guard.caller_polling = true;
        drop(guard);
        let CallerPoll { poll, events } = &mut *cp;
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        // an error (EINTR) just means: look again
        let _ = poll.poll(events, timeout);
        let mut st = self.lock();
        st.caller_polling = false;
        let now = Instant::now();
        for i in 0..self.sockets.len() {
            while self.receive(&mut st, i, now) {}
        }
        self.after_app_call(&mut st);
        st
    }

    /// Receives one batch from socket `i` into the engine and sends the answers; false when
    /// nothing was waiting.
    fn receive(&self, st: &mut State, i: usize, now: Instant) -> bool {
        let sock = &self.sockets[i];
        let State {
            endpoint,
            recv_bufs,
            ..
        } = st;
        let received = sock.recv_batch(&mut recv_bufs[i], &mut |remote, d| {
            endpoint.handle_datagram(now, sock.local, remote, d)
        });
        match received {
            Ok(0) => false,
            Ok(_) => {
                self.flush(st, now);
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, socket = %sock.local, "receive failed");
                false
            }
        }
    }

    /// Waits until a connection arrives for `accept` (or `deadline`).
    pub fn wait_accept<'a>(
        &self,
        guard: MutexGuard<'a, State>,
        deadline: Option<Instant>,
    ) -> MutexGuard<'a, State> {
        wait_on(&self.accepted, guard, deadline)
    }

    /// Sends every datagram the engine has ready. Each socket collects its datagrams in a
    /// batch of its own: consecutive datagrams of one size to the same address leave in one
    /// GSO system call even when the scheduler alternates between links packet by packet.
    fn flush(&self, st: &mut State, now: Instant) {
        let State {
            endpoint,
            scratch,
            batches,
            ..
        } = st;
        while let Some(t) = endpoint.poll_transmit(now, scratch) {
            let Some(i) = self.sockets.iter().position(|s| s.local == t.local) else {
                continue;
            };
            let datagram = &scratch[..t.len];
            let batch = &mut batches[i];
            if !batch.is_empty() && !batch.takes(t.remote, t.len, self.sockets[i].max_segments()) {
                self.send_batch(endpoint, now, i, batch);
            }
            batch.push(t.remote, datagram);
            // a shorter datagram can only end a batch, and a full one goes now
            if batch.is_closed() || batch.data.len() + MAX_DATAGRAM > BATCH_BYTES {
                self.send_batch(endpoint, now, i, batch);
            }
        }
        for (i, batch) in batches.iter_mut().enumerate() {
            if !batch.is_empty() {
                self.send_batch(endpoint, now, i, batch);
            }
        }
    }

    fn send_batch(
        &self,
        endpoint: &mut ProtoEndpoint,
        now: Instant,
        socket: usize,
        batch: &mut Batch,
    ) {
        let sock = &self.sockets[socket];
        let dest = batch.dest.expect("a batch with data has a destination");
        if sock.send(dest, &batch.data, Some(batch.segment)) == SendOutcome::Unreachable {
            endpoint.handle_unreachable(now, sock.local, dest);
        }
        batch.data.clear();
    }

    /// Moves engine events to the per-connection queues; returns whom to wake (the caller
    /// does so, preferably after releasing the lock).
    fn dispatch(&self, st: &mut State) -> Wakeups<'_> {
        let mut wake = Wakeups {
            accepted: None,
            connections: Vec::new(),
            caller_poll: None,
        };
        while let Some((h, e)) = st.endpoint.poll_event() {
            let q = st.events.entry(h).or_default();
            if q.len() >= MAX_QUEUED_EVENTS {
                q.pop_front();
            }
            q.push_back(TimedEvent {
                at: Instant::now(),
                event: e,
            });
            if st.caller_polling {
                wake.caller_poll = Some(&self.caller_waker);
            }
            if let Some(signal) = st.signals.get(&h) {
                if !wake.connections.iter().any(|s| Arc::ptr_eq(s, signal)) {
                    wake.connections.push(signal.clone());
                }
            }
        }
        while let Some(h) = st.endpoint.accept() {
            st.accepted.push_back(h);
            wake.accepted = Some(&self.accepted);
        }
        let State {
            endpoint,
            dropped,
            events,
            signals,
            ..
        } = st;
        dropped.retain(|&h| {
            if endpoint.release(h) {
                events.remove(&h);
                signals.remove(&h);
                false
            } else {
                true
            }
        });
        wake
    }
}

/// The waiting callers to wake after the engine reported events.
struct Wakeups<'a> {
    accepted: Option<&'a Condvar>,
    connections: Vec<Arc<Condvar>>,
    caller_poll: Option<&'a Waker>,
}

impl Wakeups<'_> {
    fn notify(self) {
        if let Some(a) = self.accepted {
            a.notify_all();
        }
        if let Some(w) = self.caller_poll {
            let _ = w.wake();
        }
        for c in self.connections {
            c.notify_all();
        }
    }
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

/// Owns the driver thread; the last owner (endpoint or connection) stops it.
#[derive(Debug)]
pub(crate) struct Driver {
    pub shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Driver {
    pub fn start(
        endpoint: ProtoEndpoint,
        mut sockets: Vec<LinkSocket>,
    ) -> std::io::Result<Arc<Self>> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKE_TOKEN)?;
        let caller_poll = Poll::new()?;
        let caller_waker = Waker::new(caller_poll.registry(), WAKE_TOKEN)?;
        for (i, s) in sockets.iter_mut().enumerate() {
            poll.registry()
                .register(&mut s.io, Token(i), Interest::READABLE)?;
            // the same socket again: mio's sources belong to one registry, a raw fd does not
            caller_poll.registry().register(
                &mut SourceFd(&s.io.as_raw_fd()),
                Token(i),
                Interest::READABLE,
            )?;
        }
        let recv_bufs = sockets.iter().map(LinkSocket::recv_buffers).collect();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                endpoint,
                accepted: VecDeque::new(),
                events: HashMap::new(),
                dropped: HashSet::new(),
                signals: HashMap::new(),
                driver_deadline: None,
                caller_polling: false,
                scratch: vec![0u8; MAX_DATAGRAM],
                batches: sockets.iter().map(|_| Batch::default()).collect(),
                recv_bufs,
            }),
            accepted: Condvar::new(),
            sockets,
            waker,
            shutdown: AtomicBool::new(false),
            caller_poll: Mutex::new(CallerPoll {
                poll: caller_poll,
                events: Events::with_capacity(64),
            }),
            caller_waker,
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ri2n-driver".into())
            .spawn(move || run(thread_shared, poll))?;
        Ok(Arc::new(Self {
            shared,
            thread: Mutex::new(Some(thread)),
        }))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        let _ = self.shared.waker.wake();
        if let Some(t) = self.thread.lock().unwrap().take() {
            let _ = t.join();
        }
    }
}

/// The driver thread.
fn run(shared: Arc<Shared>, mut poll: Poll) {
    let mut events = Events::with_capacity(64);
    let mut readable = vec![true; shared.sockets.len()];
    while !shared.shutdown.load(Ordering::Acquire) {
        let (timeout, wakeups) = {
            let mut st = shared.lock();
            let now = Instant::now();
            // receive everything waiting (mio is edge-triggered: drain until empty)
            for (i, r) in readable.iter_mut().enumerate() {
                while *r {
                    *r = shared.receive(&mut st, i, now);
                }
            }
            if st.endpoint.poll_timeout().is_some_and(|t| t <= now) {
                st.endpoint.handle_timeout(now);
            }
            shared.flush(&mut st, now);
            let wakeups = shared.dispatch(&mut st);
            let next = st.endpoint.poll_timeout();
            st.driver_deadline = next;
            (next.map(|t| t.saturating_duration_since(now)), wakeups)
        };
        // after unlocking, so that a woken caller does not at once block on the lock
        wakeups.notify();
        // the engine's timers have 1 ms granularity at best; sleeping less only spins
        let timeout = timeout.map(|t| t.max(Duration::from_micros(50)));
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!(error = %e, "poll failed");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        for ev in events.iter() {
            if let Some(r) = readable.get_mut(ev.token().0) {
                *r = true;
            }
        }
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
