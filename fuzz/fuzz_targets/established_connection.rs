//! An established connection (client and server `Endpoint`s in memory, two links, data moving
//! both ways) handed the fuzz input as datagrams from the client's side. Must not panic, spin on
//! a timer, or let the server's buffers or connection count grow past their bounds.
//!
//! Input: a sequence of chunks `[flags, len_hi, len_lo, bytes...]` (`len` cut to 1500 and to
//! what is left). Flags:
//! - bit 0: "make valid": the header is rewritten to VERSION / SHORT / the server connection's
//!   ID, so the datagram reaches the frame handling;
//! - bit 1: (with bit 0) also write the link byte of the address pair the datagram comes from;
//! - bits 2-3: the address pair: 0 and 1 the client's two links, 2 the first link's server
//!   address from a stranger, 3 the second link's server address from the first link's client
//!   address (a pair no link uses);
//! - bits 4-7: simulated time to let pass afterwards, in 250 µs steps.

#![no_main]

use std::net::SocketAddr;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use ri2n_proto::wire::{decode_packet, Header};
use ri2n_sim::testbed::{make_valid, Capture, Testbed, TestbedConfig, Transfer};
use ri2n_sim::Dir;

const MAX_DATAGRAMS: usize = 128;

fuzz_target!(|data: &[u8]| {
    let mut sim = Testbed::new(
        TestbedConfig::new(2)
            .with_buffers(64 << 10, 64 << 10)
            .with_capture(Dir::AToB, Capture::first(8)),
    );
    sim.establish();
    let mut t = Transfer::new(48_000, 24_000, 4, false);
    t.verify = false;
    sim.advance(Duration::from_millis(3), |s| t.pump(s));
    let cid = sim.server_cid().expect("server connection ID seen");
    let pairs = sim.pairs();
    let stranger: SocketAddr = "10.0.0.66:5000".parse().unwrap();
    let mut max_conns = 1;
    let mut rest = data;
    for _ in 0..MAX_DATAGRAMS {
        let [flags, hi, lo, tail @ ..] = rest else {
            break;
        };
        let len = (usize::from(*hi) << 8 | usize::from(*lo))
            .min(1500)
            .min(tail.len());
        let (bytes, next) = tail.split_at(len);
        rest = next;
        let (local, remote) = match (flags >> 2) & 3 {
            0 => pairs[0],
            1 => pairs[pairs.len() - 1],
            2 => (pairs[0].0, stranger),
            _ => (pairs[pairs.len() - 1].0, pairs[0].1),
        };
        let datagram = if flags & 1 != 0 {
            let link = (flags & 2 != 0).then(|| sim.link_id(local, remote).unwrap_or(0));
            make_valid(bytes, cid, link)
        } else {
            bytes.to_vec()
        };
        // only an INITIAL (with a valid cookie) may create a connection
        if matches!(decode_packet(&datagram), Ok((Header::Initial { .. }, _))) {
            max_conns += 1;
        }
        sim.inject(local, remote, &datagram);
        sim.check_bounds(max_conns);
        let dt = Duration::from_micros(250 * u64::from(flags >> 4));
        sim.advance(dt, |s| t.pump(s));
        sim.check_bounds(max_conns);
    }
    sim.advance(Duration::from_millis(5), |s| t.pump(s));
    sim.check_bounds(max_conns);
});
