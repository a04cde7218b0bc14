//! What an endpoint keeps of a connection its application released after a clean end
//! (PROTOCOL.md §8.3): enough to confirm that end to a peer that missed it, counted against
//! no limit of the live connections and found by nothing meant for them, and bounded.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ri2n_proto::{
    ConnectionConfig, ConnectionCounts, ConnectionError, ConnectionHandle, ConnectionState,
    Endpoint, EndpointConfig, Shard,
};
use ri2n_sim::testbed::drain;

const SERVER: &str = "10.0.0.2:6000";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A server endpoint on [`SERVER`], its configuration made by `cfg`.
fn server(now: Instant, cfg: impl FnOnce(&mut EndpointConfig)) -> Endpoint {
    let mut config = EndpointConfig::new(vec![addr(SERVER)]).server();
    cfg(&mut config);
    Endpoint::new(config, 2, now)
}

/// A client endpoint at `at`; endpoints made with the same `seed` draw the same connection
/// IDs (and instance), as a client that draws the same ID again.
fn client(at: &str, seed: u64, now: Instant) -> Endpoint {
    Endpoint::new(EndpointConfig::new(vec![addr(at)]), seed, now)
}

/// One step: every datagram each way, the clock a millisecond on, the timers run.
fn step(client: &mut Endpoint, server: &mut Endpoint, now: &mut Instant) {
    for (t, mut d) in drain(client, *now) {
        server.handle_datagram(*now, t.remote, t.local, &mut d);
    }
    for (t, mut d) in drain(server, *now) {
        client.handle_datagram(*now, t.remote, t.local, &mut d);
    }
    *now += Duration::from_millis(1);
    client.handle_timeout(*now);
    server.handle_timeout(*now);
}

/// Runs connection `ch` of `client` until it is accepted by `server`; writes `send` bytes
/// from the client; when `end`, both sides finish and the exchange runs until both are
/// Closed (the server never reads). Returns the server's handle.
fn exchange(
    client: &mut Endpoint,
    server: &mut Endpoint,
    now: &mut Instant,
    ch: ConnectionHandle,
    send: usize,
    end: bool,
) -> Option<ConnectionHandle> {
    let mut sh = None;
    let mut written = 0;
    let chunk = vec![7u8; 16 * 1024];
    for _ in 0..20_000 {
        step(client, server, now);
        sh = sh.or_else(|| server.accept());
        let c = client.connection_mut(ch).unwrap();
        if c.state() == ConnectionState::Closed && (!end || sh.is_none()) {
            return sh; // refused or failed
        }
        while written < send {
            let n = (send - written).min(chunk.len());
            match c.write(&chunk[..n]) {
                Ok(0) | Err(_) => break,
                Ok(w) => written += w,
            }
        }
        let Some(h) = sh else { continue };
        if !end {
            if written == send {
                return sh;
            }
            continue;
        }
        if written == send {
            client.connection_mut(ch).unwrap().finish();
        }
        server.connection_mut(h).unwrap().finish();
        let closed = |e: &Endpoint, h| e.connection(h).unwrap().state() == ConnectionState::Closed;
        if closed(client, ch) && closed(server, h) {
            return sh;
        }
    }
    panic!("the exchange did not end");
}

/// Released connections count against no limit of the server's: a client that opens one
/// short exchange after another is never refused while they linger, however low the limits,
/// and the server keeps `max_connections` of them at most, the oldest going first; none once
/// their linger is over.
#[test]
fn released_connections_count_against_no_limit_and_stay_bounded() {
    let mut now = Instant::now();
    let mut server = server(now, |c| {
        c.max_connections = 2;
        c.max_connections_per_address = 1;
    });
    let mut client = client("10.0.0.1:5000", 1, now);
    let mut released = Vec::new();
    for _ in 0..5 {
        let ch = client
            .connect(now, &[addr(SERVER)], ConnectionConfig::default())
            .unwrap();
        let sh = exchange(&mut client, &mut server, &mut now, ch, 0, true).expect("accepted");
        assert_eq!(client.connection(ch).unwrap().close_reason(), None);
        assert!(server.release(sh, now));
        assert!(client.release(ch, now));
        assert_eq!(server.connection_count(), 0, "released, not held");
        released.push(sh);
    }
    let kept: Vec<bool> = (released.iter())
        .map(|&h| server.connection(h).is_some())
        .collect();
    assert_eq!(kept, [false, false, false, true, true]);
    server.handle_timeout(now + server.config().close_linger);
    assert!(released.iter().all(|&h| server.connection(h).is_none()));
}

