"""Step tracing: `Session.run(..., options=RunOptions(trace=True), run_metadata=md)` records each
node's start and end, thread and device, and exports Chrome trace-event JSON (Perfetto,
chrome://tracing), one track per device and thread. With tracing off the run path is the
plain compiled plan: no timer, no check per node.

Times are microseconds after `RunMetadata.origin_s`, a wall-clock (time.time()) instant, so
the events of several processes (the tasks of a distributed step, the parts of a split run)
merge onto one timeline (`merge`). Send and Recv events carry their rendezvous key and the
bytes they moved; `transfers()` pairs each Send with its Recv, and the Chrome export draws
each pair as a flow arrow between the two devices' tracks.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional

from .errors import ExecutionError, IsthmusError

from .graph import Tensor


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
    key: str = ""             # Send/Recv: the transfer's rendezvous key ("src;dst;tensor")
    transfer_bytes: int = 0   # Send/Recv: the bytes of the tensor sent or received
    step: int = -1            # Send/Recv: the step id pairing them (distributed runs), -1 if none


@dataclass
class Transfer:
    """One tensor crossing from a Send to its Recv (matched by key and step)."""
    tensor: str
    src_device: str
    dst_device: str
    nbytes: int
    send: NodeEvent
    recv: NodeEvent

    @property
    def transit_us(self) -> float:
        """Delivery time once both ends were ready: from the later of the Send's end and the
        Recv's start to the Recv's end (the network or link, not the wait for the producer)."""
        return max(self.recv.end_us - max(self.send.end_us, self.recv.start_us), 0.0)

    @property
    def cross_task(self) -> bool:
        """True when it crossed tasks (processes): a network transfer, not a local hand-over."""
        return _task(self.src_device) != _task(self.dst_device)


def _task(device: str) -> str:
    i = device.find("/device:")
    return device if i < 0 else device[:i]


@dataclass
class RunMetadata:
    events: List[NodeEvent] = field(default_factory=list)
    device_peak_bytes: Dict[str, int] = field(default_factory=dict)  # GPU name -> peak bytes of the traced step
    origin_s: Optional[float] = None  # wall-clock time (time.time()) at which ts 0 falls

    def start_clock(self) -> float:
        """The offset (us) such that an instant on this timeline is offset + perf_counter() * 1e6;
        the first call sets the origin to now."""
        wall, perf = time.time(), time.perf_counter()
        if self.origin_s is None:
            self.origin_s = wall
        return (wall - self.origin_s) * 1e6 - perf * 1e6

    def merge(self, other: "RunMetadata", device: Optional[str] = None) -> None:
        """Add `other`'s events (another part, task or process) on this timeline; `device`
        relabels them (the part's device as their track)."""
        if not other.events:
            return
        if self.origin_s is None:
            self.origin_s = other.origin_s
        # events without an origin are taken to be on this timeline already
        shift = 0.0 if other.origin_s is None else (other.origin_s - self.origin_s) * 1e6
        self.events.extend(replace(e, start_us=e.start_us + shift, end_us=e.end_us + shift,
                                   device=e.device if device is None else device) for e in other.events)

    def transfers(self) -> List[Transfer]:
        """Every Send paired with its Recv: same key and step, the n-th Send with the n-th Recv."""
        sends: Dict[tuple, List[NodeEvent]] = {}
        recvs: Dict[tuple, List[NodeEvent]] = {}
        for e in self.events:
            if e.key and e.op in ("Send", "Recv"):
                (sends if e.op == "Send" else recvs).setdefault((e.key, e.step), []).append(e)
        out = []
        for k, ss in sends.items():
            rs = sorted(recvs.get(k, ()), key=lambda e: e.end_us)
            for s, r in zip(sorted(ss, key=lambda e: e.start_us), rs):
                src, dst, tensor = (k[0].split(";", 2) + ["", ""])[:3]
                out.append(Transfer(tensor, src or s.device, dst or r.device, max(s.transfer_bytes, r.transfer_bytes),
                                    s, r))
        out.sort(key=lambda t: t.send.start_us)
        return out

    def by_op(self) -> Dict[str, float]:
        """Total microseconds per op type, slowest first."""
        tot: Dict[str, float] = {}
        for e in self.events:
            tot[e.op] = tot.get(e.op, 0.0) + e.end_us - e.start_us
        return dict(sorted(tot.items(), key=lambda kv: -kv[1]))

    def to_chrome_trace(self) -> Dict:
        """Chrome trace-event JSON: a process per device (task), a thread track per thread, a
        flow arrow ("s" -> "f") from each Send to its Recv with the bytes it carried."""
        pids: Dict[str, int] = {}
        out = []
        for e in self.events:
            pid = pids.setdefault(e.device, len(pids) + 1)
            args = {"op": e.op, "bytes_out": e.bytes_out, "flops": e.flops, "bytes": e.bytes_moved, "groups": e.groups}
            if e.key:
                args.update(key=e.key, transfer_bytes=e.transfer_bytes, step=e.step)
            out.append({"name": e.node, "cat": e.op, "ph": "X", "ts": e.start_us,
                        "dur": max(e.end_us - e.start_us, 0.01), "pid": pid, "tid": e.thread, "args": args})
        for i, t in enumerate(self.transfers()):
            args = {"tensor": t.tensor, "bytes": t.nbytes, "src": t.src_device, "dst": t.dst_device,
                    "cross_task": t.cross_task, "transit_us": round(t.transit_us, 3)}
            for ph, e in (("s", t.send), ("f", t.recv)):
                # at the midpoint of the slice it binds to (so that both viewers bind it there)
                ev = {"name": "transfer", "cat": "transfer", "ph": ph, "id": i + 1, "pid": pids[e.device],
                      "tid": e.thread, "ts": e.start_us + max(e.end_us - e.start_us, 0.01) * 0.5, "args": args}
                if ph == "f":
                    ev["bp"] = "e"
                out.append(ev)
        meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": dev}} for dev, pid in pids.items()]
        other = {} if self.origin_s is None else {"otherData": {"origin_unix_s": self.origin_s}}
        return {"traceEvents": meta + out, "displayTimeUnit": "ms", **other}

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
    binding = getattr(plan, "binding", None)  # a GPU session's plan (core/device_binding.py)
    if binding is not None:
        for d in binding.table.gpus():
            d.reset_peak()
    base = metadata.start_clock()  # us on the metadata's timeline = base + perf_counter() * 1e6
    for i, n in enumerate(plan.nodes):
        k = plan.kernels.get(n)
        if k is None:
            continue
        args = [values[t] for j, t in enumerate(n.inputs) if j not in n.opdef.ref_inputs]
        ins = [values.get(t) for t in n.inputs]
        dev = binding.device(n) if binding is not None else None
        gpu = dev is not None and dev.kind == "GPU"
        s = time.perf_counter()
        try:
            out = k(*args)
            if gpu:  # GPU kernels only queue: the node's time is until its work is done
                dev.synchronize()
        except Exception as e:
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
        ev = NodeEvent(n.name, n.op, n.device or "/job:localhost/device:CPU:0", tid, base + s * 1e6,
                       base + e_ * 1e6, int(nbytes), flops, moved, groups if isinstance(groups, int) else 1)
        if n.op in ("Send", "Recv"):
            ev.key = str(n.attrs.get("key", ""))
            ev.transfer_bytes = int(getattr(args[0] if n.op == "Send" else out, "nbytes", 0))
        metadata.events.append(ev)
        for t in n.inputs:
            if last_use.get(t) == i and t not in keep and t not in plan.constants:
                values.pop(t, None)
        if gpu and hasattr(dev, "sample"):
            dev.sample()
    if binding is not None:  # the step's peak device memory, per GPU
        metadata.device_peak_bytes.update({d.name: d.peak_bytes() for d in binding.table.gpus()})
    return tuple(plan.copy_fetch(f, values[f]) if isinstance(f, Tensor) else None for f in plan.fetches)
