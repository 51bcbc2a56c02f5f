//! `frt-fuzz`: runs the fuzz targets, each in a child process (an allocation abort or a hang
//! ends the child, not the run), and prints a table of executions and findings.
//!
//! ```text
//! frt-fuzz list
//! frt-fuzz run [--seconds N] [--jobs J] [--seed S] [--out DIR] [--slow-ms M] [TARGET ...]
//! frt-fuzz replay TARGET FILE...
//! ```
//! `replay` runs saved inputs (findings) through a target once each and prints the outcome
//! and the time.
//! `--seconds`: per target (default 10); `--jobs`: targets at a time (default 1); `--out`:
//! where inputs of findings are written (default `target/fuzz-findings`). Exits 1 when anything was
//! found.

use frt_fuzz::{Budget, by_name, fuzz, targets::NAMES};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Args {
    seconds: f64,
    jobs: usize,
    seed: u64,
    out: PathBuf,
    slow_ms: u64,
    targets: Vec<String>,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        seconds: 10.0,
        jobs: 1,
        seed: 1,
        out: PathBuf::from("target/fuzz-findings"),
        slow_ms: 1000,
        targets: Vec::new(),
    };
    while let Some(x) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match x.as_str() {
            "--seconds" => {
                a.seconds = value("--seconds")?
                    .parse()
                    .map_err(|e| format!("--seconds: {e}"))?
            }
            "--jobs" => {
                a.jobs = value("--jobs")?
                    .parse()
                    .map_err(|e| format!("--jobs: {e}"))?
            }
            "--seed" => {
                a.seed = value("--seed")?
                    .parse()
                    .map_err(|e| format!("--seed: {e}"))?
            }
            "--slow-ms" => {
                a.slow_ms = value("--slow-ms")?
                    .parse()
                    .map_err(|e| format!("--slow-ms: {e}"))?
            }
            "--out" => a.out = PathBuf::from(value("--out")?),
            t if t.starts_with("--") => return Err(format!("unknown option {t}")),
            t if NAMES.contains(&t) => a.targets.push(t.to_string()),
            "all" => a.targets.extend(NAMES.iter().map(|s| s.to_string())),
            t => return Err(format!("no target `{t}` (frt-fuzz list)")),
        }
    }
    if !(a.seconds.is_finite() && a.seconds > 0.0) || a.jobs == 0 {
        return Err("--seconds and --jobs must be positive".into());
    }
    if a.targets.is_empty() {
        a.targets = NAMES.iter().map(|s| s.to_string()).collect();
    }
    Ok(a)
}

/// One child's result line: `report <target> <execs> <secs> <corpus> <outcomes> <slowest s>`,
/// then `finding <kind> <input path or -> <detail>` lines.
fn child(a: &Args) -> i32 {
    let name = &a.targets[0];
    let mut t = by_name(name).expect("checked");
    let budget = Budget {
        time: Duration::from_secs_f64(a.seconds),
        max_execs: u64::MAX,
        slow: Duration::from_millis(a.slow_ms),
    };
    let r = fuzz(t.as_mut(), &budget, a.seed, Some(&a.out));
    println!(
        "report {} {} {:.3} {} {} {:.6}",
        r.target,
        r.execs,
        r.elapsed.as_secs_f64(),
        r.corpus,
        r.outcomes,
        r.slowest.as_secs_f64()
    );
    for f in &r.findings {
        let path = f
            .input
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or("-".into());
        println!(
            "finding {} {} {}",
            f.kind,
            path,
            f.detail.replace('\n', " ")
        );
    }
    0
}

#[derive(Default)]
struct Total {
    execs: u64,
    secs: f64,
    /// CPU seconds (user + system) the target's children used, from `wait4`.
    cpu: f64,
    corpus: usize,
    outcomes: usize,
    slowest: f64,
    runs: u32,
    findings: Vec<String>,
    /// Distinct findings (digits dropped): one found again by a later child is not reported
    /// again.
    crashes: std::collections::HashSet<String>,
}

/// How a child ended, with the CPU seconds it used (user + system), once it has.
#[derive(Clone, Copy, Debug)]
enum Ended {
    Exited(i32),
    Signal(i32),
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Exited(c) => write!(f, "exit status {c}"),
            Ended::Signal(s) => write!(f, "signal {s}"),
        }
    }
}

