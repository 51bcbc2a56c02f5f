//! # libflashrt_exec — the C ABI of the execution contract
//!
//! A thin layer over `frt-exec`: opaque handles (tagged indices into handle tables, see
//! `registry`), status codes, and nothing else. The declarations live in
//! `exec/include/flashrt/exec.h`; the `header_matches_exports` test checks that header
//! against the functions defined here, name by name and type by type.
//!
//! Every function is safe to call from any thread, and with null or stale handles (which
//! give `FRT_ERR_INVALID`, or a null / zero result for functions that return a value). No
//! Rust panic crosses the boundary: one would be reported as `FRT_ERR_BACKEND`.

// The safety contract of every `unsafe extern "C"` function is stated once, in exec.h.
#![allow(clippy::missing_safety_doc)]

mod registry;

use frt_exec::{BackendKind, Buffer, Ctx, Error, Event, Graph, Plan, ShapeKey, Status, Stream};
use registry::Registry;
use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

pub type FrtCtx = *mut c_void;
pub type FrtBuffer = *mut c_void;
pub type FrtGraph = *mut c_void;
pub type FrtPlan = *mut c_void;
pub type FrtEvent = *mut c_void;
pub type FrtShapeKey = u64;
pub type RecordFn = Option<unsafe extern "C" fn(user: *mut c_void, stream: *mut c_void)>;
pub type HostFn = Option<unsafe extern "C" fn(user: *mut c_void)>;

pub const FRT_OK: c_int = 0;
pub const FRT_ERR_INVALID: c_int = -1;
pub const FRT_ERR_NO_VARIANT: c_int = -2;
pub const FRT_ERR_UNBOUND: c_int = -3;
pub const FRT_ERR_CAPTURE: c_int = -4;
pub const FRT_ERR_BACKEND: c_int = -5;
pub const FRT_ERR_OOM: c_int = -6;
pub const FRT_KEY_INHERIT: FrtShapeKey = u64::MAX;

/// The native handle the host backend gives for a stream (what `record` receives there, and
/// what `frt_ctx_native_stream` returns): a stable address identifying (context, stream).
struct HostStreamRef {
    stream: u32,
}

struct CtxEntry {
    ctx: Ctx,
    /// Boxed: C code holds their addresses.
    #[allow(clippy::vec_box)]
    host_streams: Mutex<Vec<Box<HostStreamRef>>>,
}

struct BufferEntry {
    owner: usize,
    buffer: Buffer,
    name: CString,
}

struct GraphEntry {
    owner: usize,
    graph: Graph,
}

struct PlanEntry {
    owner: usize,
    plan: Mutex<Plan>,
}

struct EventEntry {
    owner: usize,
    event: Event,
}

static CTXS: Registry<CtxEntry> = Registry::new(0xC1);
static BUFFERS: Registry<BufferEntry> = Registry::new(0xB1);
static GRAPHS: Registry<GraphEntry> = Registry::new(0xA1);
static PLANS: Registry<PlanEntry> = Registry::new(0xD1);
static EVENTS: Registry<EventEntry> = Registry::new(0xE1);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn fail(e: Error) -> c_int {
    let code = e.status() as c_int;
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    set_last_error(msg);
    code
}

fn invalid(msg: &str) -> c_int {
    set_last_error(msg.to_string());
    FRT_ERR_INVALID
}

/// Runs `f`, turning a panic into `FRT_ERR_BACKEND`.
fn guard(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_last_error("internal error (a panic was caught at the C boundary)".into());
        FRT_ERR_BACKEND
    })
}

/// Runs `f` for functions that return a value; a panic gives `fallback`.
fn guard_value<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_last_error("internal error (a panic was caught at the C boundary)".into());
        fallback
    })
}

fn status(r: frt_exec::Result<()>) -> c_int {
    match r {
        Ok(()) => FRT_OK,
        Err(e) => fail(e),
    }
}

fn stream_id(id: c_int) -> Option<Stream> {
    u32::try_from(id).ok().map(Stream)
}

/// # Safety
/// `s` is null or a NUL-terminated string.
unsafe fn cstr<'a>(s: *const c_char) -> Option<&'a str> {
    if s.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(s) }.to_str().ok()
}

