//! Pi0.5 and Pi0 as exec graphs (mirrors openpi `pi0.py` `Pi0.sample_actions` with `pi05=True`
//! or `False`, `gemma.py` `Module`/`Block`/`Attention`/`RMSNorm`/`FeedForward`, `siglip.py`
//! So400m/14). The two share everything but the action expert's step (see
//! [`Variant`](crate::Variant)).
//!
//! The graphs are cut where the robot host may need to act between them:
//!
//! * **vision** (key 0, `siglip.rs`): every view through SigLIP and the projector, straight
//!   into the image rows of the prefix embeddings;
//! * **prefix** (key 0; in exact prompt mode, key = the prompt's token count; `prefix.rs`): the
//!   prompt embedded (×√width) behind the images, then the language model over the prefix,
//!   filling each layer's key/value cache (its last MLP, whose output nothing reads, is
//!   skipped);
//! * **step** (key = step index): one Euler step of flow matching — the action expert over
//!   `[prefix cache ; its own tokens]`: Pi0.5's with adaptive norms conditioned on the step's
//!   time (`expert.rs`), Pi0's with a state token in front of action tokens that carry the
//!   time (`pi0.rs`); the step-dependent time terms are computed once, when the model is
//!   built. The noisy actions, the input and output projections and the update stay in f32
//!   (`flow.rs`), and after the last step the update also writes the output chunk; so the
//!   steps of one inference run in order;
//! * **halt** (key 0): writes the configured hold chunk into the halt output, for the
//!   highest-priority stream: a buffer of its own, which no step writes, so a step still
//!   running on the policy stream when the halt runs can neither overwrite it nor be read
//!   as it.
//!
//! Everything that changes between inferences lives in buffers written before a replay:
//! images (f32; the vision graph casts them to the model's precision), the prompt buffer
//! (tokens, the key masks for missing views and prompt padding, and the positions derived from
//! them — one upload), the noise, Pi0's state. A new prompt is a buffer write; nothing is recaptured (in
//! [`PromptMode::Exact`], a prompt of a length not seen yet captures that length's prefix).

mod expert;
mod flow;
mod fp8;
mod pi0;
mod prefix;
mod siglip;

/// What the FP8 layers' tests share: the cosine of two vectors, and a tiny f16 model on the
/// host with one observation (every view) to calibrate FP8 models of its weights on.
#[cfg(test)]
mod fp8_fixture {
    use super::{Observation, Pi05, Pi05Options, ViewImage};
    use crate::{ModelImage, Pi05Config, Pi05Weights};
    use frt_exec::{Ctx, Stream};
    use frt_kernels::DType;

    pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f64 {
        let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
        let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        dot / (n(a) * n(b))
    }

    pub(crate) struct Fp8Fixture {
        pub(crate) ctx: Ctx,
        pub(crate) s: Stream,
        pub(crate) c: Pi05Config,
        /// The 16-bit model (f16: its rounding, and the E4M3 codes it flips downstream, stay
        /// small).
        pub(crate) base: Pi05,
        w: Pi05Weights,
        images: Vec<ModelImage>,
        noise: Vec<f32>,
    }

    impl Fp8Fixture {
        pub(crate) fn new() -> Fp8Fixture {
            let ctx = Ctx::host().unwrap();
            let s = ctx.stream(0).unwrap();
            let c = Pi05Config::tiny();
            let w = Pi05Weights::random(&c, 5);
            let base = Pi05::build(&ctx, s, &w, &Pi05Options::new(DType::F16)).unwrap();
            let px = c.siglip.image_size * c.siglip.image_size * 3;
            let image = |seed: usize| {
                let v: Vec<f32> = (0..px)
                    .map(|i| ((i * 37 + seed * 101) % 255) as f32 / 127.5 - 1.0)
                    .collect();
                ModelImage::new(v).unwrap()
            };
            let images = (0..c.views).map(image).collect();
            let noise = vec![0.5f32; c.action_horizon * c.action_dim];
            Fp8Fixture {
                ctx,
                s,
                c,
                base,
                w,
                images,
                noise,
            }
        }

        /// `f` of the observation.
        pub(crate) fn with_obs<R>(&self, f: impl FnOnce(&Observation) -> R) -> R {
            let views: Vec<Option<ViewImage>> = self
                .images
                .iter()
                .map(|i| Some(ViewImage::Pixels(i)))
                .collect();
            f(&Observation {
                state: &[],
                images: &views,
                tokens: &[2, 17, 99, 301, 5],
                noise: &self.noise,
            })
        }

        /// An f16 model of the weights in FP8 (calibrated on the observation at `percentile`,
        /// `options` set as `set` leaves them), its inputs set to the observation; the 16-bit
        /// model's inputs too.
        pub(crate) fn fp8_model(
            &self,
            percentile: f64,
            set: impl FnOnce(&mut Pi05Options),
        ) -> Pi05 {
            let cal =
                self.with_obs(|obs| self.base.calibrate(std::slice::from_ref(obs), percentile));
            let mut o = Pi05Options::new(DType::F16);
            o.fp8 = Some(cal.unwrap());
            set(&mut o);
            let m = Pi05::build(&self.ctx, self.s, &self.w, &o).unwrap();
            self.with_obs(|obs| {
                m.set_inputs(obs).unwrap();
                self.base.set_inputs(obs).unwrap();
            });
            m
        }
    }
}
#[cfg(test)]
use fp8_fixture::{Fp8Fixture, cosine};

use crate::config::{Pi05Config, Variant};
use crate::error::{Error, Result};
use crate::inputs::ModelImage;
use crate::policy::{Policy, PolicySpec};
use crate::weights::{EXPERT, LLM, Pi05Weights};
use flow::Inpaint;
use frt_exec::{Buffer, Ctx, Graph, HostBuffer, Plan, ShapeKey, Stream};
use frt_kernels::{DType, KernelOptions, Kernels, Tensor};
use prefix::{GemmaLayer, PrefixParts};

const GEMMA_EPS: f32 = 1e-6;
const ROPE_WAVELENGTH: f32 = 10_000.0;

/// One stage of an inference, in order; each is one graph replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Vision,
    Prefix,
    Step(usize),
}

/// What a stage leaves for the next ([`Pi05::read_stage_output`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageOutput {
    /// The image tokens (SigLIP and the projector's output), `[views · tokens, width]`.
    Vision,
    /// Every language-model layer's keys then values over the prefix rows.
    PrefixKv,
    /// The noisy actions `x_t` the next step reads (`[horizon, action_dim]`).
    Noise,
}

/// Trace names of the first steps.
const STEP_NAMES: [&str; 32] = [
    "step 0", "step 1", "step 2", "step 3", "step 4", "step 5", "step 6", "step 7", "step 8",
    "step 9", "step 10", "step 11", "step 12", "step 13", "step 14", "step 15", "step 16",
    "step 17", "step 18", "step 19", "step 20", "step 21", "step 22", "step 23", "step 24",
    "step 25", "step 26", "step 27", "step 28", "step 29", "step 30", "step 31",
];

impl Stage {
    /// The stage's name in traces (`vision`, `prefix`, `step 3`; steps past 31 are `step`).
    pub fn name(self) -> &'static str {
        match self {
            Stage::Vision => "vision",
            Stage::Prefix => "prefix",
            Stage::Step(i) => STEP_NAMES.get(i).copied().unwrap_or("step"),
        }
    }
}

/// The largest width or height of a camera frame the model resizes itself.
pub const MAX_FRAME_SIDE: usize = 4096;

