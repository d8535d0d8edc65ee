"""Neural-network ops: softmax, log_softmax, softmax cross-entropy (sparse and dense labels),
dropout, batch_norm and layer_norm. Each backward pass is one fused kernel."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ... import jit
from ..errors import ShapeError
from ..graph import Tensor
from ..registry import OpDef, elementwise_cost, register
from ..shapes import compatible, fmt, normalize_axis
from . import depthwise as _dw
from .base import convert, make
from .par_gate import split_rows
from .math import mul

__all__ = ["softmax", "log_softmax", "sparse_softmax_cross_entropy", "softmax_cross_entropy", "dropout",
           "batch_norm", "layer_norm"]


def _float_input(node, i=0):
    t = node.inputs[i]
    if t.dtype.kind != "f":
        raise ShapeError(f"needs a float input, got {t.dtype.name}")
    return t


# ---- softmax / log_softmax ----------------------------------------------------------------------
def _infer_softmax(node):
    x = _float_input(node)
    normalize_axis(node.attrs["axis"], len(x.shape))
    return [(x.dtype, x.shape)]


def _softmax(xp, x, axis):
    e = x - x.max(axis=axis, keepdims=True)
    xp.exp(e, out=e)
    e /= e.sum(axis=axis, keepdims=True)
    return e


def _log_softmax(xp, x, axis):
    z = x - x.max(axis=axis, keepdims=True)
    z -= xp.log(xp.exp(z).sum(axis=axis, keepdims=True))
    return z


def _compiled_rows(xp, x, axis) -> bool:
    """Whether jit/rows.py's compiled row loop serves x (CPU float32, a non-empty last axis)."""
    return (xp is np and x.dtype == np.float32 and x.ndim > 0 and axis in (-1, x.ndim - 1) and x.size > 0
            and jit.available())


def _kernel_softmax(node, ctx):
    xp, axis = ctx.xp, node.attrs["axis"]

    def run(x):
        if _compiled_rows(xp, x, axis):
            n = x.shape[-1]
            out = np.empty(x.shape, np.float32)
            jit.loaded("rows").softmax_rows(_rows_of(x, n), out.reshape(-1, n))
            return out
        return _softmax(xp, x, axis)
    return run


register(OpDef("Softmax", inputs=("x",), attrs={"axis": -1}, infer=_infer_softmax, kernel=_kernel_softmax,
               grad=lambda node, dys: [make("SoftmaxGrad", (node.outputs[0], dys[0]), {"axis": node.attrs["axis"]}).outputs[0]],
               cost=elementwise_cost(15)))
register(OpDef("LogSoftmax", inputs=("x",), attrs={"axis": -1}, infer=_infer_softmax,
               kernel=lambda node, ctx: (lambda x, a=node.attrs["axis"]: _log_softmax(ctx.xp, x, a)),
               grad=lambda node, dys: [make("LogSoftmaxGrad", (node.outputs[0], dys[0]), {"axis": node.attrs["axis"]}).outputs[0]],
               cost=elementwise_cost(15)))


def _kernel_softmax_grad(node, ctx):
    a = node.attrs["axis"]
    return lambda y, dy: y * (dy - (dy * y).sum(axis=a, keepdims=True))


def _kernel_log_softmax_grad(node, ctx):
    a, xp = node.attrs["axis"], ctx.xp
    return lambda y, dy: dy - xp.exp(y) * dy.sum(axis=a, keepdims=True)


for _name, _k in [("SoftmaxGrad", _kernel_softmax_grad), ("LogSoftmaxGrad", _kernel_log_softmax_grad)]:
    register(OpDef(_name, inputs=("y", "dy"), attrs={"axis": -1},
                   infer=lambda node: [(node.inputs[0].dtype, node.inputs[0].shape)], kernel=_k,
                   cost=elementwise_cost(4)))


def softmax(x, axis: int = -1, name=None) -> Tensor:
    return make("Softmax", (convert(x),), {"axis": int(axis)}, name=name).outputs[0]


