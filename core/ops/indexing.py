"""Element- and tuple-indexed gathers and scatters (ONNX GatherElements, ScatterElements, GatherND,
ScatterND), NonZero and Trilu. Gradients are written with the same ops, so they differentiate again."""
from __future__ import annotations

from .. import dtypes as _dt
from ..errors import GraphError, ShapeError
from ..graph import Tensor
from ..registry import OpDef, default_cost, elementwise_cost, register
from ..shapes import normalize_axis
from .base import convert, make
from .math import zeros_like

__all__ = ["gather_elements", "scatter_elements", "gather_nd", "scatter_nd", "nonzero", "trilu"]

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _check_indices(t: Tensor, what: str) -> None:
    if t.dtype.kind not in "iu":
        raise ShapeError(f"{what} indices must be integers, got {t.dtype.name}")


def _wrap(xp, idx, dim):
    """Negative indices count from the end (ONNX); the dtype stays as given."""
    return xp.where(idx < 0, idx + dim, idx)


# ---- GatherElements / ScatterElements ----------------------------------------------------------------
def _elements_index(xp, indices, axis: int, dim: int):
    """The full index tuple that addresses data[..., indices[...], ...] element by element."""
    rank = indices.ndim  # open grids (numpy's indices(sparse=True), which cupy lacks)
    grids = [xp.arange(n).reshape([-1 if j == i else 1 for j in range(rank)]) for i, n in enumerate(indices.shape)]
    grids[axis] = _wrap(xp, indices, dim)
    return tuple(grids)


def _infer_gather_elements(node):
    data, idx = node.inputs
    _check_indices(idx, "GatherElements")
    if len(idx.shape) != len(data.shape):
        raise ShapeError(f"GatherElements indices rank {len(idx.shape)} differs from data rank {len(data.shape)}")
    normalize_axis(node.attrs["axis"], len(data.shape))
    return [(data.dtype, idx.shape)]


def _k_gather_elements(node, ctx):
    xp = ctx.xp
    axis = normalize_axis(node.attrs["axis"], len(node.inputs[0].shape))
    return lambda data, idx: data[_elements_index(xp, idx, axis, data.shape[axis])]


def _g_gather_elements(node, dys):
    data, idx = node.inputs
    return [scatter_elements(zeros_like(data), idx, dys[0], node.attrs["axis"], "add"), None]


register(OpDef("GatherElements", inputs=("data", "indices"), attrs={"axis": 0}, infer=_infer_gather_elements,
               kernel=_k_gather_elements, grad=_g_gather_elements, cost=elementwise_cost(1),
               doc="out[i][j][k] = data[idx[i][j][k]][j][k] (axis 0); negative indices count from the end."))


def _infer_scatter_elements(node):
    data, idx, upd = node.inputs
    _check_indices(idx, "ScatterElements")
    if upd.dtype != data.dtype:
        raise ShapeError(f"ScatterElements updates are {upd.dtype.name}, data is {data.dtype.name}")
    if len(idx.shape) != len(data.shape) or len(upd.shape) != len(idx.shape):
        raise ShapeError(f"ScatterElements needs data, indices and updates of one rank, got "
                         f"{len(data.shape)}, {len(idx.shape)}, {len(upd.shape)}")
    if node.attrs["reduction"] not in REDUCTIONS:
        raise ShapeError(f"ScatterElements reduction {node.attrs['reduction']!r} is not one of {REDUCTIONS}")
    normalize_axis(node.attrs["axis"], len(data.shape))
    return [(data.dtype, data.shape)]


def _scatter(xp, out, index, upd, reduction: str):
    """out[index] <- upd, combining repeated positions by `reduction` (none: the last write wins)."""
    if reduction == "none":
        out[index] = upd
    else:
        getattr(xp, {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}[reduction]).at(out, index, upd)
    return out


def _k_scatter_elements(node, ctx):
    xp, red = ctx.xp, node.attrs["reduction"]
    axis = normalize_axis(node.attrs["axis"], len(node.inputs[0].shape))
    return lambda data, idx, upd: _scatter(xp, data.copy(), _elements_index(xp, idx, axis, data.shape[axis]), upd, red)


