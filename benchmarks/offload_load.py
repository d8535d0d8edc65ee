"""Load on the offload service: many concurrent edge clients against one `isthmus serve`, batched vs not.

    python benchmarks/offload_load.py                                # a quick smoke run (16 x 20)
    python benchmarks/offload_load.py --clients 64 --requests 200    # issue #8's load benchmark

The cloud part is the tail of an MLP (784-H-H-H-10, H = --hidden, cut after the first layer: the edge
sends an H-float hidden row, the cloud runs three dense layers and a softmax), or with
--model mobilenet the MobileNetV2-style network's tail after block 5 (res 64). The service
runs in a subprocess (`isthmus serve`), so the RSS read from /proc is the server's alone.
Each client is a thread with its own gRPC connection sending one-row requests back to back
(closed loop), each with a deadline. The same requests run twice in one run: against a
server batching up to --max-batch rows (waiting at most --max-delay-ms), and against one with
max batch 1 (no batching: the peer). Reported per mode: errors, throughput, client-side p50/p99
latency, the batching factor (mean rows per batch, from the server's Stats), the server's CPU time
per request (from /proc: meaningful even when other work loads the machine), server RSS at start,
after a concurrent warm-up (every client's connection open, every server thread started) and after
the load (growth from warm-up to end should stay within 10%), and whether every checked answer
equals a local Session run. JSON on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
def widths(hidden: int):
    return (784, hidden, hidden, hidden, 10)


def build(path: str, hidden: int):
    """The cloud part file; returns a reference function hidden rows -> probabilities."""
    import isthmus as ism
    WIDTHS = widths(hidden)
    from isthmus.cloud.offload_model import cloud_part, save_cloud_parts
    rng = np.random.default_rng(0)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, WIDTHS[0]), name="x")
        h = x
        for i, (a, b) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:])):
            w = ism.constant((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), name=f"w{i}")
            h = ism.matmul(h, w, name=f"dense{i}")
            if i < len(WIDTHS) - 2:
                h = ism.relu(h, name=f"act{i}")
        y = ism.softmax(h, name="probs")
    part = cloud_part(g, ["act0:0"], [y], "tail")
    save_cloud_parts(path, [part], model="mlp-tail")
    sess = ism.Session(g)
    return lambda hv: sess.run(y, {g.tensor("act0:0"): hv})


def build_mobilenet(path: str, res: int = 64):
    """The MobileNetV2-style network's tail after block 5 (benchmarks/models.py): the edge sends
    block5's 32 x res/8 x res/8 activation; returns (reference function, input row shape)."""
    sys.path.insert(0, HERE)
    import isthmus as ism
    from isthmus.cloud.offload_model import cloud_part, save_cloud_parts
    from models import mobilenet_v2
    g, x, logits = mobilenet_v2(batch=1, res=res)
    sess = ism.Session(g)
    sess.run(ism.global_variables_initializer(g))
    cut = g.tensor("block5/Add:0")
    part = cloud_part(sess, [cut], [logits], "tail")
    save_cloud_parts(path, [part], model="mobilenet-tail")
    ref = ism.Session(part.graph)
    return (lambda hv: ref.run(part.outputs[0].tensor, {part.inputs[0].tensor: hv})), tuple(part.inputs[0].shape[1:])


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used (robust to other load on the machine)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    def __init__(self, path: str, max_batch: int, max_delay_ms: float, max_queue: int, blas_threads: int):
        env = dict(os.environ)
        if blas_threads:
            env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(blas_threads)
        env["PYTHONPATH"] = os.path.dirname(os.path.dirname(HERE)) + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "isthmus.cli", "serve", path, "--port", "0", "--max-batch", str(max_batch),
             "--max-delay-ms", str(max_delay_ms), "--max-queue", str(max_queue), "--log-every", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        box = []
        t = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(60)
        if not box or not box[0].startswith("ISTHMUS_OFFLOAD "):
            self.stop()
            raise RuntimeError(f"isthmus serve did not start: {box} {self.proc.stderr.read()[-2000:]}")
        self.address = box[0].split()[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate(timeout=10)


def run_mode(path: str, reference, input_name: str, inputs: np.ndarray, clients: int, requests: int, max_batch: int,
             max_delay_ms: float, deadline_s: float, check_every: int, blas_threads: int) -> dict:
    import grpc
    from isthmus.cloud import tensor_codec
    from isthmus.proto import offload_pb2, offload_pb2_grpc
    srv = Server(path, max_batch, max_delay_ms, max_queue=4 * clients, blas_threads=blas_threads)
    try:
        rss_start = rss_kib(srv.proc.pid)
        opts = [("grpc.use_local_subchannel_pool", 1)]  # one connection per client, as separate devices have
        chans = [grpc.insecure_channel(srv.address, options=opts) for _ in range(clients)]
        stubs = [offload_pb2_grpc.OffloadStub(c) for c in chans]
        # requests go out as pre-serialized bytes and answers come back as bytes (parsed only when
        # checked): the clients share this process's 2 cores with the server, so keep them cheap
        raw = [c.unary_unary("/isthmus.Offload/Infer", request_serializer=None, response_deserializer=None)
               for c in chans]
        reqs = []
        for k in range(len(inputs)):
            r = offload_pb2.InferRequest(part="tail", request_id=str(k))
            tensor_codec.encode(inputs[k:k + 1], out=r.inputs.add(name=input_name).tensor)
            reqs.append(r.SerializeToString())
        def warm(c: int):  # connections open, the plan compiled, the server's threads all started
            for _ in range(5):
                raw[c](reqs[c % len(reqs)], timeout=30)
        warmers = [threading.Thread(target=warm, args=(c,)) for c in range(clients)]
        for t in warmers:
            t.start()
        for t in warmers:
            t.join(120)
        time.sleep(0.3)
        rss_before = rss_kib(srv.proc.pid)
        cpu_before = cpu_s(srv.proc.pid)
        base = stubs[0].Stats(offload_pb2.StatsRequest(), timeout=10)
        lat = [[] for _ in range(clients)]
        errors, wrong, checked = [], [0], [0]
        start = threading.Barrier(clients + 1)

        def client(c: int):
            call, mine = raw[c], lat[c]
            start.wait(60)
            for i in range(requests):
                k = (c * requests + i) % len(reqs)
                t0 = time.perf_counter()
                try:
                    data = call(reqs[k], timeout=deadline_s)
                except grpc.RpcError as e:
                    errors.append(f"{e.code().name}: {e.details()}")
                    continue
                mine.append(time.perf_counter() - t0)
                if (c * requests + i) % check_every == 0:
                    resp = offload_pb2.InferResponse.FromString(data)
                    got = tensor_codec.decode(resp.outputs[0].tensor)
                    checked[0] += 1
                    if not np.allclose(got, reference(inputs[k:k + 1]), rtol=1e-5, atol=1e-7):
                        wrong[0] += 1
        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        for t in threads:
            t.start()
        start.wait(60)
        t0 = time.perf_counter()
        for t in threads:
            t.join(600)
        wall = time.perf_counter() - t0
        st = stubs[0].Stats(offload_pb2.StatsRequest(), timeout=10)
        rss_after = rss_kib(srv.proc.pid)
        cpu_used = cpu_s(srv.proc.pid) - cpu_before
        for c in chans:
            c.close()
    finally:
        srv.stop()
    all_lat = np.array([x for per in lat for x in per]) * 1e3
    batches = st.batches - base.batches
    rows = st.mean_batch_rows * st.batches - base.mean_batch_rows * base.batches
    return {"max_batch_size": max_batch, "max_queue_delay_ms": max_delay_ms, "requests": clients * requests,
            "ok": int(all_lat.size), "errors": len(errors), "error_examples": sorted(set(errors))[:3],
            "wall_s": round(wall, 3), "throughput_rps": round(all_lat.size / wall, 1),
            "p50_ms": round(float(np.percentile(all_lat, 50)), 3) if all_lat.size else None,
            "p99_ms": round(float(np.percentile(all_lat, 99)), 3) if all_lat.size else None,
            "batching_factor": round(rows / batches, 2) if batches else None, "batches": int(batches),
            "server_cpu_ms_per_request": round(1e3 * cpu_used / max(all_lat.size, 1), 3),
            "server_p50_ms": round(st.p50_latency_ms, 3), "server_p99_ms": round(st.p99_latency_ms, 3),
            "rss_at_start_mib": round(rss_start / 1024, 1), "rss_before_mib": round(rss_before / 1024, 1), "rss_after_mib": round(rss_after / 1024, 1),
            "rss_growth_pct": round(100.0 * (rss_after - rss_before) / rss_before, 2),
            "answers_checked": checked[0], "answers_wrong": wrong[0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=20, help="requests per client")
    p.add_argument("--model", choices=("mlp", "mobilenet"), default="mlp")
    p.add_argument("--hidden", type=int, default=1024, help="mlp: width of the dense layers (default %(default)s)")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--blas-threads", type=int, default=1,
                   help="the server's BLAS threads (0: BLAS's default). Multithreaded BLAS spins against the "
                        "gRPC threads and the clients on this 2-core machine")
    p.add_argument("--max-delay-ms", type=float, default=2.0)
    p.add_argument("--deadline-s", type=float, default=30.0)
    p.add_argument("--check-every", type=int, default=25, help="compare every n-th answer with a local run")
    p.add_argument("--out", default=None, help="also write the JSON here")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mlp-tail.cloud")
        if a.model == "mlp":
            reference, row, input_name, model = build(path, a.hidden), (a.hidden,), "act0:0", \
                f"MLP tail {a.hidden}-{a.hidden}-{a.hidden}-10 + softmax"
        else:
            (reference, row), input_name = build_mobilenet(path), "block5/Add:0"
            model = "MobileNetV2-style tail after block 5 (res 64)"
        inputs = np.maximum(np.random.default_rng(1).standard_normal((1024,) + row), 0).astype(np.float32)
        modes = {}
        for name, mb in (("batched", a.max_batch), ("unbatched", 1)):
            modes[name] = run_mode(path, reference, input_name, inputs, a.clients, a.requests, mb, a.max_delay_ms,
                                   a.deadline_s, a.check_every, a.blas_threads)
    b, u = modes["batched"], modes["unbatched"]
    result = {"benchmark": "offload_load", "model": model + ", 1 row per request",
              "clients": a.clients, "requests_per_client": a.requests, "cpus": os.cpu_count(),
              "server_blas_threads": a.blas_threads or "default",
              "load_avg_1m": round(os.getloadavg()[0], 2), "modes": modes,
              "throughput_ratio_batched_over_unbatched": round(b["throughput_rps"] / u["throughput_rps"], 2)
              if u["throughput_rps"] else None,
              "p99_ratio_batched_over_unbatched": round(b["p99_ms"] / u["p99_ms"], 2) if u["p99_ms"] else None,
              "zero_errors": b["errors"] == 0 and u["errors"] == 0,
              "all_checked_answers_equal": b["answers_wrong"] == 0 and u["answers_wrong"] == 0,
              "rss_growth_within_10pct": b["rss_growth_pct"] <= 10 and u["rss_growth_pct"] <= 10}
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0 if result["zero_errors"] and result["all_checked_answers_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
