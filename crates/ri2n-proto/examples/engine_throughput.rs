//! The engine's own cost per byte, without sockets or threads: a client and a server endpoint
//! in this process, two links each (`--links N` for more), move a stream through memory. Each side's calls are timed
//! separately (they include the application's copies in and out of the streams), and a
//! virtual clock advances 20 µs per round so that RTT, pacing and timers behave as on a fast
//! link. Prints JSON: nanoseconds per datagram and CPU seconds per GB for each side.
//!
//! `cargo run --release -p ri2n-proto --example engine_throughput [MIB] [--key] [--links N]
//! [--by-reference] [--datagrams SIZE [--by-link]]`
//!
//! `--by-reference`: the client's datagrams take their stream bytes by reference, as the
//! driver's batches do ([`TransmitBuffer::takes_payload`]); the harness copies them in (and
//! seals, with `--key`) outside the timed engine calls, where the driver does it without the
//! engine's lock.
//!
//! `--datagrams SIZE`: unreliable datagrams of SIZE bytes instead of the stream, as `ri2n
//! tunnel` carries IP packets (a large TCP segment of 64 KiB goes in pieces). `--by-link`: the
//! server takes in each round's datagrams link by link, as the driver drains one socket after
//! the other, so pieces striped over the links arrive out of order and wait for those before.
//!
//! Under `valgrind --tool=callgrind` the instruction counts are repeatable, which makes small
//! changes to the per-packet path measurable on a noisy machine.

use std::net::SocketAddr;
use std::ops::Range;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ri2n_proto::{
    ConnectionConfig, ConnectionState, Endpoint, EndpointConfig, Key, Seal, Transmit,
    TransmitBuffer,
};

