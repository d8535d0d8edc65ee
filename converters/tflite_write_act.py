"""The mobile activations and the transformer's Gelu / Erf as TFLite: PRELU, HARD_SWISH, GELU natively
(int8 where TFLite has the kernel and the edge does), HardSigmoid and Erf as exact composites of
builtins (TFLite has neither), computed in the edge kernels' order (edge/kernels_act.py, kernels_math.py).

int8 PRelu: TFLite's int8 PRELU takes an int8 slope with per-tensor parameters: the edge's own int8
slope, or a float one quantized symmetrically to 127 levels of its largest magnitude. Where that
slope's error, times the most negative input, would move an output by half a step or more, the op
runs in float between DEQUANTIZE and QUANTIZE instead.
int8 HardSigmoid runs its float composite between DEQUANTIZE and QUANTIZE (the edge's table is exact).
"""
from __future__ import annotations

import numpy as np

from isthmus.edge.kernels_math import ERFC_FIT as ERFC   # erfc(u) = t exp(-u^2 + P(t)), t = 1 / (1 + u / 2)

from .tflite_write_layout import LAYOUT_NHWC, NHWC, PLAIN, Translator
from .tflite_write_ops import handles


def _scalar(tr: Translator, name: str, v: float) -> int:
    return tr.b.const(name, np.asarray([v], np.float32))


def _const_like(tr: Translator, e: int, rank: int, layout: str) -> np.ndarray:
    """A constant operand at x's rank, in x's layout, leading ones dropped (they broadcast anyway)."""
    v = np.asarray(tr.const(e)).reshape(tr.shape(e))
    v = v.reshape((1,) * (rank - v.ndim) + v.shape)
    if layout == LAYOUT_NHWC:
        v = v.transpose(NHWC)
    while v.ndim > 1 and v.shape[0] == 1:
        v = v[0]
    return np.ascontiguousarray(v)


@handles("PRelu")
def prelu(tr: Translator, op) -> None:
    x, s, y = op.inputs[0], op.inputs[1], op.outputs[0]
    rank, layout = len(tr.shape(x)), tr.preferred(x)
    if tr.const(s) is None:
        if tr.is_int8(x):
            raise tr.fail("an int8 PRelu with a slope computed at run time has no TFLite form")
        if len(tr.shape(s)) != rank:
            layout = PLAIN          # a run-time slope broadcasts in the graph's own layout
        slope = tr.get(s, layout)
    else:
        slope = _constant_slope(tr, op, s, rank, layout)
        if slope is None:       # no int8 slope keeps the int8 kernel within a step: the op runs in float
            _prelu_in_float(tr, op, rank, layout)
            return
    tr.b.op("PRELU", [tr.get(x, layout), slope], [tr.new(y, layout)])


def _constant_slope(tr: Translator, op, s: int, rank: int, layout: str):
    """The slope tensor for PRELU; int8 for an int8 x: the edge's own int8 slope, or a float one quantized
    to 127 levels, when the slope's quantization error moves no output by half a step of its own (the
    most negative x times the error, over the output's scale); else None."""
    x, y, name = op.inputs[0], op.outputs[0], tr.m.tensors[op.outputs[0]].name
    v, q = _const_like(tr, s, rank, layout), tr.quant(s)
    if not tr.is_int8(x):
        return tr.b.const(f"{name}/slope", v, **q)
    if q and len(q["scale"]) > 1:
        return None                               # TFLite's int8 PRELU takes one slope scale
    exact = (v.astype(np.float64) - q["zero_point"][0]) * q["scale"][0] if q else v.astype(np.float64)
    if not q:
        q = {"scale": [(float(np.abs(v).max()) or 1.0) / 127], "zero_point": [0]}
        v = np.clip(np.rint(v / q["scale"][0]), -127, 127).astype(np.int8)
    err = float(np.abs((v.astype(np.float64) - q["zero_point"][0]) * q["scale"][0] - exact).max())
    (sx,), (zx,), (sy,) = tr.quant(x)["scale"], tr.quant(x)["zero_point"], tr.quant(y)["scale"]
    if (zx + 128) * sx * err / sy > 0.45:
        return None
    return tr.b.const(f"{name}/slope", v, **q)


def _prelu_in_float(tr: Translator, op, rank: int, layout: str) -> None:
    """DEQUANTIZE, a float PRELU with the exact slope, QUANTIZE (within one step of the edge's int8)."""
    x, s, y = op.inputs[0], op.inputs[1], op.outputs[0]
    name, q = tr.m.tensors[y].name, tr.quant(s)
    v = _const_like(tr, s, rank, layout).astype(np.float64)
    if q:                                   # (the edge's int8 PRelu takes a per-tensor int8 slope only)
        v = (v - q["zero_point"][0]) * q["scale"][0]
    xi = tr.get(x, layout)
    shape = tr.b.tensors[xi].shape
    fx, fy = (tr.scratch(f"{name}/float_{k}", np.float32, shape) for k in ("in", "out"))
    tr.b.op("DEQUANTIZE", [xi], [fx], version=2)
    tr.b.op("PRELU", [fx, tr.b.const(f"{name}/slope", v.astype(np.float32))], [fy])
    tr.b.op("QUANTIZE", [fy], [tr.new(y, layout)], version=2)


