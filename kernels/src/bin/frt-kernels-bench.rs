//! Every op at Pi0.5 / Whisper shapes on a CUDA GPU, next to the device's ceilings measured
//! in the same run (a large device-to-device copy, a large bf16 GEMM).
//!
//! `frt-kernels-bench [--iters N] [--only SECTIONS]`
//!
//! SECTIONS: a comma-separated subset of gemm, splitk, geglu, codes, fp8, launch, mem, attention,
//! siglip (SigLIP's two views' attention as one launch; also part of attention), rope, conv
//! (default: all).
//!
//! Each op is captured into a graph that repeats it back to back (as a model's graph runs its
//! ops), enough times for one replay to take ≥ 100 µs; after warm-up, N replays are timed with
//! CUDA events and divided by the repetitions (median and p99 per op). Memory-bound ops report
//! GB/s (bytes read + written) and % of the copy ceiling; GEMMs TFLOP/s and % of the
//! large-GEMM rate; attention both, with its FLOP and byte floors.

use frt_exec::{Buffer, Ctx, Graph, ShapeKey, Stream};
use frt_kernels::{AttentionMask, AttentionPlan, DType, Kernels, PatchEmbed, Result, Tensor};

struct Bench {
    k: Kernels,
    /// Sections to run (`--only a,b`); empty: all.
    only: Vec<String>,
    s: Stream,
    iters: usize,
    copy_gbs: f64,
    gemm_tflops: f64,
    seed: u32,
}

fn stats(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (
        v[v.len() / 2],
        v[((v.len() - 1) as f64 * 0.99).round() as usize],
    )
}

