"""The float32 erf the Erf and Gelu kernels use: a rational approximation as numpy passes (any array
module) or one compiled pass (jit.erf), and the exact GELU as one compiled pass."""
from __future__ import annotations

import math

import numpy as np

from ... import jit

# erf(x) = x P(x^2) / Q(x^2) on [-4, 4] (beyond it erf is +-1 in float32): the float32
# rational approximation of Eigen and XLA, max relative error 4.5e-7 against float64 erf
# (tests/core/test_math_ops.py). numpy has no erf; scipy's float32 one costs ~15 ns per element,
# this ~1 (13x on a 1024x256 GELU input, one thread).
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)


def _erf_float32(xp, x):
    x = xp.clip(x.astype(np.float32, copy=False), np.float32(-4.0), np.float32(4.0))  # cupy's clip takes no dtype
    x2 = x * x
    p = xp.full_like(x, _ERF_P[0])
    for c in _ERF_P[1:]:
        p *= x2
        p += np.float32(c)
    p *= x
    q = xp.full_like(x, _ERF_Q[0])
    for c in _ERF_Q[1:]:
        q *= x2
        q += np.float32(c)
    p /= q
    return p


_ERF_P32, _ERF_Q32 = tuple(np.float32(c) for c in _ERF_P), tuple(np.float32(c) for c in _ERF_Q)
_ERF_ARGS = (np.float32(4.0), _ERF_P32, _ERF_Q32)  # bound, P, Q
_GELU_ARGS = (np.float32(1.0 / math.sqrt(2.0)), np.float32(0.5), np.float32(1.0)) + _ERF_ARGS  # inv, half, one


def _compiled(kernel: str, x, args):
    """jit.erf.<kernel>(x flat, out flat, *args) over a float32 array: a new array of x's shape."""
    flat = (x if x.flags.c_contiguous else np.ascontiguousarray(x)).reshape(-1)
    out = np.empty(x.shape, np.float32)
    getattr(jit.loaded("erf"), kernel)(flat, out.reshape(-1), *args)
    return out


def _erf_compiled(x):
    """_erf_float32 of a float32 array in one compiled pass (isthmus.jit), the same polynomial."""
    return _compiled("erf_rational", x, _ERF_ARGS)


def gelu_compiled(x):
    """The exact GELU of a float32 array in one compiled pass: the bits of 0.5 x (1 + erf(x / sqrt 2))
    in numpy passes with _erf_compiled's erf."""
    return _compiled("gelu_erf", x, _GELU_ARGS)
