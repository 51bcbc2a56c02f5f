//! Gemma's MLP input in FP8 as one op: the gate+up projection of E4M3 rows and the GEGLU
//! after it, written as the E4M3 codes of the down projection's input
//! ([`Kernels::linear_geglu_e4m3`]). It computes what [`Kernels::linear_e4m3`] into a 16-bit
//! gate+up output followed by [`Kernels::geglu_e4m3`] computes, without the gate+up rows
//! going through memory and without the second launch.

use super::fp8::{Fp8Spec, WG_STAGE, host_linear, tma_map, wg_takes};
use super::{P, Rows, gelu_tanh, rows};
use crate::cuda::{Grouping, args};
use crate::dtype::{Float, with_float};
use crate::error::{Error, Result};
use crate::fp8::e4m3_from_f32;
use crate::{DType, FP8_ROWS_MAX, Kernels, Tensor};
use frt_exec::Stream;

/// [`Kernels::linear_geglu_e4m3`]: planned once for the layouts; runs with any tensors of
/// those layouts (one layer's weights after another), its scales read when the work runs.
///
/// On CUDA it is `fp8.cu`'s `linear_e4m3_wg_geglu` (Hopper's `wgmma`: a block takes 32 of
/// the gate's features and the up's same 32 over the whole of K, meets the 64 products in
/// shared memory and writes the 32 features' codes), so a plan exists only where that kernel
/// takes the shapes; on the host backend, always.
pub struct Fp8GegluLinear {
    kernels: Kernels,
    x: Rows,
    w: Rows,
    /// The rounding of the gate and up products and of the GEGLU's output.
    dt: DType,
    /// Host backend: the gate+up rows `[M, 2F]` of `dt`, allocated when planned (a run
    /// allocates nothing; the runs of one plan follow one another, as a model's do).
    gate_up: Option<Tensor>,
}

/// Features of the GEGLU's output a block of `linear_e4m3_wg_geglu` takes.
const GEGLU_FEATURES: usize = 32;

/// The f32 row length of `linear_e4m3_wg_geglu`'s 64 × 64 products in shared memory.
const TILE_LD: usize = 68;

/// `linear_e4m3_wg_geglu`'s shared memory for K = `kc` codes: its stages (64 weight rows and
/// 64 rows of x a stage of 128 codes) or the products after them, whichever is larger, then a
/// barrier a stage, 1024-byte aligned.
fn geglu_shared(kc: usize) -> usize {
    let stages = kc / WG_STAGE;
    1024 + (stages * WG_STAGE * (64 + FP8_ROWS_MAX)).max(64 * TILE_LD * 4) + 8 * stages
}

impl Kernels {
    /// Plans `codes = e4m3(geglu(gate, up) / code_scale)` with `[gate | up] = (x · wᵀ) ·
    /// x_scale · w_scale[n]`, for E4M3 `x` `[M, K]` and `w` `[2F, K]` (the gate's F rows, then
    /// the up's; rows 16-byte aligned, unit column stride) into contiguous E4M3 `codes`
    /// `[M, F]`. The gate and up products are rounded to `dt` (bf16, f16 or f32), as a `dt`
    /// output of [`linear_e4m3`](Self::linear_e4m3) holds them, and so is the GEGLU's
    /// output before it is quantized, as [`geglu_e4m3`](Self::geglu_e4m3) does.
    ///
    /// `Ok(None)` where no kernel of this device takes the shapes (on CUDA it needs Hopper's
    /// `wgmma`, see [`KernelOptions::fp8_wgmma`](crate::KernelOptions), M at most
    /// [`FP8_ROWS_MAX`], K a multiple of 128 up to 1024 and F of 32), and on every backend
    /// where [`KernelOptions::fp8_fused_geglu`](crate::KernelOptions) is off: then
    /// `linear_e4m3` and `geglu_e4m3` compute the same.
    pub fn linear_geglu_e4m3(
        &self,
        x: &Tensor,
        w: &Tensor,
        codes: &Tensor,
        dt: DType,
    ) -> Result<Option<Fp8GegluLinear>> {
        let op = "linear_geglu_e4m3";
        self.check_ctx(op, &[x, w, codes])?;
        x.expect_dtype(op, "x", DType::E4M3)?;
        w.expect_dtype(op, "w", DType::E4M3)?;
        codes.expect_dtype(op, "codes", DType::E4M3)?;
        codes.expect_contiguous(op)?;
        if !dt.is_float() {
            return Err(Error::shape(
                op,
                format!("the products are rounded to a float type, not {dt:?}"),
            ));
        }
        let (xr, wr, cr) = (rows(op, x)?, rows(op, w)?, rows(op, codes)?);
        let (m, kk, f) = (xr.rows, xr.cols, cr.cols);
        if wr.cols != kk || wr.rows != 2 * f || cr.rows != m {
            return Err(Error::shape(
                op,
                format!("x {x:?} · wᵀ {w:?} does not give gate and up rows for codes {codes:?}"),
            ));
        }
        if !self.options.fp8_fused_geglu {
            return Ok(None);
        }
        let aligned = |t: &Tensor, r: &Rows| t.ptr() % 16 == 0 && r.stride % 16 == 0;
        if let Some(c) = &self.cuda {
            let takes = wg_takes(self, m, kk, 64)
                && f % GEGLU_FEATURES == 0
                && geglu_shared(kk) <= c.max_shared as usize
                && aligned(x, &xr)
                && aligned(w, &wr);
            if !takes {
                return Ok(None);
            }
        }
        let gate_up = match self.cuda {
            Some(_) => None,
            None => Some(Tensor::alloc(
                self.ctx(),
                "linear_geglu_e4m3.gate_up",
                dt,
                &[m, 2 * f],
            )?),
        };
        Ok(Some(Fp8GegluLinear {
            kernels: self.clone(),
            x: xr,
            w: wr,
            dt,
            gate_up,
        }))
    }
}

