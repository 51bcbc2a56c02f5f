//! What goes into Pi0.5 and what comes out, as openpi does it:
//!
//! * images: [`resize_with_pad`] (openpi `image_tools.resize_with_pad`: keep the aspect ratio,
//!   bilinear with antialiasing as `jax.image.resize` computes it, round to uint8, pad with
//!   black, the padding split evenly), then [`to_model_pixels`] (`x / 255 · 2 − 1`) into a
//!   [`ModelImage`];
//! * state: normalized with [`NormStats`] (mean/std or quantiles, `norm_stats.json`), then
//!   discretized into 256 bins over [−1, 1] ([`discretize_state`], `np.digitize`) and written
//!   into the prompt ([`pi05_prompt`]: `Task: {task}, State: {bins};\nAction: `);
//! * actions: unnormalized with the `actions` statistics.

use crate::error::{Error, Result};
use std::path::Path;

/// Weights of each output sample over the input, as `jax.image.scale_and_translate` computes
/// them for the triangle (linear) kernel with antialiasing: the kernel is widened by the
/// downscale factor, weights are normalized, samples outside the input get none.
struct Taps {
    /// Per output sample: the first input index and how many weights follow in `w`.
    span: Vec<(usize, usize)>,
    /// Every sample's weights, one after another (computed in f64, kept in f32 as jax
    /// computes them).
    w: Vec<f32>,
}

fn taps(input: usize, output: usize) -> Taps {
    let inv_scale = input as f64 / output as f64;
    let kernel_scale = inv_scale.max(1.0);
    let mut t = Taps {
        span: Vec::with_capacity(output),
        w: Vec::new(),
    };
    let mut one = Vec::new();
    for j in 0..output {
        one.clear();
        let sample = (j as f64 + 0.5) * inv_scale - 0.5;
        let mut first = 0;
        if (-0.5..=input as f64 - 0.5).contains(&sample) {
            let lo = ((sample - kernel_scale).floor().max(0.0)) as usize;
            let hi = ((sample + kernel_scale).ceil() as usize).min(input - 1);
            // Zero weights at the ends are dropped; inside the span none is zero.
            one.extend(
                (lo..=hi)
                    .map(|i| (i, (1.0 - (sample - i as f64).abs() / kernel_scale).max(0.0)))
                    .skip_while(|(_, v)| *v == 0.0),
            );
            while one.last().is_some_and(|(_, v)| *v == 0.0) {
                one.pop();
            }
            first = one.first().map_or(0, |(i, _)| *i);
            let sum: f64 = one.iter().map(|(_, v)| v).sum();
            if sum.abs() > 1000.0 * f32::EPSILON as f64 {
                one.iter_mut().for_each(|(_, v)| *v /= sum);
            } else {
                one.clear();
            }
        }
        t.span.push((first, one.len()));
        t.w.extend(one.iter().map(|(_, v)| *v as f32));
    }
    t
}

/// [`resize_with_pad`] as tables for the device op `Kernels::resize_pad_pixels`, which
/// computes `to_model_pixels(resize_with_pad(..))` from them bit for bit: where the resized
/// image lies in the `th × tw` output, the spans (per output row, then per output column: the
/// first input index, the number of taps, where their weights start) and the weights.
pub fn resize_tables(
    h: usize,
    w: usize,
    th: usize,
    tw: usize,
) -> (frt_kernels::Placement, Vec<i32>, Vec<f32>) {
    let (rh, rw) = resized(h, w, th, tw);
    let place = frt_kernels::Placement {
        rows: rh,
        cols: rw,
        top: (th - rh) / 2,
        left: (tw - rw) / 2,
    };
    let (mut spans, mut weights) = (Vec::new(), Vec::new());
    for t in [taps(h, rh), taps(w, rw)] {
        let mut at = weights.len();
        for &(first, n) in &t.span {
            spans.extend([first as i32, n as i32, at as i32]);
            at += n;
        }
        weights.extend(t.w);
    }
    (place, spans, weights)
}

/// The size of a `h × w` image resized to fit `th × tw` without distortion (openpi: `int()`
/// truncation; an extreme aspect ratio can leave 0 rows or columns).
fn resized(h: usize, w: usize, th: usize, tw: usize) -> (usize, usize) {
    let ratio = (w as f64 / tw as f64).max(h as f64 / th as f64);
    (
        ((h as f64 / ratio) as usize).min(th),
        ((w as f64 / ratio) as usize).min(tw),
    )
}

