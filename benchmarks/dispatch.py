"""Dispatch overhead: a chain of 1000 `x = x + 1.0` on float32[16], x fed.

Microseconds per op for isthmus, a plain numpy loop, onnxruntime and PyTorch eager; plus
Session.run overhead for a one-node graph. Targets: isthmus (passes off) <= 2x the numpy
loop per op and one-node Session.run under 30 us (core issue); with passes on the chain
folds away, <= 0.2 us per original op (control-flow/passes issue).
"""
from __future__ import annotations

import numpy as np

import isthmus as ism
from timing import emit, median_seconds, torch_or_none

N = 1000


def isthmus_chain(optimize=False):
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (16,), name="x")
        y = x
        for _ in range(N):
            y = y + 1.0
    sess = ism.Session(g, optimize=optimize)
    xv = np.zeros(16, np.float32)
    assert sess.run(y, {x: xv})[0] == N
    return lambda: sess.run(y, {x: xv})


def numpy_chain():
    xv = np.zeros(16, np.float32)

    def run():
        x = xv
        for _ in range(N):
            x = x + 1.0
        return x
    return run


def ort_chain():
    import onnxruntime as ort
    from onnx import TensorProto, helper
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    nodes = [helper.make_node("Add", ["x" if i == 0 else f"t{i-1}", "one"], [f"t{i}" if i < N - 1 else "y"])
             for i in range(N)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])], [one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # no folding: measure dispatch
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    xv = np.zeros(16, np.float32)
    assert sess.run(None, {"x": xv})[0][0] == N
    return lambda: sess.run(None, {"x": xv})


def torch_chain(torch):
    xv = torch.zeros(16)

    def run():
        x = xv
        with torch.no_grad():
            for _ in range(N):
                x = x + 1.0
        return x
    return run


def one_node_overhead():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (16,), name="x")
        y = ism.relu(x)
    sess = ism.Session(g)
    xv = np.ones(16, np.float32)
    t_run = median_seconds(lambda: sess.run(y, {x: xv}), repeats=21, inner=2000)
    t_kernel = median_seconds(lambda: np.maximum(xv, 0, dtype=np.float32), repeats=21, inner=2000)
    return t_run, t_kernel


def main():
    res = {}
    for name, make in [("isthmus", isthmus_chain), ("isthmus_passes_on", lambda: isthmus_chain(True)),
                       ("numpy_loop", numpy_chain), ("onnxruntime", ort_chain)]:
        res[name] = median_seconds(make(), repeats=21, inner=5) / N * 1e6
    torch = torch_or_none()
    if torch is not None:
        torch.set_num_threads(1)
        res["torch_eager"] = median_seconds(torch_chain(torch), repeats=21, inner=5) / N * 1e6
    t_run, t_kernel = one_node_overhead()
    out = {
        "us_per_op": {k: round(v, 3) for k, v in res.items()},
        "ratio_isthmus_over_numpy": round(res["isthmus"] / res["numpy_loop"], 3),
        "target_ratio_max": 2.0,
        "passes_on_target_us_per_op_max": 0.2,
        "one_node_session_run_us": round(t_run * 1e6, 2),
        "one_node_kernel_alone_us": round(t_kernel * 1e6, 2),
        "one_node_target_us_max": 30.0,
    }
    out["pass"] = (out["ratio_isthmus_over_numpy"] <= 2.0 and out["one_node_session_run_us"] < 30.0
                   and res["isthmus_passes_on"] <= 0.2)
    emit("dispatch", out)


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    main()
