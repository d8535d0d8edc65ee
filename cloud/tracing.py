"""Traced steps across processes: a part's node events (core/trace.py) as a StepTrace message
(proto/worker.proto), and back.

A StepTrace crosses a process boundary (worker -> master -> client), so decoding trusts
nothing: the event count and every string are bounded, every number must be finite and in
range, and an event's end may not precede its start. A bad payload raises TraceDecodeError
naming the event and the field; the step's outputs are not affected by a trace (the caller
decides whether to fail the step).
"""
from __future__ import annotations

import math
from typing import Optional

from ..core.trace import NodeEvent, RunMetadata
from ..proto import worker_pb2

MAX_TRACE_EVENTS = 200_000     # one step of one part; a bigger trace is refused, not truncated
MAX_STEP_EVENTS = 1_000_000    # one step of all parts (the master's merged trace)
MAX_NAME_CHARS = 4096          # node names, ops, devices, keys
_MAX_US = 1e13                 # ~4 months of microseconds from the origin, either way
_MAX_COUNT = 1 << 53           # bytes and flops stay exact in float64 / JSON


class TraceDecodeError(ValueError):
    """A StepTrace that is not a well-formed trace (from a task that is broken or hostile)."""


def encode(md: RunMetadata, out: Optional[worker_pb2.StepTrace] = None) -> worker_pb2.StepTrace:
    """`md`'s events as a StepTrace (into `out`, a message field, when given)."""
    st = worker_pb2.StepTrace() if out is None else out
    st.origin_s = md.origin_s if md.origin_s is not None else 0.0
    add = st.events.add
    for e in md.events:
        add(node=e.node, op=e.op, device=e.device, thread=e.thread, start_us=e.start_us, end_us=e.end_us,
            bytes_out=e.bytes_out, flops=e.flops, bytes_moved=e.bytes_moved, groups=e.groups, key=e.key,
            transfer_bytes=e.transfer_bytes, step=e.step)
    return st


def decode(st: worker_pb2.StepTrace, where: str = "trace", max_events: int = MAX_TRACE_EVENTS) -> RunMetadata:
    """A RunMetadata from a StepTrace received from `where` (a task's name, for the messages)."""
    if not isinstance(st, worker_pb2.StepTrace):
        raise TraceDecodeError(f"{where}: expected a StepTrace message, got {type(st).__name__}")
    n = len(st.events)
    if n > max_events:
        raise TraceDecodeError(f"{where}: {n} trace events; at most {max_events} are accepted per step")
    origin = st.origin_s
    if not math.isfinite(origin) or not 0.0 <= origin < 1e11:
        raise TraceDecodeError(f"{where}: origin_s {origin!r} is not a Unix time in seconds")
    md = RunMetadata(origin_s=origin if n else None)
    for i, e in enumerate(st.events):
        md.events.append(_event(e, f"{where}: trace event {i}"))
    return md


def _event(e, where: str) -> NodeEvent:
    for f in ("node", "op", "device", "key"):
        v = getattr(e, f)
        if len(v) > MAX_NAME_CHARS:
            raise TraceDecodeError(f"{where}: field '{f}' is {len(v)} characters (at most {MAX_NAME_CHARS})")
    if not e.node or not e.op or not e.device:
        missing = [f for f in ("node", "op", "device") if not getattr(e, f)]
        raise TraceDecodeError(f"{where}: field '{missing[0]}' is empty")
    where = f"{where} ('{e.node}')"
    for f in ("start_us", "end_us"):
        v = getattr(e, f)
        if not math.isfinite(v) or abs(v) > _MAX_US:
            raise TraceDecodeError(f"{where}: field '{f}' is {v!r}, not a time in microseconds")
    if e.end_us < e.start_us:
        raise TraceDecodeError(f"{where}: ends ({e.end_us:g} us) before it starts ({e.start_us:g} us)")
    for f in ("flops", "bytes_moved"):
        v = getattr(e, f)
        if not math.isfinite(v) or not 0.0 <= v <= _MAX_COUNT:
            raise TraceDecodeError(f"{where}: field '{f}' is {v!r}; expected a finite count >= 0")
    for f in ("bytes_out", "transfer_bytes", "thread"):
        v = getattr(e, f)
        if not 0 <= v <= _MAX_COUNT:
            raise TraceDecodeError(f"{where}: field '{f}' is {v}; expected 0 .. 2^53")
    if e.groups < 1:
        raise TraceDecodeError(f"{where}: field 'groups' is {e.groups}; expected >= 1")
    if e.key and (e.op not in ("Send", "Recv") or e.key.count(";") < 2):
        raise TraceDecodeError(f"{where}: field 'key' {e.key[:80]!r} is not a Send/Recv key 'src;dst;tensor'")
    return NodeEvent(e.node, e.op, e.device, int(e.thread), float(e.start_us), float(e.end_us), int(e.bytes_out),
                     float(e.flops), float(e.bytes_moved), int(e.groups), e.key, int(e.transfer_bytes), int(e.step))


__all__ = ["encode", "decode", "TraceDecodeError", "MAX_TRACE_EVENTS", "MAX_STEP_EVENTS"]
