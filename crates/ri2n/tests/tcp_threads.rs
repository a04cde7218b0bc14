//! How the TCP transport's threads are scheduled and woken (alone in this test binary, so
//! that no other test's threads are counted; its tests one at a time): the links' readers
//! run under `SCHED_BATCH`, so the wake-up for each arrival waits for the thread running on
//! that CPU to finish its call instead of preempting it (docs/BENCHMARKS.md §10); the
//! writers, which keep their links busy, and the watch thread, which declares links dead,
//! keep the default policy. An exchange of messages is sent by the application threads
//! themselves: the ACKs it brings do not wake the writers each time.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use ri2n::{Connection, ConnectionConfig, Endpoint, EndpointConfig, LinkState, Transport};

/// The tests of this file one at a time: each looks at the threads of its own connections.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn endpoint(server: bool) -> Endpoint {
    let addrs: Vec<SocketAddr> = ["127.0.0.1:0", "127.0.0.2:0"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    let cfg = EndpointConfig::new(addrs).with_transport(Transport::Tcp);
    Endpoint::bind(if server { cfg.server() } else { cfg }).unwrap()
}

/// A connection over two links between a client and a server of this process, once both
/// links are up at both ends (the second joins a moment after the handshake): the two
/// endpoints (kept while it is used), the client's side and the server's.
fn connection() -> ((Endpoint, Endpoint), Connection, Connection) {
    let server = endpoint(true);
    let client = endpoint(false);
    let conn = client
        .connect(&[server.local_addrs()[0]], ConnectionConfig::default())
        .unwrap();
    let peer = server.accept().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let up = |c: &Connection| {
        let links = c.stats().links;
        links.len() == 2 && links.iter().all(|l| l.state == LinkState::Up)
    };
    while !(up(&conn) && up(&peer)) {
        assert!(Instant::now() < deadline, "links not up within 10 s");
        thread::sleep(Duration::from_millis(5));
    }
    ((client, server), conn, peer)
}

/// The ID, name and `/proc` folder of each thread of this process (a thread that ends while
/// it is read is left out).
fn threads() -> Vec<(libc::pid_t, String, std::path::PathBuf)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").unwrap() {
        let entry = entry.unwrap();
        let Ok(tid) = entry.file_name().to_string_lossy().parse::<libc::pid_t>() else {
            continue;
        };
        if let Ok(name) = std::fs::read_to_string(entry.path().join("comm")) {
            out.push((tid, name.trim().to_string(), entry.path()));
        }
    }
    out
}

/// The name and scheduling policy of each thread of this process.
fn thread_policies() -> Vec<(String, i32)> {
    (threads().into_iter())
        .filter_map(|(tid, name, _)| {
            // SAFETY: sched_getscheduler reads no memory of ours; a thread that ended returns -1
            let policy = unsafe { libc::sched_getscheduler(tid) };
            (policy >= 0).then_some((name, policy))
        })
        .collect()
}

#[test]
fn link_readers_yield_to_busy_threads_and_writers_and_the_watch_do_not() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (_ends, mut conn, mut peer) = connection();
    // data both ways: every link's threads have started by the time it arrives
    let data = vec![7u8; 1 << 20];
    conn.write_all(&data).unwrap();
    let mut got = vec![0u8; data.len()];
    peer.read_exact(&mut got).unwrap();
    peer.write_all(&data).unwrap();
    conn.read_exact(&mut got).unwrap();
    assert_eq!(got, data);

    // both ends live in this process: 2 links, each with a reader and a writer, per end; a
    // reader just started may not have set its policy yet, so look again for a while
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let threads = thread_policies();
        // ri2n-tcp-rN and ri2n-tcp-wN (ri2n-tcp-watch is neither)
        let of_kind = |kind: &str| -> Vec<i32> {
            (threads.iter())
                .filter(|(n, _)| {
                    let link = n.strip_prefix(kind);
                    link.is_some_and(|k| k.parse::<usize>().is_ok())
                })
                .map(|(_, p)| *p)
                .collect()
        };
        let (readers, writers) = (of_kind("ri2n-tcp-r"), of_kind("ri2n-tcp-w"));
        let watch: Vec<i32> = (threads.iter())
            .filter(|(n, _)| n == "ri2n-tcp-watch")
            .map(|(_, p)| *p)
            .collect();
        // (threads of the other test's connections may still be ending: at least these)
        if readers.len() >= 4 && readers.iter().all(|&p| p == libc::SCHED_BATCH) {
            let other = |ps: &[i32], n| ps.len() >= n && ps.iter().all(|&p| p == libc::SCHED_OTHER);
            assert!(other(&writers, 4), "{threads:?}");
            assert!(other(&watch, 2), "{threads:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the links' readers are not all under SCHED_BATCH: {threads:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How often the threads of this process whose name `pick` accepts went to sleep so far
/// (their voluntary context switches: each was woken after; preemptions are not counted).
fn switches_of(pick: impl Fn(&str) -> bool) -> u64 {
    (threads().into_iter())
        .filter(|(_, name, _)| pick(name))
        // a thread that ended meanwhile counts nothing
        .filter_map(|(_, _, path)| std::fs::read_to_string(path.join("status")).ok())
        .flat_map(|status| {
            (status.lines())
                .filter_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .map(|n| n.trim().parse::<u64>().unwrap())
                .collect::<Vec<_>>()
        })
        .sum()
}

#[test]
fn an_exchange_of_messages_does_not_wake_the_writers_for_every_ack() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const EXCHANGES: usize = 500;
    let (_ends, mut conn, mut peer) = connection();
    // a request of 8 KiB, whole on one link, answered by one byte, as an RPC or MPI does
    let request = vec![3u8; 8 << 10];
    let answer = thread::spawn(move || {
        let mut got = vec![0u8; 8 << 10];
        for _ in 0..=EXCHANGES {
            peer.read_exact(&mut got).unwrap();
            assert!(got.iter().all(|&b| b == 3));
            peer.write_all(b"k").unwrap();
        }
        peer
    });
    let mut ack = [0u8; 1];
    // the first exchange starts every link's threads
    conn.write_all(&request).unwrap();
    conn.read_exact(&mut ack).unwrap();
    let writer = |n: &str| {
        n.strip_prefix("ri2n-tcp-w")
            .is_some_and(|k| k.parse::<usize>().is_ok())
    };
    let reader = |n: &str| {
        n.strip_prefix("ri2n-tcp-r")
            .is_some_and(|k| k.parse::<usize>().is_ok())
    };
    let (writers_before, readers_before) = (switches_of(writer), switches_of(reader));
    let started = Instant::now();
    for _ in 0..EXCHANGES {
        conn.write_all(&request).unwrap();
        conn.read_exact(&mut ack).unwrap();
        assert_eq!(&ack, b"k");
    }
    let elapsed = started.elapsed();
    let (writers, readers) = (
        switches_of(writer) - writers_before,
        switches_of(reader) - readers_before,
    );
    drop(answer.join().unwrap());
    // the premise: every request and answer was read by a link's reader, woken for it
    assert!(readers >= EXCHANGES as u64, "readers woke {readers} times");
    // each of the 4 writers wakes when its link was quiet for 5 ms, for a PING
    // (docs/PROTOCOL.md §12.4), and for an ACK that finds bytes in flight (the next
    // request's, when the answer came first); no longer for every ACK received, four
    // wake-ups per exchange
    let keepalives = 4 * (elapsed.as_millis() as u64 / 5 + 1);
    assert!(
        writers <= keepalives + 2 * EXCHANGES as u64,
        "the writers woke {writers} times in {EXCHANGES} exchanges ({elapsed:?})"
    );
}
