"""Shape and layout ops: reshape, transpose, concat, split, slice and indexing, pad, squeeze,
expand_dims, shape, fill/zeros/ones, tile, broadcast_to, one_hot."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from .. import dtypes as _dt
from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, elementwise_cost, register
from ..shapes import as_shape, broadcast, fmt, fully_defined, normalize_axis, num_elements
from .base import constant, convert, make

__all__ = ["reshape", "transpose", "concat", "split", "slice", "strided_slice", "pad", "squeeze", "expand_dims",
           "unsqueeze", "shape", "fill", "zeros", "ones", "tile", "broadcast_to", "one_hot", "flatten"]

_FREE = lambda node: Cost(0, 0, 0)  # noqa: E731  (views: no data moves)


def _out(op, inputs, attrs=None, name=None) -> Tensor:
    return make(op, inputs, attrs, name=name).outputs[0]


# ---- Reshape ------------------------------------------------------------------------------------
def _infer_reshape(node):
    x = node.inputs[0]
    target = tuple(node.attrs["shape"])
    if sum(1 for d in target if d == -1) > 1:
        raise ShapeError(f"reshape target {target} has more than one -1")
    if any(d < -1 for d in target):
        raise ShapeError(f"reshape target {target} has a negative size")
    n = num_elements(x.shape)
    known = 1
    for d in target:
        if d != -1:
            known *= d
    out = []
    for d in target:
        if d == -1:
            if n is None:
                out.append(None)
            else:
                if known == 0 or n % known:
                    raise ShapeError(f"cannot reshape {fmt(x.shape)} ({n} elements) to {target}")
                out.append(n // known)
        else:
            out.append(d)
    if n is not None and -1 not in target and known != n:
        raise ShapeError(f"cannot reshape {fmt(x.shape)} ({n} elements) to {target}")
    return [(x.dtype, tuple(out))]


def _g_reshape(node, dys):
    x = node.inputs[0]
    if fully_defined(x.shape):
        return [reshape(dys[0], x.shape)]
    return [_out("ReshapeLike", (dys[0], x))]


register(OpDef("Reshape", inputs=("x",), attrs={"shape": None}, infer=_infer_reshape,
               kernel=lambda node, ctx: (lambda x, s=tuple(node.attrs["shape"]): x.reshape(s)),
               grad=_g_reshape, cost=_FREE))
register(OpDef("ReshapeLike", inputs=("x", "like"),
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[1].shape)],
               kernel=lambda node, ctx: (lambda x, like: x.reshape(like.shape)),
               grad=lambda node, dys: [_out("ReshapeLike", (dys[0], node.inputs[0])), None], cost=_FREE))


def reshape(x, shape, name=None) -> Tensor:
    return _out("Reshape", (convert(x),), {"shape": tuple(-1 if d is None else int(d) for d in shape)}, name=name)


def _infer_flatten(node):
    x = node.inputs[0]
    a = node.attrs["axis"]
    return [(x.dtype, (num_elements(x.shape[:a]), num_elements(x.shape[a:])))]


register(OpDef("Flatten", inputs=("x",), attrs={"axis": 1}, infer=_infer_flatten,
               kernel=lambda node, ctx: (lambda x, a=node.attrs["axis"]: x.reshape(
                   (int(np.prod(x.shape[:a])), -1) if x.size else (int(np.prod(x.shape[:a])), int(np.prod(x.shape[a:]))))),
               grad=lambda node, dys: [_out("ReshapeLike", (dys[0], node.inputs[0]))], cost=_FREE,
               doc="[d0..d(a-1), da..] -> [prod(d0..d(a-1)), prod(da..)], as ONNX Flatten."))


def flatten(x, axis: int = 1, name=None) -> Tensor:
    """[N, ...] -> [N, prod(...)] (the dims before `axis` become the first)."""
    x = convert(x)
    return _out("Flatten", (x,), {"axis": normalize_axis(axis, len(x.shape) + 1)}, name=name)


# ---- Transpose ----------------------------------------------------------------------------------
def _perm(node):
    rank = len(node.inputs[0].shape)
    p = node.attrs["perm"]
    return tuple(range(rank - 1, -1, -1)) if p is None else tuple(p)


def _infer_transpose(node):
    x = node.inputs[0]
    p = _perm(node)
    if sorted(p) != list(range(len(x.shape))):
        raise ShapeError(f"perm {p} is not a permutation of the {len(x.shape)} axes")
    return [(x.dtype, tuple(x.shape[i] for i in p))]


register(OpDef("Transpose", inputs=("x",), attrs={"perm": None}, infer=_infer_transpose,
               kernel=lambda node, ctx: (lambda x, p=_perm(node): x.transpose(p)),
               grad=lambda node, dys: [transpose(dys[0], tuple(np.argsort(_perm(node))))], cost=_FREE))


def transpose(x, perm: Optional[Sequence[int]] = None, name=None) -> Tensor:
    return _out("Transpose", (convert(x),), {"perm": None if perm is None else tuple(int(p) for p in perm)}, name=name)


# ---- Concat and Split -------------------------------------------------------------------------
def _infer_concat(node):
    first = node.inputs[0]
    rank = len(first.shape)
    axis = normalize_axis(node.attrs["axis"], rank)
    total = 0
    out = list(first.shape)
    for t in node.inputs:
        if t.dtype != first.dtype:
            raise ShapeError(f"concat operands differ in dtype: {first.dtype.name} vs {t.dtype.name}")
        if len(t.shape) != rank:
            raise ShapeError(f"concat operands differ in rank: {fmt(first.shape)} vs {fmt(t.shape)}")
        for i, (a, b) in enumerate(zip(out, t.shape)):
            if i != axis and a is not None and b is not None and a != b:
                raise ShapeError(f"concat operands differ off the axis: {fmt(first.shape)} vs {fmt(t.shape)}")
            if i != axis and a is None:
                out[i] = b
        total = None if total is None or t.shape[axis] is None else total + t.shape[axis]
    out[axis] = total
    return [(first.dtype, tuple(out))]


def _g_concat(node, dys):
    axis = normalize_axis(node.attrs["axis"], len(node.inputs[0].shape))
    sizes = [t.shape[axis] for t in node.inputs]
    if all(s is not None for s in sizes):
        return split(dys[0], sizes, axis)
    n = make("SplitLike", [dys[0]] + list(node.inputs), {"axis": axis})
    return list(n.outputs[:len(node.inputs)])


register(OpDef("Concat", inputs=("x0", "*xs"), attrs={"axis": 0}, infer=_infer_concat,
               kernel=lambda node, ctx: (lambda *xs, a=node.attrs["axis"]: ctx.xp.concatenate(xs, axis=a)),
               grad=_g_concat, cost=elementwise_cost(0)))


def concat(values, axis: int = 0, name=None) -> Tensor:
    values = [convert(v) for v in values]
    if len(values) == 1:
        return values[0]
    return _out("Concat", values, {"axis": int(axis)}, name=name)


def _infer_split(node):
    x = node.inputs[0]
    axis = normalize_axis(node.attrs["axis"], len(x.shape))
    sizes = node.attrs["sizes"]
    if not sizes:  # n equal parts of a dim known only at run time
        return [(x.dtype, x.shape[:axis] + (None,) + x.shape[axis + 1:])] * node.attrs["num"]
    if x.shape[axis] is not None and sum(sizes) != x.shape[axis]:
        raise ShapeError(f"split sizes {sizes} do not add up to dim {axis} of {fmt(x.shape)}")
    return [(x.dtype, x.shape[:axis] + (s,) + x.shape[axis + 1:]) for s in sizes]


def _kernel_split(node, ctx):
    axis = normalize_axis(node.attrs["axis"], len(node.inputs[0].shape))
    cuts = list(np.cumsum(node.attrs["sizes"])[:-1]) if node.attrs["sizes"] else node.attrs["num"]
    xp = ctx.xp
    return lambda x: tuple(xp.split(x, cuts, axis=axis))


register(OpDef("Split", inputs=("x",), attrs={"sizes": (), "num": 0, "axis": 0}, infer=_infer_split, kernel=_kernel_split,
               grad=lambda node, dys: [concat([d if d is not None else _zeros_for(t) for d, t in zip(dys, node.outputs)],
                                              node.attrs["axis"])],
               cost=_FREE))


def _zeros_for(t: Tensor) -> Tensor:
    from .math import zeros_like
    return zeros_like(t)


def _infer_split_like(node):
    dy = node.inputs[0]
    axis = node.attrs["axis"]
    return [(dy.dtype, dy.shape[:axis] + (t.shape[axis],) + dy.shape[axis + 1:]) for t in node.inputs[1:]]


def _kernel_split_like(node, ctx):
    axis = node.attrs["axis"]

    def run(dy, *likes):
        cuts = list(np.cumsum([t.shape[axis] for t in likes])[:-1])
        return tuple(ctx.xp.split(dy, cuts, axis=axis))
    return run


register(OpDef("SplitLike", inputs=("x", "*likes"), attrs={"axis": 0}, infer=_infer_split_like,
               kernel=_kernel_split_like, cost=_FREE, doc="Split x along axis into pieces sized like the likes."))


def split(x, num_or_size_splits, axis: int = 0, name=None):
    x = convert(x)
    ax = normalize_axis(axis, len(x.shape))
    if isinstance(num_or_size_splits, (int, np.integer)):
        n = int(num_or_size_splits)
        d = x.shape[ax]
        if d is None:
            return list(make("Split", (x,), {"num": n, "axis": ax}, name=name).outputs)
        if d % n:
            raise ShapeError(f"dim {ax} of {fmt(x.shape)} does not split evenly into {n}")
        sizes = (d // n,) * n
    else:
        sizes = tuple(int(s) for s in num_or_size_splits)
    return list(make("Split", (x,), {"sizes": sizes, "axis": ax}, name=name).outputs)


# ---- slicing and indexing -----------------------------------------------------------------------
def _infer_strided(node):
    x = node.inputs[0]
    spec = node.attrs["spec"]
    out = []
    dim = 0
    for kind, a, b, c in spec:
        if kind == "new":
            out.append(1)
            continue
        d = x.shape[dim]
        if kind == "index":
            if d is not None and not -d <= a < d:
                raise ShapeError(f"index {a} out of range for dim {dim} of size {d}")
        else:
            out.append(None if d is None else len(range(*builtins_slice(a, b, c).indices(d))))
        dim += 1
    out.extend(x.shape[dim:])
    return [(x.dtype, tuple(out))]


import builtins as _builtins  # noqa: E402

builtins_slice = _builtins.slice


def _index_tuple(spec):
    idx = []
    for kind, a, b, c in spec:
        idx.append(None if kind == "new" else a if kind == "index" else builtins_slice(a, b, c))
    return tuple(idx)


def _kernel_strided_grad(node, ctx):
    idx = _index_tuple(node.attrs["spec"])
    xp = ctx.xp

    def run(dy, x):
        out = xp.zeros(x.shape, dtype=dy.dtype)
        out[idx] = dy
        return out
    return run


register(OpDef("StridedSlice", inputs=("x",), attrs={"spec": ()}, infer=_infer_strided,
               kernel=lambda node, ctx: (lambda x, i=_index_tuple(node.attrs["spec"]): x[i]),
               grad=lambda node, dys: [_out("StridedSliceGrad", (dys[0], node.inputs[0]), {"spec": node.attrs["spec"]})],
               cost=_FREE, doc="x[spec]: ints, slices with steps, newaxis (Tensor.__getitem__)."))
register(OpDef("StridedSliceGrad", inputs=("dy", "x"), attrs={"spec": ()},
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[1].shape)],
               kernel=_kernel_strided_grad, cost=elementwise_cost(1)))


def strided_slice(x, key, name=None) -> Tensor:
    x = convert(x)
    if not isinstance(key, tuple):
        key = (key,)
    rank = len(x.shape)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    spec = []
    for k in key:
        if k is Ellipsis:
            spec.extend([("slice", None, None, None)] * (rank - n_real))
        elif k is None:
            spec.append(("new", 0, 0, 0))
        elif isinstance(k, builtins_slice):
            spec.append(("slice", k.start, k.stop, k.step))
        elif isinstance(k, (int, np.integer)):
            spec.append(("index", int(k), 0, 0))
        elif isinstance(k, Tensor):
            raise TypeError("tensor indices are not supported by []; use gather(x, indices)")
        else:
            raise TypeError(f"unsupported index {k!r}: use ints, slices, None or ...")
    if sum(1 for s in spec if s[0] != "new") > rank:
        raise ShapeError(f"too many indices for {fmt(x.shape)}")
    return _out("StridedSlice", (x,), {"spec": tuple(spec)}, name=name)


def slice(x, begin, size, name=None) -> Tensor:  # noqa: A001
    """x[begin[i] : begin[i] + size[i]] per axis; size -1 means to the end."""
    x = convert(x)
    key = tuple(builtins_slice(int(b), None if int(s) == -1 else int(b) + int(s)) for b, s in zip(begin, size))
    return strided_slice(x, key, name=name)


Tensor.__getitem__ = lambda self, key: strided_slice(self, key)


# ---- Pad -------------------------------------------------------------------------------------------
def _infer_pad(node):
    x = node.inputs[0]
    p = node.attrs["paddings"]
    if len(p) != len(x.shape):
        raise ShapeError(f"{len(p)} paddings for rank {len(x.shape)}")
    return [(x.dtype, tuple(None if d is None else d + a + b for d, (a, b) in zip(x.shape, p)))]


def _kernel_pad(node, ctx):
    p, mode, v = node.attrs["paddings"], node.attrs["mode"], node.attrs["constant_value"]
    xp = ctx.xp
    if mode == "constant":
        return lambda x: xp.pad(x, p, mode="constant", constant_values=x.dtype.type(v))
    return lambda x: xp.pad(x, p, mode={"reflect": "reflect", "edge": "edge"}[mode])


def _g_pad(node, dys):
    if node.attrs["mode"] != "constant":
        return [_out("PadGrad", (dys[0], node.inputs[0]), {"paddings": node.attrs["paddings"], "mode": node.attrs["mode"]})]
    key = tuple(builtins_slice(a, None if b == 0 else -b) for a, b in node.attrs["paddings"])
    return [strided_slice(dys[0], key)]


def _kernel_pad_grad(node, ctx):
    p, mode = node.attrs["paddings"], node.attrs["mode"]
    xp = ctx.xp

    def run(dy, x):
        # accumulate each padded position back onto the source element it copied
        idx = [xp.pad(xp.arange(n), pw, mode=mode) for n, pw in zip(x.shape, p)]
        out = xp.zeros(x.shape, dtype=dy.dtype)
        xp.add.at(out, xp.ix_(*idx), dy)
        return out
    return run


register(OpDef("Pad", inputs=("x",), attrs={"paddings": (), "mode": "constant", "constant_value": 0},
               infer=_infer_pad, kernel=_kernel_pad, grad=_g_pad, cost=elementwise_cost(0)))
register(OpDef("PadGrad", inputs=("dy", "x"), attrs={"paddings": (), "mode": "reflect"},
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[1].shape)], kernel=_kernel_pad_grad,
               cost=elementwise_cost(1)))


def pad(x, paddings, mode: str = "constant", constant_value=0, name=None) -> Tensor:
    mode = mode.lower()
    if mode not in ("constant", "reflect", "edge"):
        raise ValueError(f"pad mode must be constant, reflect or edge, got {mode!r}")
    p = tuple((int(a), int(b)) for a, b in paddings)
    return _out("Pad", (convert(x),), {"paddings": p, "mode": mode, "constant_value": constant_value}, name=name)


# ---- Squeeze / ExpandDims ----------------------------------------------------------------------
def _infer_squeeze(node):
    x = node.inputs[0]
    axes = node.attrs["axis"]
    if axes is None:
        if not fully_defined(x.shape):
            raise ShapeError(f"squeeze of {fmt(x.shape)} without axes needs known dims")
        return [(x.dtype, tuple(d for d in x.shape if d != 1))]
    axes = {normalize_axis(a, len(x.shape)) for a in axes}
    for a in axes:
        if x.shape[a] not in (1, None):
            raise ShapeError(f"cannot squeeze dim {a} of size {x.shape[a]}")
    return [(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


def _squeeze_axes(node):
    x = node.inputs[0]
    if node.attrs["axis"] is None:
        return tuple(i for i, d in enumerate(x.shape) if d == 1)
    return tuple(sorted(normalize_axis(a, len(x.shape)) for a in node.attrs["axis"]))


register(OpDef("Squeeze", inputs=("x",), attrs={"axis": None}, infer=_infer_squeeze,
               kernel=lambda node, ctx: (lambda x, a=_squeeze_axes(node): ctx.xp.squeeze(x, a)),
               grad=lambda node, dys: [_out("ReshapeLike", (dys[0], node.inputs[0]))], cost=_FREE))


def squeeze(x, axis=None, name=None) -> Tensor:
    ax = None if axis is None else ((int(axis),) if isinstance(axis, (int, np.integer)) else tuple(int(a) for a in axis))
    return _out("Squeeze", (convert(x),), {"axis": ax}, name=name)


def expand_dims(x, axis, name=None) -> Tensor:
    x = convert(x)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    rank = len(x.shape) + len(axes)
    axes = tuple(sorted(normalize_axis(int(a), rank) for a in axes))
    return _out("ExpandAxes", (x,), {"axes": axes}, name=name)


unsqueeze = expand_dims


# ---- Shape, Fill, zeros, ones ---------------------------------------------------------------------
register(OpDef("Shape", inputs=("x",), attrs={"out_type": _dt.int32},
               infer=lambda node: [(node.attrs["out_type"], (len(node.inputs[0].shape),))],
               kernel=lambda node, ctx: (lambda x, d=node.attrs["out_type"]: ctx.xp.asarray(x.shape, dtype=d)),
               grad=lambda node, dys: [None], cost=_FREE))


def shape(x, out_type="int32", name=None) -> Tensor:
    return _out("Shape", (convert(x),), {"out_type": _dt.as_dtype(out_type)}, name=name)


def _infer_fill(node):
    s = node.inputs[0]
    if s.dtype.kind not in "iu" or len(s.shape) != 1:
        raise ShapeError(f"fill shape must be a 1-D integer tensor, got {s.dtype.name}{fmt(s.shape)}")
    if s.node.op == "Const":
        return [(node.attrs["dtype"], tuple(int(d) for d in s.node.attrs["value"]))]
    return [(node.attrs["dtype"], (None,) * (s.shape[0] or 0))]


register(OpDef("Fill", inputs=("shape",), attrs={"value": 0, "dtype": _dt.float32}, infer=_infer_fill,
               kernel=lambda node, ctx: (lambda s, v=node.attrs["value"], d=node.attrs["dtype"]:
                                         ctx.xp.full(tuple(int(i) for i in s), v, dtype=d)),
               grad=lambda node, dys: [None], cost=elementwise_cost(0)))


def fill(shape, value, dtype="float32", name=None) -> Tensor:
    if not isinstance(shape, Tensor):
        shape = constant(np.asarray(shape, dtype=np.int32).reshape(-1), dtype="int32")
    elif shape.shape[0] is None:
        raise ShapeError("fill needs a shape tensor of known length")
    return _out("Fill", (shape,), {"value": value, "dtype": _dt.as_dtype(dtype)}, name=name)


def zeros(shape, dtype="float32", name=None) -> Tensor:
    return fill(shape, 0, dtype, name=name)


def ones(shape, dtype="float32", name=None) -> Tensor:
    return fill(shape, 1, dtype, name=name)


# ---- Tile, BroadcastTo, OneHot ------------------------------------------------------------------------
def _infer_tile(node):
    x = node.inputs[0]
    m = node.attrs["multiples"]
    if len(m) != len(x.shape):
        raise ShapeError(f"{len(m)} multiples for rank {len(x.shape)}")
    return [(x.dtype, tuple(None if d is None else d * k for d, k in zip(x.shape, m)))]


def _kernel_tile_grad(node, ctx):
    m = node.attrs["multiples"]

    def run(dy, x):
        shp = []
        for k, d in zip(m, x.shape):
            shp += [k, d]
        return dy.reshape(shp).sum(axis=tuple(range(0, 2 * len(m), 2)))
    return run


register(OpDef("Tile", inputs=("x",), attrs={"multiples": ()}, infer=_infer_tile,
               kernel=lambda node, ctx: (lambda x, m=node.attrs["multiples"]: ctx.xp.tile(x, m)),
               grad=lambda node, dys: [_out("TileGrad", (dys[0], node.inputs[0]), {"multiples": node.attrs["multiples"]})],
               cost=elementwise_cost(0)))
register(OpDef("TileGrad", inputs=("dy", "x"), attrs={"multiples": ()},
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[1].shape)], kernel=_kernel_tile_grad,
               cost=elementwise_cost(1)))


def tile(x, multiples, name=None) -> Tensor:
    return _out("Tile", (convert(x),), {"multiples": tuple(int(m) for m in multiples)}, name=name)


def _infer_broadcast_to(node):
    x = node.inputs[0]
    target = node.attrs["shape"]
    if broadcast(x.shape, target) != target and not all(
            a is None or b is None or a == b for a, b in zip(broadcast(x.shape, target), target)):
        raise ShapeError(f"cannot broadcast {fmt(x.shape)} to {fmt(target)}")
    return [(x.dtype, target)]


register(OpDef("BroadcastTo", inputs=("x",), attrs={"shape": ()}, infer=_infer_broadcast_to,
               kernel=lambda node, ctx: (lambda x, s=node.attrs["shape"]: ctx.xp.broadcast_to(x, s)),
               grad=lambda node, dys: [_reduce_like(dys[0], node.inputs[0])], cost=_FREE))


def _reduce_like(g, x):
    from .math import reduce_sum_like
    return reduce_sum_like(g, x)


def broadcast_to(x, shape, name=None) -> Tensor:
    return _out("BroadcastTo", (convert(x),), {"shape": as_shape(shape)}, name=name)


def _infer_one_hot(node):
    idx = node.inputs[0]
    if idx.dtype.kind not in "iu":
        raise ShapeError(f"one_hot indices must be integers, got {idx.dtype.name}")
    return [(node.attrs["dtype"], idx.shape + (node.attrs["depth"],))]


def _kernel_one_hot(node, ctx):
    depth, dt = node.attrs["depth"], node.attrs["dtype"]
    xp = ctx.xp
    return lambda idx: (idx[..., None] == xp.arange(depth)).astype(dt)


register(OpDef("OneHot", inputs=("indices",), attrs={"depth": 0, "dtype": _dt.float32}, infer=_infer_one_hot,
               kernel=_kernel_one_hot, grad=lambda node, dys: [None], cost=elementwise_cost(1)))


def one_hot(indices, depth: int, dtype="float32", name=None) -> Tensor:
    return _out("OneHot", (convert(indices),), {"depth": int(depth), "dtype": _dt.as_dtype(dtype)}, name=name)
