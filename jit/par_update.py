"""Optimizer updates as compiled range kernels (core/ops/training.py runs them over element ranges,
split by jit.par's prange drivers): var -= a * x in one pass, a fused multiply-add per element, so
every element's bytes are the same wherever the range is cut."""
from __future__ import annotations

import numba as nb  # this module is imported only when a compiled kernel first runs

from . import par


@nb.njit(nogil=True, cache=True, boundscheck=False, fastmath={"contract"})
def sub_scaled_range(var, x, a, lo, hi):
    """var[i] -= a * x[i] for i in [lo, hi) (1-D arrays), contracted to one fused multiply-add."""
    for i in range(lo, hi):
        var[i] = var[i] - a * x[i]


@nb.njit(**par.PAR_OPTS)
def _sub_scaled_par(blocks, total, var, x, a):  # the prange driver (jit.par.register)
    for b in nb.prange(blocks):
        sub_scaled_range(var, x, a, total * b // blocks, total * (b + 1) // blocks)


par.register(sub_scaled_range, _sub_scaled_par)

__all__ = ["sub_scaled_range"]
