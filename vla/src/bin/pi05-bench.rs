//! The canonical Pi0.5 benchmark (shared/DESIGN.md §Measuring) on a CUDA GPU: 2 views, a
//! 40-token prompt in fixed-length mode (64-token maximum, then 200; then in exact mode), 10
//! steps, horizon 50, action dim 32, bf16, random weights at full size.
//!
//! `pi05-bench [--iters N]`: per stage (vision, prefix, one step — CUDA events around each
//! replay) and end to end (the Plan, events around it), p50 and p99 over N iterations after
//! warm-up, and the GPU memory in use; rows for 64 and 200 prompt tokens, the exact prompt
//! mode, and a configuration of 3 camera slots with one view absent (that model measured again
//! at once, then with every view present, then with one absent again). Then, for the 64-token
//! rows, each stage's floor (its FLOPs and bytes, `frt_vla::cost`, on the device's measured
//! ceilings: a bf16 GEMM of 8192³ and a 1 GiB device copy) and the fraction of it reached.
//!
//! `pi05-bench --pi0 [--canonical]`: the same rows for Pi0 (openpi `pi0`, a 14-value state).
//!
//! `pi05-bench --canonical`: the 64-token rows only (2 views; 3 slots, one absent) (for A/B runs of settings such as
//! `FRT_GEMM_TUNING` or `FRT_ATTENTION`, one process per setting). `--masked`: every view
//! slot encoded, absent ones masked, instead of leaving them out (`compact_views` off).
//! `--no-variant-run`: the variants for fewer views are not run once when the model is built
//! (`run_variants_once` off).
//!
//! `pi05-bench --inpaint`: the cost of frozen-prefix denoising: the 64-token model built
//! twice without it (the second build shows how much two builds of one model differ: each
//! tunes its GEMMs) and once with it (5 rows frozen), from the same weights, measured
//! alternately in one process: steps 0 (it copies the noise), 3 and 9, and end to end.
//!
//! `pi05-bench --precision`: the full-size model built in f32 and in bf16 from the same random
//! weights, run on the same inputs and noise (the canonical ones and two random sets): per
//! set 1 − cosine and max |Δ| of bf16's actions against f32's.
//!
//! `pi05-bench --fp8-expert [--iters N]`: the 64-token bf16 model calibrated on 16 synthesized
//! observations (random views, prompts and noise), then built again from the same weights with
//! its action expert in FP8 (`Pi05Options::fp8`, `fp8_prefix` off), with its prefix in FP8
//! too, and with SigLIP as well (`fp8_vision`): per held-out set (the canonical inputs and
//! three random ones) 1 − cosine and max |Δ| of each FP8 model's actions against bf16's; then
//! the four models timed alternately (vision, prefix, one step and end to end, p50 / p99) and
//! the GPU memory in use.
//!
//! `pi05-bench --profile-absent`: the 3-slot model with one view absent, vision, prefix and one
//! step in two profiled ranges: after ten runs, and after runs with every view present.
//!
//! `pi05-bench --write-checkpoint DIR [--f32] [--pi0]`: writes full-size random weights (seed 1)
//! as a safetensors checkpoint in openpi's naming (bf16, or f32 with `--f32`; 4 shards and an
//! index, and a `config.json`) for start-up measurements from a real file; needs no GPU.
//!
//! `pi05-bench --profile`: builds the 64-token model and replays vision, prefix and one step
//! once each, without warm-up, between `cuProfilerStart` and `cuProfilerStop` — a short run
//! to put under a kernel profiler (e.g. `ncu --profile-from-start off --graph-profiling node`).
//! `pi05-bench --fp8-expert --profile`: the same for the model with SigLIP, the prefix and the
//! expert in FP8 (calibrated on 2 observations only, then ten runs on the canonical inputs),
//! nothing timed.
//! `--profile-only vision,prefix,step` (with either) replays only the stages named, in that
//! order (a profiler takes a while per kernel: one step's kernels alone profile quickly).
//! `pi05-bench --kernel-times [FILE]`: builds the 64-token model with a kernel trace running
//! (`frt_exec::kernel_trace`, CUPTI; its folder on `LD_LIBRARY_PATH`), then replays each
//! stage (vision, prefix, one step; `--profile-only` picks) 20 times after ten runs and prints,
//! per stage, the kernels as they ran in the replay: its span, the kernels' own time, the time
//! no kernel ran, and per kernel name the count, time and the gaps before them (medians over
//! the replays); FILE, when given, gets one CSV row per kernel of each stage, and
//! `--kernel-trace FILE.json` every traced replay's kernels as a Chrome trace (a track per
//! stream; ui.perfetto.dev opens it). Recording adds to every launch, so these spans are
//! longer than the timed runs'. With `--fp8-expert --profile` it traces the model with every
//! stage in FP8 (calibrated as `--profile` calibrates it) instead of the bf16 one.
//! `--fp8-expert --write-calibration FILE` also writes the calibration it makes;
//! `--fp8-expert --profile --calibration FILE` profiles the model built on that file instead
//! of calibrating (under a profiler, building and calibrating the bf16 model takes minutes).

use frt_exec::Ctx;
use frt_exec::kernel_trace::ReplayProfile;
use frt_kernels::DType;
use frt_kernels::KernelOptions;
use frt_vla::{
    ModelImage, Observation, Pi05, Pi05Config, Pi05Options, Pi05Weights, PromptMode, Stage,
    StageOutput, ViewImage,
};

/// The kernel options of every model built here: the defaults, overridden from the
/// environment (`frt_kernels::options::ENV_VARS`: `FRT_ATTENTION`, `FRT_GEMM_TUNING`,
/// `FRT_PDL` …), read once.
static KERNEL_OPTIONS: std::sync::OnceLock<KernelOptions> = std::sync::OnceLock::new();

/// `--masked`: every view slot encoded and absent ones masked (`compact_views` off), for A/B
/// runs against the default.
static MASKED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Builds the model with the benchmark's kernel options.
fn build(
    ctx: &Ctx,
    s: frt_exec::Stream,
    w: &Pi05Weights,
    dtype: DType,
    prompt_mode: PromptMode,
    inpaint_prefix: bool,
) -> Pi05 {
    build_with(ctx, s, w, dtype, prompt_mode, inpaint_prefix, None)
}

