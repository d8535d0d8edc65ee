"""The edge kernels' compiled paths (isthmus.jit, numba), and the checks that keep them exact.

numpy runs a depthwise convolution as an im2col copy (kh*kw times the input) and an einsum over
it; the compiled kernels make one pass per (image, channel) row with the taps in registers
(fp32: jit.depthwise; int8: jit.depthwise_int8, requantizing in the same loop), or, for 3x3
kernels on AVX2 hosts, one pass per 8 channels interleaved into vectors (jit.depthwise_blocked,
fp32 and int8 alike). Batch-1 GEMM convolutions with constant weights run jit.gemm_f32 (weights
packed once, bias and clamp in the epilogue) after a compiled pad and im2col. Chains of numpy
passes after a GEMM (bias + clamp, the int8 requantizations) become one compiled loop each.
Whether a kernel uses them is decided once, when it is prepared (`use_compiled`: numba imports
and ISTHMUS_JIT is not 0): the choice fixes the scratch the arena plans (`depthwise_scratch_elems`:
one padded plane, or a padded block of 8 channels and its output block), so it cannot change per
call. numba itself is imported when the first such kernel is bound, never at `import isthmus.edge`.

int8 runs float kernels on exact integers, so the result is the numpy path's bit for bit: see
`exact_int8_bias`; the requantizations repeat numpy's float operations one for one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import numpy as np

from ..jit import available as _jit_available  # the leaf package only: never core
from .opcontext import Window
from .quant import MAGIC, MAGIC32

CLAMPS = {"none": (-math.inf, math.inf), "relu": (0.0, math.inf), "relu6": (0.0, 6.0)}
_MANTISSA = {np.dtype(np.float32): (24, -149), np.dtype(np.float64): (53, -1074)}  # bits, smallest exponent


def use_compiled() -> bool:
    """Whether a depthwise kernel prepared now runs compiled (read per prepare: tests flip ISTHMUS_JIT)."""
    return _jit_available()


@dataclass(frozen=True)
class _Geometry:
    """What jit.depthwise.depthwise_rows reads of a convolution's geometry."""
    pads: Tuple[Tuple[int, int], Tuple[int, int]]
    sh: int
    sw: int
    dh: int
    dw: int


def blocked_depthwise(g: Window, kh: int, kw: int) -> bool:
    """Whether a depthwise convolution of this geometry can run channel-blocked (jit.depthwise_blocked:
    3x3, dilation 1, any stride) on this host (compiled kernels on, AVX2)."""
    if not (kh == kw == 3 and g.dh == g.dw == 1 and use_compiled()):
        return False
    from ..jit.gemm_int8 import supported  # deferred: loads llvmlite, numba
    return supported()


def depthwise_scratch_elems(g: Window, kh: int, kw: int, blocked: bool = False) -> int:
    """float32 elements of arena scratch the compiled depthwise kernel works in (its padded plane;
    blocked: the padded block of 8 channels and its output block)."""
    if blocked:
        from ..jit.depthwise_blocked import blocked_scratch_elems  # deferred: loads numba
        return blocked_scratch_elems(g.h + g.t + g.b, g.w + g.l + g.r, g.oh, g.ow)
    from ..jit.depthwise import scratch_elems  # deferred: jit.depthwise loads numba
    return scratch_elems((g.h, g.w), (kh, kw), _Geometry(((g.t, g.b), (g.l, g.r)), g.sh, g.sw, g.dh, g.dw))


def bind_rows(x3: np.ndarray, w3: np.ndarray, bias: np.ndarray, g: Window, lo: float, hi: float,
              out3: np.ndarray, scratch: Optional[np.ndarray] = None) -> Callable[[], None]:
    """A step writing out3 [R, OH, OW] = clamp(bias + depthwise(x3 [R, H, W], w3 [C, kh, kw]), lo, hi).
    Every array is contiguous, writeable (numba compiles read-only arrays as another type) and of
    one float dtype; bias is [C] (zeros for none). Imports numba on the first call."""
    from ..jit.depthwise import depthwise_rows  # deferred: jit.depthwise loads numba
    for name, a in (("x", x3), ("weights", w3), ("bias", bias), ("out", out3)):
        if not (a.flags.c_contiguous and a.flags.writeable) or a.dtype != x3.dtype:
            raise ValueError(f"compiled depthwise: {name} must be contiguous, writeable {x3.dtype}")
    geo = _Geometry(((g.t, g.b), (g.l, g.r)), g.sh, g.sw, g.dh, g.dw)
    rows = x3.shape[0]

    def run():
        depthwise_rows(x3, w3, bias, geo, lo, hi, out3, 0, rows, scratch)
    return run


