//! The step graph's model: one Euler step of flow matching (openpi `pi0.py`
//! `sample_actions`'s `step`, `pi05=True`) — the action expert (Gemma 300M,
//! `gemma_expert` names) over `[prefix cache ; its own tokens]`, its norms adaptive: scale,
//! shift and gate from the step's time, computed once when the model is built.
//!
//! The noisy actions, the input and output projections and the update stay in f32
//! (`flow.rs`); the expert's tokens are rounded to the model's precision once per step, its
//! final normed output widened once.

use super::flow::{Flow, Inpaint, Io, StepKeys, StepVariant, time_embedding, variant_for};
use super::fp8::{FP8_INPUTS, Fp8Stack};
use super::prefix::GemmaLayer;
use super::{GEMMA_EPS, ROPE_WAVELENGTH};
use crate::calibration::Calibration;
use crate::error::Result;
use crate::weights::{EXPERT, Pi05Weights};
use frt_exec::Stream;
use frt_kernels::{
    AttentionMask, AttentionPlan, DType, Fp8GegluLinear, Fp8Linear, Fp8SplitLinear, GegluLinear,
    Gemm, Kernels, RopeTable, SplitLinear, Tensor,
};
use frt_nn::blocks::gemma::GemmaProjections;

/// What a calibration run does at each FP8 GEMM input: is given the activation (see
/// [`Expert::record_calibrating`]).
pub(crate) type Probe<'a> = &'a mut dyn FnMut(&str, &Tensor) -> Result<()>;

/// The expert's GEMMs in FP8: the stack and the GEMM plans (q/k/v, gate+up with the GEGLU, and
/// the two whose product the residual adds: attention out, down).
/// Where its reduction splits (see [`split_parts`]), the down projection runs as a split GEMM
/// whose parts' f32 sums the residual's norm adds, and so does the attention output where the
/// split runs on Hopper's `wgmma` (on an H100, `frt-kernels-bench --only fp8`: the down
/// projection 4.7 µs in 8 parts with `wgmma`, 7.5 with `mma.sync`, against 10.5 whole; the
/// attention output 3.7 µs in 4 parts with `wgmma` against 6.6 whole, and 6.1 in 4 parts
/// with `mma.sync`, where it stays whole). The q/k/v projection splits too where that runs on
/// `wgmma` (in 2 parts of 512: 80 blocks where whole it has 40), and RoPE adds its parts
/// (`Kernels::rope_qkv_table_parts`). The gate+up projection and the GEGLU run as one op
/// (`Kernels::linear_geglu_e4m3`: on CUDA where Hopper's `wgmma` runs it; always on the host,
/// the same bits as the two), the gate+up rows then never written; elsewhere, or with
/// `KernelOptions::fp8_fused_geglu` off, they run apart (`Fp8Mlp::Apart`).
struct ExpertFp8 {
    stack: Fp8Stack,
    qkv: Fp8Proj,
    mlp: Fp8Mlp,
    o: Fp8Proj,
    down: Fp8Proj,
}

/// The FP8 MLP input: the gate+up GEMM and the GEGLU in one op, else the GEMM into its 16-bit
/// product (the tensor; cuBLASLt's scalar-scale GEMM, `Kernels::linear_e4m3_deferred`), then
/// the GEGLU applying the weight's feature scales; either writes the down projection's codes.
enum Fp8Mlp {
    Fused(Fp8GegluLinear),
    Apart(Fp8Linear, Tensor),
}

/// An FP8 projection: split (its parts' f32 sums in the tensor, which what reads it adds: the
/// residual's norm, or RoPE), else whole into its output.
enum Fp8Proj {
    Split(Fp8SplitLinear, Tensor),
    Whole(Fp8Linear),
}

impl ExpertFp8 {
    /// Runs layer `i`'s projection of input `g` (codes already made) as planned in `r`, whole
    /// into `out`; returns what its reader reads: the parts, or `out`.
    fn project(
        &self,
        cs: Stream,
        (i, g): (usize, usize),
        r: &Fp8Proj,
        rows: usize,
        out: &Tensor,
    ) -> Result<Tensor> {
        Ok(match r {
            Fp8Proj::Split(split, partials) => {
                self.stack
                    .linear_quantized_split(cs, (i, g), split, rows, partials)?;
                partials.clone()
            }
            Fp8Proj::Whole(lin) => {
                self.stack.linear_quantized(cs, (i, g), lin, rows, out)?;
                out.clone()
            }
        })
    }
}

