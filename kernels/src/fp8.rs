//! FP8 E4M3 (the "FN" variant NVIDIA's tensor cores take): 1 sign bit, 4 exponent bits with
//! bias 7, 3 mantissa bits; no infinities, one NaN pattern per sign (`S.1111.111`); largest
//! finite value 448, smallest normal 2⁻⁶, smallest subnormal 2⁻⁹.
//!
//! Conversion from f32 rounds to the nearest value, ties to an even mantissa, and saturates:
//! a finite value (or an infinity) beyond ±448 becomes ±448, and every NaN becomes the NaN code
//! `0x7f`, whatever its sign (a GPU's division returns one canonical NaN, so a NaN's sign could
//! not be kept alike on both backends). The CUDA kernels convert with the same arithmetic
//! (`e4m3_from_f32` and, from sm_89, the hardware conversion in `common.cuh`), so the host and
//! the device quantize to the same codes.

/// The largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;

/// The E4M3 code nearest to `x` (see the module docs). Without branches on the value (selects
/// only), so that loops over many values vectorize: a weight's quantization at load runs
/// through here.
#[inline]
pub fn e4m3_from_f32(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = f32::from_bits(bits & 0x7fff_ffff);
    // Normal (|x| ≥ 2⁻⁶): the mantissa rounded from 23 bits to 3, ties to even, by adding just
    // under half a step (plus the kept bit) to the bits: a carry into the exponent is the
    // next binade. Then the exponent rebased from 127 to 7 (120 binades down, 8 codes each).
    let ab = a.to_bits();
    let rounded = ab + 0x7_ffff + ((ab >> 20) & 1);
    let normal = (rounded >> 20).wrapping_sub(120 << 3);
    // Subnormal (or zero): steps of 2⁻⁹; below 8 steps, adding 2²³ rounds to a whole number,
    // ties to even. Rounding up to 8 steps gives the smallest normal, whose code is 8.
    let sub = ((a * 512.0 + 8_388_608.0) - 8_388_608.0) as u32;
    let code = if a < 0.015_625 { sub } else { normal };
    // Past the largest finite value (448, code 0x7e; infinities too) it saturates.
    let code = code.min(0x7e) as u8;
    if x.is_nan() { 0x7f } else { sign | code }
}

