//! The op test harness. Each test is written once:
//! * on the host backend it compares the op with a straightforward f64 reference;
//! * on CUDA it compares the op with the host backend, on the same inputs.
//!
//! Inputs are fresh random numbers each run (seed printed; `FRT_TEST_SEED` repeats one);
//! outputs are poisoned with NaN before every run; every case is also captured into a
//! graph, replayed, and must equal the eager result bit for bit.
#![allow(dead_code)]

use frt_exec::{Ctx, Graph, ShapeKey, Stream};
use frt_kernels::{DType, Kernels, Tensor};
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Backend {
    pub name: &'static str,
    pub k: Kernels,
    pub s: Stream,
    /// On CUDA: the host backend that serves as the reference.
    pub host: Option<Box<Backend>>,
}

pub fn host() -> Backend {
    let ctx = Ctx::host().unwrap();
    let s = ctx.stream(0).unwrap();
    Backend {
        name: "host",
        k: Kernels::new(&ctx).unwrap(),
        s,
        host: None,
    }
}

pub fn cuda() -> Backend {
    let ctx = Ctx::cuda(0).expect("CUDA device 0 (this test needs a CUDA GPU)");
    let s = ctx.stream(0).unwrap();
    // The options from the environment (FRT_ATTENTION=gemm etc.: the suite on another path).
    let options = frt_kernels::KernelOptions::from_env().expect("kernel options");
    let k = Kernels::with_options(&ctx, options).expect("the CUDA kernels compile and load");
    Backend {
        name: "cuda",
        k,
        s,
        host: Some(Box::new(host())),
    }
}

impl Backend {
    pub fn is_cuda(&self) -> bool {
        self.host.is_some()
    }
}

/// Instantiates each `fn(&Backend)` for the host backend and (ignored) for CUDA.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        mod host {
            $( #[test] fn $name() { super::$name(&$crate::common::host()) } )*
        }
        /// `cargo test -p frt-kernels -- --ignored` on a machine with a GPU.
        mod cuda {
            $( #[test] #[ignore = "needs a CUDA GPU"] fn $name() { super::$name(&$crate::common::cuda()) } )*
        }
    };
}

// ------------------------------------------------------------------ random inputs

static SEED: AtomicU64 = AtomicU64::new(0);

fn seed() -> u64 {
    let s = SEED.load(Ordering::Relaxed);
    if s != 0 {
        return s;
    }
    let s = std::env::var("FRT_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    SEED.store(s, Ordering::Relaxed);
    eprintln!("FRT_TEST_SEED={s}");
    s
}

/// A small PCG-style generator.
pub struct Rng(u64);

impl Rng {
    pub fn new(salt: u64) -> Rng {
        Rng(seed() ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 ^ (self.0 >> 22)) >> (22 + (self.0 >> 61))) as u32
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        self.next_u32() as f32 / 2_147_483_648.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
    pub fn below(&mut self, n: u32) -> u32 {
        self.next_u32() % n
    }
}

// ------------------------------------------------------------------ inputs and cases

/// One input of a case: values (stored in the case's dtype, or i32).
#[derive(Clone)]
pub enum Input {
    F(Vec<usize>, Vec<f32>),
    /// A float input of an explicit dtype (e.g. f32 next to bf16 operands).
    FD(DType, Vec<usize>, Vec<f32>),
    I(Vec<usize>, Vec<i32>),
    /// Bytes (a u8 tensor, e.g. an attention key mask); their values go to `Vals::i` too.
    U8(Vec<usize>, Vec<u8>),
}

/// The inputs as the op sees them: float values rounded to their dtype.
pub struct Vals {
    pub f: Vec<Vec<f64>>,
    pub i: Vec<Vec<i32>>,
}

fn make(b: &Backend, dt: DType, inputs: &[Input]) -> (Vec<Tensor>, Vals) {
    let ctx = b.k.ctx();
    let mut ts = Vec::new();
    let mut vals = Vals {
        f: Vec::new(),
        i: Vec::new(),
    };
    for (n, inp) in inputs.iter().enumerate() {
        match inp {
            Input::F(shape, v) | Input::FD(_, shape, v) => {
                let d = if let Input::FD(d, ..) = inp { *d } else { dt };
                let t = Tensor::alloc(ctx, &format!("in{n}"), d, shape).unwrap();
                t.write_f32(b.s, v).unwrap();
                vals.f.push(
                    t.read_f32(b.s)
                        .unwrap()
                        .into_iter()
                        .map(f64::from)
                        .collect(),
                );
                ts.push(t);
            }
            Input::U8(shape, v) => {
                let t = Tensor::alloc(ctx, &format!("in{n}"), DType::U8, shape).unwrap();
                t.buffer().upload(b.s, 0, v).unwrap();
                vals.i.push(v.iter().map(|x| *x as i32).collect());
                ts.push(t);
            }
            Input::I(shape, v) => {
                let t = Tensor::alloc(ctx, &format!("in{n}"), DType::I32, shape).unwrap();
                t.write_i32(b.s, v).unwrap();
                vals.i.push(v.clone());
                ts.push(t);
            }
        }
    }
    (ts, vals)
}

fn poison(b: &Backend, out: &Tensor) {
    out.write_f32(b.s, &vec![f32::NAN; out.numel()]).unwrap();
}

/// Max |got − want| / max(1e-6, max |want|), and whether anything is non-finite.
pub fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-6);
    let mut worst = 0f64;
    for (g, w) in got.iter().zip(want) {
        if !g.is_finite() {
            return f64::INFINITY;
        }
        worst = worst.max((*g as f64 - w).abs());
    }
    worst / scale
}

