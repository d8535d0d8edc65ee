"""2x2 max pooling at stride 2 (and its gradient) in one compiled pass, for the edge's int8 and fp32
MaxPool and core's MaxPool/MaxPoolGrad (over chunks of rows on the intra-op threads: nogil).

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


@nb.njit(nogil=True, cache=True, boundscheck=False)
def max_pool_2x2_grad_rows(x, y, dy, dx, rows, w, through_relu):
    """dx = the gradient of a 2x2 stride-2 max pool over `rows` pairs of input rows of width w (x, dx
    flat [rows 2 w]; y, dy flat [rows w/2]: its output and the output's gradient): each window's dy
    goes to the first element (row-major) equal to its maximum. through_relu: dy is first
    multiplied by (y > 0) (max_pool_grad_through_relu). Every element is written as dy times a
    1.0 or 0.0 mask, as numpy's mask multiplies do (a NaN or inf dy leaves NaN beside its maximum;
    a NaN window sends nothing). Three branch-free loops per row pair over flat offsets (views
    per row cost more than the arithmetic on 7- and 14-wide rows)."""
    ow = w // 2
    t = dy.dtype.type
    one = t(1)
    free = np.empty(ow, dy.dtype)  # 1 where row 0 of the window holds no hit
    dd = np.empty(ow, dy.dtype)
    for r in range(rows):
        ba, by = r * 2 * w, r * ow
        bb = ba + w
        for ox in range(ow):
            dd[ox] = dy[by + ox] * t(y[by + ox] > 0) if through_relu else dy[by + ox]
        for ox in range(ow):
            m, d = y[by + ox], dd[ox]
            e0 = t(x[ba + 2 * ox] == m)
            e1 = t(x[ba + 2 * ox + 1] == m) * (one - e0)
            dx[ba + 2 * ox] = d * e0
            dx[ba + 2 * ox + 1] = d * e1
            free[ox] = one - e0 - e1
        for ox in range(ow):
            m, d = y[by + ox], dd[ox]
            e2 = t(x[bb + 2 * ox] == m) * free[ox]
            e3 = t(x[bb + 2 * ox + 1] == m) * (free[ox] - e2)
            dx[bb + 2 * ox] = d * e2
            dx[bb + 2 * ox + 1] = d * e3
