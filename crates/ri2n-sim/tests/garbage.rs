//! Robustness of an established connection against garbage, in the default test suite (the
//! `established_connection` fuzz target does the same, undirected, under `cargo fuzz`).
//!
//! While a transfer runs both ways over two links, the server is handed seeded junk, truncated
//! and replayed copies of real packets, and well-formed packets that must still be dropped
//! whole (docs/PROTOCOL.md §2.7, §3.1); the transfer must complete exactly and the server's
//! memory stay bounded. A second test sends well-formed forgeries, which may disturb a transfer
//! without a key: it demands only no panic, no stuck timer and bounded memory.

use std::net::SocketAddr;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ri2n_proto::wire::{
    self, decode_packet, encode_control_packet, frame_type, handshake_mode, packet_type,
    ClientParams, Frames, Header, ServerParams, Writer, VARINT_MAX, VERSION,
};
use ri2n_proto::{ConnectionState, DropReason, LinkId};
use ri2n_sim::testbed::{make_valid, Testbed, TestbedConfig, Transfer};
use ri2n_sim::{Dir, HostId};

const JUNK: usize = 20_000;
const C2S: u64 = 4_000_000;
const S2C: u64 = 2_000_000;
const MESSAGES: u64 = 300;

/// Kinds of garbage, each of which a correct engine ignores entirely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Random bytes, sometimes with a valid version and packet type (then for another
    /// connection: junk with the right connection ID is a forgery, see the second test).
    Raw,
    /// A real client packet, delivered long ago, cut short.
    Truncated,
    /// A real client packet sent again as it was.
    Replayed,
    /// Right connection, link and address, but a malformed frame (after
    /// plausible, harmful frames): the packet must be dropped whole.
    Malformed,
    /// Unknown connection ID: answered with a RESET at most.
    WrongCid,
    /// Well-formed harmful frames under the packet number of a real packet already received.
    DuplicatePn,
    /// Well-formed harmful frames from the right address with the other link's link byte.
    WrongLink,
    /// Well-formed harmful frames from an address that is not the client's, on an existing link.
    ForgedAddress,
    /// Control packets (INITIAL, RETRY, ACCEPT, RESET for other connections).
    Control,
}

const KINDS: [Kind; 9] = [
    Kind::Raw,
    Kind::Truncated,
    Kind::Replayed,
    Kind::Malformed,
    Kind::WrongCid,
    Kind::DuplicatePn,
    Kind::WrongLink,
    Kind::ForgedAddress,
    Kind::Control,
];

fn random_varint(rng: &mut ChaCha8Rng) -> u64 {
    match rng.gen_range(0..4) {
        0 => rng.gen_range(0..64),
        1 => rng.gen_range(0..16_384),
        2 => rng.gen_range(0..1 << 30),
        _ => rng.gen_range(0..=VARINT_MAX),
    }
}

/// Writes a few well-formed frames that would do harm if acted on: forged stream data where the
/// receiver has not read yet, forged acknowledgements, a huge flow-control limit, a degraded-link
/// report, a CLOSE. `near` is an offset close to what the server has received.
fn harmful_frames(rng: &mut ChaCha8Rng, w: &mut Writer<'_>, near: u64, room: usize) {
    let end = w.len() + room;
    for _ in 0..rng.gen_range(1..6) {
        let left = end - w.len();
        if left < 40 {
            break;
        }
        match rng.gen_range(0..8) {
            0 => w.u8(frame_type::PING),
            1 => {
                let n = rng.gen_range(1..8).min(left);
                w.zeros(n);
                // a PING after padding keeps padding runs from merging with a zero trailer
                w.u8(frame_type::PING);
            }
            2 => {
                let largest = rng.gen_range(0..200_000u64);
                let first = rng.gen_range(0..=largest.min(5_000));
                let ranges = [(largest - first, largest)];
                wire::write_ack(
                    w,
                    LinkId(rng.gen_range(0..3)),
                    rng.gen_range(0..1_000),
                    ranges.into_iter(),
                    left,
                );
            }
            3 | 4 => {
                let len = rng.gen_range(1..200).min(left - 20);
                let offset = near + rng.gen_range(0..64 * 1024);
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                wire::write_stream(
                    w,
                    rng.gen_range(0..2),
                    offset,
                    rng.gen_bool(0.1),
                    &data,
                    true,
                );
            }
            5 => wire::write_max_stream_data(w, rng.gen_range(0..2), random_varint(rng)),
            6 => {
                wire::write_link_status(w, LinkId(rng.gen_range(0..2)), wire::link_status::DEGRADED)
            }
            _ => wire::write_close(w, rng.gen_range(0..100), b"forged close", left),
        }
    }
}

