//! Keys and packet protection (docs/PROTOCOL.md §9).
//!
//! A cluster shares one 32-byte key. Each connection runs the Noise handshake
//! `Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s` (through the `snow` crate) inside its INITIAL and
//! ACCEPT: the pre-shared key authenticates both sides, the ephemeral Diffie-Hellman gives each
//! connection fresh keys with forward secrecy. Every short packet is then sealed with an AEAD
//! (`aead`: AEGIS-256X4 when both hosts have AES instructions, ChaCha20-Poly1305 otherwise),
//! the packet header as associated data and the link ID and packet number as nonce, so no
//! nonce repeats within a key. Each direction moves to a new key (Noise's one-way `REKEY`)
//! long before the AEAD's limits; old keys are wiped.

use std::fmt;
use std::io::Read;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use blake2::digest::consts::U16;
use blake2::digest::{Mac, Update};
use thiserror::Error;
use zeroize::{Zeroize, Zeroizing};

use crate::{wire, LinkId, MAX_LINKS};

mod aead;

pub(crate) use aead::AeadKey;
pub use aead::Cipher;
use aead::NONCE_LEN;

/// Bytes of a key.
pub const KEY_LEN: usize = 32;
/// Bytes the AEAD adds to every sealed packet.
pub const TAG_LEN: usize = 16;
/// Bytes of the token that authenticates a RESET.
pub const RESET_TOKEN_LEN: usize = 16;
/// The Noise protocol name: the handshake pattern and its primitives.
pub const NOISE_PARAMS: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
/// Most bytes a Noise handshake message adds to its payload (an ephemeral key and a tag).
pub const HANDSHAKE_OVERHEAD: usize = 32 + TAG_LEN;
/// Start of a key file's line.
const KEY_TEXT_PREFIX: &str = "ri2n-key-v1:";
/// Start of the Noise prologue; the client's connection ID and the server's retry cookie
/// follow.
const PROLOGUE_LABEL: &[u8] = b"ri2n/4 handshake";
/// Label hashed with a connection ID and the RESET's two addresses into the token of a
/// RESET for a connection the sender does not have (a restart).
const RESET_LABEL: &[u8] = b"ri2n/4 reset token";
/// Label of the token of a RESET that refuses a client's INITIAL (a server at its limits):
/// its own, so that the RESET any packet with a client's connection ID draws from the server
/// before the handshake is done (a SHORT for an ID the server does not have) cannot refuse it.
const REFUSAL_LABEL: &[u8] = b"ri2n/5 refusal token";

/// What a RESET says, which its token names (docs/PROTOCOL.md §9.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResetKind {
    /// The sender has no connection for the ID (it restarted, or forgot it).
    Unknown,
    /// The sender refuses the connection a client is opening with the ID (its limits).
    Refusal,
}

/// A direction moves to its next key after sealing this many packets: far below AES-GCM's
/// confidentiality limit of 2^23 full-size packets per key (RFC 9001 §6.6, appendix B).
pub const REKEY_AFTER_PACKETS: u64 = 1 << 22;
/// … or after this long, as WireGuard does, so a long connection does not keep one key.
pub const REKEY_AFTER_TIME: Duration = Duration::from_secs(120);
/// Packets that fail authentication on one connection before it gives up: ChaCha20-Poly1305's
/// integrity limit (RFC 9001 §6.6), the lowest of the ciphers'.
pub const MAX_AUTH_FAILURES: u64 = 1 << 36;

/// The most a key file may hold: its one line, with room for white space around it. A larger
/// file (a wrong path, `/dev/zero`) is not read to its end.
pub const KEY_FILE_MAX: usize = 1024;

/// The key a cluster shares. Its bytes are wiped from memory when it is dropped, and they
/// stay where they were made: a `Key` holds them behind a pointer, so moving a key (or a
/// configuration or connection that holds one) copies the pointer, never the bytes, which no
/// drop would wipe.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(Box<Zeroizing<[u8; KEY_LEN]>>);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)")
    }
}

/// Why a key could not be made or read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The text is not a key.
    #[error("not a ri2n key: expected one line `{KEY_TEXT_PREFIX}` followed by 64 hexadecimal digits (made by `ri2n keygen`)")]
    Malformed,
    /// The operating system gave no random numbers.
    #[error("the system's random number generator failed")]
    Random,
}

/// Why a key file could not be read ([`Key::read_from`]).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum KeyReadError {
    /// Reading failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// What was read is not a key (or is more than [`KEY_FILE_MAX`] bytes).
    #[error(transparent)]
    Key(#[from] KeyError),
}

