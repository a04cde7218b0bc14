//! A link's delivery-rate estimate: the bytes per second it delivers when it is busy, which
//! the scheduler turns into an arrival time for each packet it places.

use std::time::{Duration, Instant};

/// Least interval of a sample taken through a standing queue (see
/// [`DeliveryRate::sample`]): long enough to span many acknowledgements at any rate ri2n's
/// links run at.
const QUEUE_SAMPLE: Duration = Duration::from_millis(1);
/// How long samples taken through a standing queue make the estimate alone, after the last
/// one (see [`DeliveryRate::sample`]).
const QUEUE_TRUST: Duration = Duration::from_millis(100);

#[derive(Debug, Default)]
pub(crate) struct DeliveryRate {
    /// Bytes acknowledged so far (data packets).
    delivered: u64,
    /// Start of the current sample: (time, `delivered` then, whether a standing queue
    /// showed the bottleneck busy then).
    sample_start: Option<(Instant, u64, bool)>,
    /// Recent delivery rate in bytes per second (0 until measured).
    rate: f64,
    /// A sample was taken while the link used its window: the rate says what the link can
    /// deliver, not just what it was given.
    measured_busy: bool,
    /// When a sample last set `rate` (or found it standing on samples taken through a queue:
    /// then it is as recent).
    sampled_at: Option<Instant>,
    /// When a sample taken through a standing queue last set `rate`.
    queue_sampled_at: Option<Instant>,
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
    ///
    /// A standing queue at the path's bottleneck (`queued`) through a whole interval is the
    /// exception, and the estimate's best source: the bottleneck delivered at its rate all
    /// along, whatever the window, and a token-bucket shaper in front of it had no tokens
    /// left to let a burst through at line rate (tokens gather only while its queue is
    /// empty). Such samples make the estimate alone while they keep coming (for
    /// [`QUEUE_TRUST`]): the first replaces it, the next are averaged in. They are taken over
    /// intervals of at least [`QUEUE_SAMPLE`] rather than the round trip the queue itself
    /// lengthens, and an interval restarts when a queue forms: what it held before may
    /// include the burst.
    pub fn sample(&mut self, now: Instant, srtt: Duration, app_limited: bool, queued: bool) {
        let Some((start, d0, start_queued)) = self.sample_start else {
            self.sample_start = Some((now, self.delivered, queued));
            return;
        };
        if queued && !start_queued {
            self.sample_start = Some((now, self.delivered, true));
            return;
        }
        let elapsed = now.saturating_duration_since(start);
        // only an interval that a queue spans end to end is short: one that began with a queue
        // and ends without is an ordinary sample, over a round trip like the others
        let least = if start_queued && queued {
            QUEUE_SAMPLE
        } else {
            srtt
        };
        if elapsed < least {
            return;
        }
        let sample = (self.delivered - d0) as f64 / elapsed.as_secs_f64();
        let queue_trusted = self
            .queue_sampled_at
            .is_some_and(|t| now.saturating_duration_since(t) < QUEUE_TRUST);
        self.rate = if start_queued && queued {
            self.measured_busy = true;
            self.queue_sampled_at = Some(now);
            if queue_trusted {
                self.rate + (sample - self.rate) / 4.0
            } else {
                sample
            }
        } else if queue_trusted {
            self.rate
        } else if app_limited {
            sample.max(self.rate)
        } else {
            self.measured_busy = true;
            sample.max(self.rate * 0.75)
        };
        self.sampled_at = Some(now);
        self.sample_start = Some((now, self.delivered, queued));
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
        self.sample_start = Some((now, self.delivered, false));
    }

