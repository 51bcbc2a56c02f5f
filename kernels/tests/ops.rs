//! Every op, on both backends (see `common/mod.rs` for what "checked" means).
//!
//! Host: `cargo test -p frt-kernels --test ops`.
//! CUDA: `cargo test -p frt-kernels --test ops -- --ignored` (or `.gpu/kernels-ops --ignored`).

mod common;

use common::{Backend, Case, FLOATS, Input, OpFn, Rng, Vals, gelu_tanh, rel_err, run, size_ok};
use frt_kernels::{
    AttentionMask, AttentionPath, Conv1d, DType, Epilogue, EulerOut, GemmOptions, KernelOptions,
    Kernels, PatchEmbed, Tensor,
};

fn erf(x: f64) -> f64 {
    libm::erf(x)
}

/// (rows, cols) shapes: small, odd, longer than one 8-element chunk per thread of a row
/// kernel (4104), and the models' (SigLIP, Gemma prefix, action expert, Whisper); the last
/// four only on CUDA.
const ROW_SHAPES: &[(usize, usize, bool)] = &[
    (3, 8, false),
    (5, 33, false),
    (7, 130, false),
    (2, 4104, false),
    (256, 1152, true),
    (800, 2048, true),
    (50, 1024, true),
    (1500, 384, true),
];

fn unary_ops(b: &Backend) {
    type F = fn(f64) -> f64;
    let ops: [(&str, F); 4] = [
        ("silu", |x| x / (1.0 + (-x).exp())),
        ("gelu_tanh", gelu_tanh),
        ("gelu", |x| {
            0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
        }),
        ("scale", |x| -0.75 * x),
    ];
    let mut rng = Rng::new(1);
    for &(rows, cols, big) in ROW_SHAPES {
        if !size_ok(b, big) {
            continue;
        }
        for dt in FLOATS {
            for (name, f) in ops {
                let run_op = |k: &Kernels, s, i: &[Tensor], o: &Tensor| match name {
                    "silu" => k.silu(s, &i[0], o),
                    "gelu_tanh" => k.gelu_tanh(s, &i[0], o),
                    "gelu" => k.gelu(s, &i[0], o),
                    _ => k.scale(s, &i[0], -0.75, o),
                };
                let reference = |v: &Vals| v.f[0].iter().map(|&x| f(x)).collect();
                run(
                    b,
                    &Case {
                        name: format!("{name} {rows}x{cols}"),
                        dtype: dt,
                        inputs: vec![Input::F(vec![rows, cols], rng.vec(rows * cols, 4.0))],
                        out: (vec![rows, cols], dt),
                        op: &run_op,
                        reference: &reference,
                        f32_tol: 1e-5,
                    },
                );
            }
        }
    }
}

fn binary_ops(b: &Backend) {
    let mut rng = Rng::new(2);
    for &(rows, cols, big) in ROW_SHAPES {
        if !size_ok(b, big) {
            continue;
        }
        for dt in FLOATS {
            let (a, bb, bias) = (
                rng.vec(rows * cols, 3.0),
                rng.vec(rows * cols, 3.0),
                rng.vec(cols, 1.0),
            );
            // a + b, a + bias row, a·b, euler step with dt = -0.1.
            let add = |k: &Kernels, s, i: &[Tensor], o: &Tensor| k.add(s, &i[0], &i[1], o);
            let add_ref = |v: &Vals| v.f[0].iter().zip(&v.f[1]).map(|(x, y)| x + y).collect();
            run(
                b,
                &Case {
                    name: format!("add {rows}x{cols}"),
                    dtype: dt,
                    inputs: vec![
                        Input::F(vec![rows, cols], a.clone()),
                        Input::F(vec![rows, cols], bb.clone()),
                    ],
                    out: (vec![rows, cols], dt),
                    op: &add,
                    reference: &add_ref,
                    f32_tol: 1e-6,
                },
            );
            let bias_ref = |v: &Vals| {
                v.f[0]
                    .iter()
                    .enumerate()
                    .map(|(i, x)| x + v.f[1][i % cols])
                    .collect()
            };
            run(
                b,
                &Case {
                    name: format!("add bias {rows}x{cols}"),
                    dtype: dt,
                    inputs: vec![
                        Input::F(vec![rows, cols], a.clone()),
                        Input::F(vec![cols], bias.clone()),
                    ],
                    out: (vec![rows, cols], dt),
                    op: &add,
                    reference: &bias_ref,
                    f32_tol: 1e-6,
                },
            );
            let mul = |k: &Kernels, s, i: &[Tensor], o: &Tensor| k.mul(s, &i[0], &i[1], o);
            let mul_ref = |v: &Vals| v.f[0].iter().zip(&v.f[1]).map(|(x, y)| x * y).collect();
            run(
                b,
                &Case {
                    name: format!("mul {rows}x{cols}"),
                    dtype: dt,
                    inputs: vec![
                        Input::F(vec![rows, cols], a.clone()),
                        Input::F(vec![rows, cols], bb.clone()),
                    ],
                    out: (vec![rows, cols], dt),
                    op: &mul,
                    reference: &mul_ref,
                    f32_tol: 1e-6,
                },
            );
            // Euler in place: copy x into the output first, then step it.
            let euler = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                k.scale(s, &i[0], 1.0, o)?;
                k.euler_step(s, o, &i[1], -0.1)
            };
            let euler_ref = |v: &Vals| {
                v.f[0]
                    .iter()
                    .zip(&v.f[1])
                    .map(|(x, y)| x + (-0.1f32) as f64 * y)
                    .collect()
            };
            run(
                b,
                &Case {
                    name: format!("euler_step {rows}x{cols}"),
                    dtype: dt,
                    inputs: vec![
                        Input::F(vec![rows, cols], a.clone()),
                        Input::F(vec![rows, cols], bb.clone()),
                    ],
                    out: (vec![rows, cols], dt),
                    op: &euler,
                    reference: &euler_ref,
                    f32_tol: 1e-6,
                },
            );
            // Euler in f32 that also writes x in the case's dtype: once checking that copy
            // (x staged in a scratch input), once checking x itself.
            let f32_in = |v: &Vec<f32>| Input::FD(DType::F32, vec![rows, cols], v.clone());
            let euler_cast = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                k.scale(s, &i[0], 1.0, &i[2])?;
                k.euler_step_cast(s, &i[2], &i[1], -0.1, o)
            };
            let euler_cast_x = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                k.scale(s, &i[0], 1.0, o)?;
                k.euler_step_cast(s, o, &i[1], -0.1, &i[2])
            };
            for (what, op, out_dt, scratch) in [
                (
                    "cast",
                    &euler_cast as OpFn,
                    dt,
                    Input::FD(DType::F32, vec![rows, cols], vec![0.0; rows * cols]),
                ),
                (
                    "x",
                    &euler_cast_x as OpFn,
                    DType::F32,
                    Input::F(vec![rows, cols], vec![0.0; rows * cols]),
                ),
            ] {
                run(
                    b,
                    &Case {
                        name: format!("euler_step_cast ({what}) {rows}x{cols}"),
                        dtype: dt,
                        inputs: vec![f32_in(&a), f32_in(&bb), scratch],
                        out: (vec![rows, cols], out_dt),
                        op,
                        reference: &euler_ref,
                        f32_tol: 1e-6,
                    },
                );
            }
            // Euler with a frozen prefix: the first `frozen` rows (a device-side count) become
            // t·x1 + (1 − t)·frozen; a count of 0 is the plain update; a count beyond the rows
            // freezes them all.
            let x1 = rng.vec(rows * cols, 2.0);
            let fz = rng.vec(rows * cols, 2.0);
            for (frozen, t_next) in [
                (0i32, 0.3f32),
                (rows as i32 / 2, 0.3),
                (rows as i32 + 5, 0.0),
            ] {
                let inpaint = move |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                    k.scale(s, &i[0], 1.0, &i[2])?;
                    k.euler_step_inpaint_cast(s, &i[2], &i[1], -0.1, &i[3], &i[4], &i[5], t_next, o)
                };
                let inpaint_ref = move |v: &Vals| {
                    let n = (frozen.max(0) as usize * cols).min(rows * cols);
                    (0..rows * cols)
                        .map(|i| {
                            if i < n {
                                t_next as f64 * v.f[3][i] + (1.0 - t_next as f64) * v.f[4][i]
                            } else {
                                v.f[0][i] + (-0.1f32) as f64 * v.f[1][i]
                            }
                        })
                        .collect()
                };
                run(
                    b,
                    &Case {
                        name: format!("euler_step_inpaint_cast ({frozen} rows) {rows}x{cols}"),
                        dtype: dt,
                        inputs: vec![
                            f32_in(&a),
                            f32_in(&bb),
                            Input::FD(DType::F32, vec![rows, cols], vec![0.0; rows * cols]),
                            f32_in(&x1),
                            f32_in(&fz),
                            Input::I(vec![1], vec![frozen]),
                        ],
                        out: (vec![rows, cols], dt),
                        op: &inpaint,
                        reference: &inpaint_ref,
                        f32_tol: 1e-6,
                    },
                );
            }
            // GEGLU on the two halves of one [rows, 2·cols] tensor (strided rows).
            let fused = rng.vec(rows * 2 * cols, 3.0);
            let geglu = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                k.geglu(
                    s,
                    &i[0].narrow(1, 0, cols)?,
                    &i[0].narrow(1, cols, cols)?,
                    o,
                )
            };
            let geglu_ref = |v: &Vals| {
                (0..rows * cols)
                    .map(|n| {
                        let (r, c) = (n / cols, n % cols);
                        gelu_tanh(v.f[0][r * 2 * cols + c]) * v.f[0][r * 2 * cols + cols + c]
                    })
                    .collect()
            };
            run(
                b,
                &Case {
                    name: format!("geglu {rows}x{cols}"),
                    dtype: dt,
                    inputs: vec![Input::F(vec![rows, 2 * cols], fused)],
                    out: (vec![rows, cols], dt),
                    op: &geglu,
                    reference: &geglu_ref,
                    f32_tol: 1e-5,
                },
            );
            // Gated residual, gate broadcast from one row and per row.
            let gr = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                k.gated_residual(s, &i[0], &i[1], &i[2], o)
            };
            for per_row in [false, true] {
                let gate = if per_row {
                    rng.vec(rows * cols, 1.0)
                } else {
                    rng.vec(cols, 1.0)
                };
                let gshape = if per_row {
                    vec![rows, cols]
                } else {
                    vec![cols]
                };
                let gr_ref = move |v: &Vals| {
                    (0..rows * cols)
                        .map(|n| v.f[0][n] + v.f[1][n] * v.f[2][if per_row { n } else { n % cols }])
                        .collect()
                };
                run(
                    b,
                    &Case {
                        name: format!("gated_residual {rows}x{cols} per_row={per_row}"),
                        dtype: dt,
                        inputs: vec![
                            Input::F(vec![rows, cols], a.clone()),
                            Input::F(vec![rows, cols], bb.clone()),
                            Input::F(gshape, gate),
                        ],
                        out: (vec![rows, cols], dt),
                        op: &gr,
                        reference: &gr_ref,
                        f32_tol: 1e-6,
                    },
                );
            }
        }
    }
}

fn casts(b: &Backend) {
    let mut rng = Rng::new(3);
    for from in FLOATS {
        for to in FLOATS {
            let n = if b.is_cuda() { 100_003 } else { 257 };
            let cast = |k: &Kernels, s, i: &[Tensor], o: &Tensor| k.cast(s, &i[0], o);
            let reference = |v: &Vals| v.f[0].clone();
            run(
                b,
                &Case {
                    name: format!("cast {from:?}->{to:?}"),
                    dtype: from,
                    inputs: vec![Input::F(vec![n], rng.vec(n, 50.0))],
                    out: (vec![n], to),
                    op: &cast,
                    reference: &reference,
                    f32_tol: 1e-7,
                },
            );
        }
    }
}

