//! The application of most tests on a [`Testbed`]: a transfer in both directions whose bytes
//! and messages follow known patterns, so that the receivers check every one of them.

use ri2n_proto::{ConnectionState, ReadError};

use super::Testbed;

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
    /// Bytes the client sends.
    pub c2s: u64,
    /// Bytes the server sends.
    pub s2c: u64,
    /// Messages the client sends.
    pub messages: u64,
    /// Bytes the client has written so far.
    pub sent_c: u64,
    /// Bytes the server has written so far.
    pub sent_s: u64,
    /// Messages the client has sent so far.
    pub msgs_sent: u64,
    /// Bytes the client has read so far.
    pub got_c: u64,
    /// Bytes the server has read so far.
    pub got_s: u64,
    /// Messages the server has received so far.
    pub msgs_got: u64,
    /// Panic at the first byte that differs from what was sent.
    pub strict: bool,
    /// Compare every byte received with what was sent (off: count bytes only, which is much
    /// cheaper under coverage instrumentation).
    pub verify: bool,
    /// Bytes that differed (non-strict mode).
    pub corrupted: u64,
    /// The client has finished its side.
    pub finished_c: bool,
    /// The server has finished its side.
    pub finished_s: bool,
    /// The client saw the end of its incoming byte stream.
    pub eof_c: bool,
    /// The server saw the end of its incoming byte stream.
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
    /// The client sends `c2s` bytes and `messages` messages, the server `s2c` bytes; `strict`:
    /// panic at the first byte that differs (rather than count it).
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
    pub fn pump(&mut self, tb: &mut Testbed) {
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(65536, 0);
        self.pump_with(tb, &mut buf);
        self.buf = buf;
    }

    fn pump_with(&mut self, tb: &mut Testbed, buf: &mut [u8]) {
        let Some(cc) = tb.client.connection_mut(tb.ch) else {
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
        let Some(h) = tb.sh else { return };
        let Some(sc) = tb.server.connection_mut(h) else {
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
    pub fn complete(&self, tb: &Testbed) -> bool {
        self.got_s == self.c2s
            && self.got_c == self.s2c
            && self.msgs_got == self.messages
            && self.eof_c
            && self.eof_s
            && tb
                .client
                .connection(tb.ch)
                .is_some_and(|c| c.is_send_complete())
            && tb
                .sh
                .and_then(|h| tb.server.connection(h))
                .is_some_and(|c| c.is_send_complete())
    }
}
