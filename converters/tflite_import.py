"""Import TensorFlow Lite models (`from_tflite`) into isthmus graphs.

TFLite is NHWC; isthmus convolutions and pooling are NCHW. Every value carries its layout: a
4-D activation is moved to NCHW once, where a convolution first needs it, and stays there
through elementwise ops, pooling, concatenation, padding and means (whose axes are remapped);
it goes back to NHWC only where element order matters (a reshape or fully-connected layer over
spatial dims larger than 1x1). Graph inputs and outputs of rank 4 are NCHW by default (so the
graph exports to the edge format without transposes); `nhwc_io=True` keeps TFLite's NHWC.

Weights are constants: int8/uint8/int16/int32 ones with quantization parameters are dequantized
to float32 ((q - zero_point) * scale, per channel where the file says so), float16 ones widened.
Quantized activations are carried as their real values: a quantized graph input is dequantized
after its placeholder, QUANTIZE rounds to its grid, a quantized graph output is quantized back.
Unsupported operators are listed all at once, with counts and operator indices.
"""
from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional, Tuple, Union

import numpy as np

import isthmus.core as ism
from isthmus.core.errors import GraphError
from isthmus.core.graph import Graph, Tensor
from isthmus.core.ops.image import resize

from .onnx_import import owned_constant
from .tflite_read import ModelData, OperatorData, TensorData, TFLiteImportError, read_model

__all__ = ["from_tflite", "TFLiteImportError", "supported_tflite_ops"]

TO_NCHW, TO_NHWC = (0, 3, 1, 2), (0, 2, 3, 1)
NHWC_AXIS_IN_NCHW = (0, 2, 3, 1)  # NHWC axis a sits at NCHW axis NHWC_AXIS_IN_NCHW[a]


class _Val:
    """A value of the imported graph: a tensor, and whether it is a 4-D activation held NCHW.
    A constant's tensor is made on first use, so weights an op consumes in another form (a
    transposed filter) never enter the graph twice."""
    __slots__ = ("_t", "nchw", "const", "_name")

    def __init__(self, t: Optional[Tensor], nchw: bool = False, const: Optional[np.ndarray] = None,
                 name: Optional[str] = None):
        self._t, self.nchw, self.const, self._name = t, nchw, const, name

    @property
    def t(self) -> Tensor:
        if self._t is None:
            self._t = owned_constant(self.const, self._name or "Const")
        return self._t

    @property
    def rank(self) -> int:
        return self.const.ndim if self._t is None else len(self._t.shape)


_HANDLERS: Dict[str, Callable] = {}


def _handler(*ops):
    def deco(f):
        for op in ops:
            _HANDLERS[op] = f
        return f
    return deco


def supported_tflite_ops() -> List[str]:
    return sorted(_HANDLERS)


def dequantize(t: TensorData) -> np.ndarray:
    """A constant's real value as float32 (or its raw value: integers without quantization)."""
    v = t.data
    if t.dtype == np.float16:
        return v.astype(np.float32)
    if t.scale is None or t.dtype.kind not in "iu":
        return v
    shape = [1] * v.ndim
    if t.scale.size > 1:
        shape[t.quantized_dimension] = -1
    s, z = t.scale.reshape(shape), t.zero_point.reshape(shape)
    return ((v.astype(np.float64) - z) * s).astype(np.float32)


