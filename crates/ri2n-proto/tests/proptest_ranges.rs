//! `ranges::RangeSet` against a plain model: a `BTreeSet<u64>` over a small domain.
//!
//! Random sequences of insert / remove / remove_below / pop_front / keep_highest are applied to
//! both; after every operation the set must agree with the model on membership, on its
//! canonical form (sorted, disjoint, non-adjacent ranges), and on every query.

use std::collections::BTreeSet;
use std::ops::Range;

use proptest::prelude::*;
use ri2n_proto::ranges::RangeSet;

/// Values live in `base + 0 .. base + DOMAIN`; queries may reach a little past both ends.
const DOMAIN: u64 = 512;

#[derive(Debug, Clone)]
enum Op {
    Insert(u64, u64),
    Remove(u64, u64),
    RemoveBelow(u64),
    PopFront(u64),
    KeepHighest(usize),
}

/// A range inside the domain: usually well-formed, sometimes empty or reversed (`start > end`,
/// which `Range` counts as empty).
fn bounds() -> impl Strategy<Value = (u64, u64)> {
    prop_oneof![
        6 => (0..DOMAIN, 1..48u64).prop_map(|(s, l)| (s, (s + l).min(DOMAIN))),
        2 => (0..=DOMAIN, 0..=DOMAIN),
        1 => (0..=DOMAIN).prop_map(|s| (s, s)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => bounds().prop_map(|(a, b)| Op::Insert(a, b)),
        3 => bounds().prop_map(|(a, b)| Op::Remove(a, b)),
        1 => (0..=DOMAIN + 1).prop_map(Op::RemoveBelow),
        2 => prop_oneof![Just(0u64), 1..64u64, Just(u64::MAX)].prop_map(Op::PopFront),
        1 => (0..10usize).prop_map(Op::KeepHighest),
    ]
}

/// Maximal runs of consecutive values of the model, as half-open ranges, ascending.
fn runs(model: &BTreeSet<u64>) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for &v in model {
        match out.last_mut() {
            Some(r) if r.end == v => r.end = v + 1,
            _ => out.push(v..v + 1),
        }
    }
    out
}

/// Values of `r` (treated as empty when reversed) missing from the model, as maximal runs.
fn model_gaps(model: &BTreeSet<u64>, r: Range<u64>) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for v in r.clone() {
        if model.contains(&v) {
            continue;
        }
        match out.last_mut() {
            Some(g) if g.end == v => g.end = v + 1,
            _ => out.push(v..v + 1),
        }
    }
    out
}

fn shift(base: u64, (a, b): (u64, u64)) -> Range<u64> {
    base + a..base + b
}

/// Every check of the set against the model.
fn check(set: &RangeSet, model: &BTreeSet<u64>, base: u64, probes: &[(u64, u64)]) {
    // membership of every value, including just outside the domain
    let lo = base.saturating_sub(2);
    let hi = base + DOMAIN + 2.min(u64::MAX - base - DOMAIN);
    for v in lo..hi {
        assert_eq!(set.contains(v), model.contains(&v), "contains({v})");
    }
    // canonical form: ranges ascending, non-empty, disjoint and non-adjacent
    let got: Vec<Range<u64>> = set.iter().collect();
    for r in &got {
        assert!(r.start < r.end, "empty range {r:?} in {got:?}");
    }
    for w in got.windows(2) {
        assert!(
            w[0].end < w[1].start,
            "ranges not sorted, disjoint and merged: {got:?}"
        );
    }
    assert_eq!(got, runs(model), "iter() differs from the model");
    let mut rev: Vec<Range<u64>> = set.iter().rev().collect();
    rev.reverse();
    assert_eq!(rev, got, "iter().rev() is not iter() reversed");
    assert_eq!(set.range_count(), got.len());
    assert_eq!(set.is_empty(), model.is_empty());
    assert_eq!(set.min(), model.first().copied());
    assert_eq!(set.max_end(), model.last().map(|&v| v + 1));
    // the representation is canonical: rebuilding from the ranges gives an equal set
    let mut rebuilt = RangeSet::new();
    for r in &got {
        rebuilt.insert(r.clone());
    }
    assert_eq!(&rebuilt, set);
    // queries on random ranges
    for &p in probes {
        let r = shift(base, p);
        let all_in = r.clone().all(|v| model.contains(&v));
        assert_eq!(
            set.contains_range(r.clone()),
            all_in,
            "contains_range({r:?})"
        );
        assert_eq!(
            set.gaps_in(r.clone()).to_vec(),
            model_gaps(model, r.clone()),
            "gaps_in({r:?})"
        );
    }
}