impl Key {
    /// A new random key from the operating system's random source.
    pub fn generate() -> Result<Key, KeyError> {
        let mut key = Key::zeros();
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key.0[..])
            .map_err(|_| KeyError::Random)?;
        Ok(key)
    }

    /// The key with these bytes (the caller's copy is the caller's to wipe).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Key {
        let mut key = Key::zeros();
        key.0.copy_from_slice(&bytes);
        key
    }

    /// A key of zeros, to fill where it lies.
    fn zeros() -> Key {
        Key(Box::new(Zeroizing::new([0u8; KEY_LEN])))
    }

    /// Reads a key from its text form (a key file's content; surrounding white space is
    /// ignored).
    pub fn from_text(text: &str) -> Result<Key, KeyError> {
        let hex = text
            .trim()
            .strip_prefix(KEY_TEXT_PREFIX)
            .ok_or(KeyError::Malformed)?
            .as_bytes();
        if hex.len() != 2 * KEY_LEN {
            return Err(KeyError::Malformed);
        }
        let digit = |c: u8| (c as char).to_digit(16).ok_or(KeyError::Malformed);
        let mut key = Key::zeros();
        for (i, pair) in hex.chunks(2).enumerate() {
            key.0[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
        }
        Ok(key)
    }

    /// Reads a key file's content from `reader` into memory that is wiped afterwards, unlike a
    /// `String` from `read_to_string`, which leaves copies of the key behind as it grows and
    /// when it is dropped. At most [`KEY_FILE_MAX`] bytes are read: more is no key file.
    pub fn read_from(mut reader: impl Read) -> Result<Key, KeyReadError> {
        let mut buf = Zeroizing::new([0u8; KEY_FILE_MAX + 1]);
        let mut len = 0;
        loop {
            if len == buf.len() {
                return Err(KeyError::Malformed.into());
            }
            match reader.read(&mut buf[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        let text = std::str::from_utf8(&buf[..len]).map_err(|_| KeyError::Malformed)?;
        Ok(Key::from_text(text)?)
    }

    /// The text form: one line (without the newline), `ri2n-key-v1:` and 64 hex digits. It
    /// has room for the newline a caller writing a key file adds: a string that grew would
    /// move, and leave the old copy of the key behind unwiped.
    pub fn to_text(&self) -> Zeroizing<String> {
        let mut s = Zeroizing::new(String::with_capacity(
            KEY_TEXT_PREFIX.len() + 2 * KEY_LEN + 1,
        ));
        s.push_str(KEY_TEXT_PREFIX);
        for b in self.0.iter() {
            s.push(char::from_digit(u32::from(b >> 4), 16).unwrap());
            s.push(char::from_digit(u32::from(b & 15), 16).unwrap());
        }
        s
    }

    /// The token that authenticates a RESET of `kind` for connection ID `cid` sent from
    /// address `from` to address `to`: keyed BLAKE2s-128 over the kind's label, the ID and
    /// both addresses. Every holder of the key can make it (a restarted host must), nobody
    /// else can; and since it names the addresses, only an endpoint at `from` answering a
    /// packet from `to` makes the token a connection between those addresses accepts
    /// (docs/PROTOCOL.md §9.6, §11).
    pub(crate) fn reset_token(
        &self,
        kind: ResetKind,
        cid: u64,
        from: SocketAddr,
        to: SocketAddr,
    ) -> [u8; RESET_TOKEN_LEN] {
        self.reset_mac(kind, cid, from, to)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `token` is the token of a RESET of `kind` for `cid` from `from` to `to`
    /// (compared in constant time).
    pub(crate) fn reset_token_valid(
        &self,
        kind: ResetKind,
        cid: u64,
        from: SocketAddr,
        to: SocketAddr,
        token: &[u8],
    ) -> bool {
        self.reset_mac(kind, cid, from, to)
            .verify_slice(token)
            .is_ok()
    }

    fn reset_mac(
        &self,
        kind: ResetKind,
        cid: u64,
        from: SocketAddr,
        to: SocketAddr,
    ) -> blake2::Blake2sMac<U16> {
        let mut mac = blake2::Blake2sMac::<U16>::new_from_slice(&self.0[..]).expect("32-byte key");
        let label = match kind {
            ResetKind::Unknown => RESET_LABEL,
            ResetKind::Refusal => REFUSAL_LABEL,
        };
        Update::update(&mut mac, label);
        Update::update(&mut mac, &cid.to_be_bytes());
        for a in [from, to] {
            let mut buf = [0u8; 19];
            let mut w = crate::wire::Writer::new(&mut buf);
            crate::wire::write_addr(&mut w, &a);
            let len = w.finish();
            Update::update(&mut mac, &buf[..len]);
        }
        mac
    }
}

// ---------------------------------------------------------------------------------------------
// The handshake

/// The two secrets a handshake ends with, one per direction.
pub(crate) struct SessionSecrets {
    pub client_to_server: Zeroizing<[u8; KEY_LEN]>,
    pub server_to_client: Zeroizing<[u8; KEY_LEN]>,
}

/// The handshake failed: the peer holds another key, or the message was forged or damaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandshakeFailed;

fn noise_builder<'a>(key: &'a Key, prologue: &'a [u8]) -> snow::Builder<'a> {
    let params = NOISE_PARAMS.parse().expect("valid Noise parameters");
    snow::Builder::with_resolver(params, Box::new(WipingResolver))
        .psk(0, &key.0)
        .and_then(|b| b.prologue(prologue))
        .expect("psk and prologue accepted")
}

/// snow's own primitives keep their secrets (ephemeral private keys, cipher keys) without
/// wiping them when dropped: this resolver hands snow the same primitives wrapped so that they
/// overwrite their keys first. (The chaining key, hash and PSK copy snow keeps inline are wiped
/// with the whole state, by [`NoiseState`].)
struct WipingResolver;

impl snow::resolvers::CryptoResolver for WipingResolver {
    fn resolve_rng(&self) -> Option<Box<dyn snow::types::Random>> {
        snow::resolvers::DefaultResolver.resolve_rng()
    }

    fn resolve_dh(&self, choice: &snow::params::DHChoice) -> Option<Box<dyn snow::types::Dh>> {
        let dh = snow::resolvers::DefaultResolver.resolve_dh(choice)?;
        Some(Box::new(WipedDh(dh)))
    }

    fn resolve_hash(
        &self,
        choice: &snow::params::HashChoice,
    ) -> Option<Box<dyn snow::types::Hash>> {
        snow::resolvers::DefaultResolver.resolve_hash(choice)
    }

    fn resolve_cipher(
        &self,
        choice: &snow::params::CipherChoice,
    ) -> Option<Box<dyn snow::types::Cipher>> {
        let cipher = snow::resolvers::DefaultResolver.resolve_cipher(choice)?;
        Some(Box::new(WipedCipher(cipher)))
    }
}

/// A Diffie-Hellman key pair whose private key is overwritten when dropped.
struct WipedDh(Box<dyn snow::types::Dh>);

impl Drop for WipedDh {
    fn drop(&mut self) {
        // (`set` also derives the public key, a scalar multiplication: skipped for a key pair
        // that never held a key, such as the unused static one of an NN handshake)
        if self.0.privkey().iter().any(|&b| b != 0) {
            let zeros = [0u8; 32];
            self.0.set(&zeros[..self.0.priv_len().min(32)]);
        }
    }
}

impl snow::types::Dh for WipedDh {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn pub_len(&self) -> usize {
        self.0.pub_len()
    }
    fn priv_len(&self) -> usize {
        self.0.priv_len()
    }
    fn set(&mut self, privkey: &[u8]) {
        self.0.set(privkey)
    }
    fn generate(&mut self, rng: &mut dyn snow::types::Random) -> Result<(), snow::Error> {
        self.0.generate(rng)
    }
    fn pubkey(&self) -> &[u8] {
        self.0.pubkey()
    }
    fn privkey(&self) -> &[u8] {
        self.0.privkey()
    }
    fn dh(&self, pubkey: &[u8], out: &mut [u8]) -> Result<(), snow::Error> {
        self.0.dh(pubkey, out)
    }
    fn dh_len(&self) -> usize {
        self.0.dh_len()
    }
}

/// A handshake cipher whose key is overwritten when dropped.
struct WipedCipher(Box<dyn snow::types::Cipher>);

impl Drop for WipedCipher {
    fn drop(&mut self) {
        self.0.set(&[0u8; 32]);
    }
}

impl snow::types::Cipher for WipedCipher {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn set(&mut self, key: &[u8; 32]) {
        self.0.set(key)
    }
    fn encrypt(&self, nonce: u64, authtext: &[u8], plaintext: &[u8], out: &mut [u8]) -> usize {
        self.0.encrypt(nonce, authtext, plaintext, out)
    }
    fn decrypt(
        &self,
        nonce: u64,
        authtext: &[u8],
        ciphertext: &[u8],
        out: &mut [u8],
    ) -> Result<usize, snow::Error> {
        self.0.decrypt(nonce, authtext, ciphertext, out)
    }
    fn rekey(&mut self) {
        self.0.rekey()
    }
}

/// A Noise handshake state whose memory is overwritten when dropped: snow keeps the chaining
/// key, the handshake hash and a copy of the pre-shared key inline, and does not wipe them.
struct NoiseState(Box<MaybeUninit<snow::HandshakeState>>);

impl NoiseState {
    fn new(state: snow::HandshakeState) -> Self {
        NoiseState(Box::new(MaybeUninit::new(state)))
    }
}

impl std::ops::Deref for NoiseState {
    type Target = snow::HandshakeState;
    fn deref(&self) -> &snow::HandshakeState {
        // SAFETY: initialised in `new`, dropped only in `drop`.
        unsafe { self.0.assume_init_ref() }
    }
}

impl std::ops::DerefMut for NoiseState {
    fn deref_mut(&mut self) -> &mut snow::HandshakeState {
        // SAFETY: as above.
        unsafe { self.0.assume_init_mut() }
    }
}

impl Drop for NoiseState {
    fn drop(&mut self) {
        // SAFETY: the state is initialised and dropped here once (its boxed primitives wipe
        // their own keys); then its now unused bytes, which `MaybeUninit` lets hold anything,
        // are overwritten before the box frees them.
        unsafe {
            self.0.assume_init_drop();
            zeroize::zeroize_flat_type(&mut *self.0 as *mut MaybeUninit<snow::HandshakeState>);
        }
    }
}

/// The prologue binds the handshake to the client's connection ID and to the cookie the
/// server issued for the client's address: a first message made for one cookie authenticates
/// under no other (docs/PROTOCOL.md §9.2).
fn prologue(client_cid: u64, cookie: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(PROLOGUE_LABEL.len() + 8 + cookie.len());
    p.extend_from_slice(PROLOGUE_LABEL);
    p.extend_from_slice(&client_cid.to_be_bytes());
    p.extend_from_slice(cookie);
    p
}

fn split(noise: &mut NoiseState) -> SessionSecrets {
    let (c2s, s2c) = noise.dangerously_get_raw_split();
    let secrets = SessionSecrets {
        client_to_server: Zeroizing::new(c2s),
        server_to_client: Zeroizing::new(s2c),
    };
    let (mut c2s, mut s2c) = (c2s, s2c);
    c2s.zeroize();
    s2c.zeroize();
    secrets
}

/// A client's half-done handshake: it sent the first message and waits for the second.
pub(crate) struct ClientHandshake(NoiseState);

impl fmt::Debug for ClientHandshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientHandshake(..)")
    }
}

impl ClientHandshake {
    /// Starts the handshake of connection `client_cid` with the server's retry `cookie`: the
    /// first message, carrying `payload` (encrypted and authenticated under the pre-shared
    /// key).
    pub fn start(
        key: &Key,
        client_cid: u64,
        cookie: &[u8],
        payload: &[u8],
    ) -> (ClientHandshake, Vec<u8>) {
        let prologue = prologue(client_cid, cookie);
        let mut noise = NoiseState::new(
            noise_builder(key, &prologue)
                .build_initiator()
                .expect("initiator"),
        );
        let mut msg = vec![0u8; payload.len() + HANDSHAKE_OVERHEAD];
        let len = noise.write_message(payload, &mut msg).expect("room");
        msg.truncate(len);
        (ClientHandshake(noise), msg)
    }

    /// Reads the server's answer: its payload and the session secrets. A message that fails
    /// (forged) leaves the handshake as it was, so the real answer can still be read.
    pub fn finish(&mut self, msg: &[u8]) -> Result<(Vec<u8>, SessionSecrets), HandshakeFailed> {
        let mut payload = vec![0u8; msg.len()];
        let len = self
            .0
            .read_message(msg, &mut payload)
            .map_err(|_| HandshakeFailed)?;
        payload.truncate(len);
        Ok((payload, split(&mut self.0)))
    }
}

/// The server's side of a handshake, between reading the client's message and answering.
pub(crate) struct ServerHandshake(NoiseState);

impl ServerHandshake {
    /// Reads the client's first message: its payload. Fails, having done no Diffie-Hellman,
    /// when the message was not made with the same key, or for another connection ID or
    /// cookie (a replay).
    pub fn read(
        key: &Key,
        client_cid: u64,
        cookie: &[u8],
        msg: &[u8],
    ) -> Result<(ServerHandshake, Vec<u8>), HandshakeFailed> {
        let prologue = prologue(client_cid, cookie);
        let mut noise = NoiseState::new(
            noise_builder(key, &prologue)
                .build_responder()
                .expect("responder"),
        );
        let mut payload = vec![0u8; msg.len()];
        let len = noise
            .read_message(msg, &mut payload)
            .map_err(|_| HandshakeFailed)?;
        payload.truncate(len);
        Ok((ServerHandshake(noise), payload))
    }

    /// The answer carrying `payload`, and the session secrets.
    pub fn answer(mut self, payload: &[u8]) -> (Vec<u8>, SessionSecrets) {
        let mut out = vec![0u8; payload.len() + HANDSHAKE_OVERHEAD];
        let len = self.0.write_message(payload, &mut out).expect("room");
        out.truncate(len);
        (out, split(&mut self.0))
    }
}

// ---------------------------------------------------------------------------------------------
// Packet protection

/// One packet key. Shared (`Arc`) with the [`Seal`]s and [`Opener`]s that use it outside the
/// engine: it is wiped when the last of them is gone.
pub(crate) struct PacketKey {
    aead: AeadKey,
    /// Unique among the keys of this process, never reused: an [`Opened`] proof names its
    /// key by it rather than by holding the key, because a count that every receiving
    /// thread changed per packet would move its cache line between their cores each time.
    id: u64,
    /// Set once the receiving side moved past it (it is kept, as the previous key, for late
    /// packets): an [`Opener`] holding it leaves packets of its phase to the engine, which
    /// may have to try the next key on them. Opened ahead with this one, a packet under the
    /// next key of that phase would fail and be left damaged for the engine's try.
    retired: AtomicBool,
}

impl PacketKey {
    fn new(cipher: Cipher, secret: &[u8; KEY_LEN]) -> Arc<PacketKey> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Arc::new(PacketKey {
            aead: AeadKey::new(cipher, secret),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            retired: AtomicBool::new(false),
        })
    }
}

/// The sealing of one packet the engine built, to be done later by the driver (see
/// [`TransmitBuffer::seals_later`](crate::TransmitBuffer::seals_later)): outside the engine's
/// lock, on the thread that sends, while the engine goes on with other work. The engine
/// already counted the packet against its key; the seal holds that key, so a key update in
/// between changes nothing.
pub struct Seal {
    key: Arc<PacketKey>,
    link: LinkId,
    pn: u64,
    header_len: usize,
}

impl Seal {
    /// Seals `packet` in place: the datagram exactly as the engine built it (header, payload
    /// and [`TAG_LEN`] bytes of room at its end).
    pub fn apply(&self, packet: &mut [u8]) {
        seal_with(&self.key, self.link, self.pn, self.header_len, packet);
    }
}

impl fmt::Debug for Seal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Seal")
            .field("link", &self.link)
            .field("pn", &self.pn)
            .finish_non_exhaustive()
    }
}

