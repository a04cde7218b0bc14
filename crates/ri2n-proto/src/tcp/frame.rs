//! The bytes a TCP link carries (docs/PROTOCOL.md §12.2): a hello exchange when the TCP
//! connection opens, then in each direction a sequence of records, each a one-byte type and
//! fixed fields, big-endian. A run's or repair's payload follows its record on the wire; the
//! parser returns the record and leaves the payload to the caller, which reads it straight
//! into the receive buffer.
//!
//! Parsing never panics: a buffer too short for a record gives `Ok(None)` (read more), and
//! anything malformed an error that ends the link.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The first bytes a client sends on every TCP link: a program that speaks anything else is
/// answered with nothing and closed.
pub const MAGIC: [u8; 8] = *b"ri2n-tcp";
/// The version of this framing.
pub const VERSION: u8 = 2;
/// Longest application name a hello carries.
pub const MAX_APPLICATION: usize = 255;
/// Most addresses a server announces.
pub const MAX_ADDRS: usize = 16;
/// Longest run or repair payload a record announces (the receiver refuses longer ones, so a
/// corrupt length cannot make it allocate gigabytes).
pub const MAX_RUN: u32 = 4 << 20;
/// Longest close reason, in bytes.
pub const MAX_REASON: usize = 1024;

/// `reason` cut to at most [`MAX_REASON`] bytes on a character's boundary, so that what a
/// CLOSE carries stays UTF-8.
pub fn close_reason(reason: &str) -> &str {
    crate::wire::utf8_prefix(reason, MAX_REASON)
}

const T_ROUND: u8 = 1;
const T_RUN: u8 = 2;
const T_REPAIR: u8 = 3;
const T_ACK: u8 = 4;
const T_FIN: u8 = 5;
const T_PING: u8 = 6;
const T_CLOSE: u8 = 7;

/// What is wrong with the bytes a link received.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The peer does not speak this protocol (another magic).
    #[error("the peer does not speak ri2n over TCP")]
    NotRi2n,
    /// It speaks another version of it.
    #[error("the peer speaks version {0} of ri2n over TCP, this side {VERSION}")]
    Version(u8),
    /// A record of unknown type.
    #[error("unknown record type {0}")]
    UnknownRecord(u8),
    /// A field out of its range (a length, a count, an address family).
    #[error("malformed {0}")]
    Malformed(&'static str),
}

/// A client's hello, the first bytes of each of its TCP links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The connection the link belongs to, chosen at random by the client.
    pub connection_id: u64,
    /// The link's number in the connection (the client's local address index).
    pub link: u8,
    /// The first link of a new connection (else a further link, or a link replacing one that
    /// died, of a connection the server knows).
    pub new_connection: bool,
    /// The client holds a cluster key: its Noise handshake message follows (§12.6).
    pub keyed: bool,
    /// The client reads messages (else the server's `send_message` is refused).
    pub takes_messages: bool,
    /// The client's receive window: how far beyond what its application read the server
    /// may send.
    pub window: u64,
    /// The application protocol the client expects to talk to (`None`: any).
    pub application: Option<String>,
}

/// What a server answers a hello with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloStatus {
    /// The link is part of the connection.
    Accepted,
    /// The hello names a connection the server does not know (it restarted, or ended it).
    UnknownConnection,
    /// The server takes no more connections.
    ServerFull,
    /// The endpoint takes no connections at all.
    NotAccepting,
    /// The server runs another application protocol.
    WrongApplication,
    /// The server requires a key and the client has none.
    KeyRequired,
    /// The client holds a key and the server has none.
    NoKey,
    /// The handshake failed: the two hold different keys (not authenticated: like the UDP
    /// transport's REFUSE, a forger on the path can send it).
    WrongKey,
}

/// The server's answer to a hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloReply {
    /// Whether the link was taken.
    pub status: HelloStatus,
    /// The server reads messages (else the client's `send_message` is refused).
    pub takes_messages: bool,
    /// The server's receive window.
    pub window: u64,
    /// The server's application name (when it refused for that reason, what it runs).
    pub application: Option<String>,
    /// The server's addresses, for the client's further links (on the first link only).
    pub addrs: Vec<SocketAddr>,
}

