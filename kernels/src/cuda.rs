//! The CUDA kernel registry: every `kernels/cuda/*.cu` is compiled by NVRTC once, for the
//! device's architecture, into a cubin cached on disk (key: source hash, architecture,
//! NVRTC version), loaded once, and its entry points are looked up by `(name, dtype)` in a
//! fixed table built at start-up. Nothing is compiled or searched per call.

use crate::error::{Error, Result};
use crate::{DType, Tensor};
use frt_exec::cudarc::driver::{result as dr, sys};
use frt_exec::cudarc::nvrtc::sys as nv;
use frt_exec::{Ctx, Stream};
use std::collections::HashMap;
use std::ffi::{CString, c_char, c_void};
use std::path::PathBuf;

const COMMON: &str = include_str!("../cuda/common.cuh");

/// The CUDA C sources, one per op family.
pub(crate) const SOURCES: &[(&str, &str)] = &[
    ("elementwise.cu", include_str!("../cuda/elementwise.cu")),
    ("norm.cu", include_str!("../cuda/norm.cu")),
    ("rope.cu", include_str!("../cuda/rope.cu")),
    ("attention.cu", include_str!("../cuda/attention.cu")),
    ("conv.cu", include_str!("../cuda/conv.cu")),
    ("flash.cu", include_str!("../cuda/flash.cu")),
    ("mlp.cu", include_str!("../cuda/mlp.cu")),
    ("image.cu", include_str!("../cuda/image.cu")),
    ("fp8.cu", include_str!("../cuda/fp8.cu")),
];

/// How many CUDA C sources there are (`kernels/cuda/*.cu`): one cubin each.
pub const SOURCE_COUNT: usize = SOURCES.len();

/// How a launch's blocks are placed ([`CudaOps::launch_raw`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Grouping {
    /// As the scheduler finds room.
    Plain,
    /// A cooperative launch: the driver refuses it (an error, never a hang) unless every block
    /// of the grid can be resident at once, as a kernel whose blocks all wait for each other
    /// needs.
    Cooperative,
}

pub(crate) struct CudaOps {
    /// Keeps the primary context (and so the modules) alive.
    ctx: Ctx,
    funcs: HashMap<(&'static str, Option<DType>), sys::CUfunction>,
    pub arch: String,
    /// Streaming multiprocessors of the device (sizes split work such as attention's key splits).
    pub sms: u32,
    /// Most dynamic shared memory a block may opt into (bytes).
    pub max_shared: u32,
    /// The compute capability's major number (programmatic dependent launch from 9).
    major: i32,
    /// cuBLASLt workspace of each stream that ran a GEMM outside a capture.
    workspaces: std::sync::Mutex<Vec<(Stream, frt_exec::Buffer)>>,
    /// cuBLASLt workspace of each graph with a GEMM, by graph id; held by the graph's
    /// variants (retained at capture), so it goes with them.
    graph_workspaces: std::sync::Mutex<Vec<(u64, frt_exec::WeakBuffer)>>,
    /// The stream GEMM plans time their candidate algorithms on (made on first use).
    tuning: std::sync::OnceLock<Stream>,
    /// The algorithm chosen for each GEMM specification so far: a shape planned again (for
    /// another layer, or inside a capture) gets the same algorithm without timing again.
    /// (With the workspace bytes it uses.)
    pub(crate) tuned: std::sync::Mutex<
        HashMap<
            crate::ops::gemm::TuneKey,
            (frt_exec::cudarc::cublaslt::sys::cublasLtMatmulAlgo_t, usize),
        >,
    >,
    /// Tuning results of earlier processes on this device, driver and cuBLASLt (see
    /// [`TuningCache`]).
    pub(crate) tuning_cache: TuningCache,
}

/// GEMM tuning results on disk, next to the compiled kernels: one file per device, driver and
/// cuBLASLt version (`gemm-tuning-<key>.txt`), one line per GEMM specification (its
/// description, the algorithm's 64 bytes, the workspace bytes, a checksum). Lines that do
/// not parse or whose checksum fails are ignored (the GEMM is tuned again and a new line
/// appended); a cached algorithm is checked by cuBLASLt for its GEMM before use. Best effort:
/// an unwritable folder only costs the tuning next time.
pub(crate) struct TuningCache {
    path: Option<PathBuf>,
    entries: std::sync::Mutex<HashMap<String, ([u64; 8], usize)>>,
}

impl TuningCache {
    fn line_sum(spec: &str, algo: &[u64; 8], ws: usize) -> u64 {
        let words: Vec<String> = algo.iter().map(|w| format!("{w:016x}")).collect();
        fnv1a(&[spec, &words.join(" "), &ws.to_string()])
    }