/// Resizes an `h × w × 3` uint8 image (HWC) to fit `th × tw` without distortion and pads it
/// with black to exactly `th × tw` (openpi's `resize_with_pad`).
pub fn resize_with_pad(src: &[u8], h: usize, w: usize, th: usize, tw: usize) -> Result<Vec<u8>> {
    if h == 0 || w == 0 || th == 0 || tw == 0 || src.len() != h * w * 3 {
        return Err(Error::BadInput {
            what: "image".into(),
            reason: format!("{} bytes for {h}×{w}×3 (target {th}×{tw})", src.len()),
        });
    }
    if (h, w) == (th, tw) {
        // Already the size: the resize is the identity (openpi's client-side resize returns
        // such images as they are).
        return Ok(src.to_vec());
    }
    // An extreme aspect ratio can leave 0 rows or columns: then the result is all padding.
    let (rh, rw) = resized(h, w, th, tw);
    let mut out = vec![0u8; th * tw * 3];
    if rh == 0 || rw == 0 {
        return Ok(out);
    }
    let (ty, tx) = (taps(h, rh), taps(w, rw));
    let (ph, pw) = ((th - rh) / 2, (tw - rw) / 2);
    // Separable, in f32 (as jax): rows first into one row of sums, then columns.
    let mut row = vec![0f32; w * 3];
    let mut ky = 0;
    const LANES: usize = 16;
    for (y, &(first, n)) in ty.span.iter().enumerate() {
        // Each run of LANES sums is kept in registers across the taps and stored once; every
        // sum is still 0 + a0·s0 + a1·s1 + …, in tap order.
        let (taps_y, rows) = (&ty.w[ky..ky + n], &src[first * w * 3..(first + n) * w * 3]);
        let mut chunks = row.chunks_exact_mut(LANES);
        for (c, r) in (&mut chunks).enumerate() {
            let mut acc = [0f32; LANES];
            for (t, &a) in taps_y.iter().enumerate() {
                let s: &[u8; LANES] = rows[t * w * 3 + c * LANES..][..LANES]
                    .try_into()
                    .expect("LANES values");
                for (acc, s) in acc.iter_mut().zip(s) {
                    *acc += a * *s as f32;
                }
            }
            r.copy_from_slice(&acc);
        }
        let done = w * 3 - chunks.into_remainder().len();
        for (x, r) in row[done..].iter_mut().enumerate() {
            *r = 0.0;
            for (t, &a) in taps_y.iter().enumerate() {
                *r += a * rows[t * w * 3 + done + x] as f32;
            }
        }
        ky += n;
        let line = &mut out[((y + ph) * tw + pw) * 3..((y + ph) * tw + pw + rw) * 3];
        let mut kx = 0;
        for (px, &(first, n)) in line.chunks_exact_mut(3).zip(&tx.span) {
            let mut v = [0f32; 3];
            // The taps' pixels and weights as two slices (one bounds check a pixel, not one a
            // tap); the same sums in the same order.
            let pixels = row[first * 3..(first + n) * 3].chunks_exact(3);
            for (p, &a) in pixels.zip(&tx.w[kx..kx + n]) {
                v[0] += a * p[0];
                v[1] += a * p[1];
                v[2] += a * p[2];
            }
            kx += n;
            for (o, v) in px.iter_mut().zip(v) {
                // Round half to even, then clamp: with integer bounds the same as clamping
                // first; and for a value in [0, 255], adding and taking away 2^23 rounds it to
                // an integer half to even (the spacing of f32 there is 1), without a call.
                let c = v.clamp(0.0, 255.0);
                *o = ((c + 8_388_608.0) - 8_388_608.0) as i32 as u8;
            }
        }
    }
    Ok(out)
}

/// One camera view in the model's range: values in [−1, 1] (HWC, three per pixel), made by
/// [`to_model_pixels`] (in range by construction) or checked by [`ModelImage::new`], so the
/// model takes it without checking the range again (its length it checks against its own
/// image size).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelImage(Vec<f32>);

/// The largest magnitude [`ModelImage::new`] accepts.
const IMAGE_LIMIT: f32 = 1.0 + 1e-6;

