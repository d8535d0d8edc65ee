"""A kernel's output buffer reused from run to run once nothing else holds it (numpy arrays of
MIN_BYTES to MAX_BYTES; others are allocated afresh).

Why: at batch 1 a plan's intermediates are a few hundred KB each, and the buffer malloc hands a
kernel is often one no recent run touched, so writing the output pays for cache misses the copy
itself does not: SqueezeNet's 128x24x24 fire-module Concat took 61 us in the plan and 22 us
writing into the buffer it filled the run before (one thread, load ~2; onnxruntime, whose arena
reuses buffers, 16 us).

Safety: a buffer is reused only when its reference count says the recycler's own reference is
the only one left: a caller still holding the output, a fetch, a view of it (its base) or a
concurrent run keeps it out of reuse, and a new buffer is allocated instead.
"""
from __future__ import annotations

import sys

import numpy as np

# the references a reusable buffer has inside take(): the local name and getrefcount's argument
_FREE_REFS = 2
# larger outputs are not kept: they outgrow the caches that make reuse pay (512 KiB L2 here), and
# a kept buffer is memory held between runs (SqueezeNet at batch 32 would keep 40 MB of Concats)
MAX_BYTES = 2 << 20
# nor smaller ones: malloc serves those from chunks just freed, still in cache, while a kept buffer
# was last written a run ago (SqueezeNet's 384x6x6 Concats, 55 KB: 6.5 us fresh, 12 us kept;
# its 256x12x12 ones, 147 KB: 31 us fresh, 16 us kept)
MIN_BYTES = 96 << 10


class Recycled:
    """take(shape, dtype) -> an uninitialised array the caller fills and returns as its output."""
    __slots__ = ("_free",)

    def __init__(self):
        self._free: list = []  # list.pop and list.append are atomic under the GIL: no lock needed

    def take(self, shape, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        if not MIN_BYTES <= dtype.itemsize * _size(shape) <= MAX_BYTES:
            return np.empty(shape, dtype)
        try:
            buf = self._free.pop()
        except IndexError:
            buf = None
        if buf is None or sys.getrefcount(buf) != _FREE_REFS or buf.shape != shape or buf.dtype != dtype:
            buf = np.empty(shape, dtype)
        self._free.append(buf)
        return buf


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
