//! GEMM: `C = act(alpha·op(A)·op(B) + beta·C + bias)`, row-major operands, optional
//! transposes, batched with strides, bf16/f16 (f32 accumulate) or f32.
//!
//! A [`Gemm`] is a plan for one shape and layout: on CUDA its cuBLASLt descriptors and
//! algorithm are chosen once, when it is made; `run` only launches (and checks that the
//! tensors have the planned layout). Row-major `C = A·B` is column-major `Cᵀ = Bᵀ·Aᵀ`, so
//! the plan hands cuBLASLt the operands swapped.

use super::{P, gelu_tanh};
use crate::dtype::with_float;
use crate::error::{Error, Result};
use crate::pool::Pool;
use crate::{DType, Kernels, Tensor};
use frt_exec::Stream;
use frt_exec::cudarc::cublaslt::{result as lt, sys as lts};
use std::ffi::c_void;
use std::sync::Arc;

/// What follows the product (after bias).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Epilogue {
    None,
    /// GELU, tanh approximation.
    Gelu,
}

/// The layout of one operand: `batch × rows × cols`, row stride `ld`, batch stride (0 =
/// shared by every batch).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
struct Layout {
    batch: usize,
    rows: usize,
    cols: usize,
    ld: usize,
    batch_stride: usize,
}

fn layout(op: &'static str, name: &str, t: &Tensor) -> Result<Layout> {
    let (sh, st) = (t.shape(), t.strides());
    let bad = || {
        Error::shape(
            op,
            format!(
                "`{name}` {t:?} must be [rows, cols] or [batch, rows, cols] with unit column stride"
            ),
        )
    };
    match sh.len() {
        2 if st[1] == 1 => Ok(Layout {
            batch: 1,
            rows: sh[0],
            cols: sh[1],
            ld: st[0],
            batch_stride: 0,
        }),
        3 if st[2] == 1 => Ok(Layout {
            batch: sh[0],
            rows: sh[1],
            cols: sh[2],
            ld: st[1],
            batch_stride: st[0],
        }),
        _ => Err(bad()),
    }
}

/// The shape and options of a GEMM.
#[derive(Copy, Clone, Debug, PartialEq)]
struct Spec {
    a: Layout,
    b: Layout,
    c: Layout,
    a_dt: DType,
    c_dt: DType,
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    alpha: f32,
    beta: f32,
    bias: bool,
    epilogue: Epilogue,
}

/// What the GEMM tuning cache is keyed by: a [`Spec`] with its scalars as bits.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TuneKey {
    a: Layout,
    b: Layout,
    c: Layout,
    a_dt: DType,
    c_dt: DType,
    trans: (bool, bool),
    mnk_batch: [usize; 4],
    alpha_beta: (u32, u32),
    bias: bool,
    epilogue: Epilogue,
}

impl Spec {
    fn key(&self) -> TuneKey {
        TuneKey {
            a: self.a,
            b: self.b,
            c: self.c,
            a_dt: self.a_dt,
            c_dt: self.c_dt,
            trans: (self.trans_a, self.trans_b),
            mnk_batch: [self.m, self.n, self.k, self.batch],
            alpha_beta: (self.alpha.to_bits(), self.beta.to_bits()),
            bias: self.bias,
            epilogue: self.epilogue,
        }
    }
}

/// The process's cuBLASLt handle for `ctx`'s device: made by the first plan on that device,
/// shared by every plan after it (cuBLASLt takes one handle from several threads at once; a
/// handle holds no stream and no GEMM settings) and never destroyed. Each plan used to make
/// and destroy a handle of its own, and a plan made and dropped on one thread while another
/// thread captured a graph of cuBLASLt GEMMs ended that capture (`cublasLtMatmul` status 13,
/// `cudaErrorStreamCaptureInvalidated`; `kernels/tests/threads.rs`). The handle keeps its
/// device's primary context retained (it is valid only in that context), so the context
/// outlives the last `Ctx` on the device.
pub(crate) fn device_lt_handle(ctx: &frt_exec::Ctx) -> Result<lts::cublasLtHandle_t> {
    use frt_exec::cudarc::driver::CudaContext;
    struct Shared {
        ordinal: usize,
        _cu: Arc<CudaContext>,
        handle: usize,
    }
    static HANDLES: std::sync::Mutex<Vec<Shared>> = std::sync::Mutex::new(Vec::new());
    let cu = ctx.cuda_context().ok_or_else(|| {
        Error::shape(
            "cuBLASLt",
            "a cuBLASLt handle needs a CUDA context".to_string(),
        )
    })?;
    let mut handles = HANDLES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = handles.iter().find(|h| h.ordinal == cu.ordinal()) {
        return Ok(h.handle as lts::cublasLtHandle_t);
    }
    ctx.bind_to_thread()?;
    let handle = lt::create_handle().map_err(lt_err("cublasLtCreate"))?;
    handles.push(Shared {
        ordinal: cu.ordinal(),
        _cu: cu.clone(),
        handle: handle as usize,
    });
    Ok(handle)
}

/// cuBLASLt objects a plan owns: its matmul descriptor and the layouts of cuBLASLt's A, B and
/// C/D (null until made), destroyed together; and the device's shared handle
/// ([`device_lt_handle`]), which it does not destroy.
pub(crate) struct LtObjects {
    pub(crate) handle: lts::cublasLtHandle_t,
    pub(crate) desc: lts::cublasLtMatmulDesc_t,
    pub(crate) layouts: [lts::cublasLtMatrixLayout_t; 3],
}

// SAFETY: cuBLASLt descriptors may be used from any thread; a plan's are only mutated (the
// pointer attributes set before each enqueue) under calls serialized by the caller's stream
// use.
unsafe impl Send for LtObjects {}
// SAFETY: as above.
unsafe impl Sync for LtObjects {}

