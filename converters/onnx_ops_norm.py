"""ONNX import of InstanceNormalization, GroupNormalization (opset 18's per-group and opset 21's per-channel
scale), RMSNormalization and LRN, onto the composite norms of core/ops/normalization.py."""
from __future__ import annotations

import numpy as np

import isthmus.core as ism

from .onnx_import import OnnxImportError, handler
from .onnx_ops_elementwise import attrs, where


def _stash_float32(node, x):
    """Compute in float32 at least (stash_type=1, the default) when the input is float16."""
    st = int(attrs(node).get("stash_type", 1))
    if st not in (1, 11):
        raise OnnxImportError(f"{where(node)}: stash_type {st} is not float32 or float64")
    want = "float64" if st == 11 else "float32"
    return ism.cast(x, want) if x.dtype.itemsize < np.dtype(want).itemsize else x


@handler("InstanceNormalization", 1)
def _instance_norm(c, node, ins):
    return [ism.instance_norm(ins[0], ins[1], ins[2], float(attrs(node).get("epsilon", 1e-5)))]


def _group_norm(per_group: bool):
    def h(c, node, ins):
        at = attrs(node)
        x, scale, bias = ins
        g, eps = int(at["num_groups"]), float(at.get("epsilon", 1e-5))
        ch = x.shape[1] if len(x.shape) > 1 else None
        if per_group and scale.shape != (ch,):  # opset 18: one scale per group, spread to its channels
            if ch is None:
                raise OnnxImportError(f"{where(node)}: per-group scale needs the channel count at import")
            spread = ism.constant(np.repeat(np.arange(g), ch // g).astype(np.int64))
            scale, bias = ism.gather(scale, spread), ism.gather(bias, spread)
        xs = _stash_float32(node, x)
        y = ism.group_norm(xs, ism.cast(scale, xs.dtype), ism.cast(bias, xs.dtype), g, eps)
        return [ism.cast(y, x.dtype)]
    return h


handler("GroupNormalization", 18)(_group_norm(True))
handler("GroupNormalization", 21)(_group_norm(False))


@handler("RMSNormalization", 23)
def _rms_norm(c, node, ins):
    at = attrs(node)
    x = ins[0]
    xs = _stash_float32(node, x)
    y = ism.rms_norm(xs, ism.cast(ins[1], xs.dtype), int(at.get("axis", -1)), float(at.get("epsilon", 1e-5)))
    return [ism.cast(y, x.dtype)]


@handler("LRN", 1)
def _lrn(c, node, ins):
    at = attrs(node)
    return [ism.lrn(ins[0], int(at["size"]), float(at.get("alpha", 1e-4)), float(at.get("beta", 0.75)),
                    float(at.get("bias", 1.0)))]
