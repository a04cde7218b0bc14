//! Failures of a command: the one line the user reads and the exit code scripts branch on.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use ri2n::{ConnectError, ConnectionError};

/// Something else went wrong: a file could not be read or written, the demo's data differed.
pub const GENERIC: u8 = 1;
/// A bad option or value (clap's own usage errors also exit with 2).
pub const USAGE: u8 = 2;
/// The connection could not be established: no answer within the handshake timeout, refused,
/// no route, no local address for the peer, authentication failed (the keys differ).
pub const CONNECT: u8 = 3;
/// The connection was lost: the peer restarted or aborted, or every link stayed down past
/// `--all-links-down-timeout`.
pub const LOST: u8 = 4;
/// A local address could not be bound: in use, or not an address of this host.
pub const BIND: u8 = 5;

/// The environment every command reads, at the end of each `--help`.
macro_rules! environment_help {
    () => {
        "

Environment:
  RI2N_KEY_FILE  the key file when --key is not given
  RI2N_LOG       a log filter (`debug`, `ri2n_proto=debug`, ...): the engine's decisions
                 (link state changes and their causes, probe timeouts, losses) are logged
                 on stderr"
    };
}

/// The exit codes of the commands that open one connection, as `--help` lists them.
pub const EXIT_CODES_HELP: &str = concat!(
    "\
Exit codes:
  0  success
  1  other error (reading or writing a file or stdout, received data differs in `demo`)
  2  usage error (unknown option, bad value, unreadable or malformed key file)
  3  connection not established (no answer within --connect-timeout, nothing listening
     there, another kind of ri2n command there (send needs recv, bench needs serve), no
     route, authentication failed: the peer holds another key, or one side has none)
  4  connection lost (peer gone, restarted or aborted, all links down past
     --all-links-down-timeout); send also when the receiver did not acknowledge every byte
     or could not write it out; bench --latency also when a round trip got no echo within
     10 s
  5  cannot bind a local address (address in use, address not on this host)
  130, 143  interrupted by SIGINT, SIGTERM (send, recv and bench abort their connections
     first, serve every client's: the peer is told and reports it)",
    environment_help!()
);

/// `serve`'s exit codes: it runs until a signal stops it, and a client that fails is logged,
/// never the end of the server.
pub const SERVE_EXIT_CODES_HELP: &str = concat!(
    "\
A client that fails (a lost connection, a bad request) is logged on stderr; the server goes on.

Exit codes:
  1  the server could not start (its runtime's threads)
  2  usage error (unknown option, bad value, unreadable or malformed key file)
  5  cannot bind a local address (address in use, address not on this host)
  130, 143  stopped by SIGINT, SIGTERM (every client's connection is aborted first: the
     client is told and reports it)",
    environment_help!()
);

/// Why a command failed.
#[derive(Debug)]
pub struct Failure {
    /// The process exit code.
    pub code: u8,
    /// One line, without the `ri2n: error:` prefix.
    pub message: String,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        // one line, whatever the underlying error printed
        let message = message.into().replace(['\n', '\r'], " ");
        Self { code, message }
    }

    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(USAGE, message)
    }

    /// A local file or pipe failed.
    pub fn io(context: impl std::fmt::Display, e: &io::Error) -> Self {
        Self::new(GENERIC, format!("{context}: {e}"))
    }

    /// Writes `text` to stdout: a failure (a full disk, a reader gone) is one of the
    /// command's, where `print!` would panic.
    pub fn print(text: impl std::fmt::Display) -> Result<(), Self> {
        use std::io::Write as _;
        let mut out = io::stdout().lock();
        (write!(out, "{text}").and_then(|()| out.flush()))
            .map_err(|e| Self::io("cannot write to stdout", &e))
    }

    /// The connection failed while data was moving (an error from read, write or
    /// `wait_acknowledged`).
    pub fn lost(e: &io::Error) -> Self {
        Self::new(LOST, format!("connection lost: {e}"))
    }

    /// The connection ended with `reason`.
    pub fn lost_because(reason: &ConnectionError) -> Self {
        Self::new(LOST, format!("connection lost: {reason}"))
    }

    /// The peer did not answer the handshake in time.
    pub fn no_answer(to: &[SocketAddr], timeout: Duration) -> Self {
        Self::new(
            CONNECT,
            format!(
                "no answer from {} within {:.1} s (is `ri2n recv` or `ri2n serve` running \
                 there, and is it reachable?)",
                list(to),
                timeout.as_secs_f64()
            ),
        )
    }

    /// Setting up an endpoint or a connection failed.
    pub fn endpoint(e: ri2n::Error, to: &[SocketAddr], timeout: Duration) -> Self {
        match e {
            ri2n::Error::Bind { addr, source } => {
                let hint = match source.kind() {
                    io::ErrorKind::AddrInUse => {
                        " (address in use: is another program bound there?)"
                    }
                    io::ErrorKind::AddrNotAvailable => {
                        " (no interface of this host has that address)"
                    }
                    io::ErrorKind::PermissionDenied => {
                        " (permission denied: ports below 1024 need root or CAP_NET_BIND_SERVICE)"
                    }
                    _ => "",
                };
                Self::new(BIND, format!("cannot bind {addr}: {source}{hint}"))
            }
            ri2n::Error::Connect(ConnectError::NoLocalAddress(a)) => Self::new(
                CONNECT,
                format!("no local address can reach {a} (add a --local of the same IP family)"),
            ),
            ri2n::Error::Connect(e) => Self::usage(e.to_string()),
            ri2n::Error::Connection(ConnectionError::TimedOut(_)) | ri2n::Error::TimedOut => {
                Self::no_answer(to, timeout)
            }
            // the handshake goes to the first address; the others are only links to add
            ri2n::Error::Connection(ConnectionError::Refused) => Self::new(
                CONNECT,
                format!(
                    "nothing listens at {} (its host answers \"port unreachable\": is `ri2n \
                     recv` or `ri2n serve` running there, on that port, with the same \
                     --transport?)",
                    list(&to[..to.len().min(1)])
                ),
            ),
            ri2n::Error::Connection(ConnectionError::NotAccepting) => Self::new(
                CONNECT,
                format!(
                    "{} takes no connections: a ri2n program runs there, but not as a server",
                    list(&to[..to.len().min(1)])
                ),
            ),
            ri2n::Error::Connection(ConnectionError::WrongApplication { ours, theirs }) => {
                Self::new(
                    CONNECT,
                    format!(
                        "{} is {}, which this command cannot talk to: it needs {}",
                        list(&to[..to.len().min(1)]),
                        crate::net::Application::describe(&theirs),
                        crate::net::Application::describe(&ours)
                    ),
                )
            }
            ri2n::Error::Connection(ConnectionError::KeyMismatch(m)) => Self::new(
                CONNECT,
                format!(
                    "authentication failed: {m} ({}; every host needs the same --key or \
                     RI2N_KEY_FILE)",
                    list(to)
                ),
            ),
            ri2n::Error::Connection(e) => {
                Self::new(CONNECT, format!("connecting to {} failed: {e}", list(to)))
            }
            // the TCP transport's connect: the host has no way to the peer (no route, an
            // interface down, a firewall's "administratively prohibited"), as a connect that
            // gets no answer is a failure to connect
            ri2n::Error::Io(e) if unreachable(&e) => Self::new(
                CONNECT,
                format!(
                    "cannot reach {}: {e} (is the address right, and a network to it up?)",
                    list(to)
                ),
            ),
            ri2n::Error::Io(e) => Self::new(GENERIC, e.to_string()),
            other => Self::new(GENERIC, other.to_string()),
        }
    }
}

/// Whether a connect failed because this host has no way to the peer.
fn unreachable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::ENETDOWN | libc::EHOSTDOWN)
    )
}

/// `a, b, c`
pub fn list(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The command whose failures are also printed as JSON on stdout (`--json`), once known.
static JSON_FAILURES: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// From now on a failure of `command` is also printed as one JSON object on stdout
/// (`{"command", "error", "exit_code"}`), whichever way the process ends: for a script that
/// asked for `--json`.
pub fn failures_as_json(command: &'static str) {
    let _ = JSON_FAILURES.set(command);
}

/// Prints the failure as JSON on stdout, if the command asked for it.
pub fn print_json_failure(message: &str, code: u8) {
    if let Some(command) = JSON_FAILURES.get() {
        let doc = serde_json::json!({
            "command": command,
            "error": message,
            "exit_code": code,
        });
        // already failing: output that cannot be written is not another failure
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), "{doc}");
    }
}
