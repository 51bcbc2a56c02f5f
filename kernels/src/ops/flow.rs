//! Flow matching's velocity and Euler update as one op: `v = h·wᵀ + b` in f32 for few outputs
//! (the action expert's output projection: 32 actions from 1024 features), then the update of
//! the noisy actions `x` as [`Kernels::euler_step`], [`Kernels::euler_step_cast`] or
//! [`Kernels::euler_step_inpaint_cast`] would make it from that `v`.
//!
//! On CUDA one launch (`velocity_euler` in `kernels/cuda/elementwise.cu`) instead of a GEMM, the
//! reduction of its split and the update. On the host the planned f32 GEMM and the Euler op run
//! in turn, so the host computes the bits those two ops computed.

use super::rows;
use crate::cuda::Param;
use crate::error::{Error, Result};
use crate::{DType, Gemm, Kernels, Tensor};
use frt_exec::Stream;

/// Where the update goes besides `x`.
#[derive(Clone, Copy)]
pub enum EulerOut<'a> {
    /// `x ← x + dt·v` only ([`Kernels::euler_step`]).
    InPlace,
    /// Also the new `x` in another dtype ([`Kernels::euler_step_cast`]).
    Cast(&'a Tensor),
    /// With a frozen prefix ([`Kernels::euler_step_inpaint_cast`]).
    Inpaint {
        x1: &'a Tensor,
        frozen: &'a Tensor,
        frozen_rows: &'a Tensor,
        t_next: f32,
        cast: &'a Tensor,
    },
}

/// [`Kernels::velocity_euler`]'s plan.
pub struct VelocityEuler {
    /// The host backend's GEMM (CUDA runs its own kernel).
    host: Option<Gemm>,
    rows: usize,
    n: usize,
    k: usize,
}

impl Kernels {
    /// Plans `v = h·wᵀ + b` followed by an Euler update of `x` (see [`VelocityEuler::run`]):
    /// `h` f32 `[rows, k]` (unit column stride), `w` f32 `[n, k]` contiguous, `v` f32 `[rows,
    /// n]` contiguous.
    pub fn velocity_euler(&self, h: &Tensor, w: &Tensor, v: &Tensor) -> Result<VelocityEuler> {
        let op = "velocity_euler";
        self.check_ctx(op, &[h, w, v])?;
        for (t, name) in [(h, "h"), (w, "w"), (v, "v")] {
            t.expect_dtype(op, name, DType::F32)?;
        }
        let hr = rows(op, h)?;
        if w.rank() != 2 || !w.is_contiguous() || w.dim(1) != hr.cols {
            return Err(Error::shape(
                op,
                format!("w {w:?} must be contiguous [outputs, {}]", hr.cols),
            ));
        }
        let n = w.dim(0);
        if v.rank() != 2 || !v.is_contiguous() || v.shape() != [hr.rows, n] {
            return Err(Error::shape(
                op,
                format!("v {v:?} must be contiguous [{}, {n}]", hr.rows),
            ));
        }
        let host = match self.cuda {
            Some(_) => None,
            None => Some(self.linear(h, w, v, true, false)?),
        };
        Ok(VelocityEuler {
            host,
            rows: hr.rows,
            n,
            k: hr.cols,
        })
    }
}

