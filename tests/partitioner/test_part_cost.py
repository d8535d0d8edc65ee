"""An edge part's cost beyond its kernels (partitioner/part_cost.py): fitted back from samples, kept
in the device profile's JSON, scaled with the device, and priced in every plan (edge-only, split,
cloud-only) by the part's run and the bytes crossing its boundary, counted by hand here."""
from dataclasses import replace

import numpy as np
import pytest

from isthmus.partitioner.costmodel import CostModel
from isthmus.partitioner.devices import EDGE, DeviceProfile
from isthmus.partitioner.part_cost import PartCost, fit_cold
from isthmus.partitioner.plan import ALGORITHMS, plan_split, priced
from isthmus.partitioner.problem import Constraints, Problem
from isthmus.wire.link import LinkModel

from .test_client_cost import _mlp, _split_link

PC = PartCost(invoke_s=2e-3, byte_s=1e-8)


def test_fit_recovers_the_terms_from_noisy_samples():
    rng = np.random.default_rng(0)
    nbytes = rng.uniform(1e4, 1e6, 40)
    secs = PC.invoke_s + PC.byte_s * nbytes + rng.normal(0, 1e-5, 40)
    got = PartCost.fit({"seconds": s, "nbytes": b} for s, b in zip(secs, nbytes))
    assert got.invoke_s == pytest.approx(PC.invoke_s, rel=0.02)
    assert got.byte_s == pytest.approx(PC.byte_s, rel=0.02)
    # a term the samples cannot tell from zero stays zero (non-negative)
    flat = PartCost.fit({"seconds": 1e-4, "nbytes": b} for b in nbytes)
    assert flat.byte_s == pytest.approx(0.0, abs=1e-15) and flat.invoke_s == pytest.approx(1e-4, rel=1e-6)


def test_fit_against_a_profile_recovers_the_kernel_scale_which_op_time_applies():
    """Samples with the part's kernels as a profile prices them: edge_s = invoke + byte_s * bytes +
    kernel_scale * priced; the profile then prices every kernel x kernel_scale (scaled keeps it)."""
    rng = np.random.default_rng(1)
    nbytes, priced_s = rng.uniform(1e4, 1e6, 40), rng.uniform(0.0, 5e-3, 40)
    edge_s = PC.invoke_s + PC.byte_s * nbytes + 1.25 * priced_s + rng.normal(0, 1e-6, 40)
    got = PartCost.fit({"edge_s": e, "nbytes": b, "priced_s": k} for e, b, k in zip(edge_s, nbytes, priced_s))
    assert got.kernel_scale == pytest.approx(1.25, rel=0.01) and got.invoke_s == pytest.approx(PC.invoke_s, rel=0.02)
    prof = DeviceProfile("p", op_coeffs={"Relu": (1e-6, 0.0, 0.0)})
    assert replace(prof, part=got).op_time("Relu", 0, 0) == pytest.approx(1.25e-6, rel=0.01)
    assert replace(prof, part=got).scaled(4).op_time("Relu", 0, 0) == pytest.approx(5e-6, rel=0.01)
    assert PartCost.from_dict({"invoke_s": 1e-3, "byte_s": 0.0}).kernel_scale == 1.0  # a profile from before
    with pytest.raises(ValueError, match="needs edge_s, nbytes, priced_s"):
        PartCost.fit([{"edge_s": 1e-3, "nbytes": 1.0, "priced_s": 0.0}, {"edge_s": 1e-3, "priced_s": 0.0}])


def test_bad_samples_and_fields_name_what_is_wrong():
    with pytest.raises(ValueError, match="sample 1: needs seconds, nbytes"):
        PartCost.fit([{"seconds": 1e-3, "nbytes": 10}, {"seconds": 1e-3}])
    with pytest.raises(ValueError, match="at least 2 samples"):
        PartCost.fit([{"seconds": 1e-3, "nbytes": 10}])
    with pytest.raises(ValueError, match="PartCost.invoke_s must be finite"):
        PartCost(invoke_s=-1.0)
    with pytest.raises(ValueError, match=r"device profile field part has unknown fields \['call_s'\]"):
        DeviceProfile.from_json(replace(EDGE, part=PC).to_json().replace('"invoke_s"', '"call_s"'))
    with pytest.raises(ValueError, match=r"device profile field part.byte_s must be a number"):
        DeviceProfile.from_json(replace(EDGE, part=PC).to_json().replace("1e-08", '"fast"'))


