//! One UDP socket per local address (so each link leaves through the address, and normally
//! the interface, it names), with batched receive (`recvmmsg`, GRO) and sends whose errors are
//! reported rather than swallowed, through `quinn-udp`; a single datagram can also be taken
//! alone with a plain `recvmsg` ([`Take::One`]), which quinn-udp does not offer on Linux.
//!
//! Beside it, a path in use gets a socket of its own, connected to the peer's address
//! ([`PathSocket`]): Linux looks up the route of every datagram sent from an unconnected
//! socket, and a connected one keeps its route, which a request-response exchange of single
//! datagrams feels in every round trip (docs/BENCHMARKS.md, summary of 2026-11-25 11:47).
//! Both sockets share the local address and port (`SO_REUSEPORT`, set on the link socket only
//! after its own bind, so another process still cannot bind that port unless it also runs as
//! this user and asks to share it), the peer sees one address as before, and Linux delivers
//! what that peer sends to the connected socket, what any other address sends to the link
//! socket.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use quinn_udp::{RecvMeta, Transmit, UdpSocketState, BATCH_SIZE};

use crate::impair::Impairment;
use crate::pages::PageBuffer;

/// Bytes of a refused datagram kept from the ICMP error's quote: enough for the header of
/// any ri2n packet that tells which connection and link sent it.
pub(crate) const QUOTE_LEN: usize = 24;
/// Refusals a socket keeps for the engine between two hand-overs: a flood of ICMP errors
/// cannot grow memory.
const MAX_REFUSALS: usize = 256;
/// Times a failed send is tried again after reading ICMP errors that were queued after it
/// (one read of the queue takes at most 256).
const SEND_TRIES: usize = 4;

/// An ICMP "port unreachable" about a datagram this socket sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refusal {
    /// Where the datagram was going.
    pub dest: SocketAddr,
    quote: [u8; QUOTE_LEN],
    quote_len: usize,
}

impl Refusal {
    /// The start of the refused datagram, as the ICMP error quotes it.
    pub fn quote(&self) -> &[u8] {
        &self.quote[..self.quote_len]
    }
}

/// Kernel socket buffers asked for: a few milliseconds of a fast link, so bursts between two
/// driver wake-ups are not dropped by the kernel.
const SOCKET_BUFFER: usize = 4 << 20;

/// What became of a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendOutcome {
    /// Handed to the kernel (or dropped by the impairment layer, like a lossy wire).
    Sent,
    /// The kernel's buffer is full (`EAGAIN`/`ENOBUFS`): the datagram is lost, like on a
    /// congested wire, and loss recovery repairs it.
    Congested,
    /// The path is unusable (`ENETUNREACH`, `EHOSTUNREACH`, `EADDRNOTAVAIL`, `ENETDOWN`, …):
    /// the link is down.
    Unreachable,
    /// The datagrams (of `size` bytes) are larger than the interface takes (`EMSGSIZE`): they
    /// will never leave at that size, so the engine must hear of it (see
    /// `ri2n_proto::Endpoint::handle_too_big`) rather than take them for lost.
    TooBig { size: usize },
}

/// A bound UDP socket of one local address.
#[derive(Debug)]
pub(crate) struct LinkSocket {
    pub local: SocketAddr,
    pub io: mio::net::UdpSocket,
    state: UdpSocketState,
    /// Datagrams one GSO send may carry; 1 once a batch showed that the path or device
    /// cannot segment ([`LinkSocket::own_failure`]). Ours, not quinn-udp's: that one halts
    /// for good at any `EINVAL`, which a route (a blackhole) gives as well.
    gso_segments: AtomicUsize,
    pub impairment: Arc<Impairment>,
    /// "Port unreachable" answers of peers' hosts (from the socket's error queue), not yet
    /// handed to the engine; at most [`MAX_REFUSALS`], further ones are dropped.
    refused: Mutex<Vec<Refusal>>,
    /// `refused` may hold something: spares its lock on every received batch.
    any_refused: AtomicBool,
    /// The interface of `local`, if it is known (not for a wildcard address).
    interface: Option<String>,
    /// That interface has carrier (see `carrier.rs`); without, nothing is sent.
    carrier: AtomicBool,
    /// The largest datagram that interface sends (its MTU less the headers; 0: not known),
    /// as last read: the engine is told when it changes.
    max_datagram: AtomicUsize,
    /// The sockets connected to one peer address each (see [`PathSocket`]): a few, searched
    /// in order (no hashing on every send). Held read while one of them is in use.
    paths: RwLock<Vec<PathSocket>>,
    /// The port may be shared with path sockets (`SO_REUSEPORT` was accepted).
    shareable: bool,
}

/// A socket connected to one peer address, on its link socket's address and port: single
/// datagrams to that peer leave through it without a route lookup each, and what that peer
/// sends arrives on it (Linux prefers a connected socket to an unconnected one of the same
/// port). The driver opens one for each path in use and closes it when the path is no longer
/// heard (see `driver/receive.rs`).
#[derive(Debug)]
pub(crate) struct PathSocket {
    /// Its number among the driver's path sockets (its epoll token follows from it).
    pub slot: usize,
    pub remote: SocketAddr,
    pub io: mio::net::UdpSocket,
    state: UdpSocketState,
}

