"""The edge benchmarks' BLAS setting: this workplace pins OpenBLAS to Haswell kernels
(OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE; see docs NOTES), which makes every numpy timing up to 1.8x
pessimistic against onnxruntime. A benchmark calls `unpin_openblas()` before importing numpy: the
process re-executes itself once without both variables (OpenBLAS reads them when it loads), and
`blas_kernels()` records which kernels ran. Tests and CI never do this."""
from __future__ import annotations

import os
import sys

_PINS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def unpin_openblas() -> None:
    """Re-execute this script without the OpenBLAS pins (once; a no-op when they are not set)."""
    if any(k in os.environ for k in _PINS):
        env = {k: v for k, v in os.environ.items() if k not in _PINS}
        os.execve(sys.executable, [sys.executable] + sys.argv, env)


def blas_kernels() -> list:
    """(library, architecture, threads) of each BLAS numpy loaded (threadpoolctl)."""
    from threadpoolctl import threadpool_info
    return [{k: i.get(k) for k in ("internal_api", "architecture", "num_threads")} for i in threadpool_info()
            if i.get("user_api") == "blas"]
