"""core.graph.Graph <-> GraphDef (proto/graph.proto), bit for bit.

Every graph a Function attribute refers to (cond branches, loop bodies, their gradient
functions, nested bodies) is written once into the GraphDef's library and referred to by
id, so Functions that share a body graph still share it after decoding, and body nodes
that read an enclosing graph's tensors (captures, updates of an outer variable) point at
the same decoded tensors. Output dtypes and shapes are written as well, so decoding
builds the nodes as they were instead of re-deriving them; `verify=True` (the default)
then re-runs shape inference over every decoded graph, so a malformed or hostile GraphDef
is rejected with a GraphCodecError instead of producing a graph that fails later.

While's `saved` attribute (a SavedTensors holder the gradient builder fills) is not
carried: decoding recreates it and refills it from the WhileGrad nodes that read the
loop (their grad_fn inputs name the saved body tensors), exactly as building did.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import numpy as np

from .. import core as _core  # registers every op
from ..core import dtypes as _dt
from ..core import registry
from ..core.function import Function
from ..core.graph import Graph, Node, Tensor
from ..core.ops.control import SavedTensors
from ..core.variables import Variable
from ..proto import graph_pb2, tensor_pb2
from ..wire import tensor_codec

FORMAT_VERSION = 1
_INT64 = (-(1 << 63), (1 << 63) - 1)

del _core


class GraphCodecError(ValueError):
    """A graph cannot be encoded, or a GraphDef is not a valid graph."""


def _dtype_enum(d) -> int:
    if d is _dt.variant or np.dtype(d) == _dt.variant:
        return tensor_pb2.DT_VARIANT
    try:
        return tensor_codec.dtype_to_enum(d)
    except tensor_codec.TensorCodecError as e:
        raise GraphCodecError(str(e)) from None


def _enum_dtype(e: int) -> np.dtype:
    if e == tensor_pb2.DT_VARIANT:
        return _dt.variant
    try:
        return _dt.as_dtype(tensor_codec.enum_to_dtype(e))
    except tensor_codec.TensorCodecError as e2:
        raise GraphCodecError(str(e2)) from None


# ---- encoding ------------------------------------------------------------------------------
class _Encoder:
    def __init__(self, root: Graph, rebind: Optional[Callable[[Tensor], Optional[Tensor]]] = None):
        self.graphs: List[Graph] = [root]
        self.ids: Dict[int, int] = {id(root): 0}
        self.rebind = rebind

    def gid(self, g: Graph) -> int:
        i = self.ids.get(id(g))
        if i is None:
            i = self.ids[id(g)] = len(self.graphs)
            self.graphs.append(g)
        return i

    def ref(self, t: Tensor, msg: graph_pb2.TensorRef, where: str) -> None:
        i = self.ids.get(id(t.node.graph))
        if i is None and self.rebind is not None:
            t2 = self.rebind(t)
            if t2 is not None:
                t, i = t2, self.ids.get(id(t2.node.graph))
        if i is None:
            raise GraphCodecError(f"{where}: tensor '{t.name}' lives in a graph outside the one encoded")
        msg.node = t.node.name
        msg.index = t.index
        msg.graph = i

    def attr(self, v: Any, av: graph_pb2.AttrValue, where: str) -> None:
        if v is None:
            av.none = True
        elif isinstance(v, SavedTensors):
            av.saved_tensors = True
        elif isinstance(v, bool):
            av.b = v
        elif isinstance(v, int):
            if not _INT64[0] <= v <= _INT64[1]:
                raise GraphCodecError(f"{where}: integer {v} does not fit in int64")
            av.i = v
        elif isinstance(v, float):
            av.f = v
        elif isinstance(v, str):
            av.s = v
        elif isinstance(v, bytes):
            av.raw = v
        elif isinstance(v, (tuple, list)):
            av.list.SetInParent()
            av.list.is_list = isinstance(v, list)
            for k, x in enumerate(v):
                self.attr(x, av.list.values.add(), f"{where}[{k}]")
        elif isinstance(v, np.ndarray):
            self.tensor(v, av.tensor, where)
        elif isinstance(v, np.generic):
            self.tensor(np.asarray(v), av.scalar, where)
        elif isinstance(v, np.dtype):
            av.dtype = _dtype_enum(v)
        elif isinstance(v, type) and issubclass(v, np.generic):
            av.dtype = _dtype_enum(np.dtype(v))
        elif isinstance(v, Function):
            f = av.func
            f.graph = self.gid(v.graph)
            f.name = v.name
            for t in v.inputs:
                self.ref(t, f.inputs.add(), where)
            for t in v.outputs:
                self.ref(t, f.outputs.add(), where)
        else:
            raise GraphCodecError(f"{where}: cannot serialise a {type(v).__name__} attribute ({v!r})")

    @staticmethod
    def tensor(arr: np.ndarray, msg, where: str) -> None:
        try:
            tensor_codec.encode(arr, out=msg, max_bytes=1 << 62)
        except tensor_codec.TensorCodecError as e:
            raise GraphCodecError(f"{where}: {e}") from None

    def node(self, n: Node, nd: graph_pb2.NodeDef) -> None:
        where = f"node '{n.name}' ({n.op})"
        nd.name = n.name
        nd.op = n.op
        for t in n.inputs:
            self.ref(t, nd.inputs.add(), where)
        nd.control_inputs.extend(c.name for c in n.control_inputs)
        for k, v in n.attrs.items():
            e = nd.attrs.add()
            e.key = k
            self.attr(v, e.value, f"{where} attribute '{k}'")
        if n.device:
            nd.device = n.device
        for t in n.outputs:
            o = nd.outputs.add()
            o.dtype = _dtype_enum(t.dtype)
            o.shape.SetInParent()
            o.shape.dim.extend(-1 if s is None else s for s in t.shape)
        if n.outputs and isinstance(n.outputs[0], Variable):
            v = n.outputs[0]
            nd.variable.initializer = v.initializer.name
            self.ref(v.initial_value, nd.variable.initial_value, where)
            nd.variable.trainable = v.trainable

    def _outer(self, g: Graph) -> int:
        if g.outer is None:
            return -1
        # a body whose enclosing graph is not encoded: the root stands for it when rebinding
        return self.ids.get(id(g.outer), -1 if self.rebind is None else 0)

    def subgraph(self, g: Graph, sg: graph_pb2.SubGraph) -> None:
        for n in g.nodes:
            self.node(n, sg.node.add())
        sg.outer = self._outer(g)
        if g.outer is not None and sg.outer == -1 and g.captures:
            raise GraphCodecError("a body graph with captures is encoded without its enclosing graph")
        for outer_t, ph in g.captures.items():
            c = sg.captures.add()
            self.ref(outer_t, c.outer, "capture")
            c.placeholder = ph.node.name
        if g.seed is not None:
            sg.has_seed = True
            sg.seed = g.seed
        for name, count in g._name_counts.items():
            sg.name_counts.add(name=name, count=count)
        for key, items in g.collections.items():
            col = sg.collections.add(key=key)
            for x in items:
                it = col.items.add()
                if isinstance(x, Node):
                    it.node = x.name
                elif isinstance(x, Tensor):
                    self.ref(x, it.tensor, f"collection '{key}'")
                else:
                    self.attr(x, it.value, f"collection '{key}'")


def encode(graph: Graph, rebind: Optional[Callable[[Tensor], Optional[Tensor]]] = None) -> graph_pb2.GraphDef:
    """The GraphDef of `graph` and of every body graph its Functions refer to.

    `rebind(t)`: for a tensor of a graph outside the encoded ones (a partition part's loop
    body still reads the unsplit graph), the encoded graph's tensor that stands for it;
    bodies whose enclosing graph is not encoded are then enclosed by the root.
    """
    enc = _Encoder(graph, rebind)
    out = graph_pb2.GraphDef(version=FORMAT_VERSION)
    # discover body graphs breadth first (a body's outer is discovered before the body)
    msgs = []
    i = 0
    while i < len(enc.graphs):
        g = enc.graphs[i]
        sg = out.root if i == 0 else graph_pb2.SubGraph()
        enc.subgraph(g, sg)  # may append more graphs (Functions in this graph's attrs)
        msgs.append(sg)
        i += 1
    # outers were resolved while their ids might not exist yet: fix them now
    for k, g in enumerate(enc.graphs):
        if k:
            msgs[k].outer = enc._outer(g)
    for sg in msgs[1:]:
        out.library.append(sg)
    return out


def to_bytes(graph: Graph, rebind: Optional[Callable[[Tensor], Optional[Tensor]]] = None) -> bytes:
    return encode(graph, rebind).SerializeToString(deterministic=True)


# ---- decoding ------------------------------------------------------------------------------
class _Decoder:
    def __init__(self, gd: graph_pb2.GraphDef):
        self.subs = [gd.root] + list(gd.library)
        self.graphs: List[Graph] = []

    def graph(self, i: int, where: str) -> Graph:
        if not 0 <= i < len(self.graphs):
            raise GraphCodecError(f"{where}: graph id {i} does not exist ({len(self.graphs)} graphs)")
        return self.graphs[i]

    def tensor(self, r: graph_pb2.TensorRef, where: str) -> Tensor:
        g = self.graph(r.graph, where)
        node = g._by_name.get(r.node)
        if node is None:
            raise GraphCodecError(f"{where}: no node '{r.node}' in graph {r.graph}")
        if not 0 <= r.index < len(node.outputs):
            raise GraphCodecError(f"{where}: node '{r.node}' has {len(node.outputs)} outputs; no output {r.index}")
        return node.outputs[r.index]

    def attr(self, av: graph_pb2.AttrValue, where: str) -> Any:
        kind = av.WhichOneof("value")
        if kind is None or kind == "none":
            return None
        if kind in ("i", "f", "b", "s", "raw"):
            return getattr(av, kind)
        if kind == "list":
            vals = [self.attr(x, f"{where}[{k}]") for k, x in enumerate(av.list.values)]
            return vals if av.list.is_list else tuple(vals)
        if kind in ("tensor", "scalar"):
            try:
                arr = tensor_codec.decode(getattr(av, kind), max_bytes=self.max_bytes).copy()
            except tensor_codec.TensorCodecError as e:
                raise GraphCodecError(f"{where}: {e}") from None
            if kind == "scalar":
                if arr.shape != ():
                    raise GraphCodecError(f"{where}: a scalar attribute of shape {arr.shape}")
                return arr[()]
            return arr
        if kind == "dtype":
            return _enum_dtype(av.dtype)
        if kind == "func":
            f = av.func
            g = self.graph(f.graph, where)
            return Function(g, [self.tensor(t, where) for t in f.inputs],
                            [self.tensor(t, where) for t in f.outputs], name=f.name)
        if kind == "saved_tensors":
            return SavedTensors()
        raise GraphCodecError(f"{where}: unknown attribute kind {kind!r}")  # pragma: no cover

    def decode(self, verify: bool) -> Graph:
        subs = self.subs
        for sg in subs:
            self.graphs.append(Graph(seed=sg.seed if sg.has_seed else None))
        for g, sg in zip(self.graphs, subs):
            if sg.outer != -1:
                g.outer = self.graph(sg.outer, "graph outer")
        for k, g in enumerate(self.graphs):  # an outer chain must end
            seen, o = {k}, g.outer
            while o is not None:
                j = self.graphs.index(o)
                if j in seen:
                    raise GraphCodecError(f"graph {k}: its chain of enclosing graphs loops")
                seen.add(j)
                o = o.outer
        # pass 1: every node and its outputs, so any reference can be resolved in pass 2
        for g, sg in zip(self.graphs, subs):
            for nd in sg.node:
                self.make_node(g, nd)
        # pass 2: inputs, control inputs, attributes, variables
        for g, sg in zip(self.graphs, subs):
            for nd in sg.node:
                self.fill_node(g, nd)
        for gi, (g, sg) in enumerate(zip(self.graphs, subs)):
            for c in sg.captures:
                outer_t = self.tensor(c.outer, f"graph {gi} capture")
                ph = g._by_name.get(c.placeholder)
                if ph is None or ph.op != "Placeholder":
                    raise GraphCodecError(f"graph {gi}: capture placeholder '{c.placeholder}' is not a Placeholder here")
                g.captures[outer_t] = ph.outputs[0]
            for nc in sg.name_counts:
                g._name_counts[nc.name] = nc.count
            for n in g.nodes:  # a GraphDef without counts still reserves its names
                g._name_counts.setdefault(n.name, 0)
            for col in sg.collections:
                items = g.collections.setdefault(col.key, [])
                for it in col.items:
                    kind = it.WhichOneof("item")
                    if kind == "node":
                        n = g._by_name.get(it.node)
                        if n is None:
                            raise GraphCodecError(f"collection '{col.key}': no node '{it.node}'")
                        items.append(n)
                    elif kind == "tensor":
                        items.append(self.tensor(it.tensor, f"collection '{col.key}'"))
                    else:
                        items.append(self.attr(it.value, f"collection '{col.key}'"))
            g.version = len(g.nodes)
        self.refill_saved()
        if verify:
            for gi, g in enumerate(self.graphs):
                try:
                    g.verify()
                except Exception as e:  # noqa: BLE001  (hostile input: whatever inference raises)
                    raise GraphCodecError(f"graph {gi} does not verify: {type(e).__name__}: {e}") from None
        return self.graphs[0]

    def make_node(self, g: Graph, nd: graph_pb2.NodeDef) -> None:
        where = f"node '{nd.name}' ({nd.op})"
        if not nd.name or nd.name in g._by_name:
            raise GraphCodecError(f"{where}: the name is empty or taken twice")
        try:
            opdef = registry.get(nd.op)
        except Exception as e:  # noqa: BLE001
            raise GraphCodecError(f"{where}: unknown op: {e}") from None
        node = Node(g, nd.op, nd.name, (), (), {}, nd.device or None, opdef)
        outs = []
        for i, o in enumerate(nd.outputs):
            d = _enum_dtype(o.dtype)
            shape = tuple(None if s == -1 else int(s) for s in o.shape.dim)
            if any(s is not None and s < 0 for s in shape):
                raise GraphCodecError(f"{where}: output {i} has a negative dimension {list(o.shape.dim)}")
            if i == 0 and nd.HasField("variable"):
                t = Tensor.__new__(Variable)
                Tensor.__init__(t, node, 0, d, shape)
            else:
                t = Tensor(node, i, d, shape)
            outs.append(t)
        node.outputs = tuple(outs)
        node.index = len(g.nodes)
        g.nodes.append(node)
        g._by_name[nd.name] = node

    def fill_node(self, g: Graph, nd: graph_pb2.NodeDef) -> None:
        node = g._by_name[nd.name]
        where = f"node '{nd.name}' ({nd.op})"
        node.inputs = tuple(self.tensor(r, where) for r in nd.inputs)
        ctl = []
        for c in nd.control_inputs:
            n = g._by_name.get(c)
            if n is None:
                raise GraphCodecError(f"{where}: no control input '{c}' in its graph")
            ctl.append(n)
        node.control_inputs = tuple(ctl)
        node.attrs = {e.key: self.attr(e.value, f"{where} attribute '{e.key}'") for e in nd.attrs}
        if nd.HasField("variable"):
            if not node.outputs:
                raise GraphCodecError(f"{where}: a variable node with no output (its value is output 0)")
            v = node.outputs[0]
            init = g._by_name.get(nd.variable.initializer)
            if init is None:
                raise GraphCodecError(f"{where}: no initializer node '{nd.variable.initializer}'")
            v.initializer = init
            v.initial_value = self.tensor(nd.variable.initial_value, where)
            v.trainable = nd.variable.trainable

    def refill_saved(self) -> None:
        for g in self.graphs:
            for n in g.nodes:
                if n.op != "WhileGrad":
                    continue
                fwd = [t.node for t in n.inputs if t.node.op == "While" and t.index == len(t.node.outputs) - 1]
                fn = n.attrs.get("grad_fn")
                if not fwd or not isinstance(fn, Function):
                    continue
                w = fwd[0]
                body = w.attrs.get("body")
                holder = w.attrs.get("saved")
                n_saved = n.attrs.get("n_saved", 0)
                if not isinstance(body, Function) or not isinstance(holder, SavedTensors):
                    continue
                k = len(body.inputs)
                if isinstance(n_saved, bool) or not isinstance(n_saved, (int, np.integer)) \
                        or not 0 <= n_saved <= len(fn.inputs) - k:
                    raise GraphCodecError(f"node '{n.name}': attribute n_saved must be an integer in "
                                          f"[0, {max(len(fn.inputs) - k, 0)}], got {n_saved!r}")
                holder.add(fn.inputs[k:k + n_saved])

    max_bytes = tensor_codec.DEFAULT_MAX_BYTES


def decode(gd, verify: bool = True, max_bytes: Optional[int] = None) -> Graph:
    """A Graph from a GraphDef (or its serialized bytes)."""
    if isinstance(gd, (bytes, bytearray, memoryview)):
        try:
            gd = graph_pb2.GraphDef.FromString(bytes(gd))
        except Exception as e:  # noqa: BLE001  (protobuf's DecodeError)
            raise GraphCodecError(f"not a GraphDef: {e}") from None
    if gd.version not in (0, FORMAT_VERSION):
        raise GraphCodecError(f"GraphDef format version {gd.version}; this isthmus reads {FORMAT_VERSION}")
    dec = _Decoder(gd)
    if max_bytes is not None:
        dec.max_bytes = max_bytes
    return dec.decode(verify)


def from_bytes(data: bytes, verify: bool = True) -> Graph:
    return decode(data, verify=verify)
