//! Per-link congestion control (NewReno with a gentler 0.7 decrease, as CUBIC uses, and
//! HyStart++ slow start, RFC 9406) and pacing.
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

/// HyStart++ (RFC 9406 §4.3): RTT samples a round needs before its minimum counts.
const HYSTART_RTT_SAMPLES: u32 = 8;
/// HyStart++: bounds of the RTT increase that ends slow start.
const HYSTART_MIN_RTT_THRESH: Duration = Duration::from_millis(4);
const HYSTART_MAX_RTT_THRESH: Duration = Duration::from_millis(16);
/// HyStart++: the RTT increase that ends slow start is the last round's minimum / this.
const HYSTART_MIN_RTT_DIVISOR: u32 = 8;
/// HyStart++: conservative slow start grows the window this many times slower.
const CSS_GROWTH_DIVISOR: u64 = 4;
/// HyStart++: rounds of conservative slow start before congestion avoidance.
const CSS_ROUNDS: u32 = 5;

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
    hystart: HyStart,
}

/// HyStart++ (RFC 9406): slow start ends when the round trip starts to grow, before the
/// bottleneck's queue overflows. A link taken back after an outage starts from the initial
/// window with a round trip measured on an empty path; plain slow start then doubles the
/// window until the queue of the bottleneck (often several milliseconds deep) overflows, and
/// loses hundreds of packets at once.
#[derive(Debug, Clone, Default)]
struct HyStart {
    /// The current round ends with the acknowledgement of a packet sent after this instant
    /// (RFC 9406's `windowEnd`, in send times instead of packet numbers).
    round_start: Option<Instant>,
    last_round_min_rtt: Option<Duration>,
    current_round_min_rtt: Option<Duration>,
    rtt_samples: u32,
    /// In conservative slow start: the round minimum that made slow start end, and the rounds
    /// spent there.
    css: Option<(Duration, u32)>,
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
            hystart: HyStart::default(),
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

    /// `bytes` sent at `sent` were acknowledged at `now`; `in_flight` is what was outstanding
    /// before.
    pub fn on_ack(&mut self, bytes: u64, sent: Instant, now: Instant, in_flight: u64) {
        if self.in_slow_start() {
            self.hystart_round(sent, now);
        }
        if self.recovery_start.is_some_and(|r| sent <= r) {
            return;
        }
        // Only a window that is being used may grow; an application-limited link must not
        // inflate a window it has never tested.
        if in_flight + 2 * self.mss < self.cwnd / 2 {
            return;
        }
        if self.in_slow_start() {
            self.cwnd += if self.hystart.css.is_some() {
                bytes / CSS_GROWTH_DIVISOR
            } else {
                bytes
            };
        } else {
            self.acked_since_growth += bytes;
            if self.acked_since_growth >= self.cwnd {
                self.acked_since_growth -= self.cwnd;
                self.cwnd += self.mss;
            }
        }
    }

    /// HyStart++: a round ends with the acknowledgement of a packet sent after it began.
    fn hystart_round(&mut self, sent: Instant, now: Instant) {
        let h = &mut self.hystart;
        // a packet sent at the very instant the round began (in reply to the acknowledgement
        // that began it) belongs to the new round
        if h.round_start.is_some_and(|start| sent < start) {
            return;
        }
        h.round_start = Some(now);
        h.last_round_min_rtt = h.current_round_min_rtt.take();
        h.rtt_samples = 0;
        if let Some((_, rounds)) = &mut h.css {
            *rounds += 1;
            if *rounds >= CSS_ROUNDS {
                // the window is about right: congestion avoidance from here
                h.css = None;
                self.ssthresh = self.cwnd;
            }
        }
    }

    /// An RTT sample, for HyStart++'s delay-increase detection during slow start.
    pub fn on_rtt_sample(&mut self, rtt: Duration) {
        if !self.in_slow_start() {
            return;
        }
        let h = &mut self.hystart;
        h.current_round_min_rtt = Some(h.current_round_min_rtt.map_or(rtt, |m| m.min(rtt)));
        h.rtt_samples += 1;
        if h.rtt_samples < HYSTART_RTT_SAMPLES {
            return;
        }
        let (Some(current), Some(last)) = (h.current_round_min_rtt, h.last_round_min_rtt) else {
            return;
        };
        match h.css {
            None => {
                let thresh = (last / HYSTART_MIN_RTT_DIVISOR)
                    .clamp(HYSTART_MIN_RTT_THRESH, HYSTART_MAX_RTT_THRESH);
                if current >= last + thresh {
                    // the queue is building: grow gently from here
                    h.css = Some((current, 0));
                }
            }
            // the increase was spurious (the round trip fell back): slow start again
            Some((baseline, _)) if current < baseline => h.css = None,
            Some(_) => {}
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
        self.hystart.css = None;
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

#[cfg(test)]
mod tests {
    use super::*;

    const MSS: usize = 1000;

    /// Runs `rounds` round trips of a window-limited sender whose every packet's round trip is
    /// `rtt(round)`; returns the window after each round.
    fn run_rounds(cc: &mut Congestion, rounds: u32, rtt: impl Fn(u32) -> Duration) -> Vec<u64> {
        let mut now = Instant::now();
        let mut windows = Vec::new();
        for round in 0..rounds {
            let rtt = rtt(round);
            let sent = now;
            now += rtt;
            let packets = cc.window() / MSS as u64;
            for _ in 0..packets {
                // the sender keeps its window full
                let in_flight = cc.window();
                cc.on_ack(MSS as u64, sent, now, in_flight);
                cc.on_rtt_sample(rtt);
            }
            windows.push(cc.window());
        }
        windows
    }

    #[test]
    fn slow_start_doubles_while_the_round_trip_stays_flat() {
        let mut cc = Congestion::new(MSS);
        let w = run_rounds(&mut cc, 6, |_| Duration::from_micros(200));
        assert_eq!(w[5], 10 * MSS as u64 * 64, "{w:?}");
        assert!(cc.in_slow_start());
    }

    #[test]
    fn a_growing_round_trip_ends_slow_start_before_any_loss() {
        let mut cc = Congestion::new(MSS);
        // an empty path for three rounds, then a queue that builds 5 ms per round
        let rtt =
            |r: u32| Duration::from_micros(200) + Duration::from_millis(5) * r.saturating_sub(3);
        let w = run_rounds(&mut cc, 12, rtt);
        // from the round the delay jumped, the window grows by a quarter per round at most
        for pair in w[5..].windows(2) {
            assert!(pair[1] <= pair[0] + pair[0] / 4 + MSS as u64, "{w:?}");
        }
        // and after CSS_ROUNDS rounds of that, congestion avoidance takes over
        assert!(!cc.in_slow_start(), "{w:?}");
        assert!(w[11] < 10 * MSS as u64 * 64, "{w:?}");
    }

    #[test]
    fn a_spurious_delay_increase_resumes_slow_start() {
        let mut cc = Congestion::new(MSS);
        // one round 6 ms slower (a stall), then flat again
        let rtt =
            |r: u32| Duration::from_micros(200) + Duration::from_millis(if r == 3 { 6 } else { 0 });
        let w = run_rounds(&mut cc, 7, rtt);
        assert!(cc.in_slow_start());
        assert_eq!(w[6], 2 * w[5], "{w:?}");
    }
}
