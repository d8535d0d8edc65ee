"""intra_op.par_rows: compiled range kernels split inside one prange call (jit.par), gated by the
threading layer, with the same bytes at any thread count; and the row-tap relayouts built on it."""
import threading

import numba
import numpy as np
import pytest

from isthmus.core import idle
from isthmus.core import threads
from isthmus.core.ops import intra_op
from isthmus.jit import par

pytestmark = pytest.mark.cpu  # the CPU's own kernels and threads (conftest.py)


@numba.njit(nogil=True)
def _square(x, y, lo, hi):
    for i in range(lo, hi):
        y[i] = x[i] * x[i]


@numba.njit(nogil=True)
def _cut_sums(x, out, lo, hi):
    # a kernel whose bytes depend on its cut: float32 sums restart at every cut
    s = np.float32(0)
    for i in range(lo, hi):
        s += x[i]
        out[i] = s


@pytest.fixture
def cheap(monkeypatch):
    """Every kernel is worth splitting: a 10 us prange hand-off and 1-byte least chunks."""
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 1)
    monkeypatch.setattr(threads, "MIN_CHUNK_FLOPS", 1)
    if not par.layer_ok():
        pytest.skip(f"numba's threading layer is {par.layer()}: prange kernels are not used here")
    monkeypatch.setattr(threads, "_prange", [threads.HANDOFF_REF_S])
    monkeypatch.setattr(idle, "_load", [True, float("inf")])  # an idle machine, never read again
    monkeypatch.setattr(threads, "_prange_at", [0.0])  # pinned: never measured again


def _at(n):
    return threads.IntraOpThreads(n)


def test_a_cut_free_kernel_splits_across_two_threads(cheap):
    x = np.random.default_rng(0).standard_normal(10_001).astype(np.float32)
    y = np.full_like(x, np.nan)
    with _at(2):
        used = intra_op.par_rows(_square, (x, y), x.size, 2 * x.nbytes)
    assert used == 2
    np.testing.assert_array_equal(y, x * x)


