"""GPU benchmark: 1000 chained adds on float32[16], us per op: isthmus eager (and with step
capture when available) vs cupy eager, PyTorch eager and a cupy CUDA-graph replay. Prints JSON.
Targets (issue #19): <= cupy; with capture <= 2 us/op."""
from __future__ import annotations

import sys

import numpy as np

import isthmus as ism
from gpu_timing import emit, per_call_ms, skipped, torch_cuda

K = 1000


def main() -> int:
    if skipped("gpu_adds"):
        return 0
    from isthmus.core import gpu
    cp = gpu.array_module("GPU")
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (16,), name="x")
        c = ism.constant(np.full(16, 0.5, np.float32))
        h = x
        for _ in range(K):
            h = ism.add(h, c)
    xv = np.zeros(16, np.float32)
    res = {}
    out = {}
    for mode in ("eager", "capture"):
        try:
            sess = ism.Session(g, device="gpu", optimize=False, capture=(mode == "capture"))
            val = sess.run(h, {x: xv})
            assert np.allclose(val, K * 0.5), val
            res[f"isthmus_{mode}"] = per_call_ms(lambda: sess.run(h, {x: xv}), iters=5) * 1e3 / K
        except Exception as e:  # capture may be unavailable: say why
            out[f"isthmus_{mode}_error"] = f"{type(e).__name__}: {e}"[:300]
    dx, dc = cp.zeros(16, cp.float32), cp.full(16, 0.5, cp.float32)

    def cupy_chain():
        y = dx
        for _ in range(K):
            y = y + dc
        return y
    res["cupy_eager"] = per_call_ms(cupy_chain, iters=5) * 1e3 / K
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        y_graph = cupy_chain()
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    assert float(y_graph[0]) == K * 0.5
    res["cupy_cuda_graph"] = per_call_ms(lambda: graph.launch(stream), iters=20, sync_fn=stream.synchronize) * 1e3 / K
    torch = torch_cuda()
    if torch is not None:
        tx, tc = torch.zeros(16, device="cuda"), torch.full((16,), 0.5, device="cuda")

        def torch_chain():
            y = tx
            for _ in range(K):
                y = y + tc
            return y
        res["torch_eager"] = per_call_ms(torch_chain, iters=5, sync_fn=torch.cuda.synchronize) * 1e3 / K
    out.update({"ops": K, "us_per_op": {k: round(v, 2) for k, v in res.items()},
                "targets": {"eager": "<= cupy_eager", "capture": "<= 2 us/op"}})
    emit("gpu_adds", out)
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
