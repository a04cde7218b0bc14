//! What the engine hands the driver to send: a [`Transmit`] names a built datagram's path and
//! length, a [`TransmitBuffer`] is the driver's room the datagrams are built in. Both the
//! endpoint and its connections build into it, so it stands apart from either.

use std::net::SocketAddr;
use std::ops::Range;

use bytes::Bytes;

use crate::crypto::Seal;

/// A datagram the driver must send: `len` bytes of the buffer given to `poll_transmit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Local address to send from.
    pub local: SocketAddr,
    /// Destination.
    pub remote: SocketAddr,
    /// Length of the datagram.
    pub len: usize,
}

/// Where [`Endpoint::poll_transmit_into`] builds datagrams: the engine picks the path first,
/// then asks for room on it, so a driver can hand out the tail of that path's outgoing batch
/// and datagrams are built in place, never copied.
///
/// [`Endpoint::poll_transmit_into`]: crate::Endpoint::poll_transmit_into
pub trait TransmitBuffer {
    /// Room for the next datagram from `local` to `remote`: at least the connection's
    /// `max_datagram_size` (and 1200 bytes for handshake packets). The engine writes the
    /// datagram at its start, then reports it with [`commit`](Self::commit).
    fn buffer(&mut self, local: SocketAddr, remote: SocketAddr) -> &mut [u8];

    /// The datagram written in the room last handed out is complete.
    fn commit(&mut self, t: &Transmit);

    /// Whether the buffer takes another datagram in this call. The engine asks before each
    /// datagram after the first: a connection with data ready builds a burst of packets at
    /// one instant, and the costs of deciding what is due are paid once per burst.
    fn wants_more(&self) -> bool;

    /// Whether the driver seals the datagrams itself before it sends them (default: no). The
    /// engine then hands the sealing of each sealed datagram to
    /// [`defer_seal`](Self::defer_seal) instead of doing it, so that the driver can seal
    /// outside the lock it keeps around the engine, in parallel with the engine's work.
    fn seals_later(&self) -> bool {
        false
    }

    /// The sealing the datagram being built (the next one committed) still needs. Called
    /// only where [`seals_later`](Self::seals_later) says so, before
    /// [`commit`](Self::commit); a datagram must not leave unsealed.
    fn defer_seal(&mut self, seal: Seal) {
        let _ = seal;
        unreachable!("a buffer that seals later must take the seals");
    }

    /// Whether the driver takes the stream bytes of the datagrams by reference (default:
    /// no). The engine then leaves their room in each datagram unwritten and names them with
    /// [`defer_payload`](Self::defer_payload), and the driver puts them in before the datagram
    /// is sealed, or hands them to the system call that sends it: the bytes are not copied
    /// into the datagram under the lock the driver keeps around the engine, or not at all. A
    /// buffer that takes payloads must also [`seal later`](Self::seals_later): sealing covers
    /// the bytes the engine did not write.
    fn takes_payload(&self) -> bool {
        false
    }

    /// `piece[range]` belongs at position `at` of the datagram being built (the next one
    /// committed). Called only where [`takes_payload`](Self::takes_payload) says so, before
    /// [`commit`](Self::commit). `piece` does not change while it lives: a clone keeps the
    /// bytes until the datagram has left.
    fn defer_payload(&mut self, at: usize, piece: &Bytes, range: Range<usize>) {
        let _ = (at, piece, range);
        unreachable!("a buffer that takes payloads must take them");
    }
}

/// One buffer for every path, for one datagram, written to its start.
pub(crate) struct SliceBuffer<'a> {
    pub buf: &'a mut [u8],
    pub built: Option<Transmit>,
}

impl TransmitBuffer for SliceBuffer<'_> {
    fn buffer(&mut self, _: SocketAddr, _: SocketAddr) -> &mut [u8] {
        self.buf
    }

    fn commit(&mut self, t: &Transmit) {
        self.built = Some(*t);
    }

    fn wants_more(&self) -> bool {
        self.built.is_none()
    }
}