/// Writes one frame that makes the packet malformed. It is the last frame of the packet.
fn malformed_frame(rng: &mut ChaCha8Rng, w: &mut Writer<'_>, room: usize) {
    match rng.gen_range(0..7) {
        // a DATAGRAM type with nothing after it, or an unknown type
        0 => w.u8(*[0x03u8, 0x07].get(rng.gen_range(0..2)).unwrap()),
        1 => w.u8(rng.gen_range(0x18..=0xff)),
        // a STREAM frame claiming more bytes than the packet holds
        2 => {
            w.u8(frame_type::STREAM_BASE | frame_type::STREAM_LEN_BIT);
            w.varint(rng.gen_range(0..1000));
            w.varint(room as u64 + rng.gen_range(1..1000));
            w.bytes(&[0xab; 3]);
        }
        // an ACK range reaching below packet number 0
        3 => {
            w.u8(frame_type::ACK);
            w.u8(0);
            w.varint(5);
            w.varint(0);
            w.varint(0);
            w.varint(6 + rng.gen_range(0..100));
        }
        // MAX_STREAM_DATA for a stream that does not exist
        4 => {
            w.u8(frame_type::MAX_STREAM_DATA);
            w.u8(rng.gen_range(wire::STREAMS..=255));
            w.varint(1 << 40);
        }
        // a varint cut off by the end of the packet
        5 => {
            w.u8(frame_type::MAX_STREAM_DATA);
            w.u8(0);
            w.u8(0xc0);
            w.u8(0x01);
        }
        // a CLOSE whose reason runs past the end
        _ => {
            w.u8(frame_type::CLOSE);
            w.varint(1);
            w.varint(500 + room as u64);
            w.bytes(b"cut");
        }
    }
}

