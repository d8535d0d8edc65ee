"""How a compiled plan meets its devices: per-node kernel contexts, device checks, memory peaks.

A Session that places nodes on GPUs hands its Plan a DeviceBinding. The plan asks it for each
node's KernelContext (the device's array module), lets it wrap kernels (on the stand-in GPU every
value crossing a kernel boundary is checked to be on the node's device, so a missing copy fails
loudly in CI), samples device memory after GPU nodes, and turns an out-of-memory failure into an
error naming the node, its output shape and the cap.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from . import gpu_kernels
from .device_runtime import HOST, DeviceTable
from .errors import ExecutionError
from .executor import KernelContext, SessionState
from .graph import Node
from .passes.copies import input_device
from .shapes import fmt, num_elements_est

SAMPLE_MIN_BYTES = 256 << 10
from .simgpu import DeviceMixError, SimArray


class DeviceMemoryError(ExecutionError, MemoryError):
    """A node's output did not fit under the device's memory cap."""


class DeviceBinding:
    def __init__(self, table: DeviceTable, state: SessionState, checked: Optional[bool] = None):
        gpu_kernels.install()
        self.table = table
        self.state = state
        self._ctx: Dict[Tuple[str, bool], KernelContext] = {}
        self.checked = checked
        self.uses_gpu = True
        self.capture = False  # set while a captured plan (capture.py) binds its kernels
        self.last_peak: Dict[str, int] = {}

    def device(self, n: Node):
        return self.table.get(n.device or HOST, n.name)

    def context(self, n: Node) -> KernelContext:
        name = n.device or HOST
        key = (name, self.capture and name != HOST)
        ctx = self._ctx.get(key)
        if ctx is None:
            ctx = self._ctx[key] = KernelContext(self.device(n).xp, self.state)
            ctx.capture = key[1]
        return ctx

    def sampler(self, n: Node):
        """The device's memory sampler, after GPU nodes whose outputs may be large (small ones
        barely move the peak, and a sample costs a call per node)."""
        dev = self.device(n)
        if dev.kind != "GPU" or not hasattr(dev, "sample"):
            return None
        for t in n.outputs:
            if any(d is None for d in t.shape) or num_elements_est(t.shape) * t.dtype.itemsize >= SAMPLE_MIN_BYTES:
                return dev.sample
        return None

    def wrap(self, n: Node, kernel):
        dev = self.device(n)
        checked = self.checked if self.checked is not None else any(d.simulated for d in self.table.gpus())
        if not checked:
            return kernel
        return _checked_kernel(n, kernel, dev.name)

    def run(self, fn, feeds):
        gpus = self.table.gpus()
        for d in gpus:
            d.reset_peak()
        out = fn(*feeds)  # not synchronized: the next step's Python overlaps this step's kernels
        for d in gpus:
            self.last_peak[d.name] = d.peak_bytes()
        return out

    def raise_out_of_memory(self, e: BaseException, node: Node) -> None:
        dev = self.device(node)
        if dev.kind != "GPU" or not dev.is_out_of_memory(e):
            return
        outs = ", ".join(f"{t.dtype.name}{fmt(t.shape)}" for t in node.outputs) or "no outputs"
        cap = dev.cap_bytes
        raise DeviceMemoryError(
            f"node '{node.name}' ({node.op}) on {dev.name}: out of device memory making {outs}; the cap is "
            f"{cap} bytes ({cap / (1 << 20):.1f} MiB, set by Session(gpu_memory=...) or ISTHMUS_GPU_MEMORY), "
            f"{dev.used_bytes()} bytes in use: lower the batch or raise the cap ({type(e).__name__}: {e})",
            node.name, node.op) from e


def _checked_kernel(n: Node, kernel, device: str):
    """The kernel, refusing inputs and outputs that are not on the node's device (stand-in GPU)."""
    on_gpu = device != HOST
    wants = []
    for i, t in enumerate(n.inputs):
        if i in n.opdef.ref_inputs:
            continue
        wants.append((i, t, input_device(n, i, device)))

    def check_value(v, want: str, what: str) -> None:
        if want == HOST:
            if isinstance(v, SimArray):
                raise DeviceMixError(f"node '{n.name}' ({n.op}) on {device}: {what} is on the simulated GPU but "
                                     "must be on the host: a copy node is missing")
        elif isinstance(v, SimArray):
            if v.gpu_index is not None and f"/device:GPU:{v.gpu_index}" != want:
                raise DeviceMixError(f"node '{n.name}' ({n.op}) on {device}: {what} is on /device:GPU:{v.gpu_index}, "
                                     f"not {want}: a copy node or the communicator (core/collective.py) is missing")
        elif isinstance(v, (np.ndarray, np.generic)):
            raise DeviceMixError(f"node '{n.name}' ({n.op}) on {device}: {what} is a host "
                                 f"{type(v).__name__}: a copy node is missing, or the kernel computed it with "
                                 "numpy instead of its array module")

    def run(*args):
        for (i, t, want), v in zip(wants, args):
            if want is not None:
                check_value(v, want, f"input {i} ('{t.name}')")
        out = kernel(*args)
        outs = (out,) if len(n.outputs) == 1 else (out or ())
        for t, v in zip(n.outputs, outs):
            check_value(v, device if on_gpu else HOST, f"output '{t.name}'")
        return out
    return run
