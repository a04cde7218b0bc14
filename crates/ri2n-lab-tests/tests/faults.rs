//! End-to-end fault tests: `ri2n send` and `ri2n recv` in two network namespaces joined by two
//! 1 Gbit/s links, each through its own switch namespace (`lab/ri2n-lab`), with real faults
//! injected mid-transfer: a pulled cable, a dead switch, a switch that trickles, random loss,
//! an interface MTU lowered under a link, every link down for 30 s, every path dark one way
//! under the TCP transport, a receiver restart, a killed sender, a flood of garbage
//! datagrams, and a dead switch on IPv6 links.
//!
//! Every transfer must end with both tools exiting 0 and the received file equal (sha256) to
//! the sent one. The figures (transfer times, per-link rates around the fault, when the
//! faulted link carried data again, restart detection time, peak memory) are printed and
//! appended to `target/tmp/ri2n-lab-report.txt`; the delivery stalls themselves are measured
//! by the benchmark (`bench/run-all fault`). Times are asserted at a few times their measured
//! median, with the median beside the bound.
//!
//! Needs root, iproute2 and nftables; without them the tests print why and pass, unless `CI`
//! is set, where they fail. The tests run one at a time (see `support::serial`).
//! A transfer is sized by time: its sender is fed until every fault and heal has happened and
//! the recovery had time to show (`support::Transfer`), and each fault test fails unless the
//! fault visibly hit the link while data moved and the recovery it names was observed.
//! `RI2N_LAB_MIB` sets the size of the data file that is fed over and over (default 128 MiB)
//! and `RI2N_LAB_TMPDIR` where the data files go.

mod support;

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{
    flood, keygen, report, tap, Action, DataFile, FloodPlan, Host, Lab, LabTest, Proc, TapPlan,
    Transfer, PORT,
};

