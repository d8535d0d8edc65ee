"""Inter-op (branch) parallelism on imported models: the cost rule's choice against each fixed plan and onnxruntime.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/interop.py [--models inception,resnet50,...]
        [--batches 1,32] [--repeats 9] [--rounds 3]

Each model is benchmarks/converters_infer.py's ONNX file (plus a bidirectional LSTM written here),
imported with from_onnx and run by Sessions that differ only in their thread options:
- auto: the defaults (scheduler.BranchCosts chooses per run between the serial plan and branches);
- serial: parallel=False (the serial plan, default intra-op threads);
- serial_1: parallel=False, intra_op_threads=1;
- branches_1: parallel=True, intra_op_threads=1 (branches on the pool, one intra-op thread each);
and onnxruntime with its default threads on the same bytes. Timing is in blocks (each contender's
repeats in a row, the order rotating by round: spinning threads of one do not land on another's
calls), wall and process CPU per call (all threads), medians of the block medians. The load average
is recorded before and after: on a shared 2-core machine a run at load > 3 is not evidence.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import isthmus as ism  # noqa: E402
from timing import emit  # noqa: E402

PLANS = {"auto": {}, "serial": {"parallel": False}, "serial_1": {"parallel": False, "intra_op_threads": 1},
         "branches_1": {"parallel": True, "intra_op_threads": 1}}


def bilstm_model(batch: int, steps: int = 32, features: int = 64, units: int = 128):
    """converters_infer's LSTM classifier with direction="bidirectional": after import, one
    LSTMSequence per direction, independent of each other."""
    from onnx import TensorProto, helper, numpy_helper
    from converters_infer import _helper_model
    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["", "h"], hidden_size=units, direction="bidirectional"),
             helper.make_node("Transpose", ["h"], ["ht"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["ht", "shape"], ["hf"]),
             helper.make_node("MatMul", ["hf", "Wo"], ["logits"])]
    inits = [init("W", (2, 4 * units, features)), init("R", (2, 4 * units, units)), init("B", (2, 8 * units)),
             numpy_helper.from_array(np.array([0, -1], np.int64), "shape"), init("Wo", (2 * units, 10))]
    m = _helper_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, "N", features])],
                      [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    return m, {"x": rng.standard_normal((steps, batch, features)).astype(np.float32)}


def _model(name: str, batch: int):
    if name == "bilstm":
        return bilstm_model(batch)
    from converters_infer import MODELS
    return MODELS[name](batch)


def _block(fn, repeats: int):
    """Medians over one block of `repeats` calls: (wall s, process CPU s) per call."""
    fn()
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def bench(name: str, batch: int, repeats: int, rounds: int) -> dict:
    import onnxruntime as ort
    from isthmus.converters import from_onnx
    from isthmus.core import threads
    model, feeds = _model(name, batch)
    data = model.SerializeToString()
    ort_sess = ort.InferenceSession(data, ort.SessionOptions(), providers=["CPUExecutionProvider"])
    g, ins, outs = from_onnx(data)
    feed = {ins[k]: v for k, v in feeds.items()}
    sessions = {k: ism.Session(g, **opts) for k, opts in PLANS.items()}
    got = {k: s.run(outs[0], feed) for k, s in sessions.items()}
    want = ort_sess.run(None, feeds)[0]
    fns = {k: (lambda s=s: s.run(outs[0], feed)) for k, s in sessions.items()}
    fns["onnxruntime"] = lambda: ort_sess.run(None, feeds)
    plan = sessions["auto"].plan_for(outs[0], feed)
    runner = plan._runner
    budget = threads.intra_threads()
    chose = runner is not None and plan._branch_choice(plan._scale(list(feed.values())), budget, budget) is not False
    load0 = os.getloadavg()[0]
    samples = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            samples[k].append(_block(fns[k], repeats))
    wall = {k: statistics.median(w for w, _ in v) for k, v in samples.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in samples.items()}
    row = {"model": name, "batch": batch, "auto_runs_branches": bool(chose),
           "branches_same_bytes_as_serial_1": got["branches_1"].tobytes() == got["serial_1"].tobytes(),
           "max_rel_err": float(f"{np.max(np.abs(got['auto'] - want)) / (np.max(np.abs(want)) + 1e-12):.2e}"),
           "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2)}
    for k in fns:
        row[f"{k}_ms"] = round(wall[k] * 1e3, 3)
        row[f"{k}_cpu_ms"] = round(cpu[k] * 1e3, 3)
    for k in PLANS:
        row[f"{k}_vs_serial"] = round(wall[k] / wall["serial"], 3)
        row[f"{k}_vs_onnxruntime"] = round(wall[k] / wall["onnxruntime"], 3)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="inception,resnet50,bilstm,transformer")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    rows = []
    for m in args.models.split(","):
        for b in args.batches.split(","):
            rows.append(bench(m, int(b), args.repeats, args.rounds))
            print(rows[-1], file=sys.stderr, flush=True)
    try:
        from threadpoolctl import threadpool_info
        blas = sorted({i.get("architecture") or "?" for i in threadpool_info() if i.get("user_api") == "blas"})
    except ImportError:
        blas = []
    emit("interop", {"rows": rows, "blas_kernels": blas, "cores": os.cpu_count(),
                     "note": "ratios from one run; wall medians of block medians; cpu: process CPU (all threads) "
                             "per call; a row whose load_before or load_after exceeds 3 is not evidence"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
