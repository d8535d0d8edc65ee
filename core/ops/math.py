"""Elementwise arithmetic, unary math, comparisons, where, cast and activations.

Each op is one record: inference, kernel factory, gradient and cost side by side.
The tables at the top of each section keep one row per op.
"""
from __future__ import annotations

import math as _math
import numpy as np

from ... import jit
from .. import dtypes as _dt
from ..errors import ShapeError
from ..graph import Tensor
from ..registry import OpDef, elementwise_cost, register
from ..shapes import broadcast, fully_defined
from .base import constant, convert, convert_pair, make
from .erf_approx import _erf_compiled, _erf_float32, gelu_compiled

__all__ = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "floordiv", "mod", "add_n", "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_or", "where", "neg", "abs", "sign", "exp", "log", "sqrt", "rsqrt", "square", "reciprocal", "tanh", "sigmoid", "erf", "floor", "ceil", "logical_not", "cast", "relu", "relu6", "leaky_relu", "gelu", "ones_like", "zeros_like", "reduce_sum_like", "broadcast_like"]


def _out(op: str, inputs, attrs=None, name=None) -> Tensor:
    return make(op, inputs, attrs, name=name).outputs[0]


# ---- broadcasting and its gradient -------------------------------------------------
def _infer_binary(node, out_dtype=None):
    a, b = node.inputs
    if a.dtype != b.dtype:
        raise ShapeError(f"operand dtypes differ: {a.dtype.name} vs {b.dtype.name}")
    return [(out_dtype or a.dtype, broadcast(a.shape, b.shape))]


def _reduce_axes(from_shape, to_shape):
    """Axes to sum over so that a value broadcast to `from_shape` comes back to `to_shape`."""
    lead = len(from_shape) - len(to_shape)
    axes = list(range(lead))
    for i, d in enumerate(to_shape):
        if d == 1 and from_shape[lead + i] != 1:
            axes.append(lead + i)
    return tuple(axes)


def _kernel_reduce_like(node, ctx):
    g, like = node.inputs
    xp = ctx.xp
    if fully_defined(g.shape) and fully_defined(like.shape):
        axes, shape = _reduce_axes(g.shape, like.shape), like.shape
        if not axes:
            return lambda g, like: g.reshape(shape)
        return lambda g, like: xp.sum(g, axis=axes).reshape(shape)

    def run(g, like):
        if g.shape == like.shape:
            return g
        return xp.sum(g, axis=_reduce_axes(g.shape, like.shape)).reshape(like.shape)
    return run


register(OpDef(
    "ReduceSumLike", inputs=("g", "like"),
    infer=lambda node: [(node.inputs[0].dtype, node.inputs[1].shape)],
    kernel=_kernel_reduce_like,
    grad=lambda node, dys: [broadcast_like(dys[0], node.inputs[0]), None],
    cost=elementwise_cost(1.0),
    doc="Sum g over the axes along which `like` was broadcast; the gradient of broadcasting.",
))
register(OpDef(
    "BroadcastLike", inputs=("x", "like"),
    infer=lambda node: [(node.inputs[0].dtype, broadcast(node.inputs[0].shape, node.inputs[1].shape))],
    kernel=lambda node, ctx: (lambda x, like: ctx.xp.broadcast_to(x, ctx.xp.broadcast_shapes(x.shape, like.shape))),
    grad=lambda node, dys: [reduce_sum_like(dys[0], node.inputs[0]), None],
    cost=elementwise_cost(0.0),
))


def reduce_sum_like(g: Tensor, like: Tensor) -> Tensor:
    """g summed down to like's shape; a no-op (no node) when the static shapes already agree."""
    if g.shape == like.shape and fully_defined(g.shape):
        return g
    return _out("ReduceSumLike", (g, like))


def broadcast_like(x: Tensor, like: Tensor) -> Tensor:
    if x.shape == like.shape and fully_defined(x.shape):
        return x
    return _out("BroadcastLike", (x, like))


# ---- binary arithmetic ----------------------------------------------------------------
def _g_add(node, dys):
    dy = dys[0]
    a, b = node.inputs
    return [reduce_sum_like(dy, a), reduce_sum_like(dy, b)]


def _g_sub(node, dys):
    dy = dys[0]
    a, b = node.inputs
    return [reduce_sum_like(dy, a), reduce_sum_like(neg(dy), b)]


def _g_mul(node, dys):
    dy = dys[0]
    a, b = node.inputs
    return [reduce_sum_like(mul(dy, b), a), reduce_sum_like(mul(dy, a), b)]


