//! Transports: what carries messages between the node and the outside world. Each one only
//! converts its wire types to [`Inbound`] and from [`Outbound`]; decoding, validation and
//! counting of bad inputs happen once, in [`Inputs`].
//!
//! Here: [`Loopback`] (in-process channels, for tests and embedding) and [`Sim`] (a scripted
//! timeline of synthesized or file frames, synthesized state, WAV audio and commands, in real
//! time). The ROS 2 transports implement the same trait.

use crate::error::{Error, Result};
use crate::messages::*;
use crate::node::{Clock, Inputs};
use crate::ros::msg::{self, RosMessage};
use crate::ros::wire::{Cdr, In, receive};
use crossbeam_channel::{Receiver, Sender};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// One message for the node.
#[derive(Clone, Debug)]
pub enum Inbound {
    Frame {
        camera: String,
        stamp: Stamp,
        image: Image,
    },
    State(JointState),
    Audio(Audio),
    /// A typed command as text (`stop`, `resume`, `subgoal: …`).
    Command(String),
    /// A subgoal (a `std_msgs/String` on `~/subgoal`, or the subgoal service).
    Subgoal(String),
    Stop,
    Resume,
}

/// Hands one message to the node's inputs (refusals are counted there).
pub fn deliver(inputs: &Inputs, m: Inbound) -> Result<()> {
    match m {
        Inbound::Frame {
            camera,
            stamp,
            image,
        } => inputs.frame(&camera, stamp, &image),
        Inbound::State(s) => inputs.state(&s),
        Inbound::Audio(a) => inputs.audio(a),
        Inbound::Command(t) => inputs.command_text(&t),
        Inbound::Subgoal(g) => inputs.command(Command::Subgoal(g), Source::Typed),
        Inbound::Stop => inputs.command(Command::Stop, Source::Typed),
        Inbound::Resume => inputs.command(Command::Resume, Source::Typed),
    }
}

/// A transport: runs until `stop` is set (or its input ends), delivering what arrives into
/// `inputs` and publishing what the node sends on `outputs`.
pub trait Transport: Send {
    fn name(&self) -> &str;
    fn run(
        &mut self,
        inputs: &Inputs,
        outputs: &Receiver<Outbound>,
        stop: &AtomicBool,
    ) -> Result<()>;
}

/// In-process transport: the peer sends [`Inbound`] and receives every [`Outbound`].
pub struct Loopback {
    rx: Receiver<Inbound>,
    tx: Sender<Outbound>,
}

/// The far end of a [`Loopback`].
pub struct LoopbackPeer {
    pub tx: Sender<Inbound>,
    pub rx: Receiver<Outbound>,
}

impl Loopback {
    pub fn new() -> (Loopback, LoopbackPeer) {
        let (itx, irx) = crossbeam_channel::bounded(256);
        let (otx, orx) = crossbeam_channel::unbounded();
        (
            Loopback { rx: irx, tx: otx },
            LoopbackPeer { tx: itx, rx: orx },
        )
    }
}

impl Transport for Loopback {
    fn name(&self) -> &str {
        "loopback"
    }

    fn run(
        &mut self,
        inputs: &Inputs,
        outputs: &Receiver<Outbound>,
        stop: &AtomicBool,
    ) -> Result<()> {
        while !stop.load(Ordering::Relaxed) {
            crossbeam_channel::select! {
                recv(self.rx) -> m => match m {
                    // Refused inputs are counted by the node; the transport keeps going.
                    Ok(m) => { let _ = deliver(inputs, m); }
                    Err(_) => return Ok(()),
                },
                recv(outputs) -> o => match o {
                    Ok(o) => { let _ = self.tx.send(o); }
                    Err(_) => return Ok(()),
                },
                default(Duration::from_millis(20)) => {}
            }
        }
        Ok(())
    }
}

/// A scripted simulation (YAML): where frames come from, and a timeline of events.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimScript {
    /// Seconds the simulation runs.
    pub duration_s: f64,
    /// Frames per second of every camera.
    #[serde(default = "default_camera_rate")]
    pub camera_rate_hz: f64,
    /// Robot state messages per second.
    #[serde(default = "default_state_rate")]
    pub state_rate_hz: f64,
    /// Per camera name: a folder of PNG/JPEG frames (played in name order, looped). Cameras
    /// not listed get synthesized frames.
    #[serde(default)]
    pub frame_folders: std::collections::BTreeMap<String, PathBuf>,
    #[serde(default)]
    pub events: Vec<SimEvent>,
}

