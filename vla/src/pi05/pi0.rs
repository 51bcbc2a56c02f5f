//! The step graph's model for Pi0 (openpi `pi0.py` with `pi05=False`; `PI0Pytorch`'s
//! `embed_suffix` and `denoise_step`): the suffix is one state token (`state_proj` of the
//! continuous, normalized state) in front of the action tokens, each the embedded noisy
//! action mixed with the step's time by an MLP (`action_time_mlp_in` over `[action; time]`,
//! swish, `action_time_mlp_out`). The action expert — plain RMSNorm, no adaptive norms — runs
//! over `[prefix cache ; suffix]` with openpi's block-causal mask: the state token sees the
//! valid prefix and itself, the action tokens see the valid prefix and the whole suffix. The
//! velocity comes from the action rows.
//!
//! `action_time_mlp_in`'s time half applied to a step's time embedding is the same for every
//! action token of that step: it is computed once, when the model is built, as the step's
//! bias, so a step multiplies only the action half. The state token sees only the prefix and
//! itself, so its keys and values are the same in every step of an inference: the first step
//! computes them (the whole suffix), the later steps run the action rows alone and read the
//! state's keys and values from the cache. The state token, the time MLP and the
//! projections run in f32 (as openpi's f32 parameters compute them); the suffix is rounded to
//! the model's precision once per step, the final normed action rows widened once.

use super::flow::{Flow, Inpaint, Io, StepKeys, StepVariant, time_embedding, variant_for};
use super::prefix::GemmaLayer;
use super::{GEMMA_EPS, ROPE_WAVELENGTH};
use crate::error::{Error, Result};
use crate::weights::{EXPERT, Pi05Weights};
use frt_exec::Stream;
use frt_kernels::{AttentionMask, AttentionPlan, DType, GegluLinear, Gemm, Kernels, Tensor};

/// The Pi0 action expert, planned (see the module docs).
pub(crate) struct Expert {
    el: Vec<GemmaLayer>,
    final_norm: Tensor,
    /// The action rows (the suffix has one more: the state token).
    horizon: usize,
    ew: usize,
    hd: usize,
    narrow: bool,
    flow: Flow,
    suffix_pos: Tensor,
    /// The normalized state, padded with zeros to `[1, action_dim]` (f32, written with the
    /// inputs).
    state: Tensor,
    w_state: Tensor,
    b_state: Tensor,
    /// `action_time_mlp_in`'s action half `[width, width]`, and per step its time half applied
    /// to the step's time plus its bias: `[steps, width]` (all f32).
    w_action: Tensor,
    step_bias: Tensor,
    w_mlp_out: Tensor,
    b_mlp_out: Tensor,
    /// The embedded noisy actions and the time MLP's hidden rows (`[horizon, width]`, f32).
    embedded: Tensor,
    hidden: Tensor,
    /// The suffix `[1 + horizon, width]` in f32, and the residual stream in the model's
    /// precision (the same tensor in f32).
    t32: Tensor,
    a: Tensor,
    aln: Tensor,
    /// The final normed action rows in f32 (a view of `aln` in f32).
    aln32: Tensor,
    sq: Tensor,
    sqkv: Tensor,
    sattn: Tensor,
    sh: Tensor,
    sg_state: Gemm,
    sg_action: Gemm,
    sg_mlp_out: Gemm,
    sg_qkv: Gemm,
    sg_o: Gemm,
    sg_gu: GegluLinear,
    sg_down: Gemm,
    /// The same layer ops for the action rows alone (the steps after the first).
    ag_qkv: Gemm,
    ag_o: Gemm,
    ag_gu: GegluLinear,
    ag_down: Gemm,
    /// Per number of encoded views: its prefix rows, and per layer the state token's attention
    /// (keys up to and including its own row) and the action tokens' (every key).
    variants: Vec<StepVariant<(AttentionPlan, AttentionPlan)>>,
}

