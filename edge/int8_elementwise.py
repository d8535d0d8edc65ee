"""Elementwise and data-movement int8 kernels: add, mul, bias add, activations, reshape, concat,
pad, softmax, quantize and dequantize.

A unary int8 map (an activation, or a change of scale and zero point) is a 256-entry table built
once in prepare from the integer requantization (quant.Requantizer), so it runs as one np.take.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .compiled import use_compiled
from .format import EdgeModelError
from .kernel_tables import int8_kernel
from .kernels import reshape_target
from .opcontext import OpContext, clip_ufunc
from .quant import F64_EXACT, UP, Requantizer, activation_bounds, add_multipliers, convert_table

_INT8_VALUES = np.arange(256, dtype=np.int64).astype(np.uint8).view(np.int8).astype(np.int64)  # index u -> int8


def _same(a, b) -> bool:
    return abs(a[0] - b[0]) <= 1e-6 * b[0] and a[1] == b[1]


def _requant_table(ctx: OpContext, src, dst, lo: int = -128, hi: int = 127) -> np.ndarray:
    (s1, z1), (s2, z2) = src, dst
    # int8 -> int8 requantization is LiteRT's QUANTIZE op (XNNPACK's convert: quant.convert_table); with
    # an activation's clamp, or where XNNPACK declines the ratio, the fixed point rounding half up
    table = convert_table(s1, z1, s2, z2, _INT8_VALUES) if (lo, hi) == (-128, 127) else None
    return Requantizer(s1 / s2, z2, lo, hi, 256, [-z1], rounding=UP).table(_INT8_VALUES) if table is None else table


def _table_step(table: np.ndarray, x: np.ndarray, y: np.ndarray, idx: np.ndarray):
    """y = table[x as uint8]: the index goes through an intp scratch, since np.take would convert
    uint8 indices into a fresh intp array on every call."""
    xu, copyto, take = x.view(np.uint8).reshape(idx.shape), np.copyto, np.take

    def run():
        copyto(idx, xu)
        take(table, idx, out=y, mode="wrap")
    return run


def _table_kernel(ctx: OpContext, table: np.ndarray, shape):
    """(output shapes, bind) of a 256-entry lookup from the op's input to its output of `shape`."""
    i_idx = ctx.scratch(shape, np.intp)
    return [tuple(shape)], lambda ins, outs, sc: _table_step(table, ins[0], outs[0], sc[i_idx])


def _bind_copy(ins, outs, sc):
    x, y, copyto = ins[0].reshape(outs[0].shape), outs[0], np.copyto
    return lambda: copyto(y, x)


def _unary(ctx: OpContext):
    ctx.arity(1, 1)
    x, y = ctx.inputs[0], ctx.outputs[0]
    ctx.dtype(x, "int8"), ctx.dtype(y, "int8")
    return x, y, ctx.per_tensor(x), ctx.per_tensor(y)


@int8_kernel("Relu", "Relu6")
def relu(ctx: OpContext):
    x, y, qx, qy = _unary(ctx)
    lo, hi = activation_bounds(ctx.op.lower(), *qy)
    if _same(qx, qy):
        def bind(ins, outs, sc):
            xi, yo, clip = ins[0], outs[0], clip_ufunc
            return lambda: clip(xi, lo, hi, out=yo)
        return [x.shape], bind
    return _table_kernel(ctx, _requant_table(ctx, qx, qy, lo, hi), x.shape)


@int8_kernel("Tanh", "Sigmoid")
def smooth(ctx: OpContext):
    """A table of round(f(s_x (x - z_x)) / s_y) + z_y, computed once in float64."""
    x, y, (sx, zx), (sy, zy) = _unary(ctx)
    real = sx * (_INT8_VALUES - zx)
    f = np.tanh(real) if ctx.op == "Tanh" else 1.0 / (1.0 + np.exp(-real))
    table = np.clip(np.round(f / sy) + zy, -128, 127).astype(np.int8)
    return _table_kernel(ctx, table, x.shape)


@int8_kernel("Identity", "Reshape", "Flatten")
def reshape(ctx: OpContext):
    x, y, qx, qy = _unary(ctx)
    shape = x.shape if ctx.op == "Identity" else reshape_target(ctx, x.shape)
    if _same(qx, qy):
        return [shape], _bind_copy
    return _table_kernel(ctx, _requant_table(ctx, qx, qy), shape)


def _broadcast(ctx: OpContext, a, b):
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        raise EdgeModelError(f"{ctx.op}: shapes {a} and {b} do not broadcast") from None


_PAIRS = (_INT8_VALUES.reshape(256, 1), _INT8_VALUES.reshape(1, 256))  # (x1, x2) at index u1 * 256 + u2


