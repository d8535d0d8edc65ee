"""GPU benchmark: 256 MiB host<->device through copy nodes vs cupy with pinned memory. Prints JSON.
Target (issue #19): >= 0.8 of cupy pinned GB/s. Up: a fed placeholder consumed on the GPU (fed
from pinned memory, gpu.pinned_empty, and from ordinary pageable memory); down: a GPU variable
fetched. Without a GPU it prints a skip record."""
from __future__ import annotations

import sys

import numpy as np

import isthmus as ism
from gpu_timing import emit, per_call_ms, skipped

NBYTES = 256 << 20


def main() -> int:
    if skipped("gpu_transfer"):
        return 0
    from isthmus.core import gpu
    cp = gpu.array_module("GPU")
    n = NBYTES // 4
    pageable = np.arange(n, dtype=np.float32)
    pinned = gpu.pinned_empty((n,), np.float32)
    pinned[...] = pageable
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (n,), name="x")
        up = ism.identity(x, name="on_gpu")
        v = ism.Variable(pageable, name="v")
        init = ism.global_variables_initializer()
    sess = ism.Session(g, device="gpu", optimize=False)  # keeps the identity: the feed must reach the GPU
    sess.run(init)
    got = sess.run(v)
    assert np.array_equal(got, pageable)
    node = up.node
    t_up_pinned = per_call_ms(lambda: sess.run(node, {x: pinned}), iters=5)
    t_up_pageable = per_call_ms(lambda: sess.run(node, {x: pageable}), iters=5)
    t_down = per_call_ms(lambda: sess.run(v), iters=5)
    d = cp.empty(n, cp.float32)
    host_out = gpu.pinned_empty((n,), np.float32)
    t_cp_up = per_call_ms(lambda: d.data.copy_from_host(pinned.ctypes.data, NBYTES), iters=5)
    t_cp_down = per_call_ms(lambda: d.get(out=host_out), iters=5)
    t_cp_up_pageable = per_call_ms(lambda: d.set(pageable), iters=5)

    def gbs(ms):
        return round(NBYTES / ms / 1e6, 2)
    out = {"bytes": NBYTES,
           "GB_per_s": {"isthmus_up_pinned_feed": gbs(t_up_pinned), "isthmus_up_pageable_feed": gbs(t_up_pageable),
                        "isthmus_down": gbs(t_down), "cupy_up_pinned": gbs(t_cp_up), "cupy_down_pinned": gbs(t_cp_down),
                        "cupy_up_pageable": gbs(t_cp_up_pageable)},
           "ratio_up_pinned": round(t_cp_up / t_up_pinned, 3), "ratio_up_pageable": round(t_cp_up / t_up_pageable, 3),
           "ratio_down": round(t_cp_down / t_down, 3), "target": ">= 0.8 of cupy pinned"}
    emit("gpu_transfer", out)
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
