//! The first half of a gated MLP (Gemma's): `h = gelu_tanh(x·Wgᵀ) ⊙ (x·Wuᵀ)` for the stacked
//! weight `w = [Wg ; Wu]` (`[2F, K]`, gate rows first, PyTorch's `[out, in]`): a GEMM into a
//! scratch `[M, 2F]`, then [`Kernels::geglu`] of its halves.
//!
//! For few rows (at most [`GEGLU_LINEAR_MAX_ROWS`], an action expert's 50 tokens) there is also
//! one CUDA kernel (`kernels/cuda/mlp.cu`: bf16/f16, sm_80+, where a block may use its 170 KiB
//! of shared memory, e.g. H100/H200) that streams the weight through tensor cores and applies
//! the gate in registers. It is not the default: on an H100 it takes 10.6 µs for the action
//! expert's shape (50×1024 → 2×4096, weights from memory) against 9.8 µs for cuBLASLt's GEMM
//! and the geglu kernel (`frt-kernels-bench`), as each block also streams all of `x`.
//! Plans take the GEMM path (on Hopper, the kernel below); [`Kernels::geglu_linear_fused`]
//! asks for this kernel (benchmarks, tests).
//!
//! On Hopper (sm_90, built as sm_90a) plans of bf16/f16 for few rows take another kernel
//! instead, unless [`KernelOptions::geglu_wgmma`](crate::KernelOptions) is off: `mlp.cu`'s
//! `geglu_linear_wg`, `wgmma` over operands the TMA copies (as `fp8.cu`'s FP8 kernels), the
//! gate and up values rounded to the dtype before the GELU, as the GEMM's output holds them.

use super::fp8::tma_map;
use super::{Rows, rows};
use crate::cuda::{Grouping, Param, args};
use crate::error::{Error, Result};
use crate::{DType, Gemm, Kernels, Tensor};
use frt_exec::Stream;

/// Most rows of `x` the fused CUDA kernel takes (one block of rows).
pub const GEGLU_LINEAR_MAX_ROWS: usize = 64;
/// Output features per block of the fused kernel (`MLP_BF` in `mlp.cu`).
const FEATURES_PER_BLOCK: usize = 32;
const STAGES: usize = 5;
const K_PER_STAGE: usize = 128;
/// The kernel's ring of stages: 64 rows of x and 64 of the weight each, rows padded by 8.
const SHARED_BYTES: u32 = (STAGES * 2 * GEGLU_LINEAR_MAX_ROWS * (K_PER_STAGE + 8) * 2) as u32;

/// [`Kernels::geglu_linear`]: planned once for the layouts of `x`, `w` and `h`; runs with any
/// tensors of those layouts (one layer's weight after another).
pub struct GegluLinear {
    x: Rows,
    w: Rows,
    h: Rows,
    dtype: DType,
    path: Path,
}

/// `geglu_linear_wg`'s ring of stages (64 weight rows and 64 rows of x, 64 values of K each),
/// or its 64 × 64 f32 values (rows of 68) after the loop, whichever is larger, then a barrier a
/// stage, 1024-byte aligned.
const WG_STAGES: usize = 8;
const WG_K: usize = 64;
const WG_SHARED: usize = wg_ring_shared(WG_STAGES);

/// Shared memory of a `wgmma` ring of `stages` stages (64 weight rows and 64 rows of x, `WG_K`
/// 16-bit values each): 1024-byte alignment slack, the stages, a barrier a stage.
const fn wg_ring_shared(stages: usize) -> usize {
    1024 + stages * (2 * 64 * WG_K * 2) + 8 * stages
}
const _: () = assert!(WG_STAGES * 2 * 64 * WG_K * 2 >= 64 * 68 * 4);

enum Path {
    /// `mlp.cu`'s kernel.
    Fused,
    /// `mlp.cu`'s `geglu_linear_wg` (Hopper).
    Wgmma,
    /// A GEMM into `both` (`[M, 2F]`), then geglu of its halves.
    Unfused(Box<(Gemm, Tensor)>),
}

