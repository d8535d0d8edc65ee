"""int8 kernels with integer semantics: conv, depthwise conv, dense/matmul, pooling.

Conventions the quantizer writes and these kernels check:
- activations are int8, per-tensor (scale, zero point);
- conv weights are constant int8 [O, I/groups, kh, kw], per-channel along axis 0 (or per-tensor);
  MatMul weights are constant int8 [K, N] (axis 1) or [N, K] with transpose_b (axis 0); a MatMul
  of two activations takes per-tensor parameters for both;
- biases are int32 with scale s_x * s_w[c] and zero point 0;
- a fused activation (none, relu, relu6) is a clamp in the output's quantized domain.

Accumulators are exact integers: (x - zx) and (w - zw) are held as float32 (float64 when a bound
on the partial sums reaches 2^24, see quant.exact_dtype), so each GEMM runs at BLAS speed. A conv
whose channels' scales differ by powers of two (quantize_to_edge's default) requantizes with one
multiplier for the whole tensor (quant.UniformRequantizer: the powers of two and the bias ride in
the float32 weights, every pass is a scalar streaming loop); when that multiplier is short (the
quantizer's 4-bit activation scales) it rides in the weights too and the requantization is float32
alone: a clamp, a rounding add and a narrowing cast, what the fp32 path does for its bias and
activation. Otherwise the requantization is
quant.Requantizer (fixed point, one rounding, per channel; computed in float64 where that is exact),
or, where fold_pays says it is cheaper, part of a float64 GEMM (quant.fold_requantization).
Windowed convolutions gather their columns as contiguous runs (opcontext.WideIm2col), as the fp32
kernels do. Elementwise int8 kernels are in int8_elementwise.py.

Where the time goes (MobileNetV2-96, batch 1, one BLAS thread, CPU time paired with fp32): with
free scales the requantization's float64 passes (per-channel vectors, a widening copy, multiply,
add, clamp, cast) make int8 1.32x fp32; with pow2 channel scales (scalar passes) 1.16x; with short
multipliers (float32 only: float32 cannot hold acc * q for a 31-bit q, but can for a 4-bit one)
1.02x. The rest is the int8 -> float32 copy of each GEMM operand, the residual Adds (float64, nine
passes) and the input's Quantize. Measured and dropped: a float64 GEMM with
the requantization folded in at K <= 32, the requantization by L2-sized blocks of rows (with or
without the GEMM), a float32 x float64 multiply instead of the copy, the residual Add as a 65,536
entry table, and a float32 handoff between a conv and the 1x1 conv reading it (no int8 copies).

With the compiled kernels (edge/compiled.py, isthmus.jit) the numbers above change: depthwise
convs run jit.depthwise_int8 (the short requantization fused into its loop), and at batch 1 every
requantization after a GEMM is one compiled loop (so folding it into a float64 GEMM no longer pays,
and a short pointwise conv adds its bias there instead of in a K + 1 GEMM): MobileNetV2-96 int8
runs at 1.13-1.2x the (also compiled) fp32 path, free scales 1.35x, where numpy alone gave about 1.0x
and 1.3x of a fp32 path twice as slow.

prepare(ctx) returns (output shapes, bind); bind(inputs, outputs, scratch) returns a step taking
no arguments that writes its outputs in place.
"""
from __future__ import annotations

import math
from typing import List

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .compiled import (bind_channel_requantization, bind_int8_rows, bind_requantize_rows, blocked_depthwise,
                       depthwise_scratch_elems, exact_int8_bias, use_compiled)
from . import int8_gemm
from .format import EdgeModelError
from .kernel_tables import INT8_KERNELS, int8_kernel
from .opcontext import OpContext, WideIm2col, conv_geometry, overlay, pool_geometry
from .quant import (F64_EXACT, MAGIC32, Requantizer, UniformRequantizer, activation_bounds, bind_folded_output, exact_dtype,
                    fold_requantization, int8_range, shared_mantissa)



