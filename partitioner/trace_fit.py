"""Refit a device profile from traces of real runs: the cost model learns from production.

    md = RunMetadata(); sess.run(fetches, feeds, options=RunOptions(trace=True), run_metadata=md)
    md.write_chrome_trace("step.json")
    isthmus calibrate --from-trace step.json [more.json ...] --base cloud.json --device cloud

Every node event of a trace (core/trace.py) carries the op, its registered cost at the shapes
it ran with (FLOPs, bytes read + written) and its measured duration. Per op type (grouped
convolutions apart, as in calibration): with at least `MIN_SAMPLES` events of distinct
costs, the regression is fitted afresh on them; with fewer, the base profile's regression is
kept in shape and rescaled by the median ratio of measured to predicted time (one number
is all a handful of same-shaped events can tell). Op types absent from the traces keep the
base profile's coefficients.
"""
from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Dict, Iterable, List, Sequence, Tuple, Union

import numpy as np

from .calibrate import Sample, errors, fit_coeffs
from .devices import DeviceProfile

MIN_SAMPLES = 3  # events of distinct (flops, bytes) needed to fit c0, c_flops, c_bytes
_SKIP_OPS = {"Const", "Placeholder", "Variable", "NoOp", "Send", "Recv", "If", "While", "WhileGrad"}


class TraceError(ValueError):
    """A trace file that is not a Chrome trace of isthmus node events."""


def _events(trace: Union[dict, str], where: str) -> List[dict]:
    if isinstance(trace, str):
        where = trace
        if os.path.getsize(trace) > (1 << 30):
            raise TraceError(f"{trace}: over 1 GiB; split the trace")
        try:
            with open(trace, encoding="utf-8") as f:
                trace = json.load(f)
        except (OSError, ValueError) as e:
            raise TraceError(f"{trace}: not a readable JSON trace ({e})") from None
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise TraceError(f"{where}: no 'traceEvents' list (expected Chrome trace-event JSON from "
                         "RunMetadata.write_chrome_trace)")
    return events


def samples_from_trace(traces: Iterable[Union[dict, str]]) -> List[Sample]:
    """One Sample per complete node event that carries a cost ('X' events with args.flops)."""
    out: List[Sample] = []
    for k, trace in enumerate(traces):
        for i, e in enumerate(_events(trace, f"trace {k}")):
            if not isinstance(e, dict) or e.get("ph") != "X":
                continue
            args = e.get("args") or {}
            op = args.get("op")
            if not isinstance(op, str) or op in _SKIP_OPS or "flops" not in args:
                continue
            try:
                flops, nbytes = float(args["flops"]), float(args.get("bytes", 0.0))
                seconds = float(e["dur"]) * 1e-6
                groups = int(args.get("groups", 1))
            except (KeyError, TypeError, ValueError):
                raise TraceError(f"event {i} ({e.get('name')!r}) has malformed dur/flops/bytes") from None
            if not (np.isfinite(flops) and np.isfinite(nbytes) and np.isfinite(seconds)) or seconds <= 0 \
                    or flops < 0 or nbytes < 0:
                continue
            key = f"{op}:grouped" if groups != 1 and op.startswith(("Conv2D", "FusedConv2D")) else op
            out.append(Sample(key, str(e.get("name", "")), flops, nbytes, seconds))
    return out


def refit(base: DeviceProfile, samples: Sequence[Sample], name: str = None) -> Tuple[DeviceProfile, Dict[str, str]]:
    """(the refitted profile, op type -> how it was refitted: 'fitted' or 'scaled xN.NN')."""
    by_op: Dict[str, List[Sample]] = {}
    for s in samples:
        by_op.setdefault(s.op, []).append(s)
    coeffs = dict(base.op_coeffs)
    how: Dict[str, str] = {}
    for op, ss in sorted(by_op.items()):
        distinct = {(s.flops, s.nbytes) for s in ss}
        if len(distinct) >= MIN_SAMPLES:
            coeffs[op] = fit_coeffs(ss)
            how[op] = "fitted"
        else:
            ratio = float(np.median([s.seconds / max(base.op_time(op, s.flops, s.nbytes), 1e-12) for s in ss]))
            c = base.op_coeffs.get(op) or base.op_coeffs.get(op.split(":")[0]) or base.default_coeffs
            if c is None:  # roofline only: express it as coefficients, then scale
                c = (base.op_overhead, 1.0 / base.peak_flops, 1.0 / base.mem_bandwidth)
            coeffs[op] = tuple(v * ratio for v in c)
            how[op] = f"scaled x{ratio:.2f}"
    # A trace cannot tell a one-row product from a many-row one (its events carry FLOPs and bytes,
    # symmetric in rows and columns), so the base's variants of a traced op (MatMul:vector, ...)
    # are rescaled by how much faster or slower the traced events ran than the base predicted.
    for key in sorted(base.op_coeffs):
        op = key.split(":")[0]
        if ":" in key and key not in by_op and op in by_op:
            ratio = float(np.median([s.seconds / max(base.op_time(s.op, s.flops, s.nbytes), 1e-12)
                                     for s in by_op[op]]))
            coeffs[key] = tuple(v * ratio for v in base.op_coeffs[key])
            how[key] = f"scaled x{ratio:.2f}"
    return replace(base, name=name or base.name, op_coeffs=coeffs), how


def report(base: DeviceProfile, refitted: DeviceProfile, samples: Sequence[Sample]) -> Dict[str, Dict[str, float]]:
    """Mean absolute percentage error on the traced events, per op type, before and after."""
    before, after = errors(base, samples), errors(refitted, samples)
    return {op: {"before": before[op], "after": after[op], "events": sum(s.op == op for s in samples)}
            for op in sorted(before)}
