//! The safety contract's mechanisms, shared by the I/O side, the control thread and the
//! supervision of the process:
//!
//! * [`StopLatch`]: stops and resumes do not queue behind subgoals. A stop is latched (never
//!   refused, never dropped; repeated stops coalesce), the control thread looks at the latch
//!   between every two replays and once more under the latch's lock when it publishes a
//!   chunk, so no chunk computed before a stop is published after it ([`StopLatch::publish`]).
//!   A resume clears the latch only when it came after the last stop.
//! * [`Hold`]: what a halt commands, per dimension ([`HoldRule`]): a position holds the
//!   latest *measured* position (fresh within the age bounds), a velocity zero; rule
//!   `current` falls back to the command being executed. When a dimension has neither, the
//!   halt carries no targets (the JointTrajectory output is then an empty trajectory,
//!   ros2_control's "stop and hold the current position"). A hold is never a future target,
//!   never zeros in position control, never non-finite.
//! * [`Fault`] and [`Watchdog`]: a panic, a fatal device error or a tick that overruns its
//!   deadline is recorded once with its cause; the node halts (best effort) and the process
//!   exits non-zero so that a supervisor (the launch file's `respawn`) restarts it.

use crate::config::{ActionDim, HoldRule};
use crate::messages::Stamp;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[derive(Debug, Default)]
struct LatchState {
    /// Orders stops and resumes: each request takes the next number.
    seq: u64,
    /// The number of the last stop and of the last resume (0: none yet).
    last_stop: u64,
    last_resume: u64,
    /// The last stop and resume the control thread has acted on.
    seen_stop: u64,
    seen_resume: u64,
    /// When the oldest stop the control thread has not acted on arrived.
    stop_arrived: Stamp,
    /// The sequence number of the last chunk published under the latch, and its value when
    /// the last stop was latched (0: none).
    published: u64,
    published_before_stop: u64,
}

/// What the control thread has to act on (see [`StopLatch::take`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pending {
    /// A stop arrived (at this time) since the last look: halt.
    pub stop: Option<Stamp>,
    /// A resume arrived after the last stop: leave the halted state (after the stop, if both).
    pub resume: bool,
}

/// Stops and resumes, latched (see the module docs).
#[derive(Debug, Default)]
pub struct StopLatch(Mutex<LatchState>);

impl StopLatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, LatchState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A stop request (never refused). Repeated stops before the control thread acts
    /// coalesce; the halt's latency counts from the first.
    pub fn stop(&self, arrived: Stamp) {
        let mut s = self.lock();
        if s.last_stop == s.seen_stop {
            s.stop_arrived = arrived;
        }
        s.seq += 1;
        s.last_stop = s.seq;
        s.published_before_stop = s.published;
    }

    /// The sequence number of the last chunk published before the last stop was latched
    /// (0: none, or no stop yet): every policy chunk numbered above it was computed and
    /// published after that stop was resumed.
    pub fn last_chunk_before_stop(&self) -> u64 {
        self.lock().published_before_stop
    }

    /// A resume request: takes effect when the control thread next looks, if no stop came
    /// after it.
    pub fn resume(&self) {
        let mut s = self.lock();
        s.seq += 1;
        s.last_resume = s.seq;
    }

    /// Whether a stop arrived that the control thread has not acted on.
    pub fn stop_pending(&self) -> bool {
        let s = self.lock();
        s.last_stop != s.seen_stop
    }

    /// Marks every request as seen and says what to do: halt if a stop arrived, then leave
    /// the halted state if a resume arrived after the last stop.
    pub fn take(&self) -> Pending {
        self.take_then(|_| {})
    }

    /// [`StopLatch::take`], then `then` with what it took, under the latch's lock: whatever
    /// `then` sets up for a stop is in place before anyone sees the stop as handled.
    pub fn take_then(&self, then: impl FnOnce(&Pending)) -> Pending {
        let mut s = self.lock();
        let stop = (s.last_stop != s.seen_stop).then_some(s.stop_arrived);
        let resume = s.last_resume != s.seen_resume && s.last_resume > s.last_stop;
        s.seen_stop = s.last_stop;
        s.seen_resume = s.last_resume;
        let p = Pending { stop, resume };
        then(&p);
        p
    }

    /// Runs `f` unless a stop is pending, under the latch's lock (a stop is latched either
    /// before `f` runs or after it). Returns whether it ran.
    pub fn unless_stopped(&self, f: impl FnOnce()) -> bool {
        let s = self.lock();
        if s.last_stop != s.seen_stop {
            return false;
        }
        f();
        true
    }

    /// Runs `publish` (which returns the chunk's sequence number) unless a stop is pending,
    /// under the latch's lock: a stop is either latched before (the chunk is withheld) or
    /// after the chunk went out, never in between. Returns whether it ran.
    pub fn publish(&self, publish: impl FnOnce() -> u64) -> bool {
        let mut s = self.lock();
        if s.last_stop != s.seen_stop {
            return false;
        }
        s.published = publish();
        true
    }
}

