//! Two endpoints joined by ideal links of the simulator's network model (fixed delay, no loss,
//! no rate limit), stepped by hand: the smallest end-to-end checks of the engine.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ri2n_proto::wire::{self, frame_type, Header, Writer};
use ri2n_proto::{
    Connection, ConnectionConfig, ConnectionError, ConnectionHandle, ConnectionState, Endpoint,
    EndpointConfig, Event, LinkState, ReadError,
};
use ri2n_sim::testbed::{drain, Capture, Testbed, TestbedConfig, Transfer, DEFAULT_DELAY};
use ri2n_sim::{Action, Dir, DirectionConfig, HostId, LinkConfig, LinkStatus};

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Runs the pair until `step` returns true (handed the client, the server and the server's
/// connection once accepted), panicking at the simulated deadline; returns the server's handle.
fn run(
    tb: &mut Testbed,
    limit: Duration,
    mut step: impl FnMut(&mut Endpoint, &mut Endpoint, &mut Option<ConnectionHandle>) -> bool,
) -> Option<ConnectionHandle> {
    tb.run_until(limit, |tb| {
        let mut accepted = tb.sh;
        step(&mut tb.client, &mut tb.server, &mut accepted)
    });
    tb.sh
}

/// Runs a fresh pair until the server accepted the connection and the client has two links
/// up; returns the server's handle.
fn until_two_links_up(tb: &mut Testbed) -> ConnectionHandle {
    let ch = tb.ch;
    run(tb, Duration::from_secs(5), |c, _, acc| {
        let links = c.connection(ch).unwrap().stats().links;
        acc.is_some() && links.len() == 2 && links.iter().all(|l| l.state == LinkState::Up)
    })
    .expect("the server accepted")
}

/// Every path in direction `dir` dead (its switches drop what they carry), or alive again.
fn cut(tb: &mut Testbed, dir: Dir, dead: bool) {
    let status = if dead {
        LinkStatus::Blackhole
    } else {
        LinkStatus::Up
    };
    for link in 0..tb.network().len() {
        tb.apply(Action::SetStatus {
            link,
            dir: Some(dir),
            status,
        });
    }
}

/// A client on `a` and a server on `b` (link `i` joins `a[i]` and `b[i]`) joined by ideal
/// links of 0.5 ms; the client has started connecting to `b[0]`.
fn connected_pair(a: &[SocketAddr], b: &[SocketAddr]) -> Testbed {
    connected_pair_with(a, b, ConnectionConfig::default())
}

/// [`connected_pair`] with `config` for the connection on both sides.
fn connected_pair_with(a: &[SocketAddr], b: &[SocketAddr], config: ConnectionConfig) -> Testbed {
    Testbed::new(pair_config(a, b, config))
}

/// The configuration of [`connected_pair_with`].
fn pair_config(a: &[SocketAddr], b: &[SocketAddr], config: ConnectionConfig) -> TestbedConfig {
    assert_eq!(a.len(), b.len(), "one address of each side per link");
    TestbedConfig::new(a.len())
        .with_addrs(a.iter().copied().zip(b.iter().copied()).collect())
        .with_connection(config)
}

fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

/// Writes bytes `*sent..total` of the stream (byte `i` is `byte(i)`) as far as `conn` takes them.
fn write_pattern(conn: &mut Connection, sent: &mut u64, total: u64, byte: impl Fn(u64) -> u8) {
    while *sent < total {
        let chunk: Vec<u8> = (*sent..(*sent + 16384).min(total)).map(&byte).collect();
        match conn.write(&chunk) {
            Ok(n) => *sent += n as u64,
            Err(_) => break,
        }
    }
}

#[test]
fn bytes_and_messages_cross_two_links_both_ways() {
    let b = vec![addr("10.0.0.2:6000"), addr("10.1.0.2:6000")];
    let mut tb = connected_pair(&[addr("10.0.0.1:5000"), addr("10.1.0.1:5000")], &b);
    let ch = tb.ch;
    const TOTAL: u64 = 3_000_000;
    let (mut sent_c, mut sent_s, mut got_c, mut got_s) = (0u64, 0u64, 0u64, 0u64);
    let mut msgs_got = 0;
    let mut buf = vec![0u8; 65536];
    let mut finished = false;
    let server_handle = run(&mut tb, Duration::from_secs(30), |c, s, acc| {
        let cc = c.connection_mut(ch).unwrap();
        write_pattern(cc, &mut sent_c, TOTAL, pattern);
        if sent_c == TOTAL && !finished && cc.state() == ConnectionState::Established {
            for k in 0..10u8 {
                cc.send_message(&vec![k; 1000 * k as usize + 1]).unwrap();
            }
            cc.finish();
            finished = true;
        }
        loop {
            match cc.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    for (i, &x) in buf[..n].iter().enumerate() {
                        assert_eq!(
                            x,
                            pattern(got_c + i as u64) ^ 0xff,
                            "client byte {}",
                            got_c + i as u64
                        );
                    }
                    got_c += n as u64;
                }
                Err(ReadError::Blocked) => break,
                Err(e) => panic!("client read: {e}"),
            }
        }
        let Some(h) = *acc else { return false };
        let sc = s.connection_mut(h).unwrap();
        write_pattern(sc, &mut sent_s, TOTAL / 2, |i| pattern(i) ^ 0xff);
        if sent_s == TOTAL / 2 {
            sc.finish();
        }
        loop {
            match sc.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    for (i, &x) in buf[..n].iter().enumerate() {
                        assert_eq!(
                            x,
                            pattern(got_s + i as u64),
                            "server byte {}",
                            got_s + i as u64
                        );
                    }
                    got_s += n as u64;
                }
                Err(ReadError::Blocked) => break,
                Err(e) => panic!("server read: {e}"),
            }
        }
        while let Ok(Some(m)) = sc.recv_message() {
            assert_eq!(m, vec![msgs_got as u8; 1000 * msgs_got + 1]);
            msgs_got += 1;
        }
        // (and the discovered link is up on both sides: its first probes are small, so
        // it may come up after a short transfer is done)
        let up = |ep: &Endpoint, h| {
            let links = ep.connection(h).unwrap().stats().links;
            links.len() == 2 && links.iter().all(|l| l.state == LinkState::Up)
        };
        got_s == TOTAL
            && got_c == TOTAL / 2
            && msgs_got == 10
            && c.connection(ch).unwrap().is_send_complete()
            && s.connection(h).unwrap().is_send_complete()
            && up(c, ch)
            && up(s, h)
    });
    let stats = tb.client.connection(ch).unwrap().stats();
    assert_eq!(stats.links.len(), 2, "the second link was discovered");
    // delivered-byte counters: the bytes and the ten messages (each with a 1- or 2-byte length)
    let message_bytes: u64 = (0..10u64)
        .map(|k| 1000 * k + 1 + if k == 0 { 1 } else { 2 })
        .sum();
    assert_eq!(stats.bytes_acknowledged, TOTAL + message_bytes);
    assert_eq!(stats.bytes_received, TOTAL / 2);
    let server_stats = tb
        .server
        .connection(server_handle.unwrap())
        .unwrap()
        .stats();
    assert_eq!(server_stats.bytes_received, TOTAL + message_bytes);
    assert_eq!(server_stats.bytes_acknowledged, TOTAL / 2);
    // both paths were heard from just now, and are no longer after the hold
    let now = tb.instant();
    let hold = Duration::from_secs(60);
    assert_eq!(
        tb.client.heard_paths(now, hold),
        vec![
            (addr("10.0.0.1:5000"), addr("10.0.0.2:6000")),
            (addr("10.1.0.1:5000"), addr("10.1.0.2:6000"))
        ]
    );
    assert!(tb.client.heard_paths(now + hold * 2, hold).is_empty());
    let acked_on_links: u64 = stats.links.iter().map(|l| l.stream_bytes_acked).sum();
    let sent_on_links: u64 = stats.links.iter().map(|l| l.stream_bytes_sent).sum();
    assert!(
        (stats.bytes_acknowledged..=sent_on_links).contains(&acked_on_links),
        "links delivered {acked_on_links} of {sent_on_links} sent, {} acknowledged",
        stats.bytes_acknowledged
    );
    for l in &stats.links {
        assert!(
            l.stream_bytes_sent > 100_000,
            "link {} carried data: {l:?}",
            l.id
        );
    }
}

/// A server's first reply is striped over both links. The server's link 0 comes up with the
/// handshake, which times a round trip only for the client: unmeasured, it counted as 100 ms
/// away, so on 2 × 1 Gbit/s the scheduler put the server's data on the other link alone, and
/// nothing measured link 0 until its first keepalive, 200 ms later. (In this network without
/// rate limits the other link's queue soon makes even a link 100 ms away worth using, so the
/// shares alone do not show that; the server's round-trip estimate does.)
#[test]
fn a_servers_first_reply_is_striped_over_both_links() {
    const REPLY: usize = 1 << 18;
    let b = [addr("10.0.0.2:6000"), addr("10.1.0.2:6000")];
    let mut tb = connected_pair(&[addr("10.0.0.1:5000"), addr("10.1.0.1:5000")], &b);
    let ch = tb.ch;
    let both_up = |ep: &Endpoint, h| {
        let links = ep.connection(h).unwrap().stats().links;
        links.len() == 2 && links.iter().all(|l| l.state == LinkState::Up)
    };
    let sh = run(&mut tb, Duration::from_secs(1), |c, s, acc| {
        acc.is_some_and(|h| both_up(c, ch) && both_up(s, h))
    })
    .unwrap();
    let up_at = tb.now();
    let srtt = tb.server.connection(sh).unwrap().stats().links[0].srtt;
    assert!(
        srtt < Duration::from_millis(5),
        "server's link 0: srtt {srtt:?}"
    );
    let reply: Vec<u8> = (0..REPLY as u64).map(pattern).collect();
    tb.server
        .connection_mut(sh)
        .unwrap()
        .send_message(&reply)
        .unwrap();
    let mut got = None;
    run(&mut tb, Duration::from_secs(1), |c, _, _| {
        got = got
            .take()
            .or_else(|| c.connection_mut(ch).unwrap().recv_message().ok()?);
        got.is_some()
    });
    assert!(got == Some(reply), "the reply arrived whole");
    assert!(
        tb.now() - up_at < Duration::from_millis(100),
        "taken within the first keepalive interval: {:?}",
        tb.now() - up_at
    );
    for l in tb.server.connection(sh).unwrap().stats().links {
        assert!(
            l.stream_bytes_sent > REPLY as u64 / 4,
            "server's link {} carried a share of the reply: {l:?}",
            l.id
        );
    }
}

