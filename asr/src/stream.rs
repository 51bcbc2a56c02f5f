//! Streaming speech recognition: a [`Segmenter`] cuts a live microphone stream into
//! utterances, and a [`Transcriber`] transcribes them on its own thread (and exec stream)
//! without blocking the caller, through bounded queues.
//!
//! ## Why this voice-activity detector
//!
//! Commands to a robot are short and arrive over steady machine noise (fans, motors,
//! ventilation). The detector is an energy detector with an adaptive noise floor:
//!
//! * 20 ms frames, high-passed at ~100 Hz (hum and rumble carry no speech information);
//! * the noise floor is the minimum of the smoothed frame energy over the last few seconds
//!   ("minimum statistics"): it follows a steady background up and down, and speech, which
//!   pauses between syllables, does not drag it up;
//! * speech starts when the energy exceeds the floor by `onset_db` for `min_speech_ms`, and
//!   ends after `hangover_ms` below `offset_db` (hysteresis, so words are not cut); a
//!   `pre_roll_ms` of audio before the onset is kept (onsets are soft); utterances are cut at
//!   `max_utterance_s` (Whisper sees 30 s at most); the first 300 ms only measure the
//!   background (speech starting at the very first sample is missed);
//! * nothing is learned and nothing runs on the GPU: it costs a few operations per sample,
//!   is deterministic, and its failure modes are plain (a loud non-speech sound becomes an
//!   utterance — Whisper's no-speech probability and the command grammar filter those).
//!
//! A neural VAD (e.g. Silero) rejects non-speech sounds better but needs a model at run time;
//! the energy detector is the dependable default and the segmenter is the seam to replace it.

use crate::Whisper;
use crate::audio::{self, SAMPLE_RATE};
use crate::decode::Transcript;
use crate::error::Result;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;

/// Settings of the [`Segmenter`].
#[derive(Clone, Debug)]
pub struct VadConfig {
    /// Rate of the samples pushed in (utterances come out at 16 kHz).
    pub sample_rate: u32,
    pub frame_ms: u32,
    /// Energy above the noise floor that starts speech.
    pub onset_db: f32,
    /// Energy above the noise floor that keeps speech going.
    pub offset_db: f32,
    /// Below `offset_db` this long ends the utterance.
    pub hangover_ms: u32,
    /// Above `onset_db` this long is needed to start one.
    pub min_speech_ms: u32,
    /// Audio kept before the onset.
    pub pre_roll_ms: u32,
    pub max_utterance_s: f32,
    /// Window of the noise-floor minimum.
    pub noise_window_s: f32,
    /// Floor of the noise floor (digital silence would make any click "speech").
    pub min_floor_db: f32,
}

impl Default for VadConfig {
    fn default() -> Self {
        VadConfig {
            sample_rate: SAMPLE_RATE,
            frame_ms: 20,
            onset_db: 10.0,
            offset_db: 6.0,
            hangover_ms: 400,
            min_speech_ms: 100,
            pre_roll_ms: 300,
            max_utterance_s: 15.0,
            noise_window_s: 3.0,
            min_floor_db: -70.0,
        }
    }
}

/// A stretch of speech, at 16 kHz.
#[derive(Clone, Debug)]
pub struct Utterance {
    pub samples: Vec<f32>,
    /// Seconds since the segmenter started.
    pub start_s: f64,
    pub end_s: f64,
}

/// Cuts a sample stream into utterances (see the module docs).
pub struct Segmenter {
    cfg: VadConfig,
    frame: usize,
    /// Samples of the frame being filled.
    pending: Vec<f32>,
    hp_prev_in: f32,
    hp_prev_out: f32,
    smoothed_db: f32,
    /// Smoothed frame energies of the noise window (for the running minimum).
    history: VecDeque<f32>,
    pre_roll: VecDeque<f32>,
    speech: Option<Vec<f32>>,
    above: u32,
    below: u32,
    frames_seen: u64,
    speech_start: u64,
}

/// Background measured at the start before any onset is accepted.
const CALIBRATION_MS: u32 = 300;

fn db(energy: f32) -> f32 {
    10.0 * energy.max(1e-12).log10()
}

impl Segmenter {
    pub fn new(cfg: VadConfig) -> Segmenter {
        let frame = (cfg.sample_rate as usize * cfg.frame_ms as usize / 1000).max(1);
        Segmenter {
            frame,
            pending: Vec::with_capacity(frame),
            hp_prev_in: 0.0,
            hp_prev_out: 0.0,
            smoothed_db: cfg.min_floor_db,
            history: VecDeque::new(),
            pre_roll: VecDeque::new(),
            speech: None,
            above: 0,
            below: 0,
            frames_seen: 0,
            speech_start: 0,
            cfg,
        }
    }