/// A short packet: header, then `body` writes the frames; returns the datagram.
fn short_packet(cid: u64, link: u8, pn: u64, body: impl FnOnce(&mut Writer<'_>, usize)) -> Vec<u8> {
    let mut buf = vec![0u8; 1472];
    let mut w = Writer::new(&mut buf);
    wire::write_short_header(&mut w, cid, LinkId(link), pn, 0);
    let room = w.remaining();
    body(&mut w, room);
    let len = w.finish();
    buf.truncate(len);
    buf
}

fn payload_is_malformed(datagram: &[u8]) -> bool {
    match decode_packet(datagram) {
        Ok((Header::Short { .. }, payload)) => Frames::new(payload).any(|f| f.is_err()),
        _ => true,
    }
}

struct Junk {
    rng: ChaCha8Rng,
    counts: [u64; KINDS.len()],
    stranger: SocketAddr,
}

impl Junk {
    /// One garbage datagram of a random kind: (kind, server address, source address, bytes).
    fn next(&mut self, sim: &Testbed, t: &Transfer) -> (Kind, SocketAddr, SocketAddr, Vec<u8>) {
        let rng = &mut self.rng;
        let cid = sim.server_cid().expect("server connection ID known");
        let pairs = sim.pairs();
        let (local, remote) = pairs[rng.gen_range(0..pairs.len())];
        let link = sim.link_id(local, remote).unwrap();
        let kind = KINDS[rng.gen_range(0..KINDS.len())];
        let real = &sim.captured(Dir::AToB)[rng.gen_range(0..sim.captured(Dir::AToB).len())];
        let bytes = match kind {
            Kind::Raw => {
                let mut b: Vec<u8> = (0..rng.gen_range(0..1500)).map(|_| rng.gen()).collect();
                if b.len() >= 11 && rng.gen_bool(0.5) {
                    b[0] = VERSION;
                    b[1] = [packet_type::SHORT, packet_type::INITIAL, packet_type::RESET]
                        [rng.gen_range(0..3)];
                    let other = cid ^ rng.gen_range(1..=u64::MAX);
                    b[2..10].copy_from_slice(&other.to_be_bytes());
                }
                b
            }
            Kind::Truncated => {
                let delivered: Vec<_> = sim
                    .captured(Dir::AToB)
                    .iter()
                    .filter(|c| c.at + Duration::from_millis(5) < sim.now())
                    .collect();
                if delivered.is_empty() {
                    return (Kind::Raw, local, remote, vec![0; 20]);
                }
                let old = delivered[rng.gen_range(0..delivered.len())];
                let b = &old.bytes;
                return (
                    kind,
                    old.local,
                    old.remote,
                    b[..rng.gen_range(0..b.len())].to_vec(),
                );
            }
            Kind::Replayed => {
                return (kind, real.local, real.remote, real.bytes.clone());
            }
            Kind::Malformed => loop {
                let pn = random_varint(rng);
                let near = t.got_s;
                let b = short_packet(cid, link, pn, |w, room| {
                    let start = w.len();
                    harmful_frames(rng, w, near, room - 64);
                    malformed_frame(rng, w, room - (w.len() - start));
                });
                // the premise of this kind: the decoder rejects some frame of the payload
                if payload_is_malformed(&b) {
                    break b;
                }
            },
            Kind::WrongCid => {
                let mut other: u64 = rng.gen();
                if other == cid {
                    other ^= 1;
                }
                if rng.gen_bool(0.5) {
                    // a real packet re-addressed to another connection
                    make_valid(&real.bytes, other, None)
                } else {
                    // random frames for a random connection
                    let junk: Vec<u8> = (0..rng.gen_range(0..200)).map(|_| rng.gen()).collect();
                    make_valid(&junk, other, Some(link))
                }
            }
            Kind::DuplicatePn => {
                // a real short packet old enough to have arrived long ago
                let old: Vec<_> = sim
                    .captured(Dir::AToB)
                    .iter()
                    .filter(|c| c.at + Duration::from_millis(5) < sim.now())
                    .filter_map(|c| match decode_packet(&c.bytes) {
                        Ok((Header::Short { link, pn, .. }, _)) => {
                            Some((c.local, c.remote, link, pn))
                        }
                        _ => None,
                    })
                    .collect();
                if old.is_empty() {
                    return (Kind::Raw, local, remote, vec![0; 20]);
                }
                let (l, r, link, pn) = old[rng.gen_range(0..old.len())];
                let near = t.got_s;
                let b = short_packet(cid, link.0, pn, |w, room| {
                    harmful_frames(rng, w, near, room)
                });
                return (kind, l, r, b);
            }
            Kind::WrongLink | Kind::ForgedAddress => {
                let pn = random_varint(rng);
                let near = t.got_s;
                let (link, src) = if kind == Kind::WrongLink {
                    // any link byte but the pair's own and the next free index (which opens a link)
                    let mut l = rng.gen_range(0..ri2n_proto::MAX_LINKS as u8);
                    while l == link || l as usize == pairs.len() {
                        l = rng.gen_range(0..ri2n_proto::MAX_LINKS as u8);
                    }
                    (l, remote)
                } else {
                    (link, self.stranger)
                };
                let b = short_packet(cid, link, pn, |w, room| harmful_frames(rng, w, near, room));
                return (kind, local, src, b);
            }
            Kind::Control => {
                let token: Vec<u8> = (0..rng.gen_range(0..40)).map(|_| rng.gen()).collect();
                let client = ClientParams {
                    instance: rng.gen(),
                    window: 1 << 20,
                    cipher: 2,
                    accepts: rng.gen(),
                    application: b"ri2n file transfer".to_vec(),
                }
                .encode();
                let server = ServerParams {
                    scid: rng.gen(),
                    instance: rng.gen(),
                    window: 1 << 20,
                    cipher: 2,
                    accepts: rng.gen(),
                    addrs: vec![local, remote],
                }
                .encode();
                let h = match rng.gen_range(0..4) {
                    0 => Header::Initial {
                        scid: rng.gen(),
                        token: &token,
                        mode: handshake_mode::PLAIN,
                        hello: &client,
                    },
                    1 => Header::Retry {
                        dcid: cid,
                        token: &token,
                    },
                    2 => Header::Accept {
                        dcid: cid,
                        mode: handshake_mode::PLAIN,
                        hello: &server,
                    },
                    // a RESET for our connection, but from an address it does not talk to
                    _ => {
                        let mut buf = vec![0u8; 64];
                        let reset = Header::Reset {
                            dcid: cid,
                            token: None,
                        };
                        let n = encode_control_packet(&reset, &mut buf);
                        buf.truncate(n);
                        return (kind, local, self.stranger, buf);
                    }
                };
                let mut buf = vec![0u8; 1500];
                let n = encode_control_packet(&h, &mut buf);
                buf.truncate(n);
                buf
            }
        };
        (kind, local, remote, bytes)
    }
}

#[test]
fn established_connection_ignores_garbage_during_transfer() {
    for seed in 1..=3 {
        garbage_during_transfer(seed);
    }
}

fn garbage_during_transfer(seed: u64) {
    let mut sim = Testbed::new(
        TestbedConfig::new(2)
            .with_buffers(512 << 10, 512 << 10)
            .with_seed(seed),
    );
    sim.establish();
    let mut t = Transfer::new(C2S, S2C, MESSAGES, true);
    // some traffic first, so real packets of both links are captured
    sim.advance(Duration::from_millis(5), |s| t.pump(s));
    assert_eq!(sim.pairs().len(), 2, "both links carry traffic");
    let mut junk = Junk {
        rng: ChaCha8Rng::seed_from_u64(0x6a72_6167 ^ seed),
        counts: [0; KINDS.len()],
        stranger: "10.0.0.66:5000".parse().unwrap(),
    };
    let mut injected = 0usize;
    let mut junk_done_at = None;
    let limit = Duration::from_secs(60);
    while !t.complete(&sim) {
        assert!(
            sim.now() < limit,
            "seed {seed}: transfer hung: after {:?} simulated, {}/{} bytes and {}/{} messages reached the \
             server, {}/{} bytes the client; server state {:?}, client state {:?}; junk sent {injected}",
            sim.now(),
            t.got_s,
            C2S,
            t.msgs_got,
            MESSAGES,
            t.got_c,
            S2C,
            sim.server_conn().state(),
            sim.client.connection(sim.ch).map(|c| c.state())
        );
        if let Some(e) = &t.lost {
            panic!("seed {seed}: connection lost during the transfer: {e}");
        }
        // junk keeps pace with the transfer and is all sent by three quarters of it
        let progress = (t.got_s + t.got_c) as f64 / (C2S + S2C) as f64;
        let due = ((JUNK as f64 * progress / 0.75) as usize + 4).min(JUNK);
        while injected < due {
            let (kind, local, remote, bytes) = junk.next(&sim, &t);
            junk.counts[KINDS.iter().position(|&k| k == kind).unwrap()] += 1;
            sim.inject(local, remote, &bytes);
            injected += 1;
            sim.check_bounds(1);
        }
        if injected == JUNK && junk_done_at.is_none() {
            junk_done_at = Some(progress);
        }
        sim.advance(Duration::from_micros(200), |s| t.pump(s));
        sim.check_bounds(1);
    }
    let server = sim.server_conn();
    assert_eq!(t.corrupted, 0);
    assert_eq!(server.close_reason(), None, "server connection failed");
    assert!(matches!(
        server.state(),
        ConnectionState::Established | ConnectionState::Draining | ConnectionState::Closed
    ));
    let done = junk_done_at.expect("all junk was sent before the transfer completed");
    assert!(done < 1.0, "junk finished at progress {done}");
    // the datagrams that had to be answered or forgotten did not leave state behind
    let stats = server.stats();
    assert_eq!(stats.links.len(), 2, "no link was added by garbage");
    // every kind of garbage was dropped for its own reason, and counted
    let dropped = sim.server.dropped();
    for reason in [
        DropReason::Undecodable,
        DropReason::UnknownConnection,
        DropReason::UnexpectedHandshake,
        DropReason::MalformedFrame,
        DropReason::UnknownLink,
        DropReason::Duplicate,
    ] {
        assert!(
            dropped.get(reason) > 0,
            "no drop counted as {reason:?}: {dropped:?}"
        );
    }
    eprintln!(
        "seed {seed}: dropped {:?}",
        dropped.iter().collect::<Vec<_>>()
    );
    eprintln!(
        "seed {seed}: {injected} garbage datagrams {:?}, all sent by {:.0}% of the transfer, which took {:?} \
         simulated; {} answers to strangers dropped",
        KINDS.iter().zip(junk.counts).collect::<Vec<_>>(),
        done * 100.0,
        sim.now(),
        sim.unrouted(HostId::B)
    );
}

/// Well-formed forged packets (valid frames, right connection, link and address, fresh packet
/// numbers). Without authentication the engine cannot tell them from the peer's own, so the
/// transfer may suffer; but the engine must not panic, spin on a timer or grow its memory.
/// Forgeries a live connection must end on (a CLOSE, an end of stream below what arrived,
/// message-stream bytes beyond its window) are left out, and the connection must live to the
/// end: before, the third forgery ended it, and the rest met a closed connection.
#[test]
fn well_formed_forgeries_keep_memory_bounded() {
    let mut sim = Testbed::new(TestbedConfig::new(2).with_buffers(256 << 10, 256 << 10));
    sim.establish();
    let mut t = Transfer::new(1_000_000, 1_000_000, 50, false);
    sim.advance(Duration::from_millis(5), |s| t.pump(s));
    let mut rng = ChaCha8Rng::seed_from_u64(0x666f_7267);
    let cid = sim.server_cid().unwrap();
    let pairs = sim.pairs();
    let mut injected = 0;
    for i in 0..5_000 {
        let (local, remote) = pairs[rng.gen_range(0..pairs.len())];
        let link = sim.link_id(local, remote).unwrap();
        let pn = if rng.gen_bool(0.9) {
            // near the packet numbers in use
            sim.server_conn().stats().links[link as usize].packets_received + rng.gen_range(0..64)
        } else {
            random_varint(&mut rng)
        };
        let near = t.got_s;
        let b = short_packet(cid, link, pn, |w, room| {
            harmful_frames(&mut rng, w, near, room)
        });
        // nothing that would simply end the connection
        let (_, payload) = decode_packet(&b).unwrap();
        let ends = |f: &wire::Frame<'_>| match f {
            wire::Frame::Close { .. } => true,
            wire::Frame::Stream { stream, fin, .. } => *stream != 0 || *fin,
            _ => false,
        };
        if Frames::new(payload).any(|f| f.as_ref().map_or(true, ends)) {
            continue;
        }
        sim.inject(local, remote, &b);
        injected += 1;
        sim.check_bounds(1);
        if i % 8 == 0 {
            sim.advance(Duration::from_micros(100), |s| t.pump(s));
            sim.check_bounds(1);
        }
    }
    // let the dust settle: the engine must keep running without spinning
    sim.advance(Duration::from_secs(2), |s| t.pump(s));
    sim.check_bounds(1);
    eprintln!(
        "forgeries: transfer {}/{} and {}/{} bytes, {} messages, {} corrupted bytes, lost: {:?}, \
         server {:?} ({:?}), client {:?}",
        t.got_s,
        t.c2s,
        t.got_c,
        t.s2c,
        t.msgs_got,
        t.corrupted,
        t.lost,
        sim.server_conn().state(),
        sim.server_conn().close_reason(),
        sim.client.connection(sim.ch).map(|c| c.state()),
    );
    assert!(injected > 1_000, "only {injected} forgeries injected");
    assert_eq!(
        sim.server_conn().state(),
        ConnectionState::Established,
        "the forgeries met a live connection: {:?}",
        sim.server_conn().close_reason()
    );
}

