"""GPU benchmark: data-parallel replicas (core/data_parallel.py) on the MLP 784-512-512-10 SGD step,
ms per step on the whole batch: a plain Session on GPU 0, DataParallel on one GPU (its replica
thread, the AllReduce node and a one-rank NCCL communicator: the overhead of the machinery), and on
every GPU of the machine when it has two or more (NCCL's all-reduce across them). Each runner is
built once and trains b128 then b4096; the first step's loss of each batch size is checked against
the plain Session's (its weights have moved the same way). Prints JSON; without a GPU, a skip record. ISTHMUS_GPU=simulated: a dry run on two stand-in GPUs
(checks the script, times nothing worth reading)."""
from __future__ import annotations

import os
import sys

import numpy as np

import isthmus as ism
from gpu_timing import emit, per_call_ms, ratio, skipped

LR = 0.01
BATCHES = (128, 4096)
SIM = os.environ.get("ISTHMUS_GPU") == "simulated"


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    sizes = (784, 512, 512, 10)
    return [rng.uniform(-np.sqrt(6 / (a + b)), np.sqrt(6 / (a + b)), (a, b)).astype(np.float32)
            for a, b in zip(sizes[:-1], sizes[1:])]


def _model_fn():
    ws = _weights()
    x = ism.placeholder("float32", (None, 784), name="x")
    y = ism.placeholder("int32", (None,), name="y")
    h = x
    for i, w in enumerate(ws):
        h = ism.bias_add(h @ ism.Variable(w, name=f"W{i}"), ism.Variable(np.zeros(w.shape[1], np.float32), name=f"b{i}"))
        if i < 2:
            h = ism.relu(h)
    return ism.reduce_mean(ism.sparse_softmax_cross_entropy(y, h)), [x, y]


def _plain():
    g = ism.Graph(seed=0)
    with g.as_default():
        loss, (x, y) = _model_fn()
        train = ism.optimizers.SGD(LR).minimize(loss)
        init = ism.global_variables_initializer()
    s = ism.Session(g, device="gpu")  # (ISTHMUS_GPU=simulated: the stand-in)
    s.run(init)
    return lambda xs, ys: float(s.run([loss, train], {x: xs, y: ys})[0])


def _time(step, xs, ys):
    """The first step's loss (from the same initial weights for every runner) and ms per step."""
    first = step(xs, ys)
    return first, per_call_ms(lambda: step(xs, ys), iters=20, **({"sync_fn": lambda: None, "rounds": 1} if SIM else {}))


def _rows(out, runners, batches):
    """Each runner made once, then timed on every batch size in turn."""
    steps = []
    for name, make in runners:
        try:
            steps.append((name, make()))
        except Exception as e:  # say why, keep the other runners
            out[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]
    rng = np.random.default_rng(1)
    for b in batches:
        xs = rng.standard_normal((b, 784)).astype(np.float32)
        ys = rng.integers(0, 10, b).astype(np.int32)
        row = out.setdefault(f"mlp_b{b}", {"ms": {}})
        for name, step in steps:
            try:
                first, row["ms"][name] = _time(step, xs, ys)
                row.setdefault("first_loss", {})[name] = round(first, 6)
            except Exception as e:
                row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]


def main() -> int:
    if not SIM and skipped("gpu_data_parallel"):
        return 0
    from isthmus.core import gpu
    n_gpus = 2 if SIM else gpu.device_count()
    out = {"gpus": n_gpus, "nccl": gpu.nccl_unavailable_reason() or "available"}
    from isthmus.core.data_parallel import DataParallel
    runners = [("session_gpu0", _plain)]
    opened = []

    def data_parallel(n):
        def make():
            dp = DataParallel(_model_fn, lambda: ism.optimizers.SGD(LR), devices=n, gpu="simulated" if SIM else "cuda")
            opened.append(dp)
            out[f"communicator_{n}gpu"] = dp.communicator.kind
            return lambda xs, ys: dp.step({"x": xs, "y": ys})
        return make
    runners.append(("data_parallel_1gpu", data_parallel(1)))
    if n_gpus > 1:
        runners.append((f"data_parallel_{n_gpus}gpu", data_parallel(n_gpus)))
    _rows(out, runners, BATCHES)
    for dp in opened:
        dp.close()
    for b in BATCHES:
        row = out[f"mlp_b{b}"]
        ms, first = row["ms"], row.get("first_loss", {})
        row["ms"] = {k: round(v, 3) for k, v in ms.items()}
        row["ratio_1gpu_vs_session"] = ratio(ms.get("data_parallel_1gpu"), ms.get("session_gpu0"))
        ref = first.get("session_gpu0")
        for k, v in first.items():
            if k != "session_gpu0" and ref is not None:
                row[f"first_loss_matches_{k[14:]}"] = bool(abs(v - ref) <= 1e-4 * max(1.0, abs(ref)))
    emit("gpu_data_parallel", out)
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
