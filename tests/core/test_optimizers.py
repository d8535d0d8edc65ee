"""Optimizers against their update equations written out in numpy, dense and sparse."""
import threading

import numpy as np
import pytest

import isthmus as ism
from isthmus import optimizers as opt

rng = np.random.default_rng(0)
W0 = rng.standard_normal((5, 3))
X = rng.standard_normal((4, 5))
IDX = np.array([1, 3, 1, 0], np.int32)  # a duplicate row: its gradients add up


def np_grad_dense(w):
    # loss = sum((X @ w)^2) / 2 -> dw = X^T (X w)
    return X.T @ (X @ w)


def np_grad_sparse(w):
    # loss = sum(gather(w, IDX)^2) / 2 -> rows of IDX get w[row] once per occurrence
    g = np.zeros_like(w)
    np.add.at(g, IDX, w[IDX])
    return g


class NpSGD:
    def __init__(self, lr): self.lr = lr
    def step(self, w, g, touched): w[touched] -= self.lr * g[touched]


class NpMomentum:
    def __init__(self, lr, m, nesterov):
        self.lr, self.m, self.nesterov, self.acc = lr, m, nesterov, None
    def step(self, w, g, touched):
        if self.acc is None:
            self.acc = np.zeros_like(w)
        a = self.acc
        a[touched] = self.m * a[touched] + g[touched]
        upd = g[touched] + self.m * a[touched] if self.nesterov else a[touched]
        w[touched] -= self.lr * upd


class NpAdam:
    def __init__(self, lr, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps, self.t, self.m, self.v = lr, b1, b2, eps, 0, None, None
    def step(self, w, g, touched):
        if self.m is None:
            self.m, self.v = np.zeros_like(w), np.zeros_like(w)
        self.t += 1
        lr_t = self.lr * np.sqrt(1 - self.b2 ** self.t) / (1 - self.b1 ** self.t)
        m, v = self.m, self.v
        m[touched] = self.b1 * m[touched] + (1 - self.b1) * g[touched]
        v[touched] = self.b2 * v[touched] + (1 - self.b2) * g[touched] ** 2
        w[touched] -= lr_t * m[touched] / (np.sqrt(v[touched]) + self.eps)


class NpAdagrad:
    def __init__(self, lr, init=0.1): self.lr, self.init, self.acc = lr, init, None
    def step(self, w, g, touched):
        if self.acc is None:
            self.acc = np.full_like(w, self.init)
        self.acc[touched] += g[touched] ** 2
        w[touched] -= self.lr * g[touched] / np.sqrt(self.acc[touched])


CASES = [
    ("sgd", lambda: opt.SGD(0.05), lambda: NpSGD(0.05)),
    ("momentum", lambda: opt.Momentum(0.05, 0.9), lambda: NpMomentum(0.05, 0.9, False)),
    ("nesterov", lambda: opt.Momentum(0.05, 0.9, nesterov=True), lambda: NpMomentum(0.05, 0.9, True)),
    ("adam", lambda: opt.Adam(0.05), lambda: NpAdam(0.05)),
    ("adagrad", lambda: opt.AdaGrad(0.05), lambda: NpAdagrad(0.05)),
]


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("name,make,make_ref", CASES, ids=[c[0] for c in CASES])
def test_three_steps_match_numpy(name, make, make_ref, sparse):
    g = ism.Graph()
    with g.as_default():
        w = ism.Variable(W0.copy(), name="w")
        if sparse:
            rows = ism.gather(w, ism.constant(IDX))
            loss = ism.reduce_sum(rows * rows) * 0.5
        else:
            h = ism.constant(X) @ w
            loss = ism.reduce_sum(h * h) * 0.5
        o = make()
        step = o.minimize(loss)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
    ref, wr = make_ref(), W0.copy()
    touched = np.unique(IDX) if sparse else slice(None)
    for _ in range(3):
        gr = np_grad_sparse(wr) if sparse else np_grad_dense(wr)
        sess.run(step)
        ref.step(wr, gr, touched)
    got = sess.run(w)
    np.testing.assert_allclose(got, wr, rtol=1e-12, atol=1e-12)
    if sparse:  # the untouched row is bit-identical
        np.testing.assert_array_equal(got[2], W0[2])
        np.testing.assert_array_equal(got[4], W0[4])


def test_slots_are_named_non_trainable_variables():
    g = ism.Graph()
    with g.as_default():
        w = ism.Variable(np.ones(3), name="w")
        o = opt.Adam(0.1)
        o.minimize(ism.reduce_sum(w * w))
    names = {v.node.name for v in ism.global_variables(g)}
    assert {"w/Adam/m", "w/Adam/v"} <= names
    assert [v.node.name for v in ism.trainable_variables(g)] == ["w"]
    assert o.get_slot(w, "m").node.name == "w/Adam/m"


def test_global_step_and_update_ops():
    g = ism.Graph()
    with g.as_default():
        w = ism.Variable(np.ones(2), name="w")
        counter = ism.Variable(np.zeros(()), name="counter", trainable=False)
        g.add_to_collection(opt.UPDATE_OPS, counter.assign_add(np.float64(1)).node)
        gs = opt.get_or_create_global_step()
        step = opt.SGD(0.1).minimize(ism.reduce_sum(w), global_step=gs)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
        for _ in range(4):
            sess.run(step)
        assert sess.run(gs) == 4 and sess.run(counter) == 4
        np.testing.assert_allclose(sess.run(w), [0.6, 0.6])


def test_concurrent_steps_lose_no_update():
    g = ism.Graph()
    with g.as_default():
        w = ism.Variable(np.zeros(4), name="w")
        step = opt.SGD(1.0).minimize(-ism.reduce_sum(w))  # each step adds exactly 1 to every entry
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
    threads = [threading.Thread(target=lambda: [sess.run(step) for _ in range(100)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    np.testing.assert_array_equal(sess.run(w), np.full(4, 400.0))


def test_no_gradient_is_a_clear_error():
    g = ism.Graph()
    with g.as_default():
        w = ism.Variable(np.ones(2), name="w")
        with pytest.raises(ism.GraphError, match="no variable has a gradient"):
            opt.SGD(0.1).minimize(ism.reduce_sum(ism.constant(np.ones(2))), var_list=[w])


def test_parallel_training_step_reads_weights_before_updating_them():
    """An input gradient reads a weight that another update changes in place: the optimizer
    makes every update wait for every gradient, so parallel and serial plans agree."""
    results = []
    xv = np.random.default_rng(5).standard_normal((8, 6))
    for parallel in (False, True):
        g = ism.Graph(seed=0)
        with g.as_default():
            x = ism.constant(xv)
            h = ism.tanh(x @ ism.Variable(np.full((6, 5), 0.3), name="w1"))
            out = h @ ism.Variable(np.full((5, 2), 0.2), name="w2")
            loss = ism.reduce_sum(out * out)
            step = opt.SGD(0.1).minimize(loss)
            sess = ism.Session(g, parallel=parallel)
            sess.run(ism.global_variables_initializer(g))
            results.append([float(sess.run([loss, step])[0]) for _ in range(3)])
    assert results[0] == results[1]
