"""The offload client: run a split edge model, sending each cut's tensors to the offload service.

    client = OffloadClient("model.isth", "cloud:7000", security=ClientSecurity(...), deadline_ms=500)
    probs, = client.invoke(x)
    client.stats()   # cloud / fallback counts, link estimate, current cut, backoff

The file (converters/split_export.py) holds one subgraph per candidate cut, the whole model for
local fallback, and the uplink range where each cut is best. Per request the client runs the
current cut's edge part; at its RemotePart the interpreter hands the boundary tensors here, and
they go to the service as one Infer call with the request's remaining deadline.

The link is measured as it goes: the round trip is the least of the recent pings (a Describe call
every `ping_every` calls), and each Infer gives a bandwidth sample, bits / (its time on the wire
less the server's reported time less the round trip: delays only add, so each sample is a lower
bound); the estimate is the largest of the last `window` samples. When it leaves the current cut's
range (by more than `hysteresis`), the next request runs the cut whose range holds it. Small
transfers cannot show that a link got faster, so every `ping_every` requests one runs on the next
cut up (a probe; from an edge-only cut this is the only traffic). When the cloud is unreachable,
refuses, or misses the deadline, the request runs locally on the full model (fallback) and the cloud
is retried after an exponential backoff, on a fresh channel. `stats()` counts all of it; `last` says
how the latest request went. `EmulatedLink` adds bytes / bandwidth + RTT to every transfer, for
demos and benchmarks on loopback.

The loader here reads every subgraph of the file (edge/loader.py reads single-subgraph models);
its checks are those of loader.verify, applied per subgraph.

Tracing (`trace=True`): each Infer asks the service for its spans (InferResponse.trace, a
StepTrace), which are decoded strictly here (decode_service_trace: bounded, finite, named errors;
a bad trace is counted in stats()["trace_errors"] and dropped, the answer is still used) and placed
on the request's wall-clock timeline with the client's own spans: edge compute per edge part, the
emulated link (up/down), the call, a local run. If the service's spans do not fit inside the call
(clock skew between machines), they are shifted so that their middle sits at the call's middle.
`last["trace"]` holds the events (TraceSpan, microseconds after last["trace_origin_s"]);
`chrome_trace()` / `write_chrome_trace(path)` export them as core/trace.py does, with flow arrows
from the client's send to the service's decode and from its encode to the client's receive.

grpc is imported when a connection is first needed, never by `import isthmus.edge`.
"""
from __future__ import annotations

import collections
import json
import math
import mmap
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..wire import tensor_codec
from ..wire.link import transfer_seconds
from ..wire.split_format import LEGACY_BANDWIDTH_KEYS, MAX_BANDWIDTH_KEY, MIN_BANDWIDTH_KEY, SPLIT_KEY, SPLIT_VERSION
from ..wire.trace_events import MAX_TRACE_EVENTS, TraceDecodeError, check_event, check_trace
from .format import EdgeModelError
from .interpreter import Interpreter
from .loader import EdgeModel, RemoteInfo, verify_all

MAX_MESSAGE_BYTES = 256 << 20


# ---- the split file --------------------------------------------------------------------------------
@dataclass
class Cut:
    name: str
    model: EdgeModel          # the edge part (the full model for an edge-only cut)
    cloud_part: str           # "" for an edge-only cut
    min_bandwidth_bps: float
    max_bandwidth_bps: float
    inputs: List[str]         # wire names, in RemotePart.inputs order
    outputs: List[str]
    predicted_s: float


@dataclass
class SplitModel:
    name: str
    cuts: List[Cut]           # by increasing bandwidth
    full: Optional[EdgeModel]
    rtt_s: float
    metadata: Dict[str, str]

    def cut_for(self, bps: float) -> int:
        """The cut whose uplink range holds `bps` (bit/s)."""
        for k, c in enumerate(self.cuts):
            if bps < c.max_bandwidth_bps:
                return k
        return len(self.cuts) - 1


def _verify_models(buf) -> List[EdgeModel]:
    """Every subgraph of a model file as its own EdgeModel (sharing the file's buffers)."""
    return verify_all(buf)


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise EdgeModelError(f"metadata '{SPLIT_KEY}': {what}")


def _names(v, what: str) -> List[str]:
    _check(isinstance(v, list) and all(isinstance(s, str) and 0 < len(s) <= 1024 for s in v),
           f"{what} must be a list of names")
    return list(v)


