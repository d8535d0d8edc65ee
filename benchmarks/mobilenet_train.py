"""MobileNetV2-style training step (benchmarks/models.py at 96x96, batch norm on batch statistics,
relu6, depthwise 3x3), batch 32, SGD: isthmus with its compiled depthwise kernels, isthmus with
them off (ISTHMUS_JIT=0: numpy passes), and PyTorch CPU, one thread each, in the same process.

    python benchmarks/mobilenet_train.py [--batch 32] [--res 96]

The PyTorch model is built from the same seeded draws as the isthmus graph (same weights, same
asymmetric SAME padding at stride 2, batch norm eps 1e-3), and its first loss must equal isthmus's
before anything is timed. Contenders run in alternating blocks (benchmarks/cnn.py); medians of wall
and process CPU time. No target in an issue: this shows what the compiled kernels do for training.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import isthmus as ism  # noqa: E402
from cnn import alternating_blocks  # noqa: E402
from models import MOBILENET_BLOCKS, mobilenet_v2  # noqa: E402
from timing import emit, torch_or_none, torch_train_step  # noqa: E402

LR = 0.01


def _same_pads(n, k, s):
    """TensorFlow SAME padding (as isthmus pads it): (before, after)."""
    total = max((-(-n // s) - 1) * s + k - n, 0)
    return total // 2, total - total // 2


def torch_mobilenet(torch, res, classes=10, seed=0):
    """The network of models.mobilenet_v2 in PyTorch, with the same weights (the same draws in the
    same order) and the same padding."""
    nn, F = torch.nn, torch.nn.functional
    rng = np.random.default_rng(seed)
    layers = []  # (conv, bn, pads, relu6) in order, with residual markers

    def conv_bn(c, out_ch, k, stride, groups, act, size):
        w = (rng.standard_normal((out_ch, c // groups, k, k)) * np.sqrt(2.0 / (c // groups * k * k))).astype(np.float32)
        stats = [rng.uniform(0.5, 1.5, out_ch), rng.standard_normal(out_ch) * 0.1,
                 rng.standard_normal(out_ch) * 0.1, rng.uniform(0.5, 1.5, out_ch)]
        conv = nn.Conv2d(c, out_ch, k, stride=stride, groups=groups, bias=False)
        bn = nn.BatchNorm2d(out_ch, eps=1e-3)
        with torch.no_grad():
            conv.weight.copy_(torch.from_numpy(w))
            bn.weight.copy_(torch.from_numpy(stats[0].astype(np.float32)))
            bn.bias.copy_(torch.from_numpy(stats[1].astype(np.float32)))
        t, b = _same_pads(size, k, stride)
        layers.append((conv, bn, (t, b, t, b), act))
        return -(-size // stride)

    size = conv_bn(3, 32, 3, 2, 1, True, res)
    ch, plan = 32, []
    for t, c, n, s in MOBILENET_BLOCKS:
        for r in range(n):
            stride, start = (s if r == 0 else 1), len(layers)
            hid = ch * t
            if t != 1:
                conv_bn(ch, hid, 1, 1, 1, True, size)
            size = conv_bn(hid, hid, 3, stride, hid, True, size)
            conv_bn(hid, c, 1, 1, 1, False, size)
            plan.append((start, len(layers), stride == 1 and ch == c))
            ch = c
    conv_bn(ch, 128, 1, 1, 1, True, size)
    fc = nn.Linear(128, classes)
    with torch.no_grad():
        fc.weight.copy_(torch.from_numpy((rng.standard_normal((128, classes)) * 0.1).astype(np.float32).T.copy()))
        fc.bias.zero_()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList([m for conv, bn, _, _ in layers for m in (conv, bn)])
            self.fc = fc

        def layer(self, i, h):
            conv, bn, pads, act = layers[i]
            h = bn(conv(F.pad(h, pads) if any(pads) else h))
            return F.relu6(h) if act else h

        def forward(self, h):
            h = self.layer(0, h)
            for start, end, residual in plan:
                inp = h
                for i in range(start, end):
                    h = self.layer(i, h)
                if residual:
                    h = h + inp
            h = self.layer(len(layers) - 1, h)
            return self.fc(h.mean(dim=(2, 3)))
    return Net()


def main(argv=None) -> int:
    from threadpoolctl import threadpool_limits
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--res", type=int, default=96)
    args = p.parse_args(argv)
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((args.batch, 3, args.res, args.res)).astype(np.float32)
    ys = rng.integers(0, 10, args.batch).astype(np.int32)

    def build():
        g, x, logits = mobilenet_v2(batch=args.batch, res=args.res, training=True)
        with g.as_default():
            y = ism.placeholder("int32", (args.batch,), name="labels")
            loss = ism.reduce_mean(ism.sparse_softmax_cross_entropy(y, logits))
            train = ism.optimizers.SGD(LR).minimize(loss)
            sess = ism.Session(g)
            sess.run(ism.global_variables_initializer())
        return sess, {x: xs, y: ys}, loss, train

    def with_jit(flag, fn):
        def run():
            os.environ["ISTHMUS_JIT"] = flag
            try:
                return fn()
            finally:
                os.environ.pop("ISTHMUS_JIT", None)
        return run
    sess, feed, loss, train = build()
    sess_np, feed_np, loss_np, train_np = build()
    contenders = {"isthmus": with_jit("1", lambda: sess.run([loss, train], feed)),
                  "isthmus_numpy_kernels": with_jit("0", lambda: sess_np.run([loss_np, train_np], feed_np))}
    torch = torch_or_none()
    first = {}
    if torch is not None:
        m = torch_mobilenet(torch, args.res)
        m.train()
        opt = torch.optim.SGD(m.parameters(), lr=LR)
        lossf = torch.nn.CrossEntropyLoss()
        tx, ty = torch.from_numpy(xs), torch.from_numpy(ys.astype(np.int64))
        with torch.no_grad():
            first["torch"] = float(lossf(m(tx), ty))
        contenders["torch"] = torch_train_step(opt, lambda: lossf(m(tx), ty))
    sess0, feed0, loss0, _ = build()
    first["isthmus"] = float(sess0.run(loss0, feed0))
    if "torch" in first and abs(first["torch"] - first["isthmus"]) > 1e-3 * max(1.0, abs(first["torch"])):
        raise SystemExit(f"the two models differ: first loss isthmus {first['isthmus']}, torch {first['torch']}")
    load0 = os.getloadavg()[0]
    with threadpool_limits(1):
        if torch is not None:
            torch.set_num_threads(1)
        res = alternating_blocks(contenders, blocks=4, per_block=3, budget_s=120.0)
    out = {"model": f"mobilenet_v2 {args.res}x{args.res}, batch {args.batch}, SGD", "threads": 1,
           "first_loss": {k: round(v, 5) for k, v in first.items()},
           "ms": {k: round(v[0] * 1e3, 1) for k, v in res.items()},
           "cpu_ms": {k: round(v[1] * 1e3, 1) for k, v in res.items()},
           "compiled_speedup": round(res["isthmus_numpy_kernels"][1] / res["isthmus"][1], 2),
           "load_avg_before": round(load0, 2), "load_avg_after": round(os.getloadavg()[0], 2)}
    if "torch" in res:
        out["cpu_ratio_vs_torch"] = round(res["isthmus"][1] / res["torch"][1], 2)
    emit("mobilenet_train", out)
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
