"""ONNX export of control flow: While as Loop, If as If, their bodies inlined as subgraphs."""
from __future__ import annotations

from typing import List, Sequence

import numpy as np

from isthmus.core.executor import prune
from isthmus.core.graph import Tensor

from .onnx_export import _HANDLERS, ExportError, _Ctx, _onnx_dtype, handler


def _inline(c: _Ctx, fn, input_names: Sequence[str], prefix: str) -> List[str]:
    """Emit the nodes of Function `fn` into `c` with its inputs bound to `input_names`; returns the
    names of its outputs. Names are prefixed so that every value stays unique across scopes."""
    for t, nm in zip(fn.inputs, input_names):
        c.names[t] = nm
    for n in prune([t.node for t in fn.outputs], set(fn.inputs)):
        if any(t in c.names for t in n.outputs):
            continue
        if n.op == "Const":
            nm = f"{prefix}/{n.name}"
            c.names[n.outputs[0]] = nm
            c.inits.append(c.nh.from_array(np.asarray(n.attrs["value"]), nm))
            continue
        if n.op == "Placeholder":
            raise ExportError(f"body placeholder '{n.name}' has no binding")
        if n.op not in _HANDLERS:
            raise ExportError(f"cannot export to ONNX: {n.op} (node '{n.name}' inside a loop or branch body)")
        for t in n.outputs:
            c.names[t] = f"{prefix}/{n.name}" if t.index == 0 else f"{prefix}/{n.name}:{t.index}"
        _HANDLERS[n.op](c, n, [c.names[t] for t in n.inputs], [c.names[t] for t in n.outputs])
    return [c.names[t] for t in fn.outputs]


def _value_info(c: _Ctx, t: Tensor, name: str):
    return c.h.make_tensor_value_info(name, _onnx_dtype(t.dtype), None if any(d is None for d in t.shape)
                                      else list(t.shape))


@handler("While")
def _while(c, n, ins, outs):
    nv = n.attrs["n_vars"]
    body, cond = n.attrs["body"], n.attrs["cond"]
    vars_in, caps = ins[:nv], ins[nv:]
    cond0 = _inline(c, cond, vars_in + caps, f"{n.name}/cond0")[0]
    sub = _Ctx(c.h, c.nh)
    sub._n = c._n
    formal = [f"{n.name}/v{i}" for i in range(nv)]
    b_out = _inline(sub, body, formal + caps, f"{n.name}/body")
    c_out = _inline(sub, cond, b_out + caps, f"{n.name}/cond")[0]
    c._n = sub._n
    for i, nm in enumerate(b_out):  # a body output that is a formal input still needs its own name
        if nm in formal or nm in caps:
            fresh = f"{n.name}/out{i}"
            sub.node("Identity", [nm], [fresh])
            b_out[i] = fresh
    cond_out = f"{n.name}/cond_out"
    sub.node("Identity", [c_out], [cond_out])
    iter_name = f"{n.name}/iter"
    graph = c.h.make_graph(sub.nodes, f"{n.name}_body",
                           [c.h.make_tensor_value_info(iter_name, _onnx_dtype(np.int64), []),
                            c.h.make_tensor_value_info(f"{n.name}/cond_in", _onnx_dtype(np.bool_), [])]
                           + [_value_info(c, t, nm) for t, nm in zip(body.inputs[:nv], formal)],
                           [c.h.make_tensor_value_info(cond_out, _onnx_dtype(np.bool_), [])]
                           + [_value_info(c, t, nm) for t, nm in zip(body.outputs, b_out)], sub.inits)
    c.node("Loop", ["", cond0] + vars_in, outs[:nv], body=graph)


@handler("If")
def _if(c, n, ins, outs):
    graphs = {}
    for key in ("then_branch", "else_branch"):
        fn = n.attrs[key]
        sub = _Ctx(c.h, c.nh)
        sub._n = c._n
        res = _inline(sub, fn, ins[1:], f"{n.name}/{key}")
        c._n = sub._n
        names = []
        for i, nm in enumerate(res):  # branch outputs get names of their own
            fresh = f"{n.name}/{key}/out{i}"
            sub.node("Identity", [nm], [fresh])
            names.append(fresh)
        graphs[key] = c.h.make_graph(sub.nodes, f"{n.name}_{key}", [],
                                     [_value_info(c, t, nm) for t, nm in zip(fn.outputs, names)], sub.inits)
    pred = ins[0]
    if len(n.inputs[0].shape) == 1:
        p2 = c.fresh("pred")
        c.node("Squeeze", [pred, c.const(np.array([0], np.int64))], [p2])
        pred = p2
    c.node("If", [pred], outs, then_branch=graphs["then_branch"], else_branch=graphs["else_branch"])