impl LinkSocket {
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        let std = std::net::UdpSocket::bind(addr)?;
        // after the bind, so that the bind itself still fails on a port taken by anyone
        let shareable = socket2::SockRef::from(&std).set_reuse_port(true).is_ok();
        Self::bound(std, shareable, Arc::new(Impairment::default()))
    }

    /// Binds a socket on `first`'s address and port, for another shard of the same endpoint
    /// (see `shards.rs`): it joins the group of sockets sharing them (`SO_REUSEPORT`) after
    /// those bound before it, and shares `first`'s impairment switch.
    pub fn bind_beside(first: &LinkSocket) -> io::Result<Self> {
        use socket2::{Domain, Protocol, Socket, Type};
        let socket = Socket::new(
            Domain::for_address(first.local),
            Type::DGRAM,
            Some(Protocol::UDP),
        )?;
        if first.local.is_ipv6() {
            socket.set_only_v6(socket2::SockRef::from(&first.io).only_v6()?)?;
        }
        socket.set_reuse_port(true)?;
        socket.bind(&first.local.into())?;
        Self::bound(socket.into(), true, first.impairment.clone())
    }

    fn bound(
        std: std::net::UdpSocket,
        shareable: bool,
        impairment: Arc<Impairment>,
    ) -> io::Result<Self> {
        std.set_nonblocking(true)?;
        let state = set_up(&std)?;
        let local = std.local_addr()?;
        let interface = crate::carrier::interface_of(local);
        let carrier = interface.as_deref().is_none_or(crate::carrier::has_carrier);
        let max_datagram = (interface.as_deref())
            .and_then(|name| crate::carrier::max_datagram(local, name))
            .unwrap_or(0);
        Ok(Self {
            local,
            io: mio::net::UdpSocket::from_std(std),
            gso_segments: AtomicUsize::new(state.max_gso_segments()),
            state,
            impairment,
            refused: Mutex::new(Vec::new()),
            any_refused: AtomicBool::new(false),
            interface,
            carrier: AtomicBool::new(carrier),
            max_datagram: AtomicUsize::new(max_datagram),
            paths: RwLock::new(Vec::new()),
            shareable,
        })
    }

    /// Has the kernel hand each datagram arriving on this socket's address and port to the
    /// socket of the shard its connection ID belongs to, of `shards` (socket `i` of the group
    /// sharing them belongs to shard `i`: the shards bind in order, before any path socket):
    /// a classic BPF program for the group (`SO_ATTACH_REUSEPORT_CBPF`), which reads the
    /// upper 32 bits of the ID at [`wire::CID_OFFSET`] of the UDP payload
    /// ([`ri2n_proto::Shard::of`]). A RESET, which may carry either side's ID, and anything
    /// not of this version are left to the kernel's hash of the addresses; the shards forward
    /// among themselves what lands on the wrong one.
    ///
    /// [`wire::CID_OFFSET`]: ri2n_proto::wire::CID_OFFSET
    #[cfg(target_os = "linux")]
    pub fn steer_by_connection_id(&self, shards: u32) -> io::Result<()> {
        use libc::{BPF_A, BPF_ABS, BPF_ALU, BPF_B, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_MOD};
        use libc::{BPF_RET, BPF_W};
        use ri2n_proto::wire::{packet_type, CID_OFFSET, VERSION};
        let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
            code: code as u16,
            jt,
            jf,
            k,
        };
        // offsets count from the start of the UDP payload here; a jump skips that many
        // instructions forward; an index beyond the group makes the kernel use its hash
        let program = [
            op(BPF_LD | BPF_B | BPF_ABS, 0, 0, 0),
            op(BPF_JMP | BPF_JEQ | BPF_K, 0, 5, u32::from(VERSION)),
            op(BPF_LD | BPF_B | BPF_ABS, 0, 0, 1),
            op(
                BPF_JMP | BPF_JEQ | BPF_K,
                3,
                0,
                u32::from(packet_type::RESET),
            ),
            op(BPF_LD | BPF_W | BPF_ABS, 0, 0, CID_OFFSET as u32),
            op(BPF_ALU | BPF_MOD | BPF_K, 0, 0, shards),
            op(BPF_RET | BPF_A, 0, 0, 0),
            op(BPF_RET | BPF_K, 0, 0, u32::MAX),
        ];
        let prog = libc::sock_fprog {
            len: program.len() as u16,
            filter: program.as_ptr().cast_mut(),
        };
        // SAFETY: the socket is open; `prog` points at `program`, which outlives the call
        // (the kernel copies it), and its size is that of a sock_fprog.
        let rc = unsafe {
            libc::setsockopt(
                self.io.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_REUSEPORT_CBPF,
                (&prog as *const libc::sock_fprog).cast(),
                std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    pub fn steer_by_connection_id(&self, _shards: u32) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }

    /// Opens a socket connected to `remote` on this socket's address and port, numbered
    /// `slot`, for [`add_path`](Self::add_path).
    pub fn open_path(&self, slot: usize, remote: SocketAddr) -> io::Result<PathSocket> {
        if !self.shareable {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the link socket's port cannot be shared",
            ));
        }
        use socket2::{Domain, Protocol, Socket, Type};
        let socket = Socket::new(
            Domain::for_address(self.local),
            Type::DGRAM,
            Some(Protocol::UDP),
        )?;
        // Descriptors are handed out lowest first: a high one means the process holds many.
        // A path socket only saves time, so it never takes the last quarter of them from
        // the application.
        let limit = rlimit_nofile();
        if descriptors_running_low(socket.as_raw_fd(), limit) {
            return Err(io::Error::other(format!(
                "file descriptors running low ({} of {limit} in use)",
                socket.as_raw_fd()
            )));
        }
        if self.local.is_ipv6() {
            // as the link socket: a dual-stack one also talks to IPv4-mapped peers
            socket.set_only_v6(socket2::SockRef::from(&self.io).only_v6()?)?;
        }
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&self.local.into())?;
        socket.connect(&remote.into())?;
        let std: std::net::UdpSocket = socket.into();
        let state = set_up(&std)?;
        Ok(PathSocket {
            slot,
            remote,
            io: mio::net::UdpSocket::from_std(std),
            state,
        })
    }

    /// Sends to `path.remote` through `path` from now on (and receives through it what that
    /// peer sends); returns its descriptor, for the driver to watch.
    pub fn add_path(&self, path: PathSocket) -> RawFd {
        let fd = path.io.as_raw_fd();
        self.write_paths().push(path);
        fd
    }

    /// Closes the path sockets of the peer addresses `keep` rejects (datagrams to them leave
    /// through this socket again), calling `closing` with the slot and descriptor of each
    /// just before, for the driver to stop watching it.
    pub fn close_paths(
        &self,
        mut keep: impl FnMut(SocketAddr) -> bool,
        mut closing: impl FnMut(usize, RawFd),
    ) {
        self.write_paths().retain(|p| {
            let kept = keep(p.remote);
            if !kept {
                closing(p.slot, p.io.as_raw_fd());
            }
            kept
        });
    }

    /// Whether datagrams to `remote` leave through a path socket.
    pub fn has_path(&self, remote: SocketAddr) -> bool {
        self.read_paths().iter().any(|p| p.remote == remote)
    }

    /// The slots and descriptors of the path sockets.
    pub fn path_fds(&self) -> Vec<(usize, RawFd)> {
        self.read_paths()
            .iter()
            .map(|p| (p.slot, p.io.as_raw_fd()))
            .collect()
    }

    fn read_paths(&self) -> std::sync::RwLockReadGuard<'_, Vec<PathSocket>> {
        self.paths.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_paths(&self) -> std::sync::RwLockWriteGuard<'_, Vec<PathSocket>> {
        self.paths.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Most datagrams one GSO send may carry on this socket (1 without GSO).
    pub fn max_segments(&self) -> usize {
        self.gso_segments.load(Ordering::Relaxed).max(1)
    }

    /// Sends `data` to `remote`: one datagram, or with `segment` several of that size (the
    /// last may be shorter) in one system call (GSO).
    pub fn send(&self, remote: SocketAddr, data: &[u8], segment: Option<usize>) -> SendOutcome {
        if !self.carrier.load(Ordering::Relaxed) {
            // see carrier.rs: sent now, it would only start an address resolution that
            // delays the first datagrams after the cable is back
            return SendOutcome::Unreachable;
        }
        if self.impairment.is_impaired() {
            // the impairment layer judges datagram by datagram; the batch's outcome is its
            // first failure, as for a batch sent one by one
            let seg = segment.unwrap_or(data.len()).max(1);
            let mut outcome = SendOutcome::Sent;
            for d in data.chunks(seg) {
                if self.impairment.admit_send(d.len()) {
                    let o = self.send_raw(remote, d, None);
                    if outcome == SendOutcome::Sent {
                        outcome = o;
                    }
                }
            }
            return outcome;
        }
        self.send_raw(remote, data, segment)
    }

    /// Sends the bytes of `parts`, back to back, to `remote` as datagrams of `segment` bytes
    /// (the last may be shorter) in one GSO system call that gathers them where they are.
    /// `None` where it did not send them (impairment set, or an error other than a full
    /// buffer): [`send`](Self::send) of the same bytes in one buffer then does what it does
    /// for those.
    pub fn send_gathered(
        &self,
        remote: SocketAddr,
        parts: &[IoSlice<'_>],
        segment: usize,
    ) -> Option<SendOutcome> {
        if !self.carrier.load(Ordering::Relaxed) || self.impairment.is_impaired() {
            return None;
        }
        let segment = u16::try_from(segment).ok()?;
        loop {
            match sendmsg_gso(self.io.as_raw_fd(), remote, parts, segment) {
                Ok(_) => return Some(SendOutcome::Sent),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // a full buffer or interface queue: lost, as a copy would be
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.raw_os_error() == Some(libc::ENOBUFS) =>
                {
                    return Some(classify_send_error(&e, segment.into()))
                }
                Err(_) => return None,
            }
        }
    }

    fn send_raw(&self, remote: SocketAddr, data: &[u8], segment: Option<usize>) -> SendOutcome {
        let size = segment.unwrap_or(data.len());
        match self.send_once(remote, data, segment) {
            Ok(()) => SendOutcome::Sent,
            // a full socket or device queue is the sender's own: no ICMP error is behind it
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.raw_os_error() == Some(libc::ENOBUFS) =>
            {
                classify_send_error(&e, size)
            }
            // An ICMP message about an earlier datagram (to any destination, and perhaps
            // forged: ICMP is not authenticated) leaves an error that fails the socket's next
            // send once, whatever it sends. So the send is tried again at once (the queue is
            // read first, for its "port unreachable" reports; another thread may have read it
            // already), and a later failure is its own only when no ICMP error waited in the
            // queue after it: a forged "host unreachable" must not take a link down, however
            // many are queued.
            Err(mut failure) => {
                for attempt in 0..SEND_TRIES {
                    if self.take_errors() == 0 && attempt > 0 {
                        return self.own_failure(remote, data, segment, &failure);
                    }
                    match self.send_once(remote, data, segment) {
                        Ok(()) => return SendOutcome::Sent,
                        Err(e) => failure = e,
                    }
                }
                // ICMP errors keep coming (a flood, perhaps forged): the datagram is lost, and
                // loss detection judges the link, not an error that may not be its own
                SendOutcome::Congested
            }
        }
    }

    /// The outcome of a send that failed on its own account with `failure`. A batch the
    /// kernel would not segment (`EIO`, `EINVAL`: a device or path without the offload;
    /// `EMSGSIZE`: a segment larger than the path takes, perhaps a path MTU probe batched
    /// with smaller datagrams) leaves one datagram at a time, each a send of its own; the
    /// batch's outcome is its first failure. If they leave where the batch could not (`EIO`,
    /// `EINVAL`), the socket sends no more batches; if they fail too, the batch was not the
    /// cause (a blackhole route refuses every send with `EINVAL`), and batches go on once
    /// the route is back.
    fn own_failure(
        &self,
        remote: SocketAddr,
        data: &[u8],
        segment: Option<usize>,
        failure: &io::Error,
    ) -> SendOutcome {
        const NOT_SEGMENTED: [i32; 3] = [libc::EIO, libc::EINVAL, libc::EMSGSIZE];
        let errno = failure.raw_os_error();
        match segment.filter(|&s| s < data.len()) {
            Some(seg) if errno.is_some_and(|e| NOT_SEGMENTED.contains(&e)) => {
                let outcome = (data.chunks(seg.max(1)))
                    .map(|d| self.send_raw(remote, d, None))
                    .fold(SendOutcome::Sent, |first, o| match first {
                        SendOutcome::Sent => o,
                        failed => failed,
                    });
                let offload_refused = outcome == SendOutcome::Sent && errno != Some(libc::EMSGSIZE);
                if offload_refused && self.gso_segments.swap(1, Ordering::Relaxed) > 1 {
                    tracing::info!(local = %self.local, error = %failure,
                        "segmentation offload refused: sending datagrams one at a time");
                }
                outcome
            }
            _ => classify_send_error(failure, segment.unwrap_or(data.len())),
        }
    }

    /// One system call: a GSO batch through quinn-udp, a single datagram as a plain `sendto`
    /// (quinn-udp attaches a control message with the ECN bits to every send, which ri2n
    /// leaves at zero: the kernel parsed it for every message of a request-response exchange).
    fn send_once(&self, remote: SocketAddr, data: &[u8], segment: Option<usize>) -> io::Result<()> {
        let Some(segment) = segment.filter(|&s| s < data.len()) else {
            let paths = self.read_paths();
            let path = paths.iter().find(|p| p.remote == remote);
            loop {
                let sent = match path {
                    Some(p) => p.io.send(data),
                    None => self.io.send_to(data, remote),
                };
                match sent {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    r => return r.map(drop),
                }
            }
        };
        // A GSO batch still leaves through the link socket: its route lookup is shared by
        // the whole batch, and the peer sees the same address and port either way.
        let transmit = Transmit {
            destination: remote,
            ecn: None,
            contents: data,
            segment_size: Some(segment),
            src_ip: None,
        };
        self.state.try_send((&self.io).into(), &transmit)
    }

    /// Tells the OS that the next hop towards `remote` is alive, without sending anything
    /// (Linux: a zero-length `sendto` with `MSG_CONFIRM | MSG_PROBE`, which confirms the
    /// neighbour entry of the route's next hop).
    ///
    /// Why: UDP never confirms neighbours by itself. A few seconds into an outage Linux then
    /// probes the peer's link-layer address, fails, and from then on resolves it anew with
    /// one request a second, so after the heal nothing leaves for up to a second. Kept
    /// confirmed, the entry stays usable (the peer's address does not change when a switch
    /// dies or a cable is pulled) and the first probe after the heal gets through.
    pub fn confirm_next_hop(&self, remote: SocketAddr) {
        if !self.carrier.load(Ordering::Relaxed) {
            return;
        }
        // MSG_PROBE ("do not send, only probe the path", include/linux/socket.h) is not in libc
        const MSG_PROBE: libc::c_int = 0x10;
        let flags = libc::MSG_CONFIRM | MSG_PROBE;
        let _ = socket2::SockRef::from(&self.io).send_to_with_flags(
            &[],
            &socket2::SockAddr::from(remote),
            flags,
        );
    }

    /// Reads the carrier of this socket's interface again (after a link change).
    pub fn refresh_carrier(&self) {
        if let Some(name) = &self.interface {
            let up = crate::carrier::has_carrier(name);
            if self.carrier.swap(up, Ordering::Relaxed) != up {
                tracing::debug!(local = %self.local, interface = %name, carrier = up, "carrier changed");
            }
        }
    }

    /// The largest datagram this socket's interface sends (its MTU less the IP and UDP
    /// headers), as last read, if the system tells.
    pub fn max_datagram(&self) -> Option<usize> {
        Some(self.max_datagram.load(Ordering::Relaxed)).filter(|&m| m > 0)
    }

    /// Reads the MTU of this socket's interface again (after a link change): the largest
    /// datagram it sends now (`None`: not known), if that changed since the last reading.
    pub fn refresh_max_datagram(&self) -> Option<Option<usize>> {
        let name = self.interface.as_deref()?;
        let now = crate::carrier::max_datagram(self.local, name);
        let before = self.max_datagram.swap(now.unwrap_or(0), Ordering::Relaxed);
        (before != now.unwrap_or(0)).then_some(now)
    }

    /// Takes the interface as having carrier from now on (its changes cannot be followed).
    pub fn assume_carrier(&self) {
        self.carrier.store(true, Ordering::Relaxed);
    }

    /// "Port unreachable" answers received since the last call.
    pub fn take_refused(&self) -> Vec<Refusal> {
        // a load first: the swap would write the flag's cache line on every received batch
        if !self.any_refused.load(Ordering::Acquire)
            || !self.any_refused.swap(false, Ordering::AcqRel)
        {
            return Vec::new();
        }
        std::mem::take(&mut *self.refused.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Reads the socket's error queue (ICMP errors about datagrams sent earlier), keeping the
    /// destinations reported as "port unreachable"; returns how many of the entries it read
    /// came from ICMP (others are the socket's own, such as a local "message too long").
    pub fn take_errors(&self) -> usize {
        let mut n = self.take_errors_of(self.io.as_raw_fd());
        // a connected socket also fails its next send or receive with the error (ECONNREFUSED)
        for p in self.read_paths().iter() {
            n += self.take_errors_of(p.io.as_raw_fd());
        }
        n
    }

    /// Reads the error queue of socket `fd` (this one or one of its path sockets).
    fn take_errors_of(&self, fd: std::os::fd::RawFd) -> usize {
        let mut n = 0;
        // bounded: the queue is charged to the receive buffer, a flood cannot hold us here
        while n < 256 {
            match read_queued_error(fd) {
                Ok(Some(QueuedError {
                    refusal,
                    from_icmp,
                    port_unreachable,
                })) => {
                    n += usize::from(from_icmp);
                    if port_unreachable {
                        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
                        if refused.len() < MAX_REFUSALS {
                            refused.push(refusal);
                        }
                        self.any_refused.store(true, Ordering::Release);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "reading the socket error queue failed");
                    break;
                }
            }
        }
        n
    }

    /// Receives into `batch` (one `recvmmsg` for a [`Take::Batch`], whose GRO buffers hold
    /// several datagrams each; one `recvmsg` for [`Take::One`]). Needs no engine state, so it
    /// runs without the engine's lock.
    pub fn recv(&self, batch: &mut RecvBatch, take: Take) -> io::Result<Received> {
        self.recv_on(&self.io, &self.state, batch, take)
    }

    /// Receives from the path socket numbered `slot`, as [`recv`](Self::recv) does from this
    /// one; `None` if this socket has no such path socket (closed meanwhile).
    pub fn recv_path(
        &self,
        slot: usize,
        batch: &mut RecvBatch,
        take: Take,
    ) -> Option<io::Result<Received>> {
        let paths = self.read_paths();
        let path = paths.iter().find(|p| p.slot == slot)?;
        Some(self.recv_on(&path.io, &path.state, batch, take))
    }

    fn recv_on(
        &self,
        io: &mio::net::UdpSocket,
        state: &UdpSocketState,
        batch: &mut RecvBatch,
        take: Take,
    ) -> io::Result<Received> {
        let mut result = batch.receive(io, state, take);
        let failed = result
            .as_ref()
            .is_err_and(|e| e.kind() != io::ErrorKind::WouldBlock);
        if failed {
            // the socket's pending error, an ICMP message's: the call returned it instead of
            // the datagrams, which still wait. Its entry in the error queue, if any (none
            // when the receive queue is full: the error queue is charged to the same
            // buffer), tells whom it was about. The failed call took the error: try again
            // whatever the queue held, or a full socket watched edge-triggered is never
            // read again (datagrams dropped on a full queue wake nobody)
            self.take_errors_of(io.as_raw_fd());
            result = batch.receive(io, state, take);
        }
        batch.count = match result {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e),
        };
        Ok(match (batch.count, take) {
            (0, _) => Received::Nothing,
            (_, Take::One) => Received::Unchecked,
            // fewer than asked for: the socket's queue was empty when the call returned
            (n, Take::Batch) if n < BATCH_SIZE => Received::Drained,
            (_, Take::Batch) => Received::MoreMayWait,
        })
    }

    /// Calls `f(n, remote, datagram)` for each datagram of the batch last received, `n` its
    /// position in the batch ([`RecvBatch::for_each_datagram`]); the impairment layer may
    /// drop some.
    pub fn deliver(&self, batch: &mut RecvBatch, f: &mut dyn FnMut(usize, SocketAddr, &mut [u8])) {
        batch.for_each_datagram(&mut |n, remote, d| {
            if self.impairment.admit_recv() {
                f(n, remote, d);
            }
        });
    }
}

/// What every socket ri2n receives on gets: quinn-udp's state (GSO, GRO), large buffers,
/// ICMP errors queued, and no ancillary data it does not use.
fn set_up(socket: &std::net::UdpSocket) -> io::Result<UdpSocketState> {
    let state = UdpSocketState::new(socket.into())?;
    // best effort: a smaller buffer still works, just drops more under bursts
    let _ = state.set_send_buffer_size(socket.into(), SOCKET_BUFFER);
    let _ = state.set_recv_buffer_size(socket.into(), SOCKET_BUFFER);
    // ICMP errors about our datagrams are queued (IP_RECVERR): "port unreachable" from the
    // peer's host tells that the peer process is gone, not the network
    let _ = state.enable_transport_errors(socket.into());
    decline_unused_ancillary_data(socket);
    admit_only_ri2n(socket);
    Ok(state)
}

/// Has the kernel drop, before they are queued, datagrams that cannot be ri2n packets of this
/// version: a classic BPF socket filter that looks at the first two bytes of the UDP payload
/// (version and packet type). Junk sent to our ports then costs neither a copy to user space
/// nor a wake-up, and takes no room in the socket buffer from real packets
/// (docs/PROTOCOL.md §11.1). Best effort: without it the engine drops such datagrams itself.
#[cfg(target_os = "linux")]
fn admit_only_ri2n(socket: &std::net::UdpSocket) {
    use libc::{BPF_ABS, BPF_B, BPF_JEQ, BPF_JGE, BPF_JGT, BPF_JMP, BPF_K, BPF_LD, BPF_LEN};
    use ri2n_proto::wire::{packet_type as t, VERSION};
    use socket2::SockFilter;
    const LD_LEN: u16 = (BPF_LD | BPF_LEN) as u16;
    const LD_BYTE: u16 = (BPF_LD | BPF_B | BPF_ABS) as u16;
    const JEQ: u16 = (BPF_JMP | BPF_JEQ | BPF_K) as u16;
    const JGE: u16 = (BPF_JMP | BPF_JGE | BPF_K) as u16;
    const JGT: u16 = (BPF_JMP | BPF_JGT | BPF_K) as u16;
    const RET: u16 = (libc::BPF_RET | BPF_K) as u16;
    // The filter sees the datagram from its UDP header on (8 bytes): the payload's version
    // byte is at offset 8, its type at 9. A jump skips that many instructions forward.
    let program = [
        SockFilter::new(LD_LEN, 0, 0, 0),
        SockFilter::new(JGE, 0, 8, 10), // shorter than the header and 2 bytes: drop
        SockFilter::new(LD_BYTE, 0, 0, 8),
        SockFilter::new(JEQ, 0, 6, u32::from(VERSION)), // another version: drop
        SockFilter::new(LD_BYTE, 0, 0, 9),
        SockFilter::new(JEQ, 3, 0, u32::from(t::SHORT)),
        SockFilter::new(JEQ, 2, 0, u32::from(t::SHORT_PHASE1)),
        SockFilter::new(JGE, 0, 2, u32::from(t::INITIAL)), // below the handshake types: drop
        SockFilter::new(JGT, 1, 0, u32::from(t::REFUSE)),  // above them: drop
        SockFilter::new(RET, 0, 0, u32::MAX),              // accept, whole
        SockFilter::new(RET, 0, 0, 0),                     // drop
    ];
    if let Err(e) = socket2::SockRef::from(socket).attach_filter(&program) {
        tracing::debug!(error = %e, "no socket filter: the engine drops junk itself");
    }
}

#[cfg(not(target_os = "linux"))]
fn admit_only_ri2n(_: &std::net::UdpSocket) {}

/// Whether descriptor `fd`, just handed out, lies in the last quarter of `limit`.
fn descriptors_running_low(fd: RawFd, limit: u64) -> bool {
    u64::try_from(fd).is_ok_and(|fd| fd >= limit / 4 * 3)
}

/// The process's soft limit of open file descriptors (1024, Linux's usual default, if unknown).
fn rlimit_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `lim`, which outlives the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    #[allow(clippy::unnecessary_cast)] // rlim_t is narrower on some 32-bit targets
    let soft = lim.rlim_cur as u64;
    soft
}

