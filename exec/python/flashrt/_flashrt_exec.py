"""FlashRT's Python exec API (`_flashrt_exec`) over frt's libflashrt_exec.so, through ctypes.

The same classes and functions as FlashRT's pybind module (Ctx, Buffer, Graph, Plan, Event,
memset_async, memcpy_async), each a thin call into the C ABI, so that FlashRT's own exec
tests run unchanged against this library.

Environment:
  FRT_EXEC_LIB      path of libflashrt_exec.so (default: found by the dynamic loader)
  FRT_EXEC_BACKEND  "host" or "cuda" (default: whatever frt_ctx_create picks)

memset_async / memcpy_async: on CUDA, the driver's cuMemsetD8Async / cuMemcpyDtoDAsync on
the given stream; on the host backend, a host function enqueued with frt_launch_host on the
stream that a capture's record callback receives.
"""

import ctypes
import os
import threading
import weakref

P, I, U64, SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_size_t
RECORD = ctypes.CFUNCTYPE(None, P, P)
HOSTFN = ctypes.CFUNCTYPE(None, P)
FRT_KEY_INHERIT = (1 << 64) - 1

_lib = ctypes.CDLL(os.environ.get("FRT_EXEC_LIB", "libflashrt_exec.so"))
for _name, _res, _args in [
    ("frt_ctx_create", P, []),
    ("frt_ctx_create_host", P, []),
    ("frt_ctx_create_cuda", P, [I]),
    ("frt_ctx_destroy", None, [P]),
    ("frt_ctx_backend", I, [P]),
    ("frt_ctx_stream", I, [P, I]),
    ("frt_ctx_wrap_stream", I, [P, P]),
    ("frt_ctx_sync", I, [P]),
    ("frt_ctx_event", P, [P]),
    ("frt_event_record", I, [P, I]),
    ("frt_stream_wait", I, [P, I, P]),
    ("frt_launch_host", I, [P, P, HOSTFN, P]),
    ("frt_buffer_alloc", P, [P, ctypes.c_char_p, SZ]),
    ("frt_buffer_wrap", P, [P, ctypes.c_char_p, P, SZ]),
    ("frt_buffer_dptr", P, [P]),
    ("frt_buffer_bytes", SZ, [P]),
    ("frt_buffer_name", ctypes.c_char_p, [P]),
    ("frt_buffer_copy", I, [P, P, SZ, P, SZ, SZ, I]),
    ("frt_graph_create", P, [P, ctypes.c_char_p, SZ]),
    ("frt_graph_capture", I, [P, U64, RECORD, P]),
    ("frt_graph_adopt", I, [P, U64, P]),
    ("frt_graph_bind", I, [P, ctypes.c_char_p, P]),
    ("frt_graph_replay", I, [P, U64, I]),
    ("frt_graph_has_variant", I, [P, U64]),
    ("frt_graph_evict", I, [P, U64]),
    ("frt_graph_evict_lru", I, [P]),
    ("frt_graph_variant_count", SZ, [P]),
    ("frt_plan_create", P, [P]),
    ("frt_plan_add", I, [P, P, U64, I]),
    ("frt_plan_after", I, [P, I, I]),
    ("frt_plan_execute", I, [P, U64]),
    ("frt_plan_sync", I, [P]),
    ("frt_last_error", ctypes.c_char_p, []),
]:
    _f = getattr(_lib, _name)
    _f.restype, _f.argtypes = _res, _args


def _check(rc, what):
    if rc < 0:
        raise RuntimeError(f"{what} failed: rc={rc} ({_lib.frt_last_error().decode()})")
    return rc


# Every live context (torch.cuda.synchronize on the host backend waits for all of them).
_live = weakref.WeakSet()
# The context whose capture is recording on this thread (host memset/memcpy need it).
_tls = threading.local()


class Buffer:
    def __init__(self, h):
        self._h = h

    def dptr(self):
        return _lib.frt_buffer_dptr(self._h) or 0

    def nbytes(self):
        return _lib.frt_buffer_bytes(self._h)

    def name(self):
        return _lib.frt_buffer_name(self._h).decode()

    def raw(self):
        return self._h


class Event:
    def __init__(self, h):
        self._h = h

    def record(self, stream_id):
        _check(_lib.frt_event_record(self._h, stream_id), "event_record")


class Graph:
    def __init__(self, ctx, h):
        self._ctx, self._h = ctx, h

    def capture(self, key, record):
        def trampoline(_user, stream):
            record(stream or 0)

        cb = RECORD(trampoline)
        _tls.ctx = self._ctx
        try:
            _check(_lib.frt_graph_capture(self._h, key, cb, None), "graph_capture")
        finally:
            _tls.ctx = None

    def adopt(self, key, graph_exec):
        _check(_lib.frt_graph_adopt(self._h, key, graph_exec), "graph_adopt")

    def bind(self, port, buffer):
        _check(_lib.frt_graph_bind(self._h, port.encode(), buffer._h), "graph_bind")

    def replay(self, key, stream_id=0):
        return _lib.frt_graph_replay(self._h, key, stream_id)

    def has_variant(self, key):
        return _lib.frt_graph_has_variant(self._h, key) != 0

    def evict(self, key):
        return _lib.frt_graph_evict(self._h, key)

    def evict_lru(self):
        return _lib.frt_graph_evict_lru(self._h)

    def variant_count(self):
        return _lib.frt_graph_variant_count(self._h)

    def raw(self):
        return self._h