def _borders(a: np.ndarray, t: int, b: int, l: int, r: int) -> List[np.ndarray]:
    """The padding strips of a [..., Hp, Wp] array around its interior."""
    hp, wp = a.shape[-2:]
    views = [a[..., :t, :], a[..., hp - b:, :], a[..., t:hp - b, :l], a[..., t:hp - b, wp - r:]]
    return [v for v, n in zip(views, (t, b, l, r)) if n]


def _bias(ctx: OpContext, o: int, sx: float, sw: np.ndarray):
    if len(ctx.inputs) < 3:
        return None
    bt = ctx.inputs[2]
    ctx.dtype(bt, "int32")
    b = ctx.constant(bt)
    if b.shape != (o,):
        raise EdgeModelError(f"{ctx.op}: bias '{bt.name}' has shape {b.shape}, expected ({o},)")
    if len(bt.scale):
        want = sx * sw
        got = np.broadcast_to(bt.scale.astype(np.float64), want.shape)
        if np.any(np.abs(got - want) > 1e-4 * want) or np.any(bt.zero_point != 0):
            raise EdgeModelError(f"{ctx.op}: bias '{bt.name}' must have scale s_x * s_w and zero point 0")
    return b.astype(np.int64)


DEPTHWISE_FOLD = False  # depthwise: float64 einsum with the requantization folded in (see conv)


def fold_pays(k: int, outputs: int, columns: int = 0) -> bool:
    """Whether a GEMM with k products per output, `outputs` outputs and `columns` im2col elements
    (0: it reads its input in place) should fold its requantization in (quant.fold_requantization).
    Folding makes the GEMM float64, about 0.04 ns more per product here, and its im2col copy
    about 0.5 ns more per element; it saves the float requantization's three extra passes (about
    1.2 ns per output) and three numpy calls (about 1 us each). Fitted on this machine kind to
    MobileNetV2-96's layers, one BLAS thread (CPU time): folding wins at K = 16 and 24 there, and
    loses at K = 27 (the stem, an im2col), 32 (into 16 channels) and beyond."""
    return 0.04 * k * outputs + 0.5 * columns < 1.2 * outputs + 3000.0


def _uniform(multipliers, zy: int, lo: int, hi: int, wi: np.ndarray, bias: np.ndarray):
    """(UniformRequantizer, per-channel weight factors 2^-e_c, GEMM bound) when the channels'
    multipliers share one mantissa (quant.shared_mantissa) and the arithmetic stays exact; else None.
    The bias rides in the GEMM (a row of ones), so its bound counts it."""
    sm = shared_mantissa(multipliers)
    o = wi.shape[0]
    if sm is None:
        return None
    q, s, e = sm
    e = np.broadcast_to(e, (o,))
    bounds = 128 * np.abs(wi).reshape(o, -1).sum(axis=1) + np.abs(np.broadcast_to(bias, (o,)))
    if int(bounds.max()) >= F64_EXACT:
        return None
    try:
        rq = UniformRequantizer(q, s, e, zy, lo, hi, bounds)
    except EdgeModelError:
        return None
    return rq, np.ldexp(1.0, -e), int(bounds.max())


