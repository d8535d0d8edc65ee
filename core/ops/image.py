"""Resize: nearest, (multi-)linear and cubic resampling of any axes, with ONNX's coordinate modes.

Each resized axis is resampled on its own (the interpolations are separable): nearest is one
`take` along the axis, linear and cubic one GEMM against a small [out, in] interpolation matrix. The
gradient multiplies by the same matrices transposed. Scales or sizes are attributes, or one
run-time input (`param`), in which case the kernel builds the matrices per input shape and
caches them.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, register
from ..shapes import fmt, num_elements_est
from .base import convert, make

__all__ = ["resize"]

COORDINATE_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric",
                    "tf_half_pixel_for_nn")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _source_coords(mode: str, n: int, m: int, scale: float) -> np.ndarray:
    """Input coordinate of each of the m output positions along an axis of n inputs."""
    o = np.arange(m, dtype=np.float64)
    length = n * scale  # the unrounded output length, as the ONNX reference implementation uses
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
    adj = m / (scale * n)  # half_pixel_symmetric
    return n / 2.0 * (1 - adj) + (o + 0.5) / scale - 0.5


def _nearest_index(node_attrs, n: int, m: int, scale: float) -> np.ndarray:
    x = _source_coords(node_attrs["coordinate_mode"], n, m, scale)
    rule = node_attrs["nearest_mode"]
    if rule == "round_prefer_floor":
        i = np.ceil(x - 0.5)
    elif rule == "round_prefer_ceil":
        i = np.floor(x + 0.5)
    elif rule == "floor":
        i = np.floor(x)
    else:
        i = np.ceil(x)
    return np.clip(i, 0, n - 1).astype(np.intp)


def _cubic_weights(t: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution weights of the taps at distances 1 + t, t, 1 - t, 2 - t. -> [m, 4]"""
    d = np.stack([1 + t, t, 1 - t, 2 - t], axis=1)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, far)


def _antialias_matrix(node_attrs, n: int, m: int, scale: float, dtype) -> np.ndarray:
    """[m, n] matrix of a linear or cubic downscale with antialiasing (ONNX antialias=1): the filter
    stretched by 1/scale, its weights normalised; taps outside repeat the edge (or drop out with
    exclude_outside), as the ONNX reference implementation does."""
    a = float(node_attrs["cubic_coeff_a"])
    cubic = node_attrs["mode"] == "cubic"
    start = int(np.floor((-2 if cubic else -1) / scale) + 1)
    k = np.arange(start, (2 if cubic else 1) - start + 1)  # tap offsets from the left neighbour
    x = _source_coords(node_attrs["coordinate_mode"], n, m, scale)
    base = np.floor(x)
    ratio = x - base
    base = np.where(ratio == 0, base - 1, base)  # the ratio lies in (0, 1]: the left neighbour is preferred
    ratio = x - base
    d = np.abs((k[None, :] - ratio[:, None]) * scale)
    if cubic:
        w = np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                     np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))
    else:
        w = np.clip(1 - d, 0, 1)
    w /= w.sum(axis=1, keepdims=True)
    taps = base.astype(np.intp)[:, None] + k[None, :]
    if node_attrs["exclude_outside"]:
        w = np.where((taps >= 0) & (taps < n), w, 0.0)
        w /= w.sum(axis=1, keepdims=True)
    mat = np.zeros((m, n), np.float64)
    np.add.at(mat, (np.repeat(np.arange(m), len(k)), np.clip(taps, 0, n - 1).reshape(-1)), w.reshape(-1))
    return mat.astype(dtype)


def _matrix(node_attrs, n: int, m: int, scale: float, dtype) -> np.ndarray:
    """[m, n] interpolation matrix of one axis (one 1 per row for nearest)."""
    if node_attrs.get("antialias") and node_attrs["mode"] in ("linear", "cubic") and scale < 1:
        return _antialias_matrix(node_attrs, n, m, scale, dtype)
    mat = np.zeros((m, n), np.float64)
    rows = np.arange(m)
    if node_attrs["mode"] == "nearest":
        mat[rows, _nearest_index(node_attrs, n, m, scale)] = 1.0
        return mat.astype(dtype)
    if node_attrs["mode"] == "cubic":  # four taps; outside the input they repeat the edge or drop out
        x = _source_coords(node_attrs["coordinate_mode"], n, m, scale)
        x0 = np.floor(x)
        w = _cubic_weights(x - x0, float(node_attrs["cubic_coeff_a"]))
        taps = x0.astype(np.intp)[:, None] + np.arange(-1, 3)[None, :]
        if node_attrs["exclude_outside"]:
            w = np.where((taps >= 0) & (taps < n), w, 0.0)
            w /= w.sum(axis=1, keepdims=True)
        np.add.at(mat, (np.repeat(rows, 4), np.clip(taps, 0, n - 1).reshape(-1)), w.reshape(-1))
        return mat.astype(dtype)
    x = np.clip(_source_coords(node_attrs["coordinate_mode"], n, m, scale), 0, n - 1)
    i0 = np.floor(x).astype(np.intp)
    i1 = np.minimum(i0 + 1, n - 1)
    w1 = x - i0
    np.add.at(mat, (rows, i0), 1.0 - w1)
    np.add.at(mat, (rows, i1), w1)
    return mat.astype(dtype)


