"""Collectives across the GPUs of one process: the all-reduce of data-parallel replicas' gradients.

A `Communicator` sums, in place, one flat buffer per rank (rank r's buffer on rank r's device):
- `NcclCommunicator`: `cupy.cuda.nccl` communicators from `initAll(devices)`, one `allReduce` per
  rank on that rank's stream, the calls of all ranks between `groupStart()` and `groupEnd()` (one
  thread drives every GPU, as NCCL's single-process mode wants). With one GPU it is a one-rank NCCL
  communicator: NCCL runs, and the sum is the buffer itself.
- `SimulatedCommunicator`: for the stand-in GPUs (core/simgpu.py). The one place where arrays of
  different stand-in GPUs legitimately meet: it sums the ranks' buffers on the host in rank order
  and writes the total into each, so every rank gets the same bits (as NCCL's ring gives).
- `SingleRank`: the identity, for one replica where NCCL is absent.

`AllReduceGroup` is the rendezvous of the replicas' threads: each replica's `AllReduce` node hands
its buffers, the last rank to arrive runs the communicator over all of them, and all go on. A
replica that fails before it arrives calls `abort`, which releases the others with
`CollectiveAborted` (so their steps apply nothing); every wait has a timeout.

The `AllReduce` op (inputs: a replica's gradients; attrs `group`, `rank`, `reduction`) packs its
inputs into one flat buffer per dtype (one collective per dtype per step, not one per variable),
reduces them through its group and returns views of the result, scaled by 1/n for the mean.
"""
from __future__ import annotations

import itertools
import threading
import time
import weakref
from typing import Dict, List, Optional, Sequence

import numpy as np

from . import gpu
from .errors import ExecutionError
from .graph import Tensor, get_default_graph
from .ops.base import convert
from .registry import REQUIRED, Cost, OpDef, register
from .shapes import num_elements_est
from .simgpu import SimArray


class CollectiveAborted(RuntimeError):
    """Another replica failed before the all-reduce: this step applies nothing on any replica."""


class CollectiveTimeout(RuntimeError):
    """A replica waited longer than the group's timeout for the others to arrive."""


