//! Helpers shared by the tests: the echo tests' addresses and payloads, waiting for a thread
//! to be asleep (the premise of a test that acts on what another thread waits in), and a raw
//! client's hello on the TCP transport.

#![allow(dead_code)] // each test binary uses some of them

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ri2n_proto::tcp::frame::{Hello, HelloReply};

/// Bytes each echo client sends.
pub const BYTES_EACH: usize = 100_000;

/// `ip`, any port.
pub fn loopback(ip: &str) -> SocketAddr {
    format!("{ip}:0").parse().unwrap()
}

/// Client `k`'s bytes: distinct per client, so a mix-up between connections shows.
pub fn payload(k: usize) -> Vec<u8> {
    (0..BYTES_EACH)
        .map(|i| (i.wrapping_mul(31) ^ k.wrapping_mul(7919)) as u8)
        .collect()
}

/// The calling thread's id, for [`wait_asleep`] from another thread.
pub fn gettid() -> i32 {
    // SAFETY: gettid(2) has no preconditions
    unsafe { libc::gettid() }
}

/// Spawns a thread that runs `f`; returns it and its id (known before `f` begins), for
/// [`wait_asleep`] on the call `f` blocks in.
pub fn spawn_with_tid<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> (std::thread::JoinHandle<T>, i32) {
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        tid_tx.send(gettid()).unwrap();
        f()
    });
    (handle, tid_rx.recv().unwrap())
}

/// Waits until thread `tid` of this process is asleep in one kernel function, seen twice
/// 10 ms apart, and returns that function (`/proc/self/task/TID/wchan`; `0` where the kernel
/// does not name it). Panics after 10 s.
pub fn asleep_in(tid: i32) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = None;
    loop {
        let now = (thread_state(tid) == "S").then(|| thread_file(tid, "wchan"));
        if now.is_some() && now == last {
            return now.unwrap_or_default();
        }
        assert!(Instant::now() < deadline, "thread {tid} never slept");
        last = now;
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `/proc/self/task/TID/FILE`, empty if it cannot be read.
fn thread_file(tid: i32, file: &str) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/{file}")).unwrap_or_default()
}

/// The state letter of thread `tid` of this process (`S`: asleep): the field after the
/// command name, which is in parentheses.
fn thread_state(tid: i32) -> String {
    let stat = thread_file(tid, "stat");
    let after = stat.rsplit(')').next().unwrap_or_default();
    after
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Waits until thread `tid` of this process is asleep, seen twice 10 ms apart, and, given
/// `wchan`, in that kernel function (`/proc/self/task/TID/wchan`; `do_epoll_wait`: a call
/// blocked watching the sockets; a kernel that does not name it, `0`, is taken at the state
/// alone): the premise a fixed sleep would only hope for. Panics after 10 s.
pub fn wait_asleep(tid: i32, wchan: Option<&str>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = 0;
    while seen < 2 {
        let now = thread_file(tid, "wchan");
        let asleep = thread_state(tid) == "S";
        let there = asleep && wchan.is_none_or(|w| now == w || now == "0");
        seen = if there { seen + 1 } else { 0 };
        assert!(
            Instant::now() < deadline,
            "thread {tid} never slept in {wchan:?} (last in {now:?})"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A raw TCP connection to `to` that has said the hello of link `link` of connection `id`
/// (a new one, without a key), as a client of the TCP transport would.
pub fn say_hello(to: SocketAddr, id: u64, link: u8) -> TcpStream {
    say_hello_with(to, id, link, None)
}

/// [`say_hello`], keyed when `handshake` holds the first message of a link's handshake (it
/// follows the hello, after its 2-byte length).
pub fn say_hello_with(to: SocketAddr, id: u64, link: u8, handshake: Option<&[u8]>) -> TcpStream {
    let mut s = TcpStream::connect(to).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = Vec::new();
    Hello {
        connection_id: id,
        link,
        new_connection: true,
        keyed: handshake.is_some(),
        takes_messages: false,
        window: 1 << 20,
        application: None,
    }
    .encode(&mut b);
    if let Some(m) = handshake {
        b.extend_from_slice(&u16::try_from(m.len()).unwrap().to_be_bytes());
        b.extend_from_slice(m);
    }
    s.write_all(&b).unwrap();
    s
}

/// Reads the server's reply to a hello from `s`: the reply, what was read (the reply and
/// whatever followed it), and the reply's length.
pub fn read_reply(s: &mut TcpStream) -> (HelloReply, Vec<u8>, usize) {
    let mut buf = Vec::new();
    loop {
        if let Some((r, n)) = HelloReply::parse(&buf).unwrap() {
            return (r, buf, n);
        }
        let mut chunk = [0u8; 512];
        let got = s.read(&mut chunk).unwrap();
        assert!(got > 0, "no reply to the hello");
        buf.extend_from_slice(&chunk[..got]);
    }
}
