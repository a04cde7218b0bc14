//! Connections under a cluster key (docs/PROTOCOL.md §9): transfers stay exact and sealed;
//! mismatched keys are refused at once with the documented error; nothing an attacker without
//! the key sends (flipped bits, replays, datagrams moved to another link, forged CLOSE, RESET
//! or acknowledgements) has any effect; keys are updated on long connections.

use std::time::Duration;

use ri2n_proto::wire::{self, frame_type, Writer};
use ri2n_proto::{
    Cipher, ConnectionError, ConnectionState, DropReason, Key, KeyMismatch, LinkId,
    RefusedHandshake,
};
use ri2n_sim::testbed::{
    initial_packet, pattern, Capture, Captured, Testbed, TestbedConfig, Transfer,
};
use ri2n_sim::{Action, Dir};

fn key(b: u8) -> Key {
    Key::from_bytes([b; 32])
}

/// A testbed whose client and server hold these keys (or none), with two links and 256 KiB
/// buffers, keeping every client datagram of the first 20 000 for the test to read (replays,
/// mutations, captured IDs).
fn keyed(client_key: Option<Key>, server_key: Option<Key>) -> Testbed {
    Testbed::new(
        TestbedConfig::new(2)
            .with_buffers(256 << 10, 256 << 10)
            .with_keys(client_key, server_key)
            .with_capture(Dir::AToB, Capture::first(20_000)),
    )
}

#[test]
fn keyed_transfer_is_exact_and_sealed() {
    let mut sim = keyed(Some(key(1)), Some(key(1)));
    sim.establish();
    let mut t = Transfer::new(2 << 20, 1 << 20, 200, true);
    sim.complete_transfer(&mut t);
    let stats = sim.client.connection(sim.ch).unwrap().stats();
    assert!(stats.cipher.is_some());
    assert_eq!(sim.server_conn().stats().cipher, stats.cipher);
    assert_eq!(Some(Cipher::preferred()), stats.cipher);
    // the client's byte stream is a known pattern: no 32-byte run of it is on the wire
    let plain: Vec<u8> = (0..4096).map(pattern).collect();
    let mut seen = 0;
    for c in sim.captured(Dir::AToB) {
        for w in c.bytes.windows(32) {
            assert!(!plain.windows(32).any(|p| p == w), "plaintext on the wire");
        }
        seen += c.bytes.len();
    }
    assert!(seen > 1 << 20, "captured {seen} bytes");
}

#[test]
fn the_same_transfer_in_clear_shows_its_plaintext() {
    // the check above can fail: without a key the pattern is on the wire
    let mut sim = keyed(None, None);
    sim.establish();
    let mut t = Transfer::new(64 << 10, 0, 0, true);
    sim.complete_transfer(&mut t);
    let plain: Vec<u8> = (0..4096).map(pattern).collect();
    assert!(sim
        .captured(Dir::AToB)
        .iter()
        .any(|c| c.bytes.windows(32).any(|w| w == &plain[..32])));
    assert_eq!(sim.client.connection(sim.ch).unwrap().stats().cipher, None);
}

/// A client whose key differs from the server's: closed with the given mismatch within a
/// second (a few round trips: INITIAL, RETRY, INITIAL, REFUSE), the server holding nothing
/// and reporting the attempt once.
fn refused(
    client: Option<Key>,
    server: Option<Key>,
    expect: KeyMismatch,
    server_sees: KeyMismatch,
) {
    let mut sim = keyed(client, server);
    sim.run_until(Duration::from_secs(1), |s| {
        s.client.connection(s.ch).unwrap().state() == ConnectionState::Closed
    });
    let c = sim.client.connection(sim.ch).unwrap();
    assert_eq!(
        c.close_reason(),
        Some(&ConnectionError::KeyMismatch(expect))
    );
    assert!(
        c.close_reason()
            .unwrap()
            .to_string()
            .starts_with("authentication failed"),
        "{}",
        c.close_reason().unwrap()
    );
    assert_eq!(sim.server.connection_count(), 0, "the server kept state");
    assert!(sim.sh.is_none());
    let report = sim
        .server
        .poll_refused_handshake()
        .expect("a report to log");
    assert_eq!(report.reason, ri2n_proto::RefusalReason::Key(server_sees));
    assert_eq!(report.remote, sim.client_addrs()[0]);
    assert_eq!(
        sim.server.poll_refused_handshake(),
        None::<RefusedHandshake>
    );
    assert_eq!(sim.server.dropped().get(DropReason::KeyMismatch), 1);
}

