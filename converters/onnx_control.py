"""ONNX import handlers for control flow: If -> cond, Loop -> while_loop (bodies are subgraphs)."""
from __future__ import annotations

from collections import ChainMap

import numpy as np

import isthmus.core as ism

from isthmus.core.graph import Graph, get_default_graph

from .onnx_import import ImportError_, _attrs, _clean, _run_nodes, handler


def _body(c, gp, values, bind):
    """A function building ONNX subgraph `gp` in the current (body) graph: `bind` names its formal
    inputs; outer names resolve through `values` and are captured by the body graph."""

    def build(*args):
        from onnx import numpy_helper  # deferred: onnx is a heavy or optional dependency
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
        out.append(_stack(flat, shp, n_iter, 0, False))
    return out


def _scan_specs(build, loop_vars, invariants, n_state):
    """(dtype, rank) of each scan output: the body built once, with the loop's own input specs, in a
    scratch graph that is then dropped."""
    outs = _trial_build(build, [(v.dtype, s) for v, s in zip(loop_vars, invariants)])
    return [(o.dtype, len(o.shape)) for o in outs[1 + n_state:]]


def _trial_build(build, specs):
    outer = get_default_graph()
    scratch = Graph(seed=outer.seed, outer=outer)
    with scratch.as_default():
        return build(*[ism.placeholder(d, s) for d, s in specs])


def _stack(flat, shp, n_iter, axis: int, reverse: bool):
    """The values a loop gathered flat, as [iterations, *shape], reversed and moved to `axis` if asked."""
    y = ism.reshape_to(flat, ism.concat([n_iter, shp], 0))
    if reverse:
        y = y[::-1]
    if axis:
        rank = len(y.shape)
        perm = list(range(1, rank))
        perm.insert(axis % rank, 0)
        y = ism.transpose(y, tuple(perm))
    return y


@handler("Scan", 8)
def _scan8(c, node, ins, values):
    raise ImportError_("Scan-8 (a batch axis and sequence_lens) is not supported; opset 9's Scan is")


@handler("Scan", 9, attrs=("body", "num_scan_inputs", "scan_input_axes", "scan_input_directions",
                           "scan_output_axes", "scan_output_directions"))
def _scan(c, node, ins, values):
    """Scan -> while_loop: iteration i reads slice i of each scan input (from the end when its direction
    is 1); each scan output is gathered flat and stacked after the loop."""
    at = _attrs(node)
    body = at["body"]
    m = int(at["num_scan_inputs"])
    n_state = len(ins) - m
    k = len(body.output) - n_state
    xs = ins[n_state:]
    in_axes = [a % len(x.shape) for a, x in zip(at.get("scan_input_axes", [0] * m), xs)]
    in_dirs = list(at.get("scan_input_directions", [0] * m))
    out_axes, out_dirs = list(at.get("scan_output_axes", [0] * k)), list(at.get("scan_output_directions", [0] * k))
    if m < 1 or k < 0 or len(in_axes) != m or len(in_dirs) != m or len(out_axes) != k or len(out_dirs) != k:
        raise ImportError_(f"{m} scan inputs and {k} scan outputs do not match the axes/directions given")
    build = _body(c, body, values, [i.name for i in body.input])
    state = list(ins[:n_state])
    n = xs[0].shape[in_axes[0]]
    n_t = ism.constant(np.array(n, np.int64)) if n is not None else ism.shape(xs[0], "int64")[in_axes[0]]
    slice_specs = [(x.dtype, tuple(d for j, d in enumerate(x.shape) if j != a)) for x, a in zip(xs, in_axes)]
    state_inv = [tuple(None for _ in v.shape) for v in state]
    outs0 = _trial_build(build, [(v.dtype, s) for v, s in zip(state, state_inv)] + slice_specs)
    scans = [(o.dtype, len(o.shape)) for o in outs0[n_state:]]
    i0 = ism.constant(np.array(0, np.int64))
    accs = [ism.constant(np.zeros(0, d)) for d, _ in scans] + [ism.constant(np.zeros(r, np.int64)) for _, r in scans]

    def cond_fn(i, *vs):
        return ism.less(i, n_t)

    def body_fn(i, *vs):
        carried, acc = vs[:n_state], vs[n_state:]
        last = ism.sub(ism.sub(n_t, np.int64(1)), i)
        slices = [ism.gather(x, last if d else i, a) for x, a, d in zip(xs, in_axes, in_dirs)]
        outs = build(*carried, *slices)
        new = [i + np.int64(1)] + [ism.cast(o, v.dtype) for o, v in zip(outs[:n_state], carried)]
        ys = outs[n_state:]
        new += [ism.concat([a, ism.reshape(y, (-1,))], 0) for a, y in zip(acc[:k], ys)]
        return new + [ism.shape(y, "int64") for y in ys]
    invariants = [()] + state_inv + [(None,)] * k + [(r,) for _, r in scans]
    res = ism.while_loop(cond_fn, body_fn, [i0] + state + accs, shape_invariants=invariants)
    n_iter = ism.reshape(res[0], (1,))
    out = list(res[1:1 + n_state])
    for j in range(k):
        out.append(_stack(res[1 + n_state + j], res[1 + n_state + k + j], n_iter, int(out_axes[j]), bool(out_dirs[j])))
    return out
