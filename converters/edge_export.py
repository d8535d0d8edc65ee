"""Export a graph (or the edge part of a partition) to the edge flatbuffer format (fp32).

Variables are frozen and the graph passes run first, so batch norm is folded into the
weights and conv/matmul + bias + activation arrive as one fused op.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from isthmus.core.errors import GraphError
from isthmus.core.executor import prune
from isthmus.core.graph import Graph, Tensor
from isthmus.core.passes import freeze, optimize
from isthmus.edge import capabilities
from isthmus.edge.writer import ModelWriter

from .onnx_export import to_onnx

def _edge_attrs_or_none(op: str):
    def attrs(a):
        try:
            return capabilities.edge_attrs(op, a, interpreter=True)
        except capabilities.Refused:
            return None
    return attrs


# op -> (graph attrs -> edge attrs, or None for a variant the edge lacks): a view of the edge's own
# table (edge/capabilities.py) for callers that map nodes themselves; edge_refusal says why
EDGE_OPS = {op: _edge_attrs_or_none(op) for op in capabilities.FP32}


def edge_supported(op: str) -> bool:
    return op in capabilities.FP32


def edge_refusal(n) -> Optional[str]:
    """Why the edge cannot run graph node `n` (None: it can); the partitioner asks the same table."""
    return capabilities.refusal(n.op, n.attrs, [(t.dtype, t.shape) for t in n.inputs],
                                [(t.dtype, t.shape) for t in n.outputs])


def to_edge(source: Union[Graph, object], outputs: Sequence[Union[Tensor, str]],
            inputs: Optional[Sequence[Union[Tensor, str]]] = None, batch: int = 1,
            metadata: Optional[Dict[str, str]] = None, delegate: bool = False) -> bytes:
    """The edge model (bytes) computing `outputs` from the graph's placeholders (or `inputs`).

    With `delegate`, an ONNX copy of the same graph is embedded, which the interpreter hands to
    onnxruntime when the device has it (Interpreter(..., delegate="auto")).
    """
    if hasattr(source, "graph") and hasattr(source, "run"):
        outs_t = [source.graph.tensor(o) if isinstance(o, str) else o for o in outputs]
        graph = freeze(source, outs_t)
        outs = [graph.tensor(t.name) for t in outs_t]
        ins = [graph.tensor(i if isinstance(i, str) else i.name) for i in (inputs or [])]
    else:
        graph = source
        outs = [graph.tensor(o) if isinstance(o, str) else o for o in outputs]
        ins = [graph.tensor(i) if isinstance(i, str) else i for i in (inputs or [])]
    rw = optimize(graph, prune([t.node for t in outs], set(ins)), outs, ins)
    graph, outs, ins = rw.graph, list(rw.fetches), list(rw.feeds)
    nodes = prune([t.node for t in outs], set(ins))
    bad: Dict[str, List[str]] = {}
    for n in nodes:
        if n.op in ("Const", "Placeholder") or any(t in ins for t in n.outputs):
            continue
        why = edge_refusal(n)
        if why is not None:
            bad.setdefault(n.op, []).append(f"{n.name}: {why}")
    if bad:
        raise GraphError("the edge runtime has no kernel for: " + "; ".join(
            f"{op} x{len(v)} ({'; '.join(v[:3])})" for op, v in sorted(bad.items()))
            + " (the partitioner places such nodes in the cloud)")
    w = ModelWriter()
    w.metadata.update(metadata or {})
    index: Dict[Tensor, int] = {}

    def shape_of(t: Tensor):
        return [batch if (d is None and k == 0) else (-1 if d is None else d) for k, d in enumerate(t.shape)]
    graph_inputs = ins or [n.outputs[0] for n in nodes if n.op == "Placeholder"]
    for t in graph_inputs:
        index[t] = w.add_input(t.node.name, t.dtype, shape_of(t))
    for n in nodes:
        if any(t in index for t in n.outputs):
            continue
        if n.op == "Const":
            index[n.outputs[0]] = w.add_constant(n.name, np.asarray(n.attrs["value"]))
            continue
        if n.op == "Placeholder":
            continue
        produced = n.outputs[:1] if n.op == "BatchNorm" else n.outputs  # inference: y only
        out_ids = [w.add_tensor(n.name if t.index == 0 else t.name, t.dtype, shape_of(t)) for t in produced]
        for t, i in zip(produced, out_ids):
            index[t] = i
        attrs = capabilities.edge_attrs(n.op, n.attrs, interpreter=True)
        w.add_operator(n.op, [index[t] for t in n.inputs], out_ids, attrs)
    for t in outs:
        w.mark_output(index[t])
    if delegate:
        model = to_onnx(graph, outs, inputs=ins or None, optimize=False)
        w.metadata["delegate.onnxruntime.buffer"] = str(w.add_blob(model.SerializeToString()))
    return w.to_bytes()
