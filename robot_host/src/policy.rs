//! The policy as the control loop drives it: the configured model (`model.kind`) built as a
//! `dyn frt_vla::Policy`, host-side preprocessing (state normalization, prompt tokens),
//! stage by stage replays, and the halt graph on the highest-priority stream. Only this file
//! knows which model runs.

use crate::config::{Backend, Config, ModelKind, ModelSource, Precision};
use crate::error::{Error, Result};
use frt_exec::{Ctx, Stream};
use frt_kernels::DType;
use frt_vla::inputs::Normalization;
use frt_vla::{
    ChunkShape, Observation, Pi05, Pi05Config, Pi05Options, Pi05Weights, PolicySpec, PromptScratch,
    Stage, StateInput, Tokenizer, Variant, ViewImage, pi0_tokens_into, pi05_tokens,
    pi05_tokens_into,
};
use std::path::Path;
use std::sync::Arc;

/// The small tokenizer bundled for `random_tiny` models (demos, tests).
const DEMO_TOKENIZER: &str = include_str!("../assets/demo-tokenizer.json");

/// Standard normal noise from a seeded generator (xorshift64*, Box–Muller): a scripted run
/// replayed with the same seed draws the same noise.
pub struct Noise(u64);

impl Noise {
    pub fn new(seed: u64) -> Noise {
        Noise(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        ((r >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    pub fn fill(&mut self, out: &mut [f32]) {
        for pair in out.chunks_mut(2) {
            let (u1, u2) = (self.uniform(), self.uniform());
            let r = (-2.0 * u1.ln()).sqrt();
            let th = std::f64::consts::TAU * u2;
            pair[0] = (r * th.cos()) as f32;
            if pair.len() > 1 {
                pair[1] = (r * th.sin()) as f32;
            }
        }
    }
}

/// Makes a tick's prompt tokens from a subgoal and a raw robot state exactly as
/// [`Policy::prepare`] does (it uses one), on any thread: the I/O side makes them as each
/// state arrives, so that the control thread only copies them.
#[derive(Clone)]
pub struct PromptMaker {
    state_input: StateInput,
    tokenizer: Arc<Tokenizer>,
    norm: Option<Arc<Normalization>>,
    max_len: usize,
}

impl PromptMaker {
    /// Normalizes `state` into `normalized` and writes the prompt's ids into `ids`.
    pub fn make(
        &self,
        subgoal: &str,
        state: &[f32],
        normalized: &mut Vec<f32>,
        ids: &mut Vec<u32>,
        scratch: &mut PromptScratch,
    ) -> frt_vla::Result<()> {
        normalized.clear();
        normalized.extend_from_slice(state);
        if let Some(n) = &self.norm {
            n.state.normalize(normalized, n.quantiles)?;
        }
        prompt_into(
            self.state_input,
            &self.tokenizer,
            subgoal,
            normalized,
            self.max_len,
            ids,
            scratch,
        )
    }
}

pub struct Policy {
    ctx: Ctx,
    model: Box<dyn frt_vla::Policy>,
    halt_stream: Stream,
    tokenizer: Arc<Tokenizer>,
    /// A normalized state whose prompt has the most tokens (every value in the bin whose
    /// number tokenizes longest): subgoals are checked against it when they arrive.
    worst_state: Arc<[f32]>,
    norm: Option<Arc<Normalization>>,
    prompts: PromptMaker,
    noise: Noise,
    noise_buf: Vec<f32>,
    /// `noise_buf` holds a draw no tick has used yet (see [`Policy::draw_noise`]).
    noise_ready: bool,
    /// This tick's chunk copy is enqueued behind its last stage ([`Policy::enqueue_read`]).
    read_enqueued: bool,
    raw: Vec<f32>,
    /// The last chunk published (`keep_chunk`) and the last one read, in the model's
    /// normalized units (frozen-prefix denoising takes the published one's rows), and the
    /// frozen rows written for the next inference (scratch).
    last_raw: Vec<f32>,
    read_raw: Vec<f32>,
    frozen: Vec<f32>,
    /// Per-tick scratch: the normalized state, the prompt tokens and the tokenizer's buffers
    /// (reused, so a tick allocates nothing).
    state_buf: Vec<f32>,
    tokens: Vec<u32>,
    prompt: PromptScratch,
}

/// The model configuration a node configuration asks for: the preset of its size (or the
/// whole configuration a generated checkpoint's `config.json` holds), its views and prompt
/// capacity, and the chunk shape from `model.action_horizon` or the
/// checkpoint's `config.json` (they must agree when both are given), else the preset's (50
/// rows of 32). Also checks what depends on the horizon (`Config::validate_horizon`).
pub fn model_config(cfg: &Config) -> Result<Pi05Config> {
    let file = match cfg.model.source() {
        ModelSource::Checkpoint(dir) => ChunkShape::of_checkpoint(&dir)?,
        _ => ChunkShape::default(),
    };
    let mut c = match (cfg.model.source(), &file.model) {
        (ModelSource::RandomTiny { .. }, _) => Pi05Config::tiny(),
        (_, Some(m)) => m.clone(),
        _ => Pi05Config::base(),
    };
    let variant = match cfg.model.kind {
        ModelKind::Pi05 => Variant::Pi05,
        ModelKind::Pi0 => Variant::Pi0,
    };
    if let Some(m) = &file.model {
        if m.variant != variant {
            return Err(crate::config::ConfigError {
                field: "model.kind".into(),
                problem: format!(
                    "{}, but the checkpoint's config.json describes a {} model",
                    variant.name(),
                    m.variant.name()
                ),
            }
            .into());
        }
    }
    c.variant = variant;
    c.views = cfg.views();
    c.max_token_len = cfg.model.max_token_len;
    match (cfg.model.action_horizon, file.action_horizon) {
        (Some(a), Some(b)) if a != b => {
            return Err(crate::config::ConfigError {
                field: "model.action_horizon".into(),
                problem: format!("{a} rows, but the checkpoint's config.json says {b}"),
            }
            .into());
        }
        (Some(h), _) | (None, Some(h)) => c.action_horizon = h,
        (None, None) => {}
    }
    if let Some(d) = file.action_dim {
        c.action_dim = d;
    }
    if cfg.control.action_dim > c.action_dim {
        return Err(crate::config::ConfigError {
            field: "control.action_dim".into(),
            problem: format!(
                "{} dimensions; the model predicts {}",
                cfg.control.action_dim, c.action_dim
            ),
        }
        .into());
    }
    if variant == Variant::Pi0 && cfg.state.joints.len() > c.action_dim {
        return Err(crate::config::ConfigError {
            field: "state.joints".into(),
            problem: format!(
                "{} joints; Pi0 takes at most {} state values (its action_dim)",
                cfg.state.joints.len(),
                c.action_dim
            ),
        }
        .into());
    }
    cfg.validate_horizon(c.action_horizon)?;
    Ok(c)
}

/// The prompt's token ids for a task and a normalized state, as the model takes them: Pi0.5's
/// prompt carries the state, Pi0's is the task alone.
fn prompt_into(
    state_input: StateInput,
    tokenizer: &Tokenizer,
    task: &str,
    normalized_state: &[f32],
    max_len: usize,
    ids: &mut Vec<u32>,
    scratch: &mut PromptScratch,
) -> frt_vla::Result<()> {
    match state_input {
        StateInput::Prompt => {
            pi05_tokens_into(tokenizer, task, normalized_state, max_len, ids, scratch)
        }
        StateInput::Token => pi0_tokens_into(tokenizer, task, max_len, ids, scratch),
    }
}

/// The normalized state of `n` values whose pi05 prompt has the most tokens: all values in
/// one bin (−1 to 255, `discretize_state`'s range), the bin whose number tokenizes longest.
fn worst_state(tokenizer: &Tokenizer, n: usize) -> Result<Arc<[f32]>> {
    let mut worst = (0, vec![0.0f32; n]);
    for bin in -1i32..256 {
        // A value inside the bin (below −1 for bin −1).
        let x = if bin < 0 {
            -1.5
        } else {
            -1.0 + (2.0 * bin as f32 + 1.0) / 256.0
        };
        let state = vec![x; n];
        let len = pi05_tokens(tokenizer, "a", &state, usize::MAX)?.len();
        if len > worst.0 {
            worst = (len, state);
        }
    }
    Ok(worst.1.into())
}

/// What the policy loads besides the weights: the prompt tokenizer (checked against the
/// model with the start-up prompt and the longest state), the longest state, the norm stats.
struct HostSide {
    tokenizer: Arc<Tokenizer>,
    worst_state: Arc<[f32]>,
    norm: Option<Arc<Normalization>>,
}

impl HostSide {
    fn load(cfg: &Config, mc: &Pi05Config) -> Result<HostSide> {
        let tokenizer = match &cfg.model.tokenizer {
            Some(p) => Tokenizer::load(p)?,
            None => Tokenizer::parse(DEMO_TOKENIZER, Path::new("<bundled demo tokenizer>"))?,
        };
        // A tokenizer that does not fit the model fails here, not at every tick: the start-up
        // prompt must tokenize within the prompt capacity (with the longest state) and the
        // model's vocabulary.
        let worst_state = worst_state(&tokenizer, cfg.state.joints.len())?;
        let mut probe = Vec::new();
        prompt_into(
            mc.variant.state_input(),
            &tokenizer,
            &cfg.control.initial_subgoal,
            &worst_state,
            mc.max_token_len,
            &mut probe,
            &mut PromptScratch::default(),
        )?;
        if let Some(t) = probe.iter().find(|t| **t as usize >= mc.vocab) {
            return Err(Error::bad(
                "tokenizer",
                format!(
                    "token {t} of the start-up prompt is outside the model's vocabulary of {}",
                    mc.vocab
                ),
            ));
        }
        let norm = match &cfg.model.norm_stats {
            Some(p) => Some(Arc::new(Normalization::load(p, cfg.model.quantile_norm)?)),
            None => None,
        };
        Ok(HostSide {
            tokenizer: Arc::new(tokenizer),
            worst_state,
            norm,
        })
    }
}

/// Where the weights come from, for people.
pub fn source_name(cfg: &Config) -> String {
    match cfg.model.source() {
        ModelSource::Checkpoint(dir) => format!("checkpoint {}", dir.display()),
        ModelSource::RandomTiny { seed } => format!("random tiny weights (seed {seed})"),
        ModelSource::RandomBase { seed } => format!("random full-size weights (seed {seed})"),
    }
}

/// Logs how much of the `total` bytes the build reads of the checkpoint it has read, every 3 s
/// until `done`.
fn upload_progress(done: &std::sync::atomic::AtomicBool, before: u64, total: u64) {
    let every = std::time::Duration::from_secs(3);
    let mut next = std::time::Instant::now() + every;
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(50));
        if std::time::Instant::now() >= next {
            next += every;
            let read = frt_vla::checkpoint_bytes_read().saturating_sub(before);
            tracing::info!(
                "building: {} of {} MB of weights read ({:.0} %); then GEMM tuning and \
                 graph captures",
                read / 1_000_000,
                total / 1_000_000,
                100.0 * read as f64 / total.max(1) as f64
            );
        }
    }
}

/// The checkpoint's weights (checked against the configuration), or generated ones.
fn load_weights(cfg: &Config, mc: &Pi05Config) -> Result<Pi05Weights> {
    Ok(match &cfg.model.source() {
        ModelSource::Checkpoint(dir) => Pi05Weights::load(dir, mc)?,
        ModelSource::RandomTiny { seed } | ModelSource::RandomBase { seed } => {
            Pi05Weights::random(mc, *seed)
        }
    })
}

/// Writes the configuration's checkpoint into the new folder `out` with the weights its
/// `precision: fp8` model runs in FP8 pre-quantized (the action expert's, and the language
/// model's and SigLIP's unless `model.fp8_prefix` / `fp8_vision` are off), every other tensor
/// and the files beside the checkpoint as they are (`frt-robot-host quantize`; see
/// [`Pi05Weights::write_fp8`]). The configuration with `model.checkpoint: out` builds the same
/// FP8 model, reading half those weights' bytes and quantizing nothing at load.
pub fn quantize_checkpoint(cfg: &Config, out: &Path) -> Result<frt_vla::WrittenCheckpoint> {
    let refuse = |field: &str, problem: String| {
        Error::from(crate::config::ConfigError {
            field: field.into(),
            problem,
        })
    };
    if cfg.model.precision != Precision::Fp8 {
        return Err(refuse(
            "model.precision",
            format!(
                "{:?}: quantizing writes the weights a `precision: fp8` model runs in FP8",
                cfg.model.precision
            ),
        ));
    }
    let ModelSource::Checkpoint(dir) = cfg.model.source() else {
        return Err(refuse(
            "model.random",
            "a generated model has no checkpoint to quantize".into(),
        ));
    };
    let mc = model_config(cfg)?;
    let (prefix, vision) = fp8_stages(cfg);
    Ok(Pi05Weights::load(&dir, &mc)?.write_fp8(prefix, vision, out)?)
}

/// Whether the language model and SigLIP run in FP8 when the model does (`model.fp8_prefix`,
/// `model.fp8_vision`; both by default).
fn fp8_stages(cfg: &Config) -> (bool, bool) {
    (
        cfg.model.fp8_prefix.unwrap_or(true),
        cfg.model.fp8_vision.unwrap_or(true),
    )
}

/// Every load and check of [`Policy::build`] that needs no device: the tokenizer against the
/// model, the norm stats, the checkpoint's tensors and shapes (`check` on a machine without
/// the configured GPU).
pub fn check_files(cfg: &Config) -> Result<()> {
    let mc = model_config(cfg)?;
    HostSide::load(cfg, &mc)?;
    if let ModelSource::Checkpoint(dir) = cfg.model.source() {
        Pi05Weights::load(&dir, &mc)?.check_finite()?;
    }
    if let Some(path) = &cfg.model.calibration {
        frt_vla::calibration::Calibration::read(path)?;
    }
    Ok(())
}

impl Policy {
    /// Loads (or generates) the weights, builds the graphs and warms them up.
    pub fn build(cfg: &Config) -> Result<Policy> {
        let t = std::time::Instant::now();
        let ctx = match cfg.model.backend {
            Backend::Auto => Ctx::auto()?,
            Backend::Host => Ctx::host()?,
            Backend::Cuda => Ctx::cuda(0)?,
        };
        tracing::info!(
            seconds = format!("{:.2}", t.elapsed().as_secs_f64()),
            target = ?ctx.backend(),
            "device opened"
        );
        let mc = model_config(cfg)?;
        let HostSide {
            tokenizer,
            worst_state,
            norm,
        } = HostSide::load(cfg, &mc)?;
        let t = std::time::Instant::now();
        tracing::info!(
            model = mc.variant.name(),
            source = %source_name(cfg),
            "loading the weights"
        );
        let weights = load_weights(cfg, &mc)?;
        tracing::info!(
            seconds = format!("{:.2}", t.elapsed().as_secs_f64()),
            "weights opened; building the graphs (uploads, GEMM tuning, captures)"
        );
        let fp8 = (cfg.model.precision == Precision::Fp8).then(|| fp8_stages(cfg));
        let decoded = weights.pre_quantized_outside(fp8)?;
        if decoded > 0 {
            tracing::warn!(
                weights = decoded,
                "the checkpoint holds pre-quantized (E4M3) weights that this model runs in 16 \
                 bits: they compute with the codes' values, not the weights they were made from"
            );
        }
        let t = std::time::Instant::now();
        let (lo, hi) = ctx.priority_range();
        let check = |field: &str, p: i32| {
            if p > lo || p < hi {
                Err(crate::config::ConfigError {
                    field: field.into(),
                    problem: format!("priority {p} outside this device's range {lo} to {hi}"),
                })
            } else {
                Ok(p)
            }
        };
        let (policy, halt, asr) = cfg.streams.resolve((lo, hi));
        check("streams.asr", asr)?;
        let s = ctx.stream(check("streams.policy", policy)?)?;
        let halt_stream = ctx.stream(check("streams.halt", halt)?)?;
        let dtype = match cfg.model.precision {
            Precision::F32 => DType::F32,
            Precision::Bf16 => DType::BF16,
            Precision::F16 => DType::F16,
            Precision::Fp8 => DType::BF16,
        };
        let fp8_expert = match (&cfg.model.calibration, cfg.model.precision) {
            (Some(path), Precision::Fp8) => Some(frt_vla::calibration::Calibration::read(path)?),
            _ => None,
        };
        let options = Pi05Options {
            dtype,
            prompt_mode: cfg.model.prompt_mode,
            inpaint_prefix: cfg.execution.inpaint_prefix,
            kernels: cfg.kernels,
            compact_views: true,
            run_variants_once: true,
            fp8: fp8_expert,
            fp8_prefix: fp8_stages(cfg).0,
            fp8_vision: fp8_stages(cfg).1,
            // A node records calibrations on a 16-bit model (`calibrate`), so its FP8 stacks
            // load only their FP8 weights.
            fp8_keep_16bit: false,
        };
        // Pi0.5 and Pi0 are one model type; `mc.variant` (from `model.kind`) picks. While it
        // builds, the reads' progress is logged every few seconds, against what this build
        // reads (with SigLIP in FP8 its projections twice).
        let total = weights.bytes_a_build_reads(&options);
        let read_before = frt_vla::checkpoint_bytes_read();
        let built = std::sync::atomic::AtomicBool::new(false);
        let model: Box<dyn frt_vla::Policy> = std::thread::scope(|sc| {
            sc.spawn(|| upload_progress(&built, read_before, total));
            let r = match cfg.model.kind {
                ModelKind::Pi05 | ModelKind::Pi0 => Pi05::build(&ctx, s, &weights, &options),
            };
            built.store(true, std::sync::atomic::Ordering::SeqCst);
            r.map(|m| Box::new(m) as Box<dyn frt_vla::Policy>)
        })?;
        let mb = |b: u64| format!("{:.1}", b as f64 / 1e6);
        tracing::info!(
            read_mb = mb(frt_vla::checkpoint_bytes_read() - read_before),
            checkpoint_mb = mb(weights.stored_bytes()),
            "weights uploaded"
        );
        drop(weights);
        if let Some(e) = ctx.memset_nodes_error() {
            tracing::warn!(
                error = %e,
                "graphs keep their memset nodes (the kernel replacing them did not load): the same results, a little slower"
            );
        }
        tracing::info!(
            graphs = model.capture_count(),
            seconds = format!("{:.2}", t.elapsed().as_secs_f64()),
            target = %model.target(),
            "model built"
        );
        let prompts = PromptMaker {
            state_input: model.spec().state,
            tokenizer: tokenizer.clone(),
            norm: norm.clone(),
            max_len: model.spec().max_token_len,
        };
        let p = Policy {
            ctx,
            model,
            halt_stream,
            prompts,
            tokenizer,
            worst_state,
            norm,
            noise: Noise::new(cfg.control.noise_seed),
            noise_buf: vec![0.0; mc.action_horizon * mc.action_dim],
            noise_ready: false,
            read_enqueued: false,
            raw: vec![0.0; mc.action_horizon * mc.action_dim],
            last_raw: vec![0.0; mc.action_horizon * mc.action_dim],
            read_raw: vec![0.0; mc.action_horizon * mc.action_dim],
            frozen: vec![0.0; mc.action_horizon * mc.action_dim],
            state_buf: Vec::with_capacity(cfg.state.joints.len()),
            tokens: Vec::with_capacity(PromptScratch::max_ids(
                crate::node::MAX_SUBGOAL_BYTES,
                cfg.state.joints.len(),
            )),
            prompt: PromptScratch::with_capacity(
                crate::node::MAX_SUBGOAL_BYTES,
                cfg.state.joints.len(),
            ),
        };
        // The halt graph has a defined chunk from the start (zeros, normalized units).
        p.model
            .set_hold(p.halt_stream, &vec![0.0; mc.action_horizon * mc.action_dim])?;
        Ok(p)
    }

    /// What the model takes and gives.
    pub fn spec(&self) -> &PolicySpec {
        self.model.spec()
    }

    /// The model's architecture in one line (`check`).
    pub fn summary(&self) -> String {
        self.model.summary()
    }

    /// The context the policy runs in.
    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    /// The stream the policy's stages run on.
    pub fn stream(&self) -> Stream {
        self.model.stream()
    }

    /// Graphs captured so far.
    pub fn capture_count(&self) -> u64 {
        self.model.capture_count()
    }

    /// Where the kernels run (`host`, or the GPU's architecture).
    pub fn target(&self) -> String {
        self.model.target()
    }

    /// Writes a subgoal's prompt alone (benchmarks: the cost of a subgoal change), with
    /// every view present.
    pub fn set_prompt(&self, tokens: &[u32]) -> Result<()> {
        let present = [true; frt_vla::MAX_VIEWS];
        Ok(self
            .model
            .set_prompt(tokens, &present[..self.spec().views])?)
    }

    /// The check a subgoal passes when it arrives (on the I/O side): its prompt, with the
    /// state that tokenizes longest, fits the model's prompt capacity, and every token is in
    /// the model's vocabulary.
    pub fn subgoal_check(&self) -> crate::node::SubgoalCheck {
        let tokenizer = self.tokenizer.clone();
        let state = self.worst_state.clone();
        let (max_len, vocab) = (self.spec().max_token_len, self.spec().vocab);
        let state_input = self.spec().state;
        Arc::new(move |text: &str| {
            let mut ids = Vec::new();
            let mut scratch = PromptScratch::default();
            prompt_into(
                state_input,
                &tokenizer,
                text,
                &state,
                max_len,
                &mut ids,
                &mut scratch,
            )
            .map_err(|e| match e {
                frt_vla::Error::BadInput { reason, .. } => match state_input {
                    StateInput::Prompt => {
                        format!("the prompt would have {reason} (with the longest state)")
                    }
                    StateInput::Token => format!("the prompt would have {reason}"),
                },
                e => e.to_string(),
            })?;
            match ids.iter().find(|t| **t as usize >= vocab) {
                Some(t) => Err(format!(
                    "token {t} is outside the model's vocabulary of {vocab}"
                )),
                None => Ok(()),
            }
        })
    }

    pub fn stages(&self) -> &[Stage] {
        self.model.stages()
    }

    /// What makes the prompt tokens (for the I/O side).
    pub fn prompt_maker(&self) -> PromptMaker {
        self.prompts.clone()
    }

    /// Writes one observation (frames, the prompt with the state, fresh noise)
    /// into the model's buffers. `tokens`: the prompt's ids for this subgoal and state, made
    /// beforehand by this policy's [`PromptMaker`]; `None`: made here.
    pub fn prepare(
        &mut self,
        frames: &[Option<ViewImage>],
        state: &[f32],
        subgoal: &str,
        tokens: Option<&[u32]>,
    ) -> Result<()> {
        let views = self.spec().views;
        if frames.len() != views {
            return Err(Error::bad(
                "frames",
                format!("{} for {views} views", frames.len()),
            ));
        }
        // A copy enqueued by a tick that did not finish is not this tick's chunk.
        self.read_enqueued = false;
        let t0 = std::time::Instant::now();
        match tokens {
            Some(ids) => {
                self.state_buf.clear();
                self.state_buf.extend_from_slice(state);
                if let Some(n) = &self.norm {
                    n.state.normalize(&mut self.state_buf, n.quantiles)?;
                }
                self.tokens.clear();
                self.tokens.extend_from_slice(ids);
            }
            None => self.prompts.make(
                subgoal,
                state,
                &mut self.state_buf,
                &mut self.tokens,
                &mut self.prompt,
            )?,
        }
        let t1 = std::time::Instant::now();
        self.draw_noise();
        // The draw is used up whether or not the inputs are accepted, as when it was drawn
        // here: the sequence of draws does not depend on when they are made.
        self.noise_ready = false;
        let t2 = std::time::Instant::now();
        let r = self.model.set_inputs(&Observation {
            images: frames,
            tokens: &self.tokens,
            state: &self.state_buf,
            noise: &self.noise_buf,
        });
        // In a trace (`--trace`), the parts of the control thread's input preparation.
        use crate::observe::trace;
        let (t3, track) = (std::time::Instant::now(), trace::this_thread());
        trace::span("prompt and state", track, t0, t1);
        trace::span("model inputs (uploads, frame resizes)", track, t2, t3);
        r?;
        Ok(())
    }

    /// Draws the next tick's noise now unless it is drawn already: the control loop calls it
    /// while the device runs a tick, so that the next tick's preparation does not wait for it.
    /// The draws come in the same order either way (a scripted run replays the same noise).
    pub fn draw_noise(&mut self) {
        if !self.noise_ready {
            self.noise.fill(&mut self.noise_buf);
            self.noise_ready = true;
        }
    }

    /// The prompt tokens for a subgoal and a (raw) robot state, as a tick builds them.
    pub fn prompt_tokens(&self, subgoal: &str, state: &[f32]) -> Result<Vec<u32>> {
        let mut st = state.to_vec();
        if let Some(n) = &self.norm {
            n.state.normalize(&mut st, n.quantiles)?;
        }
        let mut ids = Vec::new();
        prompt_into(
            self.spec().state,
            &self.tokenizer,
            subgoal,
            &st,
            self.spec().max_token_len,
            &mut ids,
            &mut PromptScratch::default(),
        )?;
        Ok(ids)
    }

    /// Enqueues one stage on the policy stream.
    pub fn replay(&self, stage: Stage) -> Result<()> {
        Ok(self.model.replay(stage)?)
    }

    /// One inference on the inputs prepared, through the model's 16-bit path, recording the
    /// ranges of its FP8 GEMMs' inputs (see `frt_vla::calibration`); waits for it.
    pub fn calibrate_inference(&self, rec: &mut frt_vla::calibration::RangeRecorder) -> Result<()> {
        Ok(self.model.calibrate_inference(rec)?)
    }

    /// What a calibration of this model is recorded on, where it has an FP8 path.
    pub fn calibration_model(&self) -> Option<String> {
        self.model.calibration_model()
    }

    /// Why the model cannot record a calibration, if it cannot (see
    /// `frt_vla::Policy::calibrating_refused`).
    pub fn calibrating_refused(&self) -> Option<String> {
        self.model.calibrating_refused()
    }

    /// Writes another calibration's scales into the FP8 model's buffers (no recapture; waits
    /// for the write). An error leaves the scales as they were.
    pub fn set_calibration(&self, cal: &frt_vla::calibration::Calibration) -> Result<()> {
        Ok(self.model.set_calibration(cal)?)
    }

    /// Enqueues the copy of this tick's chunk to the host behind the stages replayed so far
    /// (the node calls it after the last one): [`Policy::finish`] then only collects it.
    pub fn enqueue_read(&mut self) -> Result<()> {
        self.model.enqueue_read_actions(self.model.stream())?;
        self.read_enqueued = true;
        Ok(())
    }

    /// Waits for the policy stream and writes the chunk, in the robot's units, into `out`
    /// (`horizon × robot_dim`, the first `robot_dim` of the model's action dimensions): the
    /// copy [`Policy::enqueue_read`] enqueued this tick, else a copy made now.
    pub fn finish(&mut self, out: &mut [f32], robot_dim: usize) -> Result<()> {
        if std::mem::take(&mut self.read_enqueued) {
            self.model.collect_actions(&mut self.raw)?;
        } else {
            self.model
                .read_actions(self.model.stream(), &mut self.raw)?;
        }
        self.read_raw.copy_from_slice(&self.raw);
        self.unnormalize_into(out, robot_dim)
    }

    /// The chunk last read ([`Policy::finish`]) was published: the next frozen prefix comes
    /// from it (a chunk that was refused or withheld never does).
    pub fn keep_chunk(&mut self) {
        std::mem::swap(&mut self.last_raw, &mut self.read_raw);
    }

    /// Whether the model denoises with a frozen prefix (`execution.inpaint_prefix`).
    pub fn inpaints(&self) -> bool {
        self.model.inpaints()
    }

    /// Freezes the first `rows` rows of the next inference to the last published chunk's rows from
    /// `shift` on (that chunk's row `shift + r` is due with the next chunk's row r), in the
    /// model's units, as that chunk came out of the model; 0 rows: none. Allocates nothing.
    pub fn freeze_prefix(&mut self, rows: usize, shift: usize) -> Result<()> {
        let d = self.spec().action_dim;
        let h = self.spec().action_horizon;
        let rows = rows.min(h.saturating_sub(shift));
        self.frozen[..rows * d].copy_from_slice(&self.last_raw[shift * d..(shift + rows) * d]);
        Ok(self.model.set_frozen_prefix(rows, &self.frozen)?)
    }

    fn unnormalize_into(&mut self, out: &mut [f32], robot_dim: usize) -> Result<()> {
        let d = self.spec().action_dim;
        for (row, o) in self.raw.chunks_mut(d).zip(out.chunks_mut(robot_dim)) {
            if let Some(n) = &self.norm {
                n.actions.unnormalize(row, n.quantiles)?;
            }
            o.copy_from_slice(&row[..robot_dim]);
        }
        Ok(())
    }

    /// Sets the chunk the halt graph writes (robot units, `horizon × robot_dim`; other model
    /// dimensions hold zero), on the halt stream: the next halt sees it.
    pub fn set_hold(&mut self, hold: &[f32], robot_dim: usize) -> Result<()> {
        let d = self.spec().action_dim;
        self.raw.iter_mut().for_each(|x| *x = 0.0);
        for (row, h) in self.raw.chunks_mut(d).zip(hold.chunks(robot_dim)) {
            row[..robot_dim].copy_from_slice(h);
            if let Some(n) = &self.norm {
                n.actions.normalize(row, n.quantiles)?;
            }
        }
        self.model.set_hold(self.halt_stream, &self.raw)?;
        Ok(())
    }

    /// Replays the halt graph on the highest-priority stream and reads the hold chunk it
    /// wrote (robot units) into `out`.
    pub fn halt(&mut self, out: &mut [f32], robot_dim: usize) -> Result<()> {
        self.model.halt(self.halt_stream)?;
        self.model.read_halt(self.halt_stream, &mut self.raw)?;
        self.unnormalize_into(out, robot_dim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bench's tiny model on the host backend, and its noise seed.
    fn tiny_policy() -> (Policy, u64) {
        let cfg = crate::bench::config(true).unwrap();
        (Policy::build(&cfg).unwrap(), cfg.control.noise_seed)
    }

    /// Noise drawn ahead (while the device runs the tick before) is the draw the tick would
    /// have made itself: the same sequence, however often `draw_noise` is called between
    /// ticks, and a tick whose inputs are refused still uses its draw up.
    #[test]
    fn noise_drawn_ahead_keeps_the_sequence() {
        let ((mut plain, seed), (mut ahead, _)) = (tiny_policy(), tiny_policy());
        // The draws in order, one per tick.
        let mut reference = Noise::new(seed);
        let mut want = vec![0.0f32; plain.noise_buf.len()];
        let views = plain.spec().views;
        let size = plain.spec().image_size;
        let image = frt_vla::ModelImage::new(vec![0.25f32; size * size * 3]).unwrap();
        let mut frames: Vec<Option<ViewImage>> = vec![None; views];
        frames[0] = Some(ViewImage::Pixels(&image));
        let bad = frt_vla::ModelImage::new(vec![0.25f32; size * size * 3 - 3]).unwrap();
        let mut bad_frames = frames.clone();
        bad_frames[0] = Some(ViewImage::Pixels(&bad));
        for tick in 0..4 {
            // Tick 2's inputs are refused (a short image) in both.
            let f = if tick == 2 { &bad_frames } else { &frames };
            let state = [0.1, -0.2, 0.3, 0.0, 0.05, -0.1, 0.2, 0.0];
            let r1 = plain.prepare(f, &state, "pick up the cup", None);
            ahead.draw_noise();
            ahead.draw_noise();
            let r2 = ahead.prepare(f, &state, "pick up the cup", None);
            assert_eq!(r1.is_ok(), tick != 2);
            assert_eq!(r2.is_ok(), tick != 2);
            reference.fill(&mut want);
            assert_eq!(plain.noise_buf, want, "tick {tick}");
            assert_eq!(ahead.noise_buf, want, "tick {tick}");
        }
        // The draws differ from tick to tick.
        let last = ahead.noise_buf.clone();
        ahead.draw_noise();
        assert_ne!(ahead.noise_buf, last);
    }

    /// A tick's chunk is its own: the copy a tick enqueued behind its last stage is the one
    /// `finish` reads, and a copy left by a tick that did not finish (a stop after its last
    /// replay) is never read by the next one, which reads its own chunk even when it enqueued
    /// none (a calibration tick).
    #[test]
    fn finish_reads_this_ticks_chunk() {
        let (mut p, _) = tiny_policy();
        let views = p.spec().views;
        let size = p.spec().image_size;
        let d = p.spec().action_dim;
        let n = p.spec().action_horizon * d;
        let state = [0.1, -0.2, 0.3, 0.0, 0.05, -0.1, 0.2, 0.0];
        let tick = |p: &mut Policy, shade: f32, enqueue: bool, finish: bool| {
            let image = frt_vla::ModelImage::new(vec![shade; size * size * 3]).unwrap();
            let mut frames: Vec<Option<ViewImage>> = vec![None; views];
            frames[0] = Some(ViewImage::Pixels(&image));
            p.prepare(&frames, &state, "pick up the cup", None).unwrap();
            for st in p.stages().to_vec() {
                p.replay(st).unwrap();
            }
            if enqueue {
                p.enqueue_read().unwrap();
            }
            let mut out = vec![0.0f32; n];
            finish.then(|| {
                p.finish(&mut out, d).unwrap();
                out
            })
        };
        // A reference policy (the same noise seed) reads every chunk after the stream's work.
        let (mut r, _) = tiny_policy();
        // Per tick: shade, whether `p` enqueues the copy, whether the tick finishes.
        let ticks = [
            (-0.5, true, true),
            (0.5, true, true),
            // A copies its chunk and never finishes; B, enqueuing nothing, reads its own.
            (-0.5, true, false),
            (0.5, false, true),
            (-0.5, true, true),
        ];
        let mut last = None;
        for (i, (shade, enqueue, finish)) in ticks.into_iter().enumerate() {
            let want = tick(&mut r, shade, false, finish);
            let got = tick(&mut p, shade, enqueue, finish);
            assert!(got == want, "tick {i}: another chunk than this tick's");
            if let Some(c) = got {
                assert!(last.as_ref() != Some(&c), "tick {i}: the chunk before");
                last = Some(c);
            }
        }
    }
}
