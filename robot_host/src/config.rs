//! The node's configuration (YAML). Unknown fields are rejected; [`Config::validate`] checks
//! every value and names the field of the first problem (`safety.action_min: …`).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A configuration problem: the field (dotted path) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ConfigError {
    pub field: String,
    pub problem: String,
}

/// Sets the field at a dotted path (mapping keys; list items by index) in a YAML document,
/// creating missing mapping levels.
pub(crate) fn set_path(
    doc: &mut serde_yaml::Value,
    name: &str,
    value: serde_yaml::Value,
) -> Result<(), String> {
    use serde_yaml::Value;
    let parts: Vec<&str> = name.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err("an empty name part".into());
    }
    let mut at = doc;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let here = parts[..=i].join(".");
        at = match at {
            Value::Sequence(items) => {
                let k: usize = part
                    .parse()
                    .map_err(|_| format!("`{here}`: a list, indexed by number"))?;
                let len = items.len();
                items
                    .get_mut(k)
                    .ok_or_else(|| format!("`{here}`: the list has {len} items"))?
            }
            Value::Mapping(m) => {
                let key = Value::String((*part).to_string());
                if !m.contains_key(&key) {
                    m.insert(
                        key.clone(),
                        if last {
                            Value::Null
                        } else {
                            Value::Mapping(Default::default())
                        },
                    );
                }
                m.get_mut(&key).expect("inserted")
            }
            Value::Null if !last => {
                *at = Value::Mapping(Default::default());
                let Value::Mapping(m) = at else {
                    unreachable!()
                };
                m.insert(Value::String((*part).to_string()), Value::Null);
                m.get_mut(*part).expect("inserted")
            }
            _ => return Err(format!("`{}` is not a section", parts[..i].join("."))),
        };
    }
    *at = value;
    Ok(())
}

fn bad(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        problem: problem.into(),
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub node: NodeConfig,
    pub model: ModelConfig,
    pub cameras: Vec<CameraConfig>,
    pub state: StateConfig,
    pub control: ControlConfig,
    pub safety: SafetyConfig,
    /// One entry per action dimension (joint, kind, limits, delta cap, hold rule). Absent: every
    /// dimension from `safety.action_space`, `action_min`, `action_max` and
    /// `max_delta_per_step`, joint k being `state.joints[k]`.
    #[serde(default)]
    pub actions: Option<Vec<ActionDimConfig>>,
    /// How chunks are executed over time (see [`crate::timeline`]).
    #[serde(default)]
    pub execution: ExecutionConfig,
    #[serde(default)]
    pub streams: StreamsConfig,
    /// The op library's tunables (`attention: auto | flash | gemm`, `gemm_tuning`, `split_k`,
    /// `tuning_log`); absent: the defaults.
    #[serde(default)]
    pub kernels: frt_kernels::KernelOptions,
    /// Microphone input; absent: no audio.
    #[serde(default)]
    pub audio: Option<AudioConfig>,
    /// Voice commands; absent: typed commands only.
    #[serde(default)]
    pub asr: Option<AsrConfig>,
    /// ROS 2 outputs beyond the action chunks.
    #[serde(default)]
    pub ros: RosConfig,
    /// The openpi websocket policy server (`frt-robot-host serve`); absent: not served.
    #[serde(default)]
    pub serve: Option<crate::serve::ServeConfig>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RosConfig {
    /// `frame_id` of published headers.
    #[serde(default = "default_frame")]
    pub frame_id: String,
    /// Also publish each chunk as a `trajectory_msgs/JointTrajectory` (for ros2_control).
    #[serde(default)]
    pub joint_trajectory: Option<TrajectoryConfig>,
    /// Publish `/diagnostics` with the status (at most once per second).
    #[serde(default = "yes")]
    pub diagnostics: bool,
    /// Seconds between two status messages (`~/status`, `/diagnostics`), on a timer of their
    /// own: they keep coming when ticks are slow or stuck.
    #[serde(default = "one")]
    pub status_period_s: f64,
    /// The span of the status's recent counts and input rates (seconds): levels derived from
    /// them recover once a problem stops.
    #[serde(default = "ten")]
    pub status_window_s: f64,
}

impl Default for RosConfig {
    fn default() -> Self {
        RosConfig {
            frame_id: default_frame(),
            joint_trajectory: None,
            diagnostics: true,
            status_period_s: one(),
            status_window_s: ten(),
        }
    }
}

fn one() -> f64 {
    1.0
}

fn ten() -> f64 {
    10.0
}

fn default_frame() -> String {
    "base_link".into()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TrajectoryConfig {
    pub topic: String,
    /// One joint name per action dimension (`control.action_dim` of them).
    pub joints: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Node name (diagnostics are named `"<name>: <task>"`).
    #[serde(default = "default_node_name")]
    pub name: String,
}

fn default_node_name() -> String {
    "frt_robot_host".into()
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            name: default_node_name(),
        }
    }
}

