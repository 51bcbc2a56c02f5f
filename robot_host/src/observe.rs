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
        if trace::enabled() {
            trace::span(name, trace::this_thread(), start, end);
        }
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

/// How long ago this process started (exec included), from the kernel's records
/// (`/proc/self/stat`'s start time against `/proc/uptime`; a resolution of one clock tick,
/// usually 10 ms). `None` where they cannot be read (not Linux).
pub fn since_process_start() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let up: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    since_start(&stat, up, clock_ticks()?)
}

/// `since_process_start` from the texts: the 22nd field of `stat` counted after the command
/// name's closing parenthesis (the name may hold spaces and parentheses).
fn since_start(stat: &str, uptime_s: f64, ticks_per_s: f64) -> Option<Duration> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // Fields from the 3rd (state) on: the start time is the 22nd, the 20th of these.
    let start: f64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    Some(Duration::from_secs_f64(
        (uptime_s - start / ticks_per_s).max(0.0),
    ))
}

fn clock_ticks() -> Option<f64> {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (t > 0).then_some(t as f64)
}

/// The process's trace (`--trace FILE`): every thread's `tracing` spans on a track of its
/// own (named after the thread), the control loop's stages, and each graph replay on its
/// stream's track; written as Chrome trace JSON, which Perfetto opens. Off unless
/// [`trace::enable`] was called; the buffer is sized up front (events beyond it are counted
/// as dropped).
pub mod trace {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, OnceLock};
    use std::time::Instant;

    struct Event {
        name: &'static str,
        tid: u64,
        start_us: f64,
        dur_us: f64,
    }

    struct Sink {
        origin: Instant,
        events: Mutex<Vec<Event>>,
        /// Track names by id (threads, then streams).
        tracks: Mutex<Vec<(u64, String)>>,
        dropped: AtomicU64,
    }

    static SINK: OnceLock<Sink> = OnceLock::new();
    static NEXT_TRACK: AtomicU64 = AtomicU64::new(1);

    thread_local! {
        static TRACK: u64 = {
            let id = NEXT_TRACK.fetch_add(1, Ordering::Relaxed);
            let t = std::thread::current();
            let name = t.name().map_or_else(|| format!("thread {id}"), String::from);
            if let Some(s) = SINK.get() {
                s.tracks.lock().unwrap_or_else(|p| p.into_inner()).push((id, name));
            }
            id
        };
    }

    /// Starts recording, with room for `capacity` events (a second call does nothing).
    pub fn enable(capacity: usize) {
        let _ = SINK.set(Sink {
            origin: Instant::now(),
            events: Mutex::new(Vec::with_capacity(capacity)),
            tracks: Mutex::new(Vec::new()),
            dropped: AtomicU64::new(0),
        });
    }

    pub fn enabled() -> bool {
        SINK.get().is_some()
    }

    /// The calling thread's track.
    pub fn this_thread() -> u64 {
        TRACK.with(|t| *t)
    }

    /// A track of its own for a device stream (`stream <name>`); the same name gives the
    /// same track.
    pub fn stream(name: &str) -> u64 {
        let Some(s) = SINK.get() else { return 0 };
        let label = format!("stream {name}");
        let mut tracks = s.tracks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((id, _)) = tracks.iter().find(|(_, n)| *n == label) {
            return *id;
        }
        let id = NEXT_TRACK.fetch_add(1, Ordering::Relaxed);
        tracks.push((id, label));
        id
    }

    /// One span on track `tid`, from `start` to `end`.
    pub fn span(name: &'static str, tid: u64, start: Instant, end: Instant) {
        let Some(s) = SINK.get() else { return };
        let mut ev = s.events.lock().unwrap_or_else(|p| p.into_inner());
        if ev.len() < ev.capacity() {
            ev.push(Event {
                name,
                tid,
                start_us: start.saturating_duration_since(s.origin).as_secs_f64() * 1e6,
                dur_us: end.saturating_duration_since(start).as_secs_f64() * 1e6,
            });
        } else {
            s.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Writes the trace (Chrome trace JSON, one named track per thread and stream); returns
    /// the number of spans. An error when tracing is off.
    pub fn write(path: &std::path::Path) -> std::io::Result<usize> {
        let Some(s) = SINK.get() else {
            return Err(std::io::Error::other("tracing was not enabled"));
        };
        let ev = s.events.lock().unwrap_or_else(|p| p.into_inner());
        let tracks = s.tracks.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::from("{\"traceEvents\":[\n");
        let mut first = true;
        let mut sep = |out: &mut String| {
            if !first {
                out.push_str(",\n");
            }
            first = false;
        };
        for (id, name) in tracks.iter() {
            sep(&mut out);
            let name = json_string(name);
            out.push_str(&format!(
                "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{id},\"args\":{{\"name\":{name}}}}}"
            ));
        }
        for e in ev.iter() {
            sep(&mut out);
            out.push_str(&format!(
                "{{\"name\":\"{}\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":1,\"tid\":{}}}",
                e.name, e.start_us, e.dur_us, e.tid
            ));
        }
        out.push_str(&format!(
            "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{{\"dropped_events\":{}}}}}\n",
            s.dropped.load(Ordering::Relaxed)
        ));
        std::fs::write(path, out)?;
        Ok(ev.len())
    }

    fn json_string(s: &str) -> String {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    /// The `tracing` layer that puts every span of every thread on the thread's track
    /// (from enter to exit; a span entered again is recorded again).
    pub struct Layer;

    struct Entered(Instant);

    impl<S> tracing_subscriber::Layer<S> for Layer
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        fn on_enter(&self, id: &tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
            if let Some(span) = ctx.span(id) {
                span.extensions_mut().replace(Entered(Instant::now()));
            }
        }

        fn on_exit(&self, id: &tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
            if let Some(span) = ctx.span(id) {
                if let Some(Entered(t)) = span.extensions_mut().remove::<Entered>() {
                    self::span(span.metadata().name(), this_thread(), t, Instant::now());
                }
            }
        }
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

    #[test]
    fn the_process_start_is_read_past_the_command_name() {
        // A name with spaces and parentheses; start time 250 ticks (2.5 s at 100 per second).
        let mut stat = String::from("4242 (a (b) c) S 1 4242 4242 0 -1 4194304 100 0 0 0");
        stat.push_str(" 5 3 0 0 20 0 1 0 250 1000 100 18446744073709551615");
        let d = since_start(&stat, 12.5, 100.0).unwrap();
        assert!((d.as_secs_f64() - 10.0).abs() < 1e-9, "{d:?}");
        assert_eq!(since_start("no parenthesis", 1.0, 100.0), None);
        // This process started before now and after boot.
        let own = since_process_start().unwrap();
        assert!(own < Duration::from_secs(24 * 3600), "{own:?}");
    }
}
