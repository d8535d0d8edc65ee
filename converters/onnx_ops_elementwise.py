"""ONNX import of the elementwise ops added for issue 20: activations (HardSigmoid, HardSwish, PRelu,
Elu, Selu, Celu, Softplus, Softsign, ThresholdedRelu), Round, Sin, Cos, Tan, Atan, IsNaN, IsInf, Mod,
Mean and CastLike. Registered into onnx_import's handler table."""
from __future__ import annotations

from typing import Dict

import isthmus.core as ism

from .onnx_import import OnnxImportError, handler


def attrs(node) -> Dict[str, object]:
    """The node's attributes as Python values (strings decoded)."""
    from onnx import helper
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
