"""Forward depthwise convolution (one filter per channel) with its bias and activation.

The input is processed in cache-sized chunks of (image, channel) rows. Each row is padded and
flattened ("wide" layout): with stride 1, kernel tap (i, j) of all output rows is then one
contiguous run of OH*Wp values starting at i*dh*Wp + j*dw (the Wp - OW columns past each
output row's end are junk, dropped when the chunk is written out). A stride s first splits
the padded plane into its s*s phases (xpad[py::s, px::s]), so every tap reads one phase at
stride 1. Per chunk, the taps' runs are copied side by side ([rows, taps, run], in cache) and
contracted with the weights by one einsum (a fused multiply-add, no BLAS threads), then bias
and activation are applied and the valid columns written once into the NCHW output.

Against one im2col of the whole input (9x its size, streamed from memory and page-faulted in
on every call) this is 2-3x faster at batch 32 and no slower at batch 1 (measured, 1 thread).
"""
from __future__ import annotations

import os
import threading
from typing import Callable, Optional

import numpy as np
from numpy.lib.stride_tricks import as_strided

# bytes of one chunk's padded rows, tap columns and result; 1 MiB measured best here (512 KiB
# L2 per core, 32 MiB shared L3): 256 KiB pays too many calls at batch 1, 4 MiB leaves cache
CHUNK_BYTES = 1 << 20