/// A single forged short packet (right connection ID, link and address, only a
/// PING) with a packet number far ahead must not stall the link: were it recorded, every later
/// ACK would claim a packet never sent and be ignored, and nothing on the link would be
/// acknowledged again. Receivers reject packet numbers that jump further than any window.
#[test]
fn forged_high_packet_number_does_not_stall_the_link() {
    let mut sim = Testbed::new(TestbedConfig::new(1).with_buffers(256 << 10, 256 << 10));
    sim.establish();
    let mut t = Transfer::new(2_000_000, 0, 0, true);
    sim.advance(Duration::from_millis(5), |s| t.pump(s));
    let cid = sim.server_cid().unwrap();
    let (local, remote) = sim.pairs()[0];
    let b = short_packet(cid, 0, 1 << 40, |w, _| w.u8(frame_type::PING));
    sim.inject(local, remote, &b);
    let limit = sim.now() + Duration::from_secs(10);
    while !t.complete(&sim) && sim.now() < limit {
        sim.advance(Duration::from_millis(10), |s| t.pump(s));
    }
    let client = sim.client.connection(sim.ch).unwrap();
    assert!(
        t.complete(&sim),
        "transfer stalled: {}/{} bytes after 10 s; client {:?}, its links {:?}",
        t.got_s,
        t.c2s,
        client.state(),
        client.link_states()
    );
}

