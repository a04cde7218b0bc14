//! Setting up endpoints and connections for the commands: addresses with an interface's
//! name as their IPv6 zone, default local addresses, the connect timeout, waiting for
//! acknowledgements while still reporting progress, and a clean close.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use ri2n::{Connection, ConnectionConfig, ConnectionState, Endpoint, EndpointConfig};

use crate::error::Failure;
use crate::{ChannelOpts, ConnectOpts, LinkOpts};

/// How long a finished connection may take to close cleanly (the peer acknowledging our end
/// of stream, the engine's short draining period) before the command exits anyway.
pub const LINGER: Duration = Duration::from_secs(3);

/// An IPv6 address with its zone, `[IP%ZONE]:PORT` (or `IP%ZONE` when `port` is given):
/// the zone is the interface's name or index. A link-local address (`fe80::/10`) means
/// something on one interface only, and every interface has one. `None` when `s` has no
/// zone, to be parsed as a plain address.
pub fn parse_zoned(s: &str, port: Option<u16>) -> Option<Result<SocketAddr, String>> {
    let (host, port) = match (s.strip_prefix('['), port) {
        (Some(rest), _) => {
            let (host, port) = rest.split_once("]:")?;
            let port = match port.parse::<u16>() {
                Ok(p) => p,
                Err(_) => return Some(Err(format!("`{s}`: `{port}` is not a port"))),
            };
            (host, port)
        }
        (None, Some(port)) => (s, port),
        (None, None) => return None,
    };
    let (ip, zone) = host.split_once('%')?;
    let Ok(ip) = ip.parse::<Ipv6Addr>() else {
        return Some(Err(format!("`{s}`: `{ip}` is not an IPv6 address")));
    };
    let scope = match zone.parse::<u32>() {
        Ok(index) => index,
        Err(_) => match interface_index(zone) {
            Some(index) => index,
            None => return Some(Err(format!("`{s}`: this host has no interface `{zone}`"))),
        },
    };
    Some(Ok(unzoned_unless_link_local(SocketAddr::V6(
        SocketAddrV6::new(ip, port, 0, scope),
    ))))
}

/// `a` without its IPv6 zone unless it is link-local: only there does the zone choose an
/// interface, and the system reports other addresses without one, so a zoned copy would
/// never equal the address packets come from.
pub fn unzoned_unless_link_local(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(mut v6) if !v6.ip().is_unicast_link_local() => {
            v6.set_scope_id(0);
            SocketAddr::V6(v6)
        }
        _ => a,
    }
}

/// The index of the interface named `name`, if there is one.
fn interface_index(name: &str) -> Option<u32> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: if_nametoindex(3) reads a NUL-terminated name; 0 means no such interface
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

/// Whether `ip` is a loopback address, IPv4-mapped (`::ffff:127.0.0.1`) or not.
pub fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// The local addresses used when `--local` is not given (see `--help`), and whether a
/// warning that only one local address serves every link is in order.
pub fn default_locals(targets: &[SocketAddr]) -> (Vec<SocketAddr>, bool) {
    let mut locals: Vec<SocketAddr> = Vec::new();
    let mut push = |a: SocketAddr| {
        if !locals.contains(&a) {
            locals.push(a);
        }
    };
    let any_port = |ip| SocketAddr::new(ip, 0);
    if targets.iter().all(|t| is_loopback(t.ip())) {
        for two in [Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2)] {
            if targets.iter().any(|t| t.is_ipv4()) {
                push(any_port(IpAddr::V4(two)));
            }
            // an IPv4-mapped target is reached from an IPv6 socket: the same two, mapped
            if targets
                .iter()
                .any(|t| t.is_ipv6() && t.ip() != Ipv6Addr::LOCALHOST)
            {
                push(any_port(IpAddr::V6(two.to_ipv6_mapped())));
            }
        }
        for t in targets {
            push(any_port(t.ip()));
        }
        return (locals, false);
    }
    for t in targets {
        push(route_source(*t));
    }
    let single = locals.len() == 1;
    (locals, single)
}

/// The source address the OS would use to reach `target` (a connected UDP socket sends
/// nothing), port 0, with its IPv6 scope (a link-local one binds only with it); the
/// wildcard address if there is no route.
fn route_source(target: SocketAddr) -> SocketAddr {
    let any: SocketAddr = if target.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let mut source = UdpSocket::bind(any)
        .and_then(|s| s.connect(target).map(|()| s))
        .and_then(|s| s.local_addr())
        .unwrap_or(any);
    source.set_port(0);
    source
}

