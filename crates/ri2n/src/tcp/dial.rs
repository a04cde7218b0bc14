//! The dialer: opens a client's links after the first and replaces a dead link's TCP
//! connection (docs/PROTOCOL.md §12.4), by racing connection attempts ([`Race`], which opens
//! a connection's first link too).
//!
//! A new attempt starts every probe interval and each is kept for a while, all at once: a
//! SYN lost during an outage is made up for by the next attempt (the kernel would retry it
//! only after a second), and a path whose round trip is longer than the interval still gets
//! its answer in. How long each attempt is kept follows a ladder ([`patience`]), so that a
//! handful are open at a time and a path of any round trip R opens within about 2R of when
//! it works, with no guess of R: a link never opened has no round trip of its own, and the
//! other links' say nothing of its path.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ri2n_proto::tcp::{Hello, HelloStatus};
use ri2n_proto::ConnectionError;
use socket2::Socket;

use super::conn::TcpConnection;
use super::endpoint::refusal;
use super::link::{attach, closed_by_peer, hello_exchange};
use super::sys;

/// The longest an attempt is kept: the kernel sends its SYN again after a second, so an
/// attempt kept longer would be a second one in disguise.
const LONGEST_ATTEMPT: Duration = Duration::from_secs(1);
/// The least the hello exchange on a new TCP connection may take.
const HELLO_AT_LEAST: Duration = Duration::from_millis(50);
/// Round trips of the path (the new TCP connection's own measure) that the hello exchange
/// may take.
const HELLO_ROUND_TRIPS: u32 = 4;
/// The longest pause before dialling again a link whose hellos are turned away.
const TURNED_AWAY_PAUSE_MAX: Duration = Duration::from_secs(5);

/// Opens the TCP connection of a client's link `l` (racing attempts until one opens or the
/// connection ends) and says hello on it; the watch thread starts another dialer if the
/// hello fails. A connection's first link is opened by `TcpEndpoint::connect`.
pub(super) fn dial(conn: &Arc<TcpConnection>, l: usize, local: SocketAddr, remote: SocketAddr) {
    let hello = Hello {
        connection_id: conn.settings.connection_id,
        link: l as u8,
        new_connection: false,
        keyed: conn.settings.key.is_some(),
        takes_messages: conn.settings.takes_messages,
        window: conn.settings.window,
        application: conn.settings.application.clone(),
    };
    let Some((stream, started)) = race(conn, l, local, remote) else {
        conn.lock().links[l].dialing = false;
        return;
    };
    let rtt = sys::rtt_and_cwnd(&stream).map_or(Duration::ZERO, |r| r.0);
    let res = hello_exchange(
        stream,
        &hello,
        hello_timeout(rtt, conn.settings.probe_interval),
        conn.settings.key.as_ref(),
    );
    let mut st = conn.lock();
    st.links[l].dialing = false;
    st.links[l].next_dial = Instant::now() + conn.settings.probe_interval;
    match res {
        Ok(x) if x.reply.status == HelloStatus::Accepted => {
            st.links[l].refused_since = None;
            st.links[l].turned_away_times = 0;
            if st.links[l].turned_away.take().is_some() {
                tracing::info!(link = l, %remote, "the server takes the link now");
            }
            drop(st);
            let _ = attach(conn, l, x.stream, x.leftover, x.keys);
        }
        // lingering after the end, the ACK and CLOSE go again on the link (`attach`); a
        // server that turns it away ended the connection too, or forgot it
        Ok(x) if x.reply.status != HelloStatus::Accepted && st.end.is_some() => {
            st.close_settled = true;
        }
        Ok(x) if x.reply.status == HelloStatus::UnknownConnection => {
            // the server no longer knows the connection: it restarted, or it ended the
            // connection a moment ago and a link still up carries the CLOSE that says why
            // (its reader ends the connection with that); a restarted host resets those
            // links too, and the next dial finds none up
            if st.links.iter().any(|l| l.connected()) {
                st.links[l].refused_since.get_or_insert_with(Instant::now);
            } else {
                st.end(Some(ConnectionError::PeerRestarted));
                drop(st);
                conn.wake();
            }
        }
        Ok(x) => {
            // the first link was taken, so this address answers for another server, or for
            // this one now full: the link is tried again at the next probe interval
            let why =
                refusal(&x.reply, conn.settings.application.as_deref()).map(|e| e.to_string());
            if why.is_some() && st.links[l].turned_away != why {
                tracing::warn!(link = l, %remote, "the server turned the link away: {}", why.as_deref().unwrap_or_default());
                st.links[l].turned_away = why;
            }
            // a server that says no does not say yes a probe interval later: each dial,
            // a TCP handshake and a hello (and with a key, a key exchange), waits twice as
            // long as the last
            let link = &mut st.links[l];
            link.turned_away_times = link.turned_away_times.saturating_add(1);
            link.next_dial = Instant::now()
                + turned_away_pause(link.turned_away_times, conn.settings.probe_interval);
        }
        Err(e) => note_failure(&mut st.links[l], &e, started),
    }
}

