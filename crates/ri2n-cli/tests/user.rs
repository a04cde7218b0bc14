//! What a new user meets, on loopback: the README's library example against the commands it
//! names, commands that reach the wrong kind of peer, a link that never comes up, and the
//! small things (a key in a directory not made yet, an output that fills the disk, JSON on
//! failure, help that names its exit codes and checksum).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Starts `command` with its output captured and, if `udp_port` is given, waits until it has
/// bound that UDP port on 127.0.0.1: a UDP sender that comes first is told at once that
/// nothing listens (a fixed pause was too short on a loaded host).
fn listening(name: &'static str, command: &mut Command, udp_port: Option<u16>) -> Proc {
    let p = Proc::spawn(name, command.stdout(Stdio::piped()).stderr(Stdio::piped()));
    if let Some(port) = udp_port {
        wait_udp_bound(port, Duration::from_secs(10));
    }
    p
}

/// `ri2n ARGS` listening on 127.0.0.1 only, at a free port, bound when this returns (on the
/// TCP transport, `--transport tcp`, the caller waits: see `wait_tcp_listening`); returns it
/// and its address.
fn ri2n_listening(args: &[&str]) -> (Proc, String) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let tcp = args.windows(2).any(|w| w == ["--transport", "tcp"]);
    let p = listening(
        "ri2n",
        Command::new(bin())
            .args([args[0], "--listen", &listen])
            .args(&args[1..]),
        (!tcp).then_some(port),
    );
    (p, listen)
}

/// The README's Rust code block and the example file the tests run are the same text.
#[test]
fn the_readme_library_example_is_the_example_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let blocks: Vec<&str> = readme
        .split("```rust\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    let example = std::fs::read_to_string(root.join("crates/ri2n/examples/readme.rs")).unwrap();
    assert_eq!(blocks, [example.as_str()], "README.md's ```rust blocks");
}

/// The README example, built (`cargo test` builds the workspace's examples; a narrower run
/// builds it here).
fn readme_example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let path = profile_dir.join("examples/readme");
    if !path.exists() {
        let mut cargo = Command::new(env!("CARGO"));
        cargo.args(["build", "-p", "ri2n", "--example", "readme"]);
        if profile_dir.ends_with("release") {
            cargo.arg("--release");
        }
        assert!(cargo.status().unwrap().success(), "building the example");
    }
    path
}

/// The example sends "hello" to `ri2n recv`, and receives a file from `ri2n send` whole.
#[test]
fn the_readme_library_example_runs_against_recv_and_send() {
    let example = readme_example();
    let output = TempFile::new("readme-out");
    let (recv, to) = spawn_recv(free_port(), output.path(), &[]);
    let (s, o) = Proc::spawn(
        "readme send",
        Command::new(&example)
            .args(["send", &to])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .wait(Duration::from_secs(20));
    assert!(s.success(), "example send: {s}: {}", stderr_of(&o));
    let (r, ro) = recv.wait(Duration::from_secs(10));
    assert!(r.success(), "recv: {r}: {}", stderr_of(&ro));
    assert_eq!(std::fs::read(output.path()).unwrap(), b"hello");

    let input = TempFile::new("readme-in");
    write_random(input.path(), 3 << 20, 41);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let receiver = listening(
        "readme recv",
        Command::new(&example).args(["recv", &listen]),
        Some(port),
    );
    // its stdout read meanwhile: `ri2n send` ends once the receiver is done with what it got,
    // and the example is done once it wrote it all out
    let receiver = std::thread::spawn(move || receiver.wait(Duration::from_secs(20)));
    let (s, so) = send_file(&listen, input.path(), &[]);
    assert!(s.success(), "ri2n send: {s}: {}", stderr_of(&so));
    let (r, ro) = receiver.join().unwrap();
    assert!(r.success(), "example recv: {r}: {}", stderr_of(&ro));
    let got = std::fs::read(input.path()).unwrap();
    assert_eq!(ro.stdout.len(), got.len(), "bytes on the example's stdout");
    assert!(
        ro.stdout == got,
        "the example's stdout differs from the file sent"
    );
}

/// `ri2n send` of 20 MiB to a `ri2n serve` port is refused in the handshake: send exits 3 at
/// once naming what it found, and serve logs the refusal naming both commands.
#[test]
fn send_to_serve_is_refused_at_once_on_both_sides() {
    let (mut serve, listen) = ri2n_listening(&["serve"]);
    let input = TempFile::new("to-serve");
    write_random(input.path(), 20 << 20, 3);
    let start = Instant::now();
    let (s, o) = send_file(&listen, input.path(), &[]);
    let took = start.elapsed();
    let err = stderr_of(&o);
    assert_eq!(s.code(), Some(3), "exit code; stderr: {err}");
    assert!(took < Duration::from_secs(3), "refused after {took:?}");
    assert!(err.contains("is `ri2n serve`"), "says what it found: {err}");
    // serve logs the refusal (it looks for refusals to log every 200 ms)
    serve.wait_for_stderr("refused a connection", Duration::from_secs(10));
    serve.signal(libc::SIGTERM);
    let (_, so) = serve.wait(Duration::from_secs(10));
    let log = stderr_of(&so);
    assert!(log.contains("`ri2n recv`"), "names the sender: {log}");
}

/// `ri2n bench --to` a `ri2n recv` port is refused at once; recv keeps waiting for a real
/// sender, logs the refusal, saves nothing, and leaves no `.partial` when it gives up.
#[test]
fn bench_to_recv_is_refused_and_recv_saves_nothing() {
    let output = TempFile::new("bench-to-recv");
    let (recv, to) = spawn_recv(free_port(), output.path(), &["--accept-timeout", "3"]);
    let (s, o) = ri2n(
        ["bench", "--to", &to, "--time", "2"],
        Duration::from_secs(20),
    );
    let err = stderr_of(&o);
    assert_eq!(s.code(), Some(3), "bench exit code; stderr: {err}");
    assert!(err.contains("is `ri2n recv`"), "says what it found: {err}");
    let (r, ro) = recv.wait(Duration::from_secs(10));
    let log = stderr_of(&ro);
    assert_eq!(r.code(), Some(3), "recv gives up without a sender: {log}");
    assert!(
        log.contains("refused a connection") && log.contains("`ri2n serve`"),
        "recv logs the refusal: {log}"
    );
    assert!(!output.path().exists(), "no output file");
    assert!(!output.partial().exists(), "no .partial left");
}

/// A second `--to` where nothing listens: the file goes over the link that works, both
/// commands exit 0, and send warns that the other link never came up (JSON: `came_up`).
#[test]
fn a_link_that_never_came_up_is_a_warning_not_a_failure() {
    let input = TempFile::new("one-dead-link-in");
    let output = TempFile::new("one-dead-link-out");
    let sent = write_random(input.path(), 20 << 20, 7);
    let (recv, a) = ri2n_listening(&["recv", "--output", output.path().to_str().unwrap()]);
    let dead = format!("127.0.0.2:{}", free_port());
    let (s, o) = send_file(&a, input.path(), &["--to", &dead, "--json"]);
    let err = stderr_of(&o);
    assert_eq!(s.code(), Some(0), "send exit code; stderr: {err}");
    assert!(
        err.contains("warning: link 1") && err.contains("never came up"),
        "warns of the dead link: {err}"
    );
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["links"][0]["came_up"], true);
    assert_eq!(json["links"][1]["came_up"], false);
    // the close completes over the working link: it is not left to fail after the receiver
    // went away
    assert_eq!(json["links"][0]["state"], "up", "{json}");
    let (r, ro) = recv.wait(Duration::from_secs(10));
    let log = stderr_of(&ro);
    assert_eq!(r.code(), Some(0), "recv: {log}");
    assert!(
        log.contains("link 0 validating -> up"),
        "recv names link 0: {log}"
    );
    assert_eq!(sha256_file(output.path()), (sent, 20 << 20));
}

