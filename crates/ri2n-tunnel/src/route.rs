//! Routing: each queue of the interface is read in batches, and each IPv4 packet handed to
//! the connection of the host that owns its destination ([`Router`]). A route loop per queue
//! does it on a thread of its own, or, on a host of few CPUs with one queue, the peer loop
//! between its deliveries (`peer_loop`).

use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use etherparse::icmpv4::DestUnreachableHeader;
use etherparse::{Icmpv4Type, IpNumber, Ipv4HeaderSlice, PacketBuilder};

use crate::busy_poll::BusyPoll;
use crate::device::Tun;
use crate::peers::{self, Peers};
use crate::{offload, Carry, Stop};

/// Packets read from the interface, or received from a peer, handled in one go.
pub(crate) const BATCH: usize = 64;
/// Bytes read from the interface in one go, at most (and one more read).
pub(crate) const BATCH_BYTES: usize = 128 * 1024;

/// Reads queue `queue` of the interface and sends each IPv4 packet to the host owning its
/// destination. The packets waiting are read in a batch; carried as datagrams, they are
/// handed to each peer's connection in one call, so the connection's lock is taken and its
/// packets are sent once per batch, not per packet (carried as messages, likewise, in one
/// call). A large TCP segment goes as one datagram or message, which the connection carries
/// in pieces that fill its packets: inner TCP's headers then cost 52 bytes per 64 KB instead
/// of per 1.4 KB, and the peer writes it to its interface as it came.
/// With a busy-poll window the loop looks at the queue again and again for that long after
/// its last packet before it waits ([`BusyPoll`]).
pub(crate) fn route_loop(peers: &Peers, tun: &Tun, queue: usize, stop: &Stop, busy: Duration) {
    let mut busy = BusyPoll::new(busy);
    let mut router = Router::new(queue);
    loop {
        // an error ends the spin: the read below reports it
        if router.drained() && !busy.spin(|| tun.is_readable().unwrap_or(true)) {
            if let Err(e) = tun.wait_readable() {
                return stop.fail(format!("waiting for the interface failed: {e}"));
            }
        }
        match router.batch(peers, tun) {
            Ok(0) => {}
            Ok(_) => busy.handled(),
            Err(why) => return stop.fail(why),
        }
    }
}

/// One queue's reading and routing, a batch at a time: its buffers, kept from one batch to
/// the next, and where the last batch ended. The queue's route loop drives it, or, when the
/// interface has one queue, the peer loop (`peer_loop`) between its deliveries.
pub(crate) struct Router {
    queue: usize,
    /// What the interface returns, behind room for a segment's prefix (a large TCP segment
    /// leaves in this buffer, and the next read gets another).
    read: Vec<u8>,
    packets: offload::Packets,
    /// By packet of `packets`: the peer it goes to (`usize::MAX`: none).
    dests: Vec<usize>,
    batch_peers: Vec<usize>,
    unreachable: Unreachable,
    /// The last batch ended at the interface's empty queue: wait before reading again.
    drained: bool,
}

impl Router {
    pub(crate) fn new(queue: usize) -> Self {
        Self {
            queue,
            read: Vec::new(),
            packets: offload::Packets::default(),
            dests: Vec::new(),
            batch_peers: Vec::new(),
            unreachable: Unreachable::default(),
            drained: true,
        }
    }

    /// Whether the last batch found the queue empty: the next needs a packet to come first.
    pub(crate) fn drained(&self) -> bool {
        self.drained
    }

