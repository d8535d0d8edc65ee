"""Stride-1 convolutions without an im2col copy: the packed GEMM (jit.gemm_f32's register tile) reads
each (channel, ky, kx) row of the column matrix straight from the zero-padded image, for core's
Conv2D at inference.

With the output computed at the padded width Wp (columns OW..Wp-1 of each output row are junk,
dropped by a last copy), column q of row (c, ky, kx) is padded[c, ky dh Wp + kx dw + q]: every row
of the column matrix is a shifted run of the padded plane, so the tile takes a table of row starts
instead of a row stride and no columns are ever written (im2col wrote C kh kw x OH OW floats, in
runs of OW: 10-25% of a convolution's time on 12x12 to 48x48 planes). The price is Wp / OW more
columns (8% at 24x24 with 3x3, 4% at 48x48), so small planes keep im2col.
"""
from __future__ import annotations

import numba as nb  # imported only when the kernel is first bound
import numpy as np
from numba.extending import intrinsic
from numba.core import types

from .gemm_f32 import MR, NR, SIX_A, SIX_B, SIX_MIN_K, _tile_ir, chunk_len


def _make_tile_off(nv: int, mb: int = 1, rowmap=None):
    @intrinsic
    def tile(typingctx, wp, x, off, px, y, ldy, py, ob, bias, k, k0, kn, first, lo, hi):
        sig = types.void(wp, x, off, px, y, ldy, py, ob, bias, k, k0, kn, first, lo, hi)
        return sig, lambda context, builder, signature, args: _tile_ir(context, builder, signature, args, nv, mb,
                                                                       offsets=True, rowmap=rowmap)
    return tile


_tile, _tile6a, _tile6b = _make_tile_off(2), _make_tile_off(2, rowmap=SIX_A), _make_tile_off(2, rowmap=SIX_B)


def plan(c, h, w, kh, kw, dh, dw, top, bottom, left, right):
    """(row starts [C kh kw] int64, padded plane size, padded width, output columns rounded up to whole
    16-column panels, the padded scratch's size in floats) for a stride-1 geometry."""
    hp, wp = h + top + bottom, w + left + right
    oh = hp - (kh - 1) * dh
    cols = -(-oh * wp // NR) * NR
    plane = hp * wp
    ch, ky, kx = np.meshgrid(np.arange(c), np.arange(kh), np.arange(kw), indexing="ij")
    starts = (ch * plane + ky * dh * wp + kx * dw).reshape(-1).astype(np.int64)
    # the last row's last panel reads past the last plane's end: zeros up to there
    need = (c - 1) * plane + (kh - 1) * dh * wp + (kw - 1) * dw + cols
    return starts, plane, wp, cols, max(c * plane, need)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def conv_wide(x, h, w, top, left, starts, plane, wp, cols, wpk, bias, lo, hi, y, oh, ow, pad, wide):
    """y [O, OH OW] = clamp(W @ im2col(x) + bias, lo, hi) for one image x [C, H W] at stride 1: x is
    copied into pad (the zero-padded planes, flat; its borders and tail are zero and stay so), the
    tile reads rows at `starts`, wide [O, cols] receives the output at the padded width."""
    c = x.shape[0]
    for ch in range(c):
        src = x[ch]
        for yy in range(h):
            d, s = pad[ch * plane + (top + yy) * wp + left:], src[yy * w:]
            for i in range(w):
                d[i] = s[i]
    o, k = y.shape[0], starts.shape[0]
    wf = wide.reshape(o * cols)
    kc = chunk_len(k)
    for p0 in range(0, cols, NR):
        for k0 in range(0, k, kc):
            kn = min(kc, k - k0)
            last = k0 + kn >= k
            clo, chi = (lo, hi) if last else (np.float32(-np.inf), np.float32(np.inf))
            nb4 = o // MR  # pairs of 6-row tiles over three blocks (gemm_f32._panels), then 4 rows at a time
            for ob in range(0, nb4 - 2 if k >= SIX_MIN_K else 0, 3):
                _tile6a(wpk, pad, starts, p0, wf, cols, p0, ob, bias, k, k0, kn, k0 == 0, clo, chi)
                _tile6b(wpk, pad, starts, p0, wf, cols, p0, ob + 1, bias, k, k0, kn, k0 == 0, clo, chi)
            for ob in range(nb4 // 3 * 3 if k >= SIX_MIN_K else 0, nb4):
                _tile(wpk, pad, starts, p0, wf, cols, p0, ob, bias, k, k0, kn, k0 == 0, clo, chi)
    for r in range(o):
        d, s = y[r], wide[r]
        for oy in range(oh):
            for ox in range(ow):
                d[oy * ow + ox] = s[oy * wp + ox]


@nb.njit(nogil=True, cache=True, boundscheck=False)
def conv_wide_images(x, h, w, top, left, starts, plane, wp, cols, wpk, bias, lo, hi, out, oh, ow, size, i0, i1):
    """conv_wide for images i0 <= i < i1 of x [N, C, H W] into out [N, O, OH OW], with this call's
    scratch (the padded planes' borders are zeroed once: each image rewrites only the interior)."""
    pad = np.zeros(size, np.float32)
    wide = np.empty((out.shape[1], cols), np.float32)
    for i in range(i0, i1):
        conv_wide(x[i], h, w, top, left, starts, plane, wp, cols, wpk, bias, lo, hi, out[i], oh, ow, pad, wide)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def conv_wide_images_add(x, h, w, top, left, starts, plane, wp, cols, wpk, bias, lo, hi, out, r, oh, ow, size, i0, i1):
    """conv_wide_images with a residual addend r [N, O, OH OW]: the tiles leave the sum unclamped and
    the copy out of the padded width adds r and clamps (the same one pass over the output)."""
    pad = np.zeros(size, np.float32)
    o = out.shape[1]
    wide = np.empty((o, cols), np.float32)
    inf = np.float32(np.inf)
    for i in range(i0, i1):
        # oh 0: conv_wide leaves the output at the padded width in wide (its own copy skipped)
        conv_wide(x[i], h, w, top, left, starts, plane, wp, cols, wpk, bias, -inf, inf, out[i], 0, ow, pad, wide)
        y, add = out[i], r[i]
        for ch in range(o):
            d, s, a = y[ch], wide[ch], add[ch]
            for oy in range(oh):
                for ox in range(ow):
                    v = s[oy * wp + ox] + a[oy * ow + ox]
                    if v < lo:  # a NaN passes the clamp
                        v = lo
                    if v > hi:
                        v = hi
                    d[oy * ow + ox] = v
