//! The pre-LN transformer encoder layer (SigLIP's `Encoder1DBlock`, Whisper's
//! `ResidualAttentionBlock` in the encoder):
//!
//! ```text
//! x += out(attention(qkv(LayerNorm₁(x))))
//! x += fc2(act(fc1(LayerNorm₂(x))))
//! ```
//!
//! with `q; k; v` as one fused projection and biases everywhere. [`EncoderStack`] plans a
//! stack's GEMMs and attention once and records any layer into a capture.

use super::{LayerNorm, Linear};
use crate::error::Result;
use crate::store::{Path, QuantizedWeight, View, upload_stacked, upload_stacked_e4m3};
use frt_exec::{Ctx, Stream};
use frt_kernels::{AttentionPlan, DType, Epilogue, Gemm, GemmOptions, Kernels, Tensor};

/// One layer's weights.
#[derive(Clone)]
pub struct EncoderLayer {
    pub ln1: LayerNorm,
    /// `[3·width, width]`: q, k, v rows.
    pub qkv: Linear,
    pub out: Linear,
    pub ln2: LayerNorm,
    pub fc1: Linear,
    pub fc2: Linear,
}

/// The checkpoint's names of a layer's parts, under the layer's path (each has `.weight`
/// and `.bias`).
pub struct EncoderNames {
    pub ln1: &'static str,
    pub q: &'static str,
    pub k: &'static str,
    pub v: &'static str,
    pub out: &'static str,
    pub ln2: &'static str,
    pub fc1: &'static str,
    pub fc2: &'static str,
}

impl EncoderNames {
    /// Hugging Face SigLIP (`SiglipEncoderLayer`).
    pub const SIGLIP: EncoderNames = EncoderNames {
        ln1: "layer_norm1",
        q: "self_attn.q_proj",
        k: "self_attn.k_proj",
        v: "self_attn.v_proj",
        out: "self_attn.out_proj",
        ln2: "layer_norm2",
        fc1: "mlp.fc1",
        fc2: "mlp.fc2",
    };
}

impl EncoderLayer {
    /// Loads a layer of `width` and MLP width `mlp` from `p` (named as `n` says), in `dt`.
    pub fn load(
        p: &Path,
        n: &EncoderNames,
        width: usize,
        mlp: usize,
        ctx: &Ctx,
        s: Stream,
        dt: DType,
    ) -> Result<EncoderLayer> {
        let linear = |name: &str, out: usize, inp: usize| -> Result<Linear> {
            let q = p.pp(name);
            Ok(Linear {
                w: q.upload("weight", &[out, inp], ctx, s, dt)?,
                b: q.upload("bias", &[out], ctx, s, dt)?,
            })
        };
        let norm = |name: &str| -> Result<LayerNorm> {
            let q = p.pp(name);
            Ok(LayerNorm {
                g: q.upload("weight", &[width], ctx, s, dt)?,
                b: q.upload("bias", &[width], ctx, s, dt)?,
            })
        };
        let parts = |leaf: &str, shape: &[usize]| -> Result<Tensor> {
            let views = [n.q, n.k, n.v]
                .iter()
                .map(|x| p.pp(x).get(leaf, shape))
                .collect::<Result<Vec<_>>>()?;
            upload_stacked(&views, ctx, s, dt)
        };
        Ok(EncoderLayer {
            ln1: norm(n.ln1)?,
            qkv: Linear {
                w: parts("weight", &[width, width])?,
                b: parts("bias", &[width])?,
            },
            out: linear(n.out, width, width)?,
            ln2: norm(n.ln2)?,
            fc1: linear(n.fc1, mlp, width)?,
            fc2: linear(n.fc2, width, mlp)?,
        })
    }
}

/// The MLP's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// GELU, tanh approximation, fused into the first projection's epilogue (SigLIP).
    GeluTanh,
    /// GELU, exact (erf), as its own op after the first projection (Whisper).
    Gelu,
}

/// The activations a stack works in: `x` `[rows, width]` (the residual stream, updated in
/// place), `ln` `[rows, width]`, `qkv` `[rows, 3·width]`, `attn` `[rows, width]`, `h`
/// `[rows, mlp]`.
#[derive(Clone)]
pub struct EncoderActs {
    pub x: Tensor,
    pub ln: Tensor,
    pub qkv: Tensor,
    pub attn: Tensor,
    pub h: Tensor,
}

/// How a stack's attention runs: the plans over `qkv` into `attn` (one, or one per
/// independent sequence, such as SigLIP's views), and optionally all of them as one launch.
pub struct EncoderAttention {
    pub plans: Vec<AttentionPlan>,
    pub batch: Option<AttentionPlan>,
}

impl EncoderAttention {
    /// Runs every plan (or the batched one) on `cs`.
    pub fn run(&self, k: &Kernels, cs: Stream) -> Result<()> {
        match &self.batch {
            Some(b) => b.run(k, cs)?,
            None => {
                for p in &self.plans {
                    p.run(k, cs)?;
                }
            }
        }
        Ok(())
    }
}

