//! `ri2n`: move data over several network links at once, measure multi-link setups, and show
//! the transport at work. This file only declares the options and maps results to exit codes;
//! each subcommand lives in its own module.

/// Writes a line to stderr, as `eprintln!` does, but a line that cannot be written (stderr a
/// closed pipe: `2>&1 | head -1`; a full disk) is lost instead of panicking: `eprintln!` made
/// a finished transfer exit 101 and, in the signal thread, left a process that no longer
/// answered Ctrl-C.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod alloc;
mod bench;
mod checksum;
mod control;
mod demo;
mod error;
mod fault;
mod interrupt;
mod key;
mod monitor;
mod net;
mod pace;
mod progress;
mod recv;
mod report;
mod send;
mod serve;
mod tunnel;

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use error::{Failure, EXIT_CODES_HELP, SERVE_EXIT_CODES_HELP};

#[global_allocator]
static ALLOCATOR: alloc::PageAlignedLarge = alloc::PageAlignedLarge;
use fault::FaultSpec;

/// ri2n: one reliable channel striped over several UDP links.
///
/// Data is striped over every healthy link; a link that fails is detected within
/// milliseconds, its data is re-sent on the others, and it is taken back when it heals.
/// If every link is down the transfer waits and resumes by itself.
///
/// Quick start: `ri2n demo` (no root, no configuration). Between two hosts with two links
/// each (10.0.1.0/24 and 10.0.2.0/24):
///   host B: ri2n recv --listen 10.0.1.2:7000 --listen 10.0.2.2:7000 --output FILE
///   host A: ri2n send --to 10.0.1.2:7000 --local 10.0.1.1 --local 10.0.2.1 --input FILE
/// Benchmark: `ri2n serve --listen ...` on one host, `ri2n bench --to ...` on the other.
#[derive(Parser, Debug)]
#[command(
    name = "ri2n",
    version = env!("RI2N_VERSION"),
    verbatim_doc_comment,
    after_help = EXIT_CODES_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Send a file or stdin to `ri2n recv`; exit 0 once the receiver wrote out every byte.
    #[command(after_help = EXIT_CODES_HELP)]
    Send(SendArgs),
    /// Accept one connection and write what it sends to a file or stdout (a second sender
    /// while it runs is refused: exit 3, "reached its connection limit").
    #[command(after_help = EXIT_CODES_HELP)]
    Recv(RecvArgs),
    /// Long-running benchmark server for `ri2n bench` (several clients at once).
    #[command(after_help = SERVE_EXIT_CODES_HELP)]
    Serve(ServeArgs),
    /// Measure throughput (with a per-interval, per-link timeline; several connections at once
    /// with -P, a target rate with -b) or latency against `ri2n serve`.
    #[command(after_help = EXIT_CODES_HELP)]
    Bench(BenchArgs),
    /// Two links on loopback in this process: move data, cut a link, restore it, check the bytes.
    #[command(after_help = DEMO_HELP)]
    Demo(DemoArgs),
    /// Make a new random cluster key: one line of text, to copy to every host and name with
    /// --key (or RI2N_KEY_FILE) on both ends.
    #[command(after_help = KEYGEN_HELP)]
    Keygen(KeygenArgs),
    /// Carry every IPv4 packet between the hosts of a cluster over ri2n: a TUN interface on
    /// each host, one connection to every other host, a dead link costing milliseconds.
    #[command(after_help = TUNNEL_HELP)]
    Tunnel(TunnelArgs),
}

const DEMO_HELP: &str = "\
Exit codes:
  0  the data arrived whole and unchanged, the cut and the restore were seen
  1  it did not (the message says what differed), or the terminal could not be written
  2  usage error
  3, 4  the demo's connection could not be made, or was lost (as for `ri2n send`)
  5  127.0.0.1 or 127.0.0.2 cannot be bound
  130, 143  interrupted by SIGINT, SIGTERM";

const KEYGEN_HELP: &str = "\
Exit codes:
  0  the key was written (a directory of --output that does not exist is created, mode 0700)
  1  the file exists (without --force) or cannot be written, or stdout is /dev/null
  2  usage error";

