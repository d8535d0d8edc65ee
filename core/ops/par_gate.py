"""How compiled range kernels (convolutions over images, depthwise, pools, batch norm) split
kernel(*args, lo, hi): serially where the work could never split, by prange (intra_op.par_rows) while
another core is idle, on the intra-op pool where the machine is busy and the work is large.

threads.par_threads reads the intra-op thread count before it weighs the work against the
measured prange hand-off, and with default threads that count is BLAS's, read each call (2-3 us).
A batch-1 network calls these kernels a few dozen times a run, almost all too small to split: those
reads cost MobileNetV2-96 at batch 1 about 5% of its run. Work that could never split (under two
blocks of least * PAR_SCALE_FLOOR) runs here as one call, without that read.

A prange region ends when its last worker does: where another process holds the second core a
split waits for a scheduler slice. The hand-off is measured again each second, but a quiet moment's
ping lets the next second's splits through: on the 2-core VM at load 2.4, every batch-32 MobileNetV2
depthwise split took ~10 ms against 0.3-2.3 ms serial (the run 167 ms against 126). So prange runs
only while other processes leave a core idle (cores_idle). On a busy machine the intra-op pool's
fan_out has the caller run the chunks no worker has started, so a large split costs at most about
the serial time; its hand-off (50-150 us) is paid only where fan_out's own measure says the work
carries it. While a core is idle the pool is not used for these kernels: libgomp's worker spins for
milliseconds after each region, and a pool worker woken beside it shares its core.
"""
from __future__ import annotations

import os
import time

from .. import threads
from .intra_op import par_rows

# prange only while the other processes leave a core idle: their busy time over the last interval (at
# least LOAD_RECHECK_S; /proc/stat's busy ticks less this process's own CPU time) under
# cores - 2 + (1 - IDLE_MARGIN), so on 2 cores other processes may hold at most a quarter of a core.
# A region's worker that finds no core waits a scheduler slice (ms) against a saving of tens of
# microseconds, so even a small chance of that loses: at load 1.6-1.8 on the 2-core VM, splits forced on
# (hand-offs pinned at 4 us), MobileNetV2-96 at batch 1 took 22 ms against 1.46 serial, its three split
# depthwise layers 5-8 ms each against 41-62 us; at load 2.6, with the hand-off re-measured at 6 us,
# 1.74 ms against 1.43. The gate read the 1-minute load average before, which counts this process's own
# threads: a two-thread run that kept both cores busy (its spinning libgomp worker included) read load
# ~2 and shut its own splits off. Where /proc/stat is missing: the load average less one (the caller).
# Niced processes do not count while this one is not niced: the scheduler gives it the core they hold
# (where autogroups are on, as on the 2-core VM, only across sessions whose autogroup nice says so).
IDLE_MARGIN = 0.75
LOAD_RECHECK_S = 1.0
FIRST_WINDOW_S = 0.05
_load = [True, -1.0]  # [whether a core was idle at the last read, when (perf_counter); -1: never]
_stat = [None]  # (busy ticks of all cores, this process's CPU seconds, perf_counter) at the last read
_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def _busy_ticks():
    """The machine's busy time in clock ticks since boot (/proc/stat: all but idle and iowait, and but
    niced processes' user time while this process is not niced itself: they yield the core to it);
    None where there is no /proc/stat."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 5 or fields[0] != b"cpu":
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4] - (ticks[1] if _own_nice() <= 0 else 0)


def _own_nice() -> int:
    try:
        return os.getpriority(os.PRIO_PROCESS, 0)
    except (AttributeError, OSError):
        return 0


def others_busy() -> float:
    """Cores' worth of CPU that other processes used since the last read (this process's threads
    excluded), or, at the first read, the 1-minute load average less the caller's own thread (read
    again FIRST_WINDOW_S later, over that interval)."""
    now, mine, busy = time.perf_counter(), time.process_time(), _busy_ticks()
    prev, _stat[0] = _stat[0], (busy, mine, now)
    if busy is None or prev is None or prev[0] is None or now - prev[2] <= 0:
        try:
            return max(0.0, os.getloadavg()[0] - 1.0)
        except OSError:  # no load average on this platform: assume idle cores (prange as measured)
            return 0.0
    return max(0.0, ((busy - prev[0]) * _TICK_S - (mine - prev[1])) / (now - prev[2]))


def cores_idle() -> bool:
    """Whether other processes leave this one a second core (others_busy under threads.cores() - 2 +
    (1 - IDLE_MARGIN)), read at most every LOAD_RECHECK_S (a read costs about 10 us)."""
    now = time.perf_counter()
    if now - _load[1] > LOAD_RECHECK_S:
        first = _stat[0] is None
        _load[0] = others_busy() < threads.cores() - 1 - IDLE_MARGIN
        _load[1] = now - LOAD_RECHECK_S + FIRST_WINDOW_S if first else now  # a first interval soon
    return _load[0]


def split_rows(kernel, args: tuple, total: int, work: float, flops: bool = False) -> int:
    """kernel(*args, lo, hi) over range(total) (a cut-free kernel: each item computed alone; `work` in
    the bytes a copy writes in the same time, or FLOPs with flops=True): one call where the work could
    never split; while another core is idle (cores_idle), par_rows (prange, however large: the pool's
    worker would compete with libgomp's, which spins for milliseconds after each region), or
    threads.fan_out where prange is unavailable; on a busy machine, fan_out only where the pool's
    hand-off pays (its caller runs the chunks no worker started, so a split costs at most about the
    serial time), else one call. Returns the threads used."""
    least = threads.MIN_CHUNK_FLOPS if flops else threads.MIN_CHUNK_BYTES
    if total <= 1 or work < 2 * least * threads.PAR_SCALE_FLOOR:  # no split either way: no further reads
        kernel(*args, 0, total)
        return 1
    if cores_idle() and work >= 2 * least * threads.par_scale():
        return par_rows(kernel, args, total, work, flops=flops)
    if work >= 2 * least * threads.chunk_scale():
        return threads.fan_out(lambda lo, hi: kernel(*args, lo, hi), total, work, flops=flops)
    kernel(*args, 0, total)
    return 1


__all__ = ["split_rows", "cores_idle", "others_busy", "IDLE_MARGIN", "LOAD_RECHECK_S"]
