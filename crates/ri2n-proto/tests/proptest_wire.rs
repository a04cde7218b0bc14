//! Property tests of the wire codec (`ri2n_proto::wire`): what is written decodes to exactly
//! what was written, a truncated datagram is rejected or reads as the frames it still holds
//! (never as different ones), and no input, however malformed, makes the decoder panic.
//! (Corruption on the wire is the UDP checksum's to catch: packets carry no checksum.)

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use proptest::prelude::*;
use ri2n_proto::wire::{
    self, decode_packet, encode_control_packet, packet_type, varint_len, write_ack, write_close,
    write_datagram, write_link_status, write_max_stream_data, write_short_header, write_stream,
    write_stream_header, ClientParams, DatagramPart, Frame, Frames, Header, Reader, ServerParams,
    Writer, MIN_INITIAL_SIZE, VARINT_MAX, VERSION,
};
use ri2n_proto::LinkId;

// ---------------------------------------------------------------------------------------------
// Strategies

/// Any varint value, with each encoded length equally likely and the boundaries favoured.
fn varint_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        0..=63u64,
        64..=16_383u64,
        16_384..=1_073_741_823u64,
        1_073_741_824..=VARINT_MAX,
        prop::sample::select(vec![
            0,
            63,
            64,
            16_383,
            16_384,
            1_073_741_823,
            1_073_741_824,
            VARINT_MAX - 1,
            VARINT_MAX,
        ]),
    ]
}

fn socket_addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port)),
        (any::<[u8; 16]>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port)),
    ]
}

/// An owned control packet header (anything but SHORT).
#[derive(Debug, Clone)]
enum Control {
    Initial {
        scid: u64,
        token: Vec<u8>,
        mode: u8,
        hello: Vec<u8>,
    },
    Retry {
        dcid: u64,
        token: Vec<u8>,
    },
    Accept {
        dcid: u64,
        mode: u8,
        hello: Vec<u8>,
    },
    Reset {
        dcid: u64,
        token: Option<[u8; 16]>,
    },
    Refuse {
        dcid: u64,
        reason: u8,
        detail: Vec<u8>,
    },
}

impl Control {
    fn header(&self) -> Header<'_> {
        match self {
            Control::Initial {
                scid,
                token,
                mode,
                hello,
            } => Header::Initial {
                scid: *scid,
                token,
                mode: *mode,
                hello,
            },
            Control::Retry { dcid, token } => Header::Retry { dcid: *dcid, token },
            Control::Accept { dcid, mode, hello } => Header::Accept {
                dcid: *dcid,
                mode: *mode,
                hello,
            },
            Control::Reset { dcid, token } => Header::Reset {
                dcid: *dcid,
                token: token.as_ref().map(|t| &t[..]),
            },
            Control::Refuse {
                dcid,
                reason,
                detail,
            } => Header::Refuse {
                dcid: *dcid,
                reason: *reason,
                detail,
            },
        }
    }
}

fn control() -> impl Strategy<Value = Control> {
    let token = || {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..=64),
            prop::collection::vec(any::<u8>(), 0..=1_000),
        ]
    };
    let hello = || prop::collection::vec(any::<u8>(), 0..=300);
    prop_oneof![
        (any::<u64>(), token(), any::<u8>(), hello()).prop_map(|(scid, token, mode, hello)| {
            Control::Initial {
                scid,
                token,
                mode,
                hello,
            }
        }),
        (any::<u64>(), token()).prop_map(|(dcid, token)| Control::Retry { dcid, token }),
        (any::<u64>(), any::<u8>(), hello()).prop_map(|(dcid, mode, hello)| Control::Accept {
            dcid,
            mode,
            hello
        }),
        (any::<u64>(), any::<Option<[u8; 16]>>())
            .prop_map(|(dcid, token)| Control::Reset { dcid, token }),
        (
            any::<u64>(),
            any::<u8>(),
            prop::collection::vec(any::<u8>(), 0..=wire::MAX_APPLICATION_LEN)
        )
            .prop_map(|(dcid, reason, detail)| Control::Refuse {
                dcid,
                reason,
                detail
            }),
    ]
}

fn client_params() -> impl Strategy<Value = ClientParams> {
    (
        any::<u64>(),
        varint_value(),
        any::<u8>(),
        any::<u8>(),
        prop::collection::vec(any::<u8>(), 0..=wire::MAX_APPLICATION_LEN),
    )
        .prop_map(
            |(instance, window, cipher, accepts, application)| ClientParams {
                instance,
                window,
                cipher,
                accepts,
                application,
            },
        )
}

