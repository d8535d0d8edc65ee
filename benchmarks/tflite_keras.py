"""The benchmark peer: an isthmus fp32 edge model rebuilt as Keras, converted by TFLiteConverter.

    python benchmarks/tflite_keras.py EDGE.isth CALIB.npy OUT_DIR    # writes tf_fp32.tflite, tf_int8.tflite

Run by peer_files (benchmarks/tflite_export.py, tflite_realdata.py) in a subprocess whose PYTHONPATH
holds tensorflow-cpu. The Keras
model has the edge model's ops and weights (NHWC; explicit ZeroPadding2D where isthmus's pads are
not TensorFlow's SAME), so both .tflite files compute one network. int8 is TFLiteConverter's full
integer quantization calibrated on CALIB (NCHW float32 feeds), float input and output as isthmus's.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np


def _same(size, k, s, d=1):
    out = math.ceil(size / s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


def build_keras(m, tf):
    L = tf.keras.layers
    x_e = m.inputs[0]
    shape = m.tensors[x_e].shape
    inp = tf.keras.Input((shape[2], shape[3], shape[1]) if len(shape) == 4 else tuple(shape[1:]), batch_size=1)
    val = {x_e: inp}

    def conv(op, t):
        a = op.attrs
        wt = np.asarray(m.tensors[op.inputs[1]].data)
        o, cg, kh, kw = wt.shape
        cin = m.tensors[op.inputs[0]].shape[1]
        s, d = tuple(a.get("strides", (1, 1))), tuple(a.get("dilations", (1, 1)))
        pt, pb, pl, pr = a.get("pads", (0, 0, 0, 0))
        hh, ww = m.tensors[op.inputs[0]].shape[2:]
        pad = "valid"
        if (pt, pb) == _same(hh, kh, s[0], d[0]) and (pl, pr) == _same(ww, kw, s[1], d[1]) and (pt, pb, pl, pr) != (0,) * 4:
            pad = "same"
        elif (pt, pb, pl, pr) != (0,) * 4:
            t = L.ZeroPadding2D(((pt, pb), (pl, pr)))(t)
        act = {"none": None, "relu": "relu", "relu6": "relu6"}[a.get("activation", "none")]
        bias = np.asarray(m.tensors[op.inputs[2]].data) if len(op.inputs) > 2 and op.inputs[2] >= 0 else np.zeros(o, np.float32)
        if int(a.get("groups", 1)) == 1:
            layer = L.Conv2D(o, (kh, kw), strides=s, padding=pad, dilation_rate=d, activation=act)
            y = layer(t)
            layer.set_weights([wt.transpose(2, 3, 1, 0), bias])
        else:
            mult = o // cin
            layer = L.DepthwiseConv2D((kh, kw), strides=s, padding=pad, depth_multiplier=mult, dilation_rate=d,
                                      activation=act)
            y = layer(t)
            layer.set_weights([wt.reshape(cin, mult, kh, kw).transpose(2, 3, 0, 1), bias])
        return y

    for op in m.operators:
        a, t = op.attrs, val.get(op.inputs[0])
        if op.op in ("Conv2D", "FusedConv2D"):
            y = conv(op, t)
        elif op.op == "MaxPool":
            k, s = tuple(a["ksize"]), tuple(a.get("strides", a["ksize"]))
            if tuple(a.get("pads", (0, 0, 0, 0))) != (0, 0, 0, 0):
                raise SystemExit("tflite_keras: padded max pool is not rebuilt")
            y = L.MaxPooling2D(k, s)(t)
        elif op.op == "Add":
            y = L.Add()([t, val[op.inputs[1]]])
        elif op.op == "GlobalAvgPool":
            y = L.GlobalAveragePooling2D(keepdims=bool(a.get("keepdims", 0)))(t)
        elif op.op in ("Reshape", "Flatten"):
            if len(t.shape) == 4:
                t = L.Permute((3, 1, 2))(t)      # back to NCHW order before flattening
            y = L.Reshape(tuple(m.tensors[op.outputs[0]].shape[1:]))(t)
            if len(m.tensors[op.outputs[0]].shape) == 4:
                y = L.Permute((2, 3, 1))(y)      # an NCHW result, held NHWC as Keras' layers want
        elif op.op in ("MatMul", "FusedMatMul"):
            wt = np.asarray(m.tensors[op.inputs[1]].data)
            bias = np.asarray(m.tensors[op.inputs[2]].data) if len(op.inputs) > 2 and op.inputs[2] >= 0 \
                else np.zeros(wt.shape[1], np.float32)
            act = {"none": None, "relu": "relu", "relu6": "relu6"}[a.get("activation", "none")]
            layer = L.Dense(wt.shape[1], activation=act)
            y = layer(t)
            layer.set_weights([wt, bias])
        elif op.op == "BiasAdd":
            b = np.asarray(m.tensors[op.inputs[1]].data)
            y = L.Lambda(lambda v, b=b: v + b)(t)
        elif op.op == "Relu":
            y = L.ReLU()(t)
        elif op.op == "Softmax":
            y = L.Softmax()(t)
        else:
            raise SystemExit(f"tflite_keras: op {op.op} is not rebuilt")
        val[op.outputs[0]] = y
    return tf.keras.Model(inp, val[m.outputs[0]])


def peer_files(edge_fp32: bytes, calib, tf_path: str, tmp: str):
    """TFLiteConverter's fp32 and int8 files of the same network (a subprocess with TensorFlow)."""
    src = os.path.join(tmp, "edge.isth")
    with open(src, "wb") as f:
        f.write(edge_fp32)
    np.save(os.path.join(tmp, "calib.npy"), np.stack(calib))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tf_path, os.environ.get("PYTHONPATH", "")]),
               TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run([sys.executable, os.path.abspath(__file__), src, os.path.join(tmp, "calib.npy"), tmp],
                   check=True, timeout=900, env=env, stdout=sys.stderr)
    out = []
    for name in ("tf_fp32.tflite", "tf_int8.tflite"):
        with open(os.path.join(tmp, name), "rb") as f:
            out.append(f.read())
    return out


def main(argv) -> int:
    src, calib_path, out = argv
    import tensorflow as tf
    from isthmus.edge.loader import load
    m = load(src)
    model = build_keras(m, tf)
    calib = np.load(calib_path)
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    with open(os.path.join(out, "tf_fp32.tflite"), "wb") as f:
        f.write(conv.convert())
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([(c.transpose(0, 2, 3, 1) if c.ndim == 4 else c).astype(np.float32)]
                                           for c in calib)
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    with open(os.path.join(out, "tf_int8.tflite"), "wb") as f:
        f.write(conv.convert())
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main(sys.argv[1:]))
