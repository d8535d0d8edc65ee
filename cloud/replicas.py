"""Data-parallel replica training: N worker replicas share variables on the ps tasks.

    trainer = ReplicaTrainer(model_fn, lambda: ism.optimizers.Adam(1e-3), batch_fn, cluster,
                             mode="sync", replicas=2, backup=1, checkpoint_dir="ckpt",
                             checkpoint_every=50, restart=local_cluster.restart)
    stats = trainer.train(steps=500)

Between-graph replication, as in TensorFlow: each replica is a client with its own copy
of the graph (`model_fn()` builds it and returns `(loss, [input placeholders])`), pinned
so that its compute runs on its own worker task and its variables on the ps tasks (the
same device for a variable in every copy, partitioner/cluster_placement.py `pin_replica`); variables
are shared by name on the ps tasks. `batch_fn(step, replica)` gives the replica's shard
of a step's data (the values of the inputs, in order).

- **async**: each replica runs `optimizer.minimize` on its own batches and its update is
  applied on the ps as soon as it is ready (global_step counts every update).
- **sync**: each replica computes its gradients for step k on its worker and leaves them
  on the ps, next to the variables (one gradient buffer per replica and variable: a dense
  copy, or for an embedding's row-sparse gradient its values and indices). The chief takes
  the first N gradients of step k that arrive, aggregates them on the ps (their mean: a
  dense sum, or the concatenation of the sparse rows) and applies that once, with one
  optimizer step. Of the N + b replicas (b backup workers), the gradients that come later,
  or were computed from the parameters of an older step, are dropped and counted
  (`stats.dropped`, and logged on `isthmus.replicas`), never applied. A straggler thus
  costs nothing while b >= 1.

Which gradients a step takes is decided by the chief, in this client process (the
replicas are its threads, each with its own session); the gradients themselves never
pass through it: they go from the worker tasks to the ps tasks, and the chief's step only
names which replica buffers to aggregate (an index feed per replica).

Fault tolerance: the chief saves a checkpoint (core Saver) every `checkpoint_every` steps.
When a step fails because a task is gone, the trainer names it (cloud/fault.py: every
task is health-checked), restarts it with `restart(job, index)`, reconnects, restores the
latest valid checkpoint (the step counter with it) and continues. With a fixed data order
(`batch_fn` a function of the step) and b = 0 the result is the one of an uninterrupted
run: what was checkpointed is kept, and the steps after it are redone once, not added to.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..core.autodiff import gradients
from ..core.checkpoint import Saver, latest_checkpoint
from ..core.graph import Graph, Tensor
from ..core.ops.array import concat, expand_dims
from ..core.ops.base import constant, group, placeholder
from ..core.ops.fill import shape as shape_of
from ..core.ops.math import add_n, mul
from ..core.ops.reduce import reduce_sum
from ..core.ops.sparse import IndexedSlices, gather
from ..core.optimizers import UPDATE_OPS, get_or_create_global_step
from ..core.variables import Variable, global_variables, trainable_variables, variables_initializer
from .cluster import ClusterSpec
from .fault import TaskFailure, diagnose, is_task_loss, wait_until
from .session import DistributedSession
from ..partitioner.cluster_placement import PS_JOB, WORKER_JOB, pin_replica, task_device, variable_devices

log = logging.getLogger("isthmus.replicas")

BUFFER_SCOPE = "replica_gradients"
RECONNECT_TIMEOUT_S = 30.0


@dataclass
class ReplicaStats:
    """What a run did. `losses[k]`: mean loss of the gradients step k applied (sync) or of the
    updates of ticket k (async). submitted == accepted + dropped (+ in flight when stopped)."""
    steps: int = 0
    submitted: int = 0
    accepted: int = 0
    dropped: int = 0
    losses: Dict[int, float] = field(default_factory=dict)
    step_times: List[float] = field(default_factory=list)
    checkpoints: List[str] = field(default_factory=list)
    failures: List[Tuple[float, str]] = field(default_factory=list)   # (time.monotonic() seen, message)
    restarts: List[str] = field(default_factory=list)
    restored: List[Tuple[int, str]] = field(default_factory=list)     # (step restored, file or "init")
    retries: int = 0      # restores redone while a restarted task was still unreachable from another


class _Round:
    """The chief's view of the step being collected: which replicas' gradients it takes."""

    def __init__(self, needed: int, stats: ReplicaStats):
        self.needed, self.stats = needed, stats
        self.step = 0
        self.end = 0              # the step training stops at: no replica computes it
        self.epoch = 0            # bumped on recovery: offers from before it are void
        self.taken: Dict[int, Any] = {}
        self.losses: List[float] = []
        self.stop = False
        self.cond = threading.Condition()

    def offer(self, replica: int, step: int, epoch: int, info: Any, loss: float) -> bool:
        with self.cond:
            if epoch != self.epoch:
                return False
            self.stats.submitted += 1
            if step != self.step or len(self.taken) >= self.needed:
                self.stats.dropped += 1
                why = "stale: computed for step %d, now at step %d" if step != self.step else \
                    "late: step %d already has its gradients (now at step %d)"
                log.info("dropped the gradient of replica %d: " + why, replica, step, self.step)
                return False
            self.taken[replica] = info
            self.losses.append(loss)
            self.stats.accepted += 1
            if len(self.taken) == self.needed:
                self.cond.notify_all()
            return True

    def wait_full(self, timeout: float) -> Optional[Dict[int, Any]]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.taken) < self.needed and not self.stop:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"step {self.step}: only {len(self.taken)} of {self.needed} replica "
                                       f"gradients arrived within {timeout:g} s")
                self.cond.wait(min(left, 0.5))
            return None if self.stop else dict(self.taken)

    def advance(self) -> List[float]:
        with self.cond:
            losses = self.losses
            self.step += 1
            self.taken, self.losses = {}, []
            self.cond.notify_all()
            return losses

    def wait_after(self, step: int) -> Optional[int]:
        """The step to compute next (the current one, once it is past `step`); None when stopping."""
        with self.cond:
            while self.step <= step and not self.stop:
                self.cond.wait(0.5)
            return None if self.stop or self.step >= self.end else self.step

    def current(self) -> Tuple[int, int]:
        with self.cond:
            return self.step, self.epoch

    def halt(self) -> None:
        with self.cond:
            self.stop = True
            self.cond.notify_all()

    def reset(self, step: int, end: int) -> None:
        with self.cond:
            self.step, self.end, self.epoch = step, end, self.epoch + 1
            self.taken, self.losses, self.stop = {}, [], False


@dataclass
class _Replica:
    graph: Graph
    inputs: List[Tensor]
    loss: Tensor
    step_op: Any                       # sync: stores the gradients; async: minimize
    sparse_rows: Dict[str, Tensor]     # variable -> the row count of its sparse gradient (sync)
    device: str
    session: Any = None


@dataclass
class _Chief:
    graph: Graph
    apply_op: Any
    keep: List[Tensor]                 # per replica: [0] when the step takes its dense gradients, else []
    keep_rows: List[Dict[str, Tensor]]  # per replica and sparse variable: the rows the step takes
    init: Any
    init_buffers: Any
    global_step: Tensor
    saver: Saver
    sparse: List[str]                  # variables whose gradients are row-sparse
    session: Any = None


class _Snapshot:
    """Every checkpointed variable read in one step (one RunStep, not one per variable, and
    values of the same moment), for core's Saver, which asks a session variable by variable."""

    def __init__(self, session, variables: Sequence[Variable]):
        self.graph = session.graph
        values = session.run(list(variables))
        self._values = {v.node.name: np.asarray(x) for v, x in zip(variables, values)}

    def variable_value(self, var) -> np.ndarray:
        return self._values[(var.node if isinstance(var, Tensor) else var).name]


