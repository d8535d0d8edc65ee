"""prange drivers (jit.par.register) of the pool, depthwise and batch-norm kernels' range forms (intra_op.par_rows),
and range forms of jit.pool's max-pool kernels (they take slices, which a driver's blocks cannot
make; these cut them inside the compiled call). Every output element is computed as the
whole-array call computes it, so the bytes never depend on the threads."""
from __future__ import annotations

import numba as nb  # this module is imported only when a compiled kernel first runs

from . import par
from .batchnorm import apply_range, grad_range, stats_range
from .depthwise import planes_range
from .depthwise_blocked import blocked_range
from .pool import max_pool_2x2_float_rows, max_pool_2x2_grad_rows
from .pool_blocked import max_pool_blocked_range
from .pool_windows import max_pool_planes


@nb.njit(nogil=True, cache=True, boundscheck=False)
def max_pool_2x2_float_range(x3, y3, lo, hi):
    """max_pool_2x2_float_rows over planes [lo, hi) of x3 [P, H, W] into y3 [P, H/2, W/2]."""
    max_pool_2x2_float_rows(x3[lo:hi], y3[lo:hi])


@nb.njit(nogil=True, cache=True, boundscheck=False)
def max_pool_2x2_grad_range(xf, yf, dyf, dxf, w, through_relu, lo, hi):
    """max_pool_2x2_grad_rows over row pairs [lo, hi) of the flat arrays (x, dx: rows of 2*w; y, dy:
    rows of w/2)."""
    ow = w // 2
    a, b = lo * 2 * w, lo * ow
    max_pool_2x2_grad_rows(xf[a:hi * 2 * w], yf[b:hi * ow], dyf[b:hi * ow], dxf[a:hi * 2 * w], hi - lo, w,
                           through_relu)


# the prange drivers (jit.par.register)
@nb.njit(**par.PAR_OPTS)
def _max_pool_par(blocks, total, x3, y3):
    for b in nb.prange(blocks):
        max_pool_2x2_float_range(x3, y3, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _max_pool_grad_par(blocks, total, xf, yf, dyf, dxf, w, through_relu):
    for b in nb.prange(blocks):
        max_pool_2x2_grad_range(xf, yf, dyf, dxf, w, through_relu, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _max_pool_planes_par(blocks, total, x, out, geo):
    for b in nb.prange(blocks):
        max_pool_planes(x, out, geo, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _max_pool_blocked_par(blocks, total, x, pt, pl, hp, wp, sh, sw, out):
    for b in nb.prange(blocks):
        max_pool_blocked_range(x, pt, pl, hp, wp, sh, sw, out, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _depthwise_blocked_par(blocks, total, x, c, wb, bb, pt, pl, hp, wp, sh, sw, cmin, cmax, out):
    for b in nb.prange(blocks):
        blocked_range(x, c, wb, bb, pt, pl, hp, wp, sh, sw, cmin, cmax, out,
                      total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _depthwise_planes_par(blocks, total, x, w, b, kind, sh, sw, dh, dw, pt, pl, hp, wp, lo, hi, out):
    for k in nb.prange(blocks):
        planes_range(x, w, b, kind, sh, sw, dh, dw, pt, pl, hp, wp, lo, hi, out,
                     total * k // blocks, total * (k + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _bn_stats_par(blocks, total, x, mean, var):
    for k in nb.prange(blocks):
        stats_range(x, mean, var, total * k // blocks, total * (k + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _bn_apply_par(blocks, total, x, inv, shift, y):
    for k in nb.prange(blocks):
        apply_range(x, inv, shift, y, total * k // blocks, total * (k + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _bn_grad_par(blocks, total, dy, x, mean, inv, scale, training, dx, dgamma, dbeta):
    for k in nb.prange(blocks):
        grad_range(dy, x, mean, inv, scale, training, dx, dgamma, dbeta, total * k // blocks, total * (k + 1) // blocks)


par.register(max_pool_2x2_float_range, _max_pool_par)
par.register(stats_range, _bn_stats_par)
par.register(apply_range, _bn_apply_par)
par.register(grad_range, _bn_grad_par)
par.register(planes_range, _depthwise_planes_par)
par.register(max_pool_planes, _max_pool_planes_par)
par.register(max_pool_blocked_range, _max_pool_blocked_par)
par.register(blocked_range, _depthwise_blocked_par)
par.register(max_pool_2x2_grad_range, _max_pool_grad_par)

__all__ = ["max_pool_2x2_float_range", "max_pool_2x2_grad_range", "blocked_range", "planes_range", "max_pool_blocked_range",
           "max_pool_planes"]
