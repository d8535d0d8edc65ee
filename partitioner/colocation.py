"""Which nodes must share a device: the one rule that the partitioner's Problem and the cluster
placement (partitioner/cluster_placement.py) both apply.

A variable and every op that updates it (through a reference input) share a device, also when
the update sits inside a cond or while body (the control-flow node then stays with the variable,
since its body runs where it does), and so do the producer and the readers of an opaque (variant)
value, which cannot cross a wire.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Sequence

from ..core import dtypes as _dt
from ..core.function import Function
from ..core.graph import Graph, Node


def body_graphs(node: Node) -> Iterable[Graph]:
    """The graphs of a node's Function attributes (cond branches, while cond and body), nested ones too."""
    stack = list(node.attrs.values())
    while stack:
        v = stack.pop()
        if isinstance(v, Function):
            yield v.graph
            for n in v.graph.nodes:
                stack.extend(n.attrs.values())
        elif isinstance(v, (tuple, list)):
            stack.extend(v)


def updated_variables(node: Node) -> List[Node]:
    """The nodes of `node`'s own graph that it names through a reference input, directly or from
    inside its bodies (the variables it updates)."""
    out = [node.inputs[k].node for k in node.opdef.ref_inputs]
    for body in body_graphs(node):
        for b in body.nodes:
            out.extend(v for v in (b.inputs[k].node for k in b.opdef.ref_inputs) if v.graph is node.graph)
    return out


def colocation_groups(nodes: Sequence[Node]) -> Dict[Node, List[Node]]:
    """The groups of `nodes` that must share a device, by group root (the group's first node in graph
    order), members in the order given. Only links between the given nodes count."""
    nodes = list(nodes)
    parent = {n: n for n in nodes}

    def find(a: Node) -> Node:
        while parent[a] is not a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def union(a: Node, b: Node) -> None:
        if a in parent and b in parent:
            ra, rb = find(a), find(b)
            if ra is not rb:
                if ra.index < rb.index:
                    parent[rb] = ra
                else:
                    parent[ra] = rb

    for n in nodes:
        for v in updated_variables(n):
            union(n, v)
        for t in n.inputs:
            if t.dtype == _dt.variant:
                union(n, t.node)
    members: Dict[Node, List[Node]] = {}
    for n in nodes:
        members.setdefault(find(n), []).append(n)
    return members


__all__ = ["colocation_groups", "updated_variables", "body_graphs"]
