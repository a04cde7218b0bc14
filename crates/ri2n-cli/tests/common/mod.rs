//! What the `ri2n` command's tests share: child processes under deadlines, free loopback
//! ports, temporary files and transfers through `ri2n recv` and `ri2n send`.

#![allow(dead_code)]

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub const GIB: u64 = 1 << 30;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ri2n")
}

/// `/dev/full` opened for writing: an output that takes nothing (every write fails with
/// ENOSPC, as on a full disk).
pub fn dev_full() -> std::fs::File {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full")
}

/// Serialises the tests that move a lot of data or time failovers.
pub fn heavy() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A port free for UDP and TCP on both 127.0.0.1 and 127.0.0.2 right now, below the
/// kernel's ephemeral range (never the same one twice in this process). Below that range so
/// that no socket bound to port 0 meanwhile (a sender's link, a TCP client of another test)
/// can take it before the receiver this port is for binds it.
pub fn free_port() -> u16 {
    static NEXT: Mutex<Option<u16>> = Mutex::new(None);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000.min(ephemeral_low / 2), ephemeral_low);
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    // each test process starts elsewhere in the range, so that two running at once rarely
    // try the same ports
    let mut port = next.unwrap_or(low + (std::process::id() % 997) as u16 * 17 % (high - low));
    for _ in low..high {
        port = if port + 1 >= high { low } else { port + 1 };
        let free = ["127.0.0.1", "127.0.0.2"].iter().all(|ip| {
            UdpSocket::bind((*ip, port)).is_ok() && TcpListener::bind((*ip, port)).is_ok()
        });
        if free {
            *next = Some(port);
            return port;
        }
    }
    panic!("no port below {high} free on 127.0.0.1 and 127.0.0.2");
}

/// What a process wrote to a pipe so far, and the thread reading the pipe into it.
type PipeSeen = (Arc<Mutex<Vec<u8>>>, thread::JoinHandle<()>);

/// A child process, killed when dropped unless it was waited for.
pub struct Proc {
    pub name: &'static str,
    pub child: Option<Child>,
    /// Its stderr as read so far, and the thread reading it, once a test watches it while
    /// the process runs ([`Proc::wait_for_stderr`]).
    stderr_seen: Option<PipeSeen>,
}

