//! The fuzz targets: what each runs, and the valid samples it starts from.

use frt_robot_host::messages::Stamp;
use frt_robot_host::ros::msg::{self, RosMessage, mgonzs13, ros_drivers};
use frt_robot_host::ros::wire::{self, AudioIn, Cdr, In};
use frt_robot_host::transport::{SimScript, synth_frame};
use frt_robot_host::{Config, ManualClock, Node, Outputs, TickOutcome};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An error from a target that starts with this is a broken oracle (a finding), not a
/// refused input.
pub const ORACLE: &str = "oracle: ";

pub trait Target {
    fn name(&self) -> &'static str;
    /// Valid samples: each one runs without error.
    fn seeds(&mut self) -> Vec<Vec<u8>>;
    /// Runs one input: `Err` with the reason the code gave when it refused it.
    fn run(&mut self, input: &[u8]) -> Result<(), String>;
    /// JSON or YAML: token-level mutations too.
    fn text(&self) -> bool {
        false
    }
    /// The leading bytes that hold the structure (mutated more often).
    fn hot(&self) -> usize {
        0
    }
    /// After a panic: rebuild whatever state the target keeps.
    fn reset(&mut self) {}
}

/// Every target, by name.
pub fn all() -> Vec<Box<dyn Target>> {
    NAMES.iter().map(|n| by_name(n).expect("listed")).collect()
}

pub const NAMES: [&str; 11] = [
    "cdr",
    "wire",
    "frame",
    "wav",
    "vla-tokenizer",
    "whisper-tokenizer",
    "vla-checkpoint",
    "whisper-checkpoint",
    "norm-stats",
    "config",
    "sim-script",
];

pub fn by_name(name: &str) -> Option<Box<dyn Target>> {
    Some(match name {
        "cdr" => Box::new(CdrTarget),
        "wire" => Box::new(WireTarget::new()),
        "frame" => Box::new(FrameTarget::default()),
        "wav" => Box::new(WavTarget),
        "vla-tokenizer" => Box::new(VlaTokenizerTarget),
        "whisper-tokenizer" => Box::new(WhisperTokenizerTarget),
        "vla-checkpoint" => Box::new(VlaCheckpointTarget::new()),
        "whisper-checkpoint" => Box::new(WhisperCheckpointTarget::new()),
        "norm-stats" => Box::new(NormStatsTarget),
        "config" => Box::new(ConfigTarget),
        "sim-script" => Box::new(SimTarget),
        _ => return None,
    })
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> Vec<u8> {
    let p = repo().join(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("seed {}: {e}", p.display()))
}

/// A scratch folder of this process for a target's files.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("frt-fuzz-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temporary folder");
    d
}

fn header(t: f64) -> msg::Header {
    msg::Header {
        stamp: msg::Time::from_secs(t),
        frame_id: "base".into(),
    }
}

// ---------------------------------------------------------------------------------------
// CDR: every message type the node decodes or peers send back, both framings; a decoded
// message re-encodes to bytes that decode to the same encoding (round trip).

type Decoder = fn(&[u8], bool) -> Result<(), String>;

fn round_trip<M: RosMessage>(b: &[u8], body: bool) -> Result<(), String> {
    let m = if body {
        M::decode_body(b)
    } else {
        M::decode(b)
    }
    .map_err(|e| e.to_string())?;
    let once = m.encode();
    let again = M::decode(&once)
        .map_err(|e| {
            format!(
                "{ORACLE}{}: re-encoded message does not decode: {e}",
                M::NAME
            )
        })?
        .encode();
    if once != again {
        return Err(format!(
            "{ORACLE}{}: round trip changed the encoding",
            M::NAME
        ));
    }
    Ok(())
}

const DECODERS: [Decoder; 16] = [
    round_trip::<msg::Image>,
    round_trip::<msg::CompressedImage>,
    round_trip::<msg::JointState>,
    round_trip::<msg::StringMsg>,
    round_trip::<msg::Empty>,
    round_trip::<msg::Clock>,
    round_trip::<msg::AudioChunk>,
    round_trip::<mgonzs13::AudioStamped>,
    round_trip::<ros_drivers::AudioDataStamped>,
    round_trip::<msg::SetSubgoalRequest>,
    round_trip::<msg::SetSubgoalResponse>,
    round_trip::<msg::ActionChunk>,
    round_trip::<msg::JointTrajectory>,
    round_trip::<msg::HostStatus>,
    round_trip::<msg::Transcript>,
    round_trip::<msg::DiagnosticArray>,
];

