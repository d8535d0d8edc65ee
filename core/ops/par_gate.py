"""intra_op.par_rows behind a cheap test of whether a kernel's work could split at all right now.

threads.par_threads reads the intra-op thread count before it weighs the work against the
measured prange hand-off, and with default threads that count is BLAS's, read each call (2-3 us).
A batch-1 network calls its depthwise, pool and batch-norm kernels a few dozen times a run, almost
all too small to split (and none under load, where the hand-off is measured at a scheduler slice):
those reads cost MobileNetV2-96 at batch 1 about 5% of its run. Work that par_threads would run on
one thread whatever the count (under two blocks of least * par_scale()) runs here as the one call
par_rows would make, without that read.
"""
from __future__ import annotations

from .. import threads
from .intra_op import par_rows


def split_rows(kernel, args: tuple, total: int, work: int) -> int:
    """par_rows(kernel, args, total, work) (bytes; a cut-free kernel), or kernel(*args, 0, total) where
    par_threads could only say 1. Returns the threads used."""
    if total <= 1 or work < 2 * threads.MIN_CHUNK_BYTES * threads.par_scale():
        kernel(*args, 0, total)
        return 1
    return par_rows(kernel, args, total, work)


__all__ = ["split_rows"]