impl VelocityEuler {
    /// Enqueues `v = h·wᵀ + b` (`b` f32 `[n]`) and the update of `x` (f32 `[rows, n]`
    /// contiguous) on `s`, the tensors of the planned shapes.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        k: &Kernels,
        s: Stream,
        h: &Tensor,
        w: &Tensor,
        b: &Tensor,
        v: &Tensor,
        x: &Tensor,
        dt: f32,
        out: EulerOut<'_>,
    ) -> Result<()> {
        let op = "velocity_euler";
        if let Some(g) = &self.host {
            g.run(s, h, w, v, Some(b))?;
            return match out {
                EulerOut::InPlace => k.euler_step(s, x, v, dt),
                EulerOut::Cast(c) => k.euler_step_cast(s, x, v, dt, c),
                EulerOut::Inpaint {
                    x1,
                    frozen,
                    frozen_rows,
                    t_next,
                    cast,
                } => k.euler_step_inpaint_cast(s, x, v, dt, x1, frozen, frozen_rows, t_next, cast),
            };
        }
        k.check_ctx(op, &[h, w, b, v, x])?;
        for (t, name) in [(h, "h"), (w, "w"), (b, "b"), (v, "v"), (x, "x")] {
            t.expect_dtype(op, name, DType::F32)?;
        }
        let hr = rows(op, h)?;
        let (rn, n) = (self.rows * self.n, self.n);
        if hr.rows != self.rows
            || hr.cols != self.k
            || w.shape() != [n, self.k]
            || !w.is_contiguous()
            || b.numel() != n
            || !b.is_contiguous()
            || [v, x].iter().any(|t| t.numel() != rn || !t.is_contiguous())
        {
            return Err(Error::shape(
                op,
                format!(
                    "h {h:?}, w {w:?}, b {b:?}, v {v:?}, x {x:?} differ from the planned [{}, {}] · [{n}, {}]ᵀ",
                    self.rows, self.k, self.k
                ),
            ));
        }
        let (cast, x1, frozen, frozen_rows, t_next) = match out {
            EulerOut::InPlace => (None, None, None, None, 0.0),
            EulerOut::Cast(c) => (Some(c), None, None, None, 0.0),
            EulerOut::Inpaint {
                x1,
                frozen,
                frozen_rows,
                t_next,
                cast,
            } => (
                Some(cast),
                Some(x1),
                Some(frozen),
                Some(frozen_rows),
                t_next,
            ),
        };
        if let Some(c) = cast {
            k.check_ctx(op, &[c])?;
            c.expect_float(op, "x_cast")?;
            if c.numel() != rn || !c.is_contiguous() {
                return Err(Error::shape(
                    op,
                    format!("x_cast {c:?} must hold the {rn} values of x contiguously"),
                ));
            }
        }
        for (t, name) in [(x1, "x1"), (frozen, "frozen")] {
            if let Some(t) = t {
                k.check_ctx(op, &[t])?;
                t.expect_dtype(op, name, DType::F32)?;
                if t.numel() != rn || !t.is_contiguous() {
                    return Err(Error::shape(
                        op,
                        format!("{name} {t:?} must hold {rn} values contiguously"),
                    ));
                }
            }
        }
        if let Some(r) = frozen_rows {
            k.check_ctx(op, &[r])?;
            r.expect_dtype(op, "frozen_rows", DType::I32)?;
            if r.numel() != 1 {
                return Err(Error::shape(
                    op,
                    format!("frozen_rows {r:?} must be one i32"),
                ));
            }
        }
        let c = k.cuda.as_ref().expect("a CUDA plan runs on CUDA");
        let vec4 = (self.k % 4 == 0 && hr.stride % 4 == 0 && h.ptr() % 16 == 0 && w.ptr() % 16 == 0)
            as i32;
        let (n32, k32, sh) = (n as u32, self.k as u32, hr.stride as u64);
        // SAFETY: every tensor was checked against the planned shapes above; the kernel reads
        // `rows` rows of `k` values of h and `n` of w, and writes `rows·n` values of v, x and
        // x_cast.
        unsafe {
            c.launch(
                s,
                "velocity_euler",
                Some(cast.map_or(DType::F32, |c| c.dtype())),
                (self.rows as u32, n.div_ceil(8) as u32, 1),
                (256, 1, 1),
                0,
                &[
                    Param::of(h),
                    sh.into(),
                    Param::of(w),
                    Param::of(b),
                    Param::of(v),
                    Param::of(x),
                    n32.into(),
                    k32.into(),
                    dt.into(),
                    Param::opt(cast),
                    Param::opt(x1),
                    Param::opt(frozen),
                    Param::opt(frozen_rows),
                    t_next.into(),
                    vec4.into(),
                ],
            )
        }
    }
}
