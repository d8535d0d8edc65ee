"""PadDynamic: pad (or crop, with negative amounts) by amounts known only at run time (ONNX Pad's
`pads` input computed from Shape/Size arithmetic). No gradient: use pad() with static amounts."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import OpDef, elementwise_cost, register
from ..shapes import fmt
from .base import convert, make

__all__ = ["pad_dynamic"]

MODES = ("constant", "reflect", "edge", "wrap")


def _infer(node):
    x, pads = node.inputs[0], node.inputs[1]
    if pads.dtype.kind not in "iu" or len(pads.shape) != 1 or pads.shape[0] != 2 * len(x.shape):
        raise ShapeError(f"pads must be a 1-D integer tensor of {2 * len(x.shape)} values for rank {len(x.shape)}, "
                         f"got {pads.dtype.name}{fmt(pads.shape)}")
    return [(x.dtype, (None,) * len(x.shape))]


def _kernel(node, ctx):
    xp, mode = ctx.xp, node.attrs["mode"]

    def run(x, pads, value=None):
        r = x.ndim
        before, after = [int(v) for v in pads[:r]], [int(v) for v in pads[r:]]
        grow = [(max(a, 0), max(b, 0)) for a, b in zip(before, after)]
        if mode == "constant":
            v = x.dtype.type(0 if value is None else np.asarray(value).reshape(-1)[0])
            y = xp.pad(x, grow, mode="constant", constant_values=v)
        else:
            if any((a or b) and d == 0 for (a, b), d in zip(grow, x.shape)):
                raise ValueError(f"{mode} padding of an empty axis (input {list(x.shape)}, pads {list(pads)})")
            if mode == "reflect" and any(max(a, b) >= d for (a, b), d in zip(grow, x.shape) if a or b):
                raise ValueError(f"reflect pads {list(pads)} need dims larger than the pads, input {list(x.shape)}")
            y = xp.pad(x, grow, mode=mode)
        crop = tuple(slice(-a if a < 0 else 0, (y.shape[k] + b) if b < 0 else None)
                     for k, (a, b) in enumerate(zip(before, after)))
        return y[crop]
    return run


register(OpDef("PadDynamic", inputs=("x", "pads", "*value"), attrs={"mode": "constant"}, infer=_infer,
               kernel=_kernel, cost=elementwise_cost(0),
               doc="ONNX Pad with run-time pads [begin..., end...]; negative amounts crop; "
                   "mode constant, reflect, edge or wrap. No gradient."))


def pad_dynamic(x, pads, value=None, mode: str = "constant", name: Optional[str] = None) -> Tensor:
    if mode not in MODES:
        raise ValueError(f"pad mode must be one of {', '.join(MODES)}, got {mode!r}")
    x = convert(x)
    ins = (x, convert(pads)) + (() if value is None else (convert(value, x.dtype),))
    return make("PadDynamic", ins, {"mode": mode}, name=name).outputs[0]
