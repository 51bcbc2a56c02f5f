//! Convolution-shaped ops: `conv1d` (Whisper's stem: kernel 3, padding 1, stride 1 or 2) and
//! `patchify` (the im2col of a ViT patch embedding), plus [`PatchEmbed`], SigLIP's patch
//! embedding as patchify + GEMM + learned position embedding.
//! CUDA twin: `kernels/cuda/conv.cu`.

use super::{P, grid_1d};
use crate::cuda::Param;
use crate::dtype::with_float;
use crate::error::{Error, Result};
use crate::{Gemm, Kernels, Tensor};
use frt_exec::Stream;

impl Kernels {
    /// 1-D convolution over time: `x` `[t_in, c_in]` (time-major), `w` `[c_out, c_in, kw]`
    /// (PyTorch's layout), `b` `[c_out]`, `out` `[t_out, c_out]` with
    /// `t_out = (t_in + 2·pad − kw) / stride + 1`.
    #[allow(clippy::too_many_arguments)]
    pub fn conv1d(
        &self,
        s: Stream,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        out: &Tensor,
        stride: usize,
        pad: usize,
    ) -> Result<()> {
        let op = "conv1d";
        self.check_ctx(op, &[x, w, b, out])?;
        x.expect_float(op, "x")?;
        for (t, n) in [(w, "w"), (b, "b"), (out, "out")] {
            t.expect_dtype(op, n, x.dtype())?;
            t.expect_contiguous(op)?;
        }
        x.expect_contiguous(op)?;
        if x.rank() != 2 || w.rank() != 3 || out.rank() != 2 || stride == 0 {
            return Err(Error::shape(
                op,
                format!("x {x:?}, w {w:?}, out {out:?} must be [t, c], [o, c, k], [t, o]"),
            ));
        }
        let (t_in, c_in, c_out, kw) = (x.dim(0), x.dim(1), w.dim(0), w.dim(2));
        let t_out = (t_in + 2 * pad)
            .checked_sub(kw)
            .map(|v| v / stride + 1)
            .unwrap_or(0);
        if w.dim(1) != c_in
            || b.numel() != c_out
            || out.dim(0) != t_out
            || out.dim(1) != c_out
            || t_out == 0
        {
            return Err(Error::shape(
                op,
                format!("x {x:?}, w {w:?}, b {b:?}, out {out:?}: expected out [{t_out}, {c_out}]"),
            ));
        }
        let dt = x.dtype();
        match &self.cuda {
            Some(c) => {
                let (xp, wp, bp, op_) = (x.ptr(), w.ptr(), b.ptr(), out.ptr());
                let (a, ci, to, co, k, st, pd) = (
                    t_in as u32,
                    c_in as u32,
                    t_out as u32,
                    c_out as u32,
                    kw as u32,
                    stride as u32,
                    pad as u32,
                );
                // SAFETY: sizes checked; reads outside [0, t_in) are skipped in the kernel.
                unsafe {
                    c.launch(
                        s,
                        "conv1d",
                        Some(dt),
                        (grid_1d(t_out * c_out), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Param::Mem(x, xp),
                            Param::Mem(w, wp),
                            Param::Mem(b, bp),
                            Param::Mem(out, op_),
                            a.into(),
                            ci.into(),
                            to.into(),
                            co.into(),
                            k.into(),
                            st.into(),
                            pd.into(),
                        ],
                    )
                }
            }
            None => {
                let (xp, wp, bp, op_) = (P::of(x), P::of(w), P::of(b), P::of(out));
                let keep = (x.clone(), w.clone(), b.clone(), out.clone());
                self.host(s, move || {
                    let _ = &keep;
                    with_float!(dt, T, {
                        crate::pool::Pool::global().run(t_out, &|t| {
                            for o in 0..c_out {
                                // SAFETY: indices inside the checked sizes.
                                unsafe {
                                    let mut acc = bp.ld::<T>(o);
                                    for r in 0..kw {
                                        let ti = (t * stride + r) as isize - pad as isize;
                                        if ti < 0 || ti >= t_in as isize {
                                            continue;
                                        }
                                        for i in 0..c_in {
                                            acc += wp.ld::<T>((o * c_in + i) * kw + r)
                                                * xp.ld::<T>(ti as usize * c_in + i);
                                        }
                                    }
                                    op_.st::<T>(t * c_out + o, acc);
                                }
                            }
                        })
                    })
                })
            }
        }
    }