/// The expert's 16-bit GEMMs: q/k/v, attention out, gate+up with the GEGLU, down. The two whose
/// product is added to the residual split their reduction and leave the parts' f32 sums in
/// `partials` (the residual's norm adds them).
struct Sixteen {
    qkv: Gemm,
    o: SplitLinear,
    gate_up: GegluLinear,
    down: SplitLinear,
    partials: Tensor,
}

/// Parts of at least this many reduction elements each (see [`split_parts`]).
const SPLIT_MIN_PART: usize = 512;

/// How many parts a reduction of `k` elements is split into for a 50-row GEMM: the most of 8,
/// 4 or 2 that divide it into parts of at least [`SPLIT_MIN_PART`], else 1. On an H100
/// (`frt-kernels-bench --only splitk`) the expert's attention output (k = 2048) was fastest in 4
/// or 8 parts, its down projection (k = 4096) in 8.
fn split_parts(k: usize) -> usize {
    [8, 4, 2]
        .into_iter()
        .find(|p| k % p == 0 && k / p >= SPLIT_MIN_PART)
        .unwrap_or(1)
}

/// The action expert, planned (see the module docs).
pub(crate) struct Expert {
    el: Vec<GemmaLayer>,
    s_len: usize,
    hd: usize,
    ew: usize,
    n_mods: usize,
    dt: DType,
    /// Per step, per norm (two a layer, then the final one): `[scale; shift; gate]`.
    mods: Tensor,
    narrow: bool,
    flow: Flow,
    /// The RoPE angles of the steps' tokens (at `io.suffix_pos`), computed by step 0.
    rope: RopeTable,
    a32: Tensor,
    a: Tensor,
    aln: Tensor,
    aln32: Tensor,
    sq: Tensor,
    sqkv: Tensor,
    sattn: Tensor,
    so: Tensor,
    sh: Tensor,
    /// The 16-bit GEMMs, when the layers hold 16-bit weights.
    sixteen: Option<Sixteen>,
    /// Per number of encoded views: its prefix rows and a layer's attention plans.
    variants: Vec<StepVariant<AttentionPlan>>,
    /// The FP8 GEMMs, when built with a calibration.
    fp8: Option<ExpertFp8>,
}

