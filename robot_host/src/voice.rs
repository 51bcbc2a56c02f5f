//! Spoken commands: microphone audio → voice activity segmenter → Whisper on its own thread
//! (on a low-priority stream) → a confidence-gated decision → a command into the node.
//!
//! Gates: a stop word passes with a permissive confidence (a false stop is cheap); a subgoal
//! needs a stricter log-probability, a low no-speech probability and, when configured, a
//! phrase of the closed vocabulary; a resume word resumes motion only when the configuration
//! allows voice to do so.

use crate::config::{AsrConfig, normalize_words};
use crate::messages::{Audio, Command, Outbound, Source, Transcript};
use crate::node::{Clock, Inputs};
use crossbeam_channel::Receiver;
use frt_asr::stream::{Segmenter, Transcriber, VadConfig};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// What a transcript means for the robot.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Stop,
    Resume,
    Subgoal(String),
    Ignored(String),
}

fn has_phrase(text: &str, phrase: &str) -> bool {
    let p = normalize_words(phrase);
    !p.is_empty() && format!(" {text} ").contains(&format!(" {p} "))
}

/// The decision for one transcript (text, mean token log-probability, no-speech probability).
pub fn decide(text: &str, avg_logprob: f32, no_speech: f32, cfg: &AsrConfig) -> Decision {
    let t = normalize_words(text);
    if t.is_empty() {
        return Decision::Ignored("no words".into());
    }
    if cfg.stop_words.iter().any(|w| has_phrase(&t, w)) {
        return if avg_logprob >= cfg.min_logprob_stop {
            Decision::Stop
        } else {
            Decision::Ignored(format!(
                "stop word below the confidence gate ({avg_logprob:.2} < {:.2})",
                cfg.min_logprob_stop
            ))
        };
    }
    let confident =
        avg_logprob >= cfg.min_logprob_subgoal && no_speech <= cfg.max_no_speech_subgoal;
    if cfg.resume_words.iter().any(|w| normalize_words(w) == t) {
        return if !cfg.voice_may_resume {
            Decision::Ignored("voice may not resume motion (asr.voice_may_resume)".into())
        } else if confident {
            Decision::Resume
        } else {
            Decision::Ignored("resume below the confidence gate".into())
        };
    }
    if !confident {
        return Decision::Ignored(format!(
            "subgoal below the confidence gate (log-prob {avg_logprob:.2}, no-speech {no_speech:.2})"
        ));
    }
    if let Some(vocab) = &cfg.vocabulary {
        return match vocab.iter().find(|v| normalize_words(v) == t) {
            Some(v) => Decision::Subgoal(v.trim().to_string()),
            None => Decision::Ignored("not in the closed vocabulary".into()),
        };
    }
    Decision::Subgoal(t)
}

/// Mixes interleaved samples down to mono.
fn mono(a: &Audio) -> Vec<f32> {
    let c = a.channels.max(1) as usize;
    a.samples
        .chunks(c)
        .map(|f| f.iter().sum::<f32>() / c as f32)
        .collect()
}

/// How far the speech thread has come: the microphone messages it has taken in, and the
/// utterances submitted but not yet transcribed and acted on. A simulation on its own clock
/// waits for it to settle after each message ([`Progress::settle`]), so that a spoken command
/// takes effect at the same simulated time in every run.
#[derive(Debug, Default)]
pub struct Progress {
    processed: std::sync::atomic::AtomicU64,
    pending: std::sync::atomic::AtomicUsize,
}

