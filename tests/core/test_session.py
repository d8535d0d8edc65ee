"""Session.run: fetch structures, feeds, pruning, plan caching, errors, threads."""
import threading

import numpy as np
import pytest

import isthmus as ism
from isthmus.core.errors import ExecutionError, FeedError, GraphError


@pytest.fixture()
def g():
    graph = ism.Graph(seed=1)
    with graph.as_default():
        yield graph


def test_fetch_structures(g):
    a = ism.constant(np.float32(2.0))
    b = a * 3.0
    sess = ism.Session(g)
    assert sess.run(b) == np.float32(6.0)
    assert sess.run([a, b]) == [2.0, 6.0]
    assert sess.run((a, [b])) == (2.0, [6.0])
    out = sess.run({"a": a, "nested": {"b": b}, "op": ism.no_op()})
    assert out == {"a": 2.0, "nested": {"b": 6.0}, "op": None}
    assert sess.run(b.name) == 6.0  # by name
    assert sess.run([]) == []


def test_feeds_and_errors_name_the_placeholder(g):
    x = ism.placeholder("float32", (None, 3), name="images")
    y = ism.relu(x)
    sess = ism.Session(g)
    np.testing.assert_array_equal(sess.run(y, {x: [[-1, 0, 2]]}), [[0, 0, 2]])  # lists convert
    with pytest.raises(FeedError, match="'images'.*must be fed"):
        sess.run(y)
    with pytest.raises(FeedError, match=r"'images' has shape \[2,4\]; expected \[\?,3\]"):
        sess.run(y, {x: np.zeros((2, 4), np.float32)})
    with pytest.raises(FeedError, match="'images' has dtype int32; expected float32"):
        sess.run(y, {x: np.zeros((2, 3), np.int32)})
    # float64 -> float32 is the same kind: allowed (sklearn data is float64)
    assert sess.run(y, {x: np.ones((1, 3))}).dtype == np.float32
    sess.run(y, {"images:0": np.ones((1, 3), np.float32)})


def test_fetch_from_another_graph_is_refused(g):
    other = ism.Graph()
    with other.as_default():
        c = ism.constant(1.0, name="elsewhere")
    with pytest.raises(GraphError, match="'elsewhere:0'.*another graph"):
        ism.Session(g).run(c)


@pytest.mark.cpu  # counts the CPU plan's node kinds
def test_pruning_runs_only_what_the_fetches_need(g):
    x = ism.placeholder("float32", (2,), name="x")
    v = ism.Variable(np.zeros(2, np.float32), name="v")
    bump = v.assign_add(np.ones(2, np.float32))  # not needed by y: must not run
    y = x * 2.0
    sess = ism.Session(g)
    sess.run(ism.global_variables_initializer())
    sess.run(y, {x: np.ones(2, np.float32)})
    np.testing.assert_array_equal(sess.run(v), [0, 0])
    plan = sess.plan_for(y, {x: None})
    assert {n.op for n in plan.nodes} == {"Mul", "Const"}
    # feeding an intermediate tensor cuts off its producers
    z = ism.relu(y)
    assert sess.run(z, {y: np.array([-1, 3], np.float32)}).tolist() == [0, 3]


def test_plan_compiled_once_per_signature(g):
    x = ism.placeholder("float32", (3,), name="x")
    y = ism.exp(x)
    sess = ism.Session(g)
    for _ in range(3):
        sess.run(y, {x: np.zeros(3, np.float32)})
    sess.run([y], {x: np.zeros(3, np.float32)})
    assert len(sess._plans) == 2


def test_runtime_error_names_node_and_op(g):
    x = ism.placeholder("int32", (None,), name="idx")
    params = ism.constant(np.arange(4, dtype=np.float32))
    y = ism.gather(params, x, name="lookup")
    sess = ism.Session(g)
    with pytest.raises(ExecutionError, match=r"node 'lookup' \(Gather\) failed: IndexError"):
        sess.run(y, {x: np.array([7], np.int32)})


def test_uninitialized_variable_error(g):
    v = ism.Variable(np.zeros(2, np.float32), name="weights")
    with pytest.raises(ExecutionError, match="variable 'weights' is not initialized"):
        ism.Session(g).run(v * 2.0)


def test_intermediates_are_freed_after_last_use(g):
    x = ism.placeholder("float32", (4,), name="x")
    h = ism.exp(x)
    y = ism.tanh(h)
    z = ism.relu(y)
    sess = ism.Session(g)
    src = sess.plan_for(z, {x: None}).source
    assert "del " in src  # h and y die once their consumers ran


def test_fetched_variable_is_a_copy(g):
    v = ism.Variable(np.zeros(2, np.float32), name="v")
    sess = ism.Session(g)
    sess.run(ism.global_variables_initializer())
    got = sess.run(v)
    sess.run(v.assign_add(np.ones(2, np.float32)))
    np.testing.assert_array_equal(got, [0, 0])  # the earlier fetch did not change under us


def test_concurrent_assign_add_never_loses_updates(g):
    v = ism.Variable(np.zeros((), np.float64), name="counter")
    inc = v.assign_add(np.float64(1.0))
    sess = ism.Session(g)
    sess.run(ism.global_variables_initializer())
    n_threads, n_steps = 4, 250
    errors = []

    def work():
        try:
            for _ in range(n_steps):
                sess.run(inc)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert sess.run(v) == n_threads * n_steps


