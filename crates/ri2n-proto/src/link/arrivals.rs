//! What a link hears from the peer: when the last packet arrived, and the usual gap between
//! ack-eliciting arrivals, by which a link that only receives notices the peer fell silent.

use std::time::{Duration, Instant};

/// The peer counts as silent on a link after this many of its usual gaps between arrivals.
const SILENCE_GAPS: u32 = 8;

#[derive(Debug, Default)]
pub(crate) struct Arrivals {
    /// When the peer's last packet arrived on this link.
    pub last_heard: Option<Instant>,
    /// When the peer's last packet carrying more than a PING arrived.
    last_sending: Option<Instant>,
    /// The usual gap between such arrivals (moving average).
    gap: Duration,
    /// `SILENCE_GAPS` of them (kept: the timers ask for it several times a packet).
    silence: Duration,
}

impl Arrivals {
    /// A packet arrived; `sending`: it carried more than a PING (see
    /// [`Arrival::sending`](super::Arrival::sending)).
    pub fn on_arrival(&mut self, now: Instant, sending: bool) {
        self.last_heard = Some(now);
        if sending {
            if let Some(prev) = self.last_sending {
                let gap = now.saturating_duration_since(prev);
                self.gap = (self.gap * 7 + gap) / 8;
                self.silence = self.gap * SILENCE_GAPS;
            }
            self.last_sending = Some(now);
        }
    }

    /// A link that only receives (the peer sends, this side acknowledges) has nothing in
    /// flight, so no probe timeout would notice it fail, and it would stay up until the next
    /// keepalive. When the peer's packets stop arriving for much longer than
    /// their usual gap (and at least a `pto`), one PING puts the link under the probe timeout.
    /// Armed again only by a new arrival of more than a PING, so a peer that just stopped
    /// sending costs one PING (and the PING does not arm the peer's rule in turn).
    /// `last_eliciting_sent`: when this side last sent something ack-eliciting.
    pub fn silence_deadline(
        &self,
        last_eliciting_sent: Option<Instant>,
        pto: impl FnOnce() -> Duration,
    ) -> Option<Instant> {
        let heard = self.last_sending?;
        if last_eliciting_sent.is_some_and(|sent| sent >= heard) {
            return None; // the probe timeout watches what was sent since
        }
        Some(heard + self.silence.max(pto()))
    }
}