/// The value of an E4M3 code.
pub fn e4m3_to_f32(c: u8) -> f32 {
    let sign = if c & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (((c >> 3) & 0xf) as i32, (c & 7) as f32);
    if e == 15 && m == 7.0 {
        return f32::NAN;
    }
    sign * if e == 0 {
        m * 2f32.powi(-9)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

/// Per-row quantization of a `[rows, cols]` matrix (a weight, one row per output feature):
/// each row's scale is its largest magnitude over [`E4M3_MAX`] (1 for a row of zeros), its
/// codes `e4m3(w / scale)`; `w ≈ code · scale`. Returns the codes and the scales.
pub fn quantize_rows_e4m3(w: &[f32], rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    assert_eq!(w.len(), rows * cols, "a [{rows}, {cols}] matrix");
    let mut codes = vec![0u8; w.len()];
    let mut scales = Vec::with_capacity(rows);
    for (row, out) in w
        .chunks_exact(cols.max(1))
        .zip(codes.chunks_exact_mut(cols.max(1)))
    {
        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = if amax > 0.0 && amax.is_finite() {
            amax / E4M3_MAX
        } else {
            1.0
        };
        for (o, v) in out.iter_mut().zip(row) {
            *o = e4m3_from_f32(v / scale);
        }
        scales.push(scale);
    }
    (codes, scales)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conversion in integer steps, branch by branch (as `common.cuh`'s
    /// `e4m3_from_f32_steps` computes it on devices without the conversion instruction).
    fn e4m3_steps(x: f32) -> u8 {
        if x.is_nan() {
            return 0x7f;
        }
        let sign = ((x.to_bits() >> 24) & 0x80) as u8;
        let a = x.abs();
        if a >= E4M3_MAX {
            return sign | 0x7e;
        }
        if a < 2f32.powi(-6) {
            return sign | (a * 512.0).round_ties_even() as u8;
        }
        let abits = a.to_bits();
        let mut e = ((abits >> 23) & 0xff) as i32 - 127;
        let m = abits & 0x7f_ffff;
        let (mut q, rest) = (m >> 20, m & 0xf_ffff);
        if rest > 0x8_0000 || (rest == 0x8_0000 && q & 1 == 1) {
            q += 1;
        }
        if q == 8 {
            q = 0;
            e += 1;
        }
        let biased = e + 7;
        if biased > 15 || (biased == 15 && q == 7) {
            return sign | 0x7e;
        }
        sign | ((biased as u8) << 3) | q as u8
    }

    /// The conversion equals the integer steps for every f32 of both signs whose bits are a
    /// multiple of 61 (70 M values: every binade, many mantissas), every f32 within 2 ulps of
    /// each code's value and of each midpoint between two codes, and the specials.
    #[test]
    fn conversion_equals_the_integer_steps() {
        let mut values: Vec<f32> = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN_POSITIVE,
        ];
        let mut f: Vec<f64> = finite().iter().map(|&(_, v)| v).collect();
        f.sort_by(f64::total_cmp);
        let mids: Vec<f64> = f.windows(2).map(|w| (w[0] + w[1]) / 2.0).collect();
        for v in f.iter().chain(&mids) {
            let b = (*v as f32).to_bits();
            for d in 0..5u32 {
                values.push(f32::from_bits((b + d).saturating_sub(2)));
            }
        }
        for v in values {
            assert_eq!(e4m3_from_f32(v), e4m3_steps(v), "{v:e}");
        }
        for bits in (0..=u32::MAX).step_by(61) {
            let v = f32::from_bits(bits);
            assert_eq!(e4m3_from_f32(v), e4m3_steps(v), "{bits:#010x}");
        }
    }

    /// Every finite code with its value, from the format's definition.
    fn finite() -> Vec<(u8, f64)> {
        (0u8..=255)
            .filter(|c| c & 0x7f != 0x7f)
            .map(|c| {
                let (e, m) = (((c >> 3) & 0xf) as i32, (c & 7) as f64);
                let mag = if e == 0 {
                    m / 8.0 * 2f64.powi(-6)
                } else {
                    (1.0 + m / 8.0) * 2f64.powi(e - 7)
                };
                (c, if c & 0x80 != 0 { -mag } else { mag })
            })
            .collect()
    }

    /// The nearest finite code by search: ties to the even code (even mantissa), beyond
    /// ±448 the largest, signed zero kept.
    fn oracle(x: f32) -> u8 {
        let xd = x as f64;
        if x.abs() >= 448.0 {
            return if x < 0.0 { 0xfe } else { 0x7e };
        }
        let mut best: Option<(u8, f64)> = None;
        for (c, v) in finite() {
            // Only codes of x's sign (zero: the code of x's sign).
            if (c & 0x80 != 0) != x.is_sign_negative() {
                continue;
            }
            let d = (v - xd).abs();
            best = match best {
                None => Some((c, d)),
                Some((bc, bd)) if d < bd || (d == bd && c & 1 == 0 && bc & 1 == 1) => Some((c, d)),
                b => b,
            };
        }
        best.unwrap().0
    }

    #[test]
    fn every_code_decodes_by_the_definition_and_encodes_back() {
        for (c, v) in finite() {
            assert_eq!(e4m3_to_f32(c) as f64, v, "code {c:#04x}");
            assert_eq!(e4m3_from_f32(v as f32), c, "value {v}");
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
    }

    #[test]
    fn rounding_is_to_nearest_even_and_saturates() {
        // Ties: 1 + 1/16 lies between 1 (m 0) and 1.125 (m 1): to 1. 1 + 3/16: to 1.25 (m 2).
        assert_eq!(e4m3_to_f32(e4m3_from_f32(1.0625)), 1.0);
        assert_eq!(e4m3_to_f32(e4m3_from_f32(1.1875)), 1.25);
        // A subnormal tie: 1.5 · 2⁻⁹ goes to 2 · 2⁻⁹; 0.5 · 2⁻⁹ to zero.
        assert_eq!(e4m3_from_f32(1.5 * 2f32.powi(-9)), 2);
        assert_eq!(e4m3_from_f32(0.5 * 2f32.powi(-9)), 0);
        // Rounding up into the next binade and into the smallest normal.
        assert_eq!(e4m3_to_f32(e4m3_from_f32(1.97)), 2.0);
        assert_eq!(e4m3_from_f32(7.9 * 2f32.powi(-9)), 0x08);
        // Saturation: between 448 and the would-be 480, beyond, infinities.
        for x in [449.0, 463.9, 464.0, 1e6, f32::INFINITY] {
            assert_eq!(e4m3_from_f32(x), 0x7e, "{x}");
            assert_eq!(e4m3_from_f32(-x), 0xfe, "-{x}");
        }
        // Every NaN, whatever its sign or payload, is the one code a device gives.
        for x in [f32::NAN, -f32::NAN, f32::from_bits(0xff80_0001)] {
            assert_eq!(e4m3_from_f32(x), 0x7f);
        }
        assert_eq!(e4m3_from_f32(-0.0), 0x80);
        assert_eq!(e4m3_from_f32(0.0), 0x00);
    }

    #[test]
    fn conversion_matches_a_nearest_value_search() {
        // Values spread over the whole range (and beyond), both signs, ties included.
        let mut x = 0x2545_f491u32;
        let mut values: Vec<f32> = Vec::new();
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let mag = 2f32.powf((x % 10_000) as f32 / 10_000.0 * 22.0 - 12.0);
            values.push(if x & 1 == 0 { mag } else { -mag });
        }
        // Every midpoint between neighbouring codes and its two neighbours in f32.
        let mut f: Vec<f64> = finite().iter().map(|&(_, v)| v).collect();
        f.sort_by(f64::total_cmp);
        for w in f.windows(2) {
            let mid = ((w[0] + w[1]) / 2.0) as f32;
            values.extend([
                mid,
                f32::from_bits(mid.to_bits() + 1),
                f32::from_bits(mid.to_bits().saturating_sub(1)),
            ]);
        }
        for v in values {
            assert_eq!(e4m3_from_f32(v), oracle(v), "{v:e}");
        }
    }

    #[test]
    fn rows_are_quantized_by_their_largest_magnitude() {
        let w = [0.5, -2.0, 1.0, 0.0, 0.0, 0.0, 3e-3, 1e-3, -4e-3];
        let (codes, scales) = quantize_rows_e4m3(&w, 3, 3);
        assert_eq!(scales, vec![2.0 / 448.0, 1.0, 4e-3 / 448.0]);
        // Each row's largest magnitude becomes ±448 exactly.
        assert_eq!(codes[1], 0xfe);
        assert_eq!(codes[8], 0xfe);
        assert!(codes[3..6].iter().all(|&c| c == 0));
        for (i, (&c, &v)) in codes.iter().zip(&w).enumerate() {
            let back = e4m3_to_f32(c) * scales[i / 3];
            assert!(
                (back - v).abs() <= v.abs() / 16.0 + 1e-12,
                "{i}: {back} vs {v}"
            );
        }
    }
}
