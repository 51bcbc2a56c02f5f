/*
 * flashrt/exec.h — the C ABI of frt's execution contract (libflashrt_exec.so).
 *
 * WHAT IT IS: mechanism only.
 *   - buffers: named device memory with a stable address;
 *   - graphs: a table of exact ShapeKey -> captured (or adopted) executable graph, with
 *     named ports through which graphs share buffers without copies;
 *   - plans: a dumb DAG of graph replays across streams, ordered by events;
 *   - streams with hardware priorities, and events.
 * WHAT IT IS NOT: kernels, models, sessions, schedulers, sensor or cadence logic. Which
 *   graph runs when, at what priority, and what to evict are the caller's policy.
 *
 * Backends. frt_ctx_create() picks CUDA device 0 when a CUDA driver and a GPU are present,
 * else the host backend (host memory; one executor thread per context plays the device).
 *
 * Conventions.
 *   - Handles are opaque values, not pointers. NULL, destroyed ("stale") or wrong-type
 *     handles are detected: int functions return FRT_ERR_INVALID; functions returning a
 *     value return NULL / 0 / "" (frt_graph_has_variant: 0, frt_buffer_name: "").
 *   - A NULL name (buffers, graphs) is the empty name.
 *   - int functions return FRT_OK (0) or a negative frt_status. A lookup that misses is an
 *     error, never a silent no-op. frt_last_error() describes the last failure of the
 *     calling thread.
 *   - Stream ids are ints >= 0; id 0 is the default stream of every context: a stream the
 *     context owns (CUDA: non-blocking, priority 0, not ordered with the legacy default
 *     stream; reach that one with frt_ctx_wrap_stream(ctx, NULL)).
 *   - Thread safety: every function may be called from any thread, concurrently, unless
 *     its comment says otherwise. Destroying an object while another thread uses it is
 *     safe: the other call completes with the object or fails with FRT_ERR_INVALID.
 *   - Destroying a context destroys every buffer, event, graph and plan made from it.
 *
 * FlashRT compatibility. Every function of FlashRT's exec.h is here with the same
 * signature, status codes and defined behaviour (FlashRT's own exec tests run unchanged
 * against this library: exec/python/flashrt/). Where FlashRT's behaviour is undefined, this
 * library is stricter, and says so: stale and wrong-type handles are detected (FlashRT
 * dereferences them); every function is thread-safe; frt_plan_after refuses a dependency on
 * an unknown, equal or later node (no cycles); frt_plan_execute checks every node's variant
 * before enqueueing anything; FRT_KEY_INHERIT cannot be captured or adopted as a key; a
 * capture runs on a capture stream of frt's own, not on stream 0. Functions marked
 * "Additive" are not in FlashRT's header.
 *
 * The declarations below are checked against the library's exports by the test
 * `header_matches_exports` (exec/capi/tests/header.rs).
 */
#ifndef FLASHRT_EXEC_H
#define FLASHRT_EXEC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct frt_ctx_s *frt_ctx;       /* backend, streams, and the objects made from it */
typedef struct frt_buffer_s *frt_buffer; /* named device memory */
typedef struct frt_graph_s *frt_graph;   /* ShapeKey -> executable graph table + ports */
typedef struct frt_plan_s *frt_plan;     /* DAG of (graph, key, stream) replays */
typedef struct frt_event_s *frt_event;   /* cross-stream synchronization point */

/* The exact key of a graph variant. The caller owns its encoding (batch, length, step...). */
typedef uint64_t frt_shape_key;

/* In a plan node: use the key passed to frt_plan_execute. Cannot name a variant. */
#define FRT_KEY_INHERIT ((frt_shape_key)~0ull)

typedef enum {
    FRT_OK = 0,
    FRT_ERR_INVALID = -1,    /* null/stale/wrong handle, bad argument, misuse */
    FRT_ERR_NO_VARIANT = -2, /* no variant captured or adopted for the key */
    FRT_ERR_UNBOUND = -3,    /* no buffer bound to the port */
    FRT_ERR_CAPTURE = -4,    /* capture or instantiation failed */
    FRT_ERR_BACKEND = -5,    /* the CUDA driver (or a host operation) failed */
    FRT_ERR_OOM = -6         /* allocation failed */
} frt_status;

/* ---------------------------------------------------------------- context and streams */

/* A context on CUDA device 0 if present, else on the host backend. NULL on failure. */
frt_ctx frt_ctx_create(void);
/* Additive: a context on the host backend / on CUDA device `device`. NULL on failure. */
frt_ctx frt_ctx_create_host(void);
frt_ctx frt_ctx_create_cuda(int device);
/* Waits for the context's streams, then destroys it and everything made from it. */
void frt_ctx_destroy(frt_ctx ctx);
/* Additive: 0 = host backend, 1 = CUDA, FRT_ERR_INVALID for a bad handle. */
int frt_ctx_backend(frt_ctx ctx);

