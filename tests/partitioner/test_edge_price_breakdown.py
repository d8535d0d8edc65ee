"""benchmarks/edge_price_breakdown.py: every kernel the int8 interpreter runs for a model is matched to
the graph's nodes and priced by op family, so the per-family sums add up to the whole model."""
import os
import sys

import numpy as np
import pytest

import isthmus as ism

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))


def _net():
    rng = np.random.default_rng(0)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, 3, 16, 16), name="x")
        w1 = ism.constant((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32))
        h = ism.relu(ism.bias_add(ism.conv2d(x, w1, padding="SAME"), ism.constant(np.zeros(8, np.float32)), axis=1))
        a = ism.conv2d(h, ism.constant((rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32)))
        b = ism.conv2d(h, ism.constant((rng.standard_normal((4, 8, 3, 3)) * 0.3).astype(np.float32)), padding="SAME")
        y = ism.global_avg_pool(ism.concat([a, b], axis=1), name="y")
    return g, [x], y


def test_every_kernel_is_matched_and_priced_by_family():
    from dataclasses import replace
    from edge_price_breakdown import by_key, edge_model, kernel_rows
    from isthmus.edge.interpreter import Interpreter
    from isthmus.edge.link_emulation import emulated_kernel_seconds
    from isthmus.partitioner import CostModel, LinkModel
    from isthmus.partitioner.devices import CLOUD, CLOUD_DEVICE, EDGE_DEVICE
    g, inputs, y = _net()
    data, feed = edge_model(g, inputs, y, int8=True)
    ks = emulated_kernel_seconds(Interpreter(data), feed["x"], runs=3)
    prof = replace(CLOUD, kernel_table="edge")
    cost = CostModel({EDGE_DEVICE: prof, CLOUD_DEVICE: prof}, LinkModel(), EDGE_DEVICE)
    rows = kernel_rows(cost, g, y, ks, EDGE_DEVICE)
    assert "(unmatched)" not in {r["key"] for r in rows}
    keys = {r["key"] for r in rows}
    assert {"Conv2D", "Conv2D:pointwise", "Concat", "GlobalAvgPool"} <= keys
    assert sum(r["measured"] for r in rows) == pytest.approx(sum(ks.values()))  # quantize steps joined, none lost
    fam = by_key(rows)
    assert sum(d["kernels"] for d in fam.values()) == len(rows)
    conv = next(r for r in rows if r["key"] == "Conv2D")
    assert conv["absorbed"] == ["Relu", "BiasAdd"] and conv["predicted"] > 0  # the fused group priced whole
