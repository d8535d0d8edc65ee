"""One forward copy of a subgraph that folds constants, removes common subexpressions and
simplifies arithmetic (x*1, x+0, chains of constant adds/muls, transpose of transpose,
identities) as it goes."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from ..executor import KernelContext, SessionState
from ..graph import Graph, Node, Tensor
from ..shapes import broadcast, fully_defined, num_elements

FOLD_MAX_ELEMENTS = 1 << 22  # never materialise a folded constant larger than this


class Rewrite:
    """A rewritten graph plus where each original fetch and feed went."""

    def __init__(self, graph: Graph, fetches: List, feeds: List[Tensor], stats: Dict[str, int]):
        self.graph, self.fetches, self.feeds, self.stats = graph, fetches, feeds, stats

    def __repr__(self) -> str:
        return f"<Rewrite {len(self.graph.nodes)} nodes {self.stats}>"


def _const_value(t: Tensor) -> Optional[np.ndarray]:
    return t.node.attrs["value"] if t.node.op == "Const" else None


def _attr_key(attrs: dict):
    items = []
    for k, v in sorted(attrs.items()):
        if isinstance(v, np.ndarray):
            v = (v.dtype.str, v.shape, v.tobytes()) if v.size <= 64 else ("array", id(v))
        elif isinstance(v, (list, dict, set)) or not _hashable(v):
            v = ("object", id(v))
        items.append((k, v))
    return tuple(items)


def _hashable(v) -> bool:
    try:
        hash(v)
        return True
    except TypeError:
        return False


class _Copier:
    def __init__(self, src: Graph, fold: bool):
        self.src = src
        self.g = Graph(seed=src.seed)
        self.map: Dict[Tensor, Tensor] = {}
        self.node_map: Dict[Node, Node] = {}
        self.replaced: set = set()  # nodes whose node_map entry is what replaced them (simplified, folded)
        self.cse: Dict[tuple, Node] = {}
        self.fold = fold
        self.stats = {"folded": 0, "cse": 0, "simplified": 0}
        self._ctx = KernelContext(np, SessionState())

    def add(self, op: str, inputs, attrs, name: str, device, controls=()) -> Node:
        return self.g.add_node(op, inputs, dict(attrs), name=name, device=device, control_inputs=controls)

    def const(self, value: np.ndarray, name: str, device) -> Tensor:
        v = np.array(value, order="C")
        v.flags.writeable = False
        key = ("Const", v.dtype.str, v.shape, v.tobytes()) if v.size <= 64 else None
        if key is not None and key in self.cse:
            return self.cse[key].outputs[0]
        n = self.add("Const", (), {"value": v}, name, device)
        if key is not None:
            self.cse[key] = n
        return n.outputs[0]

    def copy(self, n: Node, protected: set) -> None:
        ins = [self.map[t] if t in self.map else self._variable(t) for t in n.inputs]
        ctrls = [self.node_map[c] for c in n.control_inputs if c in self.node_map]
        d = n.opdef
        pure = not d.stateful and not ctrls and n.op not in ("Placeholder",)
        if pure and n.op == "Const":
            self.map[n.outputs[0]] = self.const(n.attrs["value"], n.name, n.device)
            self.node_map[n] = self.map[n.outputs[0]].node
            self.replaced.add(n)
            return
        if pure and self.fold:
            out = self._simplify(n, ins)
            if out is not None:
                self.map[n.outputs[0]] = out
                self.node_map[n] = out.node  # control edges on n wait for what replaces it
                self.replaced.add(n)
                self.stats["simplified"] += 1
                return
        if pure:
            key = (n.op, tuple(id(t) for t in ins), _attr_key(n.attrs), n.device)
            hit = self.cse.get(key)
            if hit is not None:
                for t, u in zip(n.outputs, hit.outputs):
                    self.map[t] = u
                self.node_map[n] = hit
                self.stats["cse"] += 1
                return
        new = self.add(n.op, ins, n.attrs, n.name, n.device, ctrls)
        if pure and self.fold and ins and all(t.node.op == "Const" for t in ins) and len(new.outputs) == 1:
            folded = self._evaluate(new)
            if folded is not None:
                self.map[n.outputs[0]] = self.const(folded, n.name + "/folded", n.device)
                self.node_map[n] = self.map[n.outputs[0]].node
                self.replaced.add(n)
                self.stats["folded"] += 1
                return
        if pure:
            self.cse[(n.op, tuple(id(t) for t in ins), _attr_key(n.attrs), n.device)] = new
        for t, u in zip(n.outputs, new.outputs):
            self.map[t] = u
        self.node_map[n] = new

    def _variable(self, t: Tensor) -> Tensor:
        """A variable named by a ref input (prune does not walk refs: nothing reads it)."""
        n = t.node
        if n.op != "Variable":
            raise KeyError(f"internal: input '{t.name}' of a copied node was not copied")
        new = self.add("Variable", (), n.attrs, n.name, n.device)
        self.map[t] = new.outputs[0]
        self.node_map[n] = new
        return new.outputs[0]

    def _evaluate(self, node: Node):
        out = node.outputs[0]
        if not fully_defined(out.shape) or num_elements(out.shape) > FOLD_MAX_ELEMENTS:
            return None
        try:
            kernel = node.opdef.kernel(node, self._ctx)
            value = np.asarray(kernel(*[t.node.attrs["value"] for t in node.inputs]))
        except Exception:
            return None  # leave it to run time, where a failure names the node
        if value.dtype != out.dtype or value.shape != out.shape:
            return None
        return value

    def _simplify(self, n: Node, ins: List[Tensor]) -> Optional[Tensor]:
        op = n.op
        out = n.outputs[0] if len(n.outputs) == 1 else None
        if op in ("Identity",) and ins:
            return ins[0]
        if out is None:
            return None
        if op in ("Add", "Sub", "Mul", "Div"):
            x, c = ins
            cv = _const_value(c)
            if cv is None:
                return None
            same = x.dtype == out.dtype and x.shape == out.shape
            if same and op in ("Add", "Sub") and not np.any(cv):
                return x
            if same and op in ("Mul", "Div") and np.all(cv == 1):
                return x
            # (x op1 c1) op2 c2 -> x op (c1 op' c2), for Add/Sub and Mul chains
            inner = x.node
            if inner.op in ("Add", "Sub", "Mul") and len(inner.inputs) == 2 and not inner.control_inputs:
                x0, c1 = inner.inputs
                c1v = _const_value(c1)
                if c1v is None or x0.dtype != out.dtype:
                    return None
                if op in ("Add", "Sub") and inner.op in ("Add", "Sub"):
                    s1 = c1v if inner.op == "Add" else -c1v
                    s2 = cv if op == "Add" else -cv
                    combined = (s1 + s2).astype(out.dtype)
                    new_op = "Add"
                elif op == "Mul" and inner.op == "Mul":
                    combined = (c1v * cv).astype(out.dtype)
                    new_op = "Mul"
                else:
                    return None
                if broadcast(x0.shape, combined.shape) != out.shape:
                    return None
                ct = self.const(combined, n.name + "/c", n.device)
                return self.add(new_op, (x0, ct), {}, n.name, n.device).outputs[0]
            return None
        if op == "Transpose" and ins[0].node.op == "Transpose":
            p1 = ins[0].node.attrs.get("perm")
            p2 = n.attrs.get("perm")
            if p1 is None or p2 is None:
                return None
            perm = tuple(p1[i] for i in p2)
            x0 = ins[0].node.inputs[0]
            if perm == tuple(range(len(perm))):
                return x0
            return self.add("Transpose", (x0,), {**n.attrs, "perm": perm}, n.name, n.device).outputs[0]
        if op == "Reshape" and ins[0].shape == out.shape and fully_defined(out.shape):
            return ins[0]
        return None


def copy_simplified(graph: Graph, nodes: Sequence[Node], fetches: Sequence, feeds: Sequence[Tensor],
                    fold: bool = True) -> Rewrite:
    c = _Copier(graph, fold)
    fed = set(feeds)
    protected = set(feeds) | {f for f in fetches if isinstance(f, Tensor)}
    new_feeds: List[Tensor] = []
    for t in feeds:  # fed tensors become placeholders: their producers never run
        ph = c.add("Placeholder", (), {"dtype": t.dtype, "shape": t.shape}, t.node.name, t.node.device)
        c.map[t] = ph.outputs[0]
        new_feeds.append(ph.outputs[0])
    for n in nodes:
        if n.outputs and all(t in fed for t in n.outputs):
            continue
        if any(t in fed for t in n.outputs):  # partly fed: keep the node, route the fed outputs
            saved = {t: c.map[t] for t in n.outputs if t in fed}
            c.copy(n, protected)
            c.map.update(saved)
            continue
        c.copy(n, protected)
    new_fetches = []
    for f in fetches:
        if isinstance(f, Tensor):
            new_fetches.append(c.map[f])
        else:
            same = None if f in c.replaced else c.node_map.get(f)  # a replaced target runs as a NoOp on its edges
            new_fetches.append(same or c.add("NoOp", (), {}, f.name, f.device,
                                                           [c.node_map[x] for x in f.control_inputs if x in c.node_map]))
    return Rewrite(c.g, new_fetches, new_feeds, c.stats)
