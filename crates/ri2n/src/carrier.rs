//! Whether the interface of each local address has carrier (a cable and a live port at the
//! other end), kept current from the kernel's link notifications.
//!
//! Why: when a host's own cable is pulled, Linux flushes the interface's neighbour entries.
//! Datagrams sent meanwhile create a new entry whose address resolution fails and is retried
//! once a second; after the cable is back, nothing leaves until the next retry, and the
//! datagrams queued behind the resolution arrive as a stale burst. A socket whose interface
//! has no carrier therefore sends nothing (the engine is told the path is unreachable, so its
//! link goes down at once instead of after probe timeouts); the first probe after the carrier
//! returns starts a fresh resolution, answered within a round trip.
//!
//! The notifications come from an rtnetlink socket subscribed to link changes (no privilege
//! needed); the carrier itself is asked of the kernel with `SIOCGIFFLAGS`.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Link-change notifications of the kernel (`RTMGRP_LINK` on a `NETLINK_ROUTE` socket).
#[derive(Debug)]
pub(crate) struct LinkChanges {
    fd: OwnedFd,
}

impl LinkChanges {
    /// Subscribes to the kernel's link changes in this process's network namespace.
    pub fn open() -> io::Result<Self> {
        // SAFETY: plain socket(2); the descriptor is owned right after
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero sockaddr_nl is valid; family and groups are set below
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = libc::RTMGRP_LINK as u32;
        // SAFETY: bind(2) with a sockaddr_nl of the size given
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd })
    }

    /// Reads and discards every pending notification (which interface changed does not
    /// matter: the caller reads the carrier of each of its own). Returns whether there was
    /// any (or the kernel dropped some for lack of room, which counts as a change).
    pub fn drain(&self) -> bool {
        let mut buf = [0u8; 8192];
        let mut any = false;
        loop {
            // SAFETY: recv(2) into a buffer we own, of the length given
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                any = true;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                // notifications were lost: something changed
                Some(libc::ENOBUFS) => any = true,
                _ => return any,
            }
        }
    }
}

