//! Errors the engine reports to the application, one enum per operation.

use thiserror::Error;

/// Why a connection ended (other than a clean close).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ConnectionError {
    /// The peer answered with a reset: it no longer knows this connection (it restarted).
    #[error("the peer restarted and no longer knows this connection")]
    PeerRestarted,
    /// The peer's host answers "port unreachable" on the links: nothing listens on the
    /// peer's addresses (any more): its process is gone (killed, crashed, exited without
    /// closing) or, for a handshake, was never started. Unlike
    /// [`AllLinksDown`](Self::AllLinksDown), the network works.
    #[error("the peer is gone: its host answers that nothing listens on its port")]
    PeerGone,
    /// The peer closed the connection as if it were complete, but did not acknowledge
    /// everything sent to it (or this side had not finished sending): some data may not have
    /// arrived.
    #[error("the peer closed the connection before acknowledging everything sent to it")]
    ClosedEarly,
    /// No link worked for the configured all-links-down deadline.
    #[error("every link has been down for longer than the configured deadline")]
    AllLinksDown,
    /// Nothing was received for the configured idle timeout.
    #[error("nothing was received from the peer within the idle timeout")]
    IdleTimeout,
    /// The peer aborted the connection.
    #[error("the peer aborted the connection (code {code}): {reason}")]
    PeerAborted {
        /// Application error code given by the peer.
        code: u64,
        /// Reason text given by the peer.
        reason: String,
    },
    /// The peer's engine ended the connection because of an error on its side.
    #[error("the peer closed the connection after an error (code {code}): {reason}")]
    PeerError {
        /// Engine error code.
        code: u64,
        /// Description given by the peer.
        reason: String,
    },
    /// The application aborted the connection locally.
    #[error("the connection was aborted locally")]
    LocallyAborted,
    /// Nothing listens at the peer's address: its host answered the handshake with "port
    /// unreachable" (the peer's process is not running, or runs on another port, or a
    /// server of the other transport listens there).
    #[error(
        "connection refused: nothing listens at the peer's address (is its server running, \
         on that port, with the same transport, UDP or TCP?)"
    )]
    Refused,
    /// The peer did not answer the handshake within the handshake timeout (a host or network
    /// that is down, a firewall that drops the packets, or no host at that address).
    #[error("no answer to the handshake within {0:?}")]
    TimedOut(std::time::Duration),
    /// Something listens at the peer's address but takes no connections: a ri2n endpoint that
    /// is not a server, or a server whose application let go of its endpoint.
    #[error("the peer takes no connections (its endpoint is not a server, or no longer accepts)")]
    NotAccepting,
    /// The server serves another application than the one this side speaks.
    #[error("the peer serves {theirs:?}, not {ours:?}")]
    WrongApplication {
        /// The application this side asked for.
        ours: String,
        /// The application the server serves.
        theirs: String,
    },
    /// The server refused the connection: it holds as many connections as it allows, in all
    /// or from this client's address.
    #[error("the server refused the connection: it has reached its connection limit")]
    ServerFull,
    /// The handshake could not be authenticated: the two sides do not hold the same key.
    #[error("authentication failed: {0}")]
    KeyMismatch(KeyMismatch),
    /// The peer broke the protocol.
    #[error("protocol violation: {0}")]
    ProtocolViolation(&'static str),
}

/// Why a write did not take (all of) the data.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The send buffer is full: wait until acknowledgements free it, then retry.
    #[error("send buffer full, try again later")]
    Blocked,
    /// The stream was finished locally; nothing more can be written.
    #[error("the stream was already finished")]
    Finished,
    /// The message exceeds what the send buffer or the peer's window can ever hold.
    #[error("message of {size} bytes exceeds the limit of {limit} bytes")]
    MessageTooLarge {
        /// Size of the rejected message.
        size: usize,
        /// Largest message the connection can carry.
        limit: usize,
    },
    /// The datagram exceeds the largest one the connection carries (`max_datagram_size`).
    #[error("datagram of {size} bytes exceeds the limit of {limit} bytes")]
    DatagramTooLarge {
        /// Size of the rejected datagram.
        size: usize,
        /// Largest datagram the connection can carry.
        limit: usize,
    },
    /// The connection is not established yet.
    #[error("the connection is not established yet")]
    NotConnected,
    /// The peer said in the handshake that it takes no messages (it reads only the byte
    /// stream): a message would never be read.
    #[error("the peer takes no messages (it reads only the byte stream)")]
    MessagesRefused,
    /// The peer said in the handshake that it takes no datagrams.
    #[error("the peer takes no datagrams")]
    DatagramsRefused,
    /// The connection has ended.
    #[error("connection lost: {0}")]
    ConnectionLost(ConnectionError),
}

/// Why a read returned no data.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ReadError {
    /// Nothing is readable now: wait for more data.
    #[error("nothing to read yet")]
    Blocked,
    /// The connection has ended before the peer finished the stream.
    #[error("connection lost: {0}")]
    ConnectionLost(ConnectionError),
}

/// Why a connection could not be started.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// No remote address was given.
    #[error("no remote address given")]
    NoRemoteAddress,
    /// The endpoint has no local address of the remote address' family.
    #[error("no local address can reach {0}")]
    NoLocalAddress(std::net::SocketAddr),
    /// The configuration is unusable.
    #[error("invalid configuration: {0}")]
    InvalidConfig(&'static str),
    /// More links were asked for than a connection carries. Not returned by
    /// `Endpoint::connect` any more: it takes any number of addresses and opens links to as
    /// many as a connection carries.
    #[error("at most {0} links per connection")]
    TooManyLinks(usize),
}

/// How the keys of the two sides of a refused handshake differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum KeyMismatch {
    /// Both hold a key, not the same one.
    #[error("the peer holds another key")]
    WrongKey,
    /// The peer requires a key and this side has none.
    #[error("the peer requires a key (this side has none)")]
    KeyRequired,
    /// This side holds a key and the peer has none.
    #[error("the peer holds no key (this side has one)")]
    NoKey,
}
