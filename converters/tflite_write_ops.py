"""Edge operators as TFLite builtin operators, fp32 and int8 (one function per edge op).

Each function reads one edge OperatorInfo through the Translator (tflite_write_layout.py), asks
for its inputs in the layout it needs and writes TFLite operators. Attributes follow the edge
kernels' (edge/kernels.py): NCHW activations, OIHW conv weights, MatMul weights [in, out], pads
(top, bottom, left, right).
"""
from __future__ import annotations

from typing import Callable, Dict, Tuple

import numpy as np

from .tflite_write_layout import LAYOUT_NHWC, NHWC, PLAIN, Translator, same_padding, stored_axis

HANDLERS: Dict[str, Callable[[Translator, object], None]] = {}
FUSED = {"none": 0, "relu": 1, "relu6": 3}          # fb.ActivationFunctionType
UNARY = {"Relu": "RELU", "Relu6": "RELU6", "Tanh": "TANH", "Sigmoid": "LOGISTIC"}
BINARY = {"Add": "ADD", "BiasAdd": "ADD", "Sub": "SUB", "Mul": "MUL", "Div": "DIV", "Maximum": "MAXIMUM",
          "Minimum": "MINIMUM"}
BINARY_OPTIONS = {"ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions", "DIV": "DivOptions"}
INT8_BINARY = {"ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM"}
# TFLite's int8 LOGISTIC and TANH need these output parameters; other ones run in float
FIXED_OUTPUT_Q = {"LOGISTIC": (1.0 / 256, -128), "TANH": (1.0 / 128, 0), "SOFTMAX": (1.0 / 256, -128)}


def handles(*names):
    def deco(f):
        for n in names:
            HANDLERS[n] = f
        return f
    return deco


def _attr(op, name, default):
    v = op.attrs.get(name, default)
    return v


def _activation(tr: Translator, op) -> Tuple[int, str]:
    """(fused activation code, separate unary op after it or '')."""
    act = _attr(op, "activation", "none") or "none"
    if act in FUSED:
        return FUSED[act], ""
    if act in ("tanh", "sigmoid"):
        if tr.is_int8(op.outputs[0]):
            raise tr.fail(f"an int8 fused {act} has no TFLite form")
        return 0, UNARY[act.capitalize()]
    raise tr.fail(f"fused activation '{act}' has no TFLite form")


def _post_activation(tr: Translator, op, out_e: int, raw: int, post: str, layout: str) -> None:
    """raw -> post(raw) as e's tensor."""
    y = tr.new(out_e, layout)
    tr.b.op(post, [raw], [y])


def _window(tr: Translator, x: int, shape, k, s, d, pads, pad_value: float, name: str) -> Tuple[int, int]:
    """(TFLite padding code, input tensor): SAME or VALID when the pads are TFLite's, else an
    explicit PAD (PADV2 for a nonzero value) and VALID."""
    n, c, h, w = shape
    t, b, l, r = pads
    xi = tr.get(x, LAYOUT_NHWC)
    if (t, b, l, r) == (0, 0, 0, 0):
        return 1, xi
    if (t, b) == same_padding(h, k[0], s[0], d[0]) and (l, r) == same_padding(w, k[1], s[1], d[1]):
        return 0, xi
    padded = (n, h + t + b, w + l + r, c)
    q = tr.quant(x)
    p = tr.b.const(name + "/pads", np.asarray([[0, 0], [t, b], [l, r], [0, 0]], np.int32))
    y = tr.scratch(name + "/padded", tr.m.tensors[x].dtype, padded, **q)
    if pad_value == 0.0:
        tr.b.op("PAD", [xi, p], [y], version=2 if tr.is_int8(x) else 1)
    else:
        if tr.is_int8(x):
            v = tr.b.const(name + "/pad_value", np.asarray([-128], np.int8), **q)
        else:
            v = tr.b.const(name + "/pad_value", np.asarray([pad_value], np.float32))
        tr.b.op("PADV2", [xi, p, v], [y], version=2 if tr.is_int8(x) else 1)
    return 1, y


