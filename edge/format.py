"""Constants of the edge model format shared by the writer, the loader and the interpreter."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

SCHEMA_VERSION = 2  # 2: int32 dims; per-channel scales as one scale and a byte per channel
MAX_CODE_EXPONENT = 31  # scale_codes: e in code = e << 3 | m
FILE_IDENTIFIER = b"ISTH"
ALIGN = 16

# edge.DType enum values <-> numpy dtypes
DTYPES = {0: np.dtype("float32"), 1: np.dtype("float16"), 2: np.dtype("float64"), 3: np.dtype("int8"),
          4: np.dtype("uint8"), 5: np.dtype("int16"), 6: np.dtype("int32"), 7: np.dtype("int64"), 8: np.dtype("bool")}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}

# edge.AttrKind
INT, FLOAT, STRING, INTS, FLOATS = range(5)


def scales_from_codes(top, codes) -> np.ndarray:
    """Per-channel float32 scales from Quantization.scale_codes: code = e << 3 | m gives
    top * (8 + m) / 8 * 2^-e, computed in float64 (exact) and rounded once to float32. One function
    for the quantizer, the writer and the loader, so all three see the same numbers."""
    c = np.asarray(codes, np.int64)
    return np.ldexp(np.float64(top) * (8 + (c & 7)), -(c >> 3) - 3).astype(np.float32)


def scales_to_codes(scales) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """(scales', codes): each scale rounded up to the nearest value scales_from_codes gives relative to
    the largest (4 significant bits: at most 1/8 coarser; a power of two below the largest stays as it
    is), and their codes; codes None (scales' the float32 scales) when some channel lies more than
    2^-31 below the largest or a scale is not positive and finite."""
    s = np.asarray(scales, np.float32)
    if not s.size or not np.all(np.isfinite(s)) or not np.all(s > 0):
        return s, None
    top = s.max()
    e = np.floor(np.log2(np.float64(top) / s.astype(np.float64))).astype(np.int64)
    e -= (e > 0) & (np.ldexp(np.float64(top), -e) < s)  # the log's rounding: top 2^-e >= s > top 2^-(e+1)
    e += np.ldexp(np.float64(top), -(e + 1)) >= s
    if e.max() + 1 > MAX_CODE_EXPONENT:
        return s, None
    # candidates, increasing: top 2^-(e+1) (8+m)/8 for m = 0..7, then top 2^-e; the first at or above s
    cand = np.concatenate([((e[:, None] + 1) << 3) | np.arange(8), (e << 3)[:, None]], axis=1)
    vals = scales_from_codes(top, cand)
    k = np.argmax(vals >= s[:, None], axis=1)
    codes = cand[np.arange(len(s)), k]
    return scales_from_codes(top, codes), codes.astype(np.uint8)


class EdgeModelError(ValueError):
    """The model file is malformed, hostile, or from a newer schema; the message says what."""
