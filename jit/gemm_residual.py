"""The packed fp32 GEMM (jit.gemm_f32) with a residual addend: y = clamp(W @ x + bias + r), r of y's
shape, for core's FusedConv2DAdd (a residual block's convolution, its skip-connection Add and Relu in
one node). Where a 16-column panel covers whole output rows (P <= 16) the tile starts its accumulators
at bias + r (gemm_f32._make_tile_add): r is then read in order, once, and the output written once.
On wider planes the tile's loads of r, one 64-byte piece per row at a stride of P floats, missed the
cache one after another (32 images of 128 x 256: 2.2 ms against 1.1 without the addend, cold, one
thread), so there the image's GEMM runs unclamped and one pass adds r and clamps while the image's
output is still in cache (1.3 ms; a separate pass after all images: 1.4 ms)."""
from __future__ import annotations

import numba as nb  # imported only when a kernel is first bound
import numpy as np

from .gemm_f32 import (COLS_BLOCK, MR, NR, ROWS_BLOCK, SIX_MIN_K, _tile6a_add, _tile6b_add, _tile8_add, _tile8x8_add,
                       _tile_add, chunk_len, cols_range, gemm_bias_clamp_ld, im2col_ld, tail_in, tail_out)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def _panels_add(wp, bias, xf, ldx, px, yf, ldy, py, o, k, lo, hi, narrow, rf):
    """gemm_f32._panels with the addend rf (flat, yf's layout) in the first K chunk's start."""
    inf = np.float32(np.inf)
    kc = chunk_len(k)
    for k0 in range(0, k, kc):
        kn = min(kc, k - k0)
        last = k0 + kn >= k
        clo, chi = (lo, hi) if last else (-inf, inf)
        if narrow:
            nb4 = o // MR
            for ob in range(0, nb4 - 1, 2):
                _tile8x8_add(wp, xf, ldx, px, yf, ldy, py, ob, bias, k, k0, kn, k0 == 0, clo, chi, rf)
            if nb4 % 2:
                _tile8_add(wp, xf, ldx, px, yf, ldy, py, nb4 - 1, bias, k, k0, kn, k0 == 0, clo, chi, rf)
        else:
            nb4 = o // MR
            for ob in range(0, nb4 - 2 if k >= SIX_MIN_K else 0, 3):
                _tile6a_add(wp, xf, ldx, px, yf, ldy, py, ob, bias, k, k0, kn, k0 == 0, clo, chi, rf)
                _tile6b_add(wp, xf, ldx, px, yf, ldy, py, ob + 1, bias, k, k0, kn, k0 == 0, clo, chi, rf)
            for ob in range(nb4 // 3 * 3 if k >= SIX_MIN_K else 0, nb4):
                _tile_add(wp, xf, ldx, px, yf, ldy, py, ob, bias, k, k0, kn, k0 == 0, clo, chi, rf)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemm_bias_add_clamp_ld(wp, bias, xf, ldx, k, p, lo, hi, y, r, panel, tile, rtile):
    """y [O, P] = clamp(W @ x + bias + r, lo, hi), x [K, P] read from the flat xf at row stride ldx,
    r [O, P] contiguous; panel [K, 16], tile and rtile [O, 16] scratch for the last P mod 16 columns."""
    o = y.shape[0]
    if p > NR:  # wide rows: the in-cache pass after the image's GEMM (see the module's docstring)
        inf = np.float32(np.inf)
        gemm_bias_clamp_ld(wp, bias, xf, ldx, k, p, -inf, inf, y, panel, tile)
        for i in range(o):
            row, add = y[i], r[i]
            for j in range(p):
                row[j] = min(max(row[j] + add[j], lo), hi)
        return
    yf, rf = y.reshape(o * p), r.reshape(o * p)
    whole = p // NR * NR
    for p0 in range(0, whole, NR):
        _panels_add(wp, bias, xf, ldx, p0, yf, p, p0, o, k, lo, hi, False, rf)
    rest = p - whole
    if rest:
        tail_in(xf, ldx, k, whole, rest, panel)
        tail_in(rf, p, o, whole, rest, rtile)
        _panels_add(wp, bias, panel.reshape(k * NR), NR, 0, tile.reshape(o * NR), NR, 0, o, k, lo, hi,
                    rest <= NR // 2, rtile.reshape(o * NR))
        tail_out(tile, y, whole, rest)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemm_bias_add_clamp(wp, bias, x, lo, hi, y, r, panel, tile, rtile):
    """gemm_bias_add_clamp_ld with x [K, P] contiguous."""
    k, p = x.shape
    gemm_bias_add_clamp_ld(wp, bias, x.reshape(k * p), p, k, p, lo, hi, y, r, panel, tile, rtile)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def rows_add_range(wp, bias, xf, ldx, k, p, lo, hi, y, r, b0, b1):
    """gemm_bias_add_clamp_ld over output rows [ROWS_BLOCK b0, min(ROWS_BLOCK b1, O)) of y and r [O, P]
    (gemm_f32.rows_range with the addend)."""
    r0, r1 = b0 * ROWS_BLOCK, min(b1 * ROWS_BLOCK, y.shape[0])
    if r1 > r0:
        gemm_bias_add_clamp_ld(wp[r0 // MR:r1 // MR], bias[r0:r1], xf, ldx, k, p, lo, hi, y[r0:r1], r[r0:r1],
                               np.empty((k, NR), np.float32), np.empty((r1 - r0, NR), np.float32),
                               np.empty((r1 - r0, NR), np.float32))


@nb.njit(nogil=True, cache=True, boundscheck=False)
def cols_add_range(wp, bias, xf, ldx, k, p, lo, hi, y, r, b0, b1):
    """gemm_bias_add_clamp_ld over columns [COLS_BLOCK b0, min(COLS_BLOCK b1, P)) (gemm_f32.cols_range
    with the addend: the product unclamped, then the addend and the clamp over the block's columns, as
    the whole call's pass over wide rows does; P <= 16 is one block, the whole call)."""
    o = y.shape[0]
    if p <= NR:
        if b0 == 0 and b1 > 0:
            gemm_bias_add_clamp_ld(wp, bias, xf, ldx, k, p, lo, hi, y, r, np.empty((k, NR), np.float32),
                                   np.empty((o, NR), np.float32), np.empty((o, NR), np.float32))
        return
    inf = np.float32(np.inf)
    cols_range(wp, bias, xf, ldx, k, p, -inf, inf, y, b0, b1)
    c0, c1 = b0 * COLS_BLOCK, min(b1 * COLS_BLOCK, p)
    for i in range(o):
        row, add = y[i], r[i]
        for j in range(c0, c1):
            row[j] = min(max(row[j] + add[j], lo), hi)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def pointwise_images_add(x, wp, bias, lo, hi, out, r, i0, i1):
    """out[i] [O, P] = clamp(W @ x[i] + bias + r[i], lo, hi) for i0 <= i < i1 (1x1 convolutions)."""
    k, o = x.shape[1], out.shape[1]
    panel = np.empty((k, NR), np.float32)
    tile = np.empty((o, NR), np.float32)
    rtile = np.empty((o, NR), np.float32)
    for i in range(i0, i1):
        gemm_bias_add_clamp(wp, bias, x[i], lo, hi, out[i], r[i], panel, tile, rtile)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def conv_images_ld_add(x, h, w, geo, wp, bias, lo, hi, out, r, ldx, i0, i1):
    """gemm_f32.conv_images_ld with the addend r [N, O, OH OW]."""
    k = x.shape[1] * geo[0] * geo[1]
    o, p = out.shape[1], out.shape[2]
    cols = np.empty((k, ldx), np.float32)
    panel = np.empty((k, NR), np.float32)
    tile = np.empty((o, NR), np.float32)
    rtile = np.empty((o, NR), np.float32)
    cf = cols.reshape(k * ldx)
    for i in range(i0, i1):
        im2col_ld(x[i], h, w, geo, cols)
        gemm_bias_add_clamp_ld(wp, bias, cf, ldx, k, p, lo, hi, out[i], r[i], panel, tile, rtile)