const TUNNEL_HELP: &str = "\
The cluster file (TOML, the same on every host):
  key = \"/etc/ri2n/cluster.key\"      # from `ri2n keygen`; required
  port = 7400                        # UDP port on every link address (default 7400)
  interface = \"ri2n0\"                # TUN device name (default ri2n0)
  prefix = 24                        # prefix length of the tunnel addresses (8 to 30, default 24)

  [[host]]
  name = \"node1\"
  address = \"10.99.0.1\"              # the host's address on the tunnel interface
  links = [\"10.0.1.1\", \"10.0.2.1\"]   # its address on each network, one per link

  [[host]]
  ...

Runs in the foreground until SIGINT or SIGTERM, which close the connections and remove the
interface. SIGHUP reads the cluster file again: hosts added, removed or changed are taken up,
the connections to the others stay (`ri2n tunnel reload` sends it and reports what changed).
A link address this host lacks at start is looked for every second and taken up once there.
Needs root (or CAP_NET_ADMIN, CAP_NET_BIND_SERVICE for a port below 1024, and a writable
/run/ri2n, for the status socket) and /dev/net/tun.

`ri2n tunnel status` asks the daemon of this host (over /run/ri2n/tunnel-HOST.sock) for
every peer and link: state, round trip, rate and loss over the last second.

Exit codes:
  0  stopped by SIGINT or SIGTERM, --check found the file good, status printed, or reload
     taken up
  1  the interface cannot be created, or no longer read (the connections are closed
     first); status, reload: no daemon answers (reload: or it cannot be signalled, or it
     did not read the file within 5 s)
  2  the configuration or the key is bad (the message names the file and line), the
     tunnel network holds an address or a route of another interface of this machine, an
     interface of another kind has the tunnel's interface name, or without --name no host
     of the file has a link address of this machine; reload: or the daemon kept the file in
     use (the message says why)
  5  a daemon of this host already runs on this machine (its status socket answers), or
     cannot bind a link address (in use by another program) or the --metrics address
     (with --name, a link address this machine does not have yet is no error: the daemon
     starts without it and takes it up as it appears)";

/// The cluster key and the transport (send, recv, serve, bench).
#[derive(Args, Debug, Clone)]
pub struct ChannelOpts {
    /// What carries the links: `udp` (ri2n's own protocol over UDP: messages, datagrams,
    /// keys) or `tcp` (one TCP connection per link, the stream striped over them as
    /// MuniSocket does, with ri2n's failover and the same keys; no unreliable datagrams).
    /// Both ends must use the same: a TCP client finds nothing listening on a UDP server's
    /// port.
    #[arg(long, value_enum, default_value_t = TransportArg::Udp)]
    pub transport: TransportArg,
    /// Key file made by `ri2n keygen`; every host of the cluster holds the same. With a key,
    /// each connection is mutually authenticated and encrypted with fresh keys; a peer holding
    /// another key, or none, is refused (the client exits 3, the server logs the attempt).
    /// Without a key the channel is neither authenticated nor encrypted (a warning says so
    /// for non-loopback addresses).
    #[arg(long, value_name = "FILE", env = "RI2N_KEY_FILE")]
    pub key: Option<PathBuf>,
    #[command(flatten)]
    pub threads: LinkThreadsOpt,
}

/// `--send-threads` and `--recv-threads`, for every command that makes an endpoint.
#[derive(Args, Debug, Clone, Copy)]
pub struct LinkThreadsOpt {
    /// UDP transport: whether each link gets a thread of its own that seals and sends what
    /// the connection built, so that one connection filling its links keeps a core per link
    /// busy besides the thread that builds its packets. `auto`: where this process may use 8
    /// CPUs or more; on fewer the hand-over costs more than it gives (docs/BENCHMARKS.md §8).
    /// A short message is sent by the thread that built it either way.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = LinkThreadsArg::Auto)]
    pub send_threads: LinkThreadsArg,
    /// UDP transport: whether each link gets a thread of its own that receives, opens (with a
    /// key) and hands to the connection what arrives on it, so that one connection's links
    /// are received on a core each. `auto`: where this process may use 8 CPUs or more, as
    /// `--send-threads` (and for `tunnel`, not with a `--busy-poll` window given: the polling
    /// thread receives itself). A thread waiting for data receives what arrives meanwhile
    /// itself either way.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = LinkThreadsArg::Auto)]
    pub recv_threads: LinkThreadsArg,
}

/// `--send-threads`, `--recv-threads`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkThreadsArg {
    Auto,
    On,
    Off,
}

impl LinkThreadsArg {
    /// The library's setting.
    pub fn get(self) -> ri2n::LinkThreads {
        match self {
            LinkThreadsArg::Auto => ri2n::LinkThreads::Auto,
            LinkThreadsArg::On => ri2n::LinkThreads::On,
            LinkThreadsArg::Off => ri2n::LinkThreads::Off,
        }
    }
}

impl LinkThreadsOpt {
    /// `config` with these settings.
    pub fn apply(self, config: ri2n::EndpointConfig) -> ri2n::EndpointConfig {
        config
            .with_send_threads(self.send_threads.get())
            .with_recv_threads(self.recv_threads.get())
    }
}

/// `--transport`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportArg {
    Udp,
    Tcp,
}

impl ChannelOpts {
    /// The UDP transport with this key file.
    pub fn with_key(key: Option<PathBuf>) -> Self {
        Self {
            transport: TransportArg::Udp,
            key,
            threads: LinkThreadsOpt {
                send_threads: LinkThreadsArg::Auto,
                recv_threads: LinkThreadsArg::Auto,
            },
        }
    }

    /// The library's transport setting.
    pub fn transport(&self) -> ri2n::Transport {
        match self.transport {
            TransportArg::Udp => ri2n::Transport::Udp,
            TransportArg::Tcp => ri2n::Transport::Tcp,
        }
    }
}

