//! What every model is built from, between the op library and the models.
//!
//! * [`Store`]: one weight store for every model — safetensors (memory-mapped, sharded or
//!   not), CTranslate2 `model.bin`, generated tensors — looked up by hierarchical name
//!   ([`Path`]), each tensor converted straight into the storage precision of the device
//!   tensor it is uploaded to.
//!
//! It is NOT a model: no model's names or shapes live here.

pub mod error;
pub mod store;

pub use error::{Error, Result};
pub use store::{Path, SLICE, Store, Stored, View, upload_stacked};
