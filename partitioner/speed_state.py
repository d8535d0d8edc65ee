"""How fast this machine runs right now: a fixed product timed beside calibration samples, so that a fit
can take out the speed state each sample was measured in.

This VM's speed moves 1.5-1.9x for seconds at a time (neighbours on the host, invisible to the load
average and to CPU time), and a phone has speed states too (its governor, its thermal limits). A
calibration that meets a slow stretch prices every plan slow: issue 27's part fit read the probe at
194-213 us while calibrating against 162-168 us in the measured blocks and fitted its kernel scale
1.49 (0.98-1.17 in eight other fits). A sample timed beside a probe reading `probe_s` is worth
`sample x reference / probe_s` at the reference state (`normalised`); the reference is the fast state,
the low quantile of every probe read during the calibration (`reference`): the fastest state recurs
within every stretch of a minute here, a slow one does not hold for the whole calibration. A fit keeps
the samples timed in the fast state where it has them (`median_at_reference`).
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Optional, Sequence, Tuple

import numpy as np

_PROBE = (np.ones((64, 576), np.float32), np.ones((576, 192), np.float32))  # int8-valued, fits the core's L2
QUANTILE = 10.0  # the percentile of a calibration's probes taken as its fast state


def speed_probe(reps: int = 3, warm_s: float = 2e-3, clock: Callable[[], float] = time.thread_time,
                work: Optional[Callable[[], object]] = None) -> float:
    """CPU seconds of one fixed int8-valued fp32 product (the fastest of `reps`, after `warm_s` of CPU
    spent on it untimed). Warmed first: a probe right after an idle (the emulated edge's sleep) finds
    the caches cold (+50-90 us of 165 after 20-100 ms idle here), which would read as a slow machine.
    Call it on the thread and BLAS thread count of the work it is beside (`limited_blas_threads(1)`:
    with two, CPU time counts the spinning for the other). (`clock`, `work`: for tests.)"""
    if work is None:
        a, b = _PROBE

        def work():
            np.dot(a, b)
    c = clock()
    while clock() - c < warm_s:
        work()
    best = float("inf")
    for _ in range(reps):
        c = clock()
        work()
        best = min(best, clock() - c)
    return best


def reference(probes: Iterable[float], quantile: float = QUANTILE) -> float:
    """The fast state's probe among a calibration's `probes` (their `quantile`th percentile)."""
    p = [float(x) for x in probes]
    if not p or not all(np.isfinite(p)) or min(p) <= 0:
        raise ValueError(f"speed probes must be finite seconds > 0, at least one, got {p[:5]}")
    return float(np.percentile(p, quantile))


def normalised(seconds: Sequence[float], probes: Sequence[float], ref: float) -> list:
    """Each of `seconds` at the reference state: x ref / its probe (`probes[k]` read beside `seconds[k]`)."""
    if len(seconds) != len(probes):
        raise ValueError(f"normalised: {len(seconds)} samples against {len(probes)} probes")
    return [float(s) * ref / float(p) for s, p in zip(seconds, probes)]


FAST_STATE = 1.1  # a sample whose probe is within this of the reference was timed in the fast state


def median_at_reference(timed: Sequence[Tuple[float, float]], ref: float, within: float = FAST_STATE) -> float:
    """The median of (seconds, the probe beside them) pairs at the reference state: of those timed in the
    fast state (probe <= `within` x ref), normalised; only when there is none, of all of them normalised.
    Normalising alone is not enough across a long slow stretch: a fit with half its samples probed at
    1.2-1.35x the reference came out kernel scale 1.19, where fits in the fast state gave 1.04-1.06
    (a network's kernels slow 1.08x as much as the probe does, weights read from memory half as much)."""
    if not timed:
        raise ValueError("median_at_reference: no samples")
    fast = [(t, p) for t, p in timed if p <= within * ref] or list(timed)
    return float(np.median(normalised([t for t, _ in fast], [p for _, p in fast], ref)))


__all__ = ["speed_probe", "reference", "normalised", "median_at_reference", "QUANTILE", "FAST_STATE"]
