"""A plan none of whose nodes could use a second intra-op thread runs whole on one (one BLAS hold
per run instead of one per product), only at the sizes it was judged at and only by default."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core import executor

pytestmark = pytest.mark.cpu  # the CPU's own kernels and threads (conftest.py)


@pytest.fixture
def holds(monkeypatch):
    entered = []

    class Counting(executor.OneThreadRun):
        def __enter__(self):
            entered.append(1)
            return super().__enter__()
    monkeypatch.setattr(executor, "OneThreadRun", Counting)
    return entered


def _mlp():
    rng = np.random.default_rng(0)
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 640), name="x")
        w1, w2 = (rng.standard_normal((2, 640, 640)) / 25).astype(np.float32)
        h = ism.relu(ism.matmul(x, ism.constant(w1)))  # 2 x 640^2 flops a row: a product BLAS threads
        y = ism.matmul(h, ism.constant(w2))
    return g, x, y, w1, w2


def test_small_plan_runs_on_one_thread_at_unit_batch(holds):
    g, x, y, w1, w2 = _mlp()
    v = np.random.default_rng(1).standard_normal((1, 640)).astype(np.float32)
    sess = ism.Session(g)
    got = sess.run(y, {x: v})
    assert holds == [1]
    np.testing.assert_allclose(got, np.maximum(v @ w1, 0) @ w2, rtol=1e-5, atol=1e-5)
    big = np.random.default_rng(2).standard_normal((64, 640)).astype(np.float32)
    got = sess.run(y, {x: big})  # batch 64: the sizes judged no longer hold, the default threads run
    assert holds == [1]
    np.testing.assert_allclose(got, np.maximum(big @ w1, 0) @ w2, rtol=1e-4, atol=1e-4)


def test_a_sessions_own_thread_count_is_kept(holds):
    g, x, y, _, _ = _mlp()
    ism.Session(g, intra_op_threads=2).run(y, {x: np.ones((1, 640), np.float32)})
    assert holds == []  # the plan adds no block of its own: the session set its count


def test_plans_without_threaded_products_take_no_hold(holds):
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (16,), name="x")
        y = x + 1.0
    sess = ism.Session(g)
    assert sess.run(y, {x: np.zeros(16, np.float32)}).tolist() == [1.0] * 16
    assert holds == [] and sess.plan_for(y, {x: None})._serial_dims is None