def _bias(tr: Translator, op, o: int, w_e: int, x_e: int) -> int:
    b_e = op.inputs[2] if len(op.inputs) > 2 and op.inputs[2] >= 0 else -1
    name = tr.m.tensors[op.outputs[0]].name + "/bias"
    if b_e >= 0 and tr.const(b_e) is None:
        raise tr.fail("a bias computed at run time has no TFLite form here (constant biases only)")
    if not tr.is_int8(x_e):
        return tr.get(b_e) if b_e >= 0 else tr.b.const(name, np.zeros(o, np.float32))
    if b_e >= 0 and tr.quant(b_e):
        return tr.get(b_e)
    # an int32 bias without parameters is at s_in * s_w by the edge kernels' convention; TFLite wants them said
    s = np.broadcast_to(np.asarray(tr.quant(x_e)["scale"][0] * np.asarray(tr.quant(w_e)["scale"]), np.float64), (o,))
    value = np.zeros(o, np.int32) if b_e < 0 else np.asarray(tr.const(b_e), np.int32).reshape(o)
    return tr.b.const(name, value, scale=s.tolist(), zero_point=[0] * o, axis=0)


def _block_diagonal(w: np.ndarray, groups: int) -> np.ndarray:
    """[O, C/groups, kh, kw] -> TFLite's [O, kh, kw, C], zero weights between groups: a grouped convolution
    as one CONV_2D (exact, at groups times the multiply-adds; TFLite's own grouped CONV_2D is not run by
    every delegate). Zero is exact in int8 too (the weights' zero point is 0 per channel)."""
    o, cg = w.shape[:2]
    og = o // groups
    out = np.zeros((o,) + w.shape[2:] + (cg * groups,), w.dtype)
    for g in range(groups):
        out[g * og:(g + 1) * og, :, :, g * cg:(g + 1) * cg] = w[g * og:(g + 1) * og].transpose(0, 2, 3, 1)
    return out


@handles("Conv2D", "FusedConv2D")
def conv(tr: Translator, op) -> None:
    x, w_e, y = op.inputs[0], op.inputs[1], op.outputs[0]
    wt = tr.const(w_e)
    if wt is None:
        raise tr.fail("conv weights computed at run time have no TFLite form (constant weights only)")
    n, c, h, w = tr.shape(x)
    o, cg, kh, kw = wt.shape
    s = tuple(_attr(op, "strides", (1, 1)))
    d = tuple(_attr(op, "dilations", (1, 1)))
    groups = int(_attr(op, "groups", 1))
    name = tr.m.tensors[y].name
    padding, xi = _window(tr, x, (n, c, h, w), (kh, kw), s, d, tuple(_attr(op, "pads", (0, 0, 0, 0))), 0.0, name)
    fused, post = _activation(tr, op)
    qw = tr.quant(w_e)
    int8 = tr.is_int8(x)
    version = 3 if int8 else 1
    bias = _bias(tr, op, o, w_e, x)
    raw = tr.new(y, LAYOUT_NHWC) if not post else tr.scratch(name + "/linear", np.float32, (n,) + tr.shape(y)[2:] + (o,))
    if groups > 1 and qw and any(qw["zero_point"]) and not (groups == c and cg == 1):
        raise tr.fail(f"grouped int8 weights '{tr.m.tensors[w_e].name}' with a nonzero zero point: the "
                      "block-diagonal CONV_2D needs their zeros exact")
    if groups == 1 or not (groups == c and cg == 1):   # grouped (not depthwise): one block-diagonal kernel
        filt = tr.b.const(tr.m.tensors[w_e].name + "/ohwi", _block_diagonal(np.asarray(wt), groups), **qw)
        tr.b.op("CONV_2D", [xi, filt, bias], [raw], "Conv2DOptions", version, Padding=padding, StrideH=s[0],
                StrideW=s[1], DilationHFactor=d[0], DilationWFactor=d[1], FusedActivationFunction=fused)
    elif groups == c and cg == 1:
        if qw and len(qw["scale"]) > 1:
            qw["axis"] = 3
        filt = tr.b.const(tr.m.tensors[w_e].name + "/1hwo",
                          np.asarray(wt).reshape(o, kh, kw).transpose(1, 2, 0)[None], **qw)
        tr.b.op("DEPTHWISE_CONV_2D", [xi, filt, bias], [raw], "DepthwiseConv2DOptions", version, Padding=padding,
                StrideH=s[0], StrideW=s[1], DepthMultiplier=o // c, DilationHFactor=d[0], DilationWFactor=d[1],
                FusedActivationFunction=fused)
    if post:
        _post_activation(tr, op, y, raw, post, LAYOUT_NHWC)