/// Over the TCP transport, the links that carried a transfer came up: neither command warns
/// that one never did, and the JSON says `came_up`. (The TCP transport counts no packets,
/// and the warning looked at packets only: every link was reported dead.) What it does not
/// count is shown as unknown, not as none: null in the JSON, no "lost 0" in the summary.
#[test]
fn over_tcp_the_links_that_carried_a_transfer_came_up() {
    let input = TempFile::new("tcp-links-in");
    let output = TempFile::new("tcp-links-out");
    let sent = write_random(input.path(), 4 << 20, 9);
    let out = output.path().to_str().unwrap();
    let (recv, a) = ri2n_listening(&["recv", "--transport", "tcp", "--output", out]);
    // a TCP-transport client is refused at once by a port nobody listens on yet
    wait_tcp_listening(&a, Duration::from_secs(10));
    let (s, o) = send_file(&a, input.path(), &["--transport", "tcp", "--json"]);
    let err = stderr_of(&o);
    assert_eq!(s.code(), Some(0), "send exit code; stderr: {err}");
    assert!(!err.contains("never came up"), "send: {err}");
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["links"][0]["came_up"], true, "{json}");
    for field in [
        "packets_sent",
        "packets_received",
        "packets_lost",
        "max_datagram",
        "refusals",
    ] {
        assert!(json["links"][0][field].is_null(), "{field}: {json}");
    }
    assert!(json["send_limits"].is_null(), "the kernel sends: {json}");
    let (r, ro) = recv.wait(Duration::from_secs(10));
    let log = stderr_of(&ro);
    assert_eq!(r.code(), Some(0), "recv: {log}");
    assert!(!log.contains("never came up"), "recv: {log}");
    assert!(log.contains("received 4.00 MiB"), "recv's summary: {log}");
    assert!(!log.contains(" lost "), "recv's summary: {log}");
    assert_eq!(sha256_file(output.path()), (sent, 4 << 20));
}

/// `ri2n keygen --output DIR/cluster.key` on a host without DIR makes it, private.
#[test]
fn keygen_creates_a_missing_directory_privately() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempFile::new("keydir");
    let path = dir.path().join("etc-ri2n/cluster.key");
    let (s, o) = ri2n(
        ["keygen", "--output", path.to_str().unwrap()],
        Duration::from_secs(10),
    );
    assert!(s.success(), "keygen: {}", stderr_of(&o));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    assert_eq!(mode(&path), 0o600);
    std::fs::remove_dir_all(dir.path()).unwrap();
}

/// `ri2n keygen --force` that cannot write the new key (here a file size limit of 10
/// bytes, as a full disk would) fails and leaves the old key whole, and no other file.
#[test]
fn a_failed_keygen_force_keeps_the_old_key() {
    let dir = TempFile::dir("keyforce");
    let path = dir.path().join("cluster.key");
    let (s, o) = ri2n(
        ["keygen", "--output", path.to_str().unwrap()],
        Duration::from_secs(10),
    );
    assert!(s.success(), "keygen: {}", stderr_of(&o));
    let old = std::fs::read_to_string(&path).unwrap();
    // SIGXFSZ ignored (inherited through exec): the write fails with EFBIG instead
    let o = Command::new("sh")
        .args([
            "-c",
            r#"trap "" XFSZ; exec prlimit --fsize=10 -- "$@""#,
            "sh",
        ])
        .arg(bin())
        .args(["keygen", "--force", "--output"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "keygen: {}", stderr_of(&o));
    assert!(
        stderr_of(&o).contains("File too large"),
        "the premise: the write failed ({})",
        stderr_of(&o)
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), old);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["cluster.key"]);
    std::fs::remove_dir_all(dir.path()).unwrap();
}

/// A receiver whose output cannot take the data says how much it holds, and the sender's
/// error carries that figure (not only what the receiver acknowledged).
#[test]
fn a_full_output_is_reported_with_what_it_holds() {
    let input = TempFile::new("to-full");
    write_random(input.path(), 4 << 20, 9);
    let (recv, a) = ri2n_listening(&["recv", "--output", "/dev/full"]);
    let (s, o) = send_file(&a, input.path(), &[]);
    let err = stderr_of(&o);
    assert_eq!(s.code(), Some(4), "send exit code; stderr: {err}");
    // /dev/full takes no byte: what sat in the receiver's buffer never went to it (before,
    // the figure was what had been handed to that buffer)
    assert!(
        err.contains("could not write its output (No space left")
            && err.contains("; 0 bytes went to it before"),
        "send says what the receiver holds: {err}"
    );
    let (r, ro) = recv.wait(Duration::from_secs(10));
    let log = stderr_of(&ro);
    assert_eq!(r.code(), Some(1), "recv: {log}");
    assert!(log.contains("No space left"), "recv says why: {log}");
    assert!(log.contains("(0 bytes went to it before)"), "{log}");
}

/// `send --json` that fails still prints one JSON document on stdout, with the error and
/// the exit code.
#[test]
fn a_failed_send_with_json_prints_a_json_error() {
    let closed = format!("127.0.0.1:{}", free_port());
    let (s, o) = ri2n(
        ["send", "--to", &closed, "--input", "/dev/null", "--json"],
        Duration::from_secs(20),
    );
    assert_eq!(s.code(), Some(3));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}", o.stdout));
    assert_eq!(json["command"], "send");
    assert_eq!(json["exit_code"], 3);
    assert!(json["error"].as_str().unwrap().contains("nothing listens"));
}

/// The JSON failure of `--json` comes whichever way the command fails: a value the option
/// parser refuses (exit 2, `-J` among other short flags too, and `--json` after the refused
/// word, where the parser stops) and a SIGINT while `recv` waits for a sender (130). Each
/// printed nothing on stdout.
#[test]
fn usage_errors_and_interrupts_with_json_print_a_json_error() {
    let json_of = |o: &std::process::Output| -> serde_json::Value {
        serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", stderr_of(o)))
    };
    let to = format!("127.0.0.1:{}", free_port());
    for (command, args) in [
        (
            "send",
            vec!["send", "--to", &to, "--json", "--connect-timeout", "0"],
        ),
        (
            "bench",
            vec!["bench", "--to", &to, "-RJ", "--latency", "--time", "3"],
        ),
        ("bench", vec!["bench", "-P", "0", "--json", "--to", &to]),
        ("bench", vec!["bench", "--bogus", "--json", "--to", &to]),
        ("send", vec!["send", "--to", "garbage", "--json"]),
        (
            "tunnel status",
            vec!["tunnel", "status", "--bogus", "--json"],
        ),
    ] {
        let (s, o) = ri2n(args, Duration::from_secs(10));
        assert_eq!(s.code(), Some(2), "{command}: {}", stderr_of(&o));
        let json = json_of(&o);
        assert_eq!(json["command"], command, "{json}");
        assert_eq!(json["exit_code"], 2, "{json}");
        assert!(
            json["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{json}"
        );
    }
    // without --json (a value that looks like -J is no flag), stdout stays empty
    for args in [
        vec!["send", "--to", &to, "--connect-timeout", "0"],
        vec!["send", "-iJSON.in", "--to", &to, "--connect-timeout", "0"],
    ] {
        let (s, o) = ri2n(args, Duration::from_secs(10));
        assert_eq!(
            (s.code(), o.stdout.len()),
            (Some(2), 0),
            "{}",
            stderr_of(&o)
        );
    }

    let output = TempFile::new("interrupted-json");
    let port = free_port();
    // it binds only once its signal handler is in place, and spawn_recv returns then
    let (recv, _) = spawn_recv(port, output.path(), &["--json"]);
    recv.signal(libc::SIGINT);
    let (s, o) = recv.wait(Duration::from_secs(10));
    assert_eq!(s.code(), Some(130), "{}", stderr_of(&o));
    let json = json_of(&o);
    assert_eq!(
        (&json["command"], &json["exit_code"]),
        (&"recv".into(), &130.into())
    );
    assert!(!output.partial().exists(), "a .partial left");
}

/// Each command's help lists the exit codes it can have, and only those; send and recv name
/// the checksum.
#[test]
fn help_lists_each_commands_own_exit_codes_and_names_the_checksum() {
    let help = |cmd: &str| {
        let (s, o) = ri2n([cmd, "--help"], Duration::from_secs(10));
        assert!(s.success());
        String::from_utf8(o.stdout).unwrap()
    };
    for cmd in ["keygen", "demo"] {
        let h = help(cmd);
        assert!(h.contains("Exit codes:"), "{cmd} --help: {h}");
        assert!(
            !h.contains("--all-links-down-timeout)"),
            "{cmd} --help: {h}"
        );
    }
    assert!(help("keygen").contains("mode 0700"));
    for cmd in ["send", "recv"] {
        let h = help(cmd);
        assert!(h.contains("XXH3-64"), "{cmd} --help names the checksum");
        assert!(
            h.contains("connection lost"),
            "{cmd} --help lists exit code 4"
        );
    }
    // serve runs until a signal: it never exits 3 or 4, and a failed client is not its end
    let serve = help("serve");
    assert!(serve.contains("cannot bind"), "serve --help: {serve}");
    assert!(
        !serve.contains("  3  ") && !serve.contains("  4  ") && !serve.contains("  0  "),
        "serve --help: {serve}"
    );
}

/// Over `--transport tcp`, a receiver killed mid-transfer is reported by the sender: its host
/// resets the links' TCP connections and refuses new ones, so the sender exits 4 saying the
/// peer is gone instead of waiting for links that will never come back.
#[test]
fn tcp_transport_a_killed_receiver_is_reported_by_the_sender() {
    use std::io::Write;
    let output = TempFile::new("tcp-killed");
    let (mut recv, to) = spawn_recv(free_port(), output.path(), &["--transport", "tcp"]);
    let mut send = spawn_piped_send(&to, &["--transport", "tcp", "--input", "-"]);
    let mut stdin = send.child.as_mut().unwrap().stdin.take().unwrap();
    let chunk = vec![0x5a_u8; 1 << 20];
    stdin.write_all(&chunk).unwrap();
    // the premise: data arrived before the kill
    wait_file_grows(&output.partial(), Duration::from_secs(10));
    recv.signal(libc::SIGKILL);
    let _ = recv.child.as_mut().unwrap().wait();
    let killed = Instant::now();
    // the sender learns it at its next write at the latest
    let _ = stdin.write_all(&chunk);
    drop(stdin);
    let (s, o) = send.wait(Duration::from_secs(20));
    let err = stderr_of(&o);
    assert_eq!(s.code(), Some(4), "exit code; stderr: {err}");
    assert!(err.contains("peer is gone"), "says why: {err}");
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "noticed {:?} after the kill",
        killed.elapsed()
    );
}