impl Fp8GegluLinear {
    /// `(M, K, F)`: rows, the reduction, the GEGLU's features.
    pub fn dims(&self) -> (usize, usize, usize) {
        (self.x.rows, self.x.cols, self.w.rows / 2)
    }

    /// Enqueues it on `s` for tensors of the planned layouts: `x_scale` and `code_scale` at
    /// least one f32 each (the first is the scale), `w_scale` 2F f32 (contiguous).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        s: Stream,
        x: &Tensor,
        x_scale: &Tensor,
        w: &Tensor,
        w_scale: &Tensor,
        codes: &Tensor,
        code_scale: &Tensor,
    ) -> Result<()> {
        let op = "linear_geglu_e4m3";
        let k = &self.kernels;
        k.check_ctx(op, &[x, x_scale, w, w_scale, codes, code_scale])?;
        let same = |t: &Tensor, planned: Rows| -> Result<bool> {
            let r = rows(op, t)?;
            Ok(t.dtype() == DType::E4M3
                && t.ptr() % 16 == 0
                && (r.rows, r.cols, r.stride) == (planned.rows, planned.cols, planned.stride))
        };
        let (m, kk, f) = self.dims();
        if !same(x, self.x)?
            || !same(w, self.w)?
            || codes.dtype() != DType::E4M3
            || !codes.is_contiguous()
            || codes.shape() != [m, f]
        {
            return Err(Error::shape(
                op,
                format!(
                    "{x:?}, {w:?}, {codes:?} differ from the planned layouts (rows 16-byte aligned)"
                ),
            ));
        }
        for (t, name, n) in [
            (x_scale, "x_scale", 1),
            (code_scale, "code_scale", 1),
            (w_scale, "w_scale", 2 * f),
        ] {
            t.expect_dtype(op, name, DType::F32)?;
            t.expect_contiguous(op)?;
            if t.numel() < n || (name == "w_scale" && t.numel() != n) {
                return Err(Error::shape(op, format!("{name} {t:?} needs {n} elements")));
            }
        }
        let dt = self.dt;
        match &k.cuda {
            Some(c) => {
                let mut wmap = tma_map(op, w, self.w, GEGLU_FEATURES as u32)?;
                let mut xmap = tma_map(op, x, self.x, FP8_ROWS_MAX as u32)?;
                k.retain(s, &[x, x_scale, w, w_scale, codes, code_scale]);
                let (mut xs, mut ws, mut cp, mut csp) =
                    (x_scale.ptr(), w_scale.ptr(), codes.ptr(), code_scale.ptr());
                let (mut m32, mut f32_, mut kc32) = (m as u32, f as u32, kk as u32);
                let mut params = args!(wmap, xmap, xs, ws, cp, csp, m32, f32_, kc32);
                // SAFETY: the layouts were checked against the plan, which the kernel takes
                // (m ≤ 64 rows, K a multiple of 128 up to 1024, F a multiple of 32, rows 16-byte
                // aligned, its shared memory within the device's); the maps bound every copy to
                // x and w, codes holds [m, F]; the buffers are retained for a capture. Launched
                // dependent (`pdl`), it copies only the weights before its `pdl_wait`.
                unsafe {
                    c.launch_raw(
                        s,
                        "linear_e4m3_wg_geglu",
                        Some(dt),
                        ((f / GEGLU_FEATURES) as u32, 1, 1),
                        // Two warpgroups, each taking 32 of the tokens.
                        (256, 1, 1),
                        geglu_shared(kk) as u32,
                        &mut params,
                        k.options.pdl,
                        Grouping::Plain,
                    )
                }
            }
            None => {
                let spec = Fp8Spec {
                    x: self.x,
                    w: self.w,
                    out: Rows {
                        rows: m,
                        cols: 2 * f,
                        stride: 2 * f,
                    },
                    out_dt: dt,
                    bias: false,
                    accumulate: false,
                    feature_scales: true,
                };
                // The gate+up rows as `linear_e4m3` writes them into a `dt` output.
                let gu = self.gate_up.as_ref().expect("planned on the host");
                let ptrs = (
                    P::of(x),
                    P::of(x_scale),
                    P::of(w),
                    P::of(w_scale),
                    P::of(codes),
                    P::of(code_scale),
                    P::of(gu),
                );
                let keep = (
                    x.clone(),
                    x_scale.clone(),
                    w.clone(),
                    w_scale.clone(),
                    codes.clone(),
                    code_scale.clone(),
                    gu.clone(),
                );
                k.host(s, move || {
                    let _ = &keep;
                    let (x, xs, w, ws, codes, cs, gp) = ptrs;
                    // SAFETY: the layouts were checked against the plan; `gp` holds the spec's
                    // output, [m, 2F] of `dt`; codes [m, F], one code scale.
                    unsafe {
                        host_linear(&spec, (x, xs, w, ws, gp, None));
                        let scale = cs.ld::<f32>(0);
                        with_float!(dt, T, {
                            for r in 0..m {
                                for c in 0..f {
                                    let g = gp.ld::<T>(r * 2 * f + c);
                                    let u = gp.ld::<T>(r * 2 * f + f + c);
                                    let h = T::from_f32(gelu_tanh(g) * u).to_f32();
                                    *((codes.0 + r * f + c) as *mut u8) = e4m3_from_f32(h / scale);
                                }
                            }
                        })
                    }
                })
            }
        }
    }
}
