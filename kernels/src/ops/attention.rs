//! Attention with query heads ≥ key/value heads (MHA, GQA, MQA), head dims such as 64, 72
//! and 256, softmax in f32, and masks that cover Pi0.5 and Whisper:
//! bidirectional over a device-side valid key length (the padded prompt), prefix+suffix over
//! a KV cache (the action expert), and causal (Whisper's decoder).
//! CUDA twin: `kernels/cuda/attention.cu`.

use super::P;
use crate::cuda::{Grouping, Param, args};
use crate::dtype::with_float;
use crate::error::{Error, Result};
use crate::pool::Pool;
use crate::{AttentionPath, DType, GemmOptions, Kernels, Tensor};
use frt_exec::Stream;

/// Which keys a query sees. Key `j` is visible to query `i` when
/// `(j < valid_len || j >= always_from)`, `key_mask[j] != 0` (when given), and, with
/// `causal_offset = Some(o)`, `j <= i + o`.
#[derive(Clone, Debug, Default)]
pub struct AttentionMask {
    /// An i32 `[1]` tensor holding the number of valid leading keys, read on the device at
    /// run time (a new prompt length is a buffer write, not a recapture). `None`: all keys.
    pub valid_len: Option<Tensor>,
    /// Keys from this index on are always visible (the suffix after a prefix cache).
    /// `None`: no such keys.
    pub always_from: Option<usize>,
    /// Causal masking with this offset (`Some(0)`: query `i` sees keys `0..=i`).
    pub causal_offset: Option<usize>,
    /// A u8 `[Sk]` tensor read on the device: key `j` is visible only where it is non-zero
    /// (masked image views, padding). `None`: no per-key mask.
    pub key_mask: Option<Tensor>,
}

impl AttentionMask {
    /// Every key.
    pub fn full() -> Self {
        AttentionMask::default()
    }
    /// Keys `0..*valid_len` (device-side length).
    pub fn valid(valid_len: &Tensor) -> Self {
        AttentionMask {
            valid_len: Some(valid_len.clone()),
            ..Default::default()
        }
    }
    /// Keys `0..*prefix_len` of a prefix of capacity `prefix_capacity`, and every key after it.
    pub fn prefix_suffix(prefix_len: &Tensor, prefix_capacity: usize) -> Self {
        AttentionMask {
            valid_len: Some(prefix_len.clone()),
            always_from: Some(prefix_capacity),
            ..Default::default()
        }
    }
    /// Keys where the u8 `key_mask` (`[Sk]`, on the device) is non-zero.
    pub fn keys(key_mask: &Tensor) -> Self {
        AttentionMask {
            key_mask: Some(key_mask.clone()),
            ..Default::default()
        }
    }
    /// Query `i` sees keys `0..=i + offset`.
    pub fn causal(offset: usize) -> Self {
        AttentionMask {
            causal_offset: Some(offset),
            ..Default::default()
        }
    }
}

/// The largest head dimension (the host accumulator lives on the stack).
const MAX_HEAD_DIM: usize = 512;

/// Keys (and head dim) the CUDA kernel keeps in shared memory: up to this many floats.
const MAX_SHARED_FLOATS: usize = 12 * 1024;
/// The longest rows `masked_softmax` holds in registers as chunks of 8 keys (its
/// `32 * SOFTMAX_REGS`).
const SOFTMAX_VEC8_KEYS: usize = 1024;
/// The longest rows `masked_softmax_vec3` takes (3 chunks of 8 keys a lane).
const SOFTMAX_VEC3_KEYS: usize = 3 * 8 * 32;

#[derive(Copy, Clone, PartialEq)]
struct Dims {
    sq_len: usize,
    sk_len: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    sq: usize,
    sk: usize,
    sv: usize,
    so: usize,
}

fn heads_layout(op: &'static str, name: &str, t: &Tensor) -> Result<(usize, usize, usize, usize)> {
    let (sh, st) = (t.shape(), t.strides());
    if sh.len() != 3 || st[2] != 1 || st[1] != sh[2] {
        return Err(Error::shape(
            op,
            format!("`{name}` {t:?} must be [tokens, heads, head_dim] with contiguous heads"),
        ));
    }
    Ok((sh[0], sh[1], sh[2], st[0]))
}

impl Kernels {
    fn attention_dims(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        mask: &AttentionMask,
    ) -> Result<(Dims, usize)> {
        let op = "attention";
        self.check_ctx(op, &[q, k, v, out])?;
        q.expect_float(op, "q")?;
        for (t, n) in [(k, "k"), (v, "v"), (out, "out")] {
            t.expect_dtype(op, n, q.dtype())?;
        }
        let (sq_len, hq, d, sq) = heads_layout(op, "q", q)?;
        let (sk_len, hkv, dk, sk) = heads_layout(op, "k", k)?;
        let (sv_len, hv, dv, sv) = heads_layout(op, "v", v)?;
        let (so_len, ho, dout, so) = heads_layout(op, "out", out)?;
        if dk != d
            || dv != d
            || dout != d
            || hv != hkv
            || ho != hq
            || sv_len != sk_len
            || so_len != sq_len
            || hkv == 0
            || hq % hkv != 0
        {
            return Err(Error::shape(
                op,
                format!("q {q:?}, k {k:?}, v {v:?}, out {out:?} do not agree"),
            ));
        }
        if let Some(vl) = &mask.valid_len {
            self.check_ctx(op, &[vl])?;
            vl.expect_dtype(op, "valid_len", DType::I32)?;
            if vl.numel() != 1 {
                return Err(Error::shape(
                    op,
                    format!("valid_len {vl:?} must hold one i32"),
                ));
            }
        }
        if let Some(km) = &mask.key_mask {
            self.check_ctx(op, &[km])?;
            km.expect_dtype(op, "key_mask", DType::U8)?;
            km.expect_contiguous(op)?;
            if km.numel() != sk_len {
                return Err(Error::shape(
                    op,
                    format!("key_mask {km:?} must have one byte per key ({sk_len})"),
                ));
            }
        }
        if d > MAX_HEAD_DIM {
            return Err(Error::shape(
                op,
                format!("head dim {d} exceeds {MAX_HEAD_DIM}"),
            ));
        }
        let dims = Dims {
            sq_len,
            sk_len,
            hq,
            hkv,
            d,
            sq,
            sk,
            sv,
            so,
        };
        let always_from = mask.always_from.unwrap_or(sk_len).min(sk_len);
        Ok((dims, always_from))
    }

