//! The C library as C programs use it: each test compiles C sources (`tests/c/`, and
//! `examples/c/` at the top of the checkout) with the system's C compiler, found by the `cc`
//! crate, against the committed header and the `libri2n_ffi.a` / `.so` that Cargo built for
//! this test run, then runs the program and checks what it did.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How a C program links the library.
#[derive(Clone, Copy)]
enum Linkage {
    /// `libri2n_ffi.a` and the system libraries it needs.
    Static,
    /// `libri2n_ffi.so`, found at run time through the program's run path.
    Shared,
}

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Where Cargo put the libraries it built for this test run: beside the test binary, in
/// `<profile>/deps/` (`libri2n_ffi.a` and `.so` there carry no hash; the copies in
/// `<profile>/` are only made, and kept fresh, by a `cargo build` of the library).
fn libs_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    exe.parent().expect("<profile>/deps/<test>").to_path_buf()
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// Compiles `sources` into the program `out`, failing the test with the compiler's words.
fn compile(sources: &[PathBuf], out: &Path, linkage: Linkage) {
    let target = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let compiler = cc::Build::new()
        .cargo_metadata(false)
        .target(&target)
        .host(&target)
        .opt_level(2)
        .get_compiler();
    let mut cmd = compiler.to_command();
    cmd.args(["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(crate_dir().join("include/ri2n"))
        .arg("-I")
        .arg(crate_dir().join("tests/c"))
        .args(sources)
        .arg("-o")
        .arg(out);
    let libs = libs_dir();
    match linkage {
        Linkage::Static => {
            cmd.arg(libs.join("libri2n_ffi.a"));
            // what `rustc --print native-static-libs` names for this library
            cmd.args([
                "-lgcc_s",
                "-lutil",
                "-lrt",
                "-lpthread",
                "-lm",
                "-ldl",
                "-lc",
            ]);
        }
        Linkage::Shared => {
            cmd.arg("-L").arg(&libs).arg("-lri2n_ffi").arg("-lpthread");
            cmd.arg(format!("-Wl,-rpath,{}", libs.display()));
        }
    }
    let result = cmd.output().expect("running the C compiler");
    assert!(
        result.status.success(),
        "compiling {sources:?} failed:\n{}",
        String::from_utf8_lossy(&result.stderr)
    );
}

/// Compiles the test program `tests/c/{source}.c` into a fresh scratch directory `dir`
/// (named `name`); returns the directory and the program.
fn build_test_program(name: &str, source: &str, linkage: Linkage) -> (PathBuf, PathBuf) {
    let dir = scratch(name);
    let program = dir.join(source);
    let path = crate_dir().join(format!("tests/c/{source}.c"));
    compile(&[path], &program, linkage);
    (dir, program)
}

/// Waits for `child` at most `limit`, killing it past that.
fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child
        .try_wait()
        .expect("waiting for the C program")
        .is_none()
    {
        if Instant::now() >= deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("the C program's output")
}

/// A command running the C program `program`, without `LD_LIBRARY_PATH`: `cargo test` puts
/// `<profile>/` in it before `<profile>/deps`, and a `libri2n_ffi.so` that an earlier `cargo
/// build` left there (without the newest functions) would win over the program's run path to
/// the library of this test run.
fn c_program(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_remove("LD_LIBRARY_PATH");
    cmd
}

/// Runs a compiled program with `args`, at most `limit`; fails the test unless it exits 0.
fn run_ok(program: &Path, args: &[&Path], limit: Duration) -> String {
    let child = c_program(program)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the C program");
    let out = wait_bounded(child, limit);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} ended with {}:\n{stdout}\n{}",
        program.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn a_keyed_transfer_over_two_links_is_intact_and_another_key_is_refused() {
    keyed_transfer("transfer", None);
}

#[test]
fn the_same_over_the_tcp_transport() {
    keyed_transfer("transfer-tcp", Some("tcp"));
}

/// Runs `tests/c/transfer.c` (its second argument: `transport`).
fn keyed_transfer(name: &str, transport: Option<&str>) {
    let (dir, program) = build_test_program(name, "transfer", Linkage::Static);
    let mut args = vec![dir.as_path()];
    args.extend(transport.map(Path::new));
    let out = run_ok(&program, &args, Duration::from_secs(120));
    let expect = match transport {
        Some(t) => format!("67108864 bytes intact over 2 links, keyed, {t}"),
        None => "67108864 bytes intact over 2 links, keyed\n".to_owned(),
    };
    assert!(out.contains(&expect), "{out}");
    // the UDP transport's account was read and checked (busy, within the connection's life)
    if transport.is_none() {
        let held = out.lines().find(|l| l.starts_with("sender busy "));
        println!("{}", held.expect(&out));
    }
    assert!(
        out.contains("another key refused: connecting to 127.0.0.1:"),
        "{out}"
    );
    assert!(out.ends_with("ok\n"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_failure_gives_the_promised_errno_through_the_shared_library() {
    let (dir, program) = build_test_program("errors", "errors", Linkage::Shared);
    let out = run_ok(&program, &[&dir], Duration::from_secs(120));
    assert!(
        out.contains("endpoint aborted: ECONNRESET with its reason")
            && out.contains("peer's process gone: ECONNRESET")
            && out.contains("silent peer: ETIMEDOUT once every link was down")
            && out.contains("write after a clean close EPIPE")
            && out.contains("read after the server's close ECONNABORTED")
            && out.contains("a key not written whole: EFBIG, and no file left"),
        "{out}"
    );
    // the last line, from an `atexit` handler
    assert!(
        out.ends_with("ok\na failing call after exit: EINVAL\n"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A process that forks holding endpoints and connections: in the child they fail with
/// `EBADF` and are freed without a word to the peer, while the child's own connection works
/// and the parent's carries its bytes intact (`tests/c/fork.c`).
#[test]
fn a_forked_child_leaves_the_parent_s_connections_alone() {
    let (dir, program) = build_test_program("fork", "fork", Linkage::Static);
    let out = run_ok(&program, &[], Duration::from_secs(60));
    assert!(
        out.contains("child: the parent's objects EBADF, its own connection delivered")
            && out.ends_with("intact after the fork\nok\n"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A thread blocked in `ri2n_recv_message` beside one polling the read descriptor with
/// `ri2n_try_recv_message`: the try call turned away while the other receives clears the
/// descriptor, level- and edge-triggered (`tests/c/turns.c`).
#[test]
fn a_try_receive_turned_away_by_another_thread_clears_the_descriptor() {
    let (dir, program) = build_test_program("turns", "turns", Linkage::Static);
    for transport in [None, Some("tcp")] {
        let args: Vec<&Path> = transport.iter().map(Path::new).collect();
        let out = run_ok(&program, &args, Duration::from_secs(60));
        assert!(out.ends_with("ok\n"), "{transport:?}: {out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The example epoll echo server, with three Rust clients at once, each over two links.
#[test]
fn the_epoll_echo_example_echoes_every_byte_of_several_clients() {
    let dir = scratch("echo");
    let program = dir.join("echo_epoll");
    let example = crate_dir().join("../../examples/c/echo_epoll.c");
    compile(&[example], &program, Linkage::Static);
    let clients = 3;
    let mut server = c_program(&program)
        .args([
            "--connections",
            &clients.to_string(),
            "127.0.0.1:0",
            "127.0.0.2:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting echo_epoll");
    let mut first = String::new();
    BufReader::new(server.stdout.take().expect("piped"))
        .read_line(&mut first)
        .expect("echo_epoll's first line");
    let addr: SocketAddr = first
        .strip_prefix("listening on ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("echo_epoll said {first:?}"));

    let threads: Vec<_> = (0..clients)
        .map(|i| {
            std::thread::spawn(move || {
                let local: Vec<SocketAddr> = vec![
                    "127.0.0.1:0".parse().unwrap(),
                    "127.0.0.2:0".parse().unwrap(),
                ];
                let client = ri2n::Endpoint::client(&local).expect("client");
                let conn = client
                    .connect(&[addr], ri2n::ConnectionConfig::default())
                    .expect("connect");
                let sent: Vec<u8> = (0..4u32 << 20).map(|k| (k * 7 + i) as u8).collect();
                let writer = std::thread::scope(|s| {
                    let w = s.spawn(|| {
                        (&conn).write_all(&sent).expect("write");
                        conn.finish().expect("finish");
                    });
                    let mut echoed = Vec::new();
                    (&conn).read_to_end(&mut echoed).expect("read the echo");
                    w.join().expect("writer");
                    echoed
                });
                assert!(
                    writer == sent,
                    "client {i}: the echo differs from what was sent"
                );
                conn.links_used()
            })
        })
        .collect();
    for t in threads {
        let links = t.join().expect("a client failed");
        assert_eq!(links, 2, "each client's data crossed both links");
    }
    let out = wait_bounded(server, Duration::from_secs(30));
    assert!(
        out.status.success(),
        "echo_epoll ended with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// How many links of a connection carried stream data.
trait LinksUsed {
    fn links_used(&self) -> usize;
}

impl LinksUsed for ri2n::Connection {
    fn links_used(&self) -> usize {
        self.stats()
            .links
            .iter()
            .filter(|l| l.stream_bytes_acked > 0)
            .count()
    }
}

/// What a user of the installed library does: `cargo cinstall` into a fresh prefix, then a C
/// program built with `pkg-config --cflags --libs ri2n` moves its 64 MiB intact. Needs cargo-c
/// (`cargo install cargo-c`: minutes of building, which CI does not spend), so it runs only
/// when asked for (`cargo test -p ri2n-ffi --test c -- --ignored`), and then fails without
/// cargo-c rather than pass having checked nothing.
#[test]
#[ignore = "needs cargo-c (cargo install cargo-c); run with --ignored"]
fn the_library_installed_by_cargo_c_builds_with_pkg_config() {
    let has_cargo_c = Command::new("cargo")
        .args(["cinstall", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        has_cargo_c,
        "cargo-c is not installed (cargo install cargo-c)"
    );
    let dir = scratch("cinstall");
    let prefix = dir.join("prefix");
    let install = Command::new("cargo")
        .args(["cinstall", "--release", "-p", "ri2n-ffi"])
        .arg(format!("--prefix={}", prefix.display()))
        .arg(format!("--libdir={}", prefix.join("lib").display()))
        // its own build directory: the one of this test run is Cargo's, busy
        .env(
            "CARGO_TARGET_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cinstall-target"),
        )
        .current_dir(crate_dir())
        .output()
        .expect("running cargo cinstall");
    assert!(
        install.status.success(),
        "cargo cinstall failed:\n{}",
        String::from_utf8_lossy(&install.stderr)
    );
    for file in [
        "include/ri2n/ri2n.h",
        "lib/libri2n.so",
        "lib/libri2n.a",
        "lib/pkgconfig/ri2n.pc",
    ] {
        assert!(
            prefix.join(file).exists(),
            "cargo cinstall installed no {file}"
        );
    }
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "ri2n"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .expect("running pkg-config");
    assert!(flags.status.success(), "pkg-config does not know ri2n");
    let flags = String::from_utf8(flags.stdout).expect("pkg-config's output");
    let program = dir.join("transfer");
    let compiled = Command::new("cc")
        .args(["-std=c11", "-D_GNU_SOURCE", "-I"])
        .arg(crate_dir().join("tests/c"))
        .arg(crate_dir().join("tests/c/transfer.c"))
        .args(flags.split_whitespace())
        .arg("-lpthread")
        .arg(format!("-Wl,-rpath,{}", prefix.join("lib").display()))
        .arg("-o")
        .arg(&program)
        .output()
        .expect("running cc");
    assert!(
        compiled.status.success(),
        "cc $(pkg-config --cflags --libs ri2n) failed:\n{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let out = run_ok(&program, &[&dir], Duration::from_secs(120));
    assert!(
        out.contains("67108864 bytes intact over 2 links, keyed"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
