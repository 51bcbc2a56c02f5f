//! The host backend: the reference implementation of the contract and the default where no
//! GPU exists.
//!
//! One executor thread per context plays the device. Each stream is an ordered queue. When
//! several streams have work whose turn has come, the executor takes the next operation of the
//! stream with the highest priority (most negative), and among equal priorities the one
//! submitted first. Priority is honoured between operations, never inside one: an operation
//! that is running is not preempted (exactly what a GPU does with a running kernel).
//!
//! A replayed graph is one queue entry that the executor walks operation by operation, so a
//! high-priority stream gets in between two operations of a long low-priority graph.
//! Events are sequence markers: recording one enqueues a marker that, when the executor
//! reaches it, advances the event's completed generation; a stream that waits on an event
//! cannot proceed past the wait until that generation is reached.

use crate::error::{Error, HostOpError, Result};
use crate::{Buffer, Stream};
use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

/// A host operation: the way host kernels run, captured or not.
pub(crate) type HostFn = Arc<dyn Fn() -> Result<(), HostOpError> + Send + Sync + 'static>;

/// An operation in a host stream's queue or in a recorded graph.
#[derive(Clone)]
pub(crate) enum HostOp {
    Run(HostFn),
    /// `memmove` between two host addresses; `_keep` and `_host` hold the buffers they
    /// belong to.
    Memcpy {
        dst: usize,
        src: usize,
        bytes: usize,
        _keep: [Option<Buffer>; 2],
        _host: Option<std::sync::Arc<crate::host_buffer::HostBufferInner>>,
    },
    Record {
        event: Arc<HostEventState>,
        generation: u64,
    },
    Wait {
        event: Arc<HostEventState>,
        generation: u64,
    },
}

/// What a host capture produces: the recorded operations, replayed in order.
pub(crate) struct HostGraph {
    pub ops: Vec<HostOp>,
}

/// The state behind a host event.
pub(crate) struct HostEventState {
    /// Generation of the latest `record` call (taken when it is enqueued).
    recorded: AtomicU64,
    /// Highest generation the executor has reached.
    completed: AtomicU64,
    /// Stream of the latest record.
    stream: AtomicU32,
    /// Nanoseconds since the device epoch when the latest generation completed.
    stamp_ns: AtomicU64,
}

impl HostEventState {
    pub fn new() -> Self {
        HostEventState {
            recorded: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            stream: AtomicU32::new(0),
            stamp_ns: AtomicU64::new(0),
        }
    }

    pub fn stamp_ns(&self) -> u64 {
        self.stamp_ns.load(Ordering::Acquire)
    }

    pub fn is_recorded(&self) -> bool {
        self.recorded.load(Ordering::Acquire) > 0
    }
}

enum Item {
    Op(HostOp),
    Graph { graph: Arc<HostGraph>, next: usize },
}

struct Queued {
    seq: u64,
    item: Item,
}

struct HStream {
    priority: i32,
    queue: VecDeque<Queued>,
    submitted: u64,
    completed: u64,
    capture: Option<Vec<HostOp>>,
}

struct State {
    streams: Vec<HStream>,
    seq: u64,
    error: Option<Error>,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    /// The executor waits here for work.
    work: Condvar,
    /// Waiters for progress (syncs, event waits) wait here.
    progress: Condvar,
    epoch: Instant,
}

thread_local! {
    /// Address of the `Shared` whose executor runs on this thread (0: none).
    static EXECUTOR_OF: Cell<usize> = const { Cell::new(0) };
}

/// Operations a stream queue holds before a warm-up; queues grow beyond it once, never shrink.
const QUEUE_RESERVE: usize = 256;

