"""Row-tap convolutions (stride 1 along H, groups 1, a batch): the forward pass, the input gradient of
a stride-1 convolution (the same pass over dy) and the filter gradient, each GEMMs against the
kernel's columns of the input laid out [kw*C, H, OW, N].

Only kw copies of the input are made, not kh*kw: kernel row i's im2col block is the column range of
the input rows shifted by i*dh, so each kernel row is one GEMM over the output rows it reaches,
added straight into the output by BLAS (numpy_blas: beta=1). No stacked [kh*O, H*OW*N] product is
written (16 MB for the benchmark CNN's second layer), nor its temporaries and add passes; rows
that read only H padding are skipped, so the H padding is never built. With few output channels a
GEMM per input row over the kernel rows stacked, its product added while in cache, packs the
columns fewer times.

Threads take blocks of output rows: each computes its blocks' GEMMs and finishes them (NCHW, bias,
activation) in one hand-off. The blocks are fixed by the shape and the machine's core count (not the
session's thread count) and every output element gets its kernel rows' products in the same order,
so 1 and 2 threads give the same bytes. The filter
gradient's products are cut along the contraction in parts fixed by the shape
(intra_op.ksplit_parts), all kernel rows' parts in one hand-off, summed in a fixed order.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ... import jit
from .. import threads
from . import numpy_blas
from .numpy_blas import accumulate
from .intra_op import ksplit_parts, par_rows, rows_apply


def row_spans(g, h):
    """Per kernel row i of a stride-1 (along H) convolution over an input of height h: the output
    rows [lo, hi) whose input row lo + i*dh - top lies inside the input, and that first input row.
    Rows outside read only zero padding, so the GEMMs skip them: the H padding is never built
    (for 5x5 SAME on 14 rows: 9% fewer multiply-adds and 22% fewer im2col copies)."""
    t = g.pads[0][0]
    spans = []
    for i in range(g.kh):
        off = i * g.dh - t
        lo, hi = max(0, -off), min(g.oh, h - off)
        spans.append((lo, hi, lo + off))
    return spans


def row_tap_columns(xp, x, g, also=None):
    """x [N, C, H, W] as [kw*C, H*OW*N] columns: row (j, c), column (h, ow, n) holds
    x[n, c, h, ow*sw + j*dw - left], zero in the W padding. With the batch innermost, a window's
    shift along W keeps (ow, n) one contiguous run: the copies move runs of OW*N values.
    Built in one hand-off over channel ranges: x relaid [C, H, Wp, N] (padded along W only), then
    its window view copied; also(c0, c1, C), if given, runs in the same chunks (another relayout)."""
    n, c, h, wd = x.shape
    l, r = g.pads[1]
    if _compiled(xp, x):
        from ...jit.par_conv import row_tap_columns_range  # deferred: loads numba
        cols = np.empty((g.kw, c, h, g.ow, n), dtype=x.dtype)
        par_rows(row_tap_columns_range, (x, cols, l, g.sw, g.dw), c, 2 * cols.nbytes)
        if also is not None:  # the other relayout, in its own region (a few microseconds)
            also(0, c, c)
        return cols.reshape(g.kw * c, h * g.ow * n)
    xt = xp.empty((c, h, wd + l + r, n), dtype=x.dtype)
    cols = xp.empty((g.kw, c, h, g.ow, n), dtype=x.dtype)
    s0, s1, s2, s3 = xt.strides
    view = as_strided(xt, cols.shape, (g.dw * s2, s0, s1, g.sw * s2, s3), writeable=False)
    src = x.transpose(1, 2, 3, 0)

    def part(c0, c1):
        if l:
            xt[c0:c1, :, :l] = 0
        if r:
            xt[c0:c1, :, l + wd:] = 0
        xt[c0:c1, :, l:l + wd] = src[c0:c1]
        cols[:, c0:c1] = view[:, c0:c1]
        if also is not None:
            also(c0, c1, c)
    rows_apply(xp, part, c, xt.nbytes + cols.nbytes)
    return cols.reshape(g.kw * c, h * g.ow * n)


def _compiled(xp, x) -> bool:
    """Whether jit.par_conv's relayouts serve x (numpy float32/float64, compiled kernels on)."""
    return xp is np and x.dtype in (np.float32, np.float64) and jit.available()


