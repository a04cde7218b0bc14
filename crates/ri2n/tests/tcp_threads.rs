//! How the TCP transport's threads are scheduled (alone in this test binary, so that no other
//! test's threads are counted): the links' readers run under `SCHED_BATCH`, so the wake-up
//! for each arrival waits for the thread running on that CPU to finish its call instead of
//! preempting it (docs/BENCHMARKS.md §10); the writers, which keep their links busy, and the
//! watch thread, which declares links dead, keep the default policy.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ri2n::{ConnectionConfig, Endpoint, EndpointConfig, Transport};

fn endpoint(server: bool) -> Endpoint {
    let addrs: Vec<SocketAddr> = ["127.0.0.1:0", "127.0.0.2:0"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    let cfg = EndpointConfig::new(addrs).with_transport(Transport::Tcp);
    Endpoint::bind(if server { cfg.server() } else { cfg }).unwrap()
}

/// The name and scheduling policy of each thread of this process.
fn thread_policies() -> Vec<(String, i32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").unwrap() {
        let entry = entry.unwrap();
        let Ok(tid) = entry.file_name().to_string_lossy().parse::<libc::pid_t>() else {
            continue;
        };
        let Ok(name) = std::fs::read_to_string(entry.path().join("comm")) else {
            continue; // the thread ended meanwhile
        };
        // SAFETY: sched_getscheduler reads no memory of ours; a thread that ended returns -1
        let policy = unsafe { libc::sched_getscheduler(tid) };
        if policy >= 0 {
            out.push((name.trim().to_string(), policy));
        }
    }
    out
}

#[test]
fn link_readers_yield_to_busy_threads_and_writers_and_the_watch_do_not() {
    let server = endpoint(true);
    let client = endpoint(false);
    let mut conn = client
        .connect(&[server.local_addrs()[0]], ConnectionConfig::default())
        .unwrap();
    let mut peer = server.accept().unwrap();
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
        if readers.len() == 4 && readers.iter().all(|&p| p == libc::SCHED_BATCH) {
            assert_eq!(writers, [libc::SCHED_OTHER; 4], "{threads:?}");
            assert_eq!(watch, [libc::SCHED_OTHER; 2], "{threads:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the links' readers are not all under SCHED_BATCH: {threads:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