/// A forged PING numbered 2^20 - 1, inside the window a packet number may jump, is taken by the
/// receiver as its largest and acknowledged. The sender must not take that acknowledgement of
/// a number it never sent as its largest acknowledged: every packet sent since would be
/// declared lost at once, and the transfer would crawl for good.
#[test]
fn forged_packet_number_inside_the_jump_window_does_not_stall_the_link() {
    let mut sim = Testbed::new(TestbedConfig::new(1).with_buffers(256 << 10, 256 << 10));
    sim.establish();
    let mut t = Transfer::new(20_000_000, 0, 0, true);
    sim.advance(Duration::from_millis(5), |s| t.pump(s));
    let cid = sim.server_cid().unwrap();
    let (local, remote) = sim.pairs()[0];
    let b = short_packet(cid, 0, (1 << 20) - 1, |w, _| w.u8(frame_type::PING));
    sim.inject(local, remote, &b);
    let start = sim.now();
    let limit = sim.now() + Duration::from_secs(10);
    while !t.complete(&sim) && sim.now() < limit {
        sim.advance(Duration::from_millis(10), |s| t.pump(s));
    }
    let client = sim.client.connection(sim.ch).unwrap();
    let lost: u64 = client.stats().links.iter().map(|l| l.packets_lost).sum();
    assert!(
        t.complete(&sim),
        "transfer stalled: {}/{} bytes after 10 s; {lost} packets declared lost; {:?}",
        t.got_s,
        t.c2s,
        client.stats().links,
    );
    println!(
        "completed {:?} after the forgery; {lost} packets declared lost",
        sim.now() - start
    );
    assert!(lost < 100, "{lost} packets declared lost");
}

