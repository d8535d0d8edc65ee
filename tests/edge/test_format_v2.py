"""Schema version 2 of the edge format (int32 dims, buffer spans, per-tensor quantization in the tensor,
per-channel scales as one float and a byte per channel, int32 attribute lists): files are smaller, load
to the same values as version 1 files, version 1 files still load, and contradictory v2 files are refused."""
import flatbuffers
import numpy as np
import pytest

from isthmus.edge import Interpreter
from isthmus.edge.format import SCHEMA_VERSION, EdgeModelError, scales_from_codes, scales_to_codes
from isthmus.edge.loader import loads
from isthmus.edge.writer import ModelWriter
from isthmus.proto.edge import (Attr, Buffer, Model, Operator, OperatorCode, Quantization, Span, SubGraph,
                                Tensor)


def test_scale_codes_round_up_by_at_most_an_eighth_and_keep_powers_of_two():
    rng = np.random.default_rng(0)
    for _ in range(300):
        s = (np.exp(rng.uniform(-8, 0, int(rng.integers(2, 40)))) * rng.uniform(1e-4, 10)).astype(np.float32)
        r, codes = scales_to_codes(s)
        assert codes is not None and codes.dtype == np.uint8
        assert np.all(r >= s) and np.all(r <= s * 1.125 * (1 + 1e-6))
        assert np.array_equal(scales_from_codes(r.max(), codes), r)
        assert np.array_equal(scales_to_codes(r)[0], r)  # already in the form: unchanged
        p = (s.max() * 2.0 ** -rng.integers(0, 25, len(s))).astype(np.float32)
        assert np.array_equal(scales_to_codes(p)[0], p)  # powers of two below the largest: exact
    # a channel more than 2^-31 below the largest has no code: the float scales stay
    assert scales_to_codes(np.array([1.0, 2.0 ** -40], np.float32))[1] is None


def _int8_dense(scales, n_out=8) -> bytes:
    w = ModelWriter()
    x = w.add_input("x", "float32", (1, 16))
    xq = w.add_tensor("x/quant", "int8", (1, 16), scale=[0.05], zero_point=[3])
    w.add_operator("Quantize", [x], [xq])
    rng = np.random.default_rng(1)
    wq = w.add_constant("w", rng.integers(-127, 128, (16, n_out)).astype(np.int8), scale=list(scales),
                        zero_point=[], axis=1)
    y = w.add_tensor("y", "int8", (1, n_out), scale=[0.1], zero_point=[-5])
    w.add_operator("MatMul", [xq, wq], [y], {"transpose_a": 0, "transpose_b": 0})
    yf = w.add_tensor("y/dequant", "float32", (1, n_out))
    w.add_operator("Dequantize", [y], [yf])
    w.mark_output(yf)
    return w.to_bytes()


def test_coded_scales_take_a_byte_a_channel_and_load_exactly():
    free = np.linspace(0.01, 0.02, 64).astype(np.float32)
    coded = scales_to_codes(free)[0]
    small, big = _int8_dense(coded, 64), _int8_dense(free, 64)
    assert len(big) - len(small) >= 3 * 64 - 16  # 4 bytes a channel -> 1
    for data, want in ((small, coded), (big, free)):
        m = loads(data)
        assert m.version == SCHEMA_VERSION
        t = m.tensors[2]
        assert t.scale.dtype == np.float32 and np.array_equal(t.scale, want) and t.axis == 1
        assert not t.zero_point.any() and len(t.zero_point) == 64
        q = m.tensors[1]
        assert q.scale.tolist() == [np.float32(0.05)] and q.zero_point.tolist() == [3] and q.axis == -1