def _g_div(node, dys):
    dy = dys[0]
    a, b = node.inputs
    y = node.outputs[0]
    return [reduce_sum_like(div(dy, b), a), reduce_sum_like(neg(mul(dy, div(y, b))), b)]


def _g_pow(node, dys):
    dy = dys[0]
    a, b = node.inputs
    y = node.outputs[0]
    da = mul(dy, mul(b, pow(a, sub(b, constant(1, a.dtype)))))
    zero = constant(0, a.dtype)
    safe_log = where(greater(a, zero), log(where(greater(a, zero), a, constant(1, a.dtype))), zero)
    db = mul(dy, mul(y, safe_log))
    return [reduce_sum_like(da, a), reduce_sum_like(db, b)]


def _g_minmax(pick_a):
    def grad(node, dys):
        dy = dys[0]
        a, b = node.inputs
        mask_a = pick_a(a, b)
        zero = constant(0, dy.dtype)
        return [reduce_sum_like(where(mask_a, dy, zero), a),
                reduce_sum_like(where(mask_a, zero, dy), b)]
    return grad


_BINARY = [
    # name, numpy function, gradient, flops per element
    ("Add", "add", _g_add, 1),
    ("Sub", "subtract", _g_sub, 1),
    ("Mul", "multiply", _g_mul, 1),
    ("Div", "divide", _g_div, 1),
    ("Pow", "power", _g_pow, 10),
    ("Maximum", "maximum", _g_minmax(lambda a, b: greater_equal(a, b)), 1),
    ("Minimum", "minimum", _g_minmax(lambda a, b: less_equal(a, b)), 1),
    ("FloorDiv", "floor_divide", None, 1),
    ("Mod", "mod", None, 1),
]
for _name, _fn, _grad, _flops in _BINARY:
    register(OpDef(_name, inputs=("x", "y"), infer=_infer_binary,
                   kernel=(lambda f: lambda node, ctx: getattr(ctx.xp, f))(_fn),
                   grad=_grad, cost=elementwise_cost(_flops)))


def add(x, y, name=None): return _out("Add", convert_pair(x, y), name=name)
def sub(x, y, name=None): return _out("Sub", convert_pair(x, y), name=name)
def mul(x, y, name=None): return _out("Mul", convert_pair(x, y), name=name)
def div(x, y, name=None): return _out("Div", convert_pair(x, y), name=name)
def pow(x, y, name=None): return _out("Pow", convert_pair(x, y), name=name)  # noqa: A001
def maximum(x, y, name=None): return _out("Maximum", convert_pair(x, y), name=name)
def minimum(x, y, name=None): return _out("Minimum", convert_pair(x, y), name=name)
def floordiv(x, y, name=None): return _out("FloorDiv", convert_pair(x, y), name=name)
def mod(x, y, name=None): return _out("Mod", convert_pair(x, y), name=name)


# AddN sums any number of same-shaped tensors: fan-in of gradients.
def _infer_addn(node):
    first = node.inputs[0]
    shape = first.shape
    for t in node.inputs[1:]:
        if t.dtype != first.dtype:
            raise ShapeError(f"AddN operand dtypes differ: {first.dtype.name} vs {t.dtype.name}")
        shape = broadcast(shape, t.shape)
    return [(first.dtype, shape)]


def _kernel_addn(node, ctx):
    xp = ctx.xp
    add_ = xp.add

    def run(*xs):
        acc = add_(xs[0], xs[1])
        if len(xs) > 2 and not isinstance(acc, xp.ndarray):
            acc = xp.array(acc)  # a numpy scalar (0-d operands) cannot take out=
        for x in xs[2:]:
            add_(acc, x, out=acc)
        return acc
    return run


register(OpDef("AddN", inputs=("x0", "x1", "*xs"), infer=_infer_addn, kernel=_kernel_addn,
               grad=lambda node, dys: [reduce_sum_like(dys[0], t) for t in node.inputs],
               cost=elementwise_cost(1.0)))


def add_n(xs, name=None) -> Tensor:
    xs = [convert(x) for x in xs]
    if len(xs) == 1:
        return xs[0]
    return _out("AddN", xs, name=name)


# ---- comparisons and logic -------------------------------------------------------------
_COMPARE = [("Equal", "equal"), ("NotEqual", "not_equal"), ("Less", "less"),
            ("LessEqual", "less_equal"), ("Greater", "greater"), ("GreaterEqual", "greater_equal"),
            ("LogicalAnd", "logical_and"), ("LogicalOr", "logical_or")]
