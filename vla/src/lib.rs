//! # frt-vla
//!
//! Pi0.5 vision-language-action policy as a Plan of vision, prefix and action-step graphs.
//!
//! Not implemented yet: this crate holds no code so far. See `shared/DESIGN.md` and the
//! project README for what it will contain; it depends on `frt-exec` only so that the
//! workspace's layering (dependencies point down) is fixed from the start.
