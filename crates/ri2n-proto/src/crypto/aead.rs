//! The AEADs that seal packets and TCP frames (docs/PROTOCOL.md §9.3), behind one key type that
//! seals and opens in place and is wiped when dropped.
//!
//! - AEGIS-256X4 (draft-irtf-cfrg-aegis-aead, through the `aegis` crate's libaegis, which picks
//!   AES-NI, VAES or AVX-512 at run time): the fastest on hosts with AES instructions, because
//!   it takes 6 AES rounds per 16 bytes where AES-256-GCM takes 14 and a carry-less
//!   multiplication, and its four lanes fill the wide AES units.
//! - AES-256-GCM (`ring`): what two hosts with AES instructions agree on when one of them does
//!   not offer AEGIS (an older build).
//! - ChaCha20-Poly1305 (`ring`): fast without AES instructions.
//!
//! All three take a 32-byte key and add a 16-byte tag. The protocol's nonces are 12 bytes;
//! AEGIS-256X4's are 32, so its nonce is the protocol's followed by 20 zero bytes.

use std::mem::MaybeUninit;

use aegis::aegis256x4::Aegis256X4;
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use zeroize::Zeroize;

use super::{KEY_LEN, TAG_LEN};

/// Bytes of the nonce the protocol builds for each packet or frame.
pub(crate) const NONCE_LEN: usize = aead::NONCE_LEN;

/// The AEAD that seals short packets. More may come (as AEGIS-256X4 did), so a match on it
/// needs a wildcard arm; [`Cipher::name`] names any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cipher {
    /// AES-256-GCM: used when both hosts have AES instructions and one does not offer
    /// AEGIS-256X4.
    Aes256Gcm,
    /// ChaCha20-Poly1305: fast in software, used when a host lacks AES instructions.
    ChaCha20Poly1305,
    /// AEGIS-256X4: used when both hosts have AES instructions and offer it.
    Aegis256X4,
}

impl Cipher {
    /// What this host seals fastest.
    pub fn preferred() -> Cipher {
        if hardware_aes() {
            Cipher::Aegis256X4
        } else {
            Cipher::ChaCha20Poly1305
        }
    }

    /// The cipher of a connection. A side that prefers AEGIS-256X4 or AES-256-GCM has AES
    /// instructions, so it seals both fast: AEGIS-256X4 if both prefer it, else AES-256-GCM if
    /// both have AES instructions, else ChaCha20-Poly1305.
    pub(crate) fn agree(client: Cipher, server: Cipher) -> Cipher {
        match (client, server) {
            (Cipher::Aegis256X4, Cipher::Aegis256X4) => Cipher::Aegis256X4,
            (Cipher::ChaCha20Poly1305, _) | (_, Cipher::ChaCha20Poly1305) => {
                Cipher::ChaCha20Poly1305
            }
            _ => Cipher::Aes256Gcm,
        }
    }

    /// Its name as the draft or RFC spells it: `AEGIS-256X4`, `AES-256-GCM`,
    /// `ChaCha20-Poly1305`.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::Aes256Gcm => "AES-256-GCM",
            Cipher::ChaCha20Poly1305 => "ChaCha20-Poly1305",
            Cipher::Aegis256X4 => "AEGIS-256X4",
        }
    }

    /// Its code in the handshake.
    pub(crate) fn code(self) -> u8 {
        match self {
            Cipher::Aes256Gcm => 1,
            Cipher::ChaCha20Poly1305 => 2,
            Cipher::Aegis256X4 => 3,
        }
    }

    /// The cipher of a code; unknown codes mean ChaCha20-Poly1305 (always available).
    pub(crate) fn from_code(code: u8) -> Cipher {
        match code {
            1 => Cipher::Aes256Gcm,
            3 => Cipher::Aegis256X4,
            _ => Cipher::ChaCha20Poly1305,
        }
    }
}

