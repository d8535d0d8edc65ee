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
    if node.input[0] in c.consts:  # a condition known at import: only the taken branch exists
        taken = bool(np.asarray(c.consts[node.input[0]]).reshape(-1)[0])
        return list((then_f if taken else else_f)())
    pred = ins[0]
    if pred.shape not in ((), (1,)):
        pred = ism.reshape(pred, ())
    out = ism.cond(pred, then_f, else_f)
    return out if isinstance(out, list) else [out]


@handler("Loop", 1, attrs=("body",))
def _loop(c, node, ins, values):
    """Loop -> while_loop over (iteration, condition, state..., scan accumulators...). A scan output
    is gathered flat (its values concatenated) beside the shape of its last value, and reshaped to
    [iterations, *shape] after the loop; its dtype and rank come from one trial build of the body."""
    at = _attrs(node)
    body = at["body"]
    n_state = len(ins) - 2
    n_scan = len(body.output) - 1 - n_state
    if n_scan < 0:
        raise ImportError_(f"the body returns {len(body.output)} values for {n_state} loop-carried ones")
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
    invariants = [(), ()] + [tuple(None for _ in v.shape) for v in state]
    scans = _scan_specs(build, [i0, go0] + state, invariants, n_state) if n_scan else []
    accs = [ism.constant(np.zeros(0, d)) for d, _ in scans] + \
        [ism.constant(np.zeros(r, np.int64)) for _, r in scans]

    def cond_fn(i, go, *vs):
        return ism.logical_and(ism.less(i, limit), go)

    def body_fn(i, go, *vs):
        carried, acc = vs[:n_state], vs[n_state:]
        outs = build(i, go, *carried)
        go2 = outs[0] if outs[0].shape == () else ism.reshape(outs[0], ())
        new = [i + np.int64(1), go2] + [ism.cast(o, v.dtype) for o, v in zip(outs[1:1 + n_state], carried)]
        ys = outs[1 + n_state:]
        new += [ism.concat([a, ism.reshape(y, (-1,))], 0) for a, y in zip(acc[:n_scan], ys)]
        new += [ism.shape(y, "int64") for y in ys]
        return new
    invariants += [(None,)] * n_scan + [(r,) for _, r in scans]
    res = ism.while_loop(cond_fn, body_fn, [i0, go0] + state + accs, shape_invariants=invariants)
    out = list(res[2:2 + n_state])
    n_iter = ism.reshape(res[0], (1,))
    for flat, shp in zip(res[2 + n_state:2 + n_state + n_scan], res[2 + n_state + n_scan:]):
        out.append(ism.reshape_to(flat, ism.concat([n_iter, shp], 0)))
    return out


def _scan_specs(build, loop_vars, invariants, n_state):
    """(dtype, rank) of each scan output: the body built once, with the loop's own input specs, in a
    scratch graph that is then dropped."""
    from isthmus.core.graph import Graph, get_default_graph
    outer = get_default_graph()
    scratch = Graph(seed=outer.seed, outer=outer)
    with scratch.as_default():
        phs = [ism.placeholder(v.dtype, s) for v, s in zip(loop_vars, invariants)]
        outs = build(*phs)
    return [(o.dtype, len(o.shape)) for o in outs[1 + n_state:]]
