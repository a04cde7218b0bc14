//! `ri2n tunnel`: the command's front of the `ri2n-tunnel` daemon. Here are what a command
//! owns: the options, the key file (read as every command reads it), the words for the other
//! commands a refused peer speaks, and the exit codes.

use std::path::Path;
use std::time::Duration;

use ri2n_tunnel::{Cluster, Error, Options, ReloadError};

use crate::error::{Failure, BIND, GENERIC, USAGE};
use crate::{Carry, TunnelArgs, TunnelReloadArgs, TunnelStatusArgs};

/// `ri2n tunnel --config FILE [--name HOST]`: runs until SIGINT or SIGTERM; SIGHUP reads the
/// cluster file again.
pub fn run(args: &TunnelArgs) -> Result<(), Failure> {
    // before the file is read: a SIGHUP from now on is a reload once the daemon runs, a
    // SIGINT or SIGTERM its stop
    let signals = ri2n_tunnel::StartSignals::watch().map_err(failure)?;
    let (cluster, me) = load(&args.config, args.name.as_deref())?;
    warn_if_named_elsewhere(&cluster, me, args.name.is_some());
    let key = load_key(&cluster, &args.config)?;
    let options = Options {
        config: args.config.clone(),
        named: args.name.is_some(),
        carry: match args.carry {
            Carry::Datagrams => ri2n_tunnel::Carry::Datagrams,
            Carry::Messages => ri2n_tunnel::Carry::Messages,
        },
        metrics: args.metrics,
        queues: args
            .queues
            .map_or_else(ri2n_tunnel::default_queues, usize::from),
        busy_poll: args.busy_poll.map_or_else(
            || ri2n_tunnel::default_busy_poll(args.threads.recv_threads.get()),
            |us| Duration::from_micros(us.into()),
        ),
        send_threads: args.threads.send_threads.get(),
        recv_threads: args.threads.recv_threads.get(),
        describe_refusal: crate::net::describe_refusal,
    };
    ri2n_tunnel::run(&options, signals, cluster, me, key).map_err(failure)
}

/// `ri2n tunnel status`: the running daemon's view of every peer and link.
pub fn status(args: &TunnelStatusArgs) -> Result<(), Failure> {
    // the daemon's socket is named after its host: with --name the file is not needed, and
    // the status of a daemon that refused a broken edit of it still shows
    let name = match &args.name {
        Some(name) => name.clone(),
        None => match load_as_daemon_here(&args.config, None) {
            Ok((cluster, me)) => cluster.hosts[me].name.clone(),
            // the file unreadable or broken: the one daemon here is the one asked about
            Err(f) => match ri2n_tunnel::daemons_in_this_network().as_slice() {
                [only] => only.clone(),
                _ => {
                    return Err(Failure {
                        message: format!(
                            "{} (--name HOST asks its daemon without the file)",
                            f.message
                        ),
                        ..f
                    })
                }
            },
        },
    };
    let s = ri2n_tunnel::query_status(&name).map_err(|e| Failure::new(GENERIC, e))?;
    if args.json {
        let json = serde_json::to_string(&s).map_err(|e| Failure::new(GENERIC, e.to_string()))?;
        Failure::print(format_args!("{json}\n"))
    } else {
        Failure::print(ri2n_tunnel::status_table(&s))
    }
}

/// How long `ri2n tunnel reload` waits for the daemon to have read the file.
const RELOAD_WAIT: Duration = Duration::from_secs(5);

