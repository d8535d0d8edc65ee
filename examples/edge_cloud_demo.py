"""The main demo: train in the cloud, split, quantize the edge part, offload over an emulated link.

    python examples/edge_cloud_demo.py            # what `isthmus demo` runs; a few minutes on 2 cores
    python examples/edge_cloud_demo.py --bandwidth 5mbps --rtt 40ms --epochs 4

1. trains a CNN on scikit-learn's digits (1,797 real 8x8 images, shown to the
   network at 48x48 as a camera would see them) on a local cloud cluster: one parameter-server task
   and one worker task, separate processes talking gRPC on 127.0.0.1;
2. freezes the trained model and plans the split for an emulated link with an edge device 8x
   slower than this machine (the cost model is calibrated on this machine first), over a sweep
   of bandwidths (the client switches among those cuts as its link changes);
3. exports the edge parts int8-quantized (calibrated on training images) and the cloud parts;
4. starts the offload service and runs the edge client over loopback on the held-out images,
   each transfer delayed by bytes / bandwidth + RTT and the edge's compute slowed 8x;
5. prints accuracy, the placement, predicted vs measured latency per part, edge-only /
   cloud-only / split latency, and where it wrote the plots.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import isthmus as ism
from isthmus import nn

STEPS = 7


def step(i: int, what: str) -> None:
    print(f"\n[{i}/{STEPS}] {what}", flush=True)


def load_digits(res: int, seed: int = 0):
    """Digits as float32 [N, 1, res, res] in [0, 1] (bilinear upsampling of the 8x8 originals),
    labels int32; a fixed 80/20 train/test split."""
    from sklearn.datasets import load_digits as _load
    d = _load()
    img = (d.images / 16.0).astype(np.float32)
    coords = (np.arange(res) + 0.5) * 8 / res - 0.5
    i0 = np.clip(np.floor(coords).astype(int), 0, 7)
    i1 = np.clip(i0 + 1, 0, 7)
    f = np.clip(coords - i0, 0, 1).astype(np.float32)
    rows = img[:, i0, :] * (1 - f)[None, :, None] + img[:, i1, :] * f[None, :, None]
    big = rows[:, :, i0] * (1 - f)[None, None, :] + rows[:, :, i1] * f[None, None, :]
    x = big[:, None, :, :]
    y = d.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.8 * len(y))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def network() -> nn.Sequential:
    """A cheap stem that shrinks the image 4x per side into 4 channels (what a device could send
    instead of the image: 4x fewer bytes), then a heavier body."""
    return nn.Sequential([
        nn.Conv2D(4, 3, strides=2, padding="SAME", activation="relu", name="stem"),
        nn.MaxPool2D(2, name="stem_pool"),
        nn.Conv2D(64, 3, padding="SAME", activation="relu", name="conv1"),
        nn.Conv2D(128, 3, padding="SAME", activation="relu", name="conv2"),
        nn.MaxPool2D(2, name="pool2"),
        nn.Conv2D(256, 3, padding="SAME", activation="relu", name="conv3"),
        nn.Conv2D(256, 3, padding="SAME", activation="relu", name="conv4"),
        nn.GlobalAvgPool2D(name="gap"),
        nn.Dense(10, name="logits")])


def build(res: int):
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 1, res, res), name="image")
        y = ism.placeholder("int32", (None,), name="label")
        net = network()
        loss = nn.sparse_softmax_cross_entropy(y, net(x, training=True))
        logits = ism.identity(net(x, training=False), name="logits")
        train_op = ism.optimizers.Adam(2e-3).minimize(loss)
        acc = nn.accuracy(y, logits)
        init = ism.global_variables_initializer()
    return g, dict(x=x, y=y, loss=loss, logits=logits, train=train_op, acc=acc, init=init)


def train_on_cluster(args, train_data, test_data):
    """Trains on a LocalCluster (ps + worker processes); returns the graph, its tensors and the
    trained variable values fetched back from the parameter server."""
    from isthmus.cloud.local_cluster import LocalCluster
    g, t = build(args.res)
    n = len(train_data[1])
    rng = np.random.default_rng(1)
    t0 = time.perf_counter()
    with LocalCluster({"ps": 1, "worker": 1}) as cluster:
        print(f"      cluster up in {time.perf_counter() - t0:.1f} s: " +
              ", ".join(f"{tid} at {addr}" for tid, addr in cluster.cluster.tasks()), flush=True)
        sess = ism.Session(g, target=cluster.target)
        sess.run(t["init"])

        def batches():
            order = rng.permutation(n)
            for i in range(0, n - args.batch + 1, args.batch):
                idx = order[i:i + args.batch]
                yield {t["x"]: train_data[0][idx], t["y"]: train_data[1][idx]}

        ism.train.fit(sess, t["train"], t["loss"], batches, epochs=args.epochs,
                      steps_per_epoch=n // args.batch, desc="      train")
        accs = [float(sess.run(t["acc"], {t["x"]: test_data[0][i:i + 120], t["y"]: test_data[1][i:i + 120]}))
                * len(test_data[1][i:i + 120]) for i in range(0, len(test_data[1]), 120)]
        cloud_acc = sum(accs) / len(test_data[1])
        values = {v.name: sess.variable_value(v) for v in ism.global_variables(g)}
        sess.close()
    return g, t, values, cloud_acc


def frozen_inference_graph(g, t, values):
    local = ism.Session(g)
    local.run(t["init"])
    for v in ism.global_variables(g):
        local.set_variable_value(v, values[v.name])
    frozen = ism.freeze(local, [t["logits"]])
    return local, frozen, frozen.tensor(t["logits"].name)


def plan(args, frozen, logits):
    from isthmus.partitioner import AdaptivePlanner, CostModel, LinkModel
    from isthmus.partitioner.calibrate import calibrate
    from isthmus.partitioner.devices import CLOUD_DEVICE, EDGE_DEVICE
    ops = sorted({n.op for n in frozen.nodes})
    t0 = time.perf_counter()
    cloud = calibrate("this-machine", ops, "quick")
    edge = cloud.scaled(args.edge_slowdown, name=f"edge ({args.edge_slowdown:g}x slower than this machine)")
    print(f"      calibrated {len(ops)} op types on this machine in {time.perf_counter() - t0:.1f} s; "
          f"edge = this machine {args.edge_slowdown:g}x slower", flush=True)
    link = LinkModel.parse(args.bandwidth, args.rtt)
    cost = CostModel({EDGE_DEVICE: edge, CLOUD_DEVICE: cloud}, link, EDGE_DEVICE, batch_size=1)
    bandwidths = [float(b) for b in np.geomspace(0.1e6, 1000e6, 25)]
    planner = AdaptivePlanner(frozen, cost, outputs=[logits], bandwidths=bandwidths)
    chosen = planner.choose(link)
    return cost, link, planner, chosen


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--res", type=int, default=48, help="image side the network sees (default %(default)s)")
    p.add_argument("--bandwidth", default="10mbps", help="emulated uplink and downlink (default %(default)s)")
    p.add_argument("--rtt", default="10ms", help="emulated round-trip time (default %(default)s)")
    p.add_argument("--edge-slowdown", type=float, default=8.0, help="edge = this machine N times slower")
    p.add_argument("--samples", type=int, default=60, help="held-out images timed per mode (default %(default)s)")
    p.add_argument("--out", default=os.path.join("runs", "demo"), help="where files go (default %(default)s)")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    t_start = time.perf_counter()

    step(1, "data: scikit-learn digits")
    train_data, test_data = load_digits(args.res)
    print(f"      {len(train_data[1])} training / {len(test_data[1])} held-out images at {args.res}x{args.res}")

    step(2, "training on a local cloud cluster (1 ps task + 1 worker task over gRPC)")
    g, t, values, cloud_acc = train_on_cluster(args, train_data, test_data)
    print(f"      held-out accuracy (fp32, computed on the cluster): {cloud_acc:.4f}")

    step(3, "planning the split")
    local, frozen, logits = frozen_inference_graph(g, t, values)
    cost, link, planner, chosen = plan(args, frozen, logits)
    print("\n".join("      " + line for line in chosen.explain().splitlines()))
    from isthmus.partitioner.plots import graph_svg, latency_svg
    graph_path = os.path.join(args.out, "split_graph.svg")
    plot_path = os.path.join(args.out, "latency_vs_bandwidth.svg")
    graph_svg(chosen, graph_path)
    latency_svg(planner, plot_path, title=f"predicted latency, RTT {args.rtt}, edge {args.edge_slowdown:g}x slower")
    print(f"      wrote {graph_path} and {plot_path}")
    print(f"\ndone in {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
