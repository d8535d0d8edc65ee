"""Compile an execution plan once per (fetches, feeds), then only run it.

A plan is a Python function generated from the pruned graph: one line per node, each a
call of a kernel bound when the plan was compiled, with values held in local variables
(the fastest storage CPython has) and deleted after their last use. Per run, the only
Python work left is those calls; nothing is looked up in a dict or type-checked.
"""
from __future__ import annotations

import itertools
import linecache
import sys
import threading
import zlib
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import jit
from . import threads
from .errors import ExecutionError, FeedError, GraphError, IsthmusError
from .graph import Node, Tensor
from .ops.numerics import checked_kernel
from .scheduler import BranchCosts, ParallelRunner, graph_preds, one_thread_pays, runnable
from .threads import IntraOpThreads, OneThreadRun, RunBlasHold, RunGate, default_inter_op_threads

# ops whose kernels may return a view of their first input: a fetch through them of a variable's
# value is copied, so the caller never holds a live view of state
_VIEW_OPS = frozenset({"Identity", "StopGradient", "Reshape", "ReshapeLike", "Squeeze", "ExpandAxes", "Flatten",
                       "Transpose", "StridedSlice", "Split", "SplitLike", "BroadcastTo", "MergeLeading",
                       "Concat", "Cast"})
_plan_ids = itertools.count()


class VarSlot:
    """Where a Variable's value lives for one session; the lock serialises read-modify-write."""
    __slots__ = ("name", "value", "lock")

    def __init__(self, name: str):
        self.name = name
        self.value: Optional[np.ndarray] = None
        self.lock = threading.Lock()


class KernelContext:
    """What a kernel factory may ask of the session that compiles it."""
    check_numerics = False   # Session(check_numerics=True) sets it: kernels' float outputs are checked

    def __init__(self, xp, state: "SessionState"):
        self.xp = xp
        self.state = state
        self.capture = False  # kernels bound for a captured GPU step (capture.py) avoid cuBLAS
        self._used: Optional[set] = None  # tensors the plan being compiled consumes or fetches

    def output_used(self, t: Tensor) -> bool:
        """Whether the plan now being compiled reads `t` (a kernel may skip work otherwise)."""
        return self._used is None or t in self._used

    def var_slot(self, var_node: Node) -> VarSlot:
        return self.state.slot(var_node)

    def rng(self, node: Node) -> np.random.Generator:
        return self.state.rng(node)


class SessionState:
    """Variable values and random generators of one session."""

    def __init__(self, rendezvous=None, devices=None):
        self.rendezvous = rendezvous  # where Send/Recv kernels exchange tensors (partitioned graphs)
        self.devices = devices  # a DeviceTable (device_runtime.py) when the session places nodes on GPUs
        # keyed by node name: an optimized copy of a graph shares its variables and generators
        self.slots: Dict[str, VarSlot] = {}
        self.rngs: Dict[str, np.random.Generator] = {}
        self._lock = threading.Lock()

    def slot(self, var_node: Node) -> VarSlot:
        if var_node.op != "Variable":
            raise GraphError(f"node '{var_node.name}' ({var_node.op}) is not a Variable")
        with self._lock:
            s = self.slots.get(var_node.name)
            if s is None:
                s = self.slots[var_node.name] = VarSlot(var_node.name)
            return s

    def rng(self, node: Node) -> np.random.Generator:
        with self._lock:
            g = self.rngs.get(node.name)
            if g is None:
                seed = node.attrs.get("seed")
                if seed is None:  # deterministic by default: derived from graph seed and node name
                    seed = zlib.crc32(node.name.encode())
                g = self.rngs[node.name] = np.random.Generator(
                    np.random.PCG64([int(seed) & 0xFFFFFFFF, int(node.graph.seed or 0) & 0xFFFFFFFF]))
            return g


def prune(fetch_nodes: Sequence[Node], fed: set) -> List[Node]:
    """The nodes the fetches need, in topological (graph) order; fed tensors cut the walk."""
    needed: Dict[int, Node] = {}
    stack = list(fetch_nodes)
    while stack:
        n = stack.pop()
        if id(n) in needed:
            continue
        needed[id(n)] = n
        for i, t in enumerate(n.inputs):
            if t not in fed and i not in n.opdef.ref_inputs:  # a ref names a variable, reads nothing
                stack.append(t.node)
        stack.extend(n.control_inputs)
    return sorted(needed.values(), key=lambda n: n.index)