@handles("MatMul", "FusedMatMul")
def matmul(tr: Translator, op) -> None:
    x, w_e, y = op.inputs[0], op.inputs[1], op.outputs[0]
    wt = tr.const(w_e)
    ta, tb = int(_attr(op, "transpose_a", 0)), int(_attr(op, "transpose_b", 0))
    fused, post = _activation(tr, op)
    name = tr.m.tensors[y].name
    xs = tr.shape(x)
    if wt is not None and wt.ndim == 2 and not ta:
        qw = tr.quant(w_e)
        filt = np.asarray(wt) if tb else np.asarray(wt).T           # [out, in]
        if qw and len(qw["scale"]) > 1:
            qw["axis"] = 0
        f = tr.b.const(tr.m.tensors[w_e].name + "/oi", np.ascontiguousarray(filt), **qw)
        o = filt.shape[0]
        bias = _bias(tr, op, o, w_e, x)
        raw = tr.new(y) if not post else tr.scratch(name + "/linear", np.float32, tr.shape(y))
        tr.b.op("FULLY_CONNECTED", [tr.get(x), f, bias], [raw], "FullyConnectedOptions",
                3 if tr.is_int8(x) else 1, FusedActivationFunction=fused, KeepNumDims=len(xs) > 2)
    else:
        has_bias = len(op.inputs) > 2 and op.inputs[2] >= 0
        if tr.is_int8(x):   # two activations, per tensor both: TFLite's int8 BATCH_MATMUL requantizes to y's
            if has_bias or fused or post:
                raise tr.fail("an int8 MatMul of two run-time operands with a bias or an activation has no "
                              "TFLite form here")
            tr.b.op("BATCH_MATMUL", [tr.get(x), tr.get(w_e)], [tr.new(y)], "BatchMatMulOptions", 2,
                    AdjX=bool(ta), AdjY=bool(tb))
            return
        raw = tr.new(y) if not (post or has_bias or fused) else tr.scratch(name + "/product", np.float32, tr.shape(y))
        tr.b.op("BATCH_MATMUL", [tr.get(x), tr.get(w_e)], [raw], "BatchMatMulOptions", AdjX=bool(ta), AdjY=bool(tb))
        if has_bias or fused:
            summed = tr.new(y) if not post else tr.scratch(name + "/linear", np.float32, tr.shape(y))
            b = tr.get(op.inputs[2]) if has_bias else tr.b.const(name + "/zero", np.zeros(1, np.float32))
            tr.b.op("ADD", [raw, b], [summed], "AddOptions", FusedActivationFunction=fused)
            raw = summed
    if post:
        _post_activation(tr, op, y, raw, post, PLAIN)


@handles(*UNARY)
def unary(tr: Translator, op) -> None:
    x, y = op.inputs[0], op.outputs[0]
    layout = tr.preferred(x)
    kind = UNARY[op.op]
    if tr.is_int8(x) and not _fixed_q_ok(tr, y, kind):
        _in_float(tr, op, kind, layout)
        return
    tr.b.op(kind, [tr.get(x, layout)], [tr.new(y, layout)], version=2 if tr.is_int8(x) else 1)


