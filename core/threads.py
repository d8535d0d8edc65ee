"""A session's thread counts (intra-op: BLAS and compiled kernels; inter-op: the branch pool), applied per run.

As TensorFlow's ConfigProto: `Session(g, intra_op_threads=..., inter_op_threads=...)`.
- intra_op_threads: the threads one kernel may use. BLAS gets it through threadpoolctl around
  each run (set only when it differs, restored when the last concurrent run ends: OpenBLAS's
  count is process-wide, so concurrent runs of sessions with other counts share the last one
  set), numba through numba.set_num_threads on the calling thread (for `prange` kernels; the
  compiled depthwise and batch-norm kernels take row/channel ranges on the intra-op pool
  instead), and the kernels' own splits through intra_threads(): numpy passes and 2-D GEMMs cut
  by `fan_out` (core/ops/intra_op.py; GEMM parts run one-threaded BLAS, so BLAS's own threads
  serve only products too small to split). Default (None): the count BLAS has when the run
  starts, which is the cores unless the process was limited (OPENBLAS_NUM_THREADS, threadpoolctl,
  partitioner.set_blas_threads, ISTHMUS_BLAS_THREADS): a session never overrides a limit it was
  not given. Small work never fans out (MIN_CHUNK_BYTES, MIN_CHUNK_FLOPS).
- inter_op_threads: the executor's branch pool for independent nodes (scheduler.py). 1 runs the
  plan serially; default: max(2, min(8, cores)), the rule the pool has always had, and the pool
  is used only where the cost model says branches pay.
"""
from __future__ import annotations

import contextlib
import numbers
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import numpy as np

_lock = threading.Lock()
_controller = None  # threadpoolctl's view of the BLAS libraries, made once numpy's BLAS is loaded
_active = {"runs": 0, "saved": None}  # BLAS count before the first of the concurrent runs began
_intra = [None]  # the intra-op count of the run in progress (process-wide, like BLAS's); None: BLAS's count

# fan_out gives a thread a chunk only when the chunk moves at least this many bytes: a chunk
# handed to a pool thread costs about 20-50 us of dispatch and wake-up (Python futures) on a
# server, and a memory-bound numpy pass moves about 1 MiB in 100 us, so smaller work runs on the
# caller alone. (On the 2-core development VM, whose idle cores halt, a hand-off measured 40-140
# us: there the sizes are small by several times; they are not scaled per machine yet.)
MIN_CHUNK_BYTES = 1 << 20
# the same for a GEMM split by rows or columns: 4 MFLOP take about 100 us on one core here
MIN_CHUNK_FLOPS = 4_000_000
_workers = None  # the intra-op pool: the threads besides the caller that fan_out hands chunks to


def cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_inter_op_threads() -> int:
    return max(2, min(8, cores()))


def check_option(value, option: str, default: Optional[int]) -> Optional[int]:
    """`value` of the session option `option` as a thread count (None: `default`); ValueError else."""
    if value is None:
        return default
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"Session option {option}: expected an integer >= 1 or None (the default), "
                         f"got {value!r}")
    return int(value)


def _blas_libs():
    global _controller
    if _controller is None:
        try:
            import threadpoolctl  # deferred: its library scan costs milliseconds
        except ImportError:
            return []
        _controller = threadpoolctl.ThreadpoolController().select(user_api="blas")
    return _controller.lib_controllers


class IntraOpThreads:
    """A context manager around one run: BLAS and numba limited to `n` threads inside it
    (None: BLAS as it is, numba to BLAS's count)."""

    def __init__(self, n: Optional[int]):
        self.n = n

    def __enter__(self):
        n = self.n
        if n is None:  # intra_threads() reads BLAS's count as it goes; numba follows it once loaded
            if "numba" in sys.modules:  # reading BLAS's count costs ~3 us: not for runs that cannot use it
                _set_numba(blas_threads_now() or cores())
            return self
        _intra[0] = n
        with _lock:
            libs = _blas_libs()
            if _active["runs"] == 0:
                _active["saved"] = [lib.num_threads for lib in libs]
            _active["runs"] += 1
            for lib in libs:
                if lib.num_threads != n:
                    _set_blas(lib, n)
        _set_numba(n)
        return self

    def __exit__(self, *exc):
        if self.n is None:
            return False
        with _lock:
            _active["runs"] -= 1
            if _active["runs"] == 0:
                _intra[0] = None
                for lib, k in zip(_blas_libs(), _active["saved"] or []):
                    if lib.num_threads != k:
                        _set_blas(lib, k)
                _active["saved"] = None
        return False


_setters: dict = {}  # BLAS library path -> its own set_num_threads (None: threadpoolctl's)


