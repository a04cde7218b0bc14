//! The wire format: packet headers and frames, their parsing and emitting.
//!
//! `docs/PROTOCOL.md` is the normative description; this module is its implementation. Parsing
//! never panics on any input: every length is checked before it is used, and a malformed
//! packet is rejected whole with a [`DecodeError`].
//!
//! Packets carry no checksum of their own: the UDP checksum already guards every datagram
//! against corruption on the wire, and on keyed connections the AEAD tag ([`crate::crypto`])
//! against everything else, so a second one would only cost every byte another pass. Sealing
//! and opening are not done here: the connection does them in place around this codec.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::LinkId;
use thiserror::Error;

/// Protocol version carried in the first byte of every packet (version 1 ended each packet
/// with a CRC-32C; version 2 relied on the UDP checksum; version 3 added the keyed handshake,
/// sealed short packets and authenticated RESETs; version 4 binds the handshake to the retry
/// cookie and each RESET token to its addresses, docs/PROTOCOL.md §11; version 5 names the
/// application in the handshake and says what each side accepts, §4.1).
pub const VERSION: u8 = 5;
/// Smallest datagram that may carry an INITIAL packet (padding makes it up): it keeps the
/// server's answers to an unproven address below three times what that address sent.
pub const MIN_INITIAL_SIZE: usize = 1200;
/// Largest datagram ri2n builds: a STREAM frame's 2-byte length field must hold any frame.
pub const MAX_DATAGRAM_SIZE: usize = 16 * 1024;
/// Largest datagram an application may send over a connection: the largest IP packet and
/// 1 KiB for a header of the application's own. One larger than a packet goes in pieces
/// (DATAGRAM_PART frames).
pub const MAX_DATAGRAM_LEN: usize = 65_535 + 1024;
/// Bytes of a short (data) packet header before the packet number.
pub const SHORT_HEADER_FIXED: usize = 1 + 1 + 8 + 1;

/// Why a datagram could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The datagram ended inside a field.
    #[error("truncated")]
    Truncated,
    /// The version byte is not one this implementation speaks.
    #[error("unsupported version {0}")]
    UnsupportedVersion(u8),
    /// Unknown packet or frame type, or a field out of its range.
    #[error("malformed: {0}")]
    Malformed(&'static str),
}

// ---------------------------------------------------------------------------------------------
// Variable-length integers (QUIC's encoding: the two top bits of the first byte give the length).

/// Largest value a varint can carry.
pub const VARINT_MAX: u64 = (1 << 62) - 1;

/// Bytes `v` takes as a varint.
pub fn varint_len(v: u64) -> usize {
    match v {
        0..=63 => 1,
        64..=16383 => 2,
        16384..=1_073_741_823 => 4,
        _ => 8,
    }
}

/// A cursor reading fields from a byte slice; every read is bounds-checked.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// A frame's data: after a varint length when the frame has one (`has_len`), else the
    /// rest of the packet (the frame is the packet's last).
    pub fn frame_data(&mut self, has_len: bool) -> Result<&'a [u8], DecodeError> {
        if has_len {
            let len = self.varint()? as usize;
            self.bytes(len)
        } else {
            Ok(self.rest())
        }
    }
    /// Takes the next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated);
        }
        let b = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(b)
    }
    /// Takes everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        let b = &self.buf[self.pos..];
        self.pos = self.buf.len();
        b
    }
    /// Next byte, without consuming it.
    pub fn peek_u8(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }
    /// Reads a byte.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.bytes(1)?[0])
    }
    /// Reads a big-endian u16.
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.bytes(2)?.try_into().unwrap()))
    }
    /// Reads a big-endian u64.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.bytes(8)?.try_into().unwrap()))
    }
    /// Reads a varint.
    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        let first = self.peek_u8().ok_or(DecodeError::Truncated)?;
        let len = 1usize << (first >> 6);
        let b = self.bytes(len)?;
        let mut v = u64::from(b[0] & 0x3f);
        for &x in &b[1..] {
            v = (v << 8) | u64::from(x);
        }
        Ok(v)
    }
}

/// A cursor writing fields into a byte slice. Callers size packets with the `*_len` helpers
/// first; writing past the end is a bug in the caller and panics.
#[derive(Debug)]
pub struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    /// A writer at the start of `buf`.
    pub fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.pos
    }
    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }
    /// Room left.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// Writes bytes.
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
    }
    /// Reserves the next `n` bytes and returns them to be filled in place.
    pub fn slot(&mut self, n: usize) -> &mut [u8] {
        let start = self.pos;
        self.pos += n;
        &mut self.buf[start..self.pos]
    }
    /// Writes `n` zero bytes (PADDING frames).
    pub fn zeros(&mut self, n: usize) {
        self.buf[self.pos..self.pos + n].fill(0);
        self.pos += n;
    }
    /// Writes a byte.
    pub fn u8(&mut self, v: u8) {
        self.bytes(&[v]);
    }
    /// Writes a big-endian u16.
    pub fn u16(&mut self, v: u16) {
        self.bytes(&v.to_be_bytes());
    }
    /// Writes a big-endian u64.
    pub fn u64(&mut self, v: u64) {
        self.bytes(&v.to_be_bytes());
    }
    /// Writes a varint. Values above [`VARINT_MAX`] are a caller bug.
    pub fn varint(&mut self, v: u64) {
        assert!(v <= VARINT_MAX, "varint out of range");
        match varint_len(v) {
            1 => self.u8(v as u8),
            2 => self.u16(v as u16 | 0x4000),
            4 => self.bytes(&(v as u32 | 0x8000_0000).to_be_bytes()),
            _ => self.u64(v | 0xc000_0000_0000_0000),
        }
    }
    /// The packet is complete: its length.
    pub fn finish(&mut self) -> usize {
        self.pos
    }
}

