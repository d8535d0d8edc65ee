"""Data-parallel training over the GPUs of one host: one replica per GPU, gradients all-reduced.

    dp = DataParallel(model_fn, lambda: ism.optimizers.Momentum(0.1, 0.9), devices=2)
    loss = dp.step({"x": X, "y": Y})    # the batch is split evenly across the replicas

`model_fn()` builds one replica (as for cloud/replicas.py) and returns `(loss, [input
placeholders])`. It is called once per GPU, in a graph of its own, whose Session places every node
on that GPU. A replica's step computes its shard's gradients, all-reduces them (their mean) with
the other replicas through one AllReduce node (core/collective.py: NCCL on real GPUs, the stand-in's
communicator in CI) and applies one optimizer step to the mean: the same bits on every replica, so
the parameters, which start as replica 0's copied to all, stay bit-identical.

Each replica runs in a thread of its own with its GPU current, a stream of its own (cupy) and its
own memory cap, so the replicas' steps overlap; the all-reduce is where they meet. A replica that
fails before the all-reduce aborts it: no replica applies anything that step, and the error names
the replica, its device and the failing node. A failure after it (in an update) leaves the others
updated: ReplicaDivergedError, and no further step until `sync_parameters()` copies replica 0's
state to all.

With one GPU there is one replica; its communicator is a one-rank NCCL communicator where NCCL is
present, else the identity: `communicator.kind` says which ('nccl', 'single' or 'simulated').
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import gpu as gpu_mod
from .collective import (AllReduceGroup, CollectiveAborted, Communicator, NcclCommunicator,
                         SimulatedCommunicator, SingleRank, all_reduce)
from .checkpoint import Saver
from .graph import Graph, Tensor
from .optimizers import UPDATE_OPS, get_or_create_global_step
from .ops.base import group
from .ops.sparse import IndexedSlices, to_dense
from .session import Session
from .variables import global_variables, global_variables_initializer


class ReplicaStepError(RuntimeError):
    """A replica failed; `rank`, `device`, and `applied` (False: no replica changed anything)."""

    def __init__(self, msg: str, rank: int, device: str, applied: bool):
        super().__init__(msg)
        self.rank, self.device, self.applied = rank, device, applied


class ReplicaDivergedError(ReplicaStepError):
    """Some replicas applied a step that others did not: call `sync_parameters()`."""


@dataclass
class _Replica:
    rank: int
    device: str
    pool: ThreadPoolExecutor
    graph: Optional[Graph] = None
    session: Optional[Session] = None
    loss: Optional[Tensor] = None
    inputs: List[Tensor] = field(default_factory=list)
    train_op: Any = None
    global_step: Any = None
    init: Any = None
    variables: list = field(default_factory=list)


class DataParallel:
    """Synchronous data-parallel training on the GPUs of this process (see the module docstring).

    devices: a count, a list of GPU indices, or "all" (every CUDA device). gpu: "cuda" or
    "simulated" (default ISTHMUS_GPU, else "cuda"). gpu_memory: each GPU's cap (one value, or one
    per replica). communicator: "auto", "nccl", "simulated" or "single".
    """

    def __init__(self, model_fn: Callable[[], Any], optimizer_fn: Callable[[], Any],
                 devices: Union[int, str, Sequence[int]] = "all", gpu: Optional[str] = None, gpu_memory=None,
                 communicator: str = "auto", timeout_s: float = 120.0, seed: int = 0):
        self.gpu = gpu or os.environ.get("ISTHMUS_GPU") or "cuda"
        self.indices = device_indices(devices, self.gpu)
        n = len(self.indices)
        mems = list(gpu_memory) if isinstance(gpu_memory, (list, tuple)) else [gpu_memory] * n
        if len(mems) != n:
            raise ValueError(f"gpu_memory gives {len(mems)} caps for {n} replicas")
        self.streams = _streams(self.gpu, self.indices)
        self.communicator = make_communicator(communicator, self.gpu, self.indices, self.streams)
        self.group = AllReduceGroup(self.communicator, timeout_s)
        self.timeout_s = timeout_s
        self.steps = 0
        self._diverged: Optional[str] = None
        self._step_lock = threading.Lock()   # one step at a time: the group holds one round
        self._saver: Optional[Saver] = None
        self.replicas = [_Replica(r, f"/device:GPU:{i}", _replica_thread(self.gpu, i, self.streams[r], r))
                         for r, i in enumerate(self.indices)]
        try:
            # one replica after another, in rank order: model_fn may have side effects (a shared generator)
            self._on_all(lambda rep: self._build(rep, model_fn, optimizer_fn, mems[rep.rank], seed), "building",
                         one_by_one=True)
            self._on_all(lambda rep: rep.session.run(rep.init), "initializing")
            self.sync_parameters()
        except BaseException:
            self.close()
            raise

    # ---- building -------------------------------------------------------------------------------
    def _build(self, rep: _Replica, model_fn, optimizer_fn, memory, seed: int) -> None:
        g = Graph(seed=seed)
        with g.as_default():
            loss, inputs = model_fn()
            moving = _moving_updates(g)
            opt = optimizer_fn()
            pairs = [(to_dense(gr) if isinstance(gr, IndexedSlices) else gr, v)
                     for gr, v in opt.compute_gradients(loss) if gr is not None]
            # one rendezvous per step: the gradients and the replicas' new moving statistics together
            reduced = all_reduce([gr for gr, _ in pairs] + [new for _, new in moving], self.group, rep.rank,
                                 name="gradients_all_reduce")
            rep.global_step = get_or_create_global_step(g)
            step = opt.apply_gradients(list(zip(reduced, [v for _, v in pairs])), global_step=rep.global_step)
            stats = [var.assign(r).node for (var, _), r in zip(moving, reduced[len(pairs):])]
            rep.train_op = group(step, *stats, name="data_parallel_step") if stats else step
            rep.init = global_variables_initializer()
        rep.graph, rep.loss, rep.inputs = g, loss, list(inputs)
        rep.variables = global_variables(g)
        rep.session = Session(g, device=rep.device, gpu=self.gpu, gpu_memory=memory, parallel=False)

    # ---- training -------------------------------------------------------------------------------
    @property
    def inputs(self) -> List[Tensor]:
        """Replica 0's input placeholders (feeds may name these, their names, or their positions)."""
        return self.replicas[0].inputs

    def step(self, feeds) -> float:
        """One synchronous step on the whole batch `feeds` (a dict keyed by input, input name or
        position, or a list in input order), split evenly across the replicas; the mean loss."""
        shards = self._shards(feeds)
        with self._step_lock:
            if self._diverged:
                raise ReplicaDivergedError(f"the replicas diverged ({self._diverged}); call sync_parameters() first",
                                           -1, "", True)
            self.group.reset()
            futs = [rep.pool.submit(self._replica_step, rep, shards[rep.rank]) for rep in self.replicas]
            losses, errors = self._collect(futs)
            if errors:
                raise self._step_error(errors)
            self.steps += 1
            return float(np.mean(losses))

    def fit(self, feeds: Iterable, epochs: int = 1, steps_per_epoch: Optional[int] = None) -> List[float]:
        """`step` over `feeds` (re-iterated each epoch, e.g. core.train.Batches with drop_last); the
        mean loss of each epoch."""
        history = []
        for _ in range(epochs):
            losses = []
            for k, feed in enumerate(feeds):
                if steps_per_epoch is not None and k >= steps_per_epoch:
                    break
                losses.append(self.step(feed))
            if not losses:
                raise ValueError("an epoch got no feeds: pass a re-iterable (a list, Batches)")
            history.append(float(np.mean(losses)))
        return history

    def _replica_step(self, rep: _Replica, feed) -> float:
        try:
            return float(rep.session.run([rep.loss, rep.train_op], feed)[0])
        except BaseException as e:
            self.group.abort(f"replica {rep.rank} ({rep.device}) failed: {type(e).__name__}: {e}")
            raise

    def _collect(self, futs):
        done, _ = wait(futs, timeout=self.timeout_s + 30.0)
        losses, errors = [], {}
        for r, f in enumerate(futs):
            if f not in done:
                errors[r] = TimeoutError(f"no answer within {self.timeout_s + 30.0:g} s")
                self.group.abort(f"replica {r} timed out")
            elif f.exception() is not None:
                errors[r] = f.exception()
            else:
                losses.append(f.result())
        return losses, errors

    def _step_error(self, errors: Dict[int, BaseException]) -> ReplicaStepError:
        causes = {r: e for r, e in errors.items() if not _is_abort(e)} or errors
        r = min(causes)
        e, rep = causes[r], self.replicas[r]
        head = f"step {self.steps}: replica {r} ({rep.device}) failed: {type(e).__name__}: {e}"
        if not self.group.reduced:
            return ReplicaStepError(f"{head}; no replica applied this step", r, rep.device, False)
        self._diverged = f"replica(s) {sorted(errors)} failed after the all-reduce of step {self.steps}"
        ok = [x.rank for x in self.replicas if x.rank not in errors]
        return ReplicaDivergedError(f"{head} after the all-reduce; replicas {ok} applied the step: the replicas "
                                    "differ now; call sync_parameters() (or restore a checkpoint)", r, rep.device, True)

    def _shards(self, feeds) -> List[Dict[Tensor, np.ndarray]]:
        n, inputs = len(self.replicas), self.inputs
        items = list(enumerate(feeds)) if isinstance(feeds, (list, tuple)) else list(feeds.items())
        out: List[Dict[Tensor, np.ndarray]] = [{} for _ in range(n)]
        for key, value in items:
            pos = self._position(key)
            a = np.asarray(value)
            if a.ndim == 0 or a.shape[0] % n:
                raise ValueError(f"input '{inputs[pos].name}': a batch of {a.shape[0] if a.ndim else 'a scalar'} "
                                 f"does not split evenly over {n} replicas")
            m = a.shape[0] // n
            for r, rep in enumerate(self.replicas):
                out[r][rep.inputs[pos]] = a[r * m:(r + 1) * m]
        return out

    def _position(self, key) -> int:
        inputs = self.inputs
        if isinstance(key, int) and 0 <= key < len(inputs):
            return key
        for i, t in enumerate(inputs):
            if key is t or key == t.name or key == t.node.name:
                return i
        raise KeyError(f"feed key {key!r} is not one of the model's inputs "
                       f"({', '.join(t.name for t in inputs)}, or their positions)")

    # ---- state ----------------------------------------------------------------------------------
    def sync_parameters(self, root: int = 0) -> None:
        """Copy replica `root`'s variables (parameters, optimizer slots, step) to every replica."""
        src = self.replicas[root]
        values = self._on_one(src, lambda rep: {v.node.name: rep.session.variable_value(v) for v in rep.variables})

        def load(rep: _Replica) -> None:
            if rep is not src:
                for v in rep.variables:
                    rep.session.set_variable_value(v, values[v.node.name])
        self._on_all(load, "copying parameters to")
        self._diverged = None

    def save(self, prefix: str) -> str:
        """A checkpoint (core.checkpoint.Saver) of replica 0, which every replica equals, named by
        the global step; returns its path."""
        if self._saver is None:
            self._saver = Saver()
        return self._on_one(self.replicas[0], lambda r: self._saver.save(r.session, prefix, global_step=r.global_step))

    def restore(self, path: str) -> None:
        """Load a checkpoint into replica 0 and copy it to every replica."""
        saver = self._saver or Saver()
        self._on_one(self.replicas[0], lambda r: saver.restore(r.session, path))
        self.sync_parameters()

    def variable_value(self, name: str, rank: int = 0) -> np.ndarray:
        """A host copy of variable `name` on replica `rank`."""
        rep = self.replicas[rank]
        return self._on_one(rep, lambda r: r.session.variable_value(r.graph.node(name)))

    def memory_stats(self) -> Dict[str, Dict[str, int]]:
        """Per GPU: the last step's peak bytes, the bytes in use, the cap."""
        out: Dict[str, Dict[str, int]] = {}
        for rep in self.replicas:
            out.update(self._on_one(rep, lambda r: r.session.memory_stats()))
        return out

    def close(self) -> None:
        self.group.abort("the DataParallel was closed")  # releases a replica still waiting in a step
        for rep in self.replicas:
            if rep.session is not None:
                rep.session.close()
            rep.pool.shutdown(wait=False)
        self.communicator.close()

    def __enter__(self) -> "DataParallel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _on_one(self, rep: _Replica, fn):
        return rep.pool.submit(fn, rep).result(timeout=self.timeout_s)

    def _on_all(self, fn, what: str, one_by_one: bool = False) -> None:
        """fn(replica) on every replica's thread (all at once, or in rank order); the first failure
        raises, naming the replica."""
        futs = []
        for rep in self.replicas:
            futs.append(rep.pool.submit(fn, rep))
            if one_by_one:
                wait(futs[-1:], timeout=self.timeout_s)
        done, _ = wait(futs, timeout=self.timeout_s)
        for rep, f in zip(self.replicas, futs):
            e = f.exception() if f in done else TimeoutError(f"no answer within {self.timeout_s:g} s")
            if e is not None:
                raise ReplicaStepError(f"{what} replica {rep.rank} ({rep.device}) failed: {type(e).__name__}: {e}",
                                       rep.rank, rep.device, False) from e