def _fixed_q_ok(tr: Translator, y: int, kind: str) -> bool:
    """Whether y's int8 parameters are those TFLite's int8 `kind` kernel requires (if any)."""
    if kind not in FIXED_OUTPUT_Q:
        return True
    s, z = FIXED_OUTPUT_Q[kind]
    q = tr.quant(y)
    return abs(q["scale"][0] - s) <= 1e-6 * s and q["zero_point"][0] == z


def _in_float(tr: Translator, op, kind: str, layout: str) -> None:
    """DEQUANTIZE, the float op, QUANTIZE: for int8 ops whose TFLite kernel fixes the output's scale."""
    x, y = op.inputs[0], op.outputs[0]
    name = tr.m.tensors[y].name
    shp = tr.b.tensors[tr.get(x, layout)].shape
    fx = tr.scratch(name + "/float_in", np.float32, shp)
    fy = tr.scratch(name + "/float_out", np.float32, shp)
    tr.b.op("DEQUANTIZE", [tr.get(x, layout)], [fx], version=2)
    if kind == "SOFTMAX":
        tr.b.op(kind, [fx], [fy], "SoftmaxOptions", Beta=1.0)
    else:
        tr.b.op(kind, [fx], [fy])
    tr.b.op("QUANTIZE", [fy], [tr.new(y, layout)], version=2)


@handles("Identity")
def identity(tr: Translator, op) -> None:
    tr.alias(op.inputs[0], op.outputs[0])


@handles(*BINARY)
def binary(tr: Translator, op) -> None:
    a, b, y = op.inputs[0], op.inputs[1], op.outputs[0]
    kind = BINARY[op.op]
    int8 = tr.is_int8(y)
    if int8 and kind not in INT8_BINARY:
        raise tr.fail(f"int8 {op.op} has no TFLite int8 kernel")
    rank = len(tr.shape(y))
    live = [e for e in (a, b) if tr.const(e) is None]
    layout = LAYOUT_NHWC if rank == 4 and any(LAYOUT_NHWC in tr.layouts(e) for e in live) else PLAIN
    ins = []
    for e in (a, b):
        if tr.const(e) is not None:
            ins.append(_broadcast_const(tr, op, e, rank, layout))
        elif len(tr.shape(e)) != rank and layout == LAYOUT_NHWC:
            raise tr.fail(f"a rank-{len(tr.shape(e))} operand beside a rank-4 NHWC one has no TFLite form here")
        else:
            ins.append(tr.get(e, layout))
    opts = BINARY_OPTIONS.get(kind, "")
    extra = {"FusedActivationFunction": 0} if opts else {}
    tr.b.op(kind, ins, [tr.new(y, layout)], opts, 2 if int8 else 1, **extra)


def _broadcast_const(tr: Translator, op, e: int, rank: int, layout: str) -> int:
    """A constant operand, reshaped to the output's rank (BiasAdd: along its axis), in `layout`."""
    v = np.asarray(tr.const(e)).reshape(tr.shape(e))
    if op.op == "BiasAdd":
        axis = int(_attr(op, "axis", -1)) % rank
        v = v.reshape((-1,) + (1,) * (rank - axis - 1))
    v = v.reshape((1,) * (rank - v.ndim) + v.shape)
    q = tr.quant(e)
    if layout == LAYOUT_NHWC:
        v = v.transpose(NHWC)
    while v.ndim > 1 and v.shape[0] == 1:   # leading ones broadcast anyway
        v = v[0]
    if q and len(q["scale"]) > 1:
        raise tr.fail(f"constant '{tr.m.tensors[e].name}' is quantized per channel: TFLite's element-wise "
                      "ops take per-tensor parameters")
    return tr.b.const(tr.m.tensors[e].name + f"/{layout}", np.ascontiguousarray(v), **q)