    /// Cuts `images` `[n, h, w, c]` (NHWC) into `p×p` patches: `out` is
    /// `[n·(h/p)·(w/p), c·p·p]`, each patch in (channel, row, column) order — the order of a
    /// convolution weight `[width, c, p, p]` flattened to `[width, c·p·p]`.
    pub fn patchify(&self, s: Stream, images: &Tensor, out: &Tensor, p: usize) -> Result<()> {
        let op = "patchify";
        self.check_ctx(op, &[images, out])?;
        images.expect_float(op, "images")?;
        out.expect_dtype(op, "out", images.dtype())?;
        images.expect_contiguous(op)?;
        out.expect_contiguous(op)?;
        if images.rank() != 4 || p == 0 || images.dim(1) % p != 0 || images.dim(2) % p != 0 {
            return Err(Error::shape(
                op,
                format!("images {images:?} must be [n, h, w, c] with h, w multiples of {p}"),
            ));
        }
        let (n, h, w, c) = (images.dim(0), images.dim(1), images.dim(2), images.dim(3));
        let (patches, len) = (n * (h / p) * (w / p), c * p * p);
        if out.rank() != 2 || out.dim(0) != patches || out.dim(1) != len {
            return Err(Error::shape(
                op,
                format!("out {out:?} must be [{patches}, {len}]"),
            ));
        }
        let dt = images.dtype();
        match &self.cuda {
            Some(cu) => {
                let (ip, op_) = (images.ptr(), out.ptr());
                let (n_, h_, w_, c_, p_) = (n as u32, h as u32, w as u32, c as u32, p as u32);
                // SAFETY: sizes checked.
                unsafe {
                    cu.launch(
                        s,
                        "patchify",
                        Some(dt),
                        (grid_1d(patches * len), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Param::Mem(images, ip),
                            Param::Mem(out, op_),
                            n_.into(),
                            h_.into(),
                            w_.into(),
                            c_.into(),
                            p_.into(),
                        ],
                    )
                }
            }
            None => {
                let (ip, op_, keep) = (P::of(images), P::of(out), (images.clone(), out.clone()));
                self.host(s, move || {
                    let _ = &keep;
                    let (gh, gw) = (h / p, w / p);
                    with_float!(dt, T, {
                        for patch in 0..patches {
                            let (img, py, px) = (patch / (gh * gw), (patch / gw) % gh, patch % gw);
                            for e in 0..len {
                                let (ch, ky, kx) = (e / (p * p), (e / p) % p, e % p);
                                let src = ((img * h + py * p + ky) * w + px * p + kx) * c + ch;
                                // SAFETY: indices inside the checked sizes.
                                unsafe { op_.st::<T>(patch * len + e, ip.ld::<T>(src)) };
                            }
                        }
                    })
                })
            }
        }
    }
}

impl Kernels {
    /// The im2col of [`conv1d`](Self::conv1d): `x` `[t_in, c_in]` → `cols`
    /// `[t_out, c_in·kw]`, `cols[t, i·kw + r] = x[t·stride + r − pad, i]` (zero outside), the
    /// order of a weight `[c_out, c_in, kw]` flattened to `[c_out, c_in·kw]`.
    #[allow(clippy::too_many_arguments)]
    pub fn im2col_1d(
        &self,
        s: Stream,
        x: &Tensor,
        cols: &Tensor,
        kw: usize,
        stride: usize,
        pad: usize,
    ) -> Result<()> {
        let op = "im2col_1d";
        self.check_ctx(op, &[x, cols])?;
        x.expect_float(op, "x")?;
        cols.expect_dtype(op, "cols", x.dtype())?;
        x.expect_contiguous(op)?;
        cols.expect_contiguous(op)?;
        if x.rank() != 2 || cols.rank() != 2 || stride == 0 || kw == 0 {
            return Err(Error::shape(
                op,
                format!("x {x:?} and cols {cols:?} must be 2-D"),
            ));
        }
        let (t_in, c_in) = (x.dim(0), x.dim(1));
        let t_out = (t_in + 2 * pad)
            .checked_sub(kw)
            .map(|v| v / stride + 1)
            .unwrap_or(0);
        if t_out == 0 || cols.dim(0) != t_out || cols.dim(1) != c_in * kw {
            return Err(Error::shape(
                op,
                format!("cols {cols:?} must be [{t_out}, {}]", c_in * kw),
            ));
        }
        let dt = x.dtype();
        match &self.cuda {
            Some(c) => {
                let (xp, cp) = (x.ptr(), cols.ptr());
                let (a, ci, to, k, st, pd) = (
                    t_in as u32,
                    c_in as u32,
                    t_out as u32,
                    kw as u32,
                    stride as u32,
                    pad as u32,
                );
                // SAFETY: sizes checked; reads outside [0, t_in) are skipped in the kernel.
                unsafe {
                    c.launch(
                        s,
                        "im2col_1d",
                        Some(dt),
                        (grid_1d(t_out * c_in * kw), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Param::Mem(x, xp),
                            Param::Mem(cols, cp),
                            a.into(),
                            ci.into(),
                            to.into(),
                            k.into(),
                            st.into(),
                            pd.into(),
                        ],
                    )
                }
            }
            None => {
                let (xp, cp, keep) = (P::of(x), P::of(cols), (x.clone(), cols.clone()));
                self.host(s, move || {
                    let _ = &keep;
                    with_float!(dt, T, {
                        for t in 0..t_out {
                            for i in 0..c_in {
                                for r in 0..kw {
                                    let ti = (t * stride + r) as isize - pad as isize;
                                    // SAFETY: indices inside the checked sizes.
                                    unsafe {
                                        let v = if ti < 0 || ti >= t_in as isize {
                                            0.0
                                        } else {
                                            xp.ld::<T>(ti as usize * c_in + i)
                                        };
                                        cp.st::<T>(t * c_in * kw + i * kw + r, v);
                                    }
                                }
                            }
                        }
                    })
                })
            }
        }
    }
}