    /// Forgets the estimate (the path may have changed); the byte count goes on.
    pub fn reset(&mut self) {
        self.rate = 0.0;
        self.measured_busy = false;
        self.sampled_at = None;
        self.queue_sampled_at = None;
        self.sample_start = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    /// A 1 Gbit/s bottleneck's rate in bytes per second.
    const RATE: f64 = 125e6;

    /// Delivers at `rate` for `span`, an acknowledgement every 100 µs, each sampled with
    /// `srtt` and the given judgements; returns the instant it ended.
    fn deliver(
        r: &mut DeliveryRate,
        from: Instant,
        span: Duration,
        rate: f64,
        srtt: Duration,
        app_limited: bool,
        queued: bool,
    ) -> Instant {
        let step = Duration::from_micros(100);
        let mut now = from;
        while now < from + span {
            now += step;
            r.on_delivered((rate * step.as_secs_f64()) as u64);
            r.sample(now, srtt, app_limited, queued);
        }
        now
    }

    fn near(rate: f64, want: f64) -> bool {
        (rate / want - 1.0).abs() < 0.02
    }

    #[test]
    fn samples_of_a_window_it_does_not_use_only_raise_the_estimate() {
        let mut r = DeliveryRate::default();
        let t = deliver(&mut r, Instant::now(), 20 * MS, RATE, 2 * MS, false, false);
        assert!(near(r.measured().unwrap(), RATE) && r.measured_busy());
        // given half as much, the link says nothing of what it can deliver
        deliver(&mut r, t, 20 * MS, RATE / 2.0, 2 * MS, true, false);
        assert!(near(r.measured().unwrap(), RATE), "{:?}", r.measured());
    }

    #[test]
    fn a_standing_queue_measures_a_link_however_little_of_its_window_it_uses() {
        let mut r = DeliveryRate::default();
        // a burst a token bucket let through at line rate, while the queue formed: the
        // app-limited sample raises the estimate to ten times the bottleneck's rate
        let t = deliver(
            &mut r,
            Instant::now(),
            6 * MS,
            10.0 * RATE,
            4 * MS,
            true,
            false,
        );
        assert!(r.measured().unwrap() > 5.0 * RATE && !r.measured_busy());
        // behind the standing queue the bottleneck delivers at its rate: the first sample
        // through it replaces the estimate, within a round trip of the queue's
        deliver(&mut r, t, 4 * MS, RATE, 4 * MS, true, true);
        assert!(near(r.measured().unwrap(), RATE), "{:?}", r.measured());
        assert!(r.measured_busy());
    }

    /// An interval that began with a queue and ends without one is an ordinary sample, taken
    /// over a round trip: before, it closed after 1 ms, and with queued and unqueued
    /// acknowledgements taking turns the estimate came from 1 ms bursts of them.
    #[test]
    fn only_an_interval_a_queue_spans_is_short() {
        let mut r = DeliveryRate::default();
        let start = Instant::now();
        let srtt = 20 * MS;
        r.sample(start, srtt, false, true);
        // a burst acknowledged without a queue, 1.5 ms on
        r.on_delivered((10.0 * RATE * 0.0015) as u64);
        r.sample(start + 3 * MS / 2, srtt, false, false);
        assert_eq!(r.measured(), None, "no sample before a round trip");
        // a queue to its end: a short interval, as before
        let mut r = DeliveryRate::default();
        r.sample(start, srtt, false, true);
        r.on_delivered((RATE * 0.0015) as u64);
        r.sample(start + 3 * MS / 2, srtt, false, true);
        assert!(near(r.measured().unwrap(), RATE), "{:?}", r.measured());
    }

    #[test]
    fn an_interval_restarts_when_a_queue_forms() {
        let mut r = DeliveryRate::default();
        let start = Instant::now();
        r.sample(start, 4 * MS, true, false);
        // a burst before the queue formed, then the queue: the burst is not in the sample
        let t = deliver(&mut r, start, MS / 2, 20.0 * RATE, 4 * MS, true, false);
        deliver(&mut r, t, 3 * MS, RATE, 4 * MS, true, true);
        assert!(near(r.measured().unwrap(), RATE), "{:?}", r.measured());
    }

    #[test]
    fn samples_through_a_queue_are_averaged_and_outlast_other_samples_for_a_while() {
        let mut r = DeliveryRate::default();
        let start = Instant::now();
        r.sample(start, 4 * MS, true, true);
        let t = deliver(&mut r, start, 10 * MS, RATE, 4 * MS, true, true);
        // one short sample twice as fast moves the estimate by a quarter of the difference
        let t = deliver(&mut r, t, MS, 2.0 * RATE, 4 * MS, true, true);
        assert!(
            near(r.measured().unwrap(), 1.25 * RATE),
            "{:?}",
            r.measured()
        );
        // the queue gone, a faster app-limited sample does not override it at once...
        let t = deliver(&mut r, t, 10 * MS, 4.0 * RATE, 4 * MS, true, false);
        assert!(
            near(r.measured().unwrap(), 1.25 * RATE),
            "{:?}",
            r.measured()
        );
        // ...but once the queue's last sample is older than QUEUE_TRUST
        let t = t + QUEUE_TRUST;
        deliver(&mut r, t, 10 * MS, 4.0 * RATE, 4 * MS, true, false);
        assert!(r.measured().unwrap() > 3.0 * RATE, "{:?}", r.measured());
    }
}
