//! Endpoints with several shards (an engine and a driver thread each, on the same addresses):
//! connections spread over them and each receives exactly what was sent to it, also when
//! connections of two shards share their paths (datagrams that the kernel steers to the
//! wrong shard are forwarded), and a peer's restart reaches connections on every shard.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command};
use std::thread;
use std::time::{Duration, Instant};

use ri2n::{Connection, ConnectionConfig, ConnectionError, Endpoint, EndpointConfig};

const BYTES_EACH: usize = 2 << 20;

fn addrs(ips: &[&str], port: u16) -> Vec<SocketAddr> {
    ips.iter()
        .map(|ip| format!("{ip}:{port}").parse().unwrap())
        .collect()
}

fn endpoint(config: EndpointConfig, shards: usize) -> Endpoint {
    let e = Endpoint::bind(config.with_shards(Some(shards))).unwrap();
    assert_eq!(e.shards(), shards, "the endpoint runs the shards asked for");
    e
}

/// A server on 127.0.0.1 and 127.0.0.2 with two shards.
fn two_shard_server() -> Endpoint {
    endpoint(
        EndpointConfig::new(addrs(&["127.0.0.1", "127.0.0.2"], 0)).server(),
        2,
    )
}

/// `n` one-shard client endpoints on 127.0.0.1 and 127.0.0.2, so that their connections
/// have paths of their own.
fn client_endpoints(n: usize) -> Vec<Endpoint> {
    (0..n)
        .map(|_| Endpoint::client(&addrs(&["127.0.0.1", "127.0.0.2"], 0)).unwrap())
        .collect()
}

/// Connection `k`'s bytes: distinct per connection, so a mix-up between them shows.
fn payload(k: usize) -> Vec<u8> {
    (0..BYTES_EACH)
        .map(|i| (i.wrapping_mul(31) ^ k.wrapping_mul(7919) ^ (i >> 11)) as u8)
        .collect()
}

/// Each client connection sends its payload and reads it back from the server's echo.
fn echo_all(server: &Endpoint, clients: Vec<Connection>) -> Vec<usize> {
    let n = clients.len();
    let mut server_shards = Vec::new();
    let echoes: Vec<_> = (0..n)
        .map(|_| {
            let mut peer = server
                .accept_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut peer = peer.take().expect("the server accepts every client");
            server_shards.push(peer.shard());
            thread::spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let got = peer.read(&mut buf).unwrap();
                    if got == 0 {
                        break;
                    }
                    peer.write_all(&buf[..got]).unwrap();
                }
                peer.finish().unwrap();
            })
        })
        .collect();
    let senders: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(k, conn)| {
            thread::spawn(move || {
                let sent = payload(k);
                let back = thread::scope(|s| {
                    let check = s.spawn(|| {
                        let mut back = Vec::new();
                        (&conn).read_to_end(&mut back).unwrap();
                        back
                    });
                    (&conn).write_all(&sent).unwrap();
                    conn.finish().unwrap();
                    check.join().unwrap()
                });
                assert!(
                    back == sent,
                    "connection {k} got back other bytes than it sent"
                );
            })
        })
        .collect();
    for t in senders.into_iter().chain(echoes) {
        t.join().unwrap();
    }
    server_shards
}

#[test]
fn connections_spread_evenly_over_the_shards_and_each_gets_its_own_bytes() {
    let server = two_shard_server();
    let to = server.local_addrs();
    // separate client endpoints, so that each connection has paths of its own: the kernel's
    // steering program alone must bring every datagram to its shard. Each connects once the
    // one before is up: each goes to the shard with the fewer connections.
    let endpoints: Vec<Endpoint> = client_endpoints(16);
    let clients = (endpoints.iter())
        .map(|c| c.connect(&to[..1], ConnectionConfig::default()).unwrap())
        .collect();
    let used = echo_all(&server, clients);
    let on_first = used.iter().filter(|&&s| s == 0).count();
    assert_eq!(
        on_first, 8,
        "the server's 16 connections are spread evenly over its 2 shards: {used:?}"
    );
    assert_eq!(server.dropped_datagrams().total(), 0);
}

