"""Inference float32 convolutions (groups 1) image by image: without im2col where jit.conv_direct
pays (output channels in the lanes, 16s of them, K >= 192) or jit.conv_wide does (stride 1, wide
planes); else the im2col gather with the padding written in place (no padded copy) at a
cache-friendly row stride, then the packed GEMM with bias and clamp (jit.gemm_f32) where it beats
BLAS, else BLAS and the bias + activation finish. Batch 1 always; a batch of images as compiled
calls over chunks of images where the packed kernels serve."""
from __future__ import annotations

import numpy as np

from ... import jit
from .conv_bound import PackedOnce, pack_channels, pack_tile
from .depthwise import ARENAS, _CLAMPS, _immutable
from .intra_op import serial_blas
from .par_gate import may_split, prange_threads, split_rows

_MAX_PLANS = 8  # input shapes whose geometry a node keeps
_NO_ADDEND = np.empty((0, 0, 0), np.float32)  # jit.conv_direct's "no residual addend"
_NO_ADDEND_2D = np.empty((0, 0), np.float32)  # the same for one image (blocks_range)
# a batch-1 conv_direct splits by pixel blocks from this many (else by output channel blocks)
_MIN_PIXEL_BLOCKS = 4


def tile_ok() -> bool:
    """Whether jit.gemm_f32's register tile runs here (AVX2)."""
    from ...jit.gemm_f32 import supported  # deferred: loads llvmlite, numba
    return supported()


def _wide_pays(c: int, g) -> bool:
    """Where jit.conv_wide (no im2col; the output at the padded width) beat im2col + the packed GEMM,
    one thread: stride 1 on planes of 28+ columns (0.78-0.92x its time from 28x28 to 48x48), or of 16+
    with 32+ channels (0.9-0.95x); on 12x12, on 24x24 with 16 channels, and on the CNN's one-channel
    5x5 (k = 25: im2col is cheap there) it lost (1.1-1.6x)."""
    return (g.sh, g.sw) == (1, 1) and c * g.kh * g.kw >= 64 and (g.ow >= 28 or (g.ow >= 16 and c >= 32))


def direct_pays(o: int, k: int, g, batch: bool = False) -> bool:
    """Where jit.conv_direct (no im2col, output channels in the lanes) beat im2col + the packed GEMM
    and jit.conv_wide: node CPU times, one thread, with its layout pass in 8 x 8 register blocks.
    Batch 1: K 72-144 0.83-0.97x (16 -> 64 3x3 on 24x24 0.92x, 8 -> 16 0.84x), a 1-channel 5x5 (K 25)
    0.95x, 3 channels 5x5 (K 75) 0.95x; before that pass it won from K 192 (the CNN's 32 -> 64 5x5
    on 14x14 0.83x, 32x96x96 3x3/s2 -> 16 0.58x, 3-channel 7x7/s2 stems 0.84-0.87x). Batch 32: 0.79x
    (8 -> 16 on 24x24) to 0.95x. It lost on 3-channel 3x3 stride-2 stems (K 27: 1.1-1.27x at batch 1,
    even at 32), hence K >= 32. Output channels a multiple of 16 (its two vectors), kernels past 1x1.
    Since its pixel blocks (828ed53) a batch-1 stem of K < 32 with at most 32 outputs wins too, in
    the whole model (one thread, load 3-5): MobileNetV2-96's 3 -> 32 3x3/s2 91 against 94-127 us, the
    CNN's 1 -> 32 5x5 30-32 against 34; with 64 outputs (SqueezeNet's stem) it lost (146-155 against
    158 us), and at batch 32 the CNN's 1.1x."""
    return o % 16 == 0 and g.kh * g.kw > 1 and (k >= 32 or (o <= 32 and not batch))


