//! The machinery of the lab tests: finding (building) the `ri2n` binary, a lab of network
//! namespaces made by `lab/ri2n-lab` and torn down on drop, child processes killed by PID on
//! drop, seeded random data files, one transfer with timed fault actions and an outside view of
//! it (per-link interface counters, the receiver's output size and memory, sampled every 50 ms),
//! and a flood of garbage datagrams sent from inside host A.
//!
//! Every test holds [`serial`] while it runs: the transfers are CPU-bound on small machines,
//! so tests running side by side would slow each other down and blur the failover figures.

#![allow(dead_code)] // each test binary uses a different part

use std::fs::{self, File};
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ri2n_proto::wire::{packet_type, VERSION};
use sha2::{Digest, Sha256};

/// The port `ri2n recv` listens on, on every address.
pub const PORT: u16 = 7000;
/// Per-link rate cap of the lab, Mbit/s (tbf on each host's egress).
pub const RATE_MBIT: u64 = 1000;

// ---------------------------------------------------------------------------------------------
// Environment: root, tools, the binary

/// What the tests need from the machine.
pub struct Env {
    /// The `ri2n` binary: `RI2N_LAB_BIN`, else the release build of this checkout.
    pub ri2n: PathBuf,
    /// `lab/ri2n-lab`.
    pub lab_script: PathBuf,
    /// Where data files go (`RI2N_LAB_TMPDIR`, else the system's temp directory).
    pub tmp: PathBuf,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace directory")
}

/// Whether `tool ARG` can be started (its exit status does not matter).
fn runs(tool: &str, arg: &str) -> bool {
    Command::new(tool)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Why this machine cannot run the lab, if it cannot.
fn missing_prerequisite() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, tc, nftables)".into());
    }
    for (tool, package) in [("ip", "iproute2"), ("tc", "iproute2"), ("nft", "nftables")] {
        if !runs(tool, "-V") {
            return Some(format!("`{tool}` not found (apt-get install {package})"));
        }
    }
    // root in a container may still lack the right to make namespaces
    let probe = format!("ri2nlab-{}-probe", std::process::id());
    let made = Command::new("ip")
        .args(["netns", "add", &probe])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !made {
        return Some("`ip netns add` failed: no permission to create network namespaces".into());
    }
    let _ = Command::new("ip").args(["netns", "del", &probe]).status();
    None
}

/// The lab prefixes (`ri2nlab-PID-NAME`, see [`Lab::up`]) of namespaces in `names` whose test
/// process is gone, with the namespaces of each. A test run ended by a signal (Ctrl-C, a CI
/// timeout) runs no destructor, so its labs outlive it.
fn abandoned_labs(names: &[String], alive: impl Fn(u32) -> bool) -> Vec<(String, Vec<String>)> {
    let mut labs: Vec<(String, Vec<String>)> = Vec::new();
    for name in names {
        let Some(rest) = name.strip_prefix("ri2nlab-") else {
            continue;
        };
        let Some((pid, _)) = rest.split_once('-') else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if alive(pid) {
            continue;
        }
        // the lab's prefix is the name less its host or switch (`-a`, `-sw1`); the probe of
        // `missing_prerequisite` is a prefix alone
        let prefix = match name.rsplit_once('-') {
            Some((p, _)) if p.len() > format!("ri2nlab-{pid}").len() => p.to_owned(),
            _ => name.clone(),
        };
        match labs.iter_mut().find(|(p, _)| *p == prefix) {
            Some((_, members)) => members.push(name.clone()),
            None => labs.push((prefix, vec![name.clone()])),
        }
    }
    labs
}

#[test]
fn the_labs_of_a_gone_test_process_are_found_and_no_others() {
    let names: Vec<String> = [
        "ri2nlab-100-cmpi-a",
        "ri2nlab-100-cmpi-af",
        "ri2nlab-100-cmpi-sw1",
        "ri2nlab-100-switch-dies-b",
        "ri2nlab-100-probe",
        "ri2nlab-200-faults-a",
        "ri2nlab-a",
        "ri2nlab-sw1",
        "pt-a",
        "ri2nlab-x1-a",
    ]
    .map(String::from)
    .to_vec();
    let labs = abandoned_labs(&names, |pid| pid == 200);
    let got: Vec<(&str, usize)> = labs.iter().map(|(p, m)| (p.as_str(), m.len())).collect();
    assert_eq!(
        got,
        [
            ("ri2nlab-100-cmpi", 3),
            ("ri2nlab-100-switch-dies", 1),
            ("ri2nlab-100-probe", 1)
        ]
    );
}

/// Removes the labs of earlier test runs that ended without removing them (their process is
/// gone): `ri2n-lab down` ends the processes inside and deletes the namespaces; a namespace
/// it does not know is deleted alone.
fn sweep_abandoned_labs(script: &Path) {
    let names: Vec<String> = fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let alive = |pid: u32| Path::new(&format!("/proc/{pid}")).exists();
    for (prefix, members) in abandoned_labs(&names, alive) {
        let _ = Command::new("bash")
            .arg(script)
            .args(["--prefix", &prefix, "down"])
            .output();
        for ns in members {
            if Path::new("/run/netns").join(&ns).exists() {
                let _ = Command::new("ip").args(["netns", "del", &ns]).status();
            }
        }
        report(&format!(
            "removed lab {prefix}, left by a test process that is gone"
        ));
    }
}

/// Builds `ri2n` (release) and returns its path, from cargo's own report of the artifact.
fn build_ri2n() -> PathBuf {
    let out = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "-p",
            "ri2n-cli",
            "--bin",
            "ri2n",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(workspace())
        .stderr(Stdio::inherit())
        .output()
        .expect("running cargo build");
    assert!(out.status.success(), "cargo build -p ri2n-cli failed");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "ri2n" {
            if let Some(exe) = msg["executable"].as_str() {
                return PathBuf::from(exe);
            }
        }
    }
    panic!("cargo build did not report the ri2n executable");
}

/// The environment, or `None` (after printing why) when this machine cannot run the lab and
/// `CI` is not set. Under `CI` a missing prerequisite fails the test instead.
pub fn env() -> Option<&'static Env> {
    static ENV: OnceLock<Result<Env, String>> = OnceLock::new();
    let r = ENV.get_or_init(|| {
        if let Some(why) = missing_prerequisite() {
            return Err(why);
        }
        let tmp = std::env::var_os("RI2N_LAB_TMPDIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let lab_script = workspace().join("lab/ri2n-lab");
        sweep_abandoned_labs(&lab_script);
        Ok(Env {
            // another build to compare (an earlier commit, say) may be named
            ri2n: std::env::var_os("RI2N_LAB_BIN")
                .map(PathBuf::from)
                .unwrap_or_else(build_ri2n),
            lab_script,
            tmp,
        })
    });
    match r {
        Ok(e) => Some(e),
        Err(why) if std::env::var_os("CI").is_some() => {
            panic!("lab test cannot run: {why} (CI is set, so this is a failure, not a skip)")
        }
        Err(why) => {
            eprintln!("SKIPPED: lab test: {why}");
            None
        }
    }
}

/// Whether `tool` can run here (`tool --version`); when not, prints why and returns false
/// (the test skips), or under `CI` fails.
pub fn require_tool(tool: &str, package: &str) -> bool {
    let found = runs(tool, "--version");
    if !found {
        let why = format!("`{tool}` not found (apt-get install {package})");
        assert!(
            std::env::var_os("CI").is_none(),
            "lab test cannot run: {why} (CI is set, so this is a failure, not a skip)"
        );
        eprintln!("SKIPPED: lab test: {why}");
    }
    found
}

/// One lab test at a time (see the module docs). A test that panicked leaves the lock
/// poisoned; the next one takes it anyway.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a lab test holds while it runs, dropped after the test's own lab and processes, in
/// this order: a folder for its files, the timer that reports its time and the lock that runs
/// lab tests one at a time.
pub struct LabTest {
    pub env: &'static Env,
    pub dir: TestDir,
    _timer: TestTimer,
    _serial: MutexGuard<'static, ()>,
}

