//! Transformer blocks built from the store and recorded into captures. Each block plans its
//! ops once (for its first layer: every layer of a stack has the same shapes) and records
//! any layer's ops into the stream being captured.

pub mod encoder;
pub mod gemma;

use frt_kernels::Tensor;

/// A linear layer's weight `[out, in]` and bias `[out]`.
#[derive(Clone)]
pub struct Linear {
    pub w: Tensor,
    pub b: Tensor,
}

/// A LayerNorm's gain and bias.
#[derive(Clone)]
pub struct LayerNorm {
    pub g: Tensor,
    pub b: Tensor,
}
