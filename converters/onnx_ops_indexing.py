"""ONNX import of the indexing, ordering, reduction and layout ops added for issue 20: Tile, ArgMin,
CumSum, TopK, Trilu, OneHot, NonZero, Size, GatherElements, Scatter(Elements), GatherND, ScatterND,
ReduceProd/L1/L2/LogSum/LogSumExp, DepthToSpace, SpaceToDepth, GlobalMaxPool."""
from __future__ import annotations

import numpy as np

import isthmus.core as ism

from isthmus.core.ops.arange import arange

from .onnx_import import OnnxImportError, handler
from .onnx_ops_elementwise import attrs, where


def known(c, node, i: int) -> bool:
    """Whether input i is given and known at import."""
    return len(node.input) > i and bool(node.input[i]) and node.input[i] in c.consts


def const_input(c, node, i: int, what: str, default=None):
    """Input i's value, which must be known at import (an initializer, a Constant or a folded value)."""
    if len(node.input) <= i or not node.input[i]:
        if default is None:
            raise OnnxImportError(f"{where(node)}: {what} (input {i}) is missing")
        return default
    name = node.input[i]
    if name not in c.consts:
        raise OnnxImportError(f"{where(node)}: {what} must be known at import (initializer or Constant); "
                              f"'{name}' is computed at run time")
    return np.asarray(c.consts[name])


@handler("Tile", 6)
def _tile(c, node, ins):
    if node.input[1] in c.consts:
        return [ism.tile(ins[0], [int(r) for r in const_input(c, node, 1, "repeats").reshape(-1)])]
    return [_tile_run_time(ins[0], ism.cast(ins[1], np.int64))]


def _tile_run_time(x, reps):
    """Tile by repeats known at run time: a unit axis before each axis, broadcast to (rep0, d0, rep1,
    d1, ...), reshaped to (rep0 * d0, rep1 * d1, ...)."""
    r = len(x.shape)
    dims = ism.shape(x, "int64")
    y = x
    for i in range(r):
        y = ism.expand_dims(y, 2 * i)
    target = ism.concat([t for i in range(r) for t in (reps[i:i + 1], dims[i:i + 1])], 0)
    grown = ism.logical_or(y, ism.fill(target, False, x.dtype)) if x.dtype.kind == "b" else \
        ism.add(y, ism.fill(target, 0, x.dtype))
    return ism.reshape_to(grown, ism.mul(dims, reps))


@handler("ArgMin", 1)
def _argmin(c, node, ins):
    at = attrs(node)
    x, axis, keep = ins[0], int(at.get("axis", 0)), int(at.get("keepdims", 1))
    axis = axis % max(len(x.shape), 1)
    if int(at.get("select_last_index", 0)):  # the last of tied minima: argmin of the reversed axis
        n = x.shape[axis]
        if n is None:
            raise OnnxImportError(f"{where(node)}: select_last_index needs the size of axis {axis} at import")
        key = [slice(None)] * len(x.shape)
        key[axis] = slice(None, None, -1)
        y = ism.sub(ism.constant(np.int64(n - 1)), ism.argmin(x[tuple(key)], axis))
    else:
        y = ism.argmin(x, axis)
    return [ism.expand_dims(y, axis) if keep else y]


@handler("CumSum", 11)
def _cumsum(c, node, ins):
    at = attrs(node)
    axis = int(const_input(c, node, 1, "axis").reshape(())) if known(c, node, 1) else ins[1]
    return [ism.cumsum(ins[0], axis, bool(at.get("exclusive", 0)), bool(at.get("reverse", 0)))]


@handler("TopK", 1)
def _top_k(c, node, ins):
    at = attrs(node)
    if c.opset < 10:
        k = int(at["k"])
    else:
        k = int(const_input(c, node, 1, "k").reshape(-1)[0]) if known(c, node, 1) else ins[1]
    return list(ism.top_k(ins[0], k, int(at.get("axis", -1)), bool(at.get("largest", 1))))


