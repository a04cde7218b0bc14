//! An attacker without the key against keyed connections, simulated at the engine's edge
//! (docs/PROTOCOL.md §11): each test plays one attack of issue 40 while a transfer runs, and
//! checks that the connection neither ends nor stalls and that the server keeps no state for
//! it. The attacker reads the links where the attack needs it (connection IDs, cookies,
//! captured handshakes), but never holds the key.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ri2n_proto::wire::{self, packet_type, Writer};
use ri2n_proto::{
    ConnectionError, ConnectionState, DropReason, Endpoint, EndpointConfig, Event, Key, LinkId,
    LinkState,
};
use ri2n_sim::testbed::{
    drain, initial_packet as initial, Capture, Testbed, TestbedConfig, Transfer,
};
use ri2n_sim::Dir;

fn key() -> Key {
    Key::from_bytes([1; 32])
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Both ends keyed, two links, 256 KiB buffers, the first 20 000 client datagrams kept for
/// the attacker to read.
fn keyed_sim() -> Testbed {
    Testbed::new(
        TestbedConfig::new(2)
            .with_buffers(256 << 10, 256 << 10)
            .with_keys(Some(key()), Some(key()))
            .with_capture(Dir::AToB, Capture::first(20_000)),
    )
}

/// Four rounds of what `client` and `server` send each other at instant `now`, the client's
/// short packets passed on only if `shorts` (without them the server is never confirmed).
fn exchange(client: &mut Endpoint, server: &mut Endpoint, now: Instant, shorts: bool) {
    for _ in 0..4 {
        for (t, mut d) in drain(client, now) {
            if shorts || packet_type_of(&d) != packet_type::SHORT {
                server.handle_datagram(now, t.remote, t.local, &mut d);
            }
        }
        for (t, mut d) in drain(server, now) {
            client.handle_datagram(now, t.remote, t.local, &mut d);
        }
    }
}

fn packet_type_of(d: &[u8]) -> u8 {
    d[1]
}

/// The cookie `server` gives a client claiming to be at `from` with connection ID `scid`
/// (what an attacker reads off the path after sending an INITIAL without a token from there).
fn cookie_for(
    server: &mut Endpoint,
    now: Instant,
    to: SocketAddr,
    from: SocketAddr,
    scid: u64,
) -> Vec<u8> {
    let mut d = initial(scid, &[], wire::handshake_mode::NOISE_NNPSK0, &[]);
    server.handle_datagram(now, to, from, &mut d);
    drain(server, now)
        .into_iter()
        .find_map(|(_, d)| match wire::decode_packet(&d) {
            Ok((wire::Header::Retry { dcid, token }, _)) if dcid == scid => Some(token.to_vec()),
            _ => None,
        })
        .expect("a RETRY")
}

/// A real keyed INITIAL as another client of the cluster sent it to `server` (its second
/// INITIAL, the one that carries the cookie and the Noise message), captured on its way: the
/// client connection ID, mode and hello an attacker replays.
fn captured_initial(
    server: &mut Endpoint,
    now: Instant,
    server_addr: SocketAddr,
) -> (u64, u8, Vec<u8>) {
    let other = addr("10.5.0.1:7000");
    let mut cfg = EndpointConfig::new(vec![other]);
    cfg.key = Some(key());
    let mut client = Endpoint::new(cfg, 77, now);
    client
        .connect(now, &[server_addr], Default::default())
        .unwrap();
    for _ in 0..3 {
        for (t, mut d) in drain(&mut client, now) {
            if let Ok((
                wire::Header::Initial {
                    scid,
                    token,
                    mode,
                    hello,
                },
                _,
            )) = wire::decode_packet(&d)
            {
                if !token.is_empty() {
                    return (scid, mode, hello.to_vec());
                }
            }
            server.handle_datagram(now, t.remote, t.local, &mut d);
        }
        for (t, mut d) in drain(server, now) {
            client.handle_datagram(now, t.remote, t.local, &mut d);
        }
    }
    panic!("the other client sent no INITIAL with a cookie");
}

/// Link-state events of `ep` so far: how often a link of any connection went down.
fn downs(ep: &mut Endpoint) -> usize {
    std::iter::from_fn(|| ep.poll_event())
        .filter(|(_, e)| {
            matches!(
                e,
                Event::LinkStateChanged {
                    to: LinkState::Down | LinkState::Degraded,
                    ..
                }
            )
        })
        .count()
}

/// Finding 1. ICMP "port unreachable" messages forged against both ends of a keyed transfer
/// on both links: blind ones (ports right, the quoted packet made up) are ignored; ones
/// quoting real packets (an attacker reading the links) make each side ask its peer, which
/// answers, so the transfer completes.
#[test]
fn forged_port_unreachable_does_not_end_a_connection() {
    let mut sim = keyed_sim();
    sim.establish();
    let mut t = Transfer::new(64 << 20, 4 << 20, 20, true);
    sim.advance(Duration::from_millis(20), |s| t.pump(s));
    let client_cid = {
        // the server's peer CID is the client's own: the first INITIAL carries it
        match wire::decode_packet(&sim.captured(Dir::AToB)[0].bytes) {
            Ok((wire::Header::Initial { scid, .. }, _)) => scid,
            other => panic!("first captured datagram: {other:?}"),
        }
    };
    let pairs: Vec<(SocketAddr, SocketAddr)> = sim.pairs(); // (server address, client address)
    assert_eq!(pairs.len(), 2, "both links carry data");
    let (mut blind, mut matched) = (0, 0);
    for round in 0..100u64 {
        let now = sim.instant();
        for &(server, client) in &pairs {
            // blind: a made-up connection ID, or none of ours at all
            let mut made_up = [0u8; 24];
            let mut w = Writer::new(&mut made_up);
            wire::write_short_header(&mut w, 0x5eed_0000 + round, LinkId(0), round, 0);
            assert!(!sim
                .client
                .handle_port_unreachable(now, client, server, &made_up));
            assert!(!sim
                .server
                .handle_port_unreachable(now, server, client, b"junk"));
            blind += 2;
            // on the path: the latest packet the client sent there, and one the server sent
            let last = sim
                .captured(Dir::AToB)
                .iter()
                .rev()
                .find(|c| {
                    c.local == server && c.remote == client && c.bytes[1] == packet_type::SHORT
                })
                .expect("a captured short packet");
            let quote = last.bytes[..24].to_vec();
            matched += usize::from(
                sim.client
                    .handle_port_unreachable(now, client, server, &quote),
            );
            let link = sim.link_id(server, client).unwrap();
            let mut theirs = [0u8; 24];
            let mut w = Writer::new(&mut theirs);
            wire::write_short_header(&mut w, client_cid, LinkId(link), 0, 0);
            matched += usize::from(
                sim.server
                    .handle_port_unreachable(now, server, client, &theirs),
            );
        }
        sim.advance(Duration::from_millis(1), |s| t.pump(s));
    }
    assert_eq!(
        matched,
        4 * 100,
        "the quoted packets were not taken as ours"
    );
    assert_eq!(
        sim.client.dropped().get(DropReason::UnmatchedRefusal)
            + sim.server.dropped().get(DropReason::UnmatchedRefusal),
        blind
    );
    assert!(
        !t.complete(&sim),
        "the transfer ended before the attack did"
    );
    sim.complete_transfer(&mut t);
    assert_eq!(sim.client.connection(sim.ch).unwrap().close_reason(), None);
    assert_eq!(sim.server_conn().close_reason(), None);
}

/// Finding 1, the other side of it: a peer that is really gone (its host refuses every
/// datagram, nothing comes back) is still reported as gone, once it has been silent for
/// half a second.
#[test]
fn a_vanished_peer_is_still_reported() {
    let mut sim = keyed_sim();
    sim.establish();
    let mut t = Transfer::new(1 << 30, 0, 0, true);
    sim.advance(Duration::from_millis(20), |s| t.pump(s));
    // the server's process is killed: its host refuses every datagram, nothing comes back
    let killed = sim.now();
    let mut now = sim.instant();
    while sim.client.connection(sim.ch).unwrap().state() != ConnectionState::Closed {
        sim.client.handle_timeout(now);
        for (tx, d) in drain(&mut sim.client, now) {
            sim.client
                .handle_port_unreachable(now, tx.local, tx.remote, &d[..24.min(d.len())]);
        }
        now += Duration::from_millis(1);
        assert!(
            now - sim.base() - killed < Duration::from_secs(2),
            "the vanished peer was not noticed"
        );
    }
    let took = now - sim.base() - killed;
    assert_eq!(
        sim.client.connection(sim.ch).unwrap().close_reason(),
        Some(&ConnectionError::PeerGone)
    );
    // 500 ms of silence are required (PEER_GONE_SILENCE)
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(600),
        "{took:?}"
    );
}

