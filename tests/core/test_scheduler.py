"""The branch-parallelism rule (scheduler.BranchCosts) and the branch runner: when branches run
concurrently, and that they give the serial plan's bytes."""
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import isthmus as ism
from isthmus.core import scheduler, threads
from isthmus.core.errors import ExecutionError

pytestmark = pytest.mark.cpu  # the CPU's own kernels and threads (conftest.py)


@pytest.fixture
def two_cores(monkeypatch):
    """The rule's machine fixed: 2 cores, 20 us a hand-off (a server's), chunks of 4 MFLOP and 1 MiB
    (whatever this machine measures)."""
    monkeypatch.setattr(threads, "cores", lambda: 2)
    monkeypatch.setattr(scheduler, "handoff_seconds", lambda: 20e-6)
    monkeypatch.setattr(scheduler, "chunk_sizes", lambda: (4_000_000, 1 << 20))


def _costs(fetches, feeds=()):
    nodes = scheduler.runnable(ism.core.executor.prune([f.node for f in fetches], set(feeds)), set(feeds))
    return scheduler.BranchCosts(nodes, scheduler.graph_preds(nodes, set(feeds)))


def _block(x, c, seed):
    """An inception-shaped block: four independent branches of convolutions, concatenated."""
    rng = np.random.default_rng(seed)

    def conv(h, o, k):
        w = ism.constant((rng.standard_normal((o, h.shape[1], k, k)) * 0.2).astype(np.float32))
        return ism.relu(ism.conv2d(h, w, padding="SAME"))
    a = conv(x, c, 1)
    b = conv(conv(x, c // 2, 1), c, 3)
    d = conv(conv(conv(x, c // 2, 1), c, 3), c, 3)
    p = conv(ism.max_pool(x, 3, 1, "SAME"), c // 2, 1)
    return ism.concat([a, b, d, p], axis=1)


def _inception_graph(channels=16, size=16):
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, channels, size, size), name="x")
        y = _block(_block(x, 16, 1), 16, 2)
    return g, x, y


def test_independent_unsplit_branches_pay_and_chains_never(two_cores):
    g = ism.Graph()
    with g.as_default():
        y = ism.placeholder("float32", (1024, 1024), name="y")
        a, b = ism.tanh(ism.exp(y * 2.0)), ism.exp(ism.sqrt(y * 3.0))  # elementwise: nothing splits them
        chain = ism.tanh(ism.exp(ism.sqrt(y * 3.0)))
    wide = _costs([a + b], [y])
    assert wide.branches_pay(1, intra=2, workers=2)
    assert not wide.branches_pay(1, intra=2, workers=1)  # one pool thread: nothing runs beside another
    assert not _costs([chain], [y]).branches_pay(1, intra=1, workers=8)


def test_split_products_stay_serial_unless_one_intra_thread(two_cores):
    g = ism.Graph()
    with g.as_default():
        y = ism.placeholder("float32", (512, 512), name="y")
        two = (y @ (y * 2.0)) + (y @ (y * 3.0))  # 268 MFLOP each: intra-op threads split both
    c = _costs([two], [y])
    assert not c.branches_pay(1, intra=2, workers=2)  # each product on both cores already
    assert c.branches_pay(1, intra=1, workers=2)      # one thread each: the branches are the parallelism


def test_the_rule_follows_the_batch_and_the_hand_off(two_cores, monkeypatch):
    g, x, y = _inception_graph()
    c = _costs([y], [x])
    assert not c.branches_pay(1, intra=1, workers=2)   # batch 1: every node is worth less than a hand-off
    assert c.branches_pay(64, intra=1, workers=2)      # batch 64: the branches carry milliseconds
    monkeypatch.setattr(scheduler, "handoff_seconds", lambda: 0.05)  # a machine whose wake-ups take 50 ms
    assert not c.branches_pay(64, intra=1, workers=2)


def test_chunk_sizes_decide_whether_products_split(two_cores, monkeypatch):
    g = ism.Graph()
    with g.as_default():
        y = ism.placeholder("float32", (384, 384), name="y")
        two = (y @ (y * 2.0)) + (y @ (y * 3.0))  # 113 MFLOP each
    c = _costs([two], [y])
    assert not c.branches_pay(1, intra=2, workers=2)
    monkeypatch.setattr(scheduler, "chunk_sizes", lambda: (200_000_000, 1 << 20))  # too small to split here
    assert c.branches_pay(1, intra=2, workers=2)


def _ran_branches(sess, fetches, feed) -> bool:
    """Whether one run of `fetches` went through the branch runner."""
    calls = []
    real = scheduler.ParallelRunner.__call__

    def spy(self, *feeds, heavy=None):
        calls.append(heavy)
        return real(self, *feeds, heavy=heavy)
    scheduler.ParallelRunner.__call__ = spy
    try:
        sess.run(fetches, feed)
    finally:
        scheduler.ParallelRunner.__call__ = real
    return bool(calls)


def test_one_thread_sessions_and_processes_stay_on_one_thread(two_cores):
    g, big, a, b = _two_elementwise_branches()
    feed = {big: np.ones((1024, 1024), np.float32)}
    assert _ran_branches(ism.Session(g), [a, b], feed)
    assert not _ran_branches(ism.Session(g, intra_op_threads=1), [a, b], feed)  # one thread in all
    assert _ran_branches(ism.Session(g, intra_op_threads=1, inter_op_threads=2), [a, b], feed)  # as asked
    with threadpool_limits(1, user_api="blas"):  # a process limited to one BLAS thread
        assert not _ran_branches(ism.Session(g), [a, b], feed)


def _feed(batch):
    return np.random.default_rng(5).standard_normal((batch, 16, 16, 16)).astype(np.float32)


@pytest.mark.parametrize("batch", [1, 64])
def test_branches_give_the_serial_plans_bytes(two_cores, batch):
    g, x, y = _inception_graph()
    serial = ism.Session(g, parallel=False, intra_op_threads=1)
    branches = ism.Session(g, parallel=True, intra_op_threads=1)
    # chooses per run: serial at batch 1, branches at 64
    auto = ism.Session(g, intra_op_threads=1, inter_op_threads=2)
    xv = _feed(batch)
    want = serial.run(y, {x: xv})
    assert _ran_branches(auto, y, {x: xv}) == (batch > 1)
    for _ in range(3):  # deterministic: every run, every plan, the same bytes
        assert branches.run(y, {x: xv}).tobytes() == want.tobytes()
        assert auto.run(y, {x: xv}).tobytes() == want.tobytes()


def _two_elementwise_branches():
    g = ism.Graph()
    with g.as_default():
        big = ism.placeholder("float32", (None, 1024), name="big")
        a = ism.tanh(ism.exp(big * 2.0), name="a")
        b = ism.exp(ism.tanh(big * 3.0), name="b")
    return g, big, a, b


def test_auto_branch_runs_hold_one_intra_op_thread(two_cores, monkeypatch):
    g, big, a, b = _two_elementwise_branches()
    seen = []
    tanh = ism.core.registry.get("Tanh")
    real = tanh.kernel

    def kernel(node, ctx):
        run = real(node, ctx)

        def probe(v):
            seen.append(threads.intra_threads())
            return run(v)
        return probe
    monkeypatch.setattr(tanh, "kernel", kernel)
    sess = ism.Session(g, optimize=False)
    with threadpool_limits(2, user_api="blas"):
        sess.run([a, b], {big: np.ones((1, 1024), np.float32)})  # batch 1: serial, the process's threads
        assert seen == [2, 2]
        sess.run([a, b], {big: np.ones((1024, 1024), np.float32)})  # branches: one intra-op thread each
        assert seen[2:] == [1, 1]


def test_a_failing_branch_names_its_node(two_cores):
    g, big, a, b = _two_elementwise_branches()
    with g.as_default():
        idx = ism.placeholder("int32", (None,), name="idx")
        bad = ism.gather(b, idx, name="bad_lookup")
    sess = ism.Session(g)
    feed = {idx: np.array([5000], np.int32), big: np.ones((1024, 1024), np.float32)}
    assert sess.plan_for([a, bad], feed)._runner.choose(1024, 2) is not False
    with pytest.raises(ExecutionError, match="'bad_lookup'"):
        sess.run([a, bad], feed)


def test_bidirectional_lstm_directions_run_as_branches(two_cores):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from isthmus.converters import from_onnx
    rng = np.random.default_rng(0)
    units, feat, steps = 64, 32, 16
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.1).astype(np.float32), n) for n, s in
             (("W", (2, 4 * units, feat)), ("R", (2, 4 * units, units)), ("B", (2, 8 * units)))]
    m = helper.make_model(helper.make_graph(
        [helper.make_node("LSTM", ["x", "W", "R", "B"], ["", "h"], hidden_size=units, direction="bidirectional")],
        "bilstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, "N", feat])],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, "N", units])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    g, ins, outs = from_onnx(m.SerializeToString())
    xv = rng.standard_normal((steps, 64, feat)).astype(np.float32)
    feed = {ins["x"]: xv}
    plan = ism.Session(g).plan_for(outs[0], feed)
    seqs = [n for n in plan._runner.nodes if n.op == "LSTMSequence"]
    assert len(seqs) == 2  # one per direction, neither waiting for the other
    assert plan._runner.choose(64, 2) is not False
    want = ism.Session(g, parallel=False, intra_op_threads=1).run(outs[0], feed)
    assert ism.Session(g).run(outs[0], feed).tobytes() == want.tobytes()


def test_forced_branches_hand_off_by_the_runs_size(two_cores, monkeypatch):
    g, x, y = _inception_graph()
    sess = ism.Session(g, parallel=True, intra_op_threads=1)
    runner = sess.plan_for(y, {x: _feed(1)})._runner
    assert not any(runner.heavy_at(1)) and sum(runner.heavy_at(64)) >= 8
    seen = []
    real = type(runner).__call__
    monkeypatch.setattr(type(runner), "__call__", lambda self, *f, heavy=None: seen.append(heavy) or real(self, *f, heavy=heavy))
    sess.run(y, {x: _feed(64)})
    assert seen == [runner.heavy_at(64)]


def test_a_node_that_never_finishes_fails_the_run_naming_it(two_cores, monkeypatch):
    import time
    g = ism.Graph()
    with g.as_default():
        big = ism.placeholder("float32", (None, 1024), name="big")
    exp = ism.core.registry.get("Exp")
    real = exp.kernel

    def kernel(node, ctx):
        run = real(node, ctx)

        def slow(v):
            if node.name == "b":
                time.sleep(2.0)  # bounded: the pool thread is free again two seconds later
            return run(v)
        return slow
    monkeypatch.setattr(exp, "kernel", kernel)
    monkeypatch.setattr(scheduler, "NODE_WAIT_S", 0.3)
    with g.as_default():  # two nodes ready at once: both go to the pool, whatever the timing
        a, b = ism.exp(big, name="a"), ism.exp(big, name="b")
    sess = ism.Session(g, optimize=False, parallel=True, inter_op_threads=2)
    with pytest.raises(ExecutionError, match=r"within 0.3 s; still running: 'b' \(Exp\)"):
        sess.run([a, b], {big: np.ones((1024, 1024), np.float32)})
    time.sleep(2.0)  # let the pool thread finish before the next test


def test_a_chain_compiles_without_measuring_the_hand_off(monkeypatch):
    def measured():
        raise AssertionError("the hand-off was measured for a plan without branches")
    monkeypatch.setattr(scheduler, "handoff_seconds", measured)
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 64), name="x")
        y = ism.tanh(ism.exp(x * 2.0))
    sess = ism.Session(g)
    assert sess.plan_for(y, {x: None})._runner is None
    np.testing.assert_allclose(sess.run(y, {x: np.ones((2, 64), np.float32)}), np.tanh(np.exp(2.0)) * np.ones((2, 64)),
                               rtol=1e-6)
