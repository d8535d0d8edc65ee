"""Run a plan's independent branches in parallel, when the cost model says that pays.

The serial plan (executor.Plan) is the default: one generated function, no scheduling.
A ParallelRunner executes the same pruned nodes by dependency counting: the calling
thread owns all scheduling state, runs cheap nodes itself, and hands expensive ready
nodes to a small thread pool (numpy releases the GIL in BLAS and most ufunc loops).
BranchCosts is the one rule that chooses between them per run: the serial plan with each big
node split across the intra-op threads, or the branches side by side at one intra-op thread each.
"""
from __future__ import annotations

import heapq
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence

from .errors import ExecutionError, IsthmusError
from .graph import Node, Tensor
from . import threads
from .threads import default_inter_op_threads

# rough one-core figures for the decisions only (the partitioner's calibrated model is the real
# one), fitted to the one-thread CPU time of seven imported models at batch 1 and 32 (the
# converters_infer set plus a bidirectional LSTM; each predicted within 0.6-1.5x, 2026-11-27)
_FLOPS_PER_S = 50e9
_BYTES_PER_S = 16e9
_DISPATCH_S = 2e-6

NODE_WAIT_S = 3600.0  # the longest the branch runner waits for one node on the pool
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


# Ops whose kernels are products that use every intra-op thread (split on the pool, or BLAS's own
# threads): branches of them run concurrently only at one intra-op thread each (BranchCosts), since
# two at full width oversubscribe the cores (a CNN training step ran 30% slower that way).
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


# ops whose kernels cut their own work across the intra-op threads (core/ops/intra_op.py): products
# by rows or columns (their FLOPs in chunks of MIN_CHUNK_FLOPS; BLAS threads the others itself), and
# passes by rows (their bytes in chunks of MIN_CHUNK_BYTES). Any other op runs on one thread.
# Forward convolutions split by images or rows in bytes (rows_apply), not by FLOPs: at Inception's
# batch-32 sizes none reaches two chunks at the VM's measured chunk size, and the serial plan at
# default threads ran on one core (process CPU = wall, 86 ms either way, 14:21 UTC).
# Since issue 24's threads work (par_gate.split_rows) the forward convolutions' batches, pixel blocks and
# weight panels split by FLOPs again (prange, or the pool where the machine is busy): products here.
_SPLIT_PASS_OPS = frozenset({"MaxPool", "MaxPoolGrad", "AvgPool", "AvgPoolGrad", "BiasAdd", "BiasAddGrad"})
_SPLIT_PRODUCT_OPS = frozenset({"MatMul", "FusedMatMul", "Conv2D", "FusedConv2D", "FusedConv2DAdd",
                                "Conv2DBackpropInput", "Conv2DBackpropFilter"})
# a node split k ways runs its split part about k * 0.85 times faster, not k: each thread packs
# the shared operand of a product again, and the caller waits for the slowest chunk (2-way splits
# of 25-100 MFLOP products on the VM: 0.8-1.6x, which this and the hand-off reproduce within 10%)
SPLIT_EFFICIENCY = 0.85
BRANCH_MARGIN = 0.8  # branches must beat the serial plan's predicted time by 20%: the model is rough
# a node goes to the branch pool only with about ten hand-offs of work (the rule threads' chunk
# sizes follow): a bidirectional LSTM at batch 1, two 0.2 ms directions handed off at a measured
# 50-60 us each, ran 1.3-1.4x slower as branches than serially on the loaded VM (load 2-7)
HEAVY_HANDOFFS = 10
_RUNNER_NODE_S = 3e-6  # the branch runner's own bookkeeping per node (heap, counts), on the caller


def handoff_seconds() -> float:
    """A hand-off of one piece of work to another thread and back (threads.handoff_s: measured
    once per process; 45-140 us on the 2-core development VM, whose idle cores halt)."""
    return threads.handoff_s()


def chunk_sizes() -> tuple:
    """(FLOPs, bytes): the least work fan_out gives a thread of a split product or pass on this
    machine (threads.min_chunk_flops/min_chunk_bytes, scaled by the measured hand-off)."""
    return threads.min_chunk_flops(), threads.min_chunk_bytes()


def runnable(nodes: Sequence[Node], fed: set) -> List[Node]:
    return [n for n in nodes if n.op not in ("Const", "Placeholder")
            and not (n.outputs and all(o in fed for o in n.outputs))]