def _bind_pair_table(table: np.ndarray, shape2, i_idx: int, i_b: int):
    """y = table[u1 * 256 + u2] (u: an int8 input's bytes as uint8), through intp scratch."""
    def bind(ins, outs, sc):
        a, b = ins[0].view(np.uint8), ins[1].reshape(shape2).view(np.uint8)
        y, idx, tb = outs[0], sc[i_idx], sc[i_b]
        copyto, left_shift, add_, take, eight = np.copyto, np.left_shift, np.add, np.take, np.intp(8)

        def run():
            copyto(idx, a)
            left_shift(idx, eight, out=idx)
            copyto(tb, b)
            add_(idx, tb, out=idx)
            take(table, idx, out=y, mode="wrap")
        return run
    return bind


@int8_kernel("Add", "BiasAdd")
def add(ctx: OpContext):
    """y = ((x1 * Q1 + x2 * Q2 + K) >> S) + clamp, with Q_i = round(s_i / s_y * 2^S) sharing one shift
    and K folding both zero points, the rounding and z_y. Evaluated in float64 where that is exact
    (always, unless S is beyond about 45); otherwise a lookup in the table of all 65,536 pairs,
    each evaluated once in int64."""
    ctx.arity(2, 2)
    x1, x2, y = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    for t in (x1, x2, y):
        ctx.dtype(t, "int8")
    (s1, z1), (s2, z2), (sy, zy) = ctx.per_tensor(x1), ctx.per_tensor(x2), ctx.per_tensor(y)
    shape2 = x2.shape
    if ctx.op == "BiasAdd":
        ctx.rank(x2, 1)
        axis = ctx.axis("axis", len(x1.shape), -1)
        if x2.shape[0] != x1.shape[axis]:
            raise EdgeModelError(f"BiasAdd: bias of {x2.shape[0]} for axis {axis} of {x1.shape}")
        shape2 = (x2.shape[0],) + (1,) * (len(x1.shape) - axis - 1)
    out = _broadcast(ctx, x1.shape, shape2)
    q1, q2, shift = add_multipliers(s1, s2, sy)  # LiteRT's XNNPACK's (its rounding: half up)
    k = -z1 * q1 - z2 * q2 + (1 << (shift - 1)) + (zy << shift)
    if 128 * (q1 + q2) + abs(k) >= 1 << 63:
        raise EdgeModelError(f"{ctx.op}: scales {s1}, {s2} -> {sy} overflow the fixed-point sum")
    lo, hi = activation_bounds(ctx.choice("activation", "none", ("none", "relu", "relu6")), sy, zy)
    k128 = k + (128 << shift)
    if 128 * (q1 + q2) + abs(k128) < F64_EXACT:
        # in float64, exactly: v = x1 q1 2^-S + x2 q2 2^-S + (K + 128 * 2^S) 2^-S is a multiple of 2^-S
        # below 2^(53 - S), so floor(v) - 128 is the definition's value (streaming passes, no table
        # to fetch from memory after the convolutions between two adds have evicted it)
        m1, m2, kf = math.ldexp(q1, -shift), math.ldexp(q2, -shift), math.ldexp(float(k128), -shift)
        flo, fhi = float(lo + 128), float(hi + 128)
        compiled = shape2 == out and use_compiled()  # one compiled pass (jit.requantize.add_requantize)
        if not compiled:
            i_t, i_b = ctx.scratch(out, np.float64), ctx.scratch(shape2, np.float64)

        def bind(ins, outs, sc):
            if compiled:  # arena views are contiguous; only a constant operand may need its copy
                from ..jit.requantize import add_requantize  # deferred: jit.requantize loads numba
                a1, b1 = (np.ascontiguousarray(v).reshape(-1) for v in ins)
                y1 = outs[0].reshape(-1)
                return lambda: add_requantize(a1, b1, m1, m2, kf, flo, fhi, y1)
            a, b, t, tb, u8 = ins[0], ins[1].reshape(shape2), sc[i_t], sc[i_b], outs[0].view(np.uint8)
            copyto, multiply, add_, clip, xor, top = np.copyto, np.multiply, np.add, clip_ufunc, np.bitwise_xor, np.uint8(128)

            def run():
                copyto(t, a)
                multiply(t, m1, out=t)
                copyto(tb, b)
                multiply(tb, m2, out=tb)
                add_(t, tb, out=t)
                add_(t, kf, out=t)
                clip(t, flo, fhi, out=t)
                copyto(u8, t, casting="unsafe")  # truncation: a floor, all values are >= 0 here
                xor(u8, top, out=u8)
            return run
        return [out], bind
    v = (_PAIRS[0] * q1 + _PAIRS[1] * q2 + k) >> shift
    table = np.clip(v, lo, hi).astype(np.int8).ravel()
    return [out], _bind_pair_table(table, shape2, ctx.scratch(out, np.intp), ctx.scratch(shape2, np.intp))