@handler("Trilu", 14)
def _trilu(c, node, ins):
    k = int(const_input(c, node, 1, "k", np.int64(0)).reshape(())) if known(c, node, 1) or len(ins) < 2 \
        or ins[1] is None else ins[1]
    return [ism.trilu(ins[0], bool(attrs(node).get("upper", 1)), k)]


@handler("OneHot", 9)
def _one_hot(c, node, ins):
    idx, values = ins[0], ins[2]
    if idx.dtype.kind == "f":
        idx = ism.cast(idx, "int64")
    if known(c, node, 1):
        depth = int(const_input(c, node, 1, "depth").reshape(-1)[0])
        idx = ism.where(ism.less(idx, ism.constant(0, idx.dtype)), ism.add(idx, ism.constant(depth, idx.dtype)), idx)
        hot = ism.one_hot(idx, depth, values.dtype)
    else:  # depth computed at run time: compare against arange(depth)
        depth = ism.cast(ism.reshape(ins[1], ()), idx.dtype)
        idx = ism.where(ism.less(idx, ism.constant(0, idx.dtype)), ism.add(idx, depth), idx)
        classes = arange(ism.constant(0, idx.dtype), depth, ism.constant(1, idx.dtype))
        hot = ism.cast(ism.equal(ism.expand_dims(idx, -1), classes), values.dtype)
    off, on = values[0], values[1]
    y = ism.add(ism.mul(hot, ism.sub(on, off)), off)
    rank = len(y.shape)
    axis = int(attrs(node).get("axis", -1)) % rank
    if axis != rank - 1:
        perm = list(range(rank - 1))
        perm.insert(axis, rank - 1)
        y = ism.transpose(y, perm)
    return [y]


@handler("NonZero", 9)
def _nonzero(c, node, ins):
    return [ism.nonzero(ins[0])]


@handler("Size", 1)
def _size(c, node, ins):
    return [ism.size(ins[0])]


@handler("GatherElements", 11)
def _gather_elements(c, node, ins):
    return [ism.gather_elements(ins[0], ins[1], int(attrs(node).get("axis", 0)))]


@handler("Scatter", 9)  # deprecated at opset 11 in favour of ScatterElements; same semantics
@handler("ScatterElements", 11)
def _scatter_elements(c, node, ins):
    at = attrs(node)
    return [ism.scatter_elements(ins[0], ins[1], ins[2], int(at.get("axis", 0)), at.get("reduction", "none"))]


@handler("GatherND", 11)
def _gather_nd(c, node, ins):
    return [ism.gather_nd(ins[0], ins[1], int(attrs(node).get("batch_dims", 0)))]


@handler("ScatterND", 11)
def _scatter_nd(c, node, ins):
    return [ism.scatter_nd(ins[0], ins[1], ins[2], attrs(node).get("reduction", "none"))]


# ---- reductions built from primitives (their gradients come with them) ----------------------------------
def _log_sum_exp(x, axes, keep):
    m = ism.stop_gradient(ism.reduce_max(x, axes, keepdims=True))
    m = ism.where(ism.isinf(m), ism.zeros_like(m), m)  # all -inf (or an inf): no shift
    s = ism.log(ism.reduce_sum(ism.exp(ism.sub(x, m)), axes, keepdims=keep))
    return ism.add(s, m if keep else ism.reshape(m, s.shape) if all(d is not None for d in s.shape)
                   else ism.squeeze(m, axes if axes is not None else None))


_REDUCERS = {
    "ReduceProd": lambda x, axes, keep: ism.reduce_prod(x, axes, keep),
    "ReduceL1": lambda x, axes, keep: ism.reduce_sum(ism.abs(x), axes, keepdims=keep),
    "ReduceL2": lambda x, axes, keep: ism.sqrt(ism.reduce_sum(ism.square(x), axes, keepdims=keep)),
    "ReduceLogSum": lambda x, axes, keep: ism.log(ism.reduce_sum(x, axes, keepdims=keep)),
    "ReduceLogSumExp": _log_sum_exp,
}
_INT_OK = {"ReduceProd", "ReduceL1"}


