"""A checked reader of TensorFlow Lite flatbuffers, on the `tflite` package's generated accessors.

The generated accessors trust the file: an offset past the end raises whatever struct or numpy
raises, a negative one silently reads from the end, and a vector length is believed. Here every
table is bounds-checked before its fields are read (position, vtable, object size), every vector
is read through numpy with its length checked against the file, and every failure becomes a
TFLiteImportError naming what was being read. The result is plain Python data (`ModelData`),
so the importer never touches the buffer again.
"""
from __future__ import annotations

import importlib
import struct
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from isthmus.core.errors import GraphError


class TFLiteImportError(GraphError):
    """The .tflite file is malformed or uses what the importer does not support."""


# TensorType -> numpy dtype (the types a model's tensors may have here)
DTYPES = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 6: np.bool_, 7: np.int16,
          9: np.int8, 10: np.float64}
MAX_RANK = 8


@dataclass
class TensorData:
    index: int
    name: str
    dtype: np.dtype
    shape: tuple            # -1 for a dimension unknown until run time
    data: Optional[np.ndarray]  # the constant's value (raw, not dequantized), None for activations
    scale: Optional[np.ndarray] = None
    zero_point: Optional[np.ndarray] = None
    quantized_dimension: int = 0


@dataclass
class OperatorData:
    index: int
    op: str                 # builtin name (CONV_2D) or "custom:<code>"
    inputs: List[int]       # -1: an omitted optional input
    outputs: List[int]
    options: Dict[str, object] = field(default_factory=dict)
    custom_options: bytes = b""  # a custom operator's raw options (MediaPipe's are C structs)


@dataclass
class ModelData:
    version: int
    tensors: List[TensorData]
    operators: List[OperatorData]
    inputs: List[int]
    outputs: List[int]
    description: str = ""


def _builtin_names() -> Dict[int, str]:
    from tflite.BuiltinOperator import BuiltinOperator  # deferred: tflite is a heavy or optional dependency
    return {v: k for k, v in vars(BuiltinOperator).items() if not k.startswith("_") and isinstance(v, int)}


# builtin op -> (options class module name, fields read with their accessor names)
_OPTION_FIELDS = {
    "CONV_2D": ("Conv2DOptions", ["Padding", "StrideW", "StrideH", "FusedActivationFunction", "DilationWFactor",
                                  "DilationHFactor"]),
    "DEPTHWISE_CONV_2D": ("DepthwiseConv2DOptions", ["Padding", "StrideW", "StrideH", "DepthMultiplier",
                                                     "FusedActivationFunction", "DilationWFactor", "DilationHFactor"]),
    "AVERAGE_POOL_2D": ("Pool2DOptions", ["Padding", "StrideW", "StrideH", "FilterWidth", "FilterHeight",
                                          "FusedActivationFunction"]),
    "MAX_POOL_2D": ("Pool2DOptions", ["Padding", "StrideW", "StrideH", "FilterWidth", "FilterHeight",
                                      "FusedActivationFunction"]),
    "FULLY_CONNECTED": ("FullyConnectedOptions", ["FusedActivationFunction", "WeightsFormat", "KeepNumDims"]),
    "ADD": ("AddOptions", ["FusedActivationFunction"]),
    "SUB": ("SubOptions", ["FusedActivationFunction"]),
    "MUL": ("MulOptions", ["FusedActivationFunction"]),
    "DIV": ("DivOptions", ["FusedActivationFunction"]),
    "CONCATENATION": ("ConcatenationOptions", ["Axis", "FusedActivationFunction"]),
    "SOFTMAX": ("SoftmaxOptions", ["Beta"]),
    "MEAN": ("ReducerOptions", ["KeepDims"]),
    "RESHAPE": ("ReshapeOptions", ["NewShape"]),
    "RESIZE_BILINEAR": ("ResizeBilinearOptions", ["AlignCorners", "HalfPixelCenters"]),
    "RESIZE_NEAREST_NEIGHBOR": ("ResizeNearestNeighborOptions", ["AlignCorners", "HalfPixelCenters"]),
    "LEAKY_RELU": ("LeakyReluOptions", ["Alpha"]),
    "SQUEEZE": ("SqueezeOptions", ["SqueezeDims"]),
    "GATHER": ("GatherOptions", ["Axis", "BatchDims"]),
    "BATCH_MATMUL": ("BatchMatMulOptions", ["AdjX", "AdjY"]),
    "SPLIT": ("SplitOptions", ["NumSplits"]),
    "SPLIT_V": ("SplitVOptions", ["NumSplits"]),
    "STRIDED_SLICE": ("StridedSliceOptions", ["BeginMask", "EndMask", "EllipsisMask", "NewAxisMask",
                                              "ShrinkAxisMask", "Offset"]),
}
_VECTOR_FIELDS = {"NewShape", "SqueezeDims"}  # int32 vectors, read through numpy


