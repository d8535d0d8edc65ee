"""Errors across processes: a failure on a task reaches the caller as the same error.

A servicer turns an exception into a gRPC status (a code that says what kind of failure
it is) plus trailing metadata naming its type, message, node and op; the client turns
that back into the same isthmus error class with the same message (and node name), so a
client of a distributed session sees what a local Session would have raised, with the
task it happened on. An error raised only because another part aborted the step keeps
its identity (RendezvousAborted), so the step's driver can report the original one.
"""
from __future__ import annotations

import json
from typing import Optional, Tuple

import grpc

from ..core import errors as core_errors
from ..core.errors import IsthmusError
from ..core.rendezvous import RendezvousAborted, RendezvousError, RendezvousTimeout
from ..wire.tensor_codec import TensorCodecError

_META_KEY = "isthmus-error-bin"


class WorkerError(IsthmusError, RuntimeError):
    """A cloud call failed: unknown handle, bad request, an unreachable or failing task."""


class TaskUnavailable(WorkerError):
    """A task could not be reached (down, or not listening at its address)."""


class HandleNotFound(WorkerError):
    """A graph or session handle the task does not know (it may have restarted)."""


class TooManyWaiting(WorkerError):
    """A waiting call (RecvTensor) past the task's per-peer or total bound (cloud/limits.py)."""


class PermissionDenied(WorkerError):
    """The caller's token does not allow this (a client token writing variables, say)."""


# types a client rebuilds by name: (class, gRPC code the servicer answers with)
_KNOWN = {
    "ExecutionError": (core_errors.ExecutionError, grpc.StatusCode.INTERNAL),
    "FeedError": (core_errors.FeedError, grpc.StatusCode.INVALID_ARGUMENT),
    "GraphError": (core_errors.GraphError, grpc.StatusCode.INVALID_ARGUMENT),
    "ShapeError": (core_errors.ShapeError, grpc.StatusCode.INVALID_ARGUMENT),
    "CheckpointError": (core_errors.CheckpointError, grpc.StatusCode.FAILED_PRECONDITION),
    "TensorCodecError": (TensorCodecError, grpc.StatusCode.INVALID_ARGUMENT),
    "RendezvousAborted": (RendezvousAborted, grpc.StatusCode.ABORTED),
    "RendezvousTimeout": (RendezvousTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    "RendezvousError": (RendezvousError, grpc.StatusCode.INTERNAL),
    "HandleNotFound": (HandleNotFound, grpc.StatusCode.NOT_FOUND),
    "PermissionDenied": (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    "TooManyWaiting": (TooManyWaiting, grpc.StatusCode.RESOURCE_EXHAUSTED),
    "TaskUnavailable": (TaskUnavailable, grpc.StatusCode.UNAVAILABLE),
    "WorkerError": (WorkerError, grpc.StatusCode.INVALID_ARGUMENT),
}


def caused_by_abort(e: Optional[BaseException]) -> bool:
    """True for an error raised only because the step was aborted elsewhere."""
    seen = 0
    while e is not None and seen < 64:
        if isinstance(e, RendezvousAborted):
            return True
        e, seen = e.__cause__, seen + 1
    return False


def _kind(e: BaseException) -> str:
    if caused_by_abort(e):
        return "RendezvousAborted"
    for cls in type(e).__mro__:
        if cls.__name__ in _KNOWN and _KNOWN[cls.__name__][0] is cls:
            return cls.__name__
    for cls in type(e).__mro__:  # a subclass from elsewhere (GraphCodecError is a ValueError)
        if cls.__name__ in ("ValueError", "TypeError", "KeyError"):
            return "WorkerError"
    return "ExecutionError"


def abort_with(context, e: BaseException, task: str) -> None:
    """End an RPC with the status and metadata that `from_rpc_error` rebuilds `e` from."""
    kind = _kind(e)
    code = _KNOWN[kind][1]
    info = {"type": kind, "message": str(e), "task": task,
            "node": getattr(e, "node_name", None), "op": getattr(e, "op", None), "raised": type(e).__name__}
    context.set_trailing_metadata(((_META_KEY, json.dumps(info).encode("utf-8")),))
    context.abort(code, f"{task}: {type(e).__name__}: {e}")


def remote_info(e: grpc.RpcError) -> Optional[dict]:
    try:
        for k, v in e.trailing_metadata() or ():
            if k == _META_KEY:
                info = json.loads(v.decode("utf-8") if isinstance(v, bytes) else v)
                return info if isinstance(info, dict) else None
    except Exception:  # noqa: BLE001  (a malformed trailer: fall back to the status)
        return None
    return None


def from_rpc_error(e: grpc.RpcError, rpc: str, task: str, address: str) -> BaseException:
    """The exception to raise for a failed call of `rpc` on `task`."""
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    info = remote_info(e)
    if info is not None and info.get("type") in _KNOWN:
        cls = _KNOWN[info["type"]][0]
        msg = f"{info.get('message', details)} [on {info.get('task') or task}]"
        if cls is core_errors.ExecutionError:
            return cls(msg, info.get("node"), info.get("op"))
        return cls(msg)
    if code == grpc.StatusCode.UNAVAILABLE:
        return TaskUnavailable(f"task {task} at {address} is unreachable ({rpc}): {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RendezvousTimeout(f"{rpc} on task {task} at {address} passed its deadline: {details}")
    return WorkerError(f"{rpc} on task {task} at {address} failed [{code.name if code else '?'}]: {details}")


def split_status(e: BaseException) -> Tuple[str, str]:
    """(kind, message) of an error, as a servicer would report it."""
    return _kind(e), str(e)
