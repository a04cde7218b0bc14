//! The tunnel's TCP offloads, done in user space as a NIC would do them in hardware, so the
//! kernel handles inner TCP in 64 KB pieces instead of 1.4 KB packets.
//!
//! On reads (TSO), the interface may hand over one large TCP segment with a virtio-net header
//! saying how to cut it: [`carry_whole`] sends it as one datagram that the connection carries
//! in pieces (docs/PROTOCOL.md §5.9) and [`segment_for_write`] writes it whole at the peer,
//! or [`split`] cuts it as Linux's `tcp_gso_segment` does. On writes (GRO), consecutive
//! segments of one flow go to the interface as one ([`runs`], [`merged_header`]), so the
//! kernel runs its IP and TCP receive path, inside each `write`, once per run.
//!
//! Headers are read through `etherparse`'s checked views; they are rewritten (lengths, IDs,
//! sequence numbers, flags) and their checksums summed here, in place on the packet's bytes,
//! where `etherparse` would write whole headers from decoded structs.

use std::ops::Range;

use etherparse::{IpNumber, Ipv4HeaderSlice, TcpHeaderSlice};

/// Largest IP packet a coalesced write may describe.
const MAX_TOTAL: usize = 65_535;
/// Most segments merged into one write.
const MAX_SEGMENTS: usize = 64;

/// The IP protocol number of TCP, as the pseudo-header sums take it.
const TCP: u8 = IpNumber::TCP.0;
const ACK: u8 = 0x10;
const PSH: u8 = 0x08;
/// IPv4's Don't Fragment bit, in the header's byte 6.
const DF: u8 = 0x40;

/// virtio-net header fields (`include/uapi/linux/virtio_net.h`), in the host's byte order
/// (the legacy header a TUN device uses unless told otherwise).
pub const VNET_HDR_LEN: usize = 10;
const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
const VIRTIO_NET_HDR_F_DATA_VALID: u8 = 2;
const VIRTIO_NET_HDR_GSO_NONE: u8 = 0;
const VIRTIO_NET_HDR_GSO_TCPV4: u8 = 1;
const VIRTIO_NET_HDR_GSO_ECN: u8 = 0x80;

const FIN: u8 = 0x01;
const CWR: u8 = 0x80;

/// The virtio-net header in front of a packet read from the interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnetHeader {
    pub flags: u8,
    pub gso_type: u8,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHeader {
    pub fn parse(b: &[u8; VNET_HDR_LEN]) -> Self {
        Self {
            flags: b[0],
            gso_type: b[1],
            // b[2..4] is hdr_len, a hint; the packet's own headers say the same
            gso_size: u16::from_ne_bytes([b[4], b[5]]),
            csum_start: u16::from_ne_bytes([b[6], b[7]]),
            csum_offset: u16::from_ne_bytes([b[8], b[9]]),
        }
    }
}

/// Reusable buffers for the packets of one batch of reads.
#[derive(Debug, Default)]
pub struct Packets {
    bufs: Vec<Vec<u8>>,
    len: usize,
}

