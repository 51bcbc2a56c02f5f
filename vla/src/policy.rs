//! The interface a robot host drives a vision-language-action model through: what it takes
//! (views, image size, prompt capacity), what it gives (chunks of `action_horizon ×
//! action_dim`), and its stages — graph replays the host may stop between — with a halt
//! that writes the hold chunk on a stream of the caller's choosing.
//!
//! A host sees `dyn Policy`, never a concrete model.

use crate::error::Result;
use crate::pi05::{Observation, Stage};
use frt_exec::Stream;

/// How a policy takes the robot state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateInput {
    /// Discretized into the prompt tokens (Pi0.5: `pi05_tokens`).
    Prompt,
    /// As a continuous input ([`Observation::state`], normalized); the prompt is the task
    /// alone (Pi0: `pi0_tokens`).
    Token,
}

/// What a policy takes and gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicySpec {
    /// The model's name for people (`Pi0.5`, `Pi0`).
    pub name: &'static str,
    /// How the robot state goes in.
    pub state: StateInput,
    /// Camera views, in the model's order.
    pub views: usize,
    /// Each view's side in pixels (square, after resize-with-pad).
    pub image_size: usize,
    /// Prompt capacity in tokens (BOS included).
    pub max_token_len: usize,
    /// Token ids must be below this.
    pub vocab: usize,
    /// Rows of a chunk.
    pub action_horizon: usize,
    /// Values of a row (the robot uses the first of them).
    pub action_dim: usize,
    /// Denoising steps of one inference.
    pub steps: usize,
}

/// A model as graphs on one stream (see the module docs). Every method that writes takes
/// effect in stream order; none allocates on a tick's path.
pub trait Policy: Send + Sync {
    fn spec(&self) -> &PolicySpec;

    /// The architecture in one line, for people (`check`).
    fn summary(&self) -> String;

    /// The stages of one inference, in order; each is one graph replay.
    fn stages(&self) -> &[Stage];

    /// The stream the stages run on.
    fn stream(&self) -> Stream;

    /// Writes one inference's inputs (preprocessed views, prompt tokens, noise).
    fn set_inputs(&self, obs: &Observation) -> Result<()>;

    /// Writes a prompt alone (tokens, and which views are present).
    fn set_prompt(&self, tokens: &[u32], views_present: &[bool]) -> Result<()>;

    /// Enqueues one stage.
    fn replay(&self, stage: Stage) -> Result<()>;

    /// Enqueues a whole inference (every stage, in order).
    fn run(&self) -> Result<()>;

    /// Reads the output chunk after the work on `s`.
    fn read_actions(&self, s: Stream, out: &mut [f32]) -> Result<()>;

    /// Enqueues a copy of the output chunk to the host after the work on `s` and returns at
    /// once; [`collect_actions`](Self::collect_actions) reads it. Enqueued behind the last
    /// stage, the copy is done by the time the host sees that stage finished, so collecting
    /// costs the host no wait for a copy.
    fn enqueue_read_actions(&self, s: Stream) -> Result<()>;

    /// The chunk the last [`enqueue_read_actions`](Self::enqueue_read_actions) copied, once
    /// the copy has run (waits for it). Each copy is collected once; none pending (none
    /// enqueued, or collected already) is an error. A [`read_actions`](Self::read_actions)
    /// meanwhile (a halt's, on another stream) neither disturbs it nor waits for it.
    fn collect_actions(&self, out: &mut [f32]) -> Result<()>;

    /// Sets the chunk the halt writes (normalized units), in order on `s`.
    fn set_hold(&self, s: Stream, chunk: &[f32]) -> Result<()>;

    /// Enqueues the halt on `s`: the halt output ([`read_halt`](Self::read_halt)) becomes the
    /// hold chunk. It has a buffer of its own: a stage still running on the policy stream
    /// neither overwrites it nor is read as it.
    fn halt(&self, s: Stream) -> Result<()>;

    /// Reads the halt output after the work on `s`.
    fn read_halt(&self, s: Stream, out: &mut [f32]) -> Result<()>;

    /// Whether the model denoises with a frozen prefix.
    fn inpaints(&self) -> bool;

    /// Freezes the first `rows` rows of the next inferences to `actions` (normalized units).
    fn set_frozen_prefix(&self, rows: usize, actions: &[f32]) -> Result<()>;

    /// Graphs captured so far.
    fn capture_count(&self) -> u64;

    /// Where the kernels run (`host`, or the GPU and its architecture).
    fn target(&self) -> String;

    /// Runs one inference on the inputs set, as [`run`](Self::run) does, through the 16-bit
    /// path outside the graphs, and records the ranges of the FP8 GEMMs' inputs into `rec` as
    /// one observation (see [`crate::calibration`]). A model with nothing to calibrate: an
    /// error.
    fn calibrate_inference(&self, rec: &mut crate::calibration::RangeRecorder) -> Result<()> {
        let _ = rec;
        Err(crate::Error::Config {
            reason: format!("{} has no FP8 path to calibrate", self.spec().name),
        })
    }

    /// Why [`calibrate_inference`](Self::calibrate_inference) cannot run on this model, if it
    /// cannot (no FP8 path; an FP8 model without the 16-bit weights recording runs on).
    fn calibrating_refused(&self) -> Option<String> {
        Some(format!("{} has no FP8 path to calibrate", self.spec().name))
    }

    /// What a calibration of this model is recorded on (see
    /// [`Calibration::model`](crate::calibration::Calibration::model)), where it has one.
    fn calibration_model(&self) -> Option<String> {
        None
    }

    /// Writes another calibration's scales into a model built with FP8 GEMMs (no recapture);
    /// a model without them, or a calibration of another model: an error, nothing written.
    fn set_calibration(&self, cal: &crate::calibration::Calibration) -> Result<()> {
        let _ = cal;
        Err(crate::Error::Config {
            reason: format!("{} has no FP8 path to calibrate", self.spec().name),
        })
    }
}
