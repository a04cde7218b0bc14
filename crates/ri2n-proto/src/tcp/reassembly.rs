//! The receiving side of the TCP transport: where each arriving run belongs, which of its
//! bytes are new, and how far the stream is complete.
//!
//! A link's runs carry no offset: after a ROUND record (position, direction) the link's
//! cursor moves forward or backward by each run's length, and that places the run. Repairs
//! carry their offset. Bytes that already arrived (a repair of a run that was not lost after
//! all) are reported as old so the caller drops them; nothing beyond the window the receiver
//! advertised is accepted, so the memory a peer can make it hold is bounded.

use std::ops::Range;

use crate::ranges::{Gaps, RangeSet};

/// Why a link's records make no sense; the link is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// A run before any ROUND on the link.
    #[error("a run arrived on a link before its round started")]
    NoRound,
    /// A run or repair reaches beyond the window (or a backward run below zero).
    #[error("stream bytes {0:?} lie outside the receive window")]
    OutsideWindow(Range<u64>),
    /// The stream's end moved, or lies below bytes that arrived.
    #[error("the end of the stream at {0} contradicts the bytes received")]
    BadFin(u64),
    /// Bytes that would open one more hole than [`Reassembly::max_holes`].
    #[error("stream bytes in more than {0} pieces ahead of the missing ones")]
    TooScattered(usize),
}

#[derive(Debug, Default, Clone, Copy)]
struct LinkRx {
    /// The position of the next run: its start going forward, its end going backward.
    cursor: Option<(u64, bool)>,
    /// Run and repair bytes that arrived on the link since it opened.
    bytes: u64,
}

/// The receiving side of one connection's stream.
#[derive(Debug)]
pub struct Reassembly {
    window: u64,
    /// The application read everything below this.
    consumed: u64,
    received: RangeSet,
    /// Every byte below this arrived.
    contiguous: u64,
    /// Bytes that arrived, each once: the contiguous ones and those held beyond them.
    arrived: u64,
    fin: Option<u64>,
    links: Vec<LinkRx>,
}

impl Reassembly {
    /// A stream with a receive window of `window` bytes beyond what the application read.
    pub fn new(window: u64) -> Self {
        Self {
            window,
            consumed: 0,
            received: RangeSet::new(),
            contiguous: 0,
            arrived: 0,
            fin: None,
            links: Vec::new(),
        }
    }

    fn link(&mut self, link: usize) -> &mut LinkRx {
        if self.links.len() <= link {
            self.links.resize(link + 1, LinkRx::default());
        }
        &mut self.links[link]
    }

    /// Link `link` (re)opened: no round yet, its byte count from zero.
    pub fn link_up(&mut self, link: usize) {
        *self.link(link) = LinkRx::default();
    }

    /// A ROUND record arrived on `link`.
    pub fn round(&mut self, link: usize, pos: u64, backward: bool) -> Result<(), PlacementError> {
        if pos > self.window_end() {
            return Err(PlacementError::OutsideWindow(pos..pos));
        }
        self.link(link).cursor = Some((pos, backward));
        Ok(())
    }

    /// Where the run of `len` bytes that arrives next on `link` starts.
    pub fn place_run(&mut self, link: usize, len: u64) -> Result<u64, PlacementError> {
        let end = self.window_end();
        let l = self.link(link);
        let (pos, backward) = l.cursor.ok_or(PlacementError::NoRound)?;
        let start = if backward {
            pos.checked_sub(len)
                .ok_or(PlacementError::OutsideWindow(0..pos))?
        } else {
            pos
        };
        if start + len > end {
            return Err(PlacementError::OutsideWindow(start..start + len));
        }
        l.cursor = Some((if backward { start } else { start + len }, backward));
        Ok(start)
    }

    /// Stream bytes `offset..offset + len` arrived on `link`. Returns the parts that are new
    /// (the caller keeps those bytes and drops the rest).
    pub fn accept(&mut self, link: usize, offset: u64, len: u64) -> Result<Gaps, PlacementError> {
        // the offset is the peer's word (a REPAIR record's): it may point past the last byte
        let end =
            (offset.checked_add(len)).ok_or(PlacementError::OutsideWindow(offset..u64::MAX))?;
        let r = offset..end;
        if r.end > self.window_end() {
            return Err(PlacementError::OutsideWindow(r));
        }
        if let Some(f) = self.fin.filter(|&f| r.end > f) {
            return Err(PlacementError::BadFin(f));
        }
        // each piece held costs memory beyond its bytes: a peer that sends bytes here and there
        // and never the missing ones would otherwise hold far more than the window
        let most = self.max_holes();
        if self.holes() >= most && self.received.would_add_range(r.clone()) {
            return Err(PlacementError::TooScattered(most));
        }
        self.link(link).bytes += len;
        let new = self.received.gaps_in(r.start.max(self.contiguous)..r.end);
        self.arrived += new.iter().map(|g| g.end - g.start).sum::<u64>();
        if !new.is_empty() {
            self.received.insert(r);
            if let Some(first) = self.received.iter().next() {
                if first.start == 0 {
                    self.contiguous = first.end;
                }
            }
        }
        Ok(new)
    }

    /// A FIN record: the stream ends at `end`.
    pub fn fin(&mut self, end: u64) -> Result<(), PlacementError> {
        if self.fin.is_some_and(|f| f != end) || self.received.max_end().unwrap_or(0) > end {
            return Err(PlacementError::BadFin(end));
        }
        self.fin = Some(end);
        Ok(())
    }

    /// The application read `n` more bytes (of the contiguous ones).
    pub fn consume(&mut self, n: u64) {
        debug_assert!(self.consumed + n <= self.contiguous);
        self.consumed += n;
    }

