//! What this machine already uses that the tunnel must leave alone, checked before the
//! daemon starts and by `--check`: an interface of the tunnel's name (the daemon makes its
//! own, and a TUN interface of another program is no more its to take than any other), and
//! the addresses and routes of the machine's interfaces that the tunnel network would hold.
//! The cluster file alone cannot show these: the same file is right on one machine and wrong
//! on another (a tunnel network that a container bridge or a management network of one host
//! already uses, whose traffic would then go into the tunnel, or the tunnel's past it). And
//! which addresses are this machine's ([`Addresses`]): which host of the file it is, which of
//! its link addresses are up.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use crate::config::Cluster;

/// The addresses of this machine's interfaces now, to tell whether a link address is one of
/// its own. Not whether a socket can bind it: where `net.ipv4.ip_nonlocal_bind` is on
/// (keepalived and HAProxy set it), every address binds, and the machine would pass for
/// every host of the cluster, and bind their link addresses as its own.
pub struct Addresses(Option<Vec<IpAddr>>);

impl Addresses {
    pub fn now() -> Self {
        Self(
            if_addrs::get_if_addrs()
                .ok()
                .map(|all| all.iter().map(|i| i.ip()).collect()),
        )
    }

    /// Whether `ip` is an address of this machine: an interface's, or any of 127.0.0.0/8,
    /// all of which is local. Where the interfaces cannot be listed, whether a socket can
    /// bind it.
    pub fn has(&self, ip: IpAddr) -> bool {
        match &self.0 {
            Some(all) => all.contains(&ip) || matches!(ip, IpAddr::V4(v4) if v4.is_loopback()),
            None => std::net::UdpSocket::bind((ip, 0)).is_ok(),
        }
    }
}

/// An IPv4 network: its first address and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Net {
    base: Ipv4Addr,
    prefix: u8,
}

impl Net {
    fn of(address: Ipv4Addr, prefix: u8) -> Self {
        Self {
            base: Ipv4Addr::from(u32::from(address) & mask(prefix)),
            prefix,
        }
    }

    fn holds(&self, a: Ipv4Addr) -> bool {
        u32::from(a) & mask(self.prefix) == u32::from(self.base)
    }
}

impl std::fmt::Display for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

fn mask(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

/// Whether an interface named `name` exists in this network namespace (asked of the kernel
/// by name: `/sys/class/net` shows the namespace sysfs was mounted in, which `unshare -n`
/// does not change), and what it is, where sysfs shows it: a few words for a message.
fn existing_interface(name: &str) -> Option<&'static str> {
    let c_name = std::ffi::CString::new(name).ok()?;
    // SAFETY: a NUL-terminated name that lives for the call
    let index = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
    if index == 0 {
        return None;
    }
    // sysfs shows this interface only where its index is the same
    let sys = Path::new("/sys/class/net").join(name);
    let shown =
        std::fs::read_to_string(sys.join("ifindex")).is_ok_and(|i| i.trim().parse() == Ok(index));
    Some(match (shown, shown && is_tun(&sys)) {
        (true, true) => {
            ", a TUN interface of another program or of the daemon of another host of the file"
        }
        (true, false) => ", not a TUN interface",
        (false, _) => "",
    })
}

/// Whether the interface at `sys` (its `/sys/class/net` folder) is a TUN interface. A TAP
/// interface has `tun_flags` too: the flags tell them apart.
fn is_tun(sys: &Path) -> bool {
    std::fs::read_to_string(sys.join("tun_flags")).is_ok_and(|flags| tun_flags_say_tun(&flags))
}

/// Whether `tun_flags` as the kernel writes it ("0x1002") names a TUN interface, not TAP.
fn tun_flags_say_tun(flags: &str) -> bool {
    let flags = flags.trim();
    let flags = flags.strip_prefix("0x").unwrap_or(flags);
    let kind = libc::IFF_TUN | libc::IFF_TAP;
    i32::from_str_radix(flags, 16).is_ok_and(|f| f & kind == libc::IFF_TUN)
}

/// A route of the main table: where it leads and through which interface.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Route {
    to: Net,
    interface: String,
}

/// Whether the machine can carry `cluster`'s tunnel: an error that names what is in the
/// way, and what to change.
pub fn check(cluster: &Cluster) -> Result<(), String> {
    let name = &cluster.interface;
    if let Some(kind) = existing_interface(name) {
        // a running daemon of this host is named before this (`check_not_running`)
        return Err(format!(
            "an interface named {name} exists on this machine{kind} (`ip -d link show \
             {name}`): the daemon makes its own; remove that one, or name the tunnel's \
             interface otherwise in the cluster file (interface = \"...\")"
        ));
    }
    let addresses: Vec<(String, Ipv4Addr)> = if_addrs::get_if_addrs()
        .map_err(|e| format!("cannot list this machine's addresses: {e}"))?
        .into_iter()
        .filter_map(|i| match i.ip() {
            IpAddr::V4(a) => Some((i.name, a)),
            IpAddr::V6(_) => None,
        })
        .collect();
    // without procfs (a restricted container) the addresses are all there is to see
    let routes = std::fs::read_to_string("/proc/net/route")
        .map(|text| parse_routes(&text))
        .unwrap_or_default();
    let tunnel = Net::of(cluster.hosts[0].address, cluster.prefix);
    match in_the_way(tunnel, &addresses, &routes) {
        Some(what) => Err(format!(
            "the tunnel network {tunnel} {what}: give the tunnel addresses a network this \
             machine does not use (address and prefix in the cluster file)"
        )),
        None => Ok(()),
    }
}

