"""ONNX forms of the edge ops beyond the CNN/MLP core (onnx_edge.py's _translate): data movement
(Gather, StridedSlice, Squeeze, ExpandAxes, Resize), reductions, the mobile activations, Gelu and Erf,
ConvTranspose2D and the fused recurrent sequences, read from the edge kernels' attributes.

Each translator takes the writer (onnx_edge._Writer) and the edge operator and returns the float ONNX
tensor holding output 0 (the caller adds Q/DQ for an int8 output), or None when it bound its outputs
itself. int8 edge tensors arrive as their float values (DequantizeLinear), so an int8 op is its float
op between QDQ pairs: the QDQ form ORT Mobile fuses into integer kernels where it has them.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional

import numpy as np

from .edge_geometry import resize_axes, resize_scales, resize_source, slice_axes

TRANSLATORS: Dict[str, Callable] = {}
ONNX_COORDINATES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")   # Resize-13..18
INT64_MIN = -(1 << 62)     # a Slice end before the first element (ONNX clamps it to -1)


def translates(*names):
    def deco(f):
        for n in names:
            TRANSLATORS[n] = f
        return f
    return deco


def _out(w, op, k: int = 0) -> str:
    return w.fresh(w.m.tensors[op.outputs[k]].name + "/f")


def _ints(w, base: str, values) -> str:
    return w.init(base, np.asarray(list(values), np.int64))


def index_value(w, e: int) -> str:
    """An index tensor as it is (int32/int64): never dequantized, whatever parameters the file gives it."""
    if e in w.names:
        return w.names[e]
    t = w.m.tensors[e]
    if t.data is None:
        raise w.fail(f"tensor '{t.name}' is used before it is computed")
    w.names[e] = w.init(t.name, np.asarray(t.data).reshape(w.shape(e)).astype(np.int64))
    return w.names[e]


# ---- data movement ----------------------------------------------------------------------------------
@translates("Gather")
def gather(w, op) -> str:
    rank = len(w.shape(op.inputs[0]))
    out = _out(w, op)
    w.node("Gather", [w.value(op.inputs[0]), index_value(w, op.inputs[1])], [out],
           axis=int(op.attrs.get("axis", 0)) % rank)
    return out


@translates("StridedSlice")
def strided_slice(w, op) -> str:
    """Slice over every input axis (an indexed axis kept as size 1), then Reshape to the output's shape."""
    x, y = op.inputs[0], op.outputs[0]
    shape = w.shape(x)
    axes, out_shape = slice_axes(op.attrs, shape)
    sliced = w.fresh("sliced")
    w.node("Slice", [w.value(x), _ints(w, "starts", [a.begin for a in axes]),
                     _ints(w, "ends", [INT64_MIN if a.end is None else a.end for a in axes]),
                     _ints(w, "axes", range(len(axes))), _ints(w, "steps", [a.step for a in axes])], [sliced])
    if tuple(a.size for a in axes) == tuple(out_shape):
        return sliced
    out = _out(w, op)
    w.node("Reshape", [sliced, _ints(w, "shape", w.shape(y))], [out])
    return out


@translates("Squeeze")
def squeeze(w, op) -> str:
    dims = w.m.tensors[op.inputs[0]].shape
    given = [int(a) % len(dims) for a in op.attrs.get("axes", ()) or ()]
    axes = sorted(set(given)) if given else [k for k, d in enumerate(dims) if d == 1]
    out = _out(w, op)
    w.node("Squeeze", [w.value(op.inputs[0]), _ints(w, "axes", axes)], [out])
    return out


@translates("ExpandAxes")
def expand_axes(w, op) -> str:
    rank = len(w.shape(op.outputs[0]))
    out = _out(w, op)
    w.node("Unsqueeze", [w.value(op.inputs[0]), _ints(w, "axes", sorted({int(a) % rank for a in op.attrs["axes"]}))],
           [out])
    return out


