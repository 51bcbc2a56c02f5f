//! The prefix graph's model: the prompt embedded (×√width) behind the image rows, then the
//! language model (openpi `gemma.py` `Module` over the prefix, PaliGemma's Gemma 2B) filling
//! each layer's key/value cache; the last layer's attention, output projection and MLP, whose
//! outputs nothing reads, are skipped (a calibration runs its attention still). Captured
//! per number of present views (their image rows packed first) and for the prompt capacity
//! (fixed mode) or per prompt length (exact mode).

use super::expert::Probe;
use super::fp8::{FP8_INPUTS, Fp8Stack};
use super::{GEMMA_EPS, ROPE_WAVELENGTH};
use crate::error::Result;
use frt_exec::{Graph, ShapeKey, Stream};
use frt_kernels::{AttentionMask, AttentionPlan, Fp8Linear, Gemm, Kernels, Tensor};
use frt_nn::blocks::gemma::GemmaProjections;

/// One prefix variant's plans: the row views, the GEMMs (16-bit, and FP8 when built with it)
/// and each layer's attention.
struct PrefixPlan {
    rows: usize,
    /// The buffers' first `rows` rows: x, ln, q, qkv, attn, gate_up, mlp.
    views: [Tensor; 7],
    image_rows: usize,
    prompt_rows: usize,
    /// The 16-bit GEMMs, when the layers hold 16-bit weights.
    gemms: Option<[Gemm; 4]>,
    fp8: Option<[Fp8Linear; 4]>,
    attention: Vec<AttentionPlan>,
}

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

impl GemmaLayer {
    /// The layer's 16-bit projections, or, for a stack that holds only its FP8 weights, an
    /// error naming `part` and what would load them.
    pub(crate) fn w16(&self, part: &str) -> Result<&GemmaProjections> {
        self.proj.as_ref().ok_or_else(|| crate::Error::Config {
            reason: format!(
                "the {part}'s 16-bit weights were not loaded (an FP8 model built without \
                 Pi05Options::fp8_keep_16bit): its 16-bit path, which recording a calibration \
                 runs, needs them"
            ),
        })
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
    /// The FP8 GEMMs, when built with them.
    pub(crate) fp8: Option<Fp8Stack>,
}

impl PrefixParts {
    /// Captures the prefix for `image_rows` image rows (the present views' tokens) and
    /// `prompt_rows` prompt rows behind them as variant `key` of `graph`: the prompt embedded
    /// (×√width) behind the images, then the language model over those rows, filling each
    /// layer's cache rows (FP8 GEMMs when built with them).
    pub(crate) fn capture(
        &self,
        k: &Kernels,
        graph: &Graph,
        key: ShapeKey,
        image_rows: usize,
        prompt_rows: usize,
    ) -> Result<()> {
        let p = self.plan(k, image_rows, prompt_rows)?;
        graph.capture(key, |cs| self.record(k, cs, &p, None))?;
        Ok(())
    }

    /// Runs the prefix for those rows on `s`, outside any graph, with the 16-bit GEMMs, giving
    /// `probe` each FP8 GEMM input as it is made (calibration).
    pub(crate) fn run_calibrating(
        &self,
        k: &Kernels,
        s: Stream,
        image_rows: usize,
        prompt_rows: usize,
        probe: Probe,
    ) -> Result<()> {
        let p = self.plan(k, image_rows, prompt_rows)?;
        self.record(k, s, &p, Some(probe))
    }

    fn first(&self, t: &Tensor, rows: usize) -> Result<Tensor> {
        Ok(t.narrow(0, 0, rows)?)
    }

    fn plan(&self, k: &Kernels, image_rows: usize, prompt_rows: usize) -> Result<PrefixPlan> {
        let rows = image_rows + prompt_rows;
        let (hd, heads, kvh) = (self.head_dim, self.heads, self.kv_heads);
        let first = |t: &Tensor| self.first(t, rows);
        let heads_of = |t: &Tensor, n: usize| -> Result<Tensor> { Ok(t.reshape(&[rows, n, hd])?) };
        let views = [
            &self.x,
            &self.ln,
            &self.q,
            &self.qkv,
            &self.attn,
            &self.gate_up,
            &self.mlp,
        ]
        .map(first)
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
        let [x, ln, q, qkv, attn, gu, h]: [Tensor; 7] = views.try_into().expect("seven views");
        let mask = first(&self.mask)?;
        let gemms = match &self.layers[0].proj {
            Some(w) => Some([
                k.linear(&ln, &w.qkv, &qkv, false, false)?,
                k.linear(&attn, &w.o, &x, false, true)?,
                k.linear(&ln, &w.gate_up, &gu, false, false)?,
                k.linear(&h, &w.down, &x, false, true)?,
            ]),
            None => None,
        };
        let fp8 = match &self.fp8 {
            Some(f) => Some([
                f.plan(k, 0, rows, &qkv, false)?,
                f.plan(k, 1, rows, &x, true)?,
                // Faster at the prefix's rows than the per-feature forms (the GEGLU applies
                // the feature scales).
                f.plan_deferred(k, 2, rows, &gu)?,
                f.plan(k, 3, rows, &x, true)?,
            ]),
            None => None,
        };
        let mut attention: Vec<AttentionPlan> = Vec::new();
        for l in &self.layers {
            let (kc, vc) = (first(&l.k_cache)?, first(&l.v_cache)?);
            let plan = k.attention_plan_sharing(
                &heads_of(&q, heads)?,
                &heads_of(&kc, kvh)?,
                &heads_of(&vc, kvh)?,
                &heads_of(&attn, heads)?,
                &AttentionMask::keys(&mask),
                1.0 / (hd as f32).sqrt(),
                attention.first(),
            )?;
            attention.push(plan);
        }
        Ok(PrefixPlan {
            rows,
            views: [x, ln, q, qkv, attn, gu, h],
            image_rows,
            prompt_rows,
            gemms,
            fp8,
            attention,
        })
    }

