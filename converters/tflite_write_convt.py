"""The edge's ConvTranspose2D as TFLite's TRANSPOSE_CONV (fp32; int8 with symmetric weights, per
tensor or per output channel), NHWC.

TRANSPOSE_CONV has no dilation, no groups and only SAME / VALID padding, so the writer reshapes the
problem into one it has, exactly: the kernel is dilated by zero taps, groups become one block-diagonal
kernel (zero weights between groups: exact, at groups times the multiply-adds), and the op computes
the full VALID output (fh + output_padding rows: TFLite's and XNNPACK's shape rule agree on it), from
which a SLICE keeps the edge's rows [top, top + oh) and columns [left, left + ow). Weights go from the
edge's [C, O/groups, kh, kw] to TFLite's [O, kh, kw, C] without flipping: both scatter input (i, j)
through tap (ki, kj) to output (i s + ki d, j s + kj d). TFLite's int8 kernel takes symmetric weights
only (converters/quantize.py gives ConvTranspose2D symmetric per-channel weights): asymmetric per-tensor
weights (from another quantizer) whose values minus the zero point leave [-127, 127] run in float
between DEQUANTIZE and QUANTIZE. A free batch
takes the output shape from the input's at run time (SHAPE): LiteRT then sizes the output per invoke.
"""
from __future__ import annotations

import numpy as np

from .tflite_schema import fb
from .tflite_write_layout import LAYOUT_NHWC, Translator
from .tflite_write_ops import handles


def ohwi_weights(w: np.ndarray, groups: int, dilations) -> np.ndarray:
    """[C, O/groups, kh, kw] -> [O, (kh-1) dh + 1, (kw-1) dw + 1, C]: dilated, block-diagonal over groups."""
    c, og, kh, kw = w.shape
    dh, dw = dilations
    cg = c // groups
    out = np.zeros((og * groups, (kh - 1) * dh + 1, (kw - 1) * dw + 1, c), w.dtype)
    for g in range(groups):
        out[g * og:(g + 1) * og, ::dh, ::dw, g * cg:(g + 1) * cg] = w[g * cg:(g + 1) * cg].transpose(1, 2, 3, 0)
    return out


def _int8_weights(tr: Translator, w_e: int, wt: np.ndarray, groups: int):
    """(weights, their TFLite parameters) for an int8 TRANSPOSE_CONV, symmetric as TFLite requires: per
    output channel (axis 0), or per tensor; per-tensor weights with a zero point z are w - z at z = 0 when
    every w - z fits [-127, 127] (exact). None when they do not: the op then runs in float."""
    q = tr.quant(w_e)
    if len(q["scale"]) > 1:                  # the edge's per-channel scales repeat in every group
        scales = list(q["scale"]) * groups
        return wt, {"scale": scales, "zero_point": [0] * len(scales), "axis": 0}
    shifted = wt.astype(np.int32) - q["zero_point"][0]
    if shifted.min() < -127 or shifted.max() > 127:
        return None
    return shifted.astype(np.int8), {"scale": q["scale"], "zero_point": [0], "axis": 0}


def _output_shape(tr: Translator, xi: int, name: str, rest) -> int:
    """[batch of x, *rest] computed at run time (SHAPE, SLICE, CONCATENATION): a free batch stays free."""
    full = tr.scratch(name + "/x_shape", np.int32, (4,))
    tr.b.op("SHAPE", [xi], [full], "ShapeOptions", OutType=fb.TensorType.INT32)
    batch = tr.scratch(name + "/batch", np.int32, (1,))
    tr.b.op("SLICE", [full, tr.b.const(name + "/batch_begin", np.asarray([0], np.int32)),
                      tr.b.const(name + "/batch_size", np.asarray([1], np.int32))], [batch])
    out = tr.scratch(name + "/output_shape", np.int32, (4,))
    tr.b.op("CONCATENATION", [batch, tr.b.const(name + "/rest", np.asarray(rest, np.int32))], [out],
            "ConcatenationOptions", Axis=0, FusedActivationFunction=0)
    return out


@handles("ConvTranspose2D")
def conv_transpose(tr: Translator, op) -> None:
    x, w_e, y = op.inputs[0], op.inputs[1], op.outputs[0]
    wt = tr.const(w_e)
    if wt is None:
        raise tr.fail("transposed-conv weights computed at run time have no TFLite form (constant weights only)")
    a, name = op.attrs, tr.m.tensors[y].name
    n, c, h, wd = tr.shape(x)
    cw, og, kh, kw = tr.shape(w_e)
    groups = int(a.get("groups", 1))
    sh, sw = (int(v) for v in a.get("strides", (1, 1)))
    dh, dw = (int(v) for v in a.get("dilations", (1, 1)))
    t, b, l, r = (int(v) for v in a.get("pads", (0, 0, 0, 0)))
    eh, ew = (int(v) for v in a.get("output_padding", (0, 0)))
    o, (oh, ow) = og * groups, tr.shape(y)[2:]
    wt = np.asarray(wt).reshape(cw, og, kh, kw)
    int8 = tr.is_int8(x)
    ints = _int8_weights(tr, w_e, wt, groups) if int8 else None
    in_float = int8 and ints is None          # asymmetric weights TFLite's int8 kernel cannot take
    if in_float:
        q = tr.quant(w_e)
        wt = ((wt.astype(np.float32) - np.float32(q["zero_point"][0])) * np.float32(q["scale"][0])).astype(np.float32)
    elif int8:
        wt = ints[0]
    kernel = ohwi_weights(wt, groups, (dh, dw))
    fh, fw = sh * (h - 1) + kernel.shape[1] + eh, sw * (wd - 1) + kernel.shape[2] + ew
    filt = tr.b.const(tr.m.tensors[w_e].name + "/ohwi", kernel, **(ints[1] if ints else {}))
    crop = (t, l, fh - t - oh, fw - l - ow) != (0, 0, 0, 0)
    xi = tr.get(x, LAYOUT_NHWC)
    free = tr.m.tensors[x].shape[0] == -1
    shape = _output_shape(tr, xi, name, (fh, fw, o)) if free else \
        tr.b.const(name + "/output_shape", np.asarray([n, fh, fw, o], np.int32))
    if in_float:
        xf = tr.scratch(name + "/float_in", np.float32, tr.b.tensors[xi].shape)
        tr.b.op("DEQUANTIZE", [xi], [xf], version=2)
        xi = xf
    final = tr.new(y, LAYOUT_NHWC)
    dt, q = (np.float32, {}) if in_float or not int8 else (np.int8, tr.quant(y))
    out = final if not crop and not in_float else tr.scratch(name + "/full", dt, (n, fh, fw, o), **q)
    tr.b.op("TRANSPOSE_CONV", [shape, filt, xi], [out], "TransposeConvOptions", 2 if int8 and not in_float else 1,
            Padding=1, StrideH=sh, StrideW=sw)
    if crop:
        cropped = final if not in_float else tr.scratch(name + "/cropped", dt, (n, oh, ow, o))
        begin = tr.b.const(name + "/begin", np.asarray([0, t, l, 0], np.int32))
        size = tr.b.const(name + "/size", np.asarray([-1 if free else n, oh, ow, o], np.int32))
        tr.b.op("SLICE", [out, begin, size], [cropped], version=2 if dt == np.int8 else 1)
        out = cropped
    if in_float:
        tr.b.op("QUANTIZE", [out], [final], version=2)