def _g_scatter_elements(node, dys):
    data, idx, upd = node.inputs
    dy, red, axis = dys[0], node.attrs["reduction"], node.attrs["axis"]
    if red == "add":
        return [dy, None, gather_elements(dy, idx, axis)]
    if red != "none":
        raise GraphError(f"node '{node.name}' (ScatterElements): no gradient for reduction '{red}'")
    return [scatter_elements(dy, idx, zeros_like(upd), axis), None, gather_elements(dy, idx, axis)]


register(OpDef("ScatterElements", inputs=("data", "indices", "updates"), attrs={"axis": 0, "reduction": "none"},
               infer=_infer_scatter_elements, kernel=_k_scatter_elements, grad=_g_scatter_elements,
               cost=elementwise_cost(1), doc="A copy of data with updates written at indices along axis."))


def gather_elements(data, indices, axis: int = 0, name=None) -> Tensor:
    return make("GatherElements", (convert(data), convert(indices)), {"axis": int(axis)}, name=name).outputs[0]


def scatter_elements(data, indices, updates, axis: int = 0, reduction: str = "none", name=None) -> Tensor:
    data = convert(data)
    return make("ScatterElements", (data, convert(indices), convert(updates, dtype=data.dtype)),
                {"axis": int(axis), "reduction": reduction}, name=name).outputs[0]


# ---- GatherND / ScatterND --------------------------------------------------------------------------------
def _infer_gather_nd(node):
    data, idx = node.inputs
    _check_indices(idx, "GatherND")
    b, k = node.attrs["batch_dims"], idx.shape[-1] if idx.shape else None
    if not idx.shape or k is None:
        raise ShapeError(f"GatherND needs indices whose last dim is known, got {idx.shape}")
    if b + k > len(data.shape):
        raise ShapeError(f"GatherND: batch_dims {b} + index length {k} exceed data rank {len(data.shape)}")
    return [(data.dtype, tuple(idx.shape[:-1]) + tuple(data.shape[b + k:]))]


def _nd_index(xp, data_shape, idx, b: int):
    """(flattened batch index, per-dim indices) addressing data reshaped to (prod(batch), ...)."""
    k = idx.shape[-1]
    nb = 1
    for d in data_shape[:b]:
        nb *= d
    flat = idx.reshape((nb, -1, k))
    cols = tuple(_wrap(xp, flat[..., t], data_shape[b + t]) for t in range(k))
    return (xp.arange(nb).reshape(nb, 1),) + cols, nb


def _k_gather_nd(node, ctx):
    xp, b = ctx.xp, node.attrs["batch_dims"]

    def run(data, idx):
        index, nb = _nd_index(xp, data.shape, idx, b)
        k = idx.shape[-1]
        out = data.reshape((nb,) + data.shape[b:])[index]
        return out.reshape(idx.shape[:-1] + data.shape[b + k:])
    return run


def _g_gather_nd(node, dys):
    data, idx = node.inputs
    return [scatter_nd(zeros_like(data), idx, dys[0], "add", node.attrs["batch_dims"]), None]


register(OpDef("GatherND", inputs=("data", "indices"), attrs={"batch_dims": 0}, infer=_infer_gather_nd,
               kernel=_k_gather_nd, grad=_g_gather_nd, cost=default_cost,
               doc="Slices of data addressed by the last axis of indices (ONNX GatherND)."))


def _infer_scatter_nd(node):
    data, idx, upd = node.inputs
    _check_indices(idx, "ScatterND")
    if upd.dtype != data.dtype:
        raise ShapeError(f"ScatterND updates are {upd.dtype.name}, data is {data.dtype.name}")
    if node.attrs["reduction"] not in REDUCTIONS:
        raise ShapeError(f"ScatterND reduction {node.attrs['reduction']!r} is not one of {REDUCTIONS}")
    if not idx.shape or idx.shape[-1] is None:
        raise ShapeError(f"ScatterND needs indices whose last dim is known, got {idx.shape}")
    return [(data.dtype, data.shape)]


