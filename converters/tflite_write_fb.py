"""Serialize a TFLite (LiteRT) model: tensors, buffers, operators, metadata, one signature.

A plain in-memory builder (lists of tensors and operators) that the op translation fills and
`to_bytes` writes through the TFLite schema code of the PyPI `tflite` package (tflite_schema.py;
the `tflite` extra). Buffer 0 is the empty
buffer by the schema's convention; weights are 16-byte aligned in the flatbuffer.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import flatbuffers
import numpy as np

from .tflite_schema import fb

# numpy dtype -> the schema's TensorType member (resolved when writing: `tflite` is imported lazily)
TENSOR_TYPES = {np.dtype(np.float32): "FLOAT32", np.dtype(np.float16): "FLOAT16", np.dtype(np.int32): "INT32",
                np.dtype(np.uint8): "UINT8", np.dtype(np.int64): "INT64", np.dtype(np.bool_): "BOOL",
                np.dtype(np.int16): "INT16", np.dtype(np.int8): "INT8", np.dtype(np.float64): "FLOAT64"}
SCHEMA_VERSION = 3


@dataclass
class FbTensor:
    name: str
    dtype: np.dtype
    shape: Tuple[int, ...]
    buffer: int = 0
    scale: Optional[List[float]] = None
    zero_point: Optional[List[int]] = None
    axis: int = 0
    signature: Optional[Tuple[int, ...]] = None  # shape with -1 where the size is free (batch)
    is_variable: bool = False                     # a state an op keeps across invokes (LSTM h and c)


@dataclass
class FbOperator:
    code: int                      # index into the builder's operator codes
    inputs: List[int]
    outputs: List[int]
    options_type: int = 0          # fb.BuiltinOptions.X (0: none)
    options: Dict[str, object] = field(default_factory=dict)


class TFLiteBuilder:
    """Tensors, buffers and operators of one subgraph, serialized by `to_bytes`."""

    def __init__(self, description: str = "isthmus converters/tflite_write.py"):
        self.description = description
        self.tensors: List[FbTensor] = []
        self.buffers: List[bytes] = [b""]
        self.operators: List[FbOperator] = []
        self.codes: List[Tuple[int, int]] = []   # (builtin code, version)
        self.inputs: List[int] = []
        self.outputs: List[int] = []
        self.metadata: Dict[str, bytes] = {}

    # ---- filling --------------------------------------------------------------------------------
    def tensor(self, name: str, dtype, shape: Sequence[int], data: Optional[np.ndarray] = None,
               scale=None, zero_point=None, axis: int = 0, signature=None, is_variable: bool = False) -> int:
        dtype = np.dtype(dtype)
        if dtype not in TENSOR_TYPES:
            raise ValueError(f"tensor '{name}': dtype {dtype} has no TFLite type")
        buf = 0
        if data is not None:
            arr = np.array(data, dtype, order="C", copy=None)   # (ascontiguousarray makes a 0-d array 1-d)
            if tuple(arr.shape) != tuple(shape):
                raise ValueError(f"tensor '{name}': data shape {arr.shape} differs from {tuple(shape)}")
            self.buffers.append(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
            buf = len(self.buffers) - 1
        self.tensors.append(FbTensor(name, dtype, tuple(int(d) for d in shape), buf,
                                     None if scale is None else [float(s) for s in scale],
                                     None if zero_point is None else [int(z) for z in zero_point], int(axis),
                                     None if signature is None else tuple(int(d) for d in signature), is_variable))
        return len(self.tensors) - 1

    def const(self, name: str, value: np.ndarray, **q) -> int:
        value = np.asarray(value)
        return self.tensor(name, value.dtype, value.shape, value, **q)

    def op(self, builtin: str, inputs: Sequence[int], outputs: Sequence[int], options_type: str = "",
           version: int = 1, **options) -> None:
        code = getattr(fb.BuiltinOperator, builtin)
        key = (code, version)
        if key not in self.codes:
            self.codes.append(key)
        self.operators.append(FbOperator(self.codes.index(key), list(inputs), list(outputs),
                                         getattr(fb.BuiltinOptions, options_type) if options_type else 0,
                                         options))

    # ---- serialization ----------------------------------------------------------------------------
    def to_bytes(self, signature_key: str = "serving_default") -> bytes:
        size = sum(len(x) for x in self.buffers) + sum(len(v) for v in self.metadata.values())
        b = flatbuffers.Builder(size + 65536)
        meta_bufs = []
        for key, value in self.metadata.items():
            self.buffers.append(value)
            meta_bufs.append((key, len(self.buffers) - 1))
        try:
            bufs = [self._buffer(b, data) for data in self.buffers]
        finally:
            del self.buffers[len(self.buffers) - len(meta_bufs):]
        tensors = [self._tensor(b, t) for t in self.tensors]
        ops = [self._operator(b, o) for o in self.operators]
        name = b.CreateString("main")
        t_vec = _offsets(b, fb.SubGraphStartTensorsVector, tensors)
        i_vec = _ints(b, fb.SubGraphStartInputsVector, self.inputs)
        o_vec = _ints(b, fb.SubGraphStartOutputsVector, self.outputs)
        op_vec = _offsets(b, fb.SubGraphStartOperatorsVector, ops)
        fb.SubGraphStart(b)
        fb.SubGraphAddTensors(b, t_vec)
        fb.SubGraphAddInputs(b, i_vec)
        fb.SubGraphAddOutputs(b, o_vec)
        fb.SubGraphAddOperators(b, op_vec)
        fb.SubGraphAddName(b, name)
        sub = fb.SubGraphEnd(b)
        codes = []
        for code, version in self.codes:
            fb.OperatorCodeStart(b)
            fb.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, fb.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES))
            fb.OperatorCodeAddBuiltinCode(b, code)
            fb.OperatorCodeAddVersion(b, version)
            codes.append(fb.OperatorCodeEnd(b))
        metas = []
        for key, index in meta_bufs:
            k = b.CreateString(key)
            fb.MetadataStart(b)
            fb.MetadataAddName(b, k)
            fb.MetadataAddBuffer(b, index)
            metas.append(fb.MetadataEnd(b))
        sig = self._signature(b, signature_key)
        codes_v = _offsets(b, fb.ModelStartOperatorCodesVector, codes)
        subs_v = _offsets(b, fb.ModelStartSubgraphsVector, [sub])
        bufs_v = _offsets(b, fb.ModelStartBuffersVector, bufs)
        meta_v = _offsets(b, fb.ModelStartMetadataVector, metas)
        sig_v = _offsets(b, fb.ModelStartSignatureDefsVector, [sig])
        desc = b.CreateString(self.description)
        fb.ModelStart(b)
        fb.ModelAddVersion(b, SCHEMA_VERSION)
        fb.ModelAddOperatorCodes(b, codes_v)
        fb.ModelAddSubgraphs(b, subs_v)
        fb.ModelAddDescription(b, desc)
        fb.ModelAddBuffers(b, bufs_v)
        fb.ModelAddMetadata(b, meta_v)
        fb.ModelAddSignatureDefs(b, sig_v)
        b.Finish(fb.ModelEnd(b), file_identifier=b"TFL3")
        return bytes(b.Output())

    @staticmethod
    def _buffer(b, data: bytes) -> int:
        vec = None
        if data:
            b.StartVector(1, len(data), 16)
            b.head -= len(data)
            b.Bytes[b.head:b.head + len(data)] = data
            b.vectorNumElems = len(data)
            vec = b.EndVector()
        fb.BufferStart(b)
        if vec is not None:
            fb.BufferAddData(b, vec)
        return fb.BufferEnd(b)

    @staticmethod
    def _tensor(b, t: FbTensor) -> int:
        name = b.CreateString(t.name)
        shape = b.CreateNumpyVector(np.asarray(t.shape, np.int32))
        sig = b.CreateNumpyVector(np.asarray(t.signature, np.int32)) if t.signature is not None else None
        quant = None
        if t.scale is not None:
            sc = b.CreateNumpyVector(np.asarray(t.scale, np.float32))
            zp = b.CreateNumpyVector(np.asarray(t.zero_point, np.int64))
            fb.QuantizationParametersStart(b)
            fb.QuantizationParametersAddScale(b, sc)
            fb.QuantizationParametersAddZeroPoint(b, zp)
            fb.QuantizationParametersAddQuantizedDimension(b, t.axis)
            quant = fb.QuantizationParametersEnd(b)
        fb.TensorStart(b)
        fb.TensorAddShape(b, shape)
        fb.TensorAddType(b, getattr(fb.TensorType, TENSOR_TYPES[t.dtype]))
        fb.TensorAddBuffer(b, t.buffer)
        fb.TensorAddName(b, name)
        if quant is not None:
            fb.TensorAddQuantization(b, quant)
        if sig is not None:
            fb.TensorAddShapeSignature(b, sig)
        fb.TensorAddHasRank(b, True)
        if t.is_variable:
            fb.TensorAddIsVariable(b, True)
        return fb.TensorEnd(b)

    @staticmethod
    def _operator(b, o: FbOperator) -> int:
        opts = _options(b, o.options_type, o.options) if o.options_type else None
        ins = _ints(b, fb.OperatorStartInputsVector, o.inputs)
        outs = _ints(b, fb.OperatorStartOutputsVector, o.outputs)
        fb.OperatorStart(b)
        fb.OperatorAddOpcodeIndex(b, o.code)
        fb.OperatorAddInputs(b, ins)
        fb.OperatorAddOutputs(b, outs)
        if opts is not None:
            fb.OperatorAddBuiltinOptionsType(b, o.options_type)
            fb.OperatorAddBuiltinOptions(b, opts)
        return fb.OperatorEnd(b)

    def _signature(self, b, key: str) -> int:
        def maps(ids, start):
            tm = []
            for i in ids:
                n = b.CreateString(self.tensors[i].name)
                fb.TensorMapStart(b)
                fb.TensorMapAddName(b, n)
                fb.TensorMapAddTensorIndex(b, i)
                tm.append(fb.TensorMapEnd(b))
            return _offsets(b, start, tm)
        ins = maps(self.inputs, fb.SignatureDefStartInputsVector)
        outs = maps(self.outputs, fb.SignatureDefStartOutputsVector)
        k = b.CreateString(key)
        fb.SignatureDefStart(b)
        fb.SignatureDefAddInputs(b, ins)
        fb.SignatureDefAddOutputs(b, outs)
        fb.SignatureDefAddSignatureKey(b, k)
        fb.SignatureDefAddSubgraphIndex(b, 0)
        return fb.SignatureDefEnd(b)

    def set_metadata_json(self, key: str, value: object) -> None:
        self.metadata[key] = json.dumps(value, sort_keys=True).encode("utf-8")


def _options(b, kind: int, options: Dict[str, object]) -> int:
    """One builtin-options table: the generated <Name>Start/Add<Field>/End functions by name."""
    name = next(k for k, v in vars(fb.BuiltinOptions).items() if v == kind)
    vectors = {k: b.CreateNumpyVector(np.asarray(v, np.int32)) for k, v in options.items()
               if isinstance(v, (list, tuple))}
    getattr(fb, name + "Start")(b)
    for k, v in options.items():
        getattr(fb, f"{name}Add{k}")(b, vectors.get(k, v))
    return getattr(fb, name + "End")(b)


def _offsets(b, start, offs: Sequence[int]) -> int:
    start(b, len(offs))
    for o in reversed(offs):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()


def _ints(b, start, values: Sequence[int]) -> int:
    start(b, len(values))
    for v in reversed(values):
        b.PrependInt32(int(v))
    return b.EndVector()
