//! What `Endpoint::connect` reports, on loopback, when the peer is not what the client
//! expects: each failure says what happened (timed out, not accepting, another application;
//! nothing listening is `endings.rs`'s) instead of one error for all; and what a side said it does not read is
//! refused to the sender at once (docs/PROTOCOL.md §4.1).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use ri2n::{ConnectionConfig, ConnectionError, Endpoint, EndpointConfig, Error};

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn connect_error(to: SocketAddr, config: ConnectionConfig) -> (ConnectionError, Duration) {
    let client = Endpoint::client(&[any_port()]).unwrap();
    let start = Instant::now();
    match client.connect(&[to], config) {
        Err(Error::Connection(e)) => (e, start.elapsed()),
        Err(other) => panic!("not a connection error: {other}"),
        Ok(_) => panic!("connected to {to}"),
    }
}

/// A socket that reads and never answers: the handshake times out after the configured
/// timeout, and says so.
#[test]
fn a_silent_peer_is_a_timeout() {
    let silent = UdpSocket::bind(any_port()).unwrap();
    let timeout = Duration::from_millis(400);
    let (e, took) = connect_error(
        silent.local_addr().unwrap(),
        ConnectionConfig::default().with_handshake_timeout(timeout),
    );
    assert_eq!(e, ConnectionError::TimedOut(timeout));
    assert!(took >= timeout, "gave up after {took:?}");
    let mut buf = [0u8; 2048];
    silent.set_nonblocking(true).unwrap();
    assert!(
        silent.recv_from(&mut buf).is_ok(),
        "the handshake reached the silent socket"
    );
}

/// An endpoint made without `.server()` answers a handshake with a refusal: the client
/// learns at once that it takes no connections.
#[test]
fn an_endpoint_that_is_not_a_server_says_so() {
    let not_server = Endpoint::bind(EndpointConfig::new(vec![any_port()])).unwrap();
    let (e, took) = connect_error(not_server.local_addrs()[0], ConnectionConfig::default());
    assert_eq!(e, ConnectionError::NotAccepting);
    assert!(took < Duration::from_secs(5), "told after {took:?}");
}

/// A server of one application refuses a client of another, naming both, and reports it
/// for its log; a client that names none, or the same, is served. Both transports: the TCP
/// transport's server reported no refusal before.
#[test]
fn a_server_refuses_a_client_of_another_application() {
    for transport in [ri2n::Transport::Udp, ri2n::Transport::Tcp] {
        let config = EndpointConfig::new(vec![any_port()])
            .with_transport(transport)
            .server()
            .with_server_connection(ConnectionConfig::default().with_application("files"));
        let server = Endpoint::bind(config).unwrap();
        let to = server.local_addrs()[0];
        let client =
            Endpoint::bind(EndpointConfig::new(vec![any_port()]).with_transport(transport))
                .unwrap();
        let bench = ConnectionConfig::default().with_application("bench");
        let e = client.connect(&[to], bench).map(drop).unwrap_err();
        let wrong = ConnectionError::WrongApplication {
            ours: "bench".into(),
            theirs: "files".into(),
        };
        assert!(
            matches!(&e, Error::Connection(c) if *c == wrong),
            "{transport:?}: {e}"
        );
        // noted before the refusal is sent
        let refusals = server.refused_handshakes();
        assert_eq!(refusals.len(), 1, "{transport:?}: reported: {refusals:?}");
        assert_eq!(
            refusals[0].reason,
            ri2n::RefusalReason::WrongApplication {
                client: "bench".into(),
                ours: "files".into()
            },
            "{transport:?}"
        );
        assert_eq!(refusals[0].remote.ip(), to.ip(), "{transport:?}");
        for config in [
            ConnectionConfig::default(),
            ConnectionConfig::default().with_application("files"),
        ] {
            let conn = client.connect(&[to], config).unwrap();
            drop(conn);
        }
    }
}

