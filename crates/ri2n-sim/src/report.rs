//! Measurements of one run: completion, per-direction transfer results and goodput timeline,
//! per-link datagram counters, the link-state and connection-close timelines, buffer peaks, the
//! scenario actions that happened; with helpers to query them over time windows.

use std::fmt;
use std::time::Duration;

use ri2n_proto::{ConnectionError, LinkId, LinkState};

use crate::net::{Dir, DirectionCounters, HostId};
use crate::scenario::Action;

/// Width of a goodput timeline bucket.
pub const BUCKET: Duration = Duration::from_millis(1);

/// Result of one direction of the transfer.
#[derive(Debug, Clone, Default)]
pub struct TransferReport {
    /// Bytes (stream bytes or message bytes) the sending application wrote and the engine took.
    pub written: u64,
    /// Bytes the receiving application read, all checked.
    pub delivered: u64,
    /// Messages the receiving application read (message mode).
    pub messages: u64,
    /// FNV-1a 64 of what was written.
    pub sent_hash: u64,
    /// FNV-1a 64 of what was read.
    pub received_hash: u64,
    /// When the receiver had read everything and both ends of stream.
    pub received_all_at: Option<Duration>,
    /// When the sender's connection reported everything acknowledged.
    pub send_complete_at: Option<Duration>,
    /// Bytes read by the receiving application in each 1 ms bucket of simulated time.
    pub timeline: Vec<u64>,
}

/// Datagram counters of one link, per direction.
#[derive(Debug, Clone, Default)]
pub struct LinkReport {
    /// Direction A→B.
    pub a_to_b: DirectionCounters,
    /// Direction B→A.
    pub b_to_a: DirectionCounters,
    /// Stream payload bytes (STREAM frames, first copies and repairs) delivered per 1 ms
    /// bucket, indexed by [`Dir::index`]: when the link carried data, not just probes.
    /// (Not recorded in keyed scenarios: the frames are sealed.)
    pub stream_timeline: [Vec<u64>; 2],
}

impl LinkReport {
    /// Counters of one direction.
    pub fn dir(&self, dir: Dir) -> &DirectionCounters {
        match dir {
            Dir::AToB => &self.a_to_b,
            Dir::BToA => &self.b_to_a,
        }
    }

    /// Start of the first 1 ms bucket at or after `after` in which stream data arrived over
    /// this link in `dir`.
    pub fn first_stream_delivery(&self, dir: Dir, after: Duration) -> Option<Duration> {
        let tl = &self.stream_timeline[dir.index()];
        let (first, end) = bucket_range(after, Duration::MAX, tl.len());
        (first..end).find(|&i| tl[i] > 0).map(|i| BUCKET * i as u32)
    }

    /// Stream bytes delivered over this link in `dir` in the 1 ms buckets starting in
    /// `[from, to)`.
    pub fn stream_bytes_between(&self, dir: Dir, from: Duration, to: Duration) -> u64 {
        let tl = &self.stream_timeline[dir.index()];
        let (a, b) = bucket_range(from, to, tl.len());
        tl[a..b].iter().sum()
    }
}

/// Stream payload bytes a datagram carries (0 for anything that does not decode: the engine
/// will drop it too).
pub(crate) fn stream_payload(datagram: &[u8]) -> u64 {
    use ri2n_proto::wire::{decode_packet, Frame, Frames, Header};
    match decode_packet(datagram) {
        Ok((Header::Short { .. }, payload)) => Frames::new(payload)
            .map_while(Result::ok)
            .map(|f| match f {
                Frame::Stream { data, .. } => data.len() as u64,
                _ => 0,
            })
            .sum(),
        _ => 0,
    }
}

/// A `LinkStateChanged` event seen by a host's application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkChange {
    /// When.
    pub at: Duration,
    /// Which host's engine reported it.
    pub host: HostId,
    /// The network link (index in `Scenario::links`) the engine's link runs on, when its
    /// addresses match one.
    pub link: Option<usize>,
    /// The engine's own link index.
    pub engine_link: LinkId,
    /// Previous state.
    pub from: LinkState,
    /// New state.
    pub to: LinkState,
}

/// A connection that ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseRecord {
    /// When.
    pub at: Duration,
    /// Which host's connection.
    pub host: HostId,
    /// `None`: a clean close.
    pub reason: Option<ConnectionError>,
}

