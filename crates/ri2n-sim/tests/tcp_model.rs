//! The TCP transport's core under faults, in the model of `ri2n_sim::tcp`: random links,
//! workloads of stream writes and messages, link deaths, heals, partitions of every link and
//! slowdowns; every byte and message must arrive once and in order, and each run complete.
//! `RI2N_TCP_SCENARIOS` sets how many seeds run (default 300).

use std::time::Duration;

use ri2n_sim::{run_tcp, TcpAction, TcpScenario};

#[test]
fn random_tcp_scenarios_deliver_everything_exactly() {
    let n: u64 = std::env::var("RI2N_TCP_SCENARIOS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let (mut deaths, mut partitions, mut resent) = (0, 0, 0);
    for seed in 0..n {
        let s = TcpScenario::random(seed);
        let r = run_tcp(&s).unwrap_or_else(|e| panic!("{e}"));
        if seed < 8 {
            println!(
                "seed {seed}: {} links, {} actions: {r:?}",
                s.links.len(),
                s.actions.len()
            );
        }
        let downs = (s.actions.iter())
            .filter(|a| matches!(a.1, TcpAction::Down(_)))
            .count();
        deaths += downs;
        partitions += usize::from(downs >= s.links.len());
        resent += r.resent;
    }
    println!(
        "{n} scenarios: {deaths} link deaths, {partitions} partitions of every link, {resent} \
         bytes sent again"
    );
    // the premise: the seeds did kill links while data moved, and data was sent again
    assert!(
        deaths > n as usize / 2,
        "{deaths} link deaths in {n} scenarios"
    );
    assert!(
        partitions > 0,
        "no partition of every link in {n} scenarios"
    );
    assert!(resent > 0, "no byte was ever sent again");
}

/// Seed 437 once stalled for good: link 0 died at 5 ms and the network healed at 20 ms,
/// before the ends noticed at 45 ms; the model let the same connection carry on after the
/// heal, so the bytes lost in the outage counted as acknowledged and were never sent again.
#[test]
fn a_tcp_scenario_that_once_failed() {
    let s = TcpScenario::random(437);
    if let Err(e) = run_tcp(&s) {
        panic!("seed 437:\n{e}");
    }
}

/// A link dies in the middle of a 4 MiB message: what it had taken is sent again on the
/// other, which carries the rest alone, and the message arrives whole.
#[test]
fn a_message_survives_the_death_of_a_link_that_carried_half_of_it() {
    let mut s = TcpScenario::random(1);
    s.links = vec![(125e6, Duration::from_micros(200)); 2];
    s.workload = vec![(false, 100), (true, 4 << 20), (false, 1000)];
    s.write_every = Duration::ZERO;
    s.window = 8 << 20;
    s.read_rate = 1e9;
    s.detect = Duration::from_millis(20);
    s.reconnect = Duration::from_millis(5);
    s.actions = vec![
        (Duration::from_millis(10), TcpAction::Down(1)),
        (Duration::from_millis(500), TcpAction::Up(1)),
    ];
    let r = run_tcp(&s).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((r.messages, r.stream_bytes), (1, 1100));
    // link 1's share from 10 ms on was lost with it and goes again once it is declared dead
    assert!(r.resent > 1 << 20, "{r:?}");
    // both links for 10 ms, the survivor alone after (4 MiB alone would take 33.5 ms), the
    // lost share again after the 20 ms detection: 45.2 ms when written
    let ms = r.completed_at.as_secs_f64() * 1e3;
    assert!((42.0..=48.0).contains(&ms), "{r:?}");
}

/// A link the ends declared dead long before it healed is up again `reconnect` after the
/// heal, whatever the time its death took to notice: the model waited the longer of the two
/// after the heal, so a slower detection delayed the end of this transfer by the difference.
#[test]
fn a_healed_link_reconnects_its_reconnect_time_after_the_heal() {
    let ms = Duration::from_millis;
    let completion = |detect: Duration| {
        let mut s = TcpScenario::random(1);
        // one link: the transfer stands still while it is dead and goes on once it is back
        s.links = vec![(125e6, Duration::from_micros(200))];
        s.workload = vec![(false, 8 << 20)];
        s.write_every = Duration::ZERO;
        s.window = 8 << 20;
        s.read_rate = 1e10;
        s.detect = detect;
        s.reconnect = ms(1);
        s.actions = vec![(ms(10), TcpAction::Down(0)), (ms(300), TcpAction::Up(0))];
        let r = run_tcp(&s).unwrap_or_else(|e| panic!("{e}"));
        // the premise: the transfer was not over when the link died
        assert!(r.completed_at > ms(300), "{r:?}");
        r.completed_at
    };
    let (fast, slow) = (completion(ms(5)), completion(ms(40)));
    assert!(
        slow.abs_diff(fast) < ms(5),
        "detected in 5 ms: done at {fast:?}; in 40 ms: at {slow:?}"
    );
}

/// A scenario the model cannot play (no link, a rate below 1 byte/s or not a number, an
/// action on a link that does not exist) is refused with a reason, not a panic.
#[test]
fn an_impossible_tcp_scenario_is_refused_with_its_reason() {
    const AT: Duration = Duration::from_millis(5);
    type Spoil = fn(&mut TcpScenario);
    let cases: [(&str, Spoil); 10] = [
        ("no link", |s| s.links.clear()),
        ("link 1: rate 0", |s| s.links[1].0 = 0.0),
        ("link 0: rate -5", |s| s.links[0].0 = -5.0),
        ("link 0: rate NaN", |s| s.links[0].0 = f64::NAN),
        ("link 0: rate inf", |s| s.links[0].0 = f64::INFINITY),
        ("link 0: rate 0.000001", |s| s.links[0].0 = 1e-6),
        ("read_rate 0", |s| s.read_rate = 0.0),
        ("window 0", |s| s.window = 0),
        ("targets link 2 of 2", |s| {
            s.actions = vec![(AT, TcpAction::Down(2))]
        }),
        ("rate NaN", |s| {
            s.actions = vec![(AT, TcpAction::Rate(0, f64::NAN))]
        }),
    ];
    for (why, spoil) in cases {
        let mut s = TcpScenario::random(3);
        s.links = vec![(125e6, Duration::from_micros(200)); 2];
        s.workload = vec![(false, 1000)];
        s.actions.clear();
        // the premise: the scenario plays before it is spoilt
        run_tcp(&s).unwrap_or_else(|e| panic!("{e}"));
        spoil(&mut s);
        let played = std::panic::catch_unwind(|| run_tcp(&s));
        match played {
            Ok(Err(e)) => assert!(e.contains(why), "{why}: refused as {e}"),
            Ok(Ok(r)) => panic!("{why}: played, {r:?}"),
            Err(_) => panic!("{why}: run_tcp panicked"),
        }
    }
}
