//! The engine's promised outcomes, each checked in simulated time on a scenario built for it.
//! Every run also checks (inside the simulator) that the received stream equals the sent one,
//! byte for byte, and that buffers stay within the configured windows.
//!
//! Each test prints the figure it measured (run with `--nocapture` to see them). The runs are
//! deterministic (seed 0 unless a test says otherwise), so every bound sits close to the figure
//! measured, noted beside it with the commit that measured it: a regression by 1.5× fails (a
//! time 1.5× as long, a shortfall from capacity 1.5× as large). A test of a fault first proves
//! its premise: each fault and heal it names happened while the transfer was under way, and
//! what the fault should cause (a link declared down, a gap) was seen.

use std::time::Duration;

use ri2n_proto::{ConnectionError, LinkState};
use ri2n_sim::{
    run, Action, AppConfig, AppMode, Dir, DirectionConfig, HostId, LinkConfig, LinkStatus, Report,
    Scenario, HEADER_BYTES, MAX_DATAGRAM,
};

const GBIT: u64 = 1_000_000_000;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What a link of `rate_bps` can carry as UDP payload with full-size datagrams: the limit the
/// issue measures goodput against (1 Gbit/s: 981 Mbit/s).
fn payload_capacity(rate_bps: u64) -> f64 {
    rate_bps as f64 * MAX_DATAGRAM as f64 / (MAX_DATAGRAM + HEADER_BYTES) as f64
}

fn link(rate_bps: u64, delay: Duration) -> LinkConfig {
    LinkConfig::symmetric(
        DirectionConfig::default()
            .with_rate(rate_bps)
            .with_delay(delay),
    )
}

/// `n` links of 1 Gbit/s and 0.1 ms one-way delay.
fn gigabit_links(n: usize) -> Scenario {
    Scenario::default().with_links(n, link(GBIT, Duration::from_micros(100)))
}

fn run_ok(sc: &Scenario) -> Report {
    match run(sc) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    }
}

/// Fails unless the run applied `action` at `at` while the A → B transfer of `total` bytes was
/// under way: some of it had arrived, and not all. A fault scheduled after the last byte
/// arrived never happens (the run ends first), and one before the first tests the handshake,
/// not the transfer.
fn assert_while_moving(r: &Report, total: u64, at: Duration, action: Action) {
    assert!(
        r.applied(at, &action),
        "{action:?} at {at:?} never happened (the run ended at {:?})",
        r.end_time
    );
    let arrived = r.delivered_before(Dir::AToB, at);
    assert!(
        arrived > 0 && arrived < total,
        "{action:?} at {at:?}: {arrived} of the {total} bytes had arrived"
    );
}

/// Fails unless the A → B transfer of `total` bytes was still under way at `t`: a goodput
/// measured up to `t` is the engine's, not the end of the data's.
fn assert_under_way(r: &Report, total: u64, t: Duration) {
    let arrived = r.delivered_before(Dir::AToB, t);
    assert!(
        arrived < total,
        "the transfer was over by {t:?}: the window measures its end"
    );
}

/// The longest time within 300 ms after `from` in which the A → B application received
/// nothing: what a fault costs it. (Goodput over a window is no measure of that: the bytes
/// the healthy link brought meanwhile wait behind the hole the fault left and are read all at
/// once when it is repaired, so a window that holds that release reads as full speed.)
fn stall_after(r: &Report, from: Duration) -> Duration {
    r.max_delivery_gap(Dir::AToB, from, from + ms(300))
}

/// When `host` first declared `link` degraded or down at or after `after`.
fn demoted_at(r: &Report, host: HostId, link: usize, after: Duration) -> Option<Duration> {
    [LinkState::Degraded, LinkState::Down]
        .iter()
        .filter_map(|&s| r.first_state_change(host, link, s, after))
        .min()
}

#[test]
fn two_gigabit_links_reach_98_percent_of_payload_capacity() {
    let total = 300 << 20;
    let sc = gigabit_links(2).with_total_bytes(total);
    let r = run_ok(&sc);
    assert_under_way(&r, total, ms(1100));
    let capacity = 2.0 * payload_capacity(GBIT);
    let goodput = r.goodput_bps(ms(300), ms(1100));
    println!(
        "steady goodput {:.1} Mbit/s = {:.2} % of {:.1} Mbit/s payload capacity",
        goodput / 1e6,
        100.0 * goodput / capacity,
        capacity / 1e6
    );
    // measured 98.50 % (b3f1584): the shortfall may grow from 1.5 % to 2 %, not to 2.25 %
    assert!(goodput >= 0.98 * capacity, "goodput {goodput:.0} bit/s");
}

