//! Every timer of a connection, declared in one table: [`Connection::poll_timeout`] is the
//! earliest armed one and [`Connection::handle_timeout`] runs each that is due, so what can
//! wake the connection and what happens then are read in one place. (Modelled on quinn-proto's
//! `connection/timer.rs`.)
//!
//! Some timers only make the connection *poll* again: the packet they call for (a
//! retransmitted INITIAL, a probe, a delayed acknowledgement) is built by `poll_transmit`,
//! which checks the same deadlines. A keepalive's deadline costs more to compute, so its
//! timer marks the link owed a PING instead, and `poll_transmit` only looks at the mark.

use std::time::Instant;

use smallvec::SmallVec;

use crate::{ConnectionError, LinkState};

use super::{CloseRepeat, Connection, ConnectionState, HandshakeStage, HoldOver};

/// A timer of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// A CLOSE is still to be sent on some link (due at once).
    CloseSend,
    /// Our own CLOSE goes a second time, on every link.
    CloseRepeat,
    /// Client: the INITIAL is due again (sent by `poll_transmit`).
    HandshakeRetry,
    /// Client: the handshake is given up; server: a client that never confirmed is forgotten.
    HandshakeTimeout,
    /// No link has been up for `all_links_down_timeout`.
    AllLinksDown,
    /// Nothing was received for `idle_timeout` (or, once the application let go of the
    /// connection, its driver's `close_linger`).
    Idle,
    /// The linger after a clean end is over.
    Draining,
    /// The peer closed cleanly but never acknowledged everything we sent.
    PeerClosed,
    /// Pacing lets the next data packet out.
    Pacing,
    /// A stream's head has blocked it long enough to be sent again (by `poll_transmit`).
    Rescue,
    /// The periodic health checks (arrival shares, slow links).
    HealthCheck,
    /// Received datagrams held for an earlier missing one stop waiting.
    DatagramRelease,
    /// The peer's host refused our packets and the peer stayed silent since.
    PeerGone,
    /// A timer of the link at this position.
    Link(usize, LinkTimer),
}

/// A timer of one link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LinkTimer {
    /// Loss detection's time threshold for the oldest waiting packet.
    Loss,
    /// The probe timeout of an up link with packets in flight.
    Pto,
    /// The next probe of a link that is not up (sent by `poll_transmit`).
    Probe,
    /// The delayed acknowledgement of what arrived (sent by `poll_transmit`).
    Ack,
    /// An idle up link's keepalive: owes the link a PING, which `poll_transmit` sends.
    Keepalive,
}

impl Timer {
    /// Whether traffic arms this timer, so that an application call that sends or reads may
    /// set it earlier than it was: loss detection, the probe timeout, a delayed
    /// acknowledgement, pacing, a held datagram, a CLOSE to send. The others move with the
    /// clock alone (keepalives, probes of links that are not up, the periodic health checks,
    /// the handshake's and the connection's limits).
    fn follows_traffic(self) -> bool {
        matches!(
            self,
            Timer::CloseSend
                | Timer::CloseRepeat
                | Timer::Pacing
                | Timer::Rescue
                | Timer::DatagramRelease
                | Timer::Link(_, LinkTimer::Loss | LinkTimer::Pto | LinkTimer::Ack)
        )
    }
}

impl Connection {
    /// Calls `f` with every armed timer and its deadline.
    fn for_each_timer(&self, mut f: impl FnMut(Timer, Instant)) {
        let mut arm = |timer, at: Option<Instant>| {
            if let Some(at) = at {
                f(timer, at);
            }
        };
        if self.state == ConnectionState::Closed {
            arm(
                Timer::CloseSend,
                (!self.closing.sends.is_empty()).then_some(self.last_rx),
            );
            if let CloseRepeat::At(at) = self.closing.repeat {
                arm(Timer::CloseRepeat, Some(at));
            }
            return;
        }
        match &self.handshake.stage {
            HandshakeStage::Client {
                next_initial,
                started,
                ..
            } => {
                arm(Timer::HandshakeRetry, Some(*next_initial));
                arm(
                    Timer::HandshakeTimeout,
                    started.checked_add(self.cfg.handshake_timeout),
                );
                return;
            }
            HandshakeStage::Server { created, .. } => arm(
                Timer::HandshakeTimeout,
                created.checked_add(self.cfg.handshake_timeout),
            ),
            HandshakeStage::Done => {}
        }
        if self.can_send_short() {
            arm(Timer::Draining, self.closing.draining_until);
            arm(Timer::PeerClosed, self.closing.peer_closed_until);
            arm(Timer::PeerGone, self.peer_gone_deadline());
            arm(Timer::Pacing, self.scheduling.pacing_wakeup);
            if let Some(patience) = self.rescue_patience() {
                let due = (self.send.iter().zip(&self.write_wants))
                    .filter_map(|(s, &wants)| s.rescue_deadline(patience, wants));
                arm(Timer::Rescue, due.min());
            }
            for (i, l) in self.links.iter().enumerate() {
                arm(Timer::Link(i, LinkTimer::Loss), l.loss_deadline());
                arm(Timer::Link(i, LinkTimer::Pto), l.pto_deadline(&self.cfg));
                arm(Timer::Link(i, LinkTimer::Probe), l.probe_deadline());
                arm(Timer::Link(i, LinkTimer::Ack), l.ack.timer());
                if l.is_up() {
                    arm(
                        Timer::Link(i, LinkTimer::Keepalive),
                        l.keepalive_deadline(&self.cfg),
                    );
                }
            }
            if self.health_checks_pending() {
                arm(Timer::HealthCheck, Some(self.next_share_check));
            }
            // the rule looks at every link: only worth building while a datagram waits
            if self.datagrams.incoming.holds_any() {
                let release = match self.datagrams.hold_over {
                    HoldOver::No => self.datagrams.incoming.release_deadline(&self.hold_rule()),
                    // an answer ends the wait as it arrives
                    HoldOver::Asked(asked) => Some(asked + self.max_pto()),
                    HoldOver::Outage => None,
                };
                arm(Timer::DatagramRelease, release);
            }
        }
        arm(
            Timer::AllLinksDown,
            self.closing
                .all_down_since
                .zip(self.cfg.all_links_down_timeout)
                .and_then(|(since, limit)| since.checked_add(limit)),
        );
        // (not once the exchange is complete: its linger ends it cleanly by itself)
        let let_go =
            (self.closing.let_go_silence).filter(|_| self.state != ConnectionState::Draining);
        let silence = match (self.cfg.idle_timeout, let_go) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        arm(
            Timer::Idle,
            silence.and_then(|t| self.last_rx.checked_add(t)),
        );
    }

