"""Edge runtime, batch 1: the fp32 interpreter vs onnxruntime on the same model (MobileNetV2-style
96x96 and the core CNN), the int8 interpreter vs the fp32 one, arena size vs its lower bound, and
the load time of a ~100 MB model.
Targets (edge issue): fp32 <= 4x onnxruntime; int8 numpy path <= 1.2x the fp32 numpy path;
delegate <= 1.3x; arena <= 1.1x the lower bound; load < 20 ms. (The delegate and the peer both run
onnxruntime with its default threads; `ratio_1thread` compares one thread each.)

The edge path uses the compiled kernels (isthmus.jit: depthwise convolutions, 1x1 bias + clamp, int8
requantizations) when numba imports; `compiled_kernels` says whether they ran, and ISTHMUS_JIT=0
times the numpy kernels alone.

The int8 model is calibrated on a few random inputs (its speed does not depend on the ranges);
int8 and fp32 are timed interleaved, by wall clock and, less sensitive to other processes on a
shared machine, by this thread's CPU time with BLAS on one thread. The int8 model has the
quantizer's default scales: conv weight scales per channel and powers of two apart, activation
scales of 4 significant bits (one short requantization multiplier per layer, requantized in
float32); `int8_free_scales` times MobileNetV2 with each channel's own scale and free activation
scales too (pow2_scales=False).
"""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import onnxruntime as ort

import isthmus as ism
from cnn import build_isthmus as build_cnn, init as cnn_init
from isthmus.converters import to_onnx
from isthmus.converters.edge_export import to_edge
from isthmus.converters.quantize import quantize_to_edge
from isthmus.edge import Interpreter, load
from isthmus.edge.writer import ModelWriter
from models import mobilenet_v2
from timing import blocked_medians, emit, interleaved_medians, median_seconds


def compare(sess, x, y, xv):
    data = to_edge(sess, [y], batch=xv.shape[0], delegate=True)
    interp = Interpreter(data)
    delegated = Interpreter(data, delegate="onnxruntime")
    model = to_onnx(sess, [y])
    o = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    name = o.get_inputs()[0].name
    a, b = interp.invoke(xv)[0], o.run(None, {name: xv})[0]
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(delegated.invoke(xv)[0], a, rtol=1e-3, atol=1e-4)
    # onnxruntime's intra-op threads (the peer's and the delegate's) spin after each run and slow
    # whichever contender runs next (measured: the edge fp32 path 3.8 ms alone, 9.0 ms right after
    # onnxruntime; interleaved with the delegate, 8.3 vs 5.5 ms), so each contender is timed in a
    # block of its own, the blocks taking turns over 3 rounds; a contender's time is the median
    # of its 3 block medians
    t = blocked_medians({"edge": lambda: interp.invoke(xv), "delegate": lambda: delegated.invoke(xv),
                         "ort": lambda: o.run(None, {name: xv})}, repeats=21, rounds=3)
    # the same with one thread each (BLAS for the edge path, intra-op for onnxruntime): batch-1
    # layers are too small for a second BLAS thread to pay on this 2-core machine
    from threadpoolctl import threadpool_limits
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    o1 = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    delegated1 = Interpreter(data, delegate="onnxruntime", delegate_threads=1)
    with threadpool_limits(1):
        t1 = blocked_medians({"edge": lambda: interp.invoke(xv), "ort": lambda: o1.run(None, {name: xv}),
                              "delegate": lambda: delegated1.invoke(xv)}, repeats=21, rounds=5)
    return {"ms_edge_fp32_1thread": round(t1["edge"] * 1e3, 3), "ms_onnxruntime_1thread": round(t1["ort"] * 1e3, 3),
            "ratio_1thread": round(t1["edge"] / t1["ort"], 3),
            "ms_edge_delegate_1thread": round(t1["delegate"] * 1e3, 3),
            "delegate_ratio_1thread": round(t1["delegate"] / t1["ort"], 3),
            "ms_edge_fp32": round(t["edge"] * 1e3, 3), "ms_edge_delegate": round(t["delegate"] * 1e3, 3),
            "ms_onnxruntime": round(t["ort"] * 1e3, 3),
            "ratio": round(t["edge"] / t["ort"], 3), "delegate_ratio": round(t["delegate"] / t["ort"], 3),
            "arena_bytes": interp.arena_bytes,
            "arena_lower_bound": interp.arena_lower_bound, "sum_of_tensor_bytes": interp.tensor_bytes,
            "arena_over_bound": round(interp.arena_bytes / max(interp.arena_lower_bound, 1), 3)}