/// Finding 2. The attacker reads the server's connection ID off a link, sends the client a
/// short packet for that ID from its own address and gets back the client's RESET with a
/// valid token; replayed to the client from the server's address, that RESET must not end
/// the connection: a token names the two addresses it travels between.
#[test]
fn a_reset_provoked_from_the_victim_does_not_end_its_connection() {
    let mut sim = keyed_sim();
    sim.establish();
    let mut t = Transfer::new(4 << 20, 4 << 20, 0, true);
    sim.advance(Duration::from_millis(20), |s| t.pump(s));
    let server_cid = sim.server_cid().unwrap();
    let (client, server) = (sim.client_addrs()[0], sim.server_addrs()[0]);
    let attacker = addr("10.0.0.66:4444");
    let mut provoke = vec![0u8; 64];
    let mut w = Writer::new(&mut provoke);
    wire::write_short_header(&mut w, server_cid, LinkId(0), 1, 0);
    let now = sim.instant();
    sim.client
        .handle_datagram(now, client, attacker, &mut provoke);
    let reset = drain(&mut sim.client, now)
        .into_iter()
        .find(|(tx, d)| tx.remote == attacker && packet_type_of(d) == packet_type::RESET)
        .map(|(_, d)| d)
        .expect("the client answers the attacker with a RESET");
    assert_eq!(reset.len(), 26, "a RESET with a token");
    sim.inject_client(client, server, &reset);
    assert!(sim.client.dropped().get(DropReason::Unauthenticated) >= 1);
    assert_eq!(sim.client.connection(sim.ch).unwrap().close_reason(), None);
    sim.complete_transfer(&mut t);
    assert_eq!(sim.client.connection(sim.ch).unwrap().close_reason(), None);
}

