//! The mutation loop: a seeded generator, byte and text mutations, the corpus, and the
//! report of one target's run.

use crate::targets::Target;
use std::cell::RefCell;
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// splitmix64: small, seedable, and good enough to pick mutations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_F42D_4C95_7F2D)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}

/// How long a target runs and what counts as too slow.
#[derive(Clone, Debug)]
pub struct Budget {
    pub time: Duration,
    /// Stop after this many executions, if sooner.
    pub max_execs: u64,
    /// One input slower than this is a finding.
    pub slow: Duration,
}

#[derive(Clone, Debug)]
pub struct Finding {
    /// `panic`, `slow` or `oracle`.
    pub kind: &'static str,
    pub detail: String,
    /// Where the input was written, when an output folder was given.
    pub input: Option<PathBuf>,
}

#[derive(Clone, Debug)]
pub struct Report {
    pub target: &'static str,
    pub execs: u64,
    pub elapsed: Duration,
    pub corpus: usize,
    /// Distinct outcomes seen (`ok` and each error message with its digits dropped).
    pub outcomes: usize,
    pub slowest: Duration,
    pub findings: Vec<Finding>,
}

const INTERESTING_INTS: [u64; 14] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x7fff,
    0xffff,
    1 << 20,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x7fff_ffff_ffff_ffff,
    u64::MAX,
];

const INTERESTING_TEXT: [&str; 26] = [
    "0",
    "-1",
    "1e300",
    "-1e300",
    "1e-300",
    "NaN",
    ".nan",
    "inf",
    ".inf",
    "-.inf",
    "4294967296",
    "18446744073709551616",
    "99999999999999999999",
    "4000000000",
    "65536",
    "0.0",
    "-0",
    "null",
    "true",
    "\"\"",
    "[]",
    "{}",
    "~",
    "\u{0}",
    "\u{feff}",
    "é",
];

const TEXT_PIECES: [&str; 14] = [
    "{", "}", "[", "]", "\"", ":", ",", "\n", "\n  ", "- ", "\\u0000", "&a", "*a", "!!binary",
];

fn is_number_byte(b: u8) -> bool {
    b.is_ascii_digit() || b == b'.' || b == b'-' || b == b'e' || b == b'+'
}

