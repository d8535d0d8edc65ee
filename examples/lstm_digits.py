"""An LSTM sequence classifier on scikit-learn's 8x8 digits, each image read row by row
(8 steps of 8 pixels), built with dynamic_rnn on while_loop: no unrolling. Some images are
cut short to show per-example sequence lengths.

    python examples/lstm_digits.py --epochs 30
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import isthmus as ism
from isthmus.core.rnn import LSTMCell, dynamic_rnn


def load(seed: int = 0):
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32).reshape(-1, 8, 8)  # [N, time=rows, features=pixels]
    y = d.target.astype(np.int32)
    lengths = np.full(len(y), 8, np.int32)
    lengths[::5] = 7  # every fifth image loses its last row: the mask must handle it
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.8 * len(y))
    tr, te = order[:cut], order[cut:]
    return (x[tr], lengths[tr], y[tr]), (x[te], lengths[te], y[te])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--units", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args(argv)
    train, test = load()
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 8, 8), name="rows")
        lengths = ism.placeholder("int32", (None,), name="lengths")
        labels = ism.placeholder("int32", (None,), name="labels")
        cell = LSTMCell(args.units, seed=1)
        _, (c, h) = dynamic_rnn(cell, x, sequence_length=lengths, return_outputs=False)
        rng = np.random.default_rng(2)
        w = ism.Variable((rng.standard_normal((args.units, 10)) / np.sqrt(args.units)).astype(np.float32), name="head/w")
        b = ism.Variable(np.zeros(10, np.float32), name="head/b")
        logits = ism.bias_add(h @ w, b)
        loss = ism.reduce_mean(ism.sparse_softmax_cross_entropy(labels, logits))
        acc = ism.reduce_mean(ism.cast(ism.equal(ism.argmax(logits, 1, "int32"), labels), "float32"))
        step = ism.optimizers.Adam(5e-3).minimize(loss)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    n = len(train[2])
    order_rng = np.random.default_rng(3)
    for epoch in range(args.epochs):
        order = order_rng.permutation(n)
        losses = []
        for i in range(0, n, args.batch):
            idx = order[i:i + args.batch]
            lv, _ = sess.run([loss, step], {x: train[0][idx], lengths: train[1][idx], labels: train[2][idx]})
            losses.append(lv)
        if epoch % 5 == 4 or epoch == args.epochs - 1:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {np.mean(losses):.4f}", file=sys.stderr)
    test_acc = float(sess.run(acc, {x: test[0], lengths: test[1], labels: test[2]}))
    print(f"LSTM on digits (row by row): test accuracy {test_acc:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
