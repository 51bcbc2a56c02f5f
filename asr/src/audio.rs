//! Audio in: WAV files of any sample rate, channel count and common sample format, down-mixed
//! to mono and resampled to Whisper's 16 kHz with a band-limited (Kaiser-windowed sinc)
//! resampler.

use crate::error::{Error, Result};

/// Whisper's sample rate.
pub const SAMPLE_RATE: u32 = 16_000;

/// Decoded audio: interleaved frames converted to f32 in [-1, 1].
#[derive(Clone, Debug)]
pub struct Wav {
    pub sample_rate: u32,
    pub channels: u16,
    /// Interleaved samples.
    pub samples: Vec<f32>,
}

impl Wav {
    /// Mono (the mean of the channels), at the file's rate.
    pub fn mono(&self) -> Vec<f32> {
        let c = self.channels as usize;
        self.samples
            .chunks_exact(c)
            .map(|f| f.iter().sum::<f32>() / c as f32)
            .collect()
    }

    /// Mono at 16 kHz.
    pub fn to_whisper(&self) -> Vec<f32> {
        resample(&self.mono(), self.sample_rate, SAMPLE_RATE)
    }

    pub fn duration_s(&self) -> f64 {
        self.samples.len() as f64 / self.channels as f64 / self.sample_rate as f64
    }
}

fn u16le(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32le(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads a WAV file (PCM 8/16/24/32-bit integers, IEEE float 32/64, plain or
/// WAVE_FORMAT_EXTENSIBLE).
/// The lowest sample rate speech is transcribed from (telephone speech).
pub const MIN_SAMPLE_RATE: u32 = 8000;

pub fn read_wav(path: &std::path::Path) -> Result<Wav> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_wav(&bytes).map_err(|e| match e {
        Error::BadAudio { reason, .. } => Error::audio(path.display().to_string(), reason),
        other => other,
    })
}

/// The largest magnitude of a float WAV sample accepted (clipped audio goes a little past 1).
pub const MAX_FLOAT_SAMPLE: f32 = 4.0;

/// Parses WAV bytes (see [`read_wav`]).
pub fn parse_wav(b: &[u8]) -> Result<Wav> {
    let bad = |r: &str| Error::audio("WAV", r);
    if b.len() < 12 || &b[0..4] != b"RIFF" || &b[8..12] != b"WAVE" {
        return Err(bad("not a RIFF/WAVE file"));
    }
    let mut at = 12;
    let mut fmt: Option<(u16, u16, u32, u16, u16)> = None; // tag, channels, rate, block, bits
    let mut data: Option<&[u8]> = None;
    while at + 8 <= b.len() {
        let id = &b[at..at + 4];
        let size = u32le(b, at + 4) as usize;
        let body = at + 8;
        let end = body
            .checked_add(size)
            .ok_or_else(|| bad("chunk size overflows"))?;
        match id {
            b"fmt " => {
                if size < 16 || end > b.len() {
                    return Err(bad("truncated fmt chunk"));
                }
                let mut tag = u16le(b, body);
                if tag == 0xFFFE {
                    if size < 40 {
                        return Err(bad("truncated WAVE_FORMAT_EXTENSIBLE fmt chunk"));
                    }
                    tag = u16le(b, body + 24); // the sub-format GUID starts with the format tag
                }
                fmt = Some((
                    tag,
                    u16le(b, body + 2),
                    u32le(b, body + 4),
                    u16le(b, body + 12),
                    u16le(b, body + 14),
                ));
            }
            b"data" => {
                // A truncated data chunk (common in streamed files) keeps what is there.
                data = Some(&b[body..end.min(b.len())]);
            }
            _ => {}
        }
        at = end + (size & 1);
    }
    let (tag, channels, rate, block, bits) = fmt.ok_or_else(|| bad("no fmt chunk"))?;
    let data = data.ok_or_else(|| bad("no data chunk"))?;
    if channels == 0 || rate == 0 {
        return Err(bad(&format!("{channels} channels at {rate} Hz")));
    }
    if rate > 768_000 || channels > 64 {
        return Err(bad(&format!(
            "implausible format: {channels} channels at {rate} Hz"
        )));
    }
    let width = (bits as usize).div_ceil(8);
    if width == 0 || block as usize != width * channels as usize {
        return Err(bad(&format!(
            "block align {block} does not match {channels} × {bits}-bit samples"
        )));
    }
    let n = data.len() / width;
    let n = n - n % channels as usize;
    if n == 0 {
        return Err(bad("no samples"));
    }
    let samples: Vec<f32> = match (tag, bits) {
        (1, 8) => data[..n]
            .iter()
            .map(|&v| (v as f32 - 128.0) / 128.0)
            .collect(),
        (1, 16) => data[..n * 2]
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0)
            .collect(),
        (1, 24) => data[..n * 3]
            .chunks_exact(3)
            .map(|c| (i32::from_le_bytes([0, c[0], c[1], c[2]]) >> 8) as f32 / 8_388_608.0)
            .collect(),
        (1, 32) => data[..n * 4]
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32 / 2_147_483_648.0)
            .collect(),
        (3, 32) => data[..n * 4]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        (3, 64) => data[..n * 8]
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        _ => {
            return Err(bad(&format!(
                "unsupported sample format (tag {tag}, {bits} bits)"
            )));
        }
    };
    if samples.iter().any(|v| !v.is_finite()) {
        return Err(bad("non-finite samples"));
    }
    // Float samples are audio in [-1, 1] (a little over is clipping, kept); far beyond it
    // the file is not audio, and resampling such values overflows to infinity.
    if let Some(v) = samples.iter().find(|v| v.abs() > MAX_FLOAT_SAMPLE) {
        return Err(bad(&format!(
            "a float sample of {v}; audio samples lie in [-1, 1] (at most ±{MAX_FLOAT_SAMPLE} accepted)"
        )));
    }
    Ok(Wav {
        sample_rate: rate,
        channels,
        samples,
    })
}