fn wait4(c: &Child, flags: i32) -> Option<(Ended, f64)> {
    let mut status = 0;
    // SAFETY: plain out-parameters; the pid is our child, not yet reaped.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(c.id() as i32, &mut status, flags, &mut ru) };
    if r <= 0 {
        return None;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    let ended = if libc::WIFSIGNALED(status) {
        Ended::Signal(libc::WTERMSIG(status))
    } else {
        Ended::Exited(libc::WEXITSTATUS(status))
    };
    Some((ended, secs(ru.ru_utime) + secs(ru.ru_stime)))
}

/// The child's end, if it has ended (reaped here).
fn reap(c: &Child) -> Option<(Ended, f64)> {
    wait4(c, libc::WNOHANG)
}

fn wait_blocking(c: &Child) -> Option<(Ended, f64)> {
    wait4(c, 0)
}

/// A child's standard error (a file: a pipe nobody reads could fill and block the child).
fn stderr_log(a: &Args, target: &str) -> PathBuf {
    a.out.join(format!("{target}-stderr.log"))
}

fn spawn(a: &Args, target: &str, seed: u64, seconds: f64) -> std::io::Result<Child> {
    Command::new(std::env::current_exe()?)
        .args([
            "child",
            target,
            "--seconds",
            &format!("{seconds}"),
            "--seed",
            &seed.to_string(),
            "--slow-ms",
            &a.slow_ms.to_string(),
            "--out",
            &a.out.display().to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(stderr_log(a, target))?)
        .spawn()
}

/// Runs one target for its whole time, restarting its child after a crash.
fn run_target(a: &Args, target: &str) -> Total {
    let mut total = Total::default();
    let start = Instant::now();
    let mut seed = a.seed;
    loop {
        let left = a.seconds - start.elapsed().as_secs_f64();
        if left < 0.5 {
            break;
        }
        total.runs += 1;
        let mut c = match spawn(a, target, seed, left) {
            Ok(c) => c,
            Err(e) => {
                total.findings.push(format!("could not start a child: {e}"));
                break;
            }
        };
        // A child that outlives its time by a minute is hung on one input.
        let deadline = Instant::now() + Duration::from_secs_f64(left + 60.0);
        let status = loop {
            match reap(&c) {
                Some((st, cpu)) => {
                    total.cpu += cpu;
                    break Some(st);
                }
                None if Instant::now() > deadline => {
                    let _ = c.kill();
                    if let Some((_, cpu)) = wait_blocking(&c) {
                        total.cpu += cpu;
                    }
                    break None;
                }
                None => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let out = c
            .stdout
            .take()
            .map(|mut s| {
                let mut t = String::new();
                let _ = std::io::Read::read_to_string(&mut s, &mut t);
                t
            })
            .unwrap_or_default();
        let err = std::fs::read_to_string(stderr_log(a, target)).unwrap_or_default();
        for line in out.lines() {
            let f: Vec<&str> = line.splitn(7, ' ').collect();
            match f.as_slice() {
                ["report", _, execs, secs, corpus, outcomes, slowest] => {
                    total.execs += execs.parse::<u64>().unwrap_or(0);
                    total.secs += secs.parse::<f64>().unwrap_or(0.0);
                    total.corpus = total.corpus.max(corpus.parse().unwrap_or(0));
                    total.outcomes = total.outcomes.max(outcomes.parse().unwrap_or(0));
                    total.slowest = total.slowest.max(slowest.parse().unwrap_or(0.0));
                }
                ["finding", kind, _path, ..] => {
                    let detail = line.splitn(4, ' ').nth(3).unwrap_or("");
                    let key: String = format!("{kind} {detail}")
                        .chars()
                        .filter(|c| !c.is_ascii_digit())
                        .collect();
                    if total.crashes.insert(key) {
                        total.findings.push(line[8..].to_string());
                    }
                }
                _ => {}
            }
        }
        match status {
            Some(Ended::Exited(0)) => break,
            Some(s) => {
                // The first line is the reason (the guard's, or the runtime's).
                let why = err.lines().next().unwrap_or("no message").to_string();
                let key: String = why.chars().filter(|c| !c.is_ascii_digit()).collect();
                let in_flight = a.out.join(format!("{target}-in-flight.bin"));
                if total.crashes.insert(key) {
                    let kept = a.out.join(format!("{target}-crash-{}.bin", total.runs));
                    let saved = std::fs::rename(&in_flight, &kept).is_ok();
                    total.findings.push(format!(
                        "crash {} ({s}): {why}",
                        if saved {
                            kept.display().to_string()
                        } else {
                            "-".into()
                        },
                    ));
                } else {
                    let _ = std::fs::remove_file(&in_flight);
                }
            }
            None => total
                .findings
                .push(format!("hang - {target}: killed a minute past its time")),
        }
        seed = seed.wrapping_add(1_000_003);
    }
    total
}

fn run(a: &Args) -> i32 {
    if let Err(e) = std::fs::create_dir_all(&a.out) {
        eprintln!("frt-fuzz: {}: {e}", a.out.display());
        return 2;
    }
    let queue = std::sync::Mutex::new(a.targets.clone().into_iter());
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..a.jobs.min(a.targets.len()) {
            s.spawn(|| {
                loop {
                    let Some(t) = queue.lock().unwrap().next() else {
                        break;
                    };
                    let r = run_target(a, &t);
                    results.lock().unwrap().push((t, r));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|(t, _)| NAMES.iter().position(|n| n == t));
    println!(
        "| target | execs | seconds | CPU seconds | execs/CPU s | corpus | outcomes | slowest ms | processes | findings |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let (mut execs, mut secs, mut cpu, mut found) = (0u64, 0f64, 0f64, 0usize);
    for (t, r) in &results {
        println!(
            "| {t} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {:.1} | {} | {} |",
            r.execs,
            r.secs,
            r.cpu,
            r.execs as f64 / r.cpu.max(1e-9),
            r.corpus,
            r.outcomes,
            r.slowest * 1e3,
            r.runs,
            r.findings.len()
        );
        execs += r.execs;
        secs += r.secs;
        cpu += r.cpu;
        found += r.findings.len();
    }
    println!(
        "total: {execs} executions, {:.1} minutes of fuzzing time, {:.1} CPU-minutes, {found} findings",
        secs / 60.0,
        cpu / 60.0
    );
    for (t, r) in &results {
        for f in &r.findings {
            println!("{t}: {f}");
        }
    }
    if found > 0 { 1 } else { 0 }
}

fn replay(mut args: impl Iterator<Item = String>) -> i32 {
    let Some(mut t) = args.next().as_deref().and_then(by_name) else {
        eprintln!("frt-fuzz replay TARGET FILE... (frt-fuzz list)");
        return 2;
    };
    for file in args {
        let input = match std::fs::read(&file) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("{file}: {e}");
                return 2;
            }
        };
        let t0 = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.run(&input)));
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        match r {
            Ok(Ok(())) => println!("{file}: accepted, {ms:.1} ms"),
            Ok(Err(e)) => println!("{file}: refused ({e}), {ms:.1} ms"),
            Err(_) => println!("{file}: PANIC, {ms:.1} ms"),
        }
    }
    0
}

fn main() {
    let mut args = std::env::args().skip(1);
    let code = match args.next().as_deref() {
        Some("list") => {
            for n in NAMES {
                println!("{n}");
            }
            0
        }
        Some("replay") => replay(args),
        Some("run") => match parse(args) {
            Ok(a) => run(&a),
            Err(e) => {
                eprintln!("frt-fuzz: {e}");
                2
            }
        },
        Some("child") => match parse(args) {
            Ok(a) if a.targets.len() == 1 => child(&a),
            Ok(_) => {
                eprintln!("frt-fuzz child: one target");
                2
            }
            Err(e) => {
                eprintln!("frt-fuzz: {e}");
                2
            }
        },
        _ => {
            eprintln!(
                "usage: frt-fuzz list | frt-fuzz run [--seconds N] [--jobs J] [--seed S] [--out DIR] [--slow-ms M] [TARGET ...] | frt-fuzz replay TARGET FILE..."
            );
            2
        }
    };
    std::process::exit(code);
}