def _reduce(c, node, ins):
    at = attrs(node)
    x, keep, noop = ins[0], bool(at.get("keepdims", 1)), bool(at.get("noop_with_empty_axes", 0))
    axes = at.get("axes")
    if len(node.input) > 1 and node.input[1]:
        if not known(c, node, 1):
            return [_reduce_run_time(node, x, ins[1], keep, noop)]
        axes = [int(a) for a in const_input(c, node, 1, "axes").reshape(-1)]
    if not axes:
        if noop:
            return [ism.identity(x)]
        axes = None
    else:
        axes = tuple(int(a) % len(x.shape) for a in axes)
    f = _REDUCERS[node.op_type]
    if x.dtype.kind != "f" and node.op_type not in _INT_OK:
        dt = x.dtype
        return [ism.cast(f(ism.cast(x, "float64"), axes, keep), dt)]
    return [f(x, axes, keep)]


for _op in _REDUCERS:
    handler(_op, 1)(_reduce)


def _reduce_run_time(node, x, axes, keep, noop):
    """The same reductions over axes computed at run time (ReduceDynamic underneath)."""
    dt = x.dtype
    if dt.kind != "f" and node.op_type not in _INT_OK:
        x = ism.cast(x, "float64")

    def red(v, kind, k=keep):
        return ism.reduce_dynamic(v, axes, kind, k, noop)
    op = node.op_type
    if op == "ReduceProd":
        y = red(x, "prod")
    elif op == "ReduceL1":
        y = red(ism.abs(x), "sum")
    elif op == "ReduceL2":
        y = ism.sqrt(red(ism.square(x), "sum"))
    elif op == "ReduceLogSum":
        y = ism.log(red(x, "sum"))
    else:  # ReduceLogSumExp, shifted by the maximum
        m = red(x, "max", True)
        m = ism.where(ism.isinf(m), ism.zeros_like(m), m)  # all -inf (or an inf): no shift
        s = red(ism.exp(ism.sub(x, m)), "sum")
        y = ism.add(ism.log(s), m if keep else red(m, "max", False))
    return ism.cast(y, dt) if y.dtype != dt else y


@handler("GlobalMaxPool", 1)
def _global_max_pool(c, node, ins):
    x = ins[0]
    return [ism.reduce_max(x, tuple(range(2, len(x.shape))), keepdims=True)]


# ---- DepthToSpace / SpaceToDepth: a reshape, a transpose and a reshape -------------------------------------
def _known_chw(node, x):
    if len(x.shape) != 4 or any(d is None for d in x.shape[1:]):
        raise OnnxImportError(f"{where(node)}: needs an NCHW input with C, H, W known at import, got {x.shape}")
    return x.shape[1:]


@handler("DepthToSpace", 1)
def _depth_to_space(c, node, ins):
    at = attrs(node)
    b, mode = int(at["blocksize"]), at.get("mode", "DCR")
    x = ins[0]
    ch, h, w = _known_chw(node, x)
    if ch % (b * b):
        raise OnnxImportError(f"{where(node)}: {ch} channels do not divide into blocks of {b}x{b}")
    cb = ch // (b * b)
    if mode == "DCR":
        y = ism.transpose(ism.reshape(x, (-1, b, b, cb, h, w)), (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        y = ism.transpose(ism.reshape(x, (-1, cb, b, b, h, w)), (0, 1, 4, 2, 5, 3))
    else:
        raise OnnxImportError(f"{where(node)}: unknown mode {mode!r} (DCR or CRD)")
    return [ism.reshape(y, (-1, cb, h * b, w * b))]


@handler("SpaceToDepth", 1)
def _space_to_depth(c, node, ins):
    at = attrs(node)
    b, mode = int(at["blocksize"]), at.get("mode", "DCR")
    x = ins[0]
    ch, h, w = _known_chw(node, x)
    if h % b or w % b:
        raise OnnxImportError(f"{where(node)}: spatial size {h}x{w} is not a multiple of the block {b}")
    if mode not in ("DCR", "CRD"):
        raise OnnxImportError(f"{where(node)}: unknown mode {mode!r} (DCR or CRD)")
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    y = ism.transpose(ism.reshape(x, (-1, ch, h // b, b, w // b, b)), perm)
    return [ism.reshape(y, (-1, ch * b * b, h // b, w // b))]