class _Reader:
    def __init__(self, buf: bytes):
        self.buf = buf
        self.n = len(buf)

    def check_table(self, obj, what: str):
        """obj's table lies inside the buffer, and so does its vtable; else a clear error."""
        if obj is None:
            raise TFLiteImportError(f"{what}: missing")
        pos = obj._tab.Pos
        if not 0 <= pos <= self.n - 4:
            raise TFLiteImportError(f"{what}: table offset {pos} outside the file ({self.n} bytes)")
        vt = pos - struct.unpack_from("<i", self.buf, pos)[0]
        if not 0 <= vt <= self.n - 4:
            raise TFLiteImportError(f"{what}: vtable offset {vt} outside the file")
        vt_size, obj_size = struct.unpack_from("<HH", self.buf, vt)
        if vt_size < 4 or vt_size % 2 or vt + vt_size > self.n or pos + obj_size > self.n:
            raise TFLiteImportError(f"{what}: vtable ({vt_size} bytes) or object ({obj_size} bytes) "
                                    "runs past the end of the file")
        for k in range(4, vt_size, 2):  # every field offset must stay inside the object
            off = struct.unpack_from("<H", self.buf, vt + k)[0]
            if off and off + 1 > obj_size:
                raise TFLiteImportError(f"{what}: field {k // 2 - 2} at offset {off} lies outside its object "
                                        f"({obj_size} bytes)")
        return obj

    def count(self, n: int, what: str, elem: int = 4) -> int:
        if not 0 <= n * elem <= self.n:
            raise TFLiteImportError(f"{what}: {n} elements cannot fit in a {self.n}-byte file")
        return n

    def call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except TFLiteImportError:
            raise
        except (struct.error, IndexError, ValueError, TypeError, OverflowError, AttributeError) as e:
            raise TFLiteImportError(f"{what}: malformed ({type(e).__name__}: {e})") from None

    def ints(self, what: str, fn) -> List[int]:
        v = self.call(what, fn)
        return [] if isinstance(v, int) else [int(a) for a in np.asarray(v).reshape(-1)]

    def text(self, what: str, fn) -> str:
        v = self.call(what, fn)
        return "" if v is None else v.decode("utf-8", errors="replace")


