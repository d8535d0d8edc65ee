"""Data-movement and reduction ops as TFLite builtins: TRANSPOSE, GATHER, STRIDED_SLICE, RESIZE_*,
MEAN (ops outside isthmus's edge interpreter, written by tflite_write_graph.py's fp32 path)."""
from __future__ import annotations

import numpy as np

from .tflite_write_layout import LAYOUT_NHWC, PLAIN, TO_NCHW, Translator, stored_axis
from .tflite_write_ops import handles


@handles("Transpose")
def transpose(tr: Translator, op) -> None:
    """One TRANSPOSE from whichever layout x exists in: an NHWC x's perm is composed with NHWC->NCHW."""
    x, y = op.inputs[0], op.outputs[0]
    perm = [int(p) for p in op.attrs["perm"]]
    src = tr.preferred(x) if tr.const(x) is None else PLAIN
    if src == LAYOUT_NHWC and len(perm) == 4:
        perm = [TO_NCHW[p] for p in perm]
    else:
        src = PLAIN
    xi = tr.get(x, src)
    out = tr.new(y, PLAIN)
    if perm == list(range(len(perm))):
        shape = tr.b.const(tr.m.tensors[y].name + "/shape", np.asarray(tr.shape(y), np.int32))
        tr.b.op("RESHAPE", [xi, shape], [out])
        return
    p = tr.b.const(tr.m.tensors[y].name + "/perm", np.asarray(perm, np.int32))
    tr.b.op("TRANSPOSE", [xi, p], [out], version=2 if tr.is_int8(x) else 1)


@handles("Gather")
def gather(tr: Translator, op) -> None:
    params, idx, y = op.inputs[0], op.inputs[1], op.outputs[0]
    axis = int(op.attrs.get("axis", 0))
    ii = tr.get(idx)
    if tr.const(idx) is not None and np.asarray(tr.const(idx)).dtype != np.int32:
        ii = tr.b.const(tr.m.tensors[idx].name + "/int32", np.asarray(tr.const(idx)).reshape(tr.shape(idx)).astype(np.int32))
    tr.b.op("GATHER", [tr.get(params), ii], [tr.new(y)], "GatherOptions", Axis=axis, BatchDims=0)


@handles("StridedSlice")
def strided_slice(tr: Translator, op) -> None:
    x, y = op.inputs[0], op.outputs[0]
    a = op.attrs
    name = tr.m.tensors[y].name
    begin, end, strides = (np.asarray(a[k], np.int32) for k in ("begin", "end", "strides"))
    sliced = tuple(len(range(b, e, s)) if not (int(a.get("end_mask", 0)) >> k) & 1 else len(range(b, -1, s))
                   for k, (b, e, s) in enumerate(zip(begin, end, strides)))
    target = tr.shape(y)
    out = tr.new(y) if sliced == target else tr.scratch(name + "/sliced", tr.m.tensors[y].dtype, sliced,
                                                          **tr.quant(y))
    tr.b.op("STRIDED_SLICE", [tr.get(x), tr.b.const(name + "/begin", begin), tr.b.const(name + "/end", end),
                              tr.b.const(name + "/strides", strides)], [out], "StridedSliceOptions",
            BeginMask=0, EndMask=int(a.get("end_mask", 0)), EllipsisMask=0, NewAxisMask=0, ShrinkAxisMask=0)
    if sliced != target:
        shape = tr.b.const(name + "/shape", np.asarray(target, np.int32))
        tr.b.op("RESHAPE", [out, shape], [tr.new(y)])


@handles("Resize")
def resize(tr: Translator, op) -> None:
    x, y = op.inputs[0], op.outputs[0]
    a = op.attrs
    size = tr.b.const(tr.m.tensors[y].name + "/size", np.asarray(tr.shape(y)[2:], np.int32))
    kind, opts = ("RESIZE_BILINEAR", "ResizeBilinearOptions") if a["mode"] == "linear" else \
        ("RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions")
    tr.b.op(kind, [tr.get(x, LAYOUT_NHWC), size], [tr.new(y, LAYOUT_NHWC)], opts,
            AlignCorners=bool(a["align_corners"]), HalfPixelCenters=bool(a["half_pixel_centers"]))


@handles("ReduceMean")
def reduce_mean(tr: Translator, op) -> None:
    x, y = op.inputs[0], op.outputs[0]
    rank = len(tr.shape(x))
    keep = bool(int(op.attrs.get("keepdims", 0)))
    layout = tr.preferred(x)
    axes = [stored_axis(int(ax), rank, layout) for ax in op.attrs["axes"]]
    out_layout = layout if keep else PLAIN
    if not keep and layout == LAYOUT_NHWC and sorted(axes) != [1, 2] and len(axes) != rank:
        layout, axes = PLAIN, [int(ax) % rank for ax in op.attrs["axes"]]  # the kept dims' order must be NCHW's
    a = tr.b.const(tr.m.tensors[y].name + "/axes", np.asarray(sorted(axes), np.int32))
    tr.b.op("MEAN", [tr.get(x, layout), a], [tr.new(y, out_layout if keep else PLAIN)], "ReducerOptions",
            2 if tr.is_int8(x) else 1, KeepDims=keep)

