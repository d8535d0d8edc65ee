"""prange drivers (jit.par.register) for other modules' image- and plane-range kernels, so that their
callers can split them with intra_op.par_rows(kernel, args, total, work) instead of
rows_apply(np, lambda i0, i1: kernel(*args, i0, i1), ...): the same kernel calls, each image or plane
computed alone (results do not depend on the cuts), a few microseconds to reach the other cores
instead of the pool's hand-off. The kernels belong to jit.conv_images, jit.gemm_f32,
jit.gemm_residual, jit.conv_wide, jit.conv_direct, jit.gemm_pixels, jit.dense, jit.rnn and jit.pool_windows; only their drivers live here."""
from __future__ import annotations

import numba as nb  # this module is imported only when a compiled kernel first runs

from . import par
from .conv_direct import blocks_range, channels_range, conv_direct_images
from .conv_images import conv_images_bias_clamp
from .dense import dense_panels_range
from .conv_wide import conv_wide_images, conv_wide_images_add
from .gemm_f32 import cols_range, conv_images_ld, pointwise_images, rows_range
from .gemm_pixels import images_add_range, images_range, panels_finish_range, panels_range
from .gemm_residual import cols_add_range, conv_images_ld_add, pointwise_images_add, rows_add_range
from .pool_windows import max_pool_planes
from .rnn import lstm_quads_range


