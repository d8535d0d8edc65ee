"""fp32 3x3 depthwise convolution with channels blocked by 8, for the small planes of a MobileNet.

jit/depthwise.py runs one plane at a time, vectorized along output columns; on planes of 6 to 24
columns those loops are shorter than a few AVX vectors and per-plane overheads dominate (a 6x6
plane: 36 outputs). Here 8 channels are done at once: their zero-padded planes are interleaved
into one [Hp, Wp, 8] block (channel innermost), so each output pixel of the 8 channels is one
<8 x float> vector: nine FMAs of a weight vector and an input vector, whatever the plane's size
or the stride. numba does not vectorize that (it cannot prove the block and the output apart, and
a trip count of 8 does not pay for runtime checks), so the pixel loops are written in LLVM IR (a
numba intrinsic) with the nine weight vectors, the bias and the clamp held in registers.

The channels move in and out of the block by 8x8 transposes (eight rows of 8 pixels, one per
channel, become 8 pixel vectors); a last block of fewer than 8 channels moves element by element
and computes its unused lanes on stale values that are never stored. The block's border is zeroed
once per call; each block rewrites only the interior.
"""
from __future__ import annotations

import numba as nb  # this module is imported only when a compiled kernel first runs
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

CB = 8  # channels per block: one AVX2 vector of float32

_RECIP_MAX_PIXELS = 1 << 24  # _pack8's division by a reciprocal is exact below this (rows under 8 pixels)
_OPTS = dict(nogil=True, cache=True, fastmath={"contract"}, boundscheck=False)


def _vec_ptr(builder, base, off, vt):
    return builder.bitcast(builder.gep(base, [off]), vt.as_pointer())


def _splat(builder, v, vt):
    i32 = ir.IntType(32)
    e = builder.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(i32, 0))
    return builder.shuffle_vector(e, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(i32, vt.count), None))


@intrinsic
def _plane3x3(typingctx, pb, wk, b, ob, wp, sh, sw, oh, ow, lo, hi):
    """ob[(oy ow + ox) 8 : +8] = clamp(b + sum over taps of wk[tap 8 : +8] * pb[((oy sh + ky) wp + ox sw + kx) 8 : +8],
    lo, hi) for every output pixel: pb the padded block [Hp * Wp * 8], wk [72] (tap-major), b [8],
    ob [OH * OW * 8], all float32. A NaN passes the clamp, as in numpy."""
    sig = types.void(pb, wk, b, ob, wp, sh, sw, oh, ow, lo, hi)

    def codegen(context, builder, signature, args):
        f32, i64 = ir.FloatType(), ir.IntType(64)
        v8 = ir.VectorType(f32, CB)
        pa, wa, ba, oa = (context.make_array(t)(context, builder, v) for t, v in zip(signature.args[:4], args[:4]))
        pptr, wptr, bptr, optr = (builder.bitcast(a.data, f32.as_pointer()) for a in (pa, wa, ba, oa))
        wp_, sh_, sw_, oh_, ow_, lo_, hi_ = args[4:]
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v8, v8, v8]), "llvm.fma.v8f32")
        c8 = ir.Constant(i64, CB)
        wts = [builder.load(_vec_ptr(builder, wptr, ir.Constant(i64, CB * t), v8), align=4) for t in range(9)]
        bias = builder.load(_vec_ptr(builder, bptr, ir.Constant(i64, 0), v8), align=4)
        lov, hiv = _splat(builder, lo_, v8), _splat(builder, hi_, v8)
        row8, col8 = builder.mul(wp_, c8), builder.mul(sw_, c8)
        with cgutils.for_range(builder, oh_) as oy:
            top = builder.mul(builder.mul(oy.index, sh_), row8)
            obase = builder.mul(builder.mul(oy.index, ow_), c8)
            with cgutils.for_range(builder, ow_) as ox:
                p = builder.add(top, builder.mul(ox.index, col8))
                acc = bias
                for ky in range(3):
                    for kx in range(3):
                        tap = builder.add(builder.mul(ir.Constant(i64, ky), row8), ir.Constant(i64, CB * kx))
                        off = builder.add(p, tap)
                        x = builder.load(_vec_ptr(builder, pptr, off, v8), align=4)
                        acc = builder.call(fma, [wts[3 * ky + kx], x, acc])
                # max then min by compare and select: a NaN compares false and passes
                acc = builder.select(builder.fcmp_ordered("<", acc, lov), lov, acc)
                acc = builder.select(builder.fcmp_ordered(">", acc, hiv), hiv, acc)
                builder.store(acc, _vec_ptr(builder, optr, builder.add(obase, builder.mul(ox.index, c8)), v8), align=4)
        return context.get_dummy_value()
    return sig, codegen


