"""Activations beyond relu/gelu (ONNX's HardSigmoid, HardSwish, PRelu, Elu, Selu, Softplus,
Softsign, ThresholdedRelu, Celu): kernel, inference, gradient and cost, one record each."""
from __future__ import annotations

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import OpDef, elementwise_cost, register
from ..shapes import broadcast
from .base import constant, convert, make
from .math import (abs, add, div, exp, greater, less, mul, reduce_sum_like, sigmoid, square, sub,  # noqa: A004
                   where)

__all__ = ["hard_sigmoid", "hard_swish", "prelu", "elu", "selu", "softplus", "softsign", "thresholded_relu", "celu"]

SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875


def _infer_float(node):
    t = node.inputs[0]
    if t.dtype.kind != "f":
        raise ShapeError(f"needs a float input, got {t.dtype.name}")
    return [(t.dtype, t.shape)]


def _c(x: Tensor, v: float) -> Tensor:
    return constant(v, x.dtype)


# ---- kernels: pure functions of ctx.xp, constants in the input's dtype -----------------------------
def _k_hard_sigmoid(node, ctx):
    xp, a, b = ctx.xp, node.attrs["alpha"], node.attrs["beta"]
    return lambda x: xp.clip(x * x.dtype.type(a) + x.dtype.type(b), 0, 1).astype(x.dtype, copy=False)


def _k_hard_swish(node, ctx):
    xp = ctx.xp
    return lambda x: x * xp.clip(x * x.dtype.type(1 / 6) + x.dtype.type(0.5), 0, 1).astype(x.dtype, copy=False)


def _k_elu(node, ctx):
    xp, a = ctx.xp, node.attrs["alpha"]
    return lambda x: xp.where(x > 0, x, xp.expm1(xp.minimum(x, 0)) * x.dtype.type(a))


def _k_selu(node, ctx):
    xp, a, g = ctx.xp, node.attrs["alpha"], node.attrs["gamma"]
    return lambda x: xp.where(x > 0, x, xp.expm1(xp.minimum(x, 0)) * x.dtype.type(a)) * x.dtype.type(g)


def _k_celu(node, ctx):
    xp, a = ctx.xp, node.attrs["alpha"]
    return lambda x: xp.where(x > 0, x, xp.expm1(xp.minimum(x, 0) / x.dtype.type(a)) * x.dtype.type(a))


def _k_softplus(node, ctx):
    xp = ctx.xp  # max(x, 0) + log1p(exp(-|x|)): never overflows
    return lambda x: xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))


def _k_softsign(node, ctx):
    xp = ctx.xp
    return lambda x: x / (xp.abs(x) + x.dtype.type(1))


def _k_thresholded(node, ctx):
    xp, a = ctx.xp, node.attrs["alpha"]
    return lambda x: xp.where(x > x.dtype.type(a), x, x.dtype.type(0))


# ---- gradients, built from primitives (so they are differentiable again) -----------------------------
def _g_hard_sigmoid(node, x, y, dy):
    a = node.attrs["alpha"]
    mask = where(greater(y, _c(x, 0)), where(less(y, _c(x, 1)), _c(x, a), _c(x, 0)), _c(x, 0))
    return mul(dy, mask)


def _g_hard_swish(node, x, y, dy):
    # d/dx x*clip(x/6 + 1/2, 0, 1) = 0 below -3, 1 above 3, x/3 + 1/2 between
    mid = add(div(x, _c(x, 3.0)), _c(x, 0.5))
    d = where(less(x, _c(x, -3.0)), _c(x, 0), where(greater(x, _c(x, 3.0)), _c(x, 1), mid))
    return mul(dy, d)


def _g_elu(node, x, y, dy):
    return where(greater(x, _c(x, 0)), dy, mul(dy, add(y, _c(x, node.attrs["alpha"]))))


def _g_selu(node, x, y, dy):
    a, g = node.attrs["alpha"], node.attrs["gamma"]
    return where(greater(x, _c(x, 0)), mul(dy, _c(x, g)), mul(dy, add(y, _c(x, a * g))))


def _g_celu(node, x, y, dy):
    return where(greater(x, _c(x, 0)), dy, mul(dy, add(div(y, _c(x, node.attrs["alpha"])), _c(x, 1))))


