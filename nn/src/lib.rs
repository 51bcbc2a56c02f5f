//! What every model is built from, between the op library and the models.
//!
//! * [`Store`]: one weight store for every model — safetensors (memory-mapped, sharded or
//!   not), CTranslate2 `model.bin`, generated tensors — looked up by hierarchical name
//!   ([`Path`]), each tensor converted straight into the storage precision of the device
//!   tensor it is uploaded to.
//! * [`blocks`]: transformer layers written once for every model that has them (the pre-LN
//!   encoder layer of SigLIP and Whisper), each planning its ops once and recording a layer
//!   into a capture.
//!
//! It is NOT a model: no model's names or shapes live here.

pub mod blocks;
pub mod error;
pub mod store;

pub use error::{Error, Result};
pub use store::{
    Path, QuantizedWeight, SLOT_BYTES, SLOTS, Store, Stored, View, bytes_read, upload_stacked,
    upload_stacked_e4m3,
};
