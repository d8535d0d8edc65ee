"""Ops whose outputs are chosen by a data-dependent algorithm (ONNX CumProd, Unique, NonMaxSuppression):
numpy kernels, output lengths known only at run time, no gradient (CumProd's would need the
products' division by zeros; the others are integer selections)."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import OpDef, elementwise_cost, register
from ..shapes import fmt, normalize_axis
from .base import convert, make

__all__ = ["cumprod", "unique", "non_max_suppression"]


# ---- CumProd -------------------------------------------------------------------------------------------
def _kernel_cumprod(node, ctx):
    xp, a = ctx.xp, node.attrs
    rank = len(node.inputs[0].shape)

    def run(x, axis_t=None):
        axis = normalize_axis(a["axis"] if axis_t is None else int(np.asarray(axis_t).reshape(-1)[0]), rank)
        y = xp.flip(x, axis) if a["reverse"] else x
        if a["exclusive"]:
            ones = xp.ones_like(xp.take(y, [0], axis=axis))
            y = xp.concatenate([ones, xp.take(y, xp.arange(y.shape[axis] - 1), axis=axis)], axis=axis)
        y = xp.cumprod(y, axis=axis, dtype=x.dtype)
        return xp.flip(y, axis) if a["reverse"] else y
    return run


register(OpDef("CumProd", inputs=("x", "*axis"), attrs={"axis": 0, "exclusive": False, "reverse": False},
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[0].shape)], kernel=_kernel_cumprod,
               cost=elementwise_cost(1), doc="Running products along axis (exclusive: shifted by one; reverse)."))


def cumprod(x, axis=0, exclusive: bool = False, reverse: bool = False, name: Optional[str] = None) -> Tensor:
    """Running products along `axis` (an int, or a scalar integer Tensor read at run time)."""
    x = convert(x)
    if not x.shape:
        raise ShapeError("cumprod needs rank >= 1")
    ins = (x,) + ((axis,) if isinstance(axis, Tensor) else ())
    return make("CumProd", ins, {"axis": 0 if isinstance(axis, Tensor) else int(axis), "exclusive": bool(exclusive),
                                 "reverse": bool(reverse)}, name=name).outputs[0]


# ---- Unique --------------------------------------------------------------------------------------------
def _infer_unique(node):
    x, axis = node.inputs[0], node.attrs["axis"]
    if axis is None:
        y = (None,)
    else:
        axis = normalize_axis(axis, len(x.shape))
        y = x.shape[:axis] + (None,) + x.shape[axis + 1:]
    return [(x.dtype, y), (np.dtype(np.int64), (None,)), (np.dtype(np.int64), (None,)),
            (np.dtype(np.int64), (None,))]


def _kernel_unique(node, ctx):
    axis, keep_sorted = node.attrs["axis"], node.attrs["sorted"]

    def run(x):
        x = np.asarray(x)
        ax = None if axis is None else normalize_axis(axis, x.ndim)
        y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=ax)
        inverse = inverse.reshape(-1)
        if not keep_sorted:  # the order of first occurrence
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(len(order))
            y = np.take(y, order, axis=0 if ax is None else ax)
            first, counts, inverse = first[order], counts[order], rank[inverse]
        i64 = np.int64
        return y, first.astype(i64), inverse.astype(i64), counts.astype(i64)
    return run


register(OpDef("Unique", inputs=("x",), attrs={"axis": None, "sorted": True}, infer=_infer_unique,
               kernel=_kernel_unique, cost=elementwise_cost(4),
               doc="ONNX Unique: values (or slices along axis), first indices, inverse indices, counts."))


def unique(x, axis: Optional[int] = None, sorted: bool = True, name: Optional[str] = None):  # noqa: A002
    return list(make("Unique", (convert(x),), {"axis": None if axis is None else int(axis), "sorted": bool(sorted)},
                     name=name).outputs)


# ---- NonMaxSuppression -------------------------------------------------------------------------------
def _infer_nms(node):
    boxes, scores = node.inputs[:2]
    if len(boxes.shape) != 3 or len(scores.shape) != 3:
        raise ShapeError(f"NonMaxSuppression needs boxes [N, boxes, 4] and scores [N, classes, boxes], "
                         f"got {fmt(boxes.shape)} and {fmt(scores.shape)}")
    return [(np.dtype(np.int64), (None, 3))]


def _iou(box, others, center):
    if center:
        box = np.array([box[0] - box[2] / 2, box[1] - box[3] / 2, box[0] + box[2] / 2, box[1] + box[3] / 2])
        others = np.stack([others[:, 0] - others[:, 2] / 2, others[:, 1] - others[:, 3] / 2,
                           others[:, 0] + others[:, 2] / 2, others[:, 1] + others[:, 3] / 2], 1)
    # corners may come in either order (ONNX: any diagonal pair)
    b = np.array([min(box[0], box[2]), min(box[1], box[3]), max(box[0], box[2]), max(box[1], box[3])])
    o = np.stack([np.minimum(others[:, 0], others[:, 2]), np.minimum(others[:, 1], others[:, 3]),
                  np.maximum(others[:, 0], others[:, 2]), np.maximum(others[:, 1], others[:, 3])], 1)
    inter = np.clip(np.minimum(b[2], o[:, 2]) - np.maximum(b[0], o[:, 0]), 0, None) * \
        np.clip(np.minimum(b[3], o[:, 3]) - np.maximum(b[1], o[:, 1]), 0, None)
    union = (b[2] - b[0]) * (b[3] - b[1]) + (o[:, 2] - o[:, 0]) * (o[:, 3] - o[:, 1]) - inter
    with np.errstate(all="ignore"):
        return np.where(union > 0, inter / union, 0.0)


def _kernel_nms(node, ctx):
    center = node.attrs["center_point_box"]

    def run(boxes, scores, max_out=None, iou_thr=None, score_thr=None):
        boxes, scores = np.asarray(boxes, np.float64), np.asarray(scores, np.float64)
        limit = int(np.asarray(max_out).reshape(-1)[0]) if max_out is not None and np.asarray(max_out).size else 0
        iou_t = float(np.asarray(iou_thr).reshape(-1)[0]) if iou_thr is not None and np.asarray(iou_thr).size else 0.0
        score_t = float(np.asarray(score_thr).reshape(-1)[0]) if score_thr is not None and \
            np.asarray(score_thr).size else None
        out = []
        for b in range(scores.shape[0]):
            for c in range(scores.shape[1]):
                s = scores[b, c]
                cand = [i for i in np.argsort(-s, kind="stable") if score_t is None or s[i] > score_t]
                kept = []
                for i in cand:
                    if len(kept) >= limit:
                        break
                    if not kept or np.all(_iou(boxes[b, i], boxes[b, kept], center) <= iou_t):
                        kept.append(i)
                out += [(b, c, i) for i in kept]
        return np.array(out, np.int64).reshape(-1, 3)
    return run


register(OpDef("NonMaxSuppression", inputs=("boxes", "scores", "*limits"), attrs={"center_point_box": 0},
               infer=_infer_nms, kernel=_kernel_nms, cost=elementwise_cost(8),
               doc="ONNX NonMaxSuppression: [selected, 3] rows of (batch, class, box), per class by score."))


def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None, score_threshold=None,
                        center_point_box: int = 0, name: Optional[str] = None) -> Tensor:
    ins = [convert(boxes), convert(scores)]
    for t in (max_output_boxes_per_class, iou_threshold, score_threshold):
        if t is None:
            break
        ins.append(convert(t))
    return make("NonMaxSuppression", ins, {"center_point_box": int(center_point_box)}, name=name).outputs[0]
