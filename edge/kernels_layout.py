"""fp32 edge kernels for transformer-style models: Transpose, Split (any axis, several outputs),
LayerNorm (over the trailing axes from `axis`) and LeakyRelu. Same contract as kernels.py:
prepare(ctx) -> (output shapes, bind), steps writing into arena views with out=."""
from __future__ import annotations

import math

import numpy as np

from .format import EdgeModelError
from .kernel_tables import KERNELS, kernel
from .opcontext import OpContext


def _float(ctx: OpContext, n_in: int) -> None:
    if len(ctx.inputs) != n_in or any(t is None for t in ctx.inputs):
        raise EdgeModelError(f"{ctx.op}: takes {n_in} inputs, got {len(ctx.inputs)}")
    for t in ctx.inputs + ctx.outputs:
        ctx.dtype(t, "float32")


@kernel("Transpose")
def transpose(ctx: OpContext):
    _float(ctx, 1)
    shape = ctx.inputs[0].shape
    perm = ctx.ints("perm", len(shape), lo=0, hi=max(len(shape) - 1, 0))
    if sorted(perm) != list(range(len(shape))):
        raise EdgeModelError(f"Transpose: attribute 'perm' = {perm} is not a permutation of {len(shape)} axes")

    def bind(ins, outs, sc):
        x, y, copyto = ins[0].transpose(perm), outs[0], np.copyto
        return lambda: copyto(y, x)
    return [tuple(shape[p] for p in perm)], bind


@kernel("Split")
def split(ctx: OpContext):
    _float(ctx, 1)
    shape = ctx.inputs[0].shape
    if not shape:
        raise EdgeModelError("Split: x must have rank >= 1")
    axis = ctx.axis("axis", len(shape), 0)
    d, n_out = shape[axis], len(ctx.outputs)
    sizes = ctx.attrs.get("sizes") or []
    if sizes:
        sizes = list(ctx.ints("sizes", len(sizes), lo=-1, hi=d))
        if sizes.count(-1) > 1:
            raise EdgeModelError(f"Split: attribute 'sizes' = {sizes} has more than one -1")
        sizes = [d - sum(s for s in sizes if s != -1) if s == -1 else s for s in sizes]
    else:
        num = ctx.one_int("num", n_out, 1, max(d, 1))
        if d % num:
            raise EdgeModelError(f"Split: {d} along axis {axis} does not split into {num} equal parts")
        sizes = [d // num] * num
    if len(sizes) != n_out or sum(sizes) != d or min(sizes) < 0:
        raise EdgeModelError(f"Split: sizes {sizes} do not cut {d} into the file's {n_out} outputs")
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    lead = (slice(None),) * axis

    def bind(ins, outs, sc):
        parts = [(ins[0][lead + (slice(a, a + s),)], y) for a, s, y in zip(starts, sizes, outs)]
        copyto = np.copyto

        def run():
            for src, y in parts:
                copyto(y, src)
        return run
    return [shape[:axis] + (s,) + shape[axis + 1:] for s in sizes], bind


@kernel("LayerNorm")
def layer_norm(ctx: OpContext):
    """y = (x - mean) / sqrt(var + eps) * gamma + beta over the axes from `axis` on, as core's kernel."""
    _float(ctx, 3)
    shape = ctx.inputs[0].shape
    if not shape:
        raise EdgeModelError("LayerNorm: x must have rank >= 1")
    axis = ctx.axis("axis", len(shape), -1)
    inner = shape[axis:]
    for t in ctx.inputs[1:]:
        if tuple(t.shape) != tuple(inner):
            raise EdgeModelError(f"LayerNorm: '{t.name}' has shape {t.shape}, expected {inner}")
    eps = np.float32(ctx.number("epsilon", 1e-5))
    rows, cols = math.prod(shape[:axis]), math.prod(inner)
    i_mean, i_red = ctx.scratch((rows, 1), np.float32), ctx.scratch((rows,), np.float32)
    inv_n = np.float32(1.0 / max(cols, 1))

    def bind(ins, outs, sc):
        x2, y2, mean, red = ins[0].reshape(rows, cols), outs[0].reshape(rows, cols), sc[i_mean], sc[i_red]
        g, b, red2 = ins[1].reshape(1, cols), ins[2].reshape(1, cols), sc[i_red].reshape(rows, 1)
        total, subtract, multiply, add, sqrt, divide, einsum = (np.sum, np.subtract, np.multiply, np.add, np.sqrt,
                                                                 np.divide, np.einsum)

        def run():
            total(x2, axis=1, keepdims=True, out=mean)
            multiply(mean, inv_n, out=mean)
            subtract(x2, mean, out=y2)
            einsum("ij,ij->i", y2, y2, out=red)  # the sum of squares, no temporary
            multiply(red, inv_n, out=red)
            add(red, eps, out=red)
            sqrt(red, out=red)
            divide(y2, red2, out=y2)
            multiply(y2, g, out=y2)
            add(y2, b, out=y2)
        return run
    return [shape], bind


@kernel("LeakyRelu")
def leaky_relu(ctx: OpContext):
    _float(ctx, 1)
    alpha = np.float32(ctx.number("alpha", 0.2))

    def bind(ins, outs, sc):
        x, y, multiply = ins[0], outs[0], np.multiply
        pick = np.maximum if alpha <= 1 else np.minimum  # max(x, alpha x) for alpha <= 1, min beyond

        def run():
            multiply(x, alpha, out=y)
            pick(y, x, out=y)
        return run
    return [ctx.inputs[0].shape], bind


assert all(k in KERNELS for k in ("Transpose", "Split", "LayerNorm", "LeakyRelu"))