impl LtObjects {
    /// A matmul descriptor computing in f32 (layouts still to be made), beside `handle`
    /// (the device's, from [`device_lt_handle`]).
    pub(crate) fn new(handle: lts::cublasLtHandle_t) -> Result<LtObjects> {
        let mut o = LtObjects {
            handle,
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
        };
        o.desc = lt::create_matmul_desc(
            lts::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lts::cudaDataType::CUDA_R_32F,
        )
        .map_err(lt_err("cublasLtMatmulDescCreate"))?;
        Ok(o)
    }

    /// Whether cuBLASLt accepts `algo` for this plan's GEMM within the workspace: its
    /// workspace bytes, or `None`.
    pub(crate) fn check(&self, algo: lts::cublasLtMatmulAlgo_t) -> Option<usize> {
        // SAFETY: a plain-data C struct; zeroes are a valid (empty) value.
        let mut r: lts::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        // SAFETY: every descriptor is live and describes the operands; `r` is a valid out
        // value.
        let status = unsafe {
            lts::cublasLtMatmulAlgoCheck(
                self.handle,
                self.desc,
                self.layouts[0],
                self.layouts[1],
                self.layouts[2],
                self.layouts[2],
                &algo,
                &mut r,
            )
        };
        (status == lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            && r.state == lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            && r.workspaceSize <= WORKSPACE)
            .then_some(r.workspaceSize)
    }

    /// The first [`SPLIT_K_BASES`] candidates again with their reduction dimension split
    /// [`SPLIT_K`] ways (partial sums reduced in f32 in the workspace), where cuBLASLt accepts
    /// the split for this plan: a GEMM of few output tiles and a long reduction (a
    /// projection of a few hundred rows down from a wide hidden layer) otherwise leaves most
    /// SMs idle, and the heuristic does not always offer a split form.
    pub(crate) fn split_k_variants(
        &self,
        candidates: &[lts::cublasLtMatmulAlgo_t],
    ) -> Vec<(lts::cublasLtMatmulAlgo_t, usize)> {
        let scheme = lts::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE as u32;
        let set = |algo: &mut lts::cublasLtMatmulAlgo_t, attr, v: &u32| {
            // SAFETY: `algo` is a live algorithm value; `v` has the attribute's type.
            unsafe {
                lts::cublasLtMatmulAlgoConfigSetAttribute(
                    algo,
                    attr,
                    v as *const u32 as *const c_void,
                    4,
                )
            }
        };
        let mut out = Vec::new();
        for base in candidates.iter().take(SPLIT_K_BASES) {
            for splits in SPLIT_K {
                let mut algo = *base;
                use lts::cublasLtMatmulAlgoConfigAttributes_t as A;
                if set(&mut algo, A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits)
                    != lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                    || set(&mut algo, A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme)
                        != lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                {
                    continue;
                }
                if let Some(ws) = self.check(algo) {
                    out.push((algo, ws));
                }
            }
        }
        out
    }
}

