//! Which local address reaches a remote one, and the IPv6 scope of link-local addresses.
//!
//! A link-local address (`fe80::/10`) means something on one interface only, named by the
//! socket address's scope ID; every interface has one, and two may hold the same. The
//! addresses a peer announces in its handshake carry no scope (docs/PROTOCOL.md §4.5), so an
//! announced link-local address is placed on the interface it is already reached by, else on
//! that of the local address picked for it.

use std::net::{IpAddr, SocketAddr};

/// The IPv6 scope ID of `a` (0: none, and for IPv4).
fn scope(a: SocketAddr) -> u32 {
    match a {
        SocketAddr::V6(v6) => v6.scope_id(),
        SocketAddr::V4(_) => 0,
    }
}

/// Whether `a` is an IPv6 link-local address without a scope: one a peer announced.
fn unscoped_link_local(a: SocketAddr) -> bool {
    matches!(a, SocketAddr::V6(v6) if v6.scope_id() == 0 && v6.ip().is_unicast_link_local())
}

/// Whether `local` is on the interface a scoped `remote` names (any of the family for an
/// unscoped one).
fn same_scope(local: SocketAddr, remote: SocketAddr) -> bool {
    local.is_ipv4() == remote.is_ipv4() && (scope(remote) == 0 || scope(local) == scope(remote))
}

/// Whether a socket bound to `local` can send to `remote`: the same family, and for a scoped
/// remote, a local address of its interface or one not tied to an interface (a global
/// address, or the wildcard).
pub fn reaches(local: SocketAddr, remote: SocketAddr) -> bool {
    same_scope(local, remote) || (local.is_ipv6() && remote.is_ipv6() && !scoped_kind(local))
}

/// Whether `a` is an address tied to one interface: a link-local one, or one with a scope.
fn scoped_kind(a: SocketAddr) -> bool {
    matches!(a, SocketAddr::V6(v6) if v6.scope_id() != 0 || v6.ip().is_unicast_link_local())
}

/// The local address to reach `remote` from: of those on its interface (any of the family
/// for an unscoped remote), one in the same subnet (the longest common address prefix of at
/// least /24 for IPv4 or /64 for IPv6), else `fallback` when it is one of them, else any of
/// them; where there are none, as if `remote` had no scope.
pub fn pick_local(
    locals: &[SocketAddr],
    remote: SocketAddr,
    fallback: SocketAddr,
) -> Option<SocketAddr> {
    let pick = |ok: &dyn Fn(SocketAddr) -> bool| {
        let min_prefix = if remote.is_ipv4() { 24 } else { 64 };
        locals
            .iter()
            .copied()
            .filter(|&a| ok(a))
            .map(|a| (common_prefix(a.ip(), remote.ip()), a))
            .filter(|&(p, _)| p >= min_prefix)
            .max_by_key(|&(p, _)| p)
            .map(|(_, a)| a)
            .or_else(|| ok(fallback).then_some(fallback))
            .or_else(|| locals.iter().copied().find(|&a| ok(a)))
    };
    pick(&|a| same_scope(a, remote)).or_else(|| pick(&|a| a.is_ipv4() == remote.is_ipv4()))
}

/// How many leading bits `a` and `b` share (0 across families).
pub fn common_prefix(a: IpAddr, b: IpAddr) -> u32 {
    match (a, b) {
        (IpAddr::V4(x), IpAddr::V4(y)) => (u32::from(x) ^ u32::from(y)).leading_zeros(),
        (IpAddr::V6(x), IpAddr::V6(y)) => (u128::from(x) ^ u128::from(y)).leading_zeros(),
        _ => 0,
    }
}

/// `announced` as one of the `known` remote addresses when it is that address without its
/// scope (a link-local address the peer announced that is already reached on an interface);
/// else `announced` itself.
pub fn as_known(announced: SocketAddr, known: impl IntoIterator<Item = SocketAddr>) -> SocketAddr {
    if !unscoped_link_local(announced) {
        return announced;
    }
    let same = |k: &SocketAddr| k.ip() == announced.ip() && k.port() == announced.port();
    known.into_iter().find(same).unwrap_or(announced)
}