@int8_kernel("Conv2D", "FusedConv2D")
def conv(ctx: OpContext):
    ctx.arity(2, 3)
    x, w, y = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    ctx.dtype(x, "int8"), ctx.dtype(w, "int8"), ctx.dtype(y, "int8")
    g = conv_geometry(ctx, x, w)
    n, c, h, wd, o, cg, kh, kw, sh, sw_ = g.n, g.c, g.h, g.w, g.o, g.cg, g.kh, g.kw, g.sh, g.sw
    groups, oh, ow = g.groups, g.oh, g.ow
    sx, zx = ctx.per_tensor(x)
    sy, zy = ctx.per_tensor(y)
    sw, zw = ctx.per_channel(w, 0)
    wi = ctx.constant(w).astype(np.int64) - zw.reshape(o, 1, 1, 1)
    wsum = wi.reshape(o, -1).sum(axis=1)
    # the GEMM runs on raw x (|x| <= 128); the input zero point folds into the bias, and padding
    # holds zx itself, so every tap contributes (x - zx) * w as the integer definition says
    bound = 128 * int(np.abs(wi).reshape(o, -1).sum(axis=1).max())
    ft = exact_dtype(bound)
    bias = _bias(ctx, o, sx, sw)
    bias = (0 if bias is None else bias) - zx * wsum
    lo, hi = activation_bounds(ctx.choice("activation", "none", ("none", "relu", "relu6")), sy, zy)
    depthwise = groups == c and cg == 1 and o == c
    if groups == 1 and n == 1 and x.data is None and int8_gemm.ready():  # the integer GEMM (int8_gemm.py)
        try:
            return int8_gemm.conv(ctx, g, wi, bias, sx * sw / sy, zx, zy, lo, hi, bound)
        except int8_gemm.NotExact:  # its int64 requantization could overflow: the float-GEMM path below
            pass
    kk = kh * kw
    og, kg = o // groups, cg * kk
    # a 1x1 depthwise conv (a scale per channel) takes the depthwise path: the einsum needs its columns
    pointwise = kk == 1 and (sh, sw_) == (1, 1) and not g.padded and not depthwise
    # columns with contiguous rows (opcontext.WideIm2col): the taps in wide.order
    wide = None if pointwise else WideIm2col(g, compact=not depthwise)
    wk = wi.reshape(o, cg, kk) if pointwise else wi.reshape(o, cg, kk)[:, :, wide.order]
    # one float64 GEMM doing the requantization too when that is exact and K is small
    # (quant.fold_requantization), else an exact float32 (or float64) GEMM then the fixed-point
    # Requantizer
    folded, uni = None, _uniform(sx * sw / sy, zy, lo, hi, wi, bias) if depthwise or groups == 1 else None
    brow = None
    if uni is not None and uni[0].short and exact_dtype(uni[2]) == np.float32:
        # the multiplier in the weights too, and eps_c in the bias (quant.UniformRequantizer.short)
        bias = bias * (uni[1] * uni[0].m) + uni[0].eps
        uni = (uni[0], uni[1] * uni[0].m, uni[2])
        bias_scaled = True
    else:
        bias_scaled = False
    if uni is not None and depthwise:  # the bias added to the einsum's result: measured cheaper than a tap of ones
        uni, scaled, bound = uni
        ft, extra = exact_dtype(bound), 0
        wg = [np.ascontiguousarray((wk.reshape(o, -1) * scaled[:, None]).astype(ft))]
        brow = (bias if bias_scaled else bias * scaled).astype(ft).reshape(o, 1)
    elif uni is not None:  # one multiplier for all channels: powers of two and the bias in the weights
        uni, scaled, bound = uni
        ft, extra = exact_dtype(bound), 1
        wg = [np.ascontiguousarray(np.concatenate([wk.reshape(o, -1) * scaled[:, None],
                                                   (bias if bias_scaled else bias * scaled)[:, None]],
                                                  axis=1).astype(ft))]
    elif depthwise and DEPTHWISE_FOLD:
        folded = fold_requantization(wk.reshape(c, kk), sx * sw / sy, bias, zy, bound)
    elif groups == 1 and not (n == 1 and use_compiled()) and fold_pays(kg, o * n * oh * ow, 0 if pointwise else kg * n * wide.L):
        # (at batch 1 the requantization after the GEMM is one compiled pass, about 0.2 ns per output
        # where fold_pays counts numpy's 1.2: folding into a float64 GEMM no longer pays)
        folded = fold_requantization(wk.reshape(o, -1), sx * sw / sy, bias, zy, bound)
    if uni is not None:
        pass
    elif folded is not None:
        ft, extra, wg = np.dtype(np.float64), 1, [folded]
    else:
        rq = Requantizer(sx * sw / sy, zy, lo, hi, bound, bias, (o, 1, 1, 1))
        extra = 0
        wg = [np.ascontiguousarray(wk.reshape(c, kk).astype(ft))] if depthwise else \
            [np.ascontiguousarray(wk[k * og:(k + 1) * og].reshape(og, kg).astype(ft)) for k in range(groups)]
    # pointwise at batch 1 with the short requantization: the bias joins the compiled requantization
    # pass instead of riding in the GEMM against a row of ones (K + 1 slowed BLAS: 126 -> 148 us at
    # K = 16 into 96 x 2304). Exact either way: the GEMM's partial sums without the bias are within
    # the same bound, and adding it last gives the same representable sum.
    pw_bias = None
    if pointwise and uni is not None and bias_scaled and ft == np.float32 and n == 1 and use_compiled():
        pw_bias, wg, extra = wg[0][:, -1].copy(), [np.ascontiguousarray(wg[0][:, :-1])], 0
    # depthwise on the compiled kernel (edge/compiled.py) where its float arithmetic is exact: the
    # einsum's accumulator bit for bit (exact_int8_bias), so the same requantization follows
    cbias = wnat = None
    if depthwise and folded is None and x.data is None and use_compiled():
        wnat = np.empty_like(wg[0])
        wnat[:, wide.order] = wg[0]  # back to the kernel's own tap order
        cbias = exact_int8_bias(wnat, brow, zx, int8_range(zx), ft)
    # the requantization's 8-byte temporary: int64 or float64 of the output's shape; the uniform
    # requantizer works on the whole contiguous accumulator (a wide layout's junk columns included)
    s_tmp = ((o, n * oh * ow) if pointwise else (o, n * wide.L), np.float64) if uni is not None else \
        ((o, n, oh, ow), np.int64)
    # at batch 1 the uniform requantization is one compiled pass (compiled.accumulator_rows): no temporary
    rq_compiled = uni is not None and n == 1 and use_compiled()
    if rq_compiled:
        s_tmp = ((1,), np.float64)  # a placeholder: quant.UniformRequantizer.bind refuses it for numpy passes
    # the short requantization (float32) runs inside the compiled kernel: no scratch at all
    fused = cbias is not None and uni is not None and bias_scaled and ft == np.float32
    # the compiled depthwise works in one padded plane of arena scratch (in the weights' dtype)
    # 3x3 in float32: 8 channels at a time (jit.depthwise_blocked), the same exact sums
    blocked = cbias is not None and ft == np.float32 and blocked_depthwise(g, kh, kw)
    i_dw = ctx.scratch((depthwise_scratch_elems(g, kh, kw, blocked),), ft) if cbias is not None else None
    if cbias is not None:
        if not fused:  # the accumulator, then the requantization's temporary
            if uni is not None and not rq_compiled:
                s_tmp = ((n, c, oh, ow), np.float64)
            s_acc = ((n, c, oh, ow), ft)
            i_a, i_b = ctx.scratch(*s_tmp), ctx.scratch(*s_acc)
    elif pointwise:  # the input itself (channels first) is the GEMM's operand
        s_pad, s_acc = ((c + extra, n, h, wd), ft), ((o, n * h * wd), ft)
        i_a, i_b = ctx.shared_scratch(s_pad, s_tmp), ctx.scratch(*s_acc)
    else:  # lifetimes inside the op: phases -> columns -> (GEMM) accumulator -> int64 temporary
        p = n * wide.L
        # depthwise columns [C, kh*kw (+ a row of ones), P]; GEMM columns [C*kh*kw (+ ones), P]
        s_cols = ((c, kk + extra, p) if depthwise else (c * kk + extra, p), ft)
        # the phases hold the input's own int8 bytes where measured faster (the gather then casts):
        # depthwise (MobileNetV2-96 whole model, CPU time, paired with fp32: 1.19 -> 1.14 with the
        # bias row above), strided sweeps and small images; a float copy first otherwise
        small = not wide.compact and (depthwise or sh * sw_ > 1 or oh * ow <= 64)
        s_pad, s_acc = (wide.phase_shape, np.int8 if small else ft), ((o, p), ft)
        i_a, i_b = ctx.shared_scratch(s_pad, s_acc), ctx.shared_scratch(s_cols, s_tmp)

    def bind(ins, outs, sc):
        y4 = outs[0].transpose(1, 0, 2, 3)
        if cbias is not None:
            x3, w3 = ins[0].reshape(n * c, h, wd), wnat.reshape(c, kh, kw)
            if fused:
                return bind_int8_rows(x3, zx, w3, cbias, g, float(uni.lo - uni.zp), float(uni.hi - uni.zp),
                                      outq3=outs[0].reshape(n * c, oh, ow), zy=uni.zp, scratch=sc[i_dw],
                                      blocked=blocked)
            acc, tmp = sc[i_b], sc[i_a]
            step = bind_int8_rows(x3, zx, w3, cbias, g, -math.inf, math.inf, outf3=acc.reshape(n * c, oh, ow),
                                  scratch=sc[i_dw], blocked=blocked)
            if uni is not None:
                finish = uni.bind(acc, None if ft == np.float64 else tmp, lambda a: a.reshape(n, c, oh, ow),
                                  outs[0], bias_scaled)
            else:
                finish = _channel_finish(rq, acc.transpose(1, 0, 2, 3), y4, tmp)
            return _compiled_step(step, finish)
        if pointwise:
            xpad = overlay(sc[i_a], *s_pad)
            acc, tmp = sc[i_b], overlay(sc[i_a], *s_tmp)
            cols, acc4 = xpad.reshape(c + extra, n * h * wd), sc[i_b].reshape(o, n, oh, ow)
            inner, xin, ones = xpad[:c], ins[0].transpose(1, 0, 2, 3), xpad[c:]
            copyto = np.copyto

            def gather():
                copyto(inner, xin)
        else:
            acc, tmp = overlay(sc[i_a], *s_acc), overlay(sc[i_b], *s_tmp)
            cols = overlay(sc[i_b], *s_cols)
            taps, ones = (cols[:, :kk], cols[:, kk:]) if depthwise else (cols[:c * kk], cols[c * kk:])
            fill = np.dtype(s_pad[1]).type(zx)
            gather = wide.bind(ins[0], overlay(sc[i_a], *s_pad), taps.reshape(wide.cols_shape), fill)
            acc4 = wide.out_view(acc)
        ones = ones if extra else None
        if pw_bias is not None:
            finish = bind_requantize_rows(acc.reshape(o, oh * ow), pw_bias, uni.lo - uni.zp, uni.hi - uni.zp,
                                          MAGIC32 + uni.zp, outs[0].reshape(o, oh * ow))
        elif uni is not None:
            view = (lambda a: a.reshape(o, n, oh, ow)) if pointwise else wide.out_view
            finish = uni.bind(acc, None if ft == np.float64 else tmp, view, y4, bias_scaled)
        else:
            finish = bind_folded_output(acc4, y4, lo, hi) if extra else _channel_finish(rq, acc4, y4, tmp)
        if depthwise:  # per-channel 1 x kh*kw products: einsum, not thousands of tiny BLAS calls
            wc, einsum, add = wg[0].reshape(c, kk + extra), np.einsum, np.add

            def run_depthwise():
                gather()
                if ones is not None:
                    ones.fill(1.0)
                einsum("ck,ckp->cp", wc, cols, out=acc)
                if brow is not None:
                    add(acc, brow, out=acc)
                finish()
            return run_depthwise
        gemms = [(wg[k], cols[k * kg:(k + 1) * kg + extra], acc[k * og:(k + 1) * og]) for k in range(groups)]
        matmul = np.matmul

        def run():
            gather()
            if ones is not None:
                ones.fill(1.0)
            for wm, cm, am in gemms:
                matmul(wm, cm, out=am)
            finish()
        return run
    return [(n, o, oh, ow)], bind


