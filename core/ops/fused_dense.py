"""FusedMatMul's compiled path (CPU, float32, constant weights): a dense layer at small batch on
jit/dense.py's register tile, the weights and bias packed once per node, the relu/relu6 clamp in
the tile's epilogue, instead of BLAS (which repacks the weights on every call) and two numpy passes;
at batch 1 jit/dense.py's matrix-vector loop with the bias and clamp in the same call."""
from __future__ import annotations

import numpy as np

from ... import jit
from .depthwise import _immutable
from .par_gate import may_split, split_rows

_CLAMPS = {"none": (-np.inf, np.inf), "relu": (0.0, np.inf), "relu6": (0.0, 6.0)}


class PackedDense:
    """One FusedMatMul node's packed path; holds the packed weights of immutable (constant) inputs."""

    def __init__(self, activation: str, transpose_b: bool):
        self.clamp = tuple(np.float32(v) for v in _CLAMPS[activation]) if activation in _CLAMPS else None
        self.transpose_b = transpose_b
        self._cached = None  # (b, bias, packed)
        self._decided = None  # (b, bias, a's shape, a's dtype, the path: "tile", "gemv" or "" for BLAS)

    def path(self, a, b, bias) -> str:
        """How this call runs: "tile", "gemv", or "" (the caller's BLAS path); decided once per
        constant weights and input shape (the checks cost about 10 us, a tenth of a batch-1 layer)."""
        d = self._decided
        if d is not None and d[0] is b and d[1] is bias and d[2] == a.shape and d[3] == a.dtype and \
                type(a) is np.ndarray:
            return d[4]
        path = self._decide(a, b, bias)
        if path is not None:
            self._decided = (b, bias, a.shape, a.dtype, path)
        return path or ""

    def _decide(self, a, b, bias):
        """The path for constant weights ("tile", "gemv", or "": BLAS; the decision is then kept),
        None for others (BLAS)."""
        if self.clamp is None or not (type(a) is np.ndarray and a.ndim == 2 and b.ndim == 2 and bias.ndim == 1):
            return None
        if not (_immutable(b) and _immutable(bias)):
            return None
        n = b.shape[0] if self.transpose_b else b.shape[1]
        if not (a.dtype == b.dtype == bias.dtype == np.float32) or bias.shape[0] != n or not jit.available():
            return ""
        if a.shape[0] == 1:  # a matrix-vector product on the weights as they are
            return "gemv" if gemv_weights(b, bias, self.transpose_b) else ""
        return "tile" if _jit_dense().dense_pays(a.shape[0], a.shape[1], n) else ""

    def _packed(self, b, bias):
        cached = self._cached
        if cached is not None and cached[0] is b and cached[1] is bias:
            return cached[2]
        packed = _jit_dense().pack_dense(b.T if self.transpose_b else b, bias)
        self._cached = (b, bias, packed)  # immutable: holding them keeps their identities unique
        return packed

    def __call__(self, a, b, bias, path: str):
        jd = _jit_dense()
        m, k = a.shape
        n = bias.shape[0]
        lo, hi = self.clamp
        if path == "gemv":
            y = np.empty((1, n), np.float32)
            jd.gemv_bias_clamp(a[0], b, bias, lo, hi, y[0])
            return y
        wt = self._packed(b, bias)
        quads = -(-m // 4)
        rows = np.empty((quads, k + 1, 4), np.float32)
        y = np.empty((4 * quads, wt.shape[0] * wt.shape[2]), np.float32)
        zeros = _zeros(4 * quads)
        flops = 2 * m * k * n
        if not may_split(wt.shape[0], flops, flops=True):  # one call
            jd.dense(a, rows, wt, zeros, y, lo, hi)
        else:  # whole panels per block (par_gate.split_rows): each output column is computed alike on any threads
            jd.pack_rows(a, rows)
            split_rows(jd.dense_panels_range, (rows, wt, zeros, y, lo, hi), wt.shape[0], flops, flops=True)
        if y.shape[1] != n:  # the last panel's columns past n
            return np.ascontiguousarray(y[:m, :n])
        return y if 4 * quads == m else y[:m]


def gemv_weights(b, bias, transpose_b: bool) -> bool:
    """Whether constant weights b [K, N] and bias [N] take the matrix-vector loop for one input row
    (PackedDense._decide's "gemv"): float32, read-only, b as it lies (not transposed, C order)."""
    return (not transpose_b and getattr(b, "ndim", 0) == 2 and getattr(bias, "ndim", 0) == 1
            and b.dtype == bias.dtype == np.float32 and bias.shape[0] == b.shape[1] and b.flags.c_contiguous
            and _immutable(b) and _immutable(bias))


def gemv_at_batch_1(node) -> bool:
    """Whether a FusedMatMul node runs on the matrix-vector loop when its input has one row, decided from
    the graph (its weights and bias constants): such a run makes no BLAS call (core.executor holds
    BLAS to one thread only for runs that make one)."""
    if node.op != "FusedMatMul" or node.attrs.get("transpose_a") or node.attrs.get("activation") not in _CLAMPS:
        return False
    a, b, bias = node.inputs
    if b.node.op != "Const" or bias.node.op != "Const" or a.dtype != np.float32:
        return False
    return gemv_weights(b.node.attrs.get("value"), bias.node.attrs.get("value"),
                        bool(node.attrs.get("transpose_b"))) and jit.available()


_JIT = []  # jit.dense, once loaded (an import statement per call cost a few us of a batch-1 layer)


def _jit_dense():
    if not _JIT:
        from ...jit import dense  # deferred: loads llvmlite and numba
        _JIT.append(dense)
    return _JIT[0]


_ZEROS = [np.zeros(0, np.float32)]


def _zeros(n: int) -> np.ndarray:
    """A read-only zero vector of at least n floats (the tile's row bias, never written)."""
    z = _ZEROS[0]
    if z.size < n:
        z = np.zeros(max(n, 2 * z.size), np.float32)
        z.flags.writeable = False
        _ZEROS[0] = z
    return z[:n]
