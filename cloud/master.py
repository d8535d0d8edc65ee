"""The master: a client's sessions over a cluster, in process (cloud/master_rpc.py serves it).

A session holds the client's graph. The first step of each (fetches, feeds, targets)
signature places the graph on the cluster (partitioner/cluster_placement.py), partitions it with one
Send/Recv pair per tensor per destination task (partitioner/partition.py) and registers
each part on its task, once. Every step then gets a fresh random step id and runs every
part at once (a RunGraph per task); the parts meet in the tasks' rendezvous under that
id. When a part fails, the master aborts the step on every task (their waiting Recvs
wake at once) and raises the original error, naming its node and task; the session
stays usable.
"""
from __future__ import annotations

import itertools
import random
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..core.devices import canonical
from ..core.errors import FeedError
from ..core.function import Function
from ..core.graph import Graph, Node, Tensor
from ..core.rendezvous import RendezvousAborted
from ..core.shapes import num_elements
from ..core.trace import RunMetadata
from ..partitioner.partition import Partition, partition
from . import graph_codec
from .cluster import ClusterSpec, ClusterSpecError
from ..partitioner.cluster_placement import cluster_devices, place_on_cluster
from .errors import HandleNotFound, PermissionDenied, WorkerError, caused_by_abort
from .limits import MAX_STEP_TIMEOUT_S

DEFAULT_STEP_TIMEOUT_S = 60.0
_ABORT_TIMEOUT_S = 5.0


@dataclass
class _PartRun:
    device: str
    worker: Any
    handle: str
    feeds: List[str]          # tensor names fed to this part ("x:0")
    fetches: List[str]        # what one step runs: outputs, then Sends (or pushed values: see pushes)
    # values this part returns for the master to put in another task's rendezvous:
    # (index in fetches, the in-process Worker of the destination, (src, dst, tensor))
    pushes: List[Tuple[int, Any, Tuple[str, str, str]]] = field(default_factory=list)


@dataclass
class StepPlan:
    """A registered signature: its partition and the parts' handles."""
    partition: Partition
    placement: Dict[str, str]
    parts: List[_PartRun] = field(default_factory=list)
    outputs: Dict[str, Tuple[int, int]] = field(default_factory=dict)  # output name -> (part, index)


# ops a client-token session may not hold: they write variables or reach into the rendezvous
STATE_WRITING_OPS = frozenset({"Assign", "AssignAdd", "AssignSub", "ScatterAdd", "Send", "Recv",
                               "ApplyGradientDescent", "ApplyMomentum", "ApplyAdagrad", "ApplyAdam",
                               "SparseApplyGradientDescent", "SparseApplyMomentum", "SparseApplyAdagrad",
                               "SparseApplyAdam"})


def refuse_state_writes(roots: Sequence[Union[Tensor, Node]], where: str) -> None:
    """PermissionDenied naming the first node that a step running `roots` would run (looking
    inside cond/while bodies) and that writes state."""
    stack = [r.node if isinstance(r, Tensor) else r for r in roots]
    seen: set = set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.op in STATE_WRITING_OPS:
            raise PermissionDenied(f"{where}: node '{n.name}' ({n.op}) writes state; a client token may "
                                   "only run steps that read (this needs the cluster token)")
        stack.extend(t.node for t in n.inputs)
        stack.extend(n.control_inputs)
        for v in n.attrs.values():
            body = getattr(v, "graph", v)
            if isinstance(body, Graph):
                stack.extend(body.nodes)