def read_model(buf: bytes) -> ModelData:
    """Parse and check a .tflite flatbuffer (subgraph 0)."""
    import tflite  # deferred: tflite is a heavy or optional dependency
    buf = bytes(buf)
    if len(buf) < 8:
        raise TFLiteImportError(f"not a TFLite model: {len(buf)} bytes")
    if buf[4:8] != b"TFL3":
        raise TFLiteImportError(f"not a TFLite model: file identifier {buf[4:8]!r}, expected b'TFL3'")
    r = _Reader(buf)
    root = struct.unpack_from("<I", buf, 0)[0]
    if root > len(buf) - 4:
        raise TFLiteImportError(f"model: root offset {root} outside the file ({len(buf)} bytes)")
    m = tflite.Model.GetRootAs(buf, 0)
    r.check_table(m, "model")
    version = r.call("model version", m.Version)
    if version != 3:
        raise TFLiteImportError(f"model: schema version {version}, only version 3 is supported")
    names = _builtin_names()
    n_codes = r.count(r.call("model operator_codes", m.OperatorCodesLength), "model operator_codes")
    codes: List[str] = []
    for k in range(n_codes):
        oc = r.check_table(r.call(f"operator code {k}", m.OperatorCodes, k), f"operator code {k}")
        code = max(int(r.call(f"operator code {k}", oc.DeprecatedBuiltinCode)),
                   int(r.call(f"operator code {k}", oc.BuiltinCode)))
        if code == 32:  # CUSTOM
            codes.append("custom:" + r.text(f"operator code {k} custom_code", oc.CustomCode))
        else:
            codes.append(names.get(code, f"builtin#{code}"))
    n_sub = r.count(r.call("model subgraphs", m.SubgraphsLength), "model subgraphs")
    if n_sub < 1:
        raise TFLiteImportError("model: no subgraphs")
    n_buf = r.count(r.call("model buffers", m.BuffersLength), "model buffers")
    sg = r.check_table(r.call("subgraph 0", m.Subgraphs, 0), "subgraph 0")
    n_t = r.count(r.call("subgraph 0 tensors", sg.TensorsLength), "subgraph 0 tensors")
    tensors = [_tensor(r, m, sg, k, n_buf) for k in range(n_t)]
    n_ops = r.count(r.call("subgraph 0 operators", sg.OperatorsLength), "subgraph 0 operators")
    ops = [_operator(r, sg, k, codes, n_t) for k in range(n_ops)]
    ins = r.ints("subgraph 0 inputs", sg.InputsAsNumpy)
    outs = r.ints("subgraph 0 outputs", sg.OutputsAsNumpy)
    for what, idx in (("input", ins), ("output", outs)):
        bad = [i for i in idx if not 0 <= i < n_t]
        if bad:
            raise TFLiteImportError(f"subgraph 0 {what}s name tensors {bad}; it has {n_t} tensors")
    desc = r.text("model description", m.Description) if hasattr(m, "Description") else ""
    return ModelData(version, tensors, ops, ins, outs, desc)


