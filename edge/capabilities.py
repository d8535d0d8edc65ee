"""What the edge can run: per op, which attribute variants and dtypes its fp32 and int8 kernels
accept, and the edge attributes a graph node becomes. The exporter, the quantizer and the
partitioner's edge profile all ask here (one rule, one place); a test keeps this table and the
kernel registries (kernels.KERNELS, int8_kernels.INT8_KERNELS) in step.

Nodes are described without the graph machinery: an op name (the one CamelCase name used
everywhere), its attributes as a plain mapping (the graph's own attribute names) and its input
and output tensors as (dtype, shape) pairs, shapes with None for unknown dims.
"""
from __future__ import annotations

from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

TensorInfo = Tuple[object, Sequence[Optional[int]]]  # (dtype, shape)
ACTIVATIONS = ("none", "relu", "relu6", "tanh", "sigmoid")
INT8_ACTIVATIONS = ("none", "relu", "relu6")
NOT_KERNELS = frozenset({"Const", "Placeholder", "Variable"})  # values, not computations: nothing to run


class Refused(ValueError):
    """The edge has no kernel for this node's variant; the message says why."""


def _flat_pads(p) -> list:
    return [int(p[0][0]), int(p[0][1]), int(p[1][0]), int(p[1][1])]


def _conv(a: Mapping) -> dict:
    out = {"strides": list(a["strides"]), "dilations": list(a["dilations"]), "pads": _flat_pads(a["pads"]),
           "groups": int(a["groups"])}
    if "activation" in a:
        out["activation"] = _activation(a)
    return out


def _activation(a: Mapping) -> str:
    if a.get("activation", "none") not in ACTIVATIONS:
        raise Refused(f"activation '{a['activation']}' (the edge fuses {', '.join(ACTIVATIONS)})")
    return a.get("activation", "none")


def _matmul(a: Mapping) -> dict:
    out = {"transpose_a": int(a["transpose_a"]), "transpose_b": int(a["transpose_b"])}
    if "activation" in a:
        out["activation"] = _activation(a)
    return out


def _pool(a: Mapping) -> dict:
    if tuple(a.get("dilations", (1, 1))) != (1, 1):
        raise Refused("dilated pooling")
    return {"ksize": list(a["ksize"]), "strides": list(a["strides"]), "pads": _flat_pads(a["pads"])}


def _pad(a: Mapping) -> dict:
    if a.get("mode", "constant") != "constant":
        raise Refused(f"mode '{a['mode']}' (the edge pads with a constant only)")
    flat = [int(v) for pair in a["paddings"] for v in pair]
    if any(v < 0 for v in flat):
        raise Refused("negative paddings (cropping)")
    return {"paddings": flat, "constant_value": float(a.get("constant_value", 0.0))}


def _reshape(a: Mapping) -> dict:
    shape = a.get("shape")
    if shape is None or any(int(d) < -1 for d in shape) or list(shape).count(-1) > 1:
        raise Refused(f"shape {shape!r} (the edge takes a constant shape, one -1 at most)")
    return {"shape": [int(d) for d in shape]}


def _batch_norm(a: Mapping) -> dict:
    if a.get("training"):
        raise Refused("training mode")
    return {"epsilon": float(a["epsilon"]), "axis": int(a["axis"])}


def _none(a: Mapping) -> dict:
    return {}


# op -> (graph attrs -> edge attrs, raising Refused for a variant the kernel lacks), and the
# number of inputs the kernel takes (lo, hi)
FP32: Dict[str, Tuple[Callable[[Mapping], dict], Tuple[int, int]]] = {
    "Conv2D": (_conv, (2, 3)), "FusedConv2D": (_conv, (2, 3)),
    "MatMul": (_matmul, (2, 3)), "FusedMatMul": (_matmul, (2, 3)),
    "BiasAdd": (lambda a: {"axis": int(a["axis"])}, (2, 2)),
    "MaxPool": (_pool, (1, 1)), "AvgPool": (_pool, (1, 1)),
    "GlobalAvgPool": (lambda a: {"keepdims": int(a["keepdims"])}, (1, 1)),
    "Reshape": (_reshape, (1, 1)), "Flatten": (lambda a: {"axis": int(a["axis"])}, (1, 1)),
    "Concat": (lambda a: {"axis": int(a["axis"])}, (1, 1 << 16)),
    "Softmax": (lambda a: {"axis": int(a["axis"])}, (1, 1)),
    "Pad": (_pad, (1, 1)), "BatchNorm": (_batch_norm, (5, 5)),
    "Transpose": (lambda a: {"perm": [int(p) for p in a["perm"]]}, (1, 1)),
    "Split": (lambda a: {"axis": int(a["axis"]), "sizes": [int(v) for v in a.get("sizes") or ()],
                         "num": int(a.get("num") or 0)}, (1, 1)),
    "LayerNorm": (lambda a: {"axis": int(a["axis"]), "epsilon": float(a["epsilon"])}, (3, 3)),
    "LeakyRelu": (lambda a: {"alpha": float(a["alpha"])}, (1, 1)),
    **{op: (_none, (2, 2)) for op in ("Add", "Sub", "Mul", "Div", "Maximum", "Minimum")},
    **{op: (_none, (1, 1)) for op in ("Relu", "Relu6", "Tanh", "Sigmoid", "Identity")},
}
# ---- the shape, activation, recurrent and transposed-conv kernels (kernels_shape/_act/_rnn/_convt) ----
def _strided_slice(a: Mapping) -> dict:
    """spec entries (kind, begin, end, step) as parallel int lists; 'given' bit k says the entry has
    its begin (1), end (2) or step (4), since None has no int form."""
    kinds = {"index": 0, "slice": 1, "new": 2}
    out = {"kinds": [], "begin": [], "end": [], "step": [], "given": []}
    for kind, b, e, st in a["spec"]:
        if kind not in kinds:
            raise Refused(f"slice entry kind {kind!r}")
        vals = (b, e, st) if kind == "slice" else (b, None, None)
        out["kinds"].append(kinds[kind])
        for key, v in zip(("begin", "end", "step"), vals):
            out[key].append(0 if v is None else int(v))
        out["given"].append(sum(bit for bit, v in zip((1, 2, 4), vals) if v is not None))
    return out