class Communicator:
    """Sums one flat buffer per rank, in place, across ranks. `kind`: 'nccl', 'simulated', 'single'."""
    kind = "?"

    def __init__(self, devices: Sequence[int]):
        self.devices = list(devices)

    @property
    def size(self) -> int:
        return len(self.devices)

    def all_reduce_sum(self, buffers: Sequence[Sequence]) -> None:
        """buffers[r]: rank r's flat buffers (one per dtype, the same dtypes and sizes on every rank)."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class SingleRank(Communicator):
    """One replica: the sum over one rank is its own buffer."""
    kind = "single"

    def __init__(self, device: int = 0):
        super().__init__([device])

    def all_reduce_sum(self, buffers) -> None:
        if len(buffers) != 1:
            raise ValueError(f"a single-rank communicator got {len(buffers)} ranks' buffers")


class SimulatedCommunicator(Communicator):
    """The stand-in GPUs' all-reduce: a host sum in rank order, written into every rank's buffer."""
    kind = "simulated"

    def all_reduce_sum(self, buffers) -> None:
        _check_ranks(self, buffers)
        for k in range(len(buffers[0])):
            parts = [b[k] for b in buffers]
            for r, p in enumerate(parts):
                if not isinstance(p, SimArray) or p.gpu_index != self.devices[r]:
                    where = f"/device:GPU:{p.gpu_index}" if isinstance(p, SimArray) else f"the host ({type(p).__name__})"
                    raise ValueError(f"rank {r}'s buffer is on {where}, not on /device:GPU:{self.devices[r]}")
            raw = [p.view(np.ndarray) for p in parts]
            total = raw[0].copy()
            for x in raw[1:]:
                total += x
            for x in raw:
                np.copyto(x, total)


class NcclCommunicator(Communicator):
    """NCCL over the GPUs `devices` of this process; `streams[r]`: the cupy stream rank r runs on."""
    kind = "nccl"

    def __init__(self, devices: Sequence[int], streams: Optional[Sequence] = None):
        super().__init__(devices)
        self.nccl = gpu.nccl_module()  # core/gpu.py: the one module that imports cupy
        self.comms = self.nccl.NcclCommunicator.initAll(list(self.devices))
        self.streams = list(streams) if streams is not None else [None] * len(self.devices)

    def all_reduce_sum(self, buffers) -> None:
        _check_ranks(self, buffers)
        nccl = self.nccl
        nccl.groupStart()
        try:
            for r, comm in enumerate(self.comms):
                stream = self.streams[r]
                ptr = stream.ptr if stream is not None else 0
                for b in buffers[r]:
                    comm.allReduce(b.data.ptr, b.data.ptr, b.size, nccl_dtype(nccl, b.dtype), nccl.NCCL_SUM, ptr)
        finally:
            nccl.groupEnd()

    def close(self) -> None:
        for c in self.comms:
            c.destroy()
        self.comms = []


_NCCL_TYPES = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
               "int32": "NCCL_INT32", "int64": "NCCL_INT64", "int8": "NCCL_INT8", "uint8": "NCCL_UINT8"}


def nccl_dtype(nccl, dtype) -> int:
    name = _NCCL_TYPES.get(np.dtype(dtype).name)
    if name is None or not hasattr(nccl, name):
        raise ValueError(f"NCCL has no reduction type for {np.dtype(dtype).name}")
    return getattr(nccl, name)


def _check_ranks(comm: Communicator, buffers) -> None:
    if len(buffers) != comm.size:
        raise ValueError(f"the communicator has {comm.size} ranks, got {len(buffers)} ranks' buffers")
    want = [(b.dtype, b.size) for b in buffers[0]]
    for r, bs in enumerate(buffers[1:], 1):
        got = [(b.dtype, b.size) for b in bs]
        if got != want:
            raise ValueError(f"rank {r}'s buffers {got} differ from rank 0's {want}: the replicas' graphs differ")


class AllReduceGroup:
    """The rendezvous of n replica threads for one all-reduce per step (see the module docstring)."""

    def __init__(self, comm: Communicator, timeout_s: float = 60.0):
        self.comm, self.n, self.timeout_s = comm, comm.size, timeout_s
        self._cond = threading.Condition()
        self._pending: Dict[int, list] = {}
        self.reduced = False           # this round's collective ran: the replicas may apply
        self.aborted: Optional[str] = None
        self.key = f"allreduce/{next(_KEYS)}"   # never reused, unlike id(): a closed group's graphs stay unbound
        _GROUPS[self.key] = self

    def reset(self) -> None:
        """A new round (a step); no replica may be in the group."""
        with self._cond:
            self._pending, self.reduced, self.aborted = {}, False, None

    def abort(self, reason: str) -> None:
        with self._cond:
            if self.aborted is None and not self.reduced:
                self.aborted = reason
            self._cond.notify_all()

    def all_reduce(self, rank: int, buffers: list) -> None:
        with self._cond:
            if self.aborted is not None:
                raise CollectiveAborted(f"rank {rank}: the all-reduce was aborted: {self.aborted}")
            if rank in self._pending:
                raise RuntimeError(f"rank {rank} entered the all-reduce twice in one step")
            self._pending[rank] = buffers
            if len(self._pending) == self.n:
                try:
                    self.comm.all_reduce_sum([self._pending[r] for r in range(self.n)])
                except BaseException as e:
                    self.aborted = f"the {self.comm.kind} communicator failed: {type(e).__name__}: {e}"
                    self._cond.notify_all()
                    raise
                self.reduced = True
                self._pending = dict.fromkeys(self._pending)  # the buffers live on as the ranks' outputs only
                self._cond.notify_all()
                return
            deadline = time.monotonic() + self.timeout_s
            while not self.reduced and self.aborted is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(self.n)) - set(self._pending))
                    self.aborted = f"rank {rank} waited {self.timeout_s:g} s for ranks {missing}"
                    self._cond.notify_all()
                    raise CollectiveTimeout(self.aborted)
                self._cond.wait(min(left, 1.0))
            if not self.reduced:
                raise CollectiveAborted(f"rank {rank}: the all-reduce was aborted: {self.aborted}")


_GROUPS: "weakref.WeakValueDictionary[str, AllReduceGroup]" = weakref.WeakValueDictionary()
_KEYS = itertools.count()


# ---- the AllReduce op -------------------------------------------------------------------------
def _infer(node):
    return [(t.dtype, t.shape) for t in node.inputs]


def _kernel(node, ctx):
    group = _GROUPS.get(node.attrs["group"])
    if group is None:
        raise ExecutionError(f"node '{node.name}' (AllReduce): its replica group {node.attrs['group']!r} is gone "
                             "(the DataParallel that built it was closed)", node.name, node.op)
    rank, xp = node.attrs["rank"], ctx.xp
    scale = 1.0 / group.n if node.attrs["reduction"] == "mean" else None
    by_dtype: Dict[np.dtype, List[int]] = {}
    for i, t in enumerate(node.inputs):
        by_dtype.setdefault(t.dtype, []).append(i)
    packs = list(by_dtype.values())
    single = len(node.inputs) == 1

    def run(*xs):
        bufs = [xp.concatenate([xs[i].reshape(-1) for i in idx]) for idx in packs]
        group.all_reduce(rank, bufs)
        outs: list = [None] * len(xs)
        for b, idx in zip(bufs, packs):
            if scale is not None and group.n > 1:
                xp.multiply(b, b.dtype.type(scale), out=b)
            off = 0
            for i in idx:
                size = xs[i].size
                outs[i] = b[off:off + size].reshape(xs[i].shape)
                off += size
        return outs[0] if single else tuple(outs)
    return run


def _cost(node) -> Cost:
    n = sum(num_elements_est(t.shape) * t.dtype.itemsize for t in node.inputs)
    return Cost(float(sum(num_elements_est(t.shape) for t in node.inputs)), 2 * n, 2 * n)


register(OpDef(
    "AllReduce", inputs=("x", "*xs"), attrs={"group": REQUIRED, "rank": REQUIRED, "reduction": "mean"},
    infer=_infer, kernel=_kernel, cost=_cost, stateful=True,  # a rendezvous: never folded or deduplicated
    doc="The sum or mean of each input across the replicas of `group` (core/collective.py), this "
        "replica being `rank`; one output per input, same shape, on the input's device.",
))


def all_reduce(xs: Sequence, group: AllReduceGroup, rank: int, reduction: str = "mean",
               name: Optional[str] = None) -> List[Tensor]:
    """The all-reduced `xs` (this replica's tensors) across `group`, as one AllReduce node."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    xs = [convert(x) for x in xs]
    node = get_default_graph().add_node("AllReduce", xs, {"group": group.key, "rank": rank,
                                                          "reduction": reduction}, name=name or "all_reduce")
    return list(node.outputs)
