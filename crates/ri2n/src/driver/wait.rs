//! Application calls that wait: on a connection's condition variable, or watching the sockets
//! themselves and receiving what arrives ([`Shared::wait_connection`],
//! [`Shared::wait_receiving`]), one call at a time ([`PollerTurn`]).

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, MutexGuard};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll};
use ri2n_proto::ConnectionHandle;

use crate::socket::Received;

use super::{poll_readable, Shared, State, READY_TOKEN, STEP_BACK};

/// The condition variable of one connection's waiting calls, and how many wait on it (only
/// then is it worth a wake-up).
#[derive(Debug, Default)]
pub(super) struct Signal {
    pub(super) condvar: Arc<Condvar>,
    pub(super) waiting: usize,
}

/// Which blocked application call watches the sockets. One call at a time does (the first to
/// wait); an arrival for another connection it then receives and hands over, waking that
/// connection's call: two thread wake-ups per arrival instead of one. So a call that was woken
/// only for others leaves the sockets to them on its next wait, and the call it woke takes
/// them over when it waits again (the driver thread watches meanwhile). A daemon with a thread
/// per peer (`ri2n tunnel`) keeps the call of the busy peer watching, not an idle one.
#[derive(Debug, Default)]
pub(super) struct PollerTurn {
    /// The connection whose call watches now.
    pub(super) watching: Option<ConnectionHandle>,
    /// Since it started watching: an event for its own connection came.
    pub(super) served: bool,
    /// Since it started watching: it woke a call waiting on another connection.
    pub(super) woke_others: bool,
    /// A connection whose call watched for others only, or found the receive buffers taken:
    /// its next wait is on its condition variable.
    yielding: Option<ConnectionHandle>,
    /// A call of [`Shared::wait_receiving`] found the receive buffers taken: the next one
    /// waits on its descriptor alone.
    receiving_yields: bool,
}

/// The sockets' second watcher, for the blocked application call that receives for itself.
#[derive(Debug)]
pub(super) struct CallerPoll {
    poll: Poll,
    events: Events,
    /// The descriptor [`Shared::wait_receiving`] last waited on, still registered: a loop
    /// that waits on the same one again and again costs no `epoll_ctl` per wait.
    ready: Option<RawFd>,
    /// A [`Shared::wait_connection`] watching here took that descriptor's readiness: it is
    /// registered edge-triggered, so the next `wait_receiving` would not hear of it again.
    ready_seen: bool,
}

impl CallerPoll {
    pub(super) fn new(poll: Poll) -> Self {
        Self {
            poll,
            events: Events::with_capacity(64),
            ready: None,
            ready_seen: false,
        }
    }
}

impl Shared {
    /// Holds an application call that queued datagrams on connection `h` while the lanes fall
    /// behind: while the lanes' backlog stops the engine from building and the connection's
    /// datagram queue is more than half full, the call waits for a lane to send and have the
    /// engine build again. At most the connection's datagram age limit in all
    /// ([`ConnectionConfig::datagram_max_age`](crate::ConnectionConfig::datagram_max_age)):
    /// a lane sends a batch far sooner, and a datagram queued that long is dropped anyway.
    ///
    /// Without lanes the thread that queues datagrams builds and sends them, so it queues no
    /// faster than the links take them. With lanes it only builds, and a caller that reads
    /// its datagrams faster than the lanes send them (the tunnel, from its interface) fills
    /// the queue, which then drops the oldest: losses inside the tunnel that its inner TCP
    /// answers by sending again and slowing down. Held here instead, it reads no faster than
    /// the lanes send, and what it has not read waits with the sender (inner TCP's own
    /// queue). Not while the congestion windows or a links' outage hold the queue: the
    /// backlog is not what stops the engine then, and the call returns as without lanes.
    pub fn pace_datagrams<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        h: ConnectionHandle,
    ) -> MutexGuard<'a, State> {
        // while the lanes hold the connection's datagrams up: its age limit (the cheap look
        // first: most calls find the lanes keeping up)
        let behind = |st: &State| {
            if !self.backlog.is_throttled() {
                return None;
            }
            let c = st.endpoint.connection(h)?;
            c.datagrams_piling_up().then(|| c.datagram_max_age())
        };
        if self.lanes.is_empty() {
            return st;
        }
        let Some(max_age) = behind(&st) else {
            return st;
        };
        // an age too large for the clock (Duration::MAX: datagrams never too old) is no
        // deadline
        let deadline = Instant::now().checked_add(max_age);
        while behind(&st).is_some() {
            let left = deadline.map_or(max_age, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                tracing::trace!("the lanes did not catch up: datagrams queued on");
                break;
            }
            st.paced += 1;
            st = (self.lanes_caught_up.wait_timeout(st, left))
                .unwrap_or_else(|e| e.into_inner())
                .0;
            st.paced -= 1;
        }
        st
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
        let CallerPoll {
            poll,
            events,
            ready_seen,
            ..
        } = &mut *cp;
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        // an error (EINTR) just means: look again
        let _ = poll.poll(events, timeout);
        self.caller_polling.store(false, Ordering::Release);
        *ready_seen |= events.iter().any(|e| e.token() == READY_TOKEN);
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
            ready_seen,
        } = &mut *cp;
        let mut readable_now = std::mem::take(ready_seen);
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
        } else if !readable_now && timeout != Some(Duration::ZERO) {
            // About to sleep on it: is it still the descriptor registered, or one the caller
            // made under the same number after closing that one (which left the set with
            // it)? Adding it again tells, one system call per sleep, none per busy look: the
            // same one is there already (EEXIST); a new one was not, and is now.
            let added =
                (poll.registry()).register(&mut SourceFd(&ready), READY_TOKEN, Interest::READABLE);
            match added {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                // what it held before is not reported (edge-triggered)
                Ok(()) => readable_now = true,
                Err(e) => {
                    tracing::error!(error = %e, "epoll_ctl failed");
                    *registered = None;
                    drop(cp);
                    poll_readable(ready, timeout);
                    return true;
                }
            }
        }
        // already known to be readable: only what the sockets hold now is taken first
        let timeout = if readable_now {
            Some(Duration::ZERO)
        } else {
            timeout
        };
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
    /// whether anything was handed to the engine (from those sockets, or from others another
    /// thread was turned away from: either may have set timers the driver thread must be
    /// armed for), and whether another thread held the receive buffers.
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
                    let (r, taken) =
                        self.receive(ev.token().0, true, readable.as_deref_mut(), false);
                    received |= taken;
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

    /// A call (`accept`) is about to block without watching this shard's sockets.
    pub fn before_blocking(&self) {
        self.take_sockets_back(&mut self.lock());
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
