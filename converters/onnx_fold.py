"""Constant folding at ONNX import: shape arithmetic whose inputs are known at import becomes constants.

Exports compute Reshape/Expand/Pad/Slice sizes from Shape, Gather, Concat, Unsqueeze, Cast and
arithmetic. When every input is known (initializers, Constant nodes, earlier folds, or a Shape of a
tensor whose dims are all static) the node is evaluated here with numpy, so the ops that consume
the result see a constant and build static shapes; the rest stays graph computation.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import numpy as np

import isthmus.core as ism
from isthmus.core.ops.arange import range_values

from .onnx_import import _attrs

MAX_FOLD_ELEMENTS = 1 << 16  # larger results stay graph computation (they are data, not shapes)


def _ints(v) -> list:
    return [int(a) for a in np.asarray(v).reshape(-1)]


def _div(a, b):
    if a.dtype.kind in "iu":  # ONNX integer Div truncates toward zero
        q = np.abs(a) // np.maximum(np.abs(b), 1)
        return (q * np.sign(a) * np.sign(b)).astype(a.dtype)
    return a / b


def _axes(node, vals):
    at = _attrs(node)
    if "axes" in at:
        return _ints(at["axes"])
    return _ints(vals[1]) if len(vals) > 1 and vals[1] is not None else None


def _unsqueeze(node, vals):
    x, axes = vals[0], _axes(node, vals)
    rank = x.ndim + len(axes)
    for a in sorted(a % rank for a in axes):
        x = np.expand_dims(x, a)
    return x


def _squeeze(node, vals):
    axes = _axes(node, vals)
    return np.squeeze(vals[0], None if axes is None else tuple(a % vals[0].ndim for a in axes))


def _slice(node, vals):
    at = _attrs(node)
    x = vals[0]
    if "starts" in at:
        starts, ends, axes, steps = at["starts"], at["ends"], at.get("axes"), None
    else:
        starts, ends = vals[1], vals[2]
        axes = vals[3] if len(vals) > 3 else None
        steps = vals[4] if len(vals) > 4 else None
    starts, ends = _ints(starts), _ints(ends)
    axes = list(range(len(starts))) if axes is None else [a % x.ndim for a in _ints(axes)]
    steps = [1] * len(starts) if steps is None else _ints(steps)
    if 0 in steps:
        return None
    key = [slice(None)] * x.ndim
    big = 2 ** 62
    for a, s, e, st in zip(axes, starts, ends, steps):
        key[a] = slice(None if abs(s) >= big else s, None if abs(e) >= big else e, st)
    return x[tuple(key)]


def _cast(node, vals):
    from onnx import helper  # deferred: onnx is a heavy or optional dependency
    return vals[0].astype(helper.tensor_dtype_to_np_dtype(_attrs(node)["to"]))


def _gather(node, vals):
    x, idx = vals
    axis = _attrs(node).get("axis", 0) % x.ndim
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return np.take(x, idx, axis=axis)


def _reshape(node, vals):
    x, shape = vals
    shape = _ints(shape)
    if not _attrs(node).get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return x.reshape(shape)


def _reduce(f, node, vals):
    at = _attrs(node)
    axes = _axes(node, vals)
    x = vals[0]
    if not axes:
        if at.get("noop_with_empty_axes", 0):
            return x
        axes = list(range(x.ndim))
    if x.size == 0 and f in (np.max, np.min):
        return None  # the identity of an empty max/min is the handler's business
    return np.asarray(f(x, axis=tuple(a % max(x.ndim, 1) for a in axes), keepdims=bool(at.get("keepdims", 1))),
                      x.dtype)


_FOLD: Dict[str, Callable] = {
    "Identity": lambda n, v: v[0],
    "Add": lambda n, v: v[0] + v[1], "Sub": lambda n, v: v[0] - v[1], "Mul": lambda n, v: v[0] * v[1],
    "Div": lambda n, v: _div(v[0], v[1]), "Neg": lambda n, v: -v[0], "Abs": lambda n, v: np.abs(v[0]),
    "Equal": lambda n, v: np.equal(v[0], v[1]), "Less": lambda n, v: np.less(v[0], v[1]),
    "Greater": lambda n, v: np.greater(v[0], v[1]), "Not": lambda n, v: np.logical_not(v[0]),
    "Where": lambda n, v: np.where(v[0], v[1], v[2]),
    "Max": lambda n, v: np.maximum.reduce(v) if len(v) > 1 else v[0],
    "Min": lambda n, v: np.minimum.reduce(v) if len(v) > 1 else v[0],
    "Concat": lambda n, v: np.concatenate(v, axis=_attrs(n)["axis"]),
    "Gather": _gather, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Slice": _slice, "Cast": _cast,
    "Reshape": _reshape, "Range": lambda n, v: range_values(*v),
    "ReduceProd": lambda n, v: _reduce(np.prod, n, v), "ReduceSum": lambda n, v: _reduce(np.sum, n, v),
    "ReduceMax": lambda n, v: _reduce(np.max, n, v), "ReduceMin": lambda n, v: _reduce(np.min, n, v),
}


def _static_shape(node, t) -> Optional[np.ndarray]:
    if t is None or any(d is None for d in t.shape):
        return None
    at = _attrs(node)
    s = np.array(t.shape, np.int64)
    return s[at.get("start", 0):at.get("end")]


def try_fold(c, node, ins) -> Optional[List]:
    """The node's outputs as constants when they can be computed at import, else None."""
    op = node.op_type
    if node.domain not in ("", "ai.onnx") or len(node.output) != 1:
        return None
    if op == "Shape":
        val = _static_shape(node, ins[0])
    elif op == "Size" and ins and ins[0] is not None and all(d is not None for d in ins[0].shape):
        val = np.array(int(np.prod(ins[0].shape, dtype=np.int64)), np.int64)
    elif op in _FOLD and node.input and all(not n or n in c.consts for n in node.input):
        vals = [np.asarray(c.consts[n]) if n else None for n in node.input]
        if any(v is not None and (v.dtype == object or v.size > MAX_FOLD_ELEMENTS) for v in vals):
            return None
        try:
            with np.errstate(all="ignore"):
                val = _FOLD[op](node, vals)
        except Exception:  # noqa: BLE001  (let the handler build it and report any fault by name)
            return None
        if val is not None and op in ("Add", "Sub", "Mul", "Div") and vals[0].dtype != np.asarray(val).dtype:
            return None  # mixed dtypes: leave the handler's casting rules in charge
    else:
        return None
    if val is None:
        return None
    val = np.asarray(val)
    if val.dtype == object or val.dtype.kind not in "fiub" or val.size > MAX_FOLD_ELEMENTS:
        return None
    c.consts[node.output[0]] = val
    return [ism.constant(val, dtype=val.dtype)]
