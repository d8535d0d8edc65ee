"""Train an MLP and a small CNN on scikit-learn's 8x8 digits (1,797 real images), save a
checkpoint, restore it in a fresh process and evaluate again.

    python examples/train_digits.py                 # both models, checkpoints under ./runs/digits
    python examples/train_digits.py --model mlp --epochs 40
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

import isthmus as ism
from isthmus import nn


def load_digits(seed: int = 0):
    """Images as float32 [N, 64] in [0, 1], labels int32; a fixed 80/20 train/test split."""
    from sklearn.datasets import load_digits as _load
    d = _load()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.8 * len(y))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def build(model: str):
    """The graph: placeholders, logits, loss, accuracy, a training op and a Saver."""
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 64), name="images")
        y = ism.placeholder("int32", (None,), name="labels")
        training = model + "_training"
        if model == "mlp":
            net = nn.Sequential([nn.Dense(128, activation="relu", name="fc1"),
                                 nn.Dense(64, activation="relu", name="fc2"),
                                 nn.Dense(10, name="logits")])
            logits_train = net(x, training=True)
            logits = net(x, training=False)
        else:
            net = nn.Sequential([nn.Conv2D(16, 3, padding="SAME", activation="relu", name="conv1"),
                                 nn.MaxPool2D(2, name="pool1"),
                                 nn.Conv2D(32, 3, padding="SAME", activation="relu", name="conv2"),
                                 nn.MaxPool2D(2, name="pool2"),
                                 nn.Flatten(name="flatten"),
                                 nn.Dense(64, activation="relu", name="fc"),
                                 nn.Dense(10, name="logits")])
            images = ism.reshape(x, (-1, 1, 8, 8))
            logits_train = net(images, training=True)
            logits = net(images, training=False)
        loss = nn.sparse_softmax_cross_entropy(y, logits_train)
        train_op = ism.optimizers.Adam(2e-3).minimize(loss)
        acc = nn.accuracy(y, logits)
        init = ism.global_variables_initializer()
        saver = ism.checkpoint.Saver(max_to_keep=3)
    del training
    return g, dict(x=x, y=y, loss=loss, train=train_op, acc=acc, init=init, saver=saver)


def evaluate(sess, t, data) -> float:
    x, y = data
    return float(sess.run(t["acc"], {t["x"]: x, t["y"]: y}))


def train(model: str, epochs: int, batch: int, ckpt_dir: str) -> dict:
    train_data, test_data = load_digits()
    g, t = build(model)
    sess = ism.Session(g)
    sess.run(t["init"])
    n = len(train_data[1])
    steps = epochs * ((n + batch - 1) // batch)
    rng = np.random.default_rng(1)
    bar = ism.core.progress.ProgressBar(steps, desc=f"{model}", unit="ex")
    for _ in range(epochs):
        order = rng.permutation(n)
        for i in range(0, n, batch):
            idx = order[i:i + batch]
            loss, _ = sess.run([t["loss"], t["train"]], {t["x"]: train_data[0][idx], t["y"]: train_data[1][idx]})
            bar.update(1, loss=float(loss), examples=len(idx))
    bar.close()
    acc = evaluate(sess, t, test_data)
    path = t["saver"].save(sess, os.path.join(ckpt_dir, model), global_step=steps)
    return {"model": model, "test_accuracy": acc, "checkpoint": path}


def restore_and_evaluate(model: str, path: str) -> float:
    _, test_data = load_digits()
    g, t = build(model)
    sess = ism.Session(g)
    t["saver"].restore(sess, path)
    return evaluate(sess, t, test_data)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["mlp", "cnn", "both"], default="both")
    p.add_argument("--epochs", type=int, default=0, help="default: 30 for the MLP, 15 for the CNN")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--ckpt-dir", default=os.path.join("runs", "digits"))
    p.add_argument("--restore", metavar="CHECKPOINT", help="(internal) evaluate a checkpoint and print JSON")
    args = p.parse_args(argv)
    if args.restore:
        print(json.dumps({"test_accuracy": restore_and_evaluate(args.model, args.restore)}))
        return 0
    models = ["mlp", "cnn"] if args.model == "both" else [args.model]
    ok = True
    for m in models:
        res = train(m, args.epochs or (30 if m == "mlp" else 15), args.batch, args.ckpt_dir)
        print(f"{m}: test accuracy {res['test_accuracy']:.4f}; checkpoint {res['checkpoint']}")
        # a fresh process rebuilds the graph, restores the checkpoint and evaluates again
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--model", m, "--restore", res["checkpoint"]],
                             capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return 1
        again = json.loads(out.stdout.strip().splitlines()[-1])["test_accuracy"]
        same = abs(again - res["test_accuracy"]) < 1e-9
        print(f"{m}: restored in a fresh process: test accuracy {again:.4f} ({'same' if same else 'DIFFERENT'})")
        ok = ok and same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
