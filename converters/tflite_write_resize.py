"""The edge's Resize as TFLite: RESIZE_NEAREST_NEIGHBOR / RESIZE_BILINEAR where one of their
(align_corners, half_pixel_centers) rules picks the edge's pixels, else a composite that is the edge
kernel itself: per resized axis a GATHER of constant indices (nearest) or two GATHERs blended by
constant weights (linear).

The edge resizes by ONNX's coordinate transforms (edge/kernels_shape.py); TFLite's builtins know three
of them. Rather than map names, the writer computes both index rules at write time (TFLite's in
float32, as its reference kernel does, and the 16-bit fixed point its optimized int8 nearest kernel
uses) and takes the builtin only when its pixels are the edge's. int8: nearest moves exact values; an
int8 linear resize runs RESIZE_BILINEAR on int8 where it is native, else the float composite between
DEQUANTIZE and QUANTIZE.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from .edge_geometry import ResizeAxis, resize_axes, resize_scales, resize_source
from .tflite_write_layout import LAYOUT_NHWC, PLAIN, Translator, stored, stored_axis
from .tflite_write_ops import handles

FLAGS = ((False, True), (False, False), (True, False))   # (align_corners, half_pixel_centers) TFLite accepts


def _tflite_scale(n: int, m: int, align: bool) -> np.float32:
    return np.float32(n - 1) / np.float32(m - 1) if align and m > 1 else np.float32(n) / np.float32(m)


def _tflite_nearest(n: int, m: int, align: bool, half: bool, int8: bool) -> np.ndarray:
    """TFLite's nearest source index of each output along an axis of n -> m."""
    o = np.arange(m)
    if int8 and not align and not half:       # optimized_ops' 16.16 fixed point
        step = ((n << 16) // m) + 1
        return np.minimum((o * step) >> 16, n - 1)
    v = (o.astype(np.float32) + np.float32(0.5 if half else 0.0)) * _tflite_scale(n, m, align)
    idx = np.sign(v) * np.floor(np.abs(v) + 0.5) if align else np.floor(v)   # TfLiteRound: half away from 0
    idx = np.minimum(idx.astype(np.int64), n - 1)
    return np.maximum(idx, 0) if half else idx


def _tflite_coordinate(n: int, m: int, align: bool, half: bool) -> np.ndarray:
    o = np.arange(m, dtype=np.float32)
    s = _tflite_scale(n, m, align)
    return ((o + np.float32(0.5)) * s - np.float32(0.5) if half else o * s).astype(np.float64)


def native_flags(attrs, shape, int8: bool) -> Optional[Tuple[bool, bool]]:
    """(align_corners, half_pixel_centers) under which TFLite's builtin resizes an NCHW tensor's H and W
    exactly as the edge does, or None."""
    if len(shape) != 4:
        return None
    plan = resize_scales(attrs, shape)
    if any(a not in (2, 3) for a, _, _ in plan):
        return None
    linear = attrs.get("mode", "nearest") == "linear"
    for align, half in FLAGS:
        ok = True
        for a, m, s in plan:
            n = shape[a]
            if linear:
                want = np.clip(resize_source(attrs, n, m, s), 0, n - 1)
                got = np.clip(_tflite_coordinate(n, m, align, half), 0, n - 1)
                ok = ok and bool(np.allclose(got, want, rtol=0, atol=1e-6 * n))
            else:
                want = [r for r in resize_axes(attrs, shape) if r.axis == a][0].i0
                ok = ok and bool(np.array_equal(_tflite_nearest(n, m, align, half, int8), want))
        if ok:
            return align, half
    return None


@handles("Resize")
def resize(tr: Translator, op) -> None:
    x, y = op.inputs[0], op.outputs[0]
    shape = tr.shape(x)
    int8 = tr.is_int8(x)
    linear = op.attrs.get("mode", "nearest") == "linear"
    flags = native_flags(op.attrs, shape, int8)
    if flags is not None:
        kind, opts = ("RESIZE_BILINEAR", "ResizeBilinearOptions") if linear else \
            ("RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions")
        size = tr.b.const(tr.m.tensors[y].name + "/size", np.asarray(tr.shape(y)[2:], np.int32))
        pair = tr.output(y, LAYOUT_NHWC, like_input=x)
        tr.b.op(kind, [tr.get(x, LAYOUT_NHWC), size], [pair[0]], opts, 2 if int8 else 1,
                AlignCorners=flags[0], HalfPixelCenters=flags[1])
        tr.finish(pair)
        return
    _composite(tr, op, resize_axes(op.attrs, shape))


def _composite(tr: Translator, op, plan: List[ResizeAxis]) -> None:
    """The edge kernel's steps: per resized axis GATHER (nearest) or GATHER, GATHER, MUL, MUL, ADD."""
    x, y = op.inputs[0], op.outputs[0]
    shape, name = tr.shape(x), tr.m.tensors[y].name
    layout = tr.preferred(x) if len(shape) == 4 else PLAIN
    float_island = tr.is_int8(x) and any(r.i1 is not None for r in plan)
    if not plan:
        pair = tr.output(y, layout, like_input=x)
        tr.b.op("RESHAPE", [tr.get(x, layout), tr.b.const(name + "/shape", np.asarray(
            stored(tr.reshape_target(y), layout), np.int32))], [pair[0]])
        tr.finish(pair)
        return
    src = tr.get(x, layout)
    dtype, q = (np.float32, {}) if not tr.is_int8(x) or float_island else (np.int8, tr.quant(x))
    if float_island:
        f = tr.scratch(name + "/float_in", np.float32, tr.b.tensors[src].shape)
        tr.b.op("DEQUANTIZE", [src], [f], version=2)
        src = f
    cur = list(shape)
    pair = tr.output(y, layout, like_input=x) if not float_island else (tr.new(y, layout), None)
    for k, r in enumerate(plan):
        cur[r.axis] = r.size
        last = k == len(plan) - 1
        dst = pair[0] if last and not float_island else tr.scratch(f"{name}/axis{r.axis}", dtype,
                                                                    stored(cur, layout), **q)
        ax = stored_axis(r.axis, len(shape), layout)
        if r.i1 is None:
            _gather(tr, src, r.i0, ax, dst, f"{name}/axis{r.axis}")
        else:
            _blend(tr, src, r, ax, dst, stored(cur, layout), f"{name}/axis{r.axis}")
        src = dst
    if float_island:
        tr.b.op("QUANTIZE", [src], [pair[0]], version=2)
    tr.finish(pair)


def _gather(tr: Translator, src: int, idx: np.ndarray, axis: int, dst: int, name: str) -> None:
    i = tr.b.const(name + "/indices", np.asarray(idx, np.int32))
    int8 = tr.b.tensors[src].dtype == np.int8
    tr.b.op("GATHER", [src, i], [dst], "GatherOptions", 2 if int8 else 1, Axis=axis, BatchDims=0)


def _blend(tr: Translator, src: int, r: ResizeAxis, axis: int, dst: int, shape, name: str) -> None:
    """dst = x[i0] w0 + x[i1] w1 along `axis`, the weights broadcast along it."""
    rank = len(shape)
    view = (-1,) + (1,) * (rank - axis - 1)
    taps = [tr.scratch(f"{name}/tap{k}", np.float32, shape) for k in range(4)]
    _gather(tr, src, r.i0, axis, taps[0], name + "/i0")
    _gather(tr, src, r.i1, axis, taps[1], name + "/i1")
    tr.b.op("MUL", [taps[0], tr.b.const(name + "/w0", r.w0.reshape(view))], [taps[2]], "MulOptions",
            FusedActivationFunction=0)
    tr.b.op("MUL", [taps[1], tr.b.const(name + "/w1", r.w1.reshape(view))], [taps[3]], "MulOptions",
            FusedActivationFunction=0)
    tr.b.op("ADD", [taps[2], taps[3]], [dst], "AddOptions", FusedActivationFunction=0)
