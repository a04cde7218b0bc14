//! Helpers shared by the tests: the echo tests' addresses and payloads, and waiting for a
//! thread to be asleep (the premise of a test that acts on what another thread waits in).

#![allow(dead_code)] // each test binary uses some of them

use std::net::SocketAddr;
use std::time::{Duration, Instant};

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
