"""The main demo: train in the cloud, split, quantize the edge part, offload over an emulated link.

    python examples/edge_cloud_demo.py            # what `isthmus demo` runs; a few minutes on 2 cores
    python examples/edge_cloud_demo.py --bandwidth 2mbps --rtt 40ms --epochs 4

1. trains a CNN on scikit-learn's digits (1,797 real 8x8 images, shown to the
   network at 48x48 as a camera would see them) on a local cloud cluster: one parameter-server task
   and one worker task, separate processes talking gRPC on 127.0.0.1;
2. freezes the trained model and plans the split for an emulated link (default 5 Mbit/s, 20 ms)
   and a phone-class edge device (apps/profiles/phone.json; --edge-slowdown N instead emulates
   this machine N times slower); the cost model is calibrated on this machine first, over a sweep
   of bandwidths (the client switches among those cuts as its link changes);
3. exports the edge parts int8-quantized (calibrated on training images) and the cloud parts;
4. starts the offload service and runs the edge client over loopback on the held-out images,
   each transfer delayed by bytes / bandwidth + RTT and the edge's compute slowed to the device's;
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
from isthmus.apps import LoadedModel, deploy_split, load_profile
from isthmus.cloud import LocalCluster
from isthmus.edge import EmulatedLink, Interpreter, OffloadClient, cut_for, emulated_kernel_seconds, load_split, \
    mid_bandwidth_bps
from isthmus.partitioner import (CLIENT_HERE, CLOUD_DEVICE, DEFAULT_EDGE_SLOWDOWN, EDGE_DEVICE, CostModel, LinkModel,
                                 calibrate_profile, graph_svg, latency_svg, limited_blas_threads,
                                 node_times_from_kernels, plan_split)

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


def calibrate_devices(args, frozen, logits, train_data):
    """The cloud profile: this machine's core kernels, timed on one BLAS thread as the offload
    service runs them (in CPU time, which other work on a shared machine does not stretch). The
    edge runs a different engine (the edge interpreter's int8 kernels), so the edge is priced by
    those kernels themselves: each timed on the exported full model as the client will run it
    (CPU time x the emulated slowdown) and shared among the nodes it runs (profile-guided, see
    partitioner/measured.py). The edge profile (the cloud's scaled by the slowdown times how much
    more CPU the int8 interpreter takes on this whole model) prices anything they do not cover."""
    ops = sorted({n.op for n in frozen.nodes})
    t0 = time.perf_counter()
    cloud = calibrate_profile("this-machine", ops, "quick", blas_threads=1, clock="cpu")
    print(f"      timed {len(ops)} op types of the core kernels on this machine in {time.perf_counter() - t0:.1f} s",
          flush=True)
    here = CostModel({EDGE_DEVICE: cloud, CLOUD_DEVICE: cloud}, LinkModel(), EDGE_DEVICE, batch_size=1)
    predicted = plan_split(frozen, here, outputs=[logits]).baselines["edge_only"].total
    path = deploy(args, frozen, logits, plan(args, cloud, cloud.scaled(args.edge_slowdown or 8.0)), train_data).edge_file
    if args.edge_slowdown is None:  # emulate the profile's device: as much slower than here as it predicts
        with one_blas_thread():
            here_s = sum(emulated_kernel_seconds(Interpreter(load_split(path).full), train_data[0][:1]).values())
        device = CostModel({EDGE_DEVICE: args.profile, CLOUD_DEVICE: cloud}, LinkModel(), EDGE_DEVICE, batch_size=1)
        device_s = plan_split(frozen, device, outputs=[logits]).baselines["edge_only"].total
        args.edge_slowdown = max(1.0, device_s / here_s)
        print(f"      edge: {args.profile.name}: the model predicted at {device_s * 1e3:.1f} ms there, "
              f"{here_s * 1e3:.2f} ms on the int8 interpreter here: emulated {args.edge_slowdown:.1f}x slower",
              flush=True)
    with one_blas_thread():
        kernels = emulated_kernel_seconds(Interpreter(load_split(path).full), train_data[0][:1],
                                          slowdown=args.edge_slowdown)
    measured = sum(kernels.values()) / args.edge_slowdown
    factor = measured / predicted
    edge = cloud.scaled(args.edge_slowdown * factor,
                        name=f"edge (this machine {args.edge_slowdown:.3g}x slower, int8 interpreter)")
    node_times = node_times_from_kernels(here, frozen, [logits], kernels, EDGE_DEVICE)
    print(f"      the int8 edge interpreter's {len(kernels)} kernels take {measured * 1e3:.2f} ms of CPU here (the core "
          f"kernels are predicted at {predicted * 1e3:.2f} ms): the edge is priced by them x {args.edge_slowdown:.3g}",
          flush=True)
    return cloud, edge, node_times


def call_cost(model_path, address, cut_bps: float, x, n: int = 8) -> float:
    """The service's fixed cost per call (RPC stack, encoding, its queue): the time in the remote call
    less the service's compute, with the link emulated at no delay. 0 when no cut has a cloud part."""
    cuts = load_split(model_path).cuts
    k = cut_for(cuts, cut_bps)
    k = k if cuts[k].cloud_part else next((k for k, c in enumerate(cuts) if c.cloud_part), None)
    if k is None:
        return 0.0
    mid = mid_bandwidth_bps(cuts[k])
    vals = []
    with OffloadClient(model_path, address, link=EmulatedLink(1e15, 0.0), deadline_ms=5000, adapt=False,
                       initial_bandwidth_bps=mid, ping_every=10 ** 6) as client:
        for i in range(n + 2):
            client.invoke(x[i % len(x):i % len(x) + 1])
            if i >= 2:
                vals.append(client.last["remote_s"] - client.last["server_compute_s"])
    return float(np.median(vals))


def plan(args, cloud, edge, edge_node_times=None):
    """The cost model the split is planned with: the calibrated devices over the emulated link."""
    link = LinkModel.parse(args.bandwidth, args.rtt)
    # the emulated edge's client is this machine's slowed as its kernels are: price it so (issue 27)
    client = CLIENT_HERE.scaled(args.edge_slowdown or DEFAULT_EDGE_SLOWDOWN)
    return CostModel({EDGE_DEVICE: edge, CLOUD_DEVICE: cloud}, link, EDGE_DEVICE, batch_size=1,
                     node_times={EDGE_DEVICE: edge_node_times} if edge_node_times else None, client=client)


def deploy(args, frozen, logits, cost, train_data):
    """`isthmus split` on the frozen model (deploy_split): the cuts over a sweep of bandwidths, the
    edge parts int8 (calibrated on training images) in digits.isth, the cloud parts in digits.cloud."""
    model = LoadedModel(frozen, {"image": frozen.tensor("image:0")}, {"logits": logits}, "digits-cnn", "graph")
    return deploy_split(model, args.out, int8=True, calibration={"image": train_data[0][:args.calibration]},
                        cost=cost, stem="digits", force=True)


def print_export(dep) -> None:
    print("\n".join("      " + line for line in dep.split.report().splitlines()))
    cloud_note = (f"and {dep.cloud_file} ({os.path.getsize(dep.cloud_file):,} bytes)" if dep.cloud_file else
                  "(no cloud parts: the model stays on the edge at every bandwidth of the sweep)")
    print(f"      wrote {dep.edge_file} ({os.path.getsize(dep.edge_file):,} bytes: every cut's edge part + the full "
          f"model, int8) {cloud_note} in {dep.seconds:.1f} s")


class offload_service:
    """`isthmus serve CLOUD_PARTS` in a subprocess on a free port; stopped on exit."""

    def __init__(self, cloud_path: str):
        self.cloud_path = cloud_path

    def __enter__(self) -> str:
        if self.cloud_path is None:   # nothing to serve: the client runs everything locally
            self.proc = None
            return "127.0.0.1:1"
        import subprocess
        self.proc = subprocess.Popen([sys.executable, "-m", "isthmus", "serve", self.cloud_path, "--port", "0",
                                      "--log-every", "0", "--max-delay-ms", "0.5"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     env=dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1"))
        deadline = time.monotonic() + 60
        for line in self.proc.stdout:
            if line.startswith("ISTHMUS_OFFLOAD "):
                return line.split()[1]
            if time.monotonic() > deadline:
                break
        self.proc.kill()
        raise RuntimeError("the offload service did not start (run `isthmus serve` by hand to see why)")

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except Exception:  # noqa: BLE001
            self.proc.kill()


def run_client(args, model_path, address, test_data, link, chosen):
    cuts = load_split(model_path).cuts
    emu = EmulatedLink(link.up_bandwidth_bps, link.rtt_s)
    bps = link.up_bandwidth_bps
    x, y = test_data
    results = {}
    with OffloadClient(model_path, address, link=emu, deadline_ms=2000, adapt=False, initial_bandwidth_bps=bps,
                       edge_slowdown=args.edge_slowdown) as client:
        cut = cuts[client.cut]
        correct = 0
        rows = []
        t0 = time.perf_counter()
        for i in range(len(y)):
            out = client.invoke(x[i:i + 1])[0]
            correct += int(np.argmax(out) == y[i])
            rows.append(dict(client.last))
            if (i + 1) % 60 == 0 or i + 1 == len(y):
                print(f"      {i + 1}/{len(y)} held-out images, accuracy so far {correct / (i + 1):.4f}, "
                      f"{(time.perf_counter() - t0) / (i + 1) * 1e3:.1f} ms each", flush=True)
        results["split"] = dict(cut=cut, accuracy=correct / len(y), rows=rows[5:], stats=client.stats())
    # the two baselines, over the same link: the cut that keeps everything on the edge and the one
    # that sends the image (when the sweep found them best somewhere, they are in the file)
    baselines = {"edge_only": next((k for k, c in enumerate(cuts) if not c.cloud_part), None),
                 "cloud_only": next((k for k, c in enumerate(cuts) if c.inputs == ["image:0"]), None)}
    for name, k in baselines.items():
        if k is None:
            results[name] = None
            continue
        mid = mid_bandwidth_bps(cuts[k])
        with OffloadClient(model_path, address, link=emu, deadline_ms=2000, adapt=False, initial_bandwidth_bps=mid,
                           edge_slowdown=args.edge_slowdown) as client:
            rows = []
            for i in range(args.samples + 5):
                i %= len(y)
                client.invoke(x[i:i + 1])
                rows.append(dict(client.last))
        results[name] = dict(cut=cuts[k], rows=rows[5:])
    return results


def one_blas_thread():
    """BLAS limited to one thread while the client runs, as on an edge device's interpreter."""
    return limited_blas_threads(1)


def _ms(v: float) -> str:
    return f"{v * 1e3:8.2f} ms"


def summary(args, cloud_acc, results, chosen, at_link, link, graph_path, plot_path) -> None:
    split = results["split"]
    # the service's compute beside its prediction; its queue and RPC are in "link + RPC", as the
    # per-call cost the plan adds (measured the same way: time in the call less the compute)
    med = {k: float(np.median([r[k] for r in split["rows"]]))
           for k in ("total_s", "edge_s", "remote_s", "server_compute_s")}
    predicted_total = chosen.predict(link)
    pc = chosen.predicted.compute
    print(f"      accuracy on {len(split['rows']) + 5} held-out images: split run (int8 edge part) "
          f"{split['accuracy']:.4f}; fp32 on the cluster {cloud_acc:.4f}")
    where = f"cloud part '{split['cut'].cloud_part}' after {', '.join(split['cut'].inputs)}" \
        if split["cut"].cloud_part else "everything on the edge"
    print(f"      placement at {args.bandwidth}: {split['cut'].name}: {where}")
    print("      per part (medians)            predicted     measured")
    print(f"        edge compute               {_ms(pc.get(EDGE_DEVICE, 0.0))} {_ms(med['edge_s'])}")
    print(f"        cloud compute              {_ms(pc.get(CLOUD_DEVICE, 0.0))} {_ms(med['server_compute_s'])}")
    link_pred = predicted_total - pc.get(EDGE_DEVICE, 0.0) - pc.get(CLOUD_DEVICE, 0.0)
    print(f"        link + RPC                 {_ms(link_pred)} {_ms(med['remote_s'] - med['server_compute_s'])}")
    print(f"        total                      {_ms(predicted_total)} {_ms(med['total_s'])}")
    print("      end to end (medians)          predicted     measured")
    for name in ("edge_only", "cloud_only"):
        r = results[name]
        meas = _ms(float(np.median([x["total_s"] for x in r["rows"]]))) if r else "   (not a candidate cut)"
        print(f"        {name:<26} {_ms(at_link.baselines[name].total)} {meas}")
    print(f"        {'split (chosen)':<26} {_ms(predicted_total)} {_ms(med['total_s'])}")
    st = split["stats"]
    print(f"      client: {st['cloud']} requests offloaded, {st['fallback']} fell back, {st['local']} ran locally")
    print(f"      plots: {plot_path} (latency against bandwidth), {graph_path} (the split graph)")


def validate(p: argparse.ArgumentParser, args) -> None:
    """Every flag checked before the training starts (p.error: one line, exit 2)."""
    for name, low in (("epochs", 1), ("batch", 1), ("res", 16), ("samples", 1), ("calibration", 1),
                      ("train_limit", 0), ("eval_limit", 0)):
        if getattr(args, name) < low:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least {low}")
    if args.train_limit and args.train_limit < args.batch:
        p.error(f"--train-limit {args.train_limit}: fewer images than one --batch ({args.batch})")
    try:
        LinkModel.parse(args.bandwidth, args.rtt)
    except ValueError as e:
        p.error(f"--bandwidth {args.bandwidth} / --rtt {args.rtt}: {e}")
    if args.edge_slowdown is not None and not args.edge_slowdown >= 1.0:
        p.error(f"--edge-slowdown {args.edge_slowdown}: must be at least 1")
    args.profile = None
    if args.edge_slowdown is None:
        try:
            args.profile = load_profile(args.edge_profile)
        except Exception as e:  # noqa: BLE001  (UsageError: the message names the file)
            p.error(str(e))
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        p.error(f"--out {args.out}: cannot create it ({e.strerror or e})")
    try:
        import sklearn  # noqa: F401  (the digits)
    except ImportError:
        p.error("the demo trains on scikit-learn's digits: pip install scikit-learn")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="isthmus demo" if __name__ == "isthmus_demo" else None,
                                description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--res", type=int, default=48, help="image side the network sees (default %(default)s)")
    p.add_argument("--bandwidth", default="5mbps", help="emulated uplink and downlink (default %(default)s)")
    p.add_argument("--rtt", default="20ms", help="emulated round-trip time (default %(default)s)")
    p.add_argument("--edge-profile", default="phone",
                   help="the edge device: a profile JSON (isthmus profile), or 'phone', the phone-class profile "
                        "that ships with isthmus (default %(default)s; docs/deploy.md says what it models)")
    p.add_argument("--edge-slowdown", type=float, default=None,
                   help="instead of --edge-profile: the edge is this machine N times slower")
    p.add_argument("--samples", type=int, default=60, help="held-out images timed per mode (default %(default)s)")
    p.add_argument("--out", default=os.path.join("runs", "demo"), help="where files go (default %(default)s)")
    p.add_argument("--train-limit", type=int, default=0, help="train on the first N images only (quick runs)")
    p.add_argument("--eval-limit", type=int, default=0, help="run the client on the first N held-out images only")
    p.add_argument("--calibration", type=int, default=64, help="images calibrating int8 (default %(default)s)")
    args = p.parse_args(argv)
    validate(p, args)
    t_start = time.perf_counter()

    step(1, "data: scikit-learn digits")
    train_data, test_data = load_digits(args.res)
    if args.train_limit:
        train_data = (train_data[0][:args.train_limit], train_data[1][:args.train_limit])
    if args.eval_limit:
        test_data = (test_data[0][:args.eval_limit], test_data[1][:args.eval_limit])
    print(f"      {len(train_data[1])} training / {len(test_data[1])} held-out images at {args.res}x{args.res}")

    step(2, "training on a local cloud cluster (1 ps task + 1 worker task over gRPC)")
    g, t, values, cloud_acc = train_on_cluster(args, train_data, test_data)
    print(f"      held-out accuracy (fp32, computed on the cluster): {cloud_acc:.4f}")

    step(3, "planning the split")
    local, frozen, logits = frozen_inference_graph(g, t, values)
    cloud, edge, edge_times = calibrate_devices(args, frozen, logits, train_data)
    cost = plan(args, cloud, edge, edge_times)
    dep = deploy(args, frozen, logits, cost, train_data)
    planner, link, at_link = dep.planner, cost.link, dep.plan  # at_link: the predictions at exactly this link
    chosen = planner.choose(link)                                # the precomputed cut the client starts with
    print(f"      client cost assumed on the edge: {cost.client.describe()}")
    print("\n".join("      " + line for line in at_link.explain().splitlines()))
    graph_path = os.path.join(args.out, "split_graph.svg")
    plot_path = os.path.join(args.out, "latency_vs_bandwidth.svg")
    graph_svg(chosen, graph_path)
    latency_svg(planner, plot_path, title=f"predicted latency, RTT {args.rtt}, edge {args.edge_slowdown:.3g}x slower")
    print(f"      wrote {graph_path} and {plot_path}")

    step(4, "exporting the edge parts (int8) and the cloud parts")
    print_export(dep)
    model_path, cloud_path = dep.edge_file, dep.cloud_file

    step(5, "starting the offload service (isthmus serve, a separate process)")
    with offload_service(cloud_path) as address:
        print(f"      serving on {address}" if cloud_path else "      nothing to serve: every cut keeps the model on the edge")
        if cloud_path:  # the service's fixed cost per call joins the link's in every prediction below
            with one_blas_thread():
                call_s = call_cost(model_path, address, link.up_bandwidth_bps, test_data[0])
            plan_link = link.with_call_cost(call_s)
            at_link = plan_split(frozen, cost.with_link(plan_link), outputs=[logits])
            print(f"      a call to the service costs {call_s * 1e3:.2f} ms beyond the link (RPC, encoding, queue); "
                  "the predictions below include it")
        else:
            plan_link = link
        step(6, f"edge client over loopback, link emulated at {args.bandwidth} / RTT {args.rtt}, "
                f"edge {args.edge_slowdown:.3g}x slower")
        with one_blas_thread():  # an edge device's interpreter; threads that spin between requests distort it
            results = run_client(args, model_path, address, test_data, link, chosen)

    step(7, "summary")
    summary(args, cloud_acc, results, chosen, at_link, plan_link, graph_path, plot_path)
    print(f"\ndone in {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
