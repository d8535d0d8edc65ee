"""ONNX import of ConvTranspose (1-D and 2-D); of Conv, MaxPool and AveragePool on 1-D (NCL) inputs, run as
their 2-D forms over a height of 1; 2-D and 3-D nodes go on to the importer's own handlers (onnx_nn)."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import isthmus.core as ism
from isthmus.core.graph import Tensor

from .onnx_import import OnnxImportError, handler, wrap_each_version
from .onnx_ops_elementwise import attrs, where


def pads_nd(node, spatial: Sequence, kernel: Sequence[int], strides, dilations) -> List[Tuple[int, int]]:
    """(begin, end) padding per spatial axis of a convolution or pooling, from auto_pad or pads."""
    at = attrs(node)
    n = len(kernel)
    auto = at.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        if any(d is None for d in spatial):
            raise OnnxImportError(f"{where(node)}: auto_pad {auto} needs the spatial size at import, got {list(spatial)}")
        out = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            out.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return out
    if auto == "VALID":
        return [(0, 0)] * n
    p = list(at.get("pads", [0] * (2 * n)))
    return list(zip(p[:n], p[n:]))


def _geometry(node, x: Tensor, kernel: Sequence[int]):
    at = attrs(node)
    n = len(kernel)
    strides = tuple(at.get("strides", [1] * n))
    dil = tuple(at.get("dilations", [1] * n))
    return strides, dil, pads_nd(node, x.shape[2:], kernel, strides, dil)


def _as_2d(t: Tensor) -> Tensor:
    """NCL -> NC1L (and OIK -> OI1K)."""
    return ism.expand_dims(t, 2)


def conv_nd(node, x: Tensor, w: Tensor) -> Tensor:
    """Conv over 1-D or 2-D inputs with the node's attributes (no bias)."""
    rank = len(x.shape)
    if rank not in (3, 4) or len(w.shape) != rank:
        raise OnnxImportError(f"{where(node)}: only 1-D and 2-D convolutions are supported, got input {x.shape}")
    strides, dil, pads = _geometry(node, x, w.shape[2:])
    group = int(attrs(node).get("group", 1))
    if rank == 4:
        return ism.conv2d(x, w, strides=strides, padding=tuple(pads), dilations=dil, groups=group)
    y = ism.conv2d(_as_2d(x), _as_2d(w), strides=(1,) + strides, padding=((0, 0),) + tuple(pads),
                   dilations=(1,) + dil, groups=group)
    return ism.squeeze(y, 2)


def _conv_1d(before):
    def h(c, node, ins):
        if len(ins[0].shape) != 3:
            return before(c, node, ins)
        y = conv_nd(node, ins[0], ins[1])
        if len(ins) > 2 and ins[2] is not None:
            y = ism.add(y, ism.reshape(ins[2], (-1, 1)))
        return [y]
    return h


def _pool_1d(kind: str):
    def wrap(before):
        def h(c, node, ins):
            x = ins[0]
            if len(x.shape) != 3:
                return before(c, node, ins)
            at = attrs(node)
            if at.get("ceil_mode", 0) or (kind == "avg" and at.get("count_include_pad", 0)):
                raise OnnxImportError(f"{where(node)}: ceil_mode and count_include_pad are not supported in 1-D")
            if len(node.output) > 1 and node.output[1]:
                raise OnnxImportError(f"{where(node)}: the Indices output is not supported")
            k = tuple(at["kernel_shape"])
            strides, dil, pads = _geometry(node, x, k)
            f = ism.max_pool if kind == "max" else ism.avg_pool
            y = f(_as_2d(x), (1,) + k, (1,) + strides, ((0, 0),) + tuple(pads), dilations=(1,) + dil)
            return [ism.squeeze(y, 2)]
        return h
    return wrap


@handler("ConvTranspose", 1)
def _conv_transpose(c, node, ins):
    at = attrs(node)
    x, w = ins[0], ins[1]
    rank = len(x.shape)
    if rank not in (3, 4) or any(d is None for d in w.shape):
        raise OnnxImportError(f"{where(node)}: only 1-D and 2-D transposed convolutions with known weights "
                              f"are supported, got input {x.shape} and weights {w.shape}")
    n = rank - 2
    k = list(w.shape[2:])
    strides = list(at.get("strides", [1] * n))
    dil = list(at.get("dilations", [1] * n))
    extra = list(at.get("output_padding", [0] * n))
    pads = _transpose_pads(node, at, x.shape[2:], k, strides, dil, extra)
    group = int(at.get("group", 1))
    if rank == 3:
        x, w = _as_2d(x), _as_2d(w)
        strides, dil, extra, pads = [1] + strides, [1] + dil, [0] + extra, [(0, 0)] + pads
    for i, (b, e) in enumerate(pads):  # a negative end pad (output_shape beyond the full output) is output padding
        if e < 0:
            pads[i], extra[i] = (b, 0), extra[i] - e
        if b < 0:
            raise OnnxImportError(f"{where(node)}: output_shape {at.get('output_shape')} needs negative leading pads")
    y = ism.conv_transpose2d(x, w, strides, tuple(pads), dil, group, extra)
    if rank == 3:
        y = ism.squeeze(y, 2)
    if len(ins) > 2 and ins[2] is not None:
        y = ism.add(y, ism.reshape(ins[2], (-1,) + (1,) * n))
    return [y]


def _transpose_pads(node, at, spatial, k, strides, dil, extra) -> List[Tuple[int, int]]:
    """ONNX ConvTranspose's padding: explicit pads, or worked out from output_shape / auto_pad."""
    n = len(k)
    auto = at.get("auto_pad", "NOTSET")
    out_shape = at.get("output_shape")
    if "pads" in at and auto not in ("SAME_UPPER", "SAME_LOWER") and out_shape is None:
        p = list(at["pads"])
        return list(zip(p[:n], p[n:]))
    if out_shape is None and auto not in ("SAME_UPPER", "SAME_LOWER"):
        return [(0, 0)] * n
    if any(d is None for d in spatial):
        raise OnnxImportError(f"{where(node)}: output_shape / auto_pad need the spatial size at import")
    out_shape = list(out_shape)[-n:] if out_shape is not None else [d * s for d, s in zip(spatial, strides)]
    out = []
    for i in range(n):
        total = strides[i] * (spatial[i] - 1) + extra[i] + (k[i] - 1) * dil[i] + 1 - out_shape[i]
        small, big = total // 2, total - total // 2
        out.append((small, big) if auto == "SAME_UPPER" else (big, small))
    return out


wrap_each_version("Conv", _conv_1d)
wrap_each_version("MaxPool", _pool_1d("max"))
wrap_each_version("AveragePool", _pool_1d("avg"))
