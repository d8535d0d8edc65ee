"""How the non-GEMM kernels (depthwise, pools, batch norm) split a range form kernel(*args, lo, hi):
serially where the work could never split, on the intra-op pool where it is large, by prange
(intra_op.par_rows) in between.

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

from .. import threads
from .intra_op import par_rows


def split_rows(kernel, args: tuple, total: int, work: int) -> int:
    """kernel(*args, lo, hi) over range(total) (a cut-free kernel: each item computed alone; `work` in
    the bytes a copy writes in the same time): one call where par_threads could only say one thread,
    threads.fan_out where the pool's hand-off pays, else par_rows. Returns the threads used."""
    if total > 1 and work >= 2 * threads.min_chunk_bytes():
        return threads.fan_out(lambda lo, hi: kernel(*args, lo, hi), total, work)
    if total <= 1 or work < 2 * threads.MIN_CHUNK_BYTES * threads.par_scale():
        kernel(*args, 0, total)
        return 1
    return par_rows(kernel, args, total, work)


__all__ = ["split_rows"]
