//! What several of the crate's tests share.

/// `n` values in `[-scale, scale]` from a seeded xorshift generator (inputs and noise the
/// tests and their recordings define the same way).
pub fn rand(seed: u32, n: usize, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}