// ---------------------------------------------------------------------------------------------
// Packets

/// Packet type codes (second byte of every packet).
pub mod packet_type {
    /// Data packet of an established connection, sealed with key phase 0 (or not sealed).
    pub const SHORT: u8 = 0x01;
    /// Data packet sealed with key phase 1 (after an odd number of key updates).
    pub const SHORT_PHASE1: u8 = 0x02;
    /// Client's connection request.
    pub const INITIAL: u8 = 0x10;
    /// Server's stateless answer: retry with this cookie.
    pub const RETRY: u8 = 0x11;
    /// Server's acceptance, carrying its connection ID, instance and addresses.
    pub const ACCEPT: u8 = 0x12;
    /// "No such connection here": the sender restarted or forgot the connection.
    pub const RESET: u8 = 0x13;
    /// Server's refusal of a handshake that cannot be authenticated (another key, or one side
    /// without a key).
    pub const REFUSE: u8 = 0x14;
}

/// How a handshake's parameters travel (the `mode` byte of INITIAL and ACCEPT).
pub mod handshake_mode {
    /// In clear: the endpoints hold no key.
    pub const PLAIN: u8 = 0;
    /// Inside a Noise `NNpsk0` handshake message, under the cluster key.
    pub const NOISE_NNPSK0: u8 = 1;
}

/// Why a server refused a handshake (the `reason` byte of REFUSE).
pub mod refuse_reason {
    /// The client's Noise message did not authenticate: it holds another key.
    pub const WRONG_KEY: u8 = 1;
    /// The server holds a key and the client offered a handshake without one.
    pub const KEY_REQUIRED: u8 = 2;
    /// The client offered a keyed handshake and the server holds no key.
    pub const NO_KEY: u8 = 3;
    /// The endpoint takes no incoming connections (it is not a server).
    pub const NOT_ACCEPTING: u8 = 4;
    /// The server serves another application; the REFUSE's detail names it.
    pub const WRONG_APPLICATION: u8 = 5;
}

/// What a side of a connection takes from its peer besides the byte stream (the `accepts`
/// bits of the handshake parameters): a sender asked to send what its peer does not take
/// fails at once instead of sending what nobody reads.
pub mod accepts {
    /// Messages (the message stream).
    pub const MESSAGES: u8 = 1;
    /// Unreliable datagrams.
    pub const DATAGRAMS: u8 = 2;
}

/// Longest application name of the handshake parameters, in bytes.
pub const MAX_APPLICATION_LEN: usize = 64;

/// A decoded packet header. Short packets are followed by frames ([`Frames`]), sealed when the
/// connection has a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Header<'a> {
    /// Data packet of an established connection.
    Short {
        /// Connection ID chosen by the receiver of this packet.
        dcid: u64,
        /// Link the packet was sent on.
        link: LinkId,
        /// Packet number in that link's number space (this direction).
        pn: u64,
        /// Key phase (0 or 1) the packet is sealed with.
        phase: u8,
    },
    /// Client's connection request (padded to [`MIN_INITIAL_SIZE`]).
    Initial {
        /// Connection ID the client chose for itself.
        scid: u64,
        /// Cookie from a RETRY, empty on the first attempt.
        token: &'a [u8],
        /// How `hello` is to be read ([`handshake_mode`]).
        mode: u8,
        /// The client's parameters ([`ClientParams`]), in clear or in a Noise message.
        hello: &'a [u8],
    },
    /// Server's stateless answer carrying a cookie.
    Retry {
        /// The client's connection ID.
        dcid: u64,
        /// Cookie to echo in the next INITIAL.
        token: &'a [u8],
    },
    /// Server's acceptance.
    Accept {
        /// The client's connection ID.
        dcid: u64,
        /// How `hello` is to be read ([`handshake_mode`]).
        mode: u8,
        /// The server's parameters ([`ServerParams`]), in clear or in a Noise message.
        hello: &'a [u8],
    },
    /// "No such connection": the connection with this ID is unknown to the sender.
    Reset {
        /// The connection ID that was not found.
        dcid: u64,
        /// Proof that the sender holds the cluster key (keyed endpoints only).
        token: Option<&'a [u8]>,
    },
    /// The server refuses a handshake.
    Refuse {
        /// The client's connection ID.
        dcid: u64,
        /// Why ([`refuse_reason`]).
        reason: u8,
        /// For [`refuse_reason::WRONG_APPLICATION`], the application the server serves;
        /// empty otherwise.
        detail: &'a [u8],
    },
}

