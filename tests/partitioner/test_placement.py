"""Placement: mincut equals exhaustive on random DAGs; the objective agrees with what partition()
really sends; constraints (pins, unsupported ops, variables, inputs, memory budget) hold."""
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import isthmus as ism
from isthmus.partitioner.costmodel import CostModel
from isthmus.partitioner.devices import CLOUD, CLOUD_DEVICE, EDGE, EDGE_DEVICE
from isthmus.wire.link import LinkModel
from isthmus.partitioner.partition import partition
from isthmus.partitioner.placement import (cloud_only, edge_only, place_exhaustive, place_greedy, place_layer_split,
                                           place_mincut, solve_exhaustive, solve_greedy, solve_layer_split,
                                           solve_mincut, _cut)
from isthmus.partitioner.problem import TOKEN_BYTES, Constraints, PlacementError, Problem

from .randgraph import build, recipes

OP_TYPES = ("MatMul", "Tanh", "Relu", "Sigmoid", "Neg", "Exp", "Add", "Mul", "Sub", "Maximum")


@st.composite
def cost_models(draw):
    """Edge and cloud with random per-op speeds, over a random link (fast enough to make cuts pay)."""
    def profile(base, name):
        coeffs = {op: (draw(st.floats(1e-6, 1e-3)), draw(st.floats(0, 1e-9)), draw(st.floats(0, 1e-8)))
                  for op in draw(st.sets(st.sampled_from(OP_TYPES)))}
        # kernel_table=None: a hypothetical edge that runs every op (placement's algebra, not the edge's kernels)
        return replace(base, name=name, op_coeffs=coeffs, memory_budget=None, kernel_table=None)
    link = LinkModel(draw(st.floats(1e5, 1e9)), draw(st.floats(1e5, 1e9)), draw(st.floats(0, 2e-3)))
    return CostModel.edge_cloud(link, profile(EDGE.scaled(draw(st.floats(0.2, 20))), "edge"), profile(CLOUD, "cloud"))


@st.composite
def problems(draw, max_nodes=10):
    g, phs, vals = build(draw(recipes(max_nodes=max_nodes)))
    nodes = [n for n in g.nodes if n.op != "Const"]
    for n in nodes:  # some pins
        pin = draw(st.sampled_from([None] * 6 + ["/job:edge", "/job:cloud"]))
        if pin and n.op != "Placeholder":
            n.device = pin
    k = draw(st.integers(1, 3))
    outs = list(dict.fromkeys(vals[-k:]))
    c = Constraints(inputs_on=draw(st.sampled_from(["edge", None])),
                    outputs_to=draw(st.sampled_from(["edge", "cloud", None])), edge_memory_budget=None)
    return Problem(g, draw(cost_models()), outs, c)


def _partition_cost(p: Problem, placement) -> float:
    """The step latency counted from what partition() really builds."""
    devs = p.devices
    compute = sum(p.times[i, devs.index(placement[n.name])] for i, n in enumerate(p.nodes))
    ret = devs[p.return_to] if p.return_to is not None else None
    P = partition(p.graph, placement, p.outputs, return_to=ret)
    sent = 0.0
    for t in P.transfers:
        nbytes = TOKEN_BYTES if t.tensor.startswith("^") else p.cost.tensor_bytes(p.graph.tensor(t.tensor))
        sent += p.cost.transfer_time(nbytes, t.src, t.dst)
    return compute + sent


@settings(max_examples=150, deadline=None, derandomize=True)
@given(problems(max_nodes=12))
def test_mincut_equals_exhaustive(p):
    a = solve_mincut(p)
    b = solve_exhaustive(p)
    assert p.feasible(a)[0]
    ca, cb = p.total(a), p.total(b)
    assert ca == pytest.approx(cb, rel=1e-6, abs=1e-12)
    assert ca <= p.total(solve_greedy(p)) * (1 + 1e-6) + 1e-12
    assert ca <= p.total(solve_layer_split(p)) * (1 + 1e-6) + 1e-12


@settings(max_examples=40, deadline=None, derandomize=True)
@given(problems(max_nodes=10), st.lists(st.booleans(), min_size=24, max_size=24))
def test_the_objective_counts_what_partition_sends(p, bits):
    assign = np.array([int(bits[i % 24]) for i in range(len(p.nodes))])
    assign = np.where(p.allowed[np.arange(len(assign)), assign], assign, 1 - assign)
    assert p.total(assign) == pytest.approx(_partition_cost(p, p.placement(assign)), rel=1e-9)


