"""Convolutions with few output pixels as a GEMM with the pixels as rows: Y^T [P, O] = cols^T [P, K]
@ W^T [K, O], the weights streamed once, for core's Conv2D at inference.

On small planes (ResNet's 2x2 and 4x4 stages, SqueezeNet's 6x6) a convolution's product W [O, K] @
cols [K, P] has P of 4 to 36: BLAS packs all O x K weights on every call to use them P times, and
jit.gemm_f32 (vectors along P) wastes up to half of each 16-wide tile and walks the weights once
per 16 pixels, O/4 strided streams at a time. With the cold weights of a real model both ran at
half the speed they reach in a loop (256 x 2304 x 4: 354 and 326 us cold, 186 and 147 warm). Here
the roles are swapped: the weights, relaid once as [O/16, K, 16] (W^T in 16-column panels), are the
streamed operand, read once, in order, through jit.gemm_f32's register tile (4 pixel rows x 16
output channels), and the pixels' columns are the small packed operand ([P/4, K, 4], gathered by an
index table built once per geometry, padding included). A last pass adds the bias, clamps and
writes NCHW.
"""
from __future__ import annotations

import numba as nb  # imported only when a kernel is first bound
import numpy as np

from .gemm_f32 import MR, NR, _panels

__all__ = ["pack_weights_t", "pixel_index", "conv_pixels", "conv_pixels_add", "gather_rows", "panels_range",
           "panels_finish_range", "finish_range", "finish_add_range", "images_range", "images_add_range"]


