//! Log-mel features as faster-whisper computes them, which is what the reference decoder sees:
//! 80 Slaney-normalized mel bands (fmax 8 kHz) of the power spectrum of a 400-point STFT
//! (periodic Hann window, hop 160, centered with reflect padding) of the audio followed by
//! 160 zero samples; the last STFT frame is dropped; `log10(max(x, 1e-10))`, clamped to
//! `max − 8`, then `(x + 4) / 4`.
//!
//! Two details differ from the original openai/whisper frontend and are kept on purpose
//! (token-exact agreement with faster-whisper): the audio is not padded with 30 s of zeros
//! before the STFT (so the maximum is taken over the utterance only), and the encoder input
//! is the features without their last frame, padded with zeros *in the log-mel domain* to
//! 3000 frames.

use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};
use std::sync::Arc;

pub const N_FFT: usize = 400;
pub const HOP: usize = 160;
/// Frames of the encoder's 30 s window.
pub const N_FRAMES: usize = 3000;
const SAMPLE_RATE: f64 = 16_000.0;

/// The log-mel frontend (filters and FFT plan made once).
pub struct LogMel {
    n_mels: usize,
    /// `n_mels × (N_FFT/2 + 1)`, f32 as the reference uses them.
    filters: Vec<f32>,
    /// The bins where each filter is non-zero (a triangle spans a few bins).
    support: Vec<std::ops::Range<usize>>,
    window: Vec<f64>,
    fft: Arc<dyn Fft<f64>>,
}

/// Slaney-style mel filter bank between 0 Hz and the Nyquist frequency.
fn mel_filters(n_mels: usize) -> Vec<f32> {
    let bins = N_FFT / 2 + 1;
    // Mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above.
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    let hz_to_mel = |f: f64| {
        if f >= min_log_hz {
            min_log_mel + (f / min_log_hz).ln() / logstep
        } else {
            f / f_sp
        }
    };
    let mel_to_hz = |m: f64| {
        if m >= min_log_mel {
            min_log_hz * (logstep * (m - min_log_mel)).exp()
        } else {
            f_sp * m
        }
    };
    let max_mel = hz_to_mel(SAMPLE_RATE / 2.0);
    let freqs: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz(max_mel * i as f64 / (n_mels + 1) as f64))
        .collect();
    let mut w = vec![0f32; n_mels * bins];
    for m in 0..n_mels {
        let enorm = 2.0 / (freqs[m + 2] - freqs[m]);
        for k in 0..bins {
            let f = k as f64 * SAMPLE_RATE / N_FFT as f64;
            let lower = (f - freqs[m]) / (freqs[m + 1] - freqs[m]);
            let upper = (freqs[m + 2] - f) / (freqs[m + 2] - freqs[m + 1]);
            w[m * bins + k] = (lower.min(upper).max(0.0) * enorm) as f32;
        }
    }
    w
}

/// Index into `x` with numpy's "reflect" padding (the edge sample is not repeated).
fn reflect(i: isize, n: usize) -> usize {
    if n == 1 {
        return 0;
    }
    let period = 2 * (n as isize - 1);
    let mut j = i.rem_euclid(period);
    if j >= n as isize {
        j = period - j;
    }
    j as usize
}

/// Features of one utterance: `n_mels × frames`, mel-major (as the reference stores them).
pub struct Features {
    pub n_mels: usize,
    pub frames: usize,
    pub values: Vec<f32>,
}

impl LogMel {
    pub fn new(n_mels: usize) -> LogMel {
        let window = (0..N_FFT)
            .map(|n| 0.5 - 0.5 * (std::f64::consts::TAU * n as f64 / N_FFT as f64).cos())
            .collect();
        let filters = mel_filters(n_mels);
        let bins = N_FFT / 2 + 1;
        let support = (0..n_mels)
            .map(|m| {
                let row = &filters[m * bins..(m + 1) * bins];
                let lo = row.iter().position(|v| *v != 0.0).unwrap_or(0);
                let hi = row.iter().rposition(|v| *v != 0.0).map_or(lo, |i| i + 1);
                lo..hi
            })
            .collect();
        LogMel {
            n_mels,
            filters,
            support,
            window,
            fft: FftPlanner::new().plan_fft_forward(N_FFT),
        }
    }

