//! `ri2n tunnel` end to end: three hosts on two networks (`lab/ri2n-lab up 2 --hosts 3`, each
//! network one switch joining every host, 1 Gbit/s per port), a daemon on each host with the
//! same cluster file, and TCP (iperf3) and an MPI job (Open MPI) between the hosts through the
//! tunnel.
//!
//! Asserts what users rely on: every host reaches every other through the tunnel; an inner TCP
//! transfer through a dead switch, and through an outage of every link, completes without a
//! reset (iperf3 exits 0) and moves data again right after the heal; `ri2n tunnel status` and
//! the metrics show both peers connected over both links; SIGTERM ends a daemon with status 0
//! and removes its interface; an MPI job that checks every result completes with correct
//! results through a dead switch and a 20 s partition. Rates are reported, not asserted
//! (docs/BENCHMARKS.md has the measurements).
//!
//! Needs root, iproute2, nftables, iperf3 and Open MPI (openmpi-bin, libopenmpi-dev); without
//! them a test prints why and passes, unless `CI` is set, where it fails.

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use support::{env, report, require_tool, serial, Env, Lab, Proc, TestDir, TestTimer};

const HOSTS: [&str; 3] = ["a", "b", "c"];
/// Where host a's daemon serves its metrics (inside host a).
const METRICS: &str = "127.0.0.1:9474";

fn tunnel_address(host: &str) -> String {
    let n = HOSTS.iter().position(|&h| h == host).expect("a lab host") + 1;
    format!("10.99.0.{n}")
}

/// A key and a cluster file for the lab's three hosts; returns the file.
fn cluster_file(env: &Env, dir: &Path) -> PathBuf {
    support::keygen(env, dir);
    let mut text = String::from("key = \"cluster.key\"\n");
    for (i, h) in HOSTS.iter().enumerate() {
        let n = i + 1;
        text.push_str(&format!(
            "\n[[host]]\nname = \"{h}\"\naddress = \"{}\"\nlinks = [\"10.77.1.{n}\", \"10.77.2.{n}\"]\n",
            tunnel_address(h)
        ));
    }
    let path = dir.join("cluster.toml");
    fs::write(&path, text).expect("writing the cluster file");
    path
}

/// Starts a daemon on every host and waits until each has both peers connected.
fn start_daemons(env: &Env, lab: &Lab, dir: &Path, config: &Path) -> Vec<Proc> {
    let mut daemons: Vec<Proc> = HOSTS
        .iter()
        .map(|h| {
            let mut args = vec![
                "tunnel".to_owned(),
                "--config".to_owned(),
                config.display().to_string(),
            ];
            if *h == "a" {
                args.extend(["--metrics".to_owned(), METRICS.to_owned()]);
            }
            Proc::spawn_in(&lab.ns_of(h), &env.ri2n, &args, dir, &format!("tunnel-{h}"))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    for d in &mut daemons {
        loop {
            if let Some(s) = d.poll() {
                panic!("{} exited ({s}): {}", d.name, d.stderr_text());
            }
            if d.stderr_text().matches(" connected (").count() >= 2 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not connect to both peers: {}",
                d.name,
                d.stderr_text()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
    daemons
}

/// `ri2n tunnel status --json` in namespace `ns`, once the daemon's first sample shows both
/// peers connected over both links (it samples every second).
fn wait_for_status(env: &Env, ns: &str, config: &Path) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(&env.ri2n)
            .args(["tunnel", "status", "--json", "--config"])
            .arg(config)
            .output()
            .expect("running ri2n tunnel status");
        let status: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        let ready = status["peers"].as_array().is_some_and(|p| {
            p.len() == 2
                && p.iter().all(|p| {
                    p["links"]
                        .as_array()
                        .is_some_and(|l| l.len() == 2 && l.iter().all(|l| l["state"] == "up"))
                })
        });
        if ready {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "ri2n tunnel status: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        thread::sleep(Duration::from_millis(200));
    }
}

/// An iperf3 client in host `client` to the server in host `server` through the tunnel,
/// with `args` (e.g. `-t 4`); `faults` run meanwhile, each at its time from the start.
/// Returns iperf3's JSON report after checking it exited 0.
fn iperf(
    lab: &Lab,
    dir: &Path,
    client: &str,
    server: &str,
    args: &[&str],
    faults: &[(Duration, &dyn Fn())],
) -> serde_json::Value {
    let name = format!("iperf-{client}{server}");
    let mut srv = Proc::spawn_in(
        &lab.ns_of(server),
        Path::new("iperf3"),
        &["-s".into(), "-1".into()],
        dir,
        &format!("{name}-server"),
    );
    thread::sleep(Duration::from_millis(300));
    let mut cli_args = vec!["-c".to_owned(), tunnel_address(server), "-J".to_owned()];
    cli_args.extend(args.iter().map(|a| a.to_string()));
    let start = Instant::now();
    let mut cli = Proc::spawn_in(
        &lab.ns_of(client),
        Path::new("iperf3"),
        &cli_args,
        dir,
        &name,
    );
    for (at, fault) in faults {
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            thread::sleep(wait);
        }
        fault();
    }
    let status = cli.wait_exit(Duration::from_secs(60));
    srv.kill();
    let report = cli.stdout_json();
    assert!(
        status.is_some_and(|s| s.success()),
        "iperf3 {client} -> {server} failed ({status:?}): {}",
        report["error"]
    );
    report
}

/// Mbit/s the receiver got in each of the report's intervals.
fn interval_rates(report: &serde_json::Value) -> Vec<f64> {
    report["intervals"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| i["sum"]["bits_per_second"].as_f64().unwrap_or(0.0) / 1e6)
                .collect()
        })
        .unwrap_or_default()
}

