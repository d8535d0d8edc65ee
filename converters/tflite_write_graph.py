"""A whole fp32 graph as .tflite, including ops isthmus's edge interpreter lacks.

    data = graph_to_tflite(session, [y])      # Transpose, Gather, StridedSlice, Resize, ReduceMean, ...

to_edge (converters/edge_export.py) refuses ops the edge runtime cannot run; a phone's LiteRT runs
more. This path writes the frozen, optimized graph into the edge model's structure (a
converters-only intermediate: it is never handed to isthmus's interpreter) with the edge ops'
attributes plus those of EXTRA_OPS, and translates that with tflite_write.edge_to_tflite.
Quantized (int8) export stays with converters/quantize.py's edge ops (to_tflite(..., int8=True)).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from isthmus.core.executor import prune
from isthmus.core.graph import Graph, Tensor
from isthmus.core.passes import freeze, optimize
from isthmus.edge import capabilities
from isthmus.edge.loader import loads
from isthmus.edge.writer import ModelWriter

from .tflite_write import edge_to_tflite
from .tflite_write_layout import TFLiteExportError


def _strided(n) -> Optional[dict]:
    """begin/end/strides over every input dimension (then a reshape to the output's shape); None
    for a spec TFLite's STRIDED_SLICE cannot take."""
    shape = n.inputs[0].shape
    begin, end, strides, end_mask, dim = [], [], [], 0, 0
    for kind, a, b, c in n.attrs["spec"]:
        if kind == "new":
            continue
        d = shape[dim]
        if d is None:
            return None
        if kind == "index":
            i = int(a) % d
            begin.append(i), end.append(i + 1), strides.append(1)
        else:
            start, stop, step = slice(a, b, c).indices(d)
            begin.append(start), strides.append(step)
            if step < 0 and stop < 0:      # runs to the first element: an end the mask stands for
                end_mask |= 1 << dim
                stop = 0
            end.append(stop)
        dim += 1
    for d in shape[dim:]:
        begin.append(0), end.append(d if d is not None else 0), strides.append(1)
        end_mask |= (1 << (len(end) - 1)) if d is None else 0
    return {"begin": begin, "end": end, "strides": strides, "end_mask": end_mask}


def _resize(n) -> Optional[dict]:
    a = n.attrs
    if len(n.inputs) > 1 or len(n.inputs[0].shape) != 4 or a["mode"] not in ("nearest", "linear") \
            or n.inputs[0].shape[:2] != n.outputs[0].shape[:2]:
        return None
    cm, nm = a["coordinate_mode"], a["nearest_mode"]
    if a["mode"] == "linear":
        if cm not in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
            return None
        return {"mode": "linear", "align_corners": int(cm == "align_corners"),
                "half_pixel_centers": int(cm in ("half_pixel", "pytorch_half_pixel"))}
    h, w = n.inputs[0].shape[2:]
    oh, ow = n.outputs[0].shape[2:]
    integral = oh % h == 0 and ow % w == 0   # no rounding ties: every round mode picks the same pixel
    if cm == "asymmetric" and nm == "floor":
        return {"mode": "nearest", "align_corners": 0, "half_pixel_centers": 0}
    if cm == "half_pixel" and (nm == "round_prefer_ceil" or integral):
        return {"mode": "nearest", "align_corners": 0, "half_pixel_centers": 1}
    return None


def _axes(n) -> List[int]:
    rank = len(n.inputs[0].shape)
    ax = n.attrs.get("axis")
    return list(range(rank)) if ax is None else [int(a) % rank for a in ax]


# core op -> (intermediate op name, attrs); None: a variant TFLite cannot take here
EXTRA_OPS = {
    "Transpose": lambda n: ("Transpose", {"perm": list(n.attrs["perm"]) if n.attrs["perm"] is not None
                                          else list(range(len(n.inputs[0].shape)))[::-1]}),
    "Gather": lambda n: ("Gather", {"axis": int(n.attrs["axis"]) % len(n.inputs[0].shape)}),
    "StridedSlice": lambda n: (lambda s: None if s is None else ("StridedSlice", s))(_strided(n)),
    "Resize": lambda n: (lambda s: None if s is None else ("Resize", s))(_resize(n)),
    "ReduceMean": lambda n: ("ReduceMean", {"axes": _axes(n), "keepdims": int(n.attrs["keepdims"])}),
    "LSTMSequence": lambda n: None if n.attrs["with_lens"] or len(n.inputs) != 4
    else ("LSTMSequence", {"reverse": int(bool(n.attrs["reverse"]))}),
    "Squeeze": lambda n: ("Reshape", {"shape": [-1 if d is None else d for d in n.outputs[0].shape]}),
    "ExpandAxes": lambda n: ("Reshape", {"shape": [-1 if d is None else d for d in n.outputs[0].shape]}),
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
