"""Session: runs fetches of a graph, compiling one plan per (fetches, feeds) signature."""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .capture import RENDEZVOUS_OPS, AutoCapture, CapturedPlan, static_shapes
from .device_binding import DeviceBinding
from .device_runtime import DeviceTable, HOST, to_host_any
from .errors import FeedError
from .executor import KernelContext, Plan, SessionState, prune
from .fetches import feed_check, fetch_key, flatten, resolve_feed, resolve_fetch
from .graph import Graph, Node, Tensor, get_default_graph
from .memory import tune_malloc
from .ops.numerics import checked_feed
from .passes import SESSION_PASSES, optimize
from .passes.copies import assign_devices, host_variables, insert_copies, needs_devices
from .shapes import compatible, fmt
from .threads import IntraOpThreads, check_option, default_inter_op_threads
from .trace import RunMetadata, run_traced


_REMOTE: List[Callable[[Optional[Graph], str], Any]] = []  # the factory for "grpc://" targets, once registered


def register_remote_session(factory: Callable[[Optional[Graph], str], Any]) -> None:
    """Makes `Session(graph, target="grpc://host:port")` return `factory(graph, target)`.
    core imports nothing of the cloud runtime (DESIGN.md): isthmus.cloud registers its
    DistributedSession when imported, and `isthmus.Session` imports isthmus.cloud first."""
    _REMOTE[:] = [factory]


