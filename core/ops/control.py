"""Control flow in the graph: If (cond) and While (while_loop), bodies as Functions.

Only the taken branch runs; a loop's trip count is a run-time value. Gradients: If
differentiates each branch inside its own body graph; While's gradient (WhileGrad) runs
the body's backward pass in reverse over the iterations of that run, fed with the values
the forward loop saved (its loop variables and whichever body intermediates the backward
pass reads), so nothing is recomputed.
"""
from __future__ import annotations

import sys
from typing import Callable, List, Optional, Sequence, Tuple

from .. import dtypes as _dt
from ..autodiff import gradients
from ..errors import ExecutionError, IsthmusError, ShapeError
from ..executor import Plan
from ..function import Function
from ..graph import Graph, Tensor, get_default_graph
from ..ops.sparse import gather, to_dense
from ..registry import REQUIRED, Cost, OpDef, register
from ..shapes import as_shape, compatible, fmt
from .base import constant, convert, make
from .math import add, less, logical_and, zeros_like

__all__ = ["cond", "while_loop"]


# ---- building bodies -------------------------------------------------------------------------
def _flatten(out) -> Tuple[List, bool]:
    if isinstance(out, (list, tuple)):
        return list(out), True
    return [out], False


def _trace(fn: Callable, specs: Sequence[Tuple], outer: Graph, name: str):
    """Build fn(*placeholders) in a fresh body graph; returns (graph, placeholders, outputs, was_seq)."""
    g = Graph(seed=outer.seed, outer=outer)
    with g.as_default():
        phs = [make("Placeholder", (), {"dtype": d, "shape": s}, name=f"{name}_in{i}", graph=g).outputs[0]
               for i, (d, s) in enumerate(specs)]
        out, seq = _flatten(fn(*phs))
        outs = [convert(o) for o in out]
        # a body output that is an enclosing graph's tensor becomes a captured placeholder
        outs = [g.capture(o) if o.graph is not g else o for o in outs]
    return g, phs, outs, seq


def _bind_captures(graphs: Sequence[Graph]) -> List[Tensor]:
    """The union of the bodies' captured outer tensors, in a fixed order."""
    caps: List[Tensor] = []
    seen = set()
    for g in graphs:
        for t in g.captures:
            if t not in seen:
                seen.add(t)
                caps.append(t)
    return caps


def _capture_inputs(g: Graph, caps: Sequence[Tensor]) -> List[Tensor]:
    """This body's placeholder for each capture (an unused one where the body does not read it)."""
    out = []
    for t in caps:
        ph = g.captures.get(t)
        if ph is None:
            ph = make("Placeholder", (), {"dtype": t.dtype, "shape": t.shape}, name="unused_capture", graph=g).outputs[0]
        out.append(ph)
    return out


def _merge_shape(a, b):
    if len(a) != len(b):
        return None
    return tuple(x if x == y else None for x, y in zip(a, b))


# ---- If ------------------------------------------------------------------------------------------
def _infer_if(node):
    pred = node.inputs[0]
    if pred.dtype != _dt.bool_ or pred.shape not in ((), (1,)):
        raise ShapeError(f"cond predicate must be a bool scalar, got {pred.dtype.name}{fmt(pred.shape)}")
    t, e = node.attrs["then_branch"], node.attrs["else_branch"]
    if len(t.outputs) != len(e.outputs):
        raise ShapeError(f"branches return {len(t.outputs)} and {len(e.outputs)} values")
    specs = []
    for i, (a, b) in enumerate(zip(t.outputs, e.outputs)):
        if a.dtype != b.dtype:
            raise ShapeError(f"output {i}: branches return {a.dtype.name} and {b.dtype.name}")
        shape = _merge_shape(a.shape, b.shape)
        if shape is None:
            raise ShapeError(f"output {i}: branches return ranks {len(a.shape)} and {len(b.shape)}")
        specs.append((a.dtype, shape))
    return specs