/// [`build`] with an FP8 action expert of that calibration.
fn build_with(
    ctx: &Ctx,
    s: frt_exec::Stream,
    w: &Pi05Weights,
    dtype: DType,
    prompt_mode: PromptMode,
    inpaint_prefix: bool,
    fp8_expert: Option<frt_vla::calibration::Calibration>,
) -> Pi05 {
    let kernels = *KERNEL_OPTIONS.get().expect("read in main");
    let o = Pi05Options {
        dtype,
        prompt_mode,
        inpaint_prefix,
        kernels,
        compact_views: !MASKED.get().copied().unwrap_or(false),
        run_variants_once: !std::env::args().any(|a| a == "--no-variant-run"),
        fp8: fp8_expert,
        fp8_prefix: false,
        fp8_vision: false,
        // The FP8 models here are never calibrated (the bf16 model is): only their FP8
        // weights are loaded for the stacks in FP8.
        fp8_keep_16bit: false,
    };
    Pi05::build(ctx, s, w, &o).unwrap()
}

/// `--write-checkpoint`: full-size random weights written as a safetensors checkpoint.
fn write_checkpoint(dir: &std::path::Path, pi0: bool, f32_weights: bool) {
    let c = if pi0 {
        Pi05Config::pi0_base()
    } else {
        Pi05Config::base()
    };
    let t = std::time::Instant::now();
    let tensors = frt_vla::weights::random_tensors(&c, 1);
    let generated = t.elapsed().as_secs_f64();
    frt_vla::weights::write_tensors(dir, &c, &tensors, !f32_weights, 4, false).unwrap_or_else(
        |e| {
            eprintln!("pi05-bench: writing {}: {e}", dir.display());
            std::process::exit(1)
        },
    );
    let values: usize = tensors.iter().map(|(_, _, v)| v.len()).sum();
    println!(
        "wrote {} ({} tensors, {:.2} G values in {}; generated in {generated:.1} s, written in {:.1} s)",
        dir.display(),
        tensors.len(),
        values as f64 / 1e9,
        if f32_weights { "f32" } else { "bf16" },
        t.elapsed().as_secs_f64() - generated
    );
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Milliseconds of what a closure enqueues on `s`, between two CUDA events.
fn timer(ctx: &Ctx, s: frt_exec::Stream) -> impl Fn(&dyn Fn()) -> f64 {
    let (t0, t1) = (ctx.timing_event().unwrap(), ctx.timing_event().unwrap());
    move |f: &dyn Fn()| {
        t0.record(s).unwrap();
        f();
        t1.record(s).unwrap();
        t1.synchronize().unwrap();
        t1.elapsed_ms(&t0).unwrap() as f64
    }
}

/// The device's ceilings, measured: bf16 GEMM FLOP/s (8192³) and memory bandwidth (bytes
/// read plus written by a device-to-device copy of 1 GiB), medians of 20.
fn ceilings(ctx: &Ctx, s: frt_exec::Stream) -> (f64, f64) {
    let time = timer(ctx, s);
    let big = 1usize << 30;
    let (src, dst) = (
        frt_exec::Buffer::alloc(ctx, "src", big).unwrap(),
        frt_exec::Buffer::alloc(ctx, "dst", big).unwrap(),
    );
    let mut ms: Vec<f64> = (0..22)
        .map(|_| time(&|| frt_exec::Buffer::copy(&dst, 0, &src, 0, big, s).unwrap()))
        .skip(2)
        .collect();
    let bandwidth = 2.0 * big as f64 / (pct(&mut ms, 0.5) * 1e-3);
    drop((src, dst));
    let k = frt_kernels::Kernels::new(ctx).unwrap();
    let n = 8192;
    let tensor = |name: &str, seed: u32| {
        let t = frt_kernels::Tensor::alloc(ctx, name, DType::BF16, &[n, n]).unwrap();
        let mut x = seed;
        let v: Vec<f32> = (0..n * n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x as f32 / u32::MAX as f32 - 0.5) * 0.5
            })
            .collect();
        t.write_f32(s, &v).unwrap();
        t
    };
    let (a, w, c) = (tensor("a", 7), tensor("w", 11), tensor("c", 13));
    let g = k.linear(&a, &w, &c, false, false).unwrap();
    let mut ms: Vec<f64> = (0..22)
        .map(|_| time(&|| g.run(s, &a, &w, &c, None).unwrap()))
        .skip(2)
        .collect();
    let flops = 2.0 * (n * n * n) as f64 / (pct(&mut ms, 0.5) * 1e-3);
    (flops, bandwidth)
}

/// One row's medians (ms) and what it ran: the configuration, the views present, the prompt
/// capacity.
struct Measured {
    label: String,
    config: Pi05Config,
    present: usize,
    prompt: usize,
    p50: [f64; 4],
}

/// Per stage of each row: its FLOPs and bytes (`frt_vla::cost`), its floor on this device's
/// ceilings, and how much of that floor the measured median reaches.
fn floors(rows: &[Measured], flops: f64, bandwidth: f64) {
    use frt_vla::cost;
    println!(
        "\nfloors on this device's ceilings ({:.0} TFLOP/s bf16, {:.0} GB/s): FLOPs, the bytes that \
         must move (weights once, key/value caches), floor = max(FLOPs / peak, bytes / bandwidth)\n",
        flops / 1e12,
        bandwidth / 1e9
    );
    println!("| row | stage | p50 ms | GFLOP | MB | floor ms | floor / p50 |");
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        let st = cost::stages(&r.config, r.present, r.prompt, 2.0);
        let e2e = cost::end_to_end_floor_s(&r.config, r.present, r.prompt, 2.0, flops, bandwidth);
        let names = ["vision", "prefix", "one step"];
        for (i, (c, _)) in st.iter().enumerate() {
            let floor = c.floor_s(flops, bandwidth) * 1e3;
            println!(
                "| {} | {} | {:.3} | {:.1} | {:.1} | {floor:.3} | {:.0} % |",
                r.label,
                names[i],
                r.p50[i],
                c.flops / 1e9,
                c.bytes / 1e6,
                100.0 * floor / r.p50[i]
            );
        }
        println!(
            "| {} | end to end | {:.3} | | | {:.3} | {:.0} % |",
            r.label,
            r.p50[3],
            e2e * 1e3,
            100.0 * e2e * 1e3 / r.p50[3]
        );
    }
}