fn sample_messages() -> Vec<Vec<u8>> {
    let h = header(100.0);
    vec![
        msg::Image {
            header: h.clone(),
            height: 2,
            width: 3,
            encoding: "rgb8".into(),
            is_bigendian: 0,
            step: 9,
            data: (0..18).collect(),
        }
        .encode(),
        msg::CompressedImage {
            header: h.clone(),
            format: "jpeg".into(),
            data: vec![0xff, 0xd8, 0xff, 0xd9],
        }
        .encode(),
        msg::JointState {
            header: h.clone(),
            name: (1..=7).map(|i| format!("j{i}")).collect(),
            position: vec![0.1, -0.2, 0.3, 0.0, 0.5, -0.6, 0.02],
            velocity: vec![0.0; 7],
            effort: vec![],
        }
        .encode(),
        msg::StringMsg {
            data: "pick up the red block".into(),
        }
        .encode(),
        msg::Empty::default().encode(),
        msg::Clock {
            clock: msg::Time::from_secs(100.5),
        }
        .encode(),
        msg::AudioChunk {
            header: h.clone(),
            sample_rate: 16000,
            channels: 1,
            samples: vec![0.0, 0.25, -0.5, 1.0],
        }
        .encode(),
        mgonzs13::AudioStamped {
            header: h.clone(),
            audio: mgonzs13::Audio {
                audio_data: mgonzs13::AudioData {
                    int16_data: vec![0, 100, -100, 32767],
                    ..Default::default()
                },
                info: mgonzs13::AudioInfo {
                    format: 8,
                    channels: 1,
                    rate: 16000,
                    chunk: 4,
                },
            },
        }
        .encode(),
        ros_drivers::AudioDataStamped {
            header: h.clone(),
            audio: ros_drivers::AudioData {
                data: vec![0, 0, 1, 0, 255, 255, 0, 128],
            },
        }
        .encode(),
        msg::SetSubgoalRequest {
            subgoal: "open the drawer".into(),
        }
        .encode(),
        msg::SetSubgoalResponse {
            accepted: true,
            subgoal_id: 3,
            message: String::new(),
        }
        .encode(),
    ]
}

pub struct CdrTarget;

impl Target for CdrTarget {
    fn name(&self) -> &'static str {
        "cdr"
    }
    fn seeds(&mut self) -> Vec<Vec<u8>> {
        // [decoder, framing] + the message.
        sample_messages()
            .into_iter()
            .enumerate()
            .flat_map(|(k, m)| {
                let with_header = [&[k as u8, 0][..], &m].concat();
                let body = [&[k as u8, 1][..], &m[4..]].concat();
                [with_header, body]
            })
            .collect()
    }
    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        let [k, framing, rest @ ..] = input else {
            return Err("too short".into());
        };
        DECODERS[*k as usize % DECODERS.len()](rest, framing & 1 == 1)
    }
    fn hot(&self) -> usize {
        64
    }
}

// ---------------------------------------------------------------------------------------
// The wire receive path into a live node (tiny random Pi0.5 on the host backend), a tick
// after every message: no published action may be non-finite or outside the limits.

const WIRE_CONFIG: &str = r#"
model:
  random: { size: tiny, seed: 11 }
  precision: f32
  backend: host
  max_token_len: 96
cameras:
  - { name: base, topic: /base/image_raw, format: raw, view: 0 }
  - { name: wrist, topic: /wrist/image_raw/compressed, format: compressed, view: 1, required: false }
state:
  topic: /joint_states
  joints: [j1, j2, j3, j4, j5, j6, j7]
control:
  rate_hz: 10
  initial_subgoal: pick up the red block
  action_dim: 7
  dt: 0.02
  noise_seed: 2
safety:
  max_observation_age_ms: 200
  missing_camera: halt
  action_space: position
  action_min: [-2.0]
  action_max: [2.0]
  max_delta_per_step: [0.3]
execution:
  handover: crossfade
  crossfade_rows: 3
  inpaint_prefix: true
  command_stream: { topic: /commands, rate_hz: 100 }
ros:
  joint_trajectory: { topic: /arm/joint_trajectory, joints: [j1, j2, j3, j4, j5, j6, j7] }
"#;

const T0: Stamp = 100.0;
const LIMIT: f32 = 2.0;