/// conv1d planned as im2col + one GEMM with the bias epilogue (the fast path; `conv1d` is
/// the direct form). The im2col scratch is allocated when planned.
pub struct Conv1d {
    gemm: Gemm,
    cols: Tensor,
    kw: usize,
    stride: usize,
    pad: usize,
}

impl Conv1d {
    /// For `x` `[t_in, c_in]`, `w` `[c_out, c_in, kw]`, `out` `[t_out, c_out]`.
    pub fn new(
        k: &Kernels,
        x: &Tensor,
        w: &Tensor,
        out: &Tensor,
        stride: usize,
        pad: usize,
    ) -> Result<Conv1d> {
        if x.rank() != 2 || w.rank() != 3 || out.rank() != 2 {
            return Err(Error::shape(
                "conv1d",
                format!("x {x:?}, w {w:?}, out {out:?} must be [t, c], [o, c, k], [t, o]"),
            ));
        }
        let (c_in, c_out, kw) = (x.dim(1), w.dim(0), w.dim(2));
        let cols = Tensor::alloc(k.ctx(), "conv1d.cols", x.dtype(), &[out.dim(0), c_in * kw])?;
        let w2 = w.reshape(&[c_out, c_in * kw])?;
        let gemm = k.linear(&cols, &w2, out, true, false)?;
        Ok(Conv1d {
            gemm,
            cols,
            kw,
            stride,
            pad,
        })
    }

    pub fn run(
        &self,
        k: &Kernels,
        s: Stream,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        k.im2col_1d(s, x, &self.cols, self.kw, self.stride, self.pad)?;
        let w2 = w.reshape(&[w.dim(0), w.dim(1) * w.dim(2)])?;
        self.gemm.run(s, &self.cols, &w2, out, Some(b))
    }
}

/// A ViT patch embedding (SigLIP's): patchify, then `patches · wᵀ + b` (one GEMM with the
/// bias epilogue), then the learned position embedding added to every image's patches.
/// Planned once for its shapes; `run` enqueues the three steps.
pub struct PatchEmbed {
    gemm: Gemm,
    patch: usize,
    images: usize,
    per_image: usize,
}

impl PatchEmbed {
    /// For `images` `[n, h, w, c]`, the scratch `patches` `[n·h/p·w/p, c·p·p]`, the weight
    /// `w` `[width, c·p·p]` (a `[width, c, p, p]` convolution weight reshaped), and `out`
    /// `[n·h/p·w/p, width]`.
    pub fn new(
        k: &Kernels,
        images: &Tensor,
        patches: &Tensor,
        w: &Tensor,
        out: &Tensor,
        patch: usize,
    ) -> Result<PatchEmbed> {
        if images.rank() != 4 || patch == 0 {
            return Err(Error::shape(
                "patch_embed",
                format!("images {images:?} must be [n, h, w, c]"),
            ));
        }
        let gemm = k.linear(patches, w, out, true, false)?;
        let per_image = (images.dim(1) / patch) * (images.dim(2) / patch);
        Ok(PatchEmbed {
            gemm,
            patch,
            images: images.dim(0),
            per_image,
        })
    }

    /// `pos` is `[patches per image, width]`; `b` is `[width]`.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        k: &Kernels,
        s: Stream,
        images: &Tensor,
        patches: &Tensor,
        w: &Tensor,
        b: &Tensor,
        pos: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        k.patchify(s, images, patches, self.patch)?;
        self.gemm.run(s, patches, w, out, Some(b))?;
        for i in 0..self.images {
            let o = out.narrow(0, i * self.per_image, self.per_image)?;
            k.add(s, &o, pos, &o)?;
        }
        Ok(())
    }
}