@nb.njit(**par.PAR_OPTS)
def _conv_images_bias_clamp_par(blocks, total, xpad, ws, wp, bias, lo, hi, geo, out):
    for b in nb.prange(blocks):
        conv_images_bias_clamp(xpad, ws, wp, bias, lo, hi, geo, out, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _conv_images_ld_par(blocks, total, x, h, w, geo, wp, bias, lo, hi, out, ldx):
    for b in nb.prange(blocks):
        conv_images_ld(x, h, w, geo, wp, bias, lo, hi, out, ldx, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _conv_images_ld_add_par(blocks, total, x, h, w, geo, wp, bias, lo, hi, out, r, ldx):
    for b in nb.prange(blocks):
        conv_images_ld_add(x, h, w, geo, wp, bias, lo, hi, out, r, ldx, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _pointwise_images_par(blocks, total, x, wp, bias, lo, hi, out):
    for b in nb.prange(blocks):
        pointwise_images(x, wp, bias, lo, hi, out, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _pointwise_images_add_par(blocks, total, x, wp, bias, lo, hi, out, r):
    for b in nb.prange(blocks):
        pointwise_images_add(x, wp, bias, lo, hi, out, r, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _conv_wide_images_par(blocks, total, x, h, w, top, left, starts, plane, wp, cols, wpk, bias, lo, hi, out, oh,
                          ow, size):
    for b in nb.prange(blocks):
        conv_wide_images(x, h, w, top, left, starts, plane, wp, cols, wpk, bias, lo, hi, out, oh, ow, size,
                         total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _conv_wide_images_add_par(blocks, total, x, h, w, top, left, starts, plane, wp, cols, wpk, bias, lo, hi, out, r,
                              oh, ow, size):
    for b in nb.prange(blocks):
        conv_wide_images_add(x, h, w, top, left, starts, plane, wp, cols, wpk, bias, lo, hi, out, r, oh, ow, size,
                             total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _conv_direct_images_par(blocks, total, x, h, w, top, left, wp, koff, pix, wt, bias, lo, hi, out, r, size):
    for b in nb.prange(blocks):
        conv_direct_images(x, h, w, top, left, wp, koff, pix, wt, bias, lo, hi, out, r, size,
                           total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _max_pool_planes_par(blocks, total, x, out, geo):
    for b in nb.prange(blocks):
        max_pool_planes(x, out, geo, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _panels_range_par(blocks, total, a, wt, zeros, yt):
    for b in nb.prange(blocks):
        panels_range(a, wt, zeros, yt, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _panels_finish_par(blocks, total, a, wt, zeros, yt, bias, r, lo, hi, out, pix):
    for b in nb.prange(blocks):
        panels_finish_range(a, wt, zeros, yt, bias, r, lo, hi, out, pix, total * b // blocks,
                            total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _images_range_par(blocks, total, xf, index, wt, bias, lo, hi, zeros, a, yt, out, pix):
    for b in nb.prange(blocks):
        images_range(xf, index, wt, bias, lo, hi, zeros, a, yt, out, pix, total * b // blocks,
                     total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _images_add_range_par(blocks, total, xf, index, wt, bias, r, lo, hi, zeros, a, yt, out, pix):
    for b in nb.prange(blocks):
        images_add_range(xf, index, wt, bias, r, lo, hi, zeros, a, yt, out, pix, total * b // blocks,
                         total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _blocks_range_par(blocks, total, pad, koff, pix, wt, bias, lo, hi, y, r):
    for b in nb.prange(blocks):
        blocks_range(pad, koff, pix, wt, bias, lo, hi, y, r, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _channels_range_par(blocks, total, pad, koff, pix, wt, bias, lo, hi, y, r):
    for b in nb.prange(blocks):
        channels_range(pad, koff, pix, wt, bias, lo, hi, y, r, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _rows_range_par(blocks, total, wp, bias, xf, ldx, k, p, lo, hi, y):
    for b in nb.prange(blocks):
        rows_range(wp, bias, xf, ldx, k, p, lo, hi, y, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _rows_add_range_par(blocks, total, wp, bias, xf, ldx, k, p, lo, hi, y, r):
    for b in nb.prange(blocks):
        rows_add_range(wp, bias, xf, ldx, k, p, lo, hi, y, r, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _cols_range_par(blocks, total, wp, bias, xf, ldx, k, p, lo, hi, y):
    for b in nb.prange(blocks):
        cols_range(wp, bias, xf, ldx, k, p, lo, hi, y, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _cols_add_range_par(blocks, total, wp, bias, xf, ldx, k, p, lo, hi, y, r):
    for b in nb.prange(blocks):
        cols_add_range(wp, bias, xf, ldx, k, p, lo, hi, y, r, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _dense_panels_par(blocks, total, a, wt, zeros, y, lo, hi):
    for b in nb.prange(blocks):
        dense_panels_range(a, wt, zeros, y, lo, hi, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _lstm_quads_par(blocks, total, proj, bias, wt, order, h0, c, y, z, a, zeros):
    for b in nb.prange(blocks):
        lstm_quads_range(proj, bias, wt, order, h0, c, y, z, a, zeros, total * b // blocks, total * (b + 1) // blocks)


for _k, _d in ((conv_images_bias_clamp, _conv_images_bias_clamp_par), (conv_images_ld, _conv_images_ld_par),
               (conv_images_ld_add, _conv_images_ld_add_par), (pointwise_images, _pointwise_images_par),
               (pointwise_images_add, _pointwise_images_add_par), (conv_wide_images, _conv_wide_images_par),
               (conv_wide_images_add, _conv_wide_images_add_par), (conv_direct_images, _conv_direct_images_par),
               (max_pool_planes, _max_pool_planes_par), (panels_range, _panels_range_par),
               (panels_finish_range, _panels_finish_par),
               (images_range, _images_range_par), (images_add_range, _images_add_range_par),
               (blocks_range, _blocks_range_par), (channels_range, _channels_range_par), (rows_range, _rows_range_par),
               (rows_add_range, _rows_add_range_par), (cols_range, _cols_range_par),
               (cols_add_range, _cols_add_range_par), (dense_panels_range, _dense_panels_par),
               (lstm_quads_range, _lstm_quads_par)):
    par.register(_k, _d)

KERNELS = (conv_images_bias_clamp, conv_images_ld, conv_images_ld_add, pointwise_images, pointwise_images_add,
           conv_wide_images, conv_wide_images_add, conv_direct_images, max_pool_planes, panels_range,
           panels_finish_range,
           images_range, images_add_range, blocks_range, channels_range, rows_range, rows_add_range, cols_range, cols_add_range,
           dense_panels_range,
           lstm_quads_range)

__all__ = ["KERNELS"]
