//! Tunables of an endpoint and of each connection, with the documented defaults.

use std::net::SocketAddr;
use std::time::Duration;

/// How data is spread over the links that are up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Striping {
    /// Every up link carries data, each as much as it delivers (the default). Packets go where
    /// they arrive first, so small messages take the fastest link on their own.
    #[default]
    Weighted,
    /// Only the fastest up link carries data; the others stay validated and probed as hot
    /// standbys, taking over within the failover time when it fails.
    Failover,
}

/// The smallest stream receive window and send buffer: a peer that announces less (the
/// TCP transport's hello) is refused too.
pub const MIN_WINDOW: u64 = 16 * 1024;
/// The largest stream receive window (offsets stay well inside a varint).
pub const MAX_WINDOW: u64 = crate::wire::VARINT_MAX / 2;
/// Longest of the intervals the engine adds to the time of day at every turn
/// (`probe_interval`, `min_pto`, `max_ack_delay`, `share_check_interval`): far above any use,
/// and far below what would overflow an `Instant` (`Duration::MAX` did, in the engine).
pub const MAX_INTERVAL: std::time::Duration = std::time::Duration::from_secs(3600);

/// Settings of one connection (both client and server side use the same type).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectionConfig {
    /// UDP payload size every path is assumed to carry, used from the start and by every
    /// handshake, recovery probe and close (default 1472: a 1500-byte MTU less IPv4 and UDP
    /// headers); a link whose local interface sends less (an IPv6 link on a 1500-byte MTU:
    /// 1452, see [`EndpointConfig::local_max_datagram`]) uses that instead. With
    /// [`mtu_discovery`](Self::mtu_discovery), each link then finds out how much more its path
    /// carries.
    pub max_datagram_size: usize,
    /// Path MTU discovery (default on): each up link probes for larger datagrams, up to what
    /// its local interface can send (jumbo frames included; at most 16 KiB), uses the largest
    /// that arrives, and falls back to `max_datagram_size` when large datagrams stop getting
    /// through. A driver that cannot tell the interface MTU leaves links at the base size.
    pub mtu_discovery: bool,
    /// Bytes the peer may send on each stream beyond what the application has read
    /// (the receive window; default 8 MiB). Also bounds the receiver's reassembly memory: at
    /// most the window and two blocks, a block being 64 KiB or, for a smaller window, the
    /// largest power of two within it.
    pub stream_receive_window: u64,
    /// Bytes the application may have written but not yet had acknowledged, per stream
    /// (default 8 MiB). A writer that reaches it is told to wait.
    pub send_buffer: u64,
    /// Bytes of unreliable datagrams ([`crate::Connection::send_datagram`]) that may wait to
    /// be sent, and a little for each (so that many empty ones count too) (default 1 MiB); a
    /// full queue drops its oldest.
    pub datagram_send_buffer: usize,
    /// A datagram that waited this long while the queue moved is dropped unsent (default
    /// 20 ms): it would only add queueing delay. While no datagram leaves the queue (every
    /// link failing, or none up) datagrams wait, and those that waited through it are sent
    /// when it moves again, whatever their age. The
    /// queue counts as still when none left it for half this age: paths slower than one
    /// datagram per half age (about 1.2 Mbit/s at the default) want a longer one.
    pub datagram_max_age: Duration,
    /// Memory received datagrams not yet read may hold (default 1 MiB): their buffers and a
    /// little for each (so that many empty ones count too); datagrams arriving beyond it
    /// are dropped.
    pub datagram_receive_buffer: usize,
    /// Longest a received datagram is held for an earlier one still missing, to deliver them
    /// in sending order (default 5 ms; zero: deliver as they arrive). A missing datagram is
    /// given up on after it.
    pub datagram_reorder_hold: Duration,
    /// Interval between probes on a link that is down or degraded (default 20 ms). Recovery is
    /// detected within about `recovery_probes` intervals, however long the outage lasted.
    pub probe_interval: Duration,
    /// Acknowledged probes that bring a down or degraded link back (default 2; doubled, up to
    /// 32, for a link that fails again within a second of coming back).
    pub recovery_probes: u32,
    /// Probe timeouts in a row, without any acknowledgement on a link, that declare it down
    /// (default 3) while another link shows that the peer is answering. When the peer is
    /// silent on every link the link must also have been silent for 150 ms (PROTOCOL.md §5.5).
    pub failure_ptos: u32,
    /// Lower bound of a link's probe timeout (default 5 ms: on a busy host a peer may not run
    /// for a few milliseconds, and three timeouts in a row declare the link down).
    pub min_pto: Duration,
    /// How long the receiver may delay an acknowledgement (default 1 ms).
    pub max_ack_delay: Duration,
    /// Acknowledge at the latest after this many ack-eliciting packets (default 2) at low
    /// rates; at high rates the receiver waits for more, up to 32, so that about 4 ACKs go
    /// back per `max_ack_delay` (docs/PROTOCOL.md §5.2).
    pub ack_frequency: u32,
    /// Period of the receiver-side arrival-share check (default 20 ms).
    pub share_check_interval: Duration,
    /// A link whose share of arrivals in one period falls below this fraction of its usual
    /// share is reported degraded to the sender (default 0.2).
    pub share_collapse_ratio: f64,
    /// Send a keepalive on an idle link after this long, so a quiet connection still notices
    /// a dead link (default 200 ms).
    pub keepalive_interval: Duration,
    /// Close the connection with [`crate::ConnectionError::AllLinksDown`] when no link has worked
    /// for this long. `None` (the default): wait forever.
    pub all_links_down_timeout: Option<Duration>,
    /// Close the connection with [`crate::ConnectionError::IdleTimeout`] when nothing at all was
    /// received for this long. `None` (the default): never. A quiet connection hears from
    /// its peer about once per `keepalive_interval` (the keepalives' acknowledgements), so a
    /// timeout of a few keepalive intervals ends it only when the peer is gone; one shorter
    /// than `keepalive_interval` would end a healthy connection that merely has nothing to
    /// say.
    pub idle_timeout: Option<Duration>,
    /// Client only: learn the server's other addresses in the handshake and open a link to each
    /// (default true). Explicitly given remote addresses are always used.
    pub discover: bool,
    /// Most links one connection uses (default and maximum 8).
    pub max_links: usize,
    /// How data is spread over the links (default [`Striping::Weighted`]).
    pub striping: Striping,
    /// Client: give up the handshake (with [`crate::ConnectionError::TimedOut`]) after this
    /// long without an answer; server: forget a client that never confirms (default 10 s).
    pub handshake_timeout: Duration,
    /// The application this side speaks, named in the handshake (at most
    /// [`crate::wire::MAX_APPLICATION_LEN`] bytes; default none: any). A server whose
    /// connections name one refuses a client that names another
    /// ([`crate::ConnectionError::WrongApplication`] on the client), so two programs that do
    /// not understand each other find out before any data moves.
    pub application: Option<String>,
    /// Whether this side reads messages (default true). When false the peer learns it in the
    /// handshake and its `send_message` fails with [`crate::WriteError::MessagesRefused`]
    /// instead of sending what nobody reads; a message that arrives anyway ends the connection.
    pub accept_messages: bool,
    /// Whether this side reads datagrams (default true); as
    /// [`accept_messages`](Self::accept_messages), with
    /// [`crate::WriteError::DatagramsRefused`].
    pub accept_datagrams: bool,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        Self {
            max_datagram_size: 1472,
            mtu_discovery: true,
            stream_receive_window: 8 << 20,
            send_buffer: 8 << 20,
            datagram_send_buffer: 1 << 20,
            datagram_max_age: Duration::from_millis(20),
            datagram_receive_buffer: 1 << 20,
            datagram_reorder_hold: Duration::from_millis(5),
            probe_interval: Duration::from_millis(20),
            recovery_probes: 2,
            failure_ptos: 3,
            min_pto: Duration::from_millis(5),
            max_ack_delay: Duration::from_millis(1),
            ack_frequency: 2,
            share_check_interval: Duration::from_millis(20),
            share_collapse_ratio: 0.2,
            keepalive_interval: Duration::from_millis(200),
            all_links_down_timeout: None,
            idle_timeout: None,
            discover: true,
            max_links: crate::MAX_LINKS,
            striping: Striping::Weighted,
            handshake_timeout: Duration::from_secs(10),
            application: None,
            accept_messages: true,
            accept_datagrams: true,
        }
    }
}

