"""ONNX import handlers for control flow: If -> cond, Loop -> while_loop (bodies are subgraphs)."""
from __future__ import annotations

import numpy as np

import isthmus.core as ism

from .onnx_import import ImportError_, _attrs, _clean, _run_nodes, handler


def _body(c, gp, values, bind):
    """A function building ONNX subgraph `gp` in the current (body) graph: `bind` names its formal
    inputs; outer names resolve through `values` and are captured by the body graph."""
    from collections import ChainMap

    def build(*args):
        from onnx import numpy_helper
        scope = ChainMap(dict(zip(bind, args)), values)
        for init in gp.initializer:  # a subgraph's own constants
            arr = numpy_helper.to_array(init)
            c.consts[init.name] = arr
            scope[init.name] = ism.constant(arr, dtype=arr.dtype, name=_clean(init.name))
        _run_nodes(c, gp.node, scope)
        missing = [o.name for o in gp.output if o.name not in scope]
        if missing:
            raise ImportError_(f"subgraph '{gp.name}': outputs {missing} are produced by no node")
        return [scope[o.name] for o in gp.output]
    return build


@handler("If", 1, attrs=("then_branch", "else_branch"))
def _if(c, node, ins, values):
    at = _attrs(node)
    then_f, else_f = _body(c, at["then_branch"], values, []), _body(c, at["else_branch"], values, [])
    pred = ins[0]
    if pred.shape not in ((), (1,)):
        pred = ism.reshape(pred, ())
    out = ism.cond(pred, then_f, else_f)
    return out if isinstance(out, list) else [out]


@handler("Loop", 1, attrs=("body",))
def _loop(c, node, ins, values):
    at = _attrs(node)
    body = at["body"]
    n_state = len(ins) - 2
    if len(body.output) != 1 + n_state:
        raise ImportError_(f"scan outputs are not supported "
                           f"({len(body.output) - 1 - n_state} found)")
    trip, cond0 = ins[0], ins[1]
    names = [i.name for i in body.input]  # iteration number, condition, state...
    build = _body(c, body, values, names)
    state = list(ins[2:])
    i0 = ism.constant(np.array(0, np.int64))
    go0 = cond0 if cond0 is not None else ism.constant(np.array(True))
    if go0.shape != ():
        go0 = ism.reshape(go0, ())
    limit = trip if trip is not None else ism.constant(np.array(np.iinfo(np.int64).max, np.int64))
    if limit.shape != ():
        limit = ism.reshape(limit, ())

    def cond_fn(i, go, *vs):
        return ism.logical_and(ism.less(i, limit), go)

    def body_fn(i, go, *vs):
        outs = build(i, go, *vs)
        go2 = outs[0] if outs[0].shape == () else ism.reshape(outs[0], ())
        return [i + np.int64(1), go2] + [ism.cast(o, v.dtype) for o, v in zip(outs[1:], vs)]
    invariants = [(), ()] + [tuple(None for _ in v.shape) for v in state]
    res = ism.while_loop(cond_fn, body_fn, [i0, go0] + state, shape_invariants=invariants)
    return res[2:]