    pub fn config(&self) -> &VadConfig {
        &self.cfg
    }

    /// The current noise floor in dB (full scale).
    pub fn noise_floor_db(&self) -> f32 {
        self.history
            .iter()
            .cloned()
            .fold(f32::INFINITY, f32::min)
            .max(self.cfg.min_floor_db)
    }

    /// Whether an utterance is in progress.
    pub fn in_speech(&self) -> bool {
        self.speech.is_some()
    }

    fn frames(&self, ms: u32) -> u32 {
        (ms / self.cfg.frame_ms).max(1)
    }

    fn finish(&mut self) -> Option<Utterance> {
        let samples = self.speech.take()?;
        let rate = self.cfg.sample_rate as f64;
        let start_s = self.speech_start as f64 * self.frame as f64 / rate
            - self.cfg.pre_roll_ms as f64 / 1000.0;
        let end_s = self.frames_seen as f64 * self.frame as f64 / rate;
        self.above = 0;
        self.below = 0;
        Some(Utterance {
            samples: audio::resample(&samples, self.cfg.sample_rate, SAMPLE_RATE),
            start_s: start_s.max(0.0),
            end_s,
        })
    }

    /// Feeds samples; returns the utterances that ended within them. Non-finite samples are
    /// treated as silence.
    pub fn push(&mut self, samples: &[f32]) -> Vec<Utterance> {
        let mut out = Vec::new();
        for &x in samples {
            let x = if x.is_finite() {
                x.clamp(-1.0, 1.0)
            } else {
                0.0
            };
            self.pending.push(x);
            if self.pending.len() == self.frame {
                if let Some(u) = self.frame_done() {
                    out.push(u);
                }
            }
        }
        out
    }

    /// Ends the stream: the utterance in progress, if any.
    pub fn flush(&mut self) -> Option<Utterance> {
        self.finish()
    }

    fn frame_done(&mut self) -> Option<Utterance> {
        let frame = std::mem::take(&mut self.pending);
        self.frames_seen += 1;
        // First-order high-pass (~100 Hz at 16 kHz) and the frame energy.
        let a = (-std::f32::consts::TAU * 100.0 / self.cfg.sample_rate as f32).exp();
        let mut energy = 0.0;
        for &x in &frame {
            let y = a * (self.hp_prev_out + x - self.hp_prev_in);
            self.hp_prev_in = x;
            self.hp_prev_out = y;
            energy += y * y;
        }
        let e_db = db(energy / frame.len() as f32);
        self.smoothed_db = if self.frames_seen == 1 {
            e_db
        } else {
            0.7 * self.smoothed_db + 0.3 * e_db
        };
        // The first frames only measure the background.
        let calibrating = self.frames_seen <= self.frames(CALIBRATION_MS) as u64;
        let floor = self.noise_floor_db();
        let window = (self.cfg.noise_window_s * 1000.0 / self.cfg.frame_ms as f32) as usize;
        // Speech frames do not enter the floor's history (it tracks the background only).
        if self.speech.is_none() || e_db < floor + self.cfg.offset_db {
            self.history.push_back(self.smoothed_db);
            while self.history.len() > window.max(1) {
                self.history.pop_front();
            }
        }
        let mut ended = None;
        match &mut self.speech {
            None => {
                self.above = if !calibrating && e_db > floor + self.cfg.onset_db {
                    self.above + 1
                } else {
                    0
                };
                self.pre_roll.extend(&frame);
                let keep = (self.cfg.pre_roll_ms as usize * self.cfg.sample_rate as usize / 1000)
                    + self.frames(self.cfg.min_speech_ms) as usize * self.frame;
                while self.pre_roll.len() > keep {
                    self.pre_roll.pop_front();
                }
                if self.above >= self.frames(self.cfg.min_speech_ms) {
                    self.speech = Some(self.pre_roll.drain(..).collect());
                    self.speech_start = self.frames_seen - self.above as u64;
                    self.below = 0;
                }
            }
            Some(buf) => {
                buf.extend_from_slice(&frame);
                self.below = if e_db < floor + self.cfg.offset_db {
                    self.below + 1
                } else {
                    0
                };
                let too_long =
                    buf.len() as f32 >= self.cfg.max_utterance_s * self.cfg.sample_rate as f32;
                if self.below >= self.frames(self.cfg.hangover_ms) || too_long {
                    ended = self.finish();
                }
            }
        }
        self.pending = frame;
        self.pending.clear();
        ended
    }
}

/// An utterance and what became of it.
pub struct Transcribed {
    pub utterance: Utterance,
    pub result: Result<Transcript>,
}

