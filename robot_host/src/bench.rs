//! `frt-robot-host bench`: the robot host's figures on the device it runs on — full-size random
//! Pi0.5 in bf16 on CUDA (or, with `--tiny`, the tiny model in f32 on the host backend), two
//! 640×480 cameras:
//!
//! * tick p50/p99 (frames in → chunk out), alone and with Whisper transcribing without pause
//!   on a low-priority stream of the same device;
//! * stop → halt chunk p50/p99, the stop arriving before each of the tick's replays in turn;
//! * subgoal overwrite: host time of writing a new prompt's buffers (and of tokenizing it);
//! * host time per tick on the control thread (prompt and input writes; reading, guarding
//!   and publishing the chunk; the next tick's noise is drawn while the device runs), and per
//!   pair of frames on the I/O side (decoding into RGB8; the resize with padding and the
//!   scaling run on the policy's device, in the tick);
//! * where the slowest 1 % of ticks lose their time, against the median tick: frames in (wall
//!   and the thread's CPU time, the context switches the thread took meanwhile), the device,
//!   the control thread's host time, the bench thread's CPU time and page faults over the
//!   whole tick, the rest of the tick, and how long a fixed register-only loop took right
//!   after it (the core's speed); where in the run the slow ticks were, and the CPU
//!   time a virtual machine's host took from its CPUs (`steal`) during the run.