def _packed_pays(o: int, k: int, p: int, batch: bool = False) -> bool:
    """Where jit.gemm_f32's packed kernel (weights packed once, bias and clamp in the epilogue, x at
    leading_dim's stride) beat BLAS + the finish pass, one thread: 1.0-1.4x for 36 to 576 pixels
    up to k = 576 and beyond 576 pixels for shallow k (<= 64); 0.8-1.0x on 1024+ pixels with
    k >= 147 (32-128 outputs; measured at load 3, thread CPU time). A batch's alternatives cost
    more (row taps' passes around BLAS, or jit.conv_images at a conflicting row stride): at batch
    32, up to k = 576 at any size, 0.69-0.95x their time against main's conv_rows (Inception's
    32x32x32 3x3: 23.1 -> 16.0 ms); k = 800 (the CNN's 5x5 over 32 channels) 1.13x and k = 864 on
    8x8 1.05x.
    Batch 1's 3-channel 7x7 stems (k = 147): 0.87x BLAS's time on 1024 pixels, 1.08x on 12544."""
    from ...jit.gemm_f32 import supported  # deferred: loads llvmlite, numba
    if batch:
        return o % 4 == 0 and p >= 16 and k <= 576 and supported()
    return o % 4 == 0 and p >= 16 and (p <= 576 or k <= 64 or (k <= 160 and p <= 4096)) and supported()


