//! Row normalizations: RMSNorm with (1 + w) (Gemma), adaptive RMSNorm (pi05's action expert),
//! LayerNorm (SigLIP, Whisper), and softmax. Statistics in f32.
//! CUDA twin: `kernels/cuda/norm.cu`.

use super::{P, Rows, broadcast_rows, row_block, rows, same_rows, vec8};
use crate::cuda::Param;
use crate::dtype::{Float, with_float};
use crate::error::{Error, Result};
use crate::{Kernels, Tensor};
use frt_exec::Stream;

enum Affine {
    /// `(1 + w)`
    OnePlusW(Tensor),
    /// `(1 + scale)` and `+ shift` from a modulation row `[scale | shift | gate]`.
    Modulation(Tensor, Rows),
}

/// A residual added into `x` before it is normalized: `x ← x + y ⊙ by`. With `parts`, `y`
/// is that many f32 partial sums (`parts.1` elements apart), added in order and rounded to
/// `x`'s dtype.
struct Residual {
    y: Tensor,
    ry: Rows,
    by: Multiplier,
    parts: Option<(usize, usize)>,
}

/// What a residual's `y` is multiplied by: a gate of `x`'s dtype (one row, or one per row),
/// f32 scales, one per column (an FP8 GEMM's deferred feature scales), or nothing.
enum Multiplier {
    Gate(Tensor, Rows),
    Scales(Tensor),
    One,
}

/// f32 twins of a norm's input and output (see [`Kernels::ada_rms_norm_from`] and
/// [`Kernels::residual_ada_rms_norm_widened`]): `x32` sets `x` (rounded) before the norm, `out32`
/// receives the output widened from its stored values. Each has its partner's row layout.
/// `codes` (E4M3 `[rows, cols]`, contiguous, with a one-value f32 scale) receives the stored
/// output quantized: the codes [`Kernels::quantize_e4m3`] of `out` gives.
#[derive(Default)]
struct Wide {
    x32: Option<Tensor>,
    out32: Option<Tensor>,
    codes: Option<(Tensor, Tensor)>,
}

/// A modulation `[scale | shift | gate]` as rows for `x`'s rows: one row (stride 0, shared by
/// every row) or one per row.
fn modulation_rows(op: &'static str, modulation: &Tensor, rx: Rows) -> Result<Rows> {
    let rm = rows(op, modulation)?;
    if rm.cols != 3 * rx.cols || (rm.rows != rx.rows && rm.rows != 1) {
        return Err(Error::shape(
            op,
            format!(
                "modulation {modulation:?} must be 1 or {} rows of 3×{}",
                rx.rows, rx.cols
            ),
        ));
    }
    Ok(if rm.rows == 1 {
        Rows { stride: 0, ..rm }
    } else {
        rm
    })
}

/// `y` as f32 partial sums `[parts, ..x's shape]` (contiguous, a
/// [`SplitLinear`](crate::SplitLinear)'s output) for `x` (rows `rx`): the rows of one part, and
/// (parts, elements a part).
fn partial_sums(
    op: &'static str,
    x: &Tensor,
    rx: Rows,
    y: &Tensor,
) -> Result<(Rows, (usize, usize))> {
    if y.dtype() != crate::DType::F32
        || y.rank() != x.rank() + 1
        || !y.is_contiguous()
        || y.shape()[1..] != *x.shape()
        || y.dim(0) == 0
    {
        return Err(Error::shape(
            op,
            format!(
                "partial sums {y:?} must be f32, contiguous [parts, {:?}]",
                x.shape()
            ),
        ));
    }
    let n = y.dim(0);
    let ry = Rows {
        rows: rx.rows,
        cols: rx.cols,
        stride: rx.cols,
    };
    Ok((ry, (n, y.numel() / n)))
}

impl Kernels {
    fn check_vector(
        op: &'static str,
        name: &'static str,
        v: &Tensor,
        x: &Tensor,
        len: usize,
    ) -> Result<()> {
        v.expect_dtype(op, name, x.dtype())?;
        v.expect_contiguous(op)?;
        if v.numel() != len {
            return Err(Error::shape(
                op,
                format!("`{name}` {v:?} must have {len} elements"),
            ));
        }
        Ok(())
    }

