"""Measure the edge client's own cost on this machine (issue 27): the offload client against an
in-process offload service on 127.0.0.1, on a small MLP whose cuts are edge-only, split and
cloud-only, fitted into a ClientCost (partitioner/client_cost.py). `isthmus profile --client`
writes it into the profile's `client` section, which `isthmus split` prices in every plan."""
from __future__ import annotations

import os
import tempfile

import isthmus as ism
import numpy as np

from isthmus.wire.link import LinkModel

WIDTHS = (128, 1024, 1024, 10)  # an edge 8x slower than the built-in cloud cuts this MLP three ways


def _mlp():
    g = ism.Graph(seed=0)
    rng = np.random.default_rng(0)
    with g.as_default():
        h = x = ism.placeholder("float32", (None, 784), name="x")
        for i, w in enumerate(WIDTHS):
            wt = ism.constant((rng.standard_normal((h.shape[1], w)) * (2.0 / h.shape[1]) ** 0.5).astype(np.float32),
                              name=f"w{i}")
            h = ism.matmul(h, wt, name=f"mm{i}")
            h = ism.relu(h, name=f"act{i}") if i < len(WIDTHS) - 1 else h
        y = ism.softmax(h, name="y")
    return g, x, y


def _export(folder: str):
    """The MLP's split file (its three cuts) and cloud file in `folder`."""
    # deferred: cloud.offload_model loads protobuf, scipy
    from isthmus.cloud.offload_model import cloud_part, save_cloud_parts
    # deferred: converters.split_export loads flatbuffers, scipy
    from isthmus.converters.split_export import export_split
    from isthmus.partitioner import AdaptivePlanner  # deferred: partitioner loads scipy
    from isthmus.partitioner.costmodel import CostModel  # deferred: partitioner.costmodel loads scipy
    from isthmus.partitioner.devices import EDGE  # deferred: partitioner.devices loads scipy
    from isthmus.partitioner.problem import Constraints  # deferred: partitioner.problem loads scipy
    g, _, y = _mlp()
    cm = CostModel.edge_cloud(LinkModel(1e6, 1e6, 2e-3), edge=EDGE.scaled(8))
    planner = AdaptivePlanner(g, cm, [y], Constraints(edge_memory_budget=None), bandwidths=np.logspace(5, 10, 21))
    sp = export_split(g, [y], planner, model_name="client-cost-mlp")
    model, cloud = os.path.join(folder, "mlp.isth"), os.path.join(folder, "mlp.cloud")
    sp.save(model)
    save_cloud_parts(cloud, [cloud_part(sp.graph, i, o, n) for n, i, o in sp.cloud_signatures()], model="mlp")
    return model, cloud


def client_samples(requests: int = 10, warmup: int = 2):
    """OffloadClient.last of `requests` requests per cut (after `warmup` more), every cut of the MLP,
    link emulated at 1 Gbit/s and 1 ms so that only the client's own work is in client_s."""
    from isthmus.cloud.offload import OffloadServer  # deferred: cloud.offload loads grpc, protobuf, scipy
    # deferred: the edge interpreter, loaded only by the commands that need it
    from isthmus.edge.link_emulation import EmulatedLink
    from isthmus.edge.offload_client import OffloadClient  # deferred: edge.offload_client loads protobuf
    # deferred: the edge runtime, loaded only by the commands that need it
    from isthmus.edge.split_model import load_split
    xs = np.random.default_rng(1).standard_normal((requests + warmup, 1, 784)).astype(np.float32)
    samples = []
    with tempfile.TemporaryDirectory(prefix="isthmus-client-cost-") as d:
        model, cloud = _export(d)
        server = OffloadServer(cloud, max_batch_size=1, max_queue_delay_ms=0.0)
        try:
            for cut in load_split(model).cuts:
                mid = (cut.min_bandwidth_bps + min(cut.max_bandwidth_bps, 1e9)) / 2
                with OffloadClient(model, server.address, deadline_ms=30000, adapt=False, initial_bandwidth_bps=mid,
                                   link=EmulatedLink(1e9, 1e-3), ping_every=10 ** 6, warm="now") as c:
                    for i, v in enumerate(xs):
                        c.invoke(v)
                        if i >= warmup:
                            samples.append(dict(c.last))
        finally:
            server.stop(grace=0)
    return samples


def measure_client_cost(requests: int = 10, slowdown: float = 1.0):
    """The ClientCost fitted on this machine, scaled to a device `slowdown` times slower."""
    from isthmus.partitioner.client_cost import ClientCost  # deferred: partitioner.client_cost loads scipy
    fit = ClientCost.fit(client_samples(requests))
    return fit.scaled(slowdown) if slowdown != 1.0 else fit


__all__ = ["measure_client_cost", "client_samples"]
