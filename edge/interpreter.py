"""The edge interpreter: load and verify, prepare each kernel once, plan one arena, invoke.

invoke() copies the inputs into the arena, calls a flat list of bound kernels that write into
arena views, and hands back copies of the outputs; it allocates nothing else per call.
"""
from __future__ import annotations

import heapq
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .arena import ArenaPlanner, aligned_empty
from .format import EdgeModelError
from .int8_kernels import INT8_KERNELS
from .kernels import KERNELS
from .loader import MIN_ACTIVATION_LIMIT, EdgeModel, RemoteInfo, load, loads
from .opcontext import OpContext, TensorSpec


DELEGATE_KEY = "delegate.onnxruntime.buffer"
RemoteCall = Callable[[RemoteInfo, Sequence[np.ndarray]], Sequence[np.ndarray]]  # remote(part, inputs) -> outputs


class Interpreter:
    """`delegate="onnxruntime"` hands the model to onnxruntime when the file embeds an ONNX copy
    (to_edge(..., delegate=True)) and onnxruntime is installed; "auto" does so when it can;
    `delegate_threads` sets its intra-op threads (None: onnxruntime's own choice).
    The numpy path stays complete: it is the reference the delegate is tested against."""

    def __init__(self, model: Union[str, bytes, EdgeModel], input_shapes: Optional[Dict[str, Sequence[int]]] = None,
                 delegate: Optional[str] = None, remote: Optional[RemoteCall] = None,
                 delegate_threads: Optional[int] = None):
        """`remote(part, inputs) -> outputs` runs a RemotePart: it gets the part (name, tensor
        indices) and its input arrays in RemotePart order (views into the arena, valid during the
        call) and returns the output arrays in RemotePart order (the offload client does this)."""
        if isinstance(model, str):
            model = load(model)
        elif isinstance(model, (bytes, bytearray)):
            model = loads(bytes(model))
        self.model = model
        if model.remote and remote is None:
            names = ", ".join(p.name for p in model.remote)
            raise EdgeModelError(f"model has remote parts ({names}); run it with the offload client")
        self._remote = remote
        self._prepare(input_shapes or {})
        self.delegate = None
        if delegate not in (None, "none", "auto", "onnxruntime"):
            raise ValueError(f"delegate must be None, 'auto' or 'onnxruntime', got {delegate!r}")
        if delegate in ("auto", "onnxruntime") and model.remote:
            if delegate == "onnxruntime":
                raise EdgeModelError("a model with remote parts cannot run on the onnxruntime delegate")
        elif delegate in ("auto", "onnxruntime"):
            if delegate_threads is not None and (not isinstance(delegate_threads, int) or delegate_threads < 1):
                raise ValueError(f"delegate_threads must be a positive int or None, got {delegate_threads!r}")
            self.delegate = self._make_delegate(required=delegate == "onnxruntime", threads=delegate_threads)

    def _make_delegate(self, required: bool, threads: Optional[int] = None):
        key = self.model.metadata.get(DELEGATE_KEY)
        if key is None:
            if required:
                raise EdgeModelError("the model embeds no onnxruntime delegate (export it with delegate=True)")
            return None
        try:
            # deferred: onnxruntime is optional (its ImportError is handled)
            import onnxruntime as ort  # only when a delegate is asked for: the edge runtime itself needs numpy
        except ImportError:
            if required:
                raise EdgeModelError("delegate 'onnxruntime' requested but onnxruntime is not installed") from None
            return None
        try:
            index = int(key)
        except ValueError:
            raise EdgeModelError(f"metadata {DELEGATE_KEY}={key!r} is not a buffer index") from None
        so = ort.SessionOptions()  # onnxruntime's own thread choice, as an app using it directly would get
        if threads is not None:
            so.intra_op_num_threads = threads
        sess = ort.InferenceSession(bytes(self.model.blob(index)), so, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        return sess, names

    # ---- prepare: shapes, kernels, arena -------------------------------------------------------
    def _prepare(self, input_shapes: Dict[str, Sequence[int]]) -> None:
        m = self.model
        limit = max(MIN_ACTIVATION_LIMIT, 256 * m.size)  # no plan may ask for more memory than this
        shapes: Dict[int, tuple] = {}
        for i in m.inputs:
            t = m.tensors[i]
            shape = tuple(int(d) for d in input_shapes.get(t.name, t.shape))
            if len(shape) != len(t.shape) or any(d not in (-1, e) for d, e in zip(t.shape, shape)):
                raise EdgeModelError(f"input '{t.name}': shape {shape} does not fit the declared {t.shape}")
            shapes[i] = tuple(1 if d == -1 else d for d in shape)  # unknown batch: 1 unless given
        for i, t in enumerate(m.tensors):
            if t.data is not None:
                shapes[i] = tuple(t.shape)
        written = set(shapes)
        for k, op in enumerate(m.operators):
            for i in op.outputs:
                if i in written:
                    raise EdgeModelError(f"operator {k} ({op.op}): output tensor {i} '{m.tensors[i].name}' "
                                         "is a constant, an input, or written twice")
                written.add(i)
        for p in m.remote:
            for i in p.outputs:
                if i in written:
                    raise EdgeModelError(f"remote part '{p.name}': output tensor {i} '{m.tensors[i].name}' "
                                         "is a constant, an input, or written twice")
                written.add(i)
        runs = []  # (bind, ins, outs, scratch specs)
        schedule = self._schedule()
        for k, op in schedule:
            if op is None:  # a remote part: its outputs' shapes are the file's, the batch from the inputs
                p = m.remote[k]
                for i in p.inputs:
                    if i not in shapes:
                        raise EdgeModelError(f"remote part '{p.name}': input tensor {i} '{m.tensors[i].name}' "
                                             "is read before any operator writes it")
                batch = next((shapes[i][0] for i in m.inputs if shapes[i]), 1)
                for i in p.outputs:
                    t = m.tensors[i]
                    s = tuple(batch if (d == -1 and j == 0) else d for j, d in enumerate(t.shape))
                    if -1 in s:
                        raise EdgeModelError(f"remote part '{p.name}': output '{t.name}' has an unknown dimension {t.shape}")
                    if math.prod(s) * t.dtype.itemsize > limit:
                        raise EdgeModelError(f"remote part '{p.name}': output '{t.name}' {t.dtype.name}{list(s)} exceeds "
                                             f"the memory bound ({limit} bytes) for a file of {m.size} bytes")
                    shapes[i] = s
                runs.append((self._remote_step(p), list(p.inputs), list(p.outputs), []))
                continue
            ins = [i for i in op.inputs if i >= 0]
            for i in ins:
                if i not in shapes:
                    raise EdgeModelError(f"operator {k} ({op.op}): input tensor {i} '{m.tensors[i].name}' "
                                         "is read before any operator writes it")
            try:
                bind, scratch, out_shapes = self._prepare_op(op, ins, shapes)
            except EdgeModelError as e:
                raise EdgeModelError(f"operator {k} ({op.op}): {e}") from None
            except (KeyError, ValueError, TypeError, IndexError, ArithmeticError, MemoryError) as e:
                raise EdgeModelError(f"operator {k} ({op.op}): cannot prepare: {type(e).__name__}: {e}") from None
            if len(out_shapes) != len(op.outputs):
                raise EdgeModelError(f"operator {k} ({op.op}): {len(op.outputs)} outputs, kernel makes {len(out_shapes)}")
            for i, s in zip(op.outputs, out_shapes):
                declared = m.tensors[i].shape
                if len(declared) != len(s) or any(d not in (-1, e) for d, e in zip(declared, s)):
                    raise EdgeModelError(f"operator {k} ({op.op}): output '{m.tensors[i].name}' is {s}, "
                                         f"the file declares {declared}")
                shapes[i] = tuple(s)
            for s, dt in [(shapes[i], m.tensors[i].dtype) for i in op.outputs] + scratch:
                if math.prod(s) * dt.itemsize > limit:
                    raise EdgeModelError(f"operator {k} ({op.op}): {dt.name}{list(s)} exceeds the memory bound "
                                         f"({limit} bytes) for a file of {m.size} bytes")
            runs.append((bind, ins, list(op.outputs), scratch))
        self.steps_info = [("remote", m.remote[k].name) if op is None else ("op", op.op) for k, op in schedule]
        # lifetimes: an activation from the op writing it to the last reading it, scratch for its op
        first: Dict[int, int] = {i: -1 for i in m.inputs}
        last: Dict[int, int] = {}
        for k, (_, ins, outs, _) in enumerate(runs):
            for i in outs:
                first.setdefault(i, k)
            for i in ins:
                last[i] = k
        end = len(runs)
        for i in m.outputs:
            last[i] = end
        planner = ArenaPlanner()
        ids: Dict[int, int] = {}
        for i, f in first.items():
            if m.tensors[i].data is None:
                ids[i] = planner.add(math.prod(shapes[i]) * m.tensors[i].dtype.itemsize, f, last.get(i, f))
        scratch_ids = [[planner.add(math.prod(s) * dt.itemsize, k, k) for s, dt in run[3]] for k, run in enumerate(runs)]
        offsets, peak = planner.plan()
        if peak > limit:
            raise EdgeModelError(f"the arena needs {peak} bytes, beyond the bound ({limit}) for a file of {m.size} bytes")
        self.arena = aligned_empty(max(peak, 1))  # offsets are ALIGN-multiples: every buffer aligned too
        self.arena_bytes, self.arena_lower_bound = peak, planner.lower_bound()
        self.tensor_bytes = sum(planner.buffers[j][0] for j in ids.values())
        self.scratch_bytes = sum(planner.buffers[j][0] for js in scratch_ids for j in js)

        def view(shape, dtype, j):
            return np.ndarray(shape, dtype=dtype, buffer=self.arena, offset=offsets[j])
        views: Dict[int, np.ndarray] = {i: view(shapes[i], m.tensors[i].dtype, j) for i, j in ids.items()}
        for i, t in enumerate(m.tensors):
            if t.data is not None:
                views[i] = t.data
        self._views = views
        self._steps = [bind([views[i] for i in ins], [views[i] for i in outs],
                            [view(s, dt, j) for (s, dt), j in zip(scratch, js)])
                       for (bind, ins, outs, scratch), js in zip(runs, scratch_ids)]
        self._step_outputs = [outs for (_, _, outs, _) in runs]  # for kernels' names
        self._inputs = [(m.tensors[i].name, views[i]) for i in m.inputs]
        self._outputs = [views[i] for i in m.outputs]
        self.input_shapes = {m.tensors[i].name: shapes[i] for i in m.inputs}
        self.remote_shapes = {i: shapes[i] for p in m.remote for i in p.outputs}  # what a remote call returns
        self.output_shapes = {m.tensors[i].name: shapes[i] for i in m.outputs}

    def _schedule(self):
        """(index, operator) in run order; (index, None) for remote part `index`. Operators keep
        the file's order where their inputs allow; a remote part runs as soon as its inputs are
        written, and the operators reading its outputs wait for it (edge -> cloud -> edge)."""
        m = self.model
        if not m.remote:
            return list(enumerate(m.operators))
        units = [(k, op, [i for i in op.inputs if i >= 0], op.outputs) for k, op in enumerate(m.operators)]
        units += [(r, None, p.inputs, p.outputs) for r, p in enumerate(m.remote)]
        ready_t = set(m.inputs) | {i for i, t in enumerate(m.tensors) if t.data is not None}
        waiting, readers = [], {}
        for u, (_, _, ins, _) in enumerate(units):
            need = {i for i in ins if i not in ready_t}
            waiting.append(len(need))
            for i in need:
                readers.setdefault(i, []).append(u)
        n_ops = len(m.operators)
        heap = [(-1 if u >= n_ops else u, u) for u in range(len(units)) if waiting[u] == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            _, u = heapq.heappop(heap)
            k, op, _, outs = units[u]
            order.append((k, op))
            for i in outs:
                for v in readers.pop(i, ()):
                    waiting[v] -= 1
                    if waiting[v] == 0:
                        heapq.heappush(heap, (-1 if v >= n_ops else v, v))
        if len(order) < len(units):
            stuck = [f"remote part '{m.remote[units[u][0]].name}'" if units[u][1] is None else
                     f"operator {units[u][0]} ({units[u][1].op})" for u in range(len(units)) if waiting[u] > 0]
            raise EdgeModelError("these read tensors that nothing writes first (a cycle through a remote part, "
                                 "or a missing producer): " + ", ".join(stuck[:5]))
        return order

    def _remote_step(self, part: RemoteInfo):
        """A step calling the remote callback and binding its outputs (bound to views in prepare)."""
        call = self._remote

        def bind(ins, outs, scratch):
            def step():
                got = call(part, ins)
                if len(got) != len(outs):
                    raise EdgeModelError(f"remote part '{part.name}' returned {len(got)} tensors, expected {len(outs)}")
                for i, v, o in zip(part.outputs, got, outs):
                    v = np.asarray(v)
                    if v.shape != o.shape or v.dtype != o.dtype:
                        raise EdgeModelError(f"remote part '{part.name}': output '{self.model.tensors[i].name}' is "
                                             f"{v.dtype}{list(v.shape)}, expected {o.dtype}{list(o.shape)}")
                    o[...] = v
            return step
        return bind

    def _prepare_op(self, op, ins: List[int], shapes: Dict[int, tuple]):
        """(bind, scratch specs, output shapes) of one operator: its int8 kernel when any of its
        tensors is int8, its fp32 kernel otherwise."""
        m = self.model
        tensors = [m.tensors[i] for i in ins + list(op.outputs)]

        def spec(i: int) -> TensorSpec:
            t = m.tensors[i]
            return TensorSpec(t.name, t.dtype, shapes.get(i, t.shape), t.scale, t.zero_point, t.axis, t.data)
        if any(t.dtype == np.int8 for t in tensors):
            if op.op not in INT8_KERNELS:
                raise EdgeModelError(f"no int8 kernel; int8 kernels: {', '.join(sorted(INT8_KERNELS))}")
            ctx = OpContext(op.op, op.attrs, [spec(i) for i in ins], [spec(i) for i in op.outputs])
            out_shapes, bind = INT8_KERNELS[op.op](ctx)
            return bind, ctx.scratch_specs, out_shapes
        if op.op not in KERNELS:
            raise EdgeModelError(f"no edge kernel; edge kernels: {', '.join(sorted(KERNELS))}")
        index_inputs = getattr(KERNELS[op.op], "index_inputs", ())  # integer inputs a kernel reads (Gather)
        bad = [t for k, t in enumerate(tensors)
               if t.dtype != np.float32 and not (k in index_inputs and t.dtype.kind == "i")]
        if bad:
            raise EdgeModelError(f"'{bad[0].name}' is {bad[0].dtype.name}: fp32 kernels take float32 only")
        ctx = OpContext(op.op, op.attrs, [spec(i) for i in ins], [spec(i) for i in op.outputs])
        out_shapes, bind = KERNELS[op.op](ctx)
        return bind, ctx.scratch_specs, out_shapes

    # ---- invoke ------------------------------------------------------------------------------------
    def invoke(self, *args, **kwargs) -> List[np.ndarray]:
        """Run on inputs given in order or by name; returns the outputs (copies)."""
        self.set_inputs(*args, **kwargs)
        if self.delegate is not None:
            sess, names = self.delegate
            return sess.run(None, {n: view for n, (_, view) in zip(names, self._inputs)})
        for step in self._steps:
            step()
        return [o.copy() for o in self._outputs]

    @property
    def kernels(self) -> List[Tuple[str, Callable[[], None]]]:
        """(the name of its first output, the prepared kernel) for each step, in run order: calling
        them in turn after set_inputs is one invoke (outputs in the arena), which is how a profiler
        times each kernel as the interpreter runs it (edge/link_emulation.emulated_kernel_seconds)."""
        m = self.model
        return [(m.tensors[outs[0]].name if outs else f"step{k}", step)
                for k, (outs, step) in enumerate(zip(self._step_outputs, self._steps))]

    def set_inputs(self, *args, **kwargs) -> None:
        """Check the inputs (given in order or by name) and copy them into the arena. The arena
        reuses an input's bytes after its last reader, so a run needs them put back first."""
        if args and kwargs:
            raise TypeError("pass inputs either in order or by name")
        values = list(args) if args else [kwargs.get(name) for name, _ in self._inputs]
        if len(values) != len(self._inputs):
            raise ValueError(f"model takes {len(self._inputs)} inputs, got {len(values)}")
        for (name, view), v in zip(self._inputs, values):
            if v is None:
                raise ValueError(f"input '{name}' missing")
            v = np.asarray(v)
            if v.shape != view.shape:
                raise ValueError(f"input '{name}' has shape {v.shape}; the model was prepared for {view.shape}")
            np.copyto(view, v, casting="same_kind")