/// The canonical inputs: one view (used for both cameras), a 40-token prompt, the noise.
fn canonical_inputs(c: &Pi05Config) -> (ModelImage, Vec<u32>, Vec<f32>) {
    let px = c.siglip.image_size * c.siglip.image_size * 3;
    let img = ModelImage::new(
        (0..px)
            .map(|i| ((i * 37 % 255) as f32 / 127.5) - 1.0)
            .collect(),
    )
    .unwrap();
    let tokens: Vec<u32> = (0..40u32).map(|i| 2 + i * 101).collect();
    let noise: Vec<f32> = (0..c.action_horizon * c.action_dim)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) / 4.0)
        .collect();
    (img, tokens, noise)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let iters: usize = args
        .iter()
        .position(|a| a == "--iters")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let profile = args.iter().any(|a| a == "--profile");
    let kernel_times = args.iter().position(|a| a == "--kernel-times").map(|i| {
        args.get(i + 1)
            .filter(|f| !f.starts_with("--"))
            .map(std::path::PathBuf::from)
    });
    let kernel_json = file_arg(&args, "--kernel-trace");
    if kernel_json.is_some() && kernel_times.is_none() {
        eprintln!("pi05-bench: --kernel-trace goes with --kernel-times");
        std::process::exit(2)
    }
    let other_mode = [
        "--fp8-expert",
        "--inpaint",
        "--precision",
        "--profile",
        "--profile-absent",
    ]
    .into_iter()
    .find(|m| args.iter().any(|a| a == m));
    let has = |flag: &str| args.iter().any(|a| a == flag);
    // `--fp8-expert --profile` traces the model with every stage in FP8.
    let fp8_profile = has("--fp8-expert") && has("--profile");
    if let (Some(_), Some(mode), false) = (&kernel_times, other_mode, fp8_profile) {
        eprintln!(
            "pi05-bench: --kernel-times traces the bf16 model's stages (or, with --fp8-expert --profile, the FP8 model's), not {mode}"
        );
        std::process::exit(2)
    }
    let stages = profiled_stages(&args).unwrap_or_else(|e| {
        eprintln!("pi05-bench: {e}");
        std::process::exit(2)
    });
    PROFILED.set(stages).expect("set once");
    let inpaint = args.iter().any(|a| a == "--inpaint");
    let profile_absent = args.iter().any(|a| a == "--profile-absent");
    let canonical = profile
        || profile_absent
        || kernel_times.is_some()
        || args.iter().any(|a| a == "--canonical");
    let pi0 = args.iter().any(|a| a == "--pi0");
    if let Some(dir) = args
        .iter()
        .position(|a| a == "--write-checkpoint")
        .map(|i| args.get(i + 1))
    {
        let Some(dir) = dir else {
            eprintln!("pi05-bench: --write-checkpoint needs a folder");
            std::process::exit(2)
        };
        write_checkpoint(
            std::path::Path::new(dir),
            pi0,
            args.iter().any(|a| a == "--f32"),
        );
        return;
    }
    let options = KernelOptions::from_env().unwrap_or_else(|e| {
        eprintln!("pi05-bench: {e}");
        std::process::exit(2)
    });
    KERNEL_OPTIONS.set(options).expect("set once");
    MASKED
        .set(args.iter().any(|a| a == "--masked"))
        .expect("set once");
    let ctx = Ctx::cuda(0).unwrap_or_else(|e| {
        eprintln!("pi05-bench needs a CUDA GPU: {e}");
        std::process::exit(1)
    });
    let cu = ctx.cuda_context().unwrap().clone();
    println!(
        "device: {}; bf16; {iters} iterations after 10 warm-ups; {options:?}\n",
        cu.name().unwrap_or_default()
    );
    if inpaint {
        inpaint_cost(&ctx, iters);
        return;
    }
    // Started before any graph is captured, so that their kernels are recorded.
    let trace = kernel_times.as_ref().map(|_| {
        frt_exec::kernel_trace::KernelTrace::start().unwrap_or_else(|e| {
            eprintln!("pi05-bench --kernel-times: {e}");
            std::process::exit(1)
        })
    });
    if args.iter().any(|a| a == "--fp8-expert") {
        let traced = trace
            .as_ref()
            .zip(kernel_times.as_ref())
            .map(|(t, csv)| Traced {
                trace: t,
                csv: csv.as_deref(),
                json: kernel_json.as_deref(),
            });
        fp8_expert(
            &ctx,
            iters,
            profile,
            &CalibrationFiles::from_args(&args),
            traced,
        );
        return;
    }
    if args.iter().any(|a| a == "--precision") {
        precision(&ctx);
        return;
    }
    let (peak_flops, bandwidth) = ceilings(&ctx, ctx.stream(0).unwrap());
    println!("model: {}", if pi0 { "Pi0" } else { "Pi0.5" });
    println!(
        "| prompt max | vision p50 / p99 ms | prefix p50 / p99 ms | one step p50 / p99 ms | end to end p50 / p99 ms | GPU memory in use |"
    );
    println!("|---|---|---|---|---|---|");
    let mut measured = Vec::new();
    let mut chunks = Vec::new();
    // The canonical row, the longer prompts, and a config of 3 camera slots with one absent.
    for (max_tokens, mode, slots) in [
        (64usize, PromptMode::Fixed, 2usize),
        (200, PromptMode::Fixed, 2),
        (200, PromptMode::Exact, 2),
        (64, PromptMode::Fixed, 3),
    ] {
        if canonical && (max_tokens, mode) != (64, PromptMode::Fixed)
            || profile_absent && slots == 2
        {
            continue;
        }
        let mut c = if pi0 {
            Pi05Config::pi0_base()
        } else {
            Pi05Config::base()
        };
        c.views = slots;
        c.max_token_len = max_tokens;
        let w = Pi05Weights::random(&c, 1);
        let s = ctx.stream(0).unwrap();
        let m = build(&ctx, s, &w, DType::BF16, mode, false);
        drop(w);
        let (img, tokens, noise) = canonical_inputs(&c);
        let state: Vec<f32> = (0..14).map(|j| 0.05 * j as f32 - 0.3).collect();
        let images = [
            Some(ViewImage::Pixels(&img)),
            Some(ViewImage::Pixels(&img)),
            None,
        ];
        let every = [
            Some(ViewImage::Pixels(&img)),
            Some(ViewImage::Pixels(&img)),
            Some(ViewImage::Pixels(&img)),
        ];
        let set = |views: &[Option<ViewImage>]| {
            m.set_inputs(&Observation {
                state: &state,
                images: views,
                tokens: &tokens,
                noise: &noise,
            })
            .unwrap()
        };
        set(&images[..slots]);
        let profiled = || profile_stages(&ctx, s, &m);
        if profile_absent && slots > 2 {
            // The 3-slot model with one view absent profiled twice: just built (after ten
            // runs), and after runs with every view present.
            for _ in 0..10 {
                m.run().unwrap();
            }
            profiled();
            for views in [&every[..], &images[..slots]] {
                set(views);
                for _ in 0..10 {
                    m.run().unwrap();
                }
            }
            profiled();
            return;
        }
        if profile {
            profiled();
            return;
        }
        if let (Some(trace), Some(file)) = (&trace, &kernel_times) {
            stage_kernel_times(&ctx, s, &m, trace, file.as_deref(), kernel_json.as_deref());
            return;
        }
        let time = timer(&ctx, s);
        let measure = || {
            for _ in 0..10 {
                m.run().unwrap();
            }
            ctx.sync_stream(s).unwrap();
            let (mut vis, mut pre, mut step, mut e2e) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..iters {
                vis.push(time(&|| m.replay(Stage::Vision).unwrap()));
                pre.push(time(&|| m.replay(Stage::Prefix).unwrap()));
                step.push(time(&|| m.replay(Stage::Step(3)).unwrap()));
                e2e.push(time(&|| m.run().unwrap()));
            }
            (vis, pre, step, e2e)
        };
        let (mut vis, mut pre, mut step, mut e2e) = measure();
        // The same 3-slot model with every view present (its every-view variants).
        let again_every = (slots > 2).then(|| {
            // One absent, measured again at once (is the first measurement representative?).
            let (mut v, mut p, mut st, mut e) = measure();
            let again = [&mut v, &mut p, &mut st, &mut e].map(|x| pct(x, 0.5));
            set(&every);
            let (mut v, mut p, mut st, mut e) = measure();
            let all = [&mut v, &mut p, &mut st, &mut e].map(|x| pct(x, 0.5));
            // One absent again: the cache rows behind the packed prefix now hold values.
            set(&images[..slots]);
            let (mut v, mut p, mut st, mut e) = measure();
            (
                again,
                all,
                [&mut v, &mut p, &mut st, &mut e].map(|x| pct(x, 0.5)),
            )
        });
        // The chunk of the last run, as bits (builds that must compute the same compare this).
        let mut chunk = vec![0f32; c.action_horizon * c.action_dim];
        m.read_actions(s, &mut chunk).unwrap();
        let bits = chunk.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
            v.to_bits()
                .to_le_bytes()
                .iter()
                .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
        });
        let (free, total) = cu.mem_get_info().unwrap();
        let label = match (mode, slots) {
            (PromptMode::Fixed, 2) => format!("{max_tokens}"),
            (PromptMode::Fixed, _) => format!("{max_tokens}, {slots} slots, one absent"),
            (PromptMode::Exact, _) => format!("exact ({} tokens)", tokens.len()),
        };
        chunks.push((label.clone(), bits));
        if mode == PromptMode::Fixed && max_tokens == 64 {
            measured.push(Measured {
                label: label.clone(),
                config: c.clone(),
                present: 2,
                prompt: max_tokens,
                p50: [
                    pct(&mut vis, 0.5),
                    pct(&mut pre, 0.5),
                    pct(&mut step, 0.5),
                    pct(&mut e2e, 0.5),
                ],
            });
        }
        println!(
            "| {} | {:.3} / {:.3} | {:.3} / {:.3} | {:.3} / {:.3} | {:.3} / {:.3} | {:.1} GiB |",
            label,
            pct(&mut vis, 0.5),
            pct(&mut vis, 0.99),
            pct(&mut pre, 0.5),
            pct(&mut pre, 0.99),
            pct(&mut step, 0.5),
            pct(&mut step, 0.99),
            pct(&mut e2e, 0.5),
            pct(&mut e2e, 0.99),
            (total - free) as f64 / (1u64 << 30) as f64
        );
        if let Some(([v0, p0, st0, e0], [v, p, st, e], [v2, p2, st2, e2])) = again_every {
            println!(
                "| {max_tokens}, {slots} slots, one absent, measured again (same model) | {v0:.3} | {p0:.3} | {st0:.3} | {e0:.3} | |"
            );
            println!(
                "| {max_tokens}, {slots} slots, all present (same model) | {v:.3} | {p:.3} | {st:.3} | {e:.3} | |"
            );
            println!(
                "| {max_tokens}, {slots} slots, one absent again (same model) | {v2:.3} | {p2:.3} | {st2:.3} | {e2:.3} | |"
            );
        }
    }
    floors(&measured, peak_flops, bandwidth);
    for (label, bits) in chunks {
        println!("row {label}: actions of the last run, FNV-1a of their f32 bits: {bits:016x}");
    }
}

