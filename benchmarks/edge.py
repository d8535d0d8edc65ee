"""Edge runtime, batch 1: the fp32 interpreter vs onnxruntime on the same model (MobileNetV2-style
96x96 and the core CNN), arena size vs its lower bound, and the load time of a ~100 MB model.
Targets (edge issue): fp32 <= 4x onnxruntime; delegate <= 1.3x; arena <= 1.1x the lower bound;
load < 20 ms. (The delegate runs onnxruntime with one thread, as a phone would; the peer uses
onnxruntime's defaults.)
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
from isthmus.edge import Interpreter, load
from isthmus.edge.writer import ModelWriter
from models import mobilenet_v2
from timing import emit, interleaved_medians


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
    t = interleaved_medians({"edge": lambda: interp.invoke(xv), "delegate": lambda: delegated.invoke(xv),
                             "ort": lambda: o.run(None, {name: xv})}, repeats=41)
    return {"ms_edge_fp32": round(t["edge"] * 1e3, 3), "ms_edge_delegate": round(t["delegate"] * 1e3, 3),
            "ms_onnxruntime": round(t["ort"] * 1e3, 3),
            "ratio": round(t["edge"] / t["ort"], 3), "delegate_ratio": round(t["delegate"] / t["ort"], 3),
            "arena_bytes": interp.arena_bytes,
            "arena_lower_bound": interp.arena_lower_bound, "sum_of_tensor_bytes": interp.tensor_bytes,
            "arena_over_bound": round(interp.arena_bytes / max(interp.arena_lower_bound, 1), 3)}


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
    g, x, logits = mobilenet_v2()
    sess = ism.Session(g)
    sess.run(ism.global_variables_initializer(g))
    mob = compare(sess, x, logits, np.random.default_rng(0).standard_normal((1, 3, 96, 96)).astype(np.float32))
    cs, cx, _, _, _ = build_cnn(cnn_init(), batch=1)
    clogits = [n for n in cs.graph.nodes if n.op == "BiasAdd"][-1].outputs[0]
    cnn = compare(cs, cx, clogits, np.random.default_rng(1).standard_normal((1, 1, 28, 28)).astype(np.float32))
    lt = load_time_100mb()
    emit("edge", {"mobilenet_v2_96_batch1": mob, "cnn_batch1": cnn, "load": lt,
                  "targets": {"ratio_vs_ort_max": 4.0, "arena_over_bound_max": 1.1, "load_ms_max": 20},
                  "pass": mob["ratio"] <= 4 and cnn["ratio"] <= 4 and lt["load_ms"] < 20})


if __name__ == "__main__":
    main()
