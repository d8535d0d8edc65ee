"""ONNX Resize (opset 11+) onto core Resize: nearest, linear and cubic, the common coordinate modes.

Scales or sizes known at import become attributes; computed ones feed the op at run time.
Antialiasing widens the linear/cubic filter on downscales. tf_crop_and_resize (linear) is a separable
gather per resized axis over the run-time roi, outside points taking extrapolation_value.
"""
from __future__ import annotations

import numpy as np

import isthmus.core as ism
from isthmus.core.ops.arange import arange
from isthmus.core.ops.image import COORDINATE_MODES, NEAREST_MODES, resize

from .onnx_import import ImportError_, _attrs, _s, handler


@handler("Resize", 11, attrs=("antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a",
                                 "exclude_outside", "extrapolation_value", "keep_aspect_ratio_policy", "mode",
                                 "nearest_mode"))
def _resize(c, node, ins):
    at = _attrs(node)
    where = f"node '{node.name or 'Resize'}' (Resize)"
    x = ins[0]
    rank = len(x.shape)
    mode = _s(at.get("mode", "nearest"))
    coord = _s(at.get("coordinate_transformation_mode", "half_pixel"))
    nearest = _s(at.get("nearest_mode", "round_prefer_floor"))
    if mode not in ("nearest", "linear", "cubic"):
        raise ImportError_(f"{where}: mode '{mode}' is not supported (nearest, linear and cubic are)")
    axes = [int(a) % rank for a in at.get("axes", [])] or list(range(rank))
    if coord == "tf_crop_and_resize":
        return [_crop_and_resize(c, node, ins, axes, mode, float(at.get("extrapolation_value", 0.0)))]
    if coord not in COORDINATE_MODES:
        raise ImportError_(f"{where}: coordinate_transformation_mode '{coord}' is not supported "
                           f"({', '.join(COORDINATE_MODES)} are)")
    if mode == "nearest" and nearest not in NEAREST_MODES:
        raise ImportError_(f"{where}: nearest_mode '{nearest}' is not supported")
    policy = _s(at.get("keep_aspect_ratio_policy", "stretch"))

    def given(k):  # (constant array or None, run-time tensor or None) for input k
        if len(node.input) <= k or not node.input[k]:
            return None, None
        if node.input[k] in c.consts:
            v = np.asarray(c.consts[node.input[k]])
            return (v if v.size else None), None
        return None, ins[k]
    scales, scales_t = given(2)
    sizes, sizes_t = given(3)
    if scales is None and scales_t is None and sizes is None and sizes_t is None:
        raise ImportError_(f"{where}: needs scales or sizes")
    kw = dict(mode=mode, coordinate_mode=coord, nearest_mode=nearest,
              cubic_coeff_a=float(at.get("cubic_coeff_a", -0.75)), exclude_outside=bool(at.get("exclude_outside", 0)),
              antialias=bool(at.get("antialias", 0)))
    if scales_t is not None or sizes_t is not None:
        return [resize(x, param=scales_t if scales_t is not None else sizes_t,
                       param_kind="scales" if scales_t is not None else "sizes", axes=axes, policy=policy, **kw)]
    if scales is not None:
        full = [1.0] * rank
        for a, s in zip(axes, scales.reshape(-1)):
            full[a] = float(s)
        return [resize(x, scales=full, **kw)]
    full_sizes = list(x.shape)
    for a, s in zip(axes, sizes.reshape(-1)):
        full_sizes[a] = int(s)
    if policy != "stretch":
        if any(x.shape[a] is None for a in axes):
            raise ImportError_(f"{where}: keep_aspect_ratio_policy '{policy}' needs known input dims")
        ratios = [full_sizes[a] / x.shape[a] for a in axes]
        scale = min(ratios) if policy == "not_larger" else max(ratios)
        full = [1.0] * rank
        for a in axes:
            full[a] = scale
            full_sizes[a] = int(np.floor(x.shape[a] * scale + 0.5))
        return [resize(x, scales=full, sizes=full_sizes, **kw)]
    if any(d is None for d in full_sizes):
        unknown = [a for a, d in enumerate(full_sizes) if d is None]
        raise ImportError_(f"{where}: sizes leave axes {unknown} of an input with unknown dims unspecified")
    return [resize(x, sizes=full_sizes, **kw)]


