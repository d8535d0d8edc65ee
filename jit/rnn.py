"""The recurrent loops of the fused LSTMSequence and GRUSequence kernels (the edge's and core's), compiled.

numpy runs a step as about a dozen passes over [B, G H] (one product, then gate by gate), each paying
a call's overhead: at batch 1 and H = 64 that is most of a step's time. Here a step is one loop per
example: the recurrent product as rank-1 updates over a row of gates (contiguous, so it vectorizes),
then every gate of a hidden unit at once, in one pass over the units whose exps (fastexp.exp1,
inlined) LLVM vectorizes across units. At larger batch (lstm_steps_packed) the product runs on
jit.gemm_f32's register tile instead. The input projection of all steps stays one BLAS GEMM, done
by the caller, which also negates the sigmoid gates' rows (sigmoid(z) is then 1 / (1 + exp(v)) of
what the loops read) and folds in the biases (lstm_steps_packed and lstm_cells take them apart).
"""
from __future__ import annotations

import numba as nb  # imported only when a recurrent kernel is first bound
import numpy as np

from .fastexp import FAST, exp1
from .gemm_f32 import _panels, supported  # noqa: F401  (supported: whether lstm_steps_packed's tile serves)

_F32 = np.float32
_ONE, _TWO, _MTWO = _F32(1.0), _F32(2.0), _F32(-2.0)
_FAST = FAST


@nb.njit(**_FAST)
def lstm_steps(proj, rt, order, h0, c, y, z):
    """float32. proj [T, B, 4H] (x W^T + b, rows i, o, f negated), rt [H, 4H] (R^T, likewise), order [T]
    (the times in run order), h0 [B, H] (zeros for none), c [B, H] (c0 in, c_T out), y [T, B, H] out,
    z [4H]. tanh(u) is computed as 2 / (1 + exp(-2 u)) - 1 (absolute error about 1e-7)."""
    steps, batch, g4 = proj.shape
    hid = g4 // 4
    zero = np.zeros(g4, np.float32)  # the biases are in proj
    for k in range(steps):
        t = order[k]
        for b in range(batch):
            for g in range(g4):
                z[g] = 0
            hp = y[order[k - 1], b] if k > 0 else h0[b]
            j = 0
            while j + 4 <= hid:  # four rows of R^T per pass over z: a quarter of z's loads and stores
                h_0, h_1, h_2, h_3 = hp[j], hp[j + 1], hp[j + 2], hp[j + 3]
                for g in range(g4):
                    z[g] += h_0 * rt[j, g] + h_1 * rt[j + 1, g] + h_2 * rt[j + 2, g] + h_3 * rt[j + 3, g]
                j += 4
            while j < hid:
                hv = hp[j]
                for g in range(g4):
                    z[g] += hv * rt[j, g]
                j += 1
            _lstm_cell(z, proj[t, b], zero, c[b], y[t, b])


@nb.njit(**_FAST)
def _lstm_cell(z, p, bias, c, h):
    """One example's step from z + p + bias [4H] (pre-activations, rows i, o, f negated; z the
    recurrent product, p the input projection): c [H] updated in place, h [H] written. One pass over
    the hidden units, all five exps of a unit inlined (exp1), so that LLVM vectorizes it across units."""
    hid = c.shape[0]
    h2, h3 = 2 * hid, 3 * hid
    for j in range(hid):
        gi = _ONE / (_ONE + exp1(z[j] + p[j] + bias[j]))
        go = _ONE / (_ONE + exp1(z[hid + j] + p[hid + j] + bias[hid + j]))
        gf = _ONE / (_ONE + exp1(z[h2 + j] + p[h2 + j] + bias[h2 + j]))
        gg = _TWO / (_ONE + exp1(_MTWO * (z[h3 + j] + p[h3 + j] + bias[h3 + j]))) - _ONE
        cv = gf * c[j] + gi * gg
        c[j] = cv
        h[j] = go * (_TWO / (_ONE + exp1(_MTWO * cv)) - _ONE)


@nb.njit(**_FAST)
def lstm_cells(z, proj_t, bias, c, h):
    """float32. One step of a batch whose recurrent product is already in z [B, 4H] (h_prev R^T, rows
    i, o, f negated), input projection in proj_t [B, 4H] (x_t W^T) and biases in bias [4H]: updates
    c [B, H] in place, writes h [B, H].
    For batches where one BLAS GEMM per step beats lstm_steps' matrix-vector loops."""
    for b in range(z.shape[0]):
        _lstm_cell(z[b], proj_t[b], bias, c[b], h[b])