def _kernel_if(node, ctx):
    then_plan = node.attrs["then_branch"].compile(ctx)
    else_plan = node.attrs["else_branch"].compile(ctx)
    single = len(node.outputs) == 1

    def run(pred, *args):
        out = (then_plan if pred else else_plan)(*args)
        return out[0] if single else out
    return run


def _branch_grad(f: Function, dys: Sequence[Optional[Tensor]], name: str) -> Function:
    """A Function of (captures..., dys...) giving the gradient w.r.t. each capture."""
    g = f.graph
    with g.as_default():
        dy_phs, ys = [], []
        for o, dy in zip(f.outputs, dys):
            if dy is not None and _dt.is_float(o.dtype):
                ph = make("Placeholder", (), {"dtype": o.dtype, "shape": dy.shape}, name=f"{name}_dy", graph=g).outputs[0]
                dy_phs.append(ph)
                ys.append(o)
        xs = [x for x in f.inputs]
        grads = gradients(ys, xs, grad_ys=dy_phs, name=name) if ys else [None] * len(xs)
        outs = [zeros_like(x) if gr is None else to_dense(gr) for x, gr in zip(xs, grads)]
    return Function(g, list(f.inputs) + dy_phs, outs, name=name)


def _g_if(node, dys):
    t, e = node.attrs["then_branch"], node.attrs["else_branch"]
    present = [d for d, o in zip(dys, node.outputs) if d is not None and _dt.is_float(o.dtype)]
    if not present:
        return [None] * len(node.inputs)
    tg = _branch_grad(t, dys, "then_grad")
    eg = _branch_grad(e, dys, "else_grad")
    node_g = make("If", [node.inputs[0]] + list(node.inputs[1:]) + present,
                  {"then_branch": tg, "else_branch": eg}, name=node.name + "_grad")
    outs = list(node_g.outputs)
    return [None] + [o if _dt.is_float(x.dtype) else None for o, x in zip(outs, node.inputs[1:])]


def _cost_body(node):
    return Cost(0, 0, 0)  # the partitioner treats control flow as opaque; bodies are costed inside


register(OpDef("If", inputs=("cond", "*inputs"), attrs={"then_branch": REQUIRED, "else_branch": REQUIRED},
               infer=_infer_if, kernel=_kernel_if, grad=_g_if, cost=_cost_body, stateful=True,
               doc="Runs then_branch or else_branch (Functions of the inputs) by the predicate."))


def cond(pred, true_fn: Callable, false_fn: Callable, name: Optional[str] = None):
    """true_fn() if pred else false_fn(); only the taken branch runs. Branches may read outer tensors."""
    pred = convert(pred)
    outer = get_default_graph()
    gt, _, outs_t, seq_t = _trace(true_fn, [], outer, "then")
    ge, _, outs_e, seq_e = _trace(false_fn, [], outer, "else")
    caps = _bind_captures([gt, ge])
    then_f = Function(gt, _capture_inputs(gt, caps), outs_t, name="then")
    else_f = Function(ge, _capture_inputs(ge, caps), outs_e, name="else")
    node = make("If", [pred] + caps, {"then_branch": then_f, "else_branch": else_f}, name=name or "cond")
    outs = list(node.outputs)
    return outs if (seq_t or len(outs) != 1) else outs[0]


# ---- While ---------------------------------------------------------------------------------------
class SavedTensors:
    """Body tensors a gradient reads; the forward loop saves them per iteration. Filled in by
    the gradient builder after the loop is built, read when a plan is compiled."""
    __slots__ = ("tensors",)

    def __init__(self):
        self.tensors: List[Tensor] = []

    def add(self, ts: Sequence[Tensor]) -> None:
        for t in ts:
            if t not in self.tensors:
                self.tensors.append(t)

    def __repr__(self) -> str:
        return f"<saved {len(self.tensors)}>"