/// Turns off the ancillary data quinn-udp asks the kernel for on every received datagram and
/// ri2n does not use: the ECN bits (ri2n does not use ECN), the destination address (each
/// socket is bound to one address) and the receive time. Each was a control message the kernel
/// built and copied out per receive call, and a receive timestamp asked for by any socket makes
/// the kernel stamp every packet the host receives. Best effort: with them on, ri2n only pays.
fn decline_unused_ancillary_data(socket: &std::net::UdpSocket) {
    // an IPv6 socket gets the IPv4 ones too (for IPv4-mapped peers); where an option does not
    // apply, turning it off fails harmlessly
    let options = [
        (libc::SOL_SOCKET, libc::SO_TIMESTAMPNS),
        (libc::IPPROTO_IP, libc::IP_RECVTOS),
        (libc::IPPROTO_IP, libc::IP_PKTINFO),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO),
    ];
    let off: libc::c_int = 0;
    for (level, name) in options {
        // SAFETY: the socket is open and `off` is a c_int that outlives the call.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                level,
                name,
                (&off as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

/// What a receive call found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Received {
    /// Nothing was waiting.
    Nothing,
    /// A batch, and the queue was empty after it: no need to ask again until the next arrival.
    Drained,
    /// A full batch: more may be waiting.
    MoreMayWait,
    /// One datagram, taken alone ([`Take::One`]): whether more wait was not asked.
    Unchecked,
    /// Another thread holds the receive buffers; it receives from this socket too before it
    /// lets them go.
    TurnedAway,
}

/// How much one receive call takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Take {
    /// Up to `BATCH_SIZE` buffers (`recvmmsg`). Fewer than that tell that the queue was empty.
    Batch,
    /// One buffer (`recvmsg`); whether more wait is not asked. Cheaper for one datagram: a
    /// `recvmmsg` of up to 32 costs more in itself, and its second try finds the queue empty
    /// (`bench/udp_pingpong_floor.c`, patterns `ri2n-single-connected` and `ri2n-connected`;
    /// docs/BENCHMARKS.md, summary of 2026-11-25 16:37).
    One,
}

