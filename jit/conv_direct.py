"""Convolutions without im2col: the output channels in the vector lanes, the input pixels broadcast
straight from the zero-padded image, for core's batch-1 and constant-weight inference convolutions.

jit.gemm_f32's tile puts 16 output pixels in its lanes, so its x operand must be 16 contiguous values
per (channel, tap) row: im2col writes them (the core CNN's 32 x 14 x 14 5x5: 11,200 runs of 14
floats, 34 us of a 280 us convolution) or jit.conv_wide computes junk columns. Here the lanes are 16
output channels, whose weights sit packed side by side ([O/16, K, 16], once per constant weights),
and each of 6 output pixels takes its input value by a broadcast from anywhere in the image: the
address is a table of (channel, tap) offsets (koff, per k) plus a table of pixel offsets (pix, per
output pixel), so any stride, dilation and padding costs nothing per element. A 6 x 16 tile is 12
accumulators, as gemm_f32's; the tile's rows of 16 channels go to a pixel-major buffer (bias at the
start, clamp at the end) that holds a block of PB pixels, and each finished block is laid out as
[O, P] in 8 x 8 blocks transposed in registers (the residual addend and the clamp applied there).
"""
from __future__ import annotations

import numba as nb  # imported only when a kernel is first bound
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .gemm_f32 import _splat, close_k_loop
from .im2col import _run

NP, NC = 6, 16  # tile: output pixels, output channels (two vectors of eight)
# pixels per block: its rows of the [P, O] buffer stay in cache until laid out (a multiple of NP and 8;
# the whole image at once left the 32x32x32 -> 64 3x3 at 75 GF/s, its buffer and output beyond L2)
PB = 96
# K chunk: its [KC, 16] weight panel stays in L1 while a block's tiles pass; equal chunks of up to 320
# ran 1-4% faster than gemm_f32's 128 (fewer starts and ends of the tile; 288 = 3 x 96 rather than 128 + 128 + 32)
KC = 320


def _direct_ir(context, builder, signature, args, npx):
    """yt[(pb - y0 + j) ldy + cb 16 + c] = clamp(s + sum over k0 <= i < k0 + kn of img[koff[i] + pix[pb + j]]
    wt[cb, i, c], lo, hi) for j < npx, c < 16; s = bias[cb 16 + c] when first is nonzero, else that
    yt (a K chunk after the first). A NaN passes the clamp."""
    f32, i64 = ir.FloatType(), ir.IntType(64)
    v8 = ir.VectorType(f32, 8)
    wt, img, koff, pix, yt, bias = (context.make_array(signature.args[i])(context, builder, args[i]).data
                                    for i in (0, 1, 2, 3, 5, 8))
    wptr, iptr, yptr, bptr = (builder.bitcast(a, f32.as_pointer()) for a in (wt, img, yt, bias))
    pb, ldy, cb, k, k0, kn, first, lo, hi, y0 = (args[i] for i in (4, 6, 7, 9, 10, 11, 12, 13, 14, 15))
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v8, v8, v8]), "llvm.fma.v8f32")
    c16 = lambda v: ir.Constant(i64, v)  # noqa: E731
    pixs = [builder.load(builder.gep(pix, [builder.add(pb, c16(j))])) for j in range(npx)]
    ch0 = builder.mul(cb, c16(NC))
    rows = [builder.add(builder.mul(builder.add(builder.sub(pb, y0), c16(j)), ldy), ch0) for j in range(npx)]
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
    results = close_k_loop(builder, entry, loop, done, i, kn, accs, new, init)
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
    def tile(typingctx, wt, img, koff, pix, pb, yt, ldy, cb, bias, k, k0, kn, first, lo, hi, y0):
        sig = types.void(wt, img, koff, pix, pb, yt, ldy, cb, bias, k, k0, kn, first, lo, hi, y0)
        return sig, lambda context, builder, signature, args: _direct_ir(context, builder, signature, args, npx)
    return tile


_tile = _make_tile(NP)


