//! The application model on each host: a sender that writes a seeded pseudorandom byte stream
//! (or, once connected, messages) as fast as the connection takes it and then finishes, and a receiver that reads
//! (optionally rate-limited by a token bucket) and checks every byte against the same stream
//! regenerated, so corruption is reported at its exact offset.

use std::time::Duration;

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ri2n_proto::{Connection, ConnectionState, ReadError, WriteError};

use crate::error::FailureKind;
use crate::net::{Dir, HostId};

/// Bytes generated at a time (a multiple of 4, so the stream does not depend on how it is
/// consumed).
const CHUNK: usize = 64 << 10;

/// An endless deterministic pseudorandom byte stream, consumed sequentially.
pub(crate) struct ByteStream {
    rng: ChaCha8Rng,
    chunk: Box<[u8]>,
    pos: usize,
}

impl ByteStream {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            chunk: vec![0; CHUNK].into_boxed_slice(),
            pos: CHUNK,
        }
    }

    /// The next bytes of the stream (at least one), without consuming them.
    pub(crate) fn current(&mut self) -> &[u8] {
        if self.pos == CHUNK {
            self.rng.fill_bytes(&mut self.chunk);
            self.pos = 0;
        }
        &self.chunk[self.pos..]
    }

    /// Consumes `n` bytes of what [`ByteStream::current`] returned.
    pub(crate) fn advance(&mut self, n: usize) {
        debug_assert!(self.pos + n <= CHUNK);
        self.pos += n;
    }

    /// Consumes `got.len()` bytes, checking they equal `got`. On a mismatch returns its index
    /// in `got` and the expected byte.
    pub(crate) fn check(&mut self, got: &[u8]) -> Result<(), (usize, u8)> {
        let mut done = 0;
        while done < got.len() {
            let exp = self.current();
            let n = exp.len().min(got.len() - done);
            if exp[..n] != got[done..done + n] {
                let i = (0..n)
                    .find(|&i| exp[i] != got[done + i])
                    .expect("slices differ");
                return Err((done + i, exp[i]));
            }
            self.advance(n);
            done += n;
        }
        Ok(())
    }

    /// Consumes `out.len()` bytes into `out`.
    pub(crate) fn fill(&mut self, out: &mut [u8]) {
        let mut done = 0;
        while done < out.len() {
            let src = self.current();
            let n = src.len().min(out.len() - done);
            out[done..done + n].copy_from_slice(&src[..n]);
            self.advance(n);
            done += n;
        }
    }
}

/// A deterministic sequence of messages of pseudorandom sizes and contents.
pub(crate) struct MessageGen {
    sizes: ChaCha8Rng,
    bytes: ByteStream,
    max_size: usize,
}

impl MessageGen {
    pub(crate) fn new(seed: u64, max_size: usize) -> Self {
        Self {
            sizes: ChaCha8Rng::seed_from_u64(crate::derive_seed(seed, 0x3E55_A6E5)),
            bytes: ByteStream::new(seed),
            max_size,
        }
    }

    /// The bytes of the first `count` messages [`next_message`](Self::next_message) makes,
    /// without making them.
    pub(crate) fn total_size(seed: u64, max_size: usize, count: usize) -> u64 {
        let mut sizes = Self::new(seed, max_size).sizes;
        (0..count)
            .map(|_| sizes.gen_range(1..=max_size) as u64)
            .sum()
    }

    pub(crate) fn next_message(&mut self) -> Vec<u8> {
        let n = self.sizes.gen_range(1..=self.max_size);
        let mut m = vec![0; n];
        self.bytes.fill(&mut m);
        m
    }
}

/// 64-bit FNV-1a, for a summary hash of a transfer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fnv(pub(crate) u64);

