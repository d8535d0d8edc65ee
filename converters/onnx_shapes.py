"""ONNX import handlers: shape and layout ops, constants, Pad, Expand, Range.

Each handler takes both the attribute form of old opsets (Squeeze/Unsqueeze/Split axes and sizes,
Slice bounds, Pad pads) and the input form of new ones; inputs known at import become static
attributes, inputs computed at run time feed run-time ops (ReshapeTo, SliceDynamic, PadDynamic...).
"""
from __future__ import annotations

import numpy as np

import isthmus.core as ism
from isthmus.core.ops.arange import arange, range_values
from isthmus.core.ops.pad_dynamic import pad_dynamic

from .onnx_import import ImportError_, _attrs, _s, handler, refuse_unless


def _ints(v) -> list:
    return [int(a) for a in np.asarray(v).reshape(-1)]


@handler("Reshape", 5, attrs=("allowzero",))
def _reshape(c, node, ins):
    x = ins[0]
    allowzero = _attrs(node).get("allowzero", 0)
    if node.input[1] not in c.consts:  # a shape computed at run time
        return [ism.reshape_to(x, ins[1], copy_zero=not allowzero)]
    shape = _ints(c.consts[node.input[1]])
    if not allowzero:
        refuse_unless(all(i < len(x.shape) for i, d in enumerate(shape) if d == 0),
                      f"shape {shape} copies a dim the input (rank {len(x.shape)}) lacks")
        if any(d == 0 and x.shape[i] is None for i, d in enumerate(shape)):
            return [ism.reshape_to(x, ism.constant(np.array(shape, np.int64)), copy_zero=True)]
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [ism.reshape(x, shape)]


@handler("Flatten", attrs=("axis",))
def _flatten(c, node, ins):
    rank = len(ins[0].shape)
    axis = _attrs(node).get("axis", 1)
    return [ism.flatten(ins[0], axis + rank if axis < 0 else axis)]


@handler("Transpose", attrs=("perm",))
def _transpose(c, node, ins):
    p = _attrs(node).get("perm")
    return [ism.transpose(ins[0], None if p is None else tuple(p))]


@handler("Concat", attrs=("axis",))
def _concat(c, node, ins):
    at = _attrs(node)
    refuse_unless("axis" in at, "the axis attribute is required")
    return [ism.concat([t for t in ins if t is not None], at["axis"])]