    /// `out = softmax(scale·q·kᵀ + mask)·v` per head; see [`AttentionMask`]. `q`, `out`:
    /// `[Sq, Hq, D]`; `k`, `v`: `[Sk, Hkv, D]` with `Hq` a multiple of `Hkv` (views into a
    /// larger cache are fine: rows may be strided). A query that sees no key gets zeros.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        s: Stream,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        mask: &AttentionMask,
        scale: f32,
    ) -> Result<()> {
        let (dims, always_from) = self.attention_dims(q, k, v, out, mask)?;
        let (sq_len, sk_len, hq, hkv, d, sq, sk, sv, so) = (
            dims.sq_len,
            dims.sk_len,
            dims.hq,
            dims.hkv,
            dims.d,
            dims.sq,
            dims.sk,
            dims.sv,
            dims.so,
        );
        let op = "attention";
        let dt = q.dtype();
        match &self.cuda {
            Some(c) => {
                if d + sk_len > MAX_SHARED_FLOATS {
                    return Err(Error::shape(
                        op,
                        format!(
                            "{sk_len} keys × head dim {d} exceed the kernel's shared memory ({MAX_SHARED_FLOATS} floats)"
                        ),
                    ));
                }
                let (qp, kp, vp, op_) = (q.ptr(), k.ptr(), v.ptr(), out.ptr());
                let (a, b, hq_, hkv_, d_) = (
                    sq_len as u32,
                    sk_len as u32,
                    hq as u32,
                    hkv as u32,
                    d as u32,
                );
                let (sq_, sk_, sv_, so_) = (sq as u64, sk as u64, sv as u64, so as u64);
                let (af, causal, co, sc) = (
                    always_from as u32,
                    mask.causal_offset.is_some() as i32,
                    mask.causal_offset.unwrap_or(0) as u32,
                    scale,
                );
                let shared = ((d + sk_len) * 4) as u32;
                // SAFETY: layouts were checked; shared memory holds d + Sk floats (≤ 48 KiB).
                unsafe {
                    c.launch(
                        s,
                        "attention",
                        Some(dt),
                        (sq_len as u32, hq as u32, 1),
                        (128, 1, 1),
                        shared,
                        &[
                            Param::Mem(q, qp),
                            Param::Mem(k, kp),
                            Param::Mem(v, vp),
                            Param::Mem(out, op_),
                            Param::opt(mask.valid_len.as_ref()),
                            Param::opt(mask.key_mask.as_ref()),
                            a.into(),
                            b.into(),
                            hq_.into(),
                            hkv_.into(),
                            d_.into(),
                            sq_.into(),
                            sk_.into(),
                            sv_.into(),
                            so_.into(),
                            af.into(),
                            causal.into(),
                            co.into(),
                            sc.into(),
                        ],
                    )
                }
            }
            None => {
                let (qp, kp, vp, op_) = (P::of(q), P::of(k), P::of(v), P::of(out));
                let vlp = mask.valid_len.as_ref().map(P::of);
                let kmp = mask.key_mask.as_ref().map(P::of);
                let causal = mask.causal_offset;
                let keep = (
                    q.clone(),
                    k.clone(),
                    v.clone(),
                    out.clone(),
                    mask.valid_len.clone(),
                    mask.key_mask.clone(),
                );
                self.host(s, move || {
                    let _ = &keep;
                    // SAFETY: one i32 (checked).
                    let valid = vlp.map_or(dims.sk_len as i64, |p| unsafe { p.ld_i32(0) } as i64);
                    let vis = Vis {
                        valid,
                        always_from,
                        causal,
                        key_mask: kmp,
                    };
                    if dt == DType::F32 {
                        Pool::global().run(dims.sq_len * dims.hq, &|task| {
                            let (i, h) = (task / dims.hq, task % dims.hq);
                            // SAFETY: indices inside the checked layouts.
                            unsafe { host_head_f32(&dims, i, h, qp, kp, vp, op_, &vis, scale) };
                        });
                        return;
                    }
                    with_float!(dt, T, {
                        Pool::global().run(dims.sq_len * dims.hq, &|task| {
                            let (i, h) = (task / dims.hq, task % dims.hq);
                            // SAFETY: indices inside the checked layouts.
                            unsafe { host_head::<T>(&dims, i, h, qp, kp, vp, op_, &vis, scale) };
                        })
                    })
                })
            }
        }
    }
}

/// [`host_head`] for f32 tensors, on contiguous head slices (vectorizable).
///
/// # Safety
/// `dims` describe the f32 tensors behind the pointers.
#[allow(clippy::too_many_arguments)]
unsafe fn host_head_f32(
    dims: &Dims,
    i: usize,
    h: usize,
    q: P,
    k: P,
    v: P,
    out: P,
    vis: &Vis,
    scale: f32,
) {
    let d = dims.d;
    let kh = h / (dims.hq / dims.hkv);
    // SAFETY: every slice is one head row inside its checked layout.
    let row = |p: P, r: usize, stride: usize, head: usize| unsafe {
        std::slice::from_raw_parts((p.0 as *const f32).add(r * stride + head * d), d)
    };
    let mut qs = [0f32; MAX_HEAD_DIM];
    for (dst, src) in qs.iter_mut().zip(row(q, i, dims.sq, h)) {
        *dst = src * scale;
    }
    let qs = &qs[..d];
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    let mut acc = [0f32; MAX_HEAD_DIM];
    for j in 0..dims.sk_len {
        let visible = vis.sees(i, j);
        if !visible {
            continue;
        }
        let sc = super::gemm::dot(qs, row(k, j, dims.sk, kh));
        if sc > m {
            let correction = (m - sc).exp();
            sum *= correction;
            acc[..d].iter_mut().for_each(|a| *a *= correction);
            m = sc;
        }
        let p = (sc - m).exp();
        sum += p;
        for (a, x) in acc[..d].iter_mut().zip(row(v, j, dims.sv, kh)) {
            *a += p * x;
        }
    }
    let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
    // SAFETY: the output head row is inside its checked layout.
    let o =
        unsafe { std::slice::from_raw_parts_mut((out.0 as *mut f32).add(i * dims.so + h * d), d) };
    for (dst, a) in o.iter_mut().zip(&acc[..d]) {
        *dst = a * inv;
    }
}