for _name, _fn in _COMPARE:
    register(OpDef(_name, inputs=("x", "y"), infer=lambda node: _infer_binary(node, _dt.bool_),
                   kernel=(lambda f: lambda node, ctx: getattr(ctx.xp, f))(_fn),
                   grad=lambda node, dys: [None, None], cost=elementwise_cost(1)))


def equal(x, y, name=None): return _out("Equal", convert_pair(x, y), name=name)
def not_equal(x, y, name=None): return _out("NotEqual", convert_pair(x, y), name=name)
def less(x, y, name=None): return _out("Less", convert_pair(x, y), name=name)
def less_equal(x, y, name=None): return _out("LessEqual", convert_pair(x, y), name=name)
def greater(x, y, name=None): return _out("Greater", convert_pair(x, y), name=name)
def greater_equal(x, y, name=None): return _out("GreaterEqual", convert_pair(x, y), name=name)
def logical_and(x, y, name=None): return _out("LogicalAnd", convert_pair(x, y), name=name)
def logical_or(x, y, name=None): return _out("LogicalOr", convert_pair(x, y), name=name)


def _infer_where(node):
    c, a, b = node.inputs
    if c.dtype != _dt.bool_:
        raise ShapeError(f"Where condition must be bool, got {c.dtype.name}")
    if a.dtype != b.dtype:
        raise ShapeError(f"Where branches differ in dtype: {a.dtype.name} vs {b.dtype.name}")
    return [(a.dtype, broadcast(c.shape, broadcast(a.shape, b.shape)))]


def _g_where(node, dys):
    c, a, b = node.inputs
    dy = dys[0]
    zero = constant(0, dy.dtype)
    return [None, reduce_sum_like(where(c, dy, zero), a), reduce_sum_like(where(c, zero, dy), b)]


register(OpDef("Where", inputs=("cond", "x", "y"), infer=_infer_where,
               kernel=lambda node, ctx: ctx.xp.where, grad=_g_where, cost=elementwise_cost(1)))


def where(cond, x, y, name=None) -> Tensor:
    cond = convert(cond)
    x, y = convert_pair(x, y)
    return _out("Where", (cond, x, y), name=name)


# ---- unary math -------------------------------------------------------------------------
def _infer_unary(kinds: str):
    def infer(node):
        t = node.inputs[0]
        if t.dtype.kind not in kinds:
            want = {"f": "a float", "fiu": "a numeric", "b": "a bool"}.get(kinds, kinds)
            raise ShapeError(f"needs {want} input, got {t.dtype.name}")
        return [(t.dtype, t.shape)]
    return infer


def _k(fn_name):
    return lambda node, ctx: getattr(ctx.xp, fn_name)


def _kernel_rsqrt(node, ctx):
    xp = ctx.xp
    return lambda x: xp.reciprocal(xp.sqrt(x))


def _kernel_sigmoid(node, ctx):
    xp = ctx.xp
    # 0.5 * (1 + tanh(x/2)) never overflows, unlike 1 / (1 + exp(-x))
    def run(x):
        y = xp.multiply(x, 0.5, dtype=x.dtype)
        xp.tanh(y, out=y)
        y += 1
        y *= 0.5
        return y
    return run


def _kernel_erf(node, ctx):
    xp = ctx.xp
    if node.outputs[0].dtype.name == "float32" and xp is np:
        def erf32(x):
            return _erf_compiled(x) if jit.available() else _erf_float32(np, x)
        return erf32
    if node.outputs[0].dtype.name in ("float16", "float32"):
        return lambda x: _erf_float32(xp, x).astype(x.dtype, copy=False)
    if xp is np or not hasattr(xp, "ElementwiseKernel"):  # float64: scipy's ufunc (numpy, the CI stand-in GPU)
        from scipy.special import erf  # deferred: scipy is a heavy or optional dependency
        return erf
    # deferred: cupyx is a heavy or optional dependency
    import cupyx.scipy.special as csp  # GPU backend only
    return csp.erf


_SQRT_2_OVER_PI = 2.0 / _math.sqrt(_math.pi)

