//! Why a simulation failed, and the failure message: it always names the seed and prints the
//! whole scenario, so the run can be replayed bit for bit.

use std::fmt;
use std::time::Duration;

use ri2n_proto::{ConnectError, ConnectionError, ReadError, WriteError};

use crate::net::{Dir, HostId};
use crate::report::Report;
use crate::scenario::Scenario;

/// What went wrong.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum FailureKind {
    /// The scenario is malformed.
    InvalidScenario(String),
    /// A received byte differs from the byte sent at that offset.
    Mismatch {
        /// Direction of the transfer.
        dir: Dir,
        /// Offset of the first wrong byte in the stream.
        offset: u64,
        /// The byte that was sent.
        expected: u8,
        /// The byte that was received.
        got: u8,
    },
    /// A received message differs from the one sent (or is one too many: `expected_len` None).
    MessageMismatch {
        /// Direction of the transfer.
        dir: Dir,
        /// Index of the message.
        index: usize,
        /// Length of the message sent.
        expected_len: Option<usize>,
        /// Length of the message received.
        got_len: usize,
        /// First differing offset within the common length.
        first_difference: Option<usize>,
    },
    /// More bytes arrived than were sent.
    TooMuchData {
        /// Direction of the transfer.
        dir: Dir,
        /// Bytes received including the excess.
        received: u64,
        /// Bytes sent.
        expected: u64,
    },
    /// The stream ended (bytes) or the message stream ended (messages) before everything arrived.
    EarlyEnd {
        /// Direction of the transfer.
        dir: Dir,
        /// Bytes or messages received.
        received: u64,
        /// Bytes or messages sent.
        expected: u64,
    },
    /// `read`/`recv_message` returned an unexpected error.
    ReadFailed {
        /// Direction of the transfer.
        dir: Dir,
        /// The error.
        error: ReadError,
    },
    /// `write`/`send_message` returned an unexpected error.
    WriteFailed {
        /// The writing host.
        host: HostId,
        /// The error.
        error: WriteError,
    },
    /// `connect` failed.
    Connect(ConnectError),
    /// A connection closed with an error although the scenario did not expect it.
    UnexpectedClose {
        /// The host whose connection closed.
        host: HostId,
        /// Why.
        reason: ConnectionError,
    },
    /// B accepted a second connection on the same endpoint.
    UnexpectedConnection {
        /// The accepting host.
        host: HostId,
    },
    /// A host buffered more than the configuration allows.
    MemoryBound {
        /// The host.
        host: HostId,
        /// `send_buffered` or `recv_buffered`.
        what: &'static str,
        /// The value observed.
        value: u64,
        /// The bound.
        limit: u64,
    },
    /// A host sent a datagram larger than the scenario's largest (`Scenario::max_datagram`).
    OversizeDatagram {
        /// The sending host.
        host: HostId,
        /// Its length.
        len: usize,
        /// The scenario's largest datagram.
        max: usize,
    },
    /// The engine did not let simulated time advance.
    Livelock {
        /// The host.
        host: HostId,
        /// What it kept doing.
        what: String,
    },
    /// The engine panicked.
    Panic(String),
    /// The time limit was reached before the transfer completed.
    Timeout {
        /// The limit.
        limit: Duration,
    },
    /// Nothing was left to happen (no timer, no datagram) before the transfer completed.
    Stalled,
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureKind::InvalidScenario(e) => write!(f, "invalid scenario: {e}"),
            FailureKind::Mismatch {
                dir,
                offset,
                expected,
                got,
            } => write!(
                f,
                "{dir}: byte {offset} of the stream is {got:#04x}, {expected:#04x} was sent"
            ),
            FailureKind::MessageMismatch {
                dir,
                index,
                expected_len: None,
                got_len,
                ..
            } => write!(
                f,
                "{dir}: message {index} ({got_len} bytes) received, but only {index} were sent"
            ),
            FailureKind::MessageMismatch {
                dir,
                index,
                expected_len: Some(exp),
                got_len,
                first_difference,
            } => write!(
                f,
                "{dir}: message {index} differs: {got_len} bytes received, {exp} sent, first \
                 difference at {first_difference:?}"
            ),
            FailureKind::TooMuchData {
                dir,
                received,
                expected,
            } => {
                write!(
                    f,
                    "{dir}: {received} bytes received, only {expected} were sent"
                )
            }
            FailureKind::EarlyEnd {
                dir,
                received,
                expected,
            } => write!(
                f,
                "{dir}: end of stream after {received} bytes/messages, {expected} were sent"
            ),
            FailureKind::ReadFailed { dir, error } => write!(f, "{dir}: read failed: {error:?}"),
            FailureKind::WriteFailed { host, error } => {
                write!(f, "host {host}: write failed: {error:?}")
            }
            FailureKind::Connect(e) => write!(f, "connect failed: {e}"),
            FailureKind::UnexpectedClose { host, reason } => {
                write!(
                    f,
                    "host {host}: connection closed unexpectedly: {reason:?} ({reason})"
                )
            }
            FailureKind::UnexpectedConnection { host } => {
                write!(f, "host {host}: a second connection was accepted")
            }
            FailureKind::MemoryBound {
                host,
                what,
                value,
                limit,
            } => {
                write!(f, "host {host}: {what} = {value} exceeds its bound {limit}")
            }
            FailureKind::OversizeDatagram { host, len, max } => {
                write!(f, "host {host} sent a datagram of {len} bytes (max {max})")
            }
            FailureKind::Livelock { host, what } => write!(f, "host {host}: livelock: {what}"),
            FailureKind::Panic(msg) => write!(f, "the engine panicked: {msg}"),
            FailureKind::Timeout { limit } => {
                write!(
                    f,
                    "not complete within the time limit of {limit:?} (simulated)"
                )
            }
            FailureKind::Stalled => {
                write!(
                    f,
                    "stalled: no timer and no datagram left, transfer not complete"
                )
            }
        }
    }
}

/// A failed simulation: what went wrong, when, the scenario to replay it, and the partial report.
///
/// `Debug` prints the same text as `Display`, so `run(&s).unwrap()` shows it readably.
#[derive(Clone)]
pub struct SimError {
    /// What went wrong.
    pub kind: FailureKind,
    /// Simulated time of the failure.
    pub at: Duration,
    /// The scenario (its `seed` and `label` replay it).
    pub scenario: Box<Scenario>,
    /// Measurements up to the failure.
    pub report: Box<Report>,
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.scenario;
        let r = &self.report;
        writeln!(
            f,
            "ri2n-sim: scenario failed at t = {:?} (simulated), seed {}: {}",
            self.at, s.seed, self.kind
        )?;
        writeln!(f, "  replay: {} (seed {})", s.label, s.seed)?;
        r.write_summary(f)?;
        write!(f, "  scenario: {s:#?}")
    }
}

impl fmt::Debug for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for SimError {}
