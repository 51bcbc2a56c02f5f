//! `Buffer`: named device memory with a stable address.

use crate::backend::host::HostOp;
use crate::ctx::Device;
use crate::error::{DriverCode, Error, Result};
use crate::{Ctx, Event, Stream};
use std::alloc::Layout;
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Alignment of host-backend allocations (what `cuMemAlloc` guarantees is larger still).
const HOST_ALIGN: usize = 256;

static NEXT_BUFFER_ID: AtomicU64 = AtomicU64::new(1);

/// Host staging memory of a buffer (pinned on CUDA), allocated on first use, the event that
/// marks the end of its last copy, and (the read-back area's) the range an enqueued download
/// copied into it that is not collected yet.
struct Staging {
    ptr: *mut u8,
    last_copy: Option<Event>,
    download: Option<(usize, usize)>,
}

impl Default for Staging {
    fn default() -> Self {
        Staging {
            ptr: std::ptr::null_mut(),
            last_copy: None,
            download: None,
        }
    }
}

pub(crate) struct BufferInner {
    ctx: Ctx,
    id: u64,
    name: String,
    ptr: u64,
    bytes: usize,
    owned: bool,
    /// Uploads' and blocking downloads' staging memory.
    staging: Mutex<Staging>,
    /// Enqueued downloads' ([`Buffer::download_async`]): apart, so that neither kind of copy
    /// waits for the other's (a blocking download on another stream never waits behind work
    /// that an enqueued one is queued after).
    readback: Mutex<Staging>,
}

// SAFETY: the buffer's memory is only reached through stream-ordered operations or through
// the staging area, which a mutex guards; the raw pointers are plain addresses.
unsafe impl Send for BufferInner {}
// SAFETY: as above.
unsafe impl Sync for BufferInner {}

/// Named device memory (host memory on the host backend) with a stable address.
///
/// A `Buffer` is a cheap handle (clone = same memory). Memory that `exec` allocated is freed
/// when the last handle is dropped; graphs whose captured work used a buffer hold a handle.
/// Wrapped memory is never freed by `exec`.
///
/// The contents are reached only through work enqueued on streams (copies, kernels, host
/// operations) or the `upload`/`download` helpers, so their order is the streams' order.
#[derive(Clone)]
pub struct Buffer(pub(crate) Arc<BufferInner>);

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("name", &self.0.name)
            .field("bytes", &self.0.bytes)
            .field("ptr", &format_args!("{:#x}", self.0.ptr))
            .field("owned", &self.0.owned)
            .finish()
    }
}

/// A non-owning handle of a [`Buffer`] (e.g. to observe when its memory is released).
#[derive(Clone)]
pub struct WeakBuffer(std::sync::Weak<BufferInner>);

impl WeakBuffer {
    pub fn upgrade(&self) -> Option<Buffer> {
        self.0.upgrade().map(Buffer)
    }

    /// Whether some handle (a caller's, or a graph's) still keeps the buffer alive.
    pub fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }
}

/// Plain numeric types that can be copied to and from a buffer byte for byte.
pub trait Pod: Copy + Send + Sync + 'static + sealed::Sealed {}
mod sealed {
    pub trait Sealed {}
}
macro_rules! pod {
    ($($t:ty),*) => { $(impl sealed::Sealed for $t {} impl Pod for $t {})* };
}
pod!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

