"""Tensors of an edge model as TFLite tensors, each in the layout its consumer wants.

isthmus graphs are NCHW; TFLite's image ops are NHWC. Every edge tensor may exist in the TFLite
model in two layouts: "plain" (the edge tensor as it is) and "nhwc" (a rank-4 NCHW tensor
transposed by (0, 2, 3, 1)). An op asks for its inputs in the layout it needs; a TRANSPOSE is
written only where a tensor exists in the other layout alone, so a chain of image ops stays NHWC
with no transposes between them, and constants are transposed when written.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from isthmus.core.errors import GraphError
from isthmus.edge.loader import EdgeModel, OperatorInfo

from .tflite_write_fb import TFLiteBuilder

NHWC = (0, 2, 3, 1)      # stored nhwc = nchw.transpose(NHWC)
TO_NCHW = (0, 3, 1, 2)
PLAIN, LAYOUT_NHWC = "plain", "nhwc"


class TFLiteExportError(GraphError):
    """An edge model (or graph) the TFLite writer cannot express: names the operator and op."""


def stored(shape: Sequence[int], layout: str) -> Tuple[int, ...]:
    return tuple(shape[p] for p in NHWC) if layout == LAYOUT_NHWC else tuple(shape)


def stored_axis(axis: int, rank: int, layout: str) -> int:
    axis = axis % rank if rank else 0
    return NHWC.index(axis) if layout == LAYOUT_NHWC else axis


class Translator:
    """Maps (edge tensor, layout) to a TFLite tensor of `builder`, creating it on first use."""

    def __init__(self, model: EdgeModel, builder: TFLiteBuilder, batch: int = 1):
        self.m, self.b, self.batch = model, builder, batch
        self.ids: Dict[Tuple[int, str], int] = {}
        self.op: Optional[OperatorInfo] = None     # the op being translated (for errors)
        self.wanted: set = set()                   # the edge tensors the model outputs

    # ---- facts about edge tensors ------------------------------------------------------------------
    def fail(self, why: str) -> TFLiteExportError:
        where = f"operator '{self.m.tensors[self.op.outputs[0]].name}' ({self.op.op})" if self.op else "model"
        return TFLiteExportError(f"TFLite export: {where}: {why}")

    def shape(self, e: int) -> Tuple[int, ...]:
        s = tuple(self.batch if (d == -1 and k == 0) else d for k, d in enumerate(self.m.tensors[e].shape))
        if any(d < 0 for d in s):
            raise self.fail(f"tensor '{self.m.tensors[e].name}' has run-time dimensions {s}")
        return s

    def reshape_target(self, e: int) -> Tuple[int, ...]:
        """e's shape as a RESHAPE's new shape: a dynamic batch (-1 in the edge model) stays -1, so a
        file whose input signature says -1 still computes right after LiteRT resizes the input."""
        s = self.shape(e)
        dims = self.m.tensors[e].shape
        return (-1,) + s[1:] if dims and dims[0] == -1 else s

    def const(self, e: int) -> Optional[np.ndarray]:
        return None if e < 0 else self.m.tensors[e].data

    def quant(self, e: int) -> dict:
        t = self.m.tensors[e]
        if not len(t.scale):
            return {}
        zp = [int(z) for z in t.zero_point] if len(t.zero_point) else [0] * len(t.scale)  # empty: all zero
        return dict(scale=[float(s) for s in t.scale], zero_point=zp, axis=max(t.axis, 0))

    def is_int8(self, e: int) -> bool:
        return self.m.tensors[e].dtype == np.int8

    def layouts(self, e: int) -> List[str]:
        return [l for l in (LAYOUT_NHWC, PLAIN) if (e, l) in self.ids]

    def preferred(self, e: int) -> str:
        """The layout e already exists in (nhwc first); plain for constants and new tensors."""
        have = self.layouts(e)
        return have[0] if have else PLAIN

    # ---- tensors in a layout -----------------------------------------------------------------------
    def get(self, e: int, layout: str = PLAIN) -> int:
        if len(self.shape(e)) != 4:
            layout = PLAIN
        key = (e, layout)
        if key in self.ids:
            return self.ids[key]
        t = self.m.tensors[e]
        data = self.const(e)
        if data is not None:
            arr = np.asarray(data).reshape(self.shape(e))
            q = self.quant(e)
            if layout == LAYOUT_NHWC:
                arr = arr.transpose(NHWC)
                if q and len(q["scale"]) > 1:
                    q["axis"] = stored_axis(q["axis"], 4, layout)
            self.ids[key] = self.b.const(t.name + ("/nhwc" if layout == LAYOUT_NHWC else ""), arr, **q)
            return self.ids[key]
        other = LAYOUT_NHWC if layout == PLAIN else PLAIN
        if (e, other) not in self.ids:
            raise self.fail(f"tensor '{t.name}' is used before it is computed (is it an input of the model?)")
        perm = NHWC if layout == LAYOUT_NHWC else TO_NCHW
        if self.same_bytes(e):
            out = self.new(e, layout, suffix="/" + layout)
            shape = self.b.const(t.name + f"/{layout}/shape", np.asarray(stored(self.shape(e), layout), np.int32))
            self.b.op("RESHAPE", [self.ids[(e, other)], shape], [out])
            return out
        out = self.new(e, layout, suffix="/" + layout)
        p = self.b.const(t.name + f"/{layout}/perm", np.asarray(perm, np.int32))
        self.b.op("TRANSPOSE", [self.ids[(e, other)], p], [out], version=2 if self.is_int8(e) else 1)
        return out

    def same_bytes(self, e: int) -> bool:
        """NCHW and NHWC hold the same bytes when C == 1 or H * W == 1."""
        n, c, h, w = self.shape(e)
        return c == 1 or h * w == 1

    def new(self, e: int, layout: str = PLAIN, suffix: str = "", like: Optional[int] = None) -> int:
        """A new TFLite tensor holding edge tensor e in `layout` (registered as e's); `like`: take
        that edge tensor's quantization instead of e's own."""
        if len(self.shape(e)) != 4:
            layout = PLAIN
        t = self.m.tensors[e]
        q = self.quant(like if like is not None else e)
        sig = None
        if t.shape and t.shape[0] == -1:
            sig = (-1,) + stored(self.shape(e), layout)[1:]
        i = self.b.tensor(t.name + suffix, t.dtype, stored(self.shape(e), layout), signature=sig, **q)
        self.ids[(e, layout)] = i
        return i

    def scratch(self, name: str, dtype, shape: Sequence[int], **q) -> int:
        return self.b.tensor(name, dtype, tuple(shape), **q)

    def output(self, e: int, layout: str, like_input: Optional[int] = None) -> Tuple[int, Optional[int]]:
        """(tensor the op writes, None) or, where TFLite needs the op's output quantized like its
        input (`like_input`) and e's parameters differ, (a scratch tensor with the input's
        parameters, e's tensor): the caller writes the first, then `finish` requantizes."""
        if like_input is None or not self.is_int8(e) or self.same_q(e, like_input):
            return self.new(e, layout), None
        final = self.new(e, layout)
        tmp = self.b.tensor(self.m.tensors[e].name + "/requant", np.int8,
                            self.b.tensors[final].shape, **self.quant(like_input))
        return tmp, final

    def finish(self, pair: Tuple[int, Optional[int]]) -> None:
        tmp, final = pair
        if final is not None:
            self.b.op("QUANTIZE", [tmp], [final], version=2)

    def same_q(self, a: int, b: int) -> bool:
        qa, qb = self.quant(a), self.quant(b)
        return qa.get("zero_point") == qb.get("zero_point") and \
            np.allclose(qa.get("scale", []), qb.get("scale", []), rtol=1e-6, atol=0)

    def used(self, e: int) -> bool:
        """Whether any operator reads e or the model outputs it."""
        return e in self.wanted or any(e in op.inputs for op in self.m.operators)

    def alias(self, src: int, dst: int) -> None:
        for l in self.layouts(src):
            self.ids[(dst, l)] = self.ids[(src, l)]


def same_padding(size: int, k: int, s: int, d: int) -> Tuple[int, int]:
    """TFLite's SAME padding (before, after) for one spatial dimension."""
    out = math.ceil(size / s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2
