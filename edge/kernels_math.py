"""fp32 edge kernels a transformer block needs beyond matmul and layer norm: Gelu (exact, through erfc,
or the tanh form) and the reductions ReduceMean, ReduceSum, ReduceMax over any axes. Same contract as
kernels.py: prepare(ctx) -> (output shapes, bind), steps writing into arena views with out=."""
from __future__ import annotations

import math

import numpy as np

from .format import EdgeModelError
from .kernels import kernel
from .opcontext import OpContext

# erfc(u) = t exp(-u^2 + P(t)), t = 1 / (1 + u / 2), u >= 0: the Chebyshev fit in Numerical Recipes
# (fractional error below 1.2e-7 for every u >= 0), P's coefficients from the constant term up
_ERFC = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398, 1.48851587,
         -0.82215223, 0.17087277)


def _float(ctx: OpContext) -> None:
    if len(ctx.inputs) != 1 or ctx.inputs[0] is None or len(ctx.outputs) != 1:
        raise EdgeModelError(f"{ctx.op}: takes one input and makes one output")
    ctx.dtype(ctx.inputs[0], "float32"), ctx.dtype(ctx.outputs[0], "float32")


@kernel("Gelu")
def gelu(ctx: OpContext):
    """Exact: x (1 - erfc(u) / 2) for x >= 0 and x erfc(u) / 2 below, u = |x| / sqrt 2, so the tiny values
    of the negative side keep their relative accuracy; 'tanh': x (1 + tanh(c (x + 0.044715 x^3))) / 2."""
    _float(ctx)
    shape = ctx.inputs[0].shape
    approx = ctx.choice("approximate", "none", ("none", "tanh"))
    i_t, i_p = ctx.scratch(shape, np.float32), ctx.scratch(shape, np.float32)
    i_m = ctx.scratch(shape, np.bool_)
    coef = [np.float32(c) for c in _ERFC]
    half, one, r2, c = np.float32(0.5), np.float32(1.0), np.float32(1 / math.sqrt(2)), np.float32(math.sqrt(2 / math.pi))
    k3 = np.float32(0.044715)

    def bind(ins, outs, sc):
        x, y, t, p, neg = ins[0], outs[0], sc[i_t], sc[i_p], sc[i_m]
        add, mul, sub, div, exp, absolute, copyto = (np.add, np.multiply, np.subtract, np.divide, np.exp, np.abs,
                                                     np.copyto)

        def run_tanh():
            mul(x, x, out=t)
            mul(t, x, out=t)
            mul(t, k3, out=t)
            add(t, x, out=t)
            mul(t, c, out=t)
            np.tanh(t, out=t)
            add(t, one, out=t)
            mul(t, x, out=y)
            mul(y, half, out=y)

        def run_exact():
            absolute(x, out=p)
            mul(p, r2, out=p)  # u
            mul(p, half, out=t)
            add(t, one, out=t)
            div(one, t, out=t)  # t
            mul(p, p, out=p)  # u^2
            sub(coef[0], p, out=p)  # -u^2 + c0
            acc = y  # Horner's P(t) - c0 in y, then the sum in p
            copyto(acc, coef[-1])
            for a in coef[-2:0:-1]:
                mul(acc, t, out=acc)
                add(acc, a, out=acc)
            mul(acc, t, out=acc)
            add(p, acc, out=p)
            exp(p, out=p)
            mul(p, t, out=p)  # erfc(u)
            mul(p, half, out=p)  # erfc(u) / 2: the weight of x below zero
            np.less(x, 0, out=neg)
            sub(one, p, out=t)  # 1 - erfc(u) / 2: the weight of x above
            copyto(t, p, where=neg)
            mul(x, t, out=y)
        return run_tanh if approx == "tanh" else run_exact
    return [shape], bind


def _reduce(f):
    def prepare(ctx: OpContext):
        _float(ctx)
        shape = ctx.inputs[0].shape
        rank = len(shape)
        given = ctx.attrs.get("axes", ()) or ()
        axes = tuple(sorted({a % rank for a in ctx.ints("axes", len(given), lo=-rank, hi=max(rank - 1, 0))})) \
            if given else tuple(range(rank))
        keep = bool(ctx.one_int("keepdims", 0, 0, 1))
        if ctx.op == "ReduceMax" and any(shape[a] == 0 for a in axes):
            raise EdgeModelError(f"ReduceMax: an empty axis of {shape} has no maximum")
        out = tuple(1 if a in axes else d for a, d in enumerate(shape) if keep or a not in axes)

        def bind(ins, outs, sc):
            x, y = ins[0], outs[0]
            yk = y.reshape(tuple(1 if a in axes else d for a, d in enumerate(shape)))  # keepdims view
            return lambda: f(x, axis=axes, keepdims=True, out=yk)
        return [out], bind
    return prepare


for _name, _f in (("ReduceMean", np.mean), ("ReduceSum", np.sum), ("ReduceMax", np.max)):
    kernel(_name)(_reduce(_f))
