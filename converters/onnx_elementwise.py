"""ONNX import handlers: elementwise math, activations, casts, Dropout, softmax, reductions, ArgMax/Min."""
from __future__ import annotations

import numpy as np

import isthmus.core as ism

from isthmus.core.dtypes import as_dtype

from .onnx_import import ImportError_, _attrs, _s, handler, refuse_unless

_BINARY = {"Add": ism.add, "Sub": ism.sub, "Mul": ism.mul, "Div": ism.div, "Pow": ism.pow,
           "Equal": ism.equal, "Less": ism.less, "Greater": ism.greater, "LessOrEqual": ism.less_equal,
           "GreaterOrEqual": ism.greater_equal, "And": ism.logical_and, "Or": ism.logical_or}
_UNARY = {"Neg": ism.neg, "Abs": ism.abs, "Exp": ism.exp, "Log": ism.log, "Sqrt": ism.sqrt,
          "Reciprocal": ism.reciprocal, "Tanh": ism.tanh, "Sigmoid": ism.sigmoid, "Erf": ism.erf, "Relu": ism.relu,
          "Floor": ism.floor, "Ceil": ism.ceil, "Sign": ism.sign, "Not": ism.logical_not, "Identity": ism.identity}


def _binary(fn):
    def h(c, node, ins):
        a, b = ins
        if a.dtype != b.dtype:  # ONNX Pow allows mixed types
            b = ism.cast(b, a.dtype)
        if fn is ism.div and a.dtype.kind in "iu":
            return [_trunc_div(a, b)]
        return [fn(a, b)]
    return h


def _trunc_div(a, b):
    """ONNX integer Div truncates toward zero; numpy's // floors."""
    q = ism.floordiv(a, b)
    if a.dtype.kind == "u":
        return q
    zero = ism.constant(np.zeros((), a.dtype))
    inexact = ism.not_equal(ism.mod(a, b), zero)
    opposite = ism.not_equal(ism.less(a, zero), ism.less(b, zero))
    return ism.add(q, ism.cast(ism.logical_and(inexact, opposite), a.dtype))


for _op, _fn in _BINARY.items():
    handler(_op, attrs=())(_binary(_fn))
for _op, _fn in _UNARY.items():
    handler(_op, attrs=())((lambda f: lambda c, node, ins: [f(ins[0])])(_fn))


@handler("Max", attrs=())
@handler("Min", attrs=())
@handler("Sum", attrs=())
def _variadic(c, node, ins):
    f = {"Max": ism.maximum, "Min": ism.minimum, "Sum": ism.add}[node.op_type]
    out = ins[0]
    for t in ins[1:]:
        out = f(out, t)
    return [out]


@handler("LeakyRelu", attrs=("alpha",))
def _leaky(c, node, ins):
    return [ism.leaky_relu(ins[0], _attrs(node).get("alpha", 0.01))]


@handler("Gelu", 20, attrs=("approximate",))
def _gelu(c, node, ins):
    approx = _s(_attrs(node).get("approximate", "none"))
    refuse_unless(approx in ("none", "tanh"), f"approximate '{approx}' is not supported (none, tanh are)")
    return [ism.gelu(ins[0], approx)]


def _clip_to(x, lo, hi):
    if lo is not None and hi is not None and lo.node.op == "Const" and hi.node.op == "Const":
        if float(lo.node.attrs["value"]) == 0.0 and float(hi.node.attrs["value"]) == 6.0 and x.dtype.kind == "f":
            return ism.relu6(x)
    if lo is not None:
        x = ism.maximum(x, lo)
    if hi is not None:
        x = ism.minimum(x, hi)
    return x


@handler("Clip", 1, attrs=("min", "max"))
def _clip_attrs(c, node, ins):
    """Opsets 6-10: min and max are attributes (defaults: the dtype's range)."""
    at = _attrs(node)
    x = ins[0]
    lo = ism.constant(np.array(at["min"], x.dtype)) if "min" in at else None
    hi = ism.constant(np.array(at["max"], x.dtype)) if "max" in at else None
    return [_clip_to(x, lo, hi)]


@handler("Clip", 11, attrs=())
def _clip(c, node, ins):
    return [_clip_to(ins[0], ins[1] if len(ins) > 1 else None, ins[2] if len(ins) > 2 else None)]


@handler("Cast", attrs=("to", "saturate", "round_mode"))
def _cast(c, node, ins):
    from onnx import helper  # deferred: onnx is a heavy or optional dependency
    at = _attrs(node)
    try:
        dtype = helper.tensor_dtype_to_np_dtype(at["to"])
    except Exception:
        raise ImportError_(f"'to' = {at.get('to')} is not a known ONNX element type") from None
    dtype = _isthmus_dtype(dtype, "'to'")
    if ins[0].dtype.kind == "f" and dtype.kind in "iu":  # ONNX casts float -> int by truncation, as numpy does
        pass
    return [ism.cast(ins[0], dtype)]  # saturate and round_mode concern float8 targets only, refused above


def _isthmus_dtype(dtype, what: str):
    try:
        return as_dtype(dtype)
    except (TypeError, ValueError) as e:
        raise ImportError_(f"{what}: {e}") from None


@handler("Where", attrs=())
def _where(c, node, ins):
    return [ism.where(*ins)]


