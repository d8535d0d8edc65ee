"""ONNX weights read in place (onnx_wire): the same arrays as onnx's own to_array, aligned, from a
path and from bytes; a malformed or truncated file falls back to the plain parser's error."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import isthmus as ism
from isthmus.converters.onnx_external import load_model, read_initializer
from isthmus.converters.onnx_import import OnnxImportError, from_onnx
from isthmus.converters.onnx_wire import parse_without_weights

rng = np.random.default_rng(0)
DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.int64,
          np.uint32, np.uint64, np.bool_]


def _weights():
    out = {f"w_{np.dtype(d).name}": (rng.standard_normal((3, 5)) * 50).astype(d) for d in DTYPES}
    out["scalar"] = np.array(2.5, np.float32)
    out["empty"] = np.zeros((0, 4), np.float32)
    out["odd"] = rng.standard_normal(7).astype(np.float32)  # 28 bytes: shifts what follows off 8-byte alignment
    return out


def _model(weights, typed_field=True):
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    if typed_field:  # an initializer kept in float_data, not raw_data
        inits.append(helper.make_tensor("typed", TensorProto.FLOAT, [2], [1.5, -2.0]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("MatMul", ["x", "w_float32_t"], ["y"])
    inits.append(numpy_helper.from_array(weights["w_float32"].T.copy(), "w_float32_t"))
    m = helper.make_model(helper.make_graph([node], "m", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("source", ["path", "bytes"])
def test_weights_equal_onnx_to_array_and_are_aligned(tmp_path, source):
    m = _model(_weights())
    data = m.SerializeToString()
    p = tmp_path / "m.onnx"
    p.write_bytes(data)
    model, _, raws = load_model(str(p) if source == "path" else data, None)
    try:
        assert raws is not None and sum(s is not None for s in raws.spans) == len(m.graph.initializer) - 1
        assert any(s[0] % 8 for s in raws.spans if s)  # some weights sit at unaligned offsets of the file
        assert [i.name for i in model.graph.initializer] == [i.name for i in m.graph.initializer]
        for k, (init, want) in enumerate(zip(model.graph.initializer, m.graph.initializer)):
            got = read_initializer(init, None, raws, k)
            ref = numpy_helper.to_array(want)
            assert got.dtype == ref.dtype and got.shape == ref.shape and got.flags.aligned, init.name
            np.testing.assert_array_equal(got, ref)
    finally:
        raws.close()
    assert all(not i.HasField("raw_data") for i in model.graph.initializer)  # the protobuf copy was skipped


def test_imported_model_runs_with_in_place_weights(tmp_path):
    w = _weights()
    p = tmp_path / "m.onnx"
    onnx.save(_model(w), str(p))
    x = rng.standard_normal((4, 5)).astype(np.float32)
    for src in (str(p), p.read_bytes()):
        g, ins, outs = from_onnx(src)
        np.testing.assert_allclose(ism.Session(g).run(outs[0], {ins["x"]: x}), x @ w["w_float32"].T, rtol=1e-6)


def test_a_raw_data_length_that_does_not_fit_the_dims_names_the_initializer():
    m = _model({"w_float32": np.ones((3, 5), np.float32)}, typed_field=False)
    m.graph.initializer[0].raw_data = m.graph.initializer[0].raw_data[:-4]
    with pytest.raises(OnnxImportError, match="initializer 'w_float32'.*56 bytes.*need 60"):
        from_onnx(m.SerializeToString())


def test_models_without_initializers_or_with_odd_framing_take_the_plain_parser():
    m = _model({"w_float32": np.ones((3, 5), np.float32)}, typed_field=False)
    assert parse_without_weights(b"") is None  # no graph
    bare = onnx.ModelProto()
    bare.CopyFrom(m)
    del bare.graph.initializer[:]
    assert parse_without_weights(bare.SerializeToString()) is None
    data = m.SerializeToString()
    assert parse_without_weights(data + data) is None  # two graph fields: protobuf would merge them
    assert parse_without_weights(b"\x0b\x00") is None  # a group wire type


def test_truncated_and_mutated_files_fail_only_with_import_errors_or_match_the_plain_parser(tmp_path):
    """Differential: wherever onnx's parser accepts the mutated bytes, the in-place reads give its
    arrays; wherever it does not, from_onnx refuses with OnnxImportError (never another error)."""
    data = _model(_weights()).SerializeToString()
    r = np.random.default_rng(1)
    cases = [data[:n] for n in r.integers(1, len(data), 40)]
    for _ in range(160):
        b = bytearray(data)
        for pos in r.integers(0, len(b), r.integers(1, 4)):
            b[pos] = r.integers(0, 256)
        cases.append(bytes(b))
    for case in cases:
        try:
            plain = onnx.load_from_string(case)
        except Exception:  # noqa: BLE001
            plain = None
        fast = parse_without_weights(case)
        if fast is not None:
            assert plain is not None
            model, spans = fast
            assert len(model.graph.initializer) == len(plain.graph.initializer)
            for k, (a, b_) in enumerate(zip(model.graph.initializer, plain.graph.initializer)):
                if spans[k] is not None:
                    assert bytes(case[spans[k][0]:spans[k][0] + spans[k][1]]) == b_.raw_data
                assert (a.name, list(a.dims), a.data_type) == (b_.name, list(b_.dims), b_.data_type)
        try:
            from_onnx(case)
        except OnnxImportError:
            pass
    p = tmp_path / "t.onnx"
    for case in cases[:40]:  # truncated files, read through the map
        p.write_bytes(case)
        with pytest.raises(OnnxImportError):
            from_onnx(str(p))