    /// Reads a batch of the packets waiting on `tun` (about [`BATCH`] packets or
    /// [`BATCH_BYTES`]) and hands them to their peers' connections; how many reads it made.
    /// Fails when the interface can no longer be read.
    pub(crate) fn batch(&mut self, peers: &Peers, tun: &Tun) -> Result<u64, String> {
        let Router {
            queue,
            read,
            packets,
            dests,
            batch_peers,
            unreachable,
            drained,
        } = self;
        packets.clear();
        dests.clear();
        // the peers as the cluster file says now, by position
        let table = peers.table();
        // about BATCH packets or BATCH_BYTES: a batch of 64 large segments would be 4 MB,
        // more than a connection queues (it would drop the oldest)
        let (mut bytes, mut reads) = (0, 0);
        // The first packet after a wait goes at once, before the read that would find the
        // queue empty: a lone packet (a request, a reply) pays no system call on its way
        // out but its read and its send. What came behind it is read in batches from then on.
        let lone = *drained;
        *drained = false;
        while packets.len() < BATCH && bytes < BATCH_BYTES && !(lone && packets.len() > 0) {
            match tun.read_into(read, offload::SEGMENT_PREFIX) {
                Ok(header) => {
                    reads += 1;
                    let packet = &read[offload::SEGMENT_PREFIX..];
                    if !offload::checksums_hold(&header, packet) {
                        peers.bad_checksum.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let dest = match destination(&table, packet) {
                        Ok(dest) => dest,
                        Err(NoHost::Ipv4(ip)) => {
                            peers.unrouted.fetch_add(1, Ordering::Relaxed);
                            unreachable.answer(tun, &table, &ip, packet);
                            usize::MAX
                        }
                        Err(NoHost::NotIpv4) => {
                            peers.not_ipv4.fetch_add(1, Ordering::Relaxed);
                            usize::MAX
                        }
                    };
                    bytes += packet.len();
                    // large TCP segments whole: their headers once per 64 KB
                    let added = offload::carry_whole(&header, read, packets);
                    dests.extend(std::iter::repeat_n(dest, added));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    *drained = true;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading the interface failed: {e}")),
            }
        }
        peers.queue_reads[*queue].fetch_add(reads, Ordering::Relaxed);
        // the peers this batch goes to, each once (not every host of the cluster in turn)
        batch_peers.clear();
        batch_peers.extend(dests.iter().copied().filter(|&d| d != usize::MAX));
        batch_peers.sort_unstable();
        batch_peers.dedup();
        for &k in batch_peers.iter() {
            let peer = &table.peers[k];
            let mine = dests.iter().filter(|&&d| d == k).count() as u64;
            // no connection, a connection just lost, or (messages) a full send buffer: the
            // packets are dropped (and counted), as on a dead cable or a full NIC queue
            let sent = match (peer.conn(), peers.carry) {
                (None, _) => 0,
                (Some(conn), Carry::Datagrams) => {
                    // the buffers themselves: the connection sends them without a copy and
                    // leaves spare ones for the next reads
                    let batch = packets
                        .bufs_mut()
                        .iter_mut()
                        .zip(dests.iter())
                        .filter(|(_, &d)| d == k)
                        .map(|(b, _)| b);
                    // it stops at the first that fails: the last one it took
                    let mut taken = 0u64;
                    match conn.send_datagram_bufs(batch.inspect(|_| taken += 1)) {
                        Ok(()) => taken,
                        Err(_) => taken.saturating_sub(1),
                    }
                }
                // copied into the message stream, in one call: their packets leave together
                (Some(conn), Carry::Messages) => {
                    let batch = (0..packets.len())
                        .filter(|&j| dests[j] == k)
                        .map(|j| packets.get(j));
                    conn.try_send_messages(batch).map_or(0, |n| n as u64)
                }
            };
            peer.count_sent(sent);
            peer.drop_packets(mine - sent);
        }
        Ok(reads)
    }
}

/// Why a packet read from the interface goes to no peer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NoHost<'a> {
    /// An IPv4 packet (this header) for an address no host of the cluster owns.
    Ipv4(Ipv4HeaderSlice<'a>),
    /// Not IPv4 (the tunnel carries IPv4 only; the kernel's IPv6 neighbour and router
    /// solicitations come this way).
    NotIpv4,
}

/// The peer owning an IPv4 packet's destination.
fn destination<'a>(table: &peers::Table, packet: &'a [u8]) -> Result<usize, NoHost<'a>> {
    let ip = Ipv4HeaderSlice::from_slice(packet).map_err(|_| NoHost::NotIpv4)?;
    (table.by_tunnel_address(ip.destination_addr())).ok_or(NoHost::Ipv4(ip))
}

