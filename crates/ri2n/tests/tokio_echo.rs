//! The tokio adapter: an echo server of async tasks serving 100 concurrent connections over
//! two loopback links, every echo exact.

use std::time::Duration;

use ri2n::{ConnectionConfig, Endpoint};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;

use common::{loopback, payload};

const CLIENTS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_echo_server_serves_100_connections_over_two_links() {
    let server = Endpoint::server(&[loopback("127.0.0.1"), loopback("127.0.0.2")]).unwrap();
    let to = server.local_addrs()[0];
    let server_task = tokio::spawn(async move {
        let mut echoes = Vec::new();
        for _ in 0..CLIENTS {
            let mut conn = ri2n::tokio::accept(&server).await.unwrap();
            echoes.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 16384];
                loop {
                    let n = conn.read(&mut buf).await.unwrap();
                    if n == 0 {
                        break;
                    }
                    conn.write_all(&buf[..n]).await.unwrap();
                }
                conn.shutdown().await.unwrap();
                conn
            }));
        }
        let mut conns = Vec::new();
        for e in echoes {
            conns.push(e.await.unwrap());
        }
        // let the clients read their echoes before the endpoint goes
        drop(conns);
        tokio::task::spawn_blocking(move || server.close(Some(Duration::from_secs(20))))
            .await
            .unwrap()
            .unwrap();
    });
    let client = Endpoint::client(&[loopback("127.0.0.1"), loopback("127.0.0.2")]).unwrap();
    let mut clients = Vec::new();
    for k in 0..CLIENTS {
        let client = client.clone();
        clients.push(tokio::spawn(async move {
            let conn = ri2n::tokio::connect(&client, &[to], ConnectionConfig::default())
                .await
                .unwrap();
            let links = conn.get_ref().stats().links.len();
            let (mut rd, mut wr) = tokio::io::split(conn);
            let writer = tokio::spawn(async move {
                wr.write_all(&payload(k)).await.unwrap();
                wr.shutdown().await.unwrap();
                wr
            });
            let mut back = Vec::new();
            rd.read_to_end(&mut back).await.unwrap();
            drop(writer.await.unwrap());
            assert!(back == payload(k), "client {k}: echo differs");
            links
        }));
    }
    let all = async {
        for c in clients {
            assert_eq!(c.await.unwrap(), 2, "two links");
        }
        server_task.await.unwrap();
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("echoes within 2 minutes");
}
