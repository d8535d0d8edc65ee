"""core.ops.numpy_blas (cblas gemm with beta 0/1 into strided views, axpy) against numpy in float64."""
import numpy as np
import pytest

from isthmus.core.ops import numpy_blas

rng = np.random.default_rng(41)


@pytest.fixture(params=["blas", "fallback"])
def path(request, monkeypatch):
    if request.param == "fallback":
        monkeypatch.setattr(numpy_blas, "_bound", [None])
    elif not numpy_blas.available():
        pytest.skip("numpy's BLAS is not reachable through ctypes here")
    return request.param


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_accumulate_into_column_ranges_of_larger_arrays(path, dtype):
    a = rng.standard_normal((7, 30)).astype(dtype)[:, 3:23]  # row stride 30, 20 columns
    b = rng.standard_normal((20, 50)).astype(dtype)[:, 5:45]
    c = rng.standard_normal((7, 60)).astype(dtype)
    before = c.copy()
    numpy_blas.accumulate(a, b, c[:, 10:50], add=True)
    want = before.astype(np.float64)
    want[:, 10:50] += a.astype(np.float64) @ b
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(c, want, rtol=tol, atol=tol)
    assert np.array_equal(c[:, :10], before[:, :10]) and np.array_equal(c[:, 50:], before[:, 50:])
    numpy_blas.accumulate(a, b, c[:, 10:50], add=False)
    np.testing.assert_allclose(c[:, 10:50], a.astype(np.float64) @ b, rtol=tol, atol=tol)


def test_accumulate_takes_transposed_and_empty_operands(path):
    a = rng.standard_normal((6, 4)).astype(np.float32)
    bt = rng.standard_normal((5, 4)).astype(np.float32).T  # column-major: matmul's route
    c = np.zeros((6, 5), np.float32)
    numpy_blas.accumulate(a, bt, c, add=True)
    np.testing.assert_allclose(c, a.astype(np.float64) @ bt, rtol=1e-5, atol=1e-5)
    empty = np.ones((6, 5), np.float32)
    numpy_blas.accumulate(a[:, :0], bt[:0], empty, add=False)  # an empty contraction writes zeros
    assert not empty.any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_axpy_one_pass_or_declines(path, dtype):
    x = rng.standard_normal((40, 9)).astype(dtype)
    y = rng.standard_normal((40, 9)).astype(dtype)
    want = y.astype(np.float64) - 0.25 * x
    done = numpy_blas.axpy(-0.25, x, y)
    assert done == (path == "blas")
    if done:
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    assert not numpy_blas.axpy(1.0, x.T, y.T.copy().T)  # not C-contiguous: the caller's numpy passes
    assert not numpy_blas.axpy(1.0, x.astype(np.float16), y.astype(np.float16))