    /// Records (or, outside a capture, runs) the prefix of plan `p` on `cs`; with `probe`,
    /// the 16-bit GEMMs and each FP8 GEMM input given to it.
    fn record(
        &self,
        k: &Kernels,
        cs: Stream,
        p: &PrefixPlan,
        mut probe: Option<Probe>,
    ) -> Result<()> {
        let rows = p.rows;
        let first = |t: &Tensor| self.first(t, rows);
        let [x, ln, q, qkv, attn, gu, h] = &p.views;
        let pos = first(&self.pos)?;
        let tokens = self.tokens.narrow(0, 0, p.prompt_rows)?;
        let prompt = self.x.narrow(0, p.image_rows, p.prompt_rows)?;
        let fp8 = match (&self.fp8, &p.fp8, probe.is_some()) {
            (Some(f), Some(lin), false) => Some((f, lin)),
            _ => None,
        };
        // GEMM `g` of layer `i`: `out (+)= x · w` in the precision the model runs (in FP8, the
        // q/k/v and gate+up inputs were quantized by the norm that made them, the down
        // projection's by the GEGLU).
        let gemm = |i: usize, g: usize, x: &Tensor, out: &Tensor| -> Result<()> {
            match fp8 {
                Some((f, lin)) if g != 1 => f.linear_quantized(cs, (i, g), &lin[g], rows, out),
                Some((f, lin)) => f.linear(k, cs, (i, g), &lin[g], x, out),
                None => {
                    let w = self.layers[i].w16("language model")?;
                    let gemms = p.gemms.as_ref().expect("planned where the weights are");
                    let w = [&w.qkv, &w.o, &w.gate_up, &w.down][g];
                    Ok(gemms[g].run(cs, x, w, out, None)?)
                }
            }
        };
        let probing = probe.is_some();
        let mut see = |i: usize, g: usize, t: &Tensor| -> Result<()> {
            match probe.as_mut() {
                Some(f) => f(&format!("prefix.layers.{i}.{}", FP8_INPUTS[g]), t),
                None => Ok(()),
            }
        };
        k.embedding(
            cs,
            &tokens,
            &self.embed,
            &prompt,
            (self.width as f32).sqrt(),
        )?;
        // Gemma's norm, writing the codes of GEMM input `g` too in FP8.
        let norm = |i: usize, g: usize, w: &Tensor| -> Result<()> {
            match fp8 {
                Some((f, _)) => {
                    let (c, sc) = f.codes_for(i, g, rows)?;
                    k.rms_norm_e4m3(cs, x, w, ln, GEMMA_EPS, (&c, &sc))?
                }
                None => k.rms_norm(cs, x, w, ln, GEMMA_EPS)?,
            }
            Ok(())
        };
        let hd = self.head_dim;
        for (i, (l, plan)) in self.layers.iter().zip(&p.attention).enumerate() {
            let (kc, vc) = (first(&l.k_cache)?, first(&l.v_cache)?);
            let ln1 = l.ln1.as_ref().expect("language model norms");
            norm(i, 0, ln1)?;
            see(i, 0, ln)?;
            gemm(i, 0, ln, qkv)?;
            k.rope_qkv(cs, qkv, &pos, q, &kc, &vc, hd, ROPE_WAVELENGTH)?;
            // The last layer's keys and values are all the steps read of it: its attention
            // and output projection only feed the prefix output, which nothing reads. A
            // calibration still records its attention output, so that calibration files name
            // every range they did.
            if i + 1 == self.layers.len() && !probing {
                break;
            }
            plan.run(k, cs)?;
            see(i, 1, attn)?;
            gemm(i, 1, attn, x)?;
            if i + 1 == self.layers.len() {
                break; // the last MLP only feeds the prefix output too
            }
            let ln2 = l.ln2.as_ref().expect("language model norms");
            norm(i, 2, ln2)?;
            see(i, 2, ln)?;
            gemm(i, 2, ln, gu)?;
            let mw = self.mlp_width;
            let (gate, up) = (gu.narrow(1, 0, mw)?, gu.narrow(1, mw, mw)?);
            match fp8 {
                // The gate+up GEMM left the weight's feature scales to the GEGLU.
                Some((f, _)) => f.geglu(k, cs, (i, rows), gu, h)?,
                None => k.geglu(cs, &gate, &up, h)?,
            }
            see(i, 3, h)?;
            gemm(i, 3, h, x)?;
        }
        Ok(())
    }
}
