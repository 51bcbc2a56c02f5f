//! Models built on several threads of one process at once: a thread capturing GEMMs into a
//! graph while another thread, on another context of the same device (on CUDA both are the
//! device's primary context), does what building a model does. The captured graph must
//! compute what the same GEMMs compute outside a graph.
//!
//! On an H100, with each GEMM plan making and destroying a cuBLASLt handle of its own, the
//! other thread's plans (`cuda_captures_beside_plans`: made and dropped, none run) and its
//! captures (`_captures`) ended this thread's capture (`cublasLtMatmul` status 13,
//! `cudaErrorStreamCaptureInvalidated`), and so did models built by tests on several threads
//! (`vla/tests/gpu.rs`); its replays, copies, tuned plans and new `Kernels` did not. Plans
//! now share one handle per device that is never destroyed (`device_lt_handle` in
//! `ops/gemm.rs`), and every churn passes.
//!
//! Host: `cargo test -p frt-kernels --test threads`; CUDA: `-- --ignored`.

use frt_exec::{Ctx, Graph, ShapeKey, Stream};
use frt_kernels::{DType, Kernels, Tensor};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// What the other thread does meanwhile.
#[derive(Clone, Copy, Debug)]
enum Churn {
    /// Makes a `Kernels` (its modules loaded, a cuBLASLt handle).
    NewKernels,
    /// Plans GEMMs of a new shape each time, with the timing of candidates on (captures and
    /// replays graphs of its own).
    TunedPlans,
    /// Uploads and downloads tensors.
    Copies,
    /// Captures GEMMs of a new shape each time into graphs of its own and replays them.
    Captures,
    /// Plans GEMMs of a new shape each time (no timing of candidates) and runs none.
    Plans,
    /// Replays a graph of GEMMs it captured before the capturing thread began.
    Replays,
}

fn ctx(cuda: bool) -> Ctx {
    if cuda {
        Ctx::cuda(0).expect("CUDA device 0 (this test needs a CUDA GPU)")
    } else {
        Ctx::host().unwrap()
    }
}

fn filled(k: &Kernels, s: Stream, name: &str, shape: &[usize], seed: u32) -> Tensor {
    let t = Tensor::alloc(k.ctx(), name, DType::BF16, shape).unwrap();
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 20) as f32 / 4096.0 - 0.5
        })
        .collect();
    t.write_f32(s, &v).unwrap();
    t
}

/// A bf16 GEMM `out = x·wᵀ` of `m × kk` by `n × kk` with filled inputs, and its plan.
struct Linear {
    x: Tensor,
    w: Tensor,
    out: Tensor,
    plan: frt_kernels::Gemm,
}

impl Linear {
    fn new(k: &Kernels, s: Stream, (m, kk, n): (usize, usize, usize), seeds: (u32, u32)) -> Linear {
        let (x, w) = (
            filled(k, s, "x", &[m, kk], seeds.0),
            filled(k, s, "w", &[n, kk], seeds.1),
        );
        let out = Tensor::alloc(k.ctx(), "out", DType::BF16, &[m, n]).unwrap();
        let plan = k.linear(&x, &w, &out, false, false).unwrap();
        Linear { x, w, out, plan }
    }

    fn run(&self, s: Stream) -> frt_kernels::Result<()> {
        self.plan.run(s, &self.x, &self.w, &self.out, None)
    }

    /// A graph of `times` runs of it, captured.
    fn captured(&self, ctx: &Ctx, name: &str, times: usize) -> frt_kernels::Result<Graph> {
        let g = Graph::new(ctx, name, 0);
        g.capture(ShapeKey(1), |cs| (0..times).try_for_each(|_| self.run(cs)))?;
        Ok(g)
    }
}

/// Sets its flag when dropped: when its thread ends, also by a panic.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Waits until both threads have arrived (`arrived` counts them), or panics when the other
/// one has ended (`peer_gone`) without arriving: a thread whose set-up failed never arrives.
fn meet(arrived: &AtomicUsize, peer_gone: &AtomicBool) {
    arrived.fetch_add(1, Ordering::AcqRel);
    while arrived.load(Ordering::Acquire) < 2 {
        assert!(
            !peer_gone.load(Ordering::Relaxed),
            "the other thread ended before both were set up"
        );
        std::thread::yield_now();
    }
}

