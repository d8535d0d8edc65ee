"""LSTMSequence's compiled path (CPU, float32): the step loop without numpy's per-pass overhead.

numpy runs a step as about ten passes over the gates, each paying a call's overhead; at small batch
that overhead is most of a step. Up to COMPILED_UNITS (batch x hidden) the whole direction is one
call of jit/rnn.py's lstm_steps (the loop the edge's kernel runs), whose matrix-vector products walk
the examples one at a time; beyond, each step is one BLAS GEMM for the recurrent product and one
compiled call (lstm_cells) for the gates; above batch 2, where the CPU has AVX2 and H is a multiple
of 4, the whole direction is one call of lstm_steps_packed instead (the recurrent product on
jit.gemm_f32's register tile with R^T packed once). The input projection of all steps is one GEMM
up front (the biases are added in the cell, which reads each gate anyway, not in a pass over the
projection); the weights are rearranged (sigmoid rows negated, R transposed) once per set of
constant weights.
"""
from __future__ import annotations

import numpy as np

from ... import jit
from .depthwise import _immutable
from .intra_op import matmul as split_matmul
from .intra_op import serial_blas
from .par_gate import split_rows

# batch x hidden up to which lstm_steps' matrix-vector loops beat a GEMM per step (measured here,
# one thread, T = 32, I = 64, H = 128, shared load: batch 1 0.24 against 0.33 ms, 4 0.71 / 1.06 ms,
# 8 1.52 / 1.55 ms, 16 2.65 / 2.42 ms)
COMPILED_UNITS = 1024
# batches above this run lstm_steps_packed (the recurrent product on jit.gemm_f32's register tile, R^T
# packed once) where H is a multiple of 4 and AVX2 serves: T = 32, I = 64, H = 128, one thread, load 3:
# batch 2 0.44 against the loop's 0.38 ms, 4 0.83 / 1.29, 8 1.33 / 2.42, 32 3.8 against the GEMM
# steps' 6.6 ms
_PACKED_MIN_BATCH = 2


def compiled_pays(xp, dtype, batch: int, hid: int, lens) -> bool:
    """Whether LSTMSequence runs the compiled loop for these arrays (else its numpy steps)."""
    return xp is np and dtype == np.float32 and lens is None and jit.available()


class CompiledLSTM:
    """One LSTMSequence node's compiled path; holds the rearranged weights of immutable inputs."""

    def __init__(self, reverse: bool):
        self.reverse = reverse
        self._prepared = None  # (w, r, b, (w_t, rt, bias)) for immutable w, r, b
        self._panels = None  # (w, r, b, R^T in 16-column panels) for immutable w, r, b

    def _weights(self, w, r, b):
        cached = self._prepared
        if cached is not None and cached[0] is w and cached[1] is r and cached[2] is b:
            return cached[3]
        hid = r.shape[1]
        neg = np.ones((4 * hid, 1), np.float32)
        neg[:3 * hid] = -1  # sigmoid rows negated: the loop computes sigmoid(z) as 1 / (1 + exp(-z))
        prepared = (np.ascontiguousarray((w * neg).T, np.float32), np.ascontiguousarray((r * neg).T, np.float32),
                    (b * neg[:, 0]).astype(np.float32))
        if _immutable(w) and _immutable(r) and _immutable(b):
            self._prepared = (w, r, b, prepared)  # holding them keeps their identities unique
        return prepared

    def _packed(self, rt, w, r, b):
        """R^T (sigmoid rows negated) in jit.gemm_pixels' 16-column panels, once per constant weights."""
        cached = self._panels
        if cached is not None and cached[0] is w and cached[1] is r and cached[2] is b:
            return cached[3]
        from ...jit.gemm_pixels import pack_weights_t  # deferred: loads llvmlite, numba
        wt = pack_weights_t(np.ascontiguousarray(rt.T))
        if _immutable(w) and _immutable(r) and _immutable(b):
            self._panels = (w, r, b, wt)  # holding them keeps their identities unique
        return wt

    def __call__(self, x, w, r, b, h0, c0):
        steps, batch, feat = x.shape
        hid = r.shape[1]
        w_t, rt, bias = self._weights(w, r, b)
        proj = split_matmul(np, x.reshape(steps * batch, feat), w_t).reshape(steps, batch, 4 * hid)
        order = np.arange(steps - 1, -1, -1) if self.reverse else np.arange(steps)
        h0s = np.zeros((batch, hid), np.float32) if h0 is None else np.array(h0, np.float32, order="C")
        c = np.zeros((batch, hid), np.float32) if c0 is None else np.array(c0, np.float32, order="C")
        y = np.empty((steps, batch, hid), np.float32)
        if batch > _PACKED_MIN_BATCH and hid % 4 == 0 and _tile_ok():
            quads = -(-batch // 4)
            args = (proj, bias, self._packed(rt, w, r, b), order, h0s, c, y, np.empty((4 * quads, 4 * hid), np.float32),
                    np.empty((quads, hid, 4), np.float32), np.zeros(4 * quads, np.float32))
            # the examples' recurrences split by row quads across threads (par_gate.split_rows: one
            # parallel region for the whole sequence, the same bytes however the quads are cut)
            split_rows(_jit_rnn().lstm_quads_range, args, quads, 8.0 * steps * batch * hid * hid, flops=True)
        elif batch * hid <= COMPILED_UNITS:
            proj += bias
            _jit_rnn().lstm_steps(proj, rt, order, h0s, c, y, np.empty(4 * hid, np.float32))
        else:
            serial_blas(np, lambda: _gemm_steps(proj, bias, rt, order, h0s, c, y))
        return y, y[order[-1]], c


def _tile_ok() -> bool:
    return _jit_rnn().supported()


_JIT = []  # jit.rnn, once loaded (an import statement per call cost a few us of a batch-1 run)


def _jit_rnn():
    if not _JIT:
        from ...jit import rnn  # deferred: loads llvmlite and numba
        _JIT.append(rnn)
    return _JIT[0]


def _gemm_steps(proj, bias, rt, order, h0, c, y) -> None:
    """Larger batches: each step's recurrent product is one BLAS GEMM ([B, H] x [H, 4H]) and its gates
    one compiled call, instead of lstm_steps' per-example matrix-vector loops. The caller holds BLAS
    to one thread (serial_blas): a threaded BLAS waits on its other threads after every step."""
    lstm_cells = _jit_rnn().lstm_cells
    matmul = np.matmul
    z = np.empty(proj.shape[1:], np.float32)
    hp = h0
    for t in order:
        matmul(hp, rt, out=z)
        lstm_cells(z, proj[t], bias, c, y[t])
        hp = y[t]
