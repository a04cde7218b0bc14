//! How connections end, as an application sees it: nothing written is lost when handles are
//! dropped (and one let go of is forgotten once its vanished peer was silent for the close
//! linger), a peer that is gone is told from a network that is down, and a closed port is
//! refused at once, and so is a connection beyond a server's limit; a server that aborts
//! all its connections at once tells every client why, and one that closes waits for them
//! all together and aborts those whose peers still send.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use ri2n::{
    ConnectionConfig, ConnectionError, ConnectionState, Endpoint, EndpointConfig, Error, Transport,
};

mod common;

use common::{gettid, loopback, spawn_with_tid, wait_asleep};

/// An endpoint of `transport` on 127.0.0.1 (a free port), a server or a client.
fn bind_on(transport: Transport, server: bool) -> Endpoint {
    let c = EndpointConfig::new(vec![loopback("127.0.0.1")]).with_transport(transport);
    Endpoint::bind(if server { c.server() } else { c }).unwrap()
}

/// A loopback port nothing listens on (bound, noted, released).
fn closed_port() -> SocketAddr {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap()
}

/// How long `client` takes to be refused by a port nothing listens on (it must be).
fn refused_after(client: &Endpoint) -> Duration {
    let to = closed_port();
    let start = Instant::now();
    let r = client.connect(&[to], ConnectionConfig::default());
    let took = start.elapsed();
    assert!(
        matches!(r, Err(Error::Connection(ConnectionError::Refused))),
        "{r:?}"
    );
    took
}