fn hardware_aes() -> bool {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// The sealed data failed to open: forged, damaged, or sealed under another key or nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unauthentic;

// only ever in `AeadKey`'s box, so its size costs nothing
#[allow(clippy::large_enum_variant)]
enum Keyed {
    /// `ring` keeps the key schedule it derives inside the key value and does not wipe it.
    Ring(LessSafeKey),
    /// libaegis derives its state from the key for each message, on the calling thread's
    /// stack, where later calls overwrite it (it is not wiped as this value is).
    Aegis([u8; KEY_LEN]),
}

/// An AEAD key, ready to seal or open, whose memory is overwritten when it is dropped. Boxed,
/// as the handshake's state is, so that moving the owner leaves no copies behind.
pub(crate) struct AeadKey(Box<MaybeUninit<Keyed>>);

impl AeadKey {
    pub(crate) fn new(cipher: Cipher, secret: &[u8; KEY_LEN]) -> AeadKey {
        let ring = |algorithm| {
            Keyed::Ring(LessSafeKey::new(
                UnboundKey::new(algorithm, secret).expect("32-byte key"),
            ))
        };
        AeadKey(Box::new(MaybeUninit::new(match cipher {
            Cipher::Aes256Gcm => ring(&aead::AES_256_GCM),
            Cipher::ChaCha20Poly1305 => ring(&aead::CHACHA20_POLY1305),
            Cipher::Aegis256X4 => Keyed::Aegis(*secret),
        })))
    }

    fn keyed(&self) -> &Keyed {
        // SAFETY: initialised in `new`, dropped only in `drop`.
        unsafe { self.0.assume_init_ref() }
    }

    /// Encrypts `in_out` in place and returns the tag that authenticates it with `aad`.
    pub(crate) fn seal(
        &self,
        nonce: [u8; NONCE_LEN],
        aad: &[u8],
        in_out: &mut [u8],
    ) -> [u8; TAG_LEN] {
        match self.keyed() {
            Keyed::Ring(key) => {
                let tag = key
                    .seal_in_place_separate_tag(
                        Nonce::assume_unique_for_key(nonce),
                        Aad::from(aad),
                        in_out,
                    )
                    .expect("data within the AEAD's size limit");
                tag.as_ref().try_into().expect("16-byte tag")
            }
            Keyed::Aegis(key) => {
                Aegis256X4::<TAG_LEN>::new(key, &aegis_nonce(nonce)).encrypt_in_place(in_out, aad)
            }
        }
    }

    /// Encrypts the concatenation of `parts` into `out` (as long as they are together) and
    /// returns the tag. AEGIS-256X4 encrypts each part straight into its place; the others
    /// copy first and encrypt in place.
    pub(crate) fn seal_gathered(
        &self,
        nonce: [u8; NONCE_LEN],
        aad: &[u8],
        parts: &[&[u8]],
        out: &mut [u8],
    ) -> [u8; TAG_LEN] {
        let mut rest = &mut *out;
        match self.keyed() {
            Keyed::Aegis(key) => {
                let mut e = Aegis256X4::<TAG_LEN>::new(key, &aegis_nonce(nonce)).encryptor(aad);
                for part in parts {
                    let (chunk, after) = rest.split_at_mut(part.len());
                    e.update(part, chunk);
                    rest = after;
                }
                assert!(rest.is_empty(), "`out` as long as the parts");
                e.finalize()
            }
            Keyed::Ring(_) => {
                for part in parts {
                    let (chunk, after) = rest.split_at_mut(part.len());
                    chunk.copy_from_slice(part);
                    rest = after;
                }
                assert!(rest.is_empty(), "`out` as long as the parts");
                self.seal(nonce, aad, out)
            }
        }
    }

    /// Opens `in_out` (ciphertext, then the tag) in place; returns the plaintext, the start of
    /// `in_out`.
    pub(crate) fn open<'a>(
        &self,
        nonce: [u8; NONCE_LEN],
        aad: &[u8],
        in_out: &'a mut [u8],
    ) -> Result<&'a mut [u8], Unauthentic> {
        match self.keyed() {
            Keyed::Ring(key) => key
                .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), in_out)
                .map_err(|_| Unauthentic),
            Keyed::Aegis(key) => {
                let at = in_out.len().checked_sub(TAG_LEN).ok_or(Unauthentic)?;
                let (data, tag) = in_out.split_at_mut(at);
                let tag: &[u8; TAG_LEN] = (&*tag).try_into().expect("16-byte tag");
                Aegis256X4::<TAG_LEN>::new(key, &aegis_nonce(nonce))
                    .decrypt_in_place(data, tag, aad)
                    .map_err(|_| Unauthentic)?;
                Ok(data)
            }
        }
    }
}

/// AEGIS-256X4's 32-byte nonce: the protocol's, then zeros.
fn aegis_nonce(nonce: [u8; NONCE_LEN]) -> [u8; 32] {
    let mut n = [0u8; 32];
    n[..NONCE_LEN].copy_from_slice(&nonce);
    n
}