def log_softmax(x, axis: int = -1, name=None) -> Tensor:
    return make("LogSoftmax", (convert(x),), {"axis": int(axis)}, name=name).outputs[0]


# ---- cross-entropy ---------------------------------------------------------------------------------
def _infer_sparse_xent(node):
    labels, logits = node.inputs
    if labels.dtype.kind not in "iu":
        raise ShapeError(f"labels must be integer class ids, got {labels.dtype.name}")
    _float_input(node, 1)
    if len(logits.shape) != 2 or len(labels.shape) != 1 or not compatible(labels.shape, logits.shape[:1]):
        raise ShapeError(f"expects labels [N] and logits [N, classes], got {fmt(labels.shape)} and {fmt(logits.shape)}")
    return [(logits.dtype, logits.shape[:1]), (logits.dtype, logits.shape)]


def check_labels(labels, classes, where: str = "") -> None:
    """Raise when host class ids leave [0, classes) (classes None: unknown, only ids < 0 fail).

    One rule for the CPU kernel and the GPU's host-side checks (the copy that uploads the labels,
    or a constant's value), so both paths fail with the same words."""
    if not labels.size:
        return
    lo, hi = labels.min(), labels.max()
    if lo < 0 or (classes is not None and hi >= classes):
        bound = "?" if classes is None else classes
        raise ValueError(f"{where}label out of range [0, {bound}): min {lo}, max {hi}")


def _kernel_sparse_xent(node, ctx):
    xp = ctx.xp

    def run(labels, logits):
        n, c = logits.shape
        check_labels(labels, c)
        rows = xp.arange(n)
        m = logits.max(axis=1, keepdims=True)
        p = logits - m
        xp.exp(p, out=p)
        s = p.sum(axis=1, keepdims=True)
        loss = xp.log(s[:, 0]) + m[:, 0] - logits[rows, labels]
        p /= s
        p[rows, labels] -= 1  # backprop: softmax - onehot, computed once with the loss
        return loss.astype(logits.dtype, copy=False), p
    return run


def _g_xent(node, dys):
    dy = dys[0]
    if dy is None:
        return [None, None]
    d = make("ExpandAxes", (dy,), {"axes": (1,)}).outputs[0]
    return [None, mul(d, node.outputs[1])]


register(OpDef("SparseSoftmaxCrossEntropy", inputs=("labels", "logits"), infer=_infer_sparse_xent,
               kernel=_kernel_sparse_xent, grad=_g_xent, cost=elementwise_cost(15),
               doc="Per-example loss and its backprop (softmax - onehot) in one pass."))


def _infer_xent(node):
    labels, logits = node.inputs
    _float_input(node, 1)
    if labels.dtype != logits.dtype or not compatible(labels.shape, logits.shape) or len(logits.shape) != 2:
        raise ShapeError(f"expects labels and logits [N, classes] of one dtype, got "
                         f"{labels.dtype.name}{fmt(labels.shape)} and {logits.dtype.name}{fmt(logits.shape)}")
    return [(logits.dtype, logits.shape[:1]), (logits.dtype, logits.shape)]


def _kernel_xent(node, ctx):
    xp = ctx.xp

    def run(labels, logits):
        lp = _log_softmax(xp, logits, 1)
        loss = -(labels * lp).sum(axis=1)
        return loss, xp.exp(lp) * labels.sum(axis=1, keepdims=True) - labels
    return run


register(OpDef("SoftmaxCrossEntropy", inputs=("labels", "logits"), infer=_infer_xent, kernel=_kernel_xent,
               grad=_g_xent, cost=elementwise_cost(15),
               doc="Per-example loss for label distributions, and its backprop w.r.t. logits."))


def sparse_softmax_cross_entropy(labels, logits, name=None) -> Tensor:
    """Per-example cross-entropy [N] of integer labels [N] against logits [N, classes]."""
    return make("SparseSoftmaxCrossEntropy", (convert(labels), convert(logits)), name=name).outputs[0]