#[test]
fn blackholed_link_stalls_the_application_at_most_22ms() {
    let total = 250 << 20;
    let fault = ms(500);
    let sc = gigabit_links(2)
        .with_total_bytes(total)
        .at(fault, Action::blackhole(1));
    let r = run_ok(&sc);
    assert_while_moving(&r, total, fault, Action::blackhole(1));
    let demoted = demoted_at(&r, HostId::A, 1, fault).expect("A demoted the blackholed link");
    let survivor = payload_capacity(GBIT);
    let stall = stall_after(&r, fault);
    let steady = (fault + ms(100), fault + ms(400));
    assert_under_way(&r, total, steady.1);
    let sustained = r.goodput_bps(steady.0, steady.1);
    println!(
        "failover: link 1 demoted {:?} after the blackhole; the application received nothing \
         for {stall:?}; then {:.2} % of the surviving link",
        demoted - fault,
        100.0 * sustained / survivor
    );
    // measured 15 ms (1281a19; 9 ms by a window of goodput, which counted the release of what
    // waited behind the hole)
    assert!(stall <= ms(22), "the application stalled {stall:?}");
    // measured 98.50 % (b3f1584): the shortfall may grow from 1.5 % to 2 %
    assert!(
        sustained >= 0.98 * survivor,
        "sustained {sustained:.0} bit/s"
    );
}

/// A link down for `outage` heals: how long until it carries data again. The links are
/// 10 Mbit/s so that ten simulated minutes of transfer stay cheap.
fn healed_link_carries_data_again(outage: Duration) -> Duration {
    let start = ms(300);
    let heal = start + outage;
    let rate = 10_000_000;
    // enough for the transfer to go on 1.5 s past the heal
    let total = (rate as f64 / 8.0 * (heal + ms(1500)).as_secs_f64()) as u64;
    let sc = Scenario::default()
        .with_links(2, link(rate, ms(1)))
        .with_total_bytes(total)
        .with_time_limit(heal + Duration::from_secs(30))
        .at(start, Action::down(1))
        .at(heal, Action::up(1));
    let r = run_ok(&sc);
    assert_while_moving(&r, total, start, Action::down(1));
    assert_while_moving(&r, total, heal, Action::up(1));
    let went_down = r.first_state_change(HostId::A, 1, LinkState::Down, start);
    assert!(
        went_down.is_some_and(|t| t < heal),
        "the link was seen down during the outage"
    );
    assert_eq!(
        r.links[1].stream_bytes_between(Dir::AToB, start + ms(100), heal),
        0,
        "no data crossed the dead link"
    );
    let carried = r.links[1]
        .first_stream_delivery(Dir::AToB, heal)
        .expect("the healed link carried data");
    println!(
        "outage {outage:?}: link seen down {:?} after the cut; healed link carries data {:?} \
         after the heal (up at {:?})",
        went_down.map(|t| t - start),
        carried - heal,
        r.first_state_change(HostId::A, 1, LinkState::Up, heal)
            .map(|t| t - heal)
    );
    carried - heal
}

#[test]
fn healed_link_carries_data_within_58ms_after_1s_outage() {
    let t = healed_link_carries_data_again(Duration::from_secs(1));
    // measured 39 ms (b3f1584)
    assert!(t <= ms(58), "took {t:?}");
}

#[test]
fn healed_link_carries_data_within_58ms_after_10min_outage() {
    let t = healed_link_carries_data_again(Duration::from_secs(600));
    // measured 39 ms (b3f1584)
    assert!(t <= ms(58), "took {t:?}");
}

#[test]
fn all_links_dead_for_60s_then_one_heals_and_the_transfer_completes() {
    let total = 64 << 20;
    let start = ms(200);
    let heal = start + Duration::from_secs(60);
    let sc = gigabit_links(2)
        .with_total_bytes(total)
        .with_time_limit(Duration::from_secs(120))
        .at(start, Action::down(0))
        .at(start, Action::blackhole(1))
        .at(heal, Action::up(0));
    let r = run_ok(&sc);
    assert_while_moving(&r, total, start, Action::down(0));
    assert_while_moving(&r, total, start, Action::blackhole(1));
    assert_while_moving(&r, total, heal, Action::up(0));
    for l in 0..2 {
        let down = r.first_state_change(HostId::A, l, LinkState::Down, start);
        assert!(
            down.is_some_and(|t| t < heal),
            "A declared link {l} down during the outage"
        );
    }
    let t = r.transfer(Dir::AToB);
    assert_eq!(t.delivered, total);
    assert_eq!(t.sent_hash, t.received_hash);
    assert!(
        r.closes.iter().all(|c| c.reason.is_none()),
        "{:?}",
        r.closes
    );
    let resumed = r.links[0]
        .first_stream_delivery(Dir::AToB, heal)
        .expect("the healed link carried data");
    let complete = r.completed_at.expect("completed");
    println!(
        "all links down 60 s: data flows again {:?} after link 0 heals ({} bytes left); \
         complete {:?} after the heal",
        resumed - heal,
        total - r.delivered_before(Dir::AToB, heal),
        complete - heal
    );
    // measured 31 ms (b3f1584)
    assert!(resumed - heal <= ms(46), "{:?}", resumed - heal);
    // measured 189 ms (b3f1584)
    assert!(complete - heal <= ms(280), "{:?}", complete - heal);
}