impl Drop for LtObjects {
    fn drop(&mut self) {
        // SAFETY: made by `new` and the plan's constructor, destroyed once (the handle is the
        // device's: not this plan's to destroy).
        unsafe {
            for l in self.layouts {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
            if !self.desc.is_null() {
                let _ = lt::destroy_matmul_desc(self.desc);
            }
        }
    }
}

/// cuBLASLt objects of one plan.
struct LtPlan {
    lt: LtObjects,
    algo: lts::cublasLtMatmulAlgo_t,
    /// Workspace bytes `algo` uses (e.g. for split-K partial sums).
    workspace_bytes: usize,
}

impl std::ops::Deref for LtPlan {
    type Target = LtObjects;
    fn deref(&self) -> &LtObjects {
        &self.lt
    }
}

pub(crate) fn lt_err(call: &'static str) -> impl Fn(lt::CublasError) -> Error {
    move |e| Error::Cublas {
        call,
        status: e.0 as i32,
    }
}

/// cuBLASLt's name of a float dtype; other dtypes are an error naming the operand.
fn cuda_type(dt: DType, arg: &'static str) -> Result<lts::cudaDataType> {
    match dt {
        DType::BF16 => Ok(lts::cudaDataType::CUDA_R_16BF),
        DType::F16 => Ok(lts::cudaDataType::CUDA_R_16F),
        DType::F32 => Ok(lts::cudaDataType::CUDA_R_32F),
        DType::I32 | DType::U8 | DType::E4M3 => Err(Error::DType {
            op: "gemm",
            arg,
            got: dt,
            expected: "f32, bf16 or f16",
        }),
    }
}

/// Workspace cuBLASLt may use per GEMM (what it recommends for Hopper); one per stream.
pub(crate) const WORKSPACE: usize = 32 << 20;

impl LtPlan {
    fn new(k: &Kernels, sp: &Spec) -> Result<LtPlan> {
        k.ctx.bind_to_thread()?;
        let mut objects = LtObjects::new(device_lt_handle(&k.ctx)?)?;
        let (handle, desc) = (objects.handle, objects.desc);
        let set = |attr, v: *const c_void, size| {
            // SAFETY: `desc` is live; `v` points to `size` bytes of the attribute's type.
            unsafe { lt::set_matmul_desc_attribute(desc, attr, v, size) }
                .map_err(lt_err("cublasLtMatmulDescSetAttribute"))
        };
        // Swapped operands: cuBLASLt's A is our B, its B is our A.
        // cublasOperation_t: 0 = N, 1 = T.
        let op = |t: bool| -> i32 { if t { 1 } else { 0 } };
        let (ta, tb) = (op(sp.trans_b), op(sp.trans_a));
        set(
            lts::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            &ta as *const _ as *const c_void,
            size_of_val(&ta),
        )?;
        set(
            lts::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
            &tb as *const _ as *const c_void,
            size_of_val(&tb),
        )?;
        let epi = match (sp.bias, sp.epilogue) {
            (false, Epilogue::None) => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            (true, Epilogue::None) => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            (false, Epilogue::Gelu) => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU,
            (true, Epilogue::Gelu) => lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
        };
        set(
            lts::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &epi as *const _ as *const c_void,
            size_of_val(&epi),
        )?;
        if sp.bias {
            let bt = cuda_type(sp.c_dt, "bias")?;
            set(
                lts::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                &bt as *const _ as *const c_void,
                size_of_val(&bt),
            )?;
        }
        // Column-major views: our row-major X[r, c] with row stride ld is Xᵀ[c, r] with ld.
        let mk = |l: &Layout, dt: DType| -> Result<lts::cublasLtMatrixLayout_t> {
            let ml = lt::create_matrix_layout(
                cuda_type(dt, "operand")?,
                l.cols as u64,
                l.rows as u64,
                l.ld as i64,
            )
            .map_err(lt_err("cublasLtMatrixLayoutCreate"))?;
            if sp.batch > 1 {
                let (count, stride) = (sp.batch as i32, l.batch_stride as i64);
                // SAFETY: `ml` is live; the values have the attributes' types.
                unsafe {
                    lt::set_matrix_layout_attribute(
                        ml,
                        lts::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        &count as *const _ as *const c_void,
                        4,
                    )
                    .map_err(lt_err("cublasLtMatrixLayoutSetAttribute"))?;
                    lt::set_matrix_layout_attribute(ml, lts::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride as *const _ as *const c_void, 8)
                        .map_err(lt_err("cublasLtMatrixLayoutSetAttribute"))?;
                }
            }
            Ok(ml)
        };
        for (slot, (l, dt)) in [(&sp.b, sp.a_dt), (&sp.a, sp.a_dt), (&sp.c, sp.c_dt)]
            .into_iter()
            .enumerate()
        {
            objects.layouts[slot] = mk(l, dt)?;
        }
        let layouts = objects.layouts;
        let pref = lt::create_matmul_pref().map_err(lt_err("cublasLtMatmulPreferenceCreate"))?;
        let ws = WORKSPACE as u64;
        // SAFETY: `pref` is live; the value has the attribute's type.
        unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const _ as *const c_void,
                8,
            )
            .map_err(lt_err("cublasLtMatmulPreferenceSetAttribute"))?;
        }
        // Up to TUNING_CANDIDATES algorithms in the heuristic's order of preference.
        let mut found = [no_result(); TUNING_CANDIDATES];
        let mut count = 0i32;
        // SAFETY: every descriptor is live and describes the operands; `found` has room for
        // the requested count.
        let status = unsafe {
            lts::cublasLtMatmulAlgoGetHeuristic(
                handle,
                desc,
                layouts[0],
                layouts[1],
                layouts[2],
                layouts[2],
                pref,
                TUNING_CANDIDATES as i32,
                found.as_mut_ptr(),
                &mut count,
            )
        };
        // SAFETY: destroyed once.
        unsafe { lt::destroy_matmul_pref(pref) }
            .map_err(lt_err("cublasLtMatmulPreferenceDestroy"))?;
        let (mut candidates, mut workspace_sizes): (Vec<lts::cublasLtMatmulAlgo_t>, Vec<usize>) =
            found[..count.max(0) as usize]
                .iter()
                .filter(|r| {
                    r.state == lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                        && r.workspaceSize <= WORKSPACE
                })
                .map(|r| (r.algo, r.workspaceSize))
                .unzip();
        if status != lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS || candidates.is_empty() {
            return Err(Error::NoAlgorithm {
                what: format!("{sp:?}"),
            });
        }
        let mut plan = LtPlan {
            lt: objects,
            algo: candidates[0],
            workspace_bytes: workspace_sizes[0],
        };
        if k.options.gemm_tuning && worth_tuning(sp) {
            let cuda = k.cuda.as_ref().expect("CUDA plans exist on CUDA");
            let key = sp.key();
            let known = cuda
                .tuned
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&key)
                .copied();
            // The disk cache's entry: the specification, whether split-K forms compete and
            // whether the timed graphs had their memset nodes replaced.
            let spec = format!(
                "{key:?} split_k={} memsets={}",
                k.options.split_k, k.options.memset_kernels
            );
            let on_disk = || {
                let (data, _) = cuda.tuning_cache.get(&spec)?;
                let algo = lts::cublasLtMatmulAlgo_t { data };
                plan.check(algo).map(|ws| (algo, ws))
            };
            (plan.algo, plan.workspace_bytes) = match known.or_else(on_disk) {
                Some(chosen) => chosen,
                None => {
                    if k.options.split_k {
                        for (algo, ws) in plan.split_k_variants(&candidates) {
                            candidates.push(algo);
                            workspace_sizes.push(ws);
                        }
                    }
                    // Timing needs scratch memory and a stream of its own; where that is not
                    // possible (e.g. inside a global-mode capture) the heuristic's choice
                    // stands, and is not kept on disk.
                    let timed = if candidates.len() > 1 {
                        plan.fastest(k, sp, &candidates).ok()
                    } else {
                        Some(0)
                    };
                    let i = timed.unwrap_or(0);
                    let chosen = (candidates[i], workspace_sizes[i]);
                    if timed.is_some() {
                        cuda.tuning_cache.put(&spec, chosen.0.data, chosen.1);
                    }
                    chosen
                }
            };
            cuda.tuned
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, (plan.algo, plan.workspace_bytes));
        }
        Ok(plan)
    }

    /// Points the descriptor's bias at device address `ptr`.
    fn set_bias(&self, ptr: u64) -> Result<()> {
        // SAFETY: the descriptor is live; the value is a device pointer.
        unsafe {
            lt::set_matmul_desc_attribute(
                self.desc,
                lts::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &ptr as *const _ as *const c_void,
                8,
            )
        }
        .map_err(lt_err("cublasLtMatmulDescSetAttribute"))
    }

    /// Enqueues `c = alpha·a·b + beta·c` (the plan's layouts and epilogue) with `algo`.
    ///
    /// # Safety
    /// `a`, `b`, `c` and `workspace` (WORKSPACE bytes) are live device memory holding the
    /// plan's layouts; `raw` is a stream of the plan's context.
    #[allow(clippy::too_many_arguments)]
    unsafe fn matmul(
        &self,
        algo: &lts::cublasLtMatmulAlgo_t,
        (alpha, beta): (f32, f32),
        a: u64,
        b: u64,
        c: u64,
        workspace: u64,
        raw: lts::cudaStream_t,
    ) -> Result<()> {
        // Swapped operands (see `new`): cuBLASLt's A is our b.
        // SAFETY: the caller's contract.
        unsafe {
            lt::matmul(
                self.handle,
                self.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                b as *const c_void,
                self.layouts[0],
                a as *const c_void,
                self.layouts[1],
                c as *const c_void,
                self.layouts[2],
                c as *mut c_void,
                self.layouts[2],
                algo,
                workspace as *mut c_void,
                WORKSPACE,
                raw,
            )
        }
        .map_err(lt_err("cublasLtMatmul"))
    }

    /// Times each candidate on scratch operands of the plan's layouts (see
    /// [`fastest_candidate`]) and returns the fastest's index.
    fn fastest(
        &self,
        k: &Kernels,
        sp: &Spec,
        candidates: &[lts::cublasLtMatmulAlgo_t],
    ) -> Result<usize> {
        let cuda = k.cuda.as_ref().expect("CUDA plans exist on CUDA");
        let bytes = |l: &Layout, dt: DType| {
            ((l.batch - 1) * l.batch_stride + (l.rows - 1) * l.ld + l.cols) * dt.size()
        };
        let a = scratch(k, "gemm.tuning.a", bytes(&sp.a, sp.a_dt))?;
        let bs = weight_copies(k, "gemm.tuning.b", bytes(&sp.b, sp.a_dt))?;
        let c = scratch(k, "gemm.tuning.c", bytes(&sp.c, sp.c_dt))?;
        let bias = scratch(k, "gemm.tuning.bias", sp.n * sp.c_dt.size())?;
        if sp.bias {
            // Set again by every run with its own bias.
            self.set_bias(bias.ptr())?;
        }
        let s = cuda.tuning_stream(&k.ctx)?;
        // The tuning stream's workspace: the graphs replay on that stream only.
        let workspace = cuda.workspace(&k.ctx, s)?;
        let label = format!(
            "gemm m={} n={} k={} batch={} {:?}",
            sp.m, sp.n, sp.k, sp.batch, sp.a_dt
        );
        fastest_candidate(k, &label, candidates.len(), &|i, r, _, raw| {
            // SAFETY: scratch buffers sized for the layouts; the workspace is WORKSPACE
            // bytes; all outlive the timing graphs.
            unsafe {
                self.matmul(
                    &candidates[i],
                    (sp.alpha, sp.beta),
                    a.ptr(),
                    bs[r % bs.len()].ptr(),
                    c.ptr(),
                    workspace.ptr(),
                    raw,
                )
            }
        })
    }
}

