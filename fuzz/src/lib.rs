//! # frt-fuzz
//!
//! Seeded mutation fuzzing on stable Rust for everything the robot host reads from outside:
//! the CDR decoders, the wire receive path (decode → convert → the node's inputs → a tick),
//! camera frame decoding, WAV files, both tokenizer loaders, both checkpoint loaders, norm
//! stats, configs and sim scripts.
//!
//! Each [`Target`] starts from valid samples (its seeds, every one of which must load) and
//! runs mutated inputs through the real code. A **finding** is a panic, an input slower than
//! the budget, an allocation above [`guard::LIMIT`] (the guard writes the input to disk and
//! the process aborts: the `frt-fuzz` binary runs each target in a child process and reports
//! it), or a broken oracle (the wire target checks that no published action is outside the
//! configured limits or non-finite). Inputs whose outcome is new (a new error message, with
//! digits ignored) join the corpus, a cheap stand-in for coverage.

pub mod engine;
pub mod guard;
pub mod targets;

pub use engine::{Budget, Finding, Report, fuzz};
pub use targets::{Target, all, by_name};