/// What a command speaks. It is named in the handshake, with what the command reads besides
/// the byte stream, so that a command that reaches the wrong kind of peer (`send` to a
/// `serve`, `bench` to a `recv`) is refused at once and both sides say so, and a library peer
/// that sends what the command never reads gets an error instead of silence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Application {
    /// `ri2n send` to `ri2n recv` (and the demo): the byte stream only.
    File,
    /// `ri2n bench` to `ri2n serve`: the byte stream and messages.
    Bench,
    /// `ri2n tunnel` to `ri2n tunnel`, carrying IP packets as datagrams.
    Tunnel,
    /// `ri2n tunnel --carry messages` to the same: IP packets as messages. A name of its own,
    /// so that two hosts that disagree on the carry are refused in the handshake and both
    /// say why, instead of connecting and losing every packet.
    TunnelMessages,
}

impl Application {
    const ALL: [Application; 4] = [
        Application::File,
        Application::Bench,
        Application::Tunnel,
        Application::TunnelMessages,
    ];

    /// The name in the handshake.
    pub const fn name(self) -> &'static str {
        match self {
            Application::File => "ri2n file transfer",
            Application::Bench => "ri2n bench",
            Application::Tunnel => ri2n_tunnel::Carry::Datagrams.application(),
            Application::TunnelMessages => ri2n_tunnel::Carry::Messages.application(),
        }
    }

    /// The commands that speak it, for messages.
    pub const fn commands(self) -> &'static str {
        match self {
            Application::File => "`ri2n recv` (the receiver of `ri2n send`)",
            Application::Bench => "`ri2n serve` (the server of `ri2n bench`)",
            Application::Tunnel => "`ri2n tunnel` (with --carry datagrams)",
            Application::TunnelMessages => "`ri2n tunnel --carry messages`",
        }
    }

    /// The commands that speak the application named `name`, or the name itself quoted.
    pub fn describe(name: &str) -> String {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .map_or_else(|| format!("{name:?}"), |a| a.commands().to_owned())
    }

    /// `config` speaking this application.
    pub fn configure(self, config: ConnectionConfig) -> ConnectionConfig {
        let (messages, datagrams) = match self {
            Application::File => (false, false),
            Application::Bench => (true, false),
            Application::Tunnel | Application::TunnelMessages => (true, true),
        };
        config
            .with_application(self.name())
            .with_accept_messages(messages)
            .with_accept_datagrams(datagrams)
    }
}

/// The connection settings the options ask for, speaking `app`.
pub fn connection_config(
    connect: &ConnectOpts,
    link: &LinkOpts,
    app: Application,
) -> ConnectionConfig {
    app.configure(ConnectionConfig::default())
        .with_discover(!connect.no_discover)
        .with_handshake_timeout(connect.connect_timeout)
        .with_all_links_down_timeout(link.all_links_down_timeout)
}

/// A client endpoint on the local addresses the options give (or the defaults), holding the
/// key the options name.
pub fn client_endpoint(
    opts: &ConnectOpts,
    channel: &ChannelOpts,
    quiet: bool,
) -> Result<Endpoint, Failure> {
    let key = crate::key::load(channel)?;
    crate::key::warn_if_unprotected(&key, &opts.to);
    let locals = if opts.local.is_empty() {
        let (locals, single) = default_locals(&opts.to);
        if single && !opts.no_discover && !quiet {
            say!(
                "ri2n: warning: sending from one local address ({}); links to the peer's \
                 other addresses share it. Give --local ADDR once per interface to use several.",
                locals[0].ip()
            );
        }
        locals
    } else {
        opts.local.clone()
    };
    let cfg = channel
        .threads
        .apply(EndpointConfig::new(locals).with_key(key));
    Endpoint::bind(cfg.with_transport(channel.transport()))
        .map_err(|e| Failure::endpoint(e, &opts.to, opts.connect_timeout))
}

/// A server endpoint for `app` listening on `listen`, holding the key `key` names, its
/// connections closed after every link has been down for `all_links_down_timeout`.
pub fn server_endpoint(
    listen: &[SocketAddr],
    key: &ChannelOpts,
    all_links_down_timeout: Option<Duration>,
    app: Application,
) -> Result<Endpoint, Failure> {
    server_endpoint_with(listen, key, all_links_down_timeout, app, |cfg| cfg)
}