/// One (query, head) with an online softmax: no scratch beyond the head's accumulator.
///
/// # Safety
/// `dims` describe the tensors behind the pointers.
#[allow(clippy::too_many_arguments)]
unsafe fn host_head<T: crate::dtype::Float>(
    dims: &Dims,
    i: usize,
    h: usize,
    q: P,
    k: P,
    v: P,
    out: P,
    vis: &Vis,
    scale: f32,
) {
    const MAX_D: usize = MAX_HEAD_DIM;
    let d = dims.d;
    let kh = h / (dims.hq / dims.hkv);
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    let mut acc = [0f32; MAX_D];
    for j in 0..dims.sk_len {
        let visible = vis.sees(i, j);
        if !visible {
            continue;
        }
        let mut sc = 0f32;
        for c in 0..d {
            // SAFETY: the caller's contract.
            sc += unsafe {
                q.ld::<T>(i * dims.sq + h * dims.d + c)
                    * scale
                    * k.ld::<T>(j * dims.sk + kh * dims.d + c)
            };
        }
        let m_new = m.max(sc);
        let correction = (m - m_new).exp();
        let p = (sc - m_new).exp();
        sum = sum * correction + p;
        for (c, a) in acc.iter_mut().enumerate().take(d) {
            // SAFETY: the caller's contract.
            *a = *a * correction + p * unsafe { v.ld::<T>(j * dims.sv + kh * dims.d + c) };
        }
        m = m_new;
    }
    let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
    for (c, a) in acc.iter().enumerate().take(d) {
        // SAFETY: the caller's contract.
        unsafe { out.st::<T>(i * dims.so + h * dims.d + c, a * inv) };
    }
}

/// Which keys a query sees, on the host (see [`AttentionMask`]).
#[derive(Clone, Copy)]
struct Vis {
    valid: i64,
    always_from: usize,
    causal: Option<usize>,
    key_mask: Option<P>,
}

impl Vis {
    #[inline(always)]
    fn sees(&self, i: usize, j: usize) -> bool {
        // SAFETY: the key mask has one byte per key (checked when enqueued).
        ((j as i64) < self.valid || j >= self.always_from)
            && self.causal.is_none_or(|o| j <= i + o)
            && self
                .key_mask
                .is_none_or(|m| unsafe { *(m.0 as *const u8).add(j) } != 0)
    }
}

/// One GEMM of the planned path with the views it runs on.
struct Step {
    gemm: crate::Gemm,
    a: Tensor,
    b: Tensor,
    c: Tensor,
}

enum Path {
    /// The fused kernel (host: the reference; CUDA: short query counts, e.g. decoding).
    Direct,
    /// CUDA, bf16/f16 on sm_80 and later: the tensor-core kernel of `flash.cu`, its keys cut
    /// into `splits` ranges of `keys_per_split` when the rows alone would leave most of the
    /// device idle (the partial rows are then merged by a second kernel).
    Flash {
        /// Head dim the kernel is instantiated for (the smallest of [`FLASH_HEAD_DIMS`] ≥ d).
        dp: usize,
        splits: usize,
        keys_per_split: usize,
        /// Which of the kernel's forms runs.
        form: FlashForm,
        /// Partial rows `[splits, Hq·Sq, D]` and their (max, sum) `[splits, Hq·Sq, 2]` (f32),
        /// when `splits > 1`.
        part: Option<Box<(Tensor, Tensor)>>,
    },
    /// CUDA, many queries: scores = Q·Kᵀ (cuBLASLt, f32), masked softmax, out = P·V.
    Gemm {
        qk: Vec<Step>,
        pv: Vec<Step>,
        scores: Box<Tensor>,
        probs: Box<Tensor>,
        /// Score rows ordered (query, head) rather than (head, query).
        rows_by_token: bool,
    },
}

/// Attention planned once for fixed tensors. On CUDA with at least [`GEMM_MIN_QUERIES`]
/// queries or [`GEMM_MIN_KEYS`] keys: bf16/f16 on sm_80+ takes the tensor-core kernel of
/// `flash.cu` (except for long sequences of wide heads, see below), otherwise two batched cuBLASLt GEMMs around
/// a masked softmax kernel, with the score scratch allocated when planned; with fewer, the
/// simple fused kernel. Same results as [`Kernels::attention`] within rounding (probabilities
/// are rounded to the model dtype before the second product, as fused attention kernels do).
///
/// The tensor-core kernel is not the default for head dims above 128 with at least 128 queries
/// (Gemma's prefix: cuBLASLt's products are faster there on an H100) nor when a key/value head
/// has fewer than 64 query rows; [`KernelOptions::attention`](crate::KernelOptions) forces the
/// choice.
pub struct AttentionPlan {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    mask: AttentionMask,
    scale: f32,
    dims: Dims,
    always_from: usize,
    path: Path,
    /// Several attentions of these dimensions in one launch (tensor-core path only).
    batch: Batch,
}

/// Attentions run as one: `n` of them, the tensors of entry `i` starting `i ·` these many
/// elements after the plan's own.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Batch {
    n: usize,
    q: usize,
    k: usize,
    v: usize,
    out: usize,
}

impl Batch {
    const ONE: Batch = Batch {
        n: 1,
        q: 0,
        k: 0,
        v: 0,
        out: 0,
    };
}

/// The forms of the tensor-core kernel (`flash.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FlashForm {
    /// One tile of keys and values staged at a time, a warp per 16 rows
    /// (`flash_attention_d*`).
    Streaming,
    /// Every tile of a block's keys staged at once (`flash_attention_res_*`: head dims up to
    /// 128, at most [`FLASH_RES`] tiles of keys, one split).
    Resident,
    /// Head dim 256, streaming, two warps per 16 rows, each taking half of the head dim
    /// (`flash_attention_halves_d256_*`, [`KernelOptions::flash_halves`](crate::KernelOptions)).
    Halves,
}