#[test]
fn another_key_is_refused_promptly() {
    refused(
        Some(key(1)),
        Some(key(2)),
        KeyMismatch::WrongKey,
        KeyMismatch::WrongKey,
    );
}

#[test]
fn a_client_without_a_key_is_refused_by_a_keyed_server() {
    refused(
        None,
        Some(key(1)),
        KeyMismatch::KeyRequired,
        KeyMismatch::NoKey,
    );
}

#[test]
fn a_keyed_client_is_refused_by_a_server_without_a_key() {
    refused(
        Some(key(1)),
        None,
        KeyMismatch::NoKey,
        KeyMismatch::KeyRequired,
    );
}

#[test]
fn refusals_are_reported_at_a_bounded_rate() {
    // 200 clients with the wrong key, at once: every one refused, a handful reported to log
    let mut sim = keyed(Some(key(2)), Some(key(1)));
    for _ in 0..199 {
        let remote = sim.server_addrs()[0];
        let mut cfg = ri2n_proto::ConnectionConfig::default();
        cfg.discover = false;
        sim.client.connect(sim.instant(), &[remote], cfg).unwrap();
    }
    sim.advance(Duration::from_millis(500), |_| {});
    let closed = sim
        .client
        .connection_handles()
        .filter(|&h| {
            sim.client.connection(h).unwrap().close_reason()
                == Some(&ConnectionError::KeyMismatch(KeyMismatch::WrongKey))
        })
        .count();
    assert!(
        closed >= 100,
        "{closed} of 200 clients told (the RESET budget's burst is 100)"
    );
    let mut reports = 0;
    while sim.server.poll_refused_handshake().is_some() {
        reports += 1;
    }
    assert!((1..=6).contains(&reports), "{reports} reports");
    assert_eq!(sim.server.connection_count(), 0);
}

/// The client's captured short packets (sealed) with their address pairs.
fn client_short_packets(sim: &Testbed) -> Vec<Captured> {
    sim.captured(Dir::AToB)
        .iter()
        .filter(|c| {
            matches!(
                wire::decode_packet(&c.bytes),
                Ok((wire::Header::Short { .. }, _))
            )
        })
        .cloned()
        .collect()
}

