//! Errors of the robot host.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("config {0}")]
    Config(#[from] crate::config::ConfigError),

    #[error(transparent)]
    Exec(#[from] frt_exec::Error),

    #[error("policy: {0}")]
    Policy(#[from] frt_vla::Error),

    #[error("speech recognition: {0}")]
    Asr(#[from] frt_asr::Error),

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    /// An input the node refused (counted in the status; the node keeps running).
    #[error("bad {what}: {reason}")]
    BadInput { what: String, reason: String },
}

impl Error {
    pub fn bad(what: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::BadInput {
            what: what.into(),
            reason: reason.into(),
        }
    }
}
