"""Shape and layout ops: reshape, transpose, concat, split, slice and indexing, pad, squeeze and
expand_dims (shape, fill, tile, broadcast_to, one_hot: fill.py; run-time shapes: array_dynamic.py).

Kernels return numpy views wherever numpy does (reshape, transpose, split, slicing, squeeze,
expand_dims, broadcast_to), so these ops move no data.
"""
from __future__ import annotations

import builtins
import math as _math
from typing import Optional, Sequence

import numpy as np

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, elementwise_cost, register
from ..shapes import fmt, fully_defined, normalize_axis, num_elements
from .base import constant, convert, make
from .math import zeros_like
from .recycle import Recycled

__all__ = ["reshape", "transpose", "concat", "split", "slice", "strided_slice", "pad", "squeeze", "expand_dims",
           "unsqueeze", "flatten"]

_py_slice = builtins.slice  # `slice` below is the op builder
FREE_COST = lambda node: Cost(0, 0, 0)  # noqa: E731  (views: no data moves)


def first_output(op, inputs, attrs=None, name=None) -> Tensor:
    """The first output of a new `op` node (what the array, fill and dynamic-shape families return)."""
    return make(op, inputs, attrs, name=name).outputs[0]


def _ints(values, what: str) -> tuple:
    if isinstance(values, Tensor):
        raise TypeError(f"{what} must be static Python ints, not tensor '{values.name}'")
    return tuple(int(v) for v in values)


def static_value(t: Tensor) -> Optional[tuple]:
    """What the graph tells, before running it, of a 0-d or 1-d integer tensor: a tuple of its
    entries (None where unknown), or None when nothing is known. `fill(shape(x))` and friends use
    it to keep x's static shape."""
    n = t.node
    if t.dtype.kind not in "iu" or len(t.shape) > 1:
        return None
    if n.op == "Const":
        return tuple(int(v) for v in n.attrs["value"].reshape(-1))
    if n.op == "Shape":
        return n.inputs[0].shape
    if n.op in ("Identity", "Cast", "ExpandAxes", "Reshape", "StopGradient"):
        return static_value(n.inputs[0]) if num_elements(t.shape) is not None else None
    if n.op == "Concat":
        out = []
        for i in n.inputs:
            part = static_value(i)
            if part is None:
                if i.shape[0] is None:
                    return None
                part = (None,) * i.shape[0]
            out.extend(part)
        return tuple(out)
    if n.op == "StridedSlice":
        v = static_value(n.inputs[0])
        if v is None or len(n.inputs[0].shape) != 1:
            return None
        return tuple(np.array(v, dtype=object)[_index_tuple(n.attrs["spec"])].reshape(-1).tolist())
    return None