def _resize(a: Mapping) -> dict:
    if a.get("mode", "nearest") not in ("nearest", "linear"):
        raise Refused(f"mode '{a['mode']}' (the edge resizes nearest or linear)")
    if a.get("antialias") and a.get("mode") == "linear":
        raise Refused("antialiased linear resize")
    if a.get("param"):
        raise Refused("scales or sizes computed at run time")
    return {"mode": a.get("mode", "nearest"), "coordinate_mode": a.get("coordinate_mode", "half_pixel"),
            "nearest_mode": a.get("nearest_mode", "round_prefer_floor"),
            "scales": [float(v) for v in a.get("scales") or ()], "sizes": [int(v) for v in a.get("sizes") or ()]}


def _sequence(a: Mapping) -> dict:
    if a.get("with_lens"):
        raise Refused("per-example sequence lengths")
    out = {"reverse": int(bool(a.get("reverse", False)))}
    if "linear_before_reset" in a:
        out["linear_before_reset"] = int(bool(a["linear_before_reset"]))
    return out


def _conv_transpose(a: Mapping) -> dict:
    return {"strides": list(a["strides"]), "dilations": list(a["dilations"]), "pads": _flat_pads(a["pads"]),
            "groups": int(a["groups"]), "output_padding": list(a.get("output_padding", (0, 0)))}


def _reduce(a: Mapping) -> dict:
    axis = a.get("axis")
    if axis is not None and not len(axis):
        raise Refused("a reduction over no axes")
    return {"axes": [int(v) for v in (axis or ())], "keepdims": int(bool(a.get("keepdims", False)))}


FP32.update({
    "Gelu": (lambda a: {"approximate": str(a.get("approximate", "none"))}, (1, 1)), "Erf": (_none, (1, 1)),
    **{op: (_reduce, (1, 1)) for op in ("ReduceMean", "ReduceSum", "ReduceMax")},
    "Gather": (lambda a: {"axis": int(a["axis"])}, (2, 2)),
    "StridedSlice": (_strided_slice, (1, 1)),
    "Squeeze": (lambda a: {"axes": [int(v) for v in (a.get("axis") or ())]}, (1, 1)),
    "ExpandAxes": (lambda a: {"axes": [int(v) for v in a["axes"]]}, (1, 1)),
    "Resize": (_resize, (1, 1)),
    "PRelu": (_none, (2, 2)), "HardSwish": (_none, (1, 1)),
    "HardSigmoid": (lambda a: {"alpha": float(a["alpha"]), "beta": float(a["beta"])}, (1, 1)),
    "LSTMSequence": (_sequence, (4, 6)), "GRUSequence": (_sequence, (4, 5)),
    "ConvTranspose2D": (_conv_transpose, (2, 2)),
})
# rows whose attributes a format writer (converters/tflite_write*.py, onnx_edge.py) does not read yet: edge_attrs
# gives them only to callers writing for the edge interpreter (to_edge, the quantizer)
WRITERS_PENDING: frozenset = frozenset()
# inputs an fp32 kernel reads as integers (int32 or int64), by position
INDEX_INPUTS: Dict[str, Tuple[int, ...]] = {"Gather": (1,)}

