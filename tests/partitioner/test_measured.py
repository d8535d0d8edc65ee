"""Measured node times (profile-guided planning), the call's fixed cost on the link, BLAS threads."""
import json
import warnings

import numpy as np
import pytest

import isthmus as ism
from isthmus.core.profile import time_nodes
from isthmus.partitioner import CostModel, LinkModel, Problem, plan_split
from isthmus.partitioner.calibrate import Calibration, calibrate
from isthmus.partitioner.devices import CLOUD, CLOUD_DEVICE, EDGE_DEVICE, DeviceProfile
from isthmus.partitioner.measured import kernel_groups, node_times_from_kernels
from isthmus.partitioner.problem import Constraints
from isthmus.partitioner import threads


def _mlp():
    rng = np.random.default_rng(0)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (4, 32), name="x")
        h = x
        for i, w in enumerate((64, 48, 16)):
            W = ism.constant(rng.standard_normal((h.shape[1], w)).astype(np.float32))
            h = ism.relu(ism.bias_add(ism.matmul(h, W), ism.constant(np.ones(w, np.float32))), name=f"layer{i}")
        y = ism.add(h, 1.0, name="y")
    return g, x, y


def _cnn():
    rng = np.random.default_rng(1)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, 3, 16, 16), name="image")
        w1 = ism.constant(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3)
        h = ism.relu(ism.bias_add(ism.conv2d(x, w1, strides=2, padding="SAME"), ism.constant(np.zeros(8, np.float32))),
                     name="conv1")
        w2 = ism.constant(rng.standard_normal((8, 1, 3, 3)).astype(np.float32) * 0.3)
        h = ism.relu(ism.conv2d(h, w2, padding="SAME", groups=8), name="dw")
        h = ism.global_avg_pool(h)
        y = ism.matmul(h, ism.constant(rng.standard_normal((8, 4)).astype(np.float32)), name="logits")
    return g, x, y


def test_kernel_groups_name_what_the_session_runs_and_measured_times_add_up():
    g, x, y = _mlp()
    cm = CostModel.edge_cloud(LinkModel.parse("10mbps", "20ms"))
    groups = kernel_groups(cm, g, [y])
    # the fused layers: product + bias + activation, named after the activation
    assert [n.op for n in groups["layer0"]] == ["Relu", "BiasAdd", "MatMul"]
    sess = ism.Session(g, parallel=False, device="cpu")  # the CPU session the cost model prices
    xv = np.ones((4, 32), np.float32)
    ran = {n.name for n in time_nodes(sess, y, {x: xv}, repeats=1)}
    assert ran <= set(groups), ran - set(groups)
    kernels = {name: 1e-3 * (k + 1) for k, name in enumerate(sorted(ran))}
    times = node_times_from_kernels(cm, g, [y], kernels, EDGE_DEVICE, scale=8.0)
    assert sum(times.values()) == pytest.approx(8.0 * sum(kernels.values()))
    for name, members in groups.items():  # each kernel's time is shared within its own group only
        if name in kernels:
            assert sum(times[m.name] for m in members) == pytest.approx(8.0 * kernels[name])
    measured = CostModel(cm.profiles, cm.link, EDGE_DEVICE, node_times={EDGE_DEVICE: times})
    p = Problem(g, measured, [y], Constraints(edge_memory_budget=None))
    edge_only = p.breakdown(np.full(len(p.nodes), p.edge))
    assert edge_only.compute[EDGE_DEVICE] == pytest.approx(8.0 * sum(kernels.values()))
    # the cloud keeps the regression: nothing was measured there
    reg = Problem(g, cm, [y], Constraints(edge_memory_budget=None))
    cloud = np.full(len(p.nodes), 1 - p.edge)
    cloud[[i for i, n in enumerate(p.nodes) if n.op == "Placeholder"]] = p.edge
    assert p.breakdown(cloud).compute[CLOUD_DEVICE] == pytest.approx(reg.breakdown(cloud).compute[CLOUD_DEVICE])


def test_measured_times_are_validated():
    g, x, y = _mlp()
    cm = CostModel.edge_cloud()
    with pytest.raises(ValueError, match="not_a_kernel"):
        node_times_from_kernels(cm, g, [y], {"not_a_kernel": 1e-3})
    with pytest.raises(ValueError, match="layer0"):
        node_times_from_kernels(cm, g, [y], {"layer0": float("nan")})
    with pytest.raises(ValueError, match="no profile"):
        CostModel(cm.profiles, cm.link, EDGE_DEVICE, node_times={"/job:nowhere/task:0/device:CPU:0": {}})
    with pytest.raises(ValueError, match="finite"):
        CostModel(cm.profiles, cm.link, EDGE_DEVICE, node_times={EDGE_DEVICE: {"layer0": -1.0}})


