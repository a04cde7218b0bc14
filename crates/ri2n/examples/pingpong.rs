//! Message ping-pong over two loopback links: median and p99 round-trip time.
//! `cargo run --release -p ri2n --example pingpong -- [SIZE] [COUNT]`

use std::time::Instant;

use ri2n::{ConnectionConfig, Endpoint};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map_or(Ok(64), |a| a.parse())?;
    let count: usize = args.next().map_or(Ok(20000), |a| a.parse())?;
    let locals = ["127.0.0.1:0".parse()?, "127.0.0.2:0".parse()?];
    let server = Endpoint::server(&locals)?;
    let client = Endpoint::client(&locals)?;
    let target = server.local_addrs()[0];
    let echo = std::thread::spawn(move || {
        let conn = server.accept().unwrap();
        while let Ok(Some(m)) = conn.recv_message() {
            conn.send_message(&m).unwrap();
        }
    });
    let conn = client.connect(&[target], ConnectionConfig::default())?;
    let msg = vec![7u8; size];
    let mut rtts = Vec::with_capacity(count);
    for i in 0..count + 1000 {
        let t = Instant::now();
        conn.send_message(&msg)?;
        let back = conn.recv_message()?.expect("echo");
        assert_eq!(back.len(), size);
        if i >= 1000 {
            rtts.push(t.elapsed().as_nanos() as f64 / 1000.0);
        }
    }
    rtts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "size {size} B, {count} round trips: median {:.1} us, p99 {:.1} us",
        rtts[count / 2],
        rtts[count * 99 / 100]
    );
    conn.finish()?;
    drop(conn);
    echo.join().unwrap();
    Ok(())
}
