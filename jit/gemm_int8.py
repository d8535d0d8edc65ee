"""int8 GEMM with int32 accumulation, requantized in the same loop: the edge's int8 convolutions
(1x1 and im2col) and dense layers.

numpy has no integer GEMM, and LLVM does not vectorize a register-blocked int8 loop written in
numba into multiply-add instructions (it widens to int32 or int64 multiplies: 1-2.5x slower than
one-thread fp32 OpenBLAS, measured). So the micro-kernel is written in LLVM IR (a numba
intrinsic): a 4 x 16 tile of int32 accumulators in eight 8-lane vectors, each step multiplying a
broadcast pair of int16 weights with 16 pairs of int16 activations and summing each pair into
int32 (pmaddwd; on CPUs with AVX-512 VNNI / AVX-VNNI, LLVM fuses the add into vpdpwssd). That
needs operands in pairs along K:

- weights [O, K] int8 become int16 pairs, int32 [ceil(O/4)*4, ceil(K/2)], once at prepare (rows
  and the odd K column padded with zeros);
- activations become int16 pairs, int32 [ceil(K/2), P16] (P16: P rounded up to 16), per call in
  arena scratch: by pack_rows from a 1x1 convolution's [K, P] int8 input, by im2col_pairs straight
  from a windowed convolution's input padded with its zero point (pad_planes), in vector runs. Padded rows meet
  zero weights and padded columns are never stored, so neither is cleared.

The GEMM walks 16 columns at a time (that block of activations stays in L1 while every weight
row block passes over it) and requantizes the block's [O, 16] accumulators straight into the int8
output: out = clamp(rne(acc * q 2^-s + c 2^-s), lo, hi) per output channel (ties to even, as LiteRT's
XNNPACK), which is edge/quant.Requantizer's integer definition, in float64 where the caller proves it exact
(`float_exact`), else in int64. Needs x86 AVX2 (`supported`); elsewhere the edge keeps its
float-GEMM int8 kernels.
"""
from __future__ import annotations

import numba as nb  # imported only when an int8 GEMM kernel is first prepared
import numpy as np
from llvmlite import binding as _llvm
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .requantize import shift_round_even

MR, NR = 4, 16  # tile: weight rows, activation columns (two vectors of eight int32)


_SUPPORTED: list = []  # the answer, asked once: LLVM's CPU-feature query costs about 200 us


def supported() -> bool:
    """Whether the host CPU has the instructions the micro-kernel is written with (AVX2)."""
    if not _SUPPORTED:
        try:
            _SUPPORTED.append(bool(_llvm.get_host_cpu_features().get("avx2", False)))
        except Exception:  # an LLVM that cannot say: do not guess
            _SUPPORTED.append(False)
    return _SUPPORTED[0]


