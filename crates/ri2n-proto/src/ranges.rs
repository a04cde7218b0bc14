//! A set of `u64` values stored as disjoint, non-adjacent half-open ranges.
//!
//! It records which packet numbers a link has received (and so what an ACK frame says), which
//! stream bytes arrived or were acknowledged, and which must be sent again. Thousands of
//! packets in flight with scattered losses stay a handful of ranges.

use std::collections::BTreeMap;
use std::ops::Range;

use smallvec::SmallVec;

/// The gaps [`RangeSet::gaps_in`] finds: in line for the usual one or two, so that a stream
/// receiving out of order (every packet of a second link, a hole from a loss) allocates
/// nothing per frame.
pub type Gaps = SmallVec<[Range<u64>; 2]>;

/// Disjoint half-open ranges, merged whenever they touch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start -> end (exclusive); no two entries overlap or touch.
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the set holds nothing.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Number of disjoint ranges.
    pub fn range_count(&self) -> usize {
        self.map.len()
    }

    /// Whether `v` is in the set.
    pub fn contains(&self, v: u64) -> bool {
        self.map
            .range(..=v)
            .next_back()
            .is_some_and(|(_, &end)| v < end)
    }

    /// Whether every value of `r` is in the set (true for an empty range).
    pub fn contains_range(&self, r: Range<u64>) -> bool {
        if r.is_empty() {
            return true;
        }
        self.map
            .range(..=r.start)
            .next_back()
            .is_some_and(|(_, &end)| r.end <= end)
    }

    /// Whether inserting `r` would add a range: it neither overlaps nor touches one.
    pub fn would_add_range(&self, r: Range<u64>) -> bool {
        if r.is_empty() {
            return false;
        }
        let touches_below = self
            .map
            .range(..=r.start)
            .next_back()
            .is_some_and(|(_, &end)| end >= r.start);
        let touches_above = self.map.range(r.start..=r.end).next().is_some();
        !touches_below && !touches_above
    }

    /// Smallest value, if any.
    pub fn min(&self) -> Option<u64> {
        self.map.keys().next().copied()
    }

    /// One past the largest value, if any.
    pub fn max_end(&self) -> Option<u64> {
        self.map.values().next_back().copied()
    }

    /// Adds `r`; returns whether any of its values were new.
    pub fn insert(&mut self, r: Range<u64>) -> bool {
        if r.is_empty() {
            return false;
        }
        // Fast path for the common case of values arriving in order: `r` extends the highest
        // range or lies above it, and touches nothing else.
        if let Some(mut last) = self.map.last_entry() {
            let (start, end) = (*last.key(), *last.get());
            if start <= r.start && r.start <= end && r.end > end {
                *last.get_mut() = r.end;
                return true;
            }
            if end < r.start {
                self.map.insert(r.start, r.end);
                return true;
            }
        } else {
            self.map.insert(r.start, r.end);
            return true;
        }
        if self.contains_range(r.clone()) {
            return false;
        }
        let (mut start, mut end) = (r.start, r.end);
        // merge with a range that starts before and reaches `start`
        if let Some((&s, &e)) = self.map.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.map.remove(&s);
            }
        }
        // swallow ranges starting inside [start, end]
        while let Some((&s, &e)) = self.map.range(start..=end).next() {
            self.map.remove(&s);
            end = end.max(e);
        }
        self.map.insert(start, end);
        true
    }

    /// Removes `r` from the set.
    pub fn remove(&mut self, r: Range<u64>) {
        if r.is_empty() || self.map.is_empty() {
            return;
        }
        let mut to_add = Vec::new();
        let keys: Vec<(u64, u64)> = self
            .map
            .range(..r.end)
            .rev()
            .take_while(|(_, &e)| e > r.start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in keys {
            self.map.remove(&s);
            if s < r.start {
                to_add.push((s, r.start));
            }
            if e > r.end {
                to_add.push((r.end, e));
            }
        }
        for (s, e) in to_add {
            self.map.insert(s, e);
        }
    }

    /// Removes every value below `v`.
    pub fn remove_below(&mut self, v: u64) {
        while let Some(first) = self.map.first_entry() {
            let (start, end) = (*first.key(), *first.get());
            if start >= v {
                break;
            }
            first.remove();
            if end > v {
                self.map.insert(v, end);
                break;
            }
        }
    }

    /// Removes and returns the lowest up-to-`max_len` values, as one range; `None` when the set
    /// is empty or `max_len` is 0 (so a `while let Some(r) = set.pop_front(n)` loop always ends).
    pub fn pop_front(&mut self, max_len: u64) -> Option<Range<u64>> {
        if max_len == 0 {
            return None;
        }
        let (&s, &e) = self.map.iter().next()?;
        self.map.remove(&s);
        let take_end = if e - s > max_len { s + max_len } else { e };
        if take_end < e {
            self.map.insert(take_end, e);
        }
        Some(s..take_end)
    }

    /// Drops the lowest ranges until at most `n` remain.
    pub fn keep_highest(&mut self, n: usize) {
        while self.map.len() > n {
            self.map.pop_first();
        }
    }

    /// Ranges in ascending order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = Range<u64>> + Clone + '_ {
        self.map.iter().map(|(&s, &e)| s..e)
    }

    /// The values of `r` that are *not* in the set, as ranges in ascending order (none when `r`
    /// is empty, including a reversed `start > end`).
    pub fn gaps_in(&self, r: Range<u64>) -> Gaps {
        let mut out = Gaps::new();
        if r.is_empty() {
            return out;
        }
        let mut cur = r.start;
        let first = self
            .map
            .range(..=r.start)
            .next_back()
            .map(|(&s, _)| s)
            .unwrap_or(r.start);
        for (&s, &e) in self.map.range(first..r.end) {
            if e <= cur {
                continue;
            }
            if s > cur {
                out.push(cur..s.min(r.end));
            }
            cur = cur.max(e);
            if cur >= r.end {
                break;
            }
        }
        if cur < r.end {
            out.push(cur..r.end);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn would_add_range_is_true_only_for_ranges_apart_from_all_others() {
        let mut s = RangeSet::new();
        s.insert(10..20);
        s.insert(30..40);
        for (r, adds) in [
            (0..5, true),
            (5..10, false),
            (20..25, false),
            (22..28, true),
            (25..30, false),
            (12..14, false),
            (18..32, false),
            (41..50, true),
            (40..50, false),
            (7..7, false),
        ] {
            assert_eq!(s.would_add_range(r.clone()), adds, "{r:?}");
            let mut t = s.clone();
            t.insert(r.clone());
            assert_eq!(t.range_count() > s.range_count(), adds, "{r:?}");
        }
    }

    #[test]
    fn insert_merges_touching_ranges() {
        let mut s = RangeSet::new();
        assert!(s.insert(10..20));
        assert!(s.insert(30..40));
        assert!(s.insert(15..35));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![10..40]);
        assert!(s.insert(40..41));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![10..41]);
        assert!(!s.insert(12..13));
    }

    #[test]
    fn remove_splits() {
        let mut s = RangeSet::new();
        s.insert(0..100);
        s.remove(10..20);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0..10, 20..100]);
        assert_eq!(s.gaps_in(5..25).to_vec(), vec![10..20]);
        assert_eq!(s.pop_front(4), Some(0..4));
        assert!(!s.contains(3));
        assert!(s.contains(4));
    }
}
