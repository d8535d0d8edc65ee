"""ConvTranspose2D: the transpose of Conv2D (the gradient of a convolution with respect to its input, as a
layer), NCHW input and [in, out/groups, kh, kw] weights as in ONNX; its gradients are Conv2D and
Conv2DBackpropFilter of the same geometry."""
from __future__ import annotations

from typing import Optional, Sequence

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, register
from ..shapes import fmt, num_elements_est
from .base import convert, make
from .conv import _kernel_conv_input

__all__ = ["conv_transpose2d"]


def _out_size(n: Optional[int], k: int, s: int, d: int, pads, extra: int) -> Optional[int]:
    return None if n is None else s * (n - 1) + extra + (k - 1) * d + 1 - pads[0] - pads[1]


def _out_hw(node, h, w, w_shape):
    (sh, sw), (dh, dw), (ph, pw), (eh, ew) = (node.attrs[k] for k in ("strides", "dilations", "pads", "output_padding"))
    return _out_size(h, w_shape[2], sh, dh, ph, eh), _out_size(w, w_shape[3], sw, dw, pw, ew)


def _infer(node):
    x, w = node.inputs
    if x.dtype != w.dtype or x.dtype.kind != "f":
        raise ShapeError(f"conv_transpose needs float input and weights of one dtype, got {x.dtype.name} and {w.dtype.name}")
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise ShapeError(f"conv_transpose needs NCHW input and [in, out/groups, kh, kw] weights, "
                         f"got {fmt(x.shape)} and {fmt(w.shape)}")
    g = node.attrs["groups"]
    if any(d is None for d in w.shape):  # weights fed at run time: the kernel works the geometry out then
        return [(x.dtype, (x.shape[0], None, None, None))]
    if w.shape[0] % g or (x.shape[1] is not None and x.shape[1] != w.shape[0]):
        raise ShapeError(f"input channels {x.shape[1]} and weights {fmt(w.shape)} do not fit groups={g}")
    if any(e >= s for e, s in zip(node.attrs["output_padding"], node.attrs["strides"])):
        raise ShapeError(f"output_padding {node.attrs['output_padding']} must be below strides {node.attrs['strides']}")
    oh, ow = _out_hw(node, x.shape[2], x.shape[3], w.shape)
    if (oh is not None and oh <= 0) or (ow is not None and ow <= 0):
        raise ShapeError(f"conv_transpose of {fmt(x.shape)} with pads {node.attrs['pads']} has no output")
    return [(x.dtype, (x.shape[0], w.shape[1] * g, oh, ow))]


class _Like:
    """Stands in for the forward convolution's input, whose shape alone the input-gradient kernel reads."""

    def __init__(self, shape):
        self.shape = shape


def _kernel(node, ctx):
    grad_input = _kernel_conv_input(node, ctx)
    w_shape, g = node.inputs[1].shape, node.attrs["groups"]

    def run(x, w):
        oh, ow = _out_hw(node, x.shape[2], x.shape[3], w.shape)
        return grad_input(x, w, _Like((x.shape[0], w.shape[1] * g, oh, ow)))
    del w_shape
    return run


def _conv_attrs(node) -> dict:
    return {k: node.attrs[k] for k in ("strides", "dilations", "pads", "groups")}


def _grad(node, dys):
    x, w = node.inputs
    dy = dys[0]
    dx = make("Conv2D", (dy, w), _conv_attrs(node)).outputs[0]
    dw = make("Conv2DBackpropFilter", (dy, x, w), _conv_attrs(node)).outputs[0]
    return [dx, dw]


def _cost(node) -> Cost:
    x, w = node.inputs
    macs = num_elements_est(x.shape) * num_elements_est(w.shape[1:])
    item = x.dtype.itemsize
    return Cost(2 * macs, (num_elements_est(x.shape) + num_elements_est(w.shape)) * item,
                num_elements_est(node.outputs[0].shape) * item)


register(OpDef("ConvTranspose2D", inputs=("x", "w"),
               attrs={"strides": (1, 1), "dilations": (1, 1), "pads": ((0, 0), (0, 0)), "groups": 1,
                      "output_padding": (0, 0)},
               infer=_infer, kernel=_kernel, grad=_grad, cost=_cost,
               doc="NCHW x [in, out/groups, kh, kw]; explicit pads ((t,b),(l,r)) trimmed from the full output."))


def _pair(v, what: str) -> tuple:
    t = (int(v), int(v)) if isinstance(v, int) else tuple(int(a) for a in v)
    if len(t) != 2:
        raise ShapeError(f"{what} needs 2 values, got {v}")
    return t


def conv_transpose2d(x, w, strides=1, pads=((0, 0), (0, 0)), dilations=1, groups: int = 1,
                     output_padding: Sequence[int] = (0, 0), name: Optional[str] = None) -> Tensor:
    """The transposed convolution (ONNX ConvTranspose, 2-D): out = s(in - 1) + output_padding
    + (k - 1)d + 1 - pad_begin - pad_end along each spatial axis."""
    x, w = convert(x), convert(w)
    pads = tuple(_pair(p, "pads") for p in pads)
    return make("ConvTranspose2D", (x, convert(w, x.dtype)),
                {"strides": _pair(strides, "strides"), "dilations": _pair(dilations, "dilations"), "pads": pads,
                 "groups": int(groups), "output_padding": _pair(output_padding, "output_padding")}, name=name).outputs[0]