/// The buffers for receiving a batch of datagrams from any of the sockets.
#[derive(Debug)]
pub(crate) struct RecvBatch {
    /// `BATCH_SIZE` buffers of `slot` bytes, one after the other.
    buf: PageBuffer,
    slot: usize,
    meta: [RecvMeta; BATCH_SIZE],
    count: usize,
}

impl RecvBatch {
    /// Calls `f(n, remote, datagram)` for each datagram of the batch last received, in the
    /// order they arrived, `n` counting from 0 (GRO buffers are split at their stride).
    pub fn for_each_datagram(&mut self, f: &mut dyn FnMut(usize, SocketAddr, &mut [u8])) {
        let bufs = self.buf.chunks_mut(self.slot);
        let mut n = 0;
        for (m, buf) in self.meta.iter().zip(bufs).take(self.count) {
            let stride = m.stride.max(1);
            for d in buf[..m.len].chunks_mut(stride) {
                f(n, m.addr, d);
                n += 1;
            }
        }
    }

    /// Whether the last receive brought exactly one datagram (one buffer, not a GRO one).
    pub fn one_datagram(&self) -> bool {
        self.count == 1 && self.meta[0].len <= self.meta[0].stride
    }

    /// One system call on `io`; the number of buffers filled.
    fn receive(
        &mut self,
        io: &mio::net::UdpSocket,
        state: &UdpSocketState,
        take: Take,
    ) -> io::Result<usize> {
        match take {
            Take::One => recv_one(
                io.as_raw_fd(),
                &mut self.buf[..self.slot],
                &mut self.meta[0],
            )
            .map(|()| 1),
            Take::Batch => {
                let mut slices: [IoSliceMut<'_>; BATCH_SIZE] = {
                    let mut bufs = self.buf.chunks_mut(self.slot);
                    std::array::from_fn(|_| {
                        IoSliceMut::new(bufs.next().expect("BATCH_SIZE buffers"))
                    })
                };
                state.recv(io.into(), &mut slices, &mut self.meta)
            }
        }
    }

