"""Constants, placeholders, identity, stop_gradient, no_op, group; and turning values into Tensors."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from .. import dtypes as _dt
from ..errors import ShapeError
from ..graph import Graph, Node, Tensor, get_default_graph, graph_of
from ..registry import REQUIRED, Cost, OpDef, register
from ..shapes import as_shape


def make(op: str, inputs: Sequence[Tensor] = (), attrs: Optional[dict] = None, name: Optional[str] = None,
         graph: Optional[Graph] = None, control_inputs=()) -> Node:
    """Build a node in the graph of its inputs (or the default graph)."""
    g = graph or graph_of(inputs)
    return g.add_node(op, inputs, attrs, name=name, control_inputs=control_inputs)


def convert(value: Any, dtype=None, graph: Optional[Graph] = None, name: Optional[str] = None) -> Tensor:
    """A Tensor for `value`: Tensors pass through (dtype checked), anything else becomes a Const."""
    if isinstance(value, Tensor):
        if dtype is not None and value.dtype != _dt.as_dtype(dtype):
            raise ShapeError(f"tensor '{value.name}' is {value.dtype.name}, expected {_dt.as_dtype(dtype).name}")
        return value
    if isinstance(value, Node):
        raise ShapeError(f"node '{value.name}' ({value.op}) was given where a Tensor is expected; "
                         "use node.outputs[i]")
    if hasattr(value, "_as_tensor"):  # Variables and layer outputs
        return value._as_tensor()
    return constant(value, dtype=dtype, graph=graph, name=name)


def convert_pair(a: Any, b: Any):
    """Two operands of a binary op: a Python scalar takes the other operand's dtype."""
    if not isinstance(a, Tensor) and isinstance(b, Tensor):
        a = constant(a, dtype=_scalar_dtype(a, b.dtype), graph=b.graph)
    elif not isinstance(b, Tensor) and isinstance(a, Tensor):
        b = constant(b, dtype=_scalar_dtype(b, a.dtype), graph=a.graph)
    else:
        a, b = convert(a), convert(b)
    return a, b


def _scalar_dtype(value: Any, other: np.dtype):
    arr = np.asarray(value)
    if arr.dtype.kind == "f" and other.kind in "iub":
        raise ShapeError(f"cannot combine float value {value!r} with a {other.name} tensor; cast first")
    return other


# ---- Const -----------------------------------------------------------------------
def _infer_const(node):
    v = node.attrs["value"]
    return [(v.dtype, v.shape)]


register(OpDef(
    "Const", inputs=(), attrs={"value": REQUIRED},
    infer=_infer_const,
    kernel=lambda node, ctx: ctx.xp.asarray(node.attrs["value"]),  # the executor binds it once
    cost=lambda node: Cost(0, 0, 0),
))


def constant(value: Any, dtype=None, shape=None, name: Optional[str] = None, graph: Optional[Graph] = None) -> Tensor:
    if dtype is not None:
        dtype = _dt.as_dtype(dtype)
    arr = np.asarray(value, dtype=dtype)
    if dtype is None:
        if arr.dtype == np.float64 and not isinstance(value, (np.ndarray, np.generic)):
            arr = arr.astype(np.float32)  # Python floats default to float32, as in TensorFlow
        elif arr.dtype == np.int64 and not isinstance(value, (np.ndarray, np.generic)):
            arr = arr.astype(np.int32)
        arr = arr.astype(_dt.as_dtype(arr.dtype), copy=False)
    if shape is not None:
        arr = np.broadcast_to(arr, as_shape(shape))
    arr = np.array(arr, order="C")  # a private copy (ascontiguousarray would make 0-d 1-d)
    arr.flags.writeable = False
    return make("Const", (), {"value": arr}, name=name or "Const", graph=graph or get_default_graph()).outputs[0]


# ---- Placeholder -----------------------------------------------------------------
register(OpDef(
    "Placeholder", inputs=(), attrs={"dtype": REQUIRED, "shape": REQUIRED},
    infer=lambda node: [(node.attrs["dtype"], node.attrs["shape"])],
    kernel=None,  # the executor raises a FeedError naming the placeholder when it is not fed
    stateful=True,
))


def placeholder(dtype, shape, name: Optional[str] = None, graph: Optional[Graph] = None) -> Tensor:
    return make("Placeholder", (), {"dtype": _dt.as_dtype(dtype), "shape": as_shape(shape)},
                name=name or "Placeholder", graph=graph or get_default_graph()).outputs[0]


# ---- Identity, StopGradient --------------------------------------------------------
def _same(node):
    t = node.inputs[0]
    return [(t.dtype, t.shape)]


register(OpDef("Identity", inputs=("x",), infer=_same,
               kernel=lambda node, ctx: (lambda x: x), grad=lambda node, dys: [dys[0]],
               cost=lambda node: Cost(0, 0, 0)))
register(OpDef("StopGradient", inputs=("x",), infer=_same,
               kernel=lambda node, ctx: (lambda x: x), grad=lambda node, dys: [None],
               cost=lambda node: Cost(0, 0, 0)))


def identity(x, name: Optional[str] = None) -> Tensor:
    return make("Identity", (convert(x),), name=name).outputs[0]


def stop_gradient(x, name: Optional[str] = None) -> Tensor:
    return make("StopGradient", (convert(x),), name=name).outputs[0]


# ---- NoOp and group ------------------------------------------------------------------
register(OpDef("NoOp", inputs=(), infer=lambda node: [], kernel=lambda node, ctx: (lambda: None),
               cost=lambda node: Cost(0, 0, 0)))


def no_op(name: Optional[str] = None, graph: Optional[Graph] = None) -> Node:
    return make("NoOp", (), name=name or "NoOp", graph=graph or get_default_graph())


def group(*deps, name: Optional[str] = None) -> Node:
    """A NoOp that runs after all of `deps` (Nodes or Tensors)."""
    flat = []
    for d in deps:
        flat.extend(d if isinstance(d, (list, tuple)) else [d])
    nodes = [d.node if isinstance(d, Tensor) else d for d in flat]
    g = graph_of(nodes)
    return g.add_node("NoOp", (), name=name or "group", control_inputs=nodes)