/// `ri2n tunnel reload`: checks the cluster file as `--check` does, has the daemon of this
/// host read it again (SIGHUP) and prints which peers it added and removed.
pub fn reload(args: &TunnelReloadArgs) -> Result<(), Failure> {
    let (cluster, me) = load_as_daemon_here(&args.config, args.name.as_deref())?;
    check_key(&cluster, &args.config)?;
    // with this host's entry renamed, no daemon runs under the name the file gives it: the
    // one daemon of this network that reads this file is this host's, and refuses the file
    // (a restart takes it), where asking by the new name would find no daemon
    let named = &cluster.hosts[me].name;
    let running = ri2n_tunnel::daemons_in_this_network();
    let name = match running.as_slice() {
        [only]
            if args.name.is_none()
                && only != named
                && ri2n_tunnel::daemon_reads(only, &args.config) =>
        {
            only
        }
        _ => named,
    };
    let reload = ri2n_tunnel::request_reload(name, &args.config, RELOAD_WAIT);
    let changes = reload.map_err(|e| match e {
        ReloadError::Unreached(m) => Failure::new(GENERIC, m),
        ReloadError::Refused(m) => Failure::new(
            USAGE,
            format!("the tunnel of host {name} keeps the cluster file in use: {m}"),
        ),
        ReloadError::OtherFile(theirs) => Failure::new(
            USAGE,
            format!(
                "the tunnel of host {name} reads {theirs}, not {}: give --config {theirs}",
                args.config.display()
            ),
        ),
    })?;
    Failure::print(format_args!(
        "{name}: {} read again; {}\n",
        args.config.display(),
        changes.changes()
    ))
}

/// `--check`: what the daemon checks before it starts, and what this host would be. Warns
/// and fails as the daemon would, without taking anything: the key file is part of the
/// configuration, this machine's addresses and routes decide whether the tunnel network
/// fits, and the links' port and the metrics address must be free.
pub fn describe(args: &TunnelArgs) -> Result<String, Failure> {
    let path = &args.config;
    let (cluster, me) = load(path, args.name.as_deref())?;
    warn_if_named_elsewhere(&cluster, me, args.name.is_some());
    check_key(&cluster, path)?;
    for file in [path, &cluster.key] {
        warn_if_unreadable_under_the_unit(file);
    }
    ri2n_tunnel::check_not_running(&cluster.hosts[me].name).map_err(failure)?;
    ri2n_tunnel::check_machine(&cluster)
        .map_err(|e| Failure::new(USAGE, format!("{}: {e}", path.display())))?;
    let missing = ri2n_tunnel::check_links_free(&cluster, me).map_err(failure)?;
    warn_of_missing_links(&cluster, me, &missing);
    if let Some(addr) = args.metrics {
        // bound and let go at once: the daemon binds it after the interface is up. A port
        // this user may not bind is no error, as for the links: the daemon may
        match std::net::TcpListener::bind(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => say!(
                "ri2n tunnel: warning: cannot try the metrics address {addr} ({e}): the \
                 daemon needs root or CAP_NET_BIND_SERVICE to serve it"
            ),
            r => drop(r.map_err(|e| failure(Error::Metrics { addr, source: e }))?),
        }
    }
    let h = &cluster.hosts[me];
    Ok(format!(
        "{}: {} hosts; this host is {} ({}/{} on {})",
        path.display(),
        cluster.hosts.len(),
        h.name,
        h.address,
        cluster.prefix,
        cluster.interface
    ))
}

/// The cluster file at `path` and this host's position in it; errors exit 2.
fn load(path: &Path, name: Option<&str>) -> Result<(Cluster, usize), Failure> {
    ri2n_tunnel::load(path, name).map_err(failure)
}

/// [`load`] for a command that asks the daemon of this host: where the file cannot tell
/// which host this is (its link addresses not up yet, the daemon started with `--name`), the
/// host of the one daemon running in this network namespace.
fn load_as_daemon_here(path: &Path, name: Option<&str>) -> Result<(Cluster, usize), Failure> {
    match load(path, name) {
        Err(f) if name.is_none() => match ri2n_tunnel::daemons_in_this_network().as_slice() {
            [only] => load(path, Some(only)).map_err(|_| f),
            _ => Err(f),
        },
        r => r,
    }
}

/// Warns when this machine has link addresses of other hosts but none of the one `--name`
/// named: most likely the wrong name, which would make this daemon another host's double.
fn warn_if_named_elsewhere(cluster: &Cluster, me: usize, named: bool) {
    let here = cluster.hosts_here();
    if !named || here.is_empty() || here.contains(&me) {
        return;
    }
    let owners: Vec<&str> = here
        .iter()
        .map(|&i| cluster.hosts[i].name.as_str())
        .collect();
    say!(
        "ri2n tunnel: warning: this machine has link addresses of {}, none of {} (--name): \
         is the name right?",
        owners.join(", "),
        cluster.hosts[me].name
    );
}