impl Proc {
    pub fn spawn(name: &'static str, cmd: &mut Command) -> Self {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Self {
            name,
            child: Some(child),
            stderr_seen: None,
        }
    }

    /// Its pid (the process must not have been waited for).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("a process not waited for").id()
    }

    /// Panics, with what it wrote to stderr, if the process has exited.
    fn assert_running(&mut self, waiting_for: &str) {
        let child = self.child.as_mut().expect("a process not waited for");
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "{} exited ({status}) before {waiting_for}; stderr:\n{}",
                self.name,
                self.stderr_text()
            );
        }
    }

    /// What the process wrote to its (piped) stderr so far; empty before
    /// [`Proc::wait_for_stderr`] began reading it.
    pub fn stderr_text(&self) -> String {
        self.stderr_seen
            .as_ref()
            .map_or_else(String::new, |(seen, _)| {
                String::from_utf8_lossy(&seen.lock().unwrap()).into_owned()
            })
    }

    /// Waits until the process has written `needle` to its (piped) stderr: the premise of a
    /// test that acts once a process has reached a point it reports, which a fixed sleep only
    /// hopes for. From the first call on its stderr is read as it comes (and `wait` returns
    /// all of it). Panics after `limit`, or if the process exits first.
    pub fn wait_for_stderr(&mut self, needle: &str, limit: Duration) {
        let what = format!("{needle:?}");
        self.wait_for_stderr_that(&what, limit, |text| text.contains(needle));
    }

    /// [`wait_for_stderr`](Self::wait_for_stderr) for what `done` finds in the stderr so far,
    /// described as `what`.
    pub fn wait_for_stderr_that(
        &mut self,
        what: &str,
        limit: Duration,
        done: impl Fn(&str) -> bool,
    ) {
        if self.stderr_seen.is_none() {
            let child = self.child.as_mut().expect("a process not waited for");
            let mut pipe = child.stderr.take().expect("stderr piped");
            let seen = Arc::new(Mutex::new(Vec::new()));
            let into = seen.clone();
            let reader = thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                    into.lock().unwrap().extend_from_slice(&chunk[..n]);
                }
            });
            self.stderr_seen = Some((seen, reader));
        }
        let deadline = Instant::now() + limit;
        while !done(&self.stderr_text()) {
            self.assert_running(&format!("it wrote {what}"));
            assert!(
                Instant::now() < deadline,
                "{} did not write {what} within {limit:?}; stderr:\n{}",
                self.name,
                self.stderr_text()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until a thread of the process sleeps in one of the kernel functions `wchans`
    /// (`/proc/PID/task/TID/wchan`: `pipe_read`, or `anon_pipe_read` on newer kernels, for a
    /// read of an empty pipe; `wait_for_partner` for a FIFO's open waiting for its other end;
    /// kernels name them differently, so give every name): the premise of a test
    /// that acts on what a process waits in. Panics after `limit`, or if the process exits.
    pub fn wait_thread_in(&mut self, wchans: &[&str], limit: Duration) {
        self.wait_thread_where("wchan", wchans, limit);
    }

    /// Waits until the process has a thread named `name` (`/proc/PID/task/TID/comm`), e.g. a
    /// runtime's worker. Panics after `limit`, or if the process exits.
    pub fn wait_thread_named(&mut self, name: &str, limit: Duration) {
        self.wait_thread_where("comm", &[name], limit);
    }

    /// Waits until the file `file` of some thread of the process (`/proc/PID/task/TID/FILE`,
    /// its trailing newline aside) reads one of `values`.
    fn wait_thread_where(&mut self, file: &str, values: &[&str], limit: Duration) {
        let tasks = format!("/proc/{}/task", self.pid());
        let what = format!("a thread's {file} read one of {values:?}");
        let deadline = Instant::now() + limit;
        loop {
            let seen: Vec<String> = std::fs::read_dir(&tasks)
                .map(|d| {
                    d.filter_map(Result::ok)
                        .filter_map(|t| std::fs::read_to_string(t.path().join(file)).ok())
                        .map(|v| v.trim_end().to_owned())
                        .collect()
                })
                .unwrap_or_default();
            if seen.iter().any(|v| values.contains(&v.as_str())) {
                return;
            }
            self.assert_running(&what);
            assert!(
                Instant::now() < deadline,
                "{}: not {what} within {limit:?}: {seen:?}",
                self.name
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `signal` to the process, which must not have been waited for yet (its pid is
    /// then still its own).
    pub fn signal(&self, signal: libc::c_int) {
        let pid = self.pid();
        // SAFETY: kill(2) of a child this test started and has not reaped
        unsafe { libc::kill(pid as libc::pid_t, signal) };
    }

    /// Waits for the exit and the output, at most `limit`; kills the process and panics after.
    pub fn wait(mut self, limit: Duration) -> (ExitStatus, Output) {
        let mut child = self.child.take().unwrap();
        // read the pipes in the background so a chatty child never blocks on them
        let mut out = child.stdout.take();
        let mut err = child.stderr.take();
        let seen = self.stderr_seen.take();
        let out_t = thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(o) = out.as_mut() {
                let _ = o.read_to_end(&mut v);
            }
            v
        });
        let err_t = thread::spawn(move || {
            // read from the start, or by the thread that was watching it
            if let Some((seen, reader)) = seen {
                let _ = reader.join();
                return std::mem::take(&mut *seen.lock().unwrap());
            }
            let mut v = Vec::new();
            if let Some(e) = err.as_mut() {
                let _ = e.read_to_end(&mut v);
            }
            v
        });
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                let stderr = err_t.join().unwrap();
                panic!(
                    "{} did not finish within {limit:?}; stderr:\n{}",
                    self.name,
                    String::from_utf8_lossy(&stderr)
                );
            }
            thread::sleep(Duration::from_millis(10));
        };
        let output = Output {
            status,
            stdout: out_t.join().unwrap(),
            stderr: err_t.join().unwrap(),
        };
        (status, output)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A file in the temp dir, removed when dropped.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        Self(std::env::temp_dir().join(format!(
            "ri2n-cli-test-{}-{}-{nanos}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )))
    }

    /// A new directory under a name made as [`TempFile::new`] makes one.
    pub fn dir(tag: &str) -> Self {
        let dir = Self::new(tag);
        std::fs::create_dir(dir.path()).unwrap();
        dir
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Where `ri2n recv --output` writes this file until it is complete.
    pub fn partial(&self) -> PathBuf {
        let mut p = self.0.as_os_str().to_owned();
        p.push(".partial");
        PathBuf::from(p)
    }
}

/// Removes the file (or the directory a test made under its name, with what it holds), and
/// what a receiver that did not finish left under its partial name.
impl Drop for TempFile {
    fn drop(&mut self) {
        if std::fs::remove_file(&self.0).is_err() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
        let _ = std::fs::remove_file(self.partial());
    }
}

/// Writes `len` pseudo-random bytes (xorshift, 1 MiB at a time) to `path`; returns their sha256.
pub fn write_random(path: &Path, len: u64, seed: u64) -> [u8; 32] {
    let mut f = BufWriter::new(File::create(path).unwrap());
    let mut h = Sha256::new();
    let mut x = seed | 1;
    let mut block = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for w in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n]).unwrap();
        h.update(&block[..n]);
        left -= n as u64;
    }
    f.flush().unwrap();
    h.finalize().into()
}

pub fn sha256_file(path: &Path) -> ([u8; 32], u64) {
    let mut f = File::open(path).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0;
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        len += n as u64;
    }
    (h.finalize().into(), len)
}

pub fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `ri2n ARGS` (stdin empty, output captured) and waits for it, at most `limit`.
pub fn ri2n<I, A>(args: I, limit: Duration) -> (ExitStatus, Output)
where
    I: IntoIterator<Item = A>,
    A: AsRef<std::ffi::OsStr>,
{
    Proc::spawn(
        "ri2n",
        Command::new(bin())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .wait(limit)
}

/// Starts `ri2n recv` listening on both loopback addresses at `port` and writing to
/// `output`, with `extra` options; returns it, once it listens, and the address a sender
/// connects to. (A sender that finds the port closed exits at once, "nothing listens": on a
/// loaded host a receiver may take longer than any fixed pause to bind it.)
pub fn spawn_recv(port: u16, output: &Path, extra: &[&str]) -> (Proc, String) {
    let (recv, a) = start_recv(port, output, extra);
    if extra.windows(2).any(|w| w == ["--transport", "tcp"]) {
        wait_tcp_listening(&a, Duration::from_secs(10));
    } else {
        wait_udp_bound(port, Duration::from_secs(10));
    }
    (recv, a)
}

/// [`spawn_recv`] without waiting for it to listen: for a receiver that is to fail first.
pub fn start_recv(port: u16, output: &Path, extra: &[&str]) -> (Proc, String) {
    let a = format!("127.0.0.1:{port}");
    let b = format!("127.0.0.2:{port}");
    let recv = Proc::spawn(
        "ri2n recv",
        Command::new(bin())
            .args(["recv", "--listen", &a, "--listen", &b, "--output"])
            .arg(output)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    (recv, a)
}

/// Starts `ri2n send --to TO` with `extra` options, its stdin, stdout and stderr piped: the
/// test feeds its input (or holds it open) and reads what it says.
pub fn spawn_piped_send(to: &str, extra: &[&str]) -> Proc {
    Proc::spawn(
        "ri2n send",
        Command::new(bin())
            .args(["send", "--to", to])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
}

/// Waits until some socket is bound to UDP port `port` on 127.0.0.1 (a receiver just
/// spawned is ready), looking at `/proc/net/udp` rather than binding the port itself, which
/// could take it from the receiver. Panics after `limit`.
pub fn wait_udp_bound(port: u16, limit: Duration) {
    let local = format!("0100007F:{port:04X}");
    let deadline = Instant::now() + limit;
    loop {
        let table = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
        if table
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(local.as_str()))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "nothing bound 127.0.0.1:{port} within {limit:?}"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the file at `path` holds some bytes (a receiver writing `FILE.partial`: the
/// transfer is under way). Panics after `limit`.
pub fn wait_file_grows(path: &Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    while std::fs::metadata(path).map_or(0, |m| m.len()) == 0 {
        assert!(
            Instant::now() < deadline,
            "nothing was written to {} within {limit:?}",
            path.display()
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until something accepts TCP connections on `addr` (a TCP-transport receiver or
/// server just spawned is ready: before, a TCP client is refused, where a UDP one retries its
/// handshake). Panics after `limit`.
pub fn wait_tcp_listening(addr: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing listened on {addr} within {limit:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// `ri2n recv` on both loopback addresses and `ri2n send` to the first one, `len` random
/// bytes, with `sender_args` added to the sender; checks exit codes and sha256. Returns the
/// sender's output.
pub fn transfer(len: u64, sender_args: &[&str]) -> Output {
    let input = TempFile::new("in");
    let output = TempFile::new("out");
    let t = Instant::now();
    let sent_hash = write_random(input.path(), len, 0x1234_5678_9ABC_DEF1 ^ len);
    println!("generated {} MiB in {:?}", len >> 20, t.elapsed());
    let (recv, a) = spawn_recv(free_port(), output.path(), &[]);
    let start = Instant::now();
    let send = Proc::spawn(
        "ri2n send",
        Command::new(bin())
            .args(["send", "--to", &a, "--input"])
            .arg(input.path())
            .args(sender_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let (s, so) = send.wait(Duration::from_secs(150));
    let elapsed = start.elapsed();
    let (r, ro) = recv.wait(Duration::from_secs(20));
    println!("send: {}", stderr_of(&so).trim());
    println!("recv: {}", stderr_of(&ro).trim());
    assert!(s.success(), "send failed: {s}: {}", stderr_of(&so));
    assert!(r.success(), "recv failed: {r}: {}", stderr_of(&ro));
    let (got_hash, got_len) = sha256_file(output.path());
    assert_eq!(got_len, len, "received length");
    assert!(
        got_hash == sent_hash,
        "sha256 of the output differs from the input's"
    );
    println!(
        "{} MiB {sender_args:?}: {elapsed:.2?}, {:.0} Mbit/s",
        len >> 20,
        len as f64 * 8.0 / elapsed.as_secs_f64() / 1e6
    );
    so
}

/// Starts `ri2n serve` on both loopback addresses with `extra` options; returns it, once it
/// listens, and its first address.
pub fn spawn_serve(extra: &[&str]) -> (Proc, String) {
    let port = free_port();
    let a = format!("127.0.0.1:{port}");
    let b = format!("127.0.0.2:{port}");
    let p = Proc::spawn(
        "ri2n serve",
        Command::new(bin())
            .args(["serve", "--listen", &a, "--listen", &b])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    if extra.windows(2).any(|w| w == ["--transport", "tcp"]) {
        wait_tcp_listening(&a, Duration::from_secs(10));
    } else {
        wait_udp_bound(port, Duration::from_secs(10));
    }
    (p, a)
}

/// `ri2n send --to TO --input INPUT EXTRA...`, waited for at most 20 s.
pub fn send_file(to: &str, input: &Path, extra: &[&str]) -> (ExitStatus, Output) {
    let mut args = vec!["send", "--to", to, "--input", input.to_str().unwrap()];
    args.extend_from_slice(extra);
    ri2n(args, Duration::from_secs(20))
}

/// `input` (`sent`: its SHA-256 and length) sent quietly to `recv`, listening on `to` and
/// writing `output`: both exit 0, and `output` holds it.
pub fn send_whole(recv: Proc, to: &str, input: &Path, sent: [u8; 32], output: &Path) {
    let (s, so) = send_file(to, input, &["--quiet"]);
    let (r, ro) = recv.wait(Duration::from_secs(20));
    assert!(s.success(), "send: {}", stderr_of(&so));
    assert!(r.success(), "recv: {}", stderr_of(&ro));
    let len = std::fs::metadata(input).unwrap().len();
    assert_eq!(sha256_file(output), (sent, len));
}

/// Waits for every process of `procs`, at most `limit` in all (kills them and panics after);
/// returns each one's exit status and peak resident memory in KiB, its `VmHWM` read while it
/// runs. Not `ru_maxrss`: the kernel carries the peak of the address space a process had
/// before `exec` into it, so a child's would count this test process's own memory at the
/// moment it spawned the child, whatever other tests had it hold.
pub fn wait_peak_rss(procs: &mut [&mut Proc], limit: Duration) -> Vec<(ExitStatus, u64)> {
    let deadline = Instant::now() + limit;
    let mut peak: Vec<Option<u64>> = vec![None; procs.len()];
    let mut ended: Vec<Option<ExitStatus>> = vec![None; procs.len()];
    while ended.iter().any(Option::is_none) {
        for (i, p) in procs.iter_mut().enumerate() {
            let Some(child) = p.child.as_mut() else {
                continue;
            };
            // read before reaping: a process that has exited has no memory left to read
            peak[i] = peak[i].max(vm_hwm_kib(child.id()));
            if let Some(status) = child.try_wait().expect("waitpid") {
                // reaped: its pid may be reused, so it is never signalled again
                p.child = None;
                ended[i] = Some(status);
            }
        }
        if ended.iter().any(Option::is_none) && Instant::now() >= deadline {
            let late: Vec<&str> = procs
                .iter_mut()
                .filter_map(|p| {
                    let mut child = p.child.take()?;
                    let _ = child.kill();
                    let _ = child.wait();
                    Some(p.name)
                })
                .collect();
            panic!("{late:?} did not finish within {limit:?}");
        }
        thread::sleep(Duration::from_millis(10));
    }
    let read = |(i, p): (usize, &mut &mut Proc)| {
        let kib = peak[i].unwrap_or_else(|| panic!("{} ended before its memory was read", p.name));
        (ended[i].expect("every process ended"), kib)
    };
    procs.iter_mut().enumerate().map(read).collect()
}

/// The peak resident memory (`VmHWM`) of a running process, KiB.
fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Whether this test runs as root; without, it is skipped saying it needs root for `what`,
/// or fails where `CI` is set (CI runs as root: a skip there would hide the test).
pub fn root_or_skip(what: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "needs root ({what})");
    eprintln!("skipped: needs root ({what})");
    false
}