def softmax_cross_entropy(labels, logits, name=None) -> Tensor:
    """Per-example cross-entropy [N] of label distributions [N, C] against logits [N, C]."""
    logits = convert(logits)
    return make("SoftmaxCrossEntropy", (convert(labels, logits.dtype), logits), name=name).outputs[0]


# ---- dropout -----------------------------------------------------------------------------------------
def _kernel_dropout(node, ctx):
    rate = node.attrs["rate"]
    g = ctx.rng(node)
    xp = ctx.xp

    def run(x):
        if rate == 0.0:
            return x, xp.ones_like(x)
        keep = g.random(x.shape, dtype=np.float32) >= rate
        mask = keep.astype(x.dtype)
        mask *= x.dtype.type(1.0 / (1.0 - rate))
        return x * mask, mask
    return run


def _infer_dropout(node):
    x = _float_input(node)
    if not 0.0 <= node.attrs["rate"] < 1.0:
        raise ShapeError(f"dropout rate must be in [0, 1), got {node.attrs['rate']}")
    return [(x.dtype, x.shape), (x.dtype, x.shape)]


def _g_dropout(node, dys):
    return [None if dys[0] is None else mul(dys[0], node.outputs[1])]


register(OpDef("Dropout", inputs=("x",), attrs={"rate": 0.5, "seed": None}, infer=_infer_dropout,
               kernel=_kernel_dropout, grad=_g_dropout, stateful=True, cost=elementwise_cost(3),
               doc="Outputs (x * mask, mask); mask is 0 or 1/(1-rate), fresh each run."))


def dropout(x, rate: float, seed: Optional[int] = None, name=None) -> Tensor:
    return make("Dropout", (convert(x),), {"rate": float(rate), "seed": seed}, name=name).outputs[0]


# ---- batch norm ------------------------------------------------------------------------------------
def _bn_axes(node):
    rank = len(node.inputs[0].shape)
    axis = normalize_axis(node.attrs["axis"], rank)
    return axis, tuple(i for i in range(rank) if i != axis), tuple(-1 if i == axis else 1 for i in range(rank))


def _infer_bn(node):
    x = _float_input(node)
    axis, _, _ = _bn_axes(node)
    c = x.shape[axis]
    for t, what in zip(node.inputs[1:], ("scale", "offset", "mean", "variance")):
        if t.dtype != x.dtype or len(t.shape) != 1 or not compatible(t.shape, (c,)):
            raise ShapeError(f"{what} must be {x.dtype.name}[{c}], got {t.dtype.name}{fmt(t.shape)}")
    return [(x.dtype, x.shape), (x.dtype, (c,)), (x.dtype, (c,))]


def _bn_compiled(xp, x) -> bool:
    return x.ndim >= 2 and _dw.compiled_ok(xp, x.dtype)


def _bn_view(x, axis):
    """x as [A, C, B] (contiguous), the channel axis in the middle."""
    a = 1
    for d in x.shape[:axis]:
        a *= d
    return (x if x.flags.c_contiguous else np.ascontiguousarray(x)).reshape(a, x.shape[axis], -1)


def _by_channels(kernel, args: tuple, c: int, work: int) -> None:
    """kernel(*args, c0, c1) over channel ranges (jit.batchnorm's range forms: each channel alone, so
    the same bytes on any thread count), split across numba's threads where threads.par_threads
    says `work` (bytes a copy would write in the same time) pays (intra_op.par_rows)."""
    from ...jit import par_pool  # noqa: F401  # deferred: loads numba; registers the kernels' prange drivers
    split_rows(kernel, args, c, work)


