//! What a connection's links are doing: `ri2n_conn_stats` (counters and one record per link),
//! `ri2n_conn_send_limits` (what held its sender back) and `ri2n_conn_events` (links added,
//! up, down, degraded; connected; closed).

use std::ffi::c_char;
use std::time::Instant;

use ri2n::{ConnectionStats, Event, LinkState, LinkStats, SendLimits};

use crate::conn::{conn, ri2n_conn};
use crate::error::{guard_int, guard_len, Failure};

/// Room for any socket address as text, `[IPv6%scope]:port` included, with its NUL.
pub const RI2N_ADDR_LEN: usize = 64;

/// A link's state.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ri2n_link_state {
    /// Newly opened, waiting for its first acknowledgements; carries only probes.
    RI2N_LINK_VALIDATING = 0,
    /// Healthy: carries data.
    RI2N_LINK_UP = 1,
    /// Alive but far slower than it was (a soft failure); carries only probes.
    RI2N_LINK_DEGRADED = 2,
    /// Nothing gets through; probed until it works again.
    RI2N_LINK_DOWN = 3,
}

impl From<LinkState> for ri2n_link_state {
    fn from(s: LinkState) -> Self {
        match s {
            LinkState::Validating => Self::RI2N_LINK_VALIDATING,
            LinkState::Up => Self::RI2N_LINK_UP,
            LinkState::Degraded => Self::RI2N_LINK_DEGRADED,
            LinkState::Down => Self::RI2N_LINK_DOWN,
        }
    }
}

/// One link of a connection.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ri2n_link_stats {
    /// The link's number in its connection.
    pub id: u32,
    /// Its state now.
    pub state: ri2n_link_state,
    /// Local address, e.g. `"10.0.1.1:43122"`.
    pub local: [c_char; RI2N_ADDR_LEN],
    /// Remote address.
    pub remote: [c_char; RI2N_ADDR_LEN],
    /// Smoothed round-trip time, microseconds.
    pub srtt_us: u64,
    /// Smallest round-trip time seen, microseconds.
    pub min_rtt_us: u64,
    /// Congestion window, bytes.
    pub cwnd: u64,
    /// Bytes sent and neither acknowledged nor lost.
    pub bytes_in_flight: u64,
    /// Datagram bytes sent on the link.
    pub bytes_sent: u64,
    /// Datagram bytes received on the link.
    pub bytes_received: u64,
    /// Packets sent.
    pub packets_sent: u64,
    /// Packets received.
    pub packets_received: u64,
    /// Packets declared lost (those re-sent on other links when it failed included).
    pub packets_lost: u64,
    /// Stream bytes sent on the link (first transmissions and repairs).
    pub stream_bytes_sent: u64,
    /// Stream bytes the peer acknowledged in packets sent on this link.
    pub stream_bytes_acked: u64,
    /// Size of a full data packet now (UDP payload bytes).
    pub max_datagram: u64,
}

/// A connection's counters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ri2n_stats {
    /// Links the connection has (of any state).
    pub links: u64,
    /// Bytes written and not yet acknowledged (with their framing, as `bytes_acknowledged`
    /// counts them).
    pub send_buffered: u64,
    /// Bytes received and not yet read (out-of-order data included; with their framing, as
    /// `bytes_received` counts them).
    pub recv_buffered: u64,
    /// Bytes written that the peer acknowledged, each counted once: what was delivered, with
    /// its framing (a message's few bytes of length prefix; on the TCP transport a 5-byte
    /// header per chunk, up to one per write): a count of progress, which runs ahead of the
    /// bytes written when writes or messages are small. `ri2n_wait_acknowledged` tells when
    /// everything written was delivered.
    pub bytes_acknowledged: u64,
    /// Bytes that arrived from the peer in order, each counted once (with their framing, as
    /// `bytes_acknowledged` counts them).
    pub bytes_received: u64,
    /// 1 when packets are sealed with the cluster key, else 0.
    pub encrypted: u32,
    /// Key updates so far, sending.
    pub key_updates_sent: u64,
    /// Key updates so far, receiving.
    pub key_updates_received: u64,
    /// Unreliable datagrams sent.
    pub datagrams_sent: u64,
    /// Datagrams dropped unsent (queue full, too old, no link could carry them).
    pub datagrams_send_dropped: u64,
    /// Datagrams that arrived.
    pub datagrams_received: u64,
    /// Datagrams that arrived and were dropped (not read in time, or a piece was lost).
    pub datagrams_receive_dropped: u64,
}