/// A client's handshake parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientParams {
    /// Random number identifying the client endpoint's current run.
    pub instance: u64,
    /// Receive window of each client stream.
    pub window: u64,
    /// The AEAD the client prefers (keyed handshakes; code of [`crate::Cipher`]).
    pub cipher: u8,
    /// What the client takes besides the byte stream ([`accepts`] bits).
    pub accepts: u8,
    /// The application the client speaks (at most [`MAX_APPLICATION_LEN`] bytes; empty: any).
    pub application: Vec<u8>,
}

impl ClientParams {
    /// Encodes the parameters (an application name cut to [`MAX_APPLICATION_LEN`] bytes).
    pub fn encode(&self) -> Vec<u8> {
        let application = &self.application[..self.application.len().min(MAX_APPLICATION_LEN)];
        let mut buf = vec![0u8; 8 + 8 + 1 + 1 + 1 + application.len()];
        let mut w = Writer::new(&mut buf);
        w.u64(self.instance);
        w.varint(self.window);
        w.u8(self.cipher);
        w.u8(self.accepts);
        w.u8(application.len() as u8);
        w.bytes(application);
        let len = w.finish();
        buf.truncate(len);
        buf
    }

    /// Decodes parameters that fill `b` exactly.
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(b);
        let instance = r.u64()?;
        let window = r.varint()?;
        let cipher = r.u8()?;
        let accepts = r.u8()?;
        let len = r.u8()? as usize;
        if len > MAX_APPLICATION_LEN {
            return Err(DecodeError::Malformed("application name too long"));
        }
        let p = ClientParams {
            instance,
            window,
            cipher,
            accepts,
            application: r.bytes(len)?.to_vec(),
        };
        end_of(r, p)
    }
}

/// A server's handshake parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerParams {
    /// The server's connection ID.
    pub scid: u64,
    /// Random number identifying the server endpoint's current run.
    pub instance: u64,
    /// Receive window of each server stream.
    pub window: u64,
    /// The AEAD of the connection (keyed handshakes; code of [`crate::Cipher`]).
    pub cipher: u8,
    /// What the server takes besides the byte stream ([`accepts`] bits).
    pub accepts: u8,
    /// The server's addresses, for link discovery (at most [`crate::MAX_LINKS`]).
    pub addrs: Vec<SocketAddr>,
}

impl ServerParams {
    /// Encodes the parameters (at most [`crate::MAX_LINKS`] addresses).
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = vec![0u8; 8 + 8 + 8 + 1 + 1 + 1 + crate::MAX_LINKS * 19];
        let mut w = Writer::new(&mut buf);
        w.u64(self.scid);
        w.u64(self.instance);
        w.varint(self.window);
        w.u8(self.cipher);
        w.u8(self.accepts);
        let addrs = &self.addrs[..self.addrs.len().min(crate::MAX_LINKS)];
        w.u8(addrs.len() as u8);
        for a in addrs {
            write_addr(&mut w, a);
        }
        let len = w.finish();
        buf.truncate(len);
        buf
    }

    /// Decodes parameters that fill `b` exactly.
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(b);
        let scid = r.u64()?;
        let instance = r.u64()?;
        let window = r.varint()?;
        let cipher = r.u8()?;
        let accepts = r.u8()?;
        let count = r.u8()? as usize;
        if count > crate::MAX_LINKS {
            return Err(DecodeError::Malformed("too many addresses"));
        }
        let mut addrs = Vec::with_capacity(count);
        for _ in 0..count {
            addrs.push(read_addr(&mut r)?);
        }
        let p = ServerParams {
            scid,
            instance,
            window,
            cipher,
            accepts,
            addrs,
        };
        end_of(r, p)
    }
}

fn end_of<T>(r: Reader<'_>, value: T) -> Result<T, DecodeError> {
    if r.remaining() != 0 {
        return Err(DecodeError::Malformed("trailing bytes"));
    }
    Ok(value)
}