impl Expert {
    /// Uploads the expert's own weights (its layers `el` are loaded, sharing the language
    /// model's caches), computes every step's norm conditions, and plans a step's ops; with
    /// `fp8`, also its projections quantized per output feature, and the FP8 GEMMs with that
    /// calibration's scales.
    pub(crate) fn build(
        k: &Kernels,
        s: Stream,
        w: &Pi05Weights,
        dt: DType,
        el: Vec<GemmaLayer>,
        io: Io,
        fp8: Option<&Calibration>,
    ) -> Result<Expert> {
        let ctx = k.ctx();
        let c = &w.config;
        let (lg, eg) = (&c.llm, &c.expert);
        let s_len = c.action_horizon;
        let (hd, heads, kvh) = (lg.head_dim, lg.heads, lg.kv_heads);
        let t_as =
            |name: &str, dt: DType| -> Result<Tensor> { Ok(w.get(name)?.upload(ctx, s, dt)?) };
        let model_dt = |name: &str| t_as(name, dt);
        // ---- per-step adaptive-norm conditions (depend only on the step's time)
        let ew = eg.width;
        let n_mods = 2 * eg.depth + 1;
        let mods = Tensor::alloc(ctx, "expert.modulations", dt, &[c.steps, n_mods, 3 * ew])?;
        {
            // The time values, their sine-cosine embedding and the time MLP in f32 whatever the
            // model's precision (openpi keeps the time and the conditioning in f32: the
            // embedding's shortest period is 4 ms, so a time rounded to bf16 — 0.9 becoming
            // 0.8984375 — is a phase error); the condition is rounded to the model's precision
            // for the modulation projections, as openpi's `Dense(dtype=x.dtype)` does.
            let f = DType::F32;
            let temb = time_embedding(k, s, c.steps, ew)?;
            let h = Tensor::alloc(ctx, "time_h", f, &[c.steps, ew])?;
            let (wi, bi, wo, bo) = (
                t_as("time_mlp_in.weight", f)?,
                t_as("time_mlp_in.bias", f)?,
                t_as("time_mlp_out.weight", f)?,
                t_as("time_mlp_out.bias", f)?,
            );
            k.linear(&temb, &wi, &h, true, false)?
                .run(s, &temb, &wi, &h, Some(&bi))?;
            k.silu(s, &h, &h)?;
            k.linear(&h, &wo, &temb, true, false)?
                .run(s, &h, &wo, &temb, Some(&bo))?;
            k.silu(s, &temb, &temb)?;
            let cond = if dt == f {
                temb
            } else {
                let cond = Tensor::alloc(ctx, "time_cond", dt, &[c.steps, ew])?;
                k.cast(s, &temb, &cond)?;
                cond
            };
            let temb = cond;
            let mut dense: Vec<String> = Vec::new();
            for i in 0..eg.depth {
                dense.push(format!("{EXPERT}.layers.{i}.input_layernorm.dense"));
                dense.push(format!(
                    "{EXPERT}.layers.{i}.post_attention_layernorm.dense"
                ));
            }
            dense.push(format!("{EXPERT}.norm.dense"));
            for (j, name) in dense.iter().enumerate() {
                let (wd, bd) = (
                    model_dt(&format!("{name}.weight"))?,
                    model_dt(&format!("{name}.bias"))?,
                );
                let dst = Tensor::with_layout(
                    mods.buffer(),
                    dt,
                    &[c.steps, 3 * ew],
                    &[n_mods * 3 * ew, 1],
                    j * 3 * ew,
                )?;
                k.linear(&temb, &wd, &dst, true, false)?
                    .run(s, &temb, &wd, &dst, Some(&bd))?;
            }
            ctx.sync_stream(s)?;
        }
        // ---- one denoising step
        // The noisy actions, the action input projection, the output projection and the Euler
        // update stay in f32 (as openpi computes them: f32 parameters promote the product);
        // only the tokens the expert sees are rounded to the model's precision, and only the
        // expert's final normed output is widened back for the output projection.
        let f = DType::F32;
        let narrow = dt != f;
        let a32 = Tensor::alloc(ctx, "step.tokens.f32", f, &[s_len, ew])?;
        let a = if narrow {
            Tensor::alloc(ctx, "step.tokens", dt, &[s_len, ew])?
        } else {
            a32.clone()
        };
        let aln = Tensor::alloc(ctx, "step.ln", dt, &[s_len, ew])?;
        let aln32 = if narrow {
            Tensor::alloc(ctx, "step.ln.f32", f, &[s_len, ew])?
        } else {
            aln.clone()
        };
        let sq = Tensor::alloc(ctx, "step.q", dt, &[s_len, heads * hd])?;
        let sqkv = Tensor::alloc(ctx, "step.qkv", dt, &[s_len, (heads + 2 * kvh) * hd])?;
        let sattn = Tensor::alloc(ctx, "step.attn", dt, &[s_len, heads * hd])?;
        let so = Tensor::alloc(ctx, "step.o", dt, &[s_len, ew])?;
        let sh = Tensor::alloc(ctx, "step.mlp", dt, &[s_len, eg.mlp])?;
        let sixteen = match &el[0].proj {
            Some(w) => {
                let (o_parts, down_parts) = (split_parts(heads * hd), split_parts(eg.mlp));
                let partials = Tensor::alloc(
                    ctx,
                    "step.partials",
                    f,
                    &[o_parts.max(down_parts), s_len, ew],
                )?;
                let parts = |n: usize| partials.narrow(0, 0, n);
                Some(Sixteen {
                    qkv: k.linear(&aln, &w.qkv, &sqkv, false, false)?,
                    o: k.linear_split(&sattn, &w.o, &parts(o_parts)?)?,
                    // The MLP's gate and up projections with the gate applied.
                    gate_up: k.geglu_linear(&aln, &w.gate_up, &sh)?,
                    down: k.linear_split(&sh, &w.down, &parts(down_parts)?)?,
                    partials,
                })
            }
            None => None,
        };
        let flow = Flow::build(k, s, w, &io, &a32, &aln32)?;
        let fp8 = match fp8 {
            Some(cal) => {
                let dims = eg.dims();
                let stack =
                    Fp8Stack::load(k, s, w, ("expert", EXPERT), &dims, eg.depth, 4, s_len, cal)?;
                let mlp = match stack.plan_geglu(k, s_len, dt)? {
                    Some(fused) => Fp8Mlp::Fused(fused),
                    None => {
                        let gate_up =
                            Tensor::alloc(ctx, "step.fp8.gate_up", dt, &[s_len, 2 * eg.mlp])?;
                        Fp8Mlp::Apart(stack.plan_deferred(k, 2, s_len, &gate_up)?, gate_up)
                    }
                };
                let o_parts = split_parts(eg.heads * eg.head_dim);
                let down_parts = split_parts(eg.mlp);
                let partials = Tensor::alloc(
                    ctx,
                    "step.fp8.partials",
                    f,
                    &[o_parts.max(down_parts), s_len, ew],
                )?;
                let qkv_parts = split_parts(ew);
                let qkv_partials = Tensor::alloc(
                    ctx,
                    "step.fp8.qkv_partials",
                    f,
                    &[qkv_parts, s_len, sqkv.dim(1)],
                )?;
                // Input g split into `parts` (into `p`) where that runs on wgmma or
                // `wgmma_only` is off, else whole into `whole`.
                let project =
                    |g: usize, (parts, p): (usize, &Tensor), whole: &Tensor, wgmma_only: bool| {
                        if parts > 1 {
                            let p = p.narrow(0, 0, parts)?;
                            let split = stack.plan_split(k, g, s_len, &p)?;
                            if !wgmma_only || split.on_wgmma() {
                                return Ok::<_, crate::Error>(Fp8Proj::Split(split, p));
                            }
                        }
                        Ok(Fp8Proj::Whole(stack.plan(k, g, s_len, whole, false)?))
                    };
                Some(ExpertFp8 {
                    qkv: project(0, (qkv_parts, &qkv_partials), &sqkv, true)?,
                    o: project(1, (o_parts, &partials), &so, true)?,
                    down: project(3, (down_parts, &partials), &so, false)?,
                    stack,
                    mlp,
                })
            }
            None => None,
        };
        let mut e = Expert {
            el,
            s_len,
            hd,
            ew,
            n_mods,
            dt,
            mods,
            narrow,
            flow,
            rope: k.rope_table(&io.suffix_pos, hd, ROPE_WAVELENGTH)?,
            a32,
            a,
            aln,
            aln32,
            sq,
            sqkv,
            sattn,
            so,
            sh,
            sixteen,
            variants: Vec::new(),
            fp8,
        };
        e.add_keys(k, &io.keys)?;
        Ok(e)
    }