class ReplicaTrainer:
    """Replicated training on `cluster` (ps tasks hold the variables, replica r computes on
    worker task r % (number of workers)).

    `session_factory(graph, device)` opens the session of the replica (or chief) whose
    compute runs on `device`; the default connects to that worker task as its master.
    `on_step(step, loss)` is called after each applied step (sync) or update (async).
    """

    def __init__(self, model_fn: Callable[[], Tuple[Tensor, Sequence[Tensor]]], optimizer_fn: Callable[[], Any],
                 batch_fn: Callable[[int, int], Sequence[Any]], cluster: ClusterSpec, mode: str = "sync",
                 replicas: Optional[int] = None, backup: int = 0, seed: int = 0,
                 session_factory: Optional[Callable[[Graph, str], Any]] = None,
                 checkpoint_dir: Optional[str] = None, checkpoint_every: int = 0,
                 restart: Optional[Callable[[str, int], None]] = None, max_restarts: int = 3,
                 step_timeout: float = 60.0, worker_job: str = WORKER_JOB,
                 on_step: Optional[Callable[[int, float], None]] = None):
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
        if worker_job not in cluster.jobs:
            raise ValueError(f"cluster has no '{worker_job}' job for the replicas (jobs: {list(cluster.jobs)})")
        n_workers = cluster.num_tasks(worker_job)
        self.needed = int(replicas or n_workers)
        self.backup = int(backup)
        if self.needed < 1 or self.backup < 0:
            raise ValueError(f"replicas must be >= 1 and backup >= 0, got {replicas} and {backup}")
        if mode == "async" and self.backup:
            raise ValueError("backup workers are a synchronous-training notion; async takes every update")
        if checkpoint_every and not checkpoint_dir:
            raise ValueError("checkpoint_every needs a checkpoint_dir")
        self.model_fn, self.optimizer_fn, self.batch_fn = model_fn, optimizer_fn, batch_fn
        self.cluster, self.mode, self.seed = cluster, mode, seed
        self.checkpoint_dir, self.checkpoint_every = checkpoint_dir, int(checkpoint_every)
        self.restart, self.max_restarts = restart, max_restarts
        self.step_timeout = step_timeout
        self.on_step = on_step
        self.total = self.needed + self.backup
        self.devices = [task_device(worker_job, r % n_workers) for r in range(self.total)]
        self.session_factory = session_factory or self._connect
        self.stats = ReplicaStats()
        self.round = _Round(self.needed, self.stats)
        self._build()

    @property
    def checkpointed_variables(self) -> List[Variable]:
        """What the chief's checkpoints hold (in the chief's graph): the model's variables,
        the optimizer's slots and the global step; not the replicas' gradient buffers."""
        return list(self.chief.saver._var_list)

    # ---- graphs ----------------------------------------------------------------------------------
    def _model(self, g: Graph):
        with g.as_default():
            loss, inputs = self.model_fn()
            get_or_create_global_step(g)
        return loss, list(inputs)

    def _build(self) -> None:
        probe = Graph(seed=self.seed)
        loss, _ = self._model(probe)
        with probe.as_default():
            self.optimizer_fn().minimize(loss, global_step=get_or_create_global_step(probe))
        self.var_devices = variable_devices(probe, self.cluster)
        self.replicas = [self._build_replica(r) for r in range(self.total)]
        self.chief = self._build_chief() if self.mode == "sync" else self._build_async_chief()

    def _grads(self, g: Graph, loss: Tensor):
        vs = trainable_variables(g)
        with g.as_default():
            return [(gr, v) for gr, v in zip(gradients(loss, vs), vs) if gr is not None]

    def _buffers(self, g: Graph, r: int, var: Variable, grad) -> Tuple[Variable, ...]:
        """Replica r's gradient buffer(s) for `var`, on var's device."""
        base = f"{BUFFER_SCOPE}/{r}/{var.node.name}"
        with g.as_default(), g.device(self.var_devices[var.node.name]):
            if isinstance(grad, IndexedSlices):
                vals = Variable(np.zeros((0,) + tuple(var.shape[1:]), var.dtype), shape=(None,) + tuple(var.shape[1:]),
                                name=base + "/values", trainable=False)
                idx = Variable(np.zeros((0,), grad.indices.dtype), shape=(None,), name=base + "/indices",
                               trainable=False)
                return vals, idx
            return (Variable(np.zeros(tuple(var.shape), var.dtype), name=base, trainable=False),)

    def _build_replica(self, r: int) -> _Replica:
        g = Graph(seed=self.seed)
        loss, inputs = self._model(g)
        rows: Dict[str, Tensor] = {}
        with g.as_default():
            if self.mode == "async":
                op = self.optimizer_fn().minimize(loss, global_step=get_or_create_global_step(g))
            else:
                stores = []
                for grad, var in self._grads(g, loss):
                    bufs = self._buffers(g, r, var, grad)
                    if isinstance(grad, IndexedSlices):
                        stores += [bufs[0].assign(grad.values).node, bufs[1].assign(grad.indices).node]
                        rows[var.node.name] = shape_of(grad.indices)
                    else:
                        stores.append(bufs[0].assign(grad).node)
                # batch-norm moving averages and the like: each replica updates them on the ps
                # from its own batch, as a local minimize would (not synchronized, as in TF)
                op = group(*stores, *g.get_collection(UPDATE_OPS), name="store_gradients")
        pin_replica(g, self.devices[r], self.var_devices)
        return _Replica(g, inputs, loss, op, rows, self.devices[r])

    def _build_chief(self) -> _Chief:
        g = Graph(seed=self.seed)
        loss, _ = self._model(g)
        step = get_or_create_global_step(g)
        pairs = self._grads(g, loss)
        ps0 = task_device(PS_JOB, 0) if PS_JOB in self.cluster.jobs else self.devices[0]
        with g.as_default():
            with g.device(ps0):
                keep = [placeholder("int32", (None,), name=f"keep_{r}") for r in range(self.total)]
            keep_rows: List[Dict[str, Tensor]] = [{} for _ in range(self.total)]
            scale = 1.0 / self.needed
            aggregated, sparse = [], []
            for grad, var in pairs:
                bufs = [self._buffers(g, r, var, grad) for r in range(self.total)]
                with g.device(self.var_devices[var.node.name]), g.name_scope(f"aggregate/{var.node.name}/"):
                    s = constant(np.asarray(scale, var.dtype))
                    if isinstance(grad, IndexedSlices):
                        name = var.node.name
                        sparse.append(name)
                        for r in range(self.total):
                            keep_rows[r][name] = placeholder("int32", (None,), name=f"keep_rows_{r}")
                        vals = concat([gather(b[0], keep_rows[r][name]) for r, b in enumerate(bufs)], axis=0)
                        idx = concat([gather(b[1], keep_rows[r][name]) for r, b in enumerate(bufs)], axis=0)
                        aggregated.append((IndexedSlices(mul(vals, s), idx, var), var))
                    else:
                        taken = [reduce_sum(gather(expand_dims(b[0], 0), keep[r]), axis=0)
                                 for r, b in enumerate(bufs)]
                        aggregated.append((mul(add_n(taken) if len(taken) > 1 else taken[0], s), var))
            apply_op = self.optimizer_fn().apply_gradients(aggregated, global_step=step)
            every = global_variables(g)
            buffers = [v for v in every if v.node.name.startswith(BUFFER_SCOPE + "/")]
            saved = [v for v in every if not v.node.name.startswith(BUFFER_SCOPE + "/")]
            init = variables_initializer(every, name="init_all")
            init_buffers = variables_initializer(buffers, name="init_buffers")
        pin_replica(g, self.devices[0], self.var_devices)
        return _Chief(g, apply_op, keep, keep_rows, init, init_buffers, step, Saver(saved, max_to_keep=3), sparse)

    def _build_async_chief(self) -> _Chief:
        g = self.replicas[0].graph  # replica 0's session is the chief's
        with g.as_default():
            every = global_variables(g)
            init = variables_initializer(every, name="init_all")
        return _Chief(g, None, [], [], init, None, get_or_create_global_step(g), Saver(every, max_to_keep=3), [])

    # ---- sessions --------------------------------------------------------------------------------
    def _connect(self, graph: Graph, device: str):
        job, task = device.split("/")[1][4:], int(device.split("/")[2][5:])
        return DistributedSession(graph, "grpc://" + self.cluster.address(job, task), timeout=self.step_timeout)

    def _open(self) -> None:
        self._close()
        for rep in self.replicas:
            rep.session = wait_until(lambda rep=rep: self.session_factory(rep.graph, rep.device),
                                     RECONNECT_TIMEOUT_S, f"connecting replica on {rep.device}")
        if self.mode == "async":
            self.chief.session = self.replicas[0].session
        else:
            self.chief.session = wait_until(lambda: self.session_factory(self.chief.graph, self.devices[0]),
                                            RECONNECT_TIMEOUT_S, "connecting the chief")

    def _close(self) -> None:
        seen = set()
        for s in [r.session for r in self.replicas] + [self.chief.session]:
            if s is not None and id(s) not in seen:
                seen.add(id(s))
                try:
                    s.close()
                except Exception:  # noqa: BLE001  (its task may be gone)
                    pass
        for r in self.replicas:
            r.session = None
        self.chief.session = None

    def _initialize(self) -> int:
        """Restore the latest valid checkpoint, or initialize every variable; the step to go on from."""
        sess = self.chief.session
        if self.checkpoint_dir and latest_checkpoint(self.checkpoint_dir):
            used = self.chief.saver.restore_latest_valid(sess, self.checkpoint_dir, warn=log.warning)
            if self.chief.init_buffers is not None:
                sess.run(self.chief.init_buffers)
            step = int(sess.run(self.chief.global_step))
            self.stats.restored.append((step, used))
            log.info("restored %s (step %d)", used, step)
        else:
            sess.run(self.chief.init)
            step = int(sess.run(self.chief.global_step))
            self.stats.restored.append((step, "init"))
        return step

    def _checkpoint(self, step: int) -> None:
        if self.checkpoint_every and step % self.checkpoint_every == 0:
            self._save(step)

    def _save(self, step: int) -> None:
        snapshot = _Snapshot(self.chief.session, self.chief.saver._var_list)
        path = self.chief.saver.save(snapshot, os.path.join(self.checkpoint_dir, "model"), step)
        self.stats.checkpoints.append(path)

    # ---- training --------------------------------------------------------------------------------
    def train(self, steps: int) -> ReplicaStats:
        """Train until the global step reaches `steps`, recovering from lost tasks."""
        restarts = 0
        settle_until = 0.0  # after a restart: until then, "unreachable" with every task up is a reconnect
        self._open()
        start = wait_until(self._initialize, RECONNECT_TIMEOUT_S, "initializing the variables")
        try:
            while True:
                try:
                    self._run(start, steps)
                    return self.stats
                except Exception as e:  # noqa: BLE001
                    # the error may come from any task that talked to the lost one (a Recv that
                    # failed, wrapped as the op's error), so ask every task whether it is there
                    failure = diagnose(e, self.cluster)
                    if not failure.tasks and not is_task_loss(e):
                        raise                               # a failing op: it would fail again
                    if not failure.tasks and time.monotonic() < settle_until:
                        # every task is up, but one task's channel to the restarted one is still
                        # in gRPC's reconnect backoff: retry from the checkpoint, bounded in time
                        self.stats.retries += 1
                        log.info("retrying: a restarted task is not yet reachable from every task (%s)", e)
                        time.sleep(0.25)
                    else:
                        self.stats.failures.append((self._failed_at, str(failure)))
                        log.warning("%s", failure)
                        if (failure.tasks and self.restart is None) or restarts >= self.max_restarts \
                                or not self.checkpoint_dir:
                            raise failure from e
                        restarts += 1
                        for t in failure.tasks:
                            self.restart(t.job, t.index)
                            self.stats.restarts.append(t.name)
                        settle_until = time.monotonic() + RECONNECT_TIMEOUT_S
                    self._open()
                    start = wait_until(self._initialize, RECONNECT_TIMEOUT_S, "restoring after a failure")
        finally:
            self._close()

    def _run(self, start: int, steps: int) -> None:
        rnd = self.round
        rnd.reset(start, steps)
        errors: List[BaseException] = []
        self._failed_at = time.monotonic()

        def fail(e: BaseException) -> None:
            if not errors:
                self._failed_at = time.monotonic()
            errors.append(e)
            rnd.halt()
        target = self._replica_sync if self.mode == "sync" else self._replica_async
        epoch = rnd.current()[1]
        self._tickets = iter(range(start, steps))
        self._ticket_lock = threading.Lock()
        threads = [threading.Thread(target=self._guard, args=(target, r, epoch, fail), daemon=True,
                                    name=f"isthmus-replica-{r}") for r in range(self.total)]
        for t in threads:
            t.start()
        try:
            if self.mode == "sync":
                self._chief_sync(start, steps, fail)
            else:
                self._chief_async(start, steps, threads)
        except BaseException as e:  # noqa: BLE001
            fail(e)
        finally:
            rnd.halt()
            for t in threads:   # a replica still inside a step must not write a buffer after recovery
                t.join(self.step_timeout * 2 + 15)
            stuck = [t.name for t in threads if t.is_alive()]
            if stuck:  # not a task loss: recovering now could let its late step overwrite a buffer
                raise RuntimeError(f"{', '.join(stuck)} did not stop within {self.step_timeout * 2 + 15:g} s "
                                   f"(twice the step timeout); giving up rather than recovering around it")
        if errors:
            raise errors[0]

    def _guard(self, fn, r: int, epoch: int, fail) -> None:
        try:
            fn(r, epoch)
        except BaseException as e:  # noqa: BLE001
            if not self.round.stop:
                fail(e)

    def _feeds(self, rep: _Replica, step: int, r: int) -> Dict[Tensor, Any]:
        values = self.batch_fn(step, r)
        if len(values) != len(rep.inputs):
            raise ValueError(f"batch_fn(step={step}, replica={r}) gave {len(values)} values for "
                             f"{len(rep.inputs)} inputs ({', '.join(t.name for t in rep.inputs)})")
        return dict(zip(rep.inputs, values))

    def _replica_sync(self, r: int, epoch: int) -> None:
        rep, rnd = self.replicas[r], self.round
        names = list(rep.sparse_rows)
        step = rnd.current()[0]
        while step is not None and step < rnd.end:
            feeds = self._feeds(rep, step, r)
            out = rep.session.run([rep.loss, rep.step_op, [rep.sparse_rows[n] for n in names]], feeds)
            rows = {n: int(np.asarray(v).reshape(-1)[0]) for n, v in zip(names, out[2])}
            rnd.offer(r, step, epoch, rows, float(out[0]))
            step = rnd.wait_after(step)

    def _chief_sync(self, start: int, steps: int, fail) -> None:
        rnd, chief = self.round, self.chief
        for k in range(start, steps):
            t0 = time.monotonic()
            taken = rnd.wait_full(self.step_timeout * 2)
            if taken is None:
                return
            none = np.zeros((0,), np.int32)
            feeds = {}
            for r, keep in enumerate(chief.keep):
                feeds[keep] = np.zeros((1,), np.int32) if r in taken else none
                for name, ph in chief.keep_rows[r].items():
                    feeds[ph] = np.arange(taken[r][name], dtype=np.int32) if r in taken else none
            chief.session.run(chief.apply_op, feeds)
            losses = rnd.advance()
            self.stats.steps = k + 1
            self.stats.losses[k] = float(np.mean(losses))
            self.stats.step_times.append(time.monotonic() - t0)
            self._checkpoint(k + 1)
            if self.on_step is not None:
                self.on_step(k, self.stats.losses[k])

    def _next_ticket(self) -> Optional[int]:
        with self._ticket_lock:
            return next(self._tickets, None)

    def _replica_async(self, r: int, epoch: int) -> None:
        rep, rnd = self.replicas[r], self.round
        while not rnd.stop:
            k = self._next_ticket()
            if k is None:
                return
            t0 = time.monotonic()
            loss, _ = rep.session.run([rep.loss, rep.step_op], self._feeds(rep, k, r))
            with rnd.cond:
                self.stats.submitted += 1
                self.stats.accepted += 1
                self.stats.losses[k] = float(loss)
                self.stats.step_times.append(time.monotonic() - t0)
                if self.on_step is not None:
                    self.on_step(k, float(loss))

    def _chief_async(self, start: int, steps: int, threads) -> None:
        """Checkpoints every `checkpoint_every` updates while the replicas run."""
        next_ckpt = (start // self.checkpoint_every + 1) * self.checkpoint_every if self.checkpoint_every else None
        while any(t.is_alive() for t in threads) and not self.round.stop:
            time.sleep(0.05)
            if next_ckpt is not None:
                done = int(self.chief.session.run(self.chief.global_step))
                if done >= next_ckpt:  # async: the values of one moment, labelled with its step
                    self._save(done)
                    next_ckpt = (done // self.checkpoint_every + 1) * self.checkpoint_every
        self.stats.steps = int(self.chief.session.run(self.chief.global_step))


__all__ = ["ReplicaTrainer", "ReplicaStats", "TaskFailure"]
