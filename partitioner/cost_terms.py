"""What the device profile's fitted cost sections share (client_cost.py, part_cost.py): a
non-negative least-squares fit of seconds on terms of very different units, and reading a
section of seconds back from JSON with errors that name the field at fault."""
from __future__ import annotations

from typing import Dict, Mapping, Sequence

import numpy as np
from scipy.optimize import nnls


def fit_non_negative(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> np.ndarray:
    """Coefficients >= 0 minimising the absolute error of rows @ coef against ys. Columns are scaled
    first: bytes and counts differ by orders of magnitude."""
    a, y = np.asarray(rows, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    scale = np.maximum(np.abs(a).max(axis=0), 1e-300)
    coef, _ = nnls(a / scale, y)
    return coef / scale


def seconds_from_dict(d: object, fields: Sequence[str], what: str) -> Dict[str, float]:
    """{field: seconds} from a JSON mapping holding only `fields`, each a number; ValueError naming
    `what` and the field otherwise."""
    if not isinstance(d, Mapping):
        raise ValueError(f"{what} must be an object with {', '.join(fields)}, got {d!r}")
    extra = set(d) - set(fields)
    if extra:
        raise ValueError(f"{what} has unknown fields {sorted(extra)}; known: {list(fields)}")
    for k, v in d.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{what}.{k} must be a number of seconds, got {v!r}")
    return {k: float(v) for k, v in d.items()}


__all__ = ["fit_non_negative", "seconds_from_dict"]