/// Finding 3. The attacker replays a real INITIAL of another client of the cluster, spoofed
/// from this client's address and with a cookie it read off the path: the server must not
/// take it for a restart of the client (its instance differs), so the connection lives on.
#[test]
fn a_replayed_initial_does_not_end_an_established_connection() {
    let mut sim = keyed_sim();
    sim.establish();
    let mut t = Transfer::new(4 << 20, 4 << 20, 10, true);
    sim.advance(Duration::from_millis(20), |s| t.pump(s));
    let (client, server) = (sim.client_addrs()[0], sim.server_addrs()[0]);
    let now = sim.instant();
    let (scid, mode, hello) = captured_initial(&mut sim.server, now, server);
    let before = sim.server.connection_count();
    let cookie = cookie_for(&mut sim.server, now, server, client, scid);
    let mut d = initial(scid, &cookie, mode, &hello);
    sim.server.handle_datagram(now, server, client, &mut d);
    let answers = drain(&mut sim.server, now);
    assert!(
        answers
            .iter()
            .all(|(_, d)| packet_type_of(d) != packet_type::ACCEPT),
        "the replay was accepted"
    );
    sim.advance(Duration::from_millis(50), |s| t.pump(s));
    assert_eq!(
        sim.server_conn().close_reason(),
        None,
        "the replay ended the connection"
    );
    assert_eq!(sim.server.connection_count(), before);
    sim.complete_transfer(&mut t);
    assert_eq!(sim.server_conn().close_reason(), None);
}

/// Finding 4. Before the real client comes, the attacker replays a captured INITIAL from its
/// own address (it gets its own cookie): the server must not hand the application a
/// connection for it. The first connection `accept` returns is the real client's.
#[test]
fn a_replayed_initial_is_never_accepted() {
    let mut sim = keyed_sim();
    let server = sim.server_addrs()[0];
    let now = sim.instant();
    let (scid, mode, hello) = captured_initial(&mut sim.server, now, server);
    let attacker = addr("10.0.0.66:4444");
    let cookie = cookie_for(&mut sim.server, now, server, attacker, scid);
    for _ in 0..2 {
        let mut d = initial(scid, &cookie, mode, &hello);
        sim.server.handle_datagram(now, server, attacker, &mut d);
        drain(&mut sim.server, now);
    }
    assert_eq!(sim.server.connection_count(), 0, "state kept for a replay");
    assert!(sim.server.accept().is_none(), "a replay reached accept");
    sim.establish();
    let sh = sim.sh.unwrap();
    assert_eq!(
        sim.server.connection(sh).unwrap().stats().links[0].remote,
        sim.client_addrs()[0]
    );
    let mut t = Transfer::new(1 << 20, 1 << 20, 0, true);
    sim.complete_transfer(&mut t);
}

/// Finding 5. Rounds of replayed INITIALs from fresh ports leave the server holding nothing;
/// a real client whose handshake is never confirmed (its short packets lost) is held, never
/// reaches `accept`, and is forgotten by the endpoint itself when it expires; and connections
/// nobody releases count against the server's limit, so they cannot grow without end.
#[test]
fn unconfirmed_and_unreleased_connections_are_bounded_and_freed() {
    let mut sim = keyed_sim();
    let server = sim.server_addrs()[0];
    let now = sim.instant();
    let (scid, mode, hello) = captured_initial(&mut sim.server, now, server);
    // one a millisecond: within the server's budget of handshake messages, so each is read
    for port in 0..2000u16 {
        let at = now + Duration::from_millis(u64::from(port));
        let from = SocketAddr::new(addr("10.0.0.66:1").ip(), 10_000 + port);
        let cookie = cookie_for(&mut sim.server, at, server, from, scid);
        let mut d = initial(scid, &cookie, mode, &hello);
        sim.server.handle_datagram(at, server, from, &mut d);
        drain(&mut sim.server, at);
    }
    assert_eq!(sim.server.connection_count(), 0, "state kept for replays");
    assert_eq!(sim.server.dropped().get(DropReason::KeyMismatch), 2000);

    // a real handshake whose confirmation never arrives
    let now = now + Duration::from_secs(3);
    let other = addr("10.6.0.1:7000");
    let mut cfg = EndpointConfig::new(vec![other]);
    cfg.key = Some(key());
    let mut client = Endpoint::new(cfg, 78, now);
    client.connect(now, &[server], Default::default()).unwrap();
    exchange(&mut client, &mut sim.server, now, false);
    assert_eq!(client.connection_handles().count(), 1);
    assert_eq!(
        sim.server.connection_count(),
        1,
        "the unconfirmed connection is held"
    );
    assert!(
        sim.server.accept().is_none(),
        "an unconfirmed connection reached accept"
    );
    let later = now + Duration::from_secs(11);
    sim.server.handle_timeout(later);
    assert_eq!(
        sim.server.connection_count(),
        0,
        "the expired connection was not freed"
    );
    assert!(
        sim.server.poll_event().is_none(),
        "events of a connection nobody knows"
    );

    // a server that holds at most two connections: two clients that end and are never
    // released by the application still count, so a third is refused
    let mut cfg = EndpointConfig::new(vec![server]).server();
    cfg.max_connections = 2;
    let mut small = Endpoint::new(cfg, 5, now);
    let mut refused = 0;
    for i in 0..3u8 {
        let mut c = Endpoint::new(
            EndpointConfig::new(vec![SocketAddr::new(other.ip(), 8000 + u16::from(i))]),
            90 + u64::from(i),
            now,
        );
        let ch = c.connect(now, &[server], Default::default()).unwrap();
        exchange(&mut c, &mut small, now, true);
        let conn = c.connection(ch).unwrap();
        if conn.close_reason() == Some(&ConnectionError::ServerFull) {
            refused += 1;
            continue;
        }
        assert_eq!(conn.state(), ConnectionState::Established);
        let sh = small.accept().expect("confirmed and accepted");
        small.connection_mut(sh).unwrap().abort(1, "done");
    }
    assert_eq!(refused, 1, "the third client was not refused");
    assert_eq!(small.connection_count(), 2);
}