/// A released connection keeps what confirming its clean end takes (its links and keys),
/// not the data its application left unread (a clean end does not wait for the reader):
/// that went with the release. Before, a megabyte unread (up to the receive windows) stayed
/// for the whole linger.
#[test]
fn a_released_connection_keeps_no_unread_data() {
    let mut now = Instant::now();
    let mut server = server(now, |_| {});
    let mut client = client("10.0.0.1:5000", 1, now);
    let ch = client
        .connect(now, &[addr(SERVER)], ConnectionConfig::default())
        .unwrap();
    const SENT: usize = 1 << 20;
    let sh = exchange(&mut client, &mut server, &mut now, ch, SENT, true).expect("accepted");
    let s = server.connection(sh).unwrap();
    assert_eq!(s.close_reason(), None, "a clean end");
    assert_eq!(s.unread_bytes(), SENT as u64, "the server never read");
    assert!(server.release(sh, now));
    let kept = server.connection(sh).expect("kept for the linger");
    assert_eq!(kept.unread_bytes(), 0, "unread data kept after the release");
}

/// Clients that draw the same connection ID (here: endpoints of the same seed, at other
/// addresses) each finish a clean exchange, and the server releases each: the released ones
/// do not count against the cap of connections that share a client's ID (4). Before, the
/// fifth was refused while the four lingered.
#[test]
fn released_connections_do_not_count_among_those_sharing_a_client_id() {
    let mut now = Instant::now();
    let mut server = server(now, |_| {});
    for i in 1..=5 {
        let mut client = client(&format!("10.0.0.{i}:5000"), 1, now);
        let ch = client
            .connect(now, &[addr(SERVER)], ConnectionConfig::default())
            .unwrap();
        let sh = exchange(&mut client, &mut server, &mut now, ch, 0, true);
        let c = client.connection(ch).unwrap();
        assert_eq!(
            (sh.is_some(), c.close_reason()),
            (true, None),
            "client {i}: the exchange ends cleanly"
        );
        assert!(server.release(sh.unwrap(), now));
        assert!(client.release(ch, now));
    }
}

/// A client at one address draws the same connection ID again, after its first connection
/// ended cleanly and was released, then restarts: its RESET (§8.4) ends the live
/// connection with `PeerRestarted`. Before, the released one, listed first under that ID,
/// took the RESET and did nothing with it, and the live one never learned.
#[test]
fn a_reset_reaches_the_live_connection_not_a_released_one() {
    let mut now = Instant::now();
    let mut server = server(now, |_| {});
    let at = "10.0.0.1:5000";
    let mut first = client(at, 1, now);
    let ch = first
        .connect(now, &[addr(SERVER)], ConnectionConfig::default())
        .unwrap();
    let sh1 = exchange(&mut first, &mut server, &mut now, ch, 100_000, true).expect("accepted");
    assert!(server.release(sh1, now));
    drop(first);
    let mut second = client(at, 1, now);
    let ch = second
        .connect(now, &[addr(SERVER)], ConnectionConfig::default())
        .unwrap();
    let sh2 = exchange(&mut second, &mut server, &mut now, ch, 1000, false).expect("accepted");
    assert_ne!(sh1, sh2);
    assert_eq!(
        server.connection(sh2).unwrap().state(),
        ConnectionState::Established
    );
    drop(second);
    let mut restarted = client(at, 99, now);
    server
        .connection_mut(sh2)
        .unwrap()
        .write(&[1u8; 2000])
        .unwrap();
    for _ in 0..3000 {
        step(&mut restarted, &mut server, &mut now);
        if server.connection(sh2).unwrap().state() == ConnectionState::Closed {
            break;
        }
    }
    let s = server.connection(sh2).unwrap();
    assert_eq!(
        (s.state(), s.close_reason()),
        (
            ConnectionState::Closed,
            Some(&ConnectionError::PeerRestarted)
        ),
        "the restarted client's RESET ends the live connection within 3 s"
    );
}

/// The shards of one endpoint keep `max_connections` released connections at most between
/// them. Before, each kept its share rounded up, at least one: three shards with a limit of
/// one kept three.
#[test]
fn an_endpoint_of_several_shards_keeps_at_most_max_connections_released() {
    let mut now = Instant::now();
    let counts = std::sync::Arc::new(ConnectionCounts::default());
    const SHARDS: u32 = 3;
    // each shard's engine driven alone, as a driver steers each client's packets to one
    // shard; they share their counts as a driver's shards do
    let mut shards: Vec<Endpoint> = (0..SHARDS)
        .map(|index| {
            server(now, |c| {
                c.max_connections = 1;
                c.shard = Shard {
                    index,
                    count: SHARDS,
                };
                c.connection_counts = Some(counts.clone());
            })
        })
        .collect();
    let mut released = Vec::new();
    for (i, server) in shards.iter_mut().enumerate() {
        let mut client = client(&format!("10.0.0.{}:5000", i + 1), i as u64 + 10, now);
        let ch = client
            .connect(now, &[addr(SERVER)], ConnectionConfig::default())
            .unwrap();
        let sh = exchange(&mut client, server, &mut now, ch, 0, true).expect("accepted");
        assert!(server.release(sh, now));
        released.push(sh);
    }
    let kept = (shards.iter().zip(&released))
        .filter(|(s, &h)| s.connection(h).is_some())
        .count();
    assert_eq!(kept, 1, "released connections kept by the endpoint");
}
