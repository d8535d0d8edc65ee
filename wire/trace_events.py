"""The checks a trace (a StepTrace, proto/worker.proto) passes when it crosses a process boundary.

cloud/tracing.py (worker -> master -> client) and edge/offload_trace.py (the offload service's spans
for an edge client) both decode StepTraces from another process, and trust nothing: the event count
and every string are bounded, every number must be finite and in range, and an event's end may not
precede its start. A bad payload raises TraceDecodeError naming the event and the field.
"""
from __future__ import annotations

import math

MAX_TRACE_EVENTS = 200_000     # one step of one part; a bigger trace is refused, not truncated
MAX_STEP_EVENTS = 1_000_000    # one step of all parts (the master's merged trace)
MAX_NAME_CHARS = 4096          # node names, ops, devices, keys
MAX_US = 1e13                  # ~4 months of microseconds from the origin, either way
MAX_COUNT = 1 << 53            # bytes and flops stay exact in float64 / JSON


class TraceDecodeError(ValueError):
    """A StepTrace that is not a well-formed trace (from a process that is broken or hostile)."""


def check_trace(st, where: str, max_events: int = MAX_TRACE_EVENTS) -> None:
    """The event count and the origin of a StepTrace, before any event is read."""
    n = len(st.events)
    if n > max_events:
        raise TraceDecodeError(f"{where}: {n} trace events; at most {max_events} are accepted")
    origin = st.origin_s
    if not math.isfinite(origin) or not 0.0 <= origin < 1e11:
        raise TraceDecodeError(f"{where}: origin_s {origin!r} is not a Unix time in seconds")


def check_event(e, where: str) -> None:
    """One TraceEvent's strings, times and counts (`where` names the event in messages)."""
    for f in ("node", "op", "device", "key"):
        v = getattr(e, f)
        if len(v) > MAX_NAME_CHARS:
            raise TraceDecodeError(f"{where}: field '{f}' is {len(v)} characters (at most {MAX_NAME_CHARS})")
    for f in ("node", "op", "device"):
        if not getattr(e, f):
            raise TraceDecodeError(f"{where}: field '{f}' is empty")
    where = f"{where} ('{e.node[:200]}')"
    for f in ("start_us", "end_us"):
        v = getattr(e, f)
        if not math.isfinite(v) or abs(v) > MAX_US:
            raise TraceDecodeError(f"{where}: field '{f}' is {v!r}, not a time in microseconds")
    if e.end_us < e.start_us:
        raise TraceDecodeError(f"{where}: ends ({e.end_us:g} us) before it starts ({e.start_us:g} us)")
    for f in ("flops", "bytes_moved"):
        v = getattr(e, f)
        if not math.isfinite(v) or not 0.0 <= v <= MAX_COUNT:
            raise TraceDecodeError(f"{where}: field '{f}' is {v!r}; expected a finite count >= 0")
    for f in ("bytes_out", "transfer_bytes", "thread"):
        v = getattr(e, f)
        if not 0 <= v <= MAX_COUNT:
            raise TraceDecodeError(f"{where}: field '{f}' is {v}; expected 0 .. 2^53")


__all__ = ["TraceDecodeError", "check_trace", "check_event", "MAX_TRACE_EVENTS", "MAX_STEP_EVENTS",
           "MAX_NAME_CHARS"]
