//! Why a received datagram is dropped without effect, and the counts by reason. The endpoint
//! counts every drop, but its connections name the reason for many (a short packet they cannot
//! open, parse or place): the reasons stand apart so that a connection needs nothing from the
//! endpoint.

use std::net::SocketAddr;

/// Why the engine dropped a received datagram without acting on it. Every such drop is
/// counted ([`Endpoint::dropped`]) and logged at `tracing`'s trace level.
///
/// [`Endpoint::dropped`]: crate::Endpoint::dropped
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropReason {
    /// It could not be decoded: truncated, another protocol version, an unknown packet type or
    /// a malformed header.
    Undecodable,
    /// A short packet or RESET for a connection this endpoint does not have (a short packet
    /// of at least 16 bytes is answered with a RESET, at most 1000 per second).
    UnknownConnection,
    /// A handshake packet that answers nothing outstanding here: an INITIAL at an endpoint
    /// that does not accept connections (answered with a REFUSE), a RETRY or ACCEPT for no
    /// connecting client or from another address.
    UnexpectedHandshake,
    /// A short packet for a connection still connecting, or already closed.
    WrongState,
    /// One of its frames is malformed: the packet is dropped whole.
    MalformedFrame,
    /// Its link ID and address pair match no link (links never migrate), or it would open a
    /// link beyond the limit; or a RESET from an address the peer was never heard from (an
    /// endpoint there that is not the peer, PROTOCOL.md §8.4).
    UnknownLink,
    /// Its packet number arrived before, is too old to tell, or jumps too far ahead.
    Duplicate,
    /// Its stream data would add an out-of-order fragment beyond what a receiving stream
    /// holds (4096): dropped unacknowledged, so the sender sends it again later.
    TooFragmented,
    /// An INITIAL that would open a connection beyond the server's limits
    /// ([`EndpointConfig::max_connections`](crate::EndpointConfig::max_connections), per address
    /// [`max_connections_per_address`](crate::EndpointConfig::max_connections_per_address)):
    /// the client is told with a RESET.
    ConnectionLimit,
    /// It failed authentication: a sealed packet that does not open under the connection's
    /// keys (forged, damaged, or replayed from elsewhere), an ACCEPT whose handshake message
    /// does not, or a RESET without a valid token at a keyed endpoint.
    Unauthenticated,
    /// An INITIAL whose handshake the server cannot authenticate: the client holds another
    /// key, or one side has none, or it is a replay (its handshake was made for another
    /// cookie). The client is told with a REFUSE; the server keeps nothing.
    KeyMismatch,
    /// Not a datagram but an ICMP "port unreachable" that quotes no packet this endpoint
    /// sent on that path (forged, or about a connection long gone): ignored.
    UnmatchedRefusal,
    /// A keyed INITIAL beyond the server's rate of handshake messages it reads
    /// ([`EndpointConfig::max_keyed_handshakes_per_second`](crate::EndpointConfig::max_keyed_handshakes_per_second)):
    /// dropped unread; a real client sends it again.
    HandshakeBudget,
    /// An INITIAL naming another application than the server serves
    /// ([`ConnectionConfig::application`](crate::ConnectionConfig::application)): the client
    /// is told with a REFUSE naming the server's.
    WrongApplication,
}

impl DropReason {
    /// The reason's name in reports: `undecodable`, `unknown_connection`, ... (stable: JSON
    /// summaries use it as a key).
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Undecodable => "undecodable",
            DropReason::UnknownConnection => "unknown_connection",
            DropReason::UnexpectedHandshake => "unexpected_handshake",
            DropReason::WrongState => "wrong_state",
            DropReason::MalformedFrame => "malformed_frame",
            DropReason::UnknownLink => "unknown_link",
            DropReason::Duplicate => "duplicate",
            DropReason::TooFragmented => "too_fragmented",
            DropReason::ConnectionLimit => "connection_limit",
            DropReason::Unauthenticated => "unauthenticated",
            DropReason::KeyMismatch => "key_mismatch",
            DropReason::UnmatchedRefusal => "unmatched_refusal",
            DropReason::HandshakeBudget => "handshake_budget",
            DropReason::WrongApplication => "wrong_application",
        }
    }

    /// Every reason, in the order of [`DropCounts::iter`].
    pub const ALL: [DropReason; 14] = [
        DropReason::Undecodable,
        DropReason::UnknownConnection,
        DropReason::UnexpectedHandshake,
        DropReason::WrongState,
        DropReason::MalformedFrame,
        DropReason::UnknownLink,
        DropReason::Duplicate,
        DropReason::TooFragmented,
        DropReason::ConnectionLimit,
        DropReason::Unauthenticated,
        DropReason::KeyMismatch,
        DropReason::UnmatchedRefusal,
        DropReason::HandshakeBudget,
        DropReason::WrongApplication,
    ];
}

/// Counts of dropped datagrams by [`DropReason`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DropCounts([u64; DropReason::ALL.len()]);

impl DropCounts {
    /// Datagrams dropped for `reason`.
    pub fn get(&self, reason: DropReason) -> u64 {
        self.0[reason as usize]
    }

    /// Datagrams dropped for any reason.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Every reason with its count.
    pub fn iter(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL.iter().map(|&r| (r, self.get(r)))
    }

    pub(crate) fn record(&mut self, reason: DropReason, remote: SocketAddr, len: usize) {
        self.0[reason as usize] += 1;
        tracing::trace!(?reason, %remote, len, "datagram dropped");
    }
}

/// The counts of two engines together (the shards of one endpoint).
impl std::ops::Add<&DropCounts> for DropCounts {
    type Output = DropCounts;

    fn add(mut self, other: &DropCounts) -> DropCounts {
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            *mine += theirs;
        }
        self
    }
}
