//! Helpers shared by the echo tests.

use std::net::SocketAddr;

/// Bytes each echo client sends.
pub const BYTES_EACH: usize = 100_000;

/// `ip`, any port.
pub fn loopback(ip: &str) -> SocketAddr {
    format!("{ip}:0").parse().unwrap()
}

/// Client `k`'s bytes: distinct per client, so a mix-up between connections shows.
pub fn payload(k: usize) -> Vec<u8> {
    (0..BYTES_EACH)
        .map(|i| (i.wrapping_mul(31) ^ k.wrapping_mul(7919)) as u8)
        .collect()
}
