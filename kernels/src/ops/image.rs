//! Camera frames to model pixels: a separable weighted resize of a u8 frame from tap tables,
//! rounded to u8, placed in a frame of black, scaled to [−1, 1] (openpi's `resize_with_pad`
//! and `x / 255 · 2 − 1` when the tables are its antialiased bilinear taps; `frt_vla::inputs`
//! builds them). CUDA twin: `kernels/cuda/image.cu`, equal to this one bit for bit.

use super::grid_1d;
use crate::cuda::Param;
use crate::error::{Error, Result};
use crate::{DType, Kernels, Tensor};
use frt_exec::Stream;

/// Where the resized image lies in the output frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Rows and columns of the resized image.
    pub rows: usize,
    pub cols: usize,
    /// Its first row and column in the output (the padding above and to the left).
    pub top: usize,
    pub left: usize,
}

/// One output pixel of [`Kernels::resize_pad_pixels`] on the host: `spans` and `weights` as
/// described there; black (−1) when a span falls outside the frame or the weights.
#[allow(clippy::too_many_arguments)]
fn pixel(
    src: &[u8],
    (h, w): (usize, usize),
    spans: &[i32],
    weights: &[f32],
    p: Placement,
    y: usize,
    x: usize,
    out: &mut [f32],
) {
    out.fill(-1.0);
    if y < p.top || y >= p.top + p.rows || x < p.left || x >= p.left + p.cols {
        return;
    }
    let span = |k: usize| {
        let s = &spans[3 * k..3 * k + 3];
        (s[0] as i64, s[1] as i64, s[2] as i64)
    };
    let ((fy, ny, oy), (fx, nx, ox)) = (span(y - p.top), span(p.rows + x - p.left));
    let nw = weights.len() as i64;
    let fits = |f: i64, n: i64, o: i64, len: usize| {
        f >= 0 && n >= 0 && o >= 0 && f + n <= len as i64 && o + n <= nw
    };
    if !fits(fy, ny, oy, h) || !fits(fx, nx, ox, w) {
        return;
    }
    let mut v = [0f32; 3];
    for j in 0..nx as usize {
        let mut r = [0f32; 3];
        for t in 0..ny as usize {
            let a = weights[oy as usize + t];
            let at = ((fy as usize + t) * w + fx as usize + j) * 3;
            for (r, s) in r.iter_mut().zip(&src[at..at + 3]) {
                *r += a * *s as f32;
            }
        }
        let b = weights[ox as usize + j];
        for (v, r) in v.iter_mut().zip(r) {
            *v += b * r;
        }
    }
    for (o, v) in out.iter_mut().zip(v) {
        // Half to even (adding and taking away 2^23 rounds a value in [0, 255] so), clamped.
        let q = ((v.clamp(0.0, 255.0) + 8_388_608.0) - 8_388_608.0) as i32 as u8;
        *o = q as f32 / 255.0 * 2.0 - 1.0;
    }
}

impl Kernels {
    /// Resizes the u8 frame `src` (`[h, w, 3]`, HWC) with the tap tables `spans` and
    /// `weights`, rounds to u8 (half to even, clamped to [0, 255]), places the result at
    /// `place` in a black frame of `out`'s size and scales it to [−1, 1] (`q / 255 · 2 − 1`)
    /// into `out` (`[th, tw, 3]`, f32).
    ///
    /// `spans` (`[place.rows + place.cols, 3]`, i32): per output row, then per output column,
    /// the first input row (column), how many taps follow, and where their weights start in
    /// `weights` (f32). An output row's value is `Σ_j wx_j · (Σ_t wy_t · src[..])`, every sum
    /// from 0 in tap order, rows first: the order of openpi's separable resize. A span that
    /// reaches outside the frame or the weights gives a black pixel (nothing is read).
    #[allow(clippy::too_many_arguments)]
    pub fn resize_pad_pixels(
        &self,
        s: Stream,
        src: &Tensor,
        spans: &Tensor,
        weights: &Tensor,
        place: Placement,
        out: &Tensor,
    ) -> Result<()> {
        const OP: &str = "resize_pad_pixels";
        self.check_ctx(OP, &[src, spans, weights, out])?;
        src.expect_dtype(OP, "src", DType::U8)?;
        spans.expect_dtype(OP, "spans", DType::I32)?;
        weights.expect_dtype(OP, "weights", DType::F32)?;
        out.expect_dtype(OP, "out", DType::F32)?;
        for t in [src, spans, weights, out] {
            t.expect_contiguous(OP)?;
        }
        let (&[h, w, 3], &[th, tw, 3]) = (src.shape(), out.shape()) else {
            return Err(Error::shape(
                OP,
                format!("src {src:?} and out {out:?} must be [rows, columns, 3]"),
            ));
        };
        if spans.shape() != [place.rows + place.cols, 3]
            || place.top + place.rows > th
            || place.left + place.cols > tw
        {
            return Err(Error::shape(
                OP,
                format!("{place:?} in {th}×{tw} with spans {spans:?}"),
            ));
        }
        let nw = weights.numel();
        match &self.cuda {
            Some(c) => {
                let u = |v: usize| v as u32;
                // SAFETY: the tensors' sizes were checked above; the kernel reads the frame
                // and the weights only within spans it checks against h, w and nw.
                unsafe {
                    c.launch(
                        s,
                        "resize_pad_pixels",
                        None,
                        (grid_1d(th * tw), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Param::Mem(src, src.ptr()),
                            u(h).into(),
                            u(w).into(),
                            Param::Mem(spans, spans.ptr()),
                            Param::Mem(weights, weights.ptr()),
                            u(nw).into(),
                            u(place.rows).into(),
                            u(place.cols).into(),
                            u(th).into(),
                            u(tw).into(),
                            u(place.top).into(),
                            u(place.left).into(),
                            Param::Mem(out, out.ptr()),
                        ],
                    )
                }
            }
            None => {
                let (sp, spp, wp, op) = (src.ptr(), spans.ptr(), weights.ptr(), out.ptr());
                let keep = (src.clone(), spans.clone(), weights.clone(), out.clone());
                let n_spans = spans.numel();
                self.host(s, move || {
                    let _ = &keep;
                    // SAFETY: the tensors hold these many contiguous elements of these types
                    // (checked above) and live as long as `keep`; `out` is written by this
                    // operation alone while it runs.
                    let (src, spans, weights, out) = unsafe {
                        (
                            std::slice::from_raw_parts(sp as *const u8, h * w * 3),
                            std::slice::from_raw_parts(spp as *const i32, n_spans),
                            std::slice::from_raw_parts(wp as *const f32, nw),
                            std::slice::from_raw_parts_mut(op as *mut f32, th * tw * 3),
                        )
                    };
                    for (i, px) in out.chunks_exact_mut(3).enumerate() {
                        pixel(src, (h, w), spans, weights, place, i / tw, i % tw, px);
                    }
                })
            }
        }
    }
}
