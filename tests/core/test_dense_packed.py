"""FusedMatMul's compiled paths (jit/dense.py's tile with the weights and bias packed once; the
one-row matrix-vector loop) against float64 numpy: shapes off the tile's multiples, every clamp,
transposed weights, and the BLAS path where neither applies (fed weights, narrow outputs)."""
import numpy as np
import pytest

import isthmus as ism
from isthmus import jit
from isthmus.core.ops import fused_dense
from isthmus.core.ops.base import make

pytestmark = [pytest.mark.skipif(not jit.available(), reason="numba is not installed"), pytest.mark.cpu]

_ACTS = {"none": lambda v: v, "relu": lambda v: np.maximum(v, 0), "relu6": lambda v: np.clip(v, 0, 6)}


def _tile_or_skip():
    from isthmus.jit import gemm_f32
    if not gemm_f32.supported():
        pytest.skip("needs AVX2")


def _run(x, w, bias, activation, transpose_b, feed_w=False):
    g = ism.Graph()
    with g.as_default():
        xp = ism.placeholder("float32", (None, x.shape[1]))
        wt = ism.placeholder("float32", w.shape) if feed_w else ism.constant(w)
        node = make("FusedMatMul", [xp, wt, ism.constant(bias)],
                    {"activation": activation, "transpose_b": transpose_b})
        sess = ism.Session(g)
        feed = {xp: x, wt: w} if feed_w else {xp: x}
        return sess.run(node.outputs[0], feed), sess.run(node.outputs[0], feed)


def _spy(monkeypatch):
    calls = []
    real = fused_dense.PackedDense.__call__
    monkeypatch.setattr(fused_dense.PackedDense, "__call__", lambda self, *a: calls.append(a[-1]) or real(self, *a))
    return calls


@pytest.mark.parametrize("m,k,n,activation,transpose_b", [(2, 7, 128, "relu", False), (5, 64, 130, "none", True),
                                                         (32, 300, 256, "relu6", False), (13, 1, 144, "relu", True)])
def test_packed_matches_float64(monkeypatch, m, k, n, activation, transpose_b):
    _tile_or_skip()
    calls = _spy(monkeypatch)
    rng = np.random.default_rng(m * 1000 + n)
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    w = rng.standard_normal((n, k) if transpose_b else (k, n)).astype(np.float32)
    bias = (rng.standard_normal(n) * 2).astype(np.float32)
    got, again = _run(x, w, bias, activation, transpose_b)
    assert set(calls) == {"tile"}, "the packed path did not run"
    w64 = w.astype(np.float64).T if transpose_b else w.astype(np.float64)
    want = _ACTS[activation](x.astype(np.float64) @ w64 + bias)
    assert got.shape == (m, n) and got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k) * 3)
    np.testing.assert_array_equal(got, again)  # the packed weights are reused
    if activation != "none":
        assert got.min() >= 0 and (activation != "relu6" or got.max() <= 6)


@pytest.mark.parametrize("k,n,activation", [(784, 512, "relu"), (7, 3, "relu6"), (1, 20, "none")])
def test_one_row_matches_float64(monkeypatch, k, n, activation):
    """Batch 1: the matrix-vector loop on the weights as they are (k off its unroll of 4)."""
    calls = _spy(monkeypatch)
    rng = np.random.default_rng(k + n)
    x = (rng.standard_normal((1, k)) * 3).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = (rng.standard_normal(n) * 2).astype(np.float32)
    got, again = _run(x, w, bias, activation, False)
    assert calls == ["gemv", "gemv"]
    want = _ACTS[activation](x.astype(np.float64) @ w + bias)
    assert got.shape == (1, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k) * 3)
    np.testing.assert_array_equal(got, again)


@pytest.mark.parametrize("m,n,feed_w,transpose_b", [(1, 128, False, True), (8, 10, False, False),
                                                    (8, 128, True, False), (1, 128, True, False)])
def test_blas_path_where_packing_does_not_pay(monkeypatch, m, n, feed_w, transpose_b):
    """Narrow outputs, one row of transposed weights, and weights fed at run time (not constant)
    keep the BLAS path."""
    calls = _spy(monkeypatch)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((m, 20)).astype(np.float32)
    w = rng.standard_normal((n, 20) if transpose_b else (20, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    got, _ = _run(x, w, bias, "relu", transpose_b, feed_w=feed_w)
    assert not calls
    w64 = w.T.astype(np.float64) if transpose_b else w.astype(np.float64)
    np.testing.assert_allclose(got, np.maximum(x.astype(np.float64) @ w64 + bias, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("route", ["prange", "pool"])
def test_threads_give_the_same_bytes(monkeypatch, route):
    """Split over two intra-op threads by whole panels (par_gate.split_rows: prange's blocks on an idle
    machine, the pool's chunks where prange is unavailable): the bytes of one thread's result."""
    _tile_or_skip()
    from isthmus.core import idle, threads
    from isthmus.core.ops import par_gate
    from isthmus.jit import par
    if threads.cores() < 2 or (route == "prange" and not par.layer_ok()):
        pytest.skip("needs two cores and a threading layer that takes concurrent parallel calls")
    monkeypatch.setattr(threads, "_prange", [3e-6 if route == "prange" else False])
    monkeypatch.setattr(threads, "_prange_at", [0.0])  # pinned: never measured again
    monkeypatch.setattr(threads, "_handoff", [1e-6])  # the pool splits whatever the machine's hand-off costs
    monkeypatch.setattr(idle, "_load", [True, float("inf")])  # an idle machine, never read again
    used = []
    real = par_gate.split_rows
    monkeypatch.setattr(fused_dense, "split_rows", lambda *a, **k: used.append(real(*a, **k)) or used[-1])
    rng = np.random.default_rng(9)
    x = rng.standard_normal((24, 1000)).astype(np.float32)
    w = rng.standard_normal((1000, 640)).astype(np.float32)
    bias = rng.standard_normal(640).astype(np.float32)
    for a in (w, bias):
        a.flags.writeable = False
    dense = fused_dense.PackedDense("relu", False)
    assert dense.path(x, w, bias) == "tile"
    with threads.IntraOpThreads(1):
        one = dense(x, w, bias, "tile")
    with threads.IntraOpThreads(2):
        two = dense(x, w, bias, "tile")
    assert used == [2]
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(one, np.maximum(x.astype(np.float64) @ w + bias, 0), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("m", [1, 8])
def test_nan_passes_the_clamp(monkeypatch, m):
    """As numpy's maximum: a NaN in a row makes that row's outputs NaN under relu and relu6 alike."""
    _tile_or_skip()
    calls = _spy(monkeypatch)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((m, 16)).astype(np.float32)
    x[0, 3] = np.nan
    w = rng.standard_normal((16, 128)).astype(np.float32)
    bias = rng.standard_normal(128).astype(np.float32)
    for activation in ("relu", "relu6"):
        got, _ = _run(x, w, bias, activation, False)
        assert np.isnan(got[0]).all() and not np.isnan(got[1:]).any()
    assert set(calls) == {"gemv" if m == 1 else "tile"}