class MasterSession:
    def __init__(self, master: "Master", handle: str, graph: Graph, writes: bool = True):
        self.master, self.handle, self.graph = master, handle, graph
        self.writes = writes   # False: created with a client token, its steps write no state
        self.checked: set = set()   # (fetches, targets) found to write no state
        self.version = 1
        self.plans: Dict[tuple, StepPlan] = {}
        self.placement: Optional[Dict[str, str]] = None   # every node's device, once per graph version
        self.previous: Optional[Dict[str, str]] = None    # the placement before the graph last grew
        self._lock = threading.Lock()
        self.steps = 0

    # ---- planning ----------------------------------------------------------------------------
    def plan(self, fetches: Sequence[str], feeds: Sequence[str], targets: Sequence[str],
             traced: bool = False) -> StepPlan:
        """The registered plan of a signature. A traced step gets a plan of its own in which
        every transfer is a Send/Recv pair (no values carried on RunGraph answers), so that
        its trace shows each transfer with both ends."""
        key = (tuple(fetches), tuple(sorted(feeds)), tuple(targets), bool(traced))
        p = self.plans.get(key)
        if p is None:
            with self._lock:
                p = self.plans.get(key)
                if p is None:
                    p = self.plans[key] = self._build(fetches, feeds, targets, push=not traced)
        return p

    def _resolve(self, name: str, node: bool) -> Union[Tensor, Node]:
        g = self.graph
        try:
            return g.node(name) if node else (g.tensor(name) if ":" in name else g.node(name).outputs[0])
        except Exception as e:  # noqa: BLE001  (GraphError naming the missing node)
            raise FeedError(str(e)) if not node else e from None

    def _build(self, fetches, feeds, targets, push: bool = True) -> StepPlan:
        outs: List[Union[Tensor, Node]] = [self._resolve(f, False) for f in fetches]
        outs += [self._resolve(t, True) for t in targets]
        for f in feeds:
            t = self._resolve(f, False)
            if t.node.op != "Placeholder":
                raise FeedError(f"feed '{f}': a distributed session feeds placeholders only; "
                                f"'{t.node.name}' is a {t.node.op}")
        uniq = list(dict.fromkeys(outs))
        if self.master.cluster is None:
            raise WorkerError("this master does not know its cluster yet")
        if self.placement is None:
            self.placement = place_on_cluster(self.graph, self.master.cluster, self.master.default_device,
                                              self.previous)
        placement = self.placement
        part = partition(self.graph, placement, uniq)
        plan = StepPlan(part, placement)
        registered = []
        workers = {dev: self.master.worker(dev) for dev in part.parts}
        try:
            pushed: Dict[str, set] = {}
            for dev, p in part.parts.items():
                w = workers[dev]
                gd = graph_codec.encode(p.graph, _rebinder(self.graph, p.graph)) if self.master.encode else p.graph
                h = w.register_graph(gd, dev)
                registered.append((w, h))
                fed = [f for f in feeds if f.split(":")[0] in p.feeds]
                fetches, pushes = _pushes(p, w, workers) if push else (list(p.fetches), [])
                for _, _, key in pushes:
                    pushed.setdefault(key[1], set()).add(key)
                plan.parts.append(_PartRun(dev, w, h, [_tensor_name(f) for f in fed], fetches, pushes))
                for k, orig in enumerate(p.outputs):
                    plan.outputs[orig] = (len(plan.parts) - 1, k)
            for pr in plan.parts:
                if pushed.get(pr.device):
                    pr.worker.expect_pushed(pr.handle, pushed[pr.device])
        except BaseException:
            for w, h in registered:
                _quietly(w.deregister_graph, h)
            raise
        return plan

    # ---- steps -------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any], fetches: Sequence[str], targets: Sequence[str] = (),
            timeout: Optional[float] = None, run_metadata=None) -> Tuple[List[Any], int]:
        """(fetched values in order, step id). With `run_metadata` (a core RunMetadata) every
        part is traced and their events land there, on one timeline (cloud/tracing.py)."""
        timeout = timeout or self.master.step_timeout
        plan = self.plan(list(fetches), list(feeds), list(targets), traced=run_metadata is not None)
        by_tensor = {_tensor_name(k): v for k, v in feeds.items()}
        step_id = self.master.new_step_id()
        pending: List[Any] = [None] * len(plan.parts)
        traces = [] if run_metadata is None else [RunMetadata() for _ in plan.parts]
        here = None   # the first part that runs in this process runs in this thread, after the others start
        local = [pr.worker for pr in plan.parts if not hasattr(pr.worker, "run_graph_future")]
        for i, pr in enumerate(plan.parts):
            part_feeds = {f: by_tensor[f] for f in pr.feeds}
            md = traces[i] if traces else None
            if here is None and not hasattr(pr.worker, "run_graph_future"):
                here = (i, pr, part_feeds, md)
                continue
            pending[i] = self.master.start(pr.worker, pr.handle, step_id, part_feeds, pr.fetches, timeout, md)
            if hasattr(pr.worker, "run_graph_future") and (pr.pushes or local):
                pending[i].add_done_callback(lambda p, pr=pr: _answered(p, pr, step_id, local))
        if here is not None:
            i, pr, part_feeds, md = here
            pending[i] = _Ran(lambda: pr.worker.run_graph(pr.handle, step_id, part_feeds, pr.fetches, timeout,
                                                          *(() if md is None else (md,))))
        results, errors = self._wait(plan, pending, step_id, timeout)
        self.steps += 1
        if errors:
            raise _original(errors)
        for md in traces:
            run_metadata.merge(md)
        names = [_tensor_name(f) if ":" not in f else f for f in fetches]
        out = []
        for f, nm in zip(fetches, names):
            i, k = plan.outputs.get(f, plan.outputs.get(nm, (None, None)))
            out.append(results[i][k])
        return out, step_id

    def _wait(self, plan: StepPlan, pending, step_id: int, timeout: float):
        """Collect every part's result; on the first failure abort the step everywhere."""
        results: Dict[int, list] = {}
        errors: List[BaseException] = []
        done = threading.Condition()
        order: List[int] = []

        def finished(i):
            with done:
                order.append(i)
                done.notify_all()
        for i, p in enumerate(pending):
            p.add_done_callback(lambda _p, i=i: finished(i))
        deadline = time.monotonic() + timeout * 2 + 10  # the parts' own deadlines end them sooner
        aborted = False
        for seen in range(len(pending)):
            with done:
                while len(order) <= seen:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        e = TimeoutError(f"step {step_id}: parts on "
                                         + ", ".join(plan.parts[j].device for j in range(len(pending))
                                                     if j not in order)
                                         + f" did not finish within {timeout * 2 + 10:g} s")
                        self.master.abort_step(step_id, e, [pr.worker for pr in plan.parts])
                        return results, errors + [e]
                    done.wait(min(left, 1.0))
                i = order[seen]
            try:
                results[i] = pending[i].result()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                if not aborted:
                    aborted = True
                    self.master.abort_step(step_id, e, [pr.worker for j, pr in enumerate(plan.parts) if j != i])
        return results, errors

    def close(self) -> None:
        for plan in self.plans.values():
            for pr in plan.parts:
                _quietly(pr.worker.deregister_graph, pr.handle)
        self.plans.clear()


