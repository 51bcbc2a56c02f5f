//! `Graph`: a table of ShapeKey → captured (or adopted) executable graph, with named ports.

use crate::backend::host::HostGraph;
use crate::ctx::Device;
use crate::error::{Error, Result};
use crate::lru::LruTable;
use crate::{Buffer, Ctx, ShapeKey, Stream};
use cudarc::driver::sys::CUgraphExec;
use std::any::Any;
use std::cell::Cell;
use std::ffi::c_void;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

enum Exec {
    Host(Arc<HostGraph>),
    /// `owned == false`: adopted, never destroyed by us.
    Cuda {
        raw: CUgraphExec,
        owned: bool,
    },
}

struct Variant {
    ctx: Ctx,
    exec: Exec,
    /// What the captured work used; kept alive as long as the variant.
    _buffers: Vec<Buffer>,
    _objects: Vec<Arc<dyn Any + Send + Sync>>,
}

// SAFETY: a CUgraphExec may be launched and destroyed from any thread; the graph's mutex
// serializes access to the variant table.
unsafe impl Send for Variant {}

impl Drop for Variant {
    fn drop(&mut self) {
        if let (Device::Cuda(c), Exec::Cuda { raw, owned: true }) =
            (&self.ctx.inner.device, &self.exec)
        {
            // SAFETY: owned by this variant and dropped once. Evicting a variant in flight is
            // the caller's contract violation (documented on `evict`).
            if let Err(e) = unsafe { c.graph_exec_destroy(*raw) } {
                self.ctx.inner.defer_error(e);
            }
        }
    }
}

struct State {
    ports: Vec<(String, Buffer)>,
    table: LruTable<Variant>,
    captures: u64,
}

struct GraphInner {
    ctx: Ctx,
    /// Unique in the process (see [`Graph::id`]).
    id: u64,
    name: String,
    max_variants: usize,
    state: Mutex<State>,
}

/// A table of executable graphs keyed by an exact [`ShapeKey`], with named ports.
///
/// * **Variants.** `capture` runs a closure that enqueues work onto the stream it is given and
///   stores the result under a key; `adopt` registers an executable graph made elsewhere.
///   Capturing or adopting an existing key replaces that variant. With `max_variants > 0`
///   the table holds at most that many and evicts the least recently replayed; replay and
///   eviction cost O(1). A key without a variant is [`Error::NoVariant`].
/// * **Ports.** `bind(port, buffer)` records that the graph's work reads or writes `buffer`
///   under the name `port`, and keeps the buffer alive as long as the binding (two graphs
///   bound to one buffer hand data over without a copy). Bindings are shared by all
///   variants, may be made before or after capturing, and a later `bind` of the same port
///   replaces the record. A binding is bookkeeping and lifetime only: a captured graph has
///   the addresses of the buffers it used baked in, and binding never re-points them (to use
///   another buffer, capture again). This is FlashRT's `frt_graph_bind`.
///   [`bind_before_capture`](Self::bind_before_capture) is the strict form that refuses a
///   late change ([`Error::Rebind`]). The closure given to `capture` finds port buffers with
///   [`port`](Self::port).
/// * **Lifetime.** A variant keeps alive every buffer the captured work used (bound ports,
///   and buffers passed to [`Ctx::retain`] or used by `exec` copies during the capture).
///   Evicting a variant frees its executable graph, never the buffers.
///
/// `Graph` is a cheap handle (`Clone`, `Send + Sync`); every method takes `&self`.
#[derive(Clone)]
pub struct Graph {
    inner: Arc<GraphInner>,
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("name", &self.inner.name)
            .field("variants", &self.variant_count())
            .field("max_variants", &self.inner.max_variants)
            .finish()
    }
}

thread_local! {
    /// Id of the context this thread is capturing on (0: none), to reject nested captures.
    static CAPTURING_CTX: Cell<u64> = const { Cell::new(0) };
}

/// Host executable graphs that exist, so that `adopt` on the host backend accepts only a
/// pointer that `native_exec` handed out.
static HOST_EXECS: Mutex<Vec<(usize, Weak<HostGraph>)>> = Mutex::new(Vec::new());

fn register_host_exec(g: &Arc<HostGraph>) {
    let mut v = HOST_EXECS.lock().unwrap_or_else(|p| p.into_inner());
    v.retain(|(_, w)| w.strong_count() > 0);
    v.push((Arc::as_ptr(g) as usize, Arc::downgrade(g)));
}