/// Head dims the tensor-core kernel is compiled for (`flash.cu`).
const FLASH_HEAD_DIMS: [usize; 6] = [16, 32, 64, 80, 128, 256];
/// Rows of one block of the tensor-core kernel, and keys of one staged tile.
const FLASH_BM: usize = 64;
const FLASH_BN: usize = 64;
/// Tiles of keys the resident form of the tensor-core kernel stages at once (`FLASH_RES` in
/// `flash.cu`), and the largest head dim it is built for.
const FLASH_RES: usize = 4;
const FLASH_RES_MAX_DP: usize = 128;

/// The tensor-core kernel's shared memory at head dim `dp` in `form`: the block's queries and
/// its staged tiles of keys and values (one of each streaming and in halves, [`FLASH_RES`]
/// resident), and in halves each warp's share of a tile's scores.
fn flash_shared(dp: usize, form: FlashForm) -> usize {
    let tiles = if form == FlashForm::Resident {
        FLASH_RES
    } else {
        1
    };
    let staged = (FLASH_BM + 2 * tiles * FLASH_BN) * (dp + 8) * 2;
    // The halves form: each of its 8 warps' share of a tile's scores, f32.
    let shares = if form == FlashForm::Halves {
        8 * 16 * FLASH_BN * 4
    } else {
        0
    };
    staged + shares
}

/// Whether [`Kernels::attention_plan`] takes the tensor-core kernel (when it can run) rather
/// than the GEMM path. [`AttentionPath::Flash`] / [`AttentionPath::Gemm`] force the choice;
/// with [`AttentionPath::Auto`] it is taken except for long sequences of wide heads (head dim
/// above 128 and at least 128 queries, e.g. Gemma's prefix), where cuBLASLt's products around
/// the softmax are faster on an H100 (`frt-kernels-bench`: 30.6 against 57.6 µs at 800
/// tokens), and when a key/value head has fewer than one block of query rows.
fn flash_preferred(path: AttentionPath, dims: &Dims, dp: usize) -> bool {
    match path {
        AttentionPath::Flash => true,
        AttentionPath::Gemm => false,
        AttentionPath::Auto => {
            let rows = dims.hq / dims.hkv * dims.sq_len;
            rows >= FLASH_BM && !(dp > 128 && dims.sq_len >= 128)
        }
    }
}

/// The tensor-core kernel's parameters (`FlashArgs` in `flash.cu`, same layout).
#[repr(C)]
#[derive(Clone, Copy)]
struct FlashArgs {
    sq_len: u32,
    sk_len: u32,
    hq: u32,
    hkv: u32,
    d: u32,
    sq: u64,
    sk: u64,
    sv: u64,
    so: u64,
    valid_len: u64,
    key_mask: u64,
    always_from: u32,
    causal: i32,
    causal_offset: u32,
    scale_log2: f32,
    keys_per_split: u32,
    batch: u32,
    bq: u64,
    bk: u64,
    bv: u64,
    bo: u64,
    /// flash_combine: the output's E4M3 codes and their scale (device addresses, or 0).
    codes: u64,
    code_scale: u64,
}

/// Queries from which the CUDA plan takes the GEMM path.
pub const GEMM_MIN_QUERIES: usize = 16;
/// Keys from which the CUDA plan takes the GEMM path whatever the number of queries (a single
/// decoding query over a long encoder output: the fused kernel would run one block a head).
pub const GEMM_MIN_KEYS: usize = 256;

/// `t` seen as `[heads, tokens, d]` for heads `h0..h0 + n` (`t` is `[tokens, heads, d]`).
fn heads_view(
    t: &Tensor,
    h0: usize,
    n: usize,
    tokens: usize,
    d: usize,
    row_stride: usize,
) -> Result<Tensor> {
    Tensor::with_layout(
        t.buffer(),
        t.dtype(),
        &[n, tokens, d],
        &[d, row_stride, 1],
        t.offset() + h0 * d,
    )
}