fn wire_kinds() -> Vec<In> {
    use frt_robot_host::ros::convert::PcmFormat;
    vec![
        In::Camera("base".into(), frt_robot_host::config::ImageFormat::Raw),
        In::Camera(
            "wrist".into(),
            frt_robot_host::config::ImageFormat::Compressed,
        ),
        In::State,
        In::Subgoal,
        In::Command,
        In::Interrupt,
        In::Resume,
        In::Audio(AudioIn::Frt),
        In::Audio(AudioIn::AudioStamped),
        In::Audio(AudioIn::AudioData {
            pcm: PcmFormat::S16Le,
            rate: 16000,
            channels: 1,
        }),
        In::Clock,
    ]
}

pub struct WireTarget {
    node: Node,
    inputs: frt_robot_host::Inputs,
    out: Outputs,
    clock: Arc<ManualClock>,
    kinds: Vec<In>,
    runs: u64,
    commands: frt_robot_host::node::CommandStream,
}

/// The oracle on what the node commands: every value finite, and within the limits unless it
/// is a hold (the measured position, which may lie anywhere).
fn check_actions(what: &str, values: &[f32], halt: bool) -> Result<(), String> {
    if let Some(x) = values.iter().find(|x| !x.is_finite()) {
        return Err(format!("{ORACLE}a {what} with the action {x}"));
    }
    if !halt && let Some(x) = values.iter().find(|x| x.abs() > LIMIT) {
        return Err(format!(
            "{ORACLE}a {what} with an action {x} outside ±{LIMIT}"
        ));
    }
    Ok(())
}

/// A tick (a whole inference on the host backend) after every this many messages: a tick
/// costs far more than a message.
const TICK_EVERY: u64 = 32;

impl WireTarget {
    pub fn new() -> WireTarget {
        let cfg = Config::parse(WIRE_CONFIG).expect("wire target config");
        let clock = Arc::new(ManualClock::default());
        clock.set(T0);
        let (node, inputs, out) = Node::new(cfg, clock.clone(), None).expect("tiny node");
        let commands = node.command_stream().expect("a command stream");
        WireTarget {
            commands,
            node,
            inputs,
            out,
            clock,
            kinds: wire_kinds(),
            runs: 0,
        }
    }
}

impl Default for WireTarget {
    fn default() -> Self {
        Self::new()
    }
}

fn jpeg(w: u32, h: u32) -> Vec<u8> {
    let mut v = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut v, 80)
        .encode(
            &synth_frame(w, h, 0.3, 1),
            w,
            h,
            image::ExtendedColorType::Rgb8,
        )
        .expect("jpeg");
    v
}

fn png(w: u32, h: u32) -> Vec<u8> {
    use image::ImageEncoder;
    let mut v = Vec::new();
    image::codecs::png::PngEncoder::new(&mut v)
        .write_image(
            &synth_frame(w, h, 0.6, 2),
            w,
            h,
            image::ExtendedColorType::Rgb8,
        )
        .expect("png");
    v
}

/// Inputs the node refused so far (every kind).
fn refused(node: &Node) -> u64 {
    let s = node.status();
    s.bad_frames + s.bad_states + s.bad_audio + s.bad_commands + s.bad_clock
}

