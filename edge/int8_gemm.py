"""int8 convolutions (groups 1) and dense layers on the compiled integer GEMM (jit.gemm_int8).

The int8 kernels in int8_kernels.py run float GEMMs on exact integers: they buy size, not speed.
Where the host has the integer GEMM (x86 AVX2, numba importable, ISTHMUS_JIT not 0) these kernels
take over at prepare time: weights become int16 pairs once; per call the input is packed into
arena scratch (a 1x1 convolution's rows, or, in one pass, im2col columns of the input padded with
its zero point), multiplied in int32 and requantized per output channel inside the GEMM's loop,
straight into the int8 output. The arithmetic is edge/quant.Requantizer's integer definition (ties
to even), bit for bit (computed in float64 where `float_exact` proves it exact, else in int64), so
results equal the float-GEMM kernels' and a plain integer numpy reference.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Tuple

import numpy as np

from .arena import aligned_copy
from .compiled import use_compiled
from .format import EdgeModelError
from .opcontext import OpContext, Window
from .quant import quantize_multiplier, split_zero_point

_F64, _F32 = 1 << 53, 1 << 24


class NotExact(EdgeModelError):
    """The integer GEMM's requantization could overflow int64 here: the caller keeps its own path
    (raised before any scratch is asked for)."""
_I64 = 1 << 62


def ready() -> bool:
    """Whether kernels prepared now take the integer GEMM (imports numba: call at prepare only)."""
    if not use_compiled():
        return False
    from ..jit.gemm_int8 import supported  # deferred: jit.gemm_int8 loads llvmlite, numba
    return supported()


def requantization(multipliers: np.ndarray, bias: np.ndarray, zp: int, lo: int, hi: int, bound: int):
    """("float", mf, cf, flo, fhi, off) or ("int", q, c, s, zp, lo, hi): per output channel, the constants of
    out = clamp(rne((acc q + c) 2^-s), lo, hi), c = bias q + zp 2^s, ties to the even value less zp
    (Requantizer's definition; jit.requantize.shift_round_even). float: t = acc mf + cf with
    mf = q 2^-s, cf = bias q 2^-s + even (split_zero_point), out = rint(clamp(t, flo, fhi)) - off,
    flo = lo - odd, fhi = hi - odd, off = -odd; exact when every value is a multiple of 2^-e (e = s
    less q's trailing zeros, at least 1) below 2^53 in those units, so t is computed without rounding
    and rint (ties to even, the offset even keeping the parity) is the definition's rounding; mf, cf
    are float32 when even 2^24 bounds them (the GEMM then requantizes in float32). bound: max |acc|."""
    ms = np.broadcast_to(np.asarray(multipliers, np.float64), bias.shape)
    qs = [quantize_multiplier(float(m)) for m in ms]
    q = np.array([v for v, _ in qs], np.int64)
    s = np.array([v for _, v in qs], np.int64)
    c = [int(b) * int(qv) + (int(zp) << int(sv)) for b, qv, sv in zip(bias, q, s)]
    even, odd = split_zero_point(zp)
    if any(bound * int(qv) + abs(cv) + (1 << int(sv)) >= _I64 for qv, cv, sv in zip(q, c, s)):
        raise NotExact("int8 GEMM: the requantization could overflow int64")
    exact, exact32 = True, True
    mf, cf = np.empty(len(q)), np.empty(len(q))
    for i, (qv, sv, bv) in enumerate(zip(q.tolist(), s.tolist(), bias.tolist())):
        tz = (qv & -qv).bit_length() - 1
        e = max(sv - tz, 1)
        units = (bound + abs(int(bv))) * (qv >> tz) * (1 << (e - (sv - tz))) + ((abs(zp) + 130) << e)
        exact, exact32 = exact and units < _F64, exact32 and units < _F32 and sv - tz < 126
        mf[i] = math.ldexp(qv, -sv)
        cf[i] = math.ldexp(float(int(bv) * qv), -sv) + even
    flo, fhi, off = float(lo - odd), float(hi - odd), np.int32(-odd)
    if exact32:  # the same arithmetic in float32, every value exact there too (the quantizer's short scales)
        mf32, cf32 = mf.astype(np.float32), cf.astype(np.float32)
        if np.array_equal(mf32, mf) and np.array_equal(cf32, cf):
            return "float", mf32, cf32, flo, fhi, off
    if exact:
        return "float", mf, cf, flo, fhi, off
    return "int", q, np.array(c, np.int64), s, np.int64(zp), int(lo), int(hi)


def _bind_gemm(w32: np.ndarray, rq, xp: np.ndarray, acc: np.ndarray, out: np.ndarray, o: int, p: int, so: int,
               sp: int) -> Callable[[], None]:
    """The GEMM and its requantization into out (the int8 output's flat buffer): element (o, p) at o so + p sp."""
    # deferred: jit.gemm_int8 loads llvmlite, numba
    from ..jit.gemm_int8 import gemm_requantize_float, gemm_requantize_int
    if rq[0] == "float":
        _, mf, cf, flo, fhi, off = rq
        return lambda: gemm_requantize_float(w32, xp, acc, mf, cf, flo, fhi, off, out, o, p, so, sp)
    _, q, c, s, zp, lo, hi = rq
    return lambda: gemm_requantize_int(w32, xp, acc, q, c, s, zp, lo, hi, out, o, p, so, sp)


def _fused(rq, g: Window, zx: int, c: int, hp: int, wp: int):
    """(geo, fl) for jit.gemm_int8's one-call convolutions when the requantization is in float, else None."""
    if rq[0] != "float":
        return None
    from ..jit.gemm_int8 import GEO_FIELDS  # deferred: jit.gemm_int8 loads llvmlite, numba
    _, mf, cf, flo, fhi, off = rq
    vals = dict(zx=zx, pt=g.t, pl=g.l, hp=hp, wp=wp, c=c, kh=g.kh, kw=g.kw, sh=g.sh, sw=g.sw, dh=g.dh, dw=g.dw,
                oh=g.oh, ow=g.ow, o=g.o, p=g.oh * g.ow, off=int(off))
    return np.array([vals[f] for f in GEO_FIELDS], np.int64), np.array([flo, fhi], np.float64)


def conv(ctx: OpContext, g: Window, wi: np.ndarray, bias: np.ndarray, multipliers, zx: int, zy: int,
         lo: int, hi: int, bound: int) -> Tuple[list, Callable]:
    """A groups-1 int8 convolution of one image: wi int64 [O, C, kh, kw] (less its zero points),
    bias int64 [O] (the input's zero point folded in), multipliers s_x s_w / s_y per channel."""
    # deferred: jit.gemm_int8 loads llvmlite, numba
    from ..jit.gemm_int8 import NR, cols_slack, pack_weights, packed_shape, pair_weights
    o, k = wi.shape[0], int(np.prod(wi.shape[1:]))
    p = g.oh * g.ow
    rq = requantization(multipliers, bias, zy, lo, hi, bound)
    pointwise = g.kh == g.kw == 1 and (g.sh, g.sw) == (1, 1) and not g.padded
    if not pointwise and g.c % 2 == 0:
        return _conv_channel_pairs(ctx, g, aligned_copy(pack_weights(pair_weights(wi))), rq, zx)
    w32 = aligned_copy(pack_weights(wi.reshape(o, k)))
    kp, p16 = packed_shape(k, p)
    i_x = ctx.scratch((kp + (0 if pointwise else 1), p16), np.int32)  # im2col_pairs writes past the last row
    i_acc = ctx.scratch((w32.shape[0], NR), np.int32)
    hp, wp = g.h + g.t + g.b, g.w + g.l + g.r
    planes = g.c * hp * wp  # the input with its border of zero points, and slack for vector reads past it
    i_pad = None if pointwise else ctx.scratch((planes + cols_slack(g.sw),), np.int8)
    fused = _fused(rq, g, zx, g.c, hp, wp)

    def bind(ins, outs, sc):
        # deferred: jit.gemm_int8 loads llvmlite, numba
        from ..jit.gemm_int8 import conv_pointwise_float, conv_tap_pairs_float, im2col_pairs, pack_rows, pad_planes
        xq = sc[i_x]
        xp = xq[:kp]
        if fused is not None:
            geo, fl, mf, cf, y1 = *fused, rq[1], rq[2], outs[0].reshape(-1)
            if pointwise:
                x2 = ins[0].reshape(g.c, g.h * g.w)
                return lambda: conv_pointwise_float(x2, xp, w32, sc[i_acc], mf, cf, y1, geo, fl)
            x3, flat, xq1 = ins[0].reshape(g.c, g.h, g.w), sc[i_pad], xq.reshape(-1)
            return lambda: conv_tap_pairs_float(x3, flat, xq1, w32, sc[i_acc], mf, cf, y1, geo, fl)
        gemm = _bind_gemm(w32, rq, xp, sc[i_acc], outs[0].reshape(-1), o, p, p, 1)
        if pointwise:
            x2 = ins[0].reshape(g.c, g.h * g.w)

            def run_pointwise():
                pack_rows(x2, xp)
                gemm()
            return run_pointwise
        x3, flat, zx8 = ins[0].reshape(g.c, g.h, g.w), sc[i_pad], np.int8(zx)
        xpad, xq1 = flat[:planes].reshape(g.c, hp, wp), xq.reshape(-1)
        geo = (g.c, hp, wp, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.oh, g.ow)

        def run():
            pad_planes(x3, zx8, g.t, g.l, xpad)
            im2col_pairs(flat, *geo, xq1)
            gemm()
        return run
    return [(1, o, g.oh, g.ow)], bind


def _conv_channel_pairs(ctx: OpContext, g: Window, w32: np.ndarray, rq, zx: int) -> Tuple[list, Callable]:
    """A windowed convolution over an even number of channels: the input becomes int16 channel pairs
    in padded planes once per call (jit.gemm_int8.pad_channel_pairs), so im2col only copies int32 runs
    (the taps' pairs of the other path are built anew for every tap); weights from pair_weights."""
    from ..jit.gemm_int8 import NR, channel_pairs_elems, packed_shape  # deferred: loads llvmlite, numba
    o, p, c2n = g.o, g.oh * g.ow, g.c // 2
    hp, wp = g.h + g.t + g.b, g.w + g.l + g.r
    kp, p16 = packed_shape(g.c * g.kh * g.kw, p)
    i_x = ctx.scratch((kp + 1, p16), np.int32)  # im2col_channel_pairs writes past the last row
    i_acc = ctx.scratch((w32.shape[0], NR), np.int32)
    i_c = ctx.scratch((channel_pairs_elems(g.c, hp, wp),), np.int32)

    fused = _fused(rq, g, zx, g.c, hp, wp)

    def bind(ins, outs, sc):
        # deferred: jit.gemm_int8 loads llvmlite, numba
        from ..jit.gemm_int8 import conv_channel_pairs_float, im2col_channel_pairs, pad_channel_pairs
        xq, xc, x3, zx8 = sc[i_x], sc[i_c], ins[0].reshape(g.c, g.h, g.w), np.int8(zx)
        if fused is not None:
            geo, fl, mf, cf, y1, xq1 = *fused, rq[1], rq[2], outs[0].reshape(-1), xq.reshape(-1)
            return lambda: conv_channel_pairs_float(x3, xc, xq1, w32, sc[i_acc], mf, cf, y1, geo, fl)
        gemm = _bind_gemm(w32, rq, xq[:kp], sc[i_acc], outs[0].reshape(-1), o, p, p, 1)
        geo, xq1 = (c2n, hp, wp, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.oh, g.ow), xq.reshape(-1)

        def run():
            pad_channel_pairs(x3, zx8, g.t, g.l, hp, wp, xc)
            im2col_channel_pairs(xc, *geo, xq1)
            gemm()
        return run
    return [(1, o, g.oh, g.ow)], bind


GEMV_ROWS = 4  # dense layers with fewer rows than this stream their weights through dot products


def dense(ctx: OpContext, bi: np.ndarray, bias: np.ndarray, multipliers, zy: int, lo: int, hi: int, bound: int,
          m: int, transpose_a: bool) -> Tuple[list, Callable]:
    """y [M, N] = requantize(a [M, K] @ b): bi int64 [K, N] (less its zero points), bias int64 [N] (the
    input's zero point folded in). A few rows: dot products against each weight row (jit.gemm_int8's
    gemv); more: the GEMM y^T = b^T a^T, output channels as its rows."""
    from ..jit.gemm_int8 import NR, pack_weights, packed_shape  # deferred: jit.gemm_int8 loads llvmlite, numba
    k, nn = bi.shape
    rq = requantization(multipliers, bias, zy, lo, hi, bound)
    if m < GEMV_ROWS and not transpose_a:
        if bi.size and (bi.min() < -128 or bi.max() > 127):  # int16 weights: numba's one-row dot products
            wt = np.ascontiguousarray(bi.T.astype(np.int16))
            return [(m, nn)], lambda ins, outs, sc: _bind_gemv(wt, rq, ins[0], outs[0])
        # deferred: jit.gemv_int8 loads llvmlite, numba
        from ..jit.gemv_int8 import activation_elems, interleave, pack_weights as pack_rows8, signable
        w8 = pack_rows8(bi.T)
        sign = signable(w8)  # no -128: the sign loop (|a| times w sign(a) in pmaddubsw)
        w8 = aligned_copy(interleave(w8) if sign else w8)
        i_a = ctx.scratch((activation_elems(k),), np.int16)
        return [(m, nn)], lambda ins, outs, sc: _bind_gemv8(w8, rq, ins[0], sc[i_a], outs[0], sign)
    w32 = aligned_copy(pack_weights(np.ascontiguousarray(bi.T)))
    i_x = ctx.scratch(packed_shape(k, m), np.int32)
    i_acc = ctx.scratch((w32.shape[0], NR), np.int32)

    def bind(ins, outs, sc):
        from ..jit.gemm_int8 import pack_rows  # deferred: jit.gemm_int8 loads llvmlite, numba
        xp = sc[i_x]
        a_t = ins[0] if transpose_a else ins[0].T  # [K, M]
        gemm = _bind_gemm(w32, rq, xp, sc[i_acc], outs[0].reshape(-1), nn, m, 1, nn)  # y^T: channel n, row m

        def run():
            pack_rows(a_t, xp)
            gemm()
        return run
    return [(m, nn)], bind


def _bind_gemv(w: np.ndarray, rq, a: np.ndarray, out: np.ndarray) -> Callable[[], None]:
    # deferred: jit.gemm_int8 loads llvmlite, numba
    from ..jit.gemm_int8 import gemv_requantize_float, gemv_requantize_int
    if rq[0] == "float":
        _, mf, cf, flo, fhi, off = rq
        return lambda: gemv_requantize_float(w, a, mf, cf, flo, fhi, off, out)
    _, q, c, s, zp, lo, hi = rq
    return lambda: gemv_requantize_int(w, a, q, c, s, zp, lo, hi, out)


def _bind_gemv8(w8: np.ndarray, rq, a: np.ndarray, a16: np.ndarray, out: np.ndarray, sign: bool) -> Callable[[], None]:
    """jit.gemv_int8: four int8 weight rows per step against the row of a widened once to int16 (a16),
    or, `sign`, against |a| and a's signs in a16's bytes (the sign loop)."""
    # deferred: jit.gemv_int8 loads llvmlite, numba
    from ..jit.gemv_int8 import (gemv_requantize_float, gemv_requantize_int, gemv_sign_requantize_float,
                                 gemv_sign_requantize_int)
    if sign:
        ab = a16.view(np.uint8)
        if rq[0] == "float":
            _, mf, cf, flo, fhi, off = rq
            return lambda: gemv_sign_requantize_float(w8, a, ab, mf, cf, flo, fhi, off, out)
        _, q, c, s, zp, lo, hi = rq
        return lambda: gemv_sign_requantize_int(w8, a, ab, q, c, s, zp, lo, hi, out)
    if rq[0] == "float":
        _, mf, cf, flo, fhi, off = rq
        return lambda: gemv_requantize_float(w8, a, a16, mf, cf, flo, fhi, off, out)
    _, q, c, s, zp, lo, hi = rq
    return lambda: gemv_requantize_int(w8, a, a16, q, c, s, zp, lo, hi, out)
