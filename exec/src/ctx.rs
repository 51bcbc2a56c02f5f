//! `Ctx`: the owner of a backend, its streams, and the state of an ongoing capture.

use crate::backend::cuda::{self, CudaDevice};
use crate::backend::host::{HostDevice, HostFn, HostOp};
use crate::error::{Error, HostOpError, Result};
use crate::{Buffer, Event};
use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// A stream of a [`Ctx`]: an ordered queue of work with a priority.
///
/// `Stream::DEFAULT` (id 0) exists in every context: a priority-0 stream the context owns —
/// on CUDA a non-blocking stream (as FlashRT's stream 0; work on it is not ordered with the
/// legacy default stream), on the host backend a priority-0 queue. A caller that needs
/// CUDA's legacy default stream wraps it: [`Ctx::wrap_stream`] with a null stream
/// (`frt_ctx_wrap_stream(ctx, NULL)` in the C ABI).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Debug)]
pub struct Stream(pub u32);

impl Stream {
    pub const DEFAULT: Stream = Stream(0);
}

/// Which backend a context runs on.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub enum BackendKind {
    Host,
    Cuda { device: usize },
}

/// The most streams one context hands out (created and wrapped together).
pub const MAX_STREAMS: usize = 256;

/// Priority range of the host backend: the same as a Hopper GPU's, so configurations carry over.
const HOST_PRIORITY_RANGE: (i32, i32) = (0, -5);

pub(crate) enum Device {
    Host(HostDevice),
    Cuda(CudaDevice),
}

struct StreamSlot {
    /// `CUstream` on CUDA (0 = the legacy default stream); unused on the host backend.
    raw: AtomicUsize,
    priority: AtomicI32,
    owned: AtomicBool,
}

/// Work recorded by the capture in progress keeps these alive (they go into the graph).
pub(crate) struct CaptureSession {
    pub stream: Stream,
    /// The [`Graph::id`](crate::Graph::id) of the graph being captured.
    pub graph: u64,
    pub buffers: Vec<Buffer>,
    pub objects: Vec<Arc<dyn Any + Send + Sync>>,
}

/// An error raised asynchronously (in a CUDA host function or a `Drop`), surfaced by the
/// next synchronizing call.
pub(crate) type ErrorSlot = Arc<Mutex<Option<Error>>>;

pub(crate) struct CtxInner {
    pub id: u64,
    pub device: Device,
    streams: Box<[StreamSlot]>,
    stream_count: AtomicUsize,
    stream_add: Mutex<()>,
    /// Serializes captures (one at a time per context).
    pub capture_lock: Mutex<()>,
    pub capture: Mutex<Option<CaptureSession>>,
    capturing: AtomicBool,
    capture_stream: OnceLock<Stream>,
    pub async_error: ErrorSlot,
    /// CUDA host calls that ran and wait to be dropped on an ordinary thread (boxes the
    /// driver handed back as raw pointers).
    #[allow(clippy::vec_box)]
    graveyard: Arc<Mutex<Vec<Box<HostCall>>>>,
}

/// A handle to a context; cheap to clone, `Send + Sync`. Buffers, events, graphs and plans keep
/// their context alive.
#[derive(Clone)]
pub struct Ctx {
    pub(crate) inner: Arc<CtxInner>,
}

impl fmt::Debug for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx")
            .field("id", &self.inner.id)
            .field("backend", &self.backend())
            .finish()
    }
}