/// A record on an open link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// The sender starts taking runs from position `pos` of the stream: forward from it, or
    /// backward from it when `backward` (the end of its range).
    Round {
        /// Where the link's first run starts (forward) or ends (backward).
        pos: u64,
        /// The runs go backward.
        backward: bool,
    },
    /// `len` stream bytes follow, placed at the link's cursor (no offset: the link's order
    /// says where).
    Run {
        /// Payload bytes that follow.
        len: u32,
    },
    /// `len` stream bytes follow for `offset`: sent again after the link that had them died.
    Repair {
        /// Where the payload belongs in the stream.
        offset: u64,
        /// Payload bytes that follow.
        len: u32,
    },
    /// The receiver's acknowledgement: `link_bytes` run and repair bytes arrived on this link
    /// (since it opened); every stream byte below `delivered` arrived; the sender may send up
    /// to `window_end`; `eof`: the end of the stream arrived too.
    Ack {
        /// Run and repair payload bytes that arrived on this link.
        link_bytes: u64,
        /// Every stream byte below this arrived.
        delivered: u64,
        /// The sender may send stream bytes below this.
        window_end: u64,
        /// The end of the stream arrived.
        eof: bool,
    },
    /// The sender's stream ends at `end`.
    Fin {
        /// The stream's length.
        end: u64,
    },
    /// Nothing: keeps an idle link's silence from reading as its death.
    Ping,
    /// The connection ends (`code` 0: a clean close), with a reason for the log.
    Close {
        /// 0 for a clean close; below [`CLOSE_APP_BASE`] an error of the sender's (a
        /// violation); from it on an application's abort code, plus [`CLOSE_APP_BASE`].
        code: u64,
        /// Bytes of UTF-8 reason that follow.
        reason_len: u16,
    },
}

/// A CLOSE for an application's abort carries its code plus this, as the UDP transport's
/// does (docs/PROTOCOL.md §12.5): every application code, 0 included, reaches the peer as it
/// was given, apart from a clean close (0) and the transport's own errors (1 to 15).
pub const CLOSE_APP_BASE: u64 = 16;

/// A receive window announced in a hello or its reply, if within what a config may set: a
/// window of 0 would let nothing be sent and no message fit.
fn announced_window(window: u64, what: &'static str) -> Result<u64, FrameError> {
    use crate::config::{MAX_WINDOW, MIN_WINDOW};
    match (MIN_WINDOW..=MAX_WINDOW).contains(&window) {
        true => Ok(window),
        false => Err(FrameError::Malformed(what)),
    }
}

/// A byte that must be 0 or 1.
fn flag(v: u8, what: &'static str) -> Result<bool, FrameError> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(FrameError::Malformed(what)),
    }
}

fn be_u16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

impl Record {
    /// The longest encoded record (its payload not counted).
    pub const MAX_LEN: usize = 26;

    /// Appends the record (not its payload or reason) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Record::Round { pos, backward } => {
                out.push(T_ROUND);
                out.extend_from_slice(&pos.to_be_bytes());
                out.push(u8::from(backward));
            }
            Record::Run { len } => {
                out.push(T_RUN);
                out.extend_from_slice(&len.to_be_bytes());
            }
            Record::Repair { offset, len } => {
                out.push(T_REPAIR);
                out.extend_from_slice(&offset.to_be_bytes());
                out.extend_from_slice(&len.to_be_bytes());
            }
            Record::Ack {
                link_bytes,
                delivered,
                window_end,
                eof,
            } => {
                out.push(T_ACK);
                out.extend_from_slice(&link_bytes.to_be_bytes());
                out.extend_from_slice(&delivered.to_be_bytes());
                out.extend_from_slice(&window_end.to_be_bytes());
                out.push(u8::from(eof));
            }
            Record::Fin { end } => {
                out.push(T_FIN);
                out.extend_from_slice(&end.to_be_bytes());
            }
            Record::Ping => out.push(T_PING),
            Record::Close { code, reason_len } => {
                out.push(T_CLOSE);
                out.extend_from_slice(&code.to_be_bytes());
                out.extend_from_slice(&reason_len.to_be_bytes());
            }
        }
    }

    /// The record at the start of `buf` and its length, `Ok(None)` if `buf` holds only part
    /// of it. A run's, repair's or close's payload follows and is not part of it.
    pub fn parse(buf: &[u8]) -> Result<Option<(Record, usize)>, FrameError> {
        let Some(&t) = buf.first() else {
            return Ok(None);
        };
        let need = match t {
            T_ROUND => 10,
            T_RUN => 5,
            T_REPAIR => 13,
            T_ACK => 26,
            T_FIN => 9,
            T_PING => 1,
            T_CLOSE => 11,
            other => return Err(FrameError::UnknownRecord(other)),
        };
        if buf.len() < need {
            return Ok(None);
        }
        let b = &buf[1..need];
        let payload = |len: u32| {
            if len == 0 || len > MAX_RUN {
                Err(FrameError::Malformed("run length"))
            } else {
                Ok(len)
            }
        };
        let r = match t {
            T_ROUND => Record::Round {
                pos: be_u64(b),
                backward: flag(b[8], "round direction")?,
            },
            T_RUN => Record::Run {
                len: payload(be_u32(b))?,
            },
            T_REPAIR => Record::Repair {
                offset: be_u64(b),
                len: payload(be_u32(&b[8..]))?,
            },
            T_ACK => Record::Ack {
                link_bytes: be_u64(b),
                delivered: be_u64(&b[8..]),
                window_end: be_u64(&b[16..]),
                eof: flag(b[24], "ack flags")?,
            },
            T_FIN => Record::Fin { end: be_u64(b) },
            T_PING => Record::Ping,
            _ => {
                let reason_len = be_u16(&b[8..]);
                if usize::from(reason_len) > MAX_REASON {
                    return Err(FrameError::Malformed("close reason length"));
                }
                Record::Close {
                    code: be_u64(b),
                    reason_len,
                }
            }
        };
        Ok(Some((r, need)))
    }
}