fn norms(b: &Backend) {
    let mut rng = Rng::new(4);
    let eps = 1e-6f32;
    for &(rows, cols, big) in ROW_SHAPES {
        if !size_ok(b, big) {
            continue;
        }
        for dt in FLOATS {
            let x = rng.vec(rows * cols, 2.0);
            let rms = |row: &[f64]| {
                (row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64 + eps as f64).sqrt()
            };
            let op = |k: &Kernels, s, i: &[Tensor], o: &Tensor| k.rms_norm(s, &i[0], &i[1], o, eps);
            let reference = |v: &Vals| {
                v.f[0]
                    .chunks(cols)
                    .flat_map(|row| {
                        let r = rms(row);
                        row.iter().map(move |x| x / r).collect::<Vec<_>>()
                    })
                    .enumerate()
                    .map(|(n, y)| y * (1.0 + v.f[1][n % cols]))
                    .collect()
            };
            run(
                b,
                &Case {
                    name: format!("rms_norm {rows}x{cols}"),
                    dtype: dt,
                    inputs: vec![
                        Input::F(vec![rows, cols], x.clone()),
                        Input::F(vec![cols], rng.vec(cols, 0.5)),
                    ],
                    out: (vec![rows, cols], dt),
                    op: &op,
                    reference: &reference,
                    f32_tol: 1e-5,
                },
            );
            // Adaptive: modulation [scale | shift | gate], one row or per row; the gate view
            // is returned (checked by copying it out after the norm).
            for per_row in [false, true] {
                let mrows = if per_row { rows } else { 1 };
                let op = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                    let gate = k.ada_rms_norm(s, &i[0], &i[1], o, eps)?;
                    assert_eq!(gate.shape(), &[if per_row { rows } else { 1 }, cols][..]);
                    assert_eq!(
                        gate.ptr(),
                        i[1].ptr() + (2 * cols * i[1].dtype().size()) as u64
                    );
                    Ok(())
                };
                let reference = move |v: &Vals| {
                    let m = &v.f[1];
                    v.f[0]
                        .chunks(cols)
                        .enumerate()
                        .flat_map(|(r, row)| {
                            let rr = rms(row);
                            let base = if per_row { r * 3 * cols } else { 0 };
                            row.iter()
                                .enumerate()
                                .map(move |(c, x)| {
                                    x / rr * (1.0 + m[base + c]) + m[base + cols + c]
                                })
                                .collect::<Vec<_>>()
                        })
                        .collect()
                };
                run(
                    b,
                    &Case {
                        name: format!("ada_rms_norm {rows}x{cols} per_row={per_row}"),
                        dtype: dt,
                        inputs: vec![
                            Input::F(vec![rows, cols], x.clone()),
                            Input::F(vec![mrows, 3 * cols], rng.vec(mrows * 3 * cols, 0.5)),
                        ],
                        out: (vec![rows, cols], dt),
                        op: &op,
                        reference: &reference,
                        f32_tol: 1e-5,
                    },
                );
            }
            let op = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                k.layer_norm(s, &i[0], &i[1], &i[2], o, eps)
            };
            let reference = |v: &Vals| {
                v.f[0]
                    .chunks(cols)
                    .flat_map(|row| {
                        let mean = row.iter().sum::<f64>() / cols as f64;
                        let var = row.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / cols as f64;
                        row.iter()
                            .enumerate()
                            .map(move |(c, x)| {
                                (x - mean) / (var + eps as f64).sqrt() * v.f[1][c] + v.f[2][c]
                            })
                            .collect::<Vec<_>>()
                    })
                    .collect()
            };
            run(
                b,
                &Case {
                    name: format!("layer_norm {rows}x{cols}"),
                    dtype: dt,
                    inputs: vec![
                        Input::F(vec![rows, cols], x.iter().map(|v| v + 0.3).collect()),
                        Input::F(vec![cols], rng.vec(cols, 1.0)),
                        Input::F(vec![cols], rng.vec(cols, 1.0)),
                    ],
                    out: (vec![rows, cols], dt),
                    op: &op,
                    reference: &reference,
                    f32_tol: 1e-5,
                },
            );
            let op = |k: &Kernels, s, i: &[Tensor], o: &Tensor| k.softmax(s, &i[0], o);
            let reference = |v: &Vals| {
                v.f[0]
                    .chunks(cols)
                    .flat_map(|row| {
                        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let sum: f64 = row.iter().map(|x| (x - m).exp()).sum();
                        row.iter()
                            .map(move |x| (x - m).exp() / sum)
                            .collect::<Vec<_>>()
                    })
                    .collect()
            };
            run(
                b,
                &Case {
                    name: format!("softmax {rows}x{cols}"),
                    dtype: dt,
                    inputs: vec![Input::F(vec![rows, cols], rng.vec(rows * cols, 8.0))],
                    out: (vec![rows, cols], dt),
                    op: &op,
                    reference: &reference,
                    f32_tol: 1e-5,
                },
            );
        }
    }
}

fn positional(b: &Backend) {
    let mut rng = Rng::new(5);
    // RoPE: (tokens, heads, dim): small, odd, Gemma (256), SigLIP-size is not rotary.
    for &(t, h, d, big) in &[
        (4usize, 2usize, 8usize, false),
        (9, 3, 16, false),
        (800, 8, 256, true),
        (50, 1, 256, true),
    ] {
        if !size_ok(b, big) {
            continue;
        }
        for dt in FLOATS {
            let pos: Vec<i32> = (0..t).map(|_| rng.below(1000) as i32).collect();
            let op =
                |k: &Kernels, s, i: &[Tensor], o: &Tensor| k.rope(s, &i[0], &i[1], o, 10_000.0);
            let reference = |v: &Vals| {
                let mut out = vec![0f64; t * h * d];
                for tok in 0..t {
                    for hh in 0..h {
                        for j in 0..d / 2 {
                            let base = (tok * h + hh) * d;
                            let ts = 10_000f64.powf(2.0 * j as f64 / d as f64);
                            let ang = v.i[0][tok] as f64 / ts;
                            let (x1, x2) = (v.f[0][base + j], v.f[0][base + d / 2 + j]);
                            out[base + j] = x1 * ang.cos() - x2 * ang.sin();
                            out[base + d / 2 + j] = x2 * ang.cos() + x1 * ang.sin();
                        }
                    }
                }
                out
            };
            run(
                b,
                &Case {
                    name: format!("rope {t}x{h}x{d}"),
                    dtype: dt,
                    inputs: vec![
                        Input::F(vec![t, h, d], rng.vec(t * h * d, 2.0)),
                        Input::I(vec![t], pos),
                    ],
                    out: (vec![t, h, d], dt),
                    op: &op,
                    reference: &reference,
                    f32_tol: 2e-4,
                },
            );
        }
    }
    // Embedding gather with a scale; ids outside the vocabulary give zero rows.
    for &(n, vocab, width, big) in &[(6usize, 10usize, 8usize, false), (200, 1000, 2048, true)] {
        if !size_ok(b, big) {
            continue;
        }
        for dt in FLOATS {
            let mut ids: Vec<i32> = (0..n).map(|_| rng.below(vocab as u32) as i32).collect();
            ids[1] = -3;
            ids[2] = vocab as i32;
            let scale = (width as f32).sqrt();
            let op =
                |k: &Kernels, s, i: &[Tensor], o: &Tensor| k.embedding(s, &i[0], &i[1], o, scale);
            let reference = |v: &Vals| {
                (0..n * width)
                    .map(|e| {
                        let id = v.i[0][e / width];
                        if id < 0 || id as usize >= vocab {
                            0.0
                        } else {
                            v.f[0][id as usize * width + e % width] * scale as f64
                        }
                    })
                    .collect()
            };
            run(
                b,
                &Case {
                    name: format!("embedding {n}x{width}"),
                    dtype: dt,
                    inputs: vec![
                        Input::I(vec![n], ids),
                        Input::F(vec![vocab, width], rng.vec(vocab * width, 1.0)),
                    ],
                    out: (vec![n, width], dt),
                    op: &op,
                    reference: &reference,
                    f32_tol: 1e-6,
                },
            );
        }
    }
    // Sin-cos embedding: pi05's time embedding and Whisper's positions.
    for &(n, width, lo, hi) in &[
        (10usize, 32usize, 4e-3f32, 4.0f32),
        (7, 1024, 4e-3, 4.0),
        (
            1500,
            384,
            std::f32::consts::TAU,
            std::f32::consts::TAU * 10_000.0,
        ),
    ] {
        let t: Vec<f32> = if n == 1500 {
            (0..n).map(|i| i as f32).collect()
        } else {
            (0..n).map(|_| (rng.uniform() + 1.0) / 2.0).collect()
        };
        let op = |k: &Kernels, s, i: &[Tensor], o: &Tensor| k.sinusoidal(s, &i[0], o, lo, hi);
        let reference = |v: &Vals| {
            let h = width / 2;
            (0..n)
                .flat_map(|r| {
                    let (lo, hi) = (lo as f64, hi as f64);
                    let periods: Vec<f64> = (0..h)
                        .map(|j| lo * (hi / lo).powf(j as f64 / (h - 1) as f64))
                        .collect();
                    let tr = v.f[0][r];
                    let sin: Vec<f64> = periods
                        .iter()
                        .map(|p| (std::f64::consts::TAU * tr / p).sin())
                        .collect();
                    let cos: Vec<f64> = periods
                        .iter()
                        .map(|p| (std::f64::consts::TAU * tr / p).cos())
                        .collect();
                    sin.into_iter().chain(cos)
                })
                .collect()
        };
        run(
            b,
            &Case {
                name: format!("sinusoidal {n}x{width}"),
                dtype: DType::F32,
                inputs: vec![Input::F(vec![n], t)],
                out: (vec![n, width], DType::F32),
                op: &op,
                reference: &reference,
                f32_tol: 2e-3,
            },
        );
    }
}

/// (m, k, n) GEMM shapes: small, odd, and the models' linear layers (CUDA only).
const GEMM_SHAPES: &[(usize, usize, usize, bool)] = &[
    (4, 8, 5, false),
    (13, 70, 33, false),
    (65, 130, 97, false),
    (256, 1152, 4304, true),  // SigLIP MLP up
    (256, 4304, 1152, true),  // SigLIP MLP down
    (800, 2048, 16384, true), // Gemma prefix MLP
    (800, 16384, 2048, true),
    (50, 1024, 4096, true),  // action expert MLP
    (1500, 384, 1536, true), // Whisper tiny encoder MLP
];

fn gemm(b: &Backend) {
    let mut rng = Rng::new(6);
    for &(m, kk, n, big) in GEMM_SHAPES {
        if !size_ok(b, big) {
            continue;
        }
        let dts: &[DType] = if big {
            &[DType::BF16, DType::F16]
        } else {
            &FLOATS
        };
        for &dt in dts {
            // Weights as checkpoints store them ([out, in], trans_b) with bias; and, for the
            // small shapes, every transpose combination, alpha/beta, GELU.
            let combos: &[(bool, bool, f32, f32, bool, Epilogue)] = if big {
                &[(false, true, 1.0, 0.0, true, Epilogue::None)]
            } else {
                &[
                    (false, false, 1.0, 0.0, false, Epilogue::None),
                    (false, true, 1.0, 0.0, true, Epilogue::None),
                    (true, false, 0.5, 0.0, false, Epilogue::None),
                    (true, true, 1.0, 0.0, true, Epilogue::Gelu),
                    (false, true, 2.0, 0.5, false, Epilogue::None),
                ]
            };
            for &(ta, tb, alpha, beta, bias, epi) in combos {
                let a_shape = if ta { vec![kk, m] } else { vec![m, kk] };
                let b_shape = if tb { vec![n, kk] } else { vec![kk, n] };
                let c0 = rng.vec(m * n, 1.0);
                let mut inputs = vec![
                    Input::F(a_shape, rng.vec(m * kk, 1.0)),
                    Input::F(b_shape, rng.vec(kk * n, 1.0)),
                    Input::F(vec![m, n], c0),
                ];
                if bias {
                    inputs.push(Input::F(vec![n], rng.vec(n, 1.0)));
                }
                let op = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                    // The output starts as C (for beta).
                    k.scale(s, &i[2], 1.0, o)?;
                    let g = k.gemm(
                        &i[0],
                        &i[1],
                        o,
                        GemmOptions {
                            trans_a: ta,
                            trans_b: tb,
                            alpha,
                            beta,
                            bias,
                            epilogue: epi,
                        },
                    )?;
                    g.run(s, &i[0], &i[1], o, if bias { Some(&i[3]) } else { None })
                };
                let reference = |v: &Vals| {
                    let (a, bm) = (&v.f[0], &v.f[1]);
                    (0..m * n)
                        .map(|e| {
                            let (i, j) = (e / n, e % n);
                            let mut acc = 0f64;
                            for p in 0..kk {
                                let av = if ta { a[p * m + i] } else { a[i * kk + p] };
                                let bv = if tb { bm[j * kk + p] } else { bm[p * n + j] };
                                acc += av * bv;
                            }
                            let mut r = alpha as f64 * acc + beta as f64 * v.f[2][e];
                            if bias {
                                r += v.f[3][j];
                            }
                            if epi == Epilogue::Gelu {
                                gelu_tanh(r)
                            } else {
                                r
                            }
                        })
                        .collect()
                };
                run(
                    b,
                    &Case {
                        name: format!(
                            "gemm {m}x{kk}x{n} ta={ta} tb={tb} a={alpha} b={beta} bias={bias} {epi:?}"
                        ),
                        dtype: dt,
                        inputs,
                        out: (vec![m, n], dt),
                        op: &op,
                        reference: &reference,
                        f32_tol: 1e-5 * (kk as f64).sqrt(),
                    },
                );
            }
        }
    }
    // Batched and strided: [batch, m, k] × shared [n, k]ᵀ into a strided C view.
    let (batch, m, kk, n) = (3, 6, 10, 7);
    for dt in FLOATS {
        let op = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
            let g = k.gemm(
                &i[0],
                &i[1],
                o,
                GemmOptions {
                    trans_a: false,
                    trans_b: true,
                    alpha: 1.0,
                    beta: 0.0,
                    bias: false,
                    epilogue: Epilogue::None,
                },
            )?;
            g.run(s, &i[0], &i[1], o, None)
        };
        let reference = |v: &Vals| {
            (0..batch * m * n)
                .map(|e| {
                    let (bi, i, j) = (e / (m * n), (e / n) % m, e % n);
                    (0..kk)
                        .map(|p| v.f[0][(bi * m + i) * kk + p] * v.f[1][j * kk + p])
                        .sum()
                })
                .collect()
        };
        run(
            b,
            &Case {
                name: format!("gemm batched {batch}x{m}x{kk}x{n}"),
                dtype: dt,
                inputs: vec![
                    Input::F(vec![batch, m, kk], rng.vec(batch * m * kk, 1.0)),
                    Input::F(vec![n, kk], rng.vec(n * kk, 1.0)),
                ],
                out: (vec![batch, m, n], dt),
                op: &op,
                reference: &reference,
                f32_tol: 1e-5,
            },
        );
    }
}

