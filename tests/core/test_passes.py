"""Graph passes: each rewrite keeps results equal, verifies, and leaves state alone."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core.executor import prune
from isthmus.core.passes import optimize


def _rewrite(g, fetches, feeds=()):
    nodes = prune([f.node if isinstance(f, ism.Tensor) else f for f in fetches], set(feeds))
    rw = optimize(g, nodes, list(fetches), list(feeds))
    rw.graph.verify()
    return rw


def _same_results(g, fetches, feed):
    on = ism.Session(g).run(fetches, feed)
    off = ism.Session(g, optimize=False).run(fetches, feed)
    for a, b in zip(on, off):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_constant_folding_and_chain_folding():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (4,), name="x")
        c = ism.exp(ism.constant(np.ones(4, np.float32)))  # folds to a constant
        y = x
        for _ in range(10):
            y = y + 1.0
        z = (y * 2.0) * 3.0 - 5.0 + c
    rw = _rewrite(g, [z], [x])
    ops = [n.op for n in rw.graph.nodes if n.op not in ("Const", "Placeholder")]
    assert len(ops) <= 3, ops  # (x + 10) * 6 + (c - 5)
    assert rw.stats["folded"] >= 1 and rw.stats["simplified"] >= 10
    _same_results(g, [z], {x: np.arange(4, dtype=np.float32)})


def test_identity_arithmetic_is_removed():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (2, 3), name="x")
        y = ism.identity(x * 1.0 + 0.0)
        z = ism.tanh(y)
    rw = _rewrite(g, [z], [x])
    assert [n.op for n in rw.graph.nodes if n.op not in ("Const", "Placeholder")] == ["Tanh"]


def test_broadcasting_identity_is_not_removed():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (3,), name="x")
        y = x + ism.constant(np.zeros((2, 3), np.float32))  # broadcasts: changes the shape
    rw = _rewrite(g, [y], [x])
    assert any(n.op == "Add" for n in rw.graph.nodes)
    _same_results(g, [y], {x: np.ones(3, np.float32)})


def test_cse_merges_duplicates_but_not_stateful_ops():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (3,), name="x")
        a = ism.exp(x) + ism.exp(x)
        v = ism.Variable(np.zeros(3, np.float32), name="v")
        u1 = v.assign_add(np.ones(3, np.float32))
        u2 = v.assign_add(np.ones(3, np.float32))
    rw = _rewrite(g, [a, u1.node, u2.node], [x])
    assert sum(n.op == "Exp" for n in rw.graph.nodes) == 1
    assert sum(n.op == "AssignAdd" for n in rw.graph.nodes) == 2
    sess = ism.Session(g)
    sess.run(ism.global_variables_initializer(g))
    sess.run([a, u1.node, u2.node], {x: np.zeros(3, np.float32)})
    np.testing.assert_array_equal(sess.run(v), [2, 2, 2])


def test_fetched_and_fed_tensors_survive():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (3,), name="x")
        mid = ism.identity(x * 1.0, name="mid")
        out = ism.relu(mid)
    sess = ism.Session(g)
    got_mid, got_out = sess.run([mid, out], {x: np.array([-1, 0, 1], np.float32)})
    np.testing.assert_array_equal(got_mid, [-1, 0, 1])
    np.testing.assert_array_equal(sess.run(out, {mid: np.array([-2, 2, 3], np.float32)}), [0, 2, 3])


def test_transpose_of_transpose():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (2, 3, 4), name="x")
        y = ism.transpose(ism.transpose(x, (1, 0, 2)), (1, 0, 2))
        z = ism.tanh(y)
    rw = _rewrite(g, [z], [x])
    assert not any(n.op == "Transpose" for n in rw.graph.nodes)
    _same_results(g, [z], {x: np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)})


@pytest.mark.parametrize("act", ["relu", "tanh", "sigmoid", "relu6", None])
def test_matmul_bias_activation_fusion(act):
    g = ism.Graph()
    rng = np.random.default_rng(1)
    with g.as_default():
        x = ism.placeholder("float32", (None, 5), name="x")
        w = ism.Variable(rng.standard_normal((5, 4)).astype(np.float32), name="w")
        b = ism.Variable(rng.standard_normal(4).astype(np.float32), name="b")
        y = ism.bias_add(x @ w, b)
        if act:
            y = getattr(ism, act)(y)
        loss_like = y * 2.0
    rw = _rewrite(g, [loss_like], [x])
    fused = [n for n in rw.graph.nodes if n.op == "FusedMatMul"]
    assert len(fused) == 1 and fused[0].attrs["activation"] == (act or "none")
    sess = ism.Session(g, device="cpu")  # the second session shares the first's host state
    sess.run(ism.global_variables_initializer(g))
    xv = rng.standard_normal((3, 5)).astype(np.float32)
    on = sess.run(loss_like, {x: xv})
    off = ism.Session(g, optimize=False, device="cpu")
    off.state = sess.state
    off._ctx = sess._ctx
    np.testing.assert_allclose(on, off.run(loss_like, {x: xv}), rtol=1e-6)


def test_no_fusion_when_intermediate_is_used_elsewhere():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (2, 5), name="x")
        w = ism.constant(np.ones((5, 4), np.float32))
        b = ism.constant(np.ones(4, np.float32))
        h = x @ w
        y = ism.relu(ism.bias_add(h, b)) + ism.exp(h)
    rw = _rewrite(g, [y], [x])
    assert not any(n.op == "FusedMatMul" for n in rw.graph.nodes)


def test_session_can_switch_passes_off():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (2,), name="x")
        y = x + 1.0 + 1.0
    plan = ism.Session(g, optimize=False).plan_for(y, {x: None})
    assert sum(n.op == "Add" for n in plan.nodes) == 2
    plan = ism.Session(g).plan_for(y, {x: None})
    assert sum(n.op == "Add" for n in plan.nodes) == 1


def test_batch_norm_folds_into_matmul_weights():
    rng = np.random.default_rng(2)
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 6), name="x")
        w = ism.constant(rng.standard_normal((6, 4)).astype(np.float32))
        stats = [ism.constant(a.astype(np.float32)) for a in
                 (rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal(4), rng.uniform(0.5, 2, 4))]
        y = ism.relu(ism.batch_norm(x @ w, *stats, training=False, axis=-1))
    rw = _rewrite(g, [y], [x])
    ops = [n.op for n in rw.graph.nodes]
    assert "BatchNorm" not in ops and "FusedMatMul" in ops and rw.stats.get("bn_folded") == 1
    _same_results(g, [y], {x: rng.standard_normal((3, 6)).astype(np.float32)})


def test_freeze_turns_variables_into_constants_and_enables_bn_folding():
    rng = np.random.default_rng(4)
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 3), name="x")
        w = ism.Variable(rng.standard_normal((3, 2)).astype(np.float32), name="w")
        stats = [ism.Variable(a.astype(np.float32), name=f"s{i}") for i, a in
                 enumerate((np.ones(2), np.zeros(2), rng.standard_normal(2), rng.uniform(1, 2, 2)))]
        y = ism.batch_norm(x @ w, *stats, training=False, axis=-1, name="logits")
        step = w.assign_add(np.ones((3, 2), np.float32))
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
        sess.run(step)
    frozen = ism.core.passes.freeze(sess)
    assert not any(n.op in ("Variable", "AssignAdd", "Assign") for n in frozen.nodes)
    xv = rng.standard_normal((4, 3)).astype(np.float32)
    fs = ism.Session(frozen)
    np.testing.assert_allclose(fs.run("logits:0", {"x:0": xv}), sess.run(y, {x: xv}), rtol=1e-5)
    plan = fs.plan_for("logits:0", {"x:0": None})
    assert "BatchNorm" not in {n.op for n in plan.nodes}


def _controls(rw, name):
    (n,) = [m for m in rw.graph.nodes if m.name == name]
    return [c for c in n.control_inputs]


def test_fusion_keeps_control_edges_on_the_group_and_its_members():
    """A control edge on a fused group's last node waits for the fused node; one on a node the group
    would fold away keeps that node (no fusion) rather than being dropped."""
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (2, 3), name="x")
        w = ism.constant(np.arange(12, dtype=np.float32).reshape(3, 4) / 7)
        b = ism.constant(np.ones(4, np.float32))
        y = ism.relu(ism.bias_add(ism.matmul(x, w), b))            # fused, edge on its last node
        z = ism.bias_add(ism.matmul(x, w * 2.0), b)                # an edge on the BiasAdd: not folded
        u = ism.relu(z)
        with g.control_dependencies([y.node]):
            after_y = ism.identity(x, name="after_y")
        with g.control_dependencies([z.node]):
            after_z = ism.identity(x, name="after_z")
    rw = _rewrite(g, [y, u, after_y, after_z], [x])
    (cy,) = _controls(rw, "after_y")
    assert cy.op == "FusedMatMul" and cy.outputs[0] is rw.fetches[0]
    (cz,) = _controls(rw, "after_z")
    assert cz.op == "BiasAdd" and rw.fetches[1].node.inputs[0] is cz.outputs[0]
    _same_results(g, [y, u, after_y, after_z], {x: np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)})


def test_a_control_edge_on_a_simplified_node_waits_for_its_replacement():
    g = ism.Graph()
    with g.as_default():
        v = ism.Variable(np.ones(3, np.float32), name="v")
        r = v.assign_add(np.ones(3, np.float32)) * 1.0             # simplified to the AssignAdd's output
        with g.control_dependencies([r.node]):
            after = ism.identity(ism.constant(np.zeros(3, np.float32)), name="after")
    rw = _rewrite(g, [after, r])
    (c,) = _controls(rw, "after")
    assert c is rw.fetches[1].node and c.op == "AssignAdd"


def _fire(rng, x, squeeze, expand, name):
    """A SqueezeNet fire module with constant weights: 1x1 squeeze, then 1x1 and 3x3 expands, concatenated."""
    def conv(h, out, k):
        w = (rng.standard_normal((out, h.shape[1], k, k)) / np.sqrt(h.shape[1] * k * k)).astype(np.float32)
        b = (rng.standard_normal(out) * 0.1).astype(np.float32)
        return ism.relu(ism.bias_add(ism.conv2d(h, ism.constant(w), padding="SAME"), ism.constant(b), axis=1))
    with ism.name_scope(name):
        s = conv(x, squeeze, 1)
        return ism.concat([conv(s, expand, 1), conv(s, expand, 3)], axis=1)


def _ref_conv1x1_relu(x, w, b):
    y = np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.float64), x.astype(np.float64)) + b.reshape(1, -1, 1, 1)
    return np.maximum(y, 0)


def test_a_channel_concat_read_by_pools_and_1x1_convolutions_is_never_made():
    """Two fire modules with a max pool between: the pool moves before the first Concat, and both
    Concats, read only by 1x1 convolutions, are dropped (each reader sums its two parts' products).
    The session's result matches the unoptimized graph's and a float64 reference of the head."""
    from isthmus.core.passes import SESSION_PASSES
    rng = np.random.default_rng(31)
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 8, 12, 12), name="x")
        h = ism.max_pool(_fire(rng, x, 4, 6, "fire1"), 3, 2, "SAME")
        h = _fire(rng, h, 5, 7, "fire2")
        w = (rng.standard_normal((3, 14, 1, 1)) / 4).astype(np.float32)
        b = (rng.standard_normal(3) * 0.1).astype(np.float32)
        y = ism.relu(ism.bias_add(ism.conv2d(h, ism.constant(w)), ism.constant(b), axis=1))
    nodes = prune([y.node], {x})
    rw = optimize(g, nodes, [y], [x], SESSION_PASSES)
    rw.graph.verify()
    ops = [n.op for n in rw.graph.nodes]
    assert "Concat" not in ops and ops.count("MaxPool") == 2 and rw.stats.get("concat_split") == 2
    assert ops.count("FusedConv2DAdd") == 2  # fire2's squeeze and the head each sum two parts
    xv = rng.standard_normal((3, 8, 12, 12)).astype(np.float32)
    on = ism.Session(g).run(y, {x: xv})
    off = ism.Session(g, optimize=False).run(y, {x: xv})
    np.testing.assert_allclose(on, off, rtol=1e-5, atol=1e-6)
    hv = ism.Session(g, optimize=False).run(h, {x: xv})
    np.testing.assert_allclose(on, _ref_conv1x1_relu(hv, w, b), rtol=1e-5, atol=1e-6)


def test_a_concat_read_whole_or_fetched_stays():
    """A Concat read by a 3x3 convolution, by an Add, or fetched is made as before; the edge's passes
    (DEFAULT_PASSES) never split one."""
    from isthmus.core.passes import DEFAULT_PASSES, SESSION_PASSES
    rng = np.random.default_rng(32)
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (2, 8, 6, 6), name="x")
        cat = _fire(rng, x, 4, 6, "fire1")
        w3 = (rng.standard_normal((5, 12, 3, 3)) / 10).astype(np.float32)
        y3 = ism.relu(ism.bias_add(ism.conv2d(cat, ism.constant(w3), padding="SAME"), ism.constant(np.zeros(5, np.float32)), axis=1))
        cat2 = _fire(rng, x, 4, 6, "fire2")
        w1 = (rng.standard_normal((5, 12, 1, 1)) / 4).astype(np.float32)
        y1 = ism.relu(ism.bias_add(ism.conv2d(cat2, ism.constant(w1)), ism.constant(np.zeros(5, np.float32)), axis=1))
        both = y3 + y1
    for fetches, concats in (([both], 1), ([both, cat2], 2)):
        nodes = prune([f.node for f in fetches], {x})
        rw = optimize(g, nodes, fetches, [x], SESSION_PASSES)
        assert [n.op for n in rw.graph.nodes].count("Concat") == concats
        rw = optimize(g, nodes, fetches, [x], DEFAULT_PASSES)
        assert [n.op for n in rw.graph.nodes].count("Concat") == 2
    _same_results(g, [both, cat2], {x: rng.standard_normal((2, 8, 6, 6)).astype(np.float32)})