/// Least time between two answers of one route loop: a sender retrying fast learns soon
/// enough, and a flood of packets for absent hosts draws no flood back.
const UNREACHABLE_SPACING: Duration = Duration::from_millis(10);

/// Answers a packet for an address no host of the cluster owns as a router without a
/// route does (RFC 1812 §5.2.7.1): ICMP host unreachable to its sender, so that a connect
/// fails at once (`EHOSTUNREACH`) and a ping says why, where they would wait in silence. It
/// comes from the address the packet was for: the kernel drops a packet arriving from one of
/// its own addresses (a martian source), this host's tunnel address included. Never for an
/// ICMP error, a fragment after the first, or a packet to a broadcast or multicast address
/// (RFC 1122 §3.2.2).
#[derive(Debug, Default)]
struct Unreachable {
    last: Option<Instant>,
    packet: Vec<u8>,
}

impl Unreachable {
    fn answer(&mut self, tun: &Tun, table: &peers::Table, ip: &Ipv4HeaderSlice, packet: &[u8]) {
        let now = Instant::now();
        let (me, prefix) = (table.me().address, table.cluster.prefix);
        let subnet_broadcast = Ipv4Addr::from(u32::from(me) | u32::MAX >> prefix);
        if self.last.is_some_and(|t| now < t + UNREACHABLE_SPACING)
            || !unreachable_owed(ip, packet, subnet_broadcast)
        {
            return;
        }
        if host_unreachable(ip, packet, &mut self.packet) {
            self.last = Some(now);
            // best effort, as any ICMP error: a refused write is not the packet's sender's
            let _ = tun.write(&self.packet);
        }
    }
}

/// Writes into `out` the ICMP host unreachable that answers `packet` (whose IP header is
/// `ip`), from its destination: its IP header and the first 8 bytes of what it carries,
/// quoted (RFC 792). False if it cannot be written.
fn host_unreachable(ip: &Ipv4HeaderSlice, packet: &[u8], out: &mut Vec<u8>) -> bool {
    let quoted = &packet[..packet.len().min(ip.slice().len() + 8)];
    let builder = PacketBuilder::ipv4(ip.destination(), ip.source(), 64).icmpv4(
        Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::Host),
    );
    out.clear();
    builder.write(out, quoted).is_ok()
}

