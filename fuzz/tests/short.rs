//! CI's short fuzzing: every target's seeds are valid, then every target runs for a bounded
//! time with no finding (a panic, a broken oracle, a slow input). An allocation above the
//! guard's limit aborts this test binary, which fails the run too.

use frt_fuzz::{Budget, all, fuzz};
use std::time::Duration;

/// Seconds per target (`FRT_FUZZ_SECONDS` overrides; CI keeps the default).
fn seconds() -> f64 {
    std::env::var("FRT_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0)
}

#[test]
fn every_seed_is_a_valid_input() {
    for mut t in all() {
        for (i, s) in t.seeds().iter().enumerate() {
            if let Err(e) = t.run(s) {
                panic!("{} seed {i} is refused: {e}", t.name());
            }
        }
    }
}

#[test]
fn every_target_runs_without_findings() {
    let budget = Budget {
        time: Duration::from_secs_f64(seconds()),
        max_execs: 200_000,
        // A debug build on a loaded 2-core machine; the stalls this looks for took 10 s or more.
        slow: Duration::from_secs(5),
    };
    let mut problems = Vec::new();
    for mut t in all() {
        let r = fuzz(t.as_mut(), &budget, 7, None);
        eprintln!(
            "{}: {} execs in {:.1} s, corpus {}, {} outcomes, slowest {:.1} ms",
            r.target,
            r.execs,
            r.elapsed.as_secs_f64(),
            r.corpus,
            r.outcomes,
            r.slowest.as_secs_f64() * 1e3
        );
        assert!(r.execs > 0, "{} ran nothing", r.target);
        for f in r.findings {
            problems.push(format!("{} {}: {}", r.target, f.kind, f.detail));
        }
    }
    assert!(problems.is_empty(), "findings:\n{}", problems.join("\n"));
}