    /// Whether no other link than `i` has proof that the peer answered after `i` fell silent
    /// (see [`Link::heard_after_silence`](crate::link::Link::heard_after_silence)).
    fn peer_silent_but_for(&self, i: usize) -> bool {
        let link = &self.links[i];
        !self
            .links
            .iter()
            .enumerate()
            .any(|(j, other)| j != i && link.heard_after_silence(other))
    }

    /// When [`handle_timeout`](Self::handle_timeout) must run next.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        // its own pass, not `poll_timeouts`: application calls ask this one after every message
        let mut next: Option<Instant> = None;
        self.for_each_timer(|_, at| next = Some(next.map_or(at, |n| n.min(at))));
        next
    }

    /// [`poll_timeout`](Self::poll_timeout), and the earliest of the timers that follow
    /// traffic ([`Timer::follows_traffic`]).
    pub(crate) fn poll_timeouts(&self) -> (Option<Instant>, Option<Instant>) {
        let earliest = |next: Option<Instant>, at: Instant| Some(next.map_or(at, |n| n.min(at)));
        let (mut next, mut traffic) = (None, None);
        self.for_each_timer(|timer, at| {
            next = earliest(next, at);
            if timer.follows_traffic() {
                traffic = earliest(traffic, at);
            }
        });
        (next, traffic)
    }

    /// Runs every timer that is due, in the order of the table.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        let mut due: SmallVec<[Timer; 8]> = SmallVec::new();
        self.for_each_timer(|timer, at| {
            if at <= now {
                due.push(timer);
            }
        });
        for timer in due {
            if timer == Timer::CloseRepeat {
                // on every link, as the first round (`close_targets` says none once Closed)
                self.closing.repeat = CloseRepeat::No;
                self.closing.sends = (0..self.links.len()).collect();
            }
            if self.state == ConnectionState::Closed {
                return;
            }
            self.on_timer(timer, now);
        }
    }

    fn on_timer(&mut self, timer: Timer, now: Instant) {
        match timer {
            // poll_transmit sends what these call for
            Timer::CloseSend
            | Timer::CloseRepeat
            | Timer::HandshakeRetry
            | Timer::Rescue
            | Timer::Link(_, LinkTimer::Probe | LinkTimer::Ack) => {}
            Timer::Link(i, LinkTimer::Keepalive) => self.pings_owed |= 1 << i,
            Timer::HandshakeTimeout => self.handshake_timed_out(),
            Timer::AllLinksDown => self.fail(ConnectionError::AllLinksDown),
            Timer::Idle => self.fail(ConnectionError::IdleTimeout),
            Timer::Draining => {
                self.closing.draining_until = None;
                self.set_closed(None);
            }
            Timer::PeerClosed => self.set_closed(Some(ConnectionError::ClosedEarly)),
            Timer::PeerGone => self.peer_gone(),
            Timer::Pacing => self.scheduling.pacing_wakeup = None,
            Timer::HealthCheck => {
                self.check_arrival_shares();
                self.check_slow_links(now);
                // not armed while the connection was idle: the schedule may lie far behind,
                // and then the next period starts now
                self.next_share_check += self.cfg.share_check_interval;
                if self.next_share_check <= now {
                    self.next_share_check = now + self.cfg.share_check_interval;
                }
            }
            Timer::DatagramRelease => self.on_hold_over(now),
            Timer::Link(i, LinkTimer::Loss) => {
                let mut out = std::mem::take(&mut self.scratch);
                self.links[i].on_loss_timer(now, &mut out);
                self.apply_outcome(now, &mut out);
                self.scratch = out;
                self.down_if_below_base(i, now);
            }
            Timer::Link(i, LinkTimer::Pto) => {
                let peer_silent = self.peer_silent_but_for(i);
                if self.links[i].on_pto_timer(now, &self.cfg, peer_silent) {
                    tracing::debug!(link = i, peer_silent, "no acknowledgement: link down");
                    self.set_link_state(i, now, LinkState::Down);
                }
            }
        }
    }
}
