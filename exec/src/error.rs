//! Errors of the execution contract and their C ABI status codes.

use crate::{ShapeKey, Stream};
use cudarc::driver::sys::CUresult;
use std::fmt;

/// The result type of every fallible `exec` call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Status codes of the C ABI (`frt_status` in `exec/include/flashrt/exec.h`).
#[repr(i32)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    Invalid = -1,
    NoVariant = -2,
    Unbound = -3,
    Capture = -4,
    Backend = -5,
    Oom = -6,
}

/// A CUDA driver error code, kept raw (`CUresult`) with the call that returned it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DriverCode(pub CUresult);

impl fmt::Debug for DriverCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} ({})", self.0, self.0 as i32)
    }
}

impl fmt::Display for DriverCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The error a host operation (a closure enqueued with [`Ctx::launch_host`](crate::Ctx::launch_host))
/// returns. Its cause is kept, not flattened.
#[derive(Debug)]
pub struct HostOpError(pub Box<dyn std::error::Error + Send + Sync + 'static>);

impl HostOpError {
    /// An error carrying only a message.
    pub fn msg(message: impl Into<String>) -> Self {
        HostOpError(message.into().into())
    }
}

impl fmt::Display for HostOpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for HostOpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Every error `exec` reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A caller mistake: a bad argument, a handle of another context, a misuse of the API.
    #[error("invalid argument to {op}: {reason}")]
    Invalid { op: &'static str, reason: String },

    /// `replay`/`execute` asked for a key that has no captured or adopted variant.
    #[error("graph `{graph}` has no variant for {key}")]
    NoVariant { graph: String, key: ShapeKey },

    /// A port was looked up that has no buffer bound.
    #[error("graph `{graph}` has no buffer bound to port `{port}`")]
    Unbound { graph: String, port: String },

    /// A strict binding ([`Graph::bind_before_capture`](crate::Graph::bind_before_capture))
    /// of a new port, or of another buffer to a bound port (`old`; empty for a new port),
    /// while captured variants exist. Captured graphs bake device addresses in, so they would
    /// not use it; evict the variants (or use a new graph) and capture again.
    #[error(
        "graph `{graph}`: binding buffer `{new}` to port `{port}` (bound to `{old}`) after \
         {variants} variant(s) were captured: they would not use it (strict binding; evict \
         them first)"
    )]
    Rebind {
        graph: String,
        port: String,
        old: String,
        new: String,
        variants: usize,
    },

    /// Capture or instantiation of a graph failed.
    #[error("capture of graph `{graph}` key {key} failed: {reason}")]
    Capture {
        graph: String,
        key: ShapeKey,
        reason: String,
        #[source]
        source: Option<Box<Error>>,
    },

    /// A CUDA driver call failed; the raw code is kept.
    #[error("CUDA driver call {call} failed: {code}")]
    Driver {
        call: &'static str,
        code: DriverCode,
    },

    /// No CUDA driver library or no device.
    #[error("CUDA is not available: {reason}")]
    NoCuda { reason: String },

    /// A device or pinned allocation failed.
    #[error("out of memory allocating {bytes} bytes for `{name}`")]
    OutOfMemory {
        name: String,
        bytes: usize,
        code: Option<DriverCode>,
    },

    /// A copy, upload or download reached outside a buffer.
    #[error(
        "{op} out of range: buffer `{buffer}` has {size} bytes, access is [{offset}, {offset}+{bytes})"
    )]
    OutOfRange {
        op: &'static str,
        buffer: String,
        size: usize,
        offset: usize,
        bytes: usize,
    },

    /// A stream id that this context never handed out.
    #[error("unknown stream {0:?}")]
    UnknownStream(Stream),

    /// A host operation enqueued on a stream failed (or panicked) when it ran.
    #[error("host operation on {stream:?} failed")]
    HostOp {
        stream: Stream,
        #[source]
        source: HostOpError,
    },

    /// A blocking call was made from the host backend's executor thread (from inside a host
    /// operation), where it would wait for itself.
    #[error("{op} called from inside a host operation; it would deadlock")]
    WouldDeadlock { op: &'static str },
}

impl Error {
    /// The C ABI status code of this error.
    pub fn status(&self) -> Status {
        match self {
            Error::Invalid { .. }
            | Error::Rebind { .. }
            | Error::UnknownStream(_)
            | Error::OutOfRange { .. }
            | Error::WouldDeadlock { .. } => Status::Invalid,
            Error::NoVariant { .. } => Status::NoVariant,
            Error::Unbound { .. } => Status::Unbound,
            Error::Capture { .. } => Status::Capture,
            Error::Driver { .. } | Error::NoCuda { .. } | Error::HostOp { .. } => Status::Backend,
            Error::OutOfMemory { .. } => Status::Oom,
        }
    }

    pub(crate) fn invalid(op: &'static str, reason: impl Into<String>) -> Self {
        Error::Invalid {
            op,
            reason: reason.into(),
        }
    }
}

/// Turns a raw `CUresult` into a `Result`, naming the driver call.
pub(crate) fn check(call: &'static str, code: CUresult) -> Result<()> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Driver {
            call,
            code: DriverCode(code),
        })
    }
}
