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

Fitted against a profile (samples with "priced_s", the part's kernels as the profile prices them),
the fit is of the whole part per request instead,

    edge seconds = invoke_s + byte_s * boundary bytes + kernel_scale * priced kernels,

and kernel_scale is what the device takes for the profile's kernel second inside a real part run
per request: one-node calibration cases find caches that a request, coming after the device did
other work, does not (issue 27: the int8 interpreter ran the models' kernels 15-30% over their
one-node timings when emulated at 20x). DeviceProfile.op_time applies it to every kernel it prices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Mapping

import numpy as np

from .cost_terms import fit_non_negative, seconds_from_dict

FIELDS = ("invoke_s", "byte_s", "kernel_scale")


@dataclass(frozen=True)
class PartCost:
    """Seconds per edge part run beyond its kernels: a fixed term and one per boundary byte."""
    invoke_s: float = 0.0   # each run of an edge part (the interpreter's call, its step loop)
    byte_s: float = 0.0     # each byte entering or leaving the part (inputs, sent, received, outputs)
    kernel_scale: float = 1.0  # the part's kernels take this many times what the profile prices them at

    def __post_init__(self):
        for k in FIELDS:
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and 0.0 <= v < float("inf")):
                raise ValueError(f"PartCost.{k} must be finite seconds >= 0, got {v!r}")

    def seconds(self, parts: int, nbytes: float) -> float:
        return self.invoke_s * parts + self.byte_s * nbytes

    def scaled(self, factor: float) -> "PartCost":
        """The same runtime on a device `factor` times slower."""
        return PartCost(self.invoke_s * factor, self.byte_s * factor, self.kernel_scale)  # a ratio: unscaled

    @classmethod
    def fit(cls, samples: Iterable[Mapping[str, float]]) -> "PartCost":
        """From samples {"seconds": a part's time less its node kernels', "nbytes": its boundary
        bytes}, or, when every sample has them, {"edge_s": the part's whole time per request,
        "priced_s": its kernels as a profile prices them, "nbytes"} (then kernel_scale is fitted
        too); non-negative least squares."""
        samples = list(samples)
        against = bool(samples) and all("priced_s" in s for s in samples)
        need = ("edge_s", "nbytes", "priced_s") if against else ("seconds", "nbytes")
        rows, ys = [], []
        for k, s in enumerate(samples):
            try:
                vals = [float(s[f]) for f in need]
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"part cost sample {k}: needs {', '.join(need)} ({e})") from None
            if not (all(np.isfinite(vals)) and min(vals[1:]) >= 0):
                raise ValueError(f"part cost sample {k}: values must be finite, {', '.join(need[1:])} >= 0, got {dict(s)}")
            rows.append([1.0] + vals[1:])
            ys.append(max(vals[0], 0.0))
        if len(rows) < len(need):
            raise ValueError(f"fitting the part cost needs at least {len(need)} samples, got {len(rows)}")
        coef = fit_non_negative(rows, ys)  # absolute error: a sample can be a difference of two timings near 0
        return cls(float(coef[0]), float(coef[1]), float(coef[2]) if against else 1.0)

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
        scale = f", its kernels x {self.kernel_scale:.3g}" if self.kernel_scale != 1.0 else ""
        return f"{self.invoke_s * 1e3:.3g} ms per edge part + {self.byte_s * 1e9:.3g} ms per MB across its boundary{scale}"


__all__ = ["PartCost", "FIELDS"]