const OP: &str = "geglu_linear";

impl Kernels {
    /// Plans `h = gelu_tanh(x·Wgᵀ) ⊙ (x·Wuᵀ)` for `x` `[M, K]`, `w` `[2F, K]` (gate rows then
    /// up rows) and `h` `[M, F]`, all of one float dtype, rows with unit column stride: a GEMM
    /// and geglu (see the module).
    pub fn geglu_linear(&self, x: &Tensor, w: &Tensor, h: &Tensor) -> Result<GegluLinear> {
        self.plan_geglu_linear(x, w, h, false)
    }

    /// [`geglu_linear`](Self::geglu_linear) on the fused CUDA kernel, or an error naming why it
    /// cannot run on these tensors.
    pub fn geglu_linear_fused(&self, x: &Tensor, w: &Tensor, h: &Tensor) -> Result<GegluLinear> {
        let plan = self.plan_geglu_linear(x, w, h, true)?;
        if !plan.fused() {
            return Err(Error::shape(
                OP,
                format!(
                    "the fused kernel needs CUDA sm_80+ with {SHARED_BYTES} bytes of shared memory a block, bf16/f16, at most {GEGLU_LINEAR_MAX_ROWS} rows, F a multiple of {FEATURES_PER_BLOCK}, K and row strides multiples of 8; got {} x {x:?}, w {w:?}, h {h:?}",
                    self.target()
                ),
            ));
        }
        Ok(plan)
    }

    fn plan_geglu_linear(
        &self,
        x: &Tensor,
        w: &Tensor,
        h: &Tensor,
        want_fused: bool,
    ) -> Result<GegluLinear> {
        let (xr, wr, hr) = layouts(self, x, w, h)?;
        let f = hr.cols;
        let dt = x.dtype();
        let fused = want_fused
            && self.cuda.as_ref().is_some_and(|c| {
                c.sm() >= 80
                && SHARED_BYTES <= c.max_shared
                && matches!(dt, DType::BF16 | DType::F16)
                && xr.rows <= GEGLU_LINEAR_MAX_ROWS
                && f % FEATURES_PER_BLOCK == 0
                // cp.async moves 16-byte pieces; h is written in pairs.
                && [xr.cols, xr.stride, wr.stride, x.offset(), w.offset()]
                    .iter()
                    .all(|v| v % 8 == 0)
                && [hr.stride, h.offset()].iter().all(|v| v % 2 == 0)
            });
        let aligned16 =
            |t: &Tensor, r: &Rows| t.ptr() % 16 == 0 && (r.stride * dt.size()) % 16 == 0;
        let wgmma = !want_fused
            && self.options.geglu_wgmma
            && self.cuda.as_ref().is_some_and(|c| {
                c.has_wgmma()
                    && WG_SHARED <= c.max_shared as usize
                    && matches!(dt, DType::BF16 | DType::F16)
                    && xr.rows <= GEGLU_LINEAR_MAX_ROWS
                    && xr.cols % WG_K == 0
                    && f % FEATURES_PER_BLOCK == 0
                    && aligned16(x, &xr)
                    && aligned16(w, &wr)
            });
        let path = if fused {
            Path::Fused
        } else if wgmma {
            Path::Wgmma
        } else {
            let both = Tensor::alloc(self.ctx(), "geglu_linear.both", dt, &[xr.rows, 2 * f])?;
            let gemm = self.linear(x, w, &both, false, false)?;
            Path::Unfused(Box::new((gemm, both)))
        };
        Ok(GegluLinear {
            x: xr,
            w: wr,
            h: hr,
            dtype: dt,
            path,
        })
    }
}

