//! What each stage of the model costs at the least, and the floor that sets on a device.
//!
//! A stage's cost is its arithmetic (FLOPs of its GEMMs and attention, two per
//! multiply-add) and the bytes it cannot avoid moving: each weight it uses read once in the
//! model's precision, and the key/value caches written (the prefix) or read (a step). Other
//! activation traffic is left out: it can stay on chip in a fused implementation. The floor
//! of a stage on a device is the larger of FLOPs / peak FLOP/s and bytes / peak bandwidth.
//!
//! Per-step expert weights exclude the adaptive-norm modulations of Pi0.5: they depend only
//! on the step's time and are computed for every step when the model is built.

use crate::config::{GemmaConfig, Pi05Config, Variant};

/// FLOPs and bytes of a stage.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    pub flops: f64,
    pub bytes: f64,
}

impl Cost {
    /// Seconds at least, on a device of `flops_per_s` and `bytes_per_s`.
    pub fn floor_s(&self, flops_per_s: f64, bytes_per_s: f64) -> f64 {
        (self.flops / flops_per_s).max(self.bytes / bytes_per_s)
    }

    fn add(self, o: Cost) -> Cost {
        Cost {
            flops: self.flops + o.flops,
            bytes: self.bytes + o.bytes,
        }
    }

    /// `n` times this cost.
    pub fn times(self, n: f64) -> Cost {
        Cost {
            flops: self.flops * n,
            bytes: self.bytes * n,
        }
    }
}

/// A linear layer of `params` weights applied to `tokens` rows.
fn linear(tokens: usize, params: usize, elem: f64) -> Cost {
    Cost {
        flops: 2.0 * tokens as f64 * params as f64,
        bytes: params as f64 * elem,
    }
}

/// Attention of `q` query rows over `kv` key rows, `heads` heads of `head_dim` (scores and
/// weighted sum).
fn attention(q: usize, kv: usize, heads: usize, head_dim: usize) -> Cost {
    Cost {
        flops: 4.0 * q as f64 * kv as f64 * (heads * head_dim) as f64,
        bytes: 0.0,
    }
}

/// One Gemma layer's weights: query, key and value, output, and the gated MLP.
fn gemma_layer_params(g: &GemmaConfig) -> usize {
    let q = g.width * g.heads * g.head_dim;
    let kv = 2 * g.width * g.kv_heads * g.head_dim;
    let o = g.heads * g.head_dim * g.width;
    let mlp = 3 * g.width * g.mlp;
    q + kv + o + mlp
}

/// Bytes of one layer's key/value cache rows for `tokens` tokens.
fn kv_bytes(g: &GemmaConfig, tokens: usize, elem: f64) -> f64 {
    (2 * tokens * g.kv_heads * g.head_dim) as f64 * elem
}

/// The vision stage for `views` present views: SigLIP (patch embedding, its layers) and the
/// projection to the language model's width.
pub fn vision(c: &Pi05Config, views: usize, elem: f64) -> Cost {
    let s = &c.siglip;
    let t = s.tokens();
    let patch = linear(t, s.patch * s.patch * 3 * s.width, elem);
    let layer_params = 4 * s.width * s.width + 2 * s.width * s.mlp;
    let layer = linear(t, layer_params, elem).add(attention(t, t, s.heads, s.head_dim()));
    let project = linear(t, s.width * c.llm.width, elem);
    let per_view = patch.add(layer.times(s.depth as f64)).add(project);
    // The weights are read once for all views.
    Cost {
        flops: per_view.flops * views as f64,
        bytes: per_view.bytes,
    }
}

/// Prefix tokens: each present view's patches and the prompt.
pub fn prefix_tokens(c: &Pi05Config, views: usize, prompt: usize) -> usize {
    views * c.siglip.tokens() + prompt
}

/// The prefix stage over `tokens` tokens: the language model's layers, its cache written. Of
/// the last layer only the keys and values are needed (the steps read nothing else of it).
pub fn prefix(c: &Pi05Config, tokens: usize, elem: f64) -> Cost {
    let g = &c.llm;
    let cache = Cost {
        flops: 0.0,
        bytes: kv_bytes(g, tokens, elem),
    };
    let layer = linear(tokens, gemma_layer_params(g), elem)
        .add(attention(tokens, tokens, g.heads, g.head_dim))
        .add(cache);
    let last = linear(tokens, 2 * g.width * g.kv_heads * g.head_dim, elem).add(cache);
    layer.times((g.depth - 1) as f64).add(last)
}

