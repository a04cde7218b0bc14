//! One connection: its handshake, links, streams, timers and the packets it builds.
//!
//! The [`Endpoint`](crate::Endpoint) routes datagrams here by connection ID; this module decides
//! what each packet carries and on which link. Data is striped over every `Up` link (each
//! filling its own congestion window, lowest RTT first); acknowledgements and control frames
//! ride on any link; what a failed link had in flight is re-sent on the others.
//!
//! A `Connection`'s state is grouped by concern: `Handshake` (the handshake and what it
//! settles: connection IDs, the peer's parameters, the keys), `Closing` (how it ends),
//! `Datagrams` (unreliable datagrams and their hold-over) and `Scheduling` (what the choice of
//! the next packet carries over); the links, the streams, the control frames owed and the
//! events stay at its top. The submodules add to it by concern: `packets` (what goes out),
//! `scheduler` (on which link), `timers` (every timer, in one table), `health` (the link health
//! checks).

mod health;
mod packets;
mod scheduler;
mod send_limits;
mod timers;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use smallvec::SmallVec;

use crate::addr;
use crate::crypto::{Cipher, ClientHandshake, Key, Opened, PacketProtection, MAX_AUTH_FAILURES};
use crate::datagrams::{Bounds, HoldRule, IncomingDatagrams, OutgoingDatagrams};
use crate::link::{AckOutcome, Arrival, Link, SentFrame};
use crate::streams::{RecvStream, SendStream, MAX_FRAGMENTS};
use crate::wire::{self, Frame, Frames, Writer};
use crate::{
    ConnectionConfig, ConnectionError, DropReason, Event, LinkId, LinkState, LinkStats, ReadError,
    WriteError,
};
use send_limits::SendClock;
pub use send_limits::SendLimits;

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionState {
    /// Handshake under way.
    Connecting,
    /// Data flows.
    Established,
    /// Everything was sent, acknowledged and received in both directions; the connection
    /// lingers briefly to acknowledge the peer's last retransmissions.
    Draining,
    /// Ended; [`Connection::close_reason`] says why (`None`: a clean close).
    Closed,
}

/// Statistics of a connection.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectionStats {
    /// Per-link statistics.
    pub links: Vec<LinkStats>,
    /// Bytes written by the application and not yet acknowledged (both streams, with their
    /// framing as `bytes_acknowledged` counts it).
    pub send_buffered: u64,
    /// Bytes received and not yet read by the application (both streams, including
    /// out-of-order data, with their framing as `bytes_acknowledged` counts it).
    pub recv_buffered: u64,
    /// Out-of-order fragments the receiving streams hold (at most 4096 each): the
    /// reassembly bookkeeping, bounded however the peer scatters its data.
    pub recv_fragments: usize,
    /// Bytes written by the application that the peer acknowledged, each counted once
    /// however often it was sent: what was delivered (both streams; a message counts with
    /// its few bytes of length prefix, and on the TCP transport every chunk with its 5-byte
    /// header).
    pub bytes_acknowledged: u64,
    /// Of `bytes_acknowledged`, the byte stream's own bytes: what the application wrote to
    /// the stream (messages and all framing left out) that the peer acknowledged.
    pub stream_acknowledged: u64,
    /// Bytes that arrived from the peer in order (read or not), each counted once: what the
    /// peer delivered to this side (both streams, like `bytes_acknowledged`).
    pub bytes_received: u64,
    /// The AEAD sealing the connection's packets; `None`: not encrypted (no key).
    pub cipher: Option<Cipher>,
    /// Key updates so far (sending, receiving): each direction moves to a new key after
    /// 2^22 packets or 120 s.
    pub key_updates: (u64, u64),
    /// Packets opened before they reached the engine, by the thread that received them
    /// ([`Endpoint::handle_opened_datagram`](crate::Endpoint::handle_opened_datagram)), and
    /// accepted: with a key, the driver opens in parallel with the engine's other work.
    pub packets_opened_ahead: u64,
    /// Unreliable datagrams sent (each counted once, when it or its last piece went).
    pub datagrams_sent: u64,
    /// Datagrams, and pieces of datagrams larger than a packet, sent again because the link
    /// carrying them failed.
    pub datagrams_resent: u64,
    /// Datagrams dropped unsent: the send queue was full, or they waited too long; or sent
    /// (counted in `datagrams_sent` too), then stranded on a failed link and dropped: the
    /// queue was full, or no link could carry them any more. Once per datagram, not per
    /// piece.
    pub datagrams_send_dropped: u64,
    /// Datagrams that arrived, whole or in part (one that lost a piece counts once it is
    /// completed by a late one or let go: PROTOCOL.md §5.9).
    pub datagrams_received: u64,
    /// Datagrams that arrived and were dropped: the application had not read the earlier
    /// ones, or a piece of a datagram larger than a packet was lost (and did not come late
    /// within the receiver's patience).
    pub datagrams_receive_dropped: u64,
    /// Datagrams (or pieces) that arrived ahead of an earlier one and were held to restore
    /// the order.
    pub datagrams_reordered: u64,
    /// Second copies that arrived (a datagram sent again after a link failure that had
    /// arrived after all): not delivered.
    pub datagrams_duplicate: u64,
    /// Datagrams held now for an earlier one, and datagrams ready for the application.
    pub datagrams_waiting: (usize, usize),
    /// Datagrams queued to be sent now (one partly sent counts), and their bytes not sent
    /// yet: what a datagram queued now waits behind, besides the links' windows.
    pub datagrams_queued: (usize, u64),
    /// Of the time the connection was busy (something to send or awaiting acknowledgement),
    /// how long it sent and how long it waited, and for what (up to its last send decision;
    /// zero on the TCP transport, which leaves the sending to the kernel).
    pub send_limits: SendLimits,
}

impl ConnectionStats {
    /// Statistics with these links and every count zero, for a transport outside this
    /// engine (the TCP transport) to fill in.
    pub fn new(links: Vec<LinkStats>) -> Self {
        Self {
            links,
            send_buffered: 0,
            recv_buffered: 0,
            recv_fragments: 0,
            bytes_acknowledged: 0,
            stream_acknowledged: 0,
            bytes_received: 0,
            cipher: None,
            key_updates: (0, 0),
            packets_opened_ahead: 0,
            datagrams_sent: 0,
            datagrams_resent: 0,
            datagrams_send_dropped: 0,
            datagrams_received: 0,
            datagrams_receive_dropped: 0,
            datagrams_reordered: 0,
            datagrams_duplicate: 0,
            datagrams_waiting: (0, 0),
            datagrams_queued: (0, 0),
            send_limits: SendLimits::default(),
        }
    }
}

/// Byte stream and message stream numbers.
const BYTE_STREAM: usize = 0;
const MESSAGE_STREAM: usize = 1;
/// First INITIAL retransmission delay (then every `probe_interval`, PROTOCOL.md §4.1).
const INITIAL_RETRY: Duration = Duration::from_millis(200);
/// How long a client holds a cookie before a RETRY with another may replace it: longer than
/// the round trip of any path it is meant for, so that the RETRYs answering the INITIALs sent
/// before the first cookie came have all arrived.
const TOKEN_RENEWAL: Duration = Duration::from_secs(1);
/// CLOSE code of a connection that ended cleanly: "everything you sent arrived".
pub(crate) const CLOSE_DONE: u64 = 0;
/// CLOSE code of an error other than an application abort.
const CLOSE_ERROR: u64 = 1;
/// Application abort codes travel as `code + CLOSE_APP_BASE`, so that no application code
/// can be mistaken for a clean close or an engine error.
const CLOSE_APP_BASE: u64 = 16;
/// The largest abort code that reaches the peer as given ([`Connection::abort`]); a larger
/// one is sent as this one. (It travels with a base added, in a variable-length integer.)
pub const MAX_ABORT_CODE: u64 = wire::VARINT_MAX - CLOSE_APP_BASE;
/// Our own CLOSE (an abort, a failure) goes once more this long after its first copies, at
/// least (the links' largest smoothed round trip when longer, up to [`CLOSE_REPEAT_MAX`]): a
/// queue that was full when the first copies came, on the way or at the peer (a sender that
/// was sending flat out up to its abort fills the peer's socket queues), has drained by then.
const CLOSE_REPEAT_MIN: Duration = Duration::from_millis(5);
const CLOSE_REPEAT_MAX: Duration = Duration::from_millis(100);
/// Most application events kept when the application does not collect them.
const MAX_EVENTS: usize = 1024;
/// Least time a connection keeps repairing after the peer confirmed a clean end that its
/// acknowledgements do not yet prove (PROTOCOL.md §8.2).
const PEER_CLOSED_GRACE: Duration = Duration::from_millis(200);
/// "Port unreachable" answers that end a handshake.
const REFUSALS_TO_GIVE_UP: u32 = 3;
/// How long the peer must have been silent before a "port unreachable" ends an established
/// connection: longer than a working peer is ever silent (keepalives, acknowledgements),
/// short enough that a vanished one is reported within a second or so.
const PEER_GONE_SILENCE: Duration = Duration::from_millis(500);

/// One ri2n connection.
#[derive(Debug)]
pub struct Connection {
    /// The deadline under which the endpoint's timer index holds this connection, if any:
    /// kept here, so that updating the index looks nothing up.
    pub(crate) indexed_deadline: Option<Instant>,
    /// The same for its next timer that traffic arms.
    pub(crate) indexed_traffic_deadline: Option<Instant>,
    /// Its application let go of it after a clean end, and its endpoint keeps it only to
    /// confirm that end to a peer that missed it ([`crate::Endpoint::release`]).
    pub(crate) released: bool,
    cfg: ConnectionConfig,
    state: ConnectionState,
    handshake: Handshake,
    closing: Closing,
    /// Largest datagram each local address can send (path MTU discovery's ceilings).
    local_mtus: Vec<(SocketAddr, usize)>,
    links: Vec<Link>,
    send: [SendStream; 2],
    recv: [RecvStream; 2],
    max_data_pending: [bool; 2],
    link_status_pending: Vec<(LinkId, u8)>,
    ping_pending: Option<usize>,
    /// Up links owed a PING (bit per link position): their keepalive fell due, or we must
    /// learn whether the peer can reach us.
    pings_owed: u32,
    events: VecDeque<Event>,
    readable_signalled: bool,
    datagrams: Datagrams,
    /// Blocked writers, per stream: the least room one of them waits for (`writer_waits`).
    /// One per stream, so that a writer blocked on one stream does not erase the wake-up of
    /// another's.
    write_wants: [Option<u64>; 2],
    /// Per stream: [`Event::Writable`] was reported for its blocked writer, and no write to
    /// the stream took the room since (the writer has yet to retry; `write_to`).
    writer_told: [bool; 2],
    /// [`Event::AllAcknowledged`] was emitted.
    all_acknowledged: bool,
    scheduling: Scheduling,
    /// What held the sender back, over the connection's life.
    send_clock: SendClock,
    last_rx: Instant,
    next_share_check: Instant,
    scratch: AckOutcome,
}

/// The handshake and what it settles for the connection's life: where the handshake stands,
/// both sides' connection IDs, the peer's instance and parameters, and the keys.
#[derive(Debug)]
struct Handshake {
    /// Where the handshake stands: a client's or a server's, or done.
    stage: HandshakeStage,
    local_cid: u64,
    /// The peer's connection ID (0 until a client learns it from the ACCEPT).
    peer_cid: u64,
    /// The run of the peer's endpoint: a new one from the same address means it restarted.
    peer_instance: u64,
    /// The receive window the peer announced in the handshake.
    peer_window: u64,
    /// What the peer takes besides the byte stream ([`wire::accepts`] bits; all until a
    /// client hears the server's parameters).
    peer_accepts: u8,
    /// The keys sealing and opening short packets (connections of keyed endpoints).
    protection: Option<PacketProtection>,
    /// A server connection was confirmed and the endpoint has not yet been told.
    confirmed_now: bool,
}

impl Handshake {
    /// A handshake at `stage`, the peer's parameters as far as known (0 until learnt), the
    /// peer taken to accept everything until it says otherwise, and no keys yet.
    fn new(
        stage: HandshakeStage,
        local_cid: u64,
        peer_cid: u64,
        peer_instance: u64,
        peer_window: u64,
    ) -> Self {
        Self {
            stage,
            local_cid,
            peer_cid,
            peer_instance,
            peer_window,
            peer_accepts: wire::accepts::MESSAGES | wire::accepts::DATAGRAMS,
            protection: None,
            confirmed_now: false,
        }
    }