/// Finding 6. 4 096 replayed INITIALs from 16 addresses while a transfer runs: the server
/// creates nothing for them (so does no Diffie-Hellman and fills no table), reads most of
/// them not at all (its budget of handshake messages), the transfer's links never go down,
/// and a new real client is served right after.
#[test]
fn a_flood_of_replayed_initials_neither_fills_the_table_nor_stalls_a_transfer() {
    let mut sim = keyed_sim();
    sim.establish();
    let mut t = Transfer::new(16 << 20, 16 << 20, 50, true);
    sim.advance(Duration::from_millis(20), |s| t.pump(s));
    downs(&mut sim.client);
    downs(&mut sim.server);
    let server = sim.server_addrs()[0];
    let now = sim.instant();
    let (scid, mode, hello) = captured_initial(&mut sim.server, now, server);
    let mut cookies: HashMap<SocketAddr, Vec<u8>> = HashMap::new();
    let before = sim.server.connection_count();
    for i in 0..4096u32 {
        let from = SocketAddr::new(format!("10.0.7.{}", i % 16).parse().unwrap(), 20_000);
        let now = sim.instant();
        let cookie = cookies
            .entry(from)
            .or_insert_with(|| cookie_for(&mut sim.server, now, server, from, scid))
            .clone();
        let mut d = initial(scid, &cookie, mode, &hello);
        sim.server.handle_datagram(now, server, from, &mut d);
        if i % 256 == 255 {
            sim.advance(Duration::from_millis(1), |s| t.pump(s));
        }
    }
    assert_eq!(
        sim.server.connection_count(),
        before,
        "replays created connections"
    );
    // most were not even read: handshake messages have a budget of their own
    let (read, unread) = (
        sim.server.dropped().get(DropReason::KeyMismatch),
        sim.server.dropped().get(DropReason::HandshakeBudget),
    );
    assert_eq!(read + unread, 4096);
    assert!(
        unread >= 3500,
        "{unread} of 4096 replays were dropped unread"
    );
    assert!(!t.complete(&sim), "the transfer ended before the flood did");
    sim.complete_transfer(&mut t);
    assert_eq!(
        downs(&mut sim.client) + downs(&mut sim.server),
        0,
        "a link went down"
    );
    // a new client is not refused
    let other = addr("10.6.0.1:7000");
    let mut cfg = EndpointConfig::new(vec![other]);
    cfg.key = Some(key());
    let now = sim.instant();
    let mut client = Endpoint::new(cfg, 79, now);
    let ch = client.connect(now, &[server], Default::default()).unwrap();
    exchange(&mut client, &mut sim.server, now, true);
    assert_eq!(
        client.connection(ch).unwrap().state(),
        ConnectionState::Established
    );
}

/// Finding 7. A RESET (and an ICMP error) finds its connection through an index: 100 000 of
/// them with made-up connection IDs cost about as much at an endpoint holding 4 096
/// connections as at one holding one. Before the index the cost grew with the connections
/// (a scan of them all per RESET), far past the threefold this test allows.
#[test]
fn resets_cost_the_same_whatever_the_connections_held() {
    let cost = |connections: u64| {
        let now = Instant::now();
        let local = addr("10.0.0.1:5000");
        let mut cfg = EndpointConfig::new(vec![local]);
        cfg.key = Some(key());
        let mut ep = Endpoint::new(cfg, 3, now);
        for i in 0..connections {
            let to = SocketAddr::new(addr("10.8.0.1:1").ip(), 1000 + i as u16);
            ep.connect(now, &[to], Default::default()).unwrap();
        }
        let from = addr("10.0.0.2:6000");
        let mut reset = [0u8; 26];
        let mut best = Duration::MAX;
        for round in 0..3u64 {
            let start = Instant::now();
            for i in 0..100_000u64 {
                let h = wire::Header::Reset {
                    dcid: (i ^ round << 40) | 1,
                    token: Some(&[7; 16]),
                };
                wire::encode_control_packet(&h, &mut reset);
                ep.handle_datagram(now, local, from, &mut reset);
                let quote = &reset[..];
                ep.handle_port_unreachable(now, local, from, quote);
            }
            best = best.min(start.elapsed());
        }
        assert_eq!(ep.connection_count(), connections as usize);
        best
    };
    let one = cost(1);
    let many = cost(4096);
    println!("100 000 RESETs and ICMP errors: {one:?} with 1 connection, {many:?} with 4096");
    assert!(
        many < one * 3,
        "{many:?} with 4096 connections against {one:?} with one"
    );
}

/// The RESETs an endpoint sends at most (1000 a second, bursts of 100) are its own, however
/// many engines (shards) it runs: a flood of short packets with made-up connection IDs,
/// which are steered to every shard, draws on one budget. Before, each shard had one, and
/// an endpoint of 16 shards sent up to 16 000 a second.
#[test]
fn the_shards_of_an_endpoint_share_one_reset_budget() {
    let now = Instant::now();
    let local = addr("10.0.0.1:5000");
    let from = addr("10.0.0.2:6000");
    let shared = std::sync::Arc::new(ri2n_proto::ConnectionCounts::default());
    let mut shards: Vec<Endpoint> = (0..2u32)
        .map(|index| {
            let mut cfg = EndpointConfig::new(vec![local]).server();
            cfg.shard = ri2n_proto::Shard { index, count: 2 };
            cfg.connection_counts = Some(shared.clone());
            Endpoint::new(cfg, 7, now)
        })
        .collect();
    let mut resets = [0usize; 2];
    for i in 0..300u64 {
        for (n, shard) in shards.iter_mut().enumerate() {
            let mut short = vec![wire::VERSION, packet_type::SHORT];
            short.extend_from_slice(&(0x5eed_0000 + 2 * i + n as u64).to_be_bytes());
            short.resize(100, 0);
            shard.handle_datagram(now, local, from, &mut short);
            resets[n] += drain(shard, now)
                .iter()
                .filter(|(_, d)| {
                    matches!(wire::decode_packet(d), Ok((wire::Header::Reset { .. }, _)))
                })
                .count();
        }
    }
    // the premise: both shards answered some
    assert!(resets.iter().all(|&r| r > 0), "{resets:?}");
    assert_eq!(
        resets.iter().sum::<usize>(),
        100,
        "RESETs sent by the shards: {resets:?}"
    );
}