    /// Plans the step variant that attends to `keys`.
    pub(crate) fn add_keys(&mut self, k: &Kernels, keys: &StepKeys) -> Result<()> {
        let (hd, s_len) = (self.hd, self.s_len);
        let heads_of =
            |t: &Tensor| -> Result<Tensor> { Ok(t.reshape(&[t.dim(0), t.dim(1) / hd, hd])?) };
        let n = keys.prefix_rows + s_len;
        let mut plans: Vec<AttentionPlan> = Vec::new();
        for l in &self.el {
            let plan = k.attention_plan_sharing(
                &heads_of(&self.sq)?,
                &heads_of(&l.k_cache.narrow(0, 0, n)?)?,
                &heads_of(&l.v_cache.narrow(0, 0, n)?)?,
                &heads_of(&self.sattn)?,
                &AttentionMask::keys(&keys.mask),
                1.0 / (hd as f32).sqrt(),
                plans.first(),
            )?;
            plans.push(plan);
        }
        self.variants.push(StepVariant {
            views: keys.views,
            prefix_rows: keys.prefix_rows,
            plans,
        });
        Ok(())
    }

    /// Whether the expert runs its GEMMs in FP8.
    pub(crate) fn is_fp8(&self) -> bool {
        self.fp8.is_some()
    }

    /// Whether the expert holds its 16-bit weights (see `Pi05Options::fp8_keep_16bit`).
    pub(crate) fn has_16bit_weights(&self) -> bool {
        self.sixteen.is_some()
    }

    /// A new calibration for the FP8 GEMMs (a buffer write on `s`: captured graphs keep
    /// running, with the new scales). An error for an expert built without FP8.
    pub(crate) fn set_calibration(&self, s: Stream, cal: &Calibration) -> Result<()> {
        match &self.fp8 {
            Some(f) => f.stack.set_scales(s, cal),
            None => Err(crate::Error::Config {
                reason: "a calibration is for a model built with its FP8 expert".into(),
            }),
        }
    }