/// A tuning scratch buffer of `n` bytes (at least 16).
pub(crate) fn scratch(k: &Kernels, name: &str, n: usize) -> Result<frt_exec::Buffer> {
    Ok(frt_exec::Buffer::alloc(&k.ctx, name, n.max(16))?)
}

/// Copies of a weight of `bytes` for a timing to cycle through: [`COLD_BYTES`] in all (at
/// most [`TUNING_RUNS`]), so that the weight comes from memory, not the L2 cache.
pub(crate) fn weight_copies(
    k: &Kernels,
    name: &str,
    bytes: usize,
) -> Result<Vec<frt_exec::Buffer>> {
    let copies = (COLD_BYTES / bytes.max(1)).clamp(1, TUNING_RUNS);
    (0..copies).map(|_| scratch(k, name, bytes)).collect()
}

/// Times `n` candidate algorithms of one GEMM (on the kernels' tuning stream) and returns the
/// fastest's index; the first (the heuristic's choice) on ties. `enqueue(i, r, stream, raw)`
/// enqueues run `r` of candidate `i` (reading copy `r` of the weight, see [`weight_copies`]) on
/// `stream` (whose CUDA stream is `raw`).
///
/// A candidate is timed as a model runs it: replays of a graph of [`TUNING_RUNS`] launches (so
/// no host launch cost sits between them, which would hide the difference between candidates
/// for GEMMs of a few microseconds), the weight coming from memory. The candidates are timed
/// in turn, [`TUNING_ROUNDS`] times, each keeping its median. A candidate that fails to launch
/// or to be captured is skipped.
pub(crate) fn fastest_candidate(
    k: &Kernels,
    label: &str,
    n: usize,
    enqueue: &dyn Fn(usize, usize, Stream, lts::cudaStream_t) -> Result<()>,
) -> Result<usize> {
    let cuda = k.cuda.as_ref().expect("CUDA plans exist on CUDA");
    let s = cuda.tuning_stream(&k.ctx)?;
    let (t0, t1) = (k.ctx.timing_event()?, k.ctx.timing_event()?);
    let key = frt_exec::ShapeKey(0);
    let capture = |i: usize| -> Result<(frt_exec::Graph, usize)> {
        let g = frt_exec::Graph::new(&k.ctx, "gemm.tuning", 1);
        let mut nodes = 0;
        g.capture(key, |cs| {
            k.ctx.bind_to_thread()?;
            let raw = k.ctx.raw_stream(cs)? as lts::cudaStream_t;
            for r in 0..TUNING_RUNS {
                enqueue(i, r, cs, raw)?;
            }
            // Only the tuning log shows them.
            if k.options.tuning_log {
                nodes = captured_nodes(raw);
            }
            Ok::<(), Error>(())
        })?;
        // Once untimed: first-launch costs, and a candidate that fails to run.
        g.replay(key, s)?;
        k.ctx.sync_stream(s)?;
        Ok((g, nodes))
    };
    let time = |g: &frt_exec::Graph| -> Result<f32> {
        g.replay(key, s)?;
        t0.record(s)?;
        for _ in 0..TIMED_REPLAYS {
            g.replay(key, s)?;
        }
        t1.record(s)?;
        t1.synchronize()?;
        Ok(t1.elapsed_ms(&t0)? / (TIMED_REPLAYS * TUNING_RUNS) as f32)
    };
    let mut graphs = Vec::with_capacity(n);
    // Each candidate's graph nodes (counted for the tuning log): more than its launches where
    // cuBLASLt enqueues work of its own beside the kernel (a split's reduction kernel, a
    // memset of its workspace).
    let mut nodes = Vec::with_capacity(n);
    for i in 0..n {
        match capture(i) {
            Ok((g, c)) => {
                nodes.push(c);
                graphs.push(Some(g));
            }
            Err(_) => {
                k.ctx.sync_stream(s)?;
                nodes.push(0);
                graphs.push(None);
            }
        }
    }
    // Every candidate is timed in each of TUNING_ROUNDS rounds, in turn, and keeps its
    // median: a clock change or another process's work during one timing does not decide
    // the choice, nor does one fast round of a candidate whose time varies. (On an H100 the
    // prefix MLP down projection, 576 × 16384 → 2048, had a candidate of 58 µs in its
    // fastest round and 63 µs in its median, against 61 µs for the one before it in every
    // round; chosen by its fastest round, it made the prefix 0.09 ms slower.)
    let mut rounds = vec![Vec::with_capacity(TUNING_ROUNDS); n];
    for _ in 0..TUNING_ROUNDS {
        for (g, r) in graphs.iter().zip(&mut rounds) {
            if let Some(g) = g {
                r.push(time(g)?);
            }
        }
    }
    let times: Vec<f32> = rounds
        .iter_mut()
        .map(|r| {
            if r.is_empty() {
                return f32::NAN;
            }
            r.sort_by(f32::total_cmp);
            r[r.len() / 2]
        })
        .collect();
    let mut best: Option<(f32, usize)> = None;
    for (i, &ms) in times.iter().enumerate() {
        // A candidate must be clearly faster to replace an earlier one.
        if !ms.is_nan() && best.is_none_or(|(b, _)| ms < b * 0.97) {
            best = Some((ms, i));
        }
    }
    k.ctx.sync_stream(s)?;
    let (best_ms, i) = best.ok_or_else(|| Error::NoAlgorithm {
        what: format!("{label} (no candidate ran)"),
    })?;
    if k.options.tuning_log {
        eprintln!(
            "{label}: heuristic {:.2} µs, chosen #{i} {:.2} µs (of {:?})",
            times[0] * 1e3,
            best_ms * 1e3,
            times
                .iter()
                .zip(&nodes)
                .map(|(t, &c)| format!("{:.1}{}", t * 1e3, if c > TUNING_RUNS { "+" } else { "" }))
                .collect::<Vec<_>>()
        );
    }
    Ok(i)
}

