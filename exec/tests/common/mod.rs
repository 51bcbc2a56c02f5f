//! Test support: a few tiny kernels with a host and a CUDA implementation, and the macro that
//! instantiates one test body for both backends (CUDA instances are ignored in CI; run them
//! on a GPU machine with `cargo test -p frt-exec -- --ignored`).
#![allow(dead_code)]

use frt_exec::cudarc::driver::{result, sys};
use frt_exec::cudarc::nvrtc;
use frt_exec::{Buffer, Ctx, HostOpError, Result, Stream};
use std::ffi::{CString, c_void};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The kernels every backend test uses. All work on f32 buffers; `n` = bytes / 4.
pub trait Kernels: Send + Sync {
    /// `x[i] = v`
    fn fill(&self, ctx: &Ctx, s: Stream, x: &Buffer, v: f32) -> Result<()>;
    /// `x[i] = x[i] * a + b`
    fn axpb(&self, ctx: &Ctx, s: Stream, x: &Buffer, a: f32, b: f32) -> Result<()>;
    /// `dst[i] = src[i] + v`
    fn add_from(&self, ctx: &Ctx, s: Stream, dst: &Buffer, src: &Buffer, v: f32) -> Result<()>;
    /// Keeps the device busy for about `us` microseconds (the whole GPU on CUDA).
    fn spin(&self, ctx: &Ctx, s: Stream, us: u32) -> Result<()>;
}

pub struct Backend {
    pub ctx: Ctx,
    pub k: &'static dyn Kernels,
    pub name: &'static str,
}

pub fn host() -> Backend {
    static K: HostKernels = HostKernels;
    Backend {
        ctx: Ctx::host().expect("host context"),
        k: &K,
        name: "host",
    }
}

pub fn cuda() -> Backend {
    let ctx = Ctx::cuda(0).expect("CUDA device 0 (this test needs a CUDA GPU)");
    static K: OnceLock<CudaKernels> = OnceLock::new();
    let k = K.get_or_init(|| CudaKernels::load(&ctx));
    Backend {
        ctx,
        k,
        name: "cuda",
    }
}

/// Instantiates each listed `fn(&Backend)` as a host test and an ignored CUDA test.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        mod host {
            $( #[test] fn $name() { super::$name(&$crate::common::host()) } )*
        }
        /// `cargo test -p frt-exec --test contract -- --ignored` on a machine with a GPU.
        mod cuda {
            $( #[test] #[ignore = "needs a CUDA GPU"] fn $name() { super::$name(&$crate::common::cuda()) } )*
        }
    };
}

fn elems(b: &Buffer) -> usize {
    b.bytes() / 4
}

// ---------------------------------------------------------------- host

pub struct HostKernels;

/// Host address of a buffer's f32 data, for a host operation. The graph or the operation
/// keeps the buffer alive; stream order excludes races.
fn host_f32(b: &Buffer) -> (usize, usize) {
    (b.ptr() as usize, elems(b))
}

impl Kernels for HostKernels {
    fn fill(&self, ctx: &Ctx, s: Stream, x: &Buffer, v: f32) -> Result<()> {
        let (p, n) = host_f32(x);
        let keep = x.clone();
        ctx.retain(s, x);
        ctx.launch_host(s, move || {
            let _ = &keep;
            // SAFETY: see `host_f32`.
            unsafe { std::slice::from_raw_parts_mut(p as *mut f32, n) }.fill(v);
            Ok(())
        })
    }

    fn axpb(&self, ctx: &Ctx, s: Stream, x: &Buffer, a: f32, b: f32) -> Result<()> {
        let (p, n) = host_f32(x);
        let keep = x.clone();
        ctx.launch_host(s, move || {
            let _ = &keep;
            // SAFETY: see `host_f32`.
            for e in unsafe { std::slice::from_raw_parts_mut(p as *mut f32, n) } {
                *e = *e * a + b;
            }
            Ok(())
        })
    }

    fn add_from(&self, ctx: &Ctx, s: Stream, dst: &Buffer, src: &Buffer, v: f32) -> Result<()> {
        if elems(dst) != elems(src) {
            return Err(frt_exec::Error::Invalid {
                op: "add_from",
                reason: "length mismatch".into(),
            });
        }
        let (d, n) = host_f32(dst);
        let (sp, _) = host_f32(src);
        let keep = (dst.clone(), src.clone());
        ctx.launch_host(s, move || {
            let _ = &keep;
            for i in 0..n {
                // SAFETY: see `host_f32`; `i < n` for both.
                unsafe { *(d as *mut f32).add(i) = *(sp as *const f32).add(i) + v };
            }
            Ok(())
        })
    }

    fn spin(&self, ctx: &Ctx, s: Stream, us: u32) -> Result<()> {
        ctx.launch_host(s, move || {
            let end = Instant::now() + Duration::from_micros(us as u64);
            while Instant::now() < end {
                std::hint::spin_loop();
            }
            Ok::<(), HostOpError>(())
        })
    }
}

// ---------------------------------------------------------------- cuda

const CUDA_SRC: &str = r#"
extern "C" __global__ void fill_f32(float* x, unsigned n, float v) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}
extern "C" __global__ void axpb_f32(float* x, unsigned n, float a, float b) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a + b;
}
extern "C" __global__ void add_from_f32(float* dst, const float* src, unsigned n, float v) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i] + v;
}
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    unsigned long long now = start;
    while (now - start < ns) { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); }
}
"#;

