//! Elementwise ops: casts, add/scale, activations (SiLU, GELU tanh/erf, GEGLU), the Euler
//! step of flow matching, and the gated residual of adaptive norms.
//! CUDA twin: `kernels/cuda/elementwise.cu`.

use super::{P, broadcast_rows, gelu_tanh, grid_1d, rows, same_rows, vec8};
use crate::cuda::Param;
use crate::dtype::{Float, with_float};
use crate::error::{Error, Result};
use crate::fp8::e4m3_from_f32;
use crate::{DType, Kernels, Tensor};
use frt_exec::Stream;

#[derive(Copy, Clone)]
enum Unary {
    Silu = 0,
    GeluTanh = 1,
    GeluErf = 2,
    Scale = 3,
}

#[derive(Copy, Clone)]
enum Binary {
    /// `a + alpha * b`
    AddScaled = 0,
    Mul = 1,
    /// `gelu_tanh(a) * b`
    Geglu = 2,
    /// `gelu_tanh(a + b)`
    GeluSum = 3,
}

fn unary_f32(op: Unary, v: f32, alpha: f32) -> f32 {
    match op {
        Unary::Silu => v / (1.0 + (-v).exp()),
        Unary::GeluTanh => gelu_tanh(v),
        Unary::GeluErf => 0.5 * v * (1.0 + libm::erff(v * std::f32::consts::FRAC_1_SQRT_2)),
        Unary::Scale => alpha * v,
    }
}

fn binary_f32(op: Binary, a: f32, b: f32, alpha: f32) -> f32 {
    match op {
        Binary::AddScaled => a + alpha * b,
        Binary::Mul => a * b,
        Binary::Geglu => gelu_tanh(a) * b,
        Binary::GeluSum => gelu_tanh(a + b),
    }
}