/* Creates a stream with a hardware priority (0 normal, more negative = higher; the CUDA
 * convention, range of an H100/H200: -5..0; the host backend uses the same range). A
 * priority outside the device's range is clamped into it. Returns the stream id (>= 1). */
int frt_ctx_stream(frt_ctx ctx, int priority);
/* Registers an externally owned stream so replays and plans can run on it; never destroyed
 * by frt. CUDA: a CUstream of the same CUDA context (e.g. a torch stream's cuda_stream;
 * NULL is the legacy default stream). Host: only a handle from frt_ctx_native_stream.
 * Wrapping the same stream again returns the same id. Returns the id or a negative status. */
int frt_ctx_wrap_stream(frt_ctx ctx, void *external_stream);
/* Additive: the native handle of a stream id: the CUstream on CUDA; on the host backend an
 * opaque handle valid for frt_launch_host and frt_ctx_wrap_stream. NULL on failure. */
void *frt_ctx_native_stream(frt_ctx ctx, int stream_id);
/* Additive: blocks until the stream's work so far has finished / all streams are idle.
 * Reports the first asynchronous error (e.g. a failed host function) since the last sync. */
int frt_stream_sync(frt_ctx ctx, int stream_id);
int frt_ctx_sync(frt_ctx ctx);

/* Additive: enqueues fn(user) on a stream, given by its native handle (the `stream` a
 * capture's record callback receives, or frt_ctx_native_stream). It runs after the work
 * before it on that stream; the work after it waits for it. Inside a capture it is recorded
 * and runs at every replay. This is how C code enqueues work on the host backend (host
 * buffers' frt_buffer_dptr are host addresses). On CUDA it is cuLaunchHostFunc: fn must not
 * call CUDA. fn runs on another thread: `user` must stay valid until it has run. */
int frt_launch_host(frt_ctx ctx, void *native_stream, void (*fn)(void *user), void *user);

/* ---------------------------------------------------------------- events */

/* A new event (NULL on failure). */
frt_event frt_ctx_event(frt_ctx ctx);
void frt_event_destroy(frt_event ev);
/* Marks the current end of the stream. */
int frt_event_record(frt_event ev, int stream_id);
/* The stream waits (on the device, without blocking the caller) until the event's latest
 * record has completed. Waiting on an event never recorded is a no-op. */
int frt_stream_wait(frt_ctx ctx, int stream_id, frt_event ev);
/* Additive: blocks the caller until the event's latest record has completed. */
int frt_event_sync(frt_event ev);

/* ---------------------------------------------------------------- buffers */

/* Allocates `bytes` (> 0; 0 gives NULL) of device memory (zeroed on the host backend only).
 * Freed when the context is destroyed (and no graph uses it any more). NULL on failure
 * (FRT_ERR_OOM is in frt_last_error). */
frt_buffer frt_buffer_alloc(frt_ctx ctx, const char *name, size_t bytes);
/* Wraps memory owned elsewhere (CUDA: a device pointer such as a torch tensor's data_ptr;
 * host: a host pointer); frt never frees it. The memory must outlive every use. A NULL
 * dptr gives NULL; 0 bytes is allowed (every copy of one or more bytes to or from it is
 * then out of range). */
frt_buffer frt_buffer_wrap(frt_ctx ctx, const char *name, void *dptr, size_t bytes);
/* The stable address (CUdeviceptr on CUDA, host address on the host backend); NULL if bad. */
void *frt_buffer_dptr(frt_buffer buf);
/* Size in bytes; 0 for a bad handle. */
size_t frt_buffer_bytes(frt_buffer buf);
/* The name; valid until the buffer's context is destroyed. "" for a bad handle. */
const char *frt_buffer_name(frt_buffer buf);
/* Enqueues an asynchronous device-to-device copy of src[src_off, src_off+bytes) to
 * dst[dst_off, ...) on the stream. Ranges outside either buffer are FRT_ERR_INVALID. */
int frt_buffer_copy(frt_ctx ctx, frt_buffer dst, size_t dst_off, frt_buffer src, size_t src_off,
                    size_t bytes, int stream_id);
/* Additive: host -> buffer, asynchronous on the stream (the data is first copied into the
 * buffer's staging memory, pinned on CUDA, so `src` may be reused at once); host <- buffer,
 * blocking until the data has arrived. Not allowed inside a capture. */
int frt_buffer_upload(frt_buffer buf, size_t offset, const void *src, size_t bytes, int stream_id);
int frt_buffer_download(frt_buffer buf, size_t offset, void *dst, size_t bytes, int stream_id);

/* ---------------------------------------------------------------- graphs */

/* A graph with no variants. max_variants > 0 bounds the table: capturing a new key into a
 * full table first evicts the least recently replayed (or captured) variant. 0: unbounded. */