impl ModelImage {
    /// Values already in the model's range; an error names the first value outside
    /// [−1, 1] (by more than 1e-6, rounding of a caller's own scaling) or NaN.
    pub fn new(values: Vec<f32>) -> Result<ModelImage> {
        // Branch-free per block so it vectorizes (NaN fails the comparison); the position
        // only on failure.
        let in_range = values
            .chunks(64)
            .all(|b| b.iter().fold(true, |ok, x| ok & (x.abs() <= IMAGE_LIMIT)));
        if !in_range {
            let i = values
                .iter()
                .position(|x| x.is_nan() || x.abs() > IMAGE_LIMIT)
                .unwrap_or_default();
            return Err(Error::BadInput {
                what: "image".into(),
                reason: format!("value {} at {i} outside [-1, 1]", values[i]),
            });
        }
        Ok(ModelImage(values))
    }

    /// The values (HWC).
    pub fn values(&self) -> &[f32] {
        &self.0
    }
}

/// uint8 pixels to the model's range: `x / 255 · 2 − 1`.
pub fn to_model_pixels(img: &[u8]) -> ModelImage {
    ModelImage(img.iter().map(|&v| v as f32 / 255.0 * 2.0 - 1.0).collect())
}

/// `np.digitize(state, np.linspace(-1, 1, 257)[:-1]) - 1`: 256 bins over [−1, 1]; values
/// below −1 give −1, values at or above the last edge give 255. Non-finite values are an error.
pub fn discretize_state(state: &[f32]) -> Result<Vec<i32>> {
    state
        .iter()
        .enumerate()
        .map(|(i, &x)| state_bin(i, x))
        .collect()
}

/// The bin of element `i` of the state (see [`discretize_state`]).
fn state_bin(i: usize, x: f32) -> Result<i32> {
    if !x.is_finite() {
        return Err(Error::BadInput {
            what: "state".into(),
            reason: format!("element {i} is {x}"),
        });
    }
    // Bin edges -1 + 2k/256 for k in 0..256, compared as numpy does (f32 state vs f64 edges).
    let x = x as f64;
    let below = (0..256)
        .take_while(|k| -1.0 + 2.0 * *k as f64 / 256.0 <= x)
        .count();
    Ok(below as i32 - 1)
}

/// The pi05 prompt: `Task: {task}, State: {discretized state};\nAction: ` (the task trimmed,
/// underscores and newlines made spaces).
pub fn pi05_prompt(task: &str, normalized_state: &[f32]) -> Result<String> {
    let mut out = String::new();
    write_pi05_prompt(task, normalized_state, &mut out)?;
    Ok(out)
}

/// [`pi05_prompt`] written into `out` (replacing its contents): nothing is allocated once
/// `out` has held a prompt of this size.
pub fn write_pi05_prompt(task: &str, normalized_state: &[f32], out: &mut String) -> Result<()> {
    use std::fmt::Write;
    out.clear();
    out.push_str("Task: ");
    push_cleaned(task, out)?;
    out.push_str(", State: ");
    for (i, &x) in normalized_state.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        write!(out, "{}", state_bin(i, x)?).expect("writing to a String");
    }
    out.push_str(";\nAction: ");
    Ok(())
}

/// The task as Pi0's prompt holds it (trimmed, underscores and newlines made spaces), written
/// into `out` (replacing its contents).
pub fn write_pi0_task(task: &str, out: &mut String) -> Result<()> {
    out.clear();
    push_cleaned(task, out)
}

/// Appends the task as openpi cleans it: trimmed, underscores and newlines made spaces. An
/// empty task is an error.
fn push_cleaned(task: &str, out: &mut String) -> Result<()> {
    let task = task.trim();
    if task.is_empty() {
        return Err(Error::BadInput {
            what: "task".into(),
            reason: "empty".into(),
        });
    }
    out.extend(
        task.chars()
            .map(|c| if c == '_' || c == '\n' { ' ' } else { c }),
    );
    Ok(())
}

/// Normalization statistics of one quantity (openpi `NormStats`).
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
pub struct NormStats {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
    #[serde(default)]
    pub q01: Option<Vec<f32>>,
    #[serde(default)]
    pub q99: Option<Vec<f32>>,
}

/// `norm_stats.json`: statistics of the state and of the actions.
#[derive(Clone, Debug)]
pub struct Normalization {
    pub state: NormStats,
    pub actions: NormStats,
    /// Quantile normalization (`use_quantile_norm`, pi05's default) instead of mean/std.
    pub quantiles: bool,
}

