"""Scaled dot-product attention as ONNX defines it (Attention, opsets 23-24): multi-head and grouped-query,
causal and sliding-window masks, boolean or additive masks, a key/value cache, soft-capping. Built from
primitive ops (its gradient comes with them) plus AttentionBias, which turns the masks into one additive
bias (no gradient: masks and lengths are not differentiated); and rotary position embedding."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import OpDef, elementwise_cost, register
from .array import concat, expand_dims, transpose
from .array_dynamic import reshape_to
from .base import constant, convert, make
from .fill import shape
from .linalg import matmul
from .math import add, cast, div, mul, tanh, where, zeros_like
from .nn import softmax
from .pointwise import isinf
from .reduce import reduce_max
from .sparse import gather

__all__ = ["attention"]


# ---- AttentionBias: causal / window / padding / user masks as one additive bias ----------------------
def _infer_bias(node):
    q = node.inputs[0]
    rank = 2
    if node.attrs["has_mask"]:
        rank = max(rank, len(node.inputs[2].shape))
    if node.attrs["has_nonpad"]:
        rank = 4
    return [(q.dtype, (None,) * rank)]


def _k_bias(node, ctx):
    xp = ctx.xp
    at = node.attrs
    causal, left, right = at["is_causal"], at["left_window"], at["right_window"]

    def frontier(base, offset, allowed_of):
        ql, kvl = base.shape[-2:]
        i = xp.arange(ql).reshape(ql, 1)
        j = xp.arange(kvl).reshape(1, kvl)
        per_batch = xp.ndim(offset) > 0
        off = xp.reshape(offset, (-1, 1, 1)) if per_batch else int(offset)
        bias = xp.where(allowed_of(i + off, j), base.dtype.type(0), base.dtype.type(-np.inf))
        return base + (bias.reshape(bias.shape[0], 1, ql, kvl) if per_batch else bias)

    def window_ok(p, j):
        ok = xp.ones(xp.broadcast_shapes(p.shape, j.shape), bool)
        if left >= 0:
            ok &= (p - j) <= left
        if right >= 0:
            ok &= (j - p) <= right
        return ok

    def run(q, k, *rest):
        it = iter(rest)
        mask = next(it) if at["has_mask"] else None
        past = next(it) if at["has_past"] else None
        nonpad = next(it) if at["has_nonpad"] else None
        dt, ql, kvl = q.dtype, q.shape[2], k.shape[2]
        if mask is not None and kvl - mask.shape[-1] > 0:  # a short mask: the missing keys are masked
            fill = False if mask.dtype == bool else -np.inf
            mask = xp.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, kvl - mask.shape[-1])], constant_values=fill)
        if mask is not None and mask.dtype == bool:
            mask = xp.where(mask, dt.type(0), dt.type(-np.inf))
        base = xp.zeros((ql, kvl), dt) + (mask.astype(dt) if mask is not None else dt.type(0))
        if past is None and nonpad is not None:
            offset = nonpad.reshape(-1) - ql
        else:
            offset = past.shape[2] if past is not None else 0
        bias = frontier(base, offset, lambda p, j: j <= p) if causal else base
        if left >= 0 or right >= 0:
            bias = frontier(bias, offset, window_ok)
        if nonpad is not None:
            keep = xp.arange(kvl) < nonpad.reshape(-1, 1)
            bias = bias + xp.where(keep, dt.type(0), dt.type(-np.inf)).reshape(-1, 1, 1, kvl)
        return bias.astype(dt, copy=False)
    return run


register(OpDef("AttentionBias", inputs=("q", "k", "*extras"),
               attrs={"is_causal": False, "has_mask": False, "has_past": False, "has_nonpad": False,
                      "left_window": -1, "right_window": -1},
               infer=_infer_bias, kernel=_k_bias, grad=lambda node, dys: [None] * len(node.inputs),
               cost=elementwise_cost(2),
               doc="The additive bias (0 or -inf, plus a float mask) of ONNX Attention for [B, H, q, D] queries "
                   "and [B, H, kv, D] keys; extras: mask, past key, nonpad lengths, as the has_* flags say."))


# ---- attention -----------------------------------------------------------------------------------------
def _heads(x: Tensor, n: Optional[int], what: str) -> Tensor:
    """[B, S, H*D] -> [B, H, S, D]."""
    if n is None:
        raise ShapeError(f"attention: 3-D {what} needs its number of heads")
    return transpose(reshape_to(x, constant(np.array([0, 0, n, -1], np.int64)), copy_zero=True), (0, 2, 1, 3))


def attention(q, k, v, mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, scale: Optional[float] = None,
              is_causal: bool = False, q_num_heads: Optional[int] = None, kv_num_heads: Optional[int] = None,
              softcap: float = 0.0, softmax_dtype=None, qk_output_mode: int = 0, left_window: int = -1,
              right_window: int = -1):
    """(y, present_key, present_value, qk_output), as ONNX Attention: q [B, Hq, S, D] (or [B, S, Hq*D] with
    q_num_heads), k and v [B, Hkv, L, D] (or 3-D with kv_num_heads); softmax((q k^T) * scale + bias) v, where
    the bias holds the causal/window/padding masks and `mask` (bool: True attends; float: added).
    Rows with no attendable key give zeros. qk_output_mode: 0/1 the (soft-capped) scores, 2 with the bias,
    3 the probabilities."""
    q, k, v = convert(q), convert(k), convert(v)
    three_d = len(q.shape) == 3
    d = q.shape[-1] if not three_d else (q.shape[2] // q_num_heads if q.shape[2] and q_num_heads else None)
    hq, hk = (q_num_heads, kv_num_heads) if three_d else (q.shape[1], k.shape[1])
    if three_d:
        q, k, v = _heads(q, q_num_heads, "query"), _heads(k, kv_num_heads, "key"), _heads(v, kv_num_heads, "value")
    if not (len(q.shape) == len(k.shape) == len(v.shape) == 4):
        raise ShapeError(f"attention needs 3-D or 4-D q, k, v of one rank, got {q.shape}, {k.shape}, {v.shape}")
    if (past_key is None) != (past_value is None):
        raise ShapeError("attention: past_key and past_value come together")
    if scale is None:
        if d is None:
            raise ShapeError("attention: the head size must be known when no scale is given")
        scale = 1.0 / math.sqrt(d)
    root = constant(np.sqrt(scale).astype(q.dtype), q.dtype)  # q and k each scaled by sqrt(scale), as ONNX does
    if past_key is not None:
        k, v = concat([convert(past_key), k], 2), concat([convert(past_value), v], 2)
    present_k, present_v = k, v
    extras = [convert(t) for t in (mask, past_key, nonpad_kv_seqlen) if t is not None]
    bias = make("AttentionBias", [q, k] + extras,
                {"is_causal": bool(is_causal), "has_mask": mask is not None, "has_past": past_key is not None,
                 "has_nonpad": nonpad_kv_seqlen is not None, "left_window": int(left_window),
                 "right_window": int(right_window)}).outputs[0]
    if hq is not None and hk is not None and hq != hk:  # grouped-query: each kv head serves hq / hk query heads
        if hq % hk:
            raise ShapeError(f"attention: {hq} query heads do not group over {hk} key/value heads")
        idx = constant(np.repeat(np.arange(hk), hq // hk).astype(np.int64))
        k, v = gather(k, idx, 1), gather(v, idx, 1)
    scores = matmul(mul(q, root), transpose(mul(k, root), (0, 1, 3, 2)))
    if softcap and softcap > 0:
        c = constant(softcap, q.dtype)
        scores = mul(tanh(div(scores, c)), c)
    qk_out = scores
    with_bias = add(scores, bias)
    if qk_output_mode == 2:
        qk_out = with_bias
    if softmax_dtype is not None:
        with_bias = cast(with_bias, softmax_dtype)
    dead = isinf(reduce_max(bias, -1, keepdims=True), detect_positive=False)  # rows that attend to nothing
    zero = zeros_like(with_bias)
    probs = where(dead, zero, softmax(where(dead, zero, with_bias), -1))
    if qk_output_mode == 3:
        qk_out = probs
    probs = cast(probs, q.dtype)
    y = matmul(probs, v)
    if three_d:
        y = reshape_to(transpose(y, (0, 2, 1, 3)), constant(np.array([0, 0, -1], np.int64)), copy_zero=True)
    return y, present_k, present_v, cast(qk_out, q.dtype)


def rotary_embedding(x, cos_cache, sin_cache, position_ids=None, interleaved: bool = False, rotary_dim: int = 0,
                     num_heads: Optional[int] = None) -> Tensor:
    """Rotary position embedding (ONNX RotaryEmbedding): rotate pairs of the first `rotary_dim` features of
    each head (halves, or even/odd features when interleaved) by the cached angles of their position.
    x is [B, H, S, D] or [B, S, H*D] (with num_heads); the caches are [max_pos, rotary_dim/2] read at
    position_ids [B, S], or already [B, S, rotary_dim/2] without them."""
    x = convert(x)
    four_d = len(x.shape) == 4
    if four_d:
        h = transpose(x, (0, 2, 1, 3))
        d = x.shape[3]
    elif len(x.shape) == 3:
        if not num_heads:
            raise ShapeError("rotary_embedding: a 3-D input needs num_heads")
        h = reshape_to(x, constant(np.array([0, 0, num_heads, -1], np.int64)), copy_zero=True)
        d = x.shape[2] // num_heads if x.shape[2] is not None else None
    else:
        raise ShapeError(f"rotary_embedding needs a 3-D or 4-D input, got {x.shape}")
    if d is None:
        raise ShapeError("rotary_embedding: the head size must be known")
    rd = rotary_dim or d
    cos_c, sin_c = convert(cos_cache, x.dtype), convert(sin_cache, x.dtype)
    if position_ids is not None:
        cos_c, sin_c = gather(cos_c, position_ids, 0), gather(sin_c, position_ids, 0)
    if cos_c.shape[-1] is not None and cos_c.shape[-1] != rd // 2:
        raise ShapeError(f"rotary_embedding: cache width {cos_c.shape[-1]} is not rotary_dim/2 = {rd // 2}")
    cos_c, sin_c = expand_dims(cos_c, 2), expand_dims(sin_c, 2)  # [B, S, 1, rd/2] against [B, S, H, rd/2]
    lead = (slice(None),) * 3
    rot = h[lead + (slice(0, rd),)]
    if interleaved:
        x1, x2 = rot[lead + (slice(0, None, 2),)], rot[lead + (slice(1, None, 2),)]
    else:
        x1, x2 = rot[lead + (slice(0, rd // 2),)], rot[lead + (slice(rd // 2, rd),)]
    real = add(mul(cos_c, x1), mul(mul(sin_c, x2), constant(-1.0, x.dtype)))
    imag = add(mul(sin_c, x1), mul(cos_c, x2))
    if interleaved:  # back to even/odd order: pairs stacked on a new last axis, then flattened
        rot = reshape_to(concat([expand_dims(real, -1), expand_dims(imag, -1)], -1), shape(rot, "int64"))
    else:
        rot = concat([real, imag], -1)
    out = concat([rot, h[lead + (slice(rd, None),)]], -1) if (d is not None and rd < d) else rot
    if four_d:
        return transpose(out, (0, 2, 1, 3))
    return reshape_to(out, shape(x, "int64"))


__all__.append("rotary_embedding")