# ops with an int8 kernel (int8_kernels / int8_elementwise); Quantize and Dequantize are the
# quantizer's own borders, never graph nodes
INT8 = frozenset({"Conv2D", "FusedConv2D", "MatMul", "FusedMatMul", "Add", "MaxPool", "GlobalAvgPool", "Reshape",
                  "Flatten", "Relu", "Relu6"}
                 | {"Transpose", "StridedSlice", "Squeeze", "ExpandAxes", "Resize", "Pad", "Concat", "Softmax",
                    "PRelu", "HardSwish", "HardSigmoid", "LeakyRelu", "ConvTranspose2D", "Gather", "Split"})
# int8 ops whose output keeps its input's scale and zero point (a linear resize's outputs are convex
# combinations of its inputs: never outside their range)
SAME_QPARAMS = frozenset({"MaxPool", "Reshape", "Flatten", "Relu", "Relu6"}
                         | {"Transpose", "StridedSlice", "Squeeze", "ExpandAxes", "Resize", "Pad", "Gather", "Split"})


def _rank_needs(op: str, inputs: Sequence[TensorInfo]) -> Optional[str]:
    if op in ("Conv2D", "FusedConv2D", "MaxPool", "AvgPool", "GlobalAvgPool") and len(inputs[0][1]) != 4:
        return f"a rank-{len(inputs[0][1])} input (the edge kernel takes NCHW)"
    if op == "ConvTranspose2D" and (len(inputs[0][1]) != 4 or len(inputs[1][1]) != 4):
        return "a rank other than 4 (the edge kernel takes NCHW input and [C, O/groups, kh, kw] weights)"
    if op in ("MatMul", "FusedMatMul") and (len(inputs[0][1]) < 2 or len(inputs[1][1]) < 2):
        return "operands of rank < 2"
    return None


def edge_attrs(op: str, attrs: Mapping, interpreter: bool = False) -> dict:
    """The edge attributes of a node; Refused when the edge has no kernel for this variant.
    interpreter: the caller writes a file for the edge interpreter (to_edge, the quantizer); the rows in
    WRITERS_PENDING answer only such callers."""
    if op not in FP32:
        raise Refused(f"no edge kernel for {op}; edge kernels: {', '.join(sorted(FP32))}")
    if op in WRITERS_PENDING and not interpreter:
        raise Refused(f"{op}'s edge attributes are not read by the TFLite writer yet")
    return FP32[op][0](attrs)


def refusal(op: str, attrs: Mapping, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo]) -> Optional[str]:
    """Why the edge's fp32 kernels cannot run this node, or None when they can."""
    if op in NOT_KERNELS:
        return None
    try:
        edge_attrs(op, attrs, interpreter=True)
    except Refused as e:
        return str(e)
    except (KeyError, TypeError, ValueError) as e:  # attributes not of the form the kernel reads
        return f"attributes the edge cannot read ({e})"
    lo, hi = FP32[op][1]
    if not lo <= len(inputs) <= hi:
        return f"{len(inputs)} inputs (the edge kernel takes {lo}-{hi})"
    index_inputs = INDEX_INPUTS.get(op, ())
    for k, (dt, shape) in enumerate(list(inputs) + list(outputs[:1])):
        if k in index_inputs and k < len(inputs):
            if np.dtype(dt) not in (np.int32, np.int64):
                return f"{np.dtype(dt).name} indices (the edge kernel takes int32 or int64)"
        elif np.dtype(dt) != np.float32:
            return f"a {np.dtype(dt).name} tensor (edge fp32 kernels take float32)"
        if shape is None or any(d is None for d in list(shape)[1:]):
            return f"a tensor of shape {shape} (the edge plans its arena once: only the batch dim may be unknown)"
    return _rank_needs(op, inputs)


def int8_refusal(op: str, attrs: Mapping, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo],
                 constant_inputs: Sequence[bool]) -> Optional[str]:
    """Why the edge's int8 kernels cannot run this node (it then stays fp32), or None when they can."""
    why = refusal(op, attrs, inputs, outputs)
    if why is not None:
        return why
    if op not in INT8:
        return f"no int8 kernel for {op}"
    if op in ("FusedConv2D", "FusedMatMul") and attrs.get("activation", "none") not in INT8_ACTIVATIONS:
        return f"activation '{attrs['activation']}' (int8 fuses {', '.join(INT8_ACTIVATIONS)})"
    if op == "MatMul" and not constant_inputs[1]:  # two activations: per-tensor int8 both (BATCH_MATMUL)
        return None
    if op in ("MatMul", "FusedMatMul"):
        if attrs.get("transpose_a") or len(inputs[0][1]) != 2 or len(inputs[1][1]) != 2:
            return "a transposed or batched left operand (int8 takes [M, K] @ [K, N] or [N, K]^T)"
        if not constant_inputs[1]:
            return "non-constant weights"
    if op in ("Conv2D", "FusedConv2D") and not constant_inputs[1]:
        return "non-constant weights"
    if op in ("PRelu", "ConvTranspose2D") and not constant_inputs[1]:
        return "a slope computed at run time"
    return None
