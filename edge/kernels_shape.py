"""Edge kernels that move data without arithmetic (Gather, StridedSlice, Squeeze, ExpandAxes) and
Resize (nearest, linear). Each prepare takes the element dtype it runs on, so int8_shape.py registers
the same kernels for int8 tensors. Same contract as kernels.py: prepare(ctx) -> (output shapes,
bind), steps writing into arena views with out=."""
from __future__ import annotations

import math
from typing import List, Tuple

import numpy as np

from .format import EdgeModelError
from .kernel_tables import KERNELS
from .opcontext import OpContext

INDEX_DTYPES = ("int32", "int64")
SPEC_INDEX, SPEC_SLICE, SPEC_NEW = 0, 1, 2  # StridedSlice entry kinds (edge attribute 'kinds')
HAS_BEGIN, HAS_END, HAS_STEP = 1, 2, 4  # StridedSlice 'given' bits: which of begin/end/step an entry has


def _check(ctx: OpContext, n_in: int, dtype: str) -> None:
    if len(ctx.inputs) != n_in or any(t is None for t in ctx.inputs) or len(ctx.outputs) != 1:
        raise EdgeModelError(f"{ctx.op}: takes {n_in} inputs and makes one output")
    ctx.dtype(ctx.inputs[0], dtype), ctx.dtype(ctx.outputs[0], dtype)


def _copy_step(src: np.ndarray, dst: np.ndarray):
    copyto = np.copyto
    return lambda: copyto(dst, src)


# ---- Gather ------------------------------------------------------------------------------------------
def gather(ctx: OpContext, dtype: str = "float32"):
    """y = take(params, indices, axis); indices int32/int64, negative ones count from the end. Constant
    indices are checked once here; run-time ones by take (an out-of-range one raises, naming the op)."""
    _check(ctx, 2, dtype)
    params, idx = ctx.inputs
    ctx.dtype(idx, *INDEX_DTYPES)
    if not params.shape:
        raise EdgeModelError("Gather: params must have rank >= 1")
    axis = ctx.axis("axis", len(params.shape), 0)
    d = params.shape[axis]
    if idx.data is not None and idx.data.size and not (-d <= int(idx.data.min()) and int(idx.data.max()) < d):
        raise EdgeModelError(f"Gather: constant indices '{idx.name}' leave [-{d}, {d}) on axis {axis}")
    fixed = None if idx.data is None else np.where(idx.data < 0, idx.data + d, idx.data).astype(np.intp)
    out = params.shape[:axis] + tuple(idx.shape) + params.shape[axis + 1:]

    def bind(ins, outs, sc):
        p, y, take = ins[0], outs[0], np.take
        if fixed is not None:
            return lambda: take(p, fixed, axis=axis, out=y, mode="wrap")  # in range: checked above
        i = ins[1]

        def run():
            try:
                take(p, i, axis=axis, out=y)
            except IndexError as e:
                raise EdgeModelError(f"Gather: indices '{idx.name}' out of range for axis {axis} ({d}): {e}") from None
        return run
    return [out], bind


# ---- StridedSlice ------------------------------------------------------------------------------------
def slice_index(ctx: OpContext, shape: Tuple[int, ...]) -> Tuple[tuple, Tuple[int, ...]]:
    """(the numpy index, the output shape) of a StridedSlice from its edge attributes: per entry a kind
    (index, slice, new axis), begin, end, step and the bits saying which of them the entry gives."""
    kinds = ctx.attrs.get("kinds", ())
    n = len(kinds) if isinstance(kinds, tuple) else -1
    kinds = ctx.ints("kinds", n, lo=0, hi=2)
    begin, end, step = (ctx.ints(k, n, lo=-(1 << 62), hi=1 << 62) for k in ("begin", "end", "step"))
    given = ctx.ints("given", n, lo=0, hi=7)
    if sum(1 for k in kinds if k != SPEC_NEW) > len(shape):
        raise EdgeModelError(f"StridedSlice: {n} entries for a rank-{len(shape)} input {shape}")
    index, out, dim = [], [], 0
    for k, b, e, s, g in zip(kinds, begin, end, step, given):
        if k == SPEC_NEW:
            index.append(None)
            out.append(1)
            continue
        d = shape[dim]
        if k == SPEC_INDEX:
            if not -d <= b < d:
                raise EdgeModelError(f"StridedSlice: index {b} out of range for axis {dim} of size {d}")
            index.append(b)
        else:
            if g & HAS_STEP and s == 0:
                raise EdgeModelError(f"StridedSlice: axis {dim} has step 0")
            sl = slice(b if g & HAS_BEGIN else None, e if g & HAS_END else None, s if g & HAS_STEP else None)
            index.append(sl)
            out.append(len(range(*sl.indices(d))))
        dim += 1
    out.extend(shape[dim:])
    return tuple(index) + (Ellipsis,), tuple(out)


