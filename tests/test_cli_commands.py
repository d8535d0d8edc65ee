"""The new commands' results, checked against independent references: quantize's drift against
onnxruntime, info against the ONNX file itself, bench's statistics, deploy_split's files."""
import json
import os

import numpy as np
import pytest

from isthmus.apps import cli

from .cli_models import cnn_onnx, images

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("cmds")
    path = str(d / "cnn.onnx")
    cnn_onnx(path, res=32)
    np.savez(d / "calib.npz", image=images(20, res=32))
    return d, path


def _run(capsys, *argv) -> str:
    capsys.readouterr()
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def test_quantize_reports_the_drift_onnxruntime_sees(model, capsys):
    from isthmus.apps.cmd_quantize import quantize
    from isthmus.edge import Interpreter
    d, path = model
    rep = quantize(path, str(d / "calib.npz"), str(d / "q.isth"), force=True)
    x = np.load(d / "calib.npz")["image"]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    interp = Interpreter(str(d / "q.isth"))
    worst = max(float(np.abs(interp.invoke(x[i:i + 1])[0] - sess.run(None, {"image": x[i:i + 1]})[0]).max())
                for i in range(len(x)))
    assert rep.samples == 20 and rep.int8_ops > 0
    assert abs(worst - rep.max_abs_drift) <= 1e-4 + 1e-3 * worst, (worst, rep.max_abs_drift)
    assert 0 < rep.int8_bytes < 0.5 * rep.fp32_bytes  # int8 weights: about a quarter
    out = _run(capsys, "quantize", path, "--calibration-data", str(d / "calib.npz"), "-o", str(d / "q2.isth"),
               "--method", "percentile", "--percentile", "99.9")
    assert "percentile 99.9" in out and "drift vs fp32 on 20 calibration samples" in out


def test_info_matches_the_onnx_file_and_the_quantized_one(model, capsys):
    import onnx
    d, path = model
    info = json.loads(_run(capsys, "info", path, "--json"))
    proto = onnx.load(path)
    assert [i["name"] for i in info["inputs"]] == [i.name for i in proto.graph.input]
    assert info["inputs"][0]["shape"] == ["?", 1, 32, 32] and info["outputs"][0]["shape"] == ["?", 10]
    assert info["weight_bytes"] == sum(onnx.numpy_helper.to_array(t).nbytes for t in proto.graph.initializer)
    assert info["int8_ops"] == 0 and info["fp32_ops"] > 0
    assert cli.main(["quantize", path, "--calibration-data", str(d / "calib.npz"), "-o", str(d / "i.isth")]) == 0
    q = json.loads(_run(capsys, "info", str(d / "i.isth"), "--json"))
    assert q["int8_ops"] >= 4 and q["ops"].get("Quantize") == 1 and q["inputs"][0]["shape"] == [1, 1, 32, 32]


def test_bench_prints_ordered_statistics_and_a_per_op_table(model, capsys):
    from isthmus.apps.cmd_bench import bench
    d, path = model
    assert cli.main(["convert", path, "-o", str(d / "b.isth"), "--force"]) == 0
    r = bench(str(d / "b.isth"), random_input=True, runs=15, warmup=2, threads=1, per_op=True)
    assert len(r.runs) == 15 and min(r.runs) <= r.percentile(90) <= r.percentile(99) <= max(r.runs)
    assert r.threads == 1 and r.arena_bytes > 0 and r.peak_rss_bytes > 0
    assert {op for _, op, _ in r.per_op} >= {"Conv2D", "MaxPool"} or {op for _, op, _ in r.per_op} >= {"FusedConv2D"}
    out = _run(capsys, "bench", path, "--random-input", "--runs", "5", "--per-op")
    assert "p99" in out and "core executor" in out and "by op type" in out


def test_deploy_split_writes_what_serve_and_edge_run_need(model):
    from isthmus.apps.deploy import deploy_split
    from isthmus.cloud.offload_model import load_cloud_parts
    from isthmus.edge.split_model import load_split
    d, path = model
    dep = deploy_split(path, str(d / "dep"), bandwidth="5mbps", rtt="5ms", edge_profile="phone", force=True)
    plan = json.loads(open(dep.plan_json).read())
    split = load_split(dep.edge_file)
    assert [c.name for c in split.cuts] == [c["name"] for c in plan["cuts"]]
    chosen = next(c for c in plan["cuts"] if c["name"] == dep.chosen_cut)
    assert chosen["min_bandwidth_bps"] <= 5e6 < (chosen["max_bandwidth_bps"] or float("inf"))
    parts = {c.cloud_part for c in split.cuts if c.cloud_part}
    if parts:
        assert set(load_cloud_parts(dep.cloud_file).parts) == parts
    assert os.path.getsize(dep.plan_svg) > 0 and "predicted: split" in dep.report
    assert dep.predicted["split"] <= min(dep.predicted["edge_only"], dep.predicted["cloud_only"]) + 1e-12


def test_a_dynamic_batch_edge_file_runs_at_any_batch(model, capsys):
    d, path = model
    assert cli.main(["convert", path, "--dynamic-batch", "-o", str(d / "dyn.isth"), "--force"]) == 0
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for n in (1, 3):
        x = images(n, res=32, seed=n)
        np.save(d / "x.npy", x)
        out = _run(capsys, "edge-run", str(d / "dyn.isth"), "--input", f"image={d / 'x.npy'}", "--repeat", "1",
                   "--save", str(d / "y.npy"), "--force")
        assert f"float32[{n}, 10]" in out
        np.testing.assert_allclose(np.load(d / "y.npy"), sess.run(None, {"image": x})[0], rtol=1e-4, atol=1e-5)


def test_quantize_passes_its_options_to_the_quantizer(model):
    from isthmus.apps.cmd_quantize import quantize
    d, path = model
    calib = str(d / "calib.npz")
    default = quantize(path, calib, str(d / "d.isth"), limit=6, force=True)
    channel = quantize(path, calib, str(d / "c.isth"), per_channel=True, limit=6, force=True)
    tensor = quantize(path, calib, str(d / "t.isth"), per_channel=False, limit=6, force=True)
    assert open(d / "d.isth", "rb").read() == open(d / "c.isth", "rb").read()  # per channel by default
    assert open(d / "t.isth", "rb").read() != open(d / "c.isth", "rb").read()
    assert default.max_abs_drift == channel.max_abs_drift and tensor.max_abs_drift > 0
    assert quantize(path, calib, str(d / "e.isth"), method="entropy", limit=6, force=True).method == "entropy"
