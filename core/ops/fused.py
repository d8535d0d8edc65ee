"""Fused ops the passes create: a product, its bias and its activation in one kernel,
computed in place in the product's output buffer (two fewer temporaries per layer), or, for
constant float32 weights at small batch, in one pass of a packed product (fused_dense.py)."""
from __future__ import annotations

import numpy as np

from ..registry import Cost, OpDef, register
from ..shapes import num_elements_est
from .linalg import _cost_matmul, _infer_matmul, _kernel_matmul

ACTIVATIONS = ("none", "relu", "relu6", "tanh", "sigmoid")


def activation_inplace(xp, name: str):
    """A function applying activation `name` to an array in place (and returning it)."""
    if name == "none":
        return lambda y: y
    if name == "relu":
        return lambda y: xp.maximum(y, 0, out=y)
    if name == "relu6":
        return lambda y: xp.clip(y, 0, 6, out=y)
    if name == "tanh":
        return lambda y: xp.tanh(y, out=y)
    if name == "sigmoid":
        def sig(y):
            y *= 0.5
            xp.tanh(y, out=y)
            y += 1
            y *= 0.5
            return y
        return sig
    raise ValueError(f"unknown fused activation {name!r}; known: {ACTIVATIONS}")


def activation_to(xp, name: str):
    """A function f(src, out) writing activation `name` of src into out (one pass where numpy
    has the op; src may be a strided view, out is then contiguous) and returning out."""
    if name == "none":
        return lambda src, out: xp.copyto(out, src) or out
    if name == "relu":
        return lambda src, out: xp.maximum(src, 0, out=out)
    if name == "relu6":
        return lambda src, out: xp.clip(src, 0, 6, out=out)
    if name == "tanh":
        return lambda src, out: xp.tanh(src, out=out)
    if name == "sigmoid":
        def sig(src, out):
            xp.multiply(src, 0.5, out=out)
            xp.tanh(out, out=out)
            out += 1
            out *= 0.5
            return out
        return sig
    raise ValueError(f"unknown fused activation {name!r}; known: {ACTIVATIONS}")


def _kernel_fused_matmul(node, ctx):
    mm = _kernel_matmul(node, ctx)
    act = activation_inplace(ctx.xp, node.attrs["activation"])
    add = ctx.xp.add
    packed = None
    if ctx.xp is np and not node.attrs["transpose_a"]:  # constant weights at small batch: packed once
        from .fused_dense import PackedDense  # deferred: it imports depthwise, which imports this module
        packed = PackedDense(node.attrs["activation"], node.attrs["transpose_b"])

    def run(a, b, bias):
        path = packed.path(a, b, bias) if packed is not None else ""
        if path:
            return packed(a, b, bias, path)
        y = mm(a, b)
        add(y, bias, out=y)
        return act(y)
    return run


def _cost_fused_matmul(node):
    c = _cost_matmul(node)
    n = num_elements_est(node.outputs[0].shape)
    return Cost(c.flops + 2 * n, c.bytes_read, c.bytes_written)


register(OpDef("FusedMatMul", inputs=("a", "b", "bias"),
               attrs={"transpose_a": False, "transpose_b": False, "activation": "none"},
               infer=_infer_matmul, kernel=_kernel_fused_matmul, cost=_cost_fused_matmul,
               doc="activation(a @ b + bias): MatMul, BiasAdd and an activation, fused by the passes."))