fn as_bytes<T: Pod>(v: &[T]) -> &[u8] {
    // SAFETY: `Pod` types have no padding and every byte pattern is readable.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

fn as_bytes_mut<T: Pod>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: `Pod` types are valid for every byte pattern.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

/// The byte range of `n` values of `T` from element `at`.
fn typed_range<T>(op: &'static str, at: usize, n: usize) -> Result<(usize, usize)> {
    at.checked_mul(size_of::<T>())
        .zip(n.checked_mul(size_of::<T>()))
        .ok_or_else(|| Error::invalid(op, "range overflows"))
}

pub(crate) fn check_range(op: &'static str, b: &Buffer, offset: usize, bytes: usize) -> Result<()> {
    match offset.checked_add(bytes) {
        Some(end) if end <= b.0.bytes => Ok(()),
        _ => Err(Error::OutOfRange {
            op,
            buffer: b.0.name.clone(),
            size: b.0.bytes,
            offset,
            bytes,
        }),
    }
}

impl Buffer {
    /// Allocates `bytes` (> 0) of device memory (zeroed on the host backend only).
    pub fn alloc(ctx: &Ctx, name: &str, bytes: usize) -> Result<Buffer> {
        if bytes == 0 {
            return Err(Error::invalid(
                "Buffer::alloc",
                format!("buffer `{name}` must have at least one byte"),
            ));
        }
        let oom = |code| Error::OutOfMemory {
            name: name.to_string(),
            bytes,
            code,
        };
        let ptr = match &ctx.inner.device {
            Device::Host(_) => {
                let layout = Layout::from_size_align(bytes, HOST_ALIGN).map_err(|_| oom(None))?;
                // SAFETY: `layout` has a non-zero size.
                let p = unsafe { std::alloc::alloc_zeroed(layout) };
                if p.is_null() {
                    return Err(oom(None));
                }
                p as u64
            }
            Device::Cuda(c) => c.alloc(bytes).map_err(|code| oom(Some(DriverCode(code))))?,
        };
        Ok(Buffer::from_parts(ctx, name, ptr, bytes, true))
    }

    /// Wraps memory owned elsewhere (a device pointer on CUDA, e.g. a torch tensor's
    /// `data_ptr`; a host pointer on the host backend). `exec` never frees it. A size of 0 is
    /// allowed (as FlashRT's): such a buffer names an address and no bytes, so every copy or
    /// transfer of one or more bytes to or from it is refused.
    ///
    /// # Safety
    /// `ptr` points to `bytes` bytes of memory of this context's device, which stay valid as
    /// long as the buffer (or any graph that used it) lives.
    pub unsafe fn wrap(ctx: &Ctx, name: &str, ptr: *mut c_void, bytes: usize) -> Result<Buffer> {
        if ptr.is_null() {
            return Err(Error::invalid(
                "Buffer::wrap",
                format!("buffer `{name}` needs a non-null pointer"),
            ));
        }
        Ok(Buffer::from_parts(ctx, name, ptr as u64, bytes, false))
    }

    fn from_parts(ctx: &Ctx, name: &str, ptr: u64, bytes: usize, owned: bool) -> Buffer {
        Buffer(Arc::new(BufferInner {
            ctx: ctx.clone(),
            id: NEXT_BUFFER_ID.fetch_add(1, Ordering::Relaxed),
            name: name.to_string(),
            ptr,
            bytes,
            owned,
            staging: Mutex::new(Staging::default()),
            readback: Mutex::new(Staging::default()),
        }))
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub fn bytes(&self) -> usize {
        self.0.bytes
    }

    /// The stable address: a `CUdeviceptr` on CUDA, a host address on the host backend.
    pub fn ptr(&self) -> u64 {
        self.0.ptr
    }

    pub fn ctx(&self) -> &Ctx {
        &self.0.ctx
    }

    /// Whether `exec` allocated (and will free) this memory.
    pub fn is_owned(&self) -> bool {
        self.0.owned
    }

    /// Identity: two handles of the same buffer have the same id.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// Enqueues a copy of `bytes` from `src[src_off..]` to `dst[dst_off..]` on `s`
    /// (device to device, asynchronous). Ranges outside either buffer are rejected.
    pub fn copy(
        dst: &Buffer,
        dst_off: usize,
        src: &Buffer,
        src_off: usize,
        bytes: usize,
        s: Stream,
    ) -> Result<()> {
        let ctx = &dst.0.ctx;
        if !ctx.same(&src.0.ctx) {
            return Err(Error::invalid(
                "Buffer::copy",
                "source and destination belong to different contexts",
            ));
        }
        check_range("copy (destination)", dst, dst_off, bytes)?;
        check_range("copy (source)", src, src_off, bytes)?;
        let raw = ctx.inner.raw_stream(s)?;
        if bytes == 0 {
            return Ok(());
        }
        ctx.retain(s, dst);
        ctx.retain(s, src);
        let (d, sp) = (dst.0.ptr + dst_off as u64, src.0.ptr + src_off as u64);
        match &ctx.inner.device {
            Device::Host(h) => h.enqueue(
                s,
                HostOp::Memcpy {
                    dst: d as usize,
                    src: sp as usize,
                    bytes,
                    _keep: [Some(dst.clone()), Some(src.clone())],
                    _host: None,
                },
            ),
            // SAFETY: both ranges were checked against live allocations, which the caller's
            // handles (and, while capturing, the graph) keep alive.
            Device::Cuda(c) => unsafe { c.copy_dtod(d, sp, bytes, raw as _) },
        }
    }

    /// Copies `data` from the host into `self[offset..]`, asynchronously on `s`: `data` is
    /// first copied into this buffer's staging memory (pinned on CUDA, allocated on first
    /// use), so the call returns before the device copy runs. A second upload waits for the
    /// first one's device copy to finish before reusing the staging memory. Not capturable.
    pub fn upload(&self, s: Stream, offset: usize, data: &[u8]) -> Result<()> {
        self.upload_parts(s, offset, &[data])
    }

    /// Set-up write of data written once (weights): copies `data` into `self[offset..]` in
    /// order on `s` and returns once `data` may be reused or dropped. Unlike
    /// [`Buffer::upload`] it keeps no staging memory, so loading a model costs the host no
    /// second copy of it. On CUDA the driver stages the pageable `data` itself; on the host
    /// backend the call waits for the work already enqueued on `s`, then copies. Not
    /// capturable.
    pub fn load(&self, s: Stream, offset: usize, data: &[u8]) -> Result<()> {
        check_range("load", self, offset, data.len())?;
        let ctx = &self.0.ctx;
        let raw = ctx.inner.raw_stream(s)?;
        if ctx.is_capturing(s) {
            return Err(Error::invalid(
                "Buffer::load",
                "loads cannot be captured; write weights before capturing",
            ));
        }
        if data.is_empty() {
            return Ok(());
        }
        let dst = self.0.ptr + offset as u64;
        match &ctx.inner.device {
            Device::Host(h) => {
                h.sync_stream(s)?;
                // SAFETY: the range was checked against this live allocation; nothing enqueued
                // on `s` is still running, and the host backend's memory is plain host memory.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len()) };
                Ok(())
            }
            // SAFETY: the range was checked; from pageable memory the driver copies `data` into
            // its own staging memory before the call returns, so `data` may then be reused.
            Device::Cuda(c) => unsafe { c.copy_htod(dst, data.as_ptr(), data.len(), raw as _) },
        }
    }

    /// Like [`Buffer::upload`] for data in several pieces, placed one after another from
    /// `offset`: one copy into the staging memory and one device copy for all of them.
    pub fn upload_parts(&self, s: Stream, offset: usize, parts: &[&[u8]]) -> Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        check_range("upload", self, offset, len)?;
        let ctx = &self.0.ctx;
        ctx.inner.raw_stream(s)?; // an unknown stream is refused before any work
        if ctx.is_capturing(s) {
            return Err(Error::invalid(
                "Buffer::upload",
                "uploads cannot be captured; write inputs before replaying",
            ));
        }
        if len == 0 {
            return Ok(());
        }
        let mut st = self.staging()?;
        if let Some(ev) = &st.last_copy {
            ev.synchronize()?;
        }
        let mut at = offset;
        for p in parts {
            // SAFETY: staging has `self.bytes` bytes; the whole range was checked; no copy out
            // of the staging memory is pending (waited above).
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), st.ptr.add(at), p.len()) };
            at += p.len();
        }
        // SAFETY: the range was checked; pinned staging memory stays untouched until
        // `last_copy` (marked next) completes, and lives as long as this buffer, which a
        // host-backend copy holds.
        unsafe { self.enqueue_htod(s, offset, st.ptr.add(offset), len, None)? };
        self.mark_staging(&mut st, s)
    }

    /// Enqueues a copy of `len` bytes from the host address `src` into `self[offset..]` on
    /// `s`: on the host backend an operation that holds this buffer and `hold`, on CUDA an
    /// asynchronous copy.
    ///
    /// # Safety
    /// The range was checked against this buffer; `src` holds `len` bytes that stay valid and
    /// unwritten until the copy has run (on the host backend, as long as `hold` or this buffer
    /// lives).
    pub(crate) unsafe fn enqueue_htod(
        &self,
        s: Stream,
        offset: usize,
        src: *const u8,
        len: usize,
        hold: Option<Arc<crate::host_buffer::HostBufferInner>>,
    ) -> Result<()> {
        let ctx = &self.0.ctx;
        let dst = self.0.ptr + offset as u64;
        match &ctx.inner.device {
            Device::Host(h) => h.enqueue(
                s,
                HostOp::Memcpy {
                    dst: dst as usize,
                    src: src as usize,
                    bytes: len,
                    _keep: [Some(self.clone()), None],
                    _host: hold,
                },
            ),
            // SAFETY: the caller's promise.
            Device::Cuda(c) => unsafe { c.copy_htod(dst, src, len, ctx.inner.raw_stream(s)? as _) },
        }
    }

    /// Copies `self[offset..offset + out.len()]` to the host after the work enqueued on `s`;
    /// blocks until the data is there.
    pub fn download(&self, s: Stream, offset: usize, out: &mut [u8]) -> Result<()> {
        let raw = self.check_download(s, offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let mut st = self.staging()?;
        self.enqueue_download(&mut st, s, raw, offset, out.len())?;
        Self::collect_staged(&mut st, offset, out)
    }

    /// Enqueues a copy of `self[offset..offset + len]` to the host after the work enqueued on
    /// `s`, into host memory of this buffer's kept for such copies (pinned on CUDA; apart from
    /// the memory uploads and [`download`](Self::download) stage through, so neither waits
    /// for the other), and returns at once: the copy runs in stream order, and
    /// [`collect_download`](Self::collect_download) reads it (waiting for it if it has not run
    /// yet), so a thread that collects once it knows the stream's work done pays no wait for
    /// the copy. The next `download_async` replaces one not collected yet (after waiting for
    /// its copy). Not capturable.
    pub fn download_async(&self, s: Stream, offset: usize, len: usize) -> Result<()> {
        let raw = self.check_download(s, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let mut st = self.area(&self.0.readback, "read-back")?;
        self.enqueue_download(&mut st, s, raw, offset, len)
    }

    /// Copies the data of the download enqueued last ([`download_async`](Self::download_async)
    /// of `offset..offset + out.len()`) into `out`, once its copy has run (waits for it). Each
    /// download is collected once; none pending for that range (none enqueued, collected
    /// already, or one of another range enqueued since) is an error, and `out` is left as it
    /// was.
    pub fn collect_download(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        if out.is_empty() {
            return check_range("download", self, offset, 0);
        }
        let mut st = self.0.readback.lock().unwrap_or_else(|p| p.into_inner());
        if st.download != Some((offset, out.len())) {
            let pending = match st.download {
                Some((o, n)) => format!("the download pending is of {n} bytes at {o}"),
                None => "none is pending (never enqueued, or collected already)".to_string(),
            };
            return Err(Error::invalid(
                "Buffer::collect_download",
                format!(
                    "`{}`: no download of {} bytes at {offset} to collect: {pending}",
                    self.0.name,
                    out.len()
                ),
            ));
        }
        Self::collect_staged(&mut st, offset, out)
    }

    /// A download's checks (range, stream, not capturing); the stream's handle.
    fn check_download(&self, s: Stream, offset: usize, len: usize) -> Result<usize> {
        check_range("download", self, offset, len)?;
        let ctx = &self.0.ctx;
        let raw = ctx.inner.raw_stream(s)?;
        if ctx.is_capturing(s) {
            return Err(Error::invalid(
                "Buffer::download",
                "downloads cannot be captured",
            ));
        }
        Ok(raw)
    }

    /// Enqueues the copy of a checked, non-empty range into the staging area `st` on `s` and
    /// marks it as the download pending there.
    fn enqueue_download(
        &self,
        st: &mut Staging,
        s: Stream,
        raw: usize,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        if let Some(ev) = &st.last_copy {
            ev.synchronize()?;
        }
        st.download = None;
        let stage = st.ptr as u64 + offset as u64;
        match &self.0.ctx.inner.device {
            Device::Host(h) => h.enqueue(
                s,
                HostOp::Memcpy {
                    dst: stage as usize,
                    src: (self.0.ptr + offset as u64) as usize,
                    bytes: len,
                    _keep: [Some(self.clone()), None],
                    _host: None,
                },
            )?,
            // SAFETY: the range was checked; the staging area is not read until `last_copy`
            // (marked next) completes, nor written before it (every copy into it waits for
            // the one before first), and lives as long as this buffer, whose drop waits for it.
            Device::Cuda(c) => unsafe {
                c.copy_dtoh(stage as *mut u8, self.0.ptr + offset as u64, len, raw as _)?
            },
        }
        self.mark_staging(st, s)?;
        st.download = Some((offset, len));
        Ok(())
    }

    /// Waits for the pending download's copy and copies its bytes out of the staging memory.
    fn collect_staged(st: &mut Staging, offset: usize, out: &mut [u8]) -> Result<()> {
        st.last_copy
            .as_ref()
            .expect("a download marks the staging")
            .synchronize()?;
        st.download = None;
        // SAFETY: the copy into the staging memory has completed; the range was checked when
        // it was enqueued.
        unsafe {
            std::ptr::copy_nonoverlapping(
                st.ptr.add(offset) as *const u8,
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// [`upload`](Self::upload) of a typed slice at element offset `at`.
    pub fn write<T: Pod>(&self, s: Stream, at: usize, data: &[T]) -> Result<()> {
        let offset = at
            .checked_mul(size_of::<T>())
            .ok_or_else(|| Error::invalid("Buffer::write", "offset overflows"))?;
        self.upload(s, offset, as_bytes(data))
    }

    /// [`download`](Self::download) into a typed slice from element offset `at`.
    pub fn read<T: Pod>(&self, s: Stream, at: usize, out: &mut [T]) -> Result<()> {
        let offset = at
            .checked_mul(size_of::<T>())
            .ok_or_else(|| Error::invalid("Buffer::read", "offset overflows"))?;
        self.download(s, offset, as_bytes_mut(out))
    }

    /// [`download_async`](Self::download_async) of `n` values of `T` from element offset `at`,
    /// for [`collect`](Self::collect).
    pub fn read_async<T: Pod>(&self, s: Stream, at: usize, n: usize) -> Result<()> {
        let (offset, len) = typed_range::<T>("Buffer::read_async", at, n)?;
        self.download_async(s, offset, len)
    }

    /// [`collect_download`](Self::collect_download) into a typed slice from element offset
    /// `at`: the values a [`read_async`](Self::read_async) of the same range copied.
    pub fn collect<T: Pod>(&self, at: usize, out: &mut [T]) -> Result<()> {
        let (offset, _) = typed_range::<T>("Buffer::collect", at, out.len())?;
        self.collect_download(offset, as_bytes_mut(out))
    }

    /// Downloads the whole buffer as `T`s (allocates; for tests and tools).
    pub fn to_vec<T: Pod + Default>(&self, s: Stream) -> Result<Vec<T>> {
        let mut v = vec![T::default(); self.0.bytes / size_of::<T>()];
        self.read(s, 0, &mut v)?;
        Ok(v)
    }

    /// A handle that does not keep the buffer alive.
    pub fn downgrade(&self) -> WeakBuffer {
        WeakBuffer(Arc::downgrade(&self.0))
    }

    fn staging(&self) -> Result<std::sync::MutexGuard<'_, Staging>> {
        self.area(&self.0.staging, "staging")
    }

    /// A staging area of this buffer, locked, its memory allocated on first use.
    fn area<'a>(
        &'a self,
        area: &'a Mutex<Staging>,
        what: &str,
    ) -> Result<std::sync::MutexGuard<'a, Staging>> {
        let mut st = area.lock().unwrap_or_else(|p| p.into_inner());
        if st.ptr.is_null() {
            let name = format!("{} ({what})", self.0.name);
            st.ptr = crate::host_buffer::alloc_host(&self.0.ctx, &name, self.0.bytes)?;
        }
        Ok(st)
    }

    fn mark_staging(&self, st: &mut Staging, s: Stream) -> Result<()> {
        if st.last_copy.is_none() {
            st.last_copy = Some(self.0.ctx.event()?);
        }
        st.last_copy.as_ref().expect("created above").record(s)
    }
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        for area in [&mut self.staging, &mut self.readback] {
            let staging = area.get_mut().unwrap_or_else(|p| p.into_inner());
            let last_copy = staging.last_copy.take();
            // On the host backend every pending copy holds a handle, so none is left here. On
            // CUDA the pinned staging memory must not be freed under a running copy.
            if let (Device::Cuda(_), Some(ev)) = (&self.ctx.inner.device, last_copy) {
                if let Err(e) = ev.synchronize() {
                    self.ctx.inner.defer_error(e);
                }
            }
            if !staging.ptr.is_null() {
                // SAFETY: from `alloc_host` in `area()`; its last copy completed (synchronized
                // above on CUDA; on the host backend every pending copy holds a handle).
                if let Err(e) =
                    unsafe { crate::host_buffer::free_host(&self.ctx, staging.ptr, self.bytes) }
                {
                    self.ctx.inner.defer_error(e);
                }
            }
        }
        if !self.owned {
            return;
        }
        match &self.ctx.inner.device {
            Device::Host(_) => {
                let layout = Layout::from_size_align(self.bytes, HOST_ALIGN)
                    .expect("layout was valid at allocation");
                // SAFETY: allocated in `alloc` with this layout; no operation holds the buffer
                // any more (they hold handles).
                unsafe { std::alloc::dealloc(self.ptr as *mut u8, layout) };
            }
            Device::Cuda(c) => {
                // SAFETY: from `alloc`; graphs that used it hold handles, so none is left.
                // cuMemFree waits for pending work on the memory.
                if let Err(e) = unsafe { c.free(self.ptr) } {
                    self.ctx.inner.defer_error(e);
                }
            }
        }
    }
}