class Plan:
    def __init__(self, h):
        self._h = h

    def add(self, graph, key, stream_id=0):
        return _check(_lib.frt_plan_add(self._h, graph._h, key, stream_id), "plan_add")

    def after(self, node_idx, dep_idx):
        _check(_lib.frt_plan_after(self._h, node_idx, dep_idx), "plan_after")

    def execute(self, key=FRT_KEY_INHERIT):
        _check(_lib.frt_plan_execute(self._h, key), "plan_execute")

    def sync(self):
        _check(_lib.frt_plan_sync(self._h), "plan_sync")


class Ctx:
    def __init__(self):
        want = os.environ.get("FRT_EXEC_BACKEND", "")
        if want == "host":
            h = _lib.frt_ctx_create_host()
        elif want == "cuda":
            h = _lib.frt_ctx_create_cuda(0)
        else:
            h = _lib.frt_ctx_create()
        if not h:
            raise RuntimeError(f"frt_ctx_create failed ({_lib.frt_last_error().decode()})")
        self._h = h
        self._host = _lib.frt_ctx_backend(h) == 0
        # Host functions enqueued by memset/memcpy: alive as long as the context.
        self._keep = []
        _live.add(self)

    def __del__(self):
        if getattr(self, "_h", None):
            _lib.frt_ctx_destroy(self._h)
            self._h = None

    def stream(self, priority=0):
        return _check(_lib.frt_ctx_stream(self._h, priority), "ctx_stream")

    def wrap_stream(self, external_stream):
        return _check(_lib.frt_ctx_wrap_stream(self._h, external_stream), "ctx_wrap_stream")

    def event(self):
        h = _lib.frt_ctx_event(self._h)
        if not h:
            raise RuntimeError("ctx_event failed")
        return Event(h)

    def stream_wait(self, stream_id, event):
        _check(_lib.frt_stream_wait(self._h, stream_id, event._h), "stream_wait")

    def buffer(self, name, nbytes):
        h = _lib.frt_buffer_alloc(self._h, name.encode(), nbytes)
        if not h:
            raise RuntimeError("buffer_alloc failed")
        return Buffer(h)

    def wrap(self, name, dptr, nbytes):
        h = _lib.frt_buffer_wrap(self._h, name.encode(), dptr, nbytes)
        if not h:
            raise RuntimeError("buffer_wrap failed")
        return Buffer(h)

    def copy(self, dst, dst_off, src, src_off, nbytes, stream_id=0):
        rc = _lib.frt_buffer_copy(self._h, dst._h, dst_off, src._h, src_off, nbytes, stream_id)
        _check(rc, "buffer_copy")

    def graph(self, name, max_variants=0):
        h = _lib.frt_graph_create(self._h, name.encode(), max_variants)
        if not h:
            raise RuntimeError("graph_create failed")
        return Graph(self, h)

    def plan(self):
        h = _lib.frt_plan_create(self._h)
        if not h:
            raise RuntimeError("plan_create failed")
        return Plan(h)

    def raw(self):
        return self._h

    def _sync(self):
        _check(_lib.frt_ctx_sync(self._h), "ctx_sync")


def _synchronize_all():
    """Waits for every stream of every live context (the host stand-in's torch.cuda.synchronize)."""
    for c in list(_live):
        c._sync()


# ------------------------------------------------------------------ memset / memcpy

_cuda = None


def _driver():
    global _cuda
    if _cuda is None:
        cu = ctypes.CDLL("libcuda.so.1")
        cu.cuMemsetD8Async.argtypes = [U64, ctypes.c_ubyte, SZ, P]
        cu.cuMemcpyDtoDAsync_v2.argtypes = [U64, U64, SZ, P]
        cu.cuCtxGetCurrent.argtypes = [ctypes.POINTER(P)]
        cu.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(P), I]
        cu.cuCtxSetCurrent.argtypes = [P]
        _cuda = cu
    cur = P()
    _cuda.cuCtxGetCurrent(ctypes.byref(cur))
    if not cur.value:
        # frt and torch use the device's primary context.
        for what, rc in [
            ("cuDevicePrimaryCtxRetain", _cuda.cuDevicePrimaryCtxRetain(ctypes.byref(cur), 0)),
            ("cuCtxSetCurrent", _cuda.cuCtxSetCurrent(cur)),
        ]:
            if rc != 0:
                raise RuntimeError(f"{what} failed: CUresult {rc}")
    return _cuda


def _host_ctx():
    """The host context capturing on this thread; None on CUDA."""
    c = getattr(_tls, "ctx", None)
    if c is not None and c._host:
        return c
    if c is None and any(x._host for x in list(_live)):
        raise RuntimeError(
            "on the host backend, memset_async and memcpy_async work inside a capture's "
            "record callback (they enqueue on the stream it receives)"
        )
    return None


def _enqueue_host(ctx, stream, fn):
    cb = HOSTFN(lambda _user: fn())
    ctx._keep.append(cb)
    _check(_lib.frt_launch_host(ctx._h, stream, cb, None), "frt_launch_host")


def memset_async(dptr, value, nbytes, stream):
    ctx = _host_ctx()
    if ctx is not None:
        _enqueue_host(ctx, stream, lambda: ctypes.memset(dptr, value, nbytes))
        return
    rc = _driver().cuMemsetD8Async(dptr, value & 0xFF, nbytes, stream or None)
    if rc != 0:
        raise RuntimeError(f"memset_async failed: CUresult {rc}")


def memcpy_async(dst, src, nbytes, stream):
    ctx = _host_ctx()
    if ctx is not None:
        _enqueue_host(ctx, stream, lambda: ctypes.memmove(dst, src, nbytes))
        return
    rc = _driver().cuMemcpyDtoDAsync_v2(dst, src, nbytes, stream or None)
    if rc != 0:
        raise RuntimeError(f"memcpy_async failed: CUresult {rc}")
