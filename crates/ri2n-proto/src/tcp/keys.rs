//! Keys on the TCP transport (docs/PROTOCOL.md §12.6): each TCP connection of a keyed link runs
//! the UDP transport's Noise handshake (`Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s`, the cluster key
//! as pre-shared key, §9) right after the hello, its prologue binding the connection ID and the
//! link number, and every batch of records the link's writer sends afterwards travels as one
//! sealed *frame*: a 4-byte length, the records encrypted, a 16-byte tag. The nonce is the
//! frame's number on that TCP connection in that direction, so none repeats within a key; a
//! replaced TCP connection handshakes again and gets fresh keys.

use crate::crypto::{AeadKey, ClientHandshake, ServerHandshake, SessionSecrets, TAG_LEN};
use crate::{Cipher, Key};

/// Bytes a frame adds to its records: the length and the tag.
pub const FRAME_OVERHEAD: usize = 4 + TAG_LEN;
/// The longest frame body (records and tag) a receiver accepts: a run of the longest length
/// with the records before it.
pub const MAX_FRAME: usize = super::frame::MAX_RUN as usize + 1024 + TAG_LEN;
/// Frames sealed under one key before the link must be replaced (a new TCP connection and
/// handshake, so fresh keys): far below AES-GCM's limits for frames of this size.
pub const MAX_FRAMES_PER_KEY: u64 = 1 << 24;

/// The cluster keys do not match (or the peer's message was forged or damaged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the TCP link's handshake failed: the two sides do not hold the same key")]
pub struct HandshakeFailed;

/// A frame failed to open: forged, damaged or out of order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a sealed frame failed to open")]
pub struct OpenFailed;

fn cookie(link: u8) -> [u8; 9] {
    let mut c = [0u8; 9];
    c[..8].copy_from_slice(b"ri2n-tcp");
    c[8] = link;
    c
}

/// A client's half-done handshake on one TCP connection.
pub struct ClientLinkHandshake(ClientHandshake);

impl std::fmt::Debug for ClientLinkHandshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientLinkHandshake(..)")
    }
}

impl ClientLinkHandshake {
    /// The first handshake message of link `link` of connection `connection_id`; it carries
    /// the cipher this host prefers.
    pub fn start(key: &Key, connection_id: u64, link: u8) -> (Self, Vec<u8>) {
        let (h, msg) = ClientHandshake::start(
            key,
            connection_id,
            &cookie(link),
            &[Cipher::preferred().code()],
        );
        (Self(h), msg)
    }

    /// Reads the server's answer (which names the cipher both use).
    pub fn finish(mut self, msg: &[u8]) -> Result<FrameKeys, HandshakeFailed> {
        let (payload, secrets) = self.0.finish(msg).map_err(|_| HandshakeFailed)?;
        let cipher = Cipher::from_code(*payload.first().ok_or(HandshakeFailed)?);
        Ok(FrameKeys::new(cipher, &secrets, true))
    }
}

/// The server's side: reads the client's first message and answers it.
pub fn server_handshake(
    key: &Key,
    connection_id: u64,
    link: u8,
    msg: &[u8],
) -> Result<(Vec<u8>, FrameKeys), HandshakeFailed> {
    let (h, payload) = ServerHandshake::read(key, connection_id, &cookie(link), msg)
        .map_err(|_| HandshakeFailed)?;
    let theirs = Cipher::from_code(*payload.first().ok_or(HandshakeFailed)?);
    let cipher = Cipher::agree(theirs, Cipher::preferred());
    let (answer, secrets) = h.answer(&[cipher.code()]);
    Ok((answer, FrameKeys::new(cipher, &secrets, false)))
}

/// One direction's key and frame counter.
pub struct FrameKey {
    key: AeadKey,
    frames: u64,
}

impl std::fmt::Debug for FrameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FrameKey {{ frames: {} }}", self.frames)
    }
}

impl FrameKey {
    fn new(cipher: Cipher, secret: &[u8; 32]) -> Self {
        Self {
            key: AeadKey::new(cipher, secret),
            frames: 0,
        }
    }

    fn nonce(&mut self) -> [u8; 12] {
        let n = self.next_nonce();
        self.frames += 1;
        n
    }

