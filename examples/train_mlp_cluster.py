"""Train the digits MLP on a local cluster (1 ps task + 2 worker tasks, each a process):
two replicas, synchronously and then asynchronously, with a progress bar and the final
test accuracy.

    python examples/train_mlp_cluster.py                       # both modes, 600 steps each
    python examples/train_mlp_cluster.py --mode sync --backup 1   # 3 replicas, the first 2 of each step count
    python examples/train_mlp_cluster.py --steps 50            # a quick look

The variables live on the ps task; each replica computes its gradients on its own worker
task from its shard of every step's batch. On a real cluster, give the tasks' addresses
instead of starting a LocalCluster (see `isthmus server --help`).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np

import isthmus as ism
from isthmus import nn
from isthmus.cloud.local_cluster import LocalCluster
from isthmus.partitioner.cluster_placement import pin_replica, task_device
from isthmus.cloud.replicas import ReplicaTrainer


def load_digits(seed: int = 0):
    """scikit-learn's 8x8 digits as float32 [N, 64] in [0, 1]; a fixed 80/20 split."""
    from sklearn.datasets import load_digits as _load
    d = _load()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.8 * len(y))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def mlp(x):
    net = nn.Sequential([nn.Dense(128, activation="relu", name="fc1"),
                         nn.Dense(64, activation="relu", name="fc2"),
                         nn.Dense(10, name="logits")])
    return net(x, training=True)


def model():
    """One replica's graph: (loss, the placeholders batch_fn fills)."""
    x = ism.placeholder("float32", (None, 64), name="images")
    y = ism.placeholder("int32", (None,), name="labels")
    return nn.sparse_softmax_cross_entropy(y, mlp(x)), [x, y]


def shards(train, replicas: int, batch: int):
    """batch_fn(step, replica): replica r's slice of step k's batch, a fixed order (epochs reshuffled)."""
    x, y = train
    per_epoch = len(y) // (replicas * batch)

    def batch_fn(step: int, replica: int):
        epoch, i = divmod(step, per_epoch)
        order = np.random.default_rng(epoch).permutation(len(y))
        idx = order[(i * replicas + replica) * batch:(i * replicas + replica + 1) * batch]
        return x[idx], y[idx]
    return batch_fn


def test_accuracy(trainer, target: str, test) -> float:
    """Evaluate the variables on the ps task with a fresh graph (same variable names)."""
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 64), name="images")
        y = ism.placeholder("int32", (None,), name="labels")
        acc = nn.accuracy(y, mlp(x))
    pin_replica(g, task_device("worker", 0), trainer.var_devices)
    with ism.Session(g, target=target) as sess:
        return float(sess.run(acc, {x: test[0], y: test[1]}))


def run(mode: str, lc: LocalCluster, steps: int, batch: int, backup: int, lr: float) -> float:
    train, test = load_digits()
    replicas = 2
    bar = ism.core.progress.ProgressBar(steps, desc=f"{mode} x{replicas}" + (f"+{backup}" if backup else ""),
                                        unit="ex")
    per_step = batch * (replicas if mode == "sync" else 1)
    with tempfile.TemporaryDirectory() as ckpt:
        trainer = ReplicaTrainer(model, lambda: ism.optimizers.Adam(lr), shards(train, replicas + backup, batch),
                                 lc.cluster, mode=mode, replicas=replicas, backup=backup if mode == "sync" else 0,
                                 checkpoint_dir=ckpt, checkpoint_every=max(steps // 4, 1), restart=lc.restart,
                                 on_step=lambda k, loss: bar.update(1, loss=loss, examples=per_step))
        t0 = time.perf_counter()
        stats = trainer.train(steps)
        bar.close()
        acc = test_accuracy(trainer, lc.target, test)
    took = time.perf_counter() - t0
    print(f"{mode}: {stats.steps} steps in {took:.1f} s ({1e3 * float(np.median(stats.step_times)):.1f} ms median), "
          f"{stats.accepted} gradients applied, {stats.dropped} dropped; test accuracy {acc:.4f}", flush=True)
    return acc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["sync", "async", "both"], default="both")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=32, help="examples per replica per step")
    p.add_argument("--backup", type=int, default=0, help="backup workers (sync): a third worker task is started")
    p.add_argument("--lr", type=float, default=2e-3)
    args = p.parse_args(argv)
    modes = ["sync", "async"] if args.mode == "both" else [args.mode]
    workers = 2 + (args.backup if "sync" in modes else 0)
    with LocalCluster({"ps": 1, "worker": workers}) as lc:
        print(f"cluster: {lc.cluster.to_json()}", flush=True)
        for mode in modes:
            run(mode, lc, args.steps, args.batch, args.backup, args.lr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