/// Every link dead for six hours, then one heals: the connection takes it back, and the
/// transfer completes. Each side probes a dead link that was up every probe interval, each
/// probe with a packet number of its own, so the first packets at the heal run more than
/// 2^20 numbers ahead of the last that arrived; the receiver refused such jumps whatever the
/// time since, and the connection stood still for good.
#[test]
fn all_links_dead_for_six_hours_then_one_heals_and_the_transfer_completes() {
    let total = 64 << 20;
    let start = ms(100);
    let heal = start + Duration::from_secs(6 * 3600);
    let sc = gigabit_links(2)
        .with_total_bytes(total)
        .with_time_limit(heal + Duration::from_secs(60))
        .at(start, Action::down(0))
        .at(start, Action::down(1))
        .at(heal, Action::up(0));
    let r = run_ok(&sc);
    assert_while_moving(&r, total, start, Action::down(0));
    assert_while_moving(&r, total, heal, Action::up(0));
    let t = r.transfer(Dir::AToB);
    assert_eq!(t.delivered, total);
    assert_eq!(t.sent_hash, t.received_hash);
    let resumed = r.links[0]
        .first_stream_delivery(Dir::AToB, heal)
        .expect("the healed link carried data");
    println!(
        "all links down 6 h: data flows again {:?} after link 0 heals",
        resumed - heal
    );
    assert!(
        resumed - heal <= Duration::from_secs(1),
        "{:?}",
        resumed - heal
    );
}

/// A link that never answers is probed with small datagrams, and slowly: to an address the
/// peer announced, its probes cost a few dozen bytes each instead of a full datagram (the
/// first full one waits for an answer), and after ten of them
/// (200 ms) one goes per second. (A full-size probe every 20 ms is 74 kB/s per link; a peer
/// announcing seven dead addresses made a client send 501 kB/s.)
#[test]
fn a_link_that_never_answers_gets_small_slow_probes() {
    let total = 64 << 20;
    // the premise here is a link dead from the start, before any data
    let sc = gigabit_links(2)
        .with_total_bytes(total)
        .at(Duration::ZERO, Action::blackhole(1));
    let r = run_ok(&sc);
    assert!(
        r.applied(Duration::ZERO, &Action::blackhole(1)),
        "link 1 was blackholed from the start"
    );
    assert_eq!(r.transfer(Dir::AToB).delivered, total);
    let c = r.links[1].dir(Dir::AToB);
    assert_eq!(
        (c.delivered, r.links[1].dir(Dir::BToA).delivered),
        (0, 0),
        "nothing crossed the dead link"
    );
    let seconds = r.completed_at.expect("completed").as_secs_f64();
    println!(
        "a dead link, {seconds:.2} s: {} probes, {} bytes",
        c.offered, c.offered_bytes
    );
    // ten probes in the first 200 ms, then one a second: 11 measured in 0.56 s (b3f1584)
    assert!(
        c.offered >= 10,
        "the dead link was probed {} times",
        c.offered
    );
    assert!(
        c.offered as f64 <= 11.0 + seconds,
        "{} probes in {seconds:.2} s",
        c.offered
    );
    // every probe small: the link leads to an address only the server's ACCEPT vouches for;
    // measured 13 bytes a probe (b3f1584)
    assert!(
        c.offered_bytes <= 19 * c.offered,
        "{} bytes in {} probes",
        c.offered_bytes,
        c.offered
    );
}

/// Every link dies during an A → B transfer: both sides, the sending one and the one that only
/// acknowledges, declare every link down (the peer is silent on every link, so a link must be
/// silent for 150 ms first, PROTOCOL.md §5.5); when the links heal, the transfer completes.
#[test]
fn every_link_dead_is_declared_down_on_both_sides() {
    let total = 256 << 20;
    let fault = ms(300);
    let heal = fault + Duration::from_secs(2);
    let sc = gigabit_links(2)
        .with_total_bytes(total)
        .with_time_limit(Duration::from_secs(10))
        .at(fault, Action::blackhole(0))
        .at(fault, Action::blackhole(1))
        .at(heal, Action::up(0))
        .at(heal, Action::up(1));
    let r = run_ok(&sc);
    for l in 0..2 {
        assert_while_moving(&r, total, fault, Action::blackhole(l));
        assert_while_moving(&r, total, heal, Action::up(l));
    }
    let gap = r.max_delivery_gap(Dir::AToB, fault, heal + ms(200));
    println!("every link dead: no delivery for {gap:?}");
    assert!(gap >= ms(1900), "the transfer went on: longest gap {gap:?}");
    assert_eq!(r.transfer(Dir::AToB).delivered, total);
    // each bound 1.5× what was measured at b3f1584: A 149.96 ms for link 0 and 14.96 ms for
    // link 1, B 154.99 ms for both
    for (host, link, bound) in [
        (HostId::A, 0, ms(224)),
        (HostId::A, 1, ms(22)),
        (HostId::B, 0, ms(232)),
        (HostId::B, 1, ms(232)),
    ] {
        let down = r
            .first_state_change(host, link, LinkState::Down, fault)
            .map(|t| t - fault);
        println!("every link dead: {host:?} declares link {link} down after {down:?}");
        let down = down.unwrap_or_else(|| panic!("{host:?} never declared link {link} down"));
        assert!(down <= bound, "{host:?} link {link}: {down:?}");
    }
}