_UNARY = [
    # name, kernel factory, input kinds, gradient (node, x, y, dy) -> dx, flops per element
    ("Neg", _k("negative"), "fiu", lambda n, x, y, dy: neg(dy), 1),
    ("Abs", _k("abs"), "fiu", lambda n, x, y, dy: mul(dy, sign(x)), 1),
    ("Sign", _k("sign"), "fiu", lambda n, x, y, dy: None, 1),
    ("Exp", _k("exp"), "f", lambda n, x, y, dy: mul(dy, y), 10),
    ("Log", _k("log"), "f", lambda n, x, y, dy: div(dy, x), 10),
    ("Sqrt", _k("sqrt"), "f", lambda n, x, y, dy: div(mul(dy, 0.5), y), 4),
    ("Rsqrt", _kernel_rsqrt, "f", lambda n, x, y, dy: mul(dy, mul(-0.5, div(y, x))), 5),
    ("Square", _k("square"), "fiu", lambda n, x, y, dy: mul(dy, mul(2.0, x)), 1),
    ("Reciprocal", _k("reciprocal"), "f", lambda n, x, y, dy: neg(mul(dy, square(y))), 1),
    ("Tanh", _k("tanh"), "f", lambda n, x, y, dy: _out("TanhGrad", (y, dy)), 10),
    ("Sigmoid", _kernel_sigmoid, "f", lambda n, x, y, dy: mul(dy, mul(y, sub(1.0, y))), 12),
    ("Erf", _kernel_erf, "f", lambda n, x, y, dy: mul(dy, mul(_SQRT_2_OVER_PI, exp(neg(square(x))))), 20),
    ("Floor", _k("floor"), "f", lambda n, x, y, dy: None, 1),
    ("Ceil", _k("ceil"), "f", lambda n, x, y, dy: None, 1),
    ("LogicalNot", _k("logical_not"), "b", lambda n, x, y, dy: None, 1),
]


def _unary_grad(f):
    def grad(node, dys):
        if dys[0] is None:
            return [None]
        return [f(node, node.inputs[0], node.outputs[0], dys[0])]
    return grad


for _name, _kern, _kinds, _grad, _flops in _UNARY:
    register(OpDef(_name, inputs=("x",), infer=_infer_unary(_kinds), kernel=_kern,
                   grad=_unary_grad(_grad), cost=elementwise_cost(_flops)))


def neg(x, name=None): return _out("Neg", (convert(x),), name=name)
def abs(x, name=None): return _out("Abs", (convert(x),), name=name)  # noqa: A001
def sign(x, name=None): return _out("Sign", (convert(x),), name=name)
def exp(x, name=None): return _out("Exp", (convert(x),), name=name)
def log(x, name=None): return _out("Log", (convert(x),), name=name)
def sqrt(x, name=None): return _out("Sqrt", (convert(x),), name=name)
def rsqrt(x, name=None): return _out("Rsqrt", (convert(x),), name=name)
def square(x, name=None): return _out("Square", (convert(x),), name=name)
def reciprocal(x, name=None): return _out("Reciprocal", (convert(x),), name=name)
def tanh(x, name=None): return _out("Tanh", (convert(x),), name=name)
def sigmoid(x, name=None): return _out("Sigmoid", (convert(x),), name=name)
def erf(x, name=None): return _out("Erf", (convert(x),), name=name)
def floor(x, name=None): return _out("Floor", (convert(x),), name=name)
def ceil(x, name=None): return _out("Ceil", (convert(x),), name=name)
def logical_not(x, name=None): return _out("LogicalNot", (convert(x),), name=name)


def _kernel_tanh_grad(node, ctx):
    xp = ctx.xp

    def run(y, dy):  # dy * (1 - y^2) with one temporary
        t = xp.multiply(y, y)
        xp.subtract(1, t, out=t)
        t *= dy
        return t
    return run


register(OpDef("TanhGrad", inputs=("y", "dy"), infer=lambda node: [(node.inputs[1].dtype, node.inputs[1].shape)],
               kernel=_kernel_tanh_grad, cost=elementwise_cost(3),
               grad=lambda node, dys: [mul(dys[0], mul(-2.0, mul(node.inputs[0], node.inputs[1]))),
                                       mul(dys[0], sub(1.0, square(node.inputs[0])))],
               doc="dy * (1 - y^2): the gradient of tanh from its output."))


# ---- cast ---------------------------------------------------------------------------------
def _g_cast(node, dys):
    x = node.inputs[0]
    if dys[0] is None or not _dt.is_float(x.dtype) or not _dt.is_float(node.outputs[0].dtype):
        return [None]
    return [cast(dys[0], x.dtype)]