def int8_vs_fp32(sess, x, y, xv, repeats=41, pow2_scales=True):
    """int8 / fp32 time of the numpy paths: interleaved wall-clock medians (BLAS threads as they
    are, and one BLAS thread), and medians of this thread's CPU time with one BLAS thread."""
    from threadpoolctl import threadpool_limits
    rng = np.random.default_rng(3)
    calib = [{x: rng.standard_normal(xv.shape).astype(np.float32)} for _ in range(4)]
    fp32 = Interpreter(to_edge(sess, [y], batch=xv.shape[0]))
    int8 = Interpreter(quantize_to_edge(sess, [y], calib, batch=xv.shape[0], pow2_scales=pow2_scales)[0])
    wall = interleaved_medians({"fp32": lambda: fp32.invoke(xv), "int8": lambda: int8.invoke(xv)}, repeats=repeats)
    cpu = {"fp32": [], "int8": []}
    with threadpool_limits(1):
        wall1 = interleaved_medians({"fp32": lambda: fp32.invoke(xv), "int8": lambda: int8.invoke(xv)}, repeats=repeats)
        for it in (fp32, int8):
            it.invoke(xv)
        for _ in range(repeats):
            for k, it in (("fp32", fp32), ("int8", int8)):
                t0 = time.thread_time()
                it.invoke(xv)
                cpu[k].append(time.thread_time() - t0)
    cpu = {k: sorted(v)[len(v) // 2] for k, v in cpu.items()}
    return {"ms_fp32": round(wall["fp32"] * 1e3, 3), "ms_int8": round(wall["int8"] * 1e3, 3),
            "int8_over_fp32": round(wall["int8"] / wall["fp32"], 3),
            "ms_fp32_1thread": round(wall1["fp32"] * 1e3, 3), "ms_int8_1thread": round(wall1["int8"] * 1e3, 3),
            "int8_over_fp32_1thread": round(wall1["int8"] / wall1["fp32"], 3),
            "cpu_ms_fp32_1thread": round(cpu["fp32"] * 1e3, 3), "cpu_ms_int8_1thread": round(cpu["int8"] * 1e3, 3),
            "cpu_int8_over_fp32_1thread": round(cpu["int8"] / cpu["fp32"], 3),
            "arena_bytes_int8": int8.arena_bytes, "arena_lower_bound_int8": int8.arena_lower_bound}


def load_time_100mb():
    w = ModelWriter()
    for i in range(25):
        w.add_constant(f"w{i}", np.full((1024, 1024), i, np.float32))  # 25 x 4 MiB
    w.mark_output(w.add_input("x", "float32", (1,)))
    path = os.path.join(tempfile.mkdtemp(), "big.isth")
    w.save(path)
    times = []
    for _ in range(11):
        t0 = time.perf_counter()
        load(path)
        times.append(time.perf_counter() - t0)
    return {"file_mb": round(os.path.getsize(path) / 2 ** 20, 1), "load_ms": round(sorted(times)[5] * 1e3, 3)}


def main():
    from isthmus import jit
    load_before = round(os.getloadavg()[0], 2)
    g, x, logits = mobilenet_v2()
    sess = ism.Session(g)
    sess.run(ism.global_variables_initializer(g))
    mx = np.random.default_rng(0).standard_normal((1, 3, 96, 96)).astype(np.float32)
    mob = compare(sess, x, logits, mx)
    mob["int8"] = int8_vs_fp32(sess, x, logits, mx)
    free = int8_vs_fp32(sess, x, logits, mx, repeats=21, pow2_scales=False)
    mob["int8_free_scales"] = {k: free[k] for k in ("int8_over_fp32", "cpu_int8_over_fp32_1thread")}
    cs, cx, _, _, _ = build_cnn(cnn_init(), batch=1)
    clogits = [n for n in cs.graph.nodes if n.op == "BiasAdd"][-1].outputs[0]
    cxv = np.random.default_rng(1).standard_normal((1, 1, 28, 28)).astype(np.float32)
    cnn = compare(cs, cx, clogits, cxv)
    cnn["int8"] = int8_vs_fp32(cs, cx, clogits, cxv)
    lt = load_time_100mb()
    # both measures must meet it: the wall clock (the issue's) and the CPU time (robust to a loaded machine)
    int8_ok = all(max(r["int8"]["int8_over_fp32"], r["int8"]["cpu_int8_over_fp32_1thread"]) <= 1.2 for r in (mob, cnn))
    arena_ok = all(r["arena_over_bound"] <= 1.1 and r["int8"]["arena_bytes_int8"] <= 1.1 * r["int8"]["arena_lower_bound_int8"]
                   for r in (mob, cnn))
    # the delegate target on the one-thread pair (as a phone runs it); both sessions at default threads
    # spin on the two shared cores and swing 0.8-1.8x from run to run (reported beside it)
    delegate_ok = all(r["delegate_ratio_1thread"] <= 1.3 for r in (mob, cnn))
    emit("edge", {"mobilenet_v2_96_batch1": mob, "cnn_batch1": cnn, "load": lt,
                  "compiled_kernels": jit.available(), "load_average": [load_before, round(os.getloadavg()[0], 2)],
                  "targets": {"ratio_vs_ort_max": 4.0, "int8_over_fp32_max": 1.2, "arena_over_bound_max": 1.1,
                              "delegate_ratio_max": 1.3, "load_ms_max": 20},
                  "int8_pass": int8_ok, "arena_pass": arena_ok, "delegate_pass": delegate_ok,
                  "pass": mob["ratio"] <= 4 and cnn["ratio"] <= 4 and lt["load_ms"] < 20 and int8_ok and arena_ok
                  and delegate_ok})


if __name__ == "__main__":
    main()