/// Checks the version of a datagram and decodes its header. Returns the header and, for short
/// packets, the bytes after the header (frames, sealed or not).
pub fn decode_packet(datagram: &[u8]) -> Result<(Header<'_>, &[u8]), DecodeError> {
    if datagram.len() < 2 {
        return Err(DecodeError::Truncated);
    }
    if datagram[0] != VERSION {
        return Err(DecodeError::UnsupportedVersion(datagram[0]));
    }
    let mut r = Reader::new(&datagram[2..]);
    let header = match datagram[1] {
        t @ (packet_type::SHORT | packet_type::SHORT_PHASE1) => Header::Short {
            dcid: r.u64()?,
            link: LinkId(r.u8()?),
            pn: r.varint()?,
            phase: u8::from(t == packet_type::SHORT_PHASE1),
        },
        packet_type::INITIAL => {
            if datagram.len() < MIN_INITIAL_SIZE {
                return Err(DecodeError::Malformed("initial packet too small"));
            }
            let scid = r.u64()?;
            let len = r.varint()? as usize;
            let token = r.bytes(len)?;
            let mode = r.u8()?;
            let len = r.varint()? as usize;
            let hello = r.bytes(len)?;
            r.rest(); // padding
            Header::Initial {
                scid,
                token,
                mode,
                hello,
            }
        }
        packet_type::RETRY => {
            let dcid = r.u64()?;
            let len = r.varint()? as usize;
            Header::Retry {
                dcid,
                token: r.bytes(len)?,
            }
        }
        packet_type::ACCEPT => {
            let dcid = r.u64()?;
            let mode = r.u8()?;
            let len = r.varint()? as usize;
            Header::Accept {
                dcid,
                mode,
                hello: r.bytes(len)?,
            }
        }
        packet_type::RESET => {
            let dcid = r.u64()?;
            let token = match r.remaining() {
                0 => None,
                _ => Some(r.bytes(crate::crypto::RESET_TOKEN_LEN)?),
            };
            Header::Reset { dcid, token }
        }
        packet_type::REFUSE => {
            let dcid = r.u64()?;
            let reason = r.u8()?;
            let len = r.u8()? as usize;
            if len > MAX_APPLICATION_LEN {
                return Err(DecodeError::Malformed("refusal detail too long"));
            }
            Header::Refuse {
                dcid,
                reason,
                detail: r.bytes(len)?,
            }
        }
        _ => return Err(DecodeError::Malformed("unknown packet type")),
    };
    if !matches!(header, Header::Short { .. }) && r.remaining() != 0 {
        return Err(DecodeError::Malformed("trailing bytes"));
    }
    Ok((header, r.rest()))
}

fn read_addr(r: &mut Reader<'_>) -> Result<SocketAddr, DecodeError> {
    let ip = match r.u8()? {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(r.bytes(4)?).unwrap())),
        6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(r.bytes(16)?).unwrap())),
        _ => return Err(DecodeError::Malformed("address family")),
    };
    Ok(SocketAddr::new(ip, r.u16()?))
}

/// Bytes of an address in the encoding of [`ServerParams`] (family, address, port).
pub const fn addr_len(a: &SocketAddr) -> usize {
    match a {
        SocketAddr::V4(_) => 1 + 4 + 2,
        SocketAddr::V6(_) => 1 + 16 + 2,
    }
}

/// Writes an address in the encoding of [`ServerParams`] (family, address, port).
pub fn write_addr(w: &mut Writer<'_>, a: &SocketAddr) {
    match a.ip() {
        IpAddr::V4(ip) => {
            w.u8(4);
            w.bytes(&ip.octets());
        }
        IpAddr::V6(ip) => {
            w.u8(6);
            w.bytes(&ip.octets());
        }
    }
    w.u16(a.port());
}

/// What an ICMP error quotes of a datagram this endpoint sent: enough of its header to tell
/// which connection and link sent it (docs/PROTOCOL.md §6.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quoted {
    /// A short packet: the peer's connection ID, the link and the packet number.
    Short {
        /// The destination connection ID (the peer's).
        dcid: u64,
        /// The link ID.
        link: LinkId,
        /// The packet number.
        pn: u64,
    },
    /// An INITIAL: the client's own connection ID.
    Initial {
        /// The source connection ID (the client's).
        scid: u64,
    },
}

/// Reads the start of a datagram quoted by an ICMP error. A quote is cut short (ICMP carries
/// the first bytes of a datagram only), so only the header is read; `None` when it is neither
/// a short packet nor an INITIAL of this version, or too short to tell.
pub fn decode_quoted(quote: &[u8]) -> Option<Quoted> {
    if quote.len() < 2 || quote[0] != VERSION {
        return None;
    }
    let mut r = Reader::new(&quote[2..]);
    match quote[1] {
        packet_type::SHORT | packet_type::SHORT_PHASE1 => Some(Quoted::Short {
            dcid: r.u64().ok()?,
            link: LinkId(r.u8().ok()?),
            pn: r.varint().ok()?,
        }),
        packet_type::INITIAL => Some(Quoted::Initial {
            scid: r.u64().ok()?,
        }),
        _ => None,
    }
}

/// Where a connection ID sits in every packet that carries one: right after the version
/// and type bytes (docs/PROTOCOL.md §2.8).
pub const CID_OFFSET: usize = 2;

/// Which engine a datagram is for, when a driver runs several engines (shards, each with its
/// share of connection IDs: [`crate::Shard`]) on the same addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steering {
    /// The shard of this connection ID ([`crate::Shard::of`]): one the receiver chose (a
    /// short packet's, a RETRY's, ACCEPT's or REFUSE's destination ID).
    Shard(u64),
    /// A client's INITIAL, with the ID the client chose for itself: the kernel steers it by
    /// that ID as [`Steering::Shard`]; the server may make the connection on any shard (whose
    /// share its own ID then comes from), as long as every repeat of the INITIAL goes there.
    Initial(u64),
    /// The shard whose engine knows this connection ID (a RESET's, which may be the
    /// receiver's own or its peer's; an ICMP error's quote of a packet to the peer):
    /// [`crate::Endpoint::has_connection_with`] tells.
    Ask(u64),
}