/// A burst (many datagrams in one `poll_transmit_into` call, as the driver builds them) sends
/// exactly what one datagram per call sends: the same bytes on the same paths, striped over
/// two links, over a whole transfer with slow start, pacing and window limits.
#[test]
fn a_burst_sends_what_one_datagram_per_call_sends() {
    const TOTAL: u64 = 4_000_000;
    let a = [addr("10.0.0.1:5000"), addr("10.1.0.1:5000")];
    let b = [addr("10.0.0.2:6000"), addr("10.1.0.2:6000")];
    let base = Instant::now();
    let transfer = |burst: bool| {
        // pairs made with the same configuration and base behave alike
        let cfg = pair_config(&a, &b, ConnectionConfig::default())
            .with_bursts(burst)
            .with_capture(Dir::AToB, Capture::all());
        let mut tb = Testbed::new_at(cfg, base);
        let ch = tb.ch;
        let (mut sent, mut got) = (0u64, 0u64);
        let mut buf = vec![0u8; 65536];
        run(&mut tb, Duration::from_secs(30), |c, s, acc| {
            let cc = c.connection_mut(ch).unwrap();
            write_pattern(cc, &mut sent, TOTAL, pattern);
            let Some(h) = *acc else { return false };
            let sc = s.connection_mut(h).unwrap();
            while let Ok(n) = sc.read(&mut buf) {
                if n == 0 {
                    break;
                }
                assert!(buf[..n]
                    .iter()
                    .enumerate()
                    .all(|(i, &x)| x == pattern(got + i as u64)));
                got += n as u64;
            }
            got == TOTAL
        });
        // striped: each link carried a good share (the link up first takes more while both
        // windows grow in slow start)
        let links = tb.client.connection(ch).unwrap().stats().links;
        assert!(
            links.len() == 2 && links.iter().all(|l| l.stream_bytes_sent > TOTAL / 8),
            "both links carried data: {links:?}"
        );
        let log: Vec<_> = tb
            .captured(Dir::AToB)
            .iter()
            .map(|c| (c.local, c.remote, c.bytes.clone()))
            .collect();
        (log, tb.largest_burst())
    };
    let (one_by_one, largest) = transfer(false);
    assert_eq!(largest, 1);
    let (bursts, largest) = transfer(true);
    assert!(
        largest > 8,
        "bursts were built (at most {largest} datagrams)"
    );
    assert!(one_by_one.len() as u64 > TOTAL / 1500);
    let first_difference = one_by_one.iter().zip(&bursts).position(|(x, y)| x != y);
    assert_eq!(
        first_difference, None,
        "datagram number {first_difference:?} differs"
    );
    assert_eq!(one_by_one.len(), bursts.len());
}

/// A server on another host that also listens on its loopback address announces it; the
/// client must not open a link to it (it would lead back to the client's own host).
#[test]
fn a_remote_peers_loopback_address_is_not_discovered() {
    let b = vec![addr("10.0.0.2:6000"), addr("127.0.0.1:6000")];
    let mut tb = connected_pair(&[addr("10.0.0.1:5000"), addr("127.0.0.1:5000")], &b);
    let ch = tb.ch;
    run(&mut tb, Duration::from_secs(5), |c, _, accepted| {
        accepted.is_some() && c.connection(ch).unwrap().state() == ConnectionState::Established
    });
    let links = tb.client.connection(ch).unwrap().stats().links;
    assert_eq!(links.len(), 1, "only the handshake's link: {links:?}");
    assert_eq!(links[0].remote, b[0]);
}

/// A server on IPv6 link-local addresses announces them without their interfaces (the
/// handshake carries none). The client must see an address it already reaches as that
/// address, not open a second link to a copy no interface routes (it never came up, and
/// `send` warned of it), and each link must leave from the interface of its remote: with
/// two interfaces, eth1's address shares more bits with the address on eth0.
#[test]
fn link_local_addresses_are_reached_on_their_interfaces() {
    let one = ([addr("[fe80::1%2]:5000")], [addr("[fe80::2%2]:6000")]);
    let two = (
        [addr("[fe80::a%2]:5000"), addr("[fe80::2:1%3]:5000")],
        [addr("[fe80::2:5%2]:6000"), addr("[fe80::2:9%3]:6000")],
    );
    for (a, b) in [(&one.0[..], &one.1[..]), (&two.0[..], &two.1[..])] {
        let mut tb = connected_pair(a, b);
        let ch = tb.ch;
        run(&mut tb, Duration::from_secs(5), |c, _, accepted| {
            let links = c.connection(ch).unwrap().stats().links;
            accepted.is_some()
                && links.len() == a.len()
                && links.iter().all(|l| l.state == LinkState::Up)
        });
        // time for any link to addresses the server announced
        tb.advance(Duration::from_millis(500), |_| {});
        let links = tb.client.connection(ch).unwrap().stats().links;
        let pairs: Vec<_> = links.iter().map(|l| (l.local, l.remote, l.state)).collect();
        let expected: Vec<_> = (a.iter().zip(b))
            .map(|(&l, &r)| (l, r, LinkState::Up))
            .collect();
        assert_eq!(pairs, expected, "{links:?}");
    }
}

/// The server finishes its side at once; the client sends 200 kB and finishes. Once the
/// server has received everything, every datagram from it is lost (and stays lost) until it
/// has closed: the client never saw its last acknowledgements and retransmits. Returns the
/// server's handle.
fn server_closes_with_its_acknowledgements_lost(tb: &mut Testbed) -> ConnectionHandle {
    let ch = tb.ch;
    const TOTAL: usize = 200_000;
    // shared by the phases' closures
    let got = std::cell::Cell::new(0);
    let sh = std::cell::Cell::new(None::<ConnectionHandle>);
    let mut written = 0;
    let mut step = |c: &mut Endpoint, s: &mut Endpoint, acc: &mut Option<ConnectionHandle>| {
        let cc = c.connection_mut(ch).unwrap();
        if written < TOTAL {
            written += cc.write(&vec![7u8; TOTAL - written]).unwrap_or(0);
            if written == TOTAL {
                cc.finish();
            }
        }
        if let Some(h) = *acc {
            sh.set(Some(h));
            let sc = s.connection_mut(h).unwrap();
            sc.finish();
            let mut buf = [0u8; 65536];
            while let Ok(n @ 1..) = sc.read(&mut buf) {
                got.set(got.get() + n);
            }
        }
    };
    let limit = Duration::from_secs(30);
    let server_state = |s: &Endpoint| sh.get().map(|h| s.connection(h).unwrap().state());
    run(tb, limit, |c, s, acc| {
        step(c, s, acc);
        got.get() == TOTAL
            && sh
                .get()
                .is_some_and(|h| s.connection(h).unwrap().is_send_complete())
    });
    cut(tb, Dir::BToA, true);
    // both sides have done their part: the server closes on its own
    run(tb, limit, |_, s, _| {
        server_state(s) == Some(ConnectionState::Closed)
    });
    assert_eq!(got.get(), TOTAL);
    assert!(
        !tb.client.connection(ch).unwrap().is_send_complete(),
        "acknowledgements were lost"
    );
    sh.get().expect("accepted")
}

/// [`server_closes_with_its_acknowledgements_lost`], then the path heals: the closed server's
/// clean-end confirmation (CLOSE code 0 with its acknowledgements) must let the client
/// complete cleanly.
#[test]
fn a_closed_peer_confirms_a_clean_end_whose_acknowledgements_were_lost() {
    let mut tb = connected_pair(&[addr("10.0.0.1:5000")], &[addr("10.0.0.2:6000")]);
    server_closes_with_its_acknowledgements_lost(&mut tb);
    assert_eq!(client_end_after_the_heal(&mut tb), None, "a clean close");
    assert!(tb.client_conn().is_send_complete());
}

/// As above, but the server's application lets go of the connection (a driver does so once a
/// dropped handle's connection is closed) while its answers are still lost, and the path heals
/// two seconds later. The endpoint keeps what it needs to confirm the clean end for its
/// `close_linger` (PROTOCOL.md §8.3), without counting it among the connections it holds.
/// Before, it forgot the connection at once and answered the client's retransmissions with a
/// RESET: the client, whose every byte had arrived, ended with `PeerRestarted`.
#[test]
fn a_released_peer_still_confirms_a_clean_end_whose_acknowledgements_were_lost() {
    let mut tb = connected_pair(&[addr("10.0.0.1:5000")], &[addr("10.0.0.2:6000")]);
    let sh = server_closes_with_its_acknowledgements_lost(&mut tb);
    let now = tb.instant();
    assert!(
        tb.server.release(sh, now),
        "a closed connection is released"
    );
    assert_eq!(tb.server.connection_count(), 0, "no longer held");
    let ch = tb.ch;
    let resent = |tb: &Testbed| tb.client.connection(ch).unwrap().stats().links[0].packets_sent;
    let before = resent(&tb);
    tb.advance(Duration::from_secs(2), |_| {});
    assert!(resent(&tb) > before, "the client went on sending meanwhile");
    assert_eq!(client_end_after_the_heal(&mut tb), None, "a clean close");
    assert!(tb.client_conn().is_send_complete());
}

/// A released connection is kept for its endpoint's `close_linger` (10 s by default) and no
/// longer: then its memory is freed, and a peer still waiting is answered as by an endpoint
/// that restarted.
#[test]
fn a_released_connection_is_forgotten_after_the_close_linger() {
    let mut tb = connected_pair(&[addr("10.0.0.1:5000")], &[addr("10.0.0.2:6000")]);
    let sh = server_closes_with_its_acknowledgements_lost(&mut tb);
    let linger = tb.server.config().close_linger;
    let now = tb.instant();
    assert!(tb.server.release(sh, now));
    tb.advance(linger - Duration::from_millis(100), |_| {});
    assert!(
        tb.server.connection(sh).is_some(),
        "kept through the linger"
    );
    tb.advance(Duration::from_millis(200), |_| {});
    assert!(tb.server.connection(sh).is_none(), "forgotten after it");
    assert_eq!(
        client_end_after_the_heal(&mut tb),
        Some(ConnectionError::PeerRestarted)
    );
}

/// The path towards the client heals: how the client's connection ends.
fn client_end_after_the_heal(tb: &mut Testbed) -> Option<ConnectionError> {
    cut(tb, Dir::BToA, false);
    let ch = tb.ch;
    run(tb, Duration::from_secs(30), |c, _, _| {
        c.connection(ch).unwrap().state() == ConnectionState::Closed
    });
    tb.client_conn().close_reason().cloned()
}

/// Both ends of a clean exchange linger (§8.1) when the client's endpoint closes: its
/// clean-end confirmation (§8.2) goes on the link twice, and the first copy ends the server
/// cleanly. The second reaches a connection closed cleanly, which answers only packets that
/// ask for an acknowledgement: before, it answered that CLOSE with one of its own, the
/// client answered that, and the two went on for as long as both connections were kept.
#[test]
fn two_cleanly_closed_connections_fall_silent() {
    let (a, b) = (addr("10.0.0.1:5000"), addr("10.0.0.2:6000"));
    let cfg = pair_config(&[a], &[b], ConnectionConfig::default())
        .with_capture(Dir::AToB, Capture::all())
        .with_capture(Dir::BToA, Capture::all());
    let mut tb = Testbed::new(cfg);
    let ch = tb.ch;
    let draining = |e: &Endpoint, h| e.connection(h).unwrap().state() == ConnectionState::Draining;
    // nothing is sent but the ends of the streams
    tb.client.connection_mut(ch).unwrap().finish();
    let sh = run(&mut tb, Duration::from_secs(5), |c, s, acc| {
        let Some(sh) = *acc else { return false };
        if !s.connection(sh).unwrap().is_send_complete() {
            s.connection_mut(sh).unwrap().finish();
        }
        draining(c, ch) && draining(s, sh)
    })
    .expect("the server accepted");
    tb.client.connection_mut(ch).unwrap().end_drain();
    let closed_at = tb.now();
    tb.advance(Duration::from_secs(2), |_| {});
    for (e, h) in [(&tb.client, ch), (&tb.server, sh)] {
        let c = e.connection(h).unwrap();
        assert_eq!(
            (c.state(), c.close_reason()),
            (ConnectionState::Closed, None)
        );
    }
    let after = |dir| {
        (tb.captured(dir).iter())
            .filter(|p| p.at >= closed_at)
            .count()
    };
    assert_eq!(
        (after(Dir::AToB), after(Dir::BToA)),
        (2, 0),
        "datagrams from the client and from the server after the client's endpoint closed"
    );
}

