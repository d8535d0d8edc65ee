"""Depthwise 2-D convolution over int8 input in exact float arithmetic, for the edge's int8 kernels.

`depthwise_int8_rows(x, zx, w, bias, g, lo, hi, magic, base, outf, outq, r0, r1)` computes rows
r0..r1 of x [R, H, W] (int8; R = images x channels, channel = row % C) against float weights
w [C, kh, kw]: acc = clamp(bias + sum over taps of w * (x - zx), lo, hi), zero padding (so a padded
tap adds nothing, as x = zx would). outq None: outf [R, OH, OW] (w's dtype) = acc. Otherwise the
requantization edge/quant.UniformRequantizer's short path does in numpy, fused:
outq [R, OH, OW] (int8) = int32(acc + magic) - base, magic = 1.5 * 2^23 + zero point in float32
(the add rounds to the nearest integer; edge/quant.py explains why that is the requantized value).

The caller guarantees that every partial sum is exact in w's dtype (edge/compiled.exact_int8_bias),
so the result does not depend on the order of the sums: it is the numpy einsum's, bit for bit.
Layout as jit/depthwise.py: each row is converted once into a zero-bordered float plane; 3x3
kernels (dilation 1) at stride 1 or 2 have their nine products unrolled, other shapes loop over
taps into a row accumulator. Each output is stored clamped (float) or requantized (int8) as it is
computed.
"""
from __future__ import annotations

import numba as nb  # imported only when an int8 compiled kernel is first bound
import numpy as np

from .depthwise import scratch_elems, split_phases, tap_row, taps3x3

_OPTS = dict(nogil=True, cache=True, fastmath={"contract"}, boundscheck=False)


@nb.njit(**_OPTS)
def _fill(x, r, pad, pt, pl, zx):
    # row by row through 1-d contiguous slices: a 2-d view at the pad offset ran 2-4x slower here
    xr = x[r]
    for y in range(xr.shape[0]):
        row, src = pad[pt + y, pl:], xr[y]
        for i in range(src.shape[0]):
            row[i] = src[i] - zx


@nb.njit(**_OPTS)
def _requantize(v, lo, hi, magic, base):
    return np.int8(np.int32(min(max(v, lo), hi) + magic) - base)


@nb.njit(**_OPTS)
def _s1_3x3(x, zx, w, bias, pt, pl, lo, hi, magic, base, quant, outf, outq, oh, ow, r0, r1, pad):
    c = w.shape[0]
    pad[:, :] = 0  # the border stays zero; each row's fill rewrites the inside
    for r in range(r0, r1):
        ch = r % c
        _fill(x, r, pad, pt, pl, zx)
        b = bias[ch]
        w00, w01, w02, w10, w11, w12, w20, w21, w22 = taps3x3(w, ch)
        for oy in range(oh):
            a0, a1, a2 = pad[oy], pad[oy + 1], pad[oy + 2]
            if quant:
                oq = outq[r, oy]
                for ox in range(ow):
                    v = (b + w00 * a0[ox] + w01 * a0[ox + 1] + w02 * a0[ox + 2]
                         + w10 * a1[ox] + w11 * a1[ox + 1] + w12 * a1[ox + 2]
                         + w20 * a2[ox] + w21 * a2[ox + 1] + w22 * a2[ox + 2])
                    oq[ox] = _requantize(v, lo, hi, magic, base)
            else:
                of = outf[r, oy]
                for ox in range(ow):
                    v = (b + w00 * a0[ox] + w01 * a0[ox + 1] + w02 * a0[ox + 2]
                         + w10 * a1[ox] + w11 * a1[ox + 1] + w12 * a1[ox + 2]
                         + w20 * a2[ox] + w21 * a2[ox + 1] + w22 * a2[ox + 2])
                    of[ox] = min(max(v, lo), hi)


@nb.njit(**_OPTS)
def _s2_3x3(x, zx, w, bias, pt, pl, lo, hi, magic, base, quant, outf, outq, oh, ow, r0, r1, pad, ev, od):
    # even and odd phases of the padded columns, as jit/depthwise.py's stride-2 kernel
    c = w.shape[0]
    pad[:, :] = 0
    for r in range(r0, r1):
        ch = r % c
        _fill(x, r, pad, pt, pl, zx)
        split_phases(pad, ev, od)
        b = bias[ch]
        w00, w01, w02, w10, w11, w12, w20, w21, w22 = taps3x3(w, ch)
        for oy in range(oh):
            y0 = 2 * oy
            e0, e1, e2 = ev[y0], ev[y0 + 1], ev[y0 + 2]
            d0, d1, d2 = od[y0], od[y0 + 1], od[y0 + 2]
            if quant:
                oq = outq[r, oy]
                for ox in range(ow):
                    v = (b + w00 * e0[ox] + w01 * d0[ox] + w02 * e0[ox + 1]
                         + w10 * e1[ox] + w11 * d1[ox] + w12 * e1[ox + 1]
                         + w20 * e2[ox] + w21 * d2[ox] + w22 * e2[ox + 1])
                    oq[ox] = _requantize(v, lo, hi, magic, base)
            else:
                of = outf[r, oy]
                for ox in range(ow):
                    v = (b + w00 * e0[ox] + w01 * d0[ox] + w02 * e0[ox + 1]
                         + w10 * e1[ox] + w11 * d1[ox] + w12 * e1[ox + 1]
                         + w20 * e2[ox] + w21 * d2[ox] + w22 * e2[ox + 1])
                    of[ox] = min(max(v, lo), hi)