impl Target for WireTarget {
    fn name(&self) -> &'static str {
        "wire"
    }
    fn seeds(&mut self) -> Vec<Vec<u8>> {
        let h = header(T0);
        let (w, ht) = (32u32, 24u32);
        let by_kind: Vec<(usize, Vec<u8>)> = vec![
            (
                0,
                msg::Image {
                    header: h.clone(),
                    height: ht,
                    width: w,
                    encoding: "rgb8".into(),
                    is_bigendian: 0,
                    step: w * 3,
                    data: synth_frame(w, ht, 0.1, 0),
                }
                .encode(),
            ),
            (
                1,
                msg::CompressedImage {
                    header: h.clone(),
                    format: "jpeg".into(),
                    data: jpeg(w, ht),
                }
                .encode(),
            ),
            (
                2,
                msg::JointState {
                    header: h.clone(),
                    name: (1..=7).map(|i| format!("j{i}")).collect(),
                    position: vec![0.1, -0.2, 0.3, 0.0, 0.5, -0.6, 0.02],
                    velocity: vec![],
                    effort: vec![],
                }
                .encode(),
            ),
            (
                3,
                msg::StringMsg {
                    data: "put the block in the bowl".into(),
                }
                .encode(),
            ),
            (
                4,
                msg::StringMsg {
                    data: "stop".into(),
                }
                .encode(),
            ),
            (5, msg::Empty::default().encode()),
            (6, msg::Empty::default().encode()),
            (
                7,
                msg::AudioChunk {
                    header: h.clone(),
                    sample_rate: 16000,
                    channels: 1,
                    samples: vec![0.0; 160],
                }
                .encode(),
            ),
            (
                9,
                ros_drivers::AudioDataStamped {
                    header: h.clone(),
                    audio: ros_drivers::AudioData { data: vec![0; 320] },
                }
                .encode(),
            ),
            (
                10,
                msg::Clock {
                    clock: msg::Time::from_secs(T0),
                }
                .encode(),
            ),
        ];
        by_kind
            .into_iter()
            .map(|(k, m)| [&[k as u8, 0][..], &m].concat())
            .collect()
    }
    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        let [k, framing, rest @ ..] = input else {
            return Err("too short".into());
        };
        self.clock.set(T0);
        let kind = &self.kinds[*k as usize % self.kinds.len()];
        let bytes = if framing & 1 == 1 {
            Cdr::Body(rest)
        } else {
            Cdr::Serialized(rest)
        };
        let before = refused(&self.node);
        wire::receive(kind, bytes, &self.inputs, Some(&self.clock));
        let refused = refused(&self.node) > before;
        self.runs += 1;
        if self.runs % TICK_EVERY == 0 {
            if let TickOutcome::Fault(cause) = self.node.tick() {
                return Err(format!("{ORACLE}a tick faulted after an input: {cause}"));
            }
        } else {
            // Commands are acted on between ticks too.
            self.node.drain_commands();
        }
        // The fixed-rate command due now (the manual clock moves with the inputs' stamps).
        if let Some(c) = self.commands.poll(frt_robot_host::Clock::now(&*self.clock)) {
            let what = if c.halt { "hold command" } else { "command" };
            check_actions(what, &c.values, c.halt)?;
        }
        use frt_robot_host::messages::Outbound;
        while let Ok(o) = self.out.0.try_recv() {
            match o {
                Outbound::Chunk(c) => check_actions("chunk", &c.actions, c.halt)?,
                Outbound::Plan(p) => check_actions("plan", &p.rows, p.halt)?,
                _ => {}
            }
        }
        if refused {
            Err(self.node.status().last_error)
        } else {
            Ok(())
        }
    }
    fn hot(&self) -> usize {
        96
    }
    fn reset(&mut self) {
        *self = WireTarget::new();
    }
}

// ---------------------------------------------------------------------------------------
// Camera frames: raw encodings with fuzzed geometry, JPEG and PNG with a pixel limit.

#[derive(Default)]
pub struct FrameTarget {
    out: frt_robot_host::frame::Rgb8,
}

const ENCODINGS: [&str; 7] = ["rgb8", "bgr8", "rgba8", "bgra8", "mono8", "16UC1", "yuv422"];
const FRAME_MAX_PIXELS: u64 = 640 * 480;

impl Target for FrameTarget {
    fn name(&self) -> &'static str {
        "frame"
    }
    fn seeds(&mut self) -> Vec<Vec<u8>> {
        let raw = |enc: u8, w: u32, h: u32, bpp: u32| {
            let mut v = vec![0, enc];
            for x in [w, h, w * bpp] {
                v.extend_from_slice(&x.to_le_bytes());
            }
            v.extend((0..w * h * bpp).map(|i| (i * 13 % 251) as u8));
            v
        };
        vec![
            raw(0, 8, 6, 3),
            raw(1, 8, 6, 3),
            raw(3, 5, 4, 4),
            raw(4, 7, 3, 1),
            [&[1u8, 0][..], &jpeg(40, 30)].concat(),
            [&[1u8, 1][..], &png(40, 30)].concat(),
        ]
    }
    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        let [mode, sel, rest @ ..] = input else {
            return Err("too short".into());
        };
        if mode & 1 == 0 {
            if rest.len() < 12 {
                return Err("too short".into());
            }
            let u = |i: usize| u32::from_le_bytes(rest[i..i + 4].try_into().unwrap());
            let (w, h, step) = (u(0), u(4), u(8));
            let enc = ENCODINGS[*sel as usize % ENCODINGS.len()];
            frt_robot_host::frame::decode_raw(enc, w, h, step, &rest[12..], &mut self.out)
                .map_err(|e| e.to_string())?;
        } else {
            let format = ["jpeg", "png", "rgb8; png compressed bgr8", ""][*sel as usize % 4];
            frt_robot_host::frame::decode_compressed_limited(
                format,
                rest,
                FRAME_MAX_PIXELS,
                &mut self.out,
            )
            .map_err(|e| e.to_string())?;
            if self.out.width as u64 * self.out.height as u64 > FRAME_MAX_PIXELS {
                return Err(format!(
                    "{ORACLE}decoded {}×{} beyond the limit",
                    self.out.width, self.out.height
                ));
            }
        }
        let need = self.out.width as usize * self.out.height as usize * 3;
        if self.out.data.len() != need {
            return Err(format!(
                "{ORACLE}{}×{} image with {} bytes",
                self.out.width,
                self.out.height,
                self.out.data.len()
            ));
        }
        Ok(())
    }
    fn hot(&self) -> usize {
        128
    }
}