/// bf16/f16 operands into an f32 output with an f32 bias (a model's last projection feeding
/// f32 arithmetic).
fn gemm_f32_out(b: &Backend) {
    let mut rng = Rng::new(16);
    for (m, kk, n) in [(5, 16, 7), (50, 1024, 32)] {
        for dt in [DType::BF16, DType::F16] {
            let op = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                let g = k.linear(&i[0], &i[1], o, true, false)?;
                g.run(s, &i[0], &i[1], o, Some(&i[2]))
            };
            let reference = |v: &Vals| {
                (0..m * n)
                    .map(|e| {
                        let (i, j) = (e / n, e % n);
                        let dot: f64 = (0..kk)
                            .map(|p| v.f[0][i * kk + p] * v.f[1][j * kk + p])
                            .sum();
                        dot + v.f[2][j]
                    })
                    .collect()
            };
            run(
                b,
                &Case {
                    name: format!("linear {m}x{kk}x{n} {dt:?} -> f32 with bias"),
                    dtype: dt,
                    inputs: vec![
                        Input::F(vec![m, kk], rng.vec(m * kk, 1.0)),
                        Input::F(vec![n, kk], rng.vec(n * kk, 1.0)),
                        Input::FD(DType::F32, vec![n], rng.vec(n, 1.0)),
                    ],
                    out: (vec![m, n], DType::F32),
                    op: &op,
                    reference: &reference,
                    f32_tol: 1e-5 * (kk as f64).sqrt(),
                },
            );
        }
    }
}

/// `x·wᵀ` with the reduction split into parts, each part's f32 sum in its own slice of the
/// output: the action expert's attention output and down projections (50 rows, 4 and 8 parts),
/// a small odd shape, one part; against the f64 sum over each part's columns.
fn linear_split(b: &Backend) {
    let mut rng = Rng::new(17);
    for (m, kk, n, parts, dt) in [
        (5, 12, 7, 3, DType::BF16),
        (3, 16, 8, 1, DType::F16),
        (4, 32, 5, 4, DType::F32),
        (50, 2048, 64, 4, DType::BF16),
        (50, 4096, 32, 8, DType::BF16),
    ] {
        let op = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
            let g = k.linear_split(&i[0], &i[1], o)?;
            assert_eq!(g.parts(), parts);
            g.run(s, &i[0], &i[1], o)
        };
        let part = kk / parts;
        let reference = |v: &Vals| {
            (0..parts * m * n)
                .map(|e| {
                    let (p, i, j) = (e / (m * n), e / n % m, e % n);
                    (p * part..(p + 1) * part)
                        .map(|c| v.f[0][i * kk + c] * v.f[1][j * kk + c])
                        .sum()
                })
                .collect()
        };
        run(
            b,
            &Case {
                name: format!("linear_split {m}x{kk}x{n} in {parts} parts {dt:?}"),
                dtype: dt,
                inputs: vec![
                    Input::F(vec![m, kk], rng.vec(m * kk, 1.0)),
                    Input::F(vec![n, kk], rng.vec(n * kk, 1.0)),
                ],
                out: (vec![parts, m, n], DType::F32),
                op: &op,
                reference: &reference,
                f32_tol: 1e-5 * (part as f64).sqrt(),
            },
        );
    }
    // Parts must divide the reduction; the partial sums are f32 [parts, rows, out].
    let (k, s, ctx) = (&b.k, b.s, b.k.ctx());
    let t = |dt, shape: &[usize]| Tensor::alloc(ctx, "t", dt, shape).unwrap();
    let (x, w) = (t(DType::BF16, &[4, 12]), t(DType::BF16, &[6, 12]));
    for bad in [
        t(DType::F32, &[5, 4, 6]),
        t(DType::BF16, &[3, 4, 6]),
        t(DType::F32, &[4, 6]),
        t(DType::F32, &[3, 5, 6]),
    ] {
        assert!(k.linear_split(&x, &w, &bad).is_err(), "{bad:?}");
    }
    let g = k.linear_split(&x, &w, &t(DType::F32, &[3, 4, 6])).unwrap();
    assert!(g.run(s, &x, &w, &t(DType::F32, &[2, 4, 6])).is_err());
}

/// The first half of a gated MLP, `gelu_tanh(x·Wgᵀ) ⊙ (x·Wuᵀ)` with `w = [Wg ; Wu]`, planned
/// (a GEMM and geglu; on Hopper, bf16/f16 and up to 64 rows with K a multiple of 64, the
/// `wgmma` kernel, required there) and on CUDA (bf16/f16, sm_80+) also on the fused kernel for
/// up to 64 rows: the action expert's shape, a K that is not a multiple of the kernels' chunks,
/// one row, 64 rows, K over more chunks than the `wgmma` kernel's ring of 8 stages; more rows
/// or f32 cannot take them.
fn geglu_linear(b: &Backend) {
    let mut rng = Rng::new(21);
    let gelu = |x: f64| {
        0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
    };
    for (m, kk, f, big) in [
        (50, 1024, 4096, true),
        (1, 64, 32, false),
        (64, 200, 96, false),
        (65, 40, 32, false),
        (7, 8, 64, false),
        (7, 384, 64, false),
        (64, 1152, 96, false),
    ] {
        if !size_ok(b, big) {
            continue;
        }
        for (dt, fused) in FLOATS.iter().flat_map(|&dt| [(dt, false), (dt, true)]) {
            let can_fuse = b.is_cuda() && sm80(&b.k) && dt != DType::F32 && m <= 64;
            if fused && !can_fuse {
                continue;
            }
            // The host backend it is compared with plans the GEMM and geglu.
            let op = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                let plan = if fused && k.target() != "host" {
                    let p = k.geglu_linear_fused(&i[0], &i[1], o)?;
                    assert!(p.fused());
                    p
                } else {
                    let p = k.geglu_linear(&i[0], &i[1], o)?;
                    let wgmma = k.target() == "sm_90"
                        && dt != DType::F32
                        && m <= 64
                        && kk % 64 == 0
                        && f % 32 == 0;
                    assert_eq!(p.on_wgmma(), wgmma, "{m}x{kk} -> {f} {dt:?}");
                    p
                };
                plan.run(k, s, &i[0], &i[1], o)
            };
            let reference = |v: &Vals| {
                let dot = |i: usize, j: usize| -> f64 {
                    (0..kk)
                        .map(|p| v.f[0][i * kk + p] * v.f[1][j * kk + p])
                        .sum()
                };
                (0..m * f)
                    .map(|e| {
                        let (i, j) = (e / f, e % f);
                        gelu(dot(i, j)) * dot(i, f + j)
                    })
                    .collect()
            };
            run(
                b,
                &Case {
                    name: format!("geglu_linear {m}x{kk} -> {f}, fused {fused}"),
                    dtype: dt,
                    inputs: vec![
                        Input::F(vec![m, kk], rng.vec(m * kk, 1.0)),
                        Input::F(vec![2 * f, kk], rng.vec(2 * f * kk, 1.0)),
                    ],
                    out: (vec![m, f], dt),
                    op: &op,
                    reference: &reference,
                    f32_tol: 1e-5 * (kk as f64).sqrt(),
                },
            );
        }
    }
    // Mismatched shapes are errors when planned and when run; the fused kernel takes at most
    // 64 rows and only on CUDA.
    let k = &b.k;
    let t = |shape: &[usize]| Tensor::alloc(k.ctx(), "t", DType::BF16, shape).unwrap();
    assert!(
        k.geglu_linear_fused(&t(&[65, 64]), &t(&[64, 64]), &t(&[65, 32]))
            .is_err()
    );
    assert_eq!(
        k.geglu_linear_fused(&t(&[4, 64]), &t(&[64, 64]), &t(&[4, 32]))
            .is_ok(),
        b.is_cuda() && sm80(k)
    );
    assert!(
        k.geglu_linear(&t(&[4, 64]), &t(&[63, 64]), &t(&[4, 32]))
            .is_err()
    );
    assert!(
        k.geglu_linear(&t(&[4, 64]), &t(&[64, 32]), &t(&[4, 32]))
            .is_err()
    );
    assert!(
        k.geglu_linear(&t(&[5, 64]), &t(&[64, 64]), &t(&[4, 32]))
            .is_err()
    );
    let plan = k
        .geglu_linear(&t(&[4, 64]), &t(&[64, 64]), &t(&[4, 32]))
        .unwrap();
    assert!(
        plan.run(k, b.s, &t(&[4, 64]), &t(&[128, 64]), &t(&[4, 64]))
            .is_err()
    );
    assert!(
        plan.run(k, b.s, &t(&[4, 64]), &t(&[64, 64]), &t(&[4, 32]))
            .is_ok()
    );
    b.k.ctx().sync_stream(b.s).unwrap();
}

