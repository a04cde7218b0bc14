//! Readiness file descriptors: an `eventfd` per connection (and one for `accept`) that becomes
//! readable when the connection may have progressed, so an application's own event loop
//! (`poll`, `epoll`, mio, tokio) can wait for ri2n next to its other descriptors.
//!
//! The contract is edge-like and race-free: every non-blocking call (`try_read`, `try_write`,
//! `try_accept`, …) first clears the descriptor, then looks, both under the connection's
//! lock; whoever changes the connection signals it after the change: the UDP driver under
//! that lock whenever the engine reports anything, the TCP transport's link threads just
//! after they release it. So after a call returned `WouldBlock`, the descriptor becomes
//! readable as soon as retrying may succeed. A call signals its descriptors again for what
//! waits for callers of another kind, once per kind of call and signal of the connection's
//! own (`Watchers::signal_waiting`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

use ri2n_proto::Event;

/// One readiness descriptor.
#[derive(Debug)]
pub(crate) struct Readiness {
    fd: OwnedFd,
    /// The descriptor was signalled and not cleared since: spares a system call per event.
    signalled: AtomicBool,
}

impl Readiness {
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd(2) returns a new descriptor that we own, or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: `raw` is a valid descriptor owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
            signalled: AtomicBool::new(false),
        })
    }

    /// Makes the descriptor readable.
    pub fn signal(&self) {
        if !self.signalled.swap(true, Ordering::AcqRel) {
            let one = 1u64;
            // SAFETY: an 8-byte write from a live u64 to our eventfd; it only fails when the
            // counter would overflow, which leaves it readable anyway.
            unsafe {
                libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8);
            }
        }
    }

    /// Makes the descriptor not readable (until the next signal). The flag is lowered only
    /// after the descriptor was drained: a signal racing this call (its change made before
    /// the caller's look) then either finds the flag still up and is seen by that look, or
    /// writes again; lowering it first could leave it up over a drained descriptor, and
    /// every later signal would be skipped. Nothing to drain means a signal raised the flag
    /// and has yet to write (the TCP transport signals outside the lock): the flag stays up,
    /// so that the next call drains that write. Lowered, it would leave the descriptor
    /// readable for good, each call skipping the read, and a level-triggered loop spinning.
    pub fn clear(&self) {
        if self.signalled.load(Ordering::Acquire) {
            let mut count = 0u64;
            // SAFETY: an 8-byte read into a live u64 from our non-blocking eventfd.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
            if n == 8 {
                self.signalled.store(false, Ordering::Release);
            }
        }
    }
}

impl AsFd for Readiness {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Which calls a descriptor serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interest {
    /// Every non-blocking call: one event loop watching one descriptor per connection.
    Any,
    /// Reading calls (`try_read`, `try_recv_message`).
    Read,
    /// Writing calls (`try_write`, `try_send_message`).
    Write,
    /// The calls of one kind alone (reading stream bytes, messages or datagrams; writing
    /// stream bytes or messages): for callers of different kinds that wait apart (tasks of
    /// the tokio adapter, an asyncio transport beside message calls), none of which may
    /// clear a wake-up meant for another.
    Kind(Caller),
}

/// A connection's readiness descriptors, each made on first request. A reader and a writer
/// waiting apart (tokio's split halves) need one each: with a shared one, the reader's call
/// would clear a signal meant for the writer before the writer's event loop saw it.
#[derive(Debug)]
pub(crate) struct Watchers {
    any: OnceLock<Readiness>,
    read: OnceLock<Readiness>,
    write: OnceLock<Readiness>,
    /// [`Interest::Kind`]'s, by [`Caller`].
    kinds: [OnceLock<Readiness>; CALLERS],
    /// The event loop's token for the connection ([`NO_TOKEN`]: none), see
    /// `Connection::set_loop_token`.
    loop_token: AtomicU64,
    /// The kinds of call ([`Caller`], a bit each) that may signal the descriptors again for
    /// what waits for callers of another kind: all, after each signal of the connection's
    /// own; a kind's bit is lowered when such a call does ([`Watchers::signal_waiting`]).
    may_resignal: AtomicU8,
}

/// [`Watchers::loop_token`] unset.
const NO_TOKEN: u64 = u64::MAX;

/// Which non-blocking call looks: each kind signals the descriptors again for others at most
/// once per signal of the connection's own (see [`Watchers::signal_waiting`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    ReadStream,
    ReadMessage,
    ReadDatagram,
    WriteStream,
    WriteMessage,
}