impl Drop for AeadKey {
    fn drop(&mut self) {
        // SAFETY: the key is initialised and dropped here once; then its now unused bytes,
        // which `MaybeUninit` lets hold anything, are overwritten before the box frees them.
        unsafe { self.0.assume_init_drop() };
        self.0.zeroize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// "Test Vector 2" of AEGIS-256X4 in draft-irtf-cfrg-aegis-aead: it pins the cipher the
    /// crate computes. The protocol's own vector (its nonce ends in zeros) is in the crypto
    /// module's tests.
    #[test]
    fn aegis_256x4_is_the_drafts() {
        let key: [u8; 32] = std::array::from_fn(|i| i as u8);
        let nonce: [u8; 32] = std::array::from_fn(|i| 0x10 + i as u8);
        let ad = unhex("0102030401020304");
        let mut data = unhex("04050607").repeat(30);
        let tag = Aegis256X4::<16>::new(&key, &nonce).encrypt_in_place(&mut data, &ad);
        assert_eq!(
            hex(&data),
            "bfc2085b7e8017da99b0b6d646ae4d01f4ba8f2e7dfca1d759ae48a135139b9aaac6b4f5db810d42\
             6be1fdaff4e1454153a34b11da78ed7e418ee2ee9853042e95536aecbb694cea1b16a478eb0d4d1b\
             f6509b1ce652a45af58e0e46ffccfa2d0426e702391d2ff5813808b81748a490dd656465fed61f09"
        );
        assert_eq!(hex(&tag), "b63b611b13975e2f3dc3cb6c2397bfcd");
    }

    #[test]
    fn every_cipher_opens_what_it_sealed_and_nothing_changed() {
        for cipher in [
            Cipher::Aegis256X4,
            Cipher::Aes256Gcm,
            Cipher::ChaCha20Poly1305,
        ] {
            let key = AeadKey::new(cipher, &[9; KEY_LEN]);
            let nonce = [3; NONCE_LEN];
            let mut data = b"a payload of some length".to_vec();
            let tag = key.seal(nonce, b"header", &mut data);
            assert_ne!(&data[..], b"a payload of some length", "{cipher:?}");
            data.extend_from_slice(&tag);
            let mut copy = data.clone();
            assert_eq!(
                key.open(nonce, b"header", &mut copy).unwrap(),
                b"a payload of some length"
            );
            for bit in [0, 8 * data.len() - 1] {
                let mut bad = data.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                assert_eq!(key.open(nonce, b"header", &mut bad), Err(Unauthentic));
            }
            assert_eq!(
                key.open([4; NONCE_LEN], b"header", &mut data.clone()),
                Err(Unauthentic)
            );
            assert_eq!(
                key.open(nonce, b"HEADER", &mut data.clone()),
                Err(Unauthentic)
            );
            assert_eq!(key.open(nonce, b"", &mut [0; 3]), Err(Unauthentic));
            // sealed from pieces: the same as sealed whole
            let mut gathered = vec![0; 24];
            let tag2 = key.seal_gathered(
                nonce,
                b"header",
                &[b"a payload", b"", b" of some length"],
                &mut gathered,
            );
            assert_eq!(gathered, data[..24], "{cipher:?}");
            assert_eq!(tag2, tag);
        }
    }

    #[test]
    fn the_connection_gets_aegis_only_if_both_offer_it() {
        use Cipher::*;
        for (client, server, agreed) in [
            (Aegis256X4, Aegis256X4, Aegis256X4),
            (Aegis256X4, Aes256Gcm, Aes256Gcm),
            (Aes256Gcm, Aegis256X4, Aes256Gcm),
            (Aes256Gcm, Aes256Gcm, Aes256Gcm),
            (Aegis256X4, ChaCha20Poly1305, ChaCha20Poly1305),
            (ChaCha20Poly1305, Aes256Gcm, ChaCha20Poly1305),
        ] {
            assert_eq!(
                Cipher::agree(client, server),
                agreed,
                "{client:?} {server:?}"
            );
        }
        for c in [Aegis256X4, Aes256Gcm, ChaCha20Poly1305] {
            assert_eq!(Cipher::from_code(c.code()), c);
        }
        assert_eq!(Cipher::from_code(0x7f), ChaCha20Poly1305);
    }
}
