"""partition(): parts verify, one transfer per tensor per destination, and the parts run together
(one Session per part, one thread each, one shared rendezvous) give the unsplit graph's outputs."""
import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import isthmus as ism
from isthmus.partitioner.devices import CLOUD_DEVICE, EDGE_DEVICE
from isthmus.partitioner.partition import partition
from isthmus.partitioner.problem import PlacementError, needed_nodes, replicable, resolve_outputs

from .randgraph import build, feeds, recipes

GPU = "/job:cloud/task:0/device:GPU:0"
DEVICES = (EDGE_DEVICE, CLOUD_DEVICE, GPU)


def _check_transfers(g, P, placement, outs):
    """Exactly one transfer per (tensor, destination) that a node there (or the return) reads."""
    counts = Counter((t.tensor, t.dst) for t in P.transfers)
    assert all(c == 1 for c in counts.values()), counts
    keys = [t.key for t in P.transfers]
    assert len(set(keys)) == len(keys)
    want = set()
    for n in needed_nodes(outs):
        if replicable(n):
            continue
        d = placement[n.name]
        for k, t in enumerate(n.inputs):
            if not replicable(t.node) and placement[t.node.name] != d:
                want.add((t.name, d))
        for c in n.control_inputs:
            if not replicable(c) and placement[c.name] != d:
                want.add(("^" + c.name, d))
    for f in outs:
        if hasattr(f, "index") and not replicable(f.node) and placement[f.node.name] != EDGE_DEVICE:
            want.add((f.name, EDGE_DEVICE))
    assert set(counts) == want
    for t in P.transfers:
        assert t.key == f"{t.src};{t.dst};{t.tensor}"
        assert t.src != t.dst


@settings(max_examples=60, deadline=None, derandomize=True)
@given(recipes(max_nodes=12), st.lists(st.integers(0, 2), min_size=40, max_size=40), st.integers(1, 3))
def test_random_placements_give_the_unsplit_outputs(recipe, choice, n_out):
    g, phs, vals = build(recipe)
    placement = {n.name: DEVICES[choice[i % len(choice)]] for i, n in enumerate(g.nodes)}
    outs = list(dict.fromkeys(vals[-n_out:] + [vals[0]]))
    P = partition(g, placement, outs, return_to=EDGE_DEVICE)
    for part in P.parts.values():
        part.graph.verify()
        for n in part.graph.nodes:
            assert n.device == part.device
    _check_transfers(g, P, placement, resolve_outputs(g, outs))
    fd = feeds(phs)
    ref = ism.Session(g)
    with P.session(timeout=10) as s:
        for _ in range(2):  # a second step pairs with the second sends (and draws new random numbers)
            want = ref.run(outs, fd)
            got = s.run({p.node.name: v for p, v in fd.items()})
            for a, b in zip(got, want):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert not s.rendezvous.pending()
    assert set(P.parts[EDGE_DEVICE].outputs) == {t.name for t in outs}


def test_one_transfer_however_many_readers():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (3,), name="x")
        h = ism.tanh(x, name="h")
        ys = [ism.exp(h, name="e"), ism.relu(h, name="r"), ism.neg(h, name="n")]
        y = ism.add_n(ys, name="y")
    placement = {n.name: CLOUD_DEVICE for n in g.nodes}
    placement.update(x=EDGE_DEVICE, h=EDGE_DEVICE)
    P = partition(g, placement, [y], return_to=EDGE_DEVICE)
    assert [(t.tensor, t.dst) for t in P.transfers] == [("h:0", CLOUD_DEVICE), ("y:0", EDGE_DEVICE)]
    assert sum(n.op == "Recv" for n in P.parts[CLOUD_DEVICE].graph.nodes) == 1
    xv = np.array([0.1, -0.5, 2.0], np.float32)
    np.testing.assert_allclose(P.run({"x": xv})[0], ism.Session(g).run(y, {x: xv}), rtol=1e-6)


