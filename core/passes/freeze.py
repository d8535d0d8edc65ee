"""Freezing: an inference copy of a graph with every variable replaced by its current value.

Constant weights let the passes fold batch norm and constants through, and give the
exporters (ONNX, edge flatbuffer) a self-contained graph.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

from ..executor import prune
from ..graph import Graph, Tensor


def freeze(session, outputs: Optional[Sequence[Tensor]] = None) -> Graph:
    """A new graph holding what `outputs` need (all of the graph by default), variables as
    Consts. Nodes that update state are left out, and so is everything that depends on them.
    Node names are kept, so `frozen.tensor("logits:0")` finds the same output."""
    src: Graph = session.graph
    if outputs is not None:
        keep = set(prune([t.node for t in outputs], set()))
        nodes = [n for n in src.nodes if n in keep]
    else:
        nodes = list(src.nodes)
    g = Graph(seed=src.seed)
    mapping: Dict[Tensor, Tensor] = {}
    dropped = set()
    for n in nodes:
        if n.opdef.ref_inputs or any(t.node in dropped for t in n.inputs) or any(c in dropped for c in n.control_inputs):
            dropped.add(n)
            continue
        if n.op == "Variable":
            value = np.array(session.variable_value(n), order="C")
            value.flags.writeable = False
            new = g.add_node("Const", (), {"value": value}, name=n.name, exact_name=True)
        else:
            ctrls = [mapping[c.outputs[0]].node if c.outputs else None for c in n.control_inputs]
            new = g.add_node(n.op, [mapping[t] for t in n.inputs], dict(n.attrs), name=n.name, device=n.device,
                             exact_name=True, control_inputs=[c for c in ctrls if c is not None])
        for t, u in zip(n.outputs, new.outputs):
            mapping[t] = u
    return g.verify()