/// How to steer a received datagram; `None` for one too short or of another version (any
/// shard may drop it).
pub fn steering(datagram: &[u8]) -> Option<Steering> {
    let cid = datagram.get(CID_OFFSET..CID_OFFSET + 8)?;
    let cid = u64::from_be_bytes(cid.try_into().ok()?);
    match (datagram[0], datagram[1]) {
        (VERSION, packet_type::RESET) => Some(Steering::Ask(cid)),
        (VERSION, packet_type::INITIAL) => Some(Steering::Initial(cid)),
        (VERSION, _) => Some(Steering::Shard(cid)),
        _ => None,
    }
}

/// How to steer an ICMP error quoting a datagram this endpoint sent ([`decode_quoted`]).
pub fn quote_steering(quote: &[u8]) -> Option<Steering> {
    match decode_quoted(quote)? {
        Quoted::Short { dcid, .. } => Some(Steering::Ask(dcid)),
        Quoted::Initial { scid } => Some(Steering::Shard(scid)),
    }
}

/// Writes a short packet header; frames follow, then [`Writer::finish`].
pub fn write_short_header(w: &mut Writer<'_>, dcid: u64, link: LinkId, pn: u64, phase: u8) {
    w.u8(VERSION);
    w.u8(if phase == 0 {
        packet_type::SHORT
    } else {
        packet_type::SHORT_PHASE1
    });
    w.u64(dcid);
    w.u8(link.0);
    w.varint(pn);
}

/// Bytes [`encode_control_packet`] writes for `header`, padding included.
pub fn control_packet_len(header: &Header<'_>) -> usize {
    let with_len = |n: usize| varint_len(n as u64) + n;
    2 + match header {
        Header::Short { .. } => panic!("short packets are built frame by frame"),
        Header::Initial { token, hello, .. } => {
            (8 + with_len(token.len()) + 1 + with_len(hello.len())).max(MIN_INITIAL_SIZE - 2)
        }
        Header::Retry { token, .. } => 8 + with_len(token.len()),
        Header::Accept { hello, .. } => 8 + 1 + with_len(hello.len()),
        Header::Reset { token, .. } => 8 + token.map_or(0, <[u8]>::len),
        Header::Refuse { detail, .. } => 8 + 1 + 1 + detail.len().min(MAX_APPLICATION_LEN),
    }
}

/// A complete handshake, reset or refusal packet (anything but [`Header::Short`]) in a new
/// vector: [`encode_control_packet`] for callers that do not build into a buffer of their own.
pub fn control_packet(header: &Header<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; control_packet_len(header)];
    let len = encode_control_packet(header, &mut buf);
    buf.truncate(len);
    buf
}

/// Encodes a complete handshake, reset or refusal packet (anything but [`Header::Short`]) into
/// `buf` (of at least [`control_packet_len`] bytes), returning its length. INITIAL packets are
/// padded to [`MIN_INITIAL_SIZE`].
pub fn encode_control_packet(header: &Header<'_>, buf: &mut [u8]) -> usize {
    let mut w = Writer::new(buf);
    w.u8(VERSION);
    match header {
        Header::Short { .. } => panic!("short packets are built frame by frame"),
        Header::Initial {
            scid,
            token,
            mode,
            hello,
        } => {
            w.u8(packet_type::INITIAL);
            w.u64(*scid);
            w.varint(token.len() as u64);
            w.bytes(token);
            w.u8(*mode);
            w.varint(hello.len() as u64);
            w.bytes(hello);
            let pad = MIN_INITIAL_SIZE.saturating_sub(w.len());
            w.zeros(pad);
        }
        Header::Retry { dcid, token } => {
            w.u8(packet_type::RETRY);
            w.u64(*dcid);
            w.varint(token.len() as u64);
            w.bytes(token);
        }
        Header::Accept { dcid, mode, hello } => {
            w.u8(packet_type::ACCEPT);
            w.u64(*dcid);
            w.u8(*mode);
            w.varint(hello.len() as u64);
            w.bytes(hello);
        }
        Header::Reset { dcid, token } => {
            w.u8(packet_type::RESET);
            w.u64(*dcid);
            if let Some(token) = token {
                w.bytes(token);
            }
        }
        Header::Refuse {
            dcid,
            reason,
            detail,
        } => {
            let detail = &detail[..detail.len().min(MAX_APPLICATION_LEN)];
            w.u8(packet_type::REFUSE);
            w.u64(*dcid);
            w.u8(*reason);
            w.u8(detail.len() as u8);
            w.bytes(detail);
        }
    }
    w.finish()
}

// ---------------------------------------------------------------------------------------------
// Frames (inside short packets)