/// Whether `packet` (whose IP header is `ip`), for an address no host owns, is owed an ICMP
/// error (RFC 1122 §3.2.2): not when it is one itself, a fragment after the first, or sent to
/// or from an address that is no single host's: a broadcast or multicast one
/// (`subnet_broadcast`, the tunnel network's, among them), or 0.0.0.0.
fn unreachable_owed(ip: &Ipv4HeaderSlice, packet: &[u8], subnet_broadcast: Ipv4Addr) -> bool {
    let (src, dst) = (ip.source_addr(), ip.destination_addr());
    let single = |a: Ipv4Addr| {
        !(a.is_broadcast() || a.is_multicast() || a.is_unspecified() || a == subnet_broadcast)
    };
    if !single(src) || !single(dst) || ip.fragments_offset().value() != 0 {
        return false;
    }
    if ip.protocol() == IpNumber::ICMP {
        let icmp = &packet[ip.slice().len()..];
        // only queries and their replies are answered: echo (0, 8), timestamp (13, 14),
        // information (15, 16) and address mask (17, 18); every other type is an error or
        // unknown, which Linux's icmp_send takes for one too
        return icmp.first().is_some_and(|&t| matches!(t, 0 | 8 | 13..=18));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};

    /// [`host_unreachable`] of `packet`, which the route loop has parsed first (false if
    /// it is no IPv4 packet: the loop takes it for one of another protocol).
    fn answer_of(packet: &[u8], out: &mut Vec<u8>) -> bool {
        Ipv4HeaderSlice::from_slice(packet).is_ok_and(|ip| host_unreachable(&ip, packet, out))
    }

    /// [`unreachable_owed`] of `packet`, parsed first as [`answer_of`] does.
    fn owed(packet: &[u8], subnet_broadcast: Ipv4Addr) -> bool {
        Ipv4HeaderSlice::from_slice(packet)
            .is_ok_and(|ip| unreachable_owed(&ip, packet, subnet_broadcast))
    }

    /// A UDP packet from `src` to `dst` with `payload`, fragment offset `offset` (8-byte units).
    fn udp(src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        PacketBuilder::ipv4(src, dst, 64)
            .udp(40000, 7)
            .write(&mut out, payload)
            .unwrap();
        out
    }

    /// The answer parses as an IPv4 ICMP host unreachable (checksums checked) from the
    /// address the packet was for to its sender, quoting the packet's header and first 8
    /// bytes.
    #[test]
    fn the_answer_is_a_host_unreachable_quoting_the_packet() {
        let packet = udp([10, 99, 0, 1], [10, 99, 0, 77], &[7; 100]);
        let mut out = Vec::new();
        assert!(answer_of(&packet, &mut out));
        let parsed = SlicedPacket::from_ip(&out).unwrap();
        let Some(NetSlice::Ipv4(ip)) = &parsed.net else {
            panic!("not IPv4: {parsed:?}")
        };
        assert_eq!(ip.header().source_addr(), Ipv4Addr::new(10, 99, 0, 77));
        assert_eq!(ip.header().destination_addr(), Ipv4Addr::new(10, 99, 0, 1));
        assert_eq!(ip.header().protocol(), IpNumber::ICMP);
        let Some(TransportSlice::Icmpv4(icmp)) = &parsed.transport else {
            panic!("not ICMP: {parsed:?}")
        };
        assert_eq!(
            icmp.icmp_type(),
            Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::Host)
        );
        assert_eq!(icmp.payload(), &packet[..20 + 8]);
        let checksum = icmp.header().icmp_type.calc_checksum(icmp.payload());
        assert_eq!(icmp.checksum(), checksum);
        let mut none = Vec::new();
        assert!(!answer_of(&[0x60; 40], &mut none));
    }

    /// Packets owed no ICMP error get none (RFC 1122 §3.2.2); the others do.
    #[test]
    fn no_answer_to_errors_broadcasts_multicasts_or_later_fragments() {
        let bcast = Ipv4Addr::new(10, 99, 0, 255);
        let (me, absent) = ([10, 99, 0, 1], [10, 99, 0, 77]);
        assert!(owed(&udp(me, absent, b"x"), bcast));
        assert!(!owed(&udp(me, [10, 99, 0, 255], b"x"), bcast));
        assert!(!owed(&udp(me, [255; 4], b"x"), bcast));
        assert!(!owed(&udp(me, [224, 0, 0, 251], b"x"), bcast));
        assert!(!owed(&udp([0; 4], absent, b"x"), bcast));
        // from the tunnel network's broadcast address: no single host's either
        assert!(!owed(&udp([10, 99, 0, 255], absent, b"x"), bcast));
        // a fragment after the first: offset 1 (8 bytes), checksum left as it is
        let mut later = udp(me, absent, b"x");
        later[7] = 1;
        assert!(!owed(&later, bcast));
        let icmp = |t: u8| {
            let mut out = Vec::new();
            PacketBuilder::ipv4(me, absent, 64)
                .icmpv4_raw(t, 0, [0; 4])
                .write(&mut out, b"")
                .unwrap();
            out
        };
        for query in [0, 8, 13, 14, 15, 16, 17, 18] {
            assert!(owed(&icmp(query), bcast), "ICMP type {query}");
        }
        // errors, the obsolete types and those no RFC of the base set names (31: datagram
        // conversion error, 40: Photuris) are owed nothing: before, only 3, 4, 5, 11 and 12
        // went unanswered
        for error in [1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 19, 31, 40, 255] {
            assert!(!owed(&icmp(error), bcast), "ICMP type {error}");
        }
        assert!(!owed(&[0x60; 40], bcast), "IPv6");
    }
}
