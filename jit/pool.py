"""2x2 max pooling at stride 2 in one compiled pass, for the edge's int8 and fp32 MaxPool.

numpy pools as one pass per window tap over strided views of the whole tensor; at batch 1 with
small planes each pass pays numpy's iterator per output row (the core CNN's 2x2 pools on
32x28x28 and 64x14x14: 18 and 15 us in four passes; 4 us each here, one run on a loaded machine).
Other windows keep numpy's passes: a compiled loop over runtime window sizes and strides ran
slower than they do (3x3 at stride 2 on 32x28x28: 102 against 66 us).
"""
from __future__ import annotations

import numba as nb  # imported only when the kernel is first bound
import numpy as np


@nb.njit(nogil=True, cache=True, boundscheck=False)
def max_pool_2x2_rows(x, out):
    """out [R, OH, OW] = the maximum over each 2x2 window of x [R, H, W] at stride 2 (windows at
    (2 oy, 2 ox); x already holds any padding; integers: no NaN rules)."""
    ow = out.shape[2]
    for r in range(out.shape[0]):
        xr, orr = x[r], out[r]
        for oy in range(out.shape[1]):
            dst, a, b = orr[oy], xr[2 * oy], xr[2 * oy + 1]
            for ox in range(ow):
                dst[ox] = max(max(a[2 * ox], a[2 * ox + 1]), max(b[2 * ox], b[2 * ox + 1]))


@nb.njit(nogil=True, cache=True, boundscheck=False)
def max_pool_2x2_float_rows(x, out):
    """max_pool_2x2_rows for floats with numpy's NaN rule: a window holding a NaN gives NaN (as
    np.maximum does, tap after tap)."""
    ow = out.shape[2]
    for r in range(out.shape[0]):
        xr, orr = x[r], out[r]
        for oy in range(out.shape[1]):
            dst, a, b = orr[oy], xr[2 * oy], xr[2 * oy + 1]
            for ox in range(ow):
                dst[ox] = np.maximum(np.maximum(a[2 * ox], a[2 * ox + 1]), np.maximum(b[2 * ox], b[2 * ox + 1]))
