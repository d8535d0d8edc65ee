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

A stretch of edge work that starts after the core idled finds its caches cold (the interpreter's
and the client's code, the arena, the weights): measured here (CPU time, one thread, parts of
0.2-1.8 ms) about 0.06 ms after 2 ms idle, 0.12 after 5, 0.18 after 20-100, whatever the part's
size. It is priced per segment of edge work, `cold_s * (1 - exp(-idle / cold_tau_s))` for one that
runs kernels, `cold_io_s` in its place for one that only moves tensors (a cloud-only request's
inputs sent, an answer received and returned: about a third of it here): the request's first
segment after the idle before it (`sleep_ratio` x the request's edge time: the
emulated edge sleeps (slowdown - 1) x its compute after each request; a real device busy with
back-to-back requests idles 0), and the segment after a remote call (idle: the call).
`isthmus profile --parts` measures the curve directly (apps/part_measure.cold_samples) and fits
the terms above on parts with their cold taken out, so a slowdown's longer idles do not leak into
kernel_scale. Every sample is first taken to the device's fast speed state by a probe read beside it
(speed_state.py): a fit made in a slow stretch priced every plan 1.3-1.5x slow.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, Iterable, Mapping

import numpy as np

from .cost_terms import fit_non_negative, seconds_from_dict

FIELDS = ("invoke_s", "byte_s", "kernel_scale", "cold_s", "cold_tau_s", "sleep_ratio", "cold_io_s", "cold_w_s")


@dataclass(frozen=True)
class PartCost:
    """Seconds per edge part run beyond its kernels: a fixed term and one per boundary byte."""
    invoke_s: float = 0.0   # each run of an edge part (the interpreter's call, its step loop)
    byte_s: float = 0.0     # each byte entering or leaving the part (inputs, sent, received, outputs)
    kernel_scale: float = 1.0  # the part's kernels take this many times what the profile prices them at
    cold_s: float = 0.0      # a segment of kernels after a long idle: refilling the caches (device seconds)
    cold_tau_s: float = 0.005  # how fast the caches go cold while the core idles (wall seconds: unscaled)
    sleep_ratio: float = 0.0   # idle before a request per second of its edge time ((s - 1) / s emulated)
    cold_io_s: float = 0.0     # cold_s of a segment that runs no kernel (sends inputs, takes an answer)
    cold_w_s: float = 0.0      # and per weight element its kernels read (re-read from memory after a long idle)

    def __post_init__(self):
        for k in FIELDS:
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and 0.0 <= v < float("inf")):
                raise ValueError(f"PartCost.{k} must be finite seconds >= 0, got {v!r}")

    def seconds(self, parts: int, nbytes: float) -> float:
        return self.invoke_s * parts + self.byte_s * nbytes

    def cold(self, idle_s: float, kernels: bool = True, weights: float = 0.0) -> float:
        """Seconds a segment of edge work (of kernels, or without: `kernels`) pays for its caches after
        the core idled `idle_s` seconds; `weights`: the weight elements its kernels read."""
        amp = self.cold_s + self.cold_w_s * max(float(weights), 0.0) if kernels else self.cold_io_s
        if amp == 0.0 or idle_s <= 0.0:
            return 0.0
        return amp * (-float(np.expm1(-idle_s / self.cold_tau_s)) if self.cold_tau_s > 0 else 1.0)

    def scaled(self, factor: float) -> "PartCost":
        """The same runtime on a device `factor` times slower (the ratios and the idle's clock unscaled)."""
        return replace(self, invoke_s=self.invoke_s * factor, byte_s=self.byte_s * factor,
                       cold_s=self.cold_s * factor, cold_io_s=self.cold_io_s * factor, cold_w_s=self.cold_w_s * factor)

    def emulated(self, slowdown: float) -> "PartCost":
        """As OffloadClient's edge_slowdown runs it: after each request the client sleeps
        (slowdown - 1) x the request's CPU time, an idle of (slowdown - 1) / slowdown of its edge time."""
        return replace(self, sleep_ratio=max(slowdown - 1.0, 0.0) / slowdown)

    @classmethod
    def fit(cls, samples: Iterable[Mapping[str, float]]) -> "PartCost":
        """From samples {"seconds": a part's time less its node kernels', "nbytes": its boundary
        bytes}, or, when every sample has them, {"edge_s": the part's whole time per request,
        "priced_s": its kernels as a profile prices them, "nbytes"} (then kernel_scale is fitted
        too); non-negative least squares. A sample's "cold_s" (its caches after idle, priced by the
        measured curve) is taken out of its time first: a term measured apart, not fitted again."""
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
            cold = float(s.get("cold_s", 0.0))
            if not (np.isfinite(cold) and cold >= 0):
                raise ValueError(f"part cost sample {k}: cold_s must be finite seconds >= 0, got {dict(s)}")
            rows.append([1.0] + vals[1:])
            ys.append(max(vals[0] - cold, 0.0))
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
        per_w = f" + {self.cold_w_s * 1e9:.3g} ms per million weights" if self.cold_w_s else ""
        cold = (f", {self.cold_s * 1e3:.3g} ms{per_w} per segment of kernels after a long idle ({self.cold_io_s * 1e3:.3g} "
                f"without kernels; tau {self.cold_tau_s * 1e3:.3g} ms)" if self.cold_s or self.cold_io_s or self.cold_w_s else "")
        return (f"{self.invoke_s * 1e3:.3g} ms per edge part + {self.byte_s * 1e9:.3g} ms per MB across its "
                f"boundary{scale}{cold}")