/// One connection attempt in a race.
struct Attempt {
    socket: Socket,
    started: Instant,
    /// When it is given up if still unanswered.
    until: Instant,
}

/// Connection attempts from one local address to one remote, raced (see the module doc).
pub(super) struct Race {
    local: SocketAddr,
    remote: SocketAddr,
    pace: Duration,
    attempts: Vec<Attempt>,
    next_start: Instant,
    /// Attempts started (or due) so far: the next one's place on the ladder.
    started: u32,
}

/// What one [`Race::step`] saw.
pub(super) enum Step {
    /// An attempt started at that time opened: the race is won.
    Open(TcpStream, Instant),
    /// An attempt started at that time failed (refused, no route), or could not start.
    Failed(io::Error, Instant),
    /// An attempt was given up unanswered: the path is silent.
    Unanswered,
    /// Nothing ended before the step's deadline.
    Waiting,
}

impl Race {
    /// A race whose first attempt starts at the first step; a new one every `pace`.
    pub fn new(local: SocketAddr, remote: SocketAddr, pace: Duration) -> Self {
        Self {
            local,
            remote,
            pace,
            attempts: Vec::new(),
            next_start: Instant::now(),
            started: 0,
        }
    }

    /// Starts the attempt that is due, if one is, and then waits, at most until `until` or
    /// the next start, for an attempt to end.
    pub fn step(&mut self, until: Instant) -> Step {
        let now = Instant::now();
        if now >= self.next_start {
            self.next_start = now + self.pace;
            let k = self.started;
            self.started = self.started.wrapping_add(1);
            match sys::start_connect(self.local, self.remote) {
                Ok(socket) => self.attempts.push(Attempt {
                    socket,
                    started: now,
                    until: now + patience(k, self.pace),
                }),
                Err(e) => return Step::Failed(e, now),
            }
        }
        let before = self.attempts.len();
        self.attempts.retain(|a| a.until > now);
        if self.attempts.len() < before {
            return Step::Unanswered;
        }
        let wake =
            (self.attempts.iter().map(|a| a.until)).fold(self.next_start.min(until), Instant::min);
        let sockets: Vec<&Socket> = self.attempts.iter().map(|a| &a.socket).collect();
        let ended = match sys::wait_connects(&sockets, wake.saturating_duration_since(now)) {
            Ok(Some(i)) => self.attempts.swap_remove(i),
            Ok(None) => return Step::Waiting,
            Err(e) => {
                // not a spin if poll keeps failing
                std::thread::sleep(wake.saturating_duration_since(now));
                return Step::Failed(e, now);
            }
        };
        match sys::finish_connect(ended.socket) {
            Ok(stream) => Step::Open(stream, ended.started),
            Err(e) => Step::Failed(e, ended.started),
        }
    }
}

/// Races connection attempts for link `l` until one opens, returning it and when it
/// started; `None` once the connection has ended (and no longer lingers). Each attempt
/// refused, failed or given up is noted on the link (see `Link::refused_since`).
fn race(
    conn: &TcpConnection,
    l: usize,
    local: SocketAddr,
    remote: SocketAddr,
) -> Option<(TcpStream, Instant)> {
    let pace = conn.settings.probe_interval;
    let mut race = Race::new(local, remote, pace);
    loop {
        if !conn.lock().takes_links() {
            return None;
        }
        match race.step(Instant::now() + pace) {
            Step::Open(stream, started) => return Some((stream, started)),
            Step::Failed(e, started) => note_failure(&mut conn.lock().links[l], &e, started),
            // the path is silent, not refusing
            Step::Unanswered => conn.lock().links[l].refused_since = None,
            Step::Waiting => {}
        }
    }
}

/// How long attempt `k` of a race (from 0) is kept, with a new attempt every `pace`: the
/// first as long as any ([`LONGEST_ATTEMPT`]), then every second one 2 paces, every fourth
/// 4, every eighth 8, and so on up to that longest. After a heal, an attempt kept at least
/// as long as the path's round trip starts within that round trip, and about one attempt
/// of each length is open at a time.
fn patience(k: u32, pace: Duration) -> Duration {
    let doublings = k.trailing_zeros().saturating_add(1).min(16);
    (pace * (1 << doublings)).min(LONGEST_ATTEMPT)
}