def _infer_while(node):
    n = node.attrs["n_vars"]
    body, cnd = node.attrs["body"], node.attrs["cond"]
    specs = []
    for i in range(n):
        ph, out = body.inputs[i], body.outputs[i]
        if out.dtype != ph.dtype:
            raise ShapeError(f"loop variable {i} ('{node.inputs[i].name}') enters as {ph.dtype.name} "
                             f"but the body returns {out.dtype.name}")
        if len(out.shape) != len(ph.shape) or not all(p is None or p == o for p, o in zip(ph.shape, out.shape)):
            raise ShapeError(f"loop variable {i} ('{node.inputs[i].name}') has shape {fmt(ph.shape)} "
                             f"but the body returns {fmt(out.shape)}; declare a shape invariant with "
                             "None for the dimensions that change")
        specs.append((ph.dtype, ph.shape))
    c = cnd.outputs[0]
    if c.dtype != _dt.bool_ or c.shape not in ((), (1,)):
        raise ShapeError(f"loop condition must return a bool scalar, got {c.dtype.name}{fmt(c.shape)}")
    specs.append((_dt.variant, ()))  # the iterations' saved values, for the gradient
    return specs


def _kernel_while(node, ctx):
    n = node.attrs["n_vars"]
    cond_plan = node.attrs["cond"].compile(ctx)
    body: Function = node.attrs["body"]
    record = ctx.output_used(node.outputs[-1])
    saved = list(node.attrs["saved"].tensors) if record else []
    body_plan = Plan(list(body.outputs) + saved, body.inputs, ctx, parallel=False)
    limit = node.attrs["max_trips"]
    cond_fn, body_fn = cond_plan.fn, body_plan.fn  # the bare generated functions: no wrapper per trip

    def run(*args):
        vals, caps = args[:n], args[n:]
        hist = [] if record else None
        trips = 0
        try:
            while cond_fn(*vals, *caps)[0]:
                trips += 1
                if limit is not None and trips > limit:
                    raise RuntimeError(f"loop ran past max_trips={limit}")
                out = body_fn(*vals, *caps)
                if record:
                    hist.append((vals, out[n:]))
                vals = out[:n]
        except Exception as e:
            _name_body_failure(e, (cond_plan, body_plan))
            raise
        return (*vals, hist)
    return run


def _name_body_failure(e: Exception, plans) -> None:
    """Re-raise a failure inside a loop body as an ExecutionError naming the body's node."""
    if isinstance(e, IsthmusError):
        return
    tb = sys.exc_info()[2]
    for p in plans:
        failing = p._failing_node(tb)
        if failing is not None:
            raise ExecutionError(f"node '{failing.name}' ({failing.op}) in a loop body failed: "
                                 f"{type(e).__name__}: {e}", failing.name, failing.op) from e


register(OpDef("While", inputs=("*inputs",),
               attrs={"cond": REQUIRED, "body": REQUIRED, "n_vars": REQUIRED, "saved": None, "max_trips": None},
               infer=_infer_while, kernel=_kernel_while, cost=_cost_body, stateful=True,
               grad=lambda node, dys: _g_while(node, dys),
               doc="while cond(vars, captures): vars = body(vars, captures). Last output: saved iterations."))


