"""Refitting a device profile from traces of real runs (`isthmus calibrate --from-trace`)."""
import json

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import isthmus as ism
from isthmus.partitioner.devices import CLOUD
from isthmus.partitioner.trace_fit import TraceError, refit, report, samples_from_trace


def _traced_runs(batches, repeats=3):
    g = ism.Graph(seed=0)
    rng = np.random.default_rng(0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 256), name="x")
        w1 = ism.constant(rng.standard_normal((256, 512)).astype(np.float32))
        w2 = ism.constant(rng.standard_normal((512, 64)).astype(np.float32))
        y = ism.tanh(ism.relu(x @ w1) @ w2)
    sess = ism.Session(g)
    traces = []
    with threadpool_limits(1):  # a one-thread GEMM is far less disturbed by other work on the machine
        _trace(sess, x, y, batches, repeats, rng, traces)
    return traces


def _trace(sess, x, y, batches, repeats, rng, traces):
    for b in batches:
        xv = rng.standard_normal((b, 256)).astype(np.float32)
        sess.run(y, {x: xv})  # warm
        for _ in range(repeats):
            md = ism.RunMetadata()
            sess.run(y, {x: xv}, options=ism.RunOptions(trace=True), run_metadata=md)
            traces.append(md.to_chrome_trace())
    return traces


def test_events_carry_the_cost_at_the_shapes_run():
    (trace,) = _traced_runs([16], repeats=1)
    mm = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["args"]["op"] == "MatMul"]
    assert sorted(e["args"]["flops"] for e in mm) == sorted([2.0 * 16 * 256 * 512, 2.0 * 16 * 512 * 64])
    first = next(e for e in mm if e["args"]["flops"] == 2.0 * 16 * 256 * 512)
    assert first["args"]["bytes"] == 4.0 * (16 * 256 + 256 * 512 + 16 * 512)  # x, w1 read; out written


def _wrong_profile(samples, factor=20.0):
    """A profile `factor` times too slow for this machine as it is now: fitted to the traces, then
    scaled (the built-in profile is no yardstick on a shared machine, where a two-thread GEMM can
    run 30x slower than on an idle one)."""
    right, _ = refit(CLOUD, samples, name="right")
    return right.scaled(factor, name="wrong")


def test_refit_fixes_a_wrong_profile(tmp_path):
    traces = _traced_runs([4, 32, 128, 256])
    paths = []
    for i, t in enumerate(traces):
        p = tmp_path / f"t{i}.json"
        p.write_text(json.dumps(t))
        paths.append(str(p))
    samples = samples_from_trace(paths)
    assert {s.op for s in samples} >= {"MatMul", "Relu", "Tanh"}
    wrong = _wrong_profile(samples)  # predicts 20x too slow
    new, how = refit(wrong, samples, name="refit")
    assert how["MatMul"] == "fitted" and new.name == "refit"
    rep = report(wrong, new, samples)
    assert rep["MatMul"]["before"] > 5.0  # 20x too slow: error around 1900%
    assert rep["MatMul"]["after"] < 0.5
    assert all(r["after"] < r["before"] for r in rep.values())


def test_few_events_rescale_the_base_regression():
    wrong = _wrong_profile(samples_from_trace(_traced_runs([4, 32, 128, 256], repeats=1)))
    traces = _traced_runs([64], repeats=3)  # one shape per op: nothing to fit three coefficients on
    samples = samples_from_trace(traces)
    new, how = refit(wrong, samples)
    assert how["MatMul"].startswith("scaled x")
    ratio = float(how["MatMul"].split("x")[1])
    assert 0.001 < ratio < 0.5  # measured faster than the 20x-slow profile said
    mm = [s for s in samples if s.op == "MatMul"]
    pred = np.median([new.op_time("MatMul", s.flops, s.nbytes) / s.seconds for s in mm])
    assert 0.3 < pred < 3.0


def test_bad_traces_are_refused_clearly(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(TraceError, match="bad.json: not a readable JSON trace"):
        samples_from_trace([str(p)])
    with pytest.raises(TraceError, match="no 'traceEvents' list"):
        samples_from_trace([{"events": []}])
    with pytest.raises(TraceError, match="event 0 \\('n'\\) has malformed"):
        samples_from_trace([{"traceEvents": [{"ph": "X", "name": "n", "dur": "x", "args": {"op": "MatMul", "flops": 1}}]}])
    # events without a cost (other tools' traces, metadata) are skipped, not guessed at
    assert samples_from_trace([{"traceEvents": [{"ph": "M"}, {"ph": "X", "dur": 3, "args": {"op": "MatMul"}}]}]) == []


def test_calibrate_from_trace_command(tmp_path, capsys):
    from isthmus.apps.cli import main
    from isthmus.partitioner.devices import DeviceProfile
    paths = []
    for i, t in enumerate(_traced_runs([8, 64, 256], repeats=2)):
        p = tmp_path / f"t{i}.json"
        p.write_text(json.dumps(t))
        paths.append(str(p))
    base = tmp_path / "base.json"
    CLOUD.scaled(10.0, name="slow").save(str(base))
    out = tmp_path / "mine.json"
    assert main(["calibrate", "--from-trace", *paths, "--base", str(base), "--device", "mine", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "MatMul" in text and "fitted" in text and f"wrote {out}" in text
    prof = DeviceProfile.load(str(out))
    assert prof.name == "mine" and "MatMul" in prof.op_coeffs
    assert main(["calibrate", "--from-trace", str(tmp_path / "missing.json")]) == 2


def test_variants_of_a_traced_op_are_rescaled_with_it():
    from dataclasses import replace
    from isthmus.partitioner.calibrate import Sample
    base = replace(CLOUD, op_coeffs={"MatMul": (1e-6, 1e-11, 0.0), "MatMul:vector": (5e-7, 0.0, 1e-11)})
    # events of a device exactly 3x slower than the base's MatMul regression says
    samples = [Sample("MatMul", f"e{i}", f, b, 3 * base.op_time("MatMul", f, b))
               for i, (f, b) in enumerate([(1e6, 1e4), (1e7, 1e5), (1e8, 1e6), (3e8, 1e5), (5e5, 2e6)])]
    new, how = refit(base, samples)
    assert how["MatMul"] == "fitted" and how["MatMul:vector"] == "scaled x3.00"
    assert new.op_time("MatMul:vector", 1e6, 1e6) == pytest.approx(3 * base.op_time("MatMul:vector", 1e6, 1e6))