def _pool_common(tr: Translator, op, kind: str) -> None:
    x, y = op.inputs[0], op.outputs[0]
    k = tuple(_attr(op, "ksize", (1, 1)))
    s = tuple(_attr(op, "strides", k))
    pads = tuple(_attr(op, "pads", (0, 0, 0, 0)))
    shape = tr.shape(x)
    name = tr.m.tensors[y].name
    n, c, h, w = shape
    if kind == "AVERAGE_POOL_2D" and pads != (0, 0, 0, 0) and not (
            (pads[0], pads[1]) == same_padding(h, k[0], s[0], 1) and (pads[2], pads[3]) == same_padding(w, k[1], s[1], 1)):
        _avg_pool_explicit(tr, op, k, s, pads)
        return
    padding, xi = _window(tr, x, shape, k, s, (1, 1), pads, float(np.finfo(np.float32).min), name)
    pair = tr.output(y, LAYOUT_NHWC, like_input=x)
    tr.b.op(kind, [xi], [pair[0]], "Pool2DOptions", 2 if tr.is_int8(x) else 1, Padding=padding,
            StrideH=s[0], StrideW=s[1], FilterHeight=k[0], FilterWidth=k[1], FusedActivationFunction=0)
    tr.finish(pair)


def _avg_pool_explicit(tr: Translator, op, k, s, pads) -> None:
    """Average pooling over explicit pads that are not TFLite's SAME (the mean of the real elements
    only): zero PAD, a VALID AVERAGE_POOL_2D (the window sum / (kh kw)), then MUL by the constant
    map kh kw / (real elements of each window). fp32 only."""
    x, y = op.inputs[0], op.outputs[0]
    if tr.is_int8(x):
        raise tr.fail(f"int8 average pooling with pads {pads} (neither VALID nor TFLite's SAME) has no TFLite form")
    n, c, h, w = tr.shape(x)
    t, b, l, r = pads
    oh, ow = tr.shape(y)[2:]
    name = tr.m.tensors[y].name
    _, xi = _window(tr, x, (n, c, h, w), k, s, (1, 1), pads, 0.0, name)
    ones = np.zeros((h + t + b, w + l + r), np.float32)
    ones[t:t + h, l:l + w] = 1
    count = np.array([[ones[i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]].sum() for j in range(ow)]
                      for i in range(oh)], np.float32)
    mid = tr.scratch(name + "/window_mean", np.float32, (n, oh, ow, c))
    tr.b.op("AVERAGE_POOL_2D", [xi], [mid], "Pool2DOptions", Padding=1, StrideH=s[0], StrideW=s[1],
            FilterHeight=k[0], FilterWidth=k[1], FusedActivationFunction=0)
    fix = tr.b.const(name + "/count_fix", (k[0] * k[1] / count).astype(np.float32).reshape(1, oh, ow, 1))
    tr.b.op("MUL", [mid, fix], [tr.new(y, LAYOUT_NHWC)], "MulOptions", FusedActivationFunction=0)


@handles("MaxPool")
def max_pool(tr: Translator, op) -> None:
    _pool_common(tr, op, "MAX_POOL_2D")


@handles("AvgPool")
def avg_pool(tr: Translator, op) -> None:
    _pool_common(tr, op, "AVERAGE_POOL_2D")


@handles("GlobalAvgPool")
def global_avg_pool(tr: Translator, op) -> None:
    x, y = op.inputs[0], op.outputs[0]
    keep = bool(int(_attr(op, "keepdims", 0)))
    axes = tr.b.const(tr.m.tensors[y].name + "/axes", np.asarray([1, 2], np.int32))
    out = tr.new(y, LAYOUT_NHWC if keep else PLAIN)
    tr.b.op("MEAN", [tr.get(x, LAYOUT_NHWC), axes], [out], "ReducerOptions", 2 if tr.is_int8(x) else 1,
            KeepDims=keep)