/// A send of the server's ACCEPT fails before the client confirms the connection (the driver
/// reports the path unreachable, §6.7): link 0 is Down, and the first event the application
/// gets of it says so, then that it came back. Before, it said Validating → Up while the
/// link was Down, and then Down → Up.
#[test]
fn the_link_state_told_at_confirmation_is_the_links_own() {
    let (a, b) = (addr("10.0.0.1:5000"), addr("10.0.0.2:6000"));
    let mut tb = connected_pair(&[a], &[b]);
    // the server made the connection: the client's confirmation is lost
    tb.run_until(Duration::from_secs(1), |tb| {
        tb.server.connection_count() == 1
    });
    cut(&mut tb, Dir::AToB, true);
    let now = tb.instant();
    tb.server.handle_unreachable(now, b, a);
    tb.advance(Duration::from_millis(20), |_| {});
    assert!(tb.sh.is_none(), "not confirmed yet");
    cut(&mut tb, Dir::AToB, false);
    let sh = run(&mut tb, Duration::from_secs(5), |_, s, acc| {
        acc.is_some_and(|h| s.connection(h).unwrap().link_states()[0] == LinkState::Up)
    })
    .expect("confirmed");
    let mut told = Vec::new();
    while let Some((h, e)) = tb.server.poll_event() {
        if let (true, Event::LinkStateChanged { link, from, to }) = (h == sh, e) {
            assert_eq!(link.0, 0);
            told.push((from, to));
        }
    }
    use LinkState::{Down, Up, Validating};
    assert_eq!(told, [(Validating, Down), (Down, Up)]);
}

/// A second link whose path is dead from the start (both ways) goes down once its probes
/// have failed as a degraded link's would, and says so in an event, while the first carries
/// on; it comes up once the path heals. Before, it stayed `Validating` for as long as the
/// path was dead, which status and logs showed as a link still being checked.
#[test]
fn a_link_dead_from_the_start_goes_down_and_comes_up_at_the_heal() {
    let (a, b) = (
        [addr("10.0.0.1:5000"), addr("10.0.1.1:5000")],
        [addr("10.0.0.2:6000"), addr("10.0.1.2:6000")],
    );
    let mut tb = connected_pair(&a, &b);
    let second_path = |tb: &mut Testbed, status| {
        tb.apply(Action::SetStatus {
            link: 1,
            dir: None,
            status,
        })
    };
    second_path(&mut tb, LinkStatus::Blackhole);
    tb.establish();
    let ch = tb.ch;
    let states = |tb: &Testbed| -> Vec<LinkState> {
        let links = tb.client.connection(ch).unwrap().stats().links;
        links.iter().map(|l| l.state).collect()
    };
    let until = tb.now() + Duration::from_secs(3);
    tb.run_until(until, |tb| states(tb).get(1) == Some(&LinkState::Down));
    let down_at = tb.now();
    assert_eq!(states(&tb)[0], LinkState::Up, "the first link carries on");
    // the heal, after a while
    tb.advance(Duration::from_secs(2), |_| {});
    assert_eq!(states(&tb), [LinkState::Up, LinkState::Down], "still down");
    second_path(&mut tb, LinkStatus::Up);
    let until = tb.now() + Duration::from_secs(3);
    tb.run_until(until, |tb| states(tb)[1] == LinkState::Up);
    let mut told = Vec::new();
    while let Some((h, e)) = tb.client.poll_event() {
        if let (true, Event::LinkStateChanged { link, from, to }) = (h == ch, e) {
            if link.0 == 1 {
                told.push((from, to));
            }
        }
    }
    use LinkState::{Down, Up, Validating};
    assert_eq!(told, [(Validating, Down), (Down, Up)]);
    assert!(
        down_at < Duration::from_secs(2),
        "down only {down_at:?} after the start"
    );
}

/// The client ends the connection on a deadline of its own (every link down for 300 ms; the
/// server has none; its CLOSEs are lost) and lets go of it; the path comes back. The server,
/// probing its link, is told by a RESET (§2.7) at its next probe and ends too. Unkeyed, most
/// of its probes were 13 or 14 bytes, below the 16 that a RESET needs as a trigger: only a
/// full-size one was answered.
#[test]
fn a_peer_that_ended_on_a_deadline_of_its_own_is_found_gone() {
    let (a, b) = (addr("10.0.0.1:5000"), addr("10.0.0.2:6000"));
    let client =
        ConnectionConfig::default().with_all_links_down_timeout(Some(Duration::from_millis(300)));
    let cfg = pair_config(&[a], &[b], client).with_server_connection(ConnectionConfig::default());
    let mut tb = Testbed::new(cfg);
    tb.establish();
    let (ch, sh) = (tb.ch, tb.sh.expect("established"));
    cut(&mut tb, Dir::AToB, true);
    cut(&mut tb, Dir::BToA, true);
    run(&mut tb, Duration::from_secs(5), |c, _, _| {
        c.connection(ch).unwrap().state() == ConnectionState::Closed
    });
    let client_end = tb.client.connection(ch).unwrap().close_reason().cloned();
    assert_eq!(client_end, Some(ConnectionError::AllLinksDown));
    // once its CLOSEs have left (and were lost)
    let limit = tb.now() + Duration::from_secs(1);
    tb.run_until(limit, |tb| {
        let now = tb.instant();
        tb.client.release(ch, now)
    });
    cut(&mut tb, Dir::AToB, false);
    cut(&mut tb, Dir::BToA, false);
    let released_at = tb.now();
    let server_state = |tb: &Testbed| tb.server.connection(sh).unwrap().state();
    assert_eq!(
        server_state(&tb),
        ConnectionState::Established,
        "the premise"
    );
    let limit = released_at + Duration::from_secs(10);
    tb.run_until(limit, |tb| server_state(tb) == ConnectionState::Closed);
    let server_end = tb.server.connection(sh).unwrap().close_reason().cloned();
    assert_eq!(server_end, Some(ConnectionError::PeerRestarted));
    let took = tb.now() - released_at;
    // at its first probe after the heal; before, only a full-size probe was large enough,
    // and the next came far later
    assert!(
        took < Duration::from_millis(100),
        "found gone {took:?} after the release"
    );
}

/// An abort's CLOSE goes on every link, and once more a few milliseconds later: copies that
/// met full queues (here every path towards the server drops what it carries while the first
/// round goes) do not keep the peer from learning why (PROTOCOL.md §8.3). Before, the server
/// never heard of it and went on waiting for its client.
#[test]
fn an_abort_whose_first_close_was_lost_still_reaches_the_peer() {
    let mut tb = connected_pair(
        &[addr("10.0.0.1:5000"), addr("10.0.1.1:5000")],
        &[addr("10.0.0.2:6000"), addr("10.0.1.2:6000")],
    );
    let (ch, sh) = (tb.ch, until_two_links_up(&mut tb));
    cut(&mut tb, Dir::AToB, true);
    tb.client
        .connection_mut(ch)
        .unwrap()
        .abort(7, "stopped by its user");
    tb.advance(Duration::from_millis(2), |_| {});
    // the premise: the first round is lost, and the server still takes the connection as open
    let server_state = |tb: &Testbed| tb.server.connection(sh).unwrap().state();
    assert_eq!(server_state(&tb), ConnectionState::Established);
    assert!(
        tb.client.closes_pending(),
        "the second round is still to go"
    );
    cut(&mut tb, Dir::AToB, false);
    let limit = tb.now() + Duration::from_millis(200);
    tb.run_until(limit, |tb| server_state(tb) == ConnectionState::Closed);
    assert_eq!(
        tb.server.connection(sh).unwrap().close_reason(),
        Some(&ConnectionError::PeerAborted {
            code: 7,
            reason: "stopped by its user".into()
        })
    );
    assert!(!tb.client.closes_pending(), "nothing more to send");
}

/// While the client's data is still in flight, a CLOSE of code 0 arrives that acknowledges
/// nothing (a broken or hostile peer), and the server falls silent: the client must not take
/// it for a clean end.
#[test]
fn a_clean_close_without_acknowledgements_is_not_a_success() {
    let b = vec![addr("10.0.0.2:6000")];
    let mut tb = connected_pair(&[addr("10.0.0.1:5000")], &b);
    let ch = tb.ch;
    const TOTAL: usize = 1_000_000;
    let mut written = 0;
    run(&mut tb, Duration::from_secs(30), |c, _, acc| {
        let cc = c.connection_mut(ch).unwrap();
        if written < TOTAL {
            written += cc.write(&vec![7u8; TOTAL - written]).unwrap_or(0);
            if written == TOTAL {
                cc.finish();
            }
        }
        acc.is_some() && written == TOTAL && cc.stats().links[0].packets_received > 3
    });
    assert!(!tb.client.connection(ch).unwrap().is_send_complete());
    // a CLOSE 0 on the server's link, numbered past what the server used
    let last = tb
        .last_captured(Dir::BToA)
        .cloned()
        .expect("the server sent packets");
    let Ok((Header::Short { dcid, link, pn, .. }, _)) = wire::decode_packet(&last.bytes) else {
        panic!("a short packet from the server")
    };
    let mut d = [0u8; 64];
    let mut w = Writer::new(&mut d);
    wire::write_short_header(&mut w, dcid, link, pn + 100, 0);
    w.u8(frame_type::CLOSE);
    w.varint(0);
    w.varint(0);
    let len = w.finish();
    let now = tb.instant();
    tb.client
        .handle_datagram(now, last.local, last.remote, &mut d[..len]);
    // the real server is silent from now on: nothing ever proves the claim
    cut(&mut tb, Dir::BToA, true);
    let forged_at = tb.now();
    run(&mut tb, Duration::from_secs(30), |c, _, _| {
        c.connection(ch).unwrap().state() == ConnectionState::Closed
    });
    let c = tb.client.connection(ch).unwrap();
    assert_eq!(c.close_reason(), Some(&ConnectionError::ClosedEarly));
    assert!(
        tb.now() - forged_at < Duration::from_secs(1),
        "ended within the grace period"
    );
}

