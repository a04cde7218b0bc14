//! A link's delivery-rate estimate: the bytes per second it delivers when it is busy, which
//! the scheduler turns into an arrival time for each packet it places.

use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub(crate) struct DeliveryRate {
    /// Bytes acknowledged so far (data packets).
    delivered: u64,
    /// Start of the current sample: (time, `delivered` then).
    sample_start: Option<(Instant, u64)>,
    /// Recent delivery rate in bytes per second (0 until measured).
    rate: f64,
    /// A sample was taken while the link used its window: the rate says what the link can
    /// deliver, not just what it was given.
    measured_busy: bool,
    /// When a sample last set `rate`.
    sampled_at: Option<Instant>,
}

impl DeliveryRate {
    /// A data packet of `bytes` was acknowledged.
    pub fn on_delivered(&mut self, bytes: u64) {
        self.delivered += bytes;
    }

    /// Takes a sample over intervals of at least `srtt`; the estimate follows increases at
    /// once and decreases gradually (a few samples), like a decaying max filter. A link that
    /// is `app_limited` (not using its window) delivers what it is given, not what it can:
    /// its sample may raise the estimate but not lower it.
    pub fn sample(&mut self, now: Instant, srtt: Duration, app_limited: bool) {
        let Some((start, d0)) = self.sample_start else {
            self.sample_start = Some((now, self.delivered));
            return;
        };
        let elapsed = now.saturating_duration_since(start);
        if elapsed < srtt {
            return;
        }
        let sample = (self.delivered - d0) as f64 / elapsed.as_secs_f64();
        self.rate = if app_limited {
            sample.max(self.rate)
        } else {
            self.measured_busy = true;
            sample.max(self.rate * 0.75)
        };
        self.sampled_at = Some(now);
        self.sample_start = Some((now, self.delivered));
    }

    /// The measured rate in bytes per second, if there is one.
    pub fn measured(&self) -> Option<f64> {
        (self.rate > 0.0).then_some(self.rate)
    }

    pub fn measured_busy(&self) -> bool {
        self.measured_busy
    }

    /// When a sample last set the estimate.
    pub fn sampled_at(&self) -> Option<Instant> {
        self.sampled_at
    }

    /// Starts the next sample at `now` (the link starts delivering after a pause).
    pub fn restart(&mut self, now: Instant) {
        self.sample_start = Some((now, self.delivered));
    }

    /// Forgets the estimate (the path may have changed); the byte count goes on.
    pub fn reset(&mut self) {
        self.rate = 0.0;
        self.measured_busy = false;
        self.sampled_at = None;
        self.sample_start = None;
    }
}
