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
        shape = tr.b.const(tr.m.tensors[y].name + "/shape", np.asarray(tr.reshape_target(y), np.int32))
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
        shape = tr.b.const(name + "/shape", np.asarray(tr.reshape_target(y), np.int32))
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



@handles("LeakyRelu")
def leaky_relu(tr: Translator, op) -> None:
    x, y = op.inputs[0], op.outputs[0]
    if tr.is_int8(x):
        raise tr.fail("an int8 LeakyRelu has no TFLite form here")
    layout = tr.preferred(x)
    tr.b.op("LEAKY_RELU", [tr.get(x, layout)], [tr.new(y, layout)], "LeakyReluOptions",
            Alpha=float(op.attrs.get("alpha", 0.2)))


@handles("Split")
def split(tr: Translator, op) -> None:
    """SPLIT_V along the axis (in x's layout); sizes from the outputs' shapes."""
    x = op.inputs[0]
    rank = len(tr.shape(x))
    axis = int(op.attrs.get("axis", 0)) % rank
    layout = tr.preferred(x) if rank == 4 else PLAIN
    sizes = np.asarray([tr.shape(y)[axis] for y in op.outputs], np.int32)
    name = tr.m.tensors[op.outputs[0]].name
    ax = tr.b.const(name + "/axis", np.asarray(stored_axis(axis, rank, layout), np.int32))
    tr.b.op("SPLIT_V", [tr.get(x, layout), tr.b.const(name + "/sizes", sizes), ax],
            [tr.new(y, layout) for y in op.outputs], "SplitVOptions", 2 if tr.is_int8(x) else 1,
            NumSplits=len(op.outputs))


@handles("LayerNorm")
def layer_norm(tr: Translator, op) -> None:
    """(x - mean) * rsqrt(var + eps) * gamma + beta over the trailing axes from `axis`, composed of
    MEAN, SUB, MUL, ADD and RSQRT (TFLite has no layer-norm builtin), in the graph's own layout."""
    x, g_e, b_e = op.inputs[:3]
    y = op.outputs[0]
    if tr.is_int8(x):
        raise tr.fail("an int8 LayerNorm has no TFLite form here")
    shape = tr.shape(x)
    axis = int(op.attrs.get("axis", -1)) % len(shape)
    name = tr.m.tensors[y].name
    red = tuple(shape[:axis]) + (1,) * (len(shape) - axis)
    axes = tr.b.const(name + "/axes", np.arange(axis, len(shape), dtype=np.int32))

    def t(suffix, shp):
        return tr.scratch(f"{name}/{suffix}", np.float32, shp)
    xi = tr.get(x)
    mean, d, sq, var, ve, r, n, scaled = (t("mean", red), t("centered", shape), t("squared", shape), t("var", red),
                                          t("var_eps", red), t("rsqrt", red), t("normed", shape), t("scaled", shape))
    tr.b.op("MEAN", [xi, axes], [mean], "ReducerOptions", KeepDims=True)
    tr.b.op("SUB", [xi, mean], [d], "SubOptions", FusedActivationFunction=0)
    tr.b.op("MUL", [d, d], [sq], "MulOptions", FusedActivationFunction=0)
    tr.b.op("MEAN", [sq, axes], [var], "ReducerOptions", KeepDims=True)
    eps = tr.b.const(name + "/eps", np.asarray([op.attrs.get("epsilon", 1e-5)], np.float32))
    tr.b.op("ADD", [var, eps], [ve], "AddOptions", FusedActivationFunction=0)
    tr.b.op("RSQRT", [ve], [r])
    tr.b.op("MUL", [d, r], [n], "MulOptions", FusedActivationFunction=0)
    tr.b.op("MUL", [n, tr.get(g_e)], [scaled], "MulOptions", FusedActivationFunction=0)
    tr.b.op("ADD", [scaled, tr.get(b_e)], [tr.new(y)], "AddOptions", FusedActivationFunction=0)
