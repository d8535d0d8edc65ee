"""`isthmus profile --runtime onnxruntime` writes an onnxruntime device profile whose op keys the
partitioner prices with, and which `isthmus split --edge-format onnx --edge-profile` plans with."""
import json

import numpy as np
import pytest

from isthmus.apps import cli
from isthmus.partitioner.costmodel import cost_key
from isthmus.partitioner.devices import EDGE, DeviceProfile

from .cli_models import cnn_onnx

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def ort_profile(tmp_path_factory):
    d = tmp_path_factory.mktemp("ortprof")
    path = str(d / "phone-ort.json")
    assert cli.main(["profile", "--device", "phone-ort", "--runtime", "onnxruntime", "--quick", "--slowdown", "4",
                     "--ops", "MatMul", "FusedConv2D", "Relu", "Add", "--out", path]) == 0
    return d, path


def test_profile_runtime_onnxruntime_writes_an_edge_profile(ort_profile):
    _, path = ort_profile
    p = DeviceProfile.load(path)
    assert p.name == "phone-ort" and p.kernel_table == "edge" and p.blas_threads == 1
    assert p.memory_budget == EDGE.memory_budget
    assert {"MatMul", "MatMul:vector", "FusedConv2D", "Relu", "Add"} <= set(p.op_coeffs)
    # its prices are onnxruntime's, not the built-in edge's, and positive
    flops, nbytes = 2 * 1024 * 1024, 4 * (1024 * 1024 + 2048)
    assert p.op_time("MatMul:vector", flops, nbytes) != EDGE.op_time("MatMul:vector", flops, nbytes)
    assert p.op_time("MatMul:vector", flops, nbytes) > 0


def test_profile_op_keys_are_the_cost_models_keys(ort_profile):
    """The keys are those cost_key gives the nodes of a real graph, so the partitioner finds them."""
    import isthmus as ism
    _, path = ort_profile
    p = DeviceProfile.load(path)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, 64), name="x")
        w = ism.constant(np.ones((64, 32), np.float32))
        y = ism.relu(ism.matmul(x, w) + 1.0)
    keys = {cost_key(n) for n in g.nodes if n.op in ("MatMul", "Relu", "Add")}
    assert keys and keys <= set(p.op_coeffs), (keys, sorted(p.op_coeffs))
    assert y.node.op == "Relu"


def test_profile_runtime_onnxruntime_default_name_and_refusals(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["profile", "--runtime", "onnxruntime", "--quick", "--ops", "Relu"]) == 0
    out = capsys.readouterr().out
    assert "edge-ort.json" in out and "--edge-format onnx" in out
    assert DeviceProfile.load(str(tmp_path / "edge-ort.json")).name == "edge-ort"
    assert cli.main(["profile", "--runtime", "onnxruntime", "--quick", "--ops", "Softmax", "--out", "x.json",
                     "--force"]) == 2
    assert "onnxruntime is timed on" in capsys.readouterr().err
    assert cli.main(["profile", "--runtime", "onnxruntime", "--clock", "cpu", "--out", "x.json", "--force"]) == 2
    assert "--runtime onnxruntime times wall clock only" in capsys.readouterr().err


def test_split_onnx_plans_with_the_profile_given(ort_profile, capsys):
    d, path = ort_profile
    model = str(d / "cnn.onnx")
    cnn_onnx(model, res=16)
    capsys.readouterr()
    assert cli.main(["split", model, "-o", str(d / "onnx"), "--rtt", "5ms", "--edge-format", "onnx",
                     "--edge-profile", path]) == 0
    out, err = capsys.readouterr()
    assert "isthmus split: note" not in err and "edge profile: phone-ort" in out
    assert json.loads((d / "onnx" / "plan.json").read_text())["edge_profile"] == "phone-ort"
