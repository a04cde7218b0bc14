//! Endpoint (stub, being written).
use std::net::SocketAddr;
use std::time::Instant;
use crate::*;

/// Names a connection within its endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionHandle(pub u64);

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

/// All connections of one host process, and the demultiplexing between them.
#[derive(Debug)]
pub struct Endpoint {}

impl Endpoint {
    /// A new endpoint; `seed` feeds its random numbers (connection IDs, cookie key).
    pub fn new(_config: EndpointConfig, _seed: u64, _now: Instant) -> Self { todo!() }
    /// Starts a connection to a peer given one or more of its addresses.
    pub fn connect(&mut self, _now: Instant, _remotes: &[SocketAddr], _config: ConnectionConfig) -> Result<ConnectionHandle, ConnectError> { todo!() }
    /// Handles one received datagram.
    pub fn handle_datagram(&mut self, _now: Instant, _local: SocketAddr, _remote: SocketAddr, _data: &[u8]) { todo!() }
    /// Next datagram to send, written into `buf` (at least `max_datagram_size` bytes).
    pub fn poll_transmit(&mut self, _now: Instant, _buf: &mut [u8]) -> Option<Transmit> { todo!() }
    /// When `handle_timeout` must next be called.
    pub fn poll_timeout(&mut self) -> Option<Instant> { todo!() }
    /// Runs timers that are due.
    pub fn handle_timeout(&mut self, _now: Instant) { todo!() }
    /// Next application event.
    pub fn poll_event(&mut self) -> Option<(ConnectionHandle, Event)> { todo!() }
    /// Next accepted incoming connection.
    pub fn accept(&mut self) -> Option<ConnectionHandle> { todo!() }
    /// A connection, for application calls.
    pub fn connection_mut(&mut self, _h: ConnectionHandle) -> Option<&mut Connection> { todo!() }
    /// A connection, read-only.
    pub fn connection(&self, _h: ConnectionHandle) -> Option<&Connection> { todo!() }
}