/// Largest buffer occupation of a host's connection, sampled after every drive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferPeaks {
    /// Largest `stats().send_buffered`.
    pub send_buffered: u64,
    /// Largest `stats().recv_buffered`.
    pub recv_buffered: u64,
}

/// Everything measured in one run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The scenario's seed.
    pub seed: u64,
    /// When every direction was complete (received and acknowledged); `None` if it never was.
    pub completed_at: Option<Duration>,
    /// Simulated time when the run ended.
    pub end_time: Duration,
    /// Events processed by the event loop.
    pub events: u64,
    /// Per direction (index [`Dir::index`]): the transfer.
    pub transfers: [TransferReport; 2],
    /// Per network link: datagram counters.
    pub links: Vec<LinkReport>,
    /// Per host (index [`HostId::index`]): datagrams sent on an address pair no link joins.
    pub no_route: [u64; 2],
    /// Per host: when its connection became established (the `Connected` event).
    pub connected_at: [Option<Duration>; 2],
    /// Link state changes reported to either application, in time order.
    pub link_changes: Vec<LinkChange>,
    /// Connections that ended, in time order.
    pub closes: Vec<CloseRecord>,
    /// Per host: buffer peaks.
    pub buffers: [BufferPeaks; 2],
    /// Per host: the AEAD its connection sealed packets with (`None`: in clear), as last seen.
    pub ciphers: [Option<ri2n_proto::Cipher>; 2],
    /// When host B was restarted.
    pub restarts: Vec<Duration>,
    /// The scenario's actions that happened, with when, in order. A run ends when its transfer
    /// is complete, so an action scheduled later never happens: a test of a fault checks here
    /// that its fault did.
    pub actions: Vec<(Duration, Action)>,
}

impl Report {
    /// The transfer in one direction.
    pub fn transfer(&self, dir: Dir) -> &TransferReport {
        &self.transfers[dir.index()]
    }

    /// Buffer peaks of one host.
    pub fn buffers(&self, host: HostId) -> BufferPeaks {
        self.buffers[host.index()]
    }

    /// Application bytes delivered in `dir` in the 1 ms buckets starting in `[from, to)`.
    pub fn delivered_between(&self, dir: Dir, from: Duration, to: Duration) -> u64 {
        let tl = &self.transfer(dir).timeline;
        let (a, b) = bucket_range(from, to, tl.len());
        tl[a..b].iter().sum()
    }

    /// Application bytes delivered in `dir` before `t` (the 1 ms buckets starting before it):
    /// how far the transfer had got when something happened at `t`.
    pub fn delivered_before(&self, dir: Dir, t: Duration) -> u64 {
        self.delivered_between(dir, Duration::ZERO, t)
    }

    /// Whether the run applied `action` at `at`.
    pub fn applied(&self, at: Duration, action: &Action) -> bool {
        self.actions.iter().any(|(t, a)| *t == at && a == action)
    }

    /// Sum of the goodput timeline of `dir` (equals `transfer(dir).delivered`).
    pub fn timeline_total(&self, dir: Dir) -> u64 {
        self.transfer(dir).timeline.iter().sum()
    }

    /// Goodput A→B in bits per second of application bytes over `[from, to)` (1 ms granularity:
    /// the buckets starting in the window).
    pub fn goodput_bps(&self, from: Duration, to: Duration) -> f64 {
        self.goodput_bps_dir(Dir::AToB, from, to)
    }

    /// Goodput in `dir`, as [`Report::goodput_bps`].
    pub fn goodput_bps_dir(&self, dir: Dir, from: Duration, to: Duration) -> f64 {
        if to <= from {
            return 0.0;
        }
        self.delivered_between(dir, from, to) as f64 * 8.0 / (to - from).as_secs_f64()
    }

    /// Longest run of 1 ms buckets without any delivery in `dir` within `[from, to)`, clipped
    /// to the end of the run.
    pub fn max_delivery_gap(&self, dir: Dir, from: Duration, to: Duration) -> Duration {
        let tl = &self.transfer(dir).timeline;
        // the buckets starting at or before the run's end: those it observed
        let end = to.min(self.end_time + Duration::from_nanos(1));
        let (a, b) = bucket_range(from, end, usize::MAX);
        let (mut best, mut run) = (0u64, 0u64);
        for i in a..b {
            if tl.get(i).copied().unwrap_or(0) == 0 {
                run += 1;
                best = best.max(run);
            } else {
                run = 0;
            }
        }
        BUCKET * best as u32
    }

