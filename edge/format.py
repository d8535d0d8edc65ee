"""Constants of the edge model format shared by the writer, the loader and the interpreter."""
from __future__ import annotations

import numpy as np

SCHEMA_VERSION = 1
FILE_IDENTIFIER = b"ISTH"
ALIGN = 16

# edge.DType enum values <-> numpy dtypes
DTYPES = {0: np.dtype("float32"), 1: np.dtype("float16"), 2: np.dtype("float64"), 3: np.dtype("int8"),
          4: np.dtype("uint8"), 5: np.dtype("int16"), 6: np.dtype("int32"), 7: np.dtype("int64"), 8: np.dtype("bool")}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}

# edge.AttrKind
INT, FLOAT, STRING, INTS, FLOATS = range(5)


class EdgeModelError(ValueError):
    """The model file is malformed, hostile, or from a newer schema; the message says what."""
