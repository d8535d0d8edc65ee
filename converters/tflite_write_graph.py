"""A whole fp32 graph as .tflite, including ops isthmus's edge interpreter lacks.

    data = graph_to_tflite(session, [y])      # a Transpose without perm, besides every edge op

to_edge (converters/edge_export.py) refuses ops the edge runtime cannot run; a phone's LiteRT runs
a few more. This path writes the frozen, optimized graph into the edge model's structure (a
converters-only intermediate: it is never handed to isthmus's interpreter) with the edge ops'
attributes (edge/capabilities.py) plus those of EXTRA_OPS, and translates that with
tflite_write.edge_to_tflite.
Quantized (int8) export stays with converters/quantize.py's edge ops (to_tflite(..., int8=True)).
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Union

import numpy as np

from isthmus.core.executor import prune
from isthmus.core.graph import Graph, Tensor
from isthmus.core.passes import freeze, optimize
from isthmus.edge import capabilities
from isthmus.edge.loader import loads
from isthmus.edge.writer import ModelWriter

from .tflite_write import edge_to_tflite
from .tflite_write_layout import TFLiteExportError


# core op -> (intermediate op name, attrs); None: a variant TFLite cannot take here
EXTRA_OPS = {
    "Transpose": lambda n: ("Transpose", {"perm": list(n.attrs["perm"]) if n.attrs["perm"] is not None
                                          else list(range(len(n.inputs[0].shape)))[::-1]}),
}


def _op_for(n):
    """(intermediate op, attrs): the edge capability table's attributes for the ops the edge runs
    (edge/capabilities.py, the one reader of node attributes), EXTRA_OPS' for the rest."""
    if n.op in capabilities.FP32:
        try:
            return n.op, capabilities.edge_attrs(n.op, n.attrs)
        except (capabilities.Refused, KeyError, TypeError, ValueError):   # a variant the table does not read
            pass
    return EXTRA_OPS[n.op](n) if n.op in EXTRA_OPS else None


def graph_to_tflite(source, outputs: Sequence[Union[Tensor, str]], inputs: Optional[Sequence] = None,
                    batch: int = 1, **options) -> bytes:
    """The fp32 .tflite of a whole graph (a Session, whose variables are frozen, or a Graph);
    `options`: edge_to_tflite's (layouts, wire names)."""
    if hasattr(source, "graph") and hasattr(source, "run"):
        outs0 = [source.graph.tensor(o) if isinstance(o, str) else o for o in outputs]
        graph: Graph = freeze(source, outs0)
        outs = [graph.tensor(t.name) for t in outs0]
    else:
        graph = source
        outs = [graph.tensor(o) if isinstance(o, str) else o for o in outputs]
    ins = [graph.tensor(i if isinstance(i, str) else i.name) for i in (inputs or [])]
    rw = optimize(graph, prune([t.node for t in outs], set(ins)), outs, ins)
    graph, outs, ins = rw.graph, list(rw.fetches), list(rw.feeds)
    nodes = prune([t.node for t in outs], set(ins))
    w = ModelWriter(producer="isthmus converters/tflite_write_graph.py")
    index: Dict[Tensor, int] = {}

    def shape_of(t: Tensor):
        return [batch if (d is None and k == 0) else (-1 if d is None else d) for k, d in enumerate(t.shape)]
    for t in ins or [n.outputs[0] for n in nodes if n.op == "Placeholder"]:
        index[t] = w.add_input(t.node.name, t.dtype, shape_of(t))
    bad = []
    for n in nodes:
        if any(t in index for t in n.outputs) or n.op == "Placeholder":
            continue
        if n.op == "Const":
            index[n.outputs[0]] = w.add_constant(n.name, np.asarray(n.attrs["value"]))
            continue
        spec = _op_for(n)
        if spec is None:
            bad.append(f"'{n.name}' ({n.op})")
            continue
        produced = n.outputs[:1] if n.op == "BatchNorm" else n.outputs
        ids = [w.add_tensor(n.name if t.index == 0 else t.name, t.dtype, shape_of(t)) for t in produced]
        index.update(zip(produced, ids))
        w.add_operator(spec[0], [index[t] for t in n.inputs], ids, spec[1])
    if bad:
        raise TFLiteExportError("TFLite export: no TFLite form for " + ", ".join(bad[:8])
                                + (f" and {len(bad) - 8} more" if len(bad) > 8 else ""))
    for t in outs:
        w.mark_output(index[t])
    return edge_to_tflite(loads(w.to_bytes()), batch=batch, **options)


__all__ = ["graph_to_tflite", "EXTRA_OPS"]
