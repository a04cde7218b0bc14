//! The impairment layer: a switch on each local socket (so on each link) that can pull the
//! cable, drop a fraction of the datagrams or cap the rate, changed at run time. Tests and the
//! demo use it to break links without root.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use rand::Rng;

/// Impairments applied to one local socket, in both directions.
#[derive(Debug, Default)]
pub struct Impairment {
    down: AtomicBool,
    /// Drop probability in parts per million.
    loss_ppm: AtomicU32,
    /// Rate cap in bits per second (0: none), applied to sends.
    rate_bps: AtomicU64,
    /// Token bucket of the rate cap: (bytes available, last refill).
    bucket: Mutex<Option<(f64, Instant)>>,
}

impl Impairment {
    /// Pulls (`true`) or plugs back (`false`) the cable: nothing is sent or received.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::Relaxed);
    }

    /// Whether the cable is pulled.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// Drops each datagram, sent or received, with probability `p` (0 to 1).
    pub fn set_loss(&self, p: f64) {
        let ppm = (p.clamp(0.0, 1.0) * 1e6) as u32;
        self.loss_ppm.store(ppm, Ordering::Relaxed);
    }

    /// Caps what is sent at `bits_per_second` (`None`: no cap); datagrams over the rate are
    /// dropped, as by a policer.
    pub fn set_rate(&self, bits_per_second: Option<u64>) {
        self.rate_bps
            .store(bits_per_second.unwrap_or(0), Ordering::Relaxed);
        *self.bucket.lock().unwrap() = None;
    }

    /// Whether any impairment is set (the fast path skips the checks otherwise).
    pub(crate) fn is_impaired(&self) -> bool {
        self.is_down()
            || self.loss_ppm.load(Ordering::Relaxed) != 0
            || self.rate_bps.load(Ordering::Relaxed) != 0
    }

    /// Whether a datagram of `len` bytes may be sent.
    pub(crate) fn admit_send(&self, len: usize) -> bool {
        if !self.admit_recv() {
            return false;
        }
        let rate = self.rate_bps.load(Ordering::Relaxed);
        if rate == 0 {
            return true;
        }
        let bytes_per_s = rate as f64 / 8.0;
        // a burst of 64 KiB or 5 ms, whichever is larger, like a shallow switch buffer
        let burst = (bytes_per_s * 0.005).max(65536.0);
        let now = Instant::now();
        let mut b = self.bucket.lock().unwrap();
        let (tokens, last) = b.get_or_insert((burst, now));
        *tokens = (*tokens + bytes_per_s * now.duration_since(*last).as_secs_f64()).min(burst);
        *last = now;
        if *tokens >= len as f64 {
            *tokens -= len as f64;
            true
        } else {
            false
        }
    }

    /// Whether a received datagram passes.
    pub(crate) fn admit_recv(&self) -> bool {
        if self.is_down() {
            return false;
        }
        let ppm = self.loss_ppm.load(Ordering::Relaxed);
        ppm == 0 || rand::thread_rng().gen_range(0..1_000_000) >= ppm
    }
}
