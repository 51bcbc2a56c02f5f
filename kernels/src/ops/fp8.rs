//! FP8 E4M3 ops (codes and conversion: [`crate::fp8`]): static quantization of an activation
//! with a scale kept in device memory, its inverse, and the FP8 linear layer
//! `out = (x · wᵀ) · x_scale · w_scale[n] (+ bias)` of E4M3 activations (one scale for the
//! tensor) and E4M3 weights (one scale per output feature, as
//! [`quantize_rows_e4m3`](crate::fp8::quantize_rows_e4m3) makes them), accumulated in f32.
//!
//! The scales are device tensors read when the work runs, so a graph captured once follows a
//! new calibration written into them. On CUDA the linear layer is a cuBLASLt FP8 GEMM (FP8
//! tensor cores: sm_89 or newer; elsewhere planning it is an error that says so); on the host
//! backend the codes are decoded exactly and the products summed in f32. For few rows there is
//! also the library's own kernel ([`Fp8Linear`]), and the split form
//! ([`Kernels::linear_e4m3_split`]) whose parts' f32 sums a residual's norm adds.

use super::gemm::{
    LtObjects, TUNING_CANDIDATES, TUNING_MIN_MACS, WORKSPACE, fastest_candidate, lt_err, no_result,
    scratch, weight_copies,
};
use super::{P, Rows, rows};
use crate::cuda::{Grouping, Param, args};
use crate::dtype::with_float;
use crate::error::{Error, Result};
use crate::fp8::{e4m3_from_f32, e4m3_to_f32};
use crate::pool::Pool;
use crate::{DType, Kernels, Tensor};
use frt_exec::Stream;
use frt_exec::cudarc::cublaslt::result as lt;
use frt_exec::cudarc::cublaslt::sys as lts;
use frt_exec::cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::Arc;

/// `x` float, `out` E4M3 (or the reverse), both contiguous with as many elements; `scale` one
/// f32.
fn check_pair(
    k: &Kernels,
    op: &'static str,
    float: &Tensor,
    codes: &Tensor,
    scale: &Tensor,
) -> Result<()> {
    k.check_ctx(op, &[float, codes, scale])?;
    float.expect_float(op, "float tensor")?;
    codes.expect_dtype(op, "codes", DType::E4M3)?;
    scale.expect_dtype(op, "scale", DType::F32)?;
    for t in [float, codes, scale] {
        t.expect_contiguous(op)?;
    }
    if float.numel() != codes.numel() || scale.numel() != 1 {
        return Err(Error::shape(
            op,
            format!("{float:?} and {codes:?} need as many elements, {scale:?} one"),
        ));
    }
    Ok(())
}

/// Launches `fp8.cu`'s elementwise kernel `name` of float type `dt` on `(input, scale, output)`
/// of `n` elements.
///
/// # Safety
/// The tensors hold `n` elements each (the scale one), of the kernel's types.
unsafe fn elementwise(
    c: &crate::cuda::CudaOps,
    s: Stream,
    name: &'static str,
    dt: DType,
    [input, scale, output]: [&Tensor; 3],
    (n, per_thread): (usize, usize),
) -> Result<()> {
    let threads = 256u32;
    // Grid-stride loops: fewer blocks only mean more iterations each.
    let blocks = n.div_ceil(threads as usize * per_thread).clamp(1, 4096) as u32;
    let params = [
        Param::of(input),
        Param::of(scale),
        Param::of(output),
        (n as u64).into(),
    ];
    // SAFETY: the caller's contract.
    unsafe {
        c.launch(
            s,
            name,
            Some(dt),
            (blocks, 1, 1),
            (threads, 1, 1),
            0,
            &params,
        )
    }
}

/// The value of every code (NaN for the two NaN codes).
fn code_values() -> &'static [f32; 256] {
    static T: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    T.get_or_init(|| std::array::from_fn(|c| e4m3_to_f32(c as u8)))
}

impl Kernels {
    /// Static quantization: `out[i] = e4m3(x[i] / scale)` (`scale`: one f32 in device memory,
    /// read when the work runs; see [`crate::fp8`] for the rounding, the same on both
    /// backends). A scale of 0 saturates every nonzero value.
    pub fn quantize_e4m3(&self, s: Stream, x: &Tensor, scale: &Tensor, out: &Tensor) -> Result<()> {
        let op = "quantize_e4m3";
        check_pair(self, op, x, out, scale)?;
        let n = x.numel();
        match &self.cuda {
            Some(c) => {
                // SAFETY: n elements each, checked above; the scale has one.
                // Eight values a thread where the kernel can move them whole.
                unsafe { elementwise(c, s, "quantize_e4m3", x.dtype(), [x, scale, out], (n, 8)) }
            }
            None => {
                let (xp, sp, op_) = (P::of(x), P::of(scale), P::of(out));
                let dt = x.dtype();
                let keep = (x.clone(), scale.clone(), out.clone());
                self.host(s, move || {
                    let _ = &keep;
                    // SAFETY: indices inside the checked tensors.
                    unsafe {
                        let sc = sp.ld::<f32>(0);
                        with_float!(dt, T, {
                            for i in 0..n {
                                *((op_.0 + i) as *mut u8) = e4m3_from_f32(xp.ld::<T>(i) / sc);
                            }
                        })
                    }
                })
            }
        }
    }

    /// `out[i] = value(codes[i]) · scale`, rounded to `out`'s dtype.
    pub fn dequantize_e4m3(
        &self,
        s: Stream,
        codes: &Tensor,
        scale: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        let op = "dequantize_e4m3";
        check_pair(self, op, out, codes, scale)?;
        let n = out.numel();
        match &self.cuda {
            Some(c) => {
                // SAFETY: n elements each, checked above; the scale has one.
                unsafe {
                    elementwise(
                        c,
                        s,
                        "dequantize_e4m3",
                        out.dtype(),
                        [codes, scale, out],
                        (n, 1),
                    )
                }
            }
            None => {
                let (cp, sp, op_) = (P::of(codes), P::of(scale), P::of(out));
                let dt = out.dtype();
                let keep = (codes.clone(), scale.clone(), out.clone());
                self.host(s, move || {
                    let _ = &keep;
                    let values = code_values();
                    // SAFETY: indices inside the checked tensors.
                    unsafe {
                        let sc = sp.ld::<f32>(0);
                        with_float!(dt, T, {
                            for i in 0..n {
                                let c = *((cp.0 + i) as *const u8);
                                op_.st::<T>(i, values[c as usize] * sc);
                            }
                        })
                    }
                })
            }
        }
    }

    /// Plans the FP8 linear layer (see the module docs) for E4M3 `x` `[M, K]`, E4M3 `w`
    /// `[N, K]` (PyTorch's `[out, in]`) and a float `out` `[M, N]`, rows with unit column
    /// stride; `bias`: whether runs add one (`[N]`, `out`'s dtype, bf16 or f16). On CUDA: cuBLASLt's FP8
    /// GEMM, which needs K and the row strides of `x` and `w` to be multiples of 16 and the
    /// device to have FP8 tensor cores (sm_89+).
    pub fn linear_e4m3(
        &self,
        x: &Tensor,
        w: &Tensor,
        out: &Tensor,
        bias: bool,
    ) -> Result<Fp8Linear> {
        self.plan_e4m3(x, w, out, bias, true)
    }

    /// [`linear_e4m3`](Self::linear_e4m3) without the weight's per-feature scales: runs write
    /// `out = (x · wᵀ) · x_scale` rounded to `out`'s dtype, and whatever reads `out` applies
    /// `w_scale[n]` (e.g. [`geglu_scaled_e4m3`](Self::geglu_scaled_e4m3)); their `w_scale`
    /// is not read. On CUDA always cuBLASLt's GEMM with one scalar scale
    /// ([`Fp8Scaling::ActivationOnly`]), whose kernels are faster than those of its per-feature
    /// forms at large M (Gemma's gate+up at 576 rows on an H100: 72.8 against 92.3 µs).
    pub fn linear_e4m3_deferred(&self, x: &Tensor, w: &Tensor, out: &Tensor) -> Result<Fp8Linear> {
        self.plan_e4m3(x, w, out, false, false)
    }

