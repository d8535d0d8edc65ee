"""The networks benchmarks/split_accuracy.py splits: SqueezeNet, a ResNet-50-shaped network,
Inception-style blocks and a two-tower model (two inputs), random weights as constants (frozen
graphs, as an imported ONNX model is); MobileNetV2 comes from benchmarks/models.py."""
from __future__ import annotations

import numpy as np

import isthmus as ism


class _Weights:
    """He-initialized constants from one seeded generator."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def conv(self, x, out: int, k: int, stride: int = 1, act=ism.relu, name=None):
        """conv k x k (SAME) + bias + activation, the form an imported ONNX Conv + Relu takes."""
        cin = x.shape[1]
        w = (self.rng.standard_normal((out, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float32)
        b = (self.rng.standard_normal(out) * 0.05).astype(np.float32)
        y = ism.bias_add(ism.conv2d(x, ism.constant(w), strides=stride, padding="SAME"), ism.constant(b), axis=1)
        return act(y, name=name) if act is not None else y

    def dense(self, x, out: int, name=None):
        w = (self.rng.standard_normal((x.shape[1], out)) * np.sqrt(1.0 / x.shape[1])).astype(np.float32)
        return ism.bias_add(ism.matmul(x, ism.constant(w)), ism.constant(np.zeros(out, np.float32)), name=name)


def squeezenet(res: int = 96, classes: int = 100, seed: int = 1):
    """SqueezeNet 1.1: a 3x3/2 stem, fire modules (1x1 squeeze, then 1x1 and 3x3 expands
    concatenated), max pools between, a 1x1 classifier conv and global pooling."""
    g, w = ism.Graph(seed=seed), _Weights(seed)
    with g.as_default():
        x = ism.placeholder("float32", (1, 3, res, res), name="image")
        h = ism.max_pool(w.conv(x, 64, 3, 2), 3, 2, "SAME")

        def fire(h, s, e, i):
            with ism.name_scope(f"fire{i}"):
                sq = w.conv(h, s, 1)
                return ism.concat([w.conv(sq, e, 1), w.conv(sq, e, 3)], axis=1)
        h = fire(fire(h, 16, 64, 2), 16, 64, 3)
        h = ism.max_pool(h, 3, 2, "SAME")
        h = fire(fire(h, 32, 128, 4), 32, 128, 5)
        h = ism.max_pool(h, 3, 2, "SAME")
        for i, (s, e) in enumerate(((48, 192), (48, 192), (64, 256), (64, 256)), start=6):
            h = fire(h, s, e, i)
        y = ism.global_avg_pool(w.conv(h, classes, 1), name="logits")
    return g, [x], y


def resnet50_shaped(res: int = 64, width: int = 32, classes: int = 100, seed: int = 2):
    """ResNet-50's shape (7x7/2 stem, max pool, bottleneck stages of 3, 4, 6, 3 blocks: 1x1, 3x3,
    1x1 x4, projection shortcuts) at `width` base channels (ResNet-50 has 64)."""
    g, w = ism.Graph(seed=seed), _Weights(seed)
    with g.as_default():
        x = ism.placeholder("float32", (1, 3, res, res), name="image")
        h = ism.max_pool(w.conv(x, width, 7, 2, name="stem"), 3, 2, "SAME")
        for stage, (blocks, mult) in enumerate(((3, 1), (4, 2), (6, 4), (3, 8))):
            for b in range(blocks):
                stride = 2 if b == 0 and stage > 0 else 1
                with ism.name_scope(f"stage{stage}_{b}"):
                    inner = width * mult
                    y = w.conv(h, inner, 1)
                    y = w.conv(y, inner, 3, stride)
                    y = w.conv(y, inner * 4, 1, act=None)
                    short = w.conv(h, inner * 4, 1, stride, act=None) if b == 0 else h
                    h = ism.relu(ism.add(y, short), name="out")
        y = w.dense(ism.global_avg_pool(h), classes, name="logits")
    return g, [x], y


def inception(res: int = 64, classes: int = 100, seed: int = 3):
    """A stem and three Inception-style blocks: 1x1; 1x1 -> 3x3; 1x1 -> 3x3 -> 3x3; 3x3 max pool
    -> 1x1, concatenated; a max pool after the second block."""
    g, w = ism.Graph(seed=seed), _Weights(seed)
    with g.as_default():
        x = ism.placeholder("float32", (1, 3, res, res), name="image")
        h = ism.max_pool(w.conv(w.conv(x, 32, 3, 2), 64, 3), 3, 2, "SAME")

        def block(h, c, i):
            with ism.name_scope(f"mixed{i}"):
                a = w.conv(h, c, 1)
                b = w.conv(w.conv(h, c // 2, 1), c, 3)
                d = w.conv(w.conv(w.conv(h, c // 2, 1), c, 3), c, 3)
                p = w.conv(ism.max_pool(h, 3, 1, "SAME"), c // 2, 1)
                return ism.concat([a, b, d, p], axis=1)
        h = block(block(h, 48, 1), 64, 2)
        h = block(ism.max_pool(h, 3, 2, "SAME"), 96, 3)
        y = w.dense(ism.global_avg_pool(h), classes, name="logits")
    return g, [x], y


def two_tower(seed: int = 4):
    """Two inputs: a small image through a heavy convolutional tower (to 128 numbers), and a large
    image (3x128x128, 196 KB) through a cheap one (an 8x8 average pool, then a small conv: 2 KB);
    both joined by a dense head. The heavy tower is built first, so a single split point in
    topological order cannot put the cheap tower alone on the edge."""
    g, w = ism.Graph(seed=seed), _Weights(seed)
    with g.as_default():
        small = ism.placeholder("float32", (1, 3, 32, 32), name="small")
        h = small
        for i, c in enumerate((64, 96, 128, 128)):
            h = w.conv(w.conv(h, c, 3), c, 3, 2 if i else 1, name=f"heavy{i}")
        a = ism.global_avg_pool(h, name="heavy_out")
        large = ism.placeholder("float32", (1, 3, 128, 128), name="large")
        b = w.conv(ism.avg_pool(large, 8, 8, "VALID"), 8, 3, 2, name="cheap")
        b = ism.reshape(b, (1, 8 * 8 * 8), name="cheap_out")
        y = w.dense(ism.relu(w.dense(ism.concat([a, b], axis=1), 128)), 10, name="logits")
    return g, [small, large], y


def mobilenet_v2_96():
    """benchmarks/models.py's MobileNetV2 at 96x96, frozen (its variables as constants)."""
    from models import mobilenet_v2
    g, x, logits = mobilenet_v2(batch=1, res=96)
    with g.as_default():
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    frozen = ism.freeze(sess, [logits])
    return frozen, [frozen.tensor(x.name)], frozen.tensor(logits.name)


MODELS = {"mobilenet_v2_96": mobilenet_v2_96, "squeezenet_96": squeezenet, "resnet50_shaped_64": resnet50_shaped,
          "inception_64": inception, "two_tower": two_tower}
BRANCHING = ("inception_64", "two_tower")
