//! The data pattern shared with the kernel-peer harness (`tests/kernel-peer/README.md`,
//! "Data pattern"): byte `n` of the stream with seed `s` is byte `n mod 8` (little-endian) of
//! `mix64((s + 1) · 0x9e3779b97f4a7c15 + ⌊n / 8⌋)`. Using the same function everywhere lets a
//! capture or a peer check any byte independently.

/// The splitmix64 finaliser.
fn mix64(mut z: u64) -> u64 {
    z ^= z >> 30;
    z = z.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^= z >> 27;
    z = z.wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Byte `n` of the stream with seed `seed`.
pub fn byte_at(seed: u64, n: u64) -> u8 {
    let base = seed.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    mix64(base.wrapping_add(n / 8)).to_le_bytes()[(n % 8) as usize]
}

/// Fills `out` with stream bytes `offset .. offset + out.len()` of `seed`.
pub fn fill(seed: u64, offset: u64, out: &mut [u8]) {
    let base = seed.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut n = offset;
    let mut i = 0;
    // Unaligned head, byte by byte.
    while i < out.len() && !n.is_multiple_of(8) {
        out[i] = byte_at(seed, n);
        i += 1;
        n += 1;
    }
    // Whole words.
    while i + 8 <= out.len() {
        let w = mix64(base.wrapping_add(n / 8)).to_le_bytes();
        out[i..i + 8].copy_from_slice(&w);
        i += 8;
        n += 8;
    }
    while i < out.len() {
        out[i] = byte_at(seed, n);
        i += 1;
        n += 1;
    }
}

/// The first offset where `data` differs from the stream, if any.
pub fn first_mismatch(seed: u64, offset: u64, data: &[u8]) -> Option<usize> {
    let mut want = vec![0u8; data.len()];
    fill(seed, offset, &mut want);
    data.iter().zip(&want).position(|(a, b)| a != b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_harness_reference_bytes() {
        // README of tests/kernel-peer: "The first bytes of seed 0 are af cd 1d 7b 39 a8 20 e2".
        let mut b = [0u8; 8];
        fill(0, 0, &mut b);
        assert_eq!(b, [0xaf, 0xcd, 0x1d, 0x7b, 0x39, 0xa8, 0x20, 0xe2]);
    }

    #[test]
    fn unaligned_fill_agrees_with_byte_at() {
        let mut b = [0u8; 37];
        fill(7, 3, &mut b);
        for (i, x) in b.iter().enumerate() {
            assert_eq!(*x, byte_at(7, 3 + i as u64));
        }
        assert_eq!(first_mismatch(7, 3, &b), None);
        b[20] ^= 1;
        assert_eq!(first_mismatch(7, 3, &b), Some(20));
    }
}
