//! Round trips of small whole messages through the Rust library, over two loopback links:
//! the counterpart of `bench/pingpong.c`, for `bench/run-all bindings` to compare the C
//! interface's cost against.
//!
//! usage: `pingpong [ROUNDS [SIZE]]` (default 20000 round trips of 64 bytes); prints one JSON
//! line: `{"median_us": ..., "p99_us": ..., "rounds": ..., "size": ...}`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ri2n::{ConnectionConfig, Endpoint};

const WARMUP: usize = 1000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(Ok(20000), |a| a.parse())?;
    let size: usize = args.next().map_or(Ok(64), |a| a.parse())?;
    let addrs: Vec<SocketAddr> = vec!["127.0.0.1:0".parse()?, "127.0.0.2:0".parse()?];
    let server = Endpoint::server(&addrs)?;
    let addr = server.local_addrs()[0];
    let echoer = std::thread::spawn(move || -> std::io::Result<()> {
        let c = server
            .accept_timeout(Some(Duration::from_secs(10)))
            .map_err(std::io::Error::other)?
            .ok_or_else(|| std::io::Error::other("no client"))?;
        while let Some(m) = c.recv_message()? {
            c.send_message(&m)?;
        }
        Ok(())
    });
    let client = Endpoint::client(&addrs)?;
    let c = client.connect(&[addr], ConnectionConfig::default())?;
    let msg = vec![0x5au8; size];
    let mut rtts = Vec::with_capacity(rounds);
    for i in 0..WARMUP + rounds {
        let t0 = Instant::now();
        c.send_message(&msg)?;
        let back = c.recv_message()?.ok_or("the echo ended")?;
        let rtt = t0.elapsed();
        if back != msg {
            return Err("the echo differs".into());
        }
        if i >= WARMUP {
            rtts.push(rtt.as_secs_f64() * 1e6);
        }
    }
    c.finish()?;
    drop(c);
    echoer.join().map_err(|_| "the echo thread panicked")??;
    rtts.sort_by(f64::total_cmp);
    println!(
        "{{\"median_us\": {:.2}, \"p99_us\": {:.2}, \"rounds\": {rounds}, \"size\": {size}}}",
        rtts[rounds / 2],
        rtts[rounds * 99 / 100]
    );
    Ok(())
}
