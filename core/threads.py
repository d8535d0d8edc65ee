"""A session's thread counts (intra-op: BLAS and compiled kernels; inter-op: the branch pool), applied per run.

As TensorFlow's ConfigProto: `Session(g, intra_op_threads=..., inter_op_threads=...)`.
- intra_op_threads: the threads one kernel may use. BLAS gets it through threadpoolctl around
  each run (set only when it differs, restored when the last concurrent run ends: OpenBLAS's
  count is process-wide, so concurrent runs of sessions with other counts share the last one
  set), and the compiled kernels (isthmus.jit, numba `prange`) get it through
  numba.set_num_threads, which numba keeps per calling thread. Default: the cores this process
  may run on. A kernel still decides by its size whether to fan out (jit.parallel_pays).
- inter_op_threads: the executor's branch pool for independent nodes (scheduler.py). 1 runs the
  plan serially; default: max(2, min(8, cores)), the rule the pool has always had, and the pool
  is used only where the cost model says branches pay.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Optional

_lock = threading.Lock()
_controller = None  # threadpoolctl's view of the BLAS libraries, made once numpy's BLAS is loaded
_active = {"runs": 0, "saved": None}  # BLAS count before the first of the concurrent runs began


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
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Session option {option}: expected an integer >= 1 or None (the default), "
                         f"got {value!r}")
    return value


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
        if n is None:
            _set_numba(blas_threads_now() or cores())
            return self
        with _lock:
            libs = _blas_libs()
            if _active["runs"] == 0:
                _active["saved"] = [lib.num_threads for lib in libs]
            _active["runs"] += 1
            for lib in libs:
                if lib.num_threads != n:
                    lib.set_num_threads(n)
        _set_numba(n)
        return self

    def __exit__(self, *exc):
        if self.n is None:
            return False
        with _lock:
            _active["runs"] -= 1
            if _active["runs"] == 0:
                for lib, k in zip(_blas_libs(), _active["saved"] or []):
                    if lib.num_threads != k:
                        lib.set_num_threads(k)
                _active["saved"] = None
        return False


def _set_numba(n: int) -> None:
    numba = sys.modules.get("numba")  # only when compiled kernels are loaded: never import numba here
    if numba is not None:
        numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))


def blas_threads_now() -> Optional[int]:
    """The BLAS thread count now (the largest over the loaded libraries); None without BLAS."""
    counts = [lib.num_threads for lib in _blas_libs()]
    return max(counts) if counts else None


__all__ = ["cores", "default_inter_op_threads", "check_option", "IntraOpThreads", "blas_threads_now"]