    fn plan_e4m3(
        &self,
        x: &Tensor,
        w: &Tensor,
        out: &Tensor,
        bias: bool,
        feature_scales: bool,
    ) -> Result<Fp8Linear> {
        let op = "linear_e4m3";
        self.check_ctx(op, &[x, w, out])?;
        x.expect_dtype(op, "x", DType::E4M3)?;
        w.expect_dtype(op, "w", DType::E4M3)?;
        out.expect_float(op, "out")?;
        if bias && out.dtype() == DType::F32 {
            // cuBLASLt's FP8 GEMMs take a bias only beside a 16-bit output.
            return Err(Error::shape(
                op,
                "a bias needs a bf16 or f16 output (cuBLASLt's FP8 GEMMs take none beside f32)",
            ));
        }
        let (xr, wr, or) = (rows(op, x)?, rows(op, w)?, rows(op, out)?);
        if xr.cols != wr.cols || or.rows != xr.rows || or.cols != wr.rows {
            return Err(Error::shape(
                op,
                format!("x {x:?} · wᵀ {w:?} does not give out {out:?}"),
            ));
        }
        let spec = Fp8Spec {
            x: xr,
            w: wr,
            out: or,
            out_dt: out.dtype(),
            bias,
            accumulate: false,
            feature_scales,
        };
        let path = match &self.cuda {
            Some(c) => {
                fp8_tensor_cores(&c.arch)?;
                let lt = Fp8Lt::new(self, &c.arch, &spec, (w.ptr(), x.ptr()))?;
                // The library's kernels apply the feature scales themselves.
                let own: Vec<OwnKernel> = [OwnKernel::Wgmma, OwnKernel::Rows]
                    .into_iter()
                    .filter(|o| feature_scales && o.takes(self, &spec, x, w))
                    .collect();
                match lt.own_kernel_faster(self, &spec, &own) {
                    Some(o) => Fp8Path::Own(o),
                    None => Fp8Path::Lt(Arc::new(lt)),
                }
            }
            None => Fp8Path::Host,
        };
        Ok(Fp8Linear {
            kernels: self.clone(),
            spec,
            path,
        })
    }
}

#[derive(Copy, Clone, Debug)]
pub(super) struct Fp8Spec {
    pub(super) x: Rows,
    pub(super) w: Rows,
    pub(super) out: Rows,
    pub(super) out_dt: DType,
    pub(super) bias: bool,
    /// Runs add the product to `out` (see [`Fp8Linear::accumulating`]).
    pub(super) accumulate: bool,
    /// Runs scale the product by the weight's per-feature scales (else their consumer does:
    /// see [`Kernels::linear_e4m3_deferred`]).
    pub(super) feature_scales: bool,
}

/// How a cuBLASLt FP8 plan applies the scales (the first form cuBLASLt accepts, tried in
/// this order).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Fp8Scaling {
    /// cuBLASLt's outer-vector scale mode on the weight operand, a scalar for the activation.
    OuterVector,
    /// Outer-vector scale modes on both operands: the activation's scale is then a vector of
    /// one (equal) entry per row of `x` (see [`Fp8Linear::x_scale_elements`]).
    BothVectors,
    /// A device vector of alphas, one per output feature.
    AlphaVector,
    /// One scalar scale, the activation's: the product is not scaled per feature (the plans
    /// of [`Kernels::linear_e4m3_deferred`], only).
    ActivationOnly,
}

impl Fp8Scaling {
    /// Whether cuBLASLt reads the weight's scales through its A scale pointer.
    fn weight_scale_pointer(self) -> bool {
        matches!(self, Fp8Scaling::OuterVector | Fp8Scaling::BothVectors)
    }
}

/// [`Kernels::linear_e4m3`]: planned once for the layouts; runs with any tensors of those
/// layouts (one layer's weights after another), its scales read when the work runs.
///
/// On CUDA, a plan of at most [`FP8_ROWS_MAX`] rows (with K a multiple of 64, N of 16, and
/// 16-byte aligned rows) runs one of the library's own kernels (on Hopper with K at most 1024
/// and N a multiple of 64 its `wgmma` form) unless
/// [`KernelOptions::fp8_rows_kernel`](crate::KernelOptions) is off; with GEMM tuning on, the
/// fastest of those and cuBLASLt's GEMM, timed when planned.
pub struct Fp8Linear {
    kernels: Kernels,
    spec: Fp8Spec,
    path: Fp8Path,
}

/// The most rows (M) the library's own FP8 kernel takes.
pub const FP8_ROWS_MAX: usize = 64;

/// How a plan runs.
enum Fp8Path {
    Host,
    Lt(Arc<Fp8Lt>),
    Own(OwnKernel),
}

/// The library's own FP8 kernels for few rows.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum OwnKernel {
    /// `fp8.cu`'s `linear_e4m3_rows`: a block per 16 output features, `mma.sync` on the codes
    /// widened to f16.
    Rows,
    /// `fp8.cu`'s `linear_e4m3_wg`: Hopper's `wgmma` on the codes as they are, a block per 64
    /// output features.
    Wgmma,
}

/// The codes of K a block of `linear_e4m3_wg` copies a stage; the most codes of K one block
/// takes (all staged at once).
pub(super) const WG_STAGE: usize = 128;
const WG_RANGE_MAX: usize = 1024;

/// `linear_e4m3_wg`'s shared memory for ranges of `kc` codes: per stage 64 weight rows and 64
/// rows of x, 1024-byte aligned, and a barrier.
fn wg_shared(kc: usize) -> usize {
    let stages = kc / WG_STAGE;
    1024 + stages * (WG_STAGE * (64 + FP8_ROWS_MAX) + 8)
}

/// Whether `linear_e4m3_wg` takes `m` rows, ranges of `kc` codes and `n` features here.
pub(super) fn wg_takes(k: &Kernels, m: usize, kc: usize, n: usize) -> bool {
    k.options.fp8_wgmma
        && k.cuda
            .as_ref()
            .is_some_and(|c| c.has_wgmma() && wg_shared(kc) <= c.max_shared as usize)
        && (1..=FP8_ROWS_MAX).contains(&m)
        && kc % WG_STAGE == 0
        && kc <= WG_RANGE_MAX
        && n % 64 == 0
}

/// A tensor map (for the TMA) of rows `r` at `t`'s start (E4M3, bf16 or f16): boxes of 128
/// bytes of a row (128 codes, 64 16-bit values) × `box_rows` rows, written to shared memory
/// with the 128-byte swizzle; rows past `r.rows` arrive as zeros.
pub(super) fn tma_map(
    op: &'static str,
    t: &Tensor,
    r: Rows,
    box_rows: u32,
) -> Result<sys::CUtensorMap> {
    use sys::{
        CUtensorMapDataType as D, CUtensorMapFloatOOBfill as F, CUtensorMapInterleave as I,
        CUtensorMapL2promotion as L, CUtensorMapSwizzle as Sw,
    };
    let (data, size) = match t.dtype() {
        DType::BF16 => (D::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2),
        DType::F16 => (D::CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2),
        _ => (D::CU_TENSOR_MAP_DATA_TYPE_UINT8, 1),
    };
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    let dims = [r.cols as u64, r.rows as u64];
    let strides = [(r.stride * size) as u64];
    let boxes = [(128 / size) as u32, box_rows];
    let steps = [1u32, 1];
    // SAFETY: valid pointers to arrays of the rank's lengths; the map is written, not read.
    let res = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            data,
            2,
            t.ptr() as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            I::CU_TENSOR_MAP_INTERLEAVE_NONE,
            Sw::CU_TENSOR_MAP_SWIZZLE_128B,
            L::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            F::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if res != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::shape(
            op,
            format!("cuTensorMapEncodeTiled for {t:?} ({r:?}): {res:?}"),
        ));
    }
    // SAFETY: written by the successful call.
    Ok(unsafe { map.assume_init() })
}