const ROUND: Duration = Duration::from_micros(20);
/// Datagrams the server takes in before it answers (the driver's `recvmmsg` batch).
const RECV_BATCH: usize = 32;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut mib: u64 = 256;
    let mut key = None;
    let mut links: u8 = 2;
    let mut by_reference = false;
    let mut datagram_size = None;
    let mut by_link = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--key" => key = Some(Key::from_bytes([7; 32])),
            "--by-reference" => by_reference = true,
            "--by-link" => by_link = true,
            "--datagrams" => {
                datagram_size = Some(
                    args.next()
                        .and_then(|n| n.parse::<usize>().ok())
                        .filter(|&n| (1..=ri2n_proto::wire::MAX_DATAGRAM_LEN).contains(&n))
                        .expect("--datagrams takes a size in bytes, 1 to 65 535 + 1 KiB"),
                )
            }
            "--links" => {
                links = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n >= 1)
                    .expect("--links takes a number of links, at least 1")
            }
            n => mib = n.parse().expect(
                "a size in MiB, --key, --links N, --by-reference, --datagrams SIZE or --by-link",
            ),
        }
    }
    let total = mib << 20;
    let addrs = |host: u8, port: u16| -> Vec<SocketAddr> {
        (1..=links)
            .map(|net| SocketAddr::from(([10, 0, net, host], port)))
            .collect()
    };
    let client_addrs = addrs(1, 5000);
    let server_addrs = addrs(2, 7000);
    let mut now = Instant::now();
    let mut scfg = EndpointConfig::new(server_addrs.clone()).server();
    scfg.key = key.clone();
    let mut server = Endpoint::new(scfg, 1, now);
    let mut ccfg = EndpointConfig::new(client_addrs.clone());
    ccfg.key = key.clone();
    let mut client = Endpoint::new(ccfg, 2, now);
    let cfg = ConnectionConfig::default().with_discover(false);
    let ch = client.connect(now, &server_addrs, cfg).unwrap();

    let source: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    let mut sink = vec![0u8; 1 << 20];
    // the datagram being filled (as from the interface) and the one received, both reused
    let (mut outgoing, mut incoming) = (Vec::new(), Vec::new());
    let mut to_server = InFlight {
        by_reference,
        ..InFlight::default()
    };
    let mut to_client = InFlight::default();
    let mut rounds = 0u32;
    let (mut written, mut read) = (0u64, 0u64);
    let (mut client_time, mut server_time) = (Duration::ZERO, Duration::ZERO);
    let (mut datagrams, mut acks) = (0u64, 0u64);
    let mut sh = None;
    let started = Instant::now();
    // datagrams may be dropped (their queue or the receiver full): then the run ends once
    // every one sent has arrived or was counted as dropped
    let expected = datagram_size.map(|size| total.div_ceil(size as u64));
    let mut settled = 0;
    while read < total && expected.is_none_or(|n| settled < n) {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "no progress: {read} of {total} bytes"
        );
        now += ROUND;
        rounds += 1;
        // client: the application writes, the engine sends
        let t0 = Instant::now();
        client.handle_timeout(now);
        if client.connection(ch).unwrap().state() == ConnectionState::Established {
            let conn = client.connection_mut(ch).unwrap();
            if let Some(size) = datagram_size {
                // as many as the queue takes without dropping the oldest
                while written < total && !conn.datagrams_piling_up() {
                    let len = size.min((total - written) as usize);
                    outgoing.clear();
                    outgoing.extend_from_slice(&source[..len]);
                    conn.send_datagram_buf(now, &mut outgoing).unwrap();
                    written += len as u64;
                }
            } else {
                while written < total {
                    let at = (written % source.len() as u64) as usize;
                    let end = source.len().min(at + (total - written) as usize);
                    match conn.write(&source[at..end]) {
                        Ok(n) => written += n as u64,
                        Err(_) => break,
                    }
                }
            }
        }
        while client.poll_transmit_into(now, &mut to_server) > 0 {}
        client_time += t0.elapsed();
        to_server.complete();
        // server: the engine receives, the application reads
        datagrams += to_server.meta.len() as u64;
        let t0 = Instant::now();
        server.handle_timeout(now);
        // in receive batches, as the driver does (one `recvmmsg` each), each followed by
        // what the engine sends in answer (acknowledgements) and the application's read
        let mut batches = to_server.take();
        let sockets: Vec<&[_]> = if by_link {
            batches.sort_by_key(|&(to, ..)| to);
            batches.chunk_by(|a, b| a.0 == b.0).collect()
        } else {
            vec![&batches]
        };
        for socket in sockets {
            for batch in socket.chunks(RECV_BATCH) {
                for &(to, from, start, len) in batch {
                    server.handle_datagram(now, to, from, &mut to_server.bytes[start..start + len]);
                }
                if sh.is_none() {
                    sh = server.accept();
                }
                if let Some(h) = sh {
                    let conn = server.connection_mut(h).unwrap();
                    if datagram_size.is_some() {
                        while let Ok(true) = conn.recv_datagram_into(&mut incoming) {
                            read += incoming.len() as u64;
                        }
                    }
                    while let Ok(n) = conn.read(&mut sink) {
                        if n == 0 {
                            break;
                        }
                        read += n as u64;
                    }
                }
                while server.poll_transmit_into(now, &mut to_client) > 0 {}
            }
        }
        batches.clear();
        to_server.meta = batches;
        server_time += t0.elapsed();
        if let Some(h) = sh {
            let (sent, received) = (client.connection(ch), server.connection(h));
            let (sent, received) = (sent.unwrap().stats(), received.unwrap().stats());
            settled = received.datagrams_received + sent.datagrams_send_dropped;
        }
        // client: acknowledgements
        acks += to_client.meta.len() as u64;
        let t0 = Instant::now();
        to_client.deliver(|to, from, d| client.handle_datagram(now, to, from, d));
        client_time += t0.elapsed();
    }
    let gb = read as f64 / 1e9;
    let stats = client.connection(ch).unwrap().stats();
    let lost: u64 = stats.links.iter().map(|l| l.packets_lost).sum();
    let received = server.connection(sh.unwrap()).unwrap().stats();
    println!(
        "{{\"bytes\": {total}, \"links\": {links}, \"keyed\": {}, \"datagrams\": {datagrams}, \"acks\": {acks}, \
         \"lost\": {lost}, \"by_reference\": {by_reference}, \"datagram_size\": {}, \"by_link\": {by_link}, \
         \"bytes_delivered\": {read}, \"datagrams_dropped\": {}, \"datagrams_reordered\": {}, \
         \"client_ns_per_datagram\": {:.0}, \
         \"server_ns_per_datagram\": {:.0}, \"client_cpu_s_per_gb\": {:.3}, \
         \"server_cpu_s_per_gb\": {:.3}, \"virtual_s\": {:.3}}}",
        key.is_some(),
        datagram_size.map_or("null".into(), |n| n.to_string()),
        stats.datagrams_send_dropped + received.datagrams_receive_dropped,
        received.datagrams_reordered,
        client_time.as_nanos() as f64 / datagrams as f64,
        server_time.as_nanos() as f64 / datagrams as f64,
        client_time.as_secs_f64() / gb,
        server_time.as_secs_f64() / gb,
        (ROUND * rounds).as_secs_f64(),
    );
}