fn default_camera_rate() -> f64 {
    15.0
}
fn default_state_rate() -> f64 {
    50.0
}

/// One timeline entry: at `at` seconds, a typed command or a WAV file spoken into the
/// microphone.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimEvent {
    pub at: f64,
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub wav: Option<PathBuf>,
    /// A camera that stops sending from this time on (a cable pulled).
    #[serde(default)]
    pub drop_camera: Option<String>,
    /// A fault drill: `panic` (the control thread panics) or `stall` (a tick stalls past the
    /// watchdog's deadline). Either must end in a halt chunk and a non-zero exit.
    #[serde(default)]
    pub fault: Option<String>,
}

impl SimScript {
    pub fn load(path: &Path) -> Result<SimScript> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut s = SimScript::parse(&text)?;
        if let Some(dir) = path.parent() {
            for p in s.frame_folders.values_mut() {
                if p.is_relative() {
                    *p = dir.join(&*p);
                }
            }
            for e in &mut s.events {
                if let Some(w) = &mut e.wav {
                    if w.is_relative() {
                        *w = dir.join(&*w);
                    }
                }
            }
        }
        Ok(s)
    }

    pub fn parse(text: &str) -> Result<SimScript> {
        let s: SimScript =
            serde_yaml::from_str(text).map_err(|e| Error::bad("sim script", e.to_string()))?;
        if !(s.duration_s.is_finite() && s.duration_s > 0.0) {
            return Err(Error::bad("sim script", "duration_s must be positive"));
        }
        for (n, r) in [
            ("camera_rate_hz", s.camera_rate_hz),
            ("state_rate_hz", s.state_rate_hz),
        ] {
            if !(r.is_finite() && r > 0.0 && r <= 1000.0) {
                return Err(Error::bad(
                    "sim script",
                    format!("{n} must be in (0, 1000]"),
                ));
            }
        }
        for (i, e) in s.events.iter().enumerate() {
            let n = [
                e.command.is_some(),
                e.wav.is_some(),
                e.drop_camera.is_some(),
                e.fault.is_some(),
            ]
            .iter()
            .filter(|x| **x)
            .count();
            if n != 1 || !e.at.is_finite() || e.at < 0.0 {
                return Err(Error::bad(
                    "sim script",
                    format!(
                        "events[{i}]: a time ≥ 0 and exactly one of command, wav, drop_camera, fault"
                    ),
                ));
            }
            if e.fault
                .as_deref()
                .is_some_and(|f| f != "panic" && f != "stall")
            {
                return Err(Error::bad(
                    "sim script",
                    format!("events[{i}].fault: `panic` or `stall`"),
                ));
            }
        }
        Ok(s)
    }
}

/// A synthesized camera frame: a gradient with a square that moves with time.
pub fn synth_frame(width: u32, height: u32, t: f64, seed: u32) -> Vec<u8> {
    let (w, h) = (width as usize, height as usize);
    let cx = ((t * 0.7 + seed as f64 * 0.13).sin() * 0.35 + 0.5) * w as f64;
    let cy = ((t * 0.5 + seed as f64 * 0.29).cos() * 0.35 + 0.5) * h as f64;
    let r = (w.min(h) / 8) as f64;
    let mut img = vec![0u8; w * h * 3];
    for y in 0..h {
        for x in 0..w {
            let p = &mut img[(y * w + x) * 3..][..3];
            let inside = (x as f64 - cx).abs() < r && (y as f64 - cy).abs() < r;
            if inside {
                p.copy_from_slice(&[220, 40, 30]);
            } else {
                p[0] = (x * 255 / w) as u8;
                p[1] = (y * 255 / h) as u8;
                p[2] = 90 + (seed * 40 % 120) as u8;
            }
        }
    }
    img
}