/// One camera view as the model takes it.
#[derive(Clone, Copy, Debug)]
pub enum ViewImage<'a> {
    /// Model pixels (`image_size × image_size × 3`, HWC), preprocessed by the caller.
    Pixels(&'a ModelImage),
    /// A camera frame, packed RGB8 (`height × width × 3`, HWC), of any size up to
    /// [`MAX_FRAME_SIDE`]: resized with padding and scaled on the model's device, giving what
    /// [`Pixels`](Self::Pixels) of `to_model_pixels(resize_with_pad(..))` would, bit for bit.
    /// The first frame of a size allocates that view's buffers for it (and a change of size
    /// again); later frames of the same size allocate nothing.
    Rgb8 {
        width: usize,
        height: usize,
        data: &'a [u8],
    },
    /// [`Rgb8`](Self::Rgb8) in a [`HostBuffer`] (its first `height × width × 3` bytes): the
    /// model only enqueues the copy to its device, with no staging copy on the calling
    /// thread (page-locked memory on CUDA), and the host buffer cannot be written until that
    /// copy has run ([`HostBuffer::write`] waits).
    HostRgb8 {
        width: usize,
        height: usize,
        data: &'a HostBuffer,
    },
}

/// A camera frame's bytes as the caller holds them.
#[derive(Clone, Copy)]
enum FrameBytes<'a> {
    Slice(&'a [u8]),
    Host(&'a HostBuffer),
}

/// The device buffers that turn one view's camera frames of one size into model pixels, and
/// the graph that does it: a variant per image slot it writes (captured when first needed).
struct FramePrep {
    size: (usize, usize),
    src: Tensor,
    spans: Tensor,
    weights: Tensor,
    place: frt_kernels::Placement,
    graph: Graph,
}

impl FramePrep {
    fn new(ctx: &Ctx, s: Stream, (h, w): (usize, usize), side: usize) -> Result<FramePrep> {
        let (place, spans, weights) = crate::inputs::resize_tables(h, w, side, side);
        let src = Tensor::alloc(ctx, "camera frame", DType::U8, &[h, w, 3])?;
        let sp = Tensor::alloc(ctx, "resize spans", DType::I32, &[spans.len() / 3, 3])?;
        sp.buffer().write(s, 0, &spans)?;
        // At least one value: an image resized to nothing has no weights.
        let wt = Tensor::alloc(ctx, "resize weights", DType::F32, &[weights.len().max(1)])?;
        if !weights.is_empty() {
            wt.write_f32(s, &weights)?;
        }
        Ok(FramePrep {
            size: (h, w),
            src,
            spans: sp,
            weights: wt,
            place,
            graph: Graph::new(ctx, "camera frame", 0),
        })
    }
}

/// One view's camera frame in `set_inputs`: its slot, height, width and bytes.
type Frame<'a> = Option<(usize, usize, usize, FrameBytes<'a>)>;

/// What one inference sees.
pub struct Observation<'a> {
    /// Per view, its image, or `None` for a missing view.
    pub images: &'a [Option<ViewImage<'a>>],
    /// Prompt tokens (BOS first), at most `max_token_len`. Pi0.5's carry the discretized state
    /// (see [`PolicySpec::state`](crate::PolicySpec)).
    pub tokens: &'a [u32],
    /// The normalized robot state, at most `action_dim` finite values (padded with zeros, as
    /// openpi pads it): Pi0's state token. Pi0.5 takes the state in its prompt tokens and does
    /// not read this.
    pub state: &'a [f32],
    /// `action_horizon × action_dim` standard normal noise.
    pub noise: &'a [f32],
}

/// The policy on a stream of a context (see the module docs).
pub struct Pi05 {
    k: Kernels,
    s: Stream,
    pub config: Pi05Config,
    pub dtype: DType,
    /// SigLIP and the projector (what the vision graph runs; kept with the model).
    vision_model: siglip::Vision,
    x: Tensor,
    out: Tensor,
    hold: Tensor,
    /// What the halt graph writes (the hold chunk); apart from `out`.
    halt_out: Tensor,
    vision: Graph,
    prefix: Graph,
    step: Graph,
    halt: Graph,
    /// Per number of views encoded, the Plan with that vision variant; the prefix node
    /// inherits the key `run` executes with (the prefix variant's).
    plans: Vec<(usize, Plan)>,
    mode: PromptMode,
    /// Whether absent views are left out ([`Pi05Options::compact_views`]).
    compact: bool,
    /// Per number of views the model may encode (ascending), the prefix rows its step
    /// attends to.
    step_prefix: Vec<usize>,
    /// The views the current inputs encode (the present ones, packed first, when compact;
    /// else every slot).
    encoded: std::sync::atomic::AtomicUsize,
    prefix_parts: PrefixParts,
    /// Exact mode: the current prompt's token count (0 before the first prompt).
    prompt_len: std::sync::atomic::AtomicUsize,
    /// One view of zeros (what a missing view's pixels are).
    zero_view: Vec<f32>,
    /// Per view slot, the buffers for its camera frames' current size.
    frames: std::sync::Mutex<Vec<Option<FramePrep>>>,
    /// The prompt buffer's bytes as the host builds them (reused by each `set_prompt`).
    prompt_bytes: std::sync::Mutex<Vec<u8>>,
    /// Frozen-prefix denoising, when built with it.
    inpaint: Option<Inpaint>,
    /// Pi0's state input (`[1, action_dim]`, f32), and the zeros that pad a shorter state.
    state: Option<Tensor>,
    state_pad: Vec<f32>,
    spec: PolicySpec,
    stages: Vec<Stage>,
    /// What the step graphs were recorded from (kept for calibration runs and new
    /// calibrations).
    step_model: StepModel,
}

/// What a calibration is recorded on (see [`Pi05::calibration_model`]).
fn calibration_model(c: &Pi05Config) -> String {
    let part = |g: &crate::config::GemmaConfig| {
        format!(
            "width {}, {} layers, mlp {}, heads {}/{}, head dim {}",
            g.width, g.depth, g.mlp, g.heads, g.kv_heads, g.head_dim
        )
    };
    format!(
        "{} language model: {}; expert: {}",
        c.variant.name(),
        part(&c.llm),
        part(&c.expert)
    )
}

/// Checks that `cal` was recorded on this model (its identity) and holds the ranges its FP8
/// parts need (the expert's; the prefix's with `prefix`, SigLIP's with `vision`), and none it
/// does not have.
fn check_calibration(
    c: &Pi05Config,
    cal: &crate::calibration::Calibration,
    prefix: bool,
    vision: bool,
) -> Result<()> {
    if cal.model != calibration_model(c) {
        return Err(Error::Config {
            reason: format!(
                "calibration recorded on `{}`, this model is `{}`",
                cal.model,
                calibration_model(c)
            ),
        });
    }
    let (e, p, v) = (
        fp8::fp8_names("expert", c.expert.depth, 4),
        fp8::fp8_names("prefix", c.llm.depth, 2),
        siglip::fp8_names(c.siglip.depth),
    );
    let needed = e
        .iter()
        .chain(p.iter().filter(|_| prefix))
        .chain(v.iter().filter(|_| vision));
    let known = e.iter().chain(p.iter()).chain(v.iter());
    cal.check_names(needed.map(String::as_str), known.map(String::as_str))
}

/// The step graph's model: Pi0.5's adaptive-norm expert or Pi0's state-token expert.
enum StepModel {
    Pi05(Box<expert::Expert>),
    Pi0(Box<pi0::Expert>),
}