def _moving_updates(g: Graph) -> List[Tuple[Any, Tensor]]:
    """(variable, its new value on this replica) of each update op of the model (batch-norm moving
    averages: `moving = m * moving + (1 - m) * batch statistic`). The replicas' new values are
    averaged with the gradients and assigned after: since every replica starts from the same moving
    value, that is the moving average of the mean of the shards' statistics (non-synchronised batch
    norm, as TensorFlow's MirroredStrategy and PyTorch's DDP do). The model's own update ops are left
    out of the step."""
    out = []
    for u in g.get_collection(UPDATE_OPS):
        node = getattr(u, "node", u)
        if node.op != "Assign":
            raise NotImplementedError(f"update op '{node.name}' ({node.op}): DataParallel averages Assign updates "
                                      "(batch-norm moving statistics) across replicas, nothing else yet")
        out.append((node.inputs[0], node.inputs[1]))   # (the Variable is its node's output tensor)
    return out


def device_indices(devices, gpu: str) -> List[int]:
    """The GPU indices that `devices` (a count, a list, or "all") names."""
    if gpu not in ("cuda", "simulated"):
        raise ValueError(f"gpu backend {gpu!r}: expected 'cuda' or 'simulated'")
    have = gpu_mod.device_count() if gpu == "cuda" else None
    if devices == "all":
        if gpu == "simulated":
            raise ValueError("devices='all' counts real GPUs; give the stand-in a number of GPUs (devices=2)")
        if not have:
            raise RuntimeError(f"data-parallel training needs a GPU: {gpu_mod.unavailable_reason()}")
        return list(range(have))
    if isinstance(devices, int) and not isinstance(devices, bool):
        idx = list(range(devices))
    elif isinstance(devices, (list, tuple)) and all(isinstance(i, int) for i in devices):
        idx = list(devices)
    else:
        raise ValueError(f"devices must be a count, a list of GPU indices or 'all', got {devices!r}")
    if not idx or len(set(idx)) != len(idx) or min(idx) < 0:
        raise ValueError(f"devices {devices!r}: need one or more distinct GPU indices")
    if have is not None and max(idx) >= have:
        raise RuntimeError(f"devices {devices!r}: this machine has {have} GPU(s)"
                           + (f" ({gpu_mod.unavailable_reason()})" if not have else ""))
    return idx