@handler("Split", attrs=("axis", "split", "num_outputs"))
def _split(c, node, ins):
    at = _attrs(node)
    axis = at.get("axis", 0)
    n_out = len(node.output)
    if "split" in at or c.has_input(node, 1):
        if "split" not in at and node.input[1] not in c.consts:  # sizes computed at run time
            return ism.split_sizes(ins[0], ins[1], n_out, axis)
        sizes = _ints(at["split"] if "split" in at else c.consts[node.input[1]])
        refuse_unless(len(sizes) == n_out, f"{len(sizes)} sizes for {n_out} outputs")
        return ism.split(ins[0], sizes, axis)
    n = at.get("num_outputs", n_out)
    size = ins[0].shape[axis]
    if size is not None and size % n:  # opset 18: equal chunks of ceil(size / n), the last one smaller
        chunk = -(-size // n)
        sizes = [min(chunk, size - k * chunk) for k in range(n)]
        refuse_unless(min(sizes) > 0, f"{size} elements do not make {n} outputs")
        return ism.split(ins[0], sizes, axis)
    return ism.split(ins[0], n, axis)


def _axes(c, node, at):
    """(static axes or None, run-time axes tensor or None): the attribute (before opset 13) or input 1."""
    if "axes" in at:
        return _ints(at["axes"]), None
    if c.has_input(node, 1):
        if node.input[1] in c.consts:
            return _ints(c.consts[node.input[1]]), None
        return None, True
    return None, None


@handler("Squeeze", attrs=("axes",))
def _squeeze(c, node, ins):
    axes, dynamic = _axes(c, node, _attrs(node))
    if dynamic:
        return [ism.squeeze_dynamic(ins[0], ins[1])]
    return [ism.squeeze(ins[0], None if axes is None else tuple(axes))]


@handler("Unsqueeze", attrs=("axes",))
def _unsqueeze(c, node, ins):
    axes, dynamic = _axes(c, node, _attrs(node))
    if dynamic:
        return [ism.expand_dynamic(ins[0], ins[1])]
    refuse_unless(axes is not None, "axes are required")
    return [ism.expand_dims(ins[0], tuple(axes))]


@handler("Slice", attrs=("starts", "ends", "axes"))
def _slice(c, node, ins):
    x = ins[0]
    at = _attrs(node)
    if "starts" in at:  # opsets 1-9: bounds as attributes
        vals = [at["starts"], at["ends"], at.get("axes"), None]
    else:
        if any(n and n not in c.consts for n in node.input[1:]):  # bounds computed at run time
            opt = [ins[k] if len(ins) > k else None for k in (3, 4)]
            return [ism.slice_dynamic(x, ins[1], ins[2], *opt)]
        vals = [c.consts[n] if n else None for n in list(node.input[1:5]) + [""] * (5 - len(node.input))]
    starts, ends, axes, steps = [None if v is None else _ints(v) for v in vals]
    rank = len(x.shape)
    axes = list(range(len(starts))) if axes is None else [a % rank for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    refuse_unless(0 not in steps, "a step of 0")
    key = [slice(None)] * rank
    big = 2 ** 62
    for a, s, e, st in zip(axes, starts, ends, steps):
        key[a] = slice(None if abs(s) >= big else s, None if abs(e) >= big else e, st)
    return [x[tuple(key)]]


@handler("Gather", attrs=("axis",))
def _gather(c, node, ins):
    return [ism.gather(ins[0], ins[1], _attrs(node).get("axis", 0))]


@handler("Shape", attrs=("start", "end"))
def _shape(c, node, ins):
    at = _attrs(node)
    s = ism.shape(ins[0], "int64")
    start, end = at.get("start", 0), at.get("end")
    if start or end is not None:
        s = s[start:end]
    return [s]


@handler("Pad", attrs=("mode", "pads", "value"))
def _pad(c, node, ins):
    """Opsets 2-10: pads and value attributes; 11+: inputs, 18+: an axes input; 19+: wrap mode."""
    x = ins[0]
    at = _attrs(node)
    r = len(x.shape)
    mode = _s(at.get("mode", "constant"))
    refuse_unless(mode in ("constant", "reflect", "edge", "wrap"), f"mode '{mode}' is not an ONNX Pad mode")
    if "pads" in at or c.opset < 11:
        pads, value = _ints(at.get("pads", [0] * 2 * r)), float(at.get("value", 0.0))
        return [_pad_static(x, pads, mode, value)]
    axes = axes_t = None
    if c.has_input(node, 3):
        if c.const_or_none(node, 3) is None:  # axes known only at run time
            axes_t = ism.mod(ism.cast(ins[3], np.int64), ism.constant(np.array(r, np.int64)))
        else:
            axes = [a % r for a in _ints(c.consts[node.input[3]])]
    value_t = ins[2] if c.has_input(node, 2) else None
    pads = c.const_or_none(node, 1)
    value = c.const_or_none(node, 2)
    if pads is None or (value_t is not None and value is None) or axes_t is not None:
        p = ins[1] if pads is None else ism.constant(np.asarray(pads, np.int64).reshape(-1))
        p = ism.cast(p, np.int64) if p.dtype != np.int64 else p
        if axes_t is not None:  # the given axes' [begins, ends] scattered into zeros over every axis
            idx = ism.concat([axes_t, ism.add(axes_t, ism.constant(np.array(r, np.int64)))], 0)
            p = ism.scatter_elements(ism.constant(np.zeros(2 * r, np.int64)), idx, p, 0)
        elif axes is not None:  # scatter the given axes' pads into [begin..., end...] over every axis
            refuse_unless(len(set(axes)) == len(axes), f"repeated axes {axes}")
            zero = ism.constant(np.zeros(1, np.int64))
            where = {a: k for k, a in enumerate(axes)}
            n = len(axes)
            p = ism.concat([p[where[a] + half * n:where[a] + half * n + 1] if a in where else zero
                            for half in (0, 1) for a in range(r)], 0)
        return [pad_dynamic(x, p, value_t, mode)]
    pads = _ints(pads)
    if axes is not None:
        full = [0] * (2 * r)
        for k, a in enumerate(axes):
            full[a], full[a + r] = pads[k], pads[k + len(axes)]
        pads = full
    refuse_unless(len(pads) == 2 * r, f"{len(pads)} pads for rank {r}")
    v = 0.0 if value is None or np.asarray(value).size == 0 else np.asarray(value).reshape(-1)[0].item()
    return [_pad_static(x, pads, mode, v)]


def _pad_static(x, pads, mode, value):
    r = len(x.shape)
    refuse_unless(len(pads) == 2 * r, f"{len(pads)} pads for rank {r}")
    before, after = pads[:r], pads[r:]
    if mode == "wrap":
        for a, (b0, b1) in enumerate(zip(before, after)):
            refuse_unless(b0 >= 0 and b1 >= 0, "negative pads with mode wrap")
            if b0 or b1:
                refuse_unless(x.shape[a] is not None and max(b0, b1) <= x.shape[a],
                              "wrap pads need a known dim at least as large")
                key = [slice(None)] * r
                parts = []
                if b0:
                    key[a] = slice(x.shape[a] - b0, None)
                    parts.append(x[tuple(key)])
                parts.append(x)
                if b1:
                    key[a] = slice(0, b1)
                    parts.append(x[tuple(key)])
                x = ism.concat(parts, a)
        return x
    grow = [(max(a, 0), max(b, 0)) for a, b in zip(before, after)]
    y = ism.pad(x, grow, mode, value) if any(a or b for a, b in grow) else x
    if any(a < 0 or b < 0 for a, b in zip(before, after)):  # negative pads crop
        y = y[tuple(slice(-a if a < 0 else None, b if b < 0 else None) for a, b in zip(before, after))]
    return y


@handler("Constant", attrs=("value", "value_float", "value_floats", "value_int", "value_ints", "value_string",
                            "value_strings", "sparse_value"))
def _constant(c, node, ins):
    from onnx import numpy_helper  # deferred: onnx is a heavy or optional dependency
    refuse_unless(len(node.attribute) == 1, f"needs exactly one value attribute, got {len(node.attribute)}")
    at = node.attribute[0]
    if at.name == "value":
        v = numpy_helper.to_array(at.t)
    elif at.name == "value_float":
        v = np.array(at.f, np.float32)
    elif at.name == "value_floats":
        v = np.array(list(at.floats), np.float32)
    elif at.name == "value_int":
        v = np.array(at.i, np.int64)
    elif at.name == "value_ints":
        v = np.array(list(at.ints), np.int64)
    else:
        raise ImportError_(f"the '{at.name}' form is not supported (string and sparse constants)")
    if v.dtype == object or v.dtype.kind not in "fiub":
        raise ImportError_(f"dtype {v.dtype} is not supported")
    c.consts[node.output[0]] = v
    return [ism.constant(v, dtype=v.dtype)]


@handler("ConstantOfShape", attrs=("value",))
def _const_of_shape(c, node, ins):
    from onnx import numpy_helper  # deferred: onnx is a heavy or optional dependency
    at = [a for a in node.attribute if a.name == "value"]
    v = numpy_helper.to_array(at[0].t) if at else np.zeros(1, np.float32)
    refuse_unless(v.dtype != object and v.dtype.kind in "fiub", f"dtype {v.dtype} is not supported")
    if node.input[0] not in c.consts:  # a shape computed at run time
        return [ism.fill(ins[0], v.reshape(-1)[0].item(), v.dtype)]
    arr = np.full(_ints(c.consts[node.input[0]]), v.reshape(-1)[0], dtype=v.dtype)
    c.consts[node.output[0]] = arr
    return [ism.constant(arr, dtype=arr.dtype)]


@handler("Range", 11, attrs=("stash_type",))
def _range(c, node, ins):
    if all(n in c.consts for n in node.input):  # known at import: a constant
        arr = range_values(*(c.consts[n] for n in node.input))
        c.consts[node.output[0]] = arr
        return [ism.constant(arr, dtype=arr.dtype)]
    return [arange(*(ism.reshape(t, ()) if t.shape != () else t for t in ins))]


@handler("Expand", 8, attrs=())
def _expand(c, node, ins):
    x = ins[0]
    if node.input[1] in c.consts:
        shape = _ints(c.consts[node.input[1]])
        if all(d is not None for d in x.shape):
            return [ism.broadcast_to(x, np.broadcast_shapes(tuple(x.shape), tuple(shape)))]
        shape_t = ism.constant(np.array(shape, np.int64))
    else:
        shape_t = ins[1]
    # a shape known only at run time (or an input with unknown dims): broadcast against a filled tensor
    if x.dtype.kind == "b":
        return [ism.logical_or(x, ism.fill(shape_t, False, x.dtype))]
    return [ism.add(x, ism.fill(shape_t, 0, x.dtype))]
