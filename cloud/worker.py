"""The worker task: holds registered subgraphs (partition parts), runs them for a step id,
and serves the tensors their Sends produced through its rendezvous, keyed by
(source device, destination device, tensor, step).

`Worker` is the in-process object, tested without a network; cloud/rpc.py puts it behind
gRPC. A Recv whose Send ran on another task pulls the value from that task
(`peers(device)` gives its Worker or WorkerClient).

Variables live in the task, not in one registered graph: every part registered here
reads and updates the same variable values (by name), as parameter-server tasks need
when a session registers one part for initialization and another for training, or when
several clients' graphs share the ps task's variables (between-graph replication).
"""
from __future__ import annotations

import itertools
import os
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from ..core.devices import canonical
from ..core.executor import SessionState
from ..core.graph import Graph, Tensor
from ..core.rendezvous import RendezvousAborted
from ..core.session import Session
from ..core.trace import RunMetadata, RunOptions
from ..wire import tensor_codec
from . import graph_codec, recv_layout, shm
from .errors import HandleNotFound, WorkerError
from .rendezvous import DEFAULT_RECV_TIMEOUT_S, Key, PartRendezvous, StepRendezvous, show

DEFAULT_RPC_TIMEOUT_S = 30.0
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20    # one gRPC message; bigger tensors must stream
PREFETCH_MAX = 4   # a part's Recvs from other tasks started together at the start of a step

__all__ = ["Worker", "WorkerError", "HandleNotFound", "StepRendezvous", "DEFAULT_RECV_TIMEOUT_S",
           "DEFAULT_RPC_TIMEOUT_S", "DEFAULT_MAX_MESSAGE_BYTES"]


class _Registered:
    """One registered part. Each step runs on an instance (a Session and the rendezvous
    view that tells its Sends and Recvs the step id) that no other step is using, so steps
    of one part may run concurrently."""

    def __init__(self, handle: str, device: str, graph: Graph, worker: "Worker"):
        self.handle, self.device, self.graph, self.worker = handle, device, graph, worker
        self.pushed: set = set()   # (src, dst, tensor) the master puts in this task's rendezvous itself
        self._remote: Dict[tuple, List[tuple]] = {}   # fetch signature -> its remote Recv keys
        self._free: List[tuple] = []
        self._lock = threading.Lock()

    def acquire(self) -> tuple:
        with self._lock:
            if self._free:
                return self._free.pop()
        w = self.worker
        rv = PartRendezvous(w._deposit, w.fetch, w.abort_step, w.recv_timeout, take=w.recv_tensor, local=self.pushed)
        # serial plans: a part's nodes run in the partitioner's topological order, so no Recv
        # can wait on a Send queued behind it in the same part (no deadlock across tasks)
        sess = Session(self.graph, parallel=False, rendezvous=rv)
        w._share_state(sess.state)
        return sess, rv

    def remote_recvs(self, fetches: Sequence[Any]) -> List[tuple]:
        """The (src, dst, tensor) keys of the Recvs that a step fetching `fetches` runs and
        that another task's Send feeds (not those the master puts here itself)."""
        sig = tuple(f.name if hasattr(f, "name") else str(f) for f in fetches)
        keys = self._remote.get(sig)
        if keys is None:
            keys, seen = [], set()
            stack = [f.node if isinstance(f, Tensor) else f for f in fetches]
            while stack:
                n = stack.pop()
                if n.name in seen:
                    continue
                seen.add(n.name)
                if n.op == "Recv":
                    src, dst, tensor = PartRendezvous.split(n.attrs["key"])
                    if src not in self.worker.devices and (src, dst, tensor) not in self.pushed:
                        keys.append((src, dst, tensor))
                stack.extend(t.node for t in n.inputs)
                stack.extend(n.control_inputs)
            if len(self._remote) > 64:
                self._remote.clear()
            self._remote[sig] = keys
        return keys

    def release(self, inst: tuple) -> None:
        with self._lock:
            self._free.append(inst)

    def close(self) -> None:
        with self._lock:
            for sess, _ in self._free:
                sess.close()
            self._free.clear()