/// The nodes of the graph that stream `raw` is capturing (0 where the driver does not say).
fn captured_nodes(raw: lts::cudaStream_t) -> usize {
    use frt_exec::cudarc::driver::sys as ds;
    let mut status = ds::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut graph: ds::CUgraph = std::ptr::null_mut();
    let mut n = 0usize;
    // SAFETY: a live stream; valid out pointers, null where the value is not wanted.
    unsafe {
        let info = ds::cuStreamGetCaptureInfo_v3(
            raw as ds::CUstream,
            &mut status,
            std::ptr::null_mut(),
            &mut graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        if info != ds::CUresult::CUDA_SUCCESS || graph.is_null() {
            return 0;
        }
        if ds::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) != ds::CUresult::CUDA_SUCCESS {
            return 0;
        }
    }
    n
}

/// Only GEMMs of at least this many multiply-adds (m·n·k·batch) are timed: below it a run
/// takes a microsecond or two whatever the algorithm (the heuristic's first choice stands).
/// A model's small-batch GEMMs (an action expert's 50 rows against its weights) are above
/// it: they run hundreds of times per inference and their algorithms differ most.
pub(crate) const TUNING_MIN_MACS: usize = 1 << 24;

/// How many bytes of copies of `b` a timing cycles through: more than twice the L2 cache of
/// an H100 or H200 (50 MB), so that a weight is read from memory.
const COLD_BYTES: usize = 128 << 20;
/// Timed replays of a candidate's graph in one round (after one untimed).
const TIMED_REPLAYS: usize = 3;
/// Rounds over all candidates; each keeps its median round.
const TUNING_ROUNDS: usize = 5;

/// An empty heuristic result for cuBLASLt to fill in.
pub(crate) fn no_result() -> lts::cublasLtMatmulHeuristicResult_t {
    lts::cublasLtMatmulHeuristicResult_t {
        // SAFETY: a plain-data C struct; zeroes are a valid (empty) value.
        algo: unsafe { std::mem::zeroed() },
        workspaceSize: 0,
        state: lts::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
        wavesCount: 0.0,
        reserved: [0; 4],
    }
}

