//! Smoke tests of the simulator driving the real engine. The scenario and outcome suite lives
//! elsewhere; these only check that a plain transfer completes and that runs replay exactly.

use std::time::Duration;

use ri2n_sim::{run, Dir, DirectionConfig, LinkConfig, Scenario};

#[test]
fn default_scenario_completes() {
    let r = run(&Scenario::default()).unwrap();
    assert!(r.completed_at.is_some());
    let t = r.transfer(Dir::AToB);
    assert_eq!(t.delivered, 8 << 20);
    assert_eq!(t.sent_hash, t.received_hash);
    assert_eq!(r.transfer(Dir::BToA).delivered, 0);
    assert_eq!(r.timeline_total(Dir::AToB), 8 << 20);
}

#[test]
fn same_seed_same_run() {
    let link = DirectionConfig::default()
        .with_rate(100_000_000)
        .with_delay(Duration::from_millis(2))
        .with_jitter(Duration::from_micros(300))
        .with_loss(0.01)
        .with_duplicate(0.01)
        .with_corrupt(0.01)
        .with_reorder(0.01);
    let mut sc = Scenario::default()
        .with_seed(5)
        .with_links(2, LinkConfig::symmetric(link))
        .with_total_bytes(1 << 20);
    sc.app.bidirectional = true;
    let a = run(&sc).unwrap();
    let b = run(&sc).unwrap();
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    let c = run(&sc.clone().with_seed(6)).unwrap();
    assert_ne!(format!("{a:?}"), format!("{c:?}"));
}

/// Replays `Scenario::random($SEED)` and prints the outcome:
/// `SEED=17 cargo test -p ri2n-sim --test smoke replay_seed -- --ignored --nocapture`.
#[test]
#[ignore]
fn replay_seed() {
    let seed: u64 = std::env::var("SEED").expect("SEED").parse().expect("a u64");
    match run(&Scenario::random(seed)) {
        Ok(r) => {
            let mut s = String::new();
            r.write_summary(&mut s).unwrap();
            eprintln!("seed {seed}: ok\n{s}");
        }
        Err(e) => panic!("{e}"),
    }
}
