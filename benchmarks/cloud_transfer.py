"""Tensor transfer between two tasks on loopback: isthmus RecvTensor vs a raw gRPC unary call.

    python benchmarks/cloud_transfer.py [--out cloud_transfer.json] [--quick]

A worker task runs in a subprocess (its own gRPC server); each step it runs a registered
part whose Send deposits an N-byte float32 tensor in its rendezvous, and this process (the
receiving task) pulls it with RecvTensor (streamed in chunks above 4 MiB) and decodes it
to an ndarray. The baseline is a raw unary gRPC method on the same server returning the
same number of pre-built bytes (identity serializers: no protobuf, no ndarray). Only the
transfer is timed. The tensor is drawn by a random op in the sender's part (as a layer's
output would be), so no size is limited by the registered graph's message size. Reports median seconds, MB/s and the ratio isthmus / raw throughput.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = {"4KiB": 4 << 10, "1MiB": 1 << 20, "16MiB": 16 << 20, "64MiB": 64 << 20}
REPS = {"4KiB": 300, "1MiB": 40, "16MiB": 10, "64MiB": 5}
SRC = "/job:worker/task:0/device:CPU:0"
DST = "/job:worker/task:1/device:CPU:0"
RAW_METHOD = "/bench.Raw/Get"


def serve_forever() -> None:
    import grpc
    from isthmus.cloud import rpc
    from isthmus.cloud.worker import Worker
    payloads = {}

    def raw_get(request, context):
        n = int(request.decode())
        if n not in payloads:
            payloads[n] = os.urandom(n)
        return payloads[n]
    handler = grpc.method_handlers_generic_handler("bench.Raw", {
        "Get": grpc.unary_unary_rpc_method_handler(raw_get, request_deserializer=None, response_serializer=None)})
    server, port = rpc.serve(Worker("/job:worker/task:0"), extra_handlers=[handler], max_workers=4)
    print(port, flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop(grace=None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve:
        serve_forever()
        return 0
    import grpc
    import numpy as np

    import isthmus as ism
    from isthmus.cloud import rpc
    from isthmus.core.ops.comm import send

    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        addr = f"127.0.0.1:{port}"
        client = rpc.WorkerClient(addr, timeout=60.0, name="/job:worker/task:0")
        raw = client.channel.unary_unary(RAW_METHOD, request_serializer=None, response_deserializer=None)
        results = {"device": "loopback, one server subprocess + this client process", "sizes": {}}
        for label, nbytes in SIZES.items():
            reps = max(3, REPS[label] // (4 if a.quick else 1))
            g = ism.Graph()
            with g.as_default():
                # made by an op on the sending task, not a Const: a 64 MiB constant would make the
                # registered GraphDef itself larger than one gRPC message
                v = ism.random_uniform((nbytes // 4,), -1.0, 1.0, seed=0, name="v")
                send(v, f"{SRC};{DST};v:0", SRC, DST, name="send_v")
            h = client.register_graph(g, SRC)
            t_ism, t_raw = [], []
            for i in range(reps + 1):
                client.run_graph(h, i, {}, ["send_v"])
                t0 = time.perf_counter()
                arr = client.recv_tensor(SRC, DST, "v:0", i, timeout=60)
                t1 = time.perf_counter()
                body = raw(str(nbytes).encode(), timeout=60)
                t2 = time.perf_counter()
                assert arr.nbytes == nbytes and len(body) == nbytes
                if i:  # the first is a warm-up
                    t_ism.append(t1 - t0)
                    t_raw.append(t2 - t1)
            client.deregister_graph(h)
            mi, mr = statistics.median(t_ism), statistics.median(t_raw)
            results["sizes"][label] = {
                "bytes": nbytes, "reps": reps,
                "isthmus_median_s": mi, "raw_grpc_median_s": mr,
                "isthmus_MBps": nbytes / mi / 1e6, "raw_grpc_MBps": nbytes / mr / 1e6,
                "throughput_ratio": mr / mi,
            }
            print(f"{label:>6}: isthmus {mi * 1e3:8.3f} ms ({nbytes / mi / 1e6:8.1f} MB/s)   "
                  f"raw gRPC {mr * 1e3:8.3f} ms ({nbytes / mr / 1e6:8.1f} MB/s)   ratio {mr / mi:.2f}x",
                  file=sys.stderr)
        client.close()
    finally:
        proc.stdin.close()
        proc.wait(10)
    text = json.dumps(results, indent=2)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