/// `--inpaint`: step and end-to-end times of the canonical model without and with
/// frozen-prefix denoising, alternating in one process.
fn inpaint_cost(ctx: &Ctx, iters: usize) {
    let mut c = Pi05Config::base();
    c.views = 2;
    c.max_token_len = 64;
    let w = Pi05Weights::random(&c, 1);
    let s = ctx.stream(0).unwrap();
    let plain = build(ctx, s, &w, DType::BF16, PromptMode::Fixed, false);
    let frozen = build(ctx, s, &w, DType::BF16, PromptMode::Fixed, true);
    let again = build(ctx, s, &w, DType::BF16, PromptMode::Fixed, false);
    drop(w);
    let (img, tokens, noise) = canonical_inputs(&c);
    let prefix_actions: Vec<f32> = (0..c.action_horizon * c.action_dim)
        .map(|i| ((i * 5 % 11) as f32 - 5.0) / 6.0)
        .collect();
    frozen.set_frozen_prefix(5, &prefix_actions).unwrap();
    let models = [&plain, &frozen, &again];
    for m in models {
        m.set_inputs(&Observation {
            state: &[],
            images: &[Some(ViewImage::Pixels(&img)), Some(ViewImage::Pixels(&img))],
            tokens: &tokens,
            noise: &noise,
        })
        .unwrap();
        for _ in 0..10 {
            m.run().unwrap();
        }
    }
    ctx.sync_stream(s).unwrap();
    let time = timer(ctx, s);
    // [model][step 0, step 3, step 9, end to end]
    let mut t = vec![vec![Vec::new(); 4]; 3];
    for _ in 0..iters {
        for (k, m) in models.into_iter().enumerate() {
            for (j, st) in [0usize, 3, 9].into_iter().enumerate() {
                t[k][j].push(time(&|| m.replay(Stage::Step(st)).unwrap()) * 1e3);
            }
            t[k][3].push(time(&|| m.run().unwrap()) * 1e3);
        }
    }
    println!("frozen-prefix denoising (5 of 50 rows frozen), µs, p50 / p99:\n");
    println!("| model | step 0 | step 3 | step 9 | end to end |");
    println!("|---|---|---|---|---|");
    let mut p50 = [[0.0; 4]; 3];
    for (k, name) in ["without", "with frozen prefix", "without (second build)"]
        .into_iter()
        .enumerate()
    {
        let cells: Vec<String> = (0..4)
            .map(|j| {
                let (a, b) = (pct(&mut t[k][j], 0.5), pct(&mut t[k][j], 0.99));
                p50[k][j] = a;
                format!("{a:.1} / {b:.1}")
            })
            .collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
    for (what, k) in [("with frozen prefix", 1), ("second build without", 2)] {
        println!(
            "\n{what} − without (p50): step 0 {:+.2} µs, step 3 {:+.2} µs, step 9 {:+.2} µs; end to end {:+.2} µs ({:+.2} µs per step over {} steps)",
            p50[k][0] - p50[0][0],
            p50[k][1] - p50[0][1],
            p50[k][2] - p50[0][2],
            p50[k][3] - p50[0][3],
            (p50[k][3] - p50[0][3]) / c.steps as f64,
            c.steps
        );
    }
}

/// `--precision`: bf16 against f32 at full size, same weights, inputs and noise.
fn precision(ctx: &Ctx) {
    let mut c = Pi05Config::base();
    c.views = 2;
    c.max_token_len = 64;
    let w = Pi05Weights::random(&c, 1);
    let s = ctx.stream(0).unwrap();
    let f32_model = build(ctx, s, &w, DType::F32, PromptMode::Fixed, false);
    let bf16_model = build(ctx, s, &w, DType::BF16, PromptMode::Fixed, false);
    drop(w);
    let px = c.siglip.image_size * c.siglip.image_size * 3;
    let n = c.action_horizon * c.action_dim;
    // xorshift values in [-scale, scale]
    let rand = |seed: u32, len: usize, scale: f32| -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x as f32 / u32::MAX as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    };
    println!(
        "bf16 against f32, full size, random weights (seed 1), 2 views, 64-token prompt capacity:\n"
    );
    println!("| inputs | 1 − cos | max abs diff | max abs f32 action |");
    println!("|---|---|---|---|");
    let (img, tokens, noise) = canonical_inputs(&c);
    let mut sets = vec![("canonical".to_string(), [img.clone(), img], tokens, noise)];
    for k in 0..2u32 {
        let views = [
            ModelImage::new(rand(10 + k, px, 1.0)).unwrap(),
            ModelImage::new(rand(20 + k, px, 1.0)).unwrap(),
        ];
        let tokens: Vec<u32> = std::iter::once(2)
            .chain(
                rand(30 + k, 47, 1.0)
                    .iter()
                    .map(|v| 100 + (v.abs() * 200_000.0) as u32),
            )
            .collect();
        // Standard-normal-like noise (sum of uniforms).
        let u = rand(40 + k, 4 * n, 1.0);
        let noise: Vec<f32> = u.chunks(4).map(|q| q.iter().sum::<f32>() * 0.866).collect();
        sets.push((format!("random {k}"), views, tokens, noise));
    }
    for (name, views, tokens, noise) in &sets {
        let images = two_views(views);
        let obs = Observation {
            state: &[],
            images: &images,
            tokens,
            noise,
        };
        let a = f32_model.infer(&obs).unwrap();
        let d = Diff::of(&a, &bf16_model.infer(&obs).unwrap());
        println!(
            "| {name} | {:.2e} | {:.2e} | {:.3} |",
            d.one_minus_cos, d.max_abs, d.max_ref
        );
    }
}