/// After a small message has been read, a message of the largest size the sender accepts
/// still arrives: the receiver advertises the window it needs for a whole message at once
/// (before, the sender waited forever for credit the receiver granted only after a quarter of
/// the window had been read, which it never read before the whole message was there).
#[test]
fn messages_of_the_largest_size_arrive_after_small_ones() {
    let b = vec![addr("10.0.0.2:6000")];
    let mut tb = connected_pair(&[addr("10.0.0.1:5000")], &b);
    let ch = tb.ch;
    let mut sent = 0;
    let mut got = Vec::new();
    let mut big = 0;
    run(&mut tb, Duration::from_secs(30), |c, s, acc| {
        let cc = c.connection_mut(ch).unwrap();
        if cc.state() == ConnectionState::Established && sent < 6 {
            if big == 0 {
                big = cc.max_message_size();
            }
            let size = if sent % 2 == 0 { 50 } else { big };
            match cc.send_message(&vec![sent as u8; size]) {
                Ok(()) => sent += 1,
                Err(ri2n_proto::WriteError::Blocked) => {}
                Err(e) => panic!("send_message({size}): {e}"),
            }
        }
        let Some(h) = *acc else { return false };
        let sc = s.connection_mut(h).unwrap();
        while let Ok(Some(m)) = sc.recv_message() {
            got.push((m.len(), m.iter().all(|&x| x == got.len() as u8)));
        }
        got.len() == 6
    });
    assert!(big > 8_000_000, "largest message: {big}");
    let want: Vec<(usize, bool)> = (0..6)
        .map(|i| (if i % 2 == 0 { 50 } else { big }, true))
        .collect();
    assert_eq!(got, want);
}

/// Drives a client whose server never answers until `until` (simulated); returns whether the
/// connection is still trying and its close reason.
fn unanswered_handshake(timeout: Duration, until: Duration) -> (bool, Option<ConnectionError>) {
    let base = Instant::now();
    let mut client = Endpoint::new(EndpointConfig::new(vec![addr("10.0.0.1:5000")]), 1, base);
    let cfg = ConnectionConfig::default().with_handshake_timeout(timeout);
    let ch = client.connect(base, &[addr("10.0.0.2:6000")], cfg).unwrap();
    let mut buf = [0u8; 1500];
    loop {
        let now = client.poll_timeout().unwrap_or(base + until);
        while client.poll_transmit(now, &mut buf).is_some() {}
        if now >= base + until {
            break;
        }
        client.handle_timeout(now);
    }
    let c = client.connection(ch).unwrap();
    (
        c.state() != ConnectionState::Closed,
        c.close_reason().cloned(),
    )
}

/// A server that restarts after its RETRY no longer takes the cookie it gave (its cookie key
/// is new), and answers each INITIAL carrying it with a RETRY of its own. The client takes
/// that new cookie once it has held its first for a second (a RETRY before then may answer
/// an INITIAL sent before the first cookie came), and connects, keyed or not. Before, it
/// ignored every RETRY after the first and waited out its handshake timeout.
#[test]
fn a_server_restarted_after_its_retry_is_connected_to_with_its_new_cookie() {
    for key in [None, Some(ri2n_proto::Key::from_bytes([5; 32]))] {
        let (client_addr, server_addr) = (addr("10.0.0.1:5000"), addr("10.0.0.2:6000"));
        let config = |local| {
            let mut cfg = EndpointConfig::new(vec![local]);
            cfg.key = key.clone();
            cfg
        };
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut client = Endpoint::new(config(client_addr), 1, t0);
        let mut server = Endpoint::new(config(server_addr).server(), 2, t0);
        let h = client
            .connect(t0, &[server_addr], Default::default())
            .unwrap();
        // hands everything one side sends at `now` to the other; returns the packet types
        let pass = |from: &mut Endpoint, to: &mut Endpoint, now| -> Vec<u8> {
            let sent = drain(from, now);
            for (t, mut d) in sent.iter().cloned() {
                to.handle_datagram(now, t.remote, t.local, &mut d);
            }
            sent.iter().map(|(_, d)| d[1]).collect()
        };
        pass(&mut client, &mut server, at(0));
        assert_eq!(
            pass(&mut server, &mut client, at(0)),
            [wire::packet_type::RETRY]
        );
        // the server restarts: the client's INITIAL with the first cookie draws a new RETRY
        server = Endpoint::new(config(server_addr).server(), 3, at(1));
        pass(&mut client, &mut server, at(1));
        assert_eq!(
            pass(&mut server, &mut client, at(1)),
            [wire::packet_type::RETRY]
        );
        // taken only after a second; the client then connects within the next few
        let mut ms = 1;
        while client.connection(h).unwrap().state() == ConnectionState::Connecting {
            ms += 20;
            assert!(
                ms < 1500,
                "not connected after {ms} ms (key {})",
                key.is_some()
            );
            pass(&mut client, &mut server, at(ms));
            pass(&mut server, &mut client, at(ms));
        }
        let conn = client.connection(h).unwrap();
        assert_eq!(conn.state(), ConnectionState::Established);
        assert!(ms > 1000, "a RETRY taken after {ms} ms");
        assert_eq!(conn.stats().cipher.is_some(), key.is_some());
    }
}

/// The handshake timeout is whatever the configuration says, also beyond the default 10 s
/// (the command's `--connect-timeout` relies on it), and a timeout too large for the clock
/// means "never" instead of a panic.
#[test]
fn the_handshake_timeout_is_configurable() {
    assert_eq!(
        unanswered_handshake(Duration::from_secs(30), Duration::from_secs(29)),
        (true, None)
    );
    assert_eq!(
        unanswered_handshake(Duration::from_secs(30), Duration::from_secs(31)),
        (
            false,
            Some(ConnectionError::TimedOut(Duration::from_secs(30)))
        )
    );
    assert_eq!(
        unanswered_handshake(Duration::MAX, Duration::from_secs(100)),
        (true, None)
    );
}

#[test]
fn an_idle_connection_sets_no_timers_but_its_keepalives() {
    // keepalives every 10 s: an idle connection should then have nothing to do for seconds
    an_idle_connection_wakes_at_most_4_times_in_2_s(Duration::from_secs(10));
    // none at all (an interval beyond the clock's range; it used to overflow an Instant)
    an_idle_connection_wakes_at_most_4_times_in_2_s(Duration::MAX);
}

fn an_idle_connection_wakes_at_most_4_times_in_2_s(keepalive_interval: Duration) {
    let config = ConnectionConfig::default().with_keepalive_interval(keepalive_interval);
    let mut tb = connected_pair_with(
        &[addr("10.0.0.1:5000"), addr("10.1.0.1:5000")],
        &[addr("10.0.0.2:6000"), addr("10.1.0.2:6000")],
        config,
    );
    let ch = tb.ch;
    let mut sent = false;
    run(&mut tb, Duration::from_secs(5), |c, s, acc| {
        let cc = c.connection_mut(ch).unwrap();
        if !sent && cc.state() == ConnectionState::Established && cc.stats().links.len() == 2 {
            cc.send_message(b"hello").unwrap();
            sent = true;
        }
        let Some(h) = *acc else { return false };
        s.connection_mut(h)
            .unwrap()
            .recv_message()
            .is_ok_and(|m| m.is_some())
    });
    // let the acknowledgements and path MTU discovery settle
    tb.events_within(Duration::from_secs(1));
    let idle = tb.events_within(Duration::from_secs(2));
    assert!(
        idle <= 4,
        "{idle} wake-ups in 2 s of an idle connection (periodic checks of nothing?)"
    );
    assert_eq!(
        tb.client.connection(ch).unwrap().state(),
        ConnectionState::Established
    );
}

/// A pair with two links up and keepalives every 200 ms, nothing sent yet; returns the
/// server's handle too.
fn idle_pair_on_two_links() -> (Testbed, ConnectionHandle) {
    let interval = Duration::from_millis(200);
    let config = ConnectionConfig::default().with_keepalive_interval(interval);
    let mut tb = connected_pair_with(
        &[addr("10.0.0.1:5000"), addr("10.1.0.1:5000")],
        &[addr("10.0.0.2:6000"), addr("10.1.0.2:6000")],
        config,
    );
    let sh = until_two_links_up(&mut tb);
    (tb, sh)
}

/// Keepalives run on their timer (which owes the link a PING) rather than on a check of every
/// outgoing datagram: an idle connection still sends one per link about every interval, on
/// both sides, and its links stay up.
#[test]
fn idle_links_send_a_keepalive_every_interval_and_stay_up() {
    let (mut tb, sh) = idle_pair_on_two_links();
    let ch = tb.ch;
    // let the acknowledgements and path MTU discovery settle
    tb.events_within(Duration::from_secs(1));
    let sent = |e: &Endpoint, h| -> Vec<(LinkState, u64)> {
        let stats = e.connection(h).unwrap().stats();
        stats
            .links
            .iter()
            .map(|l| (l.state, l.packets_sent))
            .collect()
    };
    let before = (sent(&tb.client, ch), sent(&tb.server, sh));
    tb.events_within(Duration::from_secs(2));
    let after = (sent(&tb.client, ch), sent(&tb.server, sh));
    for (side, b, a) in [
        ("client", &before.0, &after.0),
        ("server", &before.1, &after.1),
    ] {
        for (i, ((_, n0), (state, n1))) in b.iter().zip(a).enumerate() {
            assert_eq!(*state, LinkState::Up, "{side} link {i}");
            // 2 s of 200 ms intervals: 10 keepalives, give or take the peer's (which put
            // ours off) and their acknowledgements
            let pings = n1 - n0;
            assert!(
                (5..=20).contains(&pings),
                "{side} link {i} sent {pings} packets in 2 idle seconds"
            );
        }
    }
}

/// What a driver relies on to skip its pass over the engine after a read: a read that frees
/// a quarter of the receive window leaves `window_update_pending` set until the update is
/// built; a read that frees less leaves it clear.
#[test]
fn a_read_that_frees_the_window_leaves_its_update_pending_until_sent() {
    let mut config = ConnectionConfig::default();
    config.stream_receive_window = 64 * 1024;
    let mut tb = connected_pair_with(&[addr("10.0.0.1:5000")], &[addr("10.0.0.2:6000")], config);
    let ch = tb.ch;
    let sh = run(&mut tb, Duration::from_secs(5), |c, _, acc| {
        acc.is_some() && c.connection(ch).unwrap().state() == ConnectionState::Established
    })
    .expect("the server accepted");
    // (message length, update expected): a small message frees too little of the window, a
    // large one a quarter or more
    for (len, update) in [(1000, false), (40_000, true)] {
        let msg = vec![7u8; len];
        tb.server
            .connection_mut(sh)
            .unwrap()
            .send_message(&msg)
            .unwrap();
        let mut pending = None;
        let limit = tb.now() + Duration::from_secs(5);
        run(&mut tb, limit, |c, _, _| {
            let conn = c.connection_mut(ch).unwrap();
            match conn.recv_message() {
                Ok(Some(m)) => {
                    assert_eq!(m, msg);
                    pending = Some(conn.window_update_pending());
                    true
                }
                _ => false,
            }
        });
        assert_eq!(pending, Some(update), "after reading {len} bytes");
        // `run` flushed what the client had to send: the update went out
        assert!(!tb.client.connection(ch).unwrap().window_update_pending());
    }
}

