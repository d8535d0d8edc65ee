"""Thread choice by cost: the hand-off measured once per process sizes the chunks, BLAS threads
products by their FLOPs, and a batch-1 run's one thread stays its own thread's."""
import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import isthmus as ism
from isthmus.core import idle
from isthmus.core import threads
from isthmus.core.ops import intra_op

pytestmark = pytest.mark.cpu  # the CPU's own kernels and threads (conftest.py)


def _need_openblas():
    if not any(i["user_api"] == "blas" and i["internal_api"] == "openblas" for i in threadpool_info()):
        pytest.skip("no OpenBLAS loaded")


def test_handoff_is_measured_once_per_process(monkeypatch):
    calls = []
    real = threads._measure_handoff
    monkeypatch.setattr(threads, "_handoff", [None])
    monkeypatch.delenv("ISTHMUS_HANDOFF_US", raising=False)
    monkeypatch.setattr(threads, "_measure_handoff", lambda: calls.append(1) or real(pings=3, gap_s=1e-4))
    first = threads.handoff_s()
    assert 0 < first < 1.0 and calls == [1]
    assert threads.handoff_s() == first and calls == [1]  # cached
    assert threads.chunk_scale() == max(1.0, first / threads.HANDOFF_REF_S)


def test_the_environment_sets_the_handoff(monkeypatch):
    monkeypatch.setattr(threads, "_handoff", [None])
    monkeypatch.setenv("ISTHMUS_HANDOFF_US", "40")
    monkeypatch.setattr(threads, "_measure_handoff", lambda: pytest.fail("measured despite the variable"))
    assert threads.handoff_s() == pytest.approx(40e-6)
    assert threads.min_chunk_flops() == 4 * threads.MIN_CHUNK_FLOPS


def test_one_thread_runs_never_measure(monkeypatch):
    monkeypatch.setattr(threads, "_handoff", [None])
    monkeypatch.setattr(threads, "_measure_handoff", lambda: pytest.fail("measured at one thread"))
    with threads.IntraOpThreads(1):
        assert threads.fan_out(lambda lo, hi: None, 64, 1 << 40) == 1
        intra_op.sum_of_parts(lambda j, dst: dst.fill(j), 4, (2,), np.float32, 1 << 40)


@pytest.mark.parametrize("handoff_us,chunks", [(10, 2), (80, 2), (90, 1)])
def test_products_split_only_into_parts_worth_the_handoff(monkeypatch, handoff_us, chunks):
    """A 32x1024x1024 product (67 MFLOP) splits in two at a hand-off of up to 83 us, not at 90 (parts of
    4 MFLOP x handoff / 10 us at least); every part, and the product left whole, runs on one BLAS
    thread, and the bytes are those of numpy's one-thread product of the same part."""
    _need_openblas()
    monkeypatch.setattr(threads, "_handoff", [handoff_us * 1e-6])
    monkeypatch.setattr(threads, "_prange", [False])  # the pool's path (the prange path: test_par_rows)
    monkeypatch.setattr(idle, "_load", [True, float("inf")])  # an idle machine, never read again
    counts, blas_seen = [], []
    real = intra_op.fan_out

    def counting(fn, *args, **kw):
        def spy(lo, hi):
            blas_seen.append(threads.blas_threads_now())
            fn(lo, hi)
        counts.append(real(spy, *args, **kw))
        return counts[-1]
    monkeypatch.setattr(intra_op, "fan_out", counting)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((32, 1024)).astype(np.float32)
    b = rng.standard_normal((1024, 1024)).astype(np.float32)
    with threadpool_limits(2, user_api="blas"), threads.IntraOpThreads(2):
        got = intra_op.matmul(np, a, b)
        assert threads.blas_threads_now() == 2
    assert counts == [chunks] and blas_seen == [1] * chunks
    with threadpool_limits(1, user_api="blas"):
        want = np.concatenate([a @ b[:, :512], a @ b[:, 512:]], axis=1) if chunks == 2 else a @ b
    assert got.tobytes() == want.tobytes()


