"""exp over float32 vectors in arithmetic LLVM vectorizes (numba has no vector math library here:
math.exp is a scalar call per element, about ten times slower): the recurrent cells' gates
(jit/rnn.py) and the row softmax (jit/rows.py) use it.

exp(x) = 2^k 2^f with k = round(x log2 e) and |f| <= 1/2: 2^f by its Taylor polynomial (degree 7,
relative error below 1e-8 before rounding) and 2^k written as float32 exponent bits. Arguments
are clamped to [-87, 87] (the normal float32 range); below -87 the result is exactly 0.
"""
from __future__ import annotations

import math

import numba as nb  # imported only when a compiled kernel is first bound
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

_F32 = np.float32
_LOG2E, _X_MAX = _F32(1.4426950408889634), _F32(87.0)
_C1, _C2, _C3, _C4, _C5, _C6, _C7 = (_F32(math.log(2.0) ** k / math.factorial(k)) for k in range(1, 8))
_ONE, _HALF = _F32(1.0), _F32(0.5)
_BIAS, _MANT = np.int32(127), np.int32(23)  # float32 exponent bias and mantissa bits
# error_model="numpy": no ZeroDivisionError branch, which keeps LLVM from vectorizing divisions
FAST = dict(nogil=True, cache=True, boundscheck=False, fastmath={"contract"}, error_model="numpy")


@nb.njit(**FAST)
def exp_scaled(v, lo, hi, scale, bits):
    """v[lo:hi] = exp(scale * v[lo:hi]) in place, float32; bits: int32 scratch at least hi long.
    NaN stays NaN."""
    pow2 = bits.view(np.float32)
    for g in range(lo, hi):
        x = scale * v[g]
        a = min(max(x, -_X_MAX), _X_MAX) * _LOG2E
        k = np.floor(a + _HALF)  # float32 (math.floor would return an int64 and make f float64)
        f = a - k
        v[g] = _ONE + f * (_C1 + f * (_C2 + f * (_C3 + f * (_C4 + f * (_C5 + f * (_C6 + f * _C7))))))
        bits[g] = ((np.int32(k) + _BIAS) << _MANT) if x > -_X_MAX else np.int32(0)  # 0.0f: exp underflows
    for g in range(lo, hi):
        v[g] *= pow2[g]


@intrinsic
def _bits_as_f32(typingctx, v):
    """The float32 whose bits are the int32 v (LLVM bitcast: no memory round trip, so loops vectorize)."""
    sig = types.float32(types.int32)
    return sig, lambda context, builder, signature, args: builder.bitcast(args[0], ir.FloatType())


@nb.njit(**FAST)
def exp1(x):
    """exp(x) of one float32, as exp_scaled's arithmetic: inlined into a loop, LLVM vectorizes it (the
    fused recurrent cells evaluate all of a hidden unit's gates in one pass)."""
    a = min(max(x, -_X_MAX), _X_MAX) * _LOG2E
    k = np.floor(a + _HALF)
    f = a - k
    p = _ONE + f * (_C1 + f * (_C2 + f * (_C3 + f * (_C4 + f * (_C5 + f * (_C6 + f * _C7))))))
    scale = _bits_as_f32((np.int32(k) + _BIAS) << _MANT)
    return p * scale if x > -_X_MAX else _F32(0.0)