/// What a simulation script produces at one moment: a message on one of the node's input
/// topics, serialized as the ROS 2 transports receive it (CDR with its encapsulation header),
/// or a fault drill.
#[derive(Clone, Debug)]
pub enum SimItem {
    Message { kind: In, data: Vec<u8> },
    Drill(crate::node::Drill),
}

/// Seconds between two microphone messages of the simulation (20 ms of audio each).
const AUDIO_PERIOD: f64 = 0.02;

/// A scripted simulation's inputs as a function of its own clock alone: frame k of every
/// camera at k / `camera_rate_hz`, state message k at k / `state_rate_hz`, the timeline's
/// commands, spoken clips in 20 ms messages and silence between them, each stamped with the
/// time it is due. The same script gives the same messages in every run.
pub struct SimSource {
    script: SimScript,
    /// Camera name, format and topic kind, from the node's configuration.
    cameras: Vec<(String, crate::config::ImageFormat)>,
    joints: Vec<String>,
    /// Frame size of synthesized cameras.
    frame_size: (u32, u32),
    /// Per camera with a folder: its frames (raw cameras: decoded to rgb8).
    folders: std::collections::BTreeMap<String, Vec<FolderFrame>>,
    /// The timeline's audio in 20 ms pieces with their times.
    audio: Vec<(f64, Audio)>,
    events: Vec<SimEvent>,
    next_event: usize,
    next_audio: usize,
    frames: u64,
    states: u64,
    silences: u64,
    dropped: Vec<String>,
    /// Whether the node listens (a speech section): the microphone is simulated only then.
    listening: bool,
}

/// A frame from a folder: the file's bytes (compressed cameras) or its pixels (raw cameras).
enum FolderFrame {
    File {
        format: String,
        data: Vec<u8>,
    },
    Rgb {
        width: u32,
        height: u32,
        data: Vec<u8>,
    },
}

impl SimSource {
    /// Reads what the script names (frame folders, WAV files) for the node configured by
    /// `cfg`.
    pub fn new(script: SimScript, cfg: &crate::Config) -> Result<SimSource> {
        let cameras: Vec<_> = cfg
            .cameras
            .iter()
            .map(|c| (c.name.clone(), c.format))
            .collect();
        let mut folders = std::collections::BTreeMap::new();
        for (cam, dir) in &script.frame_folders {
            let Some((_, format)) = cameras.iter().find(|(n, _)| n == cam) else {
                return Err(Error::bad(
                    "sim frames",
                    format!("no camera `{cam}` in the config"),
                ));
            };
            folders.insert(cam.clone(), folder_frames(dir, *format)?);
        }
        let mut audio: Vec<(f64, Audio)> = Vec::new();
        for e in &script.events {
            if let Some(path) = &e.wav {
                let wav = frt_asr::audio::read_wav(path)?;
                let per = (wav.sample_rate as usize / 50) * wav.channels as usize;
                for (i, c) in wav.samples.chunks(per.max(1)).enumerate() {
                    audio.push((
                        e.at + i as f64 * AUDIO_PERIOD,
                        Audio {
                            stamp: 0.0,
                            sample_rate: wav.sample_rate,
                            samples: c.to_vec(),
                            channels: wav.channels,
                        },
                    ));
                }
            }
        }
        audio.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut events = script.events.clone();
        events.sort_by(|a, b| a.at.total_cmp(&b.at));
        Ok(SimSource {
            script,
            cameras,
            joints: cfg.state.joints.clone(),
            frame_size: (320, 240),
            folders,
            audio,
            events,
            next_event: 0,
            next_audio: 0,
            frames: 0,
            states: 0,
            silences: 0,
            dropped: Vec::new(),
            listening: cfg.asr.is_some(),
        })
    }

    /// Seconds the script runs.
    pub fn duration(&self) -> f64 {
        self.script.duration_s
    }

    fn frame_at(&self) -> f64 {
        self.frames as f64 / self.script.camera_rate_hz
    }

    fn state_at(&self) -> f64 {
        self.states as f64 / self.script.state_rate_hz
    }

    fn silence_at(&self) -> f64 {
        self.silences as f64 * AUDIO_PERIOD
    }

