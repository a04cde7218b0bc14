//! Connection (stub, being written).
use crate::*;

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionState {
    /// Handshake under way.
    Connecting,
    /// Data flows.
    Established,
    /// Ended; [`Connection::close_reason`] says why.
    Closed,
}

/// Statistics of a connection.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectionStats {
    /// Per-link statistics.
    pub links: Vec<LinkStats>,
    /// Bytes written by the application and not yet acknowledged (both streams).
    pub send_buffered: u64,
    /// Bytes received and not yet read by the application (both streams, including out-of-order).
    pub recv_buffered: u64,
}

/// One ri2n connection (application side).
#[derive(Debug)]
pub struct Connection {}

impl Connection {
    /// Current state.
    pub fn state(&self) -> ConnectionState { todo!() }
    /// Why the connection ended; `None` while open or after a clean close.
    pub fn close_reason(&self) -> Option<&ConnectionError> { todo!() }
    /// Writes bytes to the byte stream; returns how many were taken.
    pub fn write(&mut self, _data: &[u8]) -> Result<usize, WriteError> { todo!() }
    /// Sends one whole message.
    pub fn send_message(&mut self, _msg: &[u8]) -> Result<(), WriteError> { todo!() }
    /// Finishes both outgoing streams.
    pub fn finish(&mut self) { todo!() }
    /// Reads from the byte stream: Ok(0) at end of stream.
    pub fn read(&mut self, _buf: &mut [u8]) -> Result<usize, ReadError> { todo!() }
    /// Receives one whole message: Ok(None) at end of the message stream.
    pub fn recv_message(&mut self) -> Result<Option<Vec<u8>>, ReadError> { todo!() }
    /// Whether everything written, and the end of both streams, was acknowledged.
    pub fn is_send_complete(&self) -> bool { todo!() }
    /// Aborts at once.
    pub fn abort(&mut self, _code: u64, _reason: &str) { todo!() }
    /// Statistics.
    pub fn stats(&self) -> ConnectionStats { todo!() }
}