fn received_mbit(report: &serde_json::Value) -> f64 {
    report["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0)
        / 1e6
}

#[test]
fn a_three_host_tunnel_carries_tcp_through_a_dead_switch_and_a_partition() {
    let _serial = serial();
    let Some(env) = env() else { return };
    if !require_tool("iperf3", "iperf3") {
        return;
    }
    let _timer = TestTimer::start("tunnel");
    let dir = TestDir::new(env, "tunnel");
    let lab = Lab::up_hosts(env, "tun", 2, 3);
    let config = cluster_file(env, &dir.0);
    for h in HOSTS {
        let out = Command::new(&env.ri2n)
            .args(["tunnel", "--check", "--name", h, "--config"])
            .arg(&config)
            .output()
            .expect("running ri2n tunnel --check");
        assert!(
            out.status.success(),
            "--check {h}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut daemons = start_daemons(env, &lab, &dir.0, &config);

    // the status, from another process: both peers connected over two links each
    let status = wait_for_status(env, &lab.ns_of("a"), &config);
    for peer in status["peers"].as_array().expect("peers") {
        let links: Vec<&str> = peer["links"]
            .as_array()
            .expect("links")
            .iter()
            .map(|l| l["state"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(peer["state"], "connected", "{status}");
        assert_eq!(links, ["up", "up"], "{status}");
    }
    // and the same as Prometheus text
    let metrics = Command::new("ip")
        .args(["netns", "exec", &lab.ns_of("a"), "bash", "-c"])
        .arg(format!(
            "exec 3<>/dev/tcp/{}/{}; printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3",
            METRICS.split(':').next().unwrap(),
            METRICS.split(':').nth(1).unwrap()
        ))
        .output()
        .expect("asking for the metrics");
    let text = String::from_utf8_lossy(&metrics.stdout);
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(
        text.contains("ri2n_tunnel_peer_connected{host=\"a\",peer=\"b\"} 1"),
        "{text}"
    );

    // every host reaches every other
    for (client, server) in [("a", "b"), ("b", "c"), ("c", "a")] {
        let r = iperf(&lab, &dir.0, client, server, &["-n", "20M"], &[]);
        // iperf3 -n ends once the bytes are sent; its exit 0 says TCP delivered them
        let sent = r["end"]["sum_sent"]["bytes"].as_u64().unwrap_or(0);
        assert!(sent >= 20 << 20, "{client} -> {server}: {sent} bytes sent");
        report(&format!(
            "tunnel {client} -> {server}: 20 MiB at {:.0} Mbit/s",
            received_mbit(&r)
        ));
    }

    // switch 1 dies for 1.5 s during a transfer: inner TCP goes on over link 2
    let r = iperf(
        &lab,
        &dir.0,
        "a",
        "b",
        &["-t", "5", "-i", "0.5"],
        &[
            (Duration::from_millis(1500), &|| {
                lab.fault(1, &["switch"]);
            }),
            (Duration::from_millis(3000), &|| {
                lab.heal(1);
            }),
        ],
    );
    let rates = interval_rates(&r);
    report(&format!(
        "tunnel a -> b, switch 1 dead 1.5-3.0 s: {:.0} Mbit/s; per 0.5 s: {rates:.0?}",
        received_mbit(&r)
    ));
    assert!(
        rates.iter().skip(3).take(3).all(|&m| m > 0.0),
        "no data moved while switch 1 was dead: {rates:.0?}"
    );

    // every link between the hosts down for 3 s: the connection survives (no reset) and
    // moves data again right after the heal, not at inner TCP's next retransmission timeout
    // (that would be 3 s or more later): what was in flight when the links died, and what
    // inner TCP sent during the outage, reach the peer at the heal
    let (outage_from, outage_to) = (Duration::from_millis(2000), Duration::from_millis(5000));
    let r = iperf(
        &lab,
        &dir.0,
        "a",
        "b",
        &["-t", "9", "-i", "0.1"],
        &[
            (outage_from, &|| {
                lab.fault(1, &["switch"]);
                lab.fault(2, &["switch"]);
            }),
            (outage_to, &|| lab.heal_all()),
        ],
    );
    let rates = interval_rates(&r);
    let tenth = |d: Duration| (d.as_millis() / 100) as usize;
    // the premise: nothing moved through the second half of the outage (the sender's
    // buffers had filled by then)
    let during = &rates[tenth(outage_from) + 10..tenth(outage_to)];
    assert!(
        during.iter().all(|&m| m == 0.0),
        "data moved while every link was down: {rates:.0?}"
    );
    let first = rates
        .iter()
        .skip(tenth(outage_to))
        .position(|&m| m > 0.0)
        .unwrap_or_else(|| panic!("no data moved after the heal: {rates:.0?}"));
    let resumed_ms = first * 100;
    report(&format!(
        "tunnel a -> b, every link down 2-5 s: data again in the 100 ms interval starting \
         {resumed_ms} ms after the heal; per 0.1 s: {rates:.0?}"
    ));
    // measured: the first 100 ms interval after the heal, 2-core host, 2026-11-27
    assert!(
        resumed_ms <= 500,
        "data moved again only {resumed_ms} ms after the heal: {rates:.0?}"
    );

    // SIGTERM: exit 0, interface gone
    for (d, h) in daemons.iter_mut().zip(HOSTS) {
        let status = d.terminate(Duration::from_secs(10));
        assert!(
            status.is_some_and(|s| s.success()),
            "{} after SIGTERM: {status:?}: {}",
            d.name,
            d.stderr_text()
        );
        let gone = Command::new("ip")
            .args(["-n", &lab.ns_of(h), "link", "show", "ri2n0"])
            .output()
            .expect("running ip");
        assert!(!gone.status.success(), "ri2n0 still exists in host {h}");
    }
}

/// How long the MPI job runs, seconds (of its own clock, which starts after MPI_Init).
const MPI_JOB_SECONDS: u64 = 42;

/// `tests/mpi/check.c` built with `mpicc` into `dir`.
fn build_mpi_check(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mpi/check.c");
    let program = dir.join("check");
    let out = Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&program)
        .arg(&source)
        .output()
        .expect("running mpicc");
    assert!(
        out.status.success(),
        "mpicc {}: {}",
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    program
}

/// Starts `mpirun` in host a: one rank of `program` on each host, launched through
/// `ri2n-lab agent` (mpirun's stand-in for ssh), Open MPI's TCP transport on the interfaces
/// `btl` and its own control traffic on `oob`.
fn start_mpi_job(env: &Env, lab: &Lab, dir: &Path, program: &Path, btl: &str, oob: &str) -> Proc {
    let agent = dir.join("agent");
    fs::write(
        &agent,
        format!(
            "#!/bin/sh\nexec {} --prefix {} agent \"$@\"\n",
            env.lab_script.display(),
            lab.prefix
        ),
    )
    .expect("writing the agent script");
    fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("making the agent script executable");
    let hostfile = dir.join("hostfile");
    let hosts: String = HOSTS.iter().map(|h| format!("{h} slots=1\n")).collect();
    fs::write(&hostfile, hosts).expect("writing the hostfile");
    let mut mpirun = Command::new(&agent);
    mpirun
        .args(["a", "mpirun", "--hostfile"])
        .arg(&hostfile)
        .args(["-np", "3", "--map-by", "node", "--mca", "plm_rsh_agent"])
        .arg(&agent)
        .args(["--mca", "plm_rsh_no_tree_spawn", "1"])
        .args(["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"])
        .args(["--mca", "btl_tcp_if_include", btl])
        .args(["--mca", "oob_tcp_if_include", oob])
        .arg(program)
        .arg(MPI_JOB_SECONDS.to_string())
        // the lab runs as root, which mpirun refuses unless told
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    Proc::spawn_command(mpirun, dir, "mpirun")
}

#[test]
fn an_mpi_job_through_the_tunnel_completes_through_a_dead_switch_and_a_partition() {
    let _serial = serial();
    let Some(env) = env() else { return };
    if !require_tool("mpirun", "openmpi-bin") || !require_tool("mpicc", "libopenmpi-dev") {
        return;
    }
    let _timer = TestTimer::start("tunnel-mpi");
    let dir = TestDir::new(env, "tunnel-mpi");
    let program = build_mpi_check(&dir.0);
    let lab = Lab::up_hosts(env, "tmpi", 2, 3);
    let config = cluster_file(env, &dir.0);
    let _daemons = start_daemons(env, &lab, &dir.0, &config);
    let mut job = start_mpi_job(env, &lab, &dir.0, &program, "ri2n0", "ri2n0");

    // the job's clock: it prints its first progress line a second after it starts
    let deadline = Instant::now() + Duration::from_secs(30);
    while !job.stdout_text().contains("progress") {
        if let Some(s) = job.poll() {
            panic!(
                "mpirun exited ({s}) before the job ran: {}{}",
                job.stdout_text(),
                job.stderr_text()
            );
        }
        assert!(Instant::now() < deadline, "the MPI job did not start");
        thread::sleep(Duration::from_millis(50));
    }
    let one_second_in = Instant::now();
    let faults: [(u64, &dyn Fn()); 4] = [
        (6, &|| {
            lab.fault(1, &["switch"]);
        }),
        (12, &|| {
            lab.heal(1);
        }),
        (16, &|| {
            lab.fault(1, &["switch"]);
            lab.fault(2, &["switch"]);
        }),
        (36, &|| lab.heal_all()),
    ];
    for (at, fault) in faults {
        let at = Duration::from_secs(at - 1);
        if let Some(wait) = at.checked_sub(one_second_in.elapsed()) {
            thread::sleep(wait);
        }
        fault();
    }
    let status = job.wait_exit(Duration::from_secs(MPI_JOB_SECONDS + 60));
    let out = job.stdout_text();
    assert!(
        status.is_some_and(|s| s.success()) && out.contains("result: ok"),
        "the MPI job failed ({status:?}): {out}{}",
        job.stderr_text()
    );
    for line in out.lines().filter(|l| l.starts_with("rank ")) {
        report(&format!(
            "MPI through the tunnel, switch 1 dead 6-12 s, every link down 16-36 s: {line}"
        ));
    }
}