    /// Whether the connection is sealed, or will be: it has keys, or it is a client whose
    /// handshake runs with a key.
    fn is_keyed(&self) -> bool {
        self.protection.is_some()
            || matches!(self.stage, HandshakeStage::Client { key: Some(_), .. })
    }

    /// A server side whose client has not yet confirmed (see
    /// [`Connection::is_unconfirmed_server`]).
    fn is_unconfirmed_server(&self) -> bool {
        matches!(self.stage, HandshakeStage::Server { .. })
    }
}

/// Where a connection's handshake stands.
#[derive(Debug)]
enum HandshakeStage {
    Client {
        /// Addresses the application gave (the first is where the handshake goes first).
        remotes: Vec<SocketAddr>,
        /// The address pairs the INITIALs may take: one per given address that has a local
        /// address to pair with (docs/PROTOCOL.md §4.1), the first link 0's at the start.
        /// Until a RETRY arrives the retransmissions take them in turn, so that a first
        /// path that is down at the start does not keep the connection from the others; the
        /// pair the RETRY came back on becomes link 0's (its cookie is bound to it).
        paths: Vec<HandshakePath>,
        /// The path the next INITIAL without a cookie takes.
        next_path: usize,
        token: Vec<u8>,
        next_initial: Instant,
        backoff: Duration,
        started: Instant,
        /// When the first INITIAL with the current token was sent. The ACCEPT answers one of
        /// them, which one is unknown (they are re-sent faster than a long round trip), so
        /// the time since the first is the RTT sample: never too small, which would make
        /// probe timeouts fire before any acknowledgement can arrive.
        first_sent: Option<Instant>,
        /// The INITIAL's mode ([`wire::handshake_mode`]) and `hello`: empty until the RETRY's
        /// cookie arrives, then the parameters in clear or the first Noise message (bound to
        /// that cookie), sent unchanged in every later INITIAL.
        mode: u8,
        hello: Vec<u8>,
        /// The client parameters, for the hello.
        params: Vec<u8>,
        /// The cluster key, if the endpoint holds one: the handshake starts with the cookie.
        key: Option<Key>,
        /// The keyed handshake waiting for the server's message (boxed: it is large).
        noise: Option<Box<ClientHandshake>>,
    },
    Server {
        /// The ACCEPT datagram, kept to be sent again if the client repeats its INITIAL (a
        /// keyed one cannot be made twice: its Noise message is tied to this handshake).
        accept: Vec<u8>,
        /// Send (again) the ACCEPT.
        accept_pending: bool,
        /// A client that never confirms (sends a short packet, which proves it received the
        /// ACCEPT and, with a key, holds the handshake's secrets) is given up after the
        /// handshake timeout.
        created: Instant,
    },
    Done,
}

/// One address pair a client's INITIALs may take, how often the peer's host answered one
/// with "port unreachable" (nothing listens there), and the REFUSE an endpoint there sent
/// (one that takes no connections: a given address need not be the server's).
#[derive(Debug, Clone)]
struct HandshakePath {
    local: SocketAddr,
    remote: SocketAddr,
    refusals: u32,
    refused_with: Option<ConnectionError>,
}

impl HandshakePath {
    fn refused(&self) -> bool {
        self.refusals >= REFUSALS_TO_GIVE_UP || self.refused_with.is_some()
    }
}

/// Whether a frame asks for an acknowledgement (is ack-eliciting, PROTOCOL.md §3): all but
/// ACK, PADDING and CLOSE.
fn elicits_ack(f: &Frame<'_>) -> bool {
    !matches!(f, Frame::Ack { .. } | Frame::Padding | Frame::Close { .. })
}

/// What an endpoint at one of `paths` said when it refused the handshake, if one did.
fn first_refusal(paths: &[HandshakePath]) -> Option<ConnectionError> {
    paths.iter().find_map(|p| p.refused_with.clone())
}

/// Why a handshake none of whose `paths` is left ends: what an endpoint at one of them said,
/// else that nothing listens at any.
fn handshake_refusal(paths: &[HandshakePath]) -> ConnectionError {
    first_refusal(paths).unwrap_or(ConnectionError::Refused)
}

/// How the connection ends: why it ended, the CLOSE it still owes the peer, and the
/// deadlines that end it (the linger after a clean end, a clean end of the peer's that its
/// acknowledgements do not yet bear out, a peer that stays silent after a refusal, every link
/// down).
#[derive(Debug, Default)]
struct Closing {
    /// Why it ended (`None`: open, or closed cleanly).
    reason: Option<ConnectionError>,
    /// The CLOSE frame's code and reason.
    frame: Option<(u64, String)>,
    /// Links on which a CLOSE frame must still be sent once.
    sends: Vec<usize>,
    /// Our own CLOSE's second round (PROTOCOL.md §8.3).
    repeat: CloseRepeat,
    /// The end of the linger after a clean end ([`ConnectionState::Draining`]).
    draining_until: Option<Instant>,
    /// The peer confirmed a clean end (CLOSE code 0) before acknowledging everything we sent:
    /// the connection ends with [`ConnectionError::ClosedEarly`] unless the acknowledgements
    /// of our repairs complete it by then.
    peer_closed_until: Option<Instant>,
    /// The bytes we sent that were still unacknowledged when that deadline was last set: a
    /// later CLOSE whose acknowledgements brought it down sets it again.
    peer_closed_unacknowledged: u64,
    /// When the peer's host first answered "port unreachable" since the peer was last
    /// heard: the peer may be gone, which its silence will confirm (see
    /// [`Connection::peer_gone_deadline`]).
    refused_at: Option<Instant>,
    /// Since when no link has been up (`all_links_down_timeout` counts from here).
    all_down_since: Option<Instant>,
    /// The application let go of the connection: a silence of the peer this long ends it,
    /// as `idle_timeout` would (see [`Connection::let_go`]).
    let_go_silence: Option<Duration>,
}

/// Whether our own CLOSE is still to go a second time, on every link (see
/// [`CLOSE_REPEAT_MIN`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum CloseRepeat {
    /// Not (a clean end's answers, §8.2, or done).
    #[default]
    No,
    /// Once the first copies have left.
    Owed,
    /// At this time.
    At(Instant),
}

impl Closing {
    /// The peer is to get a CLOSE with `code` and `reason`, once on each of `links`, and once
    /// more on each a little later.
    fn tell_peer(&mut self, code: u64, reason: String, links: Vec<usize>) {
        self.frame = Some((code, reason));
        self.repeat = match links.is_empty() {
            true => CloseRepeat::No,
            false => CloseRepeat::Owed,
        };
        self.sends = links;
    }
}

/// Unreliable datagrams both ways: the send queue, the received ones waiting for the
/// application or for earlier missing ones, and where those held stand once their hold ran
/// out (the hold-over).
#[derive(Debug)]
struct Datagrams {
    outgoing: OutgoingDatagrams,
    incoming: IncomingDatagrams,
    /// Where held datagrams stand once their hold ran out.
    hold_over: HoldOver,
    /// When the peer was heard again after such an outage (any packet): holds of datagrams
    /// held before then restart from here (see [`HoldRule`]).
    arrivals_resumed: Option<Instant>,
    /// When the peer was heard again after a hold ran out while it was silent (the
    /// [`HoldOver::Asked`] case): datagrams held before then wait one base hold more.
    answered: Option<Instant>,
}

impl Datagrams {
    /// A packet from the peer arrived: a hold-over that waited to learn whether the peer can
    /// reach us, or to hear it again after an outage, ends.
    fn peer_heard(&mut self, now: Instant) {
        match self.hold_over {
            HoldOver::No => {}
            // It can reach us: what is held goes after one base hold. Not at once: the packet
            // that ended the silence may have left the peer just before the repairs of what
            // was stranded on a failed link, which come right behind it; released at its
            // arrival, they were delivered after their successors.
            HoldOver::Asked(_) => {
                self.hold_over = HoldOver::No;
                self.answered = Some(now);
            }
            HoldOver::Outage => {
                // heard again after an outage (an acknowledgement of our probes will do)
                self.hold_over = HoldOver::No;
                self.arrivals_resumed = Some(now);
            }
        }
    }
}

/// Where received datagrams held for missing ones stand once their hold ran out
/// ([`HoldRule`]). The missing ones are given up on only while the peer can reach us: if it
/// cannot, they may be stranded on dead links and come at the heal, and giving up on them
/// would deliver them after their successors (see the `datagrams` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HoldOver {
    /// Not run out (or released).
    No,
    /// Ran out when the peer had been silent for a round trip: every up link was sent a PING
    /// at this instant. Anything arriving from the peer releases them; nothing within a probe
    /// timeout means every link is failing.
    Asked(Instant),
    /// Ran out while every link was failing: held until the peer is heard again.
    Outage,
}

/// What the choice of what goes next, and on which link, carries from one packet to the
/// next (the [`Schedule`](scheduler::Schedule) itself lasts one burst).
#[derive(Debug, Default)]
struct Scheduling {
    /// The stream a data packet takes data from first: they alternate.
    next_stream: usize,
    /// The link of the last data packet and when it was sent: a run on it may continue at the
    /// same instant (see the scheduler).
    last_data_packet: Option<(usize, Instant)>,
    /// The link the last ack-eliciting packet arrived on: acknowledgements go back on it.
    last_arrival_link: usize,
    /// Earliest time pacing lets a waiting data packet out.
    pacing_wakeup: Option<Instant>,
    /// Why the last choice of a link for data in this send decision found none (what
    /// [`Schedule::pick`](scheduler::Schedule) returned): `None` when it found one, or
    /// was not made.
    data_blocked: Option<Option<Instant>>,
}