#[derive(Args, Debug)]
pub struct KeygenArgs {
    /// Write the key to FILE, created with mode 0600, instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Replace FILE if it exists (every host holding the old key must then get the new one).
    /// The new key is written beside it first and takes its place in one step: if writing
    /// fails, FILE still holds the old key (unless the error says it holds the new one: the
    /// last step, syncing FILE's directory to disk, failed). An interrupt (SIGINT, SIGTERM,
    /// SIGHUP) takes effect once the key is in place or the write undone.
    #[arg(long, requires = "output")]
    pub force: bool,
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct TunnelArgs {
    #[command(subcommand)]
    pub command: Option<TunnelCommand>,

    /// The cluster file.
    #[arg(long, value_name = "FILE", default_value = "/etc/ri2n/cluster.toml")]
    pub config: PathBuf,

    /// This host's name in the cluster file (default: the host one of whose link addresses
    /// belongs to this machine).
    #[arg(long, value_name = "HOST")]
    pub name: Option<String>,

    /// Check the cluster file and its key, that this machine can carry the tunnel (the
    /// interface name and the tunnel network unused here, the links' port free) and that
    /// no daemon of this host runs here yet, say which host this is, and exit (needs no
    /// privilege, only read access to both files: the key is its owner's alone). Warns of
    /// this host's link addresses this machine lacks (the daemon starts without them and
    /// waits for them) and, as root, of a file the systemd unit's daemon could not read.
    #[arg(long)]
    pub check: bool,

    /// Also serve the status as Prometheus metrics over HTTP on ADDR:PORT (a GET of any
    /// path), e.g. 127.0.0.1:9474. Anyone who reaches the address may read them: bind it to
    /// loopback or to an address only the monitoring reaches.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,

    /// Queues of the interface, each read by a thread of its own, so that flows read from it
    /// are sent on several cores: each TCP or UDP flow stays on one queue (its packets in
    /// order), the flows are spread over them. Default: one per 4 CPUs this process may use
    /// (at least 1, at most 8): a queue's thread pays only where it has a core of its own.
    /// With one queue on fewer than 4 CPUs, the thread that writes to the interface what the
    /// links bring reads it too.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub queues: Option<u16>,

    /// After its last packet, each thread that moves packets (one per queue, one for the
    /// links; with one queue on fewer than 4 CPUs one for both) keeps looking for the next
    /// one for up to USEC microseconds before it sleeps, so that a packet arriving meanwhile
    /// crosses without a thread wake-up: on hosts where waking a thread is dear (virtual
    /// machines) a small packet's round trip through the tunnel then comes close to the plain
    /// link's. Costs CPU: a thread spins for up to USEC after every burst of traffic (yielding
    /// to any thread waiting for its CPU), a whole core while packets come more often. It
    /// stops by itself after two packets in a row that came too late to be caught, and starts
    /// again when one comes within twice USEC: traffic whose packets come further apart, and
    /// a host at rest, cost nothing; a request answered at once, a window per request. 0:
    /// sleep at once. Default: 50 where the thread for the links receives on them itself, 0
    /// where each link has a receiving thread (`--recv-threads`: 8 CPUs or more); a window
    /// given, not 0, turns those threads off unless `--recv-threads on` (docs/BENCHMARKS.md
    /// §6).
    #[arg(long, value_name = "USEC",
          value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub busy_poll: Option<u32>,

    /// How IP packets ride on the connections; every host must use the same.
    /// `datagrams`: each packet is one unreliable datagram, and a 64 KB TCP segment one
    /// datagram in pieces that fill ri2n's packets (inner TCP keeps the only retransmission
    /// loop; failures are still hidden). `messages`: each packet (a 64 KB segment whole) is
    /// a reliable, ordered message, retransmitted by ri2n under inner TCP's own loop; as fast,
    /// kept for comparison (docs/BENCHMARKS.md §6).
    #[arg(long, value_enum, default_value = "datagrams")]
    pub carry: Carry,

    #[command(flatten)]
    pub threads: LinkThreadsOpt,
}

/// How `ri2n tunnel` carries IP packets (see `--carry`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carry {
    Datagrams,
    Messages,
}

#[derive(Subcommand, Debug)]
pub enum TunnelCommand {
    /// Show every peer and link of the tunnel running on this host: state, rate, round trip
    /// and loss (sampled every second by the daemon).
    Status(TunnelStatusArgs),
    /// Check the cluster file, have the tunnel running on this host read it again (as SIGHUP
    /// does) and say what changed: hosts added, removed or changed are taken up, the
    /// connections to the others stay. Exits 2, naming the reason, when the file is bad or
    /// the daemon keeps the one in use (a change of this host's own entry, the port, the
    /// interface, the prefix or the key takes a restart).
    Reload(TunnelReloadArgs),
}

#[derive(Args, Debug)]
pub struct TunnelReloadArgs {
    /// The cluster file: the one the daemon reads.
    #[arg(long, value_name = "FILE", default_value = "/etc/ri2n/cluster.toml")]
    pub config: PathBuf,

    /// This host's name in the cluster file (default: as the daemon finds it, else the host
    /// of the one daemon running in this network namespace).
    #[arg(long, value_name = "HOST")]
    pub name: Option<String>,
}

#[derive(Args, Debug)]
pub struct TunnelStatusArgs {
    /// The cluster file (read only to find this host's name, without --name).
    #[arg(long, value_name = "FILE", default_value = "/etc/ri2n/cluster.toml")]
    pub config: PathBuf,

    /// This host's name in the cluster file (default: as the daemon finds it, else the host
    /// of the one daemon running in this network namespace). With it the daemon is asked
    /// without reading the file, so its status shows even while the file holds an edit it
    /// refused.
    #[arg(long, value_name = "HOST")]
    pub name: Option<String>,

    /// Print the status as one JSON object. A failure prints `{"command": "tunnel status",
    /// "error": ..., "exit_code": ...}` instead.
    #[arg(long)]
    pub json: bool,
}

/// Where to connect and from which local addresses (send, bench).
#[derive(Args, Debug, Clone)]
pub struct ConnectOpts {
    /// Peer address (`ri2n recv` for send, `ri2n serve` for bench). Repeat to name several
    /// (at most 8, the links a connection has; one named twice counts once): each --to is
    /// then a link, and the handshake goes to the first and, while that one does
    /// not answer, to the others in turn, so a peer whose first network is down at the start
    /// is reached on another. With a single --to the peer's other addresses are learned in the handshake and
    /// a link is opened to each (unless --no-discover). An IPv6 link-local address names the
    /// interface to reach it on: `[fe80::1%eth0]:PORT`.
    #[arg(long = "to", value_name = "ADDR:PORT", required = true, value_parser = parse_peer)]
    pub to: Vec<SocketAddr>,