// ---------------------------------------------------------------------------------------
// WAV files, then what `transcribe_wav` does before the model (rate check, resampling).

pub struct WavTarget;

fn wav(tag: u16, channels: u16, rate: u32, bits: u16, data: &[u8]) -> Vec<u8> {
    let block = channels * bits.div_ceil(8);
    let mut v = b"RIFF".to_vec();
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

impl Target for WavTarget {
    fn name(&self) -> &'static str {
        "wav"
    }
    fn seeds(&mut self) -> Vec<Vec<u8>> {
        let s16: Vec<u8> = (0..800i16).flat_map(|i| (i * 37).to_le_bytes()).collect();
        let f32s: Vec<u8> = (0..400)
            .flat_map(|i| ((i as f32 * 0.01).sin() * 0.5).to_le_bytes())
            .collect();
        vec![
            wav(1, 1, 16000, 16, &s16),
            wav(1, 2, 44100, 16, &s16),
            wav(3, 1, 16000, 32, &f32s),
            wav(1, 1, 8000, 8, &s16[..400]),
        ]
    }
    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        let w = frt_asr::audio::parse_wav(input).map_err(|e| e.to_string())?;
        if w.sample_rate < frt_asr::audio::MIN_SAMPLE_RATE {
            return Err(format!("{} Hz", w.sample_rate));
        }
        let x = w.to_whisper();
        if let Some(v) = x.iter().find(|v| !v.is_finite()) {
            return Err(format!("{ORACLE}a resampled sample {v}"));
        }
        Ok(())
    }
    fn hot(&self) -> usize {
        48
    }
}

// ---------------------------------------------------------------------------------------
// Tokenizers: load, then encode and decode.

pub struct VlaTokenizerTarget;

impl Target for VlaTokenizerTarget {
    fn name(&self) -> &'static str {
        "vla-tokenizer"
    }
    fn seeds(&mut self) -> Vec<Vec<u8>> {
        vec![
            read("robot_host/assets/demo-tokenizer.json"),
            r#"{"model":{"type":"BPE","unk_token":"<unk>","fuse_unk":true,"vocab":{"<pad>":0,"<bos>":1,"a":2,"b":3,"ab":4,"▁":5,"<unk>":6},"merges":["a b"]},"added_tokens":[{"id":0,"content":"<pad>"},{"id":1,"content":"<bos>"}]}"#.as_bytes().to_vec(),
        ]
    }
    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(input).map_err(|e| e.to_string())?;
        let t = frt_vla::tokenizer::Tokenizer::parse(text, Path::new("fuzz.json"))
            .map_err(|e| e.to_string())?;
        for s in ["pick up the red block", "", "ÄÖ\u{1F916} zz\n\t  ab"] {
            let ids = t.encode(s).map_err(|e| e.to_string())?;
            if let Some(i) = ids.iter().find(|i| **i as usize >= t.vocab_size()) {
                return Err(format!("{ORACLE}id {i} beyond the vocabulary"));
            }
            let _ = t.decode(&ids);
        }
        let _ = t.decode(&[0, 1, 2, u32::MAX]);
        Ok(())
    }
    fn text(&self) -> bool {
        true
    }
}

pub struct WhisperTokenizerTarget;

impl Target for WhisperTokenizerTarget {
    fn name(&self) -> &'static str {
        "whisper-tokenizer"
    }
    fn seeds(&mut self) -> Vec<Vec<u8>> {
        let specials = [
            "<|endoftext|>",
            "<|startoftranscript|>",
            "<|en|>",
            "<|translate|>",
            "<|transcribe|>",
            "<|startoflm|>",
            "<|startofprev|>",
            "<|nospeech|>",
            "<|notimestamps|>",
            "<|0.00|>",
        ];
        let vocab = [
            "h", "e", "l", "o", "Ġ", "he", "ll", "hell", "hello", "Ġhello",
        ];
        let mut v = String::from(r#"{"model":{"type":"BPE","vocab":{"#);
        for (i, t) in vocab.iter().enumerate() {
            v.push_str(&format!("{}\"{t}\":{i}", if i > 0 { "," } else { "" }));
        }
        v.push_str(r#"},"merges":["h e","l l","he ll","hell o",["Ġ","hello"]]},"added_tokens":["#);
        for (i, t) in specials.iter().enumerate() {
            v.push_str(&format!(
                "{}{{\"id\":{},\"content\":\"{t}\",\"special\":true}}",
                if i > 0 { "," } else { "" },
                vocab.len() + i
            ));
        }
        v.push_str("]}");
        vec![v.into_bytes()]
    }
    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(input).map_err(|e| e.to_string())?;
        let t = frt_asr::tokenizer::Tokenizer::from_json(text).map_err(|e| e.to_string())?;
        let ids = t.encode_word(" hello");
        let _ = t.decode(&ids);
        let _ = t.decode(&[0, 5, 9, 15, 19, 1 << 20, u32::MAX]);
        let _ = t.suppressed_tokens();
        Ok(())
    }
    fn text(&self) -> bool {
        true
    }
}

