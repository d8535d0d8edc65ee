"""Tracing overhead on the core MLP training step (784-512-512-10, batch 128).

    python benchmarks/trace_overhead.py

Interleaved medians, same session, same feeds: a plain `run`, a `run` given RunOptions with
tracing off (and a RunMetadata), and a traced `run`. Target: tracing off costs < 2% (the plain
compiled plan runs either way); the traced step's cost is reported for information.
"""
from __future__ import annotations

import numpy as np

import isthmus as ism
from mlp import BATCH, SIZES, build_isthmus, init_weights
from timing import emit, interleaved_medians


def main():
    ws, bs = init_weights()
    sess, x, y, _, loss, train, _ = build_isthmus(ws, bs, BATCH)
    rng = np.random.default_rng(1)
    feed = {x: rng.standard_normal((BATCH, SIZES[0])).astype(np.float32),
            y: rng.integers(0, SIZES[-1], BATCH).astype(np.int32)}
    off = ism.RunOptions(trace=False)
    on = ism.RunOptions(trace=True)
    res = interleaved_medians({
        "plain": lambda: sess.run([loss, train], feed),
        "tracing_off": lambda: sess.run([loss, train], feed, options=off, run_metadata=ism.RunMetadata()),
        "tracing_on": lambda: sess.run([loss, train], feed, options=on, run_metadata=ism.RunMetadata()),
    }, repeats=41)
    overhead = res["tracing_off"] / res["plain"] - 1.0
    emit("trace_overhead", {"ms": {k: round(v * 1e3, 3) for k, v in res.items()},
                            "tracing_off_overhead": round(overhead, 4), "target": 0.02,
                            "tracing_on_overhead": round(res["tracing_on"] / res["plain"] - 1.0, 4),
                            "pass": overhead < 0.02})


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    main()
