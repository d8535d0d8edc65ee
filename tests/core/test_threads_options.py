"""Session options intra_op_threads / inter_op_threads reach BLAS (threadpoolctl), numba and the branch pool."""
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import isthmus as ism
from isthmus.core import registry
from isthmus.core.threads import blas_threads_now, default_inter_op_threads

pytestmark = pytest.mark.cpu  # the CPU's own kernels and threads (conftest.py)


def _blas_count():
    return blas_threads_now()


needs_blas = pytest.mark.skipif(_blas_count() is None, reason="threadpoolctl sees no BLAS library")


@pytest.fixture
def probe(monkeypatch):
    """Neg's kernel, replaced for one test: it records BLAS's and numba's thread counts as it runs."""
    seen = []

    def kernel(node, ctx):
        def run(x):
            import sys
            nb = sys.modules.get("numba")
            seen.append((_blas_count(), nb.get_num_threads() if nb is not None else None))
            return -x
        return run
    monkeypatch.setattr(registry.get("Neg"), "kernel", kernel)
    return seen


def _graph():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(np.float32, (3,), name="x")
        y = ism.neg(x, name="y")
    return g, x, y


def _run(sess, x, y):
    out = sess.run(y, {x: np.arange(3, dtype=np.float32)})
    np.testing.assert_array_equal(out, -np.arange(3, dtype=np.float32))


@needs_blas
def test_intra_op_threads_limits_blas_during_the_run_only(probe):
    g, x, y = _graph()
    with threadpool_limits(2, user_api="blas"):
        before = _blas_count()
        _run(ism.Session(g, optimize=False, intra_op_threads=1), x, y)
        assert probe[-1][0] == 1
        assert _blas_count() == before  # restored after the run


@needs_blas
def test_intra_op_threads_raises_a_process_limit_for_its_runs(probe):
    g, x, y = _graph()
    with threadpool_limits(1, user_api="blas"):
        _run(ism.Session(g, optimize=False, intra_op_threads=2), x, y)
        assert probe[-1][0] == 2
        assert _blas_count() == 1


@needs_blas
def test_default_keeps_the_process_limit(probe):
    g, x, y = _graph()
    with threadpool_limits(1, user_api="blas"):
        _run(ism.Session(g, optimize=False), x, y)
    assert probe[-1][0] == 1


def test_intra_op_threads_reach_numba(probe):
    nb = pytest.importorskip("numba")
    if nb.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread here")
    g, x, y = _graph()
    s = ism.Session(g, optimize=False, intra_op_threads=1)
    _run(s, x, y)
    assert probe[-1][1] == 1
    _run(ism.Session(g, optimize=False, intra_op_threads=2), x, y)
    assert probe[-1][1] == 2
    f = s.make_callable(y, [x])
    f(np.zeros(3, np.float32))
    assert probe[-1][1] == 1


def test_default_runs_set_numbas_count_only_when_it_changes(monkeypatch):
    """A default run follows BLAS's count into numba; numba's setter (a lock and a check of its pool)
    is called only when that count changes, not on every run."""
    nb = pytest.importorskip("numba")
    if nb.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread here")
    g, x, y = _graph()
    s = ism.Session(g, optimize=False)
    calls = []
    real = nb.set_num_threads
    monkeypatch.setattr(nb, "set_num_threads", lambda n: (calls.append(n), real(n)))
    with threadpool_limits(2, user_api="blas"):
        _run(s, x, y)
        first = len(calls)
        for _ in range(3):
            _run(s, x, y)
        assert len(calls) == first and nb.get_num_threads() == 2
    with threadpool_limits(1, user_api="blas"):
        _run(s, x, y)
        assert calls[-1] == 1 and nb.get_num_threads() == 1


@needs_blas
def test_blas_count_read_agrees_with_threadpoolctl():
    from threadpoolctl import threadpool_info
    for n in (1, 2):
        with threadpool_limits(n, user_api="blas"):
            want = max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
            assert blas_threads_now() == want == n


def test_inter_op_threads_size_the_branch_pool():
    g, x, y = _graph()
    s = ism.Session(g, optimize=False, parallel=True, inter_op_threads=3)
    plan = s.plan_for(y, {x: np.zeros(3, np.float32)})
    assert plan.parallel and plan._runner.workers == 3
    _run(s, x, y)
    from isthmus.core.scheduler import shared_pool
    assert shared_pool(3)._max_workers == 3
    d = ism.Session(g, optimize=False, parallel=True)
    assert d.plan_for(y, {x: np.zeros(3, np.float32)})._runner.workers == default_inter_op_threads()
    assert d.inter_op_threads == default_inter_op_threads() >= 2


def test_one_inter_op_thread_runs_serially():
    g, x, y = _graph()
    s = ism.Session(g, optimize=False, inter_op_threads=1)
    assert not s.plan_for(y, {x: np.zeros(3, np.float32)}).parallel
    _run(s, x, y)
    with pytest.raises(ValueError, match="inter_op_threads=1"):
        ism.Session(g, parallel=True, inter_op_threads=1)


@pytest.mark.parametrize("option", ["intra_op_threads", "inter_op_threads"])
@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2", np.int64(0)])
def test_bad_thread_counts_are_refused_naming_the_option(option, bad):
    with pytest.raises(ValueError, match=option):
        ism.Session(ism.Graph(), **{option: bad})