    pub fn n_mels(&self) -> usize {
        self.n_mels
    }

    /// The features of 16 kHz mono `audio` (see the module docs).
    pub fn features(&self, audio: &[f32]) -> Features {
        let bins = N_FFT / 2 + 1;
        let n = audio.len() + HOP;
        let sample = |i: usize| {
            if i < audio.len() {
                audio[i] as f64
            } else {
                0.0
            }
        };
        let frames = n / HOP; // STFT frames (1 + n / HOP with centering) minus the dropped last one
        let mut power = vec![0f32; frames * bins];
        let mut buf = vec![Complex::new(0.0, 0.0); N_FFT];
        let mut scratch = vec![Complex::new(0.0, 0.0); self.fft.get_inplace_scratch_len()];
        for t in 0..frames {
            for (j, slot) in buf.iter_mut().enumerate() {
                let i = (t * HOP + j) as isize - (N_FFT / 2) as isize;
                *slot = Complex::new(sample(reflect(i, n)) * self.window[j], 0.0);
            }
            self.fft.process_with_scratch(&mut buf, &mut scratch);
            for k in 0..bins {
                let mag = buf[k].norm() as f32;
                power[t * bins + k] = mag * mag;
            }
        }
        let mut values = vec![0f32; self.n_mels * frames];
        for m in 0..self.n_mels {
            let r = self.support[m].clone();
            let f = &self.filters[m * bins + r.start..m * bins + r.end];
            for t in 0..frames {
                let p = &power[t * bins + r.start..t * bins + r.end];
                let e: f64 = f
                    .iter()
                    .zip(p)
                    .map(|(a, b)| (*a as f64) * (*b as f64))
                    .sum();
                values[m * frames + t] = (e as f32).max(1e-10).log10();
            }
        }
        let max = values.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        for v in &mut values {
            *v = ((*v).max(max - 8.0) + 4.0) / 4.0;
        }
        Features {
            n_mels: self.n_mels,
            frames,
            values,
        }
    }

    /// The encoder's input, time-major `[N_FRAMES, n_mels]`: the features without their last
    /// frame (at most the first `N_FRAMES`), zero-padded. Also returns the frames of content.
    pub fn encoder_input(&self, audio: &[f32]) -> (Vec<f32>, usize) {
        let f = self.features(audio);
        let content = f.frames.saturating_sub(1).min(N_FRAMES);
        let mut x = vec![0f32; N_FRAMES * self.n_mels];
        for t in 0..content {
            for m in 0..self.n_mels {
                x[t * self.n_mels + m] = f.values[m * f.frames + t];
            }
        }
        (x, content)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflect_matches_numpy() {
        // np.pad([0, 1, 2, 3], 3, mode="reflect") == [3, 2, 1, 0, 1, 2, 3, 2, 1, 0]
        let got: Vec<usize> = (-3..7).map(|i| reflect(i, 4)).collect();
        assert_eq!(got, vec![3, 2, 1, 0, 1, 2, 3, 2, 1, 0]);
    }

    #[test]
    fn filters_are_slaney_normalized_triangles() {
        let f = mel_filters(80);
        let bins = N_FFT / 2 + 1;
        for m in 0..80 {
            let row = &f[m * bins..(m + 1) * bins];
            assert!(
                row.iter().all(|v| *v >= 0.0) && row.iter().any(|v| *v > 0.0),
                "band {m}"
            );
        }
        // The first band rises from 0 Hz: bin 0 is 0, the peak is at its centre frequency.
        assert_eq!(f[0], 0.0);
    }
}
