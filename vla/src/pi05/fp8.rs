//! A Gemma stack's GEMMs in FP8 (the language model's in the prefix, the action expert's in
//! the steps): each layer's projections quantized per output feature at load, each GEMM input
//! quantized with a static scale from a calibration. The scales live in one buffer the graphs
//! read, so a new calibration is a buffer write.

use crate::calibration::Calibration;
use crate::error::Result;
use crate::weights::Pi05Weights;
use frt_exec::Stream;
use frt_kernels::{DType, Fp8GegluLinear, Fp8Linear, Fp8SplitLinear, Kernels, Tensor};
use frt_nn::blocks::gemma::{GemmaDims, GemmaFp8};

/// A layer's FP8 GEMM inputs, in the order of its scales: the normed rows into q/k/v, the
/// attention output, the normed rows into gate+up, the MLP's hidden rows.
pub(crate) const FP8_INPUTS: [&str; 4] = ["qkv", "o", "gate_up", "down"];

/// The calibration names of a stack's FP8 GEMM inputs: `{part}.layers.{i}.{input}`, the last
/// layer's first `last_inputs` only (the prefix skips its last MLP).
pub(crate) fn fp8_names(part: &str, depth: usize, last_inputs: usize) -> Vec<String> {
    (0..depth)
        .flat_map(|i| {
            let n = if i + 1 == depth { last_inputs } else { 4 };
            FP8_INPUTS[..n]
                .iter()
                .map(move |g| format!("{part}.layers.{i}.{g}"))
        })
        .collect()
}

/// One stack's FP8 weights, scales and quantized activations (see the module docs).
pub(crate) struct Fp8Stack {
    part: &'static str,
    last_inputs: usize,
    pub(crate) layers: Vec<GemmaFp8>,
    /// Per layer and input (`FP8_INPUTS` order), the activation's scale repeated `per` times:
    /// at least what an FP8 GEMM plan takes (`Fp8Linear::x_scale_elements`, up to one per
    /// row), a multiple of 64 so that each slot starts 256 bytes after the last (cuBLASLt
    /// refuses scale vectors that are not aligned).
    scales: Tensor,
    per: usize,
    /// The quantized normed rows (q/k/v and gate+up inputs), attention output, hidden rows.
    tokens: Tensor,
    attn: Tensor,
    hidden: Tensor,
}

impl Fp8Stack {
    /// Loads the projections of `part`'s layers under `root` (checkpoint names as
    /// [`GemmaFp8::load`]) for up to `rows` rows, with `cal`'s scales.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn load(
        k: &Kernels,
        s: Stream,
        w: &Pi05Weights,
        (part, checkpoint): (&'static str, &str),
        d: &GemmaDims,
        depth: usize,
        last_inputs: usize,
        rows: usize,
        cal: &Calibration,
    ) -> Result<Fp8Stack> {
        let ctx = k.ctx();
        let root = w.root();
        let layers = (0..depth)
            .map(|i| {
                let p = root.pp(checkpoint).pp("layers").pp(i);
                Ok(GemmaFp8::load(&p, d, ctx, s)?)
            })
            .collect::<Result<Vec<_>>>()?;
        let codes = |what: &str, cols: usize| {
            Tensor::alloc(
                ctx,
                &format!("{part}.fp8.{what}"),
                DType::E4M3,
                &[rows, cols],
            )
        };
        let per = rows.next_multiple_of(64);
        let f = Fp8Stack {
            part,
            last_inputs,
            layers,
            scales: Tensor::alloc(
                ctx,
                &format!("{part}.fp8.scales"),
                DType::F32,
                &[depth * FP8_INPUTS.len() * per],
            )?,
            per,
            tokens: codes("tokens", d.width)?,
            attn: codes("attn", d.heads * d.head_dim)?,
            hidden: codes("mlp", d.mlp)?,
        };
        f.set_scales(s, cal)?;
        Ok(f)
    }

