"""Forward depthwise convolution (one filter per channel) with its bias and activation; the
compiled (isthmus.jit) forward and gradient kernels are called from here when numba serves.

The input is processed in cache-sized chunks of (image, channel) rows. Each row is padded and
flattened ("wide" layout): with stride 1, kernel tap (i, j) of all output rows is then one
contiguous run of OH*Wp values starting at i*dh*Wp + j*dw (the Wp - OW columns past each
output row's end are junk, dropped when the chunk is written out). A row stride s first splits
the padded rows into s phases (rows py, py+s, ...), so a tap reads one phase; a column stride
is the stride of each tap's run. Per chunk, the taps' runs are copied side by side ([rows,
taps, run], one copy per phase, in cache) and contracted with each row's weights by one
batched matrix-vector product (BLAS; 10-15% faster here than the same contraction by einsum;
the bias is one more weight, against a row of ones), and the activation of the valid columns
is written once into the NCHW output.

Measured against the previous kernel (one im2col of the whole input, 9x its size, then one
einsum), one thread, CPU time, MobileNetV2-96's depthwise layers alone: batch 32 151 -> 67 ms,
batch 1 2.61 -> 2.68 ms; inside the whole network, where the shared per-thread scratch is still
in cache, batch 1 (passes on) 5.2 -> 4.4 ms and the imported network at batch 32 261 -> 130 ms.
Large convolutions also run on as many threads as BLAS has (one BLAS thread: one thread).
"""
from __future__ import annotations

import os
import threading

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ... import jit
from ..threads import intra_pool, intra_threads
from .fused import activation_to

# bytes of one chunk's padded rows, tap columns and result: 1 MiB measured best of 256 KiB to
# 4 MiB here (512 KiB L2 per core, 32 MiB shared L3); 256 KiB pays too many calls at batch 1
CHUNK_BYTES = 1 << 20
_JIT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_ZERO, _ZERO_I = np.float32(0), np.int32(0)  # jit.depthwise_blocked's zero point and requantization terms (float)
_CLAMPS = {"none": (-np.inf, np.inf), "relu": (0.0, np.inf), "relu6": (0.0, 6.0)}
_MAX_LAYOUTS = 8  # input shapes whose layout and scratch (about CHUNK_BYTES each) a node keeps


