//! How connections end, as an application sees it: nothing written is lost when handles are
//! dropped, a peer that is gone is told from a network that is down, and a closed port is
//! refused at once.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use ri2n::{ConnectionConfig, ConnectionError, Endpoint, Error};

fn loopback(ip: &str) -> SocketAddr {
    format!("{ip}:0").parse().unwrap()
}

/// A loopback port nothing listens on (bound, noted, released).
fn closed_port() -> SocketAddr {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap()
}

#[test]
fn connecting_to_a_closed_port_fails_at_once() {
    let client = Endpoint::client(&[loopback("127.0.0.1")]).unwrap();
    let to = closed_port();
    let start = Instant::now();
    let r = client.connect(&[to], ConnectionConfig::default());
    let took = start.elapsed();
    assert!(
        matches!(r, Err(Error::Connection(ConnectionError::PeerGone))),
        "{r:?}"
    );
    // three "port unreachable" answers to INITIALs 0, 0.2 and 0.6 s apart
    assert!(took < Duration::from_secs(3), "took {took:?}");
}
