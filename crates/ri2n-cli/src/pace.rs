//! Pacing of a throughput test's writes to a target rate (`ri2n bench -b`), on whichever end
//! sends: the client, or the server in a reverse test.

use std::time::{Duration, Instant};

/// Writes of a paced sender at most this long at its rate, so that a slow target rate is a
/// stream of small writes rather than a few bursts a transport would see as idle gaps. No
/// floor in bytes: the first write goes at once, and a floor above what the rate moves in a
/// test's time would be most of what it sends.
const BURST: Duration = Duration::from_millis(10);

/// When the bytes written so far may be followed by more: `start` plus the time they take at
/// the target rate.
#[derive(Debug, Clone, Copy)]
pub struct Pacer {
    start: Instant,
    bits_per_second: f64,
}

impl Pacer {
    /// A pacer from `start` at `bits_per_second`; none for no target (or a meaningless one).
    pub fn new(start: Instant, bits_per_second: Option<f64>) -> Option<Self> {
        bits_per_second
            .filter(|r| r.is_finite() && *r > 0.0)
            .map(|bits_per_second| Self {
                start,
                bits_per_second,
            })
    }

    /// Bytes per write: [`BURST`] at the rate, at least one, at most `max`.
    pub fn write_size(&self, max: usize) -> usize {
        let burst = self.bits_per_second / 8.0 * BURST.as_secs_f64();
        (burst as usize).clamp(1.min(max), max)
    }

    /// When the next write may go, `sent` bytes having been written; `None` if that is
    /// further off than the clock reaches.
    pub fn due(&self, sent: u64) -> Option<Instant> {
        let after = Duration::try_from_secs_f64(sent as f64 * 8.0 / self.bits_per_second).ok()?;
        self.start.checked_add(after)
    }

    /// How long to wait before the next write, `sent` bytes having been written, if the
    /// test ends at `end`: zero when it may go now.
    pub fn wait(&self, sent: u64, end: Instant) -> Duration {
        let wake = self.due(sent).map_or(end, |t| t.min(end));
        wake.saturating_duration_since(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_due_at_the_rate() {
        let t0 = Instant::now();
        let p = Pacer::new(t0, Some(8e6)).unwrap();
        assert_eq!(p.due(0), Some(t0));
        assert_eq!(p.due(1_000_000), Some(t0 + Duration::from_secs(1)));
        assert_eq!(p.write_size(65536), 10_000);
        assert_eq!(Pacer::new(t0, Some(1.0)).unwrap().write_size(65536), 1);
        assert_eq!(Pacer::new(t0, Some(8e3)).unwrap().write_size(65536), 10);
        assert_eq!(Pacer::new(t0, Some(1e12)).unwrap().write_size(65536), 65536);
        assert!(Pacer::new(t0, Some(0.0)).is_none());
        assert!(Pacer::new(t0, None).is_none());
        // far beyond the clock: none, and the wait ends with the test
        let slow = Pacer::new(t0, Some(1e-300)).unwrap();
        assert_eq!(slow.due(1 << 20), None);
        assert!(slow.wait(1 << 20, t0) == Duration::ZERO);
    }
}