@translates("ReduceMean", "ReduceSum", "ReduceMax")
def reduce(w, op) -> str:
    """Over the edge's axes (all when none are listed); ReduceSum takes them as an input at opset 13+."""
    rank = len(w.shape(op.inputs[0]))
    axes = sorted({int(a) % rank for a in op.attrs.get("axes", ()) or ()}) or list(range(rank))
    keep = int(bool(int(op.attrs.get("keepdims", 0))))
    out = _out(w, op)
    if op.op == "ReduceSum":
        w.node("ReduceSum", [w.value(op.inputs[0]), _ints(w, "axes", axes)], [out], keepdims=keep)
    else:
        w.node(op.op, [w.value(op.inputs[0])], [out], axes=axes, keepdims=keep)
    return out


# ---- Resize -----------------------------------------------------------------------------------------
NEAREST_RULES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _ort_coordinate(coord: str, n: int, m: int, s: float) -> np.ndarray:
    """onnxruntime's source coordinate of each of m outputs along an axis of n (its float32 arithmetic)."""
    o, s32 = np.arange(m, dtype=np.float32), np.float32(s)
    if coord in ("half_pixel", "pytorch_half_pixel"):
        x = (o + np.float32(0.5)) / s32 - np.float32(0.5) if coord == "half_pixel" or m > 1 else np.zeros(m, np.float32)
    elif coord == "align_corners":
        x = o * np.float32(n - 1) / np.float32(m - 1) if m > 1 else np.zeros(m, np.float32)
    else:
        x = o / s32
    return x.astype(np.float32)


def _ort_nearest(coord: str, rule: str, n: int, m: int, s: float) -> np.ndarray:
    x = _ort_coordinate(coord, n, m, s)
    fl = np.floor(x)
    tie = x == fl + np.float32(0.5)
    idx = {"round_prefer_floor": np.where(tie, fl, np.floor(x + np.float32(0.5))),
           "round_prefer_ceil": np.where(tie, fl + 1, np.floor(x + np.float32(0.5))),
           "floor": fl, "ceil": np.ceil(x)}[rule]
    return np.clip(idx, 0, n - 1).astype(np.int64)


def _ort_modes(a, shape, plan) -> Optional[tuple]:
    """(coordinate mode, nearest mode or None) under which onnxruntime's Resize takes the edge's pixels
    (nearest) or coordinates (linear) on every resized axis; the edge's own names first. None: no such."""
    linear = a.get("mode", "nearest") == "linear"
    mine = a.get("coordinate_mode", "half_pixel")
    coords = ([mine] if mine in ONNX_COORDINATES else []) + [c for c in ONNX_COORDINATES if c != mine]
    rule = a.get("nearest_mode", "round_prefer_floor")
    rules = [None] if linear else [rule] + [r for r in NEAREST_RULES if r != rule]
    want = {r.axis: r.i0 for r in resize_axes(a, shape)}
    for coord in coords:
        for nr in rules:
            if all(np.allclose(np.clip(_ort_coordinate(coord, shape[ax], m, s), 0, shape[ax] - 1),
                               np.clip(resize_source(a, shape[ax], m, s), 0, shape[ax] - 1), rtol=0,
                               atol=1e-6 * shape[ax]) if linear else
                   np.array_equal(_ort_nearest(coord, nr, shape[ax], m, s), want[ax]) for ax, m, s in plan):
                return coord, nr
    return None


