//! Per-link state (stub, being written).
use std::net::SocketAddr;
use std::time::Duration;

/// Health of a link as the sender judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkState {
    /// Newly opened; waiting for its first acknowledgement. Carries only probes.
    Validating,
    /// Healthy: carries data.
    Up,
    /// Alive but far slower than it was (a soft failure). Carries only probes.
    Degraded,
    /// Nothing gets through. Probed every `probe_interval`.
    Down,
}

/// Statistics of one link.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LinkStats {
    /// The link's index in its connection.
    pub id: crate::LinkId,
    /// Local address.
    pub local: SocketAddr,
    /// Remote address.
    pub remote: SocketAddr,
    /// Current state.
    pub state: LinkState,
    /// Smoothed round-trip time.
    pub srtt: Duration,
    /// Smallest round-trip time seen.
    pub min_rtt: Duration,
    /// Congestion window in bytes.
    pub cwnd: u64,
    /// Bytes in flight (sent, neither acknowledged nor lost).
    pub bytes_in_flight: u64,
    /// Datagram bytes sent on the link.
    pub bytes_sent: u64,
    /// Datagram bytes received on the link.
    pub bytes_received: u64,
    /// Packets sent.
    pub packets_sent: u64,
    /// Packets received.
    pub packets_received: u64,
    /// Packets declared lost (including those re-sent when the link failed).
    pub packets_lost: u64,
    /// Stream bytes first sent on this link (new data, not retransmissions).
    pub stream_bytes_sent: u64,
}
