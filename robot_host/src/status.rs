//! The node's status on a timer of its own: a thread publishes a snapshot every
//! `ros.status_period_s`, however slow or stuck the ticks are. It combines what the control
//! thread last posted on the `Board` (after every tick, without allocating), the inputs'
//! live counters, each input's rate and age (`Meters`) and, per counter, its count over the
//! last `ros.status_window_s` seconds beside the total ([`Window`]): a problem that stopped
//! leaves the window, and the levels derived from it recover.

use crate::messages::{Stamp, Status};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One input's activity: messages accepted, their rate over the window, the age of the newest.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InputActivity {
    /// `camera <name>`, `state` or `audio`.
    pub name: String,
    /// Messages accepted since start.
    pub count: u64,
    /// Accepted messages per second over the window (NaN: not measured).
    pub rate_hz: f64,
    /// Node-clock seconds since the newest accepted message's stamp (∞: none yet).
    pub age_s: f64,
    /// Older than the observation age bound (a tick would not use it).
    pub stale: bool,
}

/// The counters over the last window, beside the totals of [`Status`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Recent {
    /// Ticks skipped for missing or stale observations.
    pub stale: u64,
    /// Inputs refused (frames, states, audio, commands).
    pub bad_inputs: u64,
    pub deadline_misses: u64,
    /// Chunks withheld: non-finite, late, or a joint measured too far outside its limits.
    pub withheld: u64,
    pub halts: u64,
}

/// The totals a window subtracts (one per [`Recent`] field, then one per input).
#[derive(Clone, Debug, Default, PartialEq)]
struct Totals {
    recent: Recent,
    inputs: Vec<u64>,
}

impl Totals {
    fn of(s: &Status) -> Totals {
        Totals {
            recent: Recent {
                stale: s.stale,
                bad_inputs: s.bad_frames + s.bad_states + s.bad_audio + s.bad_commands,
                deadline_misses: s.deadline_misses,
                withheld: s.non_finite + s.late_chunks + s.outside_limits,
                halts: s.halts,
            },
            inputs: s.inputs.iter().map(|i| i.count).collect(),
        }
    }
}

/// Counts over a sliding window of `span`: each [`Window::observe`] compares the totals with
/// the oldest ones seen within the span (at first, zeros at the window's start: what happened
/// before it counts as recent).
pub struct Window {
    span: Duration,
    history: VecDeque<(Instant, Totals)>,
}

impl Window {
    pub fn new(span: Duration, start: Instant) -> Window {
        Window {
            span,
            history: VecDeque::from([(start, Totals::default())]),
        }
    }

    /// Fills `s.recent`, `s.window_s` and each input's rate from the totals in `s`, observed
    /// at `now`.
    pub fn observe(&mut self, now: Instant, s: &mut Status) {
        let totals = Totals::of(s);
        // Keep the newest entry at or before the window's start as the baseline.
        while self.history.len() > 1 && now.duration_since(self.history[1].0) >= self.span {
            self.history.pop_front();
        }
        let (t0, base) = match self.history.front() {
            Some((t, b)) => (*t, b.clone()),
            None => (now, Totals::default()),
        };
        let elapsed = now.duration_since(t0).as_secs_f64();
        let (r, b) = (&totals.recent, &base.recent);
        s.recent = Recent {
            stale: r.stale.saturating_sub(b.stale),
            bad_inputs: r.bad_inputs.saturating_sub(b.bad_inputs),
            deadline_misses: r.deadline_misses.saturating_sub(b.deadline_misses),
            withheld: r.withheld.saturating_sub(b.withheld),
            halts: r.halts.saturating_sub(b.halts),
        };
        s.window_s = elapsed;
        for (k, input) in s.inputs.iter_mut().enumerate() {
            let before = base.inputs.get(k).copied().unwrap_or(0);
            input.rate_hz = if elapsed > 0.0 {
                input.count.saturating_sub(before) as f64 / elapsed
            } else {
                f64::NAN
            };
        }
        self.history.push_back((now, totals));
    }
}

/// Per input, the messages accepted and the newest one's stamp (written on the I/O threads).
pub(crate) struct Meters {
    names: Vec<String>,
    counts: Vec<AtomicU64>,
    /// `f64` bits of the newest stamp (NaN: none yet).
    stamps: Vec<AtomicU64>,
    /// Which inputs a tick needs fresh (cameras, state; not audio).
    observed: Vec<bool>,
}

impl Meters {
    pub fn new(inputs: Vec<(String, bool)>) -> Meters {
        let n = inputs.len();
        let (names, observed) = inputs.into_iter().unzip();
        Meters {
            names,
            counts: (0..n).map(|_| AtomicU64::new(0)).collect(),
            stamps: (0..n).map(|_| AtomicU64::new(f64::NAN.to_bits())).collect(),
            observed,
        }
    }

