//! SIGINT and SIGTERM: a transfer that is interrupted tells its peer (an abort with the
//! signal's name as reason) and exits 128 + the signal number with a message, instead of dying
//! silently and leaving the peer waiting.
//!
//! A thread of its own receives the signals (`signal-hook`); what it does depends on what the
//! command registered: before a connection exists it removes an unfinished output file and
//! exits; once a connection is registered it aborts it, and the command's blocked read or
//! write returns, sees [`caught`] and reports (`send` waiting for an idle input looks at the
//! connection as it waits). A command blocked outside the connection (`recv` writing into a
//! stalled pipe) is not woken by the abort: the process ends one second later.
//! `serve` holds many connections: an interrupt aborts them all
//! ([`abort_endpoint_on_interrupt`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ri2n::{Connection, Endpoint};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// What an interrupt acts on.
enum Target {
    Nothing,
    /// An output file that holds nothing of this transfer yet: removed if it is empty (else
    /// it is what an earlier receiver kept).
    File(PathBuf),
    /// The transfer's connection: aborted; the command reports.
    Connection(Arc<Connection>),
}

static TARGET: Mutex<Target> = Mutex::new(Target::Nothing);
static CAUGHT: AtomicI32 = AtomicI32::new(0);
/// The signal, stored by the handler itself, before the signal thread wakes (see [`raised`]).
static RAISED: AtomicI32 = AtomicI32::new(0);
/// The command is reporting the interruption itself (see [`failure`]).
static REPORTING: AtomicBool = AtomicBool::new(false);
/// How long the command has to report an interruption before the signal thread ends the
/// process for it.
const REPORT_GRACE: Duration = Duration::from_secs(1);
/// What is to be told before an interrupt ends the process (see [`before_exit`]).
static LAST_WORDS: Mutex<Vec<Weak<dyn Fn() + Send + Sync>>> = Mutex::new(Vec::new());

/// The signal's name, for messages (the abort code the peer sees is its number).
pub fn name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

/// Starts watching SIGINT and SIGTERM (once, at the start of `send`, `recv` and `demo`).
pub fn install() {
    let Ok(mut signals) = Signals::new([SIGINT, SIGTERM]) else {
        return; // the default action stays: the process just ends
    };
    for signal in [SIGINT, SIGTERM] {
        // SAFETY: the action is an atomic store, which is async-signal-safe.
        let _ = unsafe {
            signal_hook::low_level::register(signal, move || RAISED.store(signal, Ordering::SeqCst))
        };
    }
    std::thread::Builder::new()
        .name("ri2n-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                CAUGHT.store(signal, Ordering::SeqCst);
                let target = std::mem::replace(
                    &mut *TARGET.lock().unwrap_or_else(|e| e.into_inner()),
                    Target::Nothing,
                );
                match target {
                    Target::Connection(conn) => {
                        conn.abort(signal as u64, &format!("interrupted by {}", name(signal)));
                        // A command blocked outside the connection (writing into a stalled
                        // pipe) would not see the abort before that call returns: it gets a
                        // moment to report, then the process ends.
                        std::thread::sleep(REPORT_GRACE);
                        if !REPORTING.load(Ordering::SeqCst) {
                            exit_now(signal, "; the peer was told");
                        }
                    }
                    Target::File(path) => {
                        if std::fs::metadata(&path).is_ok_and(|m| m.len() == 0) {
                            let _ = std::fs::remove_file(path);
                        }
                        exit_now(signal, "");
                    }
                    Target::Nothing => exit_now(signal, ""),
                }
            }
        })
        .ok();
}

/// Which end of a test `serve` or `bench` is, for what an interrupt tells the other.
#[derive(Clone, Copy)]
pub enum End {
    Server,
    Client,
}

