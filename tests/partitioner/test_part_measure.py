"""`isthmus profile --parts` measures edge parts for real (apps/part_measure.py): the offload client
against an in-process service runs every part; each sample counts the part's boundary bytes as the
plan's pricing does, and the fit writes a part section into the profile."""
import numpy as np
import pytest

from isthmus.apps import cli
from isthmus.apps.part_measure import _graphs, cold_samples, fit_cold_curve, fit_parts, part_samples, repriced
from isthmus.partitioner.devices import DeviceProfile


def test_samples_count_the_boundary_and_time_the_parts(monkeypatch):
    from dataclasses import replace
    from isthmus.partitioner import speed_state
    from isthmus.partitioner.devices import CLOUD
    from isthmus.partitioner.part_cost import PartCost
    curve = PartCost(cold_s=2e-4, cold_tau_s=5e-3, cold_io_s=5e-5)
    calls = []  # two probes a part (before, after), 3 parts a model: the fire model's parts read 2x slow

    def probe():
        calls.append(1)
        return 2e-4 if ((len(calls) - 1) // 6) % 4 == 1 else 1e-4
    monkeypatch.setattr(speed_state, "speed_probe", probe)
    both = part_samples(int8=True, cuts=3, requests=2, profile=replace(CLOUD, kernel_table="edge"),
                        slowdowns=[8.0, 20.0], cold=curve)
    assert len(calls) == 2 * 2 * 2 * 12  # rounds x slowdowns x (before, after) x parts
    assert sorted({s["slowdown"] for s in both}) == [8.0, 20.0]
    for s in both:  # taken to the fast state of the probes: the parts probed slow count half their time
        assert s["reference_s"] == 1e-4 and s["probe_s"] == (2e-4 if s["model"] == 1 else 1e-4)
        assert s["edge_s"] == pytest.approx(s["edge_raw_s"] * (0.5 if s["model"] == 1 else 1.0), rel=1e-12)
    for s in both:  # the cold of the idle the emulation slept before it (of kernels where the part runs
        # any), and with a call (every cut but the last, edge-only) one after the round trip, of no kernel
        want = curve.cold((s["slowdown"] - 1) * s["edge_s"], kernels=s["kernels_s"] > 0)
        want += curve.cold(0.02, kernels=False) if s["cut"] < 2 else 0.0
        assert s["cold_s"] == want
        assert s["seconds"] == max(s["edge_s"] - s["kernels_s"] - s["cold_s"], 0.0)
    fit = fit_parts(both, curve)
    assert (fit.cold_s, fit.cold_tau_s, fit.cold_io_s) == (2e-4, 5e-3, 5e-5) and fit.kernel_scale > 0
    samples = [s for s in both if s["slowdown"] == 8.0]
    graphs = _graphs()
    assert sorted({s["model"] for s in samples}) == [0, 1, 2, 3]
    for mi, (g, x, y) in enumerate(graphs):
        mine = [s for s in samples if s["model"] == mi]
        assert len(mine) == 3  # cloud-only, one inside, edge-only
        io = 4 * (int(np.prod(x.shape)) + int(np.prod(y.shape)))
        cloud_only, edge_only = mine[0], mine[-1]
        # the input goes as it came (counted once); the output is received, then returned (twice)
        assert cloud_only["nbytes"] == io + 4 * int(np.prod(y.shape)) and cloud_only["kernels_s"] == 0.0
        assert edge_only["nbytes"] == io and edge_only["kernels_s"] > 0.0
        assert mine[1]["nbytes"] > io  # a part inside the network sends what it computed
        # the part's kernels as the profile prices them: none on the cloud-only cut, all on the edge-only one
        assert cloud_only["priced_s"] == 0.0 < mine[1]["priced_s"] < edge_only["priced_s"]
        for s in mine:
            assert s["seconds"] >= 0.0 and s["edge_s"] > 0.0 and np.isfinite(s["edge_s"])
    # the same parts priced by another profile (twice as slow): the measurements kept, the prices doubled
    again = repriced(samples, replace(CLOUD, kernel_table="edge").scaled(2.0), cuts=3)
    assert len(again) == len(samples)
    assert [s["edge_s"] for s in again] == [s["edge_s"] for s in samples]
    assert np.allclose([s["priced_s"] for s in again], [2 * s["priced_s"] for s in samples])


def test_cold_samples_time_each_idle_against_requests_back_to_back():
    got = cold_samples(int8=True, reps=1, idles=(0.0, 0.001, 0.02))
    assert sorted((s["model"], s["kind"], s["idle_s"]) for s in got) == [
        (m, k, i) for m in range(4) for k in ("io", "kernels") for i in (0.0, 0.001, 0.02)]
    curve = fit_cold_curve(got)
    assert curve.cold_tau_s > 0 and curve.cold_s >= 0 and curve.cold_io_s >= 0 and curve.cold_w_s >= 0
    # each sample carries the weights its segment's kernels read: the edge-only parts' (each model's own,
    # counted from its graph), none for a cloud-only part
    weights = {s["model"]: s["weights"] for s in got if s["kind"] == "kernels"}
    assert all(s["weights"] == 0.0 for s in got if s["kind"] == "io") and len(set(weights.values())) == 4
    for mi, (g, _, _) in enumerate(_graphs()):
        assert weights[mi] == sum(int(np.prod(n.inputs[1].shape)) for n in g.nodes
                                  if n.op in ("Conv2D", "MatMul") and n.inputs[1].node.op == "Const")
    for s in got:
        assert s["hot_s"] > 0 and np.isfinite(s["cold_s"])
        if s["idle_s"] == 0.0:
            assert s["cold_s"] == 0.0  # the hot median against itself
    with pytest.raises(ValueError, match="idles with 0"):
        cold_samples(idles=(0.001, 0.002, 0.003))


def test_profile_parts_writes_the_part_section(tmp_path, capsys, monkeypatch):
    from isthmus.apps import part_measure
    fast, fast_cold = part_measure.part_samples, part_measure.cold_samples
    asked = []  # --quick asks for part_measure.QUICK's counts; these run fewer still
    monkeypatch.setattr(part_measure, "part_samples", lambda int8, cuts, requests, profile=None, slowdowns=None, cold=None:
                        asked.append((cuts, requests)) or fast(int8, cuts=3, requests=2, profile=profile,
                                                               slowdowns=slowdowns, cold=cold))
    monkeypatch.setattr(part_measure, "cold_samples", lambda int8, reps: asked.append(reps) or
                        fast_cold(int8, reps=1, idles=(0.0, 0.002, 0.02)))
    path = str(tmp_path / "e.json")
    assert cli.main(["profile", "--device", "e", "--ops", "Relu", "--quick", "--slowdown", "8", "--parts", "fp32",
                     "--out", path, "--force"]) == 0
    assert "wrote the part section of" in capsys.readouterr().out
    assert asked == [part_measure.QUICK["reps"], (part_measure.QUICK["cuts"], part_measure.QUICK["requests"])]
    part = DeviceProfile.load(path).part
    # something beyond the kernels is priced (with the cold taken out first, the fixed and byte terms may fit 0)
    assert part is not None and part.invoke_s + part.byte_s + part.cold_s + part.cold_io_s > 0
    assert part.kernel_scale > 0 and part.cold_tau_s > 0 and part.sleep_ratio == 0.0  # a real device: no emulated sleep
