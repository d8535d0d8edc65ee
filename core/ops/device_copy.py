"""DeviceCopy: the explicit move of a tensor between the host and a GPU inside one task.

The copy pass (core/passes/copies.py) inserts one per tensor per destination device, as
Send/Recv bridge tasks. Its kernel asks the session's device table for the two runtimes;
its cost is the bytes it moves, which a GPU profile prices at the measured host<->device rate.
"""
from __future__ import annotations

from ..registry import REQUIRED, Cost, OpDef, register
from ..shapes import num_elements_est


def _kernel_copy(node, ctx):
    src, dst = node.attrs["src"], node.attrs["dst"]
    table = ctx.state.devices
    if table is None:
        raise ValueError(f"node '{node.name}' copies {src} -> {dst}, but its session has no device table")
    s, d = table.get(src, node.name), table.get(dst, node.name)
    if s.kind == "CPU" and d.kind == "GPU":
        return d.to_device
    if s.kind == "GPU" and d.kind == "CPU":
        return s.to_host
    if s.kind == "GPU" and d.kind == "GPU":
        to_host, to_device = s.to_host, d.to_device
        return lambda x: to_device(to_host(x))  # peer copies: through the host (no NVLink path yet)
    raise ValueError(f"node '{node.name}': a copy from {src} to {dst} moves nothing")


def _cost_copy(node) -> Cost:
    t = node.inputs[0]
    n = num_elements_est(t.shape) * t.dtype.itemsize
    return Cost(0.0, n, n)


register(OpDef(
    "DeviceCopy", inputs=("x",), attrs={"src": REQUIRED, "dst": REQUIRED},
    infer=lambda node: [(node.inputs[0].dtype, node.inputs[0].shape)],
    kernel=_kernel_copy, cost=_cost_copy,  # no gradient: copies are inserted after autodiff, per plan
    doc="Move x from device `src` to device `dst` (host <-> GPU within a task).",
))