fn worth_tuning(sp: &Spec) -> bool {
    sp.m * sp.n * sp.k * sp.batch >= TUNING_MIN_MACS
}

/// Algorithms a CUDA GEMM plan considers (the heuristic's best first).
pub(crate) const TUNING_CANDIDATES: usize = 8;
/// How many of the heuristic's candidates are also tried with a split reduction dimension.
const SPLIT_K_BASES: usize = 3;
/// The splits tried for each of those.
const SPLIT_K: [u32; 4] = [2, 3, 4, 8];

/// Launches in a candidate's timing graph (each reading the next copy of `b`).
const TUNING_RUNS: usize = 20;

/// A GEMM planned for one shape and layout (see the module docs).
#[derive(Clone)]
pub struct Gemm {
    spec: Spec,
    lt: Option<Arc<LtPlan>>,
    kernels: Kernels,
}

/// What a GEMM computes besides the product (see [`Kernels::gemm`]); `Default` is
/// `C = A·B`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmOptions {
    /// `op(A) = Aᵀ`.
    pub trans_a: bool,
    /// `op(B) = Bᵀ` (a PyTorch/safetensors weight `[out, in]` as `b`).
    pub trans_b: bool,
    pub alpha: f32,
    /// `beta = 1` accumulates into `C` (a residual).
    pub beta: f32,
    /// A bias `[n]` (`c`'s dtype) is given to [`Gemm::run`].
    pub bias: bool,
    pub epilogue: Epilogue,
}

impl Default for GemmOptions {
    fn default() -> Self {
        GemmOptions {
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
            bias: false,
            epilogue: Epilogue::None,
        }
    }
}

impl GemmOptions {
    /// `A·Bᵀ`: activations times a PyTorch/safetensors weight `[out, in]`.
    pub fn weight() -> GemmOptions {
        GemmOptions {
            trans_b: true,
            ..Default::default()
        }
    }
}

impl Kernels {
    /// Plans `C = act(alpha·op(A)·op(B) + beta·C + bias)` for tensors laid out like `a`, `b`,
    /// `c` (each `[rows, cols]` or `[batch, rows, cols]`, unit column stride, any row stride;
    /// a 2-D `a` or `b` is shared by every batch), as `o` says.
    pub fn gemm(&self, a: &Tensor, b: &Tensor, c: &Tensor, o: GemmOptions) -> Result<Gemm> {
        let GemmOptions {
            trans_a,
            trans_b,
            alpha,
            beta,
            bias: with_bias,
            epilogue,
        } = o;
        let op = "gemm";
        self.check_ctx(op, &[a, b, c])?;
        a.expect_float(op, "a")?;
        b.expect_dtype(op, "b", a.dtype())?;
        if c.dtype() != a.dtype() && c.dtype() != DType::F32 {
            return Err(Error::DType {
                op,
                arg: "c",
                got: c.dtype(),
                expected: "a's dtype or f32",
            });
        }
        let (la, lb, lc) = (
            layout(op, "a", a)?,
            layout(op, "b", b)?,
            layout(op, "c", c)?,
        );
        let (m, ka) = if trans_a {
            (la.cols, la.rows)
        } else {
            (la.rows, la.cols)
        };
        let (kb, n) = if trans_b {
            (lb.cols, lb.rows)
        } else {
            (lb.rows, lb.cols)
        };
        if ka != kb || lc.rows != m || lc.cols != n {
            return Err(Error::shape(
                op,
                format!(
                    "op(a) is {m}×{ka}, op(b) {kb}×{n}, c {}×{}",
                    lc.rows, lc.cols
                ),
            ));
        }
        let batch = lc.batch;
        for (l, name) in [(la, "a"), (lb, "b")] {
            if l.batch != batch && l.batch != 1 {
                return Err(Error::shape(
                    op,
                    format!("`{name}` has batch {} but c has {batch}", l.batch),
                ));
            }
        }
        let spec = Spec {
            a: la,
            b: lb,
            c: lc,
            a_dt: a.dtype(),
            c_dt: c.dtype(),
            trans_a,
            trans_b,
            m,
            n,
            k: ka,
            batch,
            alpha,
            beta,
            bias: with_bias,
            epilogue,
        };
        let lt = match &self.cuda {
            Some(_) => Some(Arc::new(LtPlan::new(self, &spec)?)),
            None => None,
        };
        Ok(Gemm {
            spec,
            lt,
            kernels: self.clone(),
        })
    }
}

impl Kernels {
    /// Plans a linear layer with a PyTorch/safetensors weight `[out, in]`:
    /// `out = x·wᵀ (+ bias)`, or with `accumulate` `out += x·wᵀ (+ bias)` (a residual).
    pub fn linear(
        &self,
        x: &Tensor,
        w: &Tensor,
        out: &Tensor,
        bias: bool,
        accumulate: bool,
    ) -> Result<Gemm> {
        let o = GemmOptions {
            beta: if accumulate { 1.0 } else { 0.0 },
            bias,
            ..GemmOptions::weight()
        };
        self.gemm(x, w, out, o)
    }
}

impl Gemm {
    /// `(m, n, k, batch)`.
    pub fn dims(&self) -> (usize, usize, usize, usize) {
        (self.spec.m, self.spec.n, self.spec.k, self.spec.batch)
    }

    /// Bytes of GEMM workspace the planned algorithm uses (cuBLASLt's split-K partial sums,
    /// for one); 0 on the host backend.
    pub fn workspace_bytes(&self) -> usize {
        self.lt.as_ref().map_or(0, |p| p.workspace_bytes)
    }

