//! The CUDA backend: cudarc's driver API, loaded at run time (the crate builds on machines
//! without CUDA). cudarc's automatic per-allocation event tracking is switched off: `exec`
//! orders work explicitly with streams and events, and the tracking would break multi-stream
//! capture (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`).

use super::memset_nodes::MemsetNodes;
use crate::error::{Error, Result, check};
use cudarc::driver::CudaContext;
use cudarc::driver::sys::{self, CUevent, CUgraphExec, CUstream};
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

pub(crate) struct CudaDevice {
    pub cu: Arc<CudaContext>,
    pub ordinal: usize,
    /// (least, greatest) stream priority, as the driver reports it (e.g. (0, -5)).
    pub priority_range: (i32, i32),
    /// Captured graphs' memset nodes become kernel nodes (`memset_nodes`).
    pub memsets: MemsetNodes,
}

/// Whether a CUDA driver library can be loaded and reports at least one device.
pub(crate) fn device_count() -> Result<usize> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::NoCuda {
            reason: "libcuda.so could not be loaded".into(),
        });
    }
    // SAFETY: the library is present (checked above); cuInit may be called repeatedly.
    check("cuInit", unsafe { sys::cuInit(0) }).map_err(|e| Error::NoCuda {
        reason: e.to_string(),
    })?;
    let mut n = 0;
    // SAFETY: the driver is initialized; `n` is a valid out pointer.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
    Ok(n as usize)
}