    /// Local address to send from, one UDP socket and so one possible link each (IP or
    /// IP:PORT; no port or port 0 picks a free one). Repeatable. Default: if every --to is on
    /// loopback (127.0.0.0/8), 127.0.0.1, 127.0.0.2 and each --to IP; otherwise, for each
    /// --to, the address the OS routes it from. Links to addresses the peer announces use the
    /// local address sharing the longest prefix with them, so with several interfaces give one
    /// --local per interface (a warning says when only one local address results). An IPv6
    /// link-local address names its interface: `fe80::1%eth0`.
    #[arg(long = "local", value_name = "ADDR", value_parser = parse_local)]
    pub local: Vec<SocketAddr>,

    /// Use only the --to addresses: ignore the other addresses the peer announces.
    #[arg(long)]
    pub no_discover: bool,

    /// Give up (exit 3) when the peer has not answered the handshake within SECS (more than
    /// 0). A closed port on a live host is reported at once, whatever SECS.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_positive_secs)]
    pub connect_timeout: Duration,
}

/// Link options shared by send, recv and bench.
#[derive(Args, Debug, Clone)]
pub struct LinkOpts {
    /// Close the connection (exit 4) once every link has been down for SECS. Default: wait
    /// forever; the transfer resumes by itself when a link comes back.
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub all_links_down_timeout: Option<Duration>,

    /// Inject a fault, for tests and demos without root. AFTER: seconds since the connection
    /// started (e.g. 1.5). LOCAL_ADDR: one of this process's local addresses, as IP (every
    /// socket of that IP) or IP:PORT. ACTION: `down` (drop everything), `up` (undo down),
    /// `loss=P` (drop a fraction P of the datagrams both ways, e.g. loss=0.2; loss=0 undoes),
    /// `rate=BITS` (police sending at BITS per second, excess datagrams dropped; suffixes
    /// k/M/G, e.g. rate=100M; rate=0 removes the cap). Repeatable, e.g. --fault 1:127.0.0.2:down --fault 3:127.0.0.2:up.
    #[arg(long = "fault", value_name = "AFTER:LOCAL_ADDR:ACTION")]
    pub fault: Vec<FaultSpec>,
}

#[derive(Args, Debug)]
pub struct SendArgs {
    #[command(flatten)]
    pub key: ChannelOpts,

    #[command(flatten)]
    pub connect: ConnectOpts,

    /// File to send. Default (or `-`): stdin. A file cut short while it is read (it ends
    /// before the size it had when opened, and is smaller now) or rewritten in place (written
    /// to meanwhile, and its first bytes, read again at its end, are no longer those sent;
    /// with --no-checksum not compared, a warning only), also one given as stdin
    /// (`< FILE`), aborts the transfer, exit 1: the receiver keeps what came in its
    /// FILE.partial. A file that only grows is sent up to where its end was met.
    #[arg(long, short, value_name = "FILE")]
    pub input: Option<PathBuf>,

    #[command(flatten)]
    pub link: LinkOpts,

    /// Print a JSON summary on stdout: bytes, seconds, goodput, checksum (XXH3-64 of the bytes,
    /// hex; `recv` prints the same for the same data; null with --no-checksum), per-link
    /// counters, and `send_limits`: of the seconds the sender was busy (something sent and
    /// not yet acknowledged, or waiting), those it sent at its own pace (`sending`: its CPU
    /// the bound) and those it waited for the links' `congestion_window` or `pacing`, the
    /// receiver's window (`peer_window`), acknowledgements to free its `send_buffer`, or a
    /// link (`no_link`); null on the TCP transport, whose sending the kernel does. A failure
    /// prints `{"command": ..., "error": ..., "exit_code": ...}` instead.
    #[arg(long, short = 'J')]
    pub json: bool,

    /// Compute no checksum: the summary says `checksum off` (JSON: null). Saves one pass over
    /// every byte at this end, for when something else verifies the data or the CPU is what
    /// limits the rate.
    #[arg(long)]
    pub no_checksum: bool,

