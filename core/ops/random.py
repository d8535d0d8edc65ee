"""Seeded random ops. Each draws from the session's generator for its node (SessionState.rng):
deterministic for a given graph seed, op seed (attr "seed") and node name; a new draw on every run.
Draws are made on the host with numpy and handed to the kernel's array module."""
from __future__ import annotations

from typing import Optional

import numpy as np

from .. import dtypes as _dt
from ..errors import ShapeError
from ..graph import Tensor, get_default_graph
from ..registry import Cost, OpDef, register
from ..shapes import as_shape, fully_defined, num_elements_est
from .array import static_value
from .base import make

__all__ = ["random_normal", "random_uniform", "truncated_normal", "random_uniform_int"]


def _infer(node):
    shape = node.attrs["shape"]
    if not fully_defined(shape):
        raise ShapeError(f"random shape {shape} must be fully known")
    d = node.attrs["dtype"]
    want = "iu" if node.op == "RandomUniformInt" else "f"
    if d.kind not in want:
        raise ShapeError(f"{node.op} cannot produce {d.name}")
    return [(d, shape)]


def _cost(node):
    n = num_elements_est(node.outputs[0].shape)
    return Cost(20 * n, 0, n * node.outputs[0].dtype.itemsize)


def _to_xp(ctx, run):
    """Numpy draws as they are on the CPU; moved to the device under another array module."""
    if ctx.xp is np:
        return run
    asarray = ctx.xp.asarray
    return lambda: asarray(run())


def _float_draw(draw):
    """Generator methods take dtype= only for float32/float64; float16 is drawn in float32."""
    def factory(node, ctx):
        g = ctx.rng(node)
        shape, d = node.attrs["shape"], node.attrs["dtype"]
        a, b = node.attrs["a"], node.attrs["b"]
        native = d if d in (_dt.float32, _dt.float64) else _dt.float32
        if native == d:
            return _to_xp(ctx, lambda: draw(g, shape, d, a, b))
        return _to_xp(ctx, lambda: draw(g, shape, native, a, b).astype(d))
    return factory


def _normal(g, shape, d, mean, std):
    x = g.standard_normal(shape, dtype=d)
    if std != 1.0:
        x *= d.type(std)
    if mean != 0.0:
        x += d.type(mean)
    return x


def _uniform(g, shape, d, lo, hi):
    x = g.random(shape, dtype=d)
    x *= d.type(hi - lo)
    x += d.type(lo)
    return x


def _truncated(g, shape, d, mean, std):
    """Normal draws outside two standard deviations are redrawn, as in TensorFlow."""
    x = g.standard_normal(shape, dtype=d)
    bad = np.abs(x) > 2
    while bad.any():
        x[bad] = g.standard_normal(int(bad.sum()), dtype=d)
        bad = np.abs(x) > 2
    if std != 1.0:
        x *= d.type(std)
    if mean != 0.0:
        x += d.type(mean)
    return x


for _name, _draw in [("RandomNormal", _normal), ("RandomUniform", _uniform), ("TruncatedNormal", _truncated)]:
    register(OpDef(_name, inputs=(), attrs={"shape": (), "dtype": _dt.float32, "a": 0.0, "b": 1.0, "seed": None},
                   infer=_infer, kernel=_float_draw(_draw), cost=_cost, stateful=True,
                   doc="a, b: mean and stddev (normal) or min and max (uniform)."))


def _kernel_int(node, ctx):
    g = ctx.rng(node)
    shape, d, lo, hi = node.attrs["shape"], node.attrs["dtype"], node.attrs["a"], node.attrs["b"]
    lo, hi = int(lo), int(hi)
    return _to_xp(ctx, lambda: g.integers(lo, hi, size=shape, dtype=d))


register(OpDef("RandomUniformInt", inputs=(), attrs={"shape": (), "dtype": _dt.int32, "a": 0, "b": 1, "seed": None},
               infer=_infer, kernel=_kernel_int, cost=_cost, stateful=True, doc="integers in [a, b)."))


def _static_shape(shape) -> tuple:
    if isinstance(shape, Tensor):
        v = static_value(shape)
        if v is None or len(shape.shape) != 1:
            raise ShapeError(f"random shape tensor '{shape.name}' has no static value; random ops need a static shape")
        return v
    return as_shape(shape)


def _make(op, shape, a, b, dtype, seed, name) -> Tensor:
    attrs = {"shape": _static_shape(shape), "dtype": _dt.as_dtype(dtype), "a": a, "b": b,
             "seed": None if seed is None else int(seed)}
    return make(op, (), attrs, name=name or op, graph=get_default_graph()).outputs[0]


def random_normal(shape, mean: float = 0.0, stddev: float = 1.0, dtype="float32", seed: Optional[int] = None, name=None):
    """Normal draws of a static `shape` (ints, or a shape tensor whose value the graph knows)."""
    if stddev < 0:
        raise ValueError(f"random_normal stddev must be >= 0, got {stddev}")
    return _make("RandomNormal", shape, float(mean), float(stddev), dtype, seed, name)


def random_uniform(shape, minval: float = 0.0, maxval: Optional[float] = None, dtype="float32",
                   seed: Optional[int] = None, name=None):
    """Uniform draws in [minval, maxval) (maxval defaults to 1); an integer dtype draws integers
    (then maxval is required), as in TensorFlow."""
    if _dt.as_dtype(dtype).kind in "iu":
        if maxval is None:
            raise ValueError("random_uniform with an integer dtype needs maxval")
        return random_uniform_int(shape, minval, maxval, dtype, seed, name)
    maxval = 1.0 if maxval is None else maxval
    if maxval < minval:
        raise ValueError(f"random_uniform needs minval <= maxval, got [{minval}, {maxval})")
    return _make("RandomUniform", shape, float(minval), float(maxval), dtype, seed, name)


def truncated_normal(shape, mean: float = 0.0, stddev: float = 1.0, dtype="float32", seed: Optional[int] = None, name=None):
    """Normal draws with those beyond two standard deviations redrawn."""
    if stddev < 0:
        raise ValueError(f"truncated_normal stddev must be >= 0, got {stddev}")
    return _make("TruncatedNormal", shape, float(mean), float(stddev), dtype, seed, name)


def random_uniform_int(shape, minval: int, maxval: int, dtype="int32", seed: Optional[int] = None, name=None):
    """Integers drawn uniformly from [minval, maxval)."""
    if int(maxval) <= int(minval):
        raise ValueError(f"random_uniform_int needs minval < maxval, got [{minval}, {maxval})")
    return _make("RandomUniformInt", shape, int(minval), int(maxval), dtype, seed, name)
