"""Fused elementwise kernels for CUDA GPUs (cupy ElementwiseKernel / RawKernel): one launch where
the generic array-module kernels take several, and no host synchronisation inside a step.

Each factory falls back to the op's generic kernel when the array module has no
ElementwiseKernel (the CI stand-in GPU) or the dtype is not one these cover.
"""
from __future__ import annotations

import numpy as np

from . import generic_factory

from ..ops.fused import _kernel_fused_matmul

from ..ops.math import _kernel_relu6, _kernel_relu_grad

from ..ops.nn import check_labels

from .gemm import _capturable_product, _fused_matmul as captured, eager_product

_K: dict = {}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _cuda(ctx) -> bool:
    return hasattr(ctx.xp, "ElementwiseKernel")


def _elementwise(cp, name: str, params: str, outs: str, body: str):
    k = _K.get(name)
    if k is None:
        k = _K[name] = cp.ElementwiseKernel(params, outs, body, name)
    return k


_BIAS_ACT = """T v = y + b;
if (act == 1) v = v > (T)0 ? v : (T)0;
else if (act == 2) v = v < (T)0 ? (T)0 : (v > (T)6 ? (T)6 : v);
else if (act == 3) v = tanh(v);
else if (act == 4) v = (T)1 / ((T)1 + exp(-v));
y = v;"""
ACT_CODES = {"none": 0, "relu": 1, "relu6": 2, "tanh": 3, "sigmoid": 4}


def bias_act(cp, y, bias, activation: str):
    """y = activation(y + bias) in place, one launch (bias broadcast along the last axis)."""
    k = _elementwise(cp, "isthmus_bias_act", "T b, int32 act", "T y", _BIAS_ACT)
    return k(bias, np.int32(ACT_CODES[activation]), y)


def _relu6(node, ctx):
    if not _cuda(ctx):
        return _kernel_relu6(node, ctx)
    xp = ctx.xp
    return lambda x: xp.clip(x, x.dtype.type(0), x.dtype.type(6))  # cupy's clip takes no dtype


def _relu_grad(node, ctx):
    if not _cuda(ctx):
        return _kernel_relu_grad(node, ctx)
    lo, hi = node.attrs["lo"], node.attrs["hi"]
    k = _elementwise(ctx.xp, "isthmus_relu_grad", "T dy, T x, T lo, T hi", "T out",
                     "out = (x > lo && x < hi) ? dy : (T)0")
    generic = _kernel_relu_grad(node, ctx)

    def run(dy, x):
        if dy.dtype != x.dtype or dy.shape != x.shape:
            return generic(dy, x)
        t = x.dtype.type
        return k(dy, x, t(lo), t(np.inf if hi is None else hi))
    return run


def _fused_matmul(node, ctx):
    """cuBLAS product, then bias and activation in one launch, in place (eager steps)."""
    if _capturable_product(node, ctx):
        return captured(node, ctx)
    if not _cuda(ctx) or node.inputs[0].dtype not in _FLOATS:
        return _kernel_fused_matmul(node, ctx)
    cp, mm, act = ctx.xp, eager_product(node, ctx), node.attrs["activation"]
    return lambda a, b, bias: bias_act(cp, mm(a, b), bias, act)


def _sgd(node, ctx):
    """var -= lr * grad in one launch; lr is read on the host (copies.py keeps it there)."""
    generic = generic_factory("ApplyGradientDescent")
    if not _cuda(ctx) or node.inputs[0].dtype not in _FLOATS:
        return generic(node, ctx)
    slot = ctx.var_slot(node.inputs[0].node)
    k = _elementwise(ctx.xp, "isthmus_sgd", "T g, T lr", "T var", "var -= lr * g")
    fallback = generic(node, ctx)

    def run(lr, grad):
        var = slot.value
        if not hasattr(grad, "shape") or grad.shape != var.shape or grad.dtype != var.dtype:
            return fallback(lr, grad)
        with slot.lock:
            k(grad, var.dtype.type(float(lr)), var)
        return var
    return run


