//! Errors of the weight store: each names the file or the tensor's full path.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Exec(#[from] frt_exec::Error),

    #[error(transparent)]
    Kernels(#[from] frt_kernels::Error),

    #[error("model folder {dir}: {reason}")]
    ModelFolder { dir: PathBuf, reason: String },

    #[error("checkpoint {file}: {reason}")]
    BadCheckpoint { file: PathBuf, reason: String },

    /// A tensor a model needs is not in the checkpoint (`expected` is empty where the shape
    /// is not known beforehand).
    #[error("checkpoint has no tensor `{name}` (expected shape {expected:?})")]
    MissingTensor { name: String, expected: Vec<usize> },

    /// A tensor with another shape than the model's configuration implies.
    #[error("tensor `{name}` has shape {got:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },

    /// A tensor holding NaN or an infinity (found while it is checked or uploaded).
    #[error("tensor `{name}` holds non-finite values")]
    NonFinite { name: String },

    /// A tensor uploaded into storage it does not fit (a model's bug, not the checkpoint's).
    #[error("tensor `{name}`: {reason}")]
    Upload { name: String, reason: String },

    #[error("I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}