fn server_params() -> impl Strategy<Value = ServerParams> {
    (
        any::<u64>(),
        any::<u64>(),
        varint_value(),
        any::<u8>(),
        any::<u8>(),
        prop::collection::vec(socket_addr(), 0..=ri2n_proto::MAX_LINKS),
    )
        .prop_map(
            |(scid, instance, window, cipher, accepts, addrs)| ServerParams {
                scid,
                instance,
                window,
                cipher,
                accepts,
                addrs,
            },
        )
}

/// How one frame is to be written into a short packet.
#[derive(Debug, Clone)]
enum Spec {
    /// `n` zero bytes.
    Padding(usize),
    Ping,
    Ack {
        link: u8,
        delay: u64,
        /// Disjoint, non-adjacent, highest first, each `(smallest, largest)`.
        ranges: Vec<(u64, u64)>,
        max_len: usize,
    },
    /// `write_stream` with an explicit length.
    Stream {
        stream: u8,
        offset: u64,
        fin: bool,
        data: Vec<u8>,
    },
    /// `write_stream_header` followed by the bytes.
    StreamHeader {
        stream: u8,
        offset: u64,
        fin: bool,
        data: Vec<u8>,
    },
    MaxStreamData {
        stream: u8,
        max: u64,
    },
    LinkStatus {
        link: u8,
        status: u8,
    },
    Datagram {
        seq: u64,
        part: DatagramPart,
        data: Vec<u8>,
    },
    Close {
        code: u64,
        reason: Vec<u8>,
        max_len: usize,
    },
}

/// ACK ranges: built upwards from a base with gaps of at least one missing number, then
/// reversed to highest first.
fn ack_ranges() -> impl Strategy<Value = Vec<(u64, u64)>> {
    let small = (
        0..1_000u64,
        prop::collection::vec((0..70u64, 0..70u64), 1..40),
    );
    let big = (
        prop_oneof![0..1u64 << 40, (VARINT_MAX >> 1)..=(VARINT_MAX >> 1) + 1_000],
        prop::collection::vec((0..1u64 << 35, 0..1u64 << 35), 1..12),
    );
    prop_oneof![small, big].prop_map(|(start, parts)| {
        let mut out = Vec::new();
        let mut lo = start;
        for (i, (gap, len)) in parts.into_iter().enumerate() {
            if i > 0 {
                lo += gap + 2; // previous largest + 1 is missing at least
            }
            let hi = lo + len;
            if hi > VARINT_MAX {
                break;
            }
            out.push((lo, hi));
            lo = hi;
        }
        out.reverse();
        out
    })
}

/// Stream offset and data such that `offset + len` stays a valid varint.
fn stream_piece() -> impl Strategy<Value = (u8, u64, bool, Vec<u8>)> {
    (
        0..wire::STREAMS,
        varint_value(),
        any::<bool>(),
        prop::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(s, off, fin, data)| (s, off.min(VARINT_MAX - data.len() as u64), fin, data))
}

fn spec() -> impl Strategy<Value = Spec> {
    prop_oneof![
        (1..40usize).prop_map(Spec::Padding),
        Just(Spec::Ping),
        (any::<u8>(), any::<u64>(), ack_ranges(), 0..400usize).prop_map(
            |(link, delay, ranges, max_len)| Spec::Ack {
                link,
                delay,
                ranges,
                max_len
            }
        ),
        stream_piece().prop_map(|(stream, offset, fin, data)| Spec::Stream {
            stream,
            offset,
            fin,
            data
        }),
        stream_piece().prop_map(|(stream, offset, fin, data)| Spec::StreamHeader {
            stream,
            offset,
            fin,
            data
        }),
        (0..wire::STREAMS, varint_value())
            .prop_map(|(stream, max)| Spec::MaxStreamData { stream, max }),
        (any::<u8>(), any::<u8>()).prop_map(|(link, status)| Spec::LinkStatus { link, status }),
        (
            varint_value(),
            prop::sample::select(vec![
                DatagramPart::Whole,
                DatagramPart::First,
                DatagramPart::Middle,
                DatagramPart::Last
            ]),
            prop::collection::vec(any::<u8>(), 0..1_500)
        )
            .prop_map(|(seq, part, data)| Spec::Datagram { seq, part, data }),
        (
            varint_value(),
            prop::collection::vec(any::<u8>(), 0..1_200),
            0..1_300usize
        )
            .prop_map(|(code, reason, max_len)| Spec::Close {
                code,
                reason,
                max_len
            }),
    ]
}