    /// Opens (reads) the cache of one device, driver and cuBLASLt version.
    pub(crate) fn open(path: Option<PathBuf>) -> TuningCache {
        let mut entries = HashMap::new();
        if let Some(text) = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
            for line in text.lines() {
                if let Some((spec, e)) = Self::parse(line) {
                    entries.insert(spec, e);
                }
            }
        }
        TuningCache {
            path,
            entries: std::sync::Mutex::new(entries),
        }
    }

    fn parse(line: &str) -> Option<(String, ([u64; 8], usize))> {
        let mut f = line.split('\t');
        let (spec, words, ws, sum) = (f.next()?, f.next()?, f.next()?, f.next()?);
        if f.next().is_some() {
            return None;
        }
        let mut algo = [0u64; 8];
        let mut n = 0;
        for (a, w) in algo.iter_mut().zip(words.split(' ')) {
            *a = u64::from_str_radix(w, 16).ok()?;
            n += 1;
        }
        let ws: usize = ws.parse().ok()?;
        let sum = u64::from_str_radix(sum, 16).ok()?;
        (n == 8 && words.split(' ').count() == 8 && sum == Self::line_sum(spec, &algo, ws))
            .then(|| (spec.to_string(), (algo, ws)))
    }

    pub(crate) fn get(&self, spec: &str) -> Option<([u64; 8], usize)> {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(spec)
            .copied()
    }

    /// Records a tuning result (in memory, and appended to the file).
    pub(crate) fn put(&self, spec: &str, algo: [u64; 8], ws: usize) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(spec.to_string(), (algo, ws));
        let Some(path) = &self.path else { return };
        let words: Vec<String> = algo.iter().map(|w| format!("{w:016x}")).collect();
        let line = format!(
            "{spec}\t{}\t{ws}\t{:016x}\n",
            words.join(" "),
            Self::line_sum(spec, &algo, ws)
        );
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        // One write of one line to a file opened for appending: whole lines, even with
        // several processes tuning at once.
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

// SAFETY: CUfunction handles may be used from any thread; the table is immutable.
unsafe impl Send for CudaOps {}
// SAFETY: as above.
unsafe impl Sync for CudaOps {}

fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain([0xff]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Where compiled kernels are cached: `$FRT_KERNEL_CACHE`, else `$XDG_CACHE_HOME/frt/kernels`,
/// else `~/.cache/frt/kernels`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FRT_KERNEL_CACHE") {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(p).join("frt/kernels"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/frt/kernels"))
}

fn nvrtc(call: &'static str, r: nv::nvrtcResult) -> Result<()> {
    if r == nv::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::Nvrtc {
            call,
            status: r as i32,
        })
    }
}

/// NVRTC's log of `prog` (empty when it has none).
///
/// # Safety
/// `prog` is a live program that was compiled.
unsafe fn program_log(prog: nv::nvrtcProgram) -> String {
    let mut n = 0usize;
    // SAFETY: `prog` is live (the caller's promise); the buffer is sized from NVRTC's answer.
    unsafe {
        nv::nvrtcGetProgramLogSize(prog, &mut n);
        let mut buf = vec![0u8; n.max(1)];
        nv::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char);
        String::from_utf8_lossy(&buf)
            .trim_end_matches('\0')
            .trim()
            .to_string()
    }
}