class Worker:
    """One task's worker service, in process.

    `peers(device) -> Worker | WorkerClient` finds the task holding a device other than
    this task's own, for Recvs whose Send ran there. With `wire=True` (a task served over
    gRPC) a value sent to another task is laid out as its RecvTensor messages when the Send
    runs, so serving it copies nothing more (cloud/recv_layout.py); when the destination's task
    has shown it shares this host's /dev/shm, a value of at least `shm_min_bytes` is
    written into a shared-memory segment instead (cloud/shm.py). `shm_enabled`: None
    follows $ISTHMUS_SHM (on unless 0); False turns it off.
    """

    def __init__(self, task: str = "/job:worker/task:0", devices: Optional[Sequence[str]] = None,
                 peers: Optional[Callable[[str], Any]] = None, recv_timeout: float = DEFAULT_RECV_TIMEOUT_S,
                 max_tensor_bytes: int = tensor_codec.DEFAULT_MAX_BYTES, wire: bool = False,
                 inline_bytes: int = recv_layout.DEFAULT_INLINE_BYTES, chunk_bytes: int = recv_layout.DEFAULT_CHUNK_BYTES,
                 shm_enabled: Optional[bool] = None, shm_min_bytes: int = shm.DEFAULT_MIN_BYTES,
                 shm_lease_s: float = shm.DEFAULT_LEASE_S):
        self.task = canonical(task)
        self.devices = [canonical(d) for d in (devices or [self.task + "/device:CPU:0"])]
        self.peers = peers
        self.recv_timeout = recv_timeout
        self.max_tensor_bytes = max_tensor_bytes
        self.wire, self.inline_bytes, self.chunk_bytes = wire, inline_bytes, chunk_bytes
        self.table = StepRendezvous(recv_timeout)
        on = shm.enabled_by_env() if shm_enabled is None else bool(shm_enabled)
        self.shm: Optional[shm.Lender] = (shm.Lender(shm_min_bytes, shm_lease_s)
                                          if wire and on and shm.host_identity() else None)
        self.variables = SessionState()  # the task's variable values and generators, by name
        self._graphs: Dict[str, _Registered] = {}
        self._ids = itertools.count(1)
        self._incarnation = os.urandom(4).hex()  # a restarted task never reissues a handle a peer still holds
        self._lock = threading.Lock()
        self.steps_run = 0

    # ---- registration --------------------------------------------------------------------
    def register_graph(self, graph: Union[Graph, bytes, Any], device: Optional[str] = None) -> str:
        """Register a part (a Graph, a GraphDef or its bytes); returns its handle."""
        if not isinstance(graph, Graph):
            try:
                graph = graph_codec.decode(graph, max_bytes=self.max_tensor_bytes)
            except graph_codec.GraphCodecError as e:
                raise WorkerError(f"{self.task}: cannot register graph: {e}") from None
        dev = canonical(device) if device else self.devices[0]
        if dev not in self.devices:
            raise WorkerError(f"{self.task}: device {dev} is not one of this task's {self.devices}")
        with self._lock:
            handle = f"{self.task}/graph:{self._incarnation}:{next(self._ids)}"
            self._graphs[handle] = _Registered(handle, dev, graph, self)
        for n in graph.nodes:  # variable slots exist before any step can race to create them
            if n.op == "Variable":
                self.variables.slot(n)
        return handle

    def expect_pushed(self, handle: str, keys) -> None:
        """The part `handle`'s Recvs of these (src, dst, tensor) keys wait in this task's
        rendezvous, where the master puts the values (carried on their senders' RunGraph
        answers), instead of calling the sending task."""
        reg = self._get(handle)
        reg.pushed.update((str(a), str(b), str(c)) for a, b, c in keys)
        reg._remote.clear()

    def _share_state(self, state: SessionState) -> None:
        state.slots = self.variables.slots
        state.rngs = self.variables.rngs
        state._lock = self.variables._lock

    def _get(self, handle: str) -> _Registered:
        try:
            return self._graphs[handle]
        except KeyError:
            raise HandleNotFound(f"{self.task}: no registered graph {handle!r}") from None

    def deregister_graph(self, handle: str) -> None:
        with self._lock:
            reg = self._graphs.pop(handle, None)
        if reg is None:
            raise HandleNotFound(f"{self.task}: no registered graph {handle!r}")
        reg.close()

    # ---- steps -----------------------------------------------------------------------------
    def run_graph(self, handle: str, step_id: int, feeds: Optional[Mapping[str, Any]] = None,
                  fetches: Sequence[str] = (), timeout: Optional[float] = None,
                  run_metadata: Optional[RunMetadata] = None) -> List[Optional[np.ndarray]]:
        """Run one step of a registered part: the fetched tensors' values (None for node fetches).

        A failure aborts the step in this task's rendezvous (its waiting Recvs wake) and
        is raised as the Session reports it (naming the failing node). With `run_metadata`
        the step is traced: its node events go there, on the part's device's track, its
        Sends and Recvs tagged with the step id that pairs them across tasks.
        """
        reg = self._get(handle)
        g = reg.graph
        try:
            fd = {g.tensor(k): v for k, v in (feeds or {}).items()}
            fl = [g.tensor(f) if ":" in f else g.node(f) for f in fetches]
        except Exception as e:  # noqa: BLE001  (GraphError naming the missing node)
            raise WorkerError(f"{self.task}: {e}") from None
        step_id = int(step_id)
        err = self.table.aborted(step_id)
        if err is not None:
            raise RendezvousAborted(f"step {step_id} was aborted before it ran on {self.task}: {err}") from err
        sess, rv = inst = reg.acquire()
        rv.step_id = step_id
        rv.timeout = float(timeout) if timeout else rv.default_timeout
        try:
            rv.prefetched = self._prefetch(reg, fl, step_id, rv.timeout)
            if run_metadata is None:
                out = sess.run(fl, fd) if fl else []
            else:
                out = self._run_traced(reg, sess, fl, fd, step_id, run_metadata)
        except BaseException as e:
            self.table.abort_step(step_id, e)
            raise
        finally:
            for f in rv.prefetched.values():  # not taken (the step failed first): give them up
                f.cancel()
            rv.prefetched = {}
            reg.release(inst)
        self.steps_run += 1
        return [None if not hasattr(v, "dtype") else np.asarray(v) for v in out]

    def _prefetch(self, reg: _Registered, fetches, step_id: int, timeout: float) -> Dict[tuple, Any]:
        """Start the part's Recvs from other tasks together, before it runs (their round trips
        overlap instead of following one another); the Recv kernels then take the answers.
        At most PREFETCH_MAX per step, since each waiting call holds a thread of the sending
        task's server until the value is there."""
        keys = reg.remote_recvs(fetches) if self.peers is not None else ()
        if len(keys) < 2:  # one Recv: nothing to overlap, and a blocking call is the quicker
            return {}
        out: Dict[tuple, Any] = {}
        try:
            for key in keys[:PREFETCH_MAX]:
                start = getattr(self.peers(key[0]), "recv_tensor_future", None)
                if start is not None:
                    out[key] = start(key[0], key[1], key[2], step_id, timeout)
        except Exception:  # noqa: BLE001  (an unknown task: the Recv itself will say so)
            pass
        return out

    @staticmethod
    def _run_traced(reg: _Registered, sess: Session, fl, fd, step_id: int, md: RunMetadata) -> list:
        part = RunMetadata()
        out = sess.run(fl, fd, options=RunOptions(trace=True), run_metadata=part) if fl else []
        for e in part.events:
            if e.key:
                e.step = step_id
        md.merge(part, device=reg.device)
        return out

    def _deposit(self, key: Key, value: Any) -> None:
        if self.wire and key[1] not in self.devices and hasattr(value, "dtype"):
            value = self._lay_out(key[1], value)
        try:
            self.table.put(key, value)
        except BaseException:
            shm.release_value(value)
            raise

    def _lay_out(self, dst_device: str, value: Any) -> Any:
        """A value bound for another task, as it will travel: a shared-memory segment when
        that task shares this host (and the segment can be made), else its RecvTensor messages."""
        if self.shm is not None and self.shm.wants(dst_device, value):
            try:
                return shm.Segment(value, self.max_tensor_bytes)
            except (OSError, ValueError):  # /dev/shm full or gone: the bytes travel by gRPC
                pass
        return recv_layout.WireTensor(value, self.inline_bytes, self.chunk_bytes, self.max_tensor_bytes)

    def recv_tensor(self, src_device: str, dst_device: str, tensor: str, step_id: int,
                    timeout: Optional[float] = None) -> np.ndarray:
        """Take the value a Send on this task deposited for (src, dst, tensor, step)."""
        v = self.table.take((src_device, dst_device, tensor, int(step_id)), timeout)
        if isinstance(v, shm.Segment):
            return self._unshare(v)
        return v.to_array() if isinstance(v, recv_layout.WireTensor) else v

    def recv_wire(self, src_device: str, dst_device: str, tensor: str, step_id: int,
                  timeout: Optional[float] = None) -> recv_layout.WireTensor:
        """Like recv_tensor, as the messages that carry it (what the gRPC servicer sends)."""
        v = self.table.take((src_device, dst_device, tensor, int(step_id)), timeout)
        if isinstance(v, recv_layout.WireTensor):
            return v
        if isinstance(v, shm.Segment):
            v = self._unshare(v)
        return recv_layout.WireTensor(v, self.inline_bytes, self.chunk_bytes, self.max_tensor_bytes)

    @staticmethod
    def _unshare(seg: "shm.Segment") -> np.ndarray:
        try:
            return seg.to_array()
        finally:
            shm.release_value(seg)

    def recv_shared(self, src_device: str, dst_device: str, tensor: str, step_id: int,
                    timeout: Optional[float] = None, shm_host: str = "",
                    shm_failed: str = "") -> Union[recv_layout.WireTensor, "shm.Segment"]:
        """What the RecvTensor servicer answers with: a shared-memory segment lent to the
        caller when it offered this host's identity (`shm_host`) and the value is big enough,
        else the value's messages. `shm_failed`: a segment lent before that the caller could
        not read; its bytes come back as messages."""
        key = (src_device, dst_device, tensor, int(step_id))
        if shm_failed:
            seg = self.shm.reclaim(shm_failed, key) if self.shm is not None else None
            if seg is None:
                raise WorkerError(f"{self.task}: no shared-memory segment {shm_failed!r} was lent for {show(key)}")
            return recv_layout.WireTensor(self._unshare(seg), self.inline_bytes, self.chunk_bytes, self.max_tensor_bytes)
        lender = self.shm
        if lender is None or not shm_host or not lender.accepts(shm_host):
            if lender is not None:   # that device's task is elsewhere now (restarted on another host)
                lender.peers.discard(dst_device)
            return self.recv_wire(src_device, dst_device, tensor, step_id, timeout)
        lender.peers.add(dst_device)   # its next values are laid out in segments when their Sends run
        v = self.table.take(key, timeout)
        if not isinstance(v, shm.Segment) and getattr(v, "nbytes", 0) >= lender.min_bytes:
            try:  # laid out before this caller offered: into a segment now
                v = shm.Segment(v.to_array() if isinstance(v, recv_layout.WireTensor) else v, self.max_tensor_bytes)
            except (OSError, ValueError):
                pass
        if isinstance(v, shm.Segment):
            try:
                lender.lend(v, key)
                return v
            except OSError:
                v = self._unshare(v)
        return v if isinstance(v, recv_layout.WireTensor) else recv_layout.WireTensor(
            v, self.inline_bytes, self.chunk_bytes, self.max_tensor_bytes)

    def put_back(self, src_device: str, dst_device: str, tensor: str, step_id: int, value: Any) -> None:
        """Return a taken value (a streamed tensor waits for its RecvTensorStream)."""
        self.table.put((src_device, dst_device, tensor, int(step_id)), value)

    def close(self) -> None:
        """Free what the task's pending values hold (shared-memory segments, lent ones too)."""
        self.table.clear()
        if self.shm is not None:
            self.shm.close()

    def fetch(self, src: str, dst: str, tensor: str, step_id: int, timeout: Optional[float] = None):
        """What a Recv here calls: local when the Send ran on this task, else pulled from its task."""
        if src in self.devices or self.peers is None:
            return self.recv_tensor(src, dst, tensor, step_id, timeout)
        peer = self.peers(src)
        if peer is None:
            raise WorkerError(f"{self.task}: no task holds device {src}")
        return peer.recv_tensor(src, dst, tensor, step_id, timeout)

    def abort_step(self, step_id: int, error: BaseException) -> None:
        self.table.abort_step(int(step_id), error)
        if self.shm is not None:
            self.shm.abort_step(int(step_id))

    # ---- state -------------------------------------------------------------------------------
    def reset_variables(self) -> None:
        """Forget every variable value (as a restarted task would have)."""
        with self.variables._lock:
            for s in self.variables.slots.values():
                with s.lock:
                    s.value = None

    def status(self) -> Dict[str, Any]:
        return {"task": self.task, "devices": list(self.devices), "handles": sorted(self._graphs),
                "steps_run": self.steps_run, "pending_tensors": len(self.table.pending()),
                "shm_lent": self.shm.lent_total if self.shm is not None else 0}