def test_the_profile_keeps_and_scales_it():
    prof = replace(EDGE, part=PC)
    back = DeviceProfile.from_json(prof.to_json())
    assert back.part == PC and back == prof
    assert DeviceProfile.from_json(EDGE.to_json()).part is None
    assert prof.scaled(4).part == PartCost(8e-3, 4e-8)


def _boundary_bytes(p, placement):
    """By hand: the input when it stays on the edge, each tensor the edge computed and sends, each
    it receives, the output returned."""
    edge = p.cost.edge
    x = next(n for n in p.nodes if n.op == "Placeholder")
    total = p.cost.tensor_bytes(x.outputs[0]) + p.cost.tensor_bytes(p.outputs[0])
    for n in p.nodes:
        t = n.outputs[0]
        readers = {placement[m.name] for m in p.nodes if t in m.inputs}
        if placement[n.name] == edge and n.op != "Placeholder" and readers - {edge}:
            total += p.cost.tensor_bytes(t)
        if placement[n.name] != edge and (edge in readers or t is p.outputs[0]):
            total += p.cost.tensor_bytes(t)
    return total


def test_every_plan_pays_its_edge_part():
    g, x, y = _mlp()
    cm0, _ = _split_link(g, y)
    with_part = CostModel({d: (replace(pr, part=PC) if d == cm0.edge else pr) for d, pr in cm0.profiles.items()},
                          cm0.link, cm0.edge)
    p0 = Problem(g, cm0, [y], Constraints())
    p1 = Problem(g, with_part, [y], Constraints())
    for algo in ("edge_only", "cloud_only", "layer_split", "mincut"):
        a = ALGORITHMS[algo](p0)
        placement = p0.placement(a)
        b0, _ = priced(p0, a)
        b1, _ = priced(p1, p1.assignment(placement))
        want = PC.invoke_s + PC.byte_s * _boundary_bytes(p0, placement)
        assert b1.total - b0.total == pytest.approx(want, rel=1e-9), algo
        assert b1.compute[cm0.cloud] == b0.compute[cm0.cloud]  # the edge's, not the cloud's
    plan = plan_split(g, with_part, [y])
    assert "edge part on edge beyond its kernels" in plan.explain()


def test_with_a_costly_part_byte_the_plan_is_no_worse_than_either_side_alone():
    """The part's byte term is priced on the chosen plan, not in the min cut's edges: the planner
    still compares its split with edge-only and cloud-only under the full prices."""
    g, x, y = _mlp()
    cm0, _ = _split_link(g, y)
    costly = CostModel({d: (replace(pr, part=PartCost(0.0, 1e-5)) if d == cm0.edge else pr)
                        for d, pr in cm0.profiles.items()}, cm0.link, cm0.edge)
    plan = plan_split(g, costly, [y])
    p = Problem(g, costly, [y], Constraints())
    for algo in ("edge_only", "cloud_only"):
        assert plan.total <= priced(p, ALGORITHMS[algo](p))[0].total + 1e-12


COLD = PartCost(invoke_s=1e-4, cold_s=2e-4, cold_tau_s=5e-3, cold_io_s=5e-5)