# ---- Reshape, Flatten ---------------------------------------------------------------------------
def _infer_reshape(node):
    x = node.inputs[0]
    target = tuple(node.attrs["shape"])
    if sum(1 for d in target if d == -1) > 1:
        raise ShapeError(f"reshape target {target} has more than one -1")
    if any(d < -1 for d in target):
        raise ShapeError(f"reshape target {target} has a negative size")
    n = num_elements(x.shape)
    known = _math.prod(d for d in target if d != -1)
    if n is None:
        x_known = _math.prod(d for d in x.shape if d is not None)
        if -1 not in target and x_known and known % x_known:
            raise ShapeError(f"cannot reshape {fmt(x.shape)} to {target}: {known} elements is no multiple of {x_known}")
        return [(x.dtype, tuple(None if d == -1 else d for d in target))]
    if -1 in target:
        if known == 0 or n % known:
            raise ShapeError(f"cannot reshape {fmt(x.shape)} ({n} elements) to {target}")
        return [(x.dtype, tuple(n // known if d == -1 else d for d in target))]
    if known != n:
        raise ShapeError(f"cannot reshape {fmt(x.shape)} ({n} elements) to {target}")
    return [(x.dtype, target)]


def _g_reshape(node, dys):
    x = node.inputs[0]
    if fully_defined(x.shape):
        return [reshape(dys[0], x.shape)]
    return [first_output("ReshapeLike", (dys[0], x))]


register(OpDef("Reshape", inputs=("x",), attrs={"shape": None}, infer=_infer_reshape,
               kernel=lambda node, ctx: (lambda x, s=tuple(node.attrs["shape"]): x.reshape(s)),
               grad=_g_reshape, cost=FREE_COST, doc="shape: ints, one of them may be -1."))
register(OpDef("ReshapeLike", inputs=("x", "like"),
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[1].shape)],
               kernel=lambda node, ctx: (lambda x, like: x.reshape(like.shape)),
               grad=lambda node, dys: [first_output("ReshapeLike", (dys[0], node.inputs[0])), None], cost=FREE_COST,
               doc="x reshaped to like's run-time shape (gradients through unknown dims)."))


def reshape(x, shape, name=None) -> Tensor:
    """`shape` is a sequence of ints (None or -1 once, for the dim to infer) or an int tensor whose
    value the graph knows statically (e.g. shape(y)); dynamic target shapes are not supported."""
    if isinstance(shape, Tensor):
        v = static_value(shape)
        if v is None or len(shape.shape) != 1 or sum(d is None for d in v) > 1:
            raise TypeError(f"reshape needs a static target shape; '{shape.name}' is only known at run time "
                            "(use -1 for one unknown dim)")
        shape = v
    return first_output("Reshape", (convert(x),), {"shape": tuple(-1 if d is None else int(d) for d in shape)}, name=name)


def _infer_flatten(node):
    x = node.inputs[0]
    a = node.attrs["axis"]
    return [(x.dtype, (num_elements(x.shape[:a]), num_elements(x.shape[a:])))]


register(OpDef("Flatten", inputs=("x",), attrs={"axis": 1}, infer=_infer_flatten,
               kernel=lambda node, ctx: (lambda x, a=node.attrs["axis"], p=_math.prod:
                                         x.reshape(p(x.shape[:a]), p(x.shape[a:]))),
               grad=lambda node, dys: [first_output("ReshapeLike", (dys[0], node.inputs[0]))], cost=FREE_COST,
               doc="[d0..d(a-1), da..] -> [prod(d0..d(a-1)), prod(da..)], as ONNX Flatten."))


def flatten(x, axis: int = 1, name=None) -> Tensor:
    """[N, ...] -> [N, prod(...)] (the dims before `axis` become the first)."""
    x = convert(x)
    return first_output("Flatten", (x,), {"axis": normalize_axis(axis, len(x.shape) + 1)}, name=name)


# ---- Transpose ------------------------------------------------------------------------------------
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
               grad=lambda node, dys: [transpose(dys[0], tuple(int(i) for i in np.argsort(_perm(node))))],
               cost=FREE_COST))


def transpose(x, perm: Optional[Sequence[int]] = None, name=None) -> Tensor:
    return first_output("Transpose", (convert(x),), {"perm": None if perm is None else _ints(perm, "perm")}, name=name)


# ---- Concat and Split -----------------------------------------------------------------------------
def _infer_concat(node):
    first = node.inputs[0]
    rank = len(first.shape)
    if rank == 0:
        raise ShapeError("cannot concat scalars; expand_dims them first")
    axis = normalize_axis(node.attrs["axis"], rank)
    out = list(first.shape)
    total = 0
    for t in node.inputs:
        if t.dtype != first.dtype:
            raise ShapeError(f"concat operands differ in dtype: {first.dtype.name} vs {t.dtype.name}")
        if len(t.shape) != rank:
            raise ShapeError(f"concat operands differ in rank: {fmt(first.shape)} vs {fmt(t.shape)}")
        for i, b in enumerate(t.shape):
            if i == axis:
                continue
            if out[i] is not None and b is not None and out[i] != b:
                raise ShapeError(f"concat operands differ off axis {axis}: {fmt(first.shape)} vs {fmt(t.shape)}")
            if out[i] is None:
                out[i] = b
        total = None if total is None or t.shape[axis] is None else total + t.shape[axis]
    out[axis] = total
    return [(first.dtype, tuple(out))]


def _g_concat(node, dys):
    axis = normalize_axis(node.attrs["axis"], len(node.inputs[0].shape))
    sizes = [t.shape[axis] for t in node.inputs]
    if all(s is not None for s in sizes):
        return split(dys[0], sizes, axis)
    return list(make("SplitLike", [dys[0]] + list(node.inputs), {"axis": axis}).outputs)


def _kernel_concat(node, ctx):
    """numpy's concatenate; on the CPU into a buffer reused from run to run once nothing else holds
    it (recycle.py: a fresh buffer's cache misses cost SqueezeNet's fire modules 3x the copy)."""
    axis, concatenate = node.attrs["axis"], ctx.xp.concatenate
    if ctx.xp is not np:
        return lambda *xs: concatenate(xs, axis=axis)
    ax = normalize_axis(axis, len(node.inputs[0].shape))  # the rank is static (_infer_concat)
    take, ndarray = Recycled().take, np.ndarray

    def run(*xs):  # a plain loop: generator expressions cost microseconds at batch 1
        first = xs[0]
        dt, n = first.dtype, 0
        for x in xs:
            if type(x) is not ndarray or x.dtype != dt:
                return concatenate(xs, axis=ax)
            n += x.shape[ax]
        shape = first.shape
        return concatenate(xs, axis=ax, out=take(shape[:ax] + (n,) + shape[ax + 1:], dt))
    return run


