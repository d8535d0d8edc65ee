"""Convolutions without im2col: the output channels in the vector lanes, the input pixels broadcast
straight from the zero-padded image, for core's batch-1 and constant-weight inference convolutions.

jit.gemm_f32's tile puts 16 output pixels in its lanes, so its x operand must be 16 contiguous values
per (channel, tap) row: im2col writes them (the core CNN's 32 x 14 x 14 5x5: 11,200 runs of 14
floats, 34 us of a 280 us convolution) or jit.conv_wide computes junk columns. Here the lanes are 16
output channels, whose weights sit packed side by side ([O/16, K, 16], once per constant weights),
and each of 6 output pixels takes its input value by a broadcast from anywhere in the image: the
address is a table of (channel, tap) offsets (koff, per k) plus a table of pixel offsets (pix, per
output pixel), so any stride, dilation and padding costs nothing per element. A 6 x 16 tile is 12
accumulators, as gemm_f32's; the tile's rows of 16 channels go to a pixel-major [P, O] buffer (bias
at the start, clamp at the end) and one pass lays them out as [O, P].
"""
from __future__ import annotations

import numba as nb  # imported only when a kernel is first bound
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .gemm_f32 import _splat

NP, NC = 6, 16  # tile: output pixels, output channels (two vectors of eight)
# pixels per block: its rows of the [P, O] buffer stay in cache until laid out (a multiple of NP and 8;
# the whole image at once left the 32x32x32 -> 64 3x3 at 75 GF/s, its buffer and output beyond L2)
PB = 96
# K chunk: its [KC, 16] weight panel stays in L1 while a block's tiles pass; equal chunks of up to 320
# ran 1-4% faster than gemm_f32's 128 (fewer starts and ends of the tile; 288 = 3 x 96 rather than 128 + 128 + 32)
KC = 320


def _direct_ir(context, builder, signature, args, npx):
    """yt[(pb + j) ldy + cb 16 + c] = clamp(s + sum over k0 <= i < k0 + kn of img[koff[i] + pix[pb + j]]
    wt[cb, i, c], lo, hi) for j < npx, c < 16; s = bias[cb 16 + c] when first is nonzero, else that
    yt (a K chunk after the first). A NaN passes the clamp."""
    f32, i64 = ir.FloatType(), ir.IntType(64)
    v8 = ir.VectorType(f32, 8)
    wt, img, koff, pix, yt, bias = (context.make_array(signature.args[i])(context, builder, args[i]).data
                                    for i in (0, 1, 2, 3, 5, 8))
    wptr, iptr, yptr, bptr = (builder.bitcast(a, f32.as_pointer()) for a in (wt, img, yt, bias))
    pb, ldy, cb, k, k0, kn, first, lo, hi = (args[i] for i in (4, 6, 7, 9, 10, 11, 12, 13, 14))
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v8, v8, v8]), "llvm.fma.v8f32")
    c16 = lambda v: ir.Constant(i64, v)  # noqa: E731
    pixs = [builder.load(builder.gep(pix, [builder.add(pb, c16(j))])) for j in range(npx)]
    ch0 = builder.mul(cb, c16(NC))
    rows = [builder.add(builder.mul(builder.add(pb, c16(j)), ldy), ch0) for j in range(npx)]
    from_bias = builder.icmp_signed("!=", first, ir.Constant(first.type, 0))
    init = []
    for j in range(npx):
        for v in range(2):
            b = builder.load(builder.bitcast(builder.gep(bptr, [builder.add(ch0, c16(8 * v))]), v8.as_pointer()), align=4)
            y = builder.load(builder.bitcast(builder.gep(yptr, [builder.add(rows[j], c16(8 * v))]), v8.as_pointer()),
                             align=4)
            init.append(builder.select(from_bias, b, y))
    wbase = builder.mul(builder.add(builder.mul(cb, k), k0), c16(NC))
    entry = builder.basic_block
    loop, done = builder.append_basic_block("direct.loop"), builder.append_basic_block("direct.done")
    builder.cbranch(builder.icmp_signed(">", kn, c16(0)), loop, done)
    builder.position_at_end(loop)
    i = builder.phi(i64)
    i.add_incoming(c16(0), entry)
    accs = [builder.phi(v8) for _ in range(2 * npx)]
    for a, v in zip(accs, init):
        a.add_incoming(v, entry)
    ko = builder.load(builder.gep(koff, [builder.add(k0, i)]))
    wo = builder.add(wbase, builder.mul(i, c16(NC)))
    ws = [builder.load(builder.bitcast(builder.gep(wptr, [builder.add(wo, c16(8 * v))]), v8.as_pointer()), align=4)
          for v in range(2)]
    new = []
    for j in range(npx):
        xv = _splat(builder, builder.load(builder.gep(iptr, [builder.add(ko, pixs[j])])), v8)
        new += [builder.call(fma, [xv, ws[v], accs[2 * j + v]]) for v in range(2)]
    i2 = builder.add(i, c16(1))
    for a, v in zip(accs, new):
        a.add_incoming(v, loop)
    i.add_incoming(i2, loop)
    builder.cbranch(builder.icmp_signed("<", i2, kn), loop, done)
    builder.position_at_end(done)
    results = []
    for n, v in enumerate(new):  # every phi first
        res = builder.phi(v8)
        res.add_incoming(init[n], entry)
        res.add_incoming(v, loop)
        results.append(res)
    lov, hiv = _splat(builder, lo, v8), _splat(builder, hi, v8)
    for j in range(npx):
        for v in range(2):
            r = results[2 * j + v]
            r = builder.select(builder.fcmp_ordered("<", r, lov), lov, r)
            r = builder.select(builder.fcmp_ordered(">", r, hiv), hiv, r)
            builder.store(r, builder.bitcast(builder.gep(yptr, [builder.add(rows[j], c16(8 * v))]), v8.as_pointer()),
                          align=4)
    return context.get_dummy_value()


