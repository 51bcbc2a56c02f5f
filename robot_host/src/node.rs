//! The node: inputs shared with the I/O side (latest-value slots for frames and state, a
//! bounded channel for commands) and the control loop that owns the policy.
//!
//! One tick: take the newest frame of every camera and the newest state → refuse stale or
//! missing observations → preprocess and write the inputs → replay vision, prefix and every
//! step, checking for commands between two replays → read the chunk → refuse non-finite
//! values, clamp, cap per-step deltas → publish. A subgoal arriving mid-tick abandons the tick
//! at the next graph boundary (the next chunk carries the new subgoal); a stop abandons it and
//! publishes the halt graph's chunk; the node then stays halted until resumed.

use crate::config::{ActionSpace, Config, MissingCamera};
use crate::error::{Error, Result};
use crate::frame::{Rgb8, decode_compressed, decode_raw};
use crate::messages::*;
use crate::policy::Policy;
use crossbeam_channel::{Receiver, Sender, TrySendError};
use frt_vla::ModelImage;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// Chunk buffers the node keeps for reuse (receivers that hold more chunks than this make
/// ticks allocate).
const CHUNK_POOL: usize = 8;

/// The id of the configured initial subgoal; each accepted subgoal takes the next one.
pub const INITIAL_SUBGOAL_ID: u64 = 1;

/// Which kind of input a refused message was meant to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    Frame,
    State,
    Audio,
    Command,
}

/// A command, where it came from, when it arrived, and the id a subgoal was given (0 for the
/// other commands).
type Queued = (Command, Source, Stamp, u64);

/// A camera's name and its newest frame.
type Camera = (String, Slot<(Stamp, ModelImage)>);

/// What the transports write into (cloneable, `Send`): decoding and validation happen here,
/// on the caller's (I/O) thread; refused inputs are counted and never reach the policy.
#[derive(Clone)]
pub struct Inputs {
    cameras: Arc<Vec<Camera>>,
    joints: Arc<Vec<String>>,
    state: Arc<Slot<(Stamp, Vec<f32>)>>,
    commands: Sender<Queued>,
    /// The id of the last accepted subgoal; held while a subgoal is queued, so ids follow the
    /// queue's order.
    subgoal_ids: Arc<Mutex<u64>>,
    audio: Option<Sender<Audio>>,
    clock: Arc<dyn Clock>,
    counters: Arc<Counters>,
    last_error: Arc<Mutex<String>>,
    /// The model's square input size (frames are preprocessed to it on arrival).
    image_side: usize,
}

