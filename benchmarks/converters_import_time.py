"""Import time of a ~100 MB model: from_onnx (file to runnable graph) vs onnx.load and onnxruntime
session creation on the same file, and from_tflite on a TFLite file of the same weights.

    python benchmarks/converters_import_time.py [--mb 100] [--repeats 5]

Two models whose float32 weights add up to the requested size, written to temporary files with
onnx.helper: an MLP of 2048-wide Gemm layers (also as a .tflite of FULLY_CONNECTED layers, with
the tests' TFLiteWriter) and a conv net of 3x3 convolutions (768 channels, BatchNorm and Relu
between). Timed (median of --repeats after one warm-up): onnx.load alone, from_onnx(path),
from_onnx(bytes already in memory), from_onnx + the first Session.run (plan compiled),
onnxruntime.InferenceSession(path), from_tflite(path), and the graph file of the imported model
written and read back (graph_io, as `isthmus import` / `export` do).
Target (issue #20): from_onnx < 0.5 s for a 100 MB model.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from timing import emit  # noqa: E402


def _layers(mb: float, width: int = 2048):
    n = max(1, int(round(mb * 2 ** 20 / 4 / (width * width))))
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((width, width)) * 0.02).astype(np.float32) for _ in range(n)]


def write_onnx(path: str, ws) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    nodes, inits, h = [], [], "x"
    for i, w in enumerate(ws):
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(w.shape[1], np.float32), f"b{i}")]
        nodes += [helper.make_node("Gemm", [h, f"w{i}", f"b{i}"], [f"g{i}"]), helper.make_node("Relu", [f"g{i}"], [f"r{i}"])]
        h = f"r{i}"
    m = helper.make_model(helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                         ["N", ws[0].shape[0]])],
                                            [helper.make_tensor_value_info(h, TensorProto.FLOAT, None)], inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.save(m, path)


def write_onnx_conv(path: str, mb: float, ch: int = 768) -> int:
    """A conv net of 3x3 ch->ch convolutions (BatchNorm, Relu between) with ~`mb` MB of weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    n = max(1, int(round(mb * 2 ** 20 / 4 / (ch * ch * 9))))
    rng = np.random.default_rng(1)
    nodes, inits, h = [], [], "x"
    for i in range(n):
        inits += [numpy_helper.from_array((rng.standard_normal((ch, ch, 3, 3)) * 0.01).astype(np.float32), f"k{i}"),
                  numpy_helper.from_array(np.zeros(ch, np.float32), f"cb{i}")]
        inits += [numpy_helper.from_array(v.astype(np.float32), f"bn{i}_{j}")
                  for j, v in enumerate((np.ones(ch), np.zeros(ch), rng.standard_normal(ch) * 0.1, np.ones(ch)))]
        nodes += [helper.make_node("Conv", [h, f"k{i}", f"cb{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", [f"c{i}"] + [f"bn{i}_{j}" for j in range(4)], [f"n{i}"]),
                  helper.make_node("Relu", [f"n{i}"], [f"r{i}"])]
        h = f"r{i}"
    m = helper.make_model(helper.make_graph(nodes, "bigconv", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", ch, 8, 8])], [helper.make_tensor_value_info(h, TensorProto.FLOAT, None)], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.save(m, path)
    return n


def write_tflite(path: str, ws) -> None:
    from tests.converters.tflite_writer import TFLiteWriter
    w = TFLiteWriter()
    h = x = w.tensor("x", [1, ws[0].shape[0]])
    for i, k in enumerate(ws):
        y = w.tensor(f"y{i}", [1, k.shape[1]])
        w.op("FULLY_CONNECTED", [h, w.const(f"w{i}", np.ascontiguousarray(k.T)), -1], [y],
             dict(FusedActivationFunction=1), "FullyConnectedOptions")
        h = y
    with open(path, "wb") as f:
        f.write(w.finish([x], [h]))


def _median(fn, repeats):
    fn()  # warm-up: first-call imports and the page cache
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=100.0)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    import onnx
    import onnxruntime as ort
    import isthmus as ism
    from isthmus.converters import from_onnx, from_tflite
    ws = _layers(args.mb)
    with tempfile.TemporaryDirectory() as d:
        po, pt, pc = os.path.join(d, "big.onnx"), os.path.join(d, "big.tflite"), os.path.join(d, "conv.onnx")
        write_onnx(po, ws)
        conv_layers = write_onnx_conv(pc, args.mb)
        with open(po, "rb") as f:
            po_bytes = f.read()
        write_tflite(pt, ws)
        x = np.ones((1, ws[0].shape[0]), np.float32)

        def import_and_run():
            g, ins, outs = from_onnx(po)
            ism.Session(g).run(outs[0], {ins["x"]: x})
        res = {"onnx_file_mb": round(os.path.getsize(po) / 2 ** 20, 1),
               "tflite_file_mb": round(os.path.getsize(pt) / 2 ** 20, 1), "layers": len(ws),
               "onnx_load_s": _median(lambda: onnx.load(po), args.repeats),
               "from_onnx_s": _median(lambda: from_onnx(po), args.repeats),
               "from_onnx_bytes_s": _median(lambda: from_onnx(po_bytes), args.repeats),
               "from_onnx_and_first_run_s": _median(import_and_run, args.repeats),
               "onnxruntime_session_s": _median(lambda: ort.InferenceSession(po, providers=["CPUExecutionProvider"]),
                                                args.repeats),
               "from_tflite_s": _median(lambda: from_tflite(pt), args.repeats),
               "conv_onnx_file_mb": round(os.path.getsize(pc) / 2 ** 20, 1), "conv_layers": conv_layers,
               "conv_onnx_load_s": _median(lambda: onnx.load(pc), args.repeats),
               "conv_from_onnx_s": _median(lambda: from_onnx(pc), args.repeats),
               "conv_onnxruntime_session_s": _median(
                   lambda: ort.InferenceSession(pc, providers=["CPUExecutionProvider"]), args.repeats)}
        # graph files (`isthmus import` / `isthmus export`): the imported graph written and read back
        from isthmus.apps import graph_io
        pg = os.path.join(d, "big.graph")
        g, ins, outs = from_onnx(po)
        res["graph_save_s"] = _median(lambda: graph_io.save_graph(pg, g, ins, outs), args.repeats)
        res["graph_file_mb"] = round(os.path.getsize(pg) / 2 ** 20, 1)
        res["graph_load_s"] = _median(lambda: graph_io.load_graph(pg), args.repeats)
        g2, ins2, outs2 = graph_io.load_graph(pg)
        same = np.array_equal(ism.Session(g2).run(outs2[list(outs2)[0]], {ins2["x"]: x}),
                              ism.Session(g).run(outs[0], {ins["x"]: x}))
        res["graph_round_trip_equal"] = bool(same)
    res = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()}
    res["target"] = "from_onnx < 0.5 s (100 MB)"
    res["meets_target"] = max(res["from_onnx_s"], res["conv_from_onnx_s"]) < 0.5
    res["load_avg"] = os.getloadavg()[0]
    emit("converters_import_time", res)
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