/// Opens a connection's packets outside the engine, so that a driver can open what it
/// received before it takes the engine's lock ([`Endpoint::opener`](crate::Endpoint::opener)).
/// It holds the connection's receiving key of the moment without keeping it alive: once the
/// engine drops that key (the peer's second update after it, or the connection's end) the
/// opener opens nothing, and the packets go the engine's own way.
#[derive(Clone)]
pub struct Opener {
    cid: u64,
    /// The key phase and key; none for a connection without a key (nothing to open).
    key: Option<(u8, Weak<PacketKey>)>,
}

impl Opener {
    pub(crate) fn new(cid: u64, key: Option<(u8, Weak<PacketKey>)>) -> Opener {
        Opener { cid, key }
    }

    /// Whether the connection's packets are sealed (an opener of an unkeyed connection opens
    /// nothing, and says so, so a driver need not ask the engine again).
    pub fn is_keyed(&self) -> bool {
        self.key.is_some()
    }

    /// Opens `datagram` in place if it is a short packet of this connection in this key's
    /// phase, and returns the proof for
    /// [`Endpoint::handle_opened_datagram`](crate::Endpoint::handle_opened_datagram). `None`:
    /// left unopened and unchanged (another connection, another phase, a key already
    /// dropped), or it failed to open: then its payload is damaged, and the engine rejects it
    /// as it would any packet that fails to open.
    pub fn open(&self, datagram: &mut [u8]) -> Option<Opened> {
        self.open_with(self.key_now()?.as_ref(), datagram)
    }

