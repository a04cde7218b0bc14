//! What strangers without the key can do to a real keyed endpoint on loopback
//! (docs/PROTOCOL.md §11.1): a replayed handshake never reaches `accept`, and junk sent to its
//! ports is dropped by the kernel before it costs the endpoint anything.

use std::net::{SocketAddr, UdpSocket};
use std::thread;
use std::time::{Duration, Instant};

use ri2n::{ConnectionConfig, DropReason, Endpoint, EndpointConfig, Key};
use ri2n_proto::wire::{self, packet_type, Header};

fn loopback(ip: &str) -> SocketAddr {
    format!("{ip}:0").parse().unwrap()
}

fn key() -> Key {
    Key::from_bytes([9; 32])
}

fn keyed(addr: &str) -> EndpointConfig {
    EndpointConfig::new(vec![loopback(addr)]).with_key(Some(key()))
}

fn initial(scid: u64, token: &[u8], mode: u8, hello: &[u8]) -> Vec<u8> {
    wire::control_packet(&Header::Initial {
        scid,
        token,
        mode,
        hello,
    })
}

/// The next datagram on `sock` within a second.
fn next(sock: &UdpSocket, buf: &mut [u8]) -> (usize, SocketAddr) {
    sock.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    sock.recv_from(buf).expect("a datagram within a second")
}

/// An attacker who captured a client's INITIAL on the path replays it from its own address,
/// with a cookie of its own. The server must not hand the application a connection for it
/// (it would take `ri2n recv`'s only accept, or replace a tunnel peer's working connection):
/// the next connection `accept` returns is the real client's.
#[test]
fn a_replayed_initial_never_reaches_accept() {
    let server = Endpoint::bind(keyed("127.0.0.1").server()).unwrap();
    let server_addr = server.local_addrs()[0];

    // The victim client talks to a relay on its path (127.0.0.3), which passes its first
    // INITIAL to the server and the RETRY back, then keeps the INITIAL that carries the
    // cookie and the handshake.
    let relay = UdpSocket::bind("127.0.0.3:0").unwrap();
    let relay_addr = relay.local_addr().unwrap();
    let victim = Endpoint::bind(keyed("127.0.0.2")).unwrap();
    let connecting = thread::spawn(move || {
        let cfg = ConnectionConfig::default().with_handshake_timeout(Duration::from_secs(1));
        let _ = victim.connect(&[relay_addr], cfg);
    });
    let mut buf = [0u8; 2048];
    let mut victim_addr = None;
    let captured = loop {
        let (n, from) = next(&relay, &mut buf);
        if from == server_addr {
            let to = victim_addr.expect("the victim spoke first");
            relay.send_to(&buf[..n], to).unwrap();
            continue;
        }
        victim_addr = Some(from);
        match wire::decode_packet(&buf[..n]) {
            Ok((Header::Initial { token: [], .. }, _)) => {
                relay.send_to(&buf[..n], server_addr).unwrap();
            }
            Ok((Header::Initial { .. }, _)) => break buf[..n].to_vec(),
            _ => {}
        }
    };
    let (scid, mode, hello) = match wire::decode_packet(&captured) {
        Ok((
            Header::Initial {
                scid, mode, hello, ..
            },
            _,
        )) => (scid, mode, hello.to_vec()),
        _ => unreachable!(),
    };
    assert!(
        !hello.is_empty(),
        "the captured INITIAL carries the handshake"
    );

    // The attacker replays it from its own address, with the cookie the server gives it.
    let attacker = UdpSocket::bind("127.0.0.4:0").unwrap();
    attacker
        .send_to(&initial(scid, &[], mode, &[]), server_addr)
        .unwrap();
    let (n, _) = next(&attacker, &mut buf);
    let cookie = match wire::decode_packet(&buf[..n]) {
        Ok((Header::Retry { token, .. }, _)) => token.to_vec(),
        other => panic!("expected a RETRY, got {other:?}"),
    };
    for _ in 0..2 {
        attacker
            .send_to(&initial(scid, &cookie, mode, &hello), server_addr)
            .unwrap();
    }
    let (n, _) = next(&attacker, &mut buf);
    assert_eq!(
        buf[1],
        packet_type::REFUSE,
        "the replay was answered with {:02x}, not refused",
        buf[1]
    );
    assert_eq!(n, 12, "a REFUSE without detail");
    let waited = Instant::now();
    let replayed = server
        .accept_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(
        replayed.is_none(),
        "accept returned the replay's connection after {:?}",
        waited.elapsed()
    );
    // refused as a handshake that does not authenticate (made for another cookie)
    assert_eq!(server.dropped_datagrams().get(DropReason::KeyMismatch), 2);
    connecting.join().unwrap();

    // The real client that comes next is the one accepted, and its data arrives.
    let client = Endpoint::bind(keyed("127.0.0.5")).unwrap();
    let sender = thread::spawn(move || {
        use std::io::Write;
        let mut conn = client
            .connect(&[server_addr], ConnectionConfig::default())
            .unwrap();
        conn.write_all(b"the real client").unwrap();
        conn.finish().unwrap();
        conn.wait_acknowledged(Some(Duration::from_secs(5)))
            .unwrap();
    });
    let conn = server
        .accept_timeout(Some(Duration::from_secs(5)))
        .unwrap()
        .expect("the real client is accepted");
    assert_eq!(conn.stats().links[0].remote.ip().to_string(), "127.0.0.5");
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut &conn, &mut got).unwrap();
    assert_eq!(got, b"the real client");
    sender.join().unwrap();
}