impl Expert {
    /// Uploads the expert's own weights (its layers `el` are loaded, sharing the language
    /// model's caches), computes every step's time bias, and plans a step's ops.
    pub(crate) fn build(
        k: &Kernels,
        s: Stream,
        w: &Pi05Weights,
        dt: DType,
        el: Vec<GemmaLayer>,
        io: Io,
    ) -> Result<Expert> {
        let ctx = k.ctx();
        let c = &w.config;
        let (lg, eg) = (&c.llm, &c.expert);
        let (horizon, s_len) = (c.action_horizon, c.suffix_len());
        let (hd, heads, kvh) = (lg.head_dim, lg.heads, lg.kv_heads);
        let ew = eg.width;
        let f = DType::F32;
        let narrow = dt != f;
        let t32_of = |name: &str| -> Result<Tensor> { Ok(w.get(name)?.upload(ctx, s, f)?) };
        let final_norm = w
            .root()
            .pp(EXPERT)
            .pp("norm")
            .upload("weight", &[ew], ctx, s, dt)?;

        // ---- action_time_mlp_in split into its action and time halves (columns)
        let w_in = w.get("action_time_mlp_in.weight")?.to_f32()?;
        if w_in.len() != ew * 2 * ew {
            return Err(Error::Config {
                reason: format!(
                    "action_time_mlp_in.weight has {} values, expected {ew}×{}",
                    w_in.len(),
                    2 * ew
                ),
            });
        }
        let (mut wa, mut wt) = (Vec::with_capacity(ew * ew), Vec::with_capacity(ew * ew));
        for row in w_in.chunks_exact(2 * ew) {
            wa.extend_from_slice(&row[..ew]);
            wt.extend_from_slice(&row[ew..]);
        }
        drop(w_in);
        let w_action = Tensor::alloc(ctx, "action_time_mlp_in.action", f, &[ew, ew])?;
        w_action.write_f32(s, &wa)?;
        let step_bias = {
            let w_time = Tensor::alloc(ctx, "action_time_mlp_in.time", f, &[ew, ew])?;
            w_time.write_f32(s, &wt)?;
            let temb = time_embedding(k, s, c.steps, ew)?;
            let bias = Tensor::alloc(ctx, "step.time_bias", f, &[c.steps, ew])?;
            let b_in = t32_of("action_time_mlp_in.bias")?;
            k.linear(&temb, &w_time, &bias, true, false)?.run(
                s,
                &temb,
                &w_time,
                &bias,
                Some(&b_in),
            )?;
            ctx.sync_stream(s)?;
            bias
        };
        let (w_state, b_state, w_mlp_out, b_mlp_out) = (
            t32_of("state_proj.weight")?,
            t32_of("state_proj.bias")?,
            t32_of("action_time_mlp_out.weight")?,
            t32_of("action_time_mlp_out.bias")?,
        );

        // ---- one denoising step
        let state = Tensor::alloc(ctx, "state", f, &[1, c.action_dim])?;
        state.write_f32(s, &vec![0.0; c.action_dim])?;
        let embedded = Tensor::alloc(ctx, "step.action_emb", f, &[horizon, ew])?;
        let hidden = Tensor::alloc(ctx, "step.action_time_h", f, &[horizon, ew])?;
        let t32 = Tensor::alloc(ctx, "step.tokens.f32", f, &[s_len, ew])?;
        let a = if narrow {
            Tensor::alloc(ctx, "step.tokens", dt, &[s_len, ew])?
        } else {
            t32.clone()
        };
        let aln = Tensor::alloc(ctx, "step.ln", dt, &[s_len, ew])?;
        let aln32 = if narrow {
            Tensor::alloc(ctx, "step.ln.f32", f, &[horizon, ew])?
        } else {
            aln.narrow(0, 1, horizon)?
        };
        let sq = Tensor::alloc(ctx, "step.q", dt, &[s_len, heads * hd])?;
        let sqkv = Tensor::alloc(ctx, "step.qkv", dt, &[s_len, (heads + 2 * kvh) * hd])?;
        let sattn = Tensor::alloc(ctx, "step.attn", dt, &[s_len, heads * hd])?;
        let sh = Tensor::alloc(ctx, "step.mlp", dt, &[s_len, eg.mlp])?;
        let flow = Flow::build(k, s, w, &io, &embedded, &aln32)?;
        let sg_state = k.linear(&state, &w_state, &t32.narrow(0, 0, 1)?, true, false)?;
        let sg_action = k.linear(&embedded, &w_action, &hidden, true, false)?;
        let sg_mlp_out = k.linear(
            &hidden,
            &w_mlp_out,
            &t32.narrow(0, 1, horizon)?,
            true,
            false,
        )?;
        let w0 = el[0].w16("action expert")?;
        let sg_qkv = k.linear(&aln, &w0.qkv, &sqkv, false, false)?;
        let sg_o = k.linear(&sattn, &w0.o, &a, false, true)?;
        let sg_gu = k.geglu_linear(&aln, &w0.gate_up, &sh)?;
        let sg_down = k.linear(&sh, &w0.down, &a, false, true)?;
        let rows = |t: &Tensor| t.narrow(0, 1, horizon);
        let ag_qkv = k.linear(&rows(&aln)?, &w0.qkv, &rows(&sqkv)?, false, false)?;
        let ag_o = k.linear(&rows(&sattn)?, &w0.o, &rows(&a)?, false, true)?;
        let ag_gu = k.geglu_linear(&rows(&aln)?, &w0.gate_up, &rows(&sh)?)?;
        let ag_down = k.linear(&rows(&sh)?, &w0.down, &rows(&a)?, false, true)?;
        // Attention: planned per variant of the keys (`add_keys`).
        let mut e = Expert {
            el,
            final_norm,
            horizon,
            ew,
            hd,
            narrow,
            flow,
            suffix_pos: io.suffix_pos,
            state,
            w_state,
            b_state,
            w_action,
            step_bias,
            w_mlp_out,
            b_mlp_out,
            embedded,
            hidden,
            t32,
            a,
            aln,
            aln32,
            sq,
            sqkv,
            sattn,
            sh,
            sg_state,
            sg_action,
            sg_mlp_out,
            sg_qkv,
            sg_o,
            sg_gu,
            sg_down,
            ag_qkv,
            ag_o,
            ag_gu,
            ag_down,
            variants: Vec::new(),
        };
        e.add_keys(k, &io.keys)?;
        Ok(e)
    }

