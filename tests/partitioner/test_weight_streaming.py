"""Weights streamed from memory (DeviceProfile.weight_streaming, partitioner/plan.edge_weights): a part
whose products read more weights than the edge's cache holds pays the excess per request, priced in
every plan; converters/edge_profile measures the two terms on the interpreter's own kernels."""
from dataclasses import replace

import numpy as np
import pytest

from isthmus.partitioner.costmodel import CostModel
from isthmus.partitioner.devices import EDGE, DeviceProfile
from isthmus.partitioner.plan import ALGORITHMS, edge_weights, priced
from isthmus.partitioner.problem import Constraints, Problem

from .test_client_cost import _mlp, _split_link

# _mlp's products: 784x128, 128x1024, 1024x1024, 1024x10 weights
W = [784 * 128, 128 * 1024, 1024 * 1024, 1024 * 10]


def test_a_part_pays_for_the_weights_beyond_the_cache_and_only_the_edge_part():
    g, x, y = _mlp()
    cm0, _ = _split_link(g, y)
    stream = replace(cm0.profiles[cm0.edge], weight_stream_s=2e-9, weight_cache=float(W[0] + W[1]))
    cm1 = CostModel({d: (stream if d == cm0.edge else pr) for d, pr in cm0.profiles.items()}, cm0.link, cm0.edge)
    p0, p1 = Problem(g, cm0, [y], Constraints()), Problem(g, cm1, [y], Constraints())
    seen = set()
    for algo in ("edge_only", "cloud_only", "layer_split", "mincut"):
        a = ALGORITHMS[algo](p0)
        placement = p0.placement(a)
        # by hand: the weights of the products placed on the edge
        mine = sum(w for i, w in enumerate(W) if placement[f"mm{i}"] == cm0.edge)
        assert edge_weights(p0, np.asarray(a)) == mine, algo
        b0, _ = priced(p0, a)
        b1, _ = priced(p1, p1.assignment(placement))
        want = 2e-9 * max(mine - (W[0] + W[1]), 0)
        assert b1.total - b0.total == pytest.approx(want, rel=1e-9, abs=1e-15), algo
        assert b1.compute[cm0.cloud] == b0.compute[cm0.cloud]
        seen.add(want > 0)
    assert seen == {True, False}  # edge-only streams (beyond the cache), cloud-only does not


def test_the_profile_keeps_it_scales_the_seconds_not_the_cache_and_names_a_bad_field():
    prof = replace(EDGE, weight_stream_s=1e-10, weight_cache=2e6)
    back = DeviceProfile.from_json(prof.to_json())
    assert back == prof and back.weight_streaming(3e6) == pytest.approx(1e-4)
    assert back.weight_streaming(1e6) == 0.0
    s = prof.scaled(8)
    assert s.weight_stream_s == pytest.approx(8e-10) and s.weight_cache == 2e6
    assert DeviceProfile.from_json(EDGE.to_json()).weight_stream_s == 0.0  # an older profile: none
    bad = prof.to_json().replace('"weight_cache": 2000000.0', '"weight_cache": -1')
    with pytest.raises(ValueError, match="weight_cache"):
        DeviceProfile.from_json(bad)


def test_fit_streaming_recovers_the_slope_and_the_cache():
    from isthmus.converters.edge_profile import fit_streaming
    s, cache = 2e-10, 3.0e6
    ws = [0.5e6, 1e6, 2e6, 3.2e6, 4.2e6, 6.3e6, 8.4e6]
    rng = np.random.default_rng(0)
    pts = [(w, s * max(w - cache, 0.0) * (1 + 0.02 * rng.standard_normal())) for w in ws]
    fs, fc = fit_streaming(pts)
    assert fs == pytest.approx(s, rel=0.1) and fc == pytest.approx(cache, abs=8.4e6 / 64 + 1)
    assert fit_streaming([(w, 0.0) for w in ws])[0] == 0.0


def test_the_cycles_cover_where_the_weights_stop_fitting_the_cache():
    from isthmus.converters.edge_profile import SIZES
    per_conv = 256 * 1024
    between = [p for p in SIZES if 4.0e6 <= p * per_conv <= 8.0e6]  # ResNet-shaped's 6.0M among them
    assert len(between) >= 6 and min(abs(p * per_conv - 6.0e6) for p in between) < 0.3e6


def test_measure_weight_streaming_times_the_interpreter():
    from isthmus.converters.edge_profile import measure_weight_streaming
    s, cache = measure_weight_streaming(int8=True, convs=4, rounds=1)
    assert np.isfinite(s) and s >= 0.0 and 0.0 <= cache < 4 * (256 * 1024 + 512)
