"""from_onnx's failures: only OnnxImportError escapes, naming the op, the node and the opset; an
attribute no handler honours is refused by name; external data is read only from a named folder
and never from outside it (no '..', no absolute path, no symlink escape, no read past the file)."""
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import isthmus as ism
from isthmus.converters.onnx_import import OnnxImportError, from_onnx

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def test_bytes_that_are_not_a_model_are_refused_with_the_decoder_named():
    with pytest.raises(OnnxImportError, match="not an ONNX model.*DecodeError"):
        from_onnx(b"\x0a\xff\xff\xff\xff\x0f garbage")


def test_a_missing_file_and_a_wrong_argument_type_are_refused(tmp_path):
    with pytest.raises(OnnxImportError, match="cannot read .*nope.onnx"):
        from_onnx(str(tmp_path / "nope.onnx"))
    with pytest.raises(OnnxImportError, match="not int"):
        from_onnx(42)


def test_an_unknown_attribute_is_refused_by_name_with_node_op_and_opset():
    m = _model([helper.make_node("Relu", ["x"], ["y"], name="act", alpha=0.5)], [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(OnnxImportError, match=r"node 0 'act' \(Relu, opset 17\): attribute\(s\) \['alpha'\]"):
        from_onnx(m)


def test_a_shape_error_inside_a_handler_becomes_an_import_error_naming_the_node():
    m = _model([helper.make_node("Add", ["a", "b"], ["y"], name="sum")], [_vi("a", [2, 3]), _vi("b", [4, 5])],
               [_vi("y", None)], opset=13)
    with pytest.raises(OnnxImportError, match=r"node 0 'sum' \(Add, opset 13\): ShapeError"):
        from_onnx(m)


def test_bad_attribute_values_are_refused_not_crashed():
    m = _model([helper.make_node("Transpose", ["x"], ["y"], name="t", perm=[0, 5])], [_vi("x", [2, 3])],
               [_vi("y", None)])
    with pytest.raises(OnnxImportError, match=r"'t' \(Transpose, opset 17\)"):
        from_onnx(m)
    m = _model([helper.make_node("Cast", ["x"], ["y"], name="c", to=999)], [_vi("x", [2])], [_vi("y", None)])
    with pytest.raises(OnnxImportError, match=r"'c' \(Cast, opset 17\): 'to' = 999"):
        from_onnx(m)
    m = _model([helper.make_node("Gelu", ["x"], ["y"], name="g", approximate="cubic")], [_vi("x", [2])],
               [_vi("y", None)], opset=20)
    with pytest.raises(OnnxImportError, match="approximate 'cubic'"):
        from_onnx(m)


def test_dropout_in_training_mode_is_refused_and_its_mask_follows_the_spec():
    ratio = numpy_helper.from_array(np.array(0.5, np.float32), "r")
    on = numpy_helper.from_array(np.array(True), "t")
    m = _model([helper.make_node("Dropout", ["x", "r", "t"], ["y"], name="d")], [_vi("x", [2])], [_vi("y", None)],
               [ratio, on], opset=13)
    with pytest.raises(OnnxImportError, match=r"'d' \(Dropout, opset 13\): training_mode"):
        from_onnx(m)


def test_sequence_inputs_and_unknown_domains_are_refused():
    seq = helper.make_tensor_sequence_value_info("s", F, None)
    m = _model([helper.make_node("Identity", ["s"], ["y"])], [seq], [_vi("y", None)])
    with pytest.raises(OnnxImportError, match="graph input 's': only tensor inputs"):
        from_onnx(m)
    m = _model([helper.make_node("Foo", ["x"], ["y"], domain="com.example")], [_vi("x", [2])], [_vi("y", None)])
    with pytest.raises(OnnxImportError, match="com.example.Foo"):
        from_onnx(m)


def test_a_node_reading_an_undefined_name_is_refused():
    m = _model([helper.make_node("Relu", ["nowhere"], ["y"], name="r")], [_vi("x", [2])], [_vi("y", None)])
    with pytest.raises(OnnxImportError, match=r"'r' \(Relu, opset 17\): input\(s\) \['nowhere'\]"):
        from_onnx(m)


# ---- external data --------------------------------------------------------------------------------------
W = np.arange(6, dtype=np.float32).reshape(2, 3)


def _external_model(location, offset=0, length=None):
    w = numpy_helper.from_array(np.zeros((2, 3), np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(W.nbytes if length is None else length))):
        e = w.external_data.add()
        e.key, e.value = k, v
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", [1, 2])], [_vi("y", None)], [w])


def _run(g, ins, outs):
    return ism.Session(g).run(outs[0], {ins["x"]: np.ones((1, 2), np.float32)})


def test_external_data_needs_a_named_folder_and_is_read_from_it(tmp_path):
    (tmp_path / "w.bin").write_bytes(b"\0" * 8 + W.tobytes())
    m = _external_model("w.bin", offset=8)
    with pytest.raises(OnnxImportError, match="initializer 'w' keeps its data outside the model.*external_data_dir"):
        from_onnx(m)
    np.testing.assert_array_equal(_run(*from_onnx(m, external_data_dir=str(tmp_path))), np.ones((1, 2)) @ W)


def test_a_model_path_reads_external_data_from_its_own_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.bin").write_bytes(W.tobytes())
    onnx.save(_external_model("w.bin"), str(tmp_path / "sub" / "m.onnx"))
    np.testing.assert_array_equal(_run(*from_onnx(str(tmp_path / "sub" / "m.onnx"))), np.ones((1, 2)) @ W)


@pytest.mark.parametrize("escape", ["dotdot", "absolute", "symlink", "symlinked_dir", "past_end", "missing"])
def test_external_data_cannot_leave_its_folder(tmp_path, escape):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(W.tobytes())
    base = tmp_path / "model"
    base.mkdir()
    location, want = {"dotdot": ("../secret.bin", r"'\.\.'"), "absolute": (str(secret), "absolute"),
                      "symlink": ("link.bin", "symlink"), "symlinked_dir": ("d/secret.bin", "symlink"),
                      "past_end": ("w.bin", "lies outside"), "missing": ("none.bin", "does not exist")}[escape]
    if escape == "symlink":
        os.symlink(secret, base / "link.bin")
    if escape == "symlinked_dir":
        os.symlink(tmp_path, base / "d")
    length = None
    if escape == "past_end":
        (base / "w.bin").write_bytes(W.tobytes()[:8])
    with pytest.raises(OnnxImportError, match=rf"initializer 'w'.*{want}"):
        from_onnx(_external_model(location, length=length), external_data_dir=str(base))
    onnx.save(_external_model(location, length=length), str(base / "m.onnx"))
    with pytest.raises(OnnxImportError, match=rf"initializer 'w'.*{want}"):
        from_onnx(str(base / "m.onnx"))


def _import_model():
    try:  # the command-line layer moves to isthmus.apps (issue 25)
        from isthmus.apps.graph_io import GraphFileError, import_model
    except ImportError:
        from isthmus.apps.graph_io import GraphFileError, import_model
    return GraphFileError, import_model


def test_the_import_command_confines_external_data_to_the_models_folder(tmp_path):
    """`isthmus import` (graph_io.import_model) and `isthmus convert` (a path to from_onnx) read
    external data from the model file's own folder only: the folder exporters write it to."""
    GraphFileError, import_model = _import_model()
    (tmp_path / "secret.bin").write_bytes(W.tobytes())
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "w.bin").write_bytes(W.tobytes())
    onnx.save(_external_model("w.bin"), str(tmp_path / "m" / "good.onnx"))
    onnx.save(_external_model("../secret.bin"), str(tmp_path / "m" / "bad.onnx"))
    g, ins, outs, names = import_model(str(tmp_path / "m" / "good.onnx"))
    np.testing.assert_array_equal(_run(g, ins, outs), np.ones((1, 2)) @ W)
    with pytest.raises(GraphFileError, match=r"initializer 'w'.*points outside"):
        import_model(str(tmp_path / "m" / "bad.onnx"))


def test_a_name_defined_twice_is_refused():
    w = numpy_helper.from_array(np.ones(2, np.float32), "b1")
    m = _model([helper.make_node("Relu", ["x"], ["b1"], name="r")], [_vi("x", [2])], [_vi("b1", None)], [w])
    with pytest.raises(OnnxImportError, match=r"'r' \(Relu, opset 17\): output\(s\) \['b1'\] are already defined"):
        from_onnx(m)


def test_an_attribute_outside_the_spec_is_refused_even_by_a_handler_that_declares_none():
    from isthmus.converters.onnx_import import declared_attrs
    undeclared = [op for op in ("Mod", "TopK", "Einsum", "Tile") if declared_attrs(op, 21) is None]
    if not undeclared:
        pytest.skip("every handler here declares its attributes")
    op = undeclared[0]
    m = _model([helper.make_node(op, ["a", "b"], ["y"], name="n", bogus=1)], [_vi("a", [2]), _vi("b", [2])],
               [_vi("y", None)], opset=21)
    with pytest.raises(OnnxImportError, match=rf"'n' \({op}, opset 21\): attribute\(s\) \['bogus'\] are not defined"):
        from_onnx(m)