pub struct CudaKernels {
    /// The module lives in the device's primary context, which is destroyed when the last
    /// context using it goes; this handle keeps it (and the function handles) valid.
    _ctx: Ctx,
    fill: sys::CUfunction,
    axpb: sys::CUfunction,
    add_from: sys::CUfunction,
    spin: sys::CUfunction,
    sms: u32,
}

// SAFETY: CUfunction handles are usable from any thread of the process.
unsafe impl Send for CudaKernels {}
// SAFETY: as above; the struct is immutable after loading.
unsafe impl Sync for CudaKernels {}

/// Loads the test kernels' module once more into `ctx`'s CUDA context (compiled once per
/// process), as a process that builds another model does; it is never unloaded.
pub fn load_module_again(ctx: &Ctx) {
    static PTX: OnceLock<CString> = OnceLock::new();
    let src = PTX.get_or_init(|| {
        let ptx = nvrtc::compile_ptx(CUDA_SRC).expect("NVRTC compiles the test kernels");
        CString::new(ptx.to_src()).unwrap()
    });
    ctx.bind_to_thread().unwrap();
    // SAFETY: `src` is NUL-terminated PTX; the context is current.
    unsafe { result::module::load_data(src.as_ptr() as *const c_void) }.expect("load PTX");
}

impl CudaKernels {
    pub fn load(ctx: &Ctx) -> CudaKernels {
        ctx.bind_to_thread().unwrap();
        let ptx = nvrtc::compile_ptx(CUDA_SRC).expect("NVRTC compiles the test kernels");
        let src = CString::new(ptx.to_src()).unwrap();
        // SAFETY: `src` is NUL-terminated PTX; the context is current.
        let module =
            unsafe { result::module::load_data(src.as_ptr() as *const c_void) }.expect("load PTX");
        let get = |name: &str| {
            let n = CString::new(name).unwrap();
            // SAFETY: `module` is loaded and never unloaded (process lifetime).
            unsafe { result::module::get_function(module, n) }.expect("kernel in module")
        };
        let sms = ctx
            .cuda_context()
            .unwrap()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap();
        CudaKernels {
            _ctx: ctx.clone(),
            fill: get("fill_f32"),
            axpb: get("axpb_f32"),
            add_from: get("add_from_f32"),
            spin: get("spin"),
            sms: sms as u32,
        }
    }

    fn launch(
        &self,
        ctx: &Ctx,
        s: Stream,
        f: sys::CUfunction,
        n: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        ctx.bind_to_thread()?;
        let raw = ctx.raw_stream(s)? as sys::CUstream;
        let grid = n.div_ceil(256).max(1);
        // SAFETY: every kernel checks `i < n`; the pointers are live buffers the caller
        // retained; the parameters match the kernel's signature.
        unsafe { result::launch_kernel(f, (grid, 1, 1), (256, 1, 1), 0, raw, params) }.map_err(
            |e| frt_exec::Error::Driver {
                call: "cuLaunchKernel",
                code: frt_exec::DriverCode(e.0),
            },
        )
    }
}

impl Kernels for CudaKernels {
    fn fill(&self, ctx: &Ctx, s: Stream, x: &Buffer, v: f32) -> Result<()> {
        ctx.retain(s, x);
        let (mut p, mut n, mut v) = (x.ptr(), elems(x) as u32, v);
        self.launch(
            ctx,
            s,
            self.fill,
            n,
            &mut [
                &mut p as *mut _ as _,
                &mut n as *mut _ as _,
                &mut v as *mut _ as _,
            ],
        )
    }

    fn axpb(&self, ctx: &Ctx, s: Stream, x: &Buffer, a: f32, b: f32) -> Result<()> {
        ctx.retain(s, x);
        let (mut p, mut n, mut a, mut b) = (x.ptr(), elems(x) as u32, a, b);
        self.launch(
            ctx,
            s,
            self.axpb,
            n,
            &mut [
                &mut p as *mut _ as _,
                &mut n as *mut _ as _,
                &mut a as *mut _ as _,
                &mut b as *mut _ as _,
            ],
        )
    }

    fn add_from(&self, ctx: &Ctx, s: Stream, dst: &Buffer, src: &Buffer, v: f32) -> Result<()> {
        if elems(dst) != elems(src) {
            return Err(frt_exec::Error::Invalid {
                op: "add_from",
                reason: "length mismatch".into(),
            });
        }
        ctx.retain(s, dst);
        ctx.retain(s, src);
        let (mut d, mut sp, mut n, mut v) = (dst.ptr(), src.ptr(), elems(dst) as u32, v);
        self.launch(
            ctx,
            s,
            self.add_from,
            n,
            &mut [
                &mut d as *mut _ as _,
                &mut sp as *mut _ as _,
                &mut n as *mut _ as _,
                &mut v as *mut _ as _,
            ],
        )
    }

    fn spin(&self, ctx: &Ctx, s: Stream, us: u32) -> Result<()> {
        let mut ns = us as u64 * 1000;
        // Two blocks of 1024 threads per SM: the kernel fills the GPU, so work of another
        // stream can only start when its blocks retire.
        let blocks = self.sms * 2;
        ctx.bind_to_thread()?;
        let raw = ctx.raw_stream(s)? as sys::CUstream;
        // SAFETY: `spin` takes one u64 and touches no memory.
        unsafe {
            result::launch_kernel(
                self.spin,
                (blocks, 1, 1),
                (1024, 1, 1),
                0,
                raw,
                &mut [&mut ns as *mut _ as _],
            )
        }
        .map_err(|e| frt_exec::Error::Driver {
            call: "cuLaunchKernel",
            code: frt_exec::DriverCode(e.0),
        })
    }
}