/// The only link goes silent for 100 ms (a peer or switch that did not run for a while, as on
/// a busy host) and comes back: it is not declared down, and the transfer does not pause for a
/// recovery.
#[test]
fn a_100ms_stall_of_the_only_link_does_not_take_it_down() {
    let total = 64 << 20;
    let stall = ms(300);
    let end = stall + ms(100);
    let sc = gigabit_links(1)
        .with_total_bytes(total)
        .at(stall, Action::blackhole(0))
        .at(end, Action::up(0));
    let r = run_ok(&sc);
    assert_while_moving(&r, total, stall, Action::blackhole(0));
    assert_while_moving(&r, total, end, Action::up(0));
    assert_eq!(r.transfer(Dir::AToB).delivered, total);
    let gap = r.max_delivery_gap(Dir::AToB, stall, end + ms(200));
    let again = r.links[0]
        .first_stream_delivery(Dir::AToB, end)
        .expect("the link carried data again");
    println!(
        "a 100 ms stall: no delivery for {gap:?}; the link carries data {:?} after it ends",
        again - end,
    );
    assert!(
        gap >= ms(99),
        "the stall stopped nothing: longest gap {gap:?}"
    );
    let downs: Vec<_> = r
        .link_changes
        .iter()
        .filter(|c| c.to == LinkState::Down)
        .collect();
    assert!(downs.is_empty(), "{downs:?}");
    // no recovery, the link goes on where it stopped: measured 105 ms (1281a19), 5 ms beyond
    // the stall; 1.5 times that fails
    assert!(gap <= ms(108), "longest gap {gap:?}");
}

#[test]
fn soft_failed_link_is_demoted_within_60ms_and_goodput_holds() {
    let total = 250 << 20;
    let fault = ms(500);
    let sc = gigabit_links(2)
        .with_total_bytes(total)
        .at(fault, Action::rate(1, GBIT / 200));
    let r = run_ok(&sc);
    assert_while_moving(&r, total, fault, Action::rate(1, GBIT / 200));
    let demoted = demoted_at(&r, HostId::A, 1, fault).expect("the slow link was demoted");
    let healthy = payload_capacity(GBIT);
    let window = (fault + ms(100), fault + ms(1000));
    assert_under_way(&r, total, window.1);
    let goodput = r.goodput_bps(window.0, window.1);
    println!(
        "soft failure: demoted after {:?}; goodput {:.2} % of the healthy link over the next 0.9 s",
        demoted - fault,
        100.0 * goodput / healthy
    );
    // measured 40.4 ms (b3f1584)
    assert!(
        demoted - fault <= ms(60),
        "demoted after {:?}",
        demoted - fault
    );
    // measured 98.6 % (b3f1584): the shortfall may grow from 1.4 % to 2 %
    assert!(goodput >= 0.98 * healthy, "goodput {goodput:.0} bit/s");
}

/// A link that slows to a tenth of its rate but keeps delivering is not a failed link: the
/// scheduler gives it a tenth of the data, so its share of arrivals collapses, and the
/// receiver reports that. The sender does not demote it for that report, since what it sends
/// there is acknowledged within a round trip; the link goes on carrying its part.
#[test]
fn a_link_slowed_to_a_tenth_stays_up_and_carries_its_part() {
    let total = 250 << 20;
    let change = ms(500);
    let sc = gigabit_links(2)
        .with_total_bytes(total)
        .at(change, Action::rate(1, GBIT / 10));
    let r = run_ok(&sc);
    assert_while_moving(&r, total, change, Action::rate(1, GBIT / 10));
    let demotions: Vec<_> = r
        .link_changes
        .iter()
        .filter(|c| c.at >= change && c.to != LinkState::Up)
        .collect();
    // the transfer is over at 1.58 s: the window ends before
    let after = (change + ms(300), change + ms(1000));
    assert_under_way(&r, total, after.1);
    let slow_share = r.links[1].stream_bytes_between(Dir::AToB, after.0, after.1) as f64
        / r.delivered_between(Dir::AToB, after.0, after.1) as f64;
    println!(
        "a link slowed to a tenth: {} state changes; its share afterwards {:.2} %",
        demotions.len(),
        100.0 * slow_share
    );
    assert!(demotions.is_empty(), "{demotions:?}");
    // measured 9.09 % (b3f1584), the 1/11 a tenth of the rate is worth: a share smaller by
    // 1.5× fails, and so does one the slowing did not make small
    assert!(
        (0.061..=0.1).contains(&slow_share),
        "share of the slowed link {slow_share}"
    );
}

