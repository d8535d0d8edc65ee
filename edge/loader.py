"""Load and verify an edge model file.

The Python FlatBuffers runtime trusts every offset it reads, so the reader here does not use
the generated accessors: `verify` walks the structure with bounds-checked primitives, checking
each offset, vector length, string, index, dtype, shape and buffer range against the file. A malformed or
hostile file raises EdgeModelError naming what is wrong; work and memory are bounded by the
file's size. Weights are numpy views of the memory-mapped file (no copy).
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from .format import (ALIGN, DTYPES, FILE_IDENTIFIER, FLOAT, FLOATS, INT, INTS, SCHEMA_VERSION, STRING,
                     EdgeModelError, scales_from_codes)

MAX_RANK = 8
MIN_ACTIVATION_LIMIT = 256 << 20  # an activation may need at most max(this, 256 x file size) bytes


class _Reader:
    """Bounds-checked primitives over a flatbuffer."""

    def __init__(self, buf):
        self.buf = buf
        self.n = len(buf)

    def _need(self, pos: int, size: int, what: str) -> None:
        if pos < 0 or size < 0 or pos + size > self.n:
            raise EdgeModelError(f"{what}: bytes {pos}..{pos + size} lie outside the file ({self.n} bytes)")

    def u8(self, pos, what):
        self._need(pos, 1, what)
        return self.buf[pos]

    def u16(self, pos, what):
        self._need(pos, 2, what)
        return struct.unpack_from("<H", self.buf, pos)[0]

    def i32(self, pos, what):
        self._need(pos, 4, what)
        return struct.unpack_from("<i", self.buf, pos)[0]

    def u32(self, pos, what):
        self._need(pos, 4, what)
        return struct.unpack_from("<I", self.buf, pos)[0]

    def table(self, pos: int, what: str) -> "_Table":
        self._need(pos, 4, what)
        if pos % 4:
            raise EdgeModelError(f"{what}: table at {pos} is misaligned")
        vt = pos - self.i32(pos, what)
        vlen = self.u16(vt, f"{what} vtable")
        tsize = self.u16(vt + 2, f"{what} vtable")
        if vlen < 4 or vlen % 2:
            raise EdgeModelError(f"{what}: vtable length {vlen} is invalid")
        self._need(vt, vlen, f"{what} vtable")
        self._need(pos, tsize, f"{what} table body")
        return _Table(self, pos, vt, vlen, tsize, what)


class _Table:
    def __init__(self, r: _Reader, pos, vt, vlen, tsize, what):
        self.r, self.pos, self.vt, self.vlen, self.tsize, self.what = r, pos, vt, vlen, tsize, what

    def field(self, slot: int, size: int) -> Optional[int]:
        """Absolute position of field `slot` (size bytes), or None when absent."""
        e = 4 + 2 * slot
        if e + 2 > self.vlen:
            return None
        off = self.r.u16(self.vt + e, self.what)
        if off == 0:
            return None
        if off + size > self.tsize:
            raise EdgeModelError(f"{self.what}: field {slot} runs past its table")
        return self.pos + off

    def scalar(self, slot: int, fmt: str, default):
        size = struct.calcsize(fmt)
        p = self.field(slot, size)
        if p is None:
            return default
        self.r._need(p, size, self.what)
        return struct.unpack_from("<" + fmt, self.r.buf, p)[0]

    def _target(self, slot: int) -> Optional[int]:
        p = self.field(slot, 4)
        if p is None:
            return None
        return p + self.r.u32(p, self.what)

    def sub(self, slot: int, what: str) -> Optional[_Table]:
        t = self._target(slot)
        return None if t is None else self.r.table(t, f"{self.what}.{what}")

    def vector(self, slot: int, elem: int, what: str) -> Tuple[int, int]:
        """(start, length) of a vector field, bounds checked; (0, 0) when absent."""
        t = self._target(slot)
        if t is None:
            return 0, 0
        n = self.r.u32(t, f"{self.what}.{what}")
        if n > self.r.n // max(elem, 1):
            raise EdgeModelError(f"{self.what}.{what}: length {n} cannot fit in the file")
        self.r._need(t + 4, n * elem, f"{self.what}.{what}")
        return t + 4, n

    def array(self, slot: int, dtype: str, what: str) -> np.ndarray:
        d = np.dtype(dtype)
        start, n = self.vector(slot, d.itemsize, what)
        return np.frombuffer(self.r.buf, dtype=d, count=n, offset=start) if n else np.zeros(0, d)

    def string(self, slot: int, what: str) -> str:
        start, n = self.vector(slot, 1, what)
        if start == 0:
            return ""
        self.r._need(start + n, 1, f"{self.what}.{what}")
        if self.r.buf[start + n] != 0:
            raise EdgeModelError(f"{self.what}.{what}: string is not terminated")
        try:
            return bytes(self.r.buf[start:start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise EdgeModelError(f"{self.what}.{what}: string is not UTF-8") from None

    def tables(self, slot: int, what: str) -> List[_Table]:
        start, n = self.vector(slot, 4, what)
        return [self.r.table(start + 4 * i + self.r.u32(start + 4 * i, what), f"{self.what}.{what}[{i}]")
                for i in range(n)]


@dataclass
class TensorInfo:
    name: str
    dtype: np.dtype
    shape: Tuple[int, ...]  # -1 for run-time dims
    buffer: int
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int
    data: Optional[np.ndarray] = None  # a read-only view of the mapped file for constants


@dataclass
class OperatorInfo:
    op: str
    version: int
    inputs: List[int]
    outputs: List[int]
    attrs: Dict[str, object]


@dataclass
class RemoteInfo:
    name: str
    inputs: List[int]
    outputs: List[int]


@dataclass
class EdgeModel:
    version: int
    producer: str
    tensors: List[TensorInfo]
    operators: List[OperatorInfo]
    inputs: List[int]
    outputs: List[int]
    remote: List[RemoteInfo]
    metadata: Dict[str, str]
    size: int
    buffers: List[Tuple[int, int]] = field(default_factory=list)  # (offset, size), verified
    _keep: object = field(default=None, repr=False)  # the mapping the weight views point into

    def blob(self, index: int) -> memoryview:
        """The raw bytes of buffer `index` (a delegate's embedded model), without a copy."""
        if not 0 < index < len(self.buffers):
            raise EdgeModelError(f"buffer {index} out of range [1, {len(self.buffers)})")
        off, size = self.buffers[index]
        return memoryview(self._keep)[off:off + size]


def _ints(t: _Table, slot: int, what: str, n_tensors: int, allow_absent: bool) -> List[int]:
    vals = t.array(slot, "<i4", what).tolist()
    for v in vals:
        if not (0 <= v < n_tensors or (allow_absent and v == -1)):
            raise EdgeModelError(f"{t.what}.{what}: tensor index {v} out of range [0, {n_tensors})")
    return vals


def _attrs(op: _Table) -> Dict[str, object]:
    out: Dict[str, object] = {}
    for a in op.tables(3, "attrs"):
        name = a.string(0, "name")
        kind = a.scalar(1, "b", 0)
        if kind == INT:
            out[name] = a.scalar(2, "q", 0)
        elif kind == FLOAT:
            out[name] = a.scalar(3, "d", 0.0)
        elif kind == STRING:
            out[name] = a.string(4, "s")
        elif kind == INTS:
            wide, narrow = a.array(5, "<i8", "ints"), a.array(7, "<i4", "ints32")
            if len(wide) and len(narrow):
                raise EdgeModelError(f"{a.what}: attribute '{name}' has both ints and ints32")
            out[name] = tuple(int(v) for v in (narrow if len(narrow) else wide))
        elif kind == FLOATS:
            out[name] = tuple(float(v) for v in a.array(6, "<f8", "floats"))
        else:
            raise EdgeModelError(f"{a.what}: attribute '{name}' has unknown kind {kind}")
    return out


def _inline_quantization(t: _Table, has_table: bool, what: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """(scale, zero point) held in the tensor itself (schema 2), or None; never beside a table."""
    has_scale, has_zp = t.field(6, 4) is not None, t.field(7, 4) is not None
    if not (has_scale or has_zp):
        return None
    if has_table or not has_scale:
        raise EdgeModelError(f"{what}: an inline zero point needs an inline scale, and neither goes with a "
                             "quantization table")
    return (np.array([t.scalar(6, "f", 0.0)], np.float32), np.array([t.scalar(7, "i", 0)], np.int64))


def _buffer_spans(m: _Table) -> List[Tuple[int, int]]:
    """(offset, size) of every buffer: the Span structs (schema 2) or the Buffer tables (schema 1), not both."""
    start, n = m.vector(6, 16, "buffer_spans")
    tables = m.tables(4, "buffers")
    if n and tables:
        raise EdgeModelError("model: both buffers and buffer_spans (a file holds one of the two)")
    if n:
        return [tuple(int(v) for v in pair) for pair in np.frombuffer(m.r.buf, "<u8", 2 * n, start).reshape(n, 2)]
    return [(b.scalar(0, "Q", 0), b.scalar(1, "Q", 0)) for b in tables]


def _shape(t: _Table, what: str) -> Tuple[int, ...]:
    """A tensor's shape: its int32 `dims` (schema 2) or its int64 `shape` (schema 1), not both."""
    dims, shape = t.array(5, "<i4", "dims"), t.array(2, "<i8", "shape")
    if len(dims) and len(shape):
        raise EdgeModelError(f"{what}: both a shape and dims (a file holds one of the two)")
    return tuple(int(d) for d in (dims if len(dims) else shape))


def verify(buf) -> EdgeModel:
    """Walk and check the whole model in `buf` (bytes, mmap, memoryview); return its contents."""
    models = verify_all(buf, single=True)
    return models[0]


def verify_all(buf, single: bool = False) -> List[EdgeModel]:
    """Every subgraph of the model in `buf` as its own checked EdgeModel (sharing the file's
    buffers and metadata); `single`: the file must hold exactly one (a plain model, not a split one)."""
    r = _Reader(buf)
    if r.n < 8:
        raise EdgeModelError(f"file is {r.n} bytes: too short to be an edge model")
    if bytes(buf[4:8]) != FILE_IDENTIFIER:
        raise EdgeModelError(f"not an isthmus edge model: file identifier {bytes(buf[4:8])!r}, expected {FILE_IDENTIFIER!r}")
    m = r.table(r.u32(0, "root offset"), "model")
    version = m.scalar(0, "I", 0)
    if version > SCHEMA_VERSION:
        raise EdgeModelError(f"model schema version {version} is newer than this reader's ({SCHEMA_VERSION}); "
                             "update isthmus to load it")
    producer = m.string(1, "producer")
    codes = [(c.string(0, "name"), c.scalar(1, "i", 1)) for c in m.tables(2, "operator_codes")]
    bufs = []
    for i, (off, size) in enumerate(_buffer_spans(m)):
        if size and (off % ALIGN or off + size > r.n):
            raise EdgeModelError(f"buffer {i}: bytes {off}..{off + size} are misaligned or outside the file ({r.n})")
        bufs.append((off, size))
    if not bufs or bufs[0][1] != 0:
        raise EdgeModelError("buffer 0 must exist and be empty")
    metadata = {md.string(0, "key"): md.string(1, "value") for md in m.tables(5, "metadata")}
    subgraphs = m.tables(3, "subgraphs")
    if single and len(subgraphs) != 1:
        raise EdgeModelError(f"expected one subgraph, found {len(subgraphs)}")
    if not subgraphs:
        raise EdgeModelError("the model has no subgraph")
    out = []
    for k, sg in enumerate(subgraphs):
        where = "" if single else f"subgraph {k}: "
        tensors, ops, ins, outs, remote = _subgraph(r, sg, bufs, codes, where)
        out.append(EdgeModel(version, producer, tensors, ops, ins, outs, remote, metadata, r.n, bufs))
    return out


def _subgraph(r: _Reader, sg, bufs, codes, where: str):
    """(tensors, operators, inputs, outputs, remote parts) of one subgraph, every field checked;
    `where` prefixes each message ("subgraph 2: " in a file of several)."""
    tensors = []
    for i, t in enumerate(sg.tables(1, "tensors")):
        name = t.string(0, "name")
        code = t.scalar(1, "b", 0)
        if code not in DTYPES:
            raise EdgeModelError(f"{where}tensor {i} '{name}': unknown dtype code {code}")
        shape = _shape(t, f"{where}tensor {i} '{name}'")
        if len(shape) > MAX_RANK or any(d < -1 for d in shape):
            raise EdgeModelError(f"{where}tensor {i} '{name}': invalid shape {shape}")
        buf = t.scalar(3, "I", 0)
        if buf >= len(bufs):
            raise EdgeModelError(f"{where}tensor {i} '{name}': buffer {buf} out of range [0, {len(bufs)})")
        q = t.sub(4, "quantization")
        scale = q.array(0, "<f4", "scale") if q else np.zeros(0, np.float32)
        zp = q.array(1, "<i8", "zero_point") if q else np.zeros(0, np.int64)
        axis = q.scalar(2, "i", -1) if q else -1
        inline = _inline_quantization(t, q is not None, f"{where}tensor {i} '{name}'")
        if inline is not None:
            scale, zp = inline
        scale_codes = q.array(3, "<u1", "scale_codes") if q else None
        if scale_codes is not None and len(scale_codes):  # schema 2: one scale and a byte per channel
            if axis == -1 or len(scale) != 1 or len(zp):
                raise EdgeModelError(f"{where}tensor {i} '{name}': scale codes need a channel axis, one scale "
                                     f"and no zero points (got axis {axis}, {len(scale)} scales, "
                                     f"{len(zp)} zero points)")
            scale = scales_from_codes(scale[0], scale_codes)  # (checked below with the count and sign of every scale)
        if len(zp) and len(zp) != len(scale):
            raise EdgeModelError(f"{where}tensor {i} '{name}': {len(scale)} scales but {len(zp)} zero points")
        if not -1 <= axis < len(shape):
            raise EdgeModelError(f"{where}tensor {i} '{name}': quantization axis {axis} outside shape {shape}")
        want_scales = (0, 1) if axis == -1 else (shape[axis],) if shape[axis] != -1 else (len(scale),)
        if len(scale) not in want_scales:
            raise EdgeModelError(f"{where}tensor {i} '{name}': {len(scale)} scales for quantization axis {axis} "
                                 f"of {shape}")
        if len(scale) and not (np.all(np.isfinite(scale)) and np.all(scale > 0)):
            raise EdgeModelError(f"{where}tensor {i} '{name}': quantization scales must be positive and finite")
        dt = DTYPES[code]
        data = None
        known = math.prod(d for d in shape if d != -1) * dt.itemsize  # Python ints: no overflow
        if known > max(MIN_ACTIVATION_LIMIT, 256 * r.n):
            raise EdgeModelError(f"{where}tensor {i} '{name}': {dt.name}{list(shape)} would need {known} bytes, "
                                 "beyond the bound for a file of this size")
        if buf:
            off, size = bufs[buf]
            if -1 in shape:
                raise EdgeModelError(f"{where}tensor {i} '{name}': a constant needs a known shape, got {shape}")
            if size != known:
                raise EdgeModelError(f"{where}tensor {i} '{name}': buffer {buf} holds {size} bytes, "
                                     f"{dt.name}{list(shape)} needs {known}")
            data = np.frombuffer(r.buf, dtype=dt, count=known // dt.itemsize, offset=off).reshape(shape) \
                if known else np.zeros(shape, dt)
        if len(scale) and not len(zp):  # no zero points written: all zero (the quantizer's symmetric weights)
            zp = np.zeros(len(scale), np.int64)
        tensors.append(TensorInfo(name, dt, shape, buf, scale, zp, axis, data))
    n = len(tensors)
    ops = []
    for i, o in enumerate(sg.tables(4, "operators")):
        code = o.scalar(0, "I", 0)
        if code >= len(codes):
            raise EdgeModelError(f"{where}operator {i}: opcode {code} out of range [0, {len(codes)})")
        ops.append(OperatorInfo(codes[code][0], codes[code][1], _ints(o, 1, "inputs", n, True),
                                _ints(o, 2, "outputs", n, False), _attrs(o)))
    remote = [RemoteInfo(p.string(0, "name"), _ints(p, 1, "inputs", n, False), _ints(p, 2, "outputs", n, False))
              for p in sg.tables(5, "remote")]
    ins, outs = _ints(sg, 2, "inputs", n, False), _ints(sg, 3, "outputs", n, False)
    _check_dataflow(tensors, ops, ins, outs, remote, where)
    return tensors, ops, ins, outs, remote


def _check_dataflow(tensors, ops, ins, outs, remote, where: str) -> None:
    """Every tensor read (by an operator, a remote part, or as an output) is written exactly once:
    an input, a constant, or one operator's or remote part's output. Without remote parts the
    operators run in file order, so each reads only what is written before it."""
    written = {i: "an input" for i in ins}
    written.update((i, "a constant") for i, t in enumerate(tensors) if t.buffer)
    producers = [(f"operator {k} ({op.op})", op.outputs) for k, op in enumerate(ops)]
    producers += [(f"remote part '{p.name}'", p.outputs) for p in remote]
    for who, made in producers:
        for i in made:
            if i in written:
                raise EdgeModelError(f"{where}{who}: output tensor {i} '{tensors[i].name}' is a constant, "
                                     f"an input, or written twice (already {written[i]})")
            written[i] = who
    ready = {i for i, w in written.items() if w in ("an input", "a constant")}
    for k, op in enumerate(ops):
        for i in op.inputs:
            if i >= 0 and i not in written:
                raise EdgeModelError(f"{where}operator {k} ({op.op}): input tensor {i} '{tensors[i].name}' "
                                     "is written by nothing (not an input, a constant or any output)")
            if i >= 0 and not remote and i not in ready:
                raise EdgeModelError(f"{where}operator {k} ({op.op}): input tensor {i} '{tensors[i].name}' "
                                     f"is read before any operator writes it (written later, by {written[i]})")
        ready.update(op.outputs)
    for p in remote:
        for i in p.inputs:
            if i not in written:
                raise EdgeModelError(f"{where}remote part '{p.name}': input tensor {i} '{tensors[i].name}' "
                                     "is written by nothing")
    for i in outs:
        if i not in written:
            raise EdgeModelError(f"{where}model output {i} '{tensors[i].name}' is produced by nothing "
                                 "(not an input, a constant or any operator's output)")


def load(path: str) -> EdgeModel:
    """Map `path` read-only and verify it; constants are views into the mapping."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise EdgeModelError(f"cannot open edge model {path}: {e}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise EdgeModelError(f"{path}: empty file")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        model = verify(mm)
    except EdgeModelError as e:
        mm.close()
        raise EdgeModelError(f"{path}: {e}") from None
    model._keep = mm
    return model


def loads(data: bytes) -> EdgeModel:
    model = verify(data)
    model._keep = data
    return model
