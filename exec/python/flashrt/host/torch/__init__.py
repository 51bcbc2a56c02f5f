"""A stand-in for the part of torch that FlashRT's exec tests use, for runs on frt's host
backend (no GPU, no torch): there, "device memory" is host memory, so a "cuda" tensor is a
host byte array whose address frt's buffers wrap, and torch.cuda.synchronize() waits for
every stream of every live frt context.

It covers exactly what exec/python/flashrt/tests use: torch.zeros(n, dtype=torch.uint8,
device="cuda"), Tensor.data_ptr(), Tensor.zero_(), tensor == int, torch.all, torch.unique,
.tolist(), torch.cuda.is_available() and torch.cuda.synchronize(). Anything else raises.
On a GPU the tests run with the real torch instead (exec/python/flashrt/README.md).
"""

import builtins
import ctypes

uint8 = "uint8"


class Tensor:
    def __init__(self, values):
        self._v = values

    def data_ptr(self):
        return ctypes.addressof(self._v)

    def zero_(self):
        ctypes.memset(self._v, 0, len(self._v))
        return self

    def __eq__(self, other):
        return Tensor([x == other for x in self._v])

    def __iter__(self):
        return iter(self._v)

    def __len__(self):
        return len(self._v)

    def tolist(self):
        return list(self._v)


def zeros(n, dtype=None, device=None):
    if dtype != uint8:
        raise NotImplementedError("the host stand-in has uint8 tensors only")
    return Tensor((ctypes.c_uint8 * n)())


def all(t):  # noqa: A001 (torch's name)
    return builtins.all(t)


def unique(t):
    return Tensor(sorted(set(t)))


class cuda:  # noqa: N801 (torch's name)
    @staticmethod
    def is_available():
        # frt's host backend is the device here.
        return True

    @staticmethod
    def synchronize():
        import _flashrt_exec

        _flashrt_exec._synchronize_all()
