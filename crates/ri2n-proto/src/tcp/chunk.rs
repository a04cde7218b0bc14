//! What the striped sequence carries (docs/PROTOCOL.md §12.7): the connection's two streams,
//! the byte stream and the message stream, as a series of *chunks*, each a 5-byte header
//! (kind, payload length) and its payload. A stream chunk holds bytes the application wrote
//! (as many writes as were waiting when a link took them), a message chunk one whole
//! message, so a large message is striped over the links like any other stretch of the
//! sequence.
//!
//! [`Demux`] splits the in-order sequence back into the two streams, without I/O: it is fed
//! the bytes that come next and says what each is. It never panics on a peer's bytes; a
//! header it cannot accept is an error that ends the connection.

/// Bytes of a chunk header.
pub const HEADER_LEN: usize = 5;
/// The largest chunk payload (a longer write becomes several chunks).
pub const MAX_CHUNK: usize = u32::MAX as usize;

const K_STREAM: u8 = 0;
const K_MESSAGE: u8 = 1;

/// Which stream a chunk belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Bytes of the byte stream.
    Stream,
    /// One whole message.
    Message,
}

/// The header of a chunk of `len` payload bytes (at most [`MAX_CHUNK`]).
pub fn header(kind: Kind, len: usize) -> [u8; HEADER_LEN] {
    let k = match kind {
        Kind::Stream => K_STREAM,
        Kind::Message => K_MESSAGE,
    };
    // a longer length cut to 32 bits would misframe everything after it
    let l = u32::try_from(len)
        .expect("a chunk of at most MAX_CHUNK bytes")
        .to_be_bytes();
    [k, l[0], l[1], l[2], l[3]]
}

/// What is wrong with the sequence's chunks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// A header of unknown kind.
    #[error("a chunk of unknown kind {0}")]
    UnknownKind(u8),
    /// A message longer than the receive window could ever hold whole.
    #[error("a message of {len} bytes, longer than the largest this side takes ({max})")]
    MessageTooLong {
        /// Its announced length.
        len: u64,
        /// The longest this side takes.
        max: u64,
    },
    /// A message arrived though this side said it takes none.
    #[error("a message arrived, though this side takes none")]
    MessagesRefused,
    /// The sequence ended inside a chunk.
    #[error("the peer's streams ended inside a chunk")]
    Truncated,
}

/// What the next bytes of the sequence are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// `n` bytes of a chunk header; `empty_message`: they completed the header of a message
    /// of no bytes, which is therefore whole.
    Header {
        /// How many.
        n: usize,
        /// A message of length zero is complete.
        empty_message: bool,
    },
    /// `n` bytes of the byte stream.
    Stream(usize),
    /// `n` bytes of a message; `last`: the message is complete with them.
    Message {
        /// How many.
        n: usize,
        /// They end the message.
        last: bool,
    },
}

/// Splits the sequence back into the two streams (see the module documentation).
#[derive(Debug, Clone)]
pub struct Demux {
    /// Sequence bytes already stepped over.
    position: u64,
    header: [u8; HEADER_LEN],
    /// Bytes of `header` that arrived.
    have: usize,
    /// The kind of the chunk whose payload comes next, and how much of it.
    open: Option<(Kind, u64)>,
    /// The longest message taken; `None`: no messages at all.
    max_message: Option<u64>,
    /// The error met, returned by every later step: nothing after it is believed.
    failed: Option<ChunkError>,
}

impl Demux {
    /// A sequence from its start; messages longer than `max_message` (or any, when `None`)
    /// are refused.
    pub fn new(max_message: Option<u64>) -> Self {
        Self {
            position: 0,
            header: [0; HEADER_LEN],
            have: 0,
            open: None,
            max_message,
            failed: None,
        }
    }

    /// Sequence bytes already stepped over.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The bytes of a message that have yet to come while its payload is being split: its
    /// whole length right after its header. `None` between chunks and inside stream bytes.
    pub fn message_left(&self) -> Option<u64> {
        match self.open {
            Some((Kind::Message, left)) => Some(left),
            _ => None,
        }
    }

    /// Whether the sequence may end here (between chunks).
    pub fn at_boundary(&self) -> bool {
        self.have == 0 && self.open.is_none()
    }

    /// Whether the sequence ending here is an error (it stops inside a chunk).
    pub fn check_end(&self) -> Result<(), ChunkError> {
        match self.at_boundary() {
            true => Ok(()),
            false => Err(ChunkError::Truncated),
        }
    }

