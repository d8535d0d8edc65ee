"""The im2col gather of one image's convolution windows, in runs of whole 8-element vectors.

A window row of the column matrix is OH runs of OW values (stride 1: contiguous in the padded
plane; stride 2: every other value). A per-element loop paid its setup and its scalar remainder
for every run: the core CNN's 32 x 14 x 14 5x5 gather is 11,200 runs of 14 floats and took 66 us
(6 ns a run). Here a run of 8 or more goes as unaligned 8-element vector copies, its last vector
overlapping the one before (14 = 8 + 8 written at 0 and 6), so no run has a scalar tail; stride 2
loads 16 and keeps the even lanes. Runs shorter than 8 keep the element loop.
"""
from __future__ import annotations

import numba as nb  # imported only when a kernel is first bound
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

V = 8  # elements per vector copy


def _ptr(context, builder, aty, arr, idx, vt):
    data = context.make_array(aty)(context, builder, arr).data
    return builder.bitcast(builder.gep(data, [idx]), vt.as_pointer())


@intrinsic
def _copy8(typingctx, dst, d0, src, s0):
    """dst[d0:d0 + 8] = src[s0:s0 + 8]: one unaligned vector load and store (any element type; no
    bounds check: the caller's)."""
    sig = types.void(dst, d0, src, s0)

    def codegen(context, builder, signature, args):
        vt = ir.VectorType(context.get_data_type(signature.args[0].dtype), V)
        v = builder.load(_ptr(context, builder, signature.args[2], args[2], args[3], vt), align=1)
        builder.store(v, _ptr(context, builder, signature.args[0], args[0], args[1], vt), align=1)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _copy8_s2(typingctx, dst, d0, src, s0):
    """dst[d0:d0 + 8] = src[s0:s0 + 16:2]: two vector loads, the even lanes kept (reads src[s0 + 15])."""
    sig = types.void(dst, d0, src, s0)

    def codegen(context, builder, signature, args):
        vt = ir.VectorType(context.get_data_type(signature.args[0].dtype), 2 * V)
        v = builder.load(_ptr(context, builder, signature.args[2], args[2], args[3], vt), align=1)
        even = builder.shuffle_vector(v, ir.Constant(vt, ir.Undefined),
                                      ir.Constant(ir.VectorType(ir.IntType(32), V), [2 * i for i in range(V)]))
        d = _ptr(context, builder, signature.args[0], args[0], args[1], ir.VectorType(vt.element, V))
        builder.store(even, d, align=1)
        return context.get_dummy_value()
    return sig, codegen


@nb.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _run(dst, d0, src, s0, n, sw, end):
    """dst[d0:d0 + n] = src[s0:s0 + n sw:sw]; end: how far src may be read (its length)."""
    if n >= V and sw == 1:
        for j in range(0, n - V, V):
            _copy8(dst, d0 + j, src, s0 + j)
        _copy8(dst, d0 + n - V, src, s0 + n - V)
    elif n >= V and sw == 2 and s0 + 2 * n <= end:
        for j in range(0, n - V, V):
            _copy8_s2(dst, d0 + j, src, s0 + 2 * j)
        _copy8_s2(dst, d0 + n - V, src, s0 + 2 * (n - V))
    elif sw == 1:
        for j in range(n):
            dst[d0 + j] = src[s0 + j]
    elif sw == 2:  # a constant stride vectorizes (interleaved loads)
        for j in range(n):
            dst[d0 + j] = src[s0 + 2 * j]
    else:
        for j in range(n):
            dst[d0 + j] = src[s0 + j * sw]


@nb.njit(nogil=True, cache=True, boundscheck=False)
def im2col(pad, ws, kh, kw, sh, sw, dh, dw, cols, oh, ow):
    """cols [C kh kw, OH OW] (rows in (c, ky, kx) order) = the windows of pad [C, >= Hp ws] (one image,
    padded, flat planes of width ws): cols[(c kh + ky) kw + kx, oy OW + ox] =
    pad[c, (oy sh + ky dh) ws + ox sw + kx dw]."""
    c = pad.shape[0]
    end = pad.shape[1]
    for ch in range(c):
        src = pad[ch]
        for ky in range(kh):
            for kx in range(kw):
                row = cols[(ch * kh + ky) * kw + kx]
                for oy in range(oh):
                    _run(row, oy * ow, src, (oy * sh + ky * dh) * ws + kx * dw, ow, sw, end)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def im2col_ld(x, h, w, geo, cols):
    """cols [C kh kw, >= OH OW] (rows (c, ky, kx), any row stride) = the windows of one image x [C,
    H W] (flat planes, unpadded). geo (kh, kw, sh, sw, dh, dw, top, bottom, left, right, oh, ow).
    Each channel is padded in a small scratch plane that stays in cache (the borders zeroed once),
    instead of a padded copy of the whole image; im2col's runs then read it."""
    kh, kw, sh, sw, dh, dw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    top, bottom, left, right, oh, ow = geo[6], geo[7], geo[8], geo[9], geo[10], geo[11]
    c = x.shape[0]
    hp, wp = h + top + bottom, w + left + right
    padded = top + bottom + left + right > 0
    plane = np.zeros(hp * wp if padded else 1, x.dtype)
    for ch in range(c):
        if padded:
            src_x = x[ch]
            for y in range(h):
                _run(plane, (y + top) * wp + left, src_x, y * w, w, 1, w * h)
            src = plane.reshape(1, hp * wp)
        else:
            src = x[ch:ch + 1]
        im2col(src, wp, kh, kw, sh, sw, dh, dw, cols[ch * kh * kw:(ch + 1) * kh * kw], oh, ow)
