"""Emulation for demos, tests and benchmarks on loopback: a link that sleeps as a real one would
take (EmulatedLink, wire/link.py's formula) and an edge device slower than this machine
(emulated_kernel_seconds; OffloadClient's edge_slowdown). Nothing here runs unless asked for.
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional

import numpy as np

from ..wire.link import transfer_seconds
from .interpreter import Interpreter


class EmulatedLink:
    """Makes each transfer take bytes * 8 / bandwidth + RTT / 2 (so a call's request and response
    together add the RTT), like the partitioner's LinkModel. Change it while running with `set`."""

    def __init__(self, bandwidth_bps: float, rtt_s: float = 0.0):
        self.set(bandwidth_bps, rtt_s)

    def set(self, bandwidth_bps: float, rtt_s: Optional[float] = None) -> None:
        if not bandwidth_bps > 0:
            raise ValueError(f"bandwidth must be positive, got {bandwidth_bps!r}")
        self.bandwidth_bps = float(bandwidth_bps)
        if rtt_s is not None:
            if not rtt_s >= 0:
                raise ValueError(f"rtt must be >= 0, got {rtt_s!r}")
            self.rtt_s = float(rtt_s)

    def transfer_time(self, nbytes: int) -> float:
        return transfer_seconds(nbytes, self.bandwidth_bps, self.rtt_s)

    def __repr__(self) -> str:
        return f"EmulatedLink({self.bandwidth_bps / 1e6:g} Mbit/s, rtt {self.rtt_s * 1e3:g} ms)"


def emulated_kernel_seconds(interp: Interpreter, *inputs: np.ndarray, slowdown: float = 1.0,
                            runs: int = 21) -> Dict[str, float]:
    """Seconds of each kernel of a full (no remote part) model on `inputs`, as the emulated edge
    runs it: the CPU time of the calling thread (median of `runs`), times `slowdown`, each run
    followed by the emulated edge's sleep (so a run starts with the caches as cold as the client's
    requests do). The kernels' medians are then scaled so that they add up to the median of whole
    runs timed as one: a sum of per-kernel medians leaves out every run's few slow kernels (a page
    fault, an interrupt) and the steps' own overhead, which a request always pays (MobileNetV2-160:
    9.5 ms summed against 9.9 for a whole run). Keyed by the node each kernel's first output is
    named after (a fused kernel: the last node of its group; quantize steps: '<tensor>/quant',
    '<tensor>/dequant'), which is how the partitioner's measured node times
    (partitioner/measured.py) take them."""
    m = interp.model
    if m.remote:
        raise ValueError("emulated_kernel_seconds times a full model; this one has remote parts")
    if not (slowdown >= 1.0 and runs >= 1):
        raise ValueError(f"slowdown must be >= 1 and runs >= 1, got {slowdown!r}, {runs!r}")
    names, steps = zip(*interp.kernels) if interp.kernels else ((), ())
    interp.invoke(*inputs)  # checks the inputs; warms up

    def put_inputs():
        interp.set_inputs(*inputs)  # the arena reuses an input's bytes after its last reader
    samples: List[List[float]] = [[] for _ in steps]
    wholes: List[float] = []
    for _ in range(runs):
        put_inputs()
        total = 0.0
        for k, step in enumerate(steps):
            c = time.thread_time()
            step()
            dt = time.thread_time() - c
            samples[k].append(dt)
            total += dt
        time.sleep((slowdown - 1.0) * total)
        put_inputs()
        c = time.thread_time()
        for step in steps:
            step()
        whole = time.thread_time() - c
        wholes.append(whole)
        time.sleep((slowdown - 1.0) * whole)
    medians = [float(np.median(ss)) for ss in samples]
    scale = float(np.median(wholes)) / sum(medians) if sum(medians) > 0 else 1.0
    out: Dict[str, float] = {}
    for n, med in zip(names, medians):
        out[n] = out.get(n, 0.0) + slowdown * scale * med
    return out


__all__ = ["EmulatedLink", "emulated_kernel_seconds"]
