//! The node: inputs shared with the I/O side (latest-value slots for frames and state, a
//! bounded queue for subgoals, the stop latch) and the control loop that owns the policy.
//!
//! One tick: take the newest frame of every camera and the newest state → refuse stale,
//! future-stamped or missing observations → preprocess and write the inputs → replay vision,
//! prefix and every step, looking at the stop latch and the subgoal queue between two replays
//! → read the chunk → refuse non-finite values, align it in time (row k due at its
//! observation time + k·dt; `due_row` is the first not in the past), clamp and cap per-step
//! deltas from the command it takes over from (see [`crate::timeline`]) → look at the latch
//! once more → publish it and hand its rows to the timeline, under the latch's lock. A
//! subgoal arriving mid-tick abandons the tick at the next graph boundary (the next chunk
//! carries the new subgoal); a stop abandons it and publishes the halt chunk; the node then
//! stays halted until resumed. See [`crate::safety`] for the hold and the stop latch.

use crate::config::{ActionDim, ActionKind, Config, MissingCamera, PastRows};
use crate::error::{Error, Result};
use crate::frame::{CameraFrame, FramePool, RawImage, Rgb8, decode_compressed_limited};
use crate::messages::*;
use crate::outbox::{DroppedCount, Outbox};
use crate::policy::{Policy, PromptMaker};
use crate::safety::{Fault, Hold, StopLatch, Watchdog, fresh, panic_message};
use crate::timeline::{CommandClock, Handover, Timeline, first_due_row, guard_chunk};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use frt_vla::{PromptScratch, ViewImage};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The node's clock (seconds). Real time on a robot; a settable clock in simulation.
pub trait Clock: Send + Sync {
    fn now(&self) -> Stamp;
}

/// Wall-clock time since the Unix epoch.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Stamp {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    }
}

