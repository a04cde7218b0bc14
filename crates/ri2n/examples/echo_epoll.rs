//! An echo server driven by one thread's own event loop (mio, i.e. epoll): the endpoint's and
//! each connection's readiness descriptor, and only non-blocking calls. Ten blocking clients
//! check their echoes: `cargo run --release -p ri2n --example echo_epoll`.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use ri2n::{Connection, ConnectionConfig, Endpoint};

const ACCEPT: Token = Token(usize::MAX);

/// Echoes what can move now; true once the client's stream ended and all was echoed.
fn pump(conn: &Connection, pending: &mut Vec<u8>) -> std::io::Result<bool> {
    let mut buf = [0u8; 16384];
    loop {
        while !pending.is_empty() {
            match conn.try_write(pending) {
                Ok(n) => drop(pending.drain(..n)),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        match conn.try_read(&mut buf) {
            Ok(0) => {
                conn.finish()?;
                return Ok(true);
            }
            Ok(n) => pending.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
}

fn serve(server: Endpoint, clients: usize) -> std::io::Result<()> {
    let mut poll = Poll::new()?;
    let fd = server.readiness_fd()?.as_raw_fd();
    poll.registry()
        .register(&mut SourceFd(&fd), ACCEPT, Interest::READABLE)?;
    let mut events = Events::with_capacity(64);
    let mut conns: HashMap<usize, (Connection, Vec<u8>)> = HashMap::new();
    let (mut next, mut done) = (0, 0);
    while done < clients {
        poll.poll(&mut events, None)?;
        for ev in events.iter() {
            if ev.token() == ACCEPT {
                while let Ok(conn) = server.try_accept() {
                    let fd = conn.readiness_fd()?.as_raw_fd();
                    poll.registry().register(
                        &mut SourceFd(&fd),
                        Token(next),
                        Interest::READABLE,
                    )?;
                    conns.insert(next, (conn, Vec::new()));
                    next += 1;
                }
            } else if let Some((conn, pending)) = conns.get_mut(&ev.token().0) {
                if pump(conn, pending)? {
                    done += 1;
                }
            }
        }
    }
    drop(conns);
    server.close(None).map_err(std::io::Error::other)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let links = ["127.0.0.1:0".parse()?, "127.0.0.2:0".parse()?];
    let server = Endpoint::server(&links)?;
    let to = server.local_addrs()[0];
    let server = std::thread::spawn(move || serve(server, 10));
    let client = Endpoint::client(&links)?;
    let clients: Vec<_> = (0..10u8)
        .map(|k| {
            let client = client.clone();
            std::thread::spawn(move || -> std::io::Result<()> {
                let conn = client
                    .connect(&[to], ConnectionConfig::default())
                    .map_err(std::io::Error::other)?;
                let data = vec![k; 1 << 20];
                std::thread::scope(|s| {
                    let reader = s.spawn(|| {
                        let mut back = Vec::new();
                        (&conn).read_to_end(&mut back).map(|_| back)
                    });
                    (&conn).write_all(&data)?;
                    conn.finish()?;
                    let back = reader.join().expect("reader")?;
                    assert!(back == data, "client {k}: echo differs");
                    Ok(())
                })
            })
        })
        .collect();
    for c in clients {
        c.join().expect("client thread")?;
    }
    server.join().expect("server thread")?;
    println!("10 clients, 1 MiB each, echoed exactly by one epoll thread over two links");
    Ok(())
}
