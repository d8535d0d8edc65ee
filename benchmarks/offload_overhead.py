"""What a bare offload request costs beyond gRPC: the service path against a bare gRPC echo, same run.

    python benchmarks/offload_overhead.py [--requests 400] [--before REV]

One client sends one-row requests back to back (closed loop, pre-serialized bytes, one connection
per server) to: a bare gRPC echo server (the peer: a Python gRPC server whose handler returns
the request's bytes), `isthmus serve` as it is now, and, when --before names a git revision
(default: the last commit before this work on the service path), `isthmus serve` from that
revision's tree (`git archive`), so before and after run in the same minutes under the same load.
The part is tiny (16 -> 16 dense + relu: microseconds of compute), so what is left is the
service path: decode, batcher hand-off and wait, encode, gRPC. The servers take turns in blocks
(--block requests each), round robin; each runs as its own process, with one BLAS thread. Per server:
the client's round-trip p50/p90, the server's CPU time per request (from /proc, robust to other
load), the compute it reports; per isthmus server, the overhead over the bare call (p50 difference)
and, for the current one, the per-stage medians of traced requests (decode, queue, batch,
hand-off, encode: InferResponse.trace) and OffloadServer.measure_overhead's answer (Describe).
The target: the overhead over a bare gRPC call is cut (after < before). JSON on stdout.
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

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import ServerProcess, process_cpu_s  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BEFORE = "d3d06a3"   # the last commit before the service path's overhead work (the offload files as of 39d6a70)
WIDTH = 16


def echo_server() -> int:
    """The peer: a bare gRPC unary handler answering the request's own bytes."""
    from concurrent import futures

    import grpc
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    handler = grpc.unary_unary_rpc_method_handler(lambda req, ctx: req, request_deserializer=None,
                                                  response_serializer=None)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", {"Echo": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"ECHO 127.0.0.1:{port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.2):
        pass
    server.stop(None)
    return 0


def build(path: str) -> None:
    import isthmus as ism
    from isthmus.cloud.offload_model import cloud_part, save_cloud_parts
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, WIDTH), name="x")
        w = ism.constant(np.random.default_rng(0).standard_normal((WIDTH, WIDTH)).astype(np.float32), name="w")
        y = ism.relu(ism.matmul(x, w, name="mm"), name="y")
    save_cloud_parts(path, [cloud_part(g, [x], [y], "tiny")], model="tiny")


class Proc(ServerProcess):
    """A server subprocess with `pythonpath` in front (the revision it runs)."""

    def __init__(self, cmd, tag: str, pythonpath: str):
        super().__init__(cmd, tag, dict(os.environ, PYTHONPATH=pythonpath + os.pathsep + os.environ.get("PYTHONPATH", "")))


def package_tree(repo: str, rev: str, dst: str) -> str:
    """The repository at `rev` as an importable `isthmus` package under dst; returns the path to add."""
    pkg = os.path.join(dst, "isthmus")
    os.makedirs(pkg)
    archive = subprocess.run(["git", "-C", repo, "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", pkg], input=archive, check=True)
    return dst