def _plan(attrs, shape: Sequence[int], param: Optional[np.ndarray]) -> Dict[int, Tuple[int, float]]:
    """axis -> (output size, scale) for every axis that changes. A size given without its scale
    implies scale = size / input; the keep-aspect policies give every axis one common scale."""
    rank = len(shape)
    scales = list(attrs["scales"]) or [None] * rank
    sizes = list(attrs["sizes"]) or [None] * rank
    if param is not None:
        vals = np.asarray(param).reshape(-1)
        axes = attrs["axes"] or tuple(range(rank))
        if vals.size != len(axes):
            raise ValueError(f"Resize: {vals.size} {attrs['param']} for {len(axes)} axes")
        for a, v in zip(axes, vals):
            if attrs["param"] == "scales":
                scales[a] = float(v)
            else:
                sizes[a] = int(v)
        if attrs["param"] == "sizes" and attrs["policy"] != "stretch":
            ratios = [sizes[a] / shape[a] for a in axes]
            common = min(ratios) if attrs["policy"] == "not_larger" else max(ratios)
            for a in axes:
                sizes[a], scales[a] = int(math.floor(shape[a] * common + 0.5)), common
    out = {}
    for a in range(rank):
        n = shape[a]
        if sizes[a] is not None and sizes[a] > 0:  # a static size of 0 keeps the axis
            m = int(sizes[a])
            s = scales[a] if scales[a] is not None else (m / n if n else 1.0)
        else:
            s = 1.0 if scales[a] is None else float(scales[a])
            if not s > 0 or not math.isfinite(s):
                raise ValueError(f"Resize: scale {s} on axis {a} must be positive and finite")
            m = int(math.floor(n * s))
        if m <= 0 or m > (1 << 31):
            raise ValueError(f"Resize: axis {a} of size {n} would become {m}")
        if m != n or s != 1.0:
            out[a] = (m, s)
    total = int(np.prod([out[a][0] if a in out else shape[a] for a in range(rank)], dtype=np.float64))
    if total > (1 << 31):
        raise ValueError(f"Resize of {tuple(shape)} would make {total} elements (more than 2^31)")
    return out


def _infer_resize(node):
    x = node.inputs[0]
    if x.dtype.kind != "f" and node.attrs["mode"] != "nearest":
        raise ShapeError(f"linear Resize needs a float input, got {x.dtype.name}")
    if node.attrs["mode"] not in ("nearest", "linear", "cubic"):
        raise ShapeError(f"Resize mode must be nearest, linear or cubic, got {node.attrs['mode']!r}")
    if node.attrs["coordinate_mode"] not in COORDINATE_MODES:
        raise ShapeError(f"Resize coordinate mode {node.attrs['coordinate_mode']!r} is not one of {COORDINATE_MODES}")
    if node.attrs["nearest_mode"] not in NEAREST_MODES:
        raise ShapeError(f"Resize nearest mode {node.attrs['nearest_mode']!r} is not one of {NEAREST_MODES}")
    rank = len(x.shape)
    for k in ("scales", "sizes"):
        if node.attrs[k] and len(node.attrs[k]) != rank:
            raise ShapeError(f"Resize: {len(node.attrs[k])} {k} for a rank-{rank} input {fmt(x.shape)}")
    if len(node.inputs) > 1:  # run-time scales or sizes: the resized axes are unknown until then
        axes = node.attrs["axes"] or tuple(range(rank))
        return [(x.dtype, tuple(None if a in axes else d for a, d in enumerate(x.shape)))]
    out = []
    for a, d in enumerate(x.shape):
        if node.attrs["sizes"] and int(node.attrs["sizes"][a]) > 0:
            out.append(int(node.attrs["sizes"][a]))
        elif node.attrs["sizes"]:
            out.append(d)
        elif d is None:
            out.append(None)
        else:
            out.append(int(math.floor(d * float(node.attrs["scales"][a] if node.attrs["scales"] else 1.0))))
    if any(d is not None and d <= 0 for d in out):
        raise ShapeError(f"Resize of {fmt(x.shape)} gives an empty shape {fmt(tuple(out))}")
    return [(x.dtype, tuple(out))]


def _apply(xp, x, a, mat):
    """Multiply axis a of x by mat [m, n]."""
    y = xp.tensordot(x, mat, axes=([a], [1]))  # the new axis comes last
    return xp.moveaxis(y, -1, a)


