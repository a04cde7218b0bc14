//! The TCP transport's protocol core (docs/PROTOCOL.md §12), without I/O: each link is one
//! TCP connection, and the channel stripes its byte stream over them as Enhanced MuniSocket
//! does, then adds what MuniSocket lacked: acknowledgements at the ri2n level, so that what a
//! dead link had taken is sent again on the others.
//!
//! - [`chunk`]: what the striped sequence carries: the byte stream and whole messages, in
//!   chunks, and how the receiver splits them apart again.
//! - [`frame`]: the records a link carries (its hello, rounds, runs, repairs, acks).
//! - [`stripe`]: the sending side, which hands each link's writer its next run, taken from
//!   that link's end of a stretch of the stream, and re-queues a dead link's unacknowledged
//!   runs.
//! - [`reassembly`]: the receiving side, which places each run by its link's order alone and
//!   discards bytes that arrived twice.
//! - [`soft`]: when a link gone slow is set aside.
//!
//! The I/O (sockets, threads, link watching, reconnecting) lives in `ri2n::tcp`.

pub mod chunk;
pub mod frame;
pub mod keys;
pub mod reassembly;
pub mod soft;
pub mod stripe;

pub use chunk::{ChunkError, Demux, Kind, Piece};
pub use frame::{FrameError, Hello, HelloReply, HelloStatus, Record};
pub use reassembly::{PlacementError, Reassembly};
pub use soft::{LinkView, SlowLinkWatch};
pub use stripe::{Round, StripeConfig, Striper, Work};