def test_equal_objects_are_written_once():
    """Shapes, quantization and attributes shared by many tensors and operators cost their bytes once."""
    def chain(n):
        w = ModelWriter()
        t = w.add_input("x", "int8", (1, 8, 4, 4))
        for i in range(n):
            o = w.add_tensor(f"r{i}", "int8", (1, 8, 4, 4), scale=[0.5], zero_point=[-128])
            w.add_operator("MaxPool", [t], [o], {"ksize": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0]})
            t = o
        w.mark_output(t)
        return len(w.to_bytes())
    per_op = (chain(41) - chain(21)) / 20
    assert per_op < 100, per_op  # a tensor table, its name, an operator and its index vectors; no copies


def _v1_model() -> bytes:
    """A schema 1 file as the writer of version 1 made it: int64 shapes, Buffer tables, quantization
    tables for per-tensor parameters, int64 attribute lists. y = relu(x @ w) in fp32, then int8 parameters
    on a dangling-free Quantize of y."""
    b = flatbuffers.Builder(1024)
    w = (np.arange(8, dtype=np.float32).reshape(4, 2) - 3.5) / 4
    names = [b.CreateString(n) for n in ("x", "w", "y", "yq")]
    shapes = [b.CreateNumpyVector(np.asarray(s, np.int64)) for s in ((1, 4), (4, 2), (1, 2), (1, 2))]
    sc, zp = b.CreateNumpyVector(np.asarray([0.02], np.float32)), b.CreateNumpyVector(np.asarray([-7], np.int64))
    Quantization.Start(b)
    Quantization.AddScale(b, sc)
    Quantization.AddZeroPoint(b, zp)
    q = Quantization.End(b)
    tensors = []
    for k, (nm, shp) in enumerate(zip(names, shapes)):
        Tensor.Start(b)
        Tensor.AddName(b, nm)
        Tensor.AddDtype(b, 3 if k == 3 else 0)
        Tensor.AddShape(b, shp)
        Tensor.AddBuffer(b, 1 if k == 1 else 0)
        if k == 3:
            Tensor.AddQuantization(b, q)
        tensors.append(Tensor.End(b))
    ops = []
    for code, ins, outs, attrs in ((0, [0, 1], [2], {"transpose_a": 0, "transpose_b": 0}), (1, [2], [3], {})):
        aoffs = []
        for k, v in attrs.items():
            an = b.CreateString(k)
            Attr.Start(b)
            Attr.AddName(b, an)
            Attr.AddKind(b, 0)
            Attr.AddI(b, v)
            aoffs.append(Attr.End(b))
        Operator.StartAttrsVector(b, len(aoffs))
        for a in reversed(aoffs):
            b.PrependUOffsetTRelative(a)
        av = b.EndVector()
        iv, ov = b.CreateNumpyVector(np.asarray(ins, np.int32)), b.CreateNumpyVector(np.asarray(outs, np.int32))
        Operator.Start(b)
        Operator.AddOpcode(b, code)
        Operator.AddInputs(b, iv)
        Operator.AddOutputs(b, ov)
        Operator.AddAttrs(b, av)
        ops.append(Operator.End(b))

    def table_vector(start, offs):
        start(b, len(offs))
        for o in reversed(offs):
            b.PrependUOffsetTRelative(o)
        return b.EndVector()
    tv, opv = table_vector(SubGraph.StartTensorsVector, tensors), table_vector(SubGraph.StartOperatorsVector, ops)
    inv, outv = b.CreateNumpyVector(np.asarray([0], np.int32)), b.CreateNumpyVector(np.asarray([3], np.int32))
    sgn = b.CreateString("main")
    SubGraph.Start(b)
    SubGraph.AddName(b, sgn)
    SubGraph.AddTensors(b, tv)
    SubGraph.AddInputs(b, inv)
    SubGraph.AddOutputs(b, outv)
    SubGraph.AddOperators(b, opv)
    sg = SubGraph.End(b)
    codes = []
    for name in ("MatMul", "Quantize"):
        cn = b.CreateString(name)
        OperatorCode.Start(b)
        OperatorCode.AddName(b, cn)
        codes.append(OperatorCode.End(b))
    # the data section starts after the flatbuffer: a fixed, generous offset (the file is padded to it)
    data_at = 4096
    bufs = []
    for off, size in ((0, 0), (data_at, w.nbytes)):
        Buffer.Start(b)
        Buffer.AddOffset(b, off)
        Buffer.AddSize(b, size)
        bufs.append(Buffer.End(b))
    cv, bv, sv = (table_vector(Model.StartOperatorCodesVector, codes), table_vector(Model.StartBuffersVector, bufs),
                  table_vector(Model.StartSubgraphsVector, [sg]))
    prod = b.CreateString("isthmus")
    Model.Start(b)
    Model.AddVersion(b, 1)
    Model.AddProducer(b, prod)
    Model.AddOperatorCodes(b, cv)
    Model.AddSubgraphs(b, sv)
    Model.AddBuffers(b, bv)
    b.Finish(Model.End(b), file_identifier=b"ISTH")
    fb = bytes(b.Output())
    assert len(fb) <= data_at
    return fb + b"\0" * (data_at - len(fb)) + w.tobytes(), w


