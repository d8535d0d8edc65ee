"""Traced steps across processes: a part's node events (core/trace.py) as a StepTrace message
(proto/worker.proto), and back.

A StepTrace crosses a process boundary (worker -> master -> client), so decoding trusts
nothing: wire/trace_events.py checks the count, every string and number; here the fields that
only core's events have (groups, Send/Recv keys) are checked too. A bad payload raises
TraceDecodeError naming the event and the field; the step's outputs are not affected by a trace
(the caller decides whether to fail the step).
"""
from __future__ import annotations

from typing import Optional

from ..core.trace import NodeEvent, RunMetadata
from ..proto import worker_pb2
from ..wire.trace_events import MAX_STEP_EVENTS, MAX_TRACE_EVENTS, TraceDecodeError, check_event, check_trace


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
    check_trace(st, where, max_events)
    n, origin = len(st.events), st.origin_s
    md = RunMetadata(origin_s=origin if n else None)
    for i, e in enumerate(st.events):
        md.events.append(_event(e, f"{where}: trace event {i}"))
    return md


def _event(e, where: str) -> NodeEvent:
    check_event(e, where)
    where = f"{where} ('{e.node[:200]}')"
    if e.groups < 1:
        raise TraceDecodeError(f"{where}: field 'groups' is {e.groups}; expected >= 1")
    if e.key and (e.op not in ("Send", "Recv") or e.key.count(";") < 2):
        raise TraceDecodeError(f"{where}: field 'key' {e.key[:80]!r} is not a Send/Recv key 'src;dst;tensor'")
    return NodeEvent(e.node, e.op, e.device, int(e.thread), float(e.start_us), float(e.end_us), int(e.bytes_out),
                     float(e.flops), float(e.bytes_moved), int(e.groups), e.key, int(e.transfer_bytes), int(e.step))


__all__ = ["encode", "decode", "TraceDecodeError", "MAX_TRACE_EVENTS", "MAX_STEP_EVENTS"]
