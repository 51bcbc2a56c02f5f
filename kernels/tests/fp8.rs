//! FP8 E4M3 ops on both backends: static quantization gives exactly the codes of
//! `frt_kernels::fp8` (the host's arithmetic) on every backend; the FP8 linear layer matches
//! an f64 reference of the decoded codes and scales; new scales written into their tensors
//! reach a captured graph without recapture.
//!
//! Host: `cargo test -p frt-kernels --test fp8`. CUDA: `-- --ignored` (`.gpu/kernels-fp8`).

mod common;

use common::{Backend, FLOATS, Rng, check_elements, gelu_tanh, size_ok, tol};
use frt_exec::{Graph, ShapeKey};
use frt_kernels::fp8::{E4M3_MAX, e4m3_from_f32, e4m3_to_f32, quantize_rows_e4m3};
use frt_kernels::{AttentionMask, DType, KernelOptions, Kernels, Tensor};

fn exec_err(e: frt_kernels::Error) -> frt_exec::Error {
    match e {
        frt_kernels::Error::Exec(e) => e,
        other => frt_exec::Error::Invalid {
            op: "capture",
            reason: other.to_string(),
        },
    }
}

/// Values spread over E4M3's whole range once divided by `scale`: tiny, subnormal, normal,
/// saturating, both signs.
fn spread(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let e = rng.uniform() * 12.0 - 2.0; // 2^-14 .. 2^10 before the scale
            let v = 2f32.powf(e) * scale;
            if rng.below(2) == 0 { v } else { -v }
        })
        .collect()
}

/// What a float tensor of `dt` holds for `v` (its storage rounding).
fn stored(dt: DType, v: f32) -> f32 {
    match dt {
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        DType::F16 => half::f16::from_f32(v).to_f32(),
        _ => v,
    }
}

fn scalar(b: &Backend, v: f32) -> Tensor {
    filled(b, v, 1)
}

fn filled(b: &Backend, v: f32, n: usize) -> Tensor {
    let t = Tensor::alloc(b.k.ctx(), "scale", DType::F32, &[n]).unwrap();
    t.write_f32(b.s, &vec![v; n]).unwrap();
    t
}

/// The activation scale as the plan takes it (one value, or one per row).
fn x_scale(b: &Backend, plan: &frt_kernels::Fp8Linear, v: f32) -> Tensor {
    filled(b, v, plan.x_scale_elements())
}

fn quantize_gives_the_host_codes(b: &Backend) {
    let mut rng = Rng::new(81);
    for (n, big) in [(1000usize, false), (50 * 1024, false), (576 * 2048, true)] {
        if !size_ok(b, big) {
            continue;
        }
        for dt in FLOATS {
            let scale = 0.37f32;
            let v = spread(&mut rng, n, scale);
            let x = Tensor::alloc(b.k.ctx(), "x", dt, &[n]).unwrap();
            x.write_f32(b.s, &v).unwrap();
            let q = Tensor::alloc(b.k.ctx(), "q", DType::E4M3, &[n]).unwrap();
            let sc = scalar(b, scale);
            b.k.quantize_e4m3(b.s, &x, &sc, &q).unwrap();
            let got = q.read_bytes(b.s).unwrap();
            let want: Vec<u8> = v
                .iter()
                .map(|&x| e4m3_from_f32(stored(dt, x) / scale))
                .collect();
            let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            assert_eq!(
                differ, 0,
                "[{}] quantize {n} {dt:?}: {differ} codes differ",
                b.name
            );
            // Saturated and subnormal codes both occur.
            assert!(want.iter().any(|&c| c & 0x7f == 0x7e) && want.iter().any(|&c| c & 0x78 == 0));
            // Dequantized: each code's value times the scale, rounded to dt.
            let back = Tensor::alloc(b.k.ctx(), "back", dt, &[n]).unwrap();
            b.k.dequantize_e4m3(b.s, &q, &sc, &back).unwrap();
            let got = back.read_f32(b.s).unwrap();
            for (i, (&g, &c)) in got.iter().zip(&want).enumerate() {
                let w = stored(dt, e4m3_to_f32(c) * scale);
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "[{}] dequantize {dt:?} at {i}",
                    b.name
                );
            }
        }
    }
}

/// Inputs at the edges of the E4M3 rounding, as f32: every finite code's value, the midpoints
/// between neighbouring codes (ties) and one f32 step either side of them, the saturation and
/// subnormal boundaries, signed zeros, infinities and NaNs of both signs, then a stride through
/// every f32 bit pattern.
fn e4m3_edges() -> Vec<f32> {
    let mut mags: Vec<f32> = (0u8..0x7f).map(e4m3_to_f32).collect();
    let next = |v: f32, up: bool| {
        let b = v.to_bits();
        f32::from_bits(if up { b + 1 } else { b - 1 })
    };
    for i in 1..mags.len() {
        let mid = 0.5 * (mags[i - 1] + mags[i]);
        mags.extend([mid, next(mid, true), next(mid, false)]);
    }
    mags.extend([
        448.0,
        464.0,
        next(464.0, true),
        next(464.0, false),
        480.0,
        1e30,
    ]);
    mags.extend([
        f32::MIN_POSITIVE,
        1e-40,
        0.5 / 512.0,
        1.5 / 512.0,
        next(0.5 / 512.0, true),
    ]);
    mags.push(f32::INFINITY);
    let mut v: Vec<f32> = mags.iter().flat_map(|&m| [m, -m]).collect();
    v.extend([
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7fc0_1234),
        f32::from_bits(0xff80_0001),
    ]);
    v.extend((0..1u64 << 20).map(|i| f32::from_bits((i * 4093) as u32)));
    v
}

/// The device's conversion gives the host's codes at every edge of the rounding (on CUDA
/// from sm_89 the hardware conversion): with scale 1 the division is exact, so
/// each code is that of the input itself. In a whole number of eight-value groups (the
/// kernel's 8-byte stores) and one element short (a code at a time).
fn quantize_gives_the_host_codes_at_the_edges(b: &Backend) {
    let mut v = e4m3_edges();
    v.truncate(v.len() / 8 * 8);
    for n in [v.len(), v.len() - 1] {
        let x = Tensor::alloc(b.k.ctx(), "x", DType::F32, &[n]).unwrap();
        x.write_f32(b.s, &v[..n]).unwrap();
        let q = Tensor::alloc(b.k.ctx(), "q", DType::E4M3, &[n]).unwrap();
        b.k.quantize_e4m3(b.s, &x, &scalar(b, 1.0), &q).unwrap();
        let got = q.read_bytes(b.s).unwrap();
        let bad: Vec<_> = v[..n]
            .iter()
            .zip(&got)
            .filter(|&(&x, &g)| e4m3_from_f32(x) != g)
            .take(5)
            .map(|(&x, &g)| (x, x.to_bits(), g, e4m3_from_f32(x)))
            .collect();
        assert!(
            bad.is_empty(),
            "[{}] quantize of {n} edge values: (value, bits, got, want) {bad:?}",
            b.name
        );
    }
}

/// A quantized GEMM case: activations quantized with one scale, weights per row.
struct Fp8Case {
    x: Vec<u8>,
    x_scale: f32,
    w: Vec<u8>,
    w_scale: Vec<f32>,
    bias: Option<Vec<f32>>,
}

impl Fp8Case {
    fn new(rng: &mut Rng, m: usize, k: usize, n: usize, bias: bool) -> Fp8Case {
        let xf = rng.vec(m * k, 3.0);
        let x_scale = 3.0 / E4M3_MAX;
        let x = xf.iter().map(|v| e4m3_from_f32(v / x_scale)).collect();
        // Weights whose rows differ in size, so that per-row scales matter.
        let wf: Vec<f32> = (0..n * k)
            .map(|i| rng.uniform() * 0.05 * (1.0 + (i / k % 7) as f32))
            .collect();
        let (w, w_scale) = quantize_rows_e4m3(&wf, n, k);
        Fp8Case {
            x,
            x_scale,
            w,
            w_scale,
            bias: bias.then(|| rng.vec(n, 0.5)),
        }
    }

    /// f64 reference: Σ value(x)·value(w) · x_scale · w_scale[n] (+ bias as stored in dt).
    fn reference(&self, m: usize, k: usize, n: usize, dt: DType) -> Vec<f64> {
        let decode = |c: &[u8]| -> Vec<f64> { c.iter().map(|&c| e4m3_to_f32(c) as f64).collect() };
        let (x, w) = (decode(&self.x), decode(&self.w));
        let mut out = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let (xr, wr) = (&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
                let acc: f64 = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
                let b = self.bias.as_ref().map_or(0.0, |b| stored(dt, b[j]) as f64);
                out[i * n + j] = acc * self.x_scale as f64 * self.w_scale[j] as f64 + b;
            }
        }
        out
    }
}

struct Fp8Tensors {
    x: Tensor,
    w: Tensor,
    ws: Tensor,
    out: Tensor,
    bias: Option<Tensor>,
}

fn upload(b: &Backend, c: &Fp8Case, (m, k, n): (usize, usize, usize), dt: DType) -> Fp8Tensors {
    let ctx = b.k.ctx();
    let t = |name, dt, shape: &[usize]| Tensor::alloc(ctx, name, dt, shape).unwrap();
    let (x, w) = (t("x", DType::E4M3, &[m, k]), t("w", DType::E4M3, &[n, k]));
    x.write_bytes(b.s, &c.x).unwrap();
    w.write_bytes(b.s, &c.w).unwrap();
    let ws = t("w_scale", DType::F32, &[n]);
    ws.write_f32(b.s, &c.w_scale).unwrap();
    let out = t("out", dt, &[m, n]);
    out.write_f32(b.s, &vec![f32::NAN; m * n]).unwrap();
    let bias = c.bias.as_ref().map(|v| {
        let bt = t("bias", dt, &[n]);
        bt.write_f32(b.s, v).unwrap();
        bt
    });
    Fp8Tensors {
        x,
        w,
        ws,
        out,
        bias,
    }
}