/// `timeout_before` answers what `poll_timeout` would, without bringing the timer index up to
/// date: checked at every step of an exchange of messages over two links, on both sides.
#[test]
fn timeout_before_agrees_with_poll_timeout_throughout_an_exchange() {
    let mut tb = connected_pair(
        &[addr("10.0.0.1:5000"), addr("10.1.0.1:5000")],
        &[addr("10.0.0.2:6000"), addr("10.1.0.2:6000")],
    );
    let ch = tb.ch;
    let check = |e: &mut Endpoint| {
        let quick = e.timeout_before(None);
        let full = e.poll_timeout();
        assert_eq!(quick, full);
        if let Some(t) = full {
            assert_eq!(e.timeout_before(Some(t)), None, "not earlier than itself");
            let later = t + Duration::from_millis(1);
            assert_eq!(e.timeout_before(Some(later)), Some(t));
        }
    };
    let (mut sent, mut echoed, mut checks) = (0, 0, 0);
    run(&mut tb, Duration::from_secs(10), |c, s, acc| {
        check(c);
        check(s);
        checks += 1;
        let Some(sh) = *acc else { return false };
        if let Ok(Some(m)) = s.connection_mut(sh).unwrap().recv_message() {
            s.connection_mut(sh).unwrap().send_message(&m).unwrap();
        }
        let cc = c.connection_mut(ch).unwrap();
        if let Ok(Some(_)) = cc.recv_message() {
            echoed += 1;
        }
        if sent == echoed && sent < 200 && cc.state() == ConnectionState::Established {
            cc.send_message(&[sent as u8; 100]).unwrap();
            sent += 1;
        }
        echoed == 200
    });
    assert!(checks > 400, "{checks} checks");
    // more connections something happened to than it asks: the index is brought up to date
    let now = tb.instant();
    for _ in 0..12 {
        tb.client
            .connect(now, &[addr("10.0.0.2:6000")], ConnectionConfig::default())
            .unwrap();
    }
    check(&mut tb.client);
}

/// A datagram flow from client to server: one datagram every `every` while sending, each
/// carrying its number; what arrives is checked off.
struct Flow {
    /// The connection on the client and on the server.
    conns: (ConnectionHandle, ConnectionHandle),
    every: Duration,
    /// Bytes in each datagram (at least 8, for its number).
    size: usize,
    next_send: Duration,
    sent: u64,
    arrived: Vec<bool>,
    /// Datagram numbers in the order the server's application read them.
    order: Vec<usize>,
}

/// The client's and the server's address of link 0 and of link 1 in [`Flow::on_two_links`].
const LINK0: (SocketAddr, SocketAddr) = (v4([10, 0, 0, 1], 5000), v4([10, 0, 0, 2], 6000));
const LINK1: (SocketAddr, SocketAddr) = (v4([10, 1, 0, 1], 5000), v4([10, 1, 0, 2], 6000));

const fn v4([a, b, c, d]: [u8; 4], port: u16) -> SocketAddr {
    SocketAddr::new(
        std::net::IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, d)),
        port,
    )
}

impl Flow {
    /// A client and a server joined by two links, both up, and a flow of one datagram every
    /// `every` from the client, not started yet.
    fn on_two_links(every: Duration) -> (Testbed, Flow) {
        let tb = connected_pair(&[LINK0.0, LINK1.0], &[LINK0.1, LINK1.1]);
        Flow::on(tb, every, 1000)
    }

    /// A flow of datagrams of `size` bytes every `every` over `tb`'s links, once both are up.
    fn on(mut tb: Testbed, every: Duration, size: usize) -> (Testbed, Flow) {
        let sh = until_two_links_up(&mut tb);
        let flow = Flow {
            conns: (tb.ch, sh),
            every,
            size,
            next_send: tb.now(),
            sent: 0,
            arrived: Vec::new(),
            order: Vec::new(),
        };
        (tb, flow)
    }

    /// [`Flow::on_two_links`], a datagram every 100 µs for 300 ms, then 1 ms of them lost on
    /// link 1 (a burst of loss; the link itself is fine): those that came over link 0 after
    /// them are held for them at the server.
    fn with_a_burst_lost_on_link_1() -> (Testbed, Flow) {
        let ms = Duration::from_millis;
        let (mut tb, mut flow) = Flow::on_two_links(Duration::from_micros(100));
        flow.drive_for(&mut tb, ms(300), true);
        tb.apply(Action::blackhole(1));
        flow.drive_for(&mut tb, ms(1), true);
        tb.apply(Action::up(1));
        (tb, flow)
    }

    /// Every datagram sent was read, none after a later one (`resent`: how many the sender
    /// sent again, for the message).
    fn assert_all_read_in_order(&self, resent: u64) {
        let lost = self.arrived.iter().filter(|&&a| !a).count();
        assert_eq!(lost, 0, "every datagram arrived ({} sent)", self.sent);
        let mut highest = 0;
        let mut late = Vec::new();
        for &k in &self.order {
            if k < highest {
                late.push(k);
            }
            highest = highest.max(k);
        }
        assert!(
            late.is_empty(),
            "{} datagrams read after later ones (the first {:?}); {resent} sent again",
            late.len(),
            late.first(),
        );
    }

    /// [`Flow::drive`] for `length` from now.
    fn drive_for(&mut self, tb: &mut Testbed, length: Duration, sending: bool) {
        let until = tb.now() + length;
        self.drive(tb, until, sending);
    }

    /// Runs the pair until `until`, sending while `sending`, reading everything that arrives.
    fn drive(&mut self, tb: &mut Testbed, until: Duration, sending: bool) {
        let (ch, sh) = self.conns;
        self.next_send = self.next_send.max(tb.now());
        while tb.now() < until {
            let now = tb.instant();
            if sending && tb.now() >= self.next_send {
                let mut d = vec![0u8; self.size];
                d[..8].copy_from_slice(&self.sent.to_le_bytes());
                tb.client
                    .connection_mut(ch)
                    .unwrap()
                    .send_datagram(now, &d)
                    .unwrap();
                self.sent += 1;
                self.arrived.push(false);
                self.next_send += self.every;
            }
            tb.flush();
            loop {
                let d = match tb.server.connection_mut(sh).unwrap().recv_datagram() {
                    Ok(Some(d)) => d,
                    Ok(None) | Err(ReadError::Blocked) => break,
                    Err(e) => panic!("{e:?}"),
                };
                let k = u64::from_le_bytes(d[..8].try_into().unwrap()) as usize;
                assert!(!self.arrived[k], "datagram {k} arrived twice");
                self.arrived[k] = true;
                self.order.push(k);
            }
            tb.flush();
            let mut next = tb.next_event().unwrap_or(until).min(until);
            if sending {
                next = next.min(self.next_send);
            }
            tb.advance_to(next);
        }
    }
}

#[test]
fn datagrams_queued_while_every_link_is_failing_reach_the_peer_at_the_heal() {
    // inner TCP through a tunnel depends on it: if the last packets it sent before an outage
    // are lost while older ones arrive at the heal, it takes its timeout for spurious and waits
    // for the next, backed-off one (seconds)
    // 1000-byte datagrams at 40 Mbit/s: what waits during the outage stays well within the
    // send queue's 1 MiB bound, so only the age rule could drop any
    let (mut tb, mut flow) = Flow::on_two_links(Duration::from_micros(200));
    let ch = flow.conns.0;
    let ms = Duration::from_millis;
    // (every path dead, how long, the application sending, every link known down after it)
    let phases = [
        (false, ms(200), true, false),
        // every switch dies; the application goes on sending for the tens of milliseconds the
        // failure takes to detect (its datagrams wait behind the links' full windows)
        (true, ms(60), true, false),
        // the outage, long enough for every link to be declared down
        (true, ms(1940), false, true),
        // the heal
        (false, ms(3000), false, false),
    ];
    for (dead, length, sending, all_down) in phases {
        cut(&mut tb, Dir::BToA, dead);
        cut(&mut tb, Dir::AToB, dead);
        flow.drive_for(&mut tb, length, sending);
        let links = tb.client.connection(ch).unwrap().stats().links;
        assert!(
            !all_down || links.iter().all(|l| l.state == LinkState::Down),
            "every link is known down during the outage"
        );
    }
    let stats = tb.client.connection(ch).unwrap().stats();
    let lost: Vec<usize> = (0..flow.arrived.len())
        .filter(|&k| !flow.arrived[k])
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} datagrams never arrived (the first {:?}, the last {:?}); sender: {} dropped \
         unsent, {} sent again",
        lost.len(),
        flow.sent,
        lost.first(),
        lost.last(),
        stats.datagrams_send_dropped,
        stats.datagrams_resent,
    );
}

#[test]
fn datagrams_in_flight_on_a_link_that_dies_arrive_in_order_with_the_rest() {
    // The receiver holds datagrams that came ahead of missing ones for a moment. Those in
    // flight on a link whose switch dies come again over the other link only once the sender
    // has declared it down: delivered after their successors, inner TCP would drop them as old
    // duplicates (PAWS, its timestamps being older than ones it already took), and an inner
    // connection that lost them just before an outage stood still for seconds after the heal.
    let (mut tb, mut flow) = Flow::on_two_links(Duration::from_micros(100));
    let ch = flow.conns.0;
    flow.drive_for(&mut tb, Duration::from_millis(300), true);
    // link 1's switch dies, and the flow goes on
    tb.apply(Action::blackhole(1));
    flow.drive_for(&mut tb, Duration::from_millis(500), true);
    flow.drive_for(&mut tb, Duration::from_millis(200), false);

    let links = tb.client.connection(ch).unwrap().stats().links;
    assert_eq!(
        links[1].state,
        LinkState::Down,
        "the dead link is known down"
    );
    let stats = tb.client.connection(ch).unwrap().stats();
    assert!(
        stats.datagrams_resent > 0,
        "datagrams were in flight on the dead link"
    );
    flow.assert_all_read_in_order(stats.datagrams_resent);
}

#[test]
fn datagrams_that_lost_pieces_to_a_hold_are_completed_when_those_come_again() {
    // The receiver holds datagrams for missing ones as long as it reckons the sender takes
    // to declare a failed link down and send again what was in flight on it: `failure_ptos
    // + 1` of its own probe timeouts. The sender's may be longer (configured otherwise
    // here; in a tunnel, its host or its queue slower than the receiver sees), and then
    // pieces of large datagrams come again after the hold ran out: over the other link, or
    // at the heal when that one died too. Their datagrams were lost: in a tunnel, 64 KB
    // inner TCP segments, and after a partition an MPI job stood still until inner TCP's
    // backed-off timeout.
    let ms = Duration::from_millis;
    // (room for what arrives while the hold waits, as the tunnel has)
    let server = ConnectionConfig::default().with_datagram_receive_buffer(16 << 20);
    // (how long after link 1 every link dies, if it does: after the receiver's hold ran
    // out and before the sender has declared link 1 down, so its pieces go at the heal)
    for partition in [None, Some(ms(30))] {
        let config = pair_config(
            &[LINK0.0, LINK1.0],
            &[LINK0.1, LINK1.1],
            ConnectionConfig::default().with_min_pto(ms(20)),
        )
        .with_server_connection(server.clone());
        let (mut tb, mut flow) = Flow::on(Testbed::new(config), ms(1), 60_000);
        flow.drive_for(&mut tb, ms(300), true);
        tb.apply(Action::blackhole(1));
        if let Some(after) = partition {
            flow.drive_for(&mut tb, after, true);
            cut(&mut tb, Dir::AToB, true);
            cut(&mut tb, Dir::BToA, true);
            flow.drive_for(&mut tb, ms(3000), false);
            cut(&mut tb, Dir::AToB, false);
            cut(&mut tb, Dir::BToA, false);
        } else {
            flow.drive_for(&mut tb, ms(500), true);
        }
        flow.drive_for(&mut tb, ms(3000), false);

        let sent = tb.client.connection(flow.conns.0).unwrap().stats();
        let received = tb.server.connection(flow.conns.1).unwrap().stats();
        assert!(
            sent.datagrams_resent > 0,
            "pieces were in flight on the dead link"
        );
        let lost = flow.arrived.iter().filter(|&&a| !a).count();
        assert_eq!(
            lost, 0,
            "{partition:?}: every datagram arrived ({} sent)",
            flow.sent
        );
        assert_eq!(received.datagrams_receive_dropped, 0, "{partition:?}");

        assert_eq!(sent.datagrams_send_dropped, 0, "{partition:?}");
        // the premise: the hold ran out before they came again, so they were read late
        let late = flow.order.windows(2).filter(|w| w[1] < w[0]).count();
        assert!(late > 0, "{partition:?}: none was read after a later one");
    }
}