/// What `linear_e4m3_wg` writes: 16-bit or f32 rows `out` (row layout, dtype, bias, whether
/// it adds to what `out` holds), or each range's f32 sum into `[parts, m, n]`.
enum WgOut<'a> {
    Rows(&'a Tensor, Rows, DType, Option<&'a Tensor>, bool),
    Parts(&'a Tensor),
}

/// Enqueues `linear_e4m3_wg` on `s` for x (`xr`) · w (`wr`)ᵀ in ranges of `kc` codes.
///
/// # Safety
/// The tensors hold the layouts given, rows 16-byte aligned, and [`wg_takes`] holds for them;
/// `out` has the layout its kind names (`[K / kc, m, n]` f32 for parts).
#[allow(clippy::too_many_arguments)]
unsafe fn wg_launch(
    k: &Kernels,
    s: Stream,
    (x, xr): (&Tensor, Rows),
    (w, wr): (&Tensor, Rows),
    (x_scale, w_scale): (&Tensor, &Tensor),
    kc: usize,
    out: WgOut,
) -> Result<()> {
    let op = "linear_e4m3";
    let c = k.cuda.as_ref().expect("CUDA plans exist on CUDA");
    let (m, n, parts) = (xr.rows, wr.rows, xr.cols / kc);
    let mut wmap = tma_map(op, w, wr, 64)?;
    let mut xmap = tma_map(op, x, xr, FP8_ROWS_MAX as u32)?;
    let (mut xs, mut ws) = (x_scale.ptr(), w_scale.ptr());
    let (mut m32, mut n32, mut kc32) = (m as u32, n as u32, kc as u32);
    k.retain(s, &[x, w, x_scale, w_scale]);
    // The parts kernel takes the same parameters (leading dimension, bias and accumulation
    // unused).
    let (name, dt, o, ld, bias, accumulate) = match out {
        WgOut::Rows(o, or, dt, bias, accumulate) => {
            ("linear_e4m3_wg", Some(dt), o, or.stride, bias, accumulate)
        }
        WgOut::Parts(p) => ("linear_e4m3_wg_parts", None, p, 0, None, false),
    };
    k.retain(s, &[o]);
    if let Some(b) = bias {
        k.retain(s, &[b]);
    }
    let (mut op_, mut ld, mut bp, mut acc) = (
        o.ptr(),
        ld as u64,
        bias.map_or(0, |b| b.ptr()),
        u32::from(accumulate),
    );
    let mut params = args!(wmap, xmap, xs, ws, op_, ld, bp, acc, m32, n32, kc32);
    // SAFETY: the caller's contract; the maps bound every copy to the tensors, the buffers are
    // retained for a capture in progress. Launched dependent (`pdl`), the kernel copies only
    // the weights before its `pdl_wait`; the tokens and its output after it.
    unsafe {
        c.launch_raw(
            s,
            name,
            dt,
            ((n / 64) as u32, parts as u32, 1),
            // Two warpgroups, each taking 32 of the tokens.
            (256, 1, 1),
            wg_shared(kc) as u32,
            &mut params,
            k.options.pdl,
            Grouping::Plain,
        )
    }
}

impl OwnKernel {
    /// Whether the kernel takes `sp` (else another, or cuBLASLt's GEMM, runs it).
    fn takes(self, k: &Kernels, sp: &Fp8Spec, x: &Tensor, w: &Tensor) -> bool {
        let (m, kk, n) = (sp.x.rows, sp.x.cols, sp.w.rows);
        let aligned = |t: &Tensor, r: &Rows| t.ptr() % 16 == 0 && r.stride % 16 == 0;
        let shape = match self {
            OwnKernel::Rows => kk % 64 == 0 && n % 16 == 0,
            OwnKernel::Wgmma => wg_takes(k, m, kk, n),
        };
        k.options.fp8_rows_kernel
            && (1..=FP8_ROWS_MAX).contains(&m)
            && shape
            && aligned(x, &sp.x)
            && aligned(w, &sp.w)
    }

    /// Enqueues the kernel on `s`.
    ///
    /// # Safety
    /// The tensors have the spec's layouts, rows 16-byte aligned, and the kernel takes the
    /// spec (see [`takes`](Self::takes)).
    unsafe fn launch(
        self,
        k: &Kernels,
        s: Stream,
        sp: &Fp8Spec,
        [x, x_scale, w, w_scale, out]: [&Tensor; 5],
        bias: Option<&Tensor>,
    ) -> Result<()> {
        let (m, kk, n) = (sp.x.rows, sp.x.cols, sp.w.rows);
        if self == OwnKernel::Wgmma {
            let out = WgOut::Rows(out, sp.out, sp.out_dt, bias, sp.accumulate);
            // SAFETY: the caller's contract (the kernel takes the spec).
            return unsafe { wg_launch(k, s, (x, sp.x), (w, sp.w), (x_scale, w_scale), kk, out) };
        }
        let c = k.cuda.as_ref().expect("CUDA plans exist on CUDA");
        let params = [
            Param::of(x),
            (sp.x.stride as u64).into(),
            Param::of(x_scale),
            Param::of(w),
            (sp.w.stride as u64).into(),
            Param::of(w_scale),
            Param::of(out),
            (sp.out.stride as u64).into(),
            Param::opt(bias),
            u32::from(sp.accumulate).into(),
            (m as u32).into(),
            (kk as u32).into(),
        ];
        // One kernel per count of row tiles of 8 (its sums in registers).
        const NAMES: [&str; FP8_ROWS_MAX / 8] = [
            "linear_e4m3_rows1",
            "linear_e4m3_rows2",
            "linear_e4m3_rows3",
            "linear_e4m3_rows4",
            "linear_e4m3_rows5",
            "linear_e4m3_rows6",
            "linear_e4m3_rows7",
            "linear_e4m3_rows8",
        ];
        // SAFETY: the caller's contract.
        unsafe {
            c.launch(
                s,
                NAMES[m.div_ceil(8) - 1],
                Some(sp.out_dt),
                ((n / 16) as u32, 1, 1),
                (256, 1, 1),
                0,
                &params,
            )
        }
    }
}

impl Fp8Linear {
    /// `(M, K, N)`.
    pub fn dims(&self) -> (usize, usize, usize) {
        (self.spec.x.rows, self.spec.x.cols, self.spec.w.rows)
    }

    /// On CUDA, how the weight scales are applied (which form cuBLASLt accepted).
    pub fn scaling(&self) -> Option<Fp8Scaling> {
        match &self.path {
            Fp8Path::Lt(p) => Some(p.scaling),
            _ => None,
        }
    }

    /// What runs the plan: `host`, `cuBLASLt, … scales`, `rows kernel` or `wgmma kernel` (the
    /// library's own for few rows).
    pub fn implementation(&self) -> String {
        match &self.path {
            Fp8Path::Host => "host".into(),
            Fp8Path::Lt(p) => format!("cuBLASLt, {:?} scales", p.scaling),
            Fp8Path::Own(OwnKernel::Rows) => "rows kernel".into(),
            Fp8Path::Own(OwnKernel::Wgmma) => "wgmma kernel".into(),
        }
    }

    /// The same plan adding its product to `out` (`out += (x · wᵀ) · scales`, a residual
    /// stream): an error where cuBLASLt took the alpha-vector form, which cannot add.
    pub fn accumulating(mut self) -> Result<Fp8Linear> {
        if self.scaling() == Some(Fp8Scaling::AlphaVector) {
            return Err(Error::shape(
                "linear_e4m3",
                "this device's FP8 GEMM takes the scales as a vector of alphas, which cannot add to the output",
            ));
        }
        self.spec.accumulate = true;
        Ok(self)
    }

