"""ONNX import of the elementwise ops added for issue 20: activations (HardSigmoid, HardSwish, PRelu,
Elu, Selu, Celu, Softplus, Softsign, ThresholdedRelu), Round, Sin, Cos, Tan, Atan, IsNaN, IsInf, Mod,
Mean, CastLike, Xor, Mish and Hardmax. Registered into onnx_import's handler table."""
from __future__ import annotations

from typing import Dict

import numpy as np

import isthmus.core as ism

from .onnx_import import OnnxImportError, handler


def attrs(node) -> Dict[str, object]:
    """The node's attributes as Python values (strings decoded)."""
    from onnx import helper  # deferred: onnx is a heavy or optional dependency
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def where(node) -> str:
    return f"node '{node.name or node.op_type}' ({node.op_type})"


def _float_input(node, x):
    if x.dtype.kind != "f":
        raise OnnxImportError(f"{where(node)}: input is {x.dtype.name}; isthmus runs {node.op_type} on floats only")
    return x


_UNARY_ATTRS = {
    # ONNX op: (isthmus function, {onnx attribute: (isthmus keyword, default)})
    "HardSigmoid": (ism.hard_sigmoid, {"alpha": ("alpha", 0.2), "beta": ("beta", 0.5)}),
    "HardSwish": (ism.hard_swish, {}),
    "Elu": (ism.elu, {"alpha": ("alpha", 1.0)}),
    "Selu": (ism.selu, {"alpha": ("alpha", 1.67326319217681884765625), "gamma": ("gamma", 1.05070102214813232421875)}),
    "Celu": (ism.celu, {"alpha": ("alpha", 1.0)}),
    "Softplus": (ism.softplus, {}),
    "Softsign": (ism.softsign, {}),
    "ThresholdedRelu": (ism.thresholded_relu, {"alpha": ("alpha", 1.0)}),
    "Sin": (ism.sin, {}), "Cos": (ism.cos, {}), "Tan": (ism.tan, {}), "Atan": (ism.atan, {}),
    "Sinh": (ism.sinh, {}), "Cosh": (ism.cosh, {}), "Asin": (ism.asin, {}), "Acos": (ism.acos, {}),
    "Asinh": (ism.asinh, {}), "Acosh": (ism.acosh, {}), "Atanh": (ism.atanh, {}),
    "Round": (ism.round, {}), "IsNaN": (ism.isnan, {}),
    "IsInf": (ism.isinf, {"detect_positive": ("detect_positive", 1), "detect_negative": ("detect_negative", 1)}),
}


def _unary(op):
    fn, schema = _UNARY_ATTRS[op]

    def h(c, node, ins):
        at = attrs(node)
        unknown = set(at) - set(schema)
        if unknown:
            raise OnnxImportError(f"{where(node)}: unknown attribute(s) {sorted(unknown)}")
        kw = {key: type(default)(at.get(name, default)) for name, (key, default) in schema.items()}
        return [fn(_float_input(node, ins[0]), **kw)]
    return h


for _op in _UNARY_ATTRS:
    handler(_op, 1)(_unary(_op))


@handler("PRelu", 1)
def _prelu(c, node, ins):
    x, slope = ins
    if slope.dtype != x.dtype:
        slope = ism.cast(slope, x.dtype)
    return [ism.prelu(_float_input(node, x), slope)]


@handler("Mod", 10)
def _mod(c, node, ins):
    a, b = ins
    if a.dtype != b.dtype:
        raise OnnxImportError(f"{where(node)}: operands differ in dtype ({a.dtype.name}, {b.dtype.name})")
    if int(attrs(node).get("fmod", 0)):
        return [ism.fmod(a, b)]
    return [ism.mod(a, b)]  # the remainder with the divisor's sign (floats too, as the reference does)


@handler("Mean", 1)
def _mean(c, node, ins):
    out = ins[0]
    for t in ins[1:]:
        out = ism.add(out, t)
    if len(ins) == 1:
        return [ism.identity(out)]
    return [ism.div(out, ism.constant(len(ins), out.dtype))]


@handler("CastLike", 15)
def _cast_like(c, node, ins):
    if int(attrs(node).get("saturate", 1)) != 1 and ins[1].dtype.kind != "f":
        raise OnnxImportError(f"{where(node)}: saturate=0 applies to float8 targets only")
    x, like = ins
    return [ism.identity(x) if x.dtype == like.dtype else ism.cast(x, like.dtype)]


@handler("Xor", 7)
def _xor(c, node, ins):
    a, b = ins
    if a.dtype.kind != "b" or b.dtype.kind != "b":
        raise OnnxImportError(f"{where(node)}: Xor takes bool inputs, got {a.dtype.name} and {b.dtype.name}")
    return [ism.not_equal(a, b)]


@handler("Mish", 18)
def _mish(c, node, ins):
    x = _float_input(node, ins[0])
    return [ism.mul(x, ism.tanh(ism.softplus(x)))]


def _hardmax(coerced: bool):
    def h(c, node, ins):
        x = ins[0]
        rank = len(x.shape)
        axis = int(attrs(node).get("axis", 1 if coerced else -1)) % max(rank, 1)
        if coerced and axis != rank - 1:  # before opset 13: over the dims from axis on, flattened
            if any(d is None for d in x.shape[axis:]):
                raise OnnxImportError(f"{where(node)}: needs the dims from axis {axis} known at import")
            flat = ism.reshape(x, (-1, int(np.prod(x.shape[axis:]))))
            return [ism.reshape(_hardmax_last(node, flat), tuple(-1 if d is None else d for d in x.shape))]
        if axis != rank - 1:
            perm = [i for i in range(rank) if i != axis] + [axis]
            back = [perm.index(i) for i in range(rank)]
            return [ism.transpose(_hardmax_last(node, ism.transpose(x, perm)), back)]
        return [_hardmax_last(node, x)]
    return h


def _hardmax_last(node, x):
    n = x.shape[-1]
    if n is None:
        raise OnnxImportError(f"{where(node)}: the reduced axis must have a known size, got {x.shape}")
    return ism.one_hot(ism.argmax(x, -1), n, x.dtype)


handler("Hardmax", 1)(_hardmax(True))
handler("Hardmax", 13)(_hardmax(False))