def _g_softplus(node, x, y, dy):
    return mul(dy, sigmoid(x))


def _g_softsign(node, x, y, dy):
    return div(dy, square(add(abs(x), _c(x, 1))))


def _g_thresholded(node, x, y, dy):
    return where(greater(x, _c(x, node.attrs["alpha"])), dy, mul(dy, _c(x, 0)))


def _unary_grad(f):
    def grad(node, dys):
        return [None] if dys[0] is None else [f(node, node.inputs[0], node.outputs[0], dys[0])]
    return grad


_UNARY = [
    # name, attrs, kernel factory, gradient (node, x, y, dy) -> dx, flops per element
    ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}, _k_hard_sigmoid, _g_hard_sigmoid, 3),
    ("HardSwish", {}, _k_hard_swish, _g_hard_swish, 4),
    ("Elu", {"alpha": 1.0}, _k_elu, _g_elu, 12),
    ("Selu", {"alpha": SELU_ALPHA, "gamma": SELU_GAMMA}, _k_selu, _g_selu, 13),
    ("Celu", {"alpha": 1.0}, _k_celu, _g_celu, 13),
    ("Softplus", {}, _k_softplus, _g_softplus, 20),
    ("Softsign", {}, _k_softsign, _g_softsign, 3),
    ("ThresholdedRelu", {"alpha": 1.0}, _k_thresholded, _g_thresholded, 2),
]
for _name, _attrs, _kern, _grad, _flops in _UNARY:
    register(OpDef(_name, inputs=("x",), attrs=_attrs, infer=_infer_float, kernel=_kern,
                   grad=_unary_grad(_grad), cost=elementwise_cost(_flops)))


# ---- PRelu: a learned slope, broadcast against x --------------------------------------------------------
def _infer_prelu(node):
    x, s = node.inputs
    if x.dtype != s.dtype:
        raise ShapeError(f"PRelu slope is {s.dtype.name}, input is {x.dtype.name}")
    return [(x.dtype, broadcast(x.shape, s.shape))]


def _k_prelu(node, ctx):
    xp = ctx.xp
    return lambda x, s: xp.where(x < 0, x * s, x)


def _g_prelu(node, dys):
    x, s = node.inputs
    dy = dys[0]
    neg = less(x, _c(x, 0))
    zero = _c(x, 0)
    return [reduce_sum_like(where(neg, mul(dy, s), dy), x), reduce_sum_like(where(neg, mul(dy, x), zero), s)]


register(OpDef("PRelu", inputs=("x", "slope"), infer=_infer_prelu, kernel=_k_prelu, grad=_g_prelu,
               cost=elementwise_cost(2)))


def _out(op, x, attrs=None, name=None) -> Tensor:
    return make(op, (convert(x),), attrs, name=name).outputs[0]


def hard_sigmoid(x, alpha: float = 0.2, beta: float = 0.5, name=None) -> Tensor:
    return _out("HardSigmoid", x, {"alpha": float(alpha), "beta": float(beta)}, name)


def hard_swish(x, name=None) -> Tensor:
    return _out("HardSwish", x, name=name)


def elu(x, alpha: float = 1.0, name=None) -> Tensor:
    return _out("Elu", x, {"alpha": float(alpha)}, name)


def selu(x, alpha: float = SELU_ALPHA, gamma: float = SELU_GAMMA, name=None) -> Tensor:
    return _out("Selu", x, {"alpha": float(alpha), "gamma": float(gamma)}, name)


def celu(x, alpha: float = 1.0, name=None) -> Tensor:
    return _out("Celu", x, {"alpha": float(alpha)}, name)


def softplus(x, name=None) -> Tensor:
    return _out("Softplus", x, name=name)


def softsign(x, name=None) -> Tensor:
    return _out("Softsign", x, name=name)


def thresholded_relu(x, alpha: float = 1.0, name=None) -> Tensor:
    return _out("ThresholdedRelu", x, {"alpha": float(alpha)}, name)


def prelu(x, slope, name=None) -> Tensor:
    x = convert(x)
    return make("PRelu", (x, convert(slope, dtype=x.dtype)), name=name).outputs[0]