def strided_slice(ctx: OpContext, dtype: str = "float32"):
    _check(ctx, 1, dtype)
    index, out = slice_index(ctx, ctx.inputs[0].shape)
    return [out], lambda ins, outs, sc: _copy_step(ins[0][index], outs[0])


# ---- Squeeze / ExpandAxes ----------------------------------------------------------------------------
def _axes(ctx: OpContext, rank: int) -> List[int]:
    axes = ctx.attrs.get("axes", ())
    n = len(axes) if isinstance(axes, tuple) else -1
    if not rank:
        return []
    out = sorted({a % rank for a in ctx.ints("axes", n, lo=-rank, hi=rank - 1)})
    if len(out) != n:
        raise EdgeModelError(f"{ctx.op}: attribute 'axes' = {axes} names an axis twice")
    return out


def squeeze(ctx: OpContext, dtype: str = "float32"):
    """Drops the size-1 axes listed in 'axes' (all of them when 'axes' is empty)."""
    _check(ctx, 1, dtype)
    shape = ctx.inputs[0].shape
    axes = _axes(ctx, len(shape)) or [a for a, d in enumerate(shape) if d == 1]
    if any(shape[a] != 1 for a in axes):
        raise EdgeModelError(f"Squeeze: axes {axes} of {shape} are not all of size 1")
    out = tuple(d for a, d in enumerate(shape) if a not in axes)
    return [out], lambda ins, outs, sc: _copy_step(ins[0].reshape(out), outs[0])


def expand_axes(ctx: OpContext, dtype: str = "float32"):
    """Inserts size-1 axes at the output positions listed in 'axes'."""
    _check(ctx, 1, dtype)
    shape = ctx.inputs[0].shape
    given = ctx.attrs.get("axes", ())
    rank = len(shape) + (len(given) if isinstance(given, tuple) else 0)
    axes = _axes(ctx, rank)
    rest = iter(shape)
    out = tuple(1 if a in axes else next(rest) for a in range(rank))
    return [out], lambda ins, outs, sc: _copy_step(ins[0].reshape(out), outs[0])


# ---- Resize ------------------------------------------------------------------------------------------
COORDINATE_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric",
                    "tf_half_pixel_for_nn")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _source(mode: str, n: int, m: int, scale: float) -> np.ndarray:
    """The input coordinate of each of m output positions along an axis of n (ONNX's transforms)."""
    o = np.arange(m, dtype=np.float64)
    length = n * scale  # the unrounded output length
    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if length > 1 else np.zeros(m)
    if mode == "align_corners":
        return o * (n - 1) / (length - 1) if length > 1 else np.zeros(m)
    if mode == "asymmetric":
        return o / scale
    if mode == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    return n / 2.0 * (1 - m / (scale * n)) + (o + 0.5) / scale - 0.5  # half_pixel_symmetric


def _nearest(rule: str, x: np.ndarray, n: int) -> np.ndarray:
    i = {"round_prefer_floor": lambda: np.ceil(x - 0.5), "round_prefer_ceil": lambda: np.floor(x + 0.5),
         "floor": lambda: np.floor(x), "ceil": lambda: np.ceil(x)}[rule]()
    return np.clip(i, 0, n - 1).astype(np.intp)


