//! Attacks that need the kernel's part in them, in the namespace lab: forged ICMP errors,
//! which only the kernel turns into an error on the socket that sent the quoted datagram
//! (docs/PROTOCOL.md §6.7, §11). The attacker holds no key.
//!
//! Needs root, iproute2 and nftables; without them the tests print why and pass, unless `CI`
//! is set, where they fail. The tests run one at a time (see `support::serial`).
//! `RI2N_LAB_BIN=PATH` runs them against another build of `ri2n` (an earlier commit's, to see
//! an attack succeed there).

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{
    icmp_forger, keygen, report, DataFile, Host, IcmpPlan, Lab, LabTest, Transfer, PORT,
};

/// The test gives up (killing its processes and removing its lab) after this long.
const TEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Forged errors per second at each host.
const FORGED_PER_SEC: u64 = 2000;

/// Sum of a per-link counter in a `--json` summary.
fn links_total(json: &serde_json::Value, field: &str) -> u64 {
    json["links"]
        .as_array()
        .map(|links| links.iter().filter_map(|l| l[field].as_u64()).sum())
        .unwrap_or(0)
}

/// Finding 1 of issue 40: a keyed transfer over two 1 Gbit/s links while forgers in
/// both hosts answer their datagrams with ICMP "port unreachable" claiming to come from the
/// other host, 2 000 a second each: half quote datagrams the host really sent (an attacker
/// reading the links), half only the right addresses and ports (a blind one). Before
/// protocol version 4 one such error per link ended a transfer within milliseconds (both
/// tools exited 4, "the peer is gone"). Now both tools exit 0 with the file intact; their
/// summaries show that the errors reached them (the quoting ones checked with the peer, the
/// blind ones dropped) while the data moved.
#[test]
fn forged_icmp_errors_do_not_end_a_keyed_transfer() {
    let Some(test) = LabTest::start("icmp", &[]) else {
        return;
    };
    let (env, dir) = (test.env, &test.dir);
    let name = "icmp";
    let lab = Lab::up(env, name, 2);
    let key = keygen(env, &dir.0);
    let data = DataFile::create(dir.0.join("input"), 512, 31);
    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_failure = support::StopOnDrop(stop.clone());
    let forgers: Vec<_> = [Host::A, Host::B]
        .into_iter()
        .enumerate()
        .map(|(i, host)| {
            icmp_forger(IcmpPlan {
                ns: lab.ns(host),
                links: lab.links,
                port: PORT,
                per_sec: FORGED_PER_SEC,
                max_time: TEST_TIMEOUT,
                stop: stop.clone(),
                seed: 40 + i as u64,
            })
        })
        .collect();
    let out = Transfer {
        sender: Host::A,
        input: &data,
        actions: vec![],
        discover: true,
        deadline: Instant::now() + TEST_TIMEOUT,
        name: name.to_owned(),
        key: Some(Path::new(&key)),
        tcp: false,
        args: &[],
    }
    .run(env, &lab, &dir.0);
    let ended = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let stats: Vec<_> = forgers
        .into_iter()
        .map(|f| f.join().expect("a forger panicked"))
        .collect();
    out.report(None);
    for (host, s) in ["A", "B"].iter().zip(&stats) {
        let during = s
            .first
            .map_or(0.0, |t| ended.saturating_duration_since(t).as_secs_f64());
        report(&format!(
            "    forged at {host}: {} quoting, {} blind ({} refused by the system), the first \
             {during:.2} s before the transfer ended",
            s.quoting, s.blind, s.errors
        ));
        assert!(
            during > 1.0 && s.quoting > FORGED_PER_SEC / 2 && s.blind > FORGED_PER_SEC / 2,
            "host {host}: the forger sent too little, or too late, to test anything: {s:?}"
        );
    }
    // the kernel delivered them: each side's connection checked quoting ones with its peer,
    // and its endpoint dropped blind ones
    for (who, json) in [("send", &out.send_json), ("recv", &out.recv_json)] {
        let refusals = links_total(json, "refusals");
        let blind = json["dropped"]["unmatched_refusal"].as_u64().unwrap_or(0);
        report(&format!(
            "    {who}: {refusals} forged errors checked with the peer, {blind} ignored"
        ));
        assert!(
            refusals > 0,
            "{who}: no forged error reached the connection"
        );
        assert!(
            blind > 0,
            "{who}: no blind forged error reached the endpoint"
        );
    }
}