/// Where the weights come from (`model.checkpoint` or `model.random`).
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    /// A checkpoint folder (openpi or LeRobot safetensors naming).
    Checkpoint(PathBuf),
    /// Deterministic random weights of the tiny configuration (demos, tests).
    RandomTiny { seed: u64 },
    /// Deterministic random weights at full size (benchmarks).
    RandomBase { seed: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelSize {
    Tiny,
    Base,
}

/// `model.random`: generated weights.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RandomModel {
    pub size: ModelSize,
    #[serde(default)]
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    F32,
    Bf16,
    F16,
    /// bf16, with Pi0.5's SigLIP, language model and action expert in FP8 (E4M3 weights per
    /// output feature, activations with the static scales of `model.calibration`;
    /// `frt-robot-host calibrate` records one).
    Fp8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// CUDA device 0 when present, else the host backend.
    Auto,
    Host,
    Cuda,
}

/// How the prompt sits in the prefix. In `exact` mode a prompt of a length not seen yet (a
/// new subgoal, or state digits tokenizing to another count) captures a prefix graph on the
/// control thread before that tick's inference (milliseconds on a GPU); the 8 most recent
/// lengths are kept.
pub use frt_vla::PromptMode;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Which model (`pi05`, the default, or `pi0`).
    #[serde(default)]
    pub kind: ModelKind,
    /// A checkpoint folder (openpi or LeRobot naming).
    #[serde(default)]
    pub checkpoint: Option<PathBuf>,
    /// Generated weights instead of a checkpoint.
    #[serde(default)]
    pub random: Option<RandomModel>,
    /// `tokenizer.json` (PaliGemma's for real checkpoints). Absent with a tiny random model: the
    /// small tokenizer bundled for demos.
    #[serde(default)]
    pub tokenizer: Option<PathBuf>,
    /// `norm_stats.json` of the checkpoint (state in, actions out). Absent: identity.
    #[serde(default)]
    pub norm_stats: Option<PathBuf>,
    /// Use the quantile (q01/q99) normalization instead of mean/std.
    #[serde(default)]
    pub quantile_norm: bool,
    pub precision: Precision,
    /// The FP8 calibration file (`precision: fp8` needs one; see `frt-robot-host calibrate`).
    #[serde(default)]
    pub calibration: Option<PathBuf>,
    /// With `precision: fp8`: SigLIP's GEMMs in FP8 too (absent: yes). On an H100 they cost
    /// time (see the README's FP8 figures); on a bandwidth-bound device they halve its weight
    /// bytes.
    #[serde(default)]
    pub fp8_vision: Option<bool>,
    /// With `precision: fp8`: the language model's GEMMs in FP8 too (absent: yes); the action
    /// expert's always are.
    #[serde(default)]
    pub fp8_prefix: Option<bool>,
    #[serde(default = "default_backend")]
    pub backend: Backend,
    #[serde(default)]
    pub prompt_mode: PromptMode,
    /// Prompt capacity in tokens (fixed mode).
    pub max_token_len: usize,
    /// Rows of a chunk (openpi `action_horizon`: 50 for pi05_base, 15 for pi05_droid, 10 for
    /// pi05_libero). Absent: the checkpoint's `config.json` says, else 50. Given with a
    /// checkpoint whose `config.json` says otherwise: refused.
    #[serde(default)]
    pub action_horizon: Option<usize>,
}

impl ModelConfig {
    /// Where the weights come from (validated: exactly one of `checkpoint`, `random`).
    pub fn source(&self) -> ModelSource {
        match (&self.checkpoint, &self.random) {
            (Some(p), _) => ModelSource::Checkpoint(p.clone()),
            (
                None,
                Some(RandomModel {
                    size: ModelSize::Tiny,
                    seed,
                }),
            ) => ModelSource::RandomTiny { seed: *seed },
            (None, Some(RandomModel { seed, .. })) => ModelSource::RandomBase { seed: *seed },
            (None, None) => ModelSource::RandomTiny { seed: 0 },
        }
    }
}

/// The model families the node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// openpi `pi05` (Pi0.5: discretized state in the prompt, adaptive-norm action expert).
    #[default]
    Pi05,
    /// openpi `pi0` (Pi0: the state as a continuous token in front of the actions, the prompt
    /// without it; at most `action_dim` state values).
    Pi0,
}