/// Checks every element: `|got − want| ≤ rtol · (|want| + rms(want))`, i.e. a relative
/// tolerance with an absolute floor of `rtol` times the root mean square of the reference (in
/// the tensor's own units: an error in a small entry is not hidden behind the largest one).
/// Non-finite values must match exactly (a NaN where a number is due fails). On failure, names
/// the worst element, its values and how many elements failed.
pub fn check_elements(got: &[f32], want: &[f64], rtol: f64) -> Result<(), String> {
    assert_eq!(got.len(), want.len());
    let (sum_sq, n) = want
        .iter()
        .filter(|w| w.is_finite())
        .fold((0f64, 0usize), |(s, n), w| (s + w * w, n + 1));
    let rms = (sum_sq / n.max(1) as f64).sqrt();
    let atol = rtol * rms.max(1e-30);
    let (mut worst, mut at, mut failed) = (0f64, 0usize, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = *g as f64;
        let ratio = if !w.is_finite() || !g.is_finite() {
            if g == *w || (g.is_nan() && w.is_nan()) {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            (g - w).abs() / (atol + rtol * w.abs())
        };
        if ratio > 1.0 {
            failed += 1;
        }
        if ratio > worst {
            (worst, at) = (ratio, i);
        }
    }
    if failed == 0 {
        return Ok(());
    }
    Err(format!(
        "{failed} of {} elements outside |Δ| ≤ {rtol:.1e} · (|want| + rms {rms:.3e}); worst at {at}: got {}, want {:.6e} ({worst:.2}× the tolerance)",
        got.len(),
        got[at],
        want[at]
    ))
}

/// GELU with the tanh approximation, in f64 (the references' arithmetic).
pub fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// Tolerance for outputs stored in `dt`, scaled by how much each output accumulates.
pub fn tol(dt: DType, f32_tol: f64) -> f64 {
    match dt {
        DType::F32 => f32_tol,
        DType::F16 => 4e-3_f64.max(f32_tol),
        _ => 2e-2_f64.max(f32_tol),
    }
}

/// Enqueues an op on its inputs and output.
pub type OpFn<'a> = &'a dyn Fn(&Kernels, Stream, &[Tensor], &Tensor) -> frt_kernels::Result<()>;

/// What an op test supplies.
pub struct Case<'a> {
    pub name: String,
    pub dtype: DType,
    pub inputs: Vec<Input>,
    /// Shape and dtype of the output tensor.
    pub out: (Vec<usize>, DType),
    /// Enqueues the op: inputs, output.
    pub op: OpFn<'a>,
    /// The f64 reference from the (rounded) inputs; every backend's output is checked against it.
    pub reference: &'a dyn Fn(&Vals) -> Vec<f64>,
    /// Tolerance for f32 outputs (other dtypes get at least their rounding tolerance).
    pub f32_tol: f64,
}

/// Runs the op eagerly (poisoned output), checks it, then captures it into a graph, replays
/// it into a re-poisoned output and asserts a bit-identical result.
pub fn run(b: &Backend, case: &Case) {
    let (ins, vals) = make(b, case.dtype, &case.inputs);
    let out = Tensor::alloc(b.k.ctx(), "out", case.out.1, &case.out.0).unwrap();
    poison(b, &out);
    (case.op)(&b.k, b.s, &ins, &out).unwrap_or_else(|e| panic!("{}: {e}", case.name));
    let got = out.read_f32(b.s).unwrap();
    let rtol = tol(case.out.1, case.f32_tol);
    // Against the f64 reference (from the inputs as rounded to the case's dtype), on every
    // backend and at every shape; on CUDA also against the host backend's output.
    let mut against = vec![((case.reference)(&vals), "f64 reference")];
    if let Some(h) = &b.host {
        let (hins, _) = make(h, case.dtype, &case.inputs);
        let hout = Tensor::alloc(h.k.ctx(), "out", case.out.1, &case.out.0).unwrap();
        poison(h, &hout);
        (case.op)(&h.k, h.s, &hins, &hout).unwrap();
        let host: Vec<f64> = hout
            .read_f32(h.s)
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect();
        against.push((host, "host backend"));
    }
    for (want, what) in &against {
        if let Err(m) = check_elements(&got, want, rtol) {
            panic!(
                "[{}] {} ({:?}) against the {what}: {m}",
                b.name, case.name, case.dtype
            );
        }
    }
    // The same op captured into a graph and replayed.
    let g = Graph::new(b.k.ctx(), &case.name, 1);
    g.capture(ShapeKey(0), |cs| {
        (case.op)(&b.k, cs, &ins, &out).map_err(|e| match e {
            frt_kernels::Error::Exec(e) => e,
            other => frt_exec::Error::Invalid {
                op: "capture",
                reason: other.to_string(),
            },
        })
    })
    .unwrap_or_else(|e| panic!("{}: capture: {e}", case.name));
    poison(b, &out);
    g.replay(ShapeKey(0), b.s).unwrap();
    let replayed = out.read_f32(b.s).unwrap();
    let same = got
        .iter()
        .zip(&replayed)
        .all(|(a, r)| a.to_bits() == r.to_bits());
    assert!(
        same,
        "[{}] {}: the replayed graph differs from the eager run",
        b.name, case.name
    );
}

/// `true` when the case should run on this backend: big shapes only on CUDA.
pub fn size_ok(b: &Backend, big: bool) -> bool {
    !big || b.is_cuda()
}

pub const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];