/// A receive window smaller than the links' bandwidth-delay product keeps the sender blocked
/// by it most of the time while the bytes that hold it are only in transit: they are not
/// sent again. Before, opportunistic retransmission re-sent the head at each acknowledgement
/// that moved it (1.73 bytes offered per byte delivered, goodput 280 Mbit/s).
#[test]
fn a_window_below_the_bandwidth_delay_product_sends_each_byte_once() {
    let total = 100 << 20;
    let mut sc = Scenario::default()
        .with_links(2, link(GBIT, ms(10)))
        .with_total_bytes(total)
        .with_time_limit(Duration::from_secs(60));
    sc.server.stream_receive_window = 1 << 20;
    let r = run_ok(&sc);
    let complete = r.completed_at.expect("completed");
    let offered: u64 = r.links.iter().map(|l| l.dir(Dir::AToB).offered_bytes).sum();
    let per_byte = offered as f64 / total as f64;
    // the premise: the window, not the links, set the pace (1 MiB per 20 ms round trip)
    let goodput = total as f64 * 8.0 / complete.as_secs_f64();
    println!(
        "1 MiB window over 2 × 1 Gbit/s, 20 ms: {per_byte:.4} bytes offered per byte, \
         goodput {:.0} Mbit/s",
        goodput / 1e6
    );
    assert!(goodput < 0.5 * 2.0 * payload_capacity(GBIT), "{goodput}");
    // measured 1.0150 (headers and acknowledgements included): 1.5× the overhead fails
    assert!(
        per_byte <= 1.0225,
        "{per_byte} bytes offered per byte delivered"
    );
}

#[test]
fn gigabit_and_100_megabit_links_reach_98_percent_of_combined_capacity() {
    let total = 200 << 20;
    let mut sc = Scenario::default().with_total_bytes(total);
    sc.links = vec![
        link(GBIT, Duration::from_micros(100)),
        link(GBIT / 10, Duration::from_micros(100)),
    ];
    let r = run_ok(&sc);
    assert_under_way(&r, total, ms(1200));
    let capacity = payload_capacity(GBIT) + payload_capacity(GBIT / 10);
    let goodput = r.goodput_bps(ms(300), ms(1200));
    let slow_share = r.links[1].stream_bytes_between(Dir::AToB, ms(300), ms(1200)) as f64
        / r.delivered_between(Dir::AToB, ms(300), ms(1200)) as f64;
    println!(
        "1 Gbit/s + 100 Mbit/s: goodput {:.2} % of combined payload capacity; slow link share {:.1} %",
        100.0 * goodput / capacity,
        100.0 * slow_share
    );
    // measured 98.4 % (b3f1584): the shortfall may grow from 1.6 % to 2 %
    assert!(goodput >= 0.98 * capacity, "goodput {goodput:.0} bit/s");
}

#[test]
fn five_percent_loss_on_every_link_completes_exactly() {
    let lossy = DirectionConfig::default()
        .with_rate(GBIT / 10)
        .with_delay(ms(2))
        .with_loss(0.05);
    let mut sc = Scenario::default()
        .with_links(3, LinkConfig::symmetric(lossy))
        .with_total_bytes(8 << 20)
        .with_time_limit(Duration::from_secs(300));
    sc.app.bidirectional = true;
    let r = run_ok(&sc);
    for dir in [Dir::AToB, Dir::BToA] {
        let t = r.transfer(dir);
        assert_eq!(t.delivered, 8 << 20);
        assert_eq!(t.sent_hash, t.received_hash);
    }
    let complete = r.completed_at.expect("completed");
    println!("5 % loss on 3 links, both directions: complete at {complete:?}");
    // measured 1.600 s (b3f1584)
    assert!(complete <= ms(2390), "{complete:?}");
}

#[test]
fn messages_survive_loss_duplication_corruption_and_reordering() {
    let bad = DirectionConfig::default()
        .with_rate(GBIT / 10)
        .with_delay(ms(3))
        .with_jitter(ms(1))
        .with_loss(0.03)
        .with_duplicate(0.02)
        .with_corrupt(0.02)
        .with_reorder(0.03);
    let mut sc = Scenario::default()
        .with_links(2, LinkConfig::symmetric(bad))
        .with_time_limit(Duration::from_secs(300));
    sc.app = AppConfig {
        mode: AppMode::Messages {
            count: 400,
            max_size: 64 * 1024,
        },
        bidirectional: true,
        ..AppConfig::default()
    };
    let r = run_ok(&sc);
    assert_eq!(r.transfer(Dir::AToB).messages, 400);
    assert_eq!(r.transfer(Dir::BToA).messages, 400);
    let complete = r.completed_at.expect("completed");
    println!("400 messages each way over bad links: complete at {complete:?}");
    // measured 8.95 s (b3f1584)
    assert!(complete <= ms(13_400), "{complete:?}");
}

