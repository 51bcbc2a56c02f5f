//! Static FP8 calibration: the range of the activation at each FP8 GEMM's input, recorded
//! while observations run through the 16-bit model, and the file that keeps them.
//!
//! A tensor's range is, per observation, the given percentile (100, the largest, by default)
//! of its magnitudes; over several observations, the largest of those. Its FP8 scale is the range
//! over E4M3's largest value (448): values up to the range keep E4M3's relative precision,
//! the rare larger ones saturate. A tensor that held only zeros gets the range 448 (scale 1).
//!
//! The file is JSON:
//!
//! ```json
//! { "version": 1, "model": "…", "percentile": 99.9, "observations": 16,
//!   "ranges": { "expert.layers.0.qkv": 4.75, … } }
//! ```
//!
//! `model` names what the ranges were recorded on; a model loading the file checks that the
//! names match its own and that every range is finite and positive.

use crate::error::{Error, Result};
use frt_kernels::fp8::E4M3_MAX;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The file format's version.
pub const CALIBRATION_VERSION: u32 = 1;

/// The percentile of magnitudes a range is taken at unless told otherwise: the largest.
/// Full-size Pi0.5 with every stage in FP8 (`pi05-bench --fp8-expert`, H100, 16 observations,
/// 4 held out) came within 1 − cos 5.3e-4 … 7.1e-4 of bf16 so; at the 99.9th percentile
/// SigLIP's clipped inputs left one held-out set at 3.3e-3 (its vision output at 2e-2).
pub const DEFAULT_PERCENTILE: f64 = 100.0;

/// A calibration (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    pub version: u32,
    /// What the ranges were recorded on (the model's identity).
    pub model: String,
    pub percentile: f64,
    pub observations: usize,
    /// Per GEMM input (by the model's name for it), the recorded range.
    pub ranges: BTreeMap<String, f32>,
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::Config {
        reason: format!("calibration {}: {}", path.display(), reason.into()),
    }
}

impl Calibration {
    /// Reads and checks a calibration file: its version, and every range finite and positive.
    pub fn read(path: &Path) -> Result<Calibration> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let c: Calibration = serde_json::from_str(&text)
            .map_err(|e| bad(path, format!("not a calibration: {e}")))?;
        if c.version != CALIBRATION_VERSION {
            return Err(bad(
                path,
                format!(
                    "version {} (this build reads version {CALIBRATION_VERSION})",
                    c.version
                ),
            ));
        }
        if let Some((name, r)) = c.ranges.iter().find(|(_, r)| !(r.is_finite() && **r > 0.0)) {
            return Err(bad(
                path,
                format!("range of `{name}` is {r}: not a positive number"),
            ));
        }
        if c.observations == 0 || c.ranges.is_empty() {
            return Err(bad(path, "no observations or no ranges"));
        }
        Ok(c)
    }

    /// Writes the file through a temporary file beside it of this write's own (the process id
    /// and a count: no other thread or process writes it), renamed over `path`: a reader sees
    /// the old file or the whole new one, also with several writers at once. The temporary
    /// file is removed when the write fails.
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("a calibration serializes");
        frt_exec::write_whole(path, (text + "\n").as_bytes()).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The FP8 scale of `name`'s activation: its range over 448.
    pub fn scale(&self, name: &str) -> Result<f32> {
        self.ranges
            .get(name)
            .map(|r| r / E4M3_MAX)
            .ok_or_else(|| Error::Config {
                reason: format!("calibration of `{}` has no range for `{name}`", self.model),
            })
    }

    /// Checks that the file holds every range a model needs (`needed`) and none that the
    /// model does not have (`known`: every name it could use): a missing one, or a foreign one
    /// (a file recorded on another model), is an error naming it.
    pub fn check_names<'a>(
        &self,
        needed: impl IntoIterator<Item = &'a str>,
        known: impl IntoIterator<Item = &'a str>,
    ) -> Result<()> {
        let want: std::collections::BTreeSet<&str> = needed.into_iter().collect();
        let known: std::collections::BTreeSet<&str> = known.into_iter().collect();
        if let Some(n) = want.iter().find(|n| !self.ranges.contains_key(**n)) {
            return Err(Error::Config {
                reason: format!(
                    "calibration of `{}` has no range for `{n}` ({} of {} needed ranges present): recorded on another model?",
                    self.model,
                    want.iter()
                        .filter(|n| self.ranges.contains_key(**n))
                        .count(),
                    want.len()
                ),
            });
        }
        if let Some(n) = self
            .ranges
            .keys()
            .find(|n| !known.contains(n.as_str()) && !want.contains(n.as_str()))
        {
            return Err(Error::Config {
                reason: format!(
                    "calibration of `{}` has a range for `{n}`, which this model does not have: recorded on another model?",
                    self.model
                ),
            });
        }
        Ok(())
    }
}

/// Records ranges over observations (see the module docs).
pub struct RangeRecorder {
    percentile: f64,
    ranges: BTreeMap<String, f32>,
    observations: usize,
    scratch: Vec<f32>,
}

