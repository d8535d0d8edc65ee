"""A batch of images' convolutions (im2col + the packed fp32 GEMM with bias and clamp), one compiled
call per chunk of images.

The executor's per-image loop (numpy's window copy, a BLAS product, the bias pass) paid a few
Python calls per image, and concurrent small BLAS products barely overlapped on two threads (the
core CNN's first layer, 64 images of 32x28x28: 3.3 ms on one thread, no faster on two). Here a
chunk of images is one nogil call: each image's columns go through jit.gemm_f32.im2col into a
per-chunk buffer and jit.gemm_f32.gemm_bias_clamp writes the finished output.
"""
from __future__ import annotations

import numba as nb  # imported only when the kernel is first bound
import numpy as np

from .gemm_f32 import NR, gemm_bias_clamp, im2col


@nb.njit(nogil=True, cache=True, boundscheck=False)
def conv_images_bias_clamp(xpad, ws, wp, bias, lo, hi, geo, out, i0, i1):
    """out[i] [O, OH OW] = clamp(W @ im2col(xpad[i]) + bias, lo, hi) for i0 <= i < i1: xpad [N, C,
    Hp ws] the padded images (flat planes of width ws), wp the weights packed by
    gemm_f32.pack_weights, geo (kh, kw, sh, sw, dh, dw, oh, ow)."""
    kh, kw, sh, sw, dh, dw, oh, ow = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    k = xpad.shape[1] * kh * kw
    o = out.shape[1]
    cols = np.empty((k, oh * ow), np.float32)
    panel = np.empty((k, NR), np.float32)
    tile = np.empty((o, NR), np.float32)
    for i in range(i0, i1):
        im2col(xpad[i], ws, kh, kw, sh, sw, dh, dw, cols, oh, ow)
        gemm_bias_clamp(wp, bias, cols, lo, hi, out[i], panel, tile)