fn default_backend() -> Backend {
    Backend::Auto
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageFormat {
    /// `sensor_msgs/Image` (rgb8, bgr8, rgba8, bgra8, mono8).
    Raw,
    /// `sensor_msgs/CompressedImage` (JPEG or PNG).
    Compressed,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CameraConfig {
    pub name: String,
    pub topic: String,
    pub format: ImageFormat,
    /// The model's image slot this camera fills (0-based).
    pub view: usize,
    /// Whether a tick may run without this camera (see `safety.missing_camera`).
    #[serde(default = "yes")]
    pub required: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    pub topic: String,
    /// Joint names in the order the model's state vector uses; incoming `JointState` messages
    /// are reordered by name.
    pub joints: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// Control ticks per second.
    pub rate_hz: f64,
    /// The subgoal at start-up.
    pub initial_subgoal: String,
    /// Action dimensions the robot uses (the first ones of the model's action vector).
    pub action_dim: usize,
    /// Seconds between two actions of a chunk.
    pub dt: f64,
    /// Seed of the flow-matching noise (each tick draws new noise from this stream).
    #[serde(default)]
    pub noise_seed: u64,
    /// Pin the control thread to this CPU.
    #[serde(default)]
    pub cpu: Option<usize>,
    /// SCHED_FIFO and mlockall for the control thread, when permitted.
    #[serde(default)]
    pub realtime: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingCamera {
    /// Run with the view masked (as openpi does for absent views).
    Degrade,
    /// While the robot executes chunks, a required camera (or every camera) going stale
    /// halts: one halt chunk, then the node stays halted until resumed. Before the first
    /// chunk and after a resume, ticks only wait for the cameras.
    Halt,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionSpace {
    /// Targets: a halt holds the latest measured position (or publishes no targets when no
    /// fresh, finite state is known).
    Position,
    /// Velocities: a halt holds zero.
    Velocity,
}

/// What one action dimension commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// A joint position target.
    Position,
    /// A joint velocity.
    Velocity,
    /// A gripper position (openpi's DROID: 0 open, 1 closed).
    Gripper,
}

/// What a halt commands for one dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldRule {
    /// The latest measured position (fresh within the age bounds); none known: the halt
    /// carries no targets. Position and gripper dimensions.
    Measured,
    /// Zero. Velocity dimensions (the only rule they take).
    Zero,
    /// The latest measured position, else the command being executed now (motion already
    /// commanded, never a row ahead of it); neither: no targets. Position and gripper
    /// dimensions; a robot with velocity dimensions needs it on its other dimensions, so
    /// that a halt always has a row (zero velocity must be commanded even without state).
    Current,
}

/// One entry of `actions`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ActionDimConfig {
    /// The joint it commands (one of `state.joints`).
    pub joint: String,
    pub kind: ActionKind,
    /// The model predicts the change from the joint's state at the observation (openpi's
    /// `DeltaActions` / `AbsoluteActions`): the node adds the measured position back.
    /// Position and gripper dimensions.
    #[serde(default)]
    pub delta: bool,
    pub min: f32,
    pub max: f32,
    /// Largest change between two consecutive commands (for a velocity: an acceleration
    /// bound, per row).
    #[serde(default)]
    pub max_delta: Option<f32>,
    /// Absent: `measured` for position and gripper, `zero` for velocity.
    #[serde(default)]
    pub hold: Option<HoldRule>,
}

/// An action dimension as the node executes it (`Config::action_dims`).
#[derive(Debug, Clone, PartialEq)]
pub struct ActionDim {
    pub joint: String,
    /// Where the joint is in the state vector (`state.joints`).
    pub state_index: usize,
    pub kind: ActionKind,
    pub delta: bool,
    pub min: f32,
    pub max: f32,
    pub max_delta: Option<f32>,
    pub hold: HoldRule,
}

/// Rows of a chunk already in the past when it is published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PastRows {
    /// Kept; the chunk says which row is due (`due_row`).
    #[default]
    Mark,
    /// Removed: the chunk starts at the row due, stamped with its due time.
    Drop,
}

/// How a new chunk takes over from the one being executed (see [`crate::timeline`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HandoverKind {
    /// The new chunk's rows replace the old ones from the row due on.
    #[default]
    Replace,
    /// Over `crossfade_rows` rows the command moves linearly from the old chunk's rows to
    /// the new chunk's.
    Crossfade,
    /// Each row is the weighted mean of every chunk's prediction for its time, a chunk's
    /// weight `exp(−ensemble_decay · i)` with i the number of predictions before it (ACT's
    /// temporal ensembling, as LeRobot computes it).
    TemporalEnsemble,
}

/// The message of the fixed-rate command stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandMessage {
    /// `std_msgs/Float64MultiArray`, one value per action dimension (ros2_control's
    /// forward command controllers).
    #[default]
    Float64MultiArray,
    /// `sensor_msgs/JointState`: names, `position` for position and gripper dimensions,
    /// `velocity` for velocity dimensions (NaN where a joint is commanded the other way).
    JointState,
}

/// `execution.command_stream`: one command per period.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CommandStreamConfig {
    pub topic: String,
    pub rate_hz: f64,
    #[serde(default)]
    pub message: CommandMessage,
}

/// `execution`: the chunk time model's settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionConfig {
    /// Rows a consumer should execute before it takes the next chunk (carried in each
    /// chunk). Absent: the whole horizon.
    #[serde(default)]
    pub execution_horizon: Option<usize>,
    #[serde(default)]
    pub past_rows: PastRows,
    #[serde(default)]
    pub handover: HandoverKind,
    /// Rows over which `crossfade` blends (1 to the horizon).
    #[serde(default = "default_crossfade_rows")]
    pub crossfade_rows: usize,
    /// `temporal_ensemble`'s weight decay per prediction (LeRobot's
    /// `temporal_ensemble_coeff`; 0: a plain mean; negative favours newer predictions).
    #[serde(default = "default_ensemble_decay")]
    pub ensemble_decay: f64,
    /// Publish the command due now at a fixed rate.
    #[serde(default)]
    pub command_stream: Option<CommandStreamConfig>,
    /// Frozen-prefix denoising (real-time chunking's hard mask, training-free): the rows of a
    /// new chunk that will be due before it can be published (the recent inference delay,
    /// ⌈delay / dt⌉ rows) are frozen to the chunk being executed, so that the new chunk
    /// continues it. Written into buffers before each tick; no recapture.
    #[serde(default)]
    pub inpaint_prefix: bool,
}