/// One random mutation of `v` in place. `text`: also token-level mutations for JSON and YAML.
/// `hot`: the leading bytes where the structure is (headers), hit more often.
fn mutate_once(v: &mut Vec<u8>, rng: &mut Rng, text: bool, hot: usize, other: &[u8]) {
    let pos = |rng: &mut Rng, len: usize| -> usize {
        if len == 0 {
            0
        } else if hot > 0 && hot < len && rng.chance(70) {
            rng.below(hot)
        } else {
            rng.below(len)
        }
    };
    let kinds = if text { 16 } else { 10 };
    match rng.below(kinds) {
        0 if !v.is_empty() => {
            let i = pos(rng, v.len());
            v[i] ^= 1 << rng.below(8);
        }
        1 if !v.is_empty() => {
            let i = pos(rng, v.len());
            v[i] = rng.next_u64() as u8;
        }
        2 if !v.is_empty() => {
            let i = pos(rng, v.len());
            v[i] = INTERESTING_INTS[rng.below(6)] as u8;
        }
        3 if !v.is_empty() => {
            // An interesting little-endian integer of 2, 4 or 8 bytes.
            let w = [2, 4, 8][rng.below(3)];
            let i = pos(rng, v.len());
            let x = INTERESTING_INTS[rng.below(INTERESTING_INTS.len())];
            let x = if rng.chance(20) { x.wrapping_neg() } else { x };
            for (k, b) in x.to_le_bytes().iter().take(w).enumerate() {
                if let Some(slot) = v.get_mut(i + k) {
                    *slot = *b;
                }
            }
        }
        4 => {
            let i = pos(rng, v.len() + 1).min(v.len());
            let n = 1 + rng.below(16);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            v.splice(i..i, bytes);
        }
        5 if !v.is_empty() => {
            let i = pos(rng, v.len());
            let n = 1 + rng.below((v.len() - i).min(64));
            v.drain(i..i + n);
        }
        6 if !v.is_empty() => {
            // Duplicate a range somewhere else.
            let i = rng.below(v.len());
            let n = 1 + rng.below((v.len() - i).min(256));
            let piece = v[i..i + n].to_vec();
            let at = pos(rng, v.len() + 1).min(v.len());
            v.splice(at..at, piece);
        }
        7 if !v.is_empty() => {
            let keep = rng.below(v.len());
            v.truncate(keep);
        }
        8 if !other.is_empty() && !v.is_empty() => {
            // Splice: our head, another input's tail.
            let a = rng.below(v.len());
            let b = rng.below(other.len());
            v.truncate(a);
            v.extend_from_slice(&other[b..]);
        }
        9 if !v.is_empty() => {
            // A run of one byte (long strings, long numbers).
            let i = pos(rng, v.len());
            let n = 1 + rng.below(1024);
            let b = v[i];
            v.splice(i..i, std::iter::repeat_n(b, n));
        }
        10 => {
            // Replace a number (or insert an interesting token).
            let starts: Vec<usize> = (0..v.len())
                .filter(|&i| v[i].is_ascii_digit() && (i == 0 || !is_number_byte(v[i - 1])))
                .collect();
            let with = INTERESTING_TEXT[rng.below(INTERESTING_TEXT.len())].as_bytes();
            if starts.is_empty() {
                let i = rng.below(v.len() + 1);
                v.splice(i..i, with.iter().copied());
            } else {
                let s = starts[rng.below(starts.len())];
                let e = (s..v.len())
                    .find(|&i| !is_number_byte(v[i]))
                    .unwrap_or(v.len());
                v.splice(s..e, with.iter().copied());
            }
        }
        11 => {
            let i = rng.below(v.len() + 1);
            let p = TEXT_PIECES[rng.below(TEXT_PIECES.len())].as_bytes();
            v.splice(i..i, p.iter().copied());
        }
        14 | 15 => {
            // Arithmetic on a decimal number: just past a limit is where bounds go wrong.
            let starts: Vec<usize> = (0..v.len())
                .filter(|&i| v[i].is_ascii_digit() && (i == 0 || !v[i - 1].is_ascii_digit()))
                .collect();
            if !starts.is_empty() {
                let s = starts[rng.below(starts.len())];
                let e = (s..v.len())
                    .find(|&i| !v[i].is_ascii_digit())
                    .unwrap_or(v.len());
                let n: u64 = std::str::from_utf8(&v[s..e])
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0);
                let m = match rng.below(6) {
                    0 => n.wrapping_add(1),
                    1 => n.wrapping_sub(1),
                    2 => n.wrapping_mul(2),
                    3 => n.wrapping_add(1 + rng.below(64) as u64),
                    4 => n.wrapping_mul(1000),
                    _ => n.wrapping_add(1 << 16),
                };
                v.splice(s..e, m.to_string().into_bytes());
            }
        }
        12 | 13 => {
            // Delete, duplicate or swap whole lines.
            let mut lines: Vec<Vec<u8>> = v.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
            if lines.len() > 1 {
                let a = rng.below(lines.len());
                let b = rng.below(lines.len());
                match rng.below(3) {
                    0 => {
                        lines.remove(a);
                    }
                    1 => {
                        let l = lines[a].clone();
                        lines.insert(b, l);
                    }
                    _ => lines.swap(a, b),
                }
                *v = lines.join(&b'\n');
            }
        }
        _ => {
            if !v.is_empty() {
                let i = rng.below(v.len());
                v[i] = v[i].wrapping_add(1);
            } else {
                v.push(rng.next_u64() as u8);
            }
        }
    }
}

/// A new input from `base`: one to eight stacked mutations, kept under `max_len`.
pub fn mutate(
    base: &[u8],
    rng: &mut Rng,
    text: bool,
    hot: usize,
    other: &[u8],
    max_len: usize,
) -> Vec<u8> {
    let mut v = base.to_vec();
    let n = 1 + rng.below(8);
    for _ in 0..n {
        mutate_once(&mut v, rng, text, hot, other);
        if v.len() > max_len {
            v.truncate(max_len);
        }
    }
    v
}

/// An outcome with its digits dropped: `ok`, or the error without the numbers in it (so that
/// "12 bytes" and "13 bytes" are one outcome).
fn signature(r: &Result<(), String>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => e
            .chars()
            .filter(|c| !c.is_ascii_digit())
            .take(160)
            .collect(),
    }
}

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
    static FUZZING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Panics inside a target are findings, reported by the loop: on a fuzzing thread the hook