impl Caller {
    /// The descriptors it clears (with the combined one).
    pub fn interest(self) -> Interest {
        match self {
            Caller::ReadStream | Caller::ReadMessage | Caller::ReadDatagram => Interest::Read,
            Caller::WriteStream | Caller::WriteMessage => Interest::Write,
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }

    fn reads(self) -> bool {
        self.interest() == Interest::Read
    }
}

/// How many kinds of [`Caller`] there are.
const CALLERS: usize = 5;

/// Every [`Caller`]'s bit.
const ALL_CALLERS: u8 = (1 << CALLERS) - 1;

/// Every [`Caller`], in the order of their numbers.
const EVERY_CALLER: [Caller; CALLERS] = [
    Caller::ReadStream,
    Caller::ReadMessage,
    Caller::ReadDatagram,
    Caller::WriteStream,
    Caller::WriteMessage,
];

impl Default for Watchers {
    fn default() -> Self {
        Self {
            any: OnceLock::new(),
            read: OnceLock::new(),
            write: OnceLock::new(),
            kinds: Default::default(),
            loop_token: AtomicU64::new(NO_TOKEN),
            may_resignal: AtomicU8::new(0),
        }
    }
}

impl Watchers {
    /// The token under which `Endpoint::wait_receiving` reports the connection readable.
    pub fn loop_token(&self) -> Option<u64> {
        Some(self.loop_token.load(Ordering::Relaxed)).filter(|&t| t != NO_TOKEN)
    }

    /// Sets it (`None`: unset; `u64::MAX` is taken as unset too).
    pub fn set_loop_token(&self, token: Option<u64>) {
        (self.loop_token).store(token.unwrap_or(NO_TOKEN), Ordering::Relaxed);
    }

    fn slot(&self, interest: Interest) -> &OnceLock<Readiness> {
        match interest {
            Interest::Any => &self.any,
            Interest::Read => &self.read,
            Interest::Write => &self.write,
            Interest::Kind(caller) => &self.kinds[caller as usize],
        }
    }

    /// The descriptor for `interest`, made (readable: something may be waiting already) if
    /// needed. Call with the engine's lock held, so no signal races its creation.
    pub fn fd(&self, interest: Interest) -> io::Result<BorrowedFd<'_>> {
        let slot = self.slot(interest);
        if slot.get().is_none() {
            let r = Readiness::new()?;
            r.signal();
            let _ = slot.set(r);
        }
        Ok(slot.get().expect("set above").as_fd())
    }

    /// The engine reported `event` for the connection.
    pub fn signal(&self, event: &Event) {
        let (read, write) = self.reported(event);
        self.raise(read, write);
    }

    /// The engine reported `event` for the connection, and the caller tells of it another
    /// way (`Endpoint::wait_receiving`'s tokens): later calls may still signal the
    /// descriptors for it once ([`Self::signal_waiting`]). Returns whom it concerns: readers,
    /// writers.
    pub fn reported(&self, event: &Event) -> (bool, bool) {
        self.may_resignal.store(ALL_CALLERS, Ordering::Release);
        match event {
            Event::Readable => (true, false),
            Event::Writable => (false, true),
            _ => (true, true),
        }
    }

    /// Something changed for readers and writers alike.
    pub fn signal_all(&self) {
        self.may_resignal.store(ALL_CALLERS, Ordering::Release);
        self.raise(true, true);
    }

    /// Makes the descriptors of readers (`read`: of every kind) and of writers (`write`: of
    /// every kind) readable, and the combined one.
    fn raise(&self, read: bool, write: bool) {
        self.raise_shared(read, write);
        for (caller, slot) in EVERY_CALLER.iter().zip(&self.kinds) {
            let wanted = if caller.reads() { read } else { write };
            if let Some(r) = slot.get().filter(|_| wanted) {
                r.signal();
            }
        }
    }

