//! # frt-vla — the Pi0.5 policy
//!
//! openpi's `pi05` (Physical-Intelligence/openpi, `src/openpi/models/{pi0,gemma,siglip}.py`)
//! natively in Rust: configuration presets ([`config`]), weights by openpi/LeRobot name
//! ([`weights`]), preprocessing and normalization as openpi does them ([`inputs`]), the prompt tokenizer ([`tokenizer`]), and the
//! policy as vision → prefix → action-step graphs with a halt graph ([`pi05`]).

pub mod calibration;
pub mod config;
pub mod cost;
mod error;
pub mod inputs;
pub mod pi05;
pub mod policy;
pub mod tokenizer;
pub mod weights;

pub use config::{GemmaConfig, MAX_VIEWS, Pi05Config, SiglipConfig, Variant};
pub use error::{Error, Result};
/// Bytes of checkpoint tensors uploads have read so far in this process (progress reports).
pub use frt_nn::bytes_read as checkpoint_bytes_read;
pub use frt_nn::store::Written as WrittenCheckpoint;
pub use inputs::ModelImage;
pub use pi05::{
    EXACT_PREFIX_VARIANTS, MAX_FRAME_SIDE, Observation, Pi05, Pi05Options, PromptMode, Stage,
    StageOutput, ViewImage,
};
pub use policy::{Policy, PolicySpec, StateInput};
pub use tokenizer::{
    EncodeScratch, PromptScratch, Tokenizer, pi0_tokens, pi0_tokens_into, pi05_tokens,
    pi05_tokens_into,
};
pub use weights::{ChunkShape, Pi05Weights};