// ---------------------------------------------------------------------------------------
// Checkpoints: the tiny Pi0.5 in safetensors; a tiny Whisper in CTranslate2 and in Hugging
// Face safetensors. Each input is written to a scratch folder and loaded from there.

pub struct VlaCheckpointTarget {
    dir: PathBuf,
    config: frt_vla::config::Pi05Config,
}

impl VlaCheckpointTarget {
    pub fn new() -> VlaCheckpointTarget {
        VlaCheckpointTarget {
            dir: scratch("vla-checkpoint"),
            config: frt_vla::config::Pi05Config::tiny(),
        }
    }
}

impl Default for VlaCheckpointTarget {
    fn default() -> Self {
        Self::new()
    }
}

/// The leading bytes of a safetensors file: the length and the JSON header.
fn safetensors_header(b: &[u8]) -> usize {
    b.get(..8)
        .map(|l| u64::from_le_bytes(l.try_into().unwrap()) as usize + 8)
        .unwrap_or(0)
}

impl Target for VlaCheckpointTarget {
    fn name(&self) -> &'static str {
        "vla-checkpoint"
    }
    fn seeds(&mut self) -> Vec<Vec<u8>> {
        let w = frt_vla::weights::Pi05Weights::random(&self.config, 4);
        let d = self.dir.join("seed");
        w.write(&d, true, 1, false)
            .expect("write the tiny checkpoint");
        let bf16 = std::fs::read(d.join("model.safetensors")).expect("seed");
        // The same with its FP8 weights pre-quantized (E4M3 codes and their scales).
        let q = self.dir.join("seed-fp8");
        let _ = std::fs::remove_dir_all(&q);
        frt_vla::weights::Pi05Weights::load(&d, &self.config)
            .and_then(|b| b.write_fp8(true, true, &q))
            .expect("write the pre-quantized checkpoint");
        let fp8 = std::fs::read(q.join("model.safetensors")).expect("seed");
        w.write(&d, false, 1, true)
            .expect("write the tiny checkpoint");
        let f32_lerobot = std::fs::read(d.join("model.safetensors")).expect("seed");
        vec![bf16, f32_lerobot, fp8]
    }
    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        std::fs::write(self.dir.join("model.safetensors"), input).map_err(|e| e.to_string())?;
        // Opening checks names and shapes; the values are read by the finite check (as an
        // upload reads them).
        frt_vla::weights::Pi05Weights::load(&self.dir, &self.config)
            .and_then(|w| w.check_finite())
            .map_err(|e| e.to_string())
    }
    fn hot(&self) -> usize {
        // The header of the bf16 seed (both have the same tensors).
        self.seeds_hot()
    }
}

impl VlaCheckpointTarget {
    fn seeds_hot(&self) -> usize {
        std::fs::read(self.dir.join("seed/model.safetensors"))
            .map(|b| safetensors_header(&b))
            .unwrap_or(4096)
    }
}