/// A flood of short packets with made-up connection IDs from spoofed sources, 100 000 in one
/// second: the endpoint answers at most its RESET budget (1000 per second and a burst of 100),
/// not one RESET (one send) per datagram; a peer that really lost its connection still gets
/// one at once.
#[test]
fn unknown_connection_flood_is_answered_at_a_bounded_rate() {
    let local: SocketAddr = "10.0.0.2:6000".parse().unwrap();
    let start = std::time::Instant::now();
    let mut ep = ri2n_proto::Endpoint::new(
        ri2n_proto::EndpointConfig::new(vec![local]).server(),
        7,
        start,
    );
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut buf = vec![0u8; 1500];
    let mut resets = 0u64;
    let flood = 100_000u32;
    for i in 0..flood {
        let now = start + Duration::from_secs(1) * i / flood;
        let remote = SocketAddr::from(([10, 9, rng.gen(), rng.gen()], rng.gen_range(1024..65535)));
        let mut d = short_packet(rng.gen(), 0, 1, |w, _| {
            for _ in 0..8 {
                w.u8(frame_type::PADDING);
            }
            w.u8(frame_type::PING);
        });
        ep.handle_datagram(now, local, remote, &mut d);
        while ep.poll_transmit(now, &mut buf).is_some() {
            resets += 1;
        }
    }
    println!("{flood} short packets for unknown connections in 1 s: {resets} RESETs sent");
    assert!(
        resets >= 100,
        "a lost peer must still get its RESET: {resets}"
    );
    assert!(resets <= 1_100, "{resets} RESETs for {flood} datagrams");
}