class _Importer:
    def __init__(self, md: ModelData):
        self.md = md
        self.vals: Dict[int, _Val] = {}

    def where(self, op: OperatorData) -> str:
        return f"operator {op.index} ({op.op})"

    def tensor(self, i: int) -> TensorData:
        return self.md.tensors[i]

    def value(self, op: OperatorData, k: int) -> Optional[_Val]:
        if k >= len(op.inputs) or op.inputs[k] < 0:
            return None
        i = op.inputs[k]
        if i not in self.vals:
            t = self.tensor(i)
            if t.data is None:
                raise TFLiteImportError(f"{self.where(op)}: input {k} (tensor {i} '{t.name}') is produced by no "
                                        "earlier operator and is neither a constant nor a graph input "
                                        "(operators out of order?)")
            self.vals[i] = _Val(None, False, dequantize(t), _clean(t.name) or f"t{i}")
        return self.vals[i]

    def const(self, op: OperatorData, k: int, what: str) -> np.ndarray:
        v = self.value(op, k)
        if v is None or v.const is None:
            raise TFLiteImportError(f"{self.where(op)}: {what} (input {k}) must be a constant")
        return v.const

    def ins(self, op: OperatorData, n: int) -> List[_Val]:
        vals = [self.value(op, k) for k in range(n)]
        if any(v is None for v in vals):
            raise TFLiteImportError(f"{self.where(op)}: needs {n} inputs, has {len(op.inputs)}")
        return vals

    def opt(self, op: OperatorData, name: str, default=None, lo: Optional[int] = None):
        v = op.options.get(name, default)
        if v is None:
            raise TFLiteImportError(f"{self.where(op)}: option {name} is missing (no builtin options?)")
        if lo is not None and int(v) < lo:
            raise TFLiteImportError(f"{self.where(op)}: option {name} = {v} must be >= {lo}")
        return v


def as_nchw(v: _Val) -> Tensor:
    if v.nchw or v.rank != 4:
        return v.t
    if v.const is not None:
        return ism.constant(np.ascontiguousarray(v.const.transpose(TO_NCHW)))
    return ism.transpose(v.t, TO_NCHW)


def as_nhwc(v: _Val) -> Tensor:
    return ism.transpose(v.t, TO_NHWC) if v.nchw else v.t


def _flat_order_kept(v: _Val) -> bool:
    """NCHW and NHWC list the elements in the same order when H = W = 1."""
    return v.nchw and v.t.shape[2] == 1 and v.t.shape[3] == 1


_ACTS = {0: None, 1: ism.relu, 3: ism.relu6, 4: ism.tanh,
         2: lambda x: ism.minimum(ism.maximum(x, -1.0), 1.0)}


def _act(imp, op, t: Tensor) -> Tensor:
    code = int(op.options.get("FusedActivationFunction", 0))
    if code not in _ACTS:
        raise TFLiteImportError(f"{imp.where(op)}: fused activation {code} is not supported (NONE, RELU, "
                                "RELU_N1_TO_1, RELU6, TANH are)")
    return t if _ACTS[code] is None else _ACTS[code](t)


def _broadcast_pair(a: _Val, b: _Val) -> Tuple[Tensor, Tensor, bool]:
    """Both operands in one layout: NCHW when either is held NCHW and the other can follow."""
    if not (a.nchw or b.nchw):
        return a.t, b.t, False
    if a.rank == 4 and b.rank == 4:
        return as_nchw(a), as_nchw(b), True
    small, big = (b, a) if a.rank == 4 else (a, b)
    if small.const is not None:  # a constant broadcast over NHWC: reshape it for NCHW
        c = small.const.reshape((1,) * (4 - small.const.ndim) + small.const.shape).transpose(TO_NCHW)
        ct = ism.constant(np.ascontiguousarray(c), dtype=c.dtype)
        return (big.t, ct, True) if big is a else (ct, big.t, True)
    return as_nhwc(a), as_nhwc(b), False


@_handler("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE")
def _binary(imp, op):
    a, b = imp.ins(op, 2)
    x, y, nchw = _broadcast_pair(a, b)
    if x.dtype != y.dtype:
        raise TFLiteImportError(f"{imp.where(op)}: operands are {x.dtype.name} and {y.dtype.name}")
    f = {"ADD": ism.add, "SUB": ism.sub, "MUL": ism.mul, "DIV": ism.div, "MAXIMUM": ism.maximum,
         "MINIMUM": ism.minimum, "SQUARED_DIFFERENCE": lambda p, q: ism.square(ism.sub(p, q))}[op.op]
    return [_Val(_act(imp, op, f(x, y)), nchw)]


