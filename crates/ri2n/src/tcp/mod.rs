//! The TCP transport (`EndpointConfig::transport = Transport::Tcp`, docs/PROTOCOL.md §12):
//! each link is one TCP connection per address pair, and the channel's byte stream is
//! striped over them without per-fragment headers as Enhanced MuniSocket does
//! (`ri2n_proto::tcp`), with ri2n's acknowledgements, failover, reconnection and take-back
//! on top.
//!
//! - [`endpoint`]: listening sockets, the hello exchange, connecting.
//! - [`conn`]: one connection's state under one lock, and the application's calls on it.
//! - [`link`]: each link's writer and reader threads, and the watch thread that declares
//!   links dead and starts dialers.
//! - [`dial`]: the dialer that opens a client's further links and replaces a dead link's TCP
//!   connection, by racing connection attempts.
//!
//! Threads, not an event loop: a link's writer blocks in `write` while its TCP connection's
//! buffer is full, which is exactly MuniSocket's load balancing (a slower link takes fewer
//! runs), and a connection has few links.

pub(crate) mod conn;
mod dial;
pub(crate) mod endpoint;
pub(crate) mod link;
mod signal;
mod sys;

pub(crate) use conn::TcpConnection;
pub(crate) use endpoint::TcpEndpoint;
