"""A graph captured by torch, adopted and replayed through frt's C ABI (ctypes).

    python3 exec/python/test_torch_adopt.py path/to/libflashrt_exec.so

Needs a CUDA GPU and torch. Checks that replaying torch's CUDAGraph executable through
frt_graph_replay gives results bit-identical to torch's own replay, that frt can wrap torch's
memory and stream, and that evicting or destroying the adopting graph never frees torch's
executable graph. Exits non-zero on any mismatch.
"""
import ctypes
import sys

import torch

lib = ctypes.CDLL(sys.argv[1] if len(sys.argv) > 1 else "libflashrt_exec.so")
P, I, U64, SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_size_t
for name, res, args in [
    ("frt_ctx_create", P, []),
    ("frt_ctx_backend", I, [P]),
    ("frt_ctx_destroy", None, [P]),
    ("frt_ctx_wrap_stream", I, [P, P]),
    ("frt_stream_sync", I, [P, I]),
    ("frt_buffer_wrap", P, [P, ctypes.c_char_p, P, SZ]),
    ("frt_buffer_download", I, [P, SZ, P, SZ, I]),
    ("frt_graph_create", P, [P, ctypes.c_char_p, SZ]),
    ("frt_graph_destroy", None, [P]),
    ("frt_graph_adopt", I, [P, U64, P]),
    ("frt_graph_bind", I, [P, ctypes.c_char_p, P]),
    ("frt_graph_replay", I, [P, U64, I]),
    ("frt_graph_evict", I, [P, U64]),
    ("frt_graph_has_variant", I, [P, U64]),
    ("frt_last_error", ctypes.c_char_p, []),
]:
    f = getattr(lib, name)
    f.restype, f.argtypes = res, args


def ok(rc, what):
    if rc != 0:
        raise SystemExit(f"FAIL {what}: rc={rc} ({lib.frt_last_error().decode()})")


torch.manual_seed(0)
dev = torch.device("cuda")
n = 1 << 20
x = torch.randn(n, device=dev)
w = torch.randn(n, device=dev)

# torch's documented capture recipe: warm up on a side stream, then capture.
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        y = torch.sin(x) * w + x.square()
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    y = torch.sin(x) * w + x.square()
exec_ptr = graph.raw_cuda_graph_exec()
assert exec_ptr, "torch gave no executable graph"

ctx = lib.frt_ctx_create()  # the same primary context torch uses
assert ctx and lib.frt_ctx_backend(ctx) == 1, "frt picked CUDA device 0"
stream = torch.cuda.Stream()
sid = lib.frt_ctx_wrap_stream(ctx, stream.cuda_stream)
assert sid > 0, lib.frt_last_error()
assert lib.frt_ctx_wrap_stream(ctx, stream.cuda_stream) == sid, "wrapping twice gives the same id"
fg = lib.frt_graph_create(ctx, b"torch_adopted", 0)
# Ports are bound before variants exist (torch's graph has y's address baked in).
ybuf = lib.frt_buffer_wrap(ctx, b"y", y.data_ptr(), y.numel() * y.element_size())
ok(lib.frt_graph_bind(fg, b"y", ybuf), "bind")
ok(lib.frt_graph_adopt(fg, 42, exec_ptr), "adopt")

trials = 5
for t in range(trials):
    x.copy_(torch.randn(n, device=dev))
    graph.replay()
    torch.cuda.synchronize()
    ref = y.clone()
    y.fill_(float("nan"))  # poison: frt's replay must write every element
    torch.cuda.synchronize()
    ok(lib.frt_graph_replay(fg, 42, sid), "replay")
    ok(lib.frt_stream_sync(ctx, sid), "sync")
    if not torch.equal(y.view(torch.int32), ref.view(torch.int32)):
        raise SystemExit(f"FAIL trial {t}: frt replay differs from torch replay")
    host = (ctypes.c_float * n)()
    ok(lib.frt_buffer_download(ybuf, 0, host, n * 4, sid), "download")
    if bytes(host) != ref.cpu().numpy().tobytes():
        raise SystemExit(f"FAIL trial {t}: download through frt differs")

assert lib.frt_graph_replay(fg, 7, sid) == -2, "a missing key is FRT_ERR_NO_VARIANT"
ok(lib.frt_graph_evict(fg, 42), "evict")
assert lib.frt_graph_has_variant(fg, 42) == 0
graph.replay()  # torch's executable graph is still alive after eviction
ok(lib.frt_graph_adopt(fg, 43, exec_ptr), "adopt again")
lib.frt_graph_destroy(fg)
x.copy_(torch.randn(n, device=dev))
graph.replay()  # ... and after the adopting graph is destroyed
torch.cuda.synchronize()
expect = torch.sin(x) * w + x.square()
assert torch.allclose(y, expect, rtol=1e-5, atol=1e-5), "torch's graph still computes"
lib.frt_ctx_destroy(ctx)
print(f"torch adopt: {trials} trials bit-identical to torch's own replay "
      f"({n} floats, device {torch.cuda.get_device_name()}, torch {torch.__version__}); "
      f"eviction and destroy left torch's executable graph alive")