static NEXT_CTX_ID: AtomicU64 = AtomicU64::new(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Ctx {
    fn with_device(device: Device) -> Result<Ctx> {
        let streams = (0..MAX_STREAMS)
            .map(|_| StreamSlot {
                raw: AtomicUsize::new(0),
                priority: AtomicI32::new(0),
                owned: AtomicBool::new(false),
            })
            .collect();
        let ctx = Ctx {
            inner: Arc::new(CtxInner {
                id: NEXT_CTX_ID.fetch_add(1, Ordering::Relaxed),
                device,
                streams,
                stream_count: AtomicUsize::new(0),
                stream_add: Mutex::new(()),
                capture_lock: Mutex::new(()),
                capture: Mutex::new(None),
                capturing: AtomicBool::new(false),
                capture_stream: OnceLock::new(),
                async_error: Arc::new(Mutex::new(None)),
                graveyard: Arc::new(Mutex::new(Vec::new())),
            }),
        };
        // Stream 0: a priority-0 stream of the context's own.
        match &ctx.inner.device {
            Device::Host(h) => {
                let idx = h.add_stream(0);
                ctx.inner.push_stream(0, 0, false, Some(idx))?;
            }
            Device::Cuda(c) => {
                let raw = c.create_stream(0)?;
                ctx.inner.push_stream(raw as usize, 0, true, None)?;
            }
        }
        Ok(ctx)
    }

    /// A context on the host backend (starts its executor thread).
    pub fn host() -> Result<Ctx> {
        Ctx::with_device(Device::Host(HostDevice::new()?))
    }

    /// A context on CUDA device `device` (its primary context).
    pub fn cuda(device: usize) -> Result<Ctx> {
        Ctx::with_device(Device::Cuda(CudaDevice::new(device)?))
    }

    /// CUDA device 0 when a CUDA driver and a device are present, else the host backend.
    pub fn auto() -> Result<Ctx> {
        match cuda::device_count() {
            Ok(n) if n > 0 => Ctx::cuda(0),
            _ => Ctx::host(),
        }
    }

    /// The number of CUDA devices (0 when no driver can be loaded).
    pub fn cuda_device_count() -> usize {
        cuda::device_count().unwrap_or(0)
    }

    pub fn backend(&self) -> BackendKind {
        match &self.inner.device {
            Device::Host(_) => BackendKind::Host,
            Device::Cuda(c) => BackendKind::Cuda { device: c.ordinal },
        }
    }

    /// `(least, greatest)` stream priority, CUDA's convention: 0 is normal, more negative is
    /// higher (e.g. `(0, -5)`).
    pub fn priority_range(&self) -> (i32, i32) {
        match &self.inner.device {
            Device::Host(_) => HOST_PRIORITY_RANGE,
            Device::Cuda(c) => c.priority_range,
        }
    }

    /// Creates a stream with `priority` (within [`priority_range`](Self::priority_range)).
    pub fn stream(&self, priority: i32) -> Result<Stream> {
        let (least, greatest) = self.priority_range();
        if priority > least || priority < greatest {
            return Err(Error::invalid(
                "Ctx::stream",
                format!("priority {priority} is outside this device's range [{greatest}, {least}]"),
            ));
        }
        match &self.inner.device {
            Device::Host(h) => {
                let _g = lock(&self.inner.stream_add);
                self.inner.check_room()?;
                let idx = h.add_stream(priority);
                self.inner.push_stream_locked(0, priority, false, Some(idx))
            }
            Device::Cuda(c) => {
                let _g = lock(&self.inner.stream_add);
                self.inner.check_room()?;
                let raw = c.create_stream(priority)?;
                self.inner
                    .push_stream_locked(raw as usize, priority, true, None)
            }
        }
    }

    /// Registers an externally owned CUDA stream (a `CUstream`, e.g. a torch stream) so that
    /// replays and plans can run on it. It is never destroyed by `exec`. Wrapping the same
    /// stream twice returns the same id. The host backend has no external streams.
    ///
    /// # Safety
    /// `raw` is a live `CUstream` of this context's CUDA context, and stays alive as long as
    /// this context may use the returned id.
    pub unsafe fn wrap_stream(&self, raw: *mut c_void) -> Result<Stream> {
        let Device::Cuda(c) = &self.inner.device else {
            return Err(Error::invalid(
                "Ctx::wrap_stream",
                "the host backend has no external streams",
            ));
        };
        let _g = lock(&self.inner.stream_add);
        let n = self.inner.stream_count.load(Ordering::Acquire);
        if let Some(i) =
            (0..n).find(|&i| self.inner.streams[i].raw.load(Ordering::Relaxed) == raw as usize)
        {
            return Ok(Stream(i as u32));
        }
        self.inner.check_room()?;
        let priority = c.stream_priority(raw as _)?;
        self.inner
            .push_stream_locked(raw as usize, priority, false, None)
    }

    pub fn default_stream(&self) -> Stream {
        Stream::DEFAULT
    }

    /// Every stream handed out so far, in id order.
    pub fn streams(&self) -> Vec<Stream> {
        (0..self.inner.stream_count.load(Ordering::Acquire))
            .map(|i| Stream(i as u32))
            .collect()
    }

    pub fn stream_priority(&self, s: Stream) -> Result<i32> {
        self.inner
            .slot(s)
            .map(|slot| slot.priority.load(Ordering::Relaxed))
    }

    /// The backend's native handle of a stream: the `CUstream` on CUDA (null for the legacy
    /// default stream). The host backend has none.
    pub fn raw_stream(&self, s: Stream) -> Result<*mut c_void> {
        let raw = self.inner.raw_stream(s)?;
        match &self.inner.device {
            Device::Cuda(_) => Ok(raw as *mut c_void),
            Device::Host(_) => Err(Error::invalid(
                "Ctx::raw_stream",
                "the host backend has no native streams",
            )),
        }
    }

    /// The CUDA context, for crates that launch their own kernels on `exec` streams.
    pub fn cuda_context(&self) -> Option<&Arc<cudarc::driver::CudaContext>> {
        match &self.inner.device {
            Device::Cuda(c) => Some(&c.cu),
            Device::Host(_) => None,
        }
    }

    /// Whether graphs captured from now on get their memset nodes (a library's memset between
    /// its kernels, such as cuBLASLt's of its workspace) replaced by nodes of a kernel that
    /// stores the same value, with the same dependencies, before they are instantiated (CUDA;
    /// on by default). A replay then runs the same work in the same order without the
    /// latency of a change of node type. The host backend has no such nodes.
    pub fn set_memset_nodes_as_kernels(&self, on: bool) {
        if let Device::Cuda(c) = &self.inner.device {
            c.memsets.enabled.store(on, Ordering::Relaxed);
        }
    }

    /// The memset nodes replaced by kernel nodes in this context's captured graphs so far.
    pub fn memset_nodes_replaced(&self) -> usize {
        match &self.inner.device {
            Device::Cuda(c) => c.memsets.replaced.load(Ordering::Relaxed),
            Device::Host(_) => 0,
        }
    }

    /// Why memset nodes are no longer replaced, where the kernel that replaces them could not
    /// be loaded (the driver compiles its PTX): graphs then keep their memset nodes, which
    /// compute the same. `None` while the rewrite works or was never needed.
    pub fn memset_nodes_error(&self) -> Option<String> {
        match &self.inner.device {
            Device::Cuda(c) => lock(&c.memsets.error).clone(),
            Device::Host(_) => None,
        }
    }

    /// Makes this context current on the calling thread (CUDA); a no-op on the host backend.
    pub fn bind_to_thread(&self) -> Result<()> {
        match &self.inner.device {
            Device::Cuda(c) => c.bind(),
            Device::Host(_) => Ok(()),
        }
    }

    /// Blocks until all work enqueued on `s` so far has finished; reports the first
    /// asynchronous error since the last synchronizing call.
    pub fn sync_stream(&self, s: Stream) -> Result<()> {
        let r = match &self.inner.device {
            Device::Host(h) => h.sync_stream(s),
            Device::Cuda(c) => {
                let raw = self.inner.raw_stream(s)?;
                if self.is_capturing(s) {
                    return Err(Error::invalid(
                        "Ctx::sync_stream",
                        format!("{s:?} is capturing"),
                    ));
                }
                c.sync_stream(raw as _)
            }
        };
        self.inner.bury();
        r.and(self.inner.take_async_error())
    }

    /// Blocks until every stream of this context is idle.
    pub fn synchronize(&self) -> Result<()> {
        let mut first = Ok(());
        for s in self.streams() {
            if self.is_capturing(s) {
                continue;
            }
            let r = self.sync_stream(s);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// An event for cross-stream ordering (no timing).
    pub fn event(&self) -> Result<Event> {
        Event::new(self, false)
    }

    /// An event that also records a timestamp, for [`Event::elapsed_ms`].
    pub fn timing_event(&self) -> Result<Event> {
        Event::new(self, true)
    }

    /// Makes `s` wait (without blocking the host) until `event`'s latest record has completed.
    /// Waiting on an event that was never recorded is a no-op, as in CUDA.
    pub fn stream_wait(&self, s: Stream, event: &Event) -> Result<()> {
        event.check_ctx(self, "Ctx::stream_wait")?;
        event.wait_on(s)
    }

    /// Enqueues a host function on `s`: it runs after the work before it on `s`, and the work
    /// after it waits for it. On the host backend this is how kernels run; inside a capture it
    /// is recorded and runs at every replay. An `Err` (or a panic) is reported by the next
    /// synchronizing call. On CUDA it becomes a host node / `cuLaunchHostFunc`; it must not
    /// call CUDA.
    pub fn launch_host<F>(&self, s: Stream, f: F) -> Result<()>
    where
        F: Fn() -> Result<(), HostOpError> + Send + Sync + 'static,
    {
        self.launch_host_fn(s, Arc::new(f))
    }

    pub(crate) fn launch_host_fn(&self, s: Stream, f: HostFn) -> Result<()> {
        match &self.inner.device {
            Device::Host(h) => h.enqueue(s, HostOp::Run(f)),
            Device::Cuda(c) => {
                let raw = self.inner.raw_stream(s)? as *mut c_void;
                let call = HostCall {
                    f,
                    stream: s,
                    errors: self.inner.async_error.clone(),
                    graveyard: self.inner.graveyard.clone(),
                };
                let mut session = lock(&self.inner.capture);
                match session.as_mut() {
                    Some(cs) if cs.stream == s => {
                        // Replayed many times: the graph owns the call.
                        let call = Arc::new(call);
                        let user = Arc::as_ptr(&call) as *mut c_void;
                        cs.objects.push(call);
                        // SAFETY: the graph being captured keeps `call` alive (pushed above).
                        unsafe { c.launch_host_fn(raw.cast(), host_call_captured, user) }
                    }
                    _ => {
                        drop(session);
                        self.inner.bury();
                        let user = Box::into_raw(Box::new(call)) as *mut c_void;
                        // SAFETY: `host_call_once` takes the box back exactly once.
                        let r = unsafe { c.launch_host_fn(raw.cast(), host_call_once, user) };
                        if r.is_err() {
                            // SAFETY: the launch failed, so the driver will not call it.
                            drop(unsafe { Box::from_raw(user as *mut HostCall) });
                        }
                        r
                    }
                }
            }
        }
    }

    /// Whether `s` is the stream of the capture in progress.
    pub fn is_capturing(&self, s: Stream) -> bool {
        self.inner.capturing.load(Ordering::Acquire)
            && lock(&self.inner.capture)
                .as_ref()
                .is_some_and(|c| c.stream == s)
    }

    /// The [`Graph::id`](crate::Graph::id) of the graph whose variant is being captured on
    /// `s`, if a capture is in progress on `s`.
    pub fn capturing_graph(&self, s: Stream) -> Option<u64> {
        if !self.inner.capturing.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.inner.capture)
            .as_ref()
            .filter(|c| c.stream == s)
            .map(|c| c.graph)
    }

    /// Tells the capture in progress on `s` (if any) that its work uses `buffer`, so the
    /// resulting graph keeps `buffer` alive. Kernels call this for every buffer they enqueue
    /// work on; outside a capture it does nothing.
    pub fn retain(&self, s: Stream, buffer: &Buffer) {
        if !self.inner.capturing.load(Ordering::Acquire) {
            return;
        }
        if let Some(cs) = lock(&self.inner.capture).as_mut() {
            if cs.stream == s && !cs.buffers.iter().any(|b| b.id() == buffer.id()) {
                cs.buffers.push(buffer.clone());
            }
        }
    }

    /// Like [`retain`](Self::retain) for any object the captured work needs (a module, a
    /// workspace).
    pub fn retain_object(&self, s: Stream, object: Arc<dyn Any + Send + Sync>) {
        if let Some(cs) = lock(&self.inner.capture).as_mut() {
            if cs.stream == s {
                cs.objects.push(object);
            }
        }
    }

    /// Reports (and clears) an error raised asynchronously since the last synchronizing call,
    /// e.g. a failure while freeing memory in `Drop`.
    pub fn take_error(&self) -> Result<()> {
        self.inner.take_async_error()
    }

    /// Whether two handles refer to the same context.
    pub fn same(&self, other: &Ctx) -> bool {
        self.inner.id == other.inner.id
    }

    /// The stream captures run on (created once, priority 0).
    pub(crate) fn capture_stream(&self) -> Result<Stream> {
        if let Some(s) = self.inner.capture_stream.get() {
            return Ok(*s);
        }
        let s = self.stream(0)?;
        Ok(*self.inner.capture_stream.get_or_init(|| s))
    }

    pub(crate) fn begin_session(&self, s: Stream, graph: u64) {
        *lock(&self.inner.capture) = Some(CaptureSession {
            stream: s,
            graph,
            buffers: Vec::new(),
            objects: Vec::new(),
        });
        self.inner.capturing.store(true, Ordering::Release);
    }

    pub(crate) fn end_session(&self) -> Option<CaptureSession> {
        self.inner.capturing.store(false, Ordering::Release);
        lock(&self.inner.capture).take()
    }
}

impl CtxInner {
    fn check_room(&self) -> Result<()> {
        if self.stream_count.load(Ordering::Acquire) >= MAX_STREAMS {
            Err(Error::invalid(
                "Ctx::stream",
                format!("a context has at most {MAX_STREAMS} streams"),
            ))
        } else {
            Ok(())
        }
    }

    fn push_stream(
        &self,
        raw: usize,
        priority: i32,
        owned: bool,
        host_idx: Option<usize>,
    ) -> Result<Stream> {
        let _g = lock(&self.stream_add);
        self.push_stream_locked(raw, priority, owned, host_idx)
    }

    fn push_stream_locked(
        &self,
        raw: usize,
        priority: i32,
        owned: bool,
        host_idx: Option<usize>,
    ) -> Result<Stream> {
        let i = self.stream_count.load(Ordering::Acquire);
        debug_assert!(
            host_idx.is_none_or(|h| h == i),
            "host stream index follows the table"
        );
        let slot = &self.streams[i];
        slot.raw.store(raw, Ordering::Relaxed);
        slot.priority.store(priority, Ordering::Relaxed);
        slot.owned.store(owned, Ordering::Relaxed);
        self.stream_count.store(i + 1, Ordering::Release);
        Ok(Stream(i as u32))
    }

    fn slot(&self, s: Stream) -> Result<&StreamSlot> {
        let i = s.0 as usize;
        if i < self.stream_count.load(Ordering::Acquire) {
            Ok(&self.streams[i])
        } else {
            Err(Error::UnknownStream(s))
        }
    }

    #[inline]
    pub fn raw_stream(&self, s: Stream) -> Result<usize> {
        self.slot(s).map(|slot| slot.raw.load(Ordering::Relaxed))
    }

    pub fn take_async_error(&self) -> Result<()> {
        match lock(&self.async_error).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Records an error that has no caller to return to (a `Drop`).
    pub fn defer_error(&self, e: Error) {
        let mut slot = lock(&self.async_error);
        if slot.is_none() {
            *slot = Some(e);
        }
    }

    /// Drops CUDA host calls that already ran (never inside a driver callback).
    fn bury(&self) {
        let dead = std::mem::take(&mut *lock(&self.graveyard));
        drop(dead);
    }
}

impl Drop for CtxInner {
    fn drop(&mut self) {
        if let Device::Cuda(c) = &self.device {
            self.bury();
            let n = *self.stream_count.get_mut();
            for slot in &self.streams[..n] {
                if slot.owned.load(Ordering::Relaxed) {
                    let raw = slot.raw.load(Ordering::Relaxed);
                    // SAFETY: created by this context; nothing can use it after the context.
                    let _ = c.sync_stream(raw as _);
                    let _ = unsafe { c.destroy_stream(raw as _) };
                }
            }
        }
    }
}

/// A Rust host function launched on a CUDA stream.
struct HostCall {
    f: HostFn,
    stream: crate::Stream,
    errors: ErrorSlot,
    #[allow(clippy::vec_box)]
    graveyard: Arc<Mutex<Vec<Box<HostCall>>>>,
}

impl HostCall {
    fn run(&self) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.f)()))
            .unwrap_or_else(|_| Err(HostOpError::msg("host operation panicked")));
        if let Err(source) = r {
            let mut slot = lock(&self.errors);
            if slot.is_none() {
                *slot = Some(Error::HostOp {
                    stream: self.stream,
                    source,
                });
            }
        }
    }
}

unsafe extern "C" fn host_call_once(user: *mut c_void) {
    // SAFETY: `user` is the Box leaked by `launch_host_fn`; the driver calls this once.
    let call = unsafe { Box::from_raw(user as *mut HostCall) };
    call.run();
    // Dropping here could free buffers, i.e. call CUDA inside a driver callback: defer it.
    let graveyard = call.graveyard.clone();
    lock(&graveyard).push(call);
}

unsafe extern "C" fn host_call_captured(user: *mut c_void) {
    // SAFETY: the graph that holds this host node keeps the `HostCall` alive.
    let call = unsafe { &*(user as *const HostCall) };
    call.run();
}
