"""The recurrent loops of the edge's fused LSTMSequence and GRUSequence kernels, compiled.

numpy runs a step as about a dozen passes over [B, G H] (one product, then gate by gate), each paying
a call's overhead: at batch 1 and H = 64 that is most of a step's time. Here a step is one loop per
example: the recurrent product as rank-1 updates over a row of gates (contiguous, so it vectorizes),
then every gate of a hidden unit at once. The input projection of all steps stays one BLAS GEMM, done
by the caller (edge/kernels_rnn.py), which also negates the sigmoid gates' rows (sigmoid(z) is then
1 / (1 + exp(v)) of what the loops read) and folds in the biases.
"""
from __future__ import annotations

import math

import numba as nb  # imported only when a recurrent kernel is first bound
import numpy as np  # noqa: F401  (numba resolves the dtypes)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def lstm_steps(proj, rt, order, h0, c, y, z):
    """proj [T, B, 4H] (x W^T + b, rows i, o, f negated), rt [H, 4H] (R^T, likewise), order [T] (the
    times in run order), h0 [B, H] (zeros for none), c [B, H] (c0 in, c_T out), y [T, B, H] out, z [4H]."""
    steps, batch, g4 = proj.shape
    hid = g4 // 4
    for k in range(steps):
        t = order[k]
        for b in range(batch):
            for g in range(g4):
                z[g] = proj[t, b, g]
            hp = y[order[k - 1], b] if k > 0 else h0[b]
            for j in range(hid):
                hv = hp[j]
                for g in range(g4):
                    z[g] += hv * rt[j, g]
            for j in range(hid):
                i = 1.0 / (1.0 + math.exp(z[j]))
                o = 1.0 / (1.0 + math.exp(z[hid + j]))
                f = 1.0 / (1.0 + math.exp(z[2 * hid + j]))
                cv = f * c[b, j] + i * math.tanh(z[3 * hid + j])
                c[b, j] = cv
                y[t, b, j] = o * math.tanh(cv)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def gru_steps(proj, rt, rbn, lbr, order, h0, y, z, rec):
    """proj [T, B, 3H] (x W^T with the biases of the projection, rows z, r negated), rt [H, 3H] (R^T,
    likewise), rbn [H] (R's bias of the new gate), lbr (linear_before_reset), order [T], h0 [B, H] (zeros
    for none), y [T, B, H] out, z [3H] and rec [H] scratch."""
    steps, batch, g3 = proj.shape
    hid = g3 // 3
    h2 = 2 * hid
    for k in range(steps):
        t = order[k]
        for b in range(batch):
            hp = y[order[k - 1], b] if k > 0 else h0[b]
            for g in range(g3):
                z[g] = proj[t, b, g]
            for j in range(hid):  # z and r gates: h R^T
                hv = hp[j]
                for g in range(h2):
                    z[g] += hv * rt[j, g]
            for g in range(h2):
                z[g] = 1.0 / (1.0 + math.exp(z[g]))
            for j in range(hid):
                rec[j] = rbn[j] if lbr else 0.0
            for j in range(hid):  # the new gate's recurrent term: h R_n^T (+ Rb_n), or (r * h) R_n^T
                hv = hp[j] if lbr else z[hid + j] * hp[j]
                for g in range(hid):
                    rec[g] += hv * rt[j, h2 + g]
            for j in range(hid):
                n = math.tanh(z[h2 + j] + (z[hid + j] * rec[j] if lbr else rec[j]))
                y[t, b, j] = n + z[j] * (hp[j] - n)
