//! What the two action experts share: the noisy actions `x_t` and their f32 path — the action
//! input projection (`action_in_proj`), the output projection of the expert's final normed
//! action rows (`action_out_proj`) and the Euler update, which after the last step also writes
//! the output chunk; with frozen-prefix denoising each update's first rows are set from the
//! frozen actions. openpi computes all of these in f32 whatever the model's precision.

use crate::error::Result;
use crate::weights::Pi05Weights;
use frt_exec::{Buffer, Stream};
use frt_kernels::{DType, EulerOut, Gemm, Kernels, Tensor, VelocityEuler};

/// Every step's time (1, 1 − 1/steps, …, 1/steps) as openpi's sine-cosine embedding
/// (`posemb_sincos`, periods 4 ms to 4 s), `[steps, width]` in f32.
pub(crate) fn time_embedding(k: &Kernels, s: Stream, steps: usize, width: usize) -> Result<Tensor> {
    let times: Vec<f32> = (0..steps).map(|i| 1.0 - i as f32 / steps as f32).collect();
    let t = Tensor::alloc(k.ctx(), "time", DType::F32, &[steps])?;
    t.write_f32(s, &times)?;
    let temb = Tensor::alloc(k.ctx(), "time_emb", DType::F32, &[steps, width])?;
    k.sinusoidal(s, &t, &temb, 4e-3, 4.0)?;
    // `t` is freed on return: the embedding is done before.
    k.ctx().sync_stream(s)?;
    Ok(temb)
}

/// The buffers of frozen-prefix denoising (real-time chunking's hard mask): the first
/// `rows[0]` rows of every step's update are set to the flow's interpolation between the
/// tick's noise (`x1`, copied at the start of the first step) and `frozen`.
#[derive(Clone)]
pub(crate) struct Inpaint {
    pub(crate) x1: Tensor,
    pub(crate) frozen: Tensor,
    pub(crate) rows: Tensor,
}

/// What an expert shares with the rest of the model.
pub(crate) struct Io {
    /// The noisy actions `[horizon, action_dim]` (f32; with frozen-prefix denoising the first
    /// quarter of a buffer that also holds the noise copy, the frozen actions and their row
    /// count).
    pub(crate) x: Tensor,
    /// The output chunk (f32).
    pub(crate) out: Tensor,
    /// The suffix tokens' positions (i32, written with the prompt).
    pub(crate) suffix_pos: Tensor,
    /// What the first step variant's steps attend to (the others are added with
    /// `add_keys`).
    pub(crate) keys: StepKeys,
    pub(crate) inpaint_prefix: bool,
}

/// The keys of one step variant: the prefix rows that `views` encoded views and a full prompt
/// fill, and the suffix's own rows right behind them in the caches — the step attends to
/// `[..prefix_rows + suffix]` and nothing of the slots that were left out.
#[derive(Clone)]
pub(crate) struct StepKeys {
    pub(crate) views: usize,
    pub(crate) prefix_rows: usize,
    /// Which of those `prefix_rows + suffix` keys are valid (u8, written with the prompt).
    pub(crate) mask: Tensor,
}

/// A step variant as an expert planned it: its number of views, its prefix rows, and per
/// layer its attention plan(s) `P`.
pub(crate) struct StepVariant<P> {
    pub(crate) views: usize,
    pub(crate) prefix_rows: usize,
    pub(crate) plans: Vec<P>,
}

/// The variant planned for `views` encoded views.
pub(crate) fn variant_for<P>(variants: &[StepVariant<P>], views: usize) -> &StepVariant<P> {
    variants
        .iter()
        .find(|v| v.views == views)
        .expect("a step variant for every count of views planned")
}

/// The f32 action path of one denoising step, planned.
pub(crate) struct Flow {
    steps: usize,
    chunk_n: usize,
    dt_step: f32,
    x: Tensor,
    out: Tensor,
    /// Where the input projection writes (`[horizon, width]`, f32).
    embedded: Tensor,
    /// What the output projection reads (`[horizon, width]`, f32).
    expert_out: Tensor,
    v32: Tensor,
    win: Tensor,
    bin: Tensor,
    wout: Tensor,
    bout: Tensor,
    x_scratch: Option<Tensor>,
    inpaint: Option<Inpaint>,
    sg_in: Gemm,
    /// The output projection and the update (one launch on CUDA).
    out_euler: VelocityEuler,
}