/// Transcribes utterances on its own thread, on the stream its [`Whisper`] was built on
/// (a low-priority one, for a robot). `submit` never blocks: when the queue is full the
/// utterance is handed back. Results arrive on a bounded queue too; when the caller does not
/// take them, the thread waits (it never drops a result). Dropping it finishes the utterance in
/// progress, skips the queued ones and joins the thread.
pub struct Transcriber {
    jobs: Option<SyncSender<Utterance>>,
    results: Receiver<Transcribed>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Transcriber {
    /// Starts the thread; `queue` bounds both the pending utterances and the finished ones.
    pub fn spawn(whisper: Whisper, queue: usize) -> Transcriber {
        let (jobs, job_rx) = mpsc::sync_channel::<Utterance>(queue.max(1));
        let (res_tx, results) = mpsc::sync_channel::<Transcribed>(queue.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("frt-asr".into())
            .spawn(move || {
                for utterance in job_rx {
                    if stopping.load(Ordering::Acquire) {
                        break;
                    }
                    let result = whisper.transcribe(&utterance.samples);
                    if res_tx.send(Transcribed { utterance, result }).is_err() {
                        break;
                    }
                }
            })
            .expect("spawning the ASR thread");
        Transcriber {
            jobs: Some(jobs),
            results,
            stop,
            thread: Some(thread),
        }
    }

    /// Queues an utterance; gives it back when the queue is full (or the thread is gone).
    pub fn submit(&self, u: Utterance) -> std::result::Result<(), Utterance> {
        match self.jobs.as_ref().expect("open until dropped").try_send(u) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(u)) | Err(TrySendError::Disconnected(u)) => Err(u),
        }
    }

    /// A finished transcription, if one is ready.
    pub fn try_recv(&self) -> Option<Transcribed> {
        self.results.try_recv().ok()
    }

    /// Waits up to `timeout` for a finished transcription.
    pub fn recv_timeout(&self, timeout: std::time::Duration) -> Option<Transcribed> {
        self.results.recv_timeout(timeout).ok()
    }
}

impl Drop for Transcriber {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        drop(self.jobs.take());
        // Take results until the thread hangs up, so it is never stuck sending into a full
        // queue: it finishes the utterance in progress, skips the queued ones and ends.
        while self.results.recv().is_ok() {}
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(ms: u32, amp: f32) -> Vec<f32> {
        (0..ms * 16)
            .map(|i| amp * (i as f32 * 0.07).sin())
            .collect()
    }

    fn noise(ms: u32, amp: f32, seed: &mut u32) -> Vec<f32> {
        (0..ms * 16)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 17;
                *seed ^= *seed << 5;
                amp * (*seed as f32 / u32::MAX as f32 - 0.5)
            })
            .collect()
    }

    #[test]
    fn bursts_over_steady_noise_become_utterances() {
        let mut seed = 7;
        let mut sig = noise(2000, 0.02, &mut seed);
        let mut burst = tone(800, 0.3);
        for (b, n) in burst.iter_mut().zip(noise(800, 0.02, &mut seed)) {
            *b += n;
        }
        sig.extend(&burst);
        sig.extend(noise(1500, 0.02, &mut seed));
        sig.extend(&burst);
        sig.extend(noise(1500, 0.02, &mut seed));
        let mut seg = Segmenter::new(VadConfig::default());
        let mut utts = Vec::new();
        for chunk in sig.chunks(333) {
            utts.extend(seg.push(chunk));
        }
        utts.extend(seg.flush());
        assert_eq!(
            utts.len(),
            2,
            "{:?}",
            utts.iter()
                .map(|u| (u.start_s, u.end_s))
                .collect::<Vec<_>>()
        );
        assert!((utts[0].start_s - 1.7).abs() < 0.25, "{}", utts[0].start_s);
        assert!(utts[0].samples.len() as f32 / 16_000.0 > 0.8);
        // Noise alone (louder, but steady) never triggers.
        let mut seg = Segmenter::new(VadConfig::default());
        assert!(seg.push(&noise(6000, 0.2, &mut seed)).is_empty() && seg.flush().is_none());
    }

    #[test]
    fn long_speech_is_cut_and_garbage_is_silence() {
        let mut seg = Segmenter::new(VadConfig {
            max_utterance_s: 1.0,
            ..Default::default()
        });
        let mut sig = vec![0.0; 8000];
        sig.extend(tone(3500, 0.5));
        let utts = seg.push(&sig);
        assert!(utts.len() >= 2, "cut at the maximum length: {}", utts.len());
        assert!(utts.iter().all(|u| u.samples.len() <= 16_000 + 4000));
        let mut seg = Segmenter::new(VadConfig::default());
        assert!(seg.push(&[f32::NAN; 32_000]).is_empty() && seg.flush().is_none());
    }
}
