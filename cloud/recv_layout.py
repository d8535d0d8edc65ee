"""Tensors laid out as their RecvTensor messages, and read back without protobuf copies.

protobuf's Python runtime copies a bytes field when it builds or parses a message, so a
tensor going through TensorProto would be copied twice more than the transport forces.
Here a Send's value is written once into the exact bytes of its answer (a
RecvTensorResponse, or the TensorChunks of a stream: proto/worker.proto, tensor.proto)
and handed to gRPC as is; the receiver reads the headers with a small wire-format reader
and views the payload in place (`np.frombuffer`), or copies each chunk once into the
result (a tensor that came in one chunk is viewed in place too). The bytes are the ones protobuf itself writes (tests check both directions).
"""
from __future__ import annotations

from typing import Iterable, List, Optional, Tuple

import numpy as np

from ..proto import tensor_pb2, worker_pb2
from ..wire import tensor_codec
from ..wire.tensor_codec import TensorCodecError

DEFAULT_INLINE_BYTES = 4 << 20    # bigger tensors stream
DEFAULT_CHUNK_BYTES = 1 << 20     # in pieces of this size


def varint(n: int) -> bytes:
    """A protobuf varint (cloud/rpc.py and cloud/offload.py write their message headers with it)."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def payload(arr: np.ndarray) -> memoryview:
    """The tensor's little-endian bytes for tensor_content, without a copy where numpy allows."""
    return memoryview(tensor_codec.le_bytes(arr)) if arr.size else memoryview(b"")


class WireTensor:
    """One tensor as the messages that carry it: `inline` (a whole RecvTensorResponse), or
    `header` (the streamed=true answer) and `chunks` (the TensorChunk messages)."""
    __slots__ = ("dtype", "shape", "nbytes", "inline", "header", "chunks")

    def __init__(self, arr, inline_bytes: int = DEFAULT_INLINE_BYTES, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 max_bytes: int = tensor_codec.DEFAULT_MAX_BYTES):
        arr = tensor_codec.as_array(arr)
        if arr.nbytes > max_bytes:
            raise TensorCodecError(f"tensor of {arr.nbytes} bytes ({arr.dtype}{list(arr.shape)}) is over "
                                   f"the limit of {max_bytes} bytes")
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        enum = tensor_codec.dtype_to_enum(arr.dtype)
        self.dtype, self.shape, self.nbytes = arr.dtype, tuple(arr.shape), int(arr.nbytes)
        data = payload(arr)
        head = tensor_pb2.TensorProto(dtype=enum, shape=arr.shape).SerializeToString()
        if self.nbytes <= inline_bytes:
            content = b"\x1a" + varint(self.nbytes) if self.nbytes else b""
            inner = len(head) + len(content) + self.nbytes
            self.inline = b"".join((b"\x0a", varint(inner), head, content, data))
            self.header, self.chunks = None, None
            return
        self.inline = None
        self.header = worker_pb2.RecvTensorResponse(tensor=tensor_pb2.TensorProto(dtype=enum, shape=arr.shape),
                                                    streamed=True).SerializeToString()
        self.chunks = []
        for off in range(0, self.nbytes, chunk_bytes):
            piece = data[off:off + chunk_bytes]
            if off == 0:
                h = tensor_pb2.TensorChunk(dtype=enum, shape=arr.shape, total_bytes=self.nbytes).SerializeToString()
            else:
                h = tensor_pb2.TensorChunk(offset=off).SerializeToString()
            self.chunks.append(b"".join((h, b"\x2a", varint(len(piece)), piece)))

    def chunk_messages(self) -> List[bytes]:
        """The TensorChunk messages (one, when the tensor was laid out inline)."""
        if self.chunks is not None:
            return self.chunks
        _, _, content, _ = read_response(self.inline)
        h = tensor_pb2.TensorChunk(dtype=tensor_codec.dtype_to_enum(self.dtype), shape=self.shape,
                                   total_bytes=self.nbytes).SerializeToString()
        return [b"".join((h, b"\x2a", varint(self.nbytes), content))] if self.nbytes else [h]

    def to_array(self) -> np.ndarray:
        if self.inline is not None:
            return response_array(self.inline)
        return chunks_array(self.chunks)