    /// How many f32 the activation scale has: 1, or M equal entries where cuBLASLt takes the
    /// activation's scale as a vector ([`Fp8Scaling::BothVectors`]).
    pub fn x_scale_elements(&self) -> usize {
        match self.scaling() {
            Some(Fp8Scaling::BothVectors) => self.spec.x.rows,
            _ => 1,
        }
    }

    /// Enqueues `out = (x · wᵀ) · x_scale · w_scale[n] (+ bias)`: `x_scale`
    /// [`x_scale_elements`](Self::x_scale_elements) f32 (all equal), `w_scale` N f32
    /// (contiguous; not read by a plan of [`Kernels::linear_e4m3_deferred`], which leaves
    /// `· w_scale[n]` out).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        s: Stream,
        x: &Tensor,
        x_scale: &Tensor,
        w: &Tensor,
        w_scale: &Tensor,
        out: &Tensor,
        bias: Option<&Tensor>,
    ) -> Result<()> {
        let op = "linear_e4m3";
        let sp = self.spec;
        let k = &self.kernels;
        k.check_ctx(op, &[x, x_scale, w, w_scale, out])?;
        let same = |t: &Tensor, planned: Rows, dt: DType| -> Result<bool> {
            let r = rows(op, t)?;
            Ok(t.dtype() == dt
                && (r.rows, r.cols, r.stride) == (planned.rows, planned.cols, planned.stride))
        };
        if !same(x, sp.x, DType::E4M3)?
            || !same(w, sp.w, DType::E4M3)?
            || !same(out, sp.out, sp.out_dt)?
        {
            return Err(Error::shape(
                op,
                format!("{x:?}, {w:?}, {out:?} differ from the planned layout {sp:?}"),
            ));
        }
        for (t, n, name) in [
            (x_scale, self.x_scale_elements(), "x_scale"),
            (w_scale, sp.w.rows, "w_scale"),
        ] {
            t.expect_dtype(op, name, DType::F32)?;
            t.expect_contiguous(op)?;
            if t.numel() != n {
                return Err(Error::shape(
                    op,
                    format!("{name} {t:?} must have {n} elements"),
                ));
            }
        }
        super::check_bias(k, op, bias, sp.bias, sp.out_dt, sp.w.rows)?;
        match &self.path {
            Fp8Path::Own(own) => {
                if x.ptr() % 16 != 0 || w.ptr() % 16 != 0 {
                    return Err(Error::shape(
                        op,
                        format!("{x:?} and {w:?} must start 16-byte aligned (as planned)"),
                    ));
                }
                // SAFETY: the layouts were checked against the plan, which the kernel takes.
                unsafe { own.launch(k, s, &sp, [x, x_scale, w, w_scale, out], bias) }
            }
            Fp8Path::Lt(p) => {
                let cuda = k.cuda.as_ref().expect("CUDA plans exist on CUDA");
                let workspace = cuda.workspace(&k.ctx, s)?;
                k.retain(s, &[x, x_scale, w, w_scale, out]);
                if let Some(t) = bias {
                    k.retain(s, &[t]);
                }
                k.ctx.retain(s, &workspace);
                k.ctx.retain_object(s, p.clone());
                k.ctx.bind_to_thread()?;
                let raw = k.ctx.raw_stream(s)? as lts::cudaStream_t;
                // SAFETY: layouts and sizes checked against the plan; the pointers are live
                // device memory retained by a capture in progress.
                let ptrs = Fp8Ptrs {
                    x: x.ptr(),
                    x_scale: x_scale.ptr(),
                    w: w.ptr(),
                    w_scale: w_scale.ptr(),
                    out: out.ptr(),
                    bias: bias.map(|t| t.ptr()),
                };
                unsafe { p.matmul(&p.algo, &ptrs, sp.accumulate, workspace.ptr(), raw) }
            }
            Fp8Path::Host => {
                let ptrs = (
                    P::of(x),
                    P::of(x_scale),
                    P::of(w),
                    P::of(w_scale),
                    P::of(out),
                    bias.map(P::of),
                );
                let keep = (
                    x.clone(),
                    x_scale.clone(),
                    w.clone(),
                    w_scale.clone(),
                    out.clone(),
                    bias.cloned(),
                );
                k.host(s, move || {
                    let _ = &keep;
                    // SAFETY: the layouts were checked against the plan.
                    unsafe { host_linear(&sp, ptrs) };
                })
            }
        }
    }
}

/// The host backend's FP8 linear layer: each weight row decoded once per task, products summed
/// in f32, then scaled by `x_scale · w_scale[n]`, the bias added, rounded to `out`'s dtype.
///
/// # Safety
/// The pointers hold tensors of the spec's layouts.
pub(super) unsafe fn host_linear(
    sp: &Fp8Spec,
    (x, xs, w, ws, out, bias): (P, P, P, P, P, Option<P>),
) {
    const COLS_PER_TASK: usize = 16;
    let values = code_values();
    let (m, kk, n) = (sp.x.rows, sp.x.cols, sp.w.rows);
    // SAFETY: one f32.
    let x_scale = unsafe { xs.ld::<f32>(0) };
    // The activations decoded once.
    let xd: Vec<f32> = (0..m * kk)
        .map(|i| {
            let (r, c) = (i / kk, i % kk);
            // SAFETY: inside x's layout.
            values[unsafe { *((x.0 + r * sp.x.stride + c) as *const u8) } as usize]
        })
        .collect();
    let tasks = n.div_ceil(COLS_PER_TASK);
    let dt = sp.out_dt;
    Pool::global().run(tasks, &|t| {
        let mut wd = vec![0f32; kk];
        for j in t * COLS_PER_TASK..((t + 1) * COLS_PER_TASK).min(n) {
            for (c, v) in wd.iter_mut().enumerate() {
                // SAFETY: inside w's layout.
                *v = values[unsafe { *((w.0 + j * sp.w.stride + c) as *const u8) } as usize];
            }
            // SAFETY: n scales, n bias values.
            let scale = if sp.feature_scales {
                x_scale * unsafe { ws.ld::<f32>(j) }
            } else {
                x_scale
            };
            let b = bias.map(|b| with_float!(dt, T, { unsafe { b.ld::<T>(j) } }));
            for i in 0..m {
                let mut y = super::gemm::dot(&xd[i * kk..(i + 1) * kk], &wd) * scale;
                if let Some(b) = b {
                    y += b;
                }
                let at = i * sp.out.stride + j;
                // SAFETY: inside out's layout.
                with_float!(dt, T, {
                    if sp.accumulate {
                        y += unsafe { out.ld::<T>(at) };
                    }
                    unsafe { out.st::<T>(at, y) }
                });
            }
        }
    });
}

/// Whether a CUDA architecture (`sm_90`, `sm_90a`, …) has FP8 tensor cores (sm_89: Ada, and
/// every later one: Hopper, Blackwell, Thor's sm_110): else an error that says so.
pub(crate) fn fp8_tensor_cores(arch: &str) -> Result<()> {
    let sm: u32 = arch
        .trim_start_matches("sm_")
        .trim_end_matches(['a', 'f'])
        .parse()
        .unwrap_or(0);
    if sm < 89 {
        return Err(Error::shape(
            "linear_e4m3",
            format!("FP8 GEMMs need FP8 tensor cores (sm_89 or newer); this device is {arch}"),
        ));
    }
    Ok(())
}

/// The device addresses of one FP8 GEMM's operands.
#[derive(Copy, Clone)]
struct Fp8Ptrs {
    x: u64,
    x_scale: u64,
    w: u64,
    w_scale: u64,
    out: u64,
    bias: Option<u64>,
}

