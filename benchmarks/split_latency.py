"""End-to-end split latency through the real offload service and edge client (issue: split execution).

    python benchmarks/split_latency.py [--requests 15] [--res 160]

The MobileNetV2-style network of benchmarks/models.py, batch 1, at 160x160 by default: at 96x96
it costs about 41 ms on the emulated edge (5 ms here), about one RTT, so the planner keeps it on
the edge at every bandwidth and there is nothing to offload (`--res 96` shows that). This machine is the cloud (its
profile calibrated here first); the edge is this machine 8x slower (the client sleeps 7x its own
compute time after each request) and its profile is scaled by how the edge interpreter runs
this model here against the core kernels' prediction. For uplinks of 1, 5, 20 and 100 Mbit/s with a 40 ms RTT (each
transfer delayed by bytes / bandwidth + RTT / 2 each way), the edge client runs edge-only,
cloud-only and the split the partitioner chose for that link, against `isthmus serve` in another
process over loopback. Reported per link: predicted and measured (median) latency of each;
checks: the split is never slower than the better of edge-only and cloud-only (measured, 5%
tolerance for noise), and the measured split is within 15% of the plan's prediction.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import isthmus as ism  # noqa: E402
from models import mobilenet_v2  # noqa: E402
from timing import emit  # noqa: E402

RTT = 0.040
LINKS_MBPS = (1, 5, 20, 100)
SLOWDOWN = 8.0


def serve(cloud_path: str):
    proc = subprocess.Popen([sys.executable, "-m", "isthmus.cli", "serve", cloud_path, "--port", "0",
                             "--log-every", "0", "--max-delay-ms", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1"))
    line = proc.stdout.readline()
    if not line.startswith("ISTHMUS_OFFLOAD "):
        proc.kill()
        raise SystemExit("isthmus serve did not start")
    return proc, line.split()[1]


def build(res: int, tmp: str):
    from isthmus.cloud.offload_model import cloud_part, save_cloud_parts
    from isthmus.converters.split_export import export_split
    from isthmus.converters.edge_export import to_edge
    from isthmus.edge import Interpreter
    from isthmus.partitioner import AdaptivePlanner, CostModel, LinkModel, plan_split
    from isthmus.partitioner.calibrate import calibrate
    from isthmus.partitioner.devices import CLOUD_DEVICE, EDGE_DEVICE
    g, x, logits = mobilenet_v2(batch=1, res=res)
    with g.as_default():
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    frozen = ism.freeze(sess, [logits])
    out = frozen.tensor(logits.name)
    cloud = calibrate("this-machine", sorted({n.op for n in frozen.nodes}), "quick")
    model_path, cloud_path = os.path.join(tmp, "m.isth"), os.path.join(tmp, "m.cloud")
    # the edge runs the edge interpreter, not the core kernels the profile timed: scale the edge
    # profile by how the interpreter runs this whole model here against its prediction
    here = CostModel({EDGE_DEVICE: cloud, CLOUD_DEVICE: cloud}, LinkModel(20e6, 20e6, RTT), EDGE_DEVICE, batch_size=1)
    predicted = plan_split(frozen, here, outputs=[out]).baselines["edge_only"].total
    with _one_blas_thread():
        interp = Interpreter(to_edge(frozen, [out]))
        image = np.zeros((1, 3, res, res), np.float32)
        measured = float(np.median([_timed(interp.invoke, image, sleep_factor=SLOWDOWN - 1) for _ in range(25)][5:]))
    factor = measured / predicted
    edge = cloud.scaled(SLOWDOWN * factor)
    cost = CostModel({EDGE_DEVICE: edge, CLOUD_DEVICE: cloud}, LinkModel(20e6, 20e6, RTT), EDGE_DEVICE, batch_size=1)
    planner = AdaptivePlanner(frozen, cost, outputs=[out], bandwidths=[float(b) for b in np.geomspace(0.1e6, 1e9, 31)])
    sp = export_split(frozen, [out], planner, model_name="mobilenet_v2")
    sp.save(model_path)
    sigs = sp.cloud_signatures()
    if not sigs:
        raise SystemExit(f"at {res}x{res} the planner keeps the whole network on the edge at every bandwidth of "
                         "the sweep: nothing to offload (try a larger --res)")
    save_cloud_parts(cloud_path, [cloud_part(sp.graph, i, o, n) for n, i, o in sigs])
    return frozen, out, cost, planner, model_path, cloud_path, x.name, round(factor, 3)


def _timed(fn, *args, sleep_factor: float = 0.0) -> float:
    """Seconds of fn(*args); then sleeps sleep_factor x that, as the emulated slow edge does after each
    request (so the timing sees the same cold caches the client's runs will)."""
    t = time.perf_counter()
    fn(*args)
    dt = time.perf_counter() - t
    time.sleep(sleep_factor * dt)
    return dt


def _one_blas_thread():
    """The edge interpreter on one BLAS thread: OpenBLAS threads woken after each emulated-slowdown
    sleep make a request 5-10x slower and erratic on this 2-core machine."""
    try:
        from threadpoolctl import threadpool_limits
        return threadpool_limits(1, user_api="blas")
    except ImportError:
        import contextlib
        return contextlib.nullcontext()


def measure(model_path, address, bps, cut_bps, n, image) -> dict:
    from isthmus.edge.offload_client import EmulatedLink, OffloadClient
    link = EmulatedLink(bps, RTT)
    with _one_blas_thread(), OffloadClient(model_path, address, link=link, deadline_ms=20000, adapt=False, initial_bps=cut_bps,
                       edge_slowdown=SLOWDOWN) as c:
        rows = []
        for i in range(n + 3):
            c.invoke(image)
            if i >= 3:
                rows.append(dict(c.last))
        st = c.stats()
    med = {k: float(np.median([r[k] for r in rows])) for k in ("total_s", "edge_s", "remote_s", "server_s")}
    return {"cut": rows[-1]["cut"], "ms": round(med["total_s"] * 1e3, 2),
            "edge_ms": round(med["edge_s"] * 1e3, 2), "server_ms": round(med["server_s"] * 1e3, 2),
            "link_rpc_ms": round((med["remote_s"] - med["server_s"]) * 1e3, 2),
            "fallbacks": st["fallback"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=15)
    p.add_argument("--res", type=int, default=160)
    args = p.parse_args(argv)
    from isthmus.edge.offload_client import load_split
    from isthmus.partitioner import LinkModel, plan_split
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        frozen, out, cost, planner, model_path, cloud_path, xname, factor = build(args.res, tmp)
        cuts = load_split(model_path).cuts
        image = np.random.default_rng(0).standard_normal((1, 3, args.res, args.res)).astype(np.float32)
        edge_k = next((k for k, c in enumerate(cuts) if not c.cloud_part), None)
        cloud_k = next((k for k, c in enumerate(cuts) if c.inputs == [xname]), None)
        mid = (lambda k: (cuts[k].min_bps + min(cuts[k].max_bps, 1e10)) / 2)
        proc, address = serve(cloud_path)
        try:
            rows = []
            for mbps in LINKS_MBPS:
                bps = mbps * 1e6
                link = LinkModel(bps, bps, RTT)
                at = plan_split(frozen, cost.with_link(link), outputs=[out])
                chosen = planner.choose(link)
                row = {"uplink_mbps": mbps, "predicted_ms": {
                    "edge_only": round(at.baselines["edge_only"].total * 1e3, 2),
                    "cloud_only": round(at.baselines["cloud_only"].total * 1e3, 2),
                    "split": round(chosen.predict(link) * 1e3, 2)}}
                meas = {"split": measure(model_path, address, bps, bps, args.requests, image)}
                if edge_k is not None:
                    meas["edge_only"] = measure(model_path, address, bps, mid(edge_k), args.requests, image)
                if cloud_k is not None:
                    meas["cloud_only"] = measure(model_path, address, bps, mid(cloud_k), args.requests, image)
                row["measured"] = meas
                best = min(m["ms"] for k, m in meas.items() if k != "split") if len(meas) > 1 else float("inf")
                row["split_not_worse"] = meas["split"]["ms"] <= best * 1.05
                row["split_error"] = round(abs(meas["split"]["ms"] - row["predicted_ms"]["split"])
                                           / row["predicted_ms"]["split"], 3)
                rows.append(row)
                print(f"{mbps:>4} Mbit/s: predicted {row['predicted_ms']}, measured "
                      + ", ".join(f"{k} {m['ms']} ms ({m['cut']})" for k, m in meas.items()), file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait(10)
    ok = all(r["split_not_worse"] for r in rows) and all(r["split_error"] <= 0.15 for r in rows)
    emit("split_latency", {"model": f"mobilenet_v2 {args.res}x{args.res} batch 1", "rtt_ms": RTT * 1e3,
                           "edge": f"this machine {SLOWDOWN:g}x slower (emulated)", "requests": args.requests,
                           "edge_interpreter_vs_core_prediction": factor,
                           "cuts": [{"name": c.name, "cloud_part": c.cloud_part or None, "inputs": c.inputs,
                                     "min_mbps": round(c.min_bps / 1e6, 3),
                                     "max_mbps": None if c.max_bps == float("inf") else round(c.max_bps / 1e6, 3)}
                                    for c in cuts],
                           "links": rows, "load_average_before": round(load0, 2),
                           "target": "split <= min(edge_only, cloud_only); |measured - predicted| <= 15%",
                           "pass": ok})
    return 0


if __name__ == "__main__":
    sys.exit(main())