impl CudaDevice {
    pub fn new(ordinal: usize) -> Result<Self> {
        let n = device_count()?;
        if ordinal >= n {
            return Err(Error::NoCuda {
                reason: format!("device {ordinal} requested, {n} present"),
            });
        }
        let cu = CudaContext::new(ordinal).map_err(|e| Error::Driver {
            call: "cuDevicePrimaryCtxRetain",
            code: crate::error::DriverCode(e.0),
        })?;
        // SAFETY: called before this context allocates anything through cudarc; exec never
        // relies on cudarc's implicit synchronization.
        unsafe { cu.disable_event_tracking() };
        let dev = CudaDevice {
            cu,
            ordinal,
            priority_range: (0, 0),
            memsets: MemsetNodes::default(),
        };
        dev.bind()?;
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: valid out pointers; the context is current.
        check("cuCtxGetStreamPriorityRange", unsafe {
            sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest)
        })?;
        Ok(CudaDevice {
            priority_range: (least, greatest),
            ..dev
        })
    }

    /// Makes the context current on the calling thread (a no-op when it already is).
    #[inline]
    pub fn bind(&self) -> Result<()> {
        self.cu.bind_to_thread().map_err(|e| Error::Driver {
            call: "cuCtxSetCurrent",
            code: crate::error::DriverCode(e.0),
        })
    }

    pub fn create_stream(&self, priority: i32) -> Result<CUstream> {
        self.bind()?;
        let mut s = ptr::null_mut();
        // SAFETY: valid out pointer; the context is current.
        check("cuStreamCreateWithPriority", unsafe {
            sys::cuStreamCreateWithPriority(
                &mut s,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                priority,
            )
        })?;
        Ok(s)
    }

    pub fn stream_priority(&self, s: CUstream) -> Result<i32> {
        let mut p = 0;
        // SAFETY: `s` is a live stream of this context (caller's invariant); valid out pointer.
        check("cuStreamGetPriority", unsafe {
            sys::cuStreamGetPriority(s, &mut p)
        })?;
        Ok(p)
    }

    /// # Safety
    /// `s` was created by `create_stream` and is not used afterwards.
    pub unsafe fn destroy_stream(&self, s: CUstream) -> Result<()> {
        self.bind()?;
        check("cuStreamDestroy", unsafe { sys::cuStreamDestroy_v2(s) })
    }

    pub fn sync_stream(&self, s: CUstream) -> Result<()> {
        self.bind()?;
        // SAFETY: `s` is a live stream of this context or the null stream.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(s)
        })
    }

    pub fn alloc(&self, bytes: usize) -> Result<u64, sys::CUresult> {
        self.bind()
            .map_err(|_| sys::CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        let mut p = 0;
        // SAFETY: valid out pointer; the context is current.
        let r = unsafe { sys::cuMemAlloc_v2(&mut p, bytes) };
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(p)
        } else {
            Err(r)
        }
    }

    /// # Safety
    /// `p` came from `alloc` and no work that uses it is pending.
    pub unsafe fn free(&self, p: u64) -> Result<()> {
        self.bind()?;
        check("cuMemFree", unsafe { sys::cuMemFree_v2(p) })
    }

    pub fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8, sys::CUresult> {
        self.bind()
            .map_err(|_| sys::CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        let mut p = ptr::null_mut();
        // SAFETY: valid out pointer; flags 0 = portable-less page-locked memory.
        let r = unsafe { sys::cuMemHostAlloc(&mut p, bytes, 0) };
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(p as *mut u8)
        } else {
            Err(r)
        }
    }

    /// # Safety
    /// `p` came from `alloc_pinned` and no copy that uses it is pending.
    pub unsafe fn free_pinned(&self, p: *mut u8) -> Result<()> {
        self.bind()?;
        check("cuMemFreeHost", unsafe {
            sys::cuMemFreeHost(p as *mut c_void)
        })
    }

    /// # Safety
    /// Both ranges lie inside live device allocations; `s` is a live stream.
    pub unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize, s: CUstream) -> Result<()> {
        self.bind()?;
        check("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, s)
        })
    }

    /// # Safety
    /// `src` is pinned host memory of `bytes` that stays untouched until the copy completes.
    pub unsafe fn copy_htod(
        &self,
        dst: u64,
        src: *const u8,
        bytes: usize,
        s: CUstream,
    ) -> Result<()> {
        self.bind()?;
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, bytes, s)
        })
    }

    /// # Safety
    /// `dst` is pinned host memory of `bytes`, not read until the copy completes.
    pub unsafe fn copy_dtoh(
        &self,
        dst: *mut u8,
        src: u64,
        bytes: usize,
        s: CUstream,
    ) -> Result<()> {
        self.bind()?;
        check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, bytes, s)
        })
    }

    pub fn event_create(&self, timing: bool) -> Result<CUevent> {
        self.bind()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let mut e = ptr::null_mut();
        // SAFETY: valid out pointer; the context is current.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut e, flags as u32)
        })?;
        Ok(e)
    }

    /// # Safety
    /// `e` came from `event_create`; nothing uses it afterwards.
    pub unsafe fn event_destroy(&self, e: CUevent) -> Result<()> {
        self.bind()?;
        check("cuEventDestroy", unsafe { sys::cuEventDestroy_v2(e) })
    }

    pub fn event_record(&self, e: CUevent, s: CUstream) -> Result<()> {
        self.bind()?;
        // SAFETY: `e` and `s` are live objects of this context.
        check("cuEventRecord", unsafe { sys::cuEventRecord(e, s) })
    }

    pub fn stream_wait(&self, s: CUstream, e: CUevent) -> Result<()> {
        self.bind()?;
        // SAFETY: `e` and `s` are live objects of this context.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(s, e, 0)
        })
    }

    pub fn event_sync(&self, e: CUevent) -> Result<()> {
        self.bind()?;
        // SAFETY: `e` is a live event of this context.
        check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(e) })
    }

    pub fn event_query(&self, e: CUevent) -> Result<bool> {
        self.bind()?;
        // SAFETY: `e` is a live event of this context.
        match unsafe { sys::cuEventQuery(e) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            code => Err(Error::Driver {
                call: "cuEventQuery",
                code: crate::error::DriverCode(code),
            }),
        }
    }

    pub fn event_elapsed_ms(&self, start: CUevent, end: CUevent) -> Result<f32> {
        self.bind()?;
        let mut ms = 0.0f32;
        // SAFETY: both are live timing events of this context; valid out pointer.
        check("cuEventElapsedTime", unsafe {
            sys::cuEventElapsedTime_v2(&mut ms, start, end)
        })?;
        Ok(ms)
    }

    pub fn begin_capture(&self, s: CUstream) -> Result<()> {
        self.bind()?;
        // SAFETY: `s` is a live non-null stream of this context.
        check("cuStreamBeginCapture", unsafe {
            sys::cuStreamBeginCapture_v2(
                s,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        })
    }

    /// Ends a capture; on success instantiates and uploads the graph (its memset nodes
    /// replaced by kernel nodes first, unless switched off: `memset_nodes`).
    pub fn end_capture(&self, s: CUstream) -> Result<CUgraphExec> {
        self.bind()?;
        let mut graph = ptr::null_mut();
        // SAFETY: `s` is capturing (begin_capture succeeded); valid out pointer.
        check("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(s, &mut graph)
        })?;
        let mut exec = ptr::null_mut();
        let rewritten = if self.memsets.enabled.load(Ordering::Relaxed) {
            self.memsets.rewrite(&self.cu, graph).map(|_| ())
        } else {
            Ok(())
        };
        // SAFETY: `graph` is the graph just captured.
        let inst = rewritten.and_then(|()| {
            check("cuGraphInstantiateWithFlags", unsafe {
                sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
            })
        });
        // SAFETY: the executable graph is independent of the graph it was made from.
        let destroyed = check("cuGraphDestroy", unsafe { sys::cuGraphDestroy(graph) });
        inst?;
        destroyed?;
        // SAFETY: `exec` was just instantiated; `s` is a live stream.
        if let Err(e) = check("cuGraphUpload", unsafe { sys::cuGraphUpload(exec, s) }) {
            // SAFETY: nothing else knows `exec` yet.
            unsafe { sys::cuGraphExecDestroy(exec) };
            return Err(e);
        }
        Ok(exec)
    }

    /// Ends a capture that failed on the caller's side, discarding what was captured.
    pub fn abort_capture(&self, s: CUstream) {
        if self.bind().is_err() {
            return;
        }
        let mut graph = ptr::null_mut();
        // SAFETY: `s` is capturing or invalidated; both end here.
        unsafe {
            sys::cuStreamEndCapture(s, &mut graph);
            if !graph.is_null() {
                sys::cuGraphDestroy(graph);
            }
        }
    }

    /// # Safety
    /// `exec` is a live executable graph of this context; `s` a live stream.
    #[inline]
    pub unsafe fn graph_launch(&self, exec: CUgraphExec, s: CUstream) -> Result<()> {
        self.bind()?;
        check("cuGraphLaunch", unsafe { sys::cuGraphLaunch(exec, s) })
    }

    /// # Safety
    /// `exec` came from `end_capture` and is not in flight and not used afterwards.
    pub unsafe fn graph_exec_destroy(&self, exec: CUgraphExec) -> Result<()> {
        self.bind()?;
        check("cuGraphExecDestroy", unsafe {
            sys::cuGraphExecDestroy(exec)
        })
    }

    /// # Safety
    /// `f(user)` is safe to call from a driver thread once, after the work before it on `s`.
    pub unsafe fn launch_host_fn(
        &self,
        s: CUstream,
        f: unsafe extern "C" fn(*mut c_void),
        user: *mut c_void,
    ) -> Result<()> {
        self.bind()?;
        check("cuLaunchHostFunc", unsafe {
            sys::cuLaunchHostFunc(s, Some(f), user)
        })
    }
}