def _crop_and_resize(c, node, ins, axes, mode: str, extrapolation: float):
    """Per resized axis of size L to n points: x_i = start (L-1) + i (end - start) (L-1) / (n-1) (n > 1;
    the middle 0.5 (start + end) (L-1) for n = 1), linear between the two neighbours, and points with
    x_i outside [0, L-1] = extrapolation_value; roi and sizes may be known only at run time."""
    x = ins[0]
    if mode != "linear":
        raise ImportError_(f"tf_crop_and_resize is supported in linear mode, not '{mode}'")
    if len(node.input) < 2 or not node.input[1] or len(node.input) < 4 or not node.input[3]:
        raise ImportError_("tf_crop_and_resize needs the roi and sizes inputs")
    if any(x.shape[a] is None for a in axes):
        raise ImportError_("tf_crop_and_resize needs the resized axes' input sizes known at import")
    dt = x.dtype if x.dtype.kind == "f" else np.dtype(np.float32)
    roi, sizes = ism.cast(ism.reshape(ins[1], (-1,)), dt), ism.cast(ism.reshape(ins[3], (-1,)), np.int64)
    y = x if x.dtype == dt else ism.cast(x, dt)
    for k, a in enumerate(axes):
        size, n = x.shape[a], ism.reshape(sizes[k:k + 1], ())
        start, end = ism.reshape(roi[k:k + 1], ()), ism.reshape(roi[k + len(axes):k + len(axes) + 1], ())
        i = ism.cast(arange(ism.constant(np.array(0, np.int64)), n), dt)
        nf = ism.cast(n, dt)
        span = ism.mul(ism.sub(end, start), float(size - 1))
        pos = ism.where(ism.greater(nf, 1.0),
                        ism.add(ism.mul(start, float(size - 1)), ism.div(ism.mul(i, span), ism.maximum(ism.sub(nf, 1.0), 1.0))),
                        ism.add(ism.zeros_like(i), ism.mul(ism.add(start, end), 0.5 * (size - 1))))
        inside = ism.minimum(ism.maximum(pos, 0.0), float(size - 1))
        lo = ism.floor(inside)
        hi = ism.minimum(ism.add(lo, 1.0), float(size - 1))
        shape = [1] * len(x.shape)
        shape[a] = -1
        t = ism.reshape(ism.sub(inside, lo), shape)
        v0, v1 = (ism.gather(y, ism.cast(q, np.int64), a) for q in (lo, hi))
        y = ism.add(v0, ism.mul(ism.sub(v1, v0), t))
        outside = ism.reshape(ism.logical_or(ism.less(pos, 0.0), ism.greater(pos, float(size - 1))), shape)
        y = ism.where(outside, ism.add(ism.zeros_like(y), extrapolation), y)
    return y if y.dtype == x.dtype else ism.cast(y, x.dtype)


def _upsample_mode(at) -> str:
    mode = _s(at.get("mode", "nearest"))
    if mode == "bilinear":  # an old alias ONNX kept for Upsample
        mode = "linear"
    if mode not in ("nearest", "linear"):
        raise ImportError_(f"mode '{mode}' is not supported (nearest and linear are)")
    return mode


def _scaled(c, node, ins, scales):
    """Upsample (7-9) and Resize 10: scale every axis, asymmetric coordinates, nearest rounds down."""
    x = ins[0]
    mode = _upsample_mode(_attrs(node))
    if scales is None:
        return [resize(x, param=ins[1], param_kind="scales", axes=list(range(len(x.shape))), policy="stretch",
                       mode=mode, coordinate_mode="asymmetric", nearest_mode="floor")]
    scales = [float(s) for s in np.asarray(scales).reshape(-1)]
    if len(scales) != len(x.shape):
        raise ImportError_(f"{len(scales)} scales for an input of rank {len(x.shape)}")
    return [resize(x, scales=scales, mode=mode, coordinate_mode="asymmetric", nearest_mode="floor")]


@handler("Upsample", 7, attrs=("mode", "scales"))
def _upsample7(c, node, ins):
    at = _attrs(node)
    if "scales" not in at:
        raise ImportError_("the scales attribute is required")
    return _scaled(c, node, ins, at["scales"])


@handler("Upsample", 9, attrs=("mode",))
@handler("Resize", 10, attrs=("mode",))
def _upsample9(c, node, ins):
    return _scaled(c, node, ins, c.const_or_none(node, 1))
