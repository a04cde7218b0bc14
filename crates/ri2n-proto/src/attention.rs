//! Which connections an endpoint must look at again, so that what it does per datagram, per
//! application call and per timer costs the same with one connection as with hundreds of idle
//! ones (a tunnel daemon holds one per host of its cluster).
//!
//! Every time something happens to a connection (a datagram, an application call, a timer,
//! a look for something to send), the endpoint marks it in [`Attention`]; only marked
//! connections are asked for datagrams and events, and only theirs among the deadlines of
//! [`TimerIndex`] are computed again.

use std::collections::BTreeSet;
use std::time::Instant;

use crate::ConnectionHandle;

/// A set of connection handles, in order: a sorted vector. Each message of a
/// request-response exchange inserts its connection and removes it again (a tree's node
/// search and rebalancing cost more than these few comparisons); with hundreds of
/// connections in the set at once an insertion moves a few kilobytes.
#[derive(Debug, Default)]
pub(crate) struct HandleSet(Vec<ConnectionHandle>);

impl HandleSet {
    pub fn insert(&mut self, h: ConnectionHandle) {
        match self.0.last() {
            None => self.0.push(h),
            Some(&last) if last < h => self.0.push(h),
            // the usual case with one busy connection: it is marked already
            Some(&last) if last == h => {}
            _ => {
                if let Err(at) = self.0.binary_search(&h) {
                    self.0.insert(at, h);
                }
            }
        }
    }

    pub fn remove(&mut self, h: ConnectionHandle) {
        if let Ok(at) = self.0.binary_search(&h) {
            self.0.remove(at);
        }
    }

    /// The first handle at or after `from`.
    pub fn first_from(&self, from: ConnectionHandle) -> Option<ConnectionHandle> {
        self.0.get(self.0.partition_point(|&h| h < from)).copied()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn contains(&self, h: ConnectionHandle) -> bool {
        self.0.binary_search(&h).is_ok()
    }

    pub fn iter(&self) -> impl Iterator<Item = ConnectionHandle> + '_ {
        self.0.iter().copied()
    }

    /// Empties the set, handing over its handles in order (the memory stays with the set
    /// when the vector is given back with [`Self::restore`]).
    pub fn take(&mut self) -> Vec<ConnectionHandle> {
        std::mem::take(&mut self.0)
    }

    /// Gives back the vector [`Self::take`] handed over, emptied; handles inserted meanwhile
    /// are kept.
    pub fn restore(&mut self, mut v: Vec<ConnectionHandle>) {
        debug_assert!(v.is_empty());
        if self.0.is_empty() {
            std::mem::swap(&mut self.0, &mut v);
        }
    }
}

/// The connections something happened to, by what the endpoint must do about them.
#[derive(Debug, Default)]
pub(crate) struct Attention {
    /// May have something to send: since something happened to them, they were not found
    /// with nothing to send.
    pub send: HandleSet,
    /// Their next deadline may have moved: the endpoint computes it again into its
    /// [`TimerIndex`] before it next looks at the index.
    pub timers: HandleSet,
    /// May have an application event waiting.
    pub events: HandleSet,
}

impl Attention {
    /// Something happened to connection `h` (it may have changed in every way).
    pub fn touch(&mut self, h: ConnectionHandle) {
        self.send.insert(h);
        self.looked_at(h);
    }

    /// Connection `h` was asked for datagrams: that may move its timers (a pacing wake-up)
    /// or raise an event (a link given up on while probing it), but leaves nothing more to
    /// send than it said.
    pub fn looked_at(&mut self, h: ConnectionHandle) {
        self.timers.insert(h);
        self.events.insert(h);
    }

    /// Connection `h` is gone.
    pub fn forget(&mut self, h: ConnectionHandle) {
        self.send.remove(h);
        self.timers.remove(h);
        self.events.remove(h);
    }
}

/// Every connection's next deadline, ordered, so that the endpoint's next deadline and the
/// connections due at an instant are found without asking each connection; and apart, every
/// connection's next timer that traffic arms. Each connection keeps the deadlines it is
/// indexed under (`Connection::indexed_deadline`, `indexed_traffic_deadline`), which find its
/// entries.
#[derive(Debug, Default)]
pub(crate) struct TimerIndex {
    by_time: BTreeSet<(Instant, ConnectionHandle)>,
    traffic: BTreeSet<(Instant, ConnectionHandle)>,
}