/// A short packet: header fields, frames, and optionally a final STREAM frame without length.
#[derive(Debug, Clone)]
struct ShortPacket {
    dcid: u64,
    link: u8,
    pn: u64,
    phase: u8,
    frames: Vec<Spec>,
    tail: Option<(u8, u64, bool, Vec<u8>)>,
}

fn short_packet() -> impl Strategy<Value = ShortPacket> {
    (
        any::<u64>(),
        any::<u8>(),
        varint_value(),
        0..=1u8,
        prop::collection::vec(spec(), 0..10),
        prop::option::of(stream_piece()),
    )
        .prop_map(|(dcid, link, pn, phase, frames, tail)| ShortPacket {
            dcid,
            link,
            pn,
            phase,
            frames,
            tail,
        })
}

// ---------------------------------------------------------------------------------------------
// Owned frames, for comparisons

#[derive(Debug, Clone, PartialEq, Eq)]
enum Owned {
    Padding,
    Ping,
    Ack {
        link: u8,
        largest: u64,
        delay_us: u64,
        ranges: Vec<(u64, u64)>,
    },
    Stream {
        stream: u8,
        offset: u64,
        fin: bool,
        data: Vec<u8>,
    },
    MaxStreamData {
        stream: u8,
        max: u64,
    },
    LinkStatus {
        link: u8,
        status: u8,
    },
    Datagram {
        seq: u64,
        part: DatagramPart,
        data: Vec<u8>,
    },
    Close {
        code: u64,
        reason: Vec<u8>,
    },
}

/// Most ACK ranges collected from one frame; a decoded frame cannot hold more than its bytes.
const MAX_RANGES: usize = 100_000;

fn owned(f: Frame<'_>) -> Owned {
    match f {
        Frame::Padding => Owned::Padding,
        Frame::Ping => Owned::Ping,
        Frame::Ack {
            link,
            largest,
            delay_us,
            ranges,
        } => Owned::Ack {
            link: link.0,
            largest,
            delay_us,
            ranges: ranges.take(MAX_RANGES).collect(),
        },
        Frame::Stream {
            stream,
            offset,
            fin,
            data,
        } => Owned::Stream {
            stream,
            offset,
            fin,
            data: data.to_vec(),
        },
        Frame::MaxStreamData { stream, max } => Owned::MaxStreamData { stream, max },
        Frame::LinkStatus { link, status } => Owned::LinkStatus {
            link: link.0,
            status,
        },
        Frame::Datagram { seq, part, data } => Owned::Datagram {
            seq,
            part,
            data: data.to_vec(),
        },
        Frame::Close { code, reason } => Owned::Close {
            code,
            reason: reason.to_vec(),
        },
    }
}

/// Size of an ACK frame carrying the first `k` (at least one) of `ranges`.
fn ack_size(delay: u64, ranges: &[(u64, u64)], k: usize) -> usize {
    let (lo, hi) = ranges[0];
    let mut size = 2 + varint_len(hi) + varint_len(delay) + varint_len(k as u64 - 1);
    size += varint_len(hi - lo);
    for w in ranges[..k].windows(2) {
        let (prev_lo, _) = w[0];
        let (l, h) = w[1];
        size += varint_len(prev_lo - h - 2) + varint_len(h - l);
    }
    size
}