/// cuBLASLt objects of one FP8 plan.
struct Fp8Lt {
    lt: LtObjects,
    algo: lts::cublasLtMatmulAlgo_t,
    scaling: Fp8Scaling,
}

impl std::ops::Deref for Fp8Lt {
    type Target = LtObjects;
    fn deref(&self) -> &LtObjects {
        &self.lt
    }
}

fn out_type(dt: DType) -> lts::cudaDataType {
    match dt {
        DType::BF16 => lts::cudaDataType::CUDA_R_16BF,
        DType::F16 => lts::cudaDataType::CUDA_R_16F,
        _ => lts::cudaDataType::CUDA_R_32F,
    }
}

impl Fp8Lt {
    /// `placeholders`: device addresses the scale pointers hold while cuBLASLt is asked for an
    /// algorithm (vector scale modes refuse null ones); each run sets the real ones.
    fn new(k: &Kernels, arch: &str, sp: &Fp8Spec, placeholders: (u64, u64)) -> Result<Fp8Lt> {
        let op = "linear_e4m3";
        fp8_tensor_cores(arch)?;
        let (m, kk, n) = (sp.x.rows, sp.x.cols, sp.w.rows);
        if kk % 16 != 0 || sp.x.stride % 16 != 0 || sp.w.stride % 16 != 0 {
            return Err(Error::shape(
                op,
                format!(
                    "cuBLASLt's FP8 GEMM needs K ({kk}) and the row strides of x ({}) and w ({}) to be multiples of 16",
                    sp.x.stride, sp.w.stride
                ),
            ));
        }
        k.ctx.bind_to_thread()?;
        let handle = super::gemm::device_lt_handle(&k.ctx)?;
        // The forms of scaling in turn (see `Fp8Scaling`).
        let mut refused = Vec::new();
        let forms: &[Fp8Scaling] = if sp.feature_scales {
            &[
                Fp8Scaling::OuterVector,
                Fp8Scaling::BothVectors,
                Fp8Scaling::AlphaVector,
            ]
        } else {
            &[Fp8Scaling::ActivationOnly]
        };
        for &scaling in forms {
            match Self::with_scaling(handle, sp, (m, kk, n), scaling, placeholders) {
                Ok((mut p, candidates)) => {
                    p.tune(k, sp, candidates);
                    return Ok(p);
                }
                Err(e) => refused.push(format!("{scaling:?}: {e}")),
            }
        }
        // SAFETY: no arguments; reads the loaded library's version.
        let version = unsafe { lts::cublasLtGetVersion() };
        Err(Error::shape(
            op,
            format!(
                "cuBLASLt {version} takes none of the forms of per-feature scales for {m}x{kk}x{n} on {arch} ({})",
                refused.join("; ")
            ),
        ))
    }

    fn with_scaling(
        handle: lts::cublasLtHandle_t,
        sp: &Fp8Spec,
        (m, kk, n): (usize, usize, usize),
        scaling: Fp8Scaling,
        (a_scale, b_scale): (u64, u64),
    ) -> Result<(Fp8Lt, Vec<lts::cublasLtMatmulAlgo_t>)> {
        let mut plan = Fp8Lt {
            lt: LtObjects::new(handle)?,
            algo: lts::cublasLtMatmulAlgo_t { data: [0; 8] },
            scaling,
        };
        let desc = plan.desc;
        let set = |attr, v: *const c_void, size| {
            // SAFETY: `desc` is live; `v` points to `size` bytes of the attribute's type.
            unsafe { lt::set_matmul_desc_attribute(desc, attr, v, size) }
                .map_err(lt_err("cublasLtMatmulDescSetAttribute"))
        };
        use lts::cublasLtMatmulDescAttributes_t as A;
        // cuBLASLt's A is our w seen column-major (K × N), transposed; its B our x (K × M);
        // D our out (N × M column-major): the "TN" form FP8 GEMMs require.
        let (ta, tb) = (1i32, 0i32);
        set(
            A::CUBLASLT_MATMUL_DESC_TRANSA,
            &ta as *const _ as *const c_void,
            4,
        )?;
        set(
            A::CUBLASLT_MATMUL_DESC_TRANSB,
            &tb as *const _ as *const c_void,
            4,
        )?;
        match scaling {
            Fp8Scaling::OuterVector | Fp8Scaling::BothVectors => {
                let mode =
                    lts::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
                set(
                    A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                    &mode as *const _ as *const c_void,
                    4,
                )?;
                if scaling == Fp8Scaling::BothVectors {
                    set(
                        A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                        &mode as *const _ as *const c_void,
                        4,
                    )?;
                }
            }
            // cuBLASLt's default: scalar scales (the weight's left unset, 1).
            Fp8Scaling::ActivationOnly => {}
            Fp8Scaling::AlphaVector => {
                let mode =
                    lts::cublasLtPointerMode_t::CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO;
                set(
                    A::CUBLASLT_MATMUL_DESC_POINTER_MODE,
                    &mode as *const _ as *const c_void,
                    4,
                )?;
            }
        }
        // Placeholder scale pointers (see `new`); the alpha-vector form and the deferred one
        // have no weight scale.
        if scaling.weight_scale_pointer() {
            set(
                A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                &a_scale as *const u64 as *const c_void,
                8,
            )?;
        }
        set(
            A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
            &b_scale as *const u64 as *const c_void,
            8,
        )?;
        let epi = if sp.bias {
            lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS
        } else {
            lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT
        };
        set(
            A::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &epi as *const _ as *const c_void,
            4,
        )?;
        if sp.bias {
            let bt = out_type(sp.out_dt);
            set(
                A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                &bt as *const _ as *const c_void,
                4,
            )?;
        }
        let e4m3 = lts::cudaDataType::CUDA_R_8F_E4M3;
        let mk = |ty, rows: usize, cols: usize, ld: usize| {
            lt::create_matrix_layout(ty, rows as u64, cols as u64, ld as i64)
                .map_err(lt_err("cublasLtMatrixLayoutCreate"))
        };
        plan.lt.layouts[0] = mk(e4m3, kk, n, sp.w.stride)?;
        plan.lt.layouts[1] = mk(e4m3, kk, m, sp.x.stride)?;
        plan.lt.layouts[2] = mk(out_type(sp.out_dt), n, m, sp.out.stride)?;
        let pref = lt::create_matmul_pref().map_err(lt_err("cublasLtMatmulPreferenceCreate"))?;
        let ws = WORKSPACE as u64;
        // Up to TUNING_CANDIDATES algorithms, the heuristic's best first.
        let mut found = [no_result(); TUNING_CANDIDATES];
        let mut count = 0i32;
        // SAFETY: every descriptor is live and describes the operands; `found` has room for
        // the requested count.
        let status = unsafe {
            let _ = lt::set_matmul_pref_attribute(
                pref,
                lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const _ as *const c_void,
                8,
            );
            let st = lts::cublasLtMatmulAlgoGetHeuristic(
                plan.handle,
                plan.desc,
                plan.layouts[0],
                plan.layouts[1],
                plan.layouts[2],
                plan.layouts[2],
                pref,
                TUNING_CANDIDATES as i32,
                found.as_mut_ptr(),
                &mut count,
            );
            let _ = lt::destroy_matmul_pref(pref);
            st
        };
        let candidates: Vec<lts::cublasLtMatmulAlgo_t> = found[..count.max(0) as usize]
            .iter()
            .filter(|r| {
                r.state == lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                    && r.workspaceSize <= WORKSPACE
            })
            .map(|r| r.algo)
            .collect();
        if status != lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS || candidates.is_empty() {
            return Err(Error::NoAlgorithm {
                what: format!("FP8 GEMM ({scaling:?} scales) {sp:?}: status {status:?}"),
            });
        }
        plan.algo = candidates[0];
        Ok((plan, candidates))
    }