/// Graphs of different models replay on different streams at once (the policy and speech
/// recognition): GEMMs whose algorithm keeps partial sums in a workspace must not share one.
/// Two graphs of split-K GEMMs replayed concurrently on two streams give the results of
/// eager runs.
fn graphs_on_two_streams(b: &Backend) {
    let (k, ctx) = (&b.k, b.k.ctx());
    const RUNS: usize = 16;
    let mut rng = Rng::new(17);
    // On CUDA a tall-K shape whose planned algorithm keeps partial sums in the workspace.
    let (m, kk, n) = if b.is_cuda() {
        [(8, 32768, 256), (4, 65536, 128), (16, 16384, 512)]
            .into_iter()
            .find(|&(m, kk, n)| {
                let t = |shape: &[usize]| Tensor::alloc(ctx, "t", DType::BF16, shape).unwrap();
                let g = k.linear(&t(&[m, kk]), &t(&[n, kk]), &t(&[m, n]), false, false);
                g.unwrap().workspace_bytes() > 0
            })
            .expect("a shape planned with a workspace algorithm")
    } else {
        (4, 64, 8)
    };
    let err = |e: frt_kernels::Error| frt_exec::Error::Invalid {
        op: "test capture",
        reason: e.to_string(),
    };
    let mut sides = Vec::new();
    for side in 0..2 {
        let a = Tensor::alloc(ctx, "a", DType::BF16, &[m, kk]).unwrap();
        let w = Tensor::alloc(ctx, "w", DType::BF16, &[n, kk]).unwrap();
        let c = Tensor::alloc(ctx, "c", DType::F32, &[RUNS, m, n]).unwrap();
        a.write_f32(b.s, &rng.vec(m * kk, 1.0)).unwrap();
        w.write_f32(b.s, &rng.vec(n * kk, 1.0)).unwrap();
        let outs: Vec<Tensor> = (0..RUNS).map(|r| c.narrow(0, r, 1).unwrap()).collect();
        let out0 = Tensor::with_layout(c.buffer(), DType::F32, &[m, n], &[n, 1], 0).unwrap();
        let g = k.linear(&a, &w, &out0, false, false).unwrap();
        g.run(b.s, &a, &w, &out0, None).unwrap();
        let want = out0.read_f32(b.s).unwrap();
        let graph = frt_exec::Graph::new(ctx, &format!("side {side}"), 1);
        graph
            .capture(frt_exec::ShapeKey(0), |cs| {
                for o in &outs {
                    let o =
                        Tensor::with_layout(o.buffer(), DType::F32, &[m, n], &[n, 1], o.offset())
                            .map_err(err)?;
                    g.run(cs, &a, &w, &o, None).map_err(err)?;
                }
                Ok::<(), frt_exec::Error>(())
            })
            .unwrap();
        sides.push((graph, c, want));
    }
    let streams = [ctx.stream(0).unwrap(), ctx.stream(0).unwrap()];
    for round in 0..8 {
        for ((graph, c, _), s) in sides.iter().zip(streams) {
            c.write_f32(s, &vec![f32::NAN; c.numel()]).unwrap();
            graph.replay(frt_exec::ShapeKey(0), s).unwrap();
        }
        for ((_, c, want), s) in sides.iter().zip(streams) {
            let got = c.read_f32(s).unwrap();
            for (r, run) in got.chunks(m * n).enumerate() {
                let e = rel_err(run, &want.iter().map(|v| *v as f64).collect::<Vec<_>>());
                assert!(
                    e < 1e-5,
                    "round {round}, run {r}: relative error {e} against the eager run"
                );
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn attention_ref(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    sq: usize,
    sk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    visible: &dyn Fn(usize, usize) -> bool,
    scale: f64,
) -> Vec<f64> {
    let mut out = vec![0f64; sq * hq * d];
    for i in 0..sq {
        for h in 0..hq {
            let kh = h / (hq / hkv);
            let scores: Vec<Option<f64>> = (0..sk)
                .map(|j| {
                    visible(i, j).then(|| {
                        (0..d)
                            .map(|c| q[(i * hq + h) * d + c] * k[(j * hkv + kh) * d + c])
                            .sum::<f64>()
                            * scale
                    })
                })
                .collect();
            let m = scores
                .iter()
                .flatten()
                .cloned()
                .fold(f64::NEG_INFINITY, f64::max);
            if m == f64::NEG_INFINITY {
                continue;
            }
            let w: Vec<f64> = scores
                .iter()
                .map(|s| s.map_or(0.0, |s| (s - m).exp()))
                .collect();
            let sum: f64 = w.iter().sum();
            for c in 0..d {
                out[(i * hq + h) * d + c] = (0..sk)
                    .map(|j| w[j] * v[(j * hkv + kh) * d + c])
                    .sum::<f64>()
                    / sum;
            }
        }
    }
    out
}

fn attention(b: &Backend) {
    let mut rng = Rng::new(7);
    let one_warp = b.is_cuda().then(|| {
        Kernels::with_options(
            b.k.ctx(),
            KernelOptions {
                flash_halves: false,
                ..KernelOptions::default()
            },
        )
        .unwrap()
    });
    // On CUDA the GEMM path wherever it can run (its softmax holds rows of up to 1024 keys in
    // registers, 8 keys an access where the row is a multiple of 8).
    let gemm_path = b.is_cuda().then(|| {
        Kernels::with_options(
            b.k.ctx(),
            KernelOptions {
                attention: AttentionPath::Gemm,
                ..KernelOptions::default()
            },
        )
        .unwrap()
    });
    // (Sq, Sk, Hq, Hkv, D, mask kind): kinds 0 full, 1 device valid length, 2 prefix+suffix,
    // 3 causal, 4 a per-key mask (masked image views and prompt padding).
    let cases: &[(usize, usize, usize, usize, usize, u8, bool)] = &[
        (5, 5, 4, 4, 16, 0, false),
        (7, 7, 8, 1, 16, 1, false),
        (3, 12, 8, 1, 16, 2, false),
        (6, 6, 4, 2, 64, 3, false),
        (9, 9, 3, 1, 72, 1, false),
        (20, 36, 4, 2, 16, 2, false),
        (17, 17, 2, 2, 64, 3, false),
        (256, 256, 16, 16, 72, 0, true), // SigLIP
        (800, 800, 8, 1, 256, 1, true),  // Gemma prefix, padded prompt
        (576, 576, 8, 1, 256, 4, true),  // Gemma prefix, a missing view and prompt padding
        (50, 850, 8, 1, 256, 2, true),   // action expert over [prefix ; suffix]
        (1500, 1500, 6, 6, 64, 0, true), // Whisper tiny encoder
        (1, 1500, 6, 6, 64, 0, true),    // Whisper decoder cross-attention (one query)
        (3, 300, 8, 1, 64, 1, false),    // few queries over many keys
        (20, 40, 8, 1, 16, 4, false),
        (2, 300, 4, 1, 32, 4, false),
        (50, 818, 8, 1, 256, 4, true), // action expert over a prefix with a missing view
        (24, 24, 6, 6, 64, 3, true),   // Whisper decoder prompt
        (300, 300, 4, 1, 32, 3, false), // causal, one key/value head, many keys (token-major rows)
    ];
    for &(sq, sk, hq, hkv, d, kind, big) in cases {
        if !size_ok(b, big) {
            continue;
        }
        for dt in FLOATS {
            let valid = (sk * 2 / 3).max(1) as i32;
            let prefix_cap = sk - sq;
            let scale = 1.0 / (d as f32).sqrt();
            let mut inputs = vec![
                Input::F(vec![sq, hq, d], rng.vec(sq * hq * d, 2.0)),
                Input::F(vec![sk, hkv, d], rng.vec(sk * hkv * d, 2.0)),
                Input::F(vec![sk, hkv, d], rng.vec(sk * hkv * d, 2.0)),
            ];
            let prefix_valid = (prefix_cap * 3 / 4).max(1) as i32;
            if kind == 1 {
                inputs.push(Input::I(vec![1], vec![valid]));
            }
            if kind == 2 {
                inputs.push(Input::I(vec![1], vec![prefix_valid]));
            }
            // Every third key masked, and a whole block (a missing view), never all keys.
            let key_mask: Vec<u8> = (0..sk)
                .map(|j| u8::from(j % 3 != 1 && !(sk / 4..sk / 2).contains(&j)))
                .collect();
            if kind == 4 {
                inputs.push(Input::U8(vec![sk], key_mask.clone()));
            }
            let mask_of = |i: &[Tensor]| match kind {
                0 => AttentionMask::full(),
                1 => AttentionMask::valid(&i[3]),
                2 => AttentionMask::prefix_suffix(&i[3], prefix_cap),
                4 => AttentionMask::keys(&i[3]),
                _ => AttentionMask::causal(0),
            };
            let direct = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                k.attention(s, &i[0], &i[1], &i[2], o, &mask_of(i), scale)
            };
            let planned = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                k.attention_plan(&i[0], &i[1], &i[2], o, &mask_of(i), scale)?
                    .run(k, s)
            };
            let reference = |v: &Vals| {
                let vis = |i: usize, j: usize| match kind {
                    0 => true,
                    1 => (j as i32) < valid,
                    2 => (j as i32) < prefix_valid || j >= prefix_cap,
                    4 => key_mask[j] != 0,
                    _ => j <= i,
                };
                attention_ref(
                    &v.f[0],
                    &v.f[1],
                    &v.f[2],
                    sq,
                    sk,
                    hq,
                    hkv,
                    d,
                    &vis,
                    scale as f64,
                )
            };
            // On CUDA the tensor-core kernel; the host backend it is compared with runs its
            // reference kernel.
            let flash = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                let plan = if k.target() == "host" {
                    k.attention_plan(&i[0], &i[1], &i[2], o, &mask_of(i), scale)?
                } else {
                    k.attention_plan_flash(&i[0], &i[1], &i[2], o, &mask_of(i), scale)?
                };
                plan.run(k, s)
            };
            type OpFn<'a> = dyn Fn(&Kernels, frt_exec::Stream, &[Tensor], &Tensor) -> frt_kernels::Result<()>
                + 'a;
            type Op<'a> = &'a OpFn<'a>;
            // The tensor-core kernel with the keys split 3, 7, 12 and 24 ways (rounded to
            // whole tiles): each form of the split merge (up to 4, 8, 16 splits, and more);
            // and in one split, whose blocks write the output themselves (at head dim 256 in
            // the halves form where the row blocks are at most one an SM).
            let split_forms: Vec<(String, Box<OpFn<'_>>)> = [1usize, 3, 7, 12, 24]
                .into_iter()
                .map(|n| {
                    let mask_of = &mask_of;
                    let op: Box<OpFn<'_>> =
                        Box::new(move |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                            // The host backend it is compared with: its reference kernel.
                            let plan = if k.target() == "host" {
                                k.attention_plan(&i[0], &i[1], &i[2], o, &mask_of(i), scale)?
                            } else {
                                k.attention_plan_flash_splits(
                                    &i[0],
                                    &i[1],
                                    &i[2],
                                    o,
                                    &mask_of(i),
                                    scale,
                                    n,
                                )?
                            };
                            plan.run(k, s)
                        });
                    (format!("tensor-core, {n} splits asked"), op)
                })
                .collect();
            // Head dim 256 on CUDA: also the form with one warp for every 16 rows (where the
            // halves form is the default).
            let one_warp_flash = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                // The host backend it is compared with: its reference kernel.
                if k.target() == "host" {
                    return k
                        .attention_plan(&i[0], &i[1], &i[2], o, &mask_of(i), scale)?
                        .run(k, s);
                }
                let k = one_warp.as_ref().expect("CUDA");
                k.attention_plan_flash(&i[0], &i[1], &i[2], o, &mask_of(i), scale)?
                    .run(k, s)
            };
            let forced_gemm = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                // The host backend it is compared with: its reference kernel.
                let k = gemm_path
                    .as_ref()
                    .filter(|_| k.target() != "host")
                    .unwrap_or(k);
                k.attention_plan(&i[0], &i[1], &i[2], o, &mask_of(i), scale)?
                    .run(k, s)
            };
            let mut forms: Vec<(String, Op)> = vec![
                ("direct".to_string(), &direct),
                ("planned".to_string(), &planned),
            ];
            if b.is_cuda() {
                forms.push(("GEMM path".to_string(), &forced_gemm));
            }
            if b.is_cuda() && sm80(&b.k) && dt != DType::F32 && d % 8 == 0 {
                forms.push(("tensor-core".to_string(), &flash));
                if d == 256 {
                    forms.push((
                        "tensor-core, one warp a row block".to_string(),
                        &one_warp_flash,
                    ));
                }
                if big {
                    for (name, op) in &split_forms {
                        forms.push((name.clone(), op.as_ref()));
                    }
                }
            }
            for (form, op) in forms {
                run(
                    b,
                    &Case {
                        name: format!("attention ({form}) q{sq} k{sk} h{hq}/{hkv} d{d} mask{kind}"),
                        dtype: dt,
                        inputs: inputs.clone(),
                        out: (vec![sq, hq, d], dt),
                        op,
                        reference: &reference,
                        // f32 sums over many keys on the GEMM path: one element at 1.12× of
                        // 1e-5 at 800 keys (H100).
                        f32_tol: if sk >= 512 { 2e-5 } else { 1e-5 },
                    },
                );
            }
        }
    }
}

/// The action expert's output projection and Euler update as one op: the velocity, the
/// updated x, its cast and the frozen-prefix form, against the f64 reference (and on CUDA the
/// host backend's GEMM and Euler ops), at the model's shape (32 actions from 1024 features) and
/// at shapes off the kernel's 4-column accesses and 8-output blocks.
fn velocity_euler(b: &Backend) {
    let mut rng = Rng::new(11);
    let dt_step = -0.1f32;
    for (rows, kk, n) in [(50, 1024, 32), (7, 36, 5), (3, 30, 9), (2, 64, 1)] {
        let f32_in = |shape: Vec<usize>, v: Vec<f32>| Input::FD(DType::F32, shape, v);
        let inputs = vec![
            f32_in(vec![rows, kk], rng.vec(rows * kk, 2.0)),
            f32_in(vec![n, kk], rng.vec(n * kk, 0.1)),
            f32_in(vec![n], rng.vec(n, 0.5)),
            f32_in(vec![rows, n], rng.vec(rows * n, 2.0)),
            f32_in(vec![rows, n], vec![0.0; rows * n]),
            f32_in(vec![rows, n], vec![0.0; rows * n]),
            f32_in(vec![rows, n], rng.vec(rows * n, 2.0)),
            f32_in(vec![rows, n], rng.vec(rows * n, 2.0)),
        ];
        let velocity_ref = |v: &Vals| -> Vec<f64> {
            (0..rows * n)
                .map(|e| {
                    let (r, j) = (e / n, e % n);
                    v.f[2][j]
                        + (0..kk)
                            .map(|c| v.f[0][r * kk + c] * v.f[1][j * kk + c])
                            .sum::<f64>()
                })
                .collect()
        };
        let update_ref = |v: &Vals, frozen: i32, t_next: f32| -> Vec<f64> {
            velocity_ref(v)
                .iter()
                .enumerate()
                .map(|(e, vel)| {
                    if (e / n) < frozen.max(0) as usize {
                        t_next as f64 * v.f[6][e] + (1.0 - t_next as f64) * v.f[7][e]
                    } else {
                        v.f[3][e] + dt_step as f64 * vel
                    }
                })
                .collect()
        };
        // Inputs: 0 h, 1 w, 2 b, 3 x as given, 4 x's scratch, 5 v's scratch, 6 x1, 7 frozen,
        // 8 the frozen row count.
        let step = |k: &Kernels, s, i: &[Tensor], v: &Tensor, x: &Tensor, out: EulerOut| {
            k.velocity_euler(&i[0], &i[1], v)?
                .run(k, s, &i[0], &i[1], &i[2], v, x, dt_step, out)
        };
        let in_place = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
            k.scale(s, &i[3], 1.0, o)?;
            step(k, s, i, &i[5], o, EulerOut::InPlace)
        };
        let velocity = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
            k.scale(s, &i[3], 1.0, &i[4])?;
            step(k, s, i, o, &i[4], EulerOut::InPlace)
        };
        let no_rows = |v: &Vals| update_ref(v, 0, 0.0);
        // Per case: its name, its reference, the op and the velocity's dtype.
        type RefFn<'a> = Box<dyn Fn(&Vals) -> Vec<f64> + 'a>;
        let mut cases: Vec<(String, RefFn<'_>, OpFn, DType)> = vec![
            (
                "x in place".into(),
                Box::new(no_rows),
                &in_place,
                DType::F32,
            ),
            (
                "velocity".into(),
                Box::new(velocity_ref),
                &velocity,
                DType::F32,
            ),
        ];
        let cast = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
            k.scale(s, &i[3], 1.0, &i[4])?;
            step(k, s, i, &i[5], &i[4], EulerOut::Cast(o))
        };
        let inpaint = |t_next: f32| {
            move |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                k.scale(s, &i[3], 1.0, &i[4])?;
                let out = EulerOut::Inpaint {
                    x1: &i[6],
                    frozen: &i[7],
                    frozen_rows: &i[8],
                    t_next,
                    cast: o,
                };
                step(k, s, i, &i[5], &i[4], out)
            }
        };
        let frozen_forms = [
            (0i32, 0.3f32),
            (rows as i32 / 2, 0.3),
            (rows as i32 + 5, 0.0),
        ];
        let inpaints: Vec<_> = frozen_forms.iter().map(|&(_, t)| inpaint(t)).collect();
        for dt in FLOATS {
            cases.push((format!("cast to {dt:?}"), Box::new(no_rows), &cast, dt));
            for (&(frozen, t_next), op) in frozen_forms.iter().zip(&inpaints) {
                cases.push((
                    format!("frozen {frozen} rows, cast to {dt:?}"),
                    Box::new(move |v: &Vals| update_ref(v, frozen, t_next)),
                    op,
                    dt,
                ));
            }
        }
        for (what, reference, op, out_dt) in &cases {
            let frozen = frozen_forms
                .iter()
                .find(|(f, _)| what.starts_with(&format!("frozen {f} ")))
                .map_or(0, |(f, _)| *f);
            let mut inputs = inputs.clone();
            inputs.push(Input::I(vec![1], vec![frozen]));
            run(
                b,
                &Case {
                    name: format!("velocity_euler ({what}) {rows}x{kk} -> {n}"),
                    dtype: DType::F32,
                    inputs,
                    out: (vec![rows, n], *out_dt),
                    op: *op,
                    reference: reference.as_ref(),
                    f32_tol: 1e-5,
                },
            );
        }
    }
}

fn sm80(k: &Kernels) -> bool {
    k.target()
        .strip_prefix("sm_")
        .and_then(|a| a.parse::<u32>().ok())
        .is_some_and(|a| a >= 80)
}