/// Datagrams on their way in one direction, in one reused buffer (the harness allocates
/// nothing per datagram, so the timings are the engine's).
#[derive(Default)]
struct InFlight {
    bytes: Vec<u8>,
    used: usize,
    /// (to, from, start, length) per datagram
    meta: Vec<(SocketAddr, SocketAddr, usize, usize)>,
    /// Take stream bytes by reference: `holes` (place in `bytes`, piece, range) and `seals`
    /// (start, length, sealing) until [`InFlight::complete`].
    by_reference: bool,
    holes: Vec<(usize, Bytes, Range<usize>)>,
    seals: Vec<(usize, usize, Seal)>,
    pending_seal: Option<Seal>,
}

/// The engine builds each datagram at the end of the buffer, as into the driver's batches.
impl TransmitBuffer for InFlight {
    fn buffer(&mut self, _: SocketAddr, _: SocketAddr) -> &mut [u8] {
        let (start, room) = (self.used, ri2n_proto::wire::MAX_DATAGRAM_SIZE);
        if self.bytes.len() < start + room {
            // grows a few times at the start, then never again
            self.bytes.resize(2 * (start + room), 0);
        }
        &mut self.bytes[start..start + room]
    }

    fn commit(&mut self, t: &Transmit) {
        if let Some(seal) = self.pending_seal.take() {
            self.seals.push((self.used, t.len, seal));
        }
        self.meta.push((t.remote, t.local, self.used, t.len));
        self.used += t.len;
    }

    fn wants_more(&self) -> bool {
        true
    }

    fn seals_later(&self) -> bool {
        self.by_reference
    }

    fn defer_seal(&mut self, seal: Seal) {
        self.pending_seal = Some(seal);
    }

    fn takes_payload(&self) -> bool {
        self.by_reference
    }

    fn defer_payload(&mut self, at: usize, piece: &Bytes, range: Range<usize>) {
        // (a clone per datagram: the driver's batches keep one per piece, and this copy is
        // not timed)
        self.holes.push((self.used + at, piece.clone(), range));
    }
}

impl InFlight {
    /// Puts in the stream bytes taken by reference, then seals: what the driver does
    /// without the engine's lock.
    fn complete(&mut self) {
        for (at, piece, range) in self.holes.drain(..) {
            self.bytes[at..at + range.len()].copy_from_slice(&piece[range]);
        }
        for (start, len, seal) in self.seals.drain(..) {
            seal.apply(&mut self.bytes[start..start + len]);
        }
    }

    /// The datagrams' places in `bytes`, which stay valid until the next `send`.
    fn take(&mut self) -> Vec<(SocketAddr, SocketAddr, usize, usize)> {
        self.used = 0;
        std::mem::take(&mut self.meta)
    }

    /// Hands every datagram to `receive`, then empties the buffer.
    fn deliver(&mut self, mut receive: impl FnMut(SocketAddr, SocketAddr, &mut [u8])) {
        for &(to, from, start, len) in &self.meta {
            receive(to, from, &mut self.bytes[start..start + len]);
        }
        self.used = 0;
        self.meta.clear();
    }
}