    /// Buffers sized for the largest GRO of `sockets`, each starting on a page.
    pub fn for_sockets(sockets: &[LinkSocket]) -> io::Result<Self> {
        let segments = sockets.iter().map(|s| s.state.gro_segments()).max();
        let slot = (1500 * segments.unwrap_or(1).max(1))
            .max(65536)
            .next_multiple_of(crate::pages::page_size());
        Ok(Self {
            buf: PageBuffer::new(slot * BATCH_SIZE)?,
            slot,
            meta: [RecvMeta::default(); BATCH_SIZE],
            count: 0,
        })
    }
}

/// What a failed send of datagrams of `size` bytes means for the link.
fn classify_send_error(e: &io::Error, size: usize) -> SendOutcome {
    const UNREACHABLE: [i32; 5] = [
        libc::ENETUNREACH,
        libc::EHOSTUNREACH,
        libc::EADDRNOTAVAIL,
        libc::ENETDOWN,
        libc::EHOSTDOWN,
    ];
    match e.raw_os_error() {
        Some(code) if UNREACHABLE.contains(&code) => SendOutcome::Unreachable,
        Some(libc::EMSGSIZE) => SendOutcome::TooBig { size },
        _ if e.kind() == io::ErrorKind::WouldBlock => SendOutcome::Congested,
        Some(libc::ENOBUFS) => SendOutcome::Congested,
        _ => {
            tracing::debug!(error = %e, "send failed");
            SendOutcome::Congested
        }
    }
}

