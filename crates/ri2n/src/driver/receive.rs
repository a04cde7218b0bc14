//! The pump's first stage: receive from a socket (without the engine's lock), open what came
//! (with a key) and hand it to the engine ([`Shared::receive`], [`Shared::take_in`]); the
//! receive buffers ([`Receiver`]), the receiving lanes' threads ([`RecvLane`]), datagrams
//! forwarded between shards, and the path sockets.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
#[cfg(test)]
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token, Waker};
use ri2n_proto::wire;
use ri2n_proto::Endpoint as ProtoEndpoint;

use crate::open_ahead::OpenAhead;
use crate::shards::{Forwarded, ForwardedKind};
use crate::socket::{LinkSocket, Received, RecvBatch, Take};

use super::{
    deregister, register_exclusive, Shared, State, MAX_PATH_SOCKETS, SINGLE_TAKES, WAKE_TOKEN,
};

/// The receive buffers, and what the last receives from each source found.
#[derive(Debug)]
pub(super) struct Receiver {
    batch: RecvBatch,
    /// Per receive source: how many more receives of a waiting call take one datagram alone.
    single_takes: Vec<u8>,
    /// With a key: opens what was received before the engine's lock is taken.
    open_ahead: Option<OpenAhead>,
    /// Receives that took one datagram alone.
    #[cfg(test)]
    pub(super) taken_alone: u64,
}

impl Receiver {
    /// Buffers for the largest receive from any of `sockets`; with a `keyed` endpoint, what
    /// opens ahead of the engine's lock.
    pub(super) fn new(sockets: &[LinkSocket], keyed: bool) -> std::io::Result<Self> {
        Ok(Self {
            batch: RecvBatch::for_sockets(sockets)?,
            single_takes: vec![0; sockets.len() + MAX_PATH_SOCKETS],
            open_ahead: keyed.then(OpenAhead::default),
            #[cfg(test)]
            taken_alone: 0,
        })
    }

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