/// Builder-style setters, `with_FIELD(value)`, one per field of a configuration struct: the
/// structs are `#[non_exhaustive]` (new settings are not breaking changes), so code outside
/// this crate cannot use struct-update syntax and writes
/// `ConnectionConfig::default().with_send_buffer(64 << 20)` instead.
macro_rules! setters {
    ($ty:ty { $($field:ident => $with:ident: $t:ty),* $(,)? }) => {
        impl $ty {
            $(
                #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
                #[must_use]
                pub fn $with(mut self, value: $t) -> Self {
                    self.$field = value;
                    self
                }
            )*
        }
    };
}

setters!(ConnectionConfig {
    max_datagram_size => with_max_datagram_size: usize,
    mtu_discovery => with_mtu_discovery: bool,
    stream_receive_window => with_stream_receive_window: u64,
    send_buffer => with_send_buffer: u64,
    datagram_send_buffer => with_datagram_send_buffer: usize,
    datagram_max_age => with_datagram_max_age: Duration,
    datagram_receive_buffer => with_datagram_receive_buffer: usize,
    datagram_reorder_hold => with_datagram_reorder_hold: Duration,
    probe_interval => with_probe_interval: Duration,
    recovery_probes => with_recovery_probes: u32,
    failure_ptos => with_failure_ptos: u32,
    min_pto => with_min_pto: Duration,
    max_ack_delay => with_max_ack_delay: Duration,
    ack_frequency => with_ack_frequency: u32,
    share_check_interval => with_share_check_interval: Duration,
    share_collapse_ratio => with_share_collapse_ratio: f64,
    keepalive_interval => with_keepalive_interval: Duration,
    all_links_down_timeout => with_all_links_down_timeout: Option<Duration>,
    idle_timeout => with_idle_timeout: Option<Duration>,
    discover => with_discover: bool,
    max_links => with_max_links: usize,
    striping => with_striping: Striping,
    handshake_timeout => with_handshake_timeout: Duration,
    accept_messages => with_accept_messages: bool,
    accept_datagrams => with_accept_datagrams: bool,
});