def _mlp(batch=None, widths=(2048, 512, 64, 10)):
    g = ism.Graph()
    rng = np.random.default_rng(0)
    with g.as_default():
        x = ism.placeholder("float32", (batch, 784), name="x")
        h = x
        for i, width in enumerate(widths):
            w = ism.constant(rng.standard_normal((h.shape[1], width)).astype(np.float32) * 0.05, name=f"w{i}")
            h = ism.relu(ism.matmul(h, w, name=f"mm{i}"), name=f"act{i}")
        y = ism.exp(h, name="y")
    return g, x, y


def test_the_cut_moves_with_the_bandwidth():
    g, x, y = _mlp()
    place = {}
    for bw in (1e5, 1e7, 1e10):
        # an edge that runs every op (its Exp included; the real edge's table has no Exp kernel)
        cm = CostModel.edge_cloud(LinkModel(bw, bw, 0.0), edge=replace(EDGE, kernel_table=None), batch_size=32)
        place[bw] = place_mincut(g, cm, [y], Constraints(edge_memory_budget=None))
    assert all(d == EDGE_DEVICE for d in place[1e5].values())      # slow link: stay on the edge
    assert place[1e10]["mm0"] == CLOUD_DEVICE                      # fast link: ship the input
    assert place[1e7]["mm0"] == EDGE_DEVICE and place[1e7]["mm1"] == EDGE_DEVICE  # small tensors cross
    assert place[1e7]["mm2"] == CLOUD_DEVICE or place[1e7]["y"] == EDGE_DEVICE


def test_unsupported_ops_go_to_the_cloud_with_a_report():
    g, x, y = _mlp()
    edge = replace(EDGE, supported_ops=frozenset({"Placeholder", "MatMul", "Relu"}))
    cm = CostModel.edge_cloud(LinkModel(1e5, 1e5, 0.04), edge=edge)
    p = Problem(g, cm, [y])
    placement = place_mincut(p)
    assert placement["y"] == CLOUD_DEVICE
    assert [(f.node, f.devices) for f in p.forced] == [("y", (CLOUD_DEVICE,))]
    assert "Exp is not supported on edge" in p.forced[0].reason


def test_pins_inputs_and_variables():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (8, 8), name="x")
        v = ism.Variable(np.ones((8, 8), np.float32), name="v")
        with ism.device("/job:cloud"):
            h = ism.matmul(x, v, name="h")
        upd = v.assign_add(h, name="upd")
        y = ism.tanh(upd, name="y")
    fast = CostModel.edge_cloud(LinkModel(1e10, 1e10, 0.0), edge=EDGE.scaled(100))
    for place in (place_mincut, place_exhaustive, place_greedy, place_layer_split, edge_only, cloud_only):
        pl = place(g, fast, [y])
        assert pl["x"] == EDGE_DEVICE, place.__name__        # the data lives on the edge
        assert pl["h"] == CLOUD_DEVICE, place.__name__       # pinned
        assert pl["v"] == pl["upd"], place.__name__          # a variable and its update
    with pytest.raises(PlacementError, match="pinned"):
        bad = replace(CLOUD, supported_ops=frozenset({"Placeholder"}))
        Problem(g, CostModel.edge_cloud(edge=EDGE, cloud=bad), [y])


def test_memory_budget_is_respected():
    g, x, y = _mlp(batch=1)
    cm = CostModel.edge_cloud(LinkModel(1e5, 1e5, 0.04))
    free = Problem(g, cm, [y], Constraints(edge_memory_budget=None))
    assert free.edge_memory(solve_mincut(free))[0] > 4e6   # the slow link keeps all 3.3M weights on the edge
    tight = Problem(g, cm, [y], Constraints(edge_memory_budget=4e6))
    a = solve_mincut(tight)
    assert tight.feasible(a)[0] and tight.edge_memory(a)[0] <= 4e6
    assert tight.total(a) >= free.total(solve_mincut(free))
    assert tight.total(a) >= tight.total(solve_exhaustive(tight)) - 1e-12
    with pytest.raises(PlacementError, match="budget"):
        solve_mincut(Problem(g, cm, [y], Constraints(edge_memory_budget=100)))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(problems(max_nodes=9), st.floats(0, 1))