register(OpDef("Cast", inputs=("x",), attrs={"dtype": None},
               infer=lambda node: [(node.attrs["dtype"], node.inputs[0].shape)],
               kernel=lambda node, ctx: (lambda x, d=node.attrs["dtype"]: x.astype(d, copy=False)),
               grad=_g_cast, cost=elementwise_cost(1)))


def cast(x, dtype, name=None) -> Tensor:
    x = convert(x)
    dtype = _dt.as_dtype(dtype)
    if x.dtype == dtype:
        return x
    return _out("Cast", (x,), {"dtype": dtype}, name=name)


# ---- activations -----------------------------------------------------------------------------
def _kernel_relu(node, ctx):
    xp = ctx.xp
    return lambda x: xp.maximum(x, 0, dtype=x.dtype)


def _kernel_relu6(node, ctx):
    xp = ctx.xp
    return lambda x: xp.clip(x, 0, 6, dtype=x.dtype)


def _kernel_leaky(node, ctx):
    xp, a = ctx.xp, node.attrs["alpha"]
    return lambda x: xp.where(x > 0, x, x * x.dtype.type(a))


def _kernel_gelu(node, ctx):
    xp = ctx.xp
    if node.attrs["approximate"] == "tanh":
        c = _math.sqrt(2.0 / _math.pi)
        return lambda x: 0.5 * x * (1 + xp.tanh(c * (x + 0.044715 * x ** 3)))
    erf_ = _kernel_erf(node, ctx)
    inv = 1.0 / _math.sqrt(2.0)

    def numpy_gelu(x):
        return (0.5 * x * (1 + erf_(x * x.dtype.type(inv)))).astype(x.dtype, copy=False)
    if node.outputs[0].dtype.name != "float32" or xp is not np:
        return numpy_gelu
    return lambda x: gelu_compiled(x) if jit.available() else numpy_gelu(x)




def _kernel_relu_grad(node, ctx):
    xp = ctx.xp
    lo, hi = node.attrs["lo"], node.attrs["hi"]
    mul = xp.multiply  # dy * mask is ~6x faster than where(mask, dy, 0) in numpy

    def numpy_path(dy, x):
        return mul(dy, x > lo) if hi is None else mul(dy, (x > lo) & (x < hi))
    if xp is not np:
        return numpy_path
    # cycle: core.ops.math <-> core.ops.depthwise (via core.ops.fused, core.ops.linalg)
    from .depthwise import compiled_ok

    def run(dy, x):
        if dy.dtype == x.dtype and dy.shape == x.shape and compiled_ok(xp, x.dtype):
            # deferred: jit.elementwise loads numba
            from ...jit.elementwise import window_grad  # one pass instead of three or four
            out = np.empty(x.shape, x.dtype)
            window_grad(np.ascontiguousarray(dy).reshape(-1), np.ascontiguousarray(x).reshape(-1), lo,
                        np.inf if hi is None else hi, out.reshape(-1))
            return out
        return numpy_path(dy, x)
    return run


def _g_gelu(node, dys):
    x, dy = node.inputs[0], dys[0]
    if node.attrs["approximate"] == "tanh":
        c = _math.sqrt(2.0 / _math.pi)
        u = mul(c, add(x, mul(0.044715, pow(x, 3.0))))
        t = tanh(u)
        du = mul(c, add(1.0, mul(3 * 0.044715, square(x))))
        d = add(mul(0.5, add(1.0, t)), mul(mul(0.5, x), mul(sub(1.0, square(t)), du)))
        return [mul(dy, d)]
    cdf = mul(0.5, add(1.0, erf(mul(x, 1.0 / _math.sqrt(2.0)))))
    pdf = mul(1.0 / _math.sqrt(2 * _math.pi), exp(mul(-0.5, square(x))))
    return [mul(dy, add(cdf, mul(x, pdf)))]


register(OpDef("ReluGrad", inputs=("dy", "x"), attrs={"lo": 0.0, "hi": None},
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[0].shape)],
               kernel=_kernel_relu_grad, cost=elementwise_cost(2),
               doc="dy where lo < x (< hi): the gradient of relu and relu6."))