impl Default for ExecutionConfig {
    fn default() -> Self {
        ExecutionConfig {
            execution_horizon: None,
            past_rows: PastRows::default(),
            handover: HandoverKind::default(),
            crossfade_rows: default_crossfade_rows(),
            ensemble_decay: default_ensemble_decay(),
            command_stream: None,
            inpaint_prefix: false,
        }
    }
}

fn default_crossfade_rows() -> usize {
    4
}
fn default_ensemble_decay() -> f64 {
    0.01
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SafetyConfig {
    /// No chunk from an observation (frame or state) older than this.
    pub max_observation_age_ms: f64,
    /// A camera that is required but silent for longer than the age bound.
    pub missing_camera: MissingCamera,
    /// Every action dimension's kind, when `actions` is not given.
    #[serde(default)]
    pub action_space: Option<ActionSpace>,
    /// Lower and upper bound per action dimension (one value: every dimension), when `actions`
    /// is not given.
    #[serde(default)]
    pub action_min: Option<Vec<f32>>,
    #[serde(default)]
    pub action_max: Option<Vec<f32>>,
    /// Largest change between consecutive actions (and from the command a new chunk takes
    /// over from to its first due row; see [`crate::timeline`]), per dimension (one value:
    /// every dimension).
    #[serde(default)]
    pub max_delta_per_step: Option<Vec<f32>>,
    /// Frames and states stamped further than this ahead of the node clock are refused
    /// (seconds).
    #[serde(default = "default_max_future")]
    pub max_future_s: f64,
    /// A tick running longer than this many control periods halts the robot and ends the
    /// process (a stuck device or driver).
    #[serde(default = "default_watchdog")]
    pub watchdog_factor: f64,
    /// Largest camera image accepted, in pixels (width × height), checked from the header
    /// before a compressed image is decoded.
    #[serde(default = "default_max_pixels")]
    pub max_image_pixels: u64,
}

fn default_max_future() -> f64 {
    0.05
}
fn default_watchdog() -> f64 {
    10.0
}
fn default_max_pixels() -> u64 {
    3840 * 2160
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StreamsConfig {
    /// Priority of the policy stream (CUDA convention: 0 normal, more negative higher).
    /// Absent: one above the least the device allows (above speech recognition).
    #[serde(default)]
    pub policy: Option<i32>,
    /// Priority of the halt stream. Absent: the highest the device allows.
    #[serde(default)]
    pub halt: Option<i32>,
    /// Priority of the speech recognition stream. Absent: the least the device allows.
    #[serde(default)]
    pub asr: Option<i32>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AudioConfig {
    pub topic: String,
    /// The message type on the topic: `frt` (frt_msgs/AudioChunk), `audio_stamped`
    /// (audio_common_msgs/AudioStamped), `audio_data` (audio_common_msgs/AudioData, raw PCM).
    #[serde(default = "default_audio_kind")]
    pub kind: String,
    /// Sample rate and channels of raw PCM (`audio_data`).
    #[serde(default)]
    pub sample_rate: Option<u32>,
    #[serde(default)]
    pub channels: Option<u16>,
    /// Raw PCM sample format (`audio_data`): `s16le` or `f32le`.
    #[serde(default = "default_pcm")]
    pub sample_format: String,
}

fn default_pcm() -> String {
    "s16le".into()
}

fn default_audio_kind() -> String {
    "frt".into()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AsrConfig {
    /// A Whisper model folder (`model.bin` or `model.safetensors`, `config.json`,
    /// `tokenizer.json`).
    pub model: PathBuf,
    /// Utterances that stop the robot (matched after lower-casing and removing punctuation).
    #[serde(default = "default_stop_words")]
    pub stop_words: Vec<String>,
    /// Utterances that resume motion (only when `voice_may_resume`).
    #[serde(default = "default_resume_words")]
    pub resume_words: Vec<String>,
    /// Whether a spoken resume word may resume motion.
    #[serde(default)]
    pub voice_may_resume: bool,
    /// Lowest average token log-probability accepted for a stop (permissive: a false stop is
    /// cheap).
    #[serde(default = "default_stop_confidence")]
    pub min_logprob_stop: f32,
    /// Lowest average token log-probability accepted for a new subgoal (stricter).
    #[serde(default = "default_subgoal_confidence")]
    pub min_logprob_subgoal: f32,
    /// Highest no-speech probability accepted for a new subgoal.
    #[serde(default = "default_no_speech")]
    pub max_no_speech_subgoal: f32,
    /// When given, spoken subgoals must be one of these (after normalization).
    #[serde(default)]
    pub vocabulary: Option<Vec<String>>,
}

fn default_stop_words() -> Vec<String> {
    ["stop", "halt", "freeze"].map(String::from).to_vec()
}
fn default_resume_words() -> Vec<String> {
    ["resume", "continue"].map(String::from).to_vec()
}
fn default_stop_confidence() -> f32 {
    -2.0
}
fn default_subgoal_confidence() -> f32 {
    -0.6
}
fn default_no_speech() -> f32 {
    0.5
}

impl Config {
    /// Reads and validates a YAML file; relative paths in it are taken from its folder.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad(path.display().to_string(), format!("cannot read: {e}")))?;
        let mut c = Config::parse(&text)?;
        if let Some(dir) = path.parent() {
            c.resolve_paths(dir);
        }
        Ok(c)
    }

    /// [`load`](Self::load) with fields overridden by name (ROS 2 parameters: `-p
    /// control.rate_hz:=20`, `--params-file`): each `(dotted.name, value)` replaces that field,
    /// the value read as YAML (`20`, `bf16`, `[-1.0, 1.0]`), list items by index
    /// (`cameras.0.topic`). The result is validated as a whole; a name that is not a field or a
    /// value of the wrong kind is an error naming the parameter.
    pub fn load_with(path: &Path, overrides: &[(String, String)]) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad(path.display().to_string(), format!("cannot read: {e}")))?;
        let mut doc: serde_yaml::Value = serde_yaml::from_str(&text)
            .map_err(|e| bad(path.display().to_string(), e.to_string()))?;
        for (name, value) in overrides {
            let param = || format!("parameter `{name}`");
            let v: serde_yaml::Value = serde_yaml::from_str(value)
                .map_err(|e| bad(param(), format!("{value:?} is not a YAML value: {e}")))?;
            set_path(&mut doc, name, v).map_err(|why| bad(param(), why))?;
            // Each override is checked as it is applied, so that an error names its parameter.
            serde_yaml::from_value::<Config>(doc.clone()).map_err(|e| {
                bad(
                    param(),
                    format!("{e} (configuration fields are dotted names, e.g. control.rate_hz)"),
                )
            })?;
        }
        let mut c: Config =
            serde_yaml::from_value(doc).map_err(|e| bad("config", e.to_string()))?;
        c.validate()?;
        if let Some(dir) = path.parent() {
            c.resolve_paths(dir);
        }
        Ok(c)
    }

    /// Parses and validates YAML text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let c: Config = serde_yaml::from_str(text).map_err(|e| {
            let at = e
                .location()
                .map(|l| format!(" (line {}, column {})", l.line(), l.column()))
                .unwrap_or_default();
            bad("config", format!("{e}{at}"))
        })?;
        c.validate()?;
        Ok(c)
    }

    fn resolve_paths(&mut self, dir: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        };
        self.model.checkpoint.as_mut().map(fix);
        self.model.tokenizer.as_mut().map(fix);
        self.model.norm_stats.as_mut().map(fix);
        if let Some(a) = &mut self.asr {
            fix(&mut a.model);
        }
    }

    /// Every check that needs no file: the first problem, with its field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.node.name.is_empty()
            || !self
                .node
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(bad(
                "node.name",
                "must be a non-empty ROS name (letters, digits, '_')",
            ));
        }
        let m = &self.model;
        if m.max_token_len == 0 || m.max_token_len > 1024 {
            return Err(bad("model.max_token_len", "must be 1 to 1024"));
        }
        if m.checkpoint.is_some() == m.random.is_some() {
            return Err(bad(
                "model",
                "give exactly one of `checkpoint` (a folder) and `random` ({ size, seed })",
            ));
        }
        if !matches!(m.source(), ModelSource::RandomTiny { .. }) && m.tokenizer.is_none() {
            return Err(bad(
                "model.tokenizer",
                "required (the bundled tokenizer only fits the tiny random model)",
            ));
        }
        match (m.precision, &m.calibration, m.kind) {
            (Precision::Fp8, None, _) => {
                return Err(bad(
                    "model.calibration",
                    "`precision: fp8` needs a calibration file (`frt-robot-host calibrate` records one)",
                ));
            }
            (Precision::Fp8, _, ModelKind::Pi0) => {
                return Err(bad(
                    "model.precision",
                    "fp8 is for Pi0.5 (its action expert); Pi0 runs in f32, bf16 or f16",
                ));
            }
            (p, Some(_), _) if p != Precision::Fp8 => {
                return Err(bad(
                    "model.calibration",
                    format!("is for `precision: fp8` (this configuration says {p:?})"),
                ));
            }
            _ => {}
        }
        for (field, set) in [
            ("model.fp8_vision", m.fp8_vision.is_some()),
            ("model.fp8_prefix", m.fp8_prefix.is_some()),
        ] {
            if set && m.precision != Precision::Fp8 {
                return Err(bad(
                    field,
                    format!(
                        "is for `precision: fp8` (this configuration says {:?})",
                        m.precision
                    ),
                ));
            }
        }
        if self.cameras.is_empty() {
            return Err(bad("cameras", "at least one camera is needed"));
        }
        for (i, c) in self.cameras.iter().enumerate() {
            let f = |n: &str| format!("cameras[{i}].{n}");
            if c.name.is_empty() {
                return Err(bad(f("name"), "empty"));
            }
            if !valid_topic(&c.topic) {
                return Err(bad(
                    f("topic"),
                    format!("`{}` is not a ROS topic name", c.topic),
                ));
            }
            if let Some(j) = self.cameras[..i].iter().position(|o| o.name == c.name) {
                return Err(bad(f("name"), format!("`{}` repeats cameras[{j}]", c.name)));
            }
            if let Some(j) = self.cameras[..i].iter().position(|o| o.view == c.view) {
                return Err(bad(
                    f("view"),
                    format!("slot {} is taken by cameras[{j}]", c.view),
                ));
            }
        }
        let views = self.views();
        if let Some(i) = (0..views).find(|v| !self.cameras.iter().any(|c| c.view == *v)) {
            return Err(bad(
                "cameras",
                format!("view slots must be 0..{views} without gaps; slot {i} has no camera"),
            ));
        }
        if !self.cameras.iter().any(|c| c.required) {
            return Err(bad("cameras", "at least one camera must be required"));
        }
        if !valid_topic(&self.state.topic) {
            return Err(bad("state.topic", "not a ROS topic name"));
        }
        if self.state.joints.is_empty() || self.state.joints.len() > 32 {
            return Err(bad("state.joints", "1 to 32 joint names"));
        }
        if let Some(j) = self
            .state
            .joints
            .iter()
            .enumerate()
            .find_map(|(i, n)| self.state.joints[..i].contains(n).then_some(n))
        {
            return Err(bad("state.joints", format!("`{j}` appears twice")));
        }
        let c = &self.control;
        if !(c.rate_hz.is_finite() && (0.1..=1000.0).contains(&c.rate_hz)) {
            return Err(bad(
                "control.rate_hz",
                format!("{:?} Hz; must be 0.1 to 1000", c.rate_hz),
            ));
        }
        if c.cpu.is_some_and(|cpu| cpu >= libc::CPU_SETSIZE as usize) {
            return Err(bad(
                "control.cpu",
                format!("beyond the {} CPUs a CPU set holds", libc::CPU_SETSIZE),
            ));
        }
        if c.initial_subgoal.trim().is_empty() {
            return Err(bad("control.initial_subgoal", "empty"));
        }
        if c.action_dim == 0 || c.action_dim > 32 {
            return Err(bad(
                "control.action_dim",
                "1 to 32 (the model's action dim)",
            ));
        }
        if c.action_dim > self.state.joints.len() {
            return Err(bad(
                "control.action_dim",
                format!(
                    "{} action dimensions for {} joints in state.joints (a position hold needs a measured joint per dimension)",
                    c.action_dim,
                    self.state.joints.len()
                ),
            ));
        }
        if !(c.dt.is_finite() && c.dt > 0.0 && c.dt <= 10.0) {
            return Err(bad(
                "control.dt",
                "must be a positive number of seconds (≤ 10)",
            ));
        }
        let s = &self.safety;
        if !(s.max_observation_age_ms.is_finite()
            && s.max_observation_age_ms > 0.0
            && s.max_observation_age_ms <= 3_600_000.0)
        {
            return Err(bad(
                "safety.max_observation_age_ms",
                "must be positive (at most 3600000, an hour)",
            ));
        }
        if !(s.max_future_s.is_finite() && (0.0..=1.0).contains(&s.max_future_s)) {
            return Err(bad("safety.max_future_s", "seconds, 0 to 1"));
        }
        if !(s.watchdog_factor.is_finite() && (1.5..=1000.0).contains(&s.watchdog_factor)) {
            return Err(bad(
                "safety.watchdog_factor",
                "control periods, 1.5 to 1000",
            ));
        }
        if !(64 * 64..=crate::frame::MAX_SIDE as u64 * crate::frame::MAX_SIDE as u64)
            .contains(&s.max_image_pixels)
        {
            return Err(bad(
                "safety.max_image_pixels",
                format!(
                    "{}; 4096 to {} pixels",
                    s.max_image_pixels,
                    crate::frame::MAX_SIDE as u64 * crate::frame::MAX_SIDE as u64
                ),
            ));
        }
        let dims = self.action_dims()?;
        let velocities = dims
            .iter()
            .filter(|d| d.kind == ActionKind::Velocity)
            .count();
        if self.ros.joint_trajectory.is_some() && velocities != 0 && velocities != dims.len() {
            return Err(bad(
                "ros.joint_trajectory",
                "a JointTrajectory carries positions or velocities, and these actions mix both; use execution.command_stream",
            ));
        }
        let e = &self.execution;
        if e.execution_horizon == Some(0) {
            return Err(bad("execution.execution_horizon", "at least 1 row"));
        }
        if e.crossfade_rows == 0 {
            return Err(bad("execution.crossfade_rows", "at least 1 row"));
        }
        if !(e.ensemble_decay.is_finite() && e.ensemble_decay.abs() <= 10.0) {
            return Err(bad("execution.ensemble_decay", "a number from -10 to 10"));
        }
        if let Some(cs) = &e.command_stream {
            if !valid_topic(&cs.topic) {
                return Err(bad(
                    "execution.command_stream.topic",
                    "not a ROS topic name",
                ));
            }
            if !(cs.rate_hz.is_finite() && (0.1..=1000.0).contains(&cs.rate_hz)) {
                return Err(bad(
                    "execution.command_stream.rate_hz",
                    format!("{:?} Hz; must be 0.1 to 1000", cs.rate_hz),
                ));
            }
        }
        if m.action_horizon.is_some_and(|h| !(1..=1000).contains(&h)) {
            return Err(bad("model.action_horizon", "1 to 1000 rows"));
        }
        let r = &self.ros;
        if !(r.status_period_s >= 0.01 && r.status_period_s <= 60.0) {
            return Err(bad("ros.status_period_s", "0.01 to 60 seconds"));
        }
        if !(r.status_window_s >= r.status_period_s && r.status_window_s <= 3600.0) {
            return Err(bad(
                "ros.status_window_s",
                "from ros.status_period_s to 3600 seconds",
            ));
        }
        if let Some(t) = &self.ros.joint_trajectory {
            if !valid_topic(&t.topic) {
                return Err(bad("ros.joint_trajectory.topic", "not a ROS topic name"));
            }
            if t.joints.len() != c.action_dim {
                return Err(bad(
                    "ros.joint_trajectory.joints",
                    format!(
                        "{} names for control.action_dim = {}",
                        t.joints.len(),
                        c.action_dim
                    ),
                ));
            }
        }
        if let Some(a) = &self.audio {
            if !valid_topic(&a.topic) {
                return Err(bad("audio.topic", "not a ROS topic name"));
            }
            match a.kind.as_str() {
                "frt" | "audio_stamped" => {}
                "audio_data" => {
                    if a.sample_rate.is_none_or(|r| !(8000..=192_000).contains(&r)) {
                        return Err(bad(
                            "audio.sample_rate",
                            "raw PCM (`audio_data`) needs a rate of 8000 to 192000 Hz",
                        ));
                    }
                    if a.channels.is_none_or(|c| !(1..=8).contains(&c)) {
                        return Err(bad("audio.channels", "raw PCM needs 1 to 8 channels"));
                    }
                    if !matches!(a.sample_format.as_str(), "s16le" | "f32le") {
                        return Err(bad("audio.sample_format", "s16le or f32le"));
                    }
                }
                k => {
                    return Err(bad(
                        "audio.kind",
                        format!("`{k}`; expected frt, audio_stamped or audio_data"),
                    ));
                }
            }
        }
        if let Some(a) = &self.asr {
            if self.audio.is_none() {
                return Err(bad("asr", "voice commands need an `audio` section"));
            }
            if a.stop_words.iter().all(|w| normalize_words(w).is_empty()) {
                return Err(bad("asr.stop_words", "at least one stop word"));
            }
            for (n, v) in [
                ("min_logprob_stop", a.min_logprob_stop),
                ("min_logprob_subgoal", a.min_logprob_subgoal),
            ] {
                if !(v.is_finite() && v <= 0.0) {
                    return Err(bad(format!("asr.{n}"), "a log-probability (≤ 0)"));
                }
            }
            if !(0.0..=1.0).contains(&a.max_no_speech_subgoal) {
                return Err(bad("asr.max_no_speech_subgoal", "a probability in [0, 1]"));
            }
            if a.vocabulary.as_ref().is_some_and(|v| v.is_empty()) {
                return Err(bad(
                    "asr.vocabulary",
                    "empty; leave it out to accept any subgoal",
                ));
            }
        }
        Ok(())
    }

    /// What depends on the machine the node runs on (the pinned CPU exists): checked when a
    /// node is built and by `check`, not by [`Config::validate`] (a robot's configuration
    /// stays valid on a development machine).
    pub fn validate_for_this_machine(&self) -> Result<(), ConfigError> {
        if let Some(cpu) = self.control.cpu {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            let cpus = online_cpus().unwrap_or(n);
            if cpu >= cpus {
                return Err(bad(
                    "control.cpu",
                    format!("CPU {cpu}; this machine has CPUs 0 to {}", cpus - 1),
                ));
            }
        }
        Ok(())
    }

    /// Image slots of the model (one per camera).
    pub fn views(&self) -> usize {
        self.cameras.len()
    }
}