#[test]
fn slow_reader_keeps_sender_memory_within_the_window() {
    let total = 6 << 20;
    let reader = 1_000_000;
    let buffer = 1 << 20;
    let mut sc = gigabit_links(2)
        .with_total_bytes(total)
        .with_time_limit(Duration::from_secs(60));
    sc.app.reader_rate = Some(reader);
    sc.client.send_buffer = buffer;
    sc.server.stream_receive_window = 2 << 20;
    let r = run_ok(&sc);
    let a = r.buffers(HostId::A);
    let b = r.buffers(HostId::B);
    let complete = r.completed_at.expect("completed");
    // the soonest the reader can have read everything: it starts with 10 ms worth of tokens
    let paced = Duration::from_secs_f64((total - reader / 100) as f64 / reader as f64);
    println!(
        "reader at 1 MB/s: sender buffered at most {} B (limit {buffer}), receiver {} B (window {}); \
         complete at {complete:?} ({:?} after the reader's pace)",
        a.send_buffered,
        b.recv_buffered,
        2 << 20,
        complete.saturating_sub(paced)
    );
    assert!(a.send_buffered <= buffer);
    assert!(b.recv_buffered <= 2 << 20);
    assert!(complete >= paced, "the reader set the pace");
    // and was kept fed: measured 7.6 ms after its pace (b3f1584)
    assert!(complete <= paced + ms(11), "{complete:?}");
}

#[test]
fn restarted_peer_is_reported_within_a_round_trip() {
    let total = 1 << 30;
    let restart = ms(300);
    let mut sc = gigabit_links(2)
        .with_total_bytes(total)
        .at(restart, Action::RestartServer);
    sc.end_on_close = true;
    let r = run_ok(&sc);
    assert_while_moving(&r, total, restart, Action::RestartServer);
    let close = r.close_of(HostId::A).expect("A's connection closed");
    assert_eq!(close.reason, Some(ConnectionError::PeerRestarted));
    println!(
        "peer restart reported {:?} after the restart",
        close.at - restart
    );
    // measured 102.4 µs (b3f1584); the round trip is 200 µs
    assert!(
        close.at - restart <= Duration::from_micros(150),
        "{:?}",
        close.at - restart
    );
}

/// The all-links-down deadline, pinned from both sides: an outage shorter than the deadline is
/// survived, a longer one ends the connection with `AllLinksDown`.
#[test]
fn all_links_down_deadline_is_honoured_from_both_sides() {
    let total = 32 << 20;
    let deadline = Duration::from_secs(2);
    let start = ms(100);
    let scenario = |outage: Duration| {
        let mut sc = gigabit_links(2)
            .with_total_bytes(total)
            .with_time_limit(Duration::from_secs(30))
            .outage(start, outage);
        sc.client.all_links_down_timeout = Some(deadline);
        sc.server.all_links_down_timeout = Some(deadline);
        sc
    };
    // survived: the links come back 500 ms before the deadline would end the connection
    let outage = deadline - ms(500);
    let r = run_ok(&scenario(outage));
    for l in 0..2 {
        assert_while_moving(&r, total, start, Action::down(l));
        assert_while_moving(&r, total, start + outage, Action::up(l));
    }
    assert_eq!(r.transfer(Dir::AToB).delivered, total);
    assert!(
        r.closes.iter().all(|c| c.reason.is_none()),
        "{:?}",
        r.closes
    );
    // exceeded
    let mut sc = scenario(deadline + Duration::from_secs(3));
    sc.end_on_close = true;
    let r = run_ok(&sc);
    for l in 0..2 {
        assert_while_moving(&r, total, start, Action::down(l));
    }
    let close = r.close_of(HostId::A).expect("A gave up");
    assert_eq!(close.reason, Some(ConnectionError::AllLinksDown));
    let all_down = (0..2)
        .map(|l| r.first_state_change(HostId::A, l, LinkState::Down, start))
        .max()
        .flatten()
        .expect("A declared every link down");
    println!(
        "every link down for longer than the {deadline:?} deadline: A declared them down {:?} \
         after the cut and gave up {:?} after that",
        all_down - start,
        close.at - all_down
    );
    // measured exactly the deadline (b3f1584)
    assert!(
        close.at - all_down >= deadline && close.at - all_down <= deadline + ms(1),
        "{:?}",
        close.at - all_down
    );
}

#[test]
fn explicit_addresses_open_every_link_without_discovery() {
    let total = 32 << 20;
    let mut sc = gigabit_links(3).with_total_bytes(total);
    sc.app.explicit_addrs = true;
    sc.client.discover = false;
    let r = run_ok(&sc);
    for (i, l) in r.links.iter().enumerate() {
        let carried = l.stream_bytes_between(Dir::AToB, Duration::ZERO, r.end_time);
        println!("explicit addresses: link {i} carried {carried} B");
        // measured 11.21, 11.17 and 11.17 MB, a third each (b3f1584): two thirds of a third
        assert!(carried >= 2 * total / 9, "link {i} carried {carried} B");
    }
}

