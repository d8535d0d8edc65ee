"""Device profiles, the link model, the cost model and calibration."""
import json

import numpy as np
import pytest

import isthmus as ism
from isthmus.partitioner.calibrate import calibrate, cases, errors, fit, fit_coeffs, measure, Sample
from isthmus.partitioner.costmodel import CostModel, op_cost
from isthmus.partitioner.devices import CLOUD, CLOUD_DEVICE, EDGE, EDGE_DEVICE, DeviceProfile
from isthmus.wire.link import LinkModel, parse_bandwidth, parse_duration


def test_link_model_parses_and_prices_transfers():
    link = LinkModel.parse("5mbps", "40ms")
    assert (link.up_bandwidth_bps, link.down_bandwidth_bps, link.rtt_s) == (5e6, 5e6, 0.04)
    assert link.upload_time(625_000) == pytest.approx(1.0 + 0.02)  # 5 Mbit in 1 s, plus half the round trip
    assert parse_bandwidth("0.1 Mbit/s") == pytest.approx(1e5) and parse_duration("250us") == pytest.approx(2.5e-4)
    assert link.with_uplink(10e6).down_bandwidth_bps == pytest.approx(10e6)
    with pytest.raises(ValueError, match="bandwidth"):
        parse_bandwidth("fast")
    with pytest.raises(ValueError):
        LinkModel(0, 1, 0)


def test_profiles_scale_and_round_trip_through_json(tmp_path):
    p = DeviceProfile("x", op_coeffs={"MatMul": (1e-6, 1e-11, 0.0)}, default_coeffs=(2e-6, 0.0, 1e-10),
                      supported_ops=frozenset({"MatMul", "Add"}), memory_budget=1e6)
    slow = p.scaled(8)
    assert slow.op_time("MatMul", 1e9, 0) == pytest.approx(8 * p.op_time("MatMul", 1e9, 0))
    assert slow.op_time("Tanh", 0, 1e6) == pytest.approx(8 * p.op_time("Tanh", 0, 1e6))  # default coefficients
    path = tmp_path / "x.json"
    slow.save(str(path))
    assert DeviceProfile.load(str(path)) == slow
    d = json.loads(path.read_text())
    d["bogus"] = 1
    with pytest.raises(ValueError, match="bogus"):
        DeviceProfile.from_json(json.dumps(d))
    assert EDGE.op_time("Add", 1e6, 0) == pytest.approx(8 * CLOUD.op_time("Add", 1e6, 0))


def test_unknown_dims_take_the_batch_size():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 100), name="x")
        y = ism.matmul(x, ism.constant(np.ones((100, 10), np.float32)), name="y")
    assert op_cost(y.node, batch_size=1).flops == 2 * 100 * 10
    cm = CostModel.edge_cloud(batch_size=32)
    assert cm.cost(y.node).flops == 32 * 2 * 100 * 10
    assert cm.tensor_bytes(x) == 32 * 100 * 4
    assert cm.node_time(y.node, EDGE_DEVICE) > cm.node_time(y.node, CLOUD_DEVICE) > 0
    assert cm.node_time(x.node, EDGE_DEVICE) == 0.0  # a placeholder costs nothing to run


def test_regression_recovers_known_coefficients():
    true = (3e-6, 2e-11, 5e-10)
    samples = [Sample("Op", "", f, b, true[0] + true[1] * f + true[2] * b)
               for f, b in [(1e3, 1e3), (1e6, 1e4), (1e8, 1e5), (1e4, 1e7), (1e9, 1e6)]]
    assert np.allclose(fit_coeffs(samples), true, rtol=1e-6)


def test_calibration_times_real_kernels(tmp_path):
    ops = ["Add", "Tanh", "MatMul", "LogicalAnd"]
    assert all(list(cases(op, "quick")) for op in ops)
    assert not list(cases("Variable", "quick"))
    samples = measure(ops, "quick", budget_s=0.005, rounds=1)
    assert {s.op for s in samples} == set(ops) | {"MatMul:vector", "MatMul:narrow", "MatMul:narrow_odd"} and all(s.seconds > 0 for s in samples)
    prof = fit(samples, "here")
    assert set(prof.op_coeffs) == set(ops) | {"MatMul:vector", "MatMul:narrow", "MatMul:narrow_odd"} and all(min(c) >= 0 for c in prof.op_coeffs.values())
    assert all(e < 1.0 for e in errors(prof, samples).values())  # fits its own data (loosely: CPUs are shared)
    path = tmp_path / "edge.json"
    edge = calibrate("edge", ["Add"], "quick", slowdown=8, path=str(path))
    assert DeviceProfile.load(str(path)) == edge and edge.name == "edge"


