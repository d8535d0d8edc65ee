"""ndarray <-> TensorProto (dtype + shape + raw little-endian bytes), and chunked streaming: the one
tensor codec that cloud/ (workers, master, offload service) and edge/ (the offload client) share.

Decoding is strict and cheap: the header (dtype, shape, size) is validated before any
payload is touched, and the array is a zero-copy `np.frombuffer` view of the message's
bytes (read-only, as the bytes are). Every malformed input raises TensorCodecError with
a message naming what is wrong; nothing allocates more than the configured limit.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Optional, Sequence

import numpy as np

from ..proto import tensor_pb2

DEFAULT_MAX_BYTES = 1 << 30        # the largest tensor accepted (1 GiB), configurable per call
DEFAULT_CHUNK_BYTES = 1 << 20      # streamed tensors travel in pieces of this size
MAX_RANK = 32

_TO_ENUM = {
    np.dtype("float16"): tensor_pb2.DT_FLOAT16,
    np.dtype("float32"): tensor_pb2.DT_FLOAT32,
    np.dtype("float64"): tensor_pb2.DT_FLOAT64,
    np.dtype("int8"): tensor_pb2.DT_INT8,
    np.dtype("int16"): tensor_pb2.DT_INT16,
    np.dtype("int32"): tensor_pb2.DT_INT32,
    np.dtype("int64"): tensor_pb2.DT_INT64,
    np.dtype("uint8"): tensor_pb2.DT_UINT8,
    np.dtype("uint16"): tensor_pb2.DT_UINT16,
    np.dtype("uint32"): tensor_pb2.DT_UINT32,
    np.dtype("uint64"): tensor_pb2.DT_UINT64,
    np.dtype("bool"): tensor_pb2.DT_BOOL,
}
_FROM_ENUM = {v: k.newbyteorder("<") if k.itemsize > 1 else k for k, v in _TO_ENUM.items()}
_NATIVE = {v: k for k, v in _TO_ENUM.items()}


class TensorCodecError(ValueError):
    """A tensor could not be encoded or a message is not a valid tensor."""


def dtype_to_enum(dtype) -> int:
    d = np.dtype(dtype)
    e = _TO_ENUM.get(d.newbyteorder("=") if d.byteorder not in ("=", "|") else d)
    if e is None:
        raise TensorCodecError(f"dtype {d} cannot be carried; supported: "
                               + ", ".join(k.name for k in _TO_ENUM))
    return e


def enum_to_dtype(e: int) -> np.dtype:
    """The native-order numpy dtype of a DataType value."""
    d = _NATIVE.get(e)
    if d is None:
        raise TensorCodecError(f"unknown dtype enum {e!r}; known: "
                               + ", ".join(f"{tensor_pb2.DataType.Name(k)}={k}" for k in _NATIVE))
    return d


def le_bytes(arr: np.ndarray):
    """The array's C-order little-endian bytes (a memoryview when no copy is needed)."""
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    arr = np.ascontiguousarray(arr)
    if arr.size == 0:
        return b""
    return memoryview(arr).cast("B")


def as_array(value) -> np.ndarray:
    arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    dtype_to_enum(arr.dtype)
    return arr


def encode(value, out: Optional[tensor_pb2.TensorProto] = None,
           max_bytes: int = DEFAULT_MAX_BYTES) -> tensor_pb2.TensorProto:
    """An ndarray (or array-like) as a TensorProto."""
    arr = as_array(value)
    if arr.nbytes > max_bytes:
        raise TensorCodecError(f"tensor of {arr.nbytes} bytes ({arr.dtype}{list(arr.shape)}) is over "
                               f"the limit of {max_bytes} bytes")
    msg = tensor_pb2.TensorProto() if out is None else out
    msg.dtype = dtype_to_enum(arr.dtype)
    del msg.shape[:]
    msg.shape.extend(arr.shape)
    msg.content = bytes(le_bytes(arr)) if arr.size else b""
    return msg


def check_header(dtype_enum: int, shape: Sequence[int], max_bytes: int = DEFAULT_MAX_BYTES):
    """(native dtype, shape tuple, byte size) of a header, or TensorCodecError."""
    d = enum_to_dtype(dtype_enum)
    shape = tuple(int(s) for s in shape)
    if len(shape) > MAX_RANK:
        raise TensorCodecError(f"tensor rank {len(shape)} is over the limit of {MAX_RANK}")
    for i, s in enumerate(shape):
        if s < 0:
            raise TensorCodecError(f"tensor shape {list(shape)} has a negative dimension ({s} at axis {i})")
    count = 1
    for s in shape:  # Python ints: no overflow; stop early once the limit is passed
        count *= s
        if count * d.itemsize > max_bytes:
            break
    nbytes = count * d.itemsize
    if nbytes > max_bytes:
        raise TensorCodecError(f"tensor {d.name}{list(shape)} needs {nbytes} bytes or more, over "
                               f"the limit of {max_bytes} bytes")
    return d, shape, nbytes