def _k_scatter_nd(node, ctx):
    xp, red, b = ctx.xp, node.attrs["reduction"], node.attrs["batch_dims"]

    def run(data, idx, upd):
        index, nb = _nd_index(xp, data.shape, idx, b)
        k = idx.shape[-1]
        out = data.reshape((nb,) + data.shape[b:]).copy()
        _scatter(xp, out, index, upd.reshape((nb, -1) + data.shape[b + k:]), red)
        return out.reshape(data.shape)
    return run


def _g_scatter_nd(node, dys):
    data, idx, upd = node.inputs
    dy, red, b = dys[0], node.attrs["reduction"], node.attrs["batch_dims"]
    if red == "add":
        return [dy, None, gather_nd(dy, idx, b)]
    if red != "none":
        raise GraphError(f"node '{node.name}' (ScatterND): no gradient for reduction '{red}'")
    return [scatter_nd(dy, idx, zeros_like(upd), "none", b), None, gather_nd(dy, idx, b)]


register(OpDef("ScatterND", inputs=("data", "indices", "updates"), attrs={"reduction": "none", "batch_dims": 0},
               infer=_infer_scatter_nd, kernel=_k_scatter_nd, grad=_g_scatter_nd, cost=default_cost,
               doc="A copy of data with updates written at the slices addressed by indices' last axis."))


def gather_nd(data, indices, batch_dims: int = 0, name=None) -> Tensor:
    return make("GatherND", (convert(data), convert(indices)), {"batch_dims": int(batch_dims)}, name=name).outputs[0]


def scatter_nd(data, indices, updates, reduction: str = "none", batch_dims: int = 0, name=None) -> Tensor:
    data = convert(data)
    return make("ScatterND", (data, convert(indices), convert(updates, dtype=data.dtype)),
                {"reduction": reduction, "batch_dims": int(batch_dims)}, name=name).outputs[0]


# ---- NonZero, Trilu ---------------------------------------------------------------------------------------
def _k_nonzero(node, ctx):
    xp = ctx.xp

    def run(x):
        if x.ndim == 0:  # numpy refuses nonzero of a 0-d array; ONNX treats it as one element
            x = x.reshape(1)
        return xp.stack(xp.nonzero(x)).astype(xp.int64) if x.ndim else xp.zeros((0, 0), xp.int64)
    return run


register(OpDef("NonZero", inputs=("x",), infer=lambda node: [(_dt.int64, (max(len(node.inputs[0].shape), 1), None))],
               kernel=_k_nonzero, grad=lambda node, dys: [None], cost=elementwise_cost(1),
               doc="Indices of the non-zero elements, one row per dim (row-major order)."))


def _k_trilu(node, ctx):
    f = ctx.xp.triu if node.attrs["upper"] else ctx.xp.tril
    k = node.attrs["k"]
    return lambda x, *k_value: f(x, int(k_value[0]) if k_value else k)  # k as an input: read at run time


def _infer_trilu(node):
    x = node.inputs[0]
    if len(x.shape) < 2:
        raise ShapeError(f"Trilu needs rank >= 2, got {x.shape}")
    return [(x.dtype, x.shape)]


register(OpDef("Trilu", inputs=("x", "*k"), attrs={"upper": True, "k": 0}, infer=_infer_trilu, kernel=_k_trilu,
               grad=lambda node, dys: [trilu(dys[0], node.attrs["upper"], node.inputs[1] if len(node.inputs) > 1
                                             else node.attrs["k"])] + [None] * (len(node.inputs) - 1),
               cost=elementwise_cost(1), doc="The upper (or lower) triangle of the last two dims, from diagonal k."))


def nonzero(x, name=None) -> Tensor:
    return make("NonZero", (convert(x),), name=name).outputs[0]


def trilu(x, upper: bool = True, k=0, name=None) -> Tensor:
    """k: the diagonal, an int or an integer scalar Tensor read at run time."""
    ins = (convert(x),) + ((k,) if isinstance(k, Tensor) else ())
    return make("Trilu", ins, {"upper": bool(upper), "k": 0 if isinstance(k, Tensor) else int(k)}, name=name).outputs[0]
