"""Batch normalization over [A, C, B] views (channel axis in the middle: NCHW is [N, C, H*W],
[N, C] is [N, C, 1]), compiled: the batch statistics, the normalization, and the training-mode
gradient, each in one or two passes over the data with float64 sums per channel.

numpy needs about ten passes for these (strided reductions over axes (0, 2, 3), then broadcast
arithmetic, each a temporary). The sums here run per channel over rows of B contiguous values,
reassociated so that they vectorize; totals are float64, so they are at least as accurate as
numpy's float32 reductions. Channels are independent: ranges of them may run on threads.
"""
from __future__ import annotations

import numba as nb  # this module is imported only when a compiled kernel first runs
import numpy as np

_OPTS = dict(nogil=True, cache=True, boundscheck=False, fastmath={"contract", "reassoc"})


@nb.njit(**_OPTS)
def _stats(x, mean, var, c0, c1):
    # two passes per channel (mean, then squared deviations), as numpy's var does
    a_n, _, b_n = x.shape
    n = a_n * b_n
    for c in range(c0, c1):
        s = 0.0
        for a in range(a_n):
            row = x[a, c]
            for b in range(b_n):
                s += np.float64(row[b])
        m = s / n
        q = 0.0
        for a in range(a_n):
            row = x[a, c]
            for b in range(b_n):
                d = np.float64(row[b]) - m
                q += d * d
        mean[c] = m
        var[c] = q / n


@nb.njit(**_OPTS)
def _apply(x, inv, shift, y, c0, c1):
    # y = x * inv[c] + shift[c]
    a_n, _, b_n = x.shape
    for a in range(a_n):
        for c in range(c0, c1):
            k, s = inv[c], shift[c]
            src, dst = x[a, c], y[a, c]
            for b in range(b_n):
                dst[b] = src[b] * k + s


@nb.njit(**_OPTS)
def _grad(dy, x, mean, inv, scale, training, dx, dgamma, dbeta, c0, c1):
    # sums of dy and dy * xhat per channel (float64); then dx in one more pass
    a_n, _, b_n = x.shape
    n = a_n * b_n
    for c in range(c0, c1):
        m, k = mean[c], inv[c]
        sb = 0.0
        sg = 0.0
        for a in range(a_n):
            g, v = dy[a, c], x[a, c]
            for b in range(b_n):
                d = np.float64(g[b])
                sb += d
                sg += d * (np.float64(v[b]) - m)
        sg *= k
        dbeta[c] = sb
        dgamma[c] = sg
        f = scale[c] * k
        if training:  # dx = f * (dy - dbeta/n - xhat * dgamma/n), xhat = (x - m) * k
            mb, mg = sb / n, sg / n * k
            for a in range(a_n):
                g, v, o = dy[a, c], x[a, c], dx[a, c]
                for b in range(b_n):
                    o[b] = f * (np.float64(g[b]) - mb - (np.float64(v[b]) - m) * mg)
        else:
            for a in range(a_n):
                g, o = dy[a, c], dx[a, c]
                for b in range(b_n):
                    o[b] = f * g[b]


# the kernels' range forms (channels c0..c1 last), for intra_op.par_rows and jit.par_pool's drivers
stats_range, apply_range, grad_range = _stats, _apply, _grad


def batch_stats(x3, c0: int, c1: int, mean, var) -> None:
    """mean[c], var[c] (float64 arrays) of channels c0..c1 of x3 [A, C, B] (population variance)."""
    _stats(x3, mean, var, c0, c1)


def normalize(x3, inv, shift, y3, c0: int, c1: int) -> None:
    """y3 = x3 * inv[c] + shift[c] for channels c0..c1 (inv, shift in x's dtype)."""
    _apply(x3, inv, shift, y3, c0, c1)


def batch_norm_grad(dy3, x3, mean, inv, scale, training: bool, dx3, dgamma, dbeta, c0: int, c1: int) -> None:
    """dx3 and the float64 dgamma, dbeta of channels c0..c1; mean, inv, scale as float64 arrays.
    training: the statistics were the batch's own (their gradient flows into dx)."""
    _grad(dy3, x3, mean, inv, scale, training, dx3, dgamma, dbeta, c0, c1)
