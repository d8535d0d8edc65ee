"""Run a plan's independent branches in parallel, when the cost model says that pays.

The serial plan (executor.Plan) is the default: one generated function, no scheduling.
A ParallelRunner executes the same pruned nodes by dependency counting: the calling
thread owns all scheduling state, runs cheap nodes itself, and hands expensive ready
nodes to a small thread pool (numpy releases the GIL in BLAS and most ufunc loops).
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence

from .errors import ExecutionError, IsthmusError
from .graph import Node, Tensor
from . import threads
from .threads import default_inter_op_threads

# rough device figures for the decision only; the partitioner's calibrated model is the real one
_FLOPS_PER_S = 20e9
_BYTES_PER_S = 8e9
_DISPATCH_S = 2e-6
HEAVY_S = 200e-6  # nodes predicted to take longer than this go to the pool

_pools: Dict[int, ThreadPoolExecutor] = {}  # one shared branch pool per size (Session inter_op_threads)
_pool_lock = threading.Lock()


def shared_pool(workers: Optional[int] = None) -> ThreadPoolExecutor:
    """The process's branch pool of `workers` threads (default: threads.default_inter_op_threads)."""
    workers = workers or default_inter_op_threads()
    with _pool_lock:
        pool = _pools.get(workers)
        if pool is None:
            pool = _pools[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="isthmus-op")
        return pool


def predicted_seconds(node: Node) -> float:
    cost = node.opdef.cost
    if cost is None:
        return _DISPATCH_S
    try:
        c = cost(node)
    except Exception:  # a cost function must never break execution
        return _DISPATCH_S
    return _DISPATCH_S + c.flops / _FLOPS_PER_S + (c.bytes_read + c.bytes_written) / _BYTES_PER_S


# Ops whose kernels are BLAS calls that already use every core: running two of them at once
# gains nothing and oversubscribes the cores (a CNN training step ran 30% slower that way).
BLAS_THREADED_OPS = frozenset({"MatMul", "FusedMatMul", "Conv2D", "FusedConv2D", "Conv2DBackpropInput",
                               "Conv2DBackpropFilter"})


# a product OpenBLAS runs threaded by itself (above M*N*K = 4 * 65536; core/ops/intra_op.py)
_BLAS_THREADED_FLOPS = 2 * 4 * 65536


def one_thread_pays(nodes: Sequence[Node], fed: set) -> bool:
    """True when no node is large enough for fan_out to give a second intra-op thread a chunk
    (2 x MIN_CHUNK_FLOPS of product, 2 x MIN_CHUNK_BYTES of a pass) while at least two are
    products that BLAS would thread on its own: each would take fan_out's one-BLAS-thread hold (a
    lock and reads and writes of BLAS's count, about 10 us a product at 2 BLAS threads: a
    transformer at batch 1 ran 38% slower at default threads than at one), where one hold
    around the whole run costs one. Unknown dims count as 1 (the plan checks each run's sizes)."""
    products = 0
    for n in nodes:
        if n.op in ("Const", "Placeholder") or (n.outputs and all(o in fed for o in n.outputs)):
            continue
        if n.opdef.cost is None:
            continue
        try:
            c = n.opdef.cost(n)
        except Exception:  # a cost function must never break execution
            return False
        if c.flops >= 2 * threads.MIN_CHUNK_FLOPS or c.bytes_read + c.bytes_written >= 4 * threads.MIN_CHUNK_BYTES:
            return False
        if n.op in BLAS_THREADED_OPS and c.flops >= _BLAS_THREADED_FLOPS:
            products += 1
    return products >= 2


def parallelism_pays(nodes: Sequence[Node], fed: set) -> bool:
    """True when branches off the critical path hold enough single-threaded work to be worth a
    thread. BLAS-threaded nodes count in the total but not as work a second thread could take."""
    nodes = [n for n in nodes if n.op not in ("Const", "Placeholder")
             and not (n.outputs and all(o in fed for o in n.outputs))]
    t = {id(n): predicted_seconds(n) for n in nodes}
    serial = {id(n): 0.0 if n.op in BLAS_THREADED_OPS else t[id(n)] for n in nodes}
    finish: Dict[int, float] = {}
    inside = {id(n) for n in nodes}
    for n in nodes:
        deps = [x.node for x in n.inputs if x not in fed] + list(n.control_inputs)
        start = max((finish[id(d)] for d in deps if id(d) in inside), default=0.0)
        finish[id(n)] = start + serial[id(n)]
    total = sum(t.values())
    span = max(finish.values(), default=0.0)
    return (sum(serial.values()) - span) > max(0.25 * total, 1e-3)