PUSH_MAX_BYTES = 64 << 10   # a value this small (by its static shape) may ride on RunGraph's answer


def _pushes(p, worker, workers: Mapping[str, Any]):
    """(fetches, pushes) of a part: its Sends whose value the master can carry itself.

    A Send on another task to a part running in this process (the master's own task) would
    cost the receiver a RecvTensor call; instead the part returns the Send's input as an
    output of its RunGraph and the master puts it in the receiving Worker's rendezvous, so
    a null step's control tokens cost no call of their own. Only parts without Recvs do
    this: such a part finishes on its own, so its answer (which now carries the value)
    cannot wait on anything the receiver does later in the step. Only values known to be
    small (static shape) ride on the answer."""
    fetches = list(p.fetches)
    if not hasattr(worker, "run_graph_future") or any(n.op == "Recv" for n in p.graph.nodes):
        return fetches, []
    pushes = []
    for k, f in enumerate(fetches):
        if ":" in f or f not in p.graph:
            continue
        n = p.graph.node(f)
        if n.op != "Send":
            continue
        dst_worker = workers.get(canonical(n.attrs["dst_device"]))
        if dst_worker is None or not hasattr(dst_worker, "expect_pushed"):
            continue  # not in this process
        t = n.inputs[0]
        count = num_elements(t.shape)
        try:
            size = None if count is None else count * np.dtype(t.dtype).itemsize
        except TypeError:
            size = None
        if size is None or size > PUSH_MAX_BYTES or np.dtype(t.dtype) == np.dtype(object):
            continue
        src, dst, tensor = n.attrs["key"].split(";", 2)
        fetches[k] = t.name
        pushes.append((k, dst_worker, (src, dst, tensor)))
    return fetches, pushes