def bind_blocked(x3: np.ndarray, w3: np.ndarray, bias: Optional[np.ndarray], g: Window, lo: float, hi: float,
                 out3: np.ndarray, scratch: np.ndarray) -> Callable[[], None]:
    """A step writing out3 [N*C, OH, OW] = clamp(bias + depthwise(x3 [N*C, H, W], w3 [C, 3, 3]), lo, hi)
    with channels blocked by 8 (jit.depthwise_blocked); float32, x3 and out3 contiguous arena views,
    w3 and bias constant (blocked here, once); scratch of depthwise_scratch_elems(..., blocked=True)."""
    from ..jit.depthwise_blocked import block_weights, blocked_rows  # deferred: loads numba
    for name, a in (("x", x3), ("out", out3)):
        if not (a.flags.c_contiguous and a.flags.writeable) or a.dtype != np.float32:
            raise ValueError(f"blocked depthwise: {name} must be a contiguous, writeable float32 array")
    wb, bb = block_weights(w3, bias)
    hp, wp = g.h + g.t + g.b, g.w + g.l + g.r
    pb, ob = scratch[:hp * wp * 8], scratch[hp * wp * 8:(hp * wp + g.oh * g.ow) * 8]
    args = (x3, np.float32(0), w3.shape[0], wb, bb, g.t, g.l, wp, g.sh, g.sw, np.float32(lo), np.float32(hi),
            False, np.float32(0), np.int32(0), out3, pb, ob)

    def run():
        blocked_rows(*args)
    return run


def packed_gemm(o: int, k: int, p: int, const_weights: bool) -> bool:
    """Whether a convolution's GEMM of o outputs, k inputs (channels x taps) over p pixels (batch 1)
    runs jit.gemm_f32 (weights packed once, bias and clamp in the epilogue) rather than BLAS and a
    bias pass: constant weights, o a multiple of 4, at least 16 pixels, k <= 256 (the core CNN's
    k = 800 ran as fast as BLAS, no gain; on 6x6 planes k = 384 and 576 ran slower), AVX2, compiled
    kernels on. MobileNet's 6x6 planes with k <= 192: 0.5-0.9x BLAS + the bias pass (loaded machine)."""
    if not (const_weights and o % 4 == 0 and p >= 16 and k <= 256 and use_compiled()):
        return False
    from ..jit.gemm_int8 import supported  # deferred: loads llvmlite, numba
    return supported()


def bind_packed_gemm(w2: np.ndarray, bias: Optional[np.ndarray], x2: np.ndarray, y2: np.ndarray, lo: float, hi: float,
                     panel: np.ndarray, tile: np.ndarray) -> Callable[[], None]:
    """A step: y2 [O, P] = clamp(w2 [O, K] @ x2 [K, P] + bias, lo, hi) by jit.gemm_f32 (w2 packed here,
    once); panel [K, 16] and tile [O, 16] float32 scratch."""
    from ..jit.gemm_f32 import gemm_bias_clamp, pack_weights  # deferred: loads llvmlite, numba
    wp = pack_weights(w2)
    b = np.zeros(w2.shape[0], np.float32) if bias is None else np.array(bias, np.float32).reshape(-1)
    args = (wp, b, x2, np.float32(lo), np.float32(hi), y2, panel, tile)

    def run():
        gemm_bias_clamp(*args)
    return run


