//! Errors of the speech recognizer.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Exec(#[from] frt_exec::Error),

    #[error(transparent)]
    Kernels(#[from] frt_kernels::Error),

    /// A WAV file or sample buffer that cannot be used.
    #[error("bad audio ({what}): {reason}")]
    BadAudio { what: String, reason: String },

    /// A model folder without a file it needs, or a file that cannot be read.
    #[error("model folder {dir}: {reason}")]
    ModelFolder { dir: PathBuf, reason: String },

    /// A checkpoint that does not parse, or a file next to it (`config.json`) that does not.
    #[error("checkpoint {file}: {reason}")]
    BadCheckpoint { file: PathBuf, reason: String },

    /// The checkpoint's tensors: a broken file, a missing or mis-shaped tensor (by full name,
    /// with the expected shape), non-finite values.
    #[error(transparent)]
    Weights(#[from] frt_nn::Error),

    /// tokenizer.json that does not parse or lacks Whisper's special tokens.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    #[error("I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn audio(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::BadAudio {
            what: what.into(),
            reason: reason.into(),
        }
    }
}

/// A record closure's error comes back from `Graph::capture` unchanged, with its cause.
impl frt_exec::CaptureError for Error {}
