"""The window arithmetic that convolution (conv.py) and pooling (pool.py) share: stride and
dilation pairs, SAME/VALID/explicit padding, output sizes, strided window views, padded copies."""
from __future__ import annotations

from typing import Tuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..errors import ShapeError


def window_pair(v, what) -> Tuple[int, int]:
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    v = tuple(int(a) for a in v)
    if len(v) != 2:
        raise ShapeError(f"{what} must be an int or a pair, got {v}")
    return v


def resolve_pads(padding, size, k, stride, dil):
    """((top, bottom), (left, right)) for SAME/VALID/explicit padding (TensorFlow's SAME)."""
    if isinstance(padding, str):
        p = padding.upper()
        if p == "VALID":
            return ((0, 0), (0, 0))
        if p != "SAME":
            raise ShapeError(f"padding must be SAME, VALID or explicit, got {padding!r}")
        out = []
        for n, kk, s, d in zip(size, k, stride, dil):
            if n is None:
                raise ShapeError("SAME padding needs known spatial dims")
            total = max((-(-n // s) - 1) * s + (kk - 1) * d + 1 - n, 0)
            out.append((total // 2, total - total // 2))
        return tuple(out)
    p = tuple(padding)
    if len(p) == 4:
        return ((int(p[0]), int(p[1])), (int(p[2]), int(p[3])))
    if len(p) == 2 and all(isinstance(a, (tuple, list)) for a in p):
        return tuple((int(a), int(b)) for a, b in p)
    raise ShapeError(f"explicit padding must be ((top, bottom), (left, right)) or 4 ints, got {padding!r}")


def window_out_size(n, k, s, d, pads):
    if n is None:
        return None
    eff = (k - 1) * d + 1
    o = (n + pads[0] + pads[1] - eff) // s + 1
    if o <= 0:
        raise ShapeError(f"window {k} (dilation {d}) does not fit input {n} with padding {pads}")
    return o


def _windows(xp_, kh, kw, oh, ow, sh, sw, dh, dw):
    """View [N, C, kh, kw, OH, OW] of a padded NCHW array (no copy)."""
    n, c, _, _ = xp_.shape
    s0, s1, s2, s3 = xp_.strides
    return as_strided(xp_, (n, c, kh, kw, oh, ow), (s0, s1, dh * s2, dw * s3, sh * s2, sw * s3), writeable=False)


def padded_copy(xp, x, pads, value=0.0):
    (t, b), (l, r) = pads
    if not (t or b or l or r):
        return x if x.flags.c_contiguous else xp.ascontiguousarray(x)
    n, c, h, w = x.shape
    out = xp.full((n, c, h + t + b, w + l + r), value, dtype=x.dtype)
    out[:, :, t:t + h, l:l + w] = x
    return out


class WindowGeometry:
    __slots__ = ("kh", "kw", "sh", "sw", "dh", "dw", "pads", "oh", "ow", "groups")