@int8_kernel("Mul")
def mul(ctx: OpContext):
    """y = requantize((x1 - z1) * (x2 - z2), s1 * s2 / s_y): a lookup in the table of all 65,536 pairs."""
    ctx.arity(2, 2)
    x1, x2, y = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    for t in (x1, x2, y):
        ctx.dtype(t, "int8")
    (s1, z1), (s2, z2), (sy, zy) = ctx.per_tensor(x1), ctx.per_tensor(x2), ctx.per_tensor(y)
    out = _broadcast(ctx, x1.shape, x2.shape)
    rq = Requantizer(s1 * s2 / sy, zy, -128, 127, 256 * 256)
    table = rq.table(((_PAIRS[0] - z1) * (_PAIRS[1] - z2)).ravel())
    return [out], _bind_pair_table(table, x2.shape, ctx.scratch(out, np.intp), ctx.scratch(x2.shape, np.intp))


@int8_kernel("Concat")
def concat(ctx: OpContext):
    if not ctx.inputs or any(t is None for t in ctx.inputs) or len(ctx.outputs) != 1:
        raise EdgeModelError("Concat: needs inputs and one output")
    y = ctx.outputs[0]
    ctx.dtype(y, "int8")
    qy = ctx.per_tensor(y)
    first = ctx.inputs[0].shape
    axis = ctx.axis("axis", len(first), 0)
    for t in ctx.inputs:
        ctx.dtype(t, "int8")
        if len(t.shape) != len(first) or any(a != b for k, (a, b) in enumerate(zip(t.shape, first)) if k != axis):
            raise EdgeModelError(f"Concat: '{t.name}' {t.shape} does not match {first} off axis {axis}")
    tables = [None if _same(ctx.per_tensor(t), qy) else _requant_table(ctx, ctx.per_tensor(t), qy)
              for t in ctx.inputs]
    sizes = [t.shape[axis] for t in ctx.inputs]
    out = first[:axis] + (sum(sizes),) + first[axis + 1:]
    i_idx = [None if table is None else ctx.scratch(t.shape, np.intp) for t, table in zip(ctx.inputs, tables)]

    def bind(ins, outs, sc):
        steps, at = [], 0
        for x, size, table, i in zip(ins, sizes, tables, i_idx):
            dst = outs[0][(slice(None),) * axis + (slice(at, at + size),)]
            steps.append((lambda x=x, dst=dst: np.copyto(dst, x)) if table is None else
                         _table_step(table, x, dst, sc[i]))
            at += size

        def run():
            for step in steps:
                step()
        return run
    return [out], bind


@int8_kernel("Pad")
def pad(ctx: OpContext):
    x, y, qx, qy = _unary(ctx)
    if not _same(qx, qy):
        raise EdgeModelError("Pad: int8 padding keeps its input's scale and zero point")
    if ctx.attrs.get("mode", "constant") != "constant":
        raise EdgeModelError("Pad: int8 padding supports mode 'constant' only")
    rank = len(x.shape)
    p = ctx.ints("paddings", 2 * rank, lo=0, hi=1 << 16)
    value = int(np.clip(round(ctx.number("constant_value", 0.0) / qy[0]) + qy[1], -128, 127))
    out = tuple(d + p[2 * i] + p[2 * i + 1] for i, d in enumerate(x.shape))
    inner = tuple(slice(p[2 * i], p[2 * i] + d) for i, d in enumerate(x.shape))

    def bind(ins, outs, sc):
        xi, yo, dst, copyto = ins[0], outs[0], outs[0][inner], np.copyto

        def run():
            yo.fill(value)
            copyto(dst, xi)
        return run
    return [out], bind


@int8_kernel("Softmax")
def softmax(ctx: OpContext):
    """e = E[x - max(x) + 255] with E[i] = round(2^20 exp(s_x (i - 255))); p = round(2^16 e / sum e)
    (half up); y = requantize(p, 2^-16 / s_y)."""
    x, y, (sx, zx), (sy, zy) = _unary(ctx)
    axis = ctx.axis("axis", len(x.shape), -1)
    table = np.round(np.exp(sx * (np.arange(256) - 255.0)) * (1 << 20)).astype(np.int64)
    rq = Requantizer(2.0 ** -16 / sy, zy, -128, 127, 1 << 16)
    red = x.shape[:axis] + (1,) + x.shape[axis + 1:]
    i_m, i_d, i_e = ctx.scratch(red, np.int64), ctx.scratch(x.shape, np.int64), ctx.scratch(x.shape, np.int64)
    i_s, i_h = ctx.scratch(red, np.int64), ctx.scratch(red, np.int64)

    def bind(ins, outs, sc):
        xi, mx, d, e, s, half = ins[0], sc[i_m], sc[i_d], sc[i_e], sc[i_s], sc[i_h]
        requant = rq.bind(e, outs[0], e)
        amax, subtract, add_, take, total, copyto = np.max, np.subtract, np.add, np.take, np.sum, np.copyto
        right_shift, left_shift, floor_divide = np.right_shift, np.left_shift, np.floor_divide

        def run():
            copyto(d, xi)
            amax(d, axis=axis, keepdims=True, out=mx)
            subtract(d, mx, out=d)
            add_(d, 255, out=d)
            take(table, d, out=e, mode="wrap")
            total(e, axis=axis, keepdims=True, out=s)
            right_shift(s, 1, out=half)
            left_shift(e, 16, out=e)
            add_(e, half, out=e)
            floor_divide(e, s, out=e)
            requant()
        return run
    return [x.shape], bind


