//! The engine's promised outcomes, each checked in simulated time on a scenario built for it.
//! Every run also checks (inside the simulator) that the received stream equals the sent one,
//! byte for byte, and that buffers stay within the configured windows.
//!
//! Each test prints the figure it measured (run with `--nocapture` to see them).

use std::time::Duration;

use ri2n_proto::{ConnectionError, LinkState};
use ri2n_sim::{
    run, Action, AppConfig, AppMode, Dir, DirectionConfig, HostId, LinkConfig, Report, Scenario,
    HEADER_BYTES, MAX_DATAGRAM,
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

/// Earliest time at or after `from` from which goodput over the next `window` reaches
/// `threshold` bits/s.
fn goodput_back_at(
    r: &Report,
    from: Duration,
    window: Duration,
    threshold: f64,
) -> Option<Duration> {
    (0..5000u64)
        .map(|i| from + ms(i))
        .find(|&t| r.goodput_bps(t, t + window) >= threshold)
}

#[test]
fn two_gigabit_links_reach_97_percent_of_payload_capacity() {
    let sc = gigabit_links(2).with_total_bytes(300 << 20);
    let r = run_ok(&sc);
    let capacity = 2.0 * payload_capacity(GBIT);
    let goodput = r.goodput_bps(ms(300), ms(1100));
    println!(
        "steady goodput {:.1} Mbit/s = {:.2} % of {:.1} Mbit/s payload capacity",
        goodput / 1e6,
        100.0 * goodput / capacity,
        capacity / 1e6
    );
    assert!(goodput >= 0.97 * capacity, "goodput {goodput:.0} bit/s");
}

#[test]
fn blackholed_link_fails_over_within_50ms() {
    let fault = ms(500);
    let sc = gigabit_links(2)
        .with_total_bytes(250 << 20)
        .at(fault, Action::blackhole(1));
    let r = run_ok(&sc);
    let survivor = payload_capacity(GBIT);
    let back = goodput_back_at(&r, fault, ms(10), 0.9 * survivor).expect("goodput came back");
    let sustained = r.goodput_bps(back, back + ms(300));
    println!(
        "failover: goodput >= 90 % of the surviving link {:?} after the blackhole; then {:.1} % of it",
        back - fault,
        100.0 * sustained / survivor
    );
    assert!(back - fault <= ms(50), "failover took {:?}", back - fault);
    assert!(
        sustained >= 0.9 * survivor,
        "sustained {sustained:.0} bit/s"
    );
}

/// A link down for `outage` heals; it must carry data again within 100 ms. The links are
/// 10 Mbit/s so that ten simulated minutes of transfer stay cheap.
fn healed_link_carries_data_again(outage: Duration) -> Duration {
    let start = ms(300);
    let heal = start + outage;
    let rate = 10_000_000;
    let bytes = (rate as f64 / 8.0 * (heal + ms(1500)).as_secs_f64()) as u64;
    let sc = Scenario::default()
        .with_links(2, link(rate, ms(1)))
        .with_total_bytes(bytes)
        .with_time_limit(heal + Duration::from_secs(30))
        .at(start, Action::down(1))
        .at(heal, Action::up(1));
    let r = run_ok(&sc);
    let went_down = r.first_state_change(HostId::A, 1, LinkState::Down, start);
    assert!(went_down.is_some(), "the link was seen down");
    assert_eq!(
        r.links[1].stream_bytes_between(Dir::AToB, start + ms(100), heal),
        0,
        "no data crossed the dead link"
    );
    let carried = r.links[1]
        .first_stream_delivery(Dir::AToB, heal)
        .expect("the healed link carried data");
    println!(
        "outage {outage:?}: healed link carries data {:?} after the heal (up at {:?})",
        carried - heal,
        r.first_state_change(HostId::A, 1, LinkState::Up, heal)
            .map(|t| t - heal)
    );
    carried - heal
}

#[test]
fn healed_link_carries_data_within_100ms_after_1s_outage() {
    let t = healed_link_carries_data_again(Duration::from_secs(1));
    assert!(t <= ms(100), "took {t:?}");
}

#[test]
fn healed_link_carries_data_within_100ms_after_10min_outage() {
    let t = healed_link_carries_data_again(Duration::from_secs(600));
    assert!(t <= ms(100), "took {t:?}");
}

#[test]
fn all_links_dead_for_60s_then_one_heals_and_the_transfer_completes() {
    let start = ms(200);
    let sc = gigabit_links(2)
        .with_total_bytes(64 << 20)
        .with_time_limit(Duration::from_secs(120))
        .at(start, Action::down(0))
        .at(start, Action::blackhole(1))
        .at(start + Duration::from_secs(60), Action::up(0));
    let r = run_ok(&sc);
    let t = r.transfer(Dir::AToB);
    assert_eq!(t.delivered, 64 << 20);
    assert_eq!(t.sent_hash, t.received_hash);
    assert!(
        r.closes.iter().all(|c| c.reason.is_none()),
        "{:?}",
        r.closes
    );
    let resumed = r.links[0]
        .first_stream_delivery(Dir::AToB, start + Duration::from_secs(60))
        .unwrap();
    println!(
        "all links down 60 s: data flows again {:?} after link 0 heals; complete at {:?}",
        resumed - start - Duration::from_secs(60),
        r.completed_at
    );
}

/// A link that never answers is probed with small datagrams, and slowly: to an address the
/// peer announced, its probes cost a few dozen bytes each instead of a full datagram (the
/// first full one waits for an answer), and after ten of them
/// (200 ms) one goes per second. (A full-size probe every 20 ms is 74 kB/s per link; a peer
/// announcing seven dead addresses made a client send 501 kB/s.)
#[test]
fn a_link_that_never_answers_gets_small_slow_probes() {
    let sc = gigabit_links(2)
        .with_total_bytes(64 << 20)
        .at(Duration::ZERO, Action::blackhole(1));
    let r = run_ok(&sc);
    assert_eq!(r.transfer(Dir::AToB).delivered, 64 << 20);
    let c = r.links[1].dir(Dir::AToB);
    let seconds = r.completed_at.expect("completed").as_secs_f64();
    println!(
        "a dead link, {seconds:.2} s: {} probes, {} bytes",
        c.offered, c.offered_bytes
    );
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
    // every probe small: the link leads to an address only the server's ACCEPT vouches for
    assert!(
        c.offered_bytes <= 100 * c.offered,
        "{} bytes in {} probes",
        c.offered_bytes,
        c.offered
    );
}

/// Every link dies during an A → B transfer: both sides, the sending one and the one that only
/// acknowledges, declare every link down within 400 ms (the peer is silent on every link, so
/// a link must be silent for 150 ms first, PROTOCOL.md §5.5).
#[test]
fn every_link_dead_is_declared_down_on_both_sides() {
    let fault = ms(300);
    let sc = gigabit_links(2)
        .with_total_bytes(256 << 20)
        .with_time_limit(Duration::from_secs(10))
        .at(fault, Action::blackhole(0))
        .at(fault, Action::blackhole(1))
        .at(fault + Duration::from_secs(2), Action::up(0))
        .at(fault + Duration::from_secs(2), Action::up(1));
    let r = run_ok(&sc);
    assert_eq!(r.transfer(Dir::AToB).delivered, 256 << 20);
    for host in [HostId::A, HostId::B] {
        for link in 0..2 {
            let down = r
                .link_changes
                .iter()
                .find(|c| {
                    c.host == host
                        && c.link == Some(link)
                        && c.at >= fault
                        && c.to == LinkState::Down
                })
                .map(|c| c.at - fault);
            println!("every link dead: {host:?} declares link {link} down after {down:?}");
            let down = down.unwrap_or_else(|| panic!("{host:?} never declared link {link} down"));
            assert!(down <= ms(400), "{host:?} link {link}: {down:?}");
        }
    }
}

/// The only link goes silent for 100 ms (a peer or switch that did not run for a while, as on
/// a busy host) and comes back: it is not declared down, and the transfer does not pause for a
/// recovery.
#[test]
fn a_100ms_stall_of_the_only_link_does_not_take_it_down() {
    let stall = ms(300);
    let sc = gigabit_links(1)
        .with_total_bytes(64 << 20)
        .at(stall, Action::blackhole(0))
        .at(stall + ms(100), Action::up(0));
    let r = run_ok(&sc);
    assert_eq!(r.transfer(Dir::AToB).delivered, 64 << 20);
    let downs: Vec<_> = r
        .link_changes
        .iter()
        .filter(|c| c.to == LinkState::Down)
        .collect();
    assert!(downs.is_empty(), "{downs:?}");
}

#[test]
fn soft_failed_link_is_demoted_within_100ms_and_goodput_holds() {
    let fault = ms(500);
    let sc = gigabit_links(2)
        .with_total_bytes(250 << 20)
        .at(fault, Action::rate(1, GBIT / 200));
    let r = run_ok(&sc);
    let demoted = [LinkState::Degraded, LinkState::Down]
        .iter()
        .filter_map(|&s| r.first_state_change(HostId::A, 1, s, fault))
        .min()
        .expect("the slow link was demoted");
    let healthy = payload_capacity(GBIT);
    let goodput = r.goodput_bps(fault + ms(100), fault + ms(1000));
    println!(
        "soft failure: demoted after {:?}; goodput {:.1} % of the healthy link over the next 0.9 s",
        demoted - fault,
        100.0 * goodput / healthy
    );
    assert!(
        demoted - fault <= ms(100),
        "demoted after {:?}",
        demoted - fault
    );
    assert!(goodput >= 0.9 * healthy, "goodput {goodput:.0} bit/s");
}

/// A link that slows to a tenth of its rate but keeps delivering is not a failed link: the
/// scheduler gives it a tenth of the data, so its share of arrivals collapses, and the
/// receiver reports that. The sender does not demote it for that report, since what it sends
/// there is acknowledged within a round trip; the link goes on carrying its part.
#[test]
fn a_link_slowed_to_a_tenth_stays_up_and_carries_its_part() {
    let change = ms(500);
    let sc = gigabit_links(2)
        .with_total_bytes(250 << 20)
        .at(change, Action::rate(1, GBIT / 10));
    let r = run_ok(&sc);
    let demotions: Vec<_> = r
        .link_changes
        .iter()
        .filter(|c| c.at >= change && c.to != LinkState::Up)
        .collect();
    let after = (change + ms(300), change + ms(1300));
    let slow_share = r.links[1].stream_bytes_between(Dir::AToB, after.0, after.1) as f64
        / r.delivered_between(Dir::AToB, after.0, after.1) as f64;
    println!(
        "a link slowed to a tenth: {} state changes; its share afterwards {:.1} %",
        demotions.len(),
        100.0 * slow_share
    );
    assert!(demotions.is_empty(), "{demotions:?}");
    assert!(slow_share > 0.05, "share of the slowed link {slow_share}");
}

#[test]
fn gigabit_and_100_megabit_links_reach_95_percent_of_combined_capacity() {
    let mut sc = Scenario::default().with_total_bytes(200 << 20);
    sc.links = vec![
        link(GBIT, Duration::from_micros(100)),
        link(GBIT / 10, Duration::from_micros(100)),
    ];
    let r = run_ok(&sc);
    let capacity = payload_capacity(GBIT) + payload_capacity(GBIT / 10);
    let goodput = r.goodput_bps(ms(300), ms(1200));
    let slow_share = r.links[1].stream_bytes_between(Dir::AToB, ms(300), ms(1200)) as f64
        / r.delivered_between(Dir::AToB, ms(300), ms(1200)) as f64;
    println!(
        "1 Gbit/s + 100 Mbit/s: goodput {:.1} % of combined payload capacity; slow link share {:.1} %",
        100.0 * goodput / capacity,
        100.0 * slow_share
    );
    assert!(goodput >= 0.95 * capacity, "goodput {goodput:.0} bit/s");
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
    println!(
        "5 % loss on 3 links, both directions: complete at {:?}",
        r.completed_at
    );
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
}

#[test]
fn slow_reader_keeps_sender_memory_within_the_window() {
    let buffer = 1 << 20;
    let mut sc = gigabit_links(2)
        .with_total_bytes(6 << 20)
        .with_time_limit(Duration::from_secs(60));
    sc.app.reader_rate = Some(1_000_000);
    sc.client.send_buffer = buffer;
    sc.server.stream_receive_window = 2 << 20;
    let r = run_ok(&sc);
    let a = r.buffers(HostId::A);
    let b = r.buffers(HostId::B);
    println!(
        "reader at 1 MB/s: sender buffered at most {} B (limit {buffer}), receiver {} B (window {})",
        a.send_buffered,
        b.recv_buffered,
        2 << 20
    );
    assert!(a.send_buffered <= buffer);
    assert!(b.recv_buffered <= 2 << 20);
    assert!(
        r.completed_at.unwrap() >= Duration::from_secs(5),
        "the reader set the pace"
    );
}

#[test]
fn restarted_peer_is_reported_within_one_second() {
    let restart = ms(300);
    let mut sc = gigabit_links(2)
        .with_total_bytes(1 << 30)
        .at(restart, Action::RestartServer);
    sc.end_on_close = true;
    let r = run_ok(&sc);
    let close = r.close_of(HostId::A).expect("A's connection closed");
    assert_eq!(close.reason, Some(ConnectionError::PeerRestarted));
    println!(
        "peer restart reported {:?} after the restart",
        close.at - restart
    );
    assert!(close.at - restart <= Duration::from_secs(1));
}

/// The all-links-down deadline, pinned from both sides: an outage shorter than the deadline is
/// survived, a longer one ends the connection with `AllLinksDown`.
#[test]
fn all_links_down_deadline_is_honoured_from_both_sides() {
    let deadline = Duration::from_secs(2);
    let scenario = |outage: Duration| {
        let mut sc = gigabit_links(2)
            .with_total_bytes(32 << 20)
            .with_time_limit(Duration::from_secs(30))
            .outage(ms(100), outage);
        sc.client.all_links_down_timeout = Some(deadline);
        sc.server.all_links_down_timeout = Some(deadline);
        sc
    };
    // survived: the links come back 500 ms before the deadline would end the connection
    run_ok(&scenario(deadline - ms(500)));
    // exceeded
    let mut sc = scenario(deadline + Duration::from_secs(3));
    sc.end_on_close = true;
    let r = run_ok(&sc);
    let close = r.close_of(HostId::A).expect("A gave up");
    assert_eq!(close.reason, Some(ConnectionError::AllLinksDown));
}

#[test]
fn explicit_addresses_open_every_link_without_discovery() {
    let mut sc = gigabit_links(3).with_total_bytes(32 << 20);
    sc.app.explicit_addrs = true;
    sc.client.discover = false;
    let r = run_ok(&sc);
    for (i, l) in r.links.iter().enumerate() {
        assert!(
            l.stream_bytes_between(Dir::AToB, Duration::ZERO, r.end_time) > 1 << 20,
            "link {i} carried data"
        );
    }
}

#[test]
fn failover_striping_keeps_one_link_active_and_the_other_hot() {
    let fault = ms(400);
    let mut sc = gigabit_links(2)
        .with_total_bytes(100 << 20)
        .at(fault, Action::blackhole(0));
    sc.client.striping = ri2n_proto::Striping::Failover;
    let r = run_ok(&sc);
    let before = [0, 1].map(|l| r.links[l].stream_bytes_between(Dir::AToB, ms(100), fault));
    let after = r.links[1].stream_bytes_between(Dir::AToB, fault, r.end_time);
    println!("failover striping: before the fault link 0 carried {} B, link 1 {} B; link 1 then {after} B", before[0], before[1]);
    assert!(
        before[1] * 100 < before[0],
        "the standby stayed (almost) idle"
    );
    assert!(after > 10 << 20, "the standby took over");
}

#[test]
fn path_mtu_discovery_uses_jumbo_frames_and_survives_a_black_hole() {
    // Two 1 Gbit/s links and hosts that carry 8972-byte datagrams (a 9000-byte MTU). At 1 s
    // link 1's path shrinks to a 1500-byte MTU: its large datagrams vanish from then on.
    let jumbo = 8972;
    let shrink = ms(1000);
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
        .with_total_bytes(400 << 20)
        .at(
            shrink,
            Action::SetMtu {
                link: 1,
                dir: None,
                mtu: MAX_DATAGRAM,
            },
        );
    sc.max_datagram = jumbo;
    let r = run_ok(&sc);
    let capacity = |size: usize| GBIT as f64 * size as f64 / (size + HEADER_BYTES) as f64;
    let before = r.goodput_bps(ms(300), ms(900));
    println!(
        "jumbo: {:.1} Mbit/s = {:.2} % of the 9000-byte-MTU payload capacity ({:.2} % of the 1500-byte one)",
        before / 1e6,
        100.0 * before / (2.0 * capacity(jumbo)),
        100.0 * before / (2.0 * capacity(MAX_DATAGRAM))
    );
    assert!(before >= 0.97 * 2.0 * capacity(jumbo), "{before:.0} bit/s");
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
    let target = 0.9 * (capacity(jumbo) + capacity(MAX_DATAGRAM));
    let back = goodput_back_at(&r, shrink + ms(1), ms(20), target).expect("goodput recovers");
    println!(
        "black hole on link 1: it carries data again {resumed:?} after its MTU shrank, goodput \
         ≥ 90 % of both links' capacity {:?} after; {} oversize datagrams dropped",
        back - shrink,
        r.links[1].dir(Dir::AToB).dropped_too_big
    );
    assert!(resumed <= ms(100), "{resumed:?}");
    assert!(back - shrink <= ms(200), "{:?}", back - shrink);
    assert!(r.links[1].dir(Dir::AToB).dropped_too_big > 0);
}

/// Every link dead for 2 s, then one comes back while the other stays dead, with the failures
/// at several moments of a transfer (the receiver's window used up): the transfer completes.
/// Frames riding the probes of the link still dead never arrived: the receiver's window
/// update kept going out on them (the sender stalled for good), and the acknowledgements of
/// the sender's probes did too (its side of the healed link never came back).
#[test]
fn one_link_back_after_every_link_died_carries_the_rest_of_the_transfer() {
    for (start, heals) in [(157, 0), (178, 0), (325, 0), (157, 1), (325, 1)] {
        let start = ms(start);
        let sc = gigabit_links(2)
            .with_total_bytes(128 << 20)
            .with_time_limit(Duration::from_secs(10))
            .at(start, Action::blackhole(heals))
            .at(start + ms(1), Action::blackhole(1 - heals))
            .at(start + Duration::from_secs(2), Action::up(heals));
        let r = run_ok(&sc);
        let t = r.transfer(Dir::AToB);
        assert_eq!(t.delivered, 128 << 20);
        assert_eq!(t.sent_hash, t.received_hash);
        let healed = start + Duration::from_secs(2);
        let resumed = r.links[heals]
            .first_stream_delivery(Dir::AToB, healed)
            .expect("data on the healed link");
        println!(
            "every link dead from {start:?}, link {heals} back after 2 s: data again {:?} later",
            resumed - healed
        );
    }
}