/// Starts watching SIGINT and SIGTERM for `serve` and `bench`: every connection of
/// `endpoint` is aborted with the signal's number as the code and "the server (client) was
/// interrupted by SIG…" as the reason, so that each peer reports why its test ended, then
/// the process exits 128 + the signal number.
pub fn abort_endpoint_on_interrupt(endpoint: Endpoint, end: End) {
    let Ok(mut signals) = Signals::new([SIGINT, SIGTERM]) else {
        return; // the default action stays: the process just ends
    };
    std::thread::Builder::new()
        .name("ri2n-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                CAUGHT.store(signal, Ordering::SeqCst);
                let (who, told) = match end {
                    End::Server => ("server", "; its clients were told"),
                    End::Client => ("client", "; the server was told"),
                };
                let reason = format!("the {who} was interrupted by {}", name(signal));
                endpoint.abort(signal as u64, &reason);
                // bench's own threads see their connections end and report the interruption
                // (`failure`); this one ends the process only if they do not come to it
                if let End::Client = end {
                    std::thread::sleep(REPORT_GRACE);
                    if REPORTING.load(Ordering::SeqCst) {
                        return;
                    }
                }
                exit_now(signal, told);
            }
        })
        .ok();
}

/// Has `tell` run when an interrupt ends the process here, before its message, as long as
/// its owner keeps it: what a command would otherwise have told a moment later (refused
/// handshakes). Held weakly, so that what it holds goes with its owner.
pub fn before_exit(tell: &Arc<dyn Fn() + Send + Sync>) {
    let mut words = LAST_WORDS.lock().unwrap_or_else(|e| e.into_inner());
    words.retain(|w| w.strong_count() > 0);
    words.push(Arc::downgrade(tell));
}

fn exit_now(signal: i32, detail: &str) -> ! {
    crate::progress::clear_line();
    let words = LAST_WORDS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for tell in words.iter().filter_map(Weak::upgrade) {
        tell();
    }
    let message = format!("interrupted by {}{detail}", name(signal));
    say!("ri2n: {message}");
    crate::error::print_json_failure(&message, (128 + signal) as u8);
    std::process::exit(128 + signal);
}

/// An interrupt before the connection exists removes `path` if it is empty (an output file
/// nothing was written to).
pub fn remove_on_interrupt(path: PathBuf) {
    *TARGET.lock().unwrap_or_else(|e| e.into_inner()) = Target::File(path);
}

/// An interrupt from now on aborts `conn` (if one already came, at once).
pub fn abort_on_interrupt(conn: Arc<Connection>) {
    let signal = CAUGHT.load(Ordering::SeqCst);
    if signal != 0 {
        conn.abort(signal as u64, &format!("interrupted by {}", name(signal)));
    } else {
        *TARGET.lock().unwrap_or_else(|e| e.into_inner()) = Target::Connection(conn);
    }
}

/// The signal caught, if any: the command then reports an interruption (exit 128 + it).
pub fn caught() -> Option<i32> {
    Some(CAUGHT.load(Ordering::SeqCst)).filter(|&s| s != 0)
}

/// The signal that came, as soon as its handler ran, which may be before the signal thread
/// acted on it ([`caught`]). An end of the input the same signal caused (Ctrl-C to a
/// pipeline ends the program feeding `send` too) is no end of the data: the command looks
/// here before it takes an end for one.
pub fn raised() -> Option<i32> {
    caught().or(Some(RAISED.load(Ordering::SeqCst)).filter(|&s| s != 0))
}

/// The failure to report for an interruption while the command was still connecting: no
/// test had begun.
pub fn failure_while_connecting(signal: i32) -> crate::error::Failure {
    REPORTING.store(true, Ordering::SeqCst);
    crate::error::Failure::new(
        (128 + signal) as u8,
        format!("interrupted by {} while connecting", name(signal)),
    )
}

/// The failure to report for an interruption, with what the command had done by then.
pub fn failure(signal: i32, done: &str) -> crate::error::Failure {
    REPORTING.store(true, Ordering::SeqCst);
    crate::error::Failure::new(
        (128 + signal) as u8,
        format!("interrupted by {} {done}; the peer was told", name(signal)),
    )
}
