"""Timing helpers for the GPU benchmarks: synchronized loops, medians of rounds, JSON out."""
from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Callable, Dict, Optional

from isthmus.core import gpu


def sync() -> None:
    gpu.array_module("GPU").cuda.get_current_stream().synchronize()


def torch_sync(torch) -> Callable[[], None]:
    return torch.cuda.synchronize


def per_call_ms(fn: Callable[[], object], iters: int, rounds: int = 5, warmup: int = 3,
                sync_fn: Optional[Callable[[], None]] = None, budget_s: float = 20.0) -> float:
    """Median over rounds of the mean ms per call of `fn` in a loop of `iters`, synchronized at
    both ends of each round (so queued GPU work is counted, and pipelining across calls is kept)."""
    s = sync_fn or sync
    for _ in range(warmup):
        fn()
    s()
    out = []
    t_start = time.perf_counter()
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        s()
        out.append((time.perf_counter() - t0) * 1e3 / iters)
        if time.perf_counter() - t_start > budget_s:
            break
    return statistics.median(out)


def device_info() -> Dict[str, object]:
    if not gpu.gpu_available():
        return {"gpu": None, "reason": gpu.unavailable_reason()}
    cp = gpu.array_module("GPU")
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    return {"gpu": name.decode() if isinstance(name, bytes) else str(name), "cupy": cp.__version__,
            "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def emit(name: str, results: Dict[str, object]) -> None:
    print(json.dumps({"benchmark": name, "device": device_info(), **results}, indent=1, default=str))
    sys.stdout.flush()


def skipped(name: str) -> bool:
    """Print the skip record and return True when there is no GPU."""
    if gpu.gpu_available():
        return False
    print(json.dumps({"benchmark": name, "skipped": f"no GPU: {gpu.unavailable_reason()}"}))
    return True


def torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None or b == 0 else round(a / b, 3)