#[test]
fn failover_striping_keeps_one_link_active_and_the_other_hot() {
    let total = 100 << 20;
    let fault = ms(400);
    let mut sc = gigabit_links(2)
        .with_total_bytes(total)
        .at(fault, Action::blackhole(0));
    sc.client.striping = ri2n_proto::Striping::Failover;
    let r = run_ok(&sc);
    assert_while_moving(&r, total, fault, Action::blackhole(0));
    let demoted = demoted_at(&r, HostId::A, 0, fault).expect("A demoted the blackholed link");
    let before = [0, 1].map(|l| r.links[l].stream_bytes_between(Dir::AToB, ms(100), fault));
    let after = r.links[1].stream_bytes_between(Dir::AToB, fault, r.end_time);
    let left = total - r.delivered_before(Dir::AToB, fault);
    let stall = stall_after(&r, fault);
    println!(
        "failover striping: before the fault link 0 carried {} B, link 1 {} B; link 0 demoted \
         {:?} after the fault, the application received nothing for {stall:?}; link 1 then \
         carried {after} B of the {left} B left",
        before[0],
        before[1],
        demoted - fault,
    );
    // measured 0 B: the standby carries no data while the active link works (b3f1584)
    assert_eq!(before[1], 0, "the standby stayed idle");
    assert!(before[0] > 0, "the active link carried the data");
    assert!(after >= left, "the standby took over: {after} of {left} B");
    // the standby takes over once the active link is declared down: measured 15 ms (1281a19)
    assert!(stall <= ms(22), "the application stalled {stall:?}");
}

#[test]
fn path_mtu_discovery_uses_jumbo_frames_and_survives_a_black_hole() {
    // Two 1 Gbit/s links and hosts that carry 8972-byte datagrams (a 9000-byte MTU). At 1 s
    // link 1's path shrinks to a 1500-byte MTU: its large datagrams vanish from then on.
    let total = 400 << 20;
    let jumbo = 8972;
    let shrink = ms(1000);
    let to_1500 = Action::SetMtu {
        link: 1,
        dir: None,
        mtu: MAX_DATAGRAM,
    };
    let mut sc = Scenario::default()
        .with_links(
            2,
            LinkConfig::symmetric(
                DirectionConfig::default()
                    .with_rate(GBIT)
                    .with_delay(Duration::from_micros(100))
                    .with_mtu(jumbo),
            ),
        )
        .with_total_bytes(total)
        .at(shrink, to_1500.clone());
    sc.max_datagram = jumbo;
    let r = run_ok(&sc);
    assert_while_moving(&r, total, shrink, to_1500);
    let capacity = |size: usize| GBIT as f64 * size as f64 / (size + HEADER_BYTES) as f64;
    let before = r.goodput_bps(ms(300), ms(900));
    println!(
        "jumbo: {:.1} Mbit/s = {:.2} % of the 9000-byte-MTU payload capacity ({:.2} % of the 1500-byte one)",
        before / 1e6,
        100.0 * before / (2.0 * capacity(jumbo)),
        100.0 * before / (2.0 * capacity(MAX_DATAGRAM))
    );
    // measured 99.54 % (b3f1584): the shortfall may grow from 0.46 % to 0.69 %
    assert!(
        before >= 0.9931 * 2.0 * capacity(jumbo),
        "{before:.0} bit/s"
    );
    assert!(
        before > 2.0 * capacity(MAX_DATAGRAM),
        "only larger datagrams get this far"
    );
    // link 1 stops delivering when its MTU shrinks, until it falls back to 1472-byte datagrams
    let timeline = &r.links[1].stream_timeline[Dir::AToB.index()];
    let start = shrink.as_millis() as usize;
    let resumed = (start + 1..timeline.len())
        .find(|&i| timeline[i] > 0 && timeline[i - 1] == 0)
        .map(|i| ms(i as u64) - shrink)
        .expect("link 1 carries data again");
    let stall = stall_after(&r, shrink);
    assert_under_way(&r, total, shrink + ms(300));
    let dropped = r.links[1].dir(Dir::AToB).dropped_too_big;
    println!(
        "black hole on link 1: it carries data again {resumed:?} after its MTU shrank; the \
         application received nothing for {stall:?}; {dropped} oversize datagrams dropped",
    );
    // measured 5 ms and 52 datagrams (b3f1584), a stall of 5 ms (1281a19)
    assert!(resumed <= ms(7), "{resumed:?}");
    assert!(stall <= ms(7), "the application stalled {stall:?}");
    assert!(
        (1..=78).contains(&dropped),
        "{dropped} oversize datagrams dropped"
    );
}

/// At 1 s link 1's path shrinks below the base datagram size (1000-byte datagrams, no ICMP):
/// its full packets vanish while its small ones (PINGs, the tails of writes) still get
/// through. The sender takes the link down, as it carries no full packet any more, and the
/// transfer goes on over link 0. Before, the link stayed up for the whole fault, every full
/// packet placed on it lost and sent again (a slow sender, as a tunnel's inner TCP backed
/// off, stalled on it).
#[test]
fn a_path_below_the_base_size_takes_its_link_down() {
    let total = 20 << 20;
    let shrink = ms(1000);
    let to_1000 = Action::SetMtu {
        link: 1,
        dir: None,
        mtu: 1000,
    };
    let mut sc = gigabit_links(2)
        .with_total_bytes(total)
        .with_time_limit(Duration::from_secs(30))
        .at(shrink, to_1000.clone());
    // a reader of 50 Mbit/s: the sender sends no faster, as a tunnel's inner TCP
    sc.app.reader_rate = Some(50_000_000 / 8);
    let r = run_ok(&sc);
    assert_while_moving(&r, total, shrink, to_1000);
    let down = r.first_state_change(HostId::A, 1, LinkState::Down, shrink);
    let dropped = r.links[1].dir(Dir::AToB).dropped_too_big;
    println!(
        "path of link 1 below the base size: down {:?} after, {dropped} full datagrams dropped",
        down.map(|t| t - shrink)
    );
    // the premise: full packets were sent into the smaller path
    assert!(dropped > 0, "nothing was dropped for its size");
    assert!(
        down.is_some_and(|t| t - shrink <= ms(500)),
        "link 1 was not taken down: {down:?}"
    );
    // it stays down while the path cannot carry the base size (its probes are of that size)
    assert_eq!(
        r.first_state_change(HostId::A, 1, LinkState::Up, down.unwrap()),
        None
    );
}

