"""fp32 kernels of the edge interpreter.

Each op's prepare(ctx) checks its tensors and attributes (opcontext.OpContext), works out the
output shapes, asks the arena for scratch (padded inputs, im2col columns) and returns
(output shapes, bind); bind(inputs, outputs, scratch) returns a step taking no arguments that
writes into the arena views with out= everywhere, allocating nothing per call.
"""
from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .compiled import (CLAMPS, bind_bias_clamp, bind_blocked, bind_im2col, bind_packed_gemm, bind_rows,
                       blocked_depthwise, depthwise_scratch_elems, packed_gemm, use_compiled)
from .format import EdgeModelError
from .kernel_tables import KERNELS, kernel
from .opcontext import OpContext, WideIm2col, clip_ufunc, conv_geometry, overlay, pool_geometry

ACTIVATIONS = ("none", "relu", "relu6", "tanh", "sigmoid")


def _act(name: str):
    """A function applying activation `name` in place (None for none)."""
    if name == "none":
        return None
    if name == "relu":
        return lambda y: np.maximum(y, 0, out=y)
    if name == "relu6":
        return lambda y: clip_ufunc(y, 0, 6, out=y)
    if name == "tanh":
        return lambda y: np.tanh(y, out=y)

    def sigmoid(y):  # 1 / (1 + e^-y) as 0.5 tanh(y / 2) + 0.5: no overflow, no temporary
        y *= 0.5
        np.tanh(y, out=y)
        y += 1
        y *= 0.5
    return sigmoid


def _windows(src, kh, kw, oh, ow, sh, sw, dh, dw):
    """View [N, C, kh, kw, OH, OW] of an NCHW array (no copy)."""
    n, c = src.shape[:2]
    s0, s1, s2, s3 = src.strides
    return as_strided(src, (n, c, kh, kw, oh, ow), (s0, s1, dh * s2, dw * s3, sh * s2, sw * s3), writeable=False)


def _borders(a, t, b, l, r):
    hp, wp = a.shape[-2:]
    views = [a[..., :t, :], a[..., hp - b:, :], a[..., t:hp - b, :l], a[..., t:hp - b, wp - r:]]
    return [v for v, k in zip(views, (t, b, l, r)) if k]


def _float_inputs(ctx: OpContext, lo: int, hi: int):
    ctx.arity(lo, hi)
    for t in ctx.inputs + ctx.outputs:
        ctx.dtype(t, "float32")