/// An endpoint runs up to `SHARDS_LIMIT` shards and serves from them; one more is refused
/// as a configuration error (beyond 64, shards were woken for one another's forwarded
/// datagrams, and a debug build panicked).
#[test]
fn an_endpoint_runs_up_to_the_shard_limit_and_refuses_more() {
    let config = EndpointConfig::new(addrs(&["127.0.0.1"], 0)).server();
    let too_many = Endpoint::bind(config.clone().with_shards(Some(ri2n::SHARDS_LIMIT + 1)));
    assert!(
        matches!(too_many, Err(ri2n::Error::Connect(ref e)) if e.to_string().contains("64")),
        "{too_many:?}"
    );
    let server = endpoint(config, ri2n::SHARDS_LIMIT);
    let client = Endpoint::client(&addrs(&["127.0.0.1"], 0)).unwrap();
    let conn = client
        .connect(&server.local_addrs(), ConnectionConfig::default())
        .unwrap();
    let peer = server.accept().unwrap();
    conn.send_message(b"ping").unwrap();
    assert_eq!(peer.recv_message().unwrap().unwrap(), b"ping");
}

#[test]
fn connections_of_two_shards_sharing_their_paths_lose_nothing() {
    let server = two_shard_server();
    let to = server.local_addrs();
    // one sharded client endpoint: all its connections run between the same address pairs,
    // so one GSO batch, one GRO buffer or one path socket can carry datagrams of connections
    // of both shards, on either side
    let client = endpoint(
        EndpointConfig::new(addrs(&["127.0.0.1", "127.0.0.2"], 0)),
        2,
    );
    let clients: Vec<Connection> = (0..8)
        .map(|_| {
            client
                .connect(&to[..1], ConnectionConfig::default())
                .unwrap()
        })
        .collect();
    let client_shards: Vec<usize> = clients.iter().map(Connection::shard).collect();
    assert!(
        client_shards.contains(&0) && client_shards.contains(&1),
        "the client opens its connections on both shards in turn: {client_shards:?}"
    );
    echo_all(&server, clients);
    assert_eq!(
        server.dropped_datagrams().total() + client.dropped_datagrams().total(),
        0,
        "no datagram was dropped as unknown: each reached its connection's shard"
    );
}

#[test]
fn the_connection_limit_is_the_endpoints_whichever_shards_hold_them() {
    let server = endpoint(
        EndpointConfig::new(addrs(&["127.0.0.1"], 0))
            .server()
            .with_max_connections(3),
        4,
    );
    let to = server.local_addrs();
    // from three addresses, so that the limit per address plays no part
    let clients: Vec<Endpoint> = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
        .iter()
        .map(|ip| Endpoint::client(&addrs(&[ip], 0)).unwrap())
        .collect();
    let held: Vec<Connection> = (clients[..3].iter())
        .map(|c| c.connect(&to, ConnectionConfig::default()).unwrap())
        .collect();
    match clients[3].connect(&to, ConnectionConfig::default()) {
        Err(ri2n::Error::Connection(ConnectionError::ServerFull)) => {}
        other => panic!("a fourth connection is refused as ServerFull: {other:?}"),
    }
    drop(held);
}

/// The environment variable that makes this test binary a server that waits to be killed
/// (its ports in the value).
const CHILD_SERVER: &str = "RI2N_TEST_SHARDS_CHILD_SERVER";