/// One flow-matching step after a prefix of `prefix` tokens: the expert's layers over the
/// action tokens (and Pi0's state token), attending to the prefix cache and themselves, and
/// the action projections in and out (Pi0: its action-time MLP too).
pub fn step(c: &Pi05Config, prefix: usize, elem: f64) -> Cost {
    let e = &c.expert;
    let n = c.action_horizon + usize::from(c.variant == Variant::Pi0);
    let layer = linear(n, gemma_layer_params(e), elem)
        .add(attention(n, prefix + n, e.heads, e.head_dim))
        .add(Cost {
            flops: 0.0,
            bytes: kv_bytes(e, prefix + n, elem),
        });
    let mut io = linear(n, 2 * c.action_dim * e.width, elem);
    if c.variant == Variant::Pi0 {
        io = io.add(linear(n, 3 * e.width * e.width, elem));
    }
    layer.times(e.depth as f64).add(io)
}

/// The stages of one inference and how many times each runs: vision, prefix, a step.
pub fn stages(c: &Pi05Config, views: usize, prompt: usize, elem: f64) -> [(Cost, usize); 3] {
    let p = prefix_tokens(c, views, prompt);
    [
        (vision(c, views, elem), 1),
        (prefix(c, p, elem), 1),
        (step(c, p, elem), c.steps),
    ]
}

/// The floor of a whole inference: each stage's floor (they run one after the other), summed.
pub fn end_to_end_floor_s(
    c: &Pi05Config,
    views: usize,
    prompt: usize,
    elem: f64,
    flops_per_s: f64,
    bytes_per_s: f64,
) -> f64 {
    stages(c, views, prompt, elem)
        .iter()
        .map(|(cost, n)| cost.floor_s(flops_per_s, bytes_per_s) * *n as f64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_size_costs_match_the_model_arithmetic() {
        let c = Pi05Config::base();
        // The expert's per-step weights: 18 × (2.10 + 0.52 + 2.10 + 12.58) M + 65.5 k
        // parameters, 0.62 GB in bf16.
        let s = step(&c, 576, 2.0);
        let weights = 18.0 * (2_097_152.0 + 524_288.0 + 2_097_152.0 + 12_582_912.0) + 65_536.0;
        let kv = 18.0 * 2.0 * 626.0 * 256.0 * 2.0;
        assert_eq!(s.bytes, 2.0 * weights + kv);
        assert!((s.bytes / 1e9 - 0.634).abs() < 0.01, "{}", s.bytes);
        // Gemma 2B over 576 tokens: 17 layers of 110.1 M parameters and the last one's keys
        // and values (2.1 M), ≈ 2.20 TFLOP.
        let p = prefix(&c, prefix_tokens(&c, 2, 64), 2.0);
        assert_eq!(prefix_tokens(&c, 2, 64), 576);
        let params = 17.0 * (4_194_304.0 + 1_048_576.0 + 4_194_304.0 + 100_663_296.0) + 1_048_576.0;
        let cache = 18.0 * 2.0 * 576.0 * 256.0 * 2.0;
        assert_eq!(p.bytes, 2.0 * params + cache);
        assert!((p.flops / 1e12 - 2.20).abs() < 0.02, "{}", p.flops);
        // SigLIP on two views: ≈ 0.43 TFLOP, its weights read once.
        let v = vision(&c, 2, 2.0);
        assert!((v.flops / 1e12 - 0.43).abs() < 0.02, "{}", v.flops);
        assert_eq!(vision(&c, 1, 2.0).bytes, v.bytes);
        assert_eq!(vision(&c, 1, 2.0).flops * 2.0, v.flops);
        // On an H100's nominal 989 TFLOP/s and 3.35 TB/s: ≈ 0.19 ms a step, ≈ 4.7 ms in all.
        let floor = |c: Cost| c.floor_s(989e12, 3.35e12) * 1e3;
        assert!((floor(s) - 0.19).abs() < 0.01, "{}", floor(s));
        let all = end_to_end_floor_s(&c, 2, 64, 2.0, 989e12, 3.35e12) * 1e3;
        assert!((all - 4.7).abs() < 0.2, "{all}");
        // A step is memory-bound, the prefix compute-bound.
        assert!(s.bytes / 3.35e12 > s.flops / 989e12);
        assert!(p.flops / 989e12 > p.bytes / 3.35e12);
    }

    #[test]
    fn pi0_steps_carry_the_state_token_and_the_action_time_mlp() {
        let (a, b) = (Pi05Config::base(), Pi05Config::pi0_base());
        let (sa, sb) = (step(&a, 576, 2.0), step(&b, 576, 2.0));
        assert!(sb.flops > sa.flops && sb.bytes > sa.bytes);
        assert_eq!(
            sb.bytes - sa.bytes,
            2.0 * 3.0 * 1024.0 * 1024.0 + 18.0 * 2.0 * 256.0 * 2.0
        );
    }
}
