"""The devices a local Session binds nodes to: the host (numpy), a GPU (cupy) or the stand-in GPU.

A device runtime gives kernels their array module, moves values between host and device, and
keeps the device's memory cap and peak. Placement names devices `/device:CPU:0` or
`/device:GPU:k` (job and task are the cluster's business; a local session serves one task).
"""
from __future__ import annotations

import os
from typing import Dict, Optional

import numpy as np

from . import simgpu
from .devices import DeviceSpec
from .gpu import CudaDevice, gpu_available, parse_pool_limit, require_gpu, unavailable_reason

HOST = "/device:CPU:0"


class HostDevice:
    """The process's CPU: numpy arrays, nothing to copy."""
    name = HOST
    kind = "CPU"
    xp = np
    simulated = False

    def is_device_array(self, x) -> bool:
        return False

    def synchronize(self) -> None:
        pass


class SimulatedGPU:
    """A GPU stand-in for CI: numpy underneath, arrays that refuse to mix with host arrays."""
    kind = "GPU"
    simulated = True

    def __init__(self, index: int = 0, memory=None):
        self.index = index
        self.name = f"/device:GPU:{index}"
        self.xp = simgpu.sim_xp(index)   # its own array module, meter and cap, as each CUDA device has
        self.total_bytes = 16 << 30  # what the stand-in pretends to have
        self.meter = simgpu.meter(index)
        self.cap_bytes = self.set_memory_cap(memory)

    def set_memory_cap(self, limit) -> int:
        cap = parse_pool_limit(limit if limit is not None else os.environ.get("ISTHMUS_GPU_MEMORY"),
                               self.total_bytes)
        self.meter.cap = cap
        self.cap_bytes = cap
        return cap

    def to_device(self, x):
        return simgpu.to_device(x, index=self.index)

    def to_host(self, x):
        return simgpu.to_host(x)

    def is_device_array(self, x) -> bool:
        return isinstance(x, simgpu.SimArray) and x.gpu_index == self.index

    def is_out_of_memory(self, e: BaseException) -> bool:
        return isinstance(e, simgpu.SimulatedOutOfMemory)

    def used_bytes(self) -> int:
        return self.meter.used

    def reset_peak(self) -> None:
        self.meter.reset_peak()

    def peak_bytes(self) -> int:
        return self.meter.peak

    def synchronize(self) -> None:
        pass


def make_gpu(backend: str, index: int, memory=None):
    """The runtime of GPU `index`: 'cuda' (cupy; an error naming the reason when absent) or
    'simulated'."""
    if backend == "simulated":
        return SimulatedGPU(index, memory)
    if backend == "cuda":
        return CudaDevice(index, memory)
    raise ValueError(f"gpu backend {backend!r}: expected 'cuda' or 'simulated'")


class DeviceTable:
    """The devices of one Session, made when first named: local device name -> runtime."""

    def __init__(self, default: str = "cpu", gpu: str = "cuda", gpu_memory=None):
        self.gpu_backend = gpu
        self.gpu_memory = gpu_memory
        self._devices: Dict[str, object] = {HOST: HostDevice()}
        self.default = self._default_name(default)

    def _default_name(self, default: str) -> str:
        d = (default or "cpu").strip()
        low = d.lower()
        if low == "cpu":
            return HOST
        if low == "gpu":
            return "/device:GPU:0"
        if low == "auto":
            if self.gpu_backend == "simulated":
                return "/device:GPU:0"
            return "/device:GPU:0" if gpu_available() else HOST
        spec = DeviceSpec.parse(d)
        if spec.kind is None:
            raise ValueError(f"device {default!r}: name a device kind (cpu, gpu, auto or /device:GPU:0)")
        return local_name(spec)

    def gpu_pins_usable(self) -> bool:
        """Whether nodes pinned to a GPU get one: with no GPU here (cuda backend, cupy absent or no
        device) they run on the host instead (soft placement: a graph partitioned for a cluster
        names GPUs that this machine may not have)."""
        if self.gpu_backend != "cuda":
            return True
        return gpu_available()

    @property
    def uses_gpu(self) -> bool:
        return self.default != HOST or any(k != HOST for k in self._devices)

    def get(self, name: str, node_name: str = "<session>"):
        dev = self._devices.get(name)
        if dev is None:
            spec = DeviceSpec.parse(name)
            if spec.kind != "GPU":
                raise ValueError(f"node '{node_name}': unknown local device {name!r}")
            if self.gpu_backend == "cuda":
                require_gpu(node_name, name)
            dev = self._devices[name] = make_gpu(self.gpu_backend, spec.index or 0, self.gpu_memory)
        return dev

    def gpus(self):
        return [d for k, d in self._devices.items() if k != HOST]


def local_name(spec: DeviceSpec) -> str:
    """The device inside this task that a (possibly partial) spec names."""
    if spec.kind is None or spec.kind == "CPU":
        return HOST
    return f"/device:GPU:{spec.index or 0}"


def to_host_any(x) -> np.ndarray:
    """A host copy of a value from any device (numpy passes through as a copy)."""
    if isinstance(x, simgpu.SimArray):
        return simgpu.to_host(x)
    if isinstance(x, np.ndarray):
        return x.copy()
    get = getattr(x, "get", None)  # cupy.ndarray
    if get is not None and hasattr(x, "__cuda_array_interface__"):
        return get()
    return np.array(x, copy=True)


def apply_device_flag(device: str, job: Optional[str] = None, prog: str = "isthmus") -> str:
    """`--device gpu|cpu|auto` of the server commands: where this process's sessions place nodes
    (through ISTHMUS_DEVICE). Parameter servers stay on the CPU (the paper's layout)."""
    d = (device or "cpu").strip().lower()
    if d not in ("cpu", "gpu", "auto"):
        raise SystemExit(f"{prog}: --device must be gpu, cpu or auto, got {device!r}")
    if job == "ps":
        d = "cpu"
    elif d in ("gpu", "auto"):
        if not gpu_available():
            if d == "gpu":
                raise SystemExit(f"{prog}: --device gpu, but no GPU is available ({unavailable_reason()})")
            d = "cpu"
    os.environ["ISTHMUS_DEVICE"] = d
    return d