/// A receiver that reads only the byte stream says so in the handshake: the sender's
/// messages and datagrams fail at once, and the byte stream still arrives whole.
#[test]
fn messages_to_a_side_that_reads_none_fail_at_the_sender() {
    let server = Endpoint::bind(
        EndpointConfig::new(vec![any_port()])
            .server()
            .with_server_connection(
                ConnectionConfig::default()
                    .with_accept_messages(false)
                    .with_accept_datagrams(false),
            ),
    )
    .unwrap();
    let to = server.local_addrs()[0];
    let reader = std::thread::spawn(move || {
        let mut conn = server.accept().unwrap();
        let mut got = Vec::new();
        conn.read_to_end(&mut got).unwrap();
        got
    });
    let client = Endpoint::client(&[any_port()]).unwrap();
    let mut conn = client.connect(&[to], ConnectionConfig::default()).unwrap();
    let e = conn.send_message(b"a whole message").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    let e = conn.send_datagram(b"a datagram").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    conn.write_all(b"hello").unwrap();
    conn.finish().unwrap();
    conn.wait_acknowledged(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(reader.join().unwrap(), b"hello");
}

/// A handshake started with `start_connect` is waited for in slices with `wait_connected`:
/// still under way after a slice (`Ok(false)`), then the failure `connect` would give; and
/// established (`Ok(true)`) with a server.
#[test]
fn a_started_handshake_is_waited_for_in_slices() {
    let silent = UdpSocket::bind(any_port()).unwrap();
    let client = Endpoint::client(&[any_port()]).unwrap();
    let timeout = Duration::from_millis(600);
    let config = ConnectionConfig::default().with_handshake_timeout(timeout);
    let conn = client
        .start_connect(&[silent.local_addr().unwrap()], config)
        .unwrap();
    let slice = Duration::from_millis(100);
    let start = Instant::now();
    let mut slices = 0;
    let end = loop {
        match conn.wait_connected(Some(slice)) {
            Ok(false) => slices += 1,
            other => break other,
        }
        assert!(start.elapsed() < Duration::from_secs(5), "never ended");
    };
    assert_eq!(end, Err(ConnectionError::TimedOut(timeout)));
    // (how many depends on the host's load: at least one came back still connecting)
    assert!(
        slices >= 1,
        "no slice came back with the handshake under way"
    );

    let server = Endpoint::server(&[any_port()]).unwrap();
    let conn = client
        .start_connect(&server.local_addrs(), ConnectionConfig::default())
        .unwrap();
    assert_eq!(conn.wait_connected(Some(Duration::from_secs(5))), Ok(true));
}

/// An event loop that looks at a started handshake only once its exchange is over and the
/// connection closed cleanly hears that it was established (`Ok(true)`), and reads the
/// reply. Before, a clean end, which has no close reason, was reported as `Refused`.
#[test]
fn a_handshake_looked_at_after_a_clean_close_was_established() {
    let server = Endpoint::server(&[any_port()]).unwrap();
    let client = Endpoint::client(&[any_port()]).unwrap();
    let c = (client.start_connect(&server.local_addrs(), ConnectionConfig::default())).unwrap();
    // the request and its end queued while the handshake goes on
    (&c).write_all(b"request").unwrap();
    c.finish().unwrap();
    let s = server.accept_timeout(Some(Duration::from_secs(5))).unwrap();
    let s = s.expect("the client's connection");
    let mut got = Vec::new();
    (&s).read_to_end(&mut got).unwrap();
    assert_eq!(got, b"request");
    (&s).write_all(b"reply").unwrap();
    s.finish().unwrap();
    s.wait_acknowledged(Some(Duration::from_secs(5))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.state() != ri2n::ConnectionState::Closed {
        assert!(Instant::now() < deadline, "never closed: {:?}", c.state());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(c.close_reason(), None, "the premise: a clean end");
    assert_eq!(c.wait_connected(Some(Duration::ZERO)), Ok(true));
    let mut reply = Vec::new();
    assert_eq!((&c).read_to_end(&mut reply).unwrap(), 5);
    assert_eq!(reply, b"reply");
}
