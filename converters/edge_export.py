"""Export a graph (or the edge part of a partition) to the edge flatbuffer format (fp32).

Variables are frozen and the graph passes run first, so batch norm is folded into the
weights and conv/matmul + bias + activation arrive as one fused op.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from isthmus.core.errors import GraphError
from isthmus.core.graph import Graph, Tensor
from isthmus.edge.writer import ModelWriter

# core op -> edge attrs: a function of the node's attrs (None: no attributes)
_FLAT_PADS = lambda p: [int(p[0][0]), int(p[0][1]), int(p[1][0]), int(p[1][1])]  # noqa: E731
EDGE_OPS = {
    "Conv2D": lambda a: {"strides": list(a["strides"]), "dilations": list(a["dilations"]), "pads": _FLAT_PADS(a["pads"]),
                         "groups": int(a["groups"])},
    "FusedConv2D": lambda a: {"strides": list(a["strides"]), "dilations": list(a["dilations"]),
                              "pads": _FLAT_PADS(a["pads"]), "groups": int(a["groups"]), "activation": a["activation"]},
    "MatMul": lambda a: {"transpose_a": int(a["transpose_a"]), "transpose_b": int(a["transpose_b"])},
    "FusedMatMul": lambda a: {"transpose_a": int(a["transpose_a"]), "transpose_b": int(a["transpose_b"]),
                              "activation": a["activation"]},
    "BiasAdd": lambda a: {"axis": int(a["axis"])},
    "MaxPool": lambda a: _edge_pool(a),
    "AvgPool": lambda a: _edge_pool(a),
    "GlobalAvgPool": lambda a: {"keepdims": int(a["keepdims"])},
    "Reshape": lambda a: {"shape": [int(d) for d in a["shape"]]},
    "Flatten": lambda a: {"axis": int(a["axis"])},
    "Concat": lambda a: {"axis": int(a["axis"])},
    "Softmax": lambda a: {"axis": int(a["axis"])},
    "Pad": lambda a: {"paddings": [int(v) for pair in a["paddings"] for v in pair],
                      "constant_value": float(a["constant_value"])} if a["mode"] == "constant" else None,
    "BatchNorm": lambda a: {"epsilon": float(a["epsilon"]), "axis": int(a["axis"])} if not a["training"] else None,
    "Add": None, "Sub": None, "Mul": None, "Div": None, "Maximum": None, "Minimum": None,
    "Relu": None, "Relu6": None, "Tanh": None, "Sigmoid": None, "Identity": None,
}


def _edge_pool(a):
    """The edge pooling kernels have no dilation: such a pool stays in the cloud."""
    if tuple(a.get("dilations", (1, 1))) != (1, 1):
        return None
    return {"ksize": list(a["ksize"]), "strides": list(a["strides"]), "pads": _FLAT_PADS(a["pads"])}


def edge_supported(op: str) -> bool:
    return op in EDGE_OPS


def to_edge(source: Union[Graph, object], outputs: Sequence[Union[Tensor, str]],
            inputs: Optional[Sequence[Union[Tensor, str]]] = None, batch: int = 1,
            metadata: Optional[Dict[str, str]] = None, delegate: bool = False) -> bytes:
    """The edge model (bytes) computing `outputs` from the graph's placeholders (or `inputs`).

    With `delegate`, an ONNX copy of the same graph is embedded, which the interpreter hands to
    onnxruntime when the device has it (Interpreter(..., delegate="auto")).
    """
    from isthmus.core.executor import prune
    from isthmus.core.passes import freeze, optimize
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
        if n.op not in EDGE_OPS or (EDGE_OPS[n.op] is not None and EDGE_OPS[n.op](n.attrs) is None):
            bad.setdefault(n.op, []).append(n.name)
    if bad:
        raise GraphError("the edge runtime has no kernel for: " + "; ".join(
            f"{op} x{len(v)} ({', '.join(v[:3])})" for op, v in sorted(bad.items()))
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
        attrs = EDGE_OPS[n.op](n.attrs) if EDGE_OPS[n.op] is not None else {}
        w.add_operator(n.op, [index[t] for t in n.inputs], out_ids, attrs)
    for t in outs:
        w.mark_output(index[t])
    if delegate:
        from .onnx_export import to_onnx
        model = to_onnx(graph, outs, inputs=ins or None, optimize=False)
        w.metadata["delegate.onnxruntime.buffer"] = str(w.add_blob(model.SerializeToString()))
    return w.to_bytes()
