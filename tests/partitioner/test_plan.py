"""Split plans explain themselves; the adaptive choice picks the right precomputed plan."""
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import isthmus as ism
from isthmus.partitioner.costmodel import CostModel
from isthmus.partitioner.devices import EDGE
from isthmus.wire.link import LinkModel
from isthmus.partitioner.plan import AdaptivePlanner, plan_split
from isthmus.partitioner.problem import Constraints, Problem

from .test_placement import _mlp, problems


def test_explain_names_placement_parts_transfers_and_baselines():
    g, x, y = _mlp()
    edge = replace(EDGE, supported_ops=frozenset({"Placeholder", "MatMul", "Relu"}))
    cm = CostModel.edge_cloud(LinkModel.parse("5mbps", "40ms"), edge=edge, batch_size=8)
    plan = plan_split(g, cm, [y])
    text = plan.explain()
    for want in ("split plan (mincut)", "up 5 Mbit/s", "compute on edge", "transfer", "edge->cloud",
                 "edge_only", "cloud_only", "total", "'y' (Exp) only on cloud"):
        assert want in text, (want, text)
    assert plan.total <= min(b.total for b in plan.baselines.values()) + 1e-12
    xv = np.random.default_rng(0).standard_normal((8, 784)).astype(np.float32)
    np.testing.assert_allclose(plan.partition().run({"x": xv})[0], ism.Session(g).run(y, {x: xv}), rtol=1e-4)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(problems(max_nodes=10), st.floats(1e4, 1e10), st.floats(1e4, 1e10), st.floats(0, 0.2))
def test_predict_over_another_link_matches_a_fresh_evaluation(p, up, down, rtt):
    plan = plan_split(p.graph, p.cost, p.outputs, p.constraints, problem=p)
    assert plan.predicted.total == pytest.approx(_one_call_total(p, p.assignment(plan.placement)), rel=1e-9)
    link = LinkModel(up, down, rtt)
    q = Problem(p.graph, p.cost.with_link(link), p.outputs, p.constraints)
    assert plan.predict(link) == pytest.approx(_one_call_total(q, q.assignment(plan.placement)), rel=1e-9)


def _one_call_total(p, a):
    """The problem's objective (a half latency per tensor each way) less the half latencies of all
    but one tensor each way: the offload client sends a cut's tensors in one call."""
    edge = p.devices[p.edge]
    moves = p.breakdown(a).moves
    ups, downs = sum(m.src == edge for m in moves), sum(m.dst == edge for m in moves)
    return p.total(a) - (max(ups - 1, 0) + max(downs - 1, 0)) * p.cost.link.latency_s / 2


def test_a_cut_of_several_tensors_pays_one_round_trip():
    """Two tensors up, one down: the plan pays the latency once each way, the objective per tensor."""
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, 64), name="x")
        a, b = ism.relu(x, name="a"), ism.tanh(x, name="b")
        y = ism.add(ism.exp(a, name="ea"), ism.exp(b, name="eb"), name="y")
    cm = CostModel.edge_cloud(LinkModel(1e6, 1e6, 0.040, 0.002))
    p = Problem(g, cm, [y], Constraints(edge_memory_budget=None))
    placement = {"x": cm.edge, "a": cm.edge, "b": cm.edge, "ea": cm.cloud, "eb": cm.cloud, "y": cm.cloud}
    plan = plan_split(g, cm, [y], algorithm="exhaustive", problem=p)
    from isthmus.partitioner.plan import priced
    b, _ = priced(p, p.assignment(placement))
    per_tensor = p.total(p.assignment(placement))
    assert len([m for m in b.moves if m.src == cm.edge]) == 2
    assert b.total == pytest.approx(per_tensor - 0.042 / 2, rel=1e-12)  # one half latency fewer: one call
    assert plan.total <= b.total + 1e-12


def test_adaptive_choice_is_optimal_at_the_grid_and_never_worse_than_its_neighbours():
    g, x, y = _mlp(batch=16, widths=(32, 1024, 1024, 10))  # a bottleneck: the cut has three places to be
    cm = CostModel.edge_cloud(LinkModel(1e6, 0.5e6, 1e-3))
    c = Constraints(edge_memory_budget=None)
    ap = AdaptivePlanner(g, cm, [y], c, bandwidths=np.logspace(5, 10, 21))
    assert len(ap.distinct()) >= 3  # the cut moves as the link gets faster
    for bw in ap.bandwidths:
        link = cm.link.with_uplink(bw)
        fresh = plan_split(g, cm.with_link(link), [y], c)
        assert ap.choose(link).predict(link) == pytest.approx(fresh.total, rel=1e-9)
    for bw in np.logspace(5.1, 9.9, 13):
        link = LinkModel(bw, bw / 3, 0.05)
        chosen = ap.choose(link).predict(link)
        i = int(np.searchsorted(ap.bandwidths, bw))
        assert chosen <= min(ap.plans[i - 1].predict(link), ap.plans[i].predict(link)) + 1e-12


def test_pictures_are_svg_with_one_box_per_node_and_the_cut_in_red(tmp_path):
    import xml.etree.ElementTree as ET
    from isthmus.partitioner.plots import CUT, graph_svg, latency_series, latency_svg
    g, x, y = _mlp(batch=16, widths=(32, 1024, 1024, 10))
    cm = CostModel.edge_cloud(LinkModel.parse("20mbps", "1ms"))
    plan = plan_split(g, cm, [y])
    root = ET.fromstring(graph_svg(plan, str(tmp_path / "g.svg")))
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}g/{ns}rect")) == len(plan.problem.nodes)
    crossing = sum(plan.placement[plan.problem.nodes[f.producer].name] != plan.placement[plan.problem.nodes[c].name]
                   for f in plan.problem.flows for c in f.consumers)
    assert crossing > 0 and len([e for e in root.iter(f"{ns}line") if e.get("stroke") == CUT]) == crossing + 1
    ap = AdaptivePlanner(g, cm, [y], bandwidths=np.logspace(5, 9, 9))
    ET.fromstring(latency_svg(ap, str(tmp_path / "l.svg")))
    s = latency_series(ap)
    assert all(sp[1] <= min(e[1], c[1]) + 1e-12 for sp, e, c in zip(s["split"], s["edge_only"], s["cloud_only"]))


@pytest.mark.parametrize("algorithm", ["mincut", "greedy", "exhaustive", "layer_split", "edge_only", "cloud_only"])
def test_degenerate_graphs_inputs_and_constants_only(algorithm):
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (2,), name="x")
        c = ism.constant(np.ones(2, np.float32), name="c")
    plan = plan_split(g, CostModel.edge_cloud(), [x, c], algorithm=algorithm)
    assert plan.total == 0.0
    got = plan.partition().run({"x": np.full(2, 3.0, np.float32)})
    np.testing.assert_array_equal(got[0], [3.0, 3.0])
    np.testing.assert_array_equal(got[1], [1.0, 1.0])
