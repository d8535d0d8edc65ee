"""What the executor really runs: the graph after the core passes (core/passes).

A Session rewrites each plan's subgraph before running it: constants folded, common
subexpressions merged, inference batch norm folded into the preceding product's weights,
and product + bias + activation fused into one kernel. Placement assigns the nodes of the
original graph, so the cost model prices each of them by the role it has in what runs:

- RUNS: it survives the passes (perhaps with folded weights, perhaps as another op: a
  folded BatchNorm left alone is a BiasAdd), priced as the node that runs;
- FREE: folded into a constant, merged into an equal node, or dead: costs nothing;
- ABSORBED: its work happens inside a fused kernel (a BiasAdd, an activation, a folded
  BatchNorm after a product): priced as the elementwise step it is there (a folded
  BatchNorm as adding a bias).

The product at the head of a fused group keeps its own price, so a fused kernel costs the
sum of its steps: measured here, a fused kernel takes the sum of its parts' kernel times
less about 1 us (it still makes one numpy call per step, in place).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Union

from ..core.graph import Node, Tensor
from ..core.passes import optimize

RUNS, FREE, ABSORBED = "runs", "free", "absorbed"
_FUSABLE_TAIL = frozenset({"BiasAdd", "BatchNorm", "Relu", "Relu6", "Tanh", "Sigmoid"})
_FUSED = frozenset({"FusedMatMul", "FusedConv2D"})


class Roles:
    """Per original node: its role, and (for RUNS) the node of the rewritten graph that runs."""

    def __init__(self, role: Dict[Node, str], runs_as: Dict[Node, Node], stats: Dict[str, int]):
        self.role = role
        self.runs_as = runs_as
        self.stats = stats

    def of(self, node: Node) -> str:
        return self.role.get(node, RUNS)


def as_run(nodes: Sequence[Node], outputs: Sequence[Union[Tensor, Node]]) -> Roles:
    """Run the Session's passes over `nodes` (a pruned subgraph in graph order, constants
    included) fetching `outputs`, and say what became of each node."""
    if not nodes:
        return Roles({}, {}, {})
    graph = nodes[0].graph
    feeds = [n.outputs[0] for n in nodes if n.op == "Placeholder" and n.outputs]
    rw = optimize(graph, list(nodes), list(outputs), feeds)
    after = {m.name: m for m in rw.graph.nodes}
    role: Dict[Node, str] = {}
    runs_as: Dict[Node, Node] = {}
    for n in nodes:
        m = after.get(n.name)
        if m is None or m.op == "Const" and n.op != "Const":
            role[n] = FREE
        else:
            role[n], runs_as[n] = RUNS, m
    by_name = {n.name: n for n in nodes}
    for m in rw.graph.nodes:
        if m.op not in _FUSED or m.name not in by_name:
            continue
        n: Optional[Node] = by_name[m.name]
        first = True
        while n is not None and n.op in _FUSABLE_TAIL and (first or n.name not in after):
            role[n] = ABSORBED
            runs_as.pop(n, None)
            first = False
            n = n.inputs[0].node if n.inputs else None
        if n is not None and n.op in ("MatMul", "Conv2D"):
            role[n] = RUNS
            runs_as[n] = n  # priced as the product it was (its weights may have been rescaled: same cost)
    return Roles(role, runs_as, dict(rw.stats))


def unchanged(nodes: Sequence[Node]) -> Roles:
    """Roles when no pass runs (Session(optimize=False)): every node runs as itself."""
    return Roles({n: RUNS for n in nodes}, {n: n for n in nodes}, {})


__all__: List[str] = ["Roles", "as_run", "unchanged", "RUNS", "FREE", "ABSORBED"]