class DepthwiseConv:
    """One node's depthwise kernel. What depends only on shapes (tap layout, chunk size, phase
    copies) is worked out once per input shape, scratch buffers are reused from call to call
    (a pool, so concurrent runs and threads each take their own), and the weights are tiled
    once when they are immutable (a read-only constant, as after freezing)."""

    def __init__(self, xp, activation: str = "none"):
        self.xp, self.act = xp, activation_to(xp, activation)
        self._layouts = {}
        self._tiled = None  # (w, bias, batch, tiled weights) for immutable w and bias
        self._blocked = None  # (w, bias, blocked weights, blocked bias) for immutable w and bias
        # the compiled kernel (isthmus.jit) clamps in its loop: no activation, relu and relu6;
        # other activations run as a numpy pass over its output
        self._compiled = xp is np
        self._clamp = _CLAMPS.get(activation)
        self._post = None if self._clamp is not None else activation_to(xp, activation)

    def _run_compiled(self, x, w, g, bias):
        """One compiled pass per row (image, channel), rows split over threads like the numpy path."""
        if self._blocked_pays(x, w, g, bias):
            return self._run_blocked(x, w, g, bias)
        from ...jit.depthwise import depthwise_rows  # deferred: jit.depthwise loads numba
        n, c = x.shape[0], x.shape[1]
        rows = n * c
        dt = x.dtype
        xs = np.ascontiguousarray(x).reshape(rows, x.shape[2], x.shape[3])
        wk = np.ascontiguousarray(w.reshape(c, g.kh, g.kw), dtype=dt)
        b = None if bias is None else np.ascontiguousarray(bias.reshape(c), dtype=dt)
        lo, hi = self._clamp if self._clamp is not None else (-np.inf, np.inf)
        out = np.empty((n, c, g.oh, g.ow), dtype=dt)
        orow = out.reshape(rows, g.oh, g.ow)
        _on_threads(depthwise_rows, _split_rows(rows, rows * g.oh * g.ow * g.kh * g.kw), xs, wk, b, g, lo, hi, orow)
        if self._post is not None:
            self._post(out, out)
        return out

    def _blocked_pays(self, x, w, g, bias) -> bool:
        """The edge's channel-blocked kernel (jit.depthwise_blocked: 8 channels per vector) where it
        beats the per-plane one, one thread: 3x3, dilation 1, float32, a clamp, constant weights (and
        bias), AVX2. Since it packs whole planes (not row by row) that is every MobileNetV2-96 layer:
        batch 1, 1.1x (48x48, stride 1) to 3.6x (6x6); batch 32, 1.0x (48x48) to 2.4x (12x12)."""
        if not (g.kh == g.kw == 3 and g.dh == g.dw == 1 and x.dtype == np.float32 and w.dtype == np.float32
                and self._clamp is not None
                and _immutable(w) and (bias is None or (bias.dtype == np.float32 and _immutable(bias)))):
            return False
        from ...jit.gemm_int8 import supported  # deferred: loads llvmlite, numba
        return supported()

    def _run_blocked(self, x, w, g, bias):
        """jit.depthwise_blocked over chunks of images on the intra-op threads, each with its own
        scratch (the padded 8-channel block and its output block); the weights blocked once."""
        n, c, h, wd = x.shape
        cached = self._blocked
        if cached is None or cached[0] is not w or cached[1] is not bias:
            from ...jit.depthwise_blocked import block_weights, blocked_rows  # deferred: loads numba
            b = None if bias is None else bias.reshape(c)
            wb, bb = block_weights(w.reshape(c, 3, 3), b)
            lo, hi = np.float32(self._clamp[0]), np.float32(self._clamp[1])
            cached = self._blocked = (w, bias, wb, bb, lo, hi, blocked_rows)  # holding w keeps its id
        _, _, wb, bb, lo, hi, kernel = cached
        (t, b_), (l, r) = g.pads
        hp, wp = h + t + b_, wd + l + r
        xs = np.ascontiguousarray(x).reshape(n * c, h, wd)
        out = np.empty((n, c, g.oh, g.ow), np.float32)
        orow = out.reshape(n * c, g.oh, g.ow)
        split = hp * wp * 8
        if n == 1:  # no closure, no thread split: batch 1 pays Python per call (about 1 us a line)
            scratch = np.empty(split + g.oh * g.ow * 8, np.float32)  # jit.depthwise_blocked's two blocks
            kernel(xs, _ZERO, c, wb, bb, t, l, wp, g.sh, g.sw, lo, hi, False, _ZERO, _ZERO_I,
                   orow, scratch[:split], scratch[split:])
            return out

        def images(i0, i1):
            scratch = np.empty(split + g.oh * g.ow * 8, np.float32)
            kernel(xs[i0 * c:i1 * c], _ZERO, c, wb, bb, t, l, wp, g.sh, g.sw, lo, hi, False, _ZERO, _ZERO_I,
                   orow[i0 * c:i1 * c], scratch[:split], scratch[split:])
        _on_threads(images, _split_rows(n, n * c * g.oh * g.ow * 9))
        return out

    def __call__(self, x, w, g, bias=None):
        """activation(depthwise_conv(x, w) + bias) as a contiguous NCHW array; w is [C, 1, kh, kw]
        and g the convolution's geometry (pads, strides, dilations, output size)."""
        blocked = self._blocked  # set once the blocked kernel served these very w and bias: it pays again
        if blocked is not None and blocked[0] is w and blocked[1] is bias and x.dtype == np.float32 \
                and jit.enabled_by_env():
            return self._run_blocked(x, w, g, bias)
        if self._compiled and compiled_ok(np, x.dtype):
            return self._run_compiled(x, w, g, bias)
        key = (x.shape, w.shape, x.dtype)
        lay = self._layouts.get(key)
        if lay is None:
            if len(self._layouts) >= _MAX_LAYOUTS:  # many input shapes (a varying batch): keep the newest
                self._layouts.pop(next(iter(self._layouts)), None)
            lay = self._layouts[key] = _Layout(self.xp, x.shape, w.shape, x.dtype, g)
        wt = self._weights(lay, w, bias)
        n, c = x.shape[0], x.shape[1]
        rows, step = n * c, lay.step
        out = self.xp.empty((n, c, g.oh, g.ow), dtype=x.dtype)
        args = (x.reshape(rows, lay.h, lay.w), out.reshape(rows, g.oh, g.ow), wt, self.act)
        parts = threads(rows * g.oh * g.ow * lay.kk) if rows >= 2 * step else 1
        if parts == 1:
            lay.run(*args, 0, rows)
            return out
        cut = (rows // parts // step or 1) * step  # whole chunks per part
        bounds = [(i * cut, (i + 1) * cut if i < parts - 1 else rows) for i in range(parts)]
        futures = [_pool().submit(lay.run, *args, r0, r1) for r0, r1 in bounds[1:] if r0 < r1]
        lay.run(*args, *bounds[0])
        for f in futures:
            f.result()
        return out

    def _weights(self, lay, w, bias):
        """[N*C, taps (+1)]: each row's weights in tap-group order, then its bias (which the
        product takes from a row of ones under the tap columns); tiled once per batch size."""
        cached = self._tiled
        if cached is not None and cached[0] is w and cached[1] is bias and cached[2] == lay.n:
            return cached[3]
        xp, c = self.xp, w.shape[0]
        wk = w.reshape(c, lay.kk)[:, lay.order].astype(lay.dtype, copy=False)
        if bias is not None:
            wk = xp.concatenate([wk, bias.reshape(c, 1).astype(lay.dtype, copy=False)], axis=1)
        wt = xp.tile(wk, (lay.n, 1))
        if _immutable(w) and (bias is None or _immutable(bias)):
            self._tiled = (w, bias, lay.n, wt)  # holding w and bias keeps their identities unique
        return wt


def compiled_ok(xp, dtype) -> bool:
    """Whether the compiled depthwise kernels (isthmus.jit) serve arrays of this module and dtype now."""
    return xp is np and dtype in _JIT_DTYPES and jit.available()


def _split_rows(rows: int, macs: int):
    """Row ranges for the threads a compiled depthwise kernel of `macs` multiply-adds uses."""
    parts = threads(macs) if rows >= 2 else 1
    cut = -(-rows // parts) if rows else 1
    return [(r0, min(rows, r0 + cut)) for r0 in range(0, rows, cut)] or [(0, 0)]


def _on_threads(fn, ranges, *args) -> None:
    """fn(*args, r0, r1) for each range: the first on this thread, the others on the pool."""
    futures = [_pool().submit(fn, *args, r0, r1) for r0, r1 in ranges[1:]]
    fn(*args, *ranges[0])
    for f in futures:
        f.result()


def compiled_input_grad(dy, w, g, x_shape):
    """The input gradient [N, C, H, W] of a depthwise convolution by the compiled forward kernel
    (a stride-1 convolution of dy with the weights flipped: jit.depthwise.input_grad_as_forward)."""
    from ...jit.depthwise import depthwise_rows, input_grad_as_forward  # deferred: jit.depthwise loads numba
    n, c, h, wd = x_shape
    rows, dt = n * c, dy.dtype
    dys = np.ascontiguousarray(dy).reshape(rows, g.oh, g.ow)
    src, wf, gt = input_grad_as_forward(dys, np.asarray(w, dtype=dt).reshape(c, g.kh, g.kw), g, h, wd)
    dx = np.empty(x_shape, dtype=dt)
    dxs = dx.reshape(rows, h, wd)
    _on_threads(depthwise_rows, _split_rows(rows, rows * h * wd * g.kh * g.kw), src, wf, None, gt, -np.inf, np.inf, dxs)
    return dx


def compiled_filter_grad(x, dy, g, w_shape):
    """The filter gradient [C, 1, kh, kw] of a depthwise convolution by the compiled kernel (sums
    in float64; one accumulator per thread, added at the end)."""
    from ...jit.depthwise import depthwise_filter_grad_rows  # deferred: jit.depthwise loads numba
    n, c, h, wd = x.shape
    rows = n * c
    xs = np.ascontiguousarray(x).reshape(rows, h, wd)
    dys = np.ascontiguousarray(dy, dtype=x.dtype).reshape(rows, g.oh, g.ow)
    ranges = _split_rows(rows, rows * g.oh * g.ow * g.kh * g.kw)
    accs = [np.zeros((c, g.kh, g.kw)) for _ in ranges]
    futures = [_pool().submit(depthwise_filter_grad_rows, xs, dys, g, acc, r0, r1)
               for acc, (r0, r1) in zip(accs[1:], ranges[1:])]
    depthwise_filter_grad_rows(xs, dys, g, accs[0], *ranges[0])
    for f in futures:
        f.result()
    return sum(accs[1:], accs[0]).reshape(w_shape).astype(x.dtype)


def _immutable(a) -> bool:
    """Read-only all the way down its bases (so its values can never change under us)."""
    while a is not None and hasattr(a, "flags"):
        if a.flags.writeable:
            return False
        a = a.base
    return True


class _Layout:
    """The chunked computation for one input shape; run(rows r0..r1) takes a scratch set from
    the pool (or makes one) and gives it back, so disjoint row ranges may run on threads."""

    def __init__(self, xp, x_shape, w_shape, dtype, g):
        n, c, h, wd = x_shape
        (t, b), (l, r) = g.pads
        self.xp, self.g, self.dtype, self.n, self.h, self.w = xp, g, dtype, n, h, wd
        # padded rows split into sh phases of hq rows; each row wp wide, rounded up to a multiple
        # of sw so that output (oy, ox) of a tap is element sw*(oy*wo + ox) past its first one
        self.hq, self.wo = -(-(h + t + b) // g.sh), -(-(wd + l + r) // g.sw)
        self.wp = self.wo * g.sw
        plane = self.hq * self.wp
        self.length = g.oh * self.wo
        self.groups, self.order = _tap_groups(g, plane, self.wp)
        self.kk = g.kh * g.kw
        self.row = g.sh * plane
        last = max(off + (ni - 1) * si + (nj - 1) * sj for off, ni, si, nj, sj in self.groups)
        # junk columns of a row's last tap read past its end
        self.extra = max(0, last + g.sw * (self.length - 1) + 1 - self.row)
        isz = np.dtype(dtype).itemsize
        self.step = max(1, min(n * c, CHUNK_BYTES // ((self.row + (self.kk + 2) * self.length) * isz)))
        self._align = 64 // isz  # element offsets of the three buffers in the arena, 64-byte aligned
        self._buf_n = _round_up(step_elems := self.step * self.row + self.extra, self._align)
        self._acc_n = _round_up(self.step * self.length, self._align)
        self._cols_n = self.step * (self.kk + 1) * self.length
        self._buf_len = step_elems
        self._views: dict = {}  # id(arena) -> (arena, views into it)

    def _scratch(self, mem):
        """Views of this layout's buffers in `mem`: the chunk buffer [rows, sh, Hq, Wp] + extra,
        the product's result and the tap columns (+ the bias row), and the copies between them."""
        xp, g, step, row, length = self.xp, self.g, self.step, self.row, self.length
        isz = np.dtype(self.dtype).itemsize
        flat = mem[:(self._buf_n + self._acc_n + self._cols_n) * isz].view(self.dtype)
        buf = flat[:self._buf_len]
        fill = _phase_fill(buf[:step * row].reshape(step, g.sh, self.hq, self.wp), g, self.h, self.w)
        acc = flat[self._buf_n:self._buf_n + step * length].reshape(step, length)
        cols = flat[self._buf_n + self._acc_n:].reshape(step, self.kk + 1, length)
        # one copy per stride phase: its taps form a grid [ni, nj] of runs at fixed strides
        copies, k = [], 0
        for off, ni, si, nj, sj in self.groups:
            view = as_strided(buf[off:], (step, ni, nj, length), (row * isz, si * isz, sj * isz, g.sw * isz),
                              writeable=False)
            copies.append((cols[:, k:k + ni * nj].reshape(step, ni, nj, length), view))
            k += ni * nj
        return buf, fill, copies, acc, cols

    def run(self, x_rows, out_rows, wt, act, r_begin: int, r_end: int) -> None:
        # the scratch lives in an arena of the shared pool (the one the node before on this thread
        # gave back, so still in cache); its views are built once per arena
        mem = ARENAS.take(self.xp, (self._buf_n + self._acc_n + self._cols_n) * np.dtype(self.dtype).itemsize)
        try:
            self._run(mem, x_rows, out_rows, wt, act, r_begin, r_end)
        finally:
            ARENAS.give(self.xp, mem)

    def _run(self, mem, x_rows, out_rows, wt, act, r_begin: int, r_end: int) -> None:
        entry = self._views.get(id(mem))
        if entry is None or entry[0] is not mem:
            if len(self._views) >= ARENAS.KEEP:  # (each entry holds its arena)
                self._views.clear()
            entry = self._views[id(mem)] = (mem, self._scratch(mem))
        buf, fill, copies, acc, cols = entry[1]
        buf[...] = 0  # pads and junk: another node may have used the arena since
        if wt.shape[1] > self.kk:
            cols[:, self.kk] = 1  # the bias row
        xp, g, wo, step = self.xp, self.g, self.wo, self.step
        matmul = xp.matmul
        taps = cols[:, :wt.shape[1]]  # the tap runs, and the row of ones when there is a bias
        for r0 in range(r_begin, r_end, step):
            r1 = min(r_end, r0 + step)
            m = r1 - r0
            fill(x_rows[r0:r1], m)
            a = acc[:m]
            for dst, view in copies:
                dst[:m] = view[:m]
            matmul(wt[r0:r1, None, :], taps[:m], out=a[:, None, :])  # [1, taps] @ [taps, run] per row
            act(a.reshape(m, g.oh, wo)[:, :, :g.ow], out_rows[r0:r1])  # the valid columns, activated


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


class _ArenaPool:
    """Scratch arenas shared by the kernels of every thread: a kernel run takes one and gives it
    back, the most recently returned first, so that a thread running node after node gets the
    arena still in cache from the node before. (One arena per thread, kept for the thread's life,
    held one for every thread that ever ran a kernel: an offload server's gRPC worker threads,
    each answering a lone request now and then, grew its RSS by 9% under 64 clients.) At most
    KEEP arenas are kept; runs beyond that many at once allocate and free their own."""
    KEEP = 4

    def __init__(self):
        self._free: dict = {}  # id(array module) -> [arena], most recently returned last
        self._lock = threading.Lock()

    def take(self, xp, nbytes: int):
        with self._lock:
            free = self._free.setdefault(id(xp), [])
            for i in range(len(free) - 1, -1, -1):
                if free[i].nbytes >= nbytes:
                    return free.pop(i)
            old = free.pop() if free else None
        # none is large enough: a new one (grown by doubling, so a few sizes settle it)
        return xp.empty(max(nbytes, 2 * old.nbytes if old is not None else nbytes), dtype=np.uint8)

    def give(self, xp, mem) -> None:
        with self._lock:
            free = self._free.setdefault(id(xp), [])
            free.append(mem)
            if len(free) > self.KEEP:  # drop the smallest, by position: list.remove would compare arrays with ==
                del free[min(range(len(free)), key=lambda i: free[i].nbytes)]


ARENAS = _ArenaPool()


# ---- threads --------------------------------------------------------------------------------
# Depthwise work is not BLAS, so BLAS cannot spread it over cores; a convolution large enough
# (multiply-adds) is split into as many row ranges as the run has intra-op threads
# (core/threads.py: the session's intra_op_threads, else BLAS's count), on the intra-op pool.
THREAD_MIN_MACS = 4_000_000
_MAX_THREADS = max(1, min(4, os.cpu_count() or 1))


def threads(macs: int) -> int:
    """How many threads a depthwise convolution of `macs` multiply-adds uses."""
    if macs < THREAD_MIN_MACS:
        return 1
    return max(1, min(_MAX_THREADS, intra_threads()))


def _pool():
    return intra_pool()


def _tap_groups(g, plane: int, wp: int):
    """The taps grouped by the row phase they read: ([(offset, ni, si, nj, sj)], tap order).
    Tap (i, j) reads phase i*dh % sh at row i*dh // sh and column j*dw; within a phase those rows
    advance by a fixed step, so a group's runs start at offset + a*si + b*sj for a < ni, b < nj
    (in elements of a flattened (image, channel) row)."""
    groups, order = [], []
    for pi in range(g.sh):
        ii = [i for i in range(g.kh) if i * g.dh % g.sh == pi]
        if not ii:
            continue
        ai = [i * g.dh // g.sh for i in ii]
        si = (ai[1] - ai[0]) * wp if len(ai) > 1 else 0
        groups.append((pi * plane + ai[0] * wp, len(ai), si, g.kw, g.dw))
        order += [i * g.kw + j for i in ii for j in range(g.kw)]
    return groups, order


def _phase_fill(phases, g, h, wd):
    """A function copying m input planes [m, H, W] into the padded row phases [m, sh, Hq, Wp]
    of the first m chunk rows: phase py holds the padded rows py, py + sh, ..."""
    (t, _), (l, _) = g.pads
    copies = []
    for py in range(g.sh):
        y0 = (py - t) % g.sh  # first input row in phase py: padded row t + y0 = py (mod sh)
        a0 = (t + y0) // g.sh
        ny = len(range(y0, h, g.sh))
        if ny:
            copies.append((phases[:, py, a0:a0 + ny, l:l + wd], slice(y0, None, g.sh)))

    def fill(xs, m):
        for dst, ys in copies:
            dst[:m] = xs[:, ys]
    return fill