def _native_resize(w, op, shape) -> Optional[str]:
    """ONNX Resize where its scales and its pixels are the edge's (under the edge's modes or others that
    coincide on this shape); else None."""
    a = op.attrs
    plan = resize_scales(a, shape)
    if not plan:
        return None
    scales = [1.0] * len(shape)
    for ax, m, s in plan:
        if m == shape[ax]:
            return None     # a scale != 1 that keeps the size: onnxruntime copies that axis, the edge resamples it
        if m != math.floor(shape[ax] * s) and abs(s - m / shape[ax]) > 1e-12:
            return None     # the edge's output size and its coordinate scale disagree: no ONNX Resize says that
        scales[ax] = s
    use_sizes = all(abs(s - m / shape[ax]) <= 1e-12 for ax, m, s in plan)   # the scale is the sizes' ratio
    if not use_sizes and any(m != math.floor(shape[ax] * float(np.float32(s))) for ax, m, s in plan):
        return None
    modes = _ort_modes(a, shape, plan)
    if modes is None:
        return None
    out = _out(w, op)
    size_or_scale = ["", _ints(w, "sizes", w.shape(op.outputs[0]))] if use_sizes else \
        [w.init("scales", np.asarray(scales, np.float32))]
    extra = {} if modes[1] is None else {"nearest_mode": modes[1]}
    w.node("Resize", [w.value(op.inputs[0]), ""] + size_or_scale, [out], mode=a.get("mode", "nearest"),
           coordinate_transformation_mode=modes[0], **extra)
    return out


@translates("Resize")
def resize(w, op) -> str:
    """ONNX Resize where it picks the edge's pixels; otherwise the edge kernel's own steps: per resized
    axis a Gather of constant indices (nearest) or two Gathers blended by constant weights (linear)."""
    shape = w.shape(op.inputs[0])
    native = _native_resize(w, op, shape)
    if native is not None:
        return native
    cur = w.value(op.inputs[0])
    plan = resize_axes(op.attrs, shape)
    if not plan:
        out = _out(w, op)
        w.node("Identity", [cur], [out])
        return out
    for r in plan:
        nxt = w.fresh(f"resize_axis{r.axis}")
        if r.i1 is None:
            w.node("Gather", [cur, _ints(w, "idx", r.i0)], [nxt], axis=r.axis)
        else:
            view = (-1,) + (1,) * (len(shape) - r.axis - 1)
            t0, t1, p0, p1 = (w.fresh("tap") for _ in range(4))
            w.node("Gather", [cur, _ints(w, "i0", r.i0)], [t0], axis=r.axis)
            w.node("Gather", [cur, _ints(w, "i1", r.i1)], [t1], axis=r.axis)
            w.node("Mul", [t0, w.init("w0", r.w0.reshape(view))], [p0])
            w.node("Mul", [t1, w.init("w1", r.w1.reshape(view))], [p1])
            w.node("Add", [p0, p1], [nxt])
        cur = nxt
    return cur


# ---- activations -------------------------------------------------------------------------------------
def _same_op(w, op, n_inputs: int, **attrs) -> str:
    """The edge op as the ONNX op of the same name and meaning, over its first n_inputs inputs."""
    out = _out(w, op)
    w.node(op.op, [w.value(i) for i in op.inputs[:n_inputs]], [out], **attrs)
    return out


@translates("PRelu")
def prelu(w, op) -> str:
    return _same_op(w, op, 2)


@translates("HardSwish")
def hard_swish(w, op) -> str:
    return _same_op(w, op, 1)


@translates("HardSigmoid")
def hard_sigmoid(w, op) -> str:
    return _same_op(w, op, 1, alpha=float(op.attrs.get("alpha", 0.2)), beta=float(op.attrs.get("beta", 0.5)))


@translates("Erf")
def erf(w, op) -> str:
    return _same_op(w, op, 1)


