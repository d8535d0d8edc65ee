"""A session's thread counts (intra-op: BLAS and compiled kernels; inter-op: the branch pool), applied per run.

As TensorFlow's ConfigProto: `Session(g, intra_op_threads=..., inter_op_threads=...)`.
- intra_op_threads: the threads one kernel may use. BLAS gets it through threadpoolctl around
  each run (set only when it differs, restored when the last concurrent run ends: OpenBLAS's
  count is process-wide, so concurrent runs of sessions with other counts share the last one
  set), numba through numba.set_num_threads on the calling thread (for `prange` kernels; the
  compiled depthwise and batch-norm kernels take row/channel ranges on the intra-op pool
  instead), and the kernels' own splits through intra_threads(): numpy passes cut by `fan_out`
  and 2-D GEMMs (core/ops/intra_op.py; GEMM parts run one-threaded BLAS, so BLAS's own threads
  serve only products too small to split). Default (None): the count BLAS has when the run
  starts, which is the cores unless the process was limited (OPENBLAS_NUM_THREADS, threadpoolctl,
  partitioner.set_blas_threads, ISTHMUS_BLAS_THREADS): a session never overrides a limit it was
  not given. Small work never fans out: a chunk carries about ten hand-offs of work, the hand-off
  measured once per process (handoff_s, min_chunk_bytes, min_chunk_flops). A default run whose
  plan has products holds BLAS to one thread throughout (RunBlasHold: the pool's chunks are its
  parallelism, and BLAS's spinning threads never compete with them); a batch-1 plan of small
  nodes runs on one intra-op thread (OneThreadRun, thread-local). What this gives: on 1 core,
  nothing splits and nothing is held; on the 2-core VM (hand-off 50-170 us) chunks of 5-17 MiB
  or 20-70 MFLOP, so only batch-32 convolutions and the largest passes split; on a server with
  a 10-30 us hand-off, 1-3 MiB / 4-12 MFLOP chunks over up to cores threads.
- The prange path (intra_op.par_rows, jit.par): compiled kernels split inside one numba parallel
  call, whose workers (libgomp's) spin outside the GIL: a hand-off of 2-4 us (measured after a busy
  stretch, as a run's caller meets it) instead of the pool's 50-150 us on the 2-core VM, and a block
  carries five hand-offs of work where a pool chunk carries ten (prange_handoff_s, par_scale,
  par_threads; blocks fixed by the shape where a kernel's bytes depend on its cuts). A run reads
  the gates once (RunGate: the intra-op count, the idle gate, the scale, the free cores). Used
  only on the omp or tbb layers (numba's workqueue aborts on concurrent parallel calls), never in
  a forked child, and measured again each second so that a loaded machine stops splitting (a
  region waits for its last worker); par_threads also asks core/idle.py whether other processes
  leave a core (their CPU time over the last second, this process's own threads excluded) and
  sends the work to the pool (0) when they do not. Compute-bound kernels are sized by FLOPs
  (convolutions over images, pixel blocks or weight panels: par_gate.split_rows). Spinning costs
  CPU: while a run splits, the workers spin between its regions (process CPU near 2x wall at two
  threads); libgomp's default spin is left as it is: bounded (GOMP_SPINCOUNT 1000 / 10000, set
  before the first region) the hand-off after a 0.1-2 ms serial stretch rose from 4-13 us to
  34-118 / 2-520 us on the 2-core VM, where waking a sleeping vCPU's thread is slow.
  OMP_WAIT_POLICY=passive trades the same way; ISTHMUS_PRANGE=0 turns prange off,
  ISTHMUS_IDLE_GATE=0 the idle-core gate.
- inter_op_threads: the executor's branch pool for independent nodes (scheduler.py). 1 runs the
  plan serially; default: max(2, min(8, cores)), the rule the pool has always had, and the pool
  is used only where the cost model says branches pay.
"""
from __future__ import annotations

import contextlib
import numbers
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import numpy as np

from . import idle
from .blas_libs import BlasThreads, _blas_libs, _blas_to, _get_blas, _hold, _lock, _set_blas, blas_threads_now  # noqa: F401