def max_pool_grad_through_relu(relu_node, dys):
    """The gradient of a Relu whose output gradient is exactly a MaxPoolGrad of that output, as
    one MaxPoolGrad (else None). ReluGrad(MaxPoolGrad(r, y, dy), r) == MaxPoolGrad(r, y, dy * (y > 0))
    exactly: a pooled gradient lands only where r equals its window's maximum y, so r > 0 there
    if and only if y > 0. The relu's mask then costs one op at the pooled size instead of a
    full-size pass (MaxPoolGrad's `through_relu`, core/ops/conv.py). Relu's gradient asks this first."""
    d = dys[0] if dys else None
    if relu_node.op != "Relu" or not isinstance(d, Tensor) or d.node.op != "MaxPoolGrad":
        return None
    pool_grad = d.node
    r = pool_grad.inputs[0]
    if pool_grad.attrs["through_relu"] or r.node is not relu_node or r.index != 0:
        return None
    return [make("MaxPoolGrad", tuple(pool_grad.inputs), {**pool_grad.attrs, "through_relu": True}).outputs[0]]


register(OpDef("Relu", inputs=("x",), infer=_infer_unary("fi"), kernel=_kernel_relu,
               grad=lambda node, dys: (max_pool_grad_through_relu(node, dys)  # relu -> max pool: one op
                                       or [_out("ReluGrad", (dys[0], node.outputs[0]))]),
               cost=elementwise_cost(1)))
register(OpDef("Relu6", inputs=("x",), infer=_infer_unary("f"), kernel=_kernel_relu6,
               grad=lambda node, dys: [_out("ReluGrad", (dys[0], node.inputs[0]), {"hi": 6.0})],
               cost=elementwise_cost(2)))
register(OpDef("LeakyRelu", inputs=("x",), attrs={"alpha": 0.2}, infer=_infer_unary("f"),
               kernel=_kernel_leaky, cost=elementwise_cost(2),
               grad=lambda node, dys: [where(greater(node.inputs[0], 0.0), dys[0],
                                             mul(dys[0], node.attrs["alpha"]))]))
register(OpDef("Gelu", inputs=("x",), attrs={"approximate": "none"}, infer=_infer_unary("f"),
               kernel=_kernel_gelu, grad=_g_gelu, cost=elementwise_cost(25)))


def relu(x, name=None): return _out("Relu", (convert(x),), name=name)
def relu6(x, name=None): return _out("Relu6", (convert(x),), name=name)
def leaky_relu(x, alpha: float = 0.2, name=None): return _out("LeakyRelu", (convert(x),), {"alpha": float(alpha)}, name=name)


def gelu(x, approximate: str = "none", name=None) -> Tensor:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return _out("Gelu", (convert(x),), {"approximate": approximate}, name=name)


# ---- operator overloading on Tensor ------------------------------------------------------
def _install_operators() -> None:
    T = Tensor
    T.__add__ = lambda a, b: add(a, b)
    T.__radd__ = lambda a, b: add(b, a)
    T.__sub__ = lambda a, b: sub(a, b)
    T.__rsub__ = lambda a, b: sub(b, a)
    T.__mul__ = lambda a, b: mul(a, b)
    T.__rmul__ = lambda a, b: mul(b, a)
    T.__truediv__ = lambda a, b: div(a, b)
    T.__rtruediv__ = lambda a, b: div(b, a)
    T.__floordiv__ = lambda a, b: floordiv(a, b)
    T.__mod__ = lambda a, b: mod(a, b)
    T.__pow__ = lambda a, b: pow(a, b)
    T.__rpow__ = lambda a, b: pow(b, a)
    T.__neg__ = lambda a: neg(a)
    T.__abs__ = lambda a: abs(a)
    T.__lt__ = lambda a, b: less(a, b)
    T.__le__ = lambda a, b: less_equal(a, b)
    T.__gt__ = lambda a, b: greater(a, b)
    T.__ge__ = lambda a, b: greater_equal(a, b)
    T.__and__ = lambda a, b: logical_and(a, b)
    T.__or__ = lambda a, b: logical_or(a, b)
    T.__invert__ = lambda a: logical_not(a)


_install_operators()


# ---- ones_like / zeros_like ------------------------------------------------------------------
for _name, _fill in (("OnesLike", 1), ("ZerosLike", 0)):
    register(OpDef(_name, inputs=("x",), infer=lambda node: [(node.inputs[0].dtype, node.inputs[0].shape)],
                   kernel=(lambda v: lambda node, ctx: (lambda x: ctx.xp.full(ctx.xp.shape(x), v, dtype=node.inputs[0].dtype)))(_fill),
                   grad=lambda node, dys: [None], cost=elementwise_cost(0)))


def ones_like(x, name=None): return _out("OnesLike", (convert(x),), name=name)
def zeros_like(x, name=None): return _out("ZerosLike", (convert(x),), name=name)