impl Bench {
    /// Whether a section runs (see `--only`).
    fn wants(&self, section: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == section)
    }

    fn tensor(&mut self, name: &str, dt: DType, shape: &[usize]) -> Tensor {
        let t = Tensor::alloc(self.k.ctx(), name, dt, shape).unwrap();
        let n = t.numel();
        if dt.is_float() {
            let mut x = self.seed;
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    (x as f32 / u32::MAX as f32 - 0.5) * 0.5
                })
                .collect();
            self.seed = x;
            t.write_f32(self.s, &v).unwrap();
        }
        t
    }

    /// Median and p99 milliseconds of one op, measured inside a graph that repeats it back
    /// to back (as the models run ops): `reps` copies, chosen so that a replay takes at least
    /// ~100 µs, which amortizes the graph's own launch cost.
    fn time(&self, name: &str, op: &dyn Fn(Stream) -> Result<()>) -> (f64, f64) {
        let single = self.time_reps(name, op, 1, 10).0;
        let reps = ((0.1 / single).ceil() as usize).clamp(1, 64);
        if reps == 1 {
            return self.time_reps(name, op, 1, self.iters);
        }
        self.time_reps(name, op, reps, self.iters)
    }

    fn time_reps(
        &self,
        name: &str,
        op: &dyn Fn(Stream) -> Result<()>,
        reps: usize,
        iters: usize,
    ) -> (f64, f64) {
        let ctx = self.k.ctx();
        let g = Graph::new(ctx, name, 1);
        g.capture(ShapeKey(0), |cs| {
            (0..reps)
                .try_for_each(|_| op(cs))
                .map_err(|e| frt_exec::Error::Invalid {
                    op: "bench",
                    reason: e.to_string(),
                })
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let (t0, t1) = (ctx.timing_event().unwrap(), ctx.timing_event().unwrap());
        for _ in 0..3 {
            g.replay(ShapeKey(0), self.s).unwrap();
        }
        let mut ms = Vec::with_capacity(iters);
        for _ in 0..iters {
            t0.record(self.s).unwrap();
            g.replay(ShapeKey(0), self.s).unwrap();
            t1.record(self.s).unwrap();
            t1.synchronize().unwrap();
            ms.push(t1.elapsed_ms(&t0).unwrap() as f64 / reps as f64);
        }
        stats(ms)
    }

    fn mem_row(
        &self,
        op: &str,
        shape: &str,
        dt: DType,
        bytes: f64,
        f: &dyn Fn(Stream) -> Result<()>,
    ) {
        let (m, p) = self.time(op, f);
        let gbs = bytes / (m * 1e-3) / 1e9;
        println!(
            "| {op:<16} | {shape:<24} | {:<4} | {:>9.1} | {:>9.1} | {gbs:>8.0} GB/s | {:>5.0} % of copy |",
            dt.name(),
            m * 1e3,
            p * 1e3,
            100.0 * gbs / self.copy_gbs
        );
    }

    fn gemm_row(&mut self, what: &str, m: usize, kk: usize, n: usize, bias: bool, dt: DType) {
        let a = self.tensor("a", dt, &[m, kk]);
        let w = self.tensor("w", dt, &[n, kk]);
        let c = self.tensor("c", dt, &[m, n]);
        let b = self.tensor("bias", dt, &[n]);
        let g = self.k.linear(&a, &w, &c, bias, false).unwrap();
        let (med, p) = self.time(what, &|s| g.run(s, &a, &w, &c, bias.then_some(&b)));
        let tf = 2.0 * (m * n * kk) as f64 / (med * 1e-3) / 1e12;
        println!(
            "| {what:<16} | {:<24} | {:<4} | {:>9.1} | {:>9.1} | {tf:>6.0} TFLOP/s | {:>5.0} % of GEMM |",
            format!("{m}x{kk}x{n}"),
            dt.name(),
            med * 1e3,
            p * 1e3,
            100.0 * tf / self.gemm_tflops
        );
    }
}

/// The action expert's four GEMMs: name, M, K, N.
const EXPERT_GEMMS: [(&str, usize, usize, usize); 4] = [
    ("expert qkv", 50, 1024, 2560),
    ("expert attn out", 50, 2048, 1024),
    ("expert gate+up", 50, 1024, 8192),
    ("expert down", 50, 4096, 1024),
];

/// A bf16 linear layer `x·wᵀ` whose weight is read from memory when repeated: `ws` holds
/// copies of it (≥ 128 MB together) for the repeated ops to cycle through, as in a model
/// whose weights exceed L2; `g` is the plan.
struct FromMemory {
    x: Tensor,
    ws: Vec<Tensor>,
    out: Tensor,
    g: frt_kernels::Gemm,
}

impl FromMemory {
    fn new(b: &mut Bench, m: usize, kk: usize, n: usize) -> FromMemory {
        let copies = ((128usize << 20) / (n * kk)).clamp(2, 64);
        let bf = DType::BF16;
        let x = b.tensor("x", bf, &[m, kk]);
        let ws: Vec<Tensor> = (0..copies).map(|_| b.tensor("w", bf, &[n, kk])).collect();
        let out = b.tensor("out", bf, &[m, n]);
        let g = b.k.linear(&x, &ws[0], &out, false, false).unwrap();
        FromMemory { x, ws, out, g }
    }

    /// The median of the product with its reduction split `splits` ways as one batched GEMM
    /// writing f32 partial sums (what the op that consumes them would add), the weights
    /// cycled as for the plan.
    fn split(&self, b: &mut Bench, what: &str, splits: usize) -> f64 {
        let (m, kk) = (self.x.shape()[0], self.x.shape()[1]);
        let n = self.ws[0].shape()[0];
        let part = kk / splits;
        let view = |t: &Tensor, rows: usize| {
            Tensor::with_layout(
                t.buffer(),
                DType::BF16,
                &[splits, rows, part],
                &[part, kk, 1],
                0,
            )
            .unwrap()
        };
        let acc = b.tensor("partials", DType::F32, &[splits, m, n]);
        let g =
            b.k.linear(&view(&self.x, m), &view(&self.ws[0], n), &acc, false, false)
                .unwrap();
        let next = std::cell::Cell::new(0usize);
        let (med, _) = b.time(what, &|s| {
            next.set((next.get() + 1) % self.ws.len());
            g.run(
                s,
                &view(&self.x, m),
                &view(&self.ws[next.get()], n),
                &acc,
                None,
            )
        });
        med
    }
}

fn main() {
    let iters = std::env::args()
        .skip_while(|a| a != "--iters")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(200usize);
    let ctx = match Ctx::cuda(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("frt-kernels-bench measures the CUDA kernels and needs a GPU: {e}");
            std::process::exit(1);
        }
    };
    let s = ctx.stream(0).unwrap();
    // The op library's environment (FRT_GEMM_TUNING, FRT_GEMM_TUNING_LOG, …) applies.
    let options = frt_kernels::KernelOptions::from_env().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2);
    });
    let k = Kernels::with_options(&ctx, options).unwrap();
    let name = ctx.cuda_context().unwrap().name().unwrap_or_default();
    println!(
        "device: {name} ({}), per op inside a graph repeating it (≥ 100 µs a replay), {iters} timed replays per row; {options:?}\n",
        k.target()
    );
    let only: Vec<String> = std::env::args()
        .skip_while(|a| a != "--only")
        .nth(1)
        .map(|v| v.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let sections = [
        "gemm",
        "splitk",
        "geglu",
        "codes",
        "fp8",
        "launch",
        "mem",
        "attention",
        "siglip",
        "rope",
        "conv",
    ];
    if let Some(o) = only.iter().find(|o| !sections.contains(&o.as_str())) {
        eprintln!(
            "--only: unknown section `{o}` (sections: {})",
            sections.join(", ")
        );
        std::process::exit(2);
    }
    let mut b = Bench {
        k,
        only,
        s,
        iters,
        copy_gbs: 1.0,
        gemm_tflops: 1.0,
        seed: 0x1234_5678,
    };

    // Ceilings.
    let big = 1usize << 30;
    let (src, dst) = (
        Buffer::alloc(&ctx, "src", big).unwrap(),
        Buffer::alloc(&ctx, "dst", big).unwrap(),
    );
    let (m, _) = b.time("copy", &|s| Ok(Buffer::copy(&dst, 0, &src, 0, big, s)?));
    b.copy_gbs = 2.0 * big as f64 / (m * 1e-3) / 1e9;
    drop((src, dst));
    let n = 8192;
    let (a, w, c) = (
        b.tensor("a", DType::BF16, &[n, n]),
        b.tensor("w", DType::BF16, &[n, n]),
        b.tensor("c", DType::BF16, &[n, n]),
    );
    let g = b.k.linear(&a, &w, &c, false, false).unwrap();
    let (m, _) = b.time("gemm ceiling", &|s| g.run(s, &a, &w, &c, None));
    b.gemm_tflops = 2.0 * (n * n * n) as f64 / (m * 1e-3) / 1e12;
    drop((a, w, c, g));
    println!(
        "ceilings: device-to-device copy of 1 GiB {:.0} GB/s (read + write); bf16 GEMM 8192³ {:.0} TFLOP/s\n",
        b.copy_gbs, b.gemm_tflops
    );
    println!(
        "| {:<16} | {:<24} | {:<4} | {:>9} | {:>9} | {:>13} | {:>17} |",
        "op", "shape", "type", "median µs", "p99 µs", "achieved", "of ceiling"
    );
    println!(
        "|{}|{}|{}|{}|{}|{}|{}|",
        "-".repeat(18),
        "-".repeat(26),
        "-".repeat(6),
        "-".repeat(11),
        "-".repeat(11),
        "-".repeat(15),
        "-".repeat(19)
    );

    let dt = DType::BF16;
    let sz = dt.size() as f64;
    if b.wants("gemm") {
        // GEMMs (weights [out, in], as checkpoints store them).
        for (what, m, kk, n, bias) in [
            ("siglip qkv", 512, 1152, 3456, true),
            ("siglip mlp up", 512, 1152, 4304, true),
            ("siglip mlp down", 512, 4304, 1152, true),
            ("gemma q proj", 800, 2048, 2048, false),
            ("gemma gate+up", 800, 2048, 32768, false),
            ("gemma mlp down", 800, 16384, 2048, false),
            ("expert gate+up", 50, 1024, 8192, false),
            ("expert mlp down", 50, 4096, 1024, false),
            ("whisper mlp up", 1500, 384, 1536, true),
            ("whisper mlp down", 1500, 1536, 384, true),
        ] {
            b.gemm_row(what, m, kk, n, bias, DType::BF16);
        }
    }
    if b.wants("splitk") {
        // The action expert's GEMMs as cuBLASLt plans them (a split reduction, if any, reduced
        // by cuBLASLt's own kernel), against their reduction dimension split `s` ways as one
        // batched GEMM writing f32 partial sums (which the op that consumes the product would
        // add): each weight read from memory (copies cycled, ≥ 128 MB); and the plan with its
        // weight in L2.
        println!();
        for (what, m, kk, n) in EXPERT_GEMMS {
            let fm = FromMemory::new(&mut b, m, kk, n);
            let FromMemory { x, ws, out, g } = &fm;
            let next = std::cell::Cell::new(0usize);
            let pick = |len: usize| {
                next.set((next.get() + 1) % len);
                next.get()
            };
            let (med, p) = b.time(what, &|s| g.run(s, x, &ws[pick(ws.len())], out, None));
            let mut cells = vec![format!(
                "plan {:>5.1} / {:>5.1} µs ({:>4.0} GB/s, ws {} B)",
                med * 1e3,
                p * 1e3,
                2.0 * (n * kk) as f64 / (med * 1e-3) / 1e9,
                g.workspace_bytes()
            )];
            // The same plan with one weight, which stays in L2 between the repeats: what the
            // GEMM would take were its weight fetched ahead of it.
            let (med, _) = b.time(what, &|s| g.run(s, x, &ws[0], out, None));
            cells.push(format!("in L2 {:>5.1} µs", med * 1e3));
            for splits in [2usize, 4, 8] {
                let med = fm.split(&mut b, what, splits);
                cells.push(format!("{splits}-way {:>5.1} µs", med * 1e3));
            }
            println!(
                "| {what:<16} | {:<16} | {} |",
                format!("{m}x{kk}x{n}"),
                cells.join(" | ")
            );
        }
        // SigLIP's projections for two views (512 rows), each as the encoder plans it (bias;
        // the attention output and fc2 added into the residual stream), against its
        // reduction split into parts of a multiple of 8 (16-byte aligned) as one batched GEMM
        // writing f32 partial sums, which the LayerNorm after it would add.
        for (what, m, kk, n, acc) in [
            ("siglip qkv", 512, 1152, 3456, false),
            ("siglip attn out", 512, 1152, 1152, true),
            ("siglip fc1", 512, 1152, 4304, false),
            ("siglip fc2", 512, 4304, 1152, true),
        ] {
            let fm = FromMemory::new(&mut b, m, kk, n);
            let FromMemory { x, ws, out, .. } = &fm;
            let bias = b.tensor("bias", DType::BF16, &[n]);
            let g = b.k.linear(x, &ws[0], out, true, acc).unwrap();
            let next = std::cell::Cell::new(0usize);
            let pick = |len: usize| {
                next.set((next.get() + 1) % len);
                next.get()
            };
            let (med, _) = b.time(what, &|s| {
                g.run(s, x, &ws[pick(ws.len())], out, Some(&bias))
            });
            let flops = 2.0 * (m * kk * n) as f64;
            let mut cells = vec![format!(
                "plan {:>5.1} µs ({:>3.0} TFLOP/s)",
                med * 1e3,
                flops / (med * 1e-3) / 1e12
            )];
            for splits in [2usize, 3, 4, 6, 8] {
                if kk % splits != 0 || (kk / splits) % 8 != 0 {
                    continue;
                }
                let med = fm.split(&mut b, what, splits);
                cells.push(format!("{splits}-way {:>5.1} µs", med * 1e3));
            }
            println!(
                "| {what:<16} | {:<16} | {} |",
                format!("{m}x{kk}x{n}"),
                cells.join(" | ")
            );
        }
    }
    if b.wants("geglu") {
        // The action expert's MLP gate and up projections with GEGLU: cuBLASLt's GEMM then the
        // geglu kernel, against the fused kernel and the plan (on Hopper its wgmma kernel); the weight read from memory (the repeated ops
        // cycle through 8 copies, 134 MB) as in the model, where 18 layers' weights follow each
        // other.
        {
            let (m, kk, f) = (50usize, 1024usize, 4096usize);
            let dt = DType::BF16;
            let x = b.tensor("x", dt, &[m, kk]);
            let ws: Vec<Tensor> = (0..8).map(|_| b.tensor("w", dt, &[2 * f, kk])).collect();
            let both = b.tensor("gate_up", dt, &[m, 2 * f]);
            let h = b.tensor("h", dt, &[m, f]);
            let next = std::cell::Cell::new(0usize);
            let w = || {
                next.set((next.get() + 1) % ws.len());
                &ws[next.get()]
            };
            let gemm = b.k.linear(&x, &ws[0], &both, false, false).unwrap();
            let fused = b.k.geglu_linear_fused(&x, &ws[0], &h).unwrap();
            // The plan as models make it (on Hopper the wgmma kernel).
            let plan = b.k.geglu_linear(&x, &ws[0], &h).unwrap();
            let bytes = (2 * f * kk) as f64 * dt.size() as f64;
            type Op<'a> = &'a dyn Fn(Stream) -> Result<()>;
            let forms: [(&str, Op); 3] = [
                ("GEMM + geglu", &|s| {
                    gemm.run(s, &x, w(), &both, None)?;
                    b.k.geglu(s, &both.narrow(1, 0, f)?, &both.narrow(1, f, f)?, &h)
                }),
                (
                    if fused.fused() {
                        "fused kernel"
                    } else {
                        "plan (not fused)"
                    },
                    &|s| fused.run(&b.k, s, &x, w(), &h),
                ),
                (
                    if plan.on_wgmma() {
                        "wgmma kernel"
                    } else {
                        "plan"
                    },
                    &|s| plan.run(&b.k, s, &x, w(), &h),
                ),
            ];
            // One row: the form, its median and p99 (ms), and the weight's rate.
            let row = |form: &str, med: f64, p: f64| {
                println!(
                    "| {form} | {m}x{kk}x{} | {:>9.1} | {:>9.1} | weight {:>5.0} GB/s | {:>5.0} % of copy |",
                    2 * f,
                    med * 1e3,
                    p * 1e3,
                    bytes / (med * 1e-3) / 1e9,
                    100.0 * bytes / (med * 1e-3) / 1e9 / b.copy_gbs
                )
            };
            println!();
            for (form, op) in forms {
                let (med, p) = b.time(form, op);
                row(&format!("expert gate+up+geglu, {form:<16}"), med, p);
            }
            // The wgmma kernel's TMA ring alone (Hopper): the same weights' copies without the
            // MMAs, with and without the tokens, by box height and ring depth.
            let sink = Tensor::alloc(b.k.ctx(), "sink", DType::I32, &[1]).unwrap();
            for (with_x, box_rows, stages) in [
                (true, 32, 8),
                (false, 32, 8),
                (false, 64, 8),
                (false, 16, 8),
                (false, 32, 2),
                (false, 32, 12),
                (true, 64, 12),
            ] {
                let form = format!(
                    "TMA ring, boxes of {box_rows} rows, {stages} stages{}",
                    if with_x { ", tokens too" } else { "" }
                );
                let x_in = with_x.then_some(&x);
                if let Err(e) =
                    b.k.tma_ring_probe(b.s, &ws[0], x_in, box_rows, stages, &sink)
                {
                    println!("| {form} | not run: {e} |");
                    break;
                }
                let (med, p) = b.time(&form, &|s| {
                    b.k.tma_ring_probe(s, w(), x_in, box_rows, stages, &sink)
                });
                row(&form, med, p);
            }
        }
    }
    if b.wants("fp8") {
        // bf16 against FP8 (E4M3 codes, per-feature weight scales, one activation scale) at the
        // action expert's and the prefix's shapes, each weight read from memory: the repeated
        // ops cycle through copies of it (≥ 128 MB), as in a model whose weights exceed L2.
        println!();
        for (what, m, kk, n) in EXPERT_GEMMS.into_iter().chain([
            ("gemma qkv", 576, 2048, 2560),
            ("gemma gate+up", 576, 2048, 32768),
            ("gemma down", 576, 16384, 2048),
            ("siglip qkv", 512, 1152, 3456),
            ("siglip out", 512, 1152, 1152),
            ("siglip fc1", 512, 1152, 4304),
            ("siglip fc2", 512, 4304, 1152),
        ]) {
            let FromMemory { x, ws, out, g } = FromMemory::new(&mut b, m, kk, n);
            let next = std::cell::Cell::new(0usize);
            let pick = |len: usize| {
                next.set((next.get() + 1) % len);
                next.get()
            };
            let (bf_med, bf_p) = b.time(what, &|s| g.run(s, &x, &ws[pick(ws.len())], &out, None));
            let ctx = b.k.ctx().clone();
            let codes = |shape: &[usize]| Tensor::alloc(&ctx, "codes", DType::E4M3, shape).unwrap();
            let xq = codes(&[m, kk]);
            let xs = b.tensor("x_scale", DType::F32, &[1]);
            xs.write_f32(b.s, &[0.01]).unwrap();
            b.k.quantize_e4m3(b.s, &x, &xs, &xq).unwrap();
            let wq: Vec<Tensor> = ws
                .iter()
                .map(|w| {
                    let q = codes(&[n, kk]);
                    b.k.quantize_e4m3(b.s, w, &xs, &q).unwrap();
                    q
                })
                .collect();
            let wsc = b.tensor("w_scale", DType::F32, &[n]);
            // Each of the library's own kernels that takes the shape (chosen untuned: the wgmma
            // form first, then the rows kernel) and cuBLASLt's GEMM.
            let options = *b.k.options();
            let with = |rows: bool, wgmma: bool| {
                Kernels::with_options(
                    &ctx,
                    frt_kernels::KernelOptions {
                        fp8_rows_kernel: rows,
                        fp8_wgmma: wgmma,
                        gemm_tuning: options.gemm_tuning && !rows,
                        ..options
                    },
                )
                .unwrap()
            };
            let mut cells = Vec::new();
            let mut seen = Vec::new();
            let xs_rows = b.tensor("x_scale", DType::F32, &[m]);
            for k in [with(true, true), with(true, false), with(false, false)] {
                let fp8 = match k.linear_e4m3(&xq, &wq[0], &out, false) {
                    Ok(p) => p,
                    Err(e) => {
                        cells.push(format!("FP8 not run: {e}"));
                        continue;
                    }
                };
                let implementation = fp8.implementation();
                if seen.contains(&implementation) {
                    continue;
                }
                seen.push(implementation);
                let xsv = xs_rows.narrow(0, 0, fp8.x_scale_elements()).unwrap();
                let (f_med, f_p) = b.time(what, &|s| {
                    fp8.run(s, &xq, &xsv, &wq[pick(wq.len())], &wsc, &out, None)
                });
                cells.push(format!(
                    "e4m3 {:>6.1} / {:>6.1} µs ({:>5.0} GB/s, {}) {:.2}×",
                    f_med * 1e3,
                    f_p * 1e3,
                    (n * kk) as f64 / (f_med * 1e-3) / 1e9,
                    fp8.implementation(),
                    bf_med / f_med
                ));
            }
            // cuBLASLt with the activation's scale alone (the weight's per-feature scales left
            // to the output's reader: `linear_e4m3_deferred`), for the shapes it plans.
            if let Ok(fp8) = b.k.linear_e4m3_deferred(&xq, &wq[0], &out) {
                let (f_med, f_p) = b.time(what, &|s| {
                    fp8.run(s, &xq, &xs, &wq[pick(wq.len())], &wsc, &out, None)
                });
                cells.push(format!(
                    "e4m3 deferred {:>6.1} / {:>6.1} µs ({}) {:.2}×",
                    f_med * 1e3,
                    f_p * 1e3,
                    fp8.implementation(),
                    bf_med / f_med
                ));
            }
            // The expert's gate+up then its GEGLU writing the down projection's codes: each
            // GEMM that takes the shape and `geglu_e4m3`, against the one op doing both.
            if what == "expert gate+up" {
                let f = n / 2;
                let (hc, h) = (codes(&[m, f]), b.tensor("h", out.dtype(), &[m, f]));
                let (g, u) = (out.narrow(1, 0, f).unwrap(), out.narrow(1, f, f).unwrap());
                let mut seen = Vec::new();
                for k in [with(true, true), with(false, false)] {
                    let Ok(fp8) = k.linear_e4m3(&xq, &wq[0], &out, false) else {
                        continue;
                    };
                    if seen.contains(&fp8.implementation()) {
                        continue;
                    }
                    seen.push(fp8.implementation());
                    let xsv = xs_rows.narrow(0, 0, fp8.x_scale_elements()).unwrap();
                    let (f_med, f_p) = b.time(what, &|s| {
                        fp8.run(s, &xq, &xsv, &wq[pick(wq.len())], &wsc, &out, None)?;
                        b.k.geglu_e4m3(s, &g, &u, &h, (&hc, &xs))
                    });
                    cells.push(format!(
                        "e4m3 + geglu_e4m3 {:>6.1} / {:>6.1} µs ({})",
                        f_med * 1e3,
                        f_p * 1e3,
                        fp8.implementation()
                    ));
                }
                match b.k.linear_geglu_e4m3(&xq, &wq[0], &hc, out.dtype()) {
                    Ok(Some(fused)) => {
                        let (f_med, f_p) = b.time(what, &|s| {
                            fused.run(s, &xq, &xs, &wq[pick(wq.len())], &wsc, &hc, &xs)
                        });
                        cells.push(format!(
                            "linear_geglu_e4m3 {:>6.1} / {:>6.1} µs",
                            f_med * 1e3,
                            f_p * 1e3
                        ));
                    }
                    Ok(None) => cells.push("linear_geglu_e4m3: no kernel here".into()),
                    Err(e) => cells.push(format!("linear_geglu_e4m3 not run: {e}")),
                }
            }
            // The expert's residual projections also as split FP8 GEMMs (the parts its
            // residual norms add): parts of 512 and of 256 codes, each kernel that takes them.
            for parts in [kk / 512, kk / 256] {
                if m > frt_kernels::FP8_ROWS_MAX || kk < 2048 {
                    break;
                }
                let partials = Tensor::alloc(&ctx, "partials", DType::F32, &[parts, m, n]).unwrap();
                let mut seen = Vec::new();
                for k in [with(true, true), with(true, false)] {
                    match k.linear_e4m3_split(&xq, &wq[0], &partials) {
                        Ok(sp) if seen.contains(&sp.implementation()) => {}
                        Ok(sp) => {
                            seen.push(sp.implementation());
                            let (f_med, f_p) = b.time(what, &|s| {
                                sp.run(s, &xq, &xs, &wq[pick(wq.len())], &wsc, &partials)
                            });
                            cells.push(format!(
                                "e4m3 {:>6.1} / {:>6.1} µs ({:>5.0} GB/s, split in {parts}, {}) {:.2}×",
                                f_med * 1e3,
                                f_p * 1e3,
                                (n * kk) as f64 / (f_med * 1e-3) / 1e9,
                                sp.implementation(),
                                bf_med / f_med
                            ));
                        }
                        Err(e) => cells.push(format!("split not run: {e}")),
                    }
                }
            }
            println!(
                "| {what:<16} | {:<24} | bf16 {:>6.1} / {:>6.1} µs ({:>5.0} GB/s) | {} |",
                format!("{m}x{kk}x{n}"),
                bf_med * 1e3,
                bf_p * 1e3,
                2.0 * (n * kk) as f64 / (bf_med * 1e-3) / 1e9,
                cells.join(" | "),
            );
        }
    }
    if b.wants("codes") {
        // The kernels that write E4M3 codes at the prefix's size: its GEGLU after the deferred-
        // scale gate+up GEMM, writing the down projection's codes only (as the FP8 prefix runs
        // it), the RMS norm into codes, and the quantization of a whole gate+up output; and the
        // bf16 prefix's GEGLU beside them.
        println!();
        let (m, kk, f) = (576usize, 2048usize, 16384usize);
        let dt = DType::BF16;
        let ctx = b.k.ctx().clone();
        let codes = |shape: &[usize]| Tensor::alloc(&ctx, "codes", DType::E4M3, shape).unwrap();
        let gate_up = b.tensor("gate_up", dt, &[m, 2 * f]);
        let scales = b.tensor("w_scale", DType::F32, &[2 * f]);
        let cs = b.tensor("code_scale", DType::F32, &[1]);
        cs.write_f32(b.s, &[0.01]).unwrap();
        let (g, u) = (
            gate_up.narrow(1, 0, f).unwrap(),
            gate_up.narrow(1, f, f).unwrap(),
        );
        let (gs, us) = (
            scales.narrow(0, 0, f).unwrap(),
            scales.narrow(0, f, f).unwrap(),
        );
        let (hc, all) = (codes(&[m, f]), codes(&[m, 2 * f]));
        let (x, w, xc) = (
            b.tensor("x", dt, &[m, kk]),
            b.tensor("w", dt, &[kk]),
            codes(&[m, kk]),
        );
        let h = b.tensor("h", dt, &[m, f]);
        type Op<'a> = &'a dyn Fn(Stream) -> Result<()>;
        let rows: [(String, Op); 4] = [
            (format!("geglu {m}x{f} (bf16 out)"), &|s| {
                b.k.geglu(s, &g, &u, &h)
            }),
            (format!("geglu_scaled_e4m3 {m}x{f}"), &|s| {
                b.k.geglu_scaled_e4m3(s, (&g, &u), (&gs, &us), None, (&hc, &cs))
            }),
            (format!("rms_norm_e4m3 {m}x{kk}"), &|s| {
                b.k.rms_norm_e4m3(s, &x, &w, None, 1e-6, (&xc, &cs))
            }),
            (format!("quantize_e4m3 {m}x{}", 2 * f), &|s| {
                b.k.quantize_e4m3(s, &gate_up, &cs, &all)
            }),
        ];
        println!("| E4M3 codes | median µs | p99 µs |");
        println!("|---|---|---|");
        for (what, op) in rows {
            let (med, p) = b.time(&what, op);
            println!("| {what} | {:.1} | {:.1} |", med * 1e3, p * 1e3);
        }
    }
    if b.wants("launch") {
        // What a kernel boundary costs inside a replayed graph, as the models' graphs run their
        // kernels: a cast repeated back to back, each launch waiting for the one before, over
        // one element (one block) and over 132 · 256 (a block of 256 threads for each of an
        // H100's SMs), next to no work either way.
        println!();
        println!("| launches in a graph, each after the one before | median µs | p99 µs |");
        println!("|---|---|---|");
        for n in [1usize, 132 * 256] {
            let x = b.tensor("x", DType::F32, &[n]);
            let y = b.tensor("y", DType::BF16, &[n]);
            let (m, p) = b.time("launch", &|s| b.k.cast(s, &x, &y));
            println!("| cast of {n} f32 | {:.2} | {:.2} |", m * 1e3, p * 1e3);
        }
        // A barrier of the whole grid inside one launch (a persistent kernel's phase
        // boundary): one launch of 1 and of 17 barriers, plain and cooperative, over a block
        // of 256 threads for each of 128 SMs; the difference over 16 is one barrier.
        let sync = b.tensor("sync", DType::I32, &[2]);
        sync.write_i32(b.s, &[0, 0]).unwrap();
        let blocks = 128;
        for cooperative in [false, true] {
            if let Err(e) = b.k.grid_barrier_probe(b.s, &sync, blocks, 1, cooperative) {
                println!("| grid barrier | not run: {e} | |");
                break;
            }
            let time = |rounds: usize| {
                b.time("grid barrier", &|s| {
                    b.k.grid_barrier_probe(s, &sync, blocks, rounds, cooperative)
                })
            };
            let ((m1, p1), (m17, _)) = (time(1), time(17));
            let form = if cooperative { "cooperative" } else { "plain" };
            println!(
                "| {form} launch of {blocks} blocks, 1 grid barrier | {:.2} | {:.2} |",
                m1 * 1e3,
                p1 * 1e3
            );
            println!(
                "| one grid barrier of {blocks} blocks ({form} launch, 17 against 1) | {:.2} | |",
                (m17 - m1) / 16.0 * 1e3
            );
        }
    }
    if b.wants("mem") {
        // What a thread of each row kernel takes in registers (with the block size, how many
        // rows an SM holds at once).
        let regs: Vec<String> = [
            "rms_norm",
            "rms_norm_plain",
            "rms_norm_few",
            "layer_norm",
            "softmax",
            "masked_softmax",
            "masked_softmax_vec3",
            "binary",
        ]
        .iter()
        .map(|n| match b.k.kernel_registers(n, Some(dt)) {
            Ok(Some(r)) => format!("{n} {r}"),
            Ok(None) => format!("{n} -"),
            Err(e) => format!("{n}: {e}"),
        })
        .collect();
        println!("registers a thread ({}): {}", dt.name(), regs.join(", "));
        // Memory-bound ops.
        for (rows, cols, tag) in [
            (800usize, 2048usize, "gemma"),
            (256, 1152, "siglip"),
            (1500, 384, "whisper"),
        ] {
            let x = b.tensor("x", dt, &[rows, cols]);
            let w = b.tensor("w", dt, &[cols]);
            let bb = b.tensor("b", dt, &[cols]);
            let o = b.tensor("o", dt, &[rows, cols]);
            let io = 2.0 * (rows * cols) as f64 * sz;
            let shape = format!("{rows}x{cols} ({tag})");
            b.mem_row("rms_norm", &shape, dt, io, &|s| {
                b.k.rms_norm(s, &x, &w, &o, 1e-6)
            });
            b.mem_row("layer_norm", &shape, dt, io, &|s| {
                b.k.layer_norm(s, &x, &w, &bb, &o, 1e-6)
            });
            b.mem_row("add", &shape, dt, 1.5 * io, &|s| b.k.add(s, &x, &o, &o));
            b.mem_row("softmax", &shape, dt, io, &|s| b.k.softmax(s, &x, &o));
        }
        {
            // The flow step's update (action chunk 50 × 32, f32 state, bf16 copy for the next
            // step), plain and with a frozen prefix of 5 rows (the count read on the device).
            let f32t = |b: &mut Bench, n: &str| b.tensor(n, DType::F32, &[50, 32]);
            let (x, v, x1, fz) = (
                f32t(&mut b, "x"),
                f32t(&mut b, "v"),
                f32t(&mut b, "x1"),
                f32t(&mut b, "frozen"),
            );
            let xc = b.tensor("x_cast", dt, &[50, 32]);
            let rows = Tensor::alloc(b.k.ctx(), "rows", DType::I32, &[1]).unwrap();
            rows.write_i32(b.s, &[5]).unwrap();
            let io = (50 * 32) as f64 * (4.0 * 3.0 + sz);
            b.mem_row("euler_step_cast", "50x32 (actions)", dt, io, &|s| {
                b.k.euler_step_cast(s, &x, &v, -0.1, &xc)
            });
            b.mem_row("euler+inpaint", "50x32, 5 rows frozen", dt, io, &|s| {
                b.k.euler_step_inpaint_cast(s, &x, &v, -0.1, &x1, &fz, &rows, 0.3, &xc)
            });
        }
        {
            let (rows, cols) = (50, 1024);
            let x = b.tensor("x", dt, &[rows, cols]);
            let m = b.tensor("mod", dt, &[1, 3 * cols]);
            let o = b.tensor("o", dt, &[rows, cols]);
            b.mem_row(
                "ada_rms_norm",
                "50x1024 (expert)",
                dt,
                (2 * rows * cols + 2 * cols) as f64 * sz,
                &|s| b.k.ada_rms_norm(s, &x, &m, &o, 1e-6).map(|_| ()),
            );
            let g = m.narrow(1, 2 * cols, cols).unwrap();
            let y = b.tensor("y", dt, &[rows, cols]);
            b.mem_row(
                "res_ada_rms_norm",
                "50x1024 (expert)",
                dt,
                (4 * rows * cols + 3 * cols) as f64 * sz,
                &|s| {
                    b.k.residual_ada_rms_norm(s, &x, &y, &g, &m, &o, 1e-6)
                        .map(|_| ())
                },
            );
            b.mem_row(
                "gated_residual",
                "50x1024 (expert)",
                dt,
                (3 * rows * cols) as f64 * sz,
                &|s| b.k.gated_residual(s, &x, &o, &g, &o),
            );
        }
        {
            // The floor of a dependent kernel in a graph: a cast of 8 values.
            let (xf, o8) = (b.tensor("xf", DType::F32, &[8]), b.tensor("o8", dt, &[8]));
            b.mem_row("launch floor", "cast of 8 values", dt, 48.0, &|s| {
                b.k.cast(s, &xf, &o8)
            });
        }
        {
            let (rows, f) = (800, 16384);
            let gu = b.tensor("gate_up", dt, &[rows, 2 * f]);
            let o = b.tensor("o", dt, &[rows, f]);
            b.mem_row(
                "geglu",
                "800x16384 (gemma)",
                dt,
                (3 * rows * f) as f64 * sz,
                &|s| b.k.geglu(s, &gu.narrow(1, 0, f)?, &gu.narrow(1, f, f)?, &o),
            );
            let x = b.tensor("x", dt, &[1500, 1536]);
            let o2 = b.tensor("o", dt, &[1500, 1536]);
            b.mem_row(
                "gelu (erf)",
                "1500x1536 (whisper)",
                dt,
                (2 * 1500 * 1536) as f64 * sz,
                &|s| b.k.gelu(s, &x, &o2),
            );
            b.mem_row(
                "silu",
                "1500x1536",
                dt,
                (2 * 1500 * 1536) as f64 * sz,
                &|s| b.k.silu(s, &x, &o2),
            );
            let xf = b.tensor("xf", DType::F32, &[1500, 1536]);
            b.mem_row(
                "cast f32->bf16",
                "1500x1536",
                dt,
                (1500 * 1536 * 6) as f64,
                &|s| b.k.cast(s, &xf, &o2),
            );
        }
        {
            let q = b.tensor("q", dt, &[800, 8, 256]);
            let pos = Tensor::alloc(b.k.ctx(), "pos", DType::I32, &[800]).unwrap();
            pos.write_i32(b.s, &(0..800).collect::<Vec<i32>>()).unwrap();
            b.mem_row(
                "rope",
                "800x8x256 (gemma q)",
                dt,
                (2 * 800 * 8 * 256) as f64 * sz + 3200.0,
                &|s| b.k.rope(s, &q, &pos, &q, 10_000.0),
            );
            // Gemma's fused projection split into rotated q, k and copied v (8 q heads, 1 kv head):
            // the prefix (576 tokens) and the action expert (50).
            for tokens in [576usize, 50] {
                let qkv = b.tensor("qkv", dt, &[tokens, 10 * 256]);
                let (q, k, v) = (
                    b.tensor("q", dt, &[tokens, 8 * 256]),
                    b.tensor("k", dt, &[tokens, 256]),
                    b.tensor("v", dt, &[tokens, 256]),
                );
                let pos = Tensor::alloc(b.k.ctx(), "pos", DType::I32, &[tokens]).unwrap();
                pos.write_i32(b.s, &(0..tokens as i32).collect::<Vec<i32>>())
                    .unwrap();
                b.mem_row(
                    "rope_qkv",
                    &format!("{tokens}x(8+1+1)x256"),
                    dt,
                    (2 * tokens * 10 * 256) as f64 * sz + 4.0 * tokens as f64,
                    &|s| b.k.rope_qkv(s, &qkv, &pos, &q, &k, &v, 256, 10_000.0),
                );
            }
            let ids = Tensor::alloc(b.k.ctx(), "ids", DType::I32, &[200]).unwrap();
            ids.write_i32(b.s, &(0..200).map(|i| i * 997).collect::<Vec<i32>>())
                .unwrap();
            let table = b.tensor("table", dt, &[257152, 2048]);
            let e = b.tensor("e", dt, &[200, 2048]);
            b.mem_row(
                "embedding",
                "200 of 257152x2048",
                dt,
                (2 * 200 * 2048) as f64 * sz,
                &|s| b.k.embedding(s, &ids, &table, &e, 45.25),
            );
        }
    }
    if b.wants("attention") {
        // Attention: FLOPs 4·Sq·Sk·Hq·D (two products), bytes q + k + v + out.
        println!(
            "\nattention (reported separately: FLOP floor at the GEMM ceiling, byte floor at the copy ceiling)\n"
        );
        println!(
            "| {:<30} | {:>9} | {:>9} | {:>9} | {:>10} | {:>10} |",
            "case, form", "median µs", "p99 µs", "TFLOP/s", "FLOP floor", "byte floor"
        );
        println!(
            "|{}|{}|{}|{}|{}|{}|",
            "-".repeat(32),
            "-".repeat(11),
            "-".repeat(11),
            "-".repeat(11),
            "-".repeat(12),
            "-".repeat(12)
        );
        // (case, Sq, Sk, Hq, Hkv, D, mask kind, valid keys): kinds 0 full, 1 a valid length, 2
        // prefix and suffix (the valid length of the prefix).
        for (what, sq, sk, hq, hkv, d, kind, valid) in [
            (
                "gemma prefix, valid len",
                800usize,
                800usize,
                8usize,
                1usize,
                256usize,
                1u8,
                600usize,
            ),
            ("gemma prefix, 2 views", 576, 576, 8, 1, 256, 1, 552),
            ("expert over prefix+suffix", 50, 850, 8, 1, 256, 2, 600),
            ("expert, 64-token prompt", 50, 626, 8, 1, 256, 2, 552),
            ("siglip (2 views: 1 of them)", 256, 256, 16, 16, 72, 0, 256),
            ("whisper tiny encoder", 1500, 1500, 6, 6, 64, 0, 1500),
        ] {
            let q = b.tensor("q", dt, &[sq, hq, d]);
            let kt = b.tensor("k", dt, &[sk, hkv, d]);
            let v = b.tensor("v", dt, &[sk, hkv, d]);
            let o = b.tensor("o", dt, &[sq, hq, d]);
            let len = Tensor::alloc(b.k.ctx(), "len", DType::I32, &[1]).unwrap();
            len.write_i32(b.s, &[valid as i32]).unwrap();
            let mask = match kind {
                1 => AttentionMask::valid(&len),
                2 => AttentionMask::prefix_suffix(&len, sk - sq),
                _ => AttentionMask::full(),
            };
            let scale = 1.0 / (d as f32).sqrt();
            let plan = b.k.attention_plan(&q, &kt, &v, &o, &mask, scale).unwrap();
            let flops = 4.0 * (sq * sk * hq * d) as f64;
            let bytes = (2 * sq * hq * d + 2 * sk * hkv * d) as f64 * sz;
            let fused = b.time(what, &|s| b.k.attention(s, &q, &kt, &v, &o, &mask, scale));
            let planned = b.time(what, &|s| plan.run(&b.k, s));
            let mut forms = vec![
                ("fused kernel".to_string(), fused),
                (
                    if plan.uses_gemm() {
                        "plan: GEMM+softmax+GEMM".to_string()
                    } else if let Some(n) = plan.flash_splits() {
                        let res = if plan.flash_resident() {
                            ", resident"
                        } else {
                            ""
                        };
                        format!("plan: tensor cores ×{n}{res}")
                    } else {
                        "plan: fused kernel".to_string()
                    },
                    planned,
                ),
            ];
            if let Ok(fp) = b.k.attention_plan_flash(&q, &kt, &v, &o, &mask, scale) {
                let splits = fp.flash_splits().unwrap_or(1);
                // Unless the plan above already is this one.
                if plan.flash_splits().is_none() {
                    forms.push((
                        format!("tensor cores ×{splits}"),
                        b.time(what, &|s| fp.run(&b.k, s)),
                    ));
                }
                // Every other split count too, up to 16 (H100, the action expert's attention: more
                // splits are faster up to one 64-key tile a split, 38.8 µs with 1 split, 12.2 with
                // 10).
                for n in 1..=sk.div_ceil(64).min(16) {
                    let p =
                        b.k.attention_plan_flash_splits(&q, &kt, &v, &o, &mask, scale, n)
                            .unwrap();
                    if p.flash_splits() == Some(n) && n != splits {
                        forms.push((
                            format!("tensor cores, {n} splits"),
                            b.time(what, &|s| p.run(&b.k, s)),
                        ));
                    }
                }
            }
            for (form, (m, p)) in forms {
                println!(
                    "| {:<30} | {:>9.1} | {:>9.1} | {:>9.1} | {:>7.1} µs | {:>7.1} µs |",
                    format!("{what}, {form}"),
                    m * 1e3,
                    p * 1e3,
                    flops / (m * 1e-3) / 1e12,
                    flops / (b.gemm_tflops * 1e12) * 1e6,
                    bytes / (b.copy_gbs * 1e9) * 1e6
                );
            }
        }
    }
    if b.wants("attention") || b.wants("siglip") {
        // SigLIP's two views as the model runs them: one launch over the fused q|k|v rows
        // (512 × 3456, 16 heads of 72 a view).
        let (vt, heads, hd, views) = (256usize, 16usize, 72usize, 2usize);
        let width = heads * hd;
        let qkv = b.tensor("qkv", dt, &[views * vt, 3 * width]);
        let attn = b.tensor("attn", dt, &[views * vt, width]);
        let rows = |t: &Tensor, view: usize, col: usize| {
            let w = t.shape()[1];
            Tensor::with_layout(
                t.buffer(),
                dt,
                &[vt, heads, hd],
                &[w, hd, 1],
                t.offset() + view * vt * w + col,
            )
            .unwrap()
        };
        let mask = AttentionMask::full();
        let scale = 1.0 / (hd as f32).sqrt();
        let mut plans: Vec<AttentionPlan> = Vec::new();
        for view in 0..views {
            let p =
                b.k.attention_plan_sharing(
                    &rows(&qkv, view, 0),
                    &rows(&qkv, view, width),
                    &rows(&qkv, view, 2 * width),
                    &rows(&attn, view, 0),
                    &mask,
                    scale,
                    plans.first(),
                )
                .unwrap();
            plans.push(p);
        }
        if let Some(batch) = b.k.attention_plan_batch(&plans).unwrap() {
            let (m, p) = b.time("siglip 2 views", &|s| batch.run(&b.k, s));
            println!("\n| siglip, 2 views as one launch | median µs | p99 µs |\n|---|---|---|");
            let form = if batch.flash_resident() {
                "resident"
            } else {
                "streaming"
            };
            println!(
                "| {form}, {} split(s) | {:.1} | {:.1} |",
                batch.flash_splits().unwrap_or(1),
                m * 1e3,
                p * 1e3
            );
        }
    }
    if b.wants("rope") {
        // The action expert's RoPE and attention over a 64-token prompt: 50 tokens of 8 query
        // heads and one key/value head of 256 behind 2 views' and the prompt's 576 keys.
        println!("\n| RoPE and attention (action expert) | median µs | p99 µs |\n|---|---|---|");
        let (tokens, hq, hkv, d, from) = (50, 8, 1, 256, 576);
        let qkv = b.tensor("qkv", dt, &[tokens, (hq + 2 * hkv) * d]);
        let (q, o) = (
            b.tensor("q", dt, &[tokens, hq, d]),
            b.tensor("o", dt, &[tokens, hq, d]),
        );
        let (kc, vc) = (
            b.tensor("k", dt, &[from + tokens, hkv, d]),
            b.tensor("v", dt, &[from + tokens, hkv, d]),
        );
        let pos = Tensor::alloc(b.k.ctx(), "pos", DType::I32, &[tokens]).unwrap();
        let p: Vec<i32> = (0..tokens as i32).map(|t| 600 + t).collect();
        pos.write_i32(b.s, &p).unwrap();
        let table = b.k.rope_table(&pos, d, 10_000.0).unwrap();
        table.compute(&b.k, b.s).unwrap();
        let flat = |t: &Tensor, n: usize| t.reshape(&[t.dim(0), n * d]).unwrap();
        let (q2, k2, v2) = (
            flat(&q, hq),
            flat(&kc, hkv).narrow(0, from, tokens).unwrap(),
            flat(&vc, hkv).narrow(0, from, tokens).unwrap(),
        );
        let mask = AttentionMask::full();
        let plan =
            b.k.attention_plan(&q, &kc, &vc, &o, &mask, 1.0 / (d as f32).sqrt())
                .unwrap();
        // The projection as a split GEMM's two f32 parts (the FP8 expert's q/k/v on wgmma).
        let parts = b.tensor("parts", DType::F32, &[2, tokens, (hq + 2 * hkv) * d]);
        type Row<'a> = (&'a str, &'a dyn Fn(Stream) -> Result<()>);
        let rows: [Row; 6] = [
            ("RoPE angles (rope_table)", &|s| table.compute(&b.k, s)),
            ("rope_qkv", &|s| {
                b.k.rope_qkv(s, &qkv, &pos, &q2, &k2, &v2, d, 10_000.0)
            }),
            ("rope_qkv_table", &|s| {
                b.k.rope_qkv_table(s, &qkv, &table, &q2, &k2, &v2)
            }),
            ("rope_qkv_table_parts, 2 f32 parts", &|s| {
                b.k.rope_qkv_table_parts(s, &parts, &table, &q2, &k2, &v2)
            }),
            ("attention", &|s| plan.run(&b.k, s)),
            ("rope_qkv_table, then attention", &|s| {
                b.k.rope_qkv_table(s, &qkv, &table, &q2, &k2, &v2)?;
                plan.run(&b.k, s)
            }),
        ];
        for (what, op) in rows {
            let (m, p) = b.time(what, op);
            println!("| {what} | {:.1} | {:.1} |", m * 1e3, p * 1e3);
        }
    }
    if b.wants("conv") {
        // Whisper stem and SigLIP patch embedding.
        println!();
        {
            let x = b.tensor("mel", dt, &[3000, 80]);
            let w1 = b.tensor("w1", dt, &[384, 80, 3]);
            let b1 = b.tensor("b1", dt, &[384]);
            let h1 = b.tensor("h1", dt, &[3000, 384]);
            let w2 = b.tensor("w2", dt, &[384, 384, 3]);
            let h2 = b.tensor("h2", dt, &[1500, 384]);
            let c1 = frt_kernels::Conv1d::new(&b.k, &x, &w1, &h1, 1, 1).unwrap();
            let c2 = frt_kernels::Conv1d::new(&b.k, &h1, &w2, &h2, 2, 1).unwrap();
            let rows = [
                (
                    "conv1d 3000x80->384 s1, direct",
                    b.time("conv1", &|s| b.k.conv1d(s, &x, &w1, &b1, &h1, 1, 1)),
                    3000 * 384 * 80 * 3,
                ),
                (
                    "conv1d 3000x80->384 s1, im2col+gemm",
                    b.time("conv1p", &|s| c1.run(&b.k, s, &x, &w1, &b1, &h1)),
                    3000 * 384 * 80 * 3,
                ),
                (
                    "conv1d 3000x384->384 s2, direct",
                    b.time("conv2", &|s| b.k.conv1d(s, &h1, &w2, &b1, &h2, 2, 1)),
                    1500 * 384 * 384 * 3,
                ),
                (
                    "conv1d 3000x384->384 s2, im2col+gemm",
                    b.time("conv2p", &|s| c2.run(&b.k, s, &h1, &w2, &b1, &h2)),
                    1500 * 384 * 384 * 3,
                ),
            ];
            for (what, (m, p), macs) in rows {
                println!(
                    "| {what:<38} | {:>9.1} µs median | {:>9.1} µs p99 | {:>6.1} TFLOP/s |",
                    m * 1e3,
                    p * 1e3,
                    2.0 * macs as f64 / (m * 1e-3) / 1e12
                );
            }
            let imgs = b.tensor("imgs", dt, &[2, 224, 224, 3]);
            let patches = b.tensor("patches", dt, &[512, 588]);
            let w = b.tensor("w", dt, &[1152, 588]);
            let bias = b.tensor("bias", dt, &[1152]);
            let pos = b.tensor("pos", dt, &[256, 1152]);
            let out = b.tensor("out", dt, &[512, 1152]);
            let pe = PatchEmbed::new(&b.k, &imgs, &patches, &w, &out, 14).unwrap();
            let (m, p) = b.time("patch_embed", &|s| {
                pe.run(&b.k, s, &imgs, &patches, &w, &bias, &pos, &out)
            });
            println!(
                "| patch_embed 2x224x224x3 p14 -> 1152 | {:>9.1} µs median | {:>9.1} µs p99 |",
                m * 1e3,
                p * 1e3
            );
        }
    }
}