def _channel_finish(rq, acc4, y4, tmp):
    """The per-channel requantization: one compiled pass at batch 1 where it can, else numpy's."""
    return bind_channel_requantization(rq, acc4, y4) or rq.bind(acc4, y4, tmp)


def _compiled_step(step, finish):
    def run():
        step()
        finish()
    return run


@int8_kernel("MatMul", "FusedMatMul")
def matmul(ctx: OpContext):
    ctx.arity(2, 3)
    a, bt, y = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    ctx.dtype(a, "int8"), ctx.dtype(bt, "int8"), ctx.dtype(y, "int8")
    if len(a.shape) < 2 or len(bt.shape) < 2:
        raise EdgeModelError(f"{ctx.op}: operands must have rank >= 2, got {a.shape} and {bt.shape}")
    ta, tb = ctx.one_int("transpose_a", 0, 0, 1), ctx.one_int("transpose_b", 0, 0, 1)
    m, k = (a.shape[-1], a.shape[-2]) if ta else a.shape[-2:]
    k2, nn = (bt.shape[-1], bt.shape[-2]) if tb else bt.shape[-2:]
    if k != k2:
        raise EdgeModelError(f"{ctx.op}: inner dimensions differ: {a.shape} x {bt.shape} (transpose {ta}, {tb})")
    try:
        batch = np.broadcast_shapes(a.shape[:-2], bt.shape[:-2])
    except ValueError:
        raise EdgeModelError(f"{ctx.op}: batch dimensions of {a.shape} and {bt.shape} do not broadcast") from None
    sa, za = ctx.per_tensor(a)
    sy, zy = ctx.per_tensor(y)
    lo, hi = activation_bounds(ctx.choice("activation", "none", ("none", "relu", "relu6")), sy, zy)
    a_shape = a.shape[:-2] + (m, k)
    out_shape = tuple(batch) + (m, nn)
    if bt.data is not None and len(bt.shape) == 2:
        sb, zb = ctx.per_channel(bt, 0 if tb else 1)
        bi = bt.data.astype(np.int64)
        bi = (bi.T if tb else bi) - zb.reshape(1, nn)  # [K, N]
        bound = 128 * int(np.abs(bi).sum(axis=0).max())  # raw a; za folds into the bias
        ft = exact_dtype(bound)
        const_b, b_shape, fold = np.ascontiguousarray(bi.astype(ft)), None, -za * bi.sum(axis=0)
    else:
        sb1, zb1 = ctx.per_tensor(bt)
        sb, zb = np.full(nn, sb1), np.full(nn, zb1)
        bound = int8_range(za) * int8_range(zb1) * k
        ft = exact_dtype(bound)
        const_b, b_shape, fold = None, bt.shape[:-2] + (k, nn), 0
    bias = _bias(ctx, nn, sa, sb)
    bias = (0 if bias is None else bias) + fold
    if const_b is not None and not batch and int8_gemm.ready():  # the integer GEMM (int8_gemm.py)
        try:
            return int8_gemm.dense(ctx, bi, np.broadcast_to(bias, (nn,)).astype(np.int64), sa * sb / sy, zy, lo, hi,
                                   bound, m, bool(ta))
        except int8_gemm.NotExact:
            pass
    folded = None
    if const_b is not None and fold_pays(k, math.prod(out_shape)):  # one float64 GEMM when exact (see conv)
        folded = fold_requantization(bi.T, sa * sb / sy, bias, zy, bound)
    if folded is not None:
        ft, const_b, extra = np.dtype(np.float64), np.ascontiguousarray(folded.T), 1
    else:
        rq, extra = Requantizer(sa * sb / sy, zy, lo, hi, bound, bias, (nn,)), 0
    s_a, s_tmp = (a_shape[:-1] + (k + extra,), ft), (out_shape, np.int64)  # the operand is dead when requantizing
    i_a, i_acc = ctx.shared_scratch(s_a, s_tmp), ctx.scratch(out_shape, ft)
    i_b = None if b_shape is None else ctx.scratch(b_shape, ft)

    def bind(ins, outs, sc):
        af, acc, tmp = overlay(sc[i_a], *s_a), sc[i_acc], overlay(sc[i_a], *s_tmp)
        a_in, ones = af[..., :k], (af[..., k:] if extra else None)
        ain = ins[0].swapaxes(-1, -2) if ta else ins[0]
        bin_ = None if i_b is None else (ins[1].swapaxes(-1, -2) if tb else ins[1])
        bf = const_b if i_b is None else sc[i_b]
        zaf, zbf = ft.type(za), ft.type(zb[0])
        finish = bind_folded_output(acc, outs[0], lo, hi) if extra else rq.bind(acc, outs[0], tmp)
        copyto, subtract, matmul = np.copyto, np.subtract, np.matmul

        def run():
            copyto(a_in, ain)
            if ones is not None:
                ones.fill(1.0)
            if bin_ is not None:
                subtract(af, zaf, out=af)
                copyto(bf, bin_)
                subtract(bf, zbf, out=bf)
            matmul(af, bf, out=acc)
            finish()
        return run
    return [out_shape], bind


