"""`isthmus split --edge-format tflite|onnx` then `isthmus edge-run CUT --runtime litert|onnxruntime --cloud`
against the offload service (`isthmus serve`): every cut of the split gives what onnxruntime gives on
the unsplit source model (fp32 within 1e-5 relative), and an int8 split (LiteRT's integer kernels,
or QDQ in onnxruntime) stays within the drift the split's own report gives."""
import json
import re

import numpy as np
import pytest

from isthmus.apps import cli

from .cli_models import cnn_onnx, images

ort = pytest.importorskip("onnxruntime")
RUNTIMES = {"litert": "tflite", "onnxruntime": "onnx"}     # --runtime -> --edge-format


def _needs(runtime: str) -> None:
    if runtime == "litert":
        pytest.importorskip("ai_edge_litert.interpreter")
        pytest.importorskip("tflite")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("ortrun")
    path = str(d / "cnn.onnx")
    cnn_onnx(path, res=32)
    x = images(2, res=32, seed=5)[:1]
    np.save(d / "x.npy", x)
    np.savez(d / "calib.npz", image=images(40, res=32, seed=1))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return d, path, x, sess.run(None, {sess.get_inputs()[0].name: x})[0]


def _rel(got, want) -> float:
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))


def _split(model, name, fmt, *extra):
    d, path, _, _ = model
    out = d / name
    # a phone-speed edge on a fast link: the sweep holds cuts that offload, the input and inner ones
    assert cli.main(["split", path, "-o", str(out), "--rtt", "5ms", "--edge-profile", "phone", "--bandwidth",
                     "100mbps", "--edge-format", fmt, *extra]) == 0
    parts = json.loads((out / fmt / "parts.json").read_text())["parts"]
    cuts = [p for p in parts if p["cloud_part"]]
    assert cuts, parts
    return out, cuts


def _edge_run(model, out, runtime, p, address, capsys) -> np.ndarray:
    d = model[0]
    saved = d / f"{out.name}-{p['cut']}.npy"
    capsys.readouterr()
    # the deadline bounds the wait: a cold `isthmus serve` compiles its kernels on the first call (under two
    # test workers on a loaded machine that once took more than 20 s)
    assert cli.main(["edge-run", str(out / RUNTIMES[runtime] / p["file"]), "--runtime", runtime, "--cloud", address,
                     "--deadline-ms", "60000", "--input", str(d / "x.npy"), "--repeat", "1",
                     "--save", str(saved)]) == 0, p
    assert {"litert": "LiteRT", "onnxruntime": "onnxruntime"}[runtime] + ": load+prepare" in capsys.readouterr().out
    return np.load(saved)


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_fp32_split_through_the_phone_runtime_and_serve_equals_the_unsplit_model(model, capsys, runtime):
    from isthmus.cloud.offload import OffloadServer
    _needs(runtime)
    d, _, x, want = model
    fmt = RUNTIMES[runtime]
    out, cuts = _split(model, f"fp32-{fmt}", fmt)
    assert cli.main(["edge-run", str(out / fmt / f"full.{fmt}"), "--runtime", runtime, "--input",
                     str(d / "x.npy"), "--repeat", "1", "--save", str(d / f"full-{fmt}.npy")]) == 0
    assert _rel(np.load(d / f"full-{fmt}.npy"), want) <= 1e-5
    server = OffloadServer(str(out / "model.cloud"), max_batch_size=1, max_queue_delay_ms=0.1)
    try:
        for p in cuts:
            assert _rel(_edge_run(model, out, runtime, p, server.address, capsys), want) <= 1e-5, p
    finally:
        server.stop(grace=0)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_int8_split_through_the_phone_runtime_and_isthmus_serve_stays_within_the_reported_drift(model, capsys,
                                                                                                 runtime):
    from .test_cli_e2e import Served
    _needs(runtime)
    d, _, x, want = model
    fmt = RUNTIMES[runtime]
    out, cuts = _split(model, f"int8-{fmt}", fmt, "--int8", "--calibration-data", str(d / "calib.npz"))
    report = (out / "report.txt").read_text()
    drift = float(re.search(r"int8 drift vs fp32 on the calibration data .*?: max abs ([0-9.e+-]+)", report).group(1))
    with Served(str(out / "model.cloud")) as address:
        for p in cuts:
            got = _edge_run(model, out, runtime, p, address, capsys)
            assert np.abs(got - want).max() <= max(drift, 1e-6) * 1.5, (p["cut"], np.abs(got - want).max(), drift)


def test_models_the_onnxruntime_runtime_cannot_run_are_refused_in_one_line(model, capsys, tmp_path):
    d = model[0]
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07 not onnx")
    for path, why in ((str(bad), "onnxruntime cannot load"), (model[1], "no isthmus.onnx metadata"),
                      (str(tmp_path / "none.onnx"), "no such file")):
        capsys.readouterr()
        assert cli.main(["edge-run", path, "--runtime", "onnxruntime", "--zeros", "--cloud", "127.0.0.1:1"]) == 2
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err, err
    assert cli.main(["edge-run", model[1], "--runtime", "onnxruntime", "--zeros", "--emulate-link", "5mbps",
                     "--cloud", "127.0.0.1:1"]) == 2
    assert "--emulate-link needs --runtime isthmus" in capsys.readouterr().err
