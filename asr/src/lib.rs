//! # frt-asr — Whisper speech recognition
//!
//! The real Whisper models (tiny, base, small; English-only and multilingual) on exec graphs:
//! a log-mel frontend ([`mel`]), an encoder graph per utterance and decoder step graphs keyed
//! by position over preallocated KV caches ([`model`]), and greedy decoding that reproduces
//! faster-whisper (`beam_size=1, temperature=0, without_timestamps=True`) token for token
//! ([`decode`]). Checkpoints: CTranslate2 `model.bin` (faster-whisper's format) or Hugging
//! Face safetensors ([`weights`]); the tokenizer comes from `tokenizer.json`.
//!
//! [`stream`] turns a live sample stream into utterances (VAD) and transcribes them on a
//! given stream without blocking its caller.

pub mod audio;
pub mod config;
pub mod decode;
mod error;
pub mod mel;
pub mod model;
pub mod stream;
pub mod tokenizer;
pub mod weights;

pub use config::WhisperConfig;
pub use decode::{Decoder, Timings, Transcript};
pub use error::{Error, Result};
pub use model::{Gate, ModelOptions, Suppression, WhisperModel};

use frt_exec::{Ctx, Stream};
use std::path::Path;

/// A loaded Whisper model with its tokenizer: what a caller needs to transcribe.
pub struct Whisper {
    pub model: WhisperModel,
    pub decoder: Decoder,
}

impl Whisper {
    /// Loads a model folder (`model.bin` or `model.safetensors` + `config.json`, and
    /// `tokenizer.json`) and builds the model on stream `s` of `ctx`.
    pub fn load(ctx: &Ctx, dir: &Path, s: Stream, options: ModelOptions) -> Result<Whisper> {
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            return Err(Error::ModelFolder {
                dir: dir.to_path_buf(),
                reason: "no tokenizer.json".into(),
            });
        }
        let weights = weights::WhisperWeights::load(dir)?;
        let tokenizer = tokenizer::Tokenizer::from_file(&tok_path)?;
        Self::from_parts(ctx, s, &weights, tokenizer, options)
    }

    pub fn from_parts(
        ctx: &Ctx,
        s: Stream,
        weights: &weights::WhisperWeights,
        tokenizer: tokenizer::Tokenizer,
        options: ModelOptions,
    ) -> Result<Whisper> {
        let decoder = Decoder::new(
            tokenizer,
            weights.config.n_vocab,
            weights.config.is_multilingual(),
        );
        let model = WhisperModel::new(ctx, s, weights, options, &decoder.suppression())?;
        Ok(Whisper { model, decoder })
    }

    /// Transcribes 16 kHz mono samples.
    pub fn transcribe(&self, audio: &[f32]) -> Result<Transcript> {
        if audio.is_empty() {
            return Err(Error::BadAudio {
                what: "utterance".into(),
                reason: "no samples".into(),
            });
        }
        if audio.iter().any(|v| !v.is_finite()) {
            return Err(Error::BadAudio {
                what: "utterance".into(),
                reason: "non-finite samples".into(),
            });
        }
        self.decoder.transcribe(&self.model, audio)
    }

    /// Reads, down-mixes and resamples a WAV file, then transcribes it.
    /// Transcribes a WAV file (8 kHz or more: speech below that rate is not usable, and
    /// resampling from a few hertz would take seconds).
    pub fn transcribe_wav(&self, path: &Path) -> Result<Transcript> {
        let wav = audio::read_wav(path)?;
        if wav.sample_rate < audio::MIN_SAMPLE_RATE {
            return Err(Error::audio(
                path.display().to_string(),
                format!(
                    "{} Hz; at least {} Hz",
                    wav.sample_rate,
                    audio::MIN_SAMPLE_RATE
                ),
            ));
        }
        self.transcribe(&wav.to_whisper())
    }
}
