"""Inference convolutions whose route is settled: per input shape, the path conv.py chose for constant
weights, called again without re-running the checks that chose it.

At batch 1 a convolution's choice (depthwise? few pixels? 1x1? packed GEMM? each asking whether the
compiled kernels serve, whether the weights are constants, whether the GEMM shape pays) cost 15-25 us
of Python per call, as much as the product of a small 1x1 convolution (64 -> 16 channels on 24x24:
a 14 us kernel in a 37 us node). A route is kept only for float32 constant weights (and bias) that
the chosen path holds by identity, and is used again only for the same input shape and dtype, the
same weight and bias objects, an addend of the same kind, and while the compiled kernels are still
allowed (ISTHMUS_JIT is read at each call, as everywhere).
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ... import jit

_MAX_ROUTES = 8  # input shapes whose route a node keeps


class BoundRoutes:
    """One node's settled routes: (input shape, addend given) -> (w, bias, run(x, addend), output shape)."""

    def __init__(self):
        self._routes = {}

    def get(self, x, w, bias, addend) -> Optional[Callable]:
        """The run(x, addend) learned for this call's kind, or None (then the full choice runs)."""
        route = self._routes.get((x.shape, addend is None))
        if route is None or route[0] is not w or route[1] is not bias or x.dtype != np.float32:
            return None
        if addend is not None and (addend.shape != route[3] or addend.dtype != np.float32):
            return None
        return route[2] if jit.available() else None

    def learn(self, x, w, bias, addend, out_shape, run: Optional[Callable]) -> None:
        """Keep run for calls like this one (the caller checked: float32, constant w and bias, numpy)."""
        if run is None or x.dtype != np.float32 or (addend is not None and addend.dtype != np.float32):
            return
        if len(self._routes) >= _MAX_ROUTES:
            self._routes.clear()
        self._routes[(x.shape, addend is None)] = (w, bias, run, tuple(out_shape))


class PackedOnce:
    """Constant weights (and bias) relaid for a kernel once, and kept while the same objects come
    back: get(w, bias) -> (pack(w as [O, K]), bias as float32 [O], zeros without one). Holding w and
    bias keeps their identities unique. pack is called with the weights when they change (a
    deferred import inside it keeps numba unloaded until then)."""

    def __init__(self, pack: Callable):
        self._pack = pack
        self._cached = None  # (w, bias, packed, bias as float32)

    def holds(self, w, bias) -> bool:
        """Whether these weights are packed already (a hit: they were constants, no checks needed)."""
        c = self._cached
        return c is not None and c[0] is w and c[1] is bias

    def get(self, w, bias):
        c = self._cached
        if c is None or c[0] is not w or c[1] is not bias:
            o = w.shape[0]
            b = np.zeros(o, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32).reshape(o)
            c = self._cached = (w, bias, self._pack(w.reshape(o, -1)), b)
        return c[2], c[3]


# what PackedOnce relays weights with (deferred imports: they load llvmlite and numba)
def pack_tile(w2):
    """For jit.gemm_f32's register tile ([O/4, K, 4])."""
    from ...jit.gemm_f32 import pack_weights  # deferred: loads llvmlite, numba
    return pack_weights(w2)


def pack_channels(w2):
    """By output channels, for jit.conv_direct ([O/16, K, 16])."""
    from ...jit.conv_direct import pack_channels as pack  # deferred: loads llvmlite, numba
    return pack(w2)


def pack_panels_t(w2):
    """W^T in 16-channel panels, for jit.gemm_pixels."""
    from ...jit.gemm_pixels import pack_weights_t  # deferred: loads llvmlite, numba
    return pack_weights_t(w2)