impl StepModel {
    fn record(&self, k: &Kernels, cs: Stream, i: usize, views: usize) -> Result<()> {
        match self {
            StepModel::Pi05(e) => e.record(k, cs, i, views),
            StepModel::Pi0(e) => e.record(k, cs, i, views),
        }
    }
    fn add_keys(&mut self, k: &Kernels, keys: &flow::StepKeys) -> Result<()> {
        match self {
            StepModel::Pi05(e) => e.add_keys(k, keys),
            StepModel::Pi0(e) => e.add_keys(k, keys),
        }
    }
    fn record_calibrating(
        &self,
        k: &Kernels,
        cs: Stream,
        i: usize,
        views: usize,
        probe: expert::Probe,
    ) -> Result<()> {
        match self {
            StepModel::Pi05(e) => e.record_calibrating(k, cs, i, views, probe),
            StepModel::Pi0(_) => Err(Error::Config {
                reason: "an FP8 action expert is Pi0.5's: Pi0 has nothing to calibrate".into(),
            }),
        }
    }
    fn inpaint(&self) -> Option<&Inpaint> {
        match self {
            StepModel::Pi05(e) => e.inpaint(),
            StepModel::Pi0(e) => e.inpaint(),
        }
    }
}

/// How the prompt sits in the prefix (`fixed` / `exact` in configs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptMode {
    /// `max_token_len` prompt rows whatever the prompt's length (padding masked): one prefix
    /// graph, and a new prompt is a buffer write.
    #[default]
    Fixed,
    /// As many prompt rows as the prompt has tokens: a prefix graph per prompt length, captured
    /// when a prompt of a new length is first set (the least recently used of
    /// [`EXACT_PREFIX_VARIANTS`] is evicted); less prefix work for short prompts.
    Exact,
}

/// How a [`Pi05`] is built.
#[derive(Clone, Debug, PartialEq)]
pub struct Pi05Options {
    /// The precision of the weights and activations (the actions stay in f32).
    pub dtype: DType,
    pub prompt_mode: PromptMode,
    /// Frozen-prefix denoising in the step graph (see
    /// [`set_frozen_prefix`](Pi05::set_frozen_prefix); with 0 frozen rows its output equals
    /// the model's without it, bit for bit).
    pub inpaint_prefix: bool,
    /// The op library's tunables.
    pub kernels: KernelOptions,
    /// Absent views cost nothing: the present views' pixels are packed into the first slots
    /// and only they are encoded, go through the prefix and are attended to by the steps (a
    /// vision, a prefix and a set of step variants per number of present views, captured when
    /// built; exact mode: prefix variants per number and prompt length). The results equal the
    /// masked computation's (every slot encoded, absent ones masked out of attention). Off:
    /// every slot is encoded and absent ones masked.
    pub compact_views: bool,
    /// With `compact_views`, on CUDA: every variant for fewer views is run once when the model
    /// is built, after the every-view one, on zero inputs. On an H100 a model with a view
    /// absent ran its (unchanged) graphs 6 % slower until it had run once with every view
    /// present, and at the 2-view model's speed from then on; what that first run changes is
    /// not known. No effect on results (the next inference writes every input).
    pub run_variants_once: bool,
    /// The action expert's GEMMs in FP8 with this calibration's activation scales (weights
    /// quantized per output feature at load; the 16-bit weights too, with
    /// `fp8_keep_16bit`), and the language model's with `fp8_prefix`. Pi0.5 only; see
    /// [`Pi05::calibrate`] and [`Pi05::set_calibration`].
    pub fp8: Option<crate::calibration::Calibration>,
    /// With `fp8`: the prefix (the language model's GEMMs) in FP8 too.
    pub fp8_prefix: bool,
    /// With `fp8`: SigLIP's GEMMs in FP8 too (a bf16 or f16 model: its biases need a 16-bit
    /// output).
    pub fp8_vision: bool,
    /// With `fp8`: the language model's and the expert's 16-bit projections are loaded too
    /// (the 16-bit path [`Pi05::calibrate`] runs). Off, their stacks in FP8 hold only the
    /// quantized weights (about half the weight memory; a new calibration file still loads,
    /// [`Pi05::set_calibration`], but recording one is refused). SigLIP keeps its 16-bit
    /// weights either way.
    pub fp8_keep_16bit: bool,
}

impl Pi05Options {
    /// `dtype`, a fixed prompt, no frozen prefix, the default kernel options.
    pub fn new(dtype: DType) -> Pi05Options {
        Pi05Options {
            dtype,
            prompt_mode: PromptMode::Fixed,
            inpaint_prefix: false,
            kernels: KernelOptions::default(),
            compact_views: true,
            run_variants_once: true,
            fp8: None,
            fp8_prefix: true,
            fp8_vision: false,
            fp8_keep_16bit: true,
        }
    }
}

/// The prefix variant for `views` encoded views and a prompt of `len` tokens: the number of
/// views in fixed mode, both in exact mode.
fn prefix_key(mode: PromptMode, views: usize, len: usize) -> ShapeKey {
    match mode {
        PromptMode::Fixed => ShapeKey(views as u64),
        PromptMode::Exact => ShapeKey(((views as u64) << 32) | len as u64),
    }
}

/// The step graph's variant for step `i` with `views` encoded views.
fn step_key(views: usize, i: usize) -> ShapeKey {
    ShapeKey(((views as u64) << 32) | i as u64)
}

/// Prefix graphs (prompt lengths) exact mode keeps.
pub const EXACT_PREFIX_VARIANTS: usize = 8;

impl Pi05 {
    /// Uploads the weights in `options.dtype`, allocates every buffer, computes the per-step
    /// adaptive-norm conditions, and captures the vision, prefix, step and halt graphs on `s`.
    pub fn new(ctx: &Ctx, s: Stream, w: &Pi05Weights, dtype: DType) -> Result<Pi05> {
        Pi05::build(ctx, s, w, &Pi05Options::new(dtype))
    }

    /// [`new`](Self::new) with the prompt laid out as `mode` says. In exact mode no prefix
    /// graph exists until the first [`set_prompt`](Self::set_prompt).
    pub fn with_mode(
        ctx: &Ctx,
        s: Stream,
        w: &Pi05Weights,
        dtype: DType,
        mode: PromptMode,
    ) -> Result<Pi05> {
        let mut o = Pi05Options::new(dtype);
        o.prompt_mode = mode;
        Pi05::build(ctx, s, w, &o)
    }