    /// Writes a calibration's scales into the scale buffer (every captured graph reads them
    /// there: no recapture); a range missing is an error naming it.
    pub(crate) fn set_scales(&self, s: Stream, cal: &Calibration) -> Result<()> {
        let depth = self.layers.len();
        let mut v = vec![1f32; depth * FP8_INPUTS.len() * self.per];
        for (i, layer) in v.chunks_mut(FP8_INPUTS.len() * self.per).enumerate() {
            let n = if i + 1 == depth { self.last_inputs } else { 4 };
            for (g, slot) in layer.chunks_mut(self.per).take(n).enumerate() {
                slot.fill(cal.scale(&format!("{}.layers.{i}.{}", self.part, FP8_INPUTS[g]))?);
            }
        }
        self.scales.write_f32(s, &v)?;
        Ok(())
    }

    /// The codes tensor of input `g` (its first `rows` rows) and layer `i`'s weight it meets.
    fn operands(&self, i: usize, g: usize) -> (&Tensor, &frt_nn::QuantizedWeight) {
        let l = &self.layers[i];
        match g {
            0 => (&self.tokens, &l.qkv),
            1 => (&self.attn, &l.o),
            2 => (&self.tokens, &l.gate_up),
            _ => (&self.hidden, &l.down),
        }
    }

    /// Plans input `g`'s GEMM into `out` for `rows` rows (adding to `out` with `accumulate`),
    /// with layer 0's weight (every layer's has its layout).
    pub(crate) fn plan(
        &self,
        k: &Kernels,
        g: usize,
        rows: usize,
        out: &Tensor,
        accumulate: bool,
    ) -> Result<Fp8Linear> {
        let (codes, w) = self.operands(0, g);
        let lin = k.linear_e4m3(&codes.narrow(0, 0, rows)?, &w.codes, out, false)?;
        Ok(if accumulate { lin.accumulating()? } else { lin })
    }

    /// [`plan`](Self::plan) without the weight's per-feature scales
    /// (`Kernels::linear_e4m3_deferred`): whatever reads `out` applies them (see
    /// [`feature_scales`](Self::feature_scales)).
    pub(crate) fn plan_deferred(
        &self,
        k: &Kernels,
        g: usize,
        rows: usize,
        out: &Tensor,
    ) -> Result<Fp8Linear> {
        let (codes, w) = self.operands(0, g);
        Ok(k.linear_e4m3_deferred(&codes.narrow(0, 0, rows)?, &w.codes, out)?)
    }

    /// Layer `i`'s weight's per-feature scales for input `g` (f32 `[N]`): what the reader of
    /// a [`plan_deferred`](Self::plan_deferred) GEMM's output multiplies it by.
    pub(crate) fn feature_scales(&self, i: usize, g: usize) -> &Tensor {
        &self.operands(i, g).1.scales
    }

    /// Layer `i`'s GEGLU after its gate+up GEMM of a [`plan_deferred`](Self::plan_deferred)
    /// plan: `gate_up` (`[rows, 2F]`) scaled by the weight's feature scales, into the down
    /// projection's codes only (`Kernels::geglu_scaled_e4m3`: the down GEMM reads nothing
    /// else).
    pub(crate) fn geglu(
        &self,
        k: &Kernels,
        cs: Stream,
        (i, rows): (usize, usize),
        gate_up: &Tensor,
    ) -> Result<()> {
        let f = gate_up.dim(1) / 2;
        let ws = self.feature_scales(i, 2);
        let (c, sc) = self.codes_for(i, 3, rows)?;
        k.geglu_scaled_e4m3(
            cs,
            (&gate_up.narrow(1, 0, f)?, &gate_up.narrow(1, f, f)?),
            (&ws.narrow(0, 0, f)?, &ws.narrow(0, f, f)?),
            None,
            (&c, &sc),
        )?;
        Ok(())
    }

    /// Where layer `i`'s input `g` goes quantized (its codes, first `rows` rows) and the scale
    /// a kernel that makes them reads (one value): for a norm that writes the codes itself.
    pub(crate) fn codes_for(&self, i: usize, g: usize, rows: usize) -> Result<(Tensor, Tensor)> {
        let (codes, _) = self.operands(i, g);
        Ok((codes.narrow(0, 0, rows)?, self.scale(i, g, 1)?))
    }

    /// The first `n` (equal) entries of layer `i`'s input `g`'s activation scale.
    fn scale(&self, i: usize, g: usize, n: usize) -> Result<Tensor> {
        let at = (i * FP8_INPUTS.len() + g) * self.per;
        Ok(self.scales.narrow(0, at, n)?)
    }