impl Flow {
    /// Uploads the projections (f32) and plans them: the input projection from `io.x` into
    /// `embedded`, the output projection from `expert_out`.
    pub(crate) fn build(
        k: &Kernels,
        s: Stream,
        w: &Pi05Weights,
        io: &Io,
        embedded: &Tensor,
        expert_out: &Tensor,
    ) -> Result<Flow> {
        let ctx = k.ctx();
        let c = &w.config;
        let f = DType::F32;
        let (s_len, chunk_n) = (c.action_horizon, c.action_horizon * c.action_dim);
        let t32 = |name: &str| -> Result<Tensor> { Ok(w.get(name)?.upload(ctx, s, f)?) };
        let (win, bin, wout, bout) = (
            t32("action_in_proj.weight")?,
            t32("action_in_proj.bias")?,
            t32("action_out_proj.weight")?,
            t32("action_out_proj.bias")?,
        );
        let v32 = Tensor::alloc(ctx, "step.v32", f, &[s_len, c.action_dim])?;
        // Frozen-prefix denoising writes each update's rows in another dtype too: a scratch
        // for the steps before the last (the output only ever holds a whole chunk).
        let x_scratch = if io.inpaint_prefix {
            Some(Tensor::alloc(
                ctx,
                "step.x.scratch",
                f,
                &[s_len, c.action_dim],
            )?)
        } else {
            None
        };
        let inpaint = if io.inpaint_prefix {
            let (b, shape, strides) = (io.x.buffer(), [s_len, c.action_dim], [c.action_dim, 1]);
            let i = Inpaint {
                x1: Tensor::with_layout(b, DType::F32, &shape, &strides, chunk_n)?,
                frozen: Tensor::with_layout(b, DType::F32, &shape, &strides, 2 * chunk_n)?,
                rows: Tensor::with_layout(b, DType::I32, &[1], &[1], 3 * chunk_n)?,
            };
            i.frozen.write_f32(s, &vec![0.0; s_len * c.action_dim])?;
            i.rows.write_i32(s, &[0])?;
            Some(i)
        } else {
            None
        };
        Ok(Flow {
            steps: c.steps,
            chunk_n,
            dt_step: -1.0 / c.steps as f32,
            x: io.x.clone(),
            out: io.out.clone(),
            sg_in: k.linear(&io.x, &win, embedded, true, false)?,
            out_euler: k.velocity_euler(expert_out, &wout, &v32)?,
            embedded: embedded.clone(),
            expert_out: expert_out.clone(),
            v32,
            win,
            bin,
            wout,
            bout,
            x_scratch,
            inpaint,
        })
    }

    /// The frozen-prefix buffers, when built with them.
    pub(crate) fn inpaint(&self) -> Option<&Inpaint> {
        self.inpaint.as_ref()
    }

    /// Records the start of step `i`: the noise kept for frozen-prefix rows (first step), then
    /// the input projection of `x_t`.
    pub(crate) fn record_in(&self, cs: Stream, i: usize) -> Result<()> {
        if i == 0 {
            if let Some(p) = &self.inpaint {
                let bytes = self.chunk_n * 4;
                Buffer::copy(
                    self.x.buffer(),
                    p.x1.offset() * 4,
                    self.x.buffer(),
                    0,
                    bytes,
                    cs,
                )?;
            }
        }
        Ok(self
            .sg_in
            .run(cs, &self.x, &self.win, &self.embedded, Some(&self.bin))?)
    }

    /// Records the end of step `i`: the velocity from the expert's output, and the update
    /// (into the output chunk too after the last step).
    pub(crate) fn record_out(&self, k: &Kernels, cs: Stream, i: usize) -> Result<()> {
        let last = i + 1 == self.steps;
        let out = match (&self.inpaint, &self.x_scratch) {
            // The time the update reaches (exactly 0 after the last step).
            (Some(p), Some(scratch)) => EulerOut::Inpaint {
                x1: &p.x1,
                frozen: &p.frozen,
                frozen_rows: &p.rows,
                t_next: 1.0 - (i + 1) as f32 / self.steps as f32,
                cast: if last { &self.out } else { scratch },
            },
            _ if last => EulerOut::Cast(&self.out),
            _ => EulerOut::InPlace,
        };
        Ok(self.out_euler.run(
            k,
            cs,
            &self.expert_out,
            &self.wout,
            &self.bout,
            &self.v32,
            &self.x,
            self.dt_step,
            out,
        )?)
    }
}
