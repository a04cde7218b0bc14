//! SIGINT and SIGTERM: a transfer that is interrupted tells its peer (an abort with the
//! signal's name as reason) and exits 128 + the signal number with a message, instead of dying
//! silently and leaving the peer waiting.
//!
//! A thread of its own receives the signals (`signal-hook`); what it does depends on what the
//! command registered: before a connection exists it removes an unfinished output file and
//! exits; once a connection is registered it aborts it, and the command's blocked read or
//! write returns, sees [`caught`] and reports.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use ri2n::Connection;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// What an interrupt acts on.
enum Target {
    Nothing,
    /// An output file that holds nothing yet: removed.
    File(PathBuf),
    /// The transfer's connection: aborted; the command reports.
    Connection(Arc<Connection>),
}

static TARGET: Mutex<Target> = Mutex::new(Target::Nothing);
static CAUGHT: AtomicI32 = AtomicI32::new(0);

/// The signal's name, for messages (the abort code the peer sees is its number).
fn name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

/// Starts watching SIGINT and SIGTERM (once, at the start of `send` and `recv`).
pub fn install() {
    let Ok(mut signals) = Signals::new([SIGINT, SIGTERM]) else {
        return; // the default action stays: the process just ends
    };
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
                    }
                    Target::File(path) => {
                        let _ = std::fs::remove_file(path);
                        exit_now(signal);
                    }
                    Target::Nothing => exit_now(signal),
                }
            }
        })
        .ok();
}

fn exit_now(signal: i32) -> ! {
    crate::progress::clear_line();
    eprintln!("ri2n: interrupted by {}", name(signal));
    std::process::exit(128 + signal);
}

/// An interrupt before the connection exists removes `path` (an output file still empty).
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

/// The failure to report for an interruption, with what the command had done by then.
pub fn failure(signal: i32, done: &str) -> crate::error::Failure {
    crate::error::Failure::new(
        (128 + signal) as u8,
        format!("interrupted by {} {done}; the peer was told", name(signal)),
    )
}