def _kernel_resize(node, ctx):
    xp = ctx.xp
    attrs = dict(node.attrs)
    cache: Dict[tuple, list] = {}

    def steps(shape, param):
        key = (shape, None if param is None else tuple(np.asarray(param).reshape(-1).tolist()))
        if key not in cache:
            plan = _plan(attrs, shape, param)
            cache.clear()  # one entry: the shapes of a plan rarely alternate
            if attrs["mode"] == "nearest":
                cache[key] = [(a, xp.asarray(_nearest_index(attrs, shape[a], m, s))) for a, (m, s) in plan.items()]
            else:
                cache[key] = [(a, xp.asarray(_matrix(attrs, shape[a], m, s, node.outputs[0].dtype)))
                              for a, (m, s) in plan.items()]
        return cache[key]

    def run(x, *param):
        p = None if not param else (param[0].get() if hasattr(param[0], "get") else param[0])
        for a, op in steps(x.shape, p):
            x = xp.take(x, op, axis=a) if attrs["mode"] == "nearest" else _apply(xp, x, a, op)
        return xp.ascontiguousarray(x)
    return run


def _kernel_resize_grad(node, ctx):
    xp = ctx.xp
    attrs = dict(node.attrs)

    def run(dy, x, *param):
        p = None if not param else (param[0].get() if hasattr(param[0], "get") else param[0])
        plan = _plan(attrs, x.shape, p)
        for a, (m, s) in reversed(list(plan.items())):
            dy = _apply(xp, dy, a, xp.asarray(_matrix(attrs, x.shape[a], m, s, dy.dtype)).T)
        return xp.ascontiguousarray(dy)
    return run


def _g_resize(node, dys):
    if node.inputs[0].dtype.kind != "f":
        return [None] * len(node.inputs)
    dx = make("ResizeGrad", (dys[0], node.inputs[0]) + tuple(node.inputs[1:]), dict(node.attrs)).outputs[0]
    return [dx] + [None] * (len(node.inputs) - 1)


def _cost(node):
    x, y = node.inputs[0], node.outputs[0]
    n_out = num_elements_est(y.shape)
    taps = 1 if node.attrs["mode"] == "nearest" else 2 * len(x.shape)
    return Cost(n_out * taps, num_elements_est(x.shape) * x.dtype.itemsize, n_out * y.dtype.itemsize)


_ATTRS = {"scales": (), "sizes": (), "param": "", "axes": (), "mode": "nearest", "coordinate_mode": "half_pixel",
          "nearest_mode": "round_prefer_floor", "policy": "stretch", "cubic_coeff_a": -0.75, "exclude_outside": False,
          "antialias": False}


def _infer_resize_grad(node):
    return [(node.inputs[1].dtype, node.inputs[1].shape)]


register(OpDef("Resize", inputs=("x", "*param"), attrs=dict(_ATTRS), infer=_infer_resize, kernel=_kernel_resize,
               grad=_g_resize, cost=_cost,
               doc="Nearest or linear resampling (ONNX coordinate modes); scales/sizes static or one run-time input."))
register(OpDef("ResizeGrad", inputs=("dy", "x", "*param"), attrs=dict(_ATTRS), infer=_infer_resize_grad,
               kernel=_kernel_resize_grad, cost=_cost))


def resize(x, scales: Sequence[float] = (), sizes: Sequence[int] = (), mode: str = "nearest",
           coordinate_mode: str = "half_pixel", nearest_mode: str = "round_prefer_floor",
           param: Optional[Tensor] = None, param_kind: str = "scales", axes: Sequence[int] = (),
           policy: str = "stretch", cubic_coeff_a: float = -0.75, exclude_outside: bool = False,
           antialias: bool = False, name: Optional[str] = None) -> Tensor:
    """Resample `x`: per-axis `scales` (output = floor(input * scale)) or `sizes` (0: keep), or a run-time
    `param` tensor holding the scales or sizes (`param_kind`) of `axes` (default: all axes)."""
    x = convert(x)
    if param is not None and param_kind not in ("scales", "sizes"):
        raise ShapeError(f"Resize param_kind must be 'scales' or 'sizes', got {param_kind!r}")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise ShapeError(f"Resize policy must be stretch, not_larger or not_smaller, got {policy!r}")
    attrs = {"scales": tuple(float(s) for s in scales), "sizes": tuple(int(s) for s in sizes),
             "param": param_kind if param is not None else "", "axes": tuple(int(a) % max(len(x.shape), 1)
                                                                                  for a in axes),
             "mode": mode, "coordinate_mode": coordinate_mode, "nearest_mode": nearest_mode, "policy": policy,
             "cubic_coeff_a": float(cubic_coeff_a), "exclude_outside": bool(exclude_outside),
             "antialias": bool(antialias)}
    return make("Resize", (x,) if param is None else (x, convert(param)), attrs, name=name).outputs[0]