/// Which path an attention plan takes. The host runs the reference kernel and has no
/// tensor-core plan; CUDA (sm_80 and later) plans bf16/f16 attention on the tensor-core kernel
/// when asked, splitting the keys more when the rows are few (the action expert) than when they
/// fill more of the device (the prefix), and by default for few queries but not for Gemma's
/// long prefix; f32 has no tensor-core plan and takes the GEMM path.
fn attention_paths(b: &Backend) {
    let k = &b.k;
    let t = |dt, shape: &[usize]| Tensor::alloc(k.ctx(), "t", dt, shape).unwrap();
    let plan = |dt, sq: usize, sk: usize, flash: bool| {
        let (q, o) = (t(dt, &[sq, 8, 256]), t(dt, &[sq, 8, 256]));
        let (kk, v) = (t(dt, &[sk, 1, 256]), t(dt, &[sk, 1, 256]));
        let m = AttentionMask::full();
        if flash {
            k.attention_plan_flash(&q, &kk, &v, &o, &m, 0.0625)
        } else {
            k.attention_plan(&q, &kk, &v, &o, &m, 0.0625)
        }
    };
    for dt in [DType::BF16, DType::F16] {
        let (expert, prefix) = (plan(dt, 50, 626, true), plan(dt, 800, 800, true));
        let (expert_default, prefix_default) = (
            plan(dt, 50, 626, false).unwrap(),
            plan(dt, 800, 800, false).unwrap(),
        );
        if b.is_cuda() && sm80(k) {
            let splits = expert.unwrap().flash_splits();
            assert!(splits.is_some_and(|n| n > 1), "expert: split keys");
            // 100 blocks of rows: split so that about two blocks run on each SM.
            let prefix = prefix.unwrap();
            let prefix_splits = prefix.flash_splits().unwrap();
            // More than one block an SM: the form with one warp for every 16 rows.
            assert!(!prefix.flash_halves());
            assert!(
                (1..=13).contains(&prefix_splits),
                "prefix: {prefix_splits} splits"
            );
            // The default: the tensor-core kernel for few queries, the GEMM path for Gemma's
            // long prefix.
            assert!(expert_default.flash_splits().is_some_and(|n| n > 1));
            assert!(prefix_default.uses_gemm());
        } else {
            assert!(expert.is_err() && prefix.is_err(), "no tensor-core plan");
            assert_eq!(expert_default.flash_splits(), None);
            assert_eq!(prefix_default.uses_gemm(), b.is_cuda());
        }
        // The odd head dim 36 cannot run there.
        let (q, kk) = (t(dt, &[50, 8, 36]), t(dt, &[626, 1, 36]));
        let m = AttentionMask::full();
        assert!(k.attention_plan_flash(&q, &kk, &kk, &q, &m, 0.1).is_err());
    }
    // SigLIP's attention (256 keys, head dim 72) stages all its keys at once, in one split, on
    // sm_90 (whose blocks may have the 101 KiB that takes); a forced split count streams.
    let (sq, sk) = (
        t(DType::BF16, &[256, 16, 72]),
        t(DType::BF16, &[256, 16, 72]),
    );
    let m = AttentionMask::full();
    let siglip = k.attention_plan(&sq, &sk, &sk, &sq, &m, 0.12).unwrap();
    let sm90 = k
        .target()
        .strip_prefix("sm_")
        .and_then(|a| a.parse::<u32>().ok())
        >= Some(90);
    assert_eq!(siglip.flash_resident(), b.is_cuda() && sm90);
    // The action expert's (626 keys, head dim 256) streams.
    let (eq, ek) = (
        t(DType::BF16, &[50, 8, 256]),
        t(DType::BF16, &[626, 1, 256]),
    );
    let expert = k.attention_plan(&eq, &ek, &ek, &eq, &m, 0.0625).unwrap();
    assert!(!expert.flash_resident());
    // In the halves form on sm_90, whose blocks may have its 131 KiB of shared memory (sm_86
    // and sm_89 give 99 KiB), unless the options say otherwise.
    assert_eq!(expert.flash_halves(), b.is_cuda() && sm90);
    let one_warp = Kernels::with_options(
        k.ctx(),
        KernelOptions {
            flash_halves: false,
            ..KernelOptions::default()
        },
    )
    .unwrap();
    let expert = one_warp
        .attention_plan(&eq, &ek, &ek, &eq, &m, 0.0625)
        .unwrap();
    assert!(!expert.flash_halves());
    assert_eq!(expert.flash_splits().is_some(), b.is_cuda() && sm80(k));
    if b.is_cuda() && sm90 {
        assert_eq!(siglip.flash_splits(), Some(1));
        let forced = k
            .attention_plan_flash_splits(&sq, &sk, &sk, &sq, &m, 0.12, 1)
            .unwrap();
        assert!(!forced.flash_resident());
    }
    // A forced split count, rounded to whole tiles of keys (17 tiles here).
    let (q, o) = (t(DType::BF16, &[50, 8, 256]), t(DType::BF16, &[50, 8, 256]));
    let kv = t(DType::BF16, &[1088, 1, 256]);
    let forced = |n| {
        let m = AttentionMask::full();
        k.attention_plan_flash_splits(&q, &kv, &kv, &o, &m, 0.0625, n)
    };
    assert!(forced(0).is_err());
    if b.is_cuda() && sm80(k) {
        assert_eq!(forced(1).unwrap().flash_splits(), Some(1));
        assert_eq!(forced(4).unwrap().flash_splits(), Some(4));
        assert_eq!(forced(17).unwrap().flash_splits(), Some(17));
        assert_eq!(forced(40).unwrap().flash_splits(), Some(17));
        // 16 splits of 2 tiles each would leave the last empty: 9 splits.
        assert_eq!(forced(16).unwrap().flash_splits(), Some(9));
    } else {
        assert!(forced(4).is_err(), "no tensor-core plan");
    }
    let f32_plan = plan(DType::F32, 50, 626, false).unwrap();
    assert_eq!(f32_plan.flash_splits(), None);
    assert_eq!(f32_plan.uses_gemm(), b.is_cuda());
    assert!(plan(DType::F32, 50, 626, true).is_err());
}

/// Attentions planned alike over rows one after the other in shared buffers (SigLIP's views:
/// q, k and v as column ranges of one packed projection) run as one launch on CUDA with the
/// same results as one plan each; the host has no batched plan.
fn attention_batch(b: &Backend) {
    let (k, s) = (&b.k, b.s);
    let (views, tokens, heads, d) = (3usize, 96usize, 4usize, 72usize);
    let width = heads * d;
    let mut rng = Rng::new(17);
    for dt in [DType::BF16, DType::F16] {
        let qkv = Tensor::alloc(k.ctx(), "qkv", dt, &[views * tokens, 3 * width]).unwrap();
        qkv.write_f32(s, &rng.vec(views * tokens * 3 * width, 2.0))
            .unwrap();
        let outs =
            [0, 1].map(|_| Tensor::alloc(k.ctx(), "o", dt, &[views * tokens, width]).unwrap());
        let rows = |t: &Tensor, v: usize, col: usize| {
            let w = t.shape()[1];
            Tensor::with_layout(
                t.buffer(),
                dt,
                &[tokens, heads, d],
                &[w, d, 1],
                v * tokens * w + col,
            )
            .unwrap()
        };
        let plans = |out: &Tensor| -> Vec<frt_kernels::AttentionPlan> {
            (0..views)
                .map(|v| {
                    k.attention_plan(
                        &rows(&qkv, v, 0),
                        &rows(&qkv, v, width),
                        &rows(&qkv, v, 2 * width),
                        &rows(out, v, 0),
                        &AttentionMask::full(),
                        0.12,
                    )
                    .unwrap()
                })
                .collect()
        };
        let (each, merged) = (plans(&outs[0]), plans(&outs[1]));
        let batch = k.attention_plan_batch(&merged).unwrap();
        for o in &outs {
            o.write_f32(s, &vec![f32::NAN; views * tokens * width])
                .unwrap();
        }
        each.iter().for_each(|p| p.run(k, s).unwrap());
        let cuda_batch = b.is_cuda() && sm80(k) && each[0].flash_splits().is_some();
        if !cuda_batch {
            assert!(
                batch.is_none(),
                "no batched plan without the tensor-core path"
            );
            continue;
        }
        let batch = batch.expect("views planned alike batch");
        assert!(batch.flash_splits().is_some());
        batch.run(k, s).unwrap();
        // Only some of the plans: no batch; plans over other buffers: no batch.
        assert!(k.attention_plan_batch(&merged[..1]).unwrap().is_none());
        let (mut each, mut merged) = (each, merged);
        let mixed = [each.swap_remove(0), merged.swap_remove(1)];
        assert!(k.attention_plan_batch(&mixed).unwrap().is_none());
        let (a, c) = (outs[0].read_f32(s).unwrap(), outs[1].read_f32(s).unwrap());
        let tol = if dt == DType::BF16 { 2e-2 } else { 4e-3 };
        for (i, (x, y)) in a.iter().zip(&c).enumerate() {
            assert!(
                x.is_finite() && y.is_finite(),
                "{dt:?} element {i}: {x} / {y}"
            );
            assert!(
                (x - y).abs() <= tol * (1.0 + x.abs()),
                "{dt:?} element {i}: {x} vs {y}"
            );
        }
        assert!(
            a.iter().any(|x| x.abs() > 0.05),
            "outputs are not all near zero"
        );
    }
}

fn conv(b: &Backend) {
    let mut rng = Rng::new(8);
    // Whisper's stem: conv1 (80 -> width, stride 1) and conv2 (stride 2); small and real.
    for &(t_in, c_in, c_out, stride, big) in &[
        (9usize, 3usize, 4usize, 1usize, false),
        (10, 5, 6, 2, false),
        (3000, 80, 384, 1, true),
        (3000, 384, 384, 2, true),
    ] {
        if !size_ok(b, big) {
            continue;
        }
        let t_out = (t_in + 2 - 3) / stride + 1;
        for dt in FLOATS {
            let direct = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                k.conv1d(s, &i[0], &i[1], &i[2], o, stride, 1)
            };
            let planned = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                Conv1d::new(k, &i[0], &i[1], o, stride, 1)?.run(k, s, &i[0], &i[1], &i[2], o)
            };
            let reference = |v: &Vals| {
                (0..t_out * c_out)
                    .map(|e| {
                        let (t, o) = (e / c_out, e % c_out);
                        let mut acc = v.f[2][o];
                        for r in 0..3 {
                            let ti = (t * stride + r) as isize - 1;
                            if ti >= 0 && (ti as usize) < t_in {
                                for ci in 0..c_in {
                                    acc += v.f[1][(o * c_in + ci) * 3 + r]
                                        * v.f[0][ti as usize * c_in + ci];
                                }
                            }
                        }
                        acc
                    })
                    .collect()
            };
            let inputs = vec![
                Input::F(vec![t_in, c_in], rng.vec(t_in * c_in, 1.0)),
                Input::F(vec![c_out, c_in, 3], rng.vec(c_out * c_in * 3, 0.5)),
                Input::F(vec![c_out], rng.vec(c_out, 0.5)),
            ];
            for (form, op) in [
                (
                    "direct",
                    &direct as &dyn Fn(&Kernels, _, &[Tensor], &Tensor) -> _,
                ),
                ("im2col+gemm", &planned),
            ] {
                run(
                    b,
                    &Case {
                        name: format!("conv1d ({form}) {t_in}x{c_in}->{c_out} s{stride}"),
                        dtype: dt,
                        inputs: inputs.clone(),
                        out: (vec![t_out, c_out], dt),
                        op,
                        reference: &reference,
                        f32_tol: 1e-5,
                    },
                );
            }
        }
    }
    // Patch embedding: 2 images 8x8x3 with 4x4 patches (and SigLIP's 224/14 on CUDA).
    for &(n, hw, c, p, width, big) in &[
        (2usize, 8usize, 3usize, 4usize, 5usize, false),
        (2, 224, 3, 14, 1152, true),
    ] {
        if !size_ok(b, big) {
            continue;
        }
        let (g, len) = ((hw / p) * (hw / p), c * p * p);
        for dt in FLOATS {
            let op = |k: &Kernels, s, i: &[Tensor], o: &Tensor| {
                let patches = Tensor::alloc(k.ctx(), "patches", i[0].dtype(), &[n * g, len])?;
                let pe = PatchEmbed::new(k, &i[0], &patches, &i[1], o, p)?;
                pe.run(k, s, &i[0], &patches, &i[1], &i[2], &i[3], o)
            };
            let reference = |v: &Vals| {
                (0..n * g * width)
                    .map(|e| {
                        let (patch, o) = (e / width, e % width);
                        let (img, py, px) = (patch / g, (patch % g) / (hw / p), patch % (hw / p));
                        let mut acc = v.f[2][o] + v.f[3][(patch % g) * width + o];
                        for ch in 0..c {
                            for ky in 0..p {
                                for kx in 0..p {
                                    let pix = v.f[0]
                                        [((img * hw + py * p + ky) * hw + px * p + kx) * c + ch];
                                    acc += pix * v.f[1][o * len + (ch * p + ky) * p + kx];
                                }
                            }
                        }
                        acc
                    })
                    .collect()
            };
            let inputs = vec![
                Input::F(vec![n, hw, hw, c], rng.vec(n * hw * hw * c, 1.0)),
                Input::F(vec![width, len], rng.vec(width * len, 0.2)),
                Input::F(vec![width], rng.vec(width, 0.5)),
                Input::F(vec![g, width], rng.vec(g * width, 0.5)),
            ];
            run(
                b,
                &Case {
                    name: format!("patch_embed {n}x{hw}x{hw}x{c} p{p} -> {width}"),
                    dtype: dt,
                    inputs,
                    out: (vec![n * g, width], dt),
                    op: &op,
                    reference: &reference,
                    f32_tol: 1e-5,
                },
            );
        }
    }
}