use crate::messages::{Command, Image, JointState, Outbound, Source};
use crate::node::{Clock, Node, SystemClock, TickOutcome};
use crate::{Config, Error, Result};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn pct(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What the calling thread has used so far: CPU time, context switches (voluntary,
/// involuntary) and page faults (minor + major); zeros where the OS does not tell.
#[derive(Clone, Copy, Default)]
struct Usage {
    cpu: Duration,
    switches: (i64, i64),
    faults: i64,
}

fn thread_usage() -> Usage {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid out pointer; `getrusage` fills the zeroed struct.
        let (cpu, ru) = unsafe {
            libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
            let mut ru: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
            (ts, ru)
        };
        Usage {
            cpu: Duration::new(cpu.tv_sec as u64, cpu.tv_nsec as u32),
            switches: (ru.ru_nvcsw, ru.ru_nivcsw),
            faults: ru.ru_minflt + ru.ru_majflt,
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        Usage::default()
    }
}

/// Microseconds a fixed chain of dependent integer steps takes on the calling thread: work
/// on the core's registers alone, no memory. Run beside each tick, it tells a core that runs
/// slower (its clock, a sibling thread, the hypervisor) from slower memory: a slow tick with
/// this as fast as in the median tick lost its time elsewhere.
fn core_probe() -> f64 {
    let a = Instant::now();
    let mut x = std::hint::black_box(0x9e37_79b9_7f4a_7c15u64);
    for _ in 0..CORE_PROBE_STEPS {
        x = x.rotate_left(7).wrapping_mul(0x2545_f491_4f6c_dd1d) ^ (x >> 3);
    }
    std::hint::black_box(x);
    a.elapsed().as_secs_f64() * 1e6
}

/// Steps of [`core_probe`]: a few microseconds on a current core.
const CORE_PROBE_STEPS: u32 = 4096;

/// The time the machine's host took from its CPUs (the `steal` column of `/proc/stat`'s `cpu`
/// line, all CPUs together), in clock ticks of `USER_HZ`; `None` where it cannot be read.
fn steal_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    // user nice system idle iowait irq softirq steal
    line.split_whitespace().nth(8)?.parse().ok()
}

/// [`steal_ticks`] now, in milliseconds.
fn steal_ms() -> Option<f64> {
    let ticks = steal_ticks(&std::fs::read_to_string("/proc/stat").ok()?)?;
    #[cfg(target_os = "linux")]
    // SAFETY: no arguments; reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    #[cfg(not(target_os = "linux"))]
    let hz = 100;
    (hz > 0).then(|| ticks as f64 * 1e3 / hz as f64)
}

/// One measured tick: its position in the run; frames in (wall, the thread's CPU time, its
/// voluntary and involuntary context switches meanwhile); then the tick's device part, host
/// time and total (ms); over the whole tick (frames in and the tick on the one bench
/// thread), that thread's CPU time and its page faults; then [`core_probe`] after it.
#[derive(Clone, Copy, Default)]
struct TickSample {
    index: usize,
    frames_wall: f64,
    frames_cpu: f64,
    frames_switches: (i64, i64),
    device: f64,
    /// The control thread's host time in two parts: the inputs written (before the replays)
    /// and the chunk read, guarded and published (after them).
    inputs: f64,
    chunk: f64,
    total: f64,
    total_cpu: f64,
    faults: i64,
    /// [`core_probe`] right after the tick, µs.
    probe: f64,
}

impl TickSample {
    /// The control thread's host time: both parts.
    fn host(&self) -> f64 {
        self.inputs + self.chunk
    }
}

/// The slowest 1 % of `ticks` (by total) against the median tick, field by field (means over
/// the slow ones), as table rows.
fn tail_rows(ticks: &[TickSample]) -> String {
    let mut by_total: Vec<&TickSample> = ticks.iter().collect();
    by_total.sort_by(|a, b| a.total.total_cmp(&b.total));
    let n = by_total.len();
    if n == 0 {
        return String::new();
    }
    let slow = &by_total[n - (n / 100).max(1)..];
    let median =
        |f: &dyn Fn(&TickSample) -> f64| pct(&ticks.iter().map(f).collect::<Vec<_>>(), 0.5);
    let mean =
        |f: &dyn Fn(&TickSample) -> f64| slow.iter().map(|t| f(t)).sum::<f64>() / slow.len() as f64;
    type Field<'a> = (&'a str, &'a dyn Fn(&TickSample) -> f64);
    let fields: [Field; 10] = [
        ("tick, ms", &|t| t.total),
        ("frames in (I/O side), wall, ms", &|t| t.frames_wall),
        ("frames in, the thread's CPU time, ms", &|t| t.frames_cpu),
        ("frames in, voluntary context switches", &|t| {
            t.frames_switches.0 as f64
        }),
        ("frames in, involuntary context switches", &|t| {
            t.frames_switches.1 as f64
        }),
        ("device (replays enqueued → last finished), ms", &|t| {
            t.device
        }),
        ("host time on the control thread, ms", &|t| t.host()),
        ("the bench thread's CPU time over the tick, ms", &|t| {
            t.total_cpu
        }),
        ("page faults over the tick (minor + major)", &|t| {
            t.faults as f64
        }),
        (
            "a fixed register-only loop right after the tick (the core's speed), µs",
            &|t| t.probe,
        ),
    ];
    let mut r = format!(
        "\nThe slowest {} of {n} ticks against the median tick (means over the slow ones):\n\n| measure | median tick | slowest 1 % |\n|---|---|---|\n",
        slow.len()
    );
    for (what, f) in fields {
        r += &format!("| {what} | {:.3} | {:.3} |\n", median(f), mean(f));
    }
    let rest = |t: &TickSample| t.total - t.frames_wall - t.device - t.host();
    r += &format!(
        "| rest of the tick (state, waits, bookkeeping), ms | {:.3} | {:.3} |\n",
        median(&rest),
        mean(&rest)
    );
    let mut at: Vec<usize> = slow.iter().map(|t| t.index).collect();
    at.sort_unstable();
    let at: Vec<String> = at.iter().map(|i| i.to_string()).collect();
    r += &format!(
        "\nThe slowest ticks' positions in the run (of 0 to {}): {}.\n",
        n - 1,
        at.join(", ")
    );
    r
}

/// Options of a bench run.
pub struct BenchOptions {
    pub iters: usize,
    /// The tiny model on the host backend instead of full size on CUDA.
    pub tiny: bool,
    /// A Whisper model folder for the concurrent-ASR figures.
    pub whisper: Option<std::path::PathBuf>,
    /// The clip Whisper transcribes over and over.
    pub clip: std::path::PathBuf,
    /// `precision: fp8`, with a calibration the bench records first on its own inputs (the
    /// model in bf16, [`FP8_CALIBRATION_TICKS`] ticks).
    pub fp8: bool,
    /// The node's real-time settings (`control.cpu`, `control.realtime`) applied to the bench
    /// thread, which runs the ticks as the control thread does, once the model is built.
    pub cpu: Option<usize>,
    pub realtime: bool,
}

/// The ticks an `fp8` bench records its calibration on.
pub const FP8_CALIBRATION_TICKS: u64 = 16;

/// The two cameras' frames the bench sends (synthesized, `w × h` rgb8).
fn frames(w: u32, h: u32) -> Vec<Image> {
    (0..2)
        .map(|k| Image::Raw {
            encoding: "rgb8".into(),
            width: w,
            height: h,
            step: w * 3,
            data: crate::transport::synth_frame(w, h, 0.3, k),
        })
        .collect()
}

/// Observation `k`: both frames and a state, stamped now; returns what the frames took on the
/// I/O side (decoding): wall and CPU time, context switches.
fn observe(
    inputs: &crate::node::Inputs,
    clock: &dyn Clock,
    frames: &[Image],
    joints: &[String],
    k: u64,
) -> Result<TickSample> {
    let t = clock.now();
    let u0 = thread_usage();
    let a = Instant::now();
    inputs.frame("base", t, &frames[0])?;
    inputs.frame("wrist", t, &frames[1])?;
    let wall = a.elapsed();
    let u1 = thread_usage();
    let dec = TickSample {
        frames_wall: ms(wall),
        frames_cpu: ms(u1.cpu.saturating_sub(u0.cpu)),
        frames_switches: (u1.switches.0 - u0.switches.0, u1.switches.1 - u0.switches.1),
        ..Default::default()
    };
    inputs.state(&JointState {
        stamp: t,
        names: joints.to_vec(),
        position: (0..8).map(|j| 0.1 * ((k + j) % 7) as f64 - 0.3).collect(),
    })?;
    Ok(dec)
}

/// Records an FP8 calibration for `cfg` (its model in bf16) on the bench's inputs and writes
/// it to `path`.
fn calibrate(cfg: &Config, path: &Path) -> Result<frt_vla::calibration::Calibration> {
    let mut cfg = cfg.clone();
    cfg.model.precision = crate::config::Precision::Bf16;
    cfg.model.calibration = None;
    let clock = Arc::new(SystemClock);
    let (mut node, inputs, out) = Node::new(cfg.clone(), clock.clone(), None)?;
    node.calibrate(frt_vla::calibration::DEFAULT_PERCENTILE)?;
    let frames = frames(640, 480);
    for k in 0..FP8_CALIBRATION_TICKS {
        observe(&inputs, clock.as_ref(), &frames, &cfg.state.joints, k)?;
        let r = node.tick();
        if r != TickOutcome::Published {
            return Err(Error::bad("bench calibration tick", format!("{r:?}")));
        }
        out.0.try_iter().for_each(drop);
    }
    let cal = node
        .calibration()
        .expect("calibrating since the node was built")?;
    cal.write(path)?;
    Ok(cal)
}

pub(crate) fn config(tiny: bool) -> Result<Config> {
    let model = if tiny {
        "  random: { size: tiny, seed: 1 }\n  precision: f32\n  backend: host\n  max_token_len: 96"
    } else {
        "  random: { size: base, seed: 1 }\n  tokenizer: TOKENIZER\n  precision: bf16\n  backend: cuda\n  max_token_len: 64"
    };
    let text = format!(
        "model:\n{model}
cameras:
  - {{ name: base, topic: /base/image_raw, format: raw, view: 0 }}
  - {{ name: wrist, topic: /wrist/image_raw, format: raw, view: 1 }}
state:
  topic: /joint_states
  joints: [j1, j2, j3, j4, j5, j6, j7, j8]
control:
  rate_hz: 50
  initial_subgoal: pick up the red block and put it in the bowl
  action_dim: 8
  # 0.1 s between actions: a chunk covers 5 s, so that a tick slowed down by a loaded machine
  # (the tiny model on the host) still publishes (a chunk whose rows are all past is refused).
  dt: 0.1
safety:
  max_observation_age_ms: 100000
  missing_camera: degrade
  action_space: velocity
  action_min: [-10.0]
  action_max: [10.0]
"
    );
    Ok(Config::parse(&text)?)
}

/// Runs the bench and returns its report (a Markdown table).
pub fn run(o: &BenchOptions, tokenizer: Option<&Path>) -> Result<String> {
    let mut cfg = config(o.tiny)?;
    if !o.tiny {
        let t = tokenizer.ok_or_else(|| {
            Error::bad(
                "bench",
                "full size needs a Gemma tokenizer.json (--tokenizer FILE; scripts/fetch-models.sh fetches one)",
            )
        })?;
        cfg.model.tokenizer = Some(t.to_path_buf());
    }
    // FP8: a calibration recorded first, in a file of the bench's own (removed after).
    let cal_file = std::env::temp_dir().join(format!("frt-bench-fp8-{}.json", std::process::id()));
    let calibration_s = if o.fp8 {
        let t = Instant::now();
        calibrate(&cfg, &cal_file)?;
        cfg.model.precision = crate::config::Precision::Fp8;
        cfg.model.calibration = Some(cal_file.clone());
        Some(t.elapsed().as_secs_f64())
    } else {
        None
    };
    let clock = Arc::new(SystemClock);
    let t_build = Instant::now();
    let built = Node::new(cfg.clone(), clock.clone(), None);
    if o.fp8 {
        let _ = std::fs::remove_file(&cal_file);
    }
    let (mut node, inputs, out) = built?;
    let build_s = t_build.elapsed().as_secs_f64();
    // What of the real-time settings asked for applied (none asked: nothing said).
    let realtime: Vec<String> = crate::realtime::apply(o.cpu, o.realtime)
        .into_iter()
        .map(|r| r.unwrap_or_else(|why| format!("NOT applied: {why}")))
        .collect();
    let ctx = node.policy().ctx().clone();
    let (lo, hi) = ctx.priority_range();
    let (policy_priority, _, asr_priority) = cfg.streams.resolve((lo, hi));
    let target = node.policy().target();
    let (w, h) = (640u32, 480u32);
    let frames = frames(w, h);
    let joints: Vec<String> = cfg.state.joints.clone();
    // One observation; returns the host time spent decoding the two frames.
    let mut observe = |k: u64| observe(&inputs, clock.as_ref(), &frames, &joints, k);
    let drain = |out: &crate::Outputs| out.0.try_iter().count();
    // Warm-up.
    for k in 0..5 {
        observe(k)?;
        node.tick();
    }
    drain(&out);
    type Observe<'a> = dyn FnMut(u64) -> Result<TickSample> + 'a;
    let tick = |node: &mut Node, observe: &mut Observe, k: u64| -> Result<TickSample> {
        let u0 = thread_usage();
        let mut sample = observe(k)?;
        let a = Instant::now();
        let r = node.tick();
        let total = a.elapsed();
        let u1 = thread_usage();
        sample.index = k as usize;
        sample.total_cpu = ms(u1.cpu.saturating_sub(u0.cpu));
        sample.faults = u1.faults - u0.faults;
        sample.probe = core_probe();
        if r != TickOutcome::Published {
            return Err(Error::bad("bench tick", format!("{r:?}")));
        }
        let tm = node.last_timings();
        sample.total = ms(total) + sample.frames_wall;
        (sample.inputs, sample.chunk) = (ms(tm.prepare), ms(tm.finish));
        sample.device = ms(tm.device);
        // The chunk is taken as the node's publisher takes it, so that its buffer goes back
        // to the node's pool (outside the times above).
        drain(&out);
        Ok(sample)
    };
    let mut ticks = Vec::new();
    let steal0 = steal_ms();
    for k in 0..o.iters as u64 {
        ticks.push(tick(&mut node, &mut observe, k)?);
    }
    let stolen = steal_ms().zip(steal0).map(|(b, a)| b - a);
    let alone: Vec<f64> = ticks.iter().map(|t| t.total).collect();
    let host: Vec<f64> = ticks.iter().map(TickSample::host).collect();
    let inputs: Vec<f64> = ticks.iter().map(|t| t.inputs).collect();
    let chunk: Vec<f64> = ticks.iter().map(|t| t.chunk).collect();
    let frames_in: Vec<f64> = ticks.iter().map(|t| t.frames_wall).collect();
    drain(&out);

    // With Whisper transcribing without pause on the lowest-priority stream: as the node runs
    // it (gated: its replays are enqueued between ticks), and ungated.
    let mut with_asr = Vec::new();
    let mut ungated = Vec::new();
    let mut asr_runs = [0usize; 2];
    if let Some(dir) = &o.whisper {
        let s = ctx.stream(asr_priority)?;
        let dtype = if o.tiny {
            frt_kernels::DType::F32
        } else {
            frt_kernels::DType::F16
        };
        let mut whisper = frt_asr::Whisper::load(
            &ctx,
            dir,
            s,
            frt_asr::ModelOptions {
                dtype,
                kernels: cfg.kernels,
                ..Default::default()
            },
        )?;
        let clip = Arc::new(frt_asr::audio::read_wav(&o.clip)?.to_whisper());
        for (i, gate) in [Some(node.asr_gate()), None].into_iter().enumerate() {
            whisper.model.set_gate(gate);
            let busy = Arc::new(AtomicBool::new(true));
            let th = {
                let (busy, clip) = (busy.clone(), clip.clone());
                // The thread hands the model back with its count of transcriptions.
                std::thread::spawn(move || {
                    let mut runs = 0usize;
                    while busy.load(Ordering::Relaxed) {
                        runs += usize::from(whisper.transcribe(&clip).is_ok());
                    }
                    (whisper, runs)
                })
            };
            std::thread::sleep(Duration::from_millis(200));
            let into = if i == 0 { &mut with_asr } else { &mut ungated };
            for k in 0..o.iters as u64 {
                into.push(tick(&mut node, &mut observe, k)?.total);
            }
            busy.store(false, Ordering::Relaxed);
            (whisper, asr_runs[i]) = th
                .join()
                .map_err(|_| Error::bad("bench", "the ASR thread panicked"))?;
            drain(&out);
        }
    }

    // Stop → halt chunk, the stop arriving before each replay in turn.
    let stages = node.policy().stages().len();
    let mut halt = Vec::new();
    for k in 0..o.iters as u64 {
        let at = (k as usize) % stages;
        let inp = node.inputs();
        node.set_stage_hook(Some(Box::new(move |i| {
            if i == at {
                let _ = inp.command(Command::Stop, Source::Typed);
            }
        })));
        observe(k)?;
        let r = node.tick();
        node.set_stage_hook(None);
        if r != TickOutcome::Halted {
            return Err(Error::bad("bench stop", format!("{r:?}")));
        }
        for m in out.0.try_iter() {
            if let Outbound::Chunk(c) = m {
                if c.halt {
                    halt.push(c.latency * 1e3);
                }
            }
        }
        node.inputs().command(Command::Resume, Source::Typed)?;
        node.drain_commands();
    }

    // Subgoal overwrite.
    let p = node.policy();
    let state: Vec<f32> = (0..8).map(|j| 0.05 * j as f32).collect();
    let (mut tok, mut write) = (Vec::new(), Vec::new());
    for k in 0..o.iters {
        let goal = if k % 2 == 0 {
            "open the top drawer"
        } else {
            "wipe the table with the sponge"
        };
        let a = Instant::now();
        let tokens = p.prompt_tokens(goal, &state)?;
        let b = Instant::now();
        p.set_prompt(&tokens)?;
        let c = Instant::now();
        ctx.sync_stream(p.stream())?;
        tok.push(ms(b - a) * 1e3);
        write.push(ms(c - b) * 1e3);
    }

    let mut r = format!(
        "device: {target}; {}; 2 cameras {w}×{h} rgb8; {} iterations; model built in {build_s:.1} s; stream priorities policy {policy_priority}, halt {hi}, ASR {asr_priority}\n\n",
        match (o.tiny, calibration_s) {
            (true, None) => "tiny Pi0.5, f32".to_string(),
            (false, None) => "full-size random Pi0.5, bf16".to_string(),
            (tiny, Some(s)) => format!(
                "{} random Pi0.5, FP8 (bf16 elsewhere; calibrated on {FP8_CALIBRATION_TICKS} of the bench's ticks in {s:.1} s)",
                if tiny { "tiny" } else { "full-size" }
            ),
        },
        o.iters,
    );
    if !realtime.is_empty() {
        r += &format!("Ticking thread: {}.\n\n", realtime.join("; "));
    }
    r += "| measure | p50 | p99 |\n|---|---|---|\n";
    r += &format!(
        "| tick (frames in → chunk out), ms | {:.3} | {:.3} |\n",
        pct(&alone, 0.5),
        pct(&alone, 0.99)
    );
    for (rows, what, runs) in [
        (
            &mut with_asr,
            "gated between ticks, as the node runs it",
            asr_runs[0],
        ),
        (&mut ungated, "ungated", asr_runs[1]),
    ] {
        if rows.is_empty() {
            continue;
        }
        r += &format!(
            "| tick with Whisper transcribing back to back, {what} ({runs} transcriptions), ms | {:.3} | {:.3} |\n",
            pct(rows, 0.5),
            pct(rows, 0.99)
        );
        r += &format!(
            "| → inflation of the p50 | {:+.1} % | |\n",
            (pct(rows, 0.5) / pct(&alone, 0.5) - 1.0) * 100.0
        );
    }
    r += &format!(
        "| stop → halt chunk published, ms | {:.3} | {:.3} |\n",
        pct(&halt, 0.5),
        pct(&halt, 0.99)
    );
    r += &format!(
        "| subgoal overwrite (prompt buffers written), µs | {:.1} | {:.1} |\n",
        pct(&write, 0.5),
        pct(&write, 0.99)
    );
    r += &format!(
        "| subgoal tokenization, µs | {:.1} | {:.1} |\n",
        pct(&tok, 0.5),
        pct(&tok, 0.99)
    );
    r += &format!(
        "| host time per tick on the control thread (prompt, input writes; chunk read, guards, publish), ms | {:.3} | {:.3} |\n",
        pct(&host, 0.5),
        pct(&host, 0.99)
    );
    r += &format!(
        "| → inputs written (observations taken, prompt and state, frames and noise uploaded, frames resized), ms | {:.3} | {:.3} |\n",
        pct(&inputs, 0.5),
        pct(&inputs, 0.99)
    );
    r += &format!(
        "| → the chunk read, guarded and published, ms | {:.3} | {:.3} |\n",
        pct(&chunk, 0.5),
        pct(&chunk, 0.99)
    );
    r += &format!(
        "| frames in on the I/O side: decoding into RGB8, both cameras, ms | {:.3} | {:.3} |\n",
        pct(&frames_in, 0.5),
        pct(&frames_in, 0.99)
    );
    r += &tail_rows(&ticks);
    if let Some(stolen) = stolen {
        r += &format!(
            "CPU time the machine's host took from its CPUs during those ticks (/proc/stat steal, all CPUs, 10 ms steps): {stolen:.0} ms.\n"
        );
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tail table takes the slowest 1 % by total and averages each field over them.
    #[test]
    fn the_tail_rows_average_the_slowest_ticks() {
        let ticks: Vec<TickSample> = (1..=200)
            .map(|i| TickSample {
                // the run's order is another than the totals'
                index: (i * 7) % 200,
                total: i as f64,
                frames_wall: if i > 198 { 3.0 } else { 0.5 },
                frames_cpu: 0.4,
                frames_switches: (0, i64::from(i > 198)),
                device: 10.0,
                inputs: 0.1,
                total_cpu: if i > 198 { 4.0 } else { 1.0 },
                faults: i64::from(i > 198) * 6,
                probe: 2.0,
                ..Default::default()
            })
            .collect();
        let r = tail_rows(&ticks);
        assert!(r.contains("The slowest 2 of 200 ticks"), "{r}");
        assert!(r.contains("| tick, ms | 101.000 | 199.500 |"), "{r}");
        assert!(
            r.contains("| frames in (I/O side), wall, ms | 0.500 | 3.000 |"),
            "{r}"
        );
        assert!(
            r.contains("| frames in, involuntary context switches | 0.000 | 1.000 |"),
            "{r}"
        );
        assert!(
            r.contains("| the bench thread's CPU time over the tick, ms | 1.000 | 4.000 |"),
            "{r}"
        );
        assert!(
            r.contains("| page faults over the tick (minor + major) | 0.000 | 6.000 |"),
            "{r}"
        );
        assert!(
            r.contains("| a fixed register-only loop right after the tick (the core's speed), µs | 2.000 | 2.000 |"),
            "{r}"
        );
        // ticks 199 and 200 ran at positions 193 and 0
        assert!(
            r.contains("The slowest ticks' positions in the run (of 0 to 199): 0, 193."),
            "{r}"
        );
        assert!(tail_rows(&[]).is_empty());
    }

    /// The steal column is the eighth number of `/proc/stat`'s `cpu` line (not of a `cpuN`
    /// line); a file without it gives none.
    #[test]
    fn steal_is_read_from_the_cpu_line() {
        let stat = "cpu  4705 356 584 3699 23 23 0 1234 0 0\ncpu0 1393 280 290 1200 3 3 0 999 0 0\nintr 1\n";
        assert_eq!(steal_ticks(stat), Some(1234));
        assert_eq!(steal_ticks("cpu  1 2 3\n"), None);
        assert_eq!(steal_ticks("intr 1\n"), None);
        #[cfg(target_os = "linux")]
        assert!(steal_ms().is_some_and(|m| m >= 0.0));
    }

    /// The core probe takes some time, and twice the steps take longer than the steps (the
    /// loop is not optimized away): the median of 21 runs of each.
    #[test]
    fn the_core_probe_runs_its_steps() {
        let median = |f: &dyn Fn() -> f64| {
            let mut v: Vec<f64> = (0..21).map(|_| f()).collect();
            v.sort_by(f64::total_cmp);
            v[10]
        };
        let one = median(&core_probe);
        let two = median(&|| core_probe() + core_probe());
        assert!(one > 0.0 && one.is_finite(), "{one}");
        assert!(two > one, "{one} µs once, {two} µs twice");
    }
}
