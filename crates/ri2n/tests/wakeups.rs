//! Which threads an arrival wakes. A blocked call watches the sockets and receives for
//! itself; when what arrives is for another connection's call, it hands it over and then
//! leaves the sockets to that call (the driver's `PollerTurn`), so a call waiting on an idle
//! connection is not woken for every message of a busy one.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use ri2n::{ConnectionConfig, Endpoint};

fn addrs() -> Vec<SocketAddr> {
    ["127.0.0.1:0", "127.0.0.2:0"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect()
}

/// Context switches so far of thread `tid` of this process.
fn switches(tid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    status
        .lines()
        .filter_map(|l| {
            l.strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
        })
        .map(|n| n.trim().parse::<u64>().unwrap())
        .sum()
}

#[test]
fn a_call_waiting_on_an_idle_connection_is_not_woken_by_a_busy_one() {
    const ROUNDS: usize = 3000;
    let server = Endpoint::server(&addrs()).unwrap();
    let client = Endpoint::client(&addrs()).unwrap();
    let to = server.local_addrs();
    let echo = thread::spawn(move || {
        let (mut busy, _idle) = (server.accept().unwrap(), server.accept().unwrap());
        let mut buf = [0u8; 64];
        for _ in 0..ROUNDS {
            busy.read_exact(&mut buf).unwrap();
            busy.write_all(&buf).unwrap();
        }
    });
    let mut busy = client.connect(&to, ConnectionConfig::default()).unwrap();
    busy.write_all(&[0u8; 64]).unwrap();
    let idle = client.connect(&to, ConnectionConfig::default()).unwrap();
    // the idle connection's call blocks first, so it is the one watching the sockets
    let (tid_tx, tid_rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        // SAFETY: gettid has no preconditions
        tid_tx.send(unsafe { libc::gettid() }).unwrap();
        let mut idle = idle;
        let mut byte = [0u8; 1];
        // the peer never writes: this returns at the end of its stream
        idle.read(&mut byte).unwrap()
    });
    let tid = tid_rx.recv().unwrap();
    thread::sleep(Duration::from_millis(100));
    let before = switches(tid);
    let mut reply = [0u8; 64];
    busy.read_exact(&mut reply).unwrap();
    for i in 1..ROUNDS {
        let msg = [i as u8; 64];
        busy.write_all(&msg).unwrap();
        busy.read_exact(&mut reply).unwrap();
        assert_eq!(reply, msg, "reply {i}");
    }
    let woken = switches(tid) - before;
    echo.join().unwrap();
    assert!(
        woken < ROUNDS as u64 / 20,
        "the idle connection's call was switched to {woken} times in {ROUNDS} round trips \
         of the busy one"
    );
    // the server's connections were dropped with its thread: the idle one's stream ended
    assert_eq!(waiter.join().unwrap(), 0);
}
