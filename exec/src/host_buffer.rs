//! `HostBuffer`: host memory that buffers are written from without a staging copy.

use crate::ctx::Device;
use crate::error::{DriverCode, Error, Result};
use crate::{Buffer, Ctx, Event, Stream};
use std::alloc::Layout;
use std::sync::{Arc, Mutex};

/// Alignment of the host backend's allocations of host memory.
const HOST_ALIGN: usize = 256;

/// `bytes` (at least 1) of host memory that device copies read and write: page-locked on CUDA
/// (copies run asynchronously at the link's speed), aligned plain memory on the host backend.
/// `name` names it in the error.
pub(crate) fn alloc_host(ctx: &Ctx, name: &str, bytes: usize) -> Result<*mut u8> {
    let oom = |code| Error::OutOfMemory {
        name: name.to_string(),
        bytes,
        code,
    };
    match &ctx.inner.device {
        Device::Host(_) => {
            let layout = Layout::from_size_align(bytes, HOST_ALIGN).map_err(|_| oom(None))?;
            if bytes == 0 {
                return Err(oom(None));
            }
            // SAFETY: non-zero size (checked above).
            let p = unsafe { std::alloc::alloc(layout) };
            if p.is_null() {
                return Err(oom(None));
            }
            Ok(p)
        }
        Device::Cuda(c) => c
            .alloc_pinned(bytes)
            .map_err(|code| oom(Some(DriverCode(code)))),
    }
}

/// Frees host memory from [`alloc_host`].
///
/// # Safety
/// `ptr` came from `alloc_host(ctx, _, bytes)`, is not freed yet, and no copy out of or into
/// it is pending.
pub(crate) unsafe fn free_host(ctx: &Ctx, ptr: *mut u8, bytes: usize) -> Result<()> {
    match &ctx.inner.device {
        Device::Host(_) => {
            let layout =
                Layout::from_size_align(bytes, HOST_ALIGN).expect("layout was valid at allocation");
            // SAFETY: allocated with this layout (the caller's promise).
            unsafe { std::alloc::dealloc(ptr, layout) };
            Ok(())
        }
        // SAFETY: from `alloc_pinned` (the caller's promise).
        Device::Cuda(c) => unsafe { c.free_pinned(ptr) },
    }
}

pub(crate) struct HostBufferInner {
    ctx: Ctx,
    name: String,
    ptr: *mut u8,
    bytes: usize,
    /// Marks the end of the last device copy out of the memory, and the stream it was
    /// recorded on, once there was one (the event is made with the memory: an upload
    /// allocates nothing).
    last_copy: Mutex<(Event, Option<Stream>)>,
}

// SAFETY: the memory is written only through `&mut HostBuffer` after its copies completed,
// and read by copies and `&HostBuffer`; the pointer is an address.
unsafe impl Send for HostBufferInner {}
// SAFETY: as above.
unsafe impl Sync for HostBufferInner {}

/// Host memory the device copies from without staging it (page-locked on CUDA, plain memory
/// on the host backend), for data written on one thread and uploaded on another: a camera
/// frame decoded by an I/O thread straight into it, then [`Buffer::upload_from`] enqueues
/// the copy — the uploading thread copies no bytes itself.
///
/// Writing needs `&mut` ([`write`](Self::write)), which first waits for the copies out of the
/// memory that are still pending; share a `HostBuffer` behind an `Arc` and write it once the
/// `Arc` is unique again (`Arc::get_mut`). Dropping it waits for its pending copies.
pub struct HostBuffer(Arc<HostBufferInner>);

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer")
            .field("name", &self.0.name)
            .field("bytes", &self.0.bytes)
            .finish()
    }
}

impl HostBuffer {
    /// `bytes` (at least 1) of host memory, zeroed, named `name` in errors.
    pub fn alloc(ctx: &Ctx, name: &str, bytes: usize) -> Result<HostBuffer> {
        if bytes == 0 {
            return Err(Error::invalid(
                "HostBuffer::alloc",
                format!("`{name}`: a host buffer needs at least one byte"),
            ));
        }
        let ptr = alloc_host(ctx, name, bytes)?;
        // SAFETY: `bytes` bytes just allocated, not yet shared.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        let inner = HostBufferInner {
            ctx: ctx.clone(),
            name: name.to_string(),
            ptr,
            bytes,
            last_copy: Mutex::new((ctx.event()?, None)),
        };
        Ok(HostBuffer(Arc::new(inner)))
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub fn bytes(&self) -> usize {
        self.0.bytes
    }

