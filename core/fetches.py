"""How a session reads its fetches and feeds: names, Tensors, Nodes and nested lists, tuples and
dicts of them resolved against the graph, and the check a fed value passes. One rule that core's
Session and cloud's DistributedSession both call, so that a fetch means the same on a cluster."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .errors import FeedError, GraphError
from .graph import Graph, Node, Tensor
from .shapes import compatible, fmt, fully_defined


def resolve_fetch(graph: Graph, f):
    """The Tensor or Node a fetch names: a name ("node" or "node:0"), a Tensor, a Node, or an object
    with _as_tensor (a Variable). A node with one output fetched by name is its output, unless it is
    an update op (it runs and returns nothing)."""
    if isinstance(f, str):
        name = f
        f = graph.tensor(name) if ":" in name else graph.node(name)
        if isinstance(f, Node) and len(f.outputs) == 1 and ":" not in name and f.op not in FETCHED_AS_NODES \
                and not f.opdef.ref_inputs:
            f = f.outputs[0]
    elif hasattr(f, "_as_tensor") and not isinstance(f, Tensor):
        f = f._as_tensor()
    if isinstance(f, (Tensor, Node)):
        if f.graph is not graph:
            raise GraphError(f"cannot fetch '{f.name}': it belongs to another graph than this session's")
        return f
    raise TypeError(f"cannot fetch {f!r}: fetches are Tensors, Nodes, names, or lists/tuples/dicts of them")


def resolve_feed(graph: Graph, k) -> Tensor:
    """The Tensor a feed key names (a node is its one output)."""
    t = resolve_fetch(graph, k)
    if isinstance(t, Node):
        if len(t.outputs) != 1:
            raise FeedError(f"cannot feed node '{t.name}' ({t.op}): name one of its outputs")
        t = t.outputs[0]
    return t


FETCHED_AS_NODES = frozenset({"NoOp", "Assign", "AssignAdd", "AssignSub", "ScatterAdd"})


def fetch_key(f):
    t = type(f)
    if t is list or t is tuple:
        return (t, tuple(fetch_key(x) for x in f))
    if t is dict:
        return (dict, tuple((k, fetch_key(v)) for k, v in f.items()))
    return f


def flatten(f, flat: list, resolve) -> Callable:
    """Append the leaves of a fetch structure to `flat`; return a function rebuilding it."""
    t = type(f)
    if t is list or t is tuple:
        parts = [flatten(x, flat, resolve) for x in f]
        return lambda out: t(p(out) for p in parts)
    if t is dict:
        keys = list(f)
        parts = [flatten(f[k], flat, resolve) for k in keys]
        return lambda out: {k: p(out) for k, p in zip(keys, parts)}
    i = len(flat)
    flat.append(resolve(f))
    return lambda out: out[i]


def feed_check(t: Tensor) -> Callable:
    """A fast check for values fed to `t`; the slow path converts and names the tensor."""
    dtype, shape = t.dtype, t.shape
    exact = fully_defined(shape)
    what = f"'{t.node.name}'" if t.node.op == "Placeholder" else f"tensor '{t.name}'"

    def slow(v):
        if hasattr(v, "_as_tensor") or isinstance(v, (Tensor, Node)):
            raise FeedError(f"feed for {what} is a symbolic tensor; feed a value (numpy array)")
        arr = np.asarray(v)
        if arr.dtype != dtype:
            # numpy arrays keep their kind (float64 -> float32 is fine, int -> float is not);
            # Python scalars and lists convert unless that would drop a fraction
            same_kind = arr.dtype.kind == dtype.kind or (arr.dtype.kind in "iu" and dtype.kind in "iu")
            from_python = not isinstance(v, (np.ndarray, np.generic))
            ok = same_kind or (from_python and arr.dtype.kind in "biu" and dtype.kind in "fiu")
            if arr.dtype == object or not ok:
                raise FeedError(f"feed for {what} has dtype {arr.dtype}; expected {dtype.name}")
            arr = arr.astype(dtype)
        if not compatible(arr.shape, shape):
            raise FeedError(f"feed for {what} has shape {fmt(arr.shape)}; expected {fmt(shape)}")
        return arr

    if exact:
        def check(v):
            if type(v) is np.ndarray and v.dtype is dtype and v.shape == shape:
                return v
            return slow(v)
    else:
        check = slow
    return check


__all__ = ["resolve_fetch", "resolve_feed", "flatten", "fetch_key", "feed_check", "FETCHED_AS_NODES"]