/// Compiles one source for `arch`: its cubin and NVRTC's log (ptxas's notes, e.g. where it
/// serializes `wgmma`s; empty when it has none). `verbose`: ptxas also reports each kernel's
/// registers, spills and shared memory (the cubin is the same).
fn compile(
    file: &'static str,
    source: &str,
    arch: &str,
    verbose: bool,
) -> Result<(Vec<u8>, String)> {
    let src = CString::new(source).expect("sources have no NUL");
    let name = CString::new(file).expect("file names have no NUL");
    let opts: Vec<CString> = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "-default-device".into(),
    ]
    .into_iter()
    .chain(verbose.then(|| "--ptxas-options=-v".to_string()))
    .map(|o| CString::new(o).unwrap())
    .collect();
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog = std::ptr::null_mut();
    // SAFETY: valid NUL-terminated strings; no headers.
    nvrtc("nvrtcCreateProgram", unsafe {
        nv::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    })?;
    // SAFETY: `prog` was created above; option pointers live across the call.
    let compiled =
        unsafe { nv::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    // SAFETY: `prog` is live and compiled (successfully or not).
    let log = unsafe { program_log(prog) };
    let result = if compiled != nv::nvrtcResult::NVRTC_SUCCESS {
        Err(Error::Compile {
            file,
            arch: arch.to_string(),
            log,
        })
    } else {
        let mut n = 0usize;
        // SAFETY: `prog` compiled; the buffer is sized from the driver's answer.
        unsafe {
            nvrtc("nvrtcGetCUBINSize", nv::nvrtcGetCUBINSize(prog, &mut n)).and_then(|_| {
                let mut cubin = vec![0u8; n];
                nvrtc(
                    "nvrtcGetCUBIN",
                    nv::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char),
                )
                .map(|_| (cubin, log))
            })
        }
    };
    // SAFETY: destroyed once.
    unsafe { nv::nvrtcDestroyProgram(&mut prog) };
    result
}

/// One source compiled by [`compile_for`]: its file, its cubin's size and NVRTC's log.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub file: &'static str,
    pub bytes: usize,
    /// NVRTC's log of a successful compile: warnings and ptxas's notes, with its report of
    /// every kernel ([`kernel_resources`]).
    pub log: String,
}

/// What ptxas reports of one kernel ([`kernel_resources`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelResources {
    pub name: String,
    /// Registers a thread.
    pub registers: u32,
    /// Bytes a thread spills to local memory (stores).
    pub spill_stores: u32,
}

/// Each kernel's registers and spills as a verbose ptxas log of one source states them
/// (`Compiling entry function 'k'`, then `N bytes spill stores` and `Used N registers`).
pub fn kernel_resources(log: &str) -> Vec<KernelResources> {
    let number_before = |line: &str, what: &str| -> Option<u32> {
        let head = &line[..line.find(what)?];
        head.split(|c: char| !c.is_ascii_digit())
            .rfind(|w| !w.is_empty())?
            .parse()
            .ok()
    };
    let mut out: Vec<KernelResources> = Vec::new();
    let mut current: Option<KernelResources> = None;
    for line in log.lines() {
        if let Some(i) = line.find("Compiling entry function '") {
            let rest = &line[i + "Compiling entry function '".len()..];
            out.extend(current.take());
            current = rest.split('\'').next().map(|n| KernelResources {
                name: n.to_string(),
                registers: 0,
                spill_stores: 0,
            });
        } else if let Some(k) = current.as_mut() {
            if let Some(n) = number_before(line, "bytes spill stores") {
                k.spill_stores = n;
            }
            if let Some(n) = number_before(line, "registers") {
                k.registers = n;
            }
        }
    }
    out.extend(current);
    out
}

