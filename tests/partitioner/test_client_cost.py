"""The edge client's own cost (partitioner/client_cost.py) priced in every plan: edge-only,
cloud-only and split; fitted back from per-request samples; able to change the best plan."""
import numpy as np
import pytest

import isthmus as ism

from isthmus.partitioner.client_cost import ClientCost
from isthmus.partitioner.costmodel import CostModel
from isthmus.partitioner.devices import EDGE
from isthmus.partitioner.plan import AdaptivePlanner, plan_split
from isthmus.partitioner.problem import Constraints
from isthmus.wire.link import LinkModel


CC = ClientCost(request_s=1e-3, edge_part_s=2e-3, call_s=3e-3, byte_s=1e-8)


def _mlp():
    """x -> 3 x (MatMul, Relu) -> MatMul -> Softmax: every op on the edge's table, so edge-only is a plan;
    on an edge 64x slower than the cloud profile its first layer runs on the edge at ~0.1-7 Mbit/s."""
    g = ism.Graph(seed=0)
    rng = np.random.default_rng(0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 784), name="x")
        h = x
        for i, w in enumerate((128, 1024, 1024, 10)):
            wt = ism.constant((rng.standard_normal((h.shape[1], w)) * 0.05).astype(np.float32), name=f"w{i}")
            h = ism.matmul(h, wt, name=f"mm{i}")
            h = ism.relu(h, name=f"act{i}") if i < 3 else h
        y = ism.softmax(h, name="y")
    return g, x, y


def _parts(plan_placement, problem, edge):
    """(an op with work on the edge, remote calls) of a placement."""
    on_edge = [plan_placement[n.name] == edge for n in problem.nodes]
    return (any(e and n.op != "Placeholder" for e, n in zip(on_edge, problem.nodes)), int(not all(on_edge)))


def _split_link(g, y):
    """A link where the min cut (client cost zero) is a real split of _mlp: some nodes each side."""
    for bw in np.logspace(5, 9, 33):
        cm = CostModel.edge_cloud(LinkModel(bw, bw, 2e-3), edge=EDGE.scaled(8))
        plan = plan_split(g, cm, [y])
        where = set(plan.placement[n.name] for n in plan.problem.nodes if n.op != "Placeholder")
        if len(where) == 2:
            return cm, plan
    raise AssertionError("no bandwidth splits this graph")


def test_every_plan_pays_the_client_per_request_part_call_and_byte():
    g, x, y = _mlp()
    cm0, plan0 = _split_link(g, y)
    cm = CostModel(cm0.profiles, cm0.link, cm0.edge, client=CC)
    plan = plan_split(g, cm, [y], algorithm="layer_split")
    base = plan_split(g, cm0, [y], algorithm="layer_split")
    assert plan.placement == base.placement
    up = sum(m.nbytes for m in base.predicted.moves if m.src == cm.edge or m.dst == cm.edge)
    assert up > 0
    kinds = {}
    for name in ("edge_only", "cloud_only"):
        from isthmus.partitioner.plan import ALGORITHMS
        parts, calls = kinds[name] = _parts(plan.problem.placement(ALGORITHMS[name](plan.problem)), plan.problem,
                                            cm.edge)
        crossing = sum(m.nbytes for m in base.baselines[name].moves if cm.edge in (m.src, m.dst))
        want = base.baselines[name].total + CC.request_s + parts * CC.edge_part_s + calls * CC.call_s \
            + CC.byte_s * crossing
        assert plan.baselines[name].total == pytest.approx(want, rel=1e-9), name
    assert kinds == {"edge_only": (True, 0), "cloud_only": (False, 1)}
    split_edge = any(plan.placement[n.name] == cm.edge and n.op != "Placeholder" for n in plan.problem.nodes)
    want = base.total + CC.request_s + split_edge * CC.edge_part_s + CC.call_s + CC.byte_s * up
    assert plan.total == pytest.approx(want, rel=1e-9)
    assert plan.client_s == pytest.approx(CC.request_s + split_edge * CC.edge_part_s + CC.call_s)
    assert "client on edge" in plan.explain()
    # over another link the prediction keeps the client's terms (its per-byte one included)
    other = LinkModel(3e6, 3e6, 10e-3)
    again = plan_split(g, cm.with_link(other), [y], algorithm="layer_split")
    if again.placement == plan.placement:
        assert plan.predict(other) == pytest.approx(again.total, rel=1e-9)


