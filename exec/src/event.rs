//! `Event`: a point in a stream that other streams (or the host) can wait for.

use crate::backend::host::HostEventState;
use crate::ctx::Device;
use crate::error::{Error, Result};
use crate::{Ctx, Stream};
use cudarc::driver::sys::CUevent;
use std::sync::Arc;

enum Kind {
    Host(Arc<HostEventState>),
    Cuda(CUevent),
}

/// A cross-stream synchronization point. `record` marks the current end of a stream;
/// [`Ctx::stream_wait`] makes another stream wait for the latest record; `synchronize` blocks
/// the host on it. Timing events (from [`Ctx::timing_event`]) also measure elapsed time.
pub struct Event {
    ctx: Ctx,
    kind: Kind,
    timing: bool,
}

// SAFETY: a CUevent handle may be used from any thread of the process; the driver
// synchronizes access to it.
unsafe impl Send for Event {}
// SAFETY: as above; `Event` has no interior state of its own besides the handle.
unsafe impl Sync for Event {}

impl Event {
    pub(crate) fn new(ctx: &Ctx, timing: bool) -> Result<Event> {
        let kind = match &ctx.inner.device {
            Device::Host(_) => Kind::Host(Arc::new(HostEventState::new())),
            Device::Cuda(c) => Kind::Cuda(c.event_create(timing)?),
        };
        Ok(Event {
            ctx: ctx.clone(),
            kind,
            timing,
        })
    }

    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    pub(crate) fn check_ctx(&self, ctx: &Ctx, op: &'static str) -> Result<()> {
        if self.ctx.same(ctx) {
            Ok(())
        } else {
            Err(Error::invalid(op, "the event belongs to another context"))
        }
    }

    /// Records the event at the current end of `s`.
    pub fn record(&self, s: Stream) -> Result<()> {
        match (&self.ctx.inner.device, &self.kind) {
            (Device::Host(h), Kind::Host(e)) => h.record(e, s),
            (Device::Cuda(c), Kind::Cuda(e)) => {
                c.event_record(*e, self.ctx.inner.raw_stream(s)? as _)
            }
            _ => unreachable!("an event is made by its context's backend"),
        }
    }

    pub(crate) fn wait_on(&self, s: Stream) -> Result<()> {
        match (&self.ctx.inner.device, &self.kind) {
            (Device::Host(h), Kind::Host(e)) => h.wait_event(s, e),
            (Device::Cuda(c), Kind::Cuda(e)) => {
                c.stream_wait(self.ctx.inner.raw_stream(s)? as _, *e)
            }
            _ => unreachable!("an event is made by its context's backend"),
        }
    }

    /// Blocks the calling thread until the latest record has completed; reports the first
    /// asynchronous error since the last synchronizing call.
    pub fn synchronize(&self) -> Result<()> {
        let r = match (&self.ctx.inner.device, &self.kind) {
            (Device::Host(h), Kind::Host(e)) => h.sync_event(e),
            (Device::Cuda(c), Kind::Cuda(e)) => c.event_sync(*e),
            _ => unreachable!("an event is made by its context's backend"),
        };
        r.and(self.ctx.inner.take_async_error())
    }

    /// Whether the latest record has completed (true for an event never recorded).
    pub fn query(&self) -> Result<bool> {
        match (&self.ctx.inner.device, &self.kind) {
            (Device::Host(h), Kind::Host(e)) => Ok(h.query_event(e)),
            (Device::Cuda(c), Kind::Cuda(e)) => c.event_query(*e),
            _ => unreachable!("an event is made by its context's backend"),
        }
    }

    /// Milliseconds between `start`'s completion and this event's. Both must be timing events
    /// of the same context, recorded, and completed.
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32> {
        start.check_ctx(&self.ctx, "Event::elapsed_ms")?;
        if !self.timing || !start.timing {
            return Err(Error::invalid(
                "Event::elapsed_ms",
                "both events must be timing events",
            ));
        }
        match (&self.ctx.inner.device, &self.kind, &start.kind) {
            (Device::Host(h), Kind::Host(end), Kind::Host(begin)) => {
                if !end.is_recorded()
                    || !begin.is_recorded()
                    || !h.query_event(end)
                    || !h.query_event(begin)
                {
                    return Err(Error::invalid(
                        "Event::elapsed_ms",
                        "both events must be recorded and completed",
                    ));
                }
                Ok((end.stamp_ns() as f64 - begin.stamp_ns() as f64) as f32 / 1e6)
            }
            (Device::Cuda(c), Kind::Cuda(end), Kind::Cuda(begin)) => {
                c.event_elapsed_ms(*begin, *end)
            }
            _ => unreachable!("an event is made by its context's backend"),
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let (Device::Cuda(c), Kind::Cuda(e)) = (&self.ctx.inner.device, &self.kind) {
            // SAFETY: this handle is owned by `self` and dropped once; the driver defers the
            // destruction of an event with pending work.
            if let Err(err) = unsafe { c.event_destroy(*e) } {
                self.ctx.inner.defer_error(err);
            }
        }
    }
}