    pub fn ctx(&self) -> &Ctx {
        &self.0.ctx
    }

    /// The contents (pending copies out of the memory only read it).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `bytes` bytes allocated in `alloc`; writes need `&mut self`.
        unsafe { std::slice::from_raw_parts(self.0.ptr, self.0.bytes) }
    }

    /// The contents for writing, once the device copies still pending out of the memory have
    /// finished (waits for them).
    pub fn write(&mut self) -> Result<&mut [u8]> {
        let last = self.0.last_copy.lock().unwrap_or_else(|p| p.into_inner());
        if last.1.is_some() {
            last.0.synchronize()?;
        }
        drop(last);
        // SAFETY: `bytes` bytes allocated in `alloc`; no copy out of them is pending (waited
        // above) and none can be enqueued while `self` is borrowed mutably.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.0.ptr, self.0.bytes) })
    }
}

impl Buffer {
    /// Copies `src[src_offset..src_offset + len]` into `self[offset..]`, asynchronously on
    /// `s`: the call only enqueues the copy (no staging copy on the host), and `src` cannot
    /// be written until the copy has run ([`HostBuffer::write`] waits for it). Not capturable.
    pub fn upload_from(
        &self,
        s: Stream,
        offset: usize,
        src: &HostBuffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        crate::buffer::check_range("upload_from", self, offset, len)?;
        let ctx = self.ctx();
        if !ctx.same(src.ctx()) {
            return Err(Error::invalid(
                "Buffer::upload_from",
                format!("host buffer `{}` belongs to another context", src.name()),
            ));
        }
        if src_offset
            .checked_add(len)
            .is_none_or(|end| end > src.bytes())
        {
            return Err(Error::invalid(
                "Buffer::upload_from",
                format!(
                    "{len} bytes from {src_offset} of host buffer `{}` ({} bytes)",
                    src.name(),
                    src.bytes()
                ),
            ));
        }
        if ctx.is_capturing(s) {
            return Err(Error::invalid(
                "Buffer::upload_from",
                "uploads cannot be captured; write inputs before replaying",
            ));
        }
        if len == 0 {
            return Ok(());
        }
        ctx.inner.raw_stream(s)?; // an unknown stream is refused before any work
        let mut last = src.0.last_copy.lock().unwrap_or_else(|p| p.into_inner());
        // A copy still pending on another stream: this one is ordered after it, so that the
        // event recorded below marks the end of every copy out of the memory (on the same
        // stream, the stream's order does that already).
        if last.1.is_some_and(|prev| prev != s) {
            last.0.wait_on(s)?;
        }
        // SAFETY: both ranges were checked; the host buffer is not written until the event
        // recorded below completes (`write` waits), and outlives the copy: on the host backend
        // the enqueued operation holds it, on CUDA dropping it waits for the event.
        unsafe {
            self.enqueue_htod(
                s,
                offset,
                src.0.ptr.add(src_offset),
                len,
                Some(src.0.clone()),
            )?
        };
        last.1 = Some(s);
        last.0.record(s)
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // On the host backend a pending copy holds the memory; on CUDA it must not be freed
        // under a running copy.
        let last = self.0.last_copy.lock().unwrap_or_else(|p| p.into_inner());
        if let (Device::Cuda(_), (ev, Some(_))) = (&self.0.ctx.inner.device, &*last) {
            if let Err(e) = ev.synchronize() {
                self.0.ctx.inner.defer_error(e);
                // Leaked rather than freed under a copy that may still run.
                std::mem::forget(self.0.clone());
            }
        }
    }
}

impl Drop for HostBufferInner {
    fn drop(&mut self) {
        // SAFETY: from `alloc_host` in `alloc`; the last handle is gone, and its copies
        // completed (`HostBuffer`'s drop waited on CUDA; on the host backend a pending copy
        // holds a handle).
        if let Err(e) = unsafe { free_host(&self.ctx, self.ptr, self.bytes) } {
            self.ctx.inner.defer_error(e);
        }
    }
}