def _transpose8(builder, rows):
    """The 8x8 transpose of eight <8 x float> rows (unpack, then shuffles across the 128-bit lanes)."""
    i32 = ir.IntType(32)

    def shuf(a, b, idx):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, 8), idx))
    lo_, hi_ = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    t = []
    for k in range(0, 8, 2):
        t += [shuf(rows[k], rows[k + 1], lo_), shuf(rows[k], rows[k + 1], hi_)]
    # t[0] = a0 b0 a1 b1 | a4 b4 a5 b5 ; t[1] = a2 b2 a3 b3 | a6 b6 a7 b7 (a, b = rows 0, 1), etc.
    u = []
    pairs_lo, pairs_hi = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    for k in (0, 4):
        u += [shuf(t[k], t[k + 2], pairs_lo), shuf(t[k], t[k + 2], pairs_hi),
              shuf(t[k + 1], t[k + 3], pairs_lo), shuf(t[k + 1], t[k + 3], pairs_hi)]
    # u[0..3] = rows 0-3 of columns (0, 4), (1, 5), (2, 6), (3, 7); u[4..7] the same of rows 4-7
    out = []
    for j in range(4):
        out.append(shuf(u[j], u[j + 4], [0, 1, 2, 3, 8, 9, 10, 11]))
    for j in range(4):
        out.append(shuf(u[j], u[j + 4], [4, 5, 6, 7, 12, 13, 14, 15]))
    return out


@intrinsic
def _pack8(typingctx, src, s0, stride, dst, d0, n, zx, wd, gap):
    """dst[d0 + (i + (i // wd) gap) 8 + c] = src[s0 + c stride + i] - zx for c < 8, i < n rounded down
    to 8 (8x8 transposes): eight channel planes (float32, or int8 converted), flat, into interleaved
    float32 pixels of a block whose rows are wd pixels plus gap pixels of padding (a whole plane in
    one call: planes of 6 or 12 columns need no scalar tail per row). Returns the pixels done."""
    sig = types.int64(src, s0, stride, dst, d0, n, zx, wd, gap)

    def codegen(context, builder, signature, args):
        f32, i64 = ir.FloatType(), ir.IntType(64)
        v8 = ir.VectorType(f32, CB)
        narrow = signature.args[0].dtype == types.int8
        et = ir.IntType(8) if narrow else f32
        sa, da = (context.make_array(signature.args[k])(context, builder, args[k]) for k in (0, 3))
        sptr, dptr = builder.bitcast(sa.data, et.as_pointer()), builder.bitcast(da.data, f32.as_pointer())
        s0, stride, d0, n, wd, gap = args[1], args[2], args[4], args[5], args[7], args[8]
        zxv = _splat(builder, args[6], v8)

        def load(o):
            if not narrow:
                return builder.fsub(builder.load(_vec_ptr(builder, sptr, o, v8), align=4), zxv)
            raw = builder.load(_vec_ptr(builder, sptr, o, ir.VectorType(et, CB)), align=1)
            return builder.fsub(builder.sitofp(raw, v8), zxv)
        blocks = builder.sdiv(n, ir.Constant(i64, 8))

        def loop(rows_above):  # rows_above(i, j): the block row of pixel i + j
            with cgutils.for_range(builder, blocks) as blk:
                i = builder.mul(blk.index, ir.Constant(i64, 8))
                starts = [builder.add(builder.add(s0, builder.mul(ir.Constant(i64, c), stride)), i) for c in range(CB)]
                rows = [load(o) for o in starts]
                above = rows_above(i)
                for j, v in enumerate(_transpose8(builder, rows)):
                    px = builder.add(i, ir.Constant(i64, j))
                    px = builder.add(px, builder.mul(above(j), gap))  # skip the padding of the rows above
                    off = builder.add(d0, builder.mul(px, ir.Constant(i64, CB)))
                    builder.store(v, _vec_ptr(builder, dptr, off, v8), align=4)

        def wide(i):  # rows of 8 pixels or more: one division per 8 pixels, then at most one wrap
            q0 = builder.sdiv(i, wd)
            r0 = builder.sub(i, builder.mul(q0, wd))
            return lambda j: builder.add(q0, builder.zext(
                builder.icmp_signed(">=", builder.add(r0, ir.Constant(i64, j)), wd), i64))

        # rows shorter than 8 pixels: px // wd as (px m) >> 32, m = ceil(2^32 / wd), exact while
        # px wd^2 < 2^32 (planes far below 2^26 pixels; n is checked by the caller, _pack_block)
        recip = builder.sdiv(builder.add(ir.Constant(i64, 1 << 32), builder.sub(wd, ir.Constant(i64, 1))), wd)

        def narrow_rows(i):
            return lambda j: builder.lshr(builder.mul(builder.add(i, ir.Constant(i64, j)), recip), ir.Constant(i64, 32))
        with builder.if_else(builder.icmp_signed(">=", wd, ir.Constant(i64, CB))) as (then, otherwise):
            with then:
                loop(wide)
            with otherwise:
                loop(narrow_rows)
        return builder.mul(blocks, ir.Constant(i64, 8))
    return sig, codegen