_active = {"runs": 0, "saved": None}  # BLAS count before the first of the concurrent runs began
_intra = [None]  # the intra-op count of the run in progress (process-wide, like BLAS's); None: BLAS's count
_local = threading.local()  # .intra: a count for this thread's run alone (OneThreadRun); .blas_held: RunBlasHold's
_measure_lock = threading.Lock()

# fan_out gives a thread a chunk only when the chunk carries about ten hand-offs of work. These are
# the sizes for a hand-off (submit to the pool and wait, a round trip) of HANDOFF_REF_S or less: a
# memory-bound numpy pass moves about 1 MiB in 100 us, a GEMM does about 4 MFLOP in 100 us on one
# core. A slower hand-off, measured once per process (handoff_s), scales both up (chunk_scale):
# the 2-core development VM, whose idle vCPUs halt (cpuidle haltpoll, guest_halt_poll_ns 0), took
# 45-140 us, so its chunks are 5-14 times these.
MIN_CHUNK_BYTES = 1 << 20
MIN_CHUNK_FLOPS = 4_000_000
HANDOFF_REF_S = 10e-6
_handoff = [None]  # seconds, measured at the first fan-out that could split (or ISTHMUS_HANDOFF_US)
_workers = None  # the intra-op pool: the threads besides the caller that fan_out hands chunks to


CORES_RECHECK_S = 1.0
_cores = [1, -1.0]  # the count at the last read, when (perf_counter; -1: never)


def cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform tells it), read again
    after CORES_RECHECK_S (a read costs about 0.8 us, and every split gate asks)."""
    now = time.perf_counter()
    if now - _cores[1] > CORES_RECHECK_S:
        try:
            n = max(1, len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            n = max(1, os.cpu_count() or 1)
        _cores[:] = [n, now]
    return _cores[0]


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
                _active["saved"] = [_hold["saved"][i] if _hold["held"] else _get_blas(lib) for i, lib in enumerate(libs)]
            _active["runs"] += 1
            _blas_to(libs, [n] * len(libs))
        _set_numba(n)
        return self

    def __exit__(self, *exc):
        if self.n is None:
            return False
        with _lock:
            _active["runs"] -= 1
            if _active["runs"] == 0:
                _intra[0] = None
                _blas_to(_blas_libs(), _active["saved"] or [])
                _active["saved"] = None
        return False


def _set_numba(n: int) -> None:
    """numba's count on the calling thread at n (clamped to its pool), set only when the count this
    module last set here differs, as numba_threads: numba's setter takes a lock and checks its pool
    (about 2 us), and a default run asked for it every time (its count follows BLAS's)."""
    numba = sys.modules.get("numba")  # only when compiled kernels are loaded: never import numba here
    if numba is not None:
        k = max(1, min(n, numba.config.NUMBA_NUM_THREADS))
        if getattr(_local, "numba", None) != k:
            numba.set_num_threads(k)
            _local.numba = k


def numba_threads(n: int) -> None:
    """numba's thread count on the calling thread (thread-local in numba) at n, for the prange
    drivers: set only when the count this module last set here differs (numba's own getter and
    setter cost 1-1.5 us a call). A count set around isthmus (numba.set_num_threads) is not seen:
    it changes how many threads run the blocks, never the blocks or their bytes."""
    if getattr(_local, "numba", None) != n:
        import numba  # deferred: the caller runs a compiled kernel, so numba is loaded already
        k = max(1, min(n, numba.config.NUMBA_NUM_THREADS))
        if getattr(_local, "numba", None) != k:  # the clamped count, as _set_numba keeps it
            _local.numba = k
            numba.set_num_threads(k)


# The prange path (jit.par): a split hands blocks to numba's native workers, which spin outside the
# GIL; the hand-off (an empty two-block region after a busy stretch, as inside a run) measured 2-4 us
# on the 2-core VM. A block carries about PRANGE_BLOCK_HANDOFFS hand-offs of work (fan_out's chunks
# ten: a pool thread wakes from sleep, a spinning worker does not): MIN_CHUNK_BYTES/FLOPS times the
# hand-off over HANDOFF_REF_S times PRANGE_BLOCK_HANDOFFS / 10, but never under PAR_SCALE_FLOOR times
# them (100 KiB, 0.4 MFLOP). Batch-1 networks at default threads, the hand-off pinned (one process,
# the settings interleaved, 7 rounds): ResNet-shaped 3.49 / 3.44 / 3.72 / 4.07 ms at 1 / 2 / 4 / 8 us
# (one thread 4.23), Inception 1.80 / 1.89 / 1.86 / 2.03 (2.28), SqueezeNet 1.77 / 1.80 / 1.75 / 1.91
# (2.01), MobileNetV2-96 1.41 / 1.44 / 1.47 / 1.56 (1.47): blocks of five measured hand-offs.
PRANGE_BLOCK_HANDOFFS = 5
PAR_SCALE_FLOOR = 0.1
# A parallel region ends when its last worker does: where other processes hold the cores, a worker
# waits for one, and a split costs a scheduler slice (2-core VM at load 4: the CNN training step at
# two threads 222 ms with prange splits against 131 at one thread). So the hand-off is measured
# again every PAR_REMEASURE_S while splits are asked for (5 pings, about 0.2 ms), and a loaded
# machine stops splitting until its load falls.
PAR_REMEASURE_S = 1.0
_prange: list = [None]  # None: not probed; False: no prange here; else the hand-off in seconds
_prange_at = [0.0]  # perf_counter() of the last measurement (0: pinned by the environment)
_remeasure_lock = threading.Lock()


def prange_handoff_s() -> Optional[float]:
    """Seconds to hand blocks to numba's parallel workers and get them back, measured at the first
    split that could use them and again after PAR_REMEASURE_S (ISTHMUS_PRANGE_HANDOFF_US sets it
    instead); None where prange kernels must not run: one core, ISTHMUS_PRANGE=0, or a threading
    layer that aborts on concurrent parallel calls (numba's workqueue: jit.par.layer_ok)."""
    h = _prange[0]
    if h is None:
        with _measure_lock:
            if _prange[0] is None:
                _prange[0] = _probe_prange()
        h = _prange[0]
    elif h and _prange_at[0] and time.perf_counter() - _prange_at[0] > PAR_REMEASURE_S \
            and _remeasure_lock.acquire(blocking=False):  # one thread measures; the others use the last
        try:
            from ..jit import par  # deferred: numba is loaded (the first measurement loaded it)
            h = _prange[0] = max(1e-9, _ping_at_all(lambda: par.ping_s(pings=5, gap_s=5e-5, quantile=0.5)))
            _prange_at[0] = time.perf_counter()
        finally:
            _remeasure_lock.release()
    return h or None


def prange_may_run() -> bool:
    """Whether this process's kernels may split by prange (not known to be off): runs given several
    intra-op threads then hold BLAS to one thread as default runs do (executor.Plan.__call__,
    RunBlasHold). OpenBLAS's workers spin for milliseconds after a threaded call; beside them
    libgomp's worker waited for a core (2-core VM: every measured prange hand-off 7.9 ms inside
    runs at intra_op_threads=2, so nothing split)."""
    return _prange[0] is not False and cores() > 1 and os.environ.get("ISTHMUS_PRANGE", "").strip() != "0"


def _ping_at_all(ping) -> float:
    """ping() with the calling thread's numba count at every core: a region's cost grows with its team
    (waking and joining more workers), so the widest team's prices every split (on 2 cores, two)."""
    before = getattr(_local, "numba", None)
    numba_threads(cores())
    try:
        return ping()
    finally:
        if before is not None:
            numba_threads(before)


def _no_prange_after_fork() -> None:
    """In a forked child, no prange: GNU OpenMP's workers do not survive fork(), and a child's first
    parallel region after its parent's can hang (numba: the omp layer is not fork-safe)."""
    _prange[0] = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_no_prange_after_fork)