    /// The frozen-prefix buffers, when built with them.
    pub(crate) fn inpaint(&self) -> Option<&Inpaint> {
        self.flow.inpaint()
    }

    /// Layer `l`'s 16-bit weights and the 16-bit GEMMs, or the error of an expert that holds
    /// only FP8 weights.
    fn sixteen<'a>(&'a self, l: &'a GemmaLayer) -> Result<(&'a GemmaProjections, &'a Sixteen)> {
        let w = l.w16("action expert")?;
        Ok((
            w,
            self.sixteen
                .as_ref()
                .expect("planned where the weights are"),
        ))
    }

    /// Norm `j`'s `[scale; shift; gate]` at step `step`.
    fn modulation(&self, step: usize, j: usize) -> Result<Tensor> {
        let ew = self.ew;
        Ok(Tensor::with_layout(
            self.mods.buffer(),
            self.dt,
            &[1, 3 * ew],
            &[3 * ew, 1],
            (step * self.n_mods + j) * 3 * ew,
        )?)
    }

    /// Records step `i` of the variant for `views` encoded views on `cs` (FP8 GEMMs when built
    /// with them).
    pub(crate) fn record(&self, k: &Kernels, cs: Stream, i: usize, views: usize) -> Result<()> {
        self.record_with(k, cs, i, views, None)
    }

    /// Runs step `i` with the 16-bit GEMMs (whatever the expert was built with), giving `probe`
    /// each FP8 GEMM input as it is made (by its calibration name). For calibration: run on a
    /// stream outside any capture.
    pub(crate) fn record_calibrating(
        &self,
        k: &Kernels,
        cs: Stream,
        i: usize,
        views: usize,
        probe: Probe,
    ) -> Result<()> {
        self.record_with(k, cs, i, views, Some(probe))
    }

    fn record_with(
        &self,
        k: &Kernels,
        cs: Stream,
        i: usize,
        views: usize,
        mut probe: Option<Probe>,
    ) -> Result<()> {
        let fp8 = if probe.is_some() {
            None
        } else {
            self.fp8.as_ref()
        };
        let mut see = |j: usize, g: usize, t: &Tensor| -> Result<()> {
            match probe.as_mut() {
                Some(p) => p(&format!("expert.layers.{j}.{}", FP8_INPUTS[g]), t),
                None => Ok(()),
            }
        };
        let StepVariant {
            prefix_rows, plans, ..
        } = variant_for(&self.variants, views);
        self.flow.record_in(cs, i)?;
        // The RoPE angles of the steps' tokens, once an inference for every step and layer:
        // their positions are written with the prompt (and the views present), before the
        // prefix that every inference runs ahead of its first step.
        if i == 0 {
            self.rope.compute(k, cs)?;
        }
        // Each residual is fused with the norm that follows it (the next layer's input norm,
        // or the final norm); the first norm also rounds the f32 tokens into the residual
        // stream, the final one also widens its output for the f32 output projection.
        // With FP8 GEMMs, the norms in front of q/k/v and gate+up also write their output
        // quantized (the GEMMs then read those codes: no quantize launch of their own).
        let s_len = self.s_len;
        let codes = |j: usize, g: usize| -> Result<Option<(Tensor, Tensor)>> {
            fp8.map(|f| f.stack.codes_for(j, g, s_len)).transpose()
        };
        let m0 = self.modulation(i, 0)?;
        let x32 = self.narrow.then_some(&self.a32);
        let mut gate = match codes(0, 0)? {
            Some((c, sc)) => {
                k.ada_rms_norm_e4m3(cs, x32, &self.a, &m0, &self.aln, GEMMA_EPS, (&c, &sc))?
            }
            None if self.narrow => {
                k.ada_rms_norm_from(cs, &self.a32, &self.a, &m0, &self.aln, GEMMA_EPS)?
            }
            None => k.ada_rms_norm(cs, &self.a, &m0, &self.aln, GEMMA_EPS)?,
        };
        let depth = self.el.len();
        // The gated residual and the norm after it, writing the codes of the next FP8 GEMM
        // input when given.
        // `so` is the GEMM's product: the 16-bit GEMMs' partial sums, or the FP8 GEMMs' output.
        let residual_norm = |so: &Tensor,
                             gate: &Tensor,
                             m: &Tensor,
                             codes: Option<(Tensor, Tensor)>|
         -> Result<Tensor> {
            let (a, aln) = (&self.a, &self.aln);
            Ok(match codes {
                Some((c, sc)) => {
                    k.residual_ada_rms_norm_e4m3(cs, a, so, gate, m, aln, GEMMA_EPS, (&c, &sc))?
                }
                None => k.residual_ada_rms_norm(cs, a, so, gate, m, aln, GEMMA_EPS)?,
            })
        };
        for (j, (l, plan)) in self.el.iter().zip(plans).enumerate() {
            see(j, 0, &self.aln)?;
            // The cache rows this layer writes its keys and values into (behind the prefix's).
            let kc = l.k_cache.narrow(0, *prefix_rows, self.s_len)?;
            let vc = l.v_cache.narrow(0, *prefix_rows, self.s_len)?;
            match fp8 {
                Some(f) => {
                    let qkv = f.project(cs, (j, 0), &f.qkv, s_len, &self.sqkv)?;
                    if matches!(f.qkv, Fp8Proj::Split(..)) {
                        k.rope_qkv_table_parts(cs, &qkv, &self.rope, &self.sq, &kc, &vc)?;
                    } else {
                        k.rope_qkv_table(cs, &qkv, &self.rope, &self.sq, &kc, &vc)?;
                    }
                }
                None => {
                    let (w, sg) = self.sixteen(l)?;
                    sg.qkv.run(cs, &self.aln, &w.qkv, &self.sqkv, None)?;
                    k.rope_qkv_table(cs, &self.sqkv, &self.rope, &self.sq, &kc, &vc)?;
                }
            }
            // With FP8 GEMMs the attention also writes its output's codes (the kernel that
            // merges the key splits does: no quantize launch of its own).
            match codes(j, 1)? {
                Some((c, sc)) => plan.run_quantized(k, cs, &c, &sc)?,
                None => plan.run(k, cs)?,
            }
            see(j, 1, &self.sattn)?;
            let so = match fp8 {
                Some(f) => f.project(cs, (j, 1), &f.o, s_len, &self.so)?,
                None => {
                    let (w, sg) = self.sixteen(l)?;
                    let parts = sg.partials.narrow(0, 0, sg.o.parts())?;
                    sg.o.run(cs, &self.sattn, &w.o, &parts)?;
                    parts
                }
            };
            gate = residual_norm(&so, &gate, &self.modulation(i, 2 * j + 1)?, codes(j, 2)?)?;
            see(j, 2, &self.aln)?;
            match fp8 {
                Some(f) => match &f.mlp {
                    Fp8Mlp::Fused(lin) => f.stack.linear_geglu(cs, j, lin, s_len)?,
                    Fp8Mlp::Apart(lin, gu) => {
                        f.stack.linear_quantized(cs, (j, 2), lin, s_len, gu)?;
                        // The GEGLU applies the weight's feature scales (the GEMM left them
                        // out) and writes the down projection's codes too.
                        f.stack.geglu(k, cs, (j, s_len), gu)?;
                    }
                },
                None => {
                    let (w, sg) = self.sixteen(l)?;
                    sg.gate_up.run(k, cs, &self.aln, &w.gate_up, &self.sh)?
                }
            }
            see(j, 3, &self.sh)?;
            let so = match fp8 {
                Some(f) => f.project(cs, (j, 3), &f.down, s_len, &self.so)?,
                None => {
                    let (w, sg) = self.sixteen(l)?;
                    let parts = sg.partials.narrow(0, 0, sg.down.parts())?;
                    sg.down.run(cs, &self.sh, &w.down, &parts)?;
                    parts
                }
            };
            // modulation 2·depth is the final norm's
            let m = self.modulation(i, 2 * j + 2)?;
            gate = if self.narrow && j + 1 == depth {
                k.residual_ada_rms_norm_widened(
                    cs,
                    &self.a,
                    &so,
                    &gate,
                    &m,
                    &self.aln,
                    &self.aln32,
                    GEMMA_EPS,
                )?
            } else {
                // The next layer's input norm (writing its q/k/v codes), or the final one.
                let next = if j + 1 < depth {
                    codes(j + 1, 0)?
                } else {
                    None
                };
                residual_norm(&so, &gate, &m, next)?
            };
        }
        self.flow.record_out(k, cs, i)
    }
}
