//! The TCP transport on loopback: a transfer over two links arrives intact with both links
//! carrying it, both directions at once, keyed, keys that do not match, and the calls it does
//! not carry fail clearly.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use ri2n::{
    ConnectionConfig, ConnectionError, Endpoint, EndpointConfig, Key, KeyMismatch, LinkState,
    Transport,
};

fn addrs(list: &[&str]) -> Vec<SocketAddr> {
    list.iter().map(|a| a.parse().unwrap()).collect()
}

fn pair() -> (Endpoint, Endpoint) {
    keyed_pair(None, None)
}

fn keyed_pair(server_key: Option<Key>, client_key: Option<Key>) -> (Endpoint, Endpoint) {
    let server = Endpoint::bind(
        EndpointConfig::new(addrs(&["127.0.0.1:0", "127.0.0.2:0"]))
            .with_transport(Transport::Tcp)
            .with_key(server_key)
            .server(),
    )
    .unwrap();
    let client = Endpoint::bind(
        EndpointConfig::new(addrs(&["127.0.0.1:0", "127.0.0.2:0"]))
            .with_transport(Transport::Tcp)
            .with_key(client_key),
    )
    .unwrap();
    (server, client)
}

/// Deterministic, incompressible test data.
fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn a_transfer_over_two_tcp_links_arrives_intact_on_both() {
    transfer_over_two_links(None);
}

#[test]
fn a_keyed_transfer_over_two_tcp_links_arrives_intact() {
    let stats = transfer_over_two_links(Some(Key::generate().unwrap()));
    assert!(stats.cipher.is_some(), "the connection says it is sealed");
}

/// 64 MiB from client to server over two links, read as `ri2n recv` reads; returns the
/// client's statistics.
fn transfer_over_two_links(key: Option<Key>) -> ri2n::ConnectionStats {
    let (server, client) = keyed_pair(key.clone(), key);
    let to = server.local_addrs()[0];
    let sent = data(64 << 20, 7);
    let expect = sent.clone();
    let rx = std::thread::spawn(move || {
        let conn = server.accept().unwrap();
        // as `ri2n recv` reads: each call replaces the buffer's contents
        let (mut got, mut buf) = (Vec::new(), Vec::new());
        while conn.read_buf(&mut buf).unwrap() > 0 {
            got.extend_from_slice(&buf);
        }
        conn.finish().unwrap();
        conn.wait_acknowledged(Some(Duration::from_secs(10)))
            .unwrap();
        (got, conn.stats())
    });
    let conn = client.connect(&[to], ConnectionConfig::default()).unwrap();
    for chunk in sent.chunks(1 << 20) {
        conn.write_buf(&mut chunk.to_vec()).unwrap();
    }
    conn.finish().unwrap();
    conn.wait_acknowledged(Some(Duration::from_secs(60)))
        .unwrap();
    let stats = conn.stats();
    let (got, rx_stats) = rx.join().unwrap();
    assert_eq!(got.len(), expect.len());
    assert!(
        got == expect,
        "the received bytes differ from the sent ones"
    );
    assert_eq!(stats.links.len(), 2, "one link per local address");
    for l in &stats.links {
        assert_eq!(l.state, LinkState::Up);
        assert!(
            l.stream_bytes_acked > 0,
            "link {:?} carried nothing: {stats:?}",
            l.id
        );
    }
    let acked: u64 = stats.links.iter().map(|l| l.stream_bytes_acked).sum();
    // a link's own last acknowledgement may still be on its way: at most every byte, once
    assert!(acked <= 64 << 20 && acked > 32 << 20, "{acked}");
    assert_eq!(stats.bytes_acknowledged, 64 << 20);
    assert_eq!(rx_stats.bytes_received, 64 << 20);
    assert_eq!(rx_stats.cipher, stats.cipher);
    stats
}

#[test]
fn keys_that_do_not_match_are_refused_and_named() {
    let (a, b) = (Key::generate().unwrap(), Key::generate().unwrap());
    for (server_key, client_key, expect) in [
        (Some(a.clone()), Some(b), KeyMismatch::WrongKey),
        (Some(a.clone()), None, KeyMismatch::KeyRequired),
        (None, Some(a), KeyMismatch::NoKey),
    ] {
        let (server, client) = keyed_pair(server_key, client_key);
        let to = server.local_addrs()[0];
        let e = client
            .connect(&[to], ConnectionConfig::default())
            .unwrap_err();
        assert!(
            matches!(&e, ri2n::Error::Connection(ConnectionError::KeyMismatch(m)) if *m == expect),
            "{e}, expected {expect}"
        );
        assert!(
            server
                .accept_timeout(Some(Duration::from_millis(100)))
                .unwrap()
                .is_none(),
            "the server took a connection it could not authenticate"
        );
    }
}