/// What of the machine's interfaces the tunnel network `tunnel` would take over (the
/// tunnel's own interface is not there yet): an address it holds, or a route to part or all
/// of it (whose traffic would then go through one interface or the other, by chance of
/// prefix and metric). A route to a larger network around it is not in the way: the
/// tunnel's own route is the longer, and takes its part.
fn in_the_way(tunnel: Net, addresses: &[(String, Ipv4Addr)], routes: &[Route]) -> Option<String> {
    if let Some((i, a)) = (addresses.iter()).find(|(_, a)| tunnel.holds(*a)) {
        return Some(format!("holds {a}, an address of {i} on this machine"));
    }
    let inside =
        |r: &&Route| r.to.prefix > 0 && r.to.prefix >= tunnel.prefix && tunnel.holds(r.to.base);
    routes.iter().find(inside).map(|r| {
        format!(
            "holds {}, which this machine routes through {}",
            r.to, r.interface
        )
    })
}

/// The routes in `/proc/net/route`'s text: a header line, then per route its interface,
/// destination, gateway, flags, use counts, metric and mask, the addresses in hexadecimal
/// as the machine stores them (little-endian on the machines ri2n runs on).
fn parse_routes(text: &str) -> Vec<Route> {
    let hex = |s: &str| u32::from_str_radix(s, 16).ok().map(u32::from_be);
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (interface, to, mask) = (f.first()?, hex(f.get(1)?)?, hex(f.get(7)?)?);
            // a mask is leading ones; anything else is not a route this reads
            let prefix = u8::try_from(mask.leading_ones()).ok()?;
            (mask == self::mask(prefix)).then(|| Route {
                to: Net::of(Ipv4Addr::from(to), prefix),
                interface: (*interface).to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Net {
        let (a, p) = s.split_once('/').unwrap();
        Net::of(a.parse().unwrap(), p.parse().unwrap())
    }

    fn route(to: &str, interface: &str) -> Route {
        Route {
            to: net(to),
            interface: interface.into(),
        }
    }

    /// A machine's table as `/proc/net/route` shows it (little-endian hexadecimal).
    const ROUTES: &str = "\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010011AC\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
ri2n0\t0000630A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
";

    /// A TAP interface of the tunnel's name was taken for a TUN one: `--check` passed, and
    /// the daemon then failed to create its interface (exit 1, blaming another tunnel).
    #[test]
    fn a_tap_interface_is_not_taken_for_a_tun_one() {
        // as a daemon's interface (IFF_TUN, IFF_NO_PI, IFF_VNET_HDR) and `ip tuntap add
        // mode tap` (IFF_TAP, IFF_NO_PI, IFF_ONE_QUEUE) show them
        assert!(tun_flags_say_tun("0x5001\n"));
        assert!(!tun_flags_say_tun("0x1802\n"));
        assert!(!tun_flags_say_tun("junk"));
    }

    #[test]
    fn the_route_table_is_read_as_the_kernel_writes_it() {
        assert_eq!(
            parse_routes(ROUTES),
            [
                route("0.0.0.0/0", "eth0"),
                route("172.17.0.0/16", "eth0"),
                route("10.99.0.0/24", "ri2n0"),
            ]
        );
        assert!(parse_routes("Iface\tDestination\neth0 zz\n").is_empty());
    }

    #[test]
    fn what_another_interface_uses_inside_the_tunnel_network_is_in_the_way() {
        let addrs = |list: &[(&str, &str)]| -> Vec<(String, Ipv4Addr)> {
            (list.iter())
                .map(|(i, a)| ((*i).to_owned(), a.parse().unwrap()))
                .collect()
        };
        let here = addrs(&[("lo", "127.0.0.1"), ("eth0", "172.17.0.5")]);
        let routes = parse_routes(ROUTES);
        let check =
            |tunnel: &str, a: &[(String, Ipv4Addr)], r: &[Route]| in_the_way(net(tunnel), a, r);
        // the usual: a network of its own
        let routes_elsewhere = &routes[..2];
        assert_eq!(check("10.99.0.0/24", &here, routes_elsewhere), None);
        // an address of another interface inside it
        assert_eq!(
            check("172.17.0.0/24", &here, &[]).as_deref(),
            Some("holds 172.17.0.5, an address of eth0 on this machine")
        );
        // a route of another interface inside it, or the same network
        assert_eq!(
            check("172.16.0.0/12", &[], &routes).as_deref(),
            Some("holds 172.17.0.0/16, which this machine routes through eth0")
        );
        assert!(check("172.17.0.0/16", &[], &routes).is_some());
        // a route around it (the tunnel's route is the longer) and the default route are
        // not; nor is a network beside them
        assert_eq!(check("172.17.99.0/24", &[], &routes), None);
        assert_eq!(check("192.168.7.0/24", &here, &routes), None);
    }
}
