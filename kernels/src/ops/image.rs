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

/// One axis's span of output sample `k`: (first input index, taps, start in the weights),
/// when it lies inside `len` inputs and the weights.
fn span(spans: &[i32], k: usize, len: usize, weights: usize) -> Option<(usize, usize, usize)> {
    let s = &spans[3 * k..3 * k + 3];
    let (f, n, o) = (s[0] as i64, s[1] as i64, s[2] as i64);
    let fits = f >= 0 && n >= 0 && o >= 0 && f + n <= len as i64 && o + n <= weights as i64;
    fits.then_some((f as usize, n as usize, o as usize))
}

/// [`Kernels::resize_pad_pixels`] on the host: separable, each output row's column sums
/// first (into `row`), then each pixel's; the same sums in the same order as the CUDA kernel.
#[allow(clippy::too_many_arguments)]
fn resize_host(
    src: &[u8],
    (h, w): (usize, usize),
    spans: &[i32],
    weights: &[f32],
    p: Placement,
    tw: usize,
    out: &mut [f32],
    row: &mut Vec<f32>,
) {
    out.fill(-1.0);
    row.resize(w * 3, 0.0);
    for y in 0..p.rows {
        let Some((fy, ny, oy)) = span(spans, y, h, weights.len()) else {
            continue;
        };
        let taps = &weights[oy..oy + ny];
        for (c, r) in row.iter_mut().enumerate() {
            *r = 0.0;
            for (t, &a) in taps.iter().enumerate() {
                *r += a * src[(fy + t) * w * 3 + c] as f32;
            }
        }
        let line = &mut out[((p.top + y) * tw + p.left) * 3..][..p.cols * 3];
        for (x, px) in line.chunks_exact_mut(3).enumerate() {
            let Some((fx, nx, ox)) = span(spans, p.rows + x, w, weights.len()) else {
                continue;
            };
            let mut v = [0f32; 3];
            for (j, &b) in weights[ox..ox + nx].iter().enumerate() {
                let r = &row[(fx + j) * 3..(fx + j) * 3 + 3];
                for (v, r) in v.iter_mut().zip(r) {
                    *v += b * r;
                }
            }
            for (o, v) in px.iter_mut().zip(v) {
                // Half to even (adding and taking away 2^23 rounds a value in [0, 255] so),
                // clamped.
                let q = ((v.clamp(0.0, 255.0) + 8_388_608.0) - 8_388_608.0) as i32 as u8;
                *o = q as f32 / 255.0 * 2.0 - 1.0;
            }
        }
    }
}

thread_local! {
    /// The host op's row of column sums (reused: nothing is allocated per call once it has
    /// grown to the widest frame).
    static ROW: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
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
                    ROW.with_borrow_mut(|row| {
                        resize_host(src, (h, w), spans, weights, place, tw, out, row)
                    });
                })
            }
        }
    }
}
