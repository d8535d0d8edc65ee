"""Thread choice by cost: the hand-off measured once per process sizes the chunks, BLAS threads
products by their FLOPs, and a batch-1 run's one thread stays its own thread's."""
import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import isthmus as ism
from isthmus.core import threads
from isthmus.core.ops import intra_op


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


@pytest.mark.parametrize("flops,n,want", [(999_999, 16, 1), (2_500_000, 16, 2), (25_700_000, 16, 16),
                                          (25_700_000, 2, 2), (800_000, 2, 1)])
def test_blas_threads_follow_the_products_flops(flops, n, want):
    assert threads.blas_threads_for(flops, n) == want


def test_matmul_holds_blas_to_the_threads_its_flops_pay_for(monkeypatch):
    _need_openblas()
    seen = []
    real = threads.BlasThreads

    class Recording(real):
        def __enter__(self):
            out = super().__enter__()
            seen.append((self.n, threads.blas_threads_now()))
            return out
    monkeypatch.setattr(threads, "BlasThreads", Recording)
    rng = np.random.default_rng(3)
    small = rng.standard_normal((1, 784)).astype(np.float32), rng.standard_normal((784, 512)).astype(np.float32)
    large = rng.standard_normal((32, 784)).astype(np.float32), small[1]
    with threadpool_limits(2, user_api="blas"), threads.IntraOpThreads(2):
        got_small = intra_op.matmul(np, *small)   # 0.8 MFLOP: one BLAS thread
        assert seen == [(1, 1)] and threads.blas_threads_now() == 2
        got_large = intra_op.matmul(np, *large)   # 25.7 MFLOP: BLAS's own 2 threads, no hold
        assert seen == [(1, 1)]
    with threadpool_limits(1, user_api="blas"):
        one_small = np.matmul(*small)
    with threadpool_limits(2, user_api="blas"):
        two_large = np.matmul(*large)
    assert got_small.tobytes() == one_small.tobytes()   # the bytes of the count it was given
    assert got_large.tobytes() == two_large.tobytes()
    np.testing.assert_allclose(got_large, large[0].astype(np.float64) @ large[1], rtol=1e-4, atol=1e-4)


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
