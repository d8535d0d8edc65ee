"""The graph IR: Graph holds Nodes; a Node's outputs are Tensors with a dtype and a static shape.

Nodes are appended only after their inputs exist, so `graph.nodes` is always in
topological order; the Graph alone assigns names and keeps itself consistent.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence

import numpy as np

from . import dtypes as _dt
from . import registry
from .devices import DeviceSpec
from .errors import GraphError, ShapeError
from .shapes import Shape, fmt


class Tensor:
    """Output `index` of `node`. Tensors compare by identity (use `equal` for elementwise ==)."""
    __slots__ = ("node", "index", "dtype", "shape", "__weakref__")

    def __init__(self, node: "Node", index: int, dtype: np.dtype, shape: Shape):
        self.node = node
        self.index = index
        self.dtype = dtype
        self.shape = shape

    @property
    def name(self) -> str:
        return f"{self.node.name}:{self.index}"

    @property
    def op(self) -> "Node":
        return self.node

    @property
    def graph(self) -> "Graph":
        return self.node.graph

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"<Tensor '{self.name}' {self.dtype.name}{fmt(self.shape)}>"

    def __bool__(self) -> bool:
        raise TypeError(f"the truth value of symbolic tensor '{self.name}' is unknown until it runs; "
                        "use cond/where instead of Python if")

    __hash__ = object.__hash__
    # arithmetic operators are attached by core/ops/math.py


class Node:
    __slots__ = ("graph", "op", "name", "inputs", "control_inputs", "attrs", "device",
                 "outputs", "index", "opdef", "__weakref__")

    def __init__(self, graph, op, name, inputs, control_inputs, attrs, device, opdef):
        self.graph: Graph = graph
        self.op: str = op
        self.name: str = name
        self.inputs: tuple = tuple(inputs)
        self.control_inputs: tuple = tuple(control_inputs)
        self.attrs: Dict[str, Any] = attrs
        self.device: Optional[str] = device
        self.opdef: registry.OpDef = opdef
        self.outputs: tuple = ()
        self.index: int = -1

    @property
    def output(self) -> Tensor:
        if len(self.outputs) != 1:
            raise GraphError(f"node '{self.name}' ({self.op}) has {len(self.outputs)} outputs; "
                             "use .outputs[i]")
        return self.outputs[0]

    @property
    def type(self) -> str:
        return self.op

    def __repr__(self) -> str:
        return f"<Node '{self.name}' op={self.op}>"

    def describe(self) -> str:
        """One line: %name = Op(inputs) {attrs} : outputs @device."""
        ins = ", ".join("%" + (t.node.name if t.index == 0 else t.name) for t in self.inputs)
        if self.control_inputs:
            ins += (", " if ins else "") + ", ".join("^" + c.name for c in self.control_inputs)
        shown = {k: _short(v) for k, v in self.attrs.items() if k not in ("dtype", "shape")}
        attrs = " {" + ", ".join(f"{k}={v}" for k, v in shown.items()) + "}" if shown else ""
        outs = ", ".join(f"{t.dtype.name}{fmt(t.shape)}" for t in self.outputs) or "()"
        dev = f" @{self.device}" if self.device else ""
        return f"%{self.name} = {self.op}({ins}){attrs} : {outs}{dev}"


def _short(v: Any) -> str:
    if isinstance(v, np.ndarray):
        if v.size <= 4:
            return np.array2string(v, separator=",").replace("\n", "")
        return f"<{v.dtype.name}{fmt(v.shape)}>"
    if isinstance(v, Graph):
        return f"<graph {len(v.nodes)} nodes>"
    return repr(v)


class _ThreadState(threading.local):
    def __init__(self):
        self.graphs: List[Graph] = []


_tls = _ThreadState()
_global_default: Optional["Graph"] = None
_global_lock = threading.Lock()


class _BuildContext(threading.local):
    """Per-graph, per-thread build context: name scope, device, control dependencies."""

    def __init__(self):
        self.scope: str = ""
        self.device: DeviceSpec = DeviceSpec()
        self.control: List[List[Node]] = []


class Graph:
    """A dataflow graph. A graph with an `outer` graph is a body (of a cond or while_loop):
    reading a tensor of an enclosing graph inside it captures that tensor as a placeholder.
    """

    def __init__(self, seed: Optional[int] = None, outer: Optional["Graph"] = None):
        self.outer = outer
        self.captures: Dict[Tensor, Tensor] = {}  # enclosing-graph tensor -> placeholder here
        self.nodes: List[Node] = []
        self._by_name: Dict[str, Node] = {}
        self._name_counts: Dict[str, int] = {}
        self._lock = threading.RLock()
        self._ctx = _BuildContext()
        self.seed = seed
        self.collections: Dict[str, list] = {}
        self.version = 0  # bumped on every change; plans cache per version

    # ---- construction -------------------------------------------------------------
    def add_node(self, op: str, inputs: Sequence[Tensor] = (), attrs: Optional[Dict[str, Any]] = None,
                 name: Optional[str] = None, control_inputs: Iterable[Node] = (),
                 device: Optional[str] = None, exact_name: bool = False) -> Node:
        """Build a node: check arity and attributes, infer its outputs' dtypes and shapes.

        The name is made unique within the current name scope, unless `exact_name`
        (a full name reserved earlier with `unique_name`) is set.
        """
        opdef = registry.get(op)
        with self._lock:
            if exact_name:
                if not name or name in self._by_name:
                    raise GraphError(f"node name {name!r} is empty or already taken")
                node_name = name
                self._name_counts.setdefault(name, 0)
            else:
                node_name = self.unique_name(name or op)
            inputs = list(inputs)
            for i, t in enumerate(inputs):
                if not isinstance(t, Tensor):
                    raise GraphError(f"node '{node_name}' ({op}): input {i} is {type(t).__name__}, not a Tensor")
                if t.node.graph is not self:
                    if not self.encloses(t.node.graph):
                        raise GraphError(f"node '{node_name}' ({op}): input {i} '{t.name}' is from another graph")
                    if not (i in opdef.ref_inputs and t.node.op == "Variable"):
                        inputs[i] = self.capture(t)  # a value read; an outer variable updated stays a ref
            opdef.check_arity(len(inputs), node_name)
            full_attrs = opdef.fill_attrs(attrs or {}, node_name)
            controls = list(control_inputs)
            for group in self._ctx.control:
                controls.extend(group)
            seen = set()
            controls = [c for c in controls if not (id(c) in seen or seen.add(id(c)))]
            for c in controls:
                if c.graph is not self:
                    raise GraphError(f"node '{node_name}' ({op}): control input '{c.name}' is from another graph")
            dev = self._ctx.device
            if device is not None:
                dev = DeviceSpec.parse(device).merged_onto(dev)
            node = Node(self, op, node_name, inputs, controls, full_attrs, str(dev) or None, opdef)
            try:
                specs = opdef.infer(node)
            except ShapeError as e:
                raise ShapeError(f"node '{node_name}' ({op}): {e}; inputs: "
                                 + (", ".join(f"{t.name} {t.dtype.name}{fmt(t.shape)}" for t in inputs) or "none")) from None
            node.outputs = tuple(Tensor(node, i, _dt.as_dtype(d), tuple(s)) for i, (d, s) in enumerate(specs))
            node.index = len(self.nodes)
            self.nodes.append(node)
            self._by_name[node_name] = node
            self.version += 1
            return node

    def encloses(self, other: "Graph") -> bool:
        """True when `other` is an enclosing graph of this one (its outer, or outer's outer...)."""
        g = self.outer
        while g is not None:
            if g is other:
                return True
            g = g.outer
        return False

    def capture(self, t: Tensor) -> Tensor:
        """The placeholder standing for enclosing-graph tensor `t` inside this body."""
        if t.node.graph is self:
            return t
        if self.outer is None or not self.encloses(t.node.graph):
            raise GraphError(f"tensor '{t.name}' is not from an enclosing graph")
        src = t if t.node.graph is self.outer else self.outer.capture(t)
        ph = self.captures.get(src)
        if ph is None:
            with self._lock:
                node = self.add_node("Placeholder", (), {"dtype": src.dtype, "shape": src.shape},
                                     name="capture/" + src.node.name.replace("/", "_"))
            ph = self.captures[src] = node.outputs[0]
        return ph

    def unique_name(self, base: str) -> str:
        """Scope-prefixed, graph-unique name (reserved once returned); a taken name gets _1, _2, ..."""
        base = self._ctx.scope + base
        with self._lock:
            if base not in self._by_name and base not in self._name_counts:
                self._name_counts[base] = 0
                return base
            n = self._name_counts.get(base, 0)
            while True:
                n += 1
                cand = f"{base}_{n}"
                if cand not in self._by_name:
                    self._name_counts[base] = n
                    self._name_counts.setdefault(cand, 0)
                    return cand

    # ---- lookup --------------------------------------------------------------------
    def node(self, name: str) -> Node:
        try:
            return self._by_name[name]
        except KeyError:
            raise GraphError(f"no node named '{name}' in this graph") from None

    def tensor(self, name: str) -> Tensor:
        node_name, _, idx = name.rpartition(":")
        if not node_name or not idx.isdigit():
            node_name, idx = name, "0"
        node = self.node(node_name)
        i = int(idx)
        if i >= len(node.outputs):
            raise GraphError(f"node '{node_name}' ({node.op}) has {len(node.outputs)} outputs; no output {i}")
        return node.outputs[i]

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self.nodes)

    def __bool__(self) -> bool:  # an empty graph is still a graph (`graph or default` must keep it)
        return True

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def consumers(self) -> Dict[Node, List[Node]]:
        users: Dict[Node, List[Node]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for t in n.inputs:
                users[t.node].append(n)
            for c in n.control_inputs:
                users[c].append(n)
        return users

    def add_to_collection(self, key: str, value: Any) -> None:
        with self._lock:
            self.collections.setdefault(key, []).append(value)

    def get_collection(self, key: str) -> list:
        return list(self.collections.get(key, ()))

    # ---- context managers --------------------------------------------------------
    @contextlib.contextmanager
    def as_default(self):
        _tls.graphs.append(self)
        try:
            yield self
        finally:
            _tls.graphs.pop()

    @contextlib.contextmanager
    def name_scope(self, name: str):
        old = self._ctx.scope
        if name.endswith("/"):  # an absolute scope, as returned by a previous name_scope
            scope = name
        else:
            scope = self.unique_name(name) + "/"
            self._name_counts.setdefault(scope[:-1], 0)
        self._ctx.scope = scope
        try:
            yield scope
        finally:
            self._ctx.scope = old

    @contextlib.contextmanager
    def device(self, name: Optional[str]):
        old = self._ctx.device
        self._ctx.device = DeviceSpec() if name is None else DeviceSpec.parse(name).merged_onto(old)
        try:
            yield
        finally:
            self._ctx.device = old

    @contextlib.contextmanager
    def control_dependencies(self, deps: Optional[Iterable]):
        if deps is None:  # clears the enclosing control dependencies, as in TensorFlow
            old = self._ctx.control
            self._ctx.control = []
            try:
                yield
            finally:
                self._ctx.control = old
            return
        nodes = [d.node if isinstance(d, Tensor) else d for d in deps]
        for d in nodes:
            if not isinstance(d, Node):
                raise GraphError(f"control dependency must be a Node or Tensor, got {type(d).__name__}")
        self._ctx.control.append(nodes)
        try:
            yield
        finally:
            self._ctx.control.pop()

    # ---- checks and printing ---------------------------------------------------
    def verify(self) -> "Graph":
        """Check order, references, arity, names and shapes; raise GraphError at the first fault."""
        seen: Dict[int, Node] = {}
        names = set()
        for i, n in enumerate(self.nodes):
            where = f"node '{n.name}' ({n.op})"
            if n.graph is not self:
                raise GraphError(f"{where}: belongs to another graph")
            if n.index != i:
                raise GraphError(f"{where}: index {n.index} but stands at position {i}")
            if n.name in names:
                raise GraphError(f"{where}: duplicate name")
            names.add(n.name)
            if self._by_name.get(n.name) is not n:
                raise GraphError(f"{where}: name table is out of date")
            n.opdef.check_arity(len(n.inputs), n.name)
            for k, t in enumerate(n.inputs):
                if k in n.opdef.ref_inputs and t.node.graph is not self and self.encloses(t.node.graph):
                    continue  # a body updating an enclosing graph's variable
                if id(t.node) not in seen:
                    raise GraphError(f"{where}: input '{t.name}' is not defined before it "
                                     "(dangling reference or wrong order)")
                if t.index >= len(t.node.outputs) or t.node.outputs[t.index] is not t:
                    raise GraphError(f"{where}: input '{t.name}' does not exist")
            for c in n.control_inputs:
                if id(c) not in seen:
                    raise GraphError(f"{where}: control input '{c.name}' is not defined before it")
            try:
                specs = n.opdef.infer(n)
            except ShapeError as e:
                raise GraphError(f"{where}: shape inference fails: {e}") from None
            if len(specs) != len(n.outputs):
                raise GraphError(f"{where}: has {len(n.outputs)} outputs, inference says {len(specs)}")
            for t, (d, s) in zip(n.outputs, specs):
                if _dt.as_dtype(d) != t.dtype or tuple(s) != t.shape:
                    raise GraphError(f"{where}: output {t.index} is {t.dtype.name}{fmt(t.shape)}, "
                                     f"inference says {_dt.as_dtype(d).name}{fmt(tuple(s))}")
            seen[id(n)] = n
        return self

    def __str__(self) -> str:
        return "\n".join(n.describe() for n in self.nodes)

    def __repr__(self) -> str:
        return f"<Graph {len(self.nodes)} nodes>"


def get_default_graph() -> Graph:
    global _global_default
    if _tls.graphs:
        return _tls.graphs[-1]
    with _global_lock:
        if _global_default is None:
            _global_default = Graph()
        return _global_default


def reset_default_graph() -> Graph:
    global _global_default
    if _tls.graphs:
        raise GraphError("reset_default_graph() inside a `with graph.as_default()` block")
    with _global_lock:
        _global_default = Graph()
        return _global_default


def name_scope(name: str):
    return get_default_graph().name_scope(name)


def device(name: Optional[str]):
    return get_default_graph().device(name)


def control_dependencies(deps):
    return get_default_graph().control_dependencies(deps)


def graph_of(values: Iterable[Any]) -> Graph:
    """The graph a new node on these inputs goes into: the default graph when every input
    lives there or in a graph enclosing it (a loop body reading outer tensors), else theirs."""
    values = list(values)
    d = get_default_graph()
    if all(v.graph is d or d.encloses(v.graph) for v in values if isinstance(v, (Tensor, Node))):
        return d
    g = None
    for v in values:
        if isinstance(v, (Tensor, Node)):
            vg = v.graph
            if g is None:
                g = vg
            elif vg is not g:
                raise GraphError(f"'{v.name}' is from another graph than the other inputs")
    return g if g is not None else get_default_graph()