    /// The model as `options` say (see [`Pi05Options`]).
    pub fn build(ctx: &Ctx, s: Stream, w: &Pi05Weights, options: &Pi05Options) -> Result<Pi05> {
        let (dtype, mode, inpaint_prefix) =
            (options.dtype, options.prompt_mode, options.inpaint_prefix);
        let c = w.config.clone();
        c.validate().map_err(|reason| Error::Config { reason })?;
        if let Some(cal) = &options.fp8 {
            check_calibration(&c, cal, options.fp8_prefix, options.fp8_vision)?;
        }
        let k = Kernels::with_options(ctx, options.kernels)?;
        let dt = dtype;
        let (sg, lg, eg) = (&c.siglip, &c.llm, &c.expert);
        let n_img = c.views * sg.tokens();
        // The suffix: the action rows (`horizon`), behind Pi0's state token.
        let (p_len, s_len, horizon) = (c.prefix_len(), c.suffix_len(), c.action_horizon);
        let (hd, heads, kvh) = (lg.head_dim, lg.heads, lg.kv_heads);
        let kv_width = kvh * hd;

        // The numbers of views the model may encode (every one from 1 when absent views are
        // left out), and per number the prefix rows its step attends to: its views' and a
        // full prompt's (the step's own keys go right behind them).
        let counts: Vec<usize> = if options.compact_views {
            (1..=c.views).collect()
        } else {
            vec![c.views]
        };
        let step_prefix = |n: usize| n * sg.tokens() + c.max_token_len;

        // ---- buffers
        // Everything a prompt change writes lives in one buffer (one upload per change):
        // tokens, prefix and suffix positions (i32), then the prefix's key mask and, per
        // number of views, its step's (u8).
        let step_masks: usize = counts.iter().map(|&n| step_prefix(n) + s_len).sum();
        let prompt_bytes = 4 * (c.max_token_len + p_len + s_len) + p_len + step_masks;
        let prompt = frt_exec::Buffer::alloc(ctx, "prompt", prompt_bytes)?;
        let i32s = |off: usize, n: usize| Tensor::with_layout(&prompt, DType::I32, &[n], &[1], off);
        let tokens = i32s(0, c.max_token_len)?;
        let prefix_pos = i32s(c.max_token_len, p_len)?;
        let suffix_pos = i32s(c.max_token_len + p_len, s_len)?;
        let mask_at = 4 * (c.max_token_len + p_len + s_len);
        let prefix_mask = Tensor::with_layout(&prompt, DType::U8, &[p_len], &[1], mask_at)?;
        let mut step_keys = Vec::with_capacity(counts.len());
        let mut at = mask_at + p_len;
        for &views in &counts {
            let prefix_rows = step_prefix(views);
            let len = prefix_rows + s_len;
            step_keys.push(flow::StepKeys {
                views,
                prefix_rows,
                mask: Tensor::with_layout(&prompt, DType::U8, &[len], &[1], at)?,
            });
            at += len;
        }
        // With frozen-prefix denoising, x_t shares its buffer with the noise copy, the frozen
        // actions and their row count (the update reads them after the expert's weights went
        // through the caches: one neighbourhood, not three cold allocations).
        let chunk_n = horizon * c.action_dim;
        let x = if inpaint_prefix {
            let b = Buffer::alloc(ctx, "x_t+inpaint", (3 * chunk_n + 1) * 4)?;
            Tensor::new(&b, DType::F32, &[horizon, c.action_dim])?
        } else {
            Tensor::alloc(ctx, "x_t", DType::F32, &[horizon, c.action_dim])?
        };
        let out = Tensor::alloc(ctx, "actions", DType::F32, &[horizon, c.action_dim])?;
        let hold = Tensor::alloc(ctx, "hold", DType::F32, &[horizon, c.action_dim])?;
        hold.write_f32(s, &vec![0.0; chunk_n])?;
        let halt_out = Tensor::alloc(ctx, "halt", DType::F32, &[horizon, c.action_dim])?;
        let prefix_x = Tensor::alloc(ctx, "prefix.x", dt, &[p_len, lg.width])?;

        // ---- vision: SigLIP over the encoded views at once, then the projector; one variant
        // per number of views it may encode.
        // Every slot's variant first; the others are planned last, once everything the
        // every-view path uses is allocated (their plans' memory does not sit between its
        // buffers).
        let mut vision_model = siglip::Vision::build(
            &k,
            s,
            &w.root(),
            &c,
            dt,
            prefix_x.narrow(0, 0, n_img)?,
            &[c.views],
            options.fp8.as_ref().filter(|_| options.fp8_vision),
        )?;
        let vision = Graph::new(ctx, "pi05.vision", counts.len());
        vision.capture(ShapeKey(c.views as u64), |cs| {
            vision_model.record(&k, cs, c.views)
        })?;

        // ---- the two Gemma stacks' weights and caches
        // Cache rows no prompt has filled yet (exact mode) are zeros, never NaN: masked keys
        // get zero weight, and 0 · NaN would still poison a product with V.
        let zeroed = |name: &str| -> Result<Tensor> {
            let t = Tensor::alloc(ctx, name, dt, &[p_len + s_len, kv_width])?;
            t.write_f32(s, &vec![0.0; t.numel()])?;
            Ok(t)
        };
        let root = w.root();
        // A stack in FP8 without `fp8_keep_16bit` loads no 16-bit projections.
        let fp8_on = options.fp8.is_some() && c.variant == Variant::Pi05;
        let keep = options.fp8_keep_16bit;
        let (ll_proj, el_proj) = (keep || !(fp8_on && options.fp8_prefix), keep || !fp8_on);
        let mut ll = Vec::with_capacity(lg.depth);
        let mut el = Vec::with_capacity(eg.depth);
        for i in 0..lg.depth {
            let (lp, ep) = (
                root.pp(LLM).pp("layers").pp(i),
                root.pp(EXPERT).pp("layers").pp(i),
            );
            let l = GemmaLayer {
                w: frt_nn::blocks::gemma::GemmaLayer::load(
                    &lp,
                    &lg.dims(),
                    false,
                    ll_proj,
                    ctx,
                    s,
                    dt,
                )?,
                k_cache: zeroed(&lp.name("k_cache"))?,
                v_cache: zeroed(&lp.name("v_cache"))?,
            };
            // The expert writes its keys/values behind the prefix in the same caches; Pi0.5's
            // expert norms are adaptive, Pi0's plain.
            let adaptive = c.variant == Variant::Pi05;
            el.push(GemmaLayer {
                w: frt_nn::blocks::gemma::GemmaLayer::load(
                    &ep,
                    &eg.dims(),
                    adaptive,
                    el_proj,
                    ctx,
                    s,
                    dt,
                )?,
                k_cache: l.k_cache.clone(),
                v_cache: l.v_cache.clone(),
            });
            ll.push(l);
        }
        let embed = root
            .pp(LLM)
            .upload("embed_tokens.weight", &[c.vocab, lg.width], ctx, s, dt)?;

        // ---- prefix: prompt embedding, language model filling the caches
        let px_ln = Tensor::alloc(ctx, "prefix.ln", dt, &[p_len, lg.width])?;
        let pq = Tensor::alloc(ctx, "prefix.q", dt, &[p_len, heads * hd])?;
        let pqkv = Tensor::alloc(ctx, "prefix.qkv", dt, &[p_len, (heads + 2 * kvh) * hd])?;
        let pattn = Tensor::alloc(ctx, "prefix.attn", dt, &[p_len, heads * hd])?;
        let pgu = Tensor::alloc(ctx, "prefix.gate_up", dt, &[p_len, 2 * lg.mlp])?;
        let ph = Tensor::alloc(ctx, "prefix.mlp", dt, &[p_len, lg.mlp])?;
        let prefix_fp8 = match (&options.fp8, options.fp8_prefix, c.variant) {
            (Some(cal), true, Variant::Pi05) => Some(prefix::PrefixFp8 {
                stack: fp8::Fp8Stack::load(
                    &k,
                    s,
                    w,
                    ("prefix", LLM),
                    &lg.dims(),
                    lg.depth,
                    2,
                    p_len,
                    cal,
                )?,
                product: Tensor::alloc(ctx, "prefix.product", dt, &[p_len, lg.width])?,
            }),
            _ => None,
        };
        let down_partials = match ll.first().and_then(|l| l.proj.as_ref()) {
            Some(_) => Some(Tensor::alloc(
                ctx,
                "prefix.down_partials",
                DType::F32,
                &[prefix::PREFIX_DOWN_PARTS * p_len * lg.width],
            )?),
            None => None,
        };
        let prefix_parts = PrefixParts {
            layers: ll.clone(),
            embed,
            tokens,
            x: prefix_x.clone(),
            ln: px_ln,
            q: pq,
            qkv: pqkv,
            attn: pattn,
            gate_up: pgu,
            mlp: ph,
            pos: prefix_pos,
            mask: prefix_mask,
            width: lg.width,
            mlp_width: lg.mlp,
            heads,
            kv_heads: kvh,
            head_dim: hd,
            down_partials,
            fp8: prefix_fp8,
        };
        let prefix = Graph::new(
            ctx,
            "pi05.prefix",
            match mode {
                PromptMode::Fixed => counts.len(),
                PromptMode::Exact => EXACT_PREFIX_VARIANTS,
            },
        );
        let capture_prefix = |n: usize| -> Result<()> {
            let key = prefix_key(mode, n, c.max_token_len);
            prefix_parts.capture(&k, &prefix, key, n * sg.tokens(), c.max_token_len)
        };
        if mode == PromptMode::Fixed {
            capture_prefix(c.views)?;
        }

        // ---- the action expert: one denoising step per graph variant (and number of views;
        // every view's first, the others' planned last)
        let (every, fewer) = step_keys.split_last().expect("at least one count of views");
        let io = flow::Io {
            x: x.clone(),
            out: out.clone(),
            suffix_pos,
            keys: every.clone(),
            inpaint_prefix,
        };
        let fp8 = options.fp8.as_ref();
        let mut expert = match c.variant {
            Variant::Pi05 => {
                StepModel::Pi05(Box::new(expert::Expert::build(&k, s, w, dt, el, io, fp8)?))
            }
            Variant::Pi0 if fp8.is_some() => {
                return Err(Error::Config {
                    reason: "an FP8 action expert is Pi0.5's (Pi0 runs in bf16, f16 or f32)".into(),
                });
            }
            Variant::Pi0 => StepModel::Pi0(Box::new(pi0::Expert::build(&k, s, w, dt, el, io)?)),
        };
        let inpaint = expert.inpaint().cloned();
        let state = match &expert {
            StepModel::Pi05(_) => None,
            StepModel::Pi0(e) => Some(e.state().clone()),
        };
        let step = Graph::new(ctx, "pi05.step", c.steps * counts.len());
        for i in 0..c.steps {
            step.capture(step_key(c.views, i), |cs| expert.record(&k, cs, i, c.views))?;
        }
        let halt = Graph::new(ctx, "pi05.halt", 1);
        halt.capture(ShapeKey(0), |cs| {
            let b = hold.buffer().bytes();
            Buffer::copy(halt_out.buffer(), 0, hold.buffer(), 0, b, cs)
        })?;
        // The variants for fewer views.
        for keys in fewer {
            let n = keys.views;
            vision_model.add_plan(&k, n)?;
            vision.capture(ShapeKey(n as u64), |cs| vision_model.record(&k, cs, n))?;
            if mode == PromptMode::Fixed {
                capture_prefix(n)?;
            }
            expert.add_keys(&k, keys)?;
            for i in 0..c.steps {
                step.capture(step_key(n, i), |cs| expert.record(&k, cs, i, n))?;
            }
        }
        let mut plans = Vec::with_capacity(counts.len());
        for &n in &counts {
            let mut plan = Plan::new(ctx);
            plan.add(&vision, ShapeKey(n as u64), s)?;
            plan.add(&prefix, ShapeKey::INHERIT, s)?;
            for i in 0..c.steps {
                plan.add(&step, step_key(n, i), s)?;
            }
            plans.push((n, plan));
        }
        ctx.sync_stream(s)?;
        let zero_view = vec![0.0; c.siglip.image_size * c.siglip.image_size * 3];
        let spec = PolicySpec {
            name: c.variant.name(),
            state: c.variant.state_input(),
            views: c.views,
            image_size: c.siglip.image_size,
            max_token_len: c.max_token_len,
            vocab: c.vocab,
            action_horizon: c.action_horizon,
            action_dim: c.action_dim,
            steps: c.steps,
        };
        let mut stages = vec![Stage::Vision, Stage::Prefix];
        stages.extend((0..c.steps).map(Stage::Step));
        let m = Pi05 {
            k,
            s,
            config: c,
            dtype: dt,
            vision_model,
            x,
            out,
            hold,
            halt_out,
            vision,
            prefix,
            step,
            halt,
            plans,
            mode,
            compact: options.compact_views,
            step_prefix: step_keys.iter().map(|k| k.prefix_rows).collect(),
            encoded: std::sync::atomic::AtomicUsize::new(counts[counts.len() - 1]),
            prefix_parts,
            prompt_len: Default::default(),
            zero_view,
            frames: std::sync::Mutex::new((0..spec.views).map(|_| None).collect()),
            prompt_bytes: Default::default(),
            inpaint,
            state,
            state_pad: vec![0.0; spec.action_dim],
            spec,
            stages,
            step_model: expert,
        };
        if options.compact_views
            && options.run_variants_once
            && mode == PromptMode::Fixed
            && matches!(ctx.backend(), frt_exec::BackendKind::Cuda { .. })
        {
            m.run_variants()?;
        }
        Ok(m)
    }

