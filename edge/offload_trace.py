"""Tracing an offload client's requests: the service's spans (a StepTrace in InferResponse.trace)
decoded strictly (wire/trace_events.py's checks; a bad trace is counted and dropped, the answer is
still used), placed on the request's wall-clock timeline beside the client's own spans (edge compute
per edge part, the emulated link up/down, the call, a local run), and exported as Chrome trace-event
JSON as core/trace.py does, with flow arrows from the client's send to the service's decode and from
its encode to the client's receive. If the service's spans do not fit inside the call (clock skew
between machines), they are shifted so that their middle sits at the call's middle.
"""
from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..wire.trace_events import MAX_TRACE_EVENTS, TraceDecodeError, check_event, check_trace

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


class RequestTracing:
    """The tracing half of OffloadClient (a mixin: it reads the client's request state). When a
    request is traced, `_spans` is a list; `last["trace"]` holds the finished request's spans."""
    _spans: Optional[List[TraceSpan]] = None

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


__all__ = ["TraceSpan", "TraceError", "decode_service_trace", "chrome_trace", "RequestTracing", "EDGE_TRACK",
           "LINK_TRACK"]