/// The three tensors as rows, checked against each other.
fn layouts(k: &Kernels, x: &Tensor, w: &Tensor, h: &Tensor) -> Result<(Rows, Rows, Rows)> {
    k.check_ctx(OP, &[x, w, h])?;
    x.expect_float(OP, "x")?;
    w.expect_dtype(OP, "w", x.dtype())?;
    h.expect_dtype(OP, "h", x.dtype())?;
    let (xr, wr, hr) = (rows(OP, x)?, rows(OP, w)?, rows(OP, h)?);
    if wr.cols != xr.cols || wr.rows != 2 * hr.cols || hr.rows != xr.rows || hr.cols == 0 {
        return Err(Error::shape(
            OP,
            format!(
                "x {x:?}, w {w:?}, h {h:?}: need x [M, K], w [2F, K] (gate rows, then up rows), h [M, F]"
            ),
        ));
    }
    Ok((xr, wr, hr))
}

impl GegluLinear {
    /// Whether the fused CUDA kernel runs it.
    pub fn fused(&self) -> bool {
        matches!(self.path, Path::Fused)
    }

    /// Whether Hopper's `wgmma` kernel runs it.
    pub fn on_wgmma(&self) -> bool {
        matches!(self.path, Path::Wgmma)
    }

    /// Enqueues it on `s` for tensors with the planned layouts (e.g. each layer's weight).
    pub fn run(&self, k: &Kernels, s: Stream, x: &Tensor, w: &Tensor, h: &Tensor) -> Result<()> {
        let (xr, wr, hr) = layouts(k, x, w, h)?;
        let same = |a: Rows, b: Rows| (a.rows, a.cols, a.stride) == (b.rows, b.cols, b.stride);
        if !same(xr, self.x) || !same(wr, self.w) || !same(hr, self.h) || x.dtype() != self.dtype {
            return Err(Error::shape(
                OP,
                format!(
                    "x {x:?}, w {w:?}, h {h:?} differ from the planned layouts ({:?}, {:?}, {:?})",
                    self.x, self.w, self.h
                ),
            ));
        }
        let f = hr.cols;
        match &self.path {
            Path::Unfused(p) => {
                let (gemm, both) = &**p;
                gemm.run(s, x, w, both, None)?;
                k.geglu(s, &both.narrow(1, 0, f)?, &both.narrow(1, f, f)?, h)
            }
            Path::Wgmma => {
                let c = k.cuda.as_ref().expect("wgmma only on CUDA");
                if x.ptr() % 16 != 0 || w.ptr() % 16 != 0 {
                    return Err(Error::shape(
                        OP,
                        format!("x {x:?}, w {w:?}: rows must start 16-byte aligned (as planned)"),
                    ));
                }
                let mut wmap = tma_map(OP, w, wr, FEATURES_PER_BLOCK as u32)?;
                let mut xmap = tma_map(OP, x, xr, GEGLU_LINEAR_MAX_ROWS as u32)?;
                k.retain(s, &[x, w, h]);
                let mut hp = h.ptr();
                let (mut ld, mut m, mut ff, mut kk) =
                    (hr.stride as u64, xr.rows as u32, f as u32, xr.cols as u32);
                let mut params = args!(wmap, xmap, hp, ld, m, ff, kk);
                // SAFETY: layouts checked against the plan, which the kernel takes: x m ≤ 64
                // rows and w 2F rows of K (a multiple of 64), 16-byte aligned rows; h m rows of
                // F (a multiple of 32); the maps bound every copy to x and w; the buffers are
                // retained for a capture in progress. Launched dependent (`pdl`), the kernel
                // copies only the weights before its `pdl_wait`.
                unsafe {
                    c.launch_raw(
                        s,
                        "geglu_linear_wg",
                        Some(self.dtype),
                        ((f / FEATURES_PER_BLOCK) as u32, 1, 1),
                        // Two warpgroups, each taking 32 of the tokens.
                        (256, 1, 1),
                        WG_SHARED as u32,
                        &mut params,
                        k.options.pdl,
                        Grouping::Plain,
                    )
                }
            }
            Path::Fused => {
                let c = k.cuda.as_ref().expect("fused only on CUDA");
                if [x.offset(), w.offset()].iter().any(|v| v % 8 != 0) || h.offset() % 2 != 0 {
                    return Err(Error::shape(
                        OP,
                        format!("x {x:?}, w {w:?}, h {h:?}: not aligned as planned"),
                    ));
                }
                let (xp, wp, hp) = (x.ptr(), w.ptr(), h.ptr());
                let (m, kk, ff) = (xr.rows as u32, xr.cols as u32, f as u32);
                let (sx, sw, sh) = (xr.stride as u64, wr.stride as u64, hr.stride as u64);
                // SAFETY: layouts, alignment and sizes checked above: x holds m ≤ 64 rows of K,
                // w 2F rows of K, h m rows of F (F a multiple of the block's 32 features).
                unsafe {
                    c.launch(
                        s,
                        "geglu_linear",
                        Some(self.dtype),
                        ((f / FEATURES_PER_BLOCK) as u32, 1, 1),
                        (128, 1, 1),
                        SHARED_BYTES,
                        &[
                            Param::Mem(x, xp),
                            Param::Mem(w, wp),
                            Param::Mem(h, hp),
                            m.into(),
                            kk.into(),
                            ff.into(),
                            sx.into(),
                            sw.into(),
                            sh.into(),
                        ],
                    )
                }
            }
        }
    }
}