register(OpDef("Concat", inputs=("x0", "*xs"), attrs={"axis": 0}, infer=_infer_concat, kernel=_kernel_concat,
               grad=_g_concat, cost=elementwise_cost(0)))


def concat(values, axis: int = 0, name=None) -> Tensor:
    values = [convert(v) for v in values]
    if len(values) == 1:
        return values[0]
    return first_output("Concat", values, {"axis": int(axis)}, name=name)


def _split_sizes(node):
    """The static sizes of the pieces (entries None where only the run time knows)."""
    x = node.inputs[0]
    axis = normalize_axis(node.attrs["axis"], len(x.shape))
    d, sizes, num = x.shape[axis], tuple(node.attrs["sizes"]), node.attrs["num"]
    if not sizes:
        if num < 1:
            raise ShapeError(f"split needs num >= 1 or sizes, got num={num}")
        if d is not None and d % num:
            raise ShapeError(f"dim {axis} of {fmt(x.shape)} does not split evenly into {num}")
        return (None if d is None else d // num,) * num
    if any(s < -1 for s in sizes) or sum(1 for s in sizes if s == -1) > 1:
        raise ShapeError(f"split sizes {sizes}: sizes must be >= 0, with at most one -1")
    rest = sum(s for s in sizes if s != -1)
    if d is not None and (rest > d if -1 in sizes else rest != d):
        raise ShapeError(f"split sizes {sizes} do not add up to dim {axis} of {fmt(x.shape)}")
    return tuple((None if d is None else d - rest) if s == -1 else s for s in sizes)


def _infer_split(node):
    x = node.inputs[0]
    axis = normalize_axis(node.attrs["axis"], len(x.shape))
    return [(x.dtype, x.shape[:axis] + (s,) + x.shape[axis + 1:]) for s in _split_sizes(node)]


def _kernel_split(node, ctx):
    axis = normalize_axis(node.attrs["axis"], len(node.inputs[0].shape))
    sizes, num, xp = node.attrs["sizes"], node.attrs["num"], ctx.xp
    if not sizes:
        return lambda x: tuple(xp.split(x, num, axis=axis))
    if -1 not in sizes:
        cuts = [int(c) for c in np.cumsum(sizes)[:-1]]
        return lambda x: tuple(xp.split(x, cuts, axis=axis))

    def run(x):  # one size is whatever the run-time dim leaves
        rest = x.shape[axis] - sum(s for s in sizes if s != -1)
        return tuple(xp.split(x, [int(c) for c in np.cumsum([rest if s == -1 else s for s in sizes])[:-1]], axis=axis))
    return run


def _g_split(node, dys):
    return [concat([d if d is not None else zeros_like(t) for d, t in zip(dys, node.outputs)], node.attrs["axis"])]


register(OpDef("Split", inputs=("x",), attrs={"sizes": (), "num": 0, "axis": 0}, infer=_infer_split,
               kernel=_kernel_split, grad=_g_split, cost=FREE_COST,
               doc="Pieces of the given sizes (one may be -1), or `num` equal pieces when sizes is empty."))


def _infer_split_like(node):
    dy = node.inputs[0]
    axis = node.attrs["axis"]
    return [(dy.dtype, dy.shape[:axis] + (t.shape[axis],) + dy.shape[axis + 1:]) for t in node.inputs[1:]]


def _kernel_split_like(node, ctx):
    axis, split_ = node.attrs["axis"], ctx.xp.split

    def run(dy, *likes):
        cuts, at = [], 0
        for t in likes[:-1]:
            at += t.shape[axis]
            cuts.append(at)
        return tuple(split_(dy, cuts, axis=axis))
    return run


register(OpDef("SplitLike", inputs=("x", "*likes"), attrs={"axis": 0}, infer=_infer_split_like,
               kernel=_kernel_split_like, cost=FREE_COST, doc="Split x along axis into pieces sized like the likes."))


def split(x, num_or_size_splits, axis: int = 0, name=None) -> list:
    """A list of tensors: `num` equal pieces (an int) or pieces of the given sizes (one may be -1)."""
    x = convert(x)
    ax = normalize_axis(axis, len(x.shape))
    if isinstance(num_or_size_splits, (int, np.integer)):
        attrs = {"num": int(num_or_size_splits), "axis": ax}
    else:
        sizes = _ints(num_or_size_splits, "split sizes")
        d = x.shape[ax]
        if -1 in sizes and d is not None:  # resolve it now: exporters see plain sizes
            sizes = tuple(d - (sum(sizes) + 1) if s == -1 else s for s in sizes)
        attrs = {"sizes": sizes, "axis": ax}
    return list(make("Split", (x,), attrs, name=name).outputs)


# ---- slicing and indexing -------------------------------------------------------------------------
# A StridedSlice spec has one entry per index: ("index", i, 0, 0), ("slice", start, stop, step)
# or ("new", 0, 0, 0) for newaxis; Ellipsis is expanded to full slices when the node is built.
def _infer_strided(node):
    x = node.inputs[0]
    out, dim = [], 0
    for kind, a, b, c in node.attrs["spec"]:
        if kind == "new":
            out.append(1)
            continue
        if dim >= len(x.shape):
            raise ShapeError(f"too many indices for {fmt(x.shape)}")
        d = x.shape[dim]
        if kind == "index":
            if d is not None and not -d <= a < d:
                raise ShapeError(f"index {a} out of range for dim {dim} of size {d}")
        elif c == 0:
            raise ShapeError(f"slice step of dim {dim} is zero")
        else:
            out.append(None if d is None else len(range(*_py_slice(a, b, c).indices(d))))
        dim += 1
    out.extend(x.shape[dim:])
    return [(x.dtype, tuple(out))]


def _index_tuple(spec) -> tuple:
    """The numpy index for a spec; the trailing Ellipsis makes an all-int index a 0-d view, not a scalar."""
    idx = [None if k == "new" else a if k == "index" else _py_slice(a, b, c) for k, a, b, c in spec]
    return tuple(idx) + (Ellipsis,)


def _kernel_strided_grad(node, ctx):
    idx, zeros_ = _index_tuple(node.attrs["spec"]), ctx.xp.zeros

    def run(dy, x):
        out = zeros_(x.shape, dtype=dy.dtype)
        out[idx] = dy
        return out
    return run


register(OpDef("StridedSlice", inputs=("x",), attrs={"spec": ()}, infer=_infer_strided,
               kernel=lambda node, ctx: (lambda x, i=_index_tuple(node.attrs["spec"]): x[i]),
               grad=lambda node, dys: [first_output("StridedSliceGrad", (dys[0], node.inputs[0]), {"spec": node.attrs["spec"]})],
               cost=FREE_COST, doc="x[spec]: ints, slices with steps, newaxis (Tensor.__getitem__)."))
register(OpDef("StridedSliceGrad", inputs=("dy", "x"), attrs={"spec": ()},
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[1].shape)],
               kernel=_kernel_strided_grad, cost=elementwise_cost(1), doc="dy scattered into zeros shaped like x."))


