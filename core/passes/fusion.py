"""Fusion of product + bias + activation, and folding inference batch norm into weights."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import numpy as np

from ..executor import prune
from ..graph import Graph, Node, Tensor
from ..registry import registered
from .simplify import Rewrite

_ACT = {"Relu": "relu", "Relu6": "relu6", "Tanh": "tanh", "Sigmoid": "sigmoid"}
_RESIDUAL_ACT = ("relu", "relu6")  # the activations FusedConv2DAdd takes


def _consumers(g: Graph, fetched: set) -> Dict[Tensor, int]:
    count: Dict[Tensor, int] = {}
    for n in g.nodes:
        for t in n.inputs:
            count[t] = count.get(t, 0) + 1
    for t in fetched:
        count[t] = count.get(t, 0) + 1_000  # a fetched tensor must survive
    return count


def _users(rw: Rewrite) -> Dict[Tensor, List[Node]]:
    """Each tensor of rw.graph -> the nodes reading it (once per input slot), in graph order."""
    users: Dict[Tensor, List[Node]] = {}
    for n in rw.graph.nodes:
        for t in n.inputs:
            users.setdefault(t, []).append(n)
    return users


def _pinned(rw: Rewrite) -> set:
    """Nodes a rewrite must not fold away: control inputs of other nodes and nodes fetched as targets
    (a folded node has no counterpart, so an edge or fetch naming it would be lost)."""
    pinned = {f for f in rw.fetches if isinstance(f, Node)}
    for n in rw.graph.nodes:
        pinned.update(n.control_inputs)
    return pinned


def _rebuild(rw: Rewrite, rewrite: Callable[[Node, "Builder"], Optional[List[Tensor]]], stat: str) -> Rewrite:
    """Copy rw.graph node by node; `rewrite(node, builder)` may return replacement outputs."""
    b = Builder(rw)
    for n in rw.graph.nodes:
        repl = rewrite(n, b)
        if repl is not None:
            for t, r in zip(n.outputs, repl):
                if r is not None:
                    b.map[t] = r
            if repl and repl[0] is not None:
                b.node_map[n] = repl[0].node  # control edges on n now wait for its replacement
            if repl or stat == "dead":
                b.stats[stat] = b.stats.get(stat, 0) + 1
            continue
        b.copy(n)
    fetches = [b.map[f] if isinstance(f, Tensor) else b.node_map[f] for f in rw.fetches]
    return Rewrite(b.g, fetches, [b.map[t] for t in rw.feeds], b.stats)


class Builder:
    def __init__(self, rw: Rewrite):
        self.src = rw.graph
        self.g = Graph(seed=rw.graph.seed)
        self.map: Dict[Tensor, Tensor] = {}
        self.node_map: Dict[Node, Node] = {}
        self.stats = dict(rw.stats)

    def copy(self, n: Node) -> Node:
        new = self.g.add_node(n.op, [self.map[t] for t in n.inputs], dict(n.attrs), name=n.name, device=n.device,
                              control_inputs=[self.node_map[c] for c in n.control_inputs if c in self.node_map])
        for t, u in zip(n.outputs, new.outputs):
            self.map[t] = u
        self.node_map[n] = new
        return new


def fuse_bias_activation(rw: Rewrite, residual: bool = False) -> Rewrite:
    """MatMul -> BiasAdd(-> activation) and Conv2D -> BiasAdd(-> activation) become one node,
    emitted where the last node of the group stood (all its inputs exist by then). Conv2D ->
    BiasAdd -> Add(r) (-> Relu/Relu6), r a residual of the output's shape, becomes FusedConv2DAdd
    when `residual` (the executor's op only: the edge and the exporters know FusedConv2D and Add)."""
    g = rw.graph
    users = _users(rw)
    uses = _consumers(g, {f for f in rw.fetches if isinstance(f, Tensor)})
    fused_conv = "FusedConv2D" in registered()
    residual = residual and "FusedConv2DAdd" in registered()
    groups: Dict[Node, tuple] = {}  # last node of a group -> (product, bias_add, activation name, residual Add)
    skip, claimed = set(), set()
    pinned = _pinned(rw)
    for n in g.nodes:
        if n.op not in ("MatMul", "Conv2D") or n.control_inputs or (n.op == "Conv2D" and not fused_conv):
            continue
        y = n.outputs[0]
        if uses.get(y, 0) != 1:
            continue
        ba = users[y][0]
        if ba.op != "BiasAdd" or ba.inputs[0] is not y or ba.control_inputs:
            continue
        axis = ba.attrs["axis"]
        if n.op == "MatMul" and axis not in (-1, len(y.shape) - 1):
            continue
        if n.op == "Conv2D" and axis != 1:
            continue
        z = ba.outputs[0]
        add = _residual_add(z, users, uses, claimed) if n.op == "Conv2D" and residual else None
        last, act = add or ba, "none"
        if add is not None:
            claimed.add(add)
            z = add.outputs[0]
        nxt = users.get(z, [])
        if uses.get(z, 0) == 1 and nxt[0].op in _ACT and not nxt[0].control_inputs \
                and (add is None or _ACT[nxt[0].op] in _RESIDUAL_ACT):
            last, act = nxt[0], _ACT[nxt[0].op]
        folded = [m for m in (n, ba, add) if m is not None and m is not last]
        if any(m in pinned for m in folded):
            continue  # a control edge or target fetch names a node the group would fold away
        groups[last] = (n, ba, act, add)
        skip.update(folded)

    def rewrite(n: Node, b: Builder):
        if n in skip:
            return []  # folded into the group's last node
        grp = groups.get(n)
        if grp is None:
            return None
        prod, ba, act, add = grp
        attrs = dict(prod.attrs)
        attrs["activation"] = act
        op = "FusedMatMul" if prod.op == "MatMul" else "FusedConv2D"
        ins = [b.map[prod.inputs[0]], b.map[prod.inputs[1]], b.map[ba.inputs[1]]]
        if add is not None:
            op = "FusedConv2DAdd"
            ins.append(b.map[_other_operand(add, ba.outputs[0])])
        new = b.g.add_node(op, ins, attrs, name=n.name, device=prod.device)
        return [new.outputs[0]]

    return _rebuild(rw, rewrite, "fused")


def _residual_add(z: Tensor, users, uses, claimed) -> Optional[Node]:
    """The Add that is z's only consumer when its other operand r can be a residual addend: the same
    dtype and static shape as z (no broadcasting) and not z itself (None otherwise)."""
    if uses.get(z, 0) != 1:
        return None
    add = users[z][0]
    if add.op != "Add" or add.control_inputs or add in claimed:
        return None
    r = _other_operand(add, z)
    if r is z or r.dtype != z.dtype or tuple(r.shape) != tuple(z.shape) or tuple(add.outputs[0].shape) != tuple(z.shape):
        return None
    return add


def _other_operand(add: Node, z: Tensor) -> Tensor:
    a, b = add.inputs
    return b if a is z else a


def prune_dead(rw: Rewrite) -> Rewrite:
    """Drop nodes that no fetch needs (what folding and fusion left behind)."""
    fed = set(rw.feeds)
    keep = set(prune([f.node if isinstance(f, Tensor) else f for f in rw.fetches], fed))
    keep.update(t.node for t in rw.feeds)
    for n in list(keep):
        keep.update(n.inputs[i].node for i in n.opdef.ref_inputs)
    if len(keep) == len(rw.graph.nodes):
        return rw
    return _rebuild(rw, lambda n, b: None if n in keep else [], "dead")


def fold_batch_norm(rw: Rewrite) -> Rewrite:
    """Inference BatchNorm after a Conv2D (axis 1) or MatMul (last axis) with constant weights
    and constant statistics becomes the product with scaled weights plus a BiasAdd."""
    g = rw.graph
    uses = _consumers(g, {f for f in rw.fetches if isinstance(f, Tensor)})
    folds: Dict[Node, tuple] = {}  # BatchNorm node -> (product node, new weights, new bias)
    pinned = _pinned(rw)
    for n in g.nodes:
        if n.op != "BatchNorm" or n.attrs["training"] or n.control_inputs:
            continue
        x = n.inputs[0]
        prod = x.node
        if prod.op not in ("MatMul", "Conv2D") or uses.get(x, 0) != 1 or prod.control_inputs or prod in pinned:
            continue
        if any(uses.get(t, 0) for t in n.outputs[1:]):
            continue
        params = [t.node.attrs["value"] if t.node.op == "Const" else None for t in n.inputs[1:]]
        w = prod.inputs[1].node.attrs["value"] if prod.inputs[1].node.op == "Const" else None
        if w is None or any(p is None for p in params):
            continue
        scale, offset, mean, var = (p.astype(np.float64) for p in params)
        k = scale / np.sqrt(var + n.attrs["epsilon"])
        rank = len(x.shape)
        axis = n.attrs["axis"] % rank
        if prod.op == "Conv2D" and axis == 1:
            w2 = w.astype(np.float64) * k[:, None, None, None]
        elif prod.op == "MatMul" and axis == rank - 1 and not prod.attrs["transpose_b"]:
            w2 = w.astype(np.float64) * k[None, :]
        else:
            continue
        folds[n] = (prod, w2.astype(w.dtype), (offset - mean * k).astype(w.dtype), axis)

    skip = {f[0] for f in folds.values()}

    def rewrite(n: Node, b: Builder):
        if n in skip:
            return []
        f = folds.get(n)
        if f is None:
            return None
        prod, w2, bias, axis = f
        wt = b.g.add_node("Const", (), {"value": _frozen(w2)}, name=prod.name + "/folded_w").outputs[0]
        bt = b.g.add_node("Const", (), {"value": _frozen(bias)}, name=n.name + "/folded_b").outputs[0]
        p = b.g.add_node(prod.op, [b.map[prod.inputs[0]], wt], dict(prod.attrs), name=prod.name, device=prod.device)
        y = b.g.add_node("BiasAdd", [p.outputs[0], bt], {"axis": 1 if prod.op == "Conv2D" else -1},
                         name=n.name, device=n.device)
        return [y.outputs[0]] + [None] * (len(n.outputs) - 1)

    if not folds:
        return rw
    return _rebuild(rw, rewrite, "bn_folded")


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, order="C")
    a.flags.writeable = False
    return a