impl NormStats {
    fn check(&self, what: &str) -> Result<()> {
        let bad = |r: String| Error::BadInput {
            what: format!("norm stats `{what}`"),
            reason: r,
        };
        if self.mean.is_empty() || self.mean.len() != self.std.len() {
            return Err(bad(format!(
                "mean has {} values, std {}",
                self.mean.len(),
                self.std.len()
            )));
        }
        for (name, v) in [
            ("mean", Some(&self.mean)),
            ("std", Some(&self.std)),
            ("q01", self.q01.as_ref()),
            ("q99", self.q99.as_ref()),
        ] {
            if let Some(v) = v {
                if v.len() != self.mean.len() || v.iter().any(|x| !x.is_finite()) {
                    return Err(bad(format!(
                        "`{name}` must hold {} finite values",
                        self.mean.len()
                    )));
                }
            }
        }
        // openpi divides by std + 1e-6, so a constant dimension (std 0) is valid; a negative
        // spread is not.
        if let Some((i, x)) = self.std.iter().enumerate().find(|(_, x)| **x < 0.0) {
            return Err(bad(format!("std[{i}] = {x} is negative")));
        }
        if let (Some(lo), Some(hi)) = (&self.q01, &self.q99) {
            if let Some(i) = (0..lo.len()).find(|&i| hi[i] < lo[i]) {
                return Err(bad(format!(
                    "q99[{i}] = {} is below q01[{i}] = {}",
                    hi[i], lo[i]
                )));
            }
        }
        Ok(())
    }

    fn quantiles(&self) -> Result<(&[f32], &[f32])> {
        match (&self.q01, &self.q99) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(Error::BadInput {
                what: "norm stats".into(),
                reason: "quantile normalization needs q01 and q99".into(),
            }),
        }
    }

    /// Normalizes the first `len(stats)` values of `x` in place (openpi `Normalize`).
    pub fn normalize(&self, x: &mut [f32], quantiles: bool) -> Result<()> {
        let n = x.len().min(self.mean.len());
        if quantiles {
            let (q01, q99) = self.quantiles()?;
            for ((v, lo), hi) in x[..n].iter_mut().zip(q01).zip(q99) {
                *v = (*v - lo) / (hi - lo + 1e-6) * 2.0 - 1.0;
            }
        } else {
            for ((v, m), sd) in x[..n].iter_mut().zip(&self.mean).zip(&self.std) {
                *v = (*v - m) / (sd + 1e-6);
            }
        }
        Ok(())
    }

    /// Unnormalizes in place (openpi `Unnormalize`): dimensions beyond the statistics are
    /// left as they are (mean/std are padded with 0/1).
    pub fn unnormalize(&self, x: &mut [f32], quantiles: bool) -> Result<()> {
        let n = x.len().min(self.mean.len());
        if quantiles {
            let (q01, q99) = self.quantiles()?;
            for ((v, lo), hi) in x[..n].iter_mut().zip(q01).zip(q99) {
                *v = (*v + 1.0) / 2.0 * (hi - lo + 1e-6) + lo;
            }
        } else {
            for (i, v) in x.iter_mut().enumerate() {
                let (m, sd) = if i < n {
                    (self.mean[i], self.std[i])
                } else {
                    (0.0, 1.0)
                };
                *v = *v * (sd + 1e-6) + m;
            }
        }
        Ok(())
    }
}

impl Normalization {
    /// Reads `norm_stats.json` (`{"norm_stats": {"state": {...}, "actions": {...}}}`).
    pub fn load(path: &Path, quantiles: bool) -> Result<Normalization> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, quantiles).map_err(|e| match e {
            Error::BadInput { reason, .. } => Error::BadCheckpoint {
                file: path.to_path_buf(),
                reason,
            },
            other => other,
        })
    }

    pub fn parse(text: &str, quantiles: bool) -> Result<Normalization> {
        #[derive(serde::Deserialize)]
        struct File {
            norm_stats: std::collections::HashMap<String, NormStats>,
        }
        let f: File = serde_json::from_str(text).map_err(|e| Error::BadInput {
            what: "norm_stats.json".into(),
            reason: e.to_string(),
        })?;
        let get = |k: &str| {
            f.norm_stats.get(k).cloned().ok_or_else(|| Error::BadInput {
                what: "norm_stats.json".into(),
                reason: format!("no `{k}` statistics"),
            })
        };
        let (state, actions) = (get("state")?, get("actions")?);
        state.check("state")?;
        actions.check("actions")?;
        if quantiles {
            state.quantiles()?;
            actions.quantiles()?;
        }
        Ok(Normalization {
            state,
            actions,
            quantiles,
        })
    }
}
