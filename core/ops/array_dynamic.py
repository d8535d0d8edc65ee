"""Layout ops whose shape, axes or sizes are known only at run time (ONNX feeds them as inputs):
ReshapeTo, SliceDynamic, SqueezeDynamic / ExpandDynamic and SplitSizes."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import OpDef, elementwise_cost, register
from ..shapes import fmt, normalize_axis
from .base import constant, convert, make
from .array import FREE_COST, _py_slice, concat, first_output, static_value
from .fill import shape
from .math import zeros_like


# ---- ReshapeTo: a shape known only at run time ---------------------------------------------------
def _infer_reshape_to(node):
    x, s = node.inputs
    if s.dtype.kind not in "iu" or len(s.shape) != 1 or s.shape[0] is None:
        raise ShapeError(f"the target shape must be a 1-D integer tensor of known length, got {s.dtype.name}{fmt(s.shape)}")
    known = static_value(s)
    if known is None:
        return [(x.dtype, (None,) * s.shape[0])]
    return [(x.dtype, tuple(None if (d is None or d < 0 or (d == 0 and node.attrs["copy_zero"])) else d
                            for d in known))]


def _kernel_reshape_to(node, ctx):
    copy_zero = node.attrs["copy_zero"]

    def run(x, s):
        target = [int(d) for d in s]
        if copy_zero:  # ONNX Reshape without allowzero: 0 copies the input's dimension
            target = [x.shape[i] if d == 0 and i < x.ndim else d for i, d in enumerate(target)]
        return x.reshape(target)
    return run


register(OpDef("ReshapeTo", inputs=("x", "shape"), attrs={"copy_zero": False}, infer=_infer_reshape_to,
               kernel=_kernel_reshape_to,
               grad=lambda node, dys: [first_output("ReshapeLike", (dys[0], node.inputs[0])), None], cost=FREE_COST,
               doc="x reshaped to a shape computed at run time (-1 allowed; copy_zero: ONNX's 0 = keep)."))


def reshape_to(x, shape, copy_zero: bool = False, name=None) -> Tensor:
    """Reshape to a run-time shape tensor (reshape() takes static ints)."""
    return first_output("ReshapeTo", (convert(x), convert(shape)), {"copy_zero": bool(copy_zero)}, name=name)


__all__ = ["reshape_to"]


# ---- slicing and axes known only at run time (ONNX feeds them as inputs) ---------------------------
def _int_vector(t: Tensor, what: str) -> int:
    if t.dtype.kind not in "iu" or len(t.shape) != 1 or t.shape[0] is None:
        raise ShapeError(f"{what} must be a 1-D integer tensor of known length, got {t.dtype.name}{fmt(t.shape)}")
    return t.shape[0]


def _runtime_slices(x, starts, ends, axes, steps):
    key = [_py_slice(None)] * x.ndim
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for a, s, e, st in zip(axes, starts, ends, steps):
        key[int(a) % x.ndim] = _py_slice(int(s), int(e), int(st))  # Python clamps like ONNX Slice
    return tuple(key)


def _infer_slice_dynamic(node):
    x = node.inputs[0]
    n = _int_vector(node.inputs[1], "starts")
    for t, what in zip(node.inputs[2:], ("ends", "axes", "steps")):
        if _int_vector(t, what) != n:
            raise ShapeError(f"starts and {what} differ in length")
    return [(x.dtype, (None,) * len(x.shape))]


def _kernel_slice_dynamic(node, ctx):
    has_axes, has_steps = len(node.inputs) > 3, len(node.inputs) > 4
    return lambda x, s, e, *rest: x[_runtime_slices(x, s, e, rest[0] if has_axes else None,
                                                    rest[1] if has_steps else None)]


def _kernel_slice_dynamic_grad(node, ctx):
    xp = ctx.xp
    has_axes, has_steps = len(node.inputs) > 4, len(node.inputs) > 5

    def run(dy, x, s, e, *rest):
        out = xp.zeros(x.shape, dtype=dy.dtype)
        out[_runtime_slices(x, s, e, rest[0] if has_axes else None, rest[1] if has_steps else None)] = dy
        return out
    return run


register(OpDef("SliceDynamic", inputs=("x", "starts", "ends", "*axes_steps"), infer=_infer_slice_dynamic,
               kernel=_kernel_slice_dynamic, cost=FREE_COST,
               grad=lambda node, dys: [first_output("SliceDynamicGrad", [dys[0]] + list(node.inputs))]
               + [None] * (len(node.inputs) - 1),
               doc="x sliced by run-time starts/ends (axes, steps optional), clamped as ONNX Slice is."))
register(OpDef("SliceDynamicGrad", inputs=("dy", "x", "starts", "ends", "*axes_steps"),
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[1].shape)],
               kernel=_kernel_slice_dynamic_grad, cost=elementwise_cost(1)))


def slice_dynamic(x, starts, ends, axes=None, steps=None, name=None) -> Tensor:
    ins = [convert(x), convert(starts), convert(ends)]
    if axes is not None:
        ins.append(convert(axes))
        if steps is not None:
            ins.append(convert(steps))
    elif steps is not None:
        ins += [constant(np.arange(ins[1].shape[0] or 0, dtype=np.int64)), convert(steps)]
    return first_output("SliceDynamic", ins, name=name)


def _infer_axes_dynamic(node):
    x, axes = node.inputs
    n = _int_vector(axes, "axes")
    rank = len(x.shape) + (n if node.op == "ExpandDynamic" else -n)
    if rank < 0:
        raise ShapeError(f"cannot squeeze {n} axes from rank {len(x.shape)}")
    return [(x.dtype, (None,) * rank)]


register(OpDef("SqueezeDynamic", inputs=("x", "axes"), infer=_infer_axes_dynamic,
               kernel=lambda node, ctx: (lambda x, a: ctx.xp.squeeze(x, tuple(int(v) % x.ndim for v in a))),
               grad=lambda node, dys: [first_output("ReshapeLike", (dys[0], node.inputs[0])), None], cost=FREE_COST))
register(OpDef("ExpandDynamic", inputs=("x", "axes"), infer=_infer_axes_dynamic,
               kernel=lambda node, ctx: (lambda x, a: ctx.xp.expand_dims(
                   x, tuple(sorted(int(v) % (x.ndim + len(a)) for v in a)))),
               grad=lambda node, dys: [first_output("ReshapeLike", (dys[0], node.inputs[0])), None], cost=FREE_COST))


def squeeze_dynamic(x, axes, name=None) -> Tensor:
    return first_output("SqueezeDynamic", (convert(x), convert(axes)), name=name)


def expand_dynamic(x, axes, name=None) -> Tensor:
    return first_output("ExpandDynamic", (convert(x), convert(axes)), name=name)


__all__ += ["slice_dynamic", "squeeze_dynamic", "expand_dynamic"]


def _infer_split_sizes(node):
    x, sizes = node.inputs
    if _int_vector(sizes, "split sizes") != node.attrs["num"]:
        raise ShapeError(f"{node.attrs['num']} outputs but {sizes.shape[0]} sizes")
    axis = normalize_axis(node.attrs["axis"], len(x.shape))
    return [(x.dtype, x.shape[:axis] + (None,) + x.shape[axis + 1:])] * node.attrs["num"]


def _kernel_split_sizes(node, ctx):
    axis = normalize_axis(node.attrs["axis"], len(node.inputs[0].shape))

    def run(x, sizes):
        if int(np.sum(sizes)) != x.shape[axis] or np.any(sizes < 0):
            raise ValueError(f"split sizes {list(sizes)} do not add up to {x.shape[axis]}")
        return tuple(ctx.xp.split(x, np.cumsum(sizes)[:-1].tolist(), axis=axis))
    return run


register(OpDef("SplitSizes", inputs=("x", "sizes"), attrs={"num": 1, "axis": 0}, infer=_infer_split_sizes,
               kernel=_kernel_split_sizes, cost=FREE_COST,
               grad=lambda node, dys: [_concat_grads(node, dys), None],
               doc="x split along axis into pieces whose sizes are given at run time."))


def _concat_grads(node, dys):
    return concat([d if d is not None else zeros_like(t) for d, t in zip(dys, node.outputs)], node.attrs["axis"])


def split_sizes(x, sizes, num: int, axis: int = 0, name=None):
    return list(make("SplitSizes", (convert(x), convert(sizes)), {"num": int(num), "axis": int(axis)}, name=name).outputs)


__all__.append("split_sizes")