def _unit_batch_mlp():
    rng = np.random.default_rng(0)
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 640), name="x")
        w1, w2 = (rng.standard_normal((2, 640, 640)) / 25).astype(np.float32)
        y = ism.matmul(ism.relu(ism.matmul(x, ism.constant(w1))), ism.constant(w2))
    return g, x, y


def test_a_unit_batch_run_keeps_its_one_thread_to_itself(monkeypatch):
    """Plan.__call__'s one-thread run (a batch-1 plan of small nodes) sets intra_threads() to 1 on
    its own thread only: a concurrent run on another thread still sees the default count, so it
    splits its passes as it would alone (the same chunks, the same bytes), and BLAS's count is
    back when both end. What the other thread does see is BLAS's process-wide count held to one:
    its products run one-threaded meanwhile (their bytes: a one-thread product's)."""
    _need_openblas()
    monkeypatch.setattr(threads, "_handoff", [threads.HANDOFF_REF_S])
    g, x, y = _unit_batch_mlp()
    sess = ism.Session(g)
    v = np.random.default_rng(1).standard_normal((1, 640)).astype(np.float32)
    inside, entered, release = [], threading.Event(), threading.Event()
    real_call = sess.plan_for(y, {x: v}).__class__._call

    def slow_call(plan, feeds):  # the unit-batch run, held open while the other thread works
        inside.append(threads.intra_threads())
        entered.set()
        release.wait(10)
        return real_call(plan, feeds)
    monkeypatch.setattr(sess.plan_for(y, {x: v}).__class__, "_call", slow_call)
    with threadpool_limits(2, user_api="blas"):
        box = []
        t = threading.Thread(target=lambda: box.append(sess.run(y, {x: v})))
        t.start()
        try:
            assert entered.wait(10)
            other = [threads.intra_threads(), threads.blas_threads_now()]
            chunks = []
            other.append(threads.fan_out(lambda lo, hi: chunks.append((lo, hi)), 64, 1 << 30))
        finally:
            release.set()
            t.join(10)
        assert not t.is_alive()
        assert inside == [1] and other == [2, 1, 2] and sorted(chunks) == [(0, 32), (32, 64)]
        assert threads.blas_threads_now() == 2 and threads.intra_threads() == 2
    with threadpool_limits(1, user_api="blas"):
        want = ism.Session(g, intra_op_threads=1).run(y, {x: v})
    assert box[0].tobytes() == want.tobytes()


def _probed_product(monkeypatch, rows):
    """A graph y = neg(x @ w) (x [rows, 512], w [512, 512]) whose Neg records (BLAS's count,
    intra_threads()) as it runs."""
    from isthmus.core import registry
    seen = []

    def kernel(node, ctx):
        def run(v):
            seen.append((threads.blas_threads_now(), threads.intra_threads()))
            return -v
        return run
    monkeypatch.setattr(registry.get("Neg"), "kernel", kernel)
    rng = np.random.default_rng(4)
    w = rng.standard_normal((512, 512)).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (rows, 512), name="x")
        y = ism.neg(ism.matmul(x, ism.constant(w)), name="y")
    return g, x, y, w, seen


def test_default_runs_with_products_hold_blas_to_one_thread(monkeypatch):
    """A default-thread run of a plan with a product BLAS would thread runs with BLAS on one
    thread throughout (its splits still see the default count), and BLAS's count is back after."""
    _need_openblas()
    monkeypatch.setattr(threads, "_handoff", [threads.HANDOFF_REF_S])
    g, x, y, w, seen = _probed_product(monkeypatch, 64)
    v = np.random.default_rng(5).standard_normal((64, 512)).astype(np.float32)
    with threadpool_limits(2, user_api="blas"):
        got = ism.Session(g, inter_op_threads=1).run(y, {x: v})
        assert threads.blas_threads_now() == 2
        monkeypatch.setattr(threads, "_prange", [False])  # no prange here: a session's own count, no hold
        monkeypatch.setattr(idle, "_load", [True, float("inf")])  # an idle machine, never read again
        ism.Session(g, intra_op_threads=2, inter_op_threads=1).run(y, {x: v})
        # where kernels may split by prange, a session's own count holds BLAS too (threads.prange_may_run)
        monkeypatch.setattr(threads, "_prange", [threads.HANDOFF_REF_S])
        monkeypatch.setattr(idle, "_load", [True, float("inf")])  # an idle machine, never read again
        monkeypatch.setattr(threads, "_prange_at", [0.0])
        ism.Session(g, intra_op_threads=2, inter_op_threads=1).run(y, {x: v})
        assert threads.blas_threads_now() == 2
    assert seen == [(1, 2), (2, 2), (1, 2)]
    np.testing.assert_allclose(got, -(v.astype(np.float64) @ w), rtol=1e-4, atol=1e-3)