/// Writes `p` and returns the datagram and the frames a decoder must find in it.
fn build_short(p: &ShortPacket) -> (Vec<u8>, Vec<Owned>) {
    let mut buf = vec![0u8; 1 << 16];
    let mut expected = Vec::new();
    let len = {
        let mut w = Writer::new(&mut buf);
        write_short_header(&mut w, p.dcid, LinkId(p.link), p.pn, p.phase);
        assert_eq!(w.len(), wire::SHORT_HEADER_FIXED + varint_len(p.pn));
        for f in &p.frames {
            let before = w.len();
            match f {
                Spec::Padding(n) => {
                    w.zeros(*n);
                    expected.push(Owned::Padding);
                }
                Spec::Ping => {
                    w.u8(wire::frame_type::PING);
                    expected.push(Owned::Ping);
                }
                Spec::Ack {
                    link,
                    delay,
                    ranges,
                    max_len,
                } => {
                    let delay = (*delay).min(VARINT_MAX);
                    let wrote = write_ack(
                        &mut w,
                        LinkId(*link),
                        delay,
                        ranges.iter().copied(),
                        *max_len,
                    );
                    let n = w.len() - before;
                    // the smallest conceivable frame with the first range (count in one byte)
                    let min_first = ack_size(delay, ranges, 1);
                    if !wrote {
                        assert_eq!(n, 0, "write_ack wrote bytes but returned false");
                        // it may keep one byte in reserve for the range count, no more
                        assert!(
                            min_first + 1 > *max_len,
                            "the first range ({min_first} bytes) fits {max_len} but was not written"
                        );
                        continue;
                    }
                    assert!(n <= *max_len, "ACK of {n} bytes exceeds max_len {max_len}");
                    // which prefix was written: the byte count tells
                    let k = (1..=ranges.len())
                        .find(|&k| ack_size(delay, ranges, k) == n)
                        .expect("written size matches some prefix of the ranges");
                    if k < ranges.len() {
                        // maximal, give or take the byte kept in reserve for the count
                        let next = ack_size(delay, ranges, k + 1);
                        assert!(
                            next + 1 > *max_len,
                            "{k} of {} ranges written in {n} bytes, but {} ranges take {next} \
                             of max_len {max_len}",
                            ranges.len(),
                            k + 1
                        );
                    }
                    expected.push(Owned::Ack {
                        link: *link,
                        largest: ranges[0].1,
                        delay_us: delay,
                        ranges: ranges[..k].to_vec(),
                    });
                }
                Spec::Stream {
                    stream,
                    offset,
                    fin,
                    data,
                } => {
                    write_stream(&mut w, *stream, *offset, *fin, data, true);
                    assert_eq!(
                        w.len() - before,
                        wire::stream_header_len(*offset, data.len(), true) + data.len()
                    );
                    expected.push(Owned::Stream {
                        stream: *stream,
                        offset: *offset,
                        fin: *fin,
                        data: data.clone(),
                    });
                }
                Spec::StreamHeader {
                    stream,
                    offset,
                    fin,
                    data,
                } => {
                    write_stream_header(&mut w, *stream, *offset, *fin, data.len());
                    assert_eq!(
                        w.len() - before,
                        wire::stream_header_len(*offset, data.len(), true)
                    );
                    w.slot(data.len()).copy_from_slice(data);
                    expected.push(Owned::Stream {
                        stream: *stream,
                        offset: *offset,
                        fin: *fin,
                        data: data.clone(),
                    });
                }
                Spec::MaxStreamData { stream, max } => {
                    write_max_stream_data(&mut w, *stream, *max);
                    assert!(w.len() - before <= 11);
                    expected.push(Owned::MaxStreamData {
                        stream: *stream,
                        max: *max,
                    });
                }
                Spec::LinkStatus { link, status } => {
                    write_link_status(&mut w, LinkId(*link), *status);
                    assert_eq!(w.len() - before, 3);
                    expected.push(Owned::LinkStatus {
                        link: *link,
                        status: *status,
                    });
                }
                Spec::Datagram { seq, part, data } => {
                    write_datagram(&mut w, *seq, *part, data, false);
                    assert_eq!(w.len() - before, wire::datagram_frame_len(*seq, data.len()));
                    expected.push(Owned::Datagram {
                        seq: *seq,
                        part: *part,
                        data: data.clone(),
                    });
                }
                Spec::Close {
                    code,
                    reason,
                    max_len,
                } => {
                    write_close(&mut w, *code, reason, *max_len);
                    let n = w.len() - before;
                    let fixed = 1 + varint_len(*code);
                    // the reason's length follows from the bytes written
                    let cut = (0..=reason.len().min(1000))
                        .rev()
                        .find(|&l| fixed + varint_len(l as u64) + l == n)
                        .expect("CLOSE size matches a prefix of the reason");
                    if *max_len >= fixed + 2 {
                        assert!(
                            n <= *max_len,
                            "CLOSE of {n} bytes exceeds max_len {max_len}"
                        );
                    }
                    if cut < reason.len().min(1000) {
                        // cut only as far as needed (up to the byte a 2-byte length reserves)
                        assert!(
                            n + 1 + 1 > *max_len,
                            "reason cut to {cut} bytes though {max_len} allow more"
                        );
                    }
                    expected.push(Owned::Close {
                        code: *code,
                        reason: reason[..cut].to_vec(),
                    });
                }
            }
        }
        if let Some((stream, offset, fin, data)) = &p.tail {
            let before = w.len();
            write_stream(&mut w, *stream, *offset, *fin, data, false);
            assert_eq!(
                w.len() - before,
                wire::stream_header_len(*offset, data.len(), false) + data.len()
            );
            expected.push(Owned::Stream {
                stream: *stream,
                offset: *offset,
                fin: *fin,
                data: data.clone(),
            });
        }
        let body = w.len();
        let len = w.finish();
        assert_eq!(len, body);
        len
    };
    buf.truncate(len);
    // adjacent padding runs read back as one PADDING frame
    expected.dedup_by(|a, b| *a == Owned::Padding && *b == Owned::Padding);
    (buf, expected)
}