def resize_plan(ctx: OpContext, shape: Tuple[int, ...]) -> List[Tuple[int, int, float]]:
    """(axis, output size, scale) of every axis that changes: a size > 0 wins (its scale size / n
    unless a scale is given), otherwise output = floor(n * scale)."""
    rank = len(shape)
    scales = ctx.attrs.get("scales", ()) or ()
    sizes = ctx.attrs.get("sizes", ()) or ()
    if (scales and len(scales) != rank) or (sizes and len(sizes) != rank):
        raise EdgeModelError(f"Resize: {len(scales)} scales and {len(sizes)} sizes for a rank-{rank} input")
    sizes = ctx.ints("sizes", rank, lo=0, hi=1 << 24) if sizes else (0,) * rank
    if scales and not all(isinstance(s, (int, float)) and math.isfinite(s) and 0 < s <= (1 << 16) for s in scales):
        raise EdgeModelError(f"Resize: scales {scales} must be positive and finite")
    plan = []
    for a, n in enumerate(shape):
        if sizes[a] > 0:
            m, s = sizes[a], (float(scales[a]) if scales else sizes[a] / n)
        else:
            s = float(scales[a]) if scales else 1.0
            m = int(math.floor(n * s))
        if m <= 0 or m > (1 << 24):
            raise EdgeModelError(f"Resize: axis {a} of size {n} would become {m}")
        if m != n or s != 1.0:
            plan.append((a, m, s))
    return plan


def resize(ctx: OpContext, dtype: str = "float32"):
    """Separable: one gather (nearest) or two gathers and a blend (linear) per resized axis, through
    scratch between axes; the index and weight vectors are computed once here."""
    _check(ctx, 1, dtype)
    mode = ctx.choice("mode", "nearest", ("nearest", "linear") if dtype == "float32" else ("nearest",))
    coord = ctx.choice("coordinate_mode", "half_pixel", COORDINATE_MODES)
    rule = ctx.choice("nearest_mode", "round_prefer_floor", NEAREST_MODES)
    shape = ctx.inputs[0].shape
    steps, cur = [], tuple(shape)
    for a, m, s in resize_plan(ctx, shape):
        n = cur[a]
        cur = cur[:a] + (m,) + cur[a + 1:]
        x = _source(coord, n, m, s)
        view = (-1,) + (1,) * (len(shape) - a - 1)
        if mode == "nearest":
            steps.append((a, cur, _nearest(rule, x, n), None, None))
        else:
            x = np.clip(x, 0, n - 1)
            i0 = np.floor(x).astype(np.intp)
            w1 = x - i0
            steps.append((a, cur, i0, np.minimum(i0 + 1, n - 1), (
                (1.0 - w1).astype(np.float32).reshape(view), w1.astype(np.float32).reshape(view))))
    # scratch: the intermediate after each axis but the last, and (linear) the second tap's gather
    i_mid = [ctx.scratch(c, np.dtype(dtype)) for _, c, _, _, _ in steps[:-1]]
    i_tap = [ctx.scratch(c, np.float32) if i1 is not None else None for _, c, _, i1, _ in steps]

    def bind(ins, outs, sc):
        if not steps:
            return _copy_step(ins[0], outs[0])
        take, multiply, add = np.take, np.multiply, np.add
        runs, src = [], ins[0]
        for k, (a, _, i0, i1, w) in enumerate(steps):
            dst = outs[0] if k == len(steps) - 1 else sc[i_mid[k]]
            if i1 is None:
                runs.append(lambda src=src, dst=dst, a=a, i0=i0: take(src, i0, axis=a, out=dst, mode="wrap"))
            else:
                tap = sc[i_tap[k]]

                def blend(src=src, dst=dst, a=a, i0=i0, i1=i1, tap=tap, w0=w[0], w1=w[1]):
                    take(src, i0, axis=a, out=dst, mode="wrap")
                    multiply(dst, w0, out=dst)
                    take(src, i1, axis=a, out=tap, mode="wrap")
                    multiply(tap, w1, out=tap)
                    add(dst, tap, out=dst)
                runs.append(blend)
            src = dst
        if len(runs) == 1:
            return runs[0]

        def run():
            for r in runs:
                r()
        return run
    return [cur], bind


for _name, _prepare in (("Gather", gather), ("StridedSlice", strided_slice), ("Squeeze", squeeze),
                        ("ExpandAxes", expand_axes), ("Resize", resize)):
    KERNELS[_name] = _prepare
KERNELS["Gather"].index_inputs = (1,)  # inputs an fp32 kernel takes as integers (the interpreter's dtype check)
# the format writers (converters/edge_geometry.py) compute the same coordinates: one rule, one place
source_coordinates, nearest_indices = _source, _nearest