/// [`server_endpoint`] with further settings made by `configure`.
pub fn server_endpoint_with(
    listen: &[SocketAddr],
    key: &ChannelOpts,
    all_links_down_timeout: Option<Duration>,
    app: Application,
    configure: impl FnOnce(EndpointConfig) -> EndpointConfig,
) -> Result<Endpoint, Failure> {
    let (transport, threads) = (key.transport(), key.threads);
    let key = crate::key::load(key)?;
    crate::key::warn_if_unprotected(&key, listen);
    let mut cfg = threads.apply(
        (EndpointConfig::new(listen.to_vec()).server())
            .with_key(key)
            .with_transport(transport),
    );
    cfg.server_connection = app.configure(cfg.server_connection);
    cfg.server_connection.all_links_down_timeout = all_links_down_timeout;
    Endpoint::bind(configure(cfg)).map_err(|e| Failure::endpoint(e, &[], Duration::ZERO))
}

/// Tells on stderr (`who`: its prefix) each handshake a server endpoint refuses because the
/// client holds another key or none, or wants another application, while this lives: looked
/// for every [`REFUSAL_LOG_PERIOD`], and once more when it is dropped or an interrupt ends the
/// process, so that no refusal goes untold by a command that ends soon after it.
pub struct RefusalLog {
    tell: Arc<dyn Fn() + Send + Sync>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

/// How often [`RefusalLog`] looks for refused handshakes.
const REFUSAL_LOG_PERIOD: Duration = Duration::from_millis(200);

impl RefusalLog {
    pub fn start(endpoint: &Endpoint, who: &'static str) -> RefusalLog {
        let endpoint = endpoint.clone();
        let tell: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            for r in endpoint.refused_handshakes() {
                say!("{who}: {}", describe_refusal(&r));
            }
        });
        crate::interrupt::before_exit(&tell);
        let (stop, stopped) = mpsc::channel::<()>();
        let looker = tell.clone();
        let thread = thread::Builder::new()
            .name("ri2n-refusals".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(REFUSAL_LOG_PERIOD)
                {
                    looker();
                }
            })
            .ok();
        RefusalLog {
            tell,
            stop: Some(stop),
            thread,
        }
    }
}

impl Drop for RefusalLog {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        (self.tell)();
    }
}

/// A handshake a server refused, in the words of the commands.
pub fn describe_refusal(r: &ri2n::RefusedHandshake) -> String {
    match &r.reason {
        ri2n::RefusalReason::WrongApplication { client, ours } => format!(
            "refused a connection from {}: it wants {}, this is {}",
            r.remote,
            Application::describe(client),
            Application::describe(ours)
        ),
        other => format!("refused a connection from {}: {other}", r.remote),
    }
}

/// Connects, giving up after `--connect-timeout`.
pub fn connect(
    endpoint: &Endpoint,
    opts: &ConnectOpts,
    config: ConnectionConfig,
) -> Result<Connection, Failure> {
    // the configuration carries the timeout (`connection_config`): the library gives up then
    endpoint
        .connect(&opts.to, config)
        .map_err(|e| Failure::endpoint(e, &opts.to, opts.connect_timeout))
}

/// Waits until the peer acknowledged everything written and the end of stream (call
/// `finish` first), calling `tick` every `period` meanwhile (for progress and timelines).
pub fn wait_acknowledged(
    conn: &Connection,
    period: Duration,
    mut tick: impl FnMut(),
) -> Result<(), Failure> {
    loop {
        match conn.wait_acknowledged(Some(period)) {
            Ok(()) => return Ok(()),
            Err(e) => {
                if let Some(reason) = conn.close_reason() {
                    return Err(Failure::lost_because(&reason));
                }
                if e.kind() != std::io::ErrorKind::TimedOut {
                    return Err(Failure::lost(&e));
                }
                tick();
            }
        }
    }
}

/// Closes `endpoint` once its command failed (`result`), with no time to wait: a connection
/// still open is aborted, and every abort's CLOSE (the command's own, or the interrupt
/// handler's) goes out, its second round too, before the process exits. Dropping the
/// endpoint would not do it: the interrupt handler holds a clone of it (or of a connection,
/// which keeps it alive), and a process that exits right after an abort sent its CLOSE once
/// at most; where that copy was lost, the peer found this side gone, not why. A connection
/// that ended cleanly is left to end (`Endpoint::close` aborts no draining one).
pub fn close_after_failure<T>(endpoint: &Endpoint, result: &Result<T, Failure>) {
    if result.is_err() {
        let _ = endpoint.close(Some(Duration::ZERO));
    }
}