def test_mincut_under_a_binding_memory_budget_equals_exhaustive(p, f):
    """The budget binds (the unconstrained cut does not fit, the least-memory one does): mincut stays
    within it and is as good as the best of every placement within it."""
    free = _cut(p, 0.0)
    least = _cut(p, 1.0, time_weight=0.0)  # the placement of least edge memory
    m_free, m_least = p.edge_memory(free)[0], p.edge_memory(least)[0]
    assume(m_free > m_least)
    budget = m_least + f * (m_free - m_least) * 0.999
    q = Problem(p.graph, p.cost, p.outputs, replace(p.constraints, edge_memory_budget=budget))
    best = q.total(solve_exhaustive(q))
    for a in (solve_mincut(q), solve_mincut(q, exhaustive_up_to=0)):  # small graphs: exhaustive; forced: B&B
        assert q.feasible(a)[0] and q.edge_memory(a)[0] <= budget
        assert q.total(a) == pytest.approx(best, rel=1e-6, abs=1e-12)


def test_memory_budget_search_beats_the_lagrangian_price_alone():
    """A knapsack with a duality gap: running a (6 KB) on the edge saves 7 s, b and c (5 KB each)
    save 5 s each, and the edge has room for 10 KB. Every price on memory keeps either all three
    (too big) or a alone (saves 7 s); the best within the budget is b and c (saves 10 s)."""
    g = ism.Graph(seed=0)
    with g.as_default():
        xa = ism.placeholder("float32", (1500,), name="xa")
        xb = ism.placeholder("float32", (1250,), name="xb")
        xc = ism.placeholder("float32", (1250,), name="xc")
        outs = [ism.tanh(xa, name="a"), ism.sigmoid(xb, name="b"), ism.neg(xc, name="c")]
    edge = replace(CLOUD, name="edge", op_coeffs={"Tanh": (1.0, 0, 0), "Sigmoid": (1.0, 0, 0), "Neg": (1.0, 0, 0)})
    cloud = replace(CLOUD, op_coeffs={"Tanh": (8.0, 0, 0), "Sigmoid": (6.0, 0, 0), "Neg": (6.0, 0, 0)})
    cm = CostModel.edge_cloud(LinkModel(1e12, 1e12, 0.0), edge=edge, cloud=cloud)
    p = Problem(g, cm, outs, Constraints(edge_memory_budget=(6000 + 5000 + 5000) + 10000))
    pl = p.placement(solve_mincut(p, exhaustive_up_to=0))  # branch and bound, not the small-graph shortcut
    assert (pl["a"], pl["b"], pl["c"]) == (CLOUD_DEVICE, EDGE_DEVICE, EDGE_DEVICE)
    assert p.total(p.assignment(pl)) == pytest.approx(p.total(solve_exhaustive(p)), rel=1e-9)
    assert p.total(p.assignment(pl)) == pytest.approx(10.0, rel=1e-6)


def test_greedy_places_on_many_devices_and_the_parts_run():
    g, x, y = _mlp(batch=4)
    gpu = "/job:cloud/task:1/device:GPU:0"
    cm = CostModel({EDGE_DEVICE: EDGE, CLOUD_DEVICE: CLOUD, gpu: CLOUD.scaled(0.1, "gpu")},
                   LinkModel(1e9, 1e9, 1e-4))
    p = Problem(g, cm, [y])
    a = solve_greedy(p)
    assert p.feasible(a)[0]
    assert p.total(solve_exhaustive(p)) <= p.total(a) + 1e-12
    placement = p.placement(a)
    assert gpu in placement.values()
    xv = np.random.default_rng(1).standard_normal((4, 784)).astype(np.float32)
    got = partition(g, placement, [y], return_to=EDGE_DEVICE).run({"x": xv})[0]
    np.testing.assert_allclose(got, ism.Session(g).run(y, {x: xv}), rtol=1e-4)
    with pytest.raises(PlacementError, match="mincut"):
        solve_mincut(p)


def test_a_layer_split_is_optimal_on_a_chain():
    g, x, y = _mlp(batch=16, widths=(32, 1024, 1024, 10))
    for bw in (1e5, 3e6, 1e8, 1e10):
        p = Problem(g, CostModel.edge_cloud(LinkModel(bw, bw, 1e-3)), [y], Constraints(edge_memory_budget=None))
        assert p.total(solve_layer_split(p)) == pytest.approx(p.total(solve_mincut(p)), rel=1e-9)