_UNARY = {"RELU": ism.relu, "RELU6": ism.relu6, "LOGISTIC": ism.sigmoid, "TANH": ism.tanh, "EXP": ism.exp,
          "ABS": ism.abs, "NEG": ism.neg, "SQRT": ism.sqrt, "RSQRT": lambda x: ism.reciprocal(ism.sqrt(x)),
          "LOG": ism.log, "SQUARE": ism.square,
          "RELU_N1_TO_1": lambda x: ism.minimum(ism.maximum(x, -1.0), 1.0),
          "HARD_SWISH": lambda x: ism.mul(x, ism.mul(ism.relu6(ism.add(x, 3.0)), 1.0 / 6.0))}


@_handler(*_UNARY)
def _unary(imp, op):
    (x,) = imp.ins(op, 1)
    return [_Val(_UNARY[op.op](x.t), x.nchw)]


@_handler("LEAKY_RELU")
def _leaky(imp, op):
    (x,) = imp.ins(op, 1)
    return [_Val(ism.leaky_relu(x.t, float(op.options.get("Alpha", 0.2))), x.nchw)]


@_handler("PRELU")
def _prelu(imp, op):
    x, alpha = imp.ins(op, 2)
    xt, at, nchw = _broadcast_pair(x, alpha)
    return [_Val(ism.add(ism.relu(xt), ism.mul(at, ism.minimum(xt, 0.0))), nchw)]


def _padding(imp, op) -> str:
    p = int(imp.opt(op, "Padding", 0))
    if p not in (0, 1):
        raise TFLiteImportError(f"{imp.where(op)}: padding {p} is not SAME (0) or VALID (1)")
    return "SAME" if p == 0 else "VALID"


def _conv_common(imp, op):
    strides = (int(imp.opt(op, "StrideH", lo=1)), int(imp.opt(op, "StrideW", lo=1)))
    dil = (int(imp.opt(op, "DilationHFactor", 1, lo=1)), int(imp.opt(op, "DilationWFactor", 1, lo=1)))
    return strides, dil, _padding(imp, op)


def _bias(imp, op, y: Tensor) -> Tensor:
    b = imp.value(op, 2)
    if b is None:
        return y
    if b.rank != 1 or b.t.shape[0] != y.shape[1]:
        raise TFLiteImportError(f"{imp.where(op)}: bias shape {b.t.shape} does not match {y.shape[1]} outputs")
    return ism.bias_add(y, b.t, axis=1)


