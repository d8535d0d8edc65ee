"""The dtypes a Tensor may have. They are numpy dtypes, so kernels need no mapping."""
from __future__ import annotations

import numpy as np

float16 = np.dtype("float16")
float32 = np.dtype("float32")
float64 = np.dtype("float64")
int8 = np.dtype("int8")
int16 = np.dtype("int16")
int32 = np.dtype("int32")
int64 = np.dtype("int64")
uint8 = np.dtype("uint8")
uint16 = np.dtype("uint16")
uint32 = np.dtype("uint32")
uint64 = np.dtype("uint64")
bool_ = np.dtype("bool")

# An opaque host value (a loop's saved iterations, say): never fed, fetched or serialised.
variant = np.dtype(object)

ALL = (float16, float32, float64, int8, int16, int32, int64, uint8, uint16, uint32, uint64, bool_)
FLOATS = (float16, float32, float64)
INTS = (int8, int16, int32, int64, uint8, uint16, uint32, uint64)
_BY_NAME = {d.name: d for d in ALL}


def as_dtype(value) -> np.dtype:
    """Normalise a dtype-like value (name, numpy type, dtype) to one of ALL."""
    if isinstance(value, str) and value in _BY_NAME:
        return _BY_NAME[value]
    if value is variant:
        return variant
    try:
        d = np.dtype(value)
    except TypeError:
        raise TypeError(f"not a dtype: {value!r}; isthmus dtypes are {', '.join(_BY_NAME)}") from None
    if d not in ALL:
        raise TypeError(f"unsupported dtype {d}; isthmus dtypes are {', '.join(_BY_NAME)}")
    return d


def is_float(d: np.dtype) -> bool:
    return d.kind == "f"


def is_int(d: np.dtype) -> bool:
    return d.kind in "iu"