/// A stack of encoder layers planned once (see the module docs).
pub struct EncoderStack {
    acts: EncoderActs,
    attention: EncoderAttention,
    act: Activation,
    eps: f32,
    qkv: Gemm,
    out: Gemm,
    fc1: Gemm,
    fc2: Gemm,
}

impl EncoderStack {
    /// Plans the layers' GEMMs on `acts` with the shapes of `first`.
    pub fn new(
        k: &Kernels,
        acts: EncoderActs,
        first: &EncoderLayer,
        attention: EncoderAttention,
        act: Activation,
        eps: f32,
    ) -> Result<EncoderStack> {
        let a = &acts;
        let fc1 = match act {
            Activation::GeluTanh => {
                let o = GemmOptions {
                    bias: true,
                    epilogue: Epilogue::Gelu,
                    ..GemmOptions::weight()
                };
                k.gemm(&a.ln, &first.fc1.w, &a.h, o)?
            }
            Activation::Gelu => k.linear(&a.ln, &first.fc1.w, &a.h, true, false)?,
        };
        Ok(EncoderStack {
            qkv: k.linear(&a.ln, &first.qkv.w, &a.qkv, true, false)?,
            out: k.linear(&a.attn, &first.out.w, &a.x, true, true)?,
            fc1,
            fc2: k.linear(&a.h, &first.fc2.w, &a.x, true, true)?,
            acts,
            attention,
            act,
            eps,
        })
    }

    pub fn acts(&self) -> &EncoderActs {
        &self.acts
    }

    /// The attention plans.
    pub fn attention(&self) -> &EncoderAttention {
        &self.attention
    }

    /// The planned 16-bit GEMMs: q/k/v, attention out, fc1 (with the activation's epilogue
    /// when fused), fc2; and the LayerNorm epsilon and the activation.
    pub fn gemms(&self) -> ([&Gemm; 4], f32, Activation) {
        (
            [&self.qkv, &self.out, &self.fc1, &self.fc2],
            self.eps,
            self.act,
        )
    }

    /// Records one layer on `cs` (the residual stream `x` updated in place).
    pub fn record(&self, k: &Kernels, cs: Stream, l: &EncoderLayer) -> Result<()> {
        let a = &self.acts;
        k.layer_norm(cs, &a.x, &l.ln1.g, &l.ln1.b, &a.ln, self.eps)?;
        self.qkv.run(cs, &a.ln, &l.qkv.w, &a.qkv, Some(&l.qkv.b))?;
        self.attention.run(k, cs)?;
        self.out.run(cs, &a.attn, &l.out.w, &a.x, Some(&l.out.b))?;
        k.layer_norm(cs, &a.x, &l.ln2.g, &l.ln2.b, &a.ln, self.eps)?;
        self.fc1.run(cs, &a.ln, &l.fc1.w, &a.h, Some(&l.fc1.b))?;
        if self.act == Activation::Gelu {
            k.gelu(cs, &a.h, &a.h)?;
        }
        self.fc2.run(cs, &a.h, &l.fc2.w, &a.x, Some(&l.fc2.b))?;
        Ok(())
    }
}

/// An encoder layer's projections quantized per output feature for FP8 GEMMs (the biases stay
/// the 16-bit layer's).
#[derive(Clone)]
pub struct EncoderFp8 {
    pub qkv: QuantizedWeight,
    pub out: QuantizedWeight,
    pub fc1: QuantizedWeight,
    pub fc2: QuantizedWeight,
}

impl EncoderFp8 {
    /// The checkpoint weights of the layer under `p` (named as `n` says) that
    /// [`load`](Self::load) quantizes, in its order: q, k, v (stacked), out, fc1, fc2.
    pub fn weights<'a>(
        p: &Path<'a>,
        n: &EncoderNames,
        width: usize,
        mlp: usize,
    ) -> Result<[Vec<View<'a>>; 4]> {
        let one = |name: &str, out: usize, inp: usize| -> Result<Vec<View<'a>>> {
            Ok(vec![p.pp(name).get("weight", &[out, inp])?])
        };
        let qkv = [n.q, n.k, n.v]
            .iter()
            .map(|x| p.pp(x).get("weight", &[width, width]))
            .collect::<Result<Vec<_>>>()?;
        Ok([
            qkv,
            one(n.out, width, width)?,
            one(n.fc1, mlp, width)?,
            one(n.fc2, width, mlp)?,
        ])
    }

    /// Loads the projections of the layer under `p` (named as `n` says) quantized per row.
    pub fn load(
        p: &Path,
        n: &EncoderNames,
        width: usize,
        mlp: usize,
        ctx: &Ctx,
        s: Stream,
    ) -> Result<EncoderFp8> {
        let [qkv, out, fc1, fc2] = Self::weights(p, n, width, mlp)?;
        Ok(EncoderFp8 {
            qkv: upload_stacked_e4m3(&qkv, ctx, s)?,
            out: upload_stacked_e4m3(&out, ctx, s)?,
            fc1: upload_stacked_e4m3(&fc1, ctx, s)?,
            fc2: upload_stacked_e4m3(&fc2, ctx, s)?,
        })
    }
}