impl RangeRecorder {
    /// A recorder taking ranges at `percentile` (in (0, 100]).
    pub fn new(percentile: f64) -> Result<RangeRecorder> {
        if !(percentile > 0.0 && percentile <= 100.0) {
            return Err(Error::Config {
                reason: format!(
                    "calibration percentile {percentile}: expected a number in (0, 100]"
                ),
            });
        }
        Ok(RangeRecorder {
            percentile,
            ranges: BTreeMap::new(),
            observations: 0,
            scratch: Vec::new(),
        })
    }

    /// Records one observation's values of the activation `name`: its range is raised to this
    /// observation's percentile of magnitudes. A non-finite value is an error naming the
    /// tensor (the 16-bit model itself went wrong).
    pub fn record(&mut self, name: &str, values: &[f32]) -> Result<()> {
        if values.is_empty() {
            return Ok(());
        }
        if self.percentile >= 100.0 {
            // The largest magnitude: one pass, no copy, 16 lanes (the finite test beside it).
            let (mut top, mut finite) = ([0f32; 16], [true; 16]);
            let mut chunks = values.chunks_exact(16);
            for c in &mut chunks {
                for k in 0..16 {
                    // A select, not `f32::max` (whose NaN rule keeps it from vectorizing);
                    // a NaN is caught by the finite test.
                    let a = c[k].abs();
                    top[k] = if a > top[k] { a } else { top[k] };
                    finite[k] &= a < f32::INFINITY;
                }
            }
            for (k, v) in chunks.remainder().iter().enumerate() {
                top[k] = top[k].max(v.abs());
                finite[k] &= v.is_finite();
            }
            if finite.iter().all(|f| *f) {
                let top = top.iter().fold(0f32, |m, v| m.max(*v));
                let r = self.ranges.entry(name.to_string()).or_insert(0.0);
                *r = r.max(top);
                return Ok(());
            }
        }
        self.scratch.clear();
        self.scratch.extend(values.iter().map(|v| v.abs()));
        if let Some(i) = self.scratch.iter().position(|v| !v.is_finite()) {
            return Err(Error::BadInput {
                what: name.to_string(),
                reason: format!("value {} at element {i} is not finite", values[i]),
            });
        }
        // Nearest rank: the smallest magnitude with at least `percentile` % of them at or
        // below it.
        let n = self.scratch.len();
        // (Less a hair: 99.9 % of 1000 is rank 999, not the 1000 that rounding gives.)
        let rank = ((self.percentile / 100.0 * n as f64 - 1e-9).ceil() as usize).clamp(1, n);
        let (_, v, _) = self
            .scratch
            .select_nth_unstable_by(rank - 1, f32::total_cmp);
        let v = *v;
        let r = self.ranges.entry(name.to_string()).or_insert(0.0);
        *r = r.max(v);
        Ok(())
    }

    /// Marks the end of one observation.
    pub fn end_observation(&mut self) {
        self.observations += 1;
    }

