"""Models the edge-format writers' tests share: an MLP, the W2 CNN, a MobileNetV2 (32x32), as
Sessions with their input and output tensors; feeds with fixed seeds."""
import os

import numpy as np

import isthmus as ism

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(name: str, *path: str):
    """A module by file path (benchmarks/cnn.py and tests/edge/cnn.py share a name)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, *path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- models ---------------------------------------------------------------------------------------
def mlp(seed=0, softmax=True):
    rng = np.random.default_rng(seed)
    g = ism.Graph(seed=seed)
    with g.as_default():
        x = ism.placeholder("float32", (None, 20), name="x")
        w1 = ism.Variable((rng.standard_normal((20, 32)) * 0.3).astype(np.float32), name="w1")
        b1 = ism.Variable((rng.standard_normal(32) * 0.1).astype(np.float32), name="b1")
        w2 = ism.Variable((rng.standard_normal((32, 10)) * 0.3).astype(np.float32), name="w2")
        b2 = ism.Variable(np.zeros(10, np.float32), name="b2")
        h = ism.relu(ism.bias_add(x @ w1, b1))
        y = ism.bias_add(h @ w2, b2)
        y = ism.softmax(y) if softmax else y
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    return sess, x, y


def w2_cnn(seed=0):
    """benchmarks/cnn.py's network (its inference half, benchmarks/models.py), conv biases 0.01."""
    g, x, logits = _load("bench_models", "benchmarks", "models.py").cnn_inference(seed=seed, conv_bias=0.01)
    with g.as_default():
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    return sess, x, logits


def mobilenet(res=32):
    g, x, logits = _load("bench_models", "benchmarks", "models.py").mobilenet_v2(batch=1, res=res, seed=0)
    with g.as_default():
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    return sess, x, logits


MODELS = {"mlp": (mlp, (1, 20)), "w2_cnn": (w2_cnn, (1, 1, 28, 28)), "mobilenet_v2_32": (mobilenet, (1, 3, 32, 32))}


def _feeds(shape, n, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]