/// Every link dead for 2 s, then one comes back while the other stays dead, with the failures
/// at several moments of a transfer (the receiver's window used up): the transfer completes.
/// Frames riding the probes of the link still dead never arrived: the receiver's window
/// update kept going out on them (the sender stalled for good), and the acknowledgements of
/// the sender's probes did too (its side of the healed link never came back).
#[test]
fn one_link_back_after_every_link_died_carries_the_rest_of_the_transfer() {
    let total = 128 << 20;
    for (start, heals) in [(157, 0), (178, 0), (325, 0), (157, 1), (325, 1)] {
        let start = ms(start);
        let healed = start + Duration::from_secs(2);
        let sc = gigabit_links(2)
            .with_total_bytes(total)
            .with_time_limit(Duration::from_secs(10))
            .at(start, Action::blackhole(heals))
            .at(start + ms(1), Action::blackhole(1 - heals))
            .at(healed, Action::up(heals));
        let r = run_ok(&sc);
        assert_while_moving(&r, total, start, Action::blackhole(heals));
        assert_while_moving(&r, total, start + ms(1), Action::blackhole(1 - heals));
        assert_while_moving(&r, total, healed, Action::up(heals));
        for l in 0..2 {
            let down = r.first_state_change(HostId::A, l, LinkState::Down, start);
            assert!(
                down.is_some_and(|t| t < healed),
                "A declared link {l} down during the outage"
            );
        }
        let t = r.transfer(Dir::AToB);
        assert_eq!(t.delivered, total);
        assert_eq!(t.sent_hash, t.received_hash);
        let resumed = r.links[heals]
            .first_stream_delivery(Dir::AToB, healed)
            .expect("data on the healed link");
        println!(
            "every link dead from {start:?}, link {heals} back after 2 s: data again {:?} later",
            resumed - healed
        );
        // measured 36 ms in each case (b3f1584)
        assert!(resumed - healed <= ms(54), "{:?}", resumed - healed);
    }
}

/// The return direction of every link dies for 300 ms just as the last of 32 MiB arrives
/// (1 Gbit/s, 20 ms each way, one link and then two). The receiver has it all and closes
/// cleanly, while the sender, hearing nothing, declares its links down and writes off what
/// they had in flight: more than it keeps account of, so after the heal it repairs much of
/// it from congestion windows started anew, its acknowledgements coming back in the closed
/// peer's answers. It must end cleanly too. Before, the grace period that the closed peer's
/// first answer started ran out mid-repair, and the sender reported `ClosedEarly` for a
/// transfer that had arrived whole.
#[test]
fn a_return_path_outage_as_a_transfer_ends_still_ends_it_cleanly() {
    const OUTAGE: u64 = 300;
    for (links, start) in [(1, 628), (2, 598)] {
        let mut sc = Scenario::default()
            .with_links(
                links,
                LinkConfig::symmetric(
                    DirectionConfig::default()
                        .with_rate(GBIT)
                        .with_delay(ms(20))
                        .with_queue_limit(4 << 20),
                ),
            )
            .with_total_bytes(32 << 20)
            .with_time_limit(Duration::from_secs(60));
        sc.app.explicit_addrs = true;
        for link in 0..links {
            for (at, status) in [
                (start, LinkStatus::Blackhole),
                (start + OUTAGE, LinkStatus::Up),
            ] {
                let dir = Some(Dir::BToA);
                sc = sc.at(ms(at), Action::SetStatus { link, dir, status });
            }
        }
        let r = run_ok(&sc);
        let t = r.transfer(Dir::AToB);
        println!(
            "{links} link(s): all received at {:?}, acknowledged at {:?}",
            t.received_all_at, t.send_complete_at
        );
        // the premise: the last byte arrived while no acknowledgement could come back, and
        // the sender learned that it had only after the heal
        let received = t.received_all_at.expect("the receiver took it all");
        assert!(
            (ms(start)..ms(start + OUTAGE)).contains(&received),
            "{links} link(s): all received at {received:?}"
        );
        let acknowledged = t.send_complete_at.expect("acknowledged");
        assert!(acknowledged > ms(start + OUTAGE), "{acknowledged:?}");
    }
}