    /// No progress display and no summary line on stderr (errors are still reported).
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct RecvArgs {
    #[command(flatten)]
    pub key: ChannelOpts,

    /// Local address to listen on; repeat for each link (one UDP socket each). The sender is
    /// told about all of them, so `ri2n send` needs only one of them as --to. A wildcard
    /// (`0.0.0.0:PORT` or `[::]:PORT`) listens on every address the host's interfaces have at
    /// start, one socket each (loopback included; IPv6 link-local addresses left out). An IPv6
    /// link-local address names its interface: `[fe80::1%eth0]:PORT`. Port 0 picks a free
    /// port, for each address its own: the line `ri2n: listening on ...` on stderr names them
    /// (unless --quiet).
    #[arg(long = "listen", value_name = "ADDR:PORT", required = true, value_parser = parse_remote)]
    pub listen: Vec<SocketAddr>,

    /// File to write. It is written as FILE.partial (the name cut short where it would pass
    /// 255 bytes) and renamed to FILE (replacing it, whose mode, owner and group it keeps
    /// where this user may give them; for a symbolic link, the file it points to), synced to
    /// disk, only when the whole stream arrived; after a failure or an interrupt FILE.partial holds what arrived and the error
    /// says how much (a later recv empties it only once its sender connects). While one recv
    /// writes FILE.partial, another given the same FILE is refused (exit 1), and so is a
    /// FILE.partial that is a symbolic link, has other hard links or belongs to another user
    /// than this one and FILE's owner (it is never written through). A device or FIFO is
    /// written directly (a FIFO that nothing reads yet is opened once the sender connects). Default (or `-`, or a name for the file stdout is,
    /// such as /dev/stdout): stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Give up (exit 3) when no sender has connected within SECS. Default: wait forever.
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub accept_timeout: Option<Duration>,

    #[command(flatten)]
    pub link: LinkOpts,

    /// Print a JSON summary on stdout (needs --output naming a file, device or FIFO, not `-`:
    /// stdout would carry the data), as `send --json` does; the checksum is XXH3-64 of the
    /// bytes received.
    #[arg(long, short = 'J', requires = "output")]
    pub json: bool,

    /// Compute no checksum, as `send --no-checksum` (each end decides for itself).
    #[arg(long)]
    pub no_checksum: bool,

    /// No progress display, no summary line and no line saying where it listens on stderr
    /// (errors are still reported).
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub key: ChannelOpts,

    /// Local address to listen on; repeat for each link. Clients are told about all of them.
    /// A wildcard (`0.0.0.0:PORT` or `[::]:PORT`) listens on every address of the host's
    /// interfaces at start, one socket each. An IPv6 link-local address names its interface:
    /// `[fe80::1%eth0]:PORT`. Port 0 picks a free port, for each address its own: the line
    /// `ri2n serve: listening on ...` on stderr names them (unless --quiet).
    #[arg(long = "listen", value_name = "ADDR:PORT", required = true, value_parser = parse_remote)]
    pub listen: Vec<SocketAddr>,

    /// Drop a client whose links have all been down for SECS (so a vanished client does not
    /// hold a thread forever).
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = parse_secs)]
    pub all_links_down_timeout: Duration,

    /// Longest throughput test a client may ask for, in seconds (either direction): a longer
    /// one is cut to it. The client is told before any data moves, sends (or receives) only
    /// that long, and says the test was cut. A sending client that has not ended its test,
    /// or a receiving (-R) one that has not taken the data, once its granted time,
    /// --all-links-down-timeout and 10 s more are over is cut off and told why; so is a
    /// latency client that sends nothing and takes no echo for 60 s and
    /// --all-links-down-timeout. More than 0: a server that cut every test to nothing
    /// would report each as a success of 0 bit/s.
    #[arg(long, value_name = "SECS", default_value = "3600", value_parser = parse_positive_secs)]
    pub max_time: Duration,

    /// Clients served at once; one more is refused at once (its `bench` exits 3 saying the
    /// server "has reached its connection limit") instead of waiting out its handshake. A
    /// client that names no test within 10 s of connecting is let go, told why.
    #[arg(long, value_name = "N", default_value = "4096", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_clients: u32,

    /// Clients served at once from any one IP address.
    #[arg(long, value_name = "N", default_value = "256", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_clients_per_address: u32,

    /// Engines the server runs side by side, each with a thread and sockets of its own on
    /// the --listen addresses; clients are spread over them, each served by one. Default:
    /// one per CPU this process may run on, at most 16. At most 64.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub shards: Option<u32>,

    /// Do not log one line per client on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub key: ChannelOpts,

    #[command(flatten)]
    pub connect: ConnectOpts,

    /// Throughput test length in seconds (more than 0). The server's --max-time may cut it
    /// short: the test then runs the time the server granted, and the text ("cut to S s by
    /// the server's --max-time") and the JSON (`cut_by_server`, `granted_s`) say so.
    #[arg(long, short = 't', value_name = "SECS", default_value = "10", value_parser = parse_positive_secs, conflicts_with = "latency")]
    pub time: Duration,

    /// Timeline resolution: one line (one JSON record) per SECS, down to 0.01, also while
    /// every link is down (rows of zero goodput, each link shown down); a last interval
    /// shorter than a quarter of SECS is left out (the summary counts its bytes). A row shows
    /// the goodput, then for each link its state, what it delivered (stream bytes the server
    /// acknowledged: over the test the links add up to the goodput, datagrams a policer or a
    /// failure dropped not counted; in a row bytes that overtook earlier ones on another link
    /// count on their link at once and in the goodput once those came, so short rows differ
    /// both ways; on the TCP transport each chunk's 5-byte header counts, which small writes
    /// of a low -b make a large share; with --reverse what arrived on it, datagram bytes with
    /// their headers) and its round trip. Link state changes and injected faults come between
    /// the rows, as whole lines.
    #[arg(long, short = 'i', value_name = "SECS", default_value = "1", value_parser = parse_interval, conflicts_with = "latency")]
    pub interval: Duration,

    /// The server sends and this client receives (default: the client sends).
    #[arg(long, short = 'R', conflicts_with = "latency")]
    pub reverse: bool,

    /// Parallel connections, as iperf3's -P: N connections to the server at once (from the
    /// same local sockets), each a throughput test of its own with its own links, timeline
    /// rows and summary, marked `[  1]`, `[  2]`, ..., and their sum, marked `[SUM]`.
    #[arg(long, short = 'P', value_name = "N", default_value = "1", value_parser = clap::value_parser!(u32).range(1..=128), conflicts_with = "latency")]
    pub parallel: u32,

    /// Target rate, as iperf3's -b: the sending end (this client, or the server with
    /// --reverse) paces its writes to RATE bits per second in all, split evenly over the
    /// --parallel connections. Decimal suffixes K, M, G, T (100M: 100 000 000 bit/s); 0 or
    /// none: as fast as it goes.
    #[arg(long, short = 'b', value_name = "RATE", value_parser = parse_rate, conflicts_with = "latency")]
    pub bitrate: Option<u64>,

    /// Latency test instead of throughput: ping-pong of whole messages, median and p99 of the
    /// round-trip time. A round trip with no echo within 10 s ends the test (exit 4).
    #[arg(long)]
    pub latency: bool,

    /// Message size in bytes for --latency.
    #[arg(
        long,
        value_name = "BYTES",
        default_value = "64",
        requires = "latency",
        conflicts_with = "sweep"
    )]
    pub size: usize,

    /// With --latency: every power of two from 1 B to 1 MiB, then a least-squares fit of the
    /// one-way time t = RTT/2 = alpha + beta * n on the medians, weighted by 1/t^2 so that
    /// every size counts by its relative error (the largest sizes would otherwise decide alpha
    /// as well as beta): alpha (start-up latency),
    /// 1/beta (asymptotic bandwidth) and n_1/2 = alpha/beta (the message size reaching half of
    /// it). Large sizes use fewer round trips (at most 32 MiB moved per size, at least 16).
    #[arg(long, requires = "latency")]
    pub sweep: bool,

    /// Round trips measured per message size (after a short warm-up).
    #[arg(long, value_name = "N", default_value = "1000", requires = "latency", value_parser = clap::value_parser!(u32).range(1..))]
    pub count: u32,

    #[command(flatten)]
    pub link: LinkOpts,

    /// Print one JSON document on stdout; the human-readable text then goes to stderr. A
    /// throughput test's `intervals` count what the server acknowledged (sending) or what was
    /// read (--reverse); each link's `delivered_bps` there is what it delivered (stream bytes
    /// the peer acknowledged; the text's per-link column when sending), `recv_bps` what
    /// arrived on it (datagram bytes, headers included; the column with --reverse), and
    /// `sent_bps` what was sent (datagrams a policer or a failure dropped included). In
    /// `summary.links`, `delivered_bytes`, `delivered_bps` and `delivered_share` are what each
    /// link delivered over the test (with --reverse as the server counted it); a byte
    /// delivered twice (see below) counts on both links, and the test's own control message
    /// and the framing count too (a few bytes per message, and over TCP per chunk). The other
    /// counters of `summary.links` and `intervals[].links` are this end's own: with --reverse
    /// their `packets_lost` are this client's (acknowledgements), and the sending server's,
    /// which the text shows per link, are in `server.links`.
    /// `summary.retransmitted_bytes` (the text's "sent again") counts stream bytes sent more
    /// than once: repairs of the `packets_lost` (packets declared lost: unacknowledged in
    /// time, or on a link that failed; null over TCP, which counts no packets), and early
    /// copies of the oldest unacknowledged bytes, sent when the window filled up behind them
    /// (late, not lost: many of these beside no packet lost is no contradiction). When
    /// sending, `server.timeline` is the server's own meter: `[seconds since the request,
    /// bytes read so far]` at the end of every interval. `requested_s` is
    /// the --time asked, `granted_s` the time the server granted, `cut_by_server` whether
    /// its --max-time cut it; `parallel` is -P, `target_bps` -b (null: none); `faults` lists
    /// the --fault actions applied. `connections` holds each connection's results
    /// (`summary`, `server`, `intervals`, `events`, its grant) and `sum` their total (bytes,
    /// goodput); with -P 1 the top-level `summary`, `intervals` and `server` are the
    /// connection's, with more they are the sum (`server` then null). A failure prints
    /// `{"command": "bench", "error": ..., "exit_code": ...}` instead.
    #[arg(long, short = 'J')]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Seconds of transfer; the link is cut at a third and restored at two thirds of it.
    #[arg(long, value_name = "SECS", default_value = "6", value_parser = parse_demo_secs)]
    pub seconds: Duration,

    /// Cap the writer at MBIT megabits per second (0: as fast as it goes). A cap leaves CPU to
    /// the two driver threads, so on small machines the failover times shown are the
    /// protocol's rather than the scheduler's.
    #[arg(long, value_name = "MBIT", default_value = "400", value_parser = parse_mbit)]
    pub rate: f64,

    /// Cap each link's sending rate at MBIT megabits per second, like two slower wires (0: no
    /// cap; else at least 1). The default, 250, makes the writer's 400 Mbit/s need both
    /// links: the cut shows as a drop in goodput, the restore as its return. The writer is
    /// held to 80 % of the two links' caps, so it needs both at any cap. Without a cap one
    /// loopback link carries everything and the other idles.
    #[arg(long, value_name = "MBIT", default_value = "250", value_parser = parse_link_mbit)]
    pub link_rate: f64,
}