/// The context entry and a name, for the functions that create named objects; reports what
/// is wrong and gives `None` otherwise.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
unsafe fn ctx_and_name<'a>(
    ctx: FrtCtx,
    name: *const c_char,
    what: &str,
) -> Option<(std::sync::Arc<CtxEntry>, &'a str)> {
    let Some(c) = CTXS.get(ctx) else {
        invalid("invalid context handle");
        return None;
    };
    // A null name is the empty name (as FlashRT's).
    if name.is_null() {
        return Some((c, ""));
    }
    // SAFETY: C string by the caller's contract.
    let Some(name) = (unsafe { cstr(name) }) else {
        invalid(&format!("{what} name must be UTF-8"));
        return None;
    };
    Some((c, name))
}

impl CtxEntry {
    /// The native stream handle for `s`: the CUstream on CUDA, a `HostStreamRef` on host.
    fn native(&self, s: Stream) -> *mut c_void {
        match self.ctx.backend() {
            BackendKind::Cuda { .. } => self.ctx.raw_stream(s).unwrap_or(std::ptr::null_mut()),
            BackendKind::Host => {
                let mut v = self.host_streams.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(r) = v.iter().find(|r| r.stream == s.0) {
                    return &**r as *const HostStreamRef as *mut c_void;
                }
                let r = Box::new(HostStreamRef { stream: s.0 });
                let p = &*r as *const HostStreamRef as *mut c_void;
                v.push(r);
                p
            }
        }
    }

    /// The stream a native handle stands for (registering a foreign CUDA stream).
    fn stream_of(&self, native: *mut c_void) -> frt_exec::Result<Stream> {
        match self.ctx.backend() {
            // SAFETY: the C caller passes a live CUstream of this context (documented).
            BackendKind::Cuda { .. } => unsafe { self.ctx.wrap_stream(native) },
            BackendKind::Host => {
                let v = self.host_streams.lock().unwrap_or_else(|p| p.into_inner());
                v.iter()
                    .find(|r| std::ptr::eq(&***r, native as *const HostStreamRef))
                    .map(|r| Stream(r.stream))
                    .ok_or(Error::Invalid {
                        op: "native stream",
                        reason: "not a stream handle of this context (use frt_ctx_native_stream)"
                            .into(),
                    })
            }
        }
    }
}

// ------------------------------------------------------------------ context and streams

