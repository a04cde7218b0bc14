//! Message bandwidth as the MuniSocket paper measures it: the client sends one message of SIZE
//! bytes on the byte stream, the server reads all of it and answers one byte, and the client
//! waits for that byte before the next message; the effective bandwidth is SIZE × COUNT over
//! the time taken. The same exchange runs over ri2n (either transport, every local address a
//! link) or over one plain TCP connection, for the comparison the paper makes.
//!
//! ```text
//! msgbw server (ri2n-tcp|ri2n-udp|tcp) LISTEN...
//! msgbw client (ri2n-tcp|ri2n-udp|tcp) TO LOCAL... -- SIZE COUNT [PIECE]
//! ```
//! With PIECE the client writes each message in writes of PIECE bytes, as an application
//! that fills a buffer of that size at a time would; without, in one write. The client prints one JSON line: `{"size":…,"count":…,"seconds":…,"bps":…}`. Both ends run
//! until the client's last message; a server serves one client.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Instant;

use ri2n::{ConnectionConfig, Endpoint, EndpointConfig, Transport};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn transport(kind: &str) -> Res<Option<Transport>> {
    Ok(match kind {
        "ri2n-tcp" => Some(Transport::Tcp),
        "ri2n-udp" => Some(Transport::Udp),
        "tcp" => None,
        other => return Err(format!("unknown kind {other:?}: ri2n-tcp, ri2n-udp or tcp").into()),
    })
}

/// Reads messages of the client's size (its first 8 bytes give it) and answers each with one
/// byte, until the client ends the stream.
fn serve(mut s: impl Read + Write) -> Res<()> {
    let mut size = [0u8; 8];
    if s.read_exact(&mut size).is_err() {
        return Ok(());
    }
    let mut buf = vec![0u8; u64::from_be_bytes(size) as usize];
    while s.read_exact(&mut buf).is_ok() {
        s.write_all(b"k")?;
    }
    Ok(())
}

/// Sends `count` messages of `size` bytes, each in writes of `piece` bytes and answered
/// before the next; returns seconds.
fn exchange(mut s: impl Read + Write, size: usize, count: usize, piece: usize) -> Res<f64> {
    s.write_all(&(size as u64).to_be_bytes())?;
    let msg = vec![0x5a_u8; size];
    let mut ack = [0u8; 1];
    let send = |s: &mut dyn Write| msg.chunks(piece).try_for_each(|p| s.write_all(p));
    // one message first, outside the timing (connections warm up, links open)
    send(&mut s)?;
    s.read_exact(&mut ack)?;
    let t = Instant::now();
    for _ in 0..count {
        send(&mut s)?;
        s.read_exact(&mut ack)?;
    }
    Ok(t.elapsed().as_secs_f64())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (role, kind) = (args.first().map(String::as_str), args.get(1));
    let kind = transport(kind.ok_or("usage: msgbw server|client KIND ...")?)?;
    let split = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let addrs: Vec<SocketAddr> = args[2..split]
        .iter()
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    match role {
        Some("server") => match kind {
            None => serve(TcpListener::bind(addrs[0])?.accept()?.0.tap_nodelay()?),
            Some(t) => {
                let ep = Endpoint::bind(EndpointConfig::new(addrs).with_transport(t).server())?;
                let conn = ep.accept()?;
                serve(&conn)?;
                // the client reads to this end before it goes
                conn.finish()?;
                Ok(conn.wait_acknowledged(Some(std::time::Duration::from_secs(10)))?)
            }
        },
        Some("client") => {
            let size: usize = args.get(split + 1).ok_or("SIZE missing")?.parse()?;
            let count: usize = args.get(split + 2).ok_or("COUNT missing")?.parse()?;
            let piece: usize = match args.get(split + 3) {
                Some(p) => p.parse()?,
                None => size,
            };
            if piece == 0 {
                return Err("PIECE must be at least 1".into());
            }
            let (to, locals) = (addrs[0], addrs[1..].to_vec());
            // stream bytes each link carried, and link state changes (ri2n only)
            let (mut links, mut changes): (Vec<u64>, usize) = (Vec::new(), 0);
            let secs = match kind {
                None => exchange(TcpStream::connect(to)?.tap_nodelay()?, size, count, piece)?,
                Some(t) => {
                    let ep = Endpoint::bind(EndpointConfig::new(locals).with_transport(t))?;
                    let conn = ep.connect(&[to], ConnectionConfig::default())?;
                    let secs = exchange(&conn, size, count, piece)?;
                    conn.finish()?;
                    // the server's end of stream: it has read everything
                    std::io::copy(&mut &conn, &mut std::io::sink())?;
                    conn.wait_acknowledged(None)?;
                    links = conn
                        .stats()
                        .links
                        .iter()
                        .map(|l| l.stream_bytes_sent)
                        .collect();
                    changes = (conn.poll_events().iter())
                        .filter(|e| matches!(e.event, ri2n::Event::LinkStateChanged { .. }))
                        .count();
                    secs
                }
            };
            let bps = (size * count) as f64 * 8.0 / secs;
            println!(
                "{{\"size\":{size},\"piece\":{piece},\"count\":{count},\"seconds\":{secs:.6},\"bps\":{bps:.0},\
                 \"link_bytes\":{links:?},\"link_changes\":{changes}}}"
            );
            Ok(())
        }
        _ => Err("usage: msgbw server|client KIND ...".into()),
    }
}

/// `TCP_NODELAY` on a plain TCP connection: the one-byte answers go out at once, as ri2n's do.
trait NoDelay: Sized {
    fn tap_nodelay(self) -> std::io::Result<Self>;
}

impl NoDelay for TcpStream {
    fn tap_nodelay(self) -> std::io::Result<Self> {
        self.set_nodelay(true)?;
        Ok(self)
    }
}