def _opt_int(v, what: str):
    if v is None:
        return None
    if isinstance(v, Tensor):
        raise TypeError(f"slice {what} must be a Python int, not tensor '{v.name}'")
    return int(v.__index__())


def strided_slice(x, key, name=None) -> Tensor:
    """x[key] with numpy's basic indexing: ints, slices (any step), None/newaxis and one Ellipsis."""
    x = convert(x)
    key = key if isinstance(key, tuple) else (key,)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    rank = len(x.shape)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    if n_real > rank:
        raise ShapeError(f"too many indices for '{x.name}' {fmt(x.shape)}: {n_real}")
    spec = []
    for k in key:
        if k is Ellipsis:
            spec.extend([("slice", None, None, None)] * (rank - n_real))
        elif k is None:
            spec.append(("new", 0, 0, 0))
        elif isinstance(k, _py_slice):
            spec.append(("slice", _opt_int(k.start, "start"), _opt_int(k.stop, "stop"), _opt_int(k.step, "step")))
        elif isinstance(k, (bool, np.bool_)):
            raise TypeError("boolean indices are not supported by []; use where or gather")
        elif isinstance(k, (int, np.integer)):
            spec.append(("index", int(k), 0, 0))
        elif isinstance(k, Tensor):
            raise TypeError("tensor indices are not supported by []; use gather(x, indices)")
        else:
            raise TypeError(f"unsupported index {k!r}: use ints, slices, None or ...")
    return first_output("StridedSlice", (x,), {"spec": tuple(spec)}, name=name)