fn encode_name(name: &Option<String>, out: &mut Vec<u8>) {
    let n = name.as_deref().unwrap_or("").as_bytes();
    let n = &n[..n.len().min(MAX_APPLICATION)];
    out.push(n.len() as u8);
    out.extend_from_slice(n);
}

/// The name at the start of `buf` and the bytes it took, `Ok(None)` if incomplete.
fn parse_name(buf: &[u8]) -> Result<Option<(Option<String>, usize)>, FrameError> {
    let Some(&n) = buf.first() else {
        return Ok(None);
    };
    let n = usize::from(n);
    let Some(bytes) = buf.get(1..1 + n) else {
        return Ok(None);
    };
    let name = std::str::from_utf8(bytes).map_err(|_| FrameError::Malformed("application"))?;
    Ok(Some(((!name.is_empty()).then(|| name.to_owned()), 1 + n)))
}

fn check_magic(buf: &[u8]) -> Result<bool, FrameError> {
    let n = buf.len().min(MAGIC.len());
    if buf[..n] != MAGIC[..n] {
        return Err(FrameError::NotRi2n);
    }
    if buf.len() <= MAGIC.len() {
        return Ok(false);
    }
    match buf[MAGIC.len()] {
        VERSION => Ok(true),
        v => Err(FrameError::Version(v)),
    }
}

impl Hello {
    /// Appends the hello to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.connection_id.to_be_bytes());
        out.push(self.link);
        out.push(
            u8::from(self.new_connection)
                | u8::from(self.keyed) << 1
                | u8::from(self.takes_messages) << 2,
        );
        out.extend_from_slice(&self.window.to_be_bytes());
        encode_name(&self.application, out);
    }

    /// The hello at the start of `buf` and its length, `Ok(None)` if incomplete.
    pub fn parse(buf: &[u8]) -> Result<Option<(Hello, usize)>, FrameError> {
        if !check_magic(buf)? {
            return Ok(None);
        }
        let Some(b) = buf.get(9..27) else {
            return Ok(None);
        };
        if b[9] > 7 {
            return Err(FrameError::Malformed("hello flags"));
        }
        // link IDs are 0-7 (docs/PROTOCOL.md §12.1): a connection has no room for more
        if usize::from(b[8]) >= crate::MAX_LINKS {
            return Err(FrameError::Malformed("hello link number"));
        }
        let (new_connection, keyed) = (b[9] & 1 != 0, b[9] & 2 != 0);
        let takes_messages = b[9] & 4 != 0;
        let Some((application, n)) = parse_name(&buf[27..])? else {
            return Ok(None);
        };
        let hello = Hello {
            connection_id: be_u64(b),
            link: b[8],
            new_connection,
            keyed,
            takes_messages,
            window: announced_window(be_u64(&b[10..]), "hello window")?,
            application,
        };
        Ok(Some((hello, 27 + n)))
    }
}

impl HelloStatus {
    fn code(self) -> u8 {
        match self {
            HelloStatus::Accepted => 0,
            HelloStatus::UnknownConnection => 1,
            HelloStatus::ServerFull => 2,
            HelloStatus::NotAccepting => 3,
            HelloStatus::WrongApplication => 4,
            HelloStatus::KeyRequired => 5,
            HelloStatus::NoKey => 6,
            HelloStatus::WrongKey => 7,
        }
    }