    /// The key, while the engine still keeps it. Holding it keeps it alive: hold it for a
    /// batch of packets, not longer.
    pub(crate) fn key_now(&self) -> Option<Arc<PacketKey>> {
        self.key.as_ref()?.1.upgrade()
    }

    /// [`Self::open`] with the key [`Self::key_now`] gave.
    pub(crate) fn open_with(&self, key: &PacketKey, datagram: &mut [u8]) -> Option<Opened> {
        let (phase, _) = self.key.as_ref()?;
        let Ok((
            wire::Header::Short {
                dcid,
                link,
                pn,
                phase: p,
            },
            rest,
        )) = wire::decode_packet(datagram)
        else {
            return None;
        };
        if dcid != self.cid || p != *phase || key.retired.load(Ordering::Relaxed) {
            return None;
        }
        let header_len = datagram.len() - rest.len();
        let (header, body) = datagram.split_at_mut(header_len);
        let len = open_with(key, link, pn, header, body).ok()?;
        Some(Opened {
            dcid,
            link,
            pn,
            len,
            key: key.id,
        })
    }
}

impl fmt::Debug for Opener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opener")
            .field("cid", &format_args!("{:#x}", self.cid))
            .field("keyed", &self.is_keyed())
            .finish()
    }
}

/// Proof that an [`Opener`] opened one packet: which one, how long its plaintext is, and
/// under which key. The engine accepts it only for that packet and while that key is still
/// one it would open the packet with.
pub struct Opened {
    dcid: u64,
    link: LinkId,
    pn: u64,
    len: usize,
    /// The [`PacketKey::id`] of the key that opened it.
    key: u64,
}

impl Opened {
    /// Whether this proof is for the packet with these header fields.
    pub(crate) fn is_for(&self, dcid: u64, link: LinkId, pn: u64) -> bool {
        (self.dcid, self.link, self.pn) == (dcid, link, pn)
    }

    /// The plaintext's length (what follows the header, tag removed).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The key that opened it ([`PacketKey::id`]).
    pub(crate) fn key(&self) -> u64 {
        self.key
    }
}

impl fmt::Debug for Opened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opened")
            .field("link", &self.link)
            .field("pn", &self.pn)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// The nonce of packet `pn` on link `link`: unique for the life of a key, since packet numbers
/// never repeat on a link in one direction.
fn nonce(link: LinkId, pn: u64) -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    n[3] = link.0;
    n[4..].copy_from_slice(&pn.to_be_bytes());
    n
}

/// Noise's `REKEY`: the first 32 bytes of ChaCha20-Poly1305 encrypting 32 zeros under the
/// nonce 2^64 − 1. One-way: an old key cannot be computed from a new one.
fn next_secret(secret: &[u8; KEY_LEN]) -> Zeroizing<[u8; KEY_LEN]> {
    let key = AeadKey::new(Cipher::ChaCha20Poly1305, secret);
    // Noise's ChaChaPoly nonce: 32 zero bits, then the 64-bit counter little-endian
    let mut n = [0u8; NONCE_LEN];
    n[4..].copy_from_slice(&u64::MAX.to_le_bytes());
    let mut out = Zeroizing::new([0u8; KEY_LEN]);
    // the tag is not part of the new key
    let _tag = key.seal(n, &[], &mut out[..]);
    drop(key); // wiped
    out
}

/// A sealed packet failed to open: forged, damaged, replayed under another key, or too old.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpenFailed;

