//! Endpoints of a process confined to one CPU (`taskset -c 0`, an MPI rank bound to a core),
//! where the driver thread leaves the sockets to application calls that keep waiting on them:
//! messages and streams still arrive exact, and what arrives while the application is away
//! is still received and acknowledged without it.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ri2n::{ConnectionConfig, Endpoint};

fn addrs() -> Vec<SocketAddr> {
    ["127.0.0.1:0", "127.0.0.2:0"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect()
}

/// Confines the calling thread to one of the CPUs it may use now; the threads it starts
/// afterwards (an endpoint's driver thread among them) inherit that.
fn pin_to_one_cpu() {
    // SAFETY: an all-zero `cpu_set_t` is a valid empty set; the calls read and write at most
    // `size_of::<cpu_set_t>()` bytes of it.
    unsafe {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(0, size, &mut set), 0);
        let cpu = (0..libc::CPU_SETSIZE as usize)
            .find(|&c| libc::CPU_ISSET(c, &set))
            .expect("some CPU allowed");
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        assert_eq!(libc::sched_setaffinity(0, size, &one), 0);
    }
}

/// Runs `test` on a thread of its own (which `pinned_pair` confines to one CPU), one test at
/// a time: the tests share that CPU, and one counts the context switches of every driver
/// thread of the process.
fn on_one_cpu(test: impl FnOnce() + Send + 'static) {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    thread::spawn(test).join().unwrap();
}

/// A server and a client endpoint on two loopback links, whose threads (the calling one
/// included) may run on one CPU only.
fn pinned_pair() -> (Endpoint, Endpoint) {
    pin_to_one_cpu();
    let server = Endpoint::server(&addrs()).unwrap();
    let client = Endpoint::client(&addrs()).unwrap();
    (server, client)
}

/// The `i`th message of an exchange: its number, then bytes that depend on it.
fn message(i: u32) -> [u8; 64] {
    let mut m = [0u8; 64];
    m[..4].copy_from_slice(&i.to_le_bytes());
    for (k, b) in m[4..].iter_mut().enumerate() {
        *b = (i as usize * 7 + k) as u8;
    }
    m
}

#[test]
fn request_response_and_a_stream_arrive_exact_on_one_cpu() {
    on_one_cpu(|| {
        let (server, client) = pinned_pair();
        let server_addrs = server.local_addrs();
        let echo = thread::spawn(move || {
            let mut conn = server.accept().unwrap();
            let mut buf = [0u8; 64];
            for _ in 0..2000 {
                conn.read_exact(&mut buf).unwrap();
                conn.write_all(&buf).unwrap();
            }
            // then a stream: everything read is counted and compared with what was sent
            let mut got = Vec::new();
            conn.read_to_end(&mut got).unwrap();
            got
        });
        let mut conn = client
            .connect(&server_addrs, ConnectionConfig::default())
            .unwrap();
        let mut reply = [0u8; 64];
        for i in 0..2000 {
            conn.write_all(&message(i)).unwrap();
            conn.read_exact(&mut reply).unwrap();
            assert_eq!(reply, message(i), "reply {i}");
        }
        let stream: Vec<u8> = (0..8u32 << 20).map(|i| (i * 31 + i / 977) as u8).collect();
        conn.write_all(&stream).unwrap();
        conn.finish().unwrap();
        conn.wait_acknowledged(Some(Duration::from_secs(60)))
            .unwrap();
        assert!(echo.join().unwrap() == stream, "the stream arrived changed");
    });
}

/// Context switches so far of this process's threads named `ri2n-driver-…` (every
/// endpoint's driver threads), from `/proc/self/task/*/status`.
fn driver_thread_switches() -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("ri2n-driver") {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        for line in status.lines() {
            if let Some(n) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                total += n.trim().parse::<u64>().unwrap();
            }
        }
    }
    total
}

