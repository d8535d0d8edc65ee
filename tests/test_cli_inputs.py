"""Inputs by name and dynamic shapes on the command line (issue 22 item 2): several `--input
NAME=file.npy`, `--input-shape NAME=D0,D1,..` for dims a file leaves unknown, and an edge file exported
with a dynamic batch running at batch 1 and 5; results checked against numpy and onnxruntime."""
import json

import numpy as np
import pytest

from isthmus.apps import cli

from .cli_models import cnn_onnx, images


def _two_input_onnx(path, shape_a, shape_b):
    """y = a * b + a, z = Relu(b): two named inputs, two outputs; dims may be names or None."""
    import onnx
    from onnx import TensorProto, helper
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, shape_a)
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, shape_b)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Mul", ["a", "b"], ["ab"], name="mul"), helper.make_node("Add", ["ab", "a"], ["y"], name="add"),
             helper.make_node("Relu", ["b"], ["z"], name="relu")]
    m = helper.make_model(helper.make_graph(nodes, "two", [a, b], [y, z]), opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 10
    onnx.save(m, str(path))


def _run(capsys, *argv) -> str:
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, (argv, err)
    return out


def test_several_named_inputs_and_a_dynamic_batch(tmp_path, capsys):
    _two_input_onnx(tmp_path / "two.onnx", ["N", 6], ["N", 6])
    _run(capsys, "convert", tmp_path / "two.onnx", "--dynamic-batch", "-o", tmp_path / "two.isth")
    info = json.loads(_run(capsys, "info", tmp_path / "two.isth", "--json"))
    assert [i["name"] for i in info["inputs"]] == ["a", "b"] and info["inputs"][0]["shape"][0] in ("?", -1, None)
    rng = np.random.default_rng(3)
    for batch in (1, 5):
        a = rng.standard_normal((batch, 6)).astype(np.float32)
        b = rng.standard_normal((batch, 6)).astype(np.float32)
        np.save(tmp_path / "a.npy", a)
        np.save(tmp_path / "b.npy", b)
        save = tmp_path / f"y{batch}.npy"
        # b given first: inputs are matched by name, not by position
        _run(capsys, "edge-run", tmp_path / "two.isth", "--input", f"b={tmp_path / 'b.npy'}",
             "--input", f"a={tmp_path / 'a.npy'}", "--repeat", "1", "--save", save)
        np.testing.assert_allclose(np.load(save), a * b + a, rtol=1e-6)
    out = _run(capsys, "bench", tmp_path / "two.isth", "--input", f"a={tmp_path / 'a.npy'}",
               "--input", f"b={tmp_path / 'b.npy'}", "--runs", "3", "--warmup", "1")
    assert "median" in out


def test_one_of_two_inputs_missing_is_named(tmp_path, capsys):
    _two_input_onnx(tmp_path / "two.onnx", [2, 6], [2, 6])
    _run(capsys, "convert", tmp_path / "two.onnx", "-o", tmp_path / "two.isth")
    np.save(tmp_path / "a.npy", np.ones((2, 6), np.float32))
    capsys.readouterr()
    assert cli.main(["edge-run", str(tmp_path / "two.isth"), "--input", f"a={tmp_path / 'a.npy'}"]) == 2
    err = capsys.readouterr().err
    assert "'b'" in err or " b" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_input_shape_fills_unknown_dims(tmp_path, capsys):
    """A file whose inputs have no shape (None) or symbolic dims: --input-shape gives them, per name."""
    _two_input_onnx(tmp_path / "u.onnx", None, ["N", "C"])
    _run(capsys, "convert", tmp_path / "u.onnx", "--input-shape", "a=3,4", "--input-shape", "b=3,4",
         "-o", tmp_path / "u.isth")
    info = json.loads(_run(capsys, "info", tmp_path / "u.isth", "--json"))
    assert [i["shape"] for i in info["inputs"]] == [[3, 4], [3, 4]]
    a = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    b = np.full((3, 4), 0.5, np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    _run(capsys, "edge-run", tmp_path / "u.isth", "--input", f"a={tmp_path / 'a.npy'}", "--input",
         f"b={tmp_path / 'b.npy'}", "--repeat", "1", "--save", tmp_path / "y.npy")
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), a * b + a, rtol=1e-6)
    # a wrong count of dims for the file's own rank is refused, naming the flag and the input
    capsys.readouterr()
    assert cli.main(["convert", str(tmp_path / "u.onnx"), "--input-shape", "a=3,4", "--input-shape", "b=3,4,5",
                     "-o", str(tmp_path / "bad.isth")]) == 2
    err = capsys.readouterr().err
    assert "--input-shape" in err and "b" in err and "Traceback" not in err, err


def test_cnn_exported_with_a_dynamic_batch_runs_at_batch_1_and_5(tmp_path, capsys):
    ort = pytest.importorskip("onnxruntime")
    cnn_onnx(str(tmp_path / "cnn.onnx"), res=16)
    _run(capsys, "convert", tmp_path / "cnn.onnx", "--dynamic-batch", "-o", tmp_path / "cnn.isth")
    sess = ort.InferenceSession(str(tmp_path / "cnn.onnx"), providers=["CPUExecutionProvider"])
    for batch in (1, 5):
        x = images(batch, res=16, seed=batch)
        np.save(tmp_path / "x.npy", x)
        _run(capsys, "edge-run", tmp_path / "cnn.isth", "--input", f"image={tmp_path / 'x.npy'}", "--repeat", "1",
             "--save", tmp_path / f"y{batch}.npy", "--force")
        want = sess.run(None, {"image": x})[0]
        got = np.load(tmp_path / f"y{batch}.npy")
        assert got.shape == (batch, 10)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