fn encode_control(c: &Control) -> Vec<u8> {
    let mut buf = vec![0u8; 4096];
    let len = encode_control_packet(&c.header(), &mut buf);
    buf.truncate(len);
    buf
}

/// Decodes a short packet's frames; panics on a malformed one.
fn decode_frames(payload: &[u8]) -> Vec<Owned> {
    Frames::new(payload)
        .map(|f| owned(f.expect("valid frame")))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Checks shared by the robustness properties

/// Decodes arbitrary bytes; whatever is accepted must satisfy the codec's invariants and
/// survive re-encoding. Returns whether the datagram decoded.
fn check_any(datagram: &[u8]) -> bool {
    let Ok((header, payload)) = decode_packet(datagram) else {
        return false;
    };
    assert!(datagram.len() >= 2);
    match header {
        Header::Short {
            dcid,
            link,
            pn,
            phase,
        } => {
            assert!(pn <= VARINT_MAX);
            let mut frames = Vec::new();
            let mut it = Frames::new(payload);
            let mut count = 0;
            for f in it.by_ref() {
                count += 1;
                assert!(count <= payload.len(), "more frames than payload bytes");
                match f {
                    Ok(f) => frames.push(check_frame(f, payload.len())),
                    Err(_) => break,
                }
            }
            assert!(
                it.next().is_none(),
                "Frames goes on after an error or the end"
            );
            // what decoded re-encodes to the same frames
            if frames.iter().all(reencodable) {
                let mut buf = vec![0u8; 1 << 17];
                let mut w = Writer::new(&mut buf);
                write_short_header(&mut w, dcid, link, pn, phase);
                for f in &frames {
                    encode_owned(&mut w, f);
                }
                let len = w.finish();
                let (h2, p2) = decode_packet(&buf[..len]).expect("re-encoded packet decodes");
                assert_eq!(
                    h2,
                    Header::Short {
                        dcid,
                        link,
                        pn,
                        phase
                    }
                );
                assert_eq!(decode_frames(p2), frames, "re-encoded frames differ");
            }
        }
        ref h => {
            assert!(payload.is_empty(), "control packet with a payload");
            if let Header::Initial { .. } = h {
                assert!(datagram.len() >= MIN_INITIAL_SIZE);
            }
            let mut buf = vec![0u8; datagram.len().max(MIN_INITIAL_SIZE)];
            let len = encode_control_packet(h, &mut buf);
            assert!(len <= datagram.len().max(MIN_INITIAL_SIZE));
            let (h2, p2) = decode_packet(&buf[..len]).expect("re-encoded header decodes");
            assert_eq!(&h2, h);
            assert!(p2.is_empty());
        }
    }
    true
}

/// The invariants of one decoded frame; returns its owned form.
fn check_frame(f: Frame<'_>, payload_len: usize) -> Owned {
    match &f {
        Frame::Ack {
            largest, ranges, ..
        } => {
            let rs: Vec<(u64, u64)> = ranges.clone().take(payload_len + 2).collect();
            assert!(rs.len() <= payload_len, "more ACK ranges than bytes");
            assert!(!rs.is_empty(), "ACK without a range");
            assert_eq!(rs[0].1, *largest, "first range does not end at largest");
            for &(lo, hi) in &rs {
                assert!(lo <= hi, "ACK range ({lo}, {hi}) reversed");
            }
            for w in rs.windows(2) {
                assert!(
                    w[1].1 + 2 <= w[0].0,
                    "ACK ranges not descending with a gap: {rs:?}"
                );
            }
        }
        Frame::Stream {
            stream,
            offset,
            data,
            ..
        } => {
            assert!(*stream < wire::STREAMS);
            assert!(offset.checked_add(data.len() as u64).unwrap() <= VARINT_MAX);
        }
        Frame::MaxStreamData { stream, max } => {
            assert!(*stream < wire::STREAMS);
            assert!(*max <= VARINT_MAX);
        }
        Frame::Close { code, .. } => assert!(*code <= VARINT_MAX),
        Frame::Padding | Frame::Ping | Frame::LinkStatus { .. } | Frame::Datagram { .. } => {}
    }
    owned(f)
}

/// Whether the writers can reproduce `f` exactly (they cut CLOSE reasons at 1000 bytes and
/// write at most 16383 extra ACK ranges).
fn reencodable(f: &Owned) -> bool {
    match f {
        Owned::Close { reason, .. } => reason.len() <= 1000,
        Owned::Ack { ranges, .. } => ranges.len() <= 16_384,
        _ => true,
    }
}

fn encode_owned(w: &mut Writer<'_>, f: &Owned) {
    match f {
        Owned::Padding => w.u8(0),
        Owned::Ping => w.u8(wire::frame_type::PING),
        Owned::Ack {
            link,
            delay_us,
            ranges,
            ..
        } => assert!(write_ack(
            w,
            LinkId(*link),
            *delay_us,
            ranges.iter().copied(),
            usize::MAX / 2
        )),
        Owned::Stream {
            stream,
            offset,
            fin,
            data,
        } => write_stream(w, *stream, *offset, *fin, data, true),
        Owned::MaxStreamData { stream, max } => write_max_stream_data(w, *stream, *max),
        Owned::LinkStatus { link, status } => write_link_status(w, LinkId(*link), *status),
        Owned::Datagram { seq, part, data } => write_datagram(w, *seq, *part, data, false),
        Owned::Close { code, reason } => write_close(w, *code, reason, usize::MAX / 2),
    }
}

/// Bytes that look like frames: frame type bytes, varints of every length (also non-minimal
/// encodings), single bytes and byte runs, so the decoder's deeper paths are reached.
fn frame_soup() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        4 => prop::sample::select(vec![0x00u8, 0x01, 0x02, 0x04, 0x05, 0x06, 0x08, 0x09, 0x0a,
            0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x03, 0x07, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16,
            0x17, 0x18, 0xff])
            .prop_map(|b| vec![b]),
        4 => (0..4u32, any::<u64>()).prop_map(|(class, v)| {
            let len = 1usize << class;
            let v = v & (u64::MAX >> (64 - (8 * len - 2)));
            let full = v | ((class as u64) << (8 * len - 2));
            full.to_be_bytes()[8 - len..].to_vec()
        }),
        2 => any::<u8>().prop_map(|b| vec![b]),
        1 => prop::collection::vec(any::<u8>(), 0..40),
    ];
    prop::collection::vec(token, 0..60).prop_map(|ts| ts.concat())
}

