"""The four-command path of issue 22, as a user types it: an ONNX CNN and 100 calibration images to
a split served by `isthmus serve` and run by `isthmus edge-run --cloud`, checked against onnxruntime."""
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from .cli_models import ISTHMUS, cnn_onnx, images

ort = pytest.importorskip("onnxruntime")
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")


def _isthmus(*args, timeout=120):
    r = subprocess.run([*ISTHMUS, *args], capture_output=True, text=True,
                       timeout=timeout, env=ENV)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return r.stdout


class Served:
    """`isthmus serve FILE --port 0` in a subprocess; the address it prints, within a bounded wait."""

    def __init__(self, path: str):
        self.proc = subprocess.Popen([*ISTHMUS, "serve", path, "--port", "0",
                                      "--log-every", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=ENV)

    def __enter__(self) -> str:
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if sel.select(timeout=1.0):
                line = self.proc.stdout.readline()
                if line.startswith("ISTHMUS_OFFLOAD "):
                    return line.split()[1]
                if not line:
                    break
        self.__exit__()
        raise AssertionError("isthmus serve did not start: " + self.proc.stderr.read())

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _reference(model: str, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0]


@pytest.mark.slow
def test_four_commands_from_onnx_to_a_running_int8_split(tmp_path):
    model, calib, x = str(tmp_path / "cnn.onnx"), str(tmp_path / "calib.npz"), str(tmp_path / "x.npy")
    cnn_onnx(model)
    np.savez(calib, image=images(100))
    xv = images(1, seed=7)
    np.save(x, xv)
    t0 = time.perf_counter()
    # 1. quantize: the report's drift is what the split may differ by
    rep = _isthmus("quantize", model, "--calibration-data", calib, "-o", str(tmp_path / "cnn.int8.isth"))
    drift = float(re.search(r"drift vs fp32 on 100 calibration samples: max abs ([0-9.e+-]+)", rep).group(1))
    # 2. split --int8: edge file, cloud file, plan, report
    out = _isthmus("split", model, "--bandwidth", "5mbps", "--rtt", "10ms", "--edge-profile", "phone", "--int8",
                   "--calibration-data", calib, "-o", str(tmp_path / "deploy"))
    assert "cloud part" in out and "int8 drift vs fp32" in out, out
    plan = json.loads((tmp_path / "deploy" / "plan.json").read_text())
    chosen = next(c for c in plan["cuts"] if c["name"] == plan["chosen_cut"])
    assert chosen["cloud_part"] and (tmp_path / "deploy" / "plan.svg").exists(), plan["cuts"]
    # 3. serve, 4. edge-run --cloud on the cut planned for 5 Mbit/s (an int8 edge part, the cloud part in
    # fp32), pinned with --cut: a loaded machine stretches the measured link, and following it is
    # tests/edge/test_cut_selector.py's business, not this path's
    with Served(str(tmp_path / "deploy" / "model.cloud")) as address:
        run = _isthmus("edge-run", str(tmp_path / "deploy" / "model.isth"), "--cloud", address, "--require-cloud",
                       "--cut", plan["chosen_cut"],
                       "--input", f"image={x}", "--emulate-link", "5mbps", "--rtt", "1ms", "--repeat", "3",
                       "--save", str(tmp_path / "y.npy"), "--deadline-ms", "60000")
    seconds = time.perf_counter() - t0
    stats = json.loads(run.split("stats ", 1)[1].splitlines()[0])
    assert stats["cloud"] >= 3 and stats["fallback"] == 0, stats
    got, want = np.load(tmp_path / "y.npy"), _reference(model, xv)
    assert np.abs(got - want).max() <= max(drift, 1e-6) * 1.5, (np.abs(got - want).max(), drift)
    print(f"four commands in {seconds:.1f} s (quantize, split --int8, serve, edge-run --cloud)")
    assert seconds < 180  # the target is 60 s on an idle machine; this one is shared


@pytest.mark.slow
def test_fp32_split_equals_the_unsplit_model(tmp_path):
    model, x = str(tmp_path / "cnn.onnx"), str(tmp_path / "x.npy")
    cnn_onnx(model)
    xv = images(1, seed=3)
    np.save(x, xv)
    _isthmus("split", model, "--rtt", "10ms", "--edge-profile", "phone", "-o", str(tmp_path / "d"))
    cuts = json.loads((tmp_path / "d" / "plan.json").read_text())["cuts"]
    with Served(str(tmp_path / "d" / "model.cloud")) as address:
        for bw in (5e6, 1000e6):  # the stem on the edge; everything in the cloud
            # the cut planned for this uplink, pinned (a loaded machine stretches the measured link)
            cut = next(c for c in cuts if c["min_bandwidth_bps"] <= bw < (c["max_bandwidth_bps"] or np.inf))
            assert cut["cloud_part"], cuts
            out = _isthmus("edge-run", str(tmp_path / "d" / "model.isth"), "--cloud", address, "--require-cloud",
                           "--cut", cut["name"], "--input", x, "--emulate-link", f"{bw / 1e6:g}mbps", "--rtt", "1ms",
                           "--repeat", "1", "--save", str(tmp_path / "y.npy"), "--force", "--deadline-ms", "60000")
            assert '"cloud": 2' in out, out
            np.testing.assert_allclose(np.load(tmp_path / "y.npy"), _reference(model, xv), rtol=1e-4, atol=1e-5)
        r = subprocess.run([*ISTHMUS, "edge-run", str(tmp_path / "d" / "model.isth"), "--cloud", address,
                            "--cut", "nosuch", "--input", x], capture_output=True, text=True, timeout=120, env=ENV)
        assert r.returncode != 0 and "--cut nosuch" in r.stderr and cuts[0]["name"] in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