/// The keys of one connection, both directions, with their updates.
pub(crate) struct PacketProtection {
    cipher: Cipher,
    send: SendKeys,
    recv: RecvKeys,
    /// Packets that failed to open.
    pub auth_failures: u64,
    /// Packets opened outside the engine and accepted ([`Self::accept_opened`]).
    pub opened_ahead: u64,
}

impl fmt::Debug for PacketProtection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacketProtection")
            .field("cipher", &self.cipher)
            .field("send_generation", &self.send.generation)
            .field("recv_generation", &self.recv.generation)
            .finish()
    }
}

struct SendKeys {
    secret: Zeroizing<[u8; KEY_LEN]>,
    key: Arc<PacketKey>,
    generation: u64,
    /// Packets sealed with this key.
    sealed: u64,
    since: Instant,
    /// First packet number sealed with this key on each link: an acknowledgement at or above
    /// it proves the peer opened packets of this generation.
    first_pn: [Option<u64>; MAX_LINKS],
    /// The peer acknowledged a packet of this generation, so it holds this key and may drop
    /// the one before: only then may the next update come (the peer keeps just one old key).
    confirmed: bool,
}

struct RecvKeys {
    generation: u64,
    current: Arc<PacketKey>,
    /// The key of the generation before, for packets still on their way (dropped at the
    /// next update).
    previous: Option<Arc<PacketKey>>,
    next_secret: Zeroizing<[u8; KEY_LEN]>,
    next: Arc<PacketKey>,
}

impl PacketProtection {
    /// Protection from a finished handshake, on the client side or the server's.
    pub fn new(cipher: Cipher, secrets: SessionSecrets, is_client: bool, now: Instant) -> Self {
        let (send, recv) = if is_client {
            (secrets.client_to_server, secrets.server_to_client)
        } else {
            (secrets.server_to_client, secrets.client_to_server)
        };
        let next_secret = next_secret(&recv);
        PacketProtection {
            cipher,
            send: SendKeys {
                key: PacketKey::new(cipher, &send),
                secret: send,
                generation: 0,
                sealed: 0,
                since: now,
                first_pn: [None; MAX_LINKS],
                confirmed: false,
            },
            recv: RecvKeys {
                generation: 0,
                current: PacketKey::new(cipher, &recv),
                previous: None,
                next: PacketKey::new(cipher, &next_secret),
                next_secret,
            },
            auth_failures: 0,
            opened_ahead: 0,
        }
    }

    /// The cipher in use.
    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// The key phase (0 or 1) packets are sealed with now.
    pub fn send_phase(&self) -> u8 {
        (self.send.generation & 1) as u8
    }

    /// Moves the sending direction to its next key when the current one has sealed enough
    /// packets or lived long enough, and the peer has shown it holds it.
    pub fn update_if_due(&mut self, now: Instant) {
        let s = &mut self.send;
        let due = s.sealed >= REKEY_AFTER_PACKETS
            || now.saturating_duration_since(s.since) >= REKEY_AFTER_TIME;
        if !(due && s.confirmed) {
            return;
        }
        let secret = next_secret(&s.secret);
        s.key = PacketKey::new(self.cipher, &secret);
        s.secret = secret;
        s.generation += 1;
        s.sealed = 0;
        s.since = now;
        s.first_pn = [None; MAX_LINKS];
        s.confirmed = false;
        tracing::debug!(generation = s.generation, "sending key updated");
    }

    /// Seals a packet in place: `packet` holds the header (`header_len` bytes), the payload,
    /// and [`TAG_LEN`] bytes of room at its end for the tag.
    pub fn seal(&mut self, link: LinkId, pn: u64, header_len: usize, packet: &mut [u8]) {
        self.seal_later(link, pn, header_len).apply(packet);
    }

    /// Counts a packet against the sending key and hands out its sealing, to be applied to
    /// the packet before it leaves.
    pub fn seal_later(&mut self, link: LinkId, pn: u64, header_len: usize) -> Seal {
        let s = &mut self.send;
        if let Some(first) = s.first_pn.get_mut(usize::from(link.0)) {
            first.get_or_insert(pn);
        }
        s.sealed += 1;
        Seal {
            key: s.key.clone(),
            link,
            pn,
            header_len,
        }
    }

    /// The current receiving key and its phase, for an [`Opener`].
    pub fn opening_key(&self) -> (u8, Weak<PacketKey>) {
        let r = &self.recv;
        ((r.generation & 1) as u8, Arc::downgrade(&r.current))
    }

    /// Whether a packet of key phase `phase` that `key` opened outside is taken: only if this
    /// side would have opened it with that very key (the current key for the current phase,
    /// the previous one for the other; only the engine moves to the next key, so a packet
    /// under that one is never opened outside).
    pub fn accept_opened(&mut self, phase: u8, key: u64) -> bool {
        let r = &self.recv;
        let accepted = if phase == (r.generation & 1) as u8 {
            r.current.id == key
        } else {
            r.previous.as_ref().is_some_and(|p| p.id == key)
        };
        self.opened_ahead += u64::from(accepted);
        accepted
    }

    /// Opens a sealed packet in place (`body` is everything after the header, tag included);
    /// returns the plaintext's length. A packet of the other key phase is tried with the next
    /// key (the peer updated; on success this side follows) and then the previous one (a late
    /// packet from before the last update).
    pub fn open(
        &mut self,
        link: LinkId,
        pn: u64,
        phase: u8,
        header: &[u8],
        body: &mut [u8],
    ) -> Result<usize, OpenFailed> {
        let r = &mut self.recv;
        let result = if phase == (r.generation & 1) as u8 {
            open_with(&r.current, link, pn, header, body)
        } else {
            // a failed open leaves `body` unspecified: keep the original for the second try
            // (the other phase is rare: a key update, or a late packet from before one)
            let original = r.previous.is_some().then(|| body.to_vec());
            match open_with(&r.next, link, pn, header, body) {
                Ok(len) => {
                    let following = next_secret(&r.next_secret);
                    let next = PacketKey::new(self.cipher, &following);
                    let current = std::mem::replace(&mut r.next, next);
                    r.current.retired.store(true, Ordering::Relaxed);
                    r.previous = Some(std::mem::replace(&mut r.current, current));
                    r.next_secret = following;
                    r.generation += 1;
                    tracing::debug!(generation = r.generation, "receiving key updated");
                    Ok(len)
                }
                Err(_) => match (&r.previous, original) {
                    (Some(prev), Some(original)) => {
                        body.copy_from_slice(&original);
                        open_with(prev, link, pn, header, body)
                    }
                    _ => Err(OpenFailed),
                },
            }
        };
        if result.is_err() {
            self.auth_failures += 1;
        }
        result
    }