/// One entry of a socket's error queue.
struct QueuedError {
    /// Where the datagram that caused it was going, and what the error quotes of it.
    refusal: Refusal,
    /// An ICMP message reported it (not the socket itself).
    from_icmp: bool,
    /// ICMP "port unreachable" (IPv4 type 3 code 3, IPv6 type 1 code 4).
    port_unreachable: bool,
}

/// Reads one entry of the error queue of `fd` (`MSG_ERRQUEUE`); `None` when it is empty.
/// `quinn-udp` reads this queue too, but reports the ICMP sender, not the destination and
/// port of the datagram, which is what tells one connection's peer from another's.
fn read_queued_error(fd: std::os::fd::RawFd) -> io::Result<Option<QueuedError>> {
    const ICMP_DEST_UNREACH: u8 = 3;
    const ICMP_PORT_UNREACH: u8 = 3;
    const ICMPV6_DEST_UNREACH: u8 = 1;
    const ICMPV6_PORT_UNREACH: u8 = 4;
    let mut quote = [0u8; QUOTE_LEN];
    let mut control = [0u64; 64];
    let (mut from_icmp, mut port_unreachable) = (false, false);
    let received = recvmsg_with_control(
        fd,
        &mut quote,
        &mut control,
        libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
        |level, kind, data| {
            let is_err = (level == libc::SOL_IP && kind == libc::IP_RECVERR)
                || (level == libc::SOL_IPV6 && kind == libc::IPV6_RECVERR);
            if !is_err || data.len() < std::mem::size_of::<libc::sock_extended_err>() {
                return;
            }
            // SAFETY: the kernel wrote a sock_extended_err here (its length was checked)
            let ee: libc::sock_extended_err =
                unsafe { std::ptr::read_unaligned(data.as_ptr().cast()) };
            from_icmp |= matches!(
                ee.ee_origin,
                libc::SO_EE_ORIGIN_ICMP | libc::SO_EE_ORIGIN_ICMP6
            );
            port_unreachable |= (ee.ee_origin == libc::SO_EE_ORIGIN_ICMP
                && ee.ee_type == ICMP_DEST_UNREACH
                && ee.ee_code == ICMP_PORT_UNREACH)
                || (ee.ee_origin == libc::SO_EE_ORIGIN_ICMP6
                    && ee.ee_type == ICMPV6_DEST_UNREACH
                    && ee.ee_code == ICMPV6_PORT_UNREACH);
        },
    );
    // the data read is the start of the refused datagram's payload, as the ICMP error quotes
    // it (the kernel matched the quoted addresses and ports to this socket)
    let (quote_len, name) = match received {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
        Err(e) => return Err(e),
    };
    let dest = sockaddr_to_std(&name);
    Ok(Some(QueuedError {
        refusal: Refusal {
            dest: dest.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
            quote,
            quote_len: quote_len.min(QUOTE_LEN),
        },
        from_icmp,
        port_unreachable: port_unreachable && dest.is_some(),
    }))
}

/// One `sendmsg(2)` on `fd` of the bytes of `parts`, back to back, to `remote`, which the
/// kernel sends as datagrams of `segment` bytes, the last perhaps shorter (UDP GSO: a
/// `UDP_SEGMENT` control message). quinn-udp's GSO sends take the bytes from one buffer.
fn sendmsg_gso(
    fd: RawFd,
    remote: SocketAddr,
    parts: &[IoSlice<'_>],
    segment: u16,
) -> io::Result<usize> {
    let name = socket2::SockAddr::from(remote);
    let mut control = [0u64; 4];
    // Safety: sendmsg(2) only reads the address, the buffers (an `IoSlice` is an `iovec` on
    // Unix) and the control buffer, all alive for the call and sized as the header says; the
    // one control message is written through the CMSG_* macros, which keep it within
    // `msg_controllen` (CMSG_SPACE(2) <= 32 bytes).
    unsafe {
        let mut hdr: libc::msghdr = std::mem::zeroed();
        hdr.msg_name = name.as_ptr() as *mut libc::c_void;
        hdr.msg_namelen = name.len();
        hdr.msg_iov = parts.as_ptr() as *mut libc::iovec;
        hdr.msg_iovlen = parts.len() as _;
        hdr.msg_control = control.as_mut_ptr().cast();
        hdr.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) as _;
        let cmsg = libc::CMSG_FIRSTHDR(&hdr);
        (*cmsg).cmsg_level = libc::SOL_UDP;
        (*cmsg).cmsg_type = libc::UDP_SEGMENT;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), segment);
        let n = libc::sendmsg(fd, &hdr, 0);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