@kernel("Conv2D", "FusedConv2D")
def conv(ctx: OpContext):
    _float_inputs(ctx, 2, 3)
    g = conv_geometry(ctx, ctx.inputs[0], ctx.inputs[1])
    n, c, h, w, o, cg, kh, kw = g.n, g.c, g.h, g.w, g.o, g.cg, g.kh, g.kw
    t, b, l, r, oh, ow, groups = g.t, g.b, g.l, g.r, g.oh, g.ow, g.groups
    has_bias = len(ctx.inputs) == 3
    if has_bias and ctx.inputs[2].shape != (o,):
        raise EdgeModelError(f"{ctx.op}: bias has shape {ctx.inputs[2].shape}, expected ({o},)")
    act_name = ctx.choice("activation", "none", ACTIVATIONS)
    act = _act(act_name)
    depthwise = groups == c and cg == 1 and o == c
    pointwise = kh == kw == 1 and (g.sh, g.sw) == (1, 1) and not g.padded and groups == 1
    # depthwise on the compiled kernel (edge/compiled.py), decided here, once: its scratch is one
    # padded plane (per image and channel row, reused row after row)
    compiled = depthwise and ctx.inputs[0].data is None and use_compiled()
    # constant 3x3 weights (and bias): 8 channels at a time (jit.depthwise_blocked), blocked once
    blocked = compiled and blocked_depthwise(g, kh, kw) and ctx.inputs[1].data is not None and \
        (not has_bias or ctx.inputs[2].data is not None)
    i_dw = ctx.scratch((depthwise_scratch_elems(g, kh, kw, blocked),), np.float32) if compiled else None
    # a 1x1 conv's bias and none/relu/relu6 in one compiled pass after the GEMM (edge/compiled.py)
    fused_finish = pointwise and act_name in CLAMPS and (has_bias or act_name != "none") and use_compiled()
    # batch 1, constant weights: a GEMM with its weights packed once and the bias and clamp in its
    # epilogue (jit.gemm_f32), scratch for its last columns
    packed = pointwise and n == 1 and act_name in CLAMPS and (not has_bias or ctx.inputs[2].data is not None) \
        and packed_gemm(o, c, h * w, ctx.inputs[1].data is not None)
    og, kk, p = o // groups, kh * kw, oh * ow
    # columns as contiguous runs for depthwise (see opcontext); the classic layout for GEMMs
    wide = None if pointwise or compiled else WideIm2col(g, compact=not depthwise)
    # a GEMM convolution of one image: the product straight into the output (the columns' layout is
    # the output's), then bias and none/relu/relu6 in one compiled pass, as for 1x1 convs above
    gemm_direct = wide is not None and wide.compact and not depthwise and n == 1 and act_name in CLAMPS and \
        use_compiled()
    # and its GEMM on packed weights with the bias and clamp in the epilogue, as 1x1 convs above
    packed = packed or (gemm_direct and groups == 1 and (not has_bias or ctx.inputs[2].data is not None)
                        and packed_gemm(o, c * kk, p, ctx.inputs[1].data is not None))
    # the packed GEMM's last p % 16 columns go through a panel [K, 16] and a tile [O, 16]; a windowed
    # conv's share the phases' region (the padded image is dead once the columns are gathered)
    s_pt = (((c * kk + o) * 16 if p % 16 else 0,), np.float32)
    if packed and pointwise:
        i_pt = ctx.scratch(*s_pt)
    if wide is not None:
        s_pad, s_cols, s_acc = (wide.phase_shape, np.float32), ((c * kk, n * wide.L), np.float32), \
            ((o, n * wide.L), np.float32)
        # lifetimes inside the op: phases -> columns -> accumulator (or the packed GEMM's panel and tile)
        i_a, i_cols = ctx.shared_scratch(s_pad, s_acc, s_pt), ctx.scratch(*s_cols)
        i_pt = i_a
        # weights in the columns' tap order: permuted once when constant, per call into scratch otherwise
        wk = None if ctx.inputs[1].data is None else \
            np.ascontiguousarray(ctx.inputs[1].data.reshape(o, cg, kk)[:, :, wide.order])
        i_w = ctx.scratch((o, cg, kk), np.float32) if wk is None else None

    def bind(ins, outs, sc):
        x, wt, y = ins[0], ins[1], outs[0]
        bias = ins[2].reshape(1, o, 1, 1) if has_bias else None
        add, copyto, matmul, einsum = np.add, np.copyto, np.matmul, np.einsum

        def finish():
            if bias is not None:
                add(y, bias, out=y)
            if act is not None:
                act(y)
        if packed and pointwise:
            return bind_packed_gemm(wt.reshape(o, c), ins[2] if has_bias else None, x.reshape(c, p), y.reshape(o, p),
                                    *CLAMPS[act_name], *_panel_tile(sc[i_pt], c, o, p))
        if pointwise:  # a 1x1 convolution is a product over channels: no padding, no columns
            w2, x3, y3 = wt.reshape(o, c), x.reshape(n, c, h * w), y.reshape(n, o, p)
            if fused_finish:
                finish = bind_bias_clamp(y.reshape(n * o, p), ins[2] if has_bias else None, *CLAMPS[act_name])

            def run_pointwise():
                matmul(w2, x3, out=y3)
                finish()
            return run_pointwise
        if compiled:
            return _bind_compiled_depthwise(g, x, wt, ins[2] if has_bias else None, y, act_name, act, sc[i_dw],
                                            blocked)
        cols, acc = sc[i_cols], overlay(sc[i_a], *s_acc)
        if gemm_direct:  # one image: pad and gather in two compiled passes (the phases' region holds the padding)
            gather = bind_im2col(x.reshape(c, h, w), g, overlay(sc[i_a], (c, g.h + t + b, g.w + l + r), np.float32),
                                 cols.reshape(c * kk, p))
        else:
            gather = wide.bind(x, overlay(sc[i_a], *s_pad), cols.reshape(wide.cols_shape), 0.0)
        res, y4 = wide.out_view(acc), y.transpose(1, 0, 2, 3)
        b4 = None if bias is None else bias.reshape(o, 1, 1, 1)
        wperm = wk if wk is not None else sc[i_w]
        wsrc = None if wk is not None else wt.reshape(o, cg, kk)
        order, take = np.array(wide.order, np.intp), np.take

        def finish_wide():
            if b4 is not None:
                add(res, b4, out=y4)
            else:
                copyto(y4, res)
            if act is not None:
                act(y)
        if depthwise:
            # per-channel columns [C, kh*kw, N*OH*Ws] contracted with einsum: a single-threaded C
            # loop, twice as fast as a multiply-add per tap, and unlike BLAS on thousands of 1 x 9
            # products it does not stall when another process holds the cores
            wc, cols3 = wperm.reshape(c, kk), cols.reshape(c, kk, -1)

            def run_depthwise():
                if wsrc is not None:
                    take(wsrc, order, axis=2, out=wperm, mode="wrap")
                gather()
                einsum("ck,ckp->cp", wc, cols3, out=acc)
                finish_wide()
            return run_depthwise
        kg = cg * kk
        if packed:  # one image, compact columns [c kk, p], constant weights in the columns' tap order
            step = bind_packed_gemm(wk.reshape(o, kg), ins[2] if has_bias else None, cols.reshape(kg, p),
                                    y.reshape(o, p), *CLAMPS[act_name], *_panel_tile(sc[i_pt], kg, o, p))

            def run_packed():
                gather()
                step()
            return run_packed
        if gemm_direct:  # one image, compact columns: acc's layout is y's
            acc = y.reshape(o, p)
            finish_wide = bind_bias_clamp(acc, ins[2] if has_bias else None, *CLAMPS[act_name])
        gemms = [(wperm[k * og:(k + 1) * og].reshape(og, kg), cols[k * kg:(k + 1) * kg], acc[k * og:(k + 1) * og])
                 for k in range(groups)]

        def run_gemm():
            if wsrc is not None:
                take(wsrc, order, axis=2, out=wperm, mode="wrap")
            gather()
            for wm, cm, am in gemms:
                matmul(wm, cm, out=am)
            finish_wide()
        return run_gemm
    return [(n, o, oh, ow)], bind