_XENT = r"""
extern "C" __global__ void NAME(const float* __restrict__ logits, const LAB* __restrict__ labels,
                                float* __restrict__ loss, float* __restrict__ grad, int n, int c) {
  const int i = blockDim.x * blockIdx.x + threadIdx.x;
  if (i >= n) return;
  const float* row = logits + (long long)i * c;
  float* g = grad + (long long)i * c;
  float m = __int_as_float(0xff800000);  // -inf
  for (int j = 0; j < c; ++j) m = fmaxf(m, row[j]);
  float s = 0.f;
  for (int j = 0; j < c; ++j) { const float e = expf(row[j] - m); g[j] = e; s += e; }
  const float inv = 1.f / s;
  for (int j = 0; j < c; ++j) g[j] *= inv;
  const long long lab = (long long)labels[i];
  if (lab < 0 || lab >= c) { loss[i] = __int_as_float(0x7fc00000); return; }  // no host check inside a step (TF's GPU rule)
  loss[i] = logf(s) + m - row[lab];
  g[lab] -= 1.f;
}
"""


def _sparse_xent(node, ctx):
    """Loss and softmax-minus-onehot without a host sync: an out-of-range label gives a NaN loss,
    as TensorFlow's GPU kernel does. Labels that are known on the host are checked there instead,
    at no device cost: a constant's value here, fed or host-made labels by the copy that uploads
    them (core/passes/copies.py), so those fail as the CPU kernel does."""
    labels, logits = node.inputs
    src = labels.node
    if src.op == "Const":  # known now: check once, fail at run time as the CPU kernel would
        try:
            check_labels(np.asarray(src.attrs["value"]), logits.shape[1])
        except ValueError as e:
            err = str(e)

            def refuse(labels, logits):
                raise ValueError(err)
            return refuse
    if not _cuda(ctx) or logits.dtype != np.float32 or labels.dtype not in (np.int32, np.int64):
        return _sparse_xent_generic(ctx.xp)
    cp = ctx.xp
    lab = "int" if labels.dtype == np.int32 else "long long"
    name = f"isthmus_sparse_xent_{labels.dtype.name}"
    k = _K.get(name)
    if k is None:
        k = _K[name] = cp.RawKernel(_XENT.replace("NAME", name).replace("LAB", lab), name)
        k.compile()

    def run(labels, logits):
        logits = cp.ascontiguousarray(logits)
        labels = cp.ascontiguousarray(labels)
        n, c = logits.shape
        loss = cp.empty(n, cp.float32)
        grad = cp.empty((n, c), cp.float32)
        k(((n + 127) // 128,), (128,), (logits, labels, loss, grad, np.int32(n), np.int32(c)))
        return loss, grad
    return run


def _sparse_xent_generic(xp):
    """The RawKernel's semantics in array-module calls (the CI stand-in, other dtypes): no host
    check, NaN loss and no one-hot subtraction on a row whose label is out of range."""
    def run(labels, logits):
        n, c = logits.shape
        bad = (labels < 0) | (labels >= c)
        safe = xp.where(bad, 0, labels)
        rows = xp.arange(n)
        m = logits.max(axis=1, keepdims=True)
        p = logits - m
        xp.exp(p, out=p)
        s = p.sum(axis=1, keepdims=True)
        loss = xp.log(s[:, 0]) + m[:, 0] - logits[rows, safe]
        loss = xp.where(bad, xp.nan, loss).astype(logits.dtype, copy=False)
        p /= s
        p[rows, safe] -= (~bad).astype(p.dtype)
        return loss, p
    return run


KERNELS = {"Relu6": _relu6, "ReluGrad": _relu_grad, "FusedMatMul": _fused_matmul,
           "ApplyGradientDescent": _sgd, "SparseSoftmaxCrossEntropy": _sparse_xent}