fn copy_addr(out: &mut [c_char; RI2N_ADDR_LEN], addr: std::net::SocketAddr) {
    let s = addr.to_string();
    let n = s.len().min(RI2N_ADDR_LEN - 1);
    for (o, &b) in out.iter_mut().zip(&s.as_bytes()[..n]) {
        *o = b as c_char;
    }
    out[n] = 0;
}

impl From<&LinkStats> for ri2n_link_stats {
    fn from(l: &LinkStats) -> Self {
        let mut out = Self {
            id: u32::from(l.id.0),
            state: l.state.into(),
            local: [0; RI2N_ADDR_LEN],
            remote: [0; RI2N_ADDR_LEN],
            srtt_us: l.srtt.as_micros() as u64,
            min_rtt_us: l.min_rtt.as_micros() as u64,
            cwnd: l.cwnd,
            bytes_in_flight: l.bytes_in_flight,
            bytes_sent: l.bytes_sent,
            bytes_received: l.bytes_received,
            packets_sent: l.packets_sent,
            packets_received: l.packets_received,
            packets_lost: l.packets_lost,
            stream_bytes_sent: l.stream_bytes_sent,
            stream_bytes_acked: l.stream_bytes_acked,
            max_datagram: l.max_datagram as u64,
        };
        copy_addr(&mut out.local, l.local);
        copy_addr(&mut out.remote, l.remote);
        out
    }
}

impl From<&ConnectionStats> for ri2n_stats {
    fn from(s: &ConnectionStats) -> Self {
        Self {
            links: s.links.len() as u64,
            send_buffered: s.send_buffered,
            recv_buffered: s.recv_buffered,
            bytes_acknowledged: s.bytes_acknowledged,
            bytes_received: s.bytes_received,
            encrypted: u32::from(s.cipher.is_some()),
            key_updates_sent: s.key_updates.0,
            key_updates_received: s.key_updates.1,
            datagrams_sent: s.datagrams_sent,
            datagrams_send_dropped: s.datagrams_send_dropped,
            datagrams_received: s.datagrams_received,
            datagrams_receive_dropped: s.datagrams_receive_dropped,
        }
    }
}

/// Fills `*stats` (unless NULL) with the connection's counters and `links[0..max_links]`
/// (unless NULL) with one record per link; returns how many links the connection has, which
/// may be more than `max_links` (then only the first `max_links` are filled).
///
/// # Safety
/// `c` is a live connection; `stats` is NULL or writable; `links` is NULL or points to
/// `max_links` writable records.
#[no_mangle]
pub unsafe extern "C" fn ri2n_conn_stats(
    c: *const ri2n_conn,
    stats: *mut ri2n_stats,
    links: *mut ri2n_link_stats,
    max_links: usize,
) -> libc::ssize_t {
    guard_len(|| {
        // SAFETY: passed on from the caller
        let c = unsafe { conn(c) }?;
        let now = c.connection().stats();
        // SAFETY: the caller promises NULL or a writable record
        if let Some(out) = unsafe { stats.as_mut() } {
            *out = ri2n_stats::from(&now);
        }
        if !links.is_null() {
            for (i, l) in now.links.iter().take(max_links).enumerate() {
                // SAFETY: the caller promises `max_links` writable records
                unsafe { links.add(i).write(l.into()) };
            }
        }
        Ok(now.links.len())
    })
}

