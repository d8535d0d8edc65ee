"""isthmus: one dataflow graph, trained in the cloud and split between an edge device and the cloud.

`import isthmus` is cheap: the graph machinery (isthmus.core), the edge runtime, onnx and
grpc load only when first used, so `import isthmus.edge` stays light.
"""
from __future__ import annotations

import importlib
import os

__version__ = "0.1.0"

_SUBMODULES = {"core", "edge", "cloud", "partitioner", "converters", "proto", "wire", "jit", "nn", "optimizers",
               "checkpoint", "progress", "train", "summary"}


# BLAS thread count as a process option (partitioner/threads.py): isthmus.set_blas_threads(n), or
# ISTHMUS_BLAS_THREADS=n applied here, at import, only when it is set (it loads numpy and the
# partitioner, which `import isthmus` otherwise leaves for later)
_BLAS = {"set_blas_threads", "blas_threads", "limited_blas_threads"}
if os.environ.get("ISTHMUS_BLAS_THREADS", "").strip():
    importlib.import_module("isthmus.partitioner")  # applies it once (a bad value warns, naming it)


def __getattr__(name: str):
    if name in _BLAS:
        value = getattr(importlib.import_module("isthmus.partitioner.threads"), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        target = f"isthmus.core.{name}" if name in ("nn", "optimizers", "checkpoint", "progress", "train", "summary") else f"isthmus.{name}"
        mod = importlib.import_module(target)
        globals()[name] = mod
        return mod
    core = importlib.import_module("isthmus.core")
    if name == "Session":  # registers the cluster runtime behind Session(target="grpc://..."); grpc loads later
        importlib.import_module("isthmus.cloud")
    try:
        value = getattr(core, name)
    except AttributeError:
        raise AttributeError(f"module 'isthmus' has no attribute '{name}'") from None
    globals()[name] = value
    return value


def __dir__():
    core = importlib.import_module("isthmus.core")
    return sorted(set(globals()) | _SUBMODULES | _BLAS | {n for n in dir(core) if not n.startswith("_")})
