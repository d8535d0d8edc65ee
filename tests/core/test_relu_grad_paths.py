"""ReluGrad (the gradient of relu and relu6) on both kernel paths, compiled (isthmus.jit.elementwise)
and numpy (ISTHMUS_JIT=0), against dy * mask written out here, with boundary values and NaN."""
import numpy as np
import pytest

import isthmus as ism

from .test_conv_forward import kernel_path  # noqa: F401  (the fixture: both kernel paths)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("fn,lo,hi", [(ism.relu, 0.0, np.inf), (ism.relu6, 0.0, 6.0)])
def test_relu_gradients(kernel_path, dtype, fn, lo, hi):  # noqa: F811
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 4, 5, 6)) * 5).astype(dtype)
    x.flat[:4] = [0.0, 6.0, -0.0, 5.999]  # the window is open at both ends
    dy = rng.standard_normal(x.shape).astype(dtype)
    dy.flat[4], x.flat[4] = np.nan, -1.0  # NaN times a zero mask stays NaN, as numpy's product
    g = ism.Graph(seed=0)
    with g.as_default():
        xt = ism.placeholder(dtype, x.shape)
        dyt = ism.placeholder(dtype, x.shape)
        y = fn(xt)
        (gx,) = ism.gradients(y, [xt], grad_ys=[dyt])
        # a transposed upstream gradient: the kernel takes any layout
        (gt,) = ism.gradients(ism.transpose(fn(ism.transpose(xt, (0, 2, 1, 3))), (0, 2, 1, 3)), [xt], grad_ys=[dyt])
        got, got_t = ism.Session(g).run([gx, gt], {xt: x, dyt: dy})
    want = dy * ((x > lo) & (x < hi))
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_t, want)