// ---------------------------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn varint_round_trips(v in varint_value(), junk in prop::collection::vec(any::<u8>(), 0..4)) {
        let mut buf = [0u8; 12];
        let n = {
            let mut w = Writer::new(&mut buf);
            w.varint(v);
            w.len()
        };
        prop_assert_eq!(n, varint_len(v));
        prop_assert_eq!(1usize << (buf[0] >> 6), n, "length prefix");
        buf[n..n + junk.len()].copy_from_slice(&junk);
        let mut r = Reader::new(&buf[..n + junk.len()]);
        prop_assert_eq!(r.varint(), Ok(v));
        prop_assert_eq!(r.remaining(), junk.len());
        // every truncation is reported, never misread
        for cut in 0..n {
            prop_assert_eq!(Reader::new(&buf[..cut]).varint(), Err(wire::DecodeError::Truncated));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn control_packets_round_trip(c in control()) {
        let bytes = encode_control(&c);
        if let Control::Initial { .. } = c {
            prop_assert!(bytes.len() >= MIN_INITIAL_SIZE, "INITIAL padded to {} bytes", bytes.len());
        }
        let (h, payload) = decode_packet(&bytes).expect("decodes");
        prop_assert_eq!(h, c.header());
        prop_assert!(payload.is_empty());
        prop_assert_eq!(bytes[0], VERSION);
    }

    #[test]
    fn handshake_parameters_round_trip(c in client_params(), s in server_params()) {
        prop_assert_eq!(ClientParams::decode(&c.encode()), Ok(c.clone()));
        prop_assert_eq!(ServerParams::decode(&s.encode()), Ok(s.clone()));
        // one byte more or less is malformed
        let mut long = c.encode();
        long.push(0);
        prop_assert!(ClientParams::decode(&long).is_err());
        let short = s.encode();
        prop_assert!(ServerParams::decode(&short[..short.len() - 1]).is_err());
    }

    #[test]
    fn short_packets_round_trip(p in short_packet()) {
        let (bytes, expected) = build_short(&p);
        let (h, payload) = decode_packet(&bytes).expect("decodes");
        prop_assert_eq!(h, Header::Short { dcid: p.dcid, link: LinkId(p.link), pn: p.pn, phase: p.phase });
        prop_assert_eq!(decode_frames(payload), expected);
    }

    #[test]
    fn truncation_is_rejected_or_reads_the_frames_left(p in short_packet()) {
        let (bytes, expected) = build_short(&p);
        for cut in 0..bytes.len() {
            let Ok((h, payload)) = decode_packet(&bytes[..cut]) else {
                continue;
            };
            prop_assert_eq!(h, Header::Short { dcid: p.dcid, link: LinkId(p.link), pn: p.pn, phase: p.phase });
            // every frame but the last that decodes is an original one; the last may be cut
            // short only where a frame runs to the end of the packet (padding, stream data
            // without a length)
            let got: Vec<Owned> = Frames::new(payload).map_while(Result::ok).map(owned).collect();
            for (i, f) in got.iter().enumerate() {
                if i + 1 < got.len() {
                    prop_assert_eq!(f, &expected[i], "frame {} of a packet cut to {}", i, cut);
                } else {
                    match (f, &expected[i]) {
                        (Owned::Padding, Owned::Padding) => {}
                        (Owned::Stream { stream, offset, data, .. },
                         Owned::Stream { stream: s2, offset: o2, data: d2, .. }) => {
                            prop_assert!(stream == s2 && offset == o2 && d2.starts_with(data));
                        }
                        (f, e) => prop_assert_eq!(f, e),
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..1_600)) {
        check_any(&bytes);
        // the same bytes with a valid version
        if bytes.len() >= 2 {
            let mut b = bytes.clone();
            b[0] = VERSION;
            check_any(&b);
        }
    }

    #[test]
    fn well_formed_headers_with_junk_never_panic(
        kind in prop_oneof![
            4 => Just(packet_type::SHORT),
            1 => Just(packet_type::INITIAL),
            1 => Just(packet_type::RETRY),
            1 => Just(packet_type::ACCEPT),
            1 => Just(packet_type::RESET),
            1 => any::<u8>(),
        ],
        header in prop::collection::vec(any::<u8>(), 0..40),
        soup in frame_soup(),
        pad in prop_oneof![Just(0usize), 1_150..1_250usize],
    ) {
        let mut body = vec![VERSION, kind];
        if kind == packet_type::SHORT {
            // a well-formed short header, then frame-like bytes
            let mut h = [0u8; 20];
            let n = {
                let mut w = Writer::new(&mut h);
                let dcid = u64::from_le_bytes(header.iter().copied().chain([0; 8]).take(8).collect::<Vec<_>>().try_into().unwrap());
                write_short_header(&mut w, dcid, LinkId(header.first().copied().unwrap_or(0)), header.len() as u64, 0);
                w.len()
            };
            body.extend_from_slice(&h[2..n]);
        } else {
            body.extend_from_slice(&header);
        }
        body.extend_from_slice(&soup);
        if body.len() < pad {
            body.resize(pad, 0);
        }
        check_any(&body);
    }
}

/// The boundaries of every varint length, exhaustively around each edge.
#[test]
fn varint_boundaries() {
    for edge in [0u64, 64, 16_384, 1 << 30, VARINT_MAX] {
        for v in edge.saturating_sub(3)..=(edge + 3).min(VARINT_MAX) {
            let mut buf = [0u8; 8];
            let mut w = Writer::new(&mut buf);
            w.varint(v);
            let n = w.len();
            assert_eq!(n, varint_len(v));
            assert_eq!(Reader::new(&buf[..n]).varint(), Ok(v));
        }
    }
}

#[test]
#[should_panic(expected = "varint out of range")]
fn varint_above_max_is_refused() {
    let mut buf = [0u8; 8];
    Writer::new(&mut buf).varint(VARINT_MAX + 1);
}

/// A server's parameters with more than MAX_LINKS addresses are cut to MAX_LINKS by the
/// encoder.
#[test]
fn accept_addresses_are_capped() {
    let addrs: Vec<SocketAddr> = (0..12u16)
        .map(|i| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, i as u8)), 1000 + i))
        .collect();
    let p = ServerParams {
        scid: 2,
        instance: 3,
        window: 4,
        cipher: 1,
        accepts: 3,
        addrs: addrs.clone(),
    };
    let got = ServerParams::decode(&p.encode()).unwrap();
    assert_eq!(got.addrs, addrs[..ri2n_proto::MAX_LINKS]);
}