    /// Every byte below this arrived.
    pub fn contiguous(&self) -> u64 {
        self.contiguous
    }

    /// What the application read.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Bytes that arrived and the application has not read: the contiguous ones and those
    /// held out of order beyond them.
    pub fn buffered(&self) -> u64 {
        self.arrived - self.consumed
    }

    /// The sender may send stream bytes below this.
    pub fn window_end(&self) -> u64 {
        self.consumed + self.window
    }

    /// The whole stream arrived, its end included.
    pub fn complete(&self) -> bool {
        self.fin == Some(self.contiguous)
    }

    /// The application read the whole stream.
    pub fn eof(&self) -> bool {
        self.complete() && self.consumed == self.contiguous
    }

    /// Run and repair bytes that arrived on `link` since it opened (what its ACKs report).
    pub fn link_bytes(&self, link: usize) -> u64 {
        self.links.get(link).map_or(0, |l| l.bytes)
    }

    /// The most out-of-order ranges held at once: one per 128 bytes of the window (each
    /// costs about that in bookkeeping), and never fewer than 4096. A sender's runs and
    /// repairs, in rounds over a few links, leave far fewer.
    pub fn max_holes(&self) -> usize {
        usize::try_from(self.window / 128)
            .unwrap_or(usize::MAX)
            .max(4096)
    }

    /// Out-of-order ranges held beyond the contiguous prefix.
    pub fn holes(&self) -> usize {
        self.received
            .range_count()
            .saturating_sub(usize::from(self.contiguous > 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes here and there ahead of missing ones are held up to `max_holes` pieces: one more
    /// is refused (the link ends it), while bytes that extend a held piece, or fill the start,
    /// are still taken.
    #[test]
    fn pieces_ahead_of_missing_bytes_are_bounded() {
        let mut r = Reassembly::new(1 << 20);
        let most = r.max_holes();
        assert_eq!(most, 8192);
        for k in 0..most as u64 {
            r.accept(0, 2 * k + 1, 1).unwrap();
        }
        assert_eq!(r.holes(), most);
        let beyond = 2 * most as u64 + 1;
        assert_eq!(
            r.accept(0, beyond, 1),
            Err(PlacementError::TooScattered(most))
        );
        // touching a held piece opens no hole
        assert!(r.accept(0, 2, 1).is_ok());
        assert_eq!(r.holes(), most - 1);
        r.accept(0, 0, 1).unwrap();
        assert_eq!(r.contiguous(), 4);
        assert_eq!(Reassembly::new(64 << 10).max_holes(), 4096);
    }

    #[test]
    fn runs_are_placed_by_their_links_order_alone() {
        let mut r = Reassembly::new(1 << 20);
        r.round(0, 0, false).unwrap();
        r.round(1, 1000, true).unwrap();
        assert_eq!(r.place_run(0, 100), Ok(0));
        assert_eq!(r.place_run(1, 300), Ok(700));
        assert_eq!(r.place_run(0, 100), Ok(100));
        assert_eq!(r.place_run(1, 500), Ok(200));
        for (link, at, len) in [(0, 0, 100), (1, 700, 300), (0, 100, 100)] {
            r.accept(link, at, len).unwrap();
        }
        assert_eq!(r.contiguous(), 200);
        assert_eq!(r.holes(), 1);
        r.accept(1, 200, 500).unwrap();
        assert_eq!(r.contiguous(), 1000);
        assert_eq!((r.link_bytes(0), r.link_bytes(1)), (200, 800));
    }

    /// And what is buffered counts each byte once, those held out of order included.
    #[test]
    fn bytes_that_arrived_twice_are_reported_old() {
        let mut r = Reassembly::new(1 << 20);
        r.accept(0, 100, 100).unwrap();
        assert_eq!((r.contiguous(), r.buffered()), (0, 100));
        let new = r.accept(1, 50, 200).unwrap();
        assert_eq!(new.as_slice(), &[50..100, 200..250]);
        assert!(r.accept(1, 60, 10).unwrap().is_empty());
        assert_eq!(r.buffered(), 200);
        r.accept(0, 0, 50).unwrap();
        assert_eq!(r.contiguous(), 250);
        assert!(r.accept(0, 0, 250).unwrap().is_empty());
        r.consume(100);
        assert_eq!(r.buffered(), 150);
    }

    #[test]
    fn nothing_outside_the_window_or_before_a_round_is_taken() {
        let mut r = Reassembly::new(1000);
        assert_eq!(r.place_run(0, 10), Err(PlacementError::NoRound));
        assert!(r.accept(0, 990, 20).is_err());
        r.round(0, 10, true).unwrap();
        assert!(r.place_run(0, 11).is_err(), "below zero");
        r.round(0, 995, false).unwrap();
        assert!(r.place_run(0, 10).is_err());
        r.accept(0, 0, 1000).unwrap();
        r.consume(600);
        assert_eq!(r.window_end(), 1600);
        assert!(r.accept(0, 1000, 600).is_ok());
        // an offset whose bytes would end past the last one a stream can have
        let past = r.accept(0, u64::MAX - 10, 100);
        assert_eq!(
            past,
            Err(PlacementError::OutsideWindow(u64::MAX - 10..u64::MAX))
        );
    }

    #[test]
    fn the_end_of_the_stream_must_agree_with_the_bytes() {
        let mut r = Reassembly::new(1000);
        r.accept(0, 0, 100).unwrap();
        assert!(r.fin(50).is_err());
        r.fin(200).unwrap();
        assert!(r.fin(300).is_err());
        assert!(!r.complete());
        assert!(r.accept(0, 150, 60).is_err());
        r.accept(0, 100, 100).unwrap();
        assert!(r.complete() && !r.eof());
        r.consume(200);
        assert!(r.eof());
    }
}
