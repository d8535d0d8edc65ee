"""`isthmus profile --runtime litert` writes a LiteRT device profile that `isthmus split --edge-format
tflite --edge-profile` plans with; without one, split says on stderr that it plans with isthmus's."""
import json

import pytest

from isthmus.apps import cli
from isthmus.partitioner.devices import EDGE, DeviceProfile

from .cli_models import cnn_onnx

pytest.importorskip("ai_edge_litert.interpreter")
pytest.importorskip("tflite")


@pytest.fixture(scope="module")
def litert_profile(tmp_path_factory):
    d = tmp_path_factory.mktemp("litertprof")
    path = str(d / "phone-litert.json")
    assert cli.main(["profile", "--device", "phone-litert", "--runtime", "litert", "--quick", "--slowdown", "4",
                     "--ops", "MatMul", "FusedConv2D", "Relu", "Add", "--out", path]) == 0
    return d, path


def test_profile_runtime_litert_writes_an_edge_profile(litert_profile, capsys):
    _, path = litert_profile
    p = DeviceProfile.load(path)
    assert p.name == "phone-litert" and p.kernel_table == "edge" and p.blas_threads == 1
    assert p.memory_budget == EDGE.memory_budget
    assert {"MatMul", "MatMul:vector", "FusedConv2D", "Relu", "Add"} <= set(p.op_coeffs)
    # its prices are LiteRT's, not the built-in edge's: a 1x1024 @ 1024x1024 MatMul costs differently
    flops, nbytes = 2 * 1024 * 1024, 4 * (1024 * 1024 + 2048)
    assert p.op_time("MatMul:vector", flops, nbytes) != EDGE.op_time("MatMul:vector", flops, nbytes)
    assert p.op_time("MatMul:vector", flops, nbytes) > 0


def test_profile_default_name_follows_the_runtime(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["profile", "--runtime", "litert", "--quick", "--ops", "Relu"]
    assert cli.main(argv) == 0
    assert "edge-litert.json" in capsys.readouterr().out
    assert DeviceProfile.load(str(tmp_path / "edge-litert.json")).name == "edge-litert"
    assert cli.main(argv) == 2  # refuses to overwrite it
    assert "--force" in capsys.readouterr().err
    assert cli.main([*argv, "--force"]) == 0
    assert cli.main(["profile", "--quick", "--ops", "Relu"]) == 0  # isthmus's kernels: still 'cloud'
    assert DeviceProfile.load(str(tmp_path / "cloud.json")).kernel_table != "edge"


def _split(model, out, *extra):
    return cli.main(["split", model, "-o", str(out), "--rtt", "5ms", "--edge-format", "tflite", *extra])


def test_split_tflite_warns_without_a_litert_profile_and_plans_with_one(litert_profile, capsys):
    d, path = litert_profile
    model = str(d / "cnn.onnx")
    cnn_onnx(model, res=16)
    capsys.readouterr()
    assert _split(model, d / "plain") == 0
    err = capsys.readouterr().err
    notes = [ln for ln in err.splitlines() if "isthmus split: note" in ln]
    assert len(notes) == 1 and "--runtime litert" in notes[0] and "--edge-profile" in notes[0], err
    assert json.loads((d / "plain" / "plan.json").read_text())["edge_profile"] == EDGE.name
    assert _split(model, d / "litert", "--edge-profile", path) == 0
    out, err = capsys.readouterr()
    assert "isthmus split: note" not in err
    assert "edge profile: phone-litert" in out
    assert json.loads((d / "litert" / "plan.json").read_text())["edge_profile"] == "phone-litert"
    assert (d / "litert" / "tflite" / "parts.json").is_file()
    # the onnx format says nothing about LiteRT
    assert cli.main(["split", model, "-o", str(d / "onnx"), "--rtt", "5ms", "--edge-format", "onnx"]) == 0
    assert "isthmus split: note" not in capsys.readouterr().err
