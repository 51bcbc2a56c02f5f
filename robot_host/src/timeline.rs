//! The chunk time model: when each row of a chunk is due, which row is due now, how a new
//! chunk takes over from the one being executed, and the limits applied along the way.
//!
//! A chunk observed at `t_obs` (its stamp: the oldest observation it was computed from) has
//! row k due at `t_obs + k·dt`. By the time it is published, the rows due before then are in
//! the past (the inference latency): [`first_due_row`] is the first row that is not. The node
//! keeps one [`Timeline`]: the commands the robot executes, row j due at `start + j·dt`, and
//! before `start` the command in effect when the timeline was last replaced. A new chunk's
//! rows from its first due row on are merged into it ([`Timeline::merge`]) by the configured
//! hand-over:
//!
//! * `replace`: the new rows replace the old from the new chunk's first due row on;
//! * `crossfade` over W rows: row j (j < W) is `old + (j+1)/(W+1) · (new − old)`, where `old`
//!   is the old timeline at row j's due time (linear between its rows), then the new rows;
//! * `temporal_ensemble` with decay m: each row is the weighted mean of every prediction made
//!   for its time, the i-th prediction (0: the oldest) weighing `exp(−m·i)` (ACT's temporal
//!   ensembling, computed online as LeRobot does).
//!
//! After the hand-over every row is clamped to its dimension's limits and capped per step
//! ([`guard`]), starting from the anchor: the command in effect just before the new rows
//! begin (the old timeline's row due then), or, when no timeline covers that time (start, a
//! resume, a gap), the measured position (position and gripper dimensions) or zero
//! (velocity). A timeline never starts from a row ahead of the one being executed.
//!
//! Example: crossfade over 3 rows, one dimension, the old timeline at 0.0 on every row, the
//! new chunk at 1.0: the commands are 0.25, 0.5, 0.75, 1.0, 1.0, …

use crate::config::{ActionDim, ActionKind, HandoverKind};
use crate::messages::Stamp;

/// Tolerance on row times, in rows (stamps are f64 seconds; a row due "now" stays due).
const ROW_EPS: f64 = 1e-6;

/// How a new chunk takes over (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Handover {
    Replace,
    Crossfade { rows: usize },
    TemporalEnsemble { decay: f64 },
}

impl Handover {
    pub fn from_config(e: &crate::config::ExecutionConfig) -> Handover {
        match e.handover {
            HandoverKind::Replace => Handover::Replace,
            HandoverKind::Crossfade => Handover::Crossfade {
                rows: e.crossfade_rows,
            },
            HandoverKind::TemporalEnsemble => Handover::TemporalEnsemble {
                decay: e.ensemble_decay,
            },
        }
    }
}

/// The first row of a chunk observed at `t_obs` that is not in the past at `now` (rows due
/// exactly now count as due). May be beyond the chunk's last row.
pub fn first_due_row(t_obs: Stamp, now: Stamp, dt: f64) -> usize {
    let x = (now - t_obs) / dt;
    if x.is_nan() || x <= ROW_EPS {
        0
    } else {
        (x - ROW_EPS).ceil().min(u32::MAX as f64) as usize
    }
}

/// Clamps every row of `rows` (`dims.len()` values each) to its dimension's limits and caps
/// the change between consecutive rows, the first against `anchor`. Returns the number of
/// values changed.
pub fn guard(rows: &mut [f32], anchor: &[f32], dims: &[ActionDim]) -> u64 {
    let d = dims.len();
    let mut changed = 0;
    for r in 0..rows.len() / d {
        let (done, rest) = rows.split_at_mut(r * d);
        let prev = if r == 0 { anchor } else { &done[(r - 1) * d..] };
        changed += limit_row(&mut rest[..d], prev, dims);
    }
    changed
}