/// only keeps the message and place; elsewhere the previous hook runs as before.
fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if FUZZING.with(|f| f.get()) {
                let text = info.to_string();
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(text));
            } else {
                previous(info);
            }
        }))
    });
}

fn hash(b: &[u8]) -> u64 {
    // FNV-1a: names saved inputs.
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| {
        (h ^ *x as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The most corpus entries a target keeps.
const MAX_CORPUS: usize = 512;

/// Runs `target` for `budget`, mutating from its seeds with generator seed `seed`.
/// `out`: where findings are written (`<target>-<kind>-<hash>.bin`) and where the allocation
/// guard writes the input in flight (`<target>-in-flight.bin`).
pub fn fuzz(
    target: &mut dyn Target,
    budget: &Budget,
    seed: u64,
    out: Option<&std::path::Path>,
) -> Report {
    quiet_panics();
    let name = target.name();
    let mut rng = Rng::new(seed ^ hash(name.as_bytes()));
    let seeds = target.seeds();
    assert!(!seeds.is_empty(), "{name}: no seeds");
    let max_len = seeds.iter().map(Vec::len).max().unwrap_or(0) * 2 + 4096;
    let mut corpus: Vec<Vec<u8>> = seeds.clone();
    let mut seen: HashSet<String> = HashSet::new();
    let mut findings: Vec<Finding> = Vec::new();
    let mut found: HashSet<String> = HashSet::new();
    let (mut execs, mut slowest) = (0u64, Duration::ZERO);
    let in_flight = out.map(|d| d.join(format!("{name}-in-flight.bin")));
    let start = Instant::now();
    let mut next = 0usize;
    while start.elapsed() < budget.time && execs < budget.max_execs {
        // The seeds first, unchanged; then mutations of corpus entries.
        let is_seed = next < seeds.len();
        let input = if is_seed {
            next += 1;
            seeds[next - 1].clone()
        } else {
            // A third of the time a seed itself: the corpus must not crowd out small seeds.
            let base = if rng.chance(33) {
                &seeds[rng.below(seeds.len())]
            } else {
                &corpus[rng.below(corpus.len())]
            };
            let other = &corpus[rng.below(corpus.len())];
            mutate(base, &mut rng, target.text(), target.hot(), other, max_len)
        };
        if in_flight.is_some() {
            crate::guard::set_dump(in_flight.clone(), &input);
        }
        let t0 = Instant::now();
        FUZZING.with(|f| f.set(true));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target.run(&input)));
        FUZZING.with(|f| f.set(false));
        let dt = t0.elapsed();
        execs += 1;
        slowest = slowest.max(dt);
        let mut finding = |kind: &'static str, detail: String, findings: &mut Vec<Finding>| {
            // One report per distinct problem (digits dropped), with its first input.
            let key: String = format!("{kind}:{detail}")
                .chars()
                .filter(|c| !c.is_ascii_digit())
                .collect();
            if !found.insert(key) {
                return;
            }
            let path = out.map(|d| d.join(format!("{name}-{kind}-{:016x}.bin", hash(&input))));
            if let Some(p) = &path {
                let _ = std::fs::write(p, &input);
            }
            findings.push(Finding {
                kind,
                detail,
                input: path,
            });
        };
        match r {
            Err(_) => {
                let text = LAST_PANIC
                    .with(|p| p.borrow_mut().take())
                    .unwrap_or_else(|| "a panic without a message".into());
                finding("panic", text, &mut findings);
                // Whatever the target holds may be half-updated: start it afresh.
                target.reset();
            }
            Ok(r) => {
                if let Err(e) = &r
                    && let Some(o) = e.strip_prefix(crate::targets::ORACLE)
                {
                    finding("oracle", o.to_string(), &mut findings);
                }
                if dt > budget.slow {
                    finding(
                        "slow",
                        format!("{:.0} ms for {} bytes", dt.as_secs_f64() * 1e3, input.len()),
                        &mut findings,
                    );
                }
                if seen.insert(signature(&r)) && !is_seed && corpus.len() < MAX_CORPUS {
                    corpus.push(input);
                }
            }
        }
    }
    if in_flight.is_some() {
        crate::guard::set_dump(None, &[]);
    }
    Report {
        target: name,
        execs,
        elapsed: start.elapsed(),
        corpus: corpus.len(),
        outcomes: seen.len(),
        slowest,
        findings,
    }
}
