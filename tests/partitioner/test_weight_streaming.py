"""Weights streamed from memory (partitioner/plan.weights_from_memory, edge_weights): a part whose
products read more weights than the edge's cache holds pays for them per request, priced in every
plan: the older whole-part term (DeviceProfile.weight_streaming), and per weight-bound kernel its
"<key>@memory" extra as far as the part's weights pass the cache (weight_fraction); converters/
edge_profile measures the cache's edge and those regressions on the interpreter's own kernels."""
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
    ramp = replace(EDGE, weight_cache=1e6, weight_cache_hi=3e6,
                   op_coeffs={"Conv2D:narrow": (1e-5, 0.0, 0.0), "Conv2D:narrow@memory": (3e-5, 0.0, 0.0)})
    assert DeviceProfile.from_json(ramp.to_json()) == ramp
    s8 = ramp.scaled(8)  # the cache's edge is the device's; the seconds slow down
    assert (s8.weight_cache, s8.weight_cache_hi) == (1e6, 3e6)
    assert s8.streamed_extra("Conv2D:narrow", 0.0, 0.0) == pytest.approx(8 * 2e-5)
    bad = prof.to_json().replace('"weight_cache": 2000000.0', '"weight_cache": -1')
    with pytest.raises(ValueError, match="weight_cache"):
        DeviceProfile.from_json(bad)


def test_fit_ramp_recovers_both_ends():
    from isthmus.converters.edge_profile import fit_ramp
    lo, hi = 3.0e6, 6.0e6
    ws = [0.5e6, 1e6, 2e6, 3.2e6, 4.2e6, 5.2e6, 6.3e6, 8.4e6, 10.5e6, 12.6e6]
    rng = np.random.default_rng(0)
    pts = [(w, min(max((w - lo) / (hi - lo), 0.0), 1.0) + 0.02 * rng.standard_normal()) for w in ws]
    flo, fhi = fit_ramp(pts)
    step = 12.6e6 / 64
    assert flo == pytest.approx(lo, abs=2 * step) and fhi == pytest.approx(hi, abs=2 * step)


def test_the_cycles_cover_where_the_weights_stop_fitting_the_cache_and_beyond():
    from isthmus.converters.edge_profile import SIZES
    per_conv = 256 * 1024
    between = [p for p in SIZES if 4.0e6 <= p * per_conv <= 8.0e6]  # ResNet-shaped's 6.0M among them
    assert len(between) >= 6 and min(abs(p * per_conv - 6.0e6) for p in between) < 0.3e6
    assert max(SIZES) * per_conv >= 12e6  # the plateau: every weight from memory


def test_measure_weight_streaming_times_the_interpreter():
    from isthmus.converters.edge_profile import measure_weight_streaming
    lo, hi = measure_weight_streaming(int8=True, convs=4, rounds=1)
    assert (lo, hi) == (0.0, 0.0) or 0.0 <= lo < hi <= 4 * (256 * 1024 + 512)


def test_a_part_pays_each_weight_bound_kernels_memory_extra_as_far_as_its_weights_pass_the_cache():
    """weights_from_memory: fraction(W) x the sum of the edge part's kernels' "<key>@memory" extras,
    the fraction by hand from the ramp; a kernel without that regression adds nothing."""
    import isthmus as ism
    from isthmus.partitioner.costmodel import cost_key
    from isthmus.partitioner.devices import MEMORY
    from isthmus.partitioner.plan import weights_from_memory
    rng = np.random.default_rng(0)
    g = ism.Graph(seed=0)
    with g.as_default():
        h = ism.placeholder("float32", (1, 256, 2, 2), name="x")
        narrow = []
        for _ in range(3):
            h = ism.conv2d(h, ism.constant(rng.standard_normal((256, 256, 1, 1)).astype(np.float32)))
            narrow.append(h.node)
        wide = ism.conv2d(ism.placeholder("float32", (1, 8, 32, 32), name="z"),
                          ism.constant(np.ones((8, 8, 3, 3), np.float32)), padding="SAME")
        y = ism.identity(h, name="y")
    assert [cost_key(n) for n in narrow] == ["Conv2D:narrow"] * 3 and cost_key(wide.node) == "Conv2D"
    cm0 = CostModel.edge_cloud()
    base = cm0.profiles[cm0.edge]
    prof = replace(base, op_coeffs={**base.op_coeffs, "Conv2D:narrow": (1e-5, 0.0, 0.0),
                                    "Conv2D:narrow" + MEMORY: (1.1e-4, 0.0, 0.0)},
                   weight_cache=100e3, weight_cache_hi=300e3)
    assert prof.streamed_extra("Conv2D:narrow", 0.0, 0.0) == pytest.approx(1e-4)
    assert prof.streamed_extra("Conv2D", 0.0, 0.0) == 0.0  # no "@memory" regression: nothing
    assert prof.weight_fraction(50e3) == 0.0 and prof.weight_fraction(200e3) == 0.5 and prof.weight_fraction(1e9) == 1.0
    cm = CostModel({d: (prof if d == cm0.edge else pr) for d, pr in cm0.profiles.items()}, cm0.link, cm0.edge)
    p = Problem(g, cm, [y, wide], Constraints())
    for k in range(4):  # the first k narrow convolutions and the wide one on the edge
        mine = set(narrow[:k]) | {wide.node}
        a = np.array([p.edge if (n in mine or n.op == "Placeholder") else 1 - p.edge for n in p.nodes])
        frac = min(max((256 * 256 * k + 8 * 8 * 9 - 100e3) / 200e3, 0.0), 1.0)
        assert weights_from_memory(p, a) == pytest.approx(frac * 1e-4 * k, rel=1e-9, abs=1e-15), k