/// Compiles every kernel source for `arch` (e.g. `sm_110`, Jetson AGX Thor) with this
/// machine's NVRTC, bypassing the disk cache and needing no device: checks that the kernels
/// build for GPUs that are not at hand. Returns each source file with the size of its cubin
/// and its log, or the first compile error (naming the file, the architecture and NVRTC's log).
pub fn compile_for(arch: &str) -> Result<Vec<Compiled>> {
    SOURCES
        .iter()
        .map(|&(file, source)| {
            let (bin, log) = compile(file, &format!("{COMMON}\n{source}"), arch, true)?;
            Ok(Compiled {
                file,
                bytes: bin.len(),
                log,
            })
        })
        .collect()
}

/// The device's name, the driver's version and cuBLASLt's version: what a GEMM tuning result
/// holds for.
fn device_identity(cu: &frt_exec::cudarc::driver::CudaContext) -> String {
    let name = cu.name().unwrap_or_default();
    let mut driver = 0;
    // SAFETY: a valid out pointer.
    let _ = unsafe { sys::cuDriverGetVersion(&mut driver) };
    // SAFETY: no arguments; reads the loaded library's version.
    let lt = unsafe { frt_exec::cudarc::cublaslt::sys::cublasLtGetVersion() };
    format!("{name} driver {driver} cublasLt {lt}")
}

/// The cache file of one source for one architecture and NVRTC version.
fn cache_path(file: &str, full: &str, arch: &str, nvrtc_version: &str) -> Option<PathBuf> {
    let key = fnv1a(&[full, arch, nvrtc_version]);
    cache_dir().map(|d| {
        d.join(format!(
            "{}-{key:016x}-{arch}-nvrtc{nvrtc_version}.cubin",
            file.trim_end_matches(".cu")
        ))
    })
}

/// The cubin of one source: from the disk cache (unless `fresh`), or compiled and cached.
fn cubin(
    file: &'static str,
    source: &str,
    arch: &str,
    nvrtc_version: &str,
    fresh: bool,
) -> Result<Vec<u8>> {
    let full = format!("{COMMON}\n{source}");
    let path = cache_path(file, &full, arch, nvrtc_version);
    if let (Some(p), false) = (&path, fresh) {
        if let Ok(bytes) = std::fs::read(p) {
            if !bytes.is_empty() {
                return Ok(bytes);
            }
        }
    }
    let (bin, _) = compile(file, &full, arch, false)?;
    if let Some(p) = &path {
        // Best effort: a read-only cache directory only costs a compile next time.
        write_whole(p, &bin);
    }
    Ok(bin)
}

/// Writes `bytes` to `path` whole ([`frt_exec::write_whole`]), making its folder first. Best
/// effort; false when it did not happen.
fn write_whole(path: &std::path::Path, bytes: &[u8]) -> bool {
    path.parent()
        .is_some_and(|dir| std::fs::create_dir_all(dir).is_ok())
        && frt_exec::write_whole(path, bytes).is_ok()
}

/// The kernels of a loaded module and their (unmangled, `extern "C"`) names.
///
/// # Safety
/// `module` is a loaded module of the current context.
unsafe fn module_functions(module: sys::CUmodule) -> Result<Vec<(String, sys::CUfunction)>> {
    let drv = |call: &'static str, r: sys::CUresult| frt_exec::Error::Driver {
        call,
        code: frt_exec::DriverCode(r),
    };
    let mut n = 0u32;
    // SAFETY: valid out pointer; the module is loaded.
    let r = unsafe { sys::cuModuleGetFunctionCount(&mut n, module) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(drv("cuModuleGetFunctionCount", r).into());
    }
    let mut fs = vec![std::ptr::null_mut(); n as usize];
    // SAFETY: `fs` holds `n` slots.
    let r = unsafe { sys::cuModuleEnumerateFunctions(fs.as_mut_ptr(), n, module) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(drv("cuModuleEnumerateFunctions", r).into());
    }
    let mut out = Vec::with_capacity(fs.len());
    for f in fs {
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: `f` is a function of the module; the driver owns the returned string.
        let r = unsafe { sys::cuFuncGetName(&mut name, f) };
        if r != sys::CUresult::CUDA_SUCCESS || name.is_null() {
            return Err(drv("cuFuncGetName", r).into());
        }
        // SAFETY: a NUL-terminated string owned by the driver.
        out.push((
            unsafe { std::ffi::CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
            f,
        ));
    }
    Ok(out)
}