impl LabTest {
    /// Starts test `name` (its report's and folder's name), or returns None where it cannot
    /// run here, having said why (a failure when `CI` is set): no lab ([`env`]) or a missing
    /// tool of `tools` (program, package).
    pub fn start(name: &'static str, tools: &[(&str, &str)]) -> Option<LabTest> {
        let env = env()?;
        if !tools
            .iter()
            .all(|&(tool, package)| require_tool(tool, package))
        {
            return None;
        }
        let serial = serial();
        Some(LabTest {
            env,
            _timer: TestTimer::start(name),
            dir: TestDir::new(env, name),
            _serial: serial,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Report

/// Prints a line and appends it to `target/tmp/ri2n-lab-report.txt` (the figures of the last
/// runs, readable after a passing run whose output cargo captured).
pub fn report(line: &str) {
    println!("{line}");
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ri2n-lab-report.txt");
    if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{line}");
    }
}

/// Sets its flag when dropped: the threads a test told to stop by that flag (a tap, an
/// injector, a forger) stop also when the test fails before it sets the flag itself, instead
/// of running on into the next test until their own time is up.
pub struct StopOnDrop(pub Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Reports how long a test took when dropped (also when it failed).
pub struct TestTimer(pub &'static str, pub Instant);

impl TestTimer {
    pub fn start(name: &'static str) -> TestTimer {
        TestTimer(name, Instant::now())
    }
}

impl Drop for TestTimer {
    fn drop(&mut self) {
        let how = if thread::panicking() {
            "failed"
        } else {
            "passed"
        };
        report(&format!(
            "== test {}: {how} in {:.1} s",
            self.0,
            self.1.elapsed().as_secs_f64()
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// The lab

/// Host A or host B of the lab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    A,
    B,
}

impl Host {
    pub fn letter(self) -> &'static str {
        match self {
            Host::A => "a",
            Host::B => "b",
        }
    }

    pub fn other(self) -> Host {
        match self {
            Host::A => Host::B,
            Host::B => Host::A,
        }
    }

    /// The host's address on link `link` (1-based): 10.77.link.1 for A, .2 for B.
    pub fn addr(self, link: u8) -> IpAddr {
        let last = match self {
            Host::A => 1,
            Host::B => 2,
        };
        IpAddr::from([10, 77, link, last])
    }

    /// The host's IPv6 address on link `link` (a lab made with [`Lab::up_ipv6`]):
    /// fd77:link::1 for A, ::2 for B.
    pub fn addr6(self, link: u8) -> IpAddr {
        let last = match self {
            Host::A => 1,
            Host::B => 2,
        };
        IpAddr::from([0xfd77, u16::from(link), 0, 0, 0, 0, 0, last])
    }
}

/// A lab made by `ri2n-lab up`, removed by `ri2n-lab down` when dropped (also on panic).
pub struct Lab {
    script: PathBuf,
    pub prefix: String,
    pub links: u8,
    /// The transfers run over the links' IPv6 addresses ([`Host::addr6`]).
    pub ipv6: bool,
}

impl Lab {
    /// `links` links of [`RATE_MBIT`] each; the prefix is unique to this process and test.
    pub fn up(env: &Env, name: &str, links: u8) -> Lab {
        Self::up_with(env, name, links, false)
    }

    /// Like [`Lab::up`], with IPv6 addresses on the links, which the transfers then use.
    pub fn up_ipv6(env: &Env, name: &str, links: u8) -> Lab {
        Self::up_with(env, name, links, true)
    }

    /// `hosts` hosts (a, b, c, ...; host h is 10.77.LINK.h) on `links` links of
    /// [`RATE_MBIT`] each, every switch joining every host.
    pub fn up_hosts(env: &Env, name: &str, links: u8, hosts: u8) -> Lab {
        Self::up_args(env, name, links, false, &["--hosts", &hosts.to_string()])
    }

    fn up_with(env: &Env, name: &str, links: u8, ipv6: bool) -> Lab {
        Self::up_args(env, name, links, ipv6, &[])
    }

    fn up_args(env: &Env, name: &str, links: u8, ipv6: bool, more: &[&str]) -> Lab {
        let lab = Lab {
            script: env.lab_script.clone(),
            prefix: format!("ri2nlab-{}-{name}", std::process::id()),
            links,
            ipv6,
        };
        let (links, rate) = (links.to_string(), RATE_MBIT.to_string());
        let mut args = vec!["up", links.as_str(), "--rate", rate.as_str()];
        args.extend_from_slice(more);
        if ipv6 {
            args.push("--ipv6");
        }
        lab.run(&args);
        lab
    }

    /// The address of `host` on link `link` that transfers use (IPv4, or IPv6 in an IPv6 lab).
    pub fn addr(&self, host: Host, link: u8) -> IpAddr {
        if self.ipv6 {
            host.addr6(link)
        } else {
            host.addr(link)
        }
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("bash")
            .arg(&self.script)
            .args(["--prefix", &self.prefix])
            .args(args)
            .output()
            .expect("running lab/ri2n-lab");
        assert!(
            out.status.success(),
            "ri2n-lab {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// `ri2n-lab fault LINK KIND...`; returns what the script printed.
    pub fn fault(&self, link: u8, kind: &[&str]) -> String {
        let link = link.to_string();
        let mut args = vec!["fault", link.as_str()];
        args.extend_from_slice(kind);
        self.run(&args)
    }

    /// `ri2n-lab status`: what it printed.
    pub fn status(&self) -> String {
        self.run(&["status"])
    }

    /// `ri2n-lab heal LINK`.
    pub fn heal(&self, link: u8) -> String {
        self.run(&["heal", &link.to_string()])
    }

    pub fn heal_all(&self) {
        self.run(&["heal", "all"]);
    }

    /// The bytes `host` has sent on link `link` (its `ethLINK`; a dead switch keeps its ports
    /// up, so what a host sends into it is counted).
    pub fn tx_bytes(&self, host: Host, link: u8) -> u64 {
        let out = (self.command(host, "cat").arg("/proc/net/dev").output())
            .expect("reading /proc/net/dev");
        parse_net_dev(&String::from_utf8_lossy(&out.stdout), link).1[usize::from(link) - 1]
    }

    /// The namespace of a host.
    pub fn ns(&self, host: Host) -> String {
        self.ns_of(host.letter())
    }

    /// The namespace of the host with letter `letter` (a, b, c, ...).
    pub fn ns_of(&self, letter: &str) -> String {
        format!("{}-{letter}", self.prefix)
    }

    /// Replaces the root qdisc of `host`'s interface `dev` with a token bucket: `rate` (in
    /// tc's units), a 30 000-byte burst, at most `latency` of queue.
    pub fn tbf(&self, host: Host, dev: &str, rate: &str, latency: &str) {
        let ok = self
            .command(host, "tc")
            .args(["qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate])
            .args(["burst", "30000", "latency", latency])
            .status()
            .expect("running tc")
            .success();
        assert!(ok, "tc could not replace {dev}'s qdisc");
    }

    /// `program` run inside host `host` (`ip netns exec`), its arguments still to add.
    pub fn command(&self, host: Host, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.ns(host), program]);
        command
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let out = Command::new("bash")
            .arg(&self.script)
            .args(["--prefix", &self.prefix, "down"])
            .output();
        let left: Vec<String> = fs::read_dir("/run/netns")
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&format!("{}-", self.prefix)))
                    .collect()
            })
            .unwrap_or_default();
        match out {
            Ok(o) if o.status.success() && left.is_empty() => {}
            Ok(o) => eprintln!(
                "warning: `ri2n-lab --prefix {} down` ({}) left {left:?}: {}{}",
                self.prefix,
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("warning: cannot run ri2n-lab down: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Processes

/// A process started inside a lab host, killed (SIGKILL, by its PID) and reaped when dropped.
/// `ip netns exec` execs the command in place, so the PID is the command's own.
pub struct Proc {
    child: Child,
    pub name: String,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    status: Option<ExitStatus>,
}

impl Proc {
    pub fn spawn(
        lab: &Lab,
        host: Host,
        program: &Path,
        args: &[String],
        dir: &Path,
        name: &str,
    ) -> Proc {
        Self::spawn_in(&lab.ns(host), program, args, dir, name)
    }

    /// Like [`Proc::spawn`], its stdin a pipe (see [`Proc::take_stdin`]).
    pub fn spawn_piped(
        lab: &Lab,
        host: Host,
        program: &Path,
        args: &[String],
        dir: &Path,
        name: &str,
    ) -> Proc {
        let command = Self::in_namespace(&lab.ns(host), program, args);
        Self::spawn_command_with(command, Stdio::piped(), dir, name)
    }

    /// Like [`Proc::spawn`], in namespace `ns`.
    pub fn spawn_in(ns: &str, program: &Path, args: &[String], dir: &Path, name: &str) -> Proc {
        Self::spawn_command(Self::in_namespace(ns, program, args), dir, name)
    }

    /// Starts `command` (which enters a lab host itself), its output in `dir`.
    pub fn spawn_command(command: Command, dir: &Path, name: &str) -> Proc {
        Self::spawn_command_with(command, Stdio::null(), dir, name)
    }

    /// `program args...` run inside namespace `ns` (`ip netns exec` execs it in place, so the
    /// PID is the program's own).
    fn in_namespace(ns: &str, program: &Path, args: &[String]) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", ns]).arg(program).args(args);
        command
    }

    fn spawn_command_with(mut command: Command, stdin: Stdio, dir: &Path, name: &str) -> Proc {
        let stdout = dir.join(format!("{name}.stdout"));
        let stderr = dir.join(format!("{name}.stderr"));
        let child = command
            .stdin(stdin)
            .stdout(File::create(&stdout).expect("stdout file"))
            .stderr(File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("spawning a process in a lab host");
        Proc {
            child,
            name: name.to_owned(),
            stdout,
            stderr,
            status: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process's stdin, once (of a process spawned with a piped stdin).
    pub fn take_stdin(&mut self) -> std::process::ChildStdin {
        self.child
            .stdin
            .take()
            .expect("a process spawned with a piped stdin")
    }

    /// The exit status, once exited.
    pub fn poll(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("waitpid");
        }
        self.status
    }

    /// Sends SIGTERM and waits at most `max` for the exit.
    pub fn terminate(&mut self, max: Duration) -> Option<ExitStatus> {
        if self.poll().is_none() {
            // SAFETY: kill(2) on the PID of our own child, not yet reaped.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = Instant::now() + max;
        while self.poll().is_none() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        self.status
    }

    /// Waits at most `max` for the exit.
    pub fn wait_exit(&mut self, max: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + max;
        while self.poll().is_none() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        self.status
    }

    pub fn kill(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
    }

    pub fn stdout_text(&self) -> String {
        fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    pub fn stderr_text(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits at most `max` for a line of the process's output (standard output or error) that
    /// `wanted` accepts; whether one came (false also once the process has exited without one).
    pub fn wait_for_line(&mut self, max: Duration, wanted: impl Fn(&str) -> bool) -> bool {
        let deadline = Instant::now() + max;
        loop {
            // read after looking at the exit: a line written just before exiting counts
            let exited = self.poll().is_some();
            let (out, err) = (self.stdout_text(), self.stderr_text());
            if out.lines().chain(err.lines()).any(&wanted) {
                return true;
            }
            if exited || Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stdout_json(&self) -> serde_json::Value {
        let text = fs::read_to_string(&self.stdout).unwrap_or_default();
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
    }

    /// Waits until the process has `count` UDP or TCP sockets bound to [`PORT`] in its
    /// namespace (it is listening), or panics after `max`.
    pub fn wait_listening(&mut self, count: usize, max: Duration) {
        self.wait_listening_on(PORT, count, max)
    }

    /// Waits until the process has `count` UDP or TCP sockets bound to `port` in its
    /// namespace (it is listening), or panics after `max`.
    pub fn wait_listening_on(&mut self, port: u16, count: usize, max: Duration) {
        let deadline = Instant::now() + max;
        let port = format!(":{port:04X} ");
        loop {
            if let Some(s) = self.poll() {
                panic!(
                    "{} exited ({s}) before listening: {}",
                    self.name,
                    self.stderr_text()
                );
            }
            // the namespace's sockets on the port that take datagrams or connections: a UDP
            // socket unconnected (state 07), a TCP one listening (0A); a connection an earlier
            // receiver accepted on the port may linger (TIME_WAIT), and must not count
            let bound = [("udp", "07"), ("udp6", "07"), ("tcp", "0A"), ("tcp6", "0A")]
                .iter()
                .filter_map(|(f, state)| {
                    let table = fs::read_to_string(format!("/proc/{}/net/{f}", self.pid())).ok()?;
                    Some((table, *state))
                })
                .map(|(table, state)| {
                    (table.lines())
                        .filter(|l| {
                            let fields: Vec<&str> = l.split_whitespace().collect();
                            fields.len() > 3
                                && format!("{} ", fields[1]).ends_with(&port)
                                && fields[3] == state
                        })
                        .count()
                })
                .sum::<usize>();
            if bound >= count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} not listening after {max:?}",
                self.name
            );
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A directory for one test's files, removed when dropped.
pub struct TestDir(pub PathBuf);

impl TestDir {
    pub fn new(env: &Env, name: &str) -> TestDir {
        let p = env
            .tmp
            .join(format!("ri2n-lab-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).expect("creating the test directory");
        TestDir(p)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------------
// Data

/// A new cluster key, `cluster.key` in `dir` (made by `ri2n keygen`).
pub fn keygen(env: &Env, dir: &Path) -> PathBuf {
    let key = dir.join("cluster.key");
    let status = Command::new(&env.ri2n)
        .args(["keygen", "--output"])
        .arg(&key)
        .status()
        .expect("running ri2n keygen");
    assert!(status.success(), "ri2n keygen failed");
    key
}

/// A file of seeded random bytes and its sha256.
pub struct DataFile {
    pub path: PathBuf,
    pub len: u64,
    pub sha256: [u8; 32],
    pub seed: u64,
}

impl DataFile {
    /// Streams `mib` MiB of ChaCha8 output for `seed` to `path` (never held in memory).
    pub fn create(path: PathBuf, mib: u64, seed: u64) -> DataFile {
        Self::create_marked(path, mib, seed, b"")
    }

    /// Like [`DataFile::create`], with `marker` written at the start of every 1 KiB: plaintext
    /// a capture of the links can be searched for.
    pub fn create_marked(path: PathBuf, mib: u64, seed: u64, marker: &[u8]) -> DataFile {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&path).expect("data file"));
        let mut buf = vec![0u8; 1 << 20];
        let mut h = Sha256::new();
        for _ in 0..mib {
            rng.fill_bytes(&mut buf);
            if !marker.is_empty() {
                for chunk in buf.chunks_mut(1024) {
                    chunk[..marker.len()].copy_from_slice(marker);
                }
            }
            h.update(&buf);
            w.write_all(&buf).expect("writing the data file");
        }
        w.flush().expect("writing the data file");
        DataFile {
            path,
            len: mib << 20,
            sha256: h.finalize().into(),
            seed,
        }
    }
}

/// sha256 and length of a file.
pub fn sha256_file(path: &Path) -> ([u8; 32], u64) {
    let mut f = File::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    let mut buf = vec![0u8; 1 << 20];
    let mut h = Sha256::new();
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf).expect("reading the output");
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        len += n as u64;
    }
    (h.finalize().into(), len)
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// ---------------------------------------------------------------------------------------------
// Outside view of a transfer

/// One sample of the monitor.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Seconds since the transfer started.
    pub t: f64,
    /// Bytes sent by the sending host on eth1, eth2, ... (interface counters).
    pub tx: Vec<u64>,
    /// Bytes received by the receiving host on eth1, eth2, ...
    pub rx: Vec<u64>,
    /// Size of the receiver's output file.
    pub out_len: u64,
    /// Receiver's resident memory and its high-water mark, KiB.
    pub recv_rss_kib: u64,
    pub recv_hwm_kib: u64,
}

/// `ifname -> (rx_bytes, tx_bytes)` from `/proc/PID/net/dev` (the namespace of PID).
fn net_dev(pid: u32, links: u8) -> Option<(Vec<u64>, Vec<u64>)> {
    let text = fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
    Some(parse_net_dev(&text, links))
}

/// The bytes received and sent on `eth1` to `ethLINKS`, from the text of a `/proc/net/dev`.
fn parse_net_dev(text: &str, links: u8) -> (Vec<u64>, Vec<u64>) {
    let mut rx = vec![0; links as usize];
    let mut tx = vec![0; links as usize];
    for line in text.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let Some(i) = name
            .trim()
            .strip_prefix("eth")
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        if i == 0 || i > links as usize {
            continue;
        }
        let f: Vec<u64> = rest
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if f.len() >= 9 {
            rx[i - 1] = f[0];
            tx[i - 1] = f[8];
        }
    }
    (rx, tx)
}

/// `VmRSS` and `VmHWM` of a process, KiB.
pub fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Samples a transfer every `period` from a thread until stopped.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<Sample>>>,
}

impl Monitor {
    pub fn start(
        start: Instant,
        sender: u32,
        receiver: u32,
        output: PathBuf,
        links: u8,
        period: Duration,
    ) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = thread::spawn(move || {
            let mut samples: Vec<Sample> = Vec::new();
            while !s.load(Ordering::Relaxed) {
                let mut x = Sample {
                    t: start.elapsed().as_secs_f64(),
                    ..Sample::default()
                };
                let prev = samples.last();
                // a process that has exited keeps its last counters
                x.tx = net_dev(sender, links)
                    .map(|(_, tx)| tx)
                    .or_else(|| prev.map(|p| p.tx.clone()))
                    .unwrap_or_else(|| vec![0; links as usize]);
                x.rx = net_dev(receiver, links)
                    .map(|(rx, _)| rx)
                    .or_else(|| prev.map(|p| p.rx.clone()))
                    .unwrap_or_else(|| vec![0; links as usize]);
                // `ri2n recv` writes FILE.partial and renames it to FILE at the end
                let mut partial = output.clone().into_os_string();
                partial.push(".partial");
                x.out_len = fs::metadata(&partial)
                    .or_else(|_| fs::metadata(&output))
                    .map(|m| m.len())
                    .unwrap_or(0);
                let (rss, hwm) = rss_kib(receiver)
                    .or_else(|| prev.map(|p| (p.recv_rss_kib, p.recv_hwm_kib)))
                    .unwrap_or((0, 0));
                x.recv_rss_kib = rss;
                x.recv_hwm_kib = hwm;
                samples.push(x);
                thread::sleep(period);
            }
            samples
        });
        Monitor {
            stop,
            handle: Some(handle),
        }
    }

    pub fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A transfer

/// What to do to the lab at a time into the transfer.
#[derive(Clone, Debug)]
pub enum Action {
    /// `ri2n-lab fault LINK KIND...`
    Fault(u8, Vec<String>),
    /// `ri2n-lab heal LINK`
    Heal(u8),
}

/// One `ri2n send` → `ri2n recv` run. The sender reads its stdin, which the test feeds with
/// `input` over and over until every action has been applied and [`AFTER_LAST_ACTION`] has
/// passed (and at least one whole copy went in): the data is sized by time, so every fault
/// and heal meets data on the move however fast the code is.
pub struct Transfer<'a> {
    pub sender: Host,
    pub input: &'a DataFile,
    /// Timed lab actions, in order.
    pub actions: Vec<(Duration, Action)>,
    /// Name the peer's link-1 address only and let the handshake announce the others; else
    /// name every address with `--to` and pass `--no-discover`.
    pub discover: bool,
    /// Give up (panic, which kills everything) at this instant.
    pub deadline: Instant,
    /// A label for files and the report.
    pub name: String,
    /// The key file both sides use (`--key`), if any.
    pub key: Option<&'a Path>,
    /// Both sides use the TCP transport (`--transport tcp`).
    pub tcp: bool,
    /// Further arguments for both commands.
    pub args: &'a [&'a str],
}

/// How long a transfer keeps being fed after its last action: time for the recovery the test
/// names to show in the samples.
pub const AFTER_LAST_ACTION: Duration = Duration::from_millis(1500);

/// Writes a file over and over into a process's stdin until told to stop (or the process
/// stops reading); the sha256 and length of everything written come back from
/// [`Feeder::finish`]. Dropped, it only tells its thread to stop.
pub struct Feeder {
    stop: Arc<AtomicBool>,
    fed: Arc<std::sync::atomic::AtomicU64>,
    handle: Option<JoinHandle<[u8; 32]>>,
}

/// `ri2n send` from `host` to the other host of `lab`, its stdin fed with `data` over and
/// over (see [`Feeder`]) so that it sends for as long as the test needs.
pub fn spawn_fed_sender(
    env: &Env,
    lab: &Lab,
    host: Host,
    data: &DataFile,
    dir: &Path,
    name: &str,
) -> (Proc, Feeder) {
    let args = send_args(lab, host, Path::new("-"), true);
    spawn_fed(env, lab, host, &args, data, dir, name)
}

/// `ri2n ARGS` (a sender reading stdin) in `host`, fed with `data` over and over.
fn spawn_fed(
    env: &Env,
    lab: &Lab,
    host: Host,
    args: &[String],
    data: &DataFile,
    dir: &Path,
    name: &str,
) -> (Proc, Feeder) {
    let mut send = Proc::spawn_piped(lab, host, &env.ri2n, args, dir, name);
    let feeder = Feeder::start(send.take_stdin(), data.path.clone());
    (send, feeder)
}

impl Feeder {
    pub fn start(mut stdin: std::process::ChildStdin, path: PathBuf) -> Feeder {
        let stop = Arc::new(AtomicBool::new(false));
        let fed = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (s, f) = (stop.clone(), fed.clone());
        let handle = thread::spawn(move || {
            let mut h = Sha256::new();
            let mut buf = vec![0u8; 1 << 20];
            'feeding: loop {
                let mut file = File::open(&path).expect("the data file");
                loop {
                    if s.load(Ordering::Acquire) {
                        break 'feeding;
                    }
                    let n = file.read(&mut buf).expect("reading the data file");
                    if n == 0 {
                        break;
                    }
                    // a sender that exited early: its exit status tells why
                    if stdin.write_all(&buf[..n]).is_err() {
                        break 'feeding;
                    }
                    h.update(&buf[..n]);
                    f.fetch_add(n as u64, Ordering::Release);
                }
            }
            h.finalize().into()
        });
        Feeder {
            stop,
            fed,
            handle: Some(handle),
        }
    }

    /// Bytes written so far.
    pub fn fed(&self) -> u64 {
        self.fed.load(Ordering::Acquire)
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// sha256 and length of what was fed (call once the process exited or stopped reading).
    pub fn finish(mut self) -> ([u8; 32], u64) {
        self.stop();
        let handle = self.handle.take().expect("finished once");
        let sha = handle.join().expect("the feeding thread");
        (sha, self.fed())
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What a transfer did.
pub struct Outcome {
    pub name: String,
    pub send_secs: f64,
    pub recv_secs: f64,
    /// Actual seconds into the transfer at which each action ran, and what it was.
    pub applied: Vec<(f64, Action)>,
    pub samples: Vec<Sample>,
    pub send_json: serde_json::Value,
    pub recv_json: serde_json::Value,
    pub links: u8,
}

/// Common `recv` arguments for `host` listening on every link of `lab`.
pub fn recv_args(lab: &Lab, host: Host, output: &Path) -> Vec<String> {
    let mut a = vec!["recv".to_owned()];
    for l in 1..=lab.links {
        a.push("--listen".into());
        a.push(SocketAddr::new(lab.addr(host, l), PORT).to_string());
    }
    a.push("--output".into());
    a.push(output.display().to_string());
    a.push("--json".into());
    a
}

/// Common `send` arguments from `host` to the other host, over every link of `lab`.
pub fn send_args(lab: &Lab, host: Host, input: &Path, discover: bool) -> Vec<String> {
    let peer = host.other();
    let mut a = vec!["send".to_owned()];
    let tos = if discover { 1 } else { lab.links };
    for l in 1..=tos {
        a.push("--to".into());
        a.push(SocketAddr::new(lab.addr(peer, l), PORT).to_string());
    }
    for l in 1..=lab.links {
        a.push("--local".into());
        a.push(lab.addr(host, l).to_string());
    }
    if !discover {
        a.push("--no-discover".into());
    }
    a.push("--input".into());
    a.push(input.display().to_string());
    a.push("--json".into());
    a
}

/// `args` with `--transport tcp` when `tcp`.
pub fn with_transport(mut args: Vec<String>, tcp: bool) -> Vec<String> {
    if tcp {
        args.extend(["--transport".to_owned(), "tcp".to_owned()]);
    }
    args
}

/// `args` followed by `more`.
fn with_args(mut args: Vec<String>, more: &[&str]) -> Vec<String> {
    args.extend(more.iter().map(|a| (*a).to_owned()));
    args
}

/// `args` with `--key FILE` when there is a key.
fn with_key(mut args: Vec<String>, key: Option<&Path>) -> Vec<String> {
    if let Some(k) = key {
        args.push("--key".into());
        args.push(k.display().to_string());
    }
    args
}

/// Applies `action`; returns its time in seconds since `start`. A fault's is when the command
/// began: ri2n can see it (a lost carrier) before the command ends, and what it saw must not
/// fall before the fault. A heal's is when it took effect, as the lab stamps it ("at T", Unix
/// time): the command's checks and other steps, tens of milliseconds on a busy host, would
/// otherwise count as ri2n's time to take the link back.
fn apply(lab: &Lab, action: &Action, start: Instant) -> f64 {
    let before = start.elapsed().as_secs_f64();
    let out = match action {
        Action::Fault(link, kind) => {
            let kind: Vec<&str> = kind.iter().map(String::as_str).collect();
            lab.fault(*link, &kind);
            return before;
        }
        Action::Heal(link) => lab.heal(*link),
    };
    let after = start.elapsed().as_secs_f64();
    let unix_now = (std::time::SystemTime::now())
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let stamp = (out.lines())
        .filter_map(|l| l.rsplit_once(" at ")?.1.trim().parse::<f64>().ok())
        .next_back();
    stamp.map_or(before, |t| (after - (unix_now - t)).clamp(before, after))
}

impl Transfer<'_> {
    /// Runs the transfer, applying the actions on time; panics (killing both processes and,
    /// through the caller's guards, the lab) on a non-zero exit, a timeout or different data.
    pub fn run(self, env: &Env, lab: &Lab, dir: &Path) -> Outcome {
        let receiver = self.sender.other();
        let output = dir.join(format!("{}.out", self.name));
        let mut recv = Proc::spawn(
            lab,
            receiver,
            &env.ri2n,
            &with_args(
                with_transport(
                    with_key(recv_args(lab, receiver, &output), self.key),
                    self.tcp,
                ),
                self.args,
            ),
            dir,
            &format!("{}-recv", self.name),
        );
        recv.wait_listening(lab.links as usize, Duration::from_secs(10));
        let start = Instant::now();
        let (mut send, feeder) = spawn_fed(
            env,
            lab,
            self.sender,
            &with_args(
                with_transport(
                    with_key(
                        send_args(lab, self.sender, Path::new("-"), self.discover),
                        self.key,
                    ),
                    self.tcp,
                ),
                self.args,
            ),
            self.input,
            dir,
            &format!("{}-send", self.name),
        );
        // the TCP transport's tests measure the pause in delivery around a fault: finer
        let period = Duration::from_millis(if self.tcp { 10 } else { 50 });
        let monitor = Monitor::start(
            start,
            send.pid(),
            recv.pid(),
            output.clone(),
            lab.links,
            period,
        );

        let mut pending = self.actions.into_iter().peekable();
        let mut applied = Vec::new();
        let (mut send_secs, mut recv_secs) = (None, None);
        let mut last_action_at = Duration::ZERO;
        while send_secs.is_none() || recv_secs.is_none() {
            if let Some((at, _)) = pending.peek() {
                if start.elapsed() >= *at {
                    let (_, action) = pending.next().unwrap();
                    let t = apply(lab, &action, start);
                    applied.push((t, action));
                    last_action_at = start.elapsed();
                }
            } else if start.elapsed() >= last_action_at + AFTER_LAST_ACTION
                && feeder.fed() >= self.input.len
            {
                feeder.stop();
            }
            if send_secs.is_none() && send.poll().is_some() {
                send_secs = Some(start.elapsed().as_secs_f64());
            }
            if recv_secs.is_none() && recv.poll().is_some() {
                recv_secs = Some(start.elapsed().as_secs_f64());
            }
            if Instant::now() > self.deadline {
                panic!(
                    "{}: timed out (sender {}, receiver {}); sender said: {}; receiver said: {}",
                    self.name,
                    if send_secs.is_some() {
                        "exited"
                    } else {
                        "running"
                    },
                    if recv_secs.is_some() {
                        "exited"
                    } else {
                        "running"
                    },
                    send.stderr_text().trim(),
                    recv.stderr_text().trim()
                );
            }
            thread::sleep(Duration::from_millis(5));
        }
        let samples = monitor.finish();
        let (sent_sha, sent_len) = feeder.finish();
        lab.heal_all();

        let (ss, rs) = (send.poll().unwrap(), recv.poll().unwrap());
        assert!(
            ss.success() && rs.success(),
            "{}: sender {ss}, receiver {rs}; sender said: {}; receiver said: {}",
            self.name,
            send.stderr_text().trim(),
            recv.stderr_text().trim()
        );
        let (sha, len) = sha256_file(&output);
        assert_eq!(len, sent_len, "{}: received length differs", self.name);
        assert!(
            sha == sent_sha,
            "{}: received data differs (sha256 {} vs {}, seed {})",
            self.name,
            hex(&sha),
            hex(&sent_sha),
            self.input.seed
        );
        let _ = fs::remove_file(&output);
        let outcome = Outcome {
            name: self.name,
            send_secs: send_secs.unwrap(),
            recv_secs: recv_secs.unwrap(),
            applied,
            samples,
            send_json: send.stdout_json(),
            recv_json: recv.stdout_json(),
            links: lab.links,
        };
        // the premise of every action: data was still arriving after the last one
        if let Some(&(t, ref action)) = outcome.applied.last() {
            assert!(
                outcome.resume_after(t).is_some(),
                "{}: no data arrived after {action:?} at {t:.2} s",
                outcome.name
            );
        }
        outcome
    }
}

impl Outcome {
    /// Receive rate of link `link` (1-based) at the receiver between samples i-1 and i, Mbit/s.
    fn link_rx_mbit(&self, i: usize, link: u8) -> f64 {
        let (a, b) = (&self.samples[i - 1], &self.samples[i]);
        let dt = b.t - a.t;
        let l = link as usize - 1;
        if dt <= 0.0 {
            return 0.0;
        }
        (b.rx[l].saturating_sub(a.rx[l])) as f64 * 8.0 / dt / 1e6
    }

    /// Seconds from `t` until link `link` carries more than `mbit` into the receiver again.
    pub fn rejoin_after(&self, t: f64, link: u8, mbit: f64) -> Option<f64> {
        (1..self.samples.len())
            .find(|&i| self.samples[i - 1].t >= t && self.link_rx_mbit(i, link) > mbit)
            .map(|i| self.samples[i - 1].t - t)
    }

    /// The longest time between `from` and `to` in which the output did not grow, seconds
    /// (to within the sampling period).
    pub fn longest_stall(&self, from: f64, to: f64) -> f64 {
        let mut last_growth = from;
        let mut longest: f64 = 0.0;
        for w in self.samples.windows(2) {
            let (a, b) = (&w[0], &w[1]);
            if b.t < from || a.t > to {
                continue;
            }
            if b.out_len > a.out_len {
                longest = longest.max(a.t - last_growth);
                last_growth = b.t;
            }
        }
        longest.max(to.min(self.samples.last().map_or(to, |s| s.t)) - last_growth)
    }

    /// Seconds from `t` until the output grows again.
    pub fn resume_after(&self, t: f64) -> Option<f64> {
        let base = self.samples.iter().rev().find(|s| s.t <= t)?.out_len;
        self.samples
            .iter()
            .find(|s| s.t > t && s.out_len > base)
            .map(|s| s.t - t)
    }

    /// Average receive rate of link `link` between times `from` and `to`, Mbit/s.
    pub fn link_avg_mbit(&self, link: u8, from: f64, to: f64) -> f64 {
        let l = link as usize - 1;
        let a = self.samples.iter().find(|s| s.t >= from);
        let b = self.samples.iter().rev().find(|s| s.t <= to);
        match (a, b) {
            (Some(a), Some(b)) if b.t > a.t => {
                (b.rx[l].saturating_sub(a.rx[l])) as f64 * 8.0 / (b.t - a.t) / 1e6
            }
            _ => 0.0,
        }
    }

    /// Goodput (output growth) between `from` and `to`, Mbit/s.
    pub fn goodput_mbit(&self, from: f64, to: f64) -> f64 {
        let a = self.samples.iter().find(|s| s.t >= from);
        let b = self.samples.iter().rev().find(|s| s.t <= to);
        match (a, b) {
            (Some(a), Some(b)) if b.t > a.t => {
                (b.out_len.saturating_sub(a.out_len)) as f64 * 8.0 / (b.t - a.t) / 1e6
            }
            _ => 0.0,
        }
    }

    pub fn peak_recv_hwm_mib(&self) -> f64 {
        self.samples
            .iter()
            .map(|s| s.recv_hwm_kib)
            .max()
            .unwrap_or(0) as f64
            / 1024.0
    }

    /// The per-link summary of a `--json` report: `L0 up 50% lost 3; ...`.
    pub fn links_line(json: &serde_json::Value) -> String {
        json["links"]
            .as_array()
            .map(|ls| {
                ls.iter()
                    .map(|l| {
                        format!(
                            "L{} {}->{} {} {:.0}% lost {}",
                            l["id"],
                            l["local"].as_str().unwrap_or("?"),
                            l["remote"].as_str().unwrap_or("?"),
                            l["state"].as_str().unwrap_or("?"),
                            l["share"].as_f64().unwrap_or(0.0) * 100.0,
                            l["packets_lost"]
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default()
    }

    /// Reports the figures of this transfer; `fault_link`: the link the actions concern.
    pub fn report(&self, fault_link: Option<u8>) {
        let mib = self.send_json["bytes"].as_u64().unwrap_or(0) as f64 / 1048576.0;
        report(&format!(
            "{}: {mib:.0} MiB in {:.2} s (sender exit; receiver {:.2} s), {:.0} Mbit/s; receiver \
             peak RSS {:.1} MiB",
            self.name,
            self.send_secs,
            self.recv_secs,
            mib * 8.0 * 1.048576 / self.send_secs,
            self.peak_recv_hwm_mib()
        ));
        let fault_at = self
            .applied
            .iter()
            .find(|(_, a)| matches!(a, Action::Fault(..)))
            .map(|(t, _)| *t);
        let heal_at = self
            .applied
            .iter()
            .find(|(_, a)| matches!(a, Action::Heal(..)))
            .map(|(t, _)| *t);
        for (t, a) in &self.applied {
            report(&format!("    at {t:.2} s: {a:?}"));
        }
        if let (Some(link), Some(f)) = (fault_link, fault_at) {
            let end = self.send_secs;
            let h = heal_at.unwrap_or(end).min(end);
            report(&format!(
                "    before the fault: goodput {:.0} Mbit/s; during it: goodput {:.0} Mbit/s, \
                 faulted link {:.1} Mbit/s (rx); after the heal: goodput {:.0} Mbit/s",
                self.goodput_mbit(0.2, f),
                self.goodput_mbit(f, h),
                self.link_avg_mbit(link, f + 0.1, h),
                self.goodput_mbit(h, end)
            ));
            if let Some(h) = heal_at.filter(|h| *h < end) {
                match self.rejoin_after(h, link, 50.0) {
                    Some(d) => report(&format!(
                        "    link {link} carried > 50 Mbit/s again {:.0} ms after the heal",
                        d * 1e3
                    )),
                    None => report(&format!(
                        "    link {link} did not carry > 50 Mbit/s again before the end ({:.2} s after the heal)",
                        end - h
                    )),
                }
            } else if heal_at.is_some() {
                report("    (the transfer ended before the heal)");
            }
        }
        report(&format!(
            "    sender: {}",
            Self::links_line(&self.send_json)
        ));
        report(&format!(
            "    receiver: {}",
            Self::links_line(&self.recv_json)
        ));
        report(&format!(
            "    timeline (receiver rx per link, goodput; Mbit/s per 250 ms): {}",
            self.timeline()
        ));
    }

    /// `t: l1/l2/.. goodput` every 250 ms.
    pub fn timeline(&self) -> String {
        let mut out = Vec::new();
        let mut i0 = 0;
        for i in 1..self.samples.len() {
            let (a, b) = (&self.samples[i0], &self.samples[i]);
            if b.t - a.t >= 0.25 || i == self.samples.len() - 1 {
                let dt = b.t - a.t;
                if dt > 0.0 {
                    let links: Vec<String> = (0..self.links as usize)
                        .map(|l| {
                            format!(
                                "{:.0}",
                                b.rx[l].saturating_sub(a.rx[l]) as f64 * 8.0 / dt / 1e6
                            )
                        })
                        .collect();
                    out.push(format!(
                        "{:.2}:{} {:.0}",
                        a.t,
                        links.join("/"),
                        b.out_len.saturating_sub(a.out_len) as f64 * 8.0 / dt / 1e6
                    ));
                }
                i0 = i;
            }
        }
        out.join(", ")
    }
}

// ---------------------------------------------------------------------------------------------
// Flood

/// What the flood sent.
#[derive(Debug, Default)]
pub struct FloodStats {
    /// Datagrams the system took (the sends that failed are not among them).
    pub sent: u64,
    pub send_errors: u64,
    pub secs: f64,
}

/// One garbage datagram: random bytes, or a well-formed-looking packet of each type (the
/// current version, random CIDs, tokens and frames), or a bit-flipped or exact replay of an
/// earlier one.
fn garbage(rng: &mut ChaCha8Rng, history: &mut Vec<Vec<u8>>) -> Vec<u8> {
    let kind = rng.gen_range(0..8);
    let random = |rng: &mut ChaCha8Rng, n: usize| {
        let mut v = vec![0u8; n];
        rng.fill_bytes(&mut v);
        v
    };
    let d = match kind {
        // anything
        0 => {
            let n = rng.gen_range(1..=1472);
            random(rng, n)
        }
        // SHORT with a random DCID, link, packet number and frame bytes
        1 | 2 => {
            let mut d = vec![VERSION, packet_type::SHORT];
            d.extend(random(rng, 8));
            d.push(rng.gen_range(0..4));
            d.push(rng.gen_range(0..64)); // 1-byte varint packet number
            let n = rng.gen_range(0..1400);
            d.extend(random(rng, n));
            d
        }
        // INITIAL (1200 bytes), with a random token half of the time
        3 => {
            let mut d = vec![VERSION, packet_type::INITIAL];
            d.extend(random(rng, 8)); // SCID
            if rng.gen() {
                d.push(16);
                d.extend(random(rng, 16));
            } else {
                d.push(0);
            }
            d.push(0); // mode: plain
            d.push(13); // parameters: instance, window (4-byte varint), cipher
            d.extend(random(rng, 8));
            d.extend([0x80, 0x10, 0, 0, 2]);
            d.resize(1200, 0);
            d
        }
        // RESET, RETRY, ACCEPT with random contents
        4 => {
            let mut d = vec![VERSION, packet_type::RESET];
            d.extend(random(rng, 8));
            d
        }
        5 => {
            let mut d = vec![
                VERSION,
                rng.gen_range(packet_type::RETRY..=packet_type::ACCEPT),
            ];
            let n = rng.gen_range(8..=180);
            d.extend(random(rng, n));
            d
        }
        // bit-flipped copy of an earlier datagram
        6 if !history.is_empty() => {
            let mut d = history[rng.gen_range(0..history.len())].clone();
            for _ in 0..rng.gen_range(1..=4) {
                let i = rng.gen_range(0..d.len());
                d[i] ^= 1 << rng.gen_range(0..8);
            }
            d
        }
        // exact replay
        _ if !history.is_empty() => history[rng.gen_range(0..history.len())].clone(),
        _ => random(rng, 64),
    };
    if kind != 0 && kind < 6 {
        if history.len() < 256 {
            history.push(d.clone());
        } else {
            let i = rng.gen_range(0..history.len());
            history[i] = d.clone();
        }
    }
    d
}

/// A flood: garbage datagrams sent from inside a lab host to the peer's ports, in bursts of 100
/// every 10 ms (about 10 000 a second). It runs on its own thread: `setns` moves only that thread
/// into the namespace.
pub struct FloodPlan {
    /// The namespace to send from.
    pub ns: String,
    /// Local addresses (4 sockets each).
    pub from: Vec<IpAddr>,
    pub targets: Vec<SocketAddr>,
    /// At most this many datagrams...
    pub max: u64,
    /// ...and for at most this long...
    pub max_time: Duration,
    /// ...after waiting this long.
    pub delay: Duration,
    pub seed: u64,
}

pub fn flood(plan: FloodPlan) -> JoinHandle<FloodStats> {
    let FloodPlan {
        ns,
        from,
        targets,
        max,
        max_time,
        delay,
        seed,
    } = plan;
    thread::spawn(move || {
        thread::sleep(delay);
        let f = File::open(format!("/run/netns/{ns}")).expect("opening the namespace");
        // SAFETY: a valid namespace fd; the call only changes this thread's network namespace.
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns into {ns}: {}", std::io::Error::last_os_error());
        let sockets: Vec<UdpSocket> = from
            .iter()
            .flat_map(|ip| (0..4).map(move |_| UdpSocket::bind((*ip, 0)).expect("flood socket")))
            .collect();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut history = Vec::new();
        let mut stats = FloodStats::default();
        let start = Instant::now();
        'outer: while stats.sent < max && start.elapsed() < max_time {
            for _ in 0..100 {
                let d = garbage(&mut rng, &mut history);
                let s = &sockets[rng.gen_range(0..sockets.len())];
                let to = targets[rng.gen_range(0..targets.len())];
                match s.send_to(&d, to) {
                    Ok(_) => stats.sent += 1,
                    Err(_) => stats.send_errors += 1,
                }
                if stats.sent >= max {
                    break 'outer;
                }
            }
            thread::sleep(Duration::from_millis(10));
        }
        stats.secs = start.elapsed().as_secs_f64();
        stats
    })
}

/// Reads the lines of a file (for messages).
pub fn lines(path: &Path) -> Vec<String> {
    File::open(path)
        .map(|f| BufReader::new(f).lines().map_while(Result::ok).collect())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Tap: capture the links, and replay and mutate what was captured, as an attacker on the path

/// What a tap saw and did.
#[derive(Debug, Default)]
pub struct TapStats {
    /// Frames and bytes captured on the host's link interfaces (both directions).
    pub frames: u64,
    pub bytes: u64,
    /// Captured frames containing the marker.
    pub marker_frames: u64,
    /// Datagrams injected (replayed or mutated), and how many the system refused to send.
    pub injected: u64,
    pub mutated: u64,
    pub inject_errors: u64,
    pub secs: f64,
}

/// A tap inside a lab host's namespace. It captures every frame on the host's link interfaces
/// (`eth1`..) and, with `inject_per_sec` > 0, re-sends UDP datagrams the host sent to `port`,
/// from the host's own addresses and ports (raw IP socket): half exact replays, half with one
/// bit flipped (UDP checksum 0, so the receiver's stack delivers them). It runs on its own
/// thread until `stop` is set or `max_time` passed.
pub struct TapPlan {
    pub ns: String,
    pub links: u8,
    pub port: u16,
    pub marker: Vec<u8>,
    pub inject_per_sec: u64,
    pub max_time: Duration,
    pub stop: Arc<AtomicBool>,
    pub seed: u64,
}

/// A datagram seen leaving the host: source, destination, payload.
struct Seen {
    src: std::net::SocketAddrV4,
    dst: std::net::SocketAddrV4,
    payload: Vec<u8>,
}

pub fn tap(plan: TapPlan) -> JoinHandle<TapStats> {
    thread::spawn(move || {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let start = Instant::now();
        let injector = (plan.inject_per_sec > 0).then(|| {
            let (ns, seen, stop) = (plan.ns.clone(), seen.clone(), plan.stop.clone());
            let (rate, max_time, seed) = (plan.inject_per_sec, plan.max_time, plan.seed);
            thread::spawn(move || inject(&ns, &seen, rate, max_time, &stop, seed))
        });
        enter_netns(&plan.ns);
        let captures: Vec<OwnedFd> = (1..=plan.links)
            .map(|l| capture_socket(&format!("eth{l}")))
            .collect();
        let mut rng = ChaCha8Rng::seed_from_u64(plan.seed ^ 1);
        let mut stats = TapStats::default();
        let mut buf = vec![0u8; 1 << 17];
        while !plan.stop.load(Ordering::Relaxed) && start.elapsed() < plan.max_time {
            let mut idle = true;
            for c in &captures {
                for _ in 0..64 {
                    let Some((outgoing, n)) = recv_frame(c, &mut buf) else {
                        break;
                    };
                    idle = false;
                    // a virtio_net_hdr (10 bytes) precedes the frame: its gso_size splits
                    // a GSO super-packet into the datagrams it carries
                    let (vnet, frame) = buf[..n].split_at(10);
                    stats.frames += 1;
                    stats.bytes += frame.len() as u64;
                    if !plan.marker.is_empty()
                        && frame.windows(plan.marker.len()).any(|w| w == plan.marker)
                    {
                        stats.marker_frames += 1;
                    }
                    if outgoing && injector.is_some() {
                        let gso_size = u16::from_ne_bytes([vnet[4], vnet[5]]) as usize;
                        let gso = if vnet[1] == 5 { gso_size } else { 0 };
                        collect(frame, plan.port, gso, &mut seen.lock().unwrap(), &mut rng);
                    }
                }
            }
            if idle {
                thread::sleep(Duration::from_micros(200));
            }
        }
        stats.secs = start.elapsed().as_secs_f64();
        if let Some(i) = injector {
            let (injected, mutated, errors) = i.join().expect("the injector panicked");
            stats.injected = injected;
            stats.mutated = mutated;
            stats.inject_errors = errors;
        }
        stats
    })
}

/// Moves the calling thread into a lab namespace.
fn enter_netns(ns: &str) {
    let f = File::open(format!("/run/netns/{ns}")).expect("opening the namespace");
    // SAFETY: a valid namespace fd; the call only changes this thread's network namespace.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns into {ns}: {}", std::io::Error::last_os_error());
}

/// The injector: `rate` datagrams a second, in bursts every millisecond, picked from what the
/// capture saw; returns (sent, mutated, refused).
fn inject(
    ns: &str,
    seen: &Mutex<Vec<Seen>>,
    rate: u64,
    max_time: Duration,
    stop: &AtomicBool,
    seed: u64,
) -> (u64, u64, u64) {
    enter_netns(ns);
    // SAFETY: plain socket(2); the descriptor is owned from here on.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    assert!(raw >= 0, "raw socket: {}", std::io::Error::last_os_error());
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let raw = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut sent, mut mutated, mut errors) = (0, 0, 0);
    let start = Instant::now();
    let mut next_burst = start;
    let burst = (rate / 1000).max(1);
    let mut batch = Vec::new();
    while !stop.load(Ordering::Relaxed) && start.elapsed() < max_time {
        let now = Instant::now();
        if now < next_burst {
            thread::sleep(next_burst - now);
            continue;
        }
        next_burst += Duration::from_millis(1);
        batch.clear();
        {
            let seen = seen.lock().unwrap();
            if seen.is_empty() {
                continue;
            }
            for _ in 0..burst {
                let d = &seen[rng.gen_range(0..seen.len())];
                batch.push((d.src, d.dst, d.payload.clone()));
            }
        }
        for (src, dst, payload) in &mut batch {
            if rng.gen() {
                let bit = rng.gen_range(0..payload.len() * 8);
                payload[bit / 8] ^= 1 << (bit % 8);
                mutated += 1;
            }
            if send_raw(&raw, *src, *dst, payload) {
                sent += 1;
            } else {
                errors += 1;
            }
        }
    }
    (sent, mutated, errors)
}

/// A packet socket capturing every frame of interface `name`, both directions, each preceded
/// by its virtio_net_hdr; non-blocking.
fn capture_socket(name: &str) -> OwnedFd {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2); the descriptor is owned from here on.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK,
            i32::from(proto),
        )
    };
    assert!(
        fd >= 0,
        "packet socket: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let cname = std::ffi::CString::new(name).unwrap();
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    assert!(index > 0, "no interface {name}");
    set_int_option(
        &fd,
        libc::SOL_PACKET,
        libc::PACKET_VNET_HDR,
        1,
        "PACKET_VNET_HDR",
    );
    // room for bursts while the tap injects (root may exceed the system's default maximum)
    set_int_option(
        &fd,
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        256 << 20,
        "SO_RCVBUFFORCE",
    );
    // SAFETY: an all-zero sockaddr_ll is valid; the fields set below complete it.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = index as i32;
    // SAFETY: binding to a valid sockaddr_ll of the right size.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    assert_eq!(
        r,
        0,
        "binding to {name}: {}",
        std::io::Error::last_os_error()
    );
    fd
}

/// setsockopt(2) of an int option; panics (naming `what`) if the system refuses it.
fn set_int_option(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
    what: &str,
) {
    // SAFETY: setsockopt with a valid int option value of the right size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "{what}: {}", std::io::Error::last_os_error());
}

/// The next captured frame (vnet header included) and whether the host sent it.
fn recv_frame(fd: &OwnedFd, buf: &mut [u8]) -> Option<(bool, usize)> {
    // SAFETY: as above; recvfrom fills at most `buf.len()` bytes and the address.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    let n = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            0,
            (&mut sll as *mut libc::sockaddr_ll).cast(),
            &mut len,
        )
    };
    (n > 10).then_some((sll.sll_pkttype == libc::PACKET_OUTGOING, n as usize))
}

/// The UDP datagrams to `port` an outgoing IPv4 frame carries (`gso_size` > 0: a GSO
/// super-packet of datagrams of that size), kept in `seen` (at most 4096, older ones replaced).
fn collect(frame: &[u8], port: u16, gso_size: usize, seen: &mut Vec<Seen>, rng: &mut ChaCha8Rng) {
    if frame.len() < 14 + 20 + 8 || frame[12..14] != [0x08, 0x00] {
        return;
    }
    let ip = &frame[14..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ip[9] != 17 || ip.len() < ihl + 8 {
        return;
    }
    let udp = &ip[ihl..];
    let (sport, dport) = (
        u16::from_be_bytes([udp[0], udp[1]]),
        u16::from_be_bytes([udp[2], udp[3]]),
    );
    if dport != port {
        return;
    }
    let src = std::net::SocketAddrV4::new(
        std::net::Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
        sport,
    );
    let dst = std::net::SocketAddrV4::new(
        std::net::Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
        dport,
    );
    let payload = &udp[8..];
    let size = if gso_size > 0 {
        gso_size
    } else {
        payload.len()
    };
    for d in payload.chunks(size.max(1)) {
        let s = Seen {
            src,
            dst,
            payload: d.to_vec(),
        };
        if seen.len() < 4096 {
            seen.push(s);
        } else {
            let i = rng.gen_range(0..seen.len());
            seen[i] = s;
        }
    }
}

/// Sends `payload` as a UDP datagram from `src` to `dst` through a raw IP socket (the kernel
/// fills in the IP checksum and length; UDP checksum 0: none, which IPv4 allows).
fn send_raw(
    fd: &OwnedFd,
    src: std::net::SocketAddrV4,
    dst: std::net::SocketAddrV4,
    payload: &[u8],
) -> bool {
    let total = 20 + 8 + payload.len();
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    p.extend_from_slice(&src.ip().octets());
    p.extend_from_slice(&dst.ip().octets());
    p.extend_from_slice(&src.port().to_be_bytes());
    p.extend_from_slice(&dst.port().to_be_bytes());
    p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    send_ip(fd, dst.ip().octets(), &p)
}

/// Sends the IPv4 packet `p` (header included) to `dst` through the raw IP socket `fd`.
fn send_ip(fd: &OwnedFd, dst: [u8; 4], p: &[u8]) -> bool {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(dst),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sendto with a valid buffer and address of the right size.
    let n = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            p.as_ptr().cast(),
            p.len(),
            0,
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    n == p.len() as isize
}

// ---------------------------------------------------------------------------------------------
// ICMP forger: "port unreachable" from the peer, as an attacker reading the links would send

/// What an ICMP forger sent.
#[derive(Debug, Default)]
pub struct IcmpStats {
    /// Forged errors quoting a datagram the host really sent (an attacker on the path).
    pub quoting: u64,
    /// Forged errors with the right addresses and ports and a made-up datagram (a blind
    /// attacker who guessed the ports).
    pub blind: u64,
    /// Sends the system refused.
    pub errors: u64,
    /// When the first and the last were sent.
    pub first: Option<Instant>,
    pub last: Option<Instant>,
}

/// A forger inside a lab host's namespace: it captures the UDP datagrams the host sends to or
/// from `port` on its link interfaces and, `per_sec` times a second (in bursts every
/// millisecond, alternately quoting and blind), answers one of the latest with an ICMP "port
/// unreachable" that claims to come from its destination, delivered to the host itself through
/// a raw socket (the kernel then hands it to the sending socket, as it would a real one). It
/// runs until `stop` is set or `max_time` passed. It starts [`FORGE_AFTER`] after the first
/// datagram it captured: a "port unreachable" for a handshake ends it at once, by design (a
/// closed port is reported at once), so forging earlier would test that instead of a
/// connection under attack.
pub struct IcmpPlan {
    pub ns: String,
    pub links: u8,
    pub port: u16,
    pub per_sec: u64,
    pub max_time: Duration,
    pub stop: Arc<AtomicBool>,
    pub seed: u64,
}

/// How long after the first datagram it sees an ICMP forger starts: far longer than a
/// handshake takes, even on a loaded host.
const FORGE_AFTER: Duration = Duration::from_millis(500);

/// Bytes of the refused datagram a forged error quotes: its IP and UDP headers and the start
/// of its payload (a ri2n header), as Linux quotes.
const ICMP_QUOTE: usize = 20 + 8 + 32;

pub fn icmp_forger(plan: IcmpPlan) -> JoinHandle<IcmpStats> {
    thread::spawn(move || {
        enter_netns(&plan.ns);
        let captures: Vec<OwnedFd> = (1..=plan.links)
            .map(|l| capture_socket(&format!("eth{l}")))
            .collect();
        // SAFETY: plain socket(2); the descriptor is owned from here on.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
        assert!(raw >= 0, "raw socket: {}", std::io::Error::last_os_error());
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let raw = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut rng = ChaCha8Rng::seed_from_u64(plan.seed);
        let mut latest: Vec<Vec<u8>> = Vec::new();
        let mut stats = IcmpStats::default();
        let mut buf = vec![0u8; 1 << 17];
        let start = Instant::now();
        let mut next_burst = start;
        // when the first datagram was captured
        let mut first_seen: Option<Instant> = None;
        let burst = (plan.per_sec / 1000).max(1);
        while !plan.stop.load(Ordering::Relaxed) && start.elapsed() < plan.max_time {
            for c in &captures {
                for _ in 0..64 {
                    let Some((outgoing, n)) = recv_frame(c, &mut buf) else {
                        break;
                    };
                    // (the 10-byte virtio_net_hdr first)
                    let frame = &buf[10..n];
                    if outgoing {
                        if let Some(q) = quotable(frame, plan.port) {
                            first_seen.get_or_insert_with(Instant::now);
                            if latest.len() < 64 {
                                latest.push(q);
                            } else {
                                let i = rng.gen_range(0..latest.len());
                                latest[i] = q;
                            }
                        }
                    }
                }
            }
            if first_seen.is_none_or(|t| t.elapsed() < FORGE_AFTER) {
                // the bursts start from now, not in a catch-up of the time waited
                next_burst = Instant::now();
                thread::sleep(Duration::from_micros(200));
                continue;
            }
            if Instant::now() < next_burst {
                thread::sleep(Duration::from_micros(200));
                continue;
            }
            next_burst += Duration::from_millis(1);
            for _ in 0..burst {
                let mut quote = latest[rng.gen_range(0..latest.len())].clone();
                let blind = (stats.quoting + stats.blind) % 2 == 1;
                if blind {
                    rng.fill_bytes(&mut quote[28..]);
                }
                if send_icmp_refusal(&raw, &quote) {
                    if blind {
                        stats.blind += 1;
                    } else {
                        stats.quoting += 1;
                    }
                    let now = Instant::now();
                    stats.first.get_or_insert(now);
                    stats.last = Some(now);
                } else {
                    stats.errors += 1;
                }
            }
        }
        stats
    })
}

/// The start of an outgoing IPv4 UDP datagram to or from `port` (headers and the first bytes
/// of its payload), as an ICMP error would quote it.
fn quotable(frame: &[u8], port: u16) -> Option<Vec<u8>> {
    if frame.len() < 14 + ICMP_QUOTE || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &frame[14..];
    if ip[0] != 0x45 || ip[9] != 17 {
        return None;
    }
    let (sport, dport) = (
        u16::from_be_bytes([ip[20], ip[21]]),
        u16::from_be_bytes([ip[22], ip[23]]),
    );
    (sport == port || dport == port).then(|| ip[..ICMP_QUOTE].to_vec())
}

/// Sends an ICMP "port unreachable" quoting `quote` (an IPv4 datagram's start), from the
/// quoted datagram's destination to its source.
fn send_icmp_refusal(fd: &OwnedFd, quote: &[u8]) -> bool {
    let (src, dst) = (&quote[16..20], &quote[12..16]);
    let total = 20 + 8 + quote.len();
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 1, 0, 0]);
    p.extend_from_slice(src);
    p.extend_from_slice(dst);
    let icmp_at = p.len();
    p.extend_from_slice(&[3, 3, 0, 0, 0, 0, 0, 0]);
    p.extend_from_slice(quote);
    let sum = internet_checksum(&p[icmp_at..]);
    p[icmp_at + 2..icmp_at + 4].copy_from_slice(&sum.to_be_bytes());
    send_ip(fd, dst.try_into().unwrap(), &p)
}

/// The one's-complement sum of RFC 1071, over `data`.
fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}