#[test]
fn datagrams_stranded_on_a_link_that_dies_before_the_others_arrive_in_order_at_the_heal() {
    // Two switches dying one after the other: what was in flight on the first one's link is
    // sent again once the sender has declared that link down, over a link that may have died
    // meanwhile (a 3 ms stagger: before the sender's declaration; 15 ms: after the receiver's
    // base hold), and then comes only at the heal. The receiver must not give up on it while
    // the other link still delivers for a moment, nor once that one falls silent too:
    // delivered after their successors, inner TCP drops such datagrams as old duplicates
    // (PAWS), and an inner connection stood still for seconds after the heal.
    let ms = Duration::from_millis;
    for stagger in [ms(2), ms(3), ms(8), ms(15), ms(25), ms(40)] {
        let (mut tb, mut flow) = Flow::on_two_links(Duration::from_micros(100));
        flow.drive_for(&mut tb, ms(300), true);
        tb.apply(Action::blackhole(1));
        flow.drive_for(&mut tb, stagger, true);
        cut(&mut tb, Dir::BToA, true);
        cut(&mut tb, Dir::AToB, true);
        // the application stops soon after, as inner TCP does when its window fills
        flow.drive_for(&mut tb, ms(5), true);
        flow.drive_for(&mut tb, ms(3000), false);
        cut(&mut tb, Dir::BToA, false);
        cut(&mut tb, Dir::AToB, false);
        flow.drive_for(&mut tb, ms(3000), false);

        let stats = tb.client.connection(flow.conns.0).unwrap().stats();
        flow.assert_all_read_in_order(stats.datagrams_resent);
    }
}

#[test]
fn datagrams_held_for_ones_lost_on_a_link_that_then_fell_quiet_go_once_the_peer_answers() {
    // A few datagrams are lost on link 1 (a burst of loss; the link itself is fine) and the
    // flow stops. Those that came over link 0 wait for them: link 1 delivered nothing sent
    // after them, so they may be stranded on a failing link. Once that link's failure would
    // have been repaired, the receiver asks the peer, which has gone silent: its answer shows
    // that the links work, so the missing ones are lost, and the rest goes at once, long
    // before a keepalive would have shown the same.
    let ms = Duration::from_millis;
    let (mut tb, mut flow) = Flow::with_a_burst_lost_on_link_1();
    let stopped = tb.now();
    let sh = flow.conns.1;
    let held = |server: &Endpoint| server.connection(sh).unwrap().stats().datagrams_waiting.0;
    assert!(held(&tb.server) > 0, "datagrams wait for the lost ones");
    while held(&tb.server) > 0 && tb.now() < stopped + ms(1000) {
        flow.drive_for(&mut tb, ms(1), false);
    }
    let waited = tb.now() - stopped;
    let late = flow.order.windows(2).filter(|w| w[1] < w[0]).count();
    assert_eq!(late, 0, "none read after a later one");
    let keepalive = ConnectionConfig::default().keepalive_interval;
    assert!(
        waited < keepalive / 2,
        "the held datagrams went {waited:?} after the flow stopped (keepalives every \
         {keepalive:?})"
    );
}

#[test]
fn datagrams_held_when_the_peer_aborts_are_still_read() {
    // Datagrams wait at the server for ones lost on link 1 when the client aborts: nothing
    // missing can come any more, and no timer of a closed connection would release them, so
    // they are handed over at the close instead of vanishing unread and uncounted.
    let ms = Duration::from_millis;
    let (mut tb, mut flow) = Flow::with_a_burst_lost_on_link_1();
    let sh = flow.conns.1;
    let held = |tb: &Testbed| {
        (tb.server.connection(sh).unwrap().stats())
            .datagrams_waiting
            .0
    };
    tb.client
        .connection_mut(flow.conns.0)
        .unwrap()
        .abort(0, "done");
    let mut held_at_close = 0;
    let read_before = flow.order.len();
    let closed =
        |tb: &Testbed| tb.server.connection(sh).unwrap().state() == ConnectionState::Closed;
    let give_up = tb.now() + ms(1000);
    while !closed(&tb) && tb.now() < give_up {
        held_at_close = held(&tb);
        flow.drive_for(&mut tb, Duration::from_micros(50), false);
    }
    assert!(closed(&tb), "the server saw the abort");
    assert!(held_at_close > 0, "datagrams were held when the abort came");
    assert_eq!(held(&tb), 0, "nothing is left held after the close");
    // what the close released is read before the connection's error
    let conn = tb.server.connection_mut(sh).unwrap();
    loop {
        match conn.recv_datagram() {
            Ok(Some(d)) => flow
                .order
                .push(u64::from_le_bytes(d[..8].try_into().unwrap()) as usize),
            Err(ReadError::ConnectionLost(ConnectionError::PeerAborted { .. })) => break,
            other => panic!("after the held datagrams, the abort: {other:?}"),
        }
    }
    assert!(
        flow.order.len() - read_before >= held_at_close,
        "the {held_at_close} held datagrams were read ({} read since the abort)",
        flow.order.len() - read_before
    );
    assert_eq!(
        flow.order.windows(2).filter(|w| w[1] < w[0]).count(),
        0,
        "none read after a later one"
    );
}

#[test]
fn datagrams_stranded_on_a_fast_link_come_again_over_a_slow_one_in_order() {
    // Link 0 has a 1 ms round trip and link 1 a 21 ms one. What was in flight on link 0 when
    // its switch died comes again over link 1 once the sender has declared link 0 down: a
    // one-way trip of 10.5 ms after that, longer than link 0's own round trip. The receiver's
    // hold must allow for the slower link's delay, or it delivers those datagrams after
    // their successors.
    let ms = Duration::from_millis;
    let (mut tb, mut flow) = Flow::on_two_links(Duration::from_micros(200));
    tb.apply(Action::Configure {
        link: 1,
        dir: None,
        config: DirectionConfig::ideal(DEFAULT_DELAY + ms(10)),
    });
    // (while the slow link delivers its first datagrams, the receiver does not know yet that
    // it must wait for it: the order is checked from the failure on)
    flow.drive_for(&mut tb, ms(1000), true);
    let (first, read_before) = (flow.sent as usize, flow.order.len());
    tb.apply(Action::blackhole(0));
    flow.drive_for(&mut tb, ms(500), true);
    flow.drive_for(&mut tb, ms(500), false);

    let stats = tb.client.connection(flow.conns.0).unwrap().stats();
    assert_eq!(
        stats.links[0].state,
        LinkState::Down,
        "the dead link is known down"
    );
    assert!(
        stats.datagrams_resent > 0,
        "datagrams were in flight on the dead link"
    );
    let lost = (first..flow.arrived.len())
        .filter(|&k| !flow.arrived[k])
        .count();
    assert_eq!(lost, 0, "every datagram sent from the failure on arrived");
    // those read since the failure: older ones (in flight on link 0) and newer ones
    let since: Vec<usize> = flow.order[read_before..].to_vec();
    let late = since.windows(2).filter(|w| w[1] < w[0]).count();
    assert_eq!(
        late, 0,
        "none read after a later one ({} sent again)",
        stats.datagrams_resent
    );
}

/// An idle connection's keepalives cost as few packets and wake-ups as they can: a bare PING
/// is acknowledged at once (no delayed-ACK timer to wake for), and a side whose own keepalive
/// would fall due within half an interval sends it with that acknowledgement, so each link's
/// two keepalives take three packets (PING; ACK and PING; ACK). With the acknowledgements
/// delayed, the same 10 s took 599 events (timers and deliveries), 6 per link and interval.
#[test]
fn idle_keepalives_are_answered_at_once_and_coalesced() {
    let (mut tb, sh) = idle_pair_on_two_links();
    let ch = tb.ch;
    tb.events_within(Duration::from_secs(2));
    let sent = |e: &Endpoint, h| -> u64 {
        let stats = e.connection(h).unwrap().stats();
        stats.links.iter().map(|l| l.packets_sent).sum()
    };
    let before = sent(&tb.client, ch) + sent(&tb.server, sh);
    let events = tb.events_within(Duration::from_secs(10));
    let packets = sent(&tb.client, ch) + sent(&tb.server, sh) - before;
    let links = tb.client.connection(ch).unwrap().stats().links;
    assert!(links.iter().all(|l| l.state == LinkState::Up));
    // 10 s of 200 ms intervals on 2 links: 100 pairs of keepalives
    assert!(
        (295..=305).contains(&packets),
        "{packets} packets in 10 idle seconds"
    );
    assert!(events <= 560, "{events} events in 10 idle seconds");
}

/// Two links of 10 Gbit/s and a few microseconds (as on loopback), and a receiver that stops
/// running for 3 ms every 40 ms (as on a busy host: nothing it receives is taken in, and it
/// neither sends nor runs its timers). The stalls are shorter than what takes a link down or
/// finds it slow: no link leaves `up`, and the bytes arrive exact.
#[test]
fn a_receiver_that_stalls_now_and_then_keeps_every_link_up() {
    let fast = DirectionConfig {
        rate_bps: 10_000_000_000,
        ..DirectionConfig::ideal(Duration::from_micros(5))
    };
    let mut tb = Testbed::new(
        TestbedConfig::new(2)
            .with_links(LinkConfig::symmetric(fast))
            .with_buffers(8 << 20, 8 << 20),
    );
    tb.establish();
    let received = |tb: &Testbed| -> u64 {
        let links = tb.server_conn().stats().links;
        links.iter().map(|l| l.packets_received).sum()
    };
    let mut t = Transfer::new(1 << 30, 0, 0, true);
    let mut changes = Vec::new();
    let start = tb.now();
    let mut stalls = 0;
    while tb.now() < start + Duration::from_millis(400) {
        tb.advance(Duration::from_millis(37), |s| t.pump(s));
        let before = received(&tb);
        tb.stall(HostId::B, tb.now() + Duration::from_millis(3));
        tb.advance(Duration::from_micros(2900), |s| t.pump(s));
        assert_eq!(received(&tb), before, "nothing taken in while stalled");
        tb.advance(Duration::from_micros(100), |s| t.pump(s));
        assert!(
            received(&tb) > before,
            "what waited is taken in after the stall"
        );
        stalls += 1;
        while let Some((_, e)) = tb.client.poll_event() {
            match e {
                Event::LinkStateChanged { link, to, .. } if to != LinkState::Up => {
                    changes.push((tb.now(), link, to))
                }
                _ => {}
            }
        }
    }
    let delivered = t.got_s;
    println!(
        "{stalls} stalls of the receiver: {} MiB delivered, link changes {changes:?}",
        delivered >> 20
    );
    assert!(
        delivered > 128 << 20,
        "the transfer moved: {delivered} bytes"
    );
    assert!(changes.is_empty(), "{changes:?}");
}

