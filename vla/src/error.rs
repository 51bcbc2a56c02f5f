//! Errors of the policy.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Exec(#[from] frt_exec::Error),

    #[error(transparent)]
    Kernels(#[from] frt_kernels::Error),

    #[error("configuration: {reason}")]
    Config { reason: String },

    #[error("model folder {dir}: {reason}")]
    ModelFolder { dir: PathBuf, reason: String },

    #[error("checkpoint {file}: {reason}")]
    BadCheckpoint { file: PathBuf, reason: String },

    /// A tensor the configuration needs is not in the checkpoint.
    #[error("checkpoint has no tensor `{name}` (expected shape {expected:?})")]
    MissingTensor { name: String, expected: Vec<usize> },

    /// A tensor with another shape than the configuration implies.
    #[error("tensor `{name}` has shape {got:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },

    /// An input the policy cannot use (image, state, prompt, statistics).
    #[error("bad input `{what}`: {reason}")]
    BadInput { what: String, reason: String },

    /// A `tokenizer.json` that is broken or of a kind the prompt tokenizer does not handle.
    #[error("tokenizer {path}: {reason}")]
    BadTokenizer { path: PathBuf, reason: String },

    #[error("I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}