/// Clamps `row` to the limits and within each dimension's step cap of `prev`; returns the
/// number of values changed. Clamped into the limits first, then towards `prev`: with `prev`
/// inside the limits the result stays inside them.
fn limit_row(row: &mut [f32], prev: &[f32], dims: &[ActionDim]) -> u64 {
    let mut changed = 0;
    for ((x, p), dim) in row.iter_mut().zip(prev).zip(dims) {
        let mut y = x.clamp(dim.min, dim.max);
        if let Some(cap) = dim.max_delta {
            y = y.clamp(p - cap, p + cap);
        }
        if y != *x {
            changed += 1;
            *x = y;
        }
    }
    changed
}

/// Guards a whole chunk whose row `due` is the first one executed: rows from `due` on are
/// guarded forward from `anchor` ([`guard`]), the rows before it (in the past, never
/// executed) clamped and capped backwards from row `due`, so that the chunk read from its
/// first row has no step beyond the caps either.
pub fn guard_chunk(chunk: &mut [f32], due: usize, anchor: &[f32], dims: &[ActionDim]) -> u64 {
    let d = dims.len();
    let due = due.min(chunk.len() / d);
    let (past, ahead) = chunk.split_at_mut(due * d);
    let mut changed = guard(ahead, anchor, dims);
    for r in (0..due).rev() {
        let (row, later) = past.split_at_mut((r + 1) * d);
        let next = if r + 1 == due {
            ahead.get(..d).unwrap_or(anchor)
        } else {
            &later[..d]
        };
        changed += limit_row(&mut row[r * d..], next, dims);
    }
    changed
}

/// What the timeline commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// No chunk yet (or since a resume): nothing to command.
    Empty,
    /// Rows to execute.
    Running,
    /// Halted: the hold row (`hold`), or no targets at all (`false`).
    Holding(bool),
}

/// The commands the robot executes over time (see the module docs). Every buffer is sized
/// at construction: merging and reading allocate nothing.
#[derive(Clone, Debug)]
pub struct Timeline {
    d: usize,
    dt: f64,
    handover: Handover,
    mode: Mode,
    /// Row j is due at `start + j·dt`, for j < `len`.
    start: Stamp,
    /// The observation time of the chunk last merged.
    observed: Stamp,
    len: usize,
    rows: Vec<f32>,
    /// The command in effect before `start` (the anchor of the last merge).
    before: Vec<f32>,
    /// Temporal ensembling: per row, the sum of the weights of its predictions and their
    /// number.
    weights: Vec<f64>,
    counts: Vec<u32>,
    /// The hold row while halted (`Holding(true)`); after [`Timeline::stop`], until the hold
    /// is known, the command that was in effect (`saved`).
    hold: Vec<f32>,
    saved: bool,
    /// Scratch for a merge (swapped with the above).
    next_rows: Vec<f32>,
    next_weights: Vec<f64>,
    next_counts: Vec<u32>,
}

impl Timeline {
    /// A timeline for chunks of at most `horizon` rows of `d` values, `dt` seconds apart.
    pub fn new(horizon: usize, d: usize, dt: f64, handover: Handover) -> Timeline {
        Timeline {
            d,
            dt,
            handover,
            mode: Mode::Empty,
            start: 0.0,
            observed: 0.0,
            len: 0,
            rows: vec![0.0; horizon * d],
            before: vec![0.0; d],
            weights: vec![0.0; horizon],
            counts: vec![0; horizon],
            hold: vec![0.0; d],
            saved: false,
            next_rows: vec![0.0; horizon * d],
            next_weights: vec![0.0; horizon],
            next_counts: vec![0; horizon],
        }
    }

    /// When the first row is due.
    pub fn start(&self) -> Stamp {
        self.start
    }

    /// The rows to execute from [`Timeline::start`] on (empty unless running).
    pub fn rows(&self) -> &[f32] {
        match self.mode {
            Mode::Running => &self.rows[..self.len * self.d],
            _ => &[],
        }
    }