/// A tiny Whisper in CTranslate2's `model.bin` layout (version 6): width 8, 2 heads, one
/// layer each side, 80 mels, 16 audio and 8 text positions, the given vocabulary size.
pub fn tiny_ct2(vocab: usize) -> Vec<u8> {
    let (d, ff, mels) = (8usize, 32usize, 80usize);
    let mut vars: Vec<(String, Vec<usize>)> = vec![
        ("encoder/conv1/weight".into(), vec![d, mels, 3]),
        ("encoder/conv1/bias".into(), vec![d]),
        ("encoder/conv2/weight".into(), vec![d, d, 3]),
        ("encoder/conv2/bias".into(), vec![d]),
        ("encoder/position_encodings/encodings".into(), vec![16, d]),
        ("decoder/embeddings/weight".into(), vec![vocab, d]),
        ("decoder/position_encodings/encodings".into(), vec![8, d]),
    ];
    let norm = |v: &mut Vec<(String, Vec<usize>)>, p: &str| {
        v.push((format!("{p}/gamma"), vec![d]));
        v.push((format!("{p}/beta"), vec![d]));
    };
    let lin = |v: &mut Vec<(String, Vec<usize>)>, p: &str, o: usize, i: usize| {
        v.push((format!("{p}/weight"), vec![o, i]));
        v.push((format!("{p}/bias"), vec![o]));
    };
    norm(&mut vars, "encoder/layer_norm");
    norm(&mut vars, "decoder/layer_norm");
    for side in ["encoder", "decoder"] {
        let p = format!("{side}/layer_0");
        norm(&mut vars, &format!("{p}/self_attention/layer_norm"));
        lin(&mut vars, &format!("{p}/self_attention/linear_0"), 3 * d, d);
        lin(&mut vars, &format!("{p}/self_attention/linear_1"), d, d);
        norm(&mut vars, &format!("{p}/ffn/layer_norm"));
        lin(&mut vars, &format!("{p}/ffn/linear_0"), ff, d);
        lin(&mut vars, &format!("{p}/ffn/linear_1"), d, ff);
        if side == "decoder" {
            norm(&mut vars, &format!("{p}/attention/layer_norm"));
            lin(&mut vars, &format!("{p}/attention/linear_0"), d, d);
            lin(&mut vars, &format!("{p}/attention/linear_1"), 2 * d, d);
            lin(&mut vars, &format!("{p}/attention/linear_2"), d, d);
        }
    }
    let mut b = Vec::new();
    let string = |b: &mut Vec<u8>, s: &str| {
        b.extend_from_slice(&(s.len() as u16 + 1).to_le_bytes());
        b.extend_from_slice(s.as_bytes());
        b.push(0);
    };
    b.extend_from_slice(&6u32.to_le_bytes());
    string(&mut b, "WhisperSpec");
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&(vars.len() as u32 + 2).to_le_bytes());
    for (k, (name, dims)) in vars.iter().enumerate() {
        string(&mut b, name);
        b.push(dims.len() as u8);
        for x in dims {
            b.extend_from_slice(&(*x as u32).to_le_bytes());
        }
        // float16 for half of them, float32 for the rest: both code paths.
        let n: usize = dims.iter().product();
        let half = k % 2 == 0;
        b.push(if half { 4 } else { 0 });
        b.extend_from_slice(&((n * if half { 2 } else { 4 }) as u32).to_le_bytes());
        for i in 0..n {
            let v = ((i * 7 + k) % 17) as f32 * 0.01 - 0.08;
            if half {
                b.extend_from_slice(&half_bits(v).to_le_bytes());
            } else {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    for head in ["encoder/num_heads", "decoder/num_heads"] {
        string(&mut b, head);
        b.push(0);
        b.push(3); // int32
        b.extend_from_slice(&4u32.to_le_bytes());
        b.extend_from_slice(&2i32.to_le_bytes());
    }
    // One alias: the output projection shares the embedding.
    b.extend_from_slice(&1u32.to_le_bytes());
    string(&mut b, "decoder/projection/weight");
    string(&mut b, "decoder/embeddings/weight");
    b
}

/// f32 → IEEE half bits for the small, normal values the seed uses.
fn half_bits(v: f32) -> u16 {
    if v == 0.0 {
        return 0;
    }
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    let man = ((bits >> 13) & 0x3ff) as u16;
    sign | ((exp as u16) << 10) | man
}

pub struct WhisperCheckpointTarget {
    dir: PathBuf,
    hf_config: Vec<u8>,
}

impl WhisperCheckpointTarget {
    pub fn new() -> WhisperCheckpointTarget {
        WhisperCheckpointTarget {
            dir: scratch("whisper-checkpoint"),
            hf_config: Vec::new(),
        }
    }
}

impl Default for WhisperCheckpointTarget {
    fn default() -> Self {
        Self::new()
    }
}

impl Target for WhisperCheckpointTarget {
    fn name(&self) -> &'static str {
        "whisper-checkpoint"
    }
    fn seeds(&mut self) -> Vec<Vec<u8>> {
        use frt_asr::weights::WhisperWeights;
        let ct2 = tiny_ct2(24);
        let seed = self.dir.join("seed");
        std::fs::create_dir_all(&seed).expect("scratch");
        std::fs::write(seed.join("model.bin"), &ct2).expect("scratch");
        let w = WhisperWeights::load_ctranslate2(&seed.join("model.bin"))
            .expect("the tiny CTranslate2 seed loads");
        let hf = self.dir.join("seed-hf");
        w.write_safetensors(&hf).expect("write safetensors");
        self.hf_config = std::fs::read(hf.join("config.json")).expect("config.json");
        let st = std::fs::read(hf.join("model.safetensors")).expect("safetensors");
        // [format] + the file.
        vec![[&[0u8][..], &ct2].concat(), [&[1u8][..], &st].concat()]
    }
    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        use frt_asr::weights::WhisperWeights;
        let [format, file @ ..] = input else {
            return Err("empty".into());
        };
        let io = |e: std::io::Error| e.to_string();
        if format & 1 == 0 {
            let p = self.dir.join("model.bin");
            std::fs::write(&p, file).map_err(io)?;
            WhisperWeights::load_ctranslate2(&p)
        } else {
            let d = self.dir.join("hf");
            std::fs::create_dir_all(&d).map_err(io)?;
            std::fs::write(d.join("config.json"), &self.hf_config).map_err(io)?;
            std::fs::write(d.join("model.safetensors"), file).map_err(io)?;
            WhisperWeights::load_safetensors(&d)
        }
        .map(|_| ())
        .map_err(|e| e.to_string())
    }
    fn hot(&self) -> usize {
        2048
    }
}

