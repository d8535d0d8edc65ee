"""prange drivers: a compiled kernel's range form kernel(*args, lo, hi) run over blocks in one parallel call.

numba's `parallel=True` regions run on the threading layer's native workers, which wait by spinning
outside the GIL (libgomp: an empty two-chunk region costs 2.5-4 us on the 2-core VM, against 50-150 us
to wake a ThreadPoolExecutor worker). A driver splits range(total) into `blocks` equal cuts,
block b = [total*b//blocks, total*(b+1)//blocks), and runs the kernel once per block; numba hands the
blocks to its threads statically. The caller fixes `blocks` (by the shape where a kernel's bytes depend
on where it is cut), so which thread runs a block never changes a result.

Only the 'omp' and 'tbb' layers may be used: 'workqueue' (numba's fallback where neither library is
present) aborts the process when two threads enter parallel regions at once, and the executor runs
branches and sessions on several threads. layer_ok() runs the first parallel call (under a lock) and
says whether the layer it got is safe; callers keep their thread-pool path where it is not.
"""
from __future__ import annotations

import threading
import time

import numba as nb  # this module is imported only when a compiled kernel first runs
import numpy as np

SAFE_LAYERS = ("omp", "tbb")
_lock = threading.Lock()
_layer: list = []  # [] not probed; [name of the layer numba chose]
_drivers: dict = {}  # kernel -> its prange driver
PAR_OPTS = dict(parallel=True, nogil=True, cache=True)  # the options of every registered driver


@nb.njit(parallel=True, nogil=True, cache=True)
def _ping(a):
    for i in nb.prange(a.shape[0]):
        a[i] += 1.0


def layer() -> str:
    """The threading layer numba runs parallel regions on (the first parallel call chooses it)."""
    if not _layer:
        with _lock:
            if not _layer:
                _ping(np.zeros(2))
                _layer.append(nb.threading_layer())
    return _layer[0]


def layer_ok() -> bool:
    """Whether parallel regions may be entered from several threads at once (omp or tbb)."""
    return layer() in SAFE_LAYERS


def ping_s(pings: int = 9, gap_s: float = 5e-5, quantile: float = 0.5) -> float:
    """Seconds of an empty parallel region of one block per thread on the calling thread's numba threads,
    each after gap_s of work on the calling thread (a busy wait, as the serial kernels between two split
    ones of a run: a sleeping caller's vCPU halts, and waking it cost the ping 6-12 us on the 2-core VM
    against 2-4 us after a busy gap): the prange hand-off, the given quantile of `pings`. A region ends
    when its last worker does, so where other processes hold the cores a ping takes a scheduler slice
    (7-12 ms at load 2.8 on the 2-core VM): the median is meant to see that load (core.threads
    measures it again each second)."""
    a = np.zeros(max(2, nb.get_num_threads()))
    _ping(a)
    samples = []
    for _ in range(pings):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < gap_s:
            pass
        t0 = time.perf_counter()
        _ping(a)
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return samples[min(len(samples) - 1, int(len(samples) * quantile))]


def register(kernel, drv) -> None:
    """Record `drv` as the prange driver of `kernel`: a module-level numba function, parallel=True and
    cache=True, of the form drv(blocks, total, *args) running kernel(*args, lo, hi) over
    prange(blocks) with lo, hi = total*b//blocks, total*(b+1)//blocks. Written out per kernel because
    a driver made for a kernel at run time (driver()'s fallback) cannot be cached on disk: each costs
    about a second of compile in every process (the CNN training step's first run took 14.6 s)."""
    _drivers[kernel] = drv


def driver(kernel):
    """The prange driver of `kernel` (a numba function whose last two arguments are a range lo, hi):
    driver(kernel)(blocks, total, *args) runs kernel(*args, lo, hi) over the `blocks` cuts of
    range(total). The registered one (register), else one compiled for it now and kept for the process."""
    d = _drivers.get(kernel)
    if d is None:
        with _lock:
            _load_registered()
            d = _drivers.get(kernel)
            if d is None:
                d = _drivers[kernel] = _make(kernel)
    return d


def _load_registered() -> None:
    """Import the modules whose drivers register themselves (a kernel may be split before its
    driver's module was imported by anyone)."""
    from . import par_blas, par_conv, par_images, par_pool, par_update  # noqa: F401  # cycle: they import par


def _make(kernel):
    @nb.njit(parallel=True, nogil=True)
    def run(blocks, total, *args):
        for b in nb.prange(blocks):
            kernel(*args, total * b // blocks, total * (b + 1) // blocks)
    return run


__all__ = ["SAFE_LAYERS", "layer", "layer_ok", "ping_s", "register", "driver"]