    /// The script time at which the next message or drill is due.
    pub fn next_at(&self) -> f64 {
        let mut t = self.frame_at().min(self.state_at());
        if self.listening {
            t = t.min(self.silence_at());
        }
        if let Some(e) = self.events.get(self.next_event) {
            t = t.min(e.at);
        }
        if let Some((at, _)) = self.audio.get(self.next_audio).filter(|_| self.listening) {
            t = t.min(*at);
        }
        t
    }

    /// Everything due at or before script time `t`, in order of its time (ties: timeline
    /// events, audio, frames, state), with its script time; stamps are `t0` + that time.
    pub fn take_due(&mut self, t: f64, t0: Stamp, out: &mut Vec<(f64, SimItem)>) {
        let msg = |kind: In, data: Vec<u8>| SimItem::Message { kind, data };
        while let Some(e) = self.events.get(self.next_event).filter(|e| e.at <= t) {
            let at = e.at;
            if let Some(c) = &e.command {
                let m = msg::StringMsg { data: c.clone() };
                out.push((at, msg(In::Command, m.encode())));
            }
            if let Some(c) = &e.drop_camera {
                self.dropped.push(c.clone());
            }
            match e.fault.as_deref() {
                Some("panic") => out.push((at, SimItem::Drill(crate::node::Drill::Panic))),
                Some("stall") => out.push((at, SimItem::Drill(crate::node::Drill::Stall))),
                _ => {}
            }
            self.next_event += 1;
        }
        while self.listening {
            let audio_at = self.audio.get(self.next_audio).map(|a| a.0);
            let silence_at = self.silence_at();
            match audio_at {
                Some(a) if a <= t && a <= silence_at => {
                    let a = &self.audio[self.next_audio];
                    out.push((a.0, msg(AUDIO, audio_chunk(t0 + a.0, &a.1))));
                    self.next_audio += 1;
                }
                _ if silence_at <= t => {
                    // Silence between utterances keeps the segmenter's noise floor
                    // calibrated; none from half a second before an utterance to its end.
                    let speaking = audio_at.is_some_and(|a| a <= silence_at + 0.5);
                    if !speaking {
                        let quiet = Audio {
                            stamp: 0.0,
                            sample_rate: 16_000,
                            samples: vec![0.0; 320],
                            channels: 1,
                        };
                        out.push((silence_at, msg(AUDIO, audio_chunk(t0 + silence_at, &quiet))));
                    }
                    self.silences += 1;
                }
                _ => break,
            }
        }
        while self.frame_at() <= t {
            let at = self.frame_at();
            for (k, (name, format)) in self.cameras.iter().enumerate() {
                if self.dropped.contains(name) {
                    continue;
                }
                let data = self.frame(k, name, *format, at, t0 + at);
                out.push((at, msg(In::Camera(name.clone(), *format), data)));
            }
            self.frames += 1;
        }
        while self.state_at() <= t {
            let at = self.state_at();
            let js = msg::JointState {
                header: header(t0 + at),
                name: self.joints.clone(),
                position: (0..self.joints.len())
                    .map(|j| 0.3 * (at * 0.8 + j as f64).sin())
                    .collect(),
                ..Default::default()
            };
            out.push((at, msg(In::State, js.encode())));
            self.states += 1;
        }
    }

    /// Frame `self.frames` of camera `k` as its topic's message.
    fn frame(
        &self,
        k: usize,
        name: &str,
        format: crate::config::ImageFormat,
        at: f64,
        stamp: Stamp,
    ) -> Vec<u8> {
        use crate::config::ImageFormat;
        let raw = |width: u32, height: u32, data: Vec<u8>| {
            msg::Image {
                header: header(stamp),
                height,
                width,
                encoding: "rgb8".into(),
                is_bigendian: 0,
                step: width * 3,
                data,
            }
            .encode()
        };
        let compressed = |format: &str, data: Vec<u8>| {
            msg::CompressedImage {
                header: header(stamp),
                format: format.into(),
                data,
            }
            .encode()
        };
        if let Some(f) = self.folders.get(name) {
            return match &f[self.frames as usize % f.len()] {
                FolderFrame::File { format, data } => compressed(format, data.clone()),
                FolderFrame::Rgb {
                    width,
                    height,
                    data,
                } => raw(*width, *height, data.clone()),
            };
        }
        let (w, h) = self.frame_size;
        let rgb = synth_frame(w, h, at, k as u32);
        match format {
            ImageFormat::Raw => raw(w, h, rgb),
            ImageFormat::Compressed => {
                let mut jpeg = Vec::new();
                let enc = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90);
                use image::ImageEncoder;
                enc.write_image(&rgb, w, h, image::ExtendedColorType::Rgb8)
                    .expect("encoding a synthesized frame");
                compressed("jpeg", jpeg)
            }
        }
    }
}

