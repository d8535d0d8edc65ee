"""Step tracing: `Session.run(..., options=RunOptions(trace=True), run_metadata=md)` records each
node's start and end, thread and device, and exports Chrome trace-event JSON (Perfetto,
chrome://tracing), one track per device and thread. With tracing off the run path is the
plain compiled plan: no timer, no check per node.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class RunOptions:
    trace: bool = False


@dataclass
class NodeEvent:
    node: str
    op: str
    device: str
    thread: int
    start_us: float
    end_us: float
    bytes_out: int = 0
    flops: float = 0.0        # the op's registered cost at the shapes it ran with
    bytes_moved: float = 0.0  # bytes read + written, likewise
    groups: int = 1           # a convolution's groups (grouped ones are priced apart)


@dataclass
class RunMetadata:
    events: List[NodeEvent] = field(default_factory=list)

    def by_op(self) -> Dict[str, float]:
        """Total microseconds per op type, slowest first."""
        tot: Dict[str, float] = {}
        for e in self.events:
            tot[e.op] = tot.get(e.op, 0.0) + e.end_us - e.start_us
        return dict(sorted(tot.items(), key=lambda kv: -kv[1]))

    def to_chrome_trace(self) -> Dict:
        pids: Dict[str, int] = {}
        out = []
        for e in self.events:
            pid = pids.setdefault(e.device, len(pids) + 1)
            out.append({"name": e.node, "cat": e.op, "ph": "X", "ts": e.start_us, "dur": max(e.end_us - e.start_us, 0.01),
                        "pid": pid, "tid": e.thread, "args": {"op": e.op, "bytes_out": e.bytes_out, "flops": e.flops,
                                                              "bytes": e.bytes_moved, "groups": e.groups}})
        meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": dev}} for dev, pid in pids.items()]
        return {"traceEvents": meta + out, "displayTimeUnit": "ms"}

    def write_chrome_trace(self, path: str) -> str:
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.to_chrome_trace(), f)
        os.replace(tmp, path)
        return path


class _Shaped:
    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype


class _ShapedNode:
    """A node as its cost function sees it, with the shapes of the values it actually ran on."""
    __slots__ = ("_n", "inputs", "outputs")

    def __init__(self, n, ins, outs):
        self._n = n
        self.inputs = tuple(_Shaped(getattr(v, "shape", t.shape), t.dtype) for t, v in zip(n.inputs, ins))
        self.outputs = tuple(_Shaped(getattr(v, "shape", t.shape), t.dtype) for t, v in zip(n.outputs, outs))

    def __getattr__(self, name):
        return getattr(self._n, name)


def _measured_cost(n, ins, outs):
    """(flops, bytes read + written) of node `n` at the shapes it ran with; zeros if unknown."""
    fn = n.opdef.cost
    if fn is None:
        return 0.0, 0.0
    try:
        c = fn(_ShapedNode(n, ins, outs))
        return float(c.flops), float(c.bytes_read + c.bytes_written)
    except Exception:  # a cost function must never break a traced run
        return 0.0, 0.0


def run_traced(plan, feeds, metadata: RunMetadata):
    """Run `plan` node by node under a timer (serially), recording one event per node."""
    values = dict(zip(plan.feeds, feeds))
    values.update(plan.constants)
    last_use: Dict[object, int] = {}
    for i, n in enumerate(plan.nodes):
        for t in n.inputs:
            last_use[t] = i
    keep = {f for f in plan.fetches}
    tid = threading.get_ident() % 100000
    t0 = time.perf_counter()
    for i, n in enumerate(plan.nodes):
        k = plan.kernels.get(n)
        if k is None:
            continue
        args = [values[t] for j, t in enumerate(n.inputs) if j not in n.opdef.ref_inputs]
        ins = [values.get(t) for t in n.inputs]
        s = time.perf_counter()
        try:
            out = k(*args)
        except Exception as e:
            from .errors import ExecutionError, IsthmusError
            if isinstance(e, IsthmusError):
                raise
            raise ExecutionError(f"node '{n.name}' ({n.op}) failed: {type(e).__name__}: {e}", n.name, n.op) from e
        e_ = time.perf_counter()
        outs = (out,) if len(n.outputs) == 1 else (out or ())
        nbytes = 0
        for t, v in zip(n.outputs, outs):
            values[t] = v
            nbytes += getattr(v, "nbytes", 0)
        flops, moved = _measured_cost(n, ins, outs)
        groups = n.attrs.get("groups", 1)
        metadata.events.append(NodeEvent(n.name, n.op, n.device or "/job:localhost/device:CPU:0", tid,
                                         (s - t0) * 1e6, (e_ - t0) * 1e6, int(nbytes), flops, moved,
                                         groups if isinstance(groups, int) else 1))
        for t in n.inputs:
            if last_use.get(t) == i and t not in keep and t not in plan.constants:
                values.pop(t, None)
    from .graph import Tensor
    return tuple(plan.copy_fetch(f, values[f]) if isinstance(f, Tensor) else None for f in plan.fetches)