/// A peer or listen address: IP:PORT (`[IP%INTERFACE]:PORT` for an IPv6 link-local one), or
/// HOST:PORT resolved to its first address.
fn parse_remote(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse() {
        return zone_named(s, net::unzoned_unless_link_local(a));
    }
    if let Some(zoned) = net::parse_zoned(s, None) {
        return zoned;
    }
    match s.to_socket_addrs() {
        Ok(mut it) => it
            .next()
            .ok_or_else(|| format!("`{s}` resolves to no address")),
        Err(e) => Err(format!("`{s}` is not ADDR:PORT ({e})")),
    }
}

/// A peer's address ([`parse_remote`]), which port 0 cannot be: no peer listens there (the
/// handshake would wait out its timeout and say that nothing answered).
fn parse_peer(s: &str) -> Result<SocketAddr, String> {
    let a = parse_remote(s)?;
    if a.port() == 0 {
        return Err(format!("`{s}`: port 0 is no peer's port"));
    }
    Ok(a)
}

/// `a`, unless it is an IPv6 link-local address without its interface: the system cannot tell
/// which link it is on (binding fails with EINVAL, sending goes nowhere).
fn zone_named(s: &str, a: SocketAddr) -> Result<SocketAddr, String> {
    match a {
        SocketAddr::V6(v6) if v6.ip().is_unicast_link_local() && v6.scope_id() == 0 => {
            let named = match s.starts_with('[') {
                true => format!("[{}%eth0]:{}", v6.ip(), v6.port()),
                false => format!("{}%eth0", v6.ip()),
            };
            Err(format!(
                "`{s}`: a link-local address names its interface, as `{named}`"
            ))
        }
        _ => Ok(a),
    }
}