class BranchCosts:
    """The cost rule for branch parallelism, written once: per node of a plan, its predicted
    one-thread time at a run's scale (the product of the feeds' unknown dims: nodes whose outputs
    have an unknown dim scale with it, the others do not), and two predictions:
    - serial_seconds: the nodes one after another, each cut across `intra` threads where its
      kernel splits (chunk sizes and hand-off of core/threads.py): the FLOPs of a product or the
      bytes of a pass divide by the chunks, the rest of the node does not;
    - branch_seconds: the nodes on `workers` threads at one intra-op thread each, by list
      scheduling (longest path to the end first) as ParallelRunner runs them: heavy nodes on the
      first free thread, each paying a hand-off; light ones on the calling thread.
    Branches run only where they beat the serial plan by BRANCH_MARGIN: when the nodes are too
    small to split on this machine (or intra-op threads are 1), not when the big nodes are split."""

    def __init__(self, nodes: Sequence[Node], preds: Sequence[Sequence[int]]):
        self.n = len(nodes)
        self.preds = [list(p) for p in preds]
        self.flops, self.nbytes, self.kind, self.scales, self.fixed = [], [], [], [], []
        for n in nodes:
            c = _cost(n)
            self.flops.append(c[0] if c else 0.0)
            self.nbytes.append(c[1] if c else 0.0)
            self.kind.append("product" if n.op in _SPLIT_PRODUCT_OPS else "pass" if n.op in _SPLIT_PASS_OPS else "")
            self.scales.append(any(d is None for o in n.outputs for d in o.shape))
            # bytes that do not grow with the unknown dims (weights): those of tensors of known shape
            self.fixed.append(max(0.0, self.nbytes[-1] - _unknown_bytes(n)))
        users: List[List[int]] = [[] for _ in range(self.n)]
        for i, p in enumerate(self.preds):
            for j in p:
                users[j].append(i)
        self.users = users
        t = self.seconds(1)
        self.priority = [0.0] * self.n  # the longest predicted path from the node to the end
        for i in reversed(range(self.n)):
            self.priority[i] = t[i] + max((self.priority[u] for u in users[i]), default=0.0)

    def work(self, scale: float):
        """Each node's (FLOPs, bytes) when the run's unknown dims multiply to `scale`: FLOPs grow
        with it where the node's outputs have an unknown dim, bytes where its tensors do."""
        return [((scale if s else 1.0) * f, fx + (scale if s else 1.0) * (b - fx))
                for f, b, s, fx in zip(self.flops, self.nbytes, self.scales, self.fixed)]

    def seconds(self, scale: float) -> List[float]:
        """Each node's predicted one-thread time at `scale`."""
        return [_DISPATCH_S + f / _FLOPS_PER_S + b / _BYTES_PER_S for f, b in self.work(scale)]

    def serial_seconds(self, scale: float, intra: int) -> float:
        h, total = handoff_seconds(), 0.0
        chunk_flops, chunk_bytes = chunk_sizes()
        for (f, b), kind in zip(self.work(scale), self.kind):
            tf, tb = f / _FLOPS_PER_S, b / _BYTES_PER_S
            chunks = 1
            if intra > 1 and kind == "product":
                chunks = int(min(intra, f // chunk_flops))
                tf = tf / (chunks * SPLIT_EFFICIENCY) if chunks > 1 else tf
            elif intra > 1 and kind == "pass":
                chunks = int(min(intra, b // chunk_bytes))
                tb = tb / (chunks * SPLIT_EFFICIENCY) if chunks > 1 else tb
            total += _DISPATCH_S + tf + tb + (h if chunks > 1 else 0.0)
        return total

    def heavy(self, scale: float, h: Optional[float] = None) -> List[bool]:
        """Nodes worth a hand-off (`h`, default handoff_seconds()) to the branch pool: those that
        carry HEAVY_HANDOFFS hand-offs of work, as threads' chunk sizes do."""
        h = handoff_seconds() if h is None else h
        return [t > HEAVY_HANDOFFS * h for t in self.seconds(scale)]

    def branch_seconds(self, scale: float, workers: int, h: Optional[float] = None) -> float:
        h = handoff_seconds() if h is None else h
        t, heavy = self.seconds(scale), self.heavy(scale, h)
        waiting = [len(p) for p in self.preds]
        ready = [(-self.priority[i], i) for i in range(self.n) if waiting[i] == 0]
        heapq.heapify(ready)
        free = [0.0] * max(1, workers)  # when each worker thread is next idle
        finish = [0.0] * self.n
        end = 0.0
        while ready:
            _, i = heapq.heappop(ready)
            w = free.index(min(free)) if heavy[i] else 0  # light nodes run on the calling thread
            start = max(max((finish[j] for j in self.preds[i]), default=0.0), free[w])
            finish[i] = free[w] = start + t[i] + (h if heavy[i] else 0.0) + _RUNNER_NODE_S
            end = max(end, finish[i])
            for u in self.users[i]:
                waiting[u] -= 1
                if waiting[u] == 0:
                    heapq.heappush(ready, (-self.priority[u], u))
        return end

    def branches_pay(self, scale: float, intra: int, workers: int) -> bool:
        """Whether running branches concurrently at one intra-op thread each beats the serial plan."""
        workers = min(workers, threads.cores())
        if workers < 2 or self.n < 2:
            return False
        return self.branch_seconds(scale, workers) < BRANCH_MARGIN * self.serial_seconds(scale, intra)

    def has_width(self, workers: int) -> bool:
        """Whether the graph has branches at all that could pay at some scale: large work, free
        hand-offs (nothing is measured for a plan without width), one intra-op thread."""
        if self.n < 2 or min(workers, threads.cores()) < 2:
            return False
        serial = sum(self.seconds(1e6))
        return self.branch_seconds(1e6, min(workers, threads.cores()), 0.0) < BRANCH_MARGIN * serial


def _cost(n: Node):
    if n.opdef.cost is None:
        return None
    try:
        c = n.opdef.cost(n)
    except Exception:  # a cost function must never break execution
        return None
    return c.flops, c.bytes_read + c.bytes_written


def _unknown_bytes(n: Node) -> float:
    """Bytes of the node's inputs and outputs whose shapes have unknown dims, counted as 1."""
    total = 0.0
    for t in list(n.inputs) + list(n.outputs):
        if any(d is None for d in t.shape):
            k = 1
            for d in t.shape:
                k *= 1 if d is None else d
            total += k * t.dtype.itemsize
    return total


def graph_preds(nodes: Sequence[Node], fed: set) -> List[List[int]]:
    """For each node, the positions in `nodes` of the nodes it waits for (data inputs that are not
    fed or references, and control inputs)."""
    pos = {id(n): i for i, n in enumerate(nodes)}
    out = []
    for n in nodes:
        pred = {pos[id(t.node)] for k, t in enumerate(n.inputs)
                if k not in n.opdef.ref_inputs and id(t.node) in pos and t not in fed}
        pred.update(pos[id(c)] for c in n.control_inputs if id(c) in pos)
        out.append(sorted(pred))
    return out


def parallelism_pays(nodes: Sequence[Node], fed: set, intra: int = 1, workers: Optional[int] = None,
                     scale: float = 1.0) -> bool:
    """BranchCosts' rule over a plan's nodes at `scale`, `intra` and `workers` (default: the pool's)."""
    nodes = runnable(nodes, fed)
    return BranchCosts(nodes, graph_preds(nodes, fed)).branches_pay(scale, intra, workers or default_inter_op_threads())


class ParallelRunner:
    """Executes the nodes of a Plan by dependency counting; same kernels, same results."""

    def __init__(self, plan, workers: Optional[int] = None, costs: Optional[BranchCosts] = None):
        """`costs`: the plan's BranchCosts when the caller made them already (same nodes)."""
        self.plan = plan
        self.workers = workers or default_inter_op_threads()  # the branch pool's size
        nodes: List[Node] = [n for n in plan.nodes if n in plan.kernels]
        self.nodes = nodes
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
        preds = graph_preds(nodes, plan.fed)
        self.costs = costs if costs is not None and costs.n == len(nodes) else BranchCosts(nodes, preds)
        self._choices: Dict[tuple, object] = {}  # (scale, intra) -> the heavy flags, or False: run serially
        self._heavy: Dict[float, List[bool]] = {}
        self.deps = [len(p) for p in preds]
        self.users = self.costs.users
        self.priority = self.costs.priority
        self.args: List[List[int]] = []
        self.outs: List[List[int]] = []
        uses = [0] * self.n_slots
        for n in nodes:
            a = [self.slot_of[t] for k, t in enumerate(n.inputs) if k not in n.opdef.ref_inputs]
            for s in a:
                uses[s] += 1
            self.args.append(a)
            self.outs.append([self.slot_of[t] if t not in plan.fed else -1 for t in n.outputs])
        self.heavy = self.costs.heavy(1.0)
        self.uses = uses
        self.keep = {self.slot_of[f] for f in plan.fetches if isinstance(f, Tensor)}
        self.fetch_slots = [self.slot_of[f] if isinstance(f, Tensor) else -1 for f in plan.fetches]

    def choose(self, scale: float, intra: int, workers: Optional[int] = None):
        """For a run at `scale` whose serial plan would have `intra` threads: the nodes to hand to the
        pool when branches on `workers` threads (default: the pool's size) pay
        (BranchCosts.branches_pay), else False. Remembered per (scale, intra, workers)."""
        workers = workers or self.workers
        key = (scale, intra, workers)
        choice = self._choices.get(key)
        if choice is None:
            if len(self._choices) >= 64:  # a plan fed ever new sizes: forget, never grow without bound
                self._choices.clear()
            pays = self.costs.branches_pay(scale, intra, workers)
            choice = self._choices[key] = self.heavy_at(scale) if pays else False
        return choice

    def heavy_at(self, scale: float) -> List[bool]:
        """The nodes worth a hand-off at `scale` (BranchCosts.heavy), remembered per scale."""
        heavy = self._heavy.get(scale)
        if heavy is None:
            if len(self._heavy) >= 64:
                self._heavy.clear()
            heavy = self._heavy[scale] = self.costs.heavy(scale)
        return heavy

    def _slot(self, t: Tensor) -> int:
        self.slot_of[t] = self.n_slots
        self.n_slots += 1
        return self.n_slots - 1

    def __call__(self, *feed_values, heavy: Optional[List[bool]] = None):
        """Run the plan; `heavy` (default: the nodes heavy at scale 1) says which nodes go to the pool."""
        plan = self.plan
        heavy = heavy or self.heavy
        priority = self.priority
        slots: list = [None] * self.n_slots
        for t, v in zip(plan.feeds, feed_values):
            slots[self.slot_of[t]] = v
        for t, v in plan.constants.items():
            slots[self.slot_of[t]] = v
        remaining = list(self.deps)
        uses = list(self.uses)
        ready = [(-priority[i], i) for i, d in enumerate(remaining) if d == 0]  # longest path first
        heapq.heapify(ready)
        done: "queue.Queue" = queue.Queue()
        pool = shared_pool(self.workers)
        in_flight = 0
        running: set = set()  # the nodes on the pool now
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
                    heapq.heappush(ready, (-priority[u], u))

        def call(i):
            try:
                done.put((i, kernels[i](*[slots[s] for s in self.args[i]]), None))
            except BaseException as e:  # reported on the calling thread
                done.put((i, None, e))

        while ready or in_flight:
            while ready:
                _, i = heapq.heappop(ready)
                if heavy[i] and (ready or in_flight):
                    in_flight += 1
                    running.add(i)
                    pool.submit(call, i)
                else:
                    try:
                        res = kernels[i](*[slots[s] for s in self.args[i]])
                    except Exception as e:
                        self._drain(done, in_flight)
                        raise self._wrap(i, e) from e
                    finish(i, res)
            if in_flight:
                i, res, err = self._next_done(done, running)
                in_flight -= 1
                running.discard(i)
                if err is not None:
                    self._drain(done, in_flight)
                    raise self._wrap(i, err) from err
                finish(i, res)
        return tuple(plan.copy_fetch(f, slots[s]) if s >= 0 else None
                     for f, s in zip(plan.fetches, self.fetch_slots))

    def _next_done(self, done, running: set):
        """The next (node, result, error) a pool thread reports; an error naming the nodes running
        if none reports within NODE_WAIT_S (a kernel that never returns must not hang the run silently)."""
        try:
            return done.get(timeout=NODE_WAIT_S)
        except queue.Empty:
            names = ", ".join(f"'{self.nodes[i].name}' ({self.nodes[i].op})" for i in sorted(running))
            first = self.nodes[min(running)] if running else None
            raise ExecutionError(f"branch runner: no node finished within {NODE_WAIT_S:g} s; still running: {names}",
                                 first.name if first else None, first.op if first else None) from None

    @staticmethod
    def _drain(done, in_flight: int) -> None:
        for _ in range(in_flight):  # let running kernels finish before the error propagates
            try:
                done.get(timeout=NODE_WAIT_S)
            except queue.Empty:
                return

    def _wrap(self, i: int, e: BaseException) -> Exception:
        n = self.nodes[i]
        if isinstance(e, IsthmusError) and getattr(e, "node_name", None) == n.name:
            return e
        return ExecutionError(f"node '{n.name}' ({n.op}) failed: {type(e).__name__}: {e}", n.name, n.op)
