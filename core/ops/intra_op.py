"""Memory-bound numpy passes (copies, relayouts, adds) split along one axis across the intra-op threads.

numpy runs a copy or a ufunc on one core but releases the GIL while it does, so the chunks of
one pass run at once on the threads of threads.fan_out; chunks smaller than
threads.MIN_CHUNK_BYTES are never handed out. Other array modules (cupy) run the pass whole:
a GPU parallelises it itself.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..threads import fan_out


def _cut(axis: int, lo: int, hi: int) -> tuple:
    return (slice(None),) * axis + (slice(lo, hi),)


def copy_into(xp, dst, src, axis: int = 0):
    """dst[...] = src (same shapes), in chunks along `axis`. Returns dst."""
    if xp is not np:
        dst[...] = src
        return dst

    def part(lo, hi):
        c = _cut(axis, lo, hi)
        dst[c] = src[c]
    fan_out(part, dst.shape[axis], dst.nbytes)
    return dst


def contiguous(xp, src, axis: int = 0):
    """A C-contiguous copy of `src` (any strides), made in chunks along `axis`."""
    if xp is not np:
        return xp.ascontiguousarray(src)
    return copy_into(xp, np.empty(src.shape, dtype=src.dtype), src, axis)


def add_into(xp, dst, src, axis: int = 0):
    """dst += src (src broadcastable along every axis but `axis`), in chunks along `axis`."""
    if xp is not np:
        dst += src
        return dst

    def part(lo, hi):
        c = _cut(axis, lo, hi)
        dst[c] += src[c]
    fan_out(part, dst.shape[axis], dst.nbytes)
    return dst


def rows_apply(xp, fn: Callable[[int, int], None], total: int, nbytes: int, blas_inside: bool = False) -> None:
    """fn(lo, hi) over chunks of range(total) (the caller's own pass over `nbytes` in all;
    blas_inside: fn's small BLAS products run one-threaded while the chunks run)."""
    if xp is not np:
        fn(0, total)
        return
    fan_out(fn, total, nbytes, blas_inside)


__all__ = ["copy_into", "contiguous", "add_into", "rows_apply"]
