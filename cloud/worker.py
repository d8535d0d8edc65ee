"""The worker task: holds registered subgraphs (partition parts), runs them for a step id,
and serves the tensors their Sends produced through a rendezvous keyed by
(source device, destination device, tensor, step).

`Worker` is the in-process object (tested without a network); `WorkerServicer` puts it
behind gRPC (proto/worker.proto) and `WorkerClient` calls it with a deadline on every
RPC. A Recv whose source device lives on another task pulls the tensor from that task
(`peers(device)` gives its Worker or WorkerClient); tensors stream in chunks.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..core.devices import canonical
from ..core.rendezvous import RendezvousAborted, RendezvousError, RendezvousTimeout
from ..core.session import Session
from . import graph_codec, tensor_codec

DEFAULT_RECV_TIMEOUT_S = 30.0
DEFAULT_RPC_TIMEOUT_S = 30.0
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20   # one gRPC message; bigger tensors must stream
DEFAULT_CHUNK_BYTES = 4 << 20           # tensors above this stream in chunks of this size

Key = Tuple[str, str, str, int]  # (src device, dst device, tensor, step id)


class WorkerError(RuntimeError):
    """A worker call failed: unknown handle, a failing step, an unreachable task."""


class StepRendezvous:
    """Values in flight, keyed by (src device, dst device, tensor, step id); every wait bounded."""

    def __init__(self, timeout: float = DEFAULT_RECV_TIMEOUT_S):
        self.timeout = float(timeout)
        self._values: Dict[Key, Any] = {}
        self._aborted: Dict[int, BaseException] = {}
        self._cond = threading.Condition()

    def put(self, key: Key, value: Any) -> None:
        with self._cond:
            if key[3] in self._aborted:
                raise RendezvousAborted(f"step {key[3]} was aborted: {self._aborted[key[3]]}")
            if key in self._values:
                raise RendezvousError(f"tensor {_show(key)} was sent twice")
            self._values[key] = value
            self._cond.notify_all()

    def take(self, key: Key, timeout: Optional[float] = None) -> Any:
        timeout = self.timeout if timeout is None or timeout <= 0 else float(timeout)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                err = self._aborted.get(key[3])
                if err is not None:
                    raise RendezvousAborted(f"step {key[3]} was aborted while waiting for {_show(key)}: "
                                            f"{type(err).__name__}: {err}") from err
                if key in self._values:
                    return self._values.pop(key)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RendezvousTimeout(f"nothing arrived for {_show(key)} within {timeout:g} s")
                self._cond.wait(left)

    def abort_step(self, step_id: int, error: BaseException) -> None:
        with self._cond:
            self._aborted.setdefault(step_id, error)
            for k in [k for k in self._values if k[3] == step_id]:
                del self._values[k]
            self._cond.notify_all()

    def forget_step(self, step_id: int) -> None:
        with self._cond:
            self._aborted.pop(step_id, None)
            for k in [k for k in self._values if k[3] == step_id]:
                del self._values[k]

    def pending(self) -> List[Key]:
        with self._cond:
            return list(self._values)


def _show(key: Key) -> str:
    return f"'{key[2]}' from {key[0]} to {key[1]} (step {key[3]})"


class _PartRendezvous:
    """The rendezvous one registered part's Session sees: core's Send/Recv kernels key by
    (transfer key, invocation count); this maps them to (src, dst, tensor, step id)."""

    def __init__(self, worker: "Worker"):
        self.worker = worker
        self.step_id = 0
        self.timeout = worker.recv_timeout

    @staticmethod
    def _split(key: Hashable) -> Tuple[str, str, str]:
        k = key[0] if isinstance(key, tuple) else key
        parts = str(k).split(";", 2)
        if len(parts) != 3:
            raise RendezvousError(f"malformed transfer key {k!r}; expected 'src;dst;tensor'")
        return parts[0], parts[1], parts[2]

    def send(self, key: Hashable, value: Any) -> None:
        src, dst, tensor = self._split(key)
        self.worker.table.put((src, dst, tensor, self.step_id), value)

    def recv(self, key: Hashable, timeout: Optional[float] = None) -> Any:
        src, dst, tensor = self._split(key)
        return self.worker.fetch(src, dst, tensor, self.step_id, timeout or self.timeout)

    def abort(self, error: BaseException) -> None:
        self.worker.table.abort_step(self.step_id, error)


class _Registered:
    def __init__(self, handle: str, device: str, graph, session: Session, rv: _PartRendezvous):
        self.handle, self.device, self.graph, self.session, self.rv = handle, device, graph, session, rv
        self.lock = threading.Lock()  # one step of a part at a time (core's Send/Recv count per plan)


class Worker:
    """One task's worker service, in process.

    `peers(device) -> Worker | WorkerClient` finds the task holding a device other than
    this task's own, for Recvs whose Send ran there.
    """

    def __init__(self, task: str = "/job:worker/task:0", devices: Optional[Sequence[str]] = None,
                 peers: Optional[Callable[[str], Any]] = None, recv_timeout: float = DEFAULT_RECV_TIMEOUT_S,
                 max_tensor_bytes: int = tensor_codec.DEFAULT_MAX_BYTES):
        self.task = canonical(task)
        self.devices = [canonical(d) for d in (devices or [self.task + "/device:CPU:0"])]
        self.peers = peers
        self.recv_timeout = recv_timeout
        self.max_tensor_bytes = max_tensor_bytes
        self.table = StepRendezvous(recv_timeout)
        self._graphs: Dict[str, _Registered] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.steps_run = 0

    # ---- the service --------------------------------------------------------------------
    def register_graph(self, graph_def, device: Optional[str] = None) -> str:
        """Register a serialized (or GraphDef) part; returns its handle."""
        try:
            graph = graph_codec.decode(graph_def, max_bytes=self.max_tensor_bytes)
        except graph_codec.GraphCodecError as e:
            raise WorkerError(f"{self.task}: cannot register graph: {e}") from None
        dev = canonical(device) if device else self.devices[0]
        if dev not in self.devices:
            raise WorkerError(f"{self.task}: device {dev} is not one of this task's {self.devices}")
        rv = _PartRendezvous(self)
        with self._lock:
            handle = f"{self.task}/graph:{next(self._ids)}"
            self._graphs[handle] = _Registered(handle, dev, graph, Session(graph, rendezvous=rv), rv)
        return handle

    def _get(self, handle: str) -> _Registered:
        try:
            return self._graphs[handle]
        except KeyError:
            raise WorkerError(f"{self.task}: no registered graph {handle!r}") from None

    def run_graph(self, handle: str, step_id: int, feeds: Optional[Mapping[str, Any]] = None,
                  fetches: Sequence[str] = (), timeout: Optional[float] = None) -> List[Optional[np.ndarray]]:
        """Run one step of a registered part: the fetched tensors' values (None for node fetches).

        A failure aborts the step in this task's rendezvous (its waiting Recvs wake) and
        is raised with the failing node's name, as the Session reports it.
        """
        reg = self._get(handle)
        g = reg.graph
        try:
            fd = {g.tensor(k): v for k, v in (feeds or {}).items()}
            fl = [g.tensor(f) if ":" in f else g.node(f) for f in fetches]
        except Exception as e:  # noqa: BLE001  (GraphError naming the missing node)
            raise WorkerError(f"{self.task}: {e}") from None
        with reg.lock:
            reg.rv.step_id = int(step_id)
            if timeout:
                reg.rv.timeout = float(timeout)
            try:
                out = reg.session.run(fl, fd) if fl else []
            except BaseException as e:
                self.table.abort_step(int(step_id), e)
                raise
            finally:
                reg.rv.timeout = self.recv_timeout
            self.steps_run += 1
        return [None if not hasattr(v, "dtype") else np.asarray(v) for v in out]

    def recv_tensor(self, src_device: str, dst_device: str, tensor: str, step_id: int,
                    timeout: Optional[float] = None) -> np.ndarray:
        """Take the value a Send on this task deposited for (src, dst, tensor, step)."""
        return self.table.take((src_device, dst_device, tensor, int(step_id)), timeout)

    def fetch(self, src: str, dst: str, tensor: str, step_id: int, timeout: Optional[float] = None):
        """What a Recv here calls: local when the Send ran on this task, else pulled from its task."""
        if src in self.devices or self.peers is None:
            return self.recv_tensor(src, dst, tensor, step_id, timeout)
        peer = self.peers(src)
        if peer is None:
            raise WorkerError(f"{self.task}: no task holds device {src}")
        return peer.recv_tensor(src, dst, tensor, step_id, timeout)

    def abort_step(self, step_id: int, error: BaseException) -> None:
        self.table.abort_step(step_id, error)

    def deregister_graph(self, handle: str) -> None:
        with self._lock:
            reg = self._graphs.pop(handle, None)
        if reg is None:
            raise WorkerError(f"{self.task}: no registered graph {handle!r}")
        reg.session.close()

    def status(self) -> Dict[str, Any]:
        return {"task": self.task, "devices": list(self.devices), "handles": sorted(self._graphs),
                "steps_run": self.steps_run, "pending_tensors": len(self.table.pending())}