def test_the_cold_curve_its_fit_and_its_fields():
    assert COLD.cold(0.0) == 0.0 and PartCost().cold(1.0) == 0.0 and type(COLD.cold(1e-3)) is float  # JSON-ready
    assert COLD.cold(5e-3) == pytest.approx(2e-4 * (1 - np.exp(-1.0)), rel=1e-12)
    assert COLD.cold(1.0) == pytest.approx(2e-4, rel=1e-9)
    # a slower device refills its caches slower; the idle's clock (wall) and the ratios do not scale
    assert COLD.cold(1.0, kernels=False) == pytest.approx(5e-5, rel=1e-9)  # a segment moving tensors only
    s = COLD.scaled(8)
    assert (s.cold_s, s.cold_tau_s, s.invoke_s, s.cold_io_s) == pytest.approx((1.6e-3, 5e-3, 8e-4, 4e-4))
    assert COLD.emulated(20).sleep_ratio == pytest.approx(19 / 20) and COLD.emulated(1).sleep_ratio == 0.0
    e = COLD.emulated(8)
    assert PartCost.from_dict(e.to_dict()) == e
    assert PartCost.from_dict({"invoke_s": 1e-3, "byte_s": 0.0}).cold_s == 0.0  # a profile from before
    rng = np.random.default_rng(2)
    idles = np.repeat([0.0, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1], 5)
    colds = 1.8e-4 * -np.expm1(-idles / 4e-3) + rng.normal(0, 5e-6, idles.size)
    c, tau = fit_cold({"idle_s": i, "cold_s": v} for i, v in zip(idles, colds))
    assert c == pytest.approx(1.8e-4, rel=0.05) and tau == pytest.approx(4e-3, rel=0.2)
    # the io segments' amplitude on the kernels' curve (their time constant given)
    io = 4e-5 * -np.expm1(-idles / 4e-3)
    assert fit_cold(({"idle_s": i, "cold_s": v} for i, v in zip(idles, io)), tau=4e-3) == pytest.approx((4e-5, 4e-3))
    with pytest.raises(ValueError, match="tau must be finite seconds > 0"):
        fit_cold([{"idle_s": 1e-3, "cold_s": 0.0}, {"idle_s": 2e-3, "cold_s": 0.0}], tau=0.0)
    with pytest.raises(ValueError, match="two idles > 0"):
        fit_cold([{"idle_s": 0.0, "cold_s": 0.0}, {"idle_s": 1e-3, "cold_s": 1e-5}])
    with pytest.raises(ValueError, match="cold sample 0: needs idle_s, cold_s"):
        fit_cold([{"idle_s": 1e-3}])


def test_the_fit_takes_each_samples_measured_cold_out_first():
    rng = np.random.default_rng(3)
    nbytes, priced_s, cold = rng.uniform(1e4, 1e6, 30), rng.uniform(0, 5e-3, 30), rng.uniform(0, 2e-4, 30)
    edge_s = PC.invoke_s + PC.byte_s * nbytes + 1.2 * priced_s + cold
    got = PartCost.fit({"edge_s": e, "nbytes": b, "priced_s": k, "cold_s": c}
                       for e, b, k, c in zip(edge_s, nbytes, priced_s, cold))
    assert got.kernel_scale == pytest.approx(1.2, rel=1e-6) and got.invoke_s == pytest.approx(PC.invoke_s, rel=1e-6)
    with pytest.raises(ValueError, match="sample 0: cold_s must be finite"):
        PartCost.fit([{"seconds": 1e-3, "nbytes": 1.0, "cold_s": -1.0}, {"seconds": 1e-3, "nbytes": 2.0}])


def test_each_segment_of_edge_work_pays_its_cold_caches():
    """By hand on the MLP: every plan pays its first segment after the idle the emulation sleeps
    (sleep_ratio x its edge time), and a plan with a call one more after the call (its link and the
    cloud's compute); a segment of kernels at cold_s, one that only moves tensors at cold_io_s:
    edge-only one of kernels; cloud-only two without; a prefix split kernels then none; a plan
    with edge kernels after the call kernels in both."""
    g, x, y = _mlp()
    cm0, _ = _split_link(g, y)
    part = COLD.scaled(8).emulated(8)
    cold_model = CostModel({d: (replace(pr, part=part) if d == cm0.edge else pr) for d, pr in cm0.profiles.items()},
                           cm0.link, cm0.edge)
    warm_model = CostModel({d: (replace(pr, part=replace(part, cold_s=0.0, cold_io_s=0.0)) if d == cm0.edge else pr)
                            for d, pr in cm0.profiles.items()}, cm0.link, cm0.edge)
    p0, p1 = Problem(g, warm_model, [y], Constraints()), Problem(g, cold_model, [y], Constraints())
    edge, cloud = cm0.edge, cm0.cloud
    names = [n.name for n in p0.nodes]

    def placed(on_edge):
        return {n: (edge if n in on_edge or n == "x" else cloud) for n in names}
    plans = {"edge_only": placed(set(names)), "cloud_only": placed(set()),
             "prefix": placed({"mm0", "act0"}), "sandwich": placed({"mm0", "act0", "y"})}
    for name, pl in plans.items():
        b0, _ = priced(p0, p0.assignment(pl))
        b1, _ = priced(p1, p1.assignment(pl))
        first = part.cold(part.sleep_ratio * b0.compute[edge], kernels=name != "cloud_only")
        call = b0.total - b0.compute[edge]
        second = 0.0 if name == "edge_only" else part.cold(call, kernels=name == "sandwich")
        assert b1.total - b0.total == pytest.approx(first + second, rel=1e-9), name
        # the call (>= the RTT) is long against the 5 ms time constant: its segment is (nearly) fully cold
        want = {"edge_only": 0.0, "sandwich": part.cold_s}.get(name, part.cold_io_s)
        assert first > 0 and second == pytest.approx(want, rel=0.01, abs=1e-12), name
    plan = plan_split(g, cold_model, [y])
    assert "cold caches" in plan.explain()


