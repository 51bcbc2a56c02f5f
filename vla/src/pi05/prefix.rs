//! The prefix graph's model: the prompt embedded (×√width) behind the image rows, then the
//! language model (openpi `gemma.py` `Module` over the prefix, PaliGemma's Gemma 2B) filling
//! each layer's key/value cache; its last MLP, whose output nothing reads, is skipped. Captured
//! per number of present views (their image rows packed first) and for the prompt capacity
//! (fixed mode) or per prompt length (exact mode).

use super::{GEMMA_EPS, ROPE_WAVELENGTH};
use crate::error::Result;
use frt_exec::{Graph, ShapeKey};
use frt_kernels::{AttentionMask, AttentionPlan, Kernels, Tensor};

/// A Gemma layer with the key/value cache it fills (the language model's layer `i` and the
/// expert's layer `i` share one: the expert writes its rows behind the prefix's).
#[derive(Clone)]
pub(crate) struct GemmaLayer {
    pub(crate) w: frt_nn::blocks::gemma::GemmaLayer,
    pub(crate) k_cache: Tensor,
    pub(crate) v_cache: Tensor,
}

impl std::ops::Deref for GemmaLayer {
    type Target = frt_nn::blocks::gemma::GemmaLayer;
    fn deref(&self) -> &Self::Target {
        &self.w
    }
}

/// What the prefix graph is recorded from: the language model's layers and the prefix
/// buffers (allocated for `max_token_len` prompt rows).
pub(crate) struct PrefixParts {
    pub(crate) layers: Vec<GemmaLayer>,
    pub(crate) embed: Tensor,
    pub(crate) tokens: Tensor,
    pub(crate) x: Tensor,
    pub(crate) ln: Tensor,
    pub(crate) q: Tensor,
    pub(crate) qkv: Tensor,
    pub(crate) attn: Tensor,
    pub(crate) gate_up: Tensor,
    pub(crate) mlp: Tensor,
    pub(crate) pos: Tensor,
    pub(crate) mask: Tensor,
    pub(crate) width: usize,
    pub(crate) mlp_width: usize,
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
}

impl PrefixParts {
    /// Captures the prefix for `image_rows` image rows (the present views' tokens) and
    /// `prompt_rows` prompt rows behind them as variant `key` of `graph`: the prompt embedded
    /// (×√width) behind the images, then the language model over those rows, filling each
    /// layer's cache rows.
    pub(crate) fn capture(
        &self,
        k: &Kernels,
        graph: &Graph,
        key: ShapeKey,
        image_rows: usize,
        prompt_rows: usize,
    ) -> Result<()> {
        let rows = image_rows + prompt_rows;
        let (hd, heads, kvh) = (self.head_dim, self.heads, self.kv_heads);
        let first = |t: &Tensor| -> Result<Tensor> { Ok(t.narrow(0, 0, rows)?) };
        let heads_of = |t: &Tensor, n: usize| -> Result<Tensor> { Ok(t.reshape(&[rows, n, hd])?) };
        let (x, ln, q, qkv, attn, gu, h) = (
            first(&self.x)?,
            first(&self.ln)?,
            first(&self.q)?,
            first(&self.qkv)?,
            first(&self.attn)?,
            first(&self.gate_up)?,
            first(&self.mlp)?,
        );
        let (pos, mask) = (first(&self.pos)?, first(&self.mask)?);
        let tokens = self.tokens.narrow(0, 0, prompt_rows)?;
        let prompt = self.x.narrow(0, image_rows, prompt_rows)?;
        let l0 = &self.layers[0];
        let g_qkv = k.linear(&ln, &l0.qkv, &qkv, false, false)?;
        let g_o = k.linear(&attn, &l0.o, &x, false, true)?;
        let g_gu = k.linear(&ln, &l0.gate_up, &gu, false, false)?;
        let g_down = k.linear(&h, &l0.down, &x, false, true)?;
        let cache = |l: &GemmaLayer| -> Result<(Tensor, Tensor)> {
            Ok((first(&l.k_cache)?, first(&l.v_cache)?))
        };
        let mut plans: Vec<AttentionPlan> = Vec::new();
        for l in &self.layers {
            let (kc, vc) = cache(l)?;
            let plan = k.attention_plan_sharing(
                &heads_of(&q, heads)?,
                &heads_of(&kc, kvh)?,
                &heads_of(&vc, kvh)?,
                &heads_of(&attn, heads)?,
                &AttentionMask::keys(&mask),
                1.0 / (hd as f32).sqrt(),
                plans.first(),
            )?;
            plans.push(plan);
        }
        graph.capture(key, |cs| -> Result<()> {
            {
                k.embedding(
                    cs,
                    &tokens,
                    &self.embed,
                    &prompt,
                    (self.width as f32).sqrt(),
                )?;
                for (i, (l, plan)) in self.layers.iter().zip(&plans).enumerate() {
                    let (kc, vc) = cache(l)?;
                    let ln1 = l.ln1.as_ref().expect("language model norms");
                    k.rms_norm(cs, &x, ln1, &ln, GEMMA_EPS)?;
                    g_qkv.run(cs, &ln, &l.qkv, &qkv, None)?;
                    k.rope_qkv(cs, &qkv, &pos, &q, &kc, &vc, hd, ROPE_WAVELENGTH)?;
                    plan.run(k, cs)?;
                    g_o.run(cs, &attn, &l.o, &x, None)?;
                    if i + 1 == self.layers.len() {
                        break; // the last MLP only feeds the prefix output, which nothing reads
                    }
                    let ln2 = l.ln2.as_ref().expect("language model norms");
                    k.rms_norm(cs, &x, ln2, &ln, GEMMA_EPS)?;
                    g_gu.run(cs, &ln, &l.gate_up, &gu, None)?;
                    let mw = self.mlp_width;
                    k.geglu(cs, &gu.narrow(1, 0, mw)?, &gu.narrow(1, mw, mw)?, &h)?;
                    g_down.run(cs, &h, &l.down, &x, None)?;
                }
                Ok(())
            }
        })?;
        Ok(())
    }
}
