"""A small MobileNet-style CNN written straight into the edge format, fp32 or int8 (no core graph):
conv 3x3/2 relu6 -> depthwise 3x3 relu6 -> pointwise 1x1 -> residual add -> conv 3x3 relu ->
max pool -> global average pool -> dense -> softmax. The int8 model quantizes its input and
dequantizes its output, so both take and return float32."""
from __future__ import annotations

import numpy as np

from isthmus.edge.writer import ModelWriter

SHAPE = (1, 3, 32, 32)


def _weights(seed: int):
    rng = np.random.default_rng(seed)
    he = lambda *s: (rng.standard_normal(s) * np.sqrt(2.0 / np.prod(s[1:]))).astype(np.float32)  # noqa: E731
    return {"c1": he(16, 3, 3, 3), "b1": rng.standard_normal(16).astype(np.float32) * 0.1,
            "dw": he(16, 1, 3, 3), "bdw": rng.standard_normal(16).astype(np.float32) * 0.1,
            "pw": he(16, 16, 1, 1), "bpw": np.zeros(16, np.float32),
            "c2": he(32, 16, 3, 3), "b2": rng.standard_normal(32).astype(np.float32) * 0.1,
            "fc": (rng.standard_normal((32, 10)) * 0.25).astype(np.float32), "bfc": np.zeros(10, np.float32)}


def fp32(seed: int = 0) -> bytes:
    p = _weights(seed)
    w = ModelWriter(producer="tests/edge/cnn.py")
    x = w.add_input("x", "float32", SHAPE)

    def conv(name, src, shape, wk, bk, pads, strides, groups, act):
        out = w.add_tensor(name, "float32", shape)
        w.add_operator("FusedConv2D", [src, w.add_constant(wk, p[wk]), w.add_constant(bk, p[bk])], [out],
                       {"strides": strides, "dilations": [1, 1], "pads": pads, "groups": groups, "activation": act})
        return out
    h1 = conv("h1", x, (1, 16, 16, 16), "c1", "b1", [0, 1, 0, 1], [2, 2], 1, "relu6")
    h2 = conv("h2", h1, (1, 16, 16, 16), "dw", "bdw", [1, 1, 1, 1], [1, 1], 16, "relu6")
    h3 = conv("h3", h2, (1, 16, 16, 16), "pw", "bpw", [0, 0, 0, 0], [1, 1], 1, "none")
    h4 = w.add_tensor("h4", "float32", (1, 16, 16, 16))
    w.add_operator("Add", [h3, h1], [h4])
    h5 = conv("h5", h4, (1, 32, 16, 16), "c2", "b2", [1, 1, 1, 1], [1, 1], 1, "relu")
    h6 = w.add_tensor("h6", "float32", (1, 32, 8, 8))
    w.add_operator("MaxPool", [h5], [h6], {"ksize": [2, 2], "strides": [2, 2], "pads": [0, 0, 0, 0]})
    h7 = w.add_tensor("h7", "float32", (1, 32))
    w.add_operator("GlobalAvgPool", [h6], [h7], {"keepdims": 0})
    h8 = w.add_tensor("h8", "float32", (1, 10))
    w.add_operator("FusedMatMul", [h7, w.add_constant("fc", p["fc"]), w.add_constant("bfc", p["bfc"])], [h8],
                   {"transpose_a": 0, "transpose_b": 0, "activation": "none"})
    y = w.add_tensor("y", "float32", (1, 10))
    w.add_operator("Softmax", [h8], [y], {"axis": -1})
    w.mark_output(y)
    w.metadata["split.predicted_ms.edge"] = "0.8"
    return w.to_bytes()


def int8(seed: int = 0) -> bytes:
    """Per-channel symmetric weights, int32 biases, activations with fixed plausible ranges."""
    p = _weights(seed)
    w = ModelWriter(producer="tests/edge/cnn.py")
    act_q = {"x": (4 / 255, 0), "h1": (6 / 255, -128), "h2": (6 / 255, -128), "h3": (8 / 255, 0), "h4": (10 / 255, -10),
             "h5": (8 / 255, -128), "h6": (8 / 255, -128), "h7": (4 / 255, -128), "h8": (8 / 255, 0), "y": (1 / 256, -128)}
    x = w.add_input("x", "float32", SHAPE)

    def act(name, shape):
        s, z = act_q[name]
        return w.add_tensor(name, "int8", shape, scale=[s], zero_point=[z])
    xq = act("x", SHAPE)
    w.add_operator("Quantize", [x], [xq])

    def conv(name, src, src_name, shape, wk, bk, pads, strides, groups, activation):
        wf = p[wk]
        sw = np.abs(wf).reshape(wf.shape[0], -1).max(axis=1) / 127
        wq = np.clip(np.round(wf / sw.reshape(-1, 1, 1, 1)), -127, 127).astype(np.int8)
        sb = act_q[src_name][0] * sw
        bq = np.round(p[bk] / sb).astype(np.int32)
        wi = w.add_constant(wk, wq, scale=sw, zero_point=np.zeros(len(sw), np.int64), axis=0)
        bi = w.add_constant(bk, bq, scale=sb, zero_point=np.zeros(len(sw), np.int64), axis=0)
        out = act(name, shape)
        w.add_operator("FusedConv2D", [src, wi, bi], [out], {"strides": strides, "dilations": [1, 1], "pads": pads,
                                                            "groups": groups, "activation": activation})
        return out
    h1 = conv("h1", xq, "x", (1, 16, 16, 16), "c1", "b1", [0, 1, 0, 1], [2, 2], 1, "relu6")
    h2 = conv("h2", h1, "h1", (1, 16, 16, 16), "dw", "bdw", [1, 1, 1, 1], [1, 1], 16, "relu6")
    h3 = conv("h3", h2, "h2", (1, 16, 16, 16), "pw", "bpw", [0, 0, 0, 0], [1, 1], 1, "none")
    h4 = act("h4", (1, 16, 16, 16))
    w.add_operator("Add", [h3, h1], [h4])
    h5 = conv("h5", h4, "h4", (1, 32, 16, 16), "c2", "b2", [1, 1, 1, 1], [1, 1], 1, "relu")
    h6 = w.add_tensor("h6", "int8", (1, 32, 8, 8), scale=[act_q["h5"][0]], zero_point=[act_q["h5"][1]])
    w.add_operator("MaxPool", [h5], [h6], {"ksize": [2, 2], "strides": [2, 2], "pads": [0, 0, 0, 0]})
    h7 = act("h7", (1, 32))
    w.add_operator("GlobalAvgPool", [h6], [h7], {"keepdims": 0})
    sw = np.abs(p["fc"]).max(axis=0) / 127
    fq = np.clip(np.round(p["fc"] / sw), -127, 127).astype(np.int8)
    fi = w.add_constant("fc", fq, scale=sw, zero_point=np.zeros(10, np.int64), axis=1)
    bi = w.add_constant("bfc", np.zeros(10, np.int32), scale=act_q["h7"][0] * sw, zero_point=np.zeros(10, np.int64), axis=0)
    h8 = act("h8", (1, 10))
    w.add_operator("FusedMatMul", [h7, fi, bi], [h8], {"transpose_a": 0, "transpose_b": 0, "activation": "none"})
    yq = act("y", (1, 10))
    w.add_operator("Softmax", [h8], [yq], {"axis": -1})
    y = w.add_tensor("y_float", "float32", (1, 10))
    w.add_operator("Dequantize", [yq], [y])
    w.mark_output(y)
    return w.to_bytes()