impl Inputs {
    fn refuse(&self, counter: &AtomicU64, e: String) -> Error {
        counter.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut l) = self.last_error.lock() {
            *l = e.clone();
        }
        Error::bad("input", e)
    }

    /// A camera image: decoded to RGB8 and stored as that camera's newest frame.
    pub fn frame(&self, camera: &str, stamp: Stamp, image: &Image) -> Result<()> {
        let Some((_, slot)) = self.cameras.iter().find(|(n, _)| n == camera) else {
            return Err(self.refuse(
                &self.counters.bad_frames,
                format!("frame from unknown camera `{camera}`"),
            ));
        };
        if !stamp.is_finite() {
            return Err(self.refuse(
                &self.counters.bad_frames,
                format!("camera `{camera}`: stamp {stamp}"),
            ));
        }
        let mut rgb = Rgb8::default();
        let r = match image {
            Image::Raw {
                encoding,
                width,
                height,
                step,
                data,
            } => decode_raw(encoding, *width, *height, *step, data, &mut rgb),
            Image::Compressed { format, data } => decode_compressed(format, data, &mut rgb),
        };
        if let Err(e) = r {
            return Err(self.refuse(&self.counters.bad_frames, format!("camera `{camera}`: {e}")));
        }
        // Preprocessed here, once per frame, off the control thread: resize-with-pad to the
        // model's input size and scaling to [-1, 1], as openpi does.
        let side = self.image_side;
        let pixels = frt_vla::inputs::resize_with_pad(
            &rgb.data,
            rgb.height as usize,
            rgb.width as usize,
            side,
            side,
        )
        .map(|img| frt_vla::inputs::to_model_pixels(&img))
        .map_err(|e| self.refuse(&self.counters.bad_frames, format!("camera `{camera}`: {e}")))?;
        let mut v = slot.value.lock().unwrap_or_else(|p| p.into_inner());
        v.0 = Some((stamp, pixels));
        v.1 += 1;
        Ok(())
    }

    /// Robot state: reordered into the configured joint order; every joint must be present
    /// and finite.
    pub fn state(&self, js: &JointState) -> Result<()> {
        let bad = |e: String| Err(self.refuse(&self.counters.bad_states, e));
        if js.names.len() != js.position.len() {
            return bad(format!(
                "state: {} names, {} positions",
                js.names.len(),
                js.position.len()
            ));
        }
        if !js.stamp.is_finite() {
            return bad(format!("state: stamp {}", js.stamp));
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
            if !x.is_finite() {
                return bad(format!("state: joint `{j}` is {x}"));
            }
            v.push(x as f32);
        }
        let mut s = self.state.value.lock().unwrap_or_else(|p| p.into_inner());
        s.0 = Some((js.stamp, v));
        s.1 += 1;
        Ok(())
    }

    /// A command for the control loop (a subgoal is checked first, see [`Inputs::subgoal`]).
    pub fn command(&self, c: Command, source: Source) -> Result<()> {
        match c {
            Command::Subgoal(text) => self.subgoal(&text, source).map(|_| ()),
            c => self.queue((c, source, self.clock.now(), 0)),
        }
    }

    /// A new subgoal: refused when empty, over [`MAX_SUBGOAL_BYTES`] or holding control
    /// characters; otherwise queued, and the id the policy's chunks will carry for it is
    /// returned.
    pub fn subgoal(&self, text: &str, source: Source) -> Result<u64> {
        let t = text.trim();
        if t.is_empty()
            || t.len() > MAX_SUBGOAL_BYTES
            || t.chars().any(|ch| ch.is_control() && ch != '\n')
        {
            return Err(self.refuse(
                &self.counters.bad_commands,
                format!(
                    "subgoal refused: {:?}",
                    text.chars().take(40).collect::<String>()
                ),
            ));
        }
        let mut last = self.subgoal_ids.lock().unwrap_or_else(|p| p.into_inner());
        let id = *last + 1;
        let c = Command::Subgoal(t.to_string());
        self.queue((c, source, self.clock.now(), id))?;
        *last = id;
        Ok(id)
    }

    fn queue(&self, q: Queued) -> Result<()> {
        match self.commands.try_send(q) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => Err(self.refuse(
                &self.counters.bad_commands,
                "command queue full or closed".into(),
            )),
        }
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
        match &self.audio {
            Some(tx) => tx.try_send(a).or_else(|_| bad("audio: queue full".into())),
            None => Ok(()),
        }
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
    /// Missing or stale observations: nothing ran.
    Stale(String),
    /// The chunk was refused (non-finite values, a preprocessing error).
    Refused(String),
}

/// The control loop's state; runs on one thread.
pub struct Node {
    cfg: Config,
    policy: Policy,
    /// Set while a tick has policy work in flight (speech recognition waits for it to clear).
    busy: Arc<PolicyBusy>,
    clock: Arc<dyn Clock>,
    inputs: Inputs,
    commands: Receiver<Queued>,
    out: Sender<Outbound>,
    /// Completion markers of the last two replays (one replay stays queued ahead).
    done: [frt_exec::Event; 2],
    /// Counters and state; the subgoal and the counters of refused inputs are filled in by
    /// [`Node::status`].
    status: Status,
    /// The current subgoal, shared with the chunks that carry it.
    subgoal: Arc<str>,
    last_action: Option<Vec<f32>>,
    chunk: Vec<f32>,
    chunk_pool: Vec<Arc<Vec<f32>>>,
    /// The newest preprocessed frame of each camera (taken from its slot when a new one
    /// arrived).
    frames: Vec<Option<(Stamp, ModelImage)>>,
    state: Vec<f32>,
    seq: u64,
    hook: Option<StageHook>,
    timings: TickTimings,
    rec: crate::observe::Recorder,
    /// When each of the last two replays was enqueued.
    enqueued: [std::time::Instant; 2],
}

