//! A client and a server `Endpoint` joined by an ideal in-memory network (fixed delay, no loss,
//! unlimited rate), with an established connection between them, a transfer in both directions,
//! and a side door to hand the server arbitrary datagrams.
//!
//! Shared by `tests/garbage.rs` and the `established_connection` fuzz target (which includes
//! this file by path), so it depends only on `ri2n-proto`.

#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ri2n_proto::wire::{self, packet_type, VERSION};
use ri2n_proto::{
    ConnectionConfig, ConnectionHandle, ConnectionState, Endpoint, EndpointConfig, Key, ReadError,
};

/// A datagram in flight: (arrival, seq, to_server, local, remote, bytes).
type InFlight = (Duration, u64, bool, SocketAddr, SocketAddr, Vec<u8>);

/// A datagram the client sent to the server, as the server receives it.
#[derive(Debug, Clone)]
pub struct Captured {
    /// The server's address it went to.
    pub local: SocketAddr,
    /// The client's address it came from.
    pub remote: SocketAddr,
    /// When the client sent it.
    pub at: Duration,
    pub bytes: Vec<u8>,
}

/// Settings of a [`Sim`].
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Links (address pairs) of the connection: 1 or 2.
    pub links: usize,
    /// Receive window of each stream, both sides.
    pub window: u64,
    /// Send buffer of each stream, both sides.
    pub send_buffer: u64,
    /// One-way delay of the network.
    pub delay: Duration,
    /// Seed of the endpoints' random numbers.
    pub seed: u64,
    /// Client datagrams kept for replay: the first `capture_keep` forever, then a rolling window.
    pub capture_keep: usize,
    pub capture_rolling: usize,
    /// The keys the client and the server hold (none: in clear).
    pub client_key: Option<Key>,
    pub server_key: Option<Key>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            links: 2,
            window: 256 << 10,
            send_buffer: 256 << 10,
            delay: Duration::from_micros(500),
            seed: 1,
            capture_keep: 32,
            capture_rolling: 224,
            client_key: None,
            server_key: None,
        }
    }
}

