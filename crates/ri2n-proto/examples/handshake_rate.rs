//! How many handshakes a server completes per second of its CPU, with and without a key: a
//! client and a server endpoint in this process exchange datagrams in memory (no sockets), and
//! only the server's calls are timed. Prints JSON (used by `bench/run-all keyed`).
//!
//! `cargo run --release -p ri2n-proto --example handshake_rate [HANDSHAKES]`

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ri2n_proto::{ConnectionConfig, ConnectionState, Endpoint, EndpointConfig, Key};

/// Runs `n` handshakes (INITIAL, RETRY, INITIAL, ACCEPT, the client's first short packet);
/// returns the server's time in its own calls and the total time.
fn handshakes(n: u32, key: Option<Key>) -> (Duration, Duration) {
    let server_addr: SocketAddr = "10.0.0.2:7000".parse().unwrap();
    let client_addr: SocketAddr = "10.0.0.1:5000".parse().unwrap();
    let start = Instant::now();
    let mut scfg = EndpointConfig::new(vec![server_addr]).server();
    scfg.max_connections = usize::MAX;
    scfg.max_connections_per_address = usize::MAX;
    scfg.max_keyed_handshakes_per_second = None;
    scfg.key = key.clone();
    let mut server = Endpoint::new(scfg, 1, start);
    let mut ccfg = EndpointConfig::new(vec![client_addr]);
    ccfg.key = key;
    let mut client = Endpoint::new(ccfg, 2, start);
    let mut server_time = Duration::ZERO;
    let mut buf = vec![0u8; 2048];
    let mut in_flight: Vec<Vec<u8>> = Vec::new();
    let cfg = ConnectionConfig::default().with_discover(false);
    for _ in 0..n {
        let now = Instant::now();
        let h = client.connect(now, &[server_addr], cfg.clone()).unwrap();
        loop {
            // client → server
            while let Some(t) = client.poll_transmit(now, &mut buf) {
                in_flight.push(buf[..t.len].to_vec());
            }
            if in_flight.is_empty() {
                break;
            }
            let t0 = Instant::now();
            for d in in_flight.iter_mut() {
                server.handle_datagram(now, server_addr, client_addr, d);
            }
            in_flight.clear();
            while let Some(t) = server.poll_transmit(now, &mut buf) {
                in_flight.push(buf[..t.len].to_vec());
            }
            while server.accept().is_some() {}
            server_time += t0.elapsed();
            // server → client
            for d in in_flight.iter_mut() {
                client.handle_datagram(now, client_addr, server_addr, d);
            }
            in_flight.clear();
            if client.connection(h).unwrap().state() == ConnectionState::Established {
                // the confirmation (first short packet) still goes to the server
                while let Some(t) = client.poll_transmit(now, &mut buf) {
                    in_flight.push(buf[..t.len].to_vec());
                }
                let t0 = Instant::now();
                for d in in_flight.iter_mut() {
                    server.handle_datagram(now, server_addr, client_addr, d);
                }
                server_time += t0.elapsed();
                in_flight.clear();
                break;
            }
        }
        assert_eq!(
            client.connection(h).unwrap().state(),
            ConnectionState::Established
        );
    }
    (server_time, start.elapsed())
}

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .map_or(2000, |s| s.parse().expect("a number of handshakes"));
    let mut rows = Vec::new();
    for (name, key) in [("plain", None), ("keyed", Some(Key::from_bytes([9; 32])))] {
        // the median of 5 runs
        let mut runs: Vec<(Duration, Duration)> =
            (0..5).map(|_| handshakes(n, key.clone())).collect();
        runs.sort();
        let (server, total) = runs[2];
        rows.push(format!(
            "\"{name}\": {{\"handshakes\": {n}, \"server_us_per_handshake\": {:.2}, \
             \"server_handshakes_per_s\": {:.0}, \"both_sides_handshakes_per_s\": {:.0}}}",
            server.as_secs_f64() * 1e6 / f64::from(n),
            f64::from(n) / server.as_secs_f64(),
            f64::from(n) / total.as_secs_f64()
        ));
    }
    println!("{{{}}}", rows.join(", "));
}
