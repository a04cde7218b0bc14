//! The control messages between `ri2n bench` and `ri2n serve`: the client's first message
//! (on the message stream, `send_message`) names the test; the server answers a throughput
//! test (either direction) with the time it grants, and after it with what it saw. All are
//! small JSON documents.

use serde::{Deserialize, Serialize};

use crate::report::LinkSummary;

/// Version of this little protocol, checked by the server. Version 2 added the [`Grant`]: a
/// client of version 1 would take it for the report, and one of version 2 would wait for it
/// forever from a server of version 1, so the two must not be mixed.
pub const VERSION: u32 = 2;

/// The one field every version's first message has, read before the rest.
#[derive(Debug, Deserialize)]
pub struct Versioned {
    pub version: u32,
}

/// Which test a client wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Test {
    /// The client writes for the granted seconds; the server reads and discards, then
    /// reports.
    Throughput,
    /// The server writes for the granted seconds, then reports; the client reads.
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
    /// sending, at the client's timeline resolution (coarser where a long test would give
    /// more than 100 000 rows; each row carries its time).
    #[serde(default)]
    pub interval: f64,
    /// Reverse test: the server paces its writes to this many bits per second (none: as fast
    /// as it can). The client paces its own writes in the other direction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_bps: Option<f64>,
}

/// The server's answer to a throughput request (either direction), before any data: how
/// long the test runs. The server's `--max-time` may cut the time asked for; the client then
/// sends (or expects data) only that long and says the test was cut.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Grant {
    pub seconds: f64,
    /// Whether `seconds` is less than the request asked for.
    pub cut: bool,
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
    /// What the server wrote that the client acknowledged by then, each byte once: the data,
    /// its own control messages and the framing the links' sent counters count too, so that
    /// the difference is what was sent again (absent from servers before it was added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_acknowledged: Option<u64>,
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
    /// Stream bytes this link delivered (acknowledged by the client): in a reverse test, the
    /// link's part of the goodput.
    #[serde(default)]
    pub stream_bytes_acked: u64,
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
            stream_bytes_acked: l.stream_bytes_acked,
            bytes_received: l.bytes_received,
            // 0 where they are not counted (TCP): the client knows its transport
            packets_lost: l.packets_lost.unwrap_or(0),
            srtt_us: l.srtt_us.unwrap_or(0),
        }
    }
}