/// Trace names of the stages (vision, prefix, then the steps).
const STAGE_NAMES: [&str; 18] = [
    "vision", "prefix", "step 0", "step 1", "step 2", "step 3", "step 4", "step 5", "step 6",
    "step 7", "step 8", "step 9", "step 10", "step 11", "step 12", "step 13", "step 14", "step 15",
];

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

/// Called before each replay of a tick with the stage's index (scripted runs use it to
/// deliver an event at an exact graph boundary).
pub type StageHook = Box<dyn FnMut(usize) + Send>;

/// The output side of a node.
pub struct Outputs(pub Receiver<Outbound>);

impl Node {
    /// Builds the policy and the node; returns the node, its inputs and its outputs.
    pub fn new(
        cfg: Config,
        clock: Arc<dyn Clock>,
        audio: Option<Sender<Audio>>,
    ) -> Result<(Node, Inputs, Outputs)> {
        cfg.validate()?;
        let policy = Policy::build(&cfg)?;
        let (ctx, crx) = crossbeam_channel::bounded(64);
        let (otx, orx) = crossbeam_channel::bounded(1024);
        let inputs = Inputs {
            cameras: Arc::new(
                cfg.cameras
                    .iter()
                    .map(|c| (c.name.clone(), Slot::new()))
                    .collect(),
            ),
            joints: Arc::new(cfg.state.joints.clone()),
            state: Arc::new(Slot::new()),
            commands: ctx,
            subgoal_ids: Arc::new(Mutex::new(INITIAL_SUBGOAL_ID)),
            audio,
            clock: clock.clone(),
            counters: Arc::default(),
            last_error: Arc::default(),
            image_side: policy.config().siglip.image_size,
        };
        let horizon = policy.config().action_horizon;
        let d = cfg.control.action_dim;
        let done = [policy.ctx.event()?, policy.ctx.event()?];
        let mut node = Node {
            status: Status {
                subgoal_id: INITIAL_SUBGOAL_ID,
                ..Default::default()
            },
            subgoal: Arc::from(cfg.control.initial_subgoal.trim()),
            frames: vec![None; cfg.cameras.len()],
            chunk: vec![0.0; horizon * d],
            chunk_pool: Vec::with_capacity(CHUNK_POOL),
            cfg,
            policy,
            clock,
            inputs: inputs.clone(),
            commands: crx,
            out: otx,
            done,
            last_action: None,
            state: Vec::new(),
            seq: 0,
            hook: None,
            timings: TickTimings::default(),
            rec: crate::observe::Recorder::new(0),
            enqueued: [std::time::Instant::now(); 2],
            busy: Arc::default(),
        };
        if node.cfg.safety.action_space == ActionSpace::Velocity {
            let zeros = vec![0.0; horizon * d];
            node.policy.set_hold(&zeros, d)?;
        }
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

    /// Where the last published tick's time went.
    pub fn last_timings(&self) -> TickTimings {
        self.timings
    }

    /// A sender into the node's output channel (the speech thread publishes transcripts).
    pub fn output_sender(&self) -> Sender<Outbound> {
        self.out.clone()
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Sets the hook called before each replay (see [`StageHook`]).
    pub fn set_stage_hook(&mut self, hook: Option<StageHook>) {
        self.hook = hook;
    }

    /// A snapshot of the counters and state.
    pub fn status(&self) -> Status {
        let mut s = self.status.clone();
        let c = &self.inputs.counters;
        s.stamp = self.clock.now();
        s.subgoal = self.subgoal.to_string();
        s.bad_frames = c.bad_frames.load(Ordering::Relaxed);
        s.bad_states = c.bad_states.load(Ordering::Relaxed);
        s.bad_audio = c.bad_audio.load(Ordering::Relaxed);
        s.bad_commands = c.bad_commands.load(Ordering::Relaxed);
        s.latency = self.rec.summary();
        if let Ok(l) = self.inputs.last_error.lock() {
            if !l.is_empty() && s.last_error.is_empty() {
                s.last_error = l.clone();
            }
        }
        s
    }

    /// Publishes a status snapshot.
    pub fn publish_status(&self) {
        let _ = self.out.try_send(Outbound::Status(self.status()));
    }

    fn publish(&self, o: Outbound) {
        // A consumer that does not keep up loses messages; the loop never blocks on it.
        let _ = self.out.try_send(o);
    }

    /// Applies one command; returns how a running tick ends because of it (`None`: it goes on).
    fn apply(&mut self, (c, _, arrived, subgoal_id): Queued) -> Option<TickOutcome> {
        match c {
            Command::Subgoal(text) => {
                self.subgoal = Arc::from(text);
                self.status.subgoal_id = subgoal_id;
                Some(TickOutcome::Abandoned)
            }
            Command::Stop => {
                if let Err(e) = self.halt(arrived) {
                    self.status.last_error = format!("halt: {e}");
                }
                Some(TickOutcome::Halted)
            }
            Command::Resume => {
                self.status.halted = false;
                None
            }
        }
    }

    /// A tick that ends on an error: recorded as the last problem.
    fn refused(&mut self, e: impl std::fmt::Display) -> TickOutcome {
        self.status.last_error = e.to_string();
        TickOutcome::Refused(e.to_string())
    }

    /// Applies every queued command (between ticks).
    pub fn drain_commands(&mut self) {
        while let Ok(q) = self.commands.try_recv() {
            self.apply(q);
        }
    }

    /// Waits until the replay marked by `done[slot]` has finished, or a command arrives: the
    /// command that abandons the tick is returned (after it was applied).
    fn wait_replay(&mut self, stage: usize) -> Result<Option<TickOutcome>> {
        let slot = stage % 2;
        loop {
            if self.done[slot].query()? {
                let name = STAGE_NAMES.get(stage).copied().unwrap_or("step");
                self.rec
                    .event(name, self.enqueued[slot], std::time::Instant::now());
                return Ok(None);
            }
            // Wakes at once on a command; else looks at the replay again shortly.
            match self
                .commands
                .recv_timeout(std::time::Duration::from_micros(50))
            {
                Ok(q) => {
                    if let Some(o) = self.apply(q) {
                        self.status.abandoned += 1;
                        return Ok(Some(o));
                    }
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    self.done[slot].synchronize()?;
                    return Ok(None);
                }
            }
        }
    }

    /// The halt: the halt graph on the highest-priority stream, its chunk published (latency
    /// counted from `started`, when the stop arrived).
    fn halt(&mut self, started: Stamp) -> Result<()> {
        let _span = tracing::debug_span!("halt").entered();
        let t_halt = std::time::Instant::now();
        self.status.halted = true;
        self.status.halts += 1;
        let d = self.cfg.control.action_dim;
        let horizon = self.policy.config().action_horizon;
        // What the hold must be: the last targets (position) or zero (velocity). Before the
        // first chunk a position robot holds its measured state (the first action_dim joints).
        let expect: Vec<f32> = match (&self.last_action, self.cfg.safety.action_space) {
            (Some(a), ActionSpace::Position) => a.repeat(horizon),
            (None, ActionSpace::Position) => {
                let v = self
                    .inputs
                    .state
                    .value
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let mut row = vec![0.0; d];
                if let Some((_, s)) = &v.0 {
                    for (r, x) in row.iter_mut().zip(s) {
                        *r = *x;
                    }
                }
                drop(v);
                row.repeat(horizon)
            }
            _ => vec![0.0; horizon * d],
        };
        // Position control holds these targets: written on the halt stream just before the
        // halt graph (velocity control's zeros were written once at start-up).
        if self.cfg.safety.action_space == ActionSpace::Position {
            self.policy.set_hold(&expect, d)?;
        }
        self.policy.halt(&mut self.chunk, d)?;
        let close = self
            .chunk
            .iter()
            .zip(&expect)
            .all(|(a, b)| (a - b).abs() <= 1e-3 * (1.0 + b.abs()));
        if !close {
            self.status.last_error = "halt graph output differs from the hold chunk".into();
        }
        self.seq += 1;
        let now = self.clock.now();
        self.publish(Outbound::Chunk(ActionChunk {
            stamp: now,
            seq: self.seq,
            horizon: horizon as u32,
            action_dim: d as u32,
            actions: Arc::new(expect),
            dt: self.cfg.control.dt,
            subgoal: self.subgoal.clone(),
            subgoal_id: self.status.subgoal_id,
            halt: true,
            latency: (now - started).max(0.0),
        }));
        self.rec.span(
            crate::observe::Span::Halt,
            "halt",
            t_halt,
            std::time::Instant::now(),
        );
        Ok(())
    }

    /// One control tick (see the module docs).
    pub fn tick(&mut self) -> TickOutcome {
        self.drain_commands();
        if self.status.halted {
            return TickOutcome::Idle;
        }
        self.status.ticks += 1;
        let _span = tracing::debug_span!("tick", n = self.status.ticks).entered();
        let started = self.clock.now();
        let t0 = std::time::Instant::now();
        let max_age = self.cfg.safety.max_observation_age_ms / 1000.0;
        // Newest observations.
        let mut oldest = f64::INFINITY;
        let mut missing = None;
        for (i, (name, slot)) in self.inputs.cameras.iter().enumerate() {
            {
                let mut v = slot.value.lock().unwrap_or_else(|p| p.into_inner());
                if v.0.is_some() {
                    self.frames[i] = v.0.take();
                }
            }
            match self.frames[i]
                .as_ref()
                .filter(|(t, _)| started - t <= max_age)
            {
                Some((t, _)) => oldest = oldest.min(*t),
                None if self.cfg.cameras[i].required => missing = Some(name.clone()),
                None => {}
            }
        }
        let fresh = |f: &Option<(Stamp, ModelImage)>| {
            f.as_ref().is_some_and(|(t, _)| started - t <= max_age)
        };
        if let Some(cam) = missing {
            if self.cfg.safety.missing_camera == MissingCamera::Halt
                && self.frames.iter().any(fresh)
            {
                let _ = self.halt(started);
                self.status.last_error = format!("camera `{cam}` missing or stale: halted");
                return TickOutcome::Halted;
            }
            self.status.stale += 1;
            return TickOutcome::Stale(format!("camera `{cam}` missing or older than the bound"));
        }
        if !self.frames.iter().any(fresh) {
            self.status.stale += 1;
            return TickOutcome::Stale("no camera frame".into());
        }
        {
            let v = self
                .inputs
                .state
                .value
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match v.0.as_ref().filter(|(t, _)| started - t <= max_age) {
                Some((t, s)) => {
                    oldest = oldest.min(*t);
                    self.state.clear();
                    self.state.extend_from_slice(s);
                }
                None => {
                    self.status.stale += 1;
                    return TickOutcome::Stale(
                        "robot state missing or older than the bound".into(),
                    );
                }
            }
        }
        let mut frames: [Option<&ModelImage>; frt_vla::MAX_VIEWS] = [None; frt_vla::MAX_VIEWS];
        for (f, slot) in frames.iter_mut().zip(&self.frames) {
            *f = slot.as_ref().filter(|_| fresh(slot)).map(|(_, p)| p);
        }
        let frames = &frames[..self.frames.len().min(frt_vla::MAX_VIEWS)];
        let subgoal = self.subgoal.clone();
        let _busy = BusyTick::new(&self.busy);
        if let Err(e) = self.policy.prepare(frames, &self.state, &subgoal) {
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
        self.guard();
        let horizon = self.policy.config().action_horizon;
        let last = &self.chunk[(horizon - 1) * d..];
        match &mut self.last_action {
            Some(a) => a.copy_from_slice(last),
            None => self.last_action = Some(last.to_vec()),
        }
        self.seq += 1;
        self.status.chunks += 1;
        let now = self.clock.now();
        let actions = self.pooled_chunk();
        self.publish(Outbound::Chunk(ActionChunk {
            stamp: oldest,
            seq: self.seq,
            horizon: horizon as u32,
            action_dim: d as u32,
            actions,
            dt: self.cfg.control.dt,
            subgoal,
            subgoal_id: self.status.subgoal_id,
            halt: false,
            latency: (now - started).max(0.0),
        }));
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

    /// The chunk to publish, in a buffer of the pool that no receiver holds any more (a new
    /// one, kept in the pool while it has room, when every buffer is still held).
    fn pooled_chunk(&mut self) -> Arc<Vec<f32>> {
        for a in &mut self.chunk_pool {
            if let Some(v) = Arc::get_mut(a) {
                v.copy_from_slice(&self.chunk);
                return a.clone();
            }
        }
        let a = Arc::new(self.chunk.clone());
        if self.chunk_pool.len() < CHUNK_POOL {
            self.chunk_pool.push(a.clone());
        }
        a
    }

    /// Replays every stage of the tick. One replay stays queued behind the running one (the
    /// device never waits for the host); between two replays, and while waiting, a command is
    /// acted on at once: the outcome it gives ends the tick.
    fn replay_all(&mut self) -> Result<Option<TickOutcome>> {
        let n = self.policy.stages().len();
        let s = self.policy.model.stream();
        for i in 0..n {
            if let Some(h) = &mut self.hook {
                h(i);
            }
            self.enqueued[i % 2] = std::time::Instant::now();
            let st = self.policy.stages()[i];
            self.policy.replay(st)?;
            self.done[i % 2].record(s)?;
            if i == 0 {
                // The device is busy now: the next tick's noise is drawn meanwhile.
                self.policy.draw_noise();
            } else if let Some(o) = self.wait_replay(i - 1)? {
                return Ok(Some(o));
            }
        }
        self.wait_replay(n - 1)
    }

    /// Clamps to the limits and caps the change between consecutive actions (starting from
    /// the last published action).
    fn guard(&mut self) {
        let s = &self.cfg.safety;
        let d = self.cfg.control.action_dim;
        let mut changed = 0u64;
        for r in 0..self.chunk.len() / d {
            for k in 0..d {
                // The previous action: the row before (already guarded), or the last one
                // published for the first row.
                let prev = match r {
                    0 => self.last_action.as_ref().map(|a| a[k]),
                    _ => Some(self.chunk[(r - 1) * d + k]),
                };
                let i = r * d + k;
                let mut x = self.chunk[i].clamp(s.min(k), s.max(k));
                if let (Some(cap), Some(p)) = (s.delta(k), prev) {
                    x = x.clamp(p - cap, p + cap);
                }
                if x != self.chunk[i] {
                    changed += 1;
                    self.chunk[i] = x;
                }
            }
        }
        self.status.clamped += changed;
    }

    /// Runs ticks at the configured rate until `stop` is set (the control thread's body).
    pub fn run(&mut self, stop: &std::sync::atomic::AtomicBool) {
        for r in crate::realtime::apply(self.cfg.control.cpu, self.cfg.control.realtime) {
            if let Err(why) = r {
                self.status.last_error = why;
            }
        }
        let period = std::time::Duration::from_secs_f64(1.0 / self.cfg.control.rate_hz);
        let mut next = std::time::Instant::now();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            self.tick();
            n += 1;
            if n % (self.cfg.control.rate_hz.ceil() as u64).max(1) == 0 {
                self.publish_status();
            }
            next += period;
            let now = std::time::Instant::now();
            if now > next {
                self.status.deadline_misses += 1;
                next = now;
            }
            // Between ticks a command is applied as it arrives (a stop halts at once).
            while let Some(left) = next.checked_duration_since(std::time::Instant::now()) {
                match self.commands.recv_timeout(left) {
                    Ok(q) => {
                        self.apply(q);
                    }
                    Err(_) => break,
                }
            }
        }
    }
}
