"""Data-movement and reduction ops as TFLite builtins: TRANSPOSE, GATHER, STRIDED_SLICE, SQUEEZE,
EXPAND_DIMS, MEAN / SUM / REDUCE_MAX, LEAKY_RELU, SPLIT_V and LayerNorm's composite, reading the edge
kernels' attributes (edge/capabilities.py); int8 moves keep the input's parameters (a QUANTIZE after
them where the output's differ)."""
from __future__ import annotations

import numpy as np

from .edge_geometry import keeps_first_axis, slice_axes
from .tflite_write_layout import LAYOUT_NHWC, NHWC, PLAIN, TO_NCHW, Translator, stored_axis
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
    pair = tr.output(y, PLAIN, like_input=x)     # int8: the input's parameters, requantized after if y's differ
    if perm == list(range(len(perm))):
        shape = tr.b.const(tr.m.tensors[y].name + "/shape", np.asarray(tr.reshape_target(y), np.int32))
        tr.b.op("RESHAPE", [xi, shape], [pair[0]])
    else:
        p = tr.b.const(tr.m.tensors[y].name + "/perm", np.asarray(perm, np.int32))
        tr.b.op("TRANSPOSE", [xi, p], [pair[0]], version=2 if tr.is_int8(x) else 1)
    tr.finish(pair)


@handles("Gather")
def gather(tr: Translator, op) -> None:
    """GATHER along the normalized axis; negative indices count from the end (the edge's rule): constant
    ones are normalized here, run-time ones pass FLOOR_MOD by the axis size."""
    params, idx, y = op.inputs[0], op.inputs[1], op.outputs[0]
    shape = tr.shape(params)
    axis = int(op.attrs.get("axis", 0)) % len(shape)
    d, name = shape[axis], tr.m.tensors[y].name
    c = tr.const(idx)
    if c is not None:
        v = np.asarray(c).reshape(tr.shape(idx)).astype(np.int64)
        if v.size and (v.min() < -d or v.max() >= d):
            raise tr.fail(f"constant indices '{tr.m.tensors[idx].name}' leave [-{d}, {d}) on axis {axis}")
        ii = tr.b.const(name + "/indices", np.where(v < 0, v + d, v).astype(np.int32))
    else:
        dt = tr.m.tensors[idx].dtype
        ii = tr.scratch(name + "/indices", dt, tr.shape(idx))
        tr.b.op("FLOOR_MOD", [tr.get(idx), tr.b.const(name + "/axis_size", np.asarray(d, dt))], [ii])
    # a rank-4 tensor held NHWC gathers there when the indices are a vector (the output stays rank 4)
    layout = tr.preferred(params) if len(shape) == 4 and len(tr.shape(idx)) == 1 else PLAIN
    pair = tr.output(y, layout, like_input=params)
    tr.b.op("GATHER", [tr.get(params, layout), ii], [pair[0]], "GatherOptions", 2 if tr.is_int8(params) else 1,
            Axis=stored_axis(axis, len(shape), layout), BatchDims=0)
    tr.finish(pair)


@handles("StridedSlice")
def strided_slice(tr: Translator, op) -> None:
    """STRIDED_SLICE over every input axis (an indexed axis kept as size 1), then a RESHAPE to the
    output's shape (dropping indexed axes, adding new ones). A rank-4 tensor held NHWC is sliced there
    when no axis is indexed or added."""
    x, y = op.inputs[0], op.outputs[0]
    shape, name = tr.shape(x), tr.m.tensors[y].name
    axes, out = slice_axes(op.attrs, shape)
    layout = tr.preferred(x) if len(shape) == 4 and len(out) == 4 and all(a.kept for a in axes) else PLAIN
    order = list(NHWC) if layout == LAYOUT_NHWC else list(range(len(shape)))
    free_batch = bool(tr.m.tensors[x].shape) and tr.m.tensors[x].shape[0] == -1
    begin, end, step, begin_mask, end_mask = [], [], [], 0, 0
    if free_batch and not keeps_first_axis(op.attrs):
        raise tr.fail("a slice of the free batch dimension (its bounds would be fixed at the written batch)")
    for j, k in enumerate(order):
        a = axes[k]
        if a.full(shape[k]):                               # a whole axis (a free batch too): mask bits
            begin_mask, end_mask = begin_mask | 1 << j, end_mask | 1 << j
        elif a.end is None:                                # a negative step through the first element
            end_mask |= 1 << j
        begin.append(a.begin), end.append(0 if a.end is None else a.end), step.append(a.step)
    sliced = tuple(axes[k].size for k in order)
    same = tuple(out) == tuple(axes[k].size for k in range(len(shape)))   # nothing indexed away or added
    pair = tr.output(y, layout, like_input=x)
    dst = pair[0] if same else tr.scratch(name + "/sliced", tr.m.tensors[y].dtype, sliced, **tr.quant(x))
    consts = [tr.b.const(f"{name}/{k}", np.asarray(v, np.int32)) for k, v in
              (("begin", begin), ("end", end), ("strides", step))]
    tr.b.op("STRIDED_SLICE", [tr.get(x, layout)] + consts, [dst], "StridedSliceOptions", 2 if tr.is_int8(x) else 1,
            BeginMask=begin_mask, EndMask=end_mask, EllipsisMask=0, NewAxisMask=0, ShrinkAxisMask=0)
    if not same:
        tr.b.op("RESHAPE", [dst, tr.b.const(name + "/shape", np.asarray(tr.reshape_target(y), np.int32))], [pair[0]])
    tr.finish(pair)


