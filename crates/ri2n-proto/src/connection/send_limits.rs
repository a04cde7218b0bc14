//! What held the sender back: of the time the connection was busy (it had data or datagrams
//! to send, or sent ones not yet acknowledged), how much it spent sending and how much
//! waiting, and for what (the links' congestion windows, pacing, the peer's receive window,
//! acknowledgements to free the send buffer, no link up). The same account Linux keeps for a
//! TCP connection (`tcp_info`'s busy, receive-window-limited and send-buffer-limited times),
//! so that a transfer slower than its links can be told apart: a sender that waited for
//! nothing was held back by its own speed (its CPU, its driver), one that waited for windows
//! by the path or the peer.
//!
//! The state is decided at each of the connection's send decisions (`poll_transmit`), and the
//! time since the last decision is put down to the state that decision found. The totals
//! therefore run up to the last decision: a connection waiting for a window sends nothing and
//! decides nothing until an acknowledgement or a timer comes, and that wait is counted then.

use std::time::{Duration, Instant};

/// How long a connection's sender spent in each state while it was busy; see
/// [`ConnectionStats::send_limits`](crate::ConnectionStats::send_limits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SendLimits {
    /// Nothing held the data back: it went out as fast as the application wrote it and the
    /// connection built its packets (what was sent awaited acknowledgement meanwhile).
    pub sending: Duration,
    /// Every up link's congestion window was full.
    pub congestion_window: Duration,
    /// Pacing held the next packet back (a window had room).
    pub pacing: Duration,
    /// The byte or message stream had data written that the peer's receive window did not
    /// yet let out, and nothing else waited.
    pub peer_window: Duration,
    /// Everything written was sent, and a writer waited for room in the send buffer: for
    /// acknowledgements of what it holds.
    pub send_buffer: Duration,
    /// No link was up.
    pub no_link: Duration,
}

impl SendLimits {
    /// All the time the connection was busy.
    pub fn total(&self) -> Duration {
        self.sending
            + self.congestion_window
            + self.pacing
            + self.peer_window
            + self.send_buffer
            + self.no_link
    }
}

/// What a send decision found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SendState {
    /// Nothing to send and nothing awaiting acknowledgement (or not counted: before the
    /// handshake, after the end).
    Idle,
    Sending,
    CongestionWindow,
    Pacing,
    PeerWindow,
    SendBuffer,
    NoLink,
}

/// The running account behind [`SendLimits`].
#[derive(Debug, Default)]
pub(super) struct SendClock {
    /// The state the last decision found, and when.
    last: Option<(SendState, Instant)>,
    totals: SendLimits,
}

impl SendClock {
    /// A decision at `now` found `state`: the time since the last one goes to what that one
    /// found.
    pub fn enter(&mut self, now: Instant, state: SendState) {
        if let Some((was, since)) = self.last {
            let spent = now.saturating_duration_since(since);
            let t = &mut self.totals;
            match was {
                SendState::Idle => {}
                SendState::Sending => t.sending += spent,
                SendState::CongestionWindow => t.congestion_window += spent,
                SendState::Pacing => t.pacing += spent,
                SendState::PeerWindow => t.peer_window += spent,
                SendState::SendBuffer => t.send_buffer += spent,
                SendState::NoLink => t.no_link += spent,
            }
        }
        self.last = Some((state, now));
    }

    /// The totals up to the last decision.
    pub fn totals(&self) -> SendLimits {
        self.totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_span_goes_to_the_state_that_began_it() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut c = SendClock::default();
        c.enter(ms(0), SendState::Idle);
        c.enter(ms(5), SendState::Sending);
        c.enter(ms(15), SendState::CongestionWindow);
        c.enter(ms(18), SendState::Sending);
        c.enter(ms(20), SendState::Pacing);
        c.enter(ms(21), SendState::PeerWindow);
        c.enter(ms(31), SendState::SendBuffer);
        c.enter(ms(38), SendState::NoLink);
        c.enter(ms(138), SendState::Idle);
        c.enter(ms(500), SendState::Sending);
        let t = c.totals();
        assert_eq!(t.sending, Duration::from_millis(12));
        assert_eq!(t.congestion_window, Duration::from_millis(3));
        assert_eq!(t.pacing, Duration::from_millis(1));
        assert_eq!(t.peer_window, Duration::from_millis(10));
        assert_eq!(t.send_buffer, Duration::from_millis(7));
        assert_eq!(t.no_link, Duration::from_millis(100));
        assert_eq!(
            t.total(),
            Duration::from_millis(133),
            "idle time is not counted"
        );
    }
}
