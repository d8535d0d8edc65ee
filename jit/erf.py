"""erf over float32 arrays in one compiled pass (core's Erf kernel, which carries the coefficients).

numpy evaluates the rational approximation as about 25 passes (a multiply and an add per
coefficient), each a call: at a transformer's [32, 256] GELU input the calls, not the arithmetic,
are most of the node's time (about 60 us here). One loop keeps each element in registers.
"""
from __future__ import annotations

import numba as nb  # imported only when the kernel is first bound
import numpy as np  # noqa: F401  (numba resolves the dtypes)


@nb.njit(nogil=True, cache=True, inline="always", fastmath={"contract"}, error_model="numpy")
def _erf1(v, bound, p, q):
    """c P(c^2) / Q(c^2), c = v clamped to [-bound, bound] (Horner, highest power first)."""
    c = min(max(v, -bound), bound)
    c2 = c * c
    num = p[0]
    for k in range(1, len(p)):
        num = num * c2 + p[k]
    den = q[0]
    for k in range(1, len(q)):
        den = den * c2 + q[k]
    return c * num / den


@nb.njit(nogil=True, cache=True, boundscheck=False, fastmath={"contract"}, error_model="numpy")
def erf_rational(x, out, bound, p, q):
    """out = c P(c^2) c / Q(c^2) with c = x clamped to [-bound, bound]; x, out flat arrays of one
    float dtype, p and q coefficient tuples of that dtype, highest power first (Horner)."""
    for i in range(x.shape[0]):
        out[i] = _erf1(x[i], bound, p, q)


@nb.njit(nogil=True, cache=True, boundscheck=False, fastmath={"contract"}, error_model="numpy")
def gelu_erf(x, out, inv, half, one, bound, p, q):
    """out = (half x) (one + erf(x inv)), erf as erf_rational: the exact GELU (core's Gelu) in one
    pass, every step in x's dtype as numpy's passes compute it (the erf the same bits as Erf's)."""
    for i in range(x.shape[0]):
        v = x[i]
        e = _erf1(v * inv, bound, p, q)
        out[i] = (half * v) * (one + e)