def test_calibration_times_the_cpu_whatever_isthmus_device_says(monkeypatch):
    """`isthmus server --device gpu` sets ISTHMUS_DEVICE for its process; the CPU calibration still
    times the CPU's kernels (it failed on the GPU's copy nodes: a KeyError on 'in0/to_GPU0')."""
    monkeypatch.setenv("ISTHMUS_DEVICE", "gpu")
    monkeypatch.setenv("ISTHMUS_GPU", "simulated")
    samples = measure(["Add", "MatMul"], "quick", budget_s=0.002, rounds=1)
    assert {"Add", "MatMul"} <= {s.op for s in samples} and all(s.seconds > 0 for s in samples)


def test_grouped_convolutions_have_their_own_cost_key():
    from isthmus.partitioner.costmodel import cost_key
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (1, 8, 16, 16), name="x")
        dw = ism.depthwise_conv2d(x, ism.constant(np.ones((8, 1, 3, 3), np.float32)), name="dw")
        pw = ism.conv2d(dw, ism.constant(np.ones((4, 8, 1, 1), np.float32)), name="pw")
    assert cost_key(dw.node) == "Conv2D:grouped" and cost_key(pw.node) == "Conv2D:pointwise"  # 1x1: one GEMM
    prof = DeviceProfile("p", op_coeffs={"Conv2D": (1e-3, 0.0, 0.0)}, default_coeffs=(1.0, 0.0, 0.0))
    assert prof.op_time("Conv2D:grouped", 0, 0) == prof.op_time("Conv2D", 0, 0) == 1e-3  # falls back to the op
    prof = DeviceProfile("p", op_coeffs={"Conv2D": (1e-3, 0.0, 0.0), "Conv2D:grouped": (5e-3, 0.0, 0.0)})
    cm = CostModel.edge_cloud(edge=prof, cloud=prof)
    assert cm.node_time(dw.node, EDGE_DEVICE) == 5e-3 and cm.node_time(pw.node, EDGE_DEVICE) == 1e-3


def test_the_cost_model_prices_the_graph_the_session_runs():
    """Nodes the passes fold or merge cost nothing; a product, its bias and activation become one
    fused kernel priced as its steps; an inference BatchNorm folded into the convolution costs a bias."""
    from isthmus.core.profile import time_nodes
    from isthmus.partitioner.executed import ABSORBED, FREE, RUNS
    from isthmus.partitioner.problem import Constraints, Problem
    rng = np.random.default_rng(0)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (2, 8), name="x")
        w = ism.mul(ism.constant(rng.standard_normal((8, 8)).astype(np.float32)), 2.0, name="w2")  # folded
        h = ism.relu(ism.bias_add(ism.matmul(x, w, name="mm"), ism.constant(np.ones(8, np.float32)), name="ba"),
                     name="act")
        t1, t2 = ism.tanh(h, name="t1"), ism.tanh(h, name="t2")  # one of them merged
        img = ism.reshape(ism.add(t1, t2, name="sum"), (2, 2, 2, 2), name="img")
        c = ism.conv2d(img, ism.constant(rng.standard_normal((3, 2, 1, 1)).astype(np.float32)), name="conv")
        k = [ism.constant(v.astype(np.float32)) for v in (np.ones(3), np.zeros(3), np.zeros(3), np.ones(3))]
        y = ism.relu6(ism.batch_norm(c, *k, name="bn"), name="y")
    prof = DeviceProfile("p", op_coeffs={op: (1e-3 * (i + 1), 0.0, 0.0) for i, op in enumerate(
        ["MatMul", "BiasAdd", "Relu", "Tanh", "Add", "Conv2D", "BatchNorm", "Relu6", "Mul", "Reshape"])})
    cm = CostModel.edge_cloud(edge=prof, cloud=prof)
    p = Problem(g, cm, [y], Constraints(edge_memory_budget=None))
    role = {n.name: p.roles.of(n) for n in p.nodes}
    t = {n.name: p.times[i, 0] for i, n in enumerate(p.nodes)}
    assert role["w2"] == FREE and t["w2"] == 0.0                       # constant folded
    assert sorted([role["t1"], role["t2"]]) == [FREE, RUNS]            # common subexpression
    assert (role["mm"], role["ba"], role["act"]) == (RUNS, ABSORBED, ABSORBED)
    assert (role["conv"], role["bn"], role["y"]) == (RUNS, ABSORBED, ABSORBED)
    assert t["bn"] == pytest.approx(prof.op_time("BiasAdd", 0, 0))     # a bias now, not a BatchNorm
    assert t["mm"] + t["ba"] + t["act"] == pytest.approx(sum(prof.op_coeffs[o][0] for o in ("MatMul", "BiasAdd", "Relu")))
    # what runs is what was priced: one kernel per priced node (fused kernels named after their last node)
    ran = time_nodes(ism.Session(g, parallel=False, device="cpu"), y, {x: np.ones((2, 8), np.float32)}, repeats=1)
    kernels = {n.name for n in ran}
    runs = {n.name for n in p.nodes if role[n.name] == RUNS and n.op != "Placeholder"}
    assert {n.op for n in ran} >= {"FusedMatMul", "FusedConv2D"}
    assert len(kernels) == len(runs) and kernels - runs <= {"act", "y"}
    # priced as written, every node costs its own op
    q = Problem(g, CostModel.edge_cloud(edge=prof, cloud=prof, passes=False), [y], Constraints(edge_memory_budget=None))
    assert all(q.times[i, 0] > 0 for i, n in enumerate(q.nodes) if n.op != "Placeholder")
    assert q.times[:, 0].sum() > p.times[:, 0].sum()


