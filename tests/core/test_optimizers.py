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


# ---- the update ops themselves, fed directly -------------------------------------------------------
SPARSE_OPS = [
    # op, number of slots, slot initial value, scalars, numpy rule on (w, slots, g) rows
    ("SparseApplyGradientDescent", 0, 0.0, [0.1], None),
    ("SparseApplyMomentum", 1, 0.0, [0.1, 0.9], None),
    ("SparseApplyAdam", 2, 0.0, [0.1, 0.9, 0.999, 1e-8], None),
    ("SparseApplyAdagrad", 1, 0.1, [0.1], None),
]


def _np_rule(op, w, slots, g, sc, step):
    """One update of rows `w` (slots alike) with summed gradient rows `g`, in float64."""
    if op.endswith("GradientDescent"):
        w -= sc[0] * g
    elif op.endswith("Momentum"):
        slots[0][:] = sc[1] * slots[0] + g
        w -= sc[0] * slots[0]
    elif op.endswith("Adam"):
        lr, b1, b2, eps = sc
        t = step + 1
        slots[0][:] = b1 * slots[0] + (1 - b1) * g
        slots[1][:] = b2 * slots[1] + (1 - b2) * g * g
        w -= lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * slots[0] / (np.sqrt(slots[1]) + eps)
    else:
        slots[0][:] += g * g
        w -= sc[0] * g / np.sqrt(slots[0])