@needs_blas
def test_per_node_timing_runs_with_the_sessions_threads(probe):
    from isthmus.core.profile import time_nodes
    g, x, y = _graph()
    with threadpool_limits(2, user_api="blas"):
        times = time_nodes(ism.Session(g, optimize=False, intra_op_threads=1), y,
                           {x: np.zeros(3, np.float32)}, repeats=2)
    assert probe and all(b == 1 for b, _ in probe)
    assert [n.name for n in times] == ["y"]


def test_numpy_integers_are_thread_counts():
    s = ism.Session(ism.Graph(), intra_op_threads=np.int64(2), inter_op_threads=np.int32(3))
    assert (s.intra_op_threads, s.inter_op_threads) == (2, 3) and type(s.intra_op_threads) is int


def test_overlapping_one_blas_thread_blocks_restore_the_count_once_the_last_ends():
    """BLAS's count is process-wide: blocks that overlap (two threads' products) must not leave it at 1,
    and a split decided inside another thread's block sees the count that block will restore."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from isthmus.core import threads
    if not any(i["user_api"] == "blas" for i in threadpool_info()):
        pytest.skip("no BLAS library loaded")
    with threadpool_limits(2, user_api="blas"):
        a, b = threads.BlasThreads(1), threads.BlasThreads(1)
        a.__enter__()
        b.__enter__()                      # another thread's block starting inside the first
        assert threads.blas_threads_now() == 1 and threads.intra_threads() == 2
        a.__exit__(None, None, None)       # the first ends while the second still runs
        assert threads.blas_threads_now() == 1
        b.__exit__(None, None, None)
        assert threads.blas_threads_now() == 2 and threads.intra_threads() == 2


def test_one_blas_thread_blocks_hold_from_any_thread():
    """threadpoolctl lets only the first Python thread that set a pthreads OpenBLAS's count change
    it while that thread lives, and ignores the rest without a word. Every gRPC handler thread
    runs steps, so the holds must take effect from any thread: a GEMM part that ran on two BLAS
    threads gave other bits (tests/cloud/test_shm.py's shm and gRPC steps differed)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_info, threadpool_limits

    from isthmus.core import threads
    if not any(i["user_api"] == "blas" and i["internal_api"] == "openblas" for i in threadpool_info()):
        pytest.skip("no OpenBLAS loaded")
    owner_set, release = threading.Event(), threading.Event()

    def owner():  # claims threadpoolctl's control of OpenBLAS and stays alive while the others run
        with threadpool_limits(2, user_api="blas"):
            owner_set.set()
            release.wait(10)
    t = threading.Thread(target=owner)
    t.start()
    try:
        assert owner_set.wait(10)

        def inside():
            with threads.BlasThreads(1):
                one = threads.blas_threads_now()
            with threads.IntraOpThreads(1):
                intra_one = threads.blas_threads_now()
            return one, intra_one, threads.blas_threads_now()
        with ThreadPoolExecutor(2) as pool:
            got = [pool.submit(inside).result(timeout=10) for _ in range(3)]
        assert got == [(1, 1, 2)] * 3
    finally:
        release.set()
        t.join(10)


@needs_blas
def test_batch_1_dense_layers_on_the_matrix_vector_loop_leave_blas_alone(monkeypatch):
    """A batch-1 MLP whose dense layers take jit.dense's matrix-vector loop (constant float32 weights)
    makes no BLAS call, so its one-intra-thread run does not set BLAS's count (a hold cost ~9 us of a
    63 us run); the same layers on fed weights go through BLAS and are held to one thread."""
    from isthmus import jit
    from isthmus.core import blas_libs, threads as th
    if not jit.available() or th.cores() < 2:
        pytest.skip("needs numba and two cores")
    rng = np.random.default_rng(3)
    w1, w2 = rng.standard_normal((784, 512)).astype(np.float32), rng.standard_normal((512, 512)).astype(np.float32)
    b1, b2 = rng.standard_normal(512).astype(np.float32), rng.standard_normal(512).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(np.float32, (None, 784), name="x")
        fw1 = ism.placeholder(np.float32, (784, 512), name="fw1")
        fw2 = ism.placeholder(np.float32, (512, 512), name="fw2")

        def mlp(a, b):
            h = ism.relu(ism.bias_add(ism.matmul(x, a), ism.constant(b1)))
            return ism.relu(ism.bias_add(ism.matmul(h, b), ism.constant(b2)))
        y_const, y_fed = mlp(ism.constant(w1), ism.constant(w2)), mlp(fw1, fw2)
    xv = rng.standard_normal((1, 784)).astype(np.float32)
    want = np.maximum(np.maximum(xv.astype(np.float64) @ w1 + b1, 0) @ w2 + b2, 0)
    sets = []
    real = blas_libs._set_blas
    monkeypatch.setattr(blas_libs, "_set_blas", lambda lib, n: sets.append(n) or real(lib, n))
    with threadpool_limits(2, user_api="blas"):
        s = ism.Session(g)
        for y, feed in ((y_const, {x: xv}), (y_fed, {x: xv, fw1: w1, fw2: w2})):
            s.run(y, feed)  # the first run chooses each layer's path
            sets.clear()
            got = s.run(y, feed)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
            if y is y_const:
                assert sets == []  # no hold: BLAS's count never set
            else:
                assert sets and min(sets) == 1 and sets[-1] == 2  # held to one thread, then restored (per library)
