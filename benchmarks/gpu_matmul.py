"""GPU benchmark: an 8192^3 float32 matmul through a Session vs cupy's own. Prints JSON.
Target (issue #19): >= 0.95 of cupy's TFLOP/s. Without a GPU it prints a skip record."""
from __future__ import annotations

import sys

import numpy as np

import isthmus as ism
from gpu_timing import emit, per_call_ms, skipped

N = 8192


def main() -> int:
    if skipped("gpu_matmul"):
        return 0
    from isthmus.core import gpu
    cp = gpu.array_module("GPU")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((N, N), dtype=np.float32)
    b = rng.standard_normal((N, N), dtype=np.float32)
    g = ism.Graph()
    with g.as_default():
        A, B = ism.Variable(a, name="A"), ism.Variable(b, name="B")
        prod = ism.matmul(A, B, name="prod")
        init = ism.global_variables_initializer()
    sess = ism.Session(g, device="gpu")
    sess.run(init)
    da, db = cp.asarray(a), cp.asarray(b)
    check = sess.run(prod)[:2, :2]
    want = (a[:2].astype(np.float64) @ b[:, :2].astype(np.float64))
    err = float(np.max(np.abs(check - want)) / np.max(np.abs(want)))
    node = prod.node  # fetching the node runs it and brings nothing back
    t_ism = per_call_ms(lambda: sess.run(node), iters=10)
    t_cp = per_call_ms(lambda: cp.matmul(da, db), iters=10)
    flops = 2.0 * N ** 3
    out = {"shape": [N, N, N], "ms": {"isthmus": round(t_ism, 3), "cupy": round(t_cp, 3)},
           "tflops": {"isthmus": round(flops / t_ism / 1e9, 2), "cupy": round(flops / t_cp / 1e9, 2)},
           "ratio_of_cupy": round(t_cp / t_ism, 3), "target": ">= 0.95", "max_rel_err_vs_fp64": err,
           "peak_device_bytes": sess.memory_stats()}
    emit("gpu_matmul", out)
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
