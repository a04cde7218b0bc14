//! Probing a link that is not up (validating, degraded or down): when the next probe goes
//! out, which probes are padded to full size, and when enough were answered to bring the
//! link (back) up. Probes go out every `probe_interval` however long the outage lasted, so
//! recovery time does not grow with it; a link that fails again soon after coming back needs
//! twice as many answered probes (flap damping).

use std::time::{Duration, Instant};

use crate::ConnectionConfig;

/// Probes a link that was never up gets at the normal pace before it is probed slowly.
const UNPROVEN_FAST_PROBES: u32 = 10;
/// Probe interval of a link that was never up and has not answered [`UNPROVEN_FAST_PROBES`].
const UNPROVEN_PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// A link that fails again within this time of coming back is flapping.
const FLAP_WINDOW: Duration = Duration::from_secs(1);
/// Most answered probes flap damping asks for.
const MAX_PROBES_NEEDED: u32 = 32;

#[derive(Debug)]
pub(crate) struct Probing {
    /// When the next probe is due (None while the link is up).
    pub next: Option<Instant>,
    /// Probes answered since the link was created or demoted.
    successes: u32,
    /// Probes unanswered in a row.
    failures: u32,
    /// Answered probes that bring the link up.
    needed: u32,
    /// Probes sent since the link was created or demoted.
    sent: u32,
    /// A full-size probe was acknowledged since the link was created or demoted: the path
    /// carries datagrams of the base size.
    full_acked: bool,
    last_promotion: Option<Instant>,
}

impl Default for Probing {
    /// A new link's: one answered round trip validates it.
    fn default() -> Self {
        Self {
            next: None,
            successes: 0,
            failures: 0,
            needed: 1,
            sent: 0,
            full_acked: false,
            last_promotion: None,
        }
    }
}

impl Probing {
    pub fn last_promotion(&self) -> Option<Instant> {
        self.last_promotion
    }

    pub fn on_promoted(&mut self, now: Instant) {
        self.last_promotion = Some(now);
        self.next = None;
    }

    /// The link left `Up` (or `Validating`): probing starts over, needing more answers if
    /// it is flapping.
    pub fn on_demoted(&mut self, now: Instant, cfg: &ConnectionConfig) {
        let flapping = self
            .last_promotion
            .is_some_and(|p| now.saturating_duration_since(p) < FLAP_WINDOW);
        // twice the last count (a new link's was one answer), but never fewer than any
        // recovery needs, nor cut to the cap below it
        self.needed = if flapping {
            (self.needed * 2)
                .max(cfg.recovery_probes)
                .min(MAX_PROBES_NEEDED.max(cfg.recovery_probes))
        } else {
            cfg.recovery_probes
        };
        self.successes = 0;
        self.failures = 0;
        self.sent = 0;
        self.full_acked = false;
        self.next = Some(now + cfg.probe_interval);
    }

    /// A probe is about to be sent; schedules the next. A link that was never up
    /// (`validating`: an address the peer announced, or one we were given) and has not
    /// answered its first probes is probed slowly: it may not exist at all. A link that
    /// worked keeps the fast pace for as long as it is down, so a heal is noticed within a
    /// probe interval however long the outage lasted.
    pub fn on_sending(&mut self, now: Instant, validating: bool, cfg: &ConnectionConfig) {
        self.sent = self.sent.saturating_add(1);
        let interval = if validating && self.sent > UNPROVEN_FAST_PROBES && self.successes == 0 {
            UNPROVEN_PROBE_INTERVAL.max(cfg.probe_interval)
        } else {
            cfg.probe_interval
        };
        self.next = Some(now + interval);
    }

    /// `n` probes went unanswered for too long. Their loss is not a congestion signal
    /// (probes are outside the window), and it does not reset the answered count: a lossy
    /// link must still be able to come back.
    pub fn on_expired(&mut self, n: u32) {
        self.failures += n;
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Whether the probe just counted by [`Self::on_sending`] is padded to the base size: the
    /// first since the link was created or demoted (unless its address is `unproven`), and
    /// those after an answer (the promotion must see one pass). Probing a dead link, or an
    /// address a peer announced that never answers, costs a few dozen bytes per interval
    /// instead of a full datagram.
    pub fn is_full(&self, unproven: bool) -> bool {
        (self.sent <= 1 && !unproven) || self.successes > 0
    }

    pub fn on_full_probe_acked(&mut self) {
        self.full_acked = true;
    }

    /// `n` probes were answered; returns true when that is enough to bring the link up (one
    /// of them full size).
    pub fn on_acked(&mut self, n: u32) -> bool {
        self.successes += n;
        self.failures = 0;
        self.successes >= self.needed && self.full_acked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link that fails again within a second of coming up needs at least as many answered
    /// probes as a recovery does, twice as many with each flap in a row, up to the cap, whatever
    /// `recovery_probes` is. Before, a new link (one answer) that flapped needed 2 with
    /// `recovery_probes` 5, and a flap cut a `recovery_probes` above 32 down to 32.
    #[test]
    fn a_flapping_link_never_needs_fewer_answers_than_a_recovery() {
        for probes in [1, 2, 5, 20, 40] {
            let cfg = ConnectionConfig::default().with_recovery_probes(probes);
            let cap = MAX_PROBES_NEEDED.max(probes);
            let t0 = Instant::now();
            let mut p = Probing::default();
            let mut t = t0;
            let mut last = 1;
            for flap in 0..6 {
                p.on_promoted(t);
                t += Duration::from_millis(100);
                p.on_demoted(t, &cfg);
                assert!(
                    p.needed >= probes && p.needed <= cap,
                    "recovery_probes {probes}, flap {flap}: {} needed",
                    p.needed
                );
                assert!(p.needed >= (2 * last).min(cap), "flap {flap}: {}", p.needed);
                last = p.needed;
            }
            // a failure long after the last promotion is a recovery again
            p.on_promoted(t);
            p.on_demoted(t + FLAP_WINDOW * 2, &cfg);
            assert_eq!(p.needed, probes);
        }
    }
}