/// How long a link whose hello was turned away `times` times in a row waits before its next
/// dial: two probe intervals, doubling with each refusal, up to [`TURNED_AWAY_PAUSE_MAX`].
fn turned_away_pause(times: u32, probe_interval: Duration) -> Duration {
    (probe_interval.saturating_mul(1 << times.min(20))).min(TURNED_AWAY_PAUSE_MAX)
}

/// How long the hello exchange on a new TCP connection may take, given the round trip that
/// connection measured while it opened: five probe intervals on a LAN, a few round trips on
/// a long path.
pub(super) fn hello_timeout(rtt: Duration, probe_interval: Duration) -> Duration {
    (HELLO_AT_LEAST.max(probe_interval * 5)).max(rtt * HELLO_ROUND_TRIPS)
}

/// Notes on `link` how an attempt started at `started` failed: the peer's host refusing (or
/// closing the new connection) starts or continues its `refused_since`; anything else (no
/// route, no local address) says the path is out, not the peer.
fn note_failure(link: &mut super::conn::Link, e: &io::Error, started: Instant) {
    link.refused_since = match closed_by_peer(e.kind()) {
        true => link.refused_since.or(Some(started)),
        false => None,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_link_turned_away_waits_twice_as_long_each_time() {
        let waits: Vec<Duration> = (1..=9).map(|k| turned_away_pause(k, ms(20))).collect();
        assert_eq!(
            waits,
            [40, 80, 160, 320, 640, 1280, 2560, 5000, 5000].map(ms)
        );
        assert_eq!(turned_away_pause(u32::MAX, ms(20)), TURNED_AWAY_PAUSE_MAX);
    }

    #[test]
    fn attempts_are_kept_on_a_ladder_of_doubling_lengths() {
        let kept: Vec<Duration> = (0..9).map(|k| patience(k, ms(20))).collect();
        assert_eq!(
            kept,
            [1000, 40, 80, 40, 160, 40, 80, 40, 320].map(ms),
            "the first longest, then 2, 4, 2, 8, ... paces"
        );
        assert_eq!(patience(64, ms(20)), LONGEST_ATTEMPT);
        assert_eq!(patience(1 << 31, ms(20)), LONGEST_ATTEMPT);
        assert_eq!(patience(0, ms(2000)), LONGEST_ATTEMPT);
    }

    /// A path of round trip `rtt` that works from `heal` on: the time from the heal until an
    /// attempt started after it is answered while still kept.
    fn opened_after(rtt: Duration, heal: Duration, pace: Duration) -> Option<Duration> {
        (0u32..10_000)
            .map(|k| (pace * k, patience(k, pace)))
            .filter(|&(start, kept)| start >= heal && kept >= rtt)
            .map(|(start, _)| start + rtt - heal)
            .next()
    }

    #[test]
    fn a_path_of_any_round_trip_opens_within_about_two_of_them() {
        let pace = ms(20);
        for rtt_ms in [1, 15, 30, 70, 110, 250, 600, 1000] {
            let rtt = ms(rtt_ms);
            for heal_ms in (0..3000).step_by(7) {
                let took = opened_after(rtt, ms(heal_ms), pace)
                    .unwrap_or_else(|| panic!("a {rtt_ms} ms path never opened"));
                assert!(
                    took <= (rtt * 2).max(rtt + pace),
                    "a {rtt_ms} ms path healed at {heal_ms} ms opened {took:?} later"
                );
            }
        }
    }

    #[test]
    fn few_attempts_are_open_at_once() {
        let pace = ms(20);
        let most = (0..5000u32)
            .map(|t| {
                let now = pace * t;
                (0..=t)
                    .filter(|&k| pace * k + patience(k, pace) > now)
                    .count()
            })
            .max()
            .unwrap();
        assert_eq!(most, 7, "attempts open at once at most");
    }

    #[test]
    fn the_hello_waits_several_round_trips_of_a_long_path_and_little_on_a_lan() {
        assert_eq!(hello_timeout(Duration::ZERO, ms(20)), ms(100));
        assert_eq!(hello_timeout(Duration::from_micros(150), ms(20)), ms(100));
        assert_eq!(hello_timeout(ms(80), ms(20)), ms(320));
        assert_eq!(hello_timeout(ms(1), ms(100)), ms(500));
        assert_eq!(hello_timeout(ms(1), ms(1)), HELLO_AT_LEAST);
    }
}
