//! The control messages between `ri2n bench` and `ri2n serve`: the client's first message
//! (on the message stream, `send_message`) names the test; after a throughput test the
//! server answers with what it saw. Both are small JSON documents.

use serde::{Deserialize, Serialize};

use crate::report::LinkSummary;

/// Version of this little protocol, checked by the server.
pub const VERSION: u32 = 1;

/// Which test a client wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Test {
    /// The client writes for `seconds`; the server reads and discards, then reports.
    Throughput,
    /// The server writes for `seconds`, then reports; the client reads.
    Reverse,
    /// The server echoes each message until the client finishes.
    Latency,
}

/// The client's first message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    pub version: u32,
    pub test: Test,
    /// Length of a throughput test (ignored for latency).
    #[serde(default)]
    pub seconds: f64,
    /// Throughput test: the server samples what it read every this many seconds and sends
    /// that timeline with its report (0: no timeline). A receiver-side meter of the client's
    /// sending, at the client's timeline resolution.
    #[serde(default)]
    pub interval: f64,
}

/// The server's report after a throughput test (either direction).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerReport {
    /// Bytes the server read (throughput) or wrote (reverse).
    pub bytes: u64,
    /// From the request to the end of stream (throughput) or the last write (reverse).
    pub seconds: f64,
    /// The server's view of each link when it reported (sent counters: repairs included).
    #[serde(default)]
    pub links: Vec<ServerLink>,
    /// Throughput test with an `interval`: `[seconds since the request, bytes read so far]`
    /// at the end of every interval, sampled by a thread of its own (so the samples keep
    /// coming while reading blocks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<(f64, u64)>,
}

/// A link as the server saw it (the subset of [`LinkSummary`] that crosses the wire).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerLink {
    pub id: u8,
    pub state: String,
    pub stream_bytes_sent: u64,
    pub bytes_received: u64,
    pub packets_lost: u64,
    pub srtt_us: u64,
}

impl From<&LinkSummary> for ServerLink {
    fn from(l: &LinkSummary) -> Self {
        Self {
            id: l.id,
            state: l.state.to_owned(),
            stream_bytes_sent: l.stream_bytes_sent,
            bytes_received: l.bytes_received,
            packets_lost: l.packets_lost,
            srtt_us: l.srtt_us.unwrap_or(0),
        }
    }
}
