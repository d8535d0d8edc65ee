"""Whole programs split at random: a training step (gradients, variable updates) and loops."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.partitioner import CLOUD_DEVICE, EDGE_DEVICE, Constraints, CostModel, Problem, partition

DEVICES = (EDGE_DEVICE, CLOUD_DEVICE)


def _random_placement(g, outputs, rng):
    """A random placement that keeps what must stay together together (variables and their updates)."""
    p = Problem(g, CostModel.edge_cloud(), outputs, Constraints(inputs_on=None, edge_memory_budget=None))
    assign = rng.integers(0, 2, len(p.nodes))
    return p.placement(assign[p.group])


def _train_graph():
    rng = np.random.default_rng(0)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (8, 5), name="x")
        t = ism.placeholder("float32", (8, 3), name="t")
        w1 = ism.Variable(rng.standard_normal((5, 16)).astype(np.float32) * 0.3, name="w1")
        b1 = ism.Variable(np.zeros(16, np.float32), name="b1")
        w2 = ism.Variable(rng.standard_normal((16, 3)).astype(np.float32) * 0.3, name="w2")
        h = ism.tanh(ism.bias_add(ism.matmul(x, w1), b1), name="h")
        y = ism.matmul(h, w2, name="y")
        err = ism.sub(y, t, name="err")
        loss = ism.mul(err, err, name="loss")
        grads = ism.gradients(loss, [w1, b1, w2])
        step = ism.group(*[v.assign_sub(ism.mul(gv, 0.01)) for v, gv in zip((w1, b1, w2), grads)], name="step")
        init = ism.global_variables_initializer()
    return g, x, t, loss, step, init, (w1, b1, w2)


@pytest.mark.parametrize("seed", range(4))
def test_a_training_step_split_at_random_trains_like_the_unsplit_graph(seed):
    g, x, t, loss, step, init, ws = _train_graph()
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)
    ref = ism.Session(g)
    ref.run(init)
    placement = _random_placement(g, [loss, step], rng)
    P = partition(g, placement, [loss, step], return_to=EDGE_DEVICE)
    for part in P.parts.values():
        part.graph.verify()
    with P.session(timeout=10) as s:
        for v in ws:  # start from the unsplit session's initial values
            s.set_variable_value(v.node.name, ref.variable_value(v))
        for _ in range(3):
            got = s.run({"x": data[0], "t": data[1]})[0]
            want = ref.run([loss, step], {x: data[0], t: data[1]})[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_loops_and_conditionals_split_at_random():
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (4,), name="x")
        a = ism.tanh(x, name="a")
        i0 = ism.constant(0, name="i0")
        _, acc = ism.while_loop(lambda i, v: i < 5, lambda i, v: (i + 1, ism.tanh(v) + a), [i0, a], name="loop")
        flag = ism.placeholder("bool", (), name="flag")
        c = ism.cond(flag, lambda: ism.relu(acc), lambda: ism.neg(acc), name="branch")
        y = ism.add(c, a, name="y")
        dy = ism.gradients(y, [x])[0]
    xv = np.array([0.5, -1.0, 2.0, 0.1], np.float32)
    for seed in range(6):
        placement = _random_placement(g, [y, dy], np.random.default_rng(seed))
        with partition(g, placement, [y, dy], return_to=EDGE_DEVICE).session(timeout=10) as s:
            for f in (True, False):
                want = ism.Session(g).run([y, dy], {x: xv, flag: f})
                for u, v in zip(s.run({"x": xv, "flag": f}), want):
                    np.testing.assert_allclose(u, v, rtol=1e-5)


def test_a_small_convolutional_net_split_at_random():
    rng = np.random.default_rng(0)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (2, 3, 8, 8), name="x")
        h = ism.relu6(ism.conv2d(x, ism.constant(rng.standard_normal((8, 3, 3, 3)).astype(np.float32)), strides=2))
        d = ism.depthwise_conv2d(h, ism.constant(rng.standard_normal((8, 1, 3, 3)).astype(np.float32)))
        ones, zeros = np.ones(8, np.float32), np.zeros(8, np.float32)
        d = ism.batch_norm(d, ones, zeros, zeros, ones)
        h = ism.add(h, ism.max_pool(ism.relu(d), ksize=3, strides=1, padding="SAME"))
        y = ism.softmax(ism.matmul(ism.global_avg_pool(h), ism.constant(rng.standard_normal((8, 4)).astype(np.float32))),
                        name="y")
    xv = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    want = ism.Session(g).run(y, {x: xv})
    for seed in range(4):
        placement = _random_placement(g, [y], np.random.default_rng(seed))
        got = partition(g, placement, [y], return_to=EDGE_DEVICE).run({"x": xv}, timeout=10)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
