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
only while other processes leave a core idle (core/idle.py, which threads.par_threads asks too). On a busy machine the intra-op pool's
fan_out has the caller run the chunks no worker has started, so a large split costs at most about
the serial time; its hand-off (50-150 us) is paid only where fan_out's own measure says the work
carries it. While a core is idle the pool is not used for these kernels: libgomp's worker spins for
milliseconds after each region, and a pool worker woken beside it shares its core.
"""
from __future__ import annotations

from ... import jit
from .. import idle, threads
from .intra_op import par_rows


_DRIVERS: dict = {}  # kernel -> its prange driver (jit.par.driver), looked up once


def split_rows(kernel, args: tuple, total: int, work: float, flops: bool = False) -> int:
    """kernel(*args, lo, hi) over range(total) (a cut-free kernel: each item computed alone; `work` in
    the bytes a copy writes in the same time, or FLOPs with flops=True): one call where the work could
    never split; while another core is idle (cores_idle), prange (however large: the pool's worker
    would compete with libgomp's, which spins for milliseconds after each region), or
    threads.fan_out where prange is unavailable; on a busy machine, fan_out only where the pool's
    hand-off pays (its caller runs the chunks no worker started, so a split costs at most about the
    serial time), else one call. The gates are read once per run (threads.RunGate). Returns the
    threads used."""
    least = threads.MIN_CHUNK_FLOPS if flops else threads.MIN_CHUNK_BYTES
    if total <= 1 or work < 2 * least * threads.PAR_SCALE_FLOOR:  # no split either way: no further reads
        kernel(*args, 0, total)
        return 1
    intra, scale, free = threads.gate_now()
    if intra == 1:
        kernel(*args, 0, total)
        return 1
    if scale and work >= 2 * least * scale:
        k = _prange_k(total, work, least, intra, scale, free)
        if k < 2:
            kernel(*args, 0, total)
            return 1
        drv = _DRIVERS.get(kernel)
        if drv is None:
            drv = _DRIVERS[kernel] = jit.loaded("par").driver(kernel)
        drv(k, total, *args)
        return k
    if not scale and idle.cores_idle(threads.cores()):  # idle, no prange here: the pool's chunks
        return par_rows(kernel, args, total, work, flops=flops)
    if work >= 2 * least * threads.chunk_scale():
        return threads.fan_out(lambda lo, hi: kernel(*args, lo, hi), total, work, flops=flops)
    kernel(*args, 0, total)
    return 1


def _prange_k(total: int, work: float, least: int, intra: int, scale: float, free: int) -> int:
    """threads.par_threads on this run's read of the gates, written out (a batch-1 network splits a few
    dozen kernels a run, and the calls around each split cost as much as a block's hand-off); numba's
    count set to it when two or more."""
    k = min(intra, total, free, int(work // (least * scale)))
    if k >= 2:
        threads.numba_threads(k)
    return k


def prange_threads(total: int, work: float, flops: bool = False) -> int:
    """The threads split_rows would split this work across by prange now (numba's count set to them),
    else 0 (split_rows would make one call, or use the pool): for callers that run the driver
    themselves, with the serial steps around it (conv_pixels.PixelRows.runner)."""
    least = threads.MIN_CHUNK_FLOPS if flops else threads.MIN_CHUNK_BYTES
    if total <= 1 or work < 2 * least * threads.PAR_SCALE_FLOOR:
        return 0
    intra, scale, free = threads.gate_now()
    if intra == 1 or not scale or work < 2 * least * scale:
        return 0
    k = _prange_k(total, work, least, intra, scale, free)
    return k if k >= 2 else 0


def may_split(total: int, work: float, flops: bool = False) -> bool:
    """Whether split_rows would cut this work now (False: it would make one call): for a kernel whose
    range form costs more calls than its whole form (a numba dispatch of a dozen arrays is a few
    microseconds), so that work which will not split keeps its one call."""
    least = threads.MIN_CHUNK_FLOPS if flops else threads.MIN_CHUNK_BYTES
    if total <= 1 or work < 2 * least * threads.PAR_SCALE_FLOOR:
        return False
    intra, scale, _ = threads.gate_now()
    if intra == 1:
        return False
    return work >= 2 * least * (scale or (threads.par_scale() if idle.cores_idle(threads.cores())
                                          else threads.chunk_scale()))


__all__ = ["split_rows", "may_split", "prange_threads"]