    /// The calibration of what was recorded, for `model`.
    pub fn finish(self, model: &str) -> Result<Calibration> {
        if self.observations == 0 || self.ranges.is_empty() {
            return Err(Error::Config {
                reason: "calibration: nothing was recorded".into(),
            });
        }
        Ok(Calibration {
            version: CALIBRATION_VERSION,
            model: model.to_string(),
            percentile: self.percentile,
            observations: self.observations,
            ranges: self
                .ranges
                .into_iter()
                .map(|(k, r)| (k, if r > 0.0 { r } else { E4M3_MAX }))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Several threads writing calibrations to one path while another reads it: every read
    /// is one of them whole, and no temporary file is left behind.
    #[test]
    fn concurrent_writes_are_read_whole() {
        let dir = std::env::temp_dir().join(format!("frt-cal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cal.json");
        let cal = |k: usize| Calibration {
            version: CALIBRATION_VERSION,
            model: format!("model {k}"),
            percentile: 100.0,
            observations: 1,
            // Large enough that a torn file shows up as a parse error.
            ranges: (0..2000)
                .map(|i| (format!("t{i}"), (k * 1000 + i + 1) as f32))
                .collect(),
        };
        cal(0).write(&path).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for k in 1..=8 {
                let (path, cal) = (&path, cal(k));
                s.spawn(move || {
                    for _ in 0..20 {
                        cal.write(path).unwrap();
                    }
                });
            }
            let (path, done) = (&path, &done);
            let reader = s.spawn(move || {
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) || reads < 50 {
                    let c = Calibration::read(path).unwrap_or_else(|e| panic!("read {reads}: {e}"));
                    let k: usize = c.model["model ".len()..].parse().unwrap();
                    assert_eq!(c.ranges, cal(k).ranges, "read {reads}");
                    reads += 1;
                }
            });
            std::thread::sleep(std::time::Duration::from_millis(200));
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            reader.join().unwrap();
        });
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "cal.json")
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// At 100 % the range is taken in one pass over 16 lanes: the largest magnitude wherever
    /// it lies (every lane, the tail past the last 16), and a non-finite value anywhere is
    /// named as before.
    #[test]
    fn the_largest_magnitude_is_found_in_every_lane_and_the_tail() {
        let n = 16 * 9 + 5;
        for at in 0..n {
            for sign in [1.0f32, -1.0] {
                let mut v: Vec<f32> = (0..n)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
                    .collect();
                v[at] = sign * 3.25;
                let mut r = RangeRecorder::new(100.0).unwrap();
                r.record("a", &v).unwrap();
                assert_eq!(r.ranges["a"], 3.25, "at {at}");
            }
        }
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in [3, 16 * 9 + 2] {
                let mut v = vec![1.0f32; n];
                v[at] = bad;
                let mut r = RangeRecorder::new(100.0).unwrap();
                let e = r.record("x.y", &v).unwrap_err().to_string();
                assert!(
                    e.contains("x.y") && e.contains(&format!("element {at}")),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn ranges_are_the_percentile_of_magnitudes_and_the_largest_over_observations() {
        let mut r = RangeRecorder::new(99.9).unwrap();
        // 1..=1000 (signs alternating): the 99.9th percentile by nearest rank is 999.
        let v: Vec<f32> = (1..=1000)
            .map(|i| if i % 2 == 0 { i as f32 } else { -(i as f32) })
            .collect();
        r.record("a", &v).unwrap();
        r.record("zeros", &[0.0; 10]).unwrap();
        r.end_observation();
        // A second observation: smaller for `a` (kept at 999), a new tensor `b`.
        r.record("a", &v.iter().map(|x| x * 0.5).collect::<Vec<_>>())
            .unwrap();
        r.record("b", &[3.0, -7.0]).unwrap();
        r.end_observation();
        let c = r.finish("tiny").unwrap();
        assert_eq!(c.ranges["a"], 999.0);
        assert_eq!(c.ranges["b"], 7.0);
        assert_eq!(c.ranges["zeros"], E4M3_MAX);
        assert_eq!(c.observations, 2);
        assert_eq!(c.scale("a").unwrap(), 999.0 / 448.0);
        assert!(c.scale("c").unwrap_err().to_string().contains("`c`"));
        // At 100: the largest magnitude.
        let mut r = RangeRecorder::new(100.0).unwrap();
        r.record("a", &v).unwrap();
        r.end_observation();
        assert_eq!(r.finish("t").unwrap().ranges["a"], 1000.0);
        // NaN: named; percentiles outside (0, 100]: refused.
        let mut r = RangeRecorder::new(50.0).unwrap();
        let e = r.record("x.y", &[1.0, f32::NAN]).unwrap_err().to_string();
        assert!(e.contains("x.y") && e.contains("element 1"), "{e}");
        for p in [0.0, -1.0, 100.5, f64::NAN] {
            assert!(RangeRecorder::new(p).is_err(), "{p}");
        }
        assert!(RangeRecorder::new(99.0).unwrap().finish("t").is_err());
    }

    #[test]
    fn files_round_trip_and_bad_ones_are_refused_by_reason() {
        let dir = std::env::temp_dir().join(format!("frt-calibration-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.json");
        let mut r = RangeRecorder::new(DEFAULT_PERCENTILE).unwrap();
        r.record("p.0.qkv", &[1.0, 2.0, 3.0]).unwrap();
        r.record("p.0.down", &[0.25]).unwrap();
        r.end_observation();
        let c = r.finish("pi05 tiny").unwrap();
        c.write(&path).unwrap();
        assert_eq!(Calibration::read(&path).unwrap(), c);
        c.check_names(["p.0.qkv", "p.0.down"], []).unwrap();
        // Needing fewer than the file holds is fine when the model knows the others.
        c.check_names(["p.0.qkv"], ["p.0.qkv", "p.0.down"]).unwrap();
        let e = c
            .check_names(["p.0.qkv", "p.0.down", "p.1.qkv"], [])
            .unwrap_err()
            .to_string();
        assert!(e.contains("p.1.qkv") && e.contains("2 of 3"), "{e}");
        let e = c
            .check_names(["p.0.qkv"], ["p.0.qkv"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("p.0.down") && e.contains("does not have"), "{e}");
        let text = std::fs::read_to_string(&path).unwrap();
        for (what, broken) in [
            (
                "version 2",
                text.replace("\"version\": 1", "\"version\": 2"),
            ),
            ("not a positive number", text.replace("0.25", "-0.25")),
            (
                "not a calibration",
                text.replace("\"ranges\"", "\"extra\": 1, \"ranges\""),
            ),
            ("not a calibration", text[..text.len() / 2].to_string()),
        ] {
            std::fs::write(&path, broken).unwrap();
            let e = Calibration::read(&path).unwrap_err().to_string();
            assert!(e.contains(what) && e.contains("c.json"), "{what}: {e}");
        }
        let e = Calibration::read(&dir.join("missing.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.json"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
