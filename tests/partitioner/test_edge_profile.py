"""`isthmus profile --runtime edge-int8|edge-fp32` (converters/edge_profile.py): the calibration cases
timed in the edge interpreter, fitted per op family (cost keys), fire-module shapes included; the
profile keeps the edge's kernel table and predicts its own cases."""
import numpy as np

from isthmus.apps import cli
from isthmus.converters.edge_profile import calibrate_edge, measure_edge
from isthmus.partitioner import calibrate as cal
from isthmus.partitioner.costmodel import cost_key
from isthmus.partitioner.devices import DeviceProfile


def test_int8_cases_are_timed_by_family_and_the_fit_predicts_them():
    samples = measure_edge(["Conv2D", "Relu"], level="quick", int8=True, budget_s=0.01, rounds=1)
    keys = {s.op for s in samples}
    assert {"Conv2D", "Conv2D:pointwise", "Conv2D:grouped", "Relu"} <= keys  # dense, 1x1, depthwise, elementwise
    assert len([s for s in samples if s.op.startswith("Conv2D")]) == len(list(cal.cases("Conv2D", "quick")))
    assert all(s.seconds > 0 and np.isfinite(s.seconds) for s in samples)
    prof = cal.fit(samples, "e")
    err = cal.errors(prof, samples)
    assert err["Relu"] < 0.5, err  # a fit that describes what it was fitted on


def test_fire_module_convolutions_are_calibrated():
    """SqueezeNet's squeeze (1x1) and expand (1x1, 3x3) shapes on small maps are among the cases."""
    shapes = {(c, hw, o, k) for (n, c, hw, o, k, st) in cal._FIRE_AND_BOTTLENECK}
    assert (64, 24, 16, 1) in shapes and (16, 24, 64, 3) in shapes
    built = [inputs for inputs, _ in cal.cases("Conv2D", "quick")]
    assert any(a[0].shape == (1, 64, 24, 24) and a[1].shape == (16, 64, 1, 1) for a in built)


def test_profile_runtime_edge_int8_writes_an_edge_profile(tmp_path, capsys):
    path = str(tmp_path / "e.json")
    assert cli.main(["profile", "--runtime", "edge-int8", "--ops", "Relu", "MaxPool", "--quick", "--slowdown", "4",
                     "--out", path]) == 0
    assert "edge interpreter profile" in capsys.readouterr().out
    prof = DeviceProfile.load(path)
    assert prof.kernel_table == "edge" and {"Relu", "MaxPool"} <= set(prof.op_coeffs)
    assert prof.op_time("Relu", 1e5, 8e5) > 0
    assert cli.main(["profile", "--runtime", "edge-int8", "--ops", "Softmax", "--out", str(tmp_path / "f.json")]) == 2
    assert "--ops Softmax: the edge interpreter is timed on" in capsys.readouterr().err


def test_pointwise_and_narrow_convolutions_have_their_own_keys():
    import isthmus as ism
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (1, 8, 12, 12))
        one = ism.conv2d(x, ism.constant(np.ones((4, 8, 1, 1), np.float32)))
        strided = ism.conv2d(x, ism.constant(np.ones((4, 8, 1, 1), np.float32)), strides=2)  # 6x6 out
        three = ism.conv2d(x, ism.constant(np.ones((4, 8, 3, 3), np.float32)))
        small = ism.placeholder("float32", (1, 8, 4, 4))  # 16 output pixels: weight-bound
        narrow3 = ism.conv2d(small, ism.constant(np.ones((4, 8, 3, 3), np.float32)))
        narrow1 = ism.conv2d(small, ism.constant(np.ones((4, 8, 1, 1), np.float32)))
        bigger = ism.conv2d(ism.placeholder("float32", (1, 8, 5, 5)), ism.constant(np.ones((4, 8, 3, 3), np.float32)))
        depthwise = ism.conv2d(small, ism.constant(np.ones((8, 1, 3, 3), np.float32)), groups=8)
    keys = [cost_key(t.node) for t in (one, strided, three, narrow3, narrow1, bigger, depthwise)]
    assert keys == ["Conv2D:pointwise", "Conv2D", "Conv2D", "Conv2D:narrow", "Conv2D:narrow", "Conv2D",
                    "Conv2D:grouped"]
    prof = DeviceProfile("p", op_coeffs={"Conv2D": (1.0, 0.0, 0.0)})
    assert prof.op_time("Conv2D:pointwise", 0, 0) == prof.op_time("Conv2D:narrow", 0, 0) == 1.0  # falls back