    /// Whether chunks are being executed (not empty, not halted).
    pub fn is_running(&self) -> bool {
        self.mode == Mode::Running
    }

    /// Forgets every row (a resume, a clock reset): the next chunk starts from the robot.
    pub fn clear(&mut self) {
        self.mode = Mode::Empty;
        self.saved = false;
        self.len = 0;
    }

    /// Halted at `t`, the hold not known yet: nothing is commanded until
    /// [`Timeline::hold`]; the command in effect at `t` is kept for [`Timeline::current`].
    pub fn stop(&mut self, t: Stamp, dims: &[ActionDim]) {
        let mut cur = std::mem::take(&mut self.next_rows);
        self.saved = self.command_at(t, dims, &mut cur[..self.d]).is_some();
        self.hold.copy_from_slice(&cur[..self.d]);
        self.next_rows = cur;
        self.mode = Mode::Holding(false);
        self.len = 0;
    }

    /// Halted, commanding `row` (or nothing).
    pub fn hold(&mut self, row: Option<&[f32]>) {
        if let Some(r) = row {
            self.hold.copy_from_slice(r);
        }
        self.saved = false;
        self.mode = Mode::Holding(row.is_some());
        self.len = 0;
    }

    /// The command in effect at `t` (see [`Timeline::command_at`]), or, right after a stop,
    /// the one in effect when it was handled; false when there is none.
    pub fn current(&self, t: Stamp, dims: &[ActionDim], out: &mut [f32]) -> bool {
        if self.mode == Mode::Holding(false) {
            if self.saved {
                out.copy_from_slice(&self.hold);
            }
            return self.saved;
        }
        self.command_at(t, dims, out).is_some()
    }

    /// The index of the row due at `t` (row j from `start + j·dt` until the next is due),
    /// while running and `t` is within the rows.
    pub fn due_index(&self, t: Stamp) -> Option<usize> {
        if self.mode != Mode::Running {
            return None;
        }
        let x = (t - self.start) / self.dt;
        if x.is_nan() || x <= -ROW_EPS {
            return None;
        }
        let j = (x + ROW_EPS).floor() as usize;
        (j < self.len).then_some(j)
    }

    /// The row due at `t` ([`Timeline::due_index`]).
    pub fn row_at(&self, t: Stamp) -> Option<&[f32]> {
        let j = self.due_index(t)?;
        Some(&self.rows[j * self.d..(j + 1) * self.d])
    }

    /// The command at `t` for a robot with `dims`: the hold while halted (None: no targets),
    /// the command in effect before the first row, the row due, and past the last row the
    /// last row's positions with zero velocities (nothing newer arrived: motion stops where
    /// it was headed). `None` also before any chunk. The bool says whether it is a hold.
    pub fn command_at(&self, t: Stamp, dims: &[ActionDim], out: &mut [f32]) -> Option<bool> {
        match self.mode {
            Mode::Empty | Mode::Holding(false) => None,
            Mode::Holding(true) => {
                out.copy_from_slice(&self.hold);
                Some(true)
            }
            Mode::Running => {
                if let Some(r) = self.row_at(t) {
                    out.copy_from_slice(r);
                } else if t < self.start {
                    out.copy_from_slice(&self.before);
                } else {
                    let last = &self.rows[(self.len - 1) * self.d..self.len * self.d];
                    for ((o, x), dim) in out.iter_mut().zip(last).zip(dims) {
                        *o = if dim.kind == ActionKind::Velocity {
                            0.0
                        } else {
                            *x
                        };
                    }
                }
                Some(false)
            }
        }
    }

    /// The command a new chunk whose first row is due at `t_due` takes over from, at `now`
    /// (`now ≤ t_due`): the one in effect just before `t_due`, or, when `t_due` is now, the
    /// one due now (it may have been commanded already). None when not running or past the
    /// last row.
    pub fn command_before(&self, t_due: Stamp, now: Stamp) -> Option<&[f32]> {
        if self.mode != Mode::Running {
            return None;
        }
        let t = if t_due > now {
            t_due - 1e-3 * self.dt
        } else {
            now
        };
        if t < self.start {
            return Some(&self.before);
        }
        self.row_at(t)
    }