def _rebinder(source: Graph, part: Graph) -> Callable[[Tensor], Optional[Tensor]]:
    """For a part's control-flow bodies, which still read the unsplit graph: the part's
    tensor standing for each source tensor (a node's captured inputs by position, else
    the tensor of the same name, as variables keep their names)."""
    table: Dict[Tensor, Tensor] = {}
    for n in part.nodes:
        if any(isinstance(v, (Function, tuple, list)) for v in n.attrs.values()) and n.name in source:
            for t_src, t_part in zip(source.node(n.name).inputs, n.inputs):
                table.setdefault(t_src, t_part)

    def rebind(t: Tensor) -> Optional[Tensor]:
        got = table.get(t)
        if got is None and t.node.graph is source and t.node.name in part:
            cand = part.node(t.node.name)
            if cand.op == t.node.op and t.index < len(cand.outputs):
                got = cand.outputs[t.index]
        return got
    return rebind


def _answered(pending, pr: _PartRun, step_id: int, local: Sequence[Any]) -> None:
    """A remote part's answer, as it arrives (on gRPC's thread): put the values it carries in
    their Workers' rendezvous, or, when it failed, wake this process's parts at once (the
    master aborts the step everywhere once it collects the answers)."""
    try:
        got = pending.result()
    except BaseException as e:  # noqa: BLE001
        reason = RendezvousAborted(f"another part failed: {type(e).__name__}: {e}")
        for w in local:
            _quietly(w.abort_step, step_id, reason)
        return
    for k, w, (src, dst, tensor) in pr.pushes:
        try:
            w.put_back(src, dst, tensor, step_id, got[k])
        except Exception:  # noqa: BLE001  (the step was aborted: its waiters already know)
            pass


class _Ran:
    """A part run in the calling thread, as a finished pending result."""

    def __init__(self, fn):
        try:
            self._value, self._error = fn(), None
        except BaseException as e:  # noqa: BLE001
            self._value, self._error = None, e

    def add_done_callback(self, fn) -> None:
        fn(self)

    def result(self):
        if self._error is not None:
            raise self._error
        return self._value


def _original(errors: List[BaseException]) -> BaseException:
    """The failure itself, not the other parts giving up because of it."""
    return next((e for e in errors if not caused_by_abort(e)), errors[0])


def _tensor_name(name: str) -> str:
    return name if ":" in name else name + ":0"


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001  (cleanup of a task that may be gone)
        pass


class _LocalPending:
    def __init__(self, fut):
        self.fut = fut

    def add_done_callback(self, fn) -> None:
        self.fut.add_done_callback(lambda _f: fn(self))

    def result(self):
        return self.fut.result()


