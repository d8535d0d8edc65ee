"""Elementwise math added for ONNX coverage (Round, trigonometric and hyperbolic functions and their inverses,
IsNaN, IsInf, FMod), one record each."""
from __future__ import annotations

from .. import dtypes as _dt
from ..errors import ShapeError
from ..graph import Tensor
from ..registry import OpDef, elementwise_cost, register
from .base import convert, convert_pair, make
from .math import _infer_binary, add, ceil, div, floor, greater, mul, neg, reduce_sum_like, rsqrt, square, sub, where

__all__ = ["round", "sin", "cos", "tan", "atan", "sinh", "cosh", "asin", "acos", "asinh", "acosh", "atanh", "isnan",
           "isinf", "fmod"]


def _infer(kinds: str, out_dtype=None):
    def infer(node):
        t = node.inputs[0]
        if t.dtype.kind not in kinds:
            raise ShapeError(f"needs a {'float' if kinds == 'f' else 'numeric'} input, got {t.dtype.name}")
        return [(out_dtype or t.dtype, t.shape)]
    return infer


def _k(fn: str):
    return lambda node, ctx: getattr(ctx.xp, fn)


def _k_isinf(node, ctx):
    xp, pos, negv = ctx.xp, node.attrs["detect_positive"], node.attrs["detect_negative"]
    if pos and negv:
        return xp.isinf
    if pos:
        return lambda x: xp.isposinf(x)
    if negv:
        return lambda x: xp.isneginf(x)
    return lambda x: xp.zeros(x.shape, bool)


def _none(node, dys):
    return [None]


def _grad(f):
    def grad(node, dys):
        return [None] if dys[0] is None else [f(node.inputs[0], node.outputs[0], dys[0])]
    return grad


_UNARY = [
    # name, attrs, kernel factory, input kinds, output dtype, gradient, flops per element
    ("Round", {}, _k("rint"), "f", None, _none, 1),  # rint rounds half to even, as ONNX Round does
    ("Sin", {}, _k("sin"), "f", None, _grad(lambda x, y, dy: mul(dy, cos(x))), 10),
    ("Cos", {}, _k("cos"), "f", None, _grad(lambda x, y, dy: neg(mul(dy, sin(x)))), 10),
    ("Tan", {}, _k("tan"), "f", None, _grad(lambda x, y, dy: mul(dy, add(square(y), 1.0))), 12),
    ("Atan", {}, _k("arctan"), "f", None, _grad(lambda x, y, dy: div(dy, add(square(x), 1.0))), 12),
    ("Sinh", {}, _k("sinh"), "f", None, _grad(lambda x, y, dy: mul(dy, cosh(x))), 12),
    ("Cosh", {}, _k("cosh"), "f", None, _grad(lambda x, y, dy: mul(dy, sinh(x))), 12),
    ("Asin", {}, _k("arcsin"), "f", None, _grad(lambda x, y, dy: mul(dy, rsqrt(sub(1.0, square(x))))), 12),
    ("Acos", {}, _k("arccos"), "f", None, _grad(lambda x, y, dy: neg(mul(dy, rsqrt(sub(1.0, square(x)))))), 12),
    ("Asinh", {}, _k("arcsinh"), "f", None, _grad(lambda x, y, dy: mul(dy, rsqrt(add(square(x), 1.0)))), 12),
    ("Acosh", {}, _k("arccosh"), "f", None, _grad(lambda x, y, dy: mul(dy, rsqrt(sub(square(x), 1.0)))), 12),
    ("Atanh", {}, _k("arctanh"), "f", None, _grad(lambda x, y, dy: div(dy, sub(1.0, square(x)))), 12),
    ("IsNaN", {}, _k("isnan"), "f", _dt.bool_, _none, 1),
    ("IsInf", {"detect_positive": True, "detect_negative": True}, _k_isinf, "f", _dt.bool_, _none, 1),
]
for _name, _attrs, _kern, _kinds, _odt, _g, _flops in _UNARY:
    register(OpDef(_name, inputs=("x",), attrs=_attrs, infer=_infer(_kinds, _odt), kernel=_kern, grad=_g,
                   cost=elementwise_cost(_flops)))


# ---- FMod: the remainder with the dividend's sign (C fmod; ONNX Mod with fmod=1) ---------------------
def _g_fmod(node, dys):
    a, b = node.inputs
    dy = dys[0]
    if a.dtype.kind != "f":
        return [None, None]
    # fmod(a, b) = a - trunc(a / b) * b: da = dy, db = -trunc(a / b) * dy
    q = div(a, b)
    trunc = where(greater(q, 0.0), floor(q), ceil(q))
    return [reduce_sum_like(dy, a), reduce_sum_like(neg(mul(dy, trunc)), b)]


register(OpDef("FMod", inputs=("x", "y"), infer=_infer_binary, kernel=_k("fmod"), grad=_g_fmod,
               cost=elementwise_cost(2)))


def _out(op, x, attrs=None, name=None) -> Tensor:
    return make(op, (convert(x),), attrs, name=name).outputs[0]


def round(x, name=None) -> Tensor:  # noqa: A001
    """Round half to even (ONNX Round, numpy rint)."""
    return _out("Round", x, name=name)


def sin(x, name=None) -> Tensor: return _out("Sin", x, name=name)
def cos(x, name=None) -> Tensor: return _out("Cos", x, name=name)
def tan(x, name=None) -> Tensor: return _out("Tan", x, name=name)
def atan(x, name=None) -> Tensor: return _out("Atan", x, name=name)
def sinh(x, name=None) -> Tensor: return _out("Sinh", x, name=name)
def cosh(x, name=None) -> Tensor: return _out("Cosh", x, name=name)
def asin(x, name=None) -> Tensor: return _out("Asin", x, name=name)
def acos(x, name=None) -> Tensor: return _out("Acos", x, name=name)
def asinh(x, name=None) -> Tensor: return _out("Asinh", x, name=name)
def acosh(x, name=None) -> Tensor: return _out("Acosh", x, name=name)
def atanh(x, name=None) -> Tensor: return _out("Atanh", x, name=name)
def isnan(x, name=None) -> Tensor: return _out("IsNaN", x, name=name)


def isinf(x, detect_positive: bool = True, detect_negative: bool = True, name=None) -> Tensor:
    return _out("IsInf", x, {"detect_positive": bool(detect_positive), "detect_negative": bool(detect_negative)}, name)


def fmod(x, y, name=None) -> Tensor:
    """Remainder with the sign of x (C fmod); `mod` follows the sign of y."""
    return make("FMod", convert_pair(x, y), name=name).outputs[0]