def stacked_weights(xp, w):
    """w [O, C, kh, kw] as [kh, O, kw*C]: kernel row i's weights against row_tap_columns' rows (j, c)."""
    o, c, kh, kw = w.shape
    return xp.ascontiguousarray(w.transpose(2, 0, 3, 1)).reshape(kh, o, kw * c)


# Each GEMM covers a block of output rows fixed by the shape and the machine's core count, never by
# the session's thread count: BLAS rounds an element differently by where it falls in its tiles, so
# a cut that moved with the threads would move the bits. One block per core (each of at least this
# many output columns): fewer, larger GEMMs pack the columns fewer times and call BLAS less (the
# CNN's 64 -> 32 channel input gradient, one core: 22.5 ms in one block, 24.5 in six).
_BLOCK_MIN_COLS = 2048


# From this many output channels up, each kernel row's GEMM adds into the output itself; below, BLAS's
# pass over the columns (its packing, once per GEMM) is large beside so few rows of work and a GEMM
# per input row over the stacked kernel rows wins (one core, CPU time of alternating runs at load 3:
# the CNN's 64 -> 32 channel input gradient 22.5-24.5 ms stacked vs 26.5-26.8 per kernel row;
# its 32 -> 64 forward 18.1-18.6 per kernel row vs 18.7-20.0 stacked).
_ACC_MIN_O = 64


def _input_row_products(xp, cols, wt, acc, g, h, run, a, b):
    """acc's output rows [a, b) as one GEMM per input row over all the kernel rows that carry it into
    [a, b) (stacked weights, M = kh*O at most), its product added into those output rows while in
    cache. An output row gets its kernel rows in increasing order (input rows go up with the kernel
    row), the first written, the rest added; rows no kernel row reaches are 0."""
    kh, dh, t = g.kh, g.dh, g.pads[0][0]
    o = wt.shape[1]
    wst = wt.reshape(kh * o, -1)
    first = {}
    for oh in range(a, b):
        valid = [i for i in range(kh) if 0 <= oh + i * dh - t < h]
        first[oh] = valid[0] if valid else None
        if not valid:
            acc[:, oh * run:(oh + 1) * run] = 0
    buf = xp.empty((kh * o, run), dtype=acc.dtype)
    for hh in range(max(0, a - t), min(h, b - t + (kh - 1) * dh)):
        taps = [i for i in range(kh) if a <= hh + t - i * dh < b]
        if not taps:
            continue
        i0, i1 = taps[0], taps[-1]
        big = xp.matmul(wst[i0 * o:(i1 + 1) * o], cols[:, hh * run:(hh + 1) * run], out=buf[:(i1 + 1 - i0) * o])
        for i in taps:
            oh = hh + t - i * dh
            dst, part = acc[:, oh * run:(oh + 1) * run], big[(i - i0) * o:(i - i0 + 1) * o]
            if i == first[oh]:
                dst[...] = part
            else:
                dst += part


