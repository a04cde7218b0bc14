//! `wire::decode_packet` and the frame iterator on arbitrary bytes: no panic, and whatever is
//! accepted satisfies the codec's invariants. Each input is tried twice: as it is, and with the
//! version byte set, so the fuzzer reaches the header and frame parsers at once.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ri2n_proto::wire::{self, decode_packet, Frame, Frames, Header, VARINT_MAX, VERSION};

fn check(datagram: &[u8]) {
    let Ok((header, payload)) = decode_packet(datagram) else {
        return;
    };
    assert!(datagram.len() >= 2);
    let Header::Short { pn, .. } = header else {
        assert!(payload.is_empty(), "control packet with a payload");
        if let Header::Accept { hello, .. } = header {
            if let Ok(params) = ri2n_proto::wire::ServerParams::decode(hello) {
                assert!(params.addrs.len() <= ri2n_proto::MAX_LINKS);
            }
        }
        return;
    };
    assert!(pn <= VARINT_MAX);
    let mut frames = Frames::new(payload);
    let mut n = 0;
    for f in frames.by_ref() {
        n += 1;
        assert!(n <= payload.len(), "more frames than bytes");
        match f {
            Ok(Frame::Ack {
                largest, ranges, ..
            }) => {
                let mut prev_lo: Option<u64> = None;
                let mut count = 0;
                for (lo, hi) in ranges {
                    count += 1;
                    assert!(count <= payload.len(), "more ACK ranges than bytes");
                    assert!(lo <= hi && hi <= largest);
                    match prev_lo {
                        None => assert_eq!(hi, largest),
                        Some(p) => assert!(hi + 2 <= p, "ACK ranges overlap or touch"),
                    }
                    prev_lo = Some(lo);
                }
                assert!(count >= 1);
            }
            Ok(Frame::Stream {
                stream,
                offset,
                data,
                ..
            }) => {
                assert!(stream < wire::STREAMS);
                assert!(offset + data.len() as u64 <= VARINT_MAX);
            }
            Ok(Frame::MaxStreamData { stream, .. }) => assert!(stream < wire::STREAMS),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    assert!(frames.next().is_none(), "frames after an error");
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= 2 {
        let mut b = data.to_vec();
        b[0] = VERSION;
        check(&b);
    }
});
