"""fp32 edge kernels of the mobile activations: PRelu (a slope broadcast against x, a scalar
included), HardSwish and HardSigmoid, computed as core's kernels compute them. Same contract as
kernels.py: prepare(ctx) -> (output shapes, bind), steps writing into arena views with out=."""
from __future__ import annotations

import numpy as np

from .format import EdgeModelError
from .kernel_tables import kernel
from .opcontext import OpContext, clip_ufunc


def _float(ctx: OpContext, n_in: int) -> None:
    if len(ctx.inputs) != n_in or any(t is None for t in ctx.inputs) or len(ctx.outputs) != 1:
        raise EdgeModelError(f"{ctx.op}: takes {n_in} inputs and makes one output")
    for t in ctx.inputs + ctx.outputs:
        ctx.dtype(t, "float32")


@kernel("PRelu")
def prelu(ctx: OpContext):
    """y = x where x >= 0, slope * x elsewhere; the slope broadcasts against x (ONNX rules). A finite slope
    gives core's values exactly (slope * 0 = 0 on the positive side)."""
    _float(ctx, 2)
    x, s = ctx.inputs[0].shape, ctx.inputs[1].shape
    try:
        out = tuple(np.broadcast_shapes(x, s))
    except ValueError:
        raise EdgeModelError(f"PRelu: slope {s} does not broadcast against {x}") from None
    if out != tuple(x):
        raise EdgeModelError(f"PRelu: slope {s} would grow the input {x} to {out}")
    i_t = ctx.scratch(x, np.float32)

    def bind(ins, outs, sc):
        xi, si, y, t = ins[0], ins[1], outs[0], sc[i_t]
        minimum, maximum, multiply, add = np.minimum, np.maximum, np.multiply, np.add

        def run():  # max(x, 0) + slope min(x, 0): four streaming passes, no masked copy
            minimum(xi, 0, out=t)
            multiply(t, si, out=t)
            maximum(xi, 0, out=y)
            add(y, t, out=y)
        return run
    return [x], bind


@kernel("HardSigmoid")
def hard_sigmoid(ctx: OpContext):
    """y = clip(alpha x + beta, 0, 1)."""
    _float(ctx, 1)
    a, b = np.float32(ctx.number("alpha", 0.2)), np.float32(ctx.number("beta", 0.5))

    def bind(ins, outs, sc):
        x, y, multiply, add, clip = ins[0], outs[0], np.multiply, np.add, clip_ufunc

        def run():
            multiply(x, a, out=y)
            add(y, b, out=y)
            clip(y, 0, 1, out=y)
        return run
    return [ctx.inputs[0].shape], bind


@kernel("HardSwish")
def hard_swish(ctx: OpContext):
    """y = x clip(x / 6 + 1/2, 0, 1), the multiply by 1/6 in float32 as core does it."""
    _float(ctx, 1)
    sixth, half = np.float32(1 / 6), np.float32(0.5)

    def bind(ins, outs, sc):
        x, y, multiply, add, clip = ins[0], outs[0], np.multiply, np.add, clip_ufunc

        def run():
            multiply(x, sixth, out=y)
            add(y, half, out=y)
            clip(y, 0, 1, out=y)
            multiply(y, x, out=y)
        return run
    return [ctx.inputs[0].shape], bind