def _probe_prange():
    if os.environ.get("ISTHMUS_PRANGE", "").strip() == "0" or cores() < 2:
        return False
    from ..jit import par  # deferred: loads numba
    import numba  # deferred: loaded by jit.par just above
    if numba.config.NUMBA_NUM_THREADS < 2 or not par.layer_ok():
        return False
    env = os.environ.get("ISTHMUS_PRANGE_HANDOFF_US", "").strip()
    if env:
        _prange_at[0] = 0.0
        return max(1e-9, _env_handoff(env, "ISTHMUS_PRANGE_HANDOFF_US"))
    h = max(1e-9, _ping_at_all(par.ping_s))
    _prange_at[0] = time.perf_counter()
    return h


def par_scale() -> float:
    """How many times MIN_CHUNK_BYTES / MIN_CHUNK_FLOPS a prange block must carry (the prange
    hand-off over HANDOFF_REF_S, times PRANGE_BLOCK_HANDOFFS / 10; at least PAR_SCALE_FLOOR)."""
    h = prange_handoff_s()
    return PAR_SCALE_FLOOR if h is None else max(PAR_SCALE_FLOOR, h / HANDOFF_REF_S * PRANGE_BLOCK_HANDOFFS / 10)


_FRESH = ("fresh",)  # a run's gate not read yet (RunGate)


class RunGate:
    """One read of the split gates per run on the calling thread (Plan.__call__): the intra-op count,
    whether prange may run now (another core idle, prange available, its hand-off measured) and the
    free cores. A batch-1 network asks the gates a few dozen times a run; each full read (BLAS's count,
    the idle gate, the hand-off's age, the free cores) cost about 4 us, a batch-1 split's whole saving.
    The state they read changes at most once a second (idle.LOAD_RECHECK_S, PAR_REMEASURE_S), so a run
    of milliseconds reads it once. Outside a run, and on the branch pool's threads, every ask reads."""

    def __enter__(self):
        self._prev = getattr(_local, "gate", None)
        _local.gate = _FRESH
        return self

    def __exit__(self, *exc):
        _local.gate = self._prev
        return False


def gate_now() -> tuple:
    """(intra-op threads, prange's par_scale or 0.0 where prange may not run now, free cores for it):
    this run's read (RunGate), else a fresh one. Reading it probes the prange hand-off (the first
    time) where several threads are allowed and another core is idle: callers ask only for work that
    could split."""
    g = getattr(_local, "gate", None)
    if g is not None and g is not _FRESH:
        return g
    intra = intra_threads()
    if intra <= 1:
        snap = (1, 0.0, 1)
    elif idle.cores_idle(cores()) and prange_handoff_s() is not None:
        snap = (intra, par_scale(), idle.free_cores(intra))
    else:
        snap = (intra, 0.0, 0)
    if g is _FRESH:
        _local.gate = snap
    return snap