fn captures_beside(cuda: bool, churn: Churn) {
    // Set when the capturing thread ends (its loop is over, or it failed), and when the other
    // thread ends: neither waits for the other then.
    let (done, other_gone) = (AtomicBool::new(false), AtomicBool::new(false));
    // Both threads set up (the other thread's graph captured) before either churns or captures.
    let arrived = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            let _gone = SetOnDrop(&other_gone);
            let ctx = ctx(cuda);
            let s = ctx.stream(0).unwrap();
            let k = Kernels::new(&ctx).unwrap();
            // Kept alive while its graph is replayed.
            let base = Linear::new(&k, s, (32, 256, 256), (7, 8));
            let replayed = base.captured(&ctx, "replayed", 20).unwrap();
            meet(&arrived, &done);
            let mut rounds = 0usize;
            while !done.load(Ordering::Relaxed) || rounds < 3 {
                match churn {
                    Churn::NewKernels => drop(Kernels::new(&ctx).unwrap()),
                    Churn::TunedPlans => {
                        // 256 × 1024 × n multiply-adds: timed from n = 64 on (the host: small).
                        let (m, n) = if cuda {
                            (256, 64 * (rounds % 16 + 1))
                        } else {
                            (4, 8)
                        };
                        let x = filled(&k, s, "x", &[m, 1024], 1);
                        let w = filled(&k, s, "w", &[n, 1024], 2);
                        let out = Tensor::alloc(&ctx, "out", DType::BF16, &[m, n]).unwrap();
                        k.linear(&x, &w, &out, false, false)
                            .unwrap()
                            .run(s, &x, &w, &out, None)
                            .unwrap();
                    }
                    Churn::Captures => {
                        let n = 64 * (rounds % 16 + 1);
                        let l = Linear::new(&k, s, (32, 256, n), (5, 6));
                        let g = l
                            .captured(&ctx, "other", 20)
                            .unwrap_or_else(|e| panic!("the other thread's capture {rounds}: {e}"));
                        g.replay(ShapeKey(1), s).unwrap();
                        l.out.read_f32(s).unwrap();
                    }
                    Churn::Plans => {
                        let n = 64 * (rounds % 16 + 1);
                        let x = Tensor::alloc(&ctx, "x", DType::BF16, &[32, 256]).unwrap();
                        let w = Tensor::alloc(&ctx, "w", DType::BF16, &[n, 256]).unwrap();
                        let out = Tensor::alloc(&ctx, "out", DType::BF16, &[32, n]).unwrap();
                        k.linear(&x, &w, &out, false, false).unwrap();
                    }
                    Churn::Replays => {
                        replayed.replay(ShapeKey(1), s).unwrap();
                        ctx.sync_stream(s).unwrap();
                    }
                    Churn::Copies => {
                        let t = filled(&k, s, "t", &[1 << 18], rounds as u32);
                        t.read_f32(s).unwrap();
                    }
                }
                rounds += 1;
            }
            rounds
        });
        // Ends the other thread's loop however this one ends (a failed capture panics: the
        // scope would otherwise wait for the other thread forever).
        let done_guard = SetOnDrop(&done);
        let ctx = ctx(cuda);
        let s = ctx.stream(0).unwrap();
        let k = Kernels::new(&ctx).unwrap();
        let l = Linear::new(&k, s, (64, 512, 512), (3, 4));
        l.run(s).unwrap();
        let want = l.out.read_f32(s).unwrap();
        meet(&arrived, &other_gone);
        let (rounds, gemms) = if cuda { (30, 50) } else { (4, 4) };
        for round in 0..rounds {
            l.out.write_f32(s, &vec![f32::NAN; 64 * 512]).unwrap();
            let g = l
                .captured(&ctx, "gemms", gemms)
                .unwrap_or_else(|e| panic!("{churn:?}, capture {round}: {e}"));
            g.replay(ShapeKey(1), s).unwrap();
            assert!(
                l.out.read_f32(s).unwrap() == want,
                "{churn:?}, round {round}"
            );
        }
        drop(done_guard);
        assert!(other.join().unwrap() >= 3);
    });
}

/// A host test and an ignored CUDA test (`cuda_` + its name) per churn.
macro_rules! churn_tests {
    ($($(#[doc = $doc:literal])* $name:ident, $cuda:ident: $churn:ident, $why:literal;)*) => {
        $(
            #[test]
            fn $name() {
                captures_beside(false, Churn::$churn);
            }

            $(#[doc = $doc])*
            #[test]
            #[ignore = $why]
            fn $cuda() {
                captures_beside(true, Churn::$churn);
            }
        )*
    };
}

churn_tests! {
    captures_beside_new_kernels, cuda_captures_beside_new_kernels: NewKernels, "needs a CUDA GPU";
    captures_beside_tuned_plans, cuda_captures_beside_tuned_plans: TunedPlans, "needs a CUDA GPU";
    captures_beside_copies, cuda_captures_beside_copies: Copies, "needs a CUDA GPU";
    captures_beside_captures, cuda_captures_beside_captures: Captures, "needs a CUDA GPU";
    captures_beside_plans, cuda_captures_beside_plans: Plans, "needs a CUDA GPU";
    captures_beside_replays, cuda_captures_beside_replays: Replays, "needs a CUDA GPU";
}