/// One `recvmsg(2)` on `fd` into `buf`, with room for the sender's address and `control` for
/// control messages; calls `on_message(level, type, data)` for each control message. The byte
/// count and the address.
fn recvmsg_with_control(
    fd: RawFd,
    buf: &mut [u8],
    control: &mut [u64],
    flags: libc::c_int,
    mut on_message: impl FnMut(libc::c_int, libc::c_int, &[u8]),
) -> io::Result<(usize, libc::sockaddr_storage)> {
    // Safety: plain recvmsg(2) into buffers owned here, sized as the header says; the control
    // messages are read through the CMSG_* macros within `msg_controllen`, each no further
    // than its own `cmsg_len`.
    unsafe {
        let mut name: libc::sockaddr_storage = std::mem::zeroed();
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut hdr: libc::msghdr = std::mem::zeroed();
        hdr.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
        hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = control.as_mut_ptr().cast();
        hdr.msg_controllen = std::mem::size_of_val(control) as _;
        let n = libc::recvmsg(fd, &mut hdr, flags);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut cmsg = libc::CMSG_FIRSTHDR(&hdr);
        while !cmsg.is_null() {
            let c = &*cmsg;
            let header = libc::CMSG_LEN(0) as usize;
            let len = (c.cmsg_len as usize).saturating_sub(header);
            let data = std::slice::from_raw_parts(libc::CMSG_DATA(cmsg), len);
            on_message(c.cmsg_level, c.cmsg_type, data);
            cmsg = libc::CMSG_NXTHDR(&hdr, cmsg);
        }
        Ok((n as usize, name))
    }
}

/// One datagram (or one GRO buffer) from `fd` into `buf`, with one `recvmsg`: quinn-udp
/// receives with `recvmmsg` only, which costs more for a single datagram (see [`Take::One`]).
/// Fills the address, length and segment size of `meta`, as quinn-udp does; ri2n declines
/// the other ancillary data (see [`decline_unused_ancillary_data`]).
fn recv_one(fd: RawFd, buf: &mut [u8], meta: &mut RecvMeta) -> io::Result<()> {
    let mut control = [0u64; 8];
    // a GRO buffer says its segment size; a single datagram is its own
    let mut segment = None;
    let (len, name) = recvmsg_with_control(fd, buf, &mut control, 0, |level, kind, data| {
        if level == libc::SOL_UDP && kind == libc::UDP_GRO {
            if let Some(bytes) = data.first_chunk::<4>() {
                segment = usize::try_from(libc::c_int::from_ne_bytes(*bytes)).ok();
            }
        }
    })?;
    let Some(addr) = sockaddr_to_std(&name) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a datagram from an address that is not IP",
        ));
    };
    meta.addr = addr;
    meta.len = len;
    meta.stride = segment.unwrap_or(len);
    Ok(())
}

