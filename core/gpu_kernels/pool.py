"""Max pooling on a CUDA GPU: one RawKernel launch forward and one (after zeroing) backward,
instead of a launch per window tap and, for 2x2 windows, a host-synchronising tie count.
Other dtypes and the CI stand-in keep the core kernels."""
from __future__ import annotations

import numpy as np

from . import generic_factory, raw


def _geometry(node, shape):
    kh, kw = node.attrs["ksize"]
    sh, sw = node.attrs["strides"]
    dh, dw = node.attrs["dilations"]
    (t, b), (l, r) = node.attrs["pads"]
    n, c, h, w = shape
    oh = (h + t + b - (kh - 1) * dh - 1) // sh + 1
    ow = (w + l + r - (kw - 1) * dw - 1) // sw + 1
    return (n, c, h, w, oh, ow, kh, kw, sh, sw, dh, dw, t, l)


def _max_pool(node, ctx):
    generic = generic_factory("MaxPool")(node, ctx)
    xp = ctx.xp
    if not hasattr(xp, "RawModule"):
        return generic
    raw.preload(xp, "isthmus_max_pool")  # compiled now, not inside a captured step

    def run(x):
        if x.dtype != np.float32:
            return generic(x)
        geo = _geometry(node, x.shape)
        y = xp.empty((geo[0], geo[1], geo[4], geo[5]), dtype=x.dtype)
        raw.launch(xp, "isthmus_max_pool", y.size, (xp.ascontiguousarray(x), y) + raw.geom_args(*geo))
        return y
    return run


def _max_pool_grad(node, ctx):
    generic = generic_factory("MaxPoolGrad")(node, ctx)
    xp = ctx.xp
    if not hasattr(xp, "RawModule"):
        return generic
    through_relu = np.int32(1 if node.attrs.get("through_relu") else 0)
    raw.preload(xp, "isthmus_max_pool_grad")

    def run(x, y, dy):
        if not raw.usable(xp, x, y, dy):
            return generic(x, y, dy)
        geo = _geometry(node, x.shape)
        dx = xp.zeros(x.shape, dtype=x.dtype)
        c = xp.ascontiguousarray
        raw.launch(xp, "isthmus_max_pool_grad", y.size, (c(x), c(y), c(dy), dx, through_relu) + raw.geom_args(*geo))
        return dx
    return run


KERNELS = {"MaxPool": _max_pool, "MaxPoolGrad": _max_pool_grad}
