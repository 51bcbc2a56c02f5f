//! The Gemma decoder layer's weights (openpi `gemma.py` `Block`; Hugging Face
//! `GemmaDecoderLayer` names): RMSNorm (1 + w) before attention and before the MLP — or, in an
//! adaptive-norm layer (Pi0.5's action expert), norms whose scale, shift and gate come from a
//! condition (`{norm}.dense`, see the model) — grouped-query attention with `q; k; v` as one
//! fused projection, and the gated GELU MLP with `gate; up` fused.

use crate::error::Result;
use crate::store::{Path, QuantizedWeight, View, upload_stacked, upload_stacked_e4m3};
use frt_exec::{Ctx, Stream};
use frt_kernels::{DType, Tensor};

/// A Gemma stack's sizes (openpi `gemma.Config`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmaDims {
    pub width: usize,
    /// `mlp_dim`
    pub mlp: usize,
    /// `num_heads`
    pub heads: usize,
    /// `num_kv_heads`
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// One layer's weights.
#[derive(Clone)]
pub struct GemmaLayer {
    /// RMSNorm (1 + w) weights; `None` in an adaptive-norm layer.
    pub ln1: Option<Tensor>,
    pub ln2: Option<Tensor>,
    /// The 16-bit projections; `None` in a layer loaded without them (a stack that runs FP8
    /// GEMMs from [`GemmaFp8`] only).
    pub proj: Option<GemmaProjections>,
}

/// A Gemma layer's projections in the model's 16-bit (or f32) precision.
#[derive(Clone)]
pub struct GemmaProjections {
    /// `[(heads + 2·kv_heads)·head_dim, width]`: q, k, v rows (one GEMM; heads split by
    /// `rope_qkv`).
    pub qkv: Tensor,
    /// `[width, heads·head_dim]`
    pub o: Tensor,
    /// `[2·mlp, width]`: gate rows, then up rows.
    pub gate_up: Tensor,
    /// `[width, mlp]`
    pub down: Tensor,
}

impl GemmaLayer {
    /// Loads the layer under `p` (`input_layernorm`, `self_attn.{q,k,v,o}_proj`,
    /// `post_attention_layernorm`, `mlp.{gate,up,down}_proj`) in `dt`; an adaptive-norm layer
    /// has no norm weights here. Without `projections` only the norms are uploaded (the
    /// projections' names and shapes are still checked).
    pub fn load(
        p: &Path,
        d: &GemmaDims,
        adaptive: bool,
        projections: bool,
        ctx: &Ctx,
        s: Stream,
        dt: DType,
    ) -> Result<GemmaLayer> {
        let (w, q_rows, kv_rows) = (d.width, d.heads * d.head_dim, d.kv_heads * d.head_dim);
        let norm = |name: &str| -> Result<Option<Tensor>> {
            if adaptive {
                Ok(None)
            } else {
                Ok(Some(p.pp(name).upload("weight", &[w], ctx, s, dt)?))
            }
        };
        let a = p.pp("self_attn");
        let m = p.pp("mlp");
        let qkv = [
            a.pp("q_proj").get("weight", &[q_rows, w])?,
            a.pp("k_proj").get("weight", &[kv_rows, w])?,
            a.pp("v_proj").get("weight", &[kv_rows, w])?,
        ];
        let gate_up = [
            m.pp("gate_proj").get("weight", &[d.mlp, w])?,
            m.pp("up_proj").get("weight", &[d.mlp, w])?,
        ];
        let o = a.pp("o_proj").get("weight", &[w, q_rows])?;
        let down = m.pp("down_proj").get("weight", &[w, d.mlp])?;
        let proj = if projections {
            Some(GemmaProjections {
                qkv: upload_stacked(&qkv, ctx, s, dt)?,
                o: o.upload(ctx, s, dt)?,
                gate_up: upload_stacked(&gate_up, ctx, s, dt)?,
                down: down.upload(ctx, s, dt)?,
            })
        } else {
            None
        };
        Ok(GemmaLayer {
            ln1: norm("input_layernorm")?,
            ln2: norm("post_attention_layernorm")?,
            proj,
        })
    }
}

/// A Gemma layer's projections quantized per output feature for FP8 GEMMs (the same
/// checkpoint names and row order as [`GemmaLayer`]).
#[derive(Clone)]
pub struct GemmaFp8 {
    pub qkv: QuantizedWeight,
    pub o: QuantizedWeight,
    pub gate_up: QuantizedWeight,
    pub down: QuantizedWeight,
}

impl GemmaFp8 {
    /// The checkpoint weights of the layer under `p` that [`load`](Self::load) quantizes, in
    /// its order: q, k, v (stacked), o, gate, up (stacked), down.
    pub fn weights<'a>(p: &Path<'a>, d: &GemmaDims) -> Result<[Vec<View<'a>>; 4]> {
        let (w, q_rows, kv_rows) = (d.width, d.heads * d.head_dim, d.kv_heads * d.head_dim);
        let a = p.pp("self_attn");
        let m = p.pp("mlp");
        Ok([
            vec![
                a.pp("q_proj").get("weight", &[q_rows, w])?,
                a.pp("k_proj").get("weight", &[kv_rows, w])?,
                a.pp("v_proj").get("weight", &[kv_rows, w])?,
            ],
            vec![a.pp("o_proj").get("weight", &[w, q_rows])?],
            vec![
                m.pp("gate_proj").get("weight", &[d.mlp, w])?,
                m.pp("up_proj").get("weight", &[d.mlp, w])?,
            ],
            vec![m.pp("down_proj").get("weight", &[w, d.mlp])?],
        ])
    }

    /// Loads the projections of the layer under `p` quantized per row.
    pub fn load(p: &Path, d: &GemmaDims, ctx: &Ctx, s: Stream) -> Result<GemmaFp8> {
        let [qkv, o, gate_up, down] = Self::weights(p, d)?;
        Ok(GemmaFp8 {
            qkv: upload_stacked_e4m3(&qkv, ctx, s)?,
            o: upload_stacked_e4m3(&o, ctx, s)?,
            gate_up: upload_stacked_e4m3(&gate_up, ctx, s)?,
            down: upload_stacked_e4m3(&down, ctx, s)?,
        })
    }
}