def test_a_costly_call_makes_a_split_lose_to_running_on_the_edge():
    g, x, y = _mlp()
    cm0, plan0 = _split_link(g, y)
    split_total = plan0.total
    edge_only = plan0.baselines["edge_only"].total
    assert split_total < edge_only
    # a call that costs the client more than the split gains: the min cut's split loses to edge-only
    slow = CostModel(cm0.profiles, cm0.link, cm0.edge, client=ClientCost(call_s=2 * (edge_only - split_total)))
    plan = plan_split(g, slow, [y])
    assert all(d == slow.edge for d in plan.placement.values())
    assert plan.total == pytest.approx(edge_only, rel=1e-9)
    # and the adaptive planner prices the same way at every bandwidth
    ap = AdaptivePlanner(g, slow, [y], Constraints(), bandwidths=[cm0.link.up_bandwidth_bps])
    assert all(d == slow.edge for d in ap.plans[0].placement.values())


def test_the_fit_recovers_the_coefficients_from_per_request_samples():
    rng = np.random.default_rng(0)
    samples = []
    for k in range(60):
        edge_part, calls = [(True, 0), (True, 1), (False, 1)][k % 3]
        nbytes = 0 if calls == 0 else int(rng.integers(1_000, 200_000))
        y = CC.seconds(edge_part, calls, nbytes) * (1 + 0.01 * rng.standard_normal())
        samples.append(dict(client_s=y, edge_part=edge_part, calls=calls, nbytes=nbytes))
    fit = ClientCost.fit(samples)
    for k in ("request_s", "edge_part_s", "call_s", "byte_s"):
        assert getattr(fit, k) == pytest.approx(getattr(CC, k), rel=0.1), (k, fit)
    with pytest.raises(ValueError, match="sample 1: needs client_s"):
        ClientCost.fit([samples[0], dict(client_s=1.0)] + samples[2:5])
    with pytest.raises(ValueError, match="at least 4 samples"):
        ClientCost.fit(samples[:3])
    with pytest.raises(ValueError, match="call_s must be finite"):
        ClientCost(call_s=-1.0)
    assert CC.scaled(200).call_s == pytest.approx(0.6)


def test_a_large_per_call_cost_makes_the_planner_keep_the_model_on_the_edge():
    """At a link where the min cut splits _mlp (client free), a client that pays 1 s per remote call
    makes every plan with a cloud part lose: the plan is edge-only, priced as edge-only."""
    g, x, y = _mlp()
    cm0, plan0 = _split_link(g, y)
    costly = ClientCost(call_s=1.0)
    plan = plan_split(g, CostModel(cm0.profiles, cm0.link, cm0.edge, client=costly), [y])
    assert plan.placement != plan0.placement
    assert all(d == cm0.edge for d in plan.placement.values()), plan.placement
    assert plan.total == pytest.approx(plan.baselines["edge_only"].total, rel=1e-9)
    assert plan.total == pytest.approx(plan0.baselines["edge_only"].total, rel=1e-9)  # edge-only calls nothing
    assert plan.total < plan0.total + 1.0  # ... and beats the old split once that pays its call


def test_a_device_profile_carries_its_client_cost_through_json_and_scaling(tmp_path):
    import json
    from isthmus.partitioner.client_cost import HERE
    from isthmus.partitioner.devices import DeviceProfile
    p = DeviceProfile("e", client=CC)
    q = DeviceProfile.from_json(p.to_json())
    assert q.client == CC and DeviceProfile.from_json(DeviceProfile("e").to_json()).client is None
    assert p.scaled(4).client == CC.scaled(4) and CC.scaled(4).call_s == pytest.approx(4 * CC.call_s)
    assert ClientCost.from_dict(HERE.to_dict()) == HERE
    d = json.loads(p.to_json())
    d["client"]["call_s"] = -1.0
    with pytest.raises(ValueError, match="client.*call_s"):
        DeviceProfile.from_json(json.dumps(d))
    d["client"] = {"call_ms": 1.0}
    with pytest.raises(ValueError, match="client has unknown fields \\['call_ms'\\]"):
        DeviceProfile.from_json(json.dumps(d))
    d["client"] = {"call_s": "fast"}
    with pytest.raises(ValueError, match="client.call_s must be a number"):
        DeviceProfile.from_json(json.dumps(d))