/// Drops the kernel counted for the UDP socket bound to `addr` (`/proc/net/udp`): datagrams
/// it did not queue, its socket filter's among them.
fn kernel_drops(addr: SocketAddr) -> u64 {
    let SocketAddr::V4(a) = addr else {
        panic!("IPv4 only")
    };
    let want = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(a.ip().octets()),
        a.port()
    );
    std::fs::read_to_string("/proc/net/udp")
        .unwrap()
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
        .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        .sum()
}

/// 20 000 datagrams of junk (random bytes, none starting as a ri2n packet of this version
/// would) sent to a server's port during a transfer: the kernel drops every one before it is
/// queued (the socket's filter), so the endpoint never sees them, and the transfer is exact.
/// 100 that do start like a ri2n packet get through to the engine, which drops them.
#[test]
fn junk_is_dropped_by_the_kernel_before_the_endpoint_sees_it() {
    use std::io::{Read, Write};
    let server = Endpoint::bind(keyed("127.0.0.1").server()).unwrap();
    let server_addr = server.local_addrs()[0];
    let client = Endpoint::bind(keyed("127.0.0.2")).unwrap();
    let len = 32 << 20;
    let sender = thread::spawn(move || {
        let mut conn = client
            .connect(&[server_addr], ConnectionConfig::default())
            .unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        conn.write_all(&data).unwrap();
        conn.finish().unwrap();
        conn.wait_acknowledged(Some(Duration::from_secs(30)))
            .unwrap();
    });
    let conn = server
        .accept_timeout(Some(Duration::from_secs(5)))
        .unwrap()
        .unwrap();
    let drops_before = kernel_drops(server_addr);
    let junk = UdpSocket::bind("127.0.0.3:0").unwrap();
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut datagram = [0u8; 200];
    for i in 0..20_100u32 {
        for b in datagram.iter_mut() {
            *b = next() as u8;
        }
        if i < 20_000 {
            // anything but this version's first byte
            datagram[0] = datagram[0].wrapping_add(u8::from(datagram[0] == wire::VERSION));
        } else {
            datagram[0] = wire::VERSION;
            datagram[1] = packet_type::SHORT;
        }
        let _ = junk.send_to(&datagram, server_addr);
        if i % 1000 == 999 {
            thread::sleep(Duration::from_millis(1)); // leave the socket buffer room
        }
    }
    let mut got = Vec::new();
    (&conn).read_to_end(&mut got).unwrap();
    sender.join().unwrap();
    assert_eq!(got.len(), len);
    assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    let filtered = kernel_drops(server_addr) - drops_before;
    let seen = server.dropped_datagrams().total();
    println!("junk: {filtered} dropped by the kernel, {seen} reached the engine");
    assert!(
        filtered >= 20_000,
        "the kernel dropped only {filtered} datagrams"
    );
    assert!(
        (100..200).contains(&seen),
        "{seen} datagrams reached the engine and were dropped"
    );
}