    /// The observation time of the chunk last merged (None: none since the last clear or
    /// halt).
    pub fn last_observation(&self) -> Option<Stamp> {
        (self.mode == Mode::Running).then_some(self.observed)
    }

    /// The old timeline at `t`, linear between its rows (None outside them).
    fn interpolate(&self, t: Stamp, k: usize) -> Option<f32> {
        if self.mode != Mode::Running || self.len == 0 {
            return None;
        }
        let x = (t - self.start) / self.dt;
        if x.is_nan() || x <= -ROW_EPS || x > (self.len - 1) as f64 + ROW_EPS {
            return None;
        }
        let j = (x.floor().max(0.0) as usize).min(self.len - 1);
        let f = (x - j as f64).clamp(0.0, 1.0) as f32;
        let a = self.rows[j * self.d + k];
        if j + 1 < self.len && f > 0.0 {
            Some(a + f * (self.rows[(j + 1) * self.d + k] - a))
        } else {
            Some(a)
        }
    }

    /// The old timeline's row nearest `t` (for the ensemble's weights), within half a row.
    fn nearest(&self, t: Stamp) -> Option<usize> {
        if self.mode != Mode::Running || self.len == 0 {
            return None;
        }
        let x = ((t - self.start) / self.dt).round();
        (x >= 0.0 && x < self.len as f64).then_some(x as usize)
    }

    /// Takes over with `new` (rows due from `t_new` on, `dt` apart, of a chunk observed at
    /// `t_obs`) by the hand-over, then guards the result from `anchor` (the command in effect
    /// before `t_new`, see the module docs). Returns the values the guard changed.
    pub fn merge(
        &mut self,
        new: &[f32],
        t_new: Stamp,
        t_obs: Stamp,
        anchor: &[f32],
        dims: &[ActionDim],
    ) -> u64 {
        let d = self.d;
        let n = (new.len() / d).min(self.rows.len() / d);
        for j in 0..n {
            let t = t_new + j as f64 * self.dt;
            let near = self.nearest(t);
            for k in 0..d {
                let x = new[j * d + k];
                let old = self.interpolate(t, k);
                self.next_rows[j * d + k] = match (self.handover, old) {
                    (Handover::Crossfade { rows }, Some(o)) if j < rows => {
                        let w = (j + 1) as f32 / (rows + 1) as f32;
                        o + w * (x - o)
                    }
                    (Handover::TemporalEnsemble { decay }, Some(o)) => {
                        let (w_old, c) =
                            near.map_or((1.0, 1), |i| (self.weights[i], self.counts[i]));
                        let w_new = (-decay * c as f64).exp();
                        ((o as f64 * w_old + x as f64 * w_new) / (w_old + w_new)) as f32
                    }
                    _ => x,
                };
            }
            let (w, c) = match (self.handover, near) {
                (Handover::TemporalEnsemble { decay }, Some(i))
                    if self.interpolate(t, 0).is_some() =>
                {
                    let c = self.counts[i];
                    (self.weights[i] + (-decay * c as f64).exp(), c + 1)
                }
                _ => (1.0, 1),
            };
            self.next_weights[j] = w;
            self.next_counts[j] = c;
        }
        let changed = guard(&mut self.next_rows[..n * d], anchor, dims);
        std::mem::swap(&mut self.rows, &mut self.next_rows);
        std::mem::swap(&mut self.weights, &mut self.next_weights);
        std::mem::swap(&mut self.counts, &mut self.next_counts);
        self.before.copy_from_slice(anchor);
        self.start = t_new;
        self.observed = t_obs;
        self.len = n;
        self.mode = if n > 0 { Mode::Running } else { Mode::Empty };
        changed
    }
}