def row_blocks(oh: int, run: int) -> list:
    """Bounds of the output-row blocks of conv_rows (a function of the shape and threads.cores())."""
    nb = max(1, min(oh, threads.cores(), (oh * run) // _BLOCK_MIN_COLS))
    return [oh * b // nb for b in range(nb + 1)]


def conv_rows(xp, x, wt, g, finish_rows):
    """conv2d of x [N, C, H, W] with weights wt [kh, O, kw*C] (stacked_weights) for a row-tap
    geometry, as NCHW; finish_rows(src, y, a) writes output rows a.. of y [N, O, OH, OW] from
    src [O, rows, OW, N] (the layout change, bias and activation in one pass)."""
    n, h = x.shape[0], x.shape[2]
    o = wt.shape[1]
    cols = row_tap_columns(xp, x, g)
    run = n * g.ow
    spans = row_spans(g, h)
    full = [i for i, (lo, hi, _) in enumerate(spans) if (lo, hi) == (0, g.oh)]
    order = full[:1] + [i for i in range(g.kh) if i not in full[:1]]
    acc = xp.empty((o, g.oh * run), dtype=x.dtype)
    y = xp.empty((n, o, g.oh, g.ow), dtype=x.dtype)
    bounds = row_blocks(g.oh, run)
    stacked = xp is np and o < _ACC_MIN_O
    work = 2 * o * wt.shape[2] * run * sum(max(0, hi - lo) for lo, hi, _ in spans)
    if _par_rows_pay(xp, x, wt, finish_rows, len(bounds) - 1, work):
        if stacked:
            _par_stacked_rows(wt, cols, acc, y, h, run, bounds, g, finish_rows, work)
        else:
            _par_conv_rows(wt, cols, acc, y, spans, order, full, run, bounds, g, finish_rows, work)
        return y

    def rows(b0, b1):  # blocks [b0, b1): every kernel row's product over each, then their finish
        a, b = bounds[b0], bounds[b1]
        if not full and not stacked:
            acc[:, a * run:b * run] = 0
        for r0, r1 in zip(bounds[b0:b1], bounds[b0 + 1:b1 + 1]):
            if stacked:
                _input_row_products(xp, cols, wt, acc, g, h, run, r0, r1)
                continue
            for i in order:  # an element gets its kernel rows in this order, the first written
                lo, hi, src = spans[i]
                lo2, hi2 = max(lo, r0), min(hi, r1)
                if hi2 > lo2:
                    s = src + lo2 - lo
                    _product(xp, wt[i], cols[:, s * run:(s + hi2 - lo2) * run], acc[:, lo2 * run:hi2 * run],
                             add=not full or i != full[0])
        finish_rows(acc[:, a * run:b * run].reshape(o, b - a, g.ow, n), y, a)
    _fan_out_rows(xp, rows, len(bounds) - 1, work)
    return y


def _par_rows_pay(xp, x, wt, finish_rows, blocks: int, work: int) -> bool:
    """Whether conv_rows' blocks go to prange (jit.par_blas' GEMMs, then the finish, each one parallel
    call): float32 numpy arrays, BLAS bound directly (numpy_blas), a compiled finish, and
    threads.par_threads splitting the blocks. The GEMMs and their order per block are those of the
    pool path, so the bytes are the same either way."""
    if (xp is not np or x.dtype != np.float32 or wt.dtype != np.float32 or blocks < 2
            or getattr(finish_rows, "par_finish", None) is None or numpy_blas.sgemm() is None):
        return False
    return threads.par_threads(blocks, work, flops=True) >= 2


def _par_conv_rows(wt, cols, acc, y, spans, order, full, run, bounds, g, finish_rows, work) -> None:
    from ...jit.par_blas import row_taps_range  # deferred: loads numba
    plan = np.array([(i,) + spans[i][:2] + (spans[i][2], 0 if full and i == full[0] else 1) for i in order],
                    np.int64).reshape(-1, 5)
    nb = len(bounds) - 1
    b = np.asarray(bounds, np.int64)
    par_rows(row_taps_range, (numpy_blas.sgemm(), wt, cols, acc, plan, run, b, not full), nb, work, flops=True,
             blocks=nb, blas_inside=True)
    kernel, args = finish_rows.par_finish(acc.reshape(acc.shape[0], g.oh, g.ow, -1), y)
    par_rows(kernel, args + (b,), nb, 2 * acc.nbytes, blocks=nb)


def _par_stacked_rows(wt, cols, acc, y, h, run, bounds, g, finish_rows, work) -> None:
    """conv_rows' stacked form (_input_row_products) as one prange call of BLAS GEMMs per output-row
    block (jit.par_blas.stacked_rows_range: the same GEMMs and adds in the same order), then the finish."""
    from ...jit.par_blas import stacked_rows_range  # deferred: loads numba
    nb = len(bounds) - 1
    b = np.asarray(bounds, np.int64)
    wst = wt.reshape(g.kh * wt.shape[1], -1)
    par_rows(stacked_rows_range, (numpy_blas.sgemm(), wst, cols, acc, h, g.kh, g.dh, g.pads[0][0], run, b), nb, work,
             flops=True, blocks=nb, blas_inside=True)
    kernel, args = finish_rows.par_finish(acc.reshape(acc.shape[0], g.oh, g.ow, -1), y)
    par_rows(kernel, args + (b,), nb, 2 * acc.nbytes, blocks=nb)


def _product(xp, a, b, c, add: bool):
    if xp is np:
        accumulate(a, b, c, add)
    elif add:
        c += a @ b
    else:
        c[...] = a @ b


def _fan_out_rows(xp, fn, total: int, work: int) -> None:
    """fn(lo, hi) over chunks of `total` blocks of output rows on the intra-op threads, one BLAS
    thread each, `work` FLOPs in all (threads.fan_out sizes the chunks; other array modules: one
    call, the device parallelises)."""
    if xp is not np:
        fn(0, total)
        return
    threads.fan_out(fn, total, work, blas_inside=True, flops=True)


def filter_grad_rows(xp, x, dy, g, w_shape):
    """Conv2DBackpropFilter for a row-tap geometry: kernel row i's weights get
    dy [O, its output rows] @ columns [its input rows]^T, the contraction (every pixel of the batch)
    cut in fixed parts spread over the threads in one hand-off, the parts summed in order."""
    n, c, h = x.shape[0], x.shape[1], x.shape[2]
    o = w_shape[0]
    dyt = xp.empty((o, g.oh, g.ow, n), dtype=dy.dtype)  # dy's columns in cols' (h, ow, n) order
    dy_src = dy.transpose(1, 2, 3, 0)

    def relay_dy(c0, c1, c_):  # the channel chunk's share of dy's relayout, in the same hand-off
        if _compiled(xp, dy) and (c0, c1) == (0, c_):
            from ...jit.par_conv import nchw_to_chwn_range  # deferred: loads numba
            par_rows(nchw_to_chwn_range, (dy, dyt), o, 2 * dy.nbytes)
            return
        o0, o1 = o * c0 // c_, o * c1 // c_
        dyt[o0:o1] = dy_src[o0:o1]
    cols = row_tap_columns(xp, x, g, relay_dy)
    run = n * g.ow
    dyt = dyt.reshape(o, g.oh * run)
    kc = g.kw * c
    tasks = []  # (kernel row, first dy column, first cols column, columns)
    for i, (lo, hi, src) in enumerate(row_spans(g, h)):
        k = (hi - lo) * run
        if k <= 0:
            continue  # the kernel row reads only padding: its weights' gradient stays 0
        parts = ksplit_parts(o, k, kc) if xp is np else 1
        bounds = [k * p // parts for p in range(parts + 1)]
        tasks += [(i, lo * run + bounds[p], src * run + bounds[p], bounds[p + 1] - bounds[p]) for p in range(parts)]
    partial = xp.empty((len(tasks), o, kc), dtype=x.dtype)
    if _compiled_products(xp, x, dy, tasks):
        return _par_filter_grad(dyt, cols, partial, tasks, g, o, c, kc)

    def products(t0, t1):
        for t in range(t0, t1):
            _, d0, c0, k = tasks[t]
            _product(xp, dyt[:, d0:d0 + k], cols[:, c0:c0 + k].T, partial[t], add=False)
    if xp is np and len(tasks) > 1:
        threads.fan_out(products, len(tasks), 2 * o * kc * sum(t[3] for t in tasks), blas_inside=True, flops=True)
    else:
        products(0, len(tasks))
    rows = xp.zeros((g.kh, o, kc), dtype=x.dtype)
    for t, (i, _, _, _) in enumerate(tasks):
        rows[i] += partial[t]
    return xp.ascontiguousarray(rows.reshape(g.kh, o, g.kw, c).transpose(1, 3, 0, 2))


def _compiled_products(xp, x, dy, tasks) -> bool:
    """Whether the filter gradient's products and sums run compiled (jit.par_blas, jit.par_conv): float32
    numpy arrays and BLAS bound directly. They do at any thread count, in the same tasks, so one and
    two threads give the same bytes; prange splits them where threads.par_threads says it pays."""
    return xp is np and x.dtype == dy.dtype == np.float32 and len(tasks) > 0 and numpy_blas.sgemm() is not None \
        and jit.available()


def _par_filter_grad(dyt, cols, partial, tasks, g, o, c, kc):
    from ...jit.par_blas import filter_tasks_range  # deferred: loads numba
    from ...jit.par_conv import sum_parts_range  # deferred: loads numba
    table = np.array(tasks, np.int64).reshape(-1, 4)
    flops = 2 * o * kc * int(table[:, 3].sum())
    par_rows(filter_tasks_range, (numpy_blas.sgemm(), dyt, cols, partial, table), len(tasks), flops,
             flops=True, blocks=len(tasks), blas_inside=True)
    rows = np.zeros((g.kh, o, kc), dtype=partial.dtype)
    par_rows(sum_parts_range, (partial, np.ascontiguousarray(table[:, 0]), rows), o, 2 * partial.nbytes)
    return np.ascontiguousarray(rows.reshape(g.kh, o, g.kw, c).transpose(1, 3, 0, 2))


__all__ = ["row_spans", "row_tap_columns", "stacked_weights", "conv_rows", "filter_grad_rows"]