@pytest.mark.parametrize("op,n_slots,slot_init,scalars,_", SPARSE_OPS, ids=[o[0] for o in SPARSE_OPS])
def test_sparse_ops_sum_duplicates_and_leave_other_rows_bit_identical(op, n_slots, slot_init, scalars, _):
    from isthmus.core.ops.training import apply
    w0 = np.random.default_rng(3).standard_normal((6, 2))
    g = ism.Graph()
    with g.as_default():
        w = ism.Variable(w0.copy(), name="w")
        slots = [ism.Variable(np.full((6, 2), slot_init), name=f"s{i}", trainable=False) for i in range(n_slots)]
        vals = ism.placeholder("float64", (None, 2))
        idx = ism.placeholder("int64", (None,))
        sc = [ism.constant(s, dtype="float64") for s in scalars]
        if op.endswith("Adam"):
            step_var = ism.Variable(np.float64(0.0), name="step", trainable=False)
            sc.append(step_var)
        upd = apply(op, [w] + slots, sc, vals, indices=idx)
        after = [upd]
        if op.endswith("Adam"):
            with ism.control_dependencies([upd]):
                after.append(step_var.assign_add(np.float64(1.0)).node)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
    ref_w, ref_s = w0.copy(), [np.full((6, 2), slot_init) for _ in range(n_slots)]
    rng = np.random.default_rng(4)
    feeds = [np.array([4, 1, 4, 4]), np.array([-1, 5, 0]), np.array([2])]  # duplicates, a negative index
    for step, ids in enumerate(feeds):
        gv = rng.standard_normal((len(ids), 2))
        sess.run(after, {vals: gv, idx: ids})
        rows = np.unique(ids % 6)
        dense = np.zeros((6, 2))
        np.add.at(dense, ids % 6, gv)
        sub_w, sub_s = ref_w[rows], [s[rows] for s in ref_s]
        _np_rule(op, sub_w, sub_s, dense[rows], scalars, step)
        ref_w[rows] = sub_w
        for s, sub in zip(ref_s, sub_s):
            s[rows] = sub
    got = sess.run(w)
    np.testing.assert_allclose(got, ref_w, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got[3], w0[3])  # never named: bit-identical
    for s, want in zip(slots, ref_s):
        np.testing.assert_allclose(sess.run(s), want, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(sess.run(s)[3], np.full(2, slot_init))
    with pytest.raises(ism.ExecutionError, match=r"out of range \[0, 6\)"):
        sess.run(after, {vals: np.ones((1, 2)), idx: np.array([6])})


def test_float32_step_matches_float32_numpy():
    w0 = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    gv = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        w = ism.Variable(w0.copy(), name="w")
        grad = ism.placeholder("float32", (4, 3))
        step = opt.Momentum(0.05, 0.9).apply_gradients([(grad, w)])
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
    ref, acc = w0.copy(), np.zeros_like(w0)
    for _ in range(3):
        sess.run(step, {grad: gv})
        acc = np.float32(0.9) * acc + gv
        ref = ref - np.float32(0.05) * acc
    got = sess.run(w)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_learning_rate_may_be_a_tensor_of_another_dtype():
    g = ism.Graph()
    with g.as_default():
        w = ism.Variable(np.ones(3, np.float32), name="w")
        lr = ism.placeholder("float64", (), name="lr")
        step = opt.SGD(lr).minimize(ism.reduce_sum(w * w))
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
        sess.run(step, {lr: 0.25})
        np.testing.assert_allclose(sess.run(w), np.full(3, 0.5, np.float32))
        sess.run(step, {lr: 0.0})
        np.testing.assert_allclose(sess.run(w), np.full(3, 0.5, np.float32))


def test_slot_names_ignore_the_enclosing_scope_and_global_step_is_unique():
    g = ism.Graph()
    with g.as_default():
        w = ism.Variable(np.ones(2), name="w")
        with ism.name_scope("train"):
            o = opt.Momentum(0.1)
            gs = opt.get_or_create_global_step()
            o.minimize(ism.reduce_sum(w * w), global_step=gs)
        assert o.get_slot(w, "momentum").node.name == "w/Momentum/momentum"
        assert opt.get_or_create_global_step() is gs and opt.get_global_step(g) is gs
        assert gs.dtype == np.int64 and not gs.trainable
        assert [v.node.name for v in o.variables()] == ["w/Momentum/momentum"]


def test_dense_steps_allocate_nothing_the_size_of_the_variable():
    import tracemalloc
    shape = (784, 512)
    nbytes = 784 * 512 * 4
    g = ism.Graph()
    with g.as_default():
        w = ism.Variable(np.zeros(shape, np.float32), name="w")
        grad = ism.placeholder("float32", shape)
        steps = [o.apply_gradients([(grad, w)]) for o in
                 (opt.SGD(0.1), opt.Momentum(0.1, 0.9), opt.Momentum(0.1, 0.9, nesterov=True), opt.Adam(0.1),
                  opt.AdaGrad(0.1))]
        # the host's in-place steps, also when the suite runs with ISTHMUS_DEVICE=gpu (gpu_check.sh): a GPU
        # session copies the host gradient feed to the device each step (the variable's size, by design)
        sess = ism.Session(g, device="cpu")
        sess.run(ism.global_variables_initializer(g))
    gv = np.ones(shape, np.float32)
    for step in steps:
        sess.run(step, {grad: gv})  # the first run compiles the plan and allocates the scratch
        tracemalloc.start()
        try:
            sess.run(step, {grad: gv})
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < nbytes // 16, f"{step.name}: a step allocated {peak} bytes"


def test_bad_gradient_shape_names_the_variable():
    g = ism.Graph()
    with g.as_default():
        w = ism.Variable(np.ones((2, 3)), name="w")
        with pytest.raises(ism.ShapeError, match=r"gradient shape \[3,2\] does not match variable \[2,3\]"):
            opt.SGD(0.1).apply_gradients([(ism.constant(np.ones((3, 2))), w)])


# ---- concurrency -------------------------------------------------------------------------------------
def _hammer(fns, n_threads=4, n_steps=100):
    errors = []

    def work(fn):
        try:
            for _ in range(n_steps):
                fn()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(fns[i % len(fns)],)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread hangs (deadlock?)"
    assert not errors, errors


def test_concurrent_assign_add_loses_no_update():
    g = ism.Graph()
    with g.as_default():
        v = ism.Variable(np.zeros(3), name="v")
        inc = v.assign_add(np.ones(3))
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
    _hammer([lambda: sess.run(inc)])
    np.testing.assert_array_equal(sess.run(v), np.full(3, 400.0))


def test_concurrent_sparse_and_momentum_steps_lose_no_update():
    g = ism.Graph()
    with g.as_default():
        w = ism.Variable(np.zeros((5, 2)), name="w")
        rows = ism.gather(w, ism.constant(np.array([1, 3, 1])))
        sparse_step = opt.SGD(1.0).minimize(-ism.reduce_sum(rows))  # +2 on row 1, +1 on row 3
        u = ism.Variable(np.zeros(2), name="u")
        mom_step = opt.Momentum(1.0, momentum=0.0).minimize(-ism.reduce_sum(u), var_list=[u])  # +1 per step
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
    _hammer([lambda: sess.run(sparse_step), lambda: sess.run(mom_step)])
    want = np.zeros((5, 2))
    want[1], want[3] = 400.0, 200.0
    np.testing.assert_array_equal(sess.run(w), want)
    np.testing.assert_array_equal(sess.run(u), np.full(2, 200.0))


def test_two_optimizers_sharing_a_variable_do_not_deadlock():
    """Adam locks (w, w/Adam/m, w/Adam/v), Momentum (w, w/Momentum/momentum): one lock order."""
    g = ism.Graph()
    with g.as_default():
        w = ism.Variable(np.zeros(4), name="w")
        loss = ism.reduce_sum(w * w) + ism.reduce_sum(w)
        a = opt.Adam(0.01).minimize(loss)
        m = opt.Momentum(0.01).minimize(loss)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
    _hammer([lambda: sess.run(a), lambda: sess.run(m)], n_steps=50)
    assert np.all(np.isfinite(sess.run(w)))
