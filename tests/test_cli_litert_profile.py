"""`isthmus profile --runtime litert` writes a LiteRT device profile that `isthmus split --edge-format
tflite --edge-profile` plans with; without one, split plans with the LiteRT profile that ships."""
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


def test_split_tflite_plans_with_the_shipped_litert_profile_unless_given_one(litert_profile, capsys):
    """Without --edge-profile, --edge-format tflite is priced by apps/profiles/phone-litert.json (LiteRT's
    kernels measured here, scaled to a phone), and the plan and its report say so; a LiteRT profile the
    user made replaces it; the onnx format gets phone-ort.json the same way, isth the built-in edge."""
    from isthmus.apps.deploy import PHONE_LITERT_PROFILE
    d, path = litert_profile
    model = str(d / "cnn.onnx")
    cnn_onnx(model, res=16)
    shipped = DeviceProfile.load(PHONE_LITERT_PROFILE)
    assert shipped.name.startswith("phone-litert (LiteRT") and shipped.kernel_table == "edge"
    assert {"Conv2D", "FusedConv2D", "MatMul", "Relu", "Add"} <= set(shipped.op_coeffs) and shipped.client
    capsys.readouterr()
    assert _split(model, d / "plain") == 0
    out, err = capsys.readouterr()
    assert "the edge is priced by the phone-litert profile" in out and "phone-litert.json" in out, out
    assert f"edge profile: {shipped.name}" in out and "isthmus split: note" not in err
    plan = json.loads((d / "plain" / "plan.json").read_text())
    assert plan["edge_profile"] == shipped.name
    assert shipped.name in (d / "plain" / "report.txt").read_text()
    # the prices are LiteRT's: a 3x3 conv on 32 channels of 16x16 costs what the shipped profile says, not EDGE
    flops, nbytes = 2 * 9 * 32 * 32 * 16 * 16, 4 * (2 * 32 * 16 * 16 + 9 * 32 * 32)
    assert shipped.op_time("FusedConv2D", flops, nbytes) != EDGE.op_time("FusedConv2D", flops, nbytes)
    assert _split(model, d / "litert", "--edge-profile", path) == 0
    out, err = capsys.readouterr()
    assert "isthmus split: note" not in err and "priced by the phone-litert profile" not in out
    assert "edge profile: phone-litert" in out
    assert json.loads((d / "litert" / "plan.json").read_text())["edge_profile"] == "phone-litert"
    assert (d / "litert" / "tflite" / "parts.json").is_file()
    # the isthmus-interpreter phone profile with .tflite parts: planned as asked, with a note
    assert _split(model, d / "phone", "--edge-profile", "phone") == 0
    assert "--edge-profile phone-litert" in capsys.readouterr().err
    # the onnx format plans with the onnxruntime profile that ships; the isthmus format with the built-in edge
    from isthmus.apps.deploy import PHONE_ORT_PROFILE
    ort_profile = DeviceProfile.load(PHONE_ORT_PROFILE)
    assert ort_profile.name.startswith("phone-ort (onnxruntime") and ort_profile.kernel_table == "edge"
    assert cli.main(["split", model, "-o", str(d / "onnx"), "--rtt", "5ms", "--edge-format", "onnx"]) == 0
    out, err = capsys.readouterr()
    assert "isthmus split: note" not in err and "priced by the phone-ort profile" in out
    assert json.loads((d / "onnx" / "plan.json").read_text())["edge_profile"] == ort_profile.name
    assert cli.main(["split", model, "-o", str(d / "isth"), "--rtt", "5ms"]) == 0
    assert json.loads((d / "isth" / "plan.json").read_text())["edge_profile"] == EDGE.name
    assert "priced by the" not in capsys.readouterr().out