    /// With GEMM tuning on (and a GEMM large enough to matter, as for the 16-bit GEMMs): the
    /// fastest of the heuristic's candidates (and their split-K forms) timed on this device,
    /// or an earlier process's choice from the tuning cache. Where timing is not possible the
    /// heuristic's first choice stands.
    fn tune(&mut self, k: &Kernels, sp: &Fp8Spec, mut candidates: Vec<lts::cublasLtMatmulAlgo_t>) {
        let (m, kk, n) = (sp.x.rows, sp.x.cols, sp.w.rows);
        if !k.options.gemm_tuning || m * kk * n < TUNING_MIN_MACS {
            return;
        }
        let cuda = k.cuda.as_ref().expect("CUDA plans exist on CUDA");
        let spec = format!(
            "fp8 x={:?} w={:?} out={:?} {:?} bias={} {:?} split_k={} memsets={}",
            sp.x,
            sp.w,
            sp.out,
            sp.out_dt,
            sp.bias,
            self.scaling,
            k.options.split_k,
            k.options.memset_kernels
        );
        if let Some((data, _)) = cuda.tuning_cache.get(&spec) {
            let algo = lts::cublasLtMatmulAlgo_t { data };
            if self.check(algo).is_some() {
                self.algo = algo;
                return;
            }
        }
        if k.options.split_k {
            let split = self.split_k_variants(&candidates);
            candidates.extend(split.into_iter().map(|(a, _)| a));
        }
        if candidates.len() < 2 {
            if k.options.tuning_log {
                eprintln!(
                    "fp8 gemm m={m} n={n} k={kk} {:?}: one candidate ({:?} scales), not timed",
                    sp.out_dt, self.scaling
                );
            }
            return;
        }
        if let Ok(i) = self.fastest(k, sp, &candidates) {
            self.algo = candidates[i];
            cuda.tuning_cache.put(&spec, self.algo.data, 0);
        }
    }

    /// Which of the library's own kernels `own` (those that take the spec, preferred first)
    /// runs this GEMM, or `None` for cuBLASLt's algorithm: with GEMM tuning on, the fastest of
    /// them all, timed on scratch operands (and the choice kept in the tuning cache); else the
    /// first of `own` (an own kernel is assumed faster than cuBLASLt's: the rows kernel was at
    /// three of the action expert's four shapes on an H100).
    fn own_kernel_faster(&self, k: &Kernels, sp: &Fp8Spec, own: &[OwnKernel]) -> Option<OwnKernel> {
        let (m, kk, n) = (sp.x.rows, sp.x.cols, sp.w.rows);
        let first = own.first().copied()?;
        if !k.options.gemm_tuning {
            return Some(first);
        }
        let cuda = k.cuda.as_ref().expect("CUDA plans exist on CUDA");
        let spec = format!(
            "fp8 kernel x={:?} w={:?} out={:?} {:?} bias={} algo={:?} own={own:?} memsets={}",
            sp.x, sp.w, sp.out, sp.out_dt, sp.bias, self.algo.data, k.options.memset_kernels
        );
        let pick = |i: usize| i.checked_sub(1).and_then(|i| own.get(i).copied());
        if let Some((data, _)) = cuda.tuning_cache.get(&spec) {
            return pick(data[0] as usize);
        }
        let timed = (|| -> Result<usize> {
            let s = cuda.tuning_stream(&k.ctx)?;
            let bytes = |r: &Rows, size: usize| ((r.rows - 1) * r.stride + r.cols) * size;
            let tensor = |b: &frt_exec::Buffer, dt: DType, r: &Rows| -> Result<Tensor> {
                Tensor::with_layout(b, dt, &[r.rows, r.cols], &[r.stride, 1], 0)
            };
            let xb = scratch(k, "fp8.tuning.x", bytes(&sp.x, 1))?;
            let wbs = weight_copies(k, "fp8.tuning.w", bytes(&sp.w, 1))?;
            let xs = Tensor::alloc(&k.ctx, "fp8.tuning.x_scale", DType::F32, &[m])?;
            let ws = Tensor::alloc(&k.ctx, "fp8.tuning.w_scale", DType::F32, &[n])?;
            let ob = scratch(k, "fp8.tuning.out", bytes(&sp.out, sp.out_dt.size()))?;
            let bias = Tensor::alloc(&k.ctx, "fp8.tuning.bias", sp.out_dt, &[n])?;
            let x = tensor(&xb, DType::E4M3, &sp.x)?;
            let wts = wbs
                .iter()
                .map(|b| tensor(b, DType::E4M3, &sp.w))
                .collect::<Result<Vec<_>>>()?;
            let out = tensor(&ob, sp.out_dt, &sp.out)?;
            let workspace = cuda.workspace(&k.ctx, s)?;
            let label = format!(
                "fp8 gemm m={m} n={n} k={kk} {:?}: cuBLASLt, {own:?}",
                sp.out_dt
            );
            fastest_candidate(k, &label, 1 + own.len(), &|i, r, cs, raw| {
                let w = &wts[r % wts.len()];
                let bias = sp.bias.then_some(&bias);
                if i == 0 {
                    let ptrs = Fp8Ptrs {
                        x: x.ptr(),
                        x_scale: xs.ptr(),
                        w: w.ptr(),
                        w_scale: ws.ptr(),
                        out: out.ptr(),
                        bias: bias.map(|b| b.ptr()),
                    };
                    // SAFETY: scratch tensors of the plan's layouts; the workspace is
                    // WORKSPACE bytes; all outlive the timing graphs.
                    unsafe { self.matmul(&self.algo, &ptrs, false, workspace.ptr(), raw) }
                } else {
                    // SAFETY: as above; the kernel takes the spec (checked by the caller).
                    unsafe { own[i - 1].launch(k, cs, sp, [&x, &xs, w, &ws, &out], bias) }
                }
            })
        })();
        match timed {
            Ok(i) => {
                cuda.tuning_cache
                    .put(&spec, [i as u64, 0, 0, 0, 0, 0, 0, 0], 0);
                pick(i)
            }
            // Timing not possible here (e.g. inside a capture): as without tuning.
            Err(_) => Some(first),
        }
    }

    /// Times `candidates` on scratch operands of the plan's layouts (see
    /// [`fastest_candidate`]) and returns the fastest's index.
    fn fastest(
        &self,
        k: &Kernels,
        sp: &Fp8Spec,
        candidates: &[lts::cublasLtMatmulAlgo_t],
    ) -> Result<usize> {
        let cuda = k.cuda.as_ref().expect("CUDA plans exist on CUDA");
        let bytes = |r: &Rows, size: usize| ((r.rows - 1) * r.stride + r.cols) * size;
        let (m, n) = (sp.x.rows, sp.w.rows);
        let x = scratch(k, "fp8.tuning.x", bytes(&sp.x, 1))?;
        let ws = weight_copies(k, "fp8.tuning.w", bytes(&sp.w, 1))?;
        let x_scale = scratch(k, "fp8.tuning.x_scale", 4 * m)?;
        let w_scale = scratch(k, "fp8.tuning.w_scale", 4 * n)?;
        let out = scratch(k, "fp8.tuning.out", bytes(&sp.out, sp.out_dt.size()))?;
        let bias = scratch(k, "fp8.tuning.bias", n * sp.out_dt.size())?;
        let s = cuda.tuning_stream(&k.ctx)?;
        // The tuning stream's workspace: the graphs replay on that stream only.
        let workspace = cuda.workspace(&k.ctx, s)?;
        let label = format!("fp8 gemm m={m} n={n} k={} {:?}", sp.x.cols, sp.out_dt);
        fastest_candidate(k, &label, candidates.len(), &|i, r, _, raw| {
            let ptrs = Fp8Ptrs {
                x: x.ptr(),
                x_scale: x_scale.ptr(),
                w: ws[r % ws.len()].ptr(),
                w_scale: w_scale.ptr(),
                out: out.ptr(),
                bias: sp.bias.then(|| bias.ptr()),
            };
            // SAFETY: scratch buffers sized for the layouts; the workspace is WORKSPACE bytes;
            // all outlive the timing graphs.
            unsafe { self.matmul(&candidates[i], &ptrs, false, workspace.ptr(), raw) }
        })
    }

