//! How fast the candidate AEADs seal and open on this host, one thread: each packet or frame is
//! sealed in place and opened again, as a sender and a receiver would, with the crates ri2n
//! builds (`ring`'s AES-256-GCM and ChaCha20-Poly1305, the `aegis` crate's AEGIS-256 family).
//! Sizes: a full packet at MTU 1500 and 9000, and a TCP transport frame. Prints JSON (used by
//! `bench/run-all keyed`): nanoseconds per seal and open, and the GB/s that makes.
//!
//! `cargo run --release -p ri2n-proto --example aead_speed [MB per measurement]`

use std::time::{Duration, Instant};

use aegis::aegis256::Aegis256;
use aegis::aegis256x2::Aegis256X2;
use aegis::aegis256x4::Aegis256X4;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, CHACHA20_POLY1305};

/// Payload bytes of a full packet at MTU 1500 and 9000, and a TCP transport frame's.
const SIZES: [usize; 3] = [1444, 8952, 65536];
const AAD: [u8; 12] = [4; 12];

fn ring_pair(key: &LessSafeKey, i: u64, data: &mut [u8]) {
    let nonce = |i: u64| {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&i.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    };
    let tag = key
        .seal_in_place_separate_tag(nonce(i), Aad::from(&AAD), data)
        .unwrap();
    key.open_in_place_separate_tag(nonce(i), Aad::from(&AAD), tag, data, 0..)
        .unwrap();
}

macro_rules! aegis_pair {
    ($cipher:ty) => {
        |key: &[u8; 32], i: u64, data: &mut [u8]| {
            let mut nonce = [0u8; 32];
            nonce[4..12].copy_from_slice(&i.to_be_bytes());
            let tag = <$cipher>::new(key, &nonce).encrypt_in_place(data, &AAD);
            <$cipher>::new(key, &nonce)
                .decrypt_in_place(data, &tag, &AAD)
                .unwrap();
        }
    };
}

/// The median time of one seal and open of `size` bytes over 5 runs of `bytes` each.
fn time(size: usize, bytes: usize, mut pair: impl FnMut(u64, &mut [u8])) -> Duration {
    let mut data = vec![0x5a; size];
    let n = (bytes / size).max(1) as u64;
    let mut runs: Vec<Duration> = (0..5)
        .map(|_| {
            let start = Instant::now();
            for i in 0..n {
                pair(i, &mut data);
            }
            start.elapsed() / n as u32
        })
        .collect();
    runs.sort();
    runs[2]
}

fn main() {
    let mb: usize = std::env::args()
        .nth(1)
        .map_or(200, |s| s.parse().expect("megabytes per measurement"));
    let secret = [7u8; 32];
    let gcm = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &secret).unwrap());
    let chacha = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &secret).unwrap());
    let (x1, x2, x4) = (
        aegis_pair!(Aegis256<16>),
        aegis_pair!(Aegis256X2<16>),
        aegis_pair!(Aegis256X4<16>),
    );
    let mut rows = Vec::new();
    for size in SIZES {
        let bytes = mb << 20;
        let timed: [(&str, Duration); 5] = [
            (
                "AES-256-GCM (ring)",
                time(size, bytes, |i, d| ring_pair(&gcm, i, d)),
            ),
            (
                "ChaCha20-Poly1305 (ring)",
                time(size, bytes, |i, d| ring_pair(&chacha, i, d)),
            ),
            (
                "AEGIS-256 (aegis)",
                time(size, bytes, |i, d| x1(&secret, i, d)),
            ),
            (
                "AEGIS-256X2 (aegis)",
                time(size, bytes, |i, d| x2(&secret, i, d)),
            ),
            (
                "AEGIS-256X4 (aegis)",
                time(size, bytes, |i, d| x4(&secret, i, d)),
            ),
        ];
        for (name, t) in timed {
            let ns = t.as_secs_f64() * 1e9;
            rows.push(format!(
                "{{\"cipher\": \"{name}\", \"bytes\": {size}, \"ns_per_seal_and_open\": {ns:.1}, \
                 \"gb_per_s_sealed_and_opened\": {:.2}}}",
                size as f64 / ns
            ));
        }
    }
    println!("[{}]", rows.join(", "));
}
