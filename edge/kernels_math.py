"""fp32 edge kernels a transformer block needs beyond matmul and layer norm: Gelu (exact, through erfc,
or the tanh form), Erf (ONNX exports of gelu below opset 20 spell it out with Erf) and the reductions
ReduceMean, ReduceSum, ReduceMax over any axes. Same contract as
kernels.py: prepare(ctx) -> (output shapes, bind), steps writing into arena views with out=."""
from __future__ import annotations

import math

import numpy as np

from .format import EdgeModelError
from .kernel_tables import kernel
from .opcontext import OpContext, clip_ufunc

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
    coef = [np.float32(c) for c in _ERFC]
    half, one = np.float32(0.5), np.float32(1.0)
    r2, c = np.float32(1 / math.sqrt(2)), np.float32(math.sqrt(2 / math.pi))
    k3 = np.float32(0.044715)

    def bind(ins, outs, sc):
        x, y, t, p = ins[0], outs[0], sc[i_t], sc[i_p]
        add, mul, sub, div, exp, absolute, copyto = (np.add, np.multiply, np.subtract, np.divide, np.exp, np.abs,
                                                     np.copyto)
        greater_equal = np.greater_equal

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
            # the weight s + p - 2 s p for s = (x >= 0): 1 - p above, p exactly below (numpy's masked copies
            # and heaviside take 20-40x a streaming pass here)
            greater_equal(x, 0, out=t, casting="unsafe")
            mul(t, p, out=y)
            add(t, p, out=t)
            sub(t, y, out=t)
            sub(t, y, out=t)
            mul(x, t, out=y)
        return run_tanh if approx == "tanh" else run_exact
    return [shape], bind


# erf(x) = (2 / sqrt pi) (x - x^3 / 3 + x^5 / 10 - ...) near 0, where 1 - erfc(x) would cancel: the terms
# through x^11, below 2e-8 relative for |x| < 1/2
_ERF_SERIES = tuple(2 / math.sqrt(math.pi) * (-1) ** k / (math.factorial(k) * (2 * k + 1)) for k in range(6))
_ERF_SMALL = 0.5


@kernel("Erf")
def erf(ctx: OpContext):
    """sign(x) (1 - erfc(|x|)) from the erfc fit, and the series near 0."""
    _float(ctx)
    shape = ctx.inputs[0].shape
    i_u, i_t, i_p = ctx.scratch(shape, np.float32), ctx.scratch(shape, np.float32), ctx.scratch(shape, np.float32)
    coef = [np.float32(c) for c in _ERFC]
    series = [np.float32(c) for c in _ERF_SERIES]
    one, small = np.float32(1.0), np.float32(_ERF_SMALL)

    def bind(ins, outs, sc):
        x, y, u, t, p = ins[0], outs[0], sc[i_u], sc[i_t], sc[i_p]
        add, mul, sub, div, exp, copyto = np.add, np.multiply, np.subtract, np.divide, np.exp, np.copyto
        half = np.float32(0.5)

        def run():
            np.abs(x, out=u)
            mul(u, half, out=t)
            add(t, one, out=t)
            div(one, t, out=t)  # t = 1 / (1 + u / 2)
            copyto(p, coef[-1])
            for a in coef[-2:0:-1]:  # Horner: P(t) - c0
                mul(p, t, out=p)
                add(p, a, out=p)
            mul(p, t, out=p)
            add(p, coef[0], out=p)
            mul(u, u, out=y)
            sub(p, y, out=p)  # -u^2 + P(t)
            exp(p, out=p)
            mul(p, t, out=p)  # erfc(|x|)
            sub(one, p, out=p)
            np.copysign(p, x, out=p)  # erf(x), away from 0
            clip_ufunc(x, -small, small, out=u)  # the series near 0 (clipped: it would overflow far out)
            mul(u, u, out=t)
            copyto(y, series[-1])
            for a in series[-2::-1]:
                mul(y, t, out=y)
                add(y, a, out=y)
            mul(y, u, out=y)
            np.greater_equal(np.abs(x, out=t), small, out=t, casting="unsafe")  # 1 away from 0, else 0
            sub(p, y, out=p)
            mul(p, t, out=p)
            add(y, p, out=y)  # the series, or the series + (erfc's value - the series)
        return run
    return [shape], bind


def _reduce(f):
    def prepare(ctx: OpContext):
        _float(ctx)
        shape = ctx.inputs[0].shape
        rank = len(shape)
        given = ctx.attrs.get("axes", ()) or ()
        if not isinstance(given, tuple):
            raise EdgeModelError(f"{ctx.op}: attribute 'axes' = {given!r} is not a list of ints")
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
# the TFLite writer's Erf composite (converters/tflite_write_act.py) evaluates the same fit
ERFC_FIT = _ERFC