def _transpose8_ir(context, builder, signature, args, add):
    """dst[d0 + j ldd + i] = src[s0 + i lds + j] (+ r at dst's offset, then the clamp, where add) for
    i, j < 8: eight row loads, three rounds of shuffles (unpack, pairs, 128-bit halves), eight stores."""
    f32, i32 = ir.FloatType(), ir.IntType(32)
    v8 = ir.VectorType(f32, 8)
    src, dst = (builder.bitcast(context.make_array(signature.args[i])(context, builder, args[i]).data,
                                f32.as_pointer()) for i in (0, 3))
    s0, lds, d0, ldd = args[1], args[2], args[4], args[5]

    def at(ptr, base, ld, i):
        return builder.bitcast(builder.gep(ptr, [builder.add(base, builder.mul(ld, ir.Constant(ld.type, i)))]),
                               v8.as_pointer())

    def shuf(a, b, idx):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, 8), idx))
    rows = [builder.load(at(src, s0, lds, i), align=4) for i in range(8)]
    lo8, hi8 = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    t = []
    for i in range(0, 8, 2):
        t += [shuf(rows[i], rows[i + 1], lo8), shuf(rows[i], rows[i + 1], hi8)]
    pl, ph = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    u = [shuf(t[0], t[2], pl), shuf(t[0], t[2], ph), shuf(t[1], t[3], pl), shuf(t[1], t[3], ph),
         shuf(t[4], t[6], pl), shuf(t[4], t[6], ph), shuf(t[5], t[7], pl), shuf(t[5], t[7], ph)]
    low, high = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
    cols = [shuf(u[j], u[j + 4], low) for j in range(4)] + [shuf(u[j], u[j + 4], high) for j in range(4)]
    if add:
        r = builder.bitcast(context.make_array(signature.args[6])(context, builder, args[6]).data, f32.as_pointer())
        lov, hiv = (_splat(builder, a, v8) for a in (args[7], args[8]))
    for j, c in enumerate(cols):
        if add:
            c = builder.fadd(c, builder.load(at(r, d0, ldd, j), align=4))
            c = builder.select(builder.fcmp_ordered("<", c, lov), lov, c)  # a NaN passes the clamp
            c = builder.select(builder.fcmp_ordered(">", c, hiv), hiv, c)
        builder.store(c, at(dst, d0, ldd, j), align=4)
    return context.get_dummy_value()


@intrinsic
def _transpose8(typingctx, src, s0, lds, dst, d0, ldd):
    sig = types.void(src, s0, lds, dst, d0, ldd)
    return sig, lambda context, builder, signature, args: _transpose8_ir(context, builder, signature, args, False)