fn sockaddr_to_std(name: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(name.ss_family) {
        libc::AF_INET => {
            // Safety: the family says this storage holds a sockaddr_in
            let a =
                unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::from((
                a.sin_addr.s_addr.to_ne_bytes(),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // Safety: the family says this storage holds a sockaddr_in6
            let a =
                unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                a.sin6_addr.s6_addr.into(),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::time::{Duration, Instant};

    use super::*;

    /// `text` as the payload of what looks like a ri2n short packet (the sockets' filter
    /// admits nothing else).
    fn datagram(text: &[u8]) -> Vec<u8> {
        let mut d = vec![
            ri2n_proto::wire::VERSION,
            ri2n_proto::wire::packet_type::SHORT,
        ];
        d.extend_from_slice(text);
        d
    }

    /// Waits up to 2 s for a datagram on the non-blocking `sock`.
    fn recv_within(sock: &mio::net::UdpSocket) -> (Vec<u8>, SocketAddr) {
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut buf = [0u8; 64];
        loop {
            match sock.recv_from(&mut buf) {
                Ok((n, from)) => return (buf[..n].to_vec(), from),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("nothing arrived: {e}"),
            }
        }
    }

    /// The kernel behaviour path sockets rest on: on the link socket's port, what the
    /// connected peer sends arrives on the path socket, what anyone else sends on the link
    /// socket, and the path socket's datagrams leave from the link socket's address.
    #[test]
    fn a_path_socket_takes_its_peer_and_leaves_the_rest_to_the_link_socket() {
        let link = LinkSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let other = UdpSocket::bind("127.0.0.1:0").unwrap();
        let path = link.open_path(0, peer.local_addr().unwrap()).unwrap();
        peer.send_to(&datagram(b"from the peer"), link.local)
            .unwrap();
        other
            .send_to(&datagram(b"from another"), link.local)
            .unwrap();
        assert_eq!(
            recv_within(&path.io),
            (datagram(b"from the peer"), peer.local_addr().unwrap())
        );
        assert_eq!(
            recv_within(&link.io),
            (datagram(b"from another"), other.local_addr().unwrap())
        );
        let remote = peer.local_addr().unwrap();
        link.add_path(path);
        assert!(link.has_path(remote));
        assert_eq!(link.send(remote, b"back", None), SendOutcome::Sent);
        let mut buf = [0u8; 16];
        peer.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let (n, from) = peer.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"back"[..], link.local));
        // another endpoint still cannot take the port
        assert!(LinkSocket::bind(link.local).is_err());
        let mut closed = Vec::new();
        link.close_paths(|_| false, |slot, _| closed.push(slot));
        assert_eq!(closed, [0]);
        assert!(!link.has_path(remote));
    }

    /// Receives with single takes from `sock` until `want` datagrams came (within 2 s).
    fn take_one_at_a_time(sock: &LinkSocket, want: usize) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut batch = RecvBatch::for_sockets(std::slice::from_ref(sock)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut got = Vec::new();
        while got.len() < want {
            match sock.recv(&mut batch, Take::One).unwrap() {
                Received::Nothing => {
                    assert!(Instant::now() < deadline, "only {got:?} arrived");
                    std::thread::sleep(Duration::from_millis(5));
                }
                r => {
                    assert_eq!(r, Received::Unchecked);
                    sock.deliver(&mut batch, &mut |_, from, d| got.push((from, d.to_vec())));
                }
            }
        }
        got
    }

    /// A single take (`recvmsg`) reports the sender, and splits what the kernel coalesced
    /// (a GSO send on loopback reaches a GRO socket as one buffer) at the segment size.
    #[test]
    fn a_single_take_reports_the_sender_and_splits_coalesced_datagrams() {
        let sock = LinkSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let peer = LinkSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(
            peer.send(sock.local, &datagram(b"one"), None),
            SendOutcome::Sent
        );
        assert_eq!(
            take_one_at_a_time(&sock, 1),
            [(peer.local, datagram(b"one"))]
        );
        let data: Vec<u8> = [datagram(&[1; 98]), datagram(&[2; 98]), datagram(&[3; 38])].concat();
        assert_eq!(peer.send(sock.local, &data, Some(100)), SendOutcome::Sent);
        let expected: Vec<_> = data.chunks(100).map(|c| (peer.local, c.to_vec())).collect();
        assert_eq!(take_one_at_a_time(&sock, 3), expected);
    }

    /// A GSO send the kernel refuses with `EINVAL` or `EIO` (a device or path that cannot
    /// segment: quinn-udp then halts segmentation offload on the socket) still delivers
    /// every datagram of the batch, one by one, and the socket says it takes single
    /// datagrams from then on. Provoked here with more segments than one send may carry.
    #[test]
    fn a_batch_the_kernel_will_not_segment_still_leaves() {
        let sock = LinkSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert!(sock.max_segments() > 1, "the premise: GSO is on");
        // beyond UDP_MAX_SEGMENTS (64, 128 since Linux 6.11) of one send
        let count = 150;
        let data: Vec<u8> = (0..count).flat_map(|i| [i as u8; 40]).collect();
        assert_eq!(
            sock.send(rx.local_addr().unwrap(), &data, Some(40)),
            SendOutcome::Sent
        );
        assert_eq!(sock.max_segments(), 1, "GSO halted on the socket");
        let mut buf = [0u8; 100];
        for i in 0..count {
            let n = rx
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("datagram {i}: {e}"));
            assert_eq!(&buf[..n], &[i as u8; 40], "datagram {i}");
        }
    }

    /// A batch a blackhole route refuses (`EINVAL`, as a device without the offload gives)
    /// fails, datagram by datagram too, but leaves segmentation on: once the route is gone,
    /// batches leave whole again. Before, quinn-udp's halt on any `EINVAL` sent every
    /// datagram of the socket on its own for the rest of its life. Needs root.
    #[test]
    fn a_batch_a_route_refuses_leaves_segmentation_on() {
        crate::netns_test::in_new_netns(|ip| {
            ip(&["route", "add", "blackhole", "10.99.0.0/24"]);
            let sock = LinkSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            assert!(sock.max_segments() > 1, "the premise: GSO is on");
            let data = vec![7u8; 3 * 1000];
            let refused = sock.send("10.99.0.1:9".parse().unwrap(), &data, Some(1000));
            // the premise: the route refused the batch
            assert_ne!(refused, SendOutcome::Sent);
            assert!(sock.max_segments() > 1, "GSO halted by a route's refusal");
            // the route gone, a batch leaves in one send, and every datagram arrives
            ip(&["route", "del", "blackhole", "10.99.0.0/24"]);
            let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
            rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let sent = sock.send(rx.local_addr().unwrap(), &data, Some(1000));
            assert_eq!(sent, SendOutcome::Sent);
            let mut buf = [0u8; 2000];
            for i in 0..3 {
                let n = rx
                    .recv(&mut buf)
                    .unwrap_or_else(|e| panic!("datagram {i}: {e}"));
                assert_eq!(n, 1000);
            }
        });
    }

    /// ICMP errors about earlier datagrams each fail the socket's next send once, and one
    /// read of the error queue takes at most 256 of them. With more queued, a send is still
    /// made: here some hundreds of "port unreachable" answers wait, and a datagram to a live
    /// peer leaves. Before, its second try failed on the error the rest left, and it was
    /// given up as lost (had the errors been forged "host unreachable", as taken for its
    /// own: its link would have gone down).
    #[test]
    fn a_send_behind_many_icmp_errors_still_leaves() {
        // `sock` and a twin draw the same answers, the twin to count them
        let [sock, twin] =
            [(); 2].map(|_| LinkSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap());
        let gone = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        // straight on the descriptors, so that nothing reads the error queues meanwhile (a
        // send the last answer failed goes again), and paced: Linux sends at most 1000 ICMP
        // errors a second
        let to = socket2::SockAddr::from(gone);
        for _ in 0..400 {
            for s in [&sock, &twin] {
                let raw = socket2::SockRef::from(&s.io);
                if raw.send_to(b"x", &to).is_err() {
                    let _ = raw.send_to(b"x", &to);
                }
            }
            std::thread::sleep(Duration::from_micros(2100));
        }
        std::thread::sleep(Duration::from_millis(50));
        let queued: usize = std::iter::from_fn(|| Some(twin.take_errors()))
            .take_while(|&n| n > 0)
            .sum();
        assert!(queued > 300, "the premise: {queued} answers queued");
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let live = rx.local_addr().unwrap();
        assert_eq!(sock.send(live, b"live", None), SendOutcome::Sent);
        let mut buf = [0u8; 16];
        assert_eq!(
            rx.recv(&mut buf).map(|n| buf[..n].to_vec()).unwrap(),
            b"live"
        );
    }

    /// An ICMP error that arrives while the socket's receive queue is full leaves no entry
    /// in its error queue (that is charged to the same buffer), only the socket's pending
    /// error, which the next receive returns: the datagrams waiting behind it are still
    /// received, at once, not left until some other arrival.
    #[test]
    fn datagrams_behind_a_pending_error_are_still_received() {
        let sock = LinkSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        socket2::SockRef::from(&sock.io)
            .set_recv_buffer_size(0)
            .unwrap();
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in 0..64u8 {
            peer.send_to(&datagram(&[i; 1000]), sock.local).unwrap();
        }
        // a port nobody listens on answers "port unreachable"
        let gone = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert_eq!(sock.send(gone, &datagram(b"x"), None), SendOutcome::Sent);
        std::thread::sleep(Duration::from_millis(50));
        let mut batch = RecvBatch::for_sockets(std::slice::from_ref(&sock)).unwrap();
        let got = sock.recv(&mut batch, Take::Batch);
        assert!(
            matches!(got, Ok(Received::Drained | Received::MoreMayWait)),
            "{got:?}"
        );
        let mut n = 0;
        sock.deliver(&mut batch, &mut |_, from, _| {
            assert_eq!(from, peer.local_addr().unwrap());
            n += 1;
        });
        assert!(n > 0);
    }

    #[test]
    fn path_sockets_leave_the_last_quarter_of_the_descriptors() {
        assert!(!descriptors_running_low(100, 1024));
        assert!(!descriptors_running_low(767, 1024));
        assert!(descriptors_running_low(768, 1024));
        assert!(!descriptors_running_low(1 << 20, u64::MAX));
    }
}
