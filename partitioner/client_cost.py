"""The edge client's own cost per request, priced in every plan: fitted from the client's timings.

A plan's nodes and transfers are not all a request pays. The offload client (edge/offload_client.py)
also spends, on the edge, a fixed time per request (bookkeeping, copying inputs in and outputs
out), a fixed time per edge part it invokes (the interpreter's call, outside its kernels), a fixed
time per remote call (building the request, decoding the answer, the glue around the stub) and
a time per byte crossing the cut (encoding and decoding the tensors). Issue 27 measured 29 ms of
it per request at a 200x emulated edge in cloud-only mode, priced at zero until then. The round
trip and the RPC stack's own cost stay in LinkModel (rtt_s, call_s).

`ClientCost.fit(samples)` takes what the client reports per request (`OffloadClient.last`:
`client_s`, whether an edge part ran, the remote calls, the bytes each way) and fits the four
coefficients by non-negative least squares; `CostModel(..., client=...)` then prices them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Mapping

import numpy as np

from .cost_terms import fit_non_negative, seconds_from_dict


@dataclass(frozen=True)
class ClientCost:
    """Seconds the client spends on the edge beyond the plan's kernels and the link."""
    request_s: float = 0.0     # every request, whatever the plan
    edge_part_s: float = 0.0   # when the plan runs anything on the edge
    call_s: float = 0.0        # per remote call (when the plan has a cloud part)
    byte_s: float = 0.0        # per byte sent or received across the cut

    def __post_init__(self):
        for k in ("request_s", "edge_part_s", "call_s", "byte_s"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and 0.0 <= v < float("inf")):
                raise ValueError(f"ClientCost.{k} must be finite seconds >= 0, got {v!r}")

    def seconds(self, edge_part: bool, calls: int, nbytes: float) -> float:
        """What one request of a plan costs the client: its parts, its calls, its bytes across the cut."""
        return self.request_s + self.edge_part_s * bool(edge_part) + self.call_s * calls + self.byte_s * nbytes

    def scaled(self, factor: float) -> "ClientCost":
        """The same client on an edge `factor` times slower (all of it is edge CPU work)."""
        return ClientCost(*(factor * v for v in (self.request_s, self.edge_part_s, self.call_s, self.byte_s)))

    @classmethod
    def fit(cls, samples: Iterable[Mapping[str, object]]) -> "ClientCost":
        """Fit from the client's per-request reports: each a mapping with `client_s` (seconds),
        `edge_part` (bool), `calls` (int) and `nbytes` (bytes up + down), or an `OffloadClient.last`
        as it is (its `up_bytes` + `down_bytes`). Non-negative least
        squares: a coefficient the samples cannot tell apart from zero stays zero. The samples
        must vary what they fit: some requests on each kind of plan (edge-only, split, cloud-only)."""
        rows, ys = [], []
        for k, s in enumerate(samples):
            try:
                y = float(s["client_s"])
                nbytes = s["nbytes"] if "nbytes" in s else s["up_bytes"] + s["down_bytes"]  # an OffloadClient.last
                row = [1.0, float(bool(s["edge_part"])), float(s["calls"]), float(nbytes)]
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"client cost sample {k}: needs client_s, edge_part, calls, nbytes (or up_bytes and down_bytes) ({e})") from None
            if not (np.isfinite(y) and y >= 0 and all(np.isfinite(row)) and row[2] >= 0 and row[3] >= 0):
                raise ValueError(f"client cost sample {k}: values must be finite and >= 0, got {dict(s)}")
            rows.append(row)
            ys.append(y)
        if len(rows) < 4:
            raise ValueError(f"fitting the client cost needs at least 4 samples, got {len(rows)}")
        coef = fit_non_negative(rows, ys)  # absolute error: a sample can be a difference of two timings near 0
        return cls(*(float(c) for c in coef))

    def to_dict(self) -> Dict[str, float]:
        """The four terms by name (the `client` section of a device profile's JSON)."""
        return {k: getattr(self, k) for k in FIELDS}

    @classmethod
    def from_dict(cls, d: object, what: str = "client") -> "ClientCost":
        """From a `to_dict` mapping; errors name `what` and the field at fault."""
        values = seconds_from_dict(d, FIELDS, what)
        try:
            return cls(**values)
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None

    def describe(self) -> str:
        """One line for reports: the terms in the units they are read in."""
        return (f"{self.request_s * 1e3:.3g} ms per request + {self.edge_part_s * 1e3:.3g} ms per edge part + "
                f"{self.call_s * 1e3:.3g} ms per remote call + {self.byte_s * 1e9:.3g} ms per MB across the cut")


FIELDS = ("request_s", "edge_part_s", "call_s", "byte_s")

# The client's own cost on THIS machine kind, unslowed: ClientCost.fit over OffloadClient.last of 30
# requests (10 per cut: edge-only, split, cloud-only) of a 784-wide MLP split against an `isthmus
# serve` on loopback (tests/edge/test_offload_client_adapt.py::..._the_partitioner_fits_it prints
# it), 2026-11-27, on 2 cores shared with two other engineers' test runs. Medians were 0.026 ms
# (edge-only) and 0.148 ms (split, cloud-only); issue 27 measured 29 ms at a 200x edge in
# cloud-only mode, i.e. 0.145 ms unslowed. An edge N times slower than here costs HERE.scaled(N).
HERE = ClientCost(request_s=27e-6, edge_part_s=0.0, call_s=130e-6, byte_s=5.5e-9)
DEFAULT_EDGE_SLOWDOWN = 8.0  # the built-in edge profile (devices.EDGE) is this machine 8x slower


__all__ = ["ClientCost", "HERE", "DEFAULT_EDGE_SLOWDOWN", "FIELDS"]
