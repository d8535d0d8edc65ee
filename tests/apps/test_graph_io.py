"""`isthmus import` / `isthmus export` and graph files (graph_io.py): ONNX -> graph -> ONNX checked with
onnxruntime, TFLite -> graph checked against numpy, variables and checkpoints, corrupt files refused."""
import os
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import isthmus as ism  # noqa: E402
from isthmus.apps import cli, graph_io  # noqa: E402
from isthmus.core.variables import global_variables, trainable_variables  # noqa: E402

rng = np.random.default_rng(0)
F32 = np.float32


def _fails(capsys, pattern: str, argv) -> None:
    """The command fails like a tool: exit 2, one line on stderr matching `pattern`, no traceback."""
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    import re
    assert re.search(pattern, err), err


def lstm_mlp_model():
    """An LSTM over [T, N, 6] (initializer weights, bias), its last state through Gemm + Relu, and
    a second output from a MatMul on the same state: two outputs, names that are not node names."""
    units = 5
    inits = {"W": rng.standard_normal((1, 4 * units, 6)) * 0.4, "R": rng.standard_normal((1, 4 * units, units)) * 0.4,
             "B": rng.standard_normal((1, 8 * units)) * 0.1, "fw": rng.standard_normal((units, 3)),
             "fb": rng.standard_normal(3), "mw": rng.standard_normal((units, 2)), "zero": np.array([0], np.int64)}
    nodes = [helper.make_node("LSTM", ["seq", "W", "R", "B"], ["", "yh"], hidden_size=units),
             helper.make_node("Squeeze", ["yh", "zero"], ["h"]),
             helper.make_node("Gemm", ["h", "fw", "fb"], ["g"]), helper.make_node("Relu", ["g"], ["logits"]),
             helper.make_node("MatMul", ["h", "mw"], ["aux:out"])]
    g = helper.make_graph(nodes, "lstm_mlp", [helper.make_tensor_value_info("seq", TensorProto.FLOAT, ["T", "N", 6])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3]),
                           helper.make_tensor_value_info("aux:out", TensorProto.FLOAT, ["N", 2])],
                          [numpy_helper.from_array(v.astype(F32) if v.dtype != np.int64 else v, k)
                           for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def _ort(path_or_model, feeds):
    data = path_or_model if isinstance(path_or_model, str) else path_or_model.SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_cli_onnx_to_graph_to_onnx_matches_onnxruntime(tmp_path):
    src, gfile, back = str(tmp_path / "m.onnx"), str(tmp_path / "m.graph"), str(tmp_path / "back.onnx")
    onnx.save(lstm_mlp_model(), src)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    for argv in (["import", src, "-o", gfile], ["export", gfile, "--to", "onnx", "-o", back]):
        out = subprocess.run([sys.executable, "-m", "isthmus", *argv], capture_output=True, text=True,
                             timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        assert "wrote" in out.stdout
    feeds = {"seq": rng.standard_normal((7, 4, 6)).astype(F32)}
    model = onnx.load(back)
    assert [i.name for i in model.graph.input] == ["seq"]
    assert [o.name for o in model.graph.output] == ["logits", "aux:out"]  # the source model's names
    assert [n.op_type for n in model.graph.node].count("LSTM") == 1  # LSTMSequence went back to an ONNX LSTM
    want, got = _ort(src, feeds), _ort(back, feeds)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert np.abs(want[0]).max() > 0  # the check compares something (Relu did not zero everything)


def test_variables_survive_the_file_and_a_checkpoint_replaces_their_values(tmp_path, capsys):
    src, gfile = str(tmp_path / "m.onnx"), str(tmp_path / "m.graph")
    proto = lstm_mlp_model()
    onnx.save(proto, src)
    assert cli.main(["import", src, "-o", gfile, "--trainable"]) == 0
    g, ins, outs = graph_io.load_graph(gfile)
    assert list(ins) == ["seq"] and list(outs) == ["logits", "aux:out"]
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    variables = {v.node.name: v for v in global_variables(g)}
    assert sorted(variables) == ["B", "R", "W", "fb", "fw", "mw"]  # float initializers of rank >= 1
    assert len(trainable_variables(g)) == 6
    sess = ism.Session(g)
    sess.run(ism.global_variables_initializer(g))
    for k, v in variables.items():
        np.testing.assert_array_equal(sess.variable_value(v), inits[k])  # bit for bit
    # "fine-tune": new values for the dense layer, saved as a checkpoint, exported from the file
    fw2 = rng.standard_normal((5, 3)).astype(F32)
    sess.set_variable_value(variables["fw"], fw2)
    ckpt = ism.Saver(graph=g).save(sess, str(tmp_path / "ckpt" / "model"), global_step=1)
    back = str(tmp_path / "tuned.onnx")
    assert cli.main(["export", gfile, "-o", back, "--checkpoint", ckpt]) == 0
    feeds = {"seq": rng.standard_normal((4, 3, 6)).astype(F32)}
    tuned = onnx.ModelProto()
    tuned.CopyFrom(proto)
    next(i for i in tuned.graph.initializer if i.name == "fw").CopyFrom(numpy_helper.from_array(fw2, "fw"))
    got, want = _ort(back, feeds), _ort(tuned, feeds)  # onnxruntime on the source with the new weights
    for w, o in zip(want, got):
        np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-6)
    assert np.abs(got[0] - _ort(src, feeds)[0]).max() > 1e-3  # the checkpoint's values were used
    # a checkpoint of another graph is refused
    _fails(capsys, "checkpoint", ["export", gfile, "-o", back, "--checkpoint", str(tmp_path / "nothing.npz"), "--force"])


def test_tflite_to_graph_runs_like_numpy_and_exports(tmp_path):
    from tests.converters.test_tflite_import import cnn_model
    data, ref = cnn_model()
    src, gfile = tmp_path / "cnn.tflite", str(tmp_path / "cnn.graph")
    src.write_bytes(data)
    assert cli.main(["import", str(src), "-o", gfile]) == 0
    g, ins, outs = graph_io.load_graph(gfile)
    assert list(ins) == ["image"] and list(outs) == ["prob"]
    xv = rng.standard_normal((1, 9, 9, 3)).astype(F32)
    got = ism.Session(g).run(outs["prob"], {ins["image"]: xv.transpose(0, 3, 1, 2)})  # NCHW by default
    np.testing.assert_allclose(got, ref(xv), rtol=1e-4, atol=1e-6)
    assert cli.main(["export", gfile, "--to", "onnx", "-o", str(tmp_path / "cnn.onnx")]) == 0
    (o,) = _ort(str(tmp_path / "cnn.onnx"), {"image": xv.transpose(0, 3, 1, 2)})
    np.testing.assert_allclose(o, ref(xv), rtol=1e-4, atol=1e-6)
    assert cli.main(["export", gfile, "--to", "edge", "-o", str(tmp_path / "cnn.isth")]) == 0
    from isthmus.edge import Interpreter
    (e,) = Interpreter((tmp_path / "cnn.isth").read_bytes()).invoke(xv.transpose(0, 3, 1, 2))
    np.testing.assert_allclose(e, ref(xv), rtol=1e-4, atol=1e-6)


def test_corrupt_missing_and_foreign_graph_files_are_refused(tmp_path, capsys):
    src, gfile = str(tmp_path / "m.onnx"), tmp_path / "m.graph"
    onnx.save(lstm_mlp_model(), src)
    assert cli.main(["import", src, "-o", str(gfile)]) == 0
    good = gfile.read_bytes()
    from isthmus.cloud import graph_codec
    plain = ism.Graph()
    with plain.as_default():
        ism.placeholder("float32", (2,), name="x")
    cases = {
        "truncated": good[: len(good) // 2],
        "garbage": bytes(rng.integers(0, 256, 4096, dtype=np.uint8)),
        "empty": b"",
        "no_signature": graph_codec.to_bytes(plain),
        "an_onnx_file": open(src, "rb").read(),
    }
    flipped = bytearray(good)
    flipped[len(good) // 3] ^= 0xFF
    cases["flipped"] = bytes(flipped)
    refused = 0
    for name, data in cases.items():
        p = tmp_path / f"{name}.graph"
        p.write_bytes(data)
        try:
            graph_io.load_graph(str(p))
        except graph_io.GraphFileError as e:
            assert str(p) in str(e), (name, e)
            refused += 1
        else:
            # a flipped byte inside a weight's payload still decodes: the file is a valid graph
            assert name == "flipped", name
    assert refused >= len(cases) - 1
    with pytest.raises(graph_io.GraphFileError, match="cannot read graph file .*missing.graph"):
        graph_io.load_graph(str(tmp_path / "missing.graph"))
    _fails(capsys, r"error: .*truncated.graph: not a valid graph file",
           ["export", str(tmp_path / "truncated.graph"), "-o", str(tmp_path / "x.onnx")])
    _fails(capsys, "no_signature.graph: not an isthmus graph file: collection", ["export", str(tmp_path / "no_signature.graph")])
    assert not (tmp_path / "x.onnx").exists()
    _fails(capsys, "cannot write .*no_such_dir", ["export", str(gfile), "-o", str(tmp_path / "no_such_dir" / "x.onnx")])
    _fails(capsys, "cannot write graph file .*no_such_dir",
           ["import", src, "-o", str(tmp_path / "no_such_dir" / "m.graph")])


def test_import_refuses_missing_unknown_and_corrupt_models(tmp_path, capsys):
    _fails(capsys, "nope.onnx: no such file", ["import", str(tmp_path / "nope.onnx")])
    (tmp_path / "m.pb").write_bytes(b"x")
    _fails(capsys, r"m.pb: expected an \.onnx or \.tflite file", ["import", str(tmp_path / "m.pb")])
    (tmp_path / "bad.onnx").write_bytes(b"\xff\x00garbage" * 10)
    _fails(capsys, "bad.onnx", ["import", str(tmp_path / "bad.onnx")])
    (tmp_path / "bad.tflite").write_bytes(b"\x10\x00\x00\x00TFL3" + b"\x00" * 8)
    _fails(capsys, "cannot import .*bad.tflite", ["import", str(tmp_path / "bad.tflite")])
    _fails(capsys, "--trainable applies to ONNX models", ["import", str(tmp_path / "bad.tflite"), "--trainable"])
    bad_op = helper.make_model(helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["y"], name="hm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(bad_op, str(tmp_path / "op.onnx"))
    _fails(capsys, r"cannot import .*op.onnx: .*Frobnicate x1 \(hm\)", ["import", str(tmp_path / "op.onnx")])


def test_mutated_graph_files_raise_only_graph_file_errors(tmp_path):
    """Byte flips, truncations and insertions of a valid file: each load either succeeds or raises
    GraphFileError (never another exception type)."""
    src, gfile = str(tmp_path / "m.onnx"), tmp_path / "m.graph"
    onnx.save(lstm_mlp_model(), src)
    assert cli.main(["import", src, "-o", str(gfile)]) == 0
    good = gfile.read_bytes()
    mrng = np.random.default_rng(7)
    p = tmp_path / "mut.graph"
    outcomes = {"ok": 0, "refused": 0}
    for k in range(150):
        data = bytearray(good)
        kind = k % 3
        pos = int(mrng.integers(0, len(data)))
        if kind == 0:
            for _ in range(int(mrng.integers(1, 4))):
                data[int(mrng.integers(0, len(data)))] = int(mrng.integers(0, 256))
        elif kind == 1:
            del data[pos:]
        else:
            data[pos:pos] = bytes(mrng.integers(0, 256, int(mrng.integers(1, 16)), dtype=np.uint8))
        p.write_bytes(bytes(data))
        try:
            graph_io.load_graph(str(p))
            outcomes["ok"] += 1
        except graph_io.GraphFileError as e:
            assert str(p) in str(e)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 50, outcomes  # most mutations break the file, and each is refused cleanly