@handles("Reshape", "Flatten")
def reshape(tr: Translator, op) -> None:
    x, y = op.inputs[0], op.outputs[0]
    xs = tr.shape(x)
    src = PLAIN
    if len(xs) == 4 and LAYOUT_NHWC in tr.layouts(x) and PLAIN not in tr.layouts(x) and tr.same_bytes(x):
        src = LAYOUT_NHWC  # the NHWC bytes are the NCHW bytes: no transpose
    target = tr.reshape_target(y)
    new_shape = tr.b.const(tr.m.tensors[y].name + "/shape", np.asarray(target, np.int32))
    pair = tr.output(y, PLAIN, like_input=x)
    tr.b.op("RESHAPE", [tr.get(x, src), new_shape], [pair[0]], "ReshapeOptions", NewShape=list(target))
    tr.finish(pair)


@handles("Concat")
def concat(tr: Translator, op) -> None:
    y = op.outputs[0]
    rank = len(tr.shape(y))
    layout = LAYOUT_NHWC if rank == 4 and any(LAYOUT_NHWC in tr.layouts(e) for e in op.inputs) else PLAIN
    axis = stored_axis(int(_attr(op, "axis", 0)), rank, layout)
    ins = [tr.get(e, layout) for e in op.inputs]
    if tr.is_int8(y):  # XNNPACK's int8 concatenation needs every input quantized as the output
        ins = [i if tr.same_q(e, y) else _requantized(tr, i, y, tr.m.tensors[e].name)
               for e, i in zip(op.inputs, ins)]
    tr.b.op("CONCATENATION", ins, [tr.new(y, layout)], "ConcatenationOptions",
            2 if tr.is_int8(y) else 1, Axis=axis, FusedActivationFunction=0)


def _requantized(tr: Translator, i: int, like: int, name: str) -> int:
    """TFLite tensor i requantized (QUANTIZE int8 -> int8) to edge tensor like's parameters."""
    out = tr.scratch(name + "/requant", np.int8, tr.b.tensors[i].shape, **tr.quant(like))
    tr.b.op("QUANTIZE", [i], [out], version=2)
    return out


@handles("Softmax")
def softmax(tr: Translator, op) -> None:
    x, y = op.inputs[0], op.outputs[0]
    rank = len(tr.shape(x))
    axis = int(_attr(op, "axis", -1)) % rank
    if rank == 4 and axis == 1:
        layout = LAYOUT_NHWC
    elif axis == rank - 1:
        layout = PLAIN
    else:
        _softmax_moved(tr, op, axis)
        return
    if tr.is_int8(x) and not _fixed_q_ok(tr, y, "SOFTMAX"):
        _in_float(tr, op, "SOFTMAX", layout)
        return
    tr.b.op("SOFTMAX", [tr.get(x, layout)], [tr.new(y, layout)], "SoftmaxOptions", 2 if tr.is_int8(x) else 1,
            Beta=1.0)


def _softmax_moved(tr: Translator, op, axis: int) -> None:
    """Softmax over an inner axis: TRANSPOSE it last, SOFTMAX (TFLite's is over the last axis), TRANSPOSE
    back; int8 keeps its parameters through the moves (the int8 SOFTMAX itself as softmax() writes it)."""
    x, y = op.inputs[0], op.outputs[0]
    shape, name = tr.shape(x), tr.m.tensors[y].name
    rank = len(shape)
    perm = [a for a in range(rank) if a != axis] + [axis]
    back = [perm.index(a) for a in range(rank)]
    moved = tuple(shape[p] for p in perm)
    int8 = tr.is_int8(x)
    dt = tr.m.tensors[x].dtype
    xt = tr.scratch(name + "/last_axis_in", dt, moved, **tr.quant(x))
    tr.b.op("TRANSPOSE", [tr.get(x), tr.b.const(name + "/perm", np.asarray(perm, np.int32))], [xt],
            version=2 if int8 else 1)
    yt = tr.scratch(name + "/last_axis_out", dt, moved, **tr.quant(y))
    if int8 and not _fixed_q_ok(tr, y, "SOFTMAX"):
        fx, fy = (tr.scratch(f"{name}/float_{k}", np.float32, moved) for k in ("in", "out"))
        tr.b.op("DEQUANTIZE", [xt], [fx], version=2)
        tr.b.op("SOFTMAX", [fx], [fy], "SoftmaxOptions", Beta=1.0)
        tr.b.op("QUANTIZE", [fy], [yt], version=2)
    else:
        tr.b.op("SOFTMAX", [xt], [yt], "SoftmaxOptions", 2 if int8 else 1, Beta=1.0)
    tr.b.op("TRANSPOSE", [yt, tr.b.const(name + "/perm_back", np.asarray(back, np.int32))], [tr.new(y)],
            version=2 if int8 else 1)