def test_runs_without_blas_work_take_no_hold(monkeypatch):
    _need_openblas()
    g, x, y, _, seen = _probed_product(monkeypatch, 1)
    with g.as_default():
        z = ism.neg(x, name="z")   # the Neg alone: a plan with no product
    with threadpool_limits(2, user_api="blas"):
        ism.Session(g, inter_op_threads=1).run(z, {x: np.ones((1, 512), np.float32)})
    assert seen == [(2, 2)]


@pytest.mark.parametrize("bad", ["fast", "-3", "nan", "inf"])
def test_a_bad_handoff_variable_is_refused_by_name(monkeypatch, bad):
    monkeypatch.setattr(threads, "_handoff", [None])
    monkeypatch.setenv("ISTHMUS_HANDOFF_US", bad)
    with pytest.raises(ValueError, match="ISTHMUS_HANDOFF_US"):
        threads.handoff_s()


def test_a_callers_least_chunk_is_scaled_by_the_handoff_too(monkeypatch):
    """fan_out(min_chunk=...) (conv_rows passes FLOPs and MIN_CHUNK_FLOPS) is the least chunk at a
    10 us hand-off: at 40 us a chunk must carry four times it."""
    monkeypatch.setattr(threads, "_handoff", [40e-6])
    with threads.IntraOpThreads(2):
        assert threads.fan_out(lambda lo, hi: None, 64, 8 * 1000 - 1, min_chunk=1000) == 1
        assert threads.fan_out(lambda lo, hi: None, 64, 8 * 1000, min_chunk=1000) == 2
        assert threads.fan_out(lambda lo, hi: None, 64, 8 * threads.MIN_CHUNK_FLOPS, flops=True) == 2
        assert threads.fan_out(lambda lo, hi: None, 64, 8 * threads.MIN_CHUNK_FLOPS - 1, flops=True) == 1


def test_the_caller_runs_the_chunks_no_pool_thread_started(monkeypatch):
    """With every pool thread busy (another core taken), fan_out does not wait for one: the caller
    runs the unstarted chunks itself, the same chunks."""
    monkeypatch.setattr(threads, "_handoff", [threads.HANDOFF_REF_S])
    pool = threads.intra_pool()
    release = threading.Event()
    busy = [pool.submit(release.wait, 10) for _ in range(pool._max_workers)]
    try:
        ran = []
        me = threading.get_ident()
        with threads.IntraOpThreads(3):
            k = threads.fan_out(lambda lo, hi: ran.append((lo, hi, threading.get_ident() == me)), 90, 1 << 40)
        assert k == 3 and sorted(ran) == [(0, 30, True), (30, 60, True), (60, 90, True)]
    finally:
        release.set()
        for f in busy:
            f.result(timeout=10)


def test_a_chunk_error_still_reaches_the_caller_when_it_ran_the_chunk(monkeypatch):
    monkeypatch.setattr(threads, "_handoff", [threads.HANDOFF_REF_S])
    pool = threads.intra_pool()
    release = threading.Event()
    busy = [pool.submit(release.wait, 10) for _ in range(pool._max_workers)]

    def fail(lo, hi):
        if lo > 0:
            raise RuntimeError(f"chunk {lo}")
    try:
        with threads.IntraOpThreads(2), pytest.raises(RuntimeError, match="chunk 32"):
            threads.fan_out(fail, 64, 1 << 40)
    finally:
        release.set()
        for f in busy:
            f.result(timeout=10)