    /// The rows a norm of `x` (rows `rx`) writes: `out`'s, checked against `x`; without `out`
    /// (where `codes_only` allows it: only the codes are written) contiguous rows of `x`'s
    /// width, the codes' layout.
    fn out_rows(
        &self,
        op: &'static str,
        x: &Tensor,
        rx: Rows,
        out: Option<&Tensor>,
        codes_only: bool,
    ) -> Result<Rows> {
        match out {
            Some(out) => {
                self.check_ctx(op, &[out])?;
                let ro = rows(op, out)?;
                same_rows(op, rx, ro, "x vs out")?;
                out.expect_dtype(op, "out", x.dtype())?;
                Ok(ro)
            }
            None if codes_only => Ok(Rows {
                stride: rx.cols,
                ..rx
            }),
            None => Err(Error::shape(op, "no output: neither `out` nor codes")),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn rms_common(
        &self,
        s: Stream,
        op: &'static str,
        x: &Tensor,
        affine: Affine,
        residual: Option<Residual>,
        out: Option<&Tensor>,
        eps: f32,
        wide: Wide,
    ) -> Result<()> {
        let rx = rows(op, x)?;
        let codes_only = wide.codes.is_some() && wide.out32.is_none();
        let ro = self.out_rows(op, x, rx, out, codes_only)?;
        for (t, partner, name) in [(&wide.x32, Some(x), "x32"), (&wide.out32, out, "out32")] {
            let (Some(t), Some(partner)) = (t, partner) else {
                continue;
            };
            t.expect_dtype(op, name, crate::DType::F32)?;
            let (rt, rp) = (rows(op, t)?, rows(op, partner)?);
            if (rt.rows, rt.cols, rt.stride) != (rp.rows, rp.cols, rp.stride) {
                return Err(Error::shape(
                    op,
                    format!("`{name}` {t:?} must have the row layout of {partner:?}"),
                ));
            }
            self.check_ctx(op, &[t])?;
        }
        if wide.x32.is_some() && residual.is_some() {
            return Err(Error::shape(op, "x32 with a residual"));
        }
        if let Some((codes, scale)) = &wide.codes {
            super::check_codes(self, op, (codes, scale), ro)?;
        }
        let dt = x.dtype();
        let cols = rx.cols;
        match &self.cuda {
            Some(c) => {
                let (mut w, mut m, mut sm) = (0u64, 0u64, 0u64);
                match &affine {
                    Affine::OnePlusW(wt) => {
                        w = wt.ptr();
                    }
                    Affine::Modulation(mt, rm) => {
                        m = mt.ptr();
                        sm = rm.stride as u64;
                    }
                }
                let (mut yp, mut gp, mut sy, mut sg) = (0u64, 0u64, 0u64, 0u64);
                if let Some(r) = &residual {
                    (yp, sy) = (r.y.ptr(), r.ry.stride as u64);
                    if let Multiplier::Gate(g, rg) = &r.by {
                        (gp, sg) = (g.ptr(), rg.stride as u64);
                    }
                }
                let (gate, y_scale) = match residual.as_ref().map(|r| &r.by) {
                    Some(Multiplier::Gate(g, _)) => (Some(g), None),
                    Some(Multiplier::Scales(t)) => (None, Some(t)),
                    Some(Multiplier::One) | None => (None, None),
                };
                let (parts, part_stride) = residual
                    .as_ref()
                    .and_then(|r| r.parts)
                    .map_or((0u32, 0u64), |(n, st)| (n as u32, st as u64));
                let partials = residual
                    .as_ref()
                    .filter(|r| r.parts.is_some())
                    .map(|r| &r.y);
                let (xp, op_, n, sx, so, e) = (
                    x.ptr(),
                    out.map_or(0, |o| o.ptr()),
                    cols as u32,
                    rx.stride as u64,
                    ro.stride as u64,
                    eps,
                );
                let aff = if w != 0 { w } else { m };
                let wide_ptr = |t: &Option<Tensor>| t.as_ref().map_or(0, |t| t.ptr());
                let v8 = vec8(
                    &[
                        xp,
                        op_,
                        aff,
                        yp,
                        gp,
                        wide_ptr(&wide.x32),
                        wide_ptr(&wide.out32),
                    ],
                    cols,
                    &[
                        rx.stride,
                        ro.stride,
                        sm as usize,
                        sy as usize,
                        sg as usize,
                        part_stride as usize,
                    ],
                );
                // SAFETY: one block per checked row; `w` has `cols` elements or the modulation
                // rows have 3·cols (checked by the callers).
                unsafe {
                    c.launch(
                        s,
                        // Without partial sums, the kernel without their code; with one or
                        // two, the one that loads a part at a time after the first (fewer
                        // registers: more rows an SM at once, for the prefix's 576).
                        match parts {
                            0 => "rms_norm_plain",
                            1 | 2 => "rms_norm_few",
                            _ => "rms_norm",
                        },
                        Some(dt),
                        (rx.rows as u32, 1, 1),
                        (row_block(cols, v8), 1, 1),
                        0,
                        &[
                            Param::Mem(x, xp),
                            match &affine {
                                Affine::OnePlusW(t) => Param::of(t),
                                _ => Param::Null,
                            },
                            match &affine {
                                Affine::Modulation(t, _) => Param::of(t),
                                _ => Param::Null,
                            },
                            Param::opt(
                                residual
                                    .as_ref()
                                    .filter(|r| r.parts.is_none())
                                    .map(|r| &r.y),
                            ),
                            Param::opt(gate),
                            Param::opt(out),
                            n.into(),
                            sx.into(),
                            sm.into(),
                            sy.into(),
                            sg.into(),
                            so.into(),
                            e.into(),
                            v8.into(),
                            Param::opt(wide.x32.as_ref()),
                            Param::opt(wide.out32.as_ref()),
                            Param::opt(wide.codes.as_ref().map(|(c, _)| c)),
                            Param::opt(wide.codes.as_ref().map(|(_, sc)| sc)),
                            Param::opt(partials),
                            parts.into(),
                            part_stride.into(),
                            Param::opt(y_scale),
                        ],
                    )
                }
            }
            None => {
                let (xp, op_) = (P::of(x), out.map(P::of));
                let keep = (x.clone(), out.cloned());
                self.host(s, move || {
                    let _ = &keep;
                    with_float!(dt, T, {
                        for r in 0..rx.rows {
                            // SAFETY: indices inside the checked layouts.
                            unsafe {
                                if let Some(x32) = &wide.x32 {
                                    let x32 = P::of(x32);
                                    for c in 0..cols {
                                        let i = r * rx.stride + c;
                                        xp.st::<T>(i, x32.ld::<f32>(i));
                                    }
                                }
                                if let Some(res) = &residual {
                                    let yp = P::of(&res.y);
                                    for c in 0..cols {
                                        let i = r * rx.stride + c;
                                        let j = r * res.ry.stride + c;
                                        let y = match res.parts {
                                            Some((n, st)) => {
                                                let sum = (1..n).fold(yp.ld::<f32>(j), |a, p| {
                                                    a + yp.ld::<f32>(p * st + j)
                                                });
                                                T::from_f32(sum).to_f32()
                                            }
                                            None => yp.ld::<T>(j),
                                        };
                                        let by = match &res.by {
                                            Multiplier::Gate(g, rg) => {
                                                P::of(g).ld::<T>(r * rg.stride + c)
                                            }
                                            Multiplier::Scales(t) => P::of(t).ld::<f32>(c),
                                            Multiplier::One => 1.0,
                                        };
                                        xp.st::<T>(i, xp.ld::<T>(i) + y * by);
                                    }
                                }
                                let ss: f32 = (0..cols)
                                    .map(|c| xp.ld::<T>(r * rx.stride + c).powi(2))
                                    .sum();
                                let inv = 1.0 / (ss / cols as f32 + eps).sqrt();
                                for c in 0..cols {
                                    let v = xp.ld::<T>(r * rx.stride + c) * inv;
                                    let y = match &affine {
                                        Affine::OnePlusW(w) => v * (1.0 + P::of(w).ld::<T>(c)),
                                        Affine::Modulation(m, rm) => {
                                            let row = P(P::of(m).0
                                                + r * rm.stride * std::mem::size_of::<T>());
                                            v * (1.0 + row.ld::<T>(c)) + row.ld::<T>(cols + c)
                                        }
                                    };
                                    let i = r * ro.stride + c;
                                    // The value `out` holds (whether or not it is written).
                                    let stored = T::from_f32(y).to_f32();
                                    if let Some(op_) = op_ {
                                        op_.st::<T>(i, y);
                                    }
                                    if let Some(o32) = &wide.out32 {
                                        P::of(o32).st::<f32>(i, stored);
                                    }
                                    if let Some((codes, scale)) = &wide.codes {
                                        let code = crate::fp8::e4m3_from_f32(
                                            stored / P::of(scale).ld::<f32>(0),
                                        );
                                        *((P::of(codes).0 + r * cols + c) as *mut u8) = code;
                                    }
                                }
                            }
                        }
                    })
                })
            }
        }
    }

    /// Gemma's RMSNorm: `out = x / sqrt(mean(x²) + eps) · (1 + w)`, over the last dimension.
    pub fn rms_norm(
        &self,
        s: Stream,
        x: &Tensor,
        w: &Tensor,
        out: &Tensor,
        eps: f32,
    ) -> Result<()> {
        self.rms_impl(s, x, w, None, Some(out), eps, Wide::default())
    }

    /// [`rms_norm`](Self::rms_norm) that also quantizes its output into E4M3 `codes`
    /// (`[rows, cols]`) with the scale `scale[0]`: the codes
    /// [`quantize_e4m3`](Self::quantize_e4m3) of `out` gives, in the same launch. Without
    /// `out` only the codes are written (those of the values `out` would hold).
    pub fn rms_norm_e4m3(
        &self,
        s: Stream,
        x: &Tensor,
        w: &Tensor,
        out: Option<&Tensor>,
        eps: f32,
        (codes, scale): (&Tensor, &Tensor),
    ) -> Result<()> {
        let wide = Wide {
            codes: Some((codes.clone(), scale.clone())),
            ..Wide::default()
        };
        self.rms_impl(s, x, w, None, out, eps, wide)
    }

    /// The residual of an FP8 GEMM that left its weight's per-feature scales to its reader
    /// ([`linear_e4m3_deferred`](Self::linear_e4m3_deferred)), then Gemma's RMSNorm after it:
    /// `x ← x + y·y_scale[c]` in f32, rounded, in place (`y` of `x`'s rows and dtype, `y_scale`
    /// f32 `[cols]`), then [`rms_norm`](Self::rms_norm) of the stored `x` into `out`, and its
    /// E4M3 `codes` when given (as [`rms_norm_e4m3`](Self::rms_norm_e4m3)), in one launch: the
    /// language model's attention output and down projection in FP8. One of `out` and `codes`
    /// must be given.
    #[allow(clippy::too_many_arguments)]
    pub fn residual_rms_norm_scaled(
        &self,
        s: Stream,
        x: &Tensor,
        (y, y_scale): (&Tensor, &Tensor),
        w: &Tensor,
        out: Option<&Tensor>,
        eps: f32,
        codes: Option<(&Tensor, &Tensor)>,
    ) -> Result<()> {
        let op = "rms_norm";
        self.check_ctx(op, &[y, y_scale])?;
        let rx = rows(op, x)?;
        y.expect_dtype(op, "y", x.dtype())?;
        let ry = rows(op, y)?;
        same_rows(op, rx, ry, "x vs y")?;
        super::check_column_scales(op, "y_scale", y_scale, rx.cols)?;
        let residual = Residual {
            y: y.clone(),
            ry,
            by: Multiplier::Scales(y_scale.clone()),
            parts: None,
        };
        let wide = Wide {
            codes: codes.map(|(c, sc)| (c.clone(), sc.clone())),
            ..Wide::default()
        };
        self.rms_impl(s, x, w, Some(residual), out, eps, wide)
    }

    /// A split linear layer's residual, then Gemma's RMSNorm: `x ← x + y` in place, where `y`
    /// is the sum of `partials` (f32 `[parts, ..x's shape]`, contiguous: a
    /// [`SplitLinear`](crate::SplitLinear)'s output) in part order rounded to `x`'s dtype (the
    /// value a GEMM writing that dtype would have stored), then [`rms_norm`](Self::rms_norm)
    /// of the stored `x` into `out`, in one launch: the language model's down projection, whose
    /// split's reduction then needs no kernel of its own.
    pub fn residual_rms_norm_parts(
        &self,
        s: Stream,
        x: &Tensor,
        partials: &Tensor,
        w: &Tensor,
        out: &Tensor,
        eps: f32,
    ) -> Result<()> {
        let op = "rms_norm";
        self.check_ctx(op, &[partials])?;
        let (ry, parts) = partial_sums(op, x, rows(op, x)?, partials)?;
        let residual = Residual {
            y: partials.clone(),
            ry,
            by: Multiplier::One,
            parts: Some(parts),
        };
        self.rms_impl(s, x, w, Some(residual), Some(out), eps, Wide::default())
    }

    #[allow(clippy::too_many_arguments)]
    fn rms_impl(
        &self,
        s: Stream,
        x: &Tensor,
        w: &Tensor,
        residual: Option<Residual>,
        out: Option<&Tensor>,
        eps: f32,
        wide: Wide,
    ) -> Result<()> {
        let op = "rms_norm";
        self.check_ctx(op, &[x, w])?;
        x.expect_float(op, "x")?;
        Self::check_vector(op, "w", w, x, rows(op, x)?.cols)?;
        let affine = Affine::OnePlusW(w.clone());
        self.rms_common(s, op, x, affine, residual, out, eps, wide)
    }

    /// Adaptive RMSNorm (pi05's action expert): `out = norm(x)·(1 + scale) + shift`, where
    /// `modulation` holds `[scale | shift | gate]` (3 × width) per row of `x`, or one such row
    /// for all. Returns the `gate` part as a view, for [`gated_residual`](Self::gated_residual).
    pub fn ada_rms_norm(
        &self,
        s: Stream,
        x: &Tensor,
        modulation: &Tensor,
        out: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        self.ada_impl(s, x, modulation, out, eps, Wide::default())
    }

    /// [`ada_rms_norm`](Self::ada_rms_norm) of `x` after `x` is set from the f32 `x32`
    /// (rounded to `x`'s dtype; same row layout): the same values as a
    /// [`cast`](Self::cast) of `x32` into `x` followed by `ada_rms_norm`, in one launch.
    pub fn ada_rms_norm_from(
        &self,
        s: Stream,
        x32: &Tensor,
        x: &Tensor,
        modulation: &Tensor,
        out: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        let wide = Wide {
            x32: Some(x32.clone()),
            ..Wide::default()
        };
        self.ada_impl(s, x, modulation, out, eps, wide)
    }

    fn ada_impl(
        &self,
        s: Stream,
        x: &Tensor,
        modulation: &Tensor,
        out: &Tensor,
        eps: f32,
        wide: Wide,
    ) -> Result<Tensor> {
        let op = "ada_rms_norm";
        self.check_ctx(op, &[x, modulation, out])?;
        x.expect_float(op, "x")?;
        modulation.expect_dtype(op, "modulation", x.dtype())?;
        let rx = rows(op, x)?;
        let rm = modulation_rows(op, modulation, rx)?;
        self.rms_common(
            s,
            op,
            x,
            Affine::Modulation(modulation.clone(), rm),
            None,
            Some(out),
            eps,
            wide,
        )?;
        modulation.narrow(modulation.rank() - 1, 2 * rx.cols, rx.cols)
    }

    /// [`ada_rms_norm_from`](Self::ada_rms_norm_from) (`x32` given) or
    /// [`ada_rms_norm`](Self::ada_rms_norm) that also quantizes its output into E4M3 `codes`
    /// (`[rows, cols]`) with the scale `scale[0]`: the codes
    /// [`quantize_e4m3`](Self::quantize_e4m3) of `out` gives, in the same launch.
    #[allow(clippy::too_many_arguments)]
    pub fn ada_rms_norm_e4m3(
        &self,
        s: Stream,
        x32: Option<&Tensor>,
        x: &Tensor,
        modulation: &Tensor,
        out: &Tensor,
        eps: f32,
        (codes, scale): (&Tensor, &Tensor),
    ) -> Result<Tensor> {
        let wide = Wide {
            x32: x32.cloned(),
            out32: None,
            codes: Some((codes.clone(), scale.clone())),
        };
        self.ada_impl(s, x, modulation, out, eps, wide)
    }

    /// [`residual_ada_rms_norm`](Self::residual_ada_rms_norm) that also quantizes its output
    /// into E4M3 `codes` with the scale `scale[0]` (as
    /// [`ada_rms_norm_e4m3`](Self::ada_rms_norm_e4m3)).
    #[allow(clippy::too_many_arguments)]
    pub fn residual_ada_rms_norm_e4m3(
        &self,
        s: Stream,
        x: &Tensor,
        y: &Tensor,
        gate: &Tensor,
        modulation: &Tensor,
        out: &Tensor,
        eps: f32,
        (codes, scale): (&Tensor, &Tensor),
    ) -> Result<Tensor> {
        self.residual_ada_impl(
            s,
            x,
            y,
            gate,
            modulation,
            out,
            eps,
            Wide {
                x32: None,
                out32: None,
                codes: Some((codes.clone(), scale.clone())),
            },
        )
    }

    /// A gated residual and the next adaptive RMSNorm in one launch: `x ← x + y ⊙ gate`, then
    /// `out = ada_rms_norm(x, modulation)` — the same values as
    /// [`gated_residual`](Self::gated_residual) followed by [`ada_rms_norm`](Self::ada_rms_norm).
    /// `gate` has one row or as many as `x`. `y` may also be f32 partial sums
    /// `[parts, ..x's shape]` (contiguous, a [`SplitLinear`](crate::SplitLinear)'s output):
    /// their sum in part order, rounded to `x`'s dtype, is then `y`. Returns the gate part of
    /// `modulation`.
    #[allow(clippy::too_many_arguments)]
    pub fn residual_ada_rms_norm(
        &self,
        s: Stream,
        x: &Tensor,
        y: &Tensor,
        gate: &Tensor,
        modulation: &Tensor,
        out: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        self.residual_ada_impl(s, x, y, gate, modulation, out, eps, Wide::default())
    }

    /// [`residual_ada_rms_norm`](Self::residual_ada_rms_norm) that also writes its output
    /// widened to f32 into `out32` (same row layout as `out`): the same values as a
    /// [`cast`](Self::cast) of `out` into `out32` afterwards, in one launch.
    #[allow(clippy::too_many_arguments)]
    pub fn residual_ada_rms_norm_widened(
        &self,
        s: Stream,
        x: &Tensor,
        y: &Tensor,
        gate: &Tensor,
        modulation: &Tensor,
        out: &Tensor,
        out32: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        let wide = Wide {
            out32: Some(out32.clone()),
            ..Wide::default()
        };
        self.residual_ada_impl(s, x, y, gate, modulation, out, eps, wide)
    }

    #[allow(clippy::too_many_arguments)]
    fn residual_ada_impl(
        &self,
        s: Stream,
        x: &Tensor,
        y: &Tensor,
        gate: &Tensor,
        modulation: &Tensor,
        out: &Tensor,
        eps: f32,
        wide: Wide,
    ) -> Result<Tensor> {
        let op = "residual_ada_rms_norm";
        self.check_ctx(op, &[x, y, gate, modulation, out])?;
        x.expect_float(op, "x")?;
        gate.expect_dtype(op, "gate", x.dtype())?;
        modulation.expect_dtype(op, "modulation", x.dtype())?;
        let rx = rows(op, x)?;
        // `y` of x's dtype and rows, or f32 partial sums `[parts, ..x's shape]` (contiguous).
        let (ry, parts) = if y.dtype() == crate::DType::F32 && y.rank() == x.rank() + 1 {
            let (ry, parts) = partial_sums(op, x, rx, y)?;
            (ry, Some(parts))
        } else {
            y.expect_dtype(op, "y", x.dtype())?;
            (rows(op, y)?, None)
        };
        same_rows(op, rx, ry, "x vs y")?;
        let rg = broadcast_rows(op, rx, gate)?;
        let rm = modulation_rows(op, modulation, rx)?;
        let residual = Residual {
            y: y.clone(),
            ry,
            by: Multiplier::Gate(gate.clone(), rg),
            parts,
        };
        self.rms_common(
            s,
            op,
            x,
            Affine::Modulation(modulation.clone(), rm),
            Some(residual),
            Some(out),
            eps,
            wide,
        )?;
        modulation.narrow(modulation.rank() - 1, 2 * rx.cols, rx.cols)
    }

    /// LayerNorm over the last dimension: `(x − mean) / sqrt(var + eps) · w + b`.
    pub fn layer_norm(
        &self,
        s: Stream,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        out: &Tensor,
        eps: f32,
    ) -> Result<()> {
        self.layer_norm_impl(s, x, (w, b), Some(out), eps, None, None)
    }

    /// [`layer_norm`](Self::layer_norm) that also quantizes its output into E4M3 `codes`
    /// (`[rows, cols]`, contiguous) with the scale `scale[0]`: the codes
    /// [`quantize_e4m3`](Self::quantize_e4m3) of `out` gives, in the same launch (an FP8
    /// GEMM's input). Without `out` only the codes are written (those of the values `out`
    /// would hold).
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm_e4m3(
        &self,
        s: Stream,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        out: Option<&Tensor>,
        eps: f32,
        codes: (&Tensor, &Tensor),
    ) -> Result<()> {
        self.layer_norm_impl(s, x, (w, b), out, eps, Some(codes), None)
    }

    /// The residual of an FP8 GEMM that left the weight's per-feature scales and its bias to
    /// its reader ([`linear_e4m3_deferred`](Self::linear_e4m3_deferred)), then the LayerNorm
    /// after it: `x ← x + (y·y_scale[c] + y_bias[c])` in f32, rounded, in place (`y` `x`'s
    /// shape and dtype; `y_scale` f32 `[cols]`; `y_bias` `[cols]` of `x`'s dtype), then
    /// [`layer_norm`](Self::layer_norm) of the stored `x` into `out`, and its E4M3 `codes` when
    /// given (as [`layer_norm_e4m3`](Self::layer_norm_e4m3)), in one launch: SigLIP's attention
    /// output and fc2 in FP8. One of `out` and `codes` must be given.
    #[allow(clippy::too_many_arguments)]
    pub fn residual_layer_norm_scaled(
        &self,
        s: Stream,
        x: &Tensor,
        (y, y_scale, y_bias): (&Tensor, &Tensor, &Tensor),
        (w, b): (&Tensor, &Tensor),
        out: Option<&Tensor>,
        eps: f32,
        codes: Option<(&Tensor, &Tensor)>,
    ) -> Result<()> {
        self.layer_norm_impl(s, x, (w, b), out, eps, codes, Some((y, y_scale, y_bias)))
    }

    #[allow(clippy::too_many_arguments)]
    fn layer_norm_impl(
        &self,
        s: Stream,
        x: &Tensor,
        (w, b): (&Tensor, &Tensor),
        out: Option<&Tensor>,
        eps: f32,
        codes: Option<(&Tensor, &Tensor)>,
        residual: Option<(&Tensor, &Tensor, &Tensor)>,
    ) -> Result<()> {
        let op = "layer_norm";
        self.check_ctx(op, &[x, w, b])?;
        x.expect_float(op, "x")?;
        let rx = rows(op, x)?;
        let ro = self.out_rows(op, x, rx, out, codes.is_some())?;
        Self::check_vector(op, "w", w, x, rx.cols)?;
        Self::check_vector(op, "b", b, x, rx.cols)?;
        if let Some(c) = codes {
            super::check_codes(self, op, c, ro)?;
        }
        let ry = match residual {
            Some((y, ys, yb)) => {
                self.check_ctx(op, &[y, ys, yb])?;
                y.expect_dtype(op, "y", x.dtype())?;
                let ry = rows(op, y)?;
                same_rows(op, rx, ry, "x vs y")?;
                Self::check_vector(op, "y_bias", yb, x, rx.cols)?;
                super::check_column_scales(op, "y_scale", ys, rx.cols)?;
                Some(ry)
            }
            None => None,
        };
        let (dt, cols) = (x.dtype(), rx.cols);
        match &self.cuda {
            Some(c) => {
                let (xp, wp, bp, op_) = (x.ptr(), w.ptr(), b.ptr(), out.map_or(0, |o| o.ptr()));
                let (n, sx, so, e) = (cols as u32, rx.stride as u64, ro.stride as u64, eps);
                let (yp, sy) = match (residual, ry) {
                    (Some((y, ..)), Some(ry)) => (y.ptr(), ry.stride),
                    _ => (xp, rx.stride),
                };
                let v8 = vec8(&[xp, wp, bp, op_, yp], cols, &[rx.stride, ro.stride, sy]);
                let (y, ys, yb) = match residual {
                    Some((y, ys, yb)) => (Some(y), Some(ys), Some(yb)),
                    None => (None, None, None),
                };
                // SAFETY: one block per checked row; `w`, `b` (and `y_scale`, `y_bias`) have
                // `cols` elements; `y` has `x`'s rows.
                unsafe {
                    c.launch(
                        s,
                        "layer_norm",
                        Some(dt),
                        (rx.rows as u32, 1, 1),
                        (row_block(cols, v8), 1, 1),
                        0,
                        &[
                            Param::Mem(x, xp),
                            Param::Mem(w, wp),
                            Param::Mem(b, bp),
                            Param::opt(out),
                            n.into(),
                            sx.into(),
                            so.into(),
                            e.into(),
                            v8.into(),
                            Param::opt(codes.map(|c| c.0)),
                            Param::opt(codes.map(|c| c.1)),
                            Param::opt(y),
                            (sy as u64).into(),
                            Param::opt(ys),
                            Param::opt(yb),
                        ],
                    )
                }
            }
            None => {
                let (xp, wp, bp, op_) = (P::of(x), P::of(w), P::of(b), out.map(P::of));
                let keep = (x.clone(), w.clone(), b.clone(), out.cloned());
                let cp = codes.map(|(c, sc)| (P::of(c), P::of(sc), (c.clone(), sc.clone())));
                let rp = residual.zip(ry).map(|((y, ys, yb), ry)| {
                    let kept = (y.clone(), ys.clone(), yb.clone());
                    (P::of(y), P::of(ys), P::of(yb), ry.stride, kept)
                });
                self.host(s, move || {
                    let _ = &keep;
                    with_float!(dt, T, {
                        for r in 0..rx.rows {
                            // SAFETY: indices inside the checked layouts.
                            unsafe {
                                if let Some((yp, ysp, ybp, sy, _)) = &rp {
                                    for c in 0..cols {
                                        let y = yp.ld::<T>(r * sy + c) * ysp.ld::<f32>(c)
                                            + ybp.ld::<T>(c);
                                        let i = r * rx.stride + c;
                                        xp.st::<T>(i, xp.ld::<T>(i) + y);
                                    }
                                }
                                let at = |c: usize| xp.ld::<T>(r * rx.stride + c);
                                let mean = (0..cols).map(at).sum::<f32>() / cols as f32;
                                let var = (0..cols).map(|c| (at(c) - mean).powi(2)).sum::<f32>()
                                    / cols as f32;
                                let inv = 1.0 / (var + eps).sqrt();
                                for c in 0..cols {
                                    let i = r * ro.stride + c;
                                    let y = (at(c) - mean) * inv * wp.ld::<T>(c) + bp.ld::<T>(c);
                                    if let Some(op_) = op_ {
                                        op_.st::<T>(i, y);
                                    }
                                    if let Some((codes, scale, _)) = &cp {
                                        // The value `out` holds (whether or not it is written).
                                        let stored = T::from_f32(y).to_f32();
                                        *((codes.0 + r * cols + c) as *mut u8) =
                                            crate::fp8::e4m3_from_f32(stored / scale.ld::<f32>(0));
                                    }
                                }
                            }
                        }
                    })
                })
            }
        }
    }

    /// Softmax over the last dimension (f32 math); `out` may be `x`.
    pub fn softmax(&self, s: Stream, x: &Tensor, out: &Tensor) -> Result<()> {
        let op = "softmax";
        self.check_ctx(op, &[x, out])?;
        x.expect_float(op, "x")?;
        out.expect_dtype(op, "out", x.dtype())?;
        let (rx, ro) = (rows(op, x)?, rows(op, out)?);
        same_rows(op, rx, ro, "x vs out")?;
        let (dt, cols) = (x.dtype(), rx.cols);
        match &self.cuda {
            Some(c) => {
                let (xp, op_, n, sx, so) = (
                    x.ptr(),
                    out.ptr(),
                    cols as u32,
                    rx.stride as u64,
                    ro.stride as u64,
                );
                let v8 = vec8(&[xp, op_], cols, &[rx.stride, ro.stride]);
                // SAFETY: one block per checked row.
                unsafe {
                    c.launch(
                        s,
                        "softmax",
                        Some(dt),
                        (rx.rows as u32, 1, 1),
                        (row_block(cols, v8), 1, 1),
                        0,
                        &[
                            Param::Mem(x, xp),
                            Param::Mem(out, op_),
                            n.into(),
                            sx.into(),
                            so.into(),
                            v8.into(),
                        ],
                    )
                }
            }
            None => {
                let (xp, op_, keep) = (P::of(x), P::of(out), (x.clone(), out.clone()));
                self.host(s, move || {
                    let _ = &keep;
                    with_float!(dt, T, {
                        for r in 0..rx.rows {
                            // SAFETY: indices inside the checked layouts.
                            unsafe {
                                let at = |c: usize| xp.ld::<T>(r * rx.stride + c);
                                let m = (0..cols).map(at).fold(f32::NEG_INFINITY, f32::max);
                                let sum: f32 = (0..cols).map(|c| (at(c) - m).exp()).sum();
                                for c in 0..cols {
                                    op_.st::<T>(r * ro.stride + c, (at(c) - m).exp() / sum);
                                }
                            }
                        }
                    })
                })
            }
        }
    }

    /// Greedy decoding's reduction over f32 `logits` `[rows, n]` plus an optional additive
    /// `mask` `[n]` (0 to keep a token, −∞ to suppress it): per row, the index of the largest
    /// value (the first one on ties) into `index` (i32 `[rows]`) and its log-softmax value
    /// into `logprob` (f32 `[rows]`). Reading two numbers back replaces reading the logits.
    pub fn argmax_logsoftmax(
        &self,
        s: Stream,
        logits: &Tensor,
        mask: Option<&Tensor>,
        index: &Tensor,
        logprob: &Tensor,
    ) -> Result<()> {
        let op = "argmax_logsoftmax";
        self.check_ctx(op, &[logits, index, logprob])?;
        logits.expect_dtype(op, "logits", crate::DType::F32)?;
        index.expect_dtype(op, "index", crate::DType::I32)?;
        logprob.expect_dtype(op, "logprob", crate::DType::F32)?;
        let rl = rows(op, logits)?;
        if index.numel() != rl.rows
            || logprob.numel() != rl.rows
            || !index.is_contiguous()
            || !logprob.is_contiguous()
        {
            return Err(Error::shape(
                op,
                format!(
                    "index {index:?} and logprob {logprob:?} need {} elements",
                    rl.rows
                ),
            ));
        }
        if let Some(m) = mask {
            self.check_ctx(op, &[m])?;
            m.expect_dtype(op, "mask", crate::DType::F32)?;
            m.expect_contiguous(op)?;
            if m.numel() != rl.cols {
                return Err(Error::shape(
                    op,
                    format!("mask {m:?} needs {} elements", rl.cols),
                ));
            }
        }
        match &self.cuda {
            Some(c) => {
                let (lp, _mp, ip, pp) = (
                    logits.ptr(),
                    mask.map_or(0, |m| m.ptr()),
                    index.ptr(),
                    logprob.ptr(),
                );
                let (n, sx) = (rl.cols as u32, rl.stride as u64);
                // SAFETY: one block per checked row; the mask has `cols` elements.
                unsafe {
                    c.launch(
                        s,
                        "argmax_logsoftmax",
                        None,
                        (rl.rows as u32, 1, 1),
                        (1024, 1, 1),
                        0,
                        &[
                            Param::Mem(logits, lp),
                            Param::opt(mask),
                            Param::Mem(index, ip),
                            Param::Mem(logprob, pp),
                            n.into(),
                            sx.into(),
                        ],
                    )
                }
            }
            None => {
                let (lp, mp, ip, pp) =
                    (P::of(logits), mask.map(P::of), P::of(index), P::of(logprob));
                let keep = (
                    logits.clone(),
                    mask.cloned(),
                    index.clone(),
                    logprob.clone(),
                );
                self.host(s, move || {
                    let _ = &keep;
                    for r in 0..rl.rows {
                        // SAFETY: indices inside the checked sizes.
                        unsafe {
                            let at = |c: usize| {
                                lp.ld::<f32>(r * rl.stride + c) + mp.map_or(0.0, |m| m.ld::<f32>(c))
                            };
                            let (mut m, mut mi) = (f32::NEG_INFINITY, 0usize);
                            for c in 0..rl.cols {
                                if at(c) > m {
                                    m = at(c);
                                    mi = c;
                                }
                            }
                            let sum: f32 = (0..rl.cols).map(|c| (at(c) - m).exp()).sum();
                            (ip.0 as *mut i32).add(r).write(mi as i32);
                            pp.st::<f32>(r, -sum.ln());
                        }
                    }
                })
            }
        }
    }
}
