"""Step capture: replay a compiled fixed-shape GPU step as CUDA graphs.

A plan is compiled once, so its GPU kernels can be recorded once and replayed. The first call
runs the plan node by node and records every run of capturable GPU nodes into a CUDA graph
(cupy stream capture); later calls launch the graphs and run only the nodes that cannot be
captured (copies to and from the host, host nodes, and any kernel whose capture failed: one
that synchronizes, or calls cuBLAS, which CuPy 14 refuses during capture; a captured step's 2-D
float32 products use gpu_kernels/gemm.py instead). Values a graph writes are kept for the plan's
life (a graph writes to fixed addresses); the output of a node run eagerly that a graph reads is
copied into a fixed buffer. Every allocation of a captured plan comes from its own memory pool,
so nothing outside the plan ever gets an address a graph writes to.

On the CI stand-in GPU, "capture" records the list of kernels and a launch re-runs them and
copies their results into the recorded arrays: the same segmentation and fixed buffers, tested
without CUDA.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Dict, List, Optional

from .device_runtime import HOST
from .errors import ExecutionError, IsthmusError
from .executor import KernelContext, Plan, prune
from .graph import Node, Tensor
from .passes.copies import input_device
from .shapes import fully_defined

# ops that never go into a graph: they move data to or from the host
_NEVER = frozenset({"DeviceCopy"})


class _Step:
    __slots__ = ("node", "kernel", "ins", "outs", "gpu", "eager_reason")

    def __init__(self, node, kernel, ins, outs, gpu):
        self.node, self.kernel, self.ins, self.outs, self.gpu = node, kernel, ins, outs, gpu
        self.eager_reason: Optional[str] = None if gpu and node.op not in _NEVER else "host or copy"


def _reads_changing_host_value(n: Node) -> bool:
    """A GPU kernel that reads a host input bakes its value into the graph: fine for constants."""
    dev = n.device or HOST
    return any(input_device(n, i, dev) == HOST and t.node.op != "Const"
               for i, t in enumerate(n.inputs) if i not in n.opdef.ref_inputs)


def static_shapes(fetches, feeds) -> bool:
    """Whether every value of the plan has one shape for all runs: fixed feed shapes, and no
    tensor whose shape depends on a fed value (a Pad or Reshape sized at run time, NonZero...),
    which a fixed-shape feed does not rule out. A graph replays at fixed buffers: only such a
    plan may be captured."""
    if not all(fully_defined(t.shape) for t in feeds):
        return False
    fed = set(feeds)
    nodes = prune([f.node if isinstance(f, Tensor) else f for f in fetches], fed)
    return all(fully_defined(t.shape) for n in nodes for t in n.outputs if t not in fed)


class CapturedPlan:
    """A Plan whose GPU work replays as CUDA graphs; callable like a Plan."""

    @classmethod
    def make(cls, fetches, feeds, ctx: KernelContext, binding, mode):
        if not static_shapes(fetches, feeds):
            return Plan(fetches, feeds, ctx, False, binding)  # shapes may vary: capture is off
        binding.capture = True
        try:
            plan = Plan(fetches, feeds, ctx, False, binding)  # its kernels, bound for capture
        finally:
            binding.capture = False
        return cls(plan, binding, ctx)

    def __init__(self, plan: Plan, binding, ctx: Optional[KernelContext] = None):
        self.plan = plan
        self.binding = binding
        self.nodes, self.fetches, self.feeds, self.kernels = plan.nodes, plan.fetches, plan.feeds, plan.kernels
        self.constants = plan.constants
        self.source = plan.source
        slot: Dict[Tensor, int] = {}
        self.init: List[object] = []
        for t in plan.feeds:
            slot[t] = len(self.init)
            self.init.append(None)
        for t, v in plan.constants.items():
            slot[t] = len(self.init)
            self.init.append(v)
        self.steps: List[_Step] = []
        for n in plan.nodes:
            k = plan.kernels.get(n)
            if k is None:
                continue
            outs = []
            for t in n.outputs:
                if t not in slot:
                    slot[t] = len(self.init)
                    self.init.append(None)
                outs.append(slot[t])
            ins = tuple(slot[t] for i, t in enumerate(n.inputs) if i not in n.opdef.ref_inputs)
            step = _Step(n, k, ins, tuple(outs), (n.device or HOST) != HOST)
            if step.eager_reason is None and _reads_changing_host_value(n):
                step.eager_reason = "reads a host value that may change between steps"
            self.steps.append(step)
        self.fetch_slots = [slot[f] if isinstance(f, Tensor) else None for f in plan.fetches]
        # the variables whose arrays the graphs read or update at fixed addresses: a slot given a
        # new array (a checkpoint restore, set_variable_value, an Assign of another shape) makes
        # the next call record the step again instead of replaying stale addresses
        self._var_slots = []
        if ctx is not None:
            seen = set()
            for st in self.steps:
                n = st.node
                vars_ = [n] if n.op == "Variable" else [n.inputs[i].node for i in n.opdef.ref_inputs]
                for vn in vars_:
                    if vn.op == "Variable" and vn.name not in seen:
                        seen.add(vn.name)
                        self._var_slots.append(ctx.var_slot(vn))
        self._var_arrays: list = []
        self.gpu = binding.table.gpus()[0]
        self.segments: Optional[list] = None  # ("graph", graph, steps) | ("eager", step, fixed)
        self.values: List[object] = list(self.init)
        self._graph_read: set = set()
        self._current: Optional[_Step] = None  # the step running now (errors name its node)
        self._lock = threading.Lock()
        self._make_runtime()

    def _make_runtime(self) -> None:
        if self.gpu.simulated:
            self.stream, self.pool = None, None
            return
        cp = self.gpu.cp
        self.stream = cp.cuda.Stream()  # blocking: host copies on the legacy stream stay ordered
        self.pool = cp.cuda.MemoryPool()
        self.pool.set_limit(size=self.gpu.cap_bytes)

    def _context(self):
        if self.stream is None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(self.gpu.cp.cuda.using_allocator(self.pool.malloc))
        stack.enter_context(self.stream)
        return stack

    # ---- running --------------------------------------------------------------------------------
    def __call__(self, *feeds):
        with self._lock:
            return self._call(feeds)

    def _call(self, feeds):
        try:
            with self._context():
                if self.segments is not None and any(
                        sl.value is not a for sl, a in zip(self._var_slots, self._var_arrays)):
                    self._forget()  # a variable's array was replaced since the recording
                if self.segments is None:
                    self._record(feeds)
                    self._var_arrays = [sl.value for sl in self._var_slots]
                else:
                    self._replay(feeds)
        except Exception as e:
            self._raise(e)
        v = self.values
        if self.pool is not None:
            self.binding.last_peak[self.gpu.name] = int(self.pool.total_bytes())
        return tuple(None if i is None else v[i] for i in self.fetch_slots)

    def _run_step(self, s: _Step) -> None:
        v = self.values
        self._current = s
        out = s.kernel(*[v[i] for i in s.ins])
        if len(s.outs) == 1:
            v[s.outs[0]] = out
        else:
            for i, o in zip(s.outs, out or ()):
                v[i] = o

    def _record(self, feeds) -> None:
        """The first call: run every node, recording runs of capturable GPU nodes as graphs."""
        v = self.values
        for i, f in enumerate(feeds):
            v[i] = f
        segments: list = []
        steps, i = self.steps, 0
        while i < len(steps):
            if steps[i].eager_reason is not None:
                self._run_step(steps[i])
                segments.append(["eager", steps[i], None])
                i += 1
                continue
            j, graph = self._capture_from(i)
            if graph is None:
                continue  # steps[j] is now eager: capture again up to it
            segments.append(["graph", graph, steps[i:j]])
            for s in steps[i:j]:
                self._graph_read.update(s.ins)
            i = j
        for seg in segments:  # eager GPU outputs that a graph reads need fixed buffers
            if seg[0] == "eager" and seg[1].gpu and any(o in self._graph_read for o in seg[1].outs):
                seg[2] = [v[o] for o in seg[1].outs]
        self.segments = segments

    def _forget(self) -> None:
        """Drop the recorded graphs and fixed buffers: the next call records afresh."""
        self.segments = None
        self.values = list(self.init)
        self._graph_read = set()

    def _capture_from(self, i: int):
        """Capture steps i.. up to the next eager one; (end, graph), or (failing step, None)."""
        steps, j = self.steps, i
        begin, end = self._begin(), None
        try:
            while j < len(steps) and steps[j].eager_reason is None:
                self._run_step(steps[j])
                j += 1
            end = j
            graph = self._end()
        except Exception as e:
            self._abort()
            if end is not None:  # the capture itself failed at the end: run the whole run eagerly
                for s in steps[i:end]:
                    s.eager_reason = f"capture failed: {type(e).__name__}: {e}"[:200]
            else:
                steps[j].eager_reason = f"{type(e).__name__}: {e}"[:200]
            return j, None
        del begin
        if self.stream is not None:  # captured work has not run yet (the stand-in's has)
            graph.launch(self.stream)
        return end, graph

    def _begin(self):
        if self.stream is not None:
            self.stream.begin_capture()
        return True

    def _end(self):
        if self.stream is None:
            return "recorded"
        return self.stream.end_capture()

    def _abort(self) -> None:
        if self.stream is not None and self.stream.is_capturing():
            try:
                self.stream.end_capture()
            except Exception:
                pass

    def _launch(self, graph, seg_steps) -> None:
        if self.stream is not None:
            graph.launch(self.stream)
            return
        # the stand-in: re-run the kernels and write their results where the recorded ones are;
        # a variable read keeps the array it gave when recorded, as a CUDA graph reads that address
        v, xp = self.values, self.gpu.xp
        kept = {o: v[o] for s in seg_steps for o in s.outs}
        for s in seg_steps:
            if s.node.op != "Variable":
                self._run_step(s)
        for o, arr in kept.items():  # in node order: a view's base is rewritten before the view
            if arr is not None and v[o] is not arr:
                if getattr(arr, "flags", None) is not None and arr.flags.writeable:
                    xp.copyto(arr, v[o])
                v[o] = arr

    def _replay(self, feeds) -> None:
        v = self.values
        for i, f in enumerate(feeds):
            v[i] = f
        for kind, a, b in self.segments:
            if kind == "graph":
                self._launch(a, b)
                continue
            self._run_step(a)
            if b is not None:  # a graph reads this output at the address it had when recorded
                for o, fixed in zip(a.outs, b):
                    if v[o] is not fixed:
                        self.gpu.xp.copyto(fixed, v[o])
                        v[o] = fixed

    def _raise(self, e: Exception) -> None:
        if isinstance(e, IsthmusError):
            raise e
        n = getattr(self._current, "node", None)
        if n is None:
            raise ExecutionError(f"captured step failed: {type(e).__name__}: {e}") from e
        self.binding.raise_out_of_memory(e, n)  # a DeviceMemoryError naming the node, shape and cap
        raise ExecutionError(f"node '{n.name}' ({n.op}) failed: {type(e).__name__}: {e}", n.name, n.op) from e

    # ---- what was captured ------------------------------------------------------------------------
    def report(self) -> dict:
        """How the step was split: graphs, the nodes in them, and each eager GPU node with its reason."""
        if self.segments is None:
            return {"recorded": False}
        graphs = [seg for seg in self.segments if seg[0] == "graph"]
        eager = [seg[1] for seg in self.segments if seg[0] == "eager"]
        return {"recorded": True, "graphs": len(graphs), "captured_nodes": sum(len(s[2]) for s in graphs),
                "eager_nodes": len(eager),
                "eager_gpu_nodes": {s.node.name: s.eager_reason for s in eager if s.gpu}}

    def copy_fetch(self, f, value):
        return self.plan.copy_fetch(f, value)


# ops that meet other processes or replicas step by step: Send and Recv count their runs per plan
# (ops/comm.py: one plan for a part's life), AllReduce's replicas must all run it eagerly or all
# replay it. capture="auto" leaves plans holding them eager.
RENDEZVOUS_OPS = frozenset({"Send", "Recv", "AllReduce"})


class AutoCapture:
    """capture="auto" (the Session default): a fixed-shape GPU plan runs as compiled for its first
    call and is captured from its second on, so one-off plans (an initializer, a single
    evaluation) are never recorded and never hold a captured plan's fixed buffers, while a step
    run in a loop (training, serving) replays as CUDA graphs. Traced runs use the eager plan."""

    def __init__(self, eager: Plan, build):
        self.eager, self._build = eager, build
        self.captured: Optional[CapturedPlan] = None
        self.calls = 0
        self._lock = threading.Lock()
        self.nodes, self.fetches, self.feeds, self.kernels = eager.nodes, eager.fetches, eager.feeds, eager.kernels
        self.constants, self.source = eager.constants, eager.source
        self.binding = eager.binding

    def __call__(self, *feeds):
        plan = self.captured
        if plan is None:
            with self._lock:
                self.calls += 1
                if self.calls >= 2 and self.captured is None:
                    self.captured = self._build()
                    for d in self.binding.table.gpus():
                        getattr(d, "release_cached", lambda: None)()
                plan = self.captured or self.eager
        return plan(*feeds)

    def report(self) -> dict:
        rep = self.captured.report() if self.captured is not None else {"recorded": False}
        return {**rep, "auto": True, "calls": self.calls}

    def copy_fetch(self, f, value):
        return self.eager.copy_fetch(f, value)

