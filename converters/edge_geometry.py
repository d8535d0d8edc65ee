"""The edge kernels' own reading of StridedSlice and Resize attributes, for the format writers.

Both writers (TFLite, ONNX) must compute what isthmus's edge interpreter computes, so they ask the
edge's rule (edge/kernels_shape.py: slice_index, resize_plan and the coordinate transforms) rather
than spelling it a second time: a StridedSlice becomes per-axis (begin, end, step) over the input
plus the output shape, a Resize becomes per resized axis its gather indices (nearest) or its two
taps and weights (linear).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple

import numpy as np

from isthmus.edge.kernels_shape import nearest_indices, resize_plan, slice_index, source_coordinates
from isthmus.edge.opcontext import OpContext


@dataclass
class SliceAxis:
    """One input axis of a StridedSlice: x[begin:end:step] (end None: through the first element, for a
    negative step), `kept` False when the axis is indexed away."""
    begin: int
    end: Optional[int]
    step: int
    size: int
    kept: bool

    def full(self, d: int) -> bool:
        return self.begin == 0 and self.end == d and self.step == 1


def slice_axes(attrs: Mapping, shape: Sequence[int]) -> Tuple[List[SliceAxis], Tuple[int, ...]]:
    """(one SliceAxis per input axis, the output shape) of a StridedSlice with the edge's attributes."""
    index, out = slice_index(OpContext("StridedSlice", dict(attrs), [], []), tuple(shape))
    axes, dim = [], 0
    for entry in index[:-1]:                       # the trailing Ellipsis keeps the rest
        if entry is None:
            continue
        d = shape[dim]
        if isinstance(entry, slice):
            start, stop, step = entry.indices(d)
            n = len(range(start, stop, step))
            axes.append(SliceAxis(start, None if stop < 0 else stop, step, n, True))
        else:
            i = int(entry) % d
            axes.append(SliceAxis(i, i + 1, 1, 1, False))
        dim += 1
    axes.extend(SliceAxis(0, d, 1, d, True) for d in shape[dim:])
    return axes, tuple(out)


def keeps_first_axis(attrs: Mapping) -> bool:
    """Whether a StridedSlice takes its input's axis 0 whole whatever its size (no bounds given on it):
    what a free batch dimension needs."""
    kinds = list(attrs.get("kinds", ()))
    k = next((j for j, kind in enumerate(kinds) if kind != 2), None)   # the entry on input axis 0
    if k is None:
        return True
    given, begin, step = attrs["given"][k], attrs["begin"][k], attrs["step"][k]
    return kinds[k] == 1 and not given & 2 and (not given & 1 or begin == 0) and (not given & 4 or step == 1)


@dataclass
class ResizeAxis:
    """One resized axis: output size m; nearest: y = x[i0]; linear: y = w0 x[i0] + w1 x[i1]."""
    axis: int
    size: int
    i0: np.ndarray
    i1: Optional[np.ndarray] = None
    w0: Optional[np.ndarray] = None
    w1: Optional[np.ndarray] = None


def resize_axes(attrs: Mapping, shape: Sequence[int]) -> List[ResizeAxis]:
    """The axes a Resize with the edge's attributes changes, with the edge kernel's indices and
    weights (float32, as the kernel blends), in the order the kernel resizes them."""
    ctx = OpContext("Resize", dict(attrs), [], [])
    mode = attrs.get("mode", "nearest")
    coord = attrs.get("coordinate_mode", "half_pixel")
    rule = attrs.get("nearest_mode", "round_prefer_floor")
    out, cur = [], list(shape)
    for a, m, s in resize_plan(ctx, tuple(shape)):
        n = cur[a]
        x = source_coordinates(coord, n, m, s)
        if mode == "nearest":
            out.append(ResizeAxis(a, m, nearest_indices(rule, x, n)))
        else:
            x = np.clip(x, 0, n - 1)
            i0 = np.floor(x).astype(np.intp)
            w1 = x - i0
            out.append(ResizeAxis(a, m, i0, np.minimum(i0 + 1, n - 1), (1.0 - w1).astype(np.float32),
                                  w1.astype(np.float32)))
        cur[a] = m
    return out


def resize_source(attrs: Mapping, n: int, m: int, s: float) -> np.ndarray:
    """The edge's input coordinate of each of m outputs along an axis of n (before clipping)."""
    return source_coordinates(attrs.get("coordinate_mode", "half_pixel"), n, m, s)


def resize_scales(attrs: Mapping, shape: Sequence[int]) -> List[Tuple[int, int, float]]:
    """(axis, output size, scale) of every resized axis (the edge's resize_plan)."""
    return resize_plan(OpContext("Resize", dict(attrs), [], []), tuple(shape))


__all__ = ["SliceAxis", "slice_axes", "keeps_first_axis", "ResizeAxis", "resize_axes", "resize_source",
           "resize_scales"]