def par_threads(total: int, work: float, flops: bool = False) -> int:
    """The numba threads a compiled kernel over `total` items of `work` bytes (flops=True: FLOPs)
    in all should split across: 1 where it runs serially (one intra-op thread, or too little work:
    no hand-off is measured for work that could never split), 0 where it could split but prange
    is unavailable, or other processes hold the cores (idle.cores_idle: a region would wait for
    its worker), and the caller then uses fan_out, whose caller runs the chunks no worker started."""
    least = MIN_CHUNK_FLOPS if flops else MIN_CHUNK_BYTES
    if total <= 1 or work < 2 * least * PAR_SCALE_FLOOR:
        return 1
    h = _prange[0]  # the last measured hand-off: too little work for it needs no read of the gates
    if h and work < 2 * least * max(PAR_SCALE_FLOOR, h / HANDOFF_REF_S * PRANGE_BLOCK_HANDOFFS / 10):
        return 1
    intra, scale, free = gate_now()
    k = min(intra, total)
    if k <= 1:
        return 1
    if not scale:
        return 0
    return max(1, min(k, free, int(work // (least * scale))))


def blas_held_here() -> bool:
    """Whether this thread's run holds BLAS to one thread (RunBlasHold, OneThreadRun): a kernel's
    own one-thread block would only cost its few microseconds."""
    return getattr(_local, "blas_held", False)


def session_intra_threads() -> Optional[int]:
    """The running session's intra_op_threads; None when it left the default (BLAS's count)."""
    return _intra[0]


def intra_threads() -> int:
    """The threads a kernel may use now: the running session's intra_op_threads, else BLAS's count."""
    n = getattr(_local, "intra", None)
    if n is None:
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
            min_chunk: Optional[int] = None, flops: bool = False) -> int:
    """Run fn(lo, hi) over [lo, hi) chunks of range(total) on up to intra_threads() threads (the
    caller runs the first chunk) and wait for all; work of `nbytes` in all fans out only into
    chunks of at least min_chunk x chunk_scale(). min_chunk: the least work per chunk, in the unit
    of `nbytes`, for a hand-off of HANDOFF_REF_S (default MIN_CHUNK_BYTES; flops=True: `nbytes`
    counts FLOPs and the default is MIN_CHUNK_FLOPS). fn must release the GIL to gain (numpy
    copies, ufuncs and BLAS do). blas_inside: fn calls BLAS; BLAS is held to one thread while it
    runs, split or not (the chunks are the parallelism; a threaded BLAS inside each would
    oversubscribe, and its threads spin after the call on cores the next pass wants). How work is
    cut never changes its bytes where the caller cuts rows of a pass or whole summed parts (a
    product cut by rows or columns may round its last bits otherwise: handoff_s). Returns the
    number of chunks."""
    least = min_chunk or (MIN_CHUNK_FLOPS if flops else MIN_CHUNK_BYTES)
    k = min(intra_threads(), total, int(nbytes // least))
    if k > 1:  # could split: now the hand-off's price matters (measured at the first such call)
        k = min(k, int(nbytes // max(1, round(least * chunk_scale()))))
    hold = blas_inside and not getattr(_local, "blas_held", False)  # else the run holds BLAS already
    if k <= 1:
        with (BlasThreads(1) if hold else _NO_LIMIT):
            fn(0, total)
        return 1
    bounds = [total * i // k for i in range(k + 1)]
    with (BlasThreads(1) if hold else _NO_LIMIT):
        futures = [(i, intra_pool().submit(fn, bounds[i], bounds[i + 1])) for i in range(1, k)]
        try:
            fn(bounds[0], bounds[1])
            _run_unstarted(fn, bounds, futures)
        finally:
            for _, f in futures:
                if not f.cancelled():
                    f.result()  # re-raises a chunk's error here, after every chunk has ended
    return k


def _run_unstarted(fn, bounds, futures) -> None:
    """The caller, its own chunk done, runs the chunks no pool thread has started (last submitted
    first): where the other cores are busy (a shared machine, a loaded server) a split then costs
    about one thread's time instead of waiting for a core. The chunks are the same whoever runs
    them, and so are their bytes."""
    for i, f in reversed(futures):
        if f.cancel():
            fn(bounds[i], bounds[i + 1])


def handoff_s() -> float:
    """Seconds to hand a chunk to the intra-op pool and get it back (a submit-and-wait round trip
    after the worker has gone idle, as between two split nodes of a run): measured once per
    process, lazily, in a few milliseconds (the median of 9 pings 0.5 ms apart); the environment
    variable ISTHMUS_HANDOFF_US sets it instead. Where a product is split by rows or columns its
    last bits can differ from the whole product's, so the split, which depends on the thread
    count, also depends on this measurement: set the variable for bit-reproducible products
    across processes."""
    if _handoff[0] is None:
        with _measure_lock:
            if _handoff[0] is None:
                env = os.environ.get("ISTHMUS_HANDOFF_US", "").strip()
                _handoff[0] = _env_handoff(env) if env else _measure_handoff()
    return _handoff[0]


def _env_handoff(text: str, name: str = "ISTHMUS_HANDOFF_US") -> float:
    try:
        us = float(text)
    except ValueError:
        us = -1.0
    if not us >= 0 or us == float("inf"):
        raise ValueError(f"{name}: expected the hand-off in microseconds (a number >= 0), got {text!r}")
    return us * 1e-6


def _measure_handoff(pings: int = 9, gap_s: float = 5e-4) -> float:
    pool = intra_pool()
    pool.submit(int).result()  # the worker thread exists
    samples = []
    for _ in range(pings):
        time.sleep(gap_s)
        t0 = time.perf_counter()
        pool.submit(int).result()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def chunk_scale() -> float:
    """How many times MIN_CHUNK_BYTES / MIN_CHUNK_FLOPS a chunk must carry on this machine (>= 1):
    the measured hand-off over HANDOFF_REF_S, so that a chunk is about ten hand-offs of work."""
    return max(1.0, handoff_s() / HANDOFF_REF_S)


def min_chunk_bytes() -> int:
    """The least bytes a memory-bound pass hands one thread (MIN_CHUNK_BYTES x chunk_scale())."""
    return max(1, round(MIN_CHUNK_BYTES * chunk_scale()))


def min_chunk_flops() -> int:
    """The least FLOPs a split product hands one thread (MIN_CHUNK_FLOPS x chunk_scale())."""
    return max(1, round(MIN_CHUNK_FLOPS * chunk_scale()))


class OneThreadRun:
    """One intra-op thread for the calling thread's run: its kernels see intra_threads() == 1
    (a thread-local count: other threads' runs keep theirs, and so split as before) and BLAS is
    held to one thread. BLAS's count is process-wide, so BLAS calls that other threads make while
    this block lasts run one-threaded too: the same bytes for their split passes and summed parts,
    and for their products the bytes of a one-thread product (which a default run's products are:
    RunBlasHold). numba's count is left alone: only `prange` kernels read it, and isthmus's
    compiled kernels take their ranges from the pool (setting and restoring it cost ~4 us a run)."""

    def __init__(self, hold_blas: bool = True):
        self.hold_blas = hold_blas  # False: a run that makes no BLAS call (executor: matrix-vector loops only)

    def __enter__(self):
        self._prev = getattr(_local, "intra", None)
        _local.intra = 1
        if self.hold_blas:
            self._blas = BlasThreads(1)
            self._blas.__enter__()
            self._held, _local.blas_held = getattr(_local, "blas_held", False), True
        return self

    def __exit__(self, *exc):
        try:
            if self.hold_blas:
                _local.blas_held = self._held
                self._blas.__exit__(*exc)
        finally:
            _local.intra = self._prev
        return False


class RunBlasHold:
    """BLAS on one thread for a whole default-thread run (Plan.__call__), its intra-op count left
    as it was: the pool's chunks are the run's only parallelism. OpenBLAS's threads spin for a
    while after every call they share; on a shared machine they took the cores the pool's chunks
    and the next passes needed (2-core VM, load 2.9-4.9, batch 32, process CPU per run at default
    threads against the same with this hold: Inception 184 -> 147 ms, one thread 145). One hold
    per run, none per product inside it."""

    def __enter__(self):
        self._prev = getattr(_local, "blas_held", False)
        self._blas = BlasThreads(1)
        self._blas.__enter__()
        _local.blas_held = True
        return self

    def __exit__(self, *exc):
        _local.blas_held = self._prev
        self._blas.__exit__(*exc)
        return False


_NO_LIMIT = contextlib.nullcontext()


__all__ = ["numba_threads", "RunGate", "gate_now", "prange_handoff_s", "prange_may_run", "par_scale", "par_threads", "PAR_SCALE_FLOOR", "PRANGE_BLOCK_HANDOFFS",
           "cores", "default_inter_op_threads", "check_option", "IntraOpThreads", "OneThreadRun", "RunBlasHold", "BlasThreads", "blas_held_here",
           "blas_threads_now", "session_intra_threads", "intra_threads", "intra_pool", "fan_out", "handoff_s",
           "chunk_scale", "min_chunk_bytes", "min_chunk_flops", "MIN_CHUNK_BYTES", "MIN_CHUNK_FLOPS"]