setters!(EndpointConfig {
    local_addrs => with_local_addrs: Vec<SocketAddr>,
    transport => with_transport: Transport,
    accept_incoming => with_accept_incoming: bool,
    advertised_addrs => with_advertised_addrs: Vec<SocketAddr>,
    server_connection => with_server_connection: ConnectionConfig,
    cookie_lifetime => with_cookie_lifetime: Duration,
    local_max_datagram => with_local_max_datagram: Vec<(SocketAddr, usize)>,
    close_linger => with_close_linger: Duration,
    max_connections => with_max_connections: usize,
    max_connections_per_address => with_max_connections_per_address: usize,
    max_keyed_handshakes_per_second => with_max_keyed_handshakes_per_second: Option<u32>,
    key => with_key: Option<crate::Key>,
    shards => with_shards: Option<usize>,
    send_threads => with_send_threads: LinkThreads,
    recv_threads => with_recv_threads: LinkThreads,
    shard => with_shard: Shard,
});

impl ConnectionConfig {
    /// Sets [`application`](Self::application).
    #[must_use]
    pub fn with_application(mut self, name: impl Into<String>) -> Self {
        self.application = Some(name.into());
        self
    }

    /// The [`crate::wire::accepts`] bits of these settings.
    pub(crate) fn accepts(&self) -> u8 {
        let mut bits = 0;
        if self.accept_messages {
            bits |= crate::wire::accepts::MESSAGES;
        }
        if self.accept_datagrams {
            bits |= crate::wire::accepts::DATAGRAMS;
        }
        bits
    }

