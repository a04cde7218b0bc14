//! Watches a transfer from its own thread, so that what the user sees does not depend on the
//! data path making progress: the progress line keeps being redrawn while a read or write
//! blocks (a stall shows as a falling rate and links that are down, not as a frozen line), and
//! link state changes are printed as they happen, with or without a progress line.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ri2n::Connection;

use crate::error::Failure;
use crate::progress::Progress;
use crate::report::EventLog;

/// How often the monitor looks at the connection.
const TICK: Duration = Duration::from_millis(50);

/// Which way the data moves, and so what counts as done.
#[derive(Debug, Clone, Copy)]
pub enum Direction {
    /// Done: bytes written that the peer acknowledged.
    Sending,
    /// Done: bytes read.
    Receiving,
}

/// The watching thread of one transfer.
pub struct Monitor {
    /// Bytes the data path wrote (sending) or read (receiving) so far.
    counter: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<EventLog>>,
}

impl Monitor {
    /// Starts watching `conn`; `progress` is drawn (if it is enabled) and `events` collects
    /// and prints the link state changes.
    pub fn start(
        conn: Arc<Connection>,
        direction: Direction,
        mut progress: Progress,
        mut events: EventLog,
    ) -> Result<Self, Failure> {
        let counter = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (counter, stop) = (counter.clone(), stop.clone());
            std::thread::Builder::new()
                .name("ri2n-monitor".into())
                .spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        events.collect(&conn);
                        if progress.due() {
                            // the count first: a write that returned between the two reads
                            // would otherwise show as delivered
                            let count = counter.load(Ordering::Relaxed);
                            let stats = conn.stats();
                            let (done, incoming) = match direction {
                                Direction::Sending => {
                                    (count - stats.send_buffered.min(count), false)
                                }
                                Direction::Receiving => (count, true),
                            };
                            progress.draw(done, &stats.links, incoming);
                        }
                        std::thread::park_timeout(TICK);
                    }
                    progress.finish();
                    events.collect(&conn);
                    events
                })
                .map_err(|e| Failure::io("cannot start a thread", &e))?
        };
        Ok(Self {
            counter,
            stop,
            thread: Some(thread),
        })
    }

    /// Sets the bytes written (sending) or read (receiving) so far.
    pub fn set(&self, bytes: u64) {
        self.counter.store(bytes, Ordering::Relaxed);
    }

    /// Stops watching (the progress line is erased, the last events are printed) and returns
    /// every link event seen. Call it before printing anything else.
    pub fn finish(mut self) -> EventLog {
        self.stop.store(true, Ordering::Release);
        let thread = self.thread.take().expect("finish is called once");
        thread.thread().unpark();
        thread.join().expect("the monitor thread does not panic")
    }
}