/// A keyed client at `client_addr` that has just started (at `now`) to connect to a keyed
/// server at `server_addr`, its first datagrams not delivered yet.
struct Connecting {
    now: Instant,
    client_addr: SocketAddr,
    server_addr: SocketAddr,
    client: Endpoint,
    server: Endpoint,
    /// The client's connection.
    h: ri2n_proto::ConnectionHandle,
    /// What the client sent first (its INITIAL without a cookie).
    first: Vec<(ri2n_proto::Transmit, Vec<u8>)>,
    /// The client's connection ID, in clear in that INITIAL.
    scid: u64,
}

/// An endpoint's configuration on `locals`, with the cluster key.
fn keyed(locals: &[SocketAddr]) -> EndpointConfig {
    let mut cfg = EndpointConfig::new(locals.to_vec());
    cfg.key = Some(key());
    cfg
}

fn keyed_client_connecting() -> Connecting {
    let now = Instant::now();
    let (client_addr, server_addr) = (addr("10.0.0.1:5000"), addr("10.0.0.2:6000"));
    let mut client = Endpoint::new(keyed(&[client_addr]), 1, now);
    let server = Endpoint::new(keyed(&[server_addr]).server(), 2, now);
    let h = client
        .connect(now, &[server_addr], Default::default())
        .unwrap();
    let first = drain(&mut client, now);
    let scid = first
        .iter()
        .find_map(|(_, d)| match wire::decode_packet(d) {
            Ok((wire::Header::Initial { scid, .. }, _)) => Some(scid),
            _ => None,
        })
        .expect("the client's INITIAL");
    Connecting {
        now,
        client_addr,
        server_addr,
        client,
        server,
        h,
        first,
        scid,
    }
}

/// An ACCEPT in clear, forged with the connection ID a keyed client's first INITIAL shows on
/// the path, before the server's RETRY: no ACCEPT can be authentic before the client's Noise
/// message went out, so it is dropped. Before, the client took the parameters in clear and
/// came up without protection, its data then leaving unsealed.
#[test]
fn an_accept_forged_before_the_retry_is_dropped() {
    let mut c = keyed_client_connecting();
    let params = wire::ServerParams {
        scid: 99,
        instance: 1,
        window: 1 << 20,
        cipher: 0,
        accepts: 0,
        addrs: vec![],
    }
    .encode();
    for mode in [
        wire::handshake_mode::NOISE_NNPSK0,
        wire::handshake_mode::PLAIN,
    ] {
        let mut forged = vec![0u8; 1500];
        let accept = wire::Header::Accept {
            dcid: c.scid,
            mode,
            hello: &params,
        };
        let n = wire::encode_control_packet(&accept, &mut forged);
        forged.truncate(n);
        c.client
            .handle_datagram(c.now, c.client_addr, c.server_addr, &mut forged);
        let state = c.client.connection(c.h).unwrap().state();
        assert_eq!(state, ConnectionState::Connecting, "mode {mode}");
    }
    // the real handshake still completes, keyed
    for (t, mut d) in c.first {
        c.server.handle_datagram(c.now, t.remote, t.local, &mut d);
    }
    for (t, mut d) in drain(&mut c.server, c.now) {
        c.client.handle_datagram(c.now, t.remote, t.local, &mut d);
    }
    exchange(&mut c.client, &mut c.server, c.now, true);
    let conn = c.client.connection(c.h).unwrap();
    assert_eq!(conn.state(), ConnectionState::Established);
    assert!(conn.stats().cipher.is_some(), "a keyed connection unsealed");
}