/// Two endpoints, the network between them and the established connection.
pub struct Sim {
    pub cfg: SimConfig,
    pub base: Instant,
    pub now: Duration,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    pub client: Endpoint,
    pub server: Endpoint,
    pub client_addrs: Vec<SocketAddr>,
    pub server_addrs: Vec<SocketAddr>,
    /// The client's connection.
    pub ch: ConnectionHandle,
    /// The server's connection, once accepted.
    pub sh: Option<ConnectionHandle>,
    /// The server connection's ID (what the client writes in bytes 2..10 of a short packet).
    pub server_cid: Option<u64>,
    /// Link byte the client uses on each (server address, client address) pair.
    pub link_ids: HashMap<(SocketAddr, SocketAddr), u8>,
    /// Client datagrams to the server, for replays and mutations.
    pub captured: Vec<Captured>,
    captured_total: u64,
    /// Server datagrams addressed to nobody we simulate (e.g. answers to a forged address).
    pub dropped_to_strangers: u64,
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Steps at one simulated instant after which the engine is declared stuck (its timer stays
/// due however often it is handled).
const MAX_STEPS_WITHOUT_PROGRESS: u32 = 1_000;

impl Sim {
    /// Endpoints set up and the client's connection started (not yet established).
    pub fn new(cfg: SimConfig) -> Self {
        let base = Instant::now();
        let client_addrs: Vec<SocketAddr> = ["10.0.0.1:5000", "10.1.0.1:5000"][..cfg.links]
            .iter()
            .map(|s| addr(s))
            .collect();
        let server_addrs: Vec<SocketAddr> = ["10.0.0.2:6000", "10.1.0.2:6000"][..cfg.links]
            .iter()
            .map(|s| addr(s))
            .collect();
        let mut conn = ConnectionConfig::default();
        conn.stream_receive_window = cfg.window;
        conn.send_buffer = cfg.send_buffer;
        let mut ccfg = EndpointConfig::new(client_addrs.clone());
        ccfg.server_connection = conn.clone();
        ccfg.key = cfg.client_key.clone();
        let mut scfg = EndpointConfig::new(server_addrs.clone()).server();
        scfg.server_connection = conn.clone();
        scfg.key = cfg.server_key.clone();
        let mut client = Endpoint::new(ccfg, cfg.seed, base);
        let server = Endpoint::new(scfg, cfg.seed.wrapping_add(1), base);
        let ch = client.connect(base, &server_addrs[..1], conn).unwrap();
        Self {
            cfg,
            base,
            now: Duration::ZERO,
            queue: BinaryHeap::new(),
            seq: 0,
            client,
            server,
            client_addrs,
            server_addrs,
            ch,
            sh: None,
            server_cid: None,
            link_ids: HashMap::new(),
            captured: Vec::new(),
            captured_total: 0,
            dropped_to_strangers: 0,
        }
    }

    /// The current simulated time.
    pub fn instant(&self) -> Instant {
        self.base + self.now
    }

    fn capture(&mut self, local: SocketAddr, remote: SocketAddr, bytes: &[u8]) {
        if bytes.len() > wire::SHORT_HEADER_FIXED
            && bytes[0] == VERSION
            && (bytes[1] == packet_type::SHORT || bytes[1] == packet_type::SHORT_PHASE1)
        {
            let cid = u64::from_be_bytes(bytes[2..10].try_into().unwrap());
            self.server_cid.get_or_insert(cid);
            self.link_ids.entry((local, remote)).or_insert(bytes[10]);
        }
        let c = Captured {
            local,
            remote,
            at: self.now,
            bytes: bytes.to_vec(),
        };
        let (keep, rolling) = (self.cfg.capture_keep, self.cfg.capture_rolling);
        if self.captured.len() < keep + rolling {
            self.captured.push(c);
        } else if rolling > 0 {
            let i = keep + (self.captured_total as usize % rolling);
            self.captured[i] = c;
        }
        self.captured_total += 1;
    }

    /// Sends everything both endpoints want to send.
    pub fn flush(&mut self) {
        let mut buf = [0u8; 2048];
        let now = self.instant();
        while let Some(t) = self.client.poll_transmit(now, &mut buf) {
            assert!(t.len <= 1472, "client datagram of {} bytes", t.len);
            let data = buf[..t.len].to_vec();
            // the server receives it on t.remote from t.local
            self.capture(t.remote, t.local, &data);
            if self.server_addrs.contains(&t.remote) {
                self.seq += 1;
                self.queue.push(Reverse((
                    self.now + self.cfg.delay,
                    self.seq,
                    true,
                    t.remote,
                    t.local,
                    data,
                )));
            }
        }
        while let Some(t) = self.server.poll_transmit(now, &mut buf) {
            assert!(t.len <= 1472, "server datagram of {} bytes", t.len);
            if !self.client_addrs.contains(&t.remote) {
                self.dropped_to_strangers += 1;
                continue;
            }
            self.seq += 1;
            self.queue.push(Reverse((
                self.now + self.cfg.delay,
                self.seq,
                false,
                t.remote,
                t.local,
                buf[..t.len].to_vec(),
            )));
        }
        if self.sh.is_none() {
            self.sh = self.server.accept();
        }
    }

    /// Moves to the next event (a datagram arriving or a timer), at most to `limit`; returns
    /// false when nothing is left to happen before `limit`.
    fn step(&mut self, limit: Duration, stuck: &mut u32) -> bool {
        self.flush();
        let next_timer = [self.client.poll_timeout(), self.server.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
            .map(|t| t.saturating_duration_since(self.base));
        let next_packet = self.queue.peek().map(|Reverse(p)| p.0);
        let Some(next) = [next_timer, next_packet].into_iter().flatten().min() else {
            self.now = self.now.max(limit);
            return false;
        };
        if next > limit {
            self.now = self.now.max(limit);
            let now = self.instant();
            self.client.handle_timeout(now);
            self.server.handle_timeout(now);
            self.flush();
            return false;
        }
        if next <= self.now {
            *stuck += 1;
            assert!(
                *stuck < MAX_STEPS_WITHOUT_PROGRESS,
                "engine stuck at t={:?}: poll_timeout stays due (client {:?}, server {:?}) \
                 though handle_timeout and poll_transmit ran {} times",
                self.now,
                self.client
                    .poll_timeout()
                    .map(|t| t.saturating_duration_since(self.base)),
                self.server
                    .poll_timeout()
                    .map(|t| t.saturating_duration_since(self.base)),
                *stuck
            );
        } else {
            *stuck = 0;
        }
        self.now = self.now.max(next);
        let now = self.instant();
        while self.queue.peek().is_some_and(|Reverse(p)| p.0 <= self.now) {
            let Reverse((_, _, to_server, local, remote, mut data)) = self.queue.pop().unwrap();
            let ep = if to_server {
                &mut self.server
            } else {
                &mut self.client
            };
            ep.handle_datagram(now, local, remote, &mut data);
        }
        self.client.handle_timeout(now);
        self.server.handle_timeout(now);
        self.flush();
        true
    }

    /// Runs for `d` of simulated time, calling `app` before every step.
    pub fn advance(&mut self, d: Duration, mut app: impl FnMut(&mut Sim)) {
        let limit = self.now + d;
        let mut stuck = 0;
        loop {
            app(self);
            if !self.step(limit, &mut stuck) || self.now >= limit {
                break;
            }
        }
        app(self);
        self.flush();
    }

    /// Runs until `done` returns true, calling it before every step; panics at `limit`.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Sim) -> bool) {
        let mut stuck = 0;
        loop {
            if done(self) {
                self.flush();
                return;
            }
            self.step(limit, &mut stuck);
            assert!(
                self.now < limit,
                "simulated time limit {limit:?} reached at {:?}",
                self.now
            );
        }
    }

    /// Completes the handshake and waits until the client has sent a short packet (so the
    /// server's connection ID is known).
    pub fn establish(&mut self) {
        let limit = self.now + Duration::from_secs(5);
        self.run_until(limit, |s| {
            s.sh.is_some()
                && s.server_cid.is_some()
                && s.client.connection(s.ch).unwrap().state() == ConnectionState::Established
        });
    }

    /// The server's connection.
    pub fn server_conn(&self) -> &ri2n_proto::Connection {
        self.server
            .connection(self.sh.expect("accepted"))
            .expect("server connection exists")
    }

    /// Hands the server a datagram from `remote` to its `local` address, at the current time.
    pub fn inject(&mut self, local: SocketAddr, remote: SocketAddr, data: &[u8]) {
        let now = self.instant();
        self.server
            .handle_datagram(now, local, remote, &mut data.to_vec());
        self.flush();
    }

    /// Hands the client a datagram from `remote` to its `local` address, at the current time.
    pub fn inject_client(&mut self, local: SocketAddr, remote: SocketAddr, data: &[u8]) {
        let now = self.instant();
        self.client
            .handle_datagram(now, local, remote, &mut data.to_vec());
        self.flush();
    }

    /// The address pairs (server local, client remote) the client's links use.
    pub fn pairs(&self) -> Vec<(SocketAddr, SocketAddr)> {
        let mut v: Vec<_> = self.link_ids.keys().copied().collect();
        v.sort();
        v
    }

    /// Memory bounds every server (and client) connection must keep, whatever it is sent.
    /// `max_connections`: how many connections the server may hold (1, plus one per INITIAL
    /// with a valid cookie the caller may have handed it).
    pub fn check_bounds(&self, max_connections: usize) {
        assert!(
            self.server.connection_count() <= max_connections,
            "the server holds {} connections, at most {max_connections} expected",
            self.server.connection_count()
        );
        assert!(self.client.connection_count() <= 1);
        for (who, ep, h) in [
            ("server", &self.server, self.sh),
            ("client", &self.client, Some(self.ch)),
        ] {
            let Some(c) = h.and_then(|h| ep.connection(h)) else {
                continue;
            };
            let st = c.stats();
            assert!(
                st.recv_buffered <= 2 * self.cfg.window,
                "{who} buffers {} received bytes, more than 2 x window {}",
                st.recv_buffered,
                self.cfg.window
            );
            assert!(
                st.send_buffered <= 2 * self.cfg.send_buffer,
                "{who} buffers {} bytes to send, more than 2 x send buffer {}",
                st.send_buffered,
                self.cfg.send_buffer
            );
            assert!(st.links.len() <= ri2n_proto::MAX_LINKS);
        }
    }
}

/// A simulation whose client and server hold these keys (or none), keeping every client
/// datagram of the first 20 000 for the test to read (replays, mutations, captured IDs).
pub fn keyed(client_key: Option<Key>, server_key: Option<Key>) -> Sim {
    Sim::new(SimConfig {
        client_key,
        server_key,
        capture_keep: 20_000,
        capture_rolling: 0,
        ..SimConfig::default()
    })
}

/// Runs `t` to completion, exact and with nothing lost (panics after 60 s of simulated time).
pub fn finish(sim: &mut Sim, t: &mut Transfer) {
    let limit = sim.now + Duration::from_secs(60);
    sim.run_until(limit, |s| {
        t.pump(s);
        t.complete(s)
    });
    assert_eq!(t.corrupted, 0);
    assert_eq!(t.lost, None);
}

/// An INITIAL datagram (padded to the minimum size).
pub fn initial(scid: u64, token: &[u8], mode: u8, hello: &[u8]) -> Vec<u8> {
    wire::control_packet(&wire::Header::Initial {
        scid,
        token,
        mode,
        hello,
    })
}

/// Rewrites `data` into a short packet for the server's connection: version, type and
/// connection ID replaced (the datagram is extended to hold a header), the link byte replaced
/// when given.
pub fn make_valid(data: &[u8], cid: u64, link: Option<u8>) -> Vec<u8> {
    let mut b = data.to_vec();
    if b.len() < wire::SHORT_HEADER_FIXED + 1 {
        b.resize(wire::SHORT_HEADER_FIXED + 1, 0);
    }
    b[0] = VERSION;
    b[1] = packet_type::SHORT;
    b[2..10].copy_from_slice(&cid.to_be_bytes());
    if let Some(l) = link {
        b[10] = l;
    }
    b
}

/// Byte `i` of the client's byte stream (the server's is inverted).
pub fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

/// Message `k` of the client's message stream.
pub fn message(k: u64) -> Vec<u8> {
    let len = (k * 977 % 5000) as usize + 1;
    (0..len as u64).map(|i| pattern(i ^ (k << 20))).collect()
}

/// A transfer in both directions: the client sends `c2s` bytes and `messages` messages, the
/// server sends `s2c` bytes; both read and check what arrives.
#[derive(Debug, Default)]
pub struct Transfer {
    pub c2s: u64,
    pub s2c: u64,
    pub messages: u64,
    pub sent_c: u64,
    pub sent_s: u64,
    pub msgs_sent: u64,
    pub got_c: u64,
    pub got_s: u64,
    pub msgs_got: u64,
    /// Panic at the first byte that differs from what was sent.
    pub strict: bool,
    /// Compare every byte received with what was sent (off: count bytes only, which is much
    /// cheaper under coverage instrumentation).
    pub verify: bool,
    /// Bytes that differed (non-strict mode).
    pub corrupted: u64,
    pub finished_c: bool,
    pub finished_s: bool,
    /// Either side saw the end of its incoming byte stream.
    pub eof_c: bool,
    pub eof_s: bool,
    /// A read or write reported the connection lost.
    pub lost: Option<String>,
    /// Read buffer, and the next chunk of each writer (kept when a write is refused).
    buf: Vec<u8>,
    chunk_c: Vec<u8>,
    chunk_s: Vec<u8>,
}

/// Bytes handed to `write` at a time.
const CHUNK: u64 = 16384;

impl Transfer {
    pub fn new(c2s: u64, s2c: u64, messages: u64, strict: bool) -> Self {
        Self {
            c2s,
            s2c,
            messages,
            strict,
            verify: true,
            buf: vec![0u8; 65536],
            ..Default::default()
        }
    }

    /// Writes and reads what it can on both sides.
    pub fn pump(&mut self, sim: &mut Sim) {
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(65536, 0);
        self.pump_with(sim, &mut buf);
        self.buf = buf;
    }

    fn pump_with(&mut self, sim: &mut Sim, buf: &mut [u8]) {
        let Some(cc) = sim.client.connection_mut(sim.ch) else {
            return;
        };
        if cc.state() == ConnectionState::Established {
            while self.sent_c < self.c2s {
                if self.chunk_c.is_empty() {
                    let end = (self.sent_c + CHUNK).min(self.c2s);
                    self.chunk_c = (self.sent_c..end).map(pattern).collect();
                }
                match cc.write(&self.chunk_c) {
                    Ok(n) => {
                        self.sent_c += n as u64;
                        self.chunk_c.drain(..n);
                    }
                    Err(_) => break,
                }
            }
            while self.msgs_sent < self.messages {
                if cc.send_message(&message(self.msgs_sent)).is_err() {
                    break;
                }
                self.msgs_sent += 1;
            }
            if self.sent_c == self.c2s && self.msgs_sent == self.messages && !self.finished_c {
                cc.finish();
                self.finished_c = true;
            }
        }
        loop {
            match cc.read(buf) {
                Ok(0) => {
                    self.eof_c = true;
                    break;
                }
                Ok(n) => {
                    let check = if self.verify { &buf[..n] } else { &[][..] };
                    for (i, &x) in check.iter().enumerate() {
                        let at = self.got_c + i as u64;
                        if x != pattern(at) ^ 0xff {
                            assert!(!self.strict, "client received a wrong byte at offset {at}");
                            self.corrupted += 1;
                        }
                    }
                    self.got_c += n as u64;
                }
                Err(ReadError::Blocked) => break,
                Err(e) => {
                    self.lost.get_or_insert(format!("client read: {e}"));
                    break;
                }
            }
        }
        let Some(h) = sim.sh else { return };
        let Some(sc) = sim.server.connection_mut(h) else {
            return;
        };
        while self.sent_s < self.s2c {
            if self.chunk_s.is_empty() {
                let end = (self.sent_s + CHUNK).min(self.s2c);
                self.chunk_s = (self.sent_s..end).map(|i| pattern(i) ^ 0xff).collect();
            }
            match sc.write(&self.chunk_s) {
                Ok(n) => {
                    self.sent_s += n as u64;
                    self.chunk_s.drain(..n);
                }
                Err(_) => break,
            }
        }
        if self.sent_s == self.s2c && !self.finished_s {
            sc.finish();
            self.finished_s = true;
        }
        loop {
            match sc.read(buf) {
                Ok(0) => {
                    self.eof_s = true;
                    break;
                }
                Ok(n) => {
                    let check = if self.verify { &buf[..n] } else { &[][..] };
                    for (i, &x) in check.iter().enumerate() {
                        let at = self.got_s + i as u64;
                        if x != pattern(at) {
                            assert!(!self.strict, "server received a wrong byte at offset {at}");
                            self.corrupted += 1;
                        }
                    }
                    self.got_s += n as u64;
                }
                Err(ReadError::Blocked) => break,
                Err(e) => {
                    self.lost.get_or_insert(format!("server read: {e}"));
                    break;
                }
            }
        }
        loop {
            match sc.recv_message() {
                Ok(Some(m)) => {
                    if self.verify && m != message(self.msgs_got) {
                        assert!(
                            !self.strict,
                            "server received a wrong message {} ({} bytes)",
                            self.msgs_got,
                            m.len()
                        );
                        self.corrupted += 1;
                    }
                    self.msgs_got += 1;
                }
                Ok(None) | Err(ReadError::Blocked) => break,
                Err(e) => {
                    self.lost.get_or_insert(format!("server recv_message: {e}"));
                    break;
                }
            }
        }
    }

    /// Everything sent arrived, both streams ended, and both senders saw it acknowledged.
    pub fn complete(&self, sim: &Sim) -> bool {
        self.got_s == self.c2s
            && self.got_c == self.s2c
            && self.msgs_got == self.messages
            && self.eof_c
            && self.eof_s
            && sim
                .client
                .connection(sim.ch)
                .is_some_and(|c| c.is_send_complete())
            && sim
                .sh
                .and_then(|h| sim.server.connection(h))
                .is_some_and(|c| c.is_send_complete())
    }
}
