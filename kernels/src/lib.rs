//! # frt-kernels — the op library
//!
//! Every op Pi0.5 and Whisper need, enqueued onto an exec [`Stream`], so it runs eagerly or
//! inside a graph capture on both backends:
//!
//! * **host** — f32 math (bf16/f16 storage converted on load and store), written to be
//!   obviously right; it is the oracle the CUDA implementation is tested against. Ops run as
//!   host operations on the stream (`Ctx::launch_host`); heavy ones (GEMM, attention) split
//!   rows over a fixed thread pool.
//! * **CUDA** — CUDA C in `kernels/cuda/*.cu`, compiled by NVRTC at start-up for the device's
//!   architecture and cached on disk ([`cuda_cache_dir`]); GEMMs through cuBLASLt.
//!
//! Ops check shapes and dtypes when they are enqueued and then neither allocate nor
//! synchronize: scratch space is the caller's, allocated at set-up.
//!
//! ```
//! use frt_exec::Ctx;
//! use frt_kernels::{DType, Kernels, Tensor};
//! let ctx = Ctx::host()?;
//! let k = Kernels::new(&ctx)?;
//! let s = ctx.stream(0)?;
//! let x = Tensor::alloc(&ctx, "x", DType::F32, &[2, 4])?;
//! let w = Tensor::alloc(&ctx, "w", DType::F32, &[4])?;
//! let y = Tensor::alloc(&ctx, "y", DType::F32, &[2, 4])?;
//! x.write_f32(s, &[1., 1., 1., 1., 2., -2., 2., -2.])?;
//! w.write_f32(s, &[0.; 4])?;
//! k.rms_norm(s, &x, &w, &y, 1e-6)?; // x / rms(x) * (1 + w)
//! let out = y.read_f32(s)?;
//! assert!((out[0] - 1.0).abs() < 1e-5 && (out[5] + 1.0).abs() < 1e-5);
//! # Ok::<(), frt_kernels::Error>(())
//! ```

mod cuda;
mod dtype;
mod error;
pub mod fp8;
mod ops;
pub mod options;
mod pool;
mod tensor;

pub use cuda::cache_dir as cuda_cache_dir;
pub use cuda::{
    Compiled as CudaCompiled, KernelResources as CudaKernelResources,
    SOURCE_COUNT as CUDA_SOURCE_COUNT, compile_for as cuda_compile_for,
    kernel_resources as cuda_kernel_resources, nvrtc_target,
};
pub use dtype::DType;
pub use error::{Error, Result};
pub use ops::attention::{AttentionMask, AttentionPlan, GEMM_MIN_KEYS, GEMM_MIN_QUERIES};
pub use ops::conv::{Conv1d, PatchEmbed};
pub use ops::flow::{EulerOut, VelocityEuler};
pub use ops::fp8::{FP8_ROWS_MAX, Fp8Linear, Fp8Scaling, Fp8SplitLinear};
pub use ops::fp8_mlp::Fp8GegluLinear;
pub use ops::gemm::{Epilogue, Gemm, GemmOptions, SplitLinear};
pub use ops::image::Placement;
pub use ops::mlp::{GEGLU_LINEAR_MAX_ROWS, GegluLinear};
pub use ops::rope::RopeTable;
pub use options::{AttentionPath, KernelOptions};
pub use tensor::{MAX_RANK, Tensor};

use frt_exec::{BackendKind, Ctx, HostOpError, Stream};
use std::sync::Arc;

/// The op library bound to one context: on CUDA it holds the loaded kernel registry.
#[derive(Clone)]
pub struct Kernels {
    ctx: Ctx,
    cuda: Option<Arc<cuda::CudaOps>>,
    options: KernelOptions,
}

impl Kernels {
    /// Binds the ops to `ctx`; on CUDA this compiles (or loads from the disk cache) every
    /// kernel source once.
    pub fn new(ctx: &Ctx) -> Result<Kernels> {
        Kernels::with_options(ctx, KernelOptions::default())
    }

    /// [`new`](Self::new) with tunables other than the defaults (`memset_kernels` is set on
    /// `ctx`, for every graph captured in it from now on).
    pub fn with_options(ctx: &Ctx, options: KernelOptions) -> Result<Kernels> {
        ctx.set_memset_nodes_as_kernels(options.memset_kernels);
        let cuda = match ctx.backend() {
            BackendKind::Cuda { .. } => Some(Arc::new(cuda::CudaOps::load(ctx)?)),
            BackendKind::Host => None,
        };
        Ok(Kernels {
            ctx: ctx.clone(),
            cuda,
            options,
        })
    }

    /// The tunables these ops were bound with.
    pub fn options(&self) -> &KernelOptions {
        &self.options
    }

    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    /// `"host"` or the CUDA architecture the kernels were built for (e.g. `"sm_90"`).
    /// The registers a thread of kernel `name` (for `dt`, when the kernel has a version per
    /// dtype) takes on this device; `None` on the host backend. For benchmarks.
    pub fn kernel_registers(&self, name: &'static str, dt: Option<DType>) -> Result<Option<u32>> {
        self.cuda
            .as_ref()
            .map(|c| c.registers(name, dt))
            .transpose()
    }

    pub fn target(&self) -> String {
        self.cuda
            .as_ref()
            .map_or_else(|| "host".to_string(), |c| c.arch.clone())
    }

    /// Enqueues a host kernel; the tensors it reads and writes are captured by `f`.
    fn host(&self, s: Stream, f: impl Fn() + Send + Sync + 'static) -> Result<()> {
        Ok(self.ctx.launch_host(s, move || {
            f();
            Ok::<(), HostOpError>(())
        })?)
    }

    /// Tells a capture in progress on `s` that CUDA work uses these tensors' buffers.
    fn retain(&self, s: Stream, tensors: &[&Tensor]) {
        for t in tensors {
            self.ctx.retain(s, t.buffer());
        }
    }

    fn check_ctx(&self, op: &'static str, tensors: &[&Tensor]) -> Result<()> {
        for t in tensors {
            if !t.buffer().ctx().same(&self.ctx) {
                return Err(Error::shape(
                    op,
                    format!("{t:?} belongs to another context"),
                ));
            }
        }
        Ok(())
    }
}
