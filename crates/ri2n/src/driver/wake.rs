//! The pump's last stage: the engine's events go to the connections' queues and readiness
//! descriptors, and the calls they concern are woken once the lock is let go
//! ([`Shared::dispatch`], [`Wakeups`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar};
use std::time::Instant;

use mio::Waker;
use ri2n_proto::{ConnectionState, Event, LinkState};
use smallvec::SmallVec;

use crate::connection::{TimedEvent, MAX_QUEUED_EVENTS, UNREAD};

use super::{Shared, State};

impl Shared {
    /// Moves engine events to the per-connection queues; returns whom to wake (the caller
    /// does so, preferably after releasing the lock). With `readable` (a thread that will
    /// return to its event loop at once, [`Self::wait_receiving`]), data readiness of a
    /// connection with a loop token is told by appending the token there, not by signalling
    /// its readiness descriptors.
    pub(super) fn dispatch(
        &self,
        st: &mut State,
        mut readable: Option<&mut Vec<u64>>,
    ) -> Wakeups<'_> {
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
                        w.reported(&e);
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
            if st.accepting {
                self.accepts.push(self.shard, h);
            } else {
                st.abort_unaccepted(h);
            }
        }
        let State {
            endpoint,
            dropped,
            events,
            signals,
            readiness,
            closes,
            ..
        } = st;
        dropped.retain(|&h| {
            // what the peer sent and sends now, nobody will read: once what this side wrote
            // is delivered, the peer is told so, as TCP resets a connection closed with data
            // unread, rather than acknowledged until its window is full and left waiting
            let unread = endpoint.connection(h).is_some_and(|c| {
                c.state() != ConnectionState::Closed && c.is_send_complete() && c.unread_bytes() > 0
            });
            if let Some(c) = endpoint.connection_mut(h).filter(|_| unread) {
                c.abort(0, UNREAD);
                return true; // released at a later round: its CLOSE leaves first
            }
            // a close under way counts what it left undelivered first
            if *closes == 0 && endpoint.release(h, Instant::now()) {
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
pub(super) struct Wakeups<'a> {
    connections: SmallVec<[Arc<Condvar>; 4]>,
    caller_poll: Option<&'a Waker>,
    driver: Option<&'a Waker>,
}

impl Wakeups<'_> {
    pub(super) fn notify(self) {
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