/// A peer (or anyone who knows the connection ID, until channels are authenticated) sends
/// 1-byte STREAM frames at scattered offsets inside the window. Each would be an out-of-order
/// fragment with its own bookkeeping, unbounded by the window's bytes; the receiver holds at
/// most 4096 per stream, drops the rest unacknowledged, and the real transfer completes.
#[test]
fn scattered_one_byte_frames_keep_reassembly_bookkeeping_bounded() {
    scattered_one_byte_frames(1);
}

/// The same with 100 frames in each packet: a packet is judged by all its frames together,
/// so the frames of one packet cannot all pass the bound at once (each was judged alone
/// before, and one packet took a stream 99 fragments past it).
#[test]
fn scattered_frames_packed_in_one_packet_keep_the_same_bound() {
    scattered_one_byte_frames(100);
}

/// Injects 50 000 one-byte STREAM frames at scattered offsets, `per_packet` in each packet,
/// beside a real transfer; checks the bound on fragments and that the transfer completes.
fn scattered_one_byte_frames(per_packet: u64) {
    let mut sim = Testbed::new(TestbedConfig::new(1).with_buffers(8 << 20, 8 << 20));
    sim.establish();
    // long enough to outlast the flood: once the client's streams end, the forged data past
    // the message stream's end ends the connection, and the rest of the flood is not read
    let mut t = Transfer::new(20_000_000, 0, 0, true);
    sim.advance(Duration::from_millis(2), |s| t.pump(s));
    let cid = sim.server_cid().unwrap();
    let (local, remote) = sim.pairs()[0];
    let link = sim.link_id(local, remote).unwrap();
    let mut most = 0;
    for k in 0..50_000 / per_packet {
        // numbers the real packets will not reach (the jump window allows 2^20): a forged
        // packet that took a real one's number would have that one dropped as a duplicate
        let pn = (1 << 19) + k;
        let b = short_packet(cid, link, pn, |w, _| {
            for j in 0..per_packet {
                // far enough ahead of the real data not to be overwritten by it soon, inside
                // the window
                let offset = 4_000_000 + 2 * (k * per_packet + j);
                // on the message stream, which this transfer does not use: its end of the
                // byte stream must not fall below the forged data (a protocol violation)
                wire::write_stream_header(w, 1, offset, false, 1);
                w.u8(b'x');
            }
        });
        sim.inject(local, remote, &b);
        most = most.max(sim.server_conn().stats().recv_fragments);
        if k % (64 / per_packet).max(1) == 0 {
            sim.advance(Duration::from_micros(100), |s| t.pump(s));
        }
    }
    // the byte stream arrives whole (the connection itself cannot end cleanly: its message
    // stream holds forged data past the end the client gives it)
    let limit = sim.now() + Duration::from_secs(10);
    while t.got_s < t.c2s && sim.now() < limit {
        sim.advance(Duration::from_millis(10), |s| t.pump(s));
    }
    let dropped = sim.server.dropped().get(DropReason::TooFragmented);
    println!(
        "50 000 scattered 1-byte frames, {per_packet} a packet: at most {most} fragments held, \
         {dropped} packets dropped"
    );
    assert!(most <= 4096, "{most} fragments held");
    assert!(
        most + per_packet as usize > 4096,
        "the frames were not taken up to the bound ({most}): the test tests nothing"
    );
    assert_eq!(t.got_s, t.c2s, "the byte stream did not arrive whole");
    assert_eq!(t.corrupted, 0, "corrupted bytes");
}