def _bn_forward_compiled(x, scale, offset, mean, var, axis, eps, training, cache):
    """BatchNorm by the compiled kernels (isthmus.jit.batchnorm): statistics in float64, then
    one pass y = x * inv + shift. In inference mode inv and shift are kept in `cache` (a dict)
    while the four parameters are read-only arrays (frozen constants) that stay the same."""
    from ...jit.batchnorm import apply_range, stats_range  # deferred: jit.batchnorm loads numba
    x3 = _bn_view(x, axis)
    c, dt = x3.shape[1], x.dtype
    params = (scale, offset, mean, var)
    hit = cache.get("entry")  # (params, dtype, inv, shift), replaced whole: threads may share the kernel
    if not training and hit is not None and all(a is b for a, b in zip(hit[0], params)) and hit[1] == dt:
        inv_t, shift = hit[2], hit[3]
    else:
        if training:
            m64, v64 = np.empty(c), np.empty(c)
            _by_channels(stats_range, (x3, m64, v64), c, x.nbytes)
            mean, var = m64.astype(dt), v64.astype(dt)
        else:
            m64, v64 = mean.astype(np.float64), var.astype(np.float64)
        inv = scale.astype(np.float64) / np.sqrt(v64 + eps)
        shift = (offset.astype(np.float64) - m64 * inv).astype(dt)
        inv_t = inv.astype(dt)
        if not training and all(_dw._immutable(a) for a in params):
            cache["entry"] = (params, dt, inv_t, shift)  # holding the parameters keeps their ids unique
    y = np.empty(x3.shape, dt)
    _by_channels(apply_range, (x3, inv_t, shift, y), c, y.nbytes)
    return y.reshape(x.shape), mean.astype(dt, copy=False), var.astype(dt, copy=False)


def _bn_grad_compiled(dy, x, scale, mean, var, axis, eps, training):
    from ...jit.batchnorm import grad_range  # deferred: jit.batchnorm loads numba
    x3, dy3 = _bn_view(x, axis), _bn_view(dy.astype(x.dtype, copy=False), axis)
    c, dt = x3.shape[1], x.dtype
    inv = 1.0 / np.sqrt(var.astype(np.float64) + eps)
    m64, s64 = mean.astype(np.float64), scale.astype(np.float64)
    dx = np.empty(x3.shape, dt)
    dgamma, dbeta = np.empty(c), np.empty(c)
    _by_channels(grad_range, (dy3, x3, m64, inv, s64, training, dx, dgamma, dbeta), c, 2 * x.nbytes)
    dx = dx.reshape(x.shape)
    if training:
        return dx, dgamma.astype(dt), dbeta.astype(dt), np.zeros_like(mean), np.zeros_like(var)
    dmean = (-(dbeta * s64 * inv)).astype(dt)
    dvar = (-0.5 * dgamma * s64 * inv * inv).astype(dt)
    return dx, dgamma.astype(dt), dbeta.astype(dt), dmean, dvar


def _kernel_bn(node, ctx):
    xp = ctx.xp
    axis, axes, bshape = _bn_axes(node)
    eps, training = node.attrs["epsilon"], node.attrs["training"]

    cache: dict = {}

    def run(x, scale, offset, mean, var):
        if _bn_compiled(xp, x):
            return _bn_forward_compiled(x, scale, offset, mean, var, axis, eps, training, cache)
        if training:
            mean = x.mean(axis=axes)
            var = x.var(axis=axes)
        inv = scale / xp.sqrt(var + x.dtype.type(eps))
        y = x * inv.reshape(bshape)
        y += (offset - mean * inv).reshape(bshape)
        return y, mean.astype(x.dtype, copy=False), var.astype(x.dtype, copy=False)
    return run


def _g_bn(node, dys):
    dy = dys[0]
    if dy is None:
        return [None] * 5
    x, scale, _, mean, var = node.inputs
    if node.attrs["training"]:
        mean, var = node.outputs[1], node.outputs[2]
    g = make("BatchNormGrad", (dy, x, scale, mean, var), dict(node.attrs))
    if node.attrs["training"]:  # the mean/variance inputs were not used
        return [g.outputs[0], g.outputs[1], g.outputs[2], None, None]
    return list(g.outputs)