@handles("HardSwish")
def hard_swish(tr: Translator, op) -> None:
    x, y = op.inputs[0], op.outputs[0]
    layout = tr.preferred(x)
    tr.b.op("HARD_SWISH", [tr.get(x, layout)], [tr.new(y, layout)])


@handles("HardSigmoid")
def hard_sigmoid(tr: Translator, op) -> None:
    """clip(alpha x + beta, 0, 1) as MUL, ADD, RELU_0_TO_1 (the edge's three passes); int8 between
    DEQUANTIZE and QUANTIZE."""
    x, y = op.inputs[0], op.outputs[0]
    layout, name = tr.preferred(x), tr.m.tensors[y].name
    xi = tr.get(x, layout)
    shape = tr.b.tensors[xi].shape
    if tr.is_int8(x):
        f = tr.scratch(name + "/float_in", np.float32, shape)
        tr.b.op("DEQUANTIZE", [xi], [f], version=2)
        xi = f
    scaled, shifted = (tr.scratch(f"{name}/{k}", np.float32, shape) for k in ("scaled", "shifted"))
    tr.b.op("MUL", [xi, _scalar(tr, name + "/alpha", float(op.attrs.get("alpha", 0.2)))], [scaled], "MulOptions",
            FusedActivationFunction=0)
    tr.b.op("ADD", [scaled, _scalar(tr, name + "/beta", float(op.attrs.get("beta", 0.5)))], [shifted], "AddOptions",
            FusedActivationFunction=0)
    if not tr.is_int8(x):
        tr.b.op("RELU_0_TO_1", [shifted], [tr.new(y, layout)])
        return
    clipped = tr.scratch(name + "/float_out", np.float32, shape)
    tr.b.op("RELU_0_TO_1", [shifted], [clipped])
    tr.b.op("QUANTIZE", [clipped], [tr.new(y, layout)], version=2)


@handles("Gelu")
def gelu(tr: Translator, op) -> None:
    x, y = op.inputs[0], op.outputs[0]
    if tr.is_int8(x):
        raise tr.fail("an int8 Gelu has no edge kernel to match")
    layout = tr.preferred(x)
    tr.b.op("GELU", [tr.get(x, layout)], [tr.new(y, layout)], "GeluOptions",
            Approximate=op.attrs.get("approximate", "none") == "tanh")


@handles("Erf")
def erf(tr: Translator, op) -> None:
    """sign(x) (1 - erfc(|x|)) through the edge's erfc fit (absolute error below 1.2e-7): ABS, the
    t = 1 / (1 + u / 2) and Horner steps as MUL / ADD, EXP, SIGN; TFLite has no ERF builtin."""
    x, y = op.inputs[0], op.outputs[0]
    if tr.is_int8(x):
        raise tr.fail("an int8 Erf has no edge kernel to match")
    layout, name = tr.preferred(x), tr.m.tensors[y].name
    xi = tr.get(x, layout)
    shape = tr.b.tensors[xi].shape
    n = [0]

    def step(kind: str, ins, opts: str = "", out: int = -1) -> int:
        n[0] += 1
        out = tr.scratch(f"{name}/erf{n[0]}", np.float32, shape) if out < 0 else out
        extra = {"FusedActivationFunction": 0} if opts else {}
        tr.b.op(kind, ins, [out], opts, **extra)
        return out

    def c(v: float) -> int:
        n[0] += 1
        return _scalar(tr, f"{name}/c{n[0]}", v)
    u = step("ABS", [xi])
    t = step("DIV", [c(1.0), step("ADD", [step("MUL", [u, c(0.5)], "MulOptions"), c(1.0)], "AddOptions")],
             "DivOptions")
    p = step("ADD", [step("MUL", [t, c(ERFC[-1])], "MulOptions"), c(ERFC[-2])], "AddOptions")
    for a in ERFC[-3:0:-1]:
        p = step("ADD", [step("MUL", [p, t], "MulOptions"), c(a)], "AddOptions")
    p = step("ADD", [step("MUL", [p, t], "MulOptions"), c(ERFC[0])], "AddOptions")
    e = step("EXP", [step("SUB", [p, step("MUL", [u, u], "MulOptions")], "SubOptions")])
    erfc = step("MUL", [e, t], "MulOptions")
    step("MUL", [step("SUB", [c(1.0), erfc], "SubOptions"), step("SIGN", [xi])], "MulOptions", out=tr.new(y, layout))

