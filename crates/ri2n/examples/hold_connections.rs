//! Holds many idle connections open to a server on loopback, for measuring what the server's
//! per-packet work costs as the connections it holds grow (bench/attacks.py, the RESET
//! flood): opens COUNT connections, at most 250 from each loopback address 127.0.1.1,
//! 127.0.1.2, … (a server accepts 256 per client address), prints `holding COUNT` on stdout,
//! and keeps them for SECS seconds.
//!
//! `cargo run --release -p ri2n --example hold_connections -- ADDR:PORT COUNT SECS [KEY_FILE]`

use std::io::Write;
use std::time::Duration;

use ri2n::{ConnectionConfig, Endpoint, EndpointConfig, Key};

/// Connections per client address (below the server's default limit of 256).
const PER_ADDRESS: usize = 250;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [to, count, secs, rest @ ..] = &args[..] else {
        eprintln!("usage: hold_connections ADDR:PORT COUNT SECS [KEY_FILE]");
        std::process::exit(2);
    };
    let to: std::net::SocketAddr = to.parse()?;
    let count: usize = count.parse()?;
    let secs: f64 = secs.parse()?;
    let key = match rest.first() {
        Some(path) => Some(Key::from_text(&std::fs::read_to_string(path)?)?),
        None => None,
    };
    let cfg = ConnectionConfig::default().with_discover(false);
    let mut clients = Vec::new();
    let mut held = Vec::with_capacity(count);
    for i in 0..count {
        if i % PER_ADDRESS == 0 {
            let n = (i / PER_ADDRESS + 1) as u8;
            let local = std::net::SocketAddr::from(([127, 0, 1, n], 0));
            clients.push(Endpoint::bind(
                EndpointConfig::new(vec![local]).with_key(key.clone()),
            )?);
        }
        let client = clients.last().expect("made above");
        held.push(client.connect(&[to], cfg.clone())?);
    }
    println!("holding {}", held.len());
    std::io::stdout().flush()?;
    std::thread::sleep(Duration::from_secs_f64(secs));
    for c in &held {
        c.abort(0, "done");
    }
    Ok(())
}