/// Records `deadline` as connection `h`'s in `set` (`None`: it has none); `indexed` is the
/// deadline the connection is indexed under there, updated.
fn reindex(
    set: &mut BTreeSet<(Instant, ConnectionHandle)>,
    h: ConnectionHandle,
    indexed: &mut Option<Instant>,
    deadline: Option<Instant>,
) {
    if *indexed == deadline {
        return;
    }
    if let Some(t) = indexed.take() {
        set.remove(&(t, h));
    }
    if let Some(t) = deadline {
        set.insert((t, h));
    }
    *indexed = deadline;
}

impl TimerIndex {
    /// Records `deadline` as connection `h`'s next one (`None`: it has none); `indexed` is
    /// the deadline the connection is indexed under, updated.
    pub fn set(
        &mut self,
        h: ConnectionHandle,
        indexed: &mut Option<Instant>,
        deadline: Option<Instant>,
    ) {
        reindex(&mut self.by_time, h, indexed, deadline);
    }

    /// Records `deadline` as connection `h`'s next timer that traffic arms, as [`Self::set`]
    /// does.
    pub fn set_traffic(
        &mut self,
        h: ConnectionHandle,
        indexed: &mut Option<Instant>,
        deadline: Option<Instant>,
    ) {
        reindex(&mut self.traffic, h, indexed, deadline);
    }

    /// The earliest deadline.
    pub fn first(&self) -> Option<Instant> {
        self.by_time.first().map(|&(t, _)| t)
    }

    /// The earliest timer that traffic arms.
    pub fn first_traffic(&self) -> Option<Instant> {
        self.traffic.first().map(|&(t, _)| t)
    }

    /// The earliest deadline of a connection `skip` does not pick.
    pub fn first_but(&self, skip: impl Fn(ConnectionHandle) -> bool) -> Option<Instant> {
        self.by_time
            .iter()
            .find(|&&(_, h)| !skip(h))
            .map(|&(t, _)| t)
    }

    /// The connection whose deadline is earliest, if that is at or before `now`; its entry
    /// is removed (the caller clears the connection's indexed deadline, and marks it for a
    /// refresh).
    pub fn pop_due(&mut self, now: Instant) -> Option<ConnectionHandle> {
        let &(t, h) = self.by_time.first()?;
        if t > now {
            return None;
        }
        self.by_time.pop_first();
        Some(h)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{HandleSet, TimerIndex};
    use crate::ConnectionHandle as H;

    #[test]
    fn handle_set_keeps_each_handle_once_in_order() {
        let mut r = HandleSet::default();
        for h in [5, 2, 9, 2, 5, 7, 1, 9] {
            r.insert(H(h));
        }
        assert_eq!(r.0, [1, 2, 5, 7, 9].map(H));
        r.remove(H(5));
        r.remove(H(4)); // absent: nothing happens
        assert_eq!(r.0, [1, 2, 7, 9].map(H));
        assert_eq!(r.first_from(H(0)), Some(H(1)));
        assert_eq!(r.first_from(H(3)), Some(H(7)));
        assert_eq!(r.first_from(H(9)), Some(H(9)));
        assert_eq!(r.first_from(H(10)), None);
        let taken = r.take();
        assert_eq!(taken, [1, 2, 7, 9].map(H));
        assert!(r.is_empty());
        r.insert(H(3));
        r.restore(Vec::with_capacity(8));
        assert_eq!(r.0, [H(3)]);
    }

    #[test]
    fn timer_index_orders_deadlines_and_forgets_moved_ones() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut ix = TimerIndex::default();
        // what each connection keeps: the deadline it is indexed under
        let mut kept = [None; 4];
        ix.set(H(1), &mut kept[1], Some(at(30)));
        ix.set(H(2), &mut kept[2], Some(at(10)));
        ix.set(H(3), &mut kept[3], Some(at(20)));
        assert_eq!(ix.first(), Some(at(10)));
        assert_eq!(kept[2], Some(at(10)));
        ix.set(H(2), &mut kept[2], Some(at(40))); // moved later: the old entry is gone
        assert_eq!(ix.first(), Some(at(20)));
        assert_eq!(kept[2], Some(at(40)));
        ix.set(H(3), &mut kept[3], None);
        assert_eq!((ix.first(), kept[3]), (Some(at(30)), None));
        ix.set(H(1), &mut kept[1], Some(at(30))); // unchanged: one entry still
        assert_eq!(ix.by_time.len(), 2);
        assert_eq!(ix.pop_due(at(29)), None);
        assert_eq!(ix.pop_due(at(35)), Some(H(1)));
        assert_eq!(ix.pop_due(at(35)), None);
        assert_eq!(ix.first(), Some(at(40)));
        assert_eq!(ix.pop_due(at(40)), Some(H(2)));
        assert_eq!(ix.first(), None);
        assert!(ix.by_time.is_empty());
    }
}