/// Actions against reference actions: 1 − cosine, the largest difference, and the
/// reference's largest magnitude and root mean square.
struct Diff {
    one_minus_cos: f64,
    max_abs: f32,
    max_ref: f32,
    rms_ref: f64,
}

impl Diff {
    fn of(reference: &[f32], b: &[f32]) -> Diff {
        let (mut dot, mut na, mut nb, mut max_abs, mut max_ref) = (0f64, 0f64, 0f64, 0f32, 0f32);
        for (x, y) in reference.iter().zip(b) {
            dot += *x as f64 * *y as f64;
            na += (*x as f64).powi(2);
            nb += (*y as f64).powi(2);
            max_abs = max_abs.max((x - y).abs());
            max_ref = max_ref.max(x.abs());
        }
        Diff {
            one_minus_cos: 1.0 - dot / (na.sqrt() * nb.sqrt()),
            max_abs,
            max_ref,
            rms_ref: (na / reference.len() as f64).sqrt(),
        }
    }
}

/// Two present views of model images.
fn two_views(views: &[ModelImage; 2]) -> [Option<ViewImage<'_>>; 2] {
    [
        Some(ViewImage::Pixels(&views[0])),
        Some(ViewImage::Pixels(&views[1])),
    ]
}

/// Random inputs for `--fp8-expert`: two views, a prompt of 48 tokens, standard-normal-like
/// noise.
fn random_set(c: &Pi05Config, k: u32) -> ([ModelImage; 2], Vec<u32>, Vec<f32>) {
    let rand = |seed: u32, len: usize| -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as f32 / u32::MAX as f32 * 2.0 - 1.0
            })
            .collect()
    };
    let px = c.siglip.image_size * c.siglip.image_size * 3;
    let views = [
        ModelImage::new(rand(1000 + 2 * k, px)).unwrap(),
        ModelImage::new(rand(1001 + 2 * k, px)).unwrap(),
    ];
    let tokens: Vec<u32> = std::iter::once(2)
        .chain(
            rand(3000 + k, 47)
                .iter()
                .map(|v| 100 + (v.abs() * 200_000.0) as u32),
        )
        .collect();
    let n = c.action_horizon * c.action_dim;
    let u = rand(5000 + k, 4 * n);
    let noise: Vec<f32> = u.chunks(4).map(|q| q.iter().sum::<f32>() * 0.866).collect();
    (views, tokens, noise)
}