def _number(v, what: str, allow_none: bool = False) -> float:
    if v is None and allow_none:
        return math.inf
    _check(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
           f"{what} must be a finite number >= 0, got {v!r}")
    return float(v)


def read_split(models: List[EdgeModel]) -> SplitModel:
    """Validate the split metadata of a verified file against its subgraphs."""
    text = models[0].metadata.get(SPLIT_KEY)
    if text is None:
        raise EdgeModelError(f"not a split model: no '{SPLIT_KEY}' metadata "
                             "(export it with converters/split_export.py)")
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise EdgeModelError(f"metadata '{SPLIT_KEY}' is not JSON: {e}") from None
    _check(isinstance(meta, dict), "must be an object")
    _check(meta.get("version") == SPLIT_VERSION, f"version {meta.get('version')!r}; this reader knows {SPLIT_VERSION}")
    full_i = meta.get("full")
    _check(full_i is None or (isinstance(full_i, int) and 0 <= full_i < len(models)),
           f"full subgraph {full_i!r} out of range")
    full = models[full_i] if full_i is not None else None
    if full is not None:
        _check(not full.remote, f"the full model (subgraph {full_i}) has remote parts")
    cuts_j = meta.get("cuts")
    _check(isinstance(cuts_j, list) and cuts_j, "no cuts")
    cuts: List[Cut] = []
    for k, c in enumerate(cuts_j):
        w = f"cut {k}"
        _check(isinstance(c, dict), f"{w} must be an object")
        sgi = c.get("subgraph")
        _check(isinstance(sgi, int) and 0 <= sgi < len(models), f"{w}: subgraph {sgi!r} out of range")
        model = models[sgi]
        part = c.get("cloud_part")
        _check(isinstance(part, str), f"{w}: cloud_part must be a string")
        ins, outs = _names(c.get("inputs"), f"{w} inputs"), _names(c.get("outputs"), f"{w} outputs")
        if part:
            _check(len(model.remote) == 1 and model.remote[0].name == part,
                   f"{w}: subgraph {sgi} must carry exactly one remote part named '{part}'")
            _check(len(ins) == len(model.remote[0].inputs) and len(outs) == len(model.remote[0].outputs),
                   f"{w}: {len(ins)}/{len(outs)} wire names for a remote part of "
                   f"{len(model.remote[0].inputs)}/{len(model.remote[0].outputs)} tensors")
        else:
            _check(not model.remote, f"{w}: an edge-only cut's subgraph {sgi} has remote parts")
        lo_key, hi_key = (k if k in c else LEGACY_BANDWIDTH_KEYS[k] for k in (MIN_BANDWIDTH_KEY, MAX_BANDWIDTH_KEY))
        lo, hi = _number(c.get(lo_key), f"{w} {lo_key}"), _number(c.get(hi_key), f"{w} {hi_key}", allow_none=True)
        _check(lo < hi and (not cuts or lo == cuts[-1].max_bandwidth_bps),
               f"{w}: range {lo}..{hi} does not follow the previous cut's")
        cuts.append(Cut(str(c.get("name", f"cut{k}")), model, part, lo, hi, ins, outs,
                        _number(c.get("predicted_s", 0.0), f"{w} predicted_s")))
    name = meta.get("model", "model")
    rtt = _number(meta.get("rtt_s", 0.0), "rtt_s")
    return SplitModel(str(name), cuts, full, rtt, models[0].metadata)


def load_split(path: str) -> SplitModel:
    """Map a split model file read-only and verify every subgraph and the cut table."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise EdgeModelError(f"cannot open edge model {path}: {e}") from None
    with f:
        if os.fstat(f.fileno()).st_size == 0:
            raise EdgeModelError(f"{path}: empty file")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        models = _verify_models(mm)
        split = read_split(models)
    except EdgeModelError as e:
        mm.close()
        raise EdgeModelError(f"{path}: {e}") from None
    for m in models:
        m._keep = mm
    return split


# ---- tensors on the wire (wire/tensor_codec.py) ------------------------------------------------------
def _encode(out, a: np.ndarray) -> None:
    """Fill a NamedTensor's TensorProto (`out`) with an array: dtype, shape, raw little-endian bytes."""
    try:
        tensor_codec.encode(a, out.tensor)
    except tensor_codec.TensorCodecError as e:
        raise EdgeModelError(f"tensor '{out.name}': {e}") from None