def test_edge_interpreter_kernels_are_named_as_the_groups():
    """The split benchmark times the edge interpreter's kernels and maps them by their output names."""
    from isthmus.converters.edge_export import to_edge
    from isthmus.edge import Interpreter
    g, x, y = _cnn()
    cm = CostModel.edge_cloud()
    it = Interpreter(to_edge(g, [y]))
    names = {it.model.tensors[op.outputs[0]].name for op in it.model.operators}
    assert names <= set(kernel_groups(cm, g, [y])), names - set(kernel_groups(cm, g, [y]))


def test_the_calls_fixed_cost_is_paid_once_per_call_like_the_rtt():
    link = LinkModel.parse("8mbps", "20ms").with_call_cost(0.004)
    assert link.upload_time(1000) == pytest.approx(1000 * 8 / 8e6 + 0.012)
    assert link.with_uplink(16e6).call_s == 0.004 and "call 4 ms" in str(link)
    with pytest.raises(ValueError):
        LinkModel(1e6, 1e6, 0.01, -1.0)
    g, x, y = _mlp()
    cm = CostModel.edge_cloud(link)
    plan = plan_split(g, cm, outputs=[y], algorithm="cloud_only")
    assert plan.predict(link) == pytest.approx(plan.total)
    assert plan.predict(link.with_call_cost(0.0)) == pytest.approx(plan.total - 0.004)  # one call: up + down


def test_profiles_record_the_blas_threads_they_were_calibrated_with(tmp_path):
    before = threads.blas_threads()
    prof = calibrate("one", ["Add"], "quick", blas_threads=1, clock="cpu")
    assert prof.blas_threads == 1 and threads.blas_threads() == before  # restored after
    path = tmp_path / "p.json"
    prof.save(str(path))
    assert DeviceProfile.load(str(path)).blas_threads == 1
    d = json.loads(path.read_text())
    d["blas_threads"] = 0
    with pytest.raises(ValueError, match="blas_threads"):
        DeviceProfile.from_json(json.dumps(d))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert threads.check_threads(prof, threads=1)
        assert not threads.check_threads(prof, threads=2)
    assert len(w) == 1 and "calibrated with 1 BLAS thread" in str(w[0].message)
    assert threads.check_threads(CLOUD, threads=2)  # unknown: nothing to say
    with pytest.raises(ValueError, match="clock"):
        Calibration(["Add"], "quick", clock="sundial")


def test_blas_threads_option_and_env_var():
    before = threads.blas_threads()
    if before is None:
        pytest.skip("threadpoolctl finds no BLAS")
    try:
        assert threads.apply_env({threads.ENV: "1"}) == 1 and threads.blas_threads() == 1
        assert threads.apply_env({}) is None and threads.blas_threads() == 1  # unset: left as it is
        with pytest.raises(ValueError, match=threads.ENV):
            threads.apply_env({threads.ENV: "many"})
        with pytest.raises(ValueError, match=">= 1"):
            threads.set_blas_threads(0)
    finally:
        threads.set_blas_threads(before)
    assert threads.blas_threads() == before
    with threads.limited_blas_threads(1):
        assert threads.blas_threads() == 1
    assert threads.blas_threads() == before


def test_an_int8_models_quantize_steps_join_the_kernel_whose_tensor_they_convert():
    g, x, y = _mlp()
    cm = CostModel.edge_cloud()
    times = node_times_from_kernels(cm, g, [y], {"x/quant": 1e-4, "layer0": 1e-3, "y": 2e-5, "y/dequant": 3e-5})
    assert times["x"] == pytest.approx(1e-4)  # the placeholder: priced nothing by the model, so it takes it all
    assert times["y"] == pytest.approx(5e-5)
    assert sum(times.values()) == pytest.approx(1e-4 + 1e-3 + 5e-5)


def test_calibration_rounds_can_be_spread_in_slices():
    """run_cases times a slice of a round (the accuracy benchmark puts one before each held-out
    graph); samples() needs every case timed, and each case keeps its least disturbed time."""
    cal = Calibration(["Add", "Relu"], "quick")
    n = len(cal.built)
    assert n == 6
    with pytest.raises(RuntimeError, match="not every calibration case"):
        cal.samples()
    cal.run_cases(range(0, 4), budget_s=0.001)
    with pytest.raises(RuntimeError, match="not every calibration case"):
        cal.samples()
    cal.run_cases(range(4, n), budget_s=0.001)
    first = [s.seconds for s in cal.samples()]
    assert [s.op for s in cal.samples()] == ["Add"] * 3 + ["Relu"] * 3
    assert all(0 < t < 0.05 for t in first)
    cal.best[0] = 1e-12  # a faster earlier time is kept over any later one
    cal.run_round(budget_s=0.001)
    assert cal.samples()[0].seconds == 1e-12
    assert all(b <= a for a, b in zip(first[1:], [s.seconds for s in cal.samples()][1:]))
