//! # frt-kernels
//!
//! The op library: every op Pi0.5 and Whisper need, as a host reference and a CUDA implementation, enqueued on frt-exec streams.
//!
//! Not implemented yet: this crate holds no code so far. See `shared/DESIGN.md` and the
//! project README for what it will contain; it depends on `frt-exec` only so that the
//! workspace's layering (dependencies point down) is fixed from the start.