    /// What the first bytes of `data` (the sequence's next bytes, not empty) are; the
    /// caller takes that many from `data` and steps again over the rest. After an error,
    /// every step fails with it.
    pub fn step(&mut self, data: &[u8]) -> Result<Piece, ChunkError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.step_inner(data);
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }

    fn step_inner(&mut self, data: &[u8]) -> Result<Piece, ChunkError> {
        debug_assert!(!data.is_empty());
        let piece = match self.open {
            Some((kind, left)) => {
                let n = (left.min(data.len() as u64)) as usize;
                let left = left - n as u64;
                self.open = (left > 0).then_some((kind, left));
                match kind {
                    Kind::Stream => Piece::Stream(n),
                    Kind::Message => Piece::Message { n, last: left == 0 },
                }
            }
            None => {
                let n = (HEADER_LEN - self.have).min(data.len());
                self.header[self.have..self.have + n].copy_from_slice(&data[..n]);
                self.have += n;
                let mut empty_message = false;
                if self.have == HEADER_LEN {
                    self.have = 0;
                    let h = self.header;
                    let len = u64::from(u32::from_be_bytes([h[1], h[2], h[3], h[4]]));
                    let kind = match h[0] {
                        K_STREAM => Kind::Stream,
                        K_MESSAGE => {
                            let max = self.max_message.ok_or(ChunkError::MessagesRefused)?;
                            if len > max {
                                return Err(ChunkError::MessageTooLong { len, max });
                            }
                            Kind::Message
                        }
                        k => return Err(ChunkError::UnknownKind(k)),
                    };
                    empty_message = kind == Kind::Message && len == 0;
                    self.open = (len > 0).then_some((kind, len));
                }
                Piece::Header { n, empty_message }
            }
        };
        self.position += match piece {
            Piece::Header { n, .. } | Piece::Stream(n) | Piece::Message { n, .. } => n as u64,
        };
        Ok(piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps over `seq` in pieces of at most `cut` bytes; returns the byte stream and the
    /// messages it carries. Checks on the way that what is left of each message is known
    /// from its header on.
    fn split(seq: &[u8], cut: usize) -> Result<(Vec<u8>, Vec<Vec<u8>>), ChunkError> {
        let mut d = Demux::new(Some(1 << 20));
        let (mut stream, mut msgs, mut msg) = (Vec::new(), Vec::new(), Vec::new());
        let mut announced = 0;
        for mut part in seq.chunks(cut) {
            while !part.is_empty() {
                let n = match d.step(part)? {
                    Piece::Header { n, empty_message } => {
                        if empty_message {
                            msgs.push(Vec::new());
                        }
                        if let Some(left) = d.message_left() {
                            assert!(msg.is_empty(), "announced before the last one ended");
                            announced = left;
                        }
                        n
                    }
                    Piece::Stream(n) => {
                        assert_eq!(d.message_left(), None, "inside stream bytes");
                        stream.extend_from_slice(&part[..n]);
                        n
                    }
                    Piece::Message { n, last } => {
                        msg.extend_from_slice(&part[..n]);
                        let left = announced - msg.len() as u64;
                        assert_eq!(d.message_left(), (!last).then_some(left));
                        if last {
                            assert_eq!(left, 0, "the message is as long as announced");
                            msgs.push(std::mem::take(&mut msg));
                        }
                        n
                    }
                };
                part = &part[n..];
            }
        }
        assert_eq!(d.position(), seq.len() as u64);
        d.check_end()?;
        Ok((stream, msgs))
    }

    fn chunk(kind: Kind, payload: &[u8]) -> Vec<u8> {
        let mut v = header(kind, payload.len()).to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn headers_encode_kind_then_big_endian_length() {
        assert_eq!(header(Kind::Stream, 0x0102_0304), [0, 1, 2, 3, 4]);
        assert_eq!(header(Kind::Message, 5), [1, 0, 0, 0, 5]);
    }

    #[test]
    fn streams_and_messages_come_apart_however_the_sequence_is_cut() {
        let mut seq = chunk(Kind::Stream, b"hello ");
        seq.extend(chunk(Kind::Message, b"first"));
        seq.extend(chunk(Kind::Message, b""));
        seq.extend(chunk(Kind::Stream, b"world"));
        seq.extend(chunk(Kind::Message, &[7; 300]));
        for cut in [1, 2, 3, 5, 7, 64, 4096] {
            let (stream, msgs) = split(&seq, cut).unwrap();
            assert_eq!(stream, b"hello world", "cut {cut}");
            assert_eq!(
                msgs,
                [b"first".to_vec(), Vec::new(), vec![7; 300]],
                "cut {cut}"
            );
        }
    }

    #[test]
    fn a_sequence_ending_inside_a_chunk_is_truncated() {
        let seq = chunk(Kind::Message, b"whole");
        assert_eq!(split(&seq[..3], 2), Err(ChunkError::Truncated));
        assert_eq!(split(&seq[..7], 2), Err(ChunkError::Truncated));
        assert!(split(&seq, 2).is_ok());
    }

    #[test]
    fn bad_headers_are_refused() {
        assert_eq!(
            split(&[9, 0, 0, 0, 1, 0], 8),
            Err(ChunkError::UnknownKind(9))
        );
        assert_eq!(
            split(&header(Kind::Message, (1 << 20) + 1), 8),
            Err(ChunkError::MessageTooLong {
                len: (1 << 20) + 1,
                max: 1 << 20
            })
        );
        let mut d = Demux::new(None);
        assert_eq!(
            d.step(&header(Kind::Message, 1)),
            Err(ChunkError::MessagesRefused)
        );
        // nothing after an error is believed
        assert_eq!(
            d.step(&header(Kind::Stream, 1)),
            Err(ChunkError::MessagesRefused)
        );
        // stream chunks of any length are fine without messages
        let mut d = Demux::new(None);
        assert!(d.step(&header(Kind::Stream, MAX_CHUNK)).is_ok());
    }
}