    /// Runs every view-count variant once on zero inputs, every view's first (see
    /// [`Pi05Options::run_variants_once`]).
    fn run_variants(&self) -> Result<()> {
        let c = &self.config;
        let zeros: Vec<&[f32]> = vec![&self.zero_view; c.views];
        if let Some(state) = &self.state {
            state.write_f32(self.s, &self.state_pad)?;
        }
        if let Some(p) = &self.inpaint {
            p.rows.write_i32(self.s, &[0])?;
        }
        self.x.write_f32(self.s, &vec![0.0; self.x.numel()])?;
        for (n, _) in self.plans.iter().rev() {
            let present: Vec<bool> = (0..c.views).map(|v| v < *n).collect();
            self.set_prompt(&[0], &present)?;
            self.vision_model
                .images_of(*n)
                .write_f32_parts(self.s, &zeros[..*n])?;
            self.run()?;
            // The noise is updated in place: zeros again for the next variant.
            self.x.write_f32(self.s, &vec![0.0; self.x.numel()])?;
        }
        self.k.ctx().sync_stream(self.s)?;
        Ok(())
    }

    pub fn stream(&self) -> Stream {
        self.s
    }

    pub fn kernels(&self) -> &Kernels {
        &self.k
    }

    /// Graphs captured so far (vision, prefix, every step, halt). A prompt change keeps it.
    /// The camera-frame graphs ([`ViewImage::Rgb8`], one per view and frame size, captured
    /// with the first frames of that size) are not counted.
    pub fn capture_count(&self) -> u64 {
        self.vision.capture_count()
            + self.prefix.capture_count()
            + self.step.capture_count()
            + self.halt.capture_count()
    }

    /// Variants held by the graphs.
    pub fn variant_count(&self) -> usize {
        self.vision.variant_count()
            + self.prefix.variant_count()
            + self.step.variant_count()
            + self.halt.variant_count()
    }