/// A local address: IP (port 0) or IP:PORT; an IPv6 link-local one with its interface,
/// `IP%INTERFACE` or `[IP%INTERFACE]:PORT`.
fn parse_local(s: &str) -> Result<SocketAddr, String> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return zone_named(s, SocketAddr::new(ip, 0));
    }
    if let Some(zoned) = net::parse_zoned(s, (!s.starts_with('[')).then_some(0)) {
        return zoned;
    }
    match s.parse() {
        Ok(a) => zone_named(s, net::unzoned_unless_link_local(a)),
        Err(_) => Err(format!("`{s}` is neither an IP address nor IP:PORT")),
    }
}

/// The error of an empty `RI2N_KEY_FILE`, which clap reports as `--key` given without a value
/// ("a value is required for '--key <FILE>' but none was supplied", to a user who typed no
/// --key), names the variable; any other error as it is.
fn key_file_variable_named(e: clap::Error) -> clap::Error {
    let empty = std::env::var_os("RI2N_KEY_FILE").is_some_and(|v| v.is_empty());
    let kind = e.kind();
    match kind == clap::error::ErrorKind::InvalidValue && empty && e.to_string().contains("--key") {
        true => clap::Error::raw(
            kind,
            "RI2N_KEY_FILE is set but empty: name the key file in it, or unset it\n",
        ),
        false => e,
    }
}

/// Checks what one option cannot check alone: the --to addresses of `send` and `bench`, each
/// kept once, are at most the links a connection has (the rest would be dropped unsaid).
fn checked(mut cli: Cli) -> Result<Cli, clap::Error> {
    let connect = match &mut cli.command {
        Command::Send(a) => &mut a.connect,
        Command::Bench(a) => &mut a.connect,
        _ => return Ok(cli),
    };
    let mut seen = Vec::with_capacity(connect.to.len());
    connect.to.retain(|a| {
        let first = !seen.contains(a);
        seen.push(*a);
        first
    });
    if connect.to.len() > ri2n::MAX_LINKS {
        return Err(clap::Error::raw(
            clap::error::ErrorKind::TooManyValues,
            format!(
                "--to names {} addresses: a connection has at most {} links\n",
                connect.to.len(),
                ri2n::MAX_LINKS
            ),
        ));
    }
    Ok(cli)
}

/// Longest time any option accepts (about 31 years): later instants overflow the clock.
pub const MAX_SECS: f64 = 1e9;

/// Non-negative seconds, fractions allowed, at most [`MAX_SECS`].
pub fn parse_secs(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if v > MAX_SECS {
        return Err(format!("`{s}`: at most {MAX_SECS:.0} seconds"));
    }
    Duration::try_from_secs_f64(v).map_err(|_| format!("`{s}`: seconds must be 0 or more"))
}

/// A rate in bits per second with iperf3's decimal suffixes; 0 means none.
fn parse_rate(s: &str) -> Result<u64, String> {
    fault::parse_bits(s)
}

/// Like [`parse_secs`], but more than 0.
fn parse_positive_secs(s: &str) -> Result<Duration, String> {
    let d = parse_secs(s)?;
    if d.is_zero() {
        return Err(format!("`{s}`: must be more than 0 seconds"));
    }
    Ok(d)
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_secs(s)?;
    if d < Duration::from_millis(10) {
        return Err("the interval must be at least 0.01 s".into());
    }
    Ok(d)
}

/// Megabits per second for the demo's caps: a finite number, 0 or at least 1 bit/s (0: no
/// cap; a negative one or NaN ran uncapped as if it were 0).
fn parse_mbit(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v == 0.0 || (v.is_finite() && v * 1e6 >= 1.0) => Ok(v),
        Ok(_) => Err(format!("`{s}`: 0 (no cap) or a rate of at least 1 bit/s")),
        Err(_) => Err(format!("`{s}` is not a number of megabits per second")),
    }
}

/// A link cap for the demo: 0 (none) or at least 1 Mbit/s, below which its data cannot cross
/// in the demo's seconds.
fn parse_link_mbit(s: &str) -> Result<f64, String> {
    match parse_mbit(s)? {
        v if v == 0.0 || v >= 1.0 => Ok(v),
        _ => Err(format!("`{s}`: 0 (no cap) or at least 1 Mbit/s")),
    }
}

fn parse_demo_secs(s: &str) -> Result<Duration, String> {
    // the demo's own range, also for numbers the general parser refuses (`inf`, `1e12`)
    match parse_secs(s) {
        Ok(d) if (Duration::from_secs(3)..=Duration::from_secs(600)).contains(&d) => Ok(d),
        Err(e) if s.trim().parse::<f64>().is_err() => Err(e),
        _ => Err(format!("`{s}`: the demo runs 3 to 600 s")),
    }
}