    /// Enqueues the GEMM with `algo` and this run's pointers.
    ///
    /// # Safety
    /// The pointers are live device memory of the plan's layouts and sizes; `workspace`
    /// WORKSPACE bytes; `raw` a stream of the plan's context.
    unsafe fn matmul(
        &self,
        algo: &lts::cublasLtMatmulAlgo_t,
        p: &Fp8Ptrs,
        accumulate: bool,
        workspace: u64,
        raw: lts::cudaStream_t,
    ) -> Result<()> {
        let Fp8Ptrs {
            x,
            x_scale,
            w,
            w_scale,
            out,
            bias,
        } = *p;
        use lts::cublasLtMatmulDescAttributes_t as A;
        let set = |attr, ptr: &u64| {
            // SAFETY: the descriptor is live; the value is a device pointer.
            unsafe {
                lt::set_matmul_desc_attribute(
                    self.desc,
                    attr,
                    ptr as *const u64 as *const c_void,
                    8,
                )
            }
            .map_err(lt_err("cublasLtMatmulDescSetAttribute"))
        };
        set(A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale)?;
        if self.scaling.weight_scale_pointer() {
            set(A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale)?;
        }
        if let Some(b) = &bias {
            set(A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, b)?;
        }
        let (one, zero) = (1f32, 0f32);
        let beta = if accumulate { &one } else { &zero };
        let alpha: *const c_void = match self.scaling {
            Fp8Scaling::AlphaVector => w_scale as *const c_void,
            _ => &one as *const f32 as *const c_void,
        };
        // SAFETY: the caller's contract.
        unsafe {
            lt::matmul(
                self.handle,
                self.desc,
                alpha,
                beta as *const f32 as *const c_void,
                w as *const c_void,
                self.layouts[0],
                x as *const c_void,
                self.layouts[1],
                out as *const c_void,
                self.layouts[2],
                out as *mut c_void,
                self.layouts[2],
                algo,
                workspace as *mut c_void,
                WORKSPACE,
                raw,
            )
        }
        .map_err(lt_err("cublasLtMatmul"))
    }
}

/// [`Kernels::linear_e4m3_split`]: an FP8 linear layer of few rows whose reduction is cut into
/// `parts` equal ranges, each range's product scaled into its own f32 partial sum
/// (`partials[p] = (x[:, range p] · w[:, range p]ᵀ) · x_scale · w_scale`), which a residual's
/// norm adds as it reads them (see [`Kernels::residual_ada_rms_norm_e4m3`]). On CUDA
/// `fp8.cu`'s `linear_e4m3_parts`: more blocks stream the weight than one per 16 output
/// features, and each widens its range of x once for all of its features; on Hopper, where
/// the ranges take at most 1024 codes and N is a multiple of 64, `linear_e4m3_wg_parts`
/// (`wgmma` on the codes as they are) unless [`KernelOptions::fp8_wgmma`](crate::KernelOptions)
/// is off.
pub struct Fp8SplitLinear {
    kernels: Kernels,
    x: Rows,
    w: Rows,
    parts: usize,
    path: SplitPath,
}

/// How an [`Fp8SplitLinear`] runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum SplitPath {
    Host,
    /// `linear_e4m3_parts` with this many feature tiles of 16 a block.
    Parts(usize),
    /// `linear_e4m3_wg_parts`.
    Wgmma,
}

/// Feature tiles of 16 a block of `linear_e4m3_parts` may take, most first.
const PARTS_TILES: [usize; 3] = [4, 2, 1];

/// `linear_e4m3_parts`'s shared memory for `m` rows and ranges of `kc` codes: the range of x
/// widened to f16 (⌈m / 8⌉·8 rows of `kc` values and 16 bytes of padding), or the warps' sums
/// after it (8 warps, 16 features, the rows), whichever is larger.
fn parts_shared(m: usize, kc: usize) -> usize {
    let rows = m.div_ceil(8) * 8;
    (rows * (2 * kc + 16)).max(8 * 16 * rows * 4)
}

impl Kernels {
    /// Plans [`Fp8SplitLinear`] for E4M3 `x` `[M, K]` and `w` `[N, K]` (rows 16-byte aligned,
    /// unit column stride) and contiguous f32 `partials` `[parts, M, N]`: M at most
    /// [`FP8_ROWS_MAX`], K a multiple of 64 · parts. On CUDA the device needs FP8 tensor cores
    /// (sm_89+) and N a multiple of 16.
    pub fn linear_e4m3_split(
        &self,
        x: &Tensor,
        w: &Tensor,
        partials: &Tensor,
    ) -> Result<Fp8SplitLinear> {
        let op = "linear_e4m3_split";
        self.check_ctx(op, &[x, w, partials])?;
        x.expect_dtype(op, "x", DType::E4M3)?;
        w.expect_dtype(op, "w", DType::E4M3)?;
        partials.expect_dtype(op, "partials", DType::F32)?;
        let (xr, wr) = (rows(op, x)?, rows(op, w)?);
        if partials.rank() != 3 || !partials.is_contiguous() {
            return Err(Error::shape(
                op,
                format!("partials {partials:?} must be contiguous [parts, rows, out]"),
            ));
        }
        let (parts, m, kk, n) = (partials.dim(0), xr.rows, xr.cols, wr.rows);
        if wr.cols != kk || partials.dim(1) != m || partials.dim(2) != n {
            return Err(Error::shape(
                op,
                format!("x {x:?} · wᵀ {w:?} does not give partials [parts, M, N] {partials:?}"),
            ));
        }
        if !(1..=FP8_ROWS_MAX).contains(&m) || parts == 0 || kk % (64 * parts) != 0 {
            return Err(Error::shape(
                op,
                format!(
                    "x {x:?} and {parts} parts: need 1 to {FP8_ROWS_MAX} rows and K a multiple of 64 · parts"
                ),
            ));
        }
        let aligned = |t: &Tensor, r: &Rows| t.ptr() % 16 == 0 && r.stride % 16 == 0;
        if !aligned(x, &xr) || !aligned(w, &wr) {
            return Err(Error::shape(
                op,
                format!("x {x:?} and w {w:?} need rows that start 16-byte aligned"),
            ));
        }
        let path = match &self.cuda {
            Some(_) if wg_takes(self, m, kk / parts, n) => SplitPath::Wgmma,
            Some(c) => {
                fp8_tensor_cores(&c.arch)?;
                if parts_shared(m, kk / parts) > c.max_shared as usize {
                    return Err(Error::shape(
                        op,
                        format!(
                            "{m} rows of {} codes a part need {} bytes of shared memory a block; this device has {}",
                            kk / parts,
                            parts_shared(m, kk / parts),
                            c.max_shared
                        ),
                    ));
                }
                // The most features a block that still gives about a block a multiprocessor.
                let dividing = PARTS_TILES.into_iter().filter(|t| n % (16 * t) == 0);
                let tiles = dividing
                    .clone()
                    .find(|t| n / (16 * t) * parts >= c.sms as usize * 9 / 10)
                    .or(dividing.min());
                SplitPath::Parts(tiles.ok_or_else(|| {
                    Error::shape(op, format!("w {w:?}: N must be a multiple of 16 on CUDA"))
                })?)
            }
            None => SplitPath::Host,
        };
        Ok(Fp8SplitLinear {
            kernels: self.clone(),
            x: xr,
            w: wr,
            parts,
            path,
        })
    }
}

impl Fp8SplitLinear {
    /// The number of partial sums.
    pub fn parts(&self) -> usize {
        self.parts
    }