    /// When `host`'s engine first reported network link `link` entering `to`, at or after `after`.
    pub fn first_state_change(
        &self,
        host: HostId,
        link: usize,
        to: LinkState,
        after: Duration,
    ) -> Option<Duration> {
        self.link_changes
            .iter()
            .find(|c| c.host == host && c.link == Some(link) && c.to == to && c.at >= after)
            .map(|c| c.at)
    }

    /// The first close of `host`'s connection.
    pub fn close_of(&self, host: HostId) -> Option<&CloseRecord> {
        self.closes.iter().find(|c| c.host == host)
    }

    /// A few lines on the outcome (used in failure messages).
    pub fn write_summary(&self, f: &mut dyn fmt::Write) -> fmt::Result {
        writeln!(
            f,
            "  end {:?}, completed {:?}, {} events, connected A {:?} B {:?}, restarts {:?}",
            self.end_time,
            self.completed_at,
            self.events,
            self.connected_at[0],
            self.connected_at[1],
            self.restarts
        )?;
        let skip = self.actions.len().saturating_sub(30);
        if skip > 0 {
            writeln!(f, "  ({skip} earlier actions not shown)")?;
        }
        for (at, a) in &self.actions[skip..] {
            writeln!(f, "  action at {at:?}: {a:?}")?;
        }
        for dir in [Dir::AToB, Dir::BToA] {
            let t = self.transfer(dir);
            writeln!(
                f,
                "  {dir}: written {} delivered {} (messages {}), hashes {:016x}/{:016x}, all \
                 received at {:?}, send complete at {:?}",
                t.written,
                t.delivered,
                t.messages,
                t.sent_hash,
                t.received_hash,
                t.received_all_at,
                t.send_complete_at
            )?;
        }
        for (i, l) in self.links.iter().enumerate() {
            for dir in [Dir::AToB, Dir::BToA] {
                let c = l.dir(dir);
                writeln!(
                    f,
                    "  link {i} {dir}: offered {} delivered {} ({} B); dropped down {} queue {} \
                     loss {} in-flight {} too big {}; corrupted {} duplicated {} reordered {}",
                    c.offered,
                    c.delivered,
                    c.delivered_bytes,
                    c.dropped_down,
                    c.dropped_queue,
                    c.dropped_loss,
                    c.dropped_in_flight,
                    c.dropped_too_big,
                    c.corrupted,
                    c.duplicated,
                    c.reordered
                )?;
            }
        }
        writeln!(
            f,
            "  no route: A {} B {}; buffer peaks A {:?} B {:?}",
            self.no_route[0], self.no_route[1], self.buffers[0], self.buffers[1]
        )?;
        for c in &self.closes {
            writeln!(f, "  close: {c:?}")?;
        }
        let skip = self.link_changes.len().saturating_sub(30);
        if skip > 0 {
            writeln!(f, "  ({skip} earlier link changes not shown)")?;
        }
        for c in &self.link_changes[skip..] {
            writeln!(
                f,
                "  link change at {:?}: host {} link {:?} (engine {}) {:?} -> {:?}",
                c.at, c.host, c.link, c.engine_link, c.from, c.to
            )?;
        }
        Ok(())
    }
}