/// On one CPU the driver threads leave the sockets to the application calls that wait on
/// them (`STEP_BACK` in the driver): in a request-response exchange the calls receive for
/// themselves, and the driver threads, which could only take turns with them on that CPU,
/// wake for their timer ticks (at most one per millisecond each) but not for the messages.
/// Without the step-back most round trips also switched to a driver thread.
#[test]
fn on_one_cpu_a_request_response_exchange_leaves_the_driver_threads_asleep() {
    on_one_cpu(|| {
        let (server, client) = pinned_pair();
        let server_addrs = server.local_addrs();
        const ROUNDS: u32 = 4000;
        let echo = thread::spawn(move || {
            let mut conn = server.accept().unwrap();
            let mut buf = [0u8; 64];
            for _ in 0..ROUNDS {
                conn.read_exact(&mut buf).unwrap();
                conn.write_all(&buf).unwrap();
            }
            conn
        });
        let mut conn = client
            .connect(&server_addrs, ConnectionConfig::default())
            .unwrap();
        let mut reply = [0u8; 64];
        // warm up, then count
        for i in 0..1000 {
            conn.write_all(&message(i)).unwrap();
            conn.read_exact(&mut reply).unwrap();
        }
        let (before, start) = (driver_thread_switches(), Instant::now());
        for i in 1000..ROUNDS {
            conn.write_all(&message(i)).unwrap();
            conn.read_exact(&mut reply).unwrap();
            assert_eq!(reply, message(i), "reply {i}");
        }
        let switches = driver_thread_switches() - before;
        let ticks = 2 * start.elapsed().as_millis() as u64; // two driver threads
        let rounds = u64::from(ROUNDS - 1000);
        drop(echo.join().unwrap());
        assert!(
            switches < ticks + rounds / 8,
            "the driver threads were switched to {switches} times in {rounds} round trips \
             ({ticks} timer ticks at most)"
        );
    });
}

#[test]
fn data_is_acknowledged_while_the_application_is_away_on_one_cpu() {
    on_one_cpu(|| {
        let (server, client) = pinned_pair();
        let server_addrs = server.local_addrs();
        let back = Arc::new(AtomicBool::new(false));
        let server_back = back.clone();
        // the application comes back when told that everything was acknowledged, or after
        // AWAY whatever happens
        const AWAY: Duration = Duration::from_secs(30);
        let (call_back, away_until) = std::sync::mpsc::channel::<()>();
        let (gone_away, went_away) = std::sync::mpsc::channel::<()>();
        let away = thread::spawn(move || {
            let mut conn = server.accept().unwrap();
            // a call that waited on the sockets: the driver thread steps back from them...
            let mut hello = [0u8; 5];
            conn.read_exact(&mut hello).unwrap();
            gone_away.send(()).unwrap();
            // ...and the application is away long after that, calling nothing
            let _ = away_until.recv_timeout(AWAY);
            server_back.store(true, Ordering::SeqCst);
            let mut got = Vec::new();
            conn.read_to_end(&mut got).unwrap();
            (hello, got)
        });
        let mut conn = client
            .connect(&server_addrs, ConnectionConfig::default())
            .unwrap();
        conn.write_all(b"hello").unwrap();
        // the data goes once the receiving application has its hello and is away
        went_away.recv().unwrap();
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
        conn.write_all(&data).unwrap();
        // the receiver's driver thread takes the sockets back and acknowledges everything
        // (it fits the receive window) while its application sleeps
        while conn.stats().send_buffered > 0 && !back.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(5));
        }
        assert!(
            !back.load(Ordering::SeqCst),
            "not acknowledged while the receiving application was away ({AWAY:?})"
        );
        call_back.send(()).unwrap();
        conn.finish().unwrap();
        conn.wait_acknowledged(Some(Duration::from_secs(30)))
            .unwrap();
        let (hello, got) = away.join().unwrap();
        assert_eq!(&hello, b"hello");
        assert!(got == data, "the data arrived changed");
    });
}