def bind_im2col(x3: np.ndarray, g: Window, xpad3: np.ndarray, cols2: np.ndarray) -> Callable[[], None]:
    """A step: xpad3 [C, Hp, Wp] = x3 [C, H, W] zero padded, then cols2 [C kh kw, OH OW] = its windows
    (one image; jit.gemm_int8.pad_planes and jit.gemm_f32.im2col, compiled passes)."""
    from ..jit.gemm_f32 import im2col  # deferred: loads llvmlite, numba
    from ..jit.gemm_int8 import pad_planes  # deferred: loads llvmlite, numba
    c, hp, wp = xpad3.shape
    flat, zero = xpad3.reshape(c, hp * wp), x3.dtype.type(0)
    args = (wp, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, cols2, g.oh, g.ow)

    def run():
        pad_planes(x3, zero, g.t, g.l, xpad3)
        im2col(flat, *args)
    return run


def bind_int8_rows(x3: np.ndarray, zx: int, w3: np.ndarray, bias: np.ndarray, g: Window, lo: float, hi: float,
                   outf3: Optional[np.ndarray] = None, outq3: Optional[np.ndarray] = None,
                   zy: int = 0, scratch: Optional[np.ndarray] = None, blocked: bool = False) -> Callable[[], None]:
    """A step running jit.depthwise_int8 on int8 x3 [R, H, W]: into outf3 (float, w3's dtype) the
    accumulator clamped to [lo, hi]; or into outq3 (int8) the short requantization fused
    (quant.UniformRequantizer.bind's float32 path: clamp, add 1.5 * 2^23 + zy, low byte), lo and hi
    then being its clamp in the accumulator's domain. bias must make the sums exact (exact_int8_bias)."""
    from ..jit.depthwise_int8 import depthwise_int8_step  # deferred: jit.depthwise_int8 loads numba
    for name, a in (("x", x3), ("weights", w3), ("bias", bias), ("out", outq3 if outf3 is None else outf3)):
        if not (a.flags.c_contiguous and a.flags.writeable):
            raise ValueError(f"compiled int8 depthwise: {name} must be contiguous and writeable")
    if x3.dtype != np.int8 or bias.dtype != w3.dtype or (outf3 is not None and outf3.dtype != w3.dtype):
        raise ValueError("compiled int8 depthwise: int8 x, and one float dtype for weights, bias and out")
    if outq3 is not None and w3.dtype != np.float32:
        raise ValueError("compiled int8 depthwise: the fused requantization is float32's")
    if blocked:  # float32 weights, 3x3: 8 channels at a time (jit.depthwise_blocked), same arithmetic
        return _bind_int8_blocked(x3, zx, w3, bias, g, lo, hi, outf3, outq3, zy, scratch)
    geo = _Geometry(((g.t, g.b), (g.l, g.r)), g.sh, g.sw, g.dh, g.dw)
    return depthwise_int8_step(x3, zx, w3, bias, geo, lo, hi, MAGIC32 + zy, int(MAGIC32), outf3, outq3,
                               scratch=scratch)


def _bind_int8_blocked(x3, zx, w3, bias, g, lo, hi, outf3, outq3, zy, scratch):
    """bind_int8_rows on jit.depthwise_blocked: the block holds x - zx as float32, the sums are exact
    (exact_int8_bias), so any order gives jit.depthwise_int8's result bit for bit."""
    from ..jit.depthwise_blocked import block_weights, blocked_rows  # deferred: loads numba
    if w3.dtype != np.float32 or w3.shape[1:] != (3, 3):
        raise ValueError("blocked int8 depthwise: float32 3x3 weights")
    wb, bb = block_weights(w3, bias)
    hp, wp = g.h + g.t + g.b, g.w + g.l + g.r
    pb, ob = scratch[:hp * wp * 8], scratch[hp * wp * 8:(hp * wp + g.oh * g.ow) * 8]
    quant = outq3 is not None
    args = (x3, np.float32(zx), w3.shape[0], wb, bb, g.t, g.l, wp, g.sh, g.sw, np.float32(lo), np.float32(hi), quant,
            np.float32(MAGIC32 + zy), np.int32(MAGIC32), outq3 if quant else outf3, pb, ob)

    def run():
        blocked_rows(*args)
    return run


