//! # frt-exec — the execution contract
//!
//! The seam every model and the robot loop run through.
//!
//! **What it IS** — mechanism only:
//! * [`Buffer`]: named device memory with a stable address (allocated or wrapped),
//!   device-to-device copies on a stream, host upload/download through staging memory;
//! * [`Graph`]: a table of [`ShapeKey`] → captured (or adopted) executable graph, with named
//!   ports that let two graphs share a buffer without a copy, LRU-bounded;
//! * [`Plan`]: a dumb DAG of graph replays across streams, ordered by events;
//! * streams with priorities, [`Event`]s, and a [`Ctx`] that owns them;
//! * for benchmarks, [`kernel_trace`]: what ran on the device and when, as CUPTI records it.
//!
//! **What it is NOT**: it knows nothing of kernels, models, robots, sessions or schedules.
//! Which graph runs when, on which priority, and when to evict are the caller's policy.
//!
//! Two backends behind the same API: **CUDA** (the driver API, loaded at run time) and
//! **host** (one executor thread per context plays the device; host operations are the
//! "kernels"). The host backend is the reference every CUDA result is checked against.
//!
//! ```
//! use frt_exec::{Buffer, Ctx, Graph, ShapeKey};
//! let ctx = Ctx::host()?;
//! let s = ctx.stream(-1)?;
//! let x = Buffer::alloc(&ctx, "x", 16)?;
//! x.write(s, 0, &[1.0f32, 2.0, 3.0, 4.0])?;
//! let g = Graph::new(&ctx, "double", 0);
//! g.bind("x", &x)?;
//! g.capture(ShapeKey(4), |cs| {
//!     let x = g.port("x")?;
//!     let p = x.ptr() as usize;
//!     ctx.launch_host(cs, move || {
//!         // SAFETY: `x` (kept alive by the graph) holds 4 f32s; stream order excludes races.
//!         let v = unsafe { std::slice::from_raw_parts_mut(p as *mut f32, 4) };
//!         v.iter_mut().for_each(|e| *e *= 2.0);
//!         Ok(())
//!     })
//! })?;
//! g.replay(ShapeKey(4), s)?;
//! g.replay(ShapeKey(4), s)?;
//! assert_eq!(x.to_vec::<f32>(s)?, vec![4.0, 8.0, 12.0, 16.0]);
//! assert!(g.replay(ShapeKey(5), s).is_err()); // no variant: an error, never a no-op
//! # Ok::<(), frt_exec::Error>(())
//! ```

mod backend;
mod buffer;
mod ctx;
mod error;
mod event;
mod file;
mod graph;
mod host_buffer;
pub mod kernel_trace;
mod key;
mod loader;
mod lru;
mod plan;

pub use buffer::{Buffer, Pod, WeakBuffer};
pub use ctx::{BackendKind, Ctx, MAX_STREAMS, Stream};
pub use error::{DriverCode, Error, HostOpError, Result, Status};
pub use event::Event;
pub use file::write_whole;
pub use graph::{CaptureError, Graph};
pub use host_buffer::HostBuffer;
pub use key::ShapeKey;
pub use loader::Loader;
pub use plan::{NodeId, Plan};

/// Re-exported so that crates launching their own CUDA work use the same cudarc.
pub use cudarc;