fn linear_matches_the_reference(b: &Backend) {
    let mut rng = Rng::new(82);
    // (m, k, n, bias, big): small and odd (host; on CUDA cuBLASLt's), few rows with K a
    // multiple of 64 (the library's own kernel on CUDA: one row with a bias, 48 features; on
    // Hopper also its wgmma form: one row, 7 rows over 3 stages of K, 64 rows over 8), the
    // action expert's (gate+up: 32 features a block on an H100) and the prefix's.
    let shapes = [
        (3usize, 32usize, 16usize, false, false),
        (5, 64, 40, true, false),
        (1, 64, 16, true, false),
        (64, 128, 48, false, false),
        (1, 128, 64, true, false),
        (7, 384, 192, false, false),
        (64, 1024, 128, true, false),
        (50, 1024, 2560, false, true),
        (50, 4096, 1024, false, true),
        (50, 1024, 8192, true, true),
        (576, 2048, 2048, true, true),
    ];
    // On CUDA each shape through the library's own kernels where they take the shape (untuned:
    // chosen without timing; the wgmma form first where the device has it) and through
    // cuBLASLt.
    let kernels = if b.is_cuda() {
        let with = |rows: bool, wgmma: bool| {
            let o = KernelOptions {
                fp8_rows_kernel: rows,
                fp8_wgmma: wgmma,
                gemm_tuning: !rows,
                ..*b.k.options()
            };
            Kernels::with_options(b.k.ctx(), o).unwrap()
        };
        vec![with(true, true), with(true, false), with(false, false)]
    } else {
        vec![b.k.clone()]
    };
    let hopper = b.k.target() == "sm_90";
    let mut wgmma_runs = 0;
    for (m, k, n, with_bias, big) in shapes {
        if !size_ok(b, big) {
            continue;
        }
        for dt in [DType::BF16, DType::F32] {
            let c = Fp8Case::new(&mut rng, m, k, n, with_bias);
            if with_bias && dt == DType::F32 {
                // A bias only beside a 16-bit output (as cuBLASLt's FP8 GEMMs take one).
                let t = upload(b, &c, (m, k, n), dt);
                let e =
                    b.k.linear_e4m3(&t.x, &t.w, &t.out, true)
                        .err()
                        .expect("refused");
                assert!(e.to_string().contains("bf16 or f16 output"), "{e}");
                continue;
            }
            let mut seen = Vec::new();
            for kern in &kernels {
                let t = upload(b, &c, (m, k, n), dt);
                // Some shapes add to what `out` holds (a residual stream).
                let accumulate = n % 16 == 8 || m == 576 || m == 1 || k == 4096;
                let mut plan = kern.linear_e4m3(&t.x, &t.w, &t.out, with_bias).unwrap();
                if seen.contains(&plan.implementation()) {
                    continue;
                }
                seen.push(plan.implementation());
                let before = rng.vec(m * n, 1.0);
                if accumulate {
                    plan = plan.accumulating().unwrap();
                    t.out.write_f32(b.s, &before).unwrap();
                }
                let xs = x_scale(b, &plan, c.x_scale);
                // Twice: the second run finds the scratch as the first left it.
                for _ in 0..2 {
                    if accumulate {
                        t.out.write_f32(b.s, &before).unwrap();
                    }
                    plan.run(b.s, &t.x, &xs, &t.w, &t.ws, &t.out, t.bias.as_ref())
                        .unwrap();
                }
                if b.is_cuda() {
                    eprintln!("linear_e4m3 {m}x{k}x{n} {dt:?}: {}", plan.implementation());
                }
                wgmma_runs += usize::from(plan.implementation() == "wgmma kernel");
                let got = t.out.read_f32(b.s).unwrap();
                let mut want = c.reference(m, k, n, dt);
                if accumulate {
                    for (w, o) in want.iter_mut().zip(&before) {
                        *w += stored(dt, *o) as f64;
                    }
                }
                // f32 outputs: Hopper's FP8 tensor cores add products with fewer bits than f32
                // between promotions to f32 (seen: 8.8e-5 relative at K = 32 in cuBLASLt's).
                if let Err(e) = check_elements(&got, &want, tol(dt, 5e-5 * (k as f64).sqrt())) {
                    panic!(
                        "[{}] linear_e4m3 {m}x{k}x{n} {dt:?} bias {with_bias} accumulate {accumulate} ({}): {e}",
                        b.name,
                        plan.implementation()
                    );
                }
            }
        }
    }
    // On Hopper the wgmma form ran the shapes it takes (each in bf16 and f32, bias aside).
    if hopper {
        assert!(
            wgmma_runs >= 4,
            "[{}] wgmma kernel ran {wgmma_runs} shapes",
            b.name
        );
    }
}

/// New scales written into the scale tensors change what a captured graph computes, with no
/// new capture; the graph then matches a fresh run with those scales.
fn new_scales_reach_a_captured_graph(b: &Backend) {
    let mut rng = Rng::new(83);
    let (m, k, n) = if b.is_cuda() {
        (50, 1024, 2560)
    } else {
        (4, 32, 24)
    };
    let dt = DType::BF16;
    let c = Fp8Case::new(&mut rng, m, k, n, false);
    let t = upload(b, &c, (m, k, n), dt);
    let xf = Tensor::alloc(b.k.ctx(), "x_float", dt, &[m, k]).unwrap();
    xf.write_f32(b.s, &rng.vec(m * k, 3.0)).unwrap();
    let plan = b.k.linear_e4m3(&t.x, &t.w, &t.out, false).unwrap();
    let xs = x_scale(b, &plan, c.x_scale);
    let record = |k: &Kernels, s| -> frt_kernels::Result<()> {
        k.quantize_e4m3(s, &xf, &xs.narrow(0, 0, 1)?, &t.x)?;
        plan.run(s, &t.x, &xs, &t.w, &t.ws, &t.out, None)
    };
    let g = Graph::new(b.k.ctx(), "fp8", 1);
    g.capture(ShapeKey(0), |cs| record(&b.k, cs).map_err(exec_err))
        .unwrap();
    let captures = g.capture_count();
    let run_graph = || {
        g.replay(ShapeKey(0), b.s).unwrap();
        (t.x.read_bytes(b.s).unwrap(), t.out.read_f32(b.s).unwrap())
    };
    let first = run_graph();
    // A new calibration: another activation scale, every weight scale doubled.
    xs.write_f32(b.s, &vec![c.x_scale * 1.5; xs.numel()])
        .unwrap();
    let doubled: Vec<f32> = c.w_scale.iter().map(|s| s * 2.0).collect();
    t.ws.write_f32(b.s, &doubled).unwrap();
    let second = run_graph();
    assert_eq!(g.capture_count(), captures, "no new capture");
    assert_ne!(
        first.0, second.0,
        "[{}] the codes follow the new activation scale",
        b.name
    );
    // The same tensors and scales run eagerly give the same bits.
    record(&b.k, b.s).unwrap();
    let eager = (t.x.read_bytes(b.s).unwrap(), t.out.read_f32(b.s).unwrap());
    assert_eq!(second.0, eager.0, "[{}] codes", b.name);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&second.1), bits(&eager.1), "[{}] outputs", b.name);
    // And the reference with the new scales.
    let new_case = Fp8Case {
        x: second.0.clone(),
        x_scale: c.x_scale * 1.5,
        w: c.w.clone(),
        w_scale: doubled,
        bias: None,
    };
    check_elements(&second.1, &new_case.reference(m, k, n, dt), tol(dt, 1e-4))
        .unwrap_or_else(|e| panic!("[{}] after the new scales: {e}", b.name));
}