fn split_dtype(name: &str) -> (&str, Option<DType>) {
    for dt in [DType::F32, DType::BF16, DType::F16, DType::I32, DType::U8] {
        if let Some(base) = name.strip_suffix(&format!("_{}", dt.name())) {
            return (base, Some(dt));
        }
    }
    (name, None)
}

/// What NVRTC compiles for on a device of `arch`: Hopper (`sm_90`) as `sm_90a`, whose
/// architecture-specific instructions (`wgmma`) some kernels use where they are built for it;
/// every other architecture as itself.
pub fn nvrtc_target(arch: &str) -> String {
    match arch {
        "sm_90" => "sm_90a".into(),
        a => a.into(),
    }
}

impl CudaOps {
    /// The compute capability as one number (`sm_90` → 90).
    pub fn sm(&self) -> u32 {
        self.arch.trim_start_matches("sm_").parse().unwrap_or(0)
    }

    /// Whether the kernels were built with Hopper's `wgmma` (see [`nvrtc_target`]).
    pub fn has_wgmma(&self) -> bool {
        nvrtc_target(&self.arch) == "sm_90a"
    }

    pub fn load(ctx: &Ctx) -> Result<CudaOps> {
        let cu = ctx.cuda_context().expect("a CUDA context");
        ctx.bind_to_thread()?;
        let drv = |call: &'static str| {
            move |e: frt_exec::cudarc::driver::DriverError| frt_exec::Error::Driver {
                call,
                code: frt_exec::DriverCode(e.0),
            }
        };
        let (maj, min) = cu
            .compute_capability()
            .map_err(drv("cuDeviceGetAttribute"))?;
        let arch = format!("sm_{maj}{min}");
        let sms = cu
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("cuDeviceGetAttribute"))? as u32;
        let max_shared = cu
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(drv("cuDeviceGetAttribute"))? as u32;
        let (mut vmaj, mut vmin) = (0, 0);
        // SAFETY: valid out pointers.
        nvrtc("nvrtcVersion", unsafe {
            nv::nvrtcVersion(&mut vmaj, &mut vmin)
        })?;
        let nvrtc_version = format!("{vmaj}.{vmin}");
        let tuning_cache = TuningCache::open(cache_dir().map(|d| {
            d.join(format!(
                "gemm-tuning-{:016x}.txt",
                fnv1a(&[&device_identity(cu), &arch])
            ))
        }));
        let mut funcs = HashMap::new();
        let target = nvrtc_target(&arch);
        for &(file, source) in SOURCES {
            let bin = cubin(file, source, &target, &nvrtc_version, false)?;
            // SAFETY: a cubin for this device; the context is current; never unloaded (the
            // registry lives as long as its context).
            let module = match unsafe { dr::module::load_data(bin.as_ptr() as *const c_void) } {
                Ok(m) => m,
                // A damaged cache file: compile afresh (which also replaces the file).
                Err(_) => {
                    let bin = cubin(file, source, &target, &nvrtc_version, true)?;
                    // SAFETY: as above, a freshly compiled cubin.
                    unsafe { dr::module::load_data(bin.as_ptr() as *const c_void) }
                        .map_err(drv("cuModuleLoadData"))?
                }
            };
            // SAFETY: `module` was just loaded into the current context.
            for (name, f) in unsafe { module_functions(module)? } {
                let (base, dt) = split_dtype(&name);
                // Leaked once per kernel at start-up: the registry's keys are static.
                let base: &'static str = Box::leak(base.to_string().into_boxed_str());
                funcs.insert((base, dt), f);
            }
        }
        Ok(CudaOps {
            ctx: ctx.clone(),
            funcs,
            arch,
            sms,
            max_shared,
            major: maj,
            workspaces: Default::default(),
            graph_workspaces: Default::default(),
            tuning: Default::default(),
            tuned: Default::default(),
            tuning_cache,
        })
    }

    /// The GEMM workspace for work enqueued on `s`: inside a capture, the workspace of the
    /// graph being captured (its variants run one at a time, while graphs of other models
    /// may replay on other streams at the same moment, so no two graphs share one); outside,
    /// the stream's own (GEMMs on one stream run one after another).
    pub fn workspace(&self, ctx: &Ctx, s: Stream) -> Result<frt_exec::Buffer> {
        let alloc = || frt_exec::Buffer::alloc(ctx, "gemm.workspace", crate::ops::gemm::WORKSPACE);
        if let Some(graph) = ctx.capturing_graph(s) {
            let mut w = self
                .graph_workspaces
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            // Graphs whose variants are all gone freed theirs.
            w.retain(|(_, b)| b.is_alive());
            if let Some(b) = w
                .iter()
                .find(|(g, _)| *g == graph)
                .and_then(|(_, b)| b.upgrade())
            {
                return Ok(b);
            }
            let b = alloc()?;
            w.push((graph, b.downgrade()));
            return Ok(b);
        }
        let mut w = self.workspaces.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, b)) = w.iter().find(|(st, _)| *st == s) {
            return Ok(b.clone());
        }
        let b = alloc()?;
        w.push((s, b.clone()));
        Ok(b)
    }

    /// The stream GEMM planning times candidate algorithms on.
    pub fn tuning_stream(&self, ctx: &Ctx) -> Result<Stream> {
        if let Some(s) = self.tuning.get() {
            return Ok(*s);
        }
        let s = ctx.stream(0)?;
        Ok(*self.tuning.get_or_init(|| s))
    }

    /// The registers a thread of kernel `name_{dtype}` takes (as loaded on this device).
    pub fn registers(&self, name: &'static str, dt: Option<DType>) -> Result<u32> {
        let f = self.func(name, dt)?;
        self.ctx.bind_to_thread()?;
        let mut n = 0i32;
        // SAFETY: `f` is a loaded function of this context; `n` outlives the call.
        let r = unsafe {
            sys::cuFuncGetAttribute(
                &mut n,
                sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_NUM_REGS,
                f,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(frt_exec::Error::Driver {
                call: "cuFuncGetAttribute",
                code: frt_exec::DriverCode(r),
            }
            .into());
        }
        Ok(n as u32)
    }

    fn func(&self, name: &'static str, dt: Option<DType>) -> Result<sys::CUfunction> {
        self.funcs
            .get(&(name, dt))
            .copied()
            .ok_or(Error::MissingKernel {
                name,
                dtype: dt.map_or("", |d| d.name()),
            })
    }

    /// Launches `name_{dtype}` (or `name` for `None`) on `s` with `params` in the kernel's
    /// order. Device memory reaches a kernel only as a [`Param::Mem`] of the tensor it lies
    /// in: the launch checks the address is inside that tensor's buffer and retains the
    /// buffer for a capture in progress on `s`, so a captured graph keeps alive everything
    /// its kernels touch.
    ///
    /// # Safety
    /// `params` match the kernel's signature (count, types, order), and the kernel touches
    /// each tensor only within the bounds the op checked.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch(
        &self,
        s: Stream,
        name: &'static str,
        dt: Option<DType>,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
        params: &[Param],
    ) -> Result<()> {
        if params.len() > MAX_PARAMS {
            return Err(Error::shape(
                name,
                format!("{} kernel parameters (at most {MAX_PARAMS})", params.len()),
            ));
        }
        // Each parameter's value, in an 8-byte slot (4-byte values in its first bytes: the
        // kernel reads its own size from the slot's start; little-endian).
        let mut slots = [0u64; MAX_PARAMS];
        for (slot, p) in slots.iter_mut().zip(params) {
            *slot = match *p {
                Param::Mem(t, addr) => {
                    let b = t.buffer();
                    let (lo, hi) = (b.ptr(), b.ptr() + b.bytes() as u64);
                    if !(lo..hi).contains(&addr) {
                        return Err(Error::shape(
                            name,
                            format!("address {addr:#x} is outside the buffer of {t:?}"),
                        ));
                    }
                    self.ctx.retain(s, b);
                    addr
                }
                Param::Null => 0,
                Param::U32(v) => v as u64,
                Param::I32(v) => v as u32 as u64,
                Param::F32(v) => v.to_bits() as u64,
                Param::U64(v) => v,
            };
        }
        let mut ptrs = [std::ptr::null_mut::<c_void>(); MAX_PARAMS];
        for (p, slot) in ptrs.iter_mut().zip(slots.iter_mut()) {
            *p = slot as *mut u64 as *mut c_void;
        }
        // SAFETY: the caller's contract; `ptrs` point into `slots`, alive through the call.
        unsafe {
            self.launch_raw(
                s,
                name,
                dt,
                grid,
                block,
                shared,
                &mut ptrs[..params.len()],
                false,
                Grouping::Plain,
            )
        }
    }

    /// [`launch`](Self::launch) with a parameter array built by the caller; for kernels that
    /// take a struct by value, whose caller retains what the struct points to. `dependent`:
    /// launched with programmatic stream serialization (sm_90 and later; elsewhere a plain
    /// launch), so that it may start while the kernel before it in the stream still runs, once
    /// that kernel has executed `griddepcontrol.launch_dependents` (`pdl_trigger` in
    /// `cuda/common.cuh`). `grouping`: how the blocks are placed (see [`Grouping`]).
    ///
    /// # Safety
    /// `params` match the kernel's signature and every pointer in them is a live device
    /// address the kernel may touch within the bounds the op checked, retained for a capture.
    /// With `dependent`, the kernel executes `griddepcontrol.wait` (`pdl_wait`) before it
    /// reads anything an earlier kernel writes and before it writes anything (before it, it
    /// may only read what no kernel writes, e.g. weights).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_raw(
        &self,
        s: Stream,
        name: &'static str,
        dt: Option<DType>,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
        params: &mut [*mut c_void],
        dependent: bool,
        grouping: Grouping,
    ) -> Result<()> {
        let f = self.func(name, dt)?;
        self.ctx.bind_to_thread()?;
        if shared > 48 * 1024 {
            // More than the default dynamic shared memory is an opt-in per function (the
            // device's limit is checked by the launch itself).
            // SAFETY: `f` is a loaded function of this context.
            unsafe {
                dr::function::set_function_attribute(
                    f,
                    sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared as i32,
                )
            }
            .map_err(|e| frt_exec::Error::Driver {
                call: "cuFuncSetAttribute",
                code: frt_exec::DriverCode(e.0),
            })?;
        }
        let raw = self.ctx.raw_stream(s)? as sys::CUstream;
        let dependent = dependent && self.major >= 9;
        if !dependent && grouping == Grouping::Plain {
            // SAFETY: the caller's contract.
            return unsafe { dr::launch_kernel(f, grid, block, shared, raw, params) }.map_err(
                |e| {
                    frt_exec::Error::Driver {
                        call: "cuLaunchKernel",
                        code: frt_exec::DriverCode(e.0),
                    }
                    .into()
                },
            );
        }
        use sys::CUlaunchAttributeID as Id;
        // SAFETY: a plain-data C struct (with a union); zeroes are a valid value.
        let none: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        // The attributes asked for, in a fixed array (no allocation per launch).
        let mut attrs = [none, none];
        let mut used = 0;
        let mut push = |id, value: sys::CUlaunchAttributeValue| {
            attrs[used] = sys::CUlaunchAttribute {
                id,
                pad: [0; 4],
                value,
            };
            used += 1;
        };
        if dependent {
            let mut v = none.value;
            v.programmaticStreamSerializationAllowed = 1;
            push(Id::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, v);
        }
        match grouping {
            Grouping::Plain => {}
            Grouping::Cooperative => {
                let mut v = none.value;
                v.cooperative = 1;
                push(Id::CU_LAUNCH_ATTRIBUTE_COOPERATIVE, v);
            }
        }
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: shared,
            hStream: raw,
            attrs: attrs.as_mut_ptr(),
            numAttrs: used as u32,
        };
        // SAFETY: the caller's contract; `config` and its attribute outlive the call.
        let r =
            unsafe { sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(frt_exec::Error::Driver {
                call: "cuLaunchKernelEx",
                code: frt_exec::DriverCode(r),
            }
            .into());
        }
        Ok(())
    }
}