#[test]
fn both_directions_at_once_and_small_writes() {
    let (server, client) = pair();
    let to = server.local_addrs()[1];
    let echo = std::thread::spawn(move || {
        let conn = server.accept().unwrap();
        let mut buf = vec![0; 3000];
        loop {
            let n = (&conn).read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            (&conn).write_all(&buf[..n]).unwrap();
        }
        conn.finish().unwrap();
        conn.wait_acknowledged(Some(Duration::from_secs(10)))
            .unwrap();
    });
    let conn = std::sync::Arc::new(client.connect(&[to], ConnectionConfig::default()).unwrap());
    let sent = data(5 << 20, 11);
    let reader = {
        let conn = conn.clone();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            (&*conn).read_to_end(&mut got).unwrap();
            got
        })
    };
    for chunk in sent.chunks(777) {
        (&*conn).write_all(chunk).unwrap();
    }
    conn.finish().unwrap();
    let got = reader.join().unwrap();
    conn.wait_acknowledged(Some(Duration::from_secs(10)))
        .unwrap();
    echo.join().unwrap();
    assert!(got == sent, "the echo differs");
}

#[test]
fn what_the_tcp_transport_does_not_carry_is_refused_clearly() {
    let (server, client) = pair();
    let to = server.local_addrs()[0];
    let conn = client.connect(&[to], ConnectionConfig::default()).unwrap();
    let peer = server.accept().unwrap();
    for e in [
        conn.send_datagram(b"x").unwrap_err(),
        conn.send_message(b"x").unwrap_err(),
        peer.recv_message().unwrap_err(),
    ] {
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
        assert!(e.to_string().contains("TCP transport"), "{e}");
    }
}

#[test]
fn a_tcp_client_of_a_udp_server_is_refused() {
    let server = Endpoint::server(&addrs(&["127.0.0.1:0"])).unwrap();
    let to = server.local_addrs()[0];
    let client =
        Endpoint::bind(EndpointConfig::new(addrs(&["127.0.0.1:0"])).with_transport(Transport::Tcp))
            .unwrap();
    let e = client
        .connect(&[to], ConnectionConfig::default())
        .unwrap_err();
    assert!(
        matches!(e, ri2n::Error::Connection(ri2n::ConnectionError::Refused)),
        "{e}"
    );
}

/// As on the UDP transport, closing the client's endpoint waits until what was written is
/// delivered, and says so when it was not: here a receiver whose window is full.
#[test]
fn closing_the_client_endpoint_waits_for_delivery_and_says_when_it_failed() {
    let (server, client) = pair();
    let to = server.local_addrs()[0];
    let sent = data(8 << 20, 5);
    let conn = client.connect(&[to], ConnectionConfig::default()).unwrap();
    (&conn).write_all(&sent).unwrap();
    drop(conn);
    client.close(Some(Duration::from_secs(20))).unwrap();
    let peer = server.accept().unwrap();
    assert_eq!(
        peer.stats().bytes_received,
        8 << 20,
        "delivered before close returned"
    );
    let mut got = Vec::new();
    (&peer).read_to_end(&mut got).unwrap();
    assert!(got == sent, "{} of {} bytes", got.len(), sent.len());

    // a receiver that reads nothing, with a 64 KiB window: 1 MiB cannot all arrive
    let small = ConnectionConfig::default().with_stream_receive_window(64 << 10);
    let server = Endpoint::bind(
        EndpointConfig::new(addrs(&["127.0.0.1:0"]))
            .with_transport(Transport::Tcp)
            .with_server_connection(small)
            .server(),
    )
    .unwrap();
    let client =
        Endpoint::bind(EndpointConfig::new(addrs(&["127.0.0.1:0"])).with_transport(Transport::Tcp))
            .unwrap();
    let conn = client
        .connect(&server.local_addrs(), ConnectionConfig::default())
        .unwrap();
    (&conn).write_all(&sent[..1 << 20]).unwrap();
    drop(conn);
    let e = client.close(Some(Duration::from_millis(300))).unwrap_err();
    assert!(
        matches!(e, ri2n::Error::NotDelivered { connections: 1, bytes } if bytes > 0),
        "{e}"
    );
}