def _panel_tile(raw, k: int, o: int, p: int):
    """The packed GEMM's panel [k, 16] and tile [o, 16] over raw scratch (empty when p % 16 == 0)."""
    if p % 16 == 0:
        return np.empty((0, 16), np.float32), np.empty((0, 16), np.float32)
    both = overlay(raw, ((k + o) * 16,), np.float32)
    return both[:k * 16].reshape(k, 16), both[k * 16:].reshape(o, 16)


def _bind_compiled_depthwise(g, x, wt, bias, y, act_name: str, act, scratch, blocked: bool):
    """y = act(depthwise(x, wt) + bias) in one compiled pass per (image, channel), or per 8 channels
    (blocked); relu and relu6 are the kernel's clamp, tanh and sigmoid a pass after it. Constant
    weights and bias (read-only views of the file) are copied once; arena views are used in place."""
    c, kh, kw = wt.shape[0], wt.shape[2], wt.shape[3]
    w3 = wt.reshape(c, kh, kw)
    w3 = w3 if w3.flags.writeable else w3.copy()
    b = np.zeros(c, np.float32) if bias is None else (bias if bias.flags.writeable else bias.copy())
    lo, hi = CLAMPS.get(act_name, CLAMPS["none"])
    bind = bind_blocked if blocked else bind_rows
    step = bind(x.reshape(-1, g.h, g.w), w3, b, g, lo, hi, y.reshape(-1, g.oh, g.ow), scratch)
    post = None if act_name in CLAMPS else act
    if post is None:
        return step

    def run():
        step()
        post(y)
    return run


@kernel("MatMul", "FusedMatMul")
def matmul(ctx: OpContext):
    _float_inputs(ctx, 2, 3)
    a, bt = ctx.inputs[0].shape, ctx.inputs[1].shape
    if len(a) < 2 or len(bt) < 2:
        raise EdgeModelError(f"{ctx.op}: operands must have rank >= 2, got {a} and {bt}")
    ta, tb = ctx.one_int("transpose_a", 0, 0, 1), ctx.one_int("transpose_b", 0, 0, 1)
    m, k = (a[-1], a[-2]) if ta else a[-2:]
    k2, nn = (bt[-1], bt[-2]) if tb else bt[-2:]
    if k != k2:
        raise EdgeModelError(f"{ctx.op}: inner dimensions differ: {a} x {bt} (transpose {ta}, {tb})")
    try:
        batch = tuple(np.broadcast_shapes(a[:-2], bt[:-2]))
    except ValueError:
        raise EdgeModelError(f"{ctx.op}: batch dimensions of {a} and {bt} do not broadcast") from None
    has_bias = len(ctx.inputs) == 3
    if has_bias and ctx.inputs[2].shape != (nn,):
        raise EdgeModelError(f"{ctx.op}: bias has shape {ctx.inputs[2].shape}, expected ({nn},)")
    act = _act(ctx.choice("activation", "none", ACTIVATIONS))

    def bind(ins, outs, sc):
        x = ins[0].swapaxes(-1, -2) if ta else ins[0]
        wm = ins[1].swapaxes(-1, -2) if tb else ins[1]
        y, bias, mm, add = outs[0], (ins[2] if has_bias else None), np.matmul, np.add

        def run():
            mm(x, wm, out=y)
            if bias is not None:
                add(y, bias, out=y)
            if act is not None:
                act(y)
        return run
    return [batch + (m, nn)], bind