class Master:
    """Sessions over `cluster`. `worker(device)` gives the Worker (in process) or WorkerClient
    of the task holding a device; `encode` sends parts as GraphDefs (over the network)."""

    def __init__(self, cluster: Optional[ClusterSpec], worker: Callable[[str], Any], default_device: Optional[str] = None,
                 step_timeout: float = DEFAULT_STEP_TIMEOUT_S, encode: bool = True):
        self.cluster = cluster
        self.worker = worker
        self.default_device = default_device
        self.step_timeout = step_timeout
        self.max_step_timeout = max(step_timeout, MAX_STEP_TIMEOUT_S)
        self.encode = encode
        self._sessions: Dict[str, MasterSession] = {}
        self._ids = itertools.count(1)
        self._rng = random.SystemRandom()
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="isthmus-master")
        self._lock = threading.Lock()

    def new_step_id(self) -> int:
        # random, as TF's: steps of different sessions (and masters) sharing tasks never collide
        return self._rng.getrandbits(62)

    def start(self, worker, handle, step_id, feeds, fetches, timeout, run_metadata=None):
        """Start a part's step; with `run_metadata` it is traced into it (untraced: no extra argument)."""
        traced = () if run_metadata is None else (run_metadata,)
        if hasattr(worker, "run_graph_future"):
            return worker.run_graph_future(handle, step_id, feeds, fetches, timeout, *traced)
        return _LocalPending(self._pool.submit(worker.run_graph, handle, step_id, feeds, fetches, timeout, *traced))

    def abort_step(self, step_id: int, error: BaseException, workers: Sequence[Any]) -> None:
        reason = RendezvousAborted(f"another part failed: {type(error).__name__}: {error}")
        for w in {id(w): w for w in workers}.values():
            try:
                if hasattr(w, "run_graph_future"):
                    w.abort_step(step_id, reason, timeout=_ABORT_TIMEOUT_S)
                else:
                    w.abort_step(step_id, reason)
            except Exception:  # noqa: BLE001  (a task that is gone cannot wait on this step)
                pass

    # ---- the service ---------------------------------------------------------------------------
    def create_session(self, graph: Union[Graph, Any], writes: bool = True) -> str:
        """A new session's handle (128 random bits: not guessable by another client).
        `writes=False` (a client token's call): its steps may not write state (run_step checks)."""
        g = graph if isinstance(graph, Graph) else graph_codec.decode(graph)
        with self._lock:
            handle = f"session:{next(self._ids)}:{secrets.token_hex(16)}"
            self._sessions[handle] = MasterSession(self, handle, g, writes)
        return handle

    def session(self, handle: str, writes: bool = True) -> MasterSession:
        s = self._sessions.get(handle)
        if s is None:
            raise HandleNotFound(f"no session {handle!r} on this master (closed, or the master restarted)")
        if s.writes and not writes:
            raise PermissionDenied(f"session {handle!r} was created with the cluster token; "
                                   "a client token may not use it")
        return s

    def extend_session(self, handle: str, graph: Union[Graph, Any], current_version: int = 0,
                       writes: bool = True) -> int:
        """Replace the session's graph with a grown one; parts are registered anew as needed
        (variables keep their values: they live in the tasks, by name)."""
        s = self.session(handle, writes)
        g = graph if isinstance(graph, Graph) else graph_codec.decode(graph)
        with s._lock:
            if current_version and current_version != s.version:
                raise WorkerError(f"session {handle}: extended from version {current_version}, "
                                  f"but it is at version {s.version}")
            s.close()
            s.graph = g
            s.version += 1
            s.previous, s.placement = s.placement, None
            return s.version

    def run_step(self, handle: str, feeds: Mapping[str, Any], fetches: Sequence[str],
                 targets: Sequence[str] = (), timeout: Optional[float] = None,
                 run_metadata=None, writes: bool = True) -> Tuple[List[Any], int]:
        """`timeout` is capped at `max_step_timeout` (a caller cannot hold the server's threads longer)."""
        timeout = min(timeout or self.step_timeout, self.max_step_timeout)
        s = self.session(handle, writes)
        if not s.writes:
            key = (s.version, tuple(fetches), tuple(targets))
            if key not in s.checked:
                roots = [s._resolve(f, False) for f in fetches] + [s._resolve(t, True) for t in targets]
                refuse_state_writes(roots, f"RunStep of {handle}")
                s.checked.add(key)
        return s.run(feeds, fetches, targets, timeout, run_metadata)

    def close_session(self, handle: str, writes: bool = True) -> None:
        self.session(handle, writes)
        with self._lock:
            s = self._sessions.pop(handle, None)
        if s is None:
            raise HandleNotFound(f"no session {handle!r} on this master")
        s.close()

    def list_devices(self) -> List[Dict[str, str]]:
        return [{"name": d, "device_type": "CPU", "address": self.cluster.address(*_job_task(d))}
                for d in cluster_devices(self.cluster)]

    def close(self) -> None:
        for h in list(self._sessions):
            _quietly(self.close_session, h)
        self._pool.shutdown(wait=False)


def _job_task(device: str) -> Tuple[str, int]:
    parts = device.split("/")
    return parts[1].split(":", 1)[1], int(parts[2].split(":", 1)[1])


__all__ = ["Master", "MasterSession", "StepPlan", "ClusterSpecError"]
