"""ONNX export of the ops added for issue 20 (activations, pointwise math, indexing, ordering, ConvTranspose,
Q/DQ, Einsum) and of AddN, Tile and Mod; registered into onnx_export's handler table at opset 17."""
from __future__ import annotations

import numpy as np

from .onnx_export import OPSET, ExportError, _onnx_dtype, handler

_SAME_NAME = {
    # isthmus op: (ONNX op, attributes copied as floats or ints)
    "HardSigmoid": ("HardSigmoid", {"alpha": float, "beta": float}),
    "HardSwish": ("HardSwish", {}),
    "Elu": ("Elu", {"alpha": float}),
    "Selu": ("Selu", {"alpha": float, "gamma": float}),
    "Celu": ("Celu", {"alpha": float}),
    "Softplus": ("Softplus", {}),
    "Softsign": ("Softsign", {}),
    "ThresholdedRelu": ("ThresholdedRelu", {"alpha": float}),
    "Round": ("Round", {}), "Sin": ("Sin", {}), "Cos": ("Cos", {}), "Tan": ("Tan", {}), "Atan": ("Atan", {}),
    "Sinh": ("Sinh", {}), "Cosh": ("Cosh", {}), "Asin": ("Asin", {}), "Acos": ("Acos", {}), "Asinh": ("Asinh", {}),
    "Acosh": ("Acosh", {}), "Atanh": ("Atanh", {}),
    "IsNaN": ("IsNaN", {}), "IsInf": ("IsInf", {"detect_positive": int, "detect_negative": int}),
    "GatherElements": ("GatherElements", {"axis": int}),
    "NonZero": ("NonZero", {}),
}


@handler(*_SAME_NAME)
def _same_name(c, n, ins, outs):
    op, schema = _SAME_NAME[n.op]
    c.node(op, ins, outs, **{k: conv(n.attrs[k]) for k, conv in schema.items()})


@handler("PRelu")
def _prelu(c, n, ins, outs):
    if n.outputs[0].shape != n.inputs[0].shape:  # ONNX PRelu broadcasts the slope to x, never x to the slope
        raise ExportError(f"node '{n.name}' (PRelu): the slope {n.inputs[1].shape} widens x {n.inputs[0].shape}")
    c.node("PRelu", ins, outs)


@handler("FMod")
def _fmod(c, n, ins, outs):
    c.node("Mod", ins, outs, fmod=1)


@handler("Mod")
def _mod(c, n, ins, outs):
    if n.inputs[0].dtype.kind in "iu":
        c.node("Mod", ins, outs, fmod=0)
        return
    q, f, m = c.fresh("mod_q"), c.fresh("mod_f"), c.fresh("mod_m")  # a - floor(a / b) * b, numpy's float mod
    c.node("Div", ins, [q])
    c.node("Floor", [q], [f])
    c.node("Mul", [f, ins[1]], [m])
    c.node("Sub", [ins[0], m], outs)


@handler("Tile")
def _tile(c, n, ins, outs):
    c.node("Tile", [ins[0], c.const(np.array(n.attrs["multiples"], np.int64))], outs)


def _reduction(n) -> dict:
    red = n.attrs["reduction"]
    if red in ("max", "min") and OPSET < 18:
        raise ExportError(f"node '{n.name}' ({n.op}): reduction '{red}' needs opset 18 (exporting at {OPSET})")
    return {} if red == "none" else {"reduction": red}


@handler("ScatterElements")
def _scatter_elements(c, n, ins, outs):
    c.node("ScatterElements", ins, outs, axis=int(n.attrs["axis"]), **_reduction(n))


@handler("GatherND")
def _gather_nd(c, n, ins, outs):
    c.node("GatherND", [ins[0], _as_int64(c, n, ins[1], 1)], outs, batch_dims=int(n.attrs["batch_dims"]))


@handler("ScatterND")
def _scatter_nd(c, n, ins, outs):
    if n.attrs["batch_dims"]:
        raise ExportError(f"node '{n.name}' (ScatterND): ONNX ScatterND has no batch_dims")
    c.node("ScatterND", [ins[0], _as_int64(c, n, ins[1], 1), ins[2]], outs, **_reduction(n))


def _as_int64(c, n, name: str, k: int) -> str:
    if n.inputs[k].dtype == np.int64:
        return name
    t = c.fresh("i64")
    c.node("Cast", [name], [t], to=_onnx_dtype(np.int64))
    return t


def _param(c, n, ins, attr: str, shape) -> str:
    """The op's scalar parameter as an int64 ONNX input: its second input if it has one, else the attribute."""
    if len(ins) > 1:
        t = c.fresh(attr)
        c.node("Reshape", [_as_int64(c, n, ins[1], 1), c.const(np.array(shape, np.int64))], [t])
        return t
    return c.const(np.array(n.attrs[attr], np.int64).reshape(shape))


@handler("Trilu")
def _trilu(c, n, ins, outs):
    c.node("Trilu", [ins[0], _param(c, n, ins, "k", [])], outs, upper=int(n.attrs["upper"]))


@handler("CumSum")
def _cumsum(c, n, ins, outs):
    c.node("CumSum", [ins[0], _param(c, n, ins, "axis", [])], outs, exclusive=int(n.attrs["exclusive"]),
           reverse=int(n.attrs["reverse"]))


@handler("TopK")
def _top_k(c, n, ins, outs):
    c.node("TopK", [ins[0], _param(c, n, ins, "k", [1])], outs, axis=int(n.attrs["axis"]),
           largest=int(n.attrs["largest"]), sorted=1)


@handler("ReduceProd")
def _reduce_prod(c, n, ins, outs):
    rank = len(n.inputs[0].shape)
    axes = list(range(rank)) if n.attrs["axis"] is None else [a % rank for a in n.attrs["axis"]]
    c.node("ReduceProd", ins, outs, axes=axes, keepdims=int(bool(n.attrs["keepdims"])))


@handler("Size")
def _size(c, n, ins, outs):
    c.node("Size", ins, outs)


@handler("AddN")
def _add_n(c, n, ins, outs):
    c.node("Sum", ins, outs)


@handler("ConvTranspose2D")
def _conv_transpose(c, n, ins, outs):
    (t, b), (lf, r) = n.attrs["pads"]
    c.node("ConvTranspose", ins, outs, strides=list(n.attrs["strides"]), dilations=list(n.attrs["dilations"]),
           pads=[t, lf, b, r], group=int(n.attrs["groups"]), output_padding=list(n.attrs["output_padding"]))


@handler("QuantizeLinear", "DequantizeLinear")
def _qdq(c, n, ins, outs):
    if n.attrs["block_size"]:
        raise ExportError(f"node '{n.name}' ({n.op}): blocked scales need opset 21 (exporting at {OPSET})")
    if n.inputs[2].dtype == np.int16:
        raise ExportError(f"node '{n.name}' ({n.op}): int16 values need opset 21 (exporting at {OPSET})")
    attrs = {"axis": int(n.attrs["axis"])} if n.inputs[1].shape not in ((), (1,)) else {}
    c.node(n.op, ins, outs, **attrs)


@handler("Einsum")
def _einsum(c, n, ins, outs):
    c.node("Einsum", ins, outs, equation=n.attrs["equation"])