/// An attacker who reads a client's first INITIAL (its connection ID is in clear) sends the
/// server, from the client's address, a SHORT packet with that ID: the server has no such
/// connection and answers with a RESET to the client, with the keyed token of the ID and the
/// two addresses. That RESET does not refuse the client's handshake, which completes; only
/// a refusal's token (§9.6) does, as the server at its limits still shows. Before, the
/// client closed at once with `ServerFull`.
#[test]
fn a_reset_drawn_with_a_client_s_own_id_does_not_refuse_its_handshake() {
    let mut c = keyed_client_connecting();
    // the spoofed SHORT: the client's ID, from the client's address
    let mut short = vec![wire::VERSION, packet_type::SHORT];
    short.extend_from_slice(&c.scid.to_be_bytes());
    short.resize(64, 0);
    c.server
        .handle_datagram(c.now, c.server_addr, c.client_addr, &mut short);
    let resets: Vec<_> = drain(&mut c.server, c.now)
        .into_iter()
        .filter(|(t, d)| {
            t.remote == c.client_addr
                && matches!(wire::decode_packet(d), Ok((wire::Header::Reset { dcid, token: Some(_) }, _)) if dcid == c.scid)
        })
        .collect();
    // the premise: the server answered with a keyed RESET for the client's ID
    assert_eq!(resets.len(), 1, "the server's RESET");
    for (t, mut d) in resets {
        c.client.handle_datagram(c.now, t.remote, t.local, &mut d);
    }
    let conn = c.client.connection(c.h).unwrap();
    assert_eq!(
        conn.state(),
        ConnectionState::Connecting,
        "{:?}",
        conn.close_reason()
    );
    for (t, mut d) in c.first {
        c.server.handle_datagram(c.now, t.remote, t.local, &mut d);
    }
    exchange(&mut c.client, &mut c.server, c.now, true);
    assert_eq!(
        c.client.connection(c.h).unwrap().state(),
        ConnectionState::Established
    );

    // a keyed server at its limit still refuses a keyed client at once
    let mut cfg = keyed(&[addr("10.0.0.3:6000")]).server();
    cfg.max_connections = 1;
    let full_addr = cfg.local_addrs[0];
    let mut full = Endpoint::new(cfg, 3, c.now);
    let mut outcomes = Vec::new();
    for i in 0..2u16 {
        let mut other = Endpoint::new(
            keyed(&[addr(&format!("10.0.0.4:{}", 5000 + i))]),
            10 + u64::from(i),
            c.now,
        );
        let ch = other
            .connect(c.now, &[full_addr], Default::default())
            .unwrap();
        exchange(&mut other, &mut full, c.now, true);
        let conn = other.connection(ch).unwrap();
        outcomes.push((conn.state(), conn.close_reason().cloned()));
    }
    assert_eq!(
        outcomes,
        [
            (ConnectionState::Established, None),
            (ConnectionState::Closed, Some(ConnectionError::ServerFull))
        ]
    );
}

/// An attacker on the path replays the first packet of a link the client opens from an
/// address of its own, ahead of the original: the server's new link is bound to that address
/// at first, and moves to the client's as soon as the client's next, newer packet on it
/// arrives (a link no answer validated yet may move). Both ends' links come up. Before, the
/// link stayed bound to the attacker for good, every real packet on it was dropped, and it
/// never came up.
#[test]
fn a_replay_that_opens_a_link_from_elsewhere_does_not_keep_it() {
    let t0 = Instant::now();
    let (c, s) = (
        [addr("10.0.0.1:5000"), addr("10.1.0.1:5000")],
        [addr("10.0.0.2:6000"), addr("10.1.0.2:6000")],
    );
    let attacker = addr("10.9.9.9:4444");
    let mut client = Endpoint::new(keyed(&c), 11, t0);
    let mut server = Endpoint::new(keyed(&s).server(), 12, t0);
    let ch = client.connect(t0, &[s[0]], Default::default()).unwrap();
    let mut replayed = false;
    for step in 0..400 {
        let now = t0 + Duration::from_millis(5 * step);
        client.handle_timeout(now);
        server.handle_timeout(now);
        for (t, mut d) in drain(&mut client, now) {
            if t.local == c[1] && !replayed && packet_type_of(&d) == packet_type::SHORT {
                let mut copy = d.clone();
                server.handle_datagram(now, t.remote, attacker, &mut copy);
                replayed = true;
            }
            server.handle_datagram(now, t.remote, t.local, &mut d);
        }
        for (t, mut d) in drain(&mut server, now) {
            if t.remote != attacker {
                client.handle_datagram(now, t.remote, t.local, &mut d);
            }
        }
    }
    assert!(replayed, "the premise: the client opened link 1");
    let links = |e: &Endpoint, h| {
        let stats = e.connection(h).unwrap().stats();
        (stats.links.iter())
            .map(|l| (l.remote, l.state))
            .collect::<Vec<_>>()
    };
    let sh = server.accept().expect("accepted");
    assert_eq!(
        links(&client, ch),
        [(s[0], LinkState::Up), (s[1], LinkState::Up)]
    );
    assert_eq!(
        links(&server, sh),
        [(c[0], LinkState::Up), (c[1], LinkState::Up)]
    );
}

/// An unkeyed client's second INITIAL from `from` with client ID `scid`: the cookie of the
/// RETRY that `server` answers its first with, and its parameters.
fn plain_initial_with_cookie(
    server: &mut Endpoint,
    now: Instant,
    server_addr: SocketAddr,
    from: SocketAddr,
    scid: u64,
) -> Vec<u8> {
    let mut d = initial(scid, &[], wire::handshake_mode::PLAIN, &[]);
    server.handle_datagram(now, server_addr, from, &mut d);
    let cookie = drain(server, now)
        .into_iter()
        .find_map(|(_, d)| match wire::decode_packet(&d) {
            Ok((wire::Header::Retry { token, .. }, _)) => Some(token.to_vec()),
            _ => None,
        })
        .expect("a RETRY with a cookie");
    let hello = wire::ClientParams {
        instance: 9,
        window: 1 << 20,
        cipher: 0,
        accepts: 3,
        application: Vec::new(),
    }
    .encode();
    initial(scid, &cookie, wire::handshake_mode::PLAIN, &hello)
}