@handles("Pad")
def pad(tr: Translator, op) -> None:
    x, y = op.inputs[0], op.outputs[0]
    rank = len(tr.shape(x))
    layout = tr.preferred(x)
    p = np.asarray(_attr(op, "paddings", (0,) * 2 * rank), np.int32).reshape(rank, 2)
    if layout == LAYOUT_NHWC and rank == 4:
        p = p[list(NHWC)]
    value = float(_attr(op, "constant_value", 0.0))
    pads = tr.b.const(tr.m.tensors[y].name + "/pads", np.ascontiguousarray(p))
    pair = tr.output(y, layout, like_input=x)
    int8 = tr.is_int8(x)
    if value == 0.0:
        tr.b.op("PAD", [tr.get(x, layout), pads], [pair[0]], version=2 if int8 else 1)
    else:
        q = tr.quant(x)
        v = np.asarray([np.clip(round(value / q["scale"][0]) + q["zero_point"][0], -128, 127)], np.int8) if int8 \
            else np.asarray([value], np.float32)
        vt = tr.b.const(tr.m.tensors[y].name + "/value", v, **q)
        tr.b.op("PADV2", [tr.get(x, layout), pads, vt], [pair[0]], version=2 if int8 else 1)
    tr.finish(pair)


@handles("BatchNorm")
def batch_norm(tr: Translator, op) -> None:
    x, y = op.inputs[0], op.outputs[0]
    vals = [tr.const(e) for e in op.inputs[1:5]]
    if any(v is None for v in vals) or tr.is_int8(x):
        raise tr.fail("batch norm with run-time statistics (or int8) has no TFLite form here")
    scale, offset, mean, var = (np.asarray(v, np.float64) for v in vals)
    inv = scale / np.sqrt(var + float(_attr(op, "epsilon", 1e-3)))
    rank = len(tr.shape(x))
    axis = int(_attr(op, "axis", 1)) % rank
    layout = LAYOUT_NHWC if rank == 4 and axis == 1 else PLAIN
    sa = stored_axis(axis, rank, layout)
    view = (-1,) + (1,) * (rank - sa - 1)
    name = tr.m.tensors[y].name
    mul = tr.b.const(name + "/scale", inv.astype(np.float32).reshape(view))
    add = tr.b.const(name + "/shift", (offset - mean * inv).astype(np.float32).reshape(view))
    mid = tr.scratch(name + "/scaled", np.float32, tr.b.tensors[tr.get(x, layout)].shape)
    tr.b.op("MUL", [tr.get(x, layout), mul], [mid], "MulOptions", FusedActivationFunction=0)
    tr.b.op("ADD", [mid, add], [tr.new(y, layout)], "AddOptions", FusedActivationFunction=0)


@handles("Quantize", "Dequantize")
def quantize(tr: Translator, op) -> None:
    x, y = op.inputs[0], op.outputs[0]
    q = tr.quant(y if op.op == "Quantize" else x)
    if q and len(q["scale"]) > 1:
        raise tr.fail("per-channel activation quantization has no TFLite form")
    layout = tr.preferred(x)
    tr.b.op(op.op.upper(), [tr.get(x, layout)], [tr.new(y, layout)], version=2)
