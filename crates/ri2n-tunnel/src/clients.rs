//! Serving the daemon's local callers (the status socket) and scrapers (`--metrics`): each
//! client on a thread of its own, at most so many at once, and each held to a deadline for
//! its whole exchange, so that one that reads slowly or not at all holds neither the others
//! nor a thread for longer. A timeout per write would not do: a client reading a little at a
//! time earns a fresh one with every write.

use std::io::{self, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// The places of the clients served at once.
#[derive(Clone, Debug)]
pub(crate) struct Places {
    busy: Arc<AtomicUsize>,
    max: usize,
}

impl Places {
    pub fn new(max: usize) -> Self {
        Self {
            busy: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// Runs `serve` on a thread named `name` in a free place: `false` (nothing run) when
    /// every place is taken, or no thread could be started.
    pub fn serve(&self, name: &str, serve: impl FnOnce() + Send + 'static) -> bool {
        if self.busy.fetch_add(1, Ordering::Relaxed) >= self.max {
            self.busy.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        let place = Place(self.busy.clone());
        thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _place = place;
                serve();
            })
            .is_ok()
    }
}

/// A place taken, given back when dropped (also when its thread could not be started).
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream whose writes can be given a timeout.
pub(crate) trait TimedWrite: Write {
    fn write_timeout(&self, timeout: Duration) -> io::Result<()>;
}

impl TimedWrite for TcpStream {
    fn write_timeout(&self, timeout: Duration) -> io::Result<()> {
        self.set_write_timeout(Some(timeout))
    }
}

impl TimedWrite for UnixStream {
    fn write_timeout(&self, timeout: Duration) -> io::Result<()> {
        self.set_write_timeout(Some(timeout))
    }
}

/// Writes all of `data` by `deadline`, each write given what is left of it.
pub(crate) fn write_by(
    stream: &mut impl TimedWrite,
    deadline: Instant,
    mut data: &[u8],
) -> io::Result<()> {
    while !data.is_empty() {
        stream.write_timeout(left(deadline)?)?;
        match stream.write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What is left of `deadline`; `TimedOut` once it has passed.
pub(crate) fn left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::ErrorKind::TimedOut.into());
    }
    Ok(left)
}