class OneImage:
    """One node's batch-1 convolution: per input shape the geometry and the GEMM choice, per
    constant weights their packed copy."""

    def __init__(self, activation: str, finish):
        self.clamp, self.finish = _CLAMPS.get(activation), finish
        if self.clamp is not None:
            self._lo, self._hi = np.float32(self.clamp[0]), np.float32(self.clamp[1])
        self._fns = None  # the compiled kernels, imported at the first call
        self._plans = {}
        self._weights = PackedOnce(pack_tile)  # for jit.gemm_f32's tile
        self._direct_weights = PackedOnce(pack_channels)  # by output channels, for jit.conv_direct

    def __call__(self, x, w, g, bias, addend=None):
        """act(conv(x, w) + bias (+ addend, of the output's shape)) for one image x [1, C, H, W]."""
        _, c, h, wd = x.shape
        o = w.shape[0]
        plan = self._plans.get(x.shape)
        if plan is None:
            plan = self._plan(x.shape, w, g)
        geo, k, p, ldx, packed, wide, direct = plan
        # packed weights are kept only for constants: a hit needs no checks
        packed = packed and (self._weights.holds(w, bias) or (_immutable(w) and (bias is None or _immutable(bias))))
        fns = self._fns or self._load()
        r = None if addend is None else np.ascontiguousarray(addend, np.float32).reshape(1, o, p)
        if packed and direct is not None:
            return self._direct(x, w, g, bias, direct, r)
        if packed and wide is not None:
            return self._wide(x, w, g, bias, wide, r)
        mem = ARENAS.take(np, k * ldx * 4)
        try:
            cols = mem[:k * ldx * 4].view(np.float32).reshape(k, ldx)
            out = np.empty((1, o, g.oh, g.ow), np.float32)
            y = out.reshape(o, p)
            x2 = np.ascontiguousarray(x).reshape(c, h * wd)
            if packed and r is not None:
                from ...jit.gemm_residual import conv_images_ld_add  # deferred: loads llvmlite, numba
                wp, b = self._packed(w, bias)
                conv_images_ld_add(x2.reshape(1, c, h * wd), h, wd, geo, wp, b, self._lo, self._hi,
                                   out.reshape(1, o, p), r, ldx, 0, 1)
            elif packed:
                wp, b = self._packed(w, bias)
                self._packed_image(x2, h, wd, geo, wp, b, y, cols)
            else:
                fns[0](x2, h, wd, geo, cols)
                serial_blas(np, lambda: np.matmul(w.reshape(o, k), cols[:, :p], out=y))
                self.finish(y, bias, None if r is None else r[0])
        finally:
            ARENAS.give(np, mem)
        return out

    def _direct(self, x, w, g, bias, direct, r=None):
        """jit.conv_direct (no im2col: output channels in the lanes, pixels broadcast from the padded
        image; a batch's images split by FLOPs: par_gate.split_rows); r [N, O, OH OW] the addend or None."""
        from ...jit.conv_direct import PB, conv_direct_images  # deferred: loads llvmlite, numba
        n, c, h, wd = x.shape
        o, p = w.shape[0], g.oh * g.ow
        koff, pix, wp, size = direct
        wt, b = self._channels(w, bias)
        x3 = np.ascontiguousarray(x).reshape(n, c, h * wd)
        out = np.empty((n, o, g.oh, g.ow), np.float32)
        args = (x3, h, wd, g.pads[0][0], g.pads[1][0], wp, koff, pix, wt, b, self._lo, self._hi, out.reshape(n, o, p),
                _NO_ADDEND if r is None else r, size)
        flops = 2 * n * o * p * c * g.kh * g.kw
        pixel_blocks = -(-pix.shape[0] // PB)
        if n == 1 and may_split(max(pixel_blocks, o // 16), flops, flops=True):
            self._direct_blocks(x3[0], h, wd, g, wp, koff, pix, wt, b, out.reshape(o, p),
                                _NO_ADDEND_2D if r is None else r[0], size, flops)
        elif n == 1:
            conv_direct_images(*args, 0, 1)
        else:
            split_rows(conv_direct_images, args, n, flops, flops=True)
        return out

    def _direct_runner(self, x, w, g, bias, direct):
        """run(x, r) for _direct at batch 1, this shape and these weights (conv_bound): the packing, the
        block kind (_direct_blocks') and the driver worked out once; the split by prange where
        split_rows would take it, one whole call where no split pays, and _direct itself otherwise
        (the pool's split). The same kernels on the same cuts: the same bytes."""
        cd = jit.loaded("conv_direct")
        _, c, h, wd = x.shape
        o, p = w.shape[0], g.oh * g.ow
        koff, pix, wp, size = direct
        wt, b = self._channels(w, bias)
        flops = 2 * o * p * c * g.kh * g.kw
        pixel_blocks = -(-pix.shape[0] // cd.PB)
        asked = max(pixel_blocks, o // 16)  # the blocks _direct asks may_split about
        if pixel_blocks >= _MIN_PIXEL_BLOCKS or pixel_blocks >= o // cd.NC:
            total, product = pixel_blocks, jit.loaded("par").driver(cd.blocks_range)
        else:
            total, product = o // cd.NC, jit.loaded("par").driver(cd.channels_range)
        top, left, lo, hi, out_shape = g.pads[0][0], g.pads[1][0], self._lo, self._hi, (1, o, g.oh, g.ow)
        whole, pad_image = cd.conv_direct_images, cd.pad_image

        def run(x, r):
            r3 = None if r is None else np.ascontiguousarray(r, np.float32).reshape(1, o, p)
            if not may_split(asked, flops, flops=True):
                x3 = np.ascontiguousarray(x).reshape(1, c, h * wd)
                out = np.empty(out_shape, np.float32)
                whole(x3, h, wd, top, left, wp, koff, pix, wt, b, lo, hi, out.reshape(1, o, p),
                      _NO_ADDEND if r3 is None else r3, size, 0, 1)
                return out
            k = prange_threads(total, flops, flops=True)
            if not k:
                return self._direct(x, w, g, bias, direct, r3)
            out = np.empty(out_shape, np.float32)
            pad = np.zeros(size, np.float32)
            pad_image(np.ascontiguousarray(x).reshape(c, h * wd), h, wd, top, left, wp, pad)
            product(k, total, pad, koff, pix, wt, b, lo, hi, out.reshape(o, p), _NO_ADDEND_2D if r3 is None else r3[0])
            return out
        return run

    def _direct_blocks(self, x2, h, wd, g, wp, koff, pix, wt, b, y, r, size, flops):
        """One image's conv_direct split (par_gate.split_rows: each block computed alone, the same bytes
        however they are cut), the padded copy made first: by its blocks of PB output pixels where there
        are at least _MIN_PIXEL_BLOCKS of them (fewer leave threads idle: 3 blocks on 2 threads run
        as 2), else by its blocks of 16 output channels (each thread streams its own weights: the
        small planes of deep layers, whose weights outweigh their pixels)."""
        cd = jit.loaded("conv_direct")
        pad = np.zeros(size, np.float32)
        cd.pad_image(x2, h, wd, g.pads[0][0], g.pads[1][0], wp, pad)
        args = (pad, koff, pix, wt, b, self._lo, self._hi, y, r)
        pixel_blocks = -(-pix.shape[0] // cd.PB)
        if pixel_blocks >= _MIN_PIXEL_BLOCKS or pixel_blocks >= y.shape[0] // cd.NC:
            split_rows(cd.blocks_range, args, pixel_blocks, flops, flops=True)
        else:
            split_rows(cd.channels_range, args, y.shape[0] // cd.NC, flops, flops=True)

    def _channels(self, w, bias):
        """conv_direct's packing of constant weights ([O/16, K, 16]) and the bias as float32, kept."""
        return self._direct_weights.get(w, bias)

    def _wide(self, x, w, g, bias, wide, r=None):
        """Stride 1 on wide planes: jit.conv_wide's implicit im2col (a batch's images split by FLOPs:
        par_gate.split_rows); r [N, O, OH OW] the addend or None."""
        n, c, h, wd = x.shape
        o = w.shape[0]
        starts, plane, wp, cols, size = wide
        wpk, b = self._packed(w, bias)
        x3 = np.ascontiguousarray(x).reshape(n, c, h * wd)
        out = np.empty((n, o, g.oh, g.ow), np.float32)
        o3 = out.reshape(n, o, g.oh * g.ow)
        t, l = g.pads[0][0], g.pads[1][0]
        args = (x3, h, wd, t, l, starts, plane, wp, cols, wpk, b, self._lo, self._hi, o3, g.oh, g.ow, size)
        fn = self._fns[2]
        if r is not None:
            from ...jit.conv_wide import conv_wide_images_add  # deferred: loads llvmlite, numba
            fn, args = conv_wide_images_add, args[:14] + (r,) + args[14:]
        if n == 1:
            fn(*args, 0, 1)
        else:
            split_rows(fn, args, n, 2 * n * o * g.oh * g.ow * c * g.kh * g.kw, flops=True)
        return out

    def runner(self, x, w, g, bias):
        """run(x, r) -> [1, O, OH, OW] for batch 1 at x's shape where the packed GEMM serves these
        constant weights, else None: __call__'s packed paths without their checks (conv_bound)."""
        if x.shape[0] != 1:
            return None
        geo, k, p, ldx, packed, wide, direct = self._plans.get(x.shape) or self._plan(x.shape, w, g)
        if not (packed and _immutable(w) and (bias is None or _immutable(bias))):
            return None
        _, c, h, wd = x.shape
        o = w.shape[0]
        fns = self._fns or self._load()
        if direct is not None:
            return self._direct_runner(x, w, g, bias, direct)
        if wide is not None:
            return lambda x, r: self._wide(x, w, g, bias, wide,
                                           None if r is None else np.ascontiguousarray(r, np.float32).reshape(1, o, p))
        from ...jit.gemm_residual import conv_images_ld_add  # deferred: loads llvmlite, numba
        wp, b = self._packed(w, bias)
        lo, hi = self._lo, self._hi

        def run(x, r):
            out = np.empty((1, o, g.oh, g.ow), np.float32)
            x2 = x.reshape(c, h * wd)
            if r is not None:
                conv_images_ld_add(x2.reshape(1, c, h * wd), h, wd, geo, wp, b, lo, hi, out.reshape(1, o, p),
                                   np.ascontiguousarray(r, np.float32).reshape(1, o, p), ldx, 0, 1)
                return out
            mem = ARENAS.take(np, k * ldx * 4)
            try:
                self._packed_image(x2, h, wd, geo, wp, b, out.reshape(o, p), mem[:k * ldx * 4].view(np.float32).reshape(k, ldx))
            finally:
                ARENAS.give(np, mem)
            return out
        return run

    def _packed_image(self, x2, h, wd, geo, wp, b, y, cols):
        """One image's im2col + packed GEMM (jit.gemm_f32.conv_image_ld) into y [O, P], cols its [K, ldx]
        scratch: where par_gate says the product splits (a stem's thousands of pixels), the gather
        first, then the GEMM by blocks of COLS_BLOCK columns (gemm_f32.cols_range: each panel gets
        the whole call's tiles, so the same bytes)."""
        fns = self._fns or self._load()
        gf = fns[3]
        k, ldx = cols.shape
        o, p = y.shape
        flops = 2 * o * k * p
        blocks = -(-p // gf.COLS_BLOCK)
        if may_split(blocks, flops, flops=True):
            gf.im2col_ld(x2, h, wd, geo, cols)
            split_rows(gf.cols_range, (wp, b, cols.reshape(k * ldx), ldx, k, p, self._lo, self._hi, y), blocks, flops,
                       flops=True)
            return
        fns[1](x2, h, wd, geo, wp, b, self._lo, self._hi, y, cols)

    def _load(self):
        from ...jit.conv_wide import conv_wide_images  # deferred: loads llvmlite, numba
        from ...jit.gemm_f32 import conv_image_ld, im2col_ld  # deferred: loads llvmlite, numba
        from ...jit import gemm_f32  # deferred: loads llvmlite, numba (its cols_range splits a stem's product)
        self._fns = (im2col_ld, conv_image_ld, conv_wide_images, gemm_f32)
        return self._fns

    def batch_pays(self, x, w, bias, g) -> bool:
        """Whether a batch runs here (compiled, per image): the packed GEMM serves its per-image
        shape and the weights (and bias) are constants."""
        plan = self._plans.get(x.shape) or self._plan(x.shape, w, g)
        return plan[4] and _immutable(w) and (bias is None or _immutable(bias))

    def batch(self, x, w, g, bias, addend=None):
        """batch_pays' convolutions: a compiled call over each block of images, split by FLOPs
        (par_gate.split_rows; addend: an array of the output's shape added before the clamp, or None)."""
        from ...jit.gemm_f32 import conv_images_ld  # deferred: loads llvmlite, numba
        n, c, h, wd = x.shape
        o = w.shape[0]
        geo, k, p, ldx, _, wide, direct = self._plans[x.shape]
        r = None if addend is None else np.ascontiguousarray(addend, np.float32).reshape(n, o, p)
        if direct is not None:
            return self._direct(x, w, g, bias, direct, r)
        if wide is not None:
            if self._fns is None:
                self._load()
            return self._wide(x, w, g, bias, wide, r)
        wp, b = self._packed(w, bias)
        lo, hi = np.float32(self.clamp[0]), np.float32(self.clamp[1])
        x3 = np.ascontiguousarray(x).reshape(n, c, h * wd)
        out = np.empty((n, o, g.oh, g.ow), np.float32)
        o3 = out.reshape(n, o, p)
        if r is not None:
            from ...jit.gemm_residual import conv_images_ld_add  # deferred: loads llvmlite, numba
            split_rows(conv_images_ld_add, (x3, h, wd, geo, wp, b, lo, hi, o3, r, ldx), n, 2 * n * o * k * p, flops=True)
            return out
        split_rows(conv_images_ld, (x3, h, wd, geo, wp, b, lo, hi, o3, ldx), n, 2 * n * o * k * p, flops=True)
        return out

    def _plan(self, shape, w, g):
        from ...jit.gemm_f32 import leading_dim  # deferred: loads llvmlite, numba
        k, p = shape[1] * g.kh * g.kw, g.oh * g.ow
        (t, b), (l, r) = g.pads
        geo = np.array([g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, t, b, l, r, g.oh, g.ow], np.int64)
        ok = self.clamp is not None and w.dtype == np.float32
        # without im2col the packed GEMM also beats im2col + BLAS where _packed_pays alone says no
        # (Inception's 32x32x32 3x3 at batch 1: 503 against 596 us with im2col, BLAS about the same)
        direct = None
        if ok and direct_pays(w.shape[0], k, g, shape[0] > 1) and tile_ok():
            from ...jit.conv_direct import tables  # deferred: loads llvmlite, numba
            direct = tables(shape[1], shape[2], shape[3], g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, t, l, b, r, g.oh, g.ow)
        widen = direct is None and ok and w.shape[0] % 4 == 0 and _wide_pays(shape[1], g) and tile_ok()
        packed = widen or direct is not None or (ok and _packed_pays(w.shape[0], k, p, shape[0] > 1))
        wide = None
        if widen:
            from ...jit.conv_wide import plan as wide_plan  # deferred: loads llvmlite, numba
            wide = wide_plan(shape[1], shape[2], shape[3], g.kh, g.kw, g.dh, g.dw, t, b, l, r)
        plan = (geo, k, p, leading_dim(p) if packed else p, packed, wide, direct)
        if len(self._plans) >= _MAX_PLANS:
            self._plans.clear()
        self._plans[shape] = plan
        return plan

    def _packed(self, w, bias):
        return self._weights.get(w, bias)