/// Warns of this host's link addresses that are not addresses of this machine: no error (the
/// daemon starts without them and takes them up when they come, a NIC late at boot), but a
/// typing slip in the file looks the same, and with none there the peers wait for this host.
fn warn_of_missing_links(cluster: &Cluster, me: usize, missing: &[std::net::SocketAddr]) {
    if missing.is_empty() {
        return;
    }
    let list: Vec<String> = missing.iter().map(|a| a.ip().to_string()).collect();
    let host = &cluster.hosts[me];
    let (it, is) = match missing.len() {
        1 => ("it", "is"),
        _ => ("them", "are"),
    };
    say!(
        "ri2n tunnel: warning: host {}'s link address{} {} {is} not {} of this machine: \
         the daemon starts without {it} and looks for {it} every second{}",
        host.name,
        if missing.len() == 1 { "" } else { "es" },
        list.join(", "),
        if missing.len() == 1 {
            "an address"
        } else {
            "addresses"
        },
        match missing.len() == host.links.len() {
            true => ", carrying nothing until one is there",
            false => "",
        }
    );
}

/// [`load_key`] for a command that checks the file for the daemon (`--check`, `reload`): a
/// key in a FIFO is not read, since what one reader takes the daemon would wait for in vain
/// (the daemon reads it once, at its start).
fn check_key(cluster: &Cluster, config: &Path) -> Result<(), Failure> {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::metadata(&cluster.key).is_ok_and(|m| m.file_type().is_fifo()) {
        say!(
            "ri2n tunnel: the key {} is a FIFO: not read here, which would take it from the \
             daemon",
            cluster.key.display()
        );
        return Ok(());
    }
    load_key(cluster, config).map(drop)
}

/// Warns, when root, of a file root reads here only by its power to read any file: the
/// daemon under `contrib/ri2n-tunnel.service` lacks it (no `CAP_DAC_OVERRIDE`) and fails to
/// start on a file a user copied in and kept as theirs.
fn warn_if_unreadable_under_the_unit(file: &Path) {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let Ok(meta) = std::fs::metadata(file) else {
        return;
    };
    let mode = meta.mode();
    // the first class that applies decides, as the kernel checks (owner, group, others)
    let readable = match (meta.uid(), meta.gid()) {
        (0, _) => mode & 0o400 != 0,
        (_, 0) => mode & 0o040 != 0,
        _ => mode & 0o004 != 0,
    };
    if !readable {
        say!(
            "ri2n tunnel: warning: {} (owner {}, group {}, mode {:04o}) is read here only by \
             root's power over every file, which the daemon lacks under the systemd unit: \
             `chown root` it",
            file.display(),
            meta.uid(),
            meta.gid(),
            mode & 0o7777
        );
    }
}

/// The key the cluster file at `config` names, read as `--key` reads one; an error names the
/// line that names it.
fn load_key(cluster: &Cluster, config: &Path) -> Result<ri2n::Key, Failure> {
    let opts = crate::ChannelOpts::with_key(Some(cluster.key.clone()));
    let key = crate::key::load(&opts).map_err(|f| Failure {
        message: format!(
            "{}:{}: key: {}",
            config.display(),
            cluster.key_line,
            f.message
        ),
        ..f
    })?;
    Ok(key.expect("a key path was given"))
}

/// The exit code of each way the daemon fails.
fn failure(e: Error) -> Failure {
    match e {
        Error::Config(message) => Failure::new(USAGE, message),
        Error::Endpoint(e) => Failure::endpoint(e, &[], Duration::ZERO),
        e @ (Error::Metrics { .. } | Error::Running { .. }) => Failure::new(BIND, e.to_string()),
        e @ (Error::Io { .. } | Error::Failed(_)) => Failure::new(GENERIC, e.to_string()),
    }
}