/// The simulation's microphone messages (`frt_msgs/AudioChunk`).
pub const AUDIO: In = In::Audio(crate::ros::wire::AudioIn::Frt);

fn header(stamp: Stamp) -> msg::Header {
    msg::Header {
        stamp: msg::Time::from_secs(stamp),
        frame_id: String::new(),
    }
}

fn audio_chunk(stamp: Stamp, a: &Audio) -> Vec<u8> {
    msg::AudioChunk {
        header: header(stamp),
        sample_rate: a.sample_rate,
        channels: a.channels,
        samples: a.samples.clone(),
    }
    .encode()
}

/// The PNG/JPEG files of a folder in name order: as files for a compressed camera, decoded to
/// rgb8 for a raw one.
fn folder_frames(dir: &Path, format: crate::config::ImageFormat) -> Result<Vec<FolderFrame>> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e.to_ascii_lowercase().as_str(), "png" | "jpg" | "jpeg"))
        })
        .collect();
    names.sort();
    if names.is_empty() {
        return Err(Error::bad(
            "sim frames",
            format!("no PNG or JPEG files in {}", dir.display()),
        ));
    }
    names
        .iter()
        .map(|p| {
            let data = std::fs::read(p).map_err(|source| Error::Io {
                path: p.clone(),
                source,
            })?;
            let png = p.extension().is_some_and(|e| e.eq_ignore_ascii_case("png"));
            Ok(match format {
                crate::config::ImageFormat::Compressed => FolderFrame::File {
                    format: if png { "png" } else { "jpeg" }.into(),
                    data,
                },
                crate::config::ImageFormat::Raw => {
                    let img = image::load_from_memory(&data)
                        .map_err(|e| Error::bad("sim frames", format!("{}: {e}", p.display())))?
                        .to_rgb8();
                    FolderFrame::Rgb {
                        width: img.width(),
                        height: img.height(),
                        data: img.into_raw(),
                    }
                }
            })
        })
        .collect()
}

/// The scripted simulation as a transport, in real time on `clock` (the demo): what
/// [`SimSource`] makes due is delivered as the ROS 2 transports deliver what they receive.
pub struct Sim {
    source: SimSource,
    clock: Arc<dyn Clock>,
    tap: Option<Arc<crate::record::Tap>>,
}

impl Sim {
    pub fn new(script: SimScript, cfg: &crate::Config, clock: Arc<dyn Clock>) -> Result<Sim> {
        Ok(Sim::from_source(SimSource::new(script, cfg)?, clock))
    }

    pub fn from_source(source: SimSource, clock: Arc<dyn Clock>) -> Sim {
        Sim {
            source,
            clock,
            tap: None,
        }
    }

    /// Records every message delivered from now on into `tap`.
    pub fn set_tap(&mut self, tap: Option<Arc<crate::record::Tap>>) {
        self.tap = tap;
    }
}

impl Transport for Sim {
    fn name(&self) -> &str {
        "sim"
    }

    fn run(
        &mut self,
        inputs: &Inputs,
        _outputs: &Receiver<Outbound>,
        stop: &AtomicBool,
    ) -> Result<()> {
        let t0 = self.clock.now();
        let mut due = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let t = self.clock.now() - t0;
            if t >= self.source.duration() {
                break;
            }
            self.source.take_due(t, t0, &mut due);
            for (_, item) in due.drain(..) {
                match item {
                    SimItem::Message { kind, data } => {
                        if let Some(tap) = &self.tap {
                            tap.input(inputs.now(), &kind, &data);
                        }
                        receive(&kind, Cdr::Serialized(&data), inputs, None)
                    }
                    SimItem::Drill(d) => inputs.drill(d),
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }
}