@kernel("BiasAdd")
def bias_add(ctx: OpContext):
    _float_inputs(ctx, 2, 2)
    x, bias = ctx.inputs[0].shape, ctx.inputs[1].shape
    if not x:
        raise EdgeModelError("BiasAdd: x must have rank >= 1")
    axis = ctx.axis("axis", len(x), -1)
    if bias != (x[axis],):
        raise EdgeModelError(f"BiasAdd: bias {bias} does not match axis {axis} of {x}")
    view = (-1,) + (1,) * (len(x) - axis - 1)

    def bind(ins, outs, sc):
        xi, bi, y, add = ins[0], ins[1].reshape(view), outs[0], np.add
        return lambda: add(xi, bi, out=y)
    return [x], bind


def _binary(f):
    def prepare(ctx: OpContext):
        _float_inputs(ctx, 2, 2)
        try:
            out = tuple(np.broadcast_shapes(ctx.inputs[0].shape, ctx.inputs[1].shape))
        except ValueError:
            raise EdgeModelError(f"{ctx.op}: shapes {ctx.inputs[0].shape} and {ctx.inputs[1].shape} "
                                 "do not broadcast") from None

        def bind(ins, outs, sc):
            a, b, y = ins[0], ins[1], outs[0]
            return lambda: f(a, b, out=y)
        return [out], bind
    return prepare