def _set_blas(lib, n: int) -> None:
    """Set one BLAS library's thread count from whatever thread calls. threadpoolctl (3.6 and
    later) lets only one Python thread change a pthreads OpenBLAS's count, the first to set it
    while that thread lives, and drops every other thread's call without a word: a gRPC
    handler thread's one-BLAS-thread block then ran its GEMM parts on two BLAS threads, so a
    product's bits depended on which thread ran the step. isthmus serialises the count itself
    (_lock, the refcounted blocks below), so it calls the library's own setter."""
    key = getattr(lib, "filepath", id(lib))
    if key not in _setters:
        setter = None
        if getattr(lib, "internal_api", None) == "openblas" and getattr(lib, "threading_layer", None) != "openmp":
            dynlib = getattr(lib, "dynlib", None)   # threadpoolctl's ctypes handle and the build's symbol affixes
            pre, suf = getattr(lib, "_symbol_prefix", ""), getattr(lib, "_symbol_suffix", "")
            setter = getattr(dynlib, f"{pre}openblas_set_num_threads{suf}", None) if dynlib is not None else None
        _setters[key] = setter
    setter = _setters[key]
    if setter is not None:
        setter(int(n))
    else:
        lib.set_num_threads(n)


def _set_numba(n: int) -> None:
    numba = sys.modules.get("numba")  # only when compiled kernels are loaded: never import numba here
    if numba is not None:
        numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))


def session_intra_threads() -> Optional[int]:
    """The running session's intra_op_threads; None when it left the default (BLAS's count)."""
    return _intra[0]


def intra_threads() -> int:
    """The threads a kernel may use now: the running session's intra_op_threads, else BLAS's count."""
    n = _intra[0]
    if n is not None:
        return n
    saved = _hold["saved"]  # inside another thread's one-BLAS-thread block: the count it will restore,
    if saved:               # so that how a product is split (and so its bits) does not depend on timing
        return max(saved) or 1
    return blas_threads_now() or 1


def intra_pool() -> ThreadPoolExecutor:
    """The pool of threads (cores - 1) that intra-op work is split onto besides the caller."""
    global _workers
    if _workers is None:
        with _lock:
            if _workers is None:
                _workers = ThreadPoolExecutor(max_workers=max(1, cores() - 1), thread_name_prefix="isthmus-intra")
    return _workers


def fan_out(fn: Callable[[int, int], None], total: int, nbytes: int, blas_inside: bool = False,
            min_chunk: Optional[int] = None) -> int:
    """Run fn(lo, hi) over [lo, hi) chunks of range(total) on up to intra_threads() threads (the
    caller runs the first chunk) and wait for all; work of `nbytes` in all fans out only into
    chunks of at least MIN_CHUNK_BYTES. fn must release the GIL to gain (numpy copies and ufuncs
    do). blas_inside: fn calls BLAS; BLAS is held to one thread while it runs, split or not
    (the chunks are the parallelism; a threaded BLAS inside each would oversubscribe, and a
    product too small to split gains little from BLAS's threads, which then spin for a while
    after the call on cores the next pass wants).
    min_chunk: the least work per chunk, in the unit of `nbytes` (default MIN_CHUNK_BYTES; a
    GEMM passes its FLOPs and MIN_CHUNK_FLOPS). Returns the number of chunks."""
    k = min(intra_threads(), total, int(nbytes // (min_chunk or MIN_CHUNK_BYTES)))
    if k <= 1:
        with (_OneBlasThread() if blas_inside else _NO_LIMIT):
            fn(0, total)
        return 1
    bounds = [total * i // k for i in range(k + 1)]
    with (_OneBlasThread() if blas_inside else _NO_LIMIT):
        futures = [intra_pool().submit(fn, bounds[i], bounds[i + 1]) for i in range(1, k)]
        try:
            fn(bounds[0], bounds[1])
        finally:
            for f in futures:
                f.result()  # re-raises a chunk's error here, after every chunk has ended
    return k


_hold = {"depth": 0, "saved": None}  # the one-BLAS-thread blocks running now (any thread) and the count before


class _OneBlasThread:
    """BLAS on one thread inside the block; the count before is restored when the last block that
    overlaps it ends (BLAS's count is process-wide: per-call save/restore let two overlapping
    blocks leave it at 1 for good)."""

    def __enter__(self):
        with _lock:
            if _hold["depth"] == 0:
                libs = _blas_libs()
                _hold["saved"] = [lib.num_threads for lib in libs]
                for lib, k in zip(libs, _hold["saved"]):
                    if k != 1:
                        _set_blas(lib, 1)
            _hold["depth"] += 1
        return self

    def __exit__(self, *exc):
        with _lock:
            _hold["depth"] -= 1
            if _hold["depth"] == 0:
                for lib, k in zip(_blas_libs(), _hold["saved"] or []):
                    if k != 1:
                        _set_blas(lib, k)
                _hold["saved"] = None
        return False


_NO_LIMIT = contextlib.nullcontext()


def blas_threads_now() -> Optional[int]:
    """The BLAS thread count now (the largest over the loaded libraries); None without BLAS."""
    counts = [lib.num_threads for lib in _blas_libs()]
    return max(counts) if counts else None


__all__ = ["cores", "default_inter_op_threads", "check_option", "IntraOpThreads", "blas_threads_now",
           "session_intra_threads", "intra_threads", "intra_pool", "fan_out", "MIN_CHUNK_BYTES", "MIN_CHUNK_FLOPS"]
