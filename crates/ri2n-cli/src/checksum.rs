//! A fast 64-bit checksum of a byte stream, the same however the stream is split into
//! chunks: both ends of a transfer compute it and print it, so equal data shows equal sums.
//! Not cryptographic (use sha256sum for that); it costs a fraction of a CPU second per GiB.

/// Four independent multiply-rotate lanes over 8-byte words (32-byte blocks).
#[derive(Debug, Clone)]
pub struct Checksum {
    lanes: [u64; 4],
    block: [u8; 32],
    buffered: usize,
    len: u64,
}

const K: [u64; 4] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0xD6E8_FEB8_6659_FD93,
];

impl Default for Checksum {
    fn default() -> Self {
        Self {
            lanes: [1, 2, 3, 4],
            block: [0; 32],
            buffered: 0,
            len: 0,
        }
    }
}

impl Checksum {
    #[inline]
    fn mix_block(lanes: &mut [u64; 4], block: &[u8]) {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let w = u64::from_le_bytes(block[i * 8..i * 8 + 8].try_into().unwrap());
            *lane = (lane.rotate_left(31) ^ w).wrapping_mul(K[i]);
        }
    }

    /// Adds the next bytes of the stream.
    pub fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if self.buffered > 0 {
            let n = (32 - self.buffered).min(data.len());
            self.block[self.buffered..self.buffered + n].copy_from_slice(&data[..n]);
            self.buffered += n;
            data = &data[n..];
            if self.buffered < 32 {
                return;
            }
            let block = self.block;
            Self::mix_block(&mut self.lanes, &block);
            self.buffered = 0;
        }
        let mut blocks = data.chunks_exact(32);
        for b in &mut blocks {
            Self::mix_block(&mut self.lanes, b);
        }
        let rest = blocks.remainder();
        self.block[..rest.len()].copy_from_slice(rest);
        self.buffered = rest.len();
    }

    /// The checksum of everything added so far.
    pub fn value(&self) -> u64 {
        let mut lanes = self.lanes;
        let mut last = [0u8; 32];
        last[..self.buffered].copy_from_slice(&self.block[..self.buffered]);
        Self::mix_block(&mut lanes, &last);
        let mut h = self.len;
        for l in lanes {
            h = fmix(h ^ l);
        }
        h
    }

    /// The checksum as 16 hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.value())
    }
}

/// splitmix64's finaliser: every input bit affects every output bit.
fn fmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Deterministic pseudo-random bytes (splitmix64), fast enough to feed a transfer.
#[derive(Debug, Clone)]
pub struct RandomBytes(u64);

impl RandomBytes {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Fills `buf` (its length a multiple of 8 for full speed).
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut words = buf.chunks_exact_mut(8);
        for w in &mut words {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            w.copy_from_slice(&fmix(self.0).to_le_bytes());
        }
        let rest = words.into_remainder();
        if !rest.is_empty() {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let v = fmix(self.0).to_le_bytes();
            let n = rest.len();
            rest.copy_from_slice(&v[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn independent_of_chunking() {
        let mut data = vec![0u8; 10_000];
        RandomBytes::new(5).fill(&mut data);
        let mut whole = Checksum::default();
        whole.update(&data);
        for step in [1, 3, 7, 31, 32, 33, 1000] {
            let mut c = Checksum::default();
            for chunk in data.chunks(step) {
                c.update(chunk);
            }
            assert_eq!(c.value(), whole.value(), "step {step}");
        }
    }

    #[test]
    fn detects_changes_and_length() {
        let mut data = vec![0u8; 4096];
        RandomBytes::new(9).fill(&mut data);
        let sum = |d: &[u8]| {
            let mut c = Checksum::default();
            c.update(d);
            c.value()
        };
        let base = sum(&data);
        assert_ne!(base, sum(&data[..4095]));
        let mut zeros = data.clone();
        zeros.push(0);
        assert_ne!(base, sum(&zeros));
        for i in [0, 7, 8, 31, 32, 4095] {
            let mut d = data.clone();
            d[i] ^= 1;
            assert_ne!(base, sum(&d), "flip at {i}");
        }
        // swapping two words in different lanes changes the sum
        let mut d = data.clone();
        d.swap(0, 8);
        assert_ne!(base, sum(&d));
    }
}
