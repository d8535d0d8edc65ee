"""Instance, group and RMS normalization and local response normalization, composed from primitive ops
(so their gradients, shapes and exports come from those ops); layer_norm and batch_norm live in nn.py."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import ShapeError
from ..graph import Tensor
from .array import pad, reshape
from .array_dynamic import reshape_to
from .fill import shape
from .base import constant, convert
from .math import add, add_n, div, mul, pow, rsqrt, square, sub  # noqa: A004
from .reduce import reduce_mean

__all__ = ["instance_norm", "group_norm", "rms_norm", "lrn"]


def _per_channel(v: Tensor, rank: int) -> Tensor:
    """A [C] vector shaped to broadcast over axis 1 of a rank-`rank` NC... tensor."""
    return reshape(v, (-1,) + (1,) * (rank - 2))


def _normalize(x: Tensor, axes: tuple, epsilon: float) -> Tensor:
    mean = reduce_mean(x, axes, keepdims=True)
    centred = sub(x, mean)
    var = reduce_mean(square(centred), axes, keepdims=True)
    return mul(centred, rsqrt(add(var, constant(epsilon, x.dtype))))


def instance_norm(x, scale, bias, epsilon: float = 1e-5, name: Optional[str] = None) -> Tensor:
    """Normalise each (sample, channel) over its spatial dims, then scale and shift per channel (NC...)."""
    x = convert(x)
    rank = len(x.shape)
    if rank < 3:
        raise ShapeError(f"instance_norm needs an N, C, spatial... input, got rank {rank}")
    y = _normalize(x, tuple(range(2, rank)), epsilon)
    return add(mul(y, _per_channel(convert(scale, x.dtype), rank)), _per_channel(convert(bias, x.dtype), rank))


def group_norm(x, scale, bias, num_groups: int, epsilon: float = 1e-5, name: Optional[str] = None) -> Tensor:
    """Normalise each sample's channels in `num_groups` groups (over the group's channels and spatial dims),
    then scale and shift per channel ([C] scale and bias)."""
    x = convert(x)
    rank, c = len(x.shape), x.shape[1] if len(x.shape) > 1 else None
    if rank < 2:
        raise ShapeError(f"group_norm needs an N, C, ... input, got rank {rank}")
    if c is not None and c % num_groups:
        raise ShapeError(f"group_norm: {c} channels do not split into {num_groups} groups")
    grouped = reshape_to(x, constant(np.array([0, num_groups, -1], np.int64)), copy_zero=True)
    y = reshape_to(_normalize(grouped, (2,), epsilon), shape(x, "int64"))
    if rank == 2:
        return add(mul(y, convert(scale, x.dtype)), convert(bias, x.dtype))
    return add(mul(y, _per_channel(convert(scale, x.dtype), rank)), _per_channel(convert(bias, x.dtype), rank))


def rms_norm(x, scale, axis: int = -1, epsilon: float = 1e-5, name: Optional[str] = None) -> Tensor:
    """x / sqrt(mean(x^2 over the axes from `axis` to the last) + epsilon) * scale."""
    x = convert(x)
    rank = len(x.shape)
    axes = tuple(range(axis % rank, rank))
    ms = reduce_mean(square(x), axes, keepdims=True)
    return mul(mul(x, rsqrt(add(ms, constant(epsilon, x.dtype)))), convert(scale, x.dtype))


def lrn(x, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0, name: Optional[str] = None) -> Tensor:
    """Local response normalization across channels (NC...): x / (bias + alpha / size * sum of squares over
    the `size` neighbouring channels)^beta, the window from c - (size-1)//2 to c + ceil((size-1)/2)."""
    x = convert(x)
    rank = len(x.shape)
    if rank < 3:
        raise ShapeError(f"lrn needs an N, C, spatial... input, got rank {rank}")
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = pad(square(x), [(0, 0), (lo, hi)] + [(0, 0)] * (rank - 2))
    # window k: padded channels [k, k + C), i.e. up to size - 1 - k from the end (C need not be known)
    windows = [sq[(slice(None), slice(k, k - (size - 1) or None))] for k in range(size)]
    total = add_n(windows)
    denom = pow(add(mul(total, constant(alpha / size, x.dtype)), constant(bias, x.dtype)), constant(beta, x.dtype))
    return div(x, denom)