def slice(x, begin, size, name=None) -> Tensor:  # noqa: A001
    """x[begin[i] : begin[i] + size[i]] on every axis, as TensorFlow's Slice: begin >= 0, and
    size -1 means to the end. A static dim that the slice overruns is an error, not a clip."""
    x = convert(x)
    begin, size = _ints(begin, "slice begin"), _ints(size, "slice size")
    where = f"slice of '{x.name}' {fmt(x.shape)}"
    if len(begin) != len(x.shape) or len(size) != len(x.shape):
        raise ShapeError(f"{where}: {len(begin)} begins and {len(size)} sizes for rank {len(x.shape)}")
    key = []
    for ax, (b, s, d) in enumerate(zip(begin, size, x.shape)):
        if b < 0 or s < -1:
            raise ShapeError(f"{where}: axis {ax} has begin {b} and size {s}; need begin >= 0 and size >= -1")
        if d is not None and (b > d or (s != -1 and b + s > d)):
            raise ShapeError(f"{where}: axis {ax} begin {b} size {s} overruns dim {d}")
        key.append(_py_slice(b, None if s == -1 else b + s))
    return strided_slice(x, tuple(key), name=name)


def _iter_tensor(self: Tensor):
    """Iterating a tensor unpacks its first dimension, which must be static."""
    if not self.shape or self.shape[0] is None:
        raise TypeError(f"cannot iterate over tensor '{self.name}' {fmt(self.shape)}: "
                        "its first dimension is not statically known; use split")
    return (strided_slice(self, i) for i in range(self.shape[0]))


Tensor.__getitem__ = lambda self, key: strided_slice(self, key)
Tensor.__iter__ = _iter_tensor


# ---- Pad --------------------------------------------------------------------------------------------
def _infer_pad(node):
    x = node.inputs[0]
    p, mode = node.attrs["paddings"], node.attrs["mode"]
    if len(p) != len(x.shape):
        raise ShapeError(f"{len(p)} paddings for rank {len(x.shape)}")
    for ax, ((a, b), d) in enumerate(zip(p, x.shape)):
        if a < 0 or b < 0:
            raise ShapeError(f"negative padding ({a}, {b}) on axis {ax}")
        if d is not None and (a or b) and mode == "reflect" and max(a, b) >= d:
            raise ShapeError(f"reflect padding ({a}, {b}) on axis {ax} needs a dim larger than {max(a, b)}, got {d}")
        if d == 0 and (a or b) and mode == "edge":
            raise ShapeError(f"edge padding of the empty axis {ax}")
    return [(x.dtype, tuple(None if d is None else d + a + b for d, (a, b) in zip(x.shape, p)))]


def _kernel_pad(node, ctx):
    p, mode, xp = node.attrs["paddings"], node.attrs["mode"], ctx.xp
    if mode == "constant":
        v = node.inputs[0].dtype.type(node.attrs["constant_value"])
        return lambda x: xp.pad(x, p, mode="constant", constant_values=v)
    return lambda x: xp.pad(x, p, mode=mode)


def _g_pad(node, dys):
    p = node.attrs["paddings"]
    if node.attrs["mode"] != "constant":
        return [first_output("PadGrad", (dys[0], node.inputs[0]), {"paddings": p, "mode": node.attrs["mode"]})]
    return [strided_slice(dys[0], tuple(_py_slice(a, None if b == 0 else -b) for a, b in p))]


def _kernel_pad_grad(node, ctx):
    """Fold the padded borders back onto the elements they copied, one axis at a time."""
    xp, edge = ctx.xp, node.attrs["mode"] == "edge"
    axes = [(k, a, b) for k, (a, b) in enumerate(node.attrs["paddings"]) if a or b]

    def at(k, start, stop):
        return (_py_slice(None),) * k + (_py_slice(start, stop),)

    def run(dy, x):
        g = dy
        for k, a, b in axes:
            n = x.shape[k]
            r = g[at(k, a, a + n)].copy()
            if edge:
                if a:
                    r[at(k, 0, 1)] += g[at(k, 0, a)].sum(axis=k, keepdims=True)
                if b:
                    r[at(k, n - 1, n)] += g[at(k, a + n, None)].sum(axis=k, keepdims=True)
            else:
                if max(a, b) >= n:
                    raise ValueError(f"reflect padding ({a}, {b}) needs dim {k} larger than {max(a, b)}, got {n}")
                if a:
                    r[at(k, 1, a + 1)] += xp.flip(g[at(k, 0, a)], axis=k)
                if b:
                    r[at(k, n - 1 - b, n - 1)] += xp.flip(g[at(k, a + n, None)], axis=k)
            g = r
        return g
    return run


