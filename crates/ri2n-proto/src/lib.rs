//! The ri2n protocol engine: one reliable connection striped over up to eight links.
//!
//! This crate is *sans-IO*: it opens no sockets, reads no clock and starts no thread. A driver
//! (the real UDP driver in the `ri2n` crate, or the simulator in `ri2n-sim`) feeds it datagrams
//! and the current time and sends what it asks for. The call pattern of a driver:
//!
//! 1. [`Endpoint::handle_datagram`] for every datagram received, with the local and remote
//!    address it travelled between (the pair names the link);
//! 2. application calls on [`Connection`]s reached through [`Endpoint::connection_mut`];
//! 3. [`Endpoint::poll_transmit`] until it returns `None`, sending each datagram as told;
//! 4. [`Endpoint::poll_event`] and [`Endpoint::accept`] for what the application should learn;
//! 5. sleep until [`Endpoint::poll_timeout`] or the next datagram, calling
//!    [`Endpoint::handle_timeout`] when the time has come; then start over.
//!
//! The wire format is specified in `docs/PROTOCOL.md`.

#![warn(missing_docs)]

mod ack;
pub mod addr;
mod attention;
mod config;
mod congestion;
mod connection;
pub mod crypto;
mod datagrams;
mod dropped;
mod endpoint;
mod error;
mod link;
mod open_ahead;
mod pmtu;
pub mod ranges;
mod streams;
pub mod tcp;
mod transmit;
pub mod wire;

pub use config::{
    ConnectionConfig, EndpointConfig, LinkThreads, SendThreads, Shard, Striping, Transport,
    MAX_SHARDS, SHARDS_LIMIT,
};
pub use connection::{Connection, ConnectionState, ConnectionStats, SendLimits, MAX_ABORT_CODE};
pub use crypto::{Cipher, Key, KeyError, KeyReadError, Opened, Opener, Seal, KEY_FILE_MAX};
pub use datagrams::datagram_capacity;
pub use dropped::{DropCounts, DropReason};
pub use endpoint::{ConnectionCounts, Endpoint, RefusalReason, RefusalReports, RefusedHandshake};
pub use error::{ConnectError, ConnectionError, KeyMismatch, ReadError, WriteError};
pub use link::{LinkState, LinkStats};
pub use open_ahead::{HeldKeys, Openers};
pub use streams::reclaim;
pub use transmit::{Transmit, TransmitBuffer};
pub use wire::MAX_DATAGRAM_LEN;

/// Most links one connection carries.
pub const MAX_LINKS: usize = 8;

/// Names a connection within its endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionHandle(pub u64);

/// A link's ID within its connection, carried in every packet (0 is the link the handshake
/// used; a client numbers the links it opens 1, 2, …). An ID is not a position in the
/// connection's list of links (a link the peer opened may take any free ID), so the two are
/// different types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LinkId(pub u8);

impl std::fmt::Display for LinkId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Something the application should know about a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// The handshake completed; data can flow.
    Connected,
    /// A link was added to the connection (it starts out validating). Link 0, the one the
    /// handshake took, comes with the connection: [`Event::Connected`] tells it.
    LinkAdded {
        /// The new link.
        link: LinkId,
    },
    /// A link changed state (up, degraded, down).
    LinkStateChanged {
        /// The link.
        link: LinkId,
        /// Its previous state.
        from: LinkState,
        /// Its new state.
        to: LinkState,
    },
    /// New data or a message can be read.
    Readable,
    /// Buffer space was freed; a blocked writer can retry.
    Writable,
    /// Everything written and the end of both streams were acknowledged by the peer (after
    /// [`Connection::finish`]); emitted once.
    AllAcknowledged,
    /// The connection ended: `None` for a clean close, else why.
    Closed(Option<ConnectionError>),
}
