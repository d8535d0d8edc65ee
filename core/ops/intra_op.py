"""Memory-bound numpy passes (copies, relayouts, adds) split along one axis across the intra-op threads.

numpy runs a copy or a ufunc on one core but releases the GIL while it does, so the chunks of
one pass run at once on the threads of threads.fan_out; chunks smaller than
threads.min_chunk_bytes() (about ten hand-offs of work on this machine) are never handed out;
2-D products split the same way by FLOPs (matmul). Other array modules (cupy) run the pass whole:
a GPU parallelises it itself.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Optional

import numpy as np

from ... import jit
from .. import threads
from ..threads import fan_out
from . import numpy_blas


def _cut(axis: int, lo: int, hi: int) -> tuple:
    return (slice(None),) * axis + (slice(lo, hi),)


def _never_splits(total: int, nbytes: int) -> bool:
    """fan_out would run this on the caller alone, whatever the thread count (no chunk of
    MIN_CHUNK_BYTES, the least chunk on any machine, for a second thread): the caller skips fan_out
    and its reads of BLAS's count, a few microseconds a call, which at batch 1 add up to a tenth of
    a small network's run."""
    return total <= 1 or nbytes < 2 * threads.MIN_CHUNK_BYTES


def copy_into(xp, dst, src, axis: int = 0):
    """dst[...] = src (same shapes), in chunks along `axis`. Returns dst."""
    if xp is not np or _never_splits(dst.shape[axis] if dst.ndim else 1, dst.nbytes):
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
    if xp is not np or _never_splits(dst.shape[axis] if dst.ndim else 1, dst.nbytes):
        dst += src
        return dst

    def part(lo, hi):
        c = _cut(axis, lo, hi)
        dst[c] += src[c]
    fan_out(part, dst.shape[axis], dst.nbytes)
    return dst


def rows_apply(xp, fn: Callable[[int, int], None], total: int, nbytes: int, blas_inside: bool = False,
               flops: int = 0) -> None:
    """fn(lo, hi) over chunks of range(total) (the caller's own pass over `nbytes` in all; flops > 0:
    chunks sized by these FLOPs instead, for compute-bound work such as a batch's per-image GEMMs;
    blas_inside: fn's small BLAS products run one-threaded while the chunks run)."""
    small = flops < 2 * threads.MIN_CHUNK_FLOPS if flops else _never_splits(total, nbytes)
    if xp is not np or ((small or total <= 1)
                        and (not blas_inside or threads.blas_held_here() or threads.intra_threads() == 1)):
        fn(0, total)  # one chunk, and BLAS (if fn calls it) on one thread already: no hold needed
        return
    fan_out(fn, total, flops or nbytes, blas_inside, flops=bool(flops))