/// Sets `*bytes` to how much of the byte stream the peer acknowledged: the bytes written
/// with `ri2n_write` and its kin that were delivered, each counted once,
/// without messages or any framing (unlike `ri2n_stats.bytes_acknowledged`): the progress
/// of a transfer in the application's own bytes. Returns 0, or `-EINVAL` for a NULL
/// connection or pointer.
///
/// # Safety
/// `c` is a live connection; `bytes` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ri2n_conn_stream_acknowledged(
    c: *const ri2n_conn,
    bytes: *mut u64,
) -> libc::c_int {
    guard_int(|| {
        // SAFETY: passed on from the caller
        let c = unsafe { conn(c) }?;
        // SAFETY: the caller promises NULL or a writable value
        let out = unsafe { bytes.as_mut() }.ok_or_else(|| Failure::invalid("bytes is NULL"))?;
        *out = c.connection().stats().stream_acknowledged;
        Ok(())
    })
}

/// What held a connection's sender back: of the time it was busy (data written and not yet
/// sent, or sent and not yet acknowledged), how long it sent at its own pace and how long it
/// waited, and for what, in microseconds since the connection was made. The same account
/// Linux keeps for a TCP connection in `tcp_info`: a transfer slower than its links that
/// waited for nothing was held back by its own speed (the CPU), one that waited for windows
/// by the path or the peer. A separate record from [`ri2n_stats`], so that programs built
/// against that one keep working. All 0 on the TCP transport, whose kernel connections keep
/// their own.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ri2n_send_limits {
    /// Nothing held the data back: it went out as fast as it was written and packed.
    pub sending_us: u64,
    /// Every up link's congestion window was full.
    pub congestion_window_us: u64,
    /// Pacing held the next packet back (a window had room).
    pub pacing_us: u64,
    /// Data written waited for the peer's receive window, and nothing else waited.
    pub peer_window_us: u64,
    /// Everything written was sent, and a writer waited for room in the send buffer.
    pub send_buffer_us: u64,
    /// No link was up.
    pub no_link_us: u64,
}

impl From<&SendLimits> for ri2n_send_limits {
    fn from(l: &SendLimits) -> Self {
        let us = |d: std::time::Duration| d.as_micros() as u64;
        Self {
            sending_us: us(l.sending),
            congestion_window_us: us(l.congestion_window),
            pacing_us: us(l.pacing),
            peer_window_us: us(l.peer_window),
            send_buffer_us: us(l.send_buffer),
            no_link_us: us(l.no_link),
        }
    }
}

/// Fills `*limits` with what held the connection's sender back so far (see
/// [`ri2n_send_limits`]); returns 0, or `-EINVAL` for a NULL connection or record.
///
/// # Safety
/// `c` is a live connection; `limits` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ri2n_conn_send_limits(
    c: *const ri2n_conn,
    limits: *mut ri2n_send_limits,
) -> libc::c_int {
    guard_int(|| {
        // SAFETY: passed on from the caller
        let c = unsafe { conn(c) }?;
        // SAFETY: the caller promises NULL or a writable record
        let out = unsafe { limits.as_mut() }
            .ok_or_else(|| Failure::invalid("the send limits record is NULL"))?;
        *out = ri2n_send_limits::from(&c.connection().stats().send_limits);
        Ok(())
    })
}

/// What an event reports.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ri2n_event_kind {
    /// The handshake completed.
    RI2N_EVENT_CONNECTED = 0,
    /// A link was added (it starts out validating). Link 0, the one the handshake took,
    /// comes with the connection: `RI2N_EVENT_CONNECTED` tells it, no `LINK_ADDED` does.
    RI2N_EVENT_LINK_ADDED = 1,
    /// A link changed state (`from` → `to`).
    RI2N_EVENT_LINK_STATE = 2,
    /// Everything written and the end of the streams were acknowledged.
    RI2N_EVENT_ALL_ACKNOWLEDGED = 3,
    /// The connection ended: `error` is 0 for a clean close, else its errno.
    RI2N_EVENT_CLOSED = 4,
}