/// A clock that moves only when told (scripted runs, tests).
#[derive(Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn set(&self, t: Stamp) {
        self.0.store(t.to_bits(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Stamp {
        f64::from_bits(self.0.load(Ordering::SeqCst))
    }
}

#[derive(Default)]
struct Counters {
    bad_frames: AtomicU64,
    bad_states: AtomicU64,
    bad_audio: AtomicU64,
    bad_commands: AtomicU64,
    bad_clock: AtomicU64,
    missed_commands: AtomicU64,
    /// Microphone messages handed to the speech thread.
    audio_sent: AtomicU64,
}

struct Slot<T> {
    value: Mutex<(Option<T>, u64)>,
}

impl<T> Slot<T> {
    fn new() -> Self {
        Slot {
            value: Mutex::new((None, 0)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Option<T>, u64)> {
        self.value.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether the control thread has policy work in flight: speech recognition sharing the GPU
/// enqueues its replays between ticks, so that its kernels do not take SMs from a tick.
#[derive(Debug, Default)]
pub struct PolicyBusy(AtomicBool);

impl PolicyBusy {
    /// The longest a gated replay waits: speech recognition is never starved, even when ticks
    /// run back to back.
    pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

    pub fn is_busy(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Blocks while a tick is in flight, at most [`PolicyBusy::MAX_WAIT`].
    pub fn wait_idle(&self) {
        let t = std::time::Instant::now();
        while self.is_busy() && t.elapsed() < Self::MAX_WAIT {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
}

/// Marks a tick busy until dropped (every return path clears it).
struct BusyTick(Arc<PolicyBusy>);

impl BusyTick {
    fn new(b: &Arc<PolicyBusy>) -> BusyTick {
        b.0.store(true, Ordering::Release);
        BusyTick(b.clone())
    }
}

impl Drop for BusyTick {
    fn drop(&mut self) {
        self.0.0.store(false, Ordering::Release);
    }
}

/// The longest subgoal accepted, in bytes (UTF-8).
pub const MAX_SUBGOAL_BYTES: usize = 512;

/// Subgoals queued for the control loop at most (more are refused, never a stop: stops do not
/// queue).
pub const SUBGOAL_QUEUE: usize = 64;

/// Chunk buffers the node keeps for reuse (receivers that hold more chunks than this make
/// ticks allocate).
const CHUNK_POOL: usize = 8;

/// Recent chunks whose observation-to-publication delay sets the frozen prefix.
const DELAYS: usize = 8;

/// How often the control thread looks at a running replay, the stop latch and the subgoal
/// queue (a sleep: the wait allocates nothing, whichever thread runs it).
const POLL: std::time::Duration = std::time::Duration::from_micros(50);

/// The id of the configured initial subgoal; each accepted subgoal takes the next one.
pub const INITIAL_SUBGOAL_ID: u64 = 1;

/// Which kind of input a refused message was meant to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    Frame,
    State,
    Audio,
    Command,
    /// A `/clock` message (simulation time).
    Clock,
}

/// A fault drill (simulation scripts): a fault injected into the control thread, to check
/// that it ends in a halt and a non-zero exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drill {
    /// The control thread panics at its next tick.
    Panic,
    /// The next tick stalls (10 s), past the watchdog's deadline.
    Stall,
}

/// A subgoal for the control loop and the id its chunks will carry.
type Queued = (String, u64);

/// A camera: its name, its newest frame, and the host buffers its frames are decoded into.
struct Camera {
    name: String,
    slot: Slot<(Stamp, CameraFrame)>,
    pool: FramePool,
}

/// Checks a subgoal against the model when it arrives (tokenized with the worst-case state):
/// `Err` says why it cannot run.
pub type SubgoalCheck = Arc<dyn Fn(&str) -> std::result::Result<(), String> + Send + Sync>;

/// What the inputs need to know of the safety settings.
#[derive(Clone, Debug)]
struct Bounds {
    max_age: f64,
    max_future: f64,
    max_pixels: u64,
    dims: Arc<Vec<ActionDim>>,
}

/// A prompt made on the I/O side: the raw state and subgoal it was made from, and its ids.
struct MadePrompt {
    state: Vec<f32>,
    subgoal: String,
    ids: Vec<u32>,
}

/// What the transports write into (cloneable, `Send`): decoding and validation happen here,
/// on the caller's (I/O) thread; refused inputs are counted and never reach the policy.
#[derive(Clone)]
pub struct Inputs {
    cameras: Arc<Vec<Camera>>,
    joints: Arc<Vec<String>>,
    state: Arc<Slot<(Stamp, Vec<f32>)>>,
    /// The prompt tokens made for the newest state (see [`Inputs::state`]).
    prompt: Arc<Mutex<Option<MadePrompt>>>,
    prompt_maker: PromptMaker,
    /// The buffers the I/O side tokenizes in (states arrive on one topic: no contention).
    prompt_scratch: Arc<Mutex<PromptScratch>>,
    /// Whether states are tokenized on arrival (on by default; off for A/B comparisons).
    tokenize_states: Arc<AtomicBool>,
    subgoals: Sender<Queued>,
    /// The last accepted subgoal (pending or current) and its id; held while a subgoal is
    /// queued, so ids follow the queue's order.
    latest: Arc<Mutex<(u64, String)>>,
    check_subgoal: SubgoalCheck,
    latch: Arc<StopLatch>,
    fault: Arc<Fault>,
    drill: Arc<AtomicU8>,
    /// Lifecycle: inactive, resumes refused ([`Inputs::set_inactive`]).
    inactive: Arc<AtomicBool>,
    /// Wakes the control thread between ticks (a stop, a resume, a subgoal).
    wake: Sender<()>,
    audio: Option<Sender<Audio>>,
    clock: Arc<dyn Clock>,
    counters: Arc<Counters>,
    /// What the output channel dropped (for the status).
    dropped_outputs: DroppedCount,
    /// Each input's accepted messages and newest stamp: the cameras in configured order, the
    /// state, then the microphone when one is configured.
    meters: Arc<crate::status::Meters>,
    last_error: Arc<Mutex<String>>,
    /// Shared by every handle; replaced when limits change while running.
    bounds: Arc<Mutex<Bounds>>,
    /// Configurations with changed live fields, for the control thread, with the FP8
    /// calibration to load where it changed (see [`Inputs::reconfigure`]).
    reconfigure: Sender<(Config, Option<frt_vla::calibration::Calibration>)>,
    /// What an FP8 calibration of the model is recorded on (`None`: no FP8 path), and the
    /// calibration file in effect.
    calibration_model: Option<String>,
    calibration_file: Arc<Mutex<Option<std::path::PathBuf>>>,
    /// What the robot executes over time (the control thread merges chunks into it, the
    /// command stream and the holds read it). Lock order: the stop latch, then this.
    timeline: Arc<Mutex<Timeline>>,
}

impl Inputs {
    fn refuse(&self, counter: &AtomicU64, e: String) -> Error {
        counter.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut l) = self.last_error.lock() {
            *l = e.clone();
        }
        Error::bad("input", e)
    }

    /// Why a stamp cannot be used now (`None`: it can).
    fn stamp_problem(&self, stamp: Stamp) -> Option<String> {
        if !stamp.is_finite() {
            return Some(format!("stamp {stamp}"));
        }
        let ahead = stamp - self.clock.now();
        let max_future = self.bounds().max_future;
        (ahead > max_future).then(|| {
            format!(
                "stamped {ahead:.3} s ahead of the node clock (at most {} s)",
                max_future
            )
        })
    }

    fn poke(&self) {
        let _ = self.wake.try_send(());
    }

    /// A camera image: decoded to RGB8 and stored as that camera's newest frame.
    pub fn frame(&self, camera: &str, stamp: Stamp, image: &Image) -> Result<()> {
        let max_pixels = self.bounds().max_pixels;
        let Some((index, cam)) = self
            .cameras
            .iter()
            .enumerate()
            .find(|(_, c)| c.name == camera)
        else {
            return Err(self.refuse(
                &self.counters.bad_frames,
                format!("frame from unknown camera `{camera}`"),
            ));
        };
        if let Some(p) = self.stamp_problem(stamp) {
            return Err(self.refuse(&self.counters.bad_frames, format!("camera `{camera}`: {p}")));
        }
        // Decoded into one of the camera's host buffers: the policy resizes it with padding to
        // the model's input size and scales it to [-1, 1] on its device (as openpi does on the
        // host), in the tick. A raw image is converted straight into the buffer.
        let bad =
            |e: String| self.refuse(&self.counters.bad_frames, format!("camera `{camera}`: {e}"));
        let frame = match image {
            Image::Raw {
                encoding,
                width,
                height,
                step,
                data,
            } => {
                let raw = RawImage::check(encoding, *width, *height, *step, data)
                    .and_then(|raw| {
                        crate::frame::check_pixels(*width, *height, max_pixels).map(|()| raw)
                    })
                    .map_err(|e| bad(e.to_string()))?;
                cam.pool
                    .frame_with(*width, *height, |out| raw.convert(out))
                    .map_err(bad)?
            }
            Image::Compressed { format, data } => {
                let mut rgb = Rgb8::default();
                decode_compressed_limited(format, data, max_pixels, &mut rgb)
                    .map_err(|e| bad(e.to_string()))?;
                cam.pool.frame(&rgb).map_err(bad)?
            }
        };
        let mut v = cam.slot.lock();
        v.0 = Some((stamp, frame));
        v.1 += 1;
        self.meters.record(index, stamp);
        Ok(())
    }

    /// Robot state: reordered into the configured joint order; every joint must be present
    /// and finite (as the f32 the policy takes), the stamp not ahead of the node clock. Its
    /// prompt tokens (with the newest subgoal) are made here too, for the tick to copy.
    pub fn state(&self, js: &JointState) -> Result<()> {
        let bad = |e: String| Err(self.refuse(&self.counters.bad_states, e));
        if js.names.len() != js.position.len() {
            return bad(format!(
                "state: {} names, {} positions",
                js.names.len(),
                js.position.len()
            ));
        }
        if let Some(p) = self.stamp_problem(js.stamp) {
            return bad(format!("state: {p}"));
        }
        let mut v = Vec::with_capacity(self.joints.len());
        for j in self.joints.iter() {
            let Some(i) = js.names.iter().position(|n| n == j) else {
                return bad(format!(
                    "state: joint `{j}` missing ({} joints given)",
                    js.names.len()
                ));
            };
            let x = js.position[i];
            if !(x as f32).is_finite() {
                return bad(format!("state: joint `{j}` is {x} (not a finite f32)"));
            }
            v.push(x as f32);
        }
        // The prompt for this state and the newest subgoal, made here so that the control
        // thread only copies it (a tick whose subgoal or state differs makes its own).
        let made = self
            .tokenize_states
            .load(Ordering::Relaxed)
            .then(|| {
                let subgoal = self
                    .latest
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .1
                    .clone();
                let (mut normalized, mut ids) = (Vec::new(), Vec::new());
                let mut scratch = self
                    .prompt_scratch
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                self.prompt_maker
                    .make(&subgoal, &v, &mut normalized, &mut ids, &mut scratch)
                    .ok()
                    .map(|()| MadePrompt {
                        state: v.clone(),
                        subgoal,
                        ids,
                    })
            })
            .flatten();
        {
            let mut s = self.state.lock();
            s.0 = Some((js.stamp, v));
            s.1 += 1;
        }
        if let Some(made) = made {
            *self.prompt.lock().unwrap_or_else(|p| p.into_inner()) = Some(made);
        }
        self.meters.record(self.cameras.len(), js.stamp);
        Ok(())
    }

    /// Whether each robot state is tokenized into the prompt as it arrives (the default), or
    /// only in the tick (for comparisons: the chunks are the same either way).
    pub fn set_tokenize_states(&self, on: bool) {
        self.tokenize_states.store(on, Ordering::Relaxed);
    }

    /// A command for the control loop. A stop or a resume is latched (never refused, see
    /// [`StopLatch`]); a subgoal is checked and queued ([`Inputs::subgoal`]).
    pub fn command(&self, c: Command, source: Source) -> Result<()> {
        match c {
            Command::Subgoal(text) => self.subgoal(&text, source).map(|_| ()),
            Command::Stop => {
                self.latch.stop(self.clock.now());
                self.poke();
                Ok(())
            }
            Command::Resume if self.inactive.load(Ordering::SeqCst) => Err(self.refuse(
                &self.counters.bad_commands,
                "resume refused: the node is inactive (lifecycle); activate it".into(),
            )),
            Command::Resume => {
                self.latch.resume();
                self.poke();
                Ok(())
            }
        }
    }

    /// A managed node's inactive state (see [`crate::lifecycle`]): while set, a resume from
    /// any source is refused (the node stays halted, holding) — only `activate` clears it.
    pub fn set_inactive(&self, inactive: bool) {
        self.inactive.store(inactive, Ordering::SeqCst);
    }

    /// A new subgoal: refused when empty, over [`MAX_SUBGOAL_BYTES`], holding control
    /// characters, too long for the model's prompt with the worst-case state, or when
    /// [`SUBGOAL_QUEUE`] subgoals are already waiting; the same text as the last accepted
    /// subgoal is a no-op (its id is returned). Otherwise queued, and the id the policy's
    /// chunks will carry for it is returned.
    pub fn subgoal(&self, text: &str, _source: Source) -> Result<u64> {
        let t = text.trim();
        let refuse = |why: String| Err(self.refuse(&self.counters.bad_commands, why));
        let shown = || format!("{:?}", text.chars().take(40).collect::<String>());
        if t.is_empty()
            || t.len() > MAX_SUBGOAL_BYTES
            || t.chars().any(|ch| ch.is_control() && ch != '\n')
        {
            return refuse(format!(
                "subgoal refused: {} (empty, over {MAX_SUBGOAL_BYTES} bytes or control characters)",
                shown()
            ));
        }
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        if latest.1 == t {
            return Ok(latest.0);
        }
        if let Err(why) = (self.check_subgoal)(t) {
            return refuse(format!("subgoal refused: {}: {why}", shown()));
        }
        let id = latest.0 + 1;
        match self.subgoals.try_send((t.to_string(), id)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return refuse(format!(
                    "subgoal refused: {SUBGOAL_QUEUE} subgoals are already waiting"
                ));
            }
            Err(TrySendError::Disconnected(_)) => {
                return refuse("subgoal refused: the control loop has ended".into());
            }
        }
        *latest = (id, t.to_string());
        drop(latest);
        self.poke();
        Ok(id)
    }

    /// A command given as text on a topic: `stop`, `resume`, or `subgoal: <text>`.
    pub fn command_text(&self, text: &str) -> Result<()> {
        let t = text.trim();
        match t {
            "stop" => self.command(Command::Stop, Source::Typed),
            "resume" => self.command(Command::Resume, Source::Typed),
            _ => match t.strip_prefix("subgoal:") {
                Some(g) => self.command(Command::Subgoal(g.trim().to_string()), Source::Typed),
                None => Err(self.refuse(
                    &self.counters.bad_commands,
                    format!(
                        "unknown command {:?}",
                        t.chars().take(40).collect::<String>()
                    ),
                )),
            },
        }
    }

    /// Counts a message a transport could not decode (it never reaches the node).
    pub fn refuse_message(&self, kind: Refusal, reason: &str) {
        let c = &self.counters;
        let (counter, what) = match kind {
            Refusal::Frame => (&c.bad_frames, "frame"),
            Refusal::State => (&c.bad_states, "state"),
            Refusal::Audio => (&c.bad_audio, "audio"),
            Refusal::Command => (&c.bad_commands, "command"),
            Refusal::Clock => (&c.bad_clock, "/clock"),
        };
        let _ = self.refuse(counter, format!("{what}: {reason}"));
    }

    /// Microphone samples, for the speech thread (dropped when it falls behind).
    pub fn audio(&self, a: Audio) -> Result<()> {
        let bad = |e: String| Err(self.refuse(&self.counters.bad_audio, e));
        if a.channels == 0 || a.sample_rate < 8000 || a.sample_rate > 192_000 {
            return bad(format!(
                "audio: {} channels at {} Hz",
                a.channels, a.sample_rate
            ));
        }
        if a.samples.len() % a.channels as usize != 0 {
            return bad(format!(
                "audio: {} samples for {} channels",
                a.samples.len(),
                a.channels
            ));
        }
        if a.samples
            .iter()
            .any(|x| !x.is_finite() || x.abs() > 1.0 + 1e-3)
        {
            return bad("audio: samples outside [-1, 1]".into());
        }
        let stamp = a.stamp;
        match &self.audio {
            Some(tx) => tx
                .try_send(a)
                .or_else(|_| bad("audio: queue full".into()))?,
            None => return Ok(()),
        }
        self.counters.audio_sent.fetch_add(1, Ordering::SeqCst);
        self.meters.record(self.cameras.len() + 1, stamp);
        Ok(())
    }

    /// Fills in what the inputs count: refused inputs, missed commands, the last stop's last
    /// chunk, each input's count and age, and the last refusal when the control thread has
    /// no problem of its own to report.
    fn fill_status(&self, s: &mut Status) {
        let c = &self.counters;
        s.bad_frames = c.bad_frames.load(Ordering::Relaxed);
        s.bad_states = c.bad_states.load(Ordering::Relaxed);
        s.bad_audio = c.bad_audio.load(Ordering::Relaxed);
        s.bad_commands = c.bad_commands.load(Ordering::Relaxed);
        s.bad_clock = c.bad_clock.load(Ordering::Relaxed);
        s.missed_commands = c.missed_commands.load(Ordering::Relaxed);
        s.dropped_outputs = self.dropped_outputs.get();
        s.last_chunk_before_stop = self.latch.last_chunk_before_stop();
        s.inputs = self
            .meters
            .activity(self.clock.now(), self.bounds().max_age);
        if let Ok(l) = self.last_error.lock() {
            if !l.is_empty() && s.last_error.is_empty() {
                s.last_error = l.clone();
            }
        }
    }

    /// The node's clock.
    pub fn now(&self) -> Stamp {
        self.clock.now()
    }

    /// Microphone messages handed to the speech thread so far.
    pub fn audio_sent(&self) -> u64 {
        self.counters.audio_sent.load(Ordering::SeqCst)
    }

    /// A fatal problem anywhere in the process (a panic, a device fault, a watchdog overrun):
    /// recorded with its cause (the first one is kept) and latched as a stop, so that the
    /// control loop halts and ends. Returns whether it was the first fault.
    pub fn fault(&self, cause: impl Into<String>) -> bool {
        let cause = cause.into();
        tracing::error!(%cause, "fault");
        let first = self.fault.record(cause);
        self.latch.stop(self.clock.now());
        self.poke();
        first
    }

    /// The first fault's cause, if one was recorded.
    pub fn fault_cause(&self) -> Option<String> {
        self.fault.cause()
    }

    /// Injects a fault into the control thread (simulation scripts' fault drills).
    pub fn drill(&self, d: Drill) {
        let v = match d {
            Drill::Panic => 1,
            Drill::Stall => 2,
        };
        self.drill.store(v, Ordering::SeqCst);
        self.poke();
    }

    /// The bounds in effect (cheap: an `Arc` and numbers).
    fn bounds(&self) -> Bounds {
        self.bounds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A configuration whose live fields (see [`crate::params`]) changed, checked as a whole
    /// by the caller: the control thread takes it between two ticks. Refused when changes
    /// are already waiting. Its `model.calibration`, where it names another file than the one
    /// in effect (or with `reload_calibration`, the same file again), is read here and must be
    /// a calibration of this model (else refused, with the reason); the control thread then
    /// writes its scales into the model (no recapture).
    pub fn reconfigure(&self, config: Config, reload_calibration: bool) -> Result<()> {
        // A calibration file set (or set again: `reload_calibration`) is read and checked here,
        // on the caller's thread; the control thread only writes its scales.
        let mut file = self
            .calibration_file
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let cal = match &config.model.calibration {
            Some(path) if reload_calibration || file.as_ref() != Some(path) => {
                let bad = |why: String| {
                    Error::bad(
                        "parameters",
                        format!("model.calibration {}: {why}", path.display()),
                    )
                };
                let cal = frt_vla::calibration::Calibration::read(path)
                    .map_err(|e| bad(e.to_string()))?;
                match &self.calibration_model {
                    None => return Err(bad("this model has no FP8 path".into())),
                    Some(m) if *m != cal.model => {
                        return Err(bad(format!(
                            "recorded on {:?}, not on this node's model ({m:?})",
                            cal.model
                        )));
                    }
                    Some(_) => Some(cal),
                }
            }
            _ => None,
        };
        let path = config.model.calibration.clone();
        self.reconfigure
            .try_send((config, cal))
            .map_err(|_| Error::bad("parameters", "changes are already waiting; try again"))?;
        *file = path;
        drop(file);
        self.poke();
        Ok(())
    }

    fn timeline(&self) -> std::sync::MutexGuard<'_, Timeline> {
        self.timeline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What a halt commands now (see [`Hold`]): per dimension, from the latest measured
    /// state and (rule `current`) the command being executed.
    pub fn hold(&self) -> Hold {
        let b = self.bounds();
        let now = self.clock.now();
        let mut current = vec![0.0; b.dims.len()];
        let has = self.timeline().current(now, &b.dims, &mut current);
        let s = self.state.lock();
        Hold::of(
            &b.dims,
            s.0.as_ref(),
            has.then_some(&current[..]),
            now,
            b.max_age,
            b.max_future,
        )
    }

    /// The fixed-rate command due at `now`: the timeline's command (see
    /// [`Timeline::command_at`]), the hold once a stop has arrived (even before the control
    /// thread has acted on it), nothing before the first chunk or when the hold has no
    /// targets.
    pub fn command_at(&self, now: Stamp) -> Option<JointCommand> {
        let dims = &self.bounds().dims;
        let mut values = vec![0.0; dims.len()];
        let mut halt = None;
        let ran = self.latch.unless_stopped(|| {
            halt = self.timeline().command_at(now, dims, &mut values);
        });
        if !ran {
            values = self.hold().row()?.to_vec();
            halt = Some(true);
        }
        Some(JointCommand {
            stamp: now,
            values,
            halt: halt?,
        })
    }

    /// The last accepted subgoal and its id.
    fn latest_subgoal(&self) -> (u64, String) {
        self.latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The shape of the chunks a node publishes.
#[derive(Clone, Copy, Debug)]
struct Shape {
    horizon: usize,
    dims: usize,
    dt: f64,
    execution_horizon: usize,
    /// Whether plans are published (a JointTrajectory output is configured).
    plans: bool,
}

impl Shape {
    /// The halt chunk for `hold` (`horizon` rows of the held row, or none), stamped `now`,
    /// and the plan it commands (the same rows from `now` on).
    fn halt(
        &self,
        hold: &Hold,
        seq: u64,
        now: Stamp,
        subgoal: (Arc<str>, u64),
        started: Stamp,
    ) -> (ActionChunk, Plan) {
        let (rows, actions) = match hold {
            Hold::Row(r) => (self.horizon, r.repeat(self.horizon)),
            Hold::NoTarget(_) => (0, Vec::new()),
        };
        let actions = Arc::new(actions);
        let chunk = ActionChunk {
            stamp: now,
            seq,
            horizon: rows as u32,
            action_dim: self.dims as u32,
            actions: actions.clone(),
            dt: self.dt,
            subgoal: subgoal.0,
            subgoal_id: subgoal.1,
            halt: true,
            latency: (now - started).max(0.0),
            due_row: 0,
            execution_horizon: self.execution_horizon as u32,
        };
        let plan = Plan {
            stamp: now,
            dt: self.dt,
            action_dim: self.dims as u32,
            rows: actions,
            halt: true,
        };
        (chunk, plan)
    }
}

/// Publishes a halt chunk from outside the control thread (the watchdog, a fault while the
/// control thread is stuck or gone): the hold of the latest measured state, best effort.
#[derive(Clone)]
pub struct FaultHalt {
    inputs: Inputs,
    out: Outbox,
    seq: Arc<AtomicU64>,
    shape: Shape,
}

impl FaultHalt {
    /// Records the fault (latching a stop, so that no other chunk follows) and publishes the
    /// halt chunk.
    pub fn halt(&self, cause: &str) {
        self.inputs.fault(cause);
        let now = self.inputs.clock.now();
        let (id, text) = self.inputs.latest_subgoal();
        let hold = self.inputs.hold();
        self.inputs.timeline().hold(hold.row());
        let (c, plan) = self.shape.halt(
            &hold,
            self.seq.fetch_add(1, Ordering::SeqCst) + 1,
            now,
            (Arc::from(text), id),
            now,
        );
        self.out.send(Outbound::Chunk(c));
        if self.shape.plans {
            self.out.send(Outbound::Plan(plan));
        }
    }
}

/// `values` in a buffer of `pool` that no receiver holds any more (a new one, kept in the
/// pool while it has room, when every buffer is still held). Buffers keep their capacity: a
/// tick allocates nothing once the pool is warm.
fn pooled(pool: &mut Vec<Arc<Vec<f32>>>, values: &[f32]) -> Arc<Vec<f32>> {
    for a in pool.iter_mut() {
        if let Some(v) = Arc::get_mut(a) {
            if v.capacity() >= values.len() {
                v.clear();
                v.extend_from_slice(values);
                return a.clone();
            }
        }
    }
    let a = Arc::new(values.to_vec());
    if pool.len() < CHUNK_POOL {
        pool.push(a.clone());
    }
    a
}

/// The fixed-rate command stream (`execution.command_stream`): one command per period of the
/// node's clock, the one due then ([`Inputs::command_at`]).
pub struct CommandStream {
    inputs: Inputs,
    clock: CommandClock,
}

impl CommandStream {
    /// The command due at `now`, if one is (the first call starts the schedule); periods the
    /// caller missed are counted (`missed_commands`).
    pub fn poll(&mut self, now: Stamp) -> Option<JointCommand> {
        let missed = self.clock.missed;
        if !self.clock.due(now) {
            return None;
        }
        let c = &self.inputs.counters.missed_commands;
        c.fetch_add(self.clock.missed - missed, Ordering::Relaxed);
        self.inputs.command_at(now)
    }

    /// Seconds between two commands.
    pub fn period(&self) -> f64 {
        self.clock.period()
    }
}

/// What one tick did.
#[derive(Clone, Debug, PartialEq)]
pub enum TickOutcome {
    Published,
    /// Halted (a stop, or a missing camera with `missing_camera: halt`).
    Halted,
    /// Already halted: nothing ran.
    Idle,
    /// A subgoal change arrived mid-tick; the tick was dropped at a graph boundary.
    Abandoned,
    /// Missing, stale or future-stamped observations: nothing ran.
    Stale(String),
    /// The chunk was refused (non-finite values, a preprocessing error).
    Refused(String),
    /// A fatal device error: the node halted (best effort) and the control loop must end.
    Fault(String),
}

/// The control loop's state; runs on one thread.
pub struct Node {
    cfg: Config,
    policy: Policy,
    /// Set while a tick has policy work in flight (speech recognition waits for it to clear).
    busy: Arc<PolicyBusy>,
    clock: Arc<dyn Clock>,
    inputs: Inputs,
    subgoals: Receiver<Queued>,
    /// Configurations with changed live fields ([`Inputs::reconfigure`]).
    reconfigured: Receiver<(Config, Option<frt_vla::calibration::Calibration>)>,
    wake: Receiver<()>,
    out: Outbox,
    /// Completion markers of the last two replays (one replay stays queued ahead).
    done: [frt_exec::Event; 2],
    /// Counters and state; the subgoal and the counters of refused inputs are filled in by
    /// [`Node::status`].
    status: Status,
    /// Where the control thread posts its status for the status thread.
    board: Arc<crate::status::Board>,
    /// The current subgoal, shared with the chunks that carry it.
    subgoal: Arc<str>,
    /// The action dimensions (kind, limits, hold rule), shared with the inputs.
    dims: Arc<Vec<ActionDim>>,
    shape: Shape,
    /// The command in effect before the new chunk's first due row, which that row is capped
    /// against (scratch).
    anchor: Vec<f32>,
    chunk: Vec<f32>,
    chunk_pool: Vec<Arc<Vec<f32>>>,
    plan_pool: Vec<Arc<Vec<f32>>>,
    /// How long the last chunks took from observation to publication (seconds; the
    /// frozen prefix covers the longest).
    delays: [f64; DELAYS],
    /// The newest frame of each camera, as decoded (taken from its slot when a new one
    /// arrived).
    frames: Vec<Option<(Stamp, CameraFrame)>>,
    state: Vec<f32>,
    /// The prompt ids the I/O side made for this tick's state and subgoal (copied here), and
    /// how many ticks took theirs so.
    made_ids: Vec<u32>,
    prompts_made: u64,
    seq: Arc<AtomicU64>,
    /// The sequence number of the last policy chunk that went out (0: none).
    last_sent: u64,
    /// The clock at the last tick (a jump backwards resets the observations).
    last_now: Stamp,
    /// Where a live node records the start of each tick (`--record`).
    tap: Option<Arc<crate::record::Tap>>,
    watchdog: Arc<Watchdog>,
    hook: Option<StageHook>,
    /// While calibrating ([`Node::calibrate`]): the ranges recorded so far.
    calibrating: Option<frt_vla::calibration::RangeRecorder>,
    timings: TickTimings,
    rec: crate::observe::Recorder,
    /// When each of the last two replays was enqueued.
    enqueued: [std::time::Instant; 2],
    /// The policy stream's track in the process trace.
    replay_track: u64,
}

/// Where the last published tick's time went (host clock).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TickTimings {
    /// Taking the observations, preprocessing, tokens, writing the inputs.
    pub prepare: std::time::Duration,
    /// Replays enqueued until the last one finished.
    pub device: std::time::Duration,
    /// Reading the chunk, guards, the hold chunk, publishing.
    pub finish: std::time::Duration,
}

/// Called before each replay of a tick with the stage's index, and once more after the last
/// replay finished, before the chunk is read and published, with the number of stages
/// (scripted runs use it to deliver an event at an exact graph boundary).
pub type StageHook = Box<dyn FnMut(usize) + Send>;

/// The output side of a node.
pub struct Outputs(pub Receiver<Outbound>);

/// Whether an error means the device (or the model on it) can no longer be trusted: replays,
/// events and buffer transfers failing. Bad inputs are not fatal.
fn is_fatal(e: &Error) -> bool {
    matches!(
        e,
        Error::Exec(_)
            | Error::Policy(frt_vla::Error::Exec(_))
            | Error::Policy(frt_vla::Error::Kernels(_))
    )
}

impl Node {
    /// Builds the policy and the node; returns the node, its inputs and its outputs.
    pub fn new(
        cfg: Config,
        clock: Arc<dyn Clock>,
        audio: Option<Sender<Audio>>,
    ) -> Result<(Node, Inputs, Outputs)> {
        cfg.validate()?;
        cfg.validate_for_this_machine()?;
        let dims = Arc::new(cfg.action_dims()?);
        let policy = Policy::build(&cfg)?;
        // The horizon was checked against the configuration by `Policy::build`.
        let horizon = policy.spec().action_horizon;
        let d = cfg.control.action_dim;
        let timeline = Arc::new(Mutex::new(Timeline::new(
            horizon,
            d,
            cfg.control.dt,
            Handover::from_config(&cfg.execution),
        )));
        let (stx, srx) = crossbeam_channel::bounded(SUBGOAL_QUEUE);
        let (wtx, wrx) = crossbeam_channel::bounded(1);
        let (otx, orx) = Outbox::new();
        let (ctx, crx) = crossbeam_channel::bounded(2);
        let s = &cfg.safety;
        let inputs = Inputs {
            cameras: Arc::new(
                cfg.cameras
                    .iter()
                    .map(|c| Camera {
                        name: c.name.clone(),
                        slot: Slot::new(),
                        pool: FramePool::new(policy.ctx(), &c.name),
                    })
                    .collect(),
            ),
            joints: Arc::new(cfg.state.joints.clone()),
            state: Arc::new(Slot::new()),
            prompt: Arc::default(),
            prompt_maker: policy.prompt_maker(),
            prompt_scratch: Arc::default(),
            tokenize_states: Arc::new(AtomicBool::new(true)),
            subgoals: stx,
            latest: Arc::new(Mutex::new((
                INITIAL_SUBGOAL_ID,
                cfg.control.initial_subgoal.trim().to_string(),
            ))),
            check_subgoal: policy.subgoal_check(),
            latch: Arc::default(),
            fault: Arc::default(),
            drill: Arc::default(),
            inactive: Arc::default(),
            wake: wtx,
            audio,
            clock: clock.clone(),
            counters: Arc::default(),
            dropped_outputs: otx.dropped_count(),
            meters: Arc::new(crate::status::Meters::new(
                cfg.cameras
                    .iter()
                    .map(|c| (format!("camera {}", c.name), true))
                    .chain([("state".to_string(), true)])
                    .chain(cfg.audio.iter().map(|_| ("audio".to_string(), false)))
                    .collect(),
            )),
            last_error: Arc::default(),
            bounds: Arc::new(Mutex::new(Bounds {
                max_age: s.max_observation_age_ms / 1000.0,
                max_future: s.max_future_s,
                max_pixels: s.max_image_pixels,
                dims: dims.clone(),
            })),
            reconfigure: ctx,
            calibration_model: policy.calibration_model(),
            calibration_file: Arc::new(Mutex::new(cfg.model.calibration.clone())),
            timeline,
        };
        let shape = Shape {
            horizon,
            dims: d,
            dt: cfg.control.dt,
            execution_horizon: cfg.execution.execution_horizon.unwrap_or(horizon),
            plans: cfg.ros.joint_trajectory.is_some(),
        };
        let done = [policy.ctx().event()?, policy.ctx().event()?];
        let made_ids = PromptScratch::max_ids(MAX_SUBGOAL_BYTES, cfg.state.joints.len());
        let node = Node {
            status: Status {
                subgoal_id: INITIAL_SUBGOAL_ID,
                ..Default::default()
            },
            board: Arc::default(),
            subgoal: Arc::from(cfg.control.initial_subgoal.trim()),
            frames: cfg.cameras.iter().map(|_| None).collect(),
            chunk: vec![0.0; horizon * d],
            anchor: vec![0.0; d],
            dims,
            shape,
            chunk_pool: Vec::with_capacity(CHUNK_POOL),
            plan_pool: Vec::with_capacity(CHUNK_POOL),
            delays: [0.0; DELAYS],
            cfg,
            policy,
            clock,
            inputs: inputs.clone(),
            subgoals: srx,
            reconfigured: crx,
            wake: wrx,
            out: otx,
            done,
            state: Vec::new(),
            made_ids: Vec::with_capacity(made_ids),
            prompts_made: 0,
            seq: Arc::default(),
            last_sent: 0,
            last_now: f64::NEG_INFINITY,
            tap: None,
            watchdog: Arc::default(),
            hook: None,
            calibrating: None,
            timings: TickTimings::default(),
            rec: crate::observe::Recorder::new(0),
            enqueued: [std::time::Instant::now(); 2],
            replay_track: crate::observe::trace::stream("policy"),
            busy: Arc::default(),
        };
        Ok((node, inputs, Outputs(orx)))
    }

    /// The gate speech recognition on the policy's GPU passes before each replay: it waits
    /// while a tick is in flight (at most [`PolicyBusy::MAX_WAIT`]).
    pub fn asr_gate(&self) -> frt_asr::Gate {
        let busy = self.busy.clone();
        Arc::new(move || busy.wait_idle())
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The node's inputs (another handle on what the transports write into).
    pub fn inputs(&self) -> Inputs {
        self.inputs.clone()
    }

    /// The fixed-rate command stream, when `execution.command_stream` is configured.
    pub fn command_stream(&self) -> Option<CommandStream> {
        let cs = self.cfg.execution.command_stream.as_ref()?;
        Some(CommandStream {
            inputs: self.inputs.clone(),
            clock: CommandClock::new(cs.rate_hz),
        })
    }

    /// What publishes a halt chunk when the control thread cannot (see [`FaultHalt`]).
    pub fn fault_halt(&self) -> FaultHalt {
        FaultHalt {
            inputs: self.inputs.clone(),
            out: self.out.clone(),
            seq: self.seq.clone(),
            shape: self.shape,
        }
    }

    /// Keeps up to `events` timing events for a Chrome / Perfetto trace ([`Node::write_trace`]).
    pub fn enable_trace(&mut self, events: usize) {
        self.rec = crate::observe::Recorder::new(events);
    }

    /// Writes the recorded trace (Chrome trace JSON); returns the number of events.
    pub fn write_trace(&self, path: &std::path::Path) -> std::io::Result<usize> {
        self.rec.write_trace(path)
    }

    /// Latency histograms per stage: (name, p50 ms, p99 ms, count).
    pub fn latency_summary(&self) -> Vec<(String, f64, f64, u64)> {
        self.rec.summary()
    }

    /// Ticks whose prompt tokens the I/O side had made (see [`Inputs::state`]).
    pub fn prompts_made(&self) -> u64 {
        self.prompts_made
    }

    /// Where the last published tick's time went.
    pub fn last_timings(&self) -> TickTimings {
        self.timings
    }

    /// A sender into the node's output channel (the speech thread publishes transcripts).
    pub fn output_sender(&self) -> Outbox {
        self.out.clone()
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Sets the hook called before each replay (see [`StageHook`]).
    pub fn set_stage_hook(&mut self, hook: Option<StageHook>) {
        self.hook = hook;
    }

    /// From now on every inference also records the ranges of the model's FP8 GEMM inputs,
    /// taken at `percentile` (`frt-robot-host calibrate`): it runs through the 16-bit path
    /// outside the graphs (slower; the chunks are the same) as one stage, a stop that arrives
    /// meanwhile ending the tick with the halt chunk when it is done. A model with no FP8
    /// path: an error.
    pub fn calibrate(&mut self, percentile: f64) -> Result<()> {
        // No FP8 path (Pi0), or an FP8 model without the 16-bit weights recording runs on.
        if let Some(reason) = self.policy.calibrating_refused() {
            return Err(crate::Error::bad("calibrate", reason));
        }
        self.calibrating = Some(frt_vla::calibration::RangeRecorder::new(percentile)?);
        Ok(())
    }

    /// The calibration recorded since [`calibrate`](Self::calibrate) (which ends), or `None`
    /// when not calibrating; an error when no inference ran.
    pub fn calibration(&mut self) -> Option<Result<frt_vla::calibration::Calibration>> {
        let rec = self.calibrating.take()?;
        let model = self.policy.calibration_model().unwrap_or_default();
        Some(rec.finish(&model).map_err(Into::into))
    }

    /// A snapshot of the counters and state.
    /// (Totals only: no window, input rates not measured.)
    pub fn status(&self) -> Status {
        let mut s = self.status.clone();
        s.stamp = self.clock.now();
        s.subgoal = self.subgoal.to_string();
        s.latency = self.rec.summary();
        s.since_tick_s = self.board.since_tick();
        self.inputs.fill_status(&mut s);
        s
    }

    /// Posts the control thread's status on the board the status thread reads.
    fn post_status(&mut self, ticked: bool) {
        self.board.post(&self.status, &self.subgoal, ticked);
    }

    /// The status thread: every `ros.status_period_s` it publishes the posted status with the
    /// inputs' counters, each input's rate and age, and the window's counts, until `ended`.
    fn spawn_status(&self, ended: Arc<AtomicBool>) -> Option<std::thread::JoinHandle<()>> {
        let (board, inputs, out) = (self.board.clone(), self.inputs.clone(), self.out.clone());
        let r = &self.cfg.ros;
        let period = std::time::Duration::from_secs_f64(r.status_period_s);
        let mut window = crate::status::Window::new(
            std::time::Duration::from_secs_f64(r.status_window_s),
            std::time::Instant::now(),
        );
        let look = period.min(std::time::Duration::from_millis(50));
        std::thread::Builder::new()
            .name("frt-status".into())
            .spawn(move || {
                let mut next = std::time::Instant::now() + period;
                while !ended.load(Ordering::SeqCst) {
                    let now = std::time::Instant::now();
                    if now < next {
                        std::thread::sleep(look.min(next - now));
                        continue;
                    }
                    next = (next + period).max(now);
                    let _span = tracing::trace_span!("status").entered();
                    let (mut s, since_tick) = board.snapshot();
                    s.since_tick_s = since_tick;
                    s.stamp = inputs.clock.now();
                    inputs.fill_status(&mut s);
                    window.observe(now, &mut s);
                    out.send(Outbound::Status(Box::new(s)));
                }
            })
            .ok()
    }

    /// Publishes a status snapshot.
    pub fn publish_status(&self) {
        self.out.send(Outbound::Status(Box::new(self.status())));
    }

    /// Acts on what arrived: a stop halts (after a resume that came after it, the node runs
    /// again), then each queued subgoal is taken. Returns how a running tick ends because of
    /// it (`None`: it goes on).
    fn service(&mut self) -> Option<TickOutcome> {
        // A stop takes the timeline off the rows it was executing under the latch's lock: the
        // command stream never sees a handled stop with the old rows still in place.
        let (timeline, dims, now) = (&self.inputs.timeline, &self.dims, self.clock.now());
        let pending = self.inputs.latch.take_then(|p| {
            if p.stop.is_some() {
                timeline
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .stop(now, dims);
            }
        });
        let mut outcome = None;
        if let Some(arrived) = pending.stop {
            self.halt(arrived);
            outcome = Some(TickOutcome::Halted);
        }
        if pending.resume && self.inputs.fault.cause().is_none() {
            self.status.halted = false;
            self.inputs.timeline().clear();
        }
        while let Ok((text, id)) = self.subgoals.try_recv() {
            if *self.subgoal != *text {
                self.subgoal = Arc::from(text);
                self.status.subgoal_id = id;
                outcome.get_or_insert(TickOutcome::Abandoned);
            }
        }
        while let Ok((c, cal)) = self.reconfigured.try_recv() {
            if let Some(cal) = cal {
                self.take_calibration(&cal, &c);
            }
            self.take_live_fields(c);
        }
        outcome
    }

    /// Writes a new FP8 calibration's scales into the model (between two ticks, no recapture);
    /// on an error the scales stay as they were, and the error is the last problem.
    fn take_calibration(&mut self, cal: &frt_vla::calibration::Calibration, c: &Config) {
        match self.policy.set_calibration(cal) {
            Ok(()) => {
                self.cfg.model.calibration = c.model.calibration.clone();
                tracing::info!(
                    file = ?c.model.calibration,
                    ranges = cal.ranges.len(),
                    "parameters: new FP8 calibration in effect"
                );
            }
            Err(e) => {
                self.status.last_error = format!("parameters: model.calibration: {e}");
                tracing::error!("parameters: model.calibration not taken: {e}");
            }
        }
    }

    /// Takes the live fields of a configuration checked by [`crate::params`] (the limits,
    /// the delta caps, the observation age bound): from the next tick on for chunks, at once
    /// for the inputs' holds. Rows already on the timeline are left as they were guarded (a
    /// clamp could make a jump no delta cap allows); the next chunk takes over from them
    /// under the new limits, and a joint measured outside them is brought back as the guard
    /// does at start-up.
    fn take_live_fields(&mut self, c: Config) {
        let dims = match c.action_dims() {
            Ok(d) => Arc::new(d),
            Err(e) => {
                self.status.last_error = format!("parameters: {e}");
                return;
            }
        };
        self.cfg.safety = c.safety;
        self.cfg.actions = c.actions;
        self.dims = dims.clone();
        {
            let mut b = self.inputs.bounds.lock().unwrap_or_else(|p| p.into_inner());
            b.max_age = self.cfg.safety.max_observation_age_ms / 1000.0;
            b.dims = dims.clone();
        }
        tracing::info!("parameters: new limits in effect");
    }

    /// A tick that ends on an error: recorded as the last problem; a fatal one halts and
    /// records a fault (the control loop ends).
    fn refused(&mut self, e: Error) -> TickOutcome {
        let fatal = is_fatal(&e);
        let e = e.to_string();
        self.status.last_error = e.clone();
        if fatal {
            self.inputs.fault(format!("device: {e}"));
            self.service();
            return TickOutcome::Fault(e);
        }
        TickOutcome::Refused(e)
    }

    /// Applies every stop, resume and queued subgoal (between ticks).
    pub fn drain_commands(&mut self) {
        self.service();
    }

    /// Waits until the replay marked by `done[slot]` has finished, or a stop or a subgoal
    /// arrives: the outcome that abandons the tick is returned (after it was acted on).
    fn wait_replay(&mut self, stage: usize) -> Result<Option<TickOutcome>> {
        let slot = stage % 2;
        loop {
            if self.done[slot].query()? {
                let name = self.policy.stages()[stage].name();
                let now = std::time::Instant::now();
                self.rec.event(name, self.enqueued[slot], now);
                // The process trace: the replay on its stream's track (enqueued to seen done).
                crate::observe::trace::span(name, self.replay_track, self.enqueued[slot], now);
                return Ok(None);
            }
            if let Some(o) = self.service() {
                self.status.abandoned += 1;
                return Ok(Some(o));
            }
            std::thread::sleep(POLL);
        }
    }

    /// The halt: the hold (see [`Hold`]) written for the halt graph, the halt graph replayed
    /// on the highest-priority stream, and the halt chunk published (latency counted from
    /// `started`, when the stop arrived). The chunk is published even when the device part
    /// fails (that failure is recorded).
    fn halt(&mut self, started: Stamp) {
        let _span = tracing::debug_span!("halt").entered();
        let t_halt = std::time::Instant::now();
        self.status.halted = true;
        self.status.halts += 1;
        let d = self.cfg.control.action_dim;
        let horizon = self.policy.spec().action_horizon;
        let hold = self.inputs.hold();
        self.inputs.timeline().hold(hold.row());
        if let Hold::NoTarget(why) = &hold {
            self.status.holds_without_target += 1;
            tracing::warn!(why, "halt without targets");
        }
        if let Err(e) = self.device_halt(&hold, horizon, d) {
            self.status.last_error = format!("halt graph: {e}");
        }
        let now = self.clock.now();
        let (c, plan) = self.shape.halt(
            &hold,
            self.seq.fetch_add(1, Ordering::SeqCst) + 1,
            now,
            (self.subgoal.clone(), self.status.subgoal_id),
            started,
        );
        self.publish(Outbound::Chunk(c));
        if self.shape.plans {
            self.publish(Outbound::Plan(plan));
        }
        self.rec.span(
            crate::observe::Span::Halt,
            "halt",
            t_halt,
            std::time::Instant::now(),
        );
    }

    /// The device side of a halt: the halt graph on the highest-priority stream, after the
    /// hold it writes.
    fn device_halt(&mut self, hold: &Hold, horizon: usize, d: usize) -> Result<()> {
        let expect = hold.row().map(|r| r.repeat(horizon));
        if let Some(e) = &expect {
            self.policy.set_hold(e, d)?;
        }
        self.policy.halt(&mut self.chunk, d)?;
        if let Some(e) = expect {
            let close = self
                .chunk
                .iter()
                .zip(&e)
                .all(|(a, b)| (a - b).abs() <= 1e-3 * (1.0 + b.abs()));
            if !close {
                self.status.last_error = "halt graph output differs from the hold chunk".into();
            }
        }
        Ok(())
    }

    fn publish(&self, o: Outbound) {
        // A consumer that does not keep up loses messages (counted), halts last; the loop
        // never blocks on it.
        self.out.send(o);
    }

    /// Forgets every observation (the clock jumped backwards: their stamps mean nothing now).
    fn reset_observations(&mut self) {
        for (f, cam) in self.frames.iter_mut().zip(self.inputs.cameras.iter()) {
            *f = None;
            cam.slot.lock().0 = None;
        }
        self.inputs.state.lock().0 = None;
        self.inputs.timeline().clear();
        self.status.clock_resets += 1;
    }

    /// One control tick (see the module docs).
    pub fn tick(&mut self) -> TickOutcome {
        self.service();
        if self.status.halted {
            return TickOutcome::Idle;
        }
        self.status.ticks += 1;
        let _span = tracing::debug_span!("tick", n = self.status.ticks).entered();
        let started = self.clock.now();
        let t0 = std::time::Instant::now();
        let max_age = self.cfg.safety.max_observation_age_ms / 1000.0;
        let max_future = self.cfg.safety.max_future_s;
        if started < self.last_now - max_future {
            self.reset_observations();
        }
        self.last_now = started;
        let ok = |t: Stamp| fresh(t, started, max_age, max_future);
        // Newest observations.
        let mut oldest = f64::INFINITY;
        let mut missing = None;
        for (i, cam) in self.inputs.cameras.iter().enumerate() {
            {
                let mut v = cam.slot.lock();
                if v.0.is_some() {
                    self.frames[i] = v.0.take();
                }
            }
            match self.frames[i].as_ref().filter(|(t, _)| ok(*t)) {
                Some((t, _)) => oldest = oldest.min(*t),
                None if self.cfg.cameras[i].required => missing = Some(cam.name.clone()),
                None => {}
            }
        }
        let fresh_frame =
            |f: &Option<(Stamp, CameraFrame)>| f.as_ref().is_some_and(|(t, _)| ok(*t));
        if missing.is_some() || !self.frames.iter().any(fresh_frame) {
            let what = match missing {
                Some(cam) => format!("camera `{cam}` missing, stale or future-stamped"),
                None => "no fresh camera frame".to_string(),
            };
            // A robot executing chunks halts; before the first chunk (or after a resume)
            // nothing is moving: the tick only waits for the cameras.
            if self.cfg.safety.missing_camera == MissingCamera::Halt
                && self.inputs.timeline().is_running()
            {
                self.halt(started);
                self.status.last_error = format!("{what}: halted");
                return TickOutcome::Halted;
            }
            self.status.stale += 1;
            return TickOutcome::Stale(what);
        }
        {
            let v = self.inputs.state.lock();
            match v.0.as_ref().filter(|(t, _)| ok(*t)) {
                Some((t, s)) => {
                    oldest = oldest.min(*t);
                    self.state.clear();
                    self.state.extend_from_slice(s);
                }
                None => {
                    drop(v);
                    self.status.stale += 1;
                    return TickOutcome::Stale(
                        "robot state missing, older than the bound or future-stamped".into(),
                    );
                }
            }
        }
        // The frames as decoded: resized, padded and scaled on the policy's device.
        let mut frames: [Option<ViewImage>; frt_vla::MAX_VIEWS] = [None; frt_vla::MAX_VIEWS];
        for (f, slot) in frames.iter_mut().zip(&self.frames) {
            *f = slot
                .as_ref()
                .filter(|_| fresh_frame(slot))
                .map(|(_, f)| ViewImage::HostRgb8 {
                    width: f.width as usize,
                    height: f.height as usize,
                    data: &f.data,
                });
        }
        let frames = &frames[..self.frames.len().min(frt_vla::MAX_VIEWS)];
        let subgoal = self.subgoal.clone();
        // The prompt the I/O side made, when it was made from this state and subgoal.
        let made = {
            let p = self.inputs.prompt.lock().unwrap_or_else(|p| p.into_inner());
            match p.as_ref() {
                Some(m) if m.state == self.state && *m.subgoal == *subgoal => {
                    self.made_ids.clear();
                    self.made_ids.extend_from_slice(&m.ids);
                    true
                }
                _ => false,
            }
        };
        let _busy = BusyTick::new(&self.busy);
        if self.policy.inpaints() {
            let (rows, shift) = self.frozen_prefix(oldest);
            if let Err(e) = self.policy.freeze_prefix(rows, shift) {
                return self.refused(e);
            }
        }
        self.prompts_made += u64::from(made);
        let tokens = made.then_some(&self.made_ids[..]);
        if let Err(e) = self.policy.prepare(frames, &self.state, &subgoal, tokens) {
            return self.refused(e);
        }
        let t1 = std::time::Instant::now();
        match self.replay_all() {
            Ok(None) => {}
            Ok(Some(o)) => return o,
            Err(e) => return self.refused(e),
        }
        let t2 = std::time::Instant::now();
        let d = self.cfg.control.action_dim;
        if let Err(e) = self.policy.finish(&mut self.chunk, d) {
            return self.refused(e);
        }
        if self.chunk.iter().any(|x| !x.is_finite()) {
            self.status.non_finite += 1;
            self.status.last_error = "the policy produced non-finite actions".into();
            return TickOutcome::Refused("non-finite actions".into());
        }
        let dims = self.dims.clone();
        // openpi's `AbsoluteActions`: delta dimensions are relative to the observed state.
        for (k, dim) in dims.iter().enumerate().filter(|(_, dim)| dim.delta) {
            let x = self.state[dim.state_index];
            self.chunk
                .iter_mut()
                .skip(k)
                .step_by(d)
                .for_each(|a| *a += x);
        }
        // The time model: row k is due at `oldest + k·dt`; the rows before `due` are in the
        // past already.
        let horizon = self.policy.spec().action_horizon;
        let dt = self.cfg.control.dt;
        let now = self.clock.now();
        let due = first_due_row(oldest, now, dt);
        if due >= horizon {
            self.status.late_chunks += 1;
            self.status.last_error = format!(
                "chunk ready {:.3} s after its observation: all {horizon} rows in the past",
                now - oldest
            );
            return TickOutcome::Refused("every row in the past".into());
        }
        let t_due = oldest + due as f64 * dt;
        self.set_anchor(t_due, oldest, now);
        // A robot measured further outside a dimension's limits than one step can bring back:
        // no command is both within the limits and within a step of it. No chunk.
        if let Some((dim, a)) = dims.iter().zip(&self.anchor).find(|(dim, a)| {
            dim.max_delta
                .is_some_and(|cap| **a < dim.min - cap || **a > dim.max + cap)
        }) {
            self.status.outside_limits += 1;
            self.status.last_error = format!(
                "joint `{}` is at {a}, outside its limits [{}, {}] by more than one step ({}): no chunk",
                dim.joint,
                dim.min,
                dim.max,
                dim.max_delta.unwrap_or_default()
            );
            return TickOutcome::Refused("a joint outside its limits".into());
        }
        self.status.clamped += guard_chunk(&mut self.chunk, due, &self.anchor, &dims);
        let seq = self.seq.load(Ordering::SeqCst) + 1;
        let (first, stamp, due_row) = match self.cfg.execution.past_rows {
            PastRows::Mark => (0, oldest, due),
            PastRows::Drop => (due, t_due, 0),
        };
        let actions = pooled(&mut self.chunk_pool, &self.chunk[first * d..]);
        let chunk = Outbound::Chunk(ActionChunk {
            stamp,
            seq,
            horizon: (horizon - first) as u32,
            action_dim: d as u32,
            actions,
            dt,
            subgoal,
            subgoal_id: self.status.subgoal_id,
            halt: false,
            latency: (now - started).max(0.0),
            due_row: due_row as u32,
            execution_horizon: self.shape.execution_horizon as u32,
        });
        // The last look at the latch: a stop that arrived after the last replay withholds the
        // chunk (checked and published under the latch's lock). The chunk's rows from the
        // one due take over the timeline in the same step.
        let out = &self.out;
        let seq_counter = &self.seq;
        let (timeline, anchor, rows) =
            (&self.inputs.timeline, &self.anchor, &self.chunk[due * d..]);
        let (plan_pool, plans) = (&mut self.plan_pool, self.shape.plans);
        let mut changed = 0;
        let mut sent = false;
        let last_sent = self.last_sent;
        if !self.inputs.latch.publish(|| {
            seq_counter.store(seq, Ordering::SeqCst);
            // A chunk the output channel had no room for (a consumer behind) never reaches
            // the robot: it does not become the timeline either, so that the commands and the
            // next chunk's first row follow what the robot was given, and the latch keeps the
            // last chunk that did go out.
            sent = out.send(chunk);
            if !sent {
                return last_sent;
            }
            let mut tl = timeline.lock().unwrap_or_else(|p| p.into_inner());
            changed = tl.merge(rows, t_due, oldest, anchor, &dims);
            if plans {
                out.send(Outbound::Plan(Plan {
                    stamp: tl.start(),
                    dt,
                    action_dim: d as u32,
                    rows: pooled(plan_pool, tl.rows()),
                    halt: false,
                }));
            }
            seq
        }) {
            self.status.abandoned += 1;
            return self.service().unwrap_or(TickOutcome::Halted);
        }
        if !sent {
            let e = format!(
                "chunk {seq} dropped: the output channel is full (a consumer behind; {} outputs dropped)",
                self.out.dropped()
            );
            self.status.last_error = e.clone();
            return TickOutcome::Refused(e);
        }
        self.last_sent = seq;
        self.status.clamped += changed;
        self.status.chunks += 1;
        if self.status.chunks == 1 {
            // Start-up's figure: process start to the first action published.
            match crate::observe::since_process_start() {
                Some(d) => tracing::info!(
                    seconds_since_process_start = format!("{:.2}", d.as_secs_f64()),
                    "first action chunk published"
                ),
                None => tracing::info!("first action chunk published"),
            }
        }
        self.policy.keep_chunk();
        self.delays[self.status.chunks as usize % DELAYS] = now - oldest;
        let t3 = std::time::Instant::now();
        use crate::observe::Span;
        self.rec.span(Span::Prepare, "prepare", t0, t1);
        self.rec.span(Span::Device, "device", t1, t2);
        self.rec.span(Span::Finish, "finish", t2, t3);
        self.rec.span(Span::Tick, "tick", t0, t3);
        self.timings = TickTimings {
            prepare: t1 - t0,
            device: t2 - t1,
            finish: t3 - t2,
        };
        TickOutcome::Published
    }

    /// Replays every stage of the tick. One replay stays queued behind the running one (the
    /// device never waits for the host); between two replays, and while waiting, a stop or a
    /// subgoal is acted on at once: the outcome it gives ends the tick.
    fn replay_all(&mut self) -> Result<Option<TickOutcome>> {
        if self.calibrating.is_some() {
            // A calibration run (see `Node::calibrate`): the inference runs through the 16-bit
            // path outside the graphs, recording the FP8 inputs' ranges, as one stage (the
            // hooks see it as stage 0, then the end); the chunk is the same as the graphs
            // give. A stop that arrived meanwhile ends the tick, as between two replays.
            let n = self.policy.stages().len();
            if let Some(h) = &mut self.hook {
                h(0);
            }
            let rec = self.calibrating.as_mut().expect("checked above");
            self.policy.calibrate_inference(rec)?;
            self.policy.draw_noise();
            if let Some(o) = self.service() {
                self.status.abandoned += 1;
                return Ok(Some(o));
            }
            if let Some(h) = &mut self.hook {
                h(n);
            }
            return Ok(None);
        }
        let n = self.policy.stages().len();
        let s = self.policy.stream();
        for i in 0..n {
            if let Some(h) = &mut self.hook {
                h(i);
            }
            self.enqueued[i % 2] = std::time::Instant::now();
            let st = self.policy.stages()[i];
            self.policy.replay(st)?;
            if i + 1 == n {
                // The chunk's copy to the host runs behind the last stage: once that is seen
                // done, finishing the tick waits for no copy.
                self.policy.enqueue_read()?;
            }
            self.done[i % 2].record(s)?;
            if i == 0 {
                // The device is busy now: the next tick's noise is drawn meanwhile.
                self.policy.draw_noise();
            } else if let Some(o) = self.wait_replay(i - 1)? {
                return Ok(Some(o));
            }
        }
        let o = self.wait_replay(n - 1)?;
        if let Some(h) = &mut self.hook {
            h(n);
        }
        Ok(o)
    }

    /// The frozen prefix of a chunk observed at `t_obs`: (rows, shift). While the robot
    /// executes a chunk observed at most the observation age bound earlier, the new chunk's
    /// rows due before it will likely be published (⌈longest recent delay / dt⌉) are that
    /// chunk's rows from `shift` on (its rows due at the same times); otherwise none.
    fn frozen_prefix(&self, t_obs: Stamp) -> (usize, usize) {
        let max_age = self.cfg.safety.max_observation_age_ms / 1000.0;
        let dt = self.cfg.control.dt;
        let Some(t0) = self.inputs.timeline().last_observation() else {
            return (0, 0);
        };
        let gap = t_obs - t0;
        if !(0.0..=max_age).contains(&gap) {
            return (0, 0);
        }
        let delay = self.delays.iter().copied().fold(0.0, f64::max);
        let rows = (delay / dt - 1e-6).ceil().max(0.0) as usize;
        (rows, (gap / dt).round() as usize)
    }

    /// The command the new chunk's first due row (due at `t_due`; the chunk observed at
    /// `t_obs`) is capped against: the timeline's command it takes over from
    /// ([`Timeline::command_before`]) while the robot executes the chunk before it, observed
    /// at most the observation age bound earlier; otherwise (after start, a halt, a resume, a
    /// gap longer than that bound) the measured state (position and gripper dimensions) or
    /// zero (velocity).
    fn set_anchor(&mut self, t_due: Stamp, t_obs: Stamp, now: Stamp) {
        let max_age = self.cfg.safety.max_observation_age_ms / 1000.0;
        let tl = self
            .inputs
            .timeline
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let recent = tl
            .last_observation()
            .is_some_and(|t0| (0.0..=max_age).contains(&(t_obs - t0)));
        match tl.command_before(t_due, now).filter(|_| recent) {
            Some(r) => self.anchor.copy_from_slice(r),
            None => {
                for (a, dim) in self.anchor.iter_mut().zip(self.dims.iter()) {
                    *a = match dim.kind {
                        ActionKind::Velocity => 0.0,
                        _ => self.state[dim.state_index],
                    };
                }
            }
        }
    }

    /// Runs ticks at the configured rate until `stop` is set (the control thread's body), with
    /// a watchdog thread that halts and records a fault when a tick runs longer than
    /// `safety.watchdog_factor` periods. A panic in a tick, a fatal device error or a watchdog
    /// overrun ends the loop after a best-effort halt: `Err` carries the fault's cause.
    pub fn run(&mut self, stop: &AtomicBool) -> std::result::Result<(), String> {
        for r in crate::realtime::apply(self.cfg.control.cpu, self.cfg.control.realtime) {
            if let Err(why) = r {
                tracing::warn!(%why, "real-time settings");
                self.status.last_error = why;
            }
        }
        let period = std::time::Duration::from_secs_f64(1.0 / self.cfg.control.rate_hz);
        let ended = Arc::new(AtomicBool::new(false));
        let watchdog = self.spawn_watchdog(period, ended.clone());
        let commander = self.spawn_commander(ended.clone());
        self.post_status(false);
        self.board.post_latency(self.rec.summary());
        let status = self.spawn_status(ended.clone());
        let r = self.run_ticks(stop, period);
        ended.store(true, Ordering::SeqCst);
        for t in [watchdog, commander, status].into_iter().flatten() {
            let _ = t.join();
        }
        r
    }

    /// The command stream's thread: polls the node's clock a few times per period and
    /// publishes each command when it is due.
    fn spawn_commander(&self, ended: Arc<AtomicBool>) -> Option<std::thread::JoinHandle<()>> {
        let mut stream = self.command_stream()?;
        let (clock, out) = (self.clock.clone(), self.out.clone());
        let look = std::time::Duration::from_secs_f64(stream.period() / 8.0).clamp(
            std::time::Duration::from_micros(200),
            std::time::Duration::from_millis(5),
        );
        std::thread::Builder::new()
            .name("frt-commands".into())
            .spawn(move || {
                while !ended.load(Ordering::SeqCst) {
                    if let Some(c) = stream.poll(clock.now()) {
                        let _span = tracing::trace_span!("command").entered();
                        // Commands never fill more than their share of the output channel:
                        // the rest stays free for chunks, halt chunks above all.
                        if !out.send(Outbound::Command(c)) {
                            stream
                                .inputs
                                .counters
                                .missed_commands
                                .fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    std::thread::sleep(look);
                }
            })
            .ok()
    }

    fn spawn_watchdog(
        &self,
        period: std::time::Duration,
        ended: Arc<AtomicBool>,
    ) -> Option<std::thread::JoinHandle<()>> {
        let limit = period.mul_f64(self.cfg.safety.watchdog_factor);
        let w = self.watchdog.clone();
        let halt = self.fault_halt();
        let look = (limit / 8).clamp(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_millis(20),
        );
        std::thread::Builder::new()
            .name("frt-watchdog".into())
            .spawn(move || {
                while !ended.load(Ordering::SeqCst) {
                    if let Some(t) = w.running_for().filter(|t| *t > limit) {
                        halt.halt(&format!(
                            "watchdog: a tick has run for {:.0} ms (deadline {:.0} ms)",
                            t.as_secs_f64() * 1e3,
                            limit.as_secs_f64() * 1e3
                        ));
                        return;
                    }
                    std::thread::sleep(look);
                }
            })
            .ok()
    }

    fn run_ticks(
        &mut self,
        stop: &AtomicBool,
        period: std::time::Duration,
    ) -> std::result::Result<(), String> {
        let mut next = std::time::Instant::now();
        let mut n = 0u64;
        // The latency summary sorts its histograms: refreshed about once per second.
        let latency_every = (self.cfg.control.rate_hz.ceil() as u64).max(1);
        while !stop.load(Ordering::Relaxed) {
            self.step()?;
            n += 1;
            if n % latency_every == 0 {
                self.board.post_latency(self.rec.summary());
            }
            next += period;
            let now = std::time::Instant::now();
            if now > next {
                self.status.deadline_misses += 1;
                next = now;
            }
            // Between ticks a stop, a resume or a subgoal is acted on as it arrives.
            while let Some(left) = next.checked_duration_since(std::time::Instant::now()) {
                if self.wake.recv_timeout(left).is_err() {
                    break;
                }
                self.service();
                if self.inputs.fault_cause().is_some() {
                    break;
                }
            }
        }
        Ok(())
    }

    /// One tick as the control loop runs it: a pending fault drill, the tick under the
    /// watchdog's eye, and after a panic or a fault anywhere the halt (`Err`: the cause; the
    /// loop ends).
    pub fn step(&mut self) -> std::result::Result<TickOutcome, String> {
        if let Some(tap) = &self.tap {
            tap.tick_later(self.clock.now());
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.watchdog.enter();
            self.run_drill();
            let o = self.tick();
            self.watchdog.leave();
            o
        }));
        let o = match r {
            Ok(o) => o,
            Err(p) => {
                self.watchdog.leave();
                let cause = format!("the control thread panicked: {}", panic_message(&*p));
                self.end_in_fault(cause.clone());
                return Err(cause);
            }
        };
        if let Some(cause) = self.inputs.fault_cause() {
            self.end_in_fault(cause.clone());
            return Err(cause);
        }
        self.post_status(true);
        Ok(o)
    }

    /// Records the start of every tick from now on into `tap` (without blocking: the
    /// recording thread writes it).
    pub fn set_tap(&mut self, tap: Option<Arc<crate::record::Tap>>) {
        self.tap = tap;
    }

    /// The watchdog of [`Node::step`]s driven from outside [`Node::run`] (a simulation on its
    /// own clock): a thread that halts and records a fault when a step runs longer than
    /// `safety.watchdog_factor` control periods of real time, until `ended` is set.
    pub fn spawn_step_watchdog(
        &self,
        ended: Arc<AtomicBool>,
    ) -> Option<std::thread::JoinHandle<()>> {
        let period = std::time::Duration::from_secs_f64(1.0 / self.cfg.control.rate_hz);
        self.spawn_watchdog(period, ended)
    }

    /// Halts after a fault (the latch holds a stop): through the halt graph when the node
    /// still works, else from the latest measured state without the device.
    fn end_in_fault(&mut self, cause: String) {
        if self.inputs.fault_cause().is_none() {
            self.inputs.fault(cause.clone());
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.service()));
        if r.is_err() {
            self.fault_halt().halt(&cause);
        }
        self.status.last_error = cause;
        self.post_status(false);
        self.publish_status();
    }

    /// A fault drill injected by [`Inputs::drill`].
    fn run_drill(&self) {
        match self.inputs.drill.swap(0, Ordering::SeqCst) {
            1 => panic!("fault drill: a panic on the control thread"),
            2 => std::thread::sleep(std::time::Duration::from_secs(10)),
            _ => {}
        }
    }
}