def test_version_1_files_still_load_and_run():
    data, w = _v1_model()
    m = loads(data)
    assert m.version == 1 and [t.shape for t in m.tensors] == [(1, 4), (4, 2), (1, 2), (1, 2)]
    assert np.array_equal(m.tensors[1].data, w) and m.buffers == [(0, 0), (4096, 32)]
    assert m.tensors[3].scale.tolist() == [np.float32(0.02)] and m.tensors[3].zero_point.tolist() == [-7]
    assert m.operators[0].attrs == {"transpose_a": 0, "transpose_b": 0}
    x = np.array([[1.0, -2.0, 0.5, 3.0]], np.float32)
    want = np.clip(np.round(x @ w / 0.02) - 7, -128, 127)
    assert np.array_equal(Interpreter(data).invoke(x)[0], want.astype(np.int8))


def _one_pool(bad: str = "") -> bytes:
    """A v2 file built by hand: x int8 -> MaxPool -> y int8 (y quantized in the tensor), with `bad` adding
    one contradictory field: a shape beside the dims, a zero point without a scale, a quantization table
    beside the inline scale, Buffer tables beside the spans, ints beside ints32, scale codes per tensor."""
    b = flatbuffers.Builder(1024)
    dims = b.CreateNumpyVector(np.asarray([1, 4, 2, 2], np.int32))
    ydims = b.CreateNumpyVector(np.asarray([1, 4, 1, 1], np.int32))
    shape64 = b.CreateNumpyVector(np.asarray([1, 4, 2, 2], np.int64))
    sc = b.CreateNumpyVector(np.asarray([0.5], np.float32))
    codes = b.CreateNumpyVector(np.asarray([0], np.uint8))
    Quantization.Start(b)
    Quantization.AddScale(b, sc)
    if bad == "codes_per_tensor":
        Quantization.AddScaleCodes(b, codes)
    q = Quantization.End(b)
    names = [b.CreateString(n) for n in ("x", "y")]
    tensors = []
    for k in range(2):
        Tensor.Start(b)
        Tensor.AddName(b, names[k])
        Tensor.AddDtype(b, 3)
        Tensor.AddDims(b, dims if k == 0 else ydims)
        if k == 0 and bad == "shape_and_dims":
            Tensor.AddShape(b, shape64)
        if k == 0 and bad == "zero_point_alone":
            Tensor.AddZeroPoint(b, 1)
        elif k == 0:
            Tensor.AddScale(b, 0.5)
            Tensor.AddZeroPoint(b, 1)
        if k == 1 and bad != "codes_per_tensor":
            Tensor.AddScale(b, 0.5)
            Tensor.AddZeroPoint(b, 1)
        if k == 1 and bad in ("inline_and_table", "codes_per_tensor"):
            Tensor.AddQuantization(b, q)
        tensors.append(Tensor.End(b))
    attrs = []
    for name, vals in (("ksize", [2, 2]), ("strides", [2, 2]), ("pads", [0, 0, 0, 0])):
        an, v32, v64 = (b.CreateString(name), b.CreateNumpyVector(np.asarray(vals, np.int32)),
                        b.CreateNumpyVector(np.asarray(vals, np.int64)))
        Attr.Start(b)
        Attr.AddName(b, an)
        Attr.AddKind(b, 3)  # INTS
        Attr.AddInts32(b, v32)
        if bad == "ints_and_ints32":
            Attr.AddInts(b, v64)
        attrs.append(Attr.End(b))

    def table_vector(start, offs):
        start(b, len(offs))
        for o in reversed(offs):
            b.PrependUOffsetTRelative(o)
        return b.EndVector()
    av = table_vector(Operator.StartAttrsVector, attrs)
    iv, ov = b.CreateNumpyVector(np.asarray([0], np.int32)), b.CreateNumpyVector(np.asarray([1], np.int32))
    Operator.Start(b)
    Operator.AddOpcode(b, 0)
    Operator.AddInputs(b, iv)
    Operator.AddOutputs(b, ov)
    Operator.AddAttrs(b, av)
    op = Operator.End(b)
    tv, opv = table_vector(SubGraph.StartTensorsVector, tensors), table_vector(SubGraph.StartOperatorsVector, [op])
    SubGraph.Start(b)
    SubGraph.AddTensors(b, tv)
    SubGraph.AddInputs(b, iv)
    SubGraph.AddOutputs(b, ov)
    SubGraph.AddOperators(b, opv)
    sg = SubGraph.End(b)
    cn = b.CreateString("MaxPool")
    OperatorCode.Start(b)
    OperatorCode.AddName(b, cn)
    code = OperatorCode.End(b)
    Buffer.Start(b)
    buf = Buffer.End(b)
    bufs = table_vector(Model.StartBuffersVector, [buf])
    Model.StartBufferSpansVector(b, 1)
    Span.CreateSpan(b, 0, 0)
    spans = b.EndVector()
    cv, sv = table_vector(Model.StartOperatorCodesVector, [code]), table_vector(Model.StartSubgraphsVector, [sg])
    Model.Start(b)
    Model.AddVersion(b, 2)
    Model.AddOperatorCodes(b, cv)
    Model.AddSubgraphs(b, sv)
    Model.AddBufferSpans(b, spans)
    if bad == "buffers_and_spans":
        Model.AddBuffers(b, bufs)
    b.Finish(Model.End(b), file_identifier=b"ISTH")
    return bytes(b.Output())


def test_a_hand_built_version_2_file_loads_and_runs():
    m = loads(_one_pool())
    assert m.version == 2 and m.tensors[0].shape == (1, 4, 2, 2) and m.tensors[1].zero_point.tolist() == [1]
    assert m.operators[0].attrs == {"ksize": (2, 2), "strides": (2, 2), "pads": (0, 0, 0, 0)}
    x = np.arange(16, dtype=np.int8).reshape(1, 4, 2, 2)
    assert Interpreter(_one_pool()).invoke(x)[0].reshape(-1).tolist() == [3, 7, 11, 15]


@pytest.mark.parametrize("bad, message", [
    ("shape_and_dims", "both a shape and dims"),
    ("zero_point_alone", "inline zero point needs an inline scale"),
    ("inline_and_table", "neither goes with a quantization table"),
    ("buffers_and_spans", "both buffers and buffer_spans"),
    ("ints_and_ints32", "both ints and ints32"),
    ("codes_per_tensor", "scale codes need a channel axis"),
])
def test_contradictory_version_2_fields_are_refused(bad, message):
    with pytest.raises(EdgeModelError, match=message):
        loads(_one_pool(bad))