def depthwise_forward(xp, x, w, g, bias=None, act: Optional[Callable] = None):
    """act(depthwise_conv(x, w) + bias) as a contiguous NCHW array; w is [C, 1, kh, kw] and
    g the convolution's geometry (pads, strides, dilations, output size)."""
    n, c, h, wd = x.shape
    (t, b), (l, r) = g.pads
    sh, sw = g.sh, g.sw
    hq, wq = -(-(h + t + b) // sh), -(-(wd + l + r) // sw)
    plane = hq * wq
    length = g.oh * wq
    groups, order = _tap_groups(g, plane, wq)
    row = sh * sw * plane
    rows, kk = n * c, g.kh * g.kw
    wt = xp.tile(w.reshape(c, kk)[:, order].astype(x.dtype, copy=False), (n, 1))  # [rows, taps in group order]
    bt = None if bias is None else xp.tile(bias.astype(x.dtype, copy=False), n).reshape(rows, 1, 1)
    out = xp.empty((n, c, g.oh, g.ow), dtype=x.dtype)
    job = _Rows(xp, x.reshape(rows, h, wd), out.reshape(rows, g.oh, g.ow), wt, bt, act, g, groups, row, length)
    step = job.step
    parts = threads(rows * g.oh * g.ow * kk) if rows >= 2 * step else 1
    if parts == 1:
        job(0, rows)
        return out
    cut = (rows // parts // step or 1) * step  # whole chunks per part
    bounds = [(i * cut, (i + 1) * cut if i < parts - 1 else rows) for i in range(parts)]
    bounds = [bd for bd in bounds if bd[0] < bd[1]]
    futures = [_pool().submit(job, r0, r1) for r0, r1 in bounds[1:]]
    job(*bounds[0])
    for f in futures:
        f.result()
    return out


class _Rows:
    """Computes output rows [r0, r1) chunk by chunk, each call with its own scratch buffers (so
    that two threads can run disjoint row ranges of one convolution)."""

    def __init__(self, xp, x_rows, out_rows, wt, bt, act, g, groups, row, length):
        self.xp, self.x_rows, self.out_rows, self.wt, self.bt, self.act = xp, x_rows, out_rows, wt, bt, act
        self.g, self.groups, self.row, self.length = g, groups, row, length
        last = max(off + (ni - 1) * si + (nj - 1) * sj for off, ni, si, nj, sj in groups)
        self.extra = max(0, last + length - row)  # junk columns of a row's last tap read past its end
        kk = g.kh * g.kw
        self.step = min(len(x_rows), max(1, CHUNK_BYTES // ((row + (kk + 1) * length) * x_rows.itemsize)))

    def __call__(self, r_begin: int, r_end: int) -> None:
        xp, g, length, step = self.xp, self.g, self.length, self.step
        dtype, row, isz = self.x_rows.dtype, self.row, self.x_rows.itemsize
        h, wd = self.x_rows.shape[1:]
        hq, wq = -(-(h + g.pads[0][0] + g.pads[0][1]) // g.sh), -(-(wd + g.pads[1][0] + g.pads[1][1]) // g.sw)
        # chunk buffer [rows, sh, sw, Hq, Wq] + extra: pads and junk are zeroed once and never written
        buf = xp.zeros(step * row + self.extra, dtype=dtype)
        fill = _phase_fill(buf[:step * row].reshape(step, g.sh, g.sw, hq, wq), g, h, wd)
        acc = xp.empty((step, length), dtype=dtype)
        kk = g.kh * g.kw
        cols = xp.empty((step, kk, length), dtype=dtype)
        # one copy per stride phase: its taps form a grid [ni, nj] of runs at fixed strides
        copies, k = [], 0
        for off, ni, si, nj, sj in self.groups:
            view = as_strided(buf[off:], (step, ni, nj, length), (row * isz, si * isz, sj * isz, isz),
                              writeable=False)
            copies.append((cols[:, k:k + ni * nj].reshape(step, ni, nj, length), view))
            k += ni * nj
        einsum, bt, act = xp.einsum, self.bt, self.act
        for r0 in range(r_begin, r_end, step):
            r1 = min(r_end, r0 + step)
            m = r1 - r0
            fill(self.x_rows[r0:r1], m)
            a, cm = acc[:m], cols[:m]
            for dst, view in copies:
                dst[:m] = view[:m]
            einsum("rk,rkl->rl", self.wt[r0:r1], cm, out=a)
            dst = self.out_rows[r0:r1]
            valid = a.reshape(m, g.oh, wq)[:, :, :g.ow]
            if bt is None:
                dst[...] = valid
            else:
                xp.add(valid, bt[r0:r1], out=dst)
            if act is not None:
                act(dst)


# ---- threads --------------------------------------------------------------------------------
# Depthwise work is not BLAS, so BLAS cannot spread it over cores; a convolution large enough
# (multiply-adds) is split into as many row ranges as BLAS has threads, so that a session
# limited to one BLAS thread (threadpoolctl, OPENBLAS_NUM_THREADS) runs it on one thread too.
THREAD_MIN_MACS = 4_000_000
_blas_count: Optional[Callable[[], int]] = None
_executor = None
_lock = threading.Lock()


def threads(macs: int) -> int:
    """How many threads a depthwise convolution of `macs` multiply-adds uses: BLAS's count now."""
    if macs < THREAD_MIN_MACS:
        return 1
    global _blas_count
    if _blas_count is None:
        _blas_count = _blas_thread_reader()
    return max(1, min(_MAX_THREADS, _blas_count()))


_MAX_THREADS = max(1, min(4, os.cpu_count() or 1))


def _blas_thread_reader() -> Callable[[], int]:
    """A cheap reader of the BLAS thread count (one C call through threadpoolctl's controllers,
    built once); without threadpoolctl, the count BLAS starts with (OPENBLAS_NUM_THREADS etc.)."""
    try:
        from threadpoolctl import ThreadpoolController
        libs = [lc for lc in ThreadpoolController().lib_controllers if lc.user_api == "blas"]
    except Exception:  # threadpoolctl missing or unable to inspect this process: fall back to env
        libs = []
    if libs:
        return lambda: max(lc.get_num_threads() or 1 for lc in libs)
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        v = os.environ.get(var, "")
        if v.isdigit() and int(v) > 0:
            n = int(v)
            return lambda: n
    n = os.cpu_count() or 1
    return lambda: n


def _pool():
    global _executor
    with _lock:
        if _executor is None:
            from concurrent.futures import ThreadPoolExecutor
            _executor = ThreadPoolExecutor(max_workers=_MAX_THREADS - 1 or 1, thread_name_prefix="isthmus-dw")
        return _executor


def _tap_groups(g, plane: int, wq: int):
    """The taps grouped by the stride phase they read: ([(offset, ni, si, nj, sj)], tap order).
    Tap (i, j) reads phase (i*dh % sh, j*dw % sw) at row i*dh // sh and column j*dw // sw of it;
    within a phase those rows (columns) advance by a fixed step, so a group's runs start at
    offset + a*si + b*sj for a < ni, b < nj (si, sj in elements of a flattened row)."""
    groups, order = [], []
    for pi in range(g.sh):
        ii = [i for i in range(g.kh) if i * g.dh % g.sh == pi]
        for pj in range(g.sw):
            jj = [j for j in range(g.kw) if j * g.dw % g.sw == pj]
            if not ii or not jj:
                continue
            ai, aj = [i * g.dh // g.sh for i in ii], [j * g.dw // g.sw for j in jj]
            si = (ai[1] - ai[0]) * wq if len(ai) > 1 else 0
            sj = aj[1] - aj[0] if len(aj) > 1 else 0
            groups.append(((pi * g.sw + pj) * plane + ai[0] * wq + aj[0], len(ai), si, len(aj), sj))
            order += [i * g.kw + j for i in ii for j in jj]
    return groups, order


def _phase_fill(phases, g, h, wd):
    """A function copying m input planes [m, H, W] into the padded stride phases of the first m
    chunk rows: phase (py, px) holds xpad[py::sh, px::sw]."""
    (t, _), (l, _) = g.pads
    sh, sw = g.sh, g.sw
    copies = []
    for py in range(sh):
        y0 = (py - t) % sh  # first input row in phase py: padded row t + y0 = py (mod sh)
        a0 = (t + y0) // sh
        ny = len(range(y0, h, sh))
        for px in range(sw):
            x0 = (px - l) % sw
            b0 = (l + x0) // sw
            nx = len(range(x0, wd, sw))
            if ny and nx:
                copies.append((phases[:, py, px, a0:a0 + ny, b0:b0 + nx], (slice(y0, None, sh), slice(x0, None, sw))))

    def fill(xs, m):
        for dst, (ys, xs_) in copies:
            dst[:m] = xs[:, ys, xs_]
    return fill