def _pool_geometry(ctx: OpContext):
    ctx.arity(1, 1)
    x, y = ctx.inputs[0], ctx.outputs[0]
    ctx.dtype(x, "int8"), ctx.dtype(y, "int8")
    g = pool_geometry(ctx, x)
    if ctx.per_tensor(x) != ctx.per_tensor(y):
        raise EdgeModelError(f"{ctx.op}: int8 pooling keeps its input's scale and zero point; "
                             f"'{y.name}' has different ones")
    taps = [(slice(None), slice(None), slice(i, i + g.sh * (g.oh - 1) + 1, g.sh),
             slice(j, j + g.sw * (g.ow - 1) + 1, g.sw)) for i in range(g.kh) for j in range(g.kw)]
    return (g.n, g.c, g.h, g.w, g.t, g.b, g.l, g.r, g.oh, g.ow), taps, (g.kh, g.kw, g.sh, g.sw)


@int8_kernel("MaxPool")
def max_pool(ctx: OpContext):
    (n, c, h, w, t, b, l, r, oh, ow), taps, (kh, kw, sh, sw) = _pool_geometry(ctx)
    padded = bool(t or b or l or r)
    i_pad = ctx.scratch((n, c, h + t + b, w + l + r), np.int8) if padded else None

    # 2x2 at stride 2: one compiled pass (jit.pool) instead of numpy's pass per tap
    compiled = (kh, kw, sh, sw) == (2, 2, 2, 2) and use_compiled()

    def bind(ins, outs, sc):
        src, y = (sc[i_pad] if padded else ins[0]), outs[0]
        borders = _borders(src, t, b, l, r) if padded else []
        inner, x = src[:, :, t:t + h, l:l + w], ins[0]
        views = [src[tp] for tp in taps]
        first, rest = views[0], views[1:]
        copyto, maximum = np.copyto, np.maximum

        def pad():
            for v in borders:
                v.fill(-128)
            copyto(inner, x)
        if compiled:
            from ..jit.pool import max_pool_2x2_rows  # deferred: jit.pool loads numba
            src3, y3 = src.reshape(n * c, *src.shape[2:]), y.reshape(n * c, oh, ow)

            def run_compiled():
                if padded:
                    pad()
                max_pool_2x2_rows(src3, y3)
            return run_compiled

        def run():
            if padded:
                pad()
            copyto(y, first)
            for v in rest:
                maximum(y, v, out=y)
        return run
    return [(n, c, oh, ow)], bind