def test_narrow_and_concat_cases_cover_the_models_shapes():
    """ResNet's 4x4/2x2 stages and strided projections are calibrated as Conv2D:narrow; channel joins
    as Concat, each input with its own range (so an int8 model requantizes them, as a module's join does)."""
    built = [inputs for inputs, _ in cal.cases("Conv2D", "quick")]
    assert any(a[0].shape == (1, 512, 4, 4) and a[1].shape == (1024, 512, 1, 1) for a in built)
    joins = list(cal.cases("Concat", "quick"))
    assert joins and all(len(ins) >= 2 for ins, _ in joins)
    first = joins[0][0]
    assert first[1].max() > first[0].max() * 1.5  # distinct ranges
    samples = measure_edge(["Concat"], level="quick", int8=True, budget_s=0.005, rounds=1)
    assert {s.op for s in samples} == {"Concat"} and all(s.seconds > 0 for s in samples)


def test_fused_share_reads_the_fused_minus_plain_convolutions():
    """fused_steps: (FusedConv2D - Conv2D of the same shapes) / (BiasAdd + Relu6 priced on the output)."""
    from isthmus.converters.edge_profile import fused_share
    prof = DeviceProfile("p", op_coeffs={"BiasAdd": (1e-6, 0.0, 0.0), "Relu6": (1e-6, 0.0, 0.0)})
    plain = cal.Sample("Conv2D", "(1, 8, 6, 6)x(4, 8, 3, 3)", 1.0, 1.0, 10e-6)
    fused = cal.Sample("FusedConv2D", "(1, 8, 6, 6)x(4, 8, 3, 3)x(4,)", 1.0, 1.0, 11e-6)
    cheaper = cal.Sample("FusedConv2D", "(1, 8, 6, 6)x(4, 8, 3, 3)x(4,)", 1.0, 1.0, 9e-6)
    assert abs(fused_share(prof, [(plain, 144), (fused, 144)]) - 0.5) < 1e-9
    assert fused_share(prof, [(plain, 144), (cheaper, 144)]) == 0.0  # never below nothing
    assert fused_share(DeviceProfile("q"), [(plain, 144), (fused, 144)], default=1.0) == 1.0  # steps not timed


def test_fused_steps_scale_what_absorbed_steps_cost(tmp_path):
    """A profile whose fused steps cost nothing prices conv + bias + relu as the conv alone."""
    import pytest
    from dataclasses import replace
    import isthmus as ism
    from isthmus.partitioner import CostModel, LinkModel
    from isthmus.partitioner.devices import CLOUD_DEVICE, EDGE_DEVICE
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (1, 8, 12, 12))
        c = ism.conv2d(x, ism.constant(np.ones((4, 8, 3, 3), np.float32)))
        y = ism.relu(ism.bias_add(c, ism.constant(np.ones(4, np.float32)), axis=1))
    base = DeviceProfile("p", op_coeffs={"Conv2D": (5e-6, 0.0, 0.0), "BiasAdd": (1e-6, 0.0, 0.0), "Relu": (2e-6, 0.0, 0.0)})
    totals = []
    for share in (1.0, 0.0):
        prof = replace(base, fused_steps=share)
        cm = CostModel({EDGE_DEVICE: prof, CLOUD_DEVICE: prof}, LinkModel(), EDGE_DEVICE)
        roles = cm.roles(list(g.nodes), [y])
        totals.append(sum(cm.model_time(n, EDGE_DEVICE, roles) for n in g.nodes))
    assert totals[0] == pytest.approx(8e-6) and totals[1] == pytest.approx(5e-6)
    path = str(tmp_path / "p.json")
    replace(base, fused_steps=0.25).save(path)
    assert DeviceProfile.load(path).fused_steps == 0.25
    with open(path) as f:
        text = f.read().replace('"fused_steps": 0.25', '"fused_steps": -1')
    with pytest.raises(ValueError, match="fused_steps"):
        DeviceProfile.from_json(text)
