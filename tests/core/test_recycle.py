"""recycle.Recycled and the kernels that write into it (Concat): a buffer comes back only when
nothing else holds it, so a fetched output, a view of one or a caller's reference is never
overwritten by a later run; results match numpy's concatenate."""
import threading

import numpy as np
import pytest

import isthmus as ism
from isthmus.core.ops import recycle
from isthmus.core.ops.recycle import Recycled


@pytest.fixture(autouse=True)
def keep_every_size(monkeypatch):
    """Small test arrays are recycled too (the lower bound is a speed choice, tested on its own)."""
    monkeypatch.setattr(recycle, "MIN_BYTES", 0)


def test_a_released_buffer_comes_back():
    r = Recycled()
    a = r.take((3, 4), np.float32)
    ida = id(a)
    del a
    b = r.take((3, 4), np.float32)
    assert id(b) == ida


def test_a_held_buffer_or_a_view_of_it_is_never_reused():
    r = Recycled()
    a = r.take((3, 4), np.float32)
    b = r.take((3, 4), np.float32)
    assert b is not a
    v = b[1:]  # only a view survives
    del b
    c = r.take((3, 4), np.float32)
    assert c.base is None and not np.shares_memory(c, v)


def test_small_buffers_are_not_kept(monkeypatch):
    monkeypatch.setattr(recycle, "MIN_BYTES", 1024)
    r = Recycled()
    a = r.take((255,), np.float32)
    assert a.shape == (255,) and not r._free
    b = r.take((256,), np.float32)
    assert r._free == [b]


def test_large_buffers_are_not_kept():
    r = Recycled()
    a = r.take((recycle.MAX_BYTES // 4 + 1,), np.float32)
    assert a.shape == (recycle.MAX_BYTES // 4 + 1,) and not r._free  # handed out, not kept
    b = r.take((recycle.MAX_BYTES // 4,), np.float32)
    assert len(r._free) == 1 and r._free[0] is b


def test_another_shape_or_dtype_gets_a_new_buffer():
    r = Recycled()
    a = r.take((3, 4), np.float32)
    del a
    assert r.take((4, 3), np.float32).shape == (4, 3)
    assert r.take((4, 3), np.float64).dtype == np.float64


def _concat_graph():
    g = ism.Graph(seed=0)
    with g.as_default():
        a = ism.placeholder("float32", (1, 3, 4, 4), name="a")
        b = ism.placeholder("float32", (1, 5, 4, 4), name="b")
        y = ism.concat([ism.relu(a), ism.relu(b)], axis=1)
        z = ism.reduce_sum(y * 2.0)
    return g, a, b, y, z


def test_fetched_concat_outputs_survive_later_runs():
    g, a, b, y, z = _concat_graph()
    sess = ism.Session(g)
    rng = np.random.default_rng(0)
    kept = []
    for _ in range(4):
        av, bv = rng.standard_normal((1, 3, 4, 4), np.float32), rng.standard_normal((1, 5, 4, 4), np.float32)
        out = sess.run(y, {a: av, b: bv})
        kept.append((out, np.concatenate([np.maximum(av, 0), np.maximum(bv, 0)], axis=1)))
    for got, want in kept:
        np.testing.assert_array_equal(got, want)
    assert len({id(g_) for g_, _ in kept}) == 4


def test_unfetched_concat_reuses_its_buffer_and_stays_right():
    g, a, b, y, z = _concat_graph()
    sess = ism.Session(g)
    rng = np.random.default_rng(1)
    for _ in range(5):
        av, bv = rng.standard_normal((1, 3, 4, 4), np.float32), rng.standard_normal((1, 5, 4, 4), np.float32)
        want = 2.0 * (np.maximum(av, 0).sum(dtype=np.float64) + np.maximum(bv, 0).sum(dtype=np.float64))
        np.testing.assert_allclose(sess.run(z, {a: av, b: bv}), want, rtol=1e-5)


def test_concurrent_runs_never_share_a_buffer():
    g, a, b, y, z = _concat_graph()
    sess = ism.Session(g)
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(50):
            av, bv = rng.standard_normal((1, 3, 4, 4), np.float32), rng.standard_normal((1, 5, 4, 4), np.float32)
            out = sess.run(y, {a: av, b: bv})
            want = np.concatenate([np.maximum(av, 0), np.maximum(bv, 0)], axis=1)
            if not np.array_equal(out, want):
                errors.append(seed)
    ts = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in ts)


def test_negative_axis_and_a_constant_operand():
    g = ism.Graph(seed=0)
    with g.as_default():
        a = ism.placeholder("float32", (2, 3), name="a")
        y = ism.concat([a, ism.constant(np.ones((2, 1), np.float32))], axis=-1)
    sess = ism.Session(g)
    for k in range(3):
        av = np.arange(6, dtype=np.float32).reshape(2, 3) + k
        np.testing.assert_array_equal(sess.run(y, {a: av}), np.concatenate([av, np.ones((2, 1), np.float32)], axis=-1))
