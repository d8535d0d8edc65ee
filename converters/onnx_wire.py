"""Parsing an ONNX file without copying its weights: initializers' raw_data read in place.

protobuf copies every bytes field it parses, and `TensorProto.raw_data` copies it again on access:
a 100 MB model costs two extra copies of its weights. Here the file's protobuf framing is walked
(tags and lengths only, never per element) to find each top-level initializer's raw_data span;
the model is parsed with those spans cut out, and each weight is read once, into the bytes its
numpy array views (from in-memory bytes: a view of them where aligned). Anything unexpected in the framing returns None, and the caller parses the plain
way (which reports a malformed file properly).
"""
from __future__ import annotations

from typing import Iterator, List, Optional, Tuple

import numpy as np

_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9  # field numbers in onnx.proto
_LEN = 2  # the length-delimited wire type


class _Malformed(Exception):
    """The framing is not what this fast path handles; the plain parser takes over."""


def _varint(buf, pos: int, end: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Malformed
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _fields(buf, start: int, end: int) -> Iterator[Tuple[int, int, int, int, int]]:
    """(field number, wire type, where the field starts, where its value starts, where it ends)."""
    pos = start
    while pos < end:
        tag, vpos = _varint(buf, pos, end)
        field, wt = tag >> 3, tag & 7
        if wt == 0:
            _, vend = _varint(buf, vpos, end)
        elif wt == 1:
            vend = vpos + 8
        elif wt == 5:
            vend = vpos + 4
        elif wt == _LEN:
            n, vpos = _varint(buf, vpos, end)
            vend = vpos + n
        else:  # groups (wire types 3, 4) never appear in onnx.proto
            raise _Malformed
        if field == 0 or vend > end:
            raise _Malformed
        yield field, wt, pos, vpos, vend
        pos = vend


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _only(buf, start: int, end: int, field: int) -> Optional[Tuple[int, int, int]]:
    """The one length-delimited occurrence of `field` in [start, end), or None if absent; repeated
    (protobuf would merge the copies) or of another wire type: _Malformed."""
    found = None
    for f, wt, fstart, vstart, vend in _fields(buf, start, end):
        if f == field:
            if found is not None or wt != _LEN:
                raise _Malformed
            found = (fstart, vstart, vend)
    return found


def parse_without_weights(buf):
    """(ModelProto whose top-level initializers lack their raw_data, [(offset, length) of each
    initializer's raw_data in `buf`, or None], aligned with model.graph.initializer), or None when
    the fast path does not apply. `buf`: the file's bytes or a read-only map of it."""
    import onnx  # deferred: onnx is a heavy or optional dependency
    with memoryview(buf) as mv:
        try:
            graph = _only(mv, 0, len(mv), _MODEL_GRAPH)
            if graph is None:
                return None
            gfield, gstart, gend = graph
            kept, inits = [], []
            for f, wt, fstart, vstart, vend in _fields(mv, gstart, gend):
                if f == _GRAPH_INITIALIZER and wt == _LEN:
                    inits.append((vstart, vend))
                else:
                    kept.append(mv[fstart:vend])
            if not inits:
                return None
            metas, spans = [], []
            for vstart, vend in inits:
                raw = _only(mv, vstart, vend, _TENSOR_RAW_DATA)
                if raw is None:
                    metas.append(bytes(mv[vstart:vend]))
                    spans.append(None)
                else:
                    metas.append(b"".join((mv[vstart:raw[0]], mv[raw[2]:vend])))
                    spans.append((raw[1], raw[2] - raw[1]))
        except _Malformed:
            return None
        new_graph = b"".join(kept)
        del kept
        stripped = b"".join((mv[:gfield], _encode_varint(_MODEL_GRAPH << 3 | _LEN), _encode_varint(len(new_graph)),
                             new_graph, mv[gend:]))
    try:
        model = onnx.load_from_string(stripped)
        tensors: List[object] = [onnx.TensorProto.FromString(m) for m in metas]
    except Exception:  # noqa: BLE001  (the plain parser reports what is wrong)
        return None
    model.graph.initializer.extend(tensors)
    return model, spans


class RawWeights:
    """The initializers' raw_data left in the model's bytes or file, each read once into a bytes object
    the array views (read-only, 16-byte aligned). Not np.empty + readinto: numpy asks for huge pages
    on big arrays, and on a loaded machine the kernel's compaction for them stalled a 100 MB import
    for 1-2 s; bytes are plain pages (measured 2026-11-27, load 16)."""

    def __init__(self, spans: List[Optional[Tuple[int, int]]], data: Optional[bytes] = None,
                 path: Optional[str] = None):
        self.spans, self.data, self.path, self._fh = spans, data, path, None

    def get(self, k: int, dtype, count: int, what: str):
        """Initializer k's raw_data as a flat array of `count` `dtype`s, or None if it has none."""
        span = self.spans[k] if k < len(self.spans) else None
        if span is None:
            return None
        off, n = span
        if count * dtype.itemsize != n:
            raise ValueError(f"{what}: raw_data holds {n} bytes, its dims need {count * dtype.itemsize}")
        if self.data is not None:
            arr = np.frombuffer(self.data, dtype, count, off)
            # a view at an odd offset is unaligned, which BLAS and compiled kernels refuse or run slowly
            return arr if arr.flags.aligned else np.frombuffer(self.data[off:off + n], dtype, count)
        if self._fh is None:
            self._fh = open(self.path, "rb")  # noqa: SIM115  (closed by close())
        self._fh.seek(off)
        buf = self._fh.read(n)
        if len(buf) != n:
            raise ValueError(f"{what}: the file ended inside its raw_data (it changed while being read)")
        return np.frombuffer(buf, dtype, count)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