def _make_tile(npx: int):
    @intrinsic
    def tile(typingctx, wt, img, koff, pix, pb, yt, ldy, cb, bias, k, k0, kn, first, lo, hi):
        sig = types.void(wt, img, koff, pix, pb, yt, ldy, cb, bias, k, k0, kn, first, lo, hi)
        return sig, lambda context, builder, signature, args: _direct_ir(context, builder, signature, args, npx)
    return tile


_tile = _make_tile(NP)


def pack_channels(w: np.ndarray) -> np.ndarray:
    """w [O, K] float32 (O a multiple of 16) -> [O/16, K, 16]: sixteen output channels' weights side
    by side per k."""
    o, k = w.shape
    if o % NC:
        raise ValueError(f"direct convolution: {o} output channels are not a multiple of {NC}")
    return np.ascontiguousarray(w.astype(np.float32).reshape(o // NC, NC, k).transpose(0, 2, 1))


def tables(c, h, w, kh, kw, sh, sw, dh, dw, top, left, bottom, right, oh, ow):
    """(koff [C kh kw] int64: each (channel, tap)'s offset in the padded planes; pix [P rounded up to
    whole tiles] int64: each output pixel's window corner (the pad pixels repeat the last); the
    padded width; the padded planes' size in floats) for a geometry."""
    hp, wp = h + top + bottom, w + left + right
    ch, ky, kx = np.meshgrid(np.arange(c), np.arange(kh), np.arange(kw), indexing="ij")
    koff = (ch * hp * wp + ky * dh * wp + kx * dw).reshape(-1).astype(np.int64)
    oy, ox = np.meshgrid(np.arange(oh), np.arange(ow), indexing="ij")
    pix = (oy * sh * wp + ox * sw).reshape(-1).astype(np.int64)
    pp = -(-pix.size // NP) * NP
    pix = np.concatenate([pix, np.full(pp - pix.size, pix[-1], np.int64)])
    return koff, pix, wp, c * hp * wp


@nb.njit(nogil=True, cache=True, boundscheck=False)
def conv_direct(x, h, w, top, left, wp, koff, pix, wt, bias, lo, hi, y, r, pad, yt):
    """y [O, P] = clamp(W @ im2col(x) + bias (+ r), lo, hi) for one image x [C, H W] (r [O, P] the
    addend, or a [0, 0] array for none): x is copied into pad (the zero-padded planes, flat; its
    borders stay zero), the tiles read it through koff and pix, yt [P rounded up to tiles, O]
    receives the output pixel-major (clamped there without an addend), then y its transpose, a block
    of PB pixels at a time."""
    c = x.shape[0]
    plane = pad.shape[0] // c
    for ch in range(c):
        src = x[ch]
        for yy in range(h):
            d, s = pad[ch * plane + (top + yy) * wp + left:], src[yy * w:]
            for i in range(w):
                d[i] = s[i]
    o, k, p = y.shape[0], koff.shape[0], y.shape[1]
    ldy = yt.shape[1]
    yf = yt.reshape(yt.shape[0] * ldy)
    inf = np.float32(np.inf)
    add = r.shape[0] > 0
    kc = -(-k // -(-k // KC))  # K in equal chunks of at most KC
    for q0 in range(0, pix.shape[0], PB):  # a block of pixels through every channel block, then out
        q1 = min(q0 + PB, pix.shape[0])
        for cb in range(o // NC):
            for k0 in range(0, k, kc):
                kn = min(kc, k - k0)
                last = k0 + kn >= k and not add
                clo, chi = (lo, hi) if last else (-inf, inf)
                for pb in range(q0, q1, NP):
                    _tile(wt, pad, koff, pix, pb, yf, ldy, cb, bias, k, k0, kn, k0 == 0, clo, chi)
        _lay_out(yt, y, r, add, lo, hi, q0, min(q1, p))


@nb.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _lay_out(yt, y, r, add, lo, hi, q0, q1):
    """y[:, q0:q1] = yt[q0:q1] transposed (+ r and the clamp where add), 8 pixels at a time: y's rows
    may lie 4 KB apart (one L1 set)."""
    for r0 in range(q0, q1, 8):
        r1 = min(r0 + 8, q1)
        for ch in range(y.shape[0]):
            d = y[ch]
            if add:
                a = r[ch]
                for q in range(r0, r1):
                    v = yt[q, ch] + a[q]
                    if v < lo:  # a NaN passes the clamp
                        v = lo
                    if v > hi:
                        v = hi
                    d[q] = v
            else:
                for q in range(r0, r1):
                    d[q] = yt[q, ch]


@nb.njit(nogil=True, cache=True, boundscheck=False)
def conv_direct_images(x, h, w, top, left, wp, koff, pix, wt, bias, lo, hi, out, r, size, i0, i1):
    """conv_direct for images i0 <= i < i1 of x [N, C, H W] into out [N, O, P] (r [N, O, P] the addend
    or a [0, 0, 0] array), with this call's scratch (the padded planes' borders zeroed once)."""
    pad = np.zeros(size, np.float32)
    yt = np.empty((pix.shape[0], out.shape[1]), np.float32)
    none = np.empty((0, 0), np.float32)
    for i in range(i0, i1):
        conv_direct(x[i], h, w, top, left, wp, koff, pix, wt, bias, lo, hi, out[i], r[i] if r.shape[0] else none,
                    pad, yt)