impl Kernels {
    /// Plans attention over these tensors (see [`AttentionPlan`]).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_plan(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        mask: &AttentionMask,
        scale: f32,
    ) -> Result<AttentionPlan> {
        self.attention_plan_sharing(q, k, v, out, mask, scale, None)
    }

    /// [`attention_plan`](Self::attention_plan), reusing the score scratch of `share` (a plan
    /// of the same dimensions whose runs never overlap this one's, e.g. another layer on the
    /// same stream) instead of allocating its own.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_plan_sharing(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        mask: &AttentionMask,
        scale: f32,
        share: Option<&AttentionPlan>,
    ) -> Result<AttentionPlan> {
        self.plan_with(q, k, v, out, mask, scale, |dims| {
            let gemm = dims.sq_len >= GEMM_MIN_QUERIES || dims.sk_len >= GEMM_MIN_KEYS;
            if let Some(dp) = gemm
                .then(|| self.flash_head_dim(q, k, v, out, dims))
                .flatten()
                .filter(|&dp| flash_preferred(self.options.attention, dims, dp))
            {
                return self.attention_flash_path(dims, dp, 1, share.map(|p| &p.path), None);
            }
            if self.cuda.is_none() || !gemm {
                return Ok(Path::Direct);
            }
            let scratch = match share.map(|p| &p.path) {
                Some(Path::Gemm { scores, probs, .. })
                    if scores.shape() == [dims.hq, dims.sq_len, dims.sk_len]
                        && probs.dtype() == q.dtype() =>
                {
                    Some(((**scores).clone(), (**probs).clone()))
                }
                _ => None,
            };
            self.attention_gemm_path(q, k, v, out, dims, scratch)
        })
    }

    /// A plan over checked tensors with the path `path` chooses for their dimensions.
    #[allow(clippy::too_many_arguments)]
    fn plan_with(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        mask: &AttentionMask,
        scale: f32,
        path: impl FnOnce(&Dims) -> Result<Path>,
    ) -> Result<AttentionPlan> {
        let (dims, always_from) = self.attention_dims(q, k, v, out, mask)?;
        let path = path(&dims)?;
        Ok(AttentionPlan {
            q: q.clone(),
            k: k.clone(),
            v: v.clone(),
            out: out.clone(),
            mask: mask.clone(),
            scale,
            dims,
            always_from,
            path,
            batch: Batch::ONE,
        })
    }

    /// Attention planned on the tensor-core kernel of `flash.cu` (scores, softmax and the
    /// product with V in one kernel; the keys split over blocks when the rows are few), or an
    /// error when it cannot run on these tensors: it needs CUDA on sm_80 or later, bf16 or f16,
    /// a head dim that is a multiple of 8 up to 256, queries, keys and values in 16-byte rows,
    /// and outputs in 4-byte pairs.
    ///
    /// [`attention_plan`](Self::attention_plan) takes this path by default where it is the
    /// faster one (see `flash_preferred`).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_plan_flash(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        mask: &AttentionMask,
        scale: f32,
    ) -> Result<AttentionPlan> {
        self.plan_flash(q, k, v, out, mask, scale, None)
    }

    /// [`attention_plan_flash`](Self::attention_plan_flash) with the keys split into `splits`
    /// ranges (each a whole number of 64-key tiles, so the count is rounded to what the tiles
    /// allow; [`AttentionPlan::flash_splits`] tells) instead of the count the plan would
    /// choose: for benchmarks that compare split counts.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_plan_flash_splits(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        mask: &AttentionMask,
        scale: f32,
        splits: usize,
    ) -> Result<AttentionPlan> {
        if splits == 0 {
            return Err(Error::shape("attention", "0 key splits"));
        }
        self.plan_flash(q, k, v, out, mask, scale, Some(splits))
    }

    #[allow(clippy::too_many_arguments)]
    fn plan_flash(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        mask: &AttentionMask,
        scale: f32,
        splits: Option<usize>,
    ) -> Result<AttentionPlan> {
        self.plan_with(q, k, v, out, mask, scale, |dims| {
            let dp = self.flash_head_dim(q, k, v, out, dims).ok_or_else(|| {
                Error::shape(
                    "attention",
                    format!(
                        "the tensor-core kernel needs CUDA sm_80+, bf16/f16, a head dim that is a multiple of 8 up to 256 and aligned rows; got {} {q:?}, k {k:?}, v {v:?}, out {out:?}",
                        self.target()
                    ),
                )
            })?;
            self.attention_flash_path(dims, dp, 1, None, splits)
        })
    }

    /// One plan running `plans` as a single tensor-core launch, when they can be: every plan
    /// on the tensor-core path with a head dim up to 128, all of the same dimensions, scale and
    /// mask (the same mask tensors), their tensors in the same buffers at equal distances from
    /// one plan to the next (e.g. SigLIP's views: one attention per view, rows one view after
    /// the other). `Ok(None)` when they cannot; the plans themselves stay usable either way.
    pub fn attention_plan_batch(&self, plans: &[AttentionPlan]) -> Result<Option<AttentionPlan>> {
        let Some(first) = plans.first() else {
            return Ok(None);
        };
        let dp = match first.path {
            Path::Flash { dp, .. } if dp <= 128 => dp,
            _ => return Ok(None),
        };
        if plans.len() < 2 {
            return Ok(None);
        }
        let same_mask = |a: &AttentionMask, b: &AttentionMask| {
            let ptr = |t: &Option<Tensor>| t.as_ref().map(Tensor::ptr);
            ptr(&a.valid_len) == ptr(&b.valid_len)
                && ptr(&a.key_mask) == ptr(&b.key_mask)
                && a.always_from == b.always_from
                && a.causal_offset == b.causal_offset
        };
        let step = |f: fn(&AttentionPlan) -> &Tensor| -> Option<usize> {
            let (a, b) = (f(&plans[0]), f(&plans[1]));
            let d = b.offset().checked_sub(a.offset())?;
            plans
                .windows(2)
                .all(|w| {
                    let (x, y) = (f(&w[0]), f(&w[1]));
                    x.buffer().id() == y.buffer().id()
                        && y.offset().checked_sub(x.offset()) == Some(d)
                })
                .then_some(d)
        };
        let fits = plans.iter().all(|p| {
            matches!(p.path, Path::Flash { dp: d, .. } if d == dp)
                && p.dims == first.dims
                && p.scale == first.scale
                && same_mask(&p.mask, &first.mask)
                && p.q.dtype() == first.q.dtype()
        });
        let (Some(bq), Some(bk), Some(bv), Some(bo)) = (
            step(|p| &p.q),
            step(|p| &p.k),
            step(|p| &p.v),
            step(|p| &p.out),
        ) else {
            return Ok(None);
        };
        let d = &first.dims;
        if !fits || plans.len() * d.hq * d.sq_len * d.d >= 1 << 32 {
            return Ok(None);
        }
        // Entry offsets keep the 16-byte alignment the kernel stages with.
        if [bq, bk, bv].iter().any(|x| x % 8 != 0) || bo % 2 != 0 {
            return Ok(None);
        }
        let path = self.attention_flash_path(d, dp, plans.len(), None, None)?;
        Ok(Some(AttentionPlan {
            q: first.q.clone(),
            k: first.k.clone(),
            v: first.v.clone(),
            out: first.out.clone(),
            mask: first.mask.clone(),
            scale: first.scale,
            dims: first.dims,
            always_from: first.always_from,
            path,
            batch: Batch {
                n: plans.len(),
                q: bq,
                k: bk,
                v: bv,
                out: bo,
            },
        }))
    }

    /// The head dim to run the tensor-core kernel with, when it can run on these tensors (see
    /// [`attention_plan_flash`](Self::attention_plan_flash)).
    fn flash_head_dim(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        dims: &Dims,
    ) -> Option<usize> {
        if self.cuda.as_ref()?.sm() < 80 {
            return None;
        }
        let d = dims.d;
        let ok = matches!(q.dtype(), DType::BF16 | DType::F16)
            && d % 8 == 0
            && (dims.hq * dims.sq_len * d) < 1 << 32
            && [
                dims.sq,
                dims.sk,
                dims.sv,
                q.offset(),
                k.offset(),
                v.offset(),
            ]
            .iter()
            .all(|x| x % 8 == 0)
            && [dims.so, out.offset()].iter().all(|x| x % 2 == 0);
        if !ok {
            return None;
        }
        FLASH_HEAD_DIMS.iter().copied().find(|&p| p >= d)
    }

    /// The tensor-core path for `batch` attentions of these dimensions: keys are split when
    /// the blocks of rows alone would not put two blocks on every SM (a split is at least one
    /// tile of keys) — unless the keys fit [`FLASH_RES`] tiles with a head dim up to
    /// [`FLASH_RES_MAX_DP`] (SigLIP): then one split stages them all at once (the resident
    /// form, without a merge). A forced split count keeps the streaming form.
    fn attention_flash_path(
        &self,
        dims: &Dims,
        dp: usize,
        batch: usize,
        share: Option<&Path>,
        forced_splits: Option<usize>,
    ) -> Result<Path> {
        let sms = self.cuda.as_ref().map_or(1, |c| c.sms as usize);
        let rows = dims.hq / dims.hkv * dims.sq_len;
        let blocks = rows.div_ceil(FLASH_BM) * dims.hkv * batch;
        // Two blocks fit on an SM (shared memory and registers): aim for two per SM, a split
        // being at least one tile of keys.
        let target = 2 * sms;
        let splits = forced_splits
            .or(self.options.attention_splits)
            .unwrap_or(if blocks < target {
                target.div_ceil(blocks)
            } else {
                1
            })
            .min(dims.sk_len.div_ceil(FLASH_BN))
            .max(1);
        // The resident form, when the split count is the plan's own and its shared memory is
        // within what a block may have (101 KiB at head dim 80: more than sm_86 and sm_89
        // give). (At head dim 256, splits of 2 resident tiles for the action expert — half the
        // splits to merge — measured slower on an H100: 14.8 against 11.4 µs.)
        let fits = |form| {
            self.cuda
                .as_ref()
                .is_some_and(|c| flash_shared(dp, form) <= c.max_shared as usize)
        };
        let resident = forced_splits.is_none()
            && self.options.attention_splits.is_none()
            && dp <= FLASH_RES_MAX_DP
            && dims.sk_len <= FLASH_RES * FLASH_BN
            && fits(FlashForm::Resident);
        let splits = if resident { 1 } else { splits };
        let keys_per_split = dims.sk_len.div_ceil(splits).div_ceil(FLASH_BN) * FLASH_BN;
        let splits = dims.sk_len.div_ceil(keys_per_split).max(1);
        // The halves form where its blocks are at most one an SM (its shared memory allows no
        // more; the other form's, two): on an H100 the action expert's attention over a
        // 64-token prompt (70 blocks) 11.6 → 10.9 µs, Gemma's prefix at 576 tokens (216
        // blocks) 28.2 → 37.9 µs.
        let form = if resident {
            FlashForm::Resident
        } else if dp == 256
            && self.options.flash_halves
            && blocks * splits <= sms
            && fits(FlashForm::Halves)
        {
            FlashForm::Halves
        } else {
            FlashForm::Streaming
        };
        let part = if splits > 1 {
            let all = batch * dims.hq * dims.sq_len;
            let reuse = match share {
                Some(Path::Flash { part: Some(p), .. }) if p.0.shape() == [splits, all, dims.d] => {
                    Some(p.clone())
                }
                _ => None,
            };
            Some(match reuse {
                Some(p) => p,
                None => Box::new((
                    Tensor::alloc(
                        self.ctx(),
                        "attention.partial",
                        DType::F32,
                        &[splits, all, dims.d],
                    )?,
                    Tensor::alloc(
                        self.ctx(),
                        "attention.partial_max_sum",
                        DType::F32,
                        &[splits, all, 2],
                    )?,
                )),
            })
        } else {
            None
        };
        Ok(Path::Flash {
            dp,
            splits,
            keys_per_split,
            form,
            part,
        })
    }

    fn attention_gemm_path(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        dims: &Dims,
        scratch: Option<(Tensor, Tensor)>,
    ) -> Result<Path> {
        let Dims {
            sq_len,
            sk_len,
            hq,
            hkv,
            d,
            sq,
            sk,
            sv,
            so,
        } = *dims;
        let dt = q.dtype();
        let (scores, probs) = match scratch {
            Some(s) => s,
            None => (
                Tensor::alloc(
                    self.ctx(),
                    "attention.scores",
                    DType::F32,
                    &[hq, sq_len, sk_len],
                )?,
                Tensor::alloc(self.ctx(), "attention.probs", dt, &[hq, sq_len, sk_len])?,
            ),
        };
        // Each entry: the operands of one Q·Kᵀ and one P·V product (q, k, v, scores, probs, out).
        let mut products: Vec<[Tensor; 6]> = Vec::new();
        // One key/value head shared by every query head, with the heads of a token next to each
        // other in q and out: the queries are one [tokens·heads, d] matrix (rows ordered token,
        // head) and each product is a single larger GEMM rather than a batch of small ones.
        let rows_by_token = hkv == 1 && hq > 1 && sq == hq * d && so == hq * d;
        let kv_head = |t: &Tensor, stride: usize, kh: usize| {
            Tensor::with_layout(
                t.buffer(),
                dt,
                &[sk_len, d],
                &[stride, 1],
                t.offset() + kh * d,
            )
        };
        if rows_by_token {
            let rows = sq_len * hq;
            let flat = |t: &Tensor, cols: usize| {
                Tensor::with_layout(t.buffer(), t.dtype(), &[rows, cols], &[cols, 1], t.offset())
            };
            products.push([
                flat(q, d)?,
                kv_head(k, sk, 0)?,
                kv_head(v, sv, 0)?,
                flat(&scores, sk_len)?,
                flat(&probs, sk_len)?,
                flat(out, d)?,
            ]);
        } else {
            // Query heads that share key/value heads form one batch: all heads when every head
            // has its own (MHA), else one batch per key/value head (GQA/MQA) with K, V shared.
            let groups: Vec<(usize, usize, Tensor, Tensor)> = if hkv == hq {
                vec![(
                    0,
                    hq,
                    heads_view(k, 0, hq, sk_len, d, sk)?,
                    heads_view(v, 0, hq, sk_len, d, sv)?,
                )]
            } else {
                let g = hq / hkv;
                (0..hkv)
                    .map(|kh| -> Result<_> {
                        Ok((kh * g, g, kv_head(k, sk, kh)?, kv_head(v, sv, kh)?))
                    })
                    .collect::<Result<_>>()?
            };
            for (h0, n, kv, vv) in groups {
                let batch = |t: &Tensor| {
                    Tensor::with_layout(
                        t.buffer(),
                        t.dtype(),
                        &[n, sq_len, sk_len],
                        &[sq_len * sk_len, sk_len, 1],
                        h0 * sq_len * sk_len,
                    )
                };
                products.push([
                    heads_view(q, h0, n, sq_len, d, sq)?,
                    kv,
                    vv,
                    batch(&scores)?,
                    batch(&probs)?,
                    heads_view(out, h0, n, sq_len, d, so)?,
                ]);
            }
        }
        let (mut qk, mut pv) = (Vec::new(), Vec::new());
        for [qv, kv, vv, sc, pr, ov] in products {
            let g1 = self.gemm(&qv, &kv, &sc, GemmOptions::weight())?;
            let g2 = self.gemm(&pr, &vv, &ov, GemmOptions::default())?;
            qk.push(Step {
                gemm: g1,
                a: qv,
                b: kv,
                c: sc,
            });
            pv.push(Step {
                gemm: g2,
                a: pr,
                b: vv,
                c: ov,
            });
        }
        Ok(Path::Gemm {
            qk,
            pv,
            scores: Box::new(scores),
            probs: Box::new(probs),
            rows_by_token,
        })
    }
}