def _accumulate(context, builder, signature, args, mr=MR, nv=2):
    """IR of the tile's K loop: the nv mr <8 x i32> accumulators of rows o..o+mr-1, columns p0..p0+8nv-1."""
    wa, xa = (context.make_array(t)(context, builder, v) for t, v in zip(signature.args[:2], args[:2]))
    o_, p0_, kp_ = args[3:6]
    i32, i64 = ir.IntType(32), ir.IntType(64)
    v8, v16 = ir.VectorType(i32, 8), ir.VectorType(ir.IntType(16), 16)
    wptr, xptr = (builder.bitcast(a.data, i32.as_pointer()) for a in (wa, xa))
    ldw, ldx = (cgutils.unpack_tuple(builder, a.shape)[1] for a in (wa, xa))
    madd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v16, v16]), "llvm.x86.avx2.pmadd.wd")
    entry = builder.basic_block
    loop, done = builder.append_basic_block("tile.loop"), builder.append_basic_block("tile.done")
    zero = ir.Constant(v8, None)
    wrows = [builder.mul(builder.add(o_, ir.Constant(i64, r)), ldw) for r in range(mr)]
    builder.cbranch(builder.icmp_signed(">", kp_, ir.Constant(i64, 0)), loop, done)
    builder.position_at_end(loop)
    k = builder.phi(i64)
    k.add_incoming(ir.Constant(i64, 0), entry)
    accs = [builder.phi(v8) for _ in range(nv * mr)]
    for a in accs:
        a.add_incoming(zero, entry)
    xoff = builder.add(builder.mul(k, ldx), p0_)
    xs = [builder.bitcast(builder.load(builder.bitcast(builder.gep(xptr, [builder.add(xoff, ir.Constant(i64, 8 * j))]),
                                                       v8.as_pointer()), align=4), v16) for j in range(nv)]
    new = []
    for r in range(mr):
        wv = builder.load(builder.gep(wptr, [builder.add(wrows[r], k)]), align=4)
        b = builder.insert_element(ir.Constant(v8, ir.Undefined), wv, ir.Constant(i32, 0))
        b16 = builder.bitcast(builder.shuffle_vector(b, ir.Constant(v8, ir.Undefined), ir.Constant(v8, None)), v16)
        new += [builder.add(accs[nv * r + j], builder.call(madd, [b16, xs[j]])) for j in range(nv)]
    k2 = builder.add(k, ir.Constant(i64, 1))
    for a, v in zip(accs, new):
        a.add_incoming(v, loop)
    k.add_incoming(k2, loop)
    builder.cbranch(builder.icmp_signed("<", k2, kp_), loop, done)
    builder.position_at_end(done)
    results = []
    for v in new:  # every phi first
        res = builder.phi(v8)
        res.add_incoming(zero, entry)
        res.add_incoming(v, loop)
        results.append(res)
    return results


def _plain_tile(nv: int):
    """The tile intrinsic storing its int32 accumulators: nv vectors of 8 columns (2: 16, 1: 8)."""
    @intrinsic
    def tile(typingctx, w, x, acc, o, p0, kp):
        """acc[o + r, 0:8 nv] = sum over k < kp of pmaddwd(w[o + r, k], x[k, p0:p0 + 8 nv]) for r < 4, where
        w [Opad, Kp] and x [Kp, P16] hold int16 pairs in int32 and acc is int32 [Opad, 16]."""
        sig = types.void(w, x, acc, o, p0, kp)

        def codegen(context, builder, signature, args):
            results = _accumulate(context, builder, signature, args, MR, nv)
            i32, i64 = ir.IntType(32), ir.IntType(64)
            aa = context.make_array(signature.args[2])(context, builder, args[2])
            aptr, lda = builder.bitcast(aa.data, i32.as_pointer()), cgutils.unpack_tuple(builder, aa.shape)[1]
            for r in range(MR):
                for j in range(nv):
                    off = builder.add(builder.mul(builder.add(args[3], ir.Constant(i64, r)), lda),
                                      ir.Constant(i64, 8 * j))
                    builder.store(results[nv * r + j], builder.bitcast(builder.gep(aptr, [off]),
                                                                       ir.VectorType(i32, 8).as_pointer()), align=4)
            return context.get_dummy_value()
        return sig, codegen
    return tile


_tile, _tile8 = _plain_tile(2), _plain_tile(1)  # 16 columns; 8 (a block's last 1-8 columns)


def _requantizing_tile(mr: int, off: int):
    """The requantizing tile intrinsic over mr weight rows (4, or 6: twelve accumulators hide more of
    pmaddwd's latency on long K; measured 206 -> 174 us on the core CNN's 64 x 800 x 196), with the
    offset off (0 or -1: the zero point's odd part) a constant of the code (a run-time splat of it
    cost the float64 tiles 8-10% of the whole GEMM here)."""
    @intrinsic
    def tile(typingctx, w, x, out, o, p0, kp, mf, cf, flo, fhi, so):
        sig = types.void(w, x, out, o, p0, kp, mf, cf, flo, fhi, so)
        return sig, lambda context, builder, signature, args: _requantize_ir(context, builder, signature, args, mr, off)
    return tile