def _axis_params(ctx: OpContext, t):
    """Scale and zero point broadcastable against t (per-tensor, or per-axis along t.axis)."""
    if len(t.scale) == 1 and t.axis == -1:
        s, z = ctx.per_tensor(t)
        return np.float32(s), np.float32(z)
    ax = t.axis
    s, z = ctx.per_channel(t, ax)
    shape = (-1,) + (1,) * (len(t.shape) - ax - 1)
    return s.astype(np.float32).reshape(shape), z.astype(np.float32).reshape(shape)


@int8_kernel("Quantize")
def quantize(ctx: OpContext):
    """float32 -> int8: clamp(rint(x / s) + z) (rint: half to even); int8 -> int8 requantizes."""
    ctx.arity(1, 1)
    x, y = ctx.inputs[0], ctx.outputs[0]
    ctx.dtype(y, "int8")
    if x.dtype == np.int8:
        return _table_kernel(ctx, _requant_table(ctx, ctx.per_tensor(x), ctx.per_tensor(y)), x.shape)
    ctx.dtype(x, "float32")
    if y.axis >= len(x.shape):
        raise EdgeModelError(f"Quantize: axis {y.axis} out of range for {x.shape}")
    s, z = _axis_params(ctx, replace(y, shape=tuple(x.shape)))
    compiled = np.ndim(s) == 0 and use_compiled()  # per tensor: one compiled pass (jit.requantize.quantize_flat)
    i_t = None if compiled else ctx.scratch(x.shape, np.float32)

    # clamp(rint(t) + z, -128, 127) = rint(clamp(t, -128 - z, 127 - z)) + z: rint is monotone and the
    # bounds are integers; the last add then writes the int8 output directly (exact integers)
    lo, hi = (np.float32(-128) - z).astype(np.float32), (np.float32(127) - z).astype(np.float32)

    def bind(ins, outs, sc):
        if compiled:  # arena views are contiguous; a constant input is copied once
            from ..jit.requantize import quantize_flat  # deferred: jit.requantize loads numba
            x1, y1 = np.ascontiguousarray(ins[0]).reshape(-1), outs[0].reshape(-1)
            return lambda: quantize_flat(x1, s, lo, hi, z, y1)
        xi, yo, t = ins[0], outs[0], sc[i_t]
        divide, rint, add_, clip = np.divide, np.rint, np.add, clip_ufunc

        def run():
            divide(xi, s, out=t)
            clip(t, lo, hi, out=t)
            rint(t, out=t)
            add_(t, z, out=yo, casting="unsafe")
        return run
    return [x.shape], bind


@int8_kernel("Dequantize")
def dequantize(ctx: OpContext):
    """int8 -> float32: (x - z) * s."""
    ctx.arity(1, 1)
    x, y = ctx.inputs[0], ctx.outputs[0]
    ctx.dtype(x, "int8"), ctx.dtype(y, "float32")
    if x.axis >= len(x.shape):
        raise EdgeModelError(f"Dequantize: axis {x.axis} out of range for {x.shape}")
    s, z = _axis_params(ctx, x)
    compiled = np.ndim(s) == 0 and use_compiled()  # per tensor: one compiled pass (jit.requantize.dequantize_flat)

    def bind(ins, outs, sc):
        if compiled:  # arena views are contiguous; a constant input is copied once
            from ..jit.requantize import dequantize_flat  # deferred: jit.requantize loads numba
            x1, y1 = np.ascontiguousarray(ins[0]).reshape(-1), outs[0].reshape(-1)
            return lambda: dequantize_flat(x1, z, s, y1)
        xi, yo, copyto, subtract, multiply = ins[0], outs[0], np.copyto, np.subtract, np.multiply

        def run():
            copyto(yo, xi)
            subtract(yo, z, out=yo)
            multiply(yo, s, out=yo)
        return run
    return [x.shape], bind