    /// Checks that the settings can work together.
    pub fn validate(&self) -> Result<(), crate::ConnectError> {
        use crate::ConnectError::InvalidConfig;
        // INITIAL packets are 1200 bytes; STREAM frames reserve a 2-byte length (< 16 KiB)
        if !(crate::wire::MIN_INITIAL_SIZE..=crate::wire::MAX_DATAGRAM_SIZE)
            .contains(&self.max_datagram_size)
        {
            return Err(InvalidConfig(
                "max_datagram_size must be 1200 to 16384 bytes",
            ));
        }
        if self.stream_receive_window < MIN_WINDOW || self.send_buffer < MIN_WINDOW {
            return Err(InvalidConfig("windows and buffers must be at least 16 KiB"));
        }
        if self.stream_receive_window > MAX_WINDOW {
            return Err(InvalidConfig("stream_receive_window too large"));
        }
        if self.probe_interval.is_zero()
            || self.share_check_interval.is_zero()
            || self.keepalive_interval.is_zero()
        {
            return Err(InvalidConfig(
                "probe, share-check and keepalive intervals must be positive",
            ));
        }
        let intervals = [
            self.probe_interval,
            self.min_pto,
            self.max_ack_delay,
            self.share_check_interval,
        ];
        if intervals.iter().any(|&i| i > MAX_INTERVAL) {
            return Err(InvalidConfig(
                "probe_interval, min_pto, max_ack_delay and share_check_interval must be at \
                 most an hour",
            ));
        }
        if self.recovery_probes == 0 || self.failure_ptos == 0 || self.ack_frequency == 0 {
            return Err(InvalidConfig(
                "probe and acknowledgement counts must be positive",
            ));
        }
        if self.handshake_timeout.is_zero() {
            return Err(InvalidConfig("handshake_timeout must be positive"));
        }
        if !(1..=crate::MAX_LINKS).contains(&self.max_links) {
            return Err(InvalidConfig("max_links must be 1 to 8"));
        }
        if self
            .application
            .as_ref()
            .is_some_and(|a| a.is_empty() || a.len() > crate::wire::MAX_APPLICATION_LEN)
        {
            return Err(InvalidConfig("application must be 1 to 64 bytes"));
        }
        Ok(())
    }
}

/// What carries a connection's links (both ends must use the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Transport {
    /// One UDP socket per local address; ri2n's own congestion control, repair and
    /// unreliable datagrams (docs/PROTOCOL.md §1-§11).
    #[default]
    Udp,
    /// One TCP connection per address pair, the stream striped over them from both ends of
    /// each stretch as Enhanced MuniSocket does, with ri2n's failover on top (PROTOCOL.md
    /// §12). Carries the byte stream and whole messages, in one order (§12.7); unreliable
    /// datagrams are refused.
    Tcp,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        })
    }
}