@handles("Squeeze")
def squeeze(tr: Translator, op) -> None:
    """SQUEEZE of the listed axes (all size-1 axes of a static shape when none are listed)."""
    x, y = op.inputs[0], op.outputs[0]
    dims = tr.m.tensors[x].shape
    rank = len(dims)
    given = [int(a) % rank for a in op.attrs.get("axes", ()) or ()]
    axes = sorted(set(given)) if given else [k for k, d in enumerate(dims) if d == 1]
    pair = tr.output(y, PLAIN, like_input=x)
    tr.b.op("SQUEEZE", [tr.get(x)], [pair[0]], "SqueezeOptions", SqueezeDims=axes)
    tr.finish(pair)


@handles("ExpandAxes")
def expand_axes(tr: Translator, op) -> None:
    """EXPAND_DIMS for one new axis, a RESHAPE for several."""
    x, y = op.inputs[0], op.outputs[0]
    rank = len(tr.shape(y))
    axes = sorted({int(a) % rank for a in op.attrs.get("axes", ())})
    name = tr.m.tensors[y].name
    pair = tr.output(y, PLAIN, like_input=x)
    if len(axes) == 1:
        tr.b.op("EXPAND_DIMS", [tr.get(x), tr.b.const(name + "/axis", np.asarray(axes[0], np.int32))], [pair[0]])
    else:
        tr.b.op("RESHAPE", [tr.get(x), tr.b.const(name + "/shape", np.asarray(tr.reshape_target(y), np.int32))],
                [pair[0]])
    tr.finish(pair)


REDUCERS = {"ReduceMean": "MEAN", "ReduceSum": "SUM", "ReduceMax": "REDUCE_MAX"}


@handles(*REDUCERS)
def reduce(tr: Translator, op) -> None:
    """MEAN / SUM / REDUCE_MAX over the edge's axes (all of them when none are listed), in x's layout
    when the kept axes keep NCHW's order there."""
    x, y = op.inputs[0], op.outputs[0]
    rank = len(tr.shape(x))
    keep = bool(int(op.attrs.get("keepdims", 0)))
    red = sorted({int(a) % rank for a in op.attrs.get("axes", ()) or ()}) or list(range(rank))
    layout = tr.preferred(x)
    if layout == LAYOUT_NHWC and not keep and [a for a in NHWC if a not in red] != [a for a in range(rank)
                                                                                     if a not in red]:
        layout = PLAIN          # the kept axes would come out in NHWC's order
    axes = sorted(stored_axis(a, rank, layout) for a in red)
    a = tr.b.const(tr.m.tensors[y].name + "/axes", np.asarray(axes, np.int32))
    tr.b.op(REDUCERS[op.op], [tr.get(x, layout), a], [tr.new(y, layout if keep else PLAIN)], "ReducerOptions",
            2 if tr.is_int8(x) else 1, KeepDims=keep)


@handles("LeakyRelu")
def leaky_relu(tr: Translator, op) -> None:
    x, y = op.inputs[0], op.outputs[0]
    layout = tr.preferred(x)
    tr.b.op("LEAKY_RELU", [tr.get(x, layout)], [tr.new(y, layout)], "LeakyReluOptions", 2 if tr.is_int8(x) else 1,
            Alpha=float(op.attrs.get("alpha", 0.2)))


@handles("Split")
def split(tr: Translator, op) -> None:
    """SPLIT_V along the axis (in x's layout); sizes from the outputs' shapes; an int8 piece whose
    parameters differ from x's is requantized after it."""
    x = op.inputs[0]
    rank = len(tr.shape(x))
    axis = int(op.attrs.get("axis", 0)) % rank
    layout = tr.preferred(x) if rank == 4 else PLAIN
    sizes = np.asarray([tr.shape(y)[axis] for y in op.outputs], np.int32)
    name = tr.m.tensors[op.outputs[0]].name
    ax = tr.b.const(name + "/axis", np.asarray(stored_axis(axis, rank, layout), np.int32))
    pairs = [tr.output(y, layout, like_input=x) for y in op.outputs]   # int8 pieces keep x's parameters
    tr.b.op("SPLIT_V", [tr.get(x, layout), tr.b.const(name + "/sizes", sizes), ax],
            [p[0] for p in pairs], "SplitVOptions", 2 if tr.is_int8(x) else 1, NumSplits=len(op.outputs))
    for p in pairs:
        tr.finish(p)


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