frt_graph frt_graph_create(frt_ctx ctx, const char *name, size_t max_variants);
/* Destroys the graph and its own executable graphs (never adopted ones, never buffers). */
void frt_graph_destroy(frt_graph g);

/* Captures a variant: frt begins a relaxed-mode stream capture on a capture stream of its
 * own, calls record(user, stream), ends the capture, instantiates and uploads the graph.
 * `record` must enqueue this variant's work onto `stream` and nothing else. `stream` is a
 * CUstream on CUDA; on the host backend an opaque handle to pass to frt_launch_host.
 * Capturing an existing key replaces that variant. One capture at a time per context
 * (concurrent calls wait); a capture started from inside `record` fails (FRT_ERR_INVALID).
 * Returns FRT_ERR_CAPTURE when the backend rejects the captured work. */
int frt_graph_capture(frt_graph g, frt_shape_key key, void (*record)(void *user, void *stream),
                      void *user);
/* Registers an executable graph made elsewhere under `key`, without taking ownership:
 * eviction and frt_graph_destroy never free it. CUDA: a CUgraphExec of the same CUDA context
 * (e.g. torch.cuda.CUDAGraph.raw_cuda_graph_exec()); the owner keeps it alive while frt may
 * replay it. Host: only a pointer from frt_graph_native_exec. */
int frt_graph_adopt(frt_graph g, frt_shape_key key, void *external_graph_exec);
/* Binds a named port to a buffer, at any time, before or after capturing; binding a port
 * again replaces its record. A binding is bookkeeping and lifetime: it records port ->
 * buffer (frt_graph_port reads it back; two graphs bound to one buffer name a zero-copy
 * hand-off) and keeps the buffer alive while bound. It does NOT change captured work:
 * captured graphs have the addresses they used baked in, and binding never re-points them
 * (to use another buffer, capture again). Bindings are shared by all variants. */
int frt_graph_bind(frt_graph g, const char *port, frt_buffer buf);
/* Additive: the buffer bound to a port (*out), or FRT_ERR_UNBOUND. */
int frt_graph_port(frt_graph g, const char *port, frt_buffer *out);
/* Enqueues the variant for `key` on the stream and marks it most recently used.
 * FRT_ERR_NO_VARIANT if none; never a silent no-op. Returns without waiting. */
int frt_graph_replay(frt_graph g, frt_shape_key key, int stream_id);
/* 1 if a variant exists for `key`, else 0 (also for a bad handle, with the reason in
 * frt_last_error). */
int frt_graph_has_variant(frt_graph g, frt_shape_key key);
/* Additive: the executable graph of a variant (CUgraphExec on CUDA), owned by `g`. */
void *frt_graph_native_exec(frt_graph g, frt_shape_key key);
/* Drop one variant / the least recently used one: FRT_OK, or FRT_ERR_NO_VARIANT if there is
 * none. Only at a safe point: the variant must not be in flight on any stream. An adopted
 * variant is unregistered, never freed. */
int frt_graph_evict(frt_graph g, frt_shape_key key);
int frt_graph_evict_lru(frt_graph g);
/* The number of variants (0 for a bad handle). */
size_t frt_graph_variant_count(frt_graph g);

/* ---------------------------------------------------------------- plans */

/* An empty plan. A plan's functions serialize on the plan (one call at a time per plan). */
frt_plan frt_plan_create(frt_ctx ctx);
void frt_plan_destroy(frt_plan p);
/* Appends a node that replays graph@key (or FRT_KEY_INHERIT) on the stream. Returns the node
 * index (>= 0) or a negative status. Nodes on one stream run in the order they were added. */
int frt_plan_add(frt_plan p, frt_graph graph, frt_shape_key key, int stream_id);
/* Node `node_idx` runs after node `dep_node_idx` has completed. The dependency must be an
 * earlier node (so a plan never has a cycle); an unknown, equal or later node is
 * FRT_ERR_INVALID. Across streams this creates an event now (execute creates none); on the
 * same stream the order is already implied. */
int frt_plan_after(frt_plan p, int node_idx, int dep_node_idx);
/* Enqueues every node once; nodes added with FRT_KEY_INHERIT use `key` (no variant is ever
 * stored under FRT_KEY_INHERIT, so such a node with key FRT_KEY_INHERIT has none). First
 * checks that every node has its variant: if one is missing nothing is enqueued and the
 * result is FRT_ERR_NO_VARIANT. Returns without waiting. */
int frt_plan_execute(frt_plan p, frt_shape_key key);
/* Blocks until every stream the plan uses is idle; reports the first error. */
int frt_plan_sync(frt_plan p);

/* ---------------------------------------------------------------- diagnostics */

/* Additive: the name of a status code (static storage). */
const char *frt_status_string(int status);
/* Additive: a description of the last failure on the calling thread (empty if none); valid
 * until that thread's next failing call. */
const char *frt_last_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHRT_EXEC_H */