impl Packets {
    pub fn clear(&mut self) {
        self.len = 0;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn get(&self, i: usize) -> &[u8] {
        &self.bufs[i]
    }

    /// The packets' buffers, to be handed over whole (a buffer may come back empty: the next
    /// [`split`] fills it again).
    pub fn bufs_mut(&mut self) -> &mut [Vec<u8>] {
        &mut self.bufs[..self.len]
    }

    /// Adds the packet in `buf` itself, without a copy; `buf` gets the slot's old buffer.
    fn push_owned(&mut self, buf: &mut Vec<u8>) {
        if self.len == self.bufs.len() {
            self.bufs.push(Vec::new());
        }
        std::mem::swap(buf, &mut self.bufs[self.len]);
        self.len += 1;
    }

    /// A new packet made of `parts`, to be finished in place.
    fn push(&mut self, parts: &[&[u8]]) -> &mut Vec<u8> {
        if self.len == self.bufs.len() {
            self.bufs.push(Vec::new());
        }
        let buf = &mut self.bufs[self.len];
        self.len += 1;
        buf.clear();
        for p in parts {
            buf.extend_from_slice(p);
        }
        buf
    }
}

/// Adds what one read returned (`header`, `packet`) to `out` as IP packets with complete
/// checksums, cut to `gso_size` if the kernel handed over a large TCP segment. Returns how
/// many it added (none for a header it did not ask for, or a malformed large segment).
///
/// Cut as Linux's `tcp_gso_segment` does: each piece gets the headers with its own length,
/// IP ID, sequence number and checksums; FIN and PSH stay on the last piece, CWR on the first
/// (a segment [`carry_whole`] does not take goes this way).
pub fn split(header: &VnetHeader, packet: &[u8], out: &mut Packets) -> usize {
    let gso = header.gso_type & !VIRTIO_NET_HDR_GSO_ECN;
    if gso == VIRTIO_NET_HDR_GSO_NONE {
        let buf = out.push(&[packet]);
        if header.flags & VIRTIO_NET_HDR_F_NEEDS_CSUM != 0 {
            finish_checksum(buf, header.csum_start.into(), header.csum_offset.into());
        }
        return 1;
    }
    let mss = usize::from(header.gso_size);
    if gso != VIRTIO_NET_HDR_GSO_TCPV4 || mss == 0 {
        return 0;
    }
    let Ok(ip) = Ipv4HeaderSlice::from_slice(packet) else {
        return 0;
    };
    if ip.protocol() != IpNumber::TCP {
        return 0;
    }
    let ip_len = ip.slice().len();
    let Ok(tcp) = TcpHeaderSlice::from_slice(&packet[ip_len..]) else {
        return 0;
    };
    let header_len = ip_len + tcp.slice().len();
    let (id, seq, flags) = (ip.identification(), tcp.sequence_number(), tcp.slice()[13]);
    let payload = &packet[header_len..];
    let count = payload.len().div_ceil(mss);
    for (i, chunk) in payload.chunks(mss).enumerate() {
        let p = out.push(&[&packet[..header_len], chunk]);
        let total = p.len();
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[4..6].copy_from_slice(&id.wrapping_add(i as u16).to_be_bytes());
        p[10..12].copy_from_slice(&[0, 0]);
        let sum = ipv4_checksum(&p[..ip_len]);
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        let tcp = ip_len;
        p[tcp + 4..tcp + 8].copy_from_slice(&seq.wrapping_add((i * mss) as u32).to_be_bytes());
        let mut f = flags;
        if i + 1 < count {
            f &= !(FIN | PSH);
        }
        if i > 0 {
            f &= !CWR;
        }
        p[tcp + 13] = f;
        p[tcp + 16..tcp + 18].copy_from_slice(&[0, 0]);
        let pseudo = sum32(&p[12..20], u64::from(TCP) + (total - ip_len) as u64);
        let sum = fold(sum32(&p[tcp..], pseudo));
        p[tcp + 16..tcp + 18].copy_from_slice(&(!sum).to_be_bytes());
    }
    count
}

/// Whether a packet read from the interface may be carried: not an IPv4 TCP packet that the
/// peer's daemon may merge with others ([`runs`]) whose IP header or TCP checksum is wrong.
/// Only one the kernel vouched for neither way is summed here (no `NEEDS_CSUM`, whose
/// checksum [`split`] finishes, nor `DATA_VALID`): a raw socket's packet, rare, so the bulk
/// path pays nothing. Merged at the peer such a packet would be taken as checked (see
/// [`merged_header`]); alone the peer's kernel drops it: the sender's daemon drops it instead.
pub fn checksums_hold(header: &VnetHeader, packet: &[u8]) -> bool {
    let vouched = header.flags & (VIRTIO_NET_HDR_F_NEEDS_CSUM | VIRTIO_NET_HDR_F_DATA_VALID);
    let gso = header.gso_type & !VIRTIO_NET_HDR_GSO_ECN;
    if vouched != 0 || gso != VIRTIO_NET_HDR_GSO_NONE || TcpView::parse(packet).is_none() {
        return true;
    }
    // a sum over the field itself comes to all ones where the checksum is right
    let pseudo = sum32(&packet[12..20], u64::from(TCP) + (packet.len() - 20) as u64);
    fold(sum32(&packet[..20], 0)) == 0xffff && fold(sum32(&packet[20..], pseudo)) == 0xffff
}

/// The smallest segment size of a large TCP segment carried whole and taken whole: Linux's
/// least TCP MSS (`net.ipv4.tcp_min_snd_mss`'s default and least value). Below it a peer would
/// have the interface, or a router behind it, cut a segment into up to 64 thousand packets. A
/// kernel can still cut smaller (its MSS clamped to this, less the TCP options: an interface
/// MTU of about 100 bytes): such segments are cut into packets before they leave.
const MIN_SEGMENT_SIZE: u16 = 48;

/// A segment size the kernel reads as "cut by fragments", not a size (`GSO_BY_FRAGS`): it
/// refuses it on a write from user space.
const GSO_BY_FRAGS: u16 = u16::MAX;

/// First byte of a large TCP segment carried whole (an IP packet starts with its version).
const SEGMENT_MARK: u8 = 0;

/// Whether `message` from a peer is a large TCP segment carried whole ([`carry_whole`]),
/// whether or not this host can take it ([`segment_for_write`]).
pub fn is_segment(message: &[u8]) -> bool {
    message.first() == Some(&SEGMENT_MARK)
}
/// Bytes in front of a large TCP segment carried whole: the mark, the virtio-net GSO type
/// (ECN bit included) and the segment size, big-endian. Reads from the interface leave this
/// much room in front of the packet ([`crate::device::Tun::read_into`]), so a segment goes
/// out in the buffer it was read into.
pub const SEGMENT_PREFIX: usize = 4;

/// Adds what one read returned to `out` for the peer: `header`, and in `read` the packet
/// behind [`SEGMENT_PREFIX`] bytes of room. A large TCP segment goes whole, its prefix
/// written into that room saying how it is cut (the connection carries it in pieces that fill
/// its packets, and [`segment_for_write`] hands it to the peer's interface as it is): the
/// buffer itself joins `out`, and `read` gets the batch slot's old one in exchange (the next
/// read empties it). Anything else goes as [`split`] does. Returns how many packets it added.
///
/// Inner TCP's 52 bytes of headers then go once per 64 KB instead of once per 1.4 KB, and
/// the peer's kernel takes the segment as it took one from a local socket. Carried as a
/// datagram, losing any piece loses the whole segment (up to 47 of inner TCP's segments,
/// which its SACK recovery repairs at once); what a failing link had in flight goes again on
/// another, so only congestion loses pieces. Carried as a message, nothing is lost.
pub fn carry_whole(header: &VnetHeader, read: &mut Vec<u8>, out: &mut Packets) -> usize {
    let Some(packet) = read.get(SEGMENT_PREFIX..) else {
        return 0;
    };
    let gso = header.gso_type & !VIRTIO_NET_HDR_GSO_ECN;
    let whole = gso == VIRTIO_NET_HDR_GSO_TCPV4
        && header.gso_size >= MIN_SEGMENT_SIZE
        && TcpView::parse(packet).is_some_and(|t| t.payload_len() > usize::from(header.gso_size));
    if !whole {
        return split(header, packet, out);
    }
    let size = header.gso_size.to_be_bytes();
    read[..SEGMENT_PREFIX].copy_from_slice(&[SEGMENT_MARK, header.gso_type, size[0], size[1]]);
    out.push_owned(read);
    1
}

/// If `message` is a large TCP segment carried whole ([`carry_whole`]), makes it ready for
/// the interface: returns the virtio-net header of its write and where its IP packet starts
/// (the IP checksum and the TCP pseudo-header sum are set again here, so the write does not
/// depend on what the sender's kernel left in them). None for a plain packet, or a malformed
/// segment (dropped).
pub fn segment_for_write(message: &mut [u8]) -> Option<([u8; VNET_HDR_LEN], usize)> {
    if message.len() < SEGMENT_PREFIX || message[0] != SEGMENT_MARK {
        return None;
    }
    let (gso_type, size) = (message[1], u16::from_be_bytes([message[2], message[3]]));
    let packet = &mut message[SEGMENT_PREFIX..];
    let view = TcpView::parse(packet)?;
    if gso_type & !VIRTIO_NET_HDR_GSO_ECN != VIRTIO_NET_HDR_GSO_TCPV4
        || size < MIN_SEGMENT_SIZE
        || size == GSO_BY_FRAGS
    {
        return None;
    }
    let header_len = view.header_len;
    packet[10..12].copy_from_slice(&[0, 0]);
    let sum = ipv4_checksum(&packet[..20]);
    packet[10..12].copy_from_slice(&sum.to_be_bytes());
    let pseudo = sum32(&packet[12..20], u64::from(TCP) + (packet.len() - 20) as u64);
    packet[36..38].copy_from_slice(&fold(pseudo).to_be_bytes());
    let mut vnet = [0u8; VNET_HDR_LEN];
    vnet[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM;
    vnet[1] = gso_type;
    vnet[2..4].copy_from_slice(&(header_len as u16).to_ne_bytes());
    vnet[4..6].copy_from_slice(&size.to_ne_bytes());
    // the checksum the kernel completes: from the TCP header on, stored at its offset 16
    vnet[6..8].copy_from_slice(&20u16.to_ne_bytes());
    vnet[8..10].copy_from_slice(&16u16.to_ne_bytes());
    Some((vnet, SEGMENT_PREFIX))
}

/// Completes a checksum the kernel left to the device: the field at `start + offset` holds
/// the pseudo-header sum; the checksum covers everything from `start`.
fn finish_checksum(packet: &mut [u8], start: usize, offset: usize) {
    let at = start + offset;
    if at + 2 > packet.len() {
        return;
    }
    let sum = !fold(sum32(&packet[start..], 0));
    // as Linux does (`skb_checksum_help`): a UDP checksum of 0 would mean "none", and for
    // TCP 0xffff is the same value in one's complement
    let sum = if sum == 0 { 0xffff } else { sum };
    packet[at..at + 2].copy_from_slice(&sum.to_be_bytes());
}

/// The 16-bit one's complement sum of `data` (RFC 1071) plus `initial`, not yet folded:
/// 32-bit big-endian words added into 64 bits fold to the same 16-bit sum.
fn sum32(data: &[u8], initial: u64) -> u64 {
    let mut sum = initial;
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        sum += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    let rest = words.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    sum + u64::from(u32::from_be_bytes(tail))
}

fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// What the coalescer needs of one inner IPv4/TCP packet; None for anything it leaves alone.
#[derive(Debug, Clone, Copy)]
struct TcpView<'a> {
    packet: &'a [u8],
    /// IP + TCP header bytes.
    header_len: usize,
    seq: u32,
    flags: u8,
}

impl<'a> TcpView<'a> {
    fn parse(packet: &'a [u8]) -> Option<Self> {
        let ip = Ipv4HeaderSlice::from_slice(packet).ok()?;
        // IPv4 without options (the coalescer compares headers at fixed offsets), TCP, the
        // whole packet, no fragment (MF or an offset; DF is fine)
        if ip.ihl() != 5
            || ip.protocol() != IpNumber::TCP
            || usize::from(ip.total_len()) != packet.len()
            || ip.is_fragmenting_payload()
        {
            return None;
        }
        let tcp = TcpHeaderSlice::from_slice(&packet[20..]).ok()?;
        Some(Self {
            packet,
            header_len: 20 + tcp.slice().len(),
            seq: tcp.sequence_number(),
            // the flags byte whole (CWR to FIN), compared as such
            flags: tcp.slice()[13],
        })
    }

