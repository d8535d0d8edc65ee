"""Measure a task under a flood of hanging RecvTensor calls (issue 23; the test and the benchmark).

`measure()` starts a task on a free loopback port, times a legitimate client's one-node step
(RunStep on the master, median of `steps`), then opens `flood` RecvTensor calls for tensors
that never arrive, each asking for an endless wait, spread over `channels` connections, and
times the same step again while they hang. The task's WaitLimits cap each wait and admit
only so many (the connections share one host, so per_peer of them); the rest end
RESOURCE_EXHAUSTED.
"""
from __future__ import annotations

import statistics
import time
from typing import Dict

import grpc
import numpy as np

from ..core import constant
from ..core.graph import Graph
from ..proto import worker_pb2
from ..wire.security import ClientSecurity
from .cluster import ClusterSpec
from .master_rpc import MasterClient
from .rpc import SERVICE, channel_options
from .server import Server


def _one_node_graph():
    g = Graph(seed=0)
    with g.as_default():
        constant(np.float32(1.0), name="one")
    return g


def _times_ms(fn, n: int) -> list:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def measure(flood: int = 80, channels: int = 4, steps: int = 40, settle_s: float = 10.0,
            unbounded: bool = False, max_wait_s: float = 60.0) -> Dict[str, float]:
    """{"unloaded_ms", "loaded_ms", "delta_ms", "waiting", "refused", "flood", ...}. `unbounded`:
    lift the admission bounds (as before issue 23) to show what they prevent; the steps then
    wait for the flood's calls to hit `max_wait_s`."""
    server = Server(None, "worker", 0, recv_timeout=min(5.0, max_wait_s), max_recv_wait_s=max_wait_s)
    if unbounded:
        server.limits.per_peer = server.limits.total = 1 << 30
    chans, calls = [], []
    try:
        server.set_cluster(ClusterSpec({"worker": [f"127.0.0.1:{server.port}"]}))
        addr = f"127.0.0.1:{server.port}"
        m = MasterClient(addr, timeout=30.0, security=ClientSecurity(tls=False))
        h = m.create_session(_one_node_graph())

        def step():
            m.run_step(h, {}, ["one:0"], timeout=30.0)
        _times_ms(step, 10)   # warm up
        unloaded = _times_ms(step, steps)
        req = worker_pb2.RecvTensorRequest(src_device="/job:worker/task:0/device:CPU:0",
                                           dst_device="/job:evil/task:0/device:CPU:0", tensor="never",
                                           step_id=1, timeout_s=1e9).SerializeToString()
        for c in range(channels):
            # a connection of its own per channel (gRPC shares one between like channels otherwise)
            ch = grpc.insecure_channel(addr, options=channel_options() + [("grpc.use_local_subchannel_pool", 1)])
            chans.append(ch)
            rpc = ch.unary_unary(f"/{SERVICE}/RecvTensor", request_serializer=None, response_deserializer=None)
            calls += [rpc.future(req, timeout=600.0) for _ in range(flood // channels + (c < flood % channels))]
        deadline = time.monotonic() + settle_s
        settled = min(flood, 64) if unbounded else flood   # unbounded: until the threads are taken
        while time.monotonic() < deadline:   # every call waiting or refused
            st = server.limits.status()
            if st["waiting"] + st["refused"] >= settled:
                break
            time.sleep(0.02)
        st = server.limits.status()
        loaded = _times_ms(step, steps)
        m.close()
        u, lo = statistics.median(unloaded), statistics.median(loaded)
        return {"unloaded_ms": u, "loaded_ms": lo, "delta_ms": lo - u, "loaded_max_ms": max(loaded),
                "unloaded_max_ms": max(unloaded), "waiting": st["waiting"], "refused": st["refused"],
                "flood": flood, "channels": channels, "steps": steps, "threads": 64,
                "per_peer": server.limits.per_peer, "total": server.limits.total}
    finally:
        for c in calls:
            c.cancel()
        server.stop()
        for ch in chans:
            ch.close()