    /// `out (+)= codes · w` for layer `i`'s input `g`, its codes already made (by a norm, see
    /// [`codes_for`](Self::codes_for)), with plan `lin` for `rows` rows.
    pub(crate) fn linear_quantized(
        &self,
        cs: Stream,
        (i, g): (usize, usize),
        lin: &Fp8Linear,
        rows: usize,
        out: &Tensor,
    ) -> Result<()> {
        let (codes, w) = self.operands(i, g);
        let scale = self.scale(i, g, lin.x_scale_elements())?;
        lin.run(
            cs,
            &codes.narrow(0, 0, rows)?,
            &scale,
            &w.codes,
            &w.scales,
            out,
            None,
        )?;
        Ok(())
    }

    /// Plans the gate+up GEMM with the GEGLU after it as one op for `rows` rows, writing the
    /// down projection's codes (products rounded to `dt`), with layer 0's weight: `None` where
    /// the device has no kernel for it (see `Kernels::linear_geglu_e4m3`).
    pub(crate) fn plan_geglu(
        &self,
        k: &Kernels,
        rows: usize,
        dt: DType,
    ) -> Result<Option<Fp8GegluLinear>> {
        let (codes, w) = self.operands(0, 2);
        let (hidden, _) = self.operands(0, 3);
        Ok(k.linear_geglu_e4m3(
            &codes.narrow(0, 0, rows)?,
            &w.codes,
            &hidden.narrow(0, 0, rows)?,
            dt,
        )?)
    }

    /// Layer `i`'s gate+up GEMM and GEGLU as one op (plan `lin`, made by
    /// [`plan_geglu`](Self::plan_geglu)): the gate+up input's codes already made, the down
    /// projection's written.
    pub(crate) fn linear_geglu(
        &self,
        cs: Stream,
        i: usize,
        lin: &Fp8GegluLinear,
        rows: usize,
    ) -> Result<()> {
        let (codes, w) = self.operands(i, 2);
        let (hidden, _) = self.operands(i, 3);
        lin.run(
            cs,
            &codes.narrow(0, 0, rows)?,
            &self.scale(i, 2, 1)?,
            &w.codes,
            &w.scales,
            &hidden.narrow(0, 0, rows)?,
            &self.scale(i, 3, 1)?,
        )?;
        Ok(())
    }

    /// Plans input `g`'s GEMM as a split one into `partials` (`[parts, rows, N]` f32), with
    /// layer 0's weight (every layer's has its layout).
    pub(crate) fn plan_split(
        &self,
        k: &Kernels,
        g: usize,
        rows: usize,
        partials: &Tensor,
    ) -> Result<Fp8SplitLinear> {
        let (codes, w) = self.operands(0, g);
        Ok(k.linear_e4m3_split(&codes.narrow(0, 0, rows)?, &w.codes, partials)?)
    }

    /// [`linear_quantized`](Self::linear_quantized) as a split GEMM (plan `lin`, made by
    /// [`plan_split`](Self::plan_split)): each part's scaled product into `partials`.
    pub(crate) fn linear_quantized_split(
        &self,
        cs: Stream,
        (i, g): (usize, usize),
        lin: &Fp8SplitLinear,
        rows: usize,
        partials: &Tensor,
    ) -> Result<()> {
        let (codes, w) = self.operands(i, g);
        let scale = self.scale(i, g, 1)?;
        lin.run(
            cs,
            &codes.narrow(0, 0, rows)?,
            &scale,
            &w.codes,
            &w.scales,
            partials,
        )?;
        Ok(())
    }

    /// `out (+)= quantize(x) · w` for layer `i`'s input `g` with plan `lin` (made by
    /// [`plan`](Self::plan) for `x`'s rows).
    pub(crate) fn linear(
        &self,
        k: &Kernels,
        cs: Stream,
        (i, g): (usize, usize),
        lin: &Fp8Linear,
        x: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        let (codes, w) = self.operands(i, g);
        let codes = codes.narrow(0, 0, x.dim(0))?;
        let scale = self.scale(i, g, lin.x_scale_elements())?;
        k.quantize_e4m3(cs, x, &scale.narrow(0, 0, 1)?, &codes)?;
        lin.run(cs, &codes, &scale, &w.codes, &w.scales, out, None)?;
        Ok(())
    }
}