@handler("Dropout", 1, attrs=("ratio", "is_test", "seed"))
def _dropout(c, node, ins):
    """Inference: the identity, and a mask of ones (bool from opset 10, the input's type before).
    Opset 12+ asks for training by a training_mode input: refused unless it is known false or the
    ratio is known zero (random dropout at run time is not supported)."""
    x = ins[0]
    if c.opset >= 12 and c.has_input(node, 2):
        mode = c.const_or_none(node, 2)
        ratio = c.const_or_none(node, 1) if c.has_input(node, 1) else np.array(0.5)
        training = mode is None or bool(np.asarray(mode).reshape(-1)[0])
        if training and (ratio is None or float(np.asarray(ratio).reshape(-1)[0]) != 0.0):
            raise ImportError_("training_mode is true (or computed at run time) with a non-zero ratio: "
                               "random dropout at run time is not supported")
    out = [ism.identity(x)]
    if len(node.output) > 1 and node.output[1]:
        mask = ism.greater(ism.ones_like(x), ism.zeros_like(x)) if x.dtype.kind != "b" else ism.logical_or(x, ism.logical_not(x))
        out.append(mask if c.opset >= 10 else ism.cast(mask, x.dtype))
    return out


def _coerced_2d(fn):
    """Softmax before opset 13: over the flattened dims from `axis` (default 1), shape kept."""
    def h(c, node, ins):
        x = ins[0]
        rank = len(x.shape)
        axis = _attrs(node).get("axis", 1) % max(rank, 1)
        if axis == rank - 1:
            return [fn(x, -1)]
        flat = ism.flatten(x, axis)
        if all(d is not None for d in x.shape):
            return [ism.reshape(fn(flat, -1), tuple(x.shape))]
        return [ism.reshape_to(fn(flat, -1), ism.shape(x, "int64"))]
    return h


handler("Softmax", 1, attrs=("axis",))(_coerced_2d(ism.softmax))
handler("LogSoftmax", 1, attrs=("axis",))(_coerced_2d(ism.log_softmax))


@handler("Softmax", 13, attrs=("axis",))
def _softmax(c, node, ins):
    return [ism.softmax(ins[0], _attrs(node).get("axis", -1))]


@handler("LogSoftmax", 13, attrs=("axis",))
def _log_softmax(c, node, ins):
    return [ism.log_softmax(ins[0], _attrs(node).get("axis", -1))]


# ---- reductions: axes an attribute (ReduceSum before 13, the others before 18) or an input ----------
def _reduce(fn, kind):
    def h(c, node, ins):
        at = _attrs(node)
        axes = at.get("axes")
        keep, noop = bool(at.get("keepdims", 1)), bool(at.get("noop_with_empty_axes", 0))
        x = ins[0]
        if c.has_input(node, 1):
            if node.input[1] not in c.consts:  # axes computed at run time
                refuse_unless(kind in ("sum", "mean", "max", "min"), f"axes computed at run time for {node.op_type}")
                return [ism.reduce_dynamic(x, ins[1], kind, keep, noop)]
            axes = [int(a) for a in np.asarray(c.consts[node.input[1]]).reshape(-1)]
        if not axes and noop:
            return [ism.identity(x)]
        axes = None if not axes else tuple(int(a) % max(len(x.shape), 1) for a in axes)
        if axes is not None and any(x.shape[a] == 0 for a in axes) or axes is None and 0 in x.shape:
            return [_empty_reduce(x, axes, kind, keep)]
        return [fn(x, axes, keepdims=keep)]
    return h


def _empty_reduce(x, axes, kind, keep):
    """A reduction over an empty set: the op's identity (ONNX: sum 0, max -inf/lowest, min +inf/highest)."""
    if x.dtype.kind == "b":
        ident = kind == "min"
    elif x.dtype.kind == "f":
        ident = {"sum": 0.0, "mean": np.nan, "max": -np.inf, "min": np.inf}[kind]
    else:
        info = np.iinfo(x.dtype)
        ident = {"sum": 0, "mean": 0, "max": info.min, "min": info.max}[kind]
    axes = tuple(range(len(x.shape))) if axes is None else axes
    shape = [1 if a in axes else d for a, d in enumerate(x.shape)] if keep else \
        [d for a, d in enumerate(x.shape) if a not in axes]
    if any(d is None for d in shape):
        raise ImportError_("a reduction over an empty axis needs the other dims known at import")
    return ism.constant(np.full(shape, ident, x.dtype))


@handler("ReduceSumSquare", attrs=("axes", "keepdims", "noop_with_empty_axes"))
def _reduce_sum_square(c, node, ins):
    return _reduce(ism.reduce_sum, "sum")(c, node, [ism.square(ins[0])] + list(ins[1:]))


for _op, _fn, _kind in [("ReduceSum", ism.reduce_sum, "sum"), ("ReduceMean", ism.reduce_mean, "mean"),
                        ("ReduceMax", ism.reduce_max, "max"), ("ReduceMin", ism.reduce_min, "min")]:
    handler(_op, attrs=("axes", "keepdims", "noop_with_empty_axes"))(_reduce(_fn, _kind))


@handler("ArgMax", attrs=("axis", "keepdims", "select_last_index"))
@handler("ArgMin", attrs=("axis", "keepdims", "select_last_index"))
def _arg(c, node, ins):
    at = _attrs(node)
    x = ins[0]
    axis = int(at.get("axis", 0)) % max(len(x.shape), 1)
    f = ism.argmax if node.op_type == "ArgMax" else ism.argmin
    if at.get("select_last_index", 0):  # the first index of the reversed axis, counted from the end
        key = [slice(None)] * len(x.shape)
        key[axis] = slice(None, None, -1)
        n = x.shape[axis]
        last = ism.constant(np.array(n - 1, np.int64)) if n is not None else \
            ism.sub(ism.shape(x, "int64")[axis], np.int64(1))
        y = ism.sub(last, f(x[tuple(key)], axis))
    else:
        y = f(x, axis)
    return [ism.expand_dims(y, axis) if at.get("keepdims", 1) else y]