/// One event of a connection.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ri2n_event {
    /// What happened.
    pub kind: ri2n_event_kind,
    /// The link concerned, or -1.
    pub link: i32,
    /// A link's previous state (`RI2N_EVENT_LINK_STATE`).
    pub from: ri2n_link_state,
    /// A link's new state (`RI2N_EVENT_LINK_STATE`; `RI2N_LINK_VALIDATING` when added).
    pub to: ri2n_link_state,
    /// `RI2N_EVENT_CLOSED`: 0 for a clean close, else why, as an errno value.
    pub error: i32,
    /// When it happened, microseconds on `CLOCK_MONOTONIC` (comparable with
    /// `clock_gettime(CLOCK_MONOTONIC)`).
    pub at_us: u64,
}

/// Now on `CLOCK_MONOTONIC`, in microseconds, and the `Instant` it corresponds to.
fn monotonic_now() -> (u64, Instant) {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the live timespec
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let us = ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000;
    (us, Instant::now())
}

fn event_record(event: &Event, at_us: u64) -> Option<ri2n_event> {
    let mut out = ri2n_event {
        kind: ri2n_event_kind::RI2N_EVENT_CONNECTED,
        link: -1,
        from: ri2n_link_state::RI2N_LINK_VALIDATING,
        to: ri2n_link_state::RI2N_LINK_VALIDATING,
        error: 0,
        at_us,
    };
    match event {
        Event::Connected => {}
        Event::LinkAdded { link } => {
            out.kind = ri2n_event_kind::RI2N_EVENT_LINK_ADDED;
            out.link = i32::from(link.0);
        }
        Event::LinkStateChanged { link, from, to } => {
            out.kind = ri2n_event_kind::RI2N_EVENT_LINK_STATE;
            out.link = i32::from(link.0);
            out.from = (*from).into();
            out.to = (*to).into();
        }
        Event::AllAcknowledged => out.kind = ri2n_event_kind::RI2N_EVENT_ALL_ACKNOWLEDGED,
        Event::Closed(reason) => {
            out.kind = ri2n_event_kind::RI2N_EVENT_CLOSED;
            out.error = reason.as_ref().map_or(0, ri2n::errno_of);
        }
        // readiness is a level, seen through the calls and ri2n_conn_fd, never queued
        _ => return None,
    }
    Some(out)
}

/// Events kept for a caller of [`ri2n_conn_events`] that takes fewer than come, as many as the
/// library keeps for one that never asks.
const MAX_KEPT_EVENTS: usize = 4096;

/// Moves the connection's events since the last call into `events[0..max]`, oldest first;
/// returns how many it wrote. Events that do not fit wait for the next call (the newest 4096
/// of them: older ones are dropped). An application
/// that calls this rarely (its writes blocked while every link was down, say) still learns
/// what happened meanwhile, with when.
///
/// # Safety
/// `c` is a live connection; `events` points to `max` writable records.
#[no_mangle]
pub unsafe extern "C" fn ri2n_conn_events(
    c: *mut ri2n_conn,
    events: *mut ri2n_event,
    max: usize,
) -> libc::ssize_t {
    guard_len(|| {
        // SAFETY: passed on from the caller
        let c = unsafe { conn(c) }?;
        if events.is_null() && max > 0 {
            return Err(Failure::invalid("the event array is NULL"));
        }
        let mut queue = c.events.lock().unwrap_or_else(|p| p.into_inner());
        queue.extend(c.connection().poll_events());
        // the oldest go beyond the library's own bound: a caller that takes fewer than come
        // (a link flapping, `max` 0) must not grow memory without end
        let excess = queue.len().saturating_sub(MAX_KEPT_EVENTS);
        queue.drain(..excess);
        let (now_us, now) = monotonic_now();
        let mut written = 0;
        while written < max {
            let Some(timed) = queue.pop_front() else {
                break;
            };
            let ago = now.saturating_duration_since(timed.at).as_micros() as u64;
            if let Some(record) = event_record(&timed.event, now_us.saturating_sub(ago)) {
                // SAFETY: the caller promises `max` writable records; `written` < `max`
                unsafe { events.add(written).write(record) };
                written += 1;
            }
        }
        Ok(written)
    })
}