def serve_cmd(path: str, max_delay_ms: float, *extra):
    return [sys.executable, "-m", "isthmus", "serve", path, "--port", "0", "--max-batch", "32",
            "--max-delay-ms", str(max_delay_ms), "--log-every", "0", "--blas-threads", "1", *extra]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=400, help="timed requests per server (default %(default)s)")
    p.add_argument("--block", type=int, default=50, help="requests per turn (default %(default)s)")
    p.add_argument("--max-delay-ms", type=float, default=2.0, help="the servers' max queue delay")
    p.add_argument("--before", default=BEFORE, help="git revision to compare with ('' : none; default %(default)s)")
    p.add_argument("--repo", default=ROOT, help="the git repository holding --before (default: this one)")
    p.add_argument("--traced", type=int, default=100, help="traced requests for the per-stage medians")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import grpc
    from isthmus.cloud import tracing
    from isthmus.wire import tensor_codec
    from isthmus.proto import offload_pb2
    here_path = os.path.dirname(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tiny.cloud")
        build(path)
        req = offload_pb2.InferRequest(part="tiny", request_id="r")
        tensor_codec.encode(np.ones((1, WIDTH), np.float32), out=req.inputs.add(name="x:0").tensor)
        data = req.SerializeToString()
        servers = {"bare_grpc": Proc([sys.executable, os.path.abspath(__file__), "--echo-server"], "ECHO", here_path),
                   "isthmus": Proc(serve_cmd(path, a.max_delay_ms, "--measure-overhead"), "ISTHMUS_OFFLOAD", here_path)}
        before_error = None
        if a.before:
            try:
                old = package_tree(a.repo, a.before, os.path.join(tmp, "before"))
                servers["isthmus_before"] = Proc(serve_cmd(path, a.max_delay_ms), "ISTHMUS_OFFLOAD", old)
            except (subprocess.CalledProcessError, RuntimeError, OSError) as e:
                before_error = f"{type(e).__name__}: {e}"[:300]
        chans, calls = {}, {}
        try:
            for name, s in servers.items():
                chans[name] = grpc.insecure_channel(s.address)
                method = "/bench.Echo/Echo" if name == "bare_grpc" else "/isthmus.Offload/Infer"
                calls[name] = chans[name].unary_unary(method, request_serializer=None, response_deserializer=None)
                for _ in range(20):   # connect, compile, start threads
                    calls[name](data, timeout=10)
            lat = {n: [] for n in servers}
            compute = {n: [] for n in servers}
            cpu = {n: 0.0 for n in servers}
            for _ in range(max(1, a.requests // a.block)):
                for name, call in calls.items():
                    pid = servers[name].proc.pid
                    c0 = process_cpu_s(pid)
                    for _ in range(a.block):
                        t0 = time.perf_counter()
                        out = call(data, timeout=10)
                        lat[name].append((time.perf_counter() - t0) * 1e3)
                        if name != "bare_grpc":
                            compute[name].append(offload_pb2.InferResponse.FromString(out).compute_ms)
                    cpu[name] += process_cpu_s(pid) - c0
            # per-stage medians of traced requests (the current server only)
            treq = offload_pb2.InferRequest()
            treq.CopyFrom(req)
            treq.trace = True
            tdata = treq.SerializeToString()
            stages: dict = {}
            for _ in range(a.traced):
                md = tracing.decode(offload_pb2.InferResponse.FromString(calls["isthmus"](tdata, timeout=10)).trace)
                for e in md.events:
                    if e.op.startswith("Offload"):
                        stages.setdefault(e.op[len("Offload"):].lower(), []).append((e.end_us - e.start_us) / 1e3)
            from isthmus.proto import offload_pb2_grpc
            described = offload_pb2_grpc.OffloadStub(chans["isthmus"]).Describe(offload_pb2.DescribeRequest(),
                                                                                timeout=10)
        finally:
            for c in chans.values():
                c.close()
            for s in servers.values():
                s.stop()
    # measure_overhead as the partitioner would read it (in process: this client shares the server's process)
    from isthmus.cloud.offload import OffloadServer
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tiny.cloud")
        build(path)
        with OffloadServer(path, max_batch_size=32, max_queue_delay_ms=a.max_delay_ms) as srv:
            measured = srv.measure_overhead(requests=200)
    n = a.requests // a.block * a.block
    res = {}
    for name in servers:
        v = np.array(lat[name])
        res[name] = {"p50_ms": round(float(np.median(v)), 4), "p90_ms": round(float(np.percentile(v, 90)), 4),
                     "server_cpu_ms_per_request": round(1e3 * cpu[name] / n, 4)}
        if compute[name]:
            res[name]["compute_p50_ms"] = round(float(np.median(compute[name])), 4)
            res[name]["overhead_over_bare_grpc_ms"] = round(res[name]["p50_ms"] - res["bare_grpc"]["p50_ms"], 4)
    after = res["isthmus"]["overhead_over_bare_grpc_ms"]
    before = res.get("isthmus_before", {}).get("overhead_over_bare_grpc_ms")
    result = {"benchmark": "offload_overhead", "part": f"dense {WIDTH}->{WIDTH} + relu, 1 row per request",
              "requests_per_server": n, "max_queue_delay_ms": a.max_delay_ms, "before_revision": a.before or None,
              "before_error": before_error, "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
              "servers": res,
              "current_stage_p50_ms": {k: round(float(np.median(v)), 4) for k, v in stages.items()},
              "describe_overhead_ms": described.overhead_ms,
              "measure_overhead_in_process": measured,
              "target": "overhead over a bare gRPC call: after < before (same run)",
              "overhead_ratio_after_over_before": round(after / before, 3) if before else None,
              "met": bool(before is not None and after < before)}
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    if sys.argv[1:2] == ["--echo-server"]:
        sys.exit(echo_server())
    sys.exit(main())