@intrinsic
def _transpose8_add(typingctx, src, s0, lds, dst, d0, ldd, r, lo, hi):
    sig = types.void(src, s0, lds, dst, d0, ldd, r, lo, hi)
    return sig, lambda context, builder, signature, args: _transpose8_ir(context, builder, signature, args, True)


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
    borders stay zero), the tiles read it through koff and pix; a block of PB pixels at a time, yt
    [>= min(PB, pix's length), O] receives the block pixel-major (clamped there without an addend),
    then y its transpose."""
    pad_image(x, h, w, top, left, wp, pad)
    _blocks(pad, koff, pix, wt, bias, lo, hi, y, r, yt, 0, -(-pix.shape[0] // PB))


@nb.njit(nogil=True, cache=True, boundscheck=False)
def pad_image(x, h, w, top, left, wp, pad):
    """x [C, H W] into pad, the zero-padded planes (flat; their borders left as they are: zero)."""
    c = x.shape[0]
    plane = pad.shape[0] // c
    for ch in range(c):
        src = x[ch]
        for yy in range(h):  # rows as whole 8-float vector runs (jit.im2col's)
            _run(pad, ch * plane + (top + yy) * wp + left, src, yy * w, w, 1, h * w)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def blocks_range(pad, koff, pix, wt, bias, lo, hi, y, r, b0, b1):
    """conv_direct's pixel blocks [b0, b1) (PB pixels each) of one image already in pad, with this
    call's own block buffer: each block is computed alone, so the bytes do not depend on the cuts."""
    yt = np.empty((min(PB, pix.shape[0]), y.shape[0]), np.float32)
    _blocks(pad, koff, pix, wt, bias, lo, hi, y, r, yt, b0, b1)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def channels_range(pad, koff, pix, wt, bias, lo, hi, y, r, c0, c1):
    """conv_direct's output channel blocks [c0, c1) (NC channels each) over all pixel blocks of one image
    already in pad, with this call's own block buffer: for planes of few pixel blocks, where a split by
    pixels would leave threads idle, each thread streams its own channels' weights. Each (pixel tile,
    channel block) is computed as in the whole call: the same bytes however the blocks are cut."""
    o0, o1 = c0 * NC, min(c1 * NC, y.shape[0])
    if o1 > o0:
        ys = y[o0:o1]
        yt = np.empty((min(PB, pix.shape[0]), o1 - o0), np.float32)
        _blocks(pad, koff, pix, wt[c0:c1], bias[o0:o1], lo, hi, ys, r[o0:o1] if r.shape[0] > 0 else r, yt, 0,
                -(-pix.shape[0] // PB))


@nb.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _blocks(pad, koff, pix, wt, bias, lo, hi, y, r, yt, b0, b1):
    o, k, p = y.shape[0], koff.shape[0], y.shape[1]
    ldy = yt.shape[1]
    yf = yt.reshape(yt.shape[0] * ldy)
    inf = np.float32(np.inf)
    add = r.shape[0] > 0
    kc = -(-k // -(-k // KC))  # K in equal chunks of at most KC
    for q0 in range(b0 * PB, min(b1 * PB, pix.shape[0]), PB):  # a block of pixels through every channel block, then out
        q1 = min(q0 + PB, pix.shape[0])
        for cb in range(o // NC):
            for k0 in range(0, k, kc):
                kn = min(kc, k - k0)
                last = k0 + kn >= k and not add
                clo, chi = (lo, hi) if last else (-inf, inf)
                for pb in range(q0, q1, NP):
                    _tile(wt, pad, koff, pix, pb, yf, ldy, cb, bias, k, k0, kn, k0 == 0, clo, chi, q0)
        _lay_out(yt, y, r, add, lo, hi, q0, min(q1, p))


@nb.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _lay_out(yt, y, r, add, lo, hi, q0, q1):
    """y[:, q0:q1] = yt[q0:q1] transposed (+ r and the clamp where add): whole 8 x 8 blocks by
    _transpose8 (a scalar loop here was 15% of a 3x3 convolution's time at K 288), the last q1 - q0
    mod 8 pixels one by one (y's rows may lie 4 KB apart: blocks of 8 pixels, not whole rows)."""
    o, p = y.shape[0], y.shape[1]
    ldy = yt.shape[1]
    ytf, yf = yt.reshape(yt.size), y.reshape(y.size)
    rf = r.reshape(r.size)
    whole = q0 + (q1 - q0) // 8 * 8
    for r0 in range(q0, whole, 8):
        for ch in range(0, o, 8):
            if add:
                _transpose8_add(ytf, (r0 - q0) * ldy + ch, ldy, yf, ch * p + r0, p, rf, lo, hi)
            else:
                _transpose8(ytf, (r0 - q0) * ldy + ch, ldy, yf, ch * p + r0, p)
    for ch in range(o):
        d = y[ch]
        for q in range(whole, q1):
            v = yt[q - q0, ch]
            if add:
                v += r[ch, q]
                if v < lo:  # a NaN passes the clamp
                    v = lo
                if v > hi:
                    v = hi
            d[q] = v


@nb.njit(nogil=True, cache=True, boundscheck=False)
def conv_direct_images(x, h, w, top, left, wp, koff, pix, wt, bias, lo, hi, out, r, size, i0, i1):
    """conv_direct for images i0 <= i < i1 of x [N, C, H W] into out [N, O, P] (r [N, O, P] the addend
    or a [0, 0, 0] array), with this call's scratch (the padded planes' borders zeroed once)."""
    pad = np.zeros(size, np.float32)
    yt = np.empty((min(PB, pix.shape[0]), out.shape[1]), np.float32)
    none = np.empty((0, 0), np.float32)
    for i in range(i0, i1):
        conv_direct(x[i], h, w, top, left, wp, koff, pix, wt, bias, lo, hi, out[i], r[i] if r.shape[0] else none,
                    pad, yt)
