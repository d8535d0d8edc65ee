"""FusedConv2DAdd, made by the fusion pass: act(conv2d(x, w) + bias + addend), a residual
block's convolution, bias, skip-connection Add and activation as one node. The kernel runs the
convolution's paths with the addend added where they finish the output (conv.py's _kernel_conv),
and the gradient flows to the addend through the activation alone."""
from __future__ import annotations

from ..errors import ShapeError
from ..registry import Cost, OpDef, register
from ..shapes import fmt, num_elements_est
from .base import make
from .conv import _conv_attrs, _cost_conv, _infer_conv, _kernel_conv

RESIDUAL_ACTIVATIONS = ("none", "relu", "relu6")  # what the paths clamp (and ReluGrad differentiates)


def _infer_conv_add(node):
    out = _infer_conv(node)
    dtype, shape = out[0]
    r = node.inputs[3]
    if node.attrs["activation"] not in RESIDUAL_ACTIVATIONS:
        raise ShapeError(f"activation {node.attrs['activation']!r} is not one of {RESIDUAL_ACTIVATIONS}")
    if r.dtype != dtype or len(r.shape) != len(shape) or any(
            a is not None and b is not None and a != b for a, b in zip(r.shape, shape)):
        raise ShapeError(f"addend {r.dtype.name}{fmt(r.shape)} does not match the convolution's output "
                         f"{dtype.name}{fmt(shape)}")
    return out


def _kernel_fused_conv_add(node, ctx):
    return _kernel_conv(node, ctx, node.attrs["activation"], residual=True)


def _cost_conv_add(node):
    c = _cost_conv(node)
    n = num_elements_est(node.outputs[0].shape)
    return Cost(c.flops + 2 * n, c.bytes_read + n * node.outputs[0].dtype.itemsize, c.bytes_written)


def _g_conv_add(node, dys):
    """dz = dy through the activation (ReluGrad on the output: 0 < y (< 6) exactly where 0 < z (< 6));
    the addend's gradient is dz, the bias's dz summed over all but channels, x's and w's the
    convolution's gradients of dz."""
    dy, y = dys[0], node.outputs[0]
    act = node.attrs["activation"]
    dz = dy if act == "none" else make("ReluGrad", (dy, y), {"lo": 0.0, "hi": 6.0 if act == "relu6" else None}).outputs[0]
    x, w = node.inputs[0], node.inputs[1]
    attrs = {k: node.attrs[k] for k in _conv_attrs()}
    dx = make("Conv2DBackpropInput", (dz, w, x), attrs).outputs[0]
    dw = make("Conv2DBackpropFilter", (x, dz, w), attrs).outputs[0]
    db = make("BiasAddGrad", (dz,), {"axis": 1}).outputs[0]
    return [dx, dw, db, dz]


register(OpDef("FusedConv2DAdd", inputs=("x", "w", "bias", "addend"), attrs={**_conv_attrs(), "activation": "none"},
               infer=_infer_conv_add, kernel=_kernel_fused_conv_add, grad=_g_conv_add, cost=_cost_conv_add,
               doc="activation(conv2d(x, w) + bias + addend), addend of the output's shape: made by the "
                   "fusion pass from a residual block's Conv2D, BiasAdd, Add and Relu/Relu6."))
