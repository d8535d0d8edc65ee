"""`isthmus split --edge-format tflite|onnx` and `isthmus export --to tflite`: the files the commands
write run in LiteRT / onnxruntime and give what onnxruntime gives on the source ONNX model."""
import json
import os

import numpy as np
import pytest

from isthmus.apps import cli

from .cli_models import cnn_onnx, images

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("tflite")
litert = pytest.importorskip("ai_edge_litert.interpreter")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("phone")
    path = str(d / "cnn.onnx")
    cnn_onnx(path, res=32)
    x = images(2, res=32)[:1]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    return d, path, x, want


def _litert(data: bytes, x: np.ndarray) -> np.ndarray:
    from isthmus.edge.litert_client import tflite_metadata, to_model_input
    spec = tflite_metadata(data)["inputs"][0]
    it = litert.Interpreter(model_content=data, num_threads=1)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], to_model_input(x, spec))
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def _close(got, want):
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


def test_split_writes_tflite_parts_that_litert_runs(model, capsys):
    d, path, x, want = model
    out = d / "dep_tflite"
    assert cli.main(["split", path, "-o", str(out), "--rtt", "5ms", "--edge-format", "tflite"]) == 0
    assert "tflite edge parts" in capsys.readouterr().out
    parts = json.loads((out / "tflite" / "parts.json").read_text())
    assert parts["format"] == "tflite" and parts["parts"]
    for p in parts["parts"]:
        assert (out / "tflite" / p["file"]).stat().st_size > 0, p
    _close(_litert((out / "tflite" / "full.tflite").read_bytes(), x), want)
    # a second run refuses to overwrite without --force, and overwrites with it
    assert cli.main(["split", path, "-o", str(out), "--rtt", "5ms", "--edge-format", "tflite"]) == 2
    assert cli.main(["split", path, "-o", str(out), "--rtt", "5ms", "--edge-format", "tflite", "--force"]) == 0


def test_split_writes_onnx_parts_that_onnxruntime_runs(model):
    d, path, x, want = model
    out = d / "dep_onnx"
    assert cli.main(["split", path, "-o", str(out), "--rtt", "5ms", "--edge-format", "onnx"]) == 0
    parts = json.loads((out / "onnx" / "parts.json").read_text())
    assert parts["format"] == "onnx" and all((out / "onnx" / p["file"]).exists() for p in parts["parts"])
    sess = ort.InferenceSession(str(out / "onnx" / "full.onnx"), providers=["CPUExecutionProvider"])
    _close(sess.run(None, {sess.get_inputs()[0].name: x})[0], want)
    assert not os.path.exists(out / "tflite")


def test_export_to_tflite_runs_in_litert(model):
    d, path, x, want = model
    gfile = str(d / "cnn.graph")
    assert cli.main(["import", path, "-o", gfile, "--force"]) == 0
    assert cli.main(["export", gfile, "--to", "tflite"]) == 0
    _close(_litert((d / "cnn.tflite").read_bytes(), x), want)


def test_edge_run_with_litert_alone_and_as_the_edge_part_of_a_split(model, capsys):
    from isthmus.cloud.offload import OffloadServer
    d, path, x, want = model
    out = d / "dep_run"
    # a phone-speed edge on a fast link: the sweep holds cuts that offload
    assert cli.main(["split", path, "-o", str(out), "--rtt", "5ms", "--edge-profile", "phone", "--bandwidth", "100mbps",
                     "--edge-format", "tflite"]) == 0
    np.save(d / "x.npy", x)
    parts = json.loads((out / "tflite" / "parts.json").read_text())["parts"]
    capsys.readouterr()
    assert cli.main(["edge-run", str(out / "tflite" / "full.tflite"), "--runtime", "litert", "--input",
                     str(d / "x.npy"), "--repeat", "2", "--save", str(d / "full.npy")]) == 0
    assert "LiteRT" in capsys.readouterr().out
    _close(np.load(d / "full.npy"), want)
    cuts = [p for p in parts if p["cloud_part"]]
    assert cuts, parts
    server = OffloadServer(str(out / "model.cloud"), max_batch_size=1, max_queue_delay_ms=0.1)
    try:
        for p in cuts:  # a cold server compiles the cloud part's kernels on its first call: a 60 s bound
            saved = d / f"{p['cut']}.npy"
            assert cli.main(["edge-run", str(out / "tflite" / p["file"]), "--runtime", "litert", "--cloud",
                             server.address, "--deadline-ms", "60000", "--input", str(d / "x.npy"), "--repeat", "1",
                             "--save", str(saved)]) == 0, p
            _close(np.load(saved), want)
    finally:
        server.stop(grace=0)
    # an .isth given to --runtime litert is refused in one line that names the file
    capsys.readouterr()
    assert cli.main(["edge-run", str(out / "model.isth"), "--runtime", "litert", "--zeros"]) == 2
    err = capsys.readouterr().err
    assert "model.isth: not a .tflite file" in err and "Traceback" not in err