impl StreamsConfig {
    /// (policy, halt, asr) priorities for a device whose range is `(least, greatest)`.
    pub fn resolve(&self, (lo, hi): (i32, i32)) -> (i32, i32, i32) {
        let above_least = if hi < lo { lo - 1 } else { lo };
        (
            self.policy.unwrap_or(above_least),
            self.halt.unwrap_or(hi),
            self.asr.unwrap_or(lo),
        )
    }
}

impl Config {
    /// Every action dimension as the node executes it: from `actions`, or from the uniform
    /// `safety` fields (joint k = `state.joints[k]`). The first problem names its field.
    pub fn action_dims(&self) -> Result<Vec<ActionDim>, ConfigError> {
        let d = self.control.action_dim;
        let s = &self.safety;
        let joints = &self.state.joints;
        let Some(list) = &self.actions else {
            let (Some(space), Some(lo), Some(hi)) = (s.action_space, &s.action_min, &s.action_max)
            else {
                return Err(bad(
                    "safety.action_space",
                    "action_space, action_min and action_max are required unless `actions` gives every dimension",
                ));
            };
            let per_dim = |name: &str, v: &[f32]| -> Result<(), ConfigError> {
                if v.len() != 1 && v.len() != d {
                    return Err(bad(
                        format!("safety.{name}"),
                        format!("{} values; give 1 or control.action_dim = {d}", v.len()),
                    ));
                }
                if let Some(x) = v.iter().find(|x| !x.is_finite()) {
                    return Err(bad(format!("safety.{name}"), format!("{x} is not finite")));
                }
                Ok(())
            };
            per_dim("action_min", lo)?;
            per_dim("action_max", hi)?;
            if let Some(dc) = &s.max_delta_per_step {
                per_dim("max_delta_per_step", dc)?;
                if dc.iter().any(|x| *x <= 0.0) {
                    return Err(bad("safety.max_delta_per_step", "must be positive"));
                }
            }
            let at = |v: &[f32], k: usize| v[k.min(v.len() - 1)];
            let (kind, hold) = match space {
                ActionSpace::Position => (ActionKind::Position, HoldRule::Measured),
                ActionSpace::Velocity => (ActionKind::Velocity, HoldRule::Zero),
            };
            if joints.len() < d {
                return Err(bad(
                    "control.action_dim",
                    format!(
                        "{d} dimensions for {} joints in `state.joints`",
                        joints.len()
                    ),
                ));
            }
            let mut dims = Vec::with_capacity(d);
            for (k, joint) in joints.iter().enumerate().take(d) {
                let (min, max) = (at(lo, k), at(hi, k));
                if min > max {
                    return Err(bad(
                        "safety.action_min",
                        format!("dimension {k}: min {min} above max {max}"),
                    ));
                }
                dims.push(ActionDim {
                    joint: joint.clone(),
                    state_index: k,
                    kind,
                    delta: false,
                    min,
                    max,
                    max_delta: s.max_delta_per_step.as_deref().map(|v| at(v, k)),
                    hold,
                });
            }
            return Ok(dims);
        };
        if s.action_space.is_some()
            || s.action_min.is_some()
            || s.action_max.is_some()
            || s.max_delta_per_step.is_some()
        {
            return Err(bad(
                "safety.action_space",
                "give either `actions` (per dimension) or safety.action_space, action_min, action_max and max_delta_per_step, not both",
            ));
        }
        if list.len() != d {
            return Err(bad(
                "actions",
                format!("{} entries for control.action_dim = {d}", list.len()),
            ));
        }
        let velocity = list.iter().any(|a| a.kind == ActionKind::Velocity);
        let mut dims = Vec::with_capacity(d);
        for (i, a) in list.iter().enumerate() {
            let f = |n: &str| format!("actions[{i}].{n}");
            let Some(state_index) = joints.iter().position(|j| *j == a.joint) else {
                return Err(bad(
                    f("joint"),
                    format!("`{}` is not one of state.joints", a.joint),
                ));
            };
            if let Some(j) = list[..i].iter().position(|o| o.joint == a.joint) {
                return Err(bad(
                    f("joint"),
                    format!("`{}` repeats actions[{j}]", a.joint),
                ));
            }
            if !(a.min.is_finite() && a.max.is_finite()) || a.min > a.max {
                return Err(bad(
                    f("min"),
                    format!("min {} and max {} must be finite, min ≤ max", a.min, a.max),
                ));
            }
            if a.max_delta.is_some_and(|x| !(x.is_finite() && x > 0.0)) {
                return Err(bad(f("max_delta"), "must be positive and finite"));
            }
            let hold = match (a.kind, a.hold) {
                (ActionKind::Velocity, None | Some(HoldRule::Zero)) => HoldRule::Zero,
                (ActionKind::Velocity, Some(_)) => {
                    return Err(bad(f("hold"), "a velocity holds zero"));
                }
                (_, Some(HoldRule::Zero)) => {
                    return Err(bad(
                        f("hold"),
                        "`zero` would command a position of 0; use measured or current",
                    ));
                }
                (_, None | Some(HoldRule::Measured)) if velocity => {
                    return Err(bad(
                        f("hold"),
                        "with velocity dimensions, position and gripper dimensions need `hold: current`, so that a halt always commands zero velocity",
                    ));
                }
                (_, h) => h.unwrap_or(HoldRule::Measured),
            };
            if a.delta && a.kind == ActionKind::Velocity {
                return Err(bad(f("delta"), "only position and gripper dimensions"));
            }
            dims.push(ActionDim {
                joint: a.joint.clone(),
                state_index,
                kind: a.kind,
                delta: a.delta,
                min: a.min,
                max: a.max,
                max_delta: a.max_delta,
                hold,
            });
        }
        Ok(dims)
    }