/// Greedy decoding's reduction: the arg-max (first on ties) and its log-softmax, with a mask.
fn argmax(b: &Backend) {
    let mut rng = Rng::new(9);
    for &(rows, n, big) in &[
        (1usize, 10usize, false),
        (3, 1000, false),
        (1, 51864, true),
        (4, 51865, true),
    ] {
        if !size_ok(b, big) {
            continue;
        }
        let mut x = rng.vec(rows * n, 8.0);
        x[n / 2] = 50.0; // a clear winner in row 0 ...
        x[n / 3] = 50.0; // ... tied with an earlier index, which must win
        let mut mask = vec![0f32; n];
        for i in (0..n).step_by(7) {
            mask[i] = f32::NEG_INFINITY;
        }
        for masked in [false, true] {
            let ctx = b.k.ctx();
            let logits = Tensor::alloc(ctx, "logits", DType::F32, &[rows, n]).unwrap();
            logits.write_f32(b.s, &x).unwrap();
            let m = Tensor::alloc(ctx, "mask", DType::F32, &[n]).unwrap();
            m.write_f32(b.s, &mask).unwrap();
            let idx = Tensor::alloc(ctx, "idx", DType::I32, &[rows]).unwrap();
            let lp = Tensor::alloc(ctx, "lp", DType::F32, &[rows]).unwrap();
            b.k.argmax_logsoftmax(b.s, &logits, masked.then_some(&m), &idx, &lp)
                .unwrap();
            let (gi, gl) = (idx.read_i32(b.s).unwrap(), lp.read_f32(b.s).unwrap());
            for r in 0..rows {
                let row: Vec<f64> = (0..n)
                    .map(|c| x[r * n + c] as f64 + if masked { mask[c] as f64 } else { 0.0 })
                    .collect();
                let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let want_i = row.iter().position(|v| *v == mx).unwrap();
                let lse = mx + row.iter().map(|v| (v - mx).exp()).sum::<f64>().ln();
                assert_eq!(
                    gi[r] as usize, want_i,
                    "[{}] row {r} n {n} masked {masked}",
                    b.name
                );
                assert!(
                    (gl[r] as f64 - (mx - lse)).abs() < 1e-4,
                    "[{}] logprob {} vs {}",
                    b.name,
                    gl[r],
                    mx - lse
                );
            }
        }
    }
}