fn find_host_exec(p: usize) -> Option<Arc<HostGraph>> {
    let v = HOST_EXECS.lock().unwrap_or_else(|p| p.into_inner());
    v.iter()
        .find(|(addr, _)| *addr == p)
        .and_then(|(_, w)| w.upgrade())
}

impl Graph {
    /// A graph with no variants. `max_variants == 0` means unbounded.
    pub fn new(ctx: &Ctx, name: &str, max_variants: usize) -> Graph {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let cap = if max_variants > 0 { max_variants } else { 16 };
        Graph {
            inner: Arc::new(GraphInner {
                ctx: ctx.clone(),
                id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                name: name.to_string(),
                max_variants,
                state: Mutex::new(State {
                    ports: Vec::new(),
                    table: LruTable::with_capacity(cap + 1),
                    captures: 0,
                }),
            }),
        }
    }

    /// This graph's id: unique among the graphs of the process, never reused. During a
    /// capture, [`Ctx::capturing_graph`] tells it to the ops being recorded (e.g. so that
    /// scratch memory is per graph, not shared with graphs replayed on other streams).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn ctx(&self) -> &Ctx {
        &self.inner.ctx
    }

    pub fn max_variants(&self) -> usize {
        self.inner.max_variants
    }

    /// Binds `port` to `buffer`, at any time, replacing an earlier binding of `port` (see the
    /// type's docs: a binding is a record that keeps the buffer alive; it never re-points
    /// work already captured).
    pub fn bind(&self, port: &str, buffer: &Buffer) -> Result<()> {
        self.bind_inner(port, buffer, false)
    }

    /// [`bind`](Self::bind), strict: once the graph has a variant, a new port or another
    /// buffer on a bound port is [`Error::Rebind`] (the captured work could not see it), and
    /// binding the same buffer again is a no-op. For callers that want a late binding to be
    /// an error rather than a record.
    pub fn bind_before_capture(&self, port: &str, buffer: &Buffer) -> Result<()> {
        self.bind_inner(port, buffer, true)
    }

    fn bind_inner(&self, port: &str, buffer: &Buffer, strict: bool) -> Result<()> {
        if !buffer.ctx().same(&self.inner.ctx) {
            return Err(Error::invalid(
                "Graph::bind",
                format!("buffer `{}` belongs to another context", buffer.name()),
            ));
        }
        if port.is_empty() {
            return Err(Error::invalid("Graph::bind", "a port needs a name"));
        }
        let mut st = self.lock();
        let variants = if strict { st.table.len() } else { 0 };
        let rebind = |old: &str| Error::Rebind {
            graph: self.inner.name.clone(),
            port: port.to_string(),
            old: old.to_string(),
            new: buffer.name().to_string(),
            variants,
        };
        match st.ports.iter_mut().find(|(p, _)| p == port) {
            Some((_, b)) if b.id() == buffer.id() => Ok(()),
            Some((_, b)) if variants > 0 => Err(rebind(b.name())),
            Some((_, b)) => {
                *b = buffer.clone();
                Ok(())
            }
            None if variants > 0 => Err(rebind("")),
            None => {
                st.ports.push((port.to_string(), buffer.clone()));
                Ok(())
            }
        }
    }

    /// The buffer bound to `port`, or [`Error::Unbound`].
    pub fn port(&self, port: &str) -> Result<Buffer> {
        self.lock()
            .ports
            .iter()
            .find(|(p, _)| p == port)
            .map(|(_, b)| b.clone())
            .ok_or_else(|| Error::Unbound {
                graph: self.inner.name.clone(),
                port: port.to_string(),
            })
    }

    /// All bindings, in binding order.
    pub fn ports(&self) -> Vec<(String, Buffer)> {
        self.lock().ports.clone()
    }

    /// Captures a variant: `record` enqueues the variant's work onto the stream it is given
    /// (and nothing else), which `exec` captures (CUDA: relaxed stream capture, then
    /// instantiate and upload; host: the enqueued operations are recorded). Replaces an
    /// existing variant for `key`; evicts the least recently used one when the table is full.
    /// One capture at a time per context (others wait); a capture inside a capture is an error.
    ///
    /// The closure's error type is the caller's ([`CaptureError`]): `exec`'s own errors are
    /// converted into it, and an error the closure returns comes back with its cause (an
    /// `exec` error wrapped in [`Error::Capture`] naming the graph and key; another crate's
    /// error as it decides, by default unchanged).
    pub fn capture<F, E>(&self, key: ShapeKey, record: F) -> std::result::Result<(), E>
    where
        F: FnOnce(Stream) -> std::result::Result<(), E>,
        E: CaptureError,
    {
        if key.is_inherit() {
            return Err(Error::invalid(
                "Graph::capture",
                "ShapeKey::INHERIT cannot name a variant",
            )
            .into());
        }
        let ctx = &self.inner.ctx;
        if CAPTURING_CTX.with(|c| c.get()) == ctx.inner.id {
            return Err(Error::invalid(
                "Graph::capture",
                "a capture cannot start inside another capture",
            )
            .into());
        }
        let _one_at_a_time = ctx
            .inner
            .capture_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let s = ctx.capture_stream()?;
        let raw = ctx.inner.raw_stream(s)?;
        let capture_err = |reason: String, source: Option<Error>| Error::Capture {
            graph: self.inner.name.clone(),
            key,
            reason,
            source: source.map(Box::new),
        };
        match &ctx.inner.device {
            Device::Host(h) => h.begin_capture(s),
            Device::Cuda(c) => c.begin_capture(raw as _),
        }
        .map_err(|e| capture_err("cannot begin the capture".into(), Some(e)))?;
        ctx.begin_session(s, self.inner.id);
        CAPTURING_CTX.with(|c| c.set(ctx.inner.id));
        let outcome = catch_unwind(AssertUnwindSafe(|| record(s)));
        CAPTURING_CTX.with(|c| c.set(0));
        let session = ctx.end_session().expect("the session begun above");
        let recorded_ok = matches!(outcome, Ok(Ok(())));
        let exec = match &ctx.inner.device {
            Device::Host(h) => h.end_capture(s).map(|g| {
                register_host_exec(&g);
                Exec::Host(g)
            }),
            Device::Cuda(c) if recorded_ok => c
                .end_capture(raw as _)
                .map(|raw| Exec::Cuda { raw, owned: true }),
            Device::Cuda(c) => {
                c.abort_capture(raw as _);
                Err(Error::invalid("capture", "aborted"))
            }
        };
        let user = match outcome {
            Ok(r) => r,
            Err(panic) => resume_unwind(panic),
        };
        user.map_err(|e| e.in_capture(&self.inner.name, key))?;
        let exec = exec
            .map_err(|e| capture_err("the backend rejected the captured work".into(), Some(e)))?;
        let mut buffers = session.buffers;
        for (_, b) in self.lock().ports.iter() {
            if !buffers.iter().any(|x| x.id() == b.id()) {
                buffers.push(b.clone());
            }
        }
        let variant = Variant {
            ctx: ctx.clone(),
            exec,
            _buffers: buffers,
            _objects: session.objects,
        };
        self.insert(key, variant);
        Ok(())
    }

    /// Registers an executable graph made elsewhere under `key`. It is never freed by `exec`
    /// (not by eviction, not by dropping the graph): its owner frees it after this graph
    /// stops using it.
    ///
    /// On CUDA `exec` is a `CUgraphExec` (e.g. `torch.cuda.CUDAGraph.raw_cuda_graph_exec()`).
    /// On the host backend it is a pointer from [`native_exec`](Self::native_exec) of a
    /// graph of the same process; anything else is rejected.
    ///
    /// # Safety
    /// On CUDA, `exec` is a live executable graph of this context's CUDA context that stays
    /// alive while this graph may replay it.
    pub unsafe fn adopt(&self, key: ShapeKey, exec: *mut c_void) -> Result<()> {
        if key.is_inherit() {
            return Err(Error::invalid(
                "Graph::adopt",
                "ShapeKey::INHERIT cannot name a variant",
            ));
        }
        if exec.is_null() {
            return Err(Error::invalid("Graph::adopt", "null executable graph"));
        }
        let exec = match &self.inner.ctx.inner.device {
            Device::Cuda(_) => Exec::Cuda {
                raw: exec as CUgraphExec,
                owned: false,
            },
            Device::Host(_) => Exec::Host(find_host_exec(exec as usize).ok_or_else(|| {
                Error::invalid(
                    "Graph::adopt",
                    "not a live host executable graph from Graph::native_exec",
                )
            })?),
        };
        let variant = Variant {
            ctx: self.inner.ctx.clone(),
            exec,
            _buffers: Vec::new(),
            _objects: Vec::new(),
        };
        self.insert(key, variant);
        Ok(())
    }

    fn insert(&self, key: ShapeKey, variant: Variant) {
        let mut st = self.lock();
        let mut evicted = None;
        if self.inner.max_variants > 0
            && !st.table.contains(key.0)
            && st.table.len() >= self.inner.max_variants
        {
            evicted = st.table.pop_lru();
        }
        let replaced = st.table.insert(key.0, variant);
        st.captures += 1;
        drop(st);
        drop((evicted, replaced));
    }

    /// The backend's executable graph of a variant: a `CUgraphExec` on CUDA, an opaque host
    /// pointer on the host backend (which `adopt` accepts). Owned by this graph.
    pub fn native_exec(&self, key: ShapeKey) -> Result<*mut c_void> {
        let mut st = self.lock();
        match st.table.get_touch(key.0).map(|v| &v.exec) {
            Some(Exec::Host(g)) => Ok(Arc::as_ptr(g) as *mut c_void),
            Some(Exec::Cuda { raw, .. }) => Ok(*raw as *mut c_void),
            None => Err(Error::NoVariant {
                graph: self.inner.name.clone(),
                key,
            }),
        }
    }

    /// Enqueues the variant for `key` on `s`; marks it most recently used. Allocates nothing.
    #[inline]
    pub fn replay(&self, key: ShapeKey, s: Stream) -> Result<()> {
        let ctx = &self.inner.ctx;
        let raw = ctx.inner.raw_stream(s)?;
        let mut st = self.lock();
        let Some(v) = st.table.get_touch(key.0) else {
            return Err(Error::NoVariant {
                graph: self.inner.name.clone(),
                key,
            });
        };
        match (&ctx.inner.device, &v.exec) {
            (Device::Host(h), Exec::Host(g)) => h.enqueue_graph(s, g),
            (Device::Cuda(c), Exec::Cuda { raw: exec, .. }) => {
                if ctx.is_capturing(s) {
                    return Err(Error::invalid(
                        "Graph::replay",
                        "graphs cannot be replayed inside a capture",
                    ));
                }
                // SAFETY: the variant is alive while the lock is held; an adopted exec is
                // alive by `adopt`'s contract; `raw` is a stream of this context.
                unsafe { c.graph_launch(*exec, raw as _) }
            }
            _ => unreachable!("variants are made by their context's backend"),
        }
    }

    pub fn has_variant(&self, key: ShapeKey) -> bool {
        self.lock().table.contains(key.0)
    }

    /// Drops the variant for `key` ([`Error::NoVariant`] if there is none). Only at a safe
    /// point: the variant must not be in flight on any stream (sync or wait first). An
    /// adopted variant is unregistered, not freed.
    pub fn evict(&self, key: ShapeKey) -> Result<()> {
        let v = self.lock().table.remove(key.0);
        match v {
            Some(v) => {
                drop(v);
                Ok(())
            }
            None => Err(Error::NoVariant {
                graph: self.inner.name.clone(),
                key,
            }),
        }
    }

    /// Drops the least recently replayed (or captured) variant; returns its key, or `None`
    /// when the table is empty. Same safe-point rule as [`evict`](Self::evict).
    pub fn evict_lru(&self) -> Option<ShapeKey> {
        let v = self.lock().table.pop_lru();
        v.map(|(k, v)| {
            drop(v);
            ShapeKey(k)
        })
    }

    pub fn variant_count(&self) -> usize {
        self.lock().table.len()
    }

    /// Keys from most to least recently used.
    pub fn keys(&self) -> Vec<ShapeKey> {
        self.lock()
            .table
            .keys_mru()
            .into_iter()
            .map(ShapeKey)
            .collect()
    }

    /// How many variants were captured or adopted over this graph's life (replacements
    /// included). Lets callers prove that something needed no recapture.
    pub fn capture_count(&self) -> u64 {
        self.lock().captures
    }
}

/// An error type a capture's record closure may return (see [`Graph::capture`]).
pub trait CaptureError: From<Error> {
    /// `self`, returned by the record closure while `graph`'s variant `key` was captured.
    fn in_capture(self, graph: &str, key: ShapeKey) -> Self {
        let _ = (graph, key);
        self
    }
}

impl CaptureError for Error {
    fn in_capture(self, graph: &str, key: ShapeKey) -> Self {
        Error::Capture {
            graph: graph.to_string(),
            key,
            reason: "the record closure failed".into(),
            source: Some(Box::new(self)),
        }
    }
}

impl Drop for GraphInner {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        drop(st.table.drain());
    }
}