/// After both sides finished: waits (at most `max`) until the connection has closed cleanly,
/// so the peer's last acknowledgements and our acknowledgement of its end of stream get
/// through before the process exits.
pub fn linger(conn: &Connection, max: Duration) {
    let deadline = Instant::now() + max;
    while conn.state() != ConnectionState::Closed && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The peer address of a connection (the remote end of link 0).
pub fn peer_addr(conn: &Connection) -> Option<SocketAddr> {
    conn.stats().links.first().map(|l| l.remote)
}

/// Bytes a pipe on stdin or stdout is asked to hold (the unprivileged maximum by default).
const PIPE_BUFFER: libc::c_int = 1 << 20;

/// Enlarges the kernel buffer of `fd` if it is a pipe (best effort): with the default 64 KiB, a
/// transfer at gigabits per second switches between ri2n and the program at the other end of
/// the pipe every 64 KiB, and the two compete for the same CPUs.
pub fn enlarge_pipe(fd: std::os::fd::RawFd) {
    // SAFETY: fcntl on a descriptor we hold; F_SETPIPE_SZ fails harmlessly on anything that
    // is not a pipe.
    unsafe {
        libc::fcntl(fd, libc::F_SETPIPE_SZ, PIPE_BUFFER);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_zone_names_the_interface_by_name_or_index() {
        let lo = interface_index("lo").expect("an interface `lo`");
        let on_lo = SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 7000, 0, lo));
        assert_eq!(parse_zoned("[fe80::1%lo]:7000", None), Some(Ok(on_lo)));
        assert_eq!(
            parse_zoned(&format!("[fe80::1%{lo}]:7000"), None),
            Some(Ok(on_lo))
        );
        let local = SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 0, 0, lo));
        assert_eq!(parse_zoned("fe80::1%lo", Some(0)), Some(Ok(local)));
        // no zone: a plain address, parsed elsewhere
        assert_eq!(parse_zoned("[fe80::1]:7000", None), None);
        assert_eq!(parse_zoned("127.0.0.1:7000", None), None);
        let err = |s: &str| parse_zoned(s, None).unwrap().unwrap_err();
        assert!(err("[fe80::1%nosuchif0]:7000").contains("no interface `nosuchif0`"));
        assert!(err("[fe80::1%lo]:port").contains("not a port"));
        assert!(err("[10.0.0.1%lo]:7000").contains("not an IPv6 address"));
        // a zone means nothing beyond link-local addresses: dropped
        let global = SocketAddr::V6(SocketAddrV6::new("fd00::1".parse().unwrap(), 7000, 0, 0));
        assert_eq!(parse_zoned("[fd00::1%lo]:7000", None), Some(Ok(global)));
        let numeric: SocketAddr = format!("[fd00::1%{lo}]:7000").parse().unwrap();
        assert_eq!(unzoned_unless_link_local(numeric), global);
    }

    #[test]
    fn loopback_targets_get_both_loopback_addresses() {
        let (l, warn) = default_locals(&["127.0.0.1:7000".parse().unwrap()]);
        assert_eq!(
            l,
            vec![
                "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
                "127.0.0.2:0".parse().unwrap()
            ]
        );
        assert!(!warn);
        let (l, _) = default_locals(&[
            "127.0.0.1:7000".parse().unwrap(),
            "127.0.0.3:7000".parse().unwrap(),
        ]);
        assert_eq!(l.len(), 3);
        let (l, _) = default_locals(&["[::1]:7000".parse().unwrap()]);
        assert_eq!(l, vec!["[::1]:0".parse::<SocketAddr>().unwrap()]);
        // IPv4-mapped: the same two, mapped (an IPv6 socket reaches a mapped address)
        let (l, warn) = default_locals(&["[::ffff:127.0.0.1]:7000".parse().unwrap()]);
        assert_eq!(
            l,
            vec![
                "[::ffff:127.0.0.1]:0".parse::<SocketAddr>().unwrap(),
                "[::ffff:127.0.0.2]:0".parse().unwrap()
            ]
        );
        assert!(!warn);
        assert!(is_loopback("::ffff:127.0.0.3".parse().unwrap()));
        assert!(!is_loopback("::ffff:10.0.0.1".parse().unwrap()));
    }
}
