//! # frt-vla — the Pi0.5 policy
//!
//! openpi's `pi05` (Physical-Intelligence/openpi, `src/openpi/models/{pi0,gemma,siglip}.py`)
//! natively in Rust: configuration presets ([`config`]) and weights by openpi/LeRobot name
//! ([`weights`]). The graphs (vision → prefix → action steps), inputs and plan are being
//! built on top of these.

pub mod config;
mod error;
pub mod weights;

pub use config::{GemmaConfig, Pi05Config, SiglipConfig};
pub use error::{Error, Result};
pub use weights::Pi05Weights;