def _kernel_bn_grad(node, ctx):
    xp = ctx.xp
    axis, axes, bshape = _bn_axes(node)
    eps, training = node.attrs["epsilon"], node.attrs["training"]

    def run(dy, x, scale, mean, var):
        if _bn_compiled(xp, x):
            return _bn_grad_compiled(dy, x, scale, mean, var, axis, eps, training)
        inv = 1.0 / xp.sqrt(var + x.dtype.type(eps))
        xhat = (x - mean.reshape(bshape)) * inv.reshape(bshape)
        dbeta = dy.sum(axis=axes)
        dgamma = (dy * xhat).sum(axis=axes)
        if training:
            n = x.size // x.shape[_bn_axes(node)[0]]
            dx = (dy - (dbeta / n).reshape(bshape) - xhat * (dgamma / n).reshape(bshape)) * (scale * inv).reshape(bshape)
            return dx.astype(x.dtype, copy=False), dgamma, dbeta, xp.zeros_like(mean), xp.zeros_like(var)
        dx = dy * (scale * inv).reshape(bshape)
        dmean = -(dbeta * scale * inv)
        dvar = -0.5 * dgamma * scale * inv * inv
        return dx.astype(x.dtype, copy=False), dgamma, dbeta, dmean, dvar
    return run


register(OpDef("BatchNorm", inputs=("x", "scale", "offset", "mean", "variance"),
               attrs={"epsilon": 1e-3, "training": False, "axis": 1}, infer=_infer_bn, kernel=_kernel_bn,
               grad=_g_bn, cost=elementwise_cost(6),
               doc="Outputs (y, mean, variance): the batch's statistics in training mode, else the inputs'."))
register(OpDef("BatchNormGrad", inputs=("dy", "x", "scale", "mean", "variance"),
               attrs={"epsilon": 1e-3, "training": False, "axis": 1},
               infer=lambda node: [(node.inputs[1].dtype, node.inputs[1].shape)]
               + [(node.inputs[2].dtype, node.inputs[2].shape)] * 4,
               kernel=_kernel_bn_grad, cost=elementwise_cost(10),
               doc="(dx, dscale, doffset, dmean, dvariance); the last two are zero in training mode."))


def batch_norm(x, scale, offset, mean, variance, epsilon: float = 1e-3, training: bool = False, axis: int = 1,
               name=None):
    """Normalise over every axis but `axis` (1 for NCHW, -1 for [N, C]).

    Returns (y, batch_mean, batch_variance) in training mode, and y alone otherwise.
    """
    x = convert(x)
    ins = [x] + [convert(t, x.dtype) for t in (scale, offset, mean, variance)]
    node = make("BatchNorm", ins, {"epsilon": float(epsilon), "training": bool(training), "axis": int(axis)}, name=name)
    return tuple(node.outputs) if training else node.outputs[0]


# ---- layer norm --------------------------------------------------------------------------------------
def _ln_axes(node):
    rank = len(node.inputs[0].shape)
    a = normalize_axis(node.attrs["axis"], rank)
    return tuple(range(a, rank))


def _infer_ln(node):
    x = _float_input(node)
    axes = _ln_axes(node)
    want = tuple(x.shape[a] for a in axes)
    for t, what in zip(node.inputs[1:], ("gamma", "beta")):
        if t.dtype != x.dtype or not compatible(t.shape, want):
            raise ShapeError(f"{what} must be {x.dtype.name}{fmt(want)}, got {t.dtype.name}{fmt(t.shape)}")
    return [(x.dtype, x.shape)]


def _kernel_ln(node, ctx):
    xp = ctx.xp
    axes, eps = _ln_axes(node), node.attrs["epsilon"]
    if len(axes) == 1:
        return _LastAxisNorm(xp, eps)

    def run(x, gamma, beta):
        mu = x.mean(axis=axes, keepdims=True)
        xc = x - mu
        inv = 1.0 / xp.sqrt((xc * xc).mean(axis=axes, keepdims=True) + x.dtype.type(eps))
        xc *= inv
        xc *= gamma
        xc += beta
        return xc
    return run


def _rows_of(a, n: int):
    """`a` as C-contiguous rows of n (a view when it is contiguous already)."""
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a.reshape(-1, n)


def _vector(a, n: int):
    """`a` (n elements) as a contiguous vector: itself when it is one (a LayerNorm's scale and offset)."""
    if a.ndim == 1 and a.flags.c_contiguous:
        return a
    return np.ascontiguousarray(a).reshape(n)