    /// Whether the plan runs on Hopper's `wgmma` (`linear_e4m3_wg_parts`).
    pub fn on_wgmma(&self) -> bool {
        self.path == SplitPath::Wgmma
    }

    /// What runs the plan: `host`, `parts kernel` or `wgmma kernel`.
    pub fn implementation(&self) -> &'static str {
        match self.path {
            SplitPath::Host => "host",
            SplitPath::Parts(_) => "parts kernel",
            SplitPath::Wgmma => "wgmma kernel",
        }
    }

    /// Enqueues it on `s` for tensors of the planned layouts; `x_scale`: at least one f32 (the
    /// first is the activation's scale), `w_scale` N f32 (contiguous).
    pub fn run(
        &self,
        s: Stream,
        x: &Tensor,
        x_scale: &Tensor,
        w: &Tensor,
        w_scale: &Tensor,
        partials: &Tensor,
    ) -> Result<()> {
        let op = "linear_e4m3_split";
        let k = &self.kernels;
        k.check_ctx(op, &[x, x_scale, w, w_scale, partials])?;
        let same = |t: &Tensor, planned: Rows| -> Result<bool> {
            let r = rows(op, t)?;
            Ok(t.dtype() == DType::E4M3
                && t.ptr() % 16 == 0
                && (r.rows, r.cols, r.stride) == (planned.rows, planned.cols, planned.stride))
        };
        let (m, kk, n) = (self.x.rows, self.x.cols, self.w.rows);
        if !same(x, self.x)?
            || !same(w, self.w)?
            || partials.dtype() != DType::F32
            || !partials.is_contiguous()
            || partials.shape() != [self.parts, m, n]
        {
            return Err(Error::shape(
                op,
                format!(
                    "{x:?}, {w:?}, {partials:?} differ from the planned layouts (rows 16-byte aligned)"
                ),
            ));
        }
        for (t, name) in [(x_scale, "x_scale"), (w_scale, "w_scale")] {
            t.expect_dtype(op, name, DType::F32)?;
            t.expect_contiguous(op)?;
        }
        if x_scale.numel() == 0 || w_scale.numel() != n {
            return Err(Error::shape(
                op,
                format!("x_scale {x_scale:?} needs an element, w_scale {w_scale:?} {n}"),
            ));
        }
        let kc = kk / self.parts;
        match (&k.cuda, self.path) {
            (Some(_), SplitPath::Wgmma) => {
                // SAFETY: the layouts were checked against the plan: x m ≤ 64 rows and w N
                // rows of K codes, 16-byte aligned, K = parts · kc with kc ≤ 1024 a multiple
                // of 128, partials [parts, m, N] f32 (wg_takes held when planned).
                unsafe {
                    wg_launch(
                        k,
                        s,
                        (x, self.x),
                        (w, self.w),
                        (x_scale, w_scale),
                        kc,
                        WgOut::Parts(partials),
                    )
                }
            }
            (Some(c), SplitPath::Parts(tiles)) => {
                const NAMES: [[&str; FP8_ROWS_MAX / 8]; 3] = [
                    [
                        "linear_e4m3_parts1r1",
                        "linear_e4m3_parts1r2",
                        "linear_e4m3_parts1r3",
                        "linear_e4m3_parts1r4",
                        "linear_e4m3_parts1r5",
                        "linear_e4m3_parts1r6",
                        "linear_e4m3_parts1r7",
                        "linear_e4m3_parts1r8",
                    ],
                    [
                        "linear_e4m3_parts2r1",
                        "linear_e4m3_parts2r2",
                        "linear_e4m3_parts2r3",
                        "linear_e4m3_parts2r4",
                        "linear_e4m3_parts2r5",
                        "linear_e4m3_parts2r6",
                        "linear_e4m3_parts2r7",
                        "linear_e4m3_parts2r8",
                    ],
                    [
                        "linear_e4m3_parts4r1",
                        "linear_e4m3_parts4r2",
                        "linear_e4m3_parts4r3",
                        "linear_e4m3_parts4r4",
                        "linear_e4m3_parts4r5",
                        "linear_e4m3_parts4r6",
                        "linear_e4m3_parts4r7",
                        "linear_e4m3_parts4r8",
                    ],
                ];
                let name = NAMES[tiles.trailing_zeros() as usize][m.div_ceil(8) - 1];
                let params = [
                    Param::of(x),
                    (self.x.stride as u64).into(),
                    Param::of(x_scale),
                    Param::of(w),
                    (self.w.stride as u64).into(),
                    Param::of(w_scale),
                    Param::of(partials),
                    (m as u32).into(),
                    (n as u32).into(),
                    (kc as u32).into(),
                ];
                // SAFETY: the layouts were checked against the plan: x m ≤ 64 rows and w N rows
                // of K codes, 16-byte aligned, K = parts · kc with kc a multiple of 64, N a
                // multiple of 16 · tiles, partials [parts, m, N] f32; the shared memory fits
                // the device (checked when planned).
                unsafe {
                    c.launch(
                        s,
                        name,
                        None,
                        ((n / (16 * tiles)) as u32, self.parts as u32, 1),
                        (256, 1, 1),
                        parts_shared(m, kc) as u32,
                        &params,
                    )
                }
            }
            _ => {
                let ptrs = (
                    P::of(x),
                    P::of(x_scale),
                    P::of(w),
                    P::of(w_scale),
                    P::of(partials),
                );
                let keep = (
                    x.clone(),
                    x_scale.clone(),
                    w.clone(),
                    w_scale.clone(),
                    partials.clone(),
                );
                let (xr, wr, parts) = (self.x, self.w, self.parts);
                k.host(s, move || {
                    let _ = &keep;
                    // SAFETY: the layouts were checked against the plan.
                    unsafe { host_linear_split(xr, wr, parts, ptrs) };
                })
            }
        }
    }
}

/// The host backend's split FP8 linear layer: per part, the products of its range summed in
/// f32, then scaled by `x_scale · w_scale[n]`.
///
/// # Safety
/// The pointers hold tensors of these layouts (`partials` `[parts, x.rows, w.rows]` f32).
unsafe fn host_linear_split(xr: Rows, wr: Rows, parts: usize, (x, xs, w, ws, pp): (P, P, P, P, P)) {
    let values = code_values();
    let (m, kk, n) = (xr.rows, xr.cols, wr.rows);
    let kc = kk / parts;
    // SAFETY: at least one f32.
    let x_scale = unsafe { xs.ld::<f32>(0) };
    let decode = |t: P, r: Rows, i: usize| -> Vec<f32> {
        (0..r.cols)
            // SAFETY: inside the tensor's layout.
            .map(|c| values[unsafe { *((t.0 + i * r.stride + c) as *const u8) } as usize])
            .collect()
    };
    let xd: Vec<Vec<f32>> = (0..m).map(|i| decode(x, xr, i)).collect();
    Pool::global().run(n, &|j| {
        let wd = decode(w, wr, j);
        // SAFETY: n scales.
        let scale = x_scale * unsafe { ws.ld::<f32>(j) };
        for p in 0..parts {
            let range = p * kc..(p + 1) * kc;
            for (i, xi) in xd.iter().enumerate() {
                let y = super::gemm::dot(&xi[range.clone()], &wd[range.clone()]) * scale;
                // SAFETY: inside partials.
                unsafe { pp.st::<f32>((p * m + i) * n + j, y) };
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::fp8_tensor_cores;

    #[test]
    fn fp8_runs_from_sm_89_on_and_is_refused_before_by_reason() {
        for arch in [
            "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100f", "sm_110", "sm_120",
        ] {
            fp8_tensor_cores(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        }
        for arch in ["sm_80", "sm_86", "sm_87", "host", ""] {
            let e = fp8_tensor_cores(arch).unwrap_err().to_string();
            assert!(
                e.contains("sm_89 or newer") && e.contains(arch),
                "{arch}: {e}"
            );
        }
    }
}