@nb.njit(**_FAST)
def lstm_steps_packed(proj, bias, wt, order, h0, c, y, z, a, zeros):
    """lstm_steps for larger batches: each step's recurrent product h_prev R^T [B, 4H] is jit.gemm_f32's
    register tile with the examples as rows (a: h_prev packed [ceil(B/4), H, 4] per step) and R^T
    packed once in 16-column panels (wt: gemm_pixels.pack_weights_t of R, rows i, o, f negated),
    instead of a BLAS call per step that repacks all of R^T (and a Python call per step). proj [T, B,
    4H] is x W^T without the biases, bias [4H] (W's and R's summed, rows i, o, f negated), which the
    cell adds (not a pass over proj). z
    [4 ceil(B/4), 4H] scratch, zeros [4 ceil(B/4)]; 4H a multiple of 16."""
    lstm_quads_range(proj, bias, wt, order, h0, c, y, z, a, zeros, 0, a.shape[0])


@nb.njit(**_FAST)
def lstm_quads_range(proj, bias, wt, order, h0, c, y, z, a, zeros, q0, q1):
    """lstm_steps_packed for the examples of row quads [q0, q1) alone, every step (an example's
    recurrence reads only its own state; a quad's rows meet the same tiles however the quads are
    cut, so the bytes do not depend on the cuts), with those quads' rows of the scratch a and z."""
    steps, batch, g4 = proj.shape
    hid = g4 // 4
    b0, b1 = 4 * q0, min(4 * q1, batch)
    rows = (q1 - q0) * 4
    aq, zq = a[q0:q1], z[4 * q0:4 * q1]
    aq[:] = 0  # rows past the batch stay zero
    af, zf, wtf = aq.reshape(aq.size), zq.reshape(zq.size), wt.reshape(wt.size)
    inf = np.float32(np.inf)
    for k in range(steps):
        t = order[k]
        hp = y[order[k - 1]] if k > 0 else h0
        for b in range(b0, b1):
            dst, src, r = aq[(b - b0) // 4], hp[b], b % 4
            for j in range(hid):
                dst[j, r] = src[j]
        for panel in range(g4 // 16):
            _panels(af, zeros, wtf, 16, panel * hid * 16, zf, g4, panel * 16, rows, hid, -inf, inf, False)
        for b in range(b0, b1):
            _lstm_cell(zq[b - b0], proj[t, b], bias, c[b], y[t, b])


@nb.njit(**_FAST)
def gru_steps(proj, rt, rbn, lbr, order, h0, y, z, rec):
    """float32. proj [T, B, 3H] (x W^T with the biases of the projection, rows z, r negated), rt [H, 3H]
    (R^T, likewise), rbn [H] (R's bias of the new gate), lbr (linear_before_reset), order [T], h0 [B, H]
    (zeros for none), y [T, B, H] out, z [3H] and rec [H] scratch. The gates' exps are exp1, inlined, so
    their loops vectorize; tanh(u) = 2 / (1 + exp(-2 u)) - 1 (absolute error about 1e-7)."""
    steps, batch, g3 = proj.shape
    hid = g3 // 3
    h2 = 2 * hid
    for k in range(steps):
        t = order[k]
        for b in range(batch):
            hp = y[order[k - 1], b] if k > 0 else h0[b]
            for g in range(g3):
                z[g] = proj[t, b, g]
            j = 0
            while j + 4 <= hid:  # z and r gates: h R^T, four rows of R^T per pass over z
                h_0, h_1, h_2, h_3 = hp[j], hp[j + 1], hp[j + 2], hp[j + 3]
                for g in range(h2):
                    z[g] += h_0 * rt[j, g] + h_1 * rt[j + 1, g] + h_2 * rt[j + 2, g] + h_3 * rt[j + 3, g]
                j += 4
            while j < hid:
                hv = hp[j]
                for g in range(h2):
                    z[g] += hv * rt[j, g]
                j += 1
            for g in range(h2):
                z[g] = _ONE / (_ONE + exp1(z[g]))
            for j in range(hid):
                rec[j] = rbn[j] if lbr else _F32(0.0)
            for j in range(hid):  # the new gate's recurrent term: h R_n^T (+ Rb_n), or (r * h) R_n^T
                hv = hp[j] if lbr else z[hid + j] * hp[j]
                for g in range(hid):
                    rec[g] += hv * rt[j, h2 + g]
            for j in range(hid):
                u = z[h2 + j] + (z[hid + j] * rec[j] if lbr else rec[j])
                n = _TWO / (_ONE + exp1(_MTWO * u)) - _ONE
                y[t, b, j] = n + z[j] * (hp[j] - n)