/// A receiver's window update goes on a link in use, never on an acknowledgement sent over
/// one that is not: there it is lost for as long as the link is dead, and nothing sends it
/// again (an ack-only packet is not in flight, and only that link's acknowledgements could
/// show it lost), which stalls the sender for good. Here the server's return path on link 0
/// dies and link 1 dies both ways while the client is held up by the window; the client's
/// probes keep arriving on link 0 and are acknowledged there. Link 1 heals, link 0's return
/// path never does; the transfer completes over link 1. (The fault times are some at which
/// the server had an update in flight when it failed: each stalled before.)
#[test]
fn a_window_update_is_not_left_on_a_link_that_is_down() {
    let ms = Duration::from_millis;
    for start in [20_548, 23_562, 30_549, 41_509, 52_606] {
        let mut tb = Testbed::new(
            TestbedConfig::new(2)
                .with_buffers(64 << 10, 64 << 10)
                .with_capture(Dir::BToA, Capture::first(1_000_000)),
        );
        tb.establish();
        let total = 8 << 20;
        let mut t = Transfer::new(total, 0, 0, true);
        tb.advance(Duration::from_micros(start), |s| t.pump(s));
        let fault = tb.now();
        tb.apply(Action::SetStatus {
            link: 0,
            dir: Some(Dir::BToA),
            status: LinkStatus::Blackhole,
        });
        tb.apply(Action::blackhole(1));
        tb.advance(ms(3000), |s| t.pump(s));
        let sh = tb.sh.expect("accepted");
        let link0 = tb.server.connection(sh).unwrap().stats().links[0].state;
        assert_ne!(
            link0,
            LinkState::Up,
            "the premise: the server's link 0 is down"
        );
        let acks_on_link0 = (tb.captured(Dir::BToA).iter())
            .filter(|c| c.at > fault + ms(1000))
            .filter_map(|c| match wire::decode_packet(&c.bytes) {
                Ok((Header::Short { link, .. }, payload)) if link.0 == 0 => Some(payload),
                _ => None,
            })
            .flat_map(|p| wire::Frames::new(p).flatten())
            .filter(|f| matches!(f, wire::Frame::Ack { .. }))
            .count();
        assert!(
            acks_on_link0 > 0,
            "the premise: the client's probes were acknowledged"
        );
        let before_heal = t.got_s;
        assert!(
            before_heal < total,
            "the premise: the transfer was under way"
        );
        tb.apply(Action::up(1));
        let limit = tb.now() + Duration::from_secs(30);
        while !t.complete(&tb) {
            assert!(
                tb.now() < limit,
                "fault at {start} us: stalled at {} of {total} bytes read ({before_heal} before \
                 the heal)",
                t.got_s
            );
            tb.advance(ms(10), |s| t.pump(s));
        }
    }
}

/// A writer blocked on the message stream is woken when that stream has room, also after
/// another writer blocked on the byte stream (whose reader reads nothing): each stream keeps
/// its own wait. The byte stream's blocked write erased the message stream's, and the
/// message sender was never woken.
#[test]
fn writers_blocked_on_both_streams_are_each_woken() {
    let ms = Duration::from_millis;
    let mut tb = Testbed::new(TestbedConfig::new(1).with_buffers(64 << 10, 64 << 10));
    tb.establish();
    let ch = tb.ch;
    let sh = tb.sh.expect("accepted");
    let chunk = vec![1u8; 16 << 10];
    let msg = vec![2u8; 24 << 10];
    // the byte stream fills: the server does not read it
    let mut blocked = (false, false);
    for _ in 0..200 {
        let c = tb.client.connection_mut(ch).unwrap();
        while c.write(&chunk).is_ok_and(|n| n > 0) {}
        while c.send_message(&msg).is_ok() {}
        tb.advance(ms(5), |_| {});
        let c = tb.client.connection_mut(ch).unwrap();
        blocked = (
            c.write(&chunk) == Err(ri2n_proto::WriteError::Blocked),
            c.send_message(&msg) == Err(ri2n_proto::WriteError::Blocked),
        );
        if blocked == (true, true) {
            break;
        }
    }
    assert_eq!(blocked, (true, true), "the premise: both streams are full");
    // the message stream blocked first, then the byte stream
    let c = tb.client.connection_mut(ch).unwrap();
    assert_eq!(c.send_message(&msg), Err(ri2n_proto::WriteError::Blocked));
    assert_eq!(c.write(&chunk), Err(ri2n_proto::WriteError::Blocked));
    while tb.client.poll_event().is_some() {}
    // the server reads its messages (not the byte stream): the message stream drains
    let mut writable = false;
    for _ in 0..100 {
        let s = tb.server.connection_mut(sh).unwrap();
        while let Ok(Some(_)) = s.recv_message() {}
        tb.advance(ms(5), |_| {});
        while let Some((h, e)) = tb.client.poll_event() {
            writable |= h == ch && e == Event::Writable;
        }
        if writable {
            break;
        }
    }
    assert!(writable, "the message writer was never woken");
    let c = tb.client.connection_mut(ch).unwrap();
    assert_eq!(c.send_message(&msg), Ok(()));
}

/// A client given every server address (`--to` repeated) connects while the first is down
/// from the start: its INITIALs take the given paths in turn, the connection comes up over
/// the second, a stream arrives whole, and the first becomes a link once it heals, from the
/// local address its path had (the first pair shares no subnet: paired by the fallback, it
/// would get the second path's local address, from which it leads nowhere).
#[test]
fn a_client_connects_over_its_second_address_while_the_first_is_down() {
    let addrs = vec![
        (addr("192.168.1.10:5000"), addr("203.0.113.5:6000")),
        (addr("10.0.0.10:5000"), addr("10.0.0.20:6000")),
    ];
    // the cookie, and with a key the Noise message bound to it, belong to the second path
    for key in [None, Some(ri2n_proto::Key::from_bytes([7; 32]))] {
        let mut tb = Testbed::new(
            TestbedConfig::new(2)
                .with_addrs(addrs.clone())
                .with_all_remotes_given()
                .with_keys(key.clone(), key)
                .with_capture(Dir::AToB, Capture::first(64)),
        );
        let (a, b) = (tb.client_addrs(), tb.server_addrs());
        tb.apply(Action::blackhole(0));
        let ch = tb.ch;
        let established =
            |s: &Testbed| s.client.connection(ch).unwrap().state() == ConnectionState::Established;
        tb.run_until(Duration::from_secs(9), |s| s.sh.is_some() && established(s));
        assert!(established(&tb), "not connected after {:?}", tb.now());
        // one retransmission interval (200 ms) and the second path's round trips
        assert!(
            tb.now() < Duration::from_millis(300),
            "connected at {:?}",
            tb.now()
        );
        let initials: Vec<SocketAddr> = (tb.captured(Dir::AToB).iter())
            .filter(|c| {
                matches!(
                    wire::decode_packet(&c.bytes),
                    Ok((Header::Initial { .. }, _))
                )
            })
            .map(|c| c.local)
            .collect();
        assert_eq!(
            initials[0], b[0],
            "the premise: the first INITIAL went to the first address"
        );
        assert!(initials.contains(&b[1]), "INITIALs: {initials:?}");
        let links = tb.client_conn().stats().links;
        assert_eq!(
            (links[0].id.0, links[0].local, links[0].remote),
            (0, a[1], b[1])
        );

        let total = 2 << 20;
        let mut t = Transfer::new(total, 0, 0, true);
        tb.complete_transfer(&mut t);
        assert_eq!(t.got_s, total);

        tb.apply(Action::up(0));
        let first_path_up = |s: &Testbed| {
            (s.client_conn().stats().links.iter())
                .any(|l| (l.local, l.remote, l.state) == (a[0], b[0], LinkState::Up))
        };
        let limit = tb.now() + Duration::from_secs(5);
        tb.run_until(limit, |s| first_path_up(s));
        assert!(
            first_path_up(&tb),
            "links: {:?}",
            tb.client_conn().stats().links
        );
    }
}