class _LastAxisNorm:
    """LayerNorm over the last axis: one compiled pass per row on the CPU in float32 (jit/rows.py),
    else nine array calls, the row means and variances as matrix-vector products with a [n] vector
    of 1/n (BLAS), not numpy's mean (whose wrapper costs as much as the pass at a transformer's
    [32, 64]: 25 -> 14 us a node here)."""

    def __init__(self, xp, eps: float):
        self.xp, self.eps, self._inv_n = xp, float(eps), {}

    def __call__(self, x, gamma, beta):
        xp, n = self.xp, x.shape[-1]
        if n == 0:  # nothing to normalise (numpy's mean of nothing would warn)
            return x.copy()
        if _compiled_rows(xp, x, -1):  # one compiled pass per row (jit/rows.py)
            rows = jit.loaded("rows").layer_norm_rows
            # contiguous operands as they come (the usual case: a transformer's [1, 32, 64] LayerNorm
            # spent 4.5 us of its 6 in these calls and the import, 1.6 in the pass)
            out = np.empty(x.shape, np.float32)
            rows(_rows_of(x, n), _vector(gamma, n), _vector(beta, n), self.eps, out.reshape(-1, n))
            return out
        inv_n = self._inv_n.get((n, x.dtype))
        if inv_n is None:
            inv_n = self._inv_n[(n, x.dtype)] = xp.full(n, 1.0 / n, dtype=x.dtype)
        x2 = x.reshape(-1, n)
        xc = x2 - (x2 @ inv_n)[:, None]
        var = xp.square(xc) @ inv_n
        var += x.dtype.type(self.eps)
        xp.sqrt(var, out=var)
        xp.reciprocal(var, out=var)
        xc *= var[:, None]
        xc *= gamma
        xc += beta
        return xc.reshape(x.shape)


def _kernel_ln_grad(node, ctx):
    xp = ctx.xp
    axes, eps = _ln_axes(node), node.attrs["epsilon"]
    lead = tuple(range(axes[0]))

    def run(dy, x, gamma):
        mu = x.mean(axis=axes, keepdims=True)
        xc = x - mu
        inv = 1.0 / xp.sqrt((xc * xc).mean(axis=axes, keepdims=True) + x.dtype.type(eps))
        xhat = xc * inv
        dgamma = (dy * xhat).sum(axis=lead)
        dbeta = dy.sum(axis=lead)
        g = dy * gamma
        dx = inv * (g - g.mean(axis=axes, keepdims=True) - xhat * (g * xhat).mean(axis=axes, keepdims=True))
        return dx.astype(x.dtype, copy=False), dgamma, dbeta
    return run


register(OpDef("LayerNorm", inputs=("x", "gamma", "beta"), attrs={"axis": -1, "epsilon": 1e-5}, infer=_infer_ln,
               kernel=_kernel_ln, cost=elementwise_cost(8),
               grad=lambda node, dys: list(make("LayerNormGrad", (dys[0], node.inputs[0], node.inputs[1]),
                                                dict(node.attrs)).outputs)))
register(OpDef("LayerNormGrad", inputs=("dy", "x", "gamma"), attrs={"axis": -1, "epsilon": 1e-5},
               infer=lambda node: [(node.inputs[1].dtype, node.inputs[1].shape), (node.inputs[2].dtype, node.inputs[2].shape),
                                   (node.inputs[2].dtype, node.inputs[2].shape)],
               kernel=_kernel_ln_grad, cost=elementwise_cost(12)))


def layer_norm(x, gamma, beta, axis: int = -1, epsilon: float = 1e-5, name=None) -> Tensor:
    """Normalise over the axes from `axis` to the last; gamma and beta have those axes' shape."""
    x = convert(x)
    return make("LayerNorm", (x, convert(gamma, x.dtype), convert(beta, x.dtype)),
                {"axis": int(axis), "epsilon": float(epsilon)}, name=name).outputs[0]
