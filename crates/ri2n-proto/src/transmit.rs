//! What the engine hands the driver to send: a [`Transmit`] names a built datagram's path and
//! length, a [`TransmitBuffer`] is the driver's room the datagrams are built in. Both the
//! endpoint and its connections build into it, so it stands apart from either.

use std::net::SocketAddr;

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