/// The row layout of `b` for a binary op with `a`: the same rows, or one row broadcast
/// (row stride 0).
impl Kernels {
    #[allow(clippy::too_many_arguments)]
    fn unary(
        &self,
        s: Stream,
        op: &'static str,
        kind: Unary,
        alpha: f32,
        x: &Tensor,
        out: &Tensor,
        codes: Option<(&Tensor, &Tensor)>,
    ) -> Result<()> {
        self.check_ctx(op, &[x, out])?;
        x.expect_float(op, "x")?;
        out.expect_dtype(op, "out", x.dtype())?;
        x.expect_contiguous(op)?;
        out.expect_contiguous(op)?;
        if x.numel() != out.numel() {
            return Err(Error::shape(
                op,
                format!("{x:?} and {out:?} differ in size"),
            ));
        }
        let (dt, n) = (x.dtype(), x.numel());
        if let Some(c) = codes {
            let flat = super::Rows {
                rows: 1,
                cols: n,
                stride: n,
            };
            super::check_codes(self, op, c, flat)?;
        }
        match &self.cuda {
            Some(c) => {
                let (xp, op_, n64, code, a) = (x.ptr(), out.ptr(), n as u64, kind as i32, alpha);
                let v8 = vec8(&[xp, op_], n, &[]);
                let units = if v8 != 0 { n / 8 } else { n };
                // SAFETY: both tensors hold `n` contiguous elements of `dt` (checked above);
                // the 8-wide path only when aligned and n % 8 == 0.
                unsafe {
                    c.launch(
                        s,
                        "unary",
                        Some(dt),
                        (grid_1d(units), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Param::Mem(x, xp),
                            Param::Mem(out, op_),
                            n64.into(),
                            code.into(),
                            a.into(),
                            v8.into(),
                            Param::opt(codes.map(|c| c.0)),
                            Param::opt(codes.map(|c| c.1)),
                        ],
                    )
                }
            }
            None => {
                let (xp, op_, keep) = (P::of(x), P::of(out), (x.clone(), out.clone()));
                let cp = codes.map(|(c, sc)| (P::of(c), P::of(sc), (c.clone(), sc.clone())));
                self.host(s, move || {
                    let _ = &keep;
                    with_float!(dt, T, {
                        for i in 0..n {
                            // SAFETY: `i < n`, the size of both tensors, of type T, and of
                            // the codes (checked); one scale.
                            unsafe {
                                op_.st::<T>(i, unary_f32(kind, xp.ld::<T>(i), alpha));
                                if let Some((codes, scale, _)) = &cp {
                                    let stored: f32 = op_.ld::<T>(i);
                                    *((codes.0 + i) as *mut u8) =
                                        e4m3_from_f32(stored / scale.ld::<f32>(0));
                                }
                            }
                        }
                    })
                })
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn binary(
        &self,
        s: Stream,
        op: &'static str,
        kind: Binary,
        alpha: f32,
        a: &Tensor,
        b: &Tensor,
        out: Option<&Tensor>,
        codes: Option<(&Tensor, &Tensor)>,
        (a_scale, b_scale): (Option<&Tensor>, Option<&Tensor>),
    ) -> Result<()> {
        self.check_ctx(op, &[a, b])?;
        a.expect_float(op, "a")?;
        b.expect_dtype(op, "b", a.dtype())?;
        let ra = rows(op, a)?;
        let rb = broadcast_rows(op, ra, b)?;
        // Without `out` the codes are all that is written (of the values `out` would hold).
        let ro = match out {
            Some(out) => {
                self.check_ctx(op, &[out])?;
                out.expect_dtype(op, "out", a.dtype())?;
                let ro = rows(op, out)?;
                same_rows(op, ra, ro, "a vs out")?;
                ro
            }
            None if codes.is_some() => super::Rows { stride: 0, ..ra },
            None => return Err(Error::shape(op, "neither an output nor codes")),
        };
        if let Some(c) = codes {
            super::check_codes(self, op, c, ro)?;
        }
        for (t, name) in [(a_scale, "a_scale"), (b_scale, "b_scale")] {
            let Some(t) = t else { continue };
            self.check_ctx(op, &[t])?;
            super::check_column_scales(op, name, t, ra.cols)?;
        }
        let dt = a.dtype();
        match &self.cuda {
            Some(c) => {
                let (ap, bp, op_) = (a.ptr(), b.ptr(), out.map_or(0, |o| o.ptr()));
                let (r, cols) = (ra.rows as u32, ra.cols as u32);
                let (sa, sb, so) = (ra.stride as u64, rb.stride as u64, ro.stride as u64);
                let (code, al) = (kind as i32, alpha);
                let v8 = vec8(&[ap, bp, op_], ra.cols, &[ra.stride, rb.stride, ro.stride]);
                let units = ra.rows * ra.cols / if v8 != 0 { 8 } else { 1 };
                // SAFETY: the three row layouts were checked against their tensors.
                unsafe {
                    c.launch(
                        s,
                        "binary",
                        Some(dt),
                        (grid_1d(units), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Param::Mem(a, ap),
                            Param::Mem(b, bp),
                            Param::opt(out),
                            r.into(),
                            cols.into(),
                            sa.into(),
                            sb.into(),
                            so.into(),
                            code.into(),
                            al.into(),
                            v8.into(),
                            Param::opt(codes.map(|c| c.0)),
                            Param::opt(codes.map(|c| c.1)),
                            Param::opt(a_scale),
                            Param::opt(b_scale),
                        ],
                    )
                }
            }
            None => {
                let (ap, bp, keep) = (P::of(a), P::of(b), (a.clone(), b.clone()));
                let op_ = out.map(|o| (P::of(o), o.clone()));
                let cp = codes.map(|(c, sc)| (P::of(c), P::of(sc), (c.clone(), sc.clone())));
                let scp = [a_scale, b_scale].map(|t| t.map(|t| (P::of(t), t.clone())));
                self.host(s, move || {
                    let _ = &keep;
                    // SAFETY: one f32 per column (checked).
                    let scale = |i: usize, c: usize| match &scp[i] {
                        Some((p, _)) => unsafe { p.ld::<f32>(c) },
                        None => 1.0,
                    };
                    let col_scales = |c: usize| (scale(0, c), scale(1, c));
                    with_float!(dt, T, {
                        for r in 0..ra.rows {
                            for c in 0..ra.cols {
                                // SAFETY: indices inside the checked row layouts (the codes
                                // rows × cols, contiguous; one scale).
                                unsafe {
                                    let (fa, fb) = col_scales(c);
                                    let v = binary_f32(
                                        kind,
                                        ap.ld::<T>(r * ra.stride + c) * fa,
                                        bp.ld::<T>(r * rb.stride + c) * fb,
                                        alpha,
                                    );
                                    if let Some((o, _)) = &op_ {
                                        o.st::<T>(r * ro.stride + c, v);
                                    }
                                    if let Some((codes, scale, _)) = &cp {
                                        let stored = T::from_f32(v).to_f32();
                                        *((codes.0 + r * ra.cols + c) as *mut u8) =
                                            e4m3_from_f32(stored / scale.ld::<f32>(0));
                                    }
                                }
                            }
                        }
                    })
                })
            }
        }
    }

    /// `out = silu(x) = x·sigmoid(x)`.
    pub fn silu(&self, s: Stream, x: &Tensor, out: &Tensor) -> Result<()> {
        self.unary(s, "silu", Unary::Silu, 1.0, x, out, None)
    }

    /// `out = gelu(x)` with the tanh approximation.
    pub fn gelu_tanh(&self, s: Stream, x: &Tensor, out: &Tensor) -> Result<()> {
        self.unary(s, "gelu_tanh", Unary::GeluTanh, 1.0, x, out, None)
    }

    /// [`gelu_tanh`](Self::gelu_tanh) that also quantizes its output into E4M3 `codes` (as
    /// many values, contiguous) with the scale `scale[0]`: the codes
    /// [`quantize_e4m3`](Self::quantize_e4m3) of `out` gives, in the same launch (an FP8
    /// GEMM's input, such as SigLIP's fc2).
    pub fn gelu_tanh_e4m3(
        &self,
        s: Stream,
        x: &Tensor,
        out: &Tensor,
        codes: (&Tensor, &Tensor),
    ) -> Result<()> {
        self.unary(s, "gelu_tanh", Unary::GeluTanh, 1.0, x, out, Some(codes))
    }

    /// `out = gelu(x)`, exact (erf), as Whisper's MLP uses it.
    pub fn gelu(&self, s: Stream, x: &Tensor, out: &Tensor) -> Result<()> {
        self.unary(s, "gelu", Unary::GeluErf, 1.0, x, out, None)
    }

    /// `out = alpha·x`.
    pub fn scale(&self, s: Stream, x: &Tensor, alpha: f32, out: &Tensor) -> Result<()> {
        self.unary(s, "scale", Unary::Scale, alpha, x, out, None)
    }

    /// `out = a + b`, where `b` has `a`'s rows or is one row broadcast over them (a bias).
    pub fn add(&self, s: Stream, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
        self.binary(
            s,
            "add",
            Binary::AddScaled,
            1.0,
            a,
            b,
            Some(out),
            None,
            (None, None),
        )
    }

    /// `out = a·b` elementwise (`b` may be one broadcast row).
    pub fn mul(&self, s: Stream, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
        self.binary(
            s,
            "mul",
            Binary::Mul,
            1.0,
            a,
            b,
            Some(out),
            None,
            (None, None),
        )
    }

    /// `out = gelu_tanh(gate)·up` (Gemma's MLP). Rows may be strided (halves of one GEMM
    /// output).
    pub fn geglu(&self, s: Stream, gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<()> {
        self.binary(
            s,
            "geglu",
            Binary::Geglu,
            1.0,
            gate,
            up,
            Some(out),
            None,
            (None, None),
        )
    }

    /// [`geglu`](Self::geglu) that also quantizes its output into E4M3 `codes` (`[rows, cols]`,
    /// contiguous) with the scale `scale[0]`: the codes [`quantize_e4m3`](Self::quantize_e4m3)
    /// of `out` gives, in the same launch (an FP8 down projection's input).
    pub fn geglu_e4m3(
        &self,
        s: Stream,
        gate: &Tensor,
        up: &Tensor,
        out: &Tensor,
        codes: (&Tensor, &Tensor),
    ) -> Result<()> {
        self.binary(
            s,
            "geglu",
            Binary::Geglu,
            1.0,
            gate,
            up,
            Some(out),
            Some(codes),
            (None, None),
        )
    }

    /// [`geglu_e4m3`](Self::geglu_e4m3) of a gate and an up projection whose per-feature
    /// weight scales their FP8 GEMM left out ([`linear_e4m3_deferred`](Self::linear_e4m3_deferred)):
    /// `out = gelu_tanh(gate·gate_scale[c])·(up·up_scale[c])`, the products in f32 (`scales`:
    /// f32, one per column of `gate` and of `up`, contiguous), `out` rounded to its dtype and
    /// quantized into `codes` as `geglu_e4m3` does. Without `out` only the codes are written
    /// (an FP8 down projection reads nothing else).
    pub fn geglu_scaled_e4m3(
        &self,
        s: Stream,
        (gate, up): (&Tensor, &Tensor),
        scales: (&Tensor, &Tensor),
        out: Option<&Tensor>,
        codes: (&Tensor, &Tensor),
    ) -> Result<()> {
        let op = "geglu_scaled_e4m3";
        self.binary(
            s,
            op,
            Binary::Geglu,
            1.0,
            gate,
            up,
            out,
            Some(codes),
            (Some(scales.0), Some(scales.1)),
        )
    }

    /// The tanh GELU after an FP8 GEMM that left the weight's per-feature scales out
    /// ([`linear_e4m3_deferred`](Self::linear_e4m3_deferred)), with the layer's bias:
    /// `out = gelu_tanh(x·scales[f] + bias[f])` (`x` `[rows, F]`, `scales` f32 `[F]`, `bias` `[F]`
    /// of `x`'s dtype), in f32 and rounded once, and its E4M3 `codes` with the scale `scale[0]`
    /// (the next GEMM's input, as [`gelu_tanh_e4m3`](Self::gelu_tanh_e4m3) writes them): SigLIP's
    /// fc1 activation in FP8. Without `out` only the codes are written.
    pub fn gelu_tanh_scaled_e4m3(
        &self,
        s: Stream,
        x: &Tensor,
        (scales, bias): (&Tensor, &Tensor),
        out: Option<&Tensor>,
        codes: (&Tensor, &Tensor),
    ) -> Result<()> {
        let op = "gelu_tanh_scaled_e4m3";
        let bias = bias.reshape(&[1, bias.numel()])?;
        self.binary(
            s,
            op,
            Binary::GeluSum,
            1.0,
            x,
            &bias,
            out,
            Some(codes),
            (Some(scales), None),
        )
    }

    /// One Euler step of flow matching, in place: `x ← x + dt·v`.
    pub fn euler_step(&self, s: Stream, x: &Tensor, v: &Tensor, dt: f32) -> Result<()> {
        self.binary(
            s,
            "euler_step",
            Binary::AddScaled,
            dt,
            x,
            v,
            Some(x),
            None,
            (None, None),
        )
    }

    /// One Euler step in f32 that also writes the new `x` in another dtype (the next step's
    /// input): `x ← x + dt·v`, `x_cast ← x`. `x` and `v` are contiguous f32, `x_cast` any float
    /// dtype with as many elements.
    pub fn euler_step_cast(
        &self,
        s: Stream,
        x: &Tensor,
        v: &Tensor,
        dt: f32,
        x_cast: &Tensor,
    ) -> Result<()> {
        let op = "euler_step_cast";
        self.check_ctx(op, &[x, v, x_cast])?;
        x.expect_dtype(op, "x", DType::F32)?;
        v.expect_dtype(op, "v", DType::F32)?;
        x_cast.expect_float(op, "x_cast")?;
        for t in [x, v, x_cast] {
            t.expect_contiguous(op)?;
        }
        if v.numel() != x.numel() || x_cast.numel() != x.numel() {
            return Err(Error::shape(
                op,
                format!("{x:?}, {v:?} and {x_cast:?} differ in size"),
            ));
        }
        let (dd, n) = (x_cast.dtype(), x.numel());
        match &self.cuda {
            Some(c) => {
                let (xp, vp, cp, n64, dt) = (x.ptr(), v.ptr(), x_cast.ptr(), n as u64, dt);
                // SAFETY: the three tensors hold `n` contiguous elements of their dtypes.
                unsafe {
                    c.launch(
                        s,
                        "euler_step_cast",
                        Some(dd),
                        (grid_1d(n), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Param::Mem(x, xp),
                            Param::Mem(v, vp),
                            Param::Mem(x_cast, cp),
                            n64.into(),
                            dt.into(),
                        ],
                    )
                }
            }
            None => {
                let (xp, vp, cp) = (P::of(x), P::of(v), P::of(x_cast));
                let keep = (x.clone(), v.clone(), x_cast.clone());
                self.host(s, move || {
                    let _ = &keep;
                    with_float!(dd, D, {
                        for i in 0..n {
                            // SAFETY: `i < n` for the three tensors.
                            unsafe {
                                let y = xp.ld::<f32>(i) + dt * vp.ld::<f32>(i);
                                xp.st::<f32>(i, y);
                                cp.st::<D>(i, y);
                            }
                        }
                    })
                })
            }
        }
    }

    /// [`euler_step_cast`](Self::euler_step_cast) with a frozen prefix (real-time chunking's
    /// hard mask, training-free): after the update, the first `frozen_rows[0]` rows of `x`
    /// (rows of `row_len` values; the count is read on the device, so a captured graph takes a
    /// new one without recapture) become `t_next·x1 + (1 − t_next)·frozen`, the flow's
    /// interpolation at the time the update reached between the noise `x1` and the frozen
    /// actions; `x_cast` gets the same values. At `t_next = 0` those rows equal `frozen`.
    /// Rows past the count are exactly what `euler_step_cast` writes.
    #[allow(clippy::too_many_arguments)]
    pub fn euler_step_inpaint_cast(
        &self,
        s: Stream,
        x: &Tensor,
        v: &Tensor,
        dt: f32,
        x1: &Tensor,
        frozen: &Tensor,
        frozen_rows: &Tensor,
        t_next: f32,
        x_cast: &Tensor,
    ) -> Result<()> {
        let op = "euler_step_inpaint_cast";
        self.check_ctx(op, &[x, v, x1, frozen, frozen_rows, x_cast])?;
        for (t, n) in [(x, "x"), (v, "v"), (x1, "x1"), (frozen, "frozen")] {
            t.expect_dtype(op, n, DType::F32)?;
        }
        frozen_rows.expect_dtype(op, "frozen_rows", DType::I32)?;
        x_cast.expect_float(op, "x_cast")?;
        for t in [x, v, x1, frozen, frozen_rows, x_cast] {
            t.expect_contiguous(op)?;
        }
        let n = x.numel();
        if x.rank() != 2
            || [v, x1, frozen, x_cast].iter().any(|t| t.numel() != n)
            || frozen_rows.numel() != 1
        {
            return Err(Error::shape(
                op,
                format!(
                    "x {x:?} must be [rows, row_len] with v, x1, frozen and x_cast of its size and one frozen row count, got {v:?}, {x1:?}, {frozen:?}, {frozen_rows:?}, {x_cast:?}"
                ),
            ));
        }
        let (dd, row_len) = (x_cast.dtype(), x.dim(1));
        match &self.cuda {
            Some(c) => {
                let (xp, vp, cp, n64, dt) = (x.ptr(), v.ptr(), x_cast.ptr(), n as u64, dt);
                let (x1p, fp, rp, rl, tn) = (
                    x1.ptr(),
                    frozen.ptr(),
                    frozen_rows.ptr(),
                    row_len as u32,
                    t_next,
                );
                // SAFETY: the five f32/cast tensors hold `n` contiguous elements, `frozen_rows`
                // one i32; the kernel clamps the count to the rows there are.
                unsafe {
                    c.launch(
                        s,
                        "euler_step_inpaint_cast",
                        Some(dd),
                        (grid_1d(n), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Param::Mem(x, xp),
                            Param::Mem(v, vp),
                            Param::Mem(x_cast, cp),
                            n64.into(),
                            dt.into(),
                            Param::Mem(x1, x1p),
                            Param::Mem(frozen, fp),
                            Param::Mem(frozen_rows, rp),
                            rl.into(),
                            tn.into(),
                        ],
                    )
                }
            }
            None => {
                let (xp, vp, cp) = (P::of(x), P::of(v), P::of(x_cast));
                let (x1p, fp, rp) = (P::of(x1), P::of(frozen), P::of(frozen_rows));
                let keep = (
                    x.clone(),
                    v.clone(),
                    x_cast.clone(),
                    x1.clone(),
                    frozen.clone(),
                    frozen_rows.clone(),
                );
                self.host(s, move || {
                    let _ = &keep;
                    // SAFETY: one i32, read when the work runs (as the device does).
                    let rows = unsafe { rp.ld_i32(0) }.max(0) as usize;
                    let frozen_n = (rows * row_len).min(n);
                    with_float!(dd, D, {
                        for i in 0..n {
                            // SAFETY: `i < n` for the five tensors.
                            unsafe {
                                let mut y = xp.ld::<f32>(i) + dt * vp.ld::<f32>(i);
                                if i < frozen_n {
                                    y = t_next * x1p.ld::<f32>(i)
                                        + (1.0 - t_next) * fp.ld::<f32>(i);
                                }
                                xp.st::<f32>(i, y);
                                cp.st::<D>(i, y);
                            }
                        }
                    })
                })
            }
        }
    }

    /// `out = x + y·gate`, the residual of an adaptive norm; `gate` has `x`'s rows or is one
    /// row broadcast over them.
    pub fn gated_residual(
        &self,
        s: Stream,
        x: &Tensor,
        y: &Tensor,
        gate: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        let op = "gated_residual";
        self.check_ctx(op, &[x, y, gate, out])?;
        x.expect_float(op, "x")?;
        for (t, n) in [(y, "y"), (gate, "gate"), (out, "out")] {
            t.expect_dtype(op, n, x.dtype())?;
        }
        let (rx, ry, ro) = (rows(op, x)?, rows(op, y)?, rows(op, out)?);
        same_rows(op, rx, ry, "x vs y")?;
        same_rows(op, rx, ro, "x vs out")?;
        let rg = broadcast_rows(op, rx, gate)?;
        let dt = x.dtype();
        match &self.cuda {
            Some(c) => {
                let (xp, yp, gp, op_) = (x.ptr(), y.ptr(), gate.ptr(), out.ptr());
                let (r, cols) = (rx.rows as u32, rx.cols as u32);
                let (sx, sy, sg, so) = (
                    rx.stride as u64,
                    ry.stride as u64,
                    rg.stride as u64,
                    ro.stride as u64,
                );
                let v8 = vec8(
                    &[xp, yp, gp, op_],
                    rx.cols,
                    &[rx.stride, ry.stride, rg.stride, ro.stride],
                );
                let units = rx.rows * rx.cols / if v8 != 0 { 8 } else { 1 };
                // SAFETY: the row layouts were checked against their tensors.
                unsafe {
                    c.launch(
                        s,
                        "gated_residual",
                        Some(dt),
                        (grid_1d(units), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Param::Mem(x, xp),
                            Param::Mem(y, yp),
                            Param::Mem(gate, gp),
                            Param::Mem(out, op_),
                            r.into(),
                            cols.into(),
                            sx.into(),
                            sy.into(),
                            sg.into(),
                            so.into(),
                            v8.into(),
                        ],
                    )
                }
            }
            None => {
                let (xp, yp, gp, op_) = (P::of(x), P::of(y), P::of(gate), P::of(out));
                let keep = (x.clone(), y.clone(), gate.clone(), out.clone());
                self.host(s, move || {
                    let _ = &keep;
                    with_float!(dt, T, {
                        for r in 0..rx.rows {
                            for c in 0..rx.cols {
                                // SAFETY: indices inside the checked row layouts.
                                unsafe {
                                    let v = xp.ld::<T>(r * rx.stride + c)
                                        + yp.ld::<T>(r * ry.stride + c)
                                            * gp.ld::<T>(r * rg.stride + c);
                                    op_.st::<T>(r * ro.stride + c, v);
                                }
                            }
                        }
                    })
                })
            }
        }
    }

    /// Converts between float dtypes (same number of elements, contiguous).
    pub fn cast(&self, s: Stream, x: &Tensor, out: &Tensor) -> Result<()> {
        let op = "cast";
        self.check_ctx(op, &[x, out])?;
        x.expect_float(op, "x")?;
        out.expect_float(op, "out")?;
        x.expect_contiguous(op)?;
        out.expect_contiguous(op)?;
        if x.numel() != out.numel() {
            return Err(Error::shape(
                op,
                format!("{x:?} and {out:?} differ in size"),
            ));
        }
        let (sd, dd, n) = (x.dtype(), out.dtype(), x.numel());
        match &self.cuda {
            Some(c) => {
                let name = match sd {
                    DType::F32 => "cast_f32",
                    DType::BF16 => "cast_bf16",
                    _ => "cast_f16",
                };
                let (xp, op_, n64) = (x.ptr(), out.ptr(), n as u64);
                // SAFETY: both tensors hold `n` contiguous elements of their dtypes.
                unsafe {
                    c.launch(
                        s,
                        name,
                        Some(dd),
                        (grid_1d(n), 1, 1),
                        (256, 1, 1),
                        0,
                        &[Param::Mem(x, xp), Param::Mem(out, op_), n64.into()],
                    )
                }
            }
            None => {
                let (xp, op_, keep) = (P::of(x), P::of(out), (x.clone(), out.clone()));
                self.host(s, move || {
                    let _ = &keep;
                    with_float!(sd, S, {
                        with_float!(dd, D, {
                            for i in 0..n {
                                // SAFETY: `i < n` for both tensors.
                                unsafe { op_.st::<D>(i, xp.ld::<S>(i)) };
                            }
                        })
                    })
                })
            }
        }
    }
}
