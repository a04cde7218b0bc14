//! The pump's second stage: the engine builds what it has to send into the per-socket batches,
//! which are sealed and sent without the engine's lock ([`Shared::transmit`]), by the thread
//! that built them or by the link sockets' sending lanes (`outgoing.rs`).

use std::collections::VecDeque;
use std::net::SocketAddr;
#[cfg(test)]
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::Instant;

use ri2n_proto::TransmitBuffer;
use smallvec::SmallVec;

use crate::outgoing::{Batch, Outgoing, BATCH_BYTES, SHORT_BATCH};
use crate::socket::{Received, SendOutcome};

use super::{Shared, State};

/// A batch the system refused to send for a reason the engine must hear of: its
/// destination unreachable, or its datagrams too large for the interface.
#[derive(Debug, Clone, Copy)]
pub(super) struct Refused {
    socket: usize,
    dest: SocketAddr,
    outcome: SendOutcome,
}

impl Refused {
    fn of(socket: usize, dest: SocketAddr, outcome: SendOutcome) -> Option<Self> {
        let tell = matches!(
            outcome,
            SendOutcome::Unreachable | SendOutcome::TooBig { .. }
        );
        tell.then_some(Self {
            socket,
            dest,
            outcome,
        })
    }
}

impl Shared {
    /// Has the engine build every datagram it has ready, in place in the per-socket batches.
    /// The clock is read (`now` is `None`) only when the engine may have something to build:
    /// most builds of a request-response exchange find nothing, and a clock read is a good
    /// part of their cost.
    fn build(&self, st: &mut State, now: Option<Instant>) {
        let State { endpoint, out, .. } = st;
        if endpoint.may_transmit() {
            // a socket may have stopped taking GSO batches since (see `LinkSocket::send_raw`)
            out.refresh_max_segments(&self.sockets);
            let now = now.unwrap_or_else(Instant::now);
            loop {
                while out.wants_more() && endpoint.poll_transmit_into(now, out) > 0 {}
                if out.wants_more() {
                    break; // it built all it had
                }
                out.backlog.throttle();
                // the lanes may have sent the backlog between the look and the mark, and found
                // no mark to build more for: look again, and build on if they did
                if !(out.wants_more() && out.backlog.take_throttled()) {
                    break;
                }
            }
        }
        out.close_all();
    }

    /// Seals batch `b` of socket `i` and sends it: a batch of several datagrams gathered from
    /// its buffer and the send buffer's pieces where it can, else from its buffer alone.
    pub(super) fn send_batch(&self, i: usize, b: &mut Batch) -> SendOutcome {
        b.seal();
        let segment = Some(b.segment).filter(|&s| s < b.len);
        let gathered = match segment {
            Some(segment) if b.has_holes() => {
                self.sockets[i].send_gathered(b.dest, &b.parts(), segment)
            }
            _ => None,
        };
        #[cfg(test)]
        if segment.is_some() {
            let counter = match gathered {
                Some(_) => &self.sent_gathered,
                None => &self.sent_whole,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let outcome = gathered.unwrap_or_else(|| {
            b.fill_holes();
            self.sockets[i].send(b.dest, &b.buf[..b.len], segment)
        });
        b.clear_holes();
        outcome
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
        let mut refused: SmallVec<[Refused; 2]> = SmallVec::new();
        for (i, b) in &mut own {
            refused.extend(Refused::of(*i, b.dest, self.send_batch(*i, b)));
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
        self.handle_refused(&mut st, &refused);
        st.out.spare.extend(own.into_iter().map(|(_, mut b)| {
            b.len = 0;
            b
        }));
        st
    }

    /// Tells the engine of the sends the system refused.
    pub(super) fn handle_refused(&self, st: &mut State, refused: &[Refused]) {
        if refused.is_empty() {
            return;
        }
        let now = Instant::now();
        for r in refused {
            let local = self.sockets[r.socket].local;
            match r.outcome {
                SendOutcome::TooBig { size } => {
                    st.endpoint.handle_too_big(now, local, r.dest, size)
                }
                _ => st.endpoint.handle_unreachable(now, local, r.dest),
            }
        }
    }

    /// Builds what the engine has ready and sends it; `now` is the instant the caller read
    /// last, if it just did (see [`Self::build`]). Sending happens without the lock; a
    /// thread that finds another one sending leaves its batches in the queue for that one,
    /// which sends until the queue is empty (so each socket's datagrams keep their order).
    pub(super) fn transmit<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        now: Option<Instant>,
    ) -> MutexGuard<'a, State> {
        self.build(&mut st, now);
        if !self.lanes.is_empty() {
            return self.hand_to_lanes(st);
        }
        if st.out.sending {
            return st;
        }
        st.out.sending = true;
        let mut refused: Vec<Refused> = Vec::new();
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
                refused.extend(Refused::of(*i, b.dest, self.send_batch(*i, b)));
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
            self.handle_refused(&mut st, &refused);
            refused.clear();
            // rare, and woken at once: the forwarding shard holds no lock of the other's
            self.router.wake(self.hand_over_refusals(&mut st, None));
            st.out.spare.extend(batches.drain(..).map(|(_, mut b)| {
                b.len = 0;
                b
            }));
            st.out.taken_queue = batches;
            // acknowledgements that arrived meanwhile may have opened windows
            self.build(&mut st, None);
        }
        st.out.sending = false;
        st
    }
}

/// Lane `i`'s thread (see `outgoing`): seals and sends the batches handed to it, in order.
/// After a round it tells the engine of unreachable destinations, and has it build more if
/// the lanes' backlog had stopped it.
pub(super) fn lane(shared: &Shared, i: usize) {
    let lane = &shared.lanes[i];
    let (mut next, mut spent) = (VecDeque::new(), Vec::new());
    let mut round = false;
    while lane.next(round, &mut next, &mut spent) {
        round = true;
        let mut refused: SmallVec<[Refused; 2]> = SmallVec::new();
        for mut b in next.drain(..) {
            refused.extend(Refused::of(i, b.dest, shared.send_batch(i, &mut b)));
            b.len = 0;
            spent.push(b);
            shared.backlog.sent();
            #[cfg(test)]
            lane.sent_by_thread.fetch_add(1, Ordering::Relaxed);
        }
        if shared.backlog.take_throttled() || !refused.is_empty() {
            let mut st = shared.lock();
            shared.handle_refused(&mut st, &refused);
            let st = shared.after_app_call(st);
            if st.paced > 0 {
                shared.lanes_caught_up.notify_all();
            }
        }
    }
}
