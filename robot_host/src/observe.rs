//! What the node records about its own timing: latency histograms per stage (fixed memory,
//! no allocation when recording) and an optional Chrome / Perfetto trace of ticks
//! (`chrome://tracing`, `ui.perfetto.dev`).

use std::time::{Duration, Instant};

/// Buckets per power of two (quantiles are within ~19 % of the true value, reported at the
/// bucket's geometric middle).
const SUB: f64 = 4.0;
const BUCKETS: usize = 160;

/// A latency histogram on a log scale from 1 µs to beyond an hour.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: [u64; BUCKETS],
    total: u64,
    max: Duration,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: [0; BUCKETS],
            total: 0,
            max: Duration::ZERO,
        }
    }
}

impl Histogram {
    pub fn record(&mut self, d: Duration) {
        let us = d.as_secs_f64() * 1e6;
        let b = ((us.max(1.0)).log2() * SUB).floor() as usize;
        self.counts[b.min(BUCKETS - 1)] += 1;
        self.total += 1;
        self.max = self.max.max(d);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// The `q` quantile (0..=1; 1 is the exact maximum); zero when empty.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.total == 0 {
            return Duration::ZERO;
        }
        if q >= 1.0 {
            return self.max;
        }
        let want = ((self.total as f64 * q).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (b, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                let us = 2f64.powf((b as f64 + 0.5) / SUB);
                return Duration::from_secs_f64(us / 1e6).min(self.max);
            }
        }
        self.max
    }
}

/// The stages the node times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    /// A whole published tick.
    Tick = 0,
    /// Observations taken, prompt and noise built, inputs written.
    Prepare = 1,
    /// Replays enqueued until the last one finished.
    Device = 2,
    /// Chunk read, guarded, published.
    Finish = 3,
    /// A stop until its halt chunk was published.
    Halt = 4,
}

pub const SPANS: [(Span, &str); 5] = [
    (Span::Tick, "tick"),
    (Span::Prepare, "prepare"),
    (Span::Device, "device"),
    (Span::Finish, "finish"),
    (Span::Halt, "halt"),
];

/// A Chrome trace event ("complete" event).
#[derive(Clone, Copy, Debug)]
struct Event {
    name: &'static str,
    start_us: f64,
    dur_us: f64,
}

/// Records spans into histograms and, when enabled, into a trace (capacity fixed up front;
/// events past it are counted, not stored).
pub struct Recorder {
    pub hist: [Histogram; 5],
    origin: Instant,
    trace: Option<Vec<Event>>,
    dropped: u64,
}

impl Recorder {
    /// `trace_capacity`: events to keep for a trace file (0: no trace).
    pub fn new(trace_capacity: usize) -> Recorder {
        Recorder {
            hist: Default::default(),
            origin: Instant::now(),
            trace: (trace_capacity > 0).then(|| Vec::with_capacity(trace_capacity)),
            dropped: 0,
        }
    }

    /// A span from `start` to `end`; `name` labels it in the trace (e.g. a stage).
    pub fn span(&mut self, kind: Span, name: &'static str, start: Instant, end: Instant) {
        let d = end.saturating_duration_since(start);
        self.hist[kind as usize].record(d);
        self.event(name, start, end);
    }

    /// A trace-only event (e.g. one replay).
    pub fn event(&mut self, name: &'static str, start: Instant, end: Instant) {
        if let Some(t) = &mut self.trace {
            if t.len() < t.capacity() {
                t.push(Event {
                    name,
                    start_us: start.saturating_duration_since(self.origin).as_secs_f64() * 1e6,
                    dur_us: end.saturating_duration_since(start).as_secs_f64() * 1e6,
                });
            } else {
                self.dropped += 1;
            }
        }
    }

    /// (name, p50 ms, p99 ms, count) of every span kind seen so far.
    pub fn summary(&self) -> Vec<(String, f64, f64, u64)> {
        SPANS
            .iter()
            .filter(|(k, _)| self.hist[*k as usize].count() > 0)
            .map(|(k, n)| {
                let h = &self.hist[*k as usize];
                (
                    n.to_string(),
                    h.quantile(0.5).as_secs_f64() * 1e3,
                    h.quantile(0.99).as_secs_f64() * 1e3,
                    h.count(),
                )
            })
            .collect()
    }

    /// Writes the trace as Chrome trace JSON (an error when tracing was not enabled).
    pub fn write_trace(&self, path: &std::path::Path) -> std::io::Result<usize> {
        let Some(t) = &self.trace else {
            return Err(std::io::Error::other("tracing was not enabled"));
        };
        let mut s = String::from("{\"traceEvents\":[\n");
        for (i, e) in t.iter().enumerate() {
            if i > 0 {
                s.push_str(",\n");
            }
            s.push_str(&format!(
                "{{\"name\":\"{}\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":1,\"tid\":1}}",
                e.name, e.start_us, e.dur_us
            ));
        }
        s.push_str(&format!(
            "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{{\"dropped_events\":{}}}}}\n",
            self.dropped
        ));
        std::fs::write(path, s)?;
        Ok(t.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_a_bucket() {
        let mut h = Histogram::default();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let p50 = h.quantile(0.5).as_secs_f64() * 1e6;
        let p99 = h.quantile(0.99).as_secs_f64() * 1e6;
        assert!((400.0..=600.0).contains(&p50), "{p50}");
        assert!((850.0..=1000.0).contains(&p99), "{p99}");
        assert_eq!(h.quantile(1.0), Duration::from_micros(1000));
        assert_eq!(Histogram::default().quantile(0.5), Duration::ZERO);
    }

    #[test]
    fn the_trace_is_chrome_json() {
        let mut r = Recorder::new(2);
        let t = Instant::now();
        for _ in 0..3 {
            r.span(Span::Tick, "tick", t, t + Duration::from_millis(2));
        }
        let path = std::env::temp_dir().join(format!("frt-trace-{}.json", std::process::id()));
        assert_eq!(r.write_trace(&path).unwrap(), 2);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["traceEvents"].as_array().unwrap().len(), 2);
        assert_eq!(v["otherData"]["dropped_events"], 1);
        assert_eq!(v["traceEvents"][0]["dur"].as_f64().unwrap().round(), 2000.0);
        assert_eq!(r.summary()[0].3, 3);
        let _ = std::fs::remove_file(path);
    }
}