/// A stranger at an unkeyed server opens connections from many ports, all under one client
/// connection ID, to make each RESET or ICMP error naming that ID cost a walk over all of
/// them. Only a few connections may share an ID; the rest are refused as over a limit.
#[test]
fn few_connections_may_share_a_client_connection_id() {
    let now = Instant::now();
    let server_addr = addr("10.0.0.2:6000");
    let mut server = Endpoint::new(EndpointConfig::new(vec![server_addr]).server(), 2, now);
    let scid = 0x5eed_5eed_5eed_5eed;
    let mut refused = 0;
    for port in 0..20u16 {
        let from = SocketAddr::new(addr("10.9.0.1:1").ip(), 1000 + port);
        let mut d = plain_initial_with_cookie(&mut server, now, server_addr, from, scid);
        let before = server.dropped().get(DropReason::ConnectionLimit);
        server.handle_datagram(now, server_addr, from, &mut d);
        refused += server.dropped().get(DropReason::ConnectionLimit) - before;
        let _ = drain(&mut server, now);
    }
    assert_eq!(server.connection_count(), 4);
    assert_eq!(refused, 16);
}

/// A shard keeps a RESET (or an ICMP error) for its own engine only if that engine has a
/// connection by the quoted ID with the sender. By the ID alone, a stranger who opened a
/// connection under a victim client's ID on one shard had that shard keep the RESET the
/// victim's restarted client sent for its connection on another (its engine then found no
/// match and dropped it, and the next shard was never asked).
#[test]
fn a_shard_is_asked_about_a_reset_only_for_a_connection_with_its_sender() {
    let now = Instant::now();
    let server_addr = addr("10.0.0.2:6000");
    let mut server = Endpoint::new(EndpointConfig::new(vec![server_addr]).server(), 2, now);
    let victims_id = 0x7e57_0001_7e57_0001;
    let (stranger, victim) = (addr("10.9.0.1:1000"), addr("10.8.0.1:5000"));
    let mut d = plain_initial_with_cookie(&mut server, now, server_addr, stranger, victims_id);
    server.handle_datagram(now, server_addr, stranger, &mut d);
    assert_eq!(
        server.connection_count(),
        1,
        "the stranger's connection was made"
    );
    assert!(server.has_connection_with(victims_id, stranger));
    assert!(
        !server.has_connection_with(victims_id, victim),
        "the victim's RESET would stay on the stranger's shard"
    );
}

/// Connections count against the per-address limit under the address of their handshake only.
/// Counted under every address their links lead to, the links a peer opens from another
/// address (a client of two addresses; or a stranger's, from a victim's spoofed one) took
/// that address's share, and a host there was refused as if it held connections.
#[test]
fn links_from_another_address_do_not_count_against_its_limit() {
    let mut now = Instant::now();
    let (a, v) = (addr("10.0.0.1:5000"), addr("10.1.0.1:5000"));
    let servers = [addr("10.0.0.2:6000"), addr("10.1.0.2:6000")];
    let mut cfg = EndpointConfig::new(servers.to_vec()).server();
    cfg.max_connections_per_address = 1;
    let mut server = Endpoint::new(cfg, 2, now);
    let mut two = Endpoint::new(EndpointConfig::new(vec![a, v]), 1, now);
    let other_addr = [addr("10.1.0.1:5001")];
    let mut other = Endpoint::new(EndpointConfig::new(other_addr.to_vec()), 3, now);
    let ch = two.connect(now, &servers, Default::default()).unwrap();
    type Client<'a> = (&'a mut Endpoint, &'a [SocketAddr]);
    let exchange = |now: Instant, server: &mut Endpoint, clients: &mut [Client]| {
        for (c, _) in clients.iter_mut() {
            c.handle_timeout(now);
            for (t, mut d) in drain(c, now) {
                server.handle_datagram(now, t.remote, t.local, &mut d);
            }
        }
        server.handle_timeout(now);
        while server.accept().is_some() {}
        for (t, d) in drain(server, now) {
            for (c, addrs) in clients.iter_mut() {
                if addrs.contains(&t.remote) {
                    c.handle_datagram(now, t.remote, t.local, &mut d.clone());
                }
            }
        }
    };
    for _ in 0..500 {
        now += Duration::from_millis(1);
        exchange(now, &mut server, &mut [(&mut two, &[a, v])]);
    }
    let links = two.connection(ch).unwrap().stats().links;
    assert!(
        links.len() == 2 && links.iter().all(|l| l.state == LinkState::Up),
        "the premise: a link from each address {links:?}"
    );
    let oh = other
        .connect(now, &servers[1..], Default::default())
        .unwrap();
    for _ in 0..100 {
        now += Duration::from_millis(1);
        exchange(
            now,
            &mut server,
            &mut [(&mut two, &[a, v]), (&mut other, &other_addr)],
        );
    }
    let c = other.connection(oh).unwrap();
    assert_eq!(
        c.state(),
        ConnectionState::Established,
        "{:?}",
        c.close_reason()
    );
    assert_eq!(server.connection_count(), 2);
}

/// A keyed client and server, each on two addresses (`c`, `s`), and another host of the
/// cluster at `m` (it holds the key, and is not part of their connection).
struct KeyHolders {
    c: [SocketAddr; 2],
    s: [SocketAddr; 2],
    m: SocketAddr,
    other: Endpoint,
    client: Endpoint,
    server: Endpoint,
}

impl KeyHolders {
    fn new(t0: Instant) -> Self {
        let c = [addr("10.0.0.1:5000"), addr("10.1.0.1:5000")];
        let s = [addr("10.0.0.2:6000"), addr("10.1.0.2:6000")];
        let m = addr("10.7.7.7:6000");
        Self {
            c,
            s,
            m,
            other: Endpoint::new(keyed(&[m]), 13, t0),
            client: Endpoint::new(keyed(&c), 11, t0),
            server: Endpoint::new(keyed(&s).server(), 12, t0),
        }
    }
}