    /// Enqueues the GEMM on `s`. The tensors must have the planned layouts (their buffers
    /// may differ from those the plan was made with).
    pub fn run(
        &self,
        s: Stream,
        a: &Tensor,
        b: &Tensor,
        c: &Tensor,
        bias: Option<&Tensor>,
    ) -> Result<()> {
        let op = "gemm";
        let sp = self.spec;
        let k = &self.kernels;
        k.check_ctx(op, &[a, b, c])?;
        if layout(op, "a", a)? != sp.a
            || layout(op, "b", b)? != sp.b
            || layout(op, "c", c)? != sp.c
            || a.dtype() != sp.a_dt
            || b.dtype() != sp.a_dt
            || c.dtype() != sp.c_dt
        {
            return Err(Error::shape(
                op,
                format!("{a:?}, {b:?}, {c:?} differ from the planned layout {sp:?}"),
            ));
        }
        super::check_bias(k, op, bias, sp.bias, sp.c_dt, sp.n)?;
        match &self.lt {
            Some(p) => {
                let workspace = k
                    .cuda
                    .as_ref()
                    .expect("CUDA plans exist on CUDA")
                    .workspace(&k.ctx, s)?;
                k.retain(s, &[a, b, c]);
                if let Some(t) = bias {
                    k.retain(s, &[t]);
                }
                k.ctx.retain(s, &workspace);
                k.ctx.retain_object(s, p.clone());
                if let Some(t) = bias {
                    p.set_bias(t.ptr())?;
                }
                k.ctx.bind_to_thread()?;
                let raw = k.ctx.raw_stream(s)? as lts::cudaStream_t;
                // SAFETY: layouts were checked against the plan; pointers are live device
                // memory retained by a capture in progress; the workspace is this plan's.
                unsafe {
                    p.matmul(
                        &p.algo,
                        (sp.alpha, sp.beta),
                        a.ptr(),
                        b.ptr(),
                        c.ptr(),
                        workspace.ptr(),
                        raw,
                    )
                }
            }
            None => {
                let (ap, bp, cp, biasp) = (P::of(a), P::of(b), P::of(c), bias.map(P::of));
                let keep = (a.clone(), b.clone(), c.clone(), bias.cloned());
                k.host(s, move || {
                    let _ = &keep;
                    host_gemm(&sp, ap, bp, cp, biasp);
                })
            }
        }
    }
}

/// A linear layer `x·wᵀ` (weight `[out, in]`) with its reduction dimension split into `parts`
/// equal parts, as one batched GEMM: part `p` of the inputs' columns gives the f32 partial sum
/// `partials[p]` (`[parts, rows, out]`, contiguous), and the op that consumes the product adds
/// the parts as it reads them (see [`Kernels::residual_ada_rms_norm`]). For GEMMs of few rows
/// and a long reduction (the action expert's attention output and down projections): more thread
/// blocks stream the weight than in one GEMM of the same shape, and the reduction needs no
/// launch of its own (cuBLASLt's split-K forms reduce in a second kernel).
#[derive(Clone)]
pub struct SplitLinear {
    gemm: Gemm,
    parts: usize,
}

/// `t` (`[rows, k]`, unit column stride) as `parts` column blocks: `[parts, rows, k / parts]`.
fn column_blocks(op: &'static str, name: &str, t: &Tensor, parts: usize) -> Result<Tensor> {
    let l = layout(op, name, t)?;
    if t.rank() != 2 || parts == 0 || l.cols % parts != 0 {
        return Err(Error::shape(
            op,
            format!("`{name}` {t:?} must be [rows, k] with k a multiple of the {parts} parts"),
        ));
    }
    let part = l.cols / parts;
    Tensor::with_layout(
        t.buffer(),
        t.dtype(),
        &[parts, l.rows, part],
        &[part, l.ld, 1],
        t.offset(),
    )
}

impl Kernels {
    /// Plans [`SplitLinear`]: `x` `[rows, in]`, `w` `[out, in]` of `x`'s dtype, `partials` f32
    /// `[parts, rows, out]` contiguous; `in` a multiple of `parts`.
    pub fn linear_split(&self, x: &Tensor, w: &Tensor, partials: &Tensor) -> Result<SplitLinear> {
        let op = "linear_split";
        partials.expect_dtype(op, "partials", DType::F32)?;
        if partials.rank() != 3 || !partials.is_contiguous() {
            return Err(Error::shape(
                op,
                format!("partials {partials:?} must be contiguous [parts, rows, out]"),
            ));
        }
        let parts = partials.dim(0);
        let gemm = self.linear(
            &column_blocks(op, "x", x, parts)?,
            &column_blocks(op, "w", w, parts)?,
            partials,
            false,
            false,
        )?;
        Ok(SplitLinear { gemm, parts })
    }
}

impl SplitLinear {
    /// The number of partial sums.
    pub fn parts(&self) -> usize {
        self.parts
    }

    /// Enqueues the GEMM on `s` (tensors of the planned layouts).
    pub fn run(&self, s: Stream, x: &Tensor, w: &Tensor, partials: &Tensor) -> Result<()> {
        let op = "linear_split";
        self.gemm.run(
            s,
            &column_blocks(op, "x", x, self.parts)?,
            &column_blocks(op, "w", w, self.parts)?,
            partials,
            None,
        )
    }
}

/// Columns of C computed together in one stack tile.
const TILE: usize = 64;