/// 1 000 clients from one IP address complete the handshake (cookie and all) but never confirm
/// it (their short packets are lost): the server holds at most its per-address limit of
/// connections, and the clients beyond it are refused at once with `ServerFull`.
#[test]
fn unconfirmed_connections_from_one_address_are_bounded() {
    let server_addr: SocketAddr = "10.0.0.2:6000".parse().unwrap();
    let start = std::time::Instant::now();
    let mut server = ri2n_proto::Endpoint::new(
        // the default limit: 256 connections per client address
        ri2n_proto::EndpointConfig::new(vec![server_addr]).server(),
        1,
        start,
    );
    let mut clients: Vec<(ri2n_proto::Endpoint, ri2n_proto::ConnectionHandle)> = (0..1_000u16)
        .map(|i| {
            let addr = SocketAddr::from(([10, 0, 0, 1], 20_000 + i));
            let mut ep = ri2n_proto::Endpoint::new(
                ri2n_proto::EndpointConfig::new(vec![addr]),
                u64::from(i) + 2,
                start,
            );
            let h = ep
                .connect(
                    start,
                    &[server_addr],
                    ri2n_proto::ConnectionConfig::default(),
                )
                .unwrap();
            (ep, h)
        })
        .collect();
    let mut buf = vec![0u8; 2048];
    let mut answer = vec![0u8; 2048];
    // one simulated second in 5 ms steps: handshakes, their retries, and the refusals (RESETs
    // come at most 1000 per second)
    for round in 0..200u64 {
        let now = start + Duration::from_millis(5 * round);
        for i in 0..clients.len() {
            clients[i].0.handle_timeout(now);
            while let Some(t) = clients[i].0.poll_transmit(now, &mut buf) {
                // the handshake gets through; the confirmation (a short packet) never does
                if buf[1] == packet_type::SHORT {
                    continue;
                }
                server.handle_datagram(now, server_addr, t.local, &mut buf[..t.len]);
                while let Some(a) = server.poll_transmit(now, &mut answer) {
                    let to = usize::from(a.remote.port() - 20_000);
                    clients[to]
                        .0
                        .handle_datagram(now, a.remote, server_addr, &mut answer[..a.len]);
                }
            }
        }
    }
    let refused = clients
        .iter()
        .filter(|(ep, h)| {
            ep.connection(*h)
                .and_then(|c| c.close_reason())
                .is_some_and(|r| *r == ri2n_proto::ConnectionError::ServerFull)
        })
        .count();
    println!(
        "1 000 unconfirmed clients from one address: the server holds {} connections, {refused} \
         clients were refused",
        server.connection_count()
    );
    assert!(
        server.connection_count() <= 256,
        "{}",
        server.connection_count()
    );
    assert!(refused >= 700, "{refused} clients refused");
}