def _requantize_ir(context, builder, signature, args, mr, off):
    """The tile of _tile over mr rows, requantized in registers: out[(o + r) so + p0 + i] (int8, flat) =
    int8(int32(rint(min(max(double(acc) mf[o + r] + cf[o + r], flo), fhi))) - off) for r < mr, i < 16; the
    float64 requantization of gemm_requantize_float, element for element (mul then add, no fma)."""
    results = _accumulate(context, builder, signature, args, mr)
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    # float32 constants: the caller proved float32 exact (half the vectors of float64)
    f64 = ir.FloatType() if signature.args[6].dtype == types.float32 else ir.DoubleType()
    d8 = ir.VectorType(f64, 8)
    suffix = "v8f32" if isinstance(f64, ir.FloatType) else "v8f64"
    oa, ma, ca = (context.make_array(signature.args[k])(context, builder, args[k]) for k in (2, 6, 7))
    optr = builder.bitcast(oa.data, i8.as_pointer())
    mptr, cptr = (builder.bitcast(a.data, f64.as_pointer()) for a in (ma, ca))
    lo, hi = (builder.shuffle_vector(builder.insert_element(ir.Constant(d8, ir.Undefined),
                                                            builder.fptrunc(v, f64) if f64 != v.type else v,
                                                            ir.Constant(i32, 0)),
                                     ir.Constant(d8, ir.Undefined), ir.Constant(ir.VectorType(i32, 8), None))
              for v in (args[8], args[9]))
    vrint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(d8, [d8]), "llvm.rint." + suffix)
    i16x16, i8x32, i32x8 = ir.VectorType(ir.IntType(16), 16), ir.VectorType(i8, 32), ir.VectorType(i32, 8)
    packd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i16x16, [i32x8, i32x8]),
                                           "llvm.x86.avx2.packssdw")
    packw = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i8x32, [i16x16, i16x16]),
                                           "llvm.x86.avx2.packsswb")
    permd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32x8, [i32x8, i32x8]),
                                           "llvm.x86.avx2.permd")
    order = ir.Constant(i32x8, [0, 4, 1, 5, 2, 6, 3, 7])  # the packs interleave 128-bit lanes: undo it
    bias = ir.Constant(i32x8, [off] * 8)  # the offset: the zero point's odd part (ties to even before it)

    def splat(v):
        e = builder.insert_element(ir.Constant(d8, ir.Undefined), v, ir.Constant(i32, 0))
        return builder.shuffle_vector(e, ir.Constant(d8, ir.Undefined), ir.Constant(ir.VectorType(i32, 8), None))

    def clamp(t):  # plain compares (vmaxps / vminps): t is never NaN, so maxnum's NaN blends are not needed
        t = builder.select(builder.fcmp_ordered(">", t, lo), t, lo)
        return builder.select(builder.fcmp_ordered("<", t, hi), t, hi)
    for r in range(mr):
        row = builder.add(args[3], ir.Constant(i64, r))
        m, c = splat(builder.load(builder.gep(mptr, [row]))), splat(builder.load(builder.gep(cptr, [row])))
        q = []
        for j in range(2):
            t = builder.fadd(builder.fmul(builder.sitofp(results[2 * r + j], d8), m), c)
            q.append(builder.sub(builder.fptosi(builder.call(vrint, [clamp(t)]), i32x8), bias))
        # both halves' values lie in [-128, 127]: the saturating packs are exact narrowing casts
        b = builder.call(packw, [builder.call(packd, q)] * 2)
        b = builder.bitcast(builder.call(permd, [builder.bitcast(b, i32x8), order]), i32x8)
        lo16 = builder.shuffle_vector(b, ir.Constant(i32x8, ir.Undefined), ir.Constant(ir.VectorType(i32, 4),
                                                                                     [0, 1, 2, 3]))
        at = builder.add(builder.mul(row, args[10]), args[4])
        builder.store(lo16, builder.bitcast(builder.gep(optr, [at]), ir.VectorType(i32, 4).as_pointer()), align=1)
    return context.get_dummy_value()


