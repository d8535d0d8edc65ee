"""Reverse-mode autodiff: `gradients(ys, xs)` adds the backward pass to the graph.

Each op's gradient builder (in its registry record) turns the gradients of its outputs
into gradients of its inputs; fan-in is summed; row-sparse gradients (IndexedSlices)
stay sparse while every contribution is sparse.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Union

from . import dtypes as _dt
from .errors import GraphError
from .graph import Graph, Tensor, graph_of
from .ops.base import convert, make
from .ops.sparse import IndexedSlices, sum_slices, to_dense

Grad = Union[Tensor, IndexedSlices, None]


def _ones_like(y: Tensor) -> Tensor:
    return make("OnesLike", (y,), name="grad_ys").outputs[0]


def _between(ys: Sequence[Tensor], xs: Sequence[Tensor]) -> set:
    """Nodes on some path from an x to a y (the only ones whose gradients matter)."""
    g = ys[0].graph
    x_nodes = {id(x.node) for x in xs}
    reach_fwd = set(x_nodes)
    for n in g.nodes:  # topological order
        if id(n) not in reach_fwd and any(id(t.node) in reach_fwd for t in n.inputs):
            reach_fwd.add(id(n))
    back = set()
    stack = [y.node for y in ys]
    while stack:
        n = stack.pop()
        if id(n) in back or id(n) not in reach_fwd:
            continue
        back.add(id(n))
        stack.extend(t.node for t in n.inputs)
    return back


def _aggregate(parts: List[Grad]) -> Grad:
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(p, IndexedSlices) for p in parts):
        return sum_slices(parts)
    dense = [to_dense(p) for p in parts]
    return make("AddN", dense).outputs[0]


def gradients(ys, xs, grad_ys=None, name: str = "gradients",
              stop_gradients: Sequence[Tensor] = ()) -> List[Grad]:
    """d(sum of ys)/d(xs). Entries are None where an x does not affect any y."""
    ys = [convert(y) for y in (ys if isinstance(ys, (list, tuple)) else [ys])]
    single = not isinstance(xs, (list, tuple))
    xs = [convert(x) for x in ([xs] if single else xs)]
    g: Graph = graph_of(ys + xs)
    if grad_ys is None:
        grad_ys = [None] * len(ys)
    elif not isinstance(grad_ys, (list, tuple)):
        grad_ys = [grad_ys]
    if len(grad_ys) != len(ys):
        raise GraphError(f"gradients: {len(ys)} ys but {len(grad_ys)} grad_ys")
    stopped = {id(t.node) for t in stop_gradients}
    with g.as_default(), g.name_scope(name):
        between = _between(ys, xs)
        acc: Dict[Tensor, List[Grad]] = {}
        for y, gy in zip(ys, grad_ys):
            if not _dt.is_float(y.dtype):
                raise GraphError(f"gradients: y '{y.name}' is {y.dtype.name}; only float tensors are differentiable")
            gy = _ones_like(y) if gy is None else convert(gy, y.dtype)
            acc.setdefault(y, []).append(gy)
        x_set = set(xs)
        for node in sorted((n for n in g.nodes if id(n) in between), key=lambda n: -n.index):
            dys = [_aggregate(acc.pop(t, [])) if t not in x_set else _aggregate(acc.get(t, []))
                   for t in node.outputs]
            for t, d in zip(node.outputs, dys):
                if t in x_set and d is not None:
                    acc[t] = [d]
            if all(d is None for d in dys) or id(node) in stopped or not node.inputs:
                continue
            if not any(id(t.node) in between for t in node.inputs):
                continue  # an x's own producer: nothing upstream is wanted
            if node.opdef.grad is None:
                raise GraphError(f"no gradient is registered for op {node.op} (node '{node.name}'), "
                                 "which lies between the ys and the xs; wrap its input in stop_gradient "
                                 "if it should not be differentiated")
            with g.device(node.device):
                dense_dys = [to_dense(d) if isinstance(d, IndexedSlices) else d for d in dys]
                dxs = node.opdef.grad(node, dense_dys)
            if len(dxs) != len(node.inputs):
                raise GraphError(f"gradient of {node.op} returned {len(dxs)} values for "
                                 f"{len(node.inputs)} inputs (node '{node.name}')")
            for t, dx in zip(node.inputs, dxs):
                if dx is None or not _dt.is_float(t.dtype):
                    continue
                if id(t.node) in between or t in x_set:
                    acc.setdefault(t, []).append(dx)
        return [_aggregate(acc.get(x, [])) for x in xs]