    fn payload_len(&self) -> usize {
        self.packet.len() - self.header_len
    }

    /// Whether `next` may follow `self` in one coalesced write whose segments are `size`
    /// bytes.
    fn continued_by(&self, next: &TcpView, size: usize) -> bool {
        let (a, b) = (self.packet, next.packet);
        self.flags == ACK
            && (next.flags == ACK || next.flags == ACK | PSH)
            && self.payload_len() == size
            && next.payload_len() > 0
            && next.payload_len() <= size
            && self.header_len == next.header_len
            && next.seq == self.seq.wrapping_add(size as u32)
            // TOS, DF, then TTL and protocol, addresses and ports
            && a[1] == b[1]
            && a[6] & DF == b[6] & DF
            && a[8..10] == b[8..10]
            && a[12..24] == b[12..24]
            // ACK number, the header length's byte (with AccECN's AE bit), then window (flags
            // compared above), then options
            && a[28..33] == b[28..33]
            && a[34..36] == b[34..36]
            && a[40..self.header_len] == b[40..next.header_len]
    }
}

/// Splits `packets` into runs of consecutive packets that can be written as one (runs of one
/// are written as they are), into `out` (cleared first).
///
/// The rules follow Linux's own GRO for TCP (`tcp_gro_receive`): IPv4 without options or
/// fragments, same addresses, ports, TTL, TOS and DF, the same ACK number, window, flags (ACK,
/// with PSH allowed on the last segment) and TCP options (timestamps included), sequence
/// numbers that continue each other, every segment but the last of the first one's size, and
/// at most 64 KB in all.
pub fn runs(packets: &[&[u8]], out: &mut Vec<Range<usize>>) {
    out.clear();
    let mut i = 0;
    while i < packets.len() {
        let mut end = i + 1;
        if let Some(first) = TcpView::parse(packets[i]) {
            let size = first.payload_len();
            let mut last = first;
            let mut total = first.packet.len();
            while end < packets.len() && end - i < MAX_SEGMENTS {
                let Some(next) = TcpView::parse(packets[end]) else {
                    break;
                };
                if !last.continued_by(&next, size) || total + next.payload_len() > MAX_TOTAL {
                    break;
                }
                total += next.payload_len();
                last = next;
                end += 1;
            }
        }
        out.push(i..end);
        i = end;
    }
}

/// The header of one coalesced write of `segments` (a run of two or more from [`runs`]): the
/// virtio-net header, then the first segment's IP and TCP headers with the total length, the
/// IP checksum, the last segment's PSH and the TCP pseudo-header sum. The payloads follow,
/// each segment's after its own headers (`segment[header_len..]`, header_len being the
/// returned value).
///
/// The merged segment's TCP checksum is left for the kernel to finish, as for a packet a
/// local socket sends (`NEEDS_CSUM`, the field holding the pseudo-header sum), and a socket
/// on this host takes it as checked. So the segments' own checksums are not verified here:
/// ri2n's AEAD checked that their bytes are what the peer's daemon sent, and that daemon
/// summed them itself ([`split`]) or dropped those whose sums were wrong
/// ([`checksums_hold`]). Verifying them again would cost a pass over every byte, on the path
/// that limits the tunnel's rate.
pub fn merged_header(segments: &[&[u8]], out: &mut Vec<u8>) -> usize {
    let first = TcpView::parse(segments[0]).expect("a run from `runs`");
    let last = TcpView::parse(segments[segments.len() - 1]).expect("a run from `runs`");
    let header_len = first.header_len;
    let total: usize = header_len + segments.iter().map(|s| s.len() - header_len).sum::<usize>();
    out.clear();
    out.push(VIRTIO_NET_HDR_F_NEEDS_CSUM);
    out.push(VIRTIO_NET_HDR_GSO_TCPV4);
    out.extend_from_slice(&(header_len as u16).to_ne_bytes());
    out.extend_from_slice(&(first.payload_len() as u16).to_ne_bytes());
    // the checksum the kernel completes: from the TCP header on, stored at its offset 16
    out.extend_from_slice(&20u16.to_ne_bytes());
    out.extend_from_slice(&16u16.to_ne_bytes());
    let ip = out.len();
    out.extend_from_slice(&segments[0][..header_len]);
    out[ip + 2..ip + 4].copy_from_slice(&(total as u16).to_be_bytes());
    out[ip + 10..ip + 12].copy_from_slice(&[0, 0]);
    let sum = ipv4_checksum(&out[ip..ip + 20]);
    out[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
    out[ip + 33] |= last.flags & PSH;
    let pseudo = sum32(&out[ip + 12..ip + 20], u64::from(TCP) + (total - 20) as u64);
    let partial = fold(pseudo);
    out[ip + 36..ip + 38].copy_from_slice(&partial.to_be_bytes());
    header_len
}

/// The virtio-net header of a write of one packet as it is.
pub const PLAIN_HEADER: [u8; VNET_HDR_LEN] = [0; VNET_HDR_LEN];

/// RFC 791 header checksum (the field itself zero in `header`).
fn ipv4_checksum(header: &[u8]) -> u16 {
    !fold(sum32(header, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4/TCP segment of flow `port` with timestamps (32-byte TCP header).
    fn segment(port: u16, seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
        let total = 20 + 32 + payload.len();
        let mut p = vec![
            0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, TCP, 0, 0, 10, 99, 0, 1, 10, 99, 0, 2,
        ];
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        let sum = ipv4_checksum(&p);
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        p.extend_from_slice(&port.to_be_bytes());
        p.extend_from_slice(&5201u16.to_be_bytes());
        p.extend_from_slice(&seq.to_be_bytes());
        p.extend_from_slice(&7u32.to_be_bytes()); // ack
        p.extend_from_slice(&[0x80, flags, 0x01, 0xf5, 0, 0, 0, 0]);
        p.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 3]); // NOP NOP TS
        p.extend_from_slice(payload);
        let pseudo = sum32(&p[12..20], u64::from(TCP) + (p.len() - 20) as u64);
        let sum = !fold(sum32(&p[20..], pseudo));
        p[36..38].copy_from_slice(&sum.to_be_bytes());
        p
    }

    fn runs_of(packets: &[&[u8]]) -> Vec<Range<usize>> {
        let mut out = vec![7..9, 1..2]; // stale content, to be cleared
        runs(packets, &mut out);
        out
    }

    fn views(v: &[Vec<u8>]) -> Vec<&[u8]> {
        v.iter().map(Vec::as_slice).collect()
    }

    #[test]
    fn segments_that_continue_each_other_are_merged_and_others_are_not() {
        let packets = vec![
            segment(1000, 100, ACK, &[1; 100]),
            segment(1000, 200, ACK, &[2; 100]),
            segment(1000, 300, ACK | PSH, &[3; 60]),
            // a gap
            segment(1000, 500, ACK, &[4; 100]),
            // another flow
            segment(1001, 600, ACK, &[5; 100]),
            segment(1001, 700, ACK, &[6; 100]),
            // a bare ACK, then not TCP
            segment(1001, 800, ACK, &[]),
            vec![
                0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8,
            ],
        ];
        assert_eq!(runs_of(&views(&packets)), [0..3, 3..4, 4..6, 6..7, 7..8]);
    }

    #[test]
    fn a_shorter_segment_or_a_push_ends_a_write() {
        let packets = vec![
            segment(1000, 100, ACK, &[1; 100]),
            segment(1000, 200, ACK, &[2; 50]),
            segment(1000, 250, ACK, &[3; 50]),
            segment(1000, 300, ACK | PSH, &[4; 50]),
            segment(1000, 350, ACK, &[5; 50]),
        ];
        assert_eq!(runs_of(&views(&packets)), [0..2, 2..4, 4..5]);
    }

    #[test]
    fn the_merged_header_describes_the_whole_and_how_it_was_cut() {
        let packets = vec![
            segment(1000, 100, ACK, &[1; 100]),
            segment(1000, 200, ACK, &[2; 100]),
            segment(1000, 300, ACK | PSH, &[3; 60]),
        ];
        let mut h = Vec::new();
        let header_len = merged_header(&views(&packets), &mut h);
        assert_eq!(header_len, 52);
        assert_eq!(h.len(), VNET_HDR_LEN + 52);
        // NEEDS_CSUM, GSO TCPv4, hdr_len 52, gso_size 100, checksum from 20, at 16 after it
        assert_eq!(h[..10], [1, 1, 52, 0, 100, 0, 20, 0, 16, 0]);
        let ip = &h[VNET_HDR_LEN..];
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 52 + 260);
        assert_eq!(
            ipv4_checksum(&ip[..20]),
            0,
            "a valid IP checksum sums to zero"
        );
        assert_eq!(ip[33], ACK | PSH, "the last segment's push");
        assert_eq!(
            ip[24..28],
            100u32.to_be_bytes(),
            "the first segment's sequence"
        );
        // completed over the TCP header and payloads, the checksum verifies
        let mut tcp = ip[20..52].to_vec();
        for p in &packets {
            tcp.extend_from_slice(&p[52..]);
        }
        let field = u16::from_be_bytes([tcp[16], tcp[17]]);
        tcp[16..18].copy_from_slice(&[0, 0]);
        let full =
            !ipv4_checksum(&[&[field.to_be_bytes()[0], field.to_be_bytes()[1]][..], &tcp].concat());
        let mut check = [
            &ip[12..20],
            &[0, TCP][..],
            &((32 + 260) as u16).to_be_bytes()[..],
            &tcp,
        ]
        .concat();
        check[12 + 16..12 + 18].copy_from_slice(&(!full).to_be_bytes());
        assert_eq!(
            ipv4_checksum(&check),
            0,
            "pseudo header + segment sum to zero"
        );
    }

    /// A TCP packet whose checksums the kernel vouched for neither way (a raw socket's) is
    /// carried only with both right: merged at the peer, a wrong one would pass as checked.
    #[test]
    fn a_raw_tcp_packet_with_a_wrong_checksum_is_not_carried() {
        let plain = VnetHeader::default();
        let good = segment(40000, 1, ACK, &[7; 100]);
        assert!(checksums_hold(&plain, &good));
        let mut bad_tcp = good.clone();
        bad_tcp[60] ^= 1; // a payload byte
        assert!(!checksums_hold(&plain, &bad_tcp));
        let mut bad_ip = good.clone();
        bad_ip[10] ^= 0x12;
        assert!(!checksums_hold(&plain, &bad_ip));
        // left to the device (the field holding the pseudo-header sum) or checked already
        for flags in [VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_F_DATA_VALID] {
            assert!(checksums_hold(&VnetHeader { flags, ..plain }, &bad_tcp));
        }
        // not TCP: never merged, the peer's kernel checks it alone
        let mut udp = bad_tcp.clone();
        udp[9] = 17;
        assert!(checksums_hold(&plain, &udp));
    }

    /// Whether a packet's IP and TCP checksums verify.
    fn checksums_verify(p: &[u8]) -> bool {
        let pseudo = sum32(&p[12..20], u64::from(TCP) + (p.len() - 20) as u64);
        ipv4_checksum(&p[..20]) == 0 && fold(sum32(&p[20..], pseudo)) == 0xffff
    }

    #[test]
    fn a_large_segment_is_cut_as_the_kernel_would() {
        // three segments' worth, sent with PSH and FIN, checksum left to finish
        let payload: Vec<u8> = (0..250u32).map(|i| i as u8).collect();
        let mut big = segment(1000, 5000, ACK | PSH | FIN | CWR, &payload);
        big[36..38].copy_from_slice(&[0xab, 0xcd]); // whatever the field held
        let h = VnetHeader {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: VIRTIO_NET_HDR_GSO_TCPV4,
            gso_size: 100,
            csum_start: 20,
            csum_offset: 16,
        };
        let mut out = Packets::default();
        assert_eq!(split(&h, &big, &mut out), 3);
        let want = [
            (5000, 100, ACK | CWR),
            (5100, 100, ACK),
            (5200, 50, ACK | PSH | FIN),
        ];
        for (i, (seq, len, flags)) in want.into_iter().enumerate() {
            let p = out.get(i);
            assert_eq!(p.len(), 52 + len, "piece {i}");
            assert_eq!(u16::from_be_bytes([p[2], p[3]]) as usize, p.len());
            assert_eq!(u16::from_be_bytes([p[4], p[5]]), 0x1234 + i as u16, "IP ID");
            assert_eq!(p[24..28], u32::to_be_bytes(seq));
            assert_eq!(p[33], flags, "piece {i}");
            assert_eq!(p[52..], payload[seq as usize - 5000..][..len]);
            assert!(checksums_verify(p), "piece {i}");
        }
        // as GRO, the coalescer leaves pieces with CWR or FIN alone
        let pieces: Vec<&[u8]> = (0..3).map(|i| out.get(i)).collect();
        assert_eq!(runs_of(&pieces), [0..1, 1..2, 2..3]);
    }

    #[test]
    fn a_packet_whose_checksum_was_left_is_finished() {
        let mut p = segment(1000, 1, ACK, &[9; 33]);
        let good = p.clone();
        assert!(checksums_verify(&good));
        // what the kernel hands over: the pseudo-header sum in the field
        let pseudo = fold(sum32(&p[12..20], u64::from(TCP) + (p.len() - 20) as u64));
        p[36..38].copy_from_slice(&pseudo.to_be_bytes());
        let h = VnetHeader {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            csum_start: 20,
            csum_offset: 16,
            ..VnetHeader::default()
        };
        let mut out = Packets::default();
        assert_eq!(split(&h, &p, &mut out), 1);
        assert_eq!(out.get(0), &good[..]);
        // a plain one is passed as it is
        out.clear();
        assert_eq!(split(&VnetHeader::default(), &good, &mut out), 1);
        assert_eq!(out.get(0), &good[..]);
    }

    /// Two segments that differ only where Linux's GRO keeps them apart too: the AE bit
    /// (AccECN's counter) or DF, which a merged packet would carry for both.
    #[test]
    fn segments_that_differ_in_the_ae_bit_or_df_are_not_merged() {
        let a = segment(1000, 100, ACK, &[1; 100]);
        assert_eq!(
            runs_of(&views(&[a.clone(), segment(1000, 200, ACK, &[2; 100])])),
            [Range { start: 0, end: 2 }],
            "the premise: they merge otherwise"
        );
        let mut ae = segment(1000, 200, ACK, &[2; 100]);
        ae[32] |= 0x01;
        assert_eq!(runs_of(&views(&[a.clone(), ae])), [0..1, 1..2]);
        let mut may_fragment = segment(1000, 200, ACK, &[2; 100]);
        may_fragment[6] &= !DF;
        assert_eq!(runs_of(&views(&[a, may_fragment])), [0..1, 1..2]);
    }

    /// A UDP datagram whose checksum, finished here, comes to 0 goes with 0xffff: 0 would
    /// say it has none.
    #[test]
    fn a_udp_checksum_that_comes_to_zero_is_sent_as_ffff() {
        let mut p = vec![
            0x45, 0, 0, 30, 0, 1, 0x40, 0, 64, 17, 0, 0, 10, 99, 0, 1, 10, 99, 0, 2,
        ];
        p.extend_from_slice(&[0x13, 0x88, 0x13, 0x89, 0, 10, 0, 0, 0, 0]);
        // the pseudo-header sum in the field, as the kernel leaves it, and two data bytes
        // chosen so that the whole sums to 0xffff
        let pseudo = fold(sum32(&p[12..20], 17 + 10));
        p[26..28].copy_from_slice(&pseudo.to_be_bytes());
        let fill = 0xffff - fold(sum32(&p[20..], 0));
        p[28..30].copy_from_slice(&fill.to_be_bytes());
        assert_eq!(fold(sum32(&p[20..], 0)), 0xffff, "the premise");
        let h = VnetHeader {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            csum_start: 20,
            csum_offset: 6,
            ..VnetHeader::default()
        };
        let mut out = Packets::default();
        assert_eq!(split(&h, &p, &mut out), 1);
        assert_eq!(out.get(0)[26..28], [0xff, 0xff]);
    }

    /// `packet` as a read from the interface leaves it: behind the prefix's room.
    fn as_read(packet: &[u8]) -> Vec<u8> {
        [&[0xee; SEGMENT_PREFIX][..], packet].concat()
    }

    #[test]
    fn a_large_segment_carried_whole_is_written_as_one_with_how_to_cut_it() {
        let payload: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        let mut big = segment(1000, 5000, ACK | PSH, &payload);
        big[36..38].copy_from_slice(&[0xab, 0xcd]); // whatever the field held
        let h = VnetHeader {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: VIRTIO_NET_HDR_GSO_TCPV4 | VIRTIO_NET_HDR_GSO_ECN,
            gso_size: 1374,
            csum_start: 20,
            csum_offset: 16,
        };
        let mut out = Packets::default();
        let mut read = as_read(&big);
        assert_eq!(carry_whole(&h, &mut read, &mut out), 1);
        assert!(read.is_empty(), "the read buffer itself went out");
        let mut message = out.get(0).to_vec();
        assert_eq!(message.len(), SEGMENT_PREFIX + big.len());
        let (vnet, start) = segment_for_write(&mut message).expect("a segment");
        let written = &message[start..];
        assert_eq!(written[..36], big[..36]);
        assert_eq!(
            written[38..],
            big[38..],
            "only the checksum field is set again"
        );
        // the header says how to cut it and where the checksum the kernel finishes is
        assert_eq!(vnet[0], VIRTIO_NET_HDR_F_NEEDS_CSUM);
        assert_eq!(vnet[1], h.gso_type, "the ECN bit goes along");
        assert_eq!(u16::from_ne_bytes([vnet[2], vnet[3]]), 52);
        assert_eq!(u16::from_ne_bytes([vnet[4], vnet[5]]), 1374);
        assert_eq!(u16::from_ne_bytes([vnet[6], vnet[7]]), 20);
        assert_eq!(u16::from_ne_bytes([vnet[8], vnet[9]]), 16);
        // finished over the pseudo-header sum left in the field, the checksum verifies
        let mut done = written.to_vec();
        finish_checksum(&mut done, 20, 16);
        assert!(checksums_verify(&done));
        // a plain packet is no segment; one of a single segment's size is sent as it is
        let small = segment(1000, 1, ACK, &[1; 100]);
        assert!(segment_for_write(&mut small.clone()).is_none());
        out.clear();
        let one = VnetHeader {
            gso_size: 1374,
            ..h
        };
        let mut read = as_read(&small);
        assert_eq!(carry_whole(&one, &mut read, &mut out), 1);
        assert_eq!(out.get(0), &small[..]);
        assert_eq!(read, as_read(&small), "a copy went out");
        // a broken segment is dropped, not written
        let mut broken = message.clone();
        broken[SEGMENT_PREFIX + 9] = 17; // UDP
        assert!(segment_for_write(&mut broken).is_none());
        let mut cut = message[..60].to_vec();
        assert!(segment_for_write(&mut cut).is_none());
        // a size no kernel cuts to is refused: the interface would cut 3000 one-byte pieces
        let mut tiny = message.clone();
        tiny[2..4].copy_from_slice(&1u16.to_be_bytes());
        assert!(segment_for_write(&mut tiny).is_none());
        tiny[2..4].copy_from_slice(&MIN_SEGMENT_SIZE.to_be_bytes());
        assert!(segment_for_write(&mut tiny).is_some());
        // nor the size that means "by fragments" to the kernel, which refuses it
        tiny[2..4].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(segment_for_write(&mut tiny).is_none());
    }

    /// A segment the local kernel cut smaller than the peer takes (an MSS clamped to the
    /// least, less TCP options) is cut into packets here instead of going whole: before, it
    /// went whole and the peer dropped it.
    #[test]
    fn a_segment_cut_smaller_than_a_peer_takes_goes_as_packets() {
        let payload = [7u8; 360];
        let big = segment(1000, 5000, ACK, &payload);
        let h = VnetHeader {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: VIRTIO_NET_HDR_GSO_TCPV4,
            gso_size: 36,
            csum_start: 20,
            csum_offset: 16,
        };
        let mut out = Packets::default();
        let mut read = as_read(&big);
        assert_eq!(carry_whole(&h, &mut read, &mut out), 10);
        for i in 0..10 {
            assert!(!is_segment(out.get(i)), "packet {i} is plain");
            assert_eq!(out.get(i).len(), big.len() - payload.len() + 36);
        }
    }

    #[test]
    fn at_most_64_kb_go_in_one_write() {
        let packets: Vec<Vec<u8>> = (0..60)
            .map(|i| segment(1000, 1374 * i, ACK, &[0; 1374]))
            .collect();
        let r = runs_of(&views(&packets));
        assert_eq!(r[0], 0..47, "47 × 1374 + 52 ≤ 65535 < 48 × 1374 + 52");
        assert_eq!(r[1], 47..60);
    }
}
