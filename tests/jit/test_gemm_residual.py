"""jit.gemm_residual: the packed GEMM with a residual addend in its tile's start, against numpy in
float64, over whole and partial 16-column panels (narrow and wide rests) and several K chunks."""
import numpy as np
import pytest

from isthmus import jit

pytestmark = pytest.mark.skipif(not jit.available(), reason="numba is a dependency")


@pytest.mark.parametrize("o,k,p", [(4, 3, 16), (8, 40, 37), (12, 130, 21), (16, 300, 64), (8, 64, 5)])
@pytest.mark.parametrize("lo,hi", [(-np.inf, np.inf), (0.0, np.inf), (0.0, 6.0)])
def test_gemm_bias_add_clamp_matches_numpy(o, k, p, lo, hi):
    from isthmus.jit.gemm_f32 import NR, pack_weights, supported
    from isthmus.jit.gemm_residual import gemm_bias_add_clamp
    if not supported():
        pytest.skip("the fp32 tile needs AVX2")
    rng = np.random.default_rng(o * 1000 + k + p)
    w = rng.standard_normal((o, k)).astype(np.float32)
    x = rng.standard_normal((k, p)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    r = (rng.standard_normal((o, p)) * 4).astype(np.float32)
    y = np.full((o, p), np.nan, np.float32)
    r0 = r.copy()
    gemm_bias_add_clamp(pack_weights(w), b, x, np.float32(lo), np.float32(hi), y, r,
                        np.empty((k, NR), np.float32), np.empty((o, NR), np.float32), np.empty((o, NR), np.float32))
    want = np.clip(w.astype(np.float64) @ x + b[:, None] + r, lo, hi)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(r, r0)