def _g_while(node, dys):
    n = node.attrs["n_vars"]
    body: Function = node.attrs["body"]
    g = body.graph
    fv = [i for i in range(n) if _dt.is_float(node.inputs[i].dtype)]
    fc = [j for j in range(len(node.inputs) - n) if _dt.is_float(node.inputs[n + j].dtype)]
    if not fv or all(dys[i] is None for i in fv):
        return [None] * len(node.inputs)
    before = len(g.nodes)
    with g.as_default():
        dy_phs = [make("Placeholder", (), {"dtype": body.inputs[i].dtype, "shape": body.inputs[i].shape},
                       name=f"dy{i}", graph=g).outputs[0] for i in fv]
        xs = [body.inputs[i] for i in fv] + [body.inputs[n + j] for j in fc]
        grads = gradients([body.outputs[i] for i in fv], xs, grad_ys=dy_phs, name="body_grad")
        outs = [zeros_like(x) if gr is None else to_dense(gr) for x, gr in zip(xs, grads)]
    # forward body tensors the backward pass reads are saved per iteration, not recomputed
    needed: List[Tensor] = []
    seen, stack = set(), [o.node for o in outs]
    while stack:
        nd = stack.pop()
        if nd.index < before or id(nd) in seen:
            continue
        seen.add(id(nd))
        for t in nd.inputs:
            if t.node.index < before:
                if t.node.op not in ("Placeholder", "Const") and t not in needed:
                    needed.append(t)
            else:
                stack.append(t.node)
    needed.sort(key=lambda t: (t.node.index, t.index))
    node.attrs["saved"].add(needed)
    grad_fn = Function(g, list(body.inputs) + needed + dy_phs, outs, name="while_grad")
    dy_in = [dys[i] if dys[i] is not None else zeros_like(node.outputs[i]) for i in fv]
    gnode = make("WhileGrad", list(node.inputs) + [node.outputs[-1]] + dy_in,
                 {"grad_fn": grad_fn, "n_vars": n, "n_saved": len(needed), "float_vars": tuple(fv),
                  "float_caps": tuple(fc)}, name=node.name + "_grad")
    result = [None] * len(node.inputs)
    for k, i in enumerate(fv):
        result[i] = gnode.outputs[k]
    for k, j in enumerate(fc):
        result[n + j] = gnode.outputs[len(fv) + k]
    return result


def _infer_while_grad(node):
    n = node.attrs["n_vars"]
    return [(node.inputs[i].dtype, node.inputs[i].shape) for i in node.attrs["float_vars"]] + \
           [(node.inputs[n + j].dtype, node.inputs[n + j].shape) for j in node.attrs["float_caps"]]


def _kernel_while_grad(node, ctx):
    n = node.attrs["n_vars"]
    fn: Function = node.attrs["grad_fn"]
    fv, fc = node.attrs["float_vars"], node.attrs["float_caps"]
    nf = len(fv)
    # only the capture gradients this plan reads are computed (a fed sequence's is not)
    want_caps = [k for k in range(len(fc)) if ctx.output_used(node.outputs[nf + k])]
    plan = Plan(fn.outputs[:nf] + [fn.outputs[nf + k] for k in want_caps], fn.inputs, ctx, parallel=False)
    n_caps = len(node.inputs) - n - 1 - nf
    xp = ctx.xp

    def run(*args):
        caps = args[n:n + n_caps]
        hist = args[n + n_caps]
        g_vars = list(args[n + n_caps + 1:])
        if hist is None:
            raise RuntimeError("the forward loop did not save its iterations")
        acc = [None] * len(fc)
        fn_ = plan.fn
        try:
            for vals, saved in reversed(hist):
                out = fn_(*vals, *caps, *saved, *g_vars)
                g_vars = out[:nf]
                for j, k in enumerate(want_caps):
                    g = out[nf + j]
                    if acc[k] is None:
                        acc[k] = xp.array(g, copy=True)
                    else:
                        acc[k] += g
        except Exception as e:
            _name_body_failure(e, (plan,))
            raise
        for k in range(len(fc)):
            if acc[k] is None:
                acc[k] = xp.zeros_like(caps[fc[k]])
        return (*g_vars, *acc)
    return run


register(OpDef("WhileGrad", inputs=("*inputs",),
               attrs={"grad_fn": REQUIRED, "n_vars": REQUIRED, "n_saved": 0, "float_vars": (), "float_caps": ()},
               infer=_infer_while_grad, kernel=_kernel_while_grad, cost=_cost_body, stateful=True,
               doc="Backward pass of a While over the iterations its forward run saved."))