/// `remote` with the scope of `local` when it is a link-local address without one: it is
/// reached on the interface of the local address picked for it.
pub fn scoped_like(remote: SocketAddr, local: SocketAddr) -> SocketAddr {
    match (remote, local) {
        (SocketAddr::V6(mut r), SocketAddr::V6(l)) if unscoped_link_local(remote) => {
            r.set_scope_id(l.scope_id());
            SocketAddr::V6(r)
        }
        _ => remote,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_scoped_remote_is_reached_from_a_local_address_of_its_interface() {
        // eth1's address shares more bits with the remote, but the remote is on eth0 (2)
        let locals = [a("[fe80::a%2]:0"), a("[fe80::2:1%3]:0")];
        let remote = a("[fe80::2:5%2]:7000");
        assert_eq!(pick_local(&locals, remote, locals[1]), Some(locals[0]));
        // unscoped, the longest prefix decides as ever
        let unscoped = a("[fe80::2:5]:7000");
        assert_eq!(pick_local(&locals, unscoped, locals[0]), Some(locals[1]));
        // no local address of its interface: as if unscoped
        let elsewhere = a("[fe80::2:5%9]:7000");
        assert_eq!(pick_local(&locals, elsewhere, locals[0]), Some(locals[1]));
        // IPv4 as before: the subnet, else the fallback, else any of the family
        let v4 = [a("10.0.1.1:0"), a("10.0.2.1:0"), a("[fd00::1]:0")];
        assert_eq!(pick_local(&v4, a("10.0.2.9:1"), v4[0]), Some(v4[1]));
        assert_eq!(pick_local(&v4, a("192.168.0.1:1"), v4[0]), Some(v4[0]));
        assert_eq!(pick_local(&v4, a("192.168.0.1:1"), v4[2]), Some(v4[0]));
        assert_eq!(pick_local(&v4[..2], a("[fd00::9]:1"), v4[0]), None);
    }

    #[test]
    fn a_scoped_remote_is_reached_from_its_interface_or_an_untied_address() {
        let remote = a("[fe80::2%2]:7000");
        assert!(reaches(a("[fe80::1%2]:0"), remote));
        assert!(!reaches(a("[fe80::1%3]:0"), remote));
        assert!(!reaches(a("[fe80::1]:0"), remote));
        assert!(reaches(a("[fd00::1]:0"), remote));
        assert!(reaches(a("[::]:0"), remote));
        assert!(!reaches(a("10.0.0.1:0"), remote));
        // unscoped: any of the family
        assert!(reaches(a("[fe80::1%3]:0"), a("[fe80::2]:7000")));
        assert!(reaches(a("10.0.0.1:0"), a("10.0.0.2:7000")));
    }

    #[test]
    fn an_announced_link_local_address_takes_a_known_scope_or_its_locals() {
        let known = [a("[fe80::2:5%2]:7000"), a("10.0.1.2:7000")];
        assert_eq!(as_known(a("[fe80::2:5]:7000"), known), known[0]);
        // another port, another address, a global one, IPv4: as announced
        for other in [
            "[fe80::2:5]:7001",
            "[fe80::2:6]:7000",
            "[fd00::5]:7000",
            "10.0.1.2:7000",
        ] {
            assert_eq!(as_known(a(other), known), a(other));
        }
        let local = a("[fe80::1%3]:0");
        assert_eq!(
            scoped_like(a("[fe80::9]:7000"), local),
            a("[fe80::9%3]:7000")
        );
        // already scoped, not link-local, or an IPv4 local: unchanged
        for same in ["[fe80::9%2]:7000", "[fd00::9]:7000"] {
            assert_eq!(scoped_like(a(same), local), a(same));
        }
        assert_eq!(
            scoped_like(a("[fe80::9]:7000"), a("10.0.0.1:0")),
            a("[fe80::9]:7000")
        );
    }
}