impl Fnv {
    pub(crate) fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    pub(crate) fn update(&mut self, data: &[u8]) {
        let mut h = self.0;
        for &b in data {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// What one direction carries: a byte stream of `bytes` bytes, or `messages` messages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Workload {
    pub(crate) seed: u64,
    pub(crate) bytes: u64,
    pub(crate) messages: usize,
    pub(crate) max_message: usize,
}

/// The writing side of one direction.
pub(crate) struct Sender {
    pub(crate) host: HostId,
    bytes_left: u64,
    stream: ByteStream,
    messages_left: usize,
    messages: MessageGen,
    pending: Option<Vec<u8>>,
    pub(crate) written: u64,
    pub(crate) hash: Fnv,
    pub(crate) finished: bool,
    /// When `is_send_complete()` was first seen true (or the connection closed cleanly).
    pub(crate) complete_at: Option<Duration>,
}

impl Sender {
    pub(crate) fn new(host: HostId, w: Workload) -> Self {
        Self {
            host,
            bytes_left: w.bytes,
            stream: ByteStream::new(w.seed),
            messages_left: w.messages,
            messages: MessageGen::new(w.seed, w.max_message.max(1)),
            pending: None,
            written: 0,
            hash: Fnv::new(),
            finished: false,
            complete_at: None,
        }
    }

    /// Writes whatever the connection takes, finishes when all is written, and notices when
    /// everything was acknowledged. Returns whether anything changed.
    pub(crate) fn step(
        &mut self,
        now: Duration,
        conn: &mut Connection,
    ) -> Result<bool, FailureKind> {
        let mut progress = false;
        while self.bytes_left > 0 {
            let avail = self.stream.current();
            let n = (avail.len() as u64).min(self.bytes_left) as usize;
            match conn.write(&avail[..n]) {
                Ok(0) => break,
                Ok(k) => {
                    self.hash.update(&avail[..k]);
                    self.stream.advance(k);
                    self.bytes_left -= k as u64;
                    self.written += k as u64;
                    progress = true;
                }
                Err(e) => {
                    if self.write_error(e)? {
                        break;
                    }
                }
            }
        }
        // The largest message depends on the peer's window, learnt in the handshake: messages
        // wait for the connection to be established (bytes are written at once).
        let established = conn.state() == ConnectionState::Established;
        while self.bytes_left == 0 && self.messages_left > 0 && established {
            let msg = match self.pending.take() {
                Some(m) => m,
                None => self.messages.next_message(),
            };
            match conn.send_message(&msg) {
                Ok(()) => {
                    self.hash.update(&msg);
                    self.written += msg.len() as u64;
                    self.messages_left -= 1;
                    progress = true;
                }
                Err(e) => {
                    self.pending = Some(msg);
                    if self.write_error(e)? {
                        break;
                    }
                }
            }
        }
        if self.bytes_left == 0 && self.messages_left == 0 && !self.finished {
            conn.finish();
            self.finished = true;
            progress = true;
        }
        if self.finished && self.complete_at.is_none() && conn.is_send_complete() {
            self.complete_at = Some(now);
            progress = true;
        }
        Ok(progress)
    }

    /// `Ok(true)`: stop writing for now; an error: the engine misbehaved.
    fn write_error(&self, e: WriteError) -> Result<bool, FailureKind> {
        match e {
            WriteError::Blocked | WriteError::NotConnected | WriteError::ConnectionLost(_) => {
                Ok(true)
            }
            e => Err(FailureKind::WriteFailed {
                host: self.host,
                error: e,
            }),
        }
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.complete_at.is_some()
    }
}

/// Reads at most `rate` bytes per second; holds 10 ms worth (at least 4 KiB) when full.
struct TokenBucket {
    rate: f64,
    cap: f64,
    tokens: f64,
    last: Duration,
}

impl TokenBucket {
    fn new(rate: u64) -> Self {
        let rate = rate as f64;
        let cap = (rate / 100.0).max(4096.0);
        Self {
            rate,
            cap,
            tokens: cap,
            last: Duration::ZERO,
        }
    }

    fn refill(&mut self, now: Duration) {
        if now > self.last {
            self.tokens = (self.tokens + self.rate * (now - self.last).as_secs_f64()).min(self.cap);
            self.last = now;
        }
    }

    /// When the bucket will be full again.
    fn full_at(&self, now: Duration) -> Duration {
        now + Duration::from_secs_f64(((self.cap - self.tokens) / self.rate).max(1e-6))
    }
}

/// What a receiver step did.
pub(crate) struct ReadOutcome {
    /// Anything changed.
    pub(crate) progress: bool,
    /// Application bytes (stream bytes or message bytes) received in this step.
    pub(crate) bytes: u64,
    /// The reader ran out of tokens with data possibly waiting: wake it at this time.
    pub(crate) wake_at: Option<Duration>,
}

/// The reading side of one direction: checks everything it reads.
pub(crate) struct Receiver {
    dir: Dir,
    bytes_total: u64,
    stream: ByteStream,
    messages_total: usize,
    messages: MessageGen,
    bucket: Option<TokenBucket>,
    /// Application bytes read: stream bytes plus message bytes.
    pub(crate) received: u64,
    /// Bytes read from the byte stream.
    stream_received: u64,
    pub(crate) messages_received: usize,
    pub(crate) hash: Fnv,
    bytes_eof: bool,
    messages_eof: bool,
    /// When both streams' ends were read after everything expected.
    pub(crate) done_at: Option<Duration>,
}

impl Receiver {
    pub(crate) fn new(dir: Dir, w: Workload, reader_rate: Option<u64>) -> Self {
        Self {
            dir,
            bytes_total: w.bytes,
            stream: ByteStream::new(w.seed),
            messages_total: w.messages,
            messages: MessageGen::new(w.seed, w.max_message.max(1)),
            bucket: reader_rate.map(TokenBucket::new),
            received: 0,
            stream_received: 0,
            messages_received: 0,
            hash: Fnv::new(),
            bytes_eof: false,
            messages_eof: false,
            done_at: None,
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done_at.is_some()
    }

    /// Reads what the connection has and the token bucket allows, checking every byte.
    pub(crate) fn step(
        &mut self,
        now: Duration,
        conn: &mut Connection,
        buf: &mut [u8],
    ) -> Result<ReadOutcome, FailureKind> {
        let mut out = ReadOutcome {
            progress: false,
            bytes: 0,
            wake_at: None,
        };
        if self.is_done() {
            return Ok(out);
        }
        if let Some(b) = &mut self.bucket {
            b.refill(now);
        }
        let mut limited = false;
        while !self.bytes_eof {
            let allowed = match &self.bucket {
                Some(b) if b.tokens < 1.0 => {
                    limited = true;
                    break;
                }
                Some(b) => (b.tokens as usize).min(buf.len()),
                None => buf.len(),
            };
            match conn.read(&mut buf[..allowed]) {
                Ok(0) => {
                    if self.stream_received != self.bytes_total {
                        return Err(FailureKind::EarlyEnd {
                            dir: self.dir,
                            received: self.stream_received,
                            expected: self.bytes_total,
                        });
                    }
                    self.bytes_eof = true;
                    out.progress = true;
                }
                Ok(n) => {
                    let got = &buf[..n];
                    if self.stream_received + n as u64 > self.bytes_total {
                        return Err(FailureKind::TooMuchData {
                            dir: self.dir,
                            received: self.stream_received + n as u64,
                            expected: self.bytes_total,
                        });
                    }
                    if let Err((i, expected)) = self.stream.check(got) {
                        return Err(FailureKind::Mismatch {
                            dir: self.dir,
                            offset: self.stream_received + i as u64,
                            expected,
                            got: got[i],
                        });
                    }
                    self.hash.update(got);
                    self.stream_received += n as u64;
                    self.received += n as u64;
                    out.bytes += n as u64;
                    out.progress = true;
                    if let Some(b) = &mut self.bucket {
                        b.tokens -= n as f64;
                    }
                }
                Err(ReadError::Blocked) | Err(ReadError::ConnectionLost(_)) => break,
                Err(e) => {
                    return Err(FailureKind::ReadFailed {
                        dir: self.dir,
                        error: e,
                    })
                }
            }
        }
        while !self.messages_eof && !limited {
            if self.bucket.as_ref().is_some_and(|b| b.tokens < 1.0) {
                limited = true;
                break;
            }
            match conn.recv_message() {
                Ok(None) => {
                    if self.messages_received != self.messages_total {
                        return Err(FailureKind::EarlyEnd {
                            dir: self.dir,
                            received: self.messages_received as u64,
                            expected: self.messages_total as u64,
                        });
                    }
                    self.messages_eof = true;
                    out.progress = true;
                }
                Ok(Some(msg)) => {
                    let index = self.messages_received;
                    if index >= self.messages_total {
                        return Err(FailureKind::MessageMismatch {
                            dir: self.dir,
                            index,
                            expected_len: None,
                            got_len: msg.len(),
                            first_difference: None,
                        });
                    }
                    let expected = self.messages.next_message();
                    if msg != expected {
                        return Err(FailureKind::MessageMismatch {
                            dir: self.dir,
                            index,
                            expected_len: Some(expected.len()),
                            got_len: msg.len(),
                            first_difference: expected.iter().zip(&msg).position(|(a, b)| a != b),
                        });
                    }
                    self.hash.update(&msg);
                    self.messages_received += 1;
                    self.received += msg.len() as u64;
                    out.bytes += msg.len() as u64;
                    out.progress = true;
                    if let Some(b) = &mut self.bucket {
                        b.tokens -= msg.len() as f64;
                    }
                }
                Err(ReadError::Blocked) | Err(ReadError::ConnectionLost(_)) => break,
                Err(e) => {
                    return Err(FailureKind::ReadFailed {
                        dir: self.dir,
                        error: e,
                    })
                }
            }
        }
        if self.bytes_eof && self.messages_eof {
            self.done_at = Some(now);
        } else if limited {
            out.wake_at = self.bucket.as_ref().map(|b| b.full_at(now));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_stream_does_not_depend_on_consumption_pattern() {
        let mut whole = vec![0; 300_000];
        ByteStream::new(5).fill(&mut whole);
        assert!(
            whole.iter().filter(|&&b| b == 0).count() < 300_000 / 128,
            "not zeros"
        );
        let mut s = ByteStream::new(5);
        let mut at = 0;
        for n in [1usize, 3, 7000, 65_536, 1, 100_000, 127_459] {
            assert_eq!(s.check(&whole[at..at + n]), Ok(()));
            at += n;
        }
        assert_eq!(at, whole.len());
        let mut other = vec![0; 1000];
        ByteStream::new(6).fill(&mut other);
        assert_ne!(other[..], whole[..1000]);
    }

    #[test]
    fn byte_stream_reports_the_exact_offset() {
        let mut data = vec![0; 200_000];
        ByteStream::new(1).fill(&mut data);
        let good = data[150_001];
        data[150_001] ^= 0x40;
        let mut s = ByteStream::new(1);
        assert_eq!(s.check(&data[..100_000]), Ok(()));
        assert_eq!(s.check(&data[100_000..]), Err((50_001, good)));
    }

    #[test]
    fn messages_regenerate_identically() {
        let mut a = MessageGen::new(3, 64 << 10);
        let mut b = MessageGen::new(3, 64 << 10);
        let mut sizes = Vec::new();
        for _ in 0..50 {
            let m = a.next_message();
            assert_eq!(m, b.next_message());
            assert!((1..=64 << 10).contains(&m.len()));
            sizes.push(m.len());
        }
        sizes.dedup();
        assert!(sizes.len() > 40);
    }

    #[test]
    fn fnv_known_values() {
        let mut h = Fnv::new();
        h.update(b"");
        assert_eq!(h.0, 0xcbf2_9ce4_8422_2325);
        h.update(b"a");
        assert_eq!(h.0, 0xaf63_dc4c_8601_ec8c);
        let mut h = Fnv::new();
        h.update(b"foobar");
        assert_eq!(h.0, 0x8594_4171_f739_67e8);
    }

    #[test]
    fn token_bucket_refills_at_rate() {
        let mut b = TokenBucket::new(1_000_000);
        assert_eq!(b.cap, 10_000.0);
        b.tokens -= 10_000.0;
        b.refill(Duration::from_millis(4));
        assert!((b.tokens - 4000.0).abs() < 1e-6);
        assert_eq!(
            b.full_at(Duration::from_millis(4)),
            Duration::from_millis(10)
        );
        b.refill(Duration::from_secs(1));
        assert_eq!(b.tokens, 10_000.0);
    }
}