@int8_kernel("AvgPool")
def avg_pool(ctx: OpContext):
    """Sums raw int8 values over the real (unpadded) elements of each window, then rounds
    sum / count half up: floor((2 * sum + count) / (2 * count))."""
    (n, c, h, w, t, b, l, r, oh, ow), taps, _ = _pool_geometry(ctx)
    ones = np.zeros((1, 1, h + t + b, w + l + r), np.int32)
    ones[:, :, t:t + h, l:l + w] = 1
    count = sum(ones[tp] for tp in taps)
    cnt = np.int32(count.flat[0]) if np.all(count == count.flat[0]) else count
    cnt2 = cnt * 2
    i_pad, i_acc = ctx.scratch((n, c, h + t + b, w + l + r), np.int32), ctx.scratch((n, c, oh, ow), np.int32)

    def bind(ins, outs, sc):
        src, acc, x, y = sc[i_pad], sc[i_acc], ins[0], outs[0]
        borders, inner = _borders(src, t, b, l, r), src[:, :, t:t + h, l:l + w]
        views = [src[tp] for tp in taps]
        first, rest = views[0], views[1:]
        copyto, add, multiply, floor_divide = np.copyto, np.add, np.multiply, np.floor_divide

        def run():
            for v in borders:
                v.fill(0)
            copyto(inner, x)
            copyto(acc, first)
            for v in rest:
                add(acc, v, out=acc)
            multiply(acc, 2, out=acc)
            add(acc, cnt, out=acc)
            floor_divide(acc, cnt2, out=acc)
            copyto(y, acc, casting="unsafe")
        return run
    return [(n, c, oh, ow)], bind