impl Connection {
    /// A client connection, about to send its first INITIAL over `paths[0]` (local, remote),
    /// and its retransmissions over each of `paths` in turn until a RETRY arrives; with a key,
    /// the INITIAL that echoes the server's cookie starts a Noise handshake. `remotes`: the
    /// addresses the application gave.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new_client(
        cfg: ConnectionConfig,
        now: Instant,
        local_cid: u64,
        local_instance: u64,
        paths: &[(SocketAddr, SocketAddr)],
        remotes: Vec<SocketAddr>,
        local_mtus: Vec<(SocketAddr, usize)>,
        key: Option<&Key>,
    ) -> Self {
        let (local, remote) = paths[0];
        let mut link = Link::open(&cfg, &local_mtus, LinkId(0), local, remote);
        link.probing.next = None;
        let paths = paths
            .iter()
            .map(|&(local, remote)| HandshakePath {
                local,
                remote,
                refusals: 0,
                refused_with: None,
            })
            .collect();
        let params = wire::ClientParams {
            instance: local_instance,
            window: cfg.stream_receive_window,
            cipher: Cipher::preferred().code(),
            accepts: cfg.accepts(),
            application: cfg.application.clone().unwrap_or_default().into_bytes(),
        }
        .encode();
        let mode = match key {
            Some(_) => wire::handshake_mode::NOISE_NNPSK0,
            None => wire::handshake_mode::PLAIN,
        };
        let stage = HandshakeStage::Client {
            remotes,
            paths,
            next_path: 0,
            token: Vec::new(),
            next_initial: now,
            backoff: INITIAL_RETRY,
            started: now,
            first_sent: None,
            mode,
            hello: Vec::new(),
            params,
            key: key.cloned(),
            noise: None,
        };
        let handshake = Handshake::new(stage, local_cid, 0, 0, 0);
        Self::new(cfg, now, handshake, local_mtus, link)
    }

    /// A server connection for a client whose address was proven by a retry cookie (and, with
    /// a key, whose handshake message authenticated): `accept` is the ACCEPT datagram. It is
    /// unconfirmed, and reports no event, until the client's first short packet arrives
    /// ([`Self::take_confirmed`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new_server(
        cfg: ConnectionConfig,
        now: Instant,
        local_cid: u64,
        peer_cid: u64,
        client: &wire::ClientParams,
        local: SocketAddr,
        remote: SocketAddr,
        accept: Vec<u8>,
        protection: Option<PacketProtection>,
        local_mtus: Vec<(SocketAddr, usize)>,
    ) -> Self {
        let mut link = Link::open(&cfg, &local_mtus, LinkId(0), local, remote);
        link.promote(now, &mut AckOutcome::default());
        let stage = HandshakeStage::Server {
            accept,
            accept_pending: true,
            created: now,
        };
        let mut handshake =
            Handshake::new(stage, local_cid, peer_cid, client.instance, client.window);
        handshake.protection = protection;
        handshake.peer_accepts = client.accepts;
        let mut c = Self::new(cfg, now, handshake, local_mtus, link);
        c.state = ConnectionState::Established;
        c
    }

    fn new(
        cfg: ConnectionConfig,
        now: Instant,
        handshake: Handshake,
        local_mtus: Vec<(SocketAddr, usize)>,
        link: Link,
    ) -> Self {
        let window = cfg.stream_receive_window;
        let buffer = cfg.send_buffer;
        let peer_window = handshake.peer_window;
        Self {
            state: ConnectionState::Connecting,
            handshake,
            closing: Closing::default(),
            local_mtus,
            links: vec![link],
            send: [
                SendStream::new(buffer, peer_window),
                SendStream::new(buffer, peer_window),
            ],
            recv: [RecvStream::new(window), RecvStream::new(window)],
            max_data_pending: [false; 2],
            link_status_pending: Vec::new(),
            ping_pending: None,
            events: VecDeque::new(),
            readable_signalled: false,
            datagrams: Datagrams {
                outgoing: OutgoingDatagrams::new(cfg.datagram_send_buffer, cfg.datagram_max_age),
                incoming: IncomingDatagrams::new(
                    cfg.datagram_receive_buffer,
                    cfg.datagram_reorder_hold,
                ),
                hold_over: HoldOver::No,
                arrivals_resumed: None,
                answered: None,
            },
            write_wants: [None; 2],
            writer_told: [false; 2],
            all_acknowledged: false,
            scheduling: Scheduling::default(),
            send_clock: SendClock::default(),
            last_rx: now,
            pings_owed: 0,
            indexed_deadline: None,
            indexed_traffic_deadline: None,
            released: false,
            next_share_check: now + cfg.share_check_interval,
            scratch: AckOutcome::default(),
            cfg,
        }
    }

    // ------------------------------------------------------------------------------------
    // Application interface

    /// The largest datagram `local`'s interface sends is `max` from now on (`None`: not
    /// known): the links from there search their path MTU again within it. Returns whether
    /// the connection has a link from `local`.
    pub(crate) fn interface_changed(&mut self, local: SocketAddr, max: Option<usize>) -> bool {
        crate::link::set_local_max(&mut self.local_mtus, local, max);
        let mut any = false;
        for link in self.links.iter_mut().filter(|l| l.local == local) {
            link.interface_changed(&self.cfg, &self.local_mtus);
            any = true;
        }
        any
    }

    /// Current state.
    pub fn state(&self) -> ConnectionState {
        self.state
    }

    /// Puts these in force from now on, in place of the configuration's
    /// [`all_links_down_timeout`](ConnectionConfig::all_links_down_timeout) and
    /// [`idle_timeout`](ConnectionConfig::idle_timeout) (`None`: never). Counted from what
    /// already happened: a connection whose links have been down longer than a new limit ends
    /// at its next timer.
    pub fn set_timeouts(&mut self, all_links_down: Option<Duration>, idle: Option<Duration>) {
        self.cfg.all_links_down_timeout = all_links_down;
        self.cfg.idle_timeout = idle;
    }

    /// Whether the handshake completed, whatever came after: a client's once the server
    /// accepted it (its state no longer connecting), a server's from the start.
    pub fn handshake_completed(&self) -> bool {
        !matches!(self.handshake.stage, HandshakeStage::Client { .. })
    }

    /// Why the connection ended; `None` while open or after a clean close.
    pub fn close_reason(&self) -> Option<&ConnectionError> {
        self.closing.reason.as_ref()
    }

    /// The configuration in force.
    pub fn config(&self) -> &ConnectionConfig {
        &self.cfg
    }

    /// Whether the connection may still be written to (its stream not finished).
    fn write_check(&self) -> Result<(), WriteError> {
        if let Some(e) = &self.closing.reason {
            return Err(WriteError::ConnectionLost(e.clone()));
        }
        if self.state == ConnectionState::Closed || self.send[BYTE_STREAM].is_finished() {
            return Err(WriteError::Finished);
        }
        Ok(())
    }

    /// Writes bytes to the byte stream; returns how many were taken (the rest when the send
    /// buffer has room again: [`Event::Writable`]). Writing before the handshake completes
    /// buffers the data.
    pub fn write(&mut self, data: &[u8]) -> Result<usize, WriteError> {
        self.write_to(BYTE_STREAM, |c| {
            let stream = &mut c.send[BYTE_STREAM];
            let n = stream.write(data);
            if n == 0 && !data.is_empty() {
                // wake the writer only once a quarter of the buffer is free: waking it for
                // every acknowledged packet costs a context switch per few kilobytes
                let want = (stream.capacity() / 4).clamp(1, data.len() as u64);
                c.writer_waits(BYTE_STREAM, want);
                return Err(WriteError::Blocked);
            }
            Ok(n)
        })
    }

    /// Writes the bytes of `buf` to the byte stream, like [`write`](Self::write) but without
    /// copying a large buffer (16 KiB or more): the connection keeps it until the peer
    /// acknowledged it and leaves `buf` empty, with the memory of a buffer it no longer needs
    /// when it has one (fill it with the next data). A large buffer is taken whole or, when the
    /// send buffer has no room for it, not at all ([`WriteError::Blocked`]); a small one is
    /// copied and drained. Returns how many bytes were taken.
    pub fn write_buf(&mut self, buf: &mut Vec<u8>) -> Result<usize, WriteError> {
        self.write_to(BYTE_STREAM, |c| {
            let n = c.send[BYTE_STREAM].write_buf(buf);
            c.taken_or_blocked(n, buf.len())
        })
    }

    /// Writes `data` to the byte stream as [`write_buf`](Self::write_buf) writes a buffer, a
    /// large one (16 KiB or more) shared rather than copied, whole or not at all: the
    /// connection keeps a clone of it until the peer acknowledged it. Returns how many bytes
    /// were taken.
    pub fn write_bytes(&mut self, data: &Bytes) -> Result<usize, WriteError> {
        self.write_to(BYTE_STREAM, |c| {
            let n = c.send[BYTE_STREAM].write_bytes(data);
            c.taken_or_blocked(n, data.len())
        })
    }

    /// What a write of `len` bytes that takes a large buffer only whole returns, `n` bytes
    /// taken: when none were, the writer is woken once they fit (an empty send buffer takes
    /// any size).
    fn taken_or_blocked(&mut self, n: usize, len: usize) -> Result<usize, WriteError> {
        if n == 0 && len > 0 {
            let want = (len as u64).min(self.send[BYTE_STREAM].capacity()).max(1);
            self.writer_waits(BYTE_STREAM, want);
            return Err(WriteError::Blocked);
        }
        Ok(n)
    }

    /// Runs a write to `stream` (`op`), once the connection may still be written to. A writer
    /// told of room ([`Event::Writable`]) has then retried, unless this one found too little
    /// room: several writers may wait for room of different sizes (tasks sharing a readiness
    /// descriptor), and this one may have looked before the one the room fits was woken. Then
    /// the room stays told, and the driver signals the writers' descriptor again for that one
    /// ([`writer_may_retry`](Self::writer_may_retry)).
    fn write_to<T>(
        &mut self,
        stream: usize,
        op: impl FnOnce(&mut Self) -> Result<T, WriteError>,
    ) -> Result<T, WriteError> {
        let r = self.write_check().and_then(|()| op(self));
        if !matches!(r, Err(WriteError::Blocked)) {
            self.writer_told[stream] = false;
        }
        r
    }

    /// A writer of `stream` found no room for `want` bytes: [`Event::Writable`] comes once
    /// there is. Several writers may wait at once (threads, or tasks sharing one readiness
    /// descriptor): the stream waits for the smallest room any of them needs, so the one it
    /// fits is woken, and the others, woken with it, try again and wait for theirs.
    fn writer_waits(&mut self, stream: usize, want: u64) {
        let wants = &mut self.write_wants[stream];
        *wants = Some(wants.map_or(want, |w| w.min(want)));
    }

    /// Largest message [`send_message`](Self::send_message) accepts: 0 until the handshake
    /// has told the peer's receive window (a message sent meanwhile waits for it).
    pub fn max_message_size(&self) -> usize {
        let limit = self
            .cfg
            .send_buffer
            .min(self.recv_limit_of_peer())
            .saturating_sub(8);
        limit.min(wire::VARINT_MAX) as usize
    }

    fn recv_limit_of_peer(&self) -> u64 {
        // the peer's window is what it advertised before reading anything
        self.handshake.peer_window
    }

    /// Sends one whole message; the peer receives it whole with
    /// [`recv_message`](Self::recv_message). Messages are delivered reliably and in order,
    /// independently of the byte stream.
    pub fn send_message(&mut self, msg: &[u8]) -> Result<(), WriteError> {
        self.write_to(MESSAGE_STREAM, |c| {
            if c.handshake.peer_accepts & wire::accepts::MESSAGES == 0 {
                return Err(WriteError::MessagesRefused);
            }
            // more than this side's send buffer ever holds (or than a length can say): too large
            // whatever the peer's window, known before the handshake ends
            let ceiling = (c.cfg.send_buffer.saturating_sub(8)).min(wire::VARINT_MAX) as usize;
            if msg.len() > ceiling {
                return Err(WriteError::MessageTooLarge {
                    size: msg.len(),
                    limit: match c.state {
                        ConnectionState::Connecting => ceiling,
                        _ => c.max_message_size(),
                    },
                });
            }
            let mut header = [0u8; 8];
            let hlen = {
                let mut w = Writer::new(&mut header);
                w.varint(msg.len() as u64);
                w.len()
            };
            if c.state == ConnectionState::Connecting {
                // the largest message is known once the peer's window is: wait for it (the
                // handshake's end makes the message stream writable)
                c.writer_waits(MESSAGE_STREAM, (hlen + msg.len()) as u64);
                return Err(WriteError::Blocked);
            }
            let limit = c.max_message_size();
            if msg.len() > limit {
                return Err(WriteError::MessageTooLarge {
                    size: msg.len(),
                    limit,
                });
            }
            let stream = &mut c.send[MESSAGE_STREAM];
            if stream.room() < (hlen + msg.len()) as u64 {
                c.writer_waits(MESSAGE_STREAM, (hlen + msg.len()) as u64);
                return Err(WriteError::Blocked);
            }
            stream.write(&header[..hlen]);
            stream.write(msg);
            Ok(())
        })
    }

    /// Largest datagram [`send_datagram`](Self::send_datagram) accepts:
    /// [`wire::MAX_DATAGRAM_LEN`] (the largest IP packet and 1 KiB for an application
    /// header). One larger than [`unsplit_datagram_size`](Self::unsplit_datagram_size) goes in
    /// pieces that fill the packets, and the peer receives it whole or not at all: losing any
    /// piece loses it.
    pub fn max_datagram_size(&self) -> usize {
        wire::MAX_DATAGRAM_LEN
    }

    /// Largest datagram that goes in one packet, never in pieces: what one packet carries on
    /// every link at its base size (1426 bytes on IPv4 links of a 1500-byte MTU with a key,
    /// 1442 without). Path MTU discovery does not raise it: a datagram sent again after a
    /// link failure must fit whichever link is left.
    pub fn unsplit_datagram_size(&self) -> usize {
        let base = self.links.iter().map(|l| l.pmtu.base()).min().unwrap_or(0);
        crate::datagram_capacity(base, self.handshake.protection.is_some())
    }

    /// How datagrams are sent now: whole up to [`Self::unsplit_datagram_size`], and in pieces
    /// as large as an empty data packet of the smallest link carries. Packet numbers are taken
    /// to be 4 bytes (8 once a link has sent 2^30 packets): a piece cut before a link passes
    /// 2^30 that has to go again after a link failure may then no longer fit, and is dropped.
    pub(crate) fn datagram_bounds(&self) -> Bounds {
        let base = self.links.iter().map(|l| l.pmtu.base()).min().unwrap_or(0);
        let long_numbers = self.links.iter().any(|l| l.recovery.next_pn() >= 1 << 30);
        let pn_len = if long_numbers { 8 } else { 4 };
        Bounds {
            unsplit: self.unsplit_datagram_size(),
            piece_room: base.saturating_sub(wire::SHORT_HEADER_FIXED + pn_len + self.tag_len()),
        }
    }

    /// Sends `data` as one unreliable datagram: the peer receives it whole with
    /// [`recv_datagram`](Self::recv_datagram), or not at all. Datagrams go out once, striped
    /// over the up links under their congestion windows, ahead of stream data; a lost one is
    /// not sent again, and the order of arrival is not guaranteed. Never blocks: a full
    /// queue drops its oldest datagram (see [`ConnectionConfig::datagram_send_buffer`]).
    /// `now` starts the datagram's age ([`ConnectionConfig::datagram_max_age`]).
    pub fn send_datagram(&mut self, now: Instant, data: &[u8]) -> Result<(), WriteError> {
        self.check_datagram(data.len())?;
        self.datagrams.outgoing.push(now, data);
        Ok(())
    }

    /// [`send_datagram`](Self::send_datagram) of the datagram in `buf`, without copying it:
    /// the connection keeps `buf`'s memory and leaves an empty buffer in its place (with room
    /// for a datagram once the connection has buffers to spare), so an application that
    /// fills the same buffers again makes the send path allocate and copy nothing per
    /// datagram. On an error `buf` is left as it was.
    pub fn send_datagram_buf(&mut self, now: Instant, buf: &mut Vec<u8>) -> Result<(), WriteError> {
        self.check_datagram(buf.len())?;
        self.datagrams.outgoing.push_owned(now, buf);
        Ok(())
    }

    /// Whether the datagrams waiting to be sent fill more than half their queue's bound: they
    /// are queued faster than they leave, and the oldest will soon be dropped to make room.
    /// A sender whose own threads fall behind may wait on it rather than lose datagrams.
    pub fn datagrams_piling_up(&self) -> bool {
        self.datagrams.outgoing.over_half()
    }

    /// How long a datagram may wait to be sent while others leave
    /// ([`ConnectionConfig::datagram_max_age`]).
    pub fn datagram_max_age(&self) -> Duration {
        self.datagrams.outgoing.max_age()
    }

    /// Whether a datagram of `size` bytes may be sent now.
    fn check_datagram(&self, size: usize) -> Result<(), WriteError> {
        if let Some(e) = &self.closing.reason {
            return Err(WriteError::ConnectionLost(e.clone()));
        }
        if self.state == ConnectionState::Closed {
            return Err(WriteError::Finished);
        }
        if self.handshake.peer_accepts & wire::accepts::DATAGRAMS == 0 {
            return Err(WriteError::DatagramsRefused);
        }
        let limit = self.max_datagram_size();
        if size > limit {
            return Err(WriteError::DatagramTooLarge { size, limit });
        }
        Ok(())
    }

    /// How long received datagrams wait for missing ones (see [`HoldRule`]): a link's failure
    /// takes the sender `failure_ptos` probe timeouts to declare (one more for the peer's
    /// timers running a little behind ours), and no less than a round trip on another link,
    /// which must show that the peer still answers (§6.1); what it sends again then crosses
    /// that link. Both are bounded by the slowest link's round trip.
    pub(super) fn hold_rule(&self) -> HoldRule {
        let slowest = self
            .links
            .iter()
            .map(|l| l.rtt.srtt)
            .max()
            .unwrap_or_default();
        let failure_waits: smallvec::SmallVec<_> = self
            .links
            .iter()
            .map(|l| l.pto(&self.cfg) * (self.cfg.failure_ptos + 1) + slowest * 2)
            .collect();
        // after an outage the peer's links come back after `recovery_probes` acknowledged
        // probes; what was stranded on them follows, within a failure repair time
        let resumed = self.datagrams.arrivals_resumed.map(|at| {
            let repair = failure_waits.iter().copied().max().unwrap_or_default();
            (
                at,
                self.cfg.probe_interval * self.cfg.recovery_probes + repair,
            )
        });
        let answered = self
            .datagrams
            .answered
            .map(|at| (at, self.cfg.datagram_reorder_hold));
        let resumed = resumed
            .into_iter()
            .chain(answered)
            .max_by_key(|&(at, wait)| at + wait);
        HoldRule {
            base: self.cfg.datagram_reorder_hold,
            failure_waits,
            resumed,
        }
    }

    /// Whether no link shows that the peer answers now: each is down, degraded, or waits
    /// for an acknowledgement past a probe timeout.
    pub(super) fn every_link_failing(&self) -> bool {
        self.links
            .iter()
            .all(|l| !l.is_up() || l.recovery.pto_count > 0)
    }

    /// Receives one datagram. `Ok(None)`: the connection closed cleanly and every datagram
    /// that arrived was read; [`ReadError::Blocked`] means wait for [`Event::Readable`].
    pub fn recv_datagram(&mut self) -> Result<Option<Vec<u8>>, ReadError> {
        if let Some(d) = self.datagrams.incoming.pop() {
            if !self.has_datagram() {
                self.took_the_last();
            }
            return Ok(Some(d));
        }
        if self.state == ConnectionState::Closed && self.closing.reason.is_none() {
            return Ok(None);
        }
        self.read_blocked()
    }

    /// [`recv_datagram`](Self::recv_datagram) into `buf`: `Ok(true)` when `buf` now holds
    /// the next datagram, `Ok(false)` once the connection closed cleanly and every datagram
    /// was read. `buf`'s previous memory is kept for a later arrival, so an application that
    /// passes its buffers back makes the receive path allocate nothing per datagram.
    pub fn recv_datagram_into(&mut self, buf: &mut Vec<u8>) -> Result<bool, ReadError> {
        if self.datagrams.incoming.pop_into(buf) {
            if !self.has_datagram() {
                self.took_the_last();
            }
            return Ok(true);
        }
        if self.state == ConnectionState::Closed && self.closing.reason.is_none() {
            return Ok(false);
        }
        self.read_blocked()
    }

    /// Gives the connection a buffer the application no longer needs, for a later datagram.
    pub fn recycle_datagram_buffer(&mut self, buf: Vec<u8>) {
        self.datagrams.incoming.recycle(buf);
    }

    /// Finishes both outgoing streams: the peer reads end-of-stream after the data written.
    pub fn finish(&mut self) {
        for s in &mut self.send {
            s.finish();
        }
        // a writer waiting for room (another thread's, or task's) retries now and meets the
        // end; none waits after it
        let waiting = self.write_wants.iter().any(Option::is_some);
        self.write_wants = [None; 2];
        self.writer_told = [false; 2];
        if waiting {
            self.event(Event::Writable);
        }
    }

    /// Reads from the byte stream. `Ok(0)` (with a non-empty `buf`) is the end of the stream;
    /// [`ReadError::Blocked`] means wait for [`Event::Readable`].
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, ReadError> {
        let n = self.recv[BYTE_STREAM].read(buf);
        if n > 0 {
            self.after_read(BYTE_STREAM);
            return Ok(n);
        }
        if self.recv[BYTE_STREAM].is_finished() || buf.is_empty() {
            return Ok(0);
        }
        self.read_blocked()
    }

    /// Reads from the byte stream into `buf`, replacing its contents, like
    /// [`read`](Self::read) but without copying when a whole block of the receive buffer (64
    /// KiB) is ready: the block itself is handed over, and `buf`'s memory is kept for a later
    /// block. `Ok(0)` is the end of the stream.
    pub fn read_buf(&mut self, buf: &mut Vec<u8>) -> Result<usize, ReadError> {
        let n = self.recv[BYTE_STREAM].read_buf(buf);
        if n > 0 {
            self.after_read(BYTE_STREAM);
            return Ok(n);
        }
        if self.recv[BYTE_STREAM].is_finished() {
            return Ok(0);
        }
        self.read_blocked()
    }

    fn read_blocked<T>(&mut self) -> Result<T, ReadError> {
        self.readable_signalled = false;
        match &self.closing.reason {
            Some(e) => Err(ReadError::ConnectionLost(e.clone())),
            None if self.state == ConnectionState::Closed => Err(ReadError::ConnectionLost(
                ConnectionError::ProtocolViolation("closed before the stream ended"),
            )),
            None => Err(ReadError::Blocked),
        }
    }

    /// A reader looked and took nothing (the driver answered for the connection: another of
    /// its threads was receiving): as after a read that found nothing, the next arrival is
    /// reported ([`Event::Readable`]). Without it, no arrival was told once that thread had
    /// taken what came before and stopped receiving.
    pub fn reader_looked(&mut self) {
        self.readable_signalled = false;
    }

    /// Whether a read of some kind would return data now: bytes of the byte stream, a whole
    /// message or a datagram. (A driver keeps a reader's descriptor signalled while it is so:
    /// a call that looked for one kind and found nothing must not hide another.)
    pub fn has_readable(&self) -> bool {
        self.has_stream_bytes() || self.has_datagram() || self.has_message()
    }

    /// Whether bytes of the byte stream are there to read.
    pub fn has_stream_bytes(&self) -> bool {
        self.recv[BYTE_STREAM].readable() > 0
    }

    /// Whether a whole message is there to read.
    pub fn has_message(&self) -> bool {
        self.next_message_header()
            .is_some_and(|(hlen, len)| self.recv[MESSAGE_STREAM].readable() >= hlen as u64 + len)
    }

    /// Whether a datagram is there to read.
    pub fn has_datagram(&self) -> bool {
        self.datagrams.incoming.waiting().1 > 0
    }

    /// Whether a writer that found a stream's send buffer full was told it may retry
    /// ([`Event::Writable`]) and no write to that stream has taken the room since. (A driver
    /// keeps a combined reading and writing descriptor signalled while it is so: a reader's
    /// call must not hide it.)
    pub fn writer_may_retry(&self) -> bool {
        self.writer_told.iter().any(|&t| t)
    }

    /// The next message's header length and length, once its header has arrived.
    fn next_message_header(&self) -> Option<(usize, u64)> {
        let mut header = [0u8; 8];
        let got = self.recv[MESSAGE_STREAM].peek(&mut header);
        let mut r = wire::Reader::new(&header[..got]);
        let len = r.varint().ok()?;
        Some((got - r.remaining(), len))
    }

    /// Whether a window update waits to be sent: a read freed enough of a stream's receive
    /// window to tell the peer. The only thing a read that returned data can leave to send
    /// (a read that failed the connection returns an error): after such a read without it, a
    /// driver need not look for anything to send, timers or events.
    pub fn window_update_pending(&self) -> bool {
        self.max_data_pending.iter().any(|&p| p)
    }

    fn after_read(&mut self, stream: usize) {
        if self.recv[stream].window_update().is_some() {
            self.max_data_pending[stream] = true;
        }
        let left = match stream {
            MESSAGE_STREAM => self.has_message(),
            _ => self.has_stream_bytes(),
        };
        if !left {
            self.took_the_last();
        }
    }

    /// A read took the last of its kind: as after a read that found nothing, the next
    /// arrival is reported ([`Event::Readable`]). A reader that takes what it waited for and
    /// looks no further (one call per message or per byte count) has seen nothing since that
    /// arrival's report; another thread waiting on the descriptor this read cleared would
    /// otherwise never hear of the next arrival.
    fn took_the_last(&mut self) {
        self.readable_signalled = false;
    }

    /// Receives one whole message. `Ok(None)` is the end of the message stream;
    /// [`ReadError::Blocked`] means wait for [`Event::Readable`].
    pub fn recv_message(&mut self) -> Result<Option<Vec<u8>>, ReadError> {
        let mut msg = Vec::new();
        Ok(self.recv_message_into(&mut msg)?.then_some(msg))
    }

    /// [`recv_message`](Self::recv_message) into `buf`, whose memory it reuses: `Ok(true)`
    /// with the message in `buf` (nothing else), `Ok(false)` at the end of the message stream
    /// (`buf` as it was).
    pub fn recv_message_into(&mut self, buf: &mut Vec<u8>) -> Result<bool, ReadError> {
        let header = self.next_message_header();
        let stream = &mut self.recv[MESSAGE_STREAM];
        if let Some((hlen, len)) = header {
            if hlen as u64 + len > self.cfg.stream_receive_window {
                self.fail(ConnectionError::ProtocolViolation(
                    "message larger than the receive window",
                ));
                return self.read_blocked();
            }
            if stream.readable() >= hlen as u64 + len {
                stream.read(&mut [0u8; 8][..hlen]);
                buf.clear();
                let whole = stream.read_append(buf, len as usize);
                debug_assert!(whole, "the whole message was readable");
                self.after_read(MESSAGE_STREAM);
                return Ok(true);
            }
            // nothing is read until the whole message is here: make sure it may all arrive
            let end = stream.read_offset() + hlen as u64 + len;
            if stream.grant_up_to(end).is_some() {
                self.max_data_pending[MESSAGE_STREAM] = true;
            }
        }
        if stream.is_finished() {
            return Ok(false);
        }
        if stream.is_all_received() {
            self.fail(ConnectionError::ProtocolViolation(
                "message stream ended inside a message",
            ));
        }
        self.read_blocked()
    }

    /// Whether the peer's end of both its streams arrived, with every byte before it (read or
    /// not).
    pub fn is_receive_complete(&self) -> bool {
        self.recv.iter().all(RecvStream::is_all_received)
    }

    /// Bytes received on the streams and not read yet.
    pub fn unread_bytes(&self) -> u64 {
        self.recv.iter().map(RecvStream::buffered).sum()
    }

    /// Whether everything written, and the end of both streams, was acknowledged by the peer.
    pub fn is_send_complete(&self) -> bool {
        self.send.iter().all(SendStream::is_complete)
    }

    /// Bytes written to the outgoing streams that the peer has not acknowledged, those above
    /// a gap it acknowledged left out.
    fn unacknowledged_bytes(&self) -> u64 {
        self.send.iter().map(SendStream::unacknowledged).sum()
    }

    /// The application let go of the connection, which goes on delivering what was written
    /// and finishing cleanly: from now on, nothing received from the peer for `silence` ends
    /// it with [`ConnectionError::IdleTimeout`], as an `idle_timeout` would. Nobody could
    /// otherwise end a connection whose peer vanished without a word while no deadline of the
    /// configuration (the default) gives up on it: it would be kept, with its memory and its
    /// place among `max_connections`, as long as the endpoint lives.
    pub fn let_go(&mut self, silence: Duration) {
        self.closing.let_go_silence = Some(silence);
    }

    /// Its application let go of it after a clean end, and its endpoint keeps it only to
    /// confirm that end to a peer that missed it ([`crate::Endpoint::release`]): what the
    /// application did not read (a clean end does not wait for the reader), and anything
    /// still queued, goes now. Its links (what arrived on each) and its keys stay: the
    /// confirmation is made of them.
    pub(crate) fn release(&mut self) {
        self.released = true;
        let (window, cfg) = (self.cfg.stream_receive_window, &self.cfg);
        self.recv = [RecvStream::new(window), RecvStream::new(window)];
        self.send = [
            SendStream::new(cfg.send_buffer, 0),
            SendStream::new(cfg.send_buffer, 0),
        ];
        self.datagrams.incoming =
            IncomingDatagrams::new(cfg.datagram_receive_buffer, cfg.datagram_reorder_hold);
        self.datagrams.outgoing =
            OutgoingDatagrams::new(cfg.datagram_send_buffer, cfg.datagram_max_age);
        self.events = VecDeque::new();
    }

    /// Ends a connection that lingers after a clean end ([`ConnectionState::Draining`]) now,
    /// as its endpoint closes: Closed with no error, the peer told that everything it sent
    /// arrived (CLOSE code 0 with the acknowledgements that prove it, PROTOCOL.md §8.2),
    /// which a peer that missed our last acknowledgements needs to end cleanly too. Nothing
    /// in another state.
    pub fn end_drain(&mut self) {
        if self.state != ConnectionState::Draining {
            return;
        }
        let targets = self.close_targets();
        self.closing.tell_peer(CLOSE_DONE, String::new(), targets);
        self.set_closed(None);
    }

    /// Aborts at once: the peer gets [`ConnectionError::PeerAborted`] with `code` and `reason`.
    pub fn abort(&mut self, code: u64, reason: &str) {
        if self.state == ConnectionState::Closed {
            return;
        }
        let code = code.min(MAX_ABORT_CODE) + CLOSE_APP_BASE;
        let targets = self.close_targets();
        self.closing.tell_peer(code, reason.to_owned(), targets);
        self.set_closed(Some(ConnectionError::LocallyAborted));
    }

    /// Statistics.
    pub fn stats(&self) -> ConnectionStats {
        ConnectionStats {
            links: self.links.iter().map(Link::stats).collect(),
            send_buffered: self.send.iter().map(SendStream::buffered).sum(),
            recv_buffered: self.unread_bytes(),
            recv_fragments: self.recv.iter().map(RecvStream::fragments).sum(),
            bytes_acknowledged: self.send.iter().map(SendStream::acknowledged).sum(),
            stream_acknowledged: self.send[BYTE_STREAM].acknowledged(),
            bytes_received: self.recv.iter().map(RecvStream::received).sum(),
            cipher: self
                .handshake
                .protection
                .as_ref()
                .map(PacketProtection::cipher),
            datagrams_sent: self.datagrams.outgoing.sent,
            datagrams_resent: self.datagrams.outgoing.resent,
            datagrams_send_dropped: self.datagrams.outgoing.dropped,
            datagrams_received: self.datagrams.incoming.received,
            datagrams_receive_dropped: self.datagrams.incoming.dropped,
            datagrams_reordered: self.datagrams.incoming.reordered,
            datagrams_duplicate: self.datagrams.incoming.duplicates,
            datagrams_waiting: self.datagrams.incoming.waiting(),
            datagrams_queued: self.datagrams.outgoing.queued(),
            send_limits: self.send_clock.totals(),
            key_updates: self
                .handshake
                .protection
                .as_ref()
                .map_or((0, 0), PacketProtection::generations),
            packets_opened_ahead: (self.handshake.protection.as_ref())
                .map_or(0, |p| p.opened_ahead),
        }
    }

    /// The paths (local, remote) of links on which the peer was heard within `hold`: a driver
    /// tells the OS that their next hop is alive (see [`Endpoint::heard_paths`]).
    ///
    /// [`Endpoint::heard_paths`]: crate::Endpoint::heard_paths
    pub fn heard_paths(
        &self,
        now: Instant,
        hold: Duration,
    ) -> impl Iterator<Item = (SocketAddr, SocketAddr)> + '_ {
        let open = self.state != ConnectionState::Closed;
        self.links
            .iter()
            .filter(move |l| {
                open && l
                    .arrivals
                    .last_heard
                    .is_some_and(|t| now.saturating_duration_since(t) <= hold)
            })
            .map(|l| (l.local, l.remote))
    }

    /// State of each link, in the order the links were opened (see [`LinkStats::id`]).
    pub fn link_states(&self) -> Vec<LinkState> {
        self.links.iter().map(|l| l.state).collect()
    }

    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn event(&mut self, e: Event) {
        if self.is_unconfirmed_server() {
            return; // nobody would collect it
        }
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(e);
    }

    // ------------------------------------------------------------------------------------
    // State changes

    fn set_closed(&mut self, reason: Option<ConnectionError>) {
        if self.state == ConnectionState::Closed {
            return;
        }
        self.state = ConnectionState::Closed;
        self.closing.reason = reason.clone();
        // nothing missing can arrive any more: the datagrams held for it are the
        // application's now (no timer runs for them after this)
        if self.datagrams.incoming.release_all() {
            self.event(Event::Readable);
        }
        self.event(Event::Closed(reason));
    }

    /// Ends the connection with an error, telling the peer.
    pub(crate) fn fail(&mut self, e: ConnectionError) {
        if self.state == ConnectionState::Closed {
            return;
        }
        let targets = self.close_targets();
        self.closing.tell_peer(CLOSE_ERROR, e.to_string(), targets);
        self.set_closed(Some(e));
    }

    /// How long after our CLOSE's first copies it goes again (see [`CLOSE_REPEAT_MIN`]): the
    /// round trips measured, not the initial guess of a link that never had one.
    fn close_repeat_delay(&self) -> Duration {
        let measured = self.links.iter().filter(|l| l.rtt.has_sample());
        let srtt = measured.map(|l| l.rtt.srtt).max().unwrap_or_default();
        srtt.clamp(CLOSE_REPEAT_MIN, CLOSE_REPEAT_MAX)
    }

    /// Whether a CLOSE of ours is still to be sent (now or in its second round): the
    /// connection is released only after.
    pub(crate) fn close_pending(&self) -> bool {
        !self.closing.sends.is_empty() || self.closing.repeat != CloseRepeat::No
    }

    /// Links to send a CLOSE on: all of them, unless short packets may not be sent yet
    /// (during the handshake the peer could not take it).
    fn close_targets(&self) -> Vec<usize> {
        if self.can_send_short() {
            (0..self.links.len()).collect()
        } else {
            Vec::new()
        }
    }

    /// Ends the connection without telling the peer (it no longer knows us).
    pub(crate) fn peer_restarted(&mut self) {
        self.set_closed(Some(ConnectionError::PeerRestarted));
    }

    fn set_link_state(&mut self, i: usize, now: Instant, to: LinkState) {
        let from = self.links[i].state;
        if from == to {
            return;
        }
        let mut out = std::mem::take(&mut self.scratch);
        match to {
            LinkState::Up => self.links[i].promote(now, &mut out),
            LinkState::Down | LinkState::Degraded => {
                self.links[i].demote(now, to, &self.cfg);
                self.links[i].drain_in_flight(&mut out);
            }
            LinkState::Validating => unreachable!("links never return to validating"),
        }
        self.apply_outcome(now, &mut out);
        self.scratch = out;
        tracing::debug!(link = i, %from, %to, "link state");
        self.event(Event::LinkStateChanged {
            link: self.links[i].id,
            from,
            to,
        });
        self.update_all_down(now);
    }

    /// Takes link `i` down when its path no longer carries the link's base size
    /// ([`crate::pmtu::PathMtu::below_base`]): every full packet sent there is lost while its
    /// small probes are answered, which no other check takes for a failure. It comes back
    /// once a probe of the base size gets through.
    fn down_if_below_base(&mut self, i: usize, now: Instant) {
        let link = &self.links[i];
        if link.is_up() && link.pmtu.below_base() {
            tracing::warn!(
                link = i,
                base = link.pmtu.base(),
                "the path carries no datagram of the link's base size any more (a smaller MTU \
                 on the way, and no ICMP said so): link down"
            );
            self.set_link_state(i, now, LinkState::Down);
        }
    }

    fn update_all_down(&mut self, now: Instant) {
        if self.links.iter().any(Link::is_up) {
            self.closing.all_down_since = None;
        } else if self.closing.all_down_since.is_none() {
            self.closing.all_down_since = Some(now);
        }
    }

    /// Hands acknowledged and lost packets' frames back to the streams and control queues;
    /// datagrams stranded on a failed link are queued again.
    fn apply_outcome(&mut self, now: Instant, out: &mut AckOutcome) {
        for pkt in out.acked.drain(..) {
            for f in pkt.frames {
                match f {
                    SentFrame::Stream { stream, chunk } => self.send[stream as usize].on_ack(chunk),
                    SentFrame::Datagram(piece) => self.datagrams.outgoing.recycle(piece.data),
                    SentFrame::MaxStreamData { .. } | SentFrame::LinkStatus { .. } => {}
                }
            }
        }
        for frames in out.acked_late.drain(..) {
            for f in &frames {
                if let SentFrame::Stream { stream, chunk } = *f {
                    self.send[stream as usize].on_ack(chunk);
                }
            }
        }
        for pkt in out.lost.drain(..) {
            for f in pkt.frames {
                match f {
                    SentFrame::Stream { stream, chunk } => {
                        self.send[stream as usize].on_lost(chunk)
                    }
                    SentFrame::MaxStreamData { stream } => {
                        self.max_data_pending[stream as usize] = true
                    }
                    SentFrame::LinkStatus { link, status } => {
                        self.link_status_pending.push((link, status))
                    }
                    // congestion lost it: inner protocols recover by themselves
                    SentFrame::Datagram(piece) => self.datagrams.outgoing.recycle(piece.data),
                }
            }
        }
        if !out.stranded.is_empty() {
            self.datagrams.outgoing.requeue(now, &mut out.stranded);
        }
        out.probes_acked = 0;
        let mut writable = false;
        let wants = self.write_wants.iter_mut().zip(&self.send);
        for ((want, stream), told) in wants.zip(&mut self.writer_told) {
            if want.is_some_and(|w| stream.room() >= w) {
                *want = None;
                *told = true;
                writable = true;
            }
        }
        if writable {
            self.event(Event::Writable);
        }
        if !self.all_acknowledged && self.is_send_complete() {
            self.all_acknowledged = true;
            self.event(Event::AllAcknowledged);
        }
    }

    // ------------------------------------------------------------------------------------
    // Incoming packets (called by the endpoint)

    /// RETRY from `remote`: send the INITIAL again with the cookie, and now the hello: with
    /// a key, the first Noise message, bound to the cookie (so it is worth nothing under
    /// another). The cookie is bound to the address pair it answered, which becomes link 0's.
    ///
    /// A RETRY with another cookie, from link 0's server address, replaces the one held once
    /// that was held for [`TOKEN_RENEWAL`] (or twice as long as the handshake had taken when
    /// it came, if longer): the server no longer takes it (it restarted, or the cookie expired
    /// while the path was down). Before, it may answer an INITIAL sent before the cookie came.
    pub(crate) fn handle_retry(&mut self, now: Instant, remote: SocketAddr, token: &[u8]) {
        if let HandshakeStage::Client {
            paths,
            token: t,
            next_initial,
            started,
            first_sent,
            hello,
            params,
            key,
            noise,
            ..
        } = &mut self.handshake.stage
        {
            // counted from the first INITIAL that carried it
            let held_long_enough = first_sent.filter(|_| !t.is_empty()).is_some_and(|since| {
                let took = since.saturating_duration_since(*started);
                now >= since + TOKEN_RENEWAL.max(took * 2)
            });
            let renewal =
                held_long_enough && t.as_slice() != token && remote == self.links[0].remote;
            if (t.is_empty() || renewal) && !token.is_empty() && token.len() <= 64 {
                let Some(path) = paths.iter().find(|p| p.remote == remote && !p.refused()) else {
                    return;
                };
                if (path.local, path.remote) != (self.links[0].local, self.links[0].remote) {
                    let mut link =
                        Link::open(&self.cfg, &self.local_mtus, LinkId(0), path.local, remote);
                    link.probing.next = None;
                    self.links[0] = link;
                }
                if renewal {
                    tracing::debug!("the server no longer takes our cookie: a new one");
                }
                *t = token.to_vec();
                *next_initial = now;
                *first_sent = None;
                match key {
                    Some(key) => {
                        let (hs, msg) =
                            ClientHandshake::start(key, self.handshake.local_cid, token, params);
                        *hello = msg;
                        *noise = Some(Box::new(hs));
                    }
                    None => *hello = params.clone(),
                }
            }
        }
    }

    /// ACCEPT: the handshake is complete (once the server's parameters, with a key its Noise
    /// message, check out); open the other links.
    pub(crate) fn handle_accept(
        &mut self,
        now: Instant,
        mode: u8,
        hello: &[u8],
        local_addrs: &[SocketAddr],
    ) -> Result<(), DropReason> {
        let HandshakeStage::Client {
            remotes,
            paths,
            first_sent,
            mode: our_mode,
            noise,
            key,
            ..
        } = &mut self.handshake.stage
        else {
            return Err(DropReason::UnexpectedHandshake);
        };
        if mode != *our_mode {
            return Err(DropReason::Unauthenticated);
        }
        let (params, protection) = match noise {
            // keyed, before the RETRY: the Noise message is not out yet, so no ACCEPT can
            // answer it (one taken in clear would bring the connection up unsealed)
            None if key.is_some() => return Err(DropReason::Unauthenticated),
            Some(noise) => {
                let (payload, secrets) = noise
                    .finish(hello)
                    .map_err(|_| DropReason::Unauthenticated)?;
                let Ok(params) = wire::ServerParams::decode(&payload) else {
                    // authenticated, so the server's own: the handshake has read its message
                    // and can read no repeat of it, so waiting would last until the timeout
                    self.fail(ConnectionError::ProtocolViolation(
                        "the server's parameters do not decode",
                    ));
                    return Err(DropReason::Undecodable);
                };
                let cipher = Cipher::from_code(params.cipher);
                let protection = PacketProtection::new(cipher, secrets, true, now);
                (params, Some(protection))
            }
            None => (
                wire::ServerParams::decode(hello).map_err(|_| DropReason::Undecodable)?,
                None,
            ),
        };
        let wire::ServerParams {
            scid,
            instance,
            window,
            accepts,
            addrs,
            ..
        } = params;
        self.handshake.peer_accepts = accepts;
        if accepts & wire::accepts::DATAGRAMS == 0 {
            // queued while the client could only assume the server takes them: sent, they
            // would end the connection (§5.9)
            self.datagrams
                .outgoing
                .drop_all("the peer takes no datagrams");
        }
        self.handshake.protection = protection;
        let remotes = std::mem::take(remotes);
        let paths = std::mem::take(paths);
        let rtt_sample = first_sent.map(|t| now - t);
        self.handshake.stage = HandshakeStage::Done;
        self.handshake.peer_cid = scid;
        self.handshake.peer_instance = instance;
        self.handshake.peer_window = window;
        for s in &mut self.send {
            s.max_data = window;
        }
        self.state = ConnectionState::Established;
        self.last_rx = now;
        self.links[0].promote(now, &mut AckOutcome::default());
        if let Some(rtt) = rtt_sample {
            self.links[0].seed_rtt(rtt);
        }
        self.event(Event::Connected);
        self.event(Event::LinkStateChanged {
            link: LinkId(0),
            from: LinkState::Validating,
            to: LinkState::Up,
        });
        // a message sent during the handshake waited for the peer's window
        if self.write_wants[MESSAGE_STREAM].take().is_some() {
            self.writer_told[MESSAGE_STREAM] = true;
            self.event(Event::Writable);
        }
        // confirm at once, so the server may start sending
        self.ping_pending = Some(0);
        let given = remotes.len() > 1;
        let targets: Vec<SocketAddr> = if given {
            remotes
        } else if self.cfg.discover {
            // the peer's loopback addresses lead back to our own host unless the peer is on it
            let peer_is_local = self.links[0].remote.ip().is_loopback();
            addrs
                .iter()
                .copied()
                .filter(|a| peer_is_local || !a.ip().is_loopback())
                .collect()
        } else {
            Vec::new()
        };
        for remote in targets {
            if self.links.len() >= self.cfg.max_links.min(crate::MAX_LINKS) {
                break;
            }
            let known = (self.links.iter().map(|l| l.remote)).chain(paths.iter().map(|p| p.remote));
            let remote = addr::as_known(remote, known);
            // the endpoint there refused the handshake: it is not this server
            if (paths.iter()).any(|p| p.remote == remote && p.refused_with.is_some()) {
                continue;
            }
            // a given address keeps the local address its handshake path had: paired with
            // link 0's as the fallback, it would be another pair when the handshake went
            // over another path than the first
            let path_local = paths.iter().find(|p| p.remote == remote).map(|p| p.local);
            let Some(local) =
                path_local.or_else(|| addr::pick_local(local_addrs, remote, self.links[0].local))
            else {
                continue;
            };
            let remote = addr::scoped_like(remote, local);
            if self
                .links
                .iter()
                .any(|l| l.remote == remote && l.local == local)
            {
                continue;
            }
            let i = self.add_link(now, self.free_link_id(), local, remote);
            // an address the application did not give: only the peer vouches for it
            self.links[i].unproven_address = !given;
        }
        Ok(())
    }

    /// The lowest wire ID no link of this connection uses.
    fn free_link_id(&self) -> LinkId {
        (0..=u8::MAX)
            .map(LinkId)
            .find(|&id| self.link_index(id).is_none())
            .expect("a connection has at most MAX_LINKS links")
    }

    /// Position in `links` of the link with wire ID `id`.
    fn link_index(&self, id: LinkId) -> Option<usize> {
        self.links.iter().position(|l| l.id == id)
    }

    fn add_link(
        &mut self,
        now: Instant,
        id: LinkId,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> usize {
        let mut link = Link::open(&self.cfg, &self.local_mtus, id, local, remote);
        link.probing.next = Some(now);
        self.links.push(link);
        self.event(Event::LinkAdded { link: id });
        self.links.len() - 1
    }

    /// A repeated INITIAL from the client: its ACCEPT was lost.
    pub(crate) fn handle_initial_again(&mut self) {
        if let HandshakeStage::Server { accept_pending, .. } = &mut self.handshake.stage {
            *accept_pending = true;
        }
    }

    /// The connection ID the peer chose (0 until known).
    pub(crate) fn peer_cid(&self) -> u64 {
        self.handshake.peer_cid
    }

    /// The run of the peer's endpoint, from its handshake parameters.
    pub(crate) fn peer_instance(&self) -> u64 {
        self.handshake.peer_instance
    }

    /// The keys of a connection whose handshake is done with a key.
    pub(crate) fn protection(&self) -> Option<&PacketProtection> {
        self.handshake.protection.as_ref()
    }

    /// The connection ID this side chose.
    pub(crate) fn local_cid(&self) -> u64 {
        self.handshake.local_cid
    }

    /// The address pair the handshake went over (link 0's).
    pub(crate) fn handshake_path(&self) -> (SocketAddr, SocketAddr) {
        (self.links[0].local, self.links[0].remote)
    }

    /// The position of the link with ID `link` over `local` → `remote`, if it has sent a
    /// packet numbered `pn` (so an ICMP error quoting that packet may be about it).
    pub(crate) fn link_that_sent(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        link: LinkId,
        pn: u64,
    ) -> Option<usize> {
        let i = self.link_index(link)?;
        let l = &self.links[i];
        (l.local == local && l.remote == remote && pn < l.recovery.next_pn()).then_some(i)
    }

    /// Whether short packets may be sent: established, and (server) the client confirmed it
    /// received the ACCEPT.
    fn can_send_short(&self) -> bool {
        matches!(
            self.state,
            ConnectionState::Established | ConnectionState::Draining
        ) && !self.is_unconfirmed_server()
    }

    /// A server connection whose client has not yet sent a short packet: the application
    /// does not know it (it is not accepted and reports no event), and the endpoint forgets
    /// it itself if it ends so.
    pub(crate) fn is_unconfirmed_server(&self) -> bool {
        self.handshake.is_unconfirmed_server()
    }

    /// Whether the client confirmed this server connection since the last call: the endpoint
    /// then hands it to the application.
    pub(crate) fn take_confirmed(&mut self) -> bool {
        std::mem::take(&mut self.handshake.confirmed_now)
    }

    /// The operating system reports the path `local` → `remote` unusable.
    pub(crate) fn link_unreachable(&mut self, now: Instant, local: SocketAddr, remote: SocketAddr) {
        if let Some(i) = self
            .links
            .iter()
            .position(|l| l.local == local && l.remote == remote && l.is_up())
        {
            tracing::debug!(link = i, "the system reports the path unreachable");
            self.set_link_state(i, now, LinkState::Down);
        }
    }

    /// The operating system refuses to send datagrams of `size` bytes from `local` to
    /// `remote` (see [`crate::Endpoint::handle_too_big`]): a link there that cannot send even
    /// its base size is down. Returns whether that changed a link.
    pub(crate) fn link_too_big(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        size: usize,
    ) -> bool {
        let Some(i) = self.links.iter().position(|l| {
            l.local == local && l.remote == remote && l.is_up() && size <= l.pmtu.base()
        }) else {
            return false;
        };
        tracing::warn!(
            link = i,
            size,
            %local,
            %remote,
            "the interface takes no datagram of the link's base size (its MTU was lowered?): \
             link down"
        );
        self.set_link_state(i, now, LinkState::Down);
        true
    }

    /// The peer's host answered a datagram this connection sent on link `i` with "port
    /// unreachable" (the endpoint checked that the ICMP quotes it). ICMP is not
    /// authenticated, so this only raises the question: a handshake ends after
    /// [`REFUSALS_TO_GIVE_UP`] of them (a server starting on the port is briefly away); an
    /// established connection asks every up link for an acknowledgement at once and ends
    /// only if the peer then stays silent ([`Self::peer_gone_deadline`]), so a forged ICMP
    /// costs a PING per link.
    pub(crate) fn port_unreachable(&mut self, now: Instant, i: usize) {
        self.links[i].port_unreachable += 1;
        tracing::debug!(
            link = i,
            count = self.links[i].port_unreachable,
            "port unreachable"
        );
        match self.state {
            // a client's INITIALs are counted by path ([`Self::initial_refused`])
            ConnectionState::Connecting => {}
            ConnectionState::Established | ConnectionState::Draining => {
                if self.closing.refused_at.is_none() {
                    self.closing.refused_at = Some(now);
                    for (j, l) in self.links.iter().enumerate() {
                        if l.is_up() {
                            self.pings_owed |= 1 << j;
                        }
                    }
                }
            }
            ConnectionState::Closed => {}
        }
    }

    /// A bare PING arrived on link `i` (the peer's keepalive or probe; acknowledged at once,
    /// PROTOCOL.md §5.2): if this side's own keepalive on the link falls due within half an
    /// interval, it goes now, with that acknowledgement (§6.3). The two sides' keepalives then
    /// take three packets (PING; ACK and PING; ACK) and wake each side twice, instead of four
    /// packets and a delayed-ACK timer each. The peer's answer to ours is a bare ACK: its
    /// keepalive was just sent, so this never turns into a PING exchange.
    fn answer_ping(&mut self, now: Instant, i: usize) {
        let link = &self.links[i];
        let soon = now.checked_add(self.cfg.keepalive_interval / 2);
        if link.is_up()
            && link
                .keepalive_deadline(&self.cfg)
                .is_some_and(|d| soon.is_none_or(|soon| d <= soon))
        {
            self.pings_owed |= 1 << i;
        }
    }

    /// When the peer counts as gone, if its host answered "port unreachable" since it was
    /// last heard: once the PINGs that answer asked for had time to be acknowledged (two
    /// PTOs) and the peer has been silent for [`PEER_GONE_SILENCE`]. A peer that still
    /// answers on any link clears the question by being heard.
    pub(super) fn peer_gone_deadline(&self) -> Option<Instant> {
        let refused = self.closing.refused_at?;
        Some((refused + 2 * self.max_pto()).max(self.last_rx + PEER_GONE_SILENCE))
    }

    /// The peer's host refused our packets and the peer stayed silent: it is gone. A
    /// connection that was only lingering after a clean end (everything delivered both ways)
    /// just ends; otherwise it ends with [`ConnectionError::PeerGone`], without a CLOSE
    /// (nobody is there to read it).
    pub(super) fn peer_gone(&mut self) {
        self.closing.refused_at = None;
        match self.state {
            ConnectionState::Draining => self.set_closed(None),
            _ => self.set_closed(Some(ConnectionError::PeerGone)),
        }
    }

    /// The host at the end of the handshake path `local` → `remote` answered an INITIAL of
    /// this connecting client with "port unreachable" (the endpoint checked that the ICMP
    /// quotes it). After [`REFUSALS_TO_GIVE_UP`] such answers the path is tried no more (a
    /// server starting on the port is briefly away), and the handshake ends with
    /// [`ConnectionError::Refused`] once no path is left: none, or with a cookie held, link
    /// 0's. Returns whether the path is one of this connection's.
    pub(crate) fn initial_refused(&mut self, local: SocketAddr, remote: SocketAddr) -> bool {
        let HandshakeStage::Client { paths, token, .. } = &mut self.handshake.stage else {
            return false;
        };
        let Some(path) = paths
            .iter_mut()
            .find(|p| p.local == local && p.remote == remote)
        else {
            return false;
        };
        path.refusals += 1;
        tracing::debug!(%local, %remote, count = path.refusals, "INITIAL refused");
        let link0 = (self.links[0].local, self.links[0].remote);
        let gone = if token.is_empty() {
            paths.iter().all(HandshakePath::refused)
        } else {
            paths
                .iter()
                .any(|p| (p.local, p.remote) == link0 && p.refused())
        };
        if gone && self.state == ConnectionState::Connecting {
            // with a cookie it is link 0's path that nothing listens at any more
            let e = match token.is_empty() {
                true => handshake_refusal(paths),
                false => ConnectionError::Refused,
            };
            self.set_closed(Some(e));
        }
        true
    }

    /// Whether an answer to an INITIAL from `remote` (a RETRY or a REFUSE) may be for this
    /// connecting client: it comes from where its INITIALs went, which is link 0's address
    /// alone once it holds a cookie (bound to that pair).
    pub(crate) fn answers_initial_from(&self, remote: SocketAddr) -> bool {
        match &self.handshake.stage {
            HandshakeStage::Client { paths, token, .. } if token.is_empty() => {
                paths.iter().any(|p| p.remote == remote && !p.refused())
            }
            _ => self.links[0].remote == remote,
        }
    }

    /// Whether the peer has been heard from `remote`: link 0's address (the handshake's), or
    /// one a packet of this connection arrived from, where the peer has shown that it
    /// answers. A link the peer opened takes the address of a packet before any answer
    /// validated it, and that packet may be the peer's own replayed from another host by
    /// someone on the path (§4.4): that host, holding the key too, would answer our probes
    /// with RESETs whose tokens are good for its address (§8.4).
    pub(crate) fn heard_from(&self, remote: SocketAddr) -> bool {
        (self.links.iter().enumerate()).any(|(i, l)| {
            l.remote == remote
                && (i == 0 || (l.counters.packets_received > 0 && !l.address_unproven()))
        })
    }

    /// Whether any of this connection's links leads to `remote`.
    pub(crate) fn has_remote(&self, remote: SocketAddr) -> bool {
        self.links.iter().any(|l| l.remote == remote)
    }

    /// Whether a link of this connection leads to `remote` and the peer has shown that it is
    /// there (see [`Self::heard_from`]).
    pub(crate) fn has_proven_remote(&self, remote: SocketAddr) -> bool {
        (self.links.iter()).any(|l| l.remote == remote && !l.address_unproven())
    }

    /// A client still connecting: whether its handshake goes out under connection ID `cid`.
    pub(crate) fn is_connecting_as(&self, cid: u64) -> bool {
        self.state == ConnectionState::Connecting && cid != 0 && self.handshake.local_cid == cid
    }

    /// An endpoint at `remote` refused this connecting client (a REFUSE saying why, or a RESET
    /// for the server's connection limit: [`ConnectionError::ServerFull`]). Before a cookie
    /// is held any handshake path's host may answer, and it need not be the server (an
    /// endpoint that takes no connections): that path is tried no more, and the handshake
    /// ends with `e` once no path is left. With a cookie only link 0's server answers, and
    /// the handshake ends.
    pub(crate) fn refused_by_server(&mut self, remote: SocketAddr, e: ConnectionError) {
        if self.state != ConnectionState::Connecting {
            return;
        }
        if let HandshakeStage::Client { paths, token, .. } = &mut self.handshake.stage {
            if token.is_empty() {
                tracing::debug!(%remote, error = %e, "handshake refused at one address");
                for p in paths.iter_mut().filter(|p| p.remote == remote) {
                    p.refused_with = Some(e.clone());
                }
                if !paths.iter().all(HandshakePath::refused) {
                    return;
                }
            }
        }
        self.set_closed(Some(e));
    }

    /// The application this side speaks, as its handshake names it.
    pub(crate) fn application(&self) -> Option<&str> {
        self.cfg.application.as_deref()
    }

    /// A client's handshake went unanswered (a server's: never confirmed) for the handshake
    /// timeout. A client one of whose addresses refused it ends with that refusal.
    pub(super) fn handshake_timed_out(&mut self) {
        // an endpoint at one of the addresses said why it would not connect: that is the
        // answer there was
        let refused = match &self.handshake.stage {
            HandshakeStage::Client { paths, .. } => first_refusal(paths),
            _ => None,
        };
        let e = refused.unwrap_or(ConnectionError::TimedOut(self.cfg.handshake_timeout));
        self.set_closed(Some(e));
    }

    /// Whether a RESET is authentic for this connection: with a key, it must carry the token
    /// only a holder of the key can make.
    pub(crate) fn is_keyed(&self) -> bool {
        self.handshake.is_keyed()
    }

    /// A short packet for this connection: `datagram` holds it whole, its header
    /// `header_len` bytes; with a key it is opened in place. `Err` says why it was dropped
    /// without effect.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn handle_short(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        link_id: LinkId,
        pn: u64,
        phase: u8,
        header_len: usize,
        datagram: &mut [u8],
        opened: Option<&Opened>,
    ) -> Result<(), DropReason> {
        if self.state == ConnectionState::Connecting {
            return Err(DropReason::WrongState);
        }
        let datagram_len = datagram.len();
        let payload: &[u8] = match (&mut self.handshake.protection, opened) {
            (None, None) => &datagram[header_len..],
            // opened outside under a key this connection does not have (any more)
            (None, Some(_)) => return Err(DropReason::Unauthenticated),
            (Some(protection), opened) => {
                // a replay is rejected before the cost of opening it
                if let Some(i) = self.links.iter().position(|l| l.id == link_id) {
                    if !self.links[i].ack.is_new(now, pn) {
                        return Err(DropReason::Duplicate);
                    }
                }
                let (header, body) = datagram.split_at_mut(header_len);
                let result = match opened {
                    // opened already: under a key that still opens this phase here? (It
                    // authenticated, so a refusal is no failure of authentication.)
                    Some(o) if protection.accept_opened(phase, o.key()) => Ok(o.len()),
                    Some(_) => return Err(DropReason::Unauthenticated),
                    None => protection.open(link_id, pn, phase, header, body),
                };
                match result {
                    Ok(len) => &body[..len],
                    Err(_) => {
                        if protection.auth_failures >= MAX_AUTH_FAILURES {
                            // the AEAD's integrity limit: forgeries might start to succeed
                            self.fail(ConnectionError::ProtocolViolation(
                                "too many packets failed authentication",
                            ));
                        }
                        return Err(DropReason::Unauthenticated);
                    }
                }
            }
        };
        if self.state == ConnectionState::Closed {
            // After a clean close, tell a peer still retransmitting that everything it sent
            // arrived (its last acknowledgements were lost), so it can finish cleanly too.
            if let Some(i) = self.link_index(link_id) {
                // (not to an address the peer never answered at: a spoofed one's owner would
                // get a datagram of acknowledgements for each small packet)
                // (nor to a packet that asks for no acknowledgement, a CLOSE among them:
                // two sides closed cleanly would answer each other's answers for as long as
                // both are kept)
                if self.closing.reason.is_none()
                    && self.links[i].remote == remote
                    && !self.links[i].address_unproven()
                    && Frames::new(payload).any(|f| f.is_ok_and(|f| elicits_ack(&f)))
                {
                    // what arrives now is acknowledged with the answer too: it may carry the
                    // peer's repairs of packets it declared lost
                    let arrival = Arrival {
                        ack_eliciting: false,
                        sending: false,
                        size: datagram_len,
                    };
                    self.links[i].on_received(now, pn, arrival, &self.cfg);
                    if !self.closing.sends.contains(&i) {
                        self.closing.frame = Some((CLOSE_DONE, String::new()));
                        self.closing.sends.push(i);
                    }
                }
            }
            return Err(DropReason::WrongState);
        }
        // Parse every frame before acting on any: a malformed packet is dropped whole. (Kept,
        // so the frames are parsed once; a full-size data packet holds a handful.)
        let mut frames: SmallVec<[Frame<'_>; 4]> = SmallVec::new();
        let mut ack_eliciting = false;
        // more than a PING asks for an answer: the peer is sending (PROTOCOL.md §6.3)
        let mut sending = false;
        for f in Frames::new(payload) {
            let f = f.map_err(|_| DropReason::MalformedFrame)?;
            let eliciting = elicits_ack(&f);
            ack_eliciting |= eliciting;
            sending |= eliciting && !matches!(f, Frame::Ping);
            frames.push(f);
        }
        let i = match self.link_index(link_id) {
            Some(i) => i,
            None => {
                // the peer opened a new link: a new ID over a new address pair
                if self.links.len() >= self.cfg.max_links.min(crate::MAX_LINKS)
                    || usize::from(link_id.0) >= crate::MAX_LINKS
                    || self
                        .links
                        .iter()
                        .any(|l| l.local == local && l.remote == remote)
                {
                    return Err(DropReason::UnknownLink);
                }
                let new = self.add_link(now, link_id, local, remote);
                self.links[new].peer_opened = true;
                new
            }
        };
        if self.links[i].local != local || self.links[i].remote != remote {
            // Links do not migrate, except one the peer opened that no answer validated yet:
            // it may have been opened by someone who replayed the peer's first packet on it
            // from elsewhere, ahead of the original. This packet is newer than any the link
            // had (with a key it authenticated: it is the peer's own), so the link moves to
            // where it came from.
            let link = &self.links[i];
            let unvalidated = link.peer_opened && !link.was_up();
            let taken = (self.links.iter()).any(|l| l.local == local && l.remote == remote);
            if !unvalidated || taken || !link.ack.is_new(now, pn) {
                return Err(DropReason::UnknownLink);
            }
            tracing::debug!(link = %link_id, from = %link.remote, to = %remote, "unvalidated link moved");
            self.links[i].rebind(now, &self.cfg, &self.local_mtus, local, remote);
        }
        // Before the packet counts as received (and is acknowledged), one look at its frames:
        // stream data that would spread the reassembly bookkeeping past its bound waits for
        // the sender's next try; and what this side said in the handshake it does not take
        // would never be read, so the connection ends rather than drop it without a word.
        let mut fragmenting = false;
        let mut refused = None;
        // fragments each stream's frames of this packet would add (counted apart, so that
        // many frames in one packet cannot all pass the bound at once)
        let mut added = [0usize; 2];
        for f in frames.iter() {
            match *f {
                Frame::Stream {
                    stream,
                    offset,
                    data,
                    ..
                } => {
                    let s = stream as usize;
                    if s == MESSAGE_STREAM && !data.is_empty() && !self.cfg.accept_messages {
                        refused = Some("a message to a side that takes no messages");
                    }
                    if self.recv[s].adds_fragment(offset, data.len() as u64) {
                        added[s] += 1;
                        fragmenting |= self.recv[s].fragments() + added[s] > MAX_FRAGMENTS;
                    }
                }
                Frame::Datagram { .. } if !self.cfg.accept_datagrams => {
                    refused = Some("a datagram to a side that takes no datagrams");
                }
                _ => {}
            }
        }
        if let Some(what) = refused {
            self.fail(ConnectionError::ProtocolViolation(what));
            return Ok(());
        }
        if fragmenting {
            return Err(DropReason::TooFragmented);
        }
        let arrival = Arrival {
            ack_eliciting,
            sending,
            size: datagram_len,
        };
        if !self.links[i].on_received(now, pn, arrival, &self.cfg) {
            return Err(DropReason::Duplicate);
        }
        if ack_eliciting && !sending {
            self.answer_ping(now, i);
        }
        if self.is_unconfirmed_server() {
            self.handshake.stage = HandshakeStage::Done;
            self.handshake.confirmed_now = true;
            self.event(Event::Connected);
            // as on the client: the first link's state is reported, so both sides' logs
            // name it (Up, unless a send of an ACCEPT on it failed meanwhile: §6.7)
            self.event(Event::LinkStateChanged {
                link: LinkId(0),
                from: LinkState::Validating,
                to: self.links[0].state,
            });
            // links the client opened before this packet confirmed the connection (this one
            // may have come on one of them) were added while no event was kept
            let opened: SmallVec<[LinkId; 4]> = (self.links.iter().map(|l| l.id))
                .filter(|&id| id != LinkId(0))
                .collect();
            for link in opened {
                self.event(Event::LinkAdded { link });
            }
        }
        self.last_rx = now;
        self.closing.refused_at = None;
        self.datagrams.peer_heard(now);
        if ack_eliciting {
            self.scheduling.last_arrival_link = i;
        }
        for f in frames {
            match f {
                Frame::Padding | Frame::Ping => {}
                Frame::Ack {
                    link,
                    largest,
                    delay_us,
                    ranges,
                } => {
                    if let Some(l) = self.link_index(link) {
                        let newest = self.on_ack_frame(now, l, largest, delay_us, ranges);
                        // only a packet the link sent and the peer acknowledged proves that
                        // the peer holds its key: not a frame's `largest`, which an
                        // authenticated but faulty peer may set beyond what was sent
                        if let (Some(p), Some(pn)) = (&mut self.handshake.protection, newest) {
                            p.on_acked(link, pn);
                        }
                    }
                }
                Frame::Stream {
                    stream,
                    offset,
                    fin,
                    data,
                } => match self.recv[stream as usize].on_data(offset, data, fin) {
                    Ok(true) if !self.readable_signalled => {
                        self.readable_signalled = true;
                        self.event(Event::Readable);
                    }
                    Ok(_) => {}
                    Err(v) => {
                        self.fail(ConnectionError::ProtocolViolation(v.0));
                        return Ok(());
                    }
                },
                Frame::Datagram { seq, part, data } => {
                    if self.datagrams.incoming.push_piece(now, i, seq, part, data)
                        && !self.readable_signalled
                    {
                        self.readable_signalled = true;
                        self.event(Event::Readable);
                    }
                }
                Frame::MaxStreamData { stream, max } => {
                    let s = &mut self.send[stream as usize];
                    s.max_data = s.max_data.max(max);
                }
                Frame::LinkStatus { link, status } => {
                    if let Some(l) = self.link_index(link) {
                        if status == wire::link_status::DEGRADED
                            && self.links[l].is_up()
                            && self.report_borne_out(now, l)
                        {
                            self.set_link_state(l, now, LinkState::Degraded);
                        }
                    }
                }
                Frame::Close { code, reason } => {
                    self.closing.sends.clear();
                    if code == CLOSE_DONE {
                        // The peer closed cleanly; the acknowledgements before this frame
                        // (PROTOCOL.md §8.2) must show that everything we sent arrived. Until
                        // they do, keep repairing for a grace period (data we declared lost is
                        // acknowledged only as its repairs reach the closed peer); a clean
                        // close that never does is no success.
                        if self.is_send_complete() {
                            self.set_closed(None);
                            return Ok(());
                        }
                        // The closed peer answers every late packet with this frame again:
                        // the first one starts the grace period, and so does each whose
                        // acknowledgements moved the repair on. A link that failed at the end
                        // can leave more to repair (what it had in flight, sent again from a
                        // congestion window started anew) than one grace period carries;
                        // a repair that stops moving still ends when it runs out.
                        let unacknowledged = self.unacknowledged_bytes();
                        if self.closing.peer_closed_until.is_none()
                            || unacknowledged < self.closing.peer_closed_unacknowledged
                        {
                            let grace = (self.max_pto() * 3).max(PEER_CLOSED_GRACE);
                            self.closing.peer_closed_until = Some(now + grace);
                            self.closing.peer_closed_unacknowledged = unacknowledged;
                        }
                        return Ok(());
                    }
                    let reason = String::from_utf8_lossy(reason).into_owned();
                    let error = match code.checked_sub(CLOSE_APP_BASE) {
                        Some(code) => ConnectionError::PeerAborted { code, reason },
                        None => ConnectionError::PeerError { code, reason },
                    };
                    self.set_closed(Some(error));
                    return Ok(());
                }
            }
        }
        self.check_complete(now);
        Ok(())
    }

    /// Whether what we sent on a link bears out the peer's report that its share of arrivals
    /// collapsed. A link that really went slow holds data of ours, and the oldest of it has
    /// waited longer than the peer's check period. A collapse of our own doing does not: with
    /// no data in flight, we stopped using the link (a small message takes only the fastest
    /// link; a keepalive PING in flight is no data: with it counted, request-response traffic
    /// had its idle link demoted now and then); with data acknowledged within a round trip,
    /// the scheduler merely gave the link less because another looked faster (at high rates
    /// on shared CPUs the shares swing, and taking that for a collapse demoted healthy links
    /// in throughput runs: item 4 of "What looked wrong" in docs/BENCHMARKS.md at commit
    /// 085a7a3).
    fn report_borne_out(&self, now: Instant, l: usize) -> bool {
        let recovery = &self.links[l].recovery;
        recovery.data_in_flight()
            && recovery
                .oldest_outstanding_sent()
                .is_some_and(|t| now.saturating_duration_since(t) > self.cfg.share_check_interval)
    }

    /// Takes an ACK frame for link `l`; returns the highest number it acknowledged among the
    /// packets the link sent.
    fn on_ack_frame(
        &mut self,
        now: Instant,
        l: usize,
        largest: u64,
        delay_us: u64,
        ranges: wire::AckRanges<'_>,
    ) -> Option<u64> {
        // An acknowledgement of numbers never sent (the peer took a forged packet numbered far
        // ahead as its largest) still acknowledges what it lists below them: the link clamps it
        // (a whole ignored frame would leave the link without acknowledgements for good).
        let mut out = std::mem::take(&mut self.scratch);
        let delay = Duration::from_micros(delay_us).min(self.cfg.max_ack_delay * 4);
        self.links[l].on_ack(now, ranges, largest, delay, &mut out);
        let probes = out.probes_acked;
        let newest = out.newest_acked.take();
        self.apply_outcome(now, &mut out);
        self.scratch = out;
        self.down_if_below_base(l, now);
        if probes > 0 && self.links[l].on_probes_acked(now, probes) {
            self.set_link_state(l, now, LinkState::Up);
        }
        newest
    }

    /// Everything sent was acknowledged and everything the peer sent arrived: linger a little
    /// to acknowledge the peer's retransmissions, then close cleanly.
    fn check_complete(&mut self, now: Instant) {
        if self.closing.peer_closed_until.is_some() && self.is_send_complete() {
            self.set_closed(None);
            return;
        }
        if self.state == ConnectionState::Established
            && self.is_send_complete()
            && self.recv.iter().all(RecvStream::is_all_received)
        {
            self.state = ConnectionState::Draining;
            self.closing.draining_until =
                Some(now + (self.max_pto() * 3).max(Duration::from_millis(100)));
        }
    }

    /// The hold of the datagrams held longest ran out: release them, or first learn whether
    /// the peer can reach us (see [`HoldOver`]).
    pub(super) fn on_hold_over(&mut self, now: Instant) {
        let rule = self.hold_rule();
        let ran_out = self
            .datagrams
            .incoming
            .release_deadline(&rule)
            .unwrap_or(now);
        // heard since the hold ran out (the answer to our PINGs, say): no need to ask; nor
        // when the hold ending now is the base hold after such an answer
        let after_answer = (self.datagrams.answered)
            .is_some_and(|at| at + self.cfg.datagram_reorder_hold >= ran_out);
        let heard_since = self.last_rx >= ran_out || after_answer;
        let silent_for = now.saturating_duration_since(self.last_rx);
        let round_trip = self
            .links
            .iter()
            .filter(|l| l.is_up())
            .map(|l| l.rtt.srtt)
            .min()
            .unwrap_or_default();
        self.datagrams.hold_over = match self.datagrams.hold_over {
            _ if self.every_link_failing() => HoldOver::Outage,
            HoldOver::No if !heard_since && silent_for > round_trip => {
                for (i, l) in self.links.iter().enumerate() {
                    if l.is_up() {
                        self.pings_owed |= 1 << i;
                    }
                }
                HoldOver::Asked(now)
            }
            // no answer within a probe timeout (an answer would have ended the wait)
            HoldOver::Asked(_) => HoldOver::Outage,
            HoldOver::No | HoldOver::Outage => HoldOver::No,
        };
        match self.datagrams.hold_over {
            HoldOver::No => {
                if self.datagrams.incoming.release_due(now, &rule) && !self.readable_signalled {
                    self.readable_signalled = true;
                    self.event(Event::Readable);
                }
            }
            HoldOver::Asked(_) => {
                tracing::debug!(?silent_for, "hold over, the peer silent: asking it");
            }
            HoldOver::Outage => {
                // the missing ones may be stranded on the dead links, to come at the heal
                tracing::debug!("every link failing: held datagrams wait for the peer");
            }
        }
    }

    /// How long a stream's head may stay put, blocking the stream, before opportunistic
    /// retransmission sends it again: the smallest probe timeout of the links that are up
    /// (the quickest link would have answered by then). None with a single link, or while no
    /// link is up; with more, whatever their states (PROTOCOL.md §5.6), so also while one
    /// alone is up.
    pub(super) fn rescue_patience(&self) -> Option<Duration> {
        if self.links.len() < 2 {
            return None;
        }
        // none while no link is up: nothing could carry the head sooner (what was in flight
        // on them is queued again as lost anyway)
        let up = self.links.iter().filter(|l| l.is_up());
        up.map(|l| l.pto(&self.cfg)).min()
    }

    /// The largest probe timeout of the links that are up (of all links when none is): what
    /// an answer over a working link may take. A link that never came up (a peer address
    /// where nothing listens) has only its initial, long estimate and carries nothing, so it
    /// must not stretch how long a finished connection lingers or waits for its peer.
    pub(super) fn max_pto(&self) -> Duration {
        let any_up = self.links.iter().any(Link::is_up);
        self.links
            .iter()
            .filter(|l| !any_up || l.is_up())
            .map(|l| l.pto(&self.cfg))
            .max()
            .unwrap_or_default()
    }
}