@intrinsic
def _unpack8(typingctx, src, s0, dst, d0, stride, n, magic, base):
    """dst[d0 + c stride + i] = src[s0 + i 8 + c] for c < 8, i < n rounded down to 8: interleaved
    float32 pixels back into eight channel rows; an int8 dst gets int8(int32(v + magic) - base), the
    short requantization (magic = 1.5 2^23 + zero point rounds v to an integer). Returns the pixels done."""
    sig = types.int64(src, s0, dst, d0, stride, n, magic, base)

    def codegen(context, builder, signature, args):
        f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
        v8 = ir.VectorType(f32, CB)
        narrow = signature.args[2].dtype == types.int8
        sa, da = (context.make_array(signature.args[k])(context, builder, args[k]) for k in (0, 2))
        sptr = builder.bitcast(sa.data, f32.as_pointer())
        dptr = builder.bitcast(da.data, (ir.IntType(8) if narrow else f32).as_pointer())
        s0, d0, stride, n = args[1], args[3], args[4], args[5]
        magic, base = _splat(builder, args[6], v8), _splat(builder, args[7], ir.VectorType(i32, CB))

        def store(v, off):
            if not narrow:
                builder.store(v, _vec_ptr(builder, dptr, off, v8), align=4)
                return
            q = builder.sub(builder.fptosi(builder.fadd(v, magic), ir.VectorType(i32, CB)), base)
            q = builder.trunc(q, ir.VectorType(ir.IntType(8), CB))
            builder.store(q, _vec_ptr(builder, dptr, off, ir.VectorType(ir.IntType(8), CB)), align=1)
        blocks = builder.sdiv(n, ir.Constant(i64, 8))
        with cgutils.for_range(builder, blocks) as blk:
            i = builder.mul(blk.index, ir.Constant(i64, 8))
            starts = [builder.add(s0, builder.mul(builder.add(i, ir.Constant(i64, j)), ir.Constant(i64, CB)))
                      for j in range(8)]
            rows = [builder.load(_vec_ptr(builder, sptr, o, v8), align=4) for o in starts]
            for c, v in enumerate(_transpose8(builder, rows)):
                store(v, builder.add(builder.add(d0, builder.mul(ir.Constant(i64, c), stride)), i))
        return builder.mul(blocks, ir.Constant(i64, 8))
    return sig, codegen


