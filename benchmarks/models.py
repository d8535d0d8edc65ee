"""Model builders shared by the benchmarks: the core issue's CNN and a MobileNetV2-style network."""
from __future__ import annotations

import numpy as np

import isthmus as ism

# ---- the core issue's CNN (benchmarks/cnn.py): conv5x5x32 SAME relu, max pool 2, conv5x5x64 SAME relu,
# max pool 2, dense 1024 relu, dense 10, on 1x28x28 inputs -------------------------------------------
def cnn_params(seed=0, conv_bias=0.0):
    """He-initialized weights by name; conv_bias fills the conv biases (dense biases stay zero)."""
    rng = np.random.default_rng(seed)

    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return {
        "c1w": he((32, 1, 5, 5), 25), "c1b": np.full(32, conv_bias, np.float32),
        "c2w": he((64, 32, 5, 5), 800), "c2b": np.full(64, conv_bias, np.float32),
        "d1w": he((7 * 7 * 64, 1024), 3136), "d1b": np.zeros(1024, np.float32),
        "d2w": he((1024, 10), 1024), "d2b": np.zeros(10, np.float32),
    }


def cnn_logits(x, p):
    """The CNN's logits for input x (N, 1, 28, 28), its weights p made Variables named by key."""
    v = {k: ism.Variable(a, name=k) for k, a in p.items()}
    h = ism.relu(ism.bias_add(ism.conv2d(x, v["c1w"], padding="SAME"), v["c1b"], axis=1))
    h = ism.max_pool(h, 2, 2, "VALID")
    h = ism.relu(ism.bias_add(ism.conv2d(h, v["c2w"], padding="SAME"), v["c2b"], axis=1))
    h = ism.max_pool(h, 2, 2, "VALID")
    h = ism.reshape(h, (-1, 7 * 7 * 64))
    h = ism.relu(ism.bias_add(h @ v["d1w"], v["d1b"]))
    return ism.bias_add(h @ v["d2w"], v["d2b"])


def cnn_inference(batch=1, seed=0, conv_bias=0.0):
    """A graph, its input placeholder "x" and logits: the CNN's inference half."""
    g = ism.Graph(seed=seed)
    with g.as_default():
        x = ism.placeholder("float32", (batch, 1, 28, 28), name="x")
        logits = cnn_logits(x, cnn_params(seed, conv_bias))
    return g, x, logits


def cnn_train(p, batch, lr):
    """A graph, placeholders x and y (int32 labels), mean cross-entropy loss and an SGD(lr) step."""
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (batch, 1, 28, 28), name="x")
        y = ism.placeholder("int32", (batch,), name="y")
        logits = cnn_logits(x, p)
        loss = ism.reduce_mean(ism.sparse_softmax_cross_entropy(y, logits))
        train = ism.optimizers.SGD(lr).minimize(loss)
    return g, x, y, loss, train


# ---- MobileNetV2 -----------------------------------------------------------------------------------
# (expansion, out channels, repeats, first stride): MobileNetV2's schedule, widths capped at 96
MOBILENET_BLOCKS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 2, 2), (6, 96, 2, 1)]


def _conv_bn(x, rng, out_ch, k, stride=1, groups=1, act=True, name="conv", training=False):
    c = x.shape[1]
    w = (rng.standard_normal((out_ch, c // groups, k, k)) * np.sqrt(2.0 / (c // groups * k * k))).astype(np.float32)
    with ism.name_scope(name):
        y = ism.conv2d(x, ism.Variable(w, name="w"), strides=stride, padding="SAME", groups=groups)
        stats = [rng.uniform(0.5, 1.5, out_ch), rng.standard_normal(out_ch) * 0.1,
                 rng.standard_normal(out_ch) * 0.1, rng.uniform(0.5, 1.5, out_ch)]
        scale, offset, mean, var = [ism.Variable(s.astype(np.float32), name=n)
                                    for s, n in zip(stats, ("gamma", "beta", "mean", "var"))]
        y = ism.batch_norm(y, scale, offset, mean, var, training=training, axis=1)
        y = y[0] if training else y  # training: normalized by the batch's own statistics
        return ism.relu6(y) if act else y


def mobilenet_v2(batch=1, res=96, classes=10, seed=0, training=False):
    """A graph, its input placeholder and logits: inverted residual blocks with depthwise 3x3,
    batch norm and relu6, widths up to 96, global pooling and a dense classifier. training=True
    normalizes by batch statistics (a training step's forward pass)."""
    rng = np.random.default_rng(seed)
    g = ism.Graph(seed=seed)
    with g.as_default():
        x = ism.placeholder("float32", (batch, 3, res, res), name="image")
        h = _conv_bn(x, rng, 32, 3, stride=2, name="stem", training=training)
        i = 0
        for t, c, n, s in MOBILENET_BLOCKS:
            for r in range(n):
                i += 1
                inp = h
                with ism.name_scope(f"block{i}"):
                    hid = inp.shape[1] * t
                    if t != 1:
                        h = _conv_bn(h, rng, hid, 1, name="expand", training=training)
                    h = _conv_bn(h, rng, hid, 3, stride=s if r == 0 else 1, groups=hid, name="depthwise",
                                 training=training)
                    h = _conv_bn(h, rng, c, 1, act=False, name="project", training=training)
                    if (s if r == 0 else 1) == 1 and inp.shape[1] == c:
                        h = h + inp
        h = _conv_bn(h, rng, 128, 1, name="head", training=training)
        h = ism.global_avg_pool(h)
        w = ism.Variable((rng.standard_normal((128, classes)) * 0.1).astype(np.float32), name="fc/w")
        b = ism.Variable(np.zeros(classes, np.float32), name="fc/b")
        logits = ism.bias_add(h @ w, b, name="logits")
    return g, x, logits
