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

    /// The checkpoint: a missing or mis-shaped tensor (by full name, with the expected
    /// shape), a broken file, non-finite values.
    #[error(transparent)]
    Weights(#[from] frt_nn::Error),

    #[error("checkpoint {file}: {reason}")]
    BadCheckpoint { file: PathBuf, reason: String },

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

/// A record closure's error comes back from `Graph::capture` unchanged, with its cause.
impl frt_exec::CaptureError for Error {}
