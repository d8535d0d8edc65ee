import numpy as np
import pytest

from isthmus.wire import tensor_codec as tc
from isthmus.proto import tensor_pb2

DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 0, 4), (2, 3, 5)])
def test_round_trip_bit_exact(dtype, shape):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(shape) * 100).astype(dtype)
    msg = tc.encode(a)
    wire = tensor_pb2.TensorProto.FromString(msg.SerializeToString())
    b = tc.decode(wire)
    assert b.dtype == a.dtype and b.shape == a.shape
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
def test_unsigned_wide_ints_round_trip_over_their_whole_range(dtype):
    """uint16/32/64 (core dtypes the ONNX importer produces): values above the signed range survive,
    the wire holds little-endian bytes whatever the sender's byte order, chunked or not."""
    info = np.iinfo(dtype)
    a = np.array([[0, 1, info.max], [info.max - 1, info.max // 2 + 1, 12345]], dtype)
    for sent in (a, a.astype(np.dtype(dtype).newbyteorder(">"))):
        msg = tensor_pb2.TensorProto.FromString(tc.encode(sent).SerializeToString())
        assert msg.dtype == getattr(tensor_pb2, "DT_" + dtype.upper())
        assert msg.content == a.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
        b = tc.decode(msg)
        assert b.dtype == np.dtype(dtype) and np.array_equal(b, a)
    assert np.array_equal(tc.decode_chunks(list(tc.encode_chunks(a, 5))), a)
    assert tc.enum_to_dtype(tc.dtype_to_enum(dtype)) == np.dtype(dtype)
    with pytest.raises(tc.TensorCodecError, match="payload bytes"):
        tc.decode(tensor_pb2.TensorProto(dtype=msg.dtype, shape=[2], content=b"\x00" * (np.dtype(dtype).itemsize + 1)))


def test_special_floats_and_layouts():
    a = np.array([np.nan, -0.0, np.inf, -np.inf, 1e-45], np.float32)
    assert tc.decode(tc.encode(a)).tobytes() == a.tobytes()
    f = np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4))
    np.testing.assert_array_equal(tc.decode(tc.encode(f)), f)
    strided = np.arange(20, dtype=np.float64)[::3]
    np.testing.assert_array_equal(tc.decode(tc.encode(strided)), strided)
    big_endian = np.arange(5, dtype=">i4")
    msg = tc.encode(big_endian)
    assert msg.content == np.arange(5, dtype="<i4").tobytes()  # little endian on the wire
    np.testing.assert_array_equal(tc.decode(msg), big_endian)


def test_decode_is_a_zero_copy_view():
    a = np.arange(1 << 16, dtype=np.float32)
    msg = tc.encode(a)
    content = msg.content
    b = tc.decode(tensor_pb2.TensorProto(dtype=msg.dtype, shape=msg.shape, content=content))
    assert not b.flags.owndata and not b.flags.writeable
    assert np.shares_memory(b, np.frombuffer(content, np.uint8)) or b.base is not None


def _msg(dtype=tensor_pb2.DT_FLOAT32, shape=(2,), content=b"\0" * 8):
    return tensor_pb2.TensorProto(dtype=dtype, shape=shape, content=content)


@pytest.mark.parametrize("msg,match", [
    (_msg(content=b"\0" * 7), r"needs 8 payload bytes.*got 7"),
    (_msg(content=b"\0" * 9), r"needs 8 payload bytes.*got 9"),
    (_msg(content=b""), r"got 0"),
    (_msg(dtype=0), "unknown dtype enum 0"),
    (_msg(dtype=10), "unknown dtype enum 10"),   # variant never travels
    (_msg(dtype=999), "unknown dtype enum 999"),
    (_msg(shape=(2, -1)), "negative dimension"),
    (_msg(shape=(-2, -1)), "negative dimension"),
    (_msg(shape=(1 << 40, 1 << 40)), "over the limit"),
    (_msg(shape=(1 << 62, 1 << 62, 0)), "over the limit"),  # early stop: honest about huge dims
    (_msg(shape=(1,) * 40, content=b"\0" * 4), "rank 40"),
    (_msg(dtype=tensor_pb2.DT_BOOL, shape=(2,), content=b"\x00\x07"), "bool"),
])
def test_hostile_messages_rejected(msg, match):
    with pytest.raises(tc.TensorCodecError, match=match):
        tc.decode(tensor_pb2.TensorProto.FromString(msg.SerializeToString()))


def test_configurable_limit():
    a = np.zeros(1000, np.float32)
    with pytest.raises(tc.TensorCodecError, match="limit of 3999"):
        tc.encode(a, max_bytes=3999)
    msg = tc.encode(a)
    assert tc.decode(msg, max_bytes=4000).shape == (1000,)
    with pytest.raises(tc.TensorCodecError, match="limit of 100"):
        tc.decode(msg, max_bytes=100)


def test_unsupported_dtypes_rejected_on_encode():
    for bad in (np.array(["a"]), np.array([1 + 2j]), np.array([object()], dtype=object),
                np.zeros(2, "datetime64[s]")):
        with pytest.raises(tc.TensorCodecError, match="cannot be carried"):
            tc.encode(bad)


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096, 1 << 20])
def test_chunks_round_trip(chunk):
    a = np.random.default_rng(1).standard_normal((33, 31)).astype(np.float32)
    chunks = [tensor_pb2.TensorChunk.FromString(c.SerializeToString()) for c in tc.encode_chunks(a, chunk)]
    assert len(chunks) == max(1, -(-a.nbytes // chunk))
    assert tc.decode_chunks(chunks).tobytes() == a.tobytes()


def test_empty_and_scalar_chunks():
    for a in (np.zeros((0, 3), np.int64), np.float64(3.5), np.array(True)):
        b = tc.decode_chunks(list(tc.encode_chunks(a, 4)))
        assert b.shape == np.shape(a) and b.tobytes() == np.asarray(a).tobytes()


def test_hostile_chunk_streams():
    a = np.arange(10, dtype=np.int32)
    good = list(tc.encode_chunks(a, 8))
    with pytest.raises(tc.TensorCodecError, match="before its first chunk"):
        tc.decode_chunks([])
    with pytest.raises(tc.TensorCodecError, match="ended after 32 of 40"):
        tc.decode_chunks(good[:-1])
    with pytest.raises(tc.TensorCodecError, match="expected 16"):
        tc.decode_chunks([good[0], good[1], good[3], good[2], good[4]])
    dup = list(good) + [tensor_pb2.TensorChunk(offset=40, data=b"xxxx")]
    with pytest.raises(tc.TensorCodecError, match="more than the declared"):
        tc.decode_chunks(dup)
    lie = tensor_pb2.TensorChunk(dtype=good[0].dtype, shape=[10], total_bytes=12, data=good[0].data)
    with pytest.raises(tc.TensorCodecError, match="declares 12 bytes"):
        tc.decode_chunks([lie])
    huge = tensor_pb2.TensorChunk(dtype=good[0].dtype, shape=[1 << 40], total_bytes=4 << 40)
    with pytest.raises(tc.TensorCodecError, match="over the limit"):
        tc.decode_chunks([huge])
    neg = tensor_pb2.TensorChunk(dtype=good[0].dtype, shape=[-4], total_bytes=0)
    with pytest.raises(tc.TensorCodecError, match="negative"):
        tc.decode_chunks([neg])
