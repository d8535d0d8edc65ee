"""Einsum (ONNX Einsum, numpy's notation with explicit or implicit output and '...'): one record, its
gradient written as Einsums (so it differentiates again)."""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..errors import GraphError, ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, register
from ..shapes import broadcast, num_elements_est
from .base import convert, make
from .math import ones_like, reduce_sum_like

__all__ = ["einsum"]


def parse(equation: str, n: int) -> Tuple[List[str], str]:
    """(input subscripts, output subscripts) with the implicit output made explicit (numpy's rule:
    the letters used once, sorted, after '...' when any input has one)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != n:
        raise ShapeError(f"einsum '{equation}' names {len(ins)} operands, {n} given")
    if not arrow:
        letters = [ch for s in ins for ch in s.replace("...", "")]
        rhs = ("..." if any("..." in s for s in ins) else "") + "".join(
            sorted(ch for ch in set(letters) if letters.count(ch) == 1))
    return ins, rhs


def _infer(node):
    xs = node.inputs
    if len({t.dtype for t in xs}) != 1:
        raise ShapeError(f"einsum operands differ in dtype: {[t.dtype.name for t in xs]}")
    ins, out = parse(node.attrs["equation"], len(xs))
    sizes, ell = {}, ()
    for subs, t in zip(ins, xs):
        head, _, tail = subs.partition("...")
        n_ell = len(t.shape) - len(head) - len(tail)
        if n_ell < 0 or (n_ell and "..." not in subs):
            raise ShapeError(f"einsum operand {subs!r} does not fit shape {t.shape}")
        dims = list(t.shape)
        ell = broadcast(ell, tuple(dims[len(head):len(head) + n_ell]))
        for ch, d in zip(head + tail, dims[:len(head)] + dims[len(head) + n_ell:]):
            known = sizes.get(ch)
            if d is not None and d != 1 and known not in (None, 1) and known != d:
                raise ShapeError(f"einsum: '{ch}' is {known} in one operand and {d} in another")
            if known in (None, 1) and d is not None:
                sizes[ch] = d if known is None or d != 1 else known
            sizes.setdefault(ch, d)
    head, _, tail = out.partition("...")
    shape = [sizes.get(ch) for ch in head] + (list(ell) if "..." in out else []) + [sizes.get(ch) for ch in tail]
    return [(xs[0].dtype, tuple(shape))]


def _kernel(node, ctx):
    xp, eq = ctx.xp, node.attrs["equation"]
    return lambda *xs: xp.asarray(xp.einsum(eq, *xs))


def _explicit(ins: List[str], out: str, ranks: List[int]) -> Tuple[List[str], str]:
    """The subscripts with '...' replaced by letters of their own (right-aligned, as broadcasting aligns)."""
    n = max((r - len(sub.replace("...", "")) for sub, r in zip(ins, ranks) if "..." in sub), default=0)
    used = set("".join(ins) + out)
    free = [ch for ch in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if ch not in used][:n]

    def fill(sub: str, k: int) -> str:
        return sub.replace("...", "".join(free[n - k:]))
    ins2 = [fill(sub, r - len(sub.replace("...", ""))) for sub, r in zip(ins, ranks)]
    return ins2, fill(out, n)


def _grad(node, dys):
    dy = dys[0]
    xs = list(node.inputs)
    ins, out = _explicit(*parse(node.attrs["equation"], len(xs)), [len(t.shape) for t in xs])
    grads = []
    for i, (subs, x) in enumerate(zip(ins, xs)):
        named = subs.replace("...", "")
        if len(set(named)) != len(named):
            raise GraphError(f"node '{node.name}' (Einsum): no gradient for a repeated index in {subs!r}")
        # dy and the other operands contracted back to operand i; ones shaped like x supply the letters
        # only x has (summed in the forward pass, broadcast back here)
        others = [(s, t) for k, (s, t) in enumerate(zip(ins, xs)) if k != i]
        eq = ",".join([out] + [s for s, _ in others] + [subs]) + "->" + subs
        g = einsum(eq, dy, *[t for _, t in others], ones_like(x))
        grads.append(reduce_sum_like(g, x))
    return grads


def _cost(node) -> Cost:
    item = node.outputs[0].dtype.itemsize
    read = sum(num_elements_est(t.shape) for t in node.inputs) * item
    return Cost(2 * max(num_elements_est(t.shape) for t in node.inputs) * num_elements_est(node.outputs[0].shape) ** 0.5,
                read, num_elements_est(node.outputs[0].shape) * item)


register(OpDef("Einsum", inputs=("x0", "*xs"), attrs={"equation": ""}, infer=_infer, kernel=_kernel, grad=_grad,
               cost=_cost, doc="numpy.einsum(equation, *operands)."))


def einsum(equation: str, *operands, name: Optional[str] = None) -> Tensor:
    xs = [convert(x) for x in operands]
    return make("Einsum", xs, {"equation": str(equation)}, name=name).outputs[0]
