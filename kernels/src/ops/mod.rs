//! The ops, one file per family (`kernels/src/ops/norm.rs` + `kernels/cuda/norm.cu`). Each
//! op is a method of [`Kernels`](crate::Kernels) with a host branch and a CUDA branch.

pub mod attention;
pub mod conv;
pub mod elementwise;
pub mod flow;
pub mod fp8;
pub mod fp8_mlp;
pub mod gemm;
pub mod image;
pub mod mlp;
pub mod norm;
pub mod rope;

use crate::Tensor;
use crate::dtype::Float;
use crate::error::{Error, Result};

/// A tensor seen as `rows × cols` with unit column stride and a row stride (the leading
/// dimensions must be collapsible into one).
#[derive(Copy, Clone, Debug)]
pub(crate) struct Rows {
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
}

pub(crate) fn rows(op: &'static str, t: &Tensor) -> Result<Rows> {
    let (sh, st) = (t.shape(), t.strides());
    let r = sh.len();
    if st[r - 1] != 1 {
        return Err(Error::shape(
            op,
            format!("{t:?}: the last dimension must be contiguous"),
        ));
    }
    for i in 0..r.saturating_sub(2) {
        if st[i] != st[i + 1] * sh[i + 1] {
            return Err(Error::shape(
                op,
                format!("{t:?}: leading dimensions must collapse into rows"),
            ));
        }
    }
    let cols = sh[r - 1];
    let rows = t.numel() / cols;
    let stride = if r >= 2 { st[r - 2] } else { cols };
    Ok(Rows { rows, cols, stride })
}

/// `b` as rows matching `a`, or one row broadcast (stride 0).
pub(crate) fn broadcast_rows(op: &'static str, a: Rows, b: &Tensor) -> Result<Rows> {
    let rb = rows(op, b)?;
    if rb.rows == a.rows && rb.cols == a.cols {
        Ok(rb)
    } else if rb.rows == 1 && rb.cols == a.cols {
        Ok(Rows { stride: 0, ..rb })
    } else {
        Err(Error::shape(
            op,
            format!(
                "{b:?} matches neither {}×{} nor one row of {}",
                a.rows, a.cols, a.cols
            ),
        ))
    }
}

pub(crate) fn same_rows(op: &'static str, a: Rows, b: Rows, what: &str) -> Result<()> {
    if a.rows == b.rows && a.cols == b.cols {
        Ok(())
    } else {
        Err(Error::shape(
            op,
            format!("{what}: {}×{} vs {}×{}", a.rows, a.cols, b.rows, b.cols),
        ))
    }
}

/// Raw element access for host kernels. The tensors a host kernel touches are kept alive by
/// its closure; the stream orders every access, so there is no concurrent writer.
#[derive(Copy, Clone)]
pub(crate) struct P(pub usize);

impl P {
    pub fn of(t: &Tensor) -> P {
        P(t.ptr() as usize)
    }
    /// # Safety
    /// `i` is inside the tensor the pointer came from, whose element type is `T`.
    #[inline(always)]
    pub unsafe fn ld<T: Float>(self, i: usize) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { (self.0 as *const T).add(i).read() }.to_f32()
    }
    /// # Safety
    /// As for `ld`.
    #[inline(always)]
    pub unsafe fn st<T: Float>(self, i: usize, v: f32) {
        // SAFETY: the caller's contract.
        unsafe { (self.0 as *mut T).add(i).write(T::from_f32(v)) }
    }
    /// # Safety
    /// As for `ld`, for an `i32` tensor.
    #[inline(always)]
    pub unsafe fn ld_i32(self, i: usize) -> i32 {
        // SAFETY: the caller's contract.
        unsafe { (self.0 as *const i32).add(i).read() }
    }
}

/// The GELU with the tanh approximation, as in Gemma, SigLIP and Whisper's MLPs.
#[inline(always)]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const K: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + (K * (x + 0.044715 * x * x * x)).tanh())
}

/// Whether a launch may move 8 elements per 16-byte access: every pointer 16-byte aligned,
/// and the row length and every row stride multiples of 8 elements.
pub(crate) fn vec8(ptrs: &[u64], cols: usize, strides: &[usize]) -> i32 {
    (ptrs.iter().all(|p| p % 16 == 0) && cols % 8 == 0 && strides.iter().all(|s| s % 8 == 0)) as i32
}

/// Threads for a one-block-per-row kernel: enough for one access unit each, 32 to 256.
pub(crate) fn row_block(cols: usize, vec: i32) -> u32 {
    let units = if vec != 0 { cols / 8 } else { cols };
    (units.div_ceil(32) * 32).clamp(32, 256) as u32
}

/// Grid size for `n` elements at 256 threads a block, capped (kernels loop with a stride).
pub(crate) fn grid_1d(n: usize) -> u32 {
    n.div_ceil(256).clamp(1, 65_535 * 8) as u32
}

/// Per-column f32 scales (the weight's feature scales an FP8 GEMM left to the op reading its
/// output): contiguous, one for each of `cols` columns.
pub(crate) fn check_column_scales(
    op: &'static str,
    name: &'static str,
    t: &Tensor,
    cols: usize,
) -> Result<()> {
    t.expect_dtype(op, name, crate::DType::F32)?;
    t.expect_contiguous(op)?;
    if t.numel() != cols {
        return Err(Error::shape(
            op,
            format!("{name} {t:?} must have one scale per column ({cols})"),
        ));
    }
    Ok(())
}

/// E4M3 `codes` an op writes beside its output of `out` rows (`[rows, cols]`, contiguous) and
/// the one-value f32 scale they are made with.
pub(crate) fn check_codes(
    k: &crate::Kernels,
    op: &'static str,
    (codes, scale): (&Tensor, &Tensor),
    out: Rows,
) -> Result<()> {
    k.check_ctx(op, &[codes, scale])?;
    codes.expect_dtype(op, "codes", crate::DType::E4M3)?;
    scale.expect_dtype(op, "code scale", crate::DType::F32)?;
    codes.expect_contiguous(op)?;
    if codes.numel() != out.rows * out.cols || scale.numel() == 0 {
        return Err(Error::shape(
            op,
            format!(
                "codes {codes:?} must have out's {} × {} values, {scale:?} a scale",
                out.rows, out.cols
            ),
        ));
    }
    Ok(())
}

/// A planned GEMM's bias as given to a run: present exactly when the plan has one, then
/// contiguous, of `dt`, with `n` elements (one per output column).
pub(crate) fn check_bias(
    k: &crate::Kernels,
    op: &'static str,
    bias: Option<&Tensor>,
    planned: bool,
    dt: crate::DType,
    n: usize,
) -> Result<()> {
    match (bias, planned) {
        (Some(t), true) => {
            k.check_ctx(op, &[t])?;
            t.expect_dtype(op, "bias", dt)?;
            t.expect_contiguous(op)?;
            if t.numel() != n {
                return Err(Error::shape(
                    op,
                    format!("bias {t:?} must have n = {n} elements"),
                ));
            }
            Ok(())
        }
        (None, false) => Ok(()),
        _ => Err(Error::shape(
            op,
            "a bias is given exactly when the plan was made with one",
        )),
    }
}