fn host_gemm(sp: &Spec, ap: P, bp: P, cp: P, bias: Option<P>) {
    // One task per (batch, block of rows).
    const ROWS_PER_TASK: usize = 4;
    let blocks = sp.m.div_ceil(ROWS_PER_TASK);
    Pool::global().run(sp.batch * blocks, &|task| {
        let (bi, blk) = (task / blocks, task % blocks);
        let rows = blk * ROWS_PER_TASK..((blk + 1) * ROWS_PER_TASK).min(sp.m);
        if sp.a_dt == DType::F32 && !sp.trans_a && sp.trans_b {
            // SAFETY: the planned layouts were checked against the tensors.
            unsafe { f32_rows_times_rows(sp, bi, rows, ap, bp, cp, bias) };
            return;
        }
        with_float!(sp.a_dt, T, {
            with_float!(sp.c_dt, C, {
                for i in rows.clone() {
                    gemm_row::<T, C>(sp, bi, i, ap, bp, cp, bias);
                }
            })
        })
    });
}

/// Dot product in 8 independent lanes (so the compiler vectorizes it).
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + ra.iter().zip(rb).map(|(x, y)| x * y).sum::<f32>()
}

/// f32 `A·Bᵀ` for up to four rows of A at once (each B row is read once per block).
///
/// # Safety
/// The spec describes the tensors behind the pointers.
unsafe fn f32_rows_times_rows(
    sp: &Spec,
    bi: usize,
    rows: std::ops::Range<usize>,
    ap: P,
    bp: P,
    cp: P,
    bias: Option<P>,
) {
    let k = sp.k;
    // SAFETY: rows of A and B are `k` contiguous f32 inside their checked layouts.
    let a_row = |i: usize| unsafe {
        std::slice::from_raw_parts(
            (ap.0 as *const f32).add(bi * sp.a.batch_stride + i * sp.a.ld),
            k,
        )
    };
    let b_row = |j: usize| unsafe {
        std::slice::from_raw_parts(
            (bp.0 as *const f32).add(bi * sp.b.batch_stride + j * sp.b.ld),
            k,
        )
    };
    let (r0, n_rows) = (rows.start, rows.len());
    let ar = [
        a_row(r0),
        a_row(r0 + 1.min(n_rows - 1)),
        a_row(r0 + 2.min(n_rows - 1)),
        a_row(r0 + 3.min(n_rows - 1)),
    ];
    with_float!(sp.c_dt, C, {
        for j in 0..sp.n {
            let br = b_row(j);
            let mut acc = [[0f32; 8]; 4];
            let chunks = k / 8;
            for c in 0..chunks {
                let y = &br[c * 8..c * 8 + 8];
                for (r, row) in ar.iter().enumerate() {
                    let x = &row[c * 8..c * 8 + 8];
                    for l in 0..8 {
                        acc[r][l] += x[l] * y[l];
                    }
                }
            }
            for (r, row) in ar.iter().enumerate().take(n_rows) {
                let tail: f32 = row[chunks * 8..]
                    .iter()
                    .zip(&br[chunks * 8..])
                    .map(|(x, y)| x * y)
                    .sum();
                let sum = acc[r].iter().sum::<f32>() + tail;
                // SAFETY: as above, for C and the bias.
                unsafe { finish::<C>(sp, bi, r0 + r, j, sum, cp, bias) };
            }
        }
    })
}

/// `C[i, j] = act(alpha·sum + beta·C[i, j] + bias[j])`.
///
/// # Safety
/// `(bi, i, j)` is inside C's planned layout.
#[inline(always)]
unsafe fn finish<C: crate::dtype::Float>(
    sp: &Spec,
    bi: usize,
    i: usize,
    j: usize,
    sum: f32,
    cp: P,
    bias: Option<P>,
) {
    let ci = bi * sp.c.batch_stride + i * sp.c.ld + j;
    let mut v = sp.alpha * sum;
    // SAFETY: the caller's contract.
    unsafe {
        if sp.beta != 0.0 {
            v += sp.beta * cp.ld::<C>(ci);
        }
        if let Some(b) = bias {
            v += b.ld::<C>(j);
        }
        if sp.epilogue == Epilogue::Gelu {
            v = gelu_tanh(v);
        }
        cp.st::<C>(ci, v);
    }
}

/// Row `i` of batch `bi` of C, in tiles of `TILE` columns accumulated in f32 on the stack.
#[allow(clippy::too_many_arguments)]
fn gemm_row<T: crate::dtype::Float, C: crate::dtype::Float>(
    sp: &Spec,
    bi: usize,
    i: usize,
    ap: P,
    bp: P,
    cp: P,
    bias: Option<P>,
) {
    let a_at = |kk: usize| {
        if sp.trans_a {
            bi * sp.a.batch_stride + kk * sp.a.ld + i
        } else {
            bi * sp.a.batch_stride + i * sp.a.ld + kk
        }
    };
    let b_at = |kk: usize, j: usize| {
        if sp.trans_b {
            bi * sp.b.batch_stride + j * sp.b.ld + kk
        } else {
            bi * sp.b.batch_stride + kk * sp.b.ld + j
        }
    };
    let mut j0 = 0;
    while j0 < sp.n {
        let w = TILE.min(sp.n - j0);
        let mut acc = [0f32; TILE];
        // SAFETY: every index is inside the planned layouts, checked against the tensors.
        unsafe {
            if sp.trans_b {
                for (jj, slot) in acc.iter_mut().enumerate().take(w) {
                    let mut s = 0f32;
                    for kk in 0..sp.k {
                        s += ap.ld::<T>(a_at(kk)) * bp.ld::<T>(b_at(kk, j0 + jj));
                    }
                    *slot = s;
                }
            } else {
                for kk in 0..sp.k {
                    let av = ap.ld::<T>(a_at(kk));
                    for (jj, slot) in acc.iter_mut().enumerate().take(w) {
                        *slot += av * bp.ld::<T>(b_at(kk, j0 + jj));
                    }
                }
            }
            for (jj, &sum) in acc.iter().enumerate().take(w) {
                finish::<C>(sp, bi, i, j0 + jj, sum, cp, bias);
            }
        }
        j0 += w;
    }
}