def par_rows(kernel, args: tuple, total: int, work: float, flops: bool = False, blocks: Optional[int] = None,
             blas_inside: bool = False) -> int:
    """kernel(*args, lo, hi) over range(total) (numpy arrays; `work` bytes, or FLOPs with flops=True,
    in all), split inside one compiled call across numba's threads where threads.par_threads says
    it pays (jit.par's prange driver, a hand-off of a few microseconds); one serial call where it
    does not; fan_out's chunks where prange is unavailable. blocks None: the kernel's results do not
    depend on where range(total) is cut (each item computed alone), so it is cut once per thread;
    else into exactly `blocks` cuts whatever the threads (a kernel whose bytes depend on its cuts:
    a GEMM's tiles), run one by one when serial. blas_inside: the kernel calls BLAS, held to one
    thread while it runs. Returns the threads used (1: serial)."""
    k = threads.par_threads(total if blocks is None else blocks, work, flops)
    hold = blas_inside and not threads.blas_held_here()
    with (threads.BlasThreads(1) if hold else _NO_HOLD):
        if k == 1:
            if blocks is None:
                kernel(*args, 0, total)
            else:
                for b in range(blocks):
                    kernel(*args, total * b // blocks, total * (b + 1) // blocks)
            return 1
        if k == 0:
            return _pool_rows(kernel, args, total, work, flops, blocks)
        from ...jit.par import driver  # deferred: loads numba
        threads.numba_threads(k)
        driver(kernel)(k if blocks is None else blocks, total, *args)
        return k


def _pool_rows(kernel, args, total, work, flops, blocks) -> int:
    """par_rows without prange: the same cuts on the intra-op pool (threads.fan_out)."""
    if blocks is None:
        return fan_out(lambda lo, hi: kernel(*args, lo, hi), total, work, flops=flops)

    def cuts(b0, b1):
        for b in range(b0, b1):
            kernel(*args, total * b // blocks, total * (b + 1) // blocks)
    return fan_out(cuts, blocks, work, flops=flops)


_NO_HOLD = contextlib.nullcontext()


def serial_blas(xp, fn: Callable[[], object]):
    """fn() with BLAS held to one thread (numpy): for a loop of small products (a recurrent step's),
    each of which a threaded BLAS would follow by waiting on its other threads."""
    if xp is not np:
        return fn()
    box = []
    fan_out(lambda lo, hi: box.append(fn()), 1, 0, blas_inside=True)
    return box[0]


# OpenBLAS runs products under about this size on one thread by itself (M*N*K <= 4 * 65536):
# they skip the hold on BLAS's count and its few microseconds
_BLAS_SERIAL_FLOPS = 2 * 4 * 65536


def matmul(xp, a, b, out=None):
    """a [M, K] @ b [K, N] (into `out` when given) split by the larger of M and N across the
    intra-op threads into parts of at least threads.min_chunk_flops() (about ten hand-offs of work),
    each part one-threaded BLAS; a product too small to split runs whole on one BLAS thread.
    OpenBLAS's own threads beat this split on a quiet machine (the 2-core VM, load 2: 32x784x512
    331 us one thread, 395 split, 194 BLAS-threaded), but they spin between calls and wait on each
    other at every call: with the cores shared (load 3.4-3.9, the same process, interleaved) a
    CNN at batch 32 took 144 ms BLAS-threaded against 18 split and 24 on one thread, a transformer
    encoder 124 ms against 9.2 and 8.9. The pool's threads sleep when idle and a part waits only
    for its own chunk."""
    if xp is not np or a.ndim != 2 or b.ndim != 2 or 2 * a.size * b.shape[1] < _BLAS_SERIAL_FLOPS:
        return xp.matmul(a, b) if out is None else xp.matmul(a, b, out=out)
    m, n = a.shape[0], b.shape[1]
    flops = 2 * m * n * a.shape[1]
    if flops < 2 * threads.MIN_CHUNK_FLOPS and (threads.blas_held_here() or threads.intra_threads() == 1):
        # it cannot split and BLAS is on one thread already: fan_out's hold would only cost its
        # few microseconds, a third of a [32, 64] x [64, 192] product
        return np.matmul(a, b) if out is None else np.matmul(a, b, out=out)
    if out is None:
        out = np.empty((m, n), dtype=np.result_type(a, b))
    if _par_matmul(a, b, out, m, n, flops):
        return out
    if n >= m:
        def part(lo, hi):
            np.matmul(a, b[:, lo:hi], out=out[:, lo:hi])
        fan_out(part, n, flops, blas_inside=True, flops=True)
    else:
        def part(lo, hi):
            np.matmul(a[lo:hi], b, out=out[lo:hi])
        fan_out(part, m, flops, blas_inside=True, flops=True)
    return out


def _par_matmul(a, b, out, m: int, n: int, flops: int) -> bool:
    """matmul's split as one prange call of BLAS GEMMs over column (or row) ranges (jit.par_blas),
    where float32 operands go to BLAS as they lie and threads.par_threads splits: the cuts fan_out
    would make, without the pool's hand-off. False: nothing done (the caller fans out)."""
    if not (a.dtype == b.dtype == out.dtype == np.float32 and out.strides[1] == 4 and jit.available()
            and numpy_blas.sgemm() is not None):
        return False
    from ...jit import par_blas  # deferred: loads numba
    if not (par_blas.blasable(a) and par_blas.blasable(b) and par_blas.blasable(out)):
        return False
    total = n if n >= m else m
    if threads.par_threads(total, flops, flops=True) < 2:
        return False
    par_rows(par_blas.gemm_cols_range if n >= m else par_blas.gemm_rows_range, (numpy_blas.sgemm(), a, b, out, 0.0),
             total, flops, flops=True, blas_inside=True)
    return True


# matmul_ksplit: at most this many parts, each of at least _KSPLIT_MIN_K contracted columns and
# _KSPLIT_PART_FLOPS (the count depends on the shape only, never on the machine's measured
# hand-off: the parts' sums are the result's bytes)
_KSPLIT_MAX_PARTS = 8
_KSPLIT_MIN_K = 64
_KSPLIT_PART_FLOPS = 8 * 4_000_000


def ksplit_parts(m: int, k: int, n: int) -> int:
    """How many parts matmul_ksplit cuts a [m, k] @ [k, n] product's contraction into: a function of
    the shape alone, never of the thread count, so the partial sums and their bits are the same
    on any number of threads. 1: no split (the contraction is not the long side, or too little work)."""
    if k < 4 * max(m, n):
        return 1
    flops = 2 * m * n * k
    return max(1, min(_KSPLIT_MAX_PARTS, k // _KSPLIT_MIN_K,
                      flops // _KSPLIT_PART_FLOPS))


def matmul_ksplit(xp, a, b, out=None):
    """a [M, K] @ b [K, N] for a long contraction and a small output (a filter gradient: [O, C*k]
    over every pixel of the batch) as the sum, in order, of ksplit_parts products over fixed ranges
    of K, the parts spread over the intra-op threads (one BLAS thread each). Split by rows or
    columns (matmul), every thread would read and pack the whole of the long operand that is not
    split: the CNN's first filter gradient, [25, 50176] @ [50176, 32], ran slower on two threads
    than on one that way."""
    m, k = a.shape
    n = b.shape[1]
    parts = ksplit_parts(m, k, n) if xp is np and a.ndim == b.ndim == 2 else 1
    if parts <= 1:
        return matmul(xp, a, b, out=out)
    bounds = [k * i // parts for i in range(parts + 1)]

    def product(j, dst):
        np.matmul(a[:, bounds[j]:bounds[j + 1]], b[bounds[j]:bounds[j + 1]], out=dst)
    return sum_of_parts(product, parts, (m, n), np.result_type(a, b), 2 * m * n * k, out)


def sum_of_parts(product: Callable[[int, object], None], parts: int, shape: tuple, dtype, flops: int, out=None):
    """product(j, dst) for j < parts (each a BLAS product into its own [shape] buffer) spread over
    the intra-op threads, one BLAS thread each, then the partials added in order of j: the same
    bytes on any number of threads for a given `parts`."""
    partial = np.empty((parts,) + tuple(shape), dtype=dtype)

    def run(lo, hi):
        for j in range(lo, hi):
            product(j, partial[j])
    # a thread takes whole parts, min_chunk_flops() at least (the parts, and so the bytes, are the
    # same on any number of threads)
    fan_out(run, parts, flops, blas_inside=True, flops=True)
    if out is None:
        out = partial[0]
    else:
        out[...] = partial[0]
    for j in range(1, parts):
        np.add(out, partial[j], out=out)
    return out


__all__ = ["par_rows", "copy_into", "contiguous", "add_into", "rows_apply", "serial_blas", "matmul", "matmul_ksplit",
           "ksplit_parts", "sum_of_parts"]
