//! Serving the daemon's local callers (the status socket) and scrapers (`--metrics`): each
//! client on a thread of its own, at most so many at once (the next closed at once, or
//! waiting its turn), and each held to a deadline for its whole exchange, so that one that
//! reads slowly or not at all holds neither the others nor a thread for longer. A timeout
//! per write would not do: a client reading a little at a time earns a fresh one with every
//! write.

use std::io::{self, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The places of the clients served at once.
#[derive(Clone, Debug)]
pub(crate) struct Places {
    busy: Arc<(Mutex<usize>, Condvar)>,
    max: usize,
}

impl Places {
    pub fn new(max: usize) -> Self {
        Self {
            busy: Arc::new((Mutex::new(0), Condvar::new())),
            max,
        }
    }

    /// Runs `serve` on a thread named `name` in a free place: `false` (nothing run) when
    /// every place is taken, or no thread could be started.
    pub fn serve(&self, name: &str, serve: impl FnOnce() + Send + 'static) -> bool {
        let mut busy = self.lock();
        if *busy >= self.max {
            return false;
        }
        *busy += 1;
        drop(busy);
        self.run(name, serve)
    }

    /// [`Self::serve`], waiting for a free place first: the next clients wait meanwhile in
    /// the listener's queue, each served in its turn as the clients before it are done,
    /// rather than closed unanswered as long as others hold every place.
    pub fn serve_in_turn(&self, name: &str, serve: impl FnOnce() + Send + 'static) -> bool {
        let (_, freed) = &*self.busy;
        let mut busy = self.lock();
        while *busy >= self.max {
            busy = freed.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        *busy += 1;
        drop(busy);
        self.run(name, serve)
    }

    /// Runs `serve` in the place just taken, given back when it ends.
    fn run(&self, name: &str, serve: impl FnOnce() + Send + 'static) -> bool {
        let place = Place(self.busy.clone());
        thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _place = place;
                serve();
            })
            .is_ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, usize> {
        self.busy.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A place taken, given back when dropped (also when its thread could not be started).
struct Place(Arc<(Mutex<usize>, Condvar)>);

impl Drop for Place {
    fn drop(&mut self) {
        let (busy, freed) = &*self.0;
        *busy.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        freed.notify_one();
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
