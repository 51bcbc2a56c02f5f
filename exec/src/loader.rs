//! `Loader`: set-up writes of large data (model weights) through a small ring of staging
//! slots, pinned on CUDA, so that the host fills one slot while the device copies the ones
//! before it.

use crate::ctx::Device;
use crate::error::{Error, Result};
use crate::{Buffer, Ctx, Event, Stream};

struct Slot {
    ptr: *mut u8,
    /// Marks the end of the last device copy out of this slot.
    done: Option<Event>,
}

/// A ring of staging slots for writing large data into buffers (see the module docs).
///
/// [`slot`](Self::slot) hands out the next slot, once the device has finished copying out of
/// it; the caller fills it (a plain copy, or a conversion, on as many threads as it likes) and
/// [`send`](Self::send)s a prefix of it into a buffer: the copy is enqueued on the stream and
/// `send` returns at once. A slot that is not sent is handed out again. On CUDA the slots are
/// page-locked, so the copies run at the link's speed without the driver staging pageable
/// memory; on the host backend `send` copies at once, after the stream's earlier work.
/// Memory: `slots × slot_bytes` of host memory, freed (after the pending copies) on drop.
/// Not capturable.
pub struct Loader {
    ctx: Ctx,
    slot_bytes: usize,
    slots: Vec<Slot>,
    next: usize,
}

// SAFETY: the slots are plain host memory owned by the loader and only reached through
// `&mut self`; the pointers are addresses.
unsafe impl Send for Loader {}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("slot_bytes", &self.slot_bytes)
            .field("slots", &self.slots.len())
            .finish()
    }
}

impl Loader {
    /// A loader with `slots` (at least 1) slots of `slot_bytes` (at least 1) each.
    pub fn new(ctx: &Ctx, slot_bytes: usize, slots: usize) -> Result<Loader> {
        if slot_bytes == 0 || slots == 0 {
            return Err(Error::invalid(
                "Loader::new",
                "a loader needs at least one slot of at least one byte",
            ));
        }
        let mut l = Loader {
            ctx: ctx.clone(),
            slot_bytes,
            slots: Vec::with_capacity(slots),
            next: 0,
        };
        for _ in 0..slots {
            let ptr = crate::host_buffer::alloc_host(ctx, "loader slot", slot_bytes)?;
            // Pushed at once: drop frees what was allocated when a later slot fails.
            l.slots.push(Slot { ptr, done: None });
        }
        Ok(l)
    }

    /// The context the slots belong to.
    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    /// The size of one slot: the most one [`send`](Self::send) writes.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// The next slot, once the device has finished copying out of it (its previous contents
    /// are unspecified).
    pub fn slot(&mut self) -> Result<&mut [u8]> {
        let slot = &mut self.slots[self.next];
        if let Some(ev) = &slot.done {
            ev.synchronize()?;
        }
        // SAFETY: `slot_bytes` bytes allocated in `new`, no copy out of them pending (waited
        // above), reached only through `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts_mut(slot.ptr, self.slot_bytes) })
    }

    /// Copies the first `len` bytes of the slot [`slot`](Self::slot) handed out into
    /// `dst[offset..]`, ordered on `s`; the next `slot` is the one after it.
    pub fn send(&mut self, s: Stream, dst: &Buffer, offset: usize, len: usize) -> Result<()> {
        if len > self.slot_bytes {
            return Err(Error::invalid(
                "Loader::send",
                format!("{len} bytes from a slot of {}", self.slot_bytes),
            ));
        }
        if !self.ctx.same(dst.ctx()) {
            return Err(Error::invalid(
                "Loader::send",
                "the buffer belongs to another context",
            ));
        }
        if self.ctx.is_capturing(s) {
            return Err(Error::invalid(
                "Loader::send",
                "set-up writes cannot be captured; write weights before capturing",
            ));
        }
        let slot = &mut self.slots[self.next];
        if let Some(ev) = &slot.done {
            // `slot` waited already unless the caller skipped it.
            ev.synchronize()?;
        }
        match &self.ctx.inner.device {
            Device::Host(_) => {
                // SAFETY: the slot holds `slot_bytes` ≥ `len` bytes; nothing else uses it.
                let data = unsafe { std::slice::from_raw_parts(slot.ptr, len) };
                dst.load(s, offset, data)?;
            }
            Device::Cuda(c) => {
                crate::buffer::check_range("loader send", dst, offset, len)?;
                if len > 0 {
                    let raw = self.ctx.inner.raw_stream(s)?;
                    // SAFETY: the range was checked against the live buffer; the slot is
                    // page-locked and untouched until `done` (recorded next) completes.
                    unsafe { c.copy_htod(dst.ptr() + offset as u64, slot.ptr, len, raw as _)? };
                    if slot.done.is_none() {
                        slot.done = Some(self.ctx.event()?);
                    }
                    slot.done.as_ref().expect("created above").record(s)?;
                }
            }
        }
        self.next = (self.next + 1) % self.slots.len();
        Ok(())
    }

    /// Waits for every copy the loader enqueued.
    pub fn finish(&mut self) -> Result<()> {
        for slot in &self.slots {
            if let Some(ev) = &slot.done {
                ev.synchronize()?;
            }
        }
        Ok(())
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        for slot in self.slots.drain(..) {
            // Page-locked memory must not be freed under a running copy (host-backend sends
            // are done when `send` returns).
            if let (Device::Cuda(_), Some(ev)) = (&self.ctx.inner.device, &slot.done) {
                if let Err(e) = ev.synchronize() {
                    self.ctx.inner.defer_error(e);
                    // Leaked rather than freed under a copy that may still run.
                    continue;
                }
            }
            // SAFETY: from `alloc_host` in `new`; its last copy completed.
            if let Err(e) =
                unsafe { crate::host_buffer::free_host(&self.ctx, slot.ptr, self.slot_bytes) }
            {
                self.ctx.inner.defer_error(e);
            }
        }
    }
}
