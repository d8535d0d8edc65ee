"""Inference convolutions with few output pixels (small planes) as one compiled GEMM
with the pixels as rows and the constant weights streamed once (jit.gemm_pixels), bias and clamp
included: BLAS repacks all the weights on every call to use them a few times."""
from __future__ import annotations

import numpy as np

from ... import jit
from .conv_one_image import direct_pays, tile_ok
from .par_gate import may_split, prange_threads, split_rows
from .conv_bound import PackedOnce, pack_panels_t
from .depthwise import _CLAMPS, _immutable, compiled_ok

# Most output rows (images x pixels) for which the pixel-rows GEMM beats BLAS (one thread, cold
# weights, bias and im2col included): 2x at 4 pixels, 1.2x at 16, even at 36 and 64 (1x1
# convolutions, which need no im2col on the BLAS path: even at 16). A batch of images of at most
# _MAX_PIXELS_BATCH pixels each, up to _MAX_ROWS_BATCH rows: ResNet's 2x2 and 4x4 stages at batch
# 32 (128 and 512 rows) 1.2-4x faster than the BLAS paths, 0.8x on a stride-1 3x3 over 2x2 planes
# (whose row taps skip the padding's products).
_MAX_ROWS, _MAX_ROWS_1X1 = 36, 16
# 1x1 convolutions with at least this many input channels take _MAX_ROWS where the packed GEMM
# cannot (output channels not a multiple of 4): MobileNetV2's and SqueezeNet's 6x6 1x1s of 384-576
# channels 0.8-0.9x the time of BLAS + bias (DRAM-cold, one thread). The packed GEMM
# (jit.gemm_f32.packed_pays) takes the rest: 0.83-0.95x the pixel rows' time, which gather the
# plane (a transpose, for a 1x1) before their product.
_DEEP_1X1 = 256
_MAX_PIXELS_BATCH, _MAX_ROWS_BATCH = 16, 512
# At batch 1, more rows than this leave a convolution that jit.conv_direct serves to it (conv_one_image:
# no gather, no transposed finish): SqueezeNet's 3x3s on 6x6 planes (64 -> 256, 48 -> 192) 0.90x and
# 0.88x the pixel rows' time in a loop, 0.94-0.95x in the whole model (one thread, load ~5)
_MAX_ROWS_DIRECT = 16
_MAX_TABLES = 4  # geometries (input shapes) whose gather table a node keeps


