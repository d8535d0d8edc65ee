"""In-place optimizer updates, one record each: dense Apply* and row-sparse SparseApply*.

Like the ops in state.py, variables and slots are reference inputs; every update runs under
the locks of the variables it writes (taken in name order), so concurrent steps never lose
an update. Sparse updates sum duplicate indices first and touch only the rows named.
"""
from __future__ import annotations

import contextlib
from typing import Sequence

import numpy as np

from ..errors import ExecutionError, ShapeError
from ..registry import Cost, OpDef, register
from ..shapes import compatible, fmt, num_elements_est
from .base import make

__all__: list = []


@contextlib.contextmanager
def _locked(slots):
    ordered = sorted(slots, key=lambda s: s.name)
    for s in ordered:
        s.lock.acquire()
    try:
        yield
    finally:
        for s in reversed(ordered):
            s.lock.release()


def _values(slots, node):
    vals = [s.value for s in slots]
    for s, v in zip(slots, vals):
        if v is None:
            raise ExecutionError(f"variable '{s.name}' is not initialized", node.name, node.op)
    return vals


def _make_infer(n_refs: int, sparse: bool):
    def infer(node):
        refs = node.inputs[:n_refs]
        var = refs[0]
        for r in refs:
            if r.node.op != "Variable":
                raise ShapeError(f"'{r.name}' must be a Variable, got {r.node.op}")
            if r.dtype != var.dtype or not compatible(r.shape, var.shape):
                raise ShapeError(f"slot '{r.name}' {r.dtype.name}{fmt(r.shape)} does not match "
                                 f"variable {var.dtype.name}{fmt(var.shape)}")
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
        n = num_elements_est(node.inputs[-1].shape if "Sparse" not in node.op else node.inputs[-2].shape)
        isz = node.inputs[0].dtype.itemsize
        return Cost(k * n, (k / 2 + 1) * n * isz, (k / 2) * n * isz)
    return cost


def _dedupe(xp, values, indices):
    """Rows and summed values per distinct index: duplicates accumulate, as dense would."""
    uniq, inv = xp.unique(indices, return_inverse=True)
    if len(uniq) == len(indices):  # no duplicates: only reorder the rows to match `uniq`
        return uniq, _perm(values, inv)
    summed = xp.zeros((len(uniq),) + values.shape[1:], dtype=values.dtype)
    xp.add.at(summed, inv, values)
    return uniq, summed


def _perm(values, inv):
    out = np.empty_like(values)
    out[inv] = values
    return out


def _register(name: str, n_refs: int, scalars: Sequence[str], update, sparse: bool, doc: str, k: float):
    inputs = tuple(f"ref{i}" for i in range(n_refs)) + tuple(scalars) + (("values", "indices") if sparse else ("grad",))

    def factory(node, ctx):
        slots = [ctx.var_slot(node.inputs[i].node) for i in range(n_refs)]
        xp = ctx.xp
        attrs = node.attrs

        def run(*args):
            with _locked(slots):
                refs = _values(slots, node)
                if sparse:
                    *sc, values, indices = args
                    rows, summed = _dedupe(xp, values, indices.astype(np.int64, copy=False))
                    n = refs[0].shape[0]
                    if len(rows) and (rows[0] < 0 or rows[-1] >= n):
                        raise IndexError(f"index out of range [0, {n}) for variable '{slots[0].name}'")
                    sub = [r[rows] for r in refs]
                    update(xp, sub, *sc, summed, **attrs)
                    for r, s_ in zip(refs, sub):
                        r[rows] = s_
                else:
                    update(xp, refs, *args, **attrs)
                return refs[0]
        return run

    register(OpDef(name, inputs=inputs, attrs={"use_nesterov": False} if "Momentum" in name else {},
                   infer=_make_infer(n_refs, sparse), kernel=factory, stateful=True,
                   ref_inputs=tuple(range(n_refs)), cost=_cost(k), doc=doc))


# ---- the update rules, shared by the dense and sparse ops -----------------------------------------
def _sgd(xp, refs, lr, g):
    var, = refs
    var -= lr.astype(var.dtype) * g


def _momentum(xp, refs, lr, momentum, g, use_nesterov=False):
    var, accum = refs
    lr, m = lr.astype(var.dtype), momentum.astype(var.dtype)
    accum *= m
    accum += g
    if use_nesterov:
        var -= lr * (g + m * accum)
    else:
        var -= lr * accum


def _adam(xp, refs, lr, beta1, beta2, eps, step, g):
    var, m, v = refs
    t = float(step) + 1.0
    b1, b2 = float(beta1), float(beta2)
    lr_t = float(lr) * np.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t)
    m *= var.dtype.type(b1)
    m += var.dtype.type(1 - b1) * g
    v *= var.dtype.type(b2)
    v += var.dtype.type(1 - b2) * (g * g)
    var -= var.dtype.type(lr_t) * m / (xp.sqrt(v) + var.dtype.type(float(eps)))


def _adagrad(xp, refs, lr, g):
    var, accum = refs
    accum += g * g
    var -= lr.astype(var.dtype) * g / xp.sqrt(accum)


for _sparse in (False, True):
    _p = "SparseApply" if _sparse else "Apply"
    _register(_p + "GradientDescent", 1, ("lr",), _sgd, _sparse, "var -= lr * grad", 2)
    _register(_p + "Momentum", 2, ("lr", "momentum"), _momentum, _sparse,
              "accum = momentum * accum + grad; var -= lr * accum (Nesterov: lr * (grad + momentum * accum))", 5)
    _register(_p + "Adam", 3, ("lr", "beta1", "beta2", "epsilon", "step"), _adam, _sparse,
              "Adam with bias correction from `step` (updates done before this one); sparse = lazy Adam", 12)
    _register(_p + "Adagrad", 2, ("lr",), _adagrad, _sparse, "accum += grad^2; var -= lr * grad / sqrt(accum)", 6)


def apply(op: str, refs, scalars, grad, attrs=None, indices=None, name=None):
    """Build an update op: refs are Variables, scalars Tensors, grad a Tensor (values if sparse)."""
    ins = list(refs) + list(scalars) + [grad] + ([indices] if indices is not None else [])
    return make(op, ins, attrs or {}, name=name)