/// Bad shapes and dtypes are errors at enqueue time, never a crash.
/// Bits of a tensor's values (exact for every float dtype read as f32).
fn bits(t: &Tensor, s: frt_exec::Stream) -> Vec<u32> {
    t.read_f32(s).unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Fused ops give exactly what the ops they fuse give, on the same backend (those ops are
/// checked against f64 references above).
fn fused_ops(b: &Backend) {
    let (k, s, ctx) = (&b.k, b.s, b.k.ctx());
    let mut rng = Rng::new(12);
    // The residual, the normalized output and its widened twin, bit for bit.
    let same_bits = |what: &str, pairs: [(&Tensor, &Tensor); 3]| {
        for ((a, b), part) in pairs.into_iter().zip(["residual", "normalized", "widened"]) {
            assert_eq!(bits(a, s), bits(b, s), "{what}: {part}");
        }
    };
    let up = |dt, shape: &[usize], v: &[f32]| {
        let t = Tensor::alloc(ctx, "t", dt, shape).unwrap();
        t.write_f32(s, v).unwrap();
        t
    };
    // residual_ada_rms_norm = gated_residual, then ada_rms_norm.
    for &(rows, cols, big) in ROW_SHAPES {
        if !size_ok(b, big) {
            continue;
        }
        for dt in FLOATS {
            for per_row in [false, true] {
                let mrows = if per_row { rows } else { 1 };
                let x = rng.vec(rows * cols, 2.0);
                let y = rng.vec(rows * cols, 2.0);
                let m = rng.vec(mrows * 3 * cols, 0.5);
                let gate_src = up(dt, &[mrows, 3 * cols], &m);
                let gate = gate_src.narrow(1, 2 * cols, cols).unwrap();
                let (x1, x2) = (up(dt, &[rows, cols], &x), up(dt, &[rows, cols], &x));
                let (yt, mt) = (up(dt, &[rows, cols], &y), up(dt, &[mrows, 3 * cols], &m));
                let (o1, o2) = (up(dt, &[rows, cols], &x), up(dt, &[rows, cols], &x));
                k.gated_residual(s, &x1, &yt, &gate, &x1).unwrap();
                k.ada_rms_norm(s, &x1, &mt, &o1, 1e-6).unwrap();
                let g = k
                    .residual_ada_rms_norm(s, &x2, &yt, &gate, &mt, &o2, 1e-6)
                    .unwrap();
                assert_eq!(g.ptr(), mt.ptr() + (2 * cols * dt.size()) as u64);
                let what = format!("residual_ada_rms_norm {rows}x{cols} {dt:?} per_row={per_row}");
                assert_eq!(bits(&x1, s), bits(&x2, s), "{what}: residual");
                assert_eq!(bits(&o1, s), bits(&o2, s), "{what}: normalized");
            }
        }
    }
    // residual_ada_rms_norm of f32 partial sums = of their sum in part order, rounded to the
    // dtype: bit for bit.
    for &(rows, cols, big) in ROW_SHAPES {
        if !size_ok(b, big) {
            continue;
        }
        for dt in FLOATS {
            for parts in [1, 3, 8] {
                let x = rng.vec(rows * cols, 2.0);
                let p = rng.vec(parts * rows * cols, 2.0);
                let m = rng.vec(3 * cols, 0.5);
                let sum: Vec<f32> = (0..rows * cols)
                    .map(|e| (1..parts).fold(p[e], |a, q| a + p[q * rows * cols + e]))
                    .collect();
                let mt = up(dt, &[1, 3 * cols], &m);
                let gate = mt.narrow(1, 2 * cols, cols).unwrap();
                let (x1, x2) = (up(dt, &[rows, cols], &x), up(dt, &[rows, cols], &x));
                let (o1, o2) = (up(dt, &[rows, cols], &x), up(dt, &[rows, cols], &x));
                let (w1, w2) = (
                    up(DType::F32, &[rows, cols], &x),
                    up(DType::F32, &[rows, cols], &x),
                );
                let y = up(dt, &[rows, cols], &sum);
                let partials = up(DType::F32, &[parts, rows, cols], &p);
                k.residual_ada_rms_norm_widened(s, &x1, &y, &gate, &mt, &o1, &w1, 1e-6)
                    .unwrap();
                k.residual_ada_rms_norm_widened(s, &x2, &partials, &gate, &mt, &o2, &w2, 1e-6)
                    .unwrap();
                let what = format!("residual_ada_rms_norm {rows}x{cols} {dt:?} of {parts} parts");
                same_bits(&what, [(&x1, &x2), (&o1, &o2), (&w1, &w2)]);
            }
        }
    }
    // residual_rms_norm_parts = add of the parts' sum in part order, rounded to the dtype,
    // then rms_norm: bit for bit.
    for &(rows, cols, big) in ROW_SHAPES {
        if !size_ok(b, big) {
            continue;
        }
        for dt in FLOATS {
            for parts in [1, 2, 4, 8] {
                let x = rng.vec(rows * cols, 2.0);
                let p = rng.vec(parts * rows * cols, 2.0);
                let w = rng.vec(cols, 0.5);
                let sum: Vec<f32> = (0..rows * cols)
                    .map(|e| (1..parts).fold(p[e], |a, q| a + p[q * rows * cols + e]))
                    .collect();
                let wt = up(dt, &[cols], &w);
                let (x1, x2) = (up(dt, &[rows, cols], &x), up(dt, &[rows, cols], &x));
                let (o1, o2) = (up(dt, &[rows, cols], &x), up(dt, &[rows, cols], &x));
                let y = up(dt, &[rows, cols], &sum);
                let partials = up(DType::F32, &[parts, rows, cols], &p);
                k.add(s, &x1, &y, &x1).unwrap();
                k.rms_norm(s, &x1, &wt, &o1, 1e-6).unwrap();
                k.residual_rms_norm_parts(s, &x2, &partials, &wt, &o2, 1e-6)
                    .unwrap();
                let what = format!("residual_rms_norm_parts {rows}x{cols} {dt:?} of {parts} parts");
                assert_eq!(bits(&x1, s), bits(&x2, s), "{what}: residual");
                assert_eq!(bits(&o1, s), bits(&o2, s), "{what}: normalized");
            }
        }
    }
    // Partial sums are contiguous f32 [parts, ..x's shape].
    if size_ok(b, false) {
        let x = up(DType::BF16, &[4, 8], &[0.5; 32]);
        let mt = up(DType::BF16, &[1, 24], &[0.1; 24]);
        let gate = mt.narrow(1, 16, 8).unwrap();
        for bad in [
            up(DType::F32, &[2, 4, 16], &[0.5; 128])
                .narrow(2, 0, 8)
                .unwrap(),
            up(DType::F32, &[2, 8, 4], &[0.5; 64]),
            up(DType::BF16, &[2, 4, 8], &[0.5; 64]),
        ] {
            assert!(
                k.residual_ada_rms_norm(s, &x, &bad, &gate, &mt, &x, 1e-6)
                    .is_err(),
                "{bad:?}"
            );
            let w = up(DType::BF16, &[8], &[0.1; 8]);
            assert!(
                k.residual_rms_norm_parts(s, &x, &bad, &w, &x, 1e-6)
                    .is_err(),
                "{bad:?}"
            );
        }
    }
    // ada_rms_norm_from = cast of x32 into x, then ada_rms_norm; residual_ada_rms_norm_widened
    // = residual_ada_rms_norm, then a cast of its output to f32: bit for bit.
    for &(rows, cols, big) in ROW_SHAPES {
        if !size_ok(b, big) {
            continue;
        }
        for dt in FLOATS {
            let x32v = rng.vec(rows * cols, 2.0);
            let m = rng.vec(3 * cols, 0.5);
            let x32 = up(DType::F32, &[rows, cols], &x32v);
            let mt = up(dt, &[1, 3 * cols], &m);
            let (x1, x2) = (up(dt, &[rows, cols], &x32v), up(dt, &[rows, cols], &x32v));
            let (o1, o2) = (up(dt, &[rows, cols], &x32v), up(dt, &[rows, cols], &x32v));
            x1.write_f32(s, &vec![0.0; rows * cols]).unwrap();
            x2.write_f32(s, &vec![0.0; rows * cols]).unwrap();
            k.cast(s, &x32, &x1).unwrap();
            k.ada_rms_norm(s, &x1, &mt, &o1, 1e-6).unwrap();
            k.ada_rms_norm_from(s, &x32, &x2, &mt, &o2, 1e-6).unwrap();
            let what = format!("ada_rms_norm_from {rows}x{cols} {dt:?}");
            assert_eq!(bits(&x1, s), bits(&x2, s), "{what}: x");
            assert_eq!(bits(&o1, s), bits(&o2, s), "{what}: normalized");
            let y = up(dt, &[rows, cols], &rng.vec(rows * cols, 2.0));
            let gate = mt.narrow(1, 2 * cols, cols).unwrap();
            let (w1, w2) = (
                up(DType::F32, &[rows, cols], &x32v),
                up(DType::F32, &[rows, cols], &x32v),
            );
            k.residual_ada_rms_norm(s, &x1, &y, &gate, &mt, &o1, 1e-6)
                .unwrap();
            k.cast(s, &o1, &w1).unwrap();
            k.residual_ada_rms_norm_widened(s, &x2, &y, &gate, &mt, &o2, &w2, 1e-6)
                .unwrap();
            let what = format!("residual_ada_rms_norm_widened {rows}x{cols} {dt:?}");
            same_bits(&what, [(&x1, &x2), (&o1, &o2), (&w1, &w2)]);
        }
    }
    // The f32 twins must be f32 with their partner's row layout.
    if size_ok(b, false) {
        let x = up(DType::BF16, &[4, 8], &[0.5; 32]);
        let mt = up(DType::BF16, &[1, 24], &[0.1; 24]);
        let bad = [
            up(DType::BF16, &[4, 8], &[0.5; 32]),
            up(DType::F32, &[2, 16], &[0.5; 32]),
        ];
        for x32 in &bad {
            assert!(
                k.ada_rms_norm_from(s, x32, &x, &mt, &x, 1e-6).is_err(),
                "{x32:?}"
            );
        }
    }
    // rope_qkv = rope of the q and k heads, and a copy of the v heads; outputs are row views
    // of larger tensors (as a key/value cache is).
    for &(tokens, hq, hk, d) in &[
        (3usize, 2usize, 1usize, 8usize),
        (50, 8, 1, 256),
        (7, 4, 2, 6),
    ] {
        for dt in FLOATS {
            let w = (hq + 2 * hk) * d;
            let qkv_v = rng.vec(tokens * w, 2.0);
            let pos_v: Vec<i32> = (0..tokens).map(|i| (i * 7 % 23) as i32 + 3).collect();
            let qkv = up(dt, &[tokens, w], &qkv_v);
            let pos = Tensor::alloc(ctx, "pos", DType::I32, &[tokens]).unwrap();
            pos.write_i32(s, &pos_v).unwrap();
            let q = up(dt, &[tokens, hq * d], &vec![f32::NAN; tokens * hq * d]);
            let kc = up(
                dt,
                &[tokens + 5, hk * d],
                &vec![f32::NAN; (tokens + 5) * hk * d],
            );
            let vc = up(
                dt,
                &[tokens + 5, hk * d],
                &vec![f32::NAN; (tokens + 5) * hk * d],
            );
            let (kr, vr) = (
                kc.narrow(0, 2, tokens).unwrap(),
                vc.narrow(0, 2, tokens).unwrap(),
            );
            k.rope_qkv(s, &qkv, &pos, &q, &kr, &vr, d, 10_000.0)
                .unwrap();
            let part = |from: usize, n: usize| -> Vec<f32> {
                qkv_v
                    .chunks(w)
                    .flat_map(|row| row[from * d..(from + n) * d].to_vec())
                    .collect()
            };
            let roped = |from: usize, n: usize| {
                let x = up(dt, &[tokens, n, d], &part(from, n));
                let o = up(dt, &[tokens, n, d], &vec![0.0; tokens * n * d]);
                k.rope(s, &x, &pos, &o, 10_000.0).unwrap();
                bits(&o, s)
            };
            let what = format!("rope_qkv {tokens}x({hq}+{hk}+{hk})x{d} {dt:?}");
            assert_eq!(bits(&q, s), roped(0, hq), "{what}: q");
            assert_eq!(bits(&kr, s), roped(hq, hk), "{what}: k");
            let v_want = up(dt, &[tokens, hk * d], &part(hq + hk, hk));
            assert_eq!(bits(&vr, s), bits(&v_want, s), "{what}: v");
            // Rows around the view are untouched.
            let kall = kc.read_f32(s).unwrap();
            assert!(
                kall[..2 * hk * d].iter().all(|v| v.is_nan()),
                "{what}: rows before"
            );
            assert!(
                kall[(tokens + 2) * hk * d..].iter().all(|v| v.is_nan()),
                "{what}: rows after"
            );
        }
    }
    let t = |dt, shape: &[usize]| Tensor::alloc(ctx, "t", dt, shape).unwrap();
    let qkv = t(DType::F32, &[4, 32]);
    let pos = t(DType::I32, &[4]);
    assert!(
        k.rope_qkv(
            s,
            &qkv,
            &pos,
            &t(DType::F32, &[4, 16]),
            &t(DType::F32, &[4, 8]),
            &t(DType::F32, &[4, 4]),
            4,
            1e4
        )
        .is_err(),
        "k and v widths differ"
    );
    assert!(
        k.rope_qkv(
            s,
            &qkv,
            &pos,
            &t(DType::F32, &[4, 16]),
            &t(DType::F32, &[4, 8]),
            &t(DType::F32, &[4, 8]),
            3,
            1e4
        )
        .is_err(),
        "odd head size"
    );
    assert!(
        k.rope_qkv(
            s,
            &qkv,
            &t(DType::I32, &[3]),
            &t(DType::F32, &[4, 16]),
            &t(DType::F32, &[4, 8]),
            &t(DType::F32, &[4, 8]),
            4,
            1e4
        )
        .is_err(),
        "positions length"
    );
    let x = t(DType::F32, &[4, 8]);
    assert!(
        k.residual_ada_rms_norm(
            s,
            &x,
            &t(DType::F32, &[4, 8]),
            &t(DType::F32, &[2, 8]),
            &t(DType::F32, &[1, 24]),
            &x,
            1e-6
        )
        .is_err(),
        "gate rows"
    );
    ctx.sync_stream(s).unwrap();
}

fn rejects_bad_arguments(b: &Backend) {
    let (k, s, ctx) = (&b.k, b.s, b.k.ctx());
    let t = |dt, shape: &[usize]| Tensor::alloc(ctx, "t", dt, shape).unwrap();
    let x = t(DType::F32, &[4, 8]);
    assert!(
        k.silu(s, &x, &t(DType::BF16, &[4, 8])).is_err(),
        "dtype mismatch"
    );
    assert!(
        k.silu(s, &x, &t(DType::F32, &[4, 9])).is_err(),
        "size mismatch"
    );
    assert!(
        k.add(s, &x, &t(DType::F32, &[3, 8]), &x).is_err(),
        "rows mismatch"
    );
    assert!(
        k.rms_norm(s, &x, &t(DType::F32, &[7]), &x, 1e-6).is_err(),
        "weight length"
    );
    assert!(
        k.ada_rms_norm(s, &x, &t(DType::F32, &[2, 24]), &x, 1e-6)
            .is_err(),
        "modulation rows"
    );
    assert!(
        k.silu(s, &t(DType::I32, &[4]), &t(DType::I32, &[4]))
            .is_err(),
        "ints are not floats"
    );
    assert!(
        k.gemm(
            &x,
            &t(DType::F32, &[9, 3]),
            &t(DType::F32, &[4, 3]),
            GemmOptions::default(),
        )
        .is_err(),
        "inner dims"
    );
    let g = k
        .gemm(
            &x,
            &t(DType::F32, &[8, 3]),
            &t(DType::F32, &[4, 3]),
            GemmOptions::default(),
        )
        .unwrap();
    assert!(
        g.run(
            s,
            &x,
            &t(DType::F32, &[8, 3]),
            &t(DType::F32, &[4, 3]),
            Some(&t(DType::F32, &[3]))
        )
        .is_err(),
        "bias not planned"
    );
    assert!(
        g.run(
            s,
            &t(DType::F32, &[5, 8]),
            &t(DType::F32, &[8, 3]),
            &t(DType::F32, &[4, 3]),
            None
        )
        .is_err(),
        "layout differs from the plan"
    );
    let q = t(DType::F32, &[2, 4, 16]);
    assert!(
        k.attention(
            s,
            &q,
            &t(DType::F32, &[3, 3, 16]),
            &t(DType::F32, &[3, 3, 16]),
            &q,
            &AttentionMask::full(),
            0.25
        )
        .is_err(),
        "4 heads over 3 kv heads"
    );
    assert!(
        k.attention(
            s,
            &q,
            &t(DType::F32, &[3, 1, 16]),
            &t(DType::F32, &[3, 1, 16]),
            &q,
            &AttentionMask::valid(&t(DType::F32, &[1])),
            0.25
        )
        .is_err(),
        "valid length must be i32"
    );
    assert!(
        k.rope(
            s,
            &t(DType::F32, &[2, 7]),
            &t(DType::I32, &[2]),
            &t(DType::F32, &[2, 7]),
            1e4
        )
        .is_err(),
        "odd rope dim"
    );
    assert!(
        k.conv1d(
            s,
            &t(DType::F32, &[1, 3]),
            &t(DType::F32, &[4, 3, 3]),
            &t(DType::F32, &[4]),
            &t(DType::F32, &[1, 4]),
            2,
            0
        )
        .is_err(),
        "too short for the kernel"
    );
    let other = frt_exec::Ctx::host().unwrap();
    let foreign = Tensor::alloc(&other, "f", DType::F32, &[4, 8]).unwrap();
    assert!(
        k.silu(s, &foreign, &x).is_err(),
        "tensor of another context"
    );
    assert!(
        Tensor::new(x.buffer(), DType::F32, &[4, 9]).is_err(),
        "view larger than its buffer"
    );
    assert!(x.narrow(1, 6, 3).is_err(), "narrow past the end");
    b.k.ctx().sync_stream(s).unwrap();
}

/// `rope_qkv_table` (the angles read from a `RopeTable`) gives the bits of `rope_qkv` at the
/// table's positions: the action expert's shape (50 tokens, 8 q heads and one kv head of 256,
/// the k and v rows a cache's), a smaller one with two kv heads, every float dtype; then the
/// table again after its positions change. Also the angles against f64, and tables that do
/// not fit.
fn rope_table(b: &Backend) {
    let (k, s, ctx) = (&b.k, b.s, b.k.ctx());
    let mut rng = Rng::new(41);
    let up = |dt, shape: &[usize], v: &[f32]| {
        let t = Tensor::alloc(ctx, "t", dt, shape).unwrap();
        t.write_f32(s, v).unwrap();
        t
    };
    // (tokens, q heads, kv heads, head dim, cache rows before the new ones)
    for &(tokens, hq, hkv, d, from) in &[(50, 8, 1, 256, 576), (13, 4, 2, 64, 7)] {
        for dt in FLOATS {
            let pos = Tensor::alloc(ctx, "pos", DType::I32, &[tokens]).unwrap();
            let table = k.rope_table(&pos, d, 10_000.0).unwrap();
            for round in 0..2 {
                let what =
                    format!("{tokens} tokens, {hq}/{hkv} heads of {d}, {dt:?}, round {round}");
                let positions: Vec<i32> = (0..tokens).map(|_| rng.below(1000) as i32).collect();
                pos.write_i32(s, &positions).unwrap();
                table.compute(k, s).unwrap();
                let qkv = up(
                    dt,
                    &[tokens, (hq + 2 * hkv) * d],
                    &rng.vec(tokens * (hq + 2 * hkv) * d, 2.0),
                );
                let nan = |shape: &[usize]| up(dt, shape, &vec![f32::NAN; shape.iter().product()]);
                let outs = || {
                    let (kc, vc) = (
                        nan(&[from + tokens, hkv * d]),
                        nan(&[from + tokens, hkv * d]),
                    );
                    (
                        nan(&[tokens, hq * d]),
                        kc.narrow(0, from, tokens).unwrap(),
                        vc.narrow(0, from, tokens).unwrap(),
                    )
                };
                let (q1, k1, v1) = outs();
                let (q2, k2, v2) = outs();
                k.rope_qkv(s, &qkv, &pos, &q1, &k1, &v1, d, 10_000.0)
                    .unwrap();
                k.rope_qkv_table(s, &qkv, &table, &q2, &k2, &v2).unwrap();
                for (x, y, n) in [(&q1, &q2, "q"), (&k1, &k2, "k"), (&v1, &v2, "v")] {
                    assert_eq!(bits(x, s), bits(y, s), "{what}: {n}");
                }
                // The projection as a split GEMM's f32 parts (1 to 3): the bits of
                // rope_qkv_table on their sum, added in part order and rounded to dt.
                let n = (hq + 2 * hkv) * d;
                for nparts in 1..=3 {
                    let pv = rng.vec(nparts * tokens * n, 2.0);
                    let sums: Vec<f32> = (0..tokens * n)
                        .map(|e| (1..nparts).fold(pv[e], |a, p| a + pv[p * tokens * n + e]))
                        .collect();
                    let parts = up(DType::F32, &[nparts, tokens, n], &pv);
                    let summed = up(dt, &[tokens, n], &sums);
                    let (q3, k3, v3) = outs();
                    let (q4, k4, v4) = outs();
                    k.rope_qkv_table(s, &summed, &table, &q3, &k3, &v3).unwrap();
                    k.rope_qkv_table_parts(s, &parts, &table, &q4, &k4, &v4)
                        .unwrap();
                    for (x, y, name) in [(&q3, &q4, "q"), (&k3, &k4, "k"), (&v3, &v4, "v")] {
                        assert_eq!(bits(x, s), bits(y, s), "{what}, {nparts} parts: {name}");
                    }
                }
            }
            // A table of other tokens, or of a head dim the rows are not made of, does not fit.
            let (q, kk, v) = (
                nan_free(k, dt, &[tokens, hq * d]),
                nan_free(k, dt, &[tokens, hkv * d]),
                nan_free(k, dt, &[tokens, hkv * d]),
            );
            let qkv = nan_free(k, dt, &[tokens, (hq + 2 * hkv) * d]);
            let short = Tensor::alloc(ctx, "pos", DType::I32, &[tokens - 1]).unwrap();
            let other_tokens = k.rope_table(&short, d, 10_000.0).unwrap();
            assert!(
                k.rope_qkv_table(s, &qkv, &other_tokens, &q, &kk, &v)
                    .is_err()
            );
            let other_dim = k.rope_table(&pos, d * 3 / 2, 10_000.0).unwrap();
            assert!(k.rope_qkv_table(s, &qkv, &other_dim, &q, &kk, &v).is_err());
            assert!(k.rope_qkv_table(s, &qkv, &table, &q, &kk, &v).is_ok());
            // Parts must be f32 [parts, tokens, N] of the outputs' N.
            let n = (hq + 2 * hkv) * d;
            for (parts, why) in [
                (nan_free(k, DType::F32, &[2, tokens, n]), None),
                (nan_free(k, DType::F32, &[tokens, n]), Some("parts")),
                (
                    nan_free(k, DType::F32, &[2, tokens, n + d]),
                    Some("must be"),
                ),
                (
                    nan_free(k, DType::F32, &[2, tokens - 1, n]),
                    Some("must be"),
                ),
            ] {
                let r = k.rope_qkv_table_parts(s, &parts, &table, &q, &kk, &v);
                match why {
                    None => r.unwrap(),
                    Some(w) => {
                        let e = r.expect_err("refused").to_string();
                        assert!(e.contains(w), "{e}");
                    }
                }
            }
            if dt != DType::F32 {
                let parts = nan_free(k, dt, &[2, tokens, n]);
                let e = k.rope_qkv_table_parts(s, &parts, &table, &q, &kk, &v);
                assert!(e.expect_err("refused").to_string().contains("parts"));
            }
        }
    }
    // The angles, against f64.
    let positions: Vec<i32> = (0..64).map(|_| rng.below(2000) as i32).collect();
    let pos = Tensor::alloc(ctx, "pos", DType::I32, &[64]).unwrap();
    pos.write_i32(s, &positions).unwrap();
    let table = k.rope_table(&pos, 256, 10_000.0).unwrap();
    table.compute(k, s).unwrap();
    let got = table.table().read_f32(s).unwrap();
    for (t, &p) in positions.iter().enumerate() {
        for i in 0..128 {
            let angle = p as f64 / 10_000f64.powf(2.0 * i as f64 / 256.0);
            let (sn, cs) = angle.sin_cos();
            let (gc, gs) = (
                got[2 * (t * 128 + i)] as f64,
                got[2 * (t * 128 + i) + 1] as f64,
            );
            // An f32 angle of up to 2000 radians is within 2.5e-4 of the true one.
            assert!(
                (gc - cs).abs() < 3e-4 && (gs - sn).abs() < 3e-4,
                "position {p}, pair {i}: ({gc}, {gs}) against ({cs}, {sn})"
            );
        }
    }
    assert!(k.rope_table(&pos, 255, 10_000.0).is_err(), "odd head dim");
    assert!(k.rope_table(&pos, 0, 10_000.0).is_err(), "no head dim");
}

/// A tensor of zeros.
fn nan_free(k: &Kernels, dt: DType, shape: &[usize]) -> Tensor {
    let t = Tensor::alloc(k.ctx(), "t", dt, shape).unwrap();
    t.write_f32(
        k.ctx().stream(0).unwrap(),
        &vec![0.0; shape.iter().product()],
    )
    .unwrap();
    t
}

backend_tests!(
    unary_ops,
    binary_ops,
    casts,
    norms,
    positional,
    gemm,
    gemm_f32_out,
    linear_split,
    geglu_linear,
    graphs_on_two_streams,
    attention,
    attention_paths,
    attention_batch,
    rope_table,
    conv,
    argmax,
    fused_ops,
    velocity_euler,
    rejects_bad_arguments
);

/// `Kernels::grid_barrier_probe` (a benchmark's probe of a persistent kernel's phase boundary):
/// every block arrives once a round, so after launches (plain and cooperative, eager and
/// replayed from a captured graph) the counter holds launches × rounds × blocks; a grid wider
/// than the SMs, no rounds and a short counter are refused, and the host backend refuses it
/// by name.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_grid_barrier_probe_counts_every_arrival() {
    let b = common::cuda();
    let (k, s) = (&b.k, b.s);
    let sync = Tensor::alloc(k.ctx(), "sync", DType::I32, &[2]).unwrap();
    let count = || {
        let v = sync.read_i32(s).unwrap();
        u64::from(v[0] as u32) | (u64::from(v[1] as u32) << 32)
    };
    // 128 blocks where the GPU has the SMs for them (H100 SXM, H200: 132), else 64 (the
    // counter must start at a multiple of the grid: zero).
    sync.write_i32(s, &[0, 0]).unwrap();
    let wide = if k.grid_barrier_probe(s, &sync, 128, 1, false).is_ok() {
        128
    } else {
        64
    };
    for (blocks, cooperative) in [(1, false), (7, true), (wide, false), (wide, true)] {
        sync.write_i32(s, &[0, 0]).unwrap();
        for _ in 0..3 {
            k.grid_barrier_probe(s, &sync, blocks, 5, cooperative)
                .unwrap();
        }
        assert_eq!(
            count(),
            3 * 5 * blocks as u64,
            "{blocks} blocks, cooperative {cooperative}"
        );
        let g = frt_exec::Graph::new(k.ctx(), "barriers", 1);
        g.capture(frt_exec::ShapeKey(0), |cs| {
            k.grid_barrier_probe(cs, &sync, blocks, 2, cooperative)
                .map_err(|e| frt_exec::Error::Invalid {
                    op: "capture",
                    reason: e.to_string(),
                })
        })
        .unwrap();
        for _ in 0..4 {
            g.replay(frt_exec::ShapeKey(0), s).unwrap();
        }
        assert_eq!(
            count(),
            (15 + 8) * blocks as u64,
            "{blocks} blocks replayed"
        );
    }
    assert!(k.grid_barrier_probe(s, &sync, 100_000, 1, true).is_err());
    assert!(k.grid_barrier_probe(s, &sync, 4, 0, false).is_err());
    let short = Tensor::alloc(k.ctx(), "short", DType::I32, &[1]).unwrap();
    assert!(k.grid_barrier_probe(s, &short, 4, 1, false).is_err());
    let host = common::host();
    let hs = Tensor::alloc(host.k.ctx(), "sync", DType::I32, &[2]).unwrap();
    let e = host
        .k
        .grid_barrier_probe(host.s, &hs, 1, 1, false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("grid_barrier_probe") && e.contains("CUDA"),
        "{e}"
    );
}

/// The comparison the op tests make sees an error in a small entry that a check normalised
/// by the largest entry lets through, and passes what is within tolerance.
#[test]
fn the_comparison_sees_errors_in_small_entries() {
    let want: Vec<f64> = (0..64)
        .map(|i| if i == 0 { 100.0 } else { 1.0 - i as f64 * 0.01 })
        .collect();
    let mut got: Vec<f32> = want.iter().map(|w| *w as f32).collect();
    assert!(common::check_elements(&got, &want, 1e-3).is_ok());
    // Entry 5 is off by 5 %: within 1e-3 of the largest entry, outside its own tolerance
    // (1e-3 of itself plus 1e-3 of the entries' root mean square, 12.4).
    got[5] *= 1.05;
    assert!(rel_err(&got, &want) <= 1e-3);
    let e = common::check_elements(&got, &want, 1e-3).unwrap_err();
    assert!(e.contains("1 of 64") && e.contains("worst at 5"), "{e}");
    // A NaN where a number is due fails; matching infinities pass.
    got[5] = f32::NAN;
    assert!(common::check_elements(&got, &want, 1e-3).is_err());
    let inf = [f64::NEG_INFINITY, 1.0];
    assert!(common::check_elements(&[f32::NEG_INFINITY, 1.0], &inf, 1e-3).is_ok());
    assert!(common::check_elements(&[0.0, 1.0], &inf, 1e-3).is_err());
}

/// The TMA ring probe (`Kernels::tma_ring_probe`, a benchmark's measurement) copies what it
/// is given: on Hopper, with bf16 weights of known bits, the sum it leaves (each chunk's first
/// 512 bytes of a stage, read a word a thread: rows 0 to 3 of the block's first box, 128 bytes
/// each, in swizzled order) is the sum of those words in memory, for every box height and
/// ring depth; arguments it cannot take are refused. Elsewhere it is refused by name.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_tma_ring_probe_copies_the_weights() {
    let b = common::cuda();
    let (k, s) = (&b.k, b.s);
    if k.target() != "sm_90" {
        eprintln!("not a Hopper GPU ({}): nothing to probe", k.target());
        return;
    }
    let (n, kk) = (256usize, 512usize);
    let mut rng = Rng::new(71);
    // Random finite bf16 numbers (every sign, exponent 1..=254, every mantissa), written
    // through f32 (exact) so that their bytes are known.
    let bits: Vec<u16> = (0..n * kk)
        .map(|_| {
            let (sign, exp, man) = (rng.below(2), 1 + rng.below(254), rng.below(128));
            (sign << 15 | exp << 7 | man) as u16
        })
        .collect();
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let w = Tensor::alloc(k.ctx(), "w", DType::BF16, &[n, kk]).unwrap();
    let values: Vec<f32> = bits
        .iter()
        .map(|&b| f32::from_bits(u32::from(b) << 16))
        .collect();
    w.write_f32(s, &values).unwrap();
    assert_eq!(w.read_f32(s).unwrap(), values, "bf16 values round-trip");
    let x = Tensor::alloc(k.ctx(), "x", DType::BF16, &[50, kk]).unwrap();
    x.write_f32(s, &vec![1.0; 50 * kk]).unwrap();
    let word = |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    // Rows 64b .. 64b + 3, chunk c's 128 bytes each (32 words), over every block and chunk.
    let mut want = 0u32;
    for blk in 0..n / 64 {
        for c in 0..kk / 64 {
            for r in 0..4 {
                for j in 0..32 {
                    want = want.wrapping_add(word(((64 * blk + r) * kk + 64 * c) / 2 + j));
                }
            }
        }
    }
    let sink = Tensor::alloc(k.ctx(), "sink", DType::I32, &[1]).unwrap();
    for (with_x, box_rows, stages) in [(false, 32, 8), (true, 32, 8), (false, 8, 3), (true, 64, 12)]
    {
        sink.write_i32(s, &[0]).unwrap();
        k.tma_ring_probe(s, &w, with_x.then_some(&x), box_rows, stages, &sink)
            .unwrap();
        let got = sink.read_i32(s).unwrap()[0] as u32;
        assert_eq!(
            got, want,
            "boxes of {box_rows} rows, {stages} stages, tokens {with_x}"
        );
    }
    for (box_rows, stages) in [(24, 8), (32, 0), (32, 13)] {
        assert!(
            k.tma_ring_probe(s, &w, None, box_rows, stages, &sink)
                .is_err()
        );
    }
    let odd = Tensor::alloc(k.ctx(), "odd", DType::BF16, &[100, kk]).unwrap();
    assert!(k.tma_ring_probe(s, &odd, None, 32, 8, &sink).is_err());
}