def _decode(nt, want_name: str, want_dtype: np.dtype, want_shape: tuple) -> np.ndarray:
    """A response tensor, checked against what the edge model expects before its bytes are read."""
    if nt.name != want_name:
        raise CloudError(f"the service answered tensor '{nt.name}' where '{want_name}' was expected")
    try:
        return tensor_codec.decode_as(nt.tensor, want_dtype, want_shape, f"tensor '{want_name}' from the service")
    except tensor_codec.TensorCodecError as e:
        raise CloudError(str(e)) from None


# ---- the link ---------------------------------------------------------------------------------------
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


# ---- tracing -----------------------------------------------------------------------------------------
EDGE_TRACK = "/job:edge/task:0/device:CPU:0"   # the client's spans (partitioner/devices.py EDGE_DEVICE)
LINK_TRACK = "emulated link"                    # EmulatedLink's sleeps
LINK_THREAD = 0
TraceError = TraceDecodeError  # a service trace that is not well formed (the request's answer is still used)


@dataclass
class TraceSpan:
    """One span of a traced request: microseconds after the request's start (last["trace_origin_s"],
    wall clock). The fields that core/trace.py's NodeEvent also has mean the same; `call` is the
    index of the request's remote call a span belongs to (-1: none)."""
    node: str
    op: str
    device: str
    thread: int
    start_us: float
    end_us: float
    bytes_out: int = 0
    call: int = -1


def _thread() -> int:
    return threading.get_ident() % 100000


def decode_service_trace(st, t_send: float, t_recv: float, where: str = "service trace",
                         max_events: int = MAX_TRACE_EVENTS) -> Tuple[List[TraceSpan], float]:
    """The service's spans of one call (a StepTrace: proto/worker.proto), decoded strictly, as
    microseconds after `t_send` (wall clock): an event lies at origin_s + start_us / 1e6. If the
    service's first..last span does not fit inside the call [t_send, t_recv] (the two machines'
    clocks differ), all of it is shifted so that its middle sits at the call's middle. Returns the
    spans and the shift (seconds). Raises TraceError naming the event and field at fault."""
    check_trace(st, where, max_events)
    if not st.events:
        raise TraceError(f"{where}: no events")
    if not (math.isfinite(t_send) and math.isfinite(t_recv) and t_recv >= t_send):
        raise ValueError(f"{where}: the call's window {t_send!r}..{t_recv!r} is not a time interval")
    off = (st.origin_s - t_send) * 1e6
    spans = []
    for i, e in enumerate(st.events):
        check_event(e, f"{where}: event {i}")
        spans.append(TraceSpan(e.node, e.op, e.device, int(e.thread), off + e.start_us, off + e.end_us,
                               int(e.bytes_out)))
    first, last = min(e.start_us for e in spans), max(e.end_us for e in spans)
    window = (t_recv - t_send) * 1e6
    shift = 0.0
    if first < 0 or last > window:
        shift = window / 2 - (first + last) / 2
        for e in spans:
            e.start_us += shift
            e.end_us += shift
    return spans, shift / 1e6


def chrome_trace(events: Sequence[TraceSpan], origin_s: Optional[float] = None) -> Dict:
    """Chrome trace-event JSON of a traced request, as core/trace.py writes it (a process per
    device, a thread track per thread, "X" slices; flows "s" -> "f" at the middle of the slices
    they bind to): an arrow from each call's send to the service's decode, one from the
    service's encode to the client's receive."""
    pids: Dict[str, int] = {}
    out: List[Dict] = []
    by: Dict[Tuple[int, str], TraceSpan] = {}
    for e in events:
        pid = pids.setdefault(e.device, len(pids) + 1)
        args = {"op": e.op, "bytes_out": e.bytes_out}
        if e.call >= 0:
            args["call"] = e.call
            by.setdefault((e.call, e.op), e)
        out.append({"name": e.node, "cat": e.op, "ph": "X", "ts": e.start_us,
                    "dur": max(e.end_us - e.start_us, 0.01), "pid": pid, "tid": e.thread, "args": args})
    flow = 0
    for call in sorted({c for c, _ in by}):
        for src, dst, what in (("OffloadSend", "OffloadDecode", "request"), ("OffloadEncode", "OffloadRecv", "answer")):
            a, b = by.get((call, src)), by.get((call, dst))
            if a is None or b is None:
                continue
            flow += 1
            args = {"what": what, "call": call, "src": a.device, "dst": b.device,
                    "bytes": a.bytes_out if what == "request" else b.bytes_out}
            for ph, e in (("s", a), ("f", b)):
                ev = {"name": what, "cat": "transfer", "ph": ph, "id": flow, "pid": pids[e.device], "tid": e.thread,
                      "ts": e.start_us + max(e.end_us - e.start_us, 0.01) * 0.5, "args": args}
                if ph == "f":
                    ev["bp"] = "e"
                out.append(ev)
    meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": dev}} for dev, pid in pids.items()]
    other = {} if origin_s is None else {"otherData": {"origin_unix_s": origin_s}}
    return {"traceEvents": meta + out, "displayTimeUnit": "ms", **other}


