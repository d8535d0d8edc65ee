"""How the non-GEMM kernels (depthwise, pools, batch norm) split a range form kernel(*args, lo, hi):
serially where the work could never split, on the intra-op pool where it is large, by prange
(intra_op.par_rows) in between while the machine has an idle core.

threads.par_threads reads the intra-op thread count before it weighs the work against the
measured prange hand-off, and with default threads that count is BLAS's, read each call (2-3 us).
A batch-1 network calls these kernels a few dozen times a run, almost all too small to split: those
reads cost MobileNetV2-96 at batch 1 about 5% of its run. Work that par_threads would run on one
thread whatever the count (under two blocks of least * par_scale()) runs here as the one call
par_rows would make, without that read.

A prange region ends when its last worker does: where another process holds the second core a
split waits for a scheduler slice. The hand-off is measured again each second, but a quiet moment's
ping lets the next second's splits through: on the 2-core VM at load 2.4, every batch-32 MobileNetV2
depthwise split took ~10 ms against 0.3-2.3 ms serial (the run 167 ms against 126). The intra-op
pool's fan_out has the caller run the chunks no worker has started, so a large split costs at most
about the serial time there; its hand-off (50-150 us) is paid only where fan_out's own measure says
the work carries it.
"""
from __future__ import annotations

import os
import time

from .. import threads
from .intra_op import par_rows

# prange only while the 1-minute load average leaves a core idle (load < cores - IDLE_MARGIN; this
# process's own running thread counts in it, so on 2 cores other processes may hold at most a
# quarter of a core). A region's worker that finds no core waits a scheduler slice (ms) against a
# saving of tens of microseconds, so even a small chance of that loses: at load 1.6-1.8 on the
# 2-core VM, splits forced on (hand-offs pinned at 4 us), MobileNetV2-96 at batch 1 took 22 ms
# against 1.46 serial, its three split depthwise layers 5-8 ms each against 41-62 us; at load 2.6,
# with the hand-off re-measured at 6 us, 1.74 ms against 1.43. Not yet measured on an idle machine,
# where the same kernels alone split 52 -> 33 us (96x48x48/s2) and 1763 -> 840 us (32x144x24x24).
IDLE_MARGIN = 0.75
LOAD_RECHECK_S = 1.0
_load = [True, -1.0]  # [whether a core was idle at the last read, when (perf_counter); -1: never]


def cores_idle() -> bool:
    """Whether the machine's 1-minute load average leaves one of threads.cores() idle (read, with
    the core count, at most every LOAD_RECHECK_S: each costs a system call, about 1 us)."""
    now = time.perf_counter()
    if now - _load[1] > LOAD_RECHECK_S:
        try:
            load = os.getloadavg()[0]
        except OSError:  # no load average on this platform: assume idle cores (prange as measured)
            load = 0.0
        _load[0] = load < threads.cores() - IDLE_MARGIN
        _load[1] = now
    return _load[0]


def split_rows(kernel, args: tuple, total: int, work: int) -> int:
    """kernel(*args, lo, hi) over range(total) (a cut-free kernel: each item computed alone; `work` in
    the bytes a copy writes in the same time): threads.fan_out where the pool's hand-off pays; else
    one call where par_threads could only say one thread or no core is idle (cores_idle); else
    par_rows. Returns the threads used."""
    least = threads.MIN_CHUNK_BYTES  # the pool splits from 2 * least * chunk_scale() >= 2 * least
    if total <= 1 or work < 2 * least * threads.PAR_SCALE_FLOOR:  # no split either way: no further reads
        kernel(*args, 0, total)
        return 1
    if work >= 2 * threads.min_chunk_bytes():
        return threads.fan_out(lambda lo, hi: kernel(*args, lo, hi), total, work)
    if not cores_idle() or work < 2 * least * threads.par_scale():
        kernel(*args, 0, total)
        return 1
    return par_rows(kernel, args, total, work)


__all__ = ["split_rows", "cores_idle", "IDLE_MARGIN", "LOAD_RECHECK_S"]
