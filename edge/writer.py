"""Write edge model files: a flatbuffer (model -> subgraphs -> tensors, operators) followed by
one 16-byte-aligned data section holding every weight once."""
from __future__ import annotations

import functools
import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

import flatbuffers
import numpy as np

from isthmus.proto.edge import (Attr, Metadata, Model, Operator, OperatorCode, Quantization, RemotePart, Span,
                                SubGraph, Tensor)

from .format import ALIGN, DTYPE_CODES, FILE_IDENTIFIER, FLOAT, FLOATS, INT, INTS, SCHEMA_VERSION, STRING, scales_to_codes

AttrValue = Union[int, float, str, Sequence[int], Sequence[float]]


class ModelWriter:
    """Collect tensors and operators, then `to_bytes()` / `save(path)`.

    >>> w = ModelWriter(); x = w.add_input("x", "float32", (1, 4))
    >>> wt = w.add_constant("w", np.ones((4, 2), np.float32)); y = w.add_tensor("y", "float32", (1, 2))
    >>> w.add_operator("MatMul", [x, wt], [y]); w.mark_output(y)
    """

    def __init__(self, producer: str = "isthmus", version: int = SCHEMA_VERSION):
        self.producer, self.version = producer, version
        self.tensors: List[dict] = []
        self.operators: List[dict] = []
        self.opcodes: Dict[Tuple[str, int], int] = {}
        self.buffers: List[bytes] = [b""]  # buffer 0 is empty
        self._buffer_ids: Dict[Tuple[int, bytes], int] = {}
        self.inputs: List[int] = []
        self.outputs: List[int] = []
        self.remote: List[dict] = []
        self.metadata: Dict[str, str] = {}

    # ---- building ------------------------------------------------------------------------------
    def add_tensor(self, name: str, dtype, shape: Sequence[Optional[int]], data: Optional[np.ndarray] = None,
                   scale: Optional[Sequence[float]] = None, zero_point: Optional[Sequence[int]] = None,
                   axis: int = -1) -> int:
        dt = np.dtype(dtype)
        if dt not in DTYPE_CODES:
            raise ValueError(f"tensor '{name}': dtype {dt} has no edge code")
        buf = 0
        if data is not None:
            arr = np.asarray(data, dtype=dt)  # (ascontiguousarray would make a 0-d scalar 1-d)
            arr = arr if arr.flags.c_contiguous else arr.copy(order="C")
            if tuple(arr.shape) != tuple(-1 if d is None else d for d in shape):
                raise ValueError(f"tensor '{name}': data shape {arr.shape} != {tuple(shape)}")
            raw = arr.tobytes()
            key = (len(raw), raw)
            buf = self._buffer_ids.get(key)  # weights stored once even if shared
            if buf is None:
                buf = self._buffer_ids[key] = len(self.buffers)
                self.buffers.append(raw)
        self.tensors.append(dict(name=name, dtype=DTYPE_CODES[dt], shape=[-1 if d is None else int(d) for d in shape],
                                 buffer=buf, scale=scale, zero_point=zero_point, axis=axis))
        return len(self.tensors) - 1

    def add_input(self, name: str, dtype, shape) -> int:
        i = self.add_tensor(name, dtype, shape)
        self.inputs.append(i)
        return i

    def add_constant(self, name: str, value: np.ndarray, **quant) -> int:
        value = np.asarray(value)
        return self.add_tensor(name, value.dtype, value.shape, data=value, **quant)

    def add_blob(self, data: bytes) -> int:
        """Store opaque bytes (a delegate's model, say) in the data section; returns the buffer index."""
        self.buffers.append(bytes(data))
        return len(self.buffers) - 1

    def mark_output(self, index: int) -> None:
        self.outputs.append(index)

    def add_operator(self, op: str, inputs: Sequence[int], outputs: Sequence[int],
                     attrs: Optional[Dict[str, AttrValue]] = None, version: int = 1) -> int:
        code = self.opcodes.setdefault((op, version), len(self.opcodes))
        self.operators.append(dict(opcode=code, inputs=list(inputs), outputs=list(outputs), attrs=dict(attrs or {})))
        return len(self.operators) - 1

    def add_remote_part(self, name: str, inputs: Sequence[int], outputs: Sequence[int]) -> None:
        self.remote.append(dict(name=name, inputs=list(inputs), outputs=list(outputs)))

    # ---- serialising -----------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        # the flatbuffer depends on the data offsets, which depend on its size: build twice
        fb = self._flatbuffer([0] * len(self.buffers))
        for _ in range(3):
            offsets = self._layout(len(fb))
            fb2 = self._flatbuffer(offsets)
            if len(fb2) == len(fb):
                fb = fb2
                break
            fb = fb2
        offsets = self._layout(len(fb))
        out = bytearray(fb)
        for off, raw in zip(offsets, self.buffers):
            if raw:
                out.extend(b"\0" * (off - len(out)))
                out.extend(raw)
        return bytes(out)

    def save(self, path: str) -> str:
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(self.to_bytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path

    def _layout(self, fb_size: int) -> List[int]:
        pos = -(-fb_size // ALIGN) * ALIGN
        offsets = []
        for raw in self.buffers:
            if raw:
                offsets.append(pos)
                pos = -(-(pos + len(raw)) // ALIGN) * ALIGN
            else:
                offsets.append(0)
        return offsets

    def _subgraph_tables(self) -> List[dict]:
        """The subgraphs to write, each a dict of name, tensors, operators, inputs, outputs, remote
        (one here; a writer of several subgraphs overrides this)."""
        return [dict(name="main", tensors=self.tensors, operators=self.operators, inputs=self.inputs,
                     outputs=self.outputs, remote=self.remote)]

    def _flatbuffer(self, offsets: List[int]) -> bytes:
        b = flatbuffers.Builder(1024)
        # flatbuffer objects are immutable and referenced by offset, so equal ones are written once and
        # shared: shape and index vectors, quantization tables, attributes and whole attribute lists
        self._memo: Dict[tuple, int] = {}
        sg_offs = [self._subgraph(b, sg) for sg in self._subgraph_tables()]
        code_offs = []
        for (name, version), _ in sorted(self.opcodes.items(), key=lambda kv: kv[1]):
            nm = b.CreateString(name)
            OperatorCode.Start(b)
            OperatorCode.AddName(b, nm)
            OperatorCode.AddVersion(b, version)
            code_offs.append(OperatorCode.End(b))
        codes = _table_vector(b, Model.StartOperatorCodesVector, code_offs)
        Model.StartBufferSpansVector(b, len(self.buffers))  # structs (schema 2): 16 bytes a buffer
        for off, raw in reversed(list(zip(offsets, self.buffers))):
            Span.CreateSpan(b, off, len(raw))
        spans = b.EndVector()
        md_offs = []
        for k, v in sorted(self.metadata.items()):
            ko, vo = b.CreateString(k), b.CreateString(v)
            Metadata.Start(b)
            Metadata.AddKey(b, ko)
            Metadata.AddValue(b, vo)
            md_offs.append(Metadata.End(b))
        md = _table_vector(b, Model.StartMetadataVector, md_offs)
        subgraphs = _table_vector(b, Model.StartSubgraphsVector, sg_offs)
        producer = b.CreateString(self.producer)
        Model.Start(b)
        Model.AddVersion(b, self.version)
        Model.AddProducer(b, producer)
        Model.AddOperatorCodes(b, codes)
        Model.AddSubgraphs(b, subgraphs)
        Model.AddBufferSpans(b, spans)
        Model.AddMetadata(b, md)
        b.Finish(Model.End(b), file_identifier=FILE_IDENTIFIER)
        return bytes(b.Output())

    def _shared(self, key: tuple, make) -> int:
        """The offset of the object `key` describes, made by make() the first time only."""
        off = self._memo.get(key)
        if off is None:
            off = self._memo[key] = make()
        return off

    def _quantization(self, b, scale, zero_point, axis: int) -> int:
        codes = _codes(scale, zero_point) if axis >= 0 else None
        if codes is not None:  # one float and a byte per channel (schema version 2)
            scale, zero_point = [max(scale)], []
        sc, zp = self._vec(b, scale, np.float32), self._vec(b, zero_point, np.int64)
        cv = None if codes is None else self._vec(b, codes, np.uint8)
        Quantization.Start(b)
        Quantization.AddScale(b, sc)
        Quantization.AddZeroPoint(b, zp)
        Quantization.AddAxis(b, axis)
        if cv is not None:
            Quantization.AddScaleCodes(b, cv)
        return Quantization.End(b)

    def _vec(self, b, items, dtype) -> int:
        arr = np.asarray(items, dtype=dtype)
        return self._shared(("vec", arr.dtype.str, arr.tobytes()), lambda: b.CreateNumpyVector(arr))

    def _subgraph(self, b, sg: dict) -> int:
        vec = functools.partial(self._vec, b)
        tensor_offs = []
        for t in sg["tensors"]:
            name = b.CreateString(t["name"])
            dims = all(-1 <= d < 1 << 31 for d in t["shape"])  # int32 dims (schema 2), else the int64 shape
            shape = vec(t["shape"], np.int32 if dims else np.int64)
            q = None
            inline = _inline_quantization(t)  # (scale, zero point) held in the tensor (schema 2), or None
            if inline is None and t["scale"] is not None:
                zps = t["zero_point"] if t["zero_point"] is not None else [0] * len(t["scale"])
                key = ("quant", np.asarray(t["scale"], np.float32).tobytes(), np.asarray(zps, np.int64).tobytes(),
                       t["axis"])
                q = self._shared(key, lambda t=t, zps=zps: self._quantization(b, t["scale"], zps, t["axis"]))
            Tensor.Start(b)
            Tensor.AddName(b, name)
            Tensor.AddDtype(b, t["dtype"])
            (Tensor.AddDims if dims else Tensor.AddShape)(b, shape)
            Tensor.AddBuffer(b, t["buffer"])
            if q is not None:
                Tensor.AddQuantization(b, q)
            if inline is not None:
                Tensor.AddScale(b, inline[0])
                Tensor.AddZeroPoint(b, inline[1])  # (0, the default, is not written)
            tensor_offs.append(Tensor.End(b))
        op_offs = []
        for op in sg["operators"]:
            offs = tuple(self._shared(("attr", k, _attr_key(v)), lambda k=k, v=v: self._attr(b, k, v))
                         for k, v in sorted(op["attrs"].items()))
            attrs = self._shared(("attrs",) + offs, lambda offs=offs: _table_vector(b, Operator.StartAttrsVector, offs))
            ins, outs = vec(op["inputs"], np.int32), vec(op["outputs"], np.int32)
            Operator.Start(b)
            Operator.AddOpcode(b, op["opcode"])
            Operator.AddInputs(b, ins)
            Operator.AddOutputs(b, outs)
            Operator.AddAttrs(b, attrs)
            op_offs.append(Operator.End(b))
        remote_offs = []
        for r in sg["remote"]:
            nm = b.CreateString(r["name"])
            ins, outs = vec(r["inputs"], np.int32), vec(r["outputs"], np.int32)
            RemotePart.Start(b)
            RemotePart.AddName(b, nm)
            RemotePart.AddInputs(b, ins)
            RemotePart.AddOutputs(b, outs)
            remote_offs.append(RemotePart.End(b))
        name = b.CreateString(sg["name"])
        tensors = _table_vector(b, SubGraph.StartTensorsVector, tensor_offs)
        ops = _table_vector(b, SubGraph.StartOperatorsVector, op_offs)
        remote = _table_vector(b, SubGraph.StartRemoteVector, remote_offs)
        ins, outs = vec(sg["inputs"], np.int32), vec(sg["outputs"], np.int32)
        SubGraph.Start(b)
        SubGraph.AddName(b, name)
        SubGraph.AddTensors(b, tensors)
        SubGraph.AddInputs(b, ins)
        SubGraph.AddOutputs(b, outs)
        SubGraph.AddOperators(b, ops)
        SubGraph.AddRemote(b, remote)
        return SubGraph.End(b)

    def _attr(self, b, name: str, value: AttrValue):
        nm = b.CreateSharedString(name)  # attribute names and string values repeat: each stored once
        s = ints = floats = None
        if isinstance(value, str):
            kind, s = STRING, b.CreateSharedString(value)
        elif isinstance(value, (bool, int, np.integer)):
            kind = INT
        elif isinstance(value, (float, np.floating)):
            kind = FLOAT
        else:
            flat = list(np.asarray(value).reshape(-1).tolist())
            if all(isinstance(v, (bool, int)) for v in flat):
                narrow = all(-(1 << 31) <= v < 1 << 31 for v in flat)  # int32 (schema 2) where they fit
                kind, ints = INTS, b.CreateNumpyVector(np.asarray(flat, dtype=np.int32 if narrow else np.int64))
            else:
                kind, floats = FLOATS, b.CreateNumpyVector(np.asarray(flat, dtype=np.float64))
        Attr.Start(b)
        Attr.AddName(b, nm)
        Attr.AddKind(b, kind)
        if kind == INT:
            Attr.AddI(b, int(value))
        elif kind == FLOAT:
            Attr.AddF(b, float(value))
        elif s is not None:
            Attr.AddS(b, s)
        elif ints is not None:
            (Attr.AddInts32 if narrow else Attr.AddInts)(b, ints)
        elif floats is not None:
            Attr.AddFloats(b, floats)
        return Attr.End(b)


def _inline_quantization(t: dict) -> Optional[Tuple[float, int]]:
    """A per-tensor quantization's (scale, zero point) when the tensor can hold it itself: one positive
    finite scale and an int32 zero point."""
    if t["scale"] is None or t["axis"] != -1 or len(t["scale"]) != 1:
        return None
    scale = float(np.float32(t["scale"][0]))
    zps = list(t["zero_point"]) if t["zero_point"] is not None else [0]
    zp = int(zps[0]) if len(zps) == 1 else 0
    if len(zps) > 1 or not (np.isfinite(scale) and scale > 0) or not -(1 << 31) <= zp < 1 << 31:
        return None
    return scale, zp


def _codes(scale, zero_point) -> Optional[np.ndarray]:
    """The scale codes of a per-channel scale of several channels whose zero points are all zero, when
    every channel's float32 scale is exactly what its code gives (edge.format.scales_to_codes); else None."""
    s = np.asarray(scale, np.float32)
    if s.size < 2 or np.any(np.asarray(zero_point)):
        return None
    rounded, codes = scales_to_codes(s)
    return codes if codes is not None and np.array_equal(rounded, s) else None


def _attr_key(value: AttrValue) -> tuple:
    """A hashable key telling attribute values apart by kind too (1, 1.0 and True are three)."""
    if isinstance(value, (str, bool, int, float, np.integer, np.floating)):
        return (type(value).__name__, value)
    flat = np.asarray(value).reshape(-1)
    return ("seq", flat.dtype.str, tuple(flat.tolist()))


def _table_vector(b, start_fn, offs) -> int:
    start_fn(b, len(offs))
    for o in reversed(offs):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()