def test_one_row_and_few_row_products_have_their_own_cost_keys():
    from isthmus.partitioner.costmodel import cost_key
    g = ism.Graph()
    with g.as_default():
        w = ism.constant(np.ones((8, 4), np.float32))
        v = ism.matmul(ism.placeholder("float32", (1, 8)), w)
        few = ism.matmul(ism.placeholder("float32", (4, 8)), w)
        odd = ism.matmul(ism.placeholder("float32", (6, 8)), w)
        sixteen = ism.matmul(ism.placeholder("float32", (16, 8)), w)
        many = ism.matmul(ism.placeholder("float32", (64, 8)), w)
        batch = ism.matmul(ism.placeholder("float32", (None, 8)), w)
    assert [cost_key(t.node) for t in (v, few, odd, sixteen, many)] == [
        "MatMul:vector", "MatMul:narrow", "MatMul:narrow_odd", "MatMul:narrow", "MatMul"]
    assert cost_key(batch.node, batch_size=1) == "MatMul:vector" and cost_key(batch.node, 32) == "MatMul"


def test_a_2x2_max_pool_at_stride_2_has_its_own_cost_key_and_calibration_case():
    """The edge runs a 2x2 max pool at stride 2, unpadded, in one compiled pass, other windows one pass
    per tap: priced by the 3x3 fit, the fire-module calibration part's pools came out 15-20x over."""
    from isthmus.partitioner.costmodel import cost_key
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, 8, 16, 16), name="x")
        two = ism.max_pool(x, 2, 2, "VALID")
        three = ism.max_pool(x, 3, 2, "SAME")
        padded = ism.max_pool(ism.placeholder("float32", (1, 8, 15, 15), name="odd"), 2, 2, "SAME")
        avg = ism.avg_pool(x, 2, 2, "VALID")
    assert [cost_key(t.node) for t in (two, three, padded, avg)] == ["MaxPool:2x2", "MaxPool", "MaxPool", "AvgPool"]
    keys = [(tuple(a["ksize"]), tuple(a["strides"])) for a in _pool_case_attrs("MaxPool")]
    assert keys.count(((2, 2), (2, 2))) == keys.count(((3, 3), (2, 2))) == 3  # one of each per feature map
    # a profile without the key prices it as MaxPool (op_time falls back to the op)
    prof = DeviceProfile("p", op_coeffs={"MaxPool": (1e-6, 0.0, 0.0)})
    assert prof.op_time("MaxPool:2x2", 0, 0) == prof.op_time("MaxPool", 0, 0)


def test_a_wide_pooling_window_has_its_own_cost_key_and_calibration_cases():
    """The edge pools one pass per tap: an 8x8 window makes 64 passes of fixed work that the 3x3 fit's
    per-output price leaves out (two-tower's 8x8 AvgPool measured 1.8x its price in the model)."""
    from isthmus.partitioner.costmodel import WIDE_POOLS, cost_key
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, 3, 128, 128), name="x")
        eight = ism.avg_pool(x, 8, 8, "VALID")
        seven = ism.max_pool(x, 7, 7, "VALID")
        four = ism.avg_pool(x, 4, 4, "VALID")
    assert [cost_key(t.node) for t in (eight, seven, four)] == ["AvgPool:8x8", "MaxPool:7x7", "AvgPool"]
    for op in ("AvgPool", "MaxPool"):
        keys = [tuple(a["ksize"]) for a in _pool_case_attrs(op)]
        assert all(keys.count((k, k)) >= 4 for k in WIDE_POOLS)  # enough cases for a fit of its own
    # a profile without the key prices it as the op (op_time falls back), with it by its own fit
    prof = DeviceProfile("p", op_coeffs={"AvgPool": (1e-6, 0.0, 0.0), "AvgPool:8x8": (6e-5, 0.0, 0.0)})
    assert prof.op_time("AvgPool:8x8", 0, 0) == 6e-5 and prof.op_time("AvgPool:7x7", 0, 0) == 1e-6


def _pool_case_attrs(op):
    """The attributes of every calibration case of a pool op, built on its inputs' placeholders."""
    out = []
    for inputs, build in cases(op, "quick"):
        g = ism.Graph(seed=0)
        with g.as_default():
            phs = [ism.placeholder("float32", a.shape) for a in inputs]
            out.append(dict(build(g, phs).attrs))
    return out