#[test]
fn connecting_to_a_closed_port_fails_at_once() {
    let client = Endpoint::client(&[loopback("127.0.0.1")]).unwrap();
    let took = refused_after(&client);
    // three "port unreachable" answers to INITIALs 0, 0.2 and 0.6 s apart
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

/// The same with a thread per link that sends and one that receives (the default from 8
/// CPUs): the "port unreachable" errors may be found by other threads than the driver's, and
/// the engine must hear of each at once, not at the driver's next timer (a retry late).
#[test]
fn connecting_to_a_closed_port_with_lanes_fails_as_soon() {
    use ri2n::LinkThreads;
    let client = Endpoint::bind(
        EndpointConfig::new(vec![loopback("127.0.0.1")])
            .with_send_threads(LinkThreads::On)
            .with_recv_threads(LinkThreads::On),
    )
    .unwrap();
    assert!(
        client.send_threads() && client.recv_threads(),
        "the premise"
    );
    let took = refused_after(&client);
    // the third answer comes 0.6 s after the first INITIAL; one taken a retry late, 1.4 s
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

/// Byte `pos` of an endless test stream: the little-endian index of its 8-byte word, so a
/// byte lost, repeated or moved anywhere shows.
fn pattern_byte(pos: u64) -> u8 {
    (pos / 8).to_le_bytes()[(pos % 8) as usize]
}

/// The first `len` bytes of the test stream, as a reader.
struct Pattern {
    pos: u64,
    len: u64,
}

impl std::io::Read for Pattern {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min((self.len - self.pos) as usize);
        for (i, b) in buf[..n].iter_mut().enumerate() {
            *b = pattern_byte(self.pos + i as u64);
        }
        self.pos += n as u64;
        Ok(n)
    }
}

/// Reads `conn` to its end, checking every byte against the test stream; returns the count.
fn read_pattern(conn: &ri2n::Connection) -> u64 {
    use std::io::Read;
    let mut buf = vec![0u8; 1 << 16];
    let mut got = 0u64;
    loop {
        let n = (&*conn).read(&mut buf).expect("read");
        if n == 0 {
            return got;
        }
        for (i, &b) in buf[..n].iter().enumerate() {
            assert_eq!(b, pattern_byte(got + i as u64), "byte {}", got + i as u64);
        }
        got += n as u64;
    }
}

/// Issue 9, finding 1: a program writes, then drops its connection and endpoint and returns
/// (as from `main`). Dropping the last handle must deliver what was written first.
fn write_then_drop_everything(len: u64) {
    let server = Endpoint::server(&[loopback("127.0.0.1"), loopback("127.0.0.2")]).unwrap();
    let to = server.local_addrs()[0];
    let sender = std::thread::spawn(move || {
        let client = Endpoint::client(&[loopback("127.0.0.1"), loopback("127.0.0.2")]).unwrap();
        let mut conn = client.connect(&[to], ConnectionConfig::default()).unwrap();
        let copied = std::io::copy(&mut Pattern { pos: 0, len }, &mut conn).unwrap();
        assert_eq!(copied, len);
        std::io::Write::flush(&mut conn).unwrap();
        // conn and client are dropped here, then the thread ends: as a process exiting
    });
    let conn = server.accept().unwrap();
    let got = read_pattern(&conn);
    sender.join().unwrap();
    assert_eq!(got, len, "every byte written arrived");
}

#[test]
fn dropping_everything_after_writing_5_mb_loses_nothing() {
    write_then_drop_everything(5_000_000);
}

#[test]
fn dropping_everything_after_copying_1_gib_loses_nothing() {
    write_then_drop_everything(1 << 30);
}

/// An explicit close reports what could not be delivered: here the peer is unreachable (its
/// link cut), so nothing written is acknowledged within the timeout.
#[test]
fn close_reports_data_never_acknowledged() {
    let server = Endpoint::server(&[loopback("127.0.0.1")]).unwrap();
    let client = Endpoint::client(&[loopback("127.0.0.1")]).unwrap();
    let mut conn = client
        .connect(&server.local_addrs(), ConnectionConfig::default())
        .unwrap();
    let _peer = server.accept().unwrap();
    for s in client.local_addrs() {
        client.impairment(s).unwrap().set_down(true);
    }
    std::io::Write::write_all(&mut conn, &[1u8; 100_000]).unwrap();
    let start = Instant::now();
    let r = client.close(Some(Duration::from_millis(300)));
    assert!(
        matches!(
            r,
            Err(Error::NotDelivered {
                connections: 1,
                bytes: 100_000..
            })
        ),
        "{r:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(2));
}

/// An exchange complete both ways (each side finished, read the other's end and had its
/// bytes acknowledged) lingers a moment for the peer's retransmissions. A close of the
/// endpoint meanwhile, with a timeout shorter than that linger, ends it cleanly on both
/// sides: the peer is told that everything it sent arrived. Before, it was aborted ("the
/// peer's endpoint was closed"), and the peer took the complete exchange for a failure.
#[test]
fn closing_an_endpoint_whose_exchange_is_complete_ends_it_cleanly() {
    use std::io::{Read, Write};
    let server = Endpoint::server(&[loopback("127.0.0.1")]).unwrap();
    let client = Endpoint::client(&[loopback("127.0.0.1")]).unwrap();
    let conn = client
        .connect(&server.local_addrs(), ConnectionConfig::default())
        .unwrap();
    let accepted = server.accept().unwrap();
    (&conn).write_all(b"request").unwrap();
    conn.finish().unwrap();
    let mut got = Vec::new();
    (&accepted).read_to_end(&mut got).unwrap();
    assert_eq!(got, b"request");
    (&accepted).write_all(b"reply").unwrap();
    accepted.finish().unwrap();
    let patience = Some(Duration::from_secs(5));
    accepted.wait_acknowledged(patience).unwrap();
    got.clear();
    (&conn).read_to_end(&mut got).unwrap();
    assert_eq!(got, b"reply");
    conn.wait_acknowledged(patience).unwrap();
    // the premise: both linger after their clean end
    let deadline = Instant::now() + Duration::from_secs(5);
    while (conn.state(), accepted.state()) != (ConnectionState::Draining, ConnectionState::Draining)
    {
        assert!(
            Instant::now() < deadline,
            "{:?} {:?}",
            conn.state(),
            accepted.state()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    server.close(Some(Duration::from_millis(10))).unwrap();
    assert_eq!(accepted.state(), ConnectionState::Closed);
    assert_eq!(accepted.close_reason(), None, "the server's side");
    while conn.state() != ConnectionState::Closed {
        assert!(Instant::now() < deadline, "{:?}", conn.state());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(conn.close_reason(), None, "the client's side");
}

/// `Endpoint::close` while a peer is still sending (its stream not finished) aborts the
/// connection once this side's data is delivered, on both transports: the peer learns why
/// (`PeerAborted`, code 0, "the peer's endpoint was closed"), this side reports an abort of
/// its own, and a read after what arrived says the connection was aborted. Before, the TCP
/// transport sent a clean CLOSE: the peer saw `ClosedEarly`, and this side reported a clean
/// end and `NotConnected`.
#[test]
fn closing_an_endpoint_aborts_a_connection_whose_peer_still_sends() {
    use std::io::{ErrorKind, Read, Write};
    for transport in [Transport::Udp, Transport::Tcp] {
        let server = bind_on(transport, true);
        let client = bind_on(transport, false);
        let conn = client
            .connect(&server.local_addrs(), ConnectionConfig::default())
            .unwrap();
        (&conn).write_all(b"first").unwrap();
        let accepted = server.accept().unwrap();
        let mut got = [0; 5];
        (&accepted).read_exact(&mut got).unwrap();
        // the client goes on sending, and never finishes; the server wrote nothing
        (&conn).write_all(b"more").unwrap();
        server.close(Some(Duration::from_secs(5))).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while conn.state() != ConnectionState::Closed {
            assert!(
                Instant::now() < deadline,
                "{transport:?}: {:?}",
                conn.state()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let told = conn.close_reason();
        assert!(
            matches!(&told, Some(ConnectionError::PeerAborted { code: 0, reason })
                if reason == "the peer's endpoint was closed"),
            "{transport:?}: the client was told {told:?}"
        );
        assert_eq!(
            accepted.close_reason(),
            Some(ConnectionError::LocallyAborted),
            "{transport:?}: the server's own account"
        );
        // what arrived before the close may still be read; then the abort
        let mut rest = Vec::new();
        let end = (&accepted).read_to_end(&mut rest).unwrap_err();
        assert_eq!(
            end.kind(),
            ErrorKind::ConnectionAborted,
            "{transport:?}: {end}"
        );
        assert!(b"more".starts_with(&rest), "{transport:?}: {rest:?}");
    }
}

/// The server has the client's whole stream and its own acknowledged, so its side ends
/// cleanly; its last acknowledgement (delayed 200 ms here) is lost, for the server's cable is
/// pulled. The server's application lets go of its connection, and the cable comes back 1.5 s
/// later. The client, still retransmitting its end, must end cleanly with its data
/// acknowledged: the server's endpoint keeps the released connection to say that everything
/// arrived (PROTOCOL.md §8.2, §8.3). Before, the endpoint forgot it at once, answered with a
/// RESET, and the client reported its delivered stream lost (`PeerRestarted`).
#[test]
fn a_clean_end_whose_last_acknowledgement_was_lost_is_confirmed_after_the_release() {
    use std::io::Read;
    let delayed = ConnectionConfig::default()
        .with_max_ack_delay(Duration::from_millis(200))
        .with_ack_frequency(1_000);
    let server = Endpoint::bind(
        EndpointConfig::new(vec![loopback("127.0.0.1")])
            .server()
            .with_server_connection(delayed),
    )
    .unwrap();
    let client = bind_on(Transport::Udp, false);
    let conn = client
        .connect(&server.local_addrs(), ConnectionConfig::default())
        .unwrap();
    let far = server.accept().unwrap();
    far.finish().unwrap();
    let mut got = Vec::new();
    (&conn).read_to_end(&mut got).unwrap();
    const LEN: u64 = 100_000;
    std::io::copy(&mut Pattern { pos: 0, len: LEN }, &mut &conn).unwrap();
    conn.finish().unwrap();
    assert_eq!(read_pattern(&far), LEN);
    let cable = server.impairment(server.local_addrs()[0]).unwrap();
    cable.set_down(true);
    assert!(
        !conn.is_acknowledged(),
        "the premise: the last acknowledgement was lost"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while far.state() != ConnectionState::Closed {
        assert!(Instant::now() < deadline, "{:?}", far.state());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(far.close_reason(), None, "the server's side ended cleanly");
    drop(far);
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(
        !conn.is_acknowledged(),
        "the premise: nothing got through meanwhile"
    );
    cable.set_down(false);
    conn.wait_acknowledged(Some(Duration::from_secs(5)))
        .expect("the client's stream is confirmed delivered");
    assert_eq!(conn.close_reason(), None);
}

/// A server holding as many connections as it allows from one address refuses the next one at
/// once, with `ServerFull` (not after the 10 s handshake timeout); once one of them is gone,
/// the address may connect again. The limit is the endpoint's, whichever of its shards the
/// connections are on.
#[test]
fn a_server_at_its_connection_limit_refuses_at_once() {
    // over TCP too: before, the TCP transport never looked at the per-address limit
    for transport in [Transport::Udp, Transport::Tcp] {
        let server = Endpoint::bind(
            EndpointConfig::new(vec![loopback("127.0.0.1")])
                .with_transport(transport)
                .server()
                .with_max_connections_per_address(2)
                .with_shards(Some(4)),
        )
        .unwrap();
        let to = server.local_addrs()[0];
        let client = Endpoint::bind(
            EndpointConfig::new(vec![loopback("127.0.0.1")]).with_transport(transport),
        )
        .unwrap();
        let first = client.connect(&[to], ConnectionConfig::default()).unwrap();
        let _second = client.connect(&[to], ConnectionConfig::default()).unwrap();
        let start = Instant::now();
        let third = client.connect(&[to], ConnectionConfig::default());
        let took = start.elapsed();
        match third {
            Err(Error::Connection(ConnectionError::ServerFull)) => {}
            other => panic!("{transport:?}: expected ServerFull, got {other:?}"),
        }
        assert!(
            took < Duration::from_secs(2),
            "{transport:?}: refused after {took:?}"
        );
        println!("{transport:?}: third connection refused after {took:?}");
        first.abort(0, "done");
        drop(first);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match client.connect(&[to], ConnectionConfig::default()) {
                Ok(_) => break,
                Err(Error::Connection(ConnectionError::ServerFull))
                    if Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("{transport:?}: reconnecting after one connection ended: {e}"),
            }
        }
    }
}

/// A client vanishes without a word (its host gone: nothing more comes from it, not even an
/// ICMP error) and the server's application lets go of its connection with data undelivered.
/// The server ends that connection once the client was silent for its `close_linger` (2 s
/// here), and its place is free again: a server with room for one connection takes the next
/// client. Before, with no deadline in the configuration (the default), the connection was
/// kept as long as the endpoint lived, and every later client was refused (`ServerFull`).
#[test]
fn a_connection_let_go_of_whose_peer_vanished_is_forgotten() {
    use std::io::Write;
    for transport in [Transport::Udp, Transport::Tcp] {
        let server = Endpoint::bind(
            EndpointConfig::new(vec![loopback("127.0.0.1")])
                .with_transport(transport)
                .server()
                .with_max_connections(1)
                .with_close_linger(Duration::from_secs(2)),
        )
        .unwrap();
        let to = server.local_addrs()[0];
        // the vanishing client: on UDP an endpoint whose cable is pulled, on TCP a raw client
        // that says its hello and nothing more
        let udp_client = (transport == Transport::Udp).then(|| bind_on(transport, false));
        let (_udp_conn, mut tcp_client) = match &udp_client {
            Some(c) => (
                Some(c.connect(&[to], ConnectionConfig::default()).unwrap()),
                None,
            ),
            None => {
                let mut s = common::say_hello(to, 0x7a_4155, 0);
                let (reply, ..) = common::read_reply(&mut s);
                assert_eq!(reply.status, ri2n_proto::tcp::frame::HelloStatus::Accepted);
                (None, Some(s))
            }
        };
        let far = server.accept().unwrap();
        (&far).write_all(&[7; 100_000]).unwrap();
        // its last word (the silence counts from here), then it is gone
        if let Some(c) = &udp_client {
            c.impairment(c.local_addrs()[0]).unwrap().set_down(true);
        }
        if let Some(s) = &mut tcp_client {
            let mut round = Vec::new();
            let start = ri2n_proto::tcp::frame::Record::Round {
                pos: 0,
                backward: false,
            };
            start.encode(&mut round);
            s.write_all(&round).unwrap();
        }
        drop(far);
        let next = bind_on(transport, false);
        let connect = || next.connect(&[to], ConnectionConfig::default());
        // the premise: the server holds the vanished client's connection
        match connect() {
            Err(Error::Connection(ConnectionError::ServerFull)) => {}
            other => panic!("{transport:?}: expected ServerFull, got {other:?}"),
        }
        let start = Instant::now();
        loop {
            match connect() {
                Ok(_) => break,
                Err(Error::Connection(ConnectionError::ServerFull))
                    if start.elapsed() < Duration::from_secs(10) =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("{transport:?}: {e} after {:?}", start.elapsed()),
            }
        }
        println!(
            "{transport:?}: the next client taken after {:?}",
            start.elapsed()
        );
        // (not waited for as the endpoint goes: its cable is pulled)
        if let Some(c) = &udp_client {
            c.abort(0, "vanished");
        }
    }
}

/// `Endpoint::abort` (what `ri2n serve` does on SIGTERM): every connection of the server, on
/// each of its shards or over the TCP transport, ends at once, and each client's blocked read
/// fails with the code and reason the server gave; so does `finish` after it, which must not
/// tell a writer that its end is on its way.
#[test]
fn an_endpoint_aborted_tells_every_peer_why() {
    use std::io::{Read, Write};
    for transport in [Transport::Udp, Transport::Tcp] {
        let server = Endpoint::bind(
            EndpointConfig::new(vec![loopback("127.0.0.1")])
                .with_transport(transport)
                .with_shards(Some(2))
                .server(),
        )
        .unwrap();
        let client = Endpoint::bind(
            EndpointConfig::new(vec![loopback("127.0.0.1")]).with_transport(transport),
        )
        .unwrap();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let readers: Vec<_> = (0..3)
            .map(|i| {
                let mut conn = client
                    .connect(&server.local_addrs(), ConnectionConfig::default())
                    .unwrap();
                let accepted = server.accept().unwrap();
                // the premise: each connection carries data both ways before the abort
                conn.write_all(&[i; 1000]).unwrap();
                let mut got = [0u8; 1000];
                (&accepted).read_exact(&mut got).unwrap();
                assert_eq!(got, [i; 1000]);
                (&accepted).write_all(&[i; 10]).unwrap();
                let tid_tx = tid_tx.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 100];
                    (&conn).read_exact(&mut buf[..10]).unwrap();
                    let mut echoed = 10;
                    tid_tx.send(gettid()).unwrap();
                    let failed = loop {
                        match (&conn).read(&mut buf) {
                            Ok(0) => break None,
                            Ok(n) => echoed += n,
                            Err(e) => break Some(e),
                        }
                    };
                    (echoed, failed, conn.close_reason(), conn.finish(), accepted)
                })
            })
            .collect();
        // the premise: each reader has its 10 bytes and waits in its next read
        for tid in tid_rx.iter().take(3) {
            wait_asleep(tid, None);
        }
        server.abort(7, "down for maintenance");
        for r in readers {
            let (echoed, failed, reason, finished, _accepted) = r.join().unwrap();
            assert_eq!(echoed, 10, "{transport:?}");
            assert!(
                failed.is_some(),
                "{transport:?}: the read ended without an error"
            );
            assert_eq!(
                finished.map_err(|e| e.kind()),
                Err(std::io::ErrorKind::ConnectionAborted),
                "{transport:?}: finish after the end"
            );
            assert_eq!(
                reason,
                Some(ConnectionError::PeerAborted {
                    code: 7,
                    reason: "down for maintenance".into()
                }),
                "{transport:?}"
            );
        }
    }
}

/// Closing a TCP-transport server ends every connection's stream at once and waits for them
/// together: a client that stops reading costs the timeout for its own connection only, and
/// the clients that read get all their data and a clean end (they were finished one after
/// the other, each after the previous one's wait, and those behind the stalled one were
/// aborted with nothing left to deliver).
#[test]
fn closing_a_tcp_server_waits_for_its_connections_together() {
    use std::io::{Read, Write};
    let server = Endpoint::bind(
        EndpointConfig::new(vec![loopback("127.0.0.1")])
            .with_transport(Transport::Tcp)
            .server(),
    )
    .unwrap();
    let client = Endpoint::bind(
        EndpointConfig::new(vec![loopback("127.0.0.1")]).with_transport(Transport::Tcp),
    )
    .unwrap();
    // connection 0 never reads, and its window is small: what the server writes beyond it
    // is never acknowledged
    let mut stalled_config = ConnectionConfig::default();
    stalled_config.stream_receive_window = 256 << 10;
    let stalled = client
        .connect(&server.local_addrs(), stalled_config)
        .unwrap();
    let to_stalled = server.accept().unwrap();
    let mut queued = 0;
    while let Ok(n) = to_stalled.try_write(&[9u8; 64 << 10]) {
        queued += n;
    }
    assert!(queued > 256 << 10, "the server queued only {queued} bytes");
    const EACH: usize = 1 << 20;
    let readers: Vec<_> = (0..3u8)
        .map(|i| {
            let conn = client
                .connect(&server.local_addrs(), ConnectionConfig::default())
                .unwrap();
            let accepted = server.accept().unwrap();
            // its own stream ends, and the server has read that end before it writes: a
            // server's close after everything both ways arrived is a clean end
            // (`ClosedEarly` otherwise). (Finished in the reader's thread, the end could come
            // after the server's data was acknowledged and the server had closed.)
            conn.finish().unwrap();
            let mut nothing = Vec::new();
            (&accepted).read_to_end(&mut nothing).unwrap();
            assert!(nothing.is_empty());
            let reader = std::thread::spawn(move || {
                let mut got = Vec::new();
                let end = (&conn).read_to_end(&mut got).map(drop);
                (got, end, conn.close_reason())
            });
            (&accepted).write_all(&vec![i; EACH]).unwrap();
            (reader, accepted)
        })
        .collect();
    let r = server.close(Some(Duration::from_millis(1500)));
    assert!(
        matches!(r, Err(Error::NotDelivered { connections: 1, .. })),
        "{r:?}"
    );
    for (i, (reader, _accepted)) in readers.into_iter().enumerate() {
        let (got, end, reason) = reader.join().unwrap();
        assert!(end.is_ok(), "reader {i}: {end:?} ({reason:?})");
        assert_eq!(got.len(), EACH, "reader {i}");
        assert!(got.iter().all(|&b| b == i as u8), "reader {i}");
        assert_eq!(reason, None, "reader {i}");
    }
    drop(stalled);
}

/// `Endpoint::close` closes the endpoint's connections, not the endpoint: on both transports
/// a server goes on accepting, and a client connecting after the close is served (the TCP
/// transport stopped listening, so that `accept` waited for ever).
#[test]
fn a_server_accepts_again_after_closing_its_connections() {
    use std::io::{Read, Write};
    for transport in [Transport::Udp, Transport::Tcp] {
        let server = bind_on(transport, true);
        let client = bind_on(transport, false);
        let mut got = Vec::new();
        for round in 0..2u8 {
            let conn = client
                .connect(&server.local_addrs(), ConnectionConfig::default())
                .unwrap_or_else(|e| panic!("{transport:?}, round {round}: {e}"));
            let accepted = server
                .accept_timeout(Some(Duration::from_secs(5)))
                .unwrap()
                .unwrap_or_else(|| panic!("{transport:?}, round {round}: nothing accepted"));
            (&accepted).write_all(&[round; 1000]).unwrap();
            let r = server.close(Some(Duration::from_secs(5)));
            assert!(r.is_ok(), "{transport:?}, round {round}: {r:?}");
            got.clear();
            (&conn).read_to_end(&mut got).unwrap();
            assert_eq!(got, [round; 1000], "{transport:?}, round {round}");
        }
    }
}

/// A server endpoint dropped while a connection it handed out lives on (keeping its shard
/// running) accepts nothing more: a new client is refused at once (`NotAccepting`), and a
/// client that connected but was never accepted learns that its connection was aborted. Its
/// data used to be acknowledged, new clients' too, and the connections later closed as if
/// delivered, with nothing ever read. The connection the application holds goes on, on
/// either transport (the TCP transport's drop used to finish and close it).
#[test]
fn a_dropped_server_endpoint_accepts_nothing_more() {
    for transport in [Transport::Udp, Transport::Tcp] {
        a_dropped_server_endpoint_accepts_nothing_more_on(transport);
    }
}

fn a_dropped_server_endpoint_accepts_nothing_more_on(transport: Transport) {
    use std::io::{Read, Write};

    let server = bind_on(transport, true);
    let to = server.local_addrs();
    let client = bind_on(transport, false);
    let mut kept = client.connect(&to, ConnectionConfig::default()).unwrap();
    kept.write_all(b"a").unwrap();
    let mut held = server.accept().unwrap();
    let mut waiting = client.connect(&to, ConnectionConfig::default()).unwrap();
    waiting.write_all(b"never read").unwrap();
    // the premise: the server's engine took its data, so it waits to be accepted
    let deadline = Instant::now() + Duration::from_secs(5);
    while waiting.stats().bytes_acknowledged < 10 {
        assert!(
            Instant::now() < deadline,
            "{transport:?}: {:?}",
            waiting.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(server);

    let refused = client.connect(&to, ConnectionConfig::default());
    assert!(
        matches!(
            refused,
            Err(Error::Connection(ConnectionError::NotAccepting))
        ),
        "{transport:?}: a client after the drop: {:?}",
        refused.map(|c| c.state())
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while waiting.close_reason().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    match waiting.close_reason() {
        Some(ConnectionError::PeerAborted { reason, .. }) => {
            assert!(
                reason.contains("stopped accepting"),
                "{transport:?}: {reason}"
            )
        }
        other => panic!("{transport:?}: the unaccepted client's connection ended with {other:?}"),
    }
    // the connection the application holds goes on, both ways
    kept.write_all(b"b").unwrap();
    let mut got = [0u8; 2];
    held.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ab", "{transport:?}");
    held.write_all(b"c").unwrap();
    let mut back = [0u8; 1];
    kept.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"c", "{transport:?}");
}

/// A client endpoint dropped right after connecting (a helper that returns the connection
/// alone) leaves the connection working on either transport, until it is dropped too. The
/// TCP transport's drop used to finish and close it at once.
#[test]
fn a_connection_outlives_its_dropped_client_endpoint() {
    use std::io::{Read, Write};
    for transport in [Transport::Udp, Transport::Tcp] {
        let server = bind_on(transport, true);
        let connect = || {
            let client = bind_on(transport, false);
            client
                .connect(&server.local_addrs(), ConnectionConfig::default())
                .unwrap()
        };
        let mut conn = connect();
        let mut accepted = server.accept().unwrap();
        let sent = vec![5u8; 300_000];
        conn.write_all(&sent).unwrap();
        let mut got = vec![0u8; sent.len()];
        accepted.read_exact(&mut got).unwrap();
        assert!(got == sent, "{transport:?}: the data differs");
        accepted.write_all(b"answer").unwrap();
        let mut answer = [0u8; 6];
        conn.read_exact(&mut answer).unwrap();
        assert_eq!(&answer, b"answer", "{transport:?}");
        assert_eq!(conn.close_reason(), None, "{transport:?}");
        // dropped now, it still delivers what it wrote last
        conn.write_all(b"last").unwrap();
        drop(conn);
        let mut rest = Vec::new();
        accepted.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"last", "{transport:?}");
    }
}

/// A server that accepts a connection and drops it at once, its client still writing: once
/// what the server wrote (nothing) is delivered, the client is told that nobody reads, as TCP
/// resets a connection closed with data unread, on either transport. Its writes used to be
/// acknowledged until the window was full, then block for ever (keepalives kept the
/// connection up), the connection's threads held on both sides of the TCP transport.
#[test]
fn a_client_writing_to_a_dropped_connection_is_told_nobody_reads() {
    for transport in [Transport::Udp, Transport::Tcp] {
        a_client_writing_to_a_dropped_connection_is_told_nobody_reads_on(transport);
    }
}

fn a_client_writing_to_a_dropped_connection_is_told_nobody_reads_on(transport: Transport) {
    use std::io::Write;

    let config = EndpointConfig::new(vec![loopback("127.0.0.1")]).with_transport(transport);
    let server = Endpoint::bind(config.clone().server()).unwrap();
    let client = Endpoint::bind(config).unwrap();
    let mut conn = client
        .connect(&server.local_addrs(), ConnectionConfig::default())
        .unwrap();
    conn.write_all(b"hello").unwrap();
    drop(server.accept().unwrap());
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let chunk = vec![7u8; 1 << 20];
        let mut written = 0u64;
        let end = loop {
            match conn.write_all(&chunk) {
                Ok(()) => written += chunk.len() as u64,
                Err(e) => break e,
            }
            if written >= 1 << 30 {
                break std::io::Error::other("1 GiB written and taken");
            }
        };
        let _ = done.send((end, written, conn.close_reason()));
    });
    let (e, written, reason) = result
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{transport:?}: the client's writes still block 20 s after"));
    match reason {
        Some(ConnectionError::PeerAborted { reason, .. }) => {
            assert!(
                reason.contains("without reading"),
                "{transport:?}: {reason}"
            )
        }
        other => panic!("{transport:?}: after {written} bytes: {e}, with {other:?}"),
    }
    assert_eq!(
        e.kind(),
        std::io::ErrorKind::ConnectionAborted,
        "{transport:?}: {e}"
    );
    drop(server);
}

/// Closing an endpoint while one of its connections is still in its handshake, with nothing
/// written (a connect to a peer that never answers): nothing was left undelivered, and
/// `close` says so. It reported `NotDelivered` with 1 connection and 0 bytes.
#[test]
fn closing_during_a_handshake_with_nothing_written_delivers_everything() {
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap(); // bound, never read: no ICMP
    let to = silent.local_addr().unwrap();
    let client = Endpoint::client(&[loopback("127.0.0.1")]).unwrap();
    let config = ConnectionConfig::default().with_handshake_timeout(Duration::from_secs(20));
    let conn = client.start_connect(&[to], config).unwrap();
    // the premise: the handshake is under way when the close comes, and outlasts its wait
    assert_eq!(conn.state(), ri2n::ConnectionState::Connecting);
    let closed = client.close(Some(Duration::from_millis(200)));
    assert!(closed.is_ok(), "{closed:?}");
    // the close ended the handshake (it did not time out on its own)
    let ended = conn.wait_connected(Some(Duration::from_secs(5)));
    assert!(
        matches!(ended, Err(ref e) if !matches!(e, ConnectionError::TimedOut(_))),
        "{ended:?}"
    );
}

/// A server whose connection the client aborted, with nothing written on either side, had
/// nothing to deliver when it closes: `close` says so, on either transport. It reported
/// `NotDelivered` with 1 connection and 0 bytes (the end of the server's stream, which the
/// aborted peer never acknowledges).
#[test]
fn closing_after_the_peer_aborted_with_nothing_written_delivers_everything() {
    for transport in [Transport::Udp, Transport::Tcp] {
        let config = |server: bool| {
            let c = EndpointConfig::new(vec![loopback("127.0.0.1")]).with_transport(transport);
            if server {
                c.server()
            } else {
                c
            }
        };
        let server = Endpoint::bind(config(true)).unwrap();
        let client = Endpoint::bind(config(false)).unwrap();
        let conn = client
            .connect(&server.local_addrs(), ConnectionConfig::default())
            .unwrap();
        let accepted = server.accept().unwrap();
        conn.abort(7, "done");
        let deadline = Instant::now() + Duration::from_secs(5);
        while accepted.close_reason().is_none() {
            assert!(
                Instant::now() < deadline,
                "{transport:?}: the abort never arrived"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            matches!(
                accepted.close_reason(),
                Some(ConnectionError::PeerAborted { code: 7, .. })
            ),
            "{transport:?}: the premise: {:?}",
            accepted.close_reason()
        );
        let closed = server.close(Some(Duration::from_secs(1)));
        assert!(closed.is_ok(), "{transport:?}: {closed:?}");
    }
}

/// Both transports tell the same events: the second link added (to client and server) and,
/// once everything written and the stream's end are acknowledged, `AllAcknowledged`. The TCP
/// transport told neither.
#[test]
fn both_transports_tell_the_link_added_and_all_acknowledged() {
    use ri2n::Event;
    for transport in [Transport::Udp, Transport::Tcp] {
        let addrs = vec![loopback("127.0.0.1"), loopback("127.0.0.2")];
        let server = Endpoint::bind(
            EndpointConfig::new(addrs.clone())
                .with_transport(transport)
                .server(),
        )
        .unwrap();
        let client = Endpoint::bind(EndpointConfig::new(addrs).with_transport(transport)).unwrap();
        let mut conn = client
            .connect(&server.local_addrs(), ConnectionConfig::default())
            .unwrap();
        let accepted = server.accept().unwrap();
        std::io::Write::write_all(&mut conn, b"x").unwrap();
        conn.finish().unwrap();
        conn.wait_acknowledged(Some(Duration::from_secs(5)))
            .unwrap();
        let (mut client_events, mut server_events) = (Vec::new(), Vec::new());
        let deadline = Instant::now() + Duration::from_secs(5);
        let added = |events: &[Event]| {
            (events.iter()).any(|e| matches!(e, Event::LinkAdded { link } if link.0 == 1))
        };
        while !(added(&client_events) && added(&server_events)) && Instant::now() < deadline {
            client_events.extend(conn.poll_events().into_iter().map(|e| e.event));
            server_events.extend(accepted.poll_events().into_iter().map(|e| e.event));
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            added(&client_events),
            "{transport:?}, client: {client_events:?}"
        );
        assert!(
            added(&server_events),
            "{transport:?}, server: {server_events:?}"
        );
        assert!(
            client_events.contains(&Event::AllAcknowledged),
            "{transport:?}: {client_events:?}"
        );
    }
}

/// A connection that comes in while a server closes its connections is not one of them: it
/// is served after the close returns. The close used to abort every connection still open at
/// its end, so a client that connected during a close that waited on another (here one whose
/// links are cut) lost its connection a moment after the server accepted it.
#[test]
fn a_connection_that_comes_in_during_a_close_is_not_closed_by_it() {
    use std::io::{Read, Write};
    // one shard: each shard closes its own connections, and one without any is done at once
    let config = EndpointConfig::new(vec![loopback("127.0.0.1")]).with_shards(Some(1));
    let server = Endpoint::bind(config.server()).unwrap();
    let cut = bind_on(Transport::Udp, false);
    let _stalled = cut
        .connect(&server.local_addrs(), ConnectionConfig::default())
        .unwrap();
    let held = server.accept().unwrap();
    for s in cut.local_addrs() {
        cut.impairment(s).unwrap().set_down(true);
    }
    (&held).write_all(&[1u8; 100_000]).unwrap();
    let (closing, tid) = {
        let server = server.clone();
        spawn_with_tid(move || server.close(Some(Duration::from_millis(1500))))
    };
    // the premise: the close is under way, waiting on the stalled connection
    wait_asleep(tid, None);
    let client = bind_on(Transport::Udp, false);
    let late = client
        .connect(&server.local_addrs(), ConnectionConfig::default())
        .unwrap();
    let served = server.accept().unwrap();
    (&late).write_all(b"hello").unwrap();
    late.finish().unwrap();
    let mut got = Vec::new();
    (&served).read_to_end(&mut got).unwrap();
    assert_eq!(got, b"hello");
    let r = closing.join().unwrap();
    // the premise: the close waited on the cut connection while the late one came in
    assert!(
        matches!(r, Err(Error::NotDelivered { connections: 1, .. })),
        "{r:?}"
    );
    let answered = (&served).write_all(b"world").and_then(|()| served.finish());
    assert!(
        answered.is_ok(),
        "the late connection after the close: {answered:?}"
    );
    got.clear();
    let read = (&late).read_to_end(&mut got);
    assert!(read.is_ok(), "the late client's read: {read:?}");
    assert_eq!(got, b"world");
    // (dropped, the cut client would wait its linger for the end of its stream)
    cut.abort(0, "the test is over");
}

/// A connection whose handle was dropped, its data not yet delivered, and which ends while
/// the endpoint's `close` waits (its peer aborts it): the close reports what it left
/// undelivered, as TCP's does and as it does for a connection still held. Before, the UDP
/// transport released the connection as it ended, the close no longer found it, and it
/// returned `Ok(())` for megabytes never acknowledged.
#[test]
fn a_close_counts_what_a_dropped_connection_left_undelivered() {
    for transport in [Transport::Udp, Transport::Tcp] {
        let small = ConnectionConfig::default().with_stream_receive_window(256 << 10);
        let server = Endpoint::bind(
            EndpointConfig::new(vec![loopback("127.0.0.1")])
                .with_transport(transport)
                .with_shards(Some(1))
                .with_server_connection(small)
                .server(),
        )
        .unwrap();
        let client = bind_on(transport, false);
        let conn = (client.connect(&server.local_addrs(), ConnectionConfig::default())).unwrap();
        let peer = server.accept().unwrap();
        // more than the server's window: the rest waits, and the server reads nothing
        std::io::Write::write_all(&mut &conn, &vec![7u8; 2 << 20]).unwrap();
        drop(conn);
        let (closing, tid) = {
            let client = client.clone();
            spawn_with_tid(move || client.close(Some(Duration::from_secs(5))))
        };
        // the premise: the close waits on the dropped connection when its peer aborts it
        wait_asleep(tid, None);
        peer.abort(5, "the server gives up");
        let closed = closing.join().unwrap();
        assert!(
            matches!(closed, Err(Error::NotDelivered { connections: 1, bytes }) if bytes > 0),
            "{transport:?}: {closed:?}"
        );
    }
}

/// A server of two shards whose connections each hold data their unreachable peers never
/// acknowledge: dropping the endpoint and then its connections waits the linger once, when
/// the last goes, for all of them together. Before, on the UDP transport, dropping the last
/// connection of a shard waited that shard's linger on the dropping thread though the other
/// connection lived on, and the next shard's last connection the linger again.
#[test]
fn a_server_of_two_shards_lingers_once_when_its_last_connection_goes() {
    let linger = Duration::from_secs(1);
    let server = Endpoint::bind(
        EndpointConfig::new(vec![loopback("127.0.0.1")])
            .with_shards(Some(2))
            .with_close_linger(linger)
            .server(),
    )
    .unwrap();
    let mut clients = Vec::new();
    let mut accepted = Vec::new();
    while accepted.len() < 2 {
        let c = bind_on(Transport::Udp, false);
        let conn = c
            .connect(&server.local_addrs(), ConnectionConfig::default())
            .unwrap();
        let peer = server.accept().unwrap();
        // one connection on each shard
        if accepted
            .iter()
            .all(|a: &ri2n::Connection| a.shard() != peer.shard())
        {
            accepted.push(peer);
        }
        clients.push((c, conn));
    }
    // nothing the server writes is acknowledged any more
    for (c, _) in &clients {
        for s in c.local_addrs() {
            c.impairment(s).unwrap().set_down(true);
        }
    }
    for a in &accepted {
        std::io::Write::write_all(&mut &*a, &[1u8; 100_000]).unwrap();
    }
    drop(server);
    let mut it = accepted.into_iter();
    let start = Instant::now();
    drop(it.next());
    let first = start.elapsed();
    drop(it.next());
    let all = start.elapsed();
    assert!(
        first < linger / 2,
        "dropping one of two connections waited {first:?}"
    );
    assert!(
        all >= linger && all < linger * 3 / 2,
        "dropping both took {all:?} (linger {linger:?})"
    );
}

/// A connection still in its handshake, with nothing written, has nothing to deliver: the
/// endpoint's last handle going does not wait the linger for it. It waited it whole (the
/// smaller of the linger and the handshake's timeout, 10 s by default) before.
#[test]
fn a_handshake_with_nothing_written_holds_no_linger() {
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap(); // bound, never read: no ICMP
    let linger = Duration::from_secs(2);
    let client =
        Endpoint::bind(EndpointConfig::new(vec![loopback("127.0.0.1")]).with_close_linger(linger))
            .unwrap();
    let conn = client
        .start_connect(&[silent.local_addr().unwrap()], ConnectionConfig::default())
        .unwrap();
    // the premise: the handshake is under way when the handles go
    assert_eq!(conn.state(), ri2n::ConnectionState::Connecting);
    let start = Instant::now();
    drop(conn);
    drop(client);
    let took = start.elapsed();
    assert!(took < linger / 4, "the drop waited {took:?}");
}

/// An abort's code reaches the peer as it was given, 0 included, on either transport. The
/// TCP transport sent code 0 as 1 (its CLOSE with code 0 is the clean close), so the peer
/// saw `PeerAborted { code: 1 }` and could not tell it from an application's own 1.
#[test]
fn an_abort_code_of_zero_reaches_the_peer_as_zero() {
    for transport in [Transport::Udp, Transport::Tcp] {
        for code in [0, 1, 7] {
            let server = bind_on(transport, true);
            let client = bind_on(transport, false);
            let conn =
                (client.connect(&server.local_addrs(), ConnectionConfig::default())).unwrap();
            let peer = server.accept().unwrap();
            conn.abort(code, "given up");
            let mut buf = [0u8; 8];
            let read = std::io::Read::read(&mut &peer, &mut buf);
            assert!(read.is_err(), "{transport:?}: {read:?}");
            assert_eq!(
                peer.close_reason(),
                Some(ConnectionError::PeerAborted {
                    code,
                    reason: "given up".into()
                }),
                "{transport:?}"
            );
        }
    }
}
