//! Greedy decoding with the prompt, suppression and scores that faster-whisper uses with
//! `beam_size=1, temperature=0, without_timestamps=True` (which CTranslate2 carries out):
//!
//! * prompt `<|startoftranscript|>` (+ `<|en|><|transcribe|>` on multilingual models), then
//!   `<|notimestamps|>`; the no-speech probability is the softmax of the logits at the
//!   `<|startoftranscript|>` position, at `<|nocaptions|>` / `<|nospeech|>`;
//! * at every step (inside the step graph, on the device) the suppressed tokens (faster-whisper's list for `suppress_tokens=[-1]`)
//!   are set to −∞ before the log-softmax; at the first step also `" "` and
//!   `<|endoftext|>` (`suppress_blank`);
//! * the next token is the arg-max; decoding stops at `<|endoftext|>` or after
//!   `max_new_tokens`;
//! * `avg_logprob` is the sum of the chosen tokens' log-probabilities, `<|endoftext|>`
//!   included, divided by (tokens + 1).

use crate::error::Result;
use crate::model::{Suppression, WhisperModel};
use crate::tokenizer::Tokenizer;
use std::time::{Duration, Instant};

/// The result of one utterance.
#[derive(Clone, Debug)]
pub struct Transcript {
    /// Generated tokens, without the prompt and `<|endoftext|>`.
    pub tokens: Vec<u32>,
    pub text: String,
    pub avg_logprob: f32,
    pub no_speech_prob: f32,
    /// Frames of audio content the encoder saw (10 ms each).
    pub content_frames: usize,
    pub timings: Timings,
}

#[derive(Clone, Debug, Default)]
pub struct Timings {
    /// Features and encoder (host time until the decoder's first logits were read).
    pub encoder: Duration,
    /// Every decoder step, prompt included.
    pub decoder: Duration,
    pub steps: usize,
    pub total: Duration,
}

/// The prompt and suppression rules, derived from the tokenizer.
pub struct Decoder {
    pub tokenizer: Tokenizer,
    /// Suppressed at every step (faster-whisper's list for `suppress_tokens=[-1]`).
    pub suppress: Vec<u32>,
    /// Also suppressed at the first generated step (`suppress_blank`: `" "` and EOT).
    pub suppress_begin: Vec<u32>,
    prompt: Vec<u32>,
    logits: std::cell::RefCell<Vec<f32>>,
}

impl Decoder {
    pub fn new(tokenizer: Tokenizer, n_vocab: usize, multilingual: bool) -> Decoder {
        let sp = tokenizer.specials;
        let mut prompt = vec![sp.sot];
        if multilingual {
            prompt.extend(sp.english);
            prompt.push(sp.transcribe);
        }
        prompt.push(sp.no_timestamps);
        let mut suppress_begin = tokenizer.encode_word(" ");
        suppress_begin.push(sp.eot);
        Decoder {
            suppress: tokenizer.suppressed_tokens(),
            suppress_begin,
            tokenizer,
            prompt,
            logits: std::cell::RefCell::new(vec![0.0; n_vocab]),
        }
    }

    /// The prompt fed before the first generated token.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// What the model's step graphs must mask.
    pub fn suppression(&self) -> Suppression {
        Suppression {
            always: self.suppress.clone(),
            at_first: self.suppress_begin.clone(),
            first_position: self.prompt.len() - 1,
        }
    }

    /// Transcribes 16 kHz mono audio (at most 30 s are seen). The model must have been built
    /// with this decoder's [`suppression`](Self::suppression).
    pub fn transcribe(&self, model: &WhisperModel, audio: &[f32]) -> Result<Transcript> {
        let t0 = Instant::now();
        let content_frames = model.encode(audio)?;
        let sp = self.tokenizer.specials;
        // The prompt but its last token; the no-speech probability is read at the SOT step.
        let mut no_speech_prob = 0.0;
        let mut t_enc = None;
        for (p, &tok) in self.prompt[..self.prompt.len() - 1].iter().enumerate() {
            let mut logits = self.logits.borrow_mut();
            model.step_logits(p, tok, &mut logits)?;
            if t_enc.is_none() {
                t_enc = Some(t0.elapsed());
            }
            if tok == sp.sot {
                no_speech_prob = softmax_at(&logits, sp.no_speech as usize);
            }
        }
        let t_dec = Instant::now();
        let mut tokens = Vec::new();
        let mut sum_logprob = 0f64;
        let mut pos = self.prompt.len() - 1;
        let mut input = *self.prompt.last().expect("non-empty prompt");
        let max_new = model.options.max_new_tokens;
        let mut steps = self.prompt.len() - 1;
        loop {
            let (best, logprob) = model.step_greedy(pos, input)?;
            steps += 1;
            sum_logprob += logprob as f64;
            if best == sp.eot {
                break;
            }
            tokens.push(best);
            pos += 1;
            input = best;
            if tokens.len() >= max_new || pos >= model.positions {
                break;
            }
        }
        let decoder = t_dec.elapsed();
        let text = self.tokenizer.decode(&tokens);
        Ok(Transcript {
            avg_logprob: (sum_logprob / (tokens.len() + 1) as f64) as f32,
            tokens,
            text,
            no_speech_prob,
            content_frames,
            timings: Timings {
                encoder: t_enc.unwrap_or_default(),
                decoder,
                steps,
                total: t0.elapsed(),
            },
        })
    }
}

fn softmax_at(logits: &[f32], i: usize) -> f32 {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|v| ((v - m) as f64).exp()).sum();
    (((logits[i] - m) as f64).exp() / sum) as f32
}
