"""Does this VM's speed state slow all CPU work alike? The speed probe beside three kinds of work (issue 27).

    python benchmarks/speed_state_scaling.py [--seconds 120] [--out FILE]

The part fit takes each calibration sample to the fast speed state by the probe read beside it
(partitioner/speed_state.py), which holds if a slow stretch multiplies all the edge's work as it
does the probe. For `--seconds`, in turn (CPU time, one BLAS thread): the speed probe; the wide
calibration CNN's kernels timed hot (apps/part_measure, cache-resident compute); a cycle of 32
weight-bound convolutions, 8.4M weights (converters/edge_profile's streaming chain: memory-bound);
the fire CNN's whole edge-only request through the real OffloadClient at 1x; the probe again.
Printed and written as JSON: per kind, the slope of log(time) against log(probe) (1: alike), the
ratio of its median in the slow blocks (probe over 1.15x its 10th percentile) to the fast ones against
the probe's, and its coefficient of variation before and after normalising by the probe.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = ("wide_kernels", "weights_8_4M", "fire_request")


def analyse(rows: Sequence[Sequence[float]], kinds: Sequence[str] = KINDS) -> Dict[str, dict]:
    """rows of (probe before, probe after, one time per kind) -> per kind the scaling figures."""
    a = np.asarray(rows, float)
    p = (a[:, 0] + a[:, 1]) / 2
    slow = p > 1.15 * np.percentile(p, 10)
    out = {"probe_us": {"min": round(float(p.min()) * 1e6, 1), "median": round(float(np.median(p)) * 1e6, 1),
                        "max": round(float(p.max()) * 1e6, 1)}, "blocks": len(a), "slow_blocks": int(slow.sum())}
    for j, kind in enumerate(kinds, start=2):
        y = a[:, j]
        out[kind] = {"median_ms": round(float(np.median(y)) * 1e3, 4),
                     "loglog_slope": round(float(np.polyfit(np.log(p), np.log(y), 1)[0]), 3),
                     "cv": round(float(np.std(y) / np.mean(y)), 3),
                     "cv_normalised": round(float(np.std(y / p) / np.mean(y / p)), 3)}
        if slow.any() and (~slow).any():
            out[kind]["slow_over_fast"] = round(float(np.median(y[slow]) / np.median(y[~slow])), 3)
            out[kind]["probe_slow_over_fast"] = round(float(np.median(p[slow]) / np.median(p[~slow])), 3)
    return out


def measure(seconds: float) -> List[List[float]]:
    from isthmus.apps.part_measure import _clients, _hot_interpreter, _models, _time_part
    from isthmus.converters.edge_profile import _stream_chain
    from isthmus.edge.interpreter import Interpreter
    from isthmus.partitioner.speed_state import speed_probe
    from isthmus.partitioner.threads import limited_blas_threads
    models = _models(True, 2, None)
    data, values, _ = _stream_chain(True, 32)
    chain = Interpreter(data)
    chain.invoke(*values)
    rows = []
    with _clients(models, 0.02) as clients, limited_blas_threads(1):
        wide = _hot_interpreter(clients[2], 1)  # the wide CNN, edge-only
        fire, feed = clients[1], models[1][5]
        fire.edge_slowdown = 1.0
        fire.selector.switch(len(models[1][0].cuts) - 1)
        fire.invoke(feed)
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            p0 = speed_probe()
            k = _time_part(wide, [models[2][5]], 3)["kernels_s"]
            c = time.thread_time()
            chain.invoke(*values)
            s = time.thread_time() - c
            fire.invoke(feed)
            fire.invoke(feed)
            rows.append([p0, speed_probe(), k, s, fire.last["edge_s"]])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "speed_state_scaling.json"))
    args = ap.parse_args(argv)
    load0 = os.getloadavg()[0]
    doc = {"benchmark": "speed_state_scaling", **analyse(measure(args.seconds)),
           "load_average_before": round(load0, 2), "load_average_after": round(os.getloadavg()[0], 2)}
    print(json.dumps(doc, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
