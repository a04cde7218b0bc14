//! One UDP socket per local address (so each link leaves through the address, and normally
//! the interface, it names), with batched receive (`recvmmsg`, GRO) and sends whose errors are
//! reported rather than swallowed, through `quinn-udp`.

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::sync::Arc;

use quinn_udp::{RecvMeta, Transmit, UdpSocketState, BATCH_SIZE};

use crate::impair::Impairment;

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
}

/// A bound UDP socket of one local address.
#[derive(Debug)]
pub(crate) struct LinkSocket {
    pub local: SocketAddr,
    pub io: mio::net::UdpSocket,
    state: UdpSocketState,
    pub impairment: Arc<Impairment>,
}

impl LinkSocket {
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        let std = std::net::UdpSocket::bind(addr)?;
        std.set_nonblocking(true)?;
        let state = UdpSocketState::new((&std).into())?;
        // best effort: a smaller buffer still works, just drops more under bursts
        let _ = state.set_send_buffer_size((&std).into(), SOCKET_BUFFER);
        let _ = state.set_recv_buffer_size((&std).into(), SOCKET_BUFFER);
        let local = std.local_addr()?;
        Ok(Self {
            local,
            io: mio::net::UdpSocket::from_std(std),
            state,
            impairment: Arc::new(Impairment::default()),
        })
    }

    /// Most datagrams one GSO send may carry on this socket (1 without GSO).
    pub fn max_segments(&self) -> usize {
        self.state.max_gso_segments().max(1)
    }

    /// Sends `data` to `remote`: one datagram, or with `segment` several of that size (the
    /// last may be shorter) in one system call (GSO).
    pub fn send(&self, remote: SocketAddr, data: &[u8], segment: Option<usize>) -> SendOutcome {
        if self.impairment.is_impaired() {
            // the impairment layer judges datagram by datagram
            let seg = segment.unwrap_or(data.len()).max(1);
            let mut outcome = SendOutcome::Sent;
            for d in data.chunks(seg) {
                if self.impairment.admit_send(d.len()) {
                    outcome = self.send_raw(remote, d, None);
                }
            }
            return outcome;
        }
        self.send_raw(remote, data, segment)
    }

    fn send_raw(&self, remote: SocketAddr, data: &[u8], segment: Option<usize>) -> SendOutcome {
        let transmit = Transmit {
            destination: remote,
            ecn: None,
            contents: data,
            segment_size: segment.filter(|&s| s < data.len()),
            src_ip: None,
        };
        match self.state.try_send((&self.io).into(), &transmit) {
            Ok(()) => SendOutcome::Sent,
            Err(e) => classify_send_error(&e),
        }
    }

    /// Receives a batch of datagrams into `batch` (one `recvmmsg`; GRO buffers hold several
    /// datagrams each). Needs no engine state, so it runs without the engine's lock.
    pub fn recv(&self, batch: &mut RecvBatch) -> io::Result<Received> {
        let mut slices: [IoSliceMut<'_>; BATCH_SIZE] = {
            let mut bufs = batch.bufs.iter_mut();
            std::array::from_fn(|_| IoSliceMut::new(bufs.next().expect("BATCH_SIZE buffers")))
        };
        batch.count = match self
            .state
            .recv((&self.io).into(), &mut slices, &mut batch.meta)
        {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e),
        };
        Ok(match batch.count {
            0 => Received::Nothing,
            // fewer than asked for: the socket's queue was empty when the call returned
            n if n < BATCH_SIZE => Received::Drained,
            _ => Received::MoreMayWait,
        })
    }

    /// Calls `f(remote, datagram)` for each datagram of the batch last received (GRO buffers
    /// are split at their stride; the impairment layer may drop some).
    pub fn deliver(&self, batch: &RecvBatch, f: &mut dyn FnMut(SocketAddr, &[u8])) {
        for (m, buf) in batch.meta.iter().zip(&batch.bufs).take(batch.count) {
            let stride = m.stride.max(1);
            for d in buf[..m.len].chunks(stride) {
                if self.impairment.admit_recv() {
                    f(m.addr, d);
                }
            }
        }
    }

    /// Receive buffers sized for this socket's GRO.
    pub fn recv_batch(&self) -> RecvBatch {
        let size = (1500 * self.state.gro_segments().max(1)).max(65536);
        RecvBatch {
            bufs: (0..BATCH_SIZE).map(|_| vec![0u8; size]).collect(),
            meta: [RecvMeta::default(); BATCH_SIZE],
            count: 0,
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
}

/// One thread's buffers for receiving a batch of datagrams.
#[derive(Debug)]
pub(crate) struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    meta: [RecvMeta; BATCH_SIZE],
    count: usize,
}

fn classify_send_error(e: &io::Error) -> SendOutcome {
    const UNREACHABLE: [i32; 5] = [
        libc::ENETUNREACH,
        libc::EHOSTUNREACH,
        libc::EADDRNOTAVAIL,
        libc::ENETDOWN,
        libc::EHOSTDOWN,
    ];
    match e.raw_os_error() {
        Some(code) if UNREACHABLE.contains(&code) => SendOutcome::Unreachable,
        _ if e.kind() == io::ErrorKind::WouldBlock => SendOutcome::Congested,
        Some(libc::ENOBUFS) => SendOutcome::Congested,
        _ => {
            tracing::debug!(error = %e, "send failed");
            SendOutcome::Congested
        }
    }
}
