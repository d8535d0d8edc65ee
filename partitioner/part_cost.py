"""What an edge part costs beyond its nodes' kernels: fitted from real parts, priced in every plan.

The sum of a part's node times leaves out what running the part as one interpreter call costs:
copying the model's inputs into the arena, quantizing and dequantizing where int8 kernels meet the
tensors sent, received or returned, binding what the service returns, copying the outputs out,
and the interpreter's step loop. Issue 27 measured split edge parts 1.4-2.5x over the sum of their
nodes. `isthmus profile --parts` (apps/part_measure.py) times edge parts of several sizes, each
whole invoke against its node kernels one by one, and fits

    seconds = invoke_s + byte_s * (bytes entering and leaving the part)

by non-negative least squares; the profile keeps it (DeviceProfile.part) and plan.priced adds it to
every plan that runs an edge part (edge-only, split, and cloud-only, whose part sends the inputs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Mapping

import numpy as np

from .cost_terms import fit_non_negative, seconds_from_dict

FIELDS = ("invoke_s", "byte_s")


@dataclass(frozen=True)
class PartCost:
    """Seconds per edge part run beyond its kernels: a fixed term and one per boundary byte."""
    invoke_s: float = 0.0   # each run of an edge part (the interpreter's call, its step loop)
    byte_s: float = 0.0     # each byte entering or leaving the part (inputs, sent, received, outputs)

    def __post_init__(self):
        for k in FIELDS:
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and 0.0 <= v < float("inf")):
                raise ValueError(f"PartCost.{k} must be finite seconds >= 0, got {v!r}")

    def seconds(self, parts: int, nbytes: float) -> float:
        return self.invoke_s * parts + self.byte_s * nbytes

    def scaled(self, factor: float) -> "PartCost":
        """The same runtime on a device `factor` times slower."""
        return PartCost(self.invoke_s * factor, self.byte_s * factor)

    @classmethod
    def fit(cls, samples: Iterable[Mapping[str, float]]) -> "PartCost":
        """From samples {"seconds": a part's time less its node kernels', "nbytes": its boundary
        bytes}; non-negative least squares."""
        rows, ys = [], []
        for k, s in enumerate(samples):
            try:
                y, b = float(s["seconds"]), float(s["nbytes"])
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"part cost sample {k}: needs seconds and nbytes ({e})") from None
            if not (np.isfinite(y) and np.isfinite(b) and b >= 0):
                raise ValueError(f"part cost sample {k}: values must be finite, nbytes >= 0, got {dict(s)}")
            rows.append([1.0, b])
            ys.append(max(y, 0.0))
        if len(rows) < 2:
            raise ValueError(f"fitting the part cost needs at least 2 samples, got {len(rows)}")
        coef = fit_non_negative(rows, ys)  # absolute error: a sample can be a difference of two timings near 0
        return cls(float(coef[0]), float(coef[1]))

    def to_dict(self) -> Dict[str, float]:
        return {k: getattr(self, k) for k in FIELDS}

    @classmethod
    def from_dict(cls, d: object, what: str = "part") -> "PartCost":
        """From a `to_dict` mapping; errors name `what` and the field at fault."""
        values = seconds_from_dict(d, FIELDS, what)
        try:
            return cls(**values)
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None

    def describe(self) -> str:
        return f"{self.invoke_s * 1e3:.3g} ms per edge part + {self.byte_s * 1e9:.3g} ms per MB across its boundary"


__all__ = ["PartCost", "FIELDS"]