def test_constants_are_copied_not_sent():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (2, 2), name="x")
        w = ism.constant(np.eye(2, dtype=np.float32) * 2, name="w")
        a = ism.matmul(x, w, name="a")
        b = ism.matmul(a, w, name="b")
    P = partition(g, {"x": EDGE_DEVICE, "w": EDGE_DEVICE, "a": EDGE_DEVICE, "b": CLOUD_DEVICE}, [b])
    assert [t.tensor for t in P.transfers] == ["a:0"]
    assert "w" in P.parts[CLOUD_DEVICE].graph and "w" in P.parts[EDGE_DEVICE].graph


def test_variables_and_their_updates_run_split_over_steps():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (3,), name="x")
        v = ism.Variable(np.zeros(3, np.float32), name="v")
        feat = ism.tanh(x, name="feat")
        upd = v.assign_add(feat, name="upd")
        y = ism.mul(upd, 2.0, name="y")
        init = ism.global_variables_initializer()
    placement = {n.name: CLOUD_DEVICE for n in g.nodes}
    placement.update(x=EDGE_DEVICE, feat=EDGE_DEVICE, y=EDGE_DEVICE)
    ref = ism.Session(g)
    ref.run(init)
    P = partition(g, placement, [y], return_to=EDGE_DEVICE)
    assert "v" in P.parts[CLOUD_DEVICE].graph and "upd" in P.parts[CLOUD_DEVICE].graph
    xv = np.array([0.5, -1.0, 3.0], np.float32)
    with P.session(timeout=10) as s:
        cloud = s.sessions[CLOUD_DEVICE]
        cloud.set_variable_value(cloud.graph.node("v"), np.zeros(3, np.float32))
        for _ in range(3):
            got = s.run({"x": xv})[0]
            np.testing.assert_allclose(got, ref.run(y, {x: xv}), rtol=1e-6)


def test_update_apart_from_its_variable_is_refused():
    g = ism.Graph()
    with g.as_default():
        v = ism.Variable(np.zeros(2, np.float32), name="v")
        upd = v.assign_add(ism.constant(np.ones(2, np.float32)), name="upd")
    placement = {n.name: EDGE_DEVICE for n in g.nodes}
    placement["upd"] = CLOUD_DEVICE
    with pytest.raises(PlacementError, match="must share a device"):
        partition(g, placement, [upd])


def test_missing_placement_and_bad_device_are_named():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (2,), name="x")
        y = ism.tanh(x, name="y")
    with pytest.raises(PlacementError, match="'y'"):
        partition(g, {"x": EDGE_DEVICE}, [y])
    with pytest.raises(PlacementError, match="malformed"):
        partition(g, {"x": EDGE_DEVICE, "y": "cloud please"}, [y])


def test_a_failing_part_fails_the_step_fast_with_its_own_error():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (2,), name="x")
        y = ism.tanh(ism.relu(x, name="r"), name="y")
    P = partition(g, {"x": EDGE_DEVICE, "r": EDGE_DEVICE, "y": CLOUD_DEVICE}, [y], return_to=EDGE_DEVICE)
    t0 = time.perf_counter()
    with pytest.raises(ism.FeedError, match="'x'"):
        P.run({}, timeout=30)  # x not fed: the edge part fails, the cloud part must not wait 30 s
    assert time.perf_counter() - t0 < 5


def test_feeds_go_to_placeholders_only():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (2,), name="x")
        unused = ism.placeholder("float32", (2,), name="unused")
        h = ism.relu(x, name="h")
        y = ism.tanh(h, name="y")
    P = partition(g, {"x": EDGE_DEVICE, "h": EDGE_DEVICE, "y": CLOUD_DEVICE}, [y], return_to=EDGE_DEVICE)
    xv = np.ones(2, np.float32)
    assert np.allclose(P.run({"x": xv, "unused": xv})[0], np.tanh(1.0))  # unneeded, as Session allows
    with pytest.raises(KeyError, match="placeholders only"):
        P.run({"x": xv, "h": xv})