/// `recv --listen ADDR:0` says on stderr which ports it took, also where stderr is no
/// terminal, so that a script can give the sender one; and a transfer to it arrives. Before,
/// the line was printed to a terminal only.
#[test]
fn recv_on_port_0_says_where_it_listens() {
    use std::io::Write;
    let output = TempFile::new("port-0");
    let mut recv = Proc::spawn(
        "ri2n recv",
        Command::new(bin())
            .args(["recv", "--listen", "127.0.0.1:0", "--listen", "127.0.0.2:0"])
            .arg("--output")
            .arg(output.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    recv.wait_for_stderr_that("its listening line", Duration::from_secs(10), |t| {
        (t.lines()).any(|l| l.starts_with("ri2n: listening on ")) && t.ends_with('\n')
    });
    let said = recv.stderr_text();
    let line = (said.lines())
        .find_map(|l| l.strip_prefix("ri2n: listening on "))
        .unwrap_or_else(|| panic!("no listening line: {said}"));
    let to = (line.split(|c: char| c == ',' || c.is_whitespace()))
        .find(|a| a.starts_with("127.0.0.1:"))
        .unwrap_or_else(|| panic!("no 127.0.0.1 address: {line}"));
    let port: u16 = to["127.0.0.1:".len()..].parse().unwrap();
    assert_ne!(port, 0, "{line}");
    assert!(line.contains("127.0.0.2:"), "both addresses named: {line}");
    let mut send = spawn_piped_send(to, &["--input", "-"]);
    let mut stdin = send.child.as_mut().unwrap().stdin.take().unwrap();
    let sent = vec![0x3c_u8; 1 << 20];
    stdin.write_all(&sent).unwrap();
    drop(stdin);
    let (s, o) = send.wait(Duration::from_secs(20));
    assert!(s.success(), "send: {}", stderr_of(&o));
    let (r, o) = recv.wait(Duration::from_secs(20));
    assert!(r.success(), "recv: {}", stderr_of(&o));
    assert!(
        std::fs::read(output.path()).unwrap() == sent,
        "bytes differ"
    );
}

/// Over `--transport tcp`, a sender killed while its links are idle is reported by the
/// receiver: the sender's host closes the links' TCP connections and answers the receiver's
/// closes of them, so the receiver, which never dials, exits 4 saying the peer is gone. (A
/// close that no host answers is a peer that replaced its links through a path dark one way,
/// not a peer gone: the lab's `tcp_transport_through_every_path_dark_one_way_while_the_sender_is_idle`.)
#[test]
fn tcp_transport_a_killed_idle_sender_is_reported_by_the_receiver() {
    use std::io::Write;
    let output = TempFile::new("tcp-killed-sender");
    let (recv, to) = spawn_recv(free_port(), output.path(), &["--transport", "tcp"]);
    let mut send = spawn_piped_send(&to, &["--transport", "tcp", "--input", "-"]);
    let mut stdin = send.child.as_mut().unwrap().stdin.take().unwrap();
    stdin.write_all(&vec![0x5a_u8; 1 << 20]).unwrap();
    // the premise: data arrived before the kill, and the sender has nothing left to send
    wait_file_grows(&output.partial(), Duration::from_secs(10));
    let arrived = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(output.partial()).map_or(0, |m| m.len()) < 1 << 20 {
        assert!(
            Instant::now() < arrived,
            "the sender's bytes never all arrived"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    send.signal(libc::SIGKILL);
    let _ = send.child.as_mut().unwrap().wait();
    let killed = Instant::now();
    drop(stdin);
    let (r, o) = recv.wait(Duration::from_secs(20));
    let err = stderr_of(&o);
    assert_eq!(r.code(), Some(4), "exit code; stderr: {err}");
    assert!(err.contains("peer is gone"), "says why: {err}");
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "noticed {:?} after the kill",
        killed.elapsed()
    );
}

/// A receiver that cannot complete its output once everything arrived (here: its name was
/// taken by a directory meanwhile, so the rename fails) says what its partial file holds
/// and tells the sender why: the sender,
/// which waits for the receiver's end of the stream, exits 4 naming the cause, instead of
/// learning only that the peer went away (or, where its host answers nothing, waiting on).
#[test]
fn a_receiver_that_cannot_complete_its_output_tells_the_sender_why() {
    use std::io::Write;
    let output = TempFile::new("cannot-complete");
    let (recv, to) = spawn_recv(free_port(), output.path(), &[]);
    let mut send = spawn_piped_send(&to, &["--input", "-"]);
    let mut stdin = send.child.as_mut().unwrap().stdin.take().unwrap();
    stdin.write_all(&vec![0x5a_u8; 1 << 20]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(output.partial()).map_or(0, |m| m.len()) == 0 {
        assert!(Instant::now() < deadline, "nothing arrived");
        std::thread::sleep(Duration::from_millis(10));
    }
    // the premise: FILE's name is taken, so the rename of FILE.partial to it fails
    std::fs::create_dir(output.path()).unwrap();
    std::fs::write(output.path().join("taken"), b"x").unwrap();
    drop(stdin);
    let (s, o) = send.wait(Duration::from_secs(20));
    let err = stderr_of(&o);
    let (r, ro) = recv.wait(Duration::from_secs(10));
    let log = stderr_of(&ro);
    assert_eq!(s.code(), Some(4), "send exit code; stderr: {err}");
    assert!(
        err.contains("could not complete its output"),
        "send names the cause: {err}"
    );
    assert_ne!(r.code(), Some(0), "recv: {log}");
    assert!(log.contains("cannot complete"), "recv says why: {log}");
    // and what its partial file holds, as after a failed write (before, only the cause)
    assert!(
        log.contains(&format!(
            "{} holds the first 1048576 of the 1048576 bytes received",
            output.partial().display()
        )),
        "{log}"
    );
    std::fs::remove_dir_all(output.path()).unwrap();
}

/// What an earlier `recv` left in `FILE.partial` (what arrived before it failed) stays there
/// when a later `recv` to the same file cannot start: a key file that cannot be read, a port
/// that another `recv` (writing that very file) holds, a fault that names no link, or no
/// sender before `--accept-timeout`. The later one emptied the file, then removed it (or,
/// beside a running one, had it write on into an emptied file).
#[test]
fn a_recv_that_cannot_start_leaves_an_earlier_partial_file_alone() {
    let output = TempFile::new("earlier-partial");
    let earlier = b"what arrived before the earlier receiver failed";
    std::fs::write(output.partial(), earlier).unwrap();
    let holder = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let busy = holder.local_addr().unwrap().to_string();
    let free = format!("127.0.0.1:{}", free_port());
    let out = output.path().to_str().unwrap();
    // each case with the exit code and the words of its own failure (not some other one)
    let cases: [(&str, Vec<&str>, i32, &str); 4] = [
        (
            "a missing key file",
            vec!["--listen", &free, "--key", "/nonexistent/ri2n.key"],
            2,
            "cannot read the key file",
        ),
        (
            "a port in use",
            vec!["--listen", &busy],
            5,
            "Address already in use",
        ),
        (
            "a fault on no link",
            vec!["--listen", &free, "--fault", "1:10.9.9.9:down"],
            2,
            "no local socket has that address",
        ),
        // started, but no sender came: before, the file was emptied as the receiver
        // started, and removed as it gave up
        (
            "no sender",
            vec!["--listen", &free, "--accept-timeout", "0.5"],
            3,
            "no sender connected",
        ),
    ];
    for (what, args, code, says) in cases {
        let (s, o) = ri2n(
            ["recv", "--output", out].into_iter().chain(args),
            Duration::from_secs(10),
        );
        assert!(
            s.code() == Some(code) && stderr_of(&o).contains(says),
            "{what}: recv exits {code} saying {says:?}: {s}: {}",
            stderr_of(&o)
        );
        let kept = std::fs::read(output.partial()).unwrap_or_default();
        assert_eq!(
            kept,
            earlier,
            "{what}: the earlier partial file after recv failed ({})",
            stderr_of(&o).trim()
        );
    }
    drop(holder);
}

/// Two receivers given the same `--output` (on other ports): the second is refused at once
/// (exit 1, naming the file), and the first's file arrives whole. Before, the second emptied
/// `FILE.partial` and wrote into it too, so whichever finished first renamed a file holding
/// both streams' bytes and exited 0.
#[test]
fn a_second_recv_to_the_same_file_is_refused() {
    let input = TempFile::new("same-output-in");
    let output = TempFile::new("same-output");
    let sent = write_random(input.path(), 3 << 20, 11);
    let port = free_port();
    let (first, to) = spawn_recv(port, output.path(), &[]);
    // it binds, then opens its output
    let deadline = Instant::now() + Duration::from_secs(10);
    while !output.partial().exists() {
        assert!(
            Instant::now() < deadline,
            "the first recv made no FILE.partial"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (s, o) = start_recv(free_port(), output.path(), &[])
        .0
        .wait(Duration::from_secs(10));
    let err = stderr_of(&o);
    assert_eq!(s.code(), Some(1), "the second recv's exit code: {err}");
    assert!(
        err.contains("being written by another process") && err.contains(".partial"),
        "says why: {err}"
    );
    let (s, o) = send_file(&to, input.path(), &[]);
    assert!(s.success(), "send: {}", stderr_of(&o));
    let (r, ro) = first.wait(Duration::from_secs(10));
    assert!(r.success(), "the first recv: {}", stderr_of(&ro));
    assert_eq!(
        sha256_file(output.path()),
        (sent, 3 << 20),
        "the file arrived whole"
    );
}

/// `recv --output` naming stdout's file by another name (`/dev/stdout` with stdout redirected to a
/// file), or a symbolic link to a file (dangling too): the data lands in that file and the link
/// stays a link. Before, the first wrote `/dev/stdout.partial` and renamed it over `/dev/stdout`
/// (as root; the file stdout went to stayed empty, exit 0), the second replaced the link.
#[test]
fn recv_writes_through_dev_stdout_and_links() {
    let input = TempFile::new("through-in");
    let sum = write_random(input.path(), 3 << 20, 11);
    // stdout redirected to a file, `--output /dev/stdout`
    let redirected = TempFile::new("through-stdout");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let recv = Proc::spawn(
        "ri2n recv",
        Command::new(bin())
            .args(["recv", "--listen", &listen, "--output", "/dev/stdout"])
            .stdout(std::fs::File::create(redirected.path()).unwrap())
            .stderr(Stdio::piped()),
    );
    wait_udp_bound(port, Duration::from_secs(10));
    let (s, o) = send_file(&listen, input.path(), &[]);
    assert!(s.success(), "send: {}", stderr_of(&o));
    let (s, o) = recv.wait(Duration::from_secs(20));
    assert_eq!(s.code(), Some(0), "recv: {}", stderr_of(&o));
    assert_eq!(sha256_file(redirected.path()), (sum, 3 << 20));
    let dev_stdout = std::fs::symlink_metadata("/dev/stdout").unwrap();
    assert!(dev_stdout.is_symlink(), "/dev/stdout was replaced");
    assert!(std::fs::metadata("/dev/stdout.partial").is_err());

    // through a link: the file it points to is written, and the link stays
    let through = |link: &Path, target: &Path| {
        let port = free_port();
        let (recv, to) = spawn_recv(port, link, &[]);
        let (s, o) = send_file(&to, input.path(), &[]);
        assert!(s.success(), "send: {}", stderr_of(&o));
        let (s, o) = recv.wait(Duration::from_secs(20));
        assert_eq!(s.code(), Some(0), "recv: {}", stderr_of(&o));
        assert!(std::fs::symlink_metadata(link).unwrap().is_symlink());
        assert_eq!(sha256_file(target), (sum, 3 << 20));
    };
    let target = TempFile::new("through-target");
    std::fs::write(target.path(), b"old").unwrap();
    let link = TempFile::new("through-link");
    std::os::unix::fs::symlink(target.path(), link.path()).unwrap();
    through(link.path(), target.path());
    // a dangling link, relative to its directory: the file is made where it points (before,
    // the link itself was replaced by the file)
    let target = TempFile::new("dangling-target");
    let link = TempFile::new("dangling-link");
    std::os::unix::fs::symlink(target.path().file_name().unwrap(), link.path()).unwrap();
    assert!(!target.path().exists(), "the premise: the link dangles");
    through(link.path(), target.path());
}

/// A `FILE.partial` that someone else made a symbolic link, or a second name of another file,
/// is refused before the receiver listens (exit 1, saying why), and the file it leads to is
/// left as it was. Before, `recv` emptied that file and wrote the transfer into it: in `/tmp`,
/// any local user could have a root receiver empty a file of their choice.
#[test]
fn recv_does_not_write_through_a_partial_name_it_does_not_own() {
    for (how, expected) in [
        ("symlink", "is a symbolic link"),
        ("hard link", "has other names"),
    ] {
        let victim = TempFile::new("partial-victim");
        std::fs::write(victim.path(), b"not the receiver's").unwrap();
        let output = TempFile::new("partial-taken");
        if how == "symlink" {
            std::os::unix::fs::symlink(victim.path(), output.partial()).unwrap();
        } else {
            std::fs::hard_link(victim.path(), output.partial()).unwrap();
        }
        let listen = format!("127.0.0.1:{}", free_port());
        let out = output.path().to_str().unwrap();
        let (s, o) = ri2n(
            ["recv", "--listen", &listen, "--output", out],
            Duration::from_secs(10),
        );
        let err = stderr_of(&o);
        assert_eq!(s.code(), Some(1), "{how}: exit code; stderr: {err}");
        assert!(err.contains(expected), "{how}: says why: {err}");
        assert_eq!(
            std::fs::read(victim.path()).unwrap(),
            b"not the receiver's",
            "{how}: the file behind FILE.partial"
        );
    }
}

/// The receiver's output fails after the transport acknowledged everything: `recv` writes to
/// a pipe whose reader takes nothing and then goes away, with all 4 MiB within the receive
/// window. The sender waits for the receiver to end its side, which it does only with its
/// output complete, and so learns of the failure (exit 4, the receiver's reason) instead of
/// exiting 0 with the data lost.
#[test]
fn a_sender_learns_that_the_receiver_could_not_write_what_it_acknowledged() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut recv = Proc::spawn(
        "ri2n recv",
        Command::new(bin())
            .args(["recv", "--listen", &listen])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    // never read: the pipe fills, and the receiver blocks writing into it
    let reader = recv.child.as_mut().unwrap().stdout.take();
    wait_udp_bound(port, Duration::from_secs(10));
    let input = TempFile::new("unwritten");
    write_random(input.path(), 4 << 20, 3);
    let mut send = Command::new(bin());
    send.args(["send", "--to", &listen, "--input"])
        .arg(input.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let sender = Proc::spawn("ri2n send", &mut send);
    // time for all of it to arrive and be acknowledged (nothing outside the sender shows
    // when; its message below proves it was); then the reader goes away
    std::thread::sleep(Duration::from_secs(2));
    drop(reader);
    let (s, o) = sender.wait(Duration::from_secs(20));
    let (r, ro) = recv.wait(Duration::from_secs(20));
    let (serr, rerr) = (stderr_of(&o), stderr_of(&ro));
    assert_eq!(r.code(), Some(1), "recv: {rerr}");
    assert_eq!(s.code(), Some(4), "send: {serr}");
    assert!(serr.contains("could not write its output"), "{serr}");
    // the premise: the receiver had acknowledged every byte before it failed
    assert!(
        serr.contains(&format!("{0} bytes written, {0} acknowledged", 4 << 20)),
        "not everything was acknowledged before the reader went: {serr}"
    );
}

/// Mistakes found before a byte moves: `recv --output ""` (an unset variable) is a usage error
/// (2) at once, not a failed rename after the whole transfer; `send --input DIR` fails (1)
/// before it connects (it failed at its first read, the receiver left holding an empty
/// partial file).
#[test]
fn an_empty_output_or_a_directory_as_input_is_refused_at_once() {
    let listen = format!("127.0.0.1:{}", free_port());
    let (s, o) = ri2n(
        ["recv", "--listen", &listen, "--output", ""],
        Duration::from_secs(10),
    );
    assert_eq!(s.code(), Some(2), "{}", stderr_of(&o));
    assert!(stderr_of(&o).contains("--output"), "{}", stderr_of(&o));
    // nothing listens at `listen`: a sender that tried to connect would wait, then exit 3
    let dir = std::env::temp_dir();
    let start = std::time::Instant::now();
    let (s, o) = ri2n(
        ["send", "--to", &listen, "--input", dir.to_str().unwrap()],
        Duration::from_secs(10),
    );
    assert_eq!(s.code(), Some(1), "{}", stderr_of(&o));
    assert!(
        stderr_of(&o).contains("directory"),
        "{}",
        stderr_of(&o).trim()
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

/// `recv --json` with the data on stdout (`--output -`, `/dev/stdout`): the summary would end
/// up in the data; it is refused as a usage error (2) before anything is received, and
/// stdout, meant for the data, stays empty.
#[test]
fn recv_json_with_the_data_on_stdout_is_refused() {
    let listen = format!("127.0.0.1:{}", free_port());
    for output in ["-", "/dev/stdout"] {
        let (s, o) = ri2n(
            ["recv", "--listen", &listen, "--output", output, "--json"],
            Duration::from_secs(10),
        );
        let err = stderr_of(&o);
        assert_eq!(s.code(), Some(2), "{output}: {err}");
        assert!(err.contains("--json"), "{output}: {err}");
        assert!(o.stdout.is_empty(), "{output}: {:?}", o.stdout);
    }
    // data thrown away, stdout thrown away too (a script's, the benchmarks'): nothing mixes
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let recv = Proc::spawn(
        "ri2n recv",
        Command::new(bin())
            .args([
                "recv",
                "--listen",
                &listen,
                "--output",
                "/dev/null",
                "--json",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    wait_udp_bound(port, Duration::from_secs(10));
    let input = TempFile::new("to-null");
    write_random(input.path(), 1 << 20, 5);
    let (s, o) = send_file(&listen, input.path(), &[]);
    assert!(s.success(), "send: {}", stderr_of(&o));
    let (s, o) = recv.wait(Duration::from_secs(10));
    assert_eq!(s.code(), Some(0), "recv: {}", stderr_of(&o));
}

/// A failure reported while stdout and stderr cannot be written (a full disk, a pipe closed
/// early) still ends with its documented exit code: 3, nothing listens. Before, writing the
/// failure's message or its JSON panicked: exit 101.
#[test]
fn a_failure_with_unwritable_output_keeps_its_exit_code() {
    // a port nothing listens on: each INITIAL draws "port unreachable"
    let to = format!("127.0.0.1:{}", free_port());
    let (s, _) = Proc::spawn(
        "send to nobody",
        Command::new(bin())
            .args(["send", "--json", "--to", &to, "--input", "/dev/null"])
            .stdout(dev_full())
            .stderr(dev_full()),
    )
    .wait(Duration::from_secs(20));
    assert_eq!(s.code(), Some(3), "{s}");
}

/// A FIFO of mode 0600 at a temporary path.
fn make_fifo(tag: &str) -> TempFile {
    let fifo = TempFile::new(tag);
    let name = std::ffi::CString::new(fifo.path().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated name only
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo");
    fifo
}

/// Waits until `recv`, writing to a FIFO that no one reads, has accepted its sender and looks
/// for the FIFO's reader: it tries the open every 20 ms once a sender came (never blocking in
/// it), and before, none of its threads sleeps that way.
fn wait_polling_for_a_reader(recv: &mut Proc) {
    recv.wait_thread_in(&["hrtimer_nanosleep"], Duration::from_secs(10));
}

/// `ri2n send --to TO --input INPUT`, its output piped.
fn spawn_send_file(to: &str, input: &Path) -> Proc {
    Proc::spawn(
        "ri2n send",
        Command::new(bin())
            .args(["send", "--to", to, "--input"])
            .arg(input)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
}

/// `recv --output SOCKET` (a Unix socket, which `open` refuses with the errno of a FIFO
/// nobody reads) fails at once, saying what the path is (exit 1). Before, recv took it for
/// such a FIFO and, once a sender came, retried the open for ever while the sender stalled.
#[test]
fn recv_into_a_unix_socket_fails_at_once() {
    let sock = TempFile::new("socket-out");
    let _listener = std::os::unix::net::UnixListener::bind(sock.path()).unwrap();
    let err = recv_refusing(sock.path());
    assert!(
        err.contains("is a socket, which cannot be written as a file"),
        "{err}"
    );
}

/// `ri2n recv --output output`, which must fail before any sender comes (exit 1): its
/// stderr.
fn recv_refusing(output: &Path) -> String {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut args: Vec<std::ffi::OsString> = vec!["recv".into(), "--listen".into()];
    args.extend([listen.into(), "--output".into(), output.into()]);
    let (s, o) = ri2n(args, Duration::from_secs(10));
    let err = stderr_of(&o);
    assert_eq!(s.code(), Some(1), "exit code; stderr: {err}");
    err
}

/// `recv --output FIFO` waits for a sender as any recv does: with no reader on the FIFO yet,
/// `--accept-timeout` still ends the wait (exit 3); before, recv waited in the FIFO's open for
/// a reader and never got to accepting. With a sender, the FIFO is opened once it comes, and
/// a reader that opens it late gets every byte.
#[test]
fn recv_into_a_fifo_nobody_reads_yet_honours_the_accept_timeout() {
    let fifo = make_fifo("fifo");

    let started = Instant::now();
    let (recv, _) = spawn_recv(free_port(), fifo.path(), &["--accept-timeout", "1"]);
    let (s, o) = recv.wait(Duration::from_secs(20));
    let err = stderr_of(&o);
    assert_eq!(s.code(), Some(3), "no sender within the timeout: {err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "ended by its timeout, not by the test's limit: {:?}",
        started.elapsed()
    );

    let input = TempFile::new("fifo-in");
    let sent = write_random(input.path(), 8 << 20, 5);
    let port = free_port();
    let (mut recv, to) = spawn_recv(port, fifo.path(), &[]);
    let sender = spawn_send_file(&to, input.path());
    // the reader comes after the sender connected: recv waits for one
    wait_polling_for_a_reader(&mut recv);
    let (tx, rx) = std::sync::mpsc::channel();
    let path = fifo.path().to_path_buf();
    std::thread::spawn(move || tx.send(sha256_file(&path)));
    let (got, len) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("recv opened the FIFO and wrote it to its end");
    let (s, o) = sender.wait(Duration::from_secs(30));
    assert!(s.success(), "send: {}", stderr_of(&o));
    let (r, ro) = recv.wait(Duration::from_secs(10));
    assert!(r.success(), "recv: {}", stderr_of(&ro));
    assert_eq!((got, len), (sent, 8 << 20), "the reader got every byte");
}

/// A receiver that waits for its FIFO's reader hears of a sender that gave up meanwhile: it
/// exits 4 saying no reader came. Before, it waited in the FIFO's `open()` for ever.
#[test]
fn recv_into_a_fifo_that_no_one_reads_ends_when_the_sender_gives_up() {
    let fifo = make_fifo("fifo-alone");
    let input = TempFile::new("fifo-alone-in");
    write_random(input.path(), 8 << 20, 6);
    let port = free_port();
    let (mut recv, to) = spawn_recv(port, fifo.path(), &[]);
    let sender = spawn_send_file(&to, input.path());
    // connected, nobody reading the FIFO: recv waits for a reader
    wait_polling_for_a_reader(&mut recv);
    sender.signal(libc::SIGINT);
    let (s, o) = sender.wait(Duration::from_secs(10));
    assert_eq!(s.code(), Some(130), "send: {}", stderr_of(&o));
    let (r, ro) = recv.wait(Duration::from_secs(10));
    let err = stderr_of(&ro);
    // "connection lost": recv had accepted the sender when it gave up
    assert_eq!(r.code(), Some(4), "recv: {err}");
    assert!(
        err.contains("connection lost") && err.contains("had no reader"),
        "recv: {err}"
    );
}

/// A TCP-transport connect that finds no route to the peer (in a network namespace of its
/// own, which has none) fails at once as a connect that gets no answer does: exit 3, naming
/// the address. Before: exit 1 and the bare "Network is unreachable (os error 101)".
#[test]
fn a_tcp_connect_with_no_route_is_a_failure_to_connect() {
    if !root_or_skip("unshare -n") {
        return;
    }
    let input = TempFile::new("no-route");
    std::fs::write(input.path(), b"hello").unwrap();
    // loopback up: the only network there, with no route to 10.1.1.1
    let o = Command::new("unshare")
        .args(["-n", "sh", "-c", r#"ip link set lo up && exec "$@""#, "sh"])
        .arg(bin())
        .args([
            "send",
            "--transport",
            "tcp",
            "--to",
            "10.1.1.1:7000",
            "--input",
        ])
        .arg(input.path())
        .output()
        .unwrap();
    let err = stderr_of(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("cannot reach 10.1.1.1:7000: Network is unreachable"),
        "{err}"
    );
}

/// A FILE that exists keeps its permissions when a transfer replaces it, as `cp` keeps them,
/// and `FILE.partial` has them from the start. Before, a private file (0600) came back 0644,
/// readable by every local user, and so was what arrived meanwhile.
#[test]
fn a_replaced_output_keeps_its_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let output = TempFile::new("kept-mode");
    std::fs::write(output.path(), b"the old content").unwrap();
    std::fs::set_permissions(output.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
    let input = TempFile::new("kept-mode-in");
    let sent = write_random(input.path(), 1 << 20, 5);
    let port = free_port();
    let (recv, to) = spawn_recv(port, output.path(), &[]);
    // recv binds first, then makes FILE.partial: looked at without pause, so that a moment
    // in which it is more readable than FILE (made, then narrowed) is seen
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        if let Ok(m) = std::fs::metadata(output.partial()) {
            break m.permissions().mode() & 0o777;
        }
        assert!(Instant::now() < deadline, "no FILE.partial within 10 s");
        std::thread::yield_now();
    };
    assert_eq!(first, 0o600, "FILE.partial as soon as it exists");
    assert_eq!(
        mode(&output.partial()),
        0o600,
        "FILE.partial while it waits"
    );
    let (s, o) = send_file(&to, input.path(), &[]);
    assert!(s.success(), "send: {}", stderr_of(&o));
    let (s, o) = recv.wait(Duration::from_secs(20));
    assert!(s.success(), "recv: {}", stderr_of(&o));
    assert_eq!(sha256_file(output.path()), (sent, 1 << 20));
    assert_eq!(mode(output.path()), 0o600);
}

/// An output directory this user may write but not read (a drop box, mode 0300): the file
/// arrives under its name, and both ends exit 0. Before, syncing the directory after the
/// rename failed: `recv` exited 1 saying it could not complete `FILE.partial` (already
/// renamed) and the sender 4, though FILE was whole. As another user than root (which reads
/// every directory): nobody (65534), through `setpriv`.
#[test]
fn a_drop_box_directory_takes_the_file() {
    use std::os::unix::fs::PermissionsExt;
    if !root_or_skip("setpriv to another user") {
        return;
    }
    let dir = TempFile::dir("drop-box");
    let input = TempFile::new("drop-box-in");
    let sent = write_random(input.path(), 1 << 20, 6);
    std::fs::set_permissions(input.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let nobody = 65534;
    std::os::unix::fs::chown(dir.path(), Some(nobody), Some(nobody)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o300)).unwrap();
    let file = dir.path().join("file");
    transfer_to_nobody(&program_for_nobody(), input.path(), sent, &file);
    std::fs::remove_dir_all(dir.path()).unwrap();
}

/// `input` (1 MiB, its SHA-256 `sent`) sent to `ri2n recv --output file` run by nobody as
/// `program`: both exit 0, and `file` holds it.
fn transfer_to_nobody(program: &TempFile, input: &Path, sent: [u8; 32], file: &Path) {
    let (recv, listen) = recv_as_nobody(program, file);
    let (s, o) = send_file(&listen, input, &[]);
    let (rs, ro) = recv.wait(Duration::from_secs(20));
    assert!(rs.success(), "recv: {}", stderr_of(&ro));
    assert!(s.success(), "send: {}", stderr_of(&o));
    assert_eq!(sha256_file(file), (sent, 1 << 20));
}

/// A copy of the binary that nobody (65534) may run: the checkout's directories may be
/// root's alone.
fn program_for_nobody() -> TempFile {
    use std::os::unix::fs::PermissionsExt;
    let program = TempFile::new("ri2n-for-nobody");
    std::fs::copy(bin(), program.path()).unwrap();
    std::fs::set_permissions(program.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    program
}

/// `ri2n recv --output output` as `program`, run by nobody (65534) through `setpriv`, once it
/// listens; and where (a free port of 127.0.0.1).
fn recv_as_nobody(program: &TempFile, output: &Path) -> (Proc, String) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let recv = Proc::spawn(
        "ri2n recv as nobody",
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(program.path())
            .args(["recv", "-q", "--listen", &listen, "--output"])
            .arg(output)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    wait_udp_bound(port, Duration::from_secs(10));
    (recv, listen)
}

/// A read-only FILE (0444) of a user who is not root: a transfer into it that fails leaves a
/// FILE.partial the next `recv` of that user takes over, and one that completes gives FILE
/// its mode back. Before, FILE.partial got 0444 as soon as it was made, and after a failed
/// transfer every later `recv` to FILE failed (exit 1, permission denied).
#[test]
fn a_failed_transfer_into_a_read_only_file_leaves_a_partial_the_next_recv_takes() {
    use std::os::unix::fs::PermissionsExt;
    if !root_or_skip("setpriv to another user") {
        return;
    }
    let nobody = 65534;
    let dir = TempFile::dir("read-only-out");
    std::os::unix::fs::chown(dir.path(), Some(nobody), Some(nobody)).unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"old contents").unwrap();
    std::os::unix::fs::chown(&file, Some(nobody), Some(nobody)).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o444)).unwrap();
    let partial = dir.path().join("file.partial");
    let program = program_for_nobody();

    // the first transfer fails (its sender interrupted) with bytes in FILE.partial
    let (recv, listen) = recv_as_nobody(&program, &file);
    let mut send = spawn_piped_send(&listen, &["-q"]);
    let mut stdin = send.child.as_mut().unwrap().stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, &[5u8; 100 * 1024]).unwrap();
    wait_file_grows(&partial, Duration::from_secs(10));
    send.signal(libc::SIGINT);
    let (s, o) = send.wait(Duration::from_secs(10));
    assert_eq!(s.code(), Some(130), "send: {}", stderr_of(&o));
    drop(stdin);
    let (s, o) = recv.wait(Duration::from_secs(10));
    assert_eq!(s.code(), Some(4), "recv: {}", stderr_of(&o));
    assert!(partial.exists(), "the failed transfer's bytes are kept");

    // the next one takes FILE.partial over and completes
    let input = TempFile::new("read-only-in");
    let sent = write_random(input.path(), 1 << 20, 8);
    transfer_to_nobody(&program, input.path(), sent, &file);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o444);
    std::fs::remove_dir_all(dir.path()).unwrap();
}

/// A sticky directory others can write (as `/tmp`) holding a symbolic link `name` that another
/// user (nobody, 65534) made to a new file holding `content`: the directory, the file and the
/// link. Root only.
fn foreign_link(name: &str, content: &[u8]) -> (TempFile, TempFile, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let shared = TempFile::dir("shared-dir");
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = TempFile::new("link-victim");
    std::fs::write(victim.path(), content).unwrap();
    let link = shared.path().join(name);
    std::os::unix::fs::symlink(victim.path(), &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
    (shared, victim, link)
}

/// A FILE that is a symbolic link another user made in a sticky directory others can write
/// (`/tmp`) is not followed, as the kernel's `protected_symlinks` rule would not let an open
/// follow it: exit 1, saying why, and the file it points at left as it was. Before, `recv`
/// (root's too) read the link itself, and wrote the transfer into that file. As root: the
/// link is given to nobody (65534).
#[test]
fn recv_does_not_follow_another_user_s_link_in_a_shared_directory() {
    if !root_or_skip("a link owned by another user") {
        return;
    }
    let (shared, victim, link) = foreign_link("backup.tar", b"not the receiver's");
    let err = recv_refusing(&link);
    assert!(
        err.contains("a symbolic link another user owns"),
        "says why: {err}"
    );
    assert_eq!(std::fs::read(victim.path()).unwrap(), b"not the receiver's");
    let mut partial = victim.path().as_os_str().to_owned();
    partial.push(".partial");
    assert!(
        !Path::new(&partial).exists(),
        "nothing made beside the victim"
    );
    std::fs::remove_dir_all(shared.path()).unwrap();
}

/// `ri2n keygen --force --output LINK`, where LINK is a symbolic link another user made in a
/// sticky directory others can write, replaces nothing: exit 1, saying why, the file it
/// points at left as it was. Before, keygen resolved the link itself (`canonicalize`), which
/// the kernel's `protected_symlinks` check never sees, and root's keygen replaced the file
/// of that user's choice with the key. As root: the link is given to nobody (65534).
#[test]
fn keygen_force_does_not_follow_another_user_s_link_in_a_shared_directory() {
    if !root_or_skip("a link owned by another user") {
        return;
    }
    let (shared, victim, link) = foreign_link("cluster.key", b"precious\n");
    let (s, o) = ri2n(
        ["keygen", "--force", "--output", link.to_str().unwrap()],
        Duration::from_secs(10),
    );
    let err = stderr_of(&o);
    assert_eq!(s.code(), Some(1), "exit code; stderr: {err}");
    assert!(
        err.contains("a symbolic link another user owns"),
        "says why: {err}"
    );
    assert_eq!(std::fs::read(victim.path()).unwrap(), b"precious\n");
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    std::fs::remove_dir_all(shared.path()).unwrap();
}

/// `ri2n keygen --force --output LINK` keeps the link and writes the key where it points,
/// also where no file is yet (as `cp` does), and replaces only a regular file: a link to
/// a pipe (as `/dev/stdout` is under `| ssh ...`) or a FIFO is refused, exit 1, and stays.
/// Before, a link whose target did not resolve was itself replaced by a key file (so root's
/// `keygen --force -o /dev/stdout | ...` left the key in /dev), and a device or FIFO was
/// renamed over (`-o /dev/null`).
#[test]
fn keygen_force_writes_through_a_link_and_only_over_a_file() {
    let dir = TempFile::dir("key-links");
    let keygen = |path: &Path| {
        ri2n(
            ["keygen", "--force", "--output", path.to_str().unwrap()],
            Duration::from_secs(10),
        )
    };
    // a dangling link: the key is made where it points
    let dangling = dir.path().join("dangling.key");
    std::os::unix::fs::symlink("real.key", &dangling).unwrap();
    let (s, o) = keygen(&dangling);
    assert!(
        s.success(),
        "keygen through a dangling link: {}",
        stderr_of(&o)
    );
    assert!(std::fs::symlink_metadata(&dangling).unwrap().is_symlink());
    let key = std::fs::read_to_string(dir.path().join("real.key")).unwrap();
    assert!(key.starts_with("ri2n-key-v1:"), "{key:?}");
    // a link to this process's stdout, a pipe here, and a FIFO
    let stdout = dir.path().join("stdout");
    std::os::unix::fs::symlink("/proc/self/fd/1", &stdout).unwrap();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo of a NUL-terminated path this test names
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for (path, is_link) in [(&stdout, true), (&fifo, false)] {
        let (s, o) = keygen(path);
        let err = stderr_of(&o);
        assert_eq!(s.code(), Some(1), "{}: {err}", path.display());
        assert!(err.contains("not a regular file"), "says why: {err}");
        assert!(o.stdout.is_empty(), "no key on stdout");
        let kind = std::fs::symlink_metadata(path).unwrap().file_type();
        assert!(
            if is_link {
                kind.is_symlink()
            } else {
                std::os::unix::fs::FileTypeExt::is_fifo(&kind)
            },
            "{} left as it was: {kind:?}",
            path.display()
        );
    }
    let mut names: Vec<_> = (std::fs::read_dir(dir.path()).unwrap())
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["dangling.key", "fifo", "real.key", "stdout"]);
    std::fs::remove_dir_all(dir.path()).unwrap();
}

/// A file an interrupted keygen left beside the key (its new file, named after the process)
/// does not stop a later keygen, with or without --force, where the key file itself does
/// not exist. Before, the new file's name came from the process ID alone, and a keygen
/// that is process 1 at every start (in a container; `unshare --pid` here) failed with
/// "cluster.key exists" forever after one was interrupted.
#[test]
fn a_file_an_interrupted_keygen_left_is_no_existing_key() {
    if !root_or_skip("a PID namespace (unshare --pid)") {
        return;
    }
    let dir = TempFile::dir("key-left");
    let path = dir.path().join("cluster.key");
    // the name a keygen that was process 1 gave its new file
    std::fs::write(dir.path().join(".cluster.key.1.0.new"), "").unwrap();
    for force in [false, true] {
        let mut cmd = Command::new("unshare");
        cmd.args(["--pid", "--fork"]).arg(bin()).arg("keygen");
        cmd.arg("--output")
            .arg(&path)
            .args(force.then_some("--force"));
        let o = cmd.output().expect("running unshare");
        assert!(o.status.success(), "keygen: {}", stderr_of(&o));
        let key = std::fs::read_to_string(&path).unwrap();
        assert!(key.starts_with("ri2n-key-v1:"), "{key:?}");
        if !force {
            std::fs::remove_file(&path).unwrap();
        }
    }
    std::fs::remove_dir_all(dir.path()).unwrap();
}

/// `ri2n recv --output FILE` takes a name as long as a file name may be (255 bytes), its
/// FILE.partial cut short to fit. Before, `.partial` made it too long, and recv exited 1
/// ("File name too long") before any sender came.
#[test]
fn recv_takes_an_output_name_as_long_as_a_file_name_may_be() {
    let dir = TempFile::dir("long-name");
    let input = dir.path().join("in");
    let sent = write_random(&input, 100_000, 7);
    let output = dir.path().join("f".repeat(255));
    let (recv, a) = spawn_recv(free_port(), &output, &["--quiet"]);
    let (s, so) = send_file(&a, &input, &["--quiet"]);
    let (r, ro) = recv.wait(Duration::from_secs(20));
    assert!(s.success(), "send: {}", stderr_of(&so));
    assert!(r.success(), "recv: {}", stderr_of(&ro));
    assert_eq!(sha256_file(&output), (sent, 100_000));
    std::fs::remove_dir_all(dir.path()).unwrap();
}

/// Root receiving into a file of another user leaves it theirs, mode kept, as `cp` would.
/// Before, the file took its place with root as its owner, and the user could no longer
/// read their own (mode 0600) file.
#[test]
fn a_replaced_output_keeps_its_owner() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !root_or_skip("a file of another user") {
        return;
    }
    let input = TempFile::new("owner-in");
    let sent = write_random(input.path(), 50_000, 3);
    let output = TempFile::new("owner-out");
    std::fs::write(output.path(), "old").unwrap();
    std::fs::set_permissions(output.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(output.path(), Some(65534), Some(65534)).unwrap();
    let (recv, a) = spawn_recv(free_port(), output.path(), &["--quiet"]);
    send_whole(recv, &a, input.path(), sent, output.path());
    let m = std::fs::metadata(output.path()).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (65534, 65534, 0o600));
}

/// A FILE.partial of another user (made beforehand in a directory everyone may write) is
/// not written: they could hold it open and read all that arrives, or change it once
/// complete. `recv` refuses it at once (exit 1) and leaves it as it was. Before, root took it
/// over, and FILE came out theirs and writable by all. Where FILE is that user's too, root
/// receiving into it takes their partial over, as it gives them the complete file.
#[test]
fn a_partial_file_of_another_user_is_not_taken_over() {
    use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
    if !root_or_skip("a file of another user") {
        return;
    }
    let dir = TempFile::dir("foreign-partial");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let output = dir.path().join("out");
    let partial = dir.path().join("out.partial");
    std::fs::write(&partial, "theirs").unwrap();
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o666)).unwrap();
    chown(&partial, Some(65534), Some(65534)).unwrap();
    let (recv, _) = start_recv(free_port(), &output, &["--quiet"]);
    let (r, ro) = recv.wait(Duration::from_secs(10));
    let err = stderr_of(&ro);
    assert_eq!(r.code(), Some(1), "{err}");
    assert!(
        err.contains("out.partial belongs to another user (uid 65534): not writing through it"),
        "{err}"
    );
    assert_eq!(std::fs::read(&partial).unwrap(), b"theirs");
    assert!(!output.exists());

    std::fs::write(&output, "old").unwrap();
    std::fs::set_permissions(&output, std::fs::Permissions::from_mode(0o600)).unwrap();
    chown(&output, Some(65534), Some(65534)).unwrap();
    let input = TempFile::new("foreign-partial-in");
    let sent = write_random(input.path(), 50_000, 12);
    let (recv, a) = spawn_recv(free_port(), &output, &["--quiet"]);
    send_whole(recv, &a, input.path(), sent, &output);
    let m = std::fs::metadata(&output).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (65534, 65534, 0o600));
    assert!(!partial.exists());
}

/// A FILE.partial an earlier run left (mode 0644) taken over by a `recv` whose umask is 077,
/// with no FILE to replace: FILE comes out as a new file of this umask would, 0600. Before,
/// it kept the mode of the earlier run's file, readable by every local user, and so was
/// what arrived meanwhile.
#[test]
fn a_partial_file_an_earlier_run_left_takes_the_permissions_of_a_new_file() {
    use std::os::unix::fs::PermissionsExt;
    let output = TempFile::new("left-mode");
    std::fs::write(output.partial(), "left by an earlier run").unwrap();
    std::fs::set_permissions(output.partial(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let input = TempFile::new("left-mode-in");
    let sent = write_random(input.path(), 50_000, 13);
    let port = free_port();
    let to = format!("127.0.0.1:{port}");
    let recv = Proc::spawn(
        "ri2n recv with umask 077",
        Command::new("sh")
            .args(["-c", "umask 077 && exec \"$0\" \"$@\"", bin()])
            .args(["recv", "--quiet", "--listen", &to, "--output"])
            .arg(output.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    wait_udp_bound(port, Duration::from_secs(10));
    send_whole(recv, &to, input.path(), sent, output.path());
    let mode = std::fs::metadata(output.path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// A file replaced in a setgid directory of another group (a shared project directory):
/// FILE.partial, which is made with the directory's group, is never readable by that group,
/// from the moment it exists (looked at without pause) until it has FILE's group. Before, it
/// was made with FILE's permissions (0640) and the directory's group, and given FILE's group
/// a few system calls later: a member of the directory's group who opened it in between
/// could read all that arrived.
#[test]
fn a_replaced_output_in_a_setgid_directory_is_never_open_to_the_directory_s_group() {
    use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
    if !root_or_skip("a directory of another group") {
        return;
    }
    let dir = TempFile::dir("setgid-dir");
    chown(dir.path(), Some(0), Some(65534)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o2755)).unwrap();
    let output = dir.path().join("out");
    let partial = dir.path().join("out.partial");
    std::fs::write(&output, "old").unwrap();
    chown(&output, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&output, std::fs::Permissions::from_mode(0o640)).unwrap();
    let input = TempFile::new("setgid-in");
    let sent = write_random(input.path(), 50_000, 14);
    let (recv, to) = start_recv(free_port(), &output, &["--quiet"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let open_to_the_group = |m: &std::fs::Metadata| m.gid() != 0 && m.mode() & 0o070 != 0;
    let first = loop {
        if let Ok(m) = std::fs::metadata(&partial) {
            break m;
        }
        assert!(Instant::now() < deadline, "no FILE.partial within 10 s");
        std::thread::yield_now();
    };
    assert!(
        !open_to_the_group(&first),
        "FILE.partial as soon as it exists: group {}, mode {:o}",
        first.gid(),
        first.mode() & 0o7777
    );
    wait_udp_bound(
        to.rsplit(':').next().unwrap().parse().unwrap(),
        Duration::from_secs(10),
    );
    send_whole(recv, &to, input.path(), sent, &output);
    let m = std::fs::metadata(&output).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (0, 0, 0o640));
}

/// A file rewritten in place while `ri2n send` reads it (other bytes over the same size:
/// `dd conv=notrunc`, `cat new > FILE` when the sender does not read it while it is short)
/// ends the transfer as a failure on both sides, as one cut short does; one that only grows
/// meanwhile is sent whole, to its new end. Before, a rewrite that left the file no smaller
/// went unnoticed: both exited 0, and FILE held the old content's first part and the new
/// content's rest. The links are slowed so that the change comes while the data moves; the
/// file is overwritten without being truncated, so that it never reads as cut short.
#[test]
fn an_input_file_rewritten_while_sent_is_no_success_but_one_grown_is() {
    let _heavy = heavy();
    for rewrite in [true, false] {
        let input = TempFile::new("rewritten");
        // well over the send buffer (8 MiB): the sender is still reading when it changes
        let len = 40u64 << 20;
        write_random(input.path(), len, 12);
        let output = TempFile::new("rewritten-out");
        let (recv, a) = spawn_recv(free_port(), output.path(), &["--quiet"]);
        let send = Proc::spawn(
            "ri2n send",
            Command::new(bin())
                .args(["send", "--to", &a, "--quiet", "--input"])
                .arg(input.path())
                .args(["--fault", "0:127.0.0.1:rate=100M"])
                .args(["--fault", "0:127.0.0.2:rate=100M"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        );
        wait_file_grows(&output.partial(), Duration::from_secs(20));
        if rewrite {
            // other bytes (the generator takes `seed | 1`), written over the old ones
            let other = TempFile::new("rewritten-other");
            write_random(other.path(), len, 14);
            let bytes = std::fs::read(other.path()).unwrap();
            let mut f = std::fs::OpenOptions::new().write(true).open(input.path());
            std::io::Write::write_all(f.as_mut().unwrap(), &bytes).unwrap();
        } else {
            let mut f = std::fs::OpenOptions::new().append(true).open(input.path());
            std::io::Write::write_all(f.as_mut().unwrap(), &[9u8; 1 << 20]).unwrap();
        }
        let (s, so) = send.wait(Duration::from_secs(60));
        let (r, ro) = recv.wait(Duration::from_secs(20));
        let (err, rerr) = (stderr_of(&so), stderr_of(&ro));
        if rewrite {
            assert_eq!(s.code(), Some(1), "send: {err}");
            assert!(err.contains("was rewritten while it was read"), "{err}");
            assert_eq!(r.code(), Some(4), "recv: {rerr}");
            assert!(rerr.contains("input file was rewritten"), "recv: {rerr}");
            assert!(!output.path().exists(), "FILE not made");
            let _ = std::fs::remove_file(output.partial());
        } else {
            assert!(s.success() && r.success(), "send: {err}\nrecv: {rerr}");
            // the premise: the bytes appended came before the sender met the end
            assert_eq!(sha256_file(output.path()), sha256_file(input.path()));
            assert_eq!(sha256_file(output.path()).1, len + (1 << 20));
        }
    }
}

/// A file cut short while `ri2n send` reads it (a log rotated, a file rewritten) ends the
/// transfer as a failure on both sides: the sender exits 1 saying so, and the receiver's
/// FILE is not made from what came, which is neither the file as it was nor as it is; the
/// file given with `--input` or as stdin (`< FILE`). Before, both exited 0 and FILE held
/// the first part of the old content; through stdin until later (the size of a file there
/// was not looked at). The links are slowed so that the cut comes while the data moves.
#[test]
fn an_input_file_cut_short_while_sent_is_no_success() {
    let _heavy = heavy();
    for (way, by_stdin) in [("--input", false), ("stdin", true)] {
        let input = TempFile::new("shrinks");
        let len = 64u64 << 20;
        write_random(input.path(), len, 11);
        let output = TempFile::new("shrinks-out");
        let (recv, a) = spawn_recv(free_port(), output.path(), &["--quiet"]);
        let slow = ["--fault", "0:127.0.0.1:rate=40M"];
        let mut send = Command::new(bin());
        send.args(["send", "--to", &a, "--quiet"]).args(slow);
        match by_stdin {
            true => send.stdin(std::fs::File::open(input.path()).unwrap()),
            false => send.arg("--input").arg(input.path()).stdin(Stdio::null()),
        };
        let send = Proc::spawn(
            "ri2n send",
            send.stdout(Stdio::piped()).stderr(Stdio::piped()),
        );
        wait_file_grows(&output.partial(), Duration::from_secs(20));
        let file = std::fs::OpenOptions::new().write(true).open(input.path());
        file.unwrap().set_len(1 << 20).unwrap();
        let (s, so) = send.wait(Duration::from_secs(60));
        let (r, ro) = recv.wait(Duration::from_secs(20));
        let err = stderr_of(&so);
        assert_eq!(s.code(), Some(1), "{way}: send: {err}");
        assert!(
            err.contains(&format!("shrank from {len} to 1048576 bytes")),
            "{way}: says why: {err}"
        );
        assert_eq!(r.code(), Some(4), "{way}: recv: {}", stderr_of(&ro));
        assert!(
            stderr_of(&ro).contains("input file shrank"),
            "{way}: recv: {}",
            stderr_of(&ro)
        );
        assert!(!output.path().exists(), "{way}: FILE not made");
        let _ = std::fs::remove_file(output.partial());
    }
}