impl AsRawFd for LinkChanges {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The name of the interface of local address `addr`: the one its IPv6 scope names (every
/// NIC has a link-local `fe80::/64` address, and two may hold the same one), else the one
/// that holds its IP, else one whose subnet holds it (127.0.0.2 is on `lo`); `None` for a
/// wildcard or unknown address.
pub(crate) fn interface_of(addr: SocketAddr) -> Option<String> {
    if let SocketAddr::V6(a) = addr {
        if a.scope_id() != 0 {
            return interface_name(a.scope_id());
        }
    }
    let ip = addr.ip();
    if ip.is_unspecified() {
        return None;
    }
    let interfaces = if_addrs::get_if_addrs().ok()?;
    let in_subnet = |i: &&if_addrs::Interface| match (&i.addr, ip) {
        (if_addrs::IfAddr::V4(a), IpAddr::V4(ip)) => {
            u32::from(a.ip) & u32::from(a.netmask) == u32::from(ip) & u32::from(a.netmask)
        }
        (if_addrs::IfAddr::V6(a), IpAddr::V6(ip)) => {
            u128::from(a.ip) & u128::from(a.netmask) == u128::from(ip) & u128::from(a.netmask)
        }
        _ => false,
    };
    let found = (interfaces.iter())
        .find(|i| i.ip() == ip)
        .or_else(|| interfaces.iter().find(in_subnet))?;
    // by its index: the name getifaddrs(3) gives an IPv4 address is its label (`eth0:1`, a
    // keepalived or ifupdown alias), which names no interface in /sys/class/net
    (found.index.and_then(interface_name)).or_else(|| Some(found.name.clone()))
}

/// The name of the interface with index `index`, if there is one.
fn interface_name(index: u32) -> Option<String> {
    let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: if_indextoname(3) writes at most IF_NAMESIZE bytes, NUL included, into `name`,
    // and returns it, or NULL when no interface has the index.
    let found = unsafe { libc::if_indextoname(index, name.as_mut_ptr()) };
    if found.is_null() {
        return None;
    }
    // SAFETY: on success `name` holds a NUL-terminated string
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

/// Whether interface `name` has carrier: it is up and running (`IFF_RUNNING`: the kernel
/// has carrier on it and nothing holds it dormant). Asked of the kernel through a socket
/// (`SIOCGIFFLAGS`), which answers for this thread's network namespace: `/sys/class/net`
/// shows the namespace sysfs was mounted in, another one's after `unshare -n`, with
/// interfaces of the same name or none. An interface whose state cannot be read (gone)
/// counts as having carrier: the engine's own failure detection decides.
pub(crate) fn has_carrier(name: &str) -> bool {
    let running = libc::IFF_UP | libc::IFF_RUNNING;
    interface_flags(name).is_none_or(|flags| flags & running == running)
}

/// The flags of interface `name` (`SIOCGIFFLAGS`), if it exists.
fn interface_flags(name: &str) -> Option<libc::c_int> {
    let request = interface_request(name, libc::SIOCGIFFLAGS)?;
    // SAFETY: the kernel filled the union's flags
    Some(libc::c_int::from(unsafe { request.ifr_ifru.ifru_flags }) & 0xffff)
}

/// The MTU of interface `name` (`SIOCGIFMTU`), if it exists: asked of this thread's network
/// namespace, as [`has_carrier`] asks (`/sys/class/net` may be another namespace's).
pub(crate) fn interface_mtu(name: &str) -> Option<usize> {
    let request = interface_request(name, libc::SIOCGIFMTU)?;
    // SAFETY: the kernel filled the union's MTU
    usize::try_from(unsafe { request.ifr_ifru.ifru_mtu }).ok()
}

/// The largest UDP payload interface `name` can send from `local` (its MTU less the IP and
/// UDP headers), if the system tells: the ceiling of path MTU discovery on links from there.
pub(crate) fn max_datagram(local: SocketAddr, name: &str) -> Option<usize> {
    let headers = if local.is_ipv4() { 20 + 8 } else { 40 + 8 };
    interface_mtu(name)?.checked_sub(headers)
}

/// The answer to the interface request `ioctl` (one that reads an `ifreq`) about interface
/// `name`, if it exists.
fn interface_request(name: &str, ioctl: libc::Ioctl) -> Option<libc::ifreq> {
    // SAFETY: ifreq is plain old data (a byte array and a union of integers and addresses),
    // for which all-zero bytes are valid: an empty name and no flags
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= request.ifr_name.len() {
        return None;
    }
    for (to, &from) in request.ifr_name.iter_mut().zip(name.as_bytes()) {
        *to = from as libc::c_char;
    }
    // SAFETY: plain socket(2); the descriptor is owned right after
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: the interface requests read the NUL-terminated name of the ifreq we own and
    // write their answer into its union
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), ioctl, &mut request) };
    (r == 0).then_some(request)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    /// A scoped IPv6 address is on the interface its scope names, even where another
    /// interface's subnet holds the same address (every NIC's link-local `fe80::/64`): its
    /// carrier and MTU are that interface's.
    #[test]
    fn a_scoped_address_is_on_the_interface_its_scope_names() {
        let lo = CString::new("lo").unwrap();
        // SAFETY: if_nametoindex(3) on a NUL-terminated name
        let index = unsafe { libc::if_nametoindex(lo.as_ptr()) };
        assert_ne!(index, 0, "no interface `lo`");
        let scoped: SocketAddr = format!("[fe80::1%{index}]:7000").parse().unwrap();
        assert_eq!(interface_of(scoped).as_deref(), Some("lo"));
        let unknown: SocketAddr = "[fe80::1%999999]:7000".parse().unwrap();
        assert_eq!(interface_of(unknown), None);
        let plain: SocketAddr = "127.0.0.2:7000".parse().unwrap();
        assert_eq!(interface_of(plain).as_deref(), Some("lo"));
    }

