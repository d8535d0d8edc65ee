"""In-place optimizer updates, one record each: dense Apply* and row-sparse SparseApply*.

Like the ops in state.py, variables and slots are reference inputs; every update runs under
the locks of the variables it writes, taken in name order (one global order, so two updates
sharing variables cannot deadlock), and concurrent steps never lose an update.

Dense updates write through `out=` into the variable, its slots and one scratch array that
the kernel allocates once (guarded by the variable's lock): a step allocates nothing the
size of the variable. Sparse updates sum duplicate indices first and touch only those rows.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import ExecutionError, ShapeError
from ..registry import Cost, OpDef, register
from ..shapes import compatible, fmt, num_elements_est
from .base import make
from ... import jit
from .intra_op import par_rows, rows_apply
from . import numpy_blas
from .numpy_blas import axpy

__all__: list = []


class _Locks:
    """Acquire several VarSlot locks in name order; release in reverse."""
    __slots__ = ("locks",)

    def __init__(self, slots):
        self.locks = [s.lock for s in sorted(slots, key=lambda s: s.name)]

    def __enter__(self):
        for lock in self.locks:
            lock.acquire()

    def __exit__(self, *exc):
        for lock in reversed(self.locks):
            lock.release()


def _make_infer(n_refs: int, scalars: Sequence[str], sparse: bool):
    def infer(node):
        refs = node.inputs[:n_refs]
        var = refs[0]
        for r in refs:
            if r.node.op != "Variable":
                raise ShapeError(f"'{r.name}' must be a Variable, got {r.node.op}")
            if r.dtype != var.dtype or not compatible(r.shape, var.shape):
                raise ShapeError(f"slot '{r.name}' {r.dtype.name}{fmt(r.shape)} does not match "
                                 f"variable {var.dtype.name}{fmt(var.shape)}")
        if len({r.node.name for r in refs}) != len(refs):  # one lock taken twice would deadlock
            raise ShapeError(f"variable and slots must be distinct: {[r.node.name for r in refs]}")
        if var.dtype.kind != "f":
            raise ShapeError(f"variable '{var.node.name}' is {var.dtype.name}; only float variables are trained")
        for s, t in zip(scalars, node.inputs[n_refs:n_refs + len(scalars)]):
            if t.shape != () or t.dtype.kind not in "fiu":
                raise ShapeError(f"'{s}' must be a numeric scalar, got {t.dtype.name}{fmt(t.shape)}")
        g = node.inputs[-2] if sparse else node.inputs[-1]
        if g.dtype != var.dtype:
            raise ShapeError(f"gradient dtype {g.dtype.name} does not match variable {var.dtype.name}")
        if sparse:
            idx = node.inputs[-1]
            if idx.dtype.kind not in "iu" or len(idx.shape) != 1:
                raise ShapeError(f"indices must be a 1-D integer tensor, got {idx.dtype.name}{fmt(idx.shape)}")
            if not compatible(g.shape, (idx.shape[0],) + tuple(var.shape[1:])):
                raise ShapeError(f"sparse gradient {fmt(g.shape)} does not fit rows of {fmt(var.shape)}")
        elif not compatible(g.shape, var.shape):
            raise ShapeError(f"gradient shape {fmt(g.shape)} does not match variable {fmt(var.shape)}")
        return [(var.dtype, var.shape)]
    return infer


def _cost(k: float):
    def cost(node):
        sparse = node.op.startswith("Sparse")
        n = num_elements_est(node.inputs[-2].shape if sparse else node.inputs[-1].shape)
        isz = node.inputs[0].dtype.itemsize
        return Cost(k * n, (k / 2 + 1) * n * isz, (k / 2) * n * isz)
    return cost


def _rows(xp, values, indices, n: int):
    """Distinct rows and their summed values: duplicates accumulate, as the dense gradient would.

    Negative indices count from the end, as in Gather; rows outside [0, n) raise IndexError.
    """
    idx = indices.astype(np.int64, copy=False)
    if idx.size and int(idx.min()) < 0:
        idx = xp.where(idx < 0, idx + n, idx)
    uniq, inv = xp.unique(idx, return_inverse=True)
    if len(uniq) and (int(uniq[0]) < 0 or int(uniq[-1]) >= n):
        bad = int(uniq[0]) if int(uniq[0]) < 0 else int(uniq[-1])
        raise IndexError(f"row {bad} is out of range [0, {n})")
    if len(uniq) == len(idx):
        return idx, values  # distinct rows: the order does not matter
    summed = xp.zeros((len(uniq),) + values.shape[1:], dtype=values.dtype)
    xp.add.at(summed, inv.reshape(-1), values)
    return uniq, summed


def _register(name: str, n_refs: int, scalars: Sequence[str], update, sparse: bool, doc: str, k: float):
    inputs = tuple(f"ref{i}" for i in range(n_refs)) + tuple(scalars) + (("values", "indices") if sparse else ("grad",))

    def factory(node, ctx):
        slots = [ctx.var_slot(node.inputs[i].node) for i in range(n_refs)]
        xp = ctx.xp
        attrs = node.attrs
        locks = slots[0].lock if n_refs == 1 else _Locks(slots)
        n_static = node.inputs[0].shape[0] if node.inputs[0].shape else None
        scratch = [None]  # one array like the variable, used only under the locks

        def values_of():
            refs = [s.value for s in slots]
            for s, v in zip(slots, refs):
                if v is None:
                    raise ExecutionError(f"variable '{s.name}' is not initialized", node.name, node.op)
            return refs

        if not sparse:
            def run(*args):
                with locks:
                    refs = values_of()
                    tmp = scratch[0]
                    if tmp is None or tmp.shape != refs[0].shape:
                        tmp = scratch[0] = xp.empty_like(refs[0])
                    _update_in_chunks(xp, update, refs, tmp, args, attrs)
                    return refs[0]
            return run

        def run_sparse(*args):
            *sc, values, indices = args
            if n_static is not None:  # dedupe outside the locks: a pure function of the inputs
                rows, summed = _rows(xp, values, indices, n_static)
            with locks:
                refs = values_of()
                if n_static is None:
                    rows, summed = _rows(xp, values, indices, refs[0].shape[0])
                sub = [r[rows] for r in refs]  # copies of the touched rows only
                update(xp, sub, xp.empty_like(sub[0]), *sc, summed, **attrs)
                for r, s in zip(refs, sub):
                    r[rows] = s
                return refs[0]
        return run_sparse

    register(OpDef(name, inputs=inputs, attrs={"use_nesterov": False} if "Momentum" in name else {},
                   infer=_make_infer(n_refs, scalars, sparse), kernel=factory, stateful=True,
                   ref_inputs=tuple(range(n_refs)), cost=_cost(k), doc=doc))


def _update_in_chunks(xp, update, refs, tmp, args, attrs) -> None:
    """update() over chunks of the variable, its slots and the gradient on the intra-op threads
    (each rule is elementwise: a chunk's bytes are those of the whole update). A large variable's
    update is memory-bound passes (the benchmark CNN's 3136x1024 dense layer: 2.4 ms of a step in
    numpy's two passes, 1.1 as one axpy) that a second core shares."""
    *scalars, g = args
    var = refs[0]
    arrays = list(refs) + [tmp]
    if xp is not np or var.ndim == 0 or getattr(g, "shape", None) != var.shape:
        update(xp, refs, tmp, *args, **attrs)
        return
    if all(a.flags.c_contiguous for a in arrays) and g.flags.c_contiguous:
        arrays, g = [a.reshape(-1) for a in arrays], g.reshape(-1)  # views: any length splits evenly
        blas_axpy = _sgd_compiled(var, g) if update is _sgd else None
        if blas_axpy is not None:
            from ...jit.par_update import axpy_range, units  # deferred: loads numba
            par_rows(axpy_range, (blas_axpy, arrays[0], g, -float(scalars[0])), units(var.size), 3 * var.nbytes,
                     blas_inside=True)
            return

    def part(lo, hi):
        update(xp, [a[lo:hi] for a in arrays[:-1]], arrays[-1][lo:hi], *scalars, g[lo:hi], **attrs)
    # blas_inside: the rules' axpy must not start BLAS threads inside a chunk; OpenBLAS runs an axpy of
    # up to _AXPY_SERIAL elements on one thread by itself, so those skip the hold (a few us an update)
    rows_apply(xp, part, arrays[0].shape[0], var.nbytes * (len(refs) + 3), blas_inside=var.size > _AXPY_SERIAL)


_AXPY_SERIAL = 10000
# From this size up a dense SGD update is BLAS's axpy over fixed units of the variable, split by prange
# (intra_op.par_rows, jit.par_update): a few microseconds to reach the second core, where the pool's
# hand-off kept a 3136x1024 update on one (2-core VM). Below it, one axpy on the caller (_sgd).
_SGD_COMPILED_MIN = 1 << 16


def _sgd_compiled(var, g):
    """numpy's bound ?axpy for this update when it splits by prange (else None)."""
    if (var.size < _SGD_COMPILED_MIN or var.dtype not in (np.float32, np.float64) or g.dtype != var.dtype
            or not var.flags.writeable or not jit.available()):
        return None
    return numpy_blas.function("axpy", var.dtype)


# ---- the update rules, shared by the dense and sparse ops; `tmp` is scratch shaped like var -------
def _sub_scaled(xp, var, a: float, x, tmp):
    """var -= a * x in place: one BLAS axpy pass where numpy's own BLAS is reached (numpy_blas; not
    scipy's, a second thread pool beside numpy's that slowed the MLP training step by a third), else
    two numpy passes through `tmp` (which may be x itself)."""
    if xp is np and axpy(-float(a), x, var):
        return
    xp.multiply(x, var.dtype.type(a), out=tmp)
    xp.subtract(var, tmp, out=var)


def _sgd(xp, refs, tmp, lr, g):
    var, = refs
    _sub_scaled(xp, var, float(lr), g, tmp)


def _momentum(xp, refs, tmp, lr, momentum, g, use_nesterov=False):
    var, accum = refs
    m = momentum.astype(var.dtype, copy=False)
    xp.multiply(accum, m, out=accum)
    xp.add(accum, g, out=accum)
    if use_nesterov:  # var -= lr * (g + m * accum)
        xp.multiply(accum, m, out=tmp)
        xp.add(tmp, g, out=tmp)
        _sub_scaled(xp, var, float(lr), tmp, tmp)
    else:
        _sub_scaled(xp, var, float(lr), accum, tmp)


def _adam(xp, refs, tmp, lr, beta1, beta2, eps, step, g):
    var, m, v = refs
    dt = var.dtype.type
    t = float(step) + 1.0
    b1, b2 = float(beta1), float(beta2)
    lr_t = float(lr) * math.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t)
    xp.multiply(m, dt(b1), out=m)            # m = b1 m + (1 - b1) g
    xp.multiply(g, dt(1.0 - b1), out=tmp)
    xp.add(m, tmp, out=m)
    xp.multiply(v, dt(b2), out=v)            # v = b2 v + (1 - b2) g^2
    xp.multiply(g, g, out=tmp)
    xp.multiply(tmp, dt(1.0 - b2), out=tmp)
    xp.add(v, tmp, out=v)
    xp.sqrt(v, out=tmp)                      # var -= lr_t m / (sqrt(v) + eps)
    xp.add(tmp, dt(float(eps)), out=tmp)
    xp.divide(m, tmp, out=tmp)
    _sub_scaled(xp, var, lr_t, tmp, tmp)


def _adagrad(xp, refs, tmp, lr, g):
    var, accum = refs
    xp.multiply(g, g, out=tmp)               # accum += g^2
    xp.add(accum, tmp, out=accum)
    xp.sqrt(accum, out=tmp)                  # var -= lr g / sqrt(accum)
    xp.divide(g, tmp, out=tmp)
    _sub_scaled(xp, var, float(lr), tmp, tmp)


for _sparse in (False, True):
    _p = "SparseApply" if _sparse else "Apply"
    _register(_p + "GradientDescent", 1, ("lr",), _sgd, _sparse, "var -= lr * grad", 2)
    _register(_p + "Momentum", 2, ("lr", "momentum"), _momentum, _sparse,
              "accum = momentum * accum + grad; var -= lr * accum (Nesterov: lr * (grad + momentum * accum))", 5)
    _register(_p + "Adam", 3, ("lr", "beta1", "beta2", "epsilon", "step"), _adam, _sparse,
              "Adam with bias correction from `step` (updates done before this one); sparse = lazy Adam "
              "(moments of untouched rows do not decay)", 12)
    _register(_p + "Adagrad", 2, ("lr",), _adagrad, _sparse, "accum += grad^2; var -= lr * grad / sqrt(accum)", 6)


def apply(op: str, refs, scalars, grad, attrs=None, indices=None, name=None):
    """Build an update op: refs are Variables, scalars 0-d Tensors, grad a Tensor (values if sparse)."""
    ins = list(refs) + list(scalars) + [grad] + ([indices] if indices is not None else [])
    return make(op, ins, attrs or {}, name=name)