def while_loop(cond_fn: Callable, body_fn: Callable, loop_vars, maximum_iterations=None,
               shape_invariants=None, name: Optional[str] = None):
    """Repeat `loop_vars = body_fn(*loop_vars)` while `cond_fn(*loop_vars)`; returns the final vars.

    A loop variable whose shape changes across iterations must be declared in
    `shape_invariants` with None for the changing dimensions.
    """
    vars_, seq = _flatten(loop_vars)
    vars_ = [convert(v) for v in vars_]
    outer = get_default_graph()
    if maximum_iterations is not None:
        limit = convert(maximum_iterations, _dt.int32) if not isinstance(maximum_iterations, Tensor) \
            else maximum_iterations
        user_cond, user_body = cond_fn, body_fn
        cond_fn = lambda i, *v: logical_and(less(i, limit), user_cond(*v))  # noqa: E731
        body_fn = lambda i, *v: [add(i, 1)] + _flatten(user_body(*v))[0]  # noqa: E731
        vars_ = [constant(0, _dt.int32)] + vars_
        if shape_invariants is not None:
            shape_invariants = [()] + list(shape_invariants)
    if shape_invariants is None:
        specs = [(v.dtype, v.shape) for v in vars_]
    else:
        if len(shape_invariants) != len(vars_):
            raise ShapeError(f"{len(shape_invariants)} shape invariants for {len(vars_)} loop variables")
        specs = []
        for v, s in zip(vars_, shape_invariants):
            s = v.shape if s is None else as_shape(s)
            if not compatible(v.shape, s):
                raise ShapeError(f"loop variable '{v.name}' {fmt(v.shape)} does not fit its invariant {fmt(s)}")
            specs.append((v.dtype, s))
    gc, phc, outc, _ = _trace(cond_fn, specs, outer, "cond")
    gb, phb, outb, _ = _trace(body_fn, specs, outer, "body")
    if len(outb) != len(vars_):
        raise ShapeError(f"while_loop body returns {len(outb)} values for {len(vars_)} loop variables")
    if len(outc) != 1:
        raise ShapeError(f"while_loop condition returns {len(outc)} values; it must return one bool")
    caps = _bind_captures([gc, gb])
    cond_f = Function(gc, phc + _capture_inputs(gc, caps), outc, name="cond")
    body_f = Function(gb, phb + _capture_inputs(gb, caps), outb, name="body")
    node = make("While", vars_ + caps, {"cond": cond_f, "body": body_f, "n_vars": len(vars_),
                                        "saved": SavedTensors()}, name=name or "while")
    outs = list(node.outputs[:len(vars_)])
    if maximum_iterations is not None:
        outs = outs[1:]
    return outs if (seq or len(outs) != 1) else outs[0]


# ---- SetRow: the functional row update that accumulates a loop's per-step outputs ------------
def _infer_set_row(node):
    acc, idx, val = node.inputs
    if idx.dtype.kind not in "iu" or idx.shape != ():
        raise ShapeError(f"row index must be an integer scalar, got {idx.dtype.name}{fmt(idx.shape)}")
    if val.dtype != acc.dtype or not compatible(val.shape, acc.shape[1:]):
        raise ShapeError(f"row {val.dtype.name}{fmt(val.shape)} does not fit rows of {acc.dtype.name}{fmt(acc.shape)}")
    return [(acc.dtype, acc.shape)]


def _kernel_set_row(node, ctx):
    def run(acc, i, value):
        out = acc.copy()  # functional: earlier iterations' saved values stay intact
        out[i] = value
        return out
    return run


def _g_set_row(node, dys):
    dy = dys[0]
    acc, idx, _ = node.inputs
    d_acc = make("SetRow", (dy, idx, zeros_like(node.inputs[2])), name="SetRowGrad").outputs[0]
    return [d_acc, None, gather(dy, idx)]


register(OpDef("SetRow", inputs=("acc", "index", "value"), infer=_infer_set_row, kernel=_kernel_set_row,
               grad=_g_set_row, cost=lambda node: Cost(0, *(2 * [float(node.inputs[0].dtype.itemsize)])),
               doc="acc with row `index` replaced by value (a copy): per-step outputs of a loop."))


def set_row(acc, index, value, name: Optional[str] = None) -> Tensor:
    return make("SetRow", (convert(acc), convert(index), convert(value)), name=name).outputs[0]


__all__.append("set_row")
