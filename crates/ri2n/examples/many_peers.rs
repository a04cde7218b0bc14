//! What idle connections cost a busy one on the same endpoint: a server endpoint holds IDLE
//! connections that only keep alive, and one more that runs a 64-byte message ping-pong;
//! prints the ping-pong's median round trip and the process's CPU time per round trip.
//! `cargo run --release -p ri2n --example many_peers -- [IDLE] [COUNT]`

use std::time::{Duration, Instant};

use ri2n::{ConnectionConfig, Endpoint};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let idle: usize = args.next().map_or(Ok(100), |a| a.parse())?;
    let count: usize = args.next().map_or(Ok(20000), |a| a.parse())?;
    let local = ["127.0.0.1:0".parse()?];
    let server = Endpoint::server(&local)?;
    let target = server.local_addrs()[0];
    // the idle peers: one client endpoint each, connected and then left alone
    let mut idle_peers = Vec::with_capacity(idle);
    let mut accepted = Vec::with_capacity(idle);
    for _ in 0..idle {
        let client = Endpoint::client(&local)?;
        let conn = client.connect(&[target], ConnectionConfig::default())?;
        accepted.push(server.accept()?);
        idle_peers.push((client, conn));
    }
    let busy = Endpoint::client(&local)?;
    let echo = std::thread::spawn(move || {
        let conn = server.accept().unwrap();
        while let Ok(Some(m)) = conn.recv_message() {
            conn.send_message(&m).unwrap();
        }
    });
    let conn = busy.connect(&[target], ConnectionConfig::default())?;
    std::thread::sleep(Duration::from_millis(200));
    let msg = [7u8; 64];
    let mut rtts = Vec::with_capacity(count);
    let cpu_before = process_cpu();
    for i in 0..count + 1000 {
        let t = Instant::now();
        conn.send_message(&msg)?;
        let back = conn.recv_message()?.expect("echo");
        assert_eq!(back, msg);
        if i >= 1000 {
            rtts.push(t.elapsed().as_nanos() as f64 / 1000.0);
        }
    }
    let cpu = process_cpu() - cpu_before;
    rtts.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{idle} idle connections: median round trip {:.1} us, process CPU {:.1} us per round trip",
        rtts[count / 2],
        cpu.as_secs_f64() * 1e6 / (count + 1000) as f64
    );
    conn.finish()?;
    drop(conn);
    echo.join().unwrap();
    Ok(())
}

/// CPU time of the whole process (every thread), user and system.
fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