fn create_ctx(r: frt_exec::Result<Ctx>) -> FrtCtx {
    match r {
        Ok(ctx) => CTXS.insert(CtxEntry {
            ctx,
            host_streams: Mutex::new(Vec::new()),
        }),
        Err(e) => {
            fail(e);
            std::ptr::null_mut()
        }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_ctx_create() -> FrtCtx {
    guard_value(std::ptr::null_mut(), || create_ctx(Ctx::auto()))
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_ctx_create_host() -> FrtCtx {
    guard_value(std::ptr::null_mut(), || create_ctx(Ctx::host()))
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_ctx_create_cuda(device: c_int) -> FrtCtx {
    guard_value(std::ptr::null_mut(), || match usize::try_from(device) {
        Ok(d) => create_ctx(Ctx::cuda(d)),
        Err(_) => {
            invalid("negative device ordinal");
            std::ptr::null_mut()
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_ctx_destroy(ctx: FrtCtx) {
    guard_value((), || {
        let Some(entry) = CTXS.remove(ctx) else {
            return;
        };
        let _ = entry.ctx.synchronize();
        let owner = ctx as usize;
        // Children first, dropped outside the tables' locks.
        let plans = PLANS.remove_where(|p| p.owner == owner);
        let graphs = GRAPHS.remove_where(|g| g.owner == owner);
        let events = EVENTS.remove_where(|e| e.owner == owner);
        let buffers = BUFFERS.remove_where(|b| b.owner == owner);
        drop((plans, graphs, events, buffers, entry));
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_ctx_backend(ctx: FrtCtx) -> c_int {
    guard(|| match CTXS.get(ctx) {
        Some(c) => match c.ctx.backend() {
            BackendKind::Host => 0,
            BackendKind::Cuda { .. } => 1,
        },
        None => invalid("invalid context handle"),
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_ctx_stream(ctx: FrtCtx, priority: c_int) -> c_int {
    guard(|| {
        let Some(c) = CTXS.get(ctx) else {
            return invalid("invalid context handle");
        };
        // Clamped into the device's range, as FlashRT's (CUDA's convention: `least` is the
        // largest number, `greatest` the most negative).
        let (least, greatest) = c.ctx.priority_range();
        match c.ctx.stream(priority.clamp(greatest, least)) {
            Ok(s) => s.0 as c_int,
            Err(e) => fail(e),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_ctx_wrap_stream(ctx: FrtCtx, external_stream: *mut c_void) -> c_int {
    guard(|| {
        let Some(c) = CTXS.get(ctx) else {
            return invalid("invalid context handle");
        };
        match c.stream_of(external_stream) {
            Ok(s) => s.0 as c_int,
            Err(e) => fail(e),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_ctx_native_stream(ctx: FrtCtx, stream: c_int) -> *mut c_void {
    guard_value(std::ptr::null_mut(), || {
        let Some(c) = CTXS.get(ctx) else {
            invalid("invalid context handle");
            return std::ptr::null_mut();
        };
        match stream_id(stream).map(|s| (s, c.ctx.stream_priority(s))) {
            Some((s, Ok(_))) => c.native(s),
            _ => {
                invalid("unknown stream id");
                std::ptr::null_mut()
            }
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_stream_sync(ctx: FrtCtx, stream: c_int) -> c_int {
    guard(|| {
        let Some(c) = CTXS.get(ctx) else {
            return invalid("invalid context handle");
        };
        let Some(s) = stream_id(stream) else {
            return invalid("negative stream id");
        };
        status(c.ctx.sync_stream(s))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_ctx_sync(ctx: FrtCtx) -> c_int {
    guard(|| match CTXS.get(ctx) {
        Some(c) => status(c.ctx.synchronize()),
        None => invalid("invalid context handle"),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_launch_host(
    ctx: FrtCtx,
    native_stream: *mut c_void,
    f: HostFn,
    user: *mut c_void,
) -> c_int {
    guard(|| {
        let Some(c) = CTXS.get(ctx) else {
            return invalid("invalid context handle");
        };
        let Some(f) = f else {
            return invalid("null host function");
        };
        let s = match c.stream_of(native_stream) {
            Ok(s) => s,
            Err(e) => return fail(e),
        };
        struct User(*mut c_void);
        // SAFETY: the C caller guarantees `user` may be used from the executor thread.
        unsafe impl Send for User {}
        // SAFETY: as above.
        unsafe impl Sync for User {}
        let user = User(user);
        status(c.ctx.launch_host(s, move || {
            let u = &user;
            // SAFETY: the C caller's function and data, called as documented.
            unsafe { f(u.0) };
            Ok(())
        }))
    })
}

// ------------------------------------------------------------------ events

#[unsafe(no_mangle)]
pub extern "C" fn frt_ctx_event(ctx: FrtCtx) -> FrtEvent {
    guard_value(std::ptr::null_mut(), || {
        let Some(c) = CTXS.get(ctx) else {
            invalid("invalid context handle");
            return std::ptr::null_mut();
        };
        match c.ctx.event() {
            Ok(event) => EVENTS.insert(EventEntry {
                owner: ctx as usize,
                event,
            }),
            Err(e) => {
                fail(e);
                std::ptr::null_mut()
            }
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_event_destroy(ev: FrtEvent) {
    guard_value((), || drop(EVENTS.remove(ev)))
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_event_record(ev: FrtEvent, stream: c_int) -> c_int {
    guard(|| {
        let Some(e) = EVENTS.get(ev) else {
            return invalid("invalid event handle");
        };
        let Some(s) = stream_id(stream) else {
            return invalid("negative stream id");
        };
        status(e.event.record(s))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_stream_wait(ctx: FrtCtx, stream: c_int, ev: FrtEvent) -> c_int {
    guard(|| {
        let Some(c) = CTXS.get(ctx) else {
            return invalid("invalid context handle");
        };
        let Some(e) = EVENTS.get(ev) else {
            return invalid("invalid event handle");
        };
        let Some(s) = stream_id(stream) else {
            return invalid("negative stream id");
        };
        status(c.ctx.stream_wait(s, &e.event))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_event_sync(ev: FrtEvent) -> c_int {
    guard(|| match EVENTS.get(ev) {
        Some(e) => status(e.event.synchronize()),
        None => invalid("invalid event handle"),
    })
}

// ------------------------------------------------------------------ buffers

fn insert_buffer(owner: FrtCtx, r: frt_exec::Result<Buffer>) -> FrtBuffer {
    match r {
        Ok(buffer) => {
            let name = CString::new(buffer.name()).unwrap_or_default();
            BUFFERS.insert(BufferEntry {
                owner: owner as usize,
                buffer,
                name,
            })
        }
        Err(e) => {
            fail(e);
            std::ptr::null_mut()
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_buffer_alloc(
    ctx: FrtCtx,
    name: *const c_char,
    bytes: usize,
) -> FrtBuffer {
    guard_value(std::ptr::null_mut(), || {
        // SAFETY: C string by contract.
        let Some((c, name)) = (unsafe { ctx_and_name(ctx, name, "buffer") }) else {
            return std::ptr::null_mut();
        };
        insert_buffer(ctx, Buffer::alloc(&c.ctx, name, bytes))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_buffer_wrap(
    ctx: FrtCtx,
    name: *const c_char,
    dptr: *mut c_void,
    bytes: usize,
) -> FrtBuffer {
    guard_value(std::ptr::null_mut(), || {
        // SAFETY: C string by contract.
        let Some((c, name)) = (unsafe { ctx_and_name(ctx, name, "buffer") }) else {
            return std::ptr::null_mut();
        };
        // SAFETY: the caller vouches for the memory (documented in the header).
        insert_buffer(ctx, unsafe { Buffer::wrap(&c.ctx, name, dptr, bytes) })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_buffer_dptr(buf: FrtBuffer) -> *mut c_void {
    guard_value(std::ptr::null_mut(), || {
        BUFFERS
            .get(buf)
            .map_or(std::ptr::null_mut(), |b| b.buffer.ptr() as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_buffer_bytes(buf: FrtBuffer) -> usize {
    guard_value(0, || BUFFERS.get(buf).map_or(0, |b| b.buffer.bytes()))
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_buffer_name(buf: FrtBuffer) -> *const c_char {
    // The string lives in the table entry, i.e. until the buffer's context is destroyed; a
    // bad handle gives "" (as FlashRT's).
    guard_value(c"".as_ptr(), || {
        BUFFERS.get(buf).map_or(c"".as_ptr(), |b| b.name.as_ptr())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_buffer_copy(
    ctx: FrtCtx,
    dst: FrtBuffer,
    dst_off: usize,
    src: FrtBuffer,
    src_off: usize,
    bytes: usize,
    stream: c_int,
) -> c_int {
    guard(|| {
        if CTXS.get(ctx).is_none() {
            return invalid("invalid context handle");
        }
        let (Some(d), Some(s)) = (BUFFERS.get(dst), BUFFERS.get(src)) else {
            return invalid("invalid buffer handle");
        };
        if d.owner != ctx as usize || s.owner != ctx as usize {
            return invalid("buffers belong to another context");
        }
        let Some(st) = stream_id(stream) else {
            return invalid("negative stream id");
        };
        status(Buffer::copy(
            &d.buffer, dst_off, &s.buffer, src_off, bytes, st,
        ))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_buffer_upload(
    buf: FrtBuffer,
    offset: usize,
    src: *const c_void,
    bytes: usize,
    stream: c_int,
) -> c_int {
    guard(|| {
        let Some(b) = BUFFERS.get(buf) else {
            return invalid("invalid buffer handle");
        };
        let Some(s) = stream_id(stream) else {
            return invalid("negative stream id");
        };
        if src.is_null() && bytes > 0 {
            return invalid("null source");
        }
        let data = if bytes == 0 {
            &[][..]
        } else {
            // SAFETY: the caller passes `bytes` readable bytes at `src`.
            unsafe { std::slice::from_raw_parts(src as *const u8, bytes) }
        };
        status(b.buffer.upload(s, offset, data))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_buffer_download(
    buf: FrtBuffer,
    offset: usize,
    dst: *mut c_void,
    bytes: usize,
    stream: c_int,
) -> c_int {
    guard(|| {
        let Some(b) = BUFFERS.get(buf) else {
            return invalid("invalid buffer handle");
        };
        let Some(s) = stream_id(stream) else {
            return invalid("negative stream id");
        };
        if dst.is_null() && bytes > 0 {
            return invalid("null destination");
        }
        let out = if bytes == 0 {
            &mut [][..]
        } else {
            // SAFETY: the caller passes `bytes` writable bytes at `dst`.
            unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, bytes) }
        };
        status(b.buffer.download(s, offset, out))
    })
}

// ------------------------------------------------------------------ graphs

#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_graph_create(
    ctx: FrtCtx,
    name: *const c_char,
    max_variants: usize,
) -> FrtGraph {
    guard_value(std::ptr::null_mut(), || {
        // SAFETY: C string by contract.
        let Some((c, name)) = (unsafe { ctx_and_name(ctx, name, "graph") }) else {
            return std::ptr::null_mut();
        };
        GRAPHS.insert(GraphEntry {
            owner: ctx as usize,
            graph: Graph::new(&c.ctx, name, max_variants),
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_graph_destroy(g: FrtGraph) {
    guard_value((), || drop(GRAPHS.remove(g)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_graph_capture(
    g: FrtGraph,
    key: FrtShapeKey,
    record: RecordFn,
    user: *mut c_void,
) -> c_int {
    guard(|| {
        let Some(ge) = GRAPHS.get(g) else {
            return invalid("invalid graph handle");
        };
        let Some(record) = record else {
            return invalid("null record callback");
        };
        let Some(c) = CTXS.get(ge.owner as *const c_void) else {
            return invalid("the graph's context was destroyed");
        };
        status(ge.graph.capture(ShapeKey(key), |s| {
            let native = c.native(s);
            // SAFETY: the C caller's callback, given its own data and the stream being captured.
            unsafe { record(user, native) };
            Ok(())
        }))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_graph_adopt(
    g: FrtGraph,
    key: FrtShapeKey,
    external_graph_exec: *mut c_void,
) -> c_int {
    guard(|| {
        let Some(ge) = GRAPHS.get(g) else {
            return invalid("invalid graph handle");
        };
        // SAFETY: the caller vouches for the executable graph (documented in the header).
        status(unsafe { ge.graph.adopt(ShapeKey(key), external_graph_exec) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_graph_bind(g: FrtGraph, port: *const c_char, buf: FrtBuffer) -> c_int {
    guard(|| {
        let Some(ge) = GRAPHS.get(g) else {
            return invalid("invalid graph handle");
        };
        let Some(b) = BUFFERS.get(buf) else {
            return invalid("invalid buffer handle");
        };
        // SAFETY: C string by contract.
        let Some(port) = (unsafe { cstr(port) }) else {
            return invalid("port name must be a non-null UTF-8 string");
        };
        status(ge.graph.bind(port, &b.buffer))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_graph_port(
    g: FrtGraph,
    port: *const c_char,
    out: *mut FrtBuffer,
) -> c_int {
    guard(|| {
        let Some(ge) = GRAPHS.get(g) else {
            return invalid("invalid graph handle");
        };
        // SAFETY: C string by contract.
        let Some(port) = (unsafe { cstr(port) }) else {
            return invalid("port name must be a non-null UTF-8 string");
        };
        if out.is_null() {
            return invalid("null output pointer");
        }
        let bound = match ge.graph.port(port) {
            Ok(b) => b,
            Err(e) => return fail(e),
        };
        // The handle of the bound buffer: find the table entry holding it.
        let found = BUFFERS.find_handle(|e| e.owner == ge.owner && e.buffer.id() == bound.id());
        match found {
            Some(h) => {
                // SAFETY: non-null, and the caller passes a writable frt_buffer slot.
                unsafe { *out = h };
                FRT_OK
            }
            None => invalid("the bound buffer has no handle in this context"),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_graph_replay(g: FrtGraph, key: FrtShapeKey, stream: c_int) -> c_int {
    guard(|| {
        let Some(ge) = GRAPHS.get(g) else {
            return invalid("invalid graph handle");
        };
        let Some(s) = stream_id(stream) else {
            return invalid("negative stream id");
        };
        status(ge.graph.replay(ShapeKey(key), s))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_graph_has_variant(g: FrtGraph, key: FrtShapeKey) -> c_int {
    // 1 or 0; a bad handle is 0 (as FlashRT's), with the reason in frt_last_error.
    guard_value(0, || match GRAPHS.get(g) {
        Some(ge) => c_int::from(ge.graph.has_variant(ShapeKey(key))),
        None => {
            invalid("invalid graph handle");
            0
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_graph_native_exec(g: FrtGraph, key: FrtShapeKey) -> *mut c_void {
    guard_value(std::ptr::null_mut(), || {
        match GRAPHS.get(g).map(|ge| ge.graph.native_exec(ShapeKey(key))) {
            Some(Ok(p)) => p,
            Some(Err(e)) => {
                fail(e);
                std::ptr::null_mut()
            }
            None => {
                invalid("invalid graph handle");
                std::ptr::null_mut()
            }
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_graph_evict(g: FrtGraph, key: FrtShapeKey) -> c_int {
    guard(|| match GRAPHS.get(g) {
        Some(ge) => status(ge.graph.evict(ShapeKey(key))),
        None => invalid("invalid graph handle"),
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_graph_evict_lru(g: FrtGraph) -> c_int {
    guard(|| match GRAPHS.get(g) {
        Some(ge) => match ge.graph.evict_lru() {
            Some(_) => FRT_OK,
            None => {
                set_last_error(format!(
                    "graph `{}` has no variant to evict",
                    ge.graph.name()
                ));
                FRT_ERR_NO_VARIANT
            }
        },
        None => invalid("invalid graph handle"),
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_graph_variant_count(g: FrtGraph) -> usize {
    guard_value(0, || GRAPHS.get(g).map_or(0, |ge| ge.graph.variant_count()))
}

// ------------------------------------------------------------------ plans

#[unsafe(no_mangle)]
pub extern "C" fn frt_plan_create(ctx: FrtCtx) -> FrtPlan {
    guard_value(std::ptr::null_mut(), || match CTXS.get(ctx) {
        Some(c) => PLANS.insert(PlanEntry {
            owner: ctx as usize,
            plan: Mutex::new(Plan::new(&c.ctx)),
        }),
        None => {
            invalid("invalid context handle");
            std::ptr::null_mut()
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_plan_destroy(p: FrtPlan) {
    guard_value((), || drop(PLANS.remove(p)))
}

fn with_plan<R>(p: FrtPlan, f: impl FnOnce(&mut Plan) -> R) -> Option<R> {
    let pe = PLANS.get(p)?;
    let mut plan = pe.plan.lock().unwrap_or_else(|e| e.into_inner());
    Some(f(&mut plan))
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_plan_add(p: FrtPlan, g: FrtGraph, key: FrtShapeKey, stream: c_int) -> c_int {
    guard(|| {
        let Some(ge) = GRAPHS.get(g) else {
            return invalid("invalid graph handle");
        };
        let Some(s) = stream_id(stream) else {
            return invalid("negative stream id");
        };
        with_plan(p, |plan| match plan.add(&ge.graph, ShapeKey(key), s) {
            Ok(n) => c_int::try_from(n).unwrap_or_else(|_| invalid("too many plan nodes")),
            Err(e) => fail(e),
        })
        .unwrap_or_else(|| invalid("invalid plan handle"))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_plan_after(p: FrtPlan, node_idx: c_int, dep_node_idx: c_int) -> c_int {
    guard(|| {
        let (Ok(n), Ok(d)) = (usize::try_from(node_idx), usize::try_from(dep_node_idx)) else {
            return invalid("negative node index");
        };
        with_plan(p, |plan| status(plan.after(n, d)))
            .unwrap_or_else(|| invalid("invalid plan handle"))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_plan_execute(p: FrtPlan, key: FrtShapeKey) -> c_int {
    guard(|| {
        with_plan(p, |plan| status(plan.execute(ShapeKey(key))))
            .unwrap_or_else(|| invalid("invalid plan handle"))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_plan_sync(p: FrtPlan) -> c_int {
    guard(|| {
        with_plan(p, |plan| status(plan.sync())).unwrap_or_else(|| invalid("invalid plan handle"))
    })
}

// ------------------------------------------------------------------ diagnostics

#[unsafe(no_mangle)]
pub extern "C" fn frt_status_string(status: c_int) -> *const c_char {
    let s: &'static CStr = match status {
        FRT_OK => c"FRT_OK",
        FRT_ERR_INVALID => c"FRT_ERR_INVALID",
        FRT_ERR_NO_VARIANT => c"FRT_ERR_NO_VARIANT",
        FRT_ERR_UNBOUND => c"FRT_ERR_UNBOUND",
        FRT_ERR_CAPTURE => c"FRT_ERR_CAPTURE",
        FRT_ERR_BACKEND => c"FRT_ERR_BACKEND",
        FRT_ERR_OOM => c"FRT_ERR_OOM",
        _ => c"unknown frt_status",
    };
    s.as_ptr()
}

#[unsafe(no_mangle)]
pub extern "C" fn frt_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

// Keeps the Status enum and the C constants in step.
const _: () = {
    assert!(Status::Ok as c_int == FRT_OK);
    assert!(Status::Invalid as c_int == FRT_ERR_INVALID);
    assert!(Status::NoVariant as c_int == FRT_ERR_NO_VARIANT);
    assert!(Status::Unbound as c_int == FRT_ERR_UNBOUND);
    assert!(Status::Capture as c_int == FRT_ERR_CAPTURE);
    assert!(Status::Backend as c_int == FRT_ERR_BACKEND);
    assert!(Status::Oom as c_int == FRT_ERR_OOM);
};