impl Kernels {
    /// A measurement for benchmarks (CUDA): `rounds` barriers of the whole grid of `blocks`
    /// blocks (256 threads each) in one launch (`mlp.cu`'s `grid_barrier_probe`), on the
    /// counter `sync` (i32 `[2]`, one u64, zero before the first launch and left a multiple of
    /// the grid by each). With `cooperative` the launch is cooperative (the driver refuses a
    /// grid that cannot be resident at once); without, `blocks` must not exceed the SMs, and
    /// blocks already resident wait for those that other work on the GPU keeps from an SM. What
    /// a launch takes over the rounds tells a persistent kernel's cost of a phase boundary
    /// against a kernel boundary (the `launch` rows).
    pub fn grid_barrier_probe(
        &self,
        s: Stream,
        sync: &Tensor,
        blocks: usize,
        rounds: usize,
        cooperative: bool,
    ) -> Result<()> {
        let op = "grid_barrier_probe";
        let c = match &self.cuda {
            Some(c) => c,
            None => {
                return Err(Error::shape(
                    op,
                    format!("needs a CUDA GPU; this is {}", self.target()),
                ));
            }
        };
        self.check_ctx(op, &[sync])?;
        sync.expect_dtype(op, "sync", DType::I32)?;
        if sync.numel() < 2
            || sync.ptr() % 8 != 0
            || blocks == 0
            || blocks > c.sms as usize
            || rounds == 0
            || rounds > u32::MAX as usize
        {
            return Err(Error::shape(
                op,
                format!(
                    "sync {sync:?}, {blocks} blocks, {rounds} rounds: need an 8-byte aligned i32 [2], 1 to {} blocks (one an SM) and at least one round",
                    c.sms
                ),
            ));
        }
        self.retain(s, &[sync]);
        let (mut sp, mut r) = (sync.ptr(), rounds as u32);
        let mut params = args!(sp, r);
        // SAFETY: `sync` holds the u64 the kernel reads and adds to (checked above; retained for
        // a capture); no more blocks than SMs, each small, so the grid fits at once on the GPU
        // (cooperative where asked, which the driver checks).
        unsafe {
            c.launch_raw(
                s,
                op,
                None,
                (blocks as u32, 1, 1),
                (256, 1, 1),
                0,
                &mut params,
                false,
                if cooperative {
                    Grouping::Cooperative
                } else {
                    Grouping::Plain
                },
            )
        }
    }