def _tensor(r: _Reader, m, sg, k: int, n_buf: int) -> TensorData:
    what = f"tensor {k}"
    t = r.check_table(r.call(what, sg.Tensors, k), what)
    name = r.text(f"{what} name", t.Name)
    what = f"tensor {k} '{name}'"
    ttype = int(r.call(f"{what} type", t.Type))
    if ttype not in DTYPES:
        raise TFLiteImportError(f"{what}: tensor type {ttype} is not supported "
                                f"(float32, float16, int8, uint8, int16, int32, int64, bool are)")
    dtype = np.dtype(DTYPES[ttype])
    shape = r.ints(f"{what} shape", t.ShapeAsNumpy)
    sig = r.ints(f"{what} shape_signature", t.ShapeSignatureAsNumpy)
    if sig and len(sig) == len(shape):
        shape = [-1 if s == -1 else d for s, d in zip(sig, shape)]
    if len(shape) > MAX_RANK or any(d < -1 for d in shape):
        raise TFLiteImportError(f"{what}: invalid shape {shape}")
    b = int(r.call(f"{what} buffer", t.Buffer))
    if not 0 <= b < max(n_buf, 1):
        raise TFLiteImportError(f"{what}: buffer index {b} outside the model's {n_buf} buffers")
    data = _buffer_data(r, m, b, what) if n_buf else None
    sparsity = None
    if data is not None:
        from .tflite_sparse import read_sparsity  # cycle: converters.tflite_read <-> converters.tflite_sparse
        sparsity = read_sparsity(r, t, what)
    if sparsity is not None:  # only the non-zeros are stored: densified here, so every op sees dense weights
        from .tflite_sparse import densify  # cycle: converters.tflite_read <-> converters.tflite_sparse
        if any(d < 0 for d in shape):
            raise TFLiteImportError(f"{what}: a sparse constant with unknown dims {shape}")
        if data.size % dtype.itemsize:
            raise TFLiteImportError(f"{what}: sparse tensor buffer {b} holds {data.size} bytes, not a whole number "
                                    f"of {dtype.name} values")
        values = np.frombuffer(data, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False)
        data = densify(values, tuple(shape), sparsity, what)
    elif data is not None:
        if any(d < 0 for d in shape):
            raise TFLiteImportError(f"{what}: a constant with unknown dims {shape}")
        want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if data.size != want:
            raise TFLiteImportError(f"{what}: buffer {b} holds {data.size} bytes, shape {shape} of {dtype.name} "
                                    f"needs {want}")
        data = np.frombuffer(data, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(shape)
    out = TensorData(k, name, dtype, tuple(shape), data)
    q = r.call(f"{what} quantization", t.Quantization)
    if q is not None:
        r.check_table(q, f"{what} quantization")
        scale = r.call(f"{what} quantization scale", q.ScaleAsNumpy)
        zp = r.call(f"{what} quantization zero_point", q.ZeroPointAsNumpy)
        if not isinstance(scale, int) and np.asarray(scale).size:
            out.scale = np.asarray(scale, np.float64).reshape(-1)
            out.zero_point = (np.zeros(out.scale.size, np.int64) if isinstance(zp, int)
                              else np.asarray(zp, np.int64).reshape(-1))
            out.quantized_dimension = int(r.call(f"{what} quantized_dimension", q.QuantizedDimension))
            if out.zero_point.size != out.scale.size:
                raise TFLiteImportError(f"{what}: {out.scale.size} scales but {out.zero_point.size} zero points")
            if not np.all(np.isfinite(out.scale)) or np.any(out.scale <= 0):
                raise TFLiteImportError(f"{what}: quantization scales must be positive and finite")
            if out.scale.size > 1:
                qd = out.quantized_dimension
                if not 0 <= qd < len(shape) or shape[qd] != out.scale.size:
                    raise TFLiteImportError(f"{what}: {out.scale.size} per-channel scales do not match dimension "
                                            f"{qd} of shape {list(shape)}")
    return out


def _buffer_data(r: _Reader, m, b: int, what: str) -> Optional[np.ndarray]:
    buf = r.check_table(r.call(f"buffer {b}", m.Buffers, b), f"buffer {b} (of {what})")
    off, size = int(r.call(f"buffer {b} offset", buf.Offset)), int(r.call(f"buffer {b} size", buf.Size))
    if off > 1:  # data stored after the flatbuffer (models over 2 GiB): offset from the file start
        if off + size > r.n:
            raise TFLiteImportError(f"buffer {b} (of {what}): bytes {off}..{off + size} lie outside the file")
        return np.frombuffer(r.buf, np.uint8, count=size, offset=off)
    v = r.call(f"buffer {b} (of {what}) data", buf.DataAsNumpy)
    if isinstance(v, int) or v.size == 0:
        return None
    return v


def _operator(r: _Reader, sg, k: int, codes: List[str], n_t: int) -> OperatorData:
    what = f"operator {k}"
    o = r.check_table(r.call(what, sg.Operators, k), what)
    ci = int(r.call(f"{what} opcode_index", o.OpcodeIndex))
    if not 0 <= ci < len(codes):
        raise TFLiteImportError(f"{what}: opcode index {ci} outside the model's {len(codes)} operator codes")
    op = codes[ci]
    what = f"operator {k} ({op})"
    ins = r.ints(f"{what} inputs", o.InputsAsNumpy)
    outs = r.ints(f"{what} outputs", o.OutputsAsNumpy)
    for kind, idx in (("input", ins), ("output", outs)):
        bad = [i for i in idx if not -1 <= i < n_t or (kind == "output" and i < 0)]
        if bad:
            raise TFLiteImportError(f"{what}: {kind} tensor indices {bad} outside the subgraph's {n_t} tensors")
    data = OperatorData(k, op, ins, outs)
    if op.startswith("custom:"):
        v = r.call(f"{what} custom_options", o.CustomOptionsAsNumpy)
        data.custom_options = b"" if isinstance(v, int) else np.asarray(v, np.uint8).tobytes()
    if op in _OPTION_FIELDS:
        data.options = _options(r, o, op, what)
    return data


def _options(r: _Reader, o, op: str, what: str) -> Dict[str, object]:
    cls_name, fields = _OPTION_FIELDS[op]
    table = r.call(f"{what} options", o.BuiltinOptions)
    if table is None:
        return {}
    mod = importlib.import_module(f"tflite.{cls_name}")
    opts = getattr(mod, cls_name)()
    opts.Init(table.Bytes, table.Pos)
    r.check_table(opts, f"{what} options")
    out: Dict[str, object] = {}
    for f in fields:
        if f in _VECTOR_FIELDS:
            out[f] = r.ints(f"{what} options {f}", getattr(opts, f + "AsNumpy"))
        else:
            out[f] = r.call(f"{what} options {f}", getattr(opts, f))
    return out
