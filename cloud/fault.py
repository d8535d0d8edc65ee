"""Finding the task that failed, and bringing it back.

When a step fails because a task went away (SIGKILL, a lost machine), the error the
client sees may come from any task that talked to it. `failed_tasks` asks every task of
the cluster directly (the standard gRPC health check, with a short deadline), so the
report names the task that is gone, not the one that noticed. `TaskFailure` is that
report; replica training (cloud/replicas.py) restarts the named tasks through a
`restart(job, index)` callback (LocalCluster.restart here, a scheduler elsewhere) and
resumes from the latest valid checkpoint.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional, Sequence

import grpc

from ..core.rendezvous import RendezvousTimeout
from ..wire.security import ClientSecurity, make_channel
from .cluster import ClusterSpec, TaskId
from .errors import HandleNotFound, TaskUnavailable, WorkerError

PROBE_TIMEOUT_S = 2.0


class TaskFailure(WorkerError):
    """One or more tasks of the cluster stopped answering; `tasks` names them."""

    def __init__(self, message: str, tasks: Sequence[TaskId] = (), cause: Optional[BaseException] = None):
        super().__init__(message)
        self.tasks = list(tasks)
        self.cause = cause


def is_task_loss(e: BaseException) -> bool:
    """An error a lost or restarted task explains (unreachable, forgot a handle, a step that
    timed out waiting on it), as opposed to a failing op, which would fail again."""
    seen = 0
    while e is not None and seen < 32:
        if isinstance(e, (TaskUnavailable, HandleNotFound, RendezvousTimeout, TaskFailure, TimeoutError)):
            return True
        e, seen = (e.__cause__ or e.__context__), seen + 1
    return False


def probe(address: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True when the task at `address` answers the gRPC health check with SERVING."""
    # deferred: grpcio-health-checking is optional at run time (server.py serves without it)
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    try:
        with make_channel(address, ClientSecurity.from_env()) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
            return r.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def failed_tasks(cluster: ClusterSpec, timeout: float = PROBE_TIMEOUT_S) -> List[TaskId]:
    """The tasks that do not answer a health check within `timeout` (all probed at once)."""
    tasks = list(cluster.tasks())
    with ThreadPoolExecutor(max_workers=max(1, len(tasks))) as pool:
        ok = list(pool.map(lambda ta: probe(ta[1], timeout), tasks))
    return [t for (t, _), up in zip(tasks, ok) if not up]


def diagnose(error: BaseException, cluster: ClusterSpec, timeout: float = PROBE_TIMEOUT_S) -> TaskFailure:
    """A TaskFailure naming the tasks that are down (with their addresses) and the error seen."""
    down = failed_tasks(cluster, timeout)
    if down:
        names = ", ".join(f"{t} at {cluster.address(t.job, t.index)}" for t in down)
        msg = f"task{'s' if len(down) > 1 else ''} {names} stopped answering (health check); " \
              f"the step failed with {type(error).__name__}: {error}"
    else:
        msg = f"every task answers its health check, but the step failed with {type(error).__name__}: {error}"
    return TaskFailure(msg, down, error)


def wait_until(fn: Callable[[], object], timeout: float, what: str, interval: float = 0.2):
    """fn() until it stops raising a task-loss error (a task coming back: reconnects are not
    instant), at most `timeout` seconds; then the last error."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            if not is_task_loss(e) or time.monotonic() > deadline:
                raise TaskFailure(f"{what} did not succeed within {timeout:g} s: {type(e).__name__}: {e}",
                                  cause=e) from e
        time.sleep(interval)