class CloudError(RuntimeError):
    """The cloud did not answer this request usefully (the client falls back when it can)."""


class _Miss(Exception):
    """The request's deadline passed on the (emulated) link."""


# ---- the client --------------------------------------------------------------------------------------
class OffloadClient:
    """Runs a split model (see the module docstring). Thread-compatible, not thread-safe: one
    request at a time per client (a lock serialises invoke)."""

    def __init__(self, model_path: str, address: str, security=None, deadline_ms: float = 1000.0,
                 link: Optional[EmulatedLink] = None, window: int = 3, hysteresis: float = 0.15,
                 backoff_s: Tuple[float, float] = (0.05, 5.0), ping_every: int = 16, adapt: bool = True,
                 initial_bandwidth_bps: Optional[float] = None, edge_slowdown: float = 1.0, resolution_s: float = 0.5e-3,
                 edge_clock: str = "cpu", trace: bool = False):
        """`edge_slowdown` > 1 emulates an edge device that many times slower than this machine
        (demos, benchmarks): after each request the client sleeps until the request's local compute
        has taken edge_slowdown x what it took here, so a request takes what it would on that device.
        `edge_clock` says what "took here" counts: "cpu", the CPU time of the invoking thread (other
        processes sharing the machine do not stretch it, so the emulated edge is as steady as the
        device it stands for; true when BLAS runs on one thread, as on a phone's interpreter), or
        "wall", the wall time (on a loaded machine, waits for a core are multiplied too).
        `trace` asks the service for its spans on every Infer and records the request's timeline
        (the module docstring, "Tracing")."""
        if not edge_slowdown >= 1.0:
            raise ValueError(f"edge_slowdown must be >= 1, got {edge_slowdown!r}")
        if edge_clock not in ("cpu", "wall"):
            raise ValueError(f"edge_clock must be 'cpu' or 'wall', got {edge_clock!r}")
        self.edge_slowdown = float(edge_slowdown)
        self.edge_clock = edge_clock
        self.split = load_split(model_path)
        self.address, self.security = address, security
        self.deadline_s = float(deadline_ms) / 1e3
        if not self.deadline_s > 0:
            raise ValueError(f"deadline_ms must be positive, got {deadline_ms!r}")
        self.link, self.hysteresis, self.adapt = link, float(hysteresis), adapt
        self.resolution_s = float(resolution_s)
        self.backoff_min, self.backoff_max = backoff_s
        self.ping_every = int(ping_every)
        self._interp: Dict[int, Interpreter] = {}
        self._full: Optional[Interpreter] = None
        self._channel = self._stub = self._pb = None
        self._stale = False
        self._lock = threading.Lock()
        self.rtt_s: Optional[float] = None
        self._rtts: collections.deque = collections.deque(maxlen=8)
        self.bandwidth_bps: Optional[float] = initial_bandwidth_bps
        self._samples: collections.deque = collections.deque(maxlen=max(1, int(window)))
        start = self.split.cut_for(initial_bandwidth_bps) if initial_bandwidth_bps else len(self.split.cuts) - 1
        self.cut = start
        self._backoff = 0.0
        self._retry_at = 0.0
        self._since_ping = 0
        self._since_probe = 0
        self._deadline_at = 0.0
        self.counts = dict(requests=0, cloud=0, fallback=0, local=0, unavailable=0, deadline=0, errors=0,
                           switches=0, probes=0, connects=0, pings=0, trace_errors=0)
        self.trace = bool(trace)
        self._spans: Optional[List["TraceSpan"]] = None   # the request's spans (wall-clock seconds) when tracing
        self._busy: List[Tuple[float, float]] = []        # its remote calls and local runs (wall clock)
        self.last_trace_error: Optional[str] = None
        self.latencies: List[float] = []
        self.last_error: Optional[str] = None
        # the latest request: mode, total_s, local_s (time in the full model), cut, edge_s (emulated edge compute),
        # remote_s (in remote calls), server_s (the service's queue + compute), server_compute_s, bytes each way
        self.last: Dict[str, object] = {}
        self._local_s = 0.0
        if self.split.full is not None:  # prepared now, so that a fallback costs only its compute
            self._full = Interpreter(self.split.full)
        for k, c in enumerate(self.split.cuts):  # and every cut, so that a switch costs nothing either
            if c.cloud_part:
                self._interp_for(k)
        if any(c.cloud_part for c in self.split.cuts):
            self._connect()  # imports grpc and makes the channel (no I/O yet): no request pays for that

    # ---- public -------------------------------------------------------------------------------------
    def invoke(self, *inputs: np.ndarray) -> List[np.ndarray]:
        with self._lock:
            t0, c0 = time.perf_counter(), time.thread_time()
            self._deadline_at = t0 + self.deadline_s
            self.counts["requests"] += 1
            before, self._local_s, cut = dict(self.counts), 0.0, self.split.cuts[self.cut].name
            self._remote_s = self._server_s = self._compute_s = self._remote_cpu_s = 0.0
            self._up_bytes = self._down_bytes = 0
            w0 = time.time()
            if self.trace:
                self._spans, self._busy, self._trace_w0, self._trace_shift_s = [], [], w0, 0.0
            try:
                return self._invoke(inputs)
            finally:
                w_done = time.time()
                edge_s = self._emulate_edge(t0, c0)
                total = time.perf_counter() - t0
                mode = next((k for k in ("cloud", "fallback", "local") if self.counts[k] > before[k]), "error")
                # where the time went: computing on the (emulated) edge, in remote calls (link + service)
                # and, of that, the service's queue + compute; the bytes each way
                self.last = dict(mode=mode, total_s=total, local_s=self._local_s, cut=cut,
                                 edge_s=edge_s, remote_s=self._remote_s,
                                 server_s=self._server_s, server_compute_s=self._compute_s,
                                 up_bytes=self._up_bytes, down_bytes=self._down_bytes)
                if self._spans is not None:
                    self._finish_trace(cut, w0, w_done, time.time())
                self.latencies.append(total)
                if len(self.latencies) > 10000:
                    del self.latencies[:5000]

    def _emulate_edge(self, t0: float, c0: float) -> float:
        """Seconds the request computed on the (emulated) edge, remote calls left out; with a
        slowdown, sleeps until that much time has passed in computing plus sleeping."""
        wall = max(time.perf_counter() - t0 - self._remote_s, 0.0)  # computing here, not waiting
        if self.edge_slowdown <= 1.0:
            return wall
        if self.edge_clock == "cpu":
            edge = self.edge_slowdown * max(time.thread_time() - c0 - self._remote_cpu_s, 0.0)
            time.sleep(max(edge - wall, 0.0))
            return max(edge, wall)
        time.sleep((self.edge_slowdown - 1.0) * wall)
        return self.edge_slowdown * wall

    def stats(self) -> Dict[str, object]:
        lat = sorted(self.latencies)
        pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3 if lat else None)
        c = self.split.cuts[self.cut]
        return dict(self.counts, cut=c.name, cloud_part=c.cloud_part or None, bandwidth_bps=self.bandwidth_bps, rtt_ms=
                    None if self.rtt_s is None else self.rtt_s * 1e3, backoff_s=self._backoff,
                    cloud_down=time.monotonic() < self._retry_at, p50_ms=pct(0.5), p99_ms=pct(0.99),
                    last_error=self.last_error)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = self._stub = None

    def __enter__(self) -> "OffloadClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- one request -----------------------------------------------------------------------------------
    def _invoke(self, inputs) -> List[np.ndarray]:
        k = self.cut
        down = time.monotonic() < self._retry_at
        self._since_probe += 1
        up = next((j for j in range(k + 1, len(self.split.cuts)) if self.split.cuts[j].cloud_part), None)
        if self.adapt and up is not None and not down and self._since_probe >= self.ping_every:
            # a probe: small transfers cannot show that the link got faster (their time is mostly
            # RTT and jitter), so every ping_every requests one runs on the next cut up, which
            # sends more, and its measurement decides whether to move up
            k, self._since_probe = up, 0
            self.counts["probes"] += 1
        if not self.split.cuts[k].cloud_part:  # the planner keeps everything on the edge at this bandwidth
            self.counts["local"] += 1
            return self._local(inputs)
        if down:
            if self.split.full is None:
                raise CloudError(f"the cloud is backing off after: {self.last_error}; the model carries no full copy")
            self.counts["local"] += 1
            return self._local(inputs)
        try:
            outs = self._interp_for(k).invoke(*inputs)
        except (_Miss, CloudError) as e:
            return self._fall_back(inputs, e)
        self._backoff = 0.0
        self.counts["cloud"] += 1
        return outs

    def _fall_back(self, inputs, e: Exception) -> List[np.ndarray]:
        if isinstance(e, _Miss):
            self.counts["deadline"] += 1
        self.last_error = str(e) or type(e).__name__
        self._backoff = min(self.backoff_max, max(self.backoff_min, self._backoff * 2))
        self._retry_at = time.monotonic() + self._backoff
        if self.split.full is None:
            raise CloudError(f"cloud failed ({self.last_error}) and the model carries no full copy "
                             "to fall back on") from e
        self.counts["fallback"] += 1
        return self._local(inputs)

    def _local(self, inputs) -> List[np.ndarray]:
        if self._full is None:
            if self.split.full is None:
                raise CloudError("the model carries no full copy to run locally")
            self._full = Interpreter(self.split.full)
        t, w = time.perf_counter(), time.time()
        try:
            return self._full.invoke(*inputs)
        finally:
            self._local_s += time.perf_counter() - t
            if self._spans is not None:
                w_end = time.time()
                self._busy.append((w, w_end, "local"))
                self._span("local (full model)", "EdgeLocal", w, w_end)

    def _interp_for(self, k: int) -> Interpreter:
        it = self._interp.get(k)
        if it is None:
            it = self._interp[k] = Interpreter(self.split.cuts[k].model, remote=self._remote(k))
        return it

    def _remote(self, k: int):
        """The interpreter's callback for cut k's RemotePart: one Infer call over the (emulated) link."""
        def call(part: RemoteInfo, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
            t_call, c_call, w_call = time.perf_counter(), time.thread_time(), time.time()
            ok = False
            try:
                outs = self._call_part(k, part, arrays)
                ok = True
                return outs
            finally:
                self._remote_s += time.perf_counter() - t_call
                self._remote_cpu_s += time.thread_time() - c_call
                if self._spans is not None:
                    w_end = time.time()
                    self._busy.append((w_call, w_end, "call"))
                    if not ok:
                        self._span(f"call to {part.name} failed", "OffloadFailed", w_call, w_end)
        return call

    def _call_part(self, k: int, part: RemoteInfo, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        """One Infer call for cut k's RemotePart over the (emulated) link."""
        cut = self.split.cuts[k]
        self._connect()
        pb = self._pb
        if self.rtt_s is None or self._since_ping >= self.ping_every:
            self._ping()
        self._since_ping += 1
        nbytes_up = sum(a.nbytes for a in arrays)
        tracing = self._spans is not None
        w_enc = time.time() if tracing else 0.0
        req = pb.InferRequest(part=cut.cloud_part, request_id=uuid.uuid4().hex[:16], trace=tracing)
        for n, a in zip(cut.inputs, arrays):
            _encode(req.inputs.add(name=n), a)
        t0 = time.perf_counter()
        w_up = time.time() if tracing else 0.0
        self._sleep_link(nbytes_up)
        t_send = time.time() if tracing else 0.0
        resp = self._call("Infer", req)
        if tracing:
            self._trace_call(cut.cloud_part, resp, w_enc, w_up, t_send, time.time(), nbytes_up)
        self._server_s += (resp.queue_ms + resp.compute_ms) / 1e3
        self._compute_s += resp.compute_ms / 1e3
        if len(resp.outputs) != len(cut.outputs):
            raise CloudError(f"part '{cut.cloud_part}': the service returned {len(resp.outputs)} outputs, "
                             f"expected {len(cut.outputs)}")
        shapes = self._interp[k].remote_shapes
        outs = [_decode(nt, n, cut.model.tensors[i].dtype, shapes[i])
                for nt, n, i in zip(resp.outputs, cut.outputs, part.outputs)]
        nbytes_down = sum(o.nbytes for o in outs)
        self._up_bytes += nbytes_up
        self._down_bytes += nbytes_down
        w_down = time.time() if tracing else 0.0
        self._sleep_link(nbytes_down)
        if tracing:
            w_end = time.time()
            if self.link is not None:
                self._span(f"link down ({nbytes_down} bytes)", "LinkDown", w_down, w_end, LINK_TRACK, nbytes_down,
                           self._trace_call_i)
            self._span(f"receive {cut.cloud_part}", "OffloadRecv", self._t_recv, w_end, nbytes=nbytes_down,
                       call=self._trace_call_i)
        self._measure(time.perf_counter() - t0 - (resp.queue_ms + resp.compute_ms) / 1e3, nbytes_up + nbytes_down)
        return outs

    # ---- the link and the estimate ------------------------------------------------------------------
    def _remaining(self) -> float:
        return self._deadline_at - time.perf_counter()

    def _sleep_link(self, nbytes: int) -> None:
        if self.link is None:
            return
        need = self.link.transfer_time(nbytes)
        left = self._remaining()
        if need > left:
            time.sleep(max(left, 0.0))
            raise _Miss(f"deadline of {self.deadline_s * 1e3:g} ms passed on the link ({nbytes} bytes at "
                        f"{self.link.bandwidth_bps / 1e6:g} Mbit/s)")
        time.sleep(need)

    def _ping(self) -> None:
        """One small call (Describe): its time is the round trip. The estimate is the least of the
        last few pings: delays on a loaded machine only ever add to a round trip."""
        t0, w0 = time.perf_counter(), time.time()
        self._sleep_link(0)
        self._call("Describe", self._pb.DescribeRequest())
        self._sleep_link(0)
        self._rtts.append(time.perf_counter() - t0)
        if self._spans is not None:
            self._span("ping (Describe)", "OffloadPing", w0, time.time())
        self.counts["pings"] += 1
        self._since_ping = 0
        self.rtt_s = min(self._rtts)

    def _measure(self, net_s: float, nbytes: int) -> None:
        """A call's time on the wire (its total less the server's time) is rtt + bits / bandwidth +
        delays, the rtt being the least of the recent pings. Delays (a loaded machine, the RPC's
        own cost beyond a ping's) only ever add, so each call's bits / (time - rtt) is a lower
        bound of the bandwidth, and the estimate is the largest of the last `window` of them. A
        transfer shorter than `resolution_s` cannot be told from jitter: it shows only that the
        bandwidth is at least bits / resolution_s."""
        transfer = max(net_s - (self.rtt_s or 0.0), self.resolution_s)
        self._samples.append(nbytes * 8.0 / transfer)
        self.bandwidth_bps = max(self._samples)
        if not self.adapt:
            return
        c = self.split.cuts[self.cut]
        if self.bandwidth_bps < c.min_bandwidth_bps / (1 + self.hysteresis) or self.bandwidth_bps >= c.max_bandwidth_bps * (1 + self.hysteresis):
            self._switch(self.split.cut_for(self.bandwidth_bps))

    def _switch(self, k: int) -> None:
        if k != self.cut:
            self.cut = k
            self.counts["switches"] += 1

    # ---- tracing -----------------------------------------------------------------------------------------
    def _span(self, node: str, op: str, a: float, b: float, device: str = "", nbytes: int = 0,
              call: int = -1) -> None:
        """A client span from wall-clock instants a..b, on the request's timeline."""
        self._spans.append(TraceSpan(node, op, device or EDGE_TRACK, LINK_THREAD if device == LINK_TRACK else
                                     _thread(), (a - self._trace_w0) * 1e6, (max(a, b) - self._trace_w0) * 1e6,
                                     int(nbytes), call))

    def _trace_call(self, part: str, resp, w_enc: float, w_up: float, t_send: float, t_recv: float,
                    nbytes_up: int) -> None:
        """The spans of one Infer: the send (encode + link up), the call, and the service's spans,
        decoded strictly and placed inside the call; a bad trace is counted and dropped."""
        call = sum(1 for e in self._spans if e.op == "OffloadCall")
        self._t_recv, self._trace_call_i = t_recv, call
        self._span(f"send {part} ({nbytes_up} bytes)", "OffloadSend", w_enc, t_send, nbytes=nbytes_up, call=call)
        if self.link is not None:
            self._span(f"link up ({nbytes_up} bytes)", "LinkUp", w_up, t_send, LINK_TRACK, nbytes_up, call)
        self._span(f"Infer {part}", "OffloadCall", t_send, t_recv, call=call)
        try:
            if not resp.HasField("trace"):
                raise TraceError(f"service trace of part '{part}': the answer carries no trace "
                                 "(a service that does not trace?)")
            spans, shift = decode_service_trace(resp.trace, t_send, t_recv, where=f"service trace of part '{part}'")
        except Exception as e:  # a trace must never break the request: its answer is still used
            self.counts["trace_errors"] += 1
            self.last_trace_error = str(e) if isinstance(e, TraceError) else f"{type(e).__name__}: {e}"
            return
        base = (t_send - self._trace_w0) * 1e6
        for e in spans:
            e.start_us += base
            e.end_us += base
            e.call = call
        self._spans.extend(spans)
        self._trace_shift_s = shift

    def _finish_trace(self, cut: str, w0: float, w_done: float, w_final: float) -> None:
        """The request's edge compute (the gaps between its remote calls, per edge part), the
        emulated edge's sleep and the whole request, then `last["trace"]`."""
        busy = sorted(self._busy)
        calls = [(a, b) for a, b, kind in busy if kind == "call"]
        if calls:
            bounds, t = [], w0
            for a, b, kind in busy:
                if kind == "local":  # a fallback: the cut's later edge parts never ran
                    break
                bounds.append((t, a))
                t = b
            else:
                bounds.append((t, w_done))
            for i, (a, b) in enumerate(bounds):
                if b > a:
                    self._span(f"edge:{cut}/part{i}", "EdgeCompute", a, b)
        if w_final > w_done and self.edge_slowdown > 1.0:
            self._span(f"emulated edge (x{self.edge_slowdown:g})", "EdgeSlowdown", w_done, w_final)
        self._span(f"request ({self.last.get('mode')}, cut {cut})", "EdgeRequest", w0, w_final)
        self._spans.sort(key=lambda e: (e.start_us, -e.end_us))
        self.last.update(trace=self._spans, trace_origin_s=w0, trace_shift_s=self._trace_shift_s)
        self._spans = None

    def chrome_trace(self) -> Dict:
        """The latest traced request as Chrome trace-event JSON (core/trace.py's format): a process
        per device (edge, the service's track, the emulated link), flow arrows from each send to
        the service's decode and from its encode to the client's receive."""
        events = self.last.get("trace")
        if events is None:
            raise ValueError("no traced request yet: make the client with trace=True and invoke it")
        return chrome_trace(events, self.last.get("trace_origin_s"))

    def write_chrome_trace(self, path: str) -> str:
        """chrome_trace() written to `path` as JSON (atomically); returns the path."""
        data = self.chrome_trace()
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
        return path

    # ---- gRPC --------------------------------------------------------------------------------------------
    def _connect(self) -> None:
        """A channel to the service. After UNAVAILABLE the channel is replaced when the client's
        backoff ends: a fresh one connects at once, where the old one would wait out gRPC's own
        reconnect backoff (up to a second) after the server came back."""
        if self._stub is not None and not self._stale:
            return
        if self._channel is not None:
            self._channel.close()
        self._stale = False
        import grpc  # noqa: F401  (only a client that talks to the cloud needs grpc)
        from isthmus.proto import offload_pb2, offload_pb2_grpc
        from isthmus.wire.security import make_channel
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
                   ("grpc.max_reconnect_backoff_ms", 1000), ("grpc.enable_retries", 0),
                   ("grpc.use_local_subchannel_pool", 1)]  # a new channel must not inherit a failed connection
        self._pb = offload_pb2
        self._channel = make_channel(self.address, self.security, options)
        self._stub = offload_pb2_grpc.OffloadStub(self._channel)
        self.counts["connects"] += 1

    def _call(self, method: str, request):
        import grpc
        left = self._remaining()
        if left <= 0:
            raise _Miss(f"deadline of {self.deadline_s * 1e3:g} ms passed before the {method} call")
        try:
            return getattr(self._stub, method)(request, timeout=left)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise _Miss(f"{method}: the service missed the {self.deadline_s * 1e3:g} ms deadline") from None
            if code == grpc.StatusCode.UNAVAILABLE:
                self.counts["unavailable"] += 1
                self._stale = True
            else:
                self.counts["errors"] += 1
            details = e.details() if hasattr(e, "details") else str(e)
            raise CloudError(f"{method} to {self.address}: {getattr(code, 'name', code)}: {details}") from None


__all__ = ["OffloadClient", "EmulatedLink", "SplitModel", "Cut", "load_split", "CloudError", "emulated_kernel_seconds",
           "TraceSpan", "TraceError", "decode_service_trace", "chrome_trace"]