    fn next_nonce(&self) -> [u8; 12] {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&self.frames.to_be_bytes());
        n
    }

    /// Whether the next frame, whose length field was `len` and body (ciphertext and tag)
    /// `body`, opens; a copy is opened, and the count does not move, so the frame is opened
    /// again as usual. A server takes a TCP connection as a link only once its first frame
    /// proves that the client holds this handshake's keys, which one replaying a recorded
    /// hello does not (docs/PROTOCOL.md §12.6).
    pub fn would_open(&self, len: [u8; 4], body: &[u8]) -> bool {
        let mut copy = body.to_vec();
        self.key.open(self.next_nonce(), &len, &mut copy).is_ok()
    }

    /// Whether this key sealed or opened as many frames as it may.
    pub fn worn_out(&self) -> bool {
        self.frames >= MAX_FRAMES_PER_KEY
    }

    /// Seals the records (the concatenation of `records`) as one frame at the start of
    /// `frame`: the length, the records encrypted, the tag; returns that frame. `frame` keeps
    /// the length of the longest frame sealed in it: grown only then, a frame longer than the
    /// one before is written over as it is, not zeroed first.
    pub fn seal<'f>(&mut self, records: &[&[u8]], frame: &'f mut Vec<u8>) -> &'f [u8] {
        let n: usize = records.iter().map(|r| r.len()).sum();
        let len = 4 + n + TAG_LEN;
        if frame.len() < len {
            frame.resize(len, 0);
        }
        let frame = &mut frame[..len];
        frame[..4].copy_from_slice(&((n + TAG_LEN) as u32).to_be_bytes());
        let nonce = self.nonce();
        let (head, rest) = frame.split_at_mut(4);
        let (body, tag) = rest.split_at_mut(n);
        tag.copy_from_slice(&self.key.seal_gathered(nonce, head, records, body));
        frame
    }

    /// Opens the body of a frame whose length field was `len` (ciphertext and tag, in
    /// place); returns the records' length (the plaintext is the start of `body`).
    pub fn open(&mut self, len: [u8; 4], body: &mut [u8]) -> Result<usize, OpenFailed> {
        let nonce = self.nonce();
        let plain = self.key.open(nonce, &len, body).map_err(|_| OpenFailed)?;
        Ok(plain.len())
    }
}

/// The two directions' keys of one TCP connection.
#[derive(Debug)]
pub struct FrameKeys {
    /// The cipher both sides agreed on.
    pub cipher: Cipher,
    /// Seals what this side sends.
    pub seal: FrameKey,
    /// Opens what it receives.
    pub open: FrameKey,
}

impl FrameKeys {
    fn new(cipher: Cipher, secrets: &SessionSecrets, is_client: bool) -> Self {
        let (send, recv) = if is_client {
            (&secrets.client_to_server, &secrets.server_to_client)
        } else {
            (&secrets.server_to_client, &secrets.client_to_server)
        };
        Self {
            cipher,
            seal: FrameKey::new(cipher, send),
            open: FrameKey::new(cipher, recv),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(client_key: &Key, server_key: &Key) -> Result<(FrameKeys, FrameKeys), HandshakeFailed> {
        let (h, m1) = ClientLinkHandshake::start(client_key, 42, 1);
        let (m2, server) = server_handshake(server_key, 42, 1, &m1)?;
        Ok((h.finish(&m2)?, server))
    }

    #[test]
    fn frames_sealed_by_one_side_open_at_the_other_and_hide_their_records() {
        let key = Key::generate().unwrap();
        let (mut c, mut s) = keys(&key, &key).unwrap();
        let mut frame = Vec::new();
        for records in [&b"\x06"[..], &[0x5a; 70_000][..], &b"\x06\x07"[..]] {
            // (after the long one, a short one is sealed at the start of the same memory)
            let mut sealed = c
                .seal
                .seal(&[&records[..1], &records[1..]], &mut frame)
                .to_vec();
            assert_eq!(sealed.len(), records.len() + FRAME_OVERHEAD);
            assert!(!sealed
                .windows(16)
                .any(|w| records.len() >= 16 && w == &records[..16]));
            let len = [sealed[0], sealed[1], sealed[2], sealed[3]];
            let n = s.open.open(len, &mut sealed[4..]).unwrap();
            assert_eq!(&sealed[4..4 + n], records);
        }
        // a flipped bit, or a frame replayed (its number is past), does not open
        let frame = s.seal.seal(&[&[7, 7]], &mut frame);
        let mut copy = frame.to_vec();
        copy[5] ^= 1;
        let len = [frame[0], frame[1], frame[2], frame[3]];
        assert_eq!(c.open.open(len, &mut copy[4..]), Err(OpenFailed));
    }

    #[test]
    fn another_key_or_another_link_fails_the_handshake() {
        let (a, b) = (Key::generate().unwrap(), Key::generate().unwrap());
        assert!(keys(&a, &b).is_err());
        let (_, m1) = ClientLinkHandshake::start(&a, 42, 1);
        assert!(
            server_handshake(&a, 42, 2, &m1).is_err(),
            "bound to its link"
        );
        assert!(
            server_handshake(&a, 43, 1, &m1).is_err(),
            "bound to its connection"
        );
    }
}