register(OpDef("Pad", inputs=("x",), attrs={"paddings": (), "mode": "constant", "constant_value": 0},
               infer=_infer_pad, kernel=_kernel_pad, grad=_g_pad, cost=elementwise_cost(0),
               doc="mode: constant, reflect (mirror without the edge) or edge (repeat the edge)."))
register(OpDef("PadGrad", inputs=("dy", "x"), attrs={"paddings": (), "mode": "reflect"},
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[1].shape)], kernel=_kernel_pad_grad,
               cost=elementwise_cost(1)))


def pad(x, paddings, mode: str = "constant", constant_value=0, name=None) -> Tensor:
    mode = mode.lower()
    if mode not in ("constant", "reflect", "edge"):
        raise ValueError(f"pad mode must be constant, reflect or edge, got {mode!r}")
    p = tuple((int(a), int(b)) for a, b in paddings)
    return first_output("Pad", (convert(x),), {"paddings": p, "mode": mode, "constant_value": constant_value}, name=name)


# ---- Squeeze / ExpandDims ---------------------------------------------------------------------------
def _infer_squeeze(node):
    x = node.inputs[0]
    if node.attrs["axis"] is None and not fully_defined(x.shape):
        raise ShapeError(f"squeeze of {fmt(x.shape)} without axes needs known dims")
    axes = squeeze_axes(node)
    for a in axes:
        if x.shape[a] not in (1, None):
            raise ShapeError(f"cannot squeeze dim {a} of size {x.shape[a]}")
    return [(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


def squeeze_axes(node) -> tuple:
    """The sorted, non-negative axes a Squeeze node removes (every size-1 dim when it names none);
    the ONNX exporter writes them (converters/onnx_export.py)."""
    x = node.inputs[0]
    if node.attrs["axis"] is None:
        return tuple(i for i, d in enumerate(x.shape) if d == 1)
    return tuple(sorted({normalize_axis(a, len(x.shape)) for a in node.attrs["axis"]}))


register(OpDef("Squeeze", inputs=("x",), attrs={"axis": None}, infer=_infer_squeeze,
               kernel=lambda node, ctx: (lambda x, a=squeeze_axes(node), sq=ctx.xp.squeeze: sq(x, a)),
               grad=lambda node, dys: [first_output("ReshapeLike", (dys[0], node.inputs[0]))], cost=FREE_COST))


def squeeze(x, axis=None, name=None) -> Tensor:
    ax = None if axis is None else ((int(axis),) if isinstance(axis, (int, np.integer)) else _ints(axis, "axis"))
    return first_output("Squeeze", (convert(x),), {"axis": ax}, name=name)


def _infer_expand(node):
    x = node.inputs[0]
    axes = node.attrs["axes"]
    rank = len(x.shape) + len(axes)
    if len(set(axes)) != len(axes) or any(not 0 <= a < rank for a in axes):
        raise ShapeError(f"expand_dims axes {axes} must be distinct and in [0, {rank})")
    shape = list(x.shape)
    for a in sorted(axes):
        shape.insert(a, 1)
    return [(x.dtype, tuple(shape))]


register(OpDef("ExpandAxes", inputs=("x",), attrs={"axes": ()}, infer=_infer_expand,
               kernel=lambda node, ctx: (lambda x, a=tuple(node.attrs["axes"]), ed=ctx.xp.expand_dims: ed(x, a)),
               grad=lambda node, dys: [first_output("Squeeze", (dys[0],), {"axis": tuple(node.attrs["axes"])})],
               cost=FREE_COST, doc="Insert size-1 axes at the given (output) positions: expand_dims/unsqueeze."))


def expand_dims(x, axis, name=None) -> Tensor:
    """Insert size-1 axes; `axis` is an int or a sequence of positions in the output."""
    x = convert(x)
    axes = (int(axis),) if isinstance(axis, (int, np.integer)) else _ints(axis, "axis")
    rank = len(x.shape) + len(axes)
    return first_output("ExpandAxes", (x,), {"axes": tuple(sorted(normalize_axis(a, rank) for a in axes))}, name=name)


def unsqueeze(x, axes, name=None) -> Tensor:
    """expand_dims under its ONNX/PyTorch name."""
    return expand_dims(x, axes, name=name)
