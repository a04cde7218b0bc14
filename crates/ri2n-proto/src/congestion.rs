//! Per-link congestion control (NewReno with a gentler 0.7 decrease, as CUBIC uses) and pacing.
//!
//! Each link has its own window, so a link that is slower or more congested than the others
//! carries proportionally less: the striping weights follow from what each link delivers.

use std::time::{Duration, Instant};

/// Multiplicative decrease on a congestion event.
const BETA: f64 = 0.7;
/// Initial window, in datagrams.
const INITIAL_WINDOW_PACKETS: u64 = 10;
/// Smallest window, in datagrams.
const MIN_WINDOW_PACKETS: u64 = 2;

/// A link's congestion window.
#[derive(Debug, Clone)]
pub(crate) struct Congestion {
    mss: u64,
    cwnd: u64,
    ssthresh: u64,
    /// Packets sent before this instant belong to the congestion event already reacted to.
    recovery_start: Option<Instant>,
    /// Bytes acknowledged in congestion avoidance since the window last grew.
    acked_since_growth: u64,
}

impl Congestion {
    pub fn new(mss: usize) -> Self {
        let mss = mss as u64;
        Self {
            mss,
            cwnd: INITIAL_WINDOW_PACKETS * mss,
            ssthresh: u64::MAX,
            recovery_start: None,
            acked_since_growth: 0,
        }
    }

    pub fn window(&self) -> u64 {
        self.cwnd
    }

    /// The full-packet size the window counts in.
    pub fn mss(&self) -> usize {
        self.mss as usize
    }

    pub fn in_slow_start(&self) -> bool {
        self.cwnd < self.ssthresh
    }

    /// `bytes` sent at `sent` were acknowledged; `in_flight` is what was outstanding before.
    pub fn on_ack(&mut self, bytes: u64, sent: Instant, in_flight: u64) {
        if self.recovery_start.is_some_and(|r| sent <= r) {
            return;
        }
        // Only a window that is being used may grow; an application-limited link must not
        // inflate a window it has never tested.
        if in_flight + 2 * self.mss < self.cwnd / 2 {
            return;
        }
        if self.in_slow_start() {
            self.cwnd += bytes;
        } else {
            self.acked_since_growth += bytes;
            if self.acked_since_growth >= self.cwnd {
                self.acked_since_growth -= self.cwnd;
                self.cwnd += self.mss;
            }
        }
    }

    /// A packet sent at `sent` was lost.
    pub fn on_loss(&mut self, sent: Instant, now: Instant) {
        if self.recovery_start.is_some_and(|r| sent <= r) {
            return; // one reduction per round trip
        }
        self.recovery_start = Some(now);
        self.cwnd = ((self.cwnd as f64 * BETA) as u64).max(MIN_WINDOW_PACKETS * self.mss);
        self.ssthresh = self.cwnd;
        self.acked_since_growth = 0;
    }

    /// Full-size packets are `mss` bytes from now on (path MTU discovery): the window keeps
    /// its size in bytes, and grows by the new size per round trip.
    pub fn set_mss(&mut self, mss: usize) {
        self.mss = mss as u64;
        self.cwnd = self.cwnd.max(MIN_WINDOW_PACKETS * self.mss);
    }

    /// The link failed or was demoted: start over as on a new path.
    pub fn reset(&mut self) {
        *self = Self::new(self.mss as usize);
    }
}

/// Token-bucket pacer: spreads a window over a round trip instead of sending it in one burst,
/// so a rate-limited link's queue is not flooded.
#[derive(Debug, Clone)]
pub(crate) struct Pacer {
    tokens: f64,
    last: Option<Instant>,
}

/// Packets a pacer lets out back to back, at least.
const BURST_PACKETS: f64 = 10.0;
/// A pacer also lets out back to back what its rate allows in this time. A driver's timers
/// fire a millisecond or two late (epoll counts in milliseconds, rounding up); with a smaller
/// bucket a fast link would be held to a few packets per timer tick.
const BURST_INTERVAL: Duration = Duration::from_millis(2);

impl Pacer {
    pub fn new(mss: usize) -> Self {
        Self {
            tokens: BURST_PACKETS * mss as f64,
            last: None,
        }
    }

    fn rate(cwnd: u64, srtt: Duration, slow_start: bool) -> f64 {
        let gain = if slow_start { 2.0 } else { 1.25 };
        gain * cwnd as f64 / srtt.as_secs_f64().max(1e-6)
    }

    /// `None` if `size` bytes may leave now, else when they may.
    pub fn delay(
        &mut self,
        now: Instant,
        size: usize,
        mss: usize,
        cwnd: u64,
        srtt: Duration,
        slow_start: bool,
    ) -> Option<Instant> {
        let rate = Self::rate(cwnd, srtt, slow_start);
        let capacity = (BURST_PACKETS * mss as f64).max(rate * BURST_INTERVAL.as_secs_f64());
        let last = self.last.get_or_insert(now);
        if now > *last {
            self.tokens = (self.tokens + rate * (now - *last).as_secs_f64()).min(capacity);
            *last = now;
        }
        if self.tokens >= size as f64 {
            return None;
        }
        let wait = (size as f64 - self.tokens) / rate;
        Some(now + Duration::from_secs_f64(wait).max(Duration::from_nanos(1)))
    }

    pub fn on_sent(&mut self, size: usize) {
        self.tokens -= size as f64;
    }

    /// Starts with a full burst (after a reset or on a fresh link).
    pub fn reset(&mut self, mss: usize) {
        self.tokens = BURST_PACKETS * mss as f64;
        self.last = None;
    }
}