# ---- reading -----------------------------------------------------------------------------
def _read_varint(buf, pos: int, end: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise TensorCodecError("truncated or overlong varint in a tensor message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf, pos: int, end: int):
    """(field number, wire type, value) of a message; value is an int or a (start, end) span."""
    while pos < end:
        key, pos = _read_varint(buf, pos, end)
        field, wt = key >> 3, key & 7
        if wt == 0:
            v, pos = _read_varint(buf, pos, end)
            yield field, 0, v
        elif wt == 2:
            n, pos = _read_varint(buf, pos, end)
            if pos + n > end:
                raise TensorCodecError(f"field {field} claims {n} bytes; the message has {end - pos} left")
            yield field, 2, (pos, pos + n)
            pos += n
        elif wt in (1, 5):
            pos += 8 if wt == 1 else 4
            if pos > end:
                raise TensorCodecError("truncated fixed-width field in a tensor message")
        else:
            raise TensorCodecError(f"unsupported wire type {wt} (field {field}) in a tensor message")


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _shape_field(buf, wt: int, v, shape: list) -> None:
    if wt == 0:
        shape.append(_int64(v))
        return
    pos, end = v
    while pos < end:
        d, pos = _read_varint(buf, pos, end)
        shape.append(_int64(d))


def _read_tensor(buf, pos: int, end: int):
    dtype, shape, content = 0, [], None
    for field, wt, v in _fields(buf, pos, end):
        if field == 1 and wt == 0:
            dtype = v
        elif field == 2:
            _shape_field(buf, wt, v, shape)
        elif field == 3 and wt == 2:
            content = v
    return dtype, shape, content


def _fast_response(data: bytes):
    """read_response for the layout WireTensor writes (and protobuf writes for it): one
    tensor field holding dtype, packed shape and content, in that order; None for any other
    layout (the general reader then decides)."""
    n = len(data)
    if n < 3 or data[0] != 0x0A:
        return None
    inner, pos = _read_varint(data, 1, n)
    if pos + inner != n or pos >= n or data[pos] != 0x08:
        return None
    dtype, pos = _read_varint(data, pos + 1, n)
    shape = []
    if pos < n and data[pos] == 0x12:
        ln, pos = _read_varint(data, pos + 1, n)
        stop = pos + ln
        if stop > n:
            return None
        while pos < stop:
            d, pos = _read_varint(data, pos, stop)
            shape.append(_int64(d))
    mv = memoryview(data)
    if pos == n:
        return dtype, shape, mv[:0], False
    if data[pos] != 0x1A:
        return None
    size, start = _read_varint(data, pos + 1, n)
    if start + size != n:
        return None
    return dtype, shape, mv[start:n], False


def read_response(data) -> Tuple[int, list, memoryview, bool]:
    """(dtype enum, shape, content view, streamed) of a RecvTensorResponse's bytes."""
    got = _fast_response(data) if isinstance(data, bytes) else None
    if got is not None:
        return got
    mv = memoryview(data)
    dtype, shape, span, streamed = 0, [], None, False
    for field, wt, v in _fields(mv, 0, len(mv)):
        if field == 1 and wt == 2:
            dtype, shape, span = _read_tensor(mv, *v)
        elif field == 2 and wt == 0:
            streamed = bool(v)
    return dtype, shape, (mv[span[0]:span[1]] if span else mv[:0]), streamed


def shm_response(seg) -> bytes:
    """The RecvTensorResponse naming a shared-memory segment (cloud/shm.py) instead of carrying bytes."""
    t = tensor_pb2.TensorProto(dtype=tensor_codec.dtype_to_enum(seg.dtype), shape=seg.shape)
    return worker_pb2.RecvTensorResponse(tensor=t, shm_name=seg.name, shm_bytes=seg.nbytes).SerializeToString()


def read_shm(data) -> Optional[Tuple[str, int]]:
    """(segment name, declared bytes) of a RecvTensorResponse naming a segment, else None."""
    mv = memoryview(data)
    name, size = None, 0
    for field, wt, v in _fields(mv, 0, len(mv)):
        if field == 3 and wt == 2:
            try:
                name = bytes(mv[v[0]:v[1]]).decode("ascii")
            except UnicodeDecodeError:
                raise TensorCodecError("shared-memory segment name is not ASCII") from None
        elif field == 4 and wt == 0:
            size = _int64(v)
    return None if name is None else (name, size)


def response_array(data, max_bytes: int = tensor_codec.DEFAULT_MAX_BYTES) -> np.ndarray:
    """The tensor of an inline RecvTensorResponse: a read-only view into `data`."""
    dtype, shape, content, streamed = read_response(data)
    if streamed:
        raise TensorCodecError("the answer says the tensor streams; it carries no content")
    d, shape, nbytes = tensor_codec.check_header(dtype, shape, max_bytes)
    return tensor_codec.from_bytes(content, d, shape, nbytes)


def read_chunk(data) -> Tuple[int, list, int, int, memoryview]:
    """(dtype enum, shape, total bytes, offset, data view) of a TensorChunk's bytes."""
    mv = memoryview(data)
    dtype, shape, total, offset, span = 0, [], 0, 0, None
    for field, wt, v in _fields(mv, 0, len(mv)):
        if field == 1 and wt == 0:
            dtype = v
        elif field == 2:
            _shape_field(mv, wt, v, shape)
        elif field == 3 and wt == 0:
            total = _int64(v)
        elif field == 4 and wt == 0:
            offset = _int64(v)
        elif field == 5 and wt == 2:
            span = v
    return dtype, shape, total, offset, (mv[span[0]:span[1]] if span else mv[:0])


def chunks_array(chunks: Iterable, max_bytes: int = tensor_codec.DEFAULT_MAX_BYTES,
                 expect: Optional[Tuple[int, list]] = None) -> np.ndarray:
    """Reassemble TensorChunk messages (bytes, or already read by read_chunk) into one array;
    each chunk is copied once, into place. `expect`: the (dtype, shape) announced before."""
    it = iter(chunks)
    first = next(it, None)
    if first is None:
        raise TensorCodecError("tensor stream ended before its first chunk")
    dtype, shape, total, offset, piece = first if isinstance(first, tuple) else read_chunk(first)
    d, shape, nbytes = tensor_codec.check_header(dtype, shape, max_bytes)
    if expect is not None and (expect[0] != dtype or list(expect[1]) != list(shape)):
        raise TensorCodecError(f"tensor stream carries {d.name}{list(shape)}; the answer announced "
                               f"{tensor_pb2.DataType.Name(expect[0]) if expect[0] in tensor_pb2.DataType.values() else expect[0]}"
                               f"{list(expect[1])}")
    if total != nbytes:
        raise TensorCodecError(f"tensor stream declares {total} bytes; {d.name}{list(shape)} needs {nbytes}")
    if offset == 0 and len(piece) == nbytes:  # one chunk carries it all: a view, no copy
        if next(it, None) is not None:
            raise TensorCodecError(f"tensor chunks carry more than the declared {nbytes} bytes")
        return tensor_codec.from_bytes(piece, d, shape, nbytes)
    out = np.empty(nbytes, np.uint8)
    pos = 0
    while True:
        n = len(piece)
        if offset != pos:
            raise TensorCodecError(f"tensor chunk at offset {offset}; expected {pos} (chunks out of order or lost)")
        if pos + n > nbytes:
            raise TensorCodecError(f"tensor chunks carry more than the declared {nbytes} bytes")
        out[pos:pos + n] = np.frombuffer(piece, np.uint8)
        pos += n
        nxt = next(it, None)
        if nxt is None:
            break
        _, _, _, offset, piece = nxt if isinstance(nxt, tuple) else read_chunk(nxt)
    if pos != nbytes:
        raise TensorCodecError(f"tensor stream ended after {pos} of {nbytes} bytes")
    return tensor_codec.from_bytes(out, d, shape, nbytes)
