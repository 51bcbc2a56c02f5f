//! Positional ops: rotary embedding (Gemma's split-halves RoPE), embedding gather with a
//! scale, and sin-cos embeddings (pi05's time embedding, Whisper's encoder positions).
//! CUDA twin: `kernels/cuda/rope.cu`.

use super::{P, grid_1d, rows, same_rows};
use crate::cuda::Param;
use crate::dtype::{Float, with_float};
use crate::error::{Error, Result};
use crate::{DType, Kernels, Tensor};
use frt_exec::Stream;

/// What [`Kernels::rope_qkv_at`] reads the projection from: rows of the outputs' type, or a
/// split GEMM's f32 partial sums `[parts, tokens, N]` (contiguous), added in part order and
/// rounded to the outputs' type.
#[derive(Clone, Copy)]
enum QkvIn<'a> {
    Rows(&'a Tensor),
    Parts(&'a Tensor),
    /// Rows, each feature multiplied by its f32 scale and rounded to the outputs' type first.
    Scaled(&'a Tensor, &'a Tensor),
}

/// The host's sine and cosine of pair `i` of a head of `dim` at `position`: `position /
/// max_wavelength^(2i/dim)` (what `rope`, `rope_qkv` and a `RopeTable` rotate by).
fn rope_angle(position: f32, i: usize, dim: usize, max_wavelength: f32) -> (f32, f32) {
    let timescale = max_wavelength.powf((2.0 / dim as f32) * i as f32);
    (position / timescale).sin_cos()
}

impl Kernels {
    /// Rotary embedding: `x` is `[tokens, heads, dim]` (or `[tokens, dim]`), `positions` an
    /// i32 `[tokens]` tensor read on the device. Pair `i` of each head is `(x[i], x[i+dim/2])`,
    /// rotated by `position / max_wavelength^(2i/dim)`. `out` may be `x`.
    pub fn rope(
        &self,
        s: Stream,
        x: &Tensor,
        positions: &Tensor,
        out: &Tensor,
        max_wavelength: f32,
    ) -> Result<()> {
        let op = "rope";
        self.check_ctx(op, &[x, positions, out])?;
        x.expect_float(op, "x")?;
        out.expect_dtype(op, "out", x.dtype())?;
        positions.expect_dtype(op, "positions", DType::I32)?;
        positions.expect_contiguous(op)?;
        let (rx, ro) = (rows(op, x)?, rows(op, out)?);
        same_rows(op, rx, ro, "x vs out")?;
        let tokens = x.dim(0);
        let heads = rx.rows / tokens;
        let dim = rx.cols;
        if x.rank() < 2 || dim % 2 != 0 || positions.numel() != tokens {
            return Err(Error::shape(
                op,
                format!(
                    "x {x:?} must be [tokens, (heads,) even dim] with positions [tokens], got {positions:?}"
                ),
            ));
        }
        let dt = x.dtype();
        match &self.cuda {
            Some(c) => {
                let (xp, pp, op_) = (x.ptr(), positions.ptr(), out.ptr());
                let (r, h, d, sx, so, mw) = (
                    rx.rows as u32,
                    heads as u32,
                    dim as u32,
                    rx.stride as u64,
                    ro.stride as u64,
                    max_wavelength,
                );
                // SAFETY: layouts and the positions length were checked.
                unsafe {
                    c.launch(
                        s,
                        "rope",
                        Some(dt),
                        (grid_1d(rx.rows * dim / 2), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Param::Mem(x, xp),
                            Param::Mem(positions, pp),
                            Param::Mem(out, op_),
                            r.into(),
                            h.into(),
                            d.into(),
                            sx.into(),
                            so.into(),
                            mw.into(),
                        ],
                    )
                }
            }
            None => {
                let (xp, pp, op_) = (P::of(x), P::of(positions), P::of(out));
                let keep = (x.clone(), positions.clone(), out.clone());
                self.host(s, move || {
                    let _ = &keep;
                    let half = dim / 2;
                    with_float!(dt, T, {
                        for r in 0..rx.rows {
                            // SAFETY: indices inside the checked layouts.
                            unsafe {
                                let pos = pp.ld_i32(r / heads) as f32;
                                for i in 0..half {
                                    let (sn, cs) = rope_angle(pos, i, dim, max_wavelength);
                                    let (x1, x2) = (
                                        xp.ld::<T>(r * rx.stride + i),
                                        xp.ld::<T>(r * rx.stride + half + i),
                                    );
                                    op_.st::<T>(r * ro.stride + i, x1 * cs - x2 * sn);
                                    op_.st::<T>(r * ro.stride + half + i, x2 * cs + x1 * sn);
                                }
                            }
                        }
                    })
                })
            }
        }
    }

    /// A fused q/k/v projection split into heads: each row of `qkv` is `[q heads | k heads |
    /// v heads]`, every head `head_dim` wide. The q and k heads are rotated as
    /// [`rope`](Self::rope) rotates them and written to `q` (`[tokens, q heads·head_dim]`) and
    /// `k`; the v heads are copied to `v` (both `[tokens, kv heads·head_dim]`). The outputs may
    /// be row views of larger tensors (a key/value cache).
    #[allow(clippy::too_many_arguments)]
    pub fn rope_qkv(
        &self,
        s: Stream,
        qkv: &Tensor,
        positions: &Tensor,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        head_dim: usize,
        max_wavelength: f32,
    ) -> Result<()> {
        let qkv = QkvIn::Rows(qkv);
        self.rope_qkv_at(s, qkv, positions, None, q, k, v, head_dim, max_wavelength)
    }

    /// [`rope_qkv`](Self::rope_qkv) of the projection of an FP8 GEMM that left its weight's
    /// per-feature scales to its reader ([`linear_e4m3_deferred`](Self::linear_e4m3_deferred)):
    /// each value of `qkv` is first multiplied by its feature's scale (`scales` f32, one per
    /// column of `qkv`) in f32 and rounded to the outputs' type, then rotated or copied as
    /// `rope_qkv` does: the language model's q/k/v in FP8. No launch of its own for the scales.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_qkv_scaled(
        &self,
        s: Stream,
        qkv: &Tensor,
        scales: &Tensor,
        positions: &Tensor,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        head_dim: usize,
        max_wavelength: f32,
    ) -> Result<()> {
        let qkv = QkvIn::Scaled(qkv, scales);
        self.rope_qkv_at(s, qkv, positions, None, q, k, v, head_dim, max_wavelength)
    }

    /// [`rope_qkv`](Self::rope_qkv) at `table`'s positions, head dim and wavelength, the same
    /// bits, with the angles read from the table on CUDA (computed once for many rotations:
    /// [`RopeTable::compute`] since its positions last changed) rather than computed per
    /// rotation. The host backend computes them as `rope_qkv` does.
    pub fn rope_qkv_table(
        &self,
        s: Stream,
        qkv: &Tensor,
        table: &RopeTable,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<()> {
        self.check_ctx("rope_qkv", &[table.table()])?;
        let (pos, dim, mw) = (table.positions(), table.dim(), table.max_wavelength());
        self.rope_qkv_at(s, QkvIn::Rows(qkv), pos, Some(table), q, k, v, dim, mw)
    }

    /// [`rope_qkv_table`](Self::rope_qkv_table) with the projection given as a split GEMM's
    /// f32 partial sums: `parts` contiguous `[parts, tokens, q + 2·kv heads·head_dim]`, added
    /// in part order and rounded to the outputs' type (the value a whole GEMM's output of that
    /// type holds), then rotated and copied as `rope_qkv_table` does; its bits are those of
    /// `rope_qkv_table` on that rounded sum. No launch of its own for the sum.
    pub fn rope_qkv_table_parts(
        &self,
        s: Stream,
        parts: &Tensor,
        table: &RopeTable,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<()> {
        self.check_ctx("rope_qkv", &[table.table()])?;
        let (pos, dim, mw) = (table.positions(), table.dim(), table.max_wavelength());
        self.rope_qkv_at(s, QkvIn::Parts(parts), pos, Some(table), q, k, v, dim, mw)
    }

    /// [`rope_qkv`](Self::rope_qkv), the angles from `table` (made for these positions, head
    /// dim and wavelength) on CUDA when given.
    #[allow(clippy::too_many_arguments)]
    fn rope_qkv_at(
        &self,
        s: Stream,
        input: QkvIn,
        positions: &Tensor,
        table: Option<&RopeTable>,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        head_dim: usize,
        max_wavelength: f32,
    ) -> Result<()> {
        let op = "rope_qkv";
        let (qkv, nparts) = match input {
            QkvIn::Rows(t) | QkvIn::Scaled(t, _) => (t, 1),
            QkvIn::Parts(t) => (t, if t.rank() == 3 { t.dim(0) } else { 0 }),
        };
        self.check_ctx(op, &[qkv, positions, q, k, v])?;
        let dt = q.dtype();
        let ri = match input {
            QkvIn::Rows(qkv) | QkvIn::Scaled(qkv, _) => {
                qkv.expect_float(op, "qkv")?;
                rows(op, qkv)?
            }
            QkvIn::Parts(parts) => {
                q.expect_float(op, "q")?;
                parts.expect_dtype(op, "parts", DType::F32)?;
                parts.expect_contiguous(op)?;
                if parts.rank() != 3 || nparts == 0 {
                    return Err(Error::shape(
                        op,
                        format!("parts {parts:?} must be [parts, tokens, q + 2·kv heads·head dim]"),
                    ));
                }
                let (tokens, n) = (parts.dim(1), parts.dim(2));
                super::Rows {
                    rows: tokens,
                    cols: n,
                    stride: n,
                }
            }
        };
        for (t, n) in [(q, "q"), (k, "k"), (v, "v")] {
            t.expect_dtype(op, n, dt)?;
        }
        if let QkvIn::Rows(qkv) | QkvIn::Scaled(qkv, _) = input {
            qkv.expect_dtype(op, "qkv", dt)?;
        }
        if let QkvIn::Scaled(_, scales) = input {
            self.check_ctx(op, &[scales])?;
            super::check_column_scales(op, "scales", scales, ri.cols)?;
        }
        positions.expect_dtype(op, "positions", DType::I32)?;
        positions.expect_contiguous(op)?;
        let (rq, rk, rv) = (rows(op, q)?, rows(op, k)?, rows(op, v)?);
        // Floats between one part's first element and the next's.
        let part = ri.rows * ri.cols;
        let tokens = ri.rows;
        let fits = head_dim > 0
            && head_dim % 2 == 0
            && [rq, rk, rv]
                .iter()
                .all(|r| r.rows == tokens && r.cols % head_dim == 0)
            && rk.cols == rv.cols
            && ri.cols == rq.cols + rk.cols + rv.cols
            && positions.numel() == tokens;
        if !fits {
            return Err(Error::shape(
                op,
                format!(
                    "qkv {qkv:?} must be [tokens, q + 2·kv heads of {head_dim}] split into q {q:?}, \
                     k {k:?}, v {v:?} (same rows, equal k and v), positions {positions:?} [tokens]"
                ),
            ));
        }
        let (hq, hk) = (rq.cols / head_dim, rk.cols / head_dim);
        match &self.cuda {
            Some(c) => {
                // The kernel indexes (token, pair) with 32 bits.
                if tokens * head_dim / 2 > u32::MAX as usize / 2 {
                    return Err(Error::shape(
                        op,
                        format!("{tokens} tokens of head dim {head_dim}: too many for one launch"),
                    ));
                }
                // A thread a (token, pair) computes the angle once for its heads; where that
                // leaves few threads (the action expert's 50 tokens), the heads are spread over
                // grid.y so that about 64 Ki threads run.
                let pairs = tokens * head_dim / 2;
                let head_groups = 65_536usize
                    .div_ceil(pairs.max(1))
                    .clamp(1, (hq + 2 * hk).max(1));
                let (ip, pp, qp, kp, vp) = (qkv.ptr(), positions.ptr(), q.ptr(), k.ptr(), v.ptr());
                let (t, a, b, d) = (tokens as u32, hq as u32, hk as u32, head_dim as u32);
                let (si, sq, sk, sv, mw) = (
                    ri.stride as u64,
                    rq.stride as u64,
                    rk.stride as u64,
                    rv.stride as u64,
                    max_wavelength,
                );
                let grid = (grid_1d(pairs), head_groups as u32, 1);
                let (qkv_p, q_p, k_p, v_p) = (
                    Param::Mem(qkv, ip),
                    Param::Mem(q, qp),
                    Param::Mem(k, kp),
                    Param::Mem(v, vp),
                );
                // SAFETY: every layout and the positions length were checked (a table holds
                // tokens · head_dim/2 pairs: its positions are these).
                unsafe {
                    match (table, input) {
                        (Some(tb), QkvIn::Parts(_)) => {
                            let tt = tb.table();
                            let (np, pt) = (nparts as u32, part as u64);
                            #[rustfmt::skip]
                            let params = [qkv_p, np.into(), pt.into(), Param::Mem(tt, tt.ptr()),
                                q_p, k_p, v_p, t.into(), a.into(), b.into(), d.into(),
                                si.into(), sq.into(), sk.into(), sv.into()];
                            let name = "rope_qkv_table_parts";
                            c.launch(s, name, Some(dt), grid, (256, 1, 1), 0, &params)
                        }
                        (None, QkvIn::Parts(_)) => Err(Error::shape(
                            op,
                            "parts are taken with a RoPE table only (rope_qkv_table_parts)",
                        )),
                        (Some(_), QkvIn::Scaled(..)) => Err(Error::shape(
                            op,
                            "scales are taken without a RoPE table only (rope_qkv_scaled)",
                        )),
                        (Some(tb), QkvIn::Rows(_)) => {
                            let tt = tb.table();
                            #[rustfmt::skip]
                            let params = [qkv_p, Param::Mem(tt, tt.ptr()), q_p, k_p, v_p,
                                t.into(), a.into(), b.into(), d.into(),
                                si.into(), sq.into(), sk.into(), sv.into()];
                            c.launch(s, "rope_qkv_table", Some(dt), grid, (256, 1, 1), 0, &params)
                        }
                        (None, QkvIn::Rows(_) | QkvIn::Scaled(..)) => {
                            let scales = match input {
                                QkvIn::Scaled(_, sc) => Some(sc),
                                _ => None,
                            };
                            #[rustfmt::skip]
                            let params = [qkv_p, Param::Mem(positions, pp), q_p, k_p, v_p,
                                t.into(), a.into(), b.into(), d.into(),
                                si.into(), sq.into(), sk.into(), sv.into(), mw.into(),
                                Param::opt(scales)];
                            c.launch(s, "rope_qkv", Some(dt), grid, (256, 1, 1), 0, &params)
                        }
                    }
                }
            }
            None => {
                let parts_in = matches!(input, QkvIn::Parts(_));
                let scales = match input {
                    QkvIn::Scaled(_, sc) => Some((P::of(sc), sc.clone())),
                    _ => None,
                };
                let (ip, pp) = (P::of(qkv), P::of(positions));
                let (qp, kp, vp) = (P::of(q), P::of(k), P::of(v));
                let keep = (
                    qkv.clone(),
                    positions.clone(),
                    q.clone(),
                    k.clone(),
                    v.clone(),
                );
                self.host(s, move || {
                    let _ = &keep;
                    let half = head_dim / 2;
                    with_float!(dt, T, {
                        // Element e of the projection: rows of T, the parts' sum (in part order)
                        // rounded to T, or a row's value times its feature's scale rounded to T
                        // (a row's features are its first `cols` elements: e % stride).
                        // SAFETY: e inside the checked layouts (`part` floats a part).
                        let x = |e: usize| unsafe {
                            if parts_in {
                                let sum = (1..nparts)
                                    .fold(ip.ld::<f32>(e), |a, p| a + ip.ld::<f32>(p * part + e));
                                T::from_f32(sum).to_f32()
                            } else if let Some((sc, _)) = &scales {
                                T::from_f32(ip.ld::<T>(e) * sc.ld::<f32>(e % ri.stride)).to_f32()
                            } else {
                                ip.ld::<T>(e)
                            }
                        };
                        for t in 0..tokens {
                            // SAFETY: indices inside the checked layouts.
                            unsafe {
                                let pos = pp.ld_i32(t) as f32;
                                for h in 0..hq + 2 * hk {
                                    let src = t * ri.stride + h * head_dim;
                                    if h >= hq + hk {
                                        let dst = t * rv.stride + (h - hq - hk) * head_dim;
                                        for i in 0..head_dim {
                                            vp.st::<T>(dst + i, x(src + i));
                                        }
                                        continue;
                                    }
                                    let (op_, dst) = if h < hq {
                                        (qp, t * rq.stride + h * head_dim)
                                    } else {
                                        (kp, t * rk.stride + (h - hq) * head_dim)
                                    };
                                    for i in 0..half {
                                        let (sn, cs) = rope_angle(pos, i, head_dim, max_wavelength);
                                        let (x1, x2) = (x(src + i), x(src + half + i));
                                        op_.st::<T>(dst + i, x1 * cs - x2 * sn);
                                        op_.st::<T>(dst + half + i, x2 * cs + x1 * sn);
                                    }
                                }
                            }
                        }
                    })
                })
            }
        }
    }

    /// `out[r] = table[ids[r]]·scale` (`ids` i32 `[n]`, `table` `[vocab, width]`, `out`
    /// `[n, width]`). An id outside the vocabulary gives a zero row (never a wild read).
    pub fn embedding(
        &self,
        s: Stream,
        ids: &Tensor,
        table: &Tensor,
        out: &Tensor,
        scale: f32,
    ) -> Result<()> {
        let op = "embedding";
        self.check_ctx(op, &[ids, table, out])?;
        ids.expect_dtype(op, "ids", DType::I32)?;
        table.expect_float(op, "table")?;
        out.expect_dtype(op, "out", table.dtype())?;
        for t in [ids, table, out] {
            t.expect_contiguous(op)?;
        }
        if table.rank() != 2 || out.numel() != ids.numel() * table.dim(1) {
            return Err(Error::shape(
                op,
                format!(
                    "table {table:?} must be [vocab, width] and out {out:?} [{}, width]",
                    ids.numel()
                ),
            ));
        }
        let (n, vocab, width, dt) = (ids.numel(), table.dim(0), table.dim(1), table.dtype());
        match &self.cuda {
            Some(c) => {
                let (ip, tp, op_) = (ids.ptr(), table.ptr(), out.ptr());
                let (r, w, v, sc) = (n as u32, width as u32, vocab as u32, scale);
                // SAFETY: sizes checked; ids are bounds-checked in the kernel.
                unsafe {
                    c.launch(
                        s,
                        "embedding",
                        Some(dt),
                        (grid_1d(n * width), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Param::Mem(ids, ip),
                            Param::Mem(table, tp),
                            Param::Mem(out, op_),
                            r.into(),
                            w.into(),
                            v.into(),
                            sc.into(),
                        ],
                    )
                }
            }
            None => {
                let (ip, tp, op_) = (P::of(ids), P::of(table), P::of(out));
                let keep = (ids.clone(), table.clone(), out.clone());
                self.host(s, move || {
                    let _ = &keep;
                    with_float!(dt, T, {
                        for r in 0..n {
                            // SAFETY: `r < n`; the id is checked against the vocabulary.
                            unsafe {
                                let id = ip.ld_i32(r);
                                let ok = id >= 0 && (id as usize) < vocab;
                                for c in 0..width {
                                    let v = if ok {
                                        tp.ld::<T>(id as usize * width + c) * scale
                                    } else {
                                        0.0
                                    };
                                    op_.st::<T>(r * width + c, v);
                                }
                            }
                        }
                    })
                })
            }
        }
    }

    /// Sin-cos embedding of `t` (`[n]`) into `out` (`[n, 2h]`): `out[r, j] = sin(2π·t_r/p_j)`,
    /// `out[r, h+j] = cos(2π·t_r/p_j)` with periods `p_j = min·(max/min)^(j/(h−1))` — openpi's
    /// `posemb_sincos`; Whisper's positions are `min = 2π`, `max = 2π·10000`.
    pub fn sinusoidal(
        &self,
        s: Stream,
        t: &Tensor,
        out: &Tensor,
        min_period: f32,
        max_period: f32,
    ) -> Result<()> {
        let op = "sinusoidal";
        self.check_ctx(op, &[t, out])?;
        t.expect_float(op, "t")?;
        out.expect_dtype(op, "out", t.dtype())?;
        t.expect_contiguous(op)?;
        out.expect_contiguous(op)?;
        let n = t.numel();
        if out.rank() != 2
            || out.dim(0) != n
            || out.dim(1) % 2 != 0
            || !(min_period > 0.0 && max_period > 0.0)
        {
            return Err(Error::shape(
                op,
                format!("out {out:?} must be [{n}, even width]; periods must be positive"),
            ));
        }
        let (half, dt) = (out.dim(1) / 2, t.dtype());
        match &self.cuda {
            Some(c) => {
                let (tp, op_, r, h, lo, hi) = (
                    t.ptr(),
                    out.ptr(),
                    n as u32,
                    half as u32,
                    min_period,
                    max_period,
                );
                // SAFETY: sizes checked.
                unsafe {
                    c.launch(
                        s,
                        "sinusoidal",
                        Some(dt),
                        (grid_1d(n * half), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Param::Mem(t, tp),
                            Param::Mem(out, op_),
                            r.into(),
                            h.into(),
                            lo.into(),
                            hi.into(),
                        ],
                    )
                }
            }
            None => {
                let (tp, op_, keep) = (P::of(t), P::of(out), (t.clone(), out.clone()));
                self.host(s, move || {
                    let _ = &keep;
                    with_float!(dt, T, {
                        for r in 0..n {
                            for j in 0..half {
                                let fraction = if half > 1 {
                                    j as f32 / (half - 1) as f32
                                } else {
                                    0.0
                                };
                                let period = min_period * (max_period / min_period).powf(fraction);
                                // SAFETY: indices inside the checked sizes.
                                unsafe {
                                    let arg = tp.ld::<T>(r) * (std::f32::consts::TAU / period);
                                    op_.st::<T>(r * 2 * half + j, arg.sin());
                                    op_.st::<T>(r * 2 * half + half + j, arg.cos());
                                }
                            }
                        }
                    })
                })
            }
        }
    }
}

/// The angles of a rotary embedding for the tokens at `positions`, for rotations that read
/// them rather than compute them ([`Kernels::rope_qkv_table`]): an f32 `[tokens, dim/2, 2]`
/// table of `(cos, sin)` of `position / max_wavelength^(2i/dim)`, made by
/// [`compute`](Self::compute) from what `positions` holds when it runs (on CUDA with the
/// arithmetic of [`Kernels::rope_qkv`]'s kernel, so the rotation gives the same bits). Made
/// once, computed wherever the positions may have changed since (a policy's action steps: in
/// the first step of each inference, after the prompt that wrote them). Only CUDA reads the
/// table: the host backend rotates with angles from the positions themselves, so a stale table
/// shows only on CUDA.
pub struct RopeTable {
    positions: Tensor,
    table: Tensor,
    dim: usize,
    max_wavelength: f32,
}

impl Kernels {
    /// A table for the i32 `[tokens]` `positions` and heads of `dim` (even), allocated here;
    /// its values are written by [`RopeTable::compute`].
    pub fn rope_table(
        &self,
        positions: &Tensor,
        dim: usize,
        max_wavelength: f32,
    ) -> Result<RopeTable> {
        let op = "rope_table";
        self.check_ctx(op, &[positions])?;
        positions.expect_dtype(op, "positions", DType::I32)?;
        positions.expect_contiguous(op)?;
        let tokens = positions.numel();
        if dim == 0 || dim % 2 != 0 || tokens * dim > u32::MAX as usize {
            return Err(Error::shape(
                op,
                format!(
                    "{tokens} tokens of head dim {dim}: the dim must be even and positive, the table fit 32-bit indices"
                ),
            ));
        }
        let table = Tensor::alloc(self.ctx(), "rope_table", DType::F32, &[tokens, dim / 2, 2])?;
        Ok(RopeTable {
            positions: positions.clone(),
            table,
            dim,
            max_wavelength,
        })
    }
}

impl RopeTable {
    /// Enqueues on `s` the table's values for what its positions hold then.
    pub fn compute(&self, k: &Kernels, s: Stream) -> Result<()> {
        let (tokens, half) = (self.tokens(), self.dim / 2);
        match &k.cuda {
            Some(c) => {
                let (pp, tp) = (self.positions.ptr(), self.table.ptr());
                let (n, d, mw) = (tokens as u32, self.dim as u32, self.max_wavelength);
                // SAFETY: the table holds tokens · dim/2 pairs; positions tokens i32.
                unsafe {
                    c.launch(
                        s,
                        "rope_table",
                        Some(DType::F32),
                        (grid_1d(tokens * half), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Param::Mem(&self.positions, pp),
                            Param::Mem(&self.table, tp),
                            n.into(),
                            d.into(),
                            mw.into(),
                        ],
                    )
                }
            }
            None => {
                let (pp, tp) = (P::of(&self.positions), P::of(&self.table));
                let keep = (self.positions.clone(), self.table.clone());
                let (dim, mw) = (self.dim, self.max_wavelength);
                k.host(s, move || {
                    let _ = &keep;
                    for t in 0..tokens {
                        // SAFETY: indices inside the table's and the positions' lengths.
                        unsafe {
                            let pos = pp.ld_i32(t) as f32;
                            for i in 0..half {
                                let (sn, cs) = rope_angle(pos, i, dim, mw);
                                tp.st::<f32>(2 * (t * half + i), cs);
                                tp.st::<f32>(2 * (t * half + i) + 1, sn);
                            }
                        }
                    }
                })
            }
        }
    }

    /// The positions it is computed from.
    pub fn positions(&self) -> &Tensor {
        &self.positions
    }

    /// The tokens it has angles for.
    pub fn tokens(&self) -> usize {
        self.positions.numel()
    }

    /// The head dim it rotates.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The largest wavelength.
    pub fn max_wavelength(&self) -> f32 {
        self.max_wavelength
    }

    /// The `(cos, sin)` table, f32 `[tokens, dim/2, 2]`.
    pub fn table(&self) -> &Tensor {
        &self.table
    }
}