for _name, _f in (("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply), ("Div", np.divide),
                  ("Maximum", np.maximum), ("Minimum", np.minimum)):
    KERNELS[_name] = _binary(_f)


def _unary(make):
    """make(x, y) -> a step computing y from x."""
    def prepare(ctx: OpContext):
        _float_inputs(ctx, 1, 1)
        return [ctx.inputs[0].shape], lambda ins, outs, sc: make(ins[0], outs[0])
    return prepare


KERNELS["Relu"] = _unary(lambda x, y: lambda: np.maximum(x, 0, out=y))
KERNELS["Relu6"] = _unary(lambda x, y: lambda: clip_ufunc(x, 0, 6, out=y))
KERNELS["Tanh"] = _unary(lambda x, y: lambda: np.tanh(x, out=y))
KERNELS["Identity"] = _unary(lambda x, y: lambda: np.copyto(y, x))


def _sigmoid_step(x, y):
    sig, copyto = _act("sigmoid"), np.copyto

    def run():
        copyto(y, x)
        sig(y)
    return run


KERNELS["Sigmoid"] = _unary(_sigmoid_step)


def _pool(kind: str):
    def prepare(ctx: OpContext):
        _float_inputs(ctx, 1, 1)
        g = pool_geometry(ctx, ctx.inputs[0])
        n, c, h, w, t, b, l, r, oh, ow = g.n, g.c, g.h, g.w, g.t, g.b, g.l, g.r, g.oh, g.ow
        taps = [(slice(None), slice(None), slice(i, i + g.sh * (oh - 1) + 1, g.sh),
                 slice(j, j + g.sw * (ow - 1) + 1, g.sw)) for i in range(g.kh) for j in range(g.kw)]
        scale = None
        if kind == "avg":  # divide by the real (unpadded) elements of each window
            ones = np.zeros((1, 1, h + t + b, w + l + r), np.float32)
            ones[:, :, t:t + h, l:l + w] = 1
            count = sum(ones[tap] for tap in taps)
            scale = (1.0 / count).astype(np.float32) if g.padded else np.float32(1.0 / (g.kh * g.kw))
        i_pad = ctx.scratch((n, c, h + t + b, w + l + r), np.float32) if g.padded else None
        fill = -np.inf if kind == "max" else 0.0
        # 2x2 max at stride 2, unpadded: one compiled pass (jit.pool; 4 numpy passes took 18-21 us on
        # the core CNN's 32x28x28 and 64x14x14, one thread)
        pool2 = kind == "max" and (g.kh, g.kw, g.sh, g.sw, g.dh, g.dw) == (2, 2, 2, 2, 1, 1) and not g.padded \
            and use_compiled()

        def bind(ins, outs, sc):
            x, y = ins[0], outs[0]
            if pool2:
                from ..jit.pool import max_pool_2x2_float_rows  # deferred: jit.pool loads numba
                x3, y3 = x.reshape(n * c, h, w), y.reshape(n * c, oh, ow)
                return lambda: max_pool_2x2_float_rows(x3, y3)
            src = sc[i_pad] if i_pad is not None else x
            borders = _borders(src, t, b, l, r) if i_pad is not None else []
            inner = src[:, :, t:t + h, l:l + w]
            views = [src[tap] for tap in taps]
            first, rest = views[0], views[1:]
            combine, copyto, multiply = (np.maximum if kind == "max" else np.add), np.copyto, np.multiply

            def run():
                for v in borders:
                    v.fill(fill)
                if borders:
                    copyto(inner, x)
                copyto(y, first)
                for v in rest:
                    combine(y, v, out=y)
                if scale is not None:
                    multiply(y, scale, out=y)
            return run
        return [(n, c, oh, ow)], bind
    return prepare


KERNELS["MaxPool"] = _pool("max")
KERNELS["AvgPool"] = _pool("avg")


@kernel("GlobalAvgPool")
def global_avg_pool(ctx: OpContext):
    _float_inputs(ctx, 1, 1)
    ctx.rank(ctx.inputs[0], 4)
    n, c, h, w = ctx.inputs[0].shape
    keep = ctx.one_int("keepdims", 0, 0, 1)
    # a product with a vector of 1 / (H W): one BLAS call (about 2 us on MobileNet's 128 x 36, where
    # a sum along the last axis and a multiply took 8-18 us)
    mean = np.full(h * w, 1.0 / max(h * w, 1), np.float32)

    def bind(ins, outs, sc):
        x3, y2, matmul = ins[0].reshape(n, c, h * w), outs[0].reshape(n, c), np.matmul
        return lambda: matmul(x3, mean, out=y2)
    return [(n, c, 1, 1) if keep else (n, c)], bind


def reshape_target(ctx: OpContext, shape) -> tuple:
    total = math.prod(shape)
    if ctx.op == "Flatten":
        a = ctx.axis("axis", len(shape) + 1, 1)
        return math.prod(shape[:a]), math.prod(shape[a:])
    target = ctx.attrs.get("shape")
    if not isinstance(target, tuple) or not all(isinstance(d, int) and d >= -1 for d in target) \
            or target.count(-1) > 1:
        raise EdgeModelError(f"Reshape: attribute 'shape' = {target!r} is not a shape")
    known = math.prod(d for d in target if d != -1)
    if -1 in target and known:
        target = tuple(total // known if d == -1 else d for d in target)
    if math.prod(target) != total:
        raise EdgeModelError(f"Reshape: {shape} cannot become {target}")
    return tuple(target)


@kernel("Reshape", "Flatten")
def reshape(ctx: OpContext):
    _float_inputs(ctx, 1, 1)
    out = reshape_target(ctx, ctx.inputs[0].shape)

    def bind(ins, outs, sc):
        x, y, copyto = ins[0].reshape(out), outs[0], np.copyto
        return lambda: copyto(y, x)
    return [out], bind


@kernel("Concat")
def concat(ctx: OpContext):
    if not ctx.inputs or len(ctx.outputs) != 1:
        raise EdgeModelError("Concat: needs inputs and one output")
    _float_inputs(ctx, 1, len(ctx.inputs))
    first = ctx.inputs[0].shape
    axis = ctx.axis("axis", len(first), 0)
    for t in ctx.inputs:
        if len(t.shape) != len(first) or any(a != b for k, (a, b) in enumerate(zip(t.shape, first)) if k != axis):
            raise EdgeModelError(f"Concat: '{t.name}' {t.shape} does not match {first} off axis {axis}")
    out = first[:axis] + (sum(t.shape[axis] for t in ctx.inputs),) + first[axis + 1:]

    def bind(ins, outs, sc):
        y, cat = outs[0], np.concatenate
        return lambda: cat(ins, axis=axis, out=y)
    return [out], bind


@kernel("Softmax")
def softmax(ctx: OpContext):
    _float_inputs(ctx, 1, 1)
    shape = ctx.inputs[0].shape
    if not shape:
        raise EdgeModelError("Softmax: x must have rank >= 1")
    axis = ctx.axis("axis", len(shape), -1)
    i_red = ctx.scratch(shape[:axis] + (1,) + shape[axis + 1:], np.float32)

    def bind(ins, outs, sc):
        x, y, red = ins[0], outs[0], sc[i_red]
        amax, subtract, exp, total, divide = np.max, np.subtract, np.exp, np.sum, np.divide

        def run():
            amax(x, axis=axis, keepdims=True, out=red)
            subtract(x, red, out=y)
            exp(y, out=y)
            total(y, axis=axis, keepdims=True, out=red)
            divide(y, red, out=y)
        return run
    return [shape], bind


@kernel("Pad")
def pad(ctx: OpContext):
    _float_inputs(ctx, 1, 1)
    shape = ctx.inputs[0].shape
    if ctx.attrs.get("mode", "constant") != "constant":
        raise EdgeModelError("Pad: the edge kernel supports mode 'constant' only")
    p = ctx.ints("paddings", 2 * len(shape), lo=0, hi=1 << 16)  # (before0, after0, before1, after1, ...)
    value = np.float32(ctx.number("constant_value", 0.0))
    out = tuple(d + p[2 * i] + p[2 * i + 1] for i, d in enumerate(shape))
    inner = tuple(slice(p[2 * i], p[2 * i] + d) for i, d in enumerate(shape))

    def bind(ins, outs, sc):
        x, y, copyto = ins[0], outs[0], np.copyto
        dst = y[inner]

        def run():
            y.fill(value)
            copyto(dst, x)
        return run
    return [out], bind


@kernel("BatchNorm")
def batch_norm(ctx: OpContext):
    """Inference batch norm, y = x * scale / sqrt(var + eps) + (offset - mean * that); with constant
    statistics (the usual case when the passes did not fold it) both vectors are computed once."""
    _float_inputs(ctx, 5, 5)
    shape = ctx.inputs[0].shape
    if not shape:
        raise EdgeModelError("BatchNorm: x must have rank >= 1")
    axis = ctx.axis("axis", len(shape), 1)
    c = shape[axis]
    for t in ctx.inputs[1:]:
        if t.shape != (c,):
            raise EdgeModelError(f"BatchNorm: '{t.name}' has shape {t.shape}, expected ({c},)")
    eps = ctx.number("epsilon", 1e-3)
    view = (-1,) + (1,) * (len(shape) - axis - 1)
    consts = [t.data for t in ctx.inputs[1:]]
    fixed = None
    if all(v is not None for v in consts):
        scale, offset, mean, var = (v.astype(np.float64) for v in consts)
        inv = scale / np.sqrt(var + eps)
        fixed = (inv.astype(np.float32).reshape(view), (offset - mean * inv).astype(np.float32).reshape(view))
    i_inv, i_shift = ctx.scratch((c,), np.float32), ctx.scratch((c,), np.float32)

    def bind(ins, outs, sc):
        x, y = ins[0], outs[0]
        multiply, add = np.multiply, np.add
        if fixed is not None:
            inv_v, shift_v = fixed

            def run_fixed():
                multiply(x, inv_v, out=y)
                add(y, shift_v, out=y)
            return run_fixed
        scale, offset, mean, var = ins[1:]
        inv, shift = sc[i_inv], sc[i_shift]
        inv_v, shift_v = inv.reshape(view), shift.reshape(view)

        def run():
            add(var, np.float32(eps), out=inv)
            np.sqrt(inv, out=inv)
            np.divide(scale, inv, out=inv)
            multiply(mean, inv, out=shift)
            np.subtract(offset, shift, out=shift)
            multiply(x, inv_v, out=y)
            add(y, shift_v, out=y)
        return run
    return [shape], bind


from . import kernels_layout  # noqa: E402,F401  (registers Transpose, Split, LayerNorm, LeakyRelu)
from . import kernels_act, kernels_convt, kernels_math, kernels_rnn, kernels_shape  # noqa: E402,F401  (register their kernels)