/// Run as a child process: a server on the given port of 127.0.0.1 and 127.0.0.2 that
/// accepts and holds connections until it is killed. Ignored, so that a run of the tests
/// does not count it as passed: the restart test runs it with `--ignored`.
#[test]
#[ignore = "a child process of the restart test, which runs it"]
fn child_server() {
    let port = std::env::var(CHILD_SERVER).expect("run by the restart test, with its port");
    let port: u16 = port.parse().unwrap();
    let server = endpoint(
        EndpointConfig::new(addrs(&["127.0.0.1", "127.0.0.2"], port)).server(),
        1,
    );
    let mut held = Vec::new();
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        if let Some(c) = server
            .accept_timeout(Some(Duration::from_millis(100)))
            .unwrap()
        {
            held.push(c);
        }
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_restarted_peer_is_noticed_by_connections_on_every_shard() {
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let spawn_server = || {
        KillOnDrop(
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "child_server", "--ignored", "--nocapture"])
                .arg("--test-threads=1")
                .env(CHILD_SERVER, port.to_string())
                .spawn()
                .unwrap(),
        )
    };
    let mut server = spawn_server();
    let client = endpoint(
        EndpointConfig::new(addrs(&["127.0.0.1", "127.0.0.2"], 0)),
        2,
    );
    let to = addrs(&["127.0.0.1"], port);
    let start = Instant::now();
    let connect = || loop {
        match client.connect(&to, ConnectionConfig::default()) {
            Ok(c) => return c,
            // the child is still binding
            Err(_) if start.elapsed() < Duration::from_secs(10) => {
                thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("cannot connect to the child server: {e}"),
        }
    };
    let mut conns: Vec<Connection> = (0..4).map(|_| connect()).collect();
    assert!((conns.iter()).any(|c| c.shard() == 0) && conns.iter().any(|c| c.shard() == 1));
    for c in &mut conns {
        c.write_all(b"before the restart").unwrap();
    }
    // the server's process dies without a word and a new one takes its ports: it answers
    // the connections' packets with RESETs, which name the old server's connection IDs
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    let _restarted = spawn_server();
    let killed = Instant::now();
    let ends: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            thread::spawn(move || {
                // keep writing until the connection ends (a write makes a packet to answer)
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline {
                    if let Err(e) = c.write_all(b"after the restart") {
                        return (c.shard(), Some(e));
                    }
                    thread::sleep(Duration::from_millis(10));
                }
                (c.shard(), None)
            })
        })
        .collect();
    for t in ends {
        let (shard, e) = t.join().unwrap();
        let e = e.unwrap_or_else(|| panic!("a connection of shard {shard} never ended"));
        let reason = e
            .get_ref()
            .and_then(|r| r.downcast_ref::<ConnectionError>());
        assert_eq!(
            reason,
            Some(&ConnectionError::PeerRestarted),
            "shard {shard}'s connection learned of the restart: {e}"
        );
    }
    assert!(killed.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_connection_outlives_its_endpoint_and_the_other_shards() {
    let server = two_shard_server();
    let to = server.local_addrs();
    let clients: Vec<Endpoint> = client_endpoints(16);
    let mut conns: Vec<Connection> = (clients.iter())
        .map(|c| c.connect(&to[..1], ConnectionConfig::default()).unwrap())
        .collect();
    let mut accepted: Vec<Connection> = (0..conns.len())
        .map(|_| {
            server
                .accept_timeout(Some(Duration::from_secs(10)))
                .unwrap()
                .unwrap()
        })
        .collect();
    // keep one connection: once the endpoint goes, the other shard (which holds half of the
    // connections) has no handle left and stops, its sockets closed, while the kept
    // connection's shard runs on
    let kept = accepted.pop().unwrap();
    drop(accepted);
    drop(server);
    // every client sends the same bytes, so the kept connection's client is any of them
    let sent = payload(3);
    let writers: Vec<_> = conns
        .drain(..)
        .map(|mut c| {
            let sent = sent.clone();
            thread::spawn(move || {
                // a client whose server connection is gone sees its connection end
                let _ = c.write_all(&sent).and_then(|()| c.finish());
                c
            })
        })
        .collect();
    let mut got = Vec::new();
    let mut kept = kept;
    kept.read_to_end(&mut got).unwrap();
    assert!(
        got == sent,
        "the connection that outlived its endpoint read exact bytes"
    );
    for w in writers {
        drop(w.join().unwrap());
    }
}

#[test]
fn two_clients_connecting_together_get_a_shard_each() {
    let server = two_shard_server();
    let to = server.local_addrs();
    let clients: Vec<Endpoint> = client_endpoints(2);
    let conns: Vec<Connection> = thread::scope(|s| {
        let connecting: Vec<_> = (clients.iter())
            .map(|c| s.spawn(|| c.connect(&to[..1], ConnectionConfig::default()).unwrap()))
            .collect();
        connecting.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let used = echo_all(&server, conns);
    assert!(
        used.contains(&0) && used.contains(&1),
        "two connections made at once are on different shards: {used:?}"
    );
}