class PixelRows:
    """One node's pixel-rows convolution: the weights relaid once per constant weights, the gather
    table once per input shape."""

    def __init__(self, activation: str):
        self.clamp = _CLAMPS.get(activation)
        self._weights = PackedOnce(pack_panels_t)  # W^T in 16-channel panels
        self._tables = {}
        self._kernel = None  # jit.gemm_pixels.conv_pixels, imported at the first call
        if self.clamp is not None:
            self._lo, self._hi = np.float32(self.clamp[0]), np.float32(self.clamp[1])

    def pays(self, xp, x, w, bias, g) -> bool:
        """float32 constant weights (and bias), groups 1, a clamp activation, few output rows."""
        pix = g.oh * g.ow
        rows = x.shape[0] * pix
        pointwise = g.kh == g.kw == 1 and (g.sh, g.sw) == (1, 1)
        deep = x.shape[1] >= _DEEP_1X1 and w.shape[0] % 4 != 0
        limit = _MAX_ROWS_1X1 if pointwise and not deep else _MAX_ROWS
        if (x.shape[0] == 1 and rows > _MAX_ROWS_DIRECT and direct_pays(w.shape[0], x.shape[1] * g.kh * g.kw, g)
                and tile_ok()):
            limit = _MAX_ROWS_DIRECT
        few = rows <= limit or (pix <= _MAX_PIXELS_BATCH and rows <= _MAX_ROWS_BATCH)
        return (few and g.groups == 1 and self.clamp is not None and x.dtype == np.float32
                and w.dtype == np.float32 and compiled_ok(xp, x.dtype) and _immutable(w)
                and (bias is None or (bias.dtype == np.float32 and _immutable(bias))))

    def __call__(self, x, w, g, bias, addend=None):
        """act(conv(x, w) + bias (+ addend, of the output's shape)) as [N, O, OH, OW]."""
        o = w.shape[0]
        cached = (w, bias) + self._weights.get(w, bias)
        index = self._table(x.shape[1:], g)
        n, p = x.shape[0], g.oh * g.ow
        quads = -(-n * p // 4)
        a = np.empty((quads, index.shape[1], 4), np.float32)
        yt = np.empty((quads * 4, cached[2].shape[0] * 16), np.float32)
        out = np.empty((n, o, g.oh, g.ow), np.float32)
        xf, zeros = np.ascontiguousarray(x).reshape(-1), np.zeros(yt.shape[0], np.float32)
        flops = 2 * yt.shape[0] * yt.shape[1] * index.shape[1]
        if may_split(n if n > 1 and p % 4 == 0 else yt.shape[1] // 16, flops, flops=True):
            return self._split(xf, index, cached, zeros, a, yt, out, n, p, flops, addend)
        if addend is not None:
            from ...jit.gemm_pixels import conv_pixels_add  # deferred: loads llvmlite, numba
            r = np.ascontiguousarray(addend, np.float32).reshape(n, o, p)
            conv_pixels_add(xf, index, cached[2], cached[3], r, self._lo, self._hi, zeros, a, yt, out.reshape(n, o, p), p)
            return out
        kernel = self._kernel or self._load()
        kernel(xf, index, cached[2], cached[3], self._lo, self._hi, zeros, a, yt, out.reshape(n, o, p), p)
        return out

    def runner(self, x, w, g, bias):
        """run(x, r) -> [1, O, OH, OW] at batch 1 for x's shape and these constant weights (conv_bound):
        __call__ with what depends only on the shape and the weights worked out once (the gather table,
        the scratch sizes, the kernels and the product's driver), and the product split by prange where
        split_rows would; anything else (the pool's split, on a machine without prange) goes to
        __call__. The same kernels on the same cuts: the same bytes."""
        if x.shape[0] != 1:
            return None
        o = w.shape[0]
        wt, b = self._weights.get(w, bias)
        index = self._table(x.shape[1:], g)
        p, kk = g.oh * g.ow, index.shape[1]
        quads, cols = -(-p // 4), wt.shape[0] * 16
        panels, flops = cols // 16, 2 * (-(-p // 4) * 4) * cols * kk
        zeros = np.zeros(quads * 4, np.float32)  # the tile's row bias: only read
        lo, hi, out_shape = self._lo, self._hi, (1, o, g.oh, g.ow)
        gp = jit.loaded("gemm_pixels")
        gather, product = gp.gather_rows, jit.loaded("par").driver(gp.panels_finish_range)
        whole, whole_add = gp.conv_pixels, gp.conv_pixels_add

        def run(x, r):
            if not x.flags.c_contiguous:
                x = np.ascontiguousarray(x)
            if r is not None:
                r = np.ascontiguousarray(r, np.float32).reshape(1, o, p)
            k = prange_threads(panels, flops, flops=True)
            if not k and may_split(panels, flops, flops=True):  # the pool's split: __call__'s path
                return self(x, w, g, bias, r)
            a = np.empty((quads, kk, 4), np.float32)
            yt = np.empty((quads * 4, cols), np.float32)
            out = np.empty(out_shape, np.float32)
            xf, o3 = x.reshape(-1), out.reshape(1, o, p)
            if k:  # the gather, then each thread's panels with their channels' finish
                gather(xf, index, a, 1, p)
                product(k, panels, a, wt, zeros, yt, b, r, lo, hi, o3, p)
            elif r is None:
                whole(xf, index, wt, b, lo, hi, zeros, a, yt, o3, p)
            else:
                whole_add(xf, index, wt, b, r, lo, hi, zeros, a, yt, o3, p)
            return out
        return run

    def _split(self, xf, index, cached, zeros, a, yt, out, n, p, flops, addend):
        """__call__ split across threads (par_gate.split_rows): a batch whose images fill whole row quads
        by blocks of images (each block's gather, product and finish; each thread streams all the
        weights, from its cache), else the product by 16-channel weight panels (each thread streams its
        own panels once; batch 1 included) with the gather and the finish around it."""
        gp = jit.loaded("gemm_pixels")
        o = out.shape[1]
        if n > 1 and p % 4 == 0:  # whole row quads per image: blocks of images, gather and finish included
            o3, lo, hi = out.reshape(n, o, p), self._lo, self._hi
            if addend is None:
                split_rows(gp.images_range, (xf, index, cached[2], cached[3], lo, hi, zeros, a, yt, o3, p), n, flops,
                           flops=True)
            else:
                r = np.ascontiguousarray(addend, np.float32).reshape(n, o, p)
                split_rows(gp.images_add_range, (xf, index, cached[2], cached[3], r, lo, hi, zeros, a, yt, o3, p), n,
                           flops, flops=True)
            return out
        gp.gather_rows(xf, index, a, n, p)
        split_rows(gp.panels_range, (a, cached[2], zeros, yt), yt.shape[1] // 16, flops, flops=True)
        o3 = out.reshape(n, o, p)
        if addend is None:
            gp.finish_range(yt, cached[3], self._lo, self._hi, o3, p, 0, n)
        else:
            gp.finish_add_range(yt, cached[3], np.ascontiguousarray(addend, np.float32).reshape(n, o, p), self._lo,
                                self._hi, o3, p, 0, n)
        return out

    def _load(self):
        from ...jit.gemm_pixels import conv_pixels  # deferred: loads llvmlite, numba
        self._kernel = conv_pixels
        return conv_pixels

    def _table(self, shape, g):
        key = shape  # the node's window is fixed: the input shape decides the geometry
        table = self._tables.get(key)
        if table is None:
            from ...jit.gemm_pixels import pixel_index  # deferred: loads llvmlite, numba
            c, h, w = shape
            table = pixel_index(c, h, w, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.pads[0][0], g.pads[1][0],
                                g.oh, g.ow)
            if len(self._tables) >= _MAX_TABLES:
                self._tables.clear()
            self._tables[key] = table
        return table