fn apply(set: &mut RangeSet, model: &mut BTreeSet<u64>, base: u64, op: &Op) {
    match *op {
        Op::Insert(a, b) => {
            let r = shift(base, (a, b));
            let new = r.clone().any(|v| !model.contains(&v));
            model.extend(r.clone());
            assert_eq!(set.insert(r.clone()), new, "insert({r:?}) return value");
        }
        Op::Remove(a, b) => {
            let r = shift(base, (a, b));
            for v in r.clone() {
                model.remove(&v);
            }
            set.remove(r);
        }
        Op::RemoveBelow(v) => {
            // one past the domain: at the top of the number space it saturates
            let v = base.saturating_add(v);
            model.retain(|&x| x >= v);
            set.remove_below(v);
        }
        Op::PopFront(max_len) => {
            // the lowest run, cut to `max_len` values; nothing when `max_len` is 0
            let expected = runs(model)
                .first()
                .filter(|_| max_len > 0)
                .map(|r| r.start..r.end.min(r.start.saturating_add(max_len)));
            if let Some(r) = &expected {
                for v in r.clone() {
                    model.remove(&v);
                }
            }
            assert_eq!(set.pop_front(max_len), expected, "pop_front({max_len})");
        }
        Op::KeepHighest(n) => {
            let rs = runs(model);
            if rs.len() > n {
                for r in &rs[..rs.len() - n] {
                    for v in r.clone() {
                        model.remove(&v);
                    }
                }
            }
            set.keep_highest(n);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn range_set_matches_model(
        base in prop_oneof![Just(0u64), Just(1u64 << 40), Just(u64::MAX - DOMAIN)],
        ops in prop::collection::vec(op(), 1..80),
        probes in prop::collection::vec(bounds(), 8),
    ) {
        let mut set = RangeSet::new();
        let mut model = BTreeSet::new();
        check(&set, &model, base, &probes);
        for op in &ops {
            apply(&mut set, &mut model, base, op);
            check(&set, &model, base, &probes);
        }
    }
}

/// Queries on reversed ranges (`start > end`) treat them as empty instead of panicking.
#[test]
fn reversed_ranges_are_empty() {
    let mut s = RangeSet::new();
    s.insert(0..10);
    s.insert(20..30);
    #[allow(clippy::reversed_empty_ranges)]
    let r = 25..5;
    assert!(s.contains_range(r.clone()));
    assert_eq!(s.gaps_in(r.clone()).to_vec(), Vec::<Range<u64>>::new());
    assert!(!s.insert(r.clone()));
    s.remove(r);
    assert_eq!(s.iter().collect::<Vec<_>>(), vec![0..10, 20..30]);
}

/// The extremes of `u64` work (no overflow in merging or splitting).
#[test]
fn extreme_values() {
    let mut s = RangeSet::new();
    assert!(s.insert(u64::MAX - 10..u64::MAX));
    assert!(s.insert(0..1));
    assert!(s.contains(u64::MAX - 1));
    assert!(!s.contains(u64::MAX));
    assert_eq!(s.max_end(), Some(u64::MAX));
    s.remove(u64::MAX - 5..u64::MAX - 4);
    assert_eq!(
        s.iter().collect::<Vec<_>>(),
        vec![0..1, u64::MAX - 10..u64::MAX - 5, u64::MAX - 4..u64::MAX]
    );
    assert_eq!(
        s.gaps_in(u64::MAX - 6..u64::MAX).to_vec(),
        vec![u64::MAX - 5..u64::MAX - 4]
    );
    assert_eq!(s.pop_front(u64::MAX), Some(0..1));
    s.remove_below(u64::MAX);
    assert!(s.is_empty());
}
