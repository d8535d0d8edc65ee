"""Static shapes: tuples whose entries are ints or None (unknown)."""
from __future__ import annotations

from typing import Iterable, Optional, Tuple

from .errors import ShapeError

Shape = Tuple[Optional[int], ...]


def as_shape(value: Iterable | None) -> Shape:
    if value is None:
        raise ShapeError("shape must be given (rank must be known); use None for unknown dims")
    out = []
    for d in value:
        if d is None or (isinstance(d, int) and d == -1):
            out.append(None)
        else:
            d = int(d)
            if d < 0:
                raise ShapeError(f"negative dimension {d} in shape {tuple(value)}")
            out.append(d)
    return tuple(out)


def fully_defined(shape: Shape) -> bool:
    return all(d is not None for d in shape)


def num_elements(shape: Shape) -> Optional[int]:
    n = 1
    for d in shape:
        if d is None:
            return None
        n *= d
    return n


def num_elements_est(shape: Shape, unknown: int = 1) -> int:
    """Element count with unknown dims taken as `unknown` (for cost estimates)."""
    n = 1
    for d in shape:
        n *= unknown if d is None else d
    return n


def dim_compatible(a: Optional[int], b: Optional[int]) -> bool:
    return a is None or b is None or a == b


def compatible(a: Shape, b: Shape) -> bool:
    return len(a) == len(b) and all(dim_compatible(x, y) for x, y in zip(a, b))


def broadcast(a: Shape, b: Shape) -> Shape:
    """numpy broadcasting of two static shapes; raises ShapeError when they cannot broadcast."""
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == 1:
            out.append(y)
        elif y == 1:
            out.append(x)
        elif x is None:
            out.append(y)  # y is known and != 1, so x must equal it at run time
        elif y is None or x == y:
            out.append(x)
        else:
            raise ShapeError(f"shapes {fmt(a)} and {fmt(b)} do not broadcast")
    return tuple(out)


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def fmt(shape: Shape) -> str:
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"
