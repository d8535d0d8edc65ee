"""Model builders shared by the benchmarks: the core issue's CNN and a MobileNetV2-style network."""
from __future__ import annotations

import numpy as np

import isthmus as ism

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