pub(crate) struct HostDevice {
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl HostDevice {
    pub fn new() -> Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                streams: Vec::new(),
                seq: 0,
                error: None,
                shutdown: false,
            }),
            work: Condvar::new(),
            progress: Condvar::new(),
            epoch: Instant::now(),
        });
        let s = shared.clone();
        let worker = std::thread::Builder::new()
            .name("frt-host-device".into())
            .spawn(move || executor(s))
            .map_err(|e| {
                Error::invalid(
                    "Ctx::host",
                    format!("cannot start the executor thread: {e}"),
                )
            })?;
        Ok(HostDevice {
            shared,
            worker: Mutex::new(Some(worker)),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The executor never panics while holding the lock (operations run unlocked and
        // under catch_unwind), so poisoning can only come from a bug; recover the guard.
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn on_executor(&self) -> bool {
        EXECUTOR_OF.with(|c| c.get()) == Arc::as_ptr(&self.shared) as usize
    }

    fn guard_blocking(&self, op: &'static str) -> Result<()> {
        if self.on_executor() {
            Err(Error::WouldDeadlock { op })
        } else {
            Ok(())
        }
    }

    /// Adds a stream; returns its index (equal to its `Stream` id).
    pub fn add_stream(&self, priority: i32) -> usize {
        let mut st = self.lock();
        st.streams.push(HStream {
            priority,
            queue: VecDeque::with_capacity(QUEUE_RESERVE),
            submitted: 0,
            completed: 0,
            capture: None,
        });
        st.streams.len() - 1
    }

    fn stream_mut(st: &mut State, s: Stream) -> Result<&mut HStream> {
        st.streams
            .get_mut(s.0 as usize)
            .ok_or(Error::UnknownStream(s))
    }

    /// Enqueues (or, while the stream captures, records) one operation.
    pub fn enqueue(&self, s: Stream, op: HostOp) -> Result<()> {
        let mut st = self.lock();
        let seq = st.seq;
        let hs = Self::stream_mut(&mut st, s)?;
        if let Some(rec) = hs.capture.as_mut() {
            if matches!(op, HostOp::Record { .. } | HostOp::Wait { .. }) {
                return Err(Error::invalid(
                    "event record/wait",
                    "events cannot be used on a stream that the host backend is capturing \
                     (a host graph is one ordered stream; use a Plan for cross-stream order)",
                ));
            }
            rec.push(op);
            return Ok(());
        }
        hs.queue.push_back(Queued {
            seq,
            item: Item::Op(op),
        });
        hs.submitted += 1;
        st.seq += 1;
        drop(st);
        self.shared.work.notify_one();
        Ok(())
    }

    /// Enqueues a recorded graph as one queue entry.
    pub fn enqueue_graph(&self, s: Stream, graph: &Arc<HostGraph>) -> Result<()> {
        if graph.ops.is_empty() {
            return Ok(());
        }
        let mut st = self.lock();
        let seq = st.seq;
        let hs = Self::stream_mut(&mut st, s)?;
        if hs.capture.is_some() {
            return Err(Error::invalid(
                "Graph::replay",
                "graphs cannot be replayed inside a capture",
            ));
        }
        hs.queue.push_back(Queued {
            seq,
            item: Item::Graph {
                graph: graph.clone(),
                next: 0,
            },
        });
        hs.submitted += 1;
        st.seq += 1;
        drop(st);
        self.shared.work.notify_one();
        Ok(())
    }

    pub fn record(&self, event: &Arc<HostEventState>, s: Stream) -> Result<()> {
        // Reserve the generation under the state lock so that waits enqueued later see it.
        let mut st = self.lock();
        Self::stream_mut(&mut st, s)?;
        if st.streams[s.0 as usize].capture.is_some() {
            drop(st);
            return self.enqueue(
                s,
                HostOp::Record {
                    event: event.clone(),
                    generation: 0,
                },
            );
        }
        let generation = event.recorded.fetch_add(1, Ordering::AcqRel) + 1;
        event.stream.store(s.0, Ordering::Release);
        drop(st);
        self.enqueue(
            s,
            HostOp::Record {
                event: event.clone(),
                generation,
            },
        )
    }

    pub fn wait_event(&self, s: Stream, event: &Arc<HostEventState>) -> Result<()> {
        let generation = event.recorded.load(Ordering::Acquire);
        if generation == 0 {
            // As in CUDA: waiting on an event that was never recorded is a no-op.
            return self.check_stream(s);
        }
        self.enqueue(
            s,
            HostOp::Wait {
                event: event.clone(),
                generation,
            },
        )
    }

    fn check_stream(&self, s: Stream) -> Result<()> {
        let mut st = self.lock();
        Self::stream_mut(&mut st, s).map(|_| ())
    }

    /// Blocks until `event`'s latest record has been reached.
    pub fn sync_event(&self, event: &Arc<HostEventState>) -> Result<()> {
        self.guard_blocking("Event::synchronize")?;
        let target = event.recorded.load(Ordering::Acquire);
        let mut st = self.lock();
        while event.completed.load(Ordering::Acquire) < target {
            st = self
                .shared
                .progress
                .wait(st)
                .unwrap_or_else(|p| p.into_inner());
        }
        take_error(&mut st)
    }

    /// Whether `event`'s latest record has been reached (non-blocking).
    pub fn query_event(&self, event: &Arc<HostEventState>) -> bool {
        event.completed.load(Ordering::Acquire) >= event.recorded.load(Ordering::Acquire)
    }

    /// Blocks until everything enqueued on `s` so far has run.
    pub fn sync_stream(&self, s: Stream) -> Result<()> {
        self.guard_blocking("sync")?;
        let mut st = self.lock();
        let hs = Self::stream_mut(&mut st, s)?;
        if hs.capture.is_some() {
            return Err(Error::invalid("sync", format!("{s:?} is capturing")));
        }
        let target = hs.submitted;
        while st.streams[s.0 as usize].completed < target {
            st = self
                .shared
                .progress
                .wait(st)
                .unwrap_or_else(|p| p.into_inner());
        }
        take_error(&mut st)
    }

    pub fn begin_capture(&self, s: Stream) -> Result<()> {
        let mut st = self.lock();
        let hs = Self::stream_mut(&mut st, s)?;
        if hs.capture.is_some() {
            return Err(Error::invalid(
                "capture",
                format!("{s:?} is already capturing"),
            ));
        }
        hs.capture = Some(Vec::new());
        Ok(())
    }

    pub fn end_capture(&self, s: Stream) -> Result<Arc<HostGraph>> {
        let mut st = self.lock();
        let hs = Self::stream_mut(&mut st, s)?;
        let ops = hs
            .capture
            .take()
            .ok_or_else(|| Error::invalid("capture", format!("{s:?} is not capturing")))?;
        Ok(Arc::new(HostGraph { ops }))
    }
}

impl Drop for HostDevice {
    fn drop(&mut self) {
        self.lock().shutdown = true;
        self.shared.work.notify_all();
        let handle = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            // The last owner can be an operation finishing on the executor itself; then the
            // executor exits on its own once its queues are empty.
            if !self.on_executor() {
                let _ = h.join();
            }
        }
    }
}

fn take_error(st: &mut State) -> Result<()> {
    match st.error.take() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The operation the executor should run next: stream index, operation, whether it finishes
/// its queue entry, and a finished graph entry to drop once the lock is released.
type Pick = (usize, HostOp, bool, Option<Arc<HostGraph>>);

/// Retires ready markers (records, satisfied waits) and picks the next operation to run.
fn pick(st: &mut State, epoch: Instant) -> Option<Pick> {
    loop {
        let mut best: Option<(i32, u64, usize)> = None;
        let mut retired = false;
        for (i, hs) in st.streams.iter_mut().enumerate() {
            let Some(head) = hs.queue.front() else {
                continue;
            };
            let op = match &head.item {
                Item::Op(op) => op,
                Item::Graph { graph, next } => &graph.ops[*next],
            };
            match op {
                HostOp::Record { event, generation } => {
                    event
                        .stamp_ns
                        .store(epoch.elapsed().as_nanos() as u64, Ordering::Release);
                    event.completed.fetch_max(*generation, Ordering::AcqRel);
                    hs.queue.pop_front();
                    hs.completed += 1;
                    retired = true;
                }
                HostOp::Wait { event, generation } => {
                    if event.completed.load(Ordering::Acquire) >= *generation {
                        hs.queue.pop_front();
                        hs.completed += 1;
                        retired = true;
                    }
                }
                HostOp::Run(_) | HostOp::Memcpy { .. } => {
                    let cand = (hs.priority, head.seq, i);
                    if best.is_none_or(|b| (cand.0, cand.1) < (b.0, b.1)) {
                        best = Some(cand);
                    }
                }
            }
        }
        if retired {
            // Markers changed what is ready; look again.
            continue;
        }
        let (_, _, i) = best?;
        let hs = &mut st.streams[i];
        let head = hs.queue.front_mut().expect("picked stream has a head");
        return Some(match &mut head.item {
            Item::Op(_) => {
                let Some(Queued {
                    item: Item::Op(op), ..
                }) = hs.queue.pop_front()
                else {
                    unreachable!("head was an operation")
                };
                (i, op, true, None)
            }
            Item::Graph { graph, next } => {
                let op = graph.ops[*next].clone();
                *next += 1;
                if *next == graph.ops.len() {
                    let Some(Queued {
                        item: Item::Graph { graph, .. },
                        ..
                    }) = hs.queue.pop_front()
                    else {
                        unreachable!("head was a graph")
                    };
                    (i, op, true, Some(graph))
                } else {
                    (i, op, false, None)
                }
            }
        });
    }
}

fn run(op: &HostOp) -> Result<(), HostOpError> {
    match op {
        HostOp::Run(f) => match catch_unwind(AssertUnwindSafe(|| f())) {
            Ok(r) => r,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-string panic payload".into());
                Err(HostOpError::msg(format!("host operation panicked: {what}")))
            }
        },
        HostOp::Memcpy {
            dst, src, bytes, ..
        } => {
            // SAFETY: the enqueuing call checked both ranges against their buffers, and
            // `_keep` holds those buffers alive; overlapping ranges are allowed (memmove).
            unsafe { std::ptr::copy(*src as *const u8, *dst as *mut u8, *bytes) };
            Ok(())
        }
        HostOp::Record { .. } | HostOp::Wait { .. } => Ok(()),
    }
}

fn executor(shared: Arc<Shared>) {
    EXECUTOR_OF.with(|c| c.set(Arc::as_ptr(&shared) as usize));
    let mut st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        match pick(&mut st, shared.epoch) {
            Some((i, op, finishes, finished_graph)) => {
                drop(st);
                // Markers retired while picking may have satisfied event waiters.
                shared.progress.notify_all();
                let result = run(&op);
                // Drop what the operation held outside the lock: it may be the last owner
                // of a buffer, and through it of the context.
                drop(op);
                drop(finished_graph);
                st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(source) = result {
                    if st.error.is_none() {
                        st.error = Some(Error::HostOp {
                            stream: Stream(i as u32),
                            source,
                        });
                    }
                }
                if finishes {
                    st.streams[i].completed += 1;
                }
                shared.progress.notify_all();
            }
            None => {
                shared.progress.notify_all();
                if st.shutdown && st.streams.iter().all(|s| s.queue.is_empty()) {
                    return;
                }
                st = shared.work.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}
