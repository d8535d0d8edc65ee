"""DeviceCopy: the explicit move of a tensor between the host and a GPU inside one task.

The copy pass (core/passes/copies.py) inserts one per tensor per destination device, as
Send/Recv bridge tasks. Its kernel asks the session's device table for the two runtimes;
its cost is the bytes it moves, which a GPU profile prices at the measured host<->device rate.
An upload may also check class ids on the host for GPU consumers that cannot check them without
a sync (`label_checks`, set by the copy pass).
"""
from __future__ import annotations

import numpy as np

from ..registry import REQUIRED, Cost, OpDef, register
from ..shapes import num_elements_est
from .nn import check_labels


def _kernel_copy(node, ctx):
    src, dst = node.attrs["src"], node.attrs["dst"]
    table = ctx.state.devices
    if table is None:
        raise ValueError(f"node '{node.name}' copies {src} -> {dst}, but its session has no device table")
    s, d = table.get(src, node.name), table.get(dst, node.name)
    if s.kind == "CPU" and d.kind == "GPU":
        checks = node.attrs["label_checks"]
        return _checked_upload(d.to_device, checks, d.name) if checks else d.to_device
    if s.kind == "GPU" and d.kind == "CPU":
        return s.to_host
    if s.kind == "GPU" and d.kind == "GPU":
        to_host, to_device = s.to_host, d.to_device
        return lambda x: to_device(to_host(x))  # peer copies: through the host (no NVLink path yet)
    raise ValueError(f"node '{node.name}': a copy from {src} to {dst} moves nothing")


def _checked_upload(to_device, checks, dst: str):
    """to_device, after checking on the host the class ids that GPU consumers would only turn into
    a NaN loss (their kernels do not sync to check): free here, the values are host arrays."""

    def run(x):
        for consumer, classes in checks:
            where = f"node '{consumer}' (SparseSoftmaxCrossEntropy on {dst}, checked on the host before the upload): "
            check_labels(np.asarray(x), classes, where)
        return to_device(x)
    return run


def _cost_copy(node) -> Cost:
    t = node.inputs[0]
    n = num_elements_est(t.shape) * t.dtype.itemsize
    return Cost(0.0, n, n)


register(OpDef(
    "DeviceCopy", inputs=("x",), attrs={"src": REQUIRED, "dst": REQUIRED, "label_checks": ()},
    infer=lambda node: [(node.inputs[0].dtype, node.inputs[0].shape)],
    kernel=_kernel_copy, cost=_cost_copy,  # no gradient: copies are inserted after autodiff, per plan
    doc="Move x from device `src` to device `dst` (host <-> GPU within a task); `label_checks`: "
        "((consumer, classes), ...) whose class ids an upload checks on the host first.",
))