    /// A measurement for benchmarks, Hopper only: the copies of `geglu_linear_wg`'s TMA ring
    /// without its MMAs (`mlp.cu`'s `tma_ring_probe`). One block per 64 rows of `w` (`[N, K]`,
    /// bf16/f16, N and K multiples of 64) copies its rows in boxes of `box_rows` rows (8, 16,
    /// 32 or 64) × 64 values of K, and with `x` (`[≤ 64, K]`, the same dtype) also the 64 rows
    /// of x, chunk by chunk through a ring of `stages` stages (1 to 12), each stage refilled
    /// once every thread has read a word of it; the words' sum goes into the i32 `sink[0]`.
    /// What it takes against `geglu_linear_wg` on the same weight tells the copies' share of
    /// that kernel's time.
    pub fn tma_ring_probe(
        &self,
        s: Stream,
        w: &Tensor,
        x: Option<&Tensor>,
        box_rows: usize,
        stages: usize,
        sink: &Tensor,
    ) -> Result<()> {
        let op = "tma_ring_probe";
        let c = match &self.cuda {
            Some(c) if c.has_wgmma() => c,
            _ => {
                return Err(Error::shape(
                    op,
                    format!("needs a Hopper GPU (sm_90); this is {}", self.target()),
                ));
            }
        };
        self.check_ctx(op, &[w, sink])?;
        let dt = w.dtype();
        sink.expect_dtype(op, "sink", DType::I32)?;
        let wr = rows(op, w)?;
        let xr = x.map(|x| rows(op, x)).transpose()?;
        let aligned16 =
            |t: &Tensor, r: &Rows| t.ptr() % 16 == 0 && (r.stride * dt.size()) % 16 == 0;
        let fits = matches!(dt, DType::BF16 | DType::F16)
            && wr.rows % 64 == 0
            && wr.cols % WG_K == 0
            && aligned16(w, &wr)
            && [8, 16, 32, 64].contains(&box_rows)
            && (1..=12).contains(&stages)
            && sink.numel() >= 1
            && match (x, xr) {
                (Some(x), Some(xr)) => {
                    x.dtype() == dt && xr.cols == wr.cols && xr.rows <= 64 && aligned16(x, &xr)
                }
                _ => true,
            };
        if !fits {
            return Err(Error::shape(
                op,
                format!(
                    "w {w:?}, x {x:?}, boxes of {box_rows} rows, {stages} stages, sink {sink:?}: need bf16/f16 w [64·n, 64·k] and x [≤ 64, 64·k], 16-byte aligned rows, boxes of 8, 16, 32 or 64 rows, 1 to 12 stages, an i32 sink"
                ),
            ));
        }
        let mut wmap = tma_map(op, w, wr, box_rows as u32)?;
        // Without x the kernel never reads its map: w's stands in.
        let mut xmap = match (x, xr) {
            (Some(x), Some(xr)) => tma_map(op, x, xr, 64)?,
            _ => tma_map(op, w, wr, 64)?,
        };
        let mut tensors = vec![w, sink];
        tensors.extend(x);
        self.retain(s, &tensors);
        let (mut with_x, mut br, mut chunks, mut st) = (
            u32::from(x.is_some()),
            box_rows as u32,
            (wr.cols / WG_K) as u32,
            stages as u32,
        );
        let mut sp = sink.ptr();
        let mut params = args!(wmap, xmap, with_x, br, chunks, st, sp);
        let shared = wg_ring_shared(stages);
        // SAFETY: checked above: w holds N = 64·blocks rows of K (a multiple of 64), x at most
        // 64 rows of K, both 16-byte aligned (the maps bound every copy); shared memory holds
        // the ring and its barriers; sink one i32; the buffers are retained for a capture.
        unsafe {
            c.launch_raw(
                s,
                op,
                None,
                ((wr.rows / 64) as u32, 1, 1),
                (128, 1, 1),
                shared as u32,
                &mut params,
                false,
                Grouping::Plain,
            )
        }
    }
}
