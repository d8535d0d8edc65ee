"""Elementwise kernels that numpy runs in several passes (a mask, then a product), compiled into one."""
from __future__ import annotations

import numba as nb  # this module is imported only when a compiled kernel first runs

_OPTS = dict(nogil=True, cache=True, boundscheck=False, fastmath={"contract"})


@nb.njit(**_OPTS)
def _window_grad(dy, x, lo, hi, out):
    one, zero = dy.dtype.type(1), dy.dtype.type(0)
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = dy[i] * (one if (v > lo and v < hi) else zero)


def window_grad(dy, x, lo: float, hi: float, out) -> None:
    """out = dy * (lo < x < hi) over flat contiguous arrays of one dtype: the gradient of relu
    (hi = inf) and relu6. dy is multiplied by 0 or 1, so NaN in dy stays NaN, as in numpy."""
    t = x.dtype.type
    _window_grad(dy, x, t(lo), t(hi), out)
