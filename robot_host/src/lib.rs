//! # frt-robot-host
//!
//! The real-time robot host: control loop, subgoal switching, interrupts, voice commands, safety.
//!
//! Not implemented yet: this crate holds no code so far. See `shared/DESIGN.md` and the
//! project README for what it will contain; it depends on `frt-exec` only so that the
//! workspace's layering (dependencies point down) is fixed from the start.