    /// [`Self::raise`] for the descriptors that calls of several kinds clear: the combined
    /// one, all readers' and all writers'.
    fn raise_shared(&self, read: bool, write: bool) {
        let slots = [(&self.any, true), (&self.read, read), (&self.write, write)];
        for (slot, wanted) in slots {
            if let Some(r) = slot.get().filter(|_| wanted) {
                r.signal();
            }
        }
    }

    /// Makes `interest`'s descriptor readable again, if it was made: for a caller that may
    /// have cleared a signal meant for others waiting on it (see `tokio::Watched`).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub fn signal_again(&self, interest: Interest) {
        if let Some(r) = self.slot(interest).get() {
            r.signal();
        }
    }

    /// A reading call of kind `caller` left more of its kind to read: that kind's own
    /// descriptor (the tokio adapter's, an asyncio transport's) is signalled again. The call
    /// cleared it, and a task waiting on it while another task made the call (a `try_` call
    /// the adapter does not count among its own) would sleep on with that data there. The
    /// shared descriptors keep their edges: an event loop reads them as it likes.
    pub fn signal_own_kind(&self, caller: Caller) {
        if let Some(r) = self.kinds[caller as usize].get() {
            r.signal();
        }
    }

    /// A non-blocking call of kind `caller` is about to look: it clears the descriptors it
    /// answers for (the combined one, its side's, and its own kind's).
    pub fn clear(&self, caller: Caller) {
        let own = &self.kinds[caller as usize];
        let slots = [&self.any, self.slot(caller.interest()), own];
        for r in slots.into_iter().filter_map(OnceLock::get) {
            r.clear();
        }
    }

    /// A non-blocking call cleared its descriptors: signals them again for what `waiting`
    /// says waits for callers of another kind. The connection signals an arrival, or room
    /// for a blocked writer, once; a call that looked for one thing must not hide another (a
    /// datagram looked for with stream bytes waiting, a reply written with a message
    /// waiting, a read or a message sent while the stream's writer may retry). Signalling,
    /// not merely leaving the descriptor set, gives an edge-triggered loop its edge.
    ///
    /// Each kind of call does so once per signal of the connection's own: a loop that waits
    /// for messages while stream bytes stay unread (nobody reads them, or not yet) is woken
    /// for them once, not again by each of its own looks, which would spin it until they are
    /// read; and a loop that makes calls of several kinds before it sleeps still finds the
    /// descriptor signalled by the last of them.
    pub fn signal_waiting(&self, caller: Caller, waiting: Waiting) {
        if !(waiting.readable || waiting.writer_may_retry) {
            return;
        }
        let bits = self.may_resignal.fetch_and(!caller.bit(), Ordering::AcqRel);
        // a kind's own descriptor is cleared by its own calls alone: nothing to give back
        if bits & caller.bit() != 0 {
            self.raise_shared(waiting.readable, waiting.writer_may_retry);
        }
    }
}

/// What a connection holds for callers other than the one that just looked (see
/// [`Watchers::signal_waiting`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Waiting {
    /// Data a read (of another kind, where the transport can tell) would return now.
    pub readable: bool,
    /// A writer (of another kind than the call, which retried for its own) that found the
    /// send buffer full may retry now, and has not.
    pub writer_may_retry: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(r: &Readiness) -> bool {
        let mut p = libc::pollfd {
            fd: r.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    /// A signal split by a clear: its flag raised before the clear, its write after. The
    /// next clear must still drain that write.
    #[test]
    fn a_signal_whose_write_lands_after_a_clear_is_drained_by_the_next() {
        let r = Readiness::new().unwrap();
        // the signal's first half
        assert!(!r.signalled.swap(true, Ordering::AcqRel));
        r.clear();
        assert!(!readable(&r));
        // its second half
        let one = 1u64;
        // SAFETY: an 8-byte write from a live u64 to the test's eventfd.
        unsafe { libc::write(r.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        assert!(readable(&r));
        r.clear();
        assert!(!readable(&r), "the late write is drained");
        // and signals go on as before
        r.signal();
        assert!(readable(&r));
        r.clear();
        assert!(!readable(&r));
    }
}