/// Most parameters a kernel launched through [`CudaOps::launch`] takes.
pub(crate) const MAX_PARAMS: usize = 24;

/// One kernel parameter (see [`CudaOps::launch`]).
#[derive(Clone, Copy)]
pub(crate) enum Param<'a> {
    /// A device address inside the tensor's buffer.
    Mem(&'a Tensor, u64),
    /// A null pointer (an absent optional tensor).
    Null,
    U32(u32),
    I32(i32),
    F32(f32),
    U64(u64),
}

impl<'a> Param<'a> {
    /// The tensor's first element.
    pub(crate) fn of(t: &'a Tensor) -> Param<'a> {
        Param::Mem(t, t.ptr())
    }
    /// An optional tensor's first element, or null.
    pub(crate) fn opt(t: Option<&'a Tensor>) -> Param<'a> {
        t.map_or(Param::Null, Param::of)
    }
}

impl From<u32> for Param<'_> {
    fn from(v: u32) -> Self {
        Param::U32(v)
    }
}
impl From<i32> for Param<'_> {
    fn from(v: i32) -> Self {
        Param::I32(v)
    }
}
impl From<f32> for Param<'_> {
    fn from(v: f32) -> Self {
        Param::F32(v)
    }
}
impl From<u64> for Param<'_> {
    fn from(v: u64) -> Self {
        Param::U64(v)
    }
}