fn main() -> ExitCode {
    let cli = (Cli::try_parse().map_err(key_file_variable_named))
        .and_then(checked)
        .unwrap_or_else(|e| {
            // a script that asked for JSON reads a usage error as JSON too
            if e.use_stderr() {
                if let Some(command) = json_command_of_args() {
                    error::failures_as_json(command);
                    // the message, up to the usage that follows it: "the following required
                    // arguments were not provided:" names them on the lines after it
                    let text = e.render().to_string();
                    let message: Vec<&str> = (text.lines())
                        .take_while(|l| !l.trim().is_empty() && !l.starts_with("Usage:"))
                        .map(str::trim)
                        .collect();
                    let message = message.join(" ");
                    error::print_json_failure(message.trim_start_matches("error: "), error::USAGE);
                }
            }
            e.exit()
        });
    init_logging();
    // a script that asked for JSON reads a failure as JSON too
    match &cli.command {
        Command::Send(a) if a.json => error::failures_as_json("send"),
        // not where stdout carries the data (a usage error: see `recv`)
        Command::Recv(a) if a.json && !recv::writes_stdout(a) => error::failures_as_json("recv"),
        Command::Bench(a) if a.json => error::failures_as_json("bench"),
        Command::Tunnel(TunnelArgs {
            command: Some(TunnelCommand::Status(s)),
            ..
        }) if s.json => error::failures_as_json("tunnel status"),
        _ => {}
    }
    let result = match cli.command {
        Command::Send(a) => send::run(&a),
        Command::Recv(a) => recv::run(&a),
        Command::Serve(a) => serve::run(&a),
        Command::Bench(a) => bench::run(&a),
        Command::Demo(a) => demo::run(&a),
        Command::Keygen(a) => key::keygen(&a),
        Command::Tunnel(TunnelArgs {
            command: Some(TunnelCommand::Status(s)),
            ..
        }) => tunnel::status(&s),
        Command::Tunnel(TunnelArgs {
            command: Some(TunnelCommand::Reload(r)),
            ..
        }) => tunnel::reload(&r),
        Command::Tunnel(a) if a.check => {
            tunnel::describe(&a).and_then(|d| Failure::print(format_args!("{d}\n")))
        }
        Command::Tunnel(a) => tunnel::run(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            progress::clear_line();
            say!("ri2n: error: {}", f.message);
            error::print_json_failure(&f.message, f.code);
            ExitCode::from(f.code)
        }
    }
}

/// The command of a command line that clap refused, if it is one that prints JSON and the
/// line asks for it. Read from the words themselves with clap's model of the options: clap
/// stops at the first word it refuses, so a `--json` after a bad value or an unknown option
/// would go unseen; the model still tells `--json` from a value such as `-oJSON.out`.
fn json_command_of_args() -> Option<&'static str> {
    let args: Vec<String> = (std::env::args_os().skip(1))
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let cli = <Cli as clap::CommandFactory>::command();
    let (path, json) = json_flag_in(&cli, &args);
    let command = match path[..] {
        ["send"] => "send",
        ["recv"] => "recv",
        ["bench"] => "bench",
        ["tunnel", "status"] => "tunnel status",
        _ => return None,
    };
    json.then_some(command)
}

/// The subcommands `args` name (from `cmd` down) and whether the last of them was given
/// `--json`: each option looked up in the model, so that the word after one that takes a
/// value, or the rest of a short cluster, is passed over as that value. An unknown option is
/// taken for a flag.
fn json_flag_in<'c>(cmd: &'c clap::Command, args: &[String]) -> (Vec<&'c str>, bool) {
    let mut cmd = cmd;
    let mut path = Vec::new();
    let mut json = false;
    let mut words = args.iter();
    while let Some(word) = words.next() {
        let takes_value = |a: &clap::Arg| a.get_action().takes_values();
        if word == "--" {
            break;
        } else if let Some(long) = word.strip_prefix("--") {
            if long.contains('=') {
                continue;
            }
            let arg = cmd.get_arguments().find(|a| a.get_long() == Some(long));
            json |= long == "json" && arg.is_some();
            if arg.is_some_and(takes_value) {
                words.next();
            }
        } else if let Some(shorts) = word.strip_prefix('-').filter(|s| !s.is_empty()) {
            for (i, c) in shorts.char_indices() {
                let arg = cmd.get_arguments().find(|a| a.get_short() == Some(c));
                json |= arg.is_some_and(|a| a.get_long() == Some("json") && !takes_value(a));
                if arg.is_some_and(takes_value) {
                    if i + c.len_utf8() == shorts.len() {
                        words.next();
                    }
                    break;
                }
            }
        } else if let Some(sub) = cmd.find_subcommand(word) {
            cmd = sub;
            path.push(sub.get_name());
            json = false;
        }
    }
    (path, json)
}

/// `RI2N_LOG` (a tracing filter such as `debug` or `ri2n_proto=debug`) turns on the engine's
/// diagnostic log on stderr, with microsecond timestamps; without it nothing is logged.
fn init_logging() {
    let Ok(filter) = std::env::var("RI2N_LOG") else {
        return;
    };
    match tracing_subscriber::EnvFilter::try_new(&filter) {
        Ok(filter) => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        Err(e) => say!("ri2n: warning: RI2N_LOG={filter:?} ignored: {e}"),
    }
}