@int8_kernel("GlobalAvgPool")
def global_avg_pool(ctx: OpContext):
    """y = requantize(sum(x - zx) over H*W) with multiplier s_x / (s_y * H * W)."""
    ctx.arity(1, 1)
    x, y = ctx.inputs[0], ctx.outputs[0]
    ctx.rank(x, 4), ctx.dtype(x, "int8"), ctx.dtype(y, "int8")
    n, c, h, w = x.shape
    keep = ctx.one_int("keepdims", 0, 0, 1)
    sx, zx = ctx.per_tensor(x)
    sy, zy = ctx.per_tensor(y)
    hw = h * w
    rq = Requantizer(sx / (sy * hw), zy, -128, 127, 128 * hw, [-hw * zx])
    compiled = use_compiled()  # one compiled pass (jit.requantize.sum_requantize_rows): about 8 numpy calls less
    if not compiled:
        i_wide, i_acc = ctx.scratch((n, c, hw), np.int64), ctx.scratch((n, c), np.int64)

    def bind(ins, outs, sc):
        if compiled:
            from ..jit.requantize import sum_requantize_rows  # deferred: jit.requantize loads numba
            x2, y1 = np.ascontiguousarray(ins[0]).reshape(n * c, hw), outs[0].reshape(n * c)
            args = (np.int64(rq.q), np.int64(rq.c), np.int64(rq.s), np.int64(rq.lo), np.int64(rq.hi))
            return lambda: sum_requantize_rows(x2, *args, y1)
        wide, acc, x3 = sc[i_wide], sc[i_acc], ins[0].reshape(n, c, hw)
        requant, total, copyto = rq.bind(acc, outs[0].reshape(n, c), acc), np.sum, np.copyto

        def run():
            copyto(wide, x3)
            total(wide, axis=2, out=acc)
            requant()
        return run
    return [(n, c, 1, 1) if keep else (n, c)], bind


from . import int8_elementwise  # noqa: E402,F401  (registers the elementwise kernels)
from . import int8_convt, int8_shape  # noqa: E402,F401  (register the transposed conv, data-movement, activations)