/// An attacker on the path replays the client's first packet on its second link from the
/// address M of another host of the cluster (which holds the key too), ahead of the
/// original: the server's link, which no answer has validated yet, moves to M (§4.4). The
/// attacker then draws a RESET from M (a short packet for the client's connection ID,
/// spoofed from the server) and passes it on: its token is good for M and the server. The
/// server's connection must not end: M never showed that it answers for the peer. Before,
/// it counted as heard from, and the RESET ended a confirmed keyed connection with
/// `PeerRestarted` while the client stayed established (§11 allows an attacker on the path
/// to drop or delay, not to end).
#[test]
fn a_reset_from_another_key_holder_at_a_replayed_link_s_address_does_not_end_it() {
    let t0 = Instant::now();
    let KeyHolders {
        c,
        s,
        m,
        mut other,
        mut client,
        mut server,
    } = KeyHolders::new(t0);
    let ch = client.connect(t0, &[s[0]], Default::default()).unwrap();
    let mut client_cid = None;
    let mut attacked = false;
    for step in 0..400 {
        let now = t0 + Duration::from_millis(5 * step);
        client.handle_timeout(now);
        server.handle_timeout(now);
        let mut out = drain(&mut client, now);
        // deliver link 0 first (the server is confirmed), link 1 after
        out.sort_by_key(|(t, _)| t.local == c[1]);
        for (t, mut d) in out {
            if let Ok((wire::Header::Initial { scid, .. }, _)) = wire::decode_packet(&d) {
                client_cid = Some(scid); // in clear on the path
            }
            if t.local == c[1] && !attacked && packet_type_of(&d) == packet_type::SHORT {
                attacked = true;
                // 1. the replay of the client's first packet on link 1, from M, ahead of it
                let mut copy = d.clone();
                server.handle_datagram(now, t.remote, m, &mut copy);
                // 2. a SHORT for the client's CID to M, spoofed from the server's s[1]: M
                //    does not know that CID and answers with a RESET (token for M -> s[1])
                let cid = client_cid.expect("read off the INITIAL");
                let mut provoke = vec![0u8; 64];
                let mut w = Writer::new(&mut provoke);
                wire::write_short_header(&mut w, cid, LinkId(0), 1, 0);
                other.handle_datagram(now, m, t.remote, &mut provoke);
                let reset = drain(&mut other, now)
                    .into_iter()
                    .find(|(tx, d)| {
                        tx.remote == t.remote && packet_type_of(d) == packet_type::RESET
                    })
                    .map(|(_, d)| d)
                    .expect("M answers with a RESET");
                assert_eq!(reset.len(), 26, "with a token");
                // 3. that RESET reaches the server from M (sent there by M itself)
                let mut r = reset.clone();
                server.handle_datagram(now, t.remote, m, &mut r);
            }
            server.handle_datagram(now, t.remote, t.local, &mut d);
        }
        for (t, mut d) in drain(&mut server, now) {
            if t.remote != m {
                client.handle_datagram(now, t.remote, t.local, &mut d);
            }
        }
    }
    assert!(attacked, "the premise: the client opened link 1");
    assert_server_connection_stands(&mut server, &client, ch);
}

/// The same with one spoofed datagram only: the client was given both server addresses,
/// so the server probes the link's new address M at once, and the endpoint at M, which
/// does not know the connection, answers with a RESET of its own (§2.7). That RESET must not
/// end the connection either.
#[test]
fn a_replayed_link_packet_does_not_make_another_key_holder_reset_the_connection() {
    let t0 = Instant::now();
    let KeyHolders {
        c,
        s,
        m,
        mut other,
        mut client,
        mut server,
    } = KeyHolders::new(t0);
    let ch = client
        .connect(t0, &[s[0], s[1]], Default::default())
        .unwrap();
    let mut attacked = false;
    for step in 0..400 {
        let now = t0 + Duration::from_millis(5 * step);
        client.handle_timeout(now);
        server.handle_timeout(now);
        other.handle_timeout(now);
        let mut out = drain(&mut client, now);
        out.sort_by_key(|(t, _)| t.local == c[1]);
        for (t, mut d) in out {
            if t.local == c[1] && !attacked && packet_type_of(&d) == packet_type::SHORT {
                attacked = true;
                let mut copy = d.clone();
                server.handle_datagram(now, t.remote, m, &mut copy);
            }
            server.handle_datagram(now, t.remote, t.local, &mut d);
        }
        for (t, mut d) in drain(&mut server, now) {
            if t.remote == m {
                other.handle_datagram(now, t.remote, t.local, &mut d);
            } else {
                client.handle_datagram(now, t.remote, t.local, &mut d);
            }
        }
        for (t, mut d) in drain(&mut other, now) {
            if s.contains(&t.remote) {
                server.handle_datagram(now, t.remote, t.local, &mut d);
            }
        }
    }
    assert!(attacked, "the premise: the client opened link 1");
    assert_server_connection_stands(&mut server, &client, ch);
}

/// The server's connection from `client` (handle `ch` there) is still established, with no
/// error: the attack of the test calling this did not end it.
fn assert_server_connection_stands(
    server: &mut Endpoint,
    client: &Endpoint,
    ch: ri2n_proto::ConnectionHandle,
) {
    let sh = server
        .accept()
        .expect("the client's connection was accepted");
    let conn = server.connection(sh).unwrap();
    assert_eq!(
        (conn.state(), conn.close_reason()),
        (ConnectionState::Established, None),
        "an attacker without the key ended the server's keyed connection (client side: {:?})",
        client.connection(ch).map(|c| c.state()),
    );
}
