//! Errors of the op library.

use crate::DType;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Exec(#[from] frt_exec::Error),

    /// Shapes, strides or sizes that do not fit the op.
    #[error("{op}: {reason}")]
    Shape { op: &'static str, reason: String },

    /// A tensor of a dtype the op does not take there.
    #[error("{op}: `{arg}` is {got:?}, expected {expected}")]
    DType {
        op: &'static str,
        arg: &'static str,
        got: DType,
        expected: &'static str,
    },

    /// NVRTC rejected a CUDA source (the compiler log is kept).
    #[error("NVRTC could not compile kernels/cuda/{file} for {arch}:\n{log}")]
    Compile {
        file: &'static str,
        arch: String,
        log: String,
    },

    /// An NVRTC call failed.
    #[error("NVRTC call {call} failed with status {status}")]
    Nvrtc { call: &'static str, status: i32 },

    /// A cuBLASLt call failed; the raw status is kept.
    #[error("cuBLASLt call {call} failed with status {status}")]
    Cublas { call: &'static str, status: i32 },

    /// Kernel options that do not parse (an environment variable's value).
    #[error("kernel options: {reason}")]
    Options { reason: String },

    /// No cuBLASLt algorithm for a GEMM shape.
    #[error("cuBLASLt has no algorithm for {what}")]
    NoAlgorithm { what: String },

    /// A CUDA entry point missing from the registry (a source without it).
    #[error("no CUDA kernel `{name}_{dtype}` in kernels/cuda")]
    MissingKernel {
        name: &'static str,
        dtype: &'static str,
    },
}

impl Error {
    pub(crate) fn shape(op: &'static str, reason: impl Into<String>) -> Self {
        Error::Shape {
            op,
            reason: reason.into(),
        }
    }
}

/// A record closure's error comes back from `Graph::capture` unchanged, with its cause.
impl frt_exec::CaptureError for Error {}