fn rejects_bad_arguments(b: &Backend) {
    let ctx = b.k.ctx();
    let t = |dt, shape: &[usize]| Tensor::alloc(ctx, "t", dt, shape).unwrap();
    let (x, w, out) = (
        t(DType::E4M3, &[4, 32]),
        t(DType::E4M3, &[8, 32]),
        t(DType::BF16, &[4, 8]),
    );
    let msg = |r: frt_kernels::Result<frt_kernels::Fp8Linear>| match r {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    // bf16 operands where codes are due; shapes that do not chain.
    let e = msg(b.k.linear_e4m3(&t(DType::BF16, &[4, 32]), &w, &out, false));
    assert!(e.contains("x"), "{e}");
    let e = msg(b.k.linear_e4m3(&x, &t(DType::E4M3, &[8, 16]), &out, false));
    assert!(e.contains("does not give"), "{e}");
    if b.is_cuda() {
        // cuBLASLt's FP8 GEMM needs K a multiple of 16.
        let e = msg(b.k.linear_e4m3(
            &t(DType::E4M3, &[4, 24]),
            &t(DType::E4M3, &[8, 24]),
            &out,
            false,
        ));
        assert!(e.contains("multiples of 16") || e.contains("sm_89"), "{e}");
    }
    let plan = b.k.linear_e4m3(&x, &w, &out, false).unwrap();
    let (xs, ws) = (x_scale(b, &plan, 1.0), t(DType::F32, &[8]));
    // A weight scale per feature, one activation scale.
    let e = plan
        .run(b.s, &x, &xs, &w, &t(DType::F32, &[4]), &out, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("w_scale") && e.contains("8 elements"), "{e}");
    let e = plan
        .run(b.s, &x, &filled(b, 1.0, 7), &w, &ws, &out, None)
        .unwrap_err()
        .to_string();
    let want = format!("{} elements", plan.x_scale_elements());
    assert!(e.contains("x_scale") && e.contains(&want), "{e}");
    let e = plan
        .run(b.s, &x, &xs, &w, &ws, &out, Some(&t(DType::BF16, &[8])))
        .unwrap_err()
        .to_string();
    assert!(e.contains("bias"), "{e}");
    // Quantize: a float input, codes out, one scale.
    let xf = t(DType::F32, &[4, 32]);
    let e =
        b.k.quantize_e4m3(b.s, &xf, &ws, &x)
            .unwrap_err()
            .to_string();
    assert!(e.contains("one"), "{e}");
    let e =
        b.k.quantize_e4m3(b.s, &xf, &scalar(b, 1.0), &t(DType::U8, &[4, 32]))
            .unwrap_err()
            .to_string();
    assert!(e.contains("codes"), "{e}");
}

/// `fused` (an output and its codes from one launch) holds the bits of `apart` (the op alone,
/// then `quantize_e4m3` of its output), and codes were written.
fn assert_same_codes(
    b: &Backend,
    what: &str,
    fused: (&Tensor, &Tensor),
    apart: (&Tensor, &Tensor),
) {
    let bits = |t: &Tensor| -> Vec<u32> {
        t.read_f32(b.s)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    assert_eq!(bits(fused.0), bits(apart.0), "{what}: outputs");
    let (c1, c2) = (
        fused.1.read_bytes(b.s).unwrap(),
        apart.1.read_bytes(b.s).unwrap(),
    );
    let differ = c1.iter().zip(&c2).filter(|(a, b)| a != b).count();
    assert_eq!(differ, 0, "{what}: {differ} codes differ");
    assert!(c1.iter().any(|&v| v != 0), "{what}: codes written");
}

/// A norm run for its codes alone wrote `want`'s codes and left `out` (poisoned) as it was.
fn assert_codes_only(b: &Backend, what: &str, out: &Tensor, codes: &Tensor, want: &Tensor) {
    let untouched = out.read_f32(b.s).unwrap().iter().all(|v| v.is_nan());
    assert!(untouched, "{what}, codes only: the output written");
    let (c1, c2) = (
        codes.read_bytes(b.s).unwrap(),
        want.read_bytes(b.s).unwrap(),
    );
    let differ = c1.iter().zip(&c2).filter(|(a, b)| a != b).count();
    assert_eq!(differ, 0, "{what}, codes only: {differ} codes differ");
}

/// The norms (Gemma's, adaptive, residual + adaptive, LayerNorm), the GEGLU and the GELU that
/// also write E4M3 codes of their output give the codes `quantize_e4m3` gives of that output,
/// and the same output as without them.
fn norms_quantize_their_output_as_quantize_does(b: &Backend) {
    let mut rng = Rng::new(84);
    for (rows, cols, big) in [(3usize, 64usize, false), (5, 40, false), (50, 1024, true)] {
        if !size_ok(b, big) {
            continue;
        }
        for dt in FLOATS {
            let t = |name: &str, dt: DType, shape: &[usize]| {
                Tensor::alloc(b.k.ctx(), name, dt, shape).unwrap()
            };
            let xv = rng.vec(rows * cols, 2.0);
            let (x, y) = (t("x", dt, &[rows, cols]), t("y", dt, &[rows, cols]));
            let m = t("mod", dt, &[1, 3 * cols]);
            let yv = rng.vec(rows * cols, 1.0);
            y.write_f32(b.s, &yv).unwrap();
            m.write_f32(b.s, &rng.vec(3 * cols, 0.5)).unwrap();
            let gate = m.narrow(1, 2 * cols, cols).unwrap();
            let (out, out2) = (t("out", dt, &[rows, cols]), t("out2", dt, &[rows, cols]));
            let (codes, codes2) = (
                t("codes", DType::E4M3, &[rows, cols]),
                t("codes2", DType::E4M3, &[rows, cols]),
            );
            let scale = scalar(b, 0.011);
            let w = t("w", dt, &[cols]);
            w.write_f32(b.s, &rng.vec(cols, 0.3)).unwrap();
            for (residual, plain) in [(false, false), (true, false), (false, true)] {
                let what = format!(
                    "[{}] {rows}x{cols} {dt:?} residual {residual} plain {plain}",
                    b.name
                );
                // Fused: norm (after the residual) and codes in one launch.
                x.write_f32(b.s, &xv).unwrap();
                if plain {
                    b.k.rms_norm_e4m3(b.s, &x, &w, Some(&out), 1e-6, (&codes, &scale))
                        .unwrap();
                } else if residual {
                    b.k.residual_ada_rms_norm_e4m3(
                        b.s,
                        &x,
                        &y,
                        &gate,
                        &m,
                        &out,
                        1e-6,
                        (&codes, &scale),
                    )
                    .unwrap();
                } else {
                    b.k.ada_rms_norm_e4m3(b.s, None, &x, &m, &out, 1e-6, (&codes, &scale))
                        .unwrap();
                }
                // Unfused: the norm alone, then quantize.
                x.write_f32(b.s, &xv).unwrap();
                if plain {
                    b.k.rms_norm(b.s, &x, &w, &out2, 1e-6).unwrap();
                } else if residual {
                    b.k.residual_ada_rms_norm(b.s, &x, &y, &gate, &m, &out2, 1e-6)
                        .unwrap();
                } else {
                    b.k.ada_rms_norm(b.s, &x, &m, &out2, 1e-6).unwrap();
                }
                b.k.quantize_e4m3(b.s, &out2, &scale, &codes2).unwrap();
                assert_same_codes(b, &what, (&out, &codes), (&out2, &codes2));
                if plain {
                    // Codes only: the same codes, nothing else written but them.
                    x.write_f32(b.s, &xv).unwrap();
                    out.write_f32(b.s, &vec![f32::NAN; rows * cols]).unwrap();
                    codes.write_bytes(b.s, &vec![0x7f; rows * cols]).unwrap();
                    b.k.rms_norm_e4m3(b.s, &x, &w, None, 1e-6, (&codes, &scale))
                        .unwrap();
                    assert_codes_only(b, &what, &out, &codes, &codes2);
                }
            }
            // GEGLU over the halves of one gate+up tensor (as an MLP has them), at the full
            // width (8 at a time on CUDA) and at a width that is not a multiple of 8.
            let gu = t("gu", dt, &[rows, 2 * cols]);
            gu.write_f32(b.s, &rng.vec(rows * 2 * cols, 1.5)).unwrap();
            for width in [cols, cols - 3] {
                let what = format!("[{}] geglu {rows}x{width} {dt:?}", b.name);
                let (g, u) = (
                    gu.narrow(1, 0, width).unwrap(),
                    gu.narrow(1, cols, width).unwrap(),
                );
                let o = |n: &str| t(n, dt, &[rows, width]);
                let c = |n: &str| t(n, DType::E4M3, &[rows, width]);
                let (o1, o2, c1, c2) = (o("o1"), o("o2"), c("c1"), c("c2"));
                b.k.geglu_e4m3(b.s, &g, &u, &o1, (&c1, &scale)).unwrap();
                b.k.geglu(b.s, &g, &u, &o2).unwrap();
                b.k.quantize_e4m3(b.s, &o2, &scale, &c2).unwrap();
                assert_same_codes(b, &what, (&o1, &c1), (&o2, &c2));
            }
            // LayerNorm (SigLIP's), and GELU over a contiguous run of values: at a length of
            // 8s (8 at a time on CUDA) and at one that is not.
            let lb = t("b", dt, &[cols]);
            lb.write_f32(b.s, &rng.vec(cols, 0.2)).unwrap();
            x.write_f32(b.s, &xv).unwrap();
            let what = format!("[{}] layer_norm {rows}x{cols} {dt:?}", b.name);
            b.k.layer_norm_e4m3(b.s, &x, &w, &lb, Some(&out), 1e-6, (&codes, &scale))
                .unwrap();
            b.k.layer_norm(b.s, &x, &w, &lb, &out2, 1e-6).unwrap();
            b.k.quantize_e4m3(b.s, &out2, &scale, &codes2).unwrap();
            assert_same_codes(b, &what, (&out, &codes), (&out2, &codes2));
            out.write_f32(b.s, &vec![f32::NAN; rows * cols]).unwrap();
            codes.write_bytes(b.s, &vec![0x7f; rows * cols]).unwrap();
            b.k.layer_norm_e4m3(b.s, &x, &w, &lb, None, 1e-6, (&codes, &scale))
                .unwrap();
            assert_codes_only(b, &what, &out, &codes, &codes2);
            for n in [rows * cols, rows * cols - 3] {
                let what = format!("[{}] gelu_tanh {n} {dt:?}", b.name);
                let gx = t("gx", dt, &[n]);
                gx.write_f32(b.s, &rng.vec(n, 3.0)).unwrap();
                let (o1, o2) = (t("o1", dt, &[n]), t("o2", dt, &[n]));
                let (c1, c2) = (t("c1", DType::E4M3, &[n]), t("c2", DType::E4M3, &[n]));
                b.k.gelu_tanh_e4m3(b.s, &gx, &o1, (&c1, &scale)).unwrap();
                b.k.gelu_tanh(b.s, &gx, &o2).unwrap();
                b.k.quantize_e4m3(b.s, &o2, &scale, &c2).unwrap();
                assert_same_codes(b, &what, (&o1, &c1), (&o2, &c2));
            }
        }
    }
}

/// The FP8 gate+up projection with its GEGLU in one op (`linear_geglu_e4m3`) gives, bit for
/// bit, the codes of `linear_e4m3` into a gate+up tensor of the model's type followed by
/// `geglu_e4m3`: on the host always, on CUDA where the op has a kernel (Hopper's `wgmma`; the
/// unfused GEMM then forced onto the same `wgmma` main loop). Shapes: one row, odd rows over
/// several stages of K, the action expert's MLP (50×1024, 4096 features); bad layouts refused,
/// K past one kernel's range planned as `None` on CUDA.
fn linear_geglu_gives_the_codes_of_linear_then_geglu(b: &Backend) {
    let mut rng = Rng::new(85);
    let hopper = b.k.target() == "sm_90";
    // The unfused GEMM on the wgmma kernel where there is one (untuned: chosen without timing).
    let unfused = Kernels::with_options(
        b.k.ctx(),
        KernelOptions {
            fp8_rows_kernel: true,
            fp8_wgmma: true,
            gemm_tuning: false,
            ..*b.k.options()
        },
    )
    .unwrap();
    let t =
        |name: &str, dt: DType, shape: &[usize]| Tensor::alloc(b.k.ctx(), name, dt, shape).unwrap();
    for (m, k, f, big) in [
        (1usize, 128usize, 32usize, false),
        (7, 384, 64, false),
        (64, 256, 96, false),
        (50, 1024, 4096, true),
    ] {
        if !size_ok(b, big) {
            continue;
        }
        for dt in FLOATS {
            let what = format!("[{}] linear_geglu_e4m3 {m}x{k}x{f} {dt:?}", b.name);
            let c = Fp8Case::new(&mut rng, m, k, 2 * f, false);
            let ft = upload(b, &c, (m, k, 2 * f), dt);
            let xs = scalar(b, c.x_scale);
            let (c1, c2) = (t("c1", DType::E4M3, &[m, f]), t("c2", DType::E4M3, &[m, f]));
            let Some(fused) = b.k.linear_geglu_e4m3(&ft.x, &ft.w, &c1, dt).unwrap() else {
                assert!(b.is_cuda() && !hopper, "{what}: no plan");
                continue;
            };
            assert_eq!(fused.dims(), (m, k, f), "{what}");
            // Unfused: the gate+up rows in dt (ft.out, [m, 2F]), then the GEGLU writing codes.
            let lin = unfused.linear_e4m3(&ft.x, &ft.w, &ft.out, false).unwrap();
            if b.is_cuda() {
                assert_eq!(lin.implementation(), "wgmma kernel", "{what}");
            }
            lin.run(b.s, &ft.x, &xs, &ft.w, &ft.ws, &ft.out, None)
                .unwrap();
            let (g, u) = (
                ft.out.narrow(1, 0, f).unwrap(),
                ft.out.narrow(1, f, f).unwrap(),
            );
            let h = t("h", dt, &[m, f]);
            b.k.geglu(b.s, &g, &u, &h).unwrap();
            // A code scale that puts the largest output near E4M3's top.
            let top = h
                .read_f32(b.s)
                .unwrap()
                .iter()
                .fold(0f32, |a, v| a.max(v.abs()));
            let scale = scalar(b, top / 400.0);
            b.k.geglu_e4m3(b.s, &g, &u, &h, (&c2, &scale)).unwrap();
            c1.write_bytes(b.s, &vec![0x7f; m * f]).unwrap();
            fused
                .run(b.s, &ft.x, &xs, &ft.w, &ft.ws, &c1, &scale)
                .unwrap();
            let (got, want) = (c1.read_bytes(b.s).unwrap(), c2.read_bytes(b.s).unwrap());
            let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            assert_eq!(differ, 0, "{what}: {differ} of {} codes differ", got.len());
            let distinct: std::collections::BTreeSet<u8> = want.iter().copied().collect();
            assert!(
                distinct.len() > 16,
                "{what}: {} distinct codes",
                distinct.len()
            );
        }
    }
    // Refused: codes of the wrong size, a weight that is not gate and up rows, an integer
    // rounding type, a run with too few weight scales.
    let (m, k, f) = (4, 128, 32);
    let c = Fp8Case::new(&mut rng, m, k, 2 * f, false);
    let ft = upload(b, &c, (m, k, 2 * f), DType::BF16);
    let codes = t("codes", DType::E4M3, &[m, f]);
    for (w, codes, dt, needle) in [
        (
            &ft.w,
            &t("c", DType::E4M3, &[m, f + 8]),
            DType::BF16,
            "gate and up",
        ),
        (
            &ft.w.narrow(0, 0, f).unwrap(),
            &codes,
            DType::BF16,
            "gate and up",
        ),
        (&ft.w, &codes, DType::E4M3, "float type"),
    ] {
        let e =
            b.k.linear_geglu_e4m3(&ft.x, w, codes, dt)
                .err()
                .expect("refused")
                .to_string();
        assert!(e.contains(needle), "[{}] {e}", b.name);
    }
    if let Some(p) =
        b.k.linear_geglu_e4m3(&ft.x, &ft.w, &codes, DType::BF16)
            .unwrap()
    {
        let e = p
            .run(
                b.s,
                &ft.x,
                &scalar(b, 1.0),
                &ft.w,
                &filled(b, 1.0, f),
                &codes,
                &scalar(b, 1.0),
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("w_scale"), "[{}] {e}", b.name);
    }
    // K past one block's range: no kernel on CUDA; the host plans it.
    let c = Fp8Case::new(&mut rng, m, 1152, 2 * f, false);
    let ft = upload(b, &c, (m, 1152, 2 * f), DType::BF16);
    let p =
        b.k.linear_geglu_e4m3(&ft.x, &ft.w, &codes, DType::BF16)
            .unwrap();
    assert_eq!(p.is_some(), !b.is_cuda(), "[{}] K = 1152", b.name);
}

/// The split FP8 linear layer against the f64 sum of each part's range, scaled: the action
/// expert's attention output and down projections (4 and 8 parts), and small shapes whose
/// blocks take 64, 32 and 16 features on a device of 132 multiprocessors (an H100), one part,
/// rows of one to eight tiles of 8. Bad layouts and counts are refused.
fn linear_split_matches_the_reference(b: &Backend) {
    let mut rng = Rng::new(84);
    for (m, k, n, parts, big) in [
        (50usize, 2048usize, 1024usize, 4usize, true),
        (50, 4096, 1024, 8, true),
        (8, 256, 4096, 2, false),
        (3, 256, 1056, 4, false),
        (13, 512, 48, 4, false),
        (64, 128, 2112, 1, false),
        (1, 192, 16, 3, false),
    ] {
        if !size_ok(b, big) {
            continue;
        }
        let c = Fp8Case::new(&mut rng, m, k, n, false);
        let t = upload(b, &c, (m, k, n), DType::F32);
        let partials = Tensor::alloc(b.k.ctx(), "partials", DType::F32, &[parts, m, n]).unwrap();
        partials
            .write_f32(b.s, &vec![f32::NAN; parts * m * n])
            .unwrap();
        let kc = k / parts;
        // On CUDA both kernels: the wgmma form (Hopper, ranges of at most 1024 codes, a multiple
        // of 128, N a multiple of 64) and the mma.sync one.
        let without_wgmma = Kernels::with_options(
            b.k.ctx(),
            KernelOptions {
                fp8_wgmma: false,
                ..*b.k.options()
            },
        )
        .unwrap();
        let wgmma = b.k.target() == "sm_90" && kc % 128 == 0 && kc <= 1024 && n % 64 == 0;
        for (kern, want_impl) in [
            (
                &b.k,
                if wgmma {
                    "wgmma kernel"
                } else {
                    "parts kernel"
                },
            ),
            (&without_wgmma, "parts kernel"),
        ] {
            let want_impl = if b.is_cuda() { want_impl } else { "host" };
            partials
                .write_f32(b.s, &vec![f32::NAN; parts * m * n])
                .unwrap();
            let plan = kern.linear_e4m3_split(&t.x, &t.w, &partials).unwrap();
            assert_eq!(plan.parts(), parts);
            assert_eq!(
                plan.implementation(),
                want_impl,
                "[{}] {m}x{k}x{n} in {parts} parts",
                b.name
            );
            // The activation's scale in the first of two elements (the second is never read).
            let xs = Tensor::alloc(b.k.ctx(), "x_scale", DType::F32, &[2]).unwrap();
            xs.write_f32(b.s, &[c.x_scale, f32::NAN]).unwrap();
            plan.run(b.s, &t.x, &xs, &t.w, &t.ws, &partials).unwrap();
            let got = partials.read_f32(b.s).unwrap();
            let decode =
                |v: &[u8]| -> Vec<f64> { v.iter().map(|&c| e4m3_to_f32(c) as f64).collect() };
            let (x, w) = (decode(&c.x), decode(&c.w));
            let want: Vec<f64> = (0..parts * m * n)
                .map(|e| {
                    let (p, i, j) = (e / (m * n), e / n % m, e % n);
                    let r = p * kc..(p + 1) * kc;
                    let acc: f64 = x[i * k..(i + 1) * k][r.clone()]
                        .iter()
                        .zip(&w[j * k..(j + 1) * k][r])
                        .map(|(a, b)| a * b)
                        .sum();
                    acc * c.x_scale as f64 * c.w_scale[j] as f64
                })
                .collect();
            if let Err(e) = check_elements(&got, &want, tol(DType::F32, 5e-5 * (kc as f64).sqrt()))
            {
                panic!(
                    "[{}] linear_e4m3_split {m}x{k}x{n} in {parts} parts ({want_impl}): {e}",
                    b.name
                );
            }
        }
    }
    // Refused: K not a multiple of 64 · parts, more than 64 rows, partials of another shape or
    // type, codes that are not E4M3.
    let k = &b.k;
    let t = |dt, shape: &[usize]| Tensor::alloc(k.ctx(), "t", dt, shape).unwrap();
    let (e8, f) = (DType::E4M3, DType::F32);
    for (x, w, p, why) in [
        (
            t(e8, &[4, 192]),
            t(e8, &[16, 192]),
            t(f, &[2, 4, 16]),
            "multiple of 64",
        ),
        (
            t(e8, &[65, 128]),
            t(e8, &[16, 128]),
            t(f, &[2, 65, 16]),
            "rows",
        ),
        (
            t(e8, &[4, 128]),
            t(e8, &[16, 128]),
            t(f, &[2, 4, 32]),
            "does not give",
        ),
        (
            t(e8, &[4, 128]),
            t(e8, &[16, 128]),
            t(DType::BF16, &[2, 4, 16]),
            "partials",
        ),
        (
            t(DType::BF16, &[4, 128]),
            t(e8, &[16, 128]),
            t(f, &[2, 4, 16]),
            "x",
        ),
    ] {
        let e = k
            .linear_e4m3_split(&x, &w, &p)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains(why), "[{}] {e}", b.name);
    }
}

/// An attention plan that quantizes its output (`AttentionPlan::run_quantized`) writes the same
/// output as one that does not and the codes `quantize_e4m3` makes of it, bit for bit: the
/// action expert's attention (on CUDA the tensor-core kernel with its keys split, whose merge
/// writes the codes), a smaller one, and one the plan runs without key splits (a quantize
/// launch after it).
fn attention_writes_the_codes_quantize_makes(b: &Backend) {
    let mut rng = Rng::new(85);
    let ctx = b.k.ctx();
    let dt = DType::BF16;
    for (sq, sk, hq, hkv, d, big) in [
        (50usize, 626usize, 8usize, 1usize, 256usize, true),
        (50, 200, 8, 1, 64, false),
        (3, 20, 2, 1, 32, false),
    ] {
        if !size_ok(b, big) {
            continue;
        }
        let t = |name, dt, shape: &[usize]| Tensor::alloc(ctx, name, dt, shape).unwrap();
        let q = t("q", dt, &[sq, hq, d]);
        let kt = t("k", dt, &[sk, hkv, d]);
        let v = t("v", dt, &[sk, hkv, d]);
        for x in [&q, &kt, &v] {
            x.write_f32(b.s, &rng.vec(x.numel(), 1.0)).unwrap();
        }
        // The prefix's valid keys, then the suffix's (as the expert attends).
        let len = t("len", DType::I32, &[1]);
        len.write_i32(b.s, &[((sk - sq) * 3 / 4) as i32]).unwrap();
        let mask = AttentionMask::prefix_suffix(&len, sk - sq);
        let scale = t("scale", DType::F32, &[1]);
        scale.write_f32(b.s, &[0.02]).unwrap();
        let (o1, o2) = (t("o1", dt, &[sq, hq, d]), t("o2", dt, &[sq, hq, d]));
        let (c1, c2) = (
            t("c1", DType::E4M3, &[sq, hq * d]),
            t("c2", DType::E4M3, &[sq, hq * d]),
        );
        let sm = 1.0 / (d as f32).sqrt();
        let p1 = b.k.attention_plan(&q, &kt, &v, &o1, &mask, sm).unwrap();
        if b.is_cuda() && big {
            assert!(
                p1.flash_splits().unwrap_or(1) > 1,
                "the expert's keys split"
            );
        }
        p1.run_quantized(&b.k, b.s, &c1, &scale).unwrap();
        let p2 = b.k.attention_plan(&q, &kt, &v, &o2, &mask, sm).unwrap();
        p2.run(&b.k, b.s).unwrap();
        b.k.quantize_e4m3(b.s, &o2, &scale, &c2).unwrap();
        let what = format!("[{}] attention {sq}x{sk}, {hq}/{hkv} heads of {d}", b.name);
        let bits = |x: &Tensor| -> Vec<u32> {
            x.read_f32(b.s)
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        assert_eq!(bits(&o1), bits(&o2), "{what}: outputs");
        let (c1, c2) = (c1.read_bytes(b.s).unwrap(), c2.read_bytes(b.s).unwrap());
        let differ = c1.iter().zip(&c2).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{what}: {differ} codes differ");
        assert!(
            c1.iter().filter(|&&c| c & 0x7f != 0).count() > c1.len() / 2,
            "{what}: codes"
        );
        // Codes of another size, or a scale of two elements, are refused.
        let e = p1
            .run_quantized(&b.k, b.s, &t("c", DType::E4M3, &[sq, hq * d - 8]), &scale)
            .unwrap_err()
            .to_string();
        assert!(e.contains("codes"), "{e}");
        let e = p1
            .run_quantized(
                &b.k,
                b.s,
                &t("c", DType::E4M3, &[sq, hq * d]),
                &t("s2", DType::F32, &[2]),
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("scale"), "{e}");
    }
}

/// A deferred FP8 GEMM (`linear_e4m3_deferred`) writes the product scaled by the activation's
/// scale only (its `w_scale` is not read: NaNs there change nothing), adding to `out` when
/// accumulating; `geglu_scaled_e4m3` applies the gate's and the up's per-feature scales to
/// those rows and writes what `geglu_e4m3` writes of the scaled rows: the GEGLU against an f64
/// reference from the stored gate and up values, and the codes `quantize_e4m3` makes of it.
/// Together they give the per-feature-scaled GEMM's GEGLU within tolerance.
fn deferred_linear_and_scaled_geglu_match_the_reference(b: &Backend) {
    let mut rng = Rng::new(88);
    let t =
        |name: &str, dt: DType, shape: &[usize]| Tensor::alloc(b.k.ctx(), name, dt, shape).unwrap();
    // (m, k, f, big): small and odd; the action expert's gate+up; the prefix's, narrowed.
    for (m, k, f, big) in [
        (3usize, 64usize, 24usize, false),
        (50, 1024, 4096, true),
        (576, 2048, 2048, true),
    ] {
        if !size_ok(b, big) {
            continue;
        }
        for dt in [DType::BF16, DType::F32] {
            let what = format!("[{}] deferred {m}x{k}x{f} {dt:?}", b.name);
            let n = 2 * f;
            let c = Fp8Case::new(&mut rng, m, k, n, false);
            let ft = upload(b, &c, (m, k, n), dt);
            let plan = b.k.linear_e4m3_deferred(&ft.x, &ft.w, &ft.out).unwrap();
            if b.is_cuda() {
                assert_eq!(
                    plan.scaling(),
                    Some(frt_kernels::Fp8Scaling::ActivationOnly),
                    "{what}"
                );
            }
            let xs = x_scale(b, &plan, c.x_scale);
            let nan_scales = t("nan", DType::F32, &[n]);
            nan_scales.write_f32(b.s, &vec![f32::NAN; n]).unwrap();
            plan.run(b.s, &ft.x, &xs, &ft.w, &nan_scales, &ft.out, None)
                .unwrap();
            let gu = ft.out.read_f32(b.s).unwrap();
            // The reference without the feature scales: the scaled one divided by them.
            let want: Vec<f64> = c
                .reference(m, k, n, dt)
                .iter()
                .enumerate()
                .map(|(i, v)| v / c.w_scale[i % n] as f64)
                .collect();
            if let Err(e) = check_elements(&gu, &want, tol(dt, 5e-5 * (k as f64).sqrt())) {
                panic!("{what}: linear_e4m3_deferred: {e}");
            }
            // Accumulating: the product added to what `out` held.
            let before = rng.vec(m * n, 1.0);
            let acc = t("acc", dt, &[m, n]);
            acc.write_f32(b.s, &before).unwrap();
            let plan_acc = b.k.linear_e4m3_deferred(&ft.x, &ft.w, &acc).unwrap();
            plan_acc
                .accumulating()
                .unwrap()
                .run(b.s, &ft.x, &xs, &ft.w, &nan_scales, &acc, None)
                .unwrap();
            let added: Vec<f64> = want
                .iter()
                .zip(&before)
                .map(|(w, o)| w + stored(dt, *o) as f64)
                .collect();
            if let Err(e) = check_elements(
                &acc.read_f32(b.s).unwrap(),
                &added,
                tol(dt, 5e-5 * (k as f64).sqrt()),
            ) {
                panic!("{what}: accumulating: {e}");
            }
            // The GEGLU of the two halves with their feature scales.
            let scales = |at: usize| {
                let v = t("s", DType::F32, &[f]);
                v.write_f32(b.s, &c.w_scale[at..at + f]).unwrap();
                v
            };
            let (sg, su) = (scales(0), scales(f));
            let h = t("h", dt, &[m, f]);
            h.write_f32(b.s, &vec![f32::NAN; m * f]).unwrap();
            let codes = t("codes", DType::E4M3, &[m, f]);
            let h_scale = scalar(b, 0.02);
            let (gate, up) = (
                ft.out.narrow(1, 0, f).unwrap(),
                ft.out.narrow(1, f, f).unwrap(),
            );
            b.k.geglu_scaled_e4m3(b.s, (&gate, &up), (&sg, &su), Some(&h), (&codes, &h_scale))
                .unwrap();
            // Without an output: the same codes, nothing else written.
            let codes_only = t("codes_only", DType::E4M3, &[m, f]);
            b.k.geglu_scaled_e4m3(b.s, (&gate, &up), (&sg, &su), None, (&codes_only, &h_scale))
                .unwrap();
            let want_codes = codes.read_bytes(b.s).unwrap();
            assert_eq!(
                codes_only.read_bytes(b.s).unwrap(),
                want_codes,
                "{what}: codes only"
            );
            let got = h.read_f32(b.s).unwrap();
            let want_h: Vec<f64> = (0..m * f)
                .map(|i| {
                    let (r, j) = (i / f, i % f);
                    let g = gu[r * n + j] as f64 * c.w_scale[j] as f64;
                    let u = gu[r * n + f + j] as f64 * c.w_scale[f + j] as f64;
                    gelu_tanh(g) * u
                })
                .collect();
            if let Err(e) = check_elements(&got, &want_h, tol(dt, 1e-5)) {
                panic!("{what}: geglu_scaled_e4m3: {e}");
            }
            let from_h: Vec<u8> = got.iter().map(|v| e4m3_from_f32(v / 0.02)).collect();
            assert_eq!(want_codes, from_h, "{what}: codes");
            // Against the GEGLU of the per-feature-scaled GEMM (two roundings apart in dt).
            let full: Vec<f64> = c.reference(m, k, n, dt);
            let want_full: Vec<f64> = (0..m * f)
                .map(|i| {
                    let (r, j) = (i / f, i % f);
                    gelu_tanh(full[r * n + j]) * full[r * n + f + j]
                })
                .collect();
            if let Err(e) = check_elements(&got, &want_full, tol(dt, 1e-4 * (k as f64).sqrt())) {
                panic!("{what}: against the scaled GEMM's GEGLU: {e}");
            }
        }
    }
    // Scales of another length are refused by name.
    let x = t("x", DType::BF16, &[2, 8]);
    let (s7, s8) = (t("s7", DType::F32, &[7]), t("s8", DType::F32, &[8]));
    let codes = t("c", DType::E4M3, &[2, 8]);
    let e =
        b.k.geglu_scaled_e4m3(
            b.s,
            (&x, &x),
            (&s8, &s7),
            Some(&x),
            (&codes, &scalar(b, 1.0)),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("b_scale") && e.contains("one scale per column"),
        "{e}"
    );
}

/// A deferred FP8 GEMM's case, its tensors (the product in `ft.out`), the weight's feature
/// scales as a tensor, and the product read back.
struct Deferred {
    c: Fp8Case,
    ft: Fp8Tensors,
    ws: Tensor,
    product: Vec<f32>,
}

/// Runs `linear_e4m3_deferred` on a new random case of `m × k → n` into `dt`.
fn deferred(b: &Backend, rng: &mut Rng, (m, k, n): (usize, usize, usize), dt: DType) -> Deferred {
    let c = Fp8Case::new(rng, m, k, n, false);
    let ft = upload(b, &c, (m, k, n), dt);
    let plan = b.k.linear_e4m3_deferred(&ft.x, &ft.w, &ft.out).unwrap();
    let xs = x_scale(b, &plan, c.x_scale);
    let ws = Tensor::alloc(b.k.ctx(), "ws", DType::F32, &[n]).unwrap();
    ws.write_f32(b.s, &c.w_scale).unwrap();
    plan.run(b.s, &ft.x, &xs, &ft.w, &ws, &ft.out, None)
        .unwrap();
    let product = ft.out.read_f32(b.s).unwrap();
    Deferred { c, ft, ws, product }
}

/// SigLIP's fc1 in FP8 with its feature scales deferred: `linear_e4m3_deferred`, then
/// `gelu_tanh_scaled_e4m3` applying the scales and the bias before the GELU, against the f64
/// GELU of the stored product scaled (within rounding of one value), its codes exactly
/// `quantize_e4m3`'s of the stored output, and against the GELU of the per-feature-scaled GEMM
/// with its bias (two roundings apart).
fn deferred_linear_and_scaled_gelu_match_the_reference(b: &Backend) {
    let mut rng = Rng::new(89);
    let t =
        |name: &str, dt: DType, shape: &[usize]| Tensor::alloc(b.k.ctx(), name, dt, shape).unwrap();
    // (m, k, n, big): small and odd; SigLIP's fc1 for two views.
    for (m, k, n, big) in [(3usize, 64usize, 24usize, false), (512, 1152, 4304, true)] {
        if !size_ok(b, big) {
            continue;
        }
        for dt in [DType::BF16, DType::F32] {
            let what = format!("[{}] deferred GELU {m}x{k}x{n} {dt:?}", b.name);
            let Deferred { c, ft, ws, product } = deferred(b, &mut rng, (m, k, n), dt);
            let bias_v: Vec<f32> = rng.vec(n, 1.0).iter().map(|&v| stored(dt, v)).collect();
            let bias = t("bias", dt, &[n]);
            bias.write_f32(b.s, &bias_v).unwrap();
            let h = t("h", dt, &[m, n]);
            h.write_f32(b.s, &vec![f32::NAN; m * n]).unwrap();
            let codes = t("codes", DType::E4M3, &[m, n]);
            let h_scale = scalar(b, 0.01);
            // Codes only first (in place, as SigLIP runs it), then with the output: the same
            // codes, and nothing else written in place.
            let x = t("x", dt, &[m, n]);
            x.write_f32(b.s, &product).unwrap();
            let codes_only = t("codes_only", DType::E4M3, &[m, n]);
            b.k.gelu_tanh_scaled_e4m3(b.s, &x, (&ws, &bias), None, (&codes_only, &h_scale))
                .unwrap();
            assert_eq!(
                bits_of(&x.read_f32(b.s).unwrap()),
                bits_of(&product),
                "{what}: in place"
            );
            b.k.gelu_tanh_scaled_e4m3(b.s, &ft.out, (&ws, &bias), Some(&h), (&codes, &h_scale))
                .unwrap();
            let codes_v = codes.read_bytes(b.s).unwrap();
            assert_eq!(
                codes_only.read_bytes(b.s).unwrap(),
                codes_v,
                "{what}: codes only"
            );
            let got = h.read_f32(b.s).unwrap();
            let want: Vec<f64> = (0..m * n)
                .map(|i| {
                    let j = i % n;
                    gelu_tanh(product[i] as f64 * c.w_scale[j] as f64 + bias_v[j] as f64)
                })
                .collect();
            if let Err(e) = check_elements(&got, &want, tol(dt, 1e-5)) {
                panic!("{what}: gelu_tanh_scaled_e4m3: {e}");
            }
            let want_codes: Vec<u8> = got.iter().map(|v| e4m3_from_f32(v / 0.01)).collect();
            assert_eq!(codes_v, want_codes, "{what}: codes");
            let full = c.reference(m, k, n, dt);
            let want_full: Vec<f64> = (0..m * n)
                .map(|i| gelu_tanh(full[i] + bias_v[i % n] as f64))
                .collect();
            if let Err(e) = check_elements(&got, &want_full, tol(dt, 1e-4 * (k as f64).sqrt())) {
                panic!("{what}: against the scaled GEMM's GELU: {e}");
            }
        }
    }
    // Scales or a bias of another length are refused.
    let x = t("x", DType::BF16, &[2, 8]);
    let (s7, s8) = (t("s7", DType::F32, &[7]), t("s8", DType::F32, &[8]));
    let (b7, b8) = (t("b7", DType::BF16, &[7]), t("b8", DType::BF16, &[8]));
    let codes = t("c", DType::E4M3, &[2, 8]);
    let one = scalar(b, 1.0);
    let e =
        b.k.gelu_tanh_scaled_e4m3(b.s, &x, (&s7, &b8), Some(&x), (&codes, &one));
    assert!(e.unwrap_err().to_string().contains("a_scale"));
    assert!(
        b.k.gelu_tanh_scaled_e4m3(b.s, &x, (&s8, &b7), Some(&x), (&codes, &one))
            .is_err()
    );
    assert!(
        b.k.gelu_tanh_scaled_e4m3(b.s, &x, (&s8, &b8), Some(&x), (&codes, &one))
            .is_ok()
    );
}

/// The norm a deferred residual test ends in: SigLIP's LayerNorm (the product's bias added
/// too) or Gemma's RMSNorm.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ResidualNorm {
    Layer,
    Rms,
}

/// A residual projection in FP8 with its feature scales (and bias) deferred:
/// `linear_e4m3_deferred`, then the norm adding `y·y_scale (+ y_bias)` to the residual in place
/// and normalizing the stored row: the residual against f64 (within rounding of one value)
/// and against the per-feature scaled GEMM's with its bias (two roundings apart), the norm
/// against the f64 norm of the stored residual, the codes exactly `quantize_e4m3`'s of the
/// stored output. Without codes, the same output. Then arguments that must be refused.
fn deferred_linear_and_residual_norm(b: &Backend, norm: ResidualNorm) {
    let layer = norm == ResidualNorm::Layer;
    let mut rng = Rng::new(if layer { 90 } else { 91 });
    let t =
        |name: &str, dt: DType, shape: &[usize]| Tensor::alloc(b.k.ctx(), name, dt, shape).unwrap();
    // (m, k, n, big): small and odd; SigLIP's fc2 for two views, or Gemma's attention output
    // over 576 prefix rows.
    let model = if layer {
        (512, 4304, 1152)
    } else {
        (576, 2048, 2048)
    };
    for (m, k, n, big) in [
        (3usize, 64usize, 24usize, false),
        (model.0, model.1, model.2, true),
    ] {
        if !size_ok(b, big) {
            continue;
        }
        for dt in [DType::BF16, DType::F32] {
            let what = format!("[{}] residual {norm:?} {m}x{k}x{n} {dt:?}", b.name);
            let Deferred { c, ft, ws, product } = deferred(b, &mut rng, (m, k, n), dt);
            let vec = |rng: &mut Rng, len: usize, spread: f32, at: f32| -> Vec<f32> {
                rng.vec(len, spread)
                    .iter()
                    .map(|&v| stored(dt, at + v))
                    .collect()
            };
            let before = vec(&mut rng, m * n, 4.0, 0.0);
            let bias_v = if layer {
                vec(&mut rng, n, 1.0, 0.0)
            } else {
                vec![0.0; n]
            };
            let (g_v, b_v) = if layer {
                (vec(&mut rng, n, 1.0, 1.0), vec(&mut rng, n, 0.5, 0.0))
            } else {
                (vec(&mut rng, n, 0.5, 0.0), vec![0.0; n])
            };
            let up = |name: &str, shape: &[usize], v: &[f32]| {
                let x = t(name, dt, shape);
                x.write_f32(b.s, v).unwrap();
                x
            };
            let (bias, g, beta) = (
                up("bias", &[n], &bias_v),
                up("g", &[n], &g_v),
                up("b", &[n], &b_v),
            );
            let full = c.reference(m, k, n, dt);
            let mut outs: Vec<(Vec<u32>, Vec<u32>)> = Vec::new();
            let mut first_codes: Vec<u8> = Vec::new();
            // With the output and codes, the output alone, the codes alone (an FP8 model's).
            for (with_out, with_codes) in [(true, true), (true, false), (false, true)] {
                let x = up("x", &[m, n], &before);
                let out = up("out", &[m, n], &vec![f32::NAN; m * n]);
                let codes = t("codes", DType::E4M3, &[m, n]);
                codes.write_bytes(b.s, &vec![0x7f; m * n]).unwrap();
                let cs = scalar(b, 0.05);
                let codes_arg = with_codes.then_some((&codes, &cs));
                let out_arg = with_out.then_some(&out);
                match norm {
                    ResidualNorm::Layer => b.k.residual_layer_norm_scaled(
                        b.s,
                        &x,
                        (&ft.out, &ws, &bias),
                        (&g, &beta),
                        out_arg,
                        1e-6,
                        codes_arg,
                    ),
                    ResidualNorm::Rms => {
                        let y = (&ft.out, &ws);
                        b.k.residual_rms_norm_scaled(b.s, &x, y, &g, out_arg, 1e-6, codes_arg)
                    }
                }
                .unwrap();
                let xn = x.read_f32(b.s).unwrap();
                if !with_out {
                    let untouched = out.read_f32(b.s).unwrap().iter().all(|v| v.is_nan());
                    assert!(untouched, "{what}: the output written without it");
                    let codes = codes.read_bytes(b.s).unwrap();
                    assert_eq!(codes, first_codes, "{what}: the codes without the output");
                    assert_eq!(
                        bits_of(&xn),
                        outs[0].0,
                        "{what}: the residual without the output"
                    );
                    continue;
                }
                let want_x: Vec<f64> = (0..m * n)
                    .map(|i| {
                        let j = i % n;
                        before[i] as f64
                            + product[i] as f64 * c.w_scale[j] as f64
                            + bias_v[j] as f64
                    })
                    .collect();
                if let Err(e) = check_elements(&xn, &want_x, tol(dt, 1e-6)) {
                    panic!("{what}: residual: {e}");
                }
                let want_full: Vec<f64> = (0..m * n)
                    .map(|i| before[i] as f64 + full[i] + bias_v[i % n] as f64)
                    .collect();
                if let Err(e) = check_elements(&xn, &want_full, tol(dt, 1e-4 * (k as f64).sqrt())) {
                    panic!("{what}: residual against the scaled GEMM's: {e}");
                }
                let got = out.read_f32(b.s).unwrap();
                let mut want = Vec::with_capacity(m * n);
                for row in xn.chunks(n) {
                    let row: Vec<f64> = row.iter().map(|&v| v as f64).collect();
                    let mean = if layer {
                        row.iter().sum::<f64>() / n as f64
                    } else {
                        0.0
                    };
                    let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
                    let inv = 1.0 / (var + 1e-6).sqrt();
                    want.extend(row.iter().enumerate().map(|(j, v)| {
                        let (g, beta) = (g_v[j] as f64, b_v[j] as f64);
                        if layer {
                            (v - mean) * inv * g + beta
                        } else {
                            v * inv * (1.0 + g)
                        }
                    }));
                }
                if let Err(e) = check_elements(&got, &want, tol(dt, 1e-5)) {
                    panic!("{what}: norm: {e}");
                }
                if with_codes {
                    let want_codes: Vec<u8> = got.iter().map(|v| e4m3_from_f32(v / 0.05)).collect();
                    first_codes = codes.read_bytes(b.s).unwrap();
                    assert_eq!(first_codes, want_codes, "{what}: codes");
                }
                outs.push((bits_of(&xn), bits_of(&got)));
            }
            assert_eq!(outs[0], outs[1], "{what}: with and without codes");
        }
    }
    // A residual of another shape or dtype, or scales of another length, are refused.
    let x = t("x", DType::BF16, &[2, 8]);
    let (s7, s8) = (t("s7", DType::F32, &[7]), t("s8", DType::F32, &[8]));
    let v8 = t("v8", DType::BF16, &[8]);
    let (y3, y32) = (t("y3", DType::BF16, &[3, 8]), t("y32", DType::F32, &[2, 8]));
    let x2 = x.clone();
    let run_to = |y: &Tensor, ys: &Tensor, out: Option<&Tensor>| match norm {
        ResidualNorm::Layer => {
            b.k.residual_layer_norm_scaled(b.s, &x, (y, ys, &v8), (&v8, &v8), out, 1e-6, None)
        }
        ResidualNorm::Rms => {
            b.k.residual_rms_norm_scaled(b.s, &x, (y, ys), &v8, out, 1e-6, None)
        }
    };
    let run = |y: &Tensor, ys: &Tensor| run_to(y, ys, Some(&x2));
    assert!(run(&y3, &s8).is_err());
    assert!(run(&y32, &s8).is_err());
    assert!(run(&x, &s7).unwrap_err().to_string().contains("y_scale"));
    assert!(run(&x, &s8).is_ok());
    // Neither an output nor codes.
    let e = run_to(&x, &s8, None).unwrap_err().to_string();
    assert!(e.contains("no output"), "{e}");
}

/// SigLIP's residual projections in FP8 (attention output, fc2): `residual_layer_norm_scaled`
/// applies the deferred feature scales and the bias.
fn deferred_linear_and_residual_layer_norm_match_the_reference(b: &Backend) {
    deferred_linear_and_residual_norm(b, ResidualNorm::Layer);
}

/// The language model's residual projections in FP8 (attention output, down):
/// `residual_rms_norm_scaled` applies the deferred feature scales.
fn deferred_linear_and_residual_rms_norm_match_the_reference(b: &Backend) {
    deferred_linear_and_residual_norm(b, ResidualNorm::Rms);
}

/// The language model's q/k/v in FP8 with its feature scales deferred: `linear_e4m3_deferred`,
/// then `rope_qkv_scaled` multiplying each value by its feature's scale (rounded to the
/// outputs' type) before rotating: exactly the bits of `rope_qkv` on those scaled values, and
/// against the f64 rotation of the per-feature scaled GEMM's output (two roundings apart).
fn deferred_linear_and_scaled_rope_match_the_reference(b: &Backend) {
    let mut rng = Rng::new(92);
    let t =
        |name: &str, dt: DType, shape: &[usize]| Tensor::alloc(b.k.ctx(), name, dt, shape).unwrap();
    let bits = |x: &Tensor| bits_of(&x.read_f32(b.s).unwrap());
    // (m, k, q heads, kv heads, head dim, big): small; Gemma's over 576 prefix rows.
    for (m, k, hq, hk, d, big) in [
        (3usize, 64usize, 2usize, 1usize, 8usize, false),
        (576, 2048, 8, 1, 256, true),
    ] {
        if !size_ok(b, big) {
            continue;
        }
        let n = (hq + 2 * hk) * d;
        let pos_v: Vec<i32> = (0..m).map(|i| (i * 7 % 23) as i32 + 3).collect();
        let pos = t("pos", DType::I32, &[m]);
        pos.write_i32(b.s, &pos_v).unwrap();
        for dt in [DType::BF16, DType::F32] {
            let what = format!("[{}] scaled RoPE {m}x{k}x{n} {dt:?}", b.name);
            let Deferred { c, ft, ws, product } = deferred(b, &mut rng, (m, k, n), dt);
            let outs = || {
                let o = |name, heads: usize| {
                    let x = t(name, dt, &[m, heads * d]);
                    x.write_f32(b.s, &vec![f32::NAN; m * heads * d]).unwrap();
                    x
                };
                [o("q", hq), o("k", hk), o("v", hk)]
            };
            let [q, kk, v] = outs();
            b.k.rope_qkv_scaled(b.s, &ft.out, &ws, &pos, &q, &kk, &v, d, 10_000.0)
                .unwrap();
            // The scaled values as a tensor of dt, then rope_qkv: the same bits.
            let scaled: Vec<f32> = (0..m * n)
                .map(|i| stored(dt, product[i] * c.w_scale[i % n]))
                .collect();
            let qkv = t("qkv", dt, &[m, n]);
            qkv.write_f32(b.s, &scaled).unwrap();
            let [q2, k2, v2] = outs();
            b.k.rope_qkv(b.s, &qkv, &pos, &q2, &k2, &v2, d, 10_000.0)
                .unwrap();
            for (name, got, want) in [("q", &q, &q2), ("k", &kk, &k2), ("v", &v, &v2)] {
                assert_eq!(bits(got), bits(want), "{what}: {name} against rope_qkv");
            }
            // Against the f64 rotation of the per-feature scaled GEMM.
            let full = c.reference(m, k, n, dt);
            let half = d / 2;
            let rotated = |first: usize, heads: usize, rotate: bool| -> Vec<f64> {
                let mut o = vec![0f64; m * heads * d];
                for (r, &p) in pos_v.iter().enumerate() {
                    for h in 0..heads {
                        let src = r * n + (first + h) * d;
                        let dst = r * heads * d + h * d;
                        for i in 0..half {
                            let (x1, x2) = (full[src + i], full[src + half + i]);
                            let ts = 10_000f64.powf(2.0 * i as f64 / d as f64);
                            let (sn, cs) = (p as f64 / ts).sin_cos();
                            let (y1, y2) = if rotate {
                                (x1 * cs - x2 * sn, x2 * cs + x1 * sn)
                            } else {
                                (x1, x2)
                            };
                            (o[dst + i], o[dst + half + i]) = (y1, y2);
                        }
                    }
                }
                o
            };
            let tl = tol(dt, 1e-4 * (k as f64).sqrt());
            for (name, got, want) in [
                ("q", &q, rotated(0, hq, true)),
                ("k", &kk, rotated(hq, hk, true)),
                ("v", &v, rotated(hq + hk, hk, false)),
            ] {
                if let Err(e) = check_elements(&got.read_f32(b.s).unwrap(), &want, tl) {
                    panic!("{what}: {name} against the scaled GEMM's: {e}");
                }
            }
        }
    }
    // Scales of another length, or of another dtype, are refused.
    let (qkv, q, kv) = (
        t("qkv", DType::BF16, &[2, 32]),
        t("q", DType::BF16, &[2, 16]),
        t("kv", DType::BF16, &[2, 8]),
    );
    let pos = t("pos", DType::I32, &[2]);
    let rope = |sc: &Tensor| {
        b.k.rope_qkv_scaled(b.s, &qkv, sc, &pos, &q, &kv, &kv.clone(), 8, 10_000.0)
    };
    let e = rope(&t("s31", DType::F32, &[31])).unwrap_err().to_string();
    assert!(
        e.contains("scales") && e.contains("one scale per column"),
        "{e}"
    );
    assert!(rope(&t("s16", DType::BF16, &[32])).is_err());
    assert!(rope(&t("s32", DType::F32, &[32])).is_ok());
}

fn bits_of(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

backend_tests!(
    deferred_linear_and_residual_rms_norm_match_the_reference,
    deferred_linear_and_scaled_rope_match_the_reference,
    deferred_linear_and_residual_layer_norm_match_the_reference,
    deferred_linear_and_scaled_gelu_match_the_reference,
    deferred_linear_and_scaled_geglu_match_the_reference,
    linear_geglu_gives_the_codes_of_linear_then_geglu,
    attention_writes_the_codes_quantize_makes,
    norms_quantize_their_output_as_quantize_does,
    quantize_gives_the_host_codes,
    quantize_gives_the_host_codes_at_the_edges,
    linear_matches_the_reference,
    linear_split_matches_the_reference,
    new_scales_reach_a_captured_graph,
    rejects_bad_arguments
);

/// With `pdl` on, the `wgmma` kernels are launched dependent: each may start while the kernel
/// before it (a norm, the FP8 GEGLU) still runs, copying its weights, and must wait for that
/// kernel before it reads its tokens. The chains of the action expert's MLP, bf16
/// (norm → gate+up+GEGLU) and FP8 (norm writing codes → gate+up+GEGLU writing codes → down in
/// 8 parts), give the bits they give launched plainly, every round, with each output and
/// intermediate poisoned (NaN) before the round.
#[test]
#[ignore = "needs a CUDA GPU"]
fn dependent_launches_wait_for_the_kernel_before() {
    let ctx = frt_exec::Ctx::cuda(0).expect("CUDA device 0 (this test needs a CUDA GPU)");
    let s = ctx.stream(0).unwrap();
    let (m, k, f, n) = (50, 1024, 4096, 1024);
    let mut rng = Rng::new(91);
    let y = rng.vec(m * k, 2.0);
    let nw = rng.vec(k, 0.5);
    let w16 = rng.vec(2 * f * k, 0.05);
    let wf: Vec<f32> = rng.vec(2 * f * k, 0.05);
    let (wgu, wgu_scale) = quantize_rows_e4m3(&wf, 2 * f, k);
    let wf: Vec<f32> = rng.vec(n * f, 0.05);
    let (wd, wd_scale) = quantize_rows_e4m3(&wf, n, f);
    let rounds = 20;
    let mut results: Vec<Vec<Vec<u8>>> = Vec::new();
    for pdl in [false, true] {
        let kern = Kernels::with_options(
            &ctx,
            KernelOptions {
                pdl,
                gemm_tuning: false,
                ..KernelOptions::from_env().unwrap()
            },
        )
        .unwrap();
        if kern.target() != "sm_90" {
            eprintln!(
                "not a Hopper GPU ({}): nothing launched dependent",
                kern.target()
            );
            return;
        }
        let t =
            |name: &str, dt: DType, shape: &[usize]| Tensor::alloc(&ctx, name, dt, shape).unwrap();
        let f32s = |name: &str, v: &[f32]| {
            let x = t(name, DType::F32, &[v.len()]);
            x.write_f32(s, v).unwrap();
            x
        };
        let (yt, nwt) = (t("y", DType::BF16, &[m, k]), t("nw", DType::BF16, &[k]));
        yt.write_f32(s, &y).unwrap();
        nwt.write_f32(s, &nw).unwrap();
        let normed = t("normed", DType::BF16, &[m, k]);
        let w16t = t("w16", DType::BF16, &[2 * f, k]);
        w16t.write_f32(s, &w16).unwrap();
        let h = t("h", DType::BF16, &[m, f]);
        let geglu = kern.geglu_linear(&normed, &w16t, &h).unwrap();
        assert!(geglu.on_wgmma());
        let codes = t("codes", DType::E4M3, &[m, k]);
        let (x_scale, h_scale) = (f32s("x_scale", &[4.0 / E4M3_MAX]), f32s("h_scale", &[0.02]));
        let wgut = t("wgu", DType::E4M3, &[2 * f, k]);
        wgut.write_bytes(s, &wgu).unwrap();
        let wgus = f32s("wgu_scale", &wgu_scale);
        let hcodes = t("hcodes", DType::E4M3, &[m, f]);
        let fused = kern
            .linear_geglu_e4m3(&codes, &wgut, &hcodes, DType::BF16)
            .unwrap()
            .expect("the FP8 gate+up+GEGLU kernel plans on Hopper");
        let wdt = t("wd", DType::E4M3, &[n, f]);
        wdt.write_bytes(s, &wd).unwrap();
        let wds = f32s("wd_scale", &wd_scale);
        let parts = t("parts", DType::F32, &[8, m, n]);
        let down = kern.linear_e4m3_split(&hcodes, &wdt, &parts).unwrap();
        assert!(down.on_wgmma());
        let mut got = Vec::new();
        for _ in 0..rounds {
            normed.write_f32(s, &vec![f32::NAN; m * k]).unwrap();
            h.write_f32(s, &vec![f32::NAN; m * f]).unwrap();
            codes.write_bytes(s, &vec![0x7f; m * k]).unwrap();
            hcodes.write_bytes(s, &vec![0x7f; m * f]).unwrap();
            parts.write_f32(s, &vec![f32::NAN; 8 * m * n]).unwrap();
            kern.rms_norm(s, &yt, &nwt, &normed, 1e-6).unwrap();
            geglu.run(&kern, s, &normed, &w16t, &h).unwrap();
            kern.rms_norm_e4m3(s, &yt, &nwt, Some(&normed), 1e-6, (&codes, &x_scale))
                .unwrap();
            fused
                .run(s, &codes, &x_scale, &wgut, &wgus, &hcodes, &h_scale)
                .unwrap();
            down.run(s, &hcodes, &h_scale, &wdt, &wds, &parts).unwrap();
            // h's and the parts' values as their f32 bits (a bf16 value widens exactly).
            let bits = |t: &Tensor| -> Vec<u8> {
                t.read_f32(s)
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_bits().to_le_bytes())
                    .collect()
            };
            let mut bytes = bits(&h);
            bytes.extend(hcodes.read_bytes(s).unwrap());
            bytes.extend(bits(&parts));
            got.push(bytes);
        }
        results.push(got);
    }
    let nan = |b: &[u8]| {
        b.chunks(4)
            .any(|v| f32::from_le_bytes([v[0], v[1], v[2], v[3]]).is_nan())
    };
    let plain = &results[0][0];
    let (h_end, codes_end) = (4 * m * f, 5 * m * f);
    assert!(
        !nan(&plain[..h_end]) && !nan(&plain[codes_end..]),
        "the plain launches left a poisoned output"
    );
    assert!(
        !plain[h_end..codes_end].iter().any(|&c| c & 0x7f == 0x7f),
        "the plain launches left poisoned codes"
    );
    for (pdl, got) in [false, true].iter().zip(&results) {
        for (r, bytes) in got.iter().enumerate() {
            let differ = bytes.iter().zip(plain).filter(|(a, b)| a != b).count();
            assert_eq!(
                differ,
                0,
                "pdl {pdl}, round {r}: {differ} of {} bytes differ from the plain launches",
                plain.len()
            );
        }
    }
}