/// Frame type codes.
pub mod frame_type {
    /// One byte of padding.
    pub const PADDING: u8 = 0x00;
    /// Elicits an acknowledgement; used by probes and keepalives.
    pub const PING: u8 = 0x01;
    /// Acknowledges packet-number ranges of one link.
    pub const ACK: u8 = 0x02;
    /// An unreliable datagram: sent once, never repaired.
    pub const DATAGRAM: u8 = 0x03;
    /// Raises a stream's flow-control limit.
    pub const MAX_STREAM_DATA: u8 = 0x04;
    /// Receiver-side failure notice about one link.
    pub const LINK_STATUS: u8 = 0x05;
    /// Ends the connection at once with an error.
    pub const CLOSE: u8 = 0x06;
    /// A piece of an unreliable datagram too large for one packet:
    /// `0x10 | has_len << 2 | position` (position: 0 between, 1 first, 2 last).
    pub const DATAGRAM_PART_BASE: u8 = 0x10;
    /// Bit of a DATAGRAM_PART type: the frame carries an explicit length.
    pub const DATAGRAM_PART_LEN_BIT: u8 = 0x04;
    /// Stream data: `0x08 | stream << 2 | has_len << 1 | fin`.
    pub const STREAM_BASE: u8 = 0x08;
    /// Bit of a STREAM type: the frame carries an explicit length.
    pub const STREAM_LEN_BIT: u8 = 0x02;
    /// Bit of a STREAM type: the frame ends the stream.
    pub const STREAM_FIN_BIT: u8 = 0x01;
}

/// Reasons a receiver reports about a link in a LINK_STATUS frame.
pub mod link_status {
    /// The link's share of arrivals collapsed: it is alive but far slower than it was.
    pub const DEGRADED: u8 = 1;
}

/// The acknowledged ranges of an ACK frame, highest first, each as `(smallest, largest)`.
/// The frame was fully validated when parsed, so iteration cannot fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckRanges<'a> {
    largest: u64,
    first: u64,
    count: u64,
    rest: &'a [u8],
}

impl Iterator for AckRanges<'_> {
    type Item = (u64, u64);
    fn next(&mut self) -> Option<(u64, u64)> {
        if self.first == u64::MAX {
            // first range already yielded: read the next (gap, len) pair
            if self.count == 0 {
                return None;
            }
            self.count -= 1;
            let mut r = Reader::new(self.rest);
            let gap = r.varint().ok()?;
            let len = r.varint().ok()?;
            self.rest = &self.rest[self.rest.len() - r.remaining()..];
            let largest = self.largest.checked_sub(gap + 2)?;
            self.largest = largest.checked_sub(len)?;
            return Some((self.largest, largest));
        }
        let largest = self.largest;
        self.largest -= self.first;
        self.first = u64::MAX;
        Some((self.largest, largest))
    }
}

/// A frame inside a short packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A run of padding bytes.
    Padding,
    /// Asks for an acknowledgement.
    Ping,
    /// Acknowledgement of one link's packets.
    Ack {
        /// Link whose packet numbers are acknowledged (may differ from the carrying link).
        link: LinkId,
        /// Largest acknowledged packet number.
        largest: u64,
        /// Time the receiver held the acknowledgement of `largest`, in microseconds.
        delay_us: u64,
        /// The ranges, highest first.
        ranges: AckRanges<'a>,
    },
    /// Stream data.
    Stream {
        /// Stream number: 0 is the byte stream, 1 the message stream.
        stream: u8,
        /// Offset of the first byte.
        offset: u64,
        /// Whether the stream ends after these bytes.
        fin: bool,
        /// The bytes.
        data: &'a [u8],
    },
    /// New flow-control limit of a stream.
    MaxStreamData {
        /// The stream.
        stream: u8,
        /// The sender may send bytes below this offset.
        max: u64,
    },
    /// Receiver-side failure notice.
    LinkStatus {
        /// The link reported on.
        link: LinkId,
        /// What was observed (see [`link_status`]).
        status: u8,
    },
    /// An unreliable datagram, or a piece of one (DATAGRAM or DATAGRAM_PART).
    Datagram {
        /// Its number: the sender numbers the DATAGRAM and DATAGRAM_PART frames it sends 0,
        /// 1, 2, ... in sending order, so the receiver can restore that order (the pieces of
        /// one datagram take consecutive numbers).
        seq: u64,
        /// Which piece of the application's datagram it carries.
        part: DatagramPart,
        /// Its bytes.
        data: &'a [u8],
    },
    /// Immediate close.
    Close {
        /// Error code (0: no error).
        code: u64,
        /// Human-readable reason (UTF-8, may be empty).
        reason: &'a [u8],
    },
}

/// Number of streams a connection carries.
pub const STREAMS: u8 = 2;

/// Iterates the frames of a short packet's payload, failing on the first malformed one.
#[derive(Debug, Clone)]
pub struct Frames<'a> {
    r: Reader<'a>,
    failed: bool,
}

impl<'a> Frames<'a> {
    /// Frames of `payload` (the bytes after a short header).
    pub fn new(payload: &'a [u8]) -> Self {
        Self {
            r: Reader::new(payload),
            failed: false,
        }
    }