#[test]
fn tampering_without_the_key_changes_nothing() {
    let mut sim = keyed(Some(key(1)), Some(key(1)));
    sim.establish();
    let mut t = Transfer::new(16 << 20, 4 << 20, 100, true);
    // let the transfer get going, then attack it throughout
    sim.advance(Duration::from_millis(1), |s| t.pump(s));
    let dropped = |s: &Testbed| s.server.dropped().total();
    let pairs = sim.pairs();
    assert_eq!(pairs.len(), 2, "two links");
    let cid = sim.server_cid().unwrap();
    let mut round = 0u64;
    let limit = sim.now() + Duration::from_secs(60);
    let (mut flipped, mut replayed, mut moved, mut relabelled, mut forged) = (0, 0, 0, 0, 0);
    sim.run_until(limit, |s| {
        t.pump(s);
        if t.complete(s) {
            return true;
        }
        // packets that have arrived (a replay that overtakes its original is the original)
        let packets: Vec<_> = client_short_packets(s)
            .into_iter()
            .filter(|c| c.at + Duration::from_millis(5) < s.now())
            .collect();
        if packets.is_empty() {
            return false;
        }
        for _ in 0..5 {
            round += 1;
            let p = packets[round as usize * 7 % packets.len()].clone();
            let before = dropped(s);
            match round % 5 {
                // any bit of a real packet flipped
                0 => {
                    let mut b = p.bytes.clone();
                    // (not the version and type bytes: they decide whether it is a short
                    // packet at all)
                    let bit = 16 + (round * 131) as usize % (b.len() * 8 - 16);
                    b[bit / 8] ^= 1 << (bit % 8);
                    s.inject(p.local, p.remote, &b);
                    flipped += 1;
                }
                // an exact replay
                1 => {
                    s.inject(p.local, p.remote, &p.bytes);
                    replayed += 1;
                }
                // moved to the other link's address pair, unchanged or with the link byte rewritten
                2 | 3 => {
                    let other = pairs
                        .iter()
                        .find(|&&(l, r)| (l, r) != (p.local, p.remote))
                        .copied()
                        .unwrap();
                    let mut b = p.bytes.clone();
                    if round % 5 == 3 {
                        b[10] = s.link_id(other.0, other.1).unwrap();
                        relabelled += 1;
                    } else {
                        moved += 1;
                    }
                    s.inject(other.0, other.1, &b);
                }
                // a forged CLOSE, numbered past what the client uses (an attacker sees the header)
                _ => {
                    let mut d = [0u8; 64];
                    let mut w = Writer::new(&mut d);
                    wire::write_short_header(&mut w, cid, LinkId(p.bytes[10]), 1 << 16, 0);
                    w.u8(frame_type::CLOSE);
                    w.varint(0);
                    w.varint(0);
                    let len = w.finish();
                    s.inject(p.local, p.remote, &d[..len]);
                    forged += 1;
                }
            }
            let after = dropped(s);
            assert!(
                after == before + 1,
                "round {round}: a tampered datagram was taken"
            );
        }
        false
    });
    for n in [flipped, replayed, moved, relabelled, forged] {
        assert!(n > 20, "{flipped} flipped, {replayed} replayed, {moved} moved, {relabelled} relabelled, {forged} forged");
    }
    // the transfer is exact (strict) and the connection never faltered
    assert_eq!(t.corrupted, 0);
    assert_eq!(sim.server_conn().close_reason(), None);
}

#[test]
fn forged_resets_and_acknowledgements_do_not_reach_a_keyed_client() {
    let mut sim = keyed(Some(key(1)), Some(key(1)));
    sim.establish();
    let mut t = Transfer::new(1 << 20, 1 << 20, 0, true);
    sim.advance(Duration::from_millis(10), |s| t.pump(s));
    let server_cid = sim.server_cid().unwrap();
    let (local, remote) = (sim.client_addrs()[0], sim.server_addrs()[0]);
    // RESETs carrying the server's connection ID: without a token, and with a wrong one
    let mut buf = [0u8; 64];
    for token in [
        None,
        Some(&[0u8; 16][..]),
        Some(&key(2).to_text().as_bytes()[..16]),
    ] {
        let reset = wire::Header::Reset {
            dcid: server_cid,
            token,
        };
        let n = wire::encode_control_packet(&reset, &mut buf);
        sim.inject_client(local, remote, &buf[..n]);
    }
    // an ACK of everything on link 0, forged (not sealed)
    let mut d = [0u8; 64];
    let mut w = Writer::new(&mut d);
    wire::write_short_header(&mut w, 0, LinkId(0), 1 << 10, 0);
    let len = w.finish();
    sim.inject_client(local, remote, &d[..len]);
    assert!(sim.client.dropped().get(DropReason::Unauthenticated) >= 3);
    sim.complete_transfer(&mut t);
    assert_eq!(sim.client.connection(sim.ch).unwrap().close_reason(), None);
}

#[test]
fn a_restarted_keyed_server_resets_its_old_connections() {
    // the RESET of a restarted host carries the key's token, so it is taken
    let mut sim = keyed(Some(key(1)), Some(key(1)));
    sim.establish();
    sim.apply(Action::RestartServer);
    let mut t = Transfer::new(64 << 10, 0, 0, false);
    let limit = sim.now() + Duration::from_secs(2);
    sim.run_until(limit, |s| {
        t.pump(s);
        s.client.connection(s.ch).unwrap().state() == ConnectionState::Closed
    });
    assert_eq!(
        sim.client.connection(sim.ch).unwrap().close_reason(),
        Some(&ConnectionError::PeerRestarted)
    );
}