/// Fixed-rate command times: slot i due at `first + i·period`; a caller that comes late is
/// served once, for the latest slot due, and the slots it skipped are counted.
#[derive(Clone, Debug)]
pub struct CommandClock {
    period: f64,
    /// The first slot's time and the next slot's index.
    schedule: Option<(Stamp, u64)>,
    /// Slots skipped because the caller came late by more than one period.
    pub missed: u64,
}

impl CommandClock {
    pub fn new(rate_hz: f64) -> CommandClock {
        CommandClock {
            period: 1.0 / rate_hz,
            schedule: None,
            missed: 0,
        }
    }

    pub fn period(&self) -> f64 {
        self.period
    }

    /// Whether a command is due at `now`; the first call starts the schedule. A clock that
    /// jumped backwards (by more than two periods) restarts it.
    pub fn due(&mut self, now: Stamp) -> bool {
        let p = self.period;
        let Some((first, n)) = self.schedule else {
            self.schedule = Some((now, 1));
            return true;
        };
        let next = first + n as f64 * p;
        if now < next - 2.0 * p {
            self.schedule = Some((now, 1));
            return true;
        }
        // Slot times are computed from the first, never accumulated: no drift.
        if now < next - 1e-9 * p.max(1.0) {
            return false;
        }
        let latest = (((now - first) / p) + 1e-6).floor().max(n as f64) as u64;
        self.missed += latest - n;
        self.schedule = Some((first, latest + 1));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HoldRule;

    fn dims(n: usize, kind: ActionKind, cap: Option<f32>) -> Vec<ActionDim> {
        (0..n)
            .map(|k| ActionDim {
                joint: format!("j{k}"),
                state_index: k,
                kind,
                delta: false,
                min: -10.0,
                max: 10.0,
                max_delta: cap,
                hold: HoldRule::Measured,
            })
            .collect()
    }

    #[test]
    fn rows_in_the_past_are_those_due_before_now() {
        assert_eq!(first_due_row(10.0, 10.0, 0.1), 0);
        assert_eq!(first_due_row(10.0, 9.0, 0.1), 0, "observation ahead of now");
        assert_eq!(first_due_row(10.0, 10.2, 0.1), 2, "row 2 due exactly now");
        assert_eq!(first_due_row(10.0, 10.2000001, 0.1), 3);
        assert_eq!(first_due_row(10.0, 10.15, 0.1), 2);
        assert_eq!(first_due_row(10.0, 10.0 + 1e-9, 0.1), 0);
    }

    #[test]
    fn the_row_due_follows_the_clock() {
        let d = dims(1, ActionKind::Position, None);
        let mut t = Timeline::new(5, 1, 0.1, Handover::Replace);
        assert_eq!(t.row_at(0.0), None);
        t.merge(&[1.0, 2.0, 3.0], 10.0, 10.0, &[0.0], &d);
        assert_eq!(t.row_at(9.99), None);
        assert_eq!(t.due_index(10.0), Some(0));
        assert_eq!(t.due_index(10.05), Some(0));
        assert_eq!(t.due_index(10.1), Some(1));
        assert_eq!(t.due_index(10.29), Some(2));
        assert_eq!(t.due_index(10.3), None);
        let mut out = [0.0];
        assert_eq!(t.command_at(9.95, &d, &mut out), Some(false));
        assert_eq!(out, [0.0], "before the first row: the anchor");
        t.command_at(10.25, &d, &mut out);
        assert_eq!(out, [3.0]);
        t.command_at(11.0, &d, &mut out);
        assert_eq!(out, [3.0], "past the end a position holds the last row");
        let v = dims(1, ActionKind::Velocity, None);
        t.command_at(11.0, &v, &mut out);
        assert_eq!(out, [0.0], "past the end a velocity is zero");
    }

    #[test]
    fn crossfade_blends_over_its_window() {
        let d = dims(1, ActionKind::Position, None);
        let mut t = Timeline::new(10, 1, 0.1, Handover::Crossfade { rows: 3 });
        t.merge(&[0.0; 10], 0.0, 0.0, &[0.0], &d);
        t.merge(&[1.0; 8], 0.2, 0.2, &[0.0], &d);
        assert_eq!(t.rows(), &[0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0]);
        // Where the old timeline has ended, the new rows are taken as they are.
        t.merge(&[2.0; 8], 0.9, 0.9, &[1.0], &d);
        assert_eq!(t.rows()[0], 2.0 - 0.75, "old row 7 still exists at 0.9");
        assert_eq!(t.rows()[1], 2.0, "no old row at 1.0: the new row");
    }

    #[test]
    fn crossfade_interpolates_between_old_rows_off_the_grid() {
        let d = dims(1, ActionKind::Position, None);
        let mut t = Timeline::new(10, 1, 0.1, Handover::Crossfade { rows: 1 });
        t.merge(&[0.0, 1.0, 2.0, 3.0], 0.0, 0.0, &[0.0], &d);
        t.merge(&[5.0, 5.0], 0.15, 0.15, &[1.0], &d);
        // old at 0.15 = 1.5; w = 1/2
        assert!((t.rows()[0] - 3.25).abs() < 1e-6, "{:?}", t.rows());
        assert_eq!(t.rows()[1], 5.0);
    }

    #[test]
    fn temporal_ensemble_weighs_each_prediction() {
        let d = dims(1, ActionKind::Position, None);
        let m = 0.5f64;
        let mut t = Timeline::new(10, 1, 0.1, Handover::TemporalEnsemble { decay: m });
        t.merge(&[0.0; 4], 0.0, 0.0, &[0.0], &d);
        t.merge(&[1.0; 4], 0.1, 0.1, &[0.0], &d);
        // Rows at 0.1..0.3: two predictions, weights 1 and e^-m.
        let w1 = (-m).exp();
        let two = (w1 / (1.0 + w1)) as f32;
        assert!((t.rows()[0] - two).abs() < 1e-6);
        assert_eq!(t.rows()[3], 1.0, "only the new chunk predicts 0.4");
        t.merge(&[4.0; 4], 0.2, 0.2, &[0.0], &d);
        let w2 = (-2.0 * m).exp();
        let three = ((w1 + 4.0 * w2) / (1.0 + w1 + w2)) as f32;
        assert!(
            (t.rows()[0] - three).abs() < 1e-5,
            "{} {three}",
            t.rows()[0]
        );
    }

    #[test]
    fn the_guard_starts_from_the_anchor_and_clamps() {
        let mut d = dims(2, ActionKind::Position, Some(0.25));
        d[1].min = -0.05;
        let mut rows = [1.0, -1.0, 1.0, -1.0];
        let n = guard(&mut rows, &[0.5, 0.0], &d);
        assert_eq!(rows, [0.75, -0.05, 1.0, -0.05]);
        assert_eq!(n, 3);
        // The rows before the due one are capped backwards from it.
        let mut chunk = [5.0, 5.0, 0.0, 0.0, 0.0, 0.0];
        let d1 = dims(2, ActionKind::Position, Some(0.5));
        guard_chunk(&mut chunk, 1, &[0.0, 0.0], &d1);
        assert_eq!(chunk, [0.5, 0.5, 0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn the_command_clock_keeps_its_period() {
        let mut c = CommandClock::new(100.0);
        let mut times = Vec::new();
        let mut now = 0.0;
        while now < 0.1 {
            if c.due(now) {
                times.push(now);
            }
            now += 0.001;
        }
        assert_eq!(times.len(), 10, "{times:?}");
        // Late: one command for the latest slot, the others counted as missed.
        assert!(c.due(0.145));
        assert_eq!(c.missed, 4, "0.10 to 0.13 missed, 0.14 served late");
        assert!(!c.due(0.146));
        assert!(c.due(0.15));
    }
}