    /// The carrier and the MTU are this namespace's: after `unshare -n` (as here: sysfs stays
    /// the one of the namespace it was mounted in), an interface without carrier reads as
    /// such, and one that gains it as having it. Read from `/sys/class/net`, the new
    /// namespace's veth was not found there: counted as always having carrier, and with no
    /// MTU (no path MTU discovery on its links). Needs root.
    #[test]
    fn the_carrier_and_the_mtu_are_read_in_this_thread_s_network_namespace() {
        // the kernel updates an interface's operational state a moment after its carrier
        let becomes = |up: bool| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while has_carrier("ri2nc0") != up {
                assert!(
                    std::time::Instant::now() < deadline,
                    "carrier {up} after 5 s"
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        };
        crate::netns_test::in_new_netns(move |ip| {
            ip(&[
                "link", "add", "ri2nc0", "type", "veth", "peer", "name", "ri2nc1",
            ]);
            ip(&["link", "set", "ri2nc0", "up"]);
            // the premise: sysfs is not this namespace's
            assert!(!std::path::Path::new("/sys/class/net/ri2nc0").exists());
            // its peer is down: no carrier
            assert!(!has_carrier("ri2nc0"));
            ip(&["link", "set", "ri2nc1", "up"]);
            becomes(true);
            ip(&["link", "set", "ri2nc1", "down"]);
            becomes(false);
            // its MTU is this namespace's too (read from sysfs, there was none: no path MTU
            // discovery on such a link)
            ip(&["link", "set", "ri2nc0", "mtu", "9000"]);
            ip(&["addr", "add", "10.9.8.1/24", "dev", "ri2nc0"]);
            let local: SocketAddr = "10.9.8.1:7000".parse().unwrap();
            let name = interface_of(local).expect("the address's interface");
            assert_eq!(max_datagram(local, &name), Some(9000 - 28));
            assert_eq!(
                interface_mtu("ri2nc9"),
                None,
                "an interface that is not there"
            );
            // administratively down, and gone
            ip(&["link", "set", "ri2nc0", "down"]);
            assert!(!has_carrier("ri2nc0"));
            assert!(has_carrier("ri2nc9"), "an interface that is not there");
            assert!(has_carrier("lo"));
        });
    }

    /// An interface's MTU raised while connections run (an endpoint started before the
    /// network was set up, as a service at boot): their links search their path MTU again
    /// and use the new size; lowered again, they fall back within it. Before, the MTU was
    /// read once, at the bind, and a raised one never used. Needs root.
    #[test]
    fn an_mtu_changed_while_connections_run_is_searched_again() {
        crate::netns_test::in_new_netns(|ip| {
            ip(&["link", "set", "lo", "mtu", "1500"]);
            let server = crate::Endpoint::server(&["127.0.0.1:0".parse().unwrap()]).unwrap();
            let client = crate::Endpoint::client(&["127.0.0.1:0".parse().unwrap()]).unwrap();
            let conn = client
                .connect(&server.local_addrs(), crate::ConnectionConfig::default())
                .unwrap();
            let peer = server.accept().unwrap();
            let sizes = || {
                let size = |c: &crate::Connection| c.stats().links[0].max_datagram;
                (size(&conn), size(&peer))
            };
            let becomes = |want: usize| {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while sizes() != (want, want) {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "datagram sizes {:?} after 10 s, not {want}",
                        sizes()
                    );
                    // data to send (as long as the buffers take it): the search runs beside it
                    let _ = conn.try_write(&[1; 4096]);
                    let _ = peer.try_write(&[2; 4096]);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            };
            becomes(1500 - 28);
            ip(&["link", "set", "lo", "mtu", "9000"]);
            becomes(9000 - 28);
            ip(&["link", "set", "lo", "mtu", "4000"]);
            becomes(4000 - 28);
        });
    }

    /// An IPv4 address with a label (`lo:9`, as keepalived and ifupdown aliases have) is on
    /// the interface itself, whose carrier and MTU are read: getifaddrs(3) names it by its
    /// label, and `/sys/class/net/lo:9` does not exist (its carrier then read as always up).
    /// Needs root.
    #[test]
    fn a_labelled_address_is_on_its_interface() {
        crate::netns_test::in_new_netns(|ip| {
            ip(&["addr", "add", "10.9.9.9/32", "dev", "lo", "label", "lo:9"]);
            let labelled: SocketAddr = "10.9.9.9:7000".parse().unwrap();
            // the premise: getifaddrs names the address by its label
            let named = if_addrs::get_if_addrs().unwrap();
            assert!(
                named.iter().any(|i| i.name == "lo:9"),
                "{:?}",
                named.iter().map(|i| &i.name).collect::<Vec<_>>()
            );
            assert_eq!(interface_of(labelled).as_deref(), Some("lo"));
        });
    }
}