def test_concurrent_runs_on_overlapping_subgraphs(g):
    x = ism.placeholder("float64", (50, 50), name="x")
    h = ism.tanh(x @ x)
    a = ism.exp(h)
    b = h * 2.0
    sess = ism.Session(g)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((50, 50)) * 0.1 for _ in range(8)]
    results = {}

    def work(i):
        fetch = a if i % 2 else b
        for _ in range(20):
            results[i] = sess.run(fetch, {x: inputs[i]})
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for i in range(8):
        hv = np.tanh(inputs[i] @ inputs[i])
        np.testing.assert_allclose(results[i], np.exp(hv) if i % 2 else hv * 2.0, rtol=1e-12)


def test_make_callable(g):
    x = ism.placeholder("float32", (2,), name="x")
    f = ism.Session(g).make_callable(x + 1.0, [x])
    np.testing.assert_array_equal(f(np.zeros(2, np.float32)), [1, 1])


def test_closed_session_refuses_to_run(g):
    c = ism.constant(1.0)
    with ism.Session(g) as s:
        s.run(c)
    with pytest.raises(RuntimeError, match="closed"):
        s.run(c)


def _branchy_graph():
    g = ism.Graph(seed=3)
    with g.as_default():
        x = ism.placeholder("float64", (64, 64), name="x")
        v = ism.Variable(np.ones((64, 64)), name="v")
        branches = [ism.tanh(x @ (x * float(i + 1)) + v) for i in range(4)]
        total = ism.add_n(branches)
        step = v.assign_add(np.full((64, 64), 0.5))
    return g, x, v, branches, total, step


@pytest.mark.cpu  # the CPU branch pool
@pytest.mark.parametrize("parallel", [False, True])
def test_parallel_and_serial_plans_agree(parallel):
    g, x, v, branches, total, step = _branchy_graph()
    sess = ism.Session(g, parallel=parallel)
    sess.run(ism.global_variables_initializer(g))
    xv = np.random.default_rng(0).standard_normal((64, 64)) * 0.1
    got = sess.run([total, branches[2]], {x: xv})
    want = [sum(np.tanh(xv @ (xv * (i + 1)) + 1.0) for i in range(4)), np.tanh(xv @ (xv * 3) + 1.0)]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
    assert sess.plan_for([total, branches[2]], {x: None}).parallel is parallel
    sess.run(step)
    np.testing.assert_array_equal(sess.run(v), np.full((64, 64), 1.5))


def test_parallel_plan_error_names_node():
    g = ism.Graph()
    with g.as_default():
        idx = ism.placeholder("int32", (None,), name="idx")
        big = ism.placeholder("float64", (64, 64), name="big")
        a = ism.tanh(big @ big)
        b = ism.gather(ism.constant(np.arange(3.0)), idx, name="bad_lookup")
    sess = ism.Session(g, parallel=True)
    with pytest.raises(ExecutionError, match="'bad_lookup'"):
        sess.run([a, b], {idx: np.array([5], np.int32), big: np.ones((64, 64))})


@pytest.mark.cpu  # the CPU branch pool
def test_auto_parallel_picks_wide_heavy_graphs_only(monkeypatch):
    from isthmus.core import scheduler
    monkeypatch.setattr(scheduler, "handoff_seconds", lambda: 20e-6)  # not this process's measurement
    g, x, v, branches, total, step = _branchy_graph()
    sess = ism.Session(g)
    assert not sess.plan_for(branches[0], {x: None}).parallel  # a chain: nothing to overlap
    with g.as_default():
        y = ism.placeholder("float32", (2048, 2048), name="y")
        wide = ism.add_n([ism.tanh(ism.exp(y * 2.0)), ism.exp(ism.sqrt(y * 3.0)), ism.sigmoid(ism.tanh(y * 4.0))])
        # the same width, but BLAS products (already on every core) dominate: threads would only contend
        blas = ism.add_n([ism.tanh(y @ (y * 2.0)), ism.exp(y @ (y * 3.0)), ism.sigmoid(y @ (y * 4.0))])
    assert sess.plan_for(wide, {y: None}).parallel
    assert not sess.plan_for(blas, {y: None}).parallel


def test_one_thread_trains_while_another_evaluates():
    g = ism.Graph()
    with g.as_default():
        w = ism.Variable(np.zeros(8), name="w")
        step = ism.optimizers.SGD(1.0).minimize(-ism.reduce_sum(w))  # each step adds exactly 1
        evaluation = ism.reduce_mean(w * 2.0)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
    seen, errors, done, started = [], [], threading.Event(), threading.Event()

    def train():
        try:
            started.wait(timeout=30)
            for _ in range(300):
                sess.run(step)
        except Exception as e:  # pragma: no cover
            errors.append(e)
        finally:
            done.set()

    def evaluate():
        try:
            while not done.is_set() or len(seen) < 3:
                seen.append(float(sess.run(evaluation)))
                started.set()
        except Exception as e:  # pragma: no cover
            errors.append(e)
    threads = [threading.Thread(target=train), threading.Thread(target=evaluate)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and seen
    assert all(b >= a for a, b in zip(seen, seen[1:]))  # evaluations never go backwards
    assert all(0 <= v <= 600 for v in seen)
    np.testing.assert_array_equal(sess.run(w), np.full(8, 300.0))