_tile_requantize, _tile_requantize6 = _requantizing_tile(MR, 0), _requantizing_tile(6, 0)
_tile_requantize_odd, _tile_requantize6_odd = _requantizing_tile(MR, -1), _requantizing_tile(6, -1)


def pack_weights(w: np.ndarray) -> np.ndarray:
    """Integer weights [O, K] within int16 (int8 less its zero point) -> int16 pairs along K as int32
    [ceil(O/4)*4, ceil(K/2)], zero padded (once, at prepare)."""
    o, k = w.shape
    if w.size and (int(w.min()) < -(1 << 15) or int(w.max()) >= 1 << 15):
        raise ValueError("int8 GEMM weights must fit in int16")
    w16 = np.zeros((-(-o // MR) * MR, 2 * -(-k // 2)), np.int16)
    w16[:o, :k] = w
    return w16.view(np.int32)


def packed_shape(k: int, p: int):
    """The int32 scratch [ceil(K/2), P16] holding a [K, P] activation matrix as int16 pairs."""
    return (-(-k // 2), -(-p // NR) * NR)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def pack_rows(x, xp):
    """x int8 [K, P] (a 1x1 convolution's input, or im2col columns) -> xp int32 [ceil(K/2), P16]: the
    int16 pair (x[2i, p], x[2i + 1, p]) in xp[i, p] (low half first, as pmaddwd reads it)."""
    k_, p_ = x.shape
    for i in range(k_ // 2):
        r0, r1, dst = x[2 * i], x[2 * i + 1], xp[i]
        for p in range(p_):
            dst[p] = (np.int32(r0[p]) & 0xFFFF) | (np.int32(r1[p]) << 16)
    if k_ % 2:
        r0, dst = x[k_ - 1], xp[k_ // 2]
        for p in range(p_):
            dst[p] = np.int32(r0[p]) & 0xFFFF


@nb.njit(nogil=True, cache=True, boundscheck=False)
def pad_planes(x, zx, pt, pl, xpad):
    """xpad [C, Hp, Wp] = x [C, H, W] at (pt, pl), the border filled with zx (int8 with its zero point,
    or float32 with 0)."""
    c_, h, w = x.shape
    for c in range(c_):
        dst = xpad[c]
        for r in range(dst.shape[0]):
            row = dst[r]
            iy = r - pt
            if iy < 0 or iy >= h:
                for i in range(row.shape[0]):
                    row[i] = zx
                continue
            src, inner, right = x[c, iy], row[pl:], row[pl + w:]  # slices: a computed index (pl + i)
            for i in range(pl):  # kept the copy from vectorizing (1.7 ns an element on a 3x96x96 input)
                row[i] = zx
            for i in range(w):
                inner[i] = src[i]
            for i in range(right.shape[0]):
                right[i] = zx


def _pairs_intrinsic(stride: int):
    """An intrinsic storing 16 int16 pairs: xq[d + t] = (x[sa + t s] & 0xFFFF) | ((x[sb + t s] << 16) & keep)
    for t < 16 (s = stride, 1 or 2), as two vector loads (the even lanes of 32 bytes at stride 2)."""
    @intrinsic
    def pairs16(typingctx, flat, sa, sb, keep, xq, d):
        sig = types.void(flat, sa, sb, keep, xq, d)

        def codegen(context, builder, signature, args):
            fa, qa = (context.make_array(signature.args[k])(context, builder, args[k]) for k in (0, 4))
            i8, i32 = ir.IntType(8), ir.IntType(32)
            fptr, qptr = builder.bitcast(fa.data, i8.as_pointer()), builder.bitcast(qa.data, i32.as_pointer())
            wide, v16 = ir.VectorType(i8, NR * stride), ir.VectorType(i32, NR)
            lanes = []
            for off in (args[1], args[2]):
                v = builder.load(builder.bitcast(builder.gep(fptr, [off]), wide.as_pointer()), align=1)
                if stride > 1:
                    v = builder.shuffle_vector(v, ir.Constant(wide, ir.Undefined),
                                               ir.Constant(ir.VectorType(i32, NR), [t * stride for t in range(NR)]))
                lanes.append(builder.sext(v, v16))
            lo = builder.and_(lanes[0], ir.Constant(v16, [0xFFFF] * NR))
            keep = builder.shuffle_vector(builder.insert_element(ir.Constant(v16, ir.Undefined), args[3],
                                                                 ir.Constant(i32, 0)),
                                          ir.Constant(v16, ir.Undefined), ir.Constant(v16, None))
            hi = builder.and_(builder.shl(lanes[1], ir.Constant(v16, [16] * NR)), keep)
            builder.store(builder.or_(lo, hi), builder.bitcast(builder.gep(qptr, [args[5]]), v16.as_pointer()), align=4)
            return context.get_dummy_value()
        return sig, codegen
    return pairs16


_pairs16_s1, _pairs16_s2 = _pairs_intrinsic(1), _pairs_intrinsic(2)


def cols_slack(sw: int) -> int:
    """Bytes a padded image needs beyond its planes for im2col_pairs (whose runs of 16 read past a row)."""
    return 2 * NR * max(sw, 1)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def im2col_pairs(flat, c_, hp, wp, kh, kw, sh, sw, dh, dw, oh, ow, xq):
    """im2col and pack_rows in one pass: xq int32 flat, [ceil(K/2) + 1, P16] (one spare row), gets
    the int16 pairs of the im2col rows (2i, 2i + 1) of a padded image (pad_planes) held in flat int8
    [C Hp Wp + cols_slack(sw)]. At strides 1 and 2 each output row is written in vector runs of 16
    that run past its end: the next run (or the next row, or the spare row) overwrites them."""
    k_, taps = c_ * kh * kw, kh * kw
    p16 = xq.shape[0] // ((k_ + 1) // 2 + 1)
    for i2 in range((k_ + 1) // 2):
        ka = 2 * i2
        ca, ra = ka // taps, ka % taps
        offa = ca * hp * wp + (ra // kw) * dh * wp + (ra % kw) * dw
        kb = min(ka + 1, k_ - 1)
        cb, rb = kb // taps, kb % taps
        offb = cb * hp * wp + (rb // kw) * dh * wp + (rb % kw) * dw
        keep = np.int32(-1) if ka + 1 < k_ else np.int32(0)  # an odd K's last pair is (x, 0)
        row = i2 * p16
        for oy in range(oh):
            sa, sb, base = offa + oy * sh * wp, offb + oy * sh * wp, row + oy * ow
            if sw == 1:
                for s in range(0, ow, NR):
                    _pairs16_s1(flat, sa + s, sb + s, keep, xq, base + s)
            elif sw == 2:
                for s in range(0, ow, NR):
                    _pairs16_s2(flat, sa + 2 * s, sb + 2 * s, keep, xq, base + s)
            else:
                for ox in range(ow):
                    u = ox * sw
                    xq[base + ox] = (np.int32(flat[sa + u]) & 0xFFFF) | ((np.int32(flat[sb + u]) << 16) & keep)


def pair_weights(w: np.ndarray) -> np.ndarray:
    """Integer conv weights [O, C, kh, kw], C even -> [O, K] whose consecutive K pairs are channel
    pairs (2c, 2c + 1) at one tap, rows (c / 2, ky, kx): the order im2col_channel_pairs writes."""
    o, c, kh, kw = w.shape
    return np.ascontiguousarray(w.reshape(o, c // 2, 2, kh, kw).transpose(0, 1, 3, 4, 2)).reshape(o, -1)


def channel_pairs_elems(c: int, hp: int, wp: int) -> int:
    """int32 elements of pad_channel_pairs' output: [C / 2, Hp, Wp] and slack for 16-wide runs past it."""
    return (c // 2) * hp * wp + 2 * NR


@nb.njit(nogil=True, cache=True, boundscheck=False)
def pad_channel_pairs(x, zx, pt, pl, hp, wp, xc):
    """xc int32 flat [C / 2, Hp, Wp] (+ slack) = the int16 pairs (x[2c], x[2c + 1]) of x int8 [C, H, W]
    (C even) placed at (pt, pl) in planes bordered by zx: one pass over the input, once per call."""
    c_, h, w = x.shape
    border = (np.int32(zx) & 0xFFFF) | (np.int32(zx) << 16)
    plane = hp * wp
    for c2 in range(c_ // 2):
        base = c2 * plane
        for i in range(plane):
            xc[base + i] = border
        a, b = x[2 * c2], x[2 * c2 + 1]
        for iy in range(h):
            ra, rb, row = a[iy], b[iy], base + (iy + pt) * wp + pl
            dst = xc[row:row + w]
            for i in range(w):
                dst[i] = (np.int32(ra[i]) & 0xFFFF) | (np.int32(rb[i]) << 16)


def _copy_intrinsic(stride: int):
    """An intrinsic copying 16 int32: dst[d + t] = src[s + t stride] for t < 16 (stride 1 or 2)."""
    @intrinsic
    def copy16(typingctx, src, s, dst, d):
        sig = types.void(src, s, dst, d)

        def codegen(context, builder, signature, args):
            sa, da = (context.make_array(signature.args[k])(context, builder, args[k]) for k in (0, 2))
            i32 = ir.IntType(32)
            sptr, dptr = builder.bitcast(sa.data, i32.as_pointer()), builder.bitcast(da.data, i32.as_pointer())
            wide = ir.VectorType(i32, NR * stride)
            v = builder.load(builder.bitcast(builder.gep(sptr, [args[1]]), wide.as_pointer()), align=4)
            if stride > 1:
                v = builder.shuffle_vector(v, ir.Constant(wide, ir.Undefined),
                                           ir.Constant(ir.VectorType(i32, NR), [t * stride for t in range(NR)]))
            builder.store(v, builder.bitcast(builder.gep(dptr, [args[3]]), ir.VectorType(i32, NR).as_pointer()),
                          align=4)
            return context.get_dummy_value()
        return sig, codegen
    return copy16


_copy16_s1, _copy16_s2 = _copy_intrinsic(1), _copy_intrinsic(2)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def im2col_channel_pairs(xc, c2n, hp, wp, kh, kw, sh, sw, dh, dw, oh, ow, xq):
    """im2col over pad_channel_pairs' planes: xq int32 flat [C/2 kh kw + 1, P16] (one spare row),
    row (c2, ky, kx) holding the channel pairs under that tap for every output. The pairs are built
    once per call, so each row is a copy of int32 runs (16 wide, past a row's end: the next run or
    the spare row overwrites them)."""
    taps = kh * kw
    p16 = xq.shape[0] // (c2n * taps + 1)
    for c2 in range(c2n):
        for t in range(taps):
            src0, row = c2 * hp * wp + (t // kw) * dh * wp + (t % kw) * dw, (c2 * taps + t) * p16
            for oy in range(oh):
                sa, base = src0 + oy * sh * wp, row + oy * ow
                if sw == 1:
                    for s in range(0, ow, NR):
                        _copy16_s1(xc, sa + s, xq, base + s)
                elif sw == 2:
                    for s in range(0, ow, NR):
                        _copy16_s2(xc, sa + 2 * s, xq, base + s)
                else:
                    for ox in range(ow):
                        xq[base + ox] = xc[sa + ox * sw]


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemm_requantize_float(w32, x32, acc, mf, cf, flo, fhi, off, out, o_, p_, so, sp):
    """out[o so + p sp] (int8, flat) = rint(clamp(acc[o, p] mf[o] + cf[o], flo, fhi)) - off (0 or -1) for o < O, p < P,
    acc = w @ x in int32 (the packed operands), a block of 16 columns at a time through acc int32
    [Opad, 16]; exact when the caller's requantization says "float". (Flat indices: a row view per
    row and block cost more than the GEMM at K = 16.)"""
    kp, opad, ppad = w32.shape[1], w32.shape[0], x32.shape[1]
    a = acc.reshape(-1)
    full_o = o_ // MR * MR if sp == 1 else 0  # rows whose tiles requantize in registers
    six = full_o - MR * ((3 - (full_o % 6) // 2) % 3)  # 6-row tiles, then 0, 2 or 1 4-row tiles (full_o % 6: 0, 2, 4)
    for p0 in range(0, ppad, NR):
        n = min(NR, p_ - p0)
        if n == NR:
            if off == 0:  # the offset is the code's constant (_requantizing_tile)
                for o in range(0, six, 6):
                    _tile_requantize6(w32, x32, out, o, p0, kp, mf, cf, flo, fhi, so)
                for o in range(six, full_o, MR):
                    _tile_requantize(w32, x32, out, o, p0, kp, mf, cf, flo, fhi, so)
            else:
                for o in range(0, six, 6):
                    _tile_requantize6_odd(w32, x32, out, o, p0, kp, mf, cf, flo, fhi, so)
                for o in range(six, full_o, MR):
                    _tile_requantize_odd(w32, x32, out, o, p0, kp, mf, cf, flo, fhi, so)
        first = full_o if n == NR else 0
        for o in range(first - first % MR, opad, MR):
            if n > 8:
                _tile(w32, x32, acc, o, p0, kp)
            else:
                _tile8(w32, x32, acc, o, p0, kp)
        for o in range(first, o_):
            m, c, base, ob = mf[o], cf[o], o * NR, o * so + p0 * sp
            for i in range(n):
                t = np.float64(a[base + i]) * m + c
                out[ob + i * sp] = np.int8(np.int32(np.rint(min(max(t, flo), fhi))) - off)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemm_requantize_int(w32, x32, acc, q, c, s, zp, lo, hi, out, o_, p_, so, sp):
    """gemm_requantize_float's layout, requantized in int64:
    clamp(shift_round_even(acc q[o] + c[o], s[o], zp), lo, hi)."""
    kp, opad, ppad = w32.shape[1], w32.shape[0], x32.shape[1]
    a = acc.reshape(-1)
    for p0 in range(0, ppad, NR):
        n = min(NR, p_ - p0)
        for o in range(0, opad, MR):
            if n > 8:
                _tile(w32, x32, acc, o, p0, kp)
            else:
                _tile8(w32, x32, acc, o, p0, kp)
        for o in range(o_):
            qo, co, sh, base, ob = q[o], c[o], s[o], o * NR, o * so + p0 * sp
            for i in range(n):
                v = shift_round_even(np.int64(a[base + i]) * qo + co, sh, zp)
                out[ob + i * sp] = np.int8(min(max(v, lo), hi))


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemm_int32(w32, x32, acc, out):
    """out int32 [O, P] = the plain integer product of the packed operands (for tests and references)."""
    o_, p_ = out.shape
    kp, opad, ppad = w32.shape[1], w32.shape[0], x32.shape[1]
    for p0 in range(0, ppad, NR):
        n = min(NR, p_ - p0)
        for o in range(0, opad, MR):
            if n > 8:
                _tile(w32, x32, acc, o, p0, kp)
            else:
                _tile8(w32, x32, acc, o, p0, kp)
        for o in range(o_):
            for i in range(n):
                out[o, p0 + i] = acc[o, i]


@nb.njit(nogil=True, cache=True, boundscheck=False)
def _dot(wr, a):
    s = np.int32(0)  # one reduction per loop: LLVM vectorizes it into pmaddwd (several per loop do not)
    for k in range(a.shape[0]):
        s = np.int32(s + np.int32(wr[k]) * np.int32(a[k]))
    return s


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemv_requantize_float(w, a, mf, cf, flo, fhi, off, out):
    """A dense layer of a few rows: out[m, n] = rint(clamp(dot(w[n], a[m]) * mf[n] + cf[n], flo, fhi)) - off;
    w int8 or int16 [N, K] (rows contiguous), a int8 [M, K]. Each weight row is read once per row
    of a (a matrix-vector product streams the weights: no packing, no padded columns)."""
    for m in range(a.shape[0]):
        am, om = a[m], out[m]
        for n in range(w.shape[0]):
            t = np.float64(_dot(w[n], am)) * mf[n] + cf[n]
            om[n] = np.int8(np.int32(np.rint(min(max(t, flo), fhi))) - off)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gemv_requantize_int(w, a, q, c, s, zp, lo, hi, out):
    """gemv_requantize_float's product, requantized in int64 (Requantizer's definition)."""
    for m in range(a.shape[0]):
        am, om = a[m], out[m]
        for n in range(w.shape[0]):
            v = shift_round_even(np.int64(_dot(w[n], am)) * q[n] + c[n], s[n], zp)
            om[n] = np.int8(min(max(v, lo), hi))


# ---- one call per convolution: numba's dispatch costs about 0.1-0.15 us an argument, and a layer's
# three passes took three calls of 7-13 arguments (about 5 us); geometry travels in one int64 array
# (GEO_FIELDS), the float clamp bounds in one float64 array [flo, fhi]
GEO_FIELDS = ("zx", "pt", "pl", "hp", "wp", "c", "kh", "kw", "sh", "sw", "dh", "dw", "oh", "ow", "o", "p", "off")


@nb.njit(nogil=True, cache=True, boundscheck=False)
def conv_channel_pairs_float(x, xc, xq, w32, acc, mf, cf, out, geo, fl):
    """pad_channel_pairs, im2col_channel_pairs and gemm_requantize_float in one call: x int8 [C, H, W],
    xc / xq their scratch, out int8 flat [O P]; geo int64 as GEO_FIELDS."""
    zx, pt, pl, hp, wp, c_, kh, kw, sh, sw, dh, dw, oh, ow, o_, p_, off = (geo[0], geo[1], geo[2], geo[3], geo[4],
                                                                        geo[5], geo[6], geo[7], geo[8], geo[9],
                                                                        geo[10], geo[11], geo[12], geo[13], geo[14],
                                                                        geo[15], geo[16])
    pad_channel_pairs(x, np.int8(zx), pt, pl, hp, wp, xc)
    im2col_channel_pairs(xc, c_ // 2, hp, wp, kh, kw, sh, sw, dh, dw, oh, ow, xq)
    kp = w32.shape[1]
    xp = xq[:kp * (xq.shape[0] // (kp + 1))].reshape(kp, -1)
    gemm_requantize_float(w32, xp, acc, mf, cf, fl[0], fl[1], np.int32(off), out, o_, p_, p_, 1)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def conv_tap_pairs_float(x, flat, xq, w32, acc, mf, cf, out, geo, fl):
    """pad_planes, im2col_pairs and gemm_requantize_float in one call (conv_channel_pairs_float's
    operands; flat: the padded planes' int8 scratch with cols_slack)."""
    zx, pt, pl, hp, wp, c_, kh, kw, sh, sw, dh, dw, oh, ow, o_, p_, off = (geo[0], geo[1], geo[2], geo[3], geo[4],
                                                                        geo[5], geo[6], geo[7], geo[8], geo[9],
                                                                        geo[10], geo[11], geo[12], geo[13], geo[14],
                                                                        geo[15], geo[16])
    pad_planes(x, np.int8(zx), pt, pl, flat[:c_ * hp * wp].reshape(c_, hp, wp))
    im2col_pairs(flat, c_, hp, wp, kh, kw, sh, sw, dh, dw, oh, ow, xq)
    kp = w32.shape[1]
    xp = xq[:kp * (xq.shape[0] // (kp + 1))].reshape(kp, -1)
    gemm_requantize_float(w32, xp, acc, mf, cf, fl[0], fl[1], np.int32(off), out, o_, p_, p_, 1)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def conv_pointwise_float(x2, xp, w32, acc, mf, cf, out, geo, fl):
    """pack_rows and gemm_requantize_float in one call: x2 int8 [C, P], xp its packed scratch."""
    pack_rows(x2, xp)
    gemm_requantize_float(w32, xp, acc, mf, cf, fl[0], fl[1], np.int32(geo[16]), out, geo[14], geo[15], geo[15], 1)