def decode(msg: tensor_pb2.TensorProto, max_bytes: int = DEFAULT_MAX_BYTES) -> np.ndarray:
    """A read-only zero-copy ndarray view of a TensorProto's payload."""
    d, shape, nbytes = check_header(msg.dtype, msg.shape, max_bytes)
    return from_bytes(msg.content, d, shape, nbytes)


def decode_as(msg: tensor_pb2.TensorProto, dtype, shape: Sequence[int], where: str = "tensor",
              max_bytes: int = DEFAULT_MAX_BYTES) -> np.ndarray:
    """decode(), but the header must be `dtype` and `shape` (what the receiver expects), checked
    before the payload is read."""
    try:
        d, got_shape, nbytes = check_header(msg.dtype, msg.shape, max_bytes)
    except TensorCodecError as e:
        raise TensorCodecError(f"{where}: {e}") from None
    want = np.dtype(dtype)
    if d.name != want.name or got_shape != tuple(shape):
        raise TensorCodecError(f"{where}: got {d.name}{list(got_shape)}, expected {want.name}{list(shape)}")
    try:
        return from_bytes(msg.content, d, got_shape, nbytes)
    except TensorCodecError as e:
        raise TensorCodecError(f"{where}: {e}") from None


def from_bytes(payload, dtype: np.dtype, shape: tuple, nbytes: Optional[int] = None) -> np.ndarray:
    if nbytes is None:
        nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    got = len(payload) if not isinstance(payload, memoryview) else payload.nbytes
    if got != nbytes:
        raise TensorCodecError(f"tensor {dtype.name}{list(shape)} needs {nbytes} payload bytes "
                               f"({dtype.itemsize} x {int(np.prod(shape, dtype=object))}), got {got}")
    wire = dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype
    if nbytes == 0:
        return np.zeros(shape, dtype)
    arr = np.frombuffer(payload, dtype=wire).reshape(shape)
    if wire != dtype:  # only on a big-endian host: a copy is unavoidable
        arr = arr.astype(dtype)
    if dtype == np.bool_ and arr.view(np.uint8).max(initial=0) > 1:
        raise TensorCodecError("bool tensor payload holds bytes other than 0 and 1")
    return arr


# ---- chunked streaming -----------------------------------------------------------------
def encode_chunks(value, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                  max_bytes: int = DEFAULT_MAX_BYTES) -> Iterator[tensor_pb2.TensorChunk]:
    """TensorChunks carrying the array: the first has dtype, shape and total size."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    arr = as_array(value)
    if arr.nbytes > max_bytes:
        raise TensorCodecError(f"tensor of {arr.nbytes} bytes is over the limit of {max_bytes} bytes")
    enum = dtype_to_enum(arr.dtype)
    view = le_bytes(arr)
    total = arr.nbytes
    first = tensor_pb2.TensorChunk(dtype=enum, shape=arr.shape, total_bytes=total, offset=0,
                                   data=bytes(view[:chunk_bytes]))
    yield first
    for off in range(chunk_bytes, total, chunk_bytes):
        yield tensor_pb2.TensorChunk(offset=off, data=bytes(view[off:off + chunk_bytes]))


def decode_chunks(chunks: Iterable[tensor_pb2.TensorChunk],
                  max_bytes: int = DEFAULT_MAX_BYTES) -> np.ndarray:
    """Reassemble a streamed tensor into one buffer (one copy: the pieces into place)."""
    it = iter(chunks)
    try:
        first = next(it)
    except StopIteration:
        raise TensorCodecError("tensor stream ended before its first chunk") from None
    d, shape, nbytes = check_header(first.dtype, first.shape, max_bytes)
    if first.total_bytes != nbytes:
        raise TensorCodecError(f"tensor stream declares {first.total_bytes} bytes; "
                               f"{d.name}{list(shape)} needs {nbytes}")
    if first.offset != 0:
        raise TensorCodecError(f"first chunk starts at offset {first.offset}, not 0")
    if len(first.data) == nbytes:  # one chunk: a zero-copy view, like decode()
        return from_bytes(first.data, d, shape, nbytes)
    buf = bytearray(nbytes)
    pos = 0
    for c in _chain(first, it):
        n = len(c.data)
        if c.offset != pos:
            raise TensorCodecError(f"tensor chunk at offset {c.offset}; expected {pos} (chunks out of order or lost)")
        if pos + n > nbytes:
            raise TensorCodecError(f"tensor chunks carry more than the declared {nbytes} bytes")
        buf[pos:pos + n] = c.data
        pos += n
    if pos != nbytes:
        raise TensorCodecError(f"tensor stream ended after {pos} of {nbytes} bytes")
    return from_bytes(buf, d, shape, nbytes)


def _chain(first, rest):
    yield first
    yield from rest