def test_a_per_weight_cold_term_its_fit_and_its_price():
    """cold_w_s: a segment of kernels after idle pays cold_s + cold_w_s x the weights it reads (re-read
    from memory); fit_cold_weights recovers both from parts of several weight counts on a given time
    constant; the field scales with the device, round-trips, and defaults to 0 in older profiles; a plan's
    first segment of edge kernels is priced with the part's weights (plan.edge_weights)."""
    from isthmus.partitioner.part_cost import fit_cold_weights
    from isthmus.partitioner.plan import edge_weights
    c = PartCost(cold_s=2e-4, cold_tau_s=5e-3, cold_io_s=5e-5, cold_w_s=1e-10)
    assert c.cold(1.0, weights=3e6) == pytest.approx(2e-4 + 3e-4, rel=1e-9)
    assert c.cold(1.0, kernels=False, weights=3e6) == pytest.approx(5e-5, rel=1e-9)  # moving tensors reads no weights
    assert c.cold(5e-3, weights=1e6) == pytest.approx(3e-4 * (1 - np.exp(-1.0)), rel=1e-12)
    assert c.scaled(8).cold_w_s == pytest.approx(8e-10) and PartCost.from_dict(c.to_dict()) == c
    assert PartCost.from_dict({"cold_s": 1e-4}).cold_w_s == 0.0 and "per million weights" in c.describe()
    rng = np.random.default_rng(4)
    idles = np.tile([1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1], 4)
    weights = np.repeat([2e4, 5e4, 4.5e5, 3.5e6], 7)
    colds = (3e-4 + 1.2e-10 * weights) * -np.expm1(-idles / 1e-2) + rng.normal(0, 5e-6, idles.size)
    a, b = fit_cold_weights(({"idle_s": i, "cold_s": v, "weights": w} for i, v, w in zip(idles, colds, weights)), 1e-2)
    assert a == pytest.approx(3e-4, rel=0.05) and b == pytest.approx(1.2e-10, rel=0.05)
    with pytest.raises(ValueError, match="two weight counts"):
        fit_cold_weights([{"idle_s": 1e-3, "cold_s": 1e-5, "weights": 1e5}] * 3, 1e-2)
    with pytest.raises(ValueError, match="cold sample 0: needs idle_s, cold_s, weights"):
        fit_cold_weights([{"idle_s": 1e-3, "cold_s": 1e-5}], 1e-2)
    # the price: an edge-only plan's first segment carries the part's weights
    g, x, y = _mlp()
    cm0, _ = _split_link(g, y)
    part = c.scaled(8).emulated(8)
    models = [CostModel({d: (replace(pr, part=replace(part, cold_w_s=w)) if d == cm0.edge else pr)
                         for d, pr in cm0.profiles.items()}, cm0.link, cm0.edge) for w in (0.0, part.cold_w_s)]
    p0, p1 = (Problem(g, m, [y], Constraints()) for m in models)
    pl = {n.name: cm0.edge for n in p0.nodes}
    b0, _ = priced(p0, p0.assignment(pl))
    b1, _ = priced(p1, p1.assignment(pl))
    w = edge_weights(p1, p1.assignment(pl))
    assert w > 0
    idle = part.sleep_ratio * b0.compute[cm0.edge]  # about: the priced idle leaves the part's own cold out
    assert b1.total - b0.total == pytest.approx(part.cold(idle, weights=w) - part.cold(idle), rel=2e-3)