def test_fixed_blocks_give_the_same_bytes_at_one_and_two_threads(cheap):
    x = np.random.default_rng(1).standard_normal(9_999).astype(np.float32)
    got = {}
    for n in (1, 2):
        out = np.full_like(x, np.nan)
        with _at(n):
            used = intra_op.par_rows(_cut_sums, (x, out), x.size, 2 * x.nbytes, blocks=7)
        assert used == n
        got[n] = out
    assert got[1].tobytes() == got[2].tobytes()
    ref = np.concatenate([np.cumsum(x[x.size * b // 7:x.size * (b + 1) // 7], dtype=np.float32) for b in range(7)])
    np.testing.assert_allclose(got[1], ref, rtol=1e-5, atol=1e-4)


def test_small_work_runs_serially_without_measuring(monkeypatch):
    monkeypatch.setattr(threads, "_prange", [None])
    monkeypatch.setattr(idle, "_load", [True, float("inf")])  # an idle machine, never read again
    monkeypatch.setattr(threads, "_probe_prange", lambda: pytest.fail("probed for work that cannot split"))
    x = np.ones(100, np.float32)
    y = np.zeros_like(x)
    with _at(2):
        assert intra_op.par_rows(_square, (x, y), x.size, 2 * x.nbytes) == 1
    with _at(1):
        assert threads.par_threads(10**6, 10**12) == 1
    np.testing.assert_array_equal(y, 1.0)


def test_without_a_safe_layer_the_pool_runs_the_same_cuts(monkeypatch):
    """numba's workqueue layer aborts on concurrent parallel calls: no prange there, fan_out instead."""
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 1)
    monkeypatch.setattr(threads, "_handoff", [threads.HANDOFF_REF_S])
    monkeypatch.setattr(threads, "_prange", [None])
    monkeypatch.setattr(idle, "_load", [True, float("inf")])  # an idle machine, never read again
    monkeypatch.setattr(par, "layer_ok", lambda: False)
    monkeypatch.setattr(par, "driver", lambda kernel: pytest.fail("a prange driver without a safe layer"))
    x = np.random.default_rng(2).standard_normal(5_000).astype(np.float32)
    out = np.zeros_like(x)
    with _at(2):
        assert threads.par_threads(x.size, 10**9) == 0
        intra_op.par_rows(_cut_sums, (x, out), x.size, 10**9, blocks=5)
    ref = np.zeros_like(x)
    for b in range(5):
        _cut_sums(x, ref, x.size * b // 5, x.size * (b + 1) // 5)
    assert out.tobytes() == ref.tobytes()


def test_the_environment_can_switch_prange_off_or_pin_its_handoff(monkeypatch):
    monkeypatch.setattr(threads, "_prange", [None])
    monkeypatch.setattr(idle, "_load", [True, float("inf")])  # an idle machine, never read again
    monkeypatch.setenv("ISTHMUS_PRANGE", "0")
    assert threads.prange_handoff_s() is None
    monkeypatch.delenv("ISTHMUS_PRANGE")
    monkeypatch.setattr(threads, "_prange", [None])
    monkeypatch.setattr(idle, "_load", [True, float("inf")])  # an idle machine, never read again
    monkeypatch.setenv("ISTHMUS_PRANGE_HANDOFF_US", "30")
    if threads.cores() > 1 and par.layer_ok():
        assert threads.prange_handoff_s() == pytest.approx(30e-6)
        assert threads.par_scale() == pytest.approx(3.0 * threads.PRANGE_BLOCK_HANDOFFS / 10)
    monkeypatch.setattr(threads, "_prange", [None])
    monkeypatch.setattr(idle, "_load", [True, float("inf")])  # an idle machine, never read again
    monkeypatch.setenv("ISTHMUS_PRANGE_HANDOFF_US", "soon")
    if threads.cores() > 1 and par.layer_ok():
        with pytest.raises(ValueError, match="ISTHMUS_PRANGE_HANDOFF_US"):
            threads.prange_handoff_s()


def test_the_handoff_is_measured_again_after_a_second(monkeypatch):
    """A measurement from a loaded moment (here a made-up second) does not stop splits for good."""
    if threads.cores() < 2 or not par.layer_ok():
        pytest.skip("no prange here")
    import time
    monkeypatch.delenv("ISTHMUS_PRANGE_HANDOFF_US", raising=False)
    monkeypatch.setattr(threads, "_prange", [1.0])
    monkeypatch.setattr(idle, "_load", [True, float("inf")])  # an idle machine, never read again
    monkeypatch.setattr(threads, "_prange_at", [time.perf_counter()])
    assert threads.prange_handoff_s() == 1.0  # within the second: the last measurement
    stale = time.perf_counter() - 2 * threads.PAR_REMEASURE_S
    monkeypatch.setattr(threads, "_prange_at", [stale])
    h = threads.prange_handoff_s()
    assert 0 < h < 1.0 and threads._prange_at[0] > stale


def test_two_python_threads_enter_parallel_regions_at_once(cheap):
    """The executor's branch pool and concurrent sessions call kernels from several threads: under
    omp/tbb each caller gets its own team. Bounded: every join has a timeout."""
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(4_096).astype(np.float32) for _ in range(2)]
    errors, done = [], []

    def worker(x):
        try:
            y = np.empty_like(x)
            with _at(2):
                for _ in range(300):
                    y[...] = np.nan
                    intra_op.par_rows(_square, (x, y), x.size, 2 * x.nbytes)
                    if not np.array_equal(y, x * x):
                        errors.append("wrong values")
                        return
            done.append(1)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(repr(e))
    ts = [threading.Thread(target=worker, args=(x,), daemon=True) for x in xs]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in ts), "a parallel region hung"
    assert errors == [] and len(done) == 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("pads,sw,dw", [((2, 2), 1, 1), ((0, 1), 2, 1), ((3, 0), 1, 2)])
def test_row_tap_columns_match_numpys_window_copy(cheap, dtype, pads, sw, dw):
    """jit.par_conv's columns against a hand-built padded window copy, at one and two threads."""
    from isthmus.jit.par_conv import nchw_to_chwn_range, row_tap_columns_range
    rng = np.random.default_rng(4)
    n, c, h, w, kw = 3, 5, 4, 9, 3
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    l, r = pads
    ow = (w + l + r - dw * (kw - 1) - 1) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (0, 0), (l, r)))
    ref = np.stack([xp[:, :, :, j * dw:j * dw + sw * (ow - 1) + 1:sw] for j in range(kw)])  # [kw, N, C, H, OW]
    ref = ref.transpose(0, 2, 3, 4, 1)
    for threads_ in (1, 2):
        cols = np.full((kw, c, h, ow, n), np.nan, dtype)
        with _at(threads_):
            intra_op.par_rows(row_tap_columns_range, (x, cols, l, sw, dw), c, 2 * cols.nbytes)
        assert cols.tobytes() == np.ascontiguousarray(ref).tobytes()
    y = np.full((c, h, w, n), np.nan, dtype)
    with _at(2):
        intra_op.par_rows(nchw_to_chwn_range, (x[:, :, :, ::-1], y), c, 2 * x.nbytes)  # any strides
    np.testing.assert_array_equal(y, x[:, :, :, ::-1].transpose(1, 2, 3, 0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_large_sgd_update_is_one_compiled_pass_with_the_same_bytes_at_any_threads(cheap, dtype):
    """ApplyGradientDescent above training._SGD_COMPILED_MIN elements: BLAS's axpy over fixed units of
    the flat variable by par_rows, against var - lr * g in float64; one and two threads give the same
    bytes, and so does one axpy over the whole variable."""
    import isthmus as ism
    from isthmus.core.ops import numpy_blas, training
    if numpy_blas.function("axpy", dtype) is None:
        pytest.skip("numpy's BLAS is not reached directly here")
    rng = np.random.default_rng(5)
    shape = (300, 301)
    assert shape[0] * shape[1] >= training._SGD_COMPILED_MIN
    w0 = rng.standard_normal(shape).astype(dtype)
    gv = rng.standard_normal(shape).astype(dtype)
    got = {}
    for n in (1, 2):
        g = ism.Graph()
        with g.as_default():
            v = ism.Variable(w0, name="w")
            gt = ism.placeholder(dtype, shape, name="g")
            step = training.apply("ApplyGradientDescent", [v], [ism.constant(np.asarray(0.125, dtype))], gt)
            sess = ism.Session(g, intra_op_threads=n)
            sess.run(ism.global_variables_initializer())
        calls = []
        real = intra_op.par_rows
        training.par_rows = lambda *a, **k: calls.append(real(*a, **k)) or calls[-1]
        try:
            sess.run(step, {gt: gv})
        finally:
            training.par_rows = real
        assert calls == [n]  # the compiled pass ran, split at two threads
        got[n] = sess.run(v)
    assert got[1].tobytes() == got[2].tobytes()
    whole = w0.copy()
    assert numpy_blas.axpy(-0.125, gv, whole) and whole.tobytes() == got[1].tobytes()
    np.testing.assert_allclose(got[1], w0.astype(np.float64) - 0.125 * gv, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("through_relu", [False, True])
def test_max_pool_range_forms_match_the_whole_array_kernels(cheap, through_relu):
    """jit.par_pool's range forms, split at two threads, against jit.pool's whole-array calls (ties,
    zeros after a relu and a NaN included): the same bytes."""
    from isthmus.jit.par_pool import max_pool_2x2_float_range, max_pool_2x2_grad_range
    from isthmus.jit.pool import max_pool_2x2_float_rows, max_pool_2x2_grad_rows
    rng = np.random.default_rng(6)
    n, c, h, w = 4, 3, 6, 8
    x = np.maximum(rng.standard_normal((n, c, h, w)), 0).astype(np.float32)
    x[0, 0, 0, :2] = x[0, 0, 1, :2] = 5.0
    x[1, 2, 3, 3] = np.nan
    ref_y = np.empty((n * c, h // 2, w // 2), np.float32)
    max_pool_2x2_float_rows(x.reshape(n * c, h, w), ref_y)
    y = np.full_like(ref_y, -1.0)
    dy = rng.standard_normal(ref_y.shape).astype(np.float32)
    rows = n * c * h // 2
    ref_dx = np.empty(x.size, np.float32)
    max_pool_2x2_grad_rows(x.reshape(-1), ref_y.reshape(-1), dy.reshape(-1), ref_dx, rows, w, through_relu)
    dx = np.full(x.size, -1.0, np.float32)
    with _at(2):
        assert intra_op.par_rows(max_pool_2x2_float_range, (x.reshape(n * c, h, w), y), n * c, x.nbytes) == 2
        assert intra_op.par_rows(max_pool_2x2_grad_range, (x.reshape(-1), ref_y.reshape(-1), dy.reshape(-1), dx, w,
                                                           through_relu), rows, 3 * x.nbytes) == 2
    assert y.tobytes() == ref_y.tobytes() and dx.tobytes() == ref_dx.tobytes()


@pytest.mark.parametrize("act", ["relu", "none"])
@pytest.mark.parametrize("o,path", [(64, "_par_conv_rows"), (32, "_par_stacked_rows")])
def test_row_tap_convolutions_on_prange_give_the_pool_paths_bytes(cheap, monkeypatch, act, o, path):
    """conv_rows' blocks as one prange call of BLAS GEMMs (jit.par_blas) and one of the finish, at two
    threads, against the same convolution at one thread (the pool path's GEMMs, in the same blocks
    and order): the same bytes; and against a float64 reference. 64 output channels: the per-kernel-row
    GEMMs; 32: the stacked path (one GEMM per input row over the kernel rows, jit.par_blas.stacked_rows_range)."""
    import isthmus as ism
    from isthmus.core.ops import conv_rows, numpy_blas
    if numpy_blas.sgemm() is None:
        pytest.skip("numpy's BLAS is not reached directly here")
    monkeypatch.setattr(threads, "cores", lambda: 2)  # two row blocks whatever the machine
    rng = np.random.default_rng(8)
    x = rng.standard_normal((8, 16, 16, 32)).astype(np.float32)  # 16 x 256 output columns: two blocks
    w = (rng.standard_normal((o, 16, 3, 5)) * 0.2).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        xt, wt = ism.placeholder(np.float32, x.shape, name="x"), ism.placeholder(np.float32, w.shape, name="w")
        y = ism.conv2d(xt, wt, padding="SAME") + ism.reshape(ism.constant(b), (1, o, 1, 1))
        if act == "relu":
            y = ism.relu(y)
    calls = []
    real = getattr(conv_rows, path)
    monkeypatch.setattr(conv_rows, path, lambda *a: calls.append(1) or real(*a))
    got = {n: ism.Session(g, intra_op_threads=n).run(y, {xt: x, wt: w}) for n in (1, 2)}
    assert calls == [1]  # the two-thread run took the prange path, the one-thread run did not
    assert got[1].tobytes() == got[2].tobytes()
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (2, 2))).astype(np.float64)
    ref = sum(np.einsum("nchw,oc->nohw", xp[:, :, p:p + 16, q:q + 32], w[:, :, p, q]) for p in range(3) for q in range(5))
    ref = ref + b.reshape(1, o, 1, 1)
    np.testing.assert_allclose(got[2], np.maximum(ref, 0) if act == "relu" else ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("m,n", [(40, 300), (300, 40)])  # split by columns, by rows
def test_split_matmul_on_prange_matches_float64(cheap, monkeypatch, ta, tb, m, n):
    """intra_op.matmul's float32 split through BLAS called from compiled code, operands transposed
    views or not, against float64 numpy; the prange path really ran."""
    from isthmus.core.ops import numpy_blas
    if numpy_blas.sgemm() is None:
        pytest.skip("numpy's BLAS is not reached directly here")
    monkeypatch.setattr(intra_op, "_BLAS_SERIAL_FLOPS", 0)
    rng = np.random.default_rng(9)
    k = 70
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    a, b = (a.T if ta else a), (b.T if tb else b)
    used = []
    real = intra_op.par_rows
    monkeypatch.setattr(intra_op, "par_rows", lambda *args, **kw: used.append(real(*args, **kw)) or used[-1])
    with _at(2):
        got = intra_op.matmul(np, a, b)
    assert used == [2]
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    if not (ta or tb):  # the bytes of the pool path's cut: each half a one-thread BLAS product
        from threadpoolctl import threadpool_limits
        with threadpool_limits(1, user_api="blas"):
            want = (np.concatenate([a @ b[:, :n // 2], a @ b[:, n // 2:]], axis=1) if n >= m
                    else np.concatenate([a[:m // 2] @ b, a[m // 2:] @ b]))
        assert got.tobytes() == want.tobytes()


def test_a_forked_child_never_enters_a_parallel_region():
    """GNU OpenMP is not fork-safe: after fork() the child keeps to serial calls and the pool."""
    import multiprocessing as mp
    if "fork" not in mp.get_all_start_methods():
        pytest.skip("no fork() here")
    threads.prange_handoff_s()  # the parent may have measured (and used) prange
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_reports, args=(q,))
    p.start()
    try:
        got = q.get(timeout=60)
    finally:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    assert got == (None, 0)


def _child_reports(q):
    with threads.IntraOpThreads(2):
        q.put((threads.prange_handoff_s(), threads.par_threads(10**6, 10**12)))


def test_every_range_kernel_has_a_driver_cached_on_disk():
    """A driver made at run time compiles in every process (about a second each): each range kernel
    the library splits has a written-out, disk-cached one (jit.par.register)."""
    from numba.core.caching import NullCache
    from isthmus.jit import par_blas, par_conv, par_images, par_pool, par_update
    kernels = [getattr(m, name) for m in (par_blas, par_conv, par_pool, par_update)
               for name in m.__all__ if name.endswith("_range")] + list(par_images.KERNELS)
    assert len(kernels) >= 20
    for k in kernels:
        d = par._drivers.get(k)
        assert d is not None, f"{k.py_func.__name__} has no registered prange driver"
        assert d.targetoptions.get("parallel") and not isinstance(d._cache, NullCache), k.py_func.__name__


def test_two_sessions_train_concurrently_with_prange_splits(cheap):
    """Two sessions (as in one server) run a convolution's forward and gradients at two intra-op
    threads each from two Python threads at once: every split is a prange region; each thread's
    results equal a lone run's bytes, and nothing hangs (bounded joins)."""
    import isthmus as ism
    rng = np.random.default_rng(10)
    x = rng.standard_normal((8, 16, 16, 32)).astype(np.float32)
    w = (rng.standard_normal((64, 16, 3, 5)) * 0.2).astype(np.float32)
    r = rng.standard_normal((8, 64, 16, 32)).astype(np.float32)

    def build():
        g = ism.Graph()
        with g.as_default():
            xt, wt = ism.placeholder(np.float32, x.shape, name="x"), ism.placeholder(np.float32, w.shape, name="w")
            rt = ism.placeholder(np.float32, r.shape, name="r")
            y = ism.relu(ism.conv2d(xt, wt, padding="SAME"))
            dx, dw = ism.gradients(ism.reduce_sum(y * rt), [xt, wt])
        sess = ism.Session(g, intra_op_threads=2)
        return lambda: sess.run([y, dx, dw], {xt: x, wt: w, rt: r})
    runs = [build(), build()]
    want = [a.tobytes() for a in runs[0]()]
    errors = []

    def worker(run):
        try:
            for _ in range(5):
                if [a.tobytes() for a in run()] != want:
                    errors.append("bytes differ")
                    return
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(repr(e))
    ts = [threading.Thread(target=worker, args=(run,), daemon=True) for run in runs]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in ts), "a run hung"
    assert errors == []


def test_other_modules_image_kernels_split_by_their_drivers_give_the_same_bytes(cheap):
    """jit.par_images' drivers for kernels other modules own: a 3x3/2 max pool over planes and a batch
    of packed 1x1 convolutions, at two threads, against one whole-range call of the same kernel."""
    from isthmus.jit import gemm_f32
    from isthmus.jit.par_images import _conv_images_ld_par  # noqa: F401  (the module registers its drivers)
    from isthmus.jit.pool_windows import max_pool_planes
    if not gemm_f32.supported():
        pytest.skip("the packed GEMM does not run here")
    rng = np.random.default_rng(11)
    x = rng.standard_normal((12, 9, 11)).astype(np.float32)
    geo = np.array([3, 3, 2, 2, 1, 1, 1, 1, 1, 1], np.int64)
    want = np.empty((12, 5, 6), np.float32)
    max_pool_planes(x, want, geo, 0, 12)
    got = np.full_like(want, np.nan)
    with _at(2):
        assert intra_op.par_rows(max_pool_planes, (x, got, geo), 12, x.nbytes) == 2
    assert got.tobytes() == want.tobytes()
    xs = rng.standard_normal((6, 8, 40)).astype(np.float32)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    wp, b = gemm_f32.pack_weights(w), rng.standard_normal(16).astype(np.float32)
    lo, hi = np.float32(0), np.float32(6)
    want = np.empty((6, 16, 40), np.float32)
    gemm_f32.pointwise_images(xs, wp, b, lo, hi, want, 0, 6)
    got = np.full_like(want, np.nan)
    with _at(2):
        assert intra_op.par_rows(gemm_f32.pointwise_images, (xs, wp, b, lo, hi, got), 6, xs.nbytes + got.nbytes) == 2
    assert got.tobytes() == want.tobytes()
    ref = np.clip(np.einsum("oc,ncp->nop", w.astype(np.float64), xs) + b.reshape(1, 16, 1), 0, 6)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
