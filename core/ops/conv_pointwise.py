"""The GEMM paths' tails of conv.py: 1x1 convolutions as a matrix product per group of images
(Pointwise), and the bias + activation that finishes every convolution GEMM's output (Finish; with
FusedConv2DAdd's residual addend too, and addend_finish for the paths that cannot take it)."""
from __future__ import annotations

import numpy as np

from ... import jit
from .conv_bound import PackedOnce, pack_tile
from .depthwise import _CLAMPS, ARENAS, _immutable, compiled_ok
from .fused import activation_inplace
from . import numpy_blas
from .intra_op import par_rows, rows_apply
from .par_gate import split_rows

_NO_ADDEND = np.empty((0, 0, 0), np.float32)  # jit.par_blas.pointwise_blas_range's "no residual addend"
# a 1x1 convolution's output is finished in groups of images of about this many bytes (in cache)
_POINTWISE_CHUNK_BYTES = 1 << 20


class PackedGemm:
    """Batch 1: y [O, P] = clamp(W [O, K] @ x [K, P] + bias) by jit.gemm_f32 (the edge's kernel: the
    weights packed once per constant weights, bias and clamp in the epilogue) instead of BLAS, which
    packs both operands on every call, and a bias pass, where jit.gemm_f32.packed_pays says it pays
    (the edge's measurement; the edge interpreter asks the same function)."""

    def __init__(self, activation: str):
        self.clamp = _CLAMPS.get(activation)
        self._packed_w = PackedOnce(pack_tile)  # for immutable w and bias

    def pays(self, xp, x, w, bias, k: int, p: int) -> bool:
        if (self.clamp is None or x.dtype != np.float32 or w.dtype != np.float32
                or not compiled_ok(xp, x.dtype) or not _immutable(w)
                or (bias is not None and not _immutable(bias))):
            return False
        from ...jit.gemm_f32 import packed_pays  # deferred: loads llvmlite, numba
        return packed_pays(w.shape[0], k, p)

    def batch_pays(self, xp, x, w, bias, p: int) -> bool:
        """A batch's 1x1 convolutions on the packed GEMM, image by image (images): constant float32
        weights, a clamp, O a multiple of 4, 16+ pixels, and an expansion (more outputs than inputs:
        MobileNetV2-96's at batch 32 0.62-0.88x the time of BLAS per group of images, which repacks
        the weights every call; projections ran even, and 168 -> 64 on 16x16 1.13x)."""
        o = w.shape[0]
        if (self.clamp is None or x.dtype != np.float32 or w.dtype != np.float32 or o % 4 or p < 16 or x.shape[1] >= o
                or not compiled_ok(xp, x.dtype) or not _immutable(w)
                or (bias is not None and (bias.dtype != np.float32 or not _immutable(bias)))):
            return False
        from ...jit.gemm_f32 import supported  # deferred: loads llvmlite, numba
        return supported()

    def images(self, w, bias, xs, out, r=None) -> None:
        """batch_pays' convolutions: xs [N, C, P] -> out [N, O, P] (+ the addend r [N, O, P]), blocks
        of images split by FLOPs (par_gate.split_rows), one compiled call each (jit.gemm_f32.pointwise_images)."""
        from ...jit.gemm_f32 import pointwise_images  # deferred: loads llvmlite, numba
        wp, b = self._weights(w, bias)
        lo, hi = np.float32(self.clamp[0]), np.float32(self.clamp[1])
        xs = np.ascontiguousarray(xs)
        flops = 2 * out.size * xs.shape[1]
        if r is not None:
            from ...jit.gemm_residual import pointwise_images_add  # deferred: loads llvmlite, numba
            split_rows(pointwise_images_add, (xs, wp, b, lo, hi, out, r), xs.shape[0], flops, flops=True)
            return
        split_rows(pointwise_images, (xs, wp, b, lo, hi, out), xs.shape[0], flops, flops=True)

    def _weights(self, w, bias):
        return self._packed_w.get(w, bias)

    def runner(self, xp, x, w, bias):
        """run(x, r) -> [1, O, H, W] for batch 1 at x's shape with these constant weights where pays
        says the packed GEMM serves, else None: __call__'s work without its checks (conv_bound)."""
        n, c, h, wd = x.shape
        o, hw = w.shape[0], h * wd
        if n != 1 or not self.pays(xp, x, w, bias, c, hw):
            return None
        wp, b = self._weights(w, bias)
        lo, hi = np.float32(self.clamp[0]), np.float32(self.clamp[1])
        plain, added, blocks = _row_kernels(o, hw)  # _rows' choice, made once for this shape
        flops = 2 * o * c * hw

        def run(x, r):
            out = np.empty((1, o, h, wd), np.float32)
            y, xf = out.reshape(o, hw), x.reshape(c * hw)
            if r is None:
                split_rows(plain, (wp, b, xf, hw, c, hw, lo, hi, y), blocks, flops, flops=True)
            else:
                split_rows(added, (wp, b, xf, hw, c, hw, lo, hi, y, np.ascontiguousarray(r).reshape(o, hw)), blocks,
                           flops, flops=True)
            return out
        return run

    def __call__(self, w, bias, x2, y2, r2=None) -> None:
        """w: the constant weights (its identity keys the packing), x2 [K, P], y2 [O, P] out, r2 [O, P]
        the addend (or None)."""
        wp, b = self._weights(w, bias)
        k, p = x2.shape
        _rows(wp, b, np.ascontiguousarray(x2).reshape(k * p), k, p, np.float32(self.clamp[0]),
              np.float32(self.clamp[1]), y2, r2)