    /// Puts source `i` in single takes (as a batch receive that found one datagram does).
    #[cfg(test)]
    pub(super) fn take_singly(&mut self, i: usize) {
        self.single_takes[i] = SINGLE_TAKES;
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
pub(super) struct RecvLane {
    /// Its epoll instance, where the driver thread registers the link's path sockets: a
    /// descriptor of its own for the instance that the thread's `Poll` holds, so that the
    /// thread, ending first at the endpoint's close, cannot leave the driver thread this
    /// number closed, or reused by another epoll instance of the process.
    epoll: OwnedFd,
    /// Wakes the thread to stop.
    waker: Waker,
    /// Batches its thread received.
    #[cfg(test)]
    pub(super) received_by_thread: AtomicUsize,
}

impl RecvLane {
    /// The lane of the thread that will wait in `poll`.
    pub(super) fn new(poll: &Poll) -> std::io::Result<Self> {
        Ok(Self {
            // SAFETY: `poll` holds the descriptor open for the call; it is duplicated
            epoll: unsafe { BorrowedFd::borrow_raw(poll.as_raw_fd()) }.try_clone_to_owned()?,
            waker: Waker::new(poll.registry(), WAKE_TOKEN)?,
            #[cfg(test)]
            received_by_thread: AtomicUsize::new(0),
        })
    }

    /// Tells its thread to look at `Shared::shutdown`.
    pub(super) fn stop(&self) {
        let _ = self.waker.wake();
    }
}

impl Shared {
    /// One turn of the pump from source `i`: receives (without the engine's lock), hands
    /// what came to the engine, sends what the engine has to send, and wakes the calls it
    /// concerns; with `arm`, also the driver thread for the timers that set (a receiving lane
    /// does: the driver thread's are its own, and a waiting call arms it once it is done).
    /// See [`Self::take_in`] for what it returns.
    pub(super) fn receive(
        &self,
        i: usize,
        waiting_call: bool,
        readable: Option<&mut Vec<u64>>,
        arm: bool,
    ) -> (Received, bool) {
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
        (received, taken)
    }

    /// Receives from source `i` (without the engine's lock) and hands what came to the
    /// engine; also whether anything was handed over (from `i` or another source).
    /// `TurnedAway` when another thread is receiving: that thread then receives from every
    /// source it was wanted for (`receive_wanted`) before it is done, so an arrival it did
    /// not see is not left in the queue until the next one comes. A `waiting_call` (one whose
    /// level-triggered instance reported the source) may take a datagram alone
    /// ([`Receiver::take_for`]).
    pub(super) fn take_in(&self, i: usize, waiting_call: bool) -> (Received, bool) {
        let mut received = Received::TurnedAway;
        let mut taken = false;
        let group = self.receiver_of(i);
        // the other sources received into the same buffers
        let others = || {
            self.sources()
                .filter(move |&j| j != i && self.receiver_of(j) == group)
        };
        // another thread was turned away from `i` (its edge-triggered wake-up spent): it
        // counts on this one to drain the source, not to take one datagram alone
        let mut drain = false;
        loop {
            // announce first, then try: a holder that lets go after a failed try sees it
            self.receive_wanted[i].fetch_add(1, Ordering::SeqCst);
            let Ok(mut rx) = self.receivers[group].try_lock() else {
                return (received, taken);
            };
            // more announcements than this thread's own: one was turned away, even between
            // this thread's announcement and its lock
            drain |= self.receive_wanted[i].swap(0, Ordering::SeqCst) > 1;
            let take = match drain {
                true => Take::Batch,
                false => rx.take_for(i, waiting_call),
            };
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
                if self.receive_wanted[j].swap(0, Ordering::SeqCst) > 0 {
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
            let wanted = |j: usize| self.receive_wanted[j].load(Ordering::SeqCst) > 0;
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
    /// shard `i`), for [`Router::wake`](crate::shards::Router::wake).
    pub(super) fn hand_over_refusals(&self, st: &mut State, now: Option<Instant>) -> u64 {
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
    /// engine ([`Router::place`](crate::shards::Router::place)); if not, it is forwarded and
    /// `forwarded` gains the shard's bit, for [`Router::wake`](crate::shards::Router::wake).
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
            .place(self.shard, engine, remote, bytes, steering, asks);
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
    /// it on to the next shard to ask; returns the shards passed on to, for
    /// [`Router::wake`](crate::shards::Router::wake).
    pub(super) fn take_forwarded(
        &self,
        st: &mut State,
        now: Instant,
        items: &mut Vec<Forwarded>,
    ) -> u64 {
        let mut passed_on = 0;
        for mut f in items.drain(..) {
            let steering = match f.kind {
                ForwardedKind::Datagram => wire::steering(&f.bytes),
                ForwardedKind::Refusal => wire::quote_steering(&f.bytes),
            };
            match self.router.place(
                self.shard,
                &st.endpoint,
                f.remote,
                &f.bytes,
                steering,
                f.asks_left,
            ) {
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
    pub(super) fn socket_event(&self, i: usize, ev: &mio::event::Event) {
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
    pub(super) fn update_path_sockets(
        &self,
        heard: &[(SocketAddr, SocketAddr)],
        poll: &Poll,
        watching: bool,
    ) {
        let n = self.sockets.len();
        for (link, sock) in self.sockets.iter().enumerate() {
            // Datagrams that peer sends from now on go to the link socket; the few queued in
            // the path socket, if any, are lost with it (the path was not heard for minutes).
            sock.close_paths(
                |remote| heard.binary_search(&(sock.local, remote)).is_ok(),
                |slot, fd| {
                    let _ = deregister(self.caller_epoll, fd);
                    if let Some(lane) = self.recv_lanes.get(link) {
                        let _ = deregister(lane.epoll.as_raw_fd(), fd);
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
                        register_exclusive(lane.epoll.as_raw_fd(), fd, token, true)
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
                                let _ = deregister(lane.epoll.as_raw_fd(), fd);
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
}

/// Receiving lane `i`'s thread ([`RecvLane`]): turns the pump for what arrives on link socket
/// `i` and its path sockets, which `poll` watches edge-triggered.
pub(super) fn recv_lane(shared: &Shared, i: usize, mut poll: Poll) {
    let mut events = Events::with_capacity(64);
    // what arrived before the thread started
    let mut readable = vec![i];
    while !shared.shutdown.load(Ordering::Acquire) {
        for &source in &readable {
            loop {
                // what is received is answered at once (`receive` sends and dispatches); the
                // timers it sets (an acknowledgement held back, a probe timeout) are the
                // driver thread's
                let (r, _) = shared.receive(source, false, None, true);
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