/// The stages `--profile` replays (`--profile-only`, default all three).
static PROFILED: std::sync::OnceLock<Vec<Stage>> = std::sync::OnceLock::new();

/// `--profile-only a,b`: the stages named (vision, prefix, step), in order.
fn profiled_stages(args: &[String]) -> Result<Vec<Stage>, String> {
    let Some(i) = args.iter().position(|a| a == "--profile-only") else {
        return Ok(vec![Stage::Vision, Stage::Prefix, Stage::Step(3)]);
    };
    let list = args
        .get(i + 1)
        .ok_or("--profile-only needs a list of stages (vision,prefix,step)")?;
    list.split(',')
        .map(|name| match name {
            "vision" => Ok(Stage::Vision),
            "prefix" => Ok(Stage::Prefix),
            "step" => Ok(Stage::Step(3)),
            other => Err(format!(
                "--profile-only: unknown stage {other:?} (vision, prefix, step)"
            )),
        })
        .collect()
}

/// The `--profile-only` stages of `m` (vision, prefix and one step by default), replayed once
/// each between cuProfilerStart and cuProfilerStop (`ncu --profile-from-start off`): tuning
/// and start-up kernels stay outside.
fn profile_stages(ctx: &Ctx, s: frt_exec::Stream, m: &Pi05) {
    ctx.sync_stream(s).unwrap();
    let range = frt_exec::cudarc::driver::Profiler::new().unwrap();
    for stage in PROFILED.get().expect("set in main") {
        m.replay(*stage).unwrap();
    }
    ctx.sync_stream(s).unwrap();
    drop(range);
}

/// `--kernel-times`: each `--profile-only` stage of `m` replayed 20 times after ten runs, its
/// kernels as they ran (see the module docs).
fn stage_kernel_times(
    ctx: &Ctx,
    s: frt_exec::Stream,
    m: &Pi05,
    trace: &frt_exec::kernel_trace::KernelTrace,
    csv: Option<&std::path::Path>,
    json: Option<&std::path::Path>,
) {
    const REPLAYS: usize = 20;
    for _ in 0..10 {
        m.run().unwrap();
    }
    ctx.sync_stream(s).unwrap();
    let fail = |e: frt_exec::kernel_trace::TraceError| -> ! {
        eprintln!("pi05-bench --kernel-times: {e}");
        std::process::exit(1)
    };
    trace.take().unwrap_or_else(|e| fail(e));
    let mut rows = String::from("stage,kernel,name,start_us,run_us,gap_before_us\n");
    let mut every = Vec::new();
    for stage in PROFILED.get().expect("set in main") {
        for _ in 0..REPLAYS {
            m.replay(*stage).unwrap();
        }
        ctx.sync_stream(s).unwrap();
        let records = trace.take().unwrap_or_else(|e| fail(e));
        let name = format!("{stage:?}");
        match ReplayProfile::new(&records, REPLAYS) {
            Ok(k) => {
                print_replay(&k, &name);
                for (i, r) in k.kernels.iter().enumerate() {
                    // Quoted: template names hold commas.
                    rows += &format!(
                        "{name},{i},\"{}\",{:.3},{:.3},{:.3}\n",
                        r.name.replace('"', "\"\""),
                        r.start_us,
                        r.run_us,
                        r.gap_us
                    );
                }
            }
            Err(e) => {
                eprintln!("pi05-bench --kernel-times: {name}: {e}");
                std::process::exit(1)
            }
        }
        every.extend(records);
    }
    let write = |path: &std::path::Path, text: String| {
        std::fs::write(path, text).unwrap_or_else(|e| {
            eprintln!("pi05-bench --kernel-times: {}: {e}", path.display());
            std::process::exit(1)
        })
    };
    if let Some(path) = csv {
        write(path, rows);
    }
    if let Some(path) = json {
        write(path, frt_exec::kernel_trace::chrome_trace(&every));
    }
}

/// A stage's span, busy and idle time, then per kernel name (in order of first start) the
/// count, the time of its runs and the gaps before them.
fn print_replay(k: &ReplayProfile, stage: &str) {
    let own: f64 = k.kernels.iter().map(|k| k.run_us).sum();
    println!(
        "\n{stage}: {} kernels; replay span {:.1} µs, some kernel running {:.1} µs, none {:.1} µs; the kernels' own times add up to {:.1} µs (medians of each)",
        k.kernels.len(),
        k.span_us,
        k.busy_us,
        k.span_us - k.busy_us,
        own
    );
    println!("| kernel | count | run µs (sum) | gap before µs (sum) |");
    println!("|---|---|---|---|");
    let mut names: Vec<(&str, usize, f64, f64)> = Vec::new();
    for k in &k.kernels {
        // The gap before the first kernel is zero by definition.
        match names.iter_mut().find(|n| n.0 == k.name) {
            Some(n) => {
                n.1 += 1;
                n.2 += k.run_us;
                n.3 += k.gap_us;
            }
            None => names.push((&k.name, 1, k.run_us, k.gap_us)),
        }
    }
    for (name, count, run, gap) in names {
        let short: String = name.chars().take(72).collect();
        println!("| {short} | {count} | {run:.1} | {gap:.1} |");
    }
}

/// `--calibration FILE` and `--write-calibration FILE` of `--fp8-expert` (see the module
/// docs).
struct CalibrationFiles {
    read: Option<std::path::PathBuf>,
    write: Option<std::path::PathBuf>,
}

impl CalibrationFiles {
    fn from_args(args: &[String]) -> CalibrationFiles {
        CalibrationFiles {
            read: file_arg(args, "--calibration"),
            write: file_arg(args, "--write-calibration"),
        }
    }
}

/// The file after `flag` in `args`, if the flag is there (exits when the file is missing).
fn file_arg(args: &[String], flag: &str) -> Option<std::path::PathBuf> {
    let i = args.iter().position(|a| a == flag)?;
    match args.get(i + 1) {
        Some(p) => Some(std::path::PathBuf::from(p)),
        None => {
            eprintln!("pi05-bench: {flag} needs a file");
            std::process::exit(2)
        }
    }
}

