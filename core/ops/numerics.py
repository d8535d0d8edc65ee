"""NaN and Inf checks: the CheckNumerics op (TensorFlow's tf.debugging.check_numerics), the
AllFinite op an optimizer uses to skip a step, and the per-node check behind
Session(check_numerics=True).

CheckNumerics(x) passes x through, or fails naming its node and `message` when x holds a NaN
or an Inf; its gradient passes dy through. AllFinite(*xs) is a bool scalar: every float input
is free of NaN and Inf; when one is not it warns (NonFiniteWarning) naming the first, from its
`names` attribute. Neither has an ONNX or edge form: the ONNX exporter has no mapping for them
(strip them, or export the graph without the check), and the edge capability table has no kernel,
so the partitioner keeps them on the cloud side.

The check is one BLAS dot product of a float array with itself (NaN and Inf propagate; about
the cost of one pass over the array); only when that is not finite (a NaN, an Inf, or a sum of
squares that overflows) is the exact element-wise test run, to confirm and to find the first.
"""
from __future__ import annotations

import math
import warnings
from typing import Optional, Sequence

import numpy as np

from ..errors import ExecutionError, ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, register
from .base import convert, make

__all__ = ["check_numerics", "all_finite", "non_finite", "NonFiniteError", "NonFiniteWarning"]


class NonFiniteError(ExecutionError):
    """A tensor holds NaN or Inf (CheckNumerics, or Session(check_numerics=True)); names the node."""


class NonFiniteWarning(RuntimeWarning):
    """AllFinite found a NaN or an Inf (an optimizer skipped its step)."""


def _finite(x) -> bool:
    """True when the float array `x` surely has no NaN or Inf (False: look closer). One dot
    product; numpy may warn of an overflow there, only for a NaN, an Inf or a huge value."""
    flat = x.ravel()
    return math.isfinite(flat.dot(flat))


def non_finite(x) -> Optional[str]:
    """None when `x` (an array) has no NaN or Inf, else a short description of the first bad element."""
    x = np.asarray(x) if not hasattr(x, "dtype") else x
    if x.dtype.kind != "f" or _finite(x):
        return None
    bad = ~np.isfinite(x)
    if not bad.any():
        return None
    i = int(np.argmax(bad.reshape(-1)))
    v = x.reshape(-1)[i]
    where = np.unravel_index(i, x.shape) if x.ndim else ()
    kind = "NaN" if v != v else ("+Inf" if v > 0 else "-Inf")
    return f"{kind} at index {tuple(int(k) for k in where)} ({int(bad.sum())} of {x.size} elements not finite)"


def _same(node):
    t = node.inputs[0]
    if t.dtype.kind != "f":
        raise ShapeError(f"CheckNumerics takes a float tensor, got {t.dtype.name}")
    return [(t.dtype, t.shape)]


def _kernel_check(node, ctx):
    message = node.attrs["message"]

    def run(x):
        bad = non_finite(x)
        if bad is not None:
            raise NonFiniteError(f"node '{node.name}' (CheckNumerics): {message + ': ' if message else ''}"
                                 f"input '{node.inputs[0].name}' holds {bad}", node.name, node.op)
        return x
    return run


def _grad_check(node, dys):
    return [dys[0]]


register(OpDef("CheckNumerics", inputs=("x",), attrs={"message": ""}, infer=_same, kernel=_kernel_check,
               grad=_grad_check, cost=lambda node: Cost(0, 0, 0),
               doc="x unchanged; fails naming the node when x holds NaN or Inf."))


def _infer_all(node):
    return [(np.dtype(np.bool_), ())]


def _kernel_all(node, ctx):
    names = list(node.attrs["names"]) or [t.name for t in node.inputs]
    xp = ctx.xp

    def run(*xs):
        for name, x in zip(names, xs):
            bad = non_finite(x)
            if bad is not None:
                warnings.warn(f"node '{node.name}' (AllFinite): '{name}' holds {bad}", NonFiniteWarning,
                              stacklevel=2)
                return xp.asarray(False)
        return xp.asarray(True)
    return run


register(OpDef("AllFinite", inputs=("*xs",), attrs={"names": ()}, infer=_infer_all, kernel=_kernel_all,
               cost=lambda node: Cost(0, 0, 0),
               doc="True when no input holds NaN or Inf; else False, with a NonFiniteWarning naming the first."))


def check_numerics(x, message: str = "", name: Optional[str] = None) -> Tensor:
    """x, checked when it runs: NonFiniteError naming this node and `message` if it holds NaN or Inf."""
    return make("CheckNumerics", (convert(x),), {"message": str(message)}, name=name).outputs[0]


def all_finite(xs: Sequence, names: Sequence[str] = (), name: Optional[str] = None) -> Tensor:
    """A bool scalar: no tensor of `xs` holds NaN or Inf (`names` name them in the warning)."""
    ts = [convert(x) for x in xs]
    return make("AllFinite", ts, {"names": tuple(names)}, name=name).outputs[0]


def checked_kernel(node, kernel):
    """`kernel` followed by the check of every float output (Session(check_numerics=True)): the
    first node whose output holds NaN or Inf, with finite inputs (they were checked), fails."""
    outs = [i for i, t in enumerate(node.outputs) if t.dtype.kind == "f"]
    if not outs:
        return kernel
    single = len(node.outputs) == 1

    def run(*args):
        got = kernel(*args)
        for i in outs:
            v = got if single else got[i]
            if hasattr(v, "ravel") and _finite(v):
                continue
            bad = non_finite(v)
            if bad is not None:
                raise NonFiniteError(f"node '{node.name}' ({node.op}) produced {bad} in output "
                                     f"'{node.outputs[i].name}' (check_numerics)", node.name, node.op)
        return got
    return run


def checked_feed(check, t: Tensor):
    """A feed check followed by the NaN/Inf check of a float feed (Session(check_numerics=True))."""
    if t.dtype.kind != "f":
        return check

    def run(v):
        v = check(v)
        bad = non_finite(v)
        if bad is not None:
            raise NonFiniteError(f"feed '{t.name}' holds {bad} (check_numerics)", t.node.name, t.node.op)
        return v
    return run