class Session:
    """`Session(graph).run(fetches, feed_dict)`; fetches may be a Tensor, a Node, a name,
    or a (nested) list, tuple or dict of these. Safe to call from several threads at once.
    `Session(graph, target="grpc://host:port")` runs the graph on a cluster instead (a
    cloud DistributedSession, with the same run/close interface).
    """

    def __new__(cls, graph: Optional[Graph] = None, target: Optional[str] = None, *args, **kwargs):
        if target is None:
            return super().__new__(cls)
        if not isinstance(target, str) or not target.startswith("grpc://"):
            raise ValueError(f"target {target!r}: expected 'grpc://host:port' (a task of a cluster), "
                             "or no target to run on this machine")
        if args or kwargs:
            raise ValueError(f"target {target!r}: a distributed session takes no "
                             f"{', '.join(sorted(kwargs)) or 'local-session options'}")
        if not _REMOTE:
            raise RuntimeError(f"target {target!r}: no cluster runtime is registered; import isthmus.cloud "
                               "first (isthmus.Session does), or run without a target on this machine")
        # not a Session subclass, so Python does not run __init__ on it again
        return _REMOTE[0](graph, target)

    def __init__(self, graph: Optional[Graph] = None, target: Optional[str] = None,
                 parallel: "bool | str" = "auto", rendezvous=None, optimize: bool = True,
                 device: Optional[str] = None, gpu: Optional[str] = None, gpu_memory=None,
                 capture: "bool | str" = "auto", check_numerics: bool = False,
                 intra_op_threads: Optional[int] = None, inter_op_threads: Optional[int] = None):
        """device: where unpinned nodes run: "cpu" (default; ISTHMUS_DEVICE overrides), "gpu", "auto"
        (a GPU when one is usable) or a name such as "/device:GPU:1". gpu: "cuda" (cupy) or
        "simulated" (the CI stand-in; default ISTHMUS_GPU, else "cuda"). gpu_memory: the device memory cap, a fraction or bytes
        (default ISTHMUS_GPU_MEMORY, else 0.8 of the device). capture: replay fixed-shape GPU steps
        as CUDA graphs (core/capture.py): True captures every fixed-shape GPU plan on its first
        run, "auto" (default) from its second (a step run in a loop; one-off plans stay eager),
        False never.
        check_numerics: check every float output of every node as it runs (and every float
        feed); the first holding NaN or Inf fails the step with a NonFiniteError naming that node
        (core/ops/numerics.py). Off by default: it costs about one pass over each output.
        intra_op_threads: threads one kernel may use (BLAS, compiled kernels; default: BLAS's count
        now, the cores unless the process limited it).
        inter_op_threads: the branch pool's threads (1: run serially; default max(2, min(8, cores)),
        of which a run uses at most its intra-op budget (intra_op_threads, else BLAS's count): a
        session limited to one thread, or a process limited to one BLAS thread, runs on one thread
        unless inter_op_threads is given); as TensorFlow's ConfigProto (core/threads.py). Branches
        run only where the cost rule says they pay (core/scheduler.py)."""
        self.graph = graph if graph is not None else get_default_graph()
        tune_malloc()  # once per process: runs reuse freed buffers instead of faulting them in (core/memory.py)
        self.devices = DeviceTable(device or os.environ.get("ISTHMUS_DEVICE") or "cpu",
                                   gpu or os.environ.get("ISTHMUS_GPU") or "cuda", gpu_memory)
        self.state = SessionState(rendezvous, self.devices)
        self._ctx = KernelContext(np, self.state)
        self._ctx.check_numerics = self.check_numerics = bool(check_numerics)
        self._binding = None
        if self.devices.default != HOST:
            self.devices.get(self.devices.default)  # fails now, naming the reason, when there is no GPU
            self._binding = DeviceBinding(self.devices, self.state)
        if capture not in (True, False, "auto"):
            raise ValueError(f"capture must be True, False or 'auto', got {capture!r}")
        self.capture = capture
        self._plans: Dict[Any, Tuple[Plan, Callable, list]] = {}
        self._lock = threading.Lock()
        self._closed = False
        if parallel not in (True, False, "auto"):
            raise ValueError(f"parallel must be True, False or 'auto', got {parallel!r}")
        self.intra_op_threads = check_option(intra_op_threads, "intra_op_threads", None)
        self.inter_op_threads = check_option(inter_op_threads, "inter_op_threads", default_inter_op_threads())
        # the branch pool's size as given; None: the default, held to the run's intra-op budget
        self._workers = None if inter_op_threads is None else self.inter_op_threads
        if self.inter_op_threads == 1:
            if parallel is True:
                raise ValueError("Session options parallel=True and inter_op_threads=1 disagree: "
                                 "one inter-op thread runs the plan serially")
            parallel = False
        self._threads = IntraOpThreads(self.intra_op_threads)
        self.parallel = parallel  # "auto": run branches on a thread pool when the cost model says it pays
        self.optimize = optimize  # run the graph passes (core/passes) on each plan's subgraph

    # ---- running ----------------------------------------------------------------------
    def run(self, fetches, feed_dict: Optional[Dict] = None, options=None, run_metadata=None):
        """Run `fetches`. With options=RunOptions(trace=True), per-node timings go to run_metadata."""
        if self._closed:
            raise RuntimeError("this Session is closed")
        feed_dict = feed_dict or {}
        key = (fetch_key(fetches), tuple(feed_dict))
        entry = self._plans.get(key)
        if entry is None:
            entry = self._compile(key, fetches, feed_dict)
        plan, unflatten, checks = entry
        with self._threads:
            if options is not None and options.trace:
                md = run_metadata if run_metadata is not None else RunMetadata()
                plan = getattr(plan, "eager", plan)  # capture="auto": trace the plan node by node
                return unflatten(run_traced(plan, [c(v) for c, v in zip(checks, feed_dict.values())], md))
            if checks:
                values = [check(v) for check, v in zip(checks, feed_dict.values())]
                return unflatten(plan(*values))
            return unflatten(plan())

    def make_callable(self, fetches, feed_list=()) -> Callable:
        """A function f(*feed_values) that runs `fetches`, skipping the per-call key lookup."""
        feed_list = list(feed_list)
        entry = self._compile(None, fetches, {f: None for f in feed_list})
        plan, unflatten, checks = entry

        def call(*values):
            with self._threads:
                return unflatten(plan(*[c(v) for c, v in zip(checks, values)]))
        return call

    def plan_for(self, fetches, feed_dict: Optional[Dict] = None) -> Plan:
        """The compiled plan that `run(fetches, feed_dict)` uses (compiling it if needed)."""
        feed_dict = feed_dict or {}
        key = (fetch_key(fetches), tuple(feed_dict))
        entry = self._plans.get(key) or self._compile(key, fetches, feed_dict)
        return entry[0]

    def _compile(self, key, fetches, feed_dict):
        with self._lock:
            if key is not None and key in self._plans:
                return self._plans[key]
            flat: List = []
            unflatten = flatten(fetches, flat, self._resolve)
            feeds = [self._resolve_feed(k) for k in feed_dict]
            run_fetches, run_feeds = flat, feeds
            if self.optimize:
                fed = set(feeds)
                nodes = prune([f.node if isinstance(f, Tensor) else f for f in flat], fed)
                rw = optimize(self.graph, nodes, flat, feeds, SESSION_PASSES)
                run_fetches, run_feeds = rw.fetches, rw.feeds
            plan = self._plan(run_fetches, run_feeds)
            checks = [feed_check(t) for t in feeds]
            if self.check_numerics:
                checks = [checked_feed(c, t) for c, t in zip(checks, feeds)]
            entry = (plan, unflatten, checks)
            if key is not None:
                self._plans[key] = entry
            return entry

    def _plan(self, fetches, feeds) -> Plan:
        """The plan, its nodes placed on this session's devices with copy nodes between them."""
        nodes = prune([f.node if isinstance(f, Tensor) else f for f in fetches], set(feeds))
        pins = self.devices.gpu_pins_usable()
        if not needs_devices(nodes, self.devices.default, pins):
            return Plan(fetches, feeds, self._ctx, self.parallel, workers=self._workers)
        graph = nodes[0].graph if nodes else self.graph
        rw = insert_copies(graph, nodes, fetches, feeds, self.devices.default,
                           host_vars=host_variables(self.graph), gpu_pins=pins)
        if self._binding is None:
            self._binding = DeviceBinding(self.devices, self.state)
        if self.capture == "auto":
            eager = Plan(rw.fetches, rw.feeds, self._ctx, self.parallel, self._binding, workers=self._workers)
            if not static_shapes(rw.fetches, rw.feeds):
                return eager  # shapes may vary: capture is off
            if any(n.op in RENDEZVOUS_OPS for n in eager.nodes):
                return eager
            return AutoCapture(eager, lambda: CapturedPlan.make(rw.fetches, rw.feeds, self._ctx, self._binding, True))
        if self.capture:
            return CapturedPlan.make(rw.fetches, rw.feeds, self._ctx, self._binding, self.capture)
        return Plan(rw.fetches, rw.feeds, self._ctx, self.parallel, self._binding, workers=self._workers)

    def memory_stats(self) -> Dict[str, Dict[str, int]]:
        """Per GPU: peak bytes of the last run, bytes in use now, and the cap."""
        peaks = self._binding.last_peak if self._binding is not None else {}
        return {d.name: {"peak_bytes": peaks.get(d.name, 0), "in_use_bytes": d.used_bytes(),
                         "cap_bytes": d.cap_bytes} for d in self.devices.gpus()}

    def _resolve(self, f):
        return resolve_fetch(self.graph, f)

    def _resolve_feed(self, k) -> Tensor:
        return resolve_feed(self.graph, k)

    # ---- lifetime ---------------------------------------------------------------------
    def close(self) -> None:
        self._closed = True
        self._plans.clear()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- variable access (checkpoints use these) -----------------------------------------
    def variable_value(self, var) -> np.ndarray:
        node = var.node if isinstance(var, Tensor) else var
        slot = self.state.slot(node)
        if slot.value is None:
            raise FeedError(f"variable '{node.name}' is not initialized")
        with slot.lock:
            return to_host_any(slot.value)

    def set_variable_value(self, var, value) -> None:
        node = var.node if isinstance(var, Tensor) else var
        t = node.outputs[0]
        arr = np.asarray(value)
        if arr.dtype != t.dtype or not compatible(arr.shape, t.shape):
            raise FeedError(f"variable '{node.name}' is {t.dtype.name}{fmt(t.shape)}; "
                            f"value is {arr.dtype.name}{fmt(arr.shape)}")
        slot = self.state.slot(node)
        value = np.array(arr, copy=True)
        dev = self._variable_device(node)
        if dev != "host":
            value = dev.to_device(value)
        with slot.lock:
            slot.value = value

    def _variable_device(self, node: Node):
        """The runtime a variable lives on in this session ("host" when on the CPU)."""
        name = assign_devices([node], self.devices.default, host_variables(self.graph),
                              self.devices.gpu_pins_usable())[node]
        return "host" if name == HOST else self.devices.get(name, node.name)