/// The model with SigLIP (`vision`), the prefix and the action expert in FP8 on `cal`.
fn fp8_every_stage(
    ctx: &Ctx,
    s: frt_exec::Stream,
    w: &Pi05Weights,
    cal: &frt_vla::calibration::Calibration,
    vision: bool,
) -> Pi05 {
    let mut o = Pi05Options::new(DType::BF16);
    o.kernels = *KERNEL_OPTIONS.get().expect("read in main");
    o.fp8 = Some(cal.clone());
    o.fp8_prefix = true;
    o.fp8_vision = vision;
    o.fp8_keep_16bit = false;
    or_exit(Pi05::build(ctx, s, w, &o), "the FP8 model does not build")
}

/// `r`'s value, or its error on stderr after `what` and exit status 1.
fn or_exit<T>(r: Result<T, impl std::fmt::Display>, what: &str) -> T {
    r.unwrap_or_else(|e| {
        eprintln!("pi05-bench: {what}: {e}");
        std::process::exit(1)
    })
}

/// `--fp8-expert --profile`: vision, prefix and one step of the every-stage FP8 model between
/// cuProfilerStart and cuProfilerStop, after ten runs on the canonical inputs.
/// `--kernel-times` with `--fp8-expert --profile`: the trace started before the build and
/// where its figures go.
struct Traced<'a> {
    trace: &'a frt_exec::kernel_trace::KernelTrace,
    csv: Option<&'a std::path::Path>,
    json: Option<&'a std::path::Path>,
}

fn profile_fp8(ctx: &Ctx, s: frt_exec::Stream, c: &Pi05Config, m: &Pi05, traced: Option<&Traced>) {
    let (img, tokens, noise) = canonical_inputs(c);
    let views = [img.clone(), img];
    let images = two_views(&views);
    m.set_inputs(&Observation {
        state: &[],
        images: &images,
        tokens: &tokens,
        noise: &noise,
    })
    .unwrap();
    if let Some(t) = traced {
        // Ten runs first, as for the bf16 model.
        stage_kernel_times(ctx, s, m, t.trace, t.csv, t.json);
        return;
    }
    for _ in 0..10 {
        m.run().unwrap();
    }
    profile_stages(ctx, s, m);
}