    /// Plans the step variant that attends to `keys`: per layer the state query over the keys
    /// up to its own row and the action queries over every key (block-causal), both behind
    /// the prefix's key mask.
    pub(crate) fn add_keys(&mut self, k: &Kernels, keys: &StepKeys) -> Result<()> {
        let (hd, h) = (self.hd, self.horizon);
        let heads_of =
            |t: &Tensor| -> Result<Tensor> { Ok(t.reshape(&[t.dim(0), t.dim(1) / hd, hd])?) };
        let scale = 1.0 / (hd as f32).sqrt();
        let mut plans: Vec<(AttentionPlan, AttentionPlan)> = Vec::new();
        for l in &self.el {
            let keys_to = |n: usize| -> Result<[Tensor; 3]> {
                Ok([
                    heads_of(&l.k_cache.narrow(0, 0, n)?)?,
                    heads_of(&l.v_cache.narrow(0, 0, n)?)?,
                    keys.mask.narrow(0, 0, n)?,
                ])
            };
            let [kc, vc, mask] = keys_to(keys.prefix_rows + 1)?;
            let state = k.attention_plan_sharing(
                &heads_of(&self.sq.narrow(0, 0, 1)?)?,
                &kc,
                &vc,
                &heads_of(&self.sattn.narrow(0, 0, 1)?)?,
                &AttentionMask::keys(&mask),
                scale,
                plans.first().map(|p| &p.0),
            )?;
            let [kc, vc, mask] = keys_to(keys.prefix_rows + 1 + h)?;
            let actions = k.attention_plan_sharing(
                &heads_of(&self.sq.narrow(0, 1, h)?)?,
                &kc,
                &vc,
                &heads_of(&self.sattn.narrow(0, 1, h)?)?,
                &AttentionMask::keys(&mask),
                scale,
                plans.first().map(|p| &p.1),
            )?;
            plans.push((state, actions));
        }
        self.variants.push(StepVariant {
            views: keys.views,
            prefix_rows: keys.prefix_rows,
            plans,
        });
        Ok(())
    }