/// Nothing listens at the first of two given addresses (its host answers every INITIAL with
/// "port unreachable"): the client gives that path up after three refusals and keeps trying
/// the second; only once the second refuses too is the connection refused.
#[test]
fn a_refused_address_leaves_the_handshake_to_the_others() {
    let base = Instant::now();
    let locals = vec![addr("10.0.0.1:5000"), addr("10.1.0.1:5000")];
    let remotes = [addr("10.0.0.2:6000"), addr("10.1.0.2:6000")];
    let mut client = Endpoint::new(EndpointConfig::new(locals), 1, base);
    let ch = client
        .connect(base, &remotes, ConnectionConfig::default())
        .unwrap();
    // `refusing[i]`: remote i's host answers every INITIAL with "port unreachable"
    let drive = |client: &mut Endpoint, refusing: [bool; 2], span: Duration, from: Duration| {
        let mut now = base + from;
        let mut sent_to = [0usize; 2];
        while now < base + from + span {
            client.handle_timeout(now);
            for (tx, d) in drain(client, now) {
                let i = remotes.iter().position(|&r| r == tx.remote).unwrap();
                sent_to[i] += 1;
                if refusing[i] {
                    client.handle_port_unreachable(now, tx.local, tx.remote, &d[..24]);
                }
            }
            now += Duration::from_millis(1);
        }
        sent_to
    };
    let sent_to = drive(
        &mut client,
        [true, false],
        Duration::from_secs(1),
        Duration::ZERO,
    );
    let state = client.connection(ch).unwrap().state();
    assert_eq!(
        state,
        ConnectionState::Connecting,
        "{:?}",
        client.connection(ch).unwrap().close_reason()
    );
    assert_eq!(sent_to[0], 3, "the refused address is tried three times");
    assert!(sent_to[1] > 20, "the other is tried on: {sent_to:?}");
    drive(
        &mut client,
        [true, true],
        Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let c = client.connection(ch).unwrap();
    assert_eq!(c.state(), ConnectionState::Closed);
    assert_eq!(c.close_reason(), Some(&ConnectionError::Refused));
}

/// What answers at the second of two given addresses in
/// [`an_address_whose_endpoint_takes_no_connections_leaves_the_handshake_to_the_others`].
#[derive(Debug, Clone, Copy, PartialEq)]
enum Second {
    Server,
    NotAccepting,
    Silent,
    /// A server that answers the first INITIAL with a RETRY, then is gone: its host answers
    /// "port unreachable".
    GoneAfterRetry,
}

/// The first of two given addresses leads to an endpoint that takes no connections (another
/// host's client, a server whose application stopped accepting): its REFUSE takes that
/// address out of the handshake, which goes on over the second, to the server there, and the
/// address becomes no link. Only once every address refused does the connection end, with
/// the reason given; one whose other address stays silent ends with that reason at the
/// handshake timeout; one whose server went away after its RETRY is `Refused`.
#[test]
fn an_address_whose_endpoint_takes_no_connections_leaves_the_handshake_to_the_others() {
    let base = Instant::now();
    let locals = vec![addr("10.0.0.1:5000"), addr("10.1.0.1:5000")];
    let remotes = [addr("10.0.0.2:6000"), addr("10.1.0.2:6000")];
    let cases = [
        (Second::Server, None),
        (Second::NotAccepting, Some(ConnectionError::NotAccepting)),
        (Second::Silent, Some(ConnectionError::NotAccepting)),
        (Second::GoneAfterRetry, Some(ConnectionError::Refused)),
    ];
    for (second, ending) in cases {
        let mut client = Endpoint::new(EndpointConfig::new(locals.clone()), 1, base);
        let not_accepting = Endpoint::new(EndpointConfig::new(vec![remotes[0]]), 2, base);
        let mut config = EndpointConfig::new(vec![remotes[1]]);
        if second != Second::NotAccepting {
            config = config.server();
        }
        let mut peers = [not_accepting, Endpoint::new(config, 3, base)];
        let handshake_timeout = Duration::from_secs(2);
        let ch = client
            .connect(
                base,
                &remotes,
                ConnectionConfig::default().with_handshake_timeout(handshake_timeout),
            )
            .unwrap();
        let (mut now, mut refuses_sent, mut retries_sent) = (base, 0, 0);
        while now < base + handshake_timeout + Duration::from_millis(100)
            && client.connection(ch).unwrap().state() == ConnectionState::Connecting
        {
            client.handle_timeout(now);
            for (tx, mut d) in drain(&mut client, now) {
                let i = remotes.iter().position(|&r| r == tx.remote).unwrap();
                match (i, second) {
                    (1, Second::Silent) => {}
                    (1, Second::GoneAfterRetry) if retries_sent > 0 => {
                        client.handle_port_unreachable(now, tx.local, tx.remote, &d[..24]);
                    }
                    _ => peers[i].handle_datagram(now, tx.remote, tx.local, &mut d),
                }
            }
            for (i, peer) in peers.iter_mut().enumerate() {
                peer.handle_timeout(now);
                for (tx, mut d) in drain(peer, now) {
                    match wire::decode_packet(&d) {
                        Ok((Header::Refuse { .. }, _)) => refuses_sent += usize::from(i == 0),
                        Ok((Header::Retry { .. }, _)) => retries_sent += usize::from(i == 1),
                        _ => {}
                    }
                    client.handle_datagram(now, tx.remote, tx.local, &mut d);
                }
            }
            now += Duration::from_millis(1);
        }
        assert!(
            refuses_sent > 0,
            "{second:?}: the premise: the first refused"
        );
        let c = client.connection(ch).unwrap();
        match &ending {
            None => assert_eq!(
                c.state(),
                ConnectionState::Established,
                "{second:?}: {:?}",
                c.close_reason()
            ),
            Some(e) => {
                assert_eq!(c.state(), ConnectionState::Closed, "{second:?}");
                assert_eq!(c.close_reason(), Some(e), "{second:?}");
            }
        }
        if second == Second::Server {
            // the endpoint that refused is not the server: no link leads there
            let links = c.stats().links;
            assert_eq!((links[0].local, links[0].remote), (locals[1], remotes[1]));
            assert_eq!(links.len(), 1, "{links:?}");
        }
    }
}

/// The server is at the first of two given addresses and answers before the second is tried;
/// at the second is an endpoint that is not the server. The link there draws RESETs (that
/// endpoint knows no such connection), which say nothing about the peer, never heard from that
/// address: the connection lives on and carries a stream whole. Before, the first RESET ended
/// it as a peer restart.
#[test]
fn a_reset_from_an_address_the_peer_never_answered_from_is_ignored() {
    let base = Instant::now();
    let locals = vec![addr("10.0.0.1:5000"), addr("10.1.0.1:5000")];
    let remotes = [addr("10.0.0.2:6000"), addr("10.1.0.2:6000")];
    let mut client = Endpoint::new(EndpointConfig::new(locals), 1, base);
    let server = Endpoint::new(EndpointConfig::new(vec![remotes[0]]).server(), 2, base);
    let stranger = Endpoint::new(EndpointConfig::new(vec![remotes[1]]), 3, base);
    let mut peers = [server, stranger];
    let ch = client
        .connect(base, &remotes, ConnectionConfig::default())
        .unwrap();
    let (mut sh, mut resets, mut sent, mut got) = (None, 0, 0u64, 0u64);
    let total = 1u64 << 20;
    let mut buf = vec![0u8; 65536];
    let mut now = base;
    while now < base + Duration::from_secs(5) && got < total {
        client.handle_timeout(now);
        for (tx, mut d) in drain(&mut client, now) {
            let i = remotes.iter().position(|&r| r == tx.remote).unwrap();
            peers[i].handle_datagram(now, tx.remote, tx.local, &mut d);
        }
        for (i, peer) in peers.iter_mut().enumerate() {
            peer.handle_timeout(now);
            for (tx, mut d) in drain(peer, now) {
                let reset = matches!(wire::decode_packet(&d), Ok((Header::Reset { .. }, _)));
                resets += usize::from(reset && i == 1);
                client.handle_datagram(now, tx.remote, tx.local, &mut d);
            }
        }
        if let Some(c) = client.connection_mut(ch) {
            if c.state() == ConnectionState::Established {
                write_pattern(c, &mut sent, total, pattern);
            }
        }
        if sh.is_none() {
            sh = peers[0].accept();
        }
        if let Some(c) = sh.and_then(|h| peers[0].connection_mut(h)) {
            while let Ok(n @ 1..) = c.read(&mut buf) {
                assert!(
                    (0..n).all(|k| buf[k] == pattern(got + k as u64)),
                    "the bytes differ"
                );
                got += n as u64;
            }
        }
        now += Duration::from_millis(1);
    }
    assert!(resets > 0, "the premise: the stranger answered with RESETs");
    let c = client.connection(ch).unwrap();
    assert_eq!(
        c.state(),
        ConnectionState::Established,
        "{:?}",
        c.close_reason()
    );
    assert_eq!(got, total, "the stream arrived whole");
}

/// Reads what `conn`'s byte stream holds, checking byte `i` is `pattern(i)`; `got` counts.
fn read_pattern(conn: &mut Connection, got: &mut u64) {
    let mut buf = vec![0u8; 65536];
    loop {
        match conn.read(&mut buf) {
            Ok(0) | Err(ReadError::Blocked) => return,
            Ok(n) => {
                for (i, &x) in buf[..n].iter().enumerate() {
                    assert_eq!(x, pattern(*got + i as u64), "byte {}", *got + i as u64);
                }
                *got += n as u64;
            }
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// A reader that stops reading holds its sender back by its receive window: the sender counts
/// that wait as the peer's window, not as sending, and the stream arrives whole once read.
#[test]
fn a_sender_counts_the_wait_for_a_reader_that_stopped_as_the_peers_window() {
    const WINDOW: u64 = 64 * 1024;
    const TOTAL: u64 = 1 << 20;
    let mut config = ConnectionConfig::default();
    config.stream_receive_window = WINDOW;
    let mut tb = connected_pair_with(&[addr("10.0.0.1:5000")], &[addr("10.0.0.2:6000")], config);
    tb.establish();
    let (ch, sh) = (tb.ch, tb.sh.expect("accepted"));
    let mut sent = 0;
    // the reader does not read for a second
    tb.advance(Duration::from_secs(1), |tb| {
        write_pattern(
            tb.client.connection_mut(ch).unwrap(),
            &mut sent,
            TOTAL,
            pattern,
        );
    });
    let server = tb.server.connection(sh).unwrap();
    assert_eq!(
        server.stats().recv_buffered,
        WINDOW,
        "the window is full, unread"
    );
    let waited = tb.client_conn().stats().send_limits;
    // then it reads everything
    let mut got = 0;
    tb.run_until(tb.now() + Duration::from_secs(5), |tb| {
        write_pattern(
            tb.client.connection_mut(ch).unwrap(),
            &mut sent,
            TOTAL,
            pattern,
        );
        read_pattern(tb.server.connection_mut(sh).unwrap(), &mut got);
        got == TOTAL
    });
    let after = tb.client_conn().stats().send_limits;
    assert!(
        waited.peer_window > Duration::from_millis(990) && waited.peer_window <= waited.total(),
        "{waited:?}"
    );
    assert!(waited.sending < Duration::from_millis(10), "{waited:?}");
    assert!(
        after.sending > waited.sending,
        "the rest was sent: {after:?}"
    );
}

/// While every link is down, data written counts as held back by the outage: first by the
/// windows its lost packets fill, then, once the links are declared down, as no link. The
/// stream arrives whole after the heal.
#[test]
fn a_sender_counts_an_outage_of_every_link_as_no_link() {
    const TOTAL: u64 = 8 << 20;
    let b = [addr("10.0.0.2:6000"), addr("10.1.0.2:6000")];
    let mut tb = connected_pair(&[addr("10.0.0.1:5000"), addr("10.1.0.1:5000")], &b);
    let sh = until_two_links_up(&mut tb);
    let ch = tb.ch;
    let (mut sent, mut got) = (0, 0);
    let pump = |tb: &mut Testbed, sent: &mut u64, got: &mut u64| {
        write_pattern(tb.client.connection_mut(ch).unwrap(), sent, TOTAL, pattern);
        read_pattern(tb.server.connection_mut(sh).unwrap(), got);
    };
    let before = tb.client_conn().stats().send_limits;
    cut(&mut tb, Dir::AToB, true);
    cut(&mut tb, Dir::BToA, true);
    // the data is written during the outage
    tb.advance(Duration::from_secs(2), |tb| pump(tb, &mut sent, &mut got));
    let links = tb.client_conn().stats().links;
    assert!(
        links.iter().all(|l| l.state != LinkState::Up),
        "the outage was seen: {links:?}"
    );
    assert!(sent > got, "data waited through the outage");
    cut(&mut tb, Dir::AToB, false);
    cut(&mut tb, Dir::BToA, false);
    tb.run_until(tb.now() + Duration::from_secs(10), |tb| {
        pump(tb, &mut sent, &mut got);
        got == TOTAL
    });
    let after = tb.client_conn().stats().send_limits;
    let no_link = after.no_link - before.no_link;
    let windows = after.congestion_window - before.congestion_window;
    // until the links were declared down, then until the heal was seen
    assert!(
        windows > Duration::from_millis(100) && windows < Duration::from_millis(250),
        "{after:?}"
    );
    assert!(
        no_link > Duration::from_millis(1750) && no_link + windows < Duration::from_millis(2100),
        "{after:?}"
    );
}