class ParallelRunner:
    """Executes the nodes of a Plan by dependency counting; same kernels, same results."""

    def __init__(self, plan, workers: Optional[int] = None):
        self.plan = plan
        self.workers = workers or default_inter_op_threads()  # the branch pool's size
        nodes: List[Node] = [n for n in plan.nodes if n in plan.kernels]
        self.nodes = nodes
        pos = {id(n): i for i, n in enumerate(nodes)}
        self.slot_of: Dict[Tensor, int] = {}
        self.n_slots = 0
        for t in plan.feeds:
            self._slot(t)
        for t in plan.constants:
            self._slot(t)
        for n in nodes:
            for t in n.outputs:
                if t not in self.slot_of:
                    self._slot(t)
        self.deps = [0] * len(nodes)
        self.users: List[List[int]] = [[] for _ in nodes]
        self.args: List[List[int]] = []
        self.outs: List[List[int]] = []
        self.heavy: List[bool] = []
        uses = [0] * self.n_slots
        for i, n in enumerate(nodes):
            pred = set()
            for k, t in enumerate(n.inputs):
                if k in n.opdef.ref_inputs:
                    continue
                if id(t.node) in pos and t not in plan.fed:
                    pred.add(pos[id(t.node)])
            pred.update(pos[id(c)] for c in n.control_inputs if id(c) in pos)
            self.deps[i] = len(pred)
            for p in pred:
                self.users[p].append(i)
            a = [self.slot_of[t] for k, t in enumerate(n.inputs) if k not in n.opdef.ref_inputs]
            for s in a:
                uses[s] += 1
            self.args.append(a)
            self.outs.append([self.slot_of[t] if t not in plan.fed else -1 for t in n.outputs])
            self.heavy.append(predicted_seconds(n) > HEAVY_S)
        self.uses = uses
        self.keep = {self.slot_of[f] for f in plan.fetches if isinstance(f, Tensor)}
        self.fetch_slots = [self.slot_of[f] if isinstance(f, Tensor) else -1 for f in plan.fetches]

    def _slot(self, t: Tensor) -> int:
        self.slot_of[t] = self.n_slots
        self.n_slots += 1
        return self.n_slots - 1

    def __call__(self, *feed_values):
        plan = self.plan
        slots: list = [None] * self.n_slots
        for t, v in zip(plan.feeds, feed_values):
            slots[self.slot_of[t]] = v
        for t, v in plan.constants.items():
            slots[self.slot_of[t]] = v
        remaining = list(self.deps)
        uses = list(self.uses)
        ready = [i for i, d in enumerate(remaining) if d == 0]
        done: "queue.Queue" = queue.Queue()
        pool = shared_pool(self.workers)
        in_flight = 0
        kernels = [plan.kernels[n] for n in self.nodes]

        def finish(i, result):
            outs = self.outs[i]
            if len(outs) == 1:
                if outs[0] >= 0:
                    slots[outs[0]] = result
            elif outs:
                for s, v in zip(outs, result):
                    if s >= 0:
                        slots[s] = v
            for s in self.args[i]:
                uses[s] -= 1
                if uses[s] == 0 and s not in self.keep:
                    slots[s] = None  # free after the last use
            for u in self.users[i]:
                remaining[u] -= 1
                if remaining[u] == 0:
                    ready.append(u)

        def call(i):
            try:
                done.put((i, kernels[i](*[slots[s] for s in self.args[i]]), None))
            except BaseException as e:  # reported on the calling thread
                done.put((i, None, e))

        while ready or in_flight:
            while ready:
                i = ready.pop()
                if self.heavy[i] and (ready or in_flight):
                    in_flight += 1
                    pool.submit(call, i)
                else:
                    try:
                        res = kernels[i](*[slots[s] for s in self.args[i]])
                    except Exception as e:
                        self._drain(done, in_flight)
                        raise self._wrap(i, e) from e
                    finish(i, res)
            if in_flight:
                i, res, err = done.get(timeout=3600)
                in_flight -= 1
                if err is not None:
                    self._drain(done, in_flight)
                    raise self._wrap(i, err) from err
                finish(i, res)
        return tuple(plan.copy_fetch(f, slots[s]) if s >= 0 else None
                     for f, s in zip(plan.fetches, self.fetch_slots))

    @staticmethod
    def _drain(done, in_flight: int) -> None:
        for _ in range(in_flight):  # let running kernels finish before the error propagates
            done.get(timeout=3600)

    def _wrap(self, i: int, e: BaseException) -> Exception:
        n = self.nodes[i]
        if isinstance(e, IsthmusError) and getattr(e, "node_name", None) == n.name:
            return e
        return ExecutionError(f"node '{n.name}' ({n.op}) failed: {type(e).__name__}: {e}", n.name, n.op)