    fn parse(&mut self) -> Result<Frame<'a>, DecodeError> {
        let r = &mut self.r;
        let t = r.u8()?;
        Ok(match t {
            frame_type::PADDING => {
                while r.peek_u8() == Some(0) {
                    r.u8()?;
                }
                Frame::Padding
            }
            frame_type::PING => Frame::Ping,
            frame_type::ACK => {
                let link = LinkId(r.u8()?);
                let largest = r.varint()?;
                let delay_us = r.varint()?;
                let count = r.varint()?;
                let first = r.varint()?;
                let mut low = largest
                    .checked_sub(first)
                    .ok_or(DecodeError::Malformed("ack range below zero"))?;
                let start = r.clone();
                for _ in 0..count {
                    let gap = r.varint()?;
                    let len = r.varint()?;
                    low = low
                        .checked_sub(gap.saturating_add(2))
                        .and_then(|x| x.checked_sub(len))
                        .ok_or(DecodeError::Malformed("ack range below zero"))?;
                }
                let used = start.remaining() - r.remaining();
                let rest = &start.buf[start.pos..start.pos + used];
                Frame::Ack {
                    link,
                    largest,
                    delay_us,
                    ranges: AckRanges {
                        largest,
                        first,
                        count,
                        rest,
                    },
                }
            }
            frame_type::MAX_STREAM_DATA => {
                let stream = r.u8()?;
                if stream >= STREAMS {
                    return Err(DecodeError::Malformed("stream number"));
                }
                Frame::MaxStreamData {
                    stream,
                    max: r.varint()?,
                }
            }
            frame_type::LINK_STATUS => Frame::LinkStatus {
                link: LinkId(r.u8()?),
                status: r.u8()?,
            },
            frame_type::DATAGRAM => {
                let seq = r.varint()?;
                let len = r.varint()? as usize;
                Frame::Datagram {
                    seq,
                    part: DatagramPart::Whole,
                    data: r.bytes(len)?,
                }
            }
            t if (frame_type::DATAGRAM_PART_BASE..frame_type::DATAGRAM_PART_BASE + 8)
                .contains(&t) =>
            {
                let part = DatagramPart::from_position(t & 0x03)
                    .ok_or(DecodeError::Malformed("datagram part position"))?;
                let seq = r.varint()?;
                let data = r.frame_data(t & frame_type::DATAGRAM_PART_LEN_BIT != 0)?;
                Frame::Datagram { seq, part, data }
            }
            frame_type::CLOSE => {
                let code = r.varint()?;
                let len = r.varint()? as usize;
                Frame::Close {
                    code,
                    reason: r.bytes(len)?,
                }
            }
            t if (frame_type::STREAM_BASE..frame_type::STREAM_BASE + 8).contains(&t) => {
                let stream = (t >> 2) & 1;
                let offset = r.varint()?;
                let data = r.frame_data(t & frame_type::STREAM_LEN_BIT != 0)?;
                if offset.saturating_add(data.len() as u64) > VARINT_MAX {
                    return Err(DecodeError::Malformed("stream offset"));
                }
                Frame::Stream {
                    stream,
                    offset,
                    fin: t & frame_type::STREAM_FIN_BIT != 0,
                    data,
                }
            }
            _ => return Err(DecodeError::Malformed("unknown frame type")),
        })
    }
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<Frame<'a>, DecodeError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.r.remaining() == 0 {
            return None;
        }
        let f = self.parse();
        self.failed = f.is_err();
        Some(f)
    }
}

/// Bytes a STREAM frame header takes (type, offset and, when `with_len`, the length).
pub fn stream_header_len(offset: u64, len: usize, with_len: bool) -> usize {
    1 + varint_len(offset) + if with_len { varint_len(len as u64) } else { 0 }
}

/// Writes the header of a STREAM frame with an explicit length; the `len` data bytes follow.
pub fn write_stream_header(w: &mut Writer<'_>, stream: u8, offset: u64, fin: bool, len: usize) {
    let mut t = frame_type::STREAM_BASE | (stream << 2) | frame_type::STREAM_LEN_BIT;
    if fin {
        t |= frame_type::STREAM_FIN_BIT;
    }
    w.u8(t);
    w.varint(offset);
    w.varint(len as u64);
}

/// Writes a STREAM frame. Without `with_len` the data runs to the end of the packet.
pub fn write_stream(
    w: &mut Writer<'_>,
    stream: u8,
    offset: u64,
    fin: bool,
    data: &[u8],
    with_len: bool,
) {
    let mut t = frame_type::STREAM_BASE | (stream << 2);
    if with_len {
        t |= frame_type::STREAM_LEN_BIT;
    }
    if fin {
        t |= frame_type::STREAM_FIN_BIT;
    }
    w.u8(t);
    w.varint(offset);
    if with_len {
        w.varint(data.len() as u64);
    }
    w.bytes(data);
}