/// Builds the parameter array of a kernel launch from local variables.
macro_rules! args {
    ($($v:expr),* $(,)?) => { [$( &mut $v as *mut _ as *mut std::ffi::c_void ),*] };
}
pub(crate) use args;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_split_into_op_and_dtype() {
        assert_eq!(
            split_dtype("rms_norm_bf16"),
            ("rms_norm", Some(DType::BF16))
        );
        assert_eq!(split_dtype("im2col"), ("im2col", None));
    }

    #[test]
    fn tuning_results_survive_on_disk_and_damaged_lines_are_ignored() {
        let dir = std::env::temp_dir().join(format!("frt-tuning-{}", std::process::id()));
        let path = dir.join("gemm-tuning-test.txt");
        let _ = std::fs::remove_dir_all(&dir);
        let algo = [1u64, 2, 3, 4, 5, 6, 7, u64::MAX];
        let c = TuningCache::open(Some(path.clone()));
        assert_eq!(c.get("gemm a"), None);
        c.put("gemm a", algo, 4096);
        c.put("gemm b", [9; 8], 0);
        // A new process reads them back.
        let c = TuningCache::open(Some(path.clone()));
        assert_eq!(c.get("gemm a"), Some((algo, 4096)));
        assert_eq!(c.get("gemm b"), Some(([9; 8], 0)));
        // A torn or altered line is ignored; the others stand.
        let text = std::fs::read_to_string(&path).unwrap();
        let altered = text.replacen("4096", "4097", 1);
        std::fs::write(&path, format!("{altered}gemm c\t00 01\n\u{0}garbage\n")).unwrap();
        let c = TuningCache::open(Some(path.clone()));
        assert_eq!(c.get("gemm a"), None, "checksum");
        assert_eq!(c.get("gemm b"), Some(([9; 8], 0)));
        assert_eq!(c.get("gemm c"), None);
        // No folder: in memory only.
        let c = TuningCache::open(None);
        c.put("x", algo, 1);
        assert_eq!(c.get("x"), Some((algo, 1)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