TAUS = tuple(float(t) for t in np.geomspace(0.5e-3, 100e-3, 40))  # the time constants fit_cold tries


def fit_cold(samples: Iterable[Mapping[str, float]], tau: "float | None" = None) -> "tuple[float, float]":
    """(cold_s, cold_tau_s) from samples {"idle_s": the idle before a segment, "cold_s": its seconds
    over the same segment run hot}: least squares of cold_s * (1 - exp(-idle / tau)) over `TAUS`, or
    with `tau` given (another curve's: the io segments') its amplitude alone."""
    pts = []
    for k, s in enumerate(samples):
        try:
            idle, cold = float(s["idle_s"]), float(s["cold_s"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"cold sample {k}: needs idle_s, cold_s ({e})") from None
        if not (np.isfinite(idle) and np.isfinite(cold) and idle >= 0):
            raise ValueError(f"cold sample {k}: idle_s must be finite >= 0 and cold_s finite, got {dict(s)}")
        pts.append((idle, cold))
    if len({p[0] for p in pts if p[0] > 0}) < 2:
        raise ValueError(f"fitting the cold curve needs samples at two idles > 0 at least, got {len(pts)} samples")
    if tau is not None and not (np.isfinite(tau) and tau > 0):
        raise ValueError(f"fit_cold: tau must be finite seconds > 0, got {tau!r}")
    idle, cold = np.array(pts).T
    best = (float("inf"), 0.0, TAUS[0])
    for tau in (TAUS if tau is None else (float(tau),)):
        shape = -np.expm1(-idle / tau)
        c = max(float(shape @ cold) / float(shape @ shape), 0.0)
        err = float(((c * shape - cold) ** 2).sum())
        if err < best[0]:
            best = (err, c, tau)
    return best[1], best[2]


def fit_cold_weights(samples: Iterable[Mapping[str, float]], tau: float) -> "tuple[float, float]":
    """(cold_s, cold_w_s) on the time constant `tau` (fit_cold's) from samples {"idle_s", "cold_s",
    "weights": the weight elements the segment's kernels read}: non-negative least squares of
    (cold_s + cold_w_s x weights) x (1 - exp(-idle / tau)). One amplitude for every part priced the
    weight-heavy ones low: after 50-100 ms idle the calibration CNNs of 21K-450K weights lost 0.18-0.33
    ms, the one of 3.5M 0.61-0.80 (the weights re-read from memory), and the 6.0M-weight
    ResNet-shaped part ran 0.3-0.8 ms a request over its price at 8x and 20x."""
    if not (np.isfinite(tau) and tau > 0):
        raise ValueError(f"fit_cold_weights: tau must be finite seconds > 0, got {tau!r}")
    rows, ys = [], []
    for k, s in enumerate(samples):
        try:
            idle, cold, w = float(s["idle_s"]), float(s["cold_s"]), float(s["weights"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"cold sample {k}: needs idle_s, cold_s, weights ({e})") from None
        if not (np.isfinite(idle) and np.isfinite(cold) and np.isfinite(w) and idle >= 0 and w >= 0):
            raise ValueError(f"cold sample {k}: idle_s, weights must be finite >= 0 and cold_s finite, got {dict(s)}")
        shape = -float(np.expm1(-idle / tau))
        rows.append([shape, shape * w])
        ys.append(cold)
    if len({r[1] / r[0] for r in rows if r[0] > 0}) < 2:
        raise ValueError("fitting a per-weight cold term needs segments of two weight counts at least")
    a, b = fit_non_negative(rows, ys)
    return float(a), float(b)


__all__ = ["PartCost", "FIELDS", "fit_cold", "fit_cold_weights"]
