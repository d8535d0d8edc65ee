"""fp32 3x3 max pooling with channels blocked by 8, for the small planes of SqueezeNet and Inception.

jit/pool_windows.py pools one plane at a time; on planes of 8 to 48 columns its loops are a few
vectors long and its per-row overheads dominate (Inception's 3x3/s2 pool of 224x16x16: 64 us in the
plan, onnxruntime's blocked-layout pool 11). Here 8 channels are moved into one padded [Hp, Wp, 8]
block by the 8x8 transposes of jit.depthwise_blocked (the padding -inf), each output pixel of the 8
channels is the maximum of nine <8 x float> vectors, and the result moves back the same way.
The maximum keeps numpy's NaN rule: a window holding a NaN gives NaN (np.maximum, tap by tap).
"""
from __future__ import annotations

import numba as nb  # this module is imported only when a compiled kernel first runs
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .depthwise_blocked import CB, _pack_block, _unpack_block, _vec_ptr

_OPTS = dict(nogil=True, cache=True, boundscheck=False)


@intrinsic
def _plane_max3x3(typingctx, pb, ob, wp, sh, sw, oh, ow):
    """ob[(oy ow + ox) 8 : +8] = the maximum over taps (ky, kx) < 3 of pb[((oy sh + ky) wp + ox sw + kx)
    8 : +8] for every output pixel: pb the padded block [Hp * Wp * 8], ob [OH * OW * 8], float32."""
    sig = types.void(pb, ob, wp, sh, sw, oh, ow)

    def codegen(context, builder, signature, args):
        f32, i64 = ir.FloatType(), ir.IntType(64)
        v8 = ir.VectorType(f32, CB)
        pa, oa = (context.make_array(t)(context, builder, v) for t, v in zip(signature.args[:2], args[:2]))
        pptr, optr = (builder.bitcast(a.data, f32.as_pointer()) for a in (pa, oa))
        wp_, sh_, sw_, oh_, ow_ = args[2:]
        c8 = ir.Constant(i64, CB)
        row8, col8 = builder.mul(wp_, c8), builder.mul(sw_, c8)

        def vmax(a, b):  # NaN in either gives NaN: ordered a > b picks a, then a NaN a wins
            m = builder.select(builder.fcmp_ordered(">", a, b), a, b)
            return builder.select(builder.fcmp_unordered("uno", a, a), a, m)
        with cgutils.for_range(builder, oh_) as oy:
            top = builder.mul(builder.mul(oy.index, sh_), row8)
            obase = builder.mul(builder.mul(oy.index, ow_), c8)
            with cgutils.for_range(builder, ow_) as ox:
                p = builder.add(top, builder.mul(ox.index, col8))
                acc = None
                for ky in range(3):
                    for kx in range(3):
                        off = builder.add(p, builder.add(builder.mul(ir.Constant(i64, ky), row8), ir.Constant(i64, CB * kx)))
                        x = builder.load(_vec_ptr(builder, pptr, off, v8), align=4)
                        acc = x if acc is None else vmax(acc, x)
                builder.store(acc, _vec_ptr(builder, optr, builder.add(obase, builder.mul(ox.index, c8)), v8), align=4)
        return context.get_dummy_value()
    return sig, codegen


@nb.njit(**_OPTS)
def max_pool_blocked(x, pt, pl, wp, sh, sw, out, pb, ob):
    """out [R, OH, OW] = the 3x3 max pool of x [R, H, W] (float32) at strides (sh, sw), padded with -inf
    by pt rows above and pl columns left (the rest of the padding follows from the block's size):
    pb the padded block [Hp * Wp * 8], ob [OH * OW * 8] (float32 scratch; contents do not matter).
    R need not be a multiple of 8: a last short block moves element by element."""
    rows, h, wd = x.shape
    oh, ow = out.shape[1], out.shape[2]
    hw, ohw = h * wd, oh * ow
    xf, of = x.reshape(rows * hw), out.reshape(rows * ohw)
    pb[:] = -np.inf  # the border; blocks rewrite only the interior
    zero = np.float32(0)
    for r0 in range(0, rows, CB):
        nc = min(CB, rows - r0)
        _pack_block(xf, zero, r0, nc, hw, wd, pb, wp, pt, pl)
        _plane_max3x3(pb, ob, wp, sh, sw, oh, ow)
        _unpack_block(ob, nc, of, r0, ohw, False, zero, np.int32(0))


def blocked_scratch_elems(hp: int, wp: int, oh: int, ow: int) -> int:
    """float32 elements of scratch max_pool_blocked needs: the padded block and the output block."""
    return (hp * wp + oh * ow) * CB