@nb.njit(**_OPTS)
def _pack_block(xf, zx, r0, nc, hw, wd, pb, wp, pt, pl):
    """The interior of the padded block pb [Hp * Wp * 8] from rows r0..r0+nc of xf [R * H * W] (flat;
    float32, or int8 less its zero point zx): the whole plane through 8x8 transposes, only its last
    hw mod 8 pixels (or a last block of fewer than 8 channels) element by element."""
    s0, d0, gap = r0 * hw, (pt * wp + pl) * CB, wp - wd
    done = _pack8(xf, s0, hw, pb, d0, hw, zx, wd, gap) if nc == CB and hw < _RECIP_MAX_PIXELS else 0
    for c in range(nc):
        src, dst = xf[s0 + c * hw:], pb[d0 + c:]
        for i in range(done, hw):
            dst[(i + (i // wd) * gap) * CB] = np.float32(src[i]) - zx


@nb.njit(**_OPTS)
def _unpack_block(ob, nc, of, r0, ohw, quant, magic, base):
    """Rows r0..r0+nc of of [R * OH * OW] (flat) from the output block ob [OH * OW * 8] (float32 as
    is; int8 requantized as _unpack8 does)."""
    done = _unpack8(ob, 0, of, r0 * ohw, ohw, ohw, magic, base) if nc == CB else 0
    for c in range(nc):
        src, dst = ob[c:], of[(r0 + c) * ohw:]
        for i in range(done, ohw):
            if quant:
                dst[i] = np.int8(np.int32(src[i * CB] + magic) - base)
            else:
                dst[i] = src[i * CB]





@nb.njit(**_OPTS)
def blocked_rows(x, zx, c, wb, bb, pt, pl, wp, sh, sw, lo, hi, quant, magic, base, out, pb, ob):
    """out [R, OH, OW] = clamp(bias + 3x3 depthwise of (x [R, H, W] - zx), lo, hi), R = images x c
    channels: wb [ceil(c / 8), 72] the weights blocked (tap-major, 8 channels a tap), bb [ceil(c / 8),
    8] the bias, pb the padded block [Hp * Wp * 8], ob [OH * OW * 8] (float32 scratch; contents do
    not matter). x float32 (zx 0) or int8; quant: out is int8 = int8(int32(v + magic) - base), the
    short requantization of jit.depthwise_int8, else out is float32 = v."""
    rows, h, wd = x.shape
    oh, ow = out.shape[1], out.shape[2]
    hw, ohw = h * wd, oh * ow
    xf, of = x.reshape(rows * hw), out.reshape(rows * ohw)
    pb[:] = 0  # the border; blocks rewrite only the interior
    for n in range(rows // c):
        for blk in range(wb.shape[0]):
            r0 = n * c + blk * CB
            nc = min(CB, c - blk * CB)
            _pack_block(xf, zx, r0, nc, hw, wd, pb, wp, pt, pl)
            _plane3x3(pb, wb[blk], bb[blk], ob, wp, sh, sw, oh, ow, lo, hi)
            _unpack_block(ob, nc, of, r0, ohw, quant, magic, base)


def block_weights(w: np.ndarray, bias) -> tuple:
    """(wb [ceil(C / 8), 72], bb [ceil(C / 8), 8]) from w [C, 3, 3] and bias [C] (None: zeros),
    zero padded to whole blocks (once, at prepare)."""
    c = w.shape[0]
    nblk = -(-c // CB)
    wpad = np.zeros((nblk * CB, 9), np.float32)
    wpad[:c] = w.reshape(c, 9)
    bpad = np.zeros(nblk * CB, np.float32)
    if bias is not None:
        bpad[:c] = bias
    wb = np.ascontiguousarray(wpad.reshape(nblk, CB, 9).transpose(0, 2, 1).reshape(nblk, 9 * CB))
    return wb, bpad.reshape(nblk, CB)


def blocked_scratch_elems(hp: int, wp: int, oh: int, ow: int) -> int:
    """float32 elements of scratch blocked_rows needs: the padded block and the output block."""
    return (hp * wp + oh * ow) * CB