    /// The peer acknowledged packets up to `largest` on link `link`.
    pub fn on_acked(&mut self, link: LinkId, largest: u64) {
        let s = &mut self.send;
        if let Some(Some(first)) = s.first_pn.get(usize::from(link.0)) {
            if largest >= *first {
                s.confirmed = true;
            }
        }
    }

    /// Key generations so far (sending, receiving).
    pub fn generations(&self) -> (u64, u64) {
        (self.send.generation, self.recv.generation)
    }

    #[cfg(test)]
    fn force_update(&mut self, now: Instant) {
        self.send.sealed = REKEY_AFTER_PACKETS;
        self.update_if_due(now);
    }
}

fn seal_with(key: &PacketKey, link: LinkId, pn: u64, header_len: usize, packet: &mut [u8]) {
    let (header, rest) = packet.split_at_mut(header_len);
    let (payload, tag_room) = rest.split_at_mut(rest.len() - TAG_LEN);
    let tag = key.aead.seal(nonce(link, pn), header, payload);
    tag_room.copy_from_slice(&tag);
}

fn open_with(
    key: &PacketKey,
    link: LinkId,
    pn: u64,
    header: &[u8],
    body: &mut [u8],
) -> Result<usize, OpenFailed> {
    key.aead
        .open(nonce(link, pn), header, body)
        .map(|plain| plain.len())
        .map_err(|_| OpenFailed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> Key {
        Key::from_bytes([b; KEY_LEN])
    }

    /// A key is a pointer to its bytes: what holds a key can move (a connection into a map,
    /// a configuration into a thread) without leaving a copy of the bytes behind, which no
    /// drop would wipe. The bytes stay where they are while the key moves.
    #[test]
    fn a_key_moves_without_its_bytes() {
        assert_eq!(std::mem::size_of::<Key>(), std::mem::size_of::<usize>());
        let k = key(7);
        let at = k.0.as_ptr();
        let moved = [k];
        assert_eq!(moved[0].0.as_ptr(), at);
        assert_eq!(moved[0], key(7));
    }

    #[test]
    fn key_text_round_trip_and_errors() {
        let k = Key::generate().unwrap();
        let text = k.to_text();
        assert_eq!(text.len(), 12 + 64);
        assert!(text.starts_with("ri2n-key-v1:"));
        assert_eq!(Key::from_text(&format!("  {}\n", *text)).unwrap(), k);
        assert_ne!(Key::generate().unwrap(), k);
        for bad in [
            "",
            "ri2n-key-v1:",
            &text[..text.len() - 1],
            &format!("{}0", *text),
            &text.replace("ri2n-key-v1", "ri2n-key-v2"),
            &format!("ri2n-key-v1:{}", "g".repeat(64)),
            &format!("ri2n-key-v1:{}", "é".repeat(32)),
        ] {
            assert_eq!(Key::from_text(bad), Err(KeyError::Malformed), "{bad:?}");
        }
        assert_eq!(format!("{k:?}"), "Key(..)");
        // room for a key file's newline, so adding one leaves no copy behind
        let mut line = k.to_text();
        let (at, room) = (line.as_ptr(), line.capacity());
        line.push('\n');
        assert!(
            room > line.len() - 1 && line.as_ptr() == at,
            "the line moved"
        );
    }

    /// A key file is read whole up to its limit; beyond it, or not text, it is no key, and
    /// a reader's failure is told apart from a bad key.
    #[test]
    fn a_key_file_is_read_within_its_limit() {
        let k = Key::generate().unwrap();
        let line = format!("{}\n", *k.to_text());
        assert_eq!(Key::read_from(line.as_bytes()).unwrap(), k);
        // white space up to the limit is still a key file
        let padded = format!("{line}{}", " ".repeat(KEY_FILE_MAX - line.len()));
        assert_eq!(Key::read_from(padded.as_bytes()).unwrap(), k);
        let over = format!("{padded} ");
        let endless = std::io::repeat(0);
        for bad in [Key::read_from(over.as_bytes()), Key::read_from(endless)] {
            assert!(
                matches!(bad, Err(KeyReadError::Key(KeyError::Malformed))),
                "{bad:?}"
            );
        }
        let not_text = [0xffu8; 80];
        assert!(matches!(
            Key::read_from(&not_text[..]),
            Err(KeyReadError::Key(KeyError::Malformed))
        ));
        struct Failing;
        impl Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::PermissionDenied.into())
            }
        }
        let failed = Key::read_from(Failing);
        assert!(
            matches!(&failed, Err(KeyReadError::Io(e)) if e.kind() == std::io::ErrorKind::PermissionDenied),
            "{failed:?}"
        );
    }

    /// Test vectors of docs/PROTOCOL.md §9.
    #[test]
    fn vectors() {
        let k = Key::from_text(
            "ri2n-key-v1:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
        )
        .unwrap();
        // from 10.0.1.2:7000 to 10.0.1.1:40000
        let (from, to) = (
            "10.0.1.2:7000".parse().unwrap(),
            "10.0.1.1:40000".parse().unwrap(),
        );
        assert_eq!(
            hex(&k.reset_token(ResetKind::Unknown, 0x0123_4567_89ab_cdef, from, to)),
            "e24ed4b275228d37113b41a836d85c0f"
        );
        assert_eq!(
            hex(&k.reset_token(ResetKind::Refusal, 0x0123_4567_89ab_cdef, from, to)),
            "d342b965de8ddcb729f7e1c3b4b3d996"
        );
        let next = next_secret(&[0u8; KEY_LEN]);
        assert_eq!(
            hex(&next[..]),
            "25ce5d37df19f3783185f2ffd5ab17fa3397c212f02d62fb1733e0b875b74c58"
        );
        let secret: [u8; KEY_LEN] = std::array::from_fn(|i| 0x20 + i as u8);
        assert_eq!(
            hex(&next_secret(&secret)[..]),
            "f7168a9facedd560bd68eebc0fb55530936c665a6d714ff25842fd538bb1e943"
        );
        // a SHORT packet (DCID 0x0123456789abcdef, link 1, packet number 5) carrying PING and
        // three PADDING bytes, sealed with traffic secret 0x20..0x3f
        for (cipher, sealed) in [
            (
                Cipher::Aegis256X4,
                "05010123456789abcdef01051668212b7735036cce022186970fa31bb9876094",
            ),
            (
                Cipher::Aes256Gcm,
                "05010123456789abcdef01055b99c95677f2b364db64f67d0eae797f369d0371",
            ),
            (
                Cipher::ChaCha20Poly1305,
                "05010123456789abcdef010584fd83e341347222fa1fbed9582378ea4b3c33b7",
            ),
        ] {
            let secrets = SessionSecrets {
                client_to_server: Zeroizing::new(secret),
                server_to_client: Zeroizing::new(secret),
            };
            let mut p = PacketProtection::new(cipher, secrets, true, Instant::now());
            let mut packet = b"\x05\x01\x01\x23\x45\x67\x89\xab\xcd\xef\x01\x05".to_vec();
            packet.extend_from_slice(&[1, 0, 0, 0]);
            packet.extend_from_slice(&[0; TAG_LEN]);
            p.seal(LinkId(1), 5, 12, &mut packet);
            assert_eq!(hex(&packet), sealed, "{cipher:?}");
        }
    }

    /// A RESET token names its two addresses: the one a victim computes when provoked from
    /// an attacker's address (or sends from its own) is worth nothing between other addresses.
    #[test]
    fn reset_tokens_are_bound_to_their_addresses() {
        let k = key(1);
        let a: SocketAddr = "10.0.1.1:40000".parse().unwrap();
        let b: SocketAddr = "10.0.1.2:7000".parse().unwrap();
        let m: SocketAddr = "10.0.9.9:7000".parse().unwrap();
        let unknown = ResetKind::Unknown;
        let t = k.reset_token(unknown, 5, b, a);
        assert!(k.reset_token_valid(unknown, 5, b, a, &t));
        for (cid, from, to) in [(6, b, a), (5, a, b), (5, a, m), (5, m, a), (5, b, m)] {
            assert!(
                !k.reset_token_valid(unknown, cid, from, to, &t),
                "{cid} {from} {to}"
            );
        }
        let port: SocketAddr = "10.0.1.2:7001".parse().unwrap();
        assert!(!k.reset_token_valid(unknown, 5, port, a, &t));
        assert!(!key(2).reset_token_valid(unknown, 5, b, a, &t));
        // nor is one kind's token the other's
        assert!(!k.reset_token_valid(ResetKind::Refusal, 5, b, a, &t));
        let refusal = k.reset_token(ResetKind::Refusal, 5, b, a);
        assert!(!k.reset_token_valid(unknown, 5, b, a, &refusal));
    }

    /// Noise's REKEY, computed by an independent ChaCha20-Poly1305 implementation.
    #[test]
    fn rekey_is_noise_rekey() {
        use chacha20poly1305::aead::{Aead, KeyInit};
        let secret = [7u8; KEY_LEN];
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&u64::MAX.to_le_bytes());
        let c = chacha20poly1305::ChaCha20Poly1305::new_from_slice(&secret).unwrap();
        let expected = c.encrypt((&n).into(), &[0u8; KEY_LEN][..]).unwrap();
        assert_eq!(&next_secret(&secret)[..], &expected[..KEY_LEN]);
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn handshake(
        client_key: &Key,
        server_key: &Key,
    ) -> Option<(PacketProtection, PacketProtection)> {
        let now = Instant::now();
        let (mut hs, msg1) = ClientHandshake::start(client_key, 7, b"cookie", b"client params");
        let (server, payload) = ServerHandshake::read(server_key, 7, b"cookie", &msg1).ok()?;
        assert_eq!(payload, b"client params");
        let (msg2, s_secrets) = server.answer(b"server params");
        // a damaged (or forged) answer first: it fails, and the real one still succeeds
        let mut bad = msg2.clone();
        bad[40] ^= 1;
        assert!(hs.finish(&bad).is_err());
        let (payload, c_secrets) = hs.finish(&msg2).ok()?;
        assert_eq!(payload, b"server params");
        Some((
            PacketProtection::new(Cipher::Aegis256X4, c_secrets, true, now),
            PacketProtection::new(Cipher::Aegis256X4, s_secrets, false, now),
        ))
    }

    fn sealed(p: &mut PacketProtection, link: u8, pn: u64, body: &[u8]) -> Vec<u8> {
        let mut packet = b"HEADER".to_vec();
        packet.extend_from_slice(body);
        packet.extend_from_slice(&[0; TAG_LEN]);
        p.seal(LinkId(link), pn, 6, &mut packet);
        packet
    }

    fn opened(
        p: &mut PacketProtection,
        phase: u8,
        link: u8,
        pn: u64,
        packet: &[u8],
    ) -> Option<Vec<u8>> {
        let mut packet = packet.to_vec();
        let (header, body) = packet.split_at_mut(6);
        let len = p.open(LinkId(link), pn, phase, header, body).ok()?;
        Some(body[..len].to_vec())
    }

    #[test]
    fn sealed_packets_open_only_unchanged_and_in_place() {
        let (mut c, mut s) = handshake(&key(1), &key(1)).unwrap();
        let p = sealed(&mut c, 2, 40, b"secret data");
        assert!(
            !p.windows(6).any(|w| w == b"secret"),
            "plaintext on the wire"
        );
        assert_eq!(opened(&mut s, 0, 2, 40, &p).unwrap(), b"secret data");
        // any flipped bit, in header, body or tag
        for bit in 0..p.len() * 8 {
            let mut q = p.clone();
            q[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(opened(&mut s, 0, 2, 40, &q), None, "bit {bit}");
        }
        // another link or packet number (the nonce)
        assert_eq!(opened(&mut s, 0, 3, 40, &p), None);
        assert_eq!(opened(&mut s, 0, 2, 41, &p), None);
        // the other direction's key
        assert_eq!(opened(&mut c, 0, 2, 40, &p), None);
        assert_eq!(s.auth_failures as usize, p.len() * 8 + 2);
        // the server's own packets open at the client
        let p = sealed(&mut s, 0, 0, b"answer");
        assert_eq!(opened(&mut c, 0, 0, 0, &p).unwrap(), b"answer");
    }

    #[test]
    fn another_key_fails_the_handshake() {
        assert!(handshake(&key(1), &key(2)).is_none());
        let (_, msg1) = ClientHandshake::start(&key(1), 7, b"cookie", b"x");
        // the server notices at the first message, before any Diffie-Hellman
        assert!(ServerHandshake::read(&key(2), 7, b"cookie", &msg1).is_err());
        // and a message bound to another client connection ID, or to another cookie (a
        // replay under a cookie issued later, or to another address), fails too
        assert!(ServerHandshake::read(&key(1), 8, b"cookie", &msg1).is_err());
        assert!(ServerHandshake::read(&key(1), 7, b"cookie2", &msg1).is_err());
        assert!(ServerHandshake::read(&key(1), 7, b"cookie", &msg1).is_ok());
    }

    #[test]
    fn fresh_keys_per_connection() {
        let (mut c1, _) = handshake(&key(1), &key(1)).unwrap();
        let (_, mut s2) = handshake(&key(1), &key(1)).unwrap();
        let p = sealed(&mut c1, 0, 0, b"first connection");
        assert_eq!(opened(&mut s2, 0, 0, 0, &p), None);
    }

    /// An [`Opened`] proof names its key by [`PacketKey::id`]: the key an opener held is
    /// taken for its own phase while the receiver keeps it, and no longer once the receiver
    /// dropped it, although the opener's hold kept it alive.
    #[test]
    fn a_proof_counts_only_while_the_receiver_keeps_its_key() {
        let now = Instant::now();
        let (mut c, mut s) = handshake(&key(1), &key(1)).unwrap();
        let (phase, weak) = s.opening_key();
        let held = weak.upgrade().unwrap();
        assert_eq!(phase, 0);
        assert!(s.accept_opened(0, held.id));
        assert!(!s.accept_opened(1, held.id), "the other phase");
        // the client moves to generation 1, and the server follows: the held key is the
        // previous one
        sealed(&mut c, 0, 1, b"generation 0");
        c.on_acked(LinkId(0), 1);
        c.force_update(now);
        let p = sealed(&mut c, 0, 2, b"generation 1");
        assert!(opened(&mut s, 1, 0, 2, &p).is_some());
        assert!(
            s.accept_opened(0, held.id),
            "a late packet of the generation before"
        );
        // generation 2: generation 0's key is dropped, and its proofs refused
        c.on_acked(LinkId(0), 2);
        c.force_update(now);
        let p = sealed(&mut c, 0, 3, b"generation 2");
        assert!(opened(&mut s, 0, 0, 3, &p).is_some());
        assert_eq!(s.generations().1, 2);
        assert!(
            !s.accept_opened(0, held.id),
            "a dropped key, though still alive"
        );
        assert!(!s.accept_opened(1, held.id));
        let (_, current) = s.opening_key();
        assert!(s.accept_opened(0, current.upgrade().unwrap().id));
        assert_eq!(s.opened_ahead, 3);
        drop(held);
        assert!(weak.upgrade().is_none(), "nothing else kept it");
    }

    /// An opener that holds a key the receiver has moved past (a receiving thread that saw
    /// no packet for a whole key generation) leaves a packet of the next generation of that
    /// phase alone, unchanged, and the engine opens it. Before, the opener tried the old key,
    /// failed, and left the packet damaged: the engine's try with the next key failed too,
    /// and a genuine packet was lost and counted as a forgery.
    #[test]
    fn an_opener_with_a_retired_key_leaves_the_packet_to_the_engine() {
        let now = Instant::now();
        let (mut c, mut s) = handshake(&key(1), &key(1)).unwrap();
        const CID: u64 = 0x0123_4567;
        let opener = Opener::new(CID, Some(s.opening_key()));
        // a SHORT packet of the client's current generation
        let short = |c: &mut PacketProtection, pn: u64| {
            let mut d = vec![0u8; 64];
            let mut w = crate::wire::Writer::new(&mut d);
            crate::wire::write_short_header(&mut w, CID, LinkId(0), pn, c.send_phase());
            let header_len = w.len();
            d.truncate(header_len + 20 + TAG_LEN);
            c.seal(LinkId(0), pn, header_len, &mut d);
            (d, header_len)
        };
        // generation 0 opens ahead
        let (mut d, _) = short(&mut c, 1);
        assert!(opener.open(&mut d).is_some());
        // generation 1: the receiver follows; the opener's key is its previous one
        c.on_acked(LinkId(0), 1);
        c.force_update(now);
        let (d, h) = short(&mut c, 2);
        assert!(opened_at(&mut s, &d, h, 2).is_some());
        // generation 2, the opener's phase again: left alone, and the engine opens it
        c.on_acked(LinkId(0), 2);
        c.force_update(now);
        let (mut d, h) = short(&mut c, 3);
        let before = d.clone();
        assert!(opener.open(&mut d).is_none());
        assert_eq!(d, before, "the packet left as it came");
        assert!(opened_at(&mut s, &d, h, 3).is_some(), "the engine opens it");
        assert_eq!(s.generations().1, 2);
        assert_eq!(s.auth_failures, 0);
    }

    /// What the engine's own open gives a SHORT datagram `d` with a header of `h` bytes.
    fn opened_at(p: &mut PacketProtection, d: &[u8], h: usize, pn: u64) -> Option<Vec<u8>> {
        let phase = match crate::wire::decode_packet(d) {
            Ok((crate::wire::Header::Short { phase, .. }, _)) => phase,
            _ => return None,
        };
        let mut d = d.to_vec();
        let (header, body) = d.split_at_mut(h);
        let len = p.open(LinkId(0), pn, phase, header, body).ok()?;
        Some(body[..len].to_vec())
    }

    #[test]
    fn key_updates_follow_with_one_old_key_kept() {
        let now = Instant::now();
        let (mut c, mut s) = handshake(&key(1), &key(1)).unwrap();
        let old = sealed(&mut c, 0, 1, b"generation 0");
        // not before the peer confirmed the current key
        c.force_update(now);
        assert_eq!(c.generations().0, 0);
        c.on_acked(LinkId(0), 0); // below the first packet of this generation: proves nothing
        c.force_update(now);
        assert_eq!(c.generations().0, 0);
        c.on_acked(LinkId(0), 1);
        c.force_update(now);
        assert_eq!((c.generations().0, c.send_phase()), (1, 1));
        let new = sealed(&mut c, 0, 2, b"generation 1");
        assert_eq!(opened(&mut s, 1, 0, 2, &new).unwrap(), b"generation 1");
        assert_eq!(s.generations().1, 1);
        // a late packet of the generation before still opens
        assert_eq!(opened(&mut s, 0, 0, 1, &old).unwrap(), b"generation 0");
        // after one more update, generation 0 is gone
        c.on_acked(LinkId(0), 2);
        c.force_update(now);
        let newer = sealed(&mut c, 0, 3, b"generation 2");
        assert_eq!(opened(&mut s, 0, 0, 3, &newer).unwrap(), b"generation 2");
        assert_eq!(opened(&mut s, 0, 0, 1, &old), None);
    }
}