    /// The checks that need the model's horizon (rows per chunk).
    pub fn validate_horizon(&self, horizon: usize) -> Result<(), ConfigError> {
        let e = &self.execution;
        if let Some(h) = e.execution_horizon.filter(|h| *h > horizon) {
            return Err(bad(
                "execution.execution_horizon",
                format!("{h} rows; the model's chunks have {horizon}"),
            ));
        }
        if e.handover == HandoverKind::Crossfade && e.crossfade_rows > horizon {
            return Err(bad(
                "execution.crossfade_rows",
                format!(
                    "{} rows; the model's chunks have {horizon}",
                    e.crossfade_rows
                ),
            ));
        }
        Ok(())
    }
}

/// CPUs the system has online (Linux), when it can be read.
fn online_cpus() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf only reads a system value.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
        if n > 0 {
            return Some(n as usize);
        }
    }
    None
}

/// A ROS 2 topic name: non-empty, `[A-Za-z0-9_/~]`, not ending in `/`, no `//`.
pub fn valid_topic(t: &str) -> bool {
    !t.is_empty()
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '/' || c == '~')
        && !t.ends_with('/')
        && !t.contains("//")
        && !t.starts_with(|c: char| c.is_ascii_digit())
}

/// Lower case, letters/digits/spaces only, single spaces: how spoken and configured command
/// words are compared.
pub fn normalize_words(s: &str) -> String {
    s.to_lowercase()
        .chars()
        .map(|c| if c.is_alphanumeric() { c } else { ' ' })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}