#[test]
fn keys_are_updated_on_a_long_connection() {
    let mut sim = keyed(Some(key(1)), Some(key(1)));
    sim.establish();
    for round in 1..=2u64 {
        // two minutes pass, with only keepalives on the links
        sim.advance(Duration::from_secs(121), |_| {});
        let c = sim.client.connection(sim.ch).unwrap().stats().key_updates;
        let s = sim.server_conn().stats().key_updates;
        assert_eq!((c, s), ((round, round), (round, round)), "client, server");
    }
    let mut t = Transfer::new(1 << 20, 1 << 20, 10, true);
    sim.complete_transfer(&mut t);
}

/// The driver seals what the engine built after it leaves the engine's lock, and opens what
/// it received before it takes it (`Seal`, `Openers`): both directions stay exact and sealed
/// through two key updates, and opening outside goes on under each new key.
#[test]
fn packets_sealed_and_opened_outside_the_engine_survive_key_updates() {
    let mut sim = Testbed::new(
        TestbedConfig::new(2)
            .with_buffers(256 << 10, 256 << 10)
            .with_keys(Some(key(1)), Some(key(1)))
            .with_opening_outside()
            .with_capture(Dir::AToB, Capture::last(2_000)),
    );
    sim.establish();
    // one transfer, moving for a while in each key generation
    let mut t = Transfer::new(48 << 20, 48 << 20, 100, true);
    for generation in 0..3u64 {
        let before = sim.opened_outside();
        if generation < 2 {
            sim.advance(Duration::from_millis(20), |s| t.pump(s));
        } else {
            sim.complete_transfer(&mut t);
        }
        assert!(
            sim.opened_outside() > before + 1000,
            "generation {generation}: {} datagrams opened outside the engine",
            sim.opened_outside() - before
        );
        if generation < 2 {
            // two minutes pass, with only keepalives on the links
            sim.advance(Duration::from_secs(125), |_| {});
            let c = sim.client.connection(sim.ch).unwrap().stats().key_updates;
            let s = sim.server_conn().stats().key_updates;
            let g = generation + 1;
            assert_eq!((c, s), ((g, g), (g, g)), "client, server");
        }
    }
    for (side, dropped) in [
        ("client", sim.client.dropped()),
        ("server", sim.server.dropped()),
    ] {
        assert_eq!(dropped.get(DropReason::Unauthenticated), 0, "{side}");
    }
    let plain: Vec<u8> = (0..4096).map(pattern).collect();
    for c in sim.captured(Dir::AToB) {
        for w in c.bytes.windows(32) {
            assert!(!plain.windows(32).any(|p| p == w), "plaintext on the wire");
        }
    }
}

/// A keyed pair on one link after 30 s of keepalives and their acknowledgements (short
/// packets), the client's first 1 000 datagrams captured.
fn keyed_keepalives() -> Testbed {
    let mut sim = Testbed::new(
        TestbedConfig::new(1)
            .with_keys(Some(key(1)), Some(key(1)))
            .with_capture(Dir::AToB, Capture::first(1_000)),
    );
    sim.establish();
    sim.advance(Duration::from_secs(30), |_| {});
    sim
}

/// An opened datagram is accepted only with its own proof, and an opener holds its key only
/// while the connection does.
#[test]
fn a_proof_of_opening_counts_for_its_own_packet_only() {
    let mut sim = keyed_keepalives();
    let mut packets = client_short_packets(&sim).into_iter().map(|c| c.bytes);
    let (first, second) = (packets.next().unwrap(), packets.next().unwrap());
    let mut openers = ri2n_proto::Openers::default();
    let (mut a, mut b) = (first.clone(), second.clone());
    assert!(openers.open(&mut a).is_none(), "nothing learned yet");
    openers.learn(&sim.server, &a);
    let proof_a = openers.open(&mut a).expect("opens under the server's key");
    let proof_b = openers.open(&mut b).expect("opens under the server's key");
    let (client, server) = sim.pairs()[0];
    let now = sim.instant();
    let unauthenticated = |s: &Testbed| s.server.dropped().get(DropReason::Unauthenticated);
    // each proof with the other packet: refused
    sim.server
        .handle_opened_datagram(now, server, client, &mut a.clone(), proof_b);
    sim.server
        .handle_opened_datagram(now, server, client, &mut b.clone(), proof_a);
    assert_eq!(unauthenticated(&sim), 2);
    // after two key updates the opener holds nothing that opens
    for _ in 0..2 {
        sim.advance(Duration::from_secs(125), |_| {});
    }
    assert_eq!(sim.server_conn().stats().key_updates.1, 2);
    let mut c = first.clone();
    assert!(openers.open(&mut c).is_none(), "the old key is gone");
    assert_eq!(c, first, "left unchanged");
}

