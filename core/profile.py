"""Per-node timing of a compiled plan, for profiles by op type and for calibrating costs.

This runs the plan's kernels one by one under a timer (the normal path has no timer at
all, so profiling costs nothing when it is off).
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Callable, Dict, List, Optional, Tuple

from .fetches import fetch_key
from .graph import Node, Tensor


def time_nodes(session, fetches, feed_dict: Optional[dict] = None, repeats: int = 5,
               clock: Callable[[], float] = time.perf_counter) -> Dict[Node, float]:
    """Median seconds per node over `repeats` runs of `fetches`; `clock=time.thread_time` counts the
    calling thread's CPU time instead of wall time (far less disturbed by other processes on a
    shared machine; it misses work a kernel hands to other threads)."""
    feed_dict = feed_dict or {}
    plan = session.plan_for(fetches, feed_dict)
    checks = session._plans[(_key(session, fetches), tuple(feed_dict))][2]
    feeds = [c(v) for c, v in zip(checks, feed_dict.values())]
    samples: Dict[Node, List[float]] = defaultdict(list)
    with getattr(session, "_threads", contextlib.nullcontext()):  # the session's intra_op_threads, as in run
        _time_runs(plan, feeds, samples, repeats, clock)
    return {n: sorted(s)[len(s) // 2] for n, s in samples.items()}


def _time_runs(plan, feeds, samples: Dict[Node, List[float]], repeats: int, clock=time.perf_counter) -> None:
    for _ in range(repeats):
        values: Dict[Tensor, object] = dict(zip(plan.feeds, feeds))
        values.update(plan.constants)
        for n in plan.nodes:
            k = plan.kernels.get(n)
            if k is None:
                continue
            args = [values[t] for i, t in enumerate(n.inputs) if i not in n.opdef.ref_inputs]
            t0 = clock()
            out = k(*args)
            samples[n].append(clock() - t0)
            if len(n.outputs) == 1:
                values[n.outputs[0]] = out
            elif n.outputs:
                for t, v in zip(n.outputs, out):
                    values[t] = v


def by_op_type(times: Dict[Node, float]) -> List[Tuple[str, float, int]]:
    """(op type, total seconds, node count), slowest first."""
    tot: Dict[str, float] = defaultdict(float)
    cnt: Dict[str, int] = defaultdict(int)
    for n, s in times.items():
        tot[n.op] += s
        cnt[n.op] += 1
    return sorted(((op, tot[op], cnt[op]) for op in tot), key=lambda r: -r[1])


def _key(session, fetches):
    return fetch_key(fetches)