/// What a halt commands, per action dimension (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub enum Hold {
    /// One row of targets (position: the measured position; velocity: zeros).
    Row(Vec<f32>),
    /// No targets: the halt chunk has no rows (no fresh, finite measured position).
    NoTarget(&'static str),
}

impl Hold {
    /// What a halt commands for a robot with `dims` (see [`HoldRule`]): zero for velocity
    /// dimensions; for the others the latest measured position if `state` is fresh (stamped
    /// within `[now − max_age, now + max_future]`) and finite, else (rule `current`) the
    /// command being executed now. A dimension with neither: no targets at all.
    pub fn of(
        dims: &[ActionDim],
        state: Option<&(Stamp, Vec<f32>)>,
        current: Option<&[f32]>,
        now: Stamp,
        max_age: f64,
        max_future: f64,
    ) -> Hold {
        let measured = match state {
            None => Err("no joint state received"),
            Some((t, _)) if !fresh(*t, now, max_age, max_future) => Err("no fresh joint state"),
            Some((_, s)) => Ok(s),
        };
        let mut row = Vec::with_capacity(dims.len());
        for (k, dim) in dims.iter().enumerate() {
            let m = measured.and_then(|s| match s.get(dim.state_index) {
                Some(x) if x.is_finite() => Ok(*x),
                Some(_) => Err("joint state not finite"),
                None => Err("joint state shorter than the action"),
            });
            let x = match (dim.hold, m) {
                (HoldRule::Zero, _) => 0.0,
                (_, Ok(x)) => x,
                (HoldRule::Current, Err(why)) => match current.map(|c| c[k]) {
                    Some(x) if x.is_finite() => x,
                    _ => return Hold::NoTarget(why),
                },
                (HoldRule::Measured, Err(why)) => return Hold::NoTarget(why),
            };
            row.push(x);
        }
        Hold::Row(row)
    }

    /// The row, if there is one.
    pub fn row(&self) -> Option<&[f32]> {
        match self {
            Hold::Row(r) => Some(r),
            Hold::NoTarget(_) => None,
        }
    }
}

/// Whether an observation stamped `t` may be used at `now`: not older than `max_age`, not
/// more than `max_future` ahead (a clock out of step, a bad stamp).
pub fn fresh(t: Stamp, now: Stamp, max_age: f64, max_future: f64) -> bool {
    let age = now - t;
    age <= max_age && age >= -max_future
}

/// The first fatal problem of the process (its cause), recorded once.
#[derive(Debug, Default)]
pub struct Fault(Mutex<Option<String>>);

impl Fault {
    /// Records `cause` unless a fault is recorded already; returns whether this was the first.
    pub fn record(&self, cause: impl Into<String>) -> bool {
        let mut f = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_some() {
            return false;
        }
        *f = Some(cause.into());
        true
    }

