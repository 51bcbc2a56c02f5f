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

/// The scripted simulation as a transport, in real time on `clock`.
pub struct Sim {
    script: SimScript,
    /// Camera name and format, from the node's configuration.
    cameras: Vec<(String, crate::config::ImageFormat)>,
    joints: Vec<String>,
    clock: Arc<dyn Clock>,
    /// Frame size of synthesized cameras.
    pub frame_size: (u32, u32),
}

impl Sim {
    pub fn new(script: SimScript, cfg: &crate::Config, clock: Arc<dyn Clock>) -> Sim {
        Sim {
            script,
            cameras: cfg
                .cameras
                .iter()
                .map(|c| (c.name.clone(), c.format))
                .collect(),
            joints: cfg.state.joints.clone(),
            clock,
            frame_size: (320, 240),
        }
    }

    fn folder_frames(dir: &Path) -> Result<Vec<Vec<u8>>> {
        let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|source| Error::Io {
                path: dir.to_path_buf(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension().and_then(|e| e.to_str()).is_some_and(|e| {
                    matches!(e.to_ascii_lowercase().as_str(), "png" | "jpg" | "jpeg")
                })
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
                std::fs::read(p).map_err(|source| Error::Io {
                    path: p.clone(),
                    source,
                })
            })
            .collect()
    }

    fn image(&self, format: crate::config::ImageFormat, rgb: Vec<u8>) -> Image {
        let (w, h) = self.frame_size;
        match format {
            crate::config::ImageFormat::Raw => Image::Raw {
                encoding: "rgb8".into(),
                width: w,
                height: h,
                step: w * 3,
                data: rgb,
            },
            crate::config::ImageFormat::Compressed => {
                let mut jpeg = Vec::new();
                let enc = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90);
                use image::ImageEncoder;
                enc.write_image(&rgb, w, h, image::ExtendedColorType::Rgb8)
                    .expect("encoding a synthesized frame");
                Image::Compressed {
                    format: "jpeg".into(),
                    data: jpeg,
                }
            }
        }
    }
}

impl Transport for Sim {
    fn name(&self) -> &str {
        "sim"
    }

    fn run(
        &mut self,
        inputs: &Inputs,
        outputs: &Receiver<Outbound>,
        stop: &AtomicBool,
    ) -> Result<()> {
        let mut folders = std::collections::BTreeMap::new();
        for (cam, dir) in &self.script.frame_folders {
            if !self.cameras.iter().any(|(n, _)| n == cam) {
                return Err(Error::bad(
                    "sim frames",
                    format!("no camera `{cam}` in the config"),
                ));
            }
            folders.insert(cam.clone(), Sim::folder_frames(dir)?);
        }
        // Audio of the timeline, cut into 20 ms chunks with their times.
        let mut audio: Vec<(f64, Audio)> = Vec::new();
        for e in &self.script.events {
            if let Some(path) = &e.wav {
                let wav = frt_asr::audio::read_wav(path)?;
                let per = (wav.sample_rate as usize / 50) * wav.channels as usize;
                for (i, c) in wav.samples.chunks(per.max(1)).enumerate() {
                    audio.push((
                        e.at + i as f64 * 0.02,
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
        let t0 = self.clock.now();
        let (mut next_frame, mut next_state, mut frame_no) = (0.0f64, 0.0f64, 0usize);
        let (mut ev, mut au) = (0usize, 0usize);
        let mut events = self.script.events.clone();
        events.sort_by(|a, b| a.at.total_cmp(&b.at));
        let mut dropped: Vec<String> = Vec::new();
        // Silence between utterances keeps the segmenter's noise floor calibrated.
        let mut next_silence = 0.0f64;
        while !stop.load(Ordering::Relaxed) {
            let t = self.clock.now() - t0;
            if t >= self.script.duration_s {
                break;
            }
            while ev < events.len() && events[ev].at <= t {
                let e = &events[ev];
                if let Some(c) = &e.command {
                    let _ = deliver(inputs, Inbound::Command(c.clone()));
                }
                if let Some(c) = &e.drop_camera {
                    dropped.push(c.clone());
                }
                match e.fault.as_deref() {
                    Some("panic") => inputs.drill(crate::node::Drill::Panic),
                    Some("stall") => inputs.drill(crate::node::Drill::Stall),
                    _ => {}
                }
                ev += 1;
            }
            let speaking = au < audio.len() && audio[au].0 <= t + 0.5;
            while au < audio.len() && audio[au].0 <= t {
                let mut a = audio[au].1.clone();
                a.stamp = t0 + audio[au].0;
                let _ = deliver(inputs, Inbound::Audio(a));
                au += 1;
            }
            if !speaking && t >= next_silence {
                let _ = deliver(
                    inputs,
                    Inbound::Audio(Audio {
                        stamp: t0 + t,
                        sample_rate: 16_000,
                        samples: vec![0.0; 320],
                        channels: 1,
                    }),
                );
                next_silence = t + 0.02;
            }
            if t >= next_frame {
                let now = self.clock.now();
                for (k, (name, format)) in self.cameras.iter().enumerate() {
                    if dropped.contains(name) {
                        continue;
                    }
                    let image = match folders.get(name) {
                        Some(f) => Image::Compressed {
                            format: "png/jpeg".into(),
                            data: f[frame_no % f.len()].clone(),
                        },
                        None => {
                            let (w, h) = self.frame_size;
                            self.image(*format, synth_frame(w, h, t, k as u32))
                        }
                    };
                    let _ = deliver(
                        inputs,
                        Inbound::Frame {
                            camera: name.clone(),
                            stamp: now,
                            image,
                        },
                    );
                }
                frame_no += 1;
                next_frame += 1.0 / self.script.camera_rate_hz;
            }
            if t >= next_state {
                let js = JointState {
                    stamp: self.clock.now(),
                    names: self.joints.clone(),
                    position: (0..self.joints.len())
                        .map(|j| 0.3 * (t * 0.8 + j as f64).sin())
                        .collect(),
                };
                let _ = deliver(inputs, Inbound::State(js));
                next_state += 1.0 / self.script.state_rate_hz;
            }
            // Outputs are consumed by whoever reads the node's output channel; the simulated
            // robot only needs them drained when nobody else does.
            let _ = outputs;
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }
}