/// Settings of an endpoint: the local addresses it owns and whether it accepts connections.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EndpointConfig {
    /// Local addresses, one per link the host can offer (one UDP socket each in a real driver).
    pub local_addrs: Vec<SocketAddr>,
    /// What carries the links (default UDP).
    pub transport: Transport,
    /// Accept incoming connections (a server). An endpoint that does not answers a handshake
    /// with a refusal ([`crate::ConnectionError::NotAccepting`] on the client).
    pub accept_incoming: bool,
    /// Addresses a server tells its clients about; empty means `local_addrs`.
    pub advertised_addrs: Vec<SocketAddr>,
    /// Configuration given to accepted connections.
    pub server_connection: ConnectionConfig,
    /// How long a retry cookie stays valid (default 10 s).
    pub cookie_lifetime: Duration,
    /// Largest UDP payload each local address can send, from its interface's MTU: the
    /// ceiling of path MTU discovery on links from that address. A driver fills it in;
    /// addresses it does not list stay at `max_datagram_size`.
    pub local_max_datagram: Vec<(SocketAddr, usize)>,
    /// Drivers: how long closing the endpoint (dropping its last handle, or an explicit
    /// close) waits for its connections to deliver what was written to them (default 10 s);
    /// also how long a connection whose handle was dropped waits for a silent peer before it
    /// ends (at least a second and three keepalive intervals), and how long one that ended
    /// cleanly is kept once released, to confirm that end to a peer that missed its last
    /// acknowledgements ([`crate::Endpoint::release`]).
    pub close_linger: Duration,
    /// Server: connections it holds at most (default 4096): open ones, ones still waiting for
    /// the client's confirmation, and closed ones the application has not yet released (not
    /// yet accepted, or whose handle it still holds), so that connections nobody collects
    /// cannot grow memory without end. A client beyond the limit is refused at once
    /// ([`crate::ConnectionError::ServerFull`]) instead of waiting for a handshake that never
    /// completes.
    pub max_connections: usize,
    /// Server: open connections it holds at most with any one client IP address (default 256).
    pub max_connections_per_address: usize,
    /// The cluster key (default none). With a key, every connection is authenticated by it
    /// and encrypted with fresh keys (docs/PROTOCOL.md §9); peers must hold the same key. An
    /// endpoint without a key talks only to peers without one, in clear.
    pub key: Option<crate::Key>,
    /// Server with a key: keyed handshake messages it reads per second at most, all its shards
    /// together (default 5 000, in bursts of a fiftieth of that), so that a flood of INITIALs (each
    /// worth a cookie check and a Noise message, even when it then fails) cannot hold up
    /// established connections; INITIALs beyond it are dropped unread and their clients retransmit.
    /// `None`: no limit.
    pub max_keyed_handshakes_per_second: Option<u32>,
    /// Drivers: how many engines (shards) the endpoint runs side by side, each with a thread
    /// and sockets of its own on the same addresses, its connections spread over them
    /// (`None`, the default: a server one per CPU the process may run on, at most
    /// [`MAX_SHARDS`]; a client one). At most [`SHARDS_LIMIT`].
    pub shards: Option<usize>,
    /// Drivers: whether each link socket gets a thread of its own that seals and sends what
    /// the engine built, so that one connection that fills its links uses a core per link
    /// besides the one that builds (default [`LinkThreads::Auto`]).
    pub send_threads: LinkThreads,
    /// Drivers: whether each link socket gets a thread of its own that receives and opens
    /// what arrives on it and hands it to the engine, so that one connection's links are
    /// received on a core each (default [`LinkThreads::Auto`]). A blocked application call
    /// still receives for itself what arrives while it waits.
    pub recv_threads: LinkThreads,
    /// Which share of connection IDs this engine picks its own from ([`Shard`]); a driver
    /// that runs several engines on the same sockets sets it, one share each.
    pub shard: Shard,
    /// The endpoint's connections, counted with the other shards of the endpoint, and its
    /// rate limits (RESETs sent, keyed handshake messages read), shared with them (set by a
    /// driver that runs several, so that the limits hold for all): `None` counts this
    /// engine's own (the engine then makes a count of its own).
    pub connection_counts: Option<std::sync::Arc<crate::ConnectionCounts>>,
}

/// Whether a driver gives each link socket a thread of its own: one that seals and sends
/// ([`EndpointConfig::send_threads`]), one that receives and opens
/// ([`EndpointConfig::recv_threads`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LinkThreads {
    /// Where the process may use many CPUs (8 or more): on few, the other threads keep the
    /// CPUs busy already, and handing the datagrams to another thread costs more than it
    /// gives.
    #[default]
    Auto,
    /// Always.
    On,
    /// Never: the thread that built the datagrams sends them; the thread that watches the
    /// sockets receives.
    Off,
}

/// The name [`LinkThreads`] had when it chose the sending threads alone.
pub type SendThreads = LinkThreads;

/// Most shards a driver runs for one endpoint by default.
pub const MAX_SHARDS: usize = 16;

/// Most shards an endpoint may be given (`shards`): a driver tells the shards it forwarded
/// datagrams to with one bit each of a 64-bit word.
pub const SHARDS_LIMIT: usize = 64;

/// An engine's share of connection IDs, when a driver runs several engines ("shards") on the
/// same addresses: every ID it picks for itself satisfies [`Shard::owns`], so a datagram can
/// be steered to the engine of its connection by the ID it carries (docs/PROTOCOL.md §2.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This engine's number, below `count`.
    pub index: u32,
    /// How many engines share the addresses.
    pub count: u32,
}

