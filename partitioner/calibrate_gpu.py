"""GPU calibration: time the real GPU kernels (cupy) and write a GPU device profile.

`isthmus calibrate --device gpu` runs this: every calibration case of calibrate.py is built in a
Session whose nodes run on /device:GPU:0, its kernel is timed back to back on device-resident
inputs (synchronised at the ends, as a step's kernels queue on the GPU), and the per-op
regression is fitted as for a CPU. Host<->device copies are timed too and priced as the op
DeviceCopy, so the partitioner can weigh a GPU's speed against the copies it needs. Without a
GPU it stops with the reason.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import List, Optional, Sequence

import numpy as np

from ..core import gpu, registry
from ..core.graph import Graph
from ..core.session import Session
from .calibrate import Sample, cases, fit, fit_coeffs, placeholder_in
from .costmodel import cost_key, op_cost
from .devices import DeviceProfile

COPY_SIZES = (1 << 12, 1 << 16, 1 << 20, 1 << 24)


def _gpu_case(op: str, inputs, build, device, backend: str):
    g = Graph(seed=0)
    phs = [placeholder_in(g, a.dtype, a.shape, f"in{i}") for i, a in enumerate(inputs)]
    node = build(g, phs)
    sess = Session(g, parallel=False, optimize=False, device="gpu", gpu=backend)
    feed = dict(zip(phs, inputs))
    fetch = node.outputs[0]
    sess.run(fetch, feed)  # compile, and warm cupy's kernel cache
    plan = sess.plan_for(fetch, feed)
    (n,) = [m for m in plan.nodes if m.op == op]
    by_name = {t.node.name: v for t, v in feed.items()}
    args = []
    for t in n.inputs:
        src = t.node
        if src.op == "DeviceCopy":  # a feed copied up: time the kernel on its device copy
            args.append(device.to_device(by_name[src.inputs[0].node.name]))
        elif t in plan.constants:
            args.append(plan.constants[t])
        else:
            args.append(by_name[src.name])  # a host input (sizes, optimizer scalars)
    c = op_cost(node)
    return plan.kernels[n], args, cost_key(node), "x".join(str(a.shape) for a in inputs), c.flops, \
        c.bytes_read + c.bytes_written


def _time(fn, sync, budget_s: float) -> float:
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    once = max(time.perf_counter() - t0, 1e-6)
    reps = int(np.clip(budget_s / once, 3, 200))
    best = np.inf
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / reps)
    return float(best)


def measure_gpu(ops: Optional[Sequence[str]] = None, level: str = "full", budget_s: float = 0.02,
                backend: str = "cuda") -> List[Sample]:
    """One Sample per calibration case whose kernel runs on the GPU, plus the copies (backend
    "simulated": the CI stand-in, which tests this code, not a GPU's speed)."""
    if backend == "cuda" and not gpu.gpu_available():
        raise RuntimeError(f"no GPU available: {gpu.unavailable_reason()}")
    device = Session(Graph(), device="gpu", gpu=backend).devices.get("/device:GPU:0")
    samples: List[Sample] = []
    for op in ops or registry.registered():
        for inputs, build in cases(op, level):
            try:
                kernel, args, key, shape, flops, nbytes = _gpu_case(op, inputs, build, device, backend)
            except Exception:  # an op the GPU path cannot run (host-only, or no GPU kernel): skip it
                continue
            sec = _time(lambda: kernel(*args), device.synchronize, budget_s)
            samples.append(Sample(key, shape, flops, nbytes, sec))
    for n in COPY_SIZES:
        host = np.ones(n // 4, np.float32)
        dev = device.to_device(host)
        up = _time(lambda: device.to_device(host), device.synchronize, budget_s)
        down = _time(lambda: device.to_host(dev), device.synchronize, budget_s)
        samples.append(Sample("DeviceCopy", f"({n // 4},)", 0.0, 2.0 * n, max(up, down)))
    return samples


def calibrate_gpu(name: str = "gpu", ops=None, level: str = "full", backend: str = "cuda") -> DeviceProfile:
    samples = measure_gpu(ops, level, backend=backend)
    profile = replace(fit(samples, name), kind="GPU", blas_threads=None)
    copies = [s for s in samples if s.op == "DeviceCopy"]
    coeffs = dict(profile.op_coeffs)
    coeffs["DeviceCopy"] = fit_coeffs(copies)
    return replace(profile, op_coeffs=coeffs)
