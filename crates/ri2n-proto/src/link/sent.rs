//! The packets a link sent: what each carried that matters once it is acknowledged or lost
//! ([`SentPacket`], [`SentFrame`]), and those that still wait for an acknowledgement or a
//! loss verdict ([`SentPackets`]).
//!
//! Packet numbers on a link grow by one per packet, and what is outstanding is a window
//! between the oldest unresolved packet and the newest: a ring of slots indexed by
//! `pn - first` holds it, so recording a packet, acknowledging one and finding the oldest
//! cost O(1), without an allocation or a tree node per packet (a fast link sends hundreds of
//! thousands per second). Slots of packets that need no tracking (acknowledgement-only
//! packets) or that were resolved out of order stay empty until the front passes them.

use std::collections::VecDeque;
use std::ops::{Range, RangeInclusive};
use std::time::Instant;

use smallvec::SmallVec;

use crate::datagrams::Piece;
use crate::streams::Chunk;
use crate::LinkId;

/// What a sent packet carried that matters if it is acknowledged or lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SentFrame {
    Stream {
        stream: u8,
        chunk: Chunk,
    },
    MaxStreamData {
        stream: u8,
    },
    LinkStatus {
        link: LinkId,
        status: u8,
    },
    /// A datagram's bytes stay with the packet until it is acknowledged: they are sent again
    /// if the link fails with the packet in flight.
    Datagram(Piece),
}

#[derive(Debug, Clone)]
pub(crate) struct SentPacket {
    pub time: Instant,
    pub size: u16,
    /// Counted in `bytes_in_flight` (data packets, not probes of a link that is not up).
    pub in_flight: bool,
    pub ack_eliciting: bool,
    /// A probe of a link that is not up.
    pub probe: bool,
    /// A path MTU probe (its size is the size probed).
    pub mtu_probe: bool,
    pub frames: SmallVec<[SentFrame; 2]>,
}

/// Frames of a sent packet.
pub(crate) type Frames = SmallVec<[SentFrame; 2]>;

#[derive(Debug, Default)]
pub(crate) struct SentPackets {
    /// Packet number of `slots[0]`.
    first: u64,
    /// `slots[0]`, when there is one, is always occupied.
    slots: VecDeque<Option<SentPacket>>,
    count: usize,
}

impl SentPackets {
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Records packet `pn`, which is newer than every packet recorded so far.
    pub fn insert(&mut self, pn: u64, pkt: SentPacket) {
        if self.slots.is_empty() {
            self.first = pn;
        }
        debug_assert!(pn >= self.first + self.slots.len() as u64);
        let index = (pn - self.first) as usize;
        self.slots.resize_with(index, || None);
        self.slots.push_back(Some(pkt));
        self.count += 1;
    }

    /// Takes packet `pn` out, if it is outstanding.
    pub fn remove(&mut self, pn: u64) -> Option<SentPacket> {
        let index = usize::try_from(pn.checked_sub(self.first)?).ok()?;
        let pkt = self.slots.get_mut(index)?.take()?;
        self.count -= 1;
        if index == 0 {
            self.trim_front();
        }
        Some(pkt)
    }

    fn trim_front(&mut self) {
        while self.slots.front().is_some_and(Option::is_none) {
            self.slots.pop_front();
            self.first += 1;
        }
    }

    /// The oldest outstanding packet.
    pub fn oldest(&self) -> Option<&SentPacket> {
        self.slots.front().and_then(Option::as_ref)
    }

    /// The packet numbers of `range` that may be outstanding (clamped to the ring).
    pub fn clamp(&self, range: RangeInclusive<u64>) -> Range<u64> {
        let end = self.first + self.slots.len() as u64;
        let lo = (*range.start()).max(self.first);
        let hi = range.end().saturating_add(1).min(end);
        lo..hi.max(lo)
    }

    /// Outstanding packets in packet-number order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &SentPacket)> {
        let first = self.first;
        self.slots
            .iter()
            .enumerate()
            .filter_map(move |(i, p)| p.as_ref().map(|p| (first + i as u64, p)))
    }

    /// Takes out every packet for which `pred` holds, in packet-number order, into `out`.
    pub fn remove_where(
        &mut self,
        mut pred: impl FnMut(u64, &SentPacket) -> bool,
        mut out: impl FnMut(u64, SentPacket),
    ) {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot
                .as_ref()
                .is_some_and(|p| pred(self.first + i as u64, p))
            {
                out(self.first + i as u64, slot.take().expect("checked"));
                self.count -= 1;
            }
        }
        self.trim_front();
    }

    /// Takes out everything, with the packet numbers.
    pub fn drain(&mut self) -> impl Iterator<Item = (u64, SentPacket)> + '_ {
        self.count = 0;
        let first = self.first;
        self.slots
            .drain(..)
            .enumerate()
            .filter_map(move |(i, p)| p.map(|p| (first + i as u64, p)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::data_packet;
    use std::time::Instant;

    fn pkt(size: u16) -> SentPacket {
        data_packet(Instant::now(), size)
    }

    #[test]
    fn ring_tracks_outstanding_packets_with_gaps() {
        let mut s = SentPackets::default();
        s.insert(5, pkt(5));
        s.insert(6, pkt(6));
        s.insert(9, pkt(9)); // 7 and 8 were acknowledgement-only
        assert_eq!(s.iter().map(|(pn, _)| pn).collect::<Vec<_>>(), [5, 6, 9]);
        assert_eq!(s.clamp(0..=100), 5..10);
        assert!(s.clamp(10..=20).is_empty());
        assert!(s.remove(7).is_none());
        assert_eq!(s.remove(6).map(|p| p.size), Some(6));
        assert_eq!(s.remove(5).map(|p| p.size), Some(5));
        // the front moved past the empty slots
        assert_eq!(s.oldest().map(|p| p.size), Some(9));
        assert_eq!(s.clamp(0..=u64::MAX), 9..10);
        assert!(s.remove(5).is_none(), "a packet is resolved once");
        s.insert(12, pkt(12));
        let mut taken = Vec::new();
        s.remove_where(|pn, _| pn == 9, |_, p| taken.push(p.size));
        assert_eq!(taken, [9]);
        assert_eq!(s.oldest().map(|p| p.size), Some(12));
        assert_eq!(s.drain().count(), 1);
        assert!(s.is_empty());
        s.insert(100, pkt(100));
        assert_eq!(s.clamp(0..=200), 100..101);
    }
}