impl AttentionPlan {
    /// Whether the plan uses the GEMM path.
    pub fn uses_gemm(&self) -> bool {
        matches!(self.path, Path::Gemm { .. })
    }

    /// Whether the plan uses the tensor-core kernel, and with how many key splits.
    pub fn flash_splits(&self) -> Option<usize> {
        match self.path {
            Path::Flash { splits, .. } => Some(splits),
            _ => None,
        }
    }

    /// Whether the plan's tensor-core kernel stages all of a block's keys at once (the
    /// resident form) rather than one tile at a time.
    pub fn flash_resident(&self) -> bool {
        matches!(
            self.path,
            Path::Flash {
                form: FlashForm::Resident,
                ..
            }
        )
    }

    /// Whether the plan uses the tensor-core kernel's halves form (head dim 256, two warps for
    /// every 16 rows, each taking half of the head dim; see
    /// [`KernelOptions::flash_halves`](crate::KernelOptions)).
    pub fn flash_halves(&self) -> bool {
        matches!(
            self.path,
            Path::Flash {
                form: FlashForm::Halves,
                ..
            }
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn run_flash(
        &self,
        k: &Kernels,
        s: Stream,
        dp: usize,
        splits: usize,
        keys_per_split: usize,
        form: FlashForm,
        part: Option<&(Tensor, Tensor)>,
        codes: Option<(&Tensor, &Tensor)>,
    ) -> Result<()> {
        let c = k.cuda.as_ref().expect("flash path only on CUDA");
        let d = self.dims;
        k.retain(s, &[&self.q, &self.k, &self.v, &self.out]);
        let mut args = FlashArgs {
            sq_len: d.sq_len as u32,
            sk_len: d.sk_len as u32,
            hq: d.hq as u32,
            hkv: d.hkv as u32,
            d: d.d as u32,
            sq: d.sq as u64,
            sk: d.sk as u64,
            sv: d.sv as u64,
            so: d.so as u64,
            valid_len: 0,
            key_mask: 0,
            always_from: self.always_from as u32,
            causal: self.mask.causal_offset.is_some() as i32,
            causal_offset: self.mask.causal_offset.unwrap_or(0) as u32,
            scale_log2: self.scale * std::f32::consts::LOG2_E,
            keys_per_split: keys_per_split as u32,
            batch: self.batch.n as u32,
            bq: self.batch.q as u64,
            bk: self.batch.k as u64,
            bv: self.batch.v as u64,
            bo: self.batch.out as u64,
            codes: 0,
            code_scale: 0,
        };
        if let Some((codes, scale)) = codes {
            k.retain(s, &[codes, scale]);
            (args.codes, args.code_scale) = (codes.ptr(), scale.ptr());
        }
        if let Some(vl) = &self.mask.valid_len {
            k.retain(s, &[vl]);
            args.valid_len = vl.ptr();
        }
        if let Some(km) = &self.mask.key_mask {
            k.retain(s, &[km]);
            args.key_mask = km.ptr();
        }
        let (mut pp, mut mp) = (0u64, 0u64);
        if let Some((p, m)) = part {
            k.retain(s, &[p, m]);
            (pp, mp) = (p.ptr(), m.ptr());
        }
        let (mut qp, mut kp, mut vp, mut op) =
            (self.q.ptr(), self.k.ptr(), self.v.ptr(), self.out.ptr());
        let rows = d.hq / d.hkv * d.sq_len;
        // The resident and halves forms' blocks have two warps for every 16 rows.
        let threads = if form == FlashForm::Streaming {
            128
        } else {
            256
        };
        let shared = flash_shared(dp, form) as u32;
        let name: &'static str = match (dp, form) {
            (_, FlashForm::Halves) => "flash_attention_halves_d256",
            (16, FlashForm::Streaming) => "flash_attention_d16",
            (32, FlashForm::Streaming) => "flash_attention_d32",
            (64, FlashForm::Streaming) => "flash_attention_d64",
            (80, FlashForm::Streaming) => "flash_attention_d80",
            (128, FlashForm::Streaming) => "flash_attention_d128",
            (_, FlashForm::Streaming) => "flash_attention_d256",
            (16, FlashForm::Resident) => "flash_attention_res_d16",
            (32, FlashForm::Resident) => "flash_attention_res_d32",
            (64, FlashForm::Resident) => "flash_attention_res_d64",
            (80, FlashForm::Resident) => "flash_attention_res_d80",
            (_, FlashForm::Resident) => "flash_attention_res_d128",
        };
        let dt = Some(self.q.dtype());
        // SAFETY: the layouts, alignments and head dim were checked when planned (for every
        // entry of a batch); the partial tensors hold splits · batch · Hq · Sq rows; shared
        // memory is the queries and the staged tiles (resident: a split's keys are at most
        // FLASH_RES tiles and the head dim at most 128, as planned).
        unsafe {
            c.launch_raw(
                s,
                name,
                dt,
                (
                    rows.div_ceil(FLASH_BM) as u32,
                    (d.hkv * self.batch.n) as u32,
                    splits as u32,
                ),
                (threads, 1, 1),
                shared,
                &mut args!(qp, kp, vp, op, pp, mp, args),
                false,
                Grouping::Plain,
            )?;
            if splits > 1 {
                let mut n = splits as u32;
                let all = self.batch.n * d.hq * d.sq_len;
                // Kernels for at most 4, 8 or 16 splits hold every split's values in
                // registers (one wait on memory); the general one loops.
                let name = match splits {
                    ..=4 => "flash_combine4",
                    5..=8 => "flash_combine8",
                    9..=16 => "flash_combine16",
                    _ => "flash_combine",
                };
                // Launched dependent (`pdl`): the attention kernel lets it start at once, and
                // its blocks wait (`pdl_wait`, before they read a partial row) until that
                // kernel has finished, so the merge's launch overlaps the attention.
                c.launch_raw(
                    s,
                    name,
                    dt,
                    // One thread per row and 4 columns.
                    ((all * d.d / 4).div_ceil(128) as u32, 1, 1),
                    (128, 1, 1),
                    0,
                    &mut args!(pp, mp, op, args, n),
                    k.options.pdl,
                    Grouping::Plain,
                )?;
            }
        }
        Ok(())
    }

    /// Enqueues the planned attention on `s`.
    pub fn run(&self, k: &Kernels, s: Stream) -> Result<()> {
        self.run_with(k, s, None)
    }

    /// [`run`](Self::run), and the output quantized to E4M3 `codes` with the one f32 in
    /// `scale` (the codes [`Kernels::quantize_e4m3`] makes of the output, bit for bit): `codes`
    /// contiguous with as many elements as the output. Where the tensor-core kernel splits the
    /// keys, the kernel that merges the splits writes the codes too (no launch of its own);
    /// elsewhere a quantize follows the attention.
    pub fn run_quantized(
        &self,
        k: &Kernels,
        s: Stream,
        codes: &Tensor,
        scale: &Tensor,
    ) -> Result<()> {
        let op = "attention";
        k.check_ctx(op, &[codes, scale])?;
        codes.expect_dtype(op, "codes", DType::E4M3)?;
        scale.expect_dtype(op, "scale", DType::F32)?;
        if !codes.is_contiguous() || codes.numel() != self.out.numel() || scale.numel() != 1 {
            return Err(Error::shape(
                op,
                format!(
                    "codes {codes:?} must be contiguous with the {} elements of the output {:?}, scale {scale:?} one f32",
                    self.out.numel(),
                    self.out
                ),
            ));
        }
        let fused = matches!(self.path, Path::Flash { splits, .. } if splits > 1)
            && self.out.is_contiguous()
            && self.batch.n == 1;
        if fused {
            self.run_with(k, s, Some((codes, scale)))
        } else {
            self.run_with(k, s, None)?;
            k.quantize_e4m3(s, &self.out, scale, codes)
        }
    }

    fn run_with(&self, k: &Kernels, s: Stream, codes: Option<(&Tensor, &Tensor)>) -> Result<()> {
        match &self.path {
            Path::Direct => k.attention(
                s, &self.q, &self.k, &self.v, &self.out, &self.mask, self.scale,
            ),
            Path::Flash {
                dp,
                splits,
                keys_per_split,
                form,
                part,
            } => self.run_flash(
                k,
                s,
                *dp,
                *splits,
                *keys_per_split,
                *form,
                part.as_deref(),
                codes,
            ),
            Path::Gemm {
                qk,
                pv,
                scores,
                probs,
                rows_by_token,
            } => {
                for st in qk {
                    st.gemm.run(s, &st.a, &st.b, &st.c, None)?;
                }
                let c = k.cuda.as_ref().expect("GEMM path only on CUDA");
                let d = self.dims;
                let n_rows = d.hq * d.sq_len;
                // Row r is query r / heads (token-major rows) or r % sq_len (head-major).
                let heads_inner = if *rows_by_token { d.hq as u32 } else { 0 };
                let (sp, pp, nr, a, b) = (
                    scores.ptr(),
                    probs.ptr(),
                    n_rows as u32,
                    d.sq_len as u32,
                    d.sk_len as u32,
                );
                let (af, causal, co, sc) = (
                    self.always_from as u32,
                    self.mask.causal_offset.is_some() as i32,
                    self.mask.causal_offset.unwrap_or(0) as u32,
                    self.scale,
                );
                // Eight keys an access where whole rows of them fit the kernel's registers.
                let vec8 = (d.sk_len % 8 == 0
                    && d.sk_len <= SOFTMAX_VEC8_KEYS
                    && sp % 16 == 0
                    && pp % 16 == 0) as i32;
                // SAFETY: scores and probs hold hq·sq·sk elements (allocated by the plan).
                unsafe {
                    c.launch(
                        s,
                        // Shorter rows: a vec8 form of their own (fewer registers).
                        if vec8 != 0 && d.sk_len <= SOFTMAX_VEC3_KEYS {
                            "masked_softmax_vec3"
                        } else {
                            "masked_softmax"
                        },
                        Some(probs.dtype()),
                        // One warp per row, 8 rows a block.
                        (n_rows.div_ceil(8) as u32, 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Param::Mem(scores, sp),
                            Param::Mem(probs, pp),
                            nr.into(),
                            a.into(),
                            b.into(),
                            heads_inner.into(),
                            Param::opt(self.mask.valid_len.as_ref()),
                            Param::opt(self.mask.key_mask.as_ref()),
                            af.into(),
                            causal.into(),
                            co.into(),
                            sc.into(),
                            vec8.into(),
                        ],
                    )?;
                }
                for st in pv {
                    st.gemm.run(s, &st.a, &st.b, &st.c, None)?;
                }
                Ok(())
            }
        }
    }
}