/// DATAGRAM_PART frames as bytes (docs/PROTOCOL.md §3): the position in the type's low bits,
/// the length present when the type has 0x04, else the piece running to the end.
#[test]
fn datagram_part_frames_as_bytes() {
    let mut buf = [0u8; 32];
    let mut w = Writer::new(&mut buf);
    write_datagram(&mut w, 5, DatagramPart::First, b"ab", false);
    write_datagram(&mut w, 6, DatagramPart::Middle, b"cd", false);
    write_datagram(&mut w, 7, DatagramPart::Last, b"efg", true);
    let n = w.len();
    let want = [
        0x15, 5, 2, b'a', b'b', // first, with length
        0x14, 6, 2, b'c', b'd', // between, with length
        0x12, 7, b'e', b'f', b'g', // last, to the end of the packet
    ];
    assert_eq!(&buf[..n], &want);
    assert_eq!(wire::datagram_frame_len_to_end(7, 3), 5);
    assert_eq!(
        decode_frames(&want),
        [
            Owned::Datagram {
                seq: 5,
                part: DatagramPart::First,
                data: b"ab".to_vec()
            },
            Owned::Datagram {
                seq: 6,
                part: DatagramPart::Middle,
                data: b"cd".to_vec()
            },
            Owned::Datagram {
                seq: 7,
                part: DatagramPart::Last,
                data: b"efg".to_vec()
            },
        ]
    );
    // position 3 is malformed, as is 0x07
    for bad in [[0x13, 1, 0], [0x17, 1, 0], [0x07, 1, 0]] {
        assert!(Frames::new(&bad).any(|f| f.is_err()), "{bad:?}");
    }
}

