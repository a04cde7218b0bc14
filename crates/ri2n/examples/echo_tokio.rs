//! An echo server and ten clients on tokio, over two loopback links:
//! `cargo run --release -p ri2n --features tokio --example echo_tokio`.

use ri2n::{ConnectionConfig, Endpoint};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let links = ["127.0.0.1:0".parse()?, "127.0.0.2:0".parse()?];
    let server = Endpoint::server(&links)?;
    let to = server.local_addrs()[0];
    tokio::spawn(async move {
        loop {
            let Ok(mut conn) = ri2n::tokio::accept(&server).await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16384];
                // echo until the client finishes, then finish too
                while let Ok(n @ 1..) = conn.read(&mut buf).await {
                    if conn.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
                let _ = conn.shutdown().await;
            });
        }
    });
    let client = Endpoint::client(&links)?;
    let mut tasks = Vec::new();
    for k in 0..10u8 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let conn = ri2n::tokio::connect(&client, &[to], ConnectionConfig::default()).await?;
            let (mut rd, mut wr) = tokio::io::split(conn);
            let data = vec![k; 1 << 20];
            let sent = data.clone();
            let writer = tokio::spawn(async move {
                wr.write_all(&sent).await?;
                wr.shutdown().await
            });
            let mut back = Vec::new();
            rd.read_to_end(&mut back).await?;
            writer.await??;
            assert!(back == data, "client {k}: echo differs");
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await?.map_err(|e| e as Box<dyn std::error::Error>)?;
    }
    println!("10 clients, 1 MiB each, echoed exactly over two links");
    Ok(())
}
