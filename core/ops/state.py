"""Variables and the ops that update them in place: Assign, AssignAdd, AssignSub, ScatterAdd.

A Variable node's value lives in the session (a VarSlot); update ops name the variable
through a reference input (`ref_inputs`), so the executor binds the slot, not a value.
"""
from __future__ import annotations

from ..errors import ExecutionError, ShapeError
from ..registry import REQUIRED, Cost, OpDef, elementwise_cost, register
from ..shapes import broadcast, compatible, fmt, num_elements_est


def _kernel_variable(node, ctx):
    slot = ctx.var_slot(node)

    def read():
        v = slot.value
        if v is None:
            raise ExecutionError(f"variable '{node.name}' is not initialized: run its initializer "
                                 "(global_variables_initializer()) or restore a checkpoint",
                                 node.name, node.op)
        return v
    return read


register(OpDef(
    "Variable", inputs=(), attrs={"dtype": REQUIRED, "shape": REQUIRED, "trainable": True},
    infer=lambda node: [(node.attrs["dtype"], node.attrs["shape"])],
    kernel=_kernel_variable, stateful=True,
    cost=lambda node: Cost(0, 0, 0),
))


def _check_ref(node):
    ref = node.inputs[0]
    if ref.node.op != "Variable":
        raise ShapeError(f"input 0 must be a Variable, got '{ref.name}' ({ref.node.op})")
    return ref


def _infer_assign(node):
    ref = _check_ref(node)
    v = node.inputs[1]
    if v.dtype != ref.dtype:
        raise ShapeError(f"value dtype {v.dtype.name} does not match variable '{ref.node.name}' ({ref.dtype.name})")
    if node.op == "Assign":
        if len(v.shape) != len(ref.shape) or not compatible(v.shape, ref.shape):
            raise ShapeError(f"value shape {fmt(v.shape)} does not match variable "
                             f"'{ref.node.name}' {fmt(ref.shape)}")
    else:
        b = broadcast(ref.shape, v.shape)
        if len(b) != len(ref.shape) or not compatible(b, ref.shape):
            raise ShapeError(f"value shape {fmt(v.shape)} does not broadcast to variable "
                             f"'{ref.node.name}' {fmt(ref.shape)}")
    return [(ref.dtype, ref.shape)]


def _kernel_assign(node, ctx):
    slot = ctx.var_slot(node.inputs[0].node)
    xp = ctx.xp

    def assign(value):
        with slot.lock:
            cur = slot.value
            if cur is None or cur.shape != value.shape:
                slot.value = xp.array(value, copy=True)  # first assignment (initializer)
            else:
                xp.copyto(cur, value)
            return slot.value
    return assign


def _kernel_update(ufunc_name):
    def factory(node, ctx):
        slot = ctx.var_slot(node.inputs[0].node)
        f = getattr(ctx.xp, ufunc_name)
        name = node.inputs[0].node.name

        def update(value):
            with slot.lock:  # read-modify-write: concurrent runs never lose an update
                cur = slot.value
                if cur is None:
                    raise ExecutionError(f"variable '{name}' is not initialized", node.name, node.op)
                f(cur, value, out=cur)
                return cur
        return update
    return factory


def _assign_cost(node):
    n = num_elements_est(node.inputs[0].shape) * node.inputs[0].dtype.itemsize
    return Cost(num_elements_est(node.inputs[0].shape), n, n)


register(OpDef("Assign", inputs=("ref", "value"), infer=_infer_assign, kernel=_kernel_assign,
               stateful=True, ref_inputs=(0,), cost=_assign_cost))
register(OpDef("AssignAdd", inputs=("ref", "value"), infer=_infer_assign, kernel=_kernel_update("add"),
               stateful=True, ref_inputs=(0,), cost=_assign_cost))
register(OpDef("AssignSub", inputs=("ref", "value"), infer=_infer_assign, kernel=_kernel_update("subtract"),
               stateful=True, ref_inputs=(0,), cost=_assign_cost))


def _infer_scatter(node):
    ref = _check_ref(node)
    idx, upd = node.inputs[1], node.inputs[2]
    if idx.dtype.kind not in "iu":
        raise ShapeError(f"indices must be integers, got {idx.dtype.name}")
    if upd.dtype != ref.dtype:
        raise ShapeError(f"updates dtype {upd.dtype.name} does not match variable '{ref.node.name}' ({ref.dtype.name})")
    want = tuple(idx.shape) + tuple(ref.shape[1:])
    if not compatible(upd.shape, want):
        raise ShapeError(f"updates shape {fmt(upd.shape)} must be indices.shape + variable.shape[1:] = {fmt(want)}")
    return [(ref.dtype, ref.shape)]


def _kernel_scatter_add(node, ctx):
    slot = ctx.var_slot(node.inputs[0].node)
    xp = ctx.xp
    name = node.inputs[0].node.name
    scale = node.attrs["scale"]

    def scatter_add(indices, updates):
        with slot.lock:
            cur = slot.value
            if cur is None:
                raise ExecutionError(f"variable '{name}' is not initialized", node.name, node.op)
            n = cur.shape[0]
            if indices.size and (indices.min() < -n or indices.max() >= n):
                raise IndexError(f"index out of range [0, {n}) for variable '{name}'")
            if scale != 1.0:
                updates = updates * cur.dtype.type(scale)
            xp.add.at(cur, indices, updates)  # duplicates accumulate
            return cur
    return scatter_add


register(OpDef("ScatterAdd", inputs=("ref", "indices", "updates"), attrs={"scale": 1.0},
               infer=_infer_scatter, kernel=_kernel_scatter_add, stateful=True, ref_inputs=(0,),
               cost=elementwise_cost(1), doc="ref[indices] += scale * updates, rows touched only."))