impl Shard {
    /// The one engine of its addresses: every ID is its own.
    pub const ONLY: Shard = Shard { index: 0, count: 1 };

    /// The shard whose share connection ID `cid` is in, of `count` shards: its upper 32 bits
    /// modulo `count` (the bits a kernel steering program reads first).
    pub fn of(cid: u64, count: u32) -> u32 {
        ((cid >> 32) as u32) % count.max(1)
    }

    /// Whether `cid` is in this shard's share.
    pub fn owns(&self, cid: u64) -> bool {
        Self::of(cid, self.count) == self.index
    }

    /// The ID of this shard's share nearest to the random number `r`: `r` itself with one
    /// shard; else its upper 32 bits moved down (or, at the top of the range, up) to the next
    /// value in the share. Its lower 32 bits stay random.
    pub fn claim(&self, r: u64) -> u64 {
        if self.count <= 1 {
            return r;
        }
        let (count, index) = (u64::from(self.count), u64::from(self.index));
        let hi = r >> 32;
        let mut claimed = hi - hi % count + index;
        if claimed > u64::from(u32::MAX) {
            claimed -= count;
        }
        (claimed << 32) | (r & 0xffff_ffff)
    }
}

impl Default for Shard {
    fn default() -> Self {
        Self::ONLY
    }
}

impl EndpointConfig {
    /// A configuration with the given local addresses and every other setting at its default.
    pub fn new(local_addrs: Vec<SocketAddr>) -> Self {
        Self {
            local_addrs,
            transport: Transport::Udp,
            accept_incoming: false,
            advertised_addrs: Vec::new(),
            server_connection: ConnectionConfig::default(),
            cookie_lifetime: Duration::from_secs(10),
            local_max_datagram: Vec::new(),
            close_linger: Duration::from_secs(10),
            max_connections: 4096,
            max_connections_per_address: 256,
            max_keyed_handshakes_per_second: Some(5000),
            key: None,
            shards: None,
            send_threads: LinkThreads::Auto,
            recv_threads: LinkThreads::Auto,
            shard: Shard::ONLY,
            connection_counts: None,
        }
    }

    /// Checks the endpoint's settings (drivers call this before [`crate::Endpoint::new`]).
    pub fn validate(&self) -> Result<(), crate::ConnectError> {
        if self.local_addrs.is_empty() {
            return Err(crate::ConnectError::InvalidConfig("no local address"));
        }
        if self.shards == Some(0) {
            return Err(crate::ConnectError::InvalidConfig(
                "shards must be at least 1",
            ));
        }
        if self.shards.is_some_and(|n| n > SHARDS_LIMIT) {
            return Err(crate::ConnectError::InvalidConfig("at most 64 shards"));
        }
        if self.shard.count == 0 || self.shard.index >= self.shard.count {
            return Err(crate::ConnectError::InvalidConfig(
                "a shard's index must be below the shard count",
            ));
        }
        self.server_connection.validate()
    }

    /// The same configuration, accepting incoming connections.
    pub fn server(mut self) -> Self {
        self.accept_incoming = true;
        self
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// An interval the engine adds to the time at every turn is refused beyond an hour: one
    /// of `Duration::MAX` made the engine panic on its first use ("overflow when adding
    /// duration to instant"), in the driver's thread. An hour is taken.
    #[test]
    fn intervals_beyond_an_hour_are_refused() {
        let set: [fn(&mut ConnectionConfig, Duration); 4] = [
            |c, d| c.probe_interval = d,
            |c, d| c.min_pto = d,
            |c, d| c.max_ack_delay = d,
            |c, d| c.share_check_interval = d,
        ];
        for (i, set) in set.iter().enumerate() {
            for (d, ok) in [(MAX_INTERVAL, true), (Duration::MAX, false)] {
                let mut c = ConnectionConfig::default();
                set(&mut c, d);
                assert_eq!(c.validate().is_ok(), ok, "interval {i}, {d:?}");
            }
        }
    }
}