    fn from_code(c: u8) -> Result<Self, FrameError> {
        Ok(match c {
            0 => HelloStatus::Accepted,
            1 => HelloStatus::UnknownConnection,
            2 => HelloStatus::ServerFull,
            3 => HelloStatus::NotAccepting,
            4 => HelloStatus::WrongApplication,
            5 => HelloStatus::KeyRequired,
            6 => HelloStatus::NoKey,
            7 => HelloStatus::WrongKey,
            _ => return Err(FrameError::Malformed("hello status")),
        })
    }
}

impl HelloReply {
    /// Appends the reply to `out` (at most [`MAX_ADDRS`] addresses).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(self.status.code());
        out.push(u8::from(self.takes_messages));
        out.extend_from_slice(&self.window.to_be_bytes());
        encode_name(&self.application, out);
        let addrs = &self.addrs[..self.addrs.len().min(MAX_ADDRS)];
        out.push(addrs.len() as u8);
        for a in addrs {
            match a.ip() {
                IpAddr::V4(ip) => {
                    out.push(4);
                    out.extend_from_slice(&ip.octets());
                }
                IpAddr::V6(ip) => {
                    out.push(6);
                    out.extend_from_slice(&ip.octets());
                }
            }
            out.extend_from_slice(&a.port().to_be_bytes());
        }
    }

    /// The reply at the start of `buf` and its length, `Ok(None)` if incomplete.
    pub fn parse(buf: &[u8]) -> Result<Option<(HelloReply, usize)>, FrameError> {
        if !check_magic(buf)? {
            return Ok(None);
        }
        let Some(b) = buf.get(9..19) else {
            return Ok(None);
        };
        let status = HelloStatus::from_code(b[0])?;
        let takes_messages = flag(b[1], "hello reply flags")?;
        let window = be_u64(&b[2..]);
        // a refusal carries no window worth the name
        if status == HelloStatus::Accepted {
            announced_window(window, "hello reply window")?;
        }
        let Some((application, n)) = parse_name(&buf[19..])? else {
            return Ok(None);
        };
        let mut at = 19 + n;
        let Some(&count) = buf.get(at) else {
            return Ok(None);
        };
        if usize::from(count) > MAX_ADDRS {
            return Err(FrameError::Malformed("address count"));
        }
        at += 1;
        let mut addrs = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let Some(&family) = buf.get(at) else {
                return Ok(None);
            };
            let ip_len = match family {
                4 => 4,
                6 => 16,
                _ => return Err(FrameError::Malformed("address family")),
            };
            let Some(b) = buf.get(at + 1..at + 3 + ip_len) else {
                return Ok(None);
            };
            let ip = if ip_len == 4 {
                IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
            } else {
                let mut o = [0u8; 16];
                o.copy_from_slice(&b[..16]);
                IpAddr::V6(Ipv6Addr::from(o))
            };
            addrs.push(SocketAddr::new(ip, be_u16(&b[ip_len..])));
            at += 3 + ip_len;
        }
        Ok(Some((
            HelloReply {
                status,
                takes_messages,
                window,
                application,
                addrs,
            },
            at,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(r: Record) -> Vec<u8> {
        let mut b = Vec::new();
        r.encode(&mut b);
        assert!(b.len() <= Record::MAX_LEN);
        assert_eq!(Record::parse(&b), Ok(Some((r, b.len()))));
        for cut in 0..b.len() {
            assert_eq!(Record::parse(&b[..cut]), Ok(None), "{r:?} cut at {cut}");
        }
        b
    }

    #[test]
    fn records_have_their_documented_bytes() {
        assert_eq!(
            roundtrip(Record::Round {
                pos: 0x0102,
                backward: true
            }),
            [1, 0, 0, 0, 0, 0, 0, 1, 2, 1]
        );
        assert_eq!(roundtrip(Record::Run { len: 65536 }), [2, 0, 1, 0, 0]);
        assert_eq!(
            roundtrip(Record::Repair { offset: 7, len: 3 }),
            [3, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 3]
        );
        let ack = roundtrip(Record::Ack {
            link_bytes: 1,
            delivered: 2,
            window_end: 3,
            eof: true,
        });
        assert_eq!(
            (ack.len(), ack[0], ack[8], ack[16], ack[24], ack[25]),
            (26, 4, 1, 2, 3, 1)
        );
        assert_eq!(
            roundtrip(Record::Fin { end: 9 }),
            [5, 0, 0, 0, 0, 0, 0, 0, 9]
        );
        assert_eq!(roundtrip(Record::Ping), [6]);
        assert_eq!(
            roundtrip(Record::Close {
                code: 0,
                reason_len: 4
            })
            .len(),
            11
        );
    }

    #[test]
    fn a_long_close_reason_is_cut_between_characters() {
        assert_eq!(close_reason("peer gone"), "peer gone");
        let long = "é".repeat(MAX_REASON);
        let cut = close_reason(&long);
        // two bytes per character: the 1024th byte would split one
        assert_eq!(cut.len(), MAX_REASON);
        assert_eq!(close_reason(&format!("x{long}")).len(), MAX_REASON - 1);
    }

    #[test]
    fn malformed_records_are_refused() {
        assert_eq!(Record::parse(&[0]), Err(FrameError::UnknownRecord(0)));
        assert_eq!(
            Record::parse(&[99, 1, 2]),
            Err(FrameError::UnknownRecord(99))
        );
        assert!(Record::parse(&[2, 0, 0, 0, 0]).is_err(), "empty run");
        assert!(
            Record::parse(&[2, 0, 0x40, 0, 1]).is_err(),
            "run over MAX_RUN"
        );
        assert!(Record::parse(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 2]).is_err());
        assert!(Record::parse(&[7, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]).is_err());
    }

    #[test]
    fn hello_and_reply_round_trip_and_wait_for_their_last_byte() {
        let h = Hello {
            connection_id: 0xdead_beef_0102_0304,
            link: 3,
            new_connection: true,
            keyed: true,
            takes_messages: true,
            window: 8 << 20,
            application: Some("ri2n-file".into()),
        };
        let mut b = Vec::new();
        h.encode(&mut b);
        assert_eq!(&b[..8], b"ri2n-tcp");
        assert_eq!(Hello::parse(&b), Ok(Some((h, b.len()))));
        for cut in 0..b.len() {
            assert_eq!(Hello::parse(&b[..cut]), Ok(None));
        }
        let r = HelloReply {
            status: HelloStatus::Accepted,
            takes_messages: true,
            window: 1 << 16,
            application: None,
            addrs: vec![
                "10.0.1.2:7000".parse().unwrap(),
                "[fd00::2]:7001".parse().unwrap(),
            ],
        };
        let mut b = Vec::new();
        r.encode(&mut b);
        assert_eq!(b.len(), 9 + 1 + 1 + 8 + 1 + 1 + 7 + 19);
        assert_eq!(HelloReply::parse(&b), Ok(Some((r, b.len()))));
        for cut in 0..b.len() {
            assert_eq!(HelloReply::parse(&b[..cut]), Ok(None));
        }
    }

    #[test]
    fn another_protocol_or_version_is_named() {
        assert_eq!(Hello::parse(b"GET / HTTP/1.1"), Err(FrameError::NotRi2n));
        assert_eq!(Hello::parse(b"ri2n"), Ok(None));
        assert_eq!(Hello::parse(b"ri2n-tcp\x01"), Err(FrameError::Version(1)));
        // a link number beyond the 8 a connection has (a server indexed its links by it)
        let mut b = Vec::new();
        let h = Hello {
            connection_id: 1,
            link: 8,
            new_connection: true,
            keyed: false,
            takes_messages: false,
            window: 1 << 20,
            application: None,
        };
        h.encode(&mut b);
        assert_eq!(
            Hello::parse(&b),
            Err(FrameError::Malformed("hello link number"))
        );
        assert_eq!(HelloReply::parse(b"SSH-2.0"), Err(FrameError::NotRi2n));
    }

    /// A window below what a config may set (0: nothing could ever be sent, no message fit)
    /// or above it is malformed, in a hello and in an accepting reply; a refusal's is not
    /// looked at (the server sends 0).
    #[test]
    fn a_window_out_of_range_is_malformed() {
        for window in [0, (16 << 10) - 1, crate::config::MAX_WINDOW + 1] {
            let mut b = Vec::new();
            Hello {
                connection_id: 1,
                link: 0,
                new_connection: true,
                keyed: false,
                takes_messages: false,
                window,
                application: None,
            }
            .encode(&mut b);
            assert_eq!(Hello::parse(&b), Err(FrameError::Malformed("hello window")));
            let reply = |status| HelloReply {
                status,
                takes_messages: false,
                window,
                application: None,
                addrs: vec![],
            };
            let mut b = Vec::new();
            reply(HelloStatus::Accepted).encode(&mut b);
            assert_eq!(
                HelloReply::parse(&b),
                Err(FrameError::Malformed("hello reply window"))
            );
            let mut b = Vec::new();
            reply(HelloStatus::ServerFull).encode(&mut b);
            let refusal = reply(HelloStatus::ServerFull);
            assert_eq!(HelloReply::parse(&b), Ok(Some((refusal, b.len()))));
        }
    }
}