def _has_blas_work(nodes, fed: set, unit_dims: bool = False) -> bool:
    """Whether a node does work OpenBLAS would thread (a product over 2 * 4 * 65536 FLOPs; unknown
    dims count as 1, and a cost that cannot be priced counts as such work). unit_dims: for a run whose
    unknown dims are 1, where a dense layer on constant weights is jit.dense's matrix-vector loop
    (fused_dense.gemv_at_batch_1: no BLAS call) and does not count."""
    from .ops.fused_dense import gemv_at_batch_1  # deferred: the ops package imports this module's peers
    for n in nodes:
        if n.op in ("Const", "Placeholder") or n.opdef.cost is None or (n.outputs and all(o in fed for o in n.outputs)):
            continue
        if unit_dims and gemv_at_batch_1(n):
            continue
        try:
            if n.opdef.cost(n).flops >= _BLAS_THREADED_FLOPS:
                return True
        except Exception:  # a cost function must never break execution
            return True
    return False


_BLAS_THREADED_FLOPS = 2 * 4 * 65536


class Plan:
    """A compiled step: `plan(*feed_values)` returns the tuple of fetched values."""

    def __init__(self, fetches: Sequence[Union[Tensor, Node]], feeds: Sequence[Tensor], ctx: KernelContext,
                 parallel: Union[bool, str] = "auto", binding: Optional["DeviceBinding"] = None,
                 workers: Optional[int] = None):
        """`binding` (device_binding.py): per-node contexts of a session that places nodes on GPUs.
        `workers`: the branch pool's size when branches run in parallel (Session inter_op_threads;
        None: the default, of which an auto run uses at most its intra-op budget)."""
        self.binding = binding
        self.fetches = list(fetches)
        self.feeds = list(feeds)
        self.fed = fed = set(self.feeds)
        fetch_nodes = [f.node if isinstance(f, Tensor) else f for f in self.fetches]
        self.nodes = [n for n in prune(fetch_nodes, fed)]
        self.id = next(_plan_ids)
        self.filename = f"<isthmus plan {self.id}>"
        self._line_to_node: Dict[int, Node] = {}
        self.kernels: Dict[Node, object] = {}
        self.constants: Dict[Tensor, object] = {}
        self._aliases_state: set = set()
        self._copy = ctx.xp.array
        self.fn = self._generate(ctx, fed)
        if binding is not None and binding.uses_gpu:
            parallel = False  # a GPU queues kernels itself: host threads would only contend
        self._workers_given = workers is not None
        self._runner, self._auto = self._branch_runner(parallel, workers, fed)
        # whether branches run in parallel: always (parallel=True), or, for "auto", what a run at unit
        # unknown dims with the process's threads now would choose (each run chooses for its sizes)
        self.parallel = self._runner is not None and (
            not self._auto or self._branch_choice(1, threads.intra_threads(), threads.intra_threads()) is not False)
        # runs whose unknown dims are all 1 take one intra-op thread for the whole run (one BLAS
        # hold, not one per product) when no node could use a second one (scheduler.one_thread_pays);
        # a session given intra_op_threads keeps what it was given
        self._serial_dims = None
        if not (parallel is True) and (binding is None or not binding.uses_gpu) and one_thread_pays(self.nodes, fed):
            self._serial_dims = [(i, tuple(j for j, d in enumerate(t.shape) if d is None))
                                 for i, t in enumerate(self.feeds)]
        # other default-thread runs with work BLAS would thread hold BLAS to one thread for the run
        # (threads.RunBlasHold): the intra-op pool alone splits work, BLAS's spinning threads never
        # take the cores its chunks need
        self._hold_blas = (binding is None or not binding.uses_gpu) and threads.cores() > 1 \
            and _has_blas_work(self.nodes, fed)
        # a one-intra-thread run whose BLAS work is all matrix-vector loops at these sizes holds nothing
        self._hold_blas_unit = self._hold_blas and _has_blas_work(self.nodes, fed, unit_dims=True)
        self._unknown = [(i, dims) for i, dims in ((i, tuple(j for j, d in enumerate(t.shape) if d is None))
                                                   for i, t in enumerate(self.feeds)) if dims]

    def _branch_runner(self, parallel, workers, fed):
        """(runner, auto): a ParallelRunner when parallel is True, or when "auto" and the graph has
        branches that could pay at some size (BranchCosts.has_width); auto: each run chooses."""
        if parallel is True:
            return ParallelRunner(self, workers), False
        if parallel != "auto":
            return None, False
        nodes = runnable(self.nodes, fed)
        costs = BranchCosts(nodes, graph_preds(nodes, fed))
        if not costs.has_width(workers or default_inter_op_threads()):
            return None, False
        return ParallelRunner(self, workers, costs), True

    def copy_fetch(self, f, value):
        """Fetched values that alias a variable are copied: the caller must not hold a live view."""
        return self._copy(value) if f in self._aliases_state else value

    # The generated function has one line per node; the line number of a failure names the node.
    def _generate(self, ctx: KernelContext, fed: set):
        names: Dict[Tensor, str] = {}
        for i, t in enumerate(self.feeds):
            names[t] = f"f{i}"
        env: Dict[str, object] = {}
        body: List[Tuple[str, Optional[Node]]] = []
        aliases_state = set()
        used = {f for f in self.fetches if isinstance(f, Tensor)}
        for n in self.nodes:
            used.update(n.inputs)
        outer_used, ctx._used = ctx._used, used
        try:
            self._emit(ctx, fed, names, env, body, aliases_state)
        finally:
            ctx._used = outer_used
        return self._finish(ctx, names, env, body, aliases_state)

    def _emit(self, ctx, fed, names, env, body, aliases_state) -> None:
        consts = 0
        binding = self.binding
        for j, n in enumerate(self.nodes):
            nctx = ctx if binding is None else binding.context(n)
            if n.outputs and all(t in fed for t in n.outputs):
                continue  # every output is fed: the node itself never runs
            if n.op == "Placeholder" and not all(t in fed for t in n.outputs):
                raise FeedError(f"placeholder '{n.name}' ({n.outputs[0].dtype.name}"
                                f"{_fmt(n.outputs[0].shape)}) must be fed: pass it in feed_dict")
            if n.op == "Const":
                name = f"c{consts}"
                consts += 1
                env[name] = nctx.xp.asarray(n.attrs["value"])
                self.constants[n.outputs[0]] = env[name]
                names[n.outputs[0]] = name
                continue
            outs = []
            for t in n.outputs:
                if t in fed:
                    outs.append("_")
                else:
                    names[t] = f"v{n.index}_{t.index}"
                    outs.append(names[t])
            try:
                kernel = n.opdef.kernel(n, nctx)
                if binding is not None:
                    kernel = binding.wrap(n, kernel)
            except IsthmusError:
                raise
            except Exception as e:
                raise ExecutionError(f"node '{n.name}' ({n.op}): cannot prepare its kernel: "
                                     f"{type(e).__name__}: {e}", n.name, n.op) from e
            if ctx.check_numerics:   # Session(check_numerics=True): every float output checked
                kernel = checked_kernel(n, kernel)
            kname = f"k{j}"
            env[kname] = kernel
            self.kernels[n] = kernel
            args = ", ".join(names[t] for i, t in enumerate(n.inputs) if i not in n.opdef.ref_inputs)
            call = f"{kname}({args})"
            if not n.outputs:
                line = call
            elif len(n.outputs) == 1:
                line = f"{outs[0]} = {call}"
            else:
                line = f"{', '.join(outs)}, = {call}"
            body.append((line, n))
            if binding is not None and binding.sampler(n) is not None:
                env[f"m{j}"] = binding.sampler(n)
                body.append((f"m{j}()", None))  # the device's memory in use after the node: its peak
            if n.op == "Variable" or n.opdef.ref_inputs or (
                    n.op in _VIEW_OPS and n.inputs and n.inputs[0] in aliases_state):
                aliases_state.update(n.outputs)

    def _finish(self, ctx, names, env, body, aliases_state):
        fetch_exprs = []
        for f in self.fetches:
            if isinstance(f, Node):
                fetch_exprs.append("None")
            elif f in aliases_state:  # the caller must not hold a live view of a variable
                fetch_exprs.append(f"_copy({names[f]})")
            else:
                fetch_exprs.append(names[f])
        env["_copy"] = ctx.xp.array
        self._aliases_state = aliases_state
        body = _insert_frees(body, names, set(self.fetches))
        params = ", ".join(f"f{i}" for i in range(len(self.feeds)))
        lines = [f"def plan({params}):"]
        for line, node in body:
            lines.append("    " + line)
            if node is not None:
                self._line_to_node[len(lines)] = node
        lines.append(f"    return ({', '.join(fetch_exprs)}{',' if fetch_exprs else ''})")
        source = "\n".join(lines) + "\n"
        self.source = source
        # the source is generated here from the graph's structure, never from loaded data
        code = compile(source, self.filename, "exec")
        linecache.cache[self.filename] = (len(source), None, source.splitlines(True), self.filename)
        exec(code, env)  # noqa: S102
        return env["plan"]

    def __call__(self, *feeds):
        with RunGate():  # the split gates read once for the run (threads.RunGate)
            return self._run(feeds)

    def _run(self, feeds):
        intra = threads.session_intra_threads()
        default = intra is None
        one = self._serial_dims is not None and default and self._unit_dims(feeds)  # one intra-op thread pays
        # BLAS on one thread for the run: default runs, and runs given several threads where kernels
        # split by prange (threads.prange_may_run: OpenBLAS's spinning workers kept libgomp's off the cores)
        hold = self._hold_blas and (default or (intra > 1 and threads.prange_may_run()))
        runner = self._runner
        if runner is not None:
            if not self._auto:  # parallel=True: branches at the session's threads
                heavy = runner.heavy_at(self._scale(feeds))
                if hold:
                    with RunBlasHold():
                        return runner(*feeds, heavy=heavy)
                return runner(*feeds, heavy=heavy)
            budget = threads.intra_threads()
            heavy = self._branch_choice(self._scale(feeds), 1 if one else budget, budget)
            if heavy is not False:  # branches at one intra-op thread each (scheduler.BranchCosts)
                if budget == 1 and not one:
                    return runner(*feeds, heavy=heavy)
                with IntraOpThreads(1):  # process-wide: the pool's threads run their nodes on one thread too
                    return runner(*feeds, heavy=heavy)
        if hold:
            if one:  # this thread's kernels alone; other threads' runs keep their counts. BLAS is held
                # unless the run's BLAS work is all matrix-vector loops at these sizes (no BLAS call)
                with OneThreadRun(hold_blas=self._hold_blas_unit or not jit.enabled_by_env()):
                    return self._call(feeds)
            with RunBlasHold():
                return self._call(feeds)
        return self._call(feeds)

    def _branch_choice(self, scale: int, intra: int, budget: int):
        """runner.choose for a run at `scale` whose serial plan has `intra` threads: the pool uses at
        most the run's intra-op `budget` (the session's intra_op_threads, else BLAS's count) unless
        the session was given inter_op_threads."""
        runner = self._runner
        workers = runner.workers if self._workers_given else min(runner.workers, budget)
        return runner.choose(scale, intra, workers)

    def _scale(self, feeds) -> int:
        """The run's scale for the cost rule: the largest product of one feed's unknown dims."""
        scale = 1
        for i, dims in self._unknown:
            shape = getattr(feeds[i], "shape", ())
            k = 1
            for j in dims:
                if j < len(shape):
                    k *= int(shape[j])
            scale = max(scale, k)
        return scale

    def _unit_dims(self, feeds) -> bool:
        """Whether this run's feeds have 1 wherever the graph left a dim unknown (the sizes
        one_thread_pays assumed)."""
        for i, dims in self._serial_dims:
            shape = getattr(feeds[i], "shape", ())
            for j in dims:
                if j < len(shape) and shape[j] != 1:
                    return False
        return True

    def _call(self, feeds):
        try:
            if self.binding is not None:
                return self.binding.run(self.fn, feeds)
            return self.fn(*feeds)
        except Exception as e:
            node = self._failing_node(sys.exc_info()[2])
            if node is None:
                raise
            if self.binding is not None:
                self.binding.raise_out_of_memory(e, node)
            if isinstance(e, IsthmusError) and getattr(e, "node_name", None) == node.name:
                raise
            raise ExecutionError(f"node '{node.name}' ({node.op}) failed: {type(e).__name__}: {e}",
                                 node.name, node.op) from e

    def _failing_node(self, tb) -> Optional[Node]:
        line = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == self.filename:
                line = tb.tb_lineno
            tb = tb.tb_next
        return self._line_to_node.get(line) if line is not None else None


def _insert_frees(body, names: Dict[Tensor, str], fetched: set):
    """Delete each local after its last use, so intermediates are freed as soon as possible."""
    last_use: Dict[str, int] = {}
    for i, (line, node) in enumerate(body):
        for t in (node.inputs if node is not None else ()):
            nm = names.get(t)
            if nm and nm.startswith("v"):
                last_use[nm] = i
    keep = {names[t] for t in fetched if isinstance(t, Tensor) and t in names}
    frees: Dict[int, List[str]] = {}
    for nm, i in last_use.items():
        if nm not in keep:
            frees.setdefault(i, []).append(nm)
    out = []
    for i, (line, node) in enumerate(body):
        out.append((line, node))
        if i in frees:
            out.append(("del " + ", ".join(sorted(frees[i])), None))
    return out


def _fmt(shape) -> str:
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"
