"""The exact GELU written out as five nodes becomes one Gelu node.

ONNX before opset 20 has no Gelu, so exporters (PyTorch's, isthmus's own to_onnx) write
x * 0.5 * (1 + erf(x / sqrt(2))) as Mul or Div -> Erf -> Add -> Mul -> Mul; a transformer's
feed-forward layers then make five passes over their widest tensor, where core's Gelu kernel makes
one compiled pass (jit.erf.gelu_erf). The shapes matched, whatever the order of each commutative
node's operands:

    y = (x * (erf(x * c) + 1)) * 0.5        (torch and to_onnx)
    y = (x * 0.5) * (erf(x * c) + 1)
    y = x * ((erf(x * c) + 1) * 0.5)

with c = 1/sqrt(2) as a constant scalar of x's dtype (or x / sqrt(2)), every intermediate read by
the next node only, nothing pinned. With `x * c` at x's dtype the fused node gives the same bits as
the five (Gelu scales by 0.5 first, which is exact); `x / sqrt(2)` may round erf's argument
differently in its last bit. An executor pass (SESSION_PASSES): the edge and the exporters keep
what the graph says, and the partitioner prices the nodes as written (their sum is the larger).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..graph import Node, Tensor
from .fusion import Builder, _consumers, _pinned, _rebuild, _users
from .simplify import Rewrite

_INV_SQRT2, _SQRT2 = 1.0 / math.sqrt(2.0), math.sqrt(2.0)


def _scalar(t: Tensor, dtype) -> Optional[float]:
    """The value of a constant scalar (or one-element) tensor of `dtype`, else None."""
    if t.node.op != "Const":
        return None
    v = t.node.attrs["value"]
    if v.size != 1 or v.dtype != dtype:
        return None
    return float(v.reshape(-1)[0])


def _other(n: Node, t: Tensor) -> Optional[Tensor]:
    """The operand of a two-input node that is not `t` (None when t is not one of them)."""
    a, b = n.inputs
    return b if a is t else a if b is t else None


def _is(v: Optional[float], want: float, dtype) -> bool:
    return v is not None and v == float(np.dtype(dtype).type(want))


def _argument(e: Node) -> Optional[Tensor]:
    """x where Erf `e` reads x * c or x / sqrt(2) (c = 1/sqrt(2) in x's dtype)."""
    m = e.inputs[0].node
    if m.control_inputs or len(m.inputs) != 2:
        return None
    dt = e.inputs[0].dtype
    if m.op == "Mul":
        for x, c in ((m.inputs[0], m.inputs[1]), (m.inputs[1], m.inputs[0])):
            if _is(_scalar(c, dt), _INV_SQRT2, dt) and x.shape == e.inputs[0].shape:
                return x
    if m.op == "Div" and _is(_scalar(m.inputs[1], dt), _SQRT2, dt) and m.inputs[0].shape == e.inputs[0].shape:
        return m.inputs[0]
    return None


def _match(e: Node, users: Dict[Tensor, List[Node]], uses: Dict[Tensor, int]) -> Optional[Tuple[Node, list, Tensor]]:
    """(the last node, the nodes folded into it, x) of a GELU around Erf `e`, else None."""
    def only(t: Tensor) -> Optional[Node]:
        r = users.get(t, [])
        return r[0] if uses.get(t, 0) == 1 and len(r) == 1 and not r[0].control_inputs else None
    x = _argument(e)
    dt = e.outputs[0].dtype
    if x is None or dt.kind != "f" or uses.get(e.inputs[0], 0) != 1:
        return None
    add = only(e.outputs[0])
    if add is None or add.op != "Add" or not _is(_scalar(_other(add, e.outputs[0]), dt), 1.0, dt):
        return None
    nxt = only(add.outputs[0])
    if nxt is None or nxt.op != "Mul":
        return None
    other = _other(nxt, add.outputs[0])
    folded = [e.inputs[0].node, e, add]
    if other is x:  # (x * (erf + 1)) * 0.5
        last = only(nxt.outputs[0])
        if last is None or last.op != "Mul" or not _is(_scalar(_other(last, nxt.outputs[0]), dt), 0.5, dt):
            return None
        return last, folded + [nxt], x
    if _is(_scalar(other, dt), 0.5, dt):  # x * ((erf + 1) * 0.5)
        last = only(nxt.outputs[0])
        if last is None or last.op != "Mul" or _other(last, nxt.outputs[0]) is not x:
            return None
        return last, folded + [nxt], x
    h = other.node  # (x * 0.5) * (erf + 1)
    if (h.op == "Mul" and not h.control_inputs and uses.get(other, 0) == 1
            and any(t is x for t in h.inputs) and _is(_scalar(_other(h, x), dt), 0.5, dt)):
        return nxt, folded + [h], x
    return None


def fuse_gelu(rw: Rewrite) -> Rewrite:
    """Every exact GELU written out as Mul/Div, Erf, Add, Mul, Mul becomes one Gelu node named after
    its last node (module docstring)."""
    g = rw.graph
    users = _users(rw)
    uses = _consumers(g, {f for f in rw.fetches if isinstance(f, Tensor)})
    pinned = _pinned(rw)
    groups: Dict[Node, Tensor] = {}
    skip = set()
    for n in g.nodes:
        if n.op != "Erf" or n.control_inputs:
            continue
        hit = _match(n, users, uses)
        if hit is None:
            continue
        last, folded, x = hit
        if last in groups or any(m in pinned or m in skip for m in folded + [last]):
            continue
        groups[last] = x
        skip.update(folded)
    if not groups:
        return rw

    def rewrite(n: Node, b: Builder):
        if n in skip:
            return []
        x = groups.get(n)
        if x is None:
            return None
        return [b.g.add_node("Gelu", [b.map[x]], {"approximate": "none"}, name=n.name, device=n.device).outputs[0]]
    return _rebuild(rw, rewrite, "gelu")


__all__ = ["fuse_gelu"]