/// On Hopper the tensor-core attention's merge of its key splits is launched dependent
/// (`KernelOptions::pdl`): the attention kernel lets it start at once, so it must wait for
/// that kernel's partial rows. The action expert's attention (50 tokens of 8 heads over 626
/// keys, 10 splits), in both the halves and the one-warp form, runs rounds of new queries into
/// a poisoned output, reading each back, and every round must give the bits of plain launches:
/// a merge that read before the attention finished would merge the round before's rows.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_attention_merge_waits_for_the_splits() {
    let ctx = frt_exec::Ctx::cuda(0).expect("CUDA device 0 (this test needs a CUDA GPU)");
    let s = ctx.stream(0).unwrap();
    let (sq, sk, hq, d, prefix, valid) = (50, 626, 8, 256, 576, 552);
    let rounds = 12;
    let mut rng = Rng::new(83);
    let queries: Vec<Vec<f32>> = (0..rounds).map(|_| rng.vec(sq * hq * d, 2.0)).collect();
    let (kv, vv) = (rng.vec(sk * d, 1.0), rng.vec(sk * d, 1.0));
    for halves in [true, false] {
        let mut results: Vec<Vec<Vec<u32>>> = Vec::new();
        for pdl in [false, true] {
            let k = Kernels::with_options(
                &ctx,
                KernelOptions {
                    pdl,
                    flash_halves: halves,
                    ..KernelOptions::from_env().unwrap()
                },
            )
            .unwrap();
            if k.target() != "sm_90" {
                eprintln!(
                    "not a Hopper GPU ({}): nothing launched dependent",
                    k.target()
                );
                return;
            }
            let t = |name: &str, shape: &[usize]| {
                Tensor::alloc(&ctx, name, DType::BF16, shape).unwrap()
            };
            let (q, o) = (t("q", &[sq, hq, d]), t("o", &[sq, hq, d]));
            let (kt, vt) = (t("k", &[sk, 1, d]), t("v", &[sk, 1, d]));
            kt.write_f32(s, &kv).unwrap();
            vt.write_f32(s, &vv).unwrap();
            let len = Tensor::alloc(&ctx, "len", DType::I32, &[1]).unwrap();
            len.write_i32(s, &[valid]).unwrap();
            let mask = AttentionMask::prefix_suffix(&len, prefix);
            let plan = k
                .attention_plan_flash_splits(&q, &kt, &vt, &o, &mask, 0.0625, 10)
                .unwrap();
            assert_eq!(plan.flash_splits(), Some(10));
            assert_eq!(plan.flash_halves(), halves);
            let mut got = Vec::new();
            for qv in &queries {
                q.write_f32(s, qv).unwrap();
                o.write_f32(s, &vec![f32::NAN; sq * hq * d]).unwrap();
                plan.run(&k, s).unwrap();
                got.push(bits(&o, s));
            }
            results.push(got);
        }
        for (r, (plain, dependent)) in results[0].iter().zip(&results[1]).enumerate() {
            let differ = plain.iter().zip(dependent).filter(|(a, b)| a != b).count();
            assert_eq!(
                differ,
                0,
                "halves {halves}, round {r}: {differ} of {} outputs differ from plain launches",
                plain.len()
            );
        }
    }
}

#[test]
fn the_tma_ring_probe_is_refused_off_hopper() {
    let b = common::host();
    let w = Tensor::alloc(b.k.ctx(), "w", DType::BF16, &[64, 64]).unwrap();
    let sink = Tensor::alloc(b.k.ctx(), "sink", DType::I32, &[1]).unwrap();
    let e =
        b.k.tma_ring_probe(b.s, &w, None, 32, 8, &sink)
            .unwrap_err()
            .to_string();
    assert!(e.contains("sm_90"), "{e}");
}

/// `Tensor::read_f32_into` reads each tensor in turn into the same two buffers (a larger one,
/// then smaller ones of other dtypes, then a narrowed view): each read gives exactly its
/// tensor's values, as `read_f32` does.
#[test]
fn read_backs_into_reused_buffers_hold_each_tensor() {
    let b = common::host();
    let ctx = b.k.ctx();
    let (mut raw, mut out) = (Vec::new(), Vec::new());
    for (dt, n) in [(DType::F32, 1000), (DType::BF16, 300), (DType::F16, 7)] {
        // Whole numbers below 256: the same in every one of these dtypes.
        let v: Vec<f32> = (0..n).map(|i| (i % 250) as f32 - 3.0).collect();
        let t = Tensor::alloc(ctx, "x", dt, &[n]).unwrap();
        t.write_f32(b.s, &v).unwrap();
        t.read_f32_into(b.s, &mut raw, &mut out).unwrap();
        assert_eq!(out, t.read_f32(b.s).unwrap(), "{dt:?}");
        assert_eq!(out, v, "{dt:?}");
        let part = t.narrow(0, 2, 3).unwrap();
        part.read_f32_into(b.s, &mut raw, &mut out).unwrap();
        assert_eq!(out, v[2..5], "{dt:?}, narrowed");
    }
}
