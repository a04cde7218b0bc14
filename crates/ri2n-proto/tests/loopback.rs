//! Two endpoints joined by an ideal in-memory network (fixed delay, no loss, unlimited rate):
//! the smallest end-to-end check of the engine, independent of the simulator.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ri2n_proto::{
    ConnectionConfig, ConnectionHandle, ConnectionState, Endpoint, EndpointConfig, ReadError,
};

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A datagram in flight: (arrival, seq, to_server, local, remote, bytes).
type InFlight = (Duration, u64, bool, SocketAddr, SocketAddr, Vec<u8>);

struct Net {
    base: Instant,
    now: Duration,
    delay: Duration,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
}

impl Net {
    fn flush(&mut self, ep: &mut Endpoint, to_server: bool) {
        let mut buf = [0u8; 1500];
        let now = self.base + self.now;
        while let Some(t) = ep.poll_transmit(now, &mut buf) {
            self.seq += 1;
            self.queue.push(Reverse((
                self.now + self.delay,
                self.seq,
                !to_server,
                t.remote,
                t.local,
                buf[..t.len].to_vec(),
            )));
        }
    }
}

/// Runs client and server until `done` or the simulated deadline; returns the server's handle.
fn run(
    client: &mut Endpoint,
    server: &mut Endpoint,
    net: &mut Net,
    limit: Duration,
    mut step: impl FnMut(&mut Endpoint, &mut Endpoint, &mut Option<ConnectionHandle>) -> bool,
) -> Option<ConnectionHandle> {
    let mut accepted = None;
    loop {
        net.flush(client, false);
        net.flush(server, true);
        if let Some(h) = server.accept() {
            accepted = Some(h);
        }
        if step(client, server, &mut accepted) {
            net.flush(client, false);
            net.flush(server, true);
            return accepted;
        }
        net.flush(client, false);
        net.flush(server, true);
        let next_timer = [client.poll_timeout(), server.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
            .map(|t| t - net.base);
        let next_packet = net.queue.peek().map(|Reverse(p)| p.0);
        let next = [next_timer, next_packet].into_iter().flatten().min();
        let Some(next) = next else {
            panic!("nothing left to happen")
        };
        net.now = net.now.max(next);
        assert!(net.now < limit, "simulated time limit reached");
        let now = net.base + net.now;
        while net.queue.peek().is_some_and(|Reverse(p)| p.0 <= net.now) {
            let Reverse((_, _, to_server, local, remote, data)) = net.queue.pop().unwrap();
            let ep = if to_server {
                &mut *server
            } else {
                &mut *client
            };
            ep.handle_datagram(now, local, remote, &data);
        }
        client.handle_timeout(now);
        server.handle_timeout(now);
    }
}

/// A client on `a` and a server on `b` joined by a 0.5 ms network; the client has started
/// connecting to `b[0]`.
fn connected_pair(
    a: &[SocketAddr],
    b: &[SocketAddr],
) -> (Endpoint, Endpoint, Net, ConnectionHandle) {
    let base = Instant::now();
    let mut client = Endpoint::new(EndpointConfig::new(a.to_vec()), 1, base);
    let server = Endpoint::new(EndpointConfig::new(b.to_vec()).server(), 2, base);
    let net = Net {
        base,
        now: Duration::ZERO,
        delay: Duration::from_micros(500),
        queue: BinaryHeap::new(),
        seq: 0,
    };
    let ch = client
        .connect(base, &b[..1], ConnectionConfig::default())
        .unwrap();
    (client, server, net, ch)
}

fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

#[test]
fn bytes_and_messages_cross_two_links_both_ways() {
    let b = vec![addr("10.0.0.2:6000"), addr("10.1.0.2:6000")];
    let (mut client, mut server, mut net, ch) =
        connected_pair(&[addr("10.0.0.1:5000"), addr("10.1.0.1:5000")], &b);
    const TOTAL: u64 = 3_000_000;
    let (mut sent_c, mut sent_s, mut got_c, mut got_s) = (0u64, 0u64, 0u64, 0u64);
    let mut msgs_got = 0;
    let mut buf = vec![0u8; 65536];
    let mut finished = false;
    run(
        &mut client,
        &mut server,
        &mut net,
        Duration::from_secs(30),
        |c, s, acc| {
            let cc = c.connection_mut(ch).unwrap();
            while sent_c < TOTAL {
                let chunk: Vec<u8> = (sent_c..(sent_c + 16384).min(TOTAL)).map(pattern).collect();
                match cc.write(&chunk) {
                    Ok(n) => sent_c += n as u64,
                    Err(_) => break,
                }
            }
            if sent_c == TOTAL && !finished && cc.state() == ConnectionState::Established {
                for k in 0..10u8 {
                    cc.send_message(&vec![k; 1000 * k as usize + 1]).unwrap();
                }
                cc.finish();
                finished = true;
            }
            loop {
                match cc.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        for (i, &x) in buf[..n].iter().enumerate() {
                            assert_eq!(
                                x,
                                pattern(got_c + i as u64) ^ 0xff,
                                "client byte {}",
                                got_c + i as u64
                            );
                        }
                        got_c += n as u64;
                    }
                    Err(ReadError::Blocked) => break,
                    Err(e) => panic!("client read: {e}"),
                }
            }
            let Some(h) = *acc else { return false };
            let sc = s.connection_mut(h).unwrap();
            while sent_s < TOTAL / 2 {
                let chunk: Vec<u8> = (sent_s..(sent_s + 16384).min(TOTAL / 2))
                    .map(|i| pattern(i) ^ 0xff)
                    .collect();
                match sc.write(&chunk) {
                    Ok(n) => sent_s += n as u64,
                    Err(_) => break,
                }
            }
            if sent_s == TOTAL / 2 {
                sc.finish();
            }
            loop {
                match sc.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        for (i, &x) in buf[..n].iter().enumerate() {
                            assert_eq!(
                                x,
                                pattern(got_s + i as u64),
                                "server byte {}",
                                got_s + i as u64
                            );
                        }
                        got_s += n as u64;
                    }
                    Err(ReadError::Blocked) => break,
                    Err(e) => panic!("server read: {e}"),
                }
            }
            while let Ok(Some(m)) = sc.recv_message() {
                assert_eq!(m, vec![msgs_got as u8; 1000 * msgs_got + 1]);
                msgs_got += 1;
            }
            got_s == TOTAL
                && got_c == TOTAL / 2
                && msgs_got == 10
                && c.connection(ch).unwrap().is_send_complete()
                && s.connection(h).unwrap().is_send_complete()
        },
    );
    let stats = client.connection(ch).unwrap().stats();
    assert_eq!(stats.links.len(), 2, "the second link was discovered");
    for l in &stats.links {
        assert!(
            l.stream_bytes_sent > 100_000,
            "link {} carried data: {l:?}",
            l.id
        );
    }
}

/// A server on another host that also listens on its loopback address announces it; the
/// client must not open a link to it (it would lead back to the client's own host).
#[test]
fn a_remote_peers_loopback_address_is_not_discovered() {
    let b = vec![addr("10.0.0.2:6000"), addr("127.0.0.1:6000")];
    let (mut client, mut server, mut net, ch) =
        connected_pair(&[addr("10.0.0.1:5000"), addr("127.0.0.1:5000")], &b);
    run(
        &mut client,
        &mut server,
        &mut net,
        Duration::from_secs(5),
        |c, _, accepted| {
            accepted.is_some() && c.connection(ch).unwrap().state() == ConnectionState::Established
        },
    );
    let links = client.connection(ch).unwrap().stats().links;
    assert_eq!(links.len(), 1, "only the handshake's link: {links:?}");
    assert_eq!(links[0].remote, b[0]);
}
