"""fp32 GEMM with the bias and a clamp in its epilogue, for the edge's 1x1 convolutions at batch 1.

A 1x1 convolution is Y [O, P] = W [O, K] @ X [K, P] + bias, then relu/relu6. numpy runs the product
through BLAS, which packs both operands on every call (on a MobileNet's 6x6 planes the 576 x 96
weights cost as much to pack as to multiply), then the bias and the clamp take another pass over
Y (about 45 us of MobileNetV2-96's 900 us of 1x1 convolutions, one thread). Here the weights are
packed once, at prepare, as [O/4, K, 4]; X is read in place, 16 columns at a time; a 4 x 16 tile
of accumulators (eight <8 x float> vectors) starts at the bias, takes one FMA per weight and
column vector along K, and is clamped and stored. The tile is LLVM IR (a numba intrinsic, as in
jit/gemm_int8.py), since numba leaves such a register-blocked loop unvectorized.

Columns past the last whole 16 go through a zero-padded copy of their [K, P mod 16] panel and a
[O, 16] tile buffer (scratch). O must be a multiple of 4 (MobileNets' widths are multiples of 8);
callers keep BLAS otherwise.
"""
from __future__ import annotations

import numba as nb  # imported only when a kernel is first prepared
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

MR, NR = 4, 16  # tile: output rows, columns (two vectors of eight floats)


def _splat(builder, v, vt):
    i32 = ir.IntType(32)
    e = builder.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(i32, 0))
    return builder.shuffle_vector(e, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(i32, vt.count), None))


def _make_tile(nv: int):
    """The tile intrinsic over nv vectors of 8 columns (2: the main loop; 1: a short last panel)."""
    @intrinsic
    def tile(typingctx, wp, x, ldx, px, y, ldy, py, ob, bias, k, lo, hi):
        sig = types.void(wp, x, ldx, px, y, ldy, py, ob, bias, k, lo, hi)
        return sig, lambda context, builder, signature, args: _tile_ir(context, builder, signature, args, nv)
    return tile


def _tile_ir(context, builder, signature, args, nv):
    """y[(ob 4 + r) ldy + py + j] = clamp(bias[ob 4 + r] + sum over i < k of wp[ob, i, r] x[i ldx + px + j],
    lo, hi) for r < 4, j < 8 nv: wp the packed weights [O/4, K, 4], x and y flat float32. A NaN passes
    the clamp."""
    f32, i64 = ir.FloatType(), ir.IntType(64)
    v8 = ir.VectorType(f32, 8)
    arrs = [context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 1, 4, 8)]
    wptr, xptr, yptr, bptr = (builder.bitcast(a.data, f32.as_pointer()) for a in arrs)
    ldx, px, ldy, py, ob, k, lo, hi = (args[i] for i in (2, 3, 5, 6, 7, 9, 10, 11))
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v8, v8, v8]), "llvm.fma.v8f32")
    wbase = builder.mul(builder.mul(ob, k), ir.Constant(i64, MR))
    init = [_splat(builder, builder.load(builder.gep(bptr, [builder.add(builder.mul(ob, ir.Constant(i64, MR)),
                                                                         ir.Constant(i64, r))])), v8)
            for r in range(MR)]
    entry = builder.basic_block
    loop, done = builder.append_basic_block("tile.loop"), builder.append_basic_block("tile.done")
    builder.cbranch(builder.icmp_signed(">", k, ir.Constant(i64, 0)), loop, done)
    builder.position_at_end(loop)
    i = builder.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    accs = [builder.phi(v8) for _ in range(nv * MR)]
    for n, a in enumerate(accs):
        a.add_incoming(init[n // nv], entry)
    xo = builder.add(builder.mul(i, ldx), px)
    xs = [builder.load(builder.bitcast(builder.gep(xptr, [builder.add(xo, ir.Constant(i64, 8 * j))]),
                                       v8.as_pointer()), align=4) for j in range(nv)]
    wo = builder.add(wbase, builder.mul(i, ir.Constant(i64, MR)))
    new = []
    for r in range(MR):
        wv = _splat(builder, builder.load(builder.gep(wptr, [builder.add(wo, ir.Constant(i64, r))])), v8)
        new += [builder.call(fma, [wv, xs[j], accs[nv * r + j]]) for j in range(nv)]
    i2 = builder.add(i, ir.Constant(i64, 1))
    for a, v in zip(accs, new):
        a.add_incoming(v, loop)
    i.add_incoming(i2, loop)
    builder.cbranch(builder.icmp_signed("<", i2, k), loop, done)
    builder.position_at_end(done)
    results = []
    for n, v in enumerate(new):  # every phi first
        res = builder.phi(v8)
        res.add_incoming(init[n // nv], entry)
        res.add_incoming(v, loop)
        results.append(res)
    lov, hiv = _splat(builder, lo, v8), _splat(builder, hi, v8)
    for r in range(MR):
        row = builder.add(builder.mul(builder.add(builder.mul(ob, ir.Constant(i64, MR)), ir.Constant(i64, r)), ldy), py)
        for j in range(nv):
            v = results[nv * r + j]
            v = builder.select(builder.fcmp_ordered("<", v, lov), lov, v)
            v = builder.select(builder.fcmp_ordered(">", v, hiv), hiv, v)
            ptr = builder.gep(yptr, [builder.add(row, ir.Constant(i64, 8 * j))])
            builder.store(v, builder.bitcast(ptr, v8.as_pointer()), align=4)
    return context.get_dummy_value()


_tile, _tile8 = _make_tile(2), _make_tile(1)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemm_bias_clamp(wp, bias, x, lo, hi, y, panel, tile):
    """y [O, P] = clamp(W @ x [K, P] + bias, lo, hi), W packed by pack_weights ([O/4, K, 4]), bias [O];
    panel [K, 16] and tile [O, 16] scratch for the last P mod 16 columns (contents do not matter)."""
    k, p = x.shape
    o = y.shape[0]
    xf, yf = x.reshape(k * p), y.reshape(o * p)
    whole = p // NR * NR
    for p0 in range(0, whole, NR):
        for ob in range(o // MR):
            _tile(wp, xf, p, p0, yf, p, p0, ob, bias, k, lo, hi)
    rest = p - whole
    if rest:
        for i in range(k):
            src, dst = x[i], panel[i]
            for j in range(rest):
                dst[j] = src[whole + j]
            for j in range(rest, NR):
                dst[j] = 0
        pf, tf = panel.reshape(k * NR), tile.reshape(o * NR)
        for ob in range(o // MR):
            if rest <= NR // 2:
                _tile8(wp, pf, NR, 0, tf, NR, 0, ob, bias, k, lo, hi)
            else:
                _tile(wp, pf, NR, 0, tf, NR, 0, ob, bias, k, lo, hi)
        for r in range(o):
            src, dst = tile[r], y[r]
            for j in range(rest):
                dst[whole + j] = src[j]


def pack_weights(w: np.ndarray) -> np.ndarray:
    """w [O, K] float32 (O a multiple of 4) -> [O/4, K, 4]: four rows' weights side by side per k."""
    o, k = w.shape
    if o % MR:
        raise ValueError(f"fp32 GEMM: {o} output rows are not a multiple of {MR}")
    return np.ascontiguousarray(w.astype(np.float32).reshape(o // MR, MR, k).transpose(0, 2, 1))