    /// The frozen-prefix buffers, when built with them.
    pub(crate) fn inpaint(&self) -> Option<&Inpaint> {
        self.flow.inpaint()
    }

    /// The state input (`[1, action_dim]`, f32).
    pub(crate) fn state(&self) -> &Tensor {
        &self.state
    }

    /// Records step `i` of the variant for `views` encoded views on `cs`: the whole suffix in
    /// the first step, the action rows alone in the later ones (see the module docs).
    pub(crate) fn record(&self, k: &Kernels, cs: Stream, i: usize, views: usize) -> Result<()> {
        let StepVariant {
            prefix_rows, plans, ..
        } = variant_for(&self.variants, views);
        let h = self.horizon;
        let first = i == 0;
        // The rows this step runs: all of the suffix, or the action rows.
        let (r0, n) = if first { (0, h + 1) } else { (1, h) };
        let rows = |t: &Tensor| t.narrow(0, r0, n);
        self.flow.record_in(cs, i)?;
        // The suffix: the state token (first step), then each action token with the step's
        // time mixed in.
        let bias = Tensor::with_layout(
            self.step_bias.buffer(),
            DType::F32,
            &[self.ew],
            &[1],
            i * self.ew,
        )?;
        self.sg_action.run(
            cs,
            &self.embedded,
            &self.w_action,
            &self.hidden,
            Some(&bias),
        )?;
        k.silu(cs, &self.hidden, &self.hidden)?;
        self.sg_mlp_out.run(
            cs,
            &self.hidden,
            &self.w_mlp_out,
            &self.t32.narrow(0, 1, h)?,
            Some(&self.b_mlp_out),
        )?;
        if first {
            self.sg_state.run(
                cs,
                &self.state,
                &self.w_state,
                &self.t32.narrow(0, 0, 1)?,
                Some(&self.b_state),
            )?;
        }
        let (a, aln, sqkv, sq, sattn, sh) = (
            rows(&self.a)?,
            rows(&self.aln)?,
            rows(&self.sqkv)?,
            rows(&self.sq)?,
            rows(&self.sattn)?,
            rows(&self.sh)?,
        );
        if self.narrow {
            k.cast(cs, &rows(&self.t32)?, &a)?;
        }
        let pos = rows(&self.suffix_pos)?;
        let (qkv_op, o_op, gu_op, down_op) = if first {
            (&self.sg_qkv, &self.sg_o, &self.sg_gu, &self.sg_down)
        } else {
            (&self.ag_qkv, &self.ag_o, &self.ag_gu, &self.ag_down)
        };
        for (l, (sp, ap)) in self.el.iter().zip(plans) {
            let kc = l.k_cache.narrow(0, *prefix_rows + r0, n)?;
            let vc = l.v_cache.narrow(0, *prefix_rows + r0, n)?;
            let ln1 = l.ln1.as_ref().expect("plain expert norms");
            let w = l.w16("action expert")?;
            k.rms_norm(cs, &a, ln1, &aln, GEMMA_EPS)?;
            qkv_op.run(cs, &aln, &w.qkv, &sqkv, None)?;
            k.rope_qkv(cs, &sqkv, &pos, &sq, &kc, &vc, self.hd, ROPE_WAVELENGTH)?;
            if first {
                sp.run(k, cs)?;
            }
            ap.run(k, cs)?;
            o_op.run(cs, &sattn, &w.o, &a, None)?;
            let ln2 = l.ln2.as_ref().expect("plain expert norms");
            k.rms_norm(cs, &a, ln2, &aln, GEMMA_EPS)?;
            gu_op.run(k, cs, &aln, &w.gate_up, &sh)?;
            down_op.run(cs, &sh, &w.down, &a, None)?;
        }
        // The final norm: the action rows (the state row's output is never read).
        let (a_act, aln_act) = (self.a.narrow(0, 1, h)?, self.aln.narrow(0, 1, h)?);
        k.rms_norm(cs, &a_act, &self.final_norm, &aln_act, GEMMA_EPS)?;
        if self.narrow {
            k.cast(cs, &aln_act, &self.aln32)?;
        }
        self.flow.record_out(k, cs, i)
    }
}