    /// The recorded cause, if any.
    pub fn cause(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// When the running tick started (for the watchdog thread); 0 while no tick runs.
#[derive(Debug)]
pub struct Watchdog {
    base: Instant,
    started_ns: AtomicU64,
}

impl Default for Watchdog {
    fn default() -> Self {
        Watchdog {
            base: Instant::now(),
            started_ns: AtomicU64::new(0),
        }
    }
}

impl Watchdog {
    /// A tick starts now.
    pub fn enter(&self) {
        let ns = self.base.elapsed().as_nanos() as u64;
        self.started_ns.store(ns.max(1), Ordering::Release);
    }

    /// The tick ended.
    pub fn leave(&self) {
        self.started_ns.store(0, Ordering::Release);
    }

    /// How long the running tick has run (None: no tick runs).
    pub fn running_for(&self) -> Option<std::time::Duration> {
        let s = self.started_ns.load(Ordering::Acquire);
        (s != 0).then(|| {
            let now = self.base.elapsed().as_nanos() as u64;
            std::time::Duration::from_nanos(now.saturating_sub(s))
        })
    }
}

/// The text of a panic's payload.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ActionKind;

    #[test]
    fn a_stop_is_never_lost_and_a_resume_only_follows_it() {
        let l = StopLatch::default();
        assert_eq!(l.take(), Pending::default());
        // Stop then resume before the control thread looks: it halts, then resumes.
        l.stop(1.0);
        l.stop(2.0);
        l.resume();
        assert!(l.stop_pending());
        assert_eq!(
            l.take(),
            Pending {
                stop: Some(1.0),
                resume: true
            }
        );
        assert!(!l.stop_pending());
        // Resume then stop: it halts and stays halted.
        l.resume();
        l.stop(3.0);
        assert_eq!(
            l.take(),
            Pending {
                stop: Some(3.0),
                resume: false
            }
        );
        assert_eq!(l.take(), Pending::default());
    }

    #[test]
    fn nothing_is_published_while_a_stop_is_pending() {
        let l = StopLatch::default();
        let mut n = 0;
        let mut chunk = || {
            n += 1;
            n
        };
        assert!(l.publish(&mut chunk));
        assert_eq!(l.last_chunk_before_stop(), 0, "no stop yet");
        l.stop(0.0);
        assert!(!l.publish(&mut chunk));
        assert_eq!(l.last_chunk_before_stop(), 1);
        l.take();
        assert!(l.publish(&mut chunk));
        assert_eq!(n, 2);
        assert_eq!(l.last_chunk_before_stop(), 1);
    }

    fn dims(kinds: &[(ActionKind, HoldRule)]) -> Vec<ActionDim> {
        kinds
            .iter()
            .enumerate()
            .map(|(k, (kind, hold))| ActionDim {
                joint: format!("j{k}"),
                // The state lists the joints in another order: dimension k is joint 2 − k.
                state_index: 2 - k,
                kind: *kind,
                delta: false,
                min: -5.0,
                max: 5.0,
                max_delta: None,
                hold: *hold,
            })
            .collect()
    }

    #[test]
    fn the_position_hold_is_the_fresh_finite_measured_state() {
        let p = dims(&[(ActionKind::Position, HoldRule::Measured); 2]);
        let s = (10.0, vec![1.0, -0.25, 0.5]);
        let h =
            |s: Option<&(Stamp, Vec<f32>)>, now| Hold::of(&p, s, Some(&[3.0, 3.0]), now, 0.2, 0.05);
        assert_eq!(
            h(Some(&s), 10.1),
            Hold::Row(vec![0.5, -0.25]),
            "by joint, not by index"
        );
        assert!(matches!(h(None, 10.0), Hold::NoTarget(_)));
        assert!(matches!(h(Some(&s), 10.3), Hold::NoTarget(_)), "stale");
        assert!(matches!(h(Some(&s), 9.9), Hold::NoTarget(_)), "future");
        let inf = (10.0, vec![0.0, 0.0, f32::INFINITY]);
        assert!(matches!(h(Some(&inf), 10.0), Hold::NoTarget(_)));
    }

    #[test]
    fn a_velocity_and_gripper_hold_is_zero_and_the_gripper_where_it_is() {
        let v = dims(&[
            (ActionKind::Velocity, HoldRule::Zero),
            (ActionKind::Velocity, HoldRule::Zero),
            (ActionKind::Gripper, HoldRule::Current),
        ]);
        let s = (10.0, vec![0.8, 0.3, -0.3]);
        let current = [0.4, -0.4, 0.2];
        let h =
            |s: Option<&(Stamp, Vec<f32>)>, c: Option<&[f32]>| Hold::of(&v, s, c, 10.0, 0.2, 0.05);
        assert_eq!(h(Some(&s), Some(&current)), Hold::Row(vec![0.0, 0.0, 0.8]));
        // No fresh state: the gripper keeps the command it is executing; the joints stop.
        assert_eq!(h(None, Some(&current)), Hold::Row(vec![0.0, 0.0, 0.2]));
        assert!(matches!(h(None, None), Hold::NoTarget(_)));
    }
}