// ---------------------------------------------------------------------------------------
// Norm stats, configs and sim scripts: text files.

pub struct NormStatsTarget;

impl Target for NormStatsTarget {
    fn name(&self) -> &'static str {
        "norm-stats"
    }
    fn seeds(&mut self) -> Vec<Vec<u8>> {
        let stats = |n: usize| {
            let list = |f: &dyn Fn(usize) -> f64| {
                (0..n)
                    .map(|i| format!("{}", f(i)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            format!(
                r#"{{"mean": [{}], "std": [{}], "q01": [{}], "q99": [{}]}}"#,
                list(&|i| i as f64 * 0.1),
                list(&|i| 0.5 + i as f64 * 0.01),
                list(&|i| -1.0 - i as f64 * 0.1),
                list(&|i| 1.0 + i as f64 * 0.1)
            )
        };
        vec![
            format!(
                r#"{{"norm_stats": {{"state": {}, "actions": {}}}}}"#,
                stats(8),
                stats(8)
            )
            .into_bytes(),
        ]
    }
    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(input).map_err(|e| e.to_string())?;
        let quantiles = input.len() % 2 == 0;
        let n =
            frt_vla::inputs::Normalization::parse(text, quantiles).map_err(|e| e.to_string())?;
        let mut x = vec![0.25f32; 8];
        n.state
            .normalize(&mut x, quantiles)
            .map_err(|e| e.to_string())?;
        n.actions
            .unnormalize(&mut x, quantiles)
            .map_err(|e| e.to_string())?;
        Ok(())
    }
    fn text(&self) -> bool {
        true
    }
}

pub struct ConfigTarget;

impl Target for ConfigTarget {
    fn name(&self) -> &'static str {
        "config"
    }
    fn seeds(&mut self) -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = ["demo.yaml", "dev_gpu.yaml", "pi05_thor.yaml"]
            .iter()
            .map(|f| read(&format!("robot_host/config/{f}")))
            .collect();
        v.push(WIRE_CONFIG.as_bytes().to_vec());
        v
    }
    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(input).map_err(|e| e.to_string())?;
        let cfg = Config::parse(text).map_err(|e| e.to_string())?;
        // Depends on the machine (the pinned CPU): run, not judged.
        let _ = cfg.validate_for_this_machine();
        wire::Endpoints::new(&cfg, "/", "frt_robot_host", true)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
    fn text(&self) -> bool {
        true
    }
}

pub struct SimTarget;

impl Target for SimTarget {
    fn name(&self) -> &'static str {
        "sim-script"
    }
    fn seeds(&mut self) -> Vec<Vec<u8>> {
        vec![
            read("robot_host/config/demo-sim.yaml"),
            b"duration_s: 3\ncamera_rate_hz: 30\nstate_rate_hz: 100\nevents:\n  - { at: 0.5, drop_camera: wrist }\n  - { at: 1.0, fault: stall }\n  - { at: 2.0, command: stop }\n"
                .to_vec(),
        ]
    }
    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(input).map_err(|e| e.to_string())?;
        SimScript::parse(text)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
    fn text(&self) -> bool {
        true
    }
}