/// Version 5's handshake parameters and REFUSE as bytes (docs/PROTOCOL.md §4.1, §4.2): the
/// `accepts` bits after the cipher, the application name with a one-byte length, the refusal
/// detail likewise.
#[test]
fn application_and_accepts_bytes() {
    let p = ClientParams {
        instance: 0x0102_0304_0506_0708,
        window: 1 << 20,
        cipher: 2,
        accepts: 1,
        application: b"ri2n bench".to_vec(),
    };
    let mut want = vec![1, 2, 3, 4, 5, 6, 7, 8, 0x80, 0x10, 0x00, 0x00, 2, 1, 10];
    want.extend_from_slice(b"ri2n bench");
    assert_eq!(p.encode(), want);
    assert_eq!(ClientParams::decode(&want).unwrap(), p);
    let mut long = want[..14].to_vec();
    long.push(65);
    long.extend_from_slice(&[b'x'; 65]);
    assert!(ClientParams::decode(&long).is_err(), "a name over 64 bytes");

    let refuse = Header::Refuse {
        dcid: 9,
        reason: wire::refuse_reason::WRONG_APPLICATION,
        detail: b"ri2n bench",
    };
    let bytes = wire::control_packet(&refuse);
    let mut want = vec![
        wire::VERSION,
        wire::packet_type::REFUSE,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        9,
        5,
        10,
    ];
    want.extend_from_slice(b"ri2n bench");
    assert_eq!(bytes, want);
    assert_eq!(wire::decode_packet(&bytes).unwrap().0, refuse);
}