impl Progress {
    /// Waits until `sent` messages are processed and every utterance they completed is
    /// transcribed and acted on, at most `limit`; false when the limit passed.
    pub fn settle(&self, sent: u64, limit: std::time::Duration) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let t = std::time::Instant::now();
        while self.processed.load(SeqCst) < sent || self.pending.load(SeqCst) > 0 {
            if t.elapsed() > limit {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        true
    }
}

/// The speech thread's body: runs until the audio channel closes or `stop` is set (then it
/// finishes the utterances already queued). Utterances go to the
/// transcriber (never blocking: a full queue drops the utterance); each transcript is
/// published with its decision, and accepted decisions become commands.
#[allow(clippy::too_many_arguments)]
pub fn run(
    audio: Receiver<Audio>,
    transcriber: Transcriber,
    cfg: AsrConfig,
    inputs: Inputs,
    out: crate::outbox::Outbox,
    clock: Arc<dyn Clock>,
    stop: &std::sync::atomic::AtomicBool,
    progress: &Progress,
) {
    use std::sync::atomic::Ordering::SeqCst;
    let mut seg: Option<(u32, Segmenter)> = None;
    let handle = |t: frt_asr::stream::Transcribed| {
        let tr = match t.result {
            Ok(tr) => tr,
            Err(e) => {
                out.send(Outbound::Transcript(Transcript {
                    stamp: clock.now(),
                    text: String::new(),
                    avg_logprob: f32::NEG_INFINITY,
                    no_speech_prob: 1.0,
                    decision: format!("ignored: transcription failed: {e}"),
                }));
                return;
            }
        };
        let d = decide(&tr.text, tr.avg_logprob, tr.no_speech_prob, &cfg);
        let decision = match &d {
            Decision::Stop => "stop".to_string(),
            Decision::Resume => "resume".to_string(),
            Decision::Subgoal(_) => "subgoal".to_string(),
            Decision::Ignored(why) => format!("ignored: {why}"),
        };
        let c = match d {
            Decision::Stop => Some(Command::Stop),
            Decision::Resume => Some(Command::Resume),
            Decision::Subgoal(g) => Some(Command::Subgoal(g)),
            Decision::Ignored(_) => None,
        };
        // Acted on first, reported after.
        if let Some(c) = c {
            let _ = inputs.command(c, Source::Voice);
        }
        out.send(Outbound::Transcript(Transcript {
            stamp: clock.now(),
            text: tr.text.trim().to_string(),
            avg_logprob: tr.avg_logprob,
            no_speech_prob: tr.no_speech_prob,
            decision,
        }));
    };
    let submit = |u| {
        if transcriber.submit(u).is_ok() {
            progress.pending.fetch_add(1, SeqCst);
        }
    };
    loop {
        let msg = if stop.load(std::sync::atomic::Ordering::Relaxed) {
            Err(crossbeam_channel::RecvTimeoutError::Disconnected)
        } else {
            audio.recv_timeout(std::time::Duration::from_millis(20))
        };
        match msg {
            Ok(a) => {
                let rate = a.sample_rate;
                if seg.as_ref().is_none_or(|(r, _)| *r != rate) {
                    if let Some((_, mut s)) = seg.take() {
                        if let Some(u) = s.flush() {
                            submit(u);
                        }
                    }
                    seg = Some((
                        rate,
                        Segmenter::new(VadConfig {
                            sample_rate: rate,
                            ..Default::default()
                        }),
                    ));
                }
                let s = &mut seg.as_mut().expect("set above").1;
                for u in s.push(&mono(&a)) {
                    submit(u);
                }
                progress.processed.fetch_add(1, SeqCst);
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                if let Some((_, mut s)) = seg.take() {
                    if let Some(u) = s.flush() {
                        submit(u);
                    }
                }
                // Finish what is queued, then stop.
                while progress.pending.load(SeqCst) > 0 {
                    let Some(t) = transcriber.recv_timeout(std::time::Duration::from_secs(60))
                    else {
                        break;
                    };
                    handle(t);
                    progress.pending.fetch_sub(1, SeqCst);
                }
                return;
            }
        }
        while let Some(t) = transcriber.try_recv() {
            handle(t);
            progress.pending.fetch_sub(1, SeqCst);
        }
    }
}

/// Loads the configured Whisper model and starts the speech thread for `node` ([`run`] with
/// its inputs and output channel). On a GPU Whisper shares the policy's context on the
/// speech-recognition stream (low priority); on the host backend it gets a context (an
/// executor thread) of its own, so that its long CPU ops do not sit between two of the
/// policy's. Returns the thread and its [`Progress`].
pub fn spawn(
    node: &crate::Node,
    audio: Receiver<Audio>,
    clock: Arc<dyn Clock>,
    stop: Arc<AtomicBool>,
) -> crate::Result<(std::thread::JoinHandle<()>, Arc<Progress>)> {
    let cfg = node.config();
    let asr = cfg
        .asr
        .clone()
        .ok_or_else(|| crate::Error::bad("asr", "no `asr` section in the configuration"))?;
    let host = node.policy().ctx().backend() == frt_exec::BackendKind::Host;
    let ctx = if host {
        frt_exec::Ctx::host()?
    } else {
        node.policy().ctx().clone()
    };
    let (_, _, priority) = cfg.streams.resolve(ctx.priority_range());
    let s = ctx.stream(priority)?;
    let options = frt_asr::ModelOptions {
        kernels: cfg.kernels,
        ..Default::default()
    };
    let mut whisper = frt_asr::Whisper::load(&ctx, &asr.model, s, options)?;
    // On the shared GPU, Whisper enqueues its replays between ticks.
    if !host {
        whisper.model.set_gate(Some(node.asr_gate()));
    }
    let transcriber = Transcriber::spawn(whisper, 4);
    let (inputs, out) = (node.inputs(), node.output_sender());
    let progress = Arc::new(Progress::default());
    let p = progress.clone();
    std::thread::Builder::new()
        .name("frt-voice".into())
        .spawn(move || run(audio, transcriber, asr, inputs, out, clock, &stop, &p))
        .map(|h| (h, progress))
        .map_err(|e| crate::Error::bad("speech thread", e.to_string()))
}
