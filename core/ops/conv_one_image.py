"""Inference float32 convolutions (groups 1) image by image: the im2col gather with the padding
written in place (no padded copy) at a cache-friendly row stride, then the packed GEMM with bias and
clamp (jit.gemm_f32) where it beats BLAS, else BLAS and the bias + activation finish. Batch 1 always;
a batch of images as compiled calls over chunks of images where the packed GEMM serves."""
from __future__ import annotations

import numpy as np

from .depthwise import ARENAS, _CLAMPS, _immutable
from .intra_op import rows_apply, serial_blas

_MAX_PLANS = 8  # input shapes whose geometry a node keeps


def _packed_pays(o: int, k: int, p: int, batch: bool = False) -> bool:
    """Where jit.gemm_f32's packed kernel (weights packed once, bias and clamp in the epilogue, x at
    leading_dim's stride) beat BLAS + the finish pass, one thread: 1.0-1.4x for 36 to 576 pixels
    up to k = 576 and beyond 576 pixels for shallow k (<= 64); 0.8-1.0x on 1024+ pixels with
    k >= 147 (32-128 outputs; measured at load 3, thread CPU time). A batch's alternatives cost
    more (row taps' layout passes around BLAS, or jit.conv_images at a conflicting row stride): at
    batch 32, up to k = 576 at any size, or up to 64 pixels, 0.65-0.95x their time (Inception's
    32x32x32 3x3: 25.7 -> 16.5 ms); the CNN's 5x5 over 32 channels (k = 800, 196 pixels) 1.08x."""
    from ...jit.gemm_f32 import supported  # deferred: loads llvmlite, numba
    if batch:
        return o % 4 == 0 and p >= 16 and (k <= 576 or p <= 64) and supported()
    return o % 4 == 0 and p >= 16 and (p <= 576 or k <= 64) and supported()


class OneImage:
    """One node's batch-1 convolution: per input shape the geometry and the GEMM choice, per
    constant weights their packed copy."""

    def __init__(self, activation: str, finish):
        self.clamp, self.finish = _CLAMPS.get(activation), finish
        if self.clamp is not None:
            self._lo, self._hi = np.float32(self.clamp[0]), np.float32(self.clamp[1])
        self._fns = None  # the compiled kernels, imported at the first call
        self._plans = {}
        self._weights = None  # (w, bias, packed w, bias as float32)

    def __call__(self, x, w, g, bias):
        _, c, h, wd = x.shape
        o = w.shape[0]
        plan = self._plans.get(x.shape)
        if plan is None:
            plan = self._plan(x.shape, w, g)
        geo, k, p, ldx, packed = plan
        cached = self._weights  # packed weights are kept only for constants: a hit needs no checks
        packed = packed and ((cached is not None and cached[0] is w and cached[1] is bias)
                             or (_immutable(w) and (bias is None or _immutable(bias))))
        fns = self._fns or self._load()
        mem = ARENAS.take(np, k * ldx * 4)
        try:
            cols = mem[:k * ldx * 4].view(np.float32).reshape(k, ldx)
            out = np.empty((1, o, g.oh, g.ow), np.float32)
            y = out.reshape(o, p)
            x2 = np.ascontiguousarray(x).reshape(c, h * wd)
            if packed:
                wp, b = self._packed(w, bias)
                fns[1](x2, h, wd, geo, wp, b, self._lo, self._hi, y, cols)
            else:
                fns[0](x2, h, wd, geo, cols)
                serial_blas(np, lambda: np.matmul(w.reshape(o, k), cols[:, :p], out=y))
                self.finish(y, bias)
        finally:
            ARENAS.give(np, mem)
        return out

    def _load(self):
        from ...jit.gemm_f32 import conv_image_ld, im2col_ld  # deferred: loads llvmlite, numba
        self._fns = (im2col_ld, conv_image_ld)
        return self._fns

    def batch_pays(self, x, w, bias, g) -> bool:
        """Whether a batch runs here (compiled, per image): the packed GEMM serves its per-image
        shape and the weights (and bias) are constants."""
        plan = self._plans.get(x.shape) or self._plan(x.shape, w, g)
        return plan[4] and _immutable(w) and (bias is None or _immutable(bias))

    def batch(self, x, w, g, bias):
        """batch_pays' convolutions: chunks of images on the intra-op threads, one compiled call each."""
        from ...jit.gemm_f32 import conv_images_ld  # deferred: loads llvmlite, numba
        n, c, h, wd = x.shape
        o = w.shape[0]
        geo, k, p, ldx, _ = self._plans[x.shape]
        wp, b = self._packed(w, bias)
        lo, hi = np.float32(self.clamp[0]), np.float32(self.clamp[1])
        x3 = np.ascontiguousarray(x).reshape(n, c, h * wd)
        out = np.empty((n, o, g.oh, g.ow), np.float32)
        o3 = out.reshape(n, o, p)
        rows_apply(np, lambda i0, i1: conv_images_ld(x3, h, wd, geo, wp, b, lo, hi, o3, ldx, i0, i1), n,
                   out.nbytes + n * k * p * 4)
        return out

    def _plan(self, shape, w, g):
        from ...jit.gemm_f32 import leading_dim  # deferred: loads llvmlite, numba
        k, p = shape[1] * g.kh * g.kw, g.oh * g.ow
        (t, b), (l, r) = g.pads
        geo = np.array([g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, t, b, l, r, g.oh, g.ow], np.int64)
        packed = self.clamp is not None and w.dtype == np.float32 and _packed_pays(w.shape[0], k, p, shape[0] > 1)
        plan = (geo, k, p, leading_dim(p) if packed else p, packed)
        if len(self._plans) >= _MAX_PLANS:
            self._plans.clear()
        self._plans[shape] = plan
        return plan

    def _packed(self, w, bias):
        cached = self._weights
        if cached is None or cached[0] is not w or cached[1] is not bias:
            from ...jit.gemm_f32 import pack_weights  # deferred: loads llvmlite, numba
            o = w.shape[0]
            b = np.zeros(o, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32).reshape(o)
            cached = self._weights = (w, bias, pack_weights(w.reshape(o, -1)), b)  # holding w keeps its id
        return cached[2], cached[3]