@nb.njit(**_OPTS)
def _general(x, zx, w, bias, sh, sw, dh, dw, pt, pl, lo, hi, magic, base, quant, outf, outq,
             oh, ow, r0, r1, pad, acc):
    c = w.shape[0]
    pad[:, :] = 0
    for r in range(r0, r1):
        ch = r % c
        _fill(x, r, pad, pt, pl, zx)
        for oy in range(oh):
            tap_row(acc, pad, w, bias[ch], ch, oy, sh, sw, dh, dw)
            if quant:
                oq = outq[r, oy]
                for ox in range(ow):
                    oq[ox] = _requantize(acc[ox], lo, hi, magic, base)
            else:
                of = outf[r, oy]
                for ox in range(ow):
                    of[ox] = min(max(acc[ox], lo), hi)


def depthwise_int8_rows(x, zx: float, w, bias, g, lo: float, hi: float, magic: float, base: int,
                        outf, outq, r0: int, r1: int, scratch=None) -> None:
    """Rows r0..r1 (see the module's docstring). x int8 [R, H, W], w [C, kh, kw] and bias [C] of one
    float dtype, outf [R, OH, OW] of that dtype or outq [R, OH, OW] int8 (the other None), all
    contiguous; g the geometry (pads ((top, bottom), (left, right)), strides, dilations); scratch as
    jit.depthwise.depthwise_rows's (of w's dtype; None: allocated)."""
    depthwise_int8_step(x, zx, w, bias, g, lo, hi, magic, base, outf, outq, r0, r1, scratch)()


def depthwise_int8_step(x, zx: float, w, bias, g, lo: float, hi: float, magic: float, base: int,
                        outf, outq, r0: int = 0, r1: int = -1, scratch=None):
    """depthwise_int8_rows as a step taking no arguments: the kernel chosen and its arguments
    converted once (the per-call wrapper cost about 3 us, a tenth of a small layer). r1 -1: all rows.
    scratch: a 1-D array of w's dtype of at least jit.depthwise.scratch_elems(...) elements (an
    interpreter's arena), or None to allocate one here, once."""
    (pt, pb), (pl, pr) = g.pads
    dt = w.dtype
    quant = outq is not None
    out = outq if quant else outf
    oh, ow = out.shape[1], out.shape[2]
    if quant:
        outf = np.empty((1, 1, 1), dt)
    else:
        outq = np.empty((1, 1, 1), np.int8)
    r1 = x.shape[0] if r1 < 0 else r1
    h, wd = x.shape[1], x.shape[2]
    hp, wp = h + pt + pb, wd + pl + pr
    need = scratch_elems(x.shape, w.shape, g)
    if scratch is None:
        scratch = np.empty(need, dt)
    elif scratch.ndim != 1 or scratch.dtype != dt or scratch.size < need:
        raise ValueError(f"int8 depthwise scratch must be a 1-D {dt} array of at least {need} elements, "
                         f"got {scratch.dtype} {scratch.shape}")
    tail = (dt.type(lo), dt.type(hi), dt.type(magic), np.int32(base), quant, outf, outq, oh, ow, r0, r1)
    if w.shape[1] == 3 and w.shape[2] == 3 and g.dh == 1 and g.dw == 1 and g.sh == g.sw and g.sh in (1, 2):
        if g.sh == 1:
            kernel = _s1_3x3
            bufs = (scratch[:hp * wp].reshape(hp, wp),)
        else:
            kernel = _s2_3x3
            wq = wp // 2 + 1
            bufs = (scratch[:hp * 2 * wq].reshape(hp, 2 * wq), scratch[hp * 2 * wq:hp * 3 * wq].reshape(hp, wq),
                    scratch[hp * 3 * wq:hp * 4 * wq].reshape(hp, wq))
        args = (x, dt.type(zx), w, bias, pt, pl) + tail + bufs
    else:
        kernel = _general
        args = (x, dt.type(zx), w, bias, g.sh, g.sw, g.dh, g.dw, pt, pl) + tail + \
            (scratch[:hp * wp].reshape(hp, wp), scratch[hp * wp:hp * wp + ow])

    def run():
        kernel(*args)
    return run