/// A receiving thread holds each connection's key for a whole batch (`Openers::hold`), but a
/// key the receiver moved past meanwhile (the peer updated its key) opens nothing more, held
/// or not: the rest of the batch goes to the engine unchanged, which opens each packet with
/// the key its phase calls for. Before keys were marked retired, a held key went on opening,
/// and a packet of the next generation of its phase failed to open and was lost.
#[test]
fn a_held_key_the_receiver_moved_past_opens_nothing() {
    let mut sim = keyed_keepalives();
    let old = client_short_packets(&sim)[0].bytes.clone();
    let mut openers = ri2n_proto::Openers::default();
    openers.learn(&sim.server, &old);
    let mut held = openers.hold();
    assert!(held.open(&mut old.clone()).is_some(), "opens under the key");
    // a key update of the client's while the batch is being opened: the server keeps the
    // key `held` holds, as its previous one, for late packets
    sim.advance(Duration::from_secs(125), |_| {});
    assert_eq!(sim.server_conn().stats().key_updates.1, 1);
    let mut c = old.clone();
    assert!(held.open(&mut c).is_none(), "a retired key, though held");
    assert_eq!(c, old, "left unchanged");
    drop(held);
    assert!(
        openers.hold().open(&mut c).is_none(),
        "nor in the next batch"
    );
    assert_eq!(c, old, "left unchanged");
}

/// An off-path attacker sending from spoofed addresses (INITIALs without a cookie, with a
/// made-up one, with a keyed or plain hello; short packets with made-up connection IDs; a real
/// client's INITIAL replayed from other addresses) gets back at most three times what each
/// address sent, from a server with a key and from one without.
#[test]
fn answers_to_unproven_addresses_stay_within_three_times() {
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;
    use std::net::SocketAddr;
    for key in [None, Some(key(1))] {
        let mut sim = keyed(key.clone(), key.clone());
        // a real client's first INITIAL, to replay
        let mut buf = vec![0u8; 2048];
        let t = sim.client.poll_transmit(sim.instant(), &mut buf).unwrap();
        let real_initial = buf[..t.len].to_vec();
        let server_addr = sim.server_addrs()[0];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut received: HashMap<SocketAddr, u64> = HashMap::new();
        let mut sent: HashMap<SocketAddr, u64> = HashMap::new();
        for i in 0..20_000u32 {
            let from =
                SocketAddr::from(([10, 9, rng.gen(), rng.gen()], rng.gen_range(1024..65535)));
            let mut d = match i % 4 {
                0 => real_initial.clone(),
                1 | 2 => {
                    let token: Vec<u8> = (0..[0, 16][i as usize % 2]).map(|_| rng.gen()).collect();
                    let hello: Vec<u8> = (0..rng.gen_range(0..120)).map(|_| rng.gen()).collect();
                    let h = wire::Header::Initial {
                        scid: rng.gen::<u64>() | 1,
                        token: &token,
                        mode: rng.gen_range(0..2),
                        hello: &hello,
                    };
                    let mut b = vec![0u8; wire::control_packet_len(&h)];
                    wire::encode_control_packet(&h, &mut b);
                    b
                }
                _ => {
                    let mut b = vec![0u8; rng.gen_range(16..200)];
                    let mut w = Writer::new(&mut b);
                    wire::write_short_header(&mut w, rng.gen(), LinkId(0), 1, 0);
                    b
                }
            };
            *received.entry(from).or_default() += d.len() as u64;
            let now = sim.instant() + Duration::from_micros(u64::from(i) * 50);
            sim.server.handle_datagram(now, server_addr, from, &mut d);
            while let Some(t) = sim.server.poll_transmit(now, &mut buf) {
                *sent.entry(t.remote).or_default() += t.len as u64;
            }
        }
        let answered: u64 = sent.values().sum();
        assert!(answered > 0, "the server answered nothing");
        for (addr, &out) in &sent {
            let got = received.get(addr).copied().unwrap_or(0);
            assert!(
                out <= 3 * got,
                "{addr}: {out} bytes sent for {got} received"
            );
        }
        assert_eq!(
            sim.server.connection_count(),
            0,
            "state for unproven addresses"
        );
        // and a real client is served right after
        sim.establish();
        let mut t = Transfer::new(64 << 10, 64 << 10, 0, true);
        sim.complete_transfer(&mut t);
        println!(
            "key {}: {} bytes received from {} addresses, {answered} sent back",
            key.is_some(),
            received.values().sum::<u64>(),
            received.len()
        );
    }
}