def _rows(wp, b, xf, k: int, p: int, lo, hi, y, r) -> None:
    """y [O, P] = clamp(W @ x [K, P] + b (+ r [O, P]), lo, hi) on the packed GEMM (wp: pack_weights'),
    split where it pays (par_gate.split_rows) by blocks of output rows (each thread streams its own
    rows' weights), or, where the rows make one block, by blocks of columns (a wide plane's few
    outputs); every row and column gets the tiles the whole product gives it: the same bytes."""
    o = y.shape[0]
    plain, added, blocks = _row_kernels(o, p)
    if r is None:
        split_rows(plain, (wp, b, xf, p, k, p, lo, hi, y), blocks, 2 * o * k * p, flops=True)
    else:
        split_rows(added, (wp, b, xf, p, k, p, lo, hi, y, r), blocks, 2 * o * k * p, flops=True)


def _row_kernels(o: int, p: int):
    """(range kernel, its residual twin, blocks) for _rows: by blocks of ROWS_BLOCK output rows, or by
    blocks of COLS_BLOCK columns where the rows make one block over a wide plane."""
    gf, gr = jit.loaded("gemm_f32"), jit.loaded("gemm_residual")
    row_blocks = -(-o // gf.ROWS_BLOCK)
    if row_blocks > 1 or p <= gf.COLS_BLOCK:
        return gf.rows_range, gr.rows_add_range, row_blocks
    return gf.cols_range, gr.cols_add_range, -(-p // gf.COLS_BLOCK)


class Finish:
    """act(y + bias) in place over an output's rows [R, L] (row r has channel r % C): one compiled
    pass where isthmus.jit serves and the activation is a clamp (none, relu, relu6), else numpy's
    add and activation (two passes, each a call: at batch 1 about as long as a small GEMM)."""

    def __init__(self, xp, act, activation: str):
        self.xp, self.act, self.clamp = xp, act, _CLAMPS.get(activation)

    def __call__(self, y, bias, addend=None):
        """addend: an array of y's shape added before the activation (a residual), or None."""
        xp, act = self.xp, self.act
        if bias is not None and self.clamp is not None and compiled_ok(xp, y.dtype) and bias.dtype == y.dtype:
            t = y.dtype.type
            if addend is not None:
                from ...jit.bias_clamp import bias_add_clamp_rows  # deferred: jit.bias_clamp loads numba
                bias_add_clamp_rows(y, bias.reshape(-1), addend.reshape(y.shape), t(self.clamp[0]), t(self.clamp[1]))
                return y
            from ...jit.bias_clamp import bias_clamp_rows  # deferred: jit.bias_clamp loads numba
            bias_clamp_rows(y, bias.reshape(-1), t(self.clamp[0]), t(self.clamp[1]))
            return y
        if bias is not None:
            yv = y.reshape(-1, bias.size, y.shape[-1])  # (image, channel) rows
            xp.add(yv, bias.reshape(1, -1, 1), out=yv)
        if addend is not None:
            xp.add(y, addend.reshape(y.shape), out=y)
        if act is not None:
            act(y)
        return y


class Pointwise:
    """A 1x1 convolution as one matrix product per image ([O, C] @ [C, H*W], no im2col), in
    groups of images whose output fits in cache, each finished (bias, activation) in place
    before the next group is computed. When the output has more channels than the input (an
    expansion), the bias rides in the product instead: [W | b] @ [x; 1] costs a copy of the
    smaller input rather than a pass over the larger output. Where the compiled kernels serve
    (isthmus.jit) and the activation is a clamp (none, relu, relu6), the bias and the clamp are
    one compiled pass after each group's product instead (no copy of the input, one pass)."""

    def __init__(self, xp, act, activation: str = "none"):
        self.xp, self.act = xp, act
        self._clamp = _CLAMPS.get(activation)
        self._aug = None  # (w, bias, [W | b]) for immutable w and bias
        self._packed = PackedGemm(activation)

    def __call__(self, x, w, bias, addend=None):
        """act(W @ x + bias (+ addend, of the output's shape)) as [N, O, H*W]."""
        xp = self.xp
        n, c = x.shape[0], x.shape[1]
        o, hw = w.shape[0], x.shape[2] * x.shape[3]
        xs = x.reshape(n, c, hw)
        out = xp.empty((n, o, hw), dtype=x.dtype)
        r = None if addend is None else xp.ascontiguousarray(addend).reshape(n, o, hw)
        step = max(1, _POINTWISE_CHUNK_BYTES // (o * hw * x.dtype.itemsize))
        if n == 1 and self._packed.pays(xp, x, w, bias, c, hw) and (r is None or r.dtype == np.float32):
            self._packed(w, bias, xs[0], out[0], None if r is None else r[0])
            return out
        if n > 1 and self._packed.batch_pays(xp, x, w, bias, hw) and (r is None or r.dtype == np.float32):
            self._packed.images(w, bias, xs, out, r)
            return out
        if bias is not None and self._clamp is not None and compiled_ok(xp, x.dtype) \
                and (r is None or r.dtype == x.dtype):
            if x.dtype == np.float32 and numpy_blas.sgemm() is not None:
                self._blas_images(xs, w.reshape(o, c), bias, out, r)
                return out
            images = self._compiled_finish(xs, w.reshape(o, c), bias, out, step, r)
        elif bias is not None and c < o and r is None:
            images = self._augmented_images(xs, self._augmented(w, bias, x.dtype), out, step)
        else:
            images = self._plain_images(xs, w.reshape(o, c), bias, out, step, r)
        # image groups on the intra-op threads, every product on one BLAS thread: a threaded BLAS
        # on products this small waits for its other threads, milliseconds each on a busy machine
        rows_apply(xp, images, n, out.nbytes + x.nbytes, blas_inside=True, flops=2 * out.size * c)
        return out

    def packed_runner(self, x, w, bias):
        """PackedGemm.runner for this node's batch-1 calls (conv_bound), or None."""
        return self._packed.runner(self.xp, x, w, bias)

    def _plain_images(self, xs, w2, bias, out, step, r=None):
        xp, act = self.xp, self.act
        b = None if bias is None else bias.reshape(1, -1, 1)

        def images(lo, hi):
            for i in range(lo, hi, step):
                y = out[i:min(hi, i + step)]
                xp.matmul(w2, xs[i:i + y.shape[0]], out=y)
                if b is not None:
                    xp.add(y, b, out=y)
                if r is not None:
                    xp.add(y, r[i:i + y.shape[0]], out=y)
                if act is not None:
                    act(y)
        return images

    def _augmented_images(self, xs, wa, out, step):
        xp, act = self.xp, self.act
        c, hw = xs.shape[1], xs.shape[2]

        def images(lo, hi):
            k = min(step, hi - lo)
            size = k * (c + 1) * hw * xs.dtype.itemsize
            # a scratch arena of the depthwise pool (still in cache from the node before), last rows ones
            mem = ARENAS.take(xp, size)
            try:
                xa = mem[:size].view(xs.dtype).reshape(k, c + 1, hw)
                xa[:, c] = 1
                for i in range(lo, hi, step):
                    m = min(step, hi - i)
                    xa[:m, :c] = xs[i:i + m]
                    y = out[i:i + m]
                    xp.matmul(wa, xa[:m], out=y)
                    if act is not None:
                        act(y)
            finally:
                ARENAS.give(xp, mem)
        return images

    def _blas_images(self, xs, w2, bias, out, r=None) -> None:
        """A batch's images as one compiled call per block of them (jit.par_blas.pointwise_blas_range:
        numpy's own sgemm per image, then the bias, addend and clamp), split by prange where it pays
        (par_rows, BLAS held to one thread): the numpy path's products and finish, so its bytes."""
        from ...jit.par_blas import pointwise_blas_range  # deferred: loads numba
        o = w2.shape[0]
        lo, hi = np.float32(self._clamp[0]), np.float32(self._clamp[1])
        b = np.ascontiguousarray(bias.reshape(o), dtype=np.float32)
        w2 = np.ascontiguousarray(w2, dtype=np.float32)
        rr = _NO_ADDEND if r is None else r
        par_rows(pointwise_blas_range, (numpy_blas.sgemm(), w2, np.ascontiguousarray(xs), out, b, rr, lo, hi),
                 xs.shape[0], 2 * out.size * xs.shape[1], flops=True, blas_inside=True)

    def _compiled_finish(self, xs, w2, bias, out, step, r=None):
        from ...jit.bias_clamp import bias_add_clamp_rows, bias_clamp_rows  # deferred: loads numba
        o = w2.shape[0]
        dt = out.dtype.type
        lo_, hi_ = dt(self._clamp[0]), dt(self._clamp[1])
        b = bias.reshape(o)
        b = b if b.dtype == out.dtype and b.flags.c_contiguous else np.ascontiguousarray(b, dtype=out.dtype)
        w2 = w2 if w2.dtype == out.dtype else w2.astype(out.dtype)
        matmul = self.xp.matmul

        def images(lo, hi):
            for i in range(lo, hi, step):
                y = out[i:min(hi, i + step)]
                matmul(w2, xs[i:i + y.shape[0]], out=y)
                if r is None:
                    bias_clamp_rows(y.reshape(-1, y.shape[2]), b, lo_, hi_)
                else:
                    bias_add_clamp_rows(y.reshape(-1, y.shape[2]), b, r[i:i + y.shape[0]].reshape(-1, y.shape[2]),
                                        lo_, hi_)
        return images

    def _augmented(self, w, bias, dtype):
        cached = self._aug
        if cached is not None and cached[0] is w and cached[1] is bias:
            return cached[2]
        o = w.shape[0]
        wa = self.xp.concatenate([w.reshape(o, -1), bias.reshape(o, 1)], axis=1).astype(dtype, copy=False)
        if _immutable(w) and _immutable(bias):
            self._aug = (w, bias, wa)  # holding w and bias keeps their identities unique
        return wa


def addend_finish(xp, activation: str):
    """f(y, r) -> act(y + r), in place in y (the convolution's fresh output): one compiled pass where
    isthmus.jit serves (float32, the clamp of none, relu or relu6), else numpy's add and activation.
    An addend that only broadcasts to y (unknown dims that differed at run time) gets numpy's
    broadcasting add into a new array."""
    act = activation_inplace(xp, activation)
    lo, hi = _CLAMPS[activation]

    def finish(y, r):
        if r.shape != y.shape or not getattr(y.flags, "writeable", True):  # cupy arrays have no such flag
            return act(xp.add(y, r))
        if (compiled_ok(xp, y.dtype) and y.dtype == np.float32 and r.dtype == y.dtype
                and y.flags.c_contiguous and r.flags.c_contiguous):
            from ...jit.bias_clamp import add_clamp  # deferred: loads numba
            add_clamp(y.reshape(-1), r.reshape(-1), np.float32(lo), np.float32(hi))
            return y
        xp.add(y, r, out=y)
        return act(y)
    return finish