    /// Input `i` accepted a message stamped `stamp`.
    pub fn record(&self, i: usize, stamp: Stamp) {
        if let (Some(c), Some(s)) = (self.counts.get(i), self.stamps.get(i)) {
            c.fetch_add(1, Ordering::Relaxed);
            s.store(stamp.to_bits(), Ordering::Relaxed);
        }
    }

    /// Each input's count and age at `now` (rates not measured: NaN).
    pub fn activity(&self, now: Stamp, max_age: f64) -> Vec<InputActivity> {
        (0..self.names.len())
            .map(|i| {
                let stamp = f64::from_bits(self.stamps[i].load(Ordering::Relaxed));
                let age_s = if stamp.is_nan() {
                    f64::INFINITY
                } else {
                    now - stamp
                };
                InputActivity {
                    name: self.names[i].clone(),
                    count: self.counts[i].load(Ordering::Relaxed),
                    rate_hz: f64::NAN,
                    age_s,
                    stale: self.observed[i] && (age_s > max_age || age_s.is_nan()),
                }
            })
            .collect()
    }
}

/// What the control thread last posted, and when it last finished a tick.
#[derive(Default)]
pub(crate) struct Board {
    posted: Mutex<(Status, Option<Instant>)>,
}

impl Board {
    /// Copies the control thread's status in (skipped when the status thread holds the lock:
    /// the next tick posts again). `ticked`: a tick just finished. Allocates nothing once the
    /// strings have grown to their lengths.
    pub fn post(&self, s: &Status, subgoal: &str, ticked: bool) {
        if let Ok(mut p) = self.posted.try_lock() {
            p.0.copy_counters_from(s);
            if p.0.subgoal != subgoal {
                p.0.subgoal.clear();
                p.0.subgoal.push_str(subgoal);
            }
            if ticked {
                p.1 = Some(Instant::now());
            }
        }
    }

    /// Replaces the latency summary (the control thread computes it now and then).
    pub fn post_latency(&self, latency: Vec<(String, f64, f64, u64)>) {
        if let Ok(mut p) = self.posted.lock() {
            p.0.latency = latency;
        }
    }

    /// The posted status and the seconds since the last tick finished.
    pub fn snapshot(&self) -> (Status, f64) {
        let p = self.posted.lock().unwrap_or_else(|e| e.into_inner());
        (p.0.clone(), Self::since(p.1))
    }

    /// Seconds since the last tick finished (∞: none yet).
    pub fn since_tick(&self) -> f64 {
        Self::since(self.posted.lock().unwrap_or_else(|e| e.into_inner()).1)
    }

    fn since(t: Option<Instant>) -> f64 {
        t.map_or(f64::INFINITY, |t| t.elapsed().as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(halts: u64, counts: &[u64]) -> Status {
        Status {
            halts,
            inputs: counts
                .iter()
                .map(|&count| InputActivity {
                    count,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_window_counts_what_happened_within_its_span() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = Window::new(Duration::from_secs(1), at(0));
        let mut s = status(2, &[10]);
        w.observe(at(0), &mut s);
        assert_eq!((s.recent.halts, s.window_s), (2, 0.0), "since the start");
        assert!(s.inputs[0].rate_hz.is_nan(), "no span yet");
        let mut s = status(3, &[15]);
        w.observe(at(500), &mut s);
        assert_eq!(s.recent.halts, 3);
        assert!((s.inputs[0].rate_hz - 30.0).abs() < 1e-9);
        // A full span: the counts since the observation at 0 s.
        let mut s = status(3, &[20]);
        w.observe(at(1000), &mut s);
        assert_eq!((s.recent.halts, s.window_s), (1, 1.0));
        assert!((s.inputs[0].rate_hz - 10.0).abs() < 1e-9);
        // The halt at 0.5 s leaves the window: its count drops, the total stays.
        let mut s = status(3, &[30]);
        w.observe(at(1600), &mut s);
        assert_eq!((s.recent.halts, s.halts), (0, 3));
        assert!(
            (s.inputs[0].rate_hz - 15.0 / 1.1).abs() < 1e-9,
            "{}",
            s.inputs[0].rate_hz
        );
    }

    #[test]
    fn meters_report_age_and_staleness() {
        let m = Meters::new(vec![("camera a".into(), true), ("audio".into(), false)]);
        let a = m.activity(10.0, 0.5);
        assert_eq!(a[0].age_s, f64::INFINITY);
        assert!(a[0].stale && !a[1].stale, "audio is never needed fresh");
        m.record(0, 9.8);
        m.record(0, 9.9);
        let a = m.activity(10.0, 0.5);
        assert_eq!(a[0].count, 2);
        assert!((a[0].age_s - 0.1).abs() < 1e-9 && !a[0].stale);
        assert!(m.activity(11.0, 0.5)[0].stale);
    }
}