@translates("Gelu")
def gelu(w, op) -> str:
    """x (1 + erf(x / sqrt 2)) / 2, or the tanh form (ONNX's Gelu op is opset 20; the writer's is 17)."""
    x = w.value(op.inputs[0])
    inner, shaped, half = w.fresh("gelu_in"), w.fresh("gelu_f"), w.fresh("gelu_half")
    if op.attrs.get("approximate", "none") == "tanh":
        cube, poly = w.fresh("gelu_cube"), w.fresh("gelu_poly")
        w.node("Mul", [x, x], [cube + "2"])
        w.node("Mul", [cube + "2", x], [cube])
        w.node("Mul", [cube, w.init("k3", np.float32(0.044715))], [cube + "k"])
        w.node("Add", [x, cube + "k"], [poly])
        w.node("Mul", [poly, w.init("c", np.float32(math.sqrt(2 / math.pi)))], [inner])
        w.node("Tanh", [inner], [shaped])
    else:
        w.node("Mul", [x, w.init("r2", np.float32(1 / math.sqrt(2)))], [inner])
        w.node("Erf", [inner], [shaped])
    w.node("Add", [shaped, w.init("one", np.float32(1))], [shaped + "1"])
    w.node("Mul", [x, w.init("half", np.float32(0.5))], [half])
    out = _out(w, op)
    w.node("Mul", [half, shaped + "1"], [out])
    return out


# ---- ConvTranspose2D -----------------------------------------------------------------------------------
@translates("ConvTranspose2D")
def conv_transpose(w, op) -> str:
    """ONNX's ConvTranspose has the edge's weights ([C, O/groups, kh, kw]) and geometry; int8 weights are
    read through DequantizeLinear along axis 1 when per channel."""
    a = op.attrs
    t, b, l, r = (int(v) for v in a.get("pads", (0, 0, 0, 0)))
    out = _out(w, op)
    w.node("ConvTranspose", [w.value(op.inputs[0]), w.value(op.inputs[1])], [out], pads=[t, l, b, r],
           strides=[int(v) for v in a.get("strides", (1, 1))], dilations=[int(v) for v in a.get("dilations", (1, 1))],
           group=int(a.get("groups", 1)), output_padding=[int(v) for v in a.get("output_padding", (0, 0))])
    return out


# ---- recurrent sequences ------------------------------------------------------------------------------
def _batched(w, name: str, base: str, axis: int = 0) -> str:
    """name with a leading direction axis (ONNX's LSTM / GRU take [num_directions, ...] tensors)."""
    out = w.fresh(base)
    w.node("Unsqueeze", [name, _ints(w, "axes", [axis])], [out])
    return out


@translates("LSTMSequence", "GRUSequence")
def sequence(w, op) -> None:
    """ONNX LSTM / GRU, one direction (forward or reverse): the edge's W, R (ONNX gate orders), the bias
    (an LSTM's summed [4H] bias as Wb with a zero Rb; a GRU's [6H] as it is) and the initial states, with
    a direction axis added; y, h_T (and c_T) without it."""
    lstm = op.op == "LSTMSequence"
    x, w_e, r_e, b_e = op.inputs[:4]
    hid = w.shape(r_e)[1]
    bias = w.value(b_e)
    if lstm:
        full = w.fresh("lstm_bias")
        w.node("Concat", [bias, w.init("zero_rb", np.zeros(4 * hid, np.float32))], [full], axis=0)
        bias = full
    states = [_batched(w, w.value(e), "state") for e in op.inputs[4:] if e >= 0]
    ins = [w.value(x), _batched(w, w.value(w_e), "W"), _batched(w, w.value(r_e), "R"), _batched(w, bias, "B")]
    ins += [""] if states else []          # sequence_lens: none (the edge refuses per-example lengths)
    outs = [w.fresh(w.m.tensors[o].name + "/d") for o in op.outputs]
    extra = {} if lstm else {"linear_before_reset": int(bool(int(op.attrs.get("linear_before_reset", 0))))}
    w.node("LSTM" if lstm else "GRU", ins + states, outs, hidden_size=hid,
           direction="reverse" if int(op.attrs.get("reverse", 0)) else "forward", **extra)
    for k, (o, raw) in enumerate(zip(op.outputs, outs)):
        val = w.fresh(w.m.tensors[o].name + "/f")
        w.node("Squeeze", [raw, _ints(w, "axes", [1 if k == 0 else 0])], [val])
        w.result(o, val)
    return None


__all__ = ["TRANSLATORS", "index_value"]