/// Each test gives up (killing its processes and removing its lab) after this long.
const TEST_TIMEOUT: Duration = Duration::from_secs(120);
/// When the fault hits and when it is healed, from the sender's start.
const FAULT_AT: Duration = Duration::from_millis(1000);
const HEAL_AT: Duration = Duration::from_millis(3000);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// MiB of the data file a transfer feeds (at least once, then as long as its timeline runs).
fn data_mib() -> u64 {
    std::env::var("RI2N_LAB_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128u64)
        .max(1)
}

/// What a fault must visibly do to its link for the test to count.
#[derive(Clone, Copy, Debug)]
enum Shows {
    /// The sender declares the link down between the fault and the heal.
    Down,
    /// The sender declares the link down or degraded between the fault and the heal.
    DownOrDegraded,
    /// The sender counts packets lost on the link, at a rate at least twice the other
    /// links'.
    Losses,
    /// The link goes on carrying through the fault: over its second half, at least half of
    /// what it carried before.
    CarriesOn,
}

/// Panics unless the sender's report shows what `shows` says of lab link `link` (connection
/// link `link - 1`: the first address given is link 0 on both sides).
fn assert_fault_seen(out: &support::Outcome, link: u8, shows: Shows) {
    let (fault, heal) = (out.applied[0].0, out.applied[1].0);
    let id = u64::from(link - 1);
    let events = out.send_json["link_events"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let declared = |states: &[&str]| {
        events.iter().any(|e| {
            e["link"].as_u64() == Some(id)
                && states.contains(&e["to"].as_str().unwrap_or(""))
                && (fault..=heal + 0.5).contains(&e["at_s"].as_f64().unwrap_or(-1.0))
        })
    };
    let seen = match shows {
        Shows::Down => declared(&["down"]),
        Shows::DownOrDegraded => declared(&["down", "degraded"]),
        Shows::Losses => {
            // a loss rate well above the other link's: any loaded link loses some packets
            // to its queue, with no fault at all
            let rate = |l: &serde_json::Value| {
                let lost = l["packets_lost"].as_u64().unwrap_or(0) as f64;
                lost / l["packets_sent"].as_u64().unwrap_or(0).max(1) as f64
            };
            let links = out.send_json["links"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let faulted = links.get(id as usize).map_or(0.0, rate);
            let others = (links.iter().enumerate())
                .filter(|&(i, _)| i != id as usize)
                .map(|(_, l)| rate(l))
                .fold(0.0, f64::max);
            faulted > 0.0 && faulted >= 2.0 * others
        }
        Shows::CarriesOn => {
            let before = out.link_avg_mbit(link, 0.2, fault);
            let during = out.link_avg_mbit(link, (fault + heal) / 2.0, heal);
            during >= before / 2.0 && before > 0.0
        }
    };
    assert!(
        seen,
        "{}: the fault on link {link} did not show ({shows:?}); sender's events: {events:?}; \
         links: {}",
        out.name, out.send_json["links"]
    );
}

/// A 2-link lab, a data file, and one transfer each way with `kind` injected on one link at
/// [`FAULT_AT`] and healed at [`HEAL_AT`]: A→B with the fault on link 1 (the address the
/// sender was given; link 2 is discovered in the handshake), B→A with the fault on link 2
/// (both addresses given, no discovery). `kind_b2a` is the fault for the second transfer.
/// `rejoin_bound`: how soon after the heal the faulted link must carry more than 50 Mbit/s
/// again, a few times what was measured. `lanes`: both ends send and receive with a thread
/// per link (`--send-threads on --recv-threads on`, the default from 8 CPUs), else as their
/// host's default.
fn fault_both_ways(
    name: &'static str,
    seed: u64,
    kind_a2b: &[&str],
    kind_b2a: &[&str],
    shows: Shows,
    rejoin_bound: Duration,
    lanes: bool,
) {
    let Some(test) = LabTest::start(name, &[]) else {
        return;
    };
    let (env, dir) = (test.env, &test.dir);
    let deadline = Instant::now() + TEST_TIMEOUT;
    let lab = Lab::up(env, name, 2);
    let data = DataFile::create(dir.0.join("input"), data_mib(), seed);
    for (sender, link, kind, discover) in [
        (Host::A, 1u8, kind_a2b, true),
        (Host::B, 2u8, kind_b2a, false),
    ] {
        let kind: Vec<String> = kind.iter().map(|s| s.to_string()).collect();
        let out = Transfer {
            sender,
            input: &data,
            actions: vec![
                (FAULT_AT, Action::Fault(link, kind)),
                (HEAL_AT, Action::Heal(link)),
            ],
            discover,
            deadline,
            name: format!("{name}-{}2{}", sender.letter(), sender.other().letter()),
            key: None,
            tcp: false,
            args: if lanes {
                &["--send-threads", "on", "--recv-threads", "on"]
            } else {
                &[]
            },
        }
        .run(env, &lab, &dir.0);
        out.report(Some(link));
        if lanes {
            for (who, doc) in [("sender", &out.send_json), ("receiver", &out.recv_json)] {
                for threads in ["send_threads", "recv_threads"] {
                    assert_eq!(
                        doc[threads],
                        serde_json::json!(true),
                        "{}: the {who} ran without {threads}",
                        out.name
                    );
                }
            }
        }
        assert_fault_seen(&out, link, shows);
        let heal = out.applied[1].0;
        let rejoined = out.rejoin_after(heal, link, 50.0).unwrap_or_else(|| {
            panic!(
                "{}: link {link} never carried > 50 Mbit/s again after the heal at {heal:.2} s",
                out.name
            )
        });
        report(&format!(
            "    {}: rejoined {:.0} ms after the heal",
            out.name,
            rejoined * 1e3
        ));
        assert!(
            rejoined <= rejoin_bound.as_secs_f64(),
            "{}: link {link} carried data again only {:.0} ms after the heal (bound {:?})",
            out.name,
            rejoined * 1e3,
            rejoin_bound
        );
    }
}

#[test]
fn cable_pulled_then_plugged_back() {
    // the cable between the switch and host B: B loses carrier (the receiver in A→B, the
    // sender in B→A)
    // measured 47 and 192 ms (A→B), 20 and 82 ms (B→A), 2-core host, 2026-11-27; later that
    // day 65-280 ms in three runs each way, and once 1074 ms (B→A): B, which lost carrier,
    // dropped its neighbour entries and resolves A's address anew after the heal, and one
    // lost request waits out Linux's 1 s address-resolution retransmission, so the bound
    // allows one
    fault_both_ways(
        "cable",
        1,
        &["cable", "b"],
        &["cable", "b"],
        Shows::Down,
        ms(1500),
        false,
    );
}

#[test]
fn an_mtu_lowered_under_a_link_is_used_until_restored() {
    // the sender's interface on the link takes 1280-byte frames from 1 s to 3 s: no
    // full-size datagram leaves (EMSGSIZE), while acknowledgements and small packets would.
    // The driver hears of the change and the link goes on with datagrams the interface takes
    // (a refused send before that may take it down a moment). Before the MTU was followed,
    // the link went down until the MTU was restored; before that, each refused send counted
    // as a loss on a link still up, and the lost data went back to it.
    fault_both_ways(
        "mtu",
        7,
        &["mtu", "1280", "a"],
        &["mtu", "1280", "b"],
        Shows::CarriesOn,
        ms(1500),
        false,
    );
}

#[test]
fn switch_dead_then_back() {
    // the bridge stops forwarding; both hosts keep carrier and see nothing wrong locally
    // measured 34 and 127 ms (A→B), 19 and 42 ms (B→A), 2-core host, 2026-11-27
    fault_both_ways(
        "switch",
        2,
        &["switch"],
        &["switch"],
        Shows::Down,
        ms(600),
        false,
    );
}

#[test]
fn switch_dead_then_back_with_a_sending_and_a_receiving_thread_per_link() {
    // the same with lanes (`--send-threads on --recv-threads on`), the default on hosts of 8
    // CPUs or more: what a dead link had in flight may also wait in its lane, and must be
    // sent again elsewhere; what the healed link brings is received by its own thread
    fault_both_ways(
        "switch-lanes",
        7,
        &["switch"],
        &["switch"],
        Shows::Down,
        ms(600),
        true,
    );
}

#[test]
fn switch_trickles_then_recovers() {
    // soft failure: the switch forwards at 0.5 % of the link rate (5 Mbit/s) each way.
    // Probes get through the trickle, so the link can come back and fail again during the
    // fault: flap damping (docs/PROTOCOL.md §6.2) may then ask up to 32 answered probes,
    // one per probe interval, after the heal. Measured 72 and 76 ms (A→B), 67 and 81 ms
    // (B→A), 2-core host, 2026-11-27; once 572 ms (A→B) in a CI rehearsal, 2026-12-02.
    fault_both_ways(
        "soft",
        3,
        &["soft"],
        &["soft"],
        Shows::DownOrDegraded,
        ms(800),
        false,
    );
}

#[test]
fn loss_20_percent_data_direction() {
    // 20 % of the frames in the direction of the data are dropped; the acks get through
    fault_both_ways(
        "loss20",
        4,
        &["loss", "20", "a2b"],
        &["loss", "20", "b2a"],
        Shows::Losses,
        // measured 16 and 607 ms (A→B), 41 and 643 ms (B→A), 2-core host, 2026-11-27
        ms(2500),
        false,
    );
}

#[test]
fn loss_10_percent_both_directions() {
    fault_both_ways(
        "loss10",
        5,
        &["loss", "10", "both"],
        &["loss", "10", "both"],
        Shows::Losses,
        // measured 8 and 468 ms (A→B), 59 ms (B→A), 2-core host, 2026-11-27: under loss the
        // link may be degraded at the heal, and then takes its probes to come back
        ms(2500),
        false,
    );
}

/// The lab itself: a loss of 100 % drops every frame, and replaces an earlier loss fault of
/// the link. Before, nft refused the rule (a random number below 10000 compared with 10000),
/// the fault failed and had removed the earlier one.
#[test]
fn the_lab_drops_every_frame_at_a_loss_of_100_percent() {
    let Some(test) = LabTest::start("loss100", &[("ping", "iputils-ping")]) else {
        return;
    };
    let lab = Lab::up(test.env, "loss100", 1);
    // whether 3 pings from A reach B's address on link 1
    let reaches = || {
        (lab.command(Host::A, "ping"))
            .args(["-c", "3", "-i", "0.05", "-W", "1", "-q", "10.77.1.2"])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("running ping")
            .success()
    };
    assert!(reaches(), "B unreachable before any fault");
    lab.fault(1, &["loss", "50", "a2b"]);
    lab.fault(1, &["loss", "100"]);
    assert!(!reaches(), "a ping crossed a switch dropping every frame");
    lab.heal(1);
    assert!(reaches(), "B unreachable after the heal");
}

/// The lab itself: `ri2n-lab status` names each kind of fault in force on the link it hit
/// (lab/README.md), and none once every link is healed. Before, a lowered MTU went unsaid:
/// the link's line still read the lab's MTU.
#[test]
fn the_lab_status_names_every_fault_in_force() {
    let Some(test) = LabTest::start("labstatus", &[]) else {
        return;
    };
    let lab = Lab::up(test.env, "labstatus", 4);
    let healthy = lab.status();
    assert!(!healthy.contains("fault"), "before any fault: {healthy}");
    lab.fault(1, &["cable", "b"]);
    lab.fault(2, &["switch"]);
    lab.fault(3, &["soft", "10"]);
    lab.fault(3, &["mtu", "1280", "b"]);
    lab.fault(4, &["loss", "5"]);
    let status = lab.status();
    // each link's lines, from its heading to the next link's
    let link = |n: usize| {
        let from = status
            .find(&format!("link {n} "))
            .expect("a link's heading");
        let rest = &status[from + 1..];
        status[from..from + 1 + rest.find("\nlink ").unwrap_or(rest.len())].to_owned()
    };
    assert!(
        link(1).contains("port to-b: DOWN (fault cable)"),
        "{status}"
    );
    assert!(link(2).contains("br0 DOWN (fault switch)"), "{status}");
    assert!(link(3).contains("(fault soft)"), "{status}");
    assert!(
        (link(3).lines()).any(|l| l.starts_with("  b eth3") && l.ends_with("(fault mtu 1280)")),
        "{status}"
    );
    assert!(link(4).contains("(fault loss)"), "{status}");
    assert!(
        !link(4).contains("fault mtu") && !link(1).contains("fault mtu"),
        "{status}"
    );
    lab.heal_all();
    let healed = lab.status();
    assert!(!healed.contains("fault"), "after heal all: {healed}");
}

/// Both switches dead for 30 s, then one comes back: the transfer waits and completes. One
/// direction only (A→B), to keep the suite's time down: the outage alone takes 30 s.
#[test]
fn all_links_down_30s_then_one_back() {
    let Some(test) = LabTest::start("alldown", &[]) else {
        return;
    };
    let (env, dir) = (test.env, &test.dir);
    let outage = Duration::from_secs(30);
    let name = "alldown";
    let lab = Lab::up(env, name, 2);
    let data = DataFile::create(dir.0.join("input"), data_mib(), 6);
    // the healed link is taken back however long the outage was, not after address-resolution
    // retries: measured 114-141 ms over three runs, 2-core host, 2026-11-27 (the benchmark's
    // figures: BENCHMARKS.md §3)
    every_link_down_then_healed(env, &lab, &dir.0, &data, "alldown-a2b", outage, &[2], false);
}

/// A transfer A→B (`tcp`: over `--transport tcp`) through both switches dying at [`FAULT_AT`]
/// and the links in `heal` coming back `outage` later: nothing may be delivered meanwhile
/// (the outage happened) and delivery must resume within 600 ms of the heal; the transfer is
/// exact and both ends exit 0.
#[allow(clippy::too_many_arguments)]
fn every_link_down_then_healed(
    env: &support::Env,
    lab: &Lab,
    dir: &Path,
    data: &DataFile,
    name: &str,
    outage: Duration,
    heal: &[u8],
    tcp: bool,
) {
    let sw = || vec!["switch".to_owned()];
    let mut actions = vec![
        (FAULT_AT, Action::Fault(1, sw())),
        (FAULT_AT, Action::Fault(2, sw())),
    ];
    actions.extend(heal.iter().map(|&l| (FAULT_AT + outage, Action::Heal(l))));
    let out = Transfer {
        sender: Host::A,
        input: data,
        actions,
        discover: true,
        deadline: Instant::now() + FAULT_AT + outage + Duration::from_secs(90),
        name: name.to_owned(),
        key: None,
        tcp,
        args: &[],
    }
    .run(env, lab, dir);
    out.report(Some(heal[0]));
    let down_at = out.applied[1].0;
    // the first heal ends the outage (a second link heals a moment later)
    let healed_at = (out.applied.iter())
        .find_map(|(t, a)| matches!(a, Action::Heal(_)).then_some(*t))
        .expect("a heal");
    assert!(
        healed_at < out.send_secs,
        "the transfer ended before the heal: the outage did not hit it (data too small?)"
    );
    let during = out.goodput_mbit(down_at + 0.5, healed_at);
    assert!(
        during < 1.0,
        "{during:.1} Mbit/s delivered while every link was down: the outage did not happen"
    );
    let resumed = out.resume_after(healed_at);
    report(&format!(
        "    {name}: {} s with every link down, {during:.1} Mbit/s delivered meanwhile; delivery \
         resumed {:.0} ms after the heal",
        outage.as_secs(),
        resumed.unwrap_or(f64::NAN) * 1e3
    ));
    let resumed = resumed.expect("delivery resumed after the heal");
    assert!(
        resumed <= 0.6,
        "delivery resumed {:.0} ms after the heal (bound: 600 ms)",
        resumed * 1e3
    );
}

/// Seconds every network is partitioned in [`tcp_transport_through_a_dead_switch_and_a_partition`]
/// (`RI2N_LAB_TCP_OUTAGE_S`; the figure is for 60 s, the suite uses 10 to keep its
/// time down).
fn tcp_outage() -> Duration {
    Duration::from_secs(
        std::env::var("RI2N_LAB_TCP_OUTAGE_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
    )
}

/// The TCP transport (`--transport tcp`) through a dead switch, a switch that trickles, then
/// a partition of every network: the transfer goes on over the other link, takes the healed one
/// back (a new TCP connection), sets the slow one aside, waits out the partition and resumes;
/// bytes intact, both ends exit 0. The dead switch with a key: a sealed frame cut off half-way
/// ends its link, and the new TCP connection's frames open with fresh keys.
#[test]
fn tcp_transport_through_a_dead_switch_and_a_partition() {
    let Some(test) = LabTest::start("tcp", &[]) else {
        return;
    };
    let (env, dir) = (test.env, &test.dir);
    let outage = tcp_outage();
    let deadline = Instant::now() + TEST_TIMEOUT + outage;
    let name = "tcp";
    let lab = Lab::up(env, name, 2);
    let data = DataFile::create(dir.0.join("input"), data_mib(), 12);
    let key = keygen(env, &dir.0);
    let sw = || vec!["switch".to_owned()];
    let out = Transfer {
        sender: Host::A,
        input: &data,
        actions: vec![
            (FAULT_AT, Action::Fault(1, sw())),
            (HEAL_AT, Action::Heal(1)),
        ],
        discover: true,
        deadline,
        name: format!("{name}-switch"),
        key: Some(&key),
        tcp: true,
        args: &[],
    }
    .run(env, &lab, &dir.0);
    out.report(Some(1));
    assert_fault_seen(&out, 1, Shows::Down);
    let (fault, heal) = (out.applied[0].0, out.applied[1].0);
    let during = out.goodput_mbit(fault + 0.1, heal);
    let stall = out.longest_stall(fault - 0.05, heal);
    let rejoined = out.rejoin_after(heal, 1, 50.0);
    // when the sender declared link 1 (connection link 0) down, from its own event log
    let declared = (out.send_json["link_events"]
        .as_array()
        .into_iter()
        .flatten())
    .filter(|e| e["link"].as_u64() == Some(0) && e["to"].as_str() == Some("down"))
    .filter_map(|e| e["at_s"].as_f64())
    .find(|&t| t >= fault);
    report(&format!(
        "    tcp-switch: link 1 declared down {:.0} ms after the fault; the output stood still \
         at most {:.0} ms (sampled every 10 ms); {during:.0} Mbit/s delivered while the link \
         was dead; it carried data again {:.0} ms after the heal",
        declared.map_or(f64::NAN, |t| (t - fault) * 1e3),
        stall * 1e3,
        rejoined.unwrap_or(f64::NAN) * 1e3
    ));
    assert!(
        during > 500.0,
        "{during:.0} Mbit/s while link 1 was dead: link 2 did not carry the transfer"
    );
    let rejoined = rejoined.expect("link 1 carried data again after the heal");
    assert!(
        rejoined <= 0.6,
        "link 1 carried data again only {:.0} ms after the heal (bound: 600 ms)",
        rejoined * 1e3
    );

    // soft failure: switch 1 forwards 5 Mbit/s; the stream must not wait for it
    let out = Transfer {
        sender: Host::A,
        input: &data,
        actions: vec![
            (FAULT_AT, Action::Fault(1, vec!["soft".to_owned()])),
            (HEAL_AT, Action::Heal(1)),
        ],
        discover: true,
        deadline,
        name: format!("{name}-soft"),
        key: None,
        tcp: true,
        args: &[],
    }
    .run(env, &lab, &dir.0);
    out.report(Some(1));
    assert_fault_seen(&out, 1, Shows::DownOrDegraded);
    let (fault, heal) = (out.applied[0].0, out.applied[1].0);
    let during = out.goodput_mbit(fault + 0.5, heal);
    report(&format!(
        "    tcp-soft: {during:.0} Mbit/s delivered while link 1 trickled"
    ));
    assert!(
        during > 500.0,
        "{during:.0} Mbit/s while link 1 trickled: the stream waited for it"
    );

    every_link_down_then_healed(
        env,
        &lab,
        &dir.0,
        &data,
        "tcp-partition",
        outage,
        &[1, 2],
        true,
    );
}

/// The TCP transport through every path dark from B to A only, 2 s, while the sender (A, the
/// client) has nothing to send: it hears nothing, declares its links dead and closes their
/// TCP connections, whose ends reach B, and its new ones cannot open (their answers are
/// lost). B's closes of its side never arrive, nor does any answer to them: the receiver must
/// not take the sender for gone. After the heal the rest is sent; bytes intact, both ends
/// exit 0. Before, the receiver read each closed link as refused by a host whose process was
/// gone, and ended with `PeerGone` (exit 4) half a second into the outage.
#[test]
fn tcp_transport_through_every_path_dark_one_way_while_the_sender_is_idle() {
    let Some(test) = LabTest::start("tcp1way", &[]) else {
        return;
    };
    let (env, dir) = (test.env, &test.dir);
    let name = "tcp1way";
    let lab = Lab::up(env, name, 2);
    let (input, output) = (dir.0.join("input"), dir.0.join("output"));
    let sent: Vec<u8> = (0..2u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&input, &sent).unwrap();
    let (first, rest) = sent.split_at(sent.len() / 2);
    let mut recv = listening_receiver(env, &lab, &dir.0, &output, true, &format!("{name}-recv"));
    let args = support::send_args(&lab, Host::A, Path::new("-"), true);
    let args = support::with_transport(args, true);
    let mut send = Proc::spawn_piped(&lab, Host::A, &env.ri2n, &args, &dir.0, "tcp1way-send");
    let mut stdin = send.take_stdin();
    stdin.write_all(first).unwrap();
    stdin.flush().unwrap();
    // written as FILE.partial until the whole stream arrived
    let partial = dir.0.join("output.partial");
    let delivered = Instant::now() + ms(10_000);
    while std::fs::metadata(&partial).map_or(0, |m| m.len()) < first.len() as u64 {
        assert!(Instant::now() < delivered, "the first half never arrived");
        std::thread::sleep(ms(10));
    }
    let dark_at = Instant::now();
    for link in [1, 2] {
        lab.fault(link, &["loss", "100", "b2a"]);
    }
    std::thread::sleep(ms(2000));
    let outage = dark_at.elapsed();
    for (who, p) in [("receiver", &mut recv), ("sender", &mut send)] {
        assert!(
            p.poll().is_none(),
            "the {who} ended during the outage: {}",
            p.stderr_text()
        );
    }
    for link in [1, 2] {
        lab.heal(link);
    }
    stdin.write_all(rest).unwrap();
    drop(stdin);
    both_ended_intact(&mut send, &mut recv, &input, &output);
    // the premise: the sender declared both links dead, and so closed them, in the outage
    let events = send.stdout_json()["link_events"].clone();
    for link in [0, 1] {
        let down = (events.as_array().into_iter().flatten())
            .any(|e| e["link"].as_u64() == Some(link) && e["to"].as_str() == Some("down"));
        assert!(down, "link {link} never went down: {events}");
    }
    report(&format!(
        "    {name}: both ends stayed through {:.1} s dark from B to A",
        outage.as_secs_f64()
    ));
}

/// `ri2n recv` in B writing to `output` (over the TCP transport with `tcp`), once it listens on
/// both links.
fn listening_receiver(
    env: &support::Env,
    lab: &Lab,
    dir: &Path,
    output: &Path,
    tcp: bool,
    name: &str,
) -> Proc {
    let args = support::with_transport(support::recv_args(lab, Host::B, output), tcp);
    let mut recv = Proc::spawn(lab, Host::B, &env.ri2n, &args, dir, name);
    recv.wait_listening(2, ms(5000));
    recv
}

/// `ri2n send` of `input` from A to the receiver of [`listening_receiver`].
fn sender(env: &support::Env, lab: &Lab, dir: &Path, input: &Path, tcp: bool, name: &str) -> Proc {
    let args = support::with_transport(support::send_args(lab, Host::A, input, true), tcp);
    Proc::spawn(lab, Host::A, &env.ri2n, &args, dir, name)
}

/// Waits for both ends of a transfer to exit, and checks that they exited 0 and that the
/// receiver's output holds the sender's input.
fn both_ended_intact(send: &mut Proc, recv: &mut Proc, input: &Path, output: &Path) {
    let status = send.wait_exit(TEST_TIMEOUT).expect("the sender exited");
    assert!(status.success(), "send failed: {}", send.stderr_text());
    let status = recv.wait_exit(ms(10_000)).expect("the receiver exited");
    assert!(status.success(), "recv failed: {}", recv.stderr_text());
    assert_eq!(
        support::sha256_file(output),
        support::sha256_file(input),
        "bytes differ"
    );
}

/// The TCP transport over a long path beside a short one (every packet A sends on link 2
/// waits in a queue kept full): its second link must come up while that path is long. A
/// dialer that gave each attempt a few round trips of the links already open (the short
/// path's) never saw the answer to its SYN, and the link stayed down until the path was short
/// again.
#[test]
fn tcp_transport_opens_a_long_path_beside_a_short_one() {
    let Some(test) = LabTest::start("tcp-long", &[("iperf3", "iperf3")]) else {
        return;
    };
    let (env, dir) = (test.env, &test.dir);
    let name = "tcplong";
    let lab = Lab::up(env, name, 2);
    // link 1 short but 100 Mbit/s, so that the transfer lasts a few seconds; link 2 long:
    // A's egress a 5 Mbit/s queue kept full by a UDP flood of 15 Mbit/s to B on that link
    // (bounded: FLOOD_S seconds)
    lab.tbf(Host::A, "eth1", "100mbit", "20ms");
    lab.tbf(Host::A, "eth2", "5mbit", "300ms");
    const FLOOD_S: u64 = 15;
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut floods = vec![Proc::spawn(
        &lab,
        Host::B,
        Path::new("iperf3"),
        &args(&["-s", "-p", "5302"]),
        &dir.0,
        "iperf3-s",
    )];
    floods[0].wait_listening_on(5302, 1, ms(10_000));
    let to = lab.addr(Host::B, 2).to_string();
    let t = FLOOD_S.to_string();
    floods.push(Proc::spawn(
        &lab,
        Host::A,
        Path::new("iperf3"),
        &args(&[
            "-c",
            &to,
            "-p",
            "5302",
            "-u",
            "-b",
            "15M",
            "-t",
            &t,
            "--forceflush",
        ]),
        &dir.0,
        "iperf3-c",
    ));
    let flood_started = Instant::now();
    // its first interval row ("[  5]   0.00-1.00   sec ..."): a second of flooding, three
    // times what the queue lets out, has filled it
    let flooding = floods[1].wait_for_line(ms(10_000), |l| l.contains(" 0.00-1.00 "));
    assert!(flooding, "no flood: {}", floods[1].stdout_text());
    // the premise: a round trip takes far longer than 50 ms on link 2, and little on link 1
    let ping_ms = |l: u8| -> f64 {
        let out = lab
            .command(Host::A, "ping")
            .args(["-c", "5", "-i", "0.2", "-q"])
            .arg(lab.addr(Host::B, l).to_string())
            .output()
            .expect("running ping");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find(|l| l.contains("min/avg/max"))
            .and_then(|l| l.split('=').nth(1))
            .and_then(|v| v.trim().split('/').nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no round trip in ping's output: {text}"))
    };
    let (short, long) = (ping_ms(1), ping_ms(2));
    report(&format!(
        "    tcp-long: round trips {short:.2} ms on link 1, {long:.0} ms on link 2 under the flood"
    ));
    assert!(long > 80.0, "link 2's path is not long: {long:.1} ms");
    assert!(short < 5.0, "link 1's path is not short: {short:.1} ms");

    // 32 MiB: about 3 s on link 1 alone
    let data = dir.0.join("input");
    let bytes: Vec<u8> = (0..32u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(&data, bytes).expect("writing the input");
    let output = dir.0.join("output");
    let mut recv = listening_receiver(env, &lab, &dir.0, &output, true, "recv");
    let sent_at = Instant::now();
    let mut send = sender(env, &lab, &dir.0, &data, true, "send");
    both_ended_intact(&mut send, &mut recv, &data, &output);
    // when link 2 (connection link 1) came up, from the sender's events, against when the
    // flood ended: its path was long until then
    let flood_left =
        (flood_started + Duration::from_secs(FLOOD_S)).saturating_duration_since(sent_at);
    let up = send.stdout_json()["link_events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["link"].as_u64() == Some(1) && e["to"].as_str() == Some("up"))
        .filter_map(|e| e["at_s"].as_f64())
        .next();
    report(&format!(
        "    tcp-long: link 2 {}; the flood ended {:.1} s into the transfer",
        up.map_or("never came up".to_owned(), |t| format!(
            "came up {t:.3} s into the transfer"
        )),
        flood_left.as_secs_f64()
    ));
    let up = up.expect("link 2 never came up");
    assert!(
        up < flood_left.as_secs_f64(),
        "link 2 came up only after its path was short again ({up:.3} s)"
    );
    drop(floods);
}

/// A connection whose first link is opened while its switch is dead (the peer's address
/// resolved before), over each transport: it must come up as soon as the switch heals. The
/// TCP transport's single attempt left its lost SYN to the kernel, which sends it again only
/// a second later.
#[test]
fn a_connection_comes_up_as_soon_as_the_path_works() {
    let Some(test) = LabTest::start("connect", &[]) else {
        return;
    };
    let (env, dir) = (test.env, &test.dir);
    let name = "connect";
    let lab = Lab::up(env, name, 2);
    let data = dir.0.join("input");
    let bytes: Vec<u8> = (0..64u32 << 10).map(|i| (i % 251) as u8).collect();
    std::fs::write(&data, bytes).expect("writing the input");
    for tcp in [false, true] {
        let transport = if tcp { "tcp" } else { "udp" };
        let output = dir.0.join(format!("output-{transport}"));
        let mut recv = listening_receiver(
            env,
            &lab,
            &dir.0,
            &output,
            tcp,
            &format!("recv-{transport}"),
        );
        // B's address on link 1 resolved beforehand: the first packets wait for no ARP
        // (whose own retry comes a second later, whatever the transport does)
        let pinged = lab
            .command(Host::A, "ping")
            .args(["-c", "1", "-W", "1", "-q"])
            .arg(lab.addr(Host::B, 1).to_string())
            .status()
            .expect("running ping")
            .success();
        assert!(pinged, "B does not answer on link 1");
        // the sender's first packets go to link 1, whose switch is dead
        lab.fault(1, &["switch"]);
        let sent_before = lab.tx_bytes(Host::A, 1);
        let mut send = sender(env, &lab, &dir.0, &data, tcp, &format!("send-{transport}"));
        // the premise: they went into the dead switch, and the sender still waits for link 1
        // when it heals, 150 ms later (before its first retry)
        let deadline = Instant::now() + ms(10_000);
        while lab.tx_bytes(Host::A, 1) == sent_before {
            assert!(
                Instant::now() < deadline,
                "the {transport} sender sent nothing on link 1"
            );
            std::thread::sleep(ms(10));
        }
        std::thread::sleep(ms(150));
        assert!(
            send.poll().is_none(),
            "the {transport} sender ended while the switch was dead: {}",
            send.stderr_text()
        );
        lab.heal(1);
        let healed = Instant::now();
        send.wait_exit(TEST_TIMEOUT);
        let took = healed.elapsed();
        both_ended_intact(&mut send, &mut recv, &data, &output);
        report(&format!(
            "    connect-{transport}: the sender was done {:.0} ms after the heal",
            took.as_secs_f64() * 1000.0
        ));
        // (the UDP transport's sender lingers 100 ms after the end, PROTOCOL.md §8.1; a
        // connect left to the kernel's retry would end 850 ms after the heal)
        assert!(
            took < ms(400),
            "the {transport} sender was done only {took:?} after the heal: its connect waited"
        );
    }
}

/// The receiver is killed (SIGKILL) mid-transfer and restarted on the same addresses, at once
/// and after a 2 s gap (long enough for the sender to see every link fall silent): the sender
/// must notice (the new receiver answers its packets with RESET) and exit 4 with a one-line
/// message within 10 s, and the restarted receiver must take a new transfer.
#[test]
fn receiver_restart_is_reported_to_the_sender() {
    let Some(test) = LabTest::start("restart", &[]) else {
        return;
    };
    let (env, dir) = (test.env, &test.dir);
    let deadline = Instant::now() + TEST_TIMEOUT;
    let name = "restart";
    let lab = Lab::up(env, name, 2);
    let data = DataFile::create(dir.0.join("input"), data_mib(), 7);
    for gap in [Duration::ZERO, Duration::from_secs(2)] {
        let recv2 = restart_during_transfer(env, &lab, &dir.0, &data, gap, deadline);
        if gap.is_zero() {
            continue;
        }
        // the restarted receiver takes a new connection
        let mut recv2 = recv2;
        let small = DataFile::create(dir.0.join("small"), 64, 8);
        let mut send2 = Proc::spawn(
            &lab,
            Host::A,
            &env.ri2n,
            &support::send_args(&lab, Host::A, &small.path, true),
            &dir.0,
            "send2",
        );
        let t = Instant::now();
        while send2.poll().is_none() || recv2.poll().is_none() {
            assert!(
                Instant::now() < deadline,
                "the transfer to the restarted receiver timed out: {} / {}",
                send2.stderr_text(),
                recv2.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            send2.poll().unwrap().success() && recv2.poll().unwrap().success(),
            "transfer to the restarted receiver failed: {} / {}",
            send2.stderr_text(),
            recv2.stderr_text()
        );
        let (sha, len) = support::sha256_file(&dir.0.join("restarted.out"));
        assert!(
            sha == small.sha256 && len == small.len,
            "data differs after the restart"
        );
        report(&format!(
            "    then 64 MiB to the restarted receiver: {:.2} s, intact",
            t.elapsed().as_secs_f64()
        ));
    }
}

/// The sender is killed (SIGKILL) mid-transfer: its host answers the receiver's packets with
/// "port unreachable" on every link, so the receiver must exit 4 within 2 s, saying the peer
/// is gone and how many bytes its partial output holds.
#[test]
fn killed_sender_is_reported_by_the_receiver() {
    let Some(test) = LabTest::start("killed-sender", &[]) else {
        return;
    };
    let (env, dir) = (test.env, &test.dir);
    let name = "killsend";
    let lab = Lab::up(env, name, 2);
    let data = DataFile::create(dir.0.join("input"), data_mib(), 9);
    let output = dir.0.join("output");
    let mut recv = Proc::spawn(
        &lab,
        Host::B,
        &env.ri2n,
        &support::recv_args(&lab, Host::B, &output),
        &dir.0,
        "killsend-recv",
    );
    recv.wait_listening(2, Duration::from_secs(10));
    let start = Instant::now();
    let (mut send, _feeder) =
        support::spawn_fed_sender(env, &lab, Host::A, &data, &dir.0, "killsend-send");
    while start.elapsed() < FAULT_AT {
        assert!(
            send.poll().is_none() && recv.poll().is_none(),
            "the transfer ended before the kill: {} / {}",
            send.stderr_text(),
            recv.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    send.kill();
    let killed = Instant::now();
    let status = loop {
        if let Some(s) = recv.poll() {
            break s;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "the receiver did not notice the killed sender within 30 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    let took = killed.elapsed();
    let message = recv.stderr_text();
    let mut partial = output.clone().into_os_string();
    partial.push(".partial");
    let kept = std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0);
    report(&format!(
        "killed-sender: the receiver exited ({status}) {:.0} ms after the sender was killed, \
         {kept} bytes kept; it said: {}",
        took.as_secs_f64() * 1e3,
        message.trim()
    ));
    assert_eq!(status.code(), Some(4), "exit 4 expected: {message}");
    // Usually under 200 ms: one "nothing listens" answer, and the other link refused too or
    // down after its silence. Those answers are ICMP errors, which the peer's kernel limits
    // to about one a second per destination: if none passes at first, the next comes within
    // a second. (When three answers per link were needed, 1 run in 6 took 1 to 3 s.)
    assert!(took < Duration::from_secs(2), "took {took:?}: {message}");
    assert!(kept > 0, "the premise: data had arrived before the kill");
    assert!(
        message.contains("peer is gone") && message.contains(&format!("{kept} bytes received")),
        "the message should name the cause and the bytes kept: {message}"
    );
    assert!(!output.exists(), "no complete-looking output file");
}

/// IPv6 links with a 1500-byte MTU carry 1452-byte datagrams, not the 1472 of IPv4: an A→B
/// transfer over two IPv6 links, with link 1's switch dead from [`FAULT_AT`] to [`HEAL_AT`],
/// arrives intact. (Before datagram sizes followed the interface, no data ever arrived.) The
/// TCP transport does the same over the same links.
#[test]
fn ipv6_links_carry_a_transfer_through_a_dead_switch() {
    let Some(test) = LabTest::start("ipv6", &[]) else {
        return;
    };
    let (env, dir) = (test.env, &test.dir);
    let name = "ipv6";
    let lab = Lab::up_ipv6(env, name, 2);
    let data = DataFile::create(dir.0.join("input"), data_mib(), 12);
    for (tcp, label) in [(false, "ipv6-a2b"), (true, "ipv6-tcp-a2b")] {
        let out = Transfer {
            sender: Host::A,
            input: &data,
            actions: vec![
                (FAULT_AT, Action::Fault(1, vec!["switch".into()])),
                (HEAL_AT, Action::Heal(1)),
            ],
            discover: true,
            deadline: Instant::now() + TEST_TIMEOUT,
            name: label.into(),
            key: None,
            tcp,
            args: &[],
        }
        .run(env, &lab, &dir.0);
        out.report(Some(1));
        assert_fault_seen(&out, 1, Shows::Down);
    }
}

/// Starts an A→B transfer, kills the receiver at [`FAULT_AT`], starts a new one after `gap`,
/// and checks how the sender ends. Returns the new receiver (waiting for a connection).
fn restart_during_transfer(
    env: &support::Env,
    lab: &Lab,
    dir: &std::path::Path,
    data: &DataFile,
    gap: Duration,
    deadline: Instant,
) -> Proc {
    let label = format!("restart-gap{}s", gap.as_secs());
    let first = dir.join("first.out");
    let mut recv1 = Proc::spawn(
        lab,
        Host::B,
        &env.ri2n,
        &support::recv_args(lab, Host::B, &first),
        dir,
        &format!("{label}-recv1"),
    );
    recv1.wait_listening(2, Duration::from_secs(10));
    let start = Instant::now();
    let (mut send, _feeder) =
        support::spawn_fed_sender(env, lab, Host::A, data, dir, &format!("{label}-send"));
    let sender_alive = |send: &mut Proc, what: &str| {
        assert!(
            send.poll().is_none(),
            "the sender ended {what}: {}",
            send.stderr_text()
        );
    };
    while start.elapsed() < FAULT_AT {
        sender_alive(&mut send, "before the receiver was killed");
        std::thread::sleep(Duration::from_millis(5));
    }
    // the output is written under a temporary name until it is complete
    let mut partial = first.clone().into_os_string();
    partial.push(".partial");
    let received = std::fs::metadata(&partial).map(|m| m.len()).unwrap_or(0);
    recv1.kill();
    let killed = start.elapsed();
    while start.elapsed() < killed + gap {
        // the receiver's host answers "port unreachable" while nobody listens: the sender may
        // end at once with "the peer is gone" (checked with the exit below)
        if send.poll().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let respawned = start.elapsed();
    let mut recv2 = Proc::spawn(
        lab,
        Host::B,
        &env.ri2n,
        &support::recv_args(lab, Host::B, &dir.join("restarted.out")),
        dir,
        &format!("{label}-recv2"),
    );
    recv2.wait_listening(2, Duration::from_secs(10));
    let listening = start.elapsed();
    let status = loop {
        if let Some(s) = send.poll() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the sender did not notice the restart within {:.0} s",
            (start.elapsed() - respawned).as_secs_f64()
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    let exited = start.elapsed();
    let stderr = send.stderr_text();
    let message = stderr.trim();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    report(&format!(
        "{label}: receiver killed at {:.3} s (after {} MiB); new receiver started at {:.3} s, \
         listening by {:.3} s; the sender exited ({status}) at {:.3} s: {:.0} ms after the new \
         receiver started, {:.0} ms after the kill; it said: {message}",
        killed.as_secs_f64(),
        received >> 20,
        respawned.as_secs_f64(),
        listening.as_secs_f64(),
        exited.as_secs_f64(),
        ms(exited.saturating_sub(respawned)),
        ms(exited - killed),
    ));
    assert_eq!(
        status.code(),
        Some(4),
        "the sender should exit 4 (connection lost): {message}"
    );
    // link state changes come first, one line each; then the one error line
    let errors: Vec<&str> = message
        .lines()
        .filter(|l| l.starts_with("ri2n: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "one error line expected: {message}");
    // the premise: the receiver was killed mid-transfer
    assert!(
        received > 0,
        "nothing had arrived when the receiver was killed"
    );
    // while the port is closed the host answers "port unreachable" (the peer is gone); once
    // the new receiver listens it answers with a reset (the peer restarted): either is true,
    // but a new receiver listening within 200 ms of the kill answers long before the sender
    // would call the peer gone (it waits for the peer's silence after the refusals), so then
    // only the restart is
    let restarted = errors[0].contains("restarted");
    assert!(
        restarted || errors[0].contains("peer is gone"),
        "the message should say the peer restarted or is gone: {message}"
    );
    assert!(
        restarted || listening - killed >= Duration::from_millis(200),
        "a receiver listening {:.0} ms after the kill was not taken for a restart: {message}",
        ms(listening - killed)
    );
    assert!(
        exited.saturating_sub(respawned) < Duration::from_secs(10),
        "the restart took {:?} to notice",
        exited.saturating_sub(respawned)
    );
    recv2
}

/// 20 000 garbage datagrams (random bytes; well-formed-looking SHORT, INITIAL, RETRY, ACCEPT and
/// RESET packets of the current version with random IDs; bit-flipped copies and exact replays of
/// those) sent from host A to every receiver port during an A→B transfer: the transfer completes
/// intact and the receiver's memory stays bounded.
#[test]
fn garbage_flood_at_the_receiver() {
    let Some(test) = LabTest::start("flood", &[]) else {
        return;
    };
    let (env, dir) = (test.env, &test.dir);
    let deadline = Instant::now() + TEST_TIMEOUT;
    let name = "flood";
    let lab = Lab::up(env, name, 2);
    let data = DataFile::create(dir.0.join("input"), data_mib(), 9);
    let flooder = flood(FloodPlan {
        ns: lab.ns(Host::A),
        from: vec![Host::A.addr(1), Host::A.addr(2)],
        targets: vec![
            std::net::SocketAddr::new(Host::B.addr(1), PORT),
            std::net::SocketAddr::new(Host::B.addr(2), PORT),
        ],
        max: 20_000,
        max_time: Duration::from_secs(10),
        delay: Duration::from_millis(700),
        seed: 10,
    });
    let out = Transfer {
        sender: Host::A,
        input: &data,
        actions: vec![],
        discover: true,
        deadline,
        name: format!("{name}-a2b"),
        key: None,
        tcp: false,
        args: &[],
    }
    .run(env, &lab, &dir.0);
    let stats = flooder.join().expect("the flood thread panicked");
    out.report(None);
    let peak = out.peak_recv_hwm_mib();
    report(&format!(
        "    flood: {} datagrams ({} send errors) in {:.2} s; receiver peak RSS {peak:.1} MiB",
        stats.sent, stats.send_errors, stats.secs
    ));
    assert!(
        stats.sent >= 20_000,
        "the flood sent only {} datagrams",
        stats.sent
    );
    // the premise: the flood reached the receiver while it ran (the kernel's filter drops
    // random bytes unseen; what looks like a packet of ours reaches the endpoint, which
    // counts it as it drops it, and reports the counts as it exits)
    let dropped: u64 = (out.recv_json["dropped"].as_object())
        .map_or(0, |d| d.values().filter_map(|n| n.as_u64()).sum());
    report(&format!(
        "    flood: the receiver dropped {dropped} datagrams"
    ));
    assert!(
        dropped >= 1000,
        "the receiver dropped {dropped} datagrams: {}",
        out.recv_json["dropped"]
    );
    assert!(peak < 200.0, "receiver RSS peaked at {peak:.1} MiB");
}

/// The text written every KiB of the input of the privacy tests.
const MARKER: &[u8] = b"RI2N-PLAINTEXT-MARKER-7f3a9c";

/// A transfer A→B of `data` while a tap inside host A captures both links (and, at `inject`
/// datagrams a second, re-sends what A sent, half replayed and half with one bit flipped);
/// returns what the tap saw.
#[allow(clippy::too_many_arguments)]
fn tapped_transfer(
    env: &support::Env,
    lab: &Lab,
    dir: &Path,
    data: &DataFile,
    key: Option<&Path>,
    inject: u64,
    label: &str,
    tcp: bool,
) -> support::TapStats {
    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_failure = support::StopOnDrop(stop.clone());
    let tap = tap(TapPlan {
        ns: lab.ns(Host::A),
        links: lab.links,
        port: PORT,
        marker: MARKER.to_vec(),
        inject_per_sec: inject,
        max_time: TEST_TIMEOUT,
        stop: stop.clone(),
        seed: 11,
    });
    let out = Transfer {
        sender: Host::A,
        input: data,
        actions: vec![],
        discover: true,
        deadline: Instant::now() + TEST_TIMEOUT,
        name: label.to_owned(),
        key,
        tcp,
        args: &[],
    }
    .run(env, lab, dir);
    stop.store(true, Ordering::Relaxed);
    let stats = tap.join().expect("the tap thread panicked");
    report(&format!(
        "    {label}: {:.0} Mbit/s; tap: {} frames, {} MiB, {} with the marker; injected {} \
         ({} mutated, {} refused) in {:.2} s",
        out.send_json["bytes"].as_u64().unwrap_or(0) as f64 * 8.0 / out.recv_secs / 1e6,
        stats.frames,
        stats.bytes >> 20,
        stats.marker_frames,
        stats.injected,
        stats.mutated,
        stats.inject_errors,
        stats.secs
    ));
    stats
}

/// A keyed transfer while a tap inside host A captures both links and re-sends what A
/// sent, half replayed and half with one bit flipped, from A's own addresses and ports, at
/// 50 000 datagrams a second: the received file is exact and the capture holds none of the
/// marker written every KiB of the input. First, a short transfer without a key shows that the
/// tap does see the marker when it is on the wire.
#[test]
fn keyed_transfer_is_private_and_ignores_an_on_path_injector() {
    let Some(test) = LabTest::start("keyed", &[]) else {
        return;
    };
    let (env, dir) = (test.env, &test.dir);
    let name = "keyed";
    let lab = Lab::up(env, name, 2);
    let key = keygen(env, &dir.0);
    let small = DataFile::create_marked(dir.0.join("clear"), 8, 21, MARKER);
    let clear = tapped_transfer(env, &lab, &dir.0, &small, None, 0, "keyed-clear", false);
    assert!(
        clear.marker_frames > 0,
        "the tap saw no marker in clear: it sees nothing"
    );
    let data = DataFile::create_marked(dir.0.join("input"), 512, 22, MARKER);
    let keyed = tapped_transfer(
        env,
        &lab,
        &dir.0,
        &data,
        Some(&key),
        50_000,
        "keyed-keyed",
        false,
    );
    assert_eq!(keyed.marker_frames, 0, "plaintext on the wire");
    // the tap really watched the keyed transfer (so that no marker means none was sent); a
    // packet socket drops frames when both CPUs are busy (506 of 512 MiB seen once in CI,
    // under 90 % once on a busy host), and with a marker in every KiB of the data a quarter
    // of it seen is still tens of thousands of chances to see one
    assert!(
        keyed.bytes > (512 << 20) / 4,
        "captured only {} bytes",
        keyed.bytes
    );
    assert!(
        keyed.injected >= 20_000,
        "the injector sent only {} datagrams",
        keyed.injected
    );
}

/// The same privacy check on the TCP transport: the tap sees the marker in a transfer without
/// a key, and none in a keyed one, which arrives exact.
#[test]
fn tcp_keyed_transfer_is_private() {
    let Some(test) = LabTest::start("tcp-keyed", &[]) else {
        return;
    };
    let (env, dir) = (test.env, &test.dir);
    let name = "tcpkeyed";
    let lab = Lab::up(env, name, 2);
    let key = keygen(env, &dir.0);
    let small = DataFile::create_marked(dir.0.join("clear"), 8, 23, MARKER);
    let clear = tapped_transfer(env, &lab, &dir.0, &small, None, 0, "tcp-clear", true);
    assert!(
        clear.marker_frames > 0,
        "the tap saw no marker in clear: it sees nothing"
    );
    let data = DataFile::create_marked(dir.0.join("input"), 512, 24, MARKER);
    let keyed = tapped_transfer(env, &lab, &dir.0, &data, Some(&key), 0, "tcp-keyed", true);
    assert_eq!(keyed.marker_frames, 0, "plaintext on the wire");
    assert!(
        keyed.bytes > (512 << 20) / 4,
        "captured only {} bytes",
        keyed.bytes
    );
}

/// `ri2n serve` over the TCP transport, interrupted while it sends into links slower than it
/// writes (100 Mbit/s): its CLOSE waits in each TCP connection behind what the link held, and
/// the client must still learn why the test ended. The server exited once the CLOSE was
/// written, before it reached the client, and its host reset the connections (the client's
/// acknowledgements kept arriving): the client reported the server gone instead, in most runs.
#[test]
fn tcp_transport_server_interrupted_while_sending_tells_its_client() {
    let Some(test) = LabTest::start("tcp-interrupted", &[]) else {
        return;
    };
    let (env, dir) = (test.env, &test.dir);
    let name = "tcpint";
    let lab = Lab::up(env, name, 2);
    for dev in ["eth1", "eth2"] {
        lab.tbf(Host::B, dev, "100mbit", "20ms");
    }
    let to = format!("{}:{PORT}", lab.addr(Host::B, 1));
    for run in 0..3 {
        let listen = [1, 2].map(|l| format!("{}:{PORT}", lab.addr(Host::B, l)));
        let args = ["serve", "--transport", "tcp", "--listen", &listen[0]]
            .into_iter()
            .chain(["--listen", &listen[1], "-q"])
            .map(String::from)
            .collect::<Vec<_>>();
        let mut server = Proc::spawn(&lab, Host::B, &env.ri2n, &args, &dir.0, "serve");
        server.wait_listening(2, ms(5000));
        let local = [1, 2].map(|l| lab.addr(Host::A, l).to_string());
        let args = ["bench", "--transport", "tcp", "--to", &to, "-R"]
            .into_iter()
            .chain(["--local", &local[0], "--local", &local[1]])
            .chain(["--time", "30", "--interval", "0.5", "--json"])
            .map(String::from)
            .collect::<Vec<_>>();
        let mut client = Proc::spawn(&lab, Host::A, &env.ri2n, &args, &dir.0, "bench");
        // the premise: the server is sending, faster than one link carries (an interval row
        // of the timeline: "0.00-0.50   190.12 Mbit/s ...")
        let moving = client.wait_for_line(ms(15_000), |l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.len() > 2
                && words[0].contains('-')
                && words[0].starts_with(char::is_numeric)
                && words[2] == "Mbit/s"
                && words[1].parse::<f64>().is_ok_and(|m| m > 120.0)
        });
        assert!(
            moving,
            "run {run}: the server sent too little: {}",
            client.stderr_text()
        );
        let status = server.terminate(ms(5000));
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(143),
            "run {run}: serve after SIGTERM: {}",
            server.stderr_text()
        );
        let status = client.wait_exit(ms(10_000));
        let (doc, text) = (client.stdout_json(), client.stderr_text());
        assert_eq!(status.and_then(|s| s.code()), Some(4), "run {run}: {text}");
        let error = doc["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("the peer aborted the connection (code 15)")
                && error.contains("the server was interrupted by SIGTERM"),
            "run {run}: {error}: {text}"
        );
    }
}