@_handler("CONV_2D")
def _conv(imp, op):
    x = imp.ins(op, 1)[0]
    w = imp.const(op, 1, "the filter")
    if x.rank != 4 or w.ndim != 4 or 0 in w.shape:
        raise TFLiteImportError(f"{imp.where(op)}: needs a 4-D input and a non-empty 4-D filter, "
                                f"got {x.t.shape} and {w.shape}")
    strides, dil, pad = _conv_common(imp, op)
    xt = as_nchw(x)
    c = xt.shape[1]
    if c is None or c % w.shape[3]:
        raise TFLiteImportError(f"{imp.where(op)}: {c} input channels are not a multiple of the filter's {w.shape[3]}")
    y = ism.conv2d(xt, np.ascontiguousarray(w.transpose(TO_NCHW)), strides=strides, padding=pad, dilations=dil,
                   groups=c // w.shape[3])
    return [_Val(_act(imp, op, _bias(imp, op, y)), True)]


@_handler("DEPTHWISE_CONV_2D")
def _depthwise(imp, op):
    x = imp.ins(op, 1)[0]
    w = imp.const(op, 1, "the filter")  # [1, KH, KW, C * multiplier]
    if x.rank != 4 or w.ndim != 4 or w.shape[0] != 1 or 0 in w.shape or x.t.shape[3 if not x.nchw else 1] == 0:
        raise TFLiteImportError(f"{imp.where(op)}: needs a 4-D input and a [1, KH, KW, C*M] filter, "
                                f"got {x.t.shape} and {w.shape}")
    strides, dil, pad = _conv_common(imp, op)
    xt = as_nchw(x)
    c = xt.shape[1]
    if c is None or w.shape[3] % c:
        raise TFLiteImportError(f"{imp.where(op)}: filter depth {w.shape[3]} is not a multiple of {c} channels")
    w_oihw = np.ascontiguousarray(w[0].transpose(2, 0, 1)[:, None])  # output channel c*M + m reads channel c
    y = ism.conv2d(xt, w_oihw, strides=strides, padding=pad, dilations=dil, groups=c)
    return [_Val(_act(imp, op, _bias(imp, op, y)), True)]


@_handler("AVERAGE_POOL_2D", "MAX_POOL_2D")
def _pool(imp, op):
    (x,) = imp.ins(op, 1)
    if x.rank != 4:
        raise TFLiteImportError(f"{imp.where(op)}: needs a 4-D input, got {x.t.shape}")
    k = (int(imp.opt(op, "FilterHeight", lo=1)), int(imp.opt(op, "FilterWidth", lo=1)))
    s = (int(imp.opt(op, "StrideH", lo=1)), int(imp.opt(op, "StrideW", lo=1)))
    f = ism.max_pool if op.op == "MAX_POOL_2D" else ism.avg_pool
    return [_Val(_act(imp, op, f(as_nchw(x), k, s, _padding(imp, op))), True)]


@_handler("FULLY_CONNECTED")
def _fc(imp, op):
    x = imp.ins(op, 1)[0]
    if int(op.options.get("WeightsFormat", 0)) != 0:
        raise TFLiteImportError(f"{imp.where(op)}: shuffled weight formats are not supported")
    wv = imp.value(op, 1)
    if wv is None or wv.rank != 2:
        raise TFLiteImportError(f"{imp.where(op)}: needs a 2-D weight matrix")
    n_in = wv.const.shape[1] if wv.const is not None else wv.t.shape[1]
    xt = x.t if (not x.nchw or _flat_order_kept(x)) else as_nhwc(x)
    lead = tuple(xt.shape[:-1]) if not x.nchw else None
    if len(xt.shape) != 2 or xt.shape[-1] != n_in:
        xt = ism.reshape(xt, (-1, n_in))
    y = ism.matmul(xt, np.ascontiguousarray(wv.const.T)) if wv.const is not None else \
        ism.matmul(xt, wv.t, transpose_b=True)
    b = imp.value(op, 2)
    if b is not None:
        y = ism.bias_add(y, b.t)
    y = _act(imp, op, y)
    if op.options.get("KeepNumDims") and lead is not None and len(lead) != 1:
        y = ism.reshape(y, tuple(-1 if d is None else d for d in lead) + (y.shape[-1],))
    return [_Val(y, False)]


@_handler("RESHAPE")
def _reshape(imp, op):
    x = imp.value(op, 0)
    sv = imp.value(op, 1)
    if sv is not None and sv.const is None:
        xt = x.t if not x.nchw else as_nhwc(x)
        return [_Val(ism.reshape_to(xt, ism.cast(sv.t, "int64")), False)]
    shape = [int(d) for d in (sv.const.reshape(-1) if sv is not None else op.options.get("NewShape", []))]
    if not shape and sv is None:
        shape = [-1 if d < 0 else d for d in imp.tensor(op.outputs[0]).shape]
    xt = x.t if (not x.nchw or _flat_order_kept(x)) else as_nhwc(x)
    known = [d for d in xt.shape]
    if shape.count(-1) > 1 and len(shape) == len(known):  # unknown batch dims pass through
        shape = [known[i] if d == -1 and known[i] is not None else d for i, d in enumerate(shape)]
    return [_Val(ism.reshape(xt, shape), False)]


@_handler("SOFTMAX")
def _softmax(imp, op):
    (x,) = imp.ins(op, 1)
    beta = float(op.options.get("Beta", 1.0))
    t = x.t if beta == 1.0 else ism.mul(x.t, beta)
    return [_Val(ism.softmax(t, 1 if x.nchw else -1), x.nchw)]


@_handler("CONCATENATION")
def _concat(imp, op):
    vals = [imp.value(op, k) for k in range(len(op.inputs))]
    if not vals or any(v is None for v in vals):
        raise TFLiteImportError(f"{imp.where(op)}: needs at least one input")
    rank = vals[0].rank
    axis = int(imp.opt(op, "Axis", 0))
    if not -rank <= axis < rank:
        raise TFLiteImportError(f"{imp.where(op)}: axis {axis} outside rank {rank}")
    axis %= rank
    nchw = rank == 4 and any(v.nchw for v in vals)
    ts = [as_nchw(v) for v in vals] if nchw else [as_nhwc(v) for v in vals]
    return [_Val(_act(imp, op, ism.concat(ts, NHWC_AXIS_IN_NCHW[axis] if nchw else axis)), nchw)]


@_handler("MEAN", "SUM", "REDUCE_MAX")
def _reduce(imp, op):
    x = imp.value(op, 0)
    axes = sorted({int(a) % x.rank for a in imp.const(op, 1, "the axes").reshape(-1)})
    keep = bool(op.options.get("KeepDims", False))
    f = {"MEAN": ism.reduce_mean, "SUM": ism.reduce_sum, "REDUCE_MAX": ism.reduce_max}[op.op]
    if x.nchw and op.op == "MEAN" and axes == [1, 2] and x.t.dtype.kind == "f":  # the usual global pool
        return [_Val(ism.global_avg_pool(x.t, keepdims=keep), keep)]
    if x.nchw:
        rest = [a for a in range(4) if a not in axes]
        if keep or sorted(rest, key=lambda a: NHWC_AXIS_IN_NCHW[a]) == rest:  # same order either way
            y = f(x.t, tuple(NHWC_AXIS_IN_NCHW[a] for a in axes), keepdims=keep)
            return [_Val(y, keep)]
    return [_Val(f(as_nhwc(x), tuple(axes), keepdims=keep), False)]


@_handler("PAD", "PADV2")
def _pad(imp, op):
    x = imp.value(op, 0)
    pads = imp.const(op, 1, "the paddings").astype(np.int64)
    if pads.shape != (x.rank, 2) or np.any(pads < 0):
        raise TFLiteImportError(f"{imp.where(op)}: paddings {pads.tolist()} do not fit rank {x.rank}")
    value = 0.0
    if op.op == "PADV2" and imp.value(op, 2) is not None:
        value = float(imp.const(op, 2, "the pad value").reshape(-1)[0])
    if x.nchw:
        pads = pads[list(TO_NCHW)]
    return [_Val(ism.pad(x.t, [tuple(int(a) for a in p) for p in pads], "constant", value), x.nchw)]


@_handler("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR")
def _resize(imp, op):
    x = imp.value(op, 0)
    size = [int(d) for d in imp.const(op, 1, "the output size").reshape(-1)]
    if x.rank != 4 or len(size) != 2 or min(size) < 1:
        raise TFLiteImportError(f"{imp.where(op)}: needs a 4-D input and a [height, width] size, got {size}")
    align, half = bool(op.options.get("AlignCorners", False)), bool(op.options.get("HalfPixelCenters", False))
    if op.op == "RESIZE_BILINEAR":
        kw = dict(mode="linear", coordinate_mode="align_corners" if align else "half_pixel" if half else "asymmetric")
    else:
        kw = dict(mode="nearest", coordinate_mode="align_corners" if align else
                  "tf_half_pixel_for_nn" if half else "asymmetric",
                  nearest_mode="round_prefer_ceil" if align else "floor")
    return [_Val(resize(as_nchw(x), sizes=(0, 0) + tuple(size), **kw), True)]


# ---- shape and indexing ops: NHWC semantics (a value held NCHW goes back first) -----------------------
@_handler("TRANSPOSE")
def _transpose(imp, op):
    x = imp.value(op, 0)
    perm = [int(a) for a in imp.const(op, 1, "the permutation").reshape(-1)]
    if sorted(perm) != list(range(x.rank)):
        raise TFLiteImportError(f"{imp.where(op)}: {perm} is not a permutation of {x.rank} axes")
    if x.nchw and perm == list(TO_NCHW):  # NHWC -> NCHW of a value already held NCHW
        return [_Val(x.t, False)]
    return [_Val(ism.transpose(as_nhwc(x), tuple(perm)), False)]


@_handler("DENSIFY")
def _densify(imp, op):
    """The reader already densified the sparse constant (converters/tflite_sparse.py)."""
    v = imp.value(op, 0)
    if v is None or v.const is None:
        raise TFLiteImportError(f"{imp.where(op)}: DENSIFY needs a constant (sparse) input")
    return [v]


@_handler("STRIDED_SLICE")
def _strided_slice(imp, op):
    """TensorFlow's strided slice (masks, ellipsis, new and shrunk axes, offset) as one numpy-style index
    of the NHWC value."""
    x = imp.value(op, 0)
    begin, end, strides = (imp.const(op, k, what).astype(np.int64).reshape(-1)
                           for k, what in ((1, "begin"), (2, "end"), (3, "strides")))
    if not len(begin) == len(end) == len(strides):
        raise TFLiteImportError(f"{imp.where(op)}: begin, end and strides differ in length")
    if np.any(strides == 0):
        raise TFLiteImportError(f"{imp.where(op)}: a stride is 0")
    bits = {k: int(op.options.get(k, 0) or 0) for k in ("BeginMask", "EndMask", "EllipsisMask", "NewAxisMask",
                                                         "ShrinkAxisMask")}
    key = []
    for i, (b, e, st) in enumerate(zip(begin.tolist(), end.tolist(), strides.tolist())):
        if bits["EllipsisMask"] >> i & 1:
            key.append(Ellipsis)
        elif bits["NewAxisMask"] >> i & 1:
            key.append(None)
        elif bits["ShrinkAxisMask"] >> i & 1:
            key.append(b)
        else:
            lo = None if bits["BeginMask"] >> i & 1 else b
            hi = None if bits["EndMask"] >> i & 1 else (b + e if op.options.get("Offset") else e)
            key.append(slice(lo, hi, st))
    return [_Val(as_nhwc(x)[tuple(key)], False)]


@_handler("SQUEEZE")
def _squeeze(imp, op):
    x = imp.value(op, 0)
    dims = [int(a) % max(x.rank, 1) for a in op.options.get("SqueezeDims", [])]
    return [_Val(ism.squeeze(as_nhwc(x), tuple(dims) if dims else None), False)]


@_handler("EXPAND_DIMS")
def _expand_dims(imp, op):
    x = imp.value(op, 0)
    axis = int(imp.const(op, 1, "the axis").reshape(-1)[0])
    if not -x.rank - 1 <= axis <= x.rank:
        raise TFLiteImportError(f"{imp.where(op)}: axis {axis} outside rank {x.rank} + 1")
    return [_Val(ism.expand_dims(as_nhwc(x), axis % (x.rank + 1)), False)]


@_handler("GATHER")
def _gather(imp, op):
    x, idx = imp.value(op, 0), imp.value(op, 1)
    if x is None or idx is None or int(op.options.get("BatchDims", 0)):
        raise TFLiteImportError(f"{imp.where(op)}: needs params and indices (batch_dims 0)")
    axis = int(op.options.get("Axis", 0))
    if not -x.rank <= axis < x.rank:
        raise TFLiteImportError(f"{imp.where(op)}: axis {axis} outside rank {x.rank}")
    return [_Val(ism.gather(as_nhwc(x), idx.t, axis % x.rank), False)]


@_handler("BATCH_MATMUL")
def _batch_matmul(imp, op):
    a, b = imp.ins(op, 2)
    return [_Val(ism.matmul(as_nhwc(a), as_nhwc(b), transpose_a=bool(op.options.get("AdjX", False)),
                            transpose_b=bool(op.options.get("AdjY", False))), False)]


@_handler("SPLIT", "SPLIT_V")
def _split(imp, op):
    if op.op == "SPLIT":  # inputs: axis, value
        axis_k, x, sizes = 0, imp.value(op, 1), None
    else:  # inputs: value, size_splits, axis
        axis_k, x = 2, imp.value(op, 0)
        sizes = [int(v) for v in imp.const(op, 1, "the split sizes").reshape(-1)]
    axis = int(imp.const(op, axis_k, "the axis").reshape(-1)[0])
    if x is None or not -x.rank <= axis < x.rank:
        raise TFLiteImportError(f"{imp.where(op)}: axis {axis} outside the input's rank")
    axis %= x.rank
    n = len(op.outputs)
    if sizes is not None and -1 in sizes:
        known = x.t.shape[NHWC_AXIS_IN_NCHW[axis] if x.nchw else axis]
        if known is None or sizes.count(-1) > 1:
            raise TFLiteImportError(f"{imp.where(op)}: split sizes {sizes} need a known axis")
        sizes[sizes.index(-1)] = known - sum(s_ for s_ in sizes if s_ != -1)
    parts = ism.split(x.t, sizes if sizes is not None else n, NHWC_AXIS_IN_NCHW[axis] if x.nchw else axis)
    return [_Val(p_, x.nchw) for p_ in parts]


def _qparams(imp, op, i: int, what: str):
    t = imp.tensor(i)
    if t.scale is None or t.scale.size != 1:
        raise TFLiteImportError(f"{imp.where(op)}: {what} tensor '{t.name}' needs one scale and zero point")
    return float(t.scale[0]), int(t.zero_point[0]), t


@_handler("DEQUANTIZE")
def _dequantize(imp, op):
    x = imp.value(op, 0)
    if x.const is not None:  # constants were dequantized (or widened from float16) when read
        c = x.const.astype(np.float32, copy=False)
        return [_Val(None, x.nchw, c, "dequantized")]
    if x.t.dtype.kind == "f":
        return [_Val(ism.cast(x.t, "float32") if x.t.dtype != np.float32 else x.t, x.nchw)]
    s, z, _ = _qparams(imp, op, op.inputs[0], "the input")
    return [_Val(ism.mul(ism.sub(ism.cast(x.t, "float32"), float(z)), s), x.nchw)]


@_handler("QUANTIZE")
def _quantize(imp, op):
    """Carried as the real value on the output's grid: (clip(round(x / s) + z) - z) * s."""
    x = imp.value(op, 0)
    s, z, t = _qparams(imp, op, op.outputs[0], "the output")
    info = np.iinfo(t.dtype)
    q = ism.add(ism.floor(ism.add(ism.div(x.t, s), 0.5)), float(z))
    q = ism.minimum(ism.maximum(q, float(info.min)), float(info.max))
    return [_Val(ism.mul(ism.sub(q, float(z)), s), x.nchw)]


def from_tflite(model: Union[str, bytes, os.PathLike], nhwc_io: bool = False, graph: Optional[Graph] = None):
    """Import a .tflite model (path or bytes). Returns (graph, inputs, outputs): inputs maps the
    model's input tensor names to placeholders, outputs lists the output tensors in order."""
    if isinstance(model, (str, os.PathLike)):
        with open(model, "rb") as f:
            model = f.read()
    md = read_model(model)
    missing: Dict[str, List[str]] = {}
    for op in md.operators:
        if op.op not in _HANDLERS:
            missing.setdefault(op.op, []).append(str(op.index))
    if missing:
        raise TFLiteImportError("cannot import: unsupported operators " + "; ".join(
            f"{op} x{len(v)} (operator {', '.join(v[:3])}{', ...' if len(v) > 3 else ''})"
            for op, v in sorted(missing.items())) + f". Supported: {', '.join(supported_tflite_ops())}")
    g = graph or Graph(seed=0)
    imp = _Importer(md)
    inputs: Dict[str, Tensor] = {}
    with g.as_default():
        for i in md.inputs:
            t = md.tensors[i]
            dims = [None if d < 0 else d for d in t.shape]
            nchw = len(dims) == 4 and not nhwc_io
            ph = ism.placeholder(t.dtype, [dims[a] for a in TO_NCHW] if nchw else dims,
                                 name=_clean(t.name) or f"input{i}")
            inputs[t.name or f"input{i}"] = ph
            v = ph
            if t.scale is not None and t.dtype.kind in "iu":  # a quantized input: carry its real value
                v = ism.mul(ism.sub(ism.cast(ph, "float32"), float(t.zero_point[0])), float(t.scale[0]))
            imp.vals[i] = _Val(v, nchw)
        for op in md.operators:
            with g.name_scope(_clean(md.tensors[op.outputs[0]].name) if op.outputs else f"op{op.index}"):
                try:
                    outs = _HANDLERS[op.op](imp, op)
                except TFLiteImportError:
                    raise
                except (ism.ShapeError, GraphError, ValueError, TypeError, ArithmeticError) as e:  # say where
                    raise TFLiteImportError(f"{imp.where(op)}: {type(e).__name__}: {e}") from None
            if len(outs) < len(op.outputs):
                raise TFLiteImportError(f"{imp.where(op)}: declares {len(op.outputs)} outputs, makes {len(outs)}")
            for i, v in zip(op.outputs, outs):
                _check_shape(imp, op, i, v)
                imp.vals[i] = v
        outputs = []
        for i in md.outputs:
            if i not in imp.vals:
                v = imp.value(OperatorData(-1, "graph output", [i], []), 0)
            v = imp.vals[i]
            y = (as_nhwc(v) if nhwc_io else as_nchw(v)) if v.rank == 4 else v.t
            t = md.tensors[i]
            if t.scale is not None and t.dtype.kind in "iu":  # a quantized output: back to integers
                info = np.iinfo(t.dtype)
                q = ism.add(ism.floor(ism.add(ism.div(y, float(t.scale[0])), 0.5)), float(t.zero_point[0]))
                y = ism.cast(ism.minimum(ism.maximum(q, float(info.min)), float(info.max)), t.dtype)
            outputs.append(y)
    return g, inputs, outputs


def _check_shape(imp, op, i: int, v: _Val) -> None:
    """The shape built here agrees with the one the file declares (catches layout mistakes)."""
    declared = imp.tensor(i).shape
    got = v.t.shape
    if v.nchw and len(got) == 4:
        got = tuple(got[a] for a in TO_NHWC)
    if len(declared) == 0 and len(got) != 0 and not any(d < 0 for d in declared):
        return  # some converters leave shapes of intermediates empty
    if len(declared) != len(got) or any(d >= 0 and g_ is not None and d != g_ for d, g_ in zip(declared, got)):
        raise TFLiteImportError(f"{imp.where(op)}: output tensor {i} '{imp.tensor(i).name}' comes out "
                                f"{list(got)} (NHWC), the file declares {list(declared)}")


def _clean(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-." else "_" for ch in name)


from . import tflite_mediapipe  # noqa: E402,F401  (MediaPipe custom operators; need the handler table above)
