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
    """benchmarks/cnn.py's network (its inference half): conv5x5x32 SAME relu, max pool 2,
    conv5x5x64 SAME relu, max pool 2, dense 1024 relu, dense 10."""
    rng = np.random.default_rng(seed)
    he = lambda *s: (rng.standard_normal(s) * np.sqrt(2.0 / np.prod(s[1:] if len(s) == 4 else s[:1]))  # noqa: E731
                     ).astype(np.float32)
    g = ism.Graph(seed=seed)
    with g.as_default():
        x = ism.placeholder("float32", (1, 1, 28, 28), name="x")
        v = {k: ism.Variable(a, name=k) for k, a in {
            "c1w": he(32, 1, 5, 5), "c1b": np.full(32, 0.01, np.float32), "c2w": he(64, 32, 5, 5),
            "c2b": np.full(64, 0.01, np.float32), "d1w": he(3136, 1024), "d1b": np.zeros(1024, np.float32),
            "d2w": he(1024, 10), "d2b": np.zeros(10, np.float32)}.items()}
        h = ism.relu(ism.bias_add(ism.conv2d(x, v["c1w"], padding="SAME"), v["c1b"], axis=1))
        h = ism.max_pool(h, 2, 2, "VALID")
        h = ism.relu(ism.bias_add(ism.conv2d(h, v["c2w"], padding="SAME"), v["c2b"], axis=1))
        h = ism.max_pool(h, 2, 2, "VALID")
        h = ism.reshape(h, (-1, 7 * 7 * 64))
        h = ism.relu(ism.bias_add(h @ v["d1w"], v["d1b"]))
        logits = ism.bias_add(h @ v["d2w"], v["d2b"])
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