/// Bucket indices `[a, b)` of the buckets starting in `[from, to)`, clamped to `len`.
fn bucket_range(from: Duration, to: Duration, len: usize) -> (usize, usize) {
    let ns = BUCKET.as_nanos();
    let a = from.as_nanos().div_ceil(ns);
    let b = to.as_nanos().div_ceil(ns);
    let clamp = |x: u128| x.min(len as u128) as usize;
    let (a, b) = (clamp(a), clamp(b));
    (a.min(b), b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    #[test]
    fn goodput_and_gaps() {
        let mut r = Report {
            end_time: ms(10),
            ..Report::default()
        };
        // 1000 bytes in each of buckets 0..10 except 3..7.
        r.transfers[0].timeline = (0..10)
            .map(|i| if (3..7).contains(&i) { 0 } else { 1000 })
            .collect();
        assert_eq!(r.delivered_between(Dir::AToB, ms(0), ms(10)), 6000);
        assert_eq!(r.delivered_between(Dir::AToB, ms(2), ms(8)), 2000);
        assert_eq!(r.delivered_between(Dir::AToB, ms(0), ms(100)), 6000);
        // 6000 bytes in 10 ms = 4.8 Mbit/s.
        assert!((r.goodput_bps(ms(0), ms(10)) - 4.8e6).abs() < 1.0);
        assert_eq!(r.goodput_bps_dir(Dir::BToA, ms(0), ms(10)), 0.0);
        assert_eq!(r.max_delivery_gap(Dir::AToB, ms(0), ms(10)), ms(4));
        assert_eq!(r.max_delivery_gap(Dir::AToB, ms(5), ms(10)), ms(2));
        // Clipped to the end of the run (bucket 10 is the last observed one).
        assert_eq!(r.max_delivery_gap(Dir::AToB, ms(8), ms(1000)), ms(1));
        assert_eq!(r.delivered_before(Dir::AToB, ms(0)), 0);
        assert_eq!(r.delivered_before(Dir::AToB, ms(3)), 3000);
        assert_eq!(r.delivered_before(Dir::AToB, ms(100)), 6000);
        // A run that ends inside a bucket observed none after it: a bucket after the end
        // used to count as a gap.
        r.end_time = Duration::from_micros(10_500);
        r.transfers[0].timeline = vec![1000; 11];
        assert_eq!(r.max_delivery_gap(Dir::AToB, ms(0), ms(1000)), ms(0));
    }

    /// A link's figures count the buckets starting at or after their start, as the
    /// transfer's do: before, a start inside a bucket counted that bucket, so the first
    /// delivery "at or after" 5.5 ms could be at 5 ms.
    #[test]
    fn a_links_figures_start_at_the_bucket_after_their_start() {
        let mut l = LinkReport::default();
        l.stream_timeline[0] = vec![0, 0, 0, 0, 0, 700, 300, 0];
        let at = |us: u64| Duration::from_micros(us);
        assert_eq!(l.first_stream_delivery(Dir::AToB, ms(5)), Some(ms(5)));
        assert_eq!(l.first_stream_delivery(Dir::AToB, at(5500)), Some(ms(6)));
        assert_eq!(l.first_stream_delivery(Dir::AToB, at(6001)), None);
        assert_eq!(l.stream_bytes_between(Dir::AToB, ms(5), ms(7)), 1000);
        assert_eq!(l.stream_bytes_between(Dir::AToB, at(5500), ms(100)), 300);
    }

    #[test]
    fn applied_actions() {
        let r = Report {
            actions: vec![(ms(5), Action::down(1)), (ms(9), Action::up(1))],
            ..Report::default()
        };
        assert!(r.applied(ms(5), &Action::down(1)));
        assert!(r.applied(ms(9), &Action::up(1)));
        assert!(!r.applied(ms(9), &Action::down(1)));
        assert!(!r.applied(ms(5), &Action::down(0)));
    }

    #[test]
    fn state_changes() {
        let change = |at, host, link, to| LinkChange {
            at: ms(at),
            host,
            link: Some(link),
            engine_link: LinkId(link as u8),
            from: LinkState::Up,
            to,
        };
        let r = Report {
            link_changes: vec![
                change(5, HostId::A, 1, LinkState::Down),
                change(8, HostId::B, 1, LinkState::Down),
                change(20, HostId::A, 1, LinkState::Up),
                change(50, HostId::A, 1, LinkState::Down),
            ],
            ..Report::default()
        };
        assert_eq!(
            r.first_state_change(HostId::A, 1, LinkState::Down, ms(0)),
            Some(ms(5))
        );
        assert_eq!(
            r.first_state_change(HostId::A, 1, LinkState::Down, ms(6)),
            Some(ms(50))
        );
        assert_eq!(
            r.first_state_change(HostId::B, 1, LinkState::Down, ms(0)),
            Some(ms(8))
        );
        assert_eq!(
            r.first_state_change(HostId::A, 0, LinkState::Down, ms(0)),
            None
        );
        assert_eq!(
            r.first_state_change(HostId::A, 1, LinkState::Degraded, ms(0)),
            None
        );
    }
}