/// `--fp8-expert`: see the module docs.
fn fp8_expert(
    ctx: &Ctx,
    iters: usize,
    profile: bool,
    files: &CalibrationFiles,
    traced: Option<Traced>,
) {
    let mut c = Pi05Config::base();
    c.views = 2;
    c.max_token_len = 64;
    let w = Pi05Weights::random(&c, 1);
    let s = ctx.stream(0).unwrap();
    if let (true, Some(path)) = (profile, &files.read) {
        // A calibration made earlier (e.g. by `--write-calibration`, outside the profiler):
        // only the profiled model is built.
        let cal = or_exit(
            frt_vla::calibration::Calibration::read(path),
            "reading the calibration",
        );
        profile_fp8(
            ctx,
            s,
            &c,
            &fp8_every_stage(ctx, s, &w, &cal, true),
            traced.as_ref(),
        );
        return;
    }
    // Device memory in use (what each model's build adds: weights, activations, graphs).
    let cu = ctx.cuda_context().expect("CUDA").clone();
    let used = || {
        ctx.sync_stream(s).unwrap();
        let (free, total) = cu.mem_get_info().unwrap();
        total - free
    };
    let mut taken = Vec::new();
    let before = used();
    let bf16 = build(ctx, s, &w, DType::BF16, PromptMode::Fixed, false);
    taken.push(used() - before);
    // Under a profiler every launch of the calibration's runs is slow: two observations do
    // for a profile (its figures are times, not accuracy).
    let observations = if profile { 2 } else { 16 };
    let calib: Vec<_> = (0..observations).map(|k| random_set(&c, k)).collect();
    let imgs: Vec<[Option<ViewImage>; 2]> = calib
        .iter()
        .map(|(v, _, _)| {
            [
                Some(ViewImage::Pixels(&v[0])),
                Some(ViewImage::Pixels(&v[1])),
            ]
        })
        .collect();
    let obs: Vec<Observation> = calib
        .iter()
        .zip(&imgs)
        .map(|((_, t, n), i)| Observation {
            state: &[],
            images: i,
            tokens: t,
            noise: n,
        })
        .collect();
    let t = std::time::Instant::now();
    let percentile = frt_vla::calibration::DEFAULT_PERCENTILE;
    let cal = bf16.calibrate(&obs, percentile).unwrap();
    let calibrate_s = t.elapsed().as_secs_f64();
    if let Some(path) = &files.write {
        or_exit(cal.write(path), "writing the calibration");
        println!("calibration written to {}", path.display());
    }
    let fp8_with = |vision: bool| fp8_every_stage(ctx, s, &w, &cal, vision);
    if profile {
        drop(bf16);
        profile_fp8(ctx, s, &c, &fp8_with(true), traced.as_ref());
        return;
    }
    let before = used();
    let fp8 = build_with(
        ctx,
        s,
        &w,
        DType::BF16,
        PromptMode::Fixed,
        false,
        Some(cal.clone()),
    );
    taken.push(used() - before);
    let before = used();
    let fp8_all = fp8_with(false);
    taken.push(used() - before);
    let before = used();
    let fp8_vision = fp8_with(true);
    taken.push(used() - before);
    drop(w);
    println!(
        "FP8 action expert against bf16, full size, random weights (seed 1), 2 views, 64-token prompt capacity; calibrated on 16 random observations at the {percentile}th percentile ({} ranges) in {calibrate_s:.1} s\n",
        cal.ranges.len()
    );
    println!(
        "| held-out inputs | FP8 expert: 1 − cos | max abs diff | FP8 prefix + expert: 1 − cos | max abs diff | FP8 vision + prefix + expert: 1 − cos | max abs diff | rms bf16 action |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let (img, tokens, noise) = canonical_inputs(&c);
    let mut sets = vec![("canonical".to_string(), [img.clone(), img], tokens, noise)];
    for k in 0..3 {
        let (v, t, n) = random_set(&c, 100 + k);
        sets.push((format!("random {k}"), v, t, n));
    }
    for (name, views, tokens, noise) in &sets {
        let images = two_views(views);
        let obs = Observation {
            state: &[],
            images: &images,
            tokens,
            noise,
        };
        let a = bf16.infer(&obs).unwrap();
        let (e, p, v) = (
            Diff::of(&a, &fp8.infer(&obs).unwrap()),
            Diff::of(&a, &fp8_all.infer(&obs).unwrap()),
            Diff::of(&a, &fp8_vision.infer(&obs).unwrap()),
        );
        println!(
            "| {name} | {:.2e} | {:.3e} | {:.2e} | {:.3e} | {:.2e} | {:.3e} | {:.3} |",
            e.one_minus_cos,
            e.max_abs,
            p.one_minus_cos,
            p.max_abs,
            v.one_minus_cos,
            v.max_abs,
            e.rms_ref
        );
    }
    // Stage by stage: each stage's output of a model with that stage in FP8 (the stages
    // before it in bf16, so each figure is that stage's own error) against bf16's.
    println!(
        "\nPer stage, on the same inputs: the vision output of the FP8-vision model, the prefix's keys and values (every layer) of the FP8-prefix model with bf16 vision and of the FP8 vision + prefix model, one denoising step's velocity (step 0) of the FP8-expert model (bf16 prefix); 1 − cos and max |Δ| / max |bf16|\n"
    );
    println!(
        "| held-out inputs | vision output | prefix K/V (FP8 prefix) | prefix K/V (FP8 vision + prefix) | step-0 velocity (FP8 expert) |"
    );
    println!("|---|---|---|---|---|");
    let stages = |m: &Pi05, obs: &Observation| {
        m.set_inputs(obs).unwrap();
        m.replay(Stage::Vision).unwrap();
        let vision = m.read_stage_output(StageOutput::Vision).unwrap();
        m.replay(Stage::Prefix).unwrap();
        let kv = m.read_stage_output(StageOutput::PrefixKv).unwrap();
        let x0 = m.read_stage_output(StageOutput::Noise).unwrap();
        m.replay(Stage::Step(0)).unwrap();
        let x1 = m.read_stage_output(StageOutput::Noise).unwrap();
        let velocity: Vec<f32> = x1.iter().zip(&x0).map(|(a, b)| a - b).collect();
        (vision, kv, velocity)
    };
    let cell = |d: Diff| format!("{:.2e} / {:.2e}", d.one_minus_cos, d.max_abs / d.max_ref);
    for (name, views, tokens, noise) in &sets {
        let images = two_views(views);
        let obs = Observation {
            state: &[],
            images: &images,
            tokens,
            noise,
        };
        let (v0, kv0, vel0) = stages(&bf16, &obs);
        let (v_all, kv_all, _) = stages(&fp8_vision, &obs);
        let (_, kv_prefix, _) = stages(&fp8_all, &obs);
        let (_, _, vel_expert) = stages(&fp8, &obs);
        println!(
            "| {name} | {} | {} | {} | {} |",
            cell(Diff::of(&v0, &v_all)),
            cell(Diff::of(&kv0, &kv_prefix)),
            cell(Diff::of(&kv0, &kv_all)),
            cell(Diff::of(&vel0, &vel_expert)),
        );
    }
    // The same every-stage FP8 model calibrated at the 99.9th percentile (FlashRT's
    // default) instead: a new calibration written into its scale buffers, no recapture.
    let cal_alt = bf16.calibrate(&obs, 99.9).unwrap();
    fp8_vision.set_calibration(&cal_alt).unwrap();
    println!(
        "\nFP8 vision + prefix + expert calibrated at the 99.9th percentile instead, against bf16:\n"
    );
    println!("| held-out inputs | 1 − cos | max abs diff | vision output | prefix K/V |");
    println!("|---|---|---|---|---|");
    for (name, views, tokens, noise) in &sets {
        let images = two_views(views);
        let obs = Observation {
            state: &[],
            images: &images,
            tokens,
            noise,
        };
        let d = Diff::of(&bf16.infer(&obs).unwrap(), &fp8_vision.infer(&obs).unwrap());
        let (v0, kv0, _) = stages(&bf16, &obs);
        let (v1, kv1, _) = stages(&fp8_vision, &obs);
        println!(
            "| {name} | {:.2e} | {:.3e} | {} | {} |",
            d.one_minus_cos,
            d.max_abs,
            cell(Diff::of(&v0, &v1)),
            cell(Diff::of(&kv0, &kv1)),
        );
    }
    fp8_vision.set_calibration(&cal).unwrap();
    let time = timer(ctx, s);
    let (mut rows, models) = (
        [(); 16].map(|_| Vec::new()),
        [&bf16, &fp8, &fp8_all, &fp8_vision],
    );
    for m in models {
        for _ in 0..10 {
            m.run().unwrap();
        }
    }
    ctx.sync_stream(s).unwrap();
    for _ in 0..iters {
        for (j, m) in models.iter().enumerate() {
            rows[4 * j].push(time(&|| m.replay(Stage::Vision).unwrap()));
            rows[4 * j + 1].push(time(&|| m.replay(Stage::Prefix).unwrap()));
            rows[4 * j + 2].push(time(&|| m.replay(Stage::Step(3)).unwrap()));
            rows[4 * j + 3].push(time(&|| m.run().unwrap()));
        }
    }
    let (free, total) = cu.mem_get_info().unwrap();
    println!(
        "\n| model | vision p50 / p99 ms | prefix p50 / p99 ms | one step p50 / p99 ms | end to end p50 / p99 ms | device memory its build took, GB |"
    );
    println!("|---|---|---|---|---|---|");
    for (j, name) in [
        "bf16",
        "FP8 action expert",
        "FP8 prefix and expert",
        "FP8 vision, prefix and expert",
    ]
    .iter()
    .enumerate()
    {
        let mut cell = |r: usize| {
            let v = &mut rows[4 * j + r];
            format!("{:.3} / {:.3}", pct(v, 0.5), pct(v, 0.99))
        };
        let (vi, p, st, e) = (cell(0), cell(1), cell(2), cell(3));
        let gb = taken[j] as f64 / 1e9;
        println!("| {name} | {vi} | {p} | {st} | {e} | {gb:.2} |");
    }
    println!(
        "\nGPU memory in use (the four models): {:.1} GB of {:.1}. The FP8 models hold only the quantized weights of their language model and expert (`fp8_keep_16bit` off); SigLIP keeps its 16-bit weights.",
        (total - free) as f64 / 1e9,
        total as f64 / 1e9
    );
}