/// An attacker on the path, seeing a connection's client address, sends the server an INITIAL
/// from that address with a valid cookie (it sees the RETRY) and a made-up handshake claiming
/// a new instance of the client. With a key it is refused; without one the server answers it,
/// but the running connection is untouched either way: a restart is believed only once the
/// new connection is confirmed. Without a key an attacker on the path can confirm it too (it
/// reads the ACCEPT), and then the old connection ends as a peer restart: nothing is
/// authenticated in clear (docs/PROTOCOL.md §11).
#[test]
fn a_forged_initial_does_not_end_a_keyed_connection() {
    for key in [Some(key(1)), None] {
        let mut sim = keyed(key.clone(), key.clone());
        sim.establish();
        let (server, client) = (sim.server_addrs()[0], sim.client_addrs()[0]);
        let params = wire::ClientParams {
            instance: 0xBAD,
            window: 1 << 20,
            cipher: 2,
            accepts: 3,
            application: Vec::new(),
        }
        .encode();
        let mode = if key.is_some() {
            wire::handshake_mode::NOISE_NNPSK0
        } else {
            wire::handshake_mode::PLAIN
        };
        let mut hello = params.clone();
        if key.is_some() {
            hello.resize(params.len() + 48, 7); // the shape of a Noise message, not one
        }
        let initial = |token: &[u8]| initial_packet(0xF0F0, token, mode, &hello);
        // what the server answers, read off the path
        let answers = |sim: &mut Testbed, d: &mut [u8]| {
            let now = sim.instant();
            sim.server.handle_datagram(now, server, client, d);
            let mut buf = vec![0u8; 2048];
            let mut out = Vec::new();
            while let Some(t) = sim.server.poll_transmit(now, &mut buf) {
                out.push(buf[..t.len].to_vec());
            }
            out
        };
        let retry = answers(&mut sim, &mut initial(&[]));
        let cookie = retry
            .iter()
            .find_map(|d| match wire::decode_packet(d) {
                Ok((wire::Header::Retry { token, .. }, _)) => Some(token.to_vec()),
                _ => None,
            })
            .expect("a RETRY");
        let answer = answers(&mut sim, &mut initial(&cookie));
        sim.advance(Duration::from_millis(50), |_| {});
        assert_eq!(
            sim.server_conn().close_reason(),
            None,
            "key {}",
            key.is_some()
        );
        if key.is_some() {
            assert!(
                answer.iter().all(|d| d[1] == wire::packet_type::REFUSE),
                "a forged keyed INITIAL was answered with more than a REFUSE"
            );
            assert_eq!(sim.server.connection_count(), 1);
            let mut t = Transfer::new(256 << 10, 256 << 10, 0, true);
            sim.complete_transfer(&mut t);
            continue;
        }
        // in clear: the ACCEPT names the new server connection; confirming it is believed
        let scid = answer
            .iter()
            .find_map(|d| match wire::decode_packet(d) {
                Ok((wire::Header::Accept { hello, .. }, _)) => {
                    Some(wire::ServerParams::decode(hello).unwrap().scid)
                }
                _ => None,
            })
            .expect("an ACCEPT");
        let mut d = [0u8; 64];
        let mut w = Writer::new(&mut d);
        wire::write_short_header(&mut w, scid, LinkId(0), 0, 0);
        w.u8(frame_type::PING);
        let len = w.finish();
        sim.inject(server, client, &d[..len]);
        assert_eq!(
            sim.server_conn().close_reason(),
            Some(&ConnectionError::PeerRestarted)
        );
    }
}