def pack_weights_t(w: np.ndarray) -> np.ndarray:
    """w [O, K] -> W^T in panels of 16 output channels [ceil(O/16), K, 16], zero past O."""
    o, k = w.shape
    op = -(-o // NR) * NR
    wt = np.zeros((op, k), np.float32)
    wt[:o] = w
    return np.ascontiguousarray(wt.reshape(op // NR, NR, k).transpose(0, 2, 1))


def pixel_index(c, h, w, kh, kw, sh, sw, dh, dw, top, left, oh, ow) -> np.ndarray:
    """The gather table of conv_pixels, for one image: for each output pixel (oy, ox) and column
    k = (channel, ky, kx), the flat index into the image [C, H, W] of that input element, or C H W
    (a zero) where the window reads padding. [OH OW, C kh kw] int32."""
    oy, ox = np.meshgrid(np.arange(oh), np.arange(ow), indexing="ij")
    ch, ky, kx = np.meshgrid(np.arange(c), np.arange(kh), np.arange(kw), indexing="ij")
    ys = oy.reshape(-1, 1) * sh + ky.reshape(1, -1) * dh - top  # [pixels, K]
    xs = ox.reshape(-1, 1) * sw + kx.reshape(1, -1) * dw - left
    inside = (ys >= 0) & (ys < h) & (xs >= 0) & (xs < w)
    return np.where(inside, (ch.reshape(1, -1) * h + ys) * w + xs, c * h * w).astype(np.int32)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def conv_pixels(xf, index, wt, bias, lo, hi, zeros, a, yt, out, pix):
    """out [N, O, P] = clamp(W @ cols + bias, lo, hi) for the images of xf (flat x), the rows (image,
    pixel) of cols gathered by `index` (pixel_index) into a [ceil(R/4), K, 4] scratch, yt [4 ceil(R/4),
    16 ceil(O/16)] scratch, wt pack_weights_t's panels, zeros [4 ceil(R/4)] (the tile's row bias),
    pix = P (output pixels per image)."""
    _pixels_product(xf, index, wt, zeros, a, yt, out.shape[0], pix)
    _finish(yt, bias, None, lo, hi, out, pix)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def conv_pixels_add(xf, index, wt, bias, r, lo, hi, zeros, a, yt, out, pix):
    """conv_pixels with a residual addend r [N, O, P] added in the last pass, before the clamp."""
    _pixels_product(xf, index, wt, zeros, a, yt, out.shape[0], pix)
    _finish(yt, bias, r, lo, hi, out, pix)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def _finish(yt, bias, r, lo, hi, out, pix, first=0, c0=0, c1=-1):
    """out [N, O, P] = clamp(yt's rows (image first + i, pixel) + bias (+ r [N, O, P], or None: pruned
    at compile time), lo, hi), over the output channels [c0, c1) (c1 -1: to O)."""
    n = out.shape[0]
    o = out.shape[1] if c1 < 0 else c1
    for i in range(n):
        base = (first + i) * pix
        for ch in range(c0, o):
            b = bias[ch]
            dst = out[i, ch]
            for p in range(pix):
                v = yt[base + p, ch] + b
                if r is not None:
                    v += r[i, ch, p]
                if v < lo:  # a NaN passes the clamp
                    v = lo
                if v > hi:
                    v = hi
                dst[p] = v


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gather_rows(xf, index, a, n, pix):
    """The columns of the rows (image, pixel) of n images into a [ceil(R/4), K, 4] (zero past R)."""
    k = index.shape[1]
    chw = xf.size // n
    rows = n * pix
    for r in range(rows):  # a [R/4, K, 4]: row r's columns at a[r // 4, :, r % 4]
        i, p = r // pix, r % pix
        src, t = xf[i * chw:], index[p]
        dst = a[r // MR]
        rr = r % MR
        for q in range(k):
            j = t[q]
            dst[q, rr] = src[j] if j < chw else 0
    for r in range(rows, a.shape[0] * MR):  # rows past the last whole 4: zeros
        for q in range(k):
            a[r // MR, q, r % MR] = 0


@nb.njit(nogil=True, cache=True, boundscheck=False)
def panels_range(a, wt, zeros, yt, p0, p1):
    """yt's 16-column panels [p0, p1) = the gathered rows a @ W^T's panels (conv_pixels' product,
    each panel computed alone: the same bytes however the panels are cut)."""
    k = a.shape[1]
    af = a.reshape(a.size)
    rp = a.shape[0] * MR
    op = yt.shape[1]
    ytf, wtf = yt.reshape(yt.size), wt.reshape(wt.size)
    inf = np.float32(np.inf)
    for panel in range(p0, p1):
        _panels(af, zeros, wtf, NR, panel * k * NR, ytf, op, panel * NR, rp, k, -inf, inf, False)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def panels_finish_range(a, wt, zeros, yt, bias, r, lo, hi, out, pix, p0, p1):
    """panels_range over panels [p0, p1), then the finish (bias, addend r [N, O, P] or None, clamp) of
    those panels' output channels: a batch-1 split's last pass done by the thread that computed each
    channel, in its cache, instead of by the caller after the split (the same operations on each
    value: the same bytes)."""
    panels_range(a, wt, zeros, yt, p0, p1)
    c0, c1 = p0 * NR, min(p1 * NR, out.shape[1])
    if c1 > c0:
        _finish(yt, bias, r, lo, hi, out, pix, 0, c0, c1)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def images_range(xf, index, wt, bias, lo, hi, zeros, a, yt, out, pix, i0, i1):
    """conv_pixels for images [i0, i1) alone (pix a multiple of 4: an image's rows fill whole row
    quads of a, so every row meets the same tiles however the images are cut): their gather, every
    weight panel over their rows, their finish."""
    n = out.shape[0]
    chw = xf.size // n
    q0, q1 = i0 * pix // MR, i1 * pix // MR
    gather_rows(xf[i0 * chw:i1 * chw], index, a[q0:q1], i1 - i0, pix)
    panels_range(a[q0:q1], wt, zeros[:(q1 - q0) * MR], yt[i0 * pix:i1 * pix], 0, yt.shape[1] // NR)
    _finish(yt, bias, None, lo, hi, out[i0:i1], pix, i0)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def images_add_range(xf, index, wt, bias, r, lo, hi, zeros, a, yt, out, pix, i0, i1):
    """images_range with the residual addend r [N, O, P] added before the clamp."""
    n = out.shape[0]
    chw = xf.size // n
    q0, q1 = i0 * pix // MR, i1 * pix // MR
    gather_rows(xf[i0 * chw:i1 * chw], index, a[q0:q1], i1 - i0, pix)
    panels_range(a[q0:q1], wt, zeros[:(q1 - q0) * MR], yt[i0 * pix:i1 * pix], 0, yt.shape[1] // NR)
    _finish(yt, bias, r[i0:i1], lo, hi, out[i0:i1], pix, i0)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def finish_range(yt, bias, lo, hi, out, pix, i0, i1):
    """conv_pixels' last pass for images [i0, i1)."""
    _finish(yt, bias, None, lo, hi, out[i0:i1], pix, i0)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def finish_add_range(yt, bias, r, lo, hi, out, pix, i0, i1):
    """conv_pixels_add's last pass for images [i0, i1)."""
    _finish(yt, bias, r[i0:i1], lo, hi, out[i0:i1], pix, i0)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def _pixels_product(xf, index, wt, zeros, a, yt, n, pix):
    """yt [rows, O padded] = cols^T @ W^T: the gather of the rows (image, pixel) into a, then the tile."""
    gather_rows(xf, index, a, n, pix)
    panels_range(a, wt, zeros, yt, 0, yt.shape[1] // NR)
