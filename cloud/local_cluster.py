"""A cluster of tasks on this machine, each a subprocess on a free 127.0.0.1 port.

    with LocalCluster({"ps": 1, "worker": 2}) as c:
        sess = DistributedSession(graph, c.target)

For tests, examples and the demo (the default cluster of a user who has none). Ports are
free by construction, not by guess: each task binds port 0, reports the port it got, and
only then learns the whole cluster (on its stdin). A task exits when its stdin closes, so
tasks never outlive the process that started them. Every wait has a timeout; `kill`
(SIGKILL) and `restart` (same port) exist for fault-tolerance tests. The tasks pass big
tensors to each other through shared memory (cloud/shm.py) unless `shm_enabled=False`; a
task's leftover segments are unlinked once it has exited, however it ended.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Mapping, Optional, Tuple

import grpc

from ..wire.security import ClientSecurity, make_channel
from . import shm
from .cluster import ClusterSpec, TaskId

START_TIMEOUT_S = 60.0


class LocalClusterError(RuntimeError):
    """A local task failed to start, or died."""


class _Task:
    def __init__(self, tid: TaskId, args: List[str], env: Dict[str, str]):
        self.tid = tid
        self.proc = subprocess.Popen([sys.executable, "-m", "isthmus.cloud.server", *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, start_new_session=True)
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.stderr: List[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, None), daemon=True).start()

    def _pump(self, stream, q) -> None:
        for line in stream:
            if q is not None:
                q.put(line.rstrip("\n"))
            else:
                self.stderr.append(line)
                del self.stderr[:-50]
        if q is not None:
            q.put(None)

    def expect(self, prefix: str, deadline: float) -> str:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LocalClusterError(f"task {self.tid} said nothing starting {prefix!r} in time; "
                                        f"stderr: {''.join(self.stderr)[-2000:]}")
            try:
                line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(5)
                raise LocalClusterError(f"task {self.tid} exited (code {self.proc.returncode}) before "
                                        f"{prefix!r}; stderr: {''.join(self.stderr)[-2000:]}")
            if line.startswith(prefix):
                return line[len(prefix):].strip()

    def send(self, text: str) -> None:
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        """Ask the task to stop (it stops when its stdin closes), without waiting."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.close_stdin()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        for s in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                s.close()
            except (OSError, ValueError):
                pass
        if self.proc.returncode is not None:  # exited (killed, even): its segments are orphans now
            shm.sweep([self.proc.pid])


class LocalCluster:
    """`jobs`: job -> number of tasks (default: one ps and two workers)."""

    def __init__(self, jobs: Optional[Mapping[str, int]] = None, timeout: float = START_TIMEOUT_S,
                 recv_timeout: float = 30.0, extra_args: Tuple[str, ...] = (),
                 shm_enabled: Optional[bool] = None):
        self.jobs = dict(jobs or {"ps": 1, "worker": 2})
        self.timeout = timeout
        self.extra = ["--recv-timeout", str(recv_timeout), *extra_args]
        self.tasks: Dict[TaskId, _Task] = {}
        self.cluster: Optional[ClusterSpec] = None
        self._env = dict(os.environ)
        self._env.pop("TF_CONFIG", None)
        self._env.pop("ISTHMUS_CLUSTER", None)
        if shm_enabled is not None:
            self._env[shm.ENV_VAR] = "1" if shm_enabled else "0"
        self.start()

    def _args(self, tid: TaskId, port: int) -> List[str]:
        return ["--job", tid.job, "--task", str(tid.index), "--bind", "127.0.0.1", "--port", str(port),
                "--cluster-from-stdin", *self.extra]

    def start(self) -> None:
        deadline = time.monotonic() + self.timeout
        try:
            for job, n in self.jobs.items():
                for i in range(n):
                    tid = TaskId(job, i)
                    self.tasks[tid] = _Task(tid, self._args(tid, 0), self._env)
            ports = {tid: int(t.expect("ISTHMUS_PORT", deadline)) for tid, t in self.tasks.items()}
            self.cluster = ClusterSpec({job: [f"127.0.0.1:{ports[TaskId(job, i)]}" for i in range(n)]
                                        for job, n in self.jobs.items()})
            for t in self.tasks.values():
                t.send(self.cluster.to_json())
            for t in self.tasks.values():
                t.expect("ISTHMUS_READY", deadline)
            self.wait_healthy(deadline - time.monotonic())
        except BaseException:
            self.stop()
            raise

    @property
    def target(self) -> str:
        """The address of the default master (worker task 0, else the first task)."""
        job = "worker" if "worker" in self.jobs else next(iter(self.jobs))
        return "grpc://" + self.cluster.address(job, 0)

    def address(self, job: str, index: int) -> str:
        return self.cluster.address(job, index)

    def wait_healthy(self, timeout: float = 10.0) -> None:
        """Every task answers the gRPC health check with SERVING (or raise, naming the task)."""
        # deferred: grpcio-health-checking is optional at run time (server.py serves without it)
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        deadline = time.monotonic() + max(timeout, 0.1)
        security = ClientSecurity.from_env(self._env)
        for tid, addr in self.cluster.tasks():
            with make_channel(addr, security) as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                while True:
                    try:
                        r = stub.Check(health_pb2.HealthCheckRequest(service=""),
                                       timeout=max(0.1, min(2.0, deadline - time.monotonic())))
                        if r.status == health_pb2.HealthCheckResponse.SERVING:
                            break
                    except grpc.RpcError:
                        pass
                    if time.monotonic() > deadline:
                        raise LocalClusterError(f"task {tid} at {addr} is not healthy")
                    time.sleep(0.05)

    # ---- faults ------------------------------------------------------------------------------
    def kill(self, job: str, index: int) -> None:
        """SIGKILL a task (no cleanup, as a machine failure)."""
        t = self.tasks[TaskId(job, index)]
        if t.proc.poll() is None:
            os.kill(t.proc.pid, signal.SIGKILL)
            t.proc.wait(10)
        t.stop()

    def restart(self, job: str, index: int) -> None:
        """Start a killed (or stopped) task again on its old port."""
        tid = TaskId(job, index)
        self.tasks[tid].stop()
        port = int(self.cluster.address(job, index).rsplit(":", 1)[1])
        deadline = time.monotonic() + self.timeout
        while True:  # the old socket may linger for a moment
            t = _Task(tid, self._args(tid, port), self._env)
            try:
                t.expect("ISTHMUS_PORT", deadline)
                break
            except LocalClusterError:
                t.stop()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        t.send(self.cluster.to_json())
        t.expect("ISTHMUS_READY", deadline)
        self.tasks[tid] = t

    def alive(self, job: str, index: int) -> bool:
        return self.tasks[TaskId(job, index)].proc.poll() is None

    def stop(self) -> None:
        for t in self.tasks.values():  # every task winds down at once, then each is waited for
            t.close_stdin()
        for t in self.tasks.values():
            t.stop()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