def bind_bias_clamp(y2: np.ndarray, bias: Optional[np.ndarray], lo: float, hi: float) -> Callable[[], None]:
    """A step doing y2 [R, L] = clamp(y2 + bias[r % C], lo, hi) in place in one compiled pass
    (jit.bias_clamp); bias None: zeros. A read-only bias (a view of the file) is copied once."""
    from ..jit.bias_clamp import bias_clamp_rows  # deferred: jit.bias_clamp loads numba
    if not (y2.flags.c_contiguous and y2.flags.writeable and y2.ndim == 2):
        raise ValueError("compiled bias and clamp: the output must be a contiguous, writeable [rows, columns]")
    if bias is None:
        bias = np.zeros(1, y2.dtype)
    elif not bias.flags.writeable or not bias.flags.c_contiguous:
        bias = np.ascontiguousarray(bias).copy()
    b1, lo, hi = bias.reshape(-1), y2.dtype.type(lo), y2.dtype.type(hi)

    def run():
        bias_clamp_rows(y2, b1, lo, hi)
    return run


def accumulator_rows(acc: np.ndarray, view: Callable, out: np.ndarray):
    """(acc as [R, stride], out as [R, cols]) where view(acc)'s rows are the first cols of each row
    of acc and out's rows are contiguous in the same order (batch 1, or an output in the
    accumulator's own order); None otherwise, or when the compiled kernels are off."""
    if not use_compiled() or not acc.flags.c_contiguous or not out.flags.writeable:
        return None
    v = view(acc)
    if v.ndim == 0 or v.shape != out.shape or v.size == 0:
        return None
    cols = v.shape[-1]
    try:
        v2 = v.reshape(-1, cols, copy=False)
        o2 = out.reshape(-1, cols, copy=False)
    except (ValueError, TypeError):
        return None
    isz = acc.itemsize
    if v2.strides[1] != isz or not o2.flags.c_contiguous or v2.ctypes.data != acc.ctypes.data \
            or v2.strides[0] % isz or v2.strides[0] < cols * isz:
        return None
    if v2.shape[0] * (v2.strides[0] // isz) != acc.size:
        return None
    return acc.reshape(v2.shape[0], v2.strides[0] // isz), o2


def bind_short_requantization(acc: np.ndarray, view: Callable, out: np.ndarray, lo, hi, magic) \
        -> Optional[Callable[[], None]]:
    """quant.UniformRequantizer's short requantization as one compiled pass (jit.requantize), or None
    where accumulator_rows says no."""
    rows = None if acc.dtype != np.float32 else accumulator_rows(acc, view, out)
    return None if rows is None else bind_requantize_rows(rows[0], None, lo, hi, magic, rows[1])


def bind_uniform_requantization(rq, acc: np.ndarray, view: Callable, out: np.ndarray) -> Optional[Callable[[], None]]:
    """quant.UniformRequantizer's float64 requantization (clamp before, multiply, add, clamp after,
    the low byte or a floor) as one compiled pass, or None where accumulator_rows says no."""
    rows = accumulator_rows(acc, view, out)
    if rows is None:
        return None
    from ..jit.requantize import uniform_requantize_rows  # deferred: jit.requantize loads numba
    a2, o2 = rows
    dt = acc.dtype.type
    before, after = rq.clamp_before and rq.needs_clamp, not rq.clamp_before
    if rq.magic:
        c, flo, fhi, sub, off = MAGIC + rq.zp, MAGIC + rq.lo, MAGIC + rq.hi, MAGIC, 0
    else:
        c, flo, fhi, sub, off = rq.c, float(rq.lo + 128), float(rq.hi + 128), 0.0, 128
    args = (dt(rq.t_lo), dt(rq.t_hi), before, np.float64(rq.m), np.float64(c), np.float64(flo), np.float64(fhi),
            after, np.float64(sub), np.int32(off))

    def run():
        uniform_requantize_rows(a2, *args, o2)
    return run


def bind_channel_requantization(rq, acc4: np.ndarray, out4: np.ndarray) -> Optional[Callable[[], None]]:
    """quant.Requantizer's per-channel float64 requantization of acc4 [O, 1, OH, OW] (channels
    first, batch 1) into out4 of that shape, as one compiled pass; None where the layout or the
    arithmetic (rq.float_ok) does not allow it, or the compiled kernels are off."""
    if not use_compiled() or not rq.float_ok or acc4.dtype.kind != "f" or acc4.ndim != 4 or acc4.shape[1] != 1 \
            or out4.shape != acc4.shape or not out4.flags.writeable:
        return None
    o, _, oh, ow = acc4.shape
    try:
        a2 = acc4.reshape(o * oh, ow, copy=False)
        o2 = out4.reshape(o * oh, ow, copy=False)
    except (ValueError, TypeError):
        return None
    if a2.strides[1] != a2.itemsize or not o2.flags.c_contiguous:
        return None
    from ..jit.requantize import channel_requantize_rows  # deferred: jit.requantize loads numba
    mf = np.ascontiguousarray(np.broadcast_to(np.asarray(rq.mf, np.float64).reshape(-1), (o,)))
    cf = np.ascontiguousarray(np.broadcast_to(np.asarray(rq.cf, np.float64).reshape(-1), (o,)))
    flo, fhi = np.float64(rq.lo + 128), np.float64(rq.hi + 128)

    def run():
        channel_requantize_rows(a2, oh, mf, cf, flo, fhi, o2)
    return run


def bind_requantize_rows(a2: np.ndarray, bias: Optional[np.ndarray], lo, hi, magic, o2: np.ndarray) -> Callable[[], None]:
    """A step: o2 [R, L] (int8) = the short requantization of a2 [R, >= L] (float32) + bias[r % C]."""
    from ..jit.requantize import requantize_rows  # deferred: jit.requantize loads numba
    b = np.zeros(1, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32).copy()
    lo, hi, magic, base = np.float32(lo), np.float32(hi), np.float32(magic), np.int32(MAGIC32)

    def run():
        requantize_rows(a2, b, lo, hi, magic, base, o2)
    return run


def _low_bit(v: np.ndarray) -> np.ndarray:
    """The exponent of each nonzero float64's lowest set bit (v = odd * 2^result)."""
    m, e = np.frexp(np.abs(v))
    mi = (m * 2.0 ** 53).astype(np.int64)  # the 53-bit integer mantissa, exact
    tz = np.zeros_like(mi)
    low = mi & -mi
    nz = low > 0
    tz[nz] = np.log2(low[nz].astype(np.float64)).astype(np.int64)
    return e.astype(np.int64) - 53 + tz


def exact_int8_bias(w: np.ndarray, brow: Optional[np.ndarray], zx: int, spread: int, dtype) -> Optional[np.ndarray]:
    """The bias that makes the compiled kernel on (x - zx) (zero padding) give the numpy path's
    accumulator brow + sum w * x_pad (x_pad padded with zx) exactly, or None when that is not sure.

    w: [C, K] float weights (integers, or integers times powers of two and a short multiplier, as
    the int8 conv makes them), brow: [C] or None. The kernel computes brow + zx * sum_k w + sum_k
    w * (x - zx); on the real interior that is brow + sum w * x, and a padded tap adds w * 0 here
    where the numpy path adds w * zx, which the bias holds. Both are exact, hence bit-identical,
    when every value is a multiple of 2^p_c (per channel c) and every partial sum stays below
    2^(mantissa + p_c): bound |b_c| + spread * sum_k |w_ck|, spread = max |x - zx|.
    """
    dt = np.dtype(dtype)
    bits, smallest = _MANTISSA[dt]
    w64 = w.astype(np.float64)
    b64 = np.zeros(w.shape[0]) if brow is None else np.asarray(brow, np.float64).reshape(-1)
    b = b64 + zx * w64.sum(axis=1)  # exact in float64: tens of products of <= 24-bit values
    if not np.array_equal(b.astype(dt).astype(np.float64), b):
        return None
    vals = np.concatenate([w64, b[:, None]], axis=1)
    low = np.where(vals != 0, _low_bit(vals), np.iinfo(np.int64).max).min(axis=1)
    low = np.where(low == np.iinfo(np.int64).max, 0, low)  # an all-zero channel
    if int(low.min()) < smallest:
        return None
    bound = np.abs(b) + spread * np.abs(w64).sum(axis=1)
    if np.any(np.ldexp(bound, -low) >= 2.0 ** bits):
        return None
    return b.astype(dt)
