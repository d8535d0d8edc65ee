"""conv_bound: a convolution's settled route (constant weights, one input shape) serves later calls
without the checks that chose it, with the first call's results: each route (few pixels, 1x1 packed,
im2col packed, no-im2col wide, a batch image by image), with and without a residual addend, against
a float64 reference over several runs; and it steps aside for new inputs' shapes or ISTHMUS_JIT=0."""
import numpy as np
import pytest

import isthmus as ism
from isthmus import jit
from isthmus.core.ops import conv_bound

from .test_conv_forward import ref_conv

pytestmark = pytest.mark.skipif(not jit.available(), reason="needs numba")


@pytest.fixture
def hits(monkeypatch):
    """Counts the calls a learned route served."""
    served = []
    real = conv_bound.BoundRoutes.get

    def get(self, *a):
        run = real(self, *a)
        served.append(run is not None)
        return run
    monkeypatch.setattr(conv_bound.BoundRoutes, "get", get)
    return served


def _graph(n, c, o, k, hw, residual):
    """relu(conv(x, w) + b (+ r)) with SAME padding, the Session's passes fusing it into one node."""
    rng = np.random.default_rng(n * 1000 + c * 10 + k + hw)
    w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (n, c, hw, hw), name="x")
        r = ism.placeholder("float32", (n, o, hw, hw), name="r")
        z = ism.bias_add(ism.conv2d(x, ism.constant(w), padding="SAME"), ism.constant(b), axis=1)
        y = ism.relu(z + r if residual else z)
    return g, x, r, y, w, b


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("n,c,o,k,hw", [
    (1, 16, 32, 3, 4),    # 16 pixels: pixel rows
    (1, 16, 32, 1, 12),   # 1x1 on the packed GEMM
    (1, 8, 20, 3, 12),    # im2col + the packed GEMM
    (1, 8, 16, 3, 30),    # stride 1 on 30 columns: no im2col (conv_wide)
    (3, 8, 16, 3, 12),    # a batch, image by image
])
def test_routes_serve_later_calls_with_the_reference(hits, residual, n, c, o, k, hw):
    g, x, r, y, w, b = _graph(n, c, o, k, hw, residual)
    sess = ism.Session(g)
    rng = np.random.default_rng(7)
    for _ in range(3):
        feed = {x: rng.standard_normal((n, c, hw, hw)).astype(np.float32),
                r: rng.standard_normal((n, o, hw, hw)).astype(np.float32)}
        want = ref_conv(feed[x], w, (1, 1), ((k // 2, k // 2),) * 2, (1, 1), 1) + b.reshape(1, -1, 1, 1)
        want = np.maximum(want + feed[r] if residual else want, 0)
        got = sess.run(y, feed if residual else {x: feed[x]})
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    assert hits == [False, True, True]


def test_a_new_shape_or_jit_off_takes_the_full_choice(hits, monkeypatch):
    g, x, r, y, w, b = _graph(1, 16, 32, 1, 12, False)
    with g.as_default():
        x2 = ism.placeholder("float32", (1, 16, None, None), name="x2")
        y2 = ism.relu(ism.bias_add(ism.conv2d(x2, ism.constant(w), padding="VALID"), ism.constant(b), axis=1))
    sess = ism.Session(g)
    rng = np.random.default_rng(1)
    a, a8 = rng.standard_normal((1, 16, 12, 12)).astype(np.float32), rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    first = sess.run(y2, {x2: a})
    np.testing.assert_array_equal(sess.run(y2, {x2: a}), first)  # served: the same bytes
    other = sess.run(y2, {x2: a8})  # a new shape: the full choice, then its own route
    np.testing.assert_allclose(other, np.maximum(ref_conv(a8, w, (1, 1), ((0, 0), (0, 0)), (1, 1), 1)
                                                 + b.reshape(1, -1, 1, 1), 0), rtol=2e-5, atol=2e-5)
    assert hits == [False, True, False]
    monkeypatch.setenv("ISTHMUS_JIT", "0")
    off = sess.run(y2, {x2: a})  # numpy's path: the route is not used
    np.testing.assert_allclose(off, first, rtol=2e-5, atol=2e-5)
    assert hits[-1] is False