def make_communicator(kind: str, gpu: str, indices: List[int], streams) -> Communicator:
    """'auto': the stand-in's communicator on simulated GPUs; NCCL on real ones (one GPU without NCCL:
    the identity)."""
    if kind == "auto":
        if gpu == "simulated":
            kind = "simulated"
        else:
            kind = "single" if len(indices) == 1 and gpu_mod.nccl_unavailable_reason() else "nccl"
    if kind == "simulated":
        if gpu != "simulated":
            raise ValueError("communicator='simulated' reduces stand-in GPUs only (gpu='simulated')")
        return SimulatedCommunicator(indices)
    if kind == "single":
        if len(indices) != 1:
            raise ValueError(f"communicator='single' serves one replica, not {len(indices)}")
        return SingleRank(indices[0])
    if kind == "nccl":
        if gpu != "cuda":
            raise ValueError("communicator='nccl' needs real GPUs (gpu='cuda')")
        why = gpu_mod.nccl_unavailable_reason()
        if why:
            raise RuntimeError(f"data-parallel training over GPUs {indices} needs NCCL: {why}")
        return NcclCommunicator(indices, streams)
    raise ValueError(f"communicator {kind!r}: expected 'auto', 'nccl', 'simulated' or 'single'")


def _streams(gpu: str, indices: List[int]) -> list:
    if gpu != "cuda":
        return [None] * len(indices)
    return [gpu_mod.new_stream(i) for i in indices]


def _replica_thread(gpu: str, index: int, stream, rank: int) -> ThreadPoolExecutor:
    """One thread for the replica's whole life, with its GPU and stream current (cupy's are per thread)."""
    if gpu != "cuda":
        return ThreadPoolExecutor(1, thread_name_prefix=f"isthmus-replica{rank}")
    return ThreadPoolExecutor(1, thread_name_prefix=f"isthmus-replica{rank}", initializer=gpu_mod.enter_device,
                              initargs=(index, stream))


def _is_abort(e: BaseException) -> bool:
    """Whether `e` only reports another replica's failure (the aborted all-reduce)."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, CollectiveAborted):  # (a CollectiveTimeout is a cause: it names the missing ranks)
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False