/// Writes an ACK frame for `link` from ranges given highest first as `(smallest, largest)`,
/// writing as many ranges as fit in `max_len` bytes (at least the first). Returns false,
/// writing nothing, when not even the first range fits.
pub fn write_ack<I>(
    w: &mut Writer<'_>,
    link: LinkId,
    delay_us: u64,
    ranges: I,
    max_len: usize,
) -> bool
where
    I: Iterator<Item = (u64, u64)> + Clone,
{
    let mut it = ranges.clone();
    let Some((lo, hi)) = it.next() else {
        return false;
    };
    let delay_us = delay_us.min(VARINT_MAX);
    let fixed = 2 + varint_len(hi) + varint_len(delay_us) + varint_len(hi - lo);
    // count how many further ranges fit (count varint sized for up to 16383 ranges)
    let mut size = fixed + 2;
    if size > max_len {
        return false;
    }
    let mut count = 0u64;
    let mut prev_lo = lo;
    for (l, h) in it {
        let gap = prev_lo - h - 2;
        let extra = varint_len(gap) + varint_len(h - l);
        if size + extra > max_len || count == 16383 {
            break;
        }
        size += extra;
        count += 1;
        prev_lo = l;
    }
    w.u8(frame_type::ACK);
    w.u8(link.0);
    w.varint(hi);
    w.varint(delay_us);
    w.varint(count);
    w.varint(hi - lo);
    let mut prev_lo = lo;
    for (l, h) in ranges.skip(1).take(count as usize) {
        w.varint(prev_lo - h - 2);
        w.varint(h - l);
        prev_lo = l;
    }
    true
}

/// Writes a MAX_STREAM_DATA frame (at most 11 bytes).
pub fn write_max_stream_data(w: &mut Writer<'_>, stream: u8, max: u64) {
    w.u8(frame_type::MAX_STREAM_DATA);
    w.u8(stream);
    w.varint(max);
}

/// Which piece of an application's datagram a frame carries: all of it (a DATAGRAM frame),
/// or, for one too large for a packet, its first, a middle or its last piece (a DATAGRAM_PART
/// frame, docs/PROTOCOL.md §5.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatagramPart {
    /// The whole datagram.
    Whole,
    /// Its first piece: more follow, numbered on.
    First,
    /// A piece between the first and the last.
    Middle,
    /// Its last piece.
    Last,
}

impl DatagramPart {
    /// The position bits of a DATAGRAM_PART frame's type (none for a whole datagram).
    fn position(self) -> u8 {
        match self {
            DatagramPart::Middle => 0,
            DatagramPart::First => 1,
            DatagramPart::Last => 2,
            DatagramPart::Whole => unreachable!("a whole datagram goes in a DATAGRAM frame"),
        }
    }

    fn from_position(bits: u8) -> Option<Self> {
        match bits {
            0 => Some(DatagramPart::Middle),
            1 => Some(DatagramPart::First),
            2 => Some(DatagramPart::Last),
            _ => None,
        }
    }
}

/// Bytes a DATAGRAM or DATAGRAM_PART frame numbered `seq` carrying `len` bytes takes with its
/// length field (see [`datagram_frame_len_to_end`] for a piece that ends the packet).
pub fn datagram_frame_len(seq: u64, len: usize) -> usize {
    1 + varint_len(seq) + varint_len(len as u64) + len
}

/// Bytes a DATAGRAM_PART frame numbered `seq` carrying `len` bytes takes without its length
/// field: the last frame of its packet, its piece running to the end.
pub fn datagram_frame_len_to_end(seq: u64, len: usize) -> usize {
    1 + varint_len(seq) + len
}

/// Writes a DATAGRAM or DATAGRAM_PART frame ([`datagram_frame_len`] bytes; the caller checked
/// the room), or, with `to_end`, a DATAGRAM_PART frame without a length that runs to the end
/// of the packet ([`datagram_frame_len_to_end`] bytes; the caller fills the packet with it).
pub fn write_datagram(w: &mut Writer<'_>, seq: u64, part: DatagramPart, data: &[u8], to_end: bool) {
    if part == DatagramPart::Whole {
        debug_assert!(
            !to_end,
            "a whole datagram's frame always carries its length"
        );
        w.u8(frame_type::DATAGRAM);
        w.varint(seq);
    } else {
        let len_bit = if to_end {
            0
        } else {
            frame_type::DATAGRAM_PART_LEN_BIT
        };
        w.u8(frame_type::DATAGRAM_PART_BASE | len_bit | part.position());
        w.varint(seq);
    }
    if part == DatagramPart::Whole || !to_end {
        w.varint(data.len() as u64);
    }
    w.bytes(data);
}

/// The most reason bytes a CLOSE frame with `code` carries within `max_len` bytes.
pub fn close_reason_room(code: u64, max_len: usize) -> usize {
    max_len.saturating_sub(1 + varint_len(code) + 2).min(1000)
}

/// The longest start of `s` of at most `max` bytes that ends between characters (a reason cut
/// to fit stays UTF-8).
pub fn utf8_prefix(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Writes a LINK_STATUS frame (3 bytes).
pub fn write_link_status(w: &mut Writer<'_>, link: LinkId, status: u8) {
    w.u8(frame_type::LINK_STATUS);
    w.u8(link.0);
    w.u8(status);
}

/// Writes a CLOSE frame; the reason is cut to fit `max_len` (to
/// [`close_reason_room`] bytes).
pub fn write_close(w: &mut Writer<'_>, code: u64, reason: &[u8], max_len: usize) {
    let reason = &reason[..reason.len().min(close_reason_room(code, max_len))];
    w.u8(frame_type::CLOSE);
    w.varint(code);
    w.varint(reason.len() as u64);
    w.bytes(reason);
}
