"""The `isthmus` command: help, version, ops; subcommands import only what they need."""
import json
import subprocess
import sys

from .cli_models import ISTHMUS


def _run(*args, timeout=120):
    return subprocess.run([*ISTHMUS, *args], capture_output=True, text=True, timeout=timeout)


def test_help_lists_commands_and_version():
    out = _run("--help")
    assert out.returncode == 0
    for cmd in ("demo", "ops", "partition", "profile", "quantize", "split", "info", "bench"):
        assert cmd in out.stdout
    assert _run("--version").stdout.strip() == "0.1.0"


def test_ops_json_lists_every_registered_op_with_its_gradient_flag():
    out = _run("ops", "--json")
    rows = json.loads(out.stdout)
    by = {r["op"]: r for r in rows}
    assert by["MatMul"]["gradient"] and by["Conv2D"]["gradient"] and not by["Placeholder"]["gradient"]
    assert len(rows) > 100


def test_convert_onnx_to_edge_and_run_it(tmp_path):
    import numpy as np
    import onnx

    import isthmus as ism
    from isthmus.converters import to_onnx
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, 6), name="x")
        y = ism.nn.Dense(3, activation="relu")(x)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    onnx.save(to_onnx(sess, [y]), str(tmp_path / "m.onnx"))
    out = _run("convert", str(tmp_path / "m.onnx"), "--to", "edge", "-o", str(tmp_path / "m.isth"))
    assert out.returncode == 0, out.stderr
    xv = np.arange(6, dtype=np.float32).reshape(1, 6)
    np.save(tmp_path / "x.npy", xv)
    out = _run("edge-run", str(tmp_path / "m.isth"), "--input", str(tmp_path / "x.npy"), "--save", str(tmp_path / "y.npy"))
    assert out.returncode == 0, out.stderr
    assert "arena" in out.stdout and "invoke median" in out.stdout
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), sess.run(y, {x: xv}), rtol=1e-5)