    /// The stages of one inference, in order.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// Writes the prompt: tokens, the prompt part of the key masks, and every position (which
    /// depend on which views and tokens are valid). A buffer write, no recapture — except in
    /// exact mode for a prompt length without a prefix graph yet, which is captured here.
    pub fn set_prompt(&self, tokens: &[u32], views_present: &[bool]) -> Result<()> {
        let c = &self.config;
        if tokens.is_empty() || tokens.len() > c.max_token_len {
            return Err(Error::BadInput {
                what: "prompt".into(),
                reason: format!("{} tokens (1 to {} allowed)", tokens.len(), c.max_token_len),
            });
        }
        if let Some(t) = tokens.iter().find(|t| **t as usize >= c.vocab) {
            return Err(Error::BadInput {
                what: "prompt".into(),
                reason: format!("token {t} outside the vocabulary of {}", c.vocab),
            });
        }
        if views_present.len() != c.views {
            return Err(Error::BadInput {
                what: "views".into(),
                reason: format!("{} view flags for {} views", views_present.len(), c.views),
            });
        }
        // The views encoded: the present ones packed first (compact), else every slot.
        let encoded = if self.compact {
            views_present.iter().filter(|p| **p).count()
        } else {
            c.views
        };
        if encoded == 0 || !views_present.iter().any(|p| *p) {
            return Err(Error::BadInput {
                what: "views".into(),
                reason: "every view is missing".into(),
            });
        }
        // Which prefix entries are valid: the encoded views' image tokens (an absent slot's
        // masked when not compact), then the prompt's; rows behind are never valid.
        let vt = c.siglip.tokens();
        let images = encoded * vt;
        let valid = |i: usize| {
            if i < images {
                self.compact || views_present[i / vt]
            } else {
                i - images < tokens.len()
            }
        };
        // The prompt buffer's layout (see `new`), built in a reused scratch: one upload.
        let mut bytes = self.prompt_bytes.lock().unwrap_or_else(|p| p.into_inner());
        bytes.clear();
        let mut put = |v: i32| bytes.extend_from_slice(&v.to_ne_bytes());
        for i in 0..c.max_token_len {
            put(tokens.get(i).map_or(0, |t| *t as i32));
        }
        // positions = cumsum(mask) - 1 (openpi); masked tokens' positions are never seen.
        let mut n = 0i32;
        for i in 0..c.prefix_len() {
            n += i32::from(valid(i));
            put((n - 1).max(0));
        }
        for i in 0..c.suffix_len() as i32 {
            put(n + i);
        }
        bytes.extend((0..c.prefix_len()).map(|i| u8::from(valid(i))));
        for &rows in &self.step_prefix {
            bytes.extend((0..rows).map(|i| u8::from(valid(i))));
            bytes.extend(std::iter::repeat_n(1u8, c.suffix_len()));
        }
        self.prefix_parts
            .tokens
            .buffer()
            .upload(self.s, 0, &bytes)?;
        if self.mode == PromptMode::Exact {
            let key = prefix_key(self.mode, encoded, tokens.len());
            if !self.prefix.has_variant(key) {
                self.prefix_parts
                    .capture(&self.k, &self.prefix, key, images, tokens.len())?;
            }
            self.prompt_len
                .store(tokens.len(), std::sync::atomic::Ordering::Release);
        }
        self.encoded
            .store(encoded, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Writes one inference's inputs (images of present views, the prompt, the noise).
    pub fn set_inputs(&self, obs: &Observation) -> Result<()> {
        let c = &self.config;
        let per_view = c.siglip.image_size * c.siglip.image_size * 3;
        if obs.images.len() != c.views {
            return Err(Error::BadInput {
                what: "images".into(),
                reason: format!(
                    "{} views given, the model has {}",
                    obs.images.len(),
                    c.views
                ),
            });
        }
        if !obs.images.iter().any(|i| i.is_some()) {
            return Err(Error::BadInput {
                what: "images".into(),
                reason: "every view is missing".into(),
            });
        }
        // Pixels go from the caller's slices to the device through one staging copy; nothing
        // is allocated per inference. Camera frames go up as they are, each into its view's
        // buffer, and are resized there.
        // Compact: the present views packed first; else each in its slot, zeros for absent ones.
        let mut parts: [&[f32]; crate::config::MAX_VIEWS] = [&[]; crate::config::MAX_VIEWS];
        // Per view: its slot, height, width and bytes.
        let mut frames: [Frame; crate::config::MAX_VIEWS] = [None; crate::config::MAX_VIEWS];
        let mut present = [false; crate::config::MAX_VIEWS];
        let mut packed = 0;
        for (v, img) in obs.images.iter().enumerate() {
            let Some(img) = img else {
                if !self.compact {
                    parts[v] = &self.zero_view;
                }
                continue;
            };
            let at = if self.compact { packed } else { v };
            let (width, height, bytes, data) = match *img {
                // In range by its type (see ModelImage).
                ViewImage::Pixels(img) => {
                    let img = img.values();
                    if img.len() != per_view {
                        return Err(Error::BadInput {
                            what: format!("image {v}"),
                            reason: format!("{} values, expected {per_view}", img.len()),
                        });
                    }
                    parts[at] = img;
                    packed += 1;
                    present[v] = true;
                    continue;
                }
                ViewImage::Rgb8 {
                    width,
                    height,
                    data,
                } => (width, height, data.len(), FrameBytes::Slice(data)),
                ViewImage::HostRgb8 {
                    width,
                    height,
                    data,
                } => (width, height, data.bytes(), FrameBytes::Host(data)),
            };
            let sides = 1..=MAX_FRAME_SIDE;
            if !sides.contains(&width) || !sides.contains(&height) {
                return Err(Error::BadInput {
                    what: format!("image {v}"),
                    reason: format!("a {width}×{height} frame (1 to {MAX_FRAME_SIDE} per side)"),
                });
            }
            // A slice is the frame; a host buffer holds it in its first bytes.
            let need = width * height * 3;
            let fits = match data {
                FrameBytes::Slice(_) => bytes == need,
                FrameBytes::Host(_) => bytes >= need,
            };
            if !fits {
                return Err(Error::BadInput {
                    what: format!("image {v}"),
                    reason: format!(
                        "{bytes} bytes for a {width}×{height} RGB8 frame ({need} expected)"
                    ),
                });
            }
            frames[v] = Some((at, height, width, data));
            packed += 1;
            present[v] = true;
        }
        let slots = if self.compact { packed } else { c.views };
        if obs.noise.len() != c.action_horizon * c.action_dim
            || obs.noise.iter().any(|x| !x.is_finite())
        {
            return Err(Error::BadInput {
                what: "noise".into(),
                reason: format!(
                    "{} values (need {} finite)",
                    obs.noise.len(),
                    c.action_horizon * c.action_dim
                ),
            });
        }
        if let Some(state) = &self.state {
            if obs.state.len() > c.action_dim || obs.state.iter().any(|x| !x.is_finite()) {
                return Err(Error::BadInput {
                    what: "state".into(),
                    reason: format!(
                        "{} values (need at most {} finite)",
                        obs.state.len(),
                        c.action_dim
                    ),
                });
            }
            let pad = &self.state_pad[obs.state.len()..];
            state.write_f32_parts(self.s, &[obs.state, pad])?;
        }
        self.set_prompt(obs.tokens, &present[..c.views])?;
        let images = self.vision_model.images_of(slots);
        if frames.iter().all(Option::is_none) {
            images.write_f32_parts(self.s, &parts[..slots])?;
        } else {
            self.write_views(images, &parts[..slots], &frames[..c.views])?;
        }
        self.x.write_f32(self.s, obs.noise)?;
        Ok(())
    }

    /// Writes `images` (`[slots, …]` model pixels) when some views are camera frames: each
    /// slot with pixels from `parts`, each frame (by view: its slot and size) uploaded into
    /// its view's buffer and resized into its slot on the device.
    fn write_views(&self, images: &Tensor, parts: &[&[f32]], frames: &[Frame]) -> Result<()> {
        let side = self.config.siglip.image_size;
        for (slot, part) in parts.iter().enumerate() {
            if !part.is_empty() {
                images.narrow(0, slot, 1)?.write_f32(self.s, part)?;
            }
        }
        let mut preps = self.frames.lock().unwrap_or_else(|p| p.into_inner());
        for (v, frame) in frames.iter().enumerate() {
            let Some((slot, h, w, data)) = *frame else {
                continue;
            };
            let prep = &mut preps[v];
            if prep.as_ref().is_none_or(|p| p.size != (h, w)) {
                *prep = Some(FramePrep::new(self.k.ctx(), self.s, (h, w), side)?);
            }
            let p = prep.as_ref().expect("made above");
            let key = ShapeKey(slot as u64);
            if !p.graph.has_variant(key) {
                let out = images.narrow(0, slot, 1)?.reshape(&[side, side, 3])?;
                p.graph.capture(key, |cs| {
                    self.k
                        .resize_pad_pixels(cs, &p.src, &p.spans, &p.weights, p.place, &out)
                })?;
            }
            match data {
                FrameBytes::Slice(data) => p.src.buffer().upload(self.s, 0, data)?,
                FrameBytes::Host(data) => {
                    p.src
                        .buffer()
                        .upload_from(self.s, 0, data, 0, p.src.buffer().bytes())?
                }
            }
            p.graph.replay(key, self.s)?;
        }
        Ok(())
    }

    /// Replays one stage (the caller may stop between any two).
    pub fn replay(&self, stage: Stage) -> Result<()> {
        match stage {
            Stage::Vision => self
                .vision
                .replay(ShapeKey(self.encoded() as u64), self.s)?,
            Stage::Prefix => self.prefix.replay(self.prefix_key(), self.s)?,
            Stage::Step(i) => self.step.replay(step_key(self.encoded(), i), self.s)?,
        }
        Ok(())
    }

    /// One whole inference through the Plan of the views encoded (vision → prefix → every
    /// step).
    pub fn run(&self) -> Result<()> {
        let n = self.encoded();
        let (_, plan) = self
            .plans
            .iter()
            .find(|(views, _)| *views == n)
            .expect("a Plan for every count of views set_prompt allows");
        // Vision and steps have explicit keys; the prefix takes this one.
        Ok(plan.execute(self.prefix_key())?)
    }

    /// The views the current inputs encode.
    fn encoded(&self) -> usize {
        self.encoded.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The prefix variant of the current inputs.
    fn prefix_key(&self) -> ShapeKey {
        let len = self.prompt_len.load(std::sync::atomic::Ordering::Acquire);
        prefix_key(self.mode, self.encoded(), len)
    }

    /// How the prompt sits in the prefix.
    pub fn prompt_mode(&self) -> PromptMode {
        self.mode
    }

    /// Sets the chunk the halt graph writes (`action_horizon × action_dim`, normalized units),
    /// written in order on `s`: a halt replayed on the same stream afterwards sees it with no
    /// wait on the host.
    pub fn set_hold(&self, s: Stream, chunk: &[f32]) -> Result<()> {
        if chunk.len() != self.hold.numel() || chunk.iter().any(|v| !v.is_finite()) {
            return Err(Error::BadInput {
                what: "hold chunk".into(),
                reason: format!("{} values (need {} finite)", chunk.len(), self.hold.numel()),
            });
        }
        Ok(self.hold.write_f32(s, chunk)?)
    }

    /// Whether the step graph applies a frozen prefix ([`Pi05::build`]).
    pub fn inpaints(&self) -> bool {
        self.inpaint.is_some()
    }

    /// Freezes the first `rows` rows of the next inferences to `actions` (`action_horizon ×
    /// action_dim`, normalized units; rows past `rows` are not read), written in order on the
    /// policy stream: the next replay of the step graph uses them, no recapture. 0 rows: no
    /// frozen prefix. Allocates nothing.
    pub fn set_frozen_prefix(&self, rows: usize, actions: &[f32]) -> Result<()> {
        let Some(p) = &self.inpaint else {
            return Err(Error::BadInput {
                what: "frozen prefix".into(),
                reason: "the model was built without frozen-prefix denoising".into(),
            });
        };
        let c = &self.config;
        if rows > c.action_horizon
            || actions.len() != p.frozen.numel()
            || actions.iter().any(|v| !v.is_finite())
        {
            return Err(Error::BadInput {
                what: "frozen prefix".into(),
                reason: format!(
                    "{rows} rows of {} values (need at most {} rows, {} finite values)",
                    actions.len(),
                    c.action_horizon,
                    p.frozen.numel()
                ),
            });
        }
        p.frozen.write_f32_parts(self.s, &[actions])?;
        p.rows.write_i32(self.s, &[rows as i32])?;
        Ok(())
    }

    /// Replays the halt graph on `s` (the highest-priority stream): the halt output becomes
    /// the hold chunk ([`read_halt`](Self::read_halt)). It neither waits for nor touches the
    /// inference's output.
    pub fn halt(&self, s: Stream) -> Result<()> {
        Ok(self.halt.replay(ShapeKey(0), s)?)
    }

    /// Reads the halt output (`action_horizon × action_dim`) after the work on `s`.
    pub fn read_halt(&self, s: Stream, out: &mut [f32]) -> Result<()> {
        Ok(self.halt_out.buffer().read(s, 0, out)?)
    }

    /// The prompt-token buffer (`max_token_len` i32; entries past the prompt are masked).
    pub fn prompt_tokens(&self) -> &Tensor {
        &self.prefix_parts.tokens
    }

    /// Reads the output chunk (`action_horizon × action_dim`) after the work on `s`.
    pub fn read_actions(&self, s: Stream, out: &mut [f32]) -> Result<()> {
        Ok(self.out.buffer().read(s, 0, out)?)
    }

    /// See [`Policy::enqueue_read_actions`].
    pub fn enqueue_read_actions(&self, s: Stream) -> Result<()> {
        Ok(self
            .out
            .buffer()
            .read_async::<f32>(s, 0, self.out.numel())?)
    }

    /// See [`Policy::collect_actions`].
    pub fn collect_actions(&self, out: &mut [f32]) -> Result<()> {
        Ok(self.out.buffer().collect(0, out)?)
    }

    /// Whether the action expert runs its GEMMs in FP8 ([`Pi05Options::fp8`]).
    pub fn fp8_expert(&self) -> bool {
        matches!(&self.step_model, StepModel::Pi05(e) if e.is_fp8())
    }

    /// What a calibration of this model is recorded on (its variant and sizes); a calibration
    /// file names it.
    pub fn calibration_model(&self) -> String {
        calibration_model(&self.config)
    }

    /// Whether the language model and the expert hold their 16-bit weights (off only for an
    /// FP8 model built without [`Pi05Options::fp8_keep_16bit`]).
    pub fn has_16bit_weights(&self) -> bool {
        let expert = match &self.step_model {
            StepModel::Pi05(e) => e.has_16bit_weights(),
            StepModel::Pi0(_) => true,
        };
        expert && self.prefix_parts.layers.iter().all(|l| l.proj.is_some())
    }

    /// Why [`calibrate`](Self::calibrate) cannot run on this model, if it cannot: Pi0 has no
    /// FP8 path, and recording runs the 16-bit path, whose weights an FP8 model built without
    /// [`Pi05Options::fp8_keep_16bit`] does not hold.
    pub fn calibrating_refused(&self) -> Option<String> {
        if self.config.variant != Variant::Pi05 {
            return Some("Pi0 has no FP8 path to calibrate (Pi0.5 has one)".into());
        }
        (!self.has_16bit_weights()).then(|| {
            "recording a calibration runs the 16-bit path, and this FP8 model was built \
             without its 16-bit weights (Pi05Options::fp8_keep_16bit off): record on a 16-bit \
             model of the same checkpoint"
                .into()
        })
    }

    /// Records a calibration of SigLIP's, the language model's and the action expert's FP8 GEMM
    /// inputs
    /// ([`calibration`](crate::calibration)): each observation runs as
    /// [`calibrate_inference`](Self::calibrate_inference) runs it (vision, the prefix and every
    /// denoising step with the 16-bit GEMMs outside any graph), each GEMM input read back and
    /// its range recorded at `percentile`. The captured graphs are not
    /// touched; the model's outputs afterwards are those of the last observation.
    pub fn calibrate(
        &self,
        observations: &[Observation],
        percentile: f64,
    ) -> Result<crate::calibration::Calibration> {
        let mut rec = crate::calibration::RangeRecorder::new(percentile)?;
        for obs in observations {
            self.set_inputs(obs)?;
            self.calibrate_inference(&mut rec)?;
        }
        rec.finish(&self.calibration_model())
    }

    /// One inference on the inputs set (vision, the prefix and every denoising step with the
    /// 16-bit GEMMs outside any graph, as `run` computes them), each FP8 GEMM input read back
    /// and its range recorded into `rec` as one observation.
    pub fn calibrate_inference(&self, rec: &mut crate::calibration::RangeRecorder) -> Result<()> {
        if let Some(reason) = self.calibrating_refused() {
            return Err(Error::Config { reason });
        }
        let s = self.s;
        // One pair of read-back buffers for every GEMM input of the inference.
        let (mut raw, mut values) = (Vec::new(), Vec::new());
        let mut probe = |name: &str, t: &Tensor| -> Result<()> {
            t.read_f32_into(s, &mut raw, &mut values)?;
            rec.record(name, &values)
        };
        self.vision_model
            .run_calibrating(&self.k, s, self.encoded(), &mut probe)?;
        let c = &self.config;
        let prompt_rows = match self.mode {
            PromptMode::Fixed => c.max_token_len,
            PromptMode::Exact => self.prompt_len.load(std::sync::atomic::Ordering::Acquire),
        };
        let image_rows = self.encoded() * c.siglip.tokens();
        self.prefix_parts
            .run_calibrating(&self.k, s, image_rows, prompt_rows, &mut probe)?;
        for i in 0..self.config.steps {
            self.step_model
                .record_calibrating(&self.k, s, i, self.encoded(), &mut probe)?;
        }
        self.k.ctx().sync_stream(s)?;
        rec.end_observation();
        Ok(())
    }

    /// Loads another calibration into a model built with an FP8 expert: its scales are
    /// written into the buffer the step graphs read (no recapture). The calibration must have
    /// been recorded on this model's kind (every range named as this model names them).
    pub fn set_calibration(&self, cal: &crate::calibration::Calibration) -> Result<()> {
        let prefix = self.prefix_parts.fp8.as_ref();
        let vision = self.vision_model.is_fp8();
        check_calibration(&self.config, cal, prefix.is_some(), vision)?;
        match &self.step_model {
            StepModel::Pi05(e) => e.set_calibration(self.s, cal)?,
            StepModel::Pi0(_) => {
                return Err(Error::Config {
                    reason: "an FP8 action expert is Pi0.5's".into(),
                });
            }
        }
        if let Some(f) = prefix {
            f.stack.set_scales(self.s, cal)?;
        }
        if vision {
            self.vision_model.set_calibration(self.s, cal)?;
        }
        self.k.ctx().sync_stream(self.s)?;
        Ok(())
    }

    /// Whether the language model runs its GEMMs in FP8 ([`Pi05Options::fp8_prefix`]).
    pub fn fp8_prefix(&self) -> bool {
        self.prefix_parts.fp8.is_some()
    }

    /// Whether SigLIP runs its GEMMs in FP8 ([`Pi05Options::fp8_vision`]).
    pub fn fp8_vision(&self) -> bool {
        self.vision_model.is_fp8()
    }

    /// What a stage hands to the next, read back as f32 after the work on the model's stream
    /// (to compare precisions stage by stage; allocates). Read each right after its stage:
    /// [`StageOutput::Vision`] after [`Stage::Vision`] (the prefix then overwrites those rows),
    /// [`StageOutput::PrefixKv`] after [`Stage::Prefix`], [`StageOutput::Noise`] before and
    /// after a step (their difference is the step's velocity times its time step).
    pub fn read_stage_output(&self, what: StageOutput) -> Result<Vec<f32>> {
        let s = self.s;
        let c = &self.config;
        let image_rows = self.encoded() * c.siglip.tokens();
        Ok(match what {
            StageOutput::Vision => self.prefix_parts.x.narrow(0, 0, image_rows)?.read_f32(s)?,
            StageOutput::PrefixKv => {
                let prompt_rows = match self.mode {
                    PromptMode::Fixed => c.max_token_len,
                    PromptMode::Exact => self.prompt_len.load(std::sync::atomic::Ordering::Acquire),
                };
                let mut v = Vec::new();
                for l in &self.prefix_parts.layers {
                    for cache in [&l.k_cache, &l.v_cache] {
                        v.extend(cache.narrow(0, 0, image_rows + prompt_rows)?.read_f32(s)?);
                    }
                }
                v
            }
            StageOutput::Noise => self.x.read_f32(s)?,
        })
    }

    /// Convenience: inputs, one inference, and the actions (allocates the result).
    pub fn infer(&self, obs: &Observation) -> Result<Vec<f32>> {
        self.set_inputs(obs)?;
        self.run()?;
        let mut a = vec![0f32; self.out.numel()];
        self.read_actions(self.s, &mut a)?;
        Ok(a)
    }
}

impl Policy for Pi05 {
    fn spec(&self) -> &PolicySpec {
        &self.spec
    }
    fn summary(&self) -> String {
        let c = &self.config;
        let side = c.siglip.image_size / c.siglip.patch;
        let fp8: Vec<&str> = [
            (self.fp8_vision(), "SigLIP"),
            (self.fp8_prefix(), "language model"),
            (self.fp8_expert(), "expert"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        format!(
            "{}: SigLIP {side}×{side} patches of {} px, width {}, {} layers; language model width {}, {} layers; expert width {}, {} layers{}",
            c.variant.name(),
            c.siglip.patch,
            c.siglip.width,
            c.siglip.depth,
            c.llm.width,
            c.llm.depth,
            c.expert.width,
            c.expert.depth,
            if fp8.is_empty() {
                String::new()
            } else {
                format!("; FP8 GEMMs: {}", fp8.join(", "))
            }
        )
    }
    fn stages(&self) -> &[Stage] {
        &self.stages
    }
    fn stream(&self) -> Stream {
        self.s
    }
    fn set_inputs(&self, obs: &Observation) -> Result<()> {
        Pi05::set_inputs(self, obs)
    }
    fn set_prompt(&self, tokens: &[u32], views_present: &[bool]) -> Result<()> {
        Pi05::set_prompt(self, tokens, views_present)
    }
    fn replay(&self, stage: Stage) -> Result<()> {
        Pi05::replay(self, stage)
    }
    fn run(&self) -> Result<()> {
        Pi05::run(self)
    }
    fn read_actions(&self, s: Stream, out: &mut [f32]) -> Result<()> {
        Pi05::read_actions(self, s, out)
    }
    fn enqueue_read_actions(&self, s: Stream) -> Result<()> {
        Pi05::enqueue_read_actions(self, s)
    }
    fn collect_actions(&self, out: &mut [f32]) -> Result<()> {
        Pi05::collect_actions(self, out)
    }
    fn set_hold(&self, s: Stream, chunk: &[f32]) -> Result<()> {
        Pi05::set_hold(self, s, chunk)
    }
    fn halt(&self, s: Stream) -> Result<()> {
        Pi05::halt(self, s)
    }
    fn read_halt(&self, s: Stream, out: &mut [f32]) -> Result<()> {
        Pi05::read_halt(self, s, out)
    }
    fn inpaints(&self) -> bool {
        Pi05::inpaints(self)
    }
    fn set_frozen_prefix(&self, rows: usize, actions: &[f32]) -> Result<()> {
        Pi05::set_frozen_prefix(self, rows, actions)
    }
    fn capture_count(&self) -> u64 {
        Pi05::capture_count(self)
    }
    fn target(&self) -> String {
        self.k.target()
    }
    fn calibrate_inference(&self, rec: &mut crate::calibration::RangeRecorder) -> Result<()> {
        Pi05::calibrate_inference(self, rec)
    }
    fn calibration_model(&self) -> Option<String> {
        (self.config.variant == Variant::Pi05).then(|| Pi05::calibration_model(self))
    }
    fn calibrating_refused(&self) -> Option<String> {
        Pi05::calibrating_refused(self)
    }
    fn set_calibration(&self, cal: &crate::calibration::Calibration) -> Result<()> {
        Pi05::set_calibration(self, cal)
    }
}
