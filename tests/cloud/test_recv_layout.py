"""Tensors laid out as their RecvTensor messages: the same bytes protobuf writes, read back in place."""
import numpy as np
import pytest

from isthmus.cloud import recv_layout
from isthmus.wire import tensor_codec
from isthmus.wire.tensor_codec import TensorCodecError
from isthmus.proto import tensor_pb2, worker_pb2

VALUES = [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.array(3.5, np.float64),
    np.zeros((0, 5), np.int8),
    np.array([True, False]),
    np.arange(300, dtype=np.int64) - 150,
    np.ones((2, 3), np.float16)[:, ::2],  # not contiguous
]


@pytest.mark.parametrize("v", VALUES, ids=lambda v: f"{v.dtype}{list(v.shape)}")
def test_inline_is_protobufs_own_encoding(v):
    wt = recv_layout.WireTensor(v)
    ref = worker_pb2.RecvTensorResponse(tensor=tensor_codec.encode(v))
    assert wt.inline == ref.SerializeToString(deterministic=True)
    back = recv_layout.response_array(wt.inline)
    assert back.dtype == v.dtype and back.shape == v.shape and back.tobytes() == np.ascontiguousarray(v).tobytes()
    assert back.size == 0 or not back.flags.writeable  # a view of the message, not a copy
    # and the reader reads what protobuf writes (shape unpacked as well as packed)
    assert recv_layout.response_array(ref.SerializeToString()).tobytes() == back.tobytes()


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_chunks_are_protobufs_own_encoding(chunk):
    v = np.random.default_rng(chunk).standard_normal((5, 13)).astype(np.float32)
    wt = recv_layout.WireTensor(v, inline_bytes=16, chunk_bytes=chunk)
    head = worker_pb2.RecvTensorResponse.FromString(wt.header)
    assert head.streamed and list(head.tensor.shape) == [5, 13] and not head.tensor.content
    ref = list(tensor_codec.encode_chunks(v, chunk_bytes=chunk))
    assert [c.SerializeToString(deterministic=True) for c in ref] == wt.chunks
    assert recv_layout.chunks_array(wt.chunks).tobytes() == v.tobytes()
    # several chunks are copied once, into one writable array; a single chunk is viewed in place
    assert recv_layout.chunks_array(map(recv_layout.read_chunk, wt.chunks)).flags.writeable == (len(wt.chunks) > 1)
    assert wt.to_array().tobytes() == v.tobytes()
    assert recv_layout.chunks_array(recv_layout.WireTensor(v).chunk_messages()).tobytes() == v.tobytes()


def test_hostile_messages_are_refused():
    v = np.arange(6, dtype=np.int32)
    good = recv_layout.WireTensor(v).inline
    with pytest.raises(TensorCodecError, match="claims"):
        recv_layout.response_array(good[:-3])
    with pytest.raises(TensorCodecError, match="truncated"):
        recv_layout.response_array(b"\x0a")
    with pytest.raises(TensorCodecError, match="wire type"):
        recv_layout.response_array(b"\x0f")
    bad = worker_pb2.RecvTensorResponse(tensor=tensor_pb2.TensorProto(dtype=6, shape=[7], content=v.tobytes()))
    with pytest.raises(TensorCodecError, match="needs 28 payload bytes"):
        recv_layout.response_array(bad.SerializeToString())
    bad.tensor.shape[:] = [-6]
    with pytest.raises(TensorCodecError, match="negative"):
        recv_layout.response_array(bad.SerializeToString())
    bad.tensor.dtype = 77
    with pytest.raises(TensorCodecError, match="unknown dtype"):
        recv_layout.response_array(bad.SerializeToString())
    big = worker_pb2.RecvTensorResponse(tensor=tensor_pb2.TensorProto(dtype=3, shape=[1 << 30, 1 << 30]))
    with pytest.raises(TensorCodecError, match="over the limit"):
        recv_layout.response_array(big.SerializeToString())
    with pytest.raises(TensorCodecError, match="over the limit"):
        recv_layout.WireTensor(np.zeros(100, np.float32), max_bytes=64)
    chunks = recv_layout.WireTensor(v, inline_bytes=0, chunk_bytes=8).chunks
    with pytest.raises(TensorCodecError, match="out of order"):
        recv_layout.chunks_array([chunks[0], chunks[2], chunks[1]])
    with pytest.raises(TensorCodecError, match="ended after 16 of 24"):
        recv_layout.chunks_array(chunks[:2])
    with pytest.raises(TensorCodecError, match="before its first chunk"):
        recv_layout.chunks_array([])
    with pytest.raises(TensorCodecError, match="announced"):
        recv_layout.chunks_array(chunks, expect=(6, [2, 3]))


def test_fast_reader_agrees_with_the_general_one():
    rng = np.random.default_rng(3)
    shapes = [(), (0,), (5, 0), (127,), (128,), (300, 200, 3), (1 << 16, 3), (2, 1, 1, 1, 70000)]
    for shape in shapes:
        for dt in (np.float32, np.int8, np.bool_):
            v = (rng.standard_normal(shape) > 0).astype(dt)
            data = recv_layout.WireTensor(v, inline_bytes=1 << 30).inline
            fast = recv_layout._fast_response(data)
            assert fast is not None, shape
            general = recv_layout.read_response(memoryview(data))  # a memoryview takes the general path
            assert fast[:2] == general[:2] and fast[3] is general[3] is False
            assert bytes(fast[2]) == bytes(general[2]) == v.tobytes()
    # anything but the one layout is left to the general reader (which decides)
    head = recv_layout.WireTensor(np.zeros(8, np.float32), inline_bytes=0).header
    assert recv_layout._fast_response(head) is None and recv_layout.read_response(head)[3] is True
    neg = worker_pb2.RecvTensorResponse(tensor=tensor_pb2.TensorProto(dtype=2, shape=[-3])).SerializeToString()
    assert recv_layout._fast_response(neg)[1] == [-3]
    with pytest.raises(TensorCodecError, match="negative"):
        recv_layout.response_array(neg)
    good = recv_layout.WireTensor(np.arange(6, dtype=np.int32)).inline
    for broken in (good[:-1], good + b"\x00", good[:3], b"\x0a\x80"):
        with pytest.raises(TensorCodecError):
            recv_layout.response_array(broken)


def test_one_chunk_is_viewed_and_extra_chunks_refused():
    v = np.arange(10, dtype=np.float32)
    one = recv_layout.WireTensor(v, inline_bytes=0, chunk_bytes=1 << 20).chunks
    assert len(one) == 1
    got = recv_layout.chunks_array(one)
    assert got.tobytes() == v.tobytes() and not got.flags.writeable
    extra = tensor_pb2.TensorChunk(offset=40, data=b"\0" * 4).SerializeToString()
    with pytest.raises(TensorCodecError, match="more than the declared 40 bytes"):
        recv_layout.chunks_array(one + [extra])
