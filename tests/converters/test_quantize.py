"""Post-training int8 quantization: the quantized model keeps its accuracy and shrinks."""
import numpy as np

import isthmus as ism
from isthmus.converters.edge_export import to_edge
from isthmus.converters.quantize import quantize_to_edge
from isthmus.edge import Interpreter

rng = np.random.default_rng(0)


def _digits():
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    return x[order], d.target.astype(np.int32)[order]


def test_quantized_mlp_keeps_its_accuracy_and_shrinks():
    x, y = _digits()
    g = ism.Graph(seed=0)
    with g.as_default():
        xp = ism.placeholder("float32", (None, 64), name="x")
        yp = ism.placeholder("int32", (None,), name="y")
        logits = ism.nn.Sequential([ism.nn.Dense(64, activation="relu"), ism.nn.Dense(10)])(xp)
        step = ism.optimizers.Adam(5e-3).minimize(ism.nn.sparse_softmax_cross_entropy(yp, logits))
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    for _ in range(200):
        i = rng.integers(0, 1400, 64)
        sess.run(step, {xp: x[i], yp: y[i]})
    test_x, test_y = x[1400:], y[1400:]
    fp32 = Interpreter(to_edge(sess, [logits], batch=len(test_y)))
    data, report = quantize_to_edge(sess, [logits], [{"x": x[k:k + 100]} for k in range(0, 400, 100)], batch=len(test_y))
    q = Interpreter(data)
    acc32 = (fp32.invoke(test_x)[0].argmax(1) == test_y).mean()
    acc8 = (q.invoke(test_x)[0].argmax(1) == test_y).mean()
    assert acc32 > 0.9 and acc32 - acc8 <= 0.02, (acc32, acc8)
    assert report["int8_ops"] >= 2
    assert len(data) < 0.5 * len(to_edge(sess, [logits]))  # small model: the flatbuffer itself weighs in
