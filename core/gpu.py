"""GPU backend foundation: the ONE place that imports cupy (lazily).

Status (issue #9): this module provides availability detection, the array
module per device kind, the memory-pool cap parsing/applying and peak
accounting. It is NOT yet wired into the executor (no copy-insertion pass,
no GPU kernels): see the issue for what remains. Without cupy or a GPU,
GPU devices are simply absent and `require_gpu` raises a clear error naming
the node that was pinned to a GPU.
"""
from __future__ import annotations

from typing import Optional, Union

import numpy as np

_cupy = None          # the cupy module once imported
_probe_done = False
_probe_error: Optional[str] = None

DEFAULT_POOL_FRACTION = 0.8   # never all of the device by default


def _probe():
    global _cupy, _probe_done, _probe_error
    if _probe_done:
        return _cupy
    _probe_done = True
    try:
        import cupy  # noqa: the only cupy import in the package
    except Exception as e:  # ImportError, or a broken CUDA install
        _probe_error = f"cupy is not importable ({type(e).__name__}: {e}); install the 'gpu' extra"
        return None
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        _probe_error = f"cupy is installed but no CUDA device is usable ({type(e).__name__}: {e})"
        return None
    if n < 1:
        _probe_error = "cupy is installed but reports 0 CUDA devices"
        return None
    _cupy = cupy
    return cupy


def gpu_available() -> bool:
    return _probe() is not None


def unavailable_reason() -> Optional[str]:
    _probe()
    return _probe_error


def require_gpu(node_name: str, device: str):
    """Return cupy, or raise naming the node that was pinned to a GPU."""
    cp = _probe()
    if cp is None:
        raise RuntimeError(f"node {node_name!r} is placed on {device!r} but no GPU is available: "
                           f"{_probe_error}")
    return cp


def array_module(kind: str):
    """numpy for CPU, cupy for GPU (error when absent)."""
    if kind == "CPU":
        return np
    if kind == "GPU":
        return require_gpu("<array_module>", "GPU")
    raise ValueError(f"unknown device kind {kind!r}; expected 'CPU' or 'GPU'")


def parse_pool_limit(limit: Union[None, int, float, str], total_bytes: int) -> int:
    """A cap in bytes from a fraction in (0, 1], a byte count, or a string
    like '0.5', '8GiB', '512MiB'. None -> DEFAULT_POOL_FRACTION of the device."""
    if total_bytes <= 0:
        raise ValueError(f"device total memory must be positive, got {total_bytes}")
    if limit is None:
        return int(total_bytes * DEFAULT_POOL_FRACTION)
    if isinstance(limit, str):
        s = limit.strip()
        units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "B": 1}
        for u, mul in units.items():
            if s.endswith(u):
                try:
                    v = float(s[:-len(u)])
                except ValueError:
                    raise ValueError(f"gpu memory limit {limit!r}: malformed number") from None
                return _check_bytes(int(v * mul), total_bytes, limit)
        try:
            limit = float(s)
        except ValueError:
            raise ValueError(f"gpu memory limit {limit!r}: expected a fraction, bytes, or N[KiB|MiB|GiB]") from None
    if isinstance(limit, bool) or not isinstance(limit, (int, float)):
        raise ValueError(f"gpu memory limit must be a fraction or bytes, got {limit!r}")
    if isinstance(limit, float) and limit <= 1.0:
        if not 0.0 < limit:
            raise ValueError(f"gpu memory fraction must be in (0, 1], got {limit}")
        return int(total_bytes * limit)
    return _check_bytes(int(limit), total_bytes, limit)


def _check_bytes(n: int, total: int, orig) -> int:
    if n <= 0:
        raise ValueError(f"gpu memory limit {orig!r} must be positive")
    if n > total:
        raise ValueError(f"gpu memory limit {orig!r} ({n} bytes) exceeds the device's {total} bytes")
    return n


def configure_memory_pool(limit=None) -> int:
    """Cap cupy's default memory pool for this process; returns the cap in bytes."""
    cp = array_module("GPU")
    _free, total = cp.cuda.runtime.memGetInfo()
    cap = parse_pool_limit(limit, int(total))
    cp.get_default_memory_pool().set_limit(size=cap)
    return cap


class PeakMeter:
    """Peak device bytes over a run. `sample(used)` is fed the pool's used
    bytes (cupy: get_default_memory_pool().used_bytes()); tests feed it
    a pseudo-device's counter."""
    def __init__(self):
        self.start = None
        self.peak = 0

    def sample(self, used: int) -> None:
        if self.start is None:
            self.start = used
        if used > self.peak:
            self.peak = used
