//! The route loops, one per queue of the interface: each reads its queue and hands each IPv4
//! packet to the connection of the host that owns its destination.

use std::sync::atomic::Ordering;
use std::time::Duration;

use etherparse::Ipv4HeaderSlice;

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
/// packets are sent once per batch, not per packet (carried as messages, one call each).
/// A large TCP segment goes as one datagram, which the connection carries in pieces that
/// fill its packets: inner TCP's headers then cost 52 bytes per 64 KB instead of per 1.4 KB,
/// and the peer writes it to its interface as it came. (Carried as messages, a segment is
/// cut to the MTU.)
/// With a busy-poll window the loop looks at the queue again and again for that long after
/// its last packet before it waits ([`BusyPoll`]).
pub(crate) fn route_loop(peers: &Peers, tun: &Tun, queue: usize, stop: &Stop, busy: Duration) {
    let mut busy = BusyPoll::new(busy);
    // what the interface returns, behind room for a segment's prefix (a large TCP segment
    // leaves in this buffer, and the next read gets another)
    let mut read = Vec::new();
    let mut packets = offload::Packets::default();
    let mut dests: Vec<usize> = Vec::new();
    let mut batch_peers: Vec<usize> = Vec::new();
    // the last batch ended at the interface's empty queue: wait before reading again
    let mut drained = true;
    loop {
        // an error ends the spin: the read below reports it
        if drained && !busy.spin(|| tun.is_readable().unwrap_or(true)) {
            if let Err(e) = tun.wait_readable() {
                return stop.fail(format!("waiting for the interface failed: {e}"));
            }
        }
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
        let lone = drained;
        drained = false;
        while packets.len() < BATCH && bytes < BATCH_BYTES && !(lone && packets.len() > 0) {
            match tun.read_into(&mut read, offload::SEGMENT_PREFIX) {
                Ok(header) => {
                    reads += 1;
                    let packet = &read[offload::SEGMENT_PREFIX..];
                    let dest = destination(&table, packet).unwrap_or(usize::MAX);
                    bytes += packet.len();
                    let added = match peers.carry {
                        // large TCP segments whole: their headers once per 64 KB
                        Carry::Datagrams => offload::carry_whole(&header, &mut read, &mut packets),
                        Carry::Messages => offload::split(&header, packet, &mut packets),
                    };
                    dests.extend(std::iter::repeat_n(dest, added));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    drained = true;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return stop.fail(format!("reading the interface failed: {e}")),
            }
        }
        peers.queue_reads[queue].fetch_add(reads, Ordering::Relaxed);
        if reads > 0 {
            busy.handled();
        }
        // the peers this batch goes to, each once (not every host of the cluster in turn)
        batch_peers.clear();
        batch_peers.extend(dests.iter().copied().filter(|&d| d != usize::MAX));
        batch_peers.sort_unstable();
        batch_peers.dedup();
        for &k in &batch_peers {
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
                        .zip(&dests)
                        .filter(|(_, &d)| d == k)
                        .map(|(b, _)| b);
                    // it stops at the first that fails: the last one it took
                    let mut taken = 0u64;
                    match conn.send_datagram_bufs(batch.inspect(|_| taken += 1)) {
                        Ok(()) => taken,
                        Err(_) => taken.saturating_sub(1),
                    }
                }
                (Some(conn), Carry::Messages) => (0..packets.len())
                    .filter(|&j| dests[j] == k)
                    .filter(|&j| conn.try_send_message(packets.get(j)).is_ok())
                    .count() as u64,
            };
            peer.sent.fetch_add(sent, Ordering::Relaxed);
            peer.drop_packets(mine - sent);
        }
    }
}

/// The peer owning an IPv4 packet's destination; None for anything else (IPv6, an address
/// no host owns): dropped, as a router without a route would.
fn destination(table: &peers::Table, packet: &[u8]) -> Option<usize> {
    let ip = Ipv4HeaderSlice::from_slice(packet).ok()?;
    table.by_tunnel_address(ip.destination_addr())
}
