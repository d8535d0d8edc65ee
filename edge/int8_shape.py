"""int8 kernels of the data-movement ops (Transpose, Gather, StridedSlice, Squeeze, ExpandAxes, Split,
nearest Resize) and the mobile activations (PRelu, HardSwish, HardSigmoid, LeakyRelu).

Moving int8 values is exact: the same kernels as fp32 (kernels_shape.py) on int8 elements, followed
by a 256-entry requantization table when the output's scale or zero point differs from the input's.
A unary activation is one table, built here from the float function at the input's 256 values and
rounded once into the output's parameters (what LiteRT's int8 HardSwish, LeakyRelu and Logistic do
in fixed point); PRelu with a per-channel slope dequantizes, applies the slope and requantizes.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from .format import EdgeModelError
from .int8_elementwise import _INT8_VALUES, _requant_table, _same, _table_kernel, _table_step
from .kernel_tables import INT8_KERNELS, int8_kernel
from .kernels_shape import expand_axes, gather, resize, squeeze, strided_slice
from .opcontext import OpContext, clip_ufunc
from .quant import convert_table


def _moved(prepare: Callable) -> Callable:
    """The int8 form of a dtype-agnostic data-movement prepare: input 0 and the output per-tensor int8."""
    def prepare_int8(ctx: OpContext):
        if not ctx.inputs or ctx.inputs[0] is None or len(ctx.outputs) != 1:
            raise EdgeModelError(f"{ctx.op}: needs an input and one output")
        qx, qy = ctx.per_tensor(ctx.inputs[0]), ctx.per_tensor(ctx.outputs[0])
        out_shapes, bind = prepare(ctx, "int8")
        if _same(qx, qy):
            return out_shapes, bind
        table, i_idx = _requant_table(ctx, qx, qy), ctx.scratch(out_shapes[0], np.intp)

        def bind_requantized(ins, outs, sc):
            move, requantize = bind(ins, outs, sc), _table_step(table, outs[0], outs[0], sc[i_idx])

            def run():
                move()
                requantize()
            return run
        return out_shapes, bind_requantized
    return prepare_int8


def _transpose(ctx: OpContext, dtype: str):
    if len(ctx.inputs) != 1:
        raise EdgeModelError(f"Transpose: takes one input, got {len(ctx.inputs)}")
    ctx.dtype(ctx.inputs[0], dtype), ctx.dtype(ctx.outputs[0], dtype)
    shape = ctx.inputs[0].shape
    perm = ctx.ints("perm", len(shape), lo=0, hi=max(len(shape) - 1, 0))
    if sorted(perm) != list(range(len(shape))):
        raise EdgeModelError(f"Transpose: attribute 'perm' = {perm} is not a permutation of {len(shape)} axes")

    def bind(ins, outs, sc):
        x, y, copyto = ins[0].transpose(perm), outs[0], np.copyto
        return lambda: copyto(y, x)
    return [tuple(shape[p] for p in perm)], bind


for _name, _prepare in (("Transpose", _transpose), ("Gather", gather), ("StridedSlice", strided_slice),
                        ("Squeeze", squeeze), ("ExpandAxes", expand_axes)):
    INT8_KERNELS[_name] = _moved(_prepare)


@int8_kernel("Resize")
def resize_int8(ctx: OpContext):
    """Nearest: an exact move. Linear (LiteRT's int8 RESIZE_BILINEAR): the float kernel's blend of the
    exact integers x - zx, then one requantization, y = clamp(rint(v sx / sy) + zy)."""
    if ctx.attrs.get("mode", "nearest") == "nearest":
        return _moved(resize)(ctx)
    if len(ctx.inputs) != 1 or ctx.inputs[0] is None or len(ctx.outputs) != 1:
        raise EdgeModelError("Resize: takes one input and makes one output")
    x, y = ctx.inputs[0], ctx.outputs[0]
    ctx.dtype(x, "int8"), ctx.dtype(y, "int8")
    (sx, zx), (sy, zy) = ctx.per_tensor(x), ctx.per_tensor(y)
    float_ctx = OpContext(ctx.op, ctx.attrs, [replace(x, dtype=np.dtype(np.float32))],
                          [replace(y, dtype=np.dtype(np.float32))])
    float_ctx.scratch_specs = ctx.scratch_specs  # one list: the float kernel's scratch is this op's
    out_shapes, bind_float = resize(float_ctx)
    i_x, i_v = ctx.scratch(x.shape, np.float32), ctx.scratch(out_shapes[0], np.float32)
    ratio, zx32, zy32 = np.float32(sx / sy), np.float32(zx), np.float32(zy)
    lo, hi = np.float32(-128 - zy), np.float32(127 - zy)

    def bind(ins, outs, sc):
        xf, v = sc[i_x], sc[i_v]
        blend = bind_float([xf], [v], sc)
        xi, yo = ins[0], outs[0]

        def run():
            np.copyto(xf, xi)
            np.subtract(xf, zx32, out=xf)
            blend()
            np.multiply(v, ratio, out=v)
            clip_ufunc(v, lo, hi, out=v)
            np.rint(v, out=v)
            np.add(v, zy32, out=yo, casting="unsafe")
        return run
    return out_shapes, bind


@int8_kernel("Split")
def split(ctx: OpContext):
    """Pieces along an axis ('sizes', or 'num' equal ones), each requantized to its output's parameters."""
    if len(ctx.inputs) != 1 or ctx.inputs[0] is None or not ctx.outputs:
        raise EdgeModelError("Split: takes one input and makes one output per piece")
    x = ctx.inputs[0]
    ctx.dtype(x, "int8")
    qx, shape = ctx.per_tensor(x), x.shape
    if not shape:
        raise EdgeModelError("Split: x must have rank >= 1")
    axis, d, n_out = ctx.axis("axis", len(shape), 0), x.shape[ctx.axis("axis", len(shape), 0)], len(ctx.outputs)
    sizes = list(ctx.ints("sizes", len(ctx.attrs.get("sizes") or ()), lo=0, hi=d)) if ctx.attrs.get("sizes") else \
        [d // n_out] * n_out
    if len(sizes) != n_out or sum(sizes) != d:
        raise EdgeModelError(f"Split: sizes {sizes} do not cut {d} into the file's {n_out} outputs")
    out_shapes = [shape[:axis] + (s,) + shape[axis + 1:] for s in sizes]
    tables = []
    for y, s in zip(ctx.outputs, out_shapes):
        ctx.dtype(y, "int8")
        qy = ctx.per_tensor(y)
        tables.append(None if _same(qx, qy) else (_requant_table(ctx, qx, qy), ctx.scratch(s, np.intp)))
    starts = [sum(sizes[:k]) for k in range(n_out)]

    def bind(ins, outs, sc):
        steps = []
        for a, s, y, tab in zip(starts, sizes, outs, tables):
            src = ins[0][(slice(None),) * axis + (slice(a, a + s),)]
            steps.append((lambda src=src, y=y: np.copyto(y, src)) if tab is None else
                         _table_step(tab[0], src, y, sc[tab[1]]))

        def run():
            for step in steps:
                step()
        return run
    return out_shapes, bind


# ---- activations -------------------------------------------------------------------------------------
def _activation_table(ctx: OpContext, f: Callable[[np.ndarray], np.ndarray]):
    """(output shapes, bind) of y = quantize(f(dequantize(x))) as one 256-entry table."""
    if len(ctx.inputs) != 1 or ctx.inputs[0] is None or len(ctx.outputs) != 1:
        raise EdgeModelError(f"{ctx.op}: takes one input and makes one output")
    x, y = ctx.inputs[0], ctx.outputs[0]
    ctx.dtype(x, "int8"), ctx.dtype(y, "int8")
    (sx, zx), (sy, zy) = ctx.per_tensor(x), ctx.per_tensor(y)
    values = f((_INT8_VALUES - zx) * np.float64(sx))
    table = np.clip(np.rint(values / sy) + zy, -128, 127).astype(np.int8)
    return _table_kernel(ctx, table, x.shape)


@int8_kernel("HardSwish")
def hard_swish(ctx: OpContext):
    return _activation_table(ctx, lambda v: v * np.clip(v / 6 + 0.5, 0, 1))


@int8_kernel("HardSigmoid")
def hard_sigmoid(ctx: OpContext):
    a, b = ctx.number("alpha", 0.2), ctx.number("beta", 0.5)
    return _activation_table(ctx, lambda v: np.clip(v * a + b, 0, 1))


@int8_kernel("LeakyRelu")
def leaky_relu(ctx: OpContext):
    """LiteRT's XNNPACK int8 LEAKY_RELU where it takes the op (quant.convert_table: 8-bit multipliers,
    half up), else the float function's table."""
    a = ctx.number("alpha", 0.2)
    if len(ctx.inputs) == 1 and ctx.inputs[0] is not None and len(ctx.outputs) == 1:
        (sx, zx), (sy, zy) = ctx.per_tensor(ctx.inputs[0]), ctx.per_tensor(ctx.outputs[0])
        table = convert_table(sx, zx, sy, zy, _INT8_VALUES, slope=a)
        if table is not None:
            ctx.dtype(ctx.inputs[0], "int8"), ctx.dtype(ctx.outputs[0], "int8")
            return _table_kernel(ctx, table, ctx.inputs[0].shape)
    return _activation_table(ctx, lambda v: np.where(v >= 0, v, v * a))


@int8_kernel("PRelu")
def prelu(ctx: OpContext):
    """A constant slope, int8 (any parameters) or float32: one table when it is a single value, else
    x dequantized to float32 scratch, multiplied where negative, and requantized (rint, as Quantize)."""
    if len(ctx.inputs) != 2 or any(t is None for t in ctx.inputs) or len(ctx.outputs) != 1:
        raise EdgeModelError("PRelu: takes x and a slope and makes one output")
    x, s, y = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    ctx.dtype(x, "int8"), ctx.dtype(y, "int8"), ctx.dtype(s, "int8", "float32")
    slope = ctx.constant(s).astype(np.float64)
    if s.dtype == np.int8:
        ss, zs = ctx.per_tensor(s)
        slope = (slope - zs) * ss
    try:
        if tuple(np.broadcast_shapes(x.shape, slope.shape)) != tuple(x.shape):
            raise ValueError
    except ValueError:
        raise EdgeModelError(f"PRelu: slope {slope.shape} does not broadcast against {x.shape}") from None
    if slope.size == 1 or np.all(slope == slope.reshape(-1)[0]):
        k = float(slope.reshape(-1)[0])
        ctx.inputs = [x]
        return _activation_table(ctx, lambda v: np.where(v >= 0, v, v * k))
    (sx, zx), (sy, zy) = ctx.per_tensor(x), ctx.per_tensor(y)
    # in output units: y = rint((x - zx) * (slope where x < zx, else 1) * sx / sy) + zy
    ratio, k = np.float32(sx / sy), slope.astype(np.float32)
    zx32, zy32, lo, hi = np.float32(zx), np.float32(zy), np.float32(-128 - zy), np.float32(127 - zy)
    i_t, i_n = ctx.scratch(x.shape, np.float32), ctx.scratch(x.shape, np.float32)

    def bind(ins, outs, sc):
        xi, yo, t, n = ins[0], outs[0], sc[i_t], sc[i_n]
        copyto, subtract, multiply, minimum, maximum, rint, add = (np.copyto, np.subtract, np.multiply, np.minimum,
                                                                   np.maximum, np.rint, np.add)

        def run():  # max(t, 0) + slope min(t, 0): no masked pass (numpy's are 20-40x slower)
            copyto(t, xi)
            subtract(t, zx32, out=t)
            minimum(t, 0, out=n)
            multiply(n, k, out=n)
            maximum(t, 0, out=t)
            add(t, n, out=t)
            multiply(t, ratio, out=t)
            clip_ufunc(t, lo, hi, out=t)
            rint(t, out=t)
            add(t, zy32, out=yo, casting="unsafe")
        return run
    return [x.shape], bind