/// Zero crossings of the sinc kept on each side.
const ZERO_CROSSINGS: f64 = 32.0;
/// Kaiser window shape (≈ 90 dB stop band).
const KAISER_BETA: f64 = 8.6;
/// Pass band as a fraction of the lower Nyquist frequency.
const ROLLOFF: f64 = 0.95;

fn bessel_i0(x: f64) -> f64 {
    let (mut sum, mut term, mut k) = (1.0, 1.0, 1.0);
    while term > 1e-12 * sum {
        term *= (x / (2.0 * k)).powi(2);
        sum += term;
        k += 1.0;
    }
    sum
}

/// Band-limited resampling of mono audio (windowed-sinc interpolation, anti-aliased when
/// downsampling).
pub fn resample(x: &[f32], from: u32, to: u32) -> Vec<f32> {
    if from == to || x.is_empty() {
        return x.to_vec();
    }
    let ratio = to as f64 / from as f64;
    let cutoff = ROLLOFF * ratio.min(1.0); // in units of the input Nyquist frequency
    let half = ZERO_CROSSINGS / cutoff; // half-width in input samples
    let i0b = bessel_i0(KAISER_BETA);
    let n_out = ((x.len() as f64) * ratio).round() as usize;
    let mut out = Vec::with_capacity(n_out);
    for n in 0..n_out {
        let t = n as f64 / ratio;
        let lo = (t - half).ceil().max(0.0) as usize;
        let hi = ((t + half).floor() as usize).min(x.len() - 1);
        let mut acc = 0.0;
        for (k, &v) in x.iter().enumerate().take(hi + 1).skip(lo) {
            let d = k as f64 - t;
            let arg = std::f64::consts::PI * cutoff * d;
            let sinc = if arg.abs() < 1e-12 {
                1.0
            } else {
                arg.sin() / arg
            };
            let r = d / half;
            let w = bessel_i0(KAISER_BETA * (1.0 - r * r).max(0.0).sqrt()) / i0b;
            acc += v as f64 * cutoff * sinc * w;
        }
        out.push(acc as f32);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wav_bytes(tag: u16, channels: u16, rate: u32, bits: u16, data: &[u8]) -> Vec<u8> {
        let block = channels * bits.div_ceil(8);
        let mut v = Vec::new();
        v.extend_from_slice(b"RIFF");
        v.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
        v.extend_from_slice(b"WAVEfmt ");
        v.extend_from_slice(&16u32.to_le_bytes());
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&channels.to_le_bytes());
        v.extend_from_slice(&rate.to_le_bytes());
        v.extend_from_slice(&(rate * block as u32).to_le_bytes());
        v.extend_from_slice(&block.to_le_bytes());
        v.extend_from_slice(&bits.to_le_bytes());
        v.extend_from_slice(b"data");
        v.extend_from_slice(&(data.len() as u32).to_le_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn formats_decode_and_downmix() {
        let pcm16: Vec<u8> = [16384i16, -16384, 32767, 0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let w = parse_wav(&wav_bytes(1, 2, 8000, 16, &pcm16)).unwrap();
        assert_eq!((w.channels, w.sample_rate, w.samples.len()), (2, 8000, 4));
        assert_eq!(w.mono(), vec![0.0, 32767.0 / 65536.0]);
        let f32s: Vec<u8> = [0.25f32, -0.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            parse_wav(&wav_bytes(3, 1, 16000, 32, &f32s))
                .unwrap()
                .samples,
            vec![0.25, -0.5]
        );
        let pcm24 = [0x00, 0x00, 0x40, 0x00, 0x00, 0xC0];
        assert_eq!(
            parse_wav(&wav_bytes(1, 1, 16000, 24, &pcm24))
                .unwrap()
                .samples,
            vec![0.5, -0.5]
        );
    }

    #[test]
    fn corrupt_files_are_errors() {
        for (bytes, why) in [
            (b"RIFX0000WAVE".to_vec(), "not RIFF"),
            (wav_bytes(1, 0, 16000, 16, &[0, 0]), "zero channels"),
            (wav_bytes(1, 1, 16000, 16, &[]), "no samples"),
            (wav_bytes(2, 1, 16000, 16, &[0, 0]), "ADPCM"),
            (wav_bytes(3, 1, 16000, 32, &f32::NAN.to_le_bytes()), "NaN"),
            // Found by frt-fuzz: finite, but resampling it gave infinity.
            (
                wav_bytes(3, 1, 16000, 32, &3.0e38f32.to_le_bytes()),
                "huge float",
            ),
            (
                wav_bytes(3, 1, 16000, 64, &1e300f64.to_le_bytes()),
                "f64 beyond f32",
            ),
            (
                wav_bytes(1, 1, 16000, 16, &[0, 0])[..30].to_vec(),
                "truncated",
            ),
            (vec![], "empty"),
        ] {
            assert!(
                matches!(parse_wav(&bytes), Err(Error::BadAudio { .. })),
                "{why}"
            );
        }
    }

    #[test]
    fn resampling_keeps_a_tone_and_removes_what_cannot_be_represented() {
        let tone = |f: f64, rate: u32, n: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (std::f64::consts::TAU * f * i as f64 / rate as f64).sin() as f32)
                .collect()
        };
        // 1 kHz at 48 kHz -> 16 kHz: still a 1 kHz tone of the same amplitude.
        let y = resample(&tone(1000.0, 48_000, 48_000), 48_000, 16_000);
        assert_eq!(y.len(), 16_000);
        let want = tone(1000.0, 16_000, 16_000);
        let err = y[1000..15_000]
            .iter()
            .zip(&want[1000..15_000])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err < 2e-3, "max error {err}");
        // 12 kHz at 48 kHz is above the new Nyquist (8 kHz): it must vanish, not alias.
        let y = resample(&tone(12_000.0, 48_000, 48_000), 48_000, 16_000);
        let rms = (y[1000..15_000].iter().map(|v| v * v).sum::<f32>() / 14_000.0).sqrt();
        assert!(rms < 1e-3, "aliased energy {rms}");
        // Upsampling 22.05 kHz -> 16 kHz -> ratios that are not integers work too.
        assert_eq!(
            resample(&tone(440.0, 22_050, 22_050), 22_050, 16_000).len(),
            16_000
        );
    }
}
